//! Which programs of the operator object this kernel's verifier takes, for either memory layer's
//! build: each loaded alone (every other program's autoload off), with the instructions the
//! verifier processed or, when refused, the verifier's last words. Kernels differ in their
//! verifiers, so this is the first thing to look at on a new kernel (`doctor`, and the smoke
//! suite of `scripts/vm-test.sh`).

use std::mem::MaybeUninit;
use std::os::fd::AsFd;

use libbpf_rs::skel::{OpenSkel, Skel, SkelBuilder};
use libbpf_rs::{OpenObject, PrintLevel};

use super::memory::MemoryLayer;
use super::ops::array_skel::skel::OpsArraySkelBuilder;
use super::ops::size_array_map;
use super::ops::skel::OpsSkelBuilder;
use super::verifier::{capture, refusal_line, ProgramKind, LOG};

/// The names of the programs of the object a skeleton builder opens.
macro_rules! program_names {
    ($builder:ty) => {{
        let mut storage = MaybeUninit::<OpenObject>::uninit();
        let names = <$builder>::default().open(&mut storage).map(|open| {
            open.open_object()
                .progs()
                .map(|p| p.name().to_string_lossy().into_owned())
                .collect::<Vec<String>>()
        });
        names
    }};
}

/// Loads program `name` of the object a skeleton builder opens alone, after `prepare` (the open
/// skeleton: maps sized, constants set): the verified instructions or the refusal, and libbpf's
/// log.
macro_rules! load_alone {
    ($builder:ty, $name:expr, |$open:ident| $prepare:block) => {{
        let name: &str = $name;
        LOG.lock().unwrap_or_else(|e| e.into_inner()).clear();
        let mut storage = MaybeUninit::<OpenObject>::uninit();
        let opened = <$builder>::default().open(&mut storage);
        let answer = match opened {
            Err(e) => (Err(format!("{e:#}")), String::new()),
            Ok(mut open) => {
                for mut p in open.open_object_mut().progs_mut() {
                    let this = p.name().to_string_lossy() == name;
                    p.set_autoload(this);
                }
                let prepared: libbpf_rs::Result<()> = {
                    let $open = &mut open;
                    $prepare
                };
                let loaded = prepared.and_then(|()| open.load());
                let log = std::mem::take(&mut *LOG.lock().unwrap_or_else(|e| e.into_inner()));
                let result = match loaded {
                    Ok(skel) => match skel
                        .object()
                        .progs()
                        .find(|p| p.name().to_string_lossy() == name)
                    {
                        Some(prog) => {
                            super::ops::verified_insns(prog.as_fd()).map_err(|e| e.to_string())
                        }
                        None => Err(format!("{name} is not in the loaded object")),
                    },
                    Err(e) => Err(refusal_line(&log).unwrap_or_else(|| format!("{e:#}"))),
                };
                (result, log)
            }
        };
        answer
    }};
}

/// One program loaded alone.
#[derive(Clone, Debug)]
pub struct ProgramLoad {
    /// The program's name in `src/bpf`.
    pub name: String,
    /// What it is for.
    pub kind: ProgramKind,
    /// The instructions the verifier processed, or why the program was refused (the verifier's
    /// last line when it spoke, else libbpf's error).
    pub result: std::result::Result<u32, String>,
    /// The last lines (up to 40) of the verifier's log when it refused the program.
    pub log_tail: Vec<String>,
}

/// Loads every program of the operator object's build for `layer` alone, in the object's order,
/// and says what the verifier made of each. The array build is loaded with one element of
/// 16 MiB, `DOCTOR_ELEM_SHIFT` (the verifier's bounds depend on the element size, so counts
/// differ a little from a model's load). `MemoryLayer::Auto` means the arena. Takes about as long
/// as loading the object once per program kind; holds libbpf's print callback while it runs
/// (messages of other threads' loads land in the report).
pub fn program_loads(layer: MemoryLayer) -> Vec<ProgramLoad> {
    let names = match layer {
        MemoryLayer::Array => program_names!(OpsArraySkelBuilder),
        _ => program_names!(OpsSkelBuilder),
    };
    let names = match names {
        Ok(names) => names,
        Err(e) => {
            return vec![ProgramLoad {
                name: "(the object)".into(),
                kind: ProgramKind::Forward,
                result: Err(format!("opening the operator object ({layer} build): {e:#}")),
                log_tail: Vec::new(),
            }]
        }
    };
    let previous = libbpf_rs::set_print(Some((PrintLevel::Warn, capture)));
    let report = names
        .iter()
        .map(|name| {
            let (result, log) = match layer {
                MemoryLayer::Array => load_alone!(OpsArraySkelBuilder, name, |open| {
                    size_array_map(&mut open.maps, 0, DOCTOR_ELEM_SHIFT, 1)
                }),
                _ => load_alone!(OpsSkelBuilder, name, |_open| { Ok(()) }),
            };
            let lines: Vec<String> = log.lines().map(str::to_string).collect();
            ProgramLoad {
                name: name.clone(),
                kind: ProgramKind::of(name),
                log_tail: match result {
                    Ok(_) => Vec::new(),
                    Err(_) => lines[lines.len().saturating_sub(40)..].to_vec(),
                },
                result,
            }
        })
        .collect();
    libbpf_rs::set_print(previous);
    report
}

/// The element size (log2) of the array build's map when `doctor` loads it: 16 MiB, a tiny
/// model's size (a model's load picks it from its memory, up to 512 MiB).
pub const DOCTOR_ELEM_SHIFT: u32 = 24;
