//! The f32 reference against an independent implementation: candle-transformers' `qwen3` model,
//! fed the same synthetic checkpoint one token at a time (candle with its own KV cache through its
//! `offset` argument), compared over the full vocabulary at every position. (In this crate so that
//! the `qwen_bpf` package itself never compiles candle.)

#[path = "../../tests/common/mod.rs"]
mod common;

use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor};
use candle_nn::VarBuilder;
use candle_transformers::models::qwen3;
use common::spread_tokens as tokens;
use qwen_bpf::hf::synth::{KeyStyle, Preset, SynthOptions};
use qwen_bpf::verify::reference::Reference;
use qwen_bpf::{Checkpoint, Config};

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

/// The full Qwen3-0.6B shape against candle (not run by default; ~5 GB of RAM), on
/// [`common::full_size_model_dir`]. Prints the largest difference; asserts 1e-3 (28 layers).
#[test]
#[ignore = "needs a full-size checkpoint in $QWEN_BPF_BENCH_MODEL (default /tmp/q06)"]
fn full_shape_matches_candle() {
    let dir = common::full_size_model_dir();
    compare_with_candle(&dir, "qwen3-0.6b shape", 1e-3);
}
