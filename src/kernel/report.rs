//! Which programs of the operator object this kernel's verifier takes: each loaded alone (every
//! other program's autoload off), with the instructions the verifier processed or, when refused,
//! the verifier's last words. Kernels differ in their verifiers, so this is the first thing to
//! look at on a new kernel (`doctor`, and the smoke suite of `scripts/vm-test.sh`).

use std::mem::MaybeUninit;
use std::os::fd::AsFd;

use libbpf_rs::skel::{OpenSkel, SkelBuilder};
use libbpf_rs::{OpenObject, PrintLevel};

use super::ops::skel::OpsSkelBuilder;
use super::verifier::{capture, refusal_line, ProgramKind, LOG};

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

/// Loads every program of the operator object alone, in the object's order, and says what the
/// verifier made of each. Takes about as long as loading the object once per program kind; holds
/// libbpf's print callback while it runs (messages of other threads' loads land in the report).
pub fn program_loads() -> Vec<ProgramLoad> {
    let mut storage = MaybeUninit::<OpenObject>::uninit();
    let names: Vec<String> = match OpsSkelBuilder::default().open(&mut storage) {
        Ok(open) => open
            .open_object()
            .progs()
            .map(|p| p.name().to_string_lossy().into_owned())
            .collect(),
        Err(e) => {
            return vec![ProgramLoad {
                name: "(the object)".into(),
                kind: ProgramKind::Forward,
                result: Err(format!("opening the operator object: {e:#}")),
                log_tail: Vec::new(),
            }]
        }
    };
    let previous = libbpf_rs::set_print(Some((PrintLevel::Warn, capture)));
    let report = names
        .iter()
        .map(|name| {
            let (result, log) = load_alone(name);
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

/// Loads program `name` alone: the verified instructions or the refusal, and libbpf's log.
fn load_alone(name: &str) -> (std::result::Result<u32, String>, String) {
    LOG.lock().unwrap_or_else(|e| e.into_inner()).clear();
    let mut storage = MaybeUninit::<OpenObject>::uninit();
    let mut open = match OpsSkelBuilder::default().open(&mut storage) {
        Ok(open) => open,
        Err(e) => return (Err(format!("{e:#}")), String::new()),
    };
    for mut p in open.open_object_mut().progs_mut() {
        let this = p.name().to_string_lossy() == name;
        p.set_autoload(this);
    }
    let loaded = open.load();
    let log = std::mem::take(&mut *LOG.lock().unwrap_or_else(|e| e.into_inner()));
    let result = match loaded {
        Ok(skel) => {
            use libbpf_rs::skel::Skel;
            match skel
                .object()
                .progs()
                .find(|p| p.name().to_string_lossy() == name)
            {
                Some(prog) => super::ops::verified_insns(prog.as_fd()).map_err(|e| e.to_string()),
                None => Err(format!("{name} is not in the loaded object")),
            }
        }
        Err(e) => Err(refusal_line(&log).unwrap_or_else(|| format!("{e:#}"))),
    };
    (result, log)
}
