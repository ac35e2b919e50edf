//! The kernels' size limits and fixed-point ranges, end to end: the C and Rust tables agree; every
//! config `Config::validate` accepts either runs on every store within the accuracy the stores'
//! own tests promise, or is refused at open with `Error::Limit` naming the dimension; and an
//! activation spike past Q16's range is reported as a saturation, never hidden. These load real
//! BPF programs: they need root (or CAP_BPF + CAP_PERFMON).

mod common;

use std::path::Path;

use common::Rng;
use qwen_bpf::hf::synth::{self, Preset, SynthOptions};
use qwen_bpf::kernel::ops::Ops;
use qwen_bpf::num::limits;
use qwen_bpf::verify::reference::Reference;
use qwen_bpf::{Backend, Checkpoint, Config, Error, KvFormat, MemoryLayer, Model, ModelOptions};

/// The verifier's work per program, against its limit of 1,000,000 processed instructions: a
/// program near the limit on one kernel build is refused (E2BIG) on another whose verifier
/// prunes less (attention_i8 once passed on one 6.18 build and was refused on 6.18.44).
#[test]
fn every_program_verifies_well_within_the_verifier_limit() {
    // with the event path's programs too
    within_half_the_limit(&Ops::load_with(1 << 20, true).unwrap());
}

/// The same for the array memory layer's build (its run_plan verifies every operator's global
/// function: the sum of them).
#[test]
fn array_every_program_verifies_well_within_the_verifier_limit() {
    within_half_the_limit(&Ops::load_on(1 << 20, false, MemoryLayer::Array).unwrap());
}

fn within_half_the_limit(ops: &Ops) {
    let counts = ops.verified_instructions().unwrap();
    assert!(
        counts.iter().any(|(n, _)| n == "run_plan")
            && counts.iter().any(|(n, _)| n == "attention_i8"),
        "the object's programs include run_plan and attention_i8: {counts:?}"
    );
    for (name, n) in &counts {
        eprintln!("verified instructions: {name} {n}");
        assert!(
            *n > 0 && *n <= 500_000,
            "{name}: {n} instructions processed by the verifier, above half its 1,000,000 limit"
        );
    }
}

#[test]
fn limits_agree_between_limits_h_and_limits_rs() {
    let f = Ops::load(1 << 20).unwrap().formats().unwrap();
    assert_eq!(
        (
            f.cols_max as usize,
            f.q24_cols_align as usize,
            f.swar_cols_align as usize,
            f.w4_rows_align as usize,
            f.w8_rows_align as usize,
            f.norm_max as usize,
            f.head_dim_max as usize,
            f.batch_max as usize,
            f.vocab_max as usize,
            f.sample_buckets as usize,
            [
                f.sample_temp_min,
                f.sample_temp_max,
                f.sample_rep_min,
                f.sample_rep_max
            ],
            f.sample_pen_max,
        ),
        (
            limits::COLS_MAX,
            limits::Q24_COLS_ALIGN,
            limits::SWAR_COLS_ALIGN,
            limits::W4_ROWS_ALIGN,
            limits::W8_ROWS_ALIGN,
            limits::NORM_MAX,
            limits::HEAD_DIM_MAX,
            limits::BATCH_MAX,
            limits::VOCAB_MAX,
            limits::SAMPLE_BUCKETS,
            [
                limits::SAMPLE_TEMP_MIN,
                limits::SAMPLE_TEMP_MAX,
                limits::SAMPLE_REP_MIN,
                limits::SAMPLE_REP_MAX,
            ],
            limits::SAMPLE_PEN_MAX,
        ),
        "src/bpf/limits.h vs src/num/limits.rs"
    );
    assert_eq!(
        [
            f.tok_text_max,
            f.tok_ids_max,
            f.tok_cp_max,
            f.tok_word_max,
            f.tok_marks_max,
            f.tok_added_max,
            f.tok_added_len,
        ]
        .map(|v| v as usize),
        [
            limits::TOK_TEXT_MAX,
            limits::TOK_IDS_MAX,
            limits::TOK_CP_MAX,
            limits::TOK_WORD_MAX,
            limits::TOK_MARKS_MAX,
            limits::TOK_ADDED_MAX,
            limits::TOK_ADDED_LEN,
        ],
        "the tokenizer's limits: src/bpf/limits.h vs src/num/limits.rs"
    );
    assert_eq!(
        [
            f.filter_bytes_max,
            f.filter_labels_max,
            f.filter_label_tokens_max,
            f.filter_ports_max,
            f.filter_sources_max,
        ]
        .map(|v| v as usize),
        [
            limits::FILTER_BYTES_MAX,
            limits::FILTER_LABELS_MAX,
            limits::FILTER_LABEL_TOKENS_MAX,
            limits::FILTER_PORTS_MAX,
            limits::FILTER_SOURCES_MAX,
        ],
        "the filter's limits: src/bpf/limits.h vs src/num/limits.rs"
    );
    // The twins' own bounds are the same table (kv8.inc.c's is checked by a _Static_assert).
    assert_eq!(qwen_bpf::num::swar::K_MAX, limits::COLS_MAX);
    assert_eq!(qwen_bpf::num::swar::GROUP, limits::SWAR_COLS_ALIGN);
    assert_eq!(qwen_bpf::num::kv8::HD_MAX, limits::HEAD_DIM_MAX);
}

#[test]
fn q24_matvec_refuses_columns_past_the_limit_instead_of_truncating() {
    let mut o = Ops::load(4 << 20).unwrap();
    let k = limits::COLS_MAX + 8;
    let w = o.arena.alloc(k * 4, "w").unwrap();
    let x = o.arena.alloc(k * 4, "x").unwrap();
    let y = o.arena.alloc(4096, "y").unwrap();
    assert!(matches!(
        o.matvec(w, x, y, k, 0..1, false),
        Err(Error::Bpf { .. })
    ));
    assert!(matches!(
        o.lm_head_argmax(w, x, Some(y), k, 0..1),
        Err(Error::Bpf { .. })
    ));
    o.matvec(w, x, y, limits::COLS_MAX, 0..1, false).unwrap();
}

const TOKENS: [u32; 4] = [3, 17, 60, 5];

/// Mean and max |Δlogit| of two logit vectors.
fn error(got: &[f32], want: &[f32]) -> (f64, f32) {
    let d = got.iter().zip(want).map(|(a, b)| (a - b).abs());
    let sum: f64 = d.clone().map(|v| v as f64).sum();
    (sum / got.len() as f64, d.fold(0f32, f32::max))
}

/// The accuracy each store promises against the f32 reference (tests/model.rs, tests/stores.rs):
/// (largest mean |Δlogit| over the tokens, largest single |Δlogit|).
fn bound(b: Backend) -> (f64, f32) {
    match b {
        Backend::Q24 | Backend::Arena => (4e-4, 4e-3),
        Backend::Int8 => (0.03, f32::INFINITY),
        Backend::Int4 => (0.3, f32::INFINITY),
        other => panic!("no accuracy bound for the {} store", other.name()),
    }
}

fn opts(b: Backend, cache: &Path) -> ModelOptions {
    ModelOptions {
        backend: b,
        max_context: 8,
        cache_dir: Some(cache.to_path_buf()),
        threads: 1,
        ..Default::default()
    }
}

/// A random config `validate` accepts: small widths, and with some probability a dimension just
/// past a kernel limit (matrix width, a q_dim the SWAR groups do not divide, a vocabulary the
/// 8-bit LM head's row blocks do not divide).
fn random_config(rng: &mut Rng) -> Config {
    let mut c = Preset::Tiny.config();
    let pick = |rng: &mut Rng, v: &[usize]| v[(rng.next() % v.len() as u64) as usize];
    c.num_hidden_layers = pick(rng, &[1, 2]);
    c.hidden_size = pick(rng, &[32, 64, 96]);
    c.intermediate_size = pick(rng, &[32, 64, 160]);
    c.num_key_value_heads = pick(rng, &[1, 2]);
    c.num_attention_heads = c.num_key_value_heads * pick(rng, &[1, 2, 3]);
    c.head_dim = Some(pick(rng, &[16, 32, 48]));
    c.vocab_size = pick(rng, &[96, 200, 256, 301]);
    c.tie_word_embeddings = rng.next() % 2 == 0;
    match rng.next() % 6 {
        0 => c.intermediate_size = limits::COLS_MAX + 32,
        1 => {
            c.num_attention_heads = 33;
            c.num_key_value_heads = pick(rng, &[1, 3]);
            c.head_dim = Some(limits::HEAD_DIM_MAX);
        }
        _ => {}
    }
    c
}

#[test]
fn every_valid_config_runs_within_bounds_or_is_refused_with_a_typed_limit() {
    let mut rng = Rng(0x11_1e_4a_75);
    let (mut ran, mut refused) = (0, 0);
    let mut refused_dims = std::collections::BTreeSet::new();
    for case in 0..10 {
        let cfg = random_config(&mut rng);
        cfg.validate(Path::new("config.json"))
            .unwrap_or_else(|e| panic!("case {case}: the generator made an invalid config: {e}"));
        let dir = common::scratch_dir();
        let synth = SynthOptions {
            seed: case,
            ..Default::default()
        };
        synth::write_checkpoint(dir.path(), &cfg, &synth).unwrap();
        let mut reference: Option<Reference> = None;
        let mut q24_logits = Vec::new();
        for b in Backend::ALL {
            let shape = format!(
                "case {case} {} (hidden {}, intermediate {}, heads {}/{}×{}, vocab {})",
                b.name(),
                cfg.hidden_size,
                cfg.intermediate_size,
                cfg.num_attention_heads,
                cfg.num_key_value_heads,
                cfg.head_dim(),
                cfg.vocab_size
            );
            let expected = limits::check(&cfg, b, KvFormat::Q16);
            let mut m = match Model::open(dir.path(), &opts(b, dir.path())) {
                Ok(m) => m,
                Err(Error::Limit { what, value, limit }) => {
                    assert!(
                        matches!(&expected, Err(Error::Limit { what: w, .. }) if *w == what),
                        "{shape}: refused {what} = {value} ({limit}) but limits::check says {expected:?}"
                    );
                    refused += 1;
                    refused_dims.insert(what);
                    continue;
                }
                Err(e) => panic!("{shape}: neither runs nor a typed limit: {e}"),
            };
            assert!(expected.is_ok(), "{shape}: opened despite {expected:?}");
            let r = reference.get_or_insert_with(|| {
                Reference::new(&Checkpoint::open(dir.path()).unwrap(), 8).unwrap()
            });
            r.reset();
            let (mut mean, mut max) = (0f64, 0f32);
            let mut logits = Vec::new();
            for &t in &TOKENS {
                let got = m.forward(t).unwrap().to_vec();
                let (a, b) = error(&got, &r.forward(t).unwrap());
                mean += a / TOKENS.len() as f64;
                max = max.max(b);
                logits.push(got);
            }
            let (bm, bx) = bound(b);
            eprintln!("{shape}: mean |Δlogit| {mean:.2e}, max {max:.2e}");
            assert!(
                mean <= bm && max <= bx,
                "{shape}: mean |Δlogit| {mean} (bound {bm}), max {max} (bound {bx})"
            );
            assert_eq!(m.saturations(), 0, "{shape}: no value leaves its format");
            match b {
                Backend::Q24 => q24_logits = logits,
                Backend::Arena => assert_eq!(logits, q24_logits, "{shape}: arena equals q24"),
                _ => {}
            }
            ran += 1;
        }
    }
    eprintln!("{ran} store runs, {refused} refusals: {refused_dims:?}");
    assert!(
        ran >= 12 && refused >= 6 && refused_dims.len() >= 2,
        "the cases cross limits and run: {ran} runs, {refused} refusals of {refused_dims:?}"
    );
}

/// Sets row `row` of the BF16 tensor `name` in `dir/model.safetensors` to `values`.
fn patch_row(dir: &Path, name: &str, row: usize, values: &[f32]) {
    let path = dir.join("model.safetensors");
    let mut bytes = std::fs::read(&path).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    let t = &header[name];
    assert_eq!(t["dtype"], "BF16", "{name}");
    let cols = t["shape"][1].as_u64().unwrap() as usize;
    assert_eq!(cols, values.len(), "{name}: row width");
    let start = 8 + n + t["data_offsets"][0].as_u64().unwrap() as usize + row * cols * 2;
    for (j, v) in values.iter().enumerate() {
        let b = half::bf16::from_f32(*v).to_le_bytes();
        bytes[start + 2 * j..start + 2 * j + 2].copy_from_slice(&b);
    }
    std::fs::write(&path, bytes).unwrap();
}

#[test]
fn an_activation_spike_past_q16_is_accurate_or_reported() {
    let mut cfg = Preset::Tiny.config();
    cfg.vocab_size = 256;
    let dir = common::scratch_dir();
    synth::write_checkpoint(dir.path(), &cfg, &SynthOptions::default()).unwrap();
    // One MLP channel of layer 0 with gate row = up row = 28 × random signs: where its input
    // lines up (|g| ~ 28 × sqrt(64) ≈ 220 and more), silu(g) × g, the down_proj input, is a
    // "massive activation" of ~5e4, past Q16's ±32768.
    let mut rng = Rng(5);
    let row: Vec<f32> = (0..cfg.hidden_size)
        .map(|_| if rng.next() % 2 == 0 { 28.0 } else { -28.0 })
        .collect();
    for proj in ["gate_proj", "up_proj"] {
        patch_row(
            dir.path(),
            &format!("model.layers.0.mlp.{proj}.weight"),
            7,
            &row,
        );
    }
    let mut m = Model::open(dir.path(), &opts(Backend::Q24, dir.path())).unwrap();
    let mut r = Reference::new(&Checkpoint::open(dir.path()).unwrap(), 8).unwrap();
    let (bm, bx) = bound(Backend::Q24);
    for (i, t) in [3u32, 17, 60, 5, 99, 128, 200, 31].into_iter().enumerate() {
        let (mean, max) = error(&m.forward(t).unwrap(), &r.forward(t).unwrap());
        let sat = m.saturations();
        eprintln!("position {i}: mean |Δlogit| {mean:.2e}, max {max:.2e}, saturations {sat}");
        assert!(
            sat > 0 || (mean <= bm && max <= bx),
            "position {i}: logits off by mean {mean}, max {max} with no saturation reported"
        );
    }
    assert!(
        m.saturations() > 0,
        "the spike left Q16's range at some position (else this test proves nothing)"
    );
}
