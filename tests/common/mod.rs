//! Helpers shared by the integration tests (this package's and, through `#[path]`, those of the
//! `qwen_bpf_dev` member in `dev/`): synthetic checkpoints, opening them ([`open`]), the real
//! Qwen3 tokenizer for the tests that need text, deterministic test data; and in [`safety`] the
//! helpers of the safety tests.
//!
//! Checkpoints are written under `CARGO_TARGET_TMPDIR/models/<tag>` at most once per test process
//! and tag. A `synth.stamp` file records what was generated (a hash of `src/hf/synth.rs`, the
//! config and the options); when it matches, a later process reuses the files untouched, which
//! keeps their modification times, and so [`Checkpoint::identity`](qwen_bpf::Checkpoint::identity)
//! and any weight caches keyed on it, stable across runs. Files are replaced atomically, so
//! processes racing on the same tag both end up with identical, complete checkpoints.
#![allow(dead_code)]

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

use qwen_bpf::hf::synth::{self, Preset, SynthOptions};
use qwen_bpf::{Config, Model, ModelOptions};

mod rng;
#[allow(unused_imports)] // not every test uses it
pub use rng::Rng;
pub mod http;
pub mod netns;
pub mod safety;
pub mod serve;
pub mod wire;

/// The operator programs on `layer`, in `bytes` of memory; panics naming the layer when it does
/// not load, and checks that the layer asked for is the one that loaded.
pub fn ops_on(
    bytes: usize,
    layer: qwen_bpf::kernel::memory::MemoryLayer,
) -> qwen_bpf::kernel::ops::Ops {
    let o = qwen_bpf::kernel::ops::Ops::load_on(bytes, false, layer)
        .unwrap_or_else(|e| panic!("loading the operator programs on the {layer} layer: {e}"));
    assert_eq!(o.layer(), layer, "the layer that loaded");
    o
}

/// The workspace root (the directory holding `Cargo.lock`), from this package's or a member's
/// manifest directory.
pub fn workspace_root() -> &'static Path {
    let here = Path::new(env!("CARGO_MANIFEST_DIR"));
    here.ancestors()
        .find(|d| d.join("Cargo.lock").is_file())
        .unwrap_or(here)
}

/// The real Qwen3 `tokenizer.json` (`../shared/qwen3-tokenizer/tokenizer.json` beside the
/// workspace root). Only tests that turn text into ids or back need it.
pub fn tokenizer_path() -> PathBuf {
    let p = workspace_root().join("../shared/qwen3-tokenizer/tokenizer.json");
    assert!(
        p.is_file(),
        "the Qwen3 tokenizer is missing: expected {} (the text tests need the real tokenizer.json)",
        p.display()
    );
    p
}

/// The example binary `name` that cargo built next to the running test
/// (target/<profile>/examples/<name>; `cargo test` builds the examples).
pub fn example_bin(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary's path");
    let bin = exe
        .parent()
        .and_then(Path::parent)
        .expect("target/<profile>/deps/<test>")
        .join("examples")
        .join(name);
    assert!(
        bin.is_file(),
        "{} is missing: `cargo test` builds the examples",
        bin.display()
    );
    bin
}

/// Where checkpoints for `tag` live.
pub fn model_dir(tag: &str) -> PathBuf {
    assert!(
        !tag.is_empty()
            && tag
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c)),
        "model tag {tag:?} must be a plain file name"
    );
    Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join("models")
        .join(tag)
}

/// The `tiny` preset (tied embeddings, seed 0, transformers-4 keys), without a tokenizer: for
/// tests that feed token ids.
pub fn tiny_model(tag: &str) -> PathBuf {
    model_with(tag, &Preset::Tiny.config(), &SynthOptions::default())
}

/// [`tiny_model`] with the real Qwen3 `tokenizer.json` ([`tokenizer_path`]): for tests of text.
pub fn tiny_model_with_tokenizer(tag: &str) -> PathBuf {
    let opts = SynthOptions {
        tokenizer: Some(tokenizer_path()),
        ..Default::default()
    };
    model_with(tag, &Preset::Tiny.config(), &opts)
}

/// The full-size checkpoint of the on-demand (`#[ignore]`d) tests: `$QWEN_BPF_BENCH_MODEL`, by
/// default `/tmp/q06` (`cargo run --release --example synth -- --preset qwen3-0.6b --out DIR`).
pub fn full_size_model_dir() -> PathBuf {
    std::env::var_os("QWEN_BPF_BENCH_MODEL")
        .map(PathBuf::from)
        .unwrap_or_else(|| "/tmp/q06".into())
}

/// A deterministic 16-token sequence spread over a vocabulary of `vocab` (≥ 2) ids: both ends, a
/// repeat (identical keys at two positions), and ids from a multiplicative hash.
pub fn spread_tokens(vocab: usize) -> Vec<u32> {
    let mut t: Vec<u32> = (0..16u64)
        .map(|i| ((i.wrapping_mul(2_654_435_761).wrapping_add(12_345)) % vocab as u64) as u32)
        .collect();
    t[0] = 0;
    t[5] = vocab as u32 - 1;
    t[9] = t[3];
    t
}

/// A checkpoint for `cfg` and `opts` (`opts.progress` is ignored) in `model_dir(tag)`, written once
/// per process and tag. Using one tag for two different configs in one process panics.
pub fn model_with(tag: &str, cfg: &Config, opts: &SynthOptions) -> PathBuf {
    static DONE: OnceLock<Mutex<HashMap<String, u64>>> = OnceLock::new();
    let dir = model_dir(tag);
    let opts = SynthOptions {
        progress: false,
        ..opts.clone()
    };
    let stamp = stamp_of(cfg, &opts);
    // Held while writing, so concurrent tests in this process wait for one complete checkpoint.
    let mut done = DONE
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    match done.get(tag) {
        Some(&s) if s == stamp => return dir,
        Some(_) => panic!("model tag {tag:?} was already used for a different config or options"),
        None => {}
    }
    let stamp_path = dir.join("synth.stamp");
    let complete = ["config.json", "model.safetensors"]
        .iter()
        .all(|f| dir.join(f).is_file())
        && (opts.tokenizer.is_none() || dir.join("tokenizer.json").is_file());
    let current = std::fs::read_to_string(&stamp_path)
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok());
    if !(complete && current == Some(stamp)) {
        // A stale stamp must not survive a crash half-way through the rewrite.
        let _ = std::fs::remove_file(&stamp_path);
        if opts.tokenizer.is_none() {
            // Left by an earlier run with a tokenizer: the checkpoint must not have one now.
            let _ = std::fs::remove_file(dir.join("tokenizer.json"));
        }
        synth::write_checkpoint(&dir, cfg, &opts)
            .unwrap_or_else(|e| panic!("writing the synthetic checkpoint {}: {e}", dir.display()));
        write_atomic(&stamp_path, format!("{stamp}\n").as_bytes());
    }
    done.insert(tag.to_string(), stamp);
    dir
}

/// The checkpoint in `dir` opened with `opts`, which a test writes out where it opens a model
/// (`common::open(&dir, ModelOptions::default().with_max_context(32))`). A failure panics with the
/// directory and every option.
pub fn open(dir: &Path, opts: ModelOptions) -> Model {
    Model::open(dir, &opts)
        .unwrap_or_else(|e| panic!("opening {} with {opts:?}: {e}", dir.display()))
}

/// A fresh, empty directory under `CARGO_TARGET_TMPDIR`, removed when dropped.
pub fn scratch_dir() -> tempfile::TempDir {
    let base = Path::new(env!("CARGO_TARGET_TMPDIR"));
    std::fs::create_dir_all(base).expect("creating CARGO_TARGET_TMPDIR");
    tempfile::Builder::new()
        .prefix("scratch-")
        .tempdir_in(base)
        .expect("creating a scratch directory")
}

/// Identifies what `write_checkpoint` would produce: the generator's source, config and options.
fn stamp_of(cfg: &Config, opts: &SynthOptions) -> u64 {
    let tokenizer = opts.tokenizer.as_ref().map(|p| {
        let len = std::fs::metadata(p).map(|m| m.len()).unwrap_or(0);
        format!("{}:{len}", p.display())
    });
    let text = format!(
        "{}\n{}\n{} {:?} {:?}",
        include_str!("../../src/hf/synth.rs"),
        serde_json::to_string(cfg).expect("serialising the config"),
        opts.seed,
        opts.key_style,
        tokenizer,
    );
    fnv1a(text.bytes())
}

/// 64-bit FNV-1a of `bytes`: a stable fingerprint (not a checksum against tampering).
pub fn fnv1a(bytes: impl IntoIterator<Item = u8>) -> u64 {
    bytes.into_iter().fold(0xCBF2_9CE4_8422_2325u64, |h, b| {
        (h ^ b as u64).wrapping_mul(0x0100_0000_01B3)
    })
}

/// Writes `bytes` to `path` through a temporary file in the same directory renamed into place
/// (`tempfile`), so a reader sees the old file or the whole new one.
pub fn write_atomic(path: &Path, bytes: &[u8]) {
    use std::io::Write;
    let dir = path.parent().expect("a file path");
    let mut tmp = tempfile::NamedTempFile::new_in(dir).expect("creating a temporary file");
    tmp.write_all(bytes).expect("writing a temporary file");
    tmp.persist(path)
        .unwrap_or_else(|e| panic!("renaming into {}: {e}", path.display()));
}

/// Greedy tokens of `m` from its current position: `prompt` fed with `next_token`, then `n`
/// tokens, each the argmax fed back (the last one is not fed).
pub fn greedy_tokens(m: &mut Model, prompt: &[u32], n: usize) -> Vec<u32> {
    let mut next = 0;
    for &t in prompt {
        next = m.next_token(t).unwrap();
    }
    let mut out = vec![next];
    while out.len() < n {
        next = m.next_token(next).unwrap();
        out.push(next);
    }
    out
}

/// Runs `cmd` and returns its stdout; fails the test with its stdout and stderr if it failed.
pub fn run(cmd: &mut std::process::Command) -> String {
    let out = cmd.output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{cmd:?} failed ({}):\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// A [`Filter`](qwen_bpf::filter::Filter) for `rule` over the model in `dir`, opened as the
/// kernel filter needs it: the rule's context and slots, the tokenizer loaded.
pub fn filter(
    dir: &Path,
    tok: &qwen_bpf::Tokenizer,
    rule: qwen_bpf::filter::FilterRule,
) -> qwen_bpf::filter::Filter {
    let ctx = rule.compile(tok).unwrap().context_needed();
    let opts = ModelOptions::default()
        .with_max_context(ctx)
        .with_event_slots(rule.slots as usize);
    let mut model = open(dir, opts);
    model.load_tokenizer(tok).unwrap();
    qwen_bpf::filter::Filter::new(model, tok, rule).unwrap()
}

/// Whether scripts/known-refusals.txt lists `program` as refused on memory layer `layer` by the
/// running kernel's verifier (measured; docs/kernels.md says why).
pub fn known_refused(layer: &str, program: &str) -> bool {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let known = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/scripts/known-refusals.txt"
    ))
    .expect("scripts/known-refusals.txt");
    known
        .lines()
        .filter(|l| !l.trim_start().starts_with('#'))
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .any(|f| {
            f.len() == 3
                && f[1] == layer
                && f[2] == program
                && (release.starts_with(&format!("{}.", f[0]))
                    || release.starts_with(&format!("{}-", f[0])))
        })
}
