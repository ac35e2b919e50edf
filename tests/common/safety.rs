//! Helpers of the safety tests (`tests/safety_inputs.rs`, `tests/safety_kernel.rs`): the lock
//! held while counting this process's file descriptors, the count, a small checkpoint and its
//! options, and helper processes that re-run the test binary.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Mutex, MutexGuard};

use qwen_bpf::hf::synth::{Preset, SynthOptions};
use qwen_bpf::{Config, Model, ModelOptions};

/// Environment variable that turns the `child_process_entry` test of a safety test binary into a
/// helper process.
pub const CHILD: &str = "QWEN_BPF_SAFETY_CHILD";

static SERIAL: Mutex<()> = Mutex::new(());

/// Held by every test that opens files or BPF objects: fd counts are per process.
pub fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// This process's file descriptors, by what they point at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fds {
    pub total: usize,
    /// `anon_inode:bpf-prog`.
    pub progs: usize,
    /// `anon_inode:bpf-map`.
    pub maps: usize,
    /// Every other target, counted (BTF objects, links, files, pipes, sockets...).
    pub other: BTreeMap<String, usize>,
}

/// This process's file descriptors now.
pub fn fds() -> Fds {
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

/// The tiny preset with a 1,000-token vocabulary and no tokenizer: quick to write and convert.
pub fn small_config() -> Config {
    Config {
        vocab_size: 1000,
        ..Preset::Tiny.config()
    }
}

/// The small checkpoint ([`small_config`], seed 5) most safety tests use.
pub fn small_model() -> PathBuf {
    super::model_with(
        "safety-small",
        &small_config(),
        &SynthOptions {
            seed: 5,
            ..Default::default()
        },
    )
}

/// The default options with `max_context` and weight caches in `cache`.
pub fn opts(max_context: usize, cache: &Path) -> ModelOptions {
    ModelOptions {
        max_context,
        cache_dir: Some(cache.to_path_buf()),
        ..Default::default()
    }
}

/// A writable copy of the checkpoint files of `src` in a fresh scratch directory.
pub fn copy_model(src: &Path) -> tempfile::TempDir {
    let dir = super::scratch_dir();
    for f in ["config.json", "model.safetensors"] {
        std::fs::copy(src.join(f), dir.path().join(f)).unwrap();
    }
    dir
}

/// The names of the entries of `dir`, sorted.
pub fn files_in(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

/// FNV-1a over the logits of every position.
pub fn hash_logits(all: &[Vec<i32>]) -> u64 {
    super::fnv1a(all.iter().flatten().flat_map(|v| v.to_le_bytes()))
}

/// The fixed-point logits of `m` at each of `tokens`, fed in turn.
pub fn run_logits(m: &mut Model, tokens: &[u32]) -> Vec<Vec<i32>> {
    tokens
        .iter()
        .map(|&t| m.forward_fixed(t).unwrap().to_vec())
        .collect()
}

/// Re-runs this test binary as a helper process in `mode` (see `child_process_entry`).
pub fn child(mode: &str, envs: &[(&str, String)]) -> Command {
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
pub fn child_results(out: std::process::Output, what: &str) -> Vec<String> {
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

/// The helper mode this process runs in (the value of [`CHILD`]); a panic when it is not set.
pub fn child_mode() -> String {
    std::env::var(CHILD).unwrap_or_else(|_| {
        panic!("{CHILD} is not set: this is a helper process the other safety tests start")
    })
}

/// The environment variable `k` the helper in `mode` needs; a panic when it is not set.
pub fn child_env(mode: &str, k: &str) -> String {
    std::env::var(k).unwrap_or_else(|_| panic!("{k} must be set for the {mode} helper"))
}
