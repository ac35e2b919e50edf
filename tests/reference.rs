//! The f32 reference against an independent implementation: candle-transformers' `qwen3` model,
//! fed the same synthetic checkpoint one token at a time (candle with its own KV cache through its
//! `offset` argument), compared over the full vocabulary at every position.

mod common;

use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor};
use candle_nn::VarBuilder;
use candle_transformers::models::qwen3;
use qwen_bpf::synth::{self, KeyStyle, Preset, SynthOptions};
use qwen_bpf::Reference;
use qwen_bpf::{Checkpoint, Config, Error};

/// Largest |reference − candle| allowed on any logit.
const TOLERANCE: f32 = 1e-4;

/// Positions compared per checkpoint.
const SEQ_LEN: usize = 16;

/// Tag of the shared `tiny` checkpoint (tied, seed 0).
const TINY: &str = "reference-tiny";

/// A synthetic checkpoint for `cfg` (written once, then reused; see `tests/common`).
fn synth_model(tag: &str, cfg: &Config, seed: u64, key_style: KeyStyle) -> PathBuf {
    let opts = SynthOptions {
        seed,
        key_style,
        ..SynthOptions::default()
    };
    common::model_with(tag, cfg, &opts)
}

/// A deterministic 16-token sequence spread over the vocabulary: both ends, a repeat (identical
/// keys at two positions), and ids from a multiplicative hash.
fn tokens(vocab: usize) -> Vec<u32> {
    let mut t: Vec<u32> = (0..SEQ_LEN as u64)
        .map(|i| ((i.wrapping_mul(2_654_435_761).wrapping_add(12_345)) % vocab as u64) as u32)
        .collect();
    t[0] = 0;
    t[5] = vocab as u32 - 1;
    t[9] = t[3];
    t
}

/// candle's `qwen3::Config` from the same `config.json`. candle requires keys our files may lack
/// (`max_window_layers` always, `rope_theta` under transformers-5 keys, `head_dim` when implied),
/// so those are filled in from our parsed [`Config`] before deserialising.
fn candle_config(dir: &Path, ours: &Config) -> qwen3::Config {
    let text = std::fs::read_to_string(dir.join("config.json")).expect("read config.json");
    let mut v: serde_json::Value = serde_json::from_str(&text).expect("config.json is JSON");
    let obj = v.as_object_mut().expect("config.json is an object");
    obj.entry("max_window_layers")
        .or_insert(ours.num_hidden_layers.into());
    obj.entry("head_dim").or_insert(ours.head_dim().into());
    obj.entry("sliding_window")
        .or_insert(serde_json::Value::Null);
    if !obj.get("rope_theta").is_some_and(|t| t.is_number()) {
        obj.insert("rope_theta".into(), ours.rope_theta().into());
    }
    serde_json::from_value(v).expect("candle qwen3::Config from config.json")
}

/// candle's Qwen3 with the checkpoint's weights loaded as f32.
fn candle_model(dir: &Path, ours: &Config) -> qwen3::ModelForCausalLM {
    let cfg = candle_config(dir, ours);
    let weights: Vec<PathBuf> = vec![dir.join("model.safetensors")];
    // SAFETY: the file is not modified while mapped (it lives in this test's temporary directory).
    let vb = unsafe { VarBuilder::from_mmaped_safetensors(&weights, DType::F32, &Device::Cpu) }
        .expect("candle VarBuilder");
    qwen3::ModelForCausalLM::new(&cfg, vb).expect("candle qwen3 model")
}

/// One token through candle at `offset`: logits `[vocab]`.
fn candle_step(model: &mut qwen3::ModelForCausalLM, token: u32, offset: usize) -> Vec<f32> {
    let input = Tensor::new(&[[token]], &Device::Cpu).expect("input tensor");
    let logits = model.forward(&input, offset).expect("candle forward");
    logits
        .flatten_all()
        .and_then(|t| t.to_vec1::<f32>())
        .expect("candle logits")
}

fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len(), "logit vectors differ in length");
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// Feeds [`tokens`] through the reference and candle and asserts every logit agrees within
/// `tolerance` at every position. Returns the largest difference seen.
fn compare_with_candle(dir: &Path, label: &str, tolerance: f32) -> f32 {
    let ck = Checkpoint::open(dir).expect("open checkpoint");
    let vocab = ck.config.vocab_size;
    let mut reference = Reference::new(&ck, SEQ_LEN).expect("load reference");
    let mut candle = candle_model(dir, &ck.config);
    let mut worst = 0.0f32;
    let mut logit_range = 0.0f32;
    for (pos, &tok) in tokens(vocab).iter().enumerate() {
        assert_eq!(reference.position(), pos);
        let ours = reference.forward(tok).expect("reference forward");
        let theirs = candle_step(&mut candle, tok, pos);
        assert_eq!(ours.len(), vocab);
        assert!(
            ours.iter().all(|v| v.is_finite()),
            "{label}: non-finite logit at position {pos}"
        );
        let d = max_abs_diff(&ours, &theirs);
        assert!(
            d <= tolerance,
            "{label}: position {pos} (token {tok}): max |Δlogit| = {d:e} > {tolerance:e}"
        );
        worst = worst.max(d);
        logit_range = logit_range.max(ours.iter().fold(0.0f32, |m, v| m.max(v.abs())));
    }
    println!("{label}: max |Δlogit| over {SEQ_LEN} positions × {vocab} logits = {worst:e} (max |logit| {logit_range:.3})");
    worst
}

#[test]
fn tied_head_matches_candle() {
    let dir = common::tiny_model(TINY);
    let ck = Checkpoint::open(&dir).expect("open checkpoint");
    assert!(ck.config.tie_word_embeddings && !ck.has("lm_head.weight"));
    compare_with_candle(&dir, "tiny, tied", TOLERANCE);
}

#[test]
fn untied_head_matches_candle() {
    let mut cfg = Preset::Tiny.config();
    cfg.tie_word_embeddings = false;
    let dir = synth_model("reference-untied", &cfg, 7, KeyStyle::Transformers4);
    assert!(Checkpoint::open(&dir).unwrap().has("lm_head.weight"));
    compare_with_candle(&dir, "tiny, untied", TOLERANCE);
}

#[test]
fn transformers5_keys_match_candle() {
    let dir = synth_model(
        "reference-t5",
        &Preset::Tiny.config(),
        3,
        KeyStyle::Transformers5,
    );
    compare_with_candle(&dir, "tiny, transformers-5 keys", TOLERANCE);
}

/// A shape unlike the presets: q_dim (4 × 32 = 128) ≠ hidden (64), GQA ratio 4, 3 layers, a small
/// vocabulary, another RoPE base, untied.
#[test]
fn wide_heads_and_gqa4_match_candle() {
    let mut cfg = Preset::Tiny.config();
    cfg.vocab_size = 1_000;
    cfg.num_hidden_layers = 3;
    cfg.num_attention_heads = 4;
    cfg.num_key_value_heads = 1;
    cfg.head_dim = Some(32);
    cfg.rope_theta = Some(10_000.0);
    cfg.tie_word_embeddings = false;
    let dir = synth_model("reference-hd32-gqa4", &cfg, 11, KeyStyle::Transformers4);
    compare_with_candle(&dir, "hd 32, gqa 4, untied", TOLERANCE);
}

#[test]
fn bad_tokens_and_context_overflow_are_errors() {
    let dir = common::tiny_model(TINY);
    let ck = Checkpoint::open(&dir).expect("open checkpoint");
    let vocab = ck.config.vocab_size;

    let err = Reference::new(&ck, 0).unwrap_err();
    assert!(matches!(err, Error::Invalid(_)), "max_context 0: {err}");

    let mut r = Reference::new(&ck, 3).expect("load reference");
    // Out of range at position 0, and again after two good tokens: nothing advances.
    let err = r.forward(vocab as u32).unwrap_err();
    assert!(
        matches!(err, Error::TokenOutOfRange { id, index: 0, vocab: v } if id == vocab as u32 && v == vocab),
        "{err}"
    );
    assert_eq!(r.position(), 0);
    r.forward(1).unwrap();
    r.forward(2).unwrap();
    let err = r.forward(u32::MAX).unwrap_err();
    assert!(
        matches!(err, Error::TokenOutOfRange { id: u32::MAX, index: 2, vocab: v } if v == vocab),
        "{err}"
    );
    assert_eq!(r.position(), 2);

    // The third token fills max_context 3; the fourth overflows, and keeps overflowing.
    r.forward(3).unwrap();
    assert_eq!(r.position(), 3);
    for _ in 0..2 {
        let err = r.forward(4).unwrap_err();
        assert!(
            matches!(
                err,
                Error::ContextOverflow {
                    pos: 3,
                    max_context: 3
                }
            ),
            "{err}"
        );
        assert_eq!(r.position(), 3);
    }
    r.reset();
    assert_eq!(r.position(), 0);
    r.forward(4).expect("reset frees the context");
}

#[test]
fn reset_reproduces_identical_logits() {
    let dir = common::tiny_model(TINY);
    let ck = Checkpoint::open(&dir).expect("open checkpoint");
    let seq = tokens(ck.config.vocab_size);
    let mut r = Reference::new(&ck, SEQ_LEN).expect("load reference");
    let first: Vec<Vec<f32>> = seq.iter().map(|&t| r.forward(t).unwrap()).collect();
    r.reset();
    assert_eq!(r.position(), 0);
    let second: Vec<Vec<f32>> = seq.iter().map(|&t| r.forward(t).unwrap()).collect();
    for (pos, (a, b)) in first.iter().zip(&second).enumerate() {
        assert!(a == b, "position {pos}: logits after reset differ");
    }
    // Different prefixes do give different logits, so the comparison above is not vacuous.
    assert_ne!(first[1], first[0]);
    // A fresh model agrees bit for bit too.
    let mut fresh = Reference::new(&ck, SEQ_LEN).expect("load reference");
    assert!(fresh.forward(seq[0]).unwrap() == first[0]);
}

#[test]
fn non_finite_weights_are_reported() {
    // Overwrite one bf16 value of model.norm.weight with NaN: loading must fail with NonFinite.
    let dir = common::scratch_dir();
    let opts = SynthOptions {
        seed: 5,
        ..SynthOptions::default()
    };
    synth::write_checkpoint(dir.path(), &Preset::Tiny.config(), &opts).expect("write checkpoint");
    let path = dir.path().join("model.safetensors");
    let bytes = std::fs::read(&path).unwrap();
    let header_len = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + header_len]).unwrap();
    let start = header["model.norm.weight"]["data_offsets"][0]
        .as_u64()
        .unwrap() as usize;
    let mut bytes = bytes;
    let at = 8 + header_len + start + 2 * 3; // element 3
    bytes[at..at + 2].copy_from_slice(&half::bf16::NAN.to_le_bytes());
    std::fs::write(&path, bytes).unwrap();
    let ck = Checkpoint::open(dir.path()).expect("shapes and dtypes are still valid");
    let err = Reference::new(&ck, 4).unwrap_err();
    assert!(
        matches!(&err, Error::NonFinite { name, index: 3, .. } if name == "model.norm.weight"),
        "{err}"
    );
}

/// Speed at the full Qwen3-0.6B shape (not run by default). Needs a checkpoint, e.g.
/// `cargo run --release --example synth -- --preset qwen3-0.6b --out /tmp/q06`, then
/// `QWEN_BPF_BENCH_MODEL=/tmp/q06 cargo test --release --test reference -- --ignored --nocapture`.
#[test]
#[ignore = "needs a full-size checkpoint in $QWEN_BPF_BENCH_MODEL (default /tmp/q06)"]
fn full_shape_ms_per_token() {
    let dir = std::env::var_os("QWEN_BPF_BENCH_MODEL")
        .map(PathBuf::from)
        .unwrap_or_else(|| "/tmp/q06".into());
    let ck = Checkpoint::open(&dir).expect("open the full-size checkpoint");
    let t0 = std::time::Instant::now();
    let mut r = Reference::new(&ck, 256).expect("load reference");
    println!(
        "{}: loaded {} parameters as f32 in {:.1} s",
        dir.display(),
        ck.config.num_parameters(),
        t0.elapsed().as_secs_f64()
    );
    let seq = tokens(ck.config.vocab_size);
    let max_threads = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    for threads in [1, max_threads] {
        r.set_threads(threads);
        r.reset();
        r.forward(seq[0]).unwrap(); // warm-up: page in the weights
        let n = 32;
        let t = std::time::Instant::now();
        for i in 0..n {
            std::hint::black_box(r.forward(seq[(i + 1) % seq.len()]).unwrap());
        }
        let ms = t.elapsed().as_secs_f64() * 1e3 / n as f64;
        println!("threads {threads}: {ms:.1} ms/token (positions 1..={n})");
    }
}

/// The full Qwen3-0.6B shape against candle (not run by default; ~5 GB of RAM). Same checkpoint
/// as [`full_shape_ms_per_token`]. Prints the largest difference; asserts 1e-3 (28 layers).
#[test]
#[ignore = "needs a full-size checkpoint in $QWEN_BPF_BENCH_MODEL (default /tmp/q06)"]
fn full_shape_matches_candle() {
    let dir = std::env::var_os("QWEN_BPF_BENCH_MODEL")
        .map(PathBuf::from)
        .unwrap_or_else(|| "/tmp/q06".into());
    compare_with_candle(&dir, "qwen3-0.6b shape", 1e-3);
}
