//! Failing cleanly and leaving nothing behind, as tested facts: every bad input gives its typed
//! error without kernel objects left over; an unprivileged process is told which capability it
//! lacks; 200 open/forward/drop cycles return this process's BPF programs, maps, file descriptors
//! and memory; two models (in one process or two) do not disturb each other; oversized requests
//! are refused before anything is loaded; damaged, stale or foreign caches are rebuilt, and
//! concurrent converters do not corrupt the cache.
//!
//! These tests need BPF for real (root, or CAP_BPF + CAP_PERFMON) and fail loudly otherwise.
//! Tests that count file descriptors take [`serial`] so that no other test in this binary opens
//! or closes any while they count.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use qwen_bpf::hf::synth::{Preset, SynthOptions};
use qwen_bpf::kernel::{classify, ProbeResults, CAPABILITIES, CAP_BPF, CAP_PERFMON, CAP_SYS_ADMIN};
use qwen_bpf::model::check_memory;
use qwen_bpf::store::{cache, q24};
use qwen_bpf::{Backend, Checkpoint, Config, Error, Model, ModelOptions};
use serde_json::Value;

const TOKENS: [u32; 8] = [785, 3974, 13876, 38835, 916, 279, 15678, 5562];
const OTHER_TOKENS: [u32; 8] = [9707, 11, 1879, 220, 108386, 13, 151644, 0];

/// Environment variable that turns the `child_process_entry` test into a helper process.
const CHILD: &str = "QWEN_BPF_SAFETY_CHILD";

// ------------------------------------------------------------------------------------ helpers

static SERIAL: Mutex<()> = Mutex::new(());

/// Held by every test that opens files or BPF objects: fd counts are per process.
fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// This process's file descriptors, by what they point at.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Fds {
    total: usize,
    /// `anon_inode:bpf-prog`.
    progs: usize,
    /// `anon_inode:bpf-map`.
    maps: usize,
    /// Every other target, counted (BTF objects, links, files, pipes, sockets...).
    other: BTreeMap<String, usize>,
}

fn fds() -> Fds {
    let mut f = Fds {
        total: 0,
        progs: 0,
        maps: 0,
        other: BTreeMap::new(),
    };
    for entry in std::fs::read_dir("/proc/self/fd")
        .expect("/proc/self/fd")
        .flatten()
    {
        let Ok(target) = std::fs::read_link(entry.path()) else {
            continue;
        }; // the listing's own fd, closed meanwhile
        let target = target.to_string_lossy().into_owned();
        f.total += 1;
        match target.as_str() {
            "anon_inode:bpf-prog" => f.progs += 1,
            "anon_inode:bpf-map" => f.maps += 1,
            t => {
                // pipes and sockets carry inode numbers; classify by kind only
                let kind = t
                    .split_once(":[")
                    .map(|(k, _)| k.to_string())
                    .unwrap_or_else(|| t.to_string());
                *f.other.entry(kind).or_default() += 1;
            }
        }
    }
    f
}

/// `field` (in kB) of /proc/self/status, in bytes.
fn status_bytes(field: &str) -> usize {
    let s = std::fs::read_to_string("/proc/self/status").unwrap();
    let v = s
        .lines()
        .find_map(|l| l.strip_prefix(field).and_then(|r| r.strip_prefix(':')))
        .unwrap_or_else(|| panic!("{field} in /proc/self/status"));
    v.trim()
        .trim_end_matches("kB")
        .trim()
        .parse::<usize>()
        .unwrap()
        * 1024
}

/// Lines of /proc/self/maps that map BPF objects or files under `dir`.
fn bpf_and_file_mappings(dir: &Path) -> Vec<String> {
    let dir = dir.to_string_lossy().into_owned();
    std::fs::read_to_string("/proc/self/maps")
        .unwrap()
        .lines()
        .filter(|l| l.contains("bpf") || l.contains(&dir))
        .map(str::to_string)
        .collect()
}

/// The tiny preset with a 1,000-token vocabulary and no tokenizer: quick to write and convert.
fn small_config() -> Config {
    Config {
        vocab_size: 1000,
        ..Preset::Tiny.config()
    }
}

fn small_model() -> PathBuf {
    common::model_with(
        "safety-small",
        &small_config(),
        &SynthOptions {
            seed: 5,
            ..Default::default()
        },
    )
}

fn opts(max_context: usize, cache: &Path) -> ModelOptions {
    ModelOptions {
        max_context,
        cache_dir: Some(cache.to_path_buf()),
        ..Default::default()
    }
}

/// A writable copy of the checkpoint files of `src` in a fresh scratch directory.
fn copy_model(src: &Path) -> tempfile::TempDir {
    let dir = common::scratch_dir();
    for f in ["config.json", "model.safetensors"] {
        std::fs::copy(src.join(f), dir.path().join(f)).unwrap();
    }
    dir
}

/// The JSON header of a safetensors file and the data bytes after it.
fn split(path: &Path) -> (Value, Vec<u8>) {
    let bytes = std::fs::read(path).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    (
        serde_json::from_slice(&bytes[8..8 + n]).unwrap(),
        bytes[8 + n..].to_vec(),
    )
}

/// Writes a safetensors file from a header and data bytes, verbatim (header padded to 8 bytes).
fn join(path: &Path, header: &Value, data: &[u8]) {
    let mut text = serde_json::to_string(header).unwrap();
    while text.len() % 8 != 0 {
        text.push(' ');
    }
    let mut out = (text.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(text.as_bytes());
    out.extend_from_slice(data);
    std::fs::write(path, out).unwrap();
}

/// Overwrites element `index` of BF16 tensor `name` with `value`.
fn poke(dir: &Path, name: &str, index: usize, value: f32) {
    let path = dir.join("model.safetensors");
    let (header, mut data) = split(&path);
    let at = header[name]["data_offsets"][0].as_u64().unwrap() as usize + 2 * index;
    data[at..at + 2].copy_from_slice(&half::bf16::from_f32(value).to_le_bytes());
    join(&path, &header, &data);
}

fn edit_header(dir: &Path, edit: impl FnOnce(&mut Value)) {
    let path = dir.join("model.safetensors");
    let (mut header, data) = split(&path);
    edit(&mut header);
    join(&path, &header, &data);
}

fn edit_config(dir: &Path, edit: impl FnOnce(&mut Value)) {
    let path = dir.join("config.json");
    let mut v: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    edit(&mut v);
    std::fs::write(path, v.to_string()).unwrap();
}

fn files_in(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

/// FNV-1a over the logits of every position.
fn hash_logits(all: &[Vec<i32>]) -> u64 {
    common::fnv1a(all.iter().flatten().flat_map(|v| v.to_le_bytes()))
}

fn run_logits(m: &mut Model, tokens: &[u32]) -> Vec<Vec<i32>> {
    tokens
        .iter()
        .map(|&t| m.forward_fixed(t).unwrap().to_vec())
        .collect()
}

/// Re-runs this test binary as a helper process in `mode` (see `child_process_entry`).
fn child(mode: &str, envs: &[(&str, String)]) -> Command {
    let mut c = Command::new(std::env::current_exe().unwrap());
    c.args([
        "child_process_entry",
        "--exact",
        "--ignored",
        "--nocapture",
        "--test-threads=1",
    ])
    .env(CHILD, mode)
    .stdin(Stdio::null());
    for (k, v) in envs {
        c.env(k, v);
    }
    c
}

/// The helper's `RESULT:` lines, after checking that it exited successfully.
fn child_results(out: std::process::Output, what: &str) -> Vec<String> {
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{what} failed: {}\nstdout:\n{stdout}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    // libtest prints "test child_process_entry ... " in front of the first line
    let lines: Vec<String> = stdout
        .lines()
        .filter_map(|l| l.split_once("RESULT: "))
        .map(|(_, r)| r.to_string())
        .collect();
    assert!(
        !lines.is_empty(),
        "{what} printed no result:\n{stdout}\nstderr:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    lines
}

/// Helper processes: with `QWEN_BPF_SAFETY_CHILD` set, one of the processes the tests below start
/// (through [`child`]), printing `RESULT: ...` lines. Ignored in a normal run, where it would
/// have nothing to check; run without the variable it fails.
#[test]
#[ignore = "a helper process, started by the other safety tests with QWEN_BPF_SAFETY_CHILD set"]
fn child_process_entry() {
    let mode = std::env::var(CHILD).unwrap_or_else(|_| {
        panic!("{CHILD} is not set: this is a helper process the other safety tests start")
    });
    let env = |k: &str| {
        std::env::var(k).unwrap_or_else(|_| panic!("{k} must be set for the {mode} helper"))
    };
    match mode.as_str() {
        "unprivileged" => {
            // Become nobody, keeping exactly the capabilities named in CAPS (comma-separated numbers).
            let keep: Vec<u32> = env("CAPS")
                .split(',')
                .filter(|c| !c.is_empty())
                .map(|c| c.parse().unwrap())
                .collect();
            #[repr(C)]
            struct CapHeader {
                version: u32,
                pid: i32,
            }
            #[repr(C)]
            #[derive(Default, Clone, Copy)]
            struct CapData {
                effective: u32,
                permitted: u32,
                inheritable: u32,
            }
            let mut data = [CapData::default(); 2];
            for &c in &keep {
                data[c as usize / 32].effective |= 1 << (c % 32);
                data[c as usize / 32].permitted |= 1 << (c % 32);
            }
            // SAFETY: plain libc calls with valid pointers; glibc applies set*id to every thread.
            unsafe {
                assert_eq!(libc::prctl(libc::PR_SET_KEEPCAPS, 1, 0, 0, 0), 0, "prctl");
                assert_eq!(libc::setgroups(0, std::ptr::null()), 0, "setgroups");
                assert_eq!(libc::setgid(65534), 0, "setgid");
                assert_eq!(libc::setuid(65534), 0, "setuid");
                assert_eq!((libc::getuid(), libc::geteuid()), (65534, 65534));
                let header = CapHeader {
                    version: 0x2008_0522,
                    pid: 0,
                }; // _LINUX_CAPABILITY_VERSION_3
                assert_eq!(
                    libc::syscall(libc::SYS_capset, &header, data.as_ptr()),
                    0,
                    "capset"
                );
            }
            let show = |r: qwen_bpf::Result<String>| match r {
                Ok(s) => format!("Ok {s}"),
                Err(e) => format!("{e:?} | {e}"),
            };
            println!(
                "RESULT: probe {}",
                show(qwen_bpf::kernel::probe::probe().map(|()| String::new()))
            );
            let dir = PathBuf::from(env("MODEL_DIR"));
            let opened = Model::open(
                &dir,
                &ModelOptions {
                    threads: 1,
                    ..opts(8, &dir)
                },
            );
            println!(
                "RESULT: open {}",
                show(opened.map(|mut m| hash_logits(&run_logits(&mut m, &[1, 2, 3])).to_string()))
            );
        }
        "logits" => {
            let tokens: Vec<u32> = env("TOKENS")
                .split(',')
                .map(|t| t.parse().unwrap())
                .collect();
            let dir = PathBuf::from(env("MODEL_DIR"));
            let mut m = Model::open(&dir, &opts(16, &dir)).expect("helper: open the model");
            println!("RESULT: {}", hash_logits(&run_logits(&mut m, &tokens)));
        }
        "convert" => {
            let start: u128 = env("START_AT").parse().unwrap();
            let ck = Checkpoint::open(env("MODEL_DIR")).expect("helper: open the checkpoint");
            while SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .unwrap()
                .as_nanos()
                < start
            {
                std::thread::sleep(Duration::from_millis(1));
            }
            let c = q24::open_or_convert(&ck, Path::new(&env("CACHE_DIR")), false)
                .expect("helper: convert");
            println!("RESULT: {}", c.header.checksum);
        }
        other => panic!("unknown helper mode {other:?}"),
    }
}

// ------------------------------------------------------------------- bad checkpoints and inputs

#[test]
fn bad_checkpoints_give_typed_errors_and_leave_nothing_behind() {
    let _g = serial();
    let good = small_model();
    let cfg = small_config();
    let (h, i) = (cfg.hidden_size, cfg.intermediate_size);
    type Damage = Box<dyn Fn(&Path)>;
    type Check = Box<dyn Fn(&Error) -> bool>;
    let gate = "model.layers.1.mlp.gate_proj.weight";
    let k_norm = "model.layers.0.self_attn.k_norm.weight";
    let o_proj = "model.layers.0.self_attn.o_proj.weight";
    let cases: Vec<(&str, Damage, Check)> = vec![
        (
            "a linear weight of 200.0 (Q24 holds |w| < 128)",
            Box::new(move |d| poke(d, gate, 5 * 64 + 7, 200.0)),
            Box::new(move |e| {
                matches!(e, Error::OutOfRange { name, index, value, format: "Q24", max }
                    if name == gate && *index == 5 * 64 + 7 && *value == 200.0 && *max == 128.0)
            }),
        ),
        (
            "an embedding of -130.0",
            Box::new(|d| poke(d, "model.embed_tokens.weight", 999 * 64, -130.0)),
            Box::new(
                |e| matches!(e, Error::OutOfRange { name, index: 63936, value, .. } if name == "model.embed_tokens.weight" && *value == -130.0),
            ),
        ),
        (
            "a norm weight of 4096.0 (Q20 holds |w| < 2048)",
            Box::new(move |d| poke(d, k_norm, 3, 4096.0)),
            Box::new(
                move |e| matches!(e, Error::OutOfRange { name, index: 3, format: "Q20", max, .. } if name == k_norm && *max == 2048.0),
            ),
        ),
        (
            "a NaN weight",
            Box::new(move |d| poke(d, o_proj, 100, f32::NAN)),
            Box::new(
                move |e| matches!(e, Error::NonFinite { name, index: 100, value } if name == o_proj && value.is_nan()),
            ),
        ),
        (
            "an infinite weight",
            Box::new(|d| poke(d, "model.norm.weight", 0, f32::INFINITY)),
            Box::new(
                |e| matches!(e, Error::NonFinite { name, index: 0, .. } if name == "model.norm.weight"),
            ),
        ),
        (
            "a truncated model.safetensors",
            Box::new(|d| {
                let p = d.join("model.safetensors");
                let n = std::fs::metadata(&p).unwrap().len();
                std::fs::OpenOptions::new()
                    .write(true)
                    .open(&p)
                    .unwrap()
                    .set_len(n - 4096)
                    .unwrap();
            }),
            Box::new(
                |e| matches!(e, Error::Safetensors { path, .. } if path.ends_with("model.safetensors")),
            ),
        ),
        (
            "a header whose offsets run past the file",
            Box::new(move |d| {
                edit_header(d, |hd| {
                    hd[k_norm]["data_offsets"] = serde_json::json!([1 << 30, (1 << 30) + 32])
                })
            }),
            Box::new(|e| matches!(e, Error::Safetensors { .. })),
        ),
        (
            "a header whose size field lies",
            Box::new(|d| {
                let p = d.join("model.safetensors");
                let mut b = std::fs::read(&p).unwrap();
                let n = u64::from_le_bytes(b[..8].try_into().unwrap()) + 16;
                b[..8].copy_from_slice(&n.to_le_bytes());
                std::fs::write(&p, b).unwrap();
            }),
            Box::new(|e| matches!(e, Error::Safetensors { .. })),
        ),
        (
            "a wrong dtype",
            Box::new(move |d| edit_header(d, |hd| hd[k_norm]["dtype"] = "I16".into())),
            Box::new(
                move |e| matches!(e, Error::Dtype { name, dtype, .. } if name == k_norm && dtype == "I16"),
            ),
        ),
        (
            "a wrong shape",
            Box::new(move |d| edit_header(d, |hd| hd[gate]["shape"] = serde_json::json!([h, i]))),
            Box::new(
                move |e| matches!(e, Error::Shape { name, found, expected, .. } if name == gate && *found == [h, i] && *expected == [i, h]),
            ),
        ),
        (
            "a missing tensor",
            Box::new(|d| {
                edit_header(d, |hd| {
                    let v = hd
                        .as_object_mut()
                        .unwrap()
                        .remove("model.norm.weight")
                        .unwrap();
                    hd["model.norm.weight.renamed"] = v;
                })
            }),
            Box::new(
                |e| matches!(e, Error::MissingTensor { name, .. } if name == "model.norm.weight"),
            ),
        ),
        (
            "a config whose intermediate_size contradicts the tensors",
            Box::new(|d| edit_config(d, |c| c["intermediate_size"] = 224.into())),
            Box::new(
                |e| matches!(e, Error::Shape { name, expected, .. } if name == "model.layers.0.mlp.gate_proj.weight" && *expected == [224, 64]),
            ),
        ),
        (
            "a config with more layers than the tensors",
            Box::new(|d| edit_config(d, |c| c["num_hidden_layers"] = 3.into())),
            Box::new(
                |e| matches!(e, Error::MissingTensor { name, .. } if name.starts_with("model.layers.2.")),
            ),
        ),
        (
            "a config that is not JSON",
            Box::new(|d| std::fs::write(d.join("config.json"), "{\"vocab_size\": ").unwrap()),
            Box::new(|e| matches!(e, Error::Config { path, .. } if path.ends_with("config.json"))),
        ),
    ];
    // Warm up libbpf (its first load caches kernel BTF) before counting.
    drop(Model::open(&good, &opts(4, &good)).unwrap());
    for (what, damage, check) in cases {
        let dir = copy_model(&good);
        let cache_dir = common::scratch_dir();
        damage(dir.path());
        let before = fds();
        let err = Model::open(dir.path(), &opts(8, cache_dir.path()))
            .map(drop)
            .expect_err(what);
        assert!(check(&err), "{what}: unexpected error {err:?}");
        eprintln!("{what}: {err}");
        assert_eq!(
            fds(),
            before,
            "{what}: file descriptors after the failed open"
        );
        assert_eq!(
            files_in(cache_dir.path()),
            Vec::<String>::new(),
            "{what}: nothing may be left in the cache directory"
        );
    }
    // Values beyond the format also name the tensor and value in the message.
    let dir = copy_model(&good);
    poke(dir.path(), gate, 0, 200.0);
    let msg = Model::open(dir.path(), &opts(8, dir.path()))
        .unwrap_err()
        .to_string();
    for w in [gate, "200", "Q24", "128"] {
        assert!(msg.contains(w), "{msg:?} should name {w:?}");
    }
}

#[test]
fn bad_tokens_empty_prompts_and_overflow_are_typed_and_change_nothing() {
    let _g = serial();
    let dir = small_model();
    let mut m = Model::open(&dir, &opts(4, &dir)).unwrap();
    let mut fresh = Model::open(&dir, &opts(4, &dir)).unwrap();
    let before = fds();
    let want: Vec<Vec<f32>> = [1u32, 2, 3, 4]
        .iter()
        .map(|&t| fresh.forward(t).unwrap().to_vec())
        .collect();

    assert!(
        matches!(m.prefill(&[]), Err(Error::EmptyPrompt)),
        "empty prompt"
    );
    assert!(matches!(
        m.forward(1000),
        Err(Error::TokenOutOfRange {
            id: 1000,
            index: 0,
            vocab: 1000
        })
    ));
    assert!(matches!(
        m.next_token(u32::MAX),
        Err(Error::TokenOutOfRange { id: u32::MAX, .. })
    ));
    match m.prefill(&[1, 2, 77_777, 3]) {
        Err(Error::TokenOutOfRange {
            id: 77_777,
            index: 2,
            vocab: 1000,
        }) => {}
        other => panic!("id 77777 at index 2: want TokenOutOfRange, got {other:?}"),
    }
    match m.prefill(&[1, 2, 3, 4, 5]) {
        Err(Error::ContextOverflow { max_context: 4, .. }) => {}
        other => panic!("5 tokens into a context of 4: want ContextOverflow, got {other:?}"),
    }
    assert_eq!(m.position(), 0, "rejected input must not advance the model");

    // The model is untouched: it computes exactly what a fresh one does, then overflows.
    assert_eq!(
        m.prefill(&[1, 2]).unwrap(),
        want[1],
        "prefill returns the logits after its last token"
    );
    assert!(matches!(
        m.prefill(&[3, 4, 5]),
        Err(Error::ContextOverflow { .. })
    ));
    assert_eq!(m.forward(3).unwrap(), want[2]);
    assert_eq!(m.forward(4).unwrap(), want[3]);
    match m.forward(5) {
        Err(Error::ContextOverflow {
            pos: 4,
            max_context: 4,
        }) => {}
        other => panic!("generation past max_context: want ContextOverflow, got {other:?}"),
    }
    assert!(matches!(
        m.prefill(&[5]),
        Err(Error::ContextOverflow { .. })
    ));
    m.reset();
    assert_eq!(m.forward(1).unwrap(), want[0], "after reset");
    assert_eq!(fds(), before, "errors open or close no file descriptor");
}

// ------------------------------------------------------------------------------- cache files

#[test]
fn caches_of_another_version_format_or_checkpoint_are_rebuilt_never_used() {
    let _g = serial();
    let dir = small_model();
    let other = common::model_with(
        "safety-small-other",
        &small_config(),
        &SynthOptions {
            seed: 6,
            ..Default::default()
        },
    );
    let ck = Checkpoint::open(&dir).unwrap();
    let cache_dir = common::scratch_dir();
    let file = cache_dir.path().join(q24::FILE_NAME);
    let want = run_logits(
        &mut Model::open(&dir, &opts(4, cache_dir.path())).unwrap(),
        &[1, 2],
    );
    let good = std::fs::read(&file).unwrap();
    let other_cache = {
        let d = common::scratch_dir();
        drop(Model::open(&other, &opts(4, d.path())).unwrap());
        std::fs::read(d.path().join(q24::FILE_NAME)).unwrap()
    };
    assert_ne!(other_cache, good);
    // The file with its header edited (and re-serialised as the writer does), payload unchanged.
    let with_header = |edit: &dyn Fn(&mut cache::Header)| {
        let hlen = u32::from_le_bytes(good[12..16].try_into().unwrap()) as usize;
        let mut h: cache::Header = serde_json::from_slice(&good[16..16 + hlen]).unwrap();
        edit(&mut h);
        let text = serde_json::to_vec(&h).unwrap();
        let mut b = [&good[..12], &(text.len() as u32).to_le_bytes(), &text].concat();
        b.resize((16 + text.len()).div_ceil(4096) * 4096, 0);
        b.extend_from_slice(&good[(16 + hlen).div_ceil(4096) * 4096..]);
        b
    };
    assert!(
        with_header(&|_| {}) == good,
        "an unedited header rebuilds the same file"
    );
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        (
            "another format version",
            [&good[..8], &(cache::VERSION + 1).to_le_bytes(), &good[12..]].concat(),
            "format version",
        ),
        (
            "another version in the header",
            with_header(&|h| h.version = 7),
            "v7",
        ),
        (
            "another store format",
            with_header(&|h| h.format = "q42".into()),
            "\"q42\"",
        ),
        ("another checkpoint", other_cache, "another checkpoint"),
        (
            "another config",
            with_header(&|h| h.config.rms_norm_eps = 2e-6),
            "another config",
        ),
        (
            "a tensor outside the payload",
            with_header(&|h| h.tensors[3].offset = h.payload_bytes),
            "outside the payload",
        ),
    ];
    for (what, bytes, reason) in cases {
        std::fs::write(&file, &bytes).unwrap();
        match cache::open(&file, "q24", &ck.identity(), &ck.config).unwrap() {
            Err(r) => assert!(
                r.contains(reason),
                "{what}: reason {r:?} should say {reason:?}"
            ),
            Ok(_) => panic!("{what}: cache accepted"),
        }
        let got = run_logits(
            &mut Model::open(&dir, &opts(4, cache_dir.path())).unwrap(),
            &[1, 2],
        );
        assert_eq!(got, want, "{what}: logits after the rebuild");
        assert!(
            std::fs::read(&file).unwrap() == good,
            "{what}: rebuilt to the same bytes"
        );
    }
    assert_eq!(
        files_in(cache_dir.path()),
        vec![q24::FILE_NAME.to_string()],
        "no temporary files left"
    );
}

#[test]
fn concurrent_converters_do_not_corrupt_the_cache() {
    let _g = serial();
    let dir = small_model();
    let ck = Checkpoint::open(&dir).unwrap();
    let cache_dir = common::scratch_dir();
    let file = cache_dir.path().join(q24::FILE_NAME);
    for round in ["no cache yet", "a truncated cache"] {
        if file.exists() {
            let n = std::fs::metadata(&file).unwrap().len();
            std::fs::OpenOptions::new()
                .write(true)
                .open(&file)
                .unwrap()
                .set_len(n / 3)
                .unwrap();
        }
        let start = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_nanos()
            + 400_000_000;
        let children: Vec<_> = (0..3)
            .map(|_| {
                child(
                    "convert",
                    &[
                        ("MODEL_DIR", dir.display().to_string()),
                        ("CACHE_DIR", cache_dir.path().display().to_string()),
                        ("START_AT", start.to_string()),
                    ],
                )
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
            })
            .collect();
        let sums: Vec<String> = children
            .into_iter()
            .map(|c| child_results(c.wait_with_output().unwrap(), round).remove(0))
            .collect();
        assert!(
            sums.windows(2).all(|w| w[0] == w[1]),
            "{round}: every converter verified the same payload: {sums:?}"
        );
        let c = cache::open(&file, "q24", &ck.identity(), &ck.config)
            .unwrap()
            .unwrap_or_else(|r| panic!("{round}: cache unusable: {r}"));
        assert_eq!(c.header.checksum, sums[0]);
        assert_eq!(
            files_in(cache_dir.path()),
            vec![q24::FILE_NAME.to_string()],
            "{round}: no temporary files left"
        );
    }
    let mut m = Model::open(&dir, &opts(4, cache_dir.path())).unwrap();
    let mut fresh = Model::open(&dir, &opts(4, &dir)).unwrap();
    assert_eq!(
        run_logits(&mut m, &[1, 2, 3]),
        run_logits(&mut fresh, &[1, 2, 3])
    );
}

// ------------------------------------------------------------------- privileges and features

/// Runs the unprivileged helper as nobody with `caps`; its (probe, open) results.
fn as_nobody_with(caps: &[u32], dir: &Path) -> (String, String) {
    let list = caps
        .iter()
        .map(u32::to_string)
        .collect::<Vec<_>>()
        .join(",");
    let out = child(
        "unprivileged",
        &[("MODEL_DIR", dir.display().to_string()), ("CAPS", list)],
    )
    .output()
    .unwrap();
    let lines = child_results(out, "the unprivileged helper");
    eprintln!("as nobody with capabilities {caps:?}: {lines:#?}");
    let get = |what: &str| {
        lines
            .iter()
            .find_map(|l| l.strip_prefix(what))
            .unwrap_or_else(|| panic!("no {what} result in {lines:?}"))
            .trim()
            .to_string()
    };
    (get("probe "), get("open "))
}

#[test]
fn unprivileged_process_is_told_the_missing_capability() {
    let _g = serial();
    // Without capabilities, even a model directory nobody may read gives the privilege error:
    // the capability check comes first.
    let private = small_model();
    let (probe, open) = as_nobody_with(&[], &private);
    for (what, got) in [("probe", &probe), ("open", &open)] {
        assert!(
            got.starts_with("Privileges {"),
            "{what} as nobody: want Error::Privileges, got {got}"
        );
        assert!(
            got.contains("needs CAP_BPF and CAP_PERFMON (or root)"),
            "{what}: {got} should name CAP_BPF and CAP_PERFMON"
        );
    }
    let (probe, _) = as_nobody_with(&[CAP_PERFMON], &private);
    assert!(
        probe.starts_with("Privileges {") && probe.contains("needs CAP_BPF (or root)"),
        "CAP_PERFMON alone: {probe}"
    );

    // With exactly CAP_BPF and CAP_PERFMON, nobody runs the model (from a copy it may read and
    // write its cache next to) and gets root's logits.
    let shared = copy_model(&private);
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(shared.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    for f in ["config.json", "model.safetensors"] {
        std::fs::set_permissions(
            shared.path().join(f),
            std::fs::Permissions::from_mode(0o644),
        )
        .unwrap();
    }
    let want = hash_logits(&run_logits(
        &mut Model::open(&private, &opts(8, &private)).unwrap(),
        &[1, 2, 3],
    ));
    let (probe, open) = as_nobody_with(&[CAP_BPF], shared.path());
    for (what, got) in [("probe", &probe), ("open", &open)] {
        assert!(
            got.starts_with("Privileges {") && got.contains("needs CAP_PERFMON (or root)"),
            "CAP_BPF alone, {what}: {got}"
        );
    }
    let (probe, open) = as_nobody_with(&[CAP_BPF, CAP_PERFMON], shared.path());
    assert_eq!(probe, "Ok", "CAP_BPF + CAP_PERFMON suffice for the probe");
    assert_eq!(
        open,
        format!("Ok {want}"),
        "CAP_BPF + CAP_PERFMON suffice for the model, with root's logits"
    );
}

#[test]
fn probe_results_map_to_privilege_or_feature_errors() {
    let all = (1u64 << CAP_BPF) | (1 << CAP_PERFMON);
    let p = |arena, syscall_prog, bpf_loop, cap_eff| ProbeResults {
        arena,
        syscall_prog,
        bpf_loop,
        cap_eff,
    };
    let feature = |r: qwen_bpf::Result<()>| match r {
        Err(Error::KernelFeature {
            feature,
            needs,
            detail,
            ..
        }) => format!("{feature} | {needs} | {detail}"),
        other => panic!("want KernelFeature, got {other:?}"),
    };
    let privileges = |r: qwen_bpf::Result<()>| match r {
        Err(e @ Error::Privileges { .. }) => e.to_string(),
        other => panic!("want Privileges, got {other:?}"),
    };

    // Everything there: fine with both capabilities, CAP_SYS_ADMIN, or when they are unknown.
    for caps in [Some(all), Some(1 << CAP_SYS_ADMIN), Some(u64::MAX), None] {
        classify(&p(1, 1, 1, caps)).unwrap();
    }
    // A missing capability is named even when libbpf's probes pass: with CAP_BPF alone they do,
    // and the programs are refused at load.
    assert!(privileges(classify(&p(1, 1, 1, Some(1 << CAP_BPF))))
        .contains("needs CAP_PERFMON (or root)"));
    assert!(privileges(classify(&p(1, 1, 1, Some(0)))).contains(CAPABILITIES));
    // The kernel lacks a feature: named, with the kernel that has it.
    assert!(feature(classify(&p(0, 1, 1, Some(all)))).starts_with("BPF arena maps | Linux >= 6.9"));
    assert!(feature(classify(&p(1, 1, 0, Some(all))))
        .starts_with("the bpf_loop helper | Linux >= 5.17"));
    assert!(feature(classify(&p(-libc::EINVAL, 1, 1, None))).contains("Invalid argument"));
    assert!(feature(classify(&p(1, 0, 0, Some(u64::MAX))))
        .starts_with("BPF_PROG_TYPE_SYSCALL programs | Linux >= 5.14"));
    assert!(
        feature(classify(&p(0, 1, 1, Some(1 << CAP_SYS_ADMIN)))).starts_with("BPF arena maps"),
        "CAP_SYS_ADMIN implies both"
    );
    // Without the capabilities libbpf's probes answer 0 for everything: that is not the kernel's fault.
    let msg = privileges(classify(&p(0, 0, 0, Some(0))));
    assert!(
        msg.contains(CAPABILITIES) && msg.contains("permission denied"),
        "{msg}"
    );
    assert!(privileges(classify(&p(0, 0, 0, Some(1 << CAP_PERFMON))))
        .contains("needs CAP_BPF (or root)"));
    assert!(privileges(classify(&p(1, 0, 1, Some(1 << CAP_BPF))))
        .contains("needs CAP_PERFMON (or root)"));
    // An explicit refusal is a privilege problem even when the capabilities are unknown.
    assert!(privileges(classify(&p(-libc::EPERM, 1, 1, None))).contains(CAPABILITIES));
    assert!(privileges(classify(&p(1, -libc::EACCES, 1, Some(all)))).contains(CAPABILITIES));

    // This process (root) has what it needs, and the real probe agrees.
    let here = qwen_bpf::kernel::probe_results();
    assert_eq!(
        (here.arena, here.syscall_prog, here.bpf_loop),
        (1, 1, 1),
        "{here:?}"
    );
    classify(&here).unwrap();
}

// ------------------------------------------------------------------------ kernel resources

#[test]
fn open_forward_drop_200_times_returns_every_kernel_object_and_the_memory() {
    let _g = serial();
    let dir = common::tiny_model("safety-tiny");
    let cycle = |i: usize| {
        let backend = if i % 2 == 0 {
            Backend::Q24
        } else {
            Backend::Arena
        };
        // Without the LM-head screen: its open-time buffers (tens of MB on the heap of whichever
        // worker opens) leave glibc fragments resident between opens when several threads
        // allocate, which is allocator behaviour, not a leak (with one malloc arena the same
        // loop with the screen ends 0.6 MB lower than it starts). What this test checks is that
        // every kernel object and every allocation of the engine is returned.
        let mut m = Model::open(
            &dir,
            &ModelOptions {
                backend,
                screened_head: false,
                ..opts(8, &dir)
            },
        )
        .unwrap_or_else(|e| panic!("cycle {i}: {e}"));
        let logits = m.forward_fixed(TOKENS[i % 2]).unwrap().to_vec();
        (logits, fds(), status_bytes("VmRSS"))
    };
    // Warm up: libbpf caches kernel BTF and the allocator grows its pools on first use.
    let first = [cycle(0).0, cycle(1).0];
    // SAFETY: as below.
    unsafe { libc::malloc_trim(0) };
    let (fd0, rss0, maps0) = (fds(), status_bytes("VmRSS"), bpf_and_file_mappings(&dir));
    // Two workers of 100 cycles each: loading the operator programs (the verifier) dominates a
    // cycle, and two cores halve the wall time; it also shows concurrent loads and drops clean up.
    let t = Instant::now();
    let peak_rss = std::thread::scope(|s| {
        let workers: Vec<_> = (0..2)
            .map(|w| {
                let (cycle, first, fd0) = (&cycle, &first, &fd0);
                s.spawn(move || {
                    let mut peak = 0;
                    for i in w * 100..(w + 1) * 100 {
                        let (logits, live, rss) = cycle(i);
                        assert_eq!(logits, first[i % 2], "cycle {i}: same token, same logits");
                        assert!(
                            live.progs > fd0.progs && live.maps > fd0.maps,
                            "cycle {i}: a live model holds BPF programs and maps: {live:?}"
                        );
                        peak = peak.max(rss);
                    }
                    peak
                })
            })
            .collect();
        workers
            .into_iter()
            .map(|h| h.join().unwrap())
            .max()
            .unwrap()
    });
    // Freed heap stays in glibc's arenas (the two workers each have one) until trimmed: give it
    // back first, so that what remains is what is still allocated.
    // SAFETY: malloc_trim only releases free memory of the allocator.
    unsafe { libc::malloc_trim(0) };
    let (fd1, rss1, maps1) = (fds(), status_bytes("VmRSS"), bpf_and_file_mappings(&dir));
    eprintln!(
        "200 cycles in {:.1?}; fds {fd0:?} -> {fd1:?}; VmRSS {} -> {} KiB (peak with a live model {} KiB)",
        t.elapsed(),
        rss0 / 1024,
        rss1 / 1024,
        peak_rss / 1024
    );
    assert_eq!(
        fd1, fd0,
        "BPF programs, maps and file descriptors after 200 cycles"
    );
    assert_eq!(
        maps1, maps0,
        "mappings of BPF objects and model files after 200 cycles"
    );
    assert!(
        rss1 <= rss0 + (16 << 20),
        "VmRSS grew by {} KiB over 200 cycles",
        (rss1 - rss0) / 1024
    );
    assert!(
        peak_rss > rss1 + (16 << 20),
        "a live Q24 model's memory ({} KiB) is visible and returned ({} KiB)",
        peak_rss / 1024,
        rss1 / 1024
    );
}

#[test]
fn two_models_in_one_process_are_independent() {
    let _g = serial();
    let dir = common::tiny_model("safety-tiny");
    let alone =
        |tokens: &[u32]| run_logits(&mut Model::open(&dir, &opts(16, &dir)).unwrap(), tokens);
    let (want_a, want_b) = (alone(&TOKENS), alone(&OTHER_TOKENS));
    let mut a = Model::open(&dir, &opts(16, &dir)).unwrap();
    let mut b = Model::open(
        &dir,
        &ModelOptions {
            backend: Backend::Arena,
            threads: 1,
            ..opts(16, &dir)
        },
    )
    .unwrap();
    for (i, (&ta, &tb)) in TOKENS.iter().zip(&OTHER_TOKENS).enumerate() {
        assert_eq!(
            a.forward_fixed(ta).unwrap(),
            want_a[i],
            "model A at position {i}, interleaved with B"
        );
        assert_eq!(
            b.forward_fixed(tb).unwrap(),
            want_b[i],
            "model B at position {i}, interleaved with A"
        );
    }
    // Two models on the same sequence from two threads at once.
    a.reset();
    b.reset();
    std::thread::scope(|s| {
        let ha = s.spawn(|| run_logits(&mut a, &OTHER_TOKENS));
        let hb = s.spawn(|| run_logits(&mut b, &OTHER_TOKENS));
        assert_eq!(ha.join().unwrap(), want_b, "model A in its own thread");
        assert_eq!(hb.join().unwrap(), want_b, "model B in its own thread");
    });
}

#[test]
fn two_processes_at_once_give_the_same_logits_as_one() {
    let _g = serial();
    let dir = common::tiny_model("safety-tiny");
    let mut m = Model::open(&dir, &opts(16, &dir)).unwrap(); // also makes sure the cache exists
    let want_a = hash_logits(&run_logits(&mut m, &TOKENS));
    m.reset();
    let want_b = hash_logits(&run_logits(&mut m, &OTHER_TOKENS));
    drop(m);
    let list = |t: &[u32]| t.iter().map(u32::to_string).collect::<Vec<_>>().join(",");
    let spawn = |t: &[u32]| {
        child(
            "logits",
            &[
                ("MODEL_DIR", dir.display().to_string()),
                ("TOKENS", list(t)),
            ],
        )
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
    };
    let (pa, pb) = (spawn(&TOKENS), spawn(&OTHER_TOKENS));
    let got_a = child_results(pa.wait_with_output().unwrap(), "process A").remove(0);
    let got_b = child_results(pb.wait_with_output().unwrap(), "process B").remove(0);
    assert_eq!(got_a, want_a.to_string(), "process A's logits");
    assert_eq!(got_b, want_b.to_string(), "process B's logits");
}

// ---------------------------------------------------------------------------------- bounds

#[test]
fn oversized_requests_are_refused_before_anything_is_loaded() {
    let _g = serial();
    let cfg = Config {
        max_position_embeddings: 1 << 62,
        ..small_config()
    };
    let dir = common::model_with(
        "safety-long-context",
        &cfg,
        &SynthOptions {
            seed: 5,
            ..Default::default()
        },
    );
    drop(Model::open(&dir, &opts(4, &dir)).unwrap()); // warm-up
    let kv_per_token = 2 * cfg.num_hidden_layers * cfg.kv_dim() * 4; // 512 bytes
    let cases: [(usize, &[String]); 3] = [
        // the KV cache alone exceeds the arena: 2^24 tokens x 512 bytes = 8 GiB
        (
            1 << 24,
            &[
                (512u64 << 24).to_string(),
                "max_context 16777216".into(),
                "4294967296".into(),
            ],
        ),
        // sizes that would overflow 64-bit arithmetic are refused, not wrapped
        (1 << 60, &[(512u128 << 60).to_string(), "4294967296".into()]),
        // the KV cache fits exactly, weights and scratch push the arena over
        (
            (1 << 32) / kv_per_token,
            &[
                (1u64 << 32).to_string(),
                "KV cache (max_context 8388608)".into(),
                "4294967296".into(),
            ],
        ),
    ];
    for (max_context, words) in cases {
        let cache_dir = common::scratch_dir();
        let before = fds();
        match Model::open(&dir, &opts(max_context, cache_dir.path())) {
            Err(Error::Resources { msg }) => {
                eprintln!("max_context {max_context}: {msg}");
                for w in words {
                    assert!(msg.contains(w.as_str()), "{msg:?} should contain {w:?}");
                }
            }
            other => panic!(
                "max_context {max_context}: want Error::Resources, got {:?}",
                other.map(drop)
            ),
        }
        assert_eq!(
            fds(),
            before,
            "max_context {max_context}: no BPF object or file left open"
        );
        assert!(
            files_in(cache_dir.path()).is_empty(),
            "refused before converting anything"
        );
    }

    // The machine's memory: refused with the numbers, before anything is loaded.
    let err = check_memory(3 << 30, 2 << 30, 5 << 20, 4096, Some(1 << 30)).unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, Error::Resources { .. }), "{err:?}");
    for w in [
        "5373952000",
        "3221225472",
        "2147483648",
        "5242880",
        "max_context 4096",
        "1073741824",
        "MemAvailable",
    ] {
        assert!(msg.contains(w), "{msg:?} should contain {w}");
    }
    check_memory(3 << 30, 2 << 30, 5 << 20, 4096, Some(6 << 30)).unwrap();
    check_memory(usize::MAX, usize::MAX, 1, 1, None).unwrap();
    let avail = qwen_bpf::model::mem_available().expect("MemAvailable in /proc/meminfo");
    assert!(avail > 1 << 20, "MemAvailable {avail}");
}
