//! Training a Qwen3 with candle: the exact architecture of HF `modeling_qwen3.py` (q/k RMSNorm
//! before RoPE, GQA, SwiGLU MLP, tied embeddings) written with plain differentiable ops (no fused
//! rms_norm / rope / softmax kernels, which may lack a backward pass), AdamW with gradient
//! clipping, and the HF checkpoint writer (BF16 safetensors, config.json last).

use std::collections::HashMap;
use std::path::Path;

use candle_core::{DType, Device, Result as CResult, Tensor, Var, D};
use candle_nn::{AdamW, Optimizer, ParamsAdamW};
use qwen_bpf::hf::checkpoint::tensor_specs;
use qwen_bpf::Config;

use crate::rng::Rng;

/// The tools' error type: any error, printed with its context.
pub type Res<T> = std::result::Result<T, Box<dyn std::error::Error>>;

/// The weights by HF name (a map of the tensors of `Var`s, or of BF16-rounded copies).
pub type Weights = HashMap<String, Tensor>;

/// The generator of a tool's initial weights and batches for `seed`.
pub fn seeded(seed: u64) -> Rng {
    Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
}

/// The tensor called `name`.
pub fn w<'a>(ws: &'a Weights, name: &str) -> CResult<&'a Tensor> {
    let missing = || candle_core::Error::Msg(format!("no tensor {name}"));
    ws.get(name).ok_or_else(missing)
}

/// HF Qwen3RMSNorm over the last dim: weight * (x * rsqrt(mean(x²) + eps)).
fn rms_norm(x: &Tensor, weight: &Tensor, eps: f64) -> CResult<Tensor> {
    let r = (x.sqr()?.mean_keepdim(D::Minus1)? + eps)?.sqrt()?.recip()?; // [..., 1]
    x.broadcast_mul(&r)?.broadcast_mul(weight)
}

/// x · Wᵀ for a weight stored HF-style as [out, in]; x is [N, in].
pub fn linear(x: &Tensor, weight: &Tensor) -> CResult<Tensor> {
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

/// The decoder layers and the final norm: input embeddings x [B*T, H] of B sequences of T
/// positions (from position 0) -> the hidden states the LM head reads, [B*T, H]. Attention is
/// causal, so padding at the end of a sequence changes none of its earlier positions.
pub fn body(cfg: &Config, ws: &Weights, x: &Tensor, b: usize, t: usize) -> CResult<Tensor> {
    let (hd, eps, dev) = (cfg.head_dim(), cfg.rms_norm_eps, x.device());
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

    let mut x = x.clone(); //                                                             [B*T, H]
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
    rms_norm(&x, w(ws, "model.norm.weight")?, eps) //                                    [B*T, H]
}

/// The Qwen3 forward pass with tied embeddings: ids [B, T] (u32) -> logits [B*T, vocab].
pub fn forward(cfg: &Config, ws: &Weights, ids: &Tensor) -> CResult<Tensor> {
    let (b, t) = ids.dims2()?;
    let embed = w(ws, "model.embed_tokens.weight")?; //                                    [V, H]
    let x = embed.index_select(&ids.flatten_all()?, 0)?; //                              [B*T, H]
    linear(&body(cfg, ws, &x, b, t)?, embed) // tied LM head: logits = x · embed_tokensᵀ
}

/// HF's initial value of a parameter of `shape`: ones for a norm (1-D), else normal(0, 0.02).
pub fn initial(shape: &[usize], rng: &mut Rng, dev: &Device) -> CResult<Tensor> {
    let n = shape.iter().product();
    if shape.len() == 1 {
        return Tensor::ones(n, DType::F32, dev);
    }
    let v: Vec<f32> = (0..n).map(|_| (rng.gaussian() * 0.02) as f32).collect();
    Tensor::from_vec(v, shape, dev)
}

/// Linear warmup over `warmup` steps to `peak`, then cosine decay to `peak / 10` at `steps`.
pub fn learning_rate(step: usize, steps: usize, peak: f64, warmup: usize) -> f64 {
    if step <= warmup {
        return peak * step as f64 / warmup as f64;
    }
    let p = (step - warmup) as f64 / (steps - warmup).max(1) as f64;
    peak * (0.1 + 0.45 * (1.0 + (std::f64::consts::PI * p).cos()))
}

/// The trained parameters and their AdamW optimisers (betas 0.9 / 0.95; weight decay 0.1 on
/// matrices, none on norms), stepping with the global gradient norm clipped to 1.
pub struct Trainer {
    vars: Vec<(String, Var)>,
    matrices: AdamW,
    norms: AdamW,
}

impl Trainer {
    /// Parameters named and initialised as `init` (1-D tensors count as norms).
    pub fn new(init: Vec<(String, Tensor)>, lr: f64) -> CResult<Trainer> {
        let (mut matrices, mut norms, mut vars) = (Vec::new(), Vec::new(), Vec::new());
        for (name, t) in init {
            let var = Var::from_tensor(&t)?;
            match t.rank() {
                1 => norms.push(var.clone()),
                _ => matrices.push(var.clone()),
            }
            vars.push((name, var));
        }
        let adamw = |weight_decay| ParamsAdamW {
            lr,
            beta1: 0.9,
            beta2: 0.95,
            eps: 1e-8,
            weight_decay,
        };
        Ok(Trainer {
            vars,
            matrices: AdamW::new(matrices, adamw(0.1))?,
            norms: AdamW::new(norms, adamw(0.0))?,
        })
    }

    /// The number of trained values.
    pub fn parameters(&self) -> usize {
        self.vars.iter().map(|(_, v)| v.elem_count()).sum()
    }

    /// The current parameters by name.
    pub fn weights(&self) -> Weights {
        let named = self.vars.iter();
        named
            .map(|(n, v)| (n.clone(), v.as_tensor().clone()))
            .collect()
    }

    /// One optimiser step at learning rate `lr` down the gradient of `loss`; returns the gradient
    /// norm before clipping.
    pub fn step(&mut self, loss: &Tensor, lr: f64) -> CResult<f32> {
        self.matrices.set_learning_rate(lr);
        self.norms.set_learning_rate(lr);
        let mut grads = loss.backward()?;
        let mut sq = 0.0f32;
        for (_, v) in &self.vars {
            if let Some(g) = grads.get(v) {
                sq += g.sqr()?.sum_all()?.to_scalar::<f32>()?;
            }
        }
        let norm = sq.sqrt();
        for (_, v) in self.vars.iter().filter(|_| norm > 1.0) {
            if let Some(g) = grads.get(v) {
                let g = (g / norm as f64)?;
                grads.insert(v, g);
            }
        }
        self.matrices.step(&grads)?;
        self.norms.step(&grads)?;
        Ok(norm)
    }
}

/// `ws` with every value rounded to BF16, as the checkpoint stores it.
pub fn bf16_rounded(ws: &Weights) -> CResult<Weights> {
    let round = |t: &Tensor| t.to_dtype(DType::BF16)?.to_dtype(DType::F32);
    ws.iter().map(|(n, t)| Ok((n.clone(), round(t)?))).collect()
}

/// Adds the path to an I/O error.
pub fn io<T>(r: std::io::Result<T>, path: &Path) -> Res<T> {
    r.map_err(|e| format!("{}: {e}", path.display()).into())
}

/// Writes `bytes` to `path` through a temporary file in the same directory renamed into place.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Res<()> {
    use std::io::Write;
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let mut tmp = io(tempfile::NamedTempFile::new_in(dir), path)?;
    io(tmp.write_all(bytes), tmp.path())?;
    tmp.persist(path)
        .map_err(|e| format!("{}: {}", path.display(), e.error))?;
    Ok(())
}

/// Writes a HF checkpoint into `dir`: model.safetensors (BF16, in tensor_specs order),
/// tokenizer.json (`tokenizer`), then config.json, last: a directory without it is not a model.
pub fn save(dir: &Path, cfg: &Config, ws: &Weights, tokenizer: &[u8]) -> Res<()> {
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
    write_atomic(&dir.join("tokenizer.json"), tokenizer)?;
    let json = serde_json::to_string_pretty(cfg)?;
    write_atomic(&dir.join("config.json"), json.as_bytes())
}

/// The CPU time this process has used, in seconds (user + system, every thread): on shared cores
/// a fairer measure of a run's cost than the wall clock.
pub fn cpu_seconds() -> f64 {
    // SAFETY: getrusage writes the struct it is given, which is plain data.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) } != 0 {
        return f64::NAN;
    }
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 * 1e-6;
    secs(u.ru_utime) + secs(u.ru_stime)
}

/// CPU tuning for candle on a few shared cores, measured on 2 vCPUs (train_tiny: 0.77 s/step
/// instead of 1-3 s/step): keep freed activation buffers in the heap instead of returning them to
/// the kernel (saves page faults and TLB shootdowns on every op), and run candle's elementwise ops
/// on the calling thread (its spin-waiting worker pool loses badly whenever another process wants
/// a core); matrix products still use every core.
///
/// A training binary's `main`: the CPU tuned ([`tune_cpu`]), its arguments parsed (usage errors
/// exit 1, `--help` 0), `run` called; its error printed, exit 1.
pub fn main_with<A: clap::Parser>(run: impl FnOnce(&A) -> Res<()>) -> std::process::ExitCode {
    // SAFETY: the first thing in main, no other thread exists yet.
    unsafe { tune_cpu() };
    let args = match A::try_parse() {
        Ok(a) => a,
        Err(e) => {
            let _ = e.print();
            return std::process::ExitCode::from(e.use_stderr() as u8);
        }
    };
    match run(&args) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// # Safety
/// Call first thing in `main`, before any other thread exists (mallopt and set_var are not
/// thread-safe).
pub unsafe fn tune_cpu() {
    // SAFETY: no other thread exists (the caller's promise).
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 32 << 20);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 1 << 30);
        libc::mallopt(libc::M_ARENA_MAX, 1);
    }
    if std::env::var_os("CANDLE_NUM_THREADS").is_none() {
        std::env::set_var("CANDLE_NUM_THREADS", "1");
    }
}
