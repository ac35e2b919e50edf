//! Synthetic Hugging Face checkpoints with trained-like statistics, deterministic from a seed.
//!
//! [`write_checkpoint`] writes `config.json`, a BF16 `model.safetensors` holding exactly the
//! tensors of [`tensor_specs`], and optionally a copy of a `tokenizer.json`, so every part of the
//! engine can be exercised without downloading weights.
//! Two [`Preset`]s exist: `tiny` (2 layers, hidden 64, the real 151,936-token vocabulary so the
//! real tokenizer works) and `qwen3-0.6b` (the exact Qwen3-0.6B shapes, 596,049,920 parameters).
//!
//! # Statistics
//!
//! Plain `N(0, 0.02)` weights would hide fixed-point overflow bugs, so the values imitate what a
//! trained Qwen3 holds. `z` below is a cheap standard-normal approximation (Irwin–Hall sum of three
//! uniforms, |z| ≤ 3); every value is rounded to BF16.
//!
//! | tensor | values |
//! |---|---|
//! | `q/k/v/o_proj`, `gate/up/down_proj` | `σ·r·z`, with σ = clamp(1/√fan_in, 0.018, 0.035) × a per-tensor factor (q/k 1.0–1.5, v 0.8–1.1, o 0.8–1.2, gate/up 0.9–1.3, down 0.8–1.2), so σ ≈ 0.014–0.05; `r` ∈ [0.75, 1.25] per output row |
//! | `embed_tokens`, `lm_head` | `σ·r·z` with σ ≈ 0.03 (±10 % per tensor), `r` ∈ [0.5, 1.5] per row |
//! | outliers (all of the above) | about 1 element in 8,000 replaced by ±(0.1 … 0.5), denser near 0.1 |
//! | `input_layernorm`, `post_attention_layernorm`, `model.norm` | per-tensor centre (0.9–2.2) × (1 + 0.12·z), clamped to [0.8, 2.5]; max(1, n/256) channels set to 8–20 |
//! | `q_norm` | 1 + 0.12·z clamped to [0.6, 1.6]; on max(1, head_dim/64) RoPE pairs 0.1–0.3 |
//! | `k_norm` | 1 + 0.12·z clamped to [0.6, 1.6]; on exactly the channels where `q_norm` is small, 60–90 |
//!
//! The special `q_norm`/`k_norm` channels come in RoPE pairs `(j, j + head_dim/2)` with `j` in the
//! low-frequency quarter `[head_dim/4, head_dim/2)`, as in the published Qwen3 weights. Hence every
//! linear and embedding weight has |w| < 1 and every norm weight is below 128 (at most 90).
//!
//! # Determinism and speed
//!
//! Every tensor is generated from its own sub-seed (the seed mixed with a hash of its name) and
//! every row of a matrix from a sub-seed of that, so the bytes depend only on the seed and the
//! config, never on the thread count or the order tensors are written in. Tensors are generated
//! lazily while `safetensors` writes them, so only one tensor (at most the 311 MB embedding of the
//! 0.6B preset) is held in memory at a time; rows are split across the available cores.
//!
//! # Crash safety
//!
//! Each file is written to a temporary name in the target directory and renamed into place,
//! `model.safetensors` first and `config.json` last: an interrupted write never leaves a file
//! that looks complete, and a directory without `config.json` is not a checkpoint.

use std::borrow::Cow;
use std::path::{Path, PathBuf};

use half::bf16;
use indicatif::{ProgressBar, ProgressStyle};
use safetensors::{Dtype, SafeTensorError, View};

use crate::hf::checkpoint::tensor_specs;
use crate::hf::config::RopeParameters;
use crate::{Config, Error, Result};

/// A model shape the generator knows by name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Preset {
    /// 2 layers, hidden 64, intermediate 192, 4 query / 2 key-value heads of width 16, the full
    /// 151,936-token vocabulary, tied embeddings.
    Tiny,
    /// The exact Qwen3-0.6B shapes: 28 layers, hidden 1,024, intermediate 3,072, 16 / 8 heads of
    /// width 128, vocabulary 151,936, tied embeddings (596,049,920 parameters).
    Qwen3_0_6B,
}

impl Preset {
    /// Every preset, in size order.
    pub const ALL: [Preset; 2] = [Preset::Tiny, Preset::Qwen3_0_6B];

    /// The full, valid config (transformers-4 key style: `rope_theta`, `torch_dtype`).
    pub fn config(self) -> Config {
        let (layers, hidden, intermediate, heads, kv_heads, head_dim) = match self {
            Preset::Tiny => (2, 64, 192, 4, 2, 16),
            Preset::Qwen3_0_6B => (28, 1024, 3072, 16, 8, 128),
        };
        Config {
            vocab_size: 151_936,
            hidden_size: hidden,
            intermediate_size: intermediate,
            num_hidden_layers: layers,
            num_attention_heads: heads,
            num_key_value_heads: kv_heads,
            head_dim: Some(head_dim),
            max_position_embeddings: 40_960,
            rms_norm_eps: 1e-6,
            rope_theta: Some(1e6),
            rope_parameters: None,
            rope_scaling: None,
            tie_word_embeddings: true,
            attention_bias: false,
            use_sliding_window: false,
            hidden_act: "silu".into(),
            torch_dtype: Some("bfloat16".into()),
            dtype: None,
            bos_token_id: Some(151_643),
            eos_token_id: Some(151_645),
            architectures: vec!["Qwen3ForCausalLM".into()],
            model_type: Some("qwen3".into()),
        }
    }

    /// The command-line name: `"tiny"` or `"qwen3-0.6b"`.
    pub fn name(self) -> &'static str {
        match self {
            Preset::Tiny => "tiny",
            Preset::Qwen3_0_6B => "qwen3-0.6b",
        }
    }

    /// The preset called `s` (as returned by [`Preset::name`]; ASCII case is ignored).
    pub fn from_name(s: &str) -> Option<Preset> {
        Preset::ALL
            .into_iter()
            .find(|p| p.name().eq_ignore_ascii_case(s))
    }
}

/// Which `config.json` key style to write.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum KeyStyle {
    /// transformers 4.x, as in the published Qwen3: top-level `rope_theta` and `torch_dtype`.
    #[default]
    Transformers4,
    /// transformers 5: `rope_parameters: {rope_theta, rope_type: "default"}` and `dtype`.
    Transformers5,
}

/// How [`write_checkpoint`] generates and writes.
#[derive(Debug, Clone, Default)]
pub struct SynthOptions {
    /// Seed of every weight; the same seed and config give byte-identical files.
    pub seed: u64,
    /// The `config.json` key style.
    pub key_style: KeyStyle,
    /// A `tokenizer.json` to copy into the checkpoint as `tokenizer.json`.
    pub tokenizer: Option<PathBuf>,
    /// Show a progress bar on stderr.
    pub progress: bool,
}

/// Writes a synthetic checkpoint for `cfg` into `dir` (created if missing): `model.safetensors`
/// (BF16, exactly the tensors of [`tensor_specs`]), `tokenizer.json` if
/// [`SynthOptions::tokenizer`] is set, and `config.json`.
///
/// `config.json` is `cfg` serialised in the chosen [`KeyStyle`]: the RoPE base and the dtype are
/// moved to that style's keys and the dtype is always `"bfloat16"`, so [`Config::from_file`]
/// reads back `cfg` up to those two keys. Files are replaced atomically (see the module docs).
pub fn write_checkpoint(dir: &Path, cfg: &Config, opts: &SynthOptions) -> Result<()> {
    let config_path = dir.join("config.json");
    let cfg = styled_config(cfg, opts.key_style);
    cfg.validate(&config_path)?;
    // Read the tokenizer first: a bad path should fail before seconds of generation.
    let tokenizer = match &opts.tokenizer {
        Some(tok) => Some(std::fs::read(tok).map_err(|e| Error::io(tok, e))?),
        None => None,
    };
    std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;

    let specs = tensor_specs(&cfg);
    let total_bytes: u64 = specs
        .iter()
        .map(|(_, s)| 2 * s.iter().product::<usize>() as u64)
        .sum();
    let bar = opts.progress.then(|| {
        let style = ProgressStyle::with_template(
            "{msg} [{bar:40}] {bytes}/{total_bytes} {bytes_per_sec} ETA {eta}",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .progress_chars("=> ");
        let bar = ProgressBar::new(total_bytes).with_style(style);
        bar.set_message(format!("model.safetensors ({} tensors)", specs.len()));
        bar
    });
    let threads = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
        .min(8);
    let tensors: Vec<(String, LazyTensor<'_>)> = specs
        .into_iter()
        .map(|(name, shape)| {
            let t = LazyTensor {
                seed: sub_seed(opts.seed, fnv1a(name.as_bytes())),
                name: name.clone(),
                shape,
                qk_seed: opts.seed,
                threads,
                bar: bar.as_ref(),
            };
            (name, t)
        })
        .collect();
    let model_path = dir.join("model.safetensors");
    safetensors::serialize_to_file(tensors, None, &model_path).map_err(|e| match e {
        SafeTensorError::IoError(source) => Error::Io {
            path: model_path.clone(),
            source,
        },
        other => Error::Safetensors {
            path: model_path.clone(),
            msg: other.to_string(),
        },
    })?;

    if let Some(bytes) = tokenizer {
        write_atomic(&dir.join("tokenizer.json"), &bytes)?;
    }
    let json = serde_json::to_string_pretty(&cfg).map_err(|e| Error::Config {
        path: config_path.clone(),
        msg: e.to_string(),
    })?;
    write_atomic(&config_path, format!("{json}\n").as_bytes())?;
    if let Some(bar) = bar {
        bar.finish_with_message(format!("wrote {}", dir.display()));
    }
    Ok(())
}

/// `cfg` with the RoPE base and dtype under the keys of `style`, dtype `"bfloat16"`.
fn styled_config(cfg: &Config, style: KeyStyle) -> Config {
    let mut c = cfg.clone();
    let theta = cfg.rope_theta();
    match style {
        KeyStyle::Transformers4 => {
            c.rope_theta = Some(theta);
            c.rope_parameters = None;
            c.torch_dtype = Some("bfloat16".into());
            c.dtype = None;
        }
        KeyStyle::Transformers5 => {
            c.rope_theta = None;
            c.rope_parameters = Some(RopeParameters {
                rope_theta: theta,
                rope_type: "default".into(),
            });
            c.torch_dtype = None;
            c.dtype = Some("bfloat16".into());
        }
    }
    c
}

/// Writes `bytes` to a temporary file beside `path` (`tempfile`, mode 0644, deleted on failure),
/// then renames it over `path`: a reader sees the old file or the whole new one.
pub(crate) fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    use std::io::Write;
    use std::os::unix::fs::PermissionsExt;
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let mut tmp = tempfile::Builder::new()
        .prefix(".tmp-")
        .permissions(std::fs::Permissions::from_mode(0o644))
        .tempfile_in(dir)
        .map_err(|e| Error::io(dir, e))?;
    tmp.write_all(bytes).map_err(|e| Error::io(tmp.path(), e))?;
    tmp.persist(path).map_err(|e| Error::io(path, e.error))?;
    Ok(())
}

/// A tensor whose BF16 bytes are generated when `safetensors` asks for them.
struct LazyTensor<'a> {
    name: String,
    shape: Vec<usize>,
    /// Seed of this tensor.
    seed: u64,
    /// The user's seed, from which the shared per-layer q_norm/k_norm layout is derived.
    qk_seed: u64,
    threads: usize,
    bar: Option<&'a ProgressBar>,
}

impl View for LazyTensor<'_> {
    fn dtype(&self) -> Dtype {
        Dtype::BF16
    }
    fn shape(&self) -> &[usize] {
        &self.shape
    }
    fn data(&self) -> Cow<'_, [u8]> {
        Cow::Owned(generate_bf16(
            &self.name,
            &self.shape,
            self.seed,
            self.qk_seed,
            self.threads,
            self.bar,
        ))
    }
    fn data_len(&self) -> usize {
        2 * self.shape.iter().product::<usize>()
    }
}

/// What a tensor is, from its Hugging Face name.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Kind {
    /// A linear layer (`[out, in]`), with its per-tensor σ-factor range.
    Linear(f32, f32),
    /// `embed_tokens` or `lm_head`.
    Embedding,
    /// `input_layernorm`, `post_attention_layernorm` or `model.norm`, with its centre range.
    HiddenNorm(f32, f32),
    /// `q_norm` (false) or `k_norm` (true).
    QkNorm(bool),
}

fn kind_of(name: &str) -> Kind {
    let has = |s: &str| name.contains(s);
    if has("embed_tokens") || has("lm_head") {
        Kind::Embedding
    } else if has("q_norm") {
        Kind::QkNorm(false)
    } else if has("k_norm") {
        Kind::QkNorm(true)
    } else if has("input_layernorm") {
        Kind::HiddenNorm(0.9, 1.6)
    } else if has("post_attention_layernorm") {
        Kind::HiddenNorm(1.0, 2.0)
    } else if has("norm") {
        Kind::HiddenNorm(1.2, 2.2)
    } else if has("q_proj") || has("k_proj") {
        Kind::Linear(1.0, 1.5)
    } else if has("v_proj") {
        Kind::Linear(0.8, 1.1)
    } else if has("gate_proj") || has("up_proj") {
        Kind::Linear(0.9, 1.3)
    } else {
        // o_proj, down_proj and anything unforeseen.
        Kind::Linear(0.8, 1.2)
    }
}

/// The BF16 little-endian bytes of tensor `name`.
fn generate_bf16(
    name: &str,
    shape: &[usize],
    seed: u64,
    qk_seed: u64,
    threads: usize,
    bar: Option<&ProgressBar>,
) -> Vec<u8> {
    let n: usize = shape.iter().product();
    let mut out = vec![0u8; 2 * n];
    match kind_of(name) {
        Kind::HiddenNorm(lo, hi) => put_bf16(&mut out, &hidden_norm(seed, n, lo, hi)),
        Kind::QkNorm(is_k) => {
            let (q, k) = qk_norms(sub_seed(qk_seed, fnv1a(layer_prefix(name).as_bytes())), n);
            put_bf16(&mut out, if is_k { &k } else { &q });
        }
        kind => {
            let cols = if shape.len() >= 2 {
                shape[1..].iter().product()
            } else {
                n
            };
            let mut rng = Rng(seed);
            let (sigma, row_lo, row_hi) = match kind {
                Kind::Embedding => (0.03 * rng.range(0.9, 1.1), 0.5, 1.5),
                Kind::Linear(lo, hi) => {
                    let base = (1.0 / (cols.max(1) as f32).sqrt()).clamp(0.018, 0.035);
                    (base * rng.range(lo, hi), 0.75, 1.25)
                }
                _ => unreachable!("norms are handled above"),
            };
            fill_matrix(
                &mut out,
                cols.max(1),
                seed,
                sigma,
                row_lo,
                row_hi,
                threads,
                bar,
            );
            return out;
        }
    }
    if let Some(b) = bar {
        b.inc(out.len() as u64);
    }
    out
}

/// `model.layers.N` of a per-layer tensor name (the whole name otherwise).
fn layer_prefix(name: &str) -> &str {
    match name.match_indices(".self_attn").next() {
        Some((i, _)) => &name[..i],
        None => name,
    }
}

fn put_bf16(out: &mut [u8], vals: &[f32]) {
    for (o, v) in out.chunks_exact_mut(2).zip(vals) {
        o.copy_from_slice(&bf16::from_f32(*v).to_bits().to_le_bytes());
    }
}

/// Fills a row-major matrix of `cols` columns: row `r` is generated from `sub_seed(seed, r)`, so
/// the result does not depend on how rows are split across threads.
#[allow(clippy::too_many_arguments)]
fn fill_matrix(
    out: &mut [u8],
    cols: usize,
    seed: u64,
    sigma: f32,
    row_lo: f32,
    row_hi: f32,
    threads: usize,
    bar: Option<&ProgressBar>,
) {
    let row_bytes = 2 * cols;
    let rows = out.len() / row_bytes;
    let fill = |first_row: usize, chunk: &mut [u8]| {
        const REPORT_ROWS: usize = 256;
        for (i, row) in chunk.chunks_exact_mut(row_bytes).enumerate() {
            let r = first_row + i;
            fill_row(row, sub_seed(seed, r as u64), sigma, row_lo, row_hi);
            if (i + 1) % REPORT_ROWS == 0 {
                if let Some(b) = bar {
                    b.inc((REPORT_ROWS * row_bytes) as u64);
                }
            }
        }
        if let Some(b) = bar {
            b.inc(((chunk.len() / row_bytes) % REPORT_ROWS * row_bytes) as u64);
        }
    };
    if threads <= 1 || out.len() < (1 << 20) {
        fill(0, out);
        return;
    }
    let rows_per = rows.div_ceil(threads);
    std::thread::scope(|s| {
        for (t, chunk) in out.chunks_mut(rows_per * row_bytes).enumerate() {
            let fill = &fill;
            s.spawn(move || fill(t * rows_per, chunk));
        }
    });
}

/// Probability of an outlier is `OUTLIER_THRESHOLD / 65536` (about 1 in 8,000).
const OUTLIER_THRESHOLD: u64 = 8;

/// One row of a linear or embedding matrix: `σ·r·z` plus rare outliers of magnitude 0.1–0.5.
fn fill_row(row: &mut [u8], seed: u64, sigma: f32, row_lo: f32, row_hi: f32) {
    let mut rng = Rng(seed);
    let s = sigma * rng.range(row_lo, row_hi);
    // z = 2·(u1 + u2 + u3 − 1.5) from three 16-bit uniforms; the low 16 bits pick outliers.
    let scale = s * 2.0 / 65536.0;
    let offset = 1.5 * 65536.0;
    for o in row.chunks_exact_mut(2) {
        let x = rng.next_u64();
        let sum = ((x >> 16) & 0xFFFF) + ((x >> 32) & 0xFFFF) + (x >> 48);
        let mut v = (sum as f32 - offset) * scale;
        if x & 0xFFFF < OUTLIER_THRESHOLD {
            let u = rng.uniform();
            let mag = 0.1 + 0.4 * u * u;
            v = if x & 1 == 0 { mag } else { -mag };
        }
        o.copy_from_slice(&bf16::from_f32(v).to_bits().to_le_bytes());
    }
}

/// An RMSNorm weight over the hidden size: near a per-tensor centre, a few channels at 8–20.
fn hidden_norm(seed: u64, n: usize, lo: f32, hi: f32) -> Vec<f32> {
    let mut rng = Rng(seed);
    let centre = rng.range(lo, hi);
    let mut v: Vec<f32> = (0..n)
        .map(|_| (centre * (1.0 + 0.12 * rng.normal())).clamp(0.8, 2.5))
        .collect();
    for _ in 0..(n / 256).max(1) {
        let c = rng.below(n);
        v[c] = rng.range(8.0, 20.0);
    }
    v
}

/// A layer's `(q_norm, k_norm)` over `head_dim` channels: near 1, except on a few RoPE pairs
/// where q_norm is 0.1–0.3 and k_norm 60–90.
fn qk_norms(seed: u64, hd: usize) -> (Vec<f32>, Vec<f32>) {
    let mut rng = Rng(seed);
    let mut near_one = || {
        (0..hd)
            .map(|_| (1.0 + 0.12 * rng.normal()).clamp(0.6, 1.6))
            .collect()
    };
    let mut q: Vec<f32> = near_one();
    let mut k: Vec<f32> = near_one();
    for c in special_channels(&mut rng, hd) {
        q[c] = rng.range(0.1, 0.3);
        k[c] = rng.range(60.0, 90.0);
    }
    (q, k)
}

/// max(1, hd/64) distinct RoPE pairs `(j, j + hd/2)`, `j` in `[hd/4, hd/2)`, sorted.
fn special_channels(rng: &mut Rng, hd: usize) -> Vec<usize> {
    let half = hd / 2;
    let (lo, span) = (hd / 4, half - hd / 4);
    let pairs = (hd / 64).max(1).min(span.max(1));
    let mut js: Vec<usize> = Vec::new();
    while js.len() < pairs && span > 0 {
        let j = lo + rng.below(span);
        if !js.contains(&j) {
            js.push(j);
        }
    }
    let mut chans: Vec<usize> = js.iter().flat_map(|&j| [j, j + half]).collect();
    chans.sort_unstable();
    chans
}

/// splitmix64. Hand-written rather than taken from a crate so that the weights a seed produces
/// can never change with a dependency's version (`rand` makes no such promise across releases).
#[derive(Debug, Clone)]
struct Rng(u64);

impl Rng {
    #[inline]
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `[0, 1)`, 24 bits.
    fn uniform(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 * (1.0 / (1u32 << 24) as f32)
    }

    /// Uniform in `[lo, hi)`.
    fn range(&mut self, lo: f32, hi: f32) -> f32 {
        lo + (hi - lo) * self.uniform()
    }

    /// Uniform integer in `[0, n)`, `n > 0`.
    fn below(&mut self, n: usize) -> usize {
        (((self.next_u64() >> 32) * n as u64) >> 32) as usize
    }

    /// Approximately standard normal: Irwin–Hall sum of three uniforms, rescaled; |z| ≤ 3.
    fn normal(&mut self) -> f32 {
        let x = self.next_u64();
        let sum = (x & 0xFFFF) + ((x >> 16) & 0xFFFF) + ((x >> 32) & 0xFFFF);
        (sum as f32 / 65536.0 - 1.5) * 2.0
    }
}

/// A seed derived from `parent` and `salt`.
fn sub_seed(parent: u64, salt: u64) -> u64 {
    Rng(parent ^ salt.wrapping_mul(0xD6E8_FEB8_6659_FD93)).next_u64()
}

/// 64-bit FNV-1a.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xCBF2_9CE4_8422_2325, |h, &b| {
        (h ^ b as u64).wrapping_mul(0x0100_0000_01B3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Checkpoint;

    fn values(cfg: &Config, name: &str, seed: u64, threads: usize) -> Vec<f32> {
        let shape = tensor_specs(cfg)
            .into_iter()
            .find(|(n, _)| n == name)
            .unwrap()
            .1;
        let t = LazyTensor {
            name: name.into(),
            shape,
            seed: sub_seed(seed, fnv1a(name.as_bytes())),
            qk_seed: seed,
            threads,
            bar: None,
        };
        t.data()
            .chunks_exact(2)
            .map(|b| bf16::from_le_bytes([b[0], b[1]]).to_f32())
            .collect()
    }

    fn std_dev(v: &[f32]) -> f64 {
        let n = v.len() as f64;
        let mean = v.iter().map(|&x| x as f64).sum::<f64>() / n;
        (v.iter().map(|&x| (x as f64 - mean).powi(2)).sum::<f64>() / n).sqrt()
    }

    #[test]
    fn presets_have_the_right_names_and_sizes() {
        for p in Preset::ALL {
            assert_eq!(Preset::from_name(p.name()), Some(p));
            p.config().validate(Path::new("config.json")).unwrap();
        }
        assert_eq!(Preset::from_name("QWEN3-0.6B"), Some(Preset::Qwen3_0_6B));
        assert_eq!(Preset::from_name("0.6b"), None);
        assert_eq!(Preset::Qwen3_0_6B.config().num_parameters(), 596_049_920);
        let t = Preset::Tiny.config();
        assert_eq!(
            (t.num_hidden_layers, t.hidden_size, t.intermediate_size),
            (2, 64, 192)
        );
        assert_eq!(
            (t.num_attention_heads, t.num_key_value_heads, t.head_dim()),
            (4, 2, 16)
        );
        assert_eq!(t.vocab_size, 151_936);
    }

    #[test]
    fn rng_is_pinned() {
        // splitmix64's published first output for seed 0; guards against accidental edits.
        assert_eq!(Rng(0).next_u64(), 0xE220_A839_7B1D_CDAF);
        let mut r = Rng(7);
        let z: Vec<f32> = (0..100_000).map(|_| r.normal()).collect();
        let mean = z.iter().map(|&x| x as f64).sum::<f64>() / z.len() as f64;
        assert!(mean.abs() < 0.02, "{mean}");
        assert!((std_dev(&z) - 1.0).abs() < 0.02);
        assert!(z.iter().all(|x| x.abs() <= 3.0));
    }

    #[test]
    fn generation_is_deterministic_and_thread_independent() {
        let cfg = Preset::Tiny.config();
        let name = "model.layers.1.mlp.up_proj.weight";
        let a = values(&cfg, name, 5, 1);
        assert_eq!(a, values(&cfg, name, 5, 3));
        assert_ne!(a, values(&cfg, name, 6, 1));
        let e = "model.embed_tokens.weight";
        assert_eq!(values(&cfg, e, 5, 1), values(&cfg, e, 5, 2));
    }

    #[test]
    fn statistics_are_trained_like() {
        let cfg = Preset::Qwen3_0_6B.config();
        let mut outliers = 0;
        for (name, _) in tensor_specs(&cfg)
            .iter()
            .filter(|(n, _)| n.starts_with("model.layers.3."))
        {
            let v = values(&cfg, name, 1, 2);
            assert!(v.iter().all(|x| x.is_finite()), "{name}");
            match kind_of(name) {
                Kind::Linear(..) => {
                    let s = std_dev(&v);
                    assert!((0.013..0.055).contains(&s), "{name}: std {s}");
                    assert!(v.iter().all(|x| x.abs() < 1.0), "{name}");
                    let max = v.iter().fold(0f32, |m, x| m.max(x.abs()));
                    assert!(max > 0.3 && max <= 0.5, "{name}: max {max}");
                    outliers += v.iter().filter(|x| x.abs() >= 0.1).count();
                }
                Kind::HiddenNorm(..) => {
                    let big = v.iter().filter(|&&x| x > 5.0).count();
                    assert!((1..=4).contains(&big), "{name}: {big} large channels");
                    assert!(v.iter().all(|&x| (0.79..=20.0).contains(&x)), "{name}");
                }
                Kind::QkNorm(_) | Kind::Embedding => {}
            }
        }
        assert!(outliers > 100, "{outliers}");
        let q = values(&cfg, "model.layers.3.self_attn.q_norm.weight", 1, 1);
        let k = values(&cfg, "model.layers.3.self_attn.k_norm.weight", 1, 1);
        let small_q: Vec<usize> = (0..128).filter(|&i| q[i] < 0.5).collect();
        let big_k: Vec<usize> = (0..128).filter(|&i| k[i] > 10.0).collect();
        assert_eq!(small_q, big_k);
        assert_eq!(small_q.len(), 4);
        assert!(
            small_q.iter().all(|&i| (32..64).contains(&(i % 64))),
            "{small_q:?}"
        );
        assert!(big_k.iter().all(|&i| (60.0..=90.0).contains(&k[i])));
        assert!(small_q.iter().all(|&i| (0.1..=0.3).contains(&q[i])));
        let e = values(&cfg, "model.embed_tokens.weight", 1, 2);
        let s = std_dev(&e);
        assert!((0.025..0.04).contains(&s), "embedding std {s}");
        assert!(e.iter().all(|x| x.abs() < 1.0));
    }

    #[test]
    fn writes_a_checkpoint_that_opens_in_both_key_styles() {
        let tmp = tempfile::tempdir().unwrap();
        let cfg = Preset::Tiny.config();
        for (style, sub) in [
            (KeyStyle::Transformers4, "t4"),
            (KeyStyle::Transformers5, "t5"),
        ] {
            let dir = tmp.path().join(sub).join("nested");
            write_checkpoint(
                &dir,
                &cfg,
                &SynthOptions {
                    seed: 3,
                    key_style: style,
                    ..Default::default()
                },
            )
            .unwrap();
            let back = Config::from_file(&dir.join("config.json")).unwrap();
            assert_eq!(back, styled_config(&cfg, style));
            if style == KeyStyle::Transformers4 {
                assert_eq!(back, cfg);
            }
            let ck = Checkpoint::open(&dir).unwrap();
            assert_eq!(ck.config.rope_theta(), 1e6);
            let names: Vec<_> = std::fs::read_dir(&dir)
                .unwrap()
                .map(|e| e.unwrap().file_name())
                .collect();
            assert_eq!(names.len(), 2, "no temporary files left: {names:?}");
        }
        let a = std::fs::read(tmp.path().join("t4/nested/model.safetensors")).unwrap();
        let b = std::fs::read(tmp.path().join("t5/nested/model.safetensors")).unwrap();
        assert!(a == b, "the key style does not change the weights");
    }
}
