//! Trains a small but *genuinely trained* Qwen3 checkpoint, so that quantisation experiments have a
//! model with real, peaked logits (random-weight checkpoints give near-flat ones).
//!
//! ```text
//! cargo run --release -p qwen_bpf_dev --bin train_tiny -- --out DIR [--steps N] [--seed S]
//! ```
//!
//! The model is a byte-level language model (vocab_size 256, token id = byte value) with the exact
//! Qwen3 architecture (HF `modeling_qwen3.py`: q/k RMSNorm before RoPE, GQA, SwiGLU MLP, tied
//! embeddings), trained on the concatenated text of `/usr/share/common-licenses/*` (shipped by
//! `base-files` on every Debian/Ubuntu; ~240 KB; the last 5% is held out for validation).
//!
//! The forward pass is written with plain differentiable candle ops (no fused rms_norm / rope /
//! softmax kernels, which may lack a backward pass). DIR receives `model.safetensors` (BF16, HF
//! names), `tokenizer.json` (byte-level BPE, id == byte) and `config.json` (written last). As a
//! self-check the example reloads DIR with `qwen_bpf`'s f32 reference and compares its loss with
//! candle's on the same bytes, then prints samples. The default 800 steps take about 10 minutes
//! on 2 vCPUs (0.77 s/step) and reach a validation loss of about 1.57 nats/byte.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use candle_core::{DType, Device, Result as CResult, Tensor, Var, D};
use candle_nn::{AdamW, Optimizer, ParamsAdamW};
use clap::Parser;
use qwen_bpf::hf::checkpoint::tensor_specs;
use qwen_bpf::hf::synth::Preset;
use qwen_bpf::{Checkpoint, Config, Reference};

type Res<T> = std::result::Result<T, Box<dyn std::error::Error>>;

const CORPUS: &str = "/usr/share/common-licenses";
const BATCH: usize = 8; //        sequences per step
const SEQ: usize = 256; //        bytes per sequence (the self-check and sample use 256 positions)
const LR: f64 = 3e-3; //          peak learning rate
const WARMUP: usize = 50; //      linear warmup steps, then cosine decay to LR / 10
const EVAL_EVERY: usize = 100; // steps between validation losses

/// Train a byte-level Qwen3 on /usr/share/common-licenses and write a HF checkpoint.
#[derive(Debug, Parser)]
struct Args {
    /// Output directory (created if missing).
    #[arg(long)]
    out: PathBuf,
    /// Optimiser steps (default: about 10 minutes on 2 vCPUs).
    #[arg(long, default_value_t = 800)]
    steps: usize,
    /// Seed of the initial weights and of the batch sampler.
    #[arg(long, default_value_t = 0)]
    seed: u64,
}

#[path = "../../../tests/common/rng.rs"]
mod rng;
use rng::Rng;

/// The generator of the initial weights and the batch offsets for `seed`.
fn seeded(seed: u64) -> Rng {
    Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
}

/// The model config, in the HF Qwen3 `config.json` style: the tiny synthetic preset's (tied
/// embeddings, RoPE theta 1e6, eps 1e-6), reshaped.
fn config() -> Config {
    Config {
        vocab_size: 256,
        hidden_size: 256,
        intermediate_size: 768,
        num_hidden_layers: 4,
        num_attention_heads: 4,
        num_key_value_heads: 2,
        head_dim: Some(64),
        max_position_embeddings: 4096,
        bos_token_id: None,
        eos_token_id: None,
        ..Preset::Tiny.config()
    }
}

/// The weights by HF name (a map of the tensors of `Var`s, or of BF16-rounded copies).
type Weights = HashMap<String, Tensor>;

fn w<'a>(ws: &'a Weights, name: &str) -> CResult<&'a Tensor> {
    let missing = || candle_core::Error::Msg(format!("no tensor {name}"));
    ws.get(name).ok_or_else(missing)
}

/// HF Qwen3RMSNorm over the last dim: weight * (x * rsqrt(mean(x²) + eps)).
fn rms_norm(x: &Tensor, weight: &Tensor, eps: f64) -> CResult<Tensor> {
    let r = (x.sqr()?.mean_keepdim(D::Minus1)? + eps)?.sqrt()?.recip()?; // [..., 1]
    x.broadcast_mul(&r)?.broadcast_mul(weight)
}

/// x · Wᵀ for a weight stored HF-style as [out, in]; x is [N, in].
fn linear(x: &Tensor, weight: &Tensor) -> CResult<Tensor> {
    x.matmul(&weight.t()?)
}

/// HF apply_rotary_pos_emb on x [B, heads, T, hd]: x·cos + rotate_half(x)·sin, where
/// rotate_half(x) = cat(-x[..., hd/2:], x[..., :hd/2]); cos, sin are [T, hd] = cat(c, c).
fn rope(x: &Tensor, cos: &Tensor, sin: &Tensor) -> CResult<Tensor> {
    let half = x.dim(D::Minus1)? / 2;
    let lo = x.narrow(D::Minus1, 0, half)?;
    let hi = x.narrow(D::Minus1, half, half)?;
    let rotated = Tensor::cat(&[&hi.neg()?, &lo], D::Minus1)?;
    x.broadcast_mul(cos)? + rotated.broadcast_mul(sin)?
}

/// The Qwen3 forward pass: ids [B, T] (u32) -> logits [B*T, vocab].
fn forward(cfg: &Config, ws: &Weights, ids: &Tensor) -> CResult<Tensor> {
    let (b, t) = ids.dims2()?;
    let (hd, eps, dev) = (cfg.head_dim(), cfg.rms_norm_eps, ids.device());
    let (nh, nkv) = (cfg.num_attention_heads, cfg.num_key_value_heads);

    // RoPE tables, in f32 as HF: inv_freq[i] = 1 / theta^(2i/hd); freqs = pos · inv_freq.
    let theta = cfg.rope_theta() as f32;
    let mut cos = Vec::with_capacity(t * hd);
    let mut sin = Vec::with_capacity(t * hd);
    for p in 0..t {
        let freqs: Vec<f32> = (0..hd)
            .map(|j| p as f32 * (1.0 / theta.powf((2 * (j % (hd / 2))) as f32 / hd as f32)))
            .collect(); // emb = cat(freqs, freqs)
        cos.extend(freqs.iter().map(|f| f.cos()));
        sin.extend(freqs.iter().map(|f| f.sin()));
    }
    let cos = Tensor::from_vec(cos, (t, hd), dev)?; // [T, hd]
    let sin = Tensor::from_vec(sin, (t, hd), dev)?; // [T, hd]

    // Causal mask: 0 on and below the diagonal, -inf above.                               [T, T]
    let mut mask = vec![0f32; t * t];
    for r in 0..t {
        mask[r * t + r + 1..(r + 1) * t].fill(f32::NEG_INFINITY);
    }
    let mask = Tensor::from_vec(mask, (t, t), dev)?;
    let scaling = (hd as f64).powf(-0.5);

    let embed = w(ws, "model.embed_tokens.weight")?; //                                    [V, H]
    let mut x = embed.index_select(&ids.flatten_all()?, 0)?; //                           [B*T, H]
    for l in 0..cfg.num_hidden_layers {
        let p = |n: &str| w(ws, &format!("model.layers.{l}.{n}.weight"));
        // Attention block.
        let xn = rms_norm(&x, p("input_layernorm")?, eps)?; //                            [B*T, H]
        let q = linear(&xn, p("self_attn.q_proj")?)?.reshape((b, t, nh, hd))?;
        let k = linear(&xn, p("self_attn.k_proj")?)?.reshape((b, t, nkv, hd))?;
        let v = linear(&xn, p("self_attn.v_proj")?)?.reshape((b, t, nkv, hd))?;
        // q_norm / k_norm over each head's head_dim, then to head-major, then RoPE.
        let q = rms_norm(&q, p("self_attn.q_norm")?, eps)?.transpose(1, 2)?; // [B, nh, T, hd]
        let k = rms_norm(&k, p("self_attn.k_norm")?, eps)?.transpose(1, 2)?; // [B, nkv, T, hd]
        let q = rope(&q.contiguous()?, &cos, &sin)?;
        let k = rope(&k.contiguous()?, &cos, &sin)?;
        // GQA (HF repeat_kv): kv head j serves query heads j*g .. (j+1)*g.        [B, nh, T, hd]
        let g = nh / nkv;
        let repeat_kv = |x: &Tensor| {
            let x = x.unsqueeze(2)?.broadcast_as((b, nkv, g, t, hd))?; //      [B, nkv, g, T, hd]
            x.reshape((b, nh, t, hd))
        };
        let (k, v) = (repeat_kv(&k)?, repeat_kv(&v.transpose(1, 2)?)?);
        // softmax(q kᵀ · hd^-0.5 + mask) in f32, max subtracted.                      [B, nh, T, T]
        let scores = (q.matmul(&k.t()?)? * scaling)?.broadcast_add(&mask)?;
        let max = scores.max_keepdim(D::Minus1)?;
        let e = scores.broadcast_sub(&max)?.exp()?;
        let probs = e.broadcast_div(&e.sum_keepdim(D::Minus1)?)?;
        let attn = probs.matmul(&v)?.transpose(1, 2)?; //                          [B, T, nh, hd]
        let attn = attn.reshape((b * t, nh * hd))?; //                              [B*T, nh*hd]
        x = (x + linear(&attn, p("self_attn.o_proj")?)?)?; //                           [B*T, H]

        // MLP block: down(silu(gate(x)) * up(x)).
        let xn = rms_norm(&x, p("post_attention_layernorm")?, eps)?;
        let gate = linear(&xn, p("mlp.gate_proj")?)?.silu()?; //                       [B*T, I]
        let up = linear(&xn, p("mlp.up_proj")?)?; //                                   [B*T, I]
        x = (x + linear(&(gate * up)?, p("mlp.down_proj")?)?)?; //                      [B*T, H]
    }
    let x = rms_norm(&x, w(ws, "model.norm.weight")?, eps)?; //                          [B*T, H]
    linear(&x, embed) // tied LM head: logits = x · embed_tokensᵀ                       [B*T, V]
}

/// Mean cross-entropy (nats/byte) of predicting bytes `seqs[., 1..]` from `seqs[., ..T]`.
fn loss(cfg: &Config, ws: &Weights, seqs: &[&[u8]], dev: &Device) -> CResult<Tensor> {
    let t = seqs[0].len() - 1;
    let ids = |r: std::ops::Range<usize>| -> Vec<u32> {
        seqs.iter()
            .flat_map(|s| s[r.clone()].iter().map(|&c| c as u32))
            .collect()
    };
    let inp = Tensor::from_vec(ids(0..t), (seqs.len(), t), dev)?; //               [B, T]
    let tgt = Tensor::from_vec(ids(1..t + 1), seqs.len() * t, dev)?; //             [B*T]
    candle_nn::loss::cross_entropy(&forward(cfg, ws, &inp)?, &tgt)
}

/// Validation loss over non-overlapping SEQ+1-byte windows of `val`.
fn val_loss(cfg: &Config, ws: &Weights, val: &[u8], dev: &Device) -> CResult<f32> {
    let windows: Vec<&[u8]> = val.chunks_exact(SEQ + 1).collect();
    let mut total = 0.0;
    for batch in windows.chunks(BATCH) {
        total += loss(cfg, ws, batch, dev)?.to_scalar::<f32>()? * batch.len() as f32;
    }
    Ok(total / windows.len() as f32)
}

/// Adds the path to an I/O error.
fn io<T>(r: std::io::Result<T>, path: &Path) -> Res<T> {
    r.map_err(|e| format!("{}: {e}", path.display()).into())
}

/// The concatenated corpus: regular files of CORPUS in sorted name order (symlinks skipped).
fn read_corpus() -> Res<Vec<u8>> {
    let dir = Path::new(CORPUS);
    let mut paths = Vec::new();
    for entry in io(std::fs::read_dir(dir), dir)? {
        let path = io(entry, dir)?.path();
        if io(std::fs::symlink_metadata(&path), &path)?.is_file() {
            paths.push(path);
        }
    }
    paths.sort();
    let mut text = Vec::new();
    for p in &paths {
        text.extend(io(std::fs::read(p), p)?);
    }
    eprintln!(
        "corpus: {} files, {} bytes, {CORPUS}",
        paths.len(),
        text.len()
    );
    Ok(text)
}

/// Writes `bytes` to `path` through a temporary file in the same directory renamed into place.
fn write_atomic(path: &Path, bytes: &[u8]) -> Res<()> {
    use std::io::Write;
    let mut tmp = io(tempfile::NamedTempFile::new_in(dir_of(path)), path)?;
    io(tmp.write_all(bytes), tmp.path())?;
    tmp.persist(path)
        .map_err(|e| format!("{}: {}", path.display(), e.error))?;
    Ok(())
}

/// The directory `path` is in (`.` for a bare file name).
fn dir_of(path: &Path) -> &Path {
    match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    }
}

/// GPT-2's bytes_to_unicode: printable bytes map to themselves, the rest to U+0100 onwards.
fn byte_char(b: u8) -> char {
    let printable = |c: u8| matches!(c, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
    if printable(b) {
        b as char
    } else {
        char::from_u32(256 + (0..b).filter(|&c| !printable(c)).count() as u32).unwrap_or('?')
    }
}

/// A byte-level HF tokenizer.json: BPE over the 256 byte symbols in byte order (id == byte),
/// no merges, ByteLevel pre-tokenizer (no prefix space, no regex) and decoder.
fn tokenizer_json() -> Res<String> {
    use tokenizers::{
        decoders::byte_level::ByteLevel as Dec, models::bpe, pre_tokenizers::byte_level::ByteLevel,
    };
    let vocab: bpe::Vocab = (0..=255u8)
        .map(|b| (byte_char(b).to_string(), b as u32))
        .collect();
    let bpe = bpe::BPE::builder().vocab_and_merges(vocab, vec![]).build();
    let mut tok = tokenizers::Tokenizer::new(bpe.map_err(|e| format!("BPE: {e}"))?);
    tok.with_pre_tokenizer(Some(ByteLevel::new(false, false, false)));
    tok.with_decoder(Some(Dec::new(false, false, false)));
    let json = tok
        .to_string(true)
        .map_err(|e| format!("tokenizer.json: {e}"));
    Ok(json?)
}

/// Writes config.json, model.safetensors (BF16, in tensor_specs order) and tokenizer.json.
fn save(dir: &Path, cfg: &Config, ws: &Weights) -> Res<()> {
    use safetensors::{tensor::TensorView, Dtype};
    io(std::fs::create_dir_all(dir), dir)?;
    let mut data = Vec::new(); // (name, shape, little-endian BF16 bytes)
    for (name, shape) in tensor_specs(cfg) {
        let vals = w(ws, &name)?.flatten_all()?.to_vec1::<f32>()?;
        let bf16 = vals
            .iter()
            .flat_map(|&v| half::bf16::from_f32(v).to_le_bytes());
        data.push((name, shape, bf16.collect::<Vec<u8>>()));
    }
    let mut views = Vec::new();
    for (name, shape, bytes) in &data {
        views.push((name, TensorView::new(Dtype::BF16, shape.clone(), bytes)?));
    }
    let meta = HashMap::from([("format".to_string(), "pt".to_string())]);
    let st = safetensors::serialize(views, Some(meta))?;
    write_atomic(&dir.join("model.safetensors"), &st)?;
    write_atomic(&dir.join("tokenizer.json"), tokenizer_json()?.as_bytes())?;
    // config.json last: a directory without it is not a checkpoint.
    let json = serde_json::to_string_pretty(cfg)?;
    write_atomic(&dir.join("config.json"), json.as_bytes())
}

/// Next byte from `logits` [256]: the argmax if `temperature` is 0, else a softmax(logits / T)
/// sample. Also returns -log p(`target`) under the untempered softmax, in nats.
fn pick(logits: &[f32], temperature: f32, target: u8, rng: &mut Rng) -> (u8, f64) {
    let max = logits.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
    let sum: f64 = logits.iter().map(|&z| ((z - max) as f64).exp()).sum();
    let nll = max as f64 + sum.ln() - logits[target as usize] as f64;
    let mut next = (0..256).max_by(|&a, &b| logits[a].total_cmp(&logits[b]));
    if temperature > 0.0 {
        let p: Vec<f64> = logits
            .iter()
            .map(|&z| ((z - max) / temperature) as f64)
            .collect();
        let p: Vec<f64> = p.into_iter().map(f64::exp).collect();
        let mut u = rng.open_unit() * p.iter().sum::<f64>();
        for (i, &pi) in p.iter().enumerate() {
            u -= pi;
            if u <= 0.0 {
                next = Some(i);
                break;
            }
        }
    }
    (next.unwrap_or(0) as u8, nll)
}

fn run(args: &Args) -> Res<()> {
    let (dev, cfg) = (Device::Cpu, config());
    io(std::fs::create_dir_all(&args.out), &args.out)?; // fail before training, not after
    let text = read_corpus()?;
    let (train, val) = text.split_at(text.len() - text.len() / 20); // last 5%: validation
    if train.len() < 2 * (SEQ + 1) || val.len() < SEQ + 1 {
        return Err(format!("{CORPUS}: only {} bytes, too little text", text.len()).into());
    }

    // Parameters: HF init, normal(0, 0.02) for the embedding and linears, ones for norms (which
    // get no weight decay).
    let mut rng = seeded(args.seed);
    let (mut decay, mut no_decay, mut vars) = (Vec::new(), Vec::new(), Vec::new());
    for (name, shape) in tensor_specs(&cfg) {
        let n = shape.iter().product();
        let var = if shape.len() == 1 {
            Var::ones(n, DType::F32, &dev)?
        } else {
            let v: Vec<f32> = (0..n).map(|_| (rng.gaussian() * 0.02) as f32).collect();
            Var::from_tensor(&Tensor::from_vec(v, shape.as_slice(), &dev)?)?
        };
        let group = if shape.len() == 1 {
            &mut no_decay
        } else {
            &mut decay
        };
        group.push(var.clone());
        vars.push((name, var));
    }
    let n_params: usize = vars.iter().map(|(_, v)| v.elem_count()).sum();
    eprintln!(
        "model: {n_params} parameters, {} steps of {BATCH}x{SEQ} bytes",
        args.steps
    );
    let adamw = |weight_decay| {
        let (beta1, beta2, eps) = (0.9, 0.95, 1e-8);
        ParamsAdamW {
            lr: LR,
            beta1,
            beta2,
            eps,
            weight_decay,
        }
    };
    let mut opt_decay = AdamW::new(decay, adamw(0.1))?;
    let mut opt_norms = AdamW::new(no_decay, adamw(0.0))?;
    let weights = || -> Weights {
        let named = vars.iter().map(|(n, v)| (n.clone(), v.as_tensor().clone()));
        named.collect()
    };

    let start = Instant::now();
    for step in 1..=args.steps {
        // Learning rate: linear warmup, then cosine from LR down to LR / 10.
        let lr = if step <= WARMUP {
            LR * step as f64 / WARMUP as f64
        } else {
            let p = (step - WARMUP) as f64 / (args.steps - WARMUP).max(1) as f64;
            LR * (0.1 + 0.45 * (1.0 + (std::f64::consts::PI * p).cos()))
        };
        opt_decay.set_learning_rate(lr);
        opt_norms.set_learning_rate(lr);
        // A batch of random windows of the training text.                        [BATCH, SEQ+1]
        let offsets: Vec<usize> = (0..BATCH)
            .map(|_| (rng.next() % (train.len() - SEQ) as u64) as usize)
            .collect();
        let seqs: Vec<&[u8]> = offsets.iter().map(|&o| &train[o..o + SEQ + 1]).collect();
        let loss_t = loss(&cfg, &weights(), &seqs, &dev)?;
        let mut grads = loss_t.backward()?;
        // Clip the global gradient norm to 1.
        let mut sq = 0.0f32;
        for (_, v) in &vars {
            if let Some(g) = grads.get(v) {
                sq += g.sqr()?.sum_all()?.to_scalar::<f32>()?;
            }
        }
        let gnorm = sq.sqrt();
        for (_, v) in vars.iter().filter(|_| gnorm > 1.0) {
            if let Some(g) = grads.get(v) {
                let g = (g / gnorm as f64)?;
                grads.insert(v, g);
            }
        }
        opt_decay.step(&grads)?;
        opt_norms.step(&grads)?;
        if step % 10 == 0 || step == 1 {
            let (l, secs) = (loss_t.to_scalar::<f32>()?, start.elapsed().as_secs_f64());
            let per = secs / step as f64;
            eprintln!("step {step:4}  lr {lr:.2e}  train {l:.4}  |grad| {gnorm:.2}  ({secs:.0} s, {per:.2} s/step)");
        }
        if step % EVAL_EVERY == 0 || step == args.steps {
            let v = val_loss(&cfg, &weights(), val, &dev)?;
            eprintln!("step {step:4}  val {v:.4} nats/byte");
        }
    }
    eprintln!("trained in {:.0} s", start.elapsed().as_secs_f64());

    // Write the checkpoint; check the tokenizer through qwen_bpf's wrapper.
    save(&args.out, &cfg, &weights())?;
    eprintln!("wrote {}", args.out.display());
    let tok = qwen_bpf::hf::tokenizer::Tokenizer::from_model_dir(&args.out)?;
    for s in ["Hello, world", "naïve €5\n\t"] {
        let (ids, bytes) = (tok.encode(s)?, s.bytes().map(u32::from).collect::<Vec<_>>());
        let back = tok.decode(&ids)?;
        if ids != bytes || back != s {
            let msg = format!("tokenizer: {s:?} -> {ids:?} -> {back:?}, want ids {bytes:?}");
            return Err(msg.into());
        }
    }
    eprintln!("tokenizer.json: id == byte, round trip ok");

    // Self-check: the qwen_bpf f32 reference on the saved BF16 weights versus candle, on the first
    // 256 validation bytes (255 predictions). With the same BF16-rounded weights they must agree
    // to float rounding; against the f32 training weights to ~0.05 nats.
    let n = 256;
    let ck = Checkpoint::open(&args.out)?;
    let mut reference = Reference::new(&ck, n)?;
    let mut ref_nll = 0.0;
    for i in 0..n - 1 {
        ref_nll += pick(
            &reference.forward(val[i] as u32)?,
            0.0,
            val[i + 1],
            &mut rng,
        )
        .1;
    }
    let ref_loss = (ref_nll / (n - 1) as f64) as f32;
    let mut rounded = weights();
    for t in rounded.values_mut() {
        *t = t.to_dtype(DType::BF16)?.to_dtype(DType::F32)?;
    }
    let candle_bf16 = loss(&cfg, &rounded, &[&val[..n]], &dev)?.to_scalar::<f32>()?;
    let candle_f32 = loss(&cfg, &weights(), &[&val[..n]], &dev)?.to_scalar::<f32>()?;
    eprintln!(
        "self-check, val[..{n}] nats/byte: qwen_bpf reference {ref_loss:.4}, \
         candle BF16-rounded weights {candle_bf16:.4}, candle f32 weights {candle_f32:.4}"
    );
    if (ref_loss - candle_bf16).abs() > 0.01 || (ref_loss - candle_f32).abs() > 0.05 {
        return Err("self-check failed: the reference and candle disagree".into());
    }

    // Samples from the reference: greedy (on this text it tends to end in a run of the spaces
    // that centre license headings), then at temperature 0.7.
    let prompt = "GNU General Public License";
    for temperature in [0.0, 0.7] {
        reference.reset();
        let mut out = prompt.as_bytes().to_vec();
        let mut logits = Vec::new();
        for &c in prompt.as_bytes() {
            logits = reference.forward(c as u32)?.to_vec();
        }
        for _ in 0..200 {
            let next = pick(&logits, temperature, 0, &mut rng).0;
            out.push(next);
            logits = reference.forward(next as u32)?.to_vec();
        }
        let text = String::from_utf8_lossy(&out);
        eprintln!("sample, temperature {temperature}:\n{text}\n");
    }
    Ok(())
}

fn main() -> ExitCode {
    // CPU tuning, measured on 2 vCPUs (0.77 s/step instead of 1-3 s/step): keep freed activation
    // buffers in the heap instead of returning them to the kernel (saves page faults and TLB
    // shootdowns on every op), and run candle's elementwise ops on this thread (its spin-waiting
    // worker pool loses badly whenever another process wants a core); matrix products still use
    // every core. SAFETY: mallopt is called before any other thread exists.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 32 << 20);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 1 << 30);
        libc::mallopt(libc::M_ARENA_MAX, 1);
    }
    if std::env::var_os("CANDLE_NUM_THREADS").is_none() {
        std::env::set_var("CANDLE_NUM_THREADS", "1");
    }
    let args = match Args::try_parse() {
        Ok(a) => a,
        Err(e) => {
            let _ = e.print(); // usage errors exit 1, --help 0
            return ExitCode::from(e.use_stderr() as u8);
        }
    };
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
