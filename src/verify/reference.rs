//! The f32 reference forward pass: the ground truth the fixed-point BPF engine is measured against.
//!
//! It follows Hugging Face transformers' `modeling_qwen3.py` operation by operation (same order of
//! multiplications inside RMSNorm, RoPE computed from `inv_freq` in f32, q/k norm before RoPE,
//! softmax in f32), one token at a time with a KV cache, in the style of llama2.c's `run.c`: one
//! flat pass (`Reference::step`, behind [`Reference::forward`]) with numbered steps and the shape of every buffer written beside it.
//! Names mirror the HF tensors (`q_proj`, `input_layernorm`, `query_states`, ...).
//!
//! The only deliberate departure from a naive loop is the dot product, which accumulates in 16
//! independent f32 lanes so that the compiler vectorises it; that changes the summation order (as
//! any BLAS does) and moves results by a few ulps. Large matrix-vector products are split by rows
//! across threads; every row is still computed by the same code, so the result does not depend on
//! the thread count.

use std::sync::{Mutex, PoisonError};

use crate::{Checkpoint, Config, Error, Result};

/// Matrix-vector products with at least this many multiply-adds are split across threads.
const PARALLEL_MIN_MACS: usize = 1 << 18;
/// Upper bound on the threads a matrix-vector product is split across.
const MAX_THREADS: usize = 8;

/// One decoder layer: its weights (row-major `[out, in]`, exactly as stored in the checkpoint) and
/// its slice of the KV cache.
struct Layer {
    input_layernorm: Vec<f32>,          // [hidden]
    q_proj: Vec<f32>,                   // [n_heads * head_dim, hidden]
    k_proj: Vec<f32>,                   // [n_kv * head_dim, hidden]
    v_proj: Vec<f32>,                   // [n_kv * head_dim, hidden]
    o_proj: Vec<f32>,                   // [hidden, n_heads * head_dim]
    q_norm: Vec<f32>,                   // [head_dim]
    k_norm: Vec<f32>,                   // [head_dim]
    post_attention_layernorm: Vec<f32>, // [hidden]
    gate_proj: Vec<f32>,                // [intermediate, hidden]
    up_proj: Vec<f32>,                  // [intermediate, hidden]
    down_proj: Vec<f32>,                // [hidden, intermediate]
    /// Keys after q/k-norm and RoPE: `[position, n_kv * head_dim]`, grown one row per token,
    /// capacity reserved for `max_context` rows.
    key_cache: Vec<f32>,
    /// Values: `[position, n_kv * head_dim]`, like `key_cache`.
    value_cache: Vec<f32>,
}

/// Activations of the token being computed (llama2.c's `RunState`).
struct Scratch {
    hidden_states: Vec<f32>, // [hidden]        the residual stream
    normed: Vec<f32>,        // [hidden]        RMSNorm(hidden_states)
    query_states: Vec<f32>,  // [n_heads * hd]  q_proj, then q_norm, then RoPE, per head
    key_states: Vec<f32>,    // [n_kv * hd]     k_proj, then k_norm, then RoPE, per head
    value_states: Vec<f32>,  // [n_kv * hd]     v_proj
    attn_output: Vec<f32>,   // [n_heads * hd]  Σ_t softmax(scores)_t · v_t, per head
    attn_weights: Vec<f32>,  // [position + 1]  one head's scores, then probabilities
    proj_out: Vec<f32>,      // [hidden]        o_proj or down_proj output, added to the residual
    gate: Vec<f32>,          // [intermediate]  gate_proj, then silu(gate) * up
    up: Vec<f32>,            // [intermediate]  up_proj
    cos: Vec<f32>,           // [hd / 2]        cos(position · inv_freq); emb = cat(freqs, freqs)
    sin: Vec<f32>,           // [hd / 2]        sin(position · inv_freq)
    logits: Vec<f32>,        // [vocab]         lm_head · normed
}

/// The f32 Qwen3 model with its KV cache: feed tokens one at a time, get next-token logits.
pub struct Reference {
    cfg: Config,
    max_context: usize,
    pos: usize,
    threads: usize,
    embed_tokens: Vec<f32>,    // [vocab, hidden]
    layers: Vec<Layer>,        // [num_hidden_layers]
    norm: Vec<f32>,            // [hidden]          model.norm
    lm_head: Option<Vec<f32>>, // [vocab, hidden]  None: tied to embed_tokens
    inv_freq: Vec<f32>,        // [hd / 2]          RoPE inverse frequencies
    s: Scratch,
}

impl std::fmt::Debug for Reference {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reference")
            .field("layers", &self.layers.len())
            .field("hidden_size", &self.cfg.hidden_size)
            .field("vocab_size", &self.cfg.vocab_size)
            .field("position", &self.pos)
            .field("max_context", &self.max_context)
            .finish()
    }
}

/// A zeroed buffer of `n` floats, reporting (rather than aborting on) allocation failure.
/// The index of the largest logit, the first on ties (as the BPF LM head's argmax); 0 for an
/// empty slice.
pub fn argmax(logits: &[f32]) -> usize {
    let mut best = 0;
    for (i, &x) in logits.iter().enumerate() {
        if x > logits[best] {
            best = i;
        }
    }
    best
}

/// `log softmax(logits)` in f64, shifted by the maximum so that no exponential overflows.
pub fn log_softmax(logits: &[f32]) -> Vec<f64> {
    let max = logits
        .iter()
        .fold(f64::NEG_INFINITY, |m, &x| m.max(x as f64));
    let log_sum = logits
        .iter()
        .map(|&x| (x as f64 - max).exp())
        .sum::<f64>()
        .ln();
    logits.iter().map(|&x| x as f64 - max - log_sum).collect()
}

/// KL(p ‖ q) in nats between the softmaxes of logits `p` (the reference's) and `q` (an
/// engine's), in f64.
pub fn kl_divergence(p: &[f32], q: &[f32]) -> f64 {
    let (lp, lq) = (log_softmax(p), log_softmax(q));
    lp.iter().zip(&lq).map(|(a, b)| a.exp() * (a - b)).sum()
}

fn zeros(n: usize, what: &str) -> Result<Vec<f32>> {
    let mut v = Vec::new();
    v.try_reserve_exact(n).map_err(|e| Error::Resources {
        msg: format!("{what}: {n} f32: {e}"),
    })?;
    v.resize(n, 0.0);
    Ok(v)
}

/// Reads tensor `name` and checks it holds `len` values (the checkpoint checked the shape at open;
/// this guards against a config edited after that).
fn load(ck: &Checkpoint, name: &str, len: usize) -> Result<Vec<f32>> {
    let t = ck.tensor_f32(name)?;
    if t.len() != len {
        return Err(Error::Invalid(format!(
            "tensor `{name}` holds {} values, the config implies {len}",
            t.len()
        )));
    }
    Ok(t)
}

impl Reference {
    /// Loads every weight of `ck` as f32 and reserves a KV cache for `max_context` positions.
    ///
    /// `lm_head` is `embed_tokens` when `tie_word_embeddings` is set (an `lm_head.weight` in the
    /// file is then ignored, as transformers does). Errors from reading tensors (e.g.
    /// [`Error::NonFinite`]) propagate; `max_context == 0` is [`Error::Invalid`]; a KV cache that
    /// cannot be allocated is [`Error::Resources`].
    pub fn new(ck: &Checkpoint, max_context: usize) -> Result<Reference> {
        let cfg = ck.config.clone();
        cfg.validate(&ck.dir().join("config.json"))?;
        if max_context == 0 {
            return Err(Error::Invalid("max_context must be at least 1".into()));
        }
        let (hidden, inter, hd) = (cfg.hidden_size, cfg.intermediate_size, cfg.head_dim());
        let (q_dim, kv_dim, vocab) = (cfg.q_dim(), cfg.kv_dim(), cfg.vocab_size);
        let cache_len = max_context
            .checked_mul(kv_dim)
            .ok_or_else(|| Error::Resources {
                msg: format!("KV cache for max_context {max_context} overflows"),
            })?;

        let embed_tokens = load(ck, "model.embed_tokens.weight", vocab * hidden)?;
        let mut layers = Vec::with_capacity(cfg.num_hidden_layers);
        for l in 0..cfg.num_hidden_layers {
            let t =
                |name: &str, len: usize| load(ck, &format!("model.layers.{l}.{name}.weight"), len);
            let reserve = |what: &str| -> Result<Vec<f32>> {
                let mut v = Vec::new();
                v.try_reserve_exact(cache_len)
                    .map_err(|e| Error::Resources {
                        msg: format!(
                            "layer {l} {what} cache, {max_context} positions × {kv_dim} f32: {e}"
                        ),
                    })?;
                Ok(v)
            };
            layers.push(Layer {
                input_layernorm: t("input_layernorm", hidden)?,
                q_proj: t("self_attn.q_proj", q_dim * hidden)?,
                k_proj: t("self_attn.k_proj", kv_dim * hidden)?,
                v_proj: t("self_attn.v_proj", kv_dim * hidden)?,
                o_proj: t("self_attn.o_proj", hidden * q_dim)?,
                q_norm: t("self_attn.q_norm", hd)?,
                k_norm: t("self_attn.k_norm", hd)?,
                post_attention_layernorm: t("post_attention_layernorm", hidden)?,
                gate_proj: t("mlp.gate_proj", inter * hidden)?,
                up_proj: t("mlp.up_proj", inter * hidden)?,
                down_proj: t("mlp.down_proj", hidden * inter)?,
                key_cache: reserve("key")?,
                value_cache: reserve("value")?,
            });
        }
        let norm = load(ck, "model.norm.weight", hidden)?;
        let lm_head = if cfg.tie_word_embeddings {
            None
        } else {
            Some(load(ck, "lm_head.weight", vocab * hidden)?)
        };

        // HF `_compute_default_rope_parameters`, all in f32:
        //   inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
        let base = cfg.rope_theta() as f32;
        let inv_freq: Vec<f32> = (0..hd)
            .step_by(2)
            .map(|i| 1.0f32 / base.powf(i as f32 / hd as f32))
            .collect();

        let s = Scratch {
            hidden_states: zeros(hidden, "hidden_states")?,
            normed: zeros(hidden, "normed")?,
            query_states: zeros(q_dim, "query_states")?,
            key_states: zeros(kv_dim, "key_states")?,
            value_states: zeros(kv_dim, "value_states")?,
            attn_output: zeros(q_dim, "attn_output")?,
            attn_weights: Vec::new(),
            proj_out: zeros(hidden, "proj_out")?,
            gate: zeros(inter, "gate")?,
            up: zeros(inter, "up")?,
            cos: zeros(hd / 2, "cos")?,
            sin: zeros(hd / 2, "sin")?,
            logits: zeros(vocab, "logits")?,
        };
        // One thread by default: at the full shape the products are memory-bound (2.4 GB of f32
        // weights per token), and a second thread measured no faster on 2 cores, slower when busy.
        let threads = 1;
        Ok(Reference {
            cfg,
            max_context,
            pos: 0,
            threads,
            embed_tokens,
            layers,
            norm,
            lm_head,
            inv_freq,
            s,
        })
    }

    /// The model's hyper-parameters.
    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// Tokens fed so far: the position the next token will take.
    pub fn position(&self) -> usize {
        self.pos
    }

    /// The KV-cache capacity given to [`Reference::new`].
    pub fn max_context(&self) -> usize {
        self.max_context
    }

    /// Sets the threads large matrix-vector products are split across (clamped to 1..=8; the
    /// default is 1). Results are bit-identical for every setting.
    pub fn set_threads(&mut self, threads: usize) {
        self.threads = threads.clamp(1, MAX_THREADS);
    }

    /// Empties the KV cache: the next token is at position 0 again.
    pub fn reset(&mut self) {
        self.pos = 0;
        for layer in &mut self.layers {
            layer.key_cache.clear();
            layer.value_cache.clear();
        }
    }

    /// Keeps only the first `position` tokens of the context. A position beyond the current one
    /// is [`Error::InvalidParameter`] (and changes nothing).
    pub fn rewind(&mut self, position: usize) -> Result<()> {
        crate::types::check_rewind(position, self.pos)?;
        let kept = position * self.cfg.kv_dim();
        for layer in &mut self.layers {
            layer.key_cache.truncate(kept);
            layer.value_cache.truncate(kept);
        }
        self.pos = position;
        Ok(())
    }

    /// Feeds `token` at the current position and returns the logits `[vocab]` for the next
    /// token, borrowed until the next call (as [`crate::Model::forward`]).
    ///
    /// Fails with [`Error::TokenOutOfRange`] if `token` is not below the vocabulary size and with
    /// [`Error::ContextOverflow`] if the KV cache is full; in both cases nothing changes.
    pub fn forward(&mut self, token: u32) -> Result<&[f32]> {
        self.step(token)?;
        Ok(&self.s.logits)
    }

    /// One decoder pass at the current position: the logits land in `self.s.logits`.
    fn step(&mut self, token: u32) -> Result<()> {
        let cfg = &self.cfg;
        let (hidden, hd) = (cfg.hidden_size, cfg.head_dim());
        let n_heads = cfg.num_attention_heads;
        let kv_dim = cfg.kv_dim();
        let group = cfg.gqa_ratio(); // query heads per kv head
        let half = hd / 2;
        let eps = cfg.rms_norm_eps as f32;
        let pos = self.pos;
        let threads = self.threads;

        crate::types::check_feed(&[token], pos, self.max_context, cfg.vocab_size)?;
        let s = &mut self.s;

        // 1. Embedding: hidden_states = embed_tokens[token]                          [hidden]
        let row = token as usize * hidden;
        s.hidden_states
            .copy_from_slice(&self.embed_tokens[row..row + hidden]);

        // 2. RoPE tables for this position (HF Qwen3RotaryEmbedding, in f32):
        //    freqs = position · inv_freq; emb = cat(freqs, freqs); cos = emb.cos(), sin = emb.sin().
        //    The two halves of emb are equal, so only hd/2 values are kept.           [hd/2]
        for i in 0..half {
            let freq = pos as f32 * self.inv_freq[i];
            s.cos[i] = freq.cos();
            s.sin[i] = freq.sin();
        }

        // HF `1 / sqrt(head_dim)` as `head_dim ** -0.5`, a Python float used on f32 tensors.
        let scaling = (hd as f64).powf(-0.5) as f32;

        for layer in &mut self.layers {
            // 3. normed = RMSNorm(hidden_states; input_layernorm)                         [hidden]
            rms_norm(&mut s.normed, &s.hidden_states, &layer.input_layernorm, eps);

            // 4. Projections: query_states = q_proj · normed                         [n_heads*hd]
            //                 key_states   = k_proj · normed                            [n_kv*hd]
            //                 value_states = v_proj · normed                            [n_kv*hd]
            matvec(&mut s.query_states, &layer.q_proj, &s.normed, threads);
            matvec(&mut s.key_states, &layer.k_proj, &s.normed, threads);
            matvec(&mut s.value_states, &layer.v_proj, &s.normed, threads);

            // 5. Per-head q_norm / k_norm (RMSNorm over head_dim), BEFORE RoPE.
            for q in s.query_states.chunks_exact_mut(hd) {
                rms_norm_in_place(q, &layer.q_norm, eps);
            }
            for k in s.key_states.chunks_exact_mut(hd) {
                rms_norm_in_place(k, &layer.k_norm, eps);
            }

            // 6. RoPE on every head of q and k: x' = x·cos + rotate_half(x)·sin, where
            //    rotate_half(x) = cat(-x[hd/2:], x[:hd/2]): dimension i pairs with i + hd/2.
            for x in s
                .query_states
                .chunks_exact_mut(hd)
                .chain(s.key_states.chunks_exact_mut(hd))
            {
                apply_rope(x, &s.cos, &s.sin);
            }

            // 7. Append this position's k and v to the cache: key_cache, value_cache [pos+1, n_kv*hd]
            layer.key_cache.extend_from_slice(&s.key_states);
            layer.value_cache.extend_from_slice(&s.value_states);

            // 8. Attention, one query head at a time. GQA: query head h reads kv head h / group.
            let n_pos = pos + 1;
            s.attn_weights.resize(n_pos, 0.0);
            for h in 0..n_heads {
                let q = &s.query_states[h * hd..(h + 1) * hd]; //                          [hd]
                let kv_off = (h / group) * hd;
                // 8a. scores[t] = (q · k_t) · hd^-0.5 for t ≤ pos (causal: nothing later exists)
                for t in 0..n_pos {
                    let k = &layer.key_cache[t * kv_dim + kv_off..][..hd];
                    s.attn_weights[t] = dot(q, k) * scaling;
                }
                // 8b. softmax in f32, max subtracted                                    [pos+1]
                softmax(&mut s.attn_weights);
                // 8c. attn_output[h] = Σ_t p_t · v_t                                         [hd]
                let out = &mut s.attn_output[h * hd..(h + 1) * hd];
                out.fill(0.0);
                for t in 0..n_pos {
                    let p = s.attn_weights[t];
                    let v = &layer.value_cache[t * kv_dim + kv_off..][..hd];
                    for (o, &vi) in out.iter_mut().zip(v) {
                        *o += p * vi;
                    }
                }
            }

            // 9. o_proj and residual: hidden_states += o_proj · attn_output              [hidden]
            matvec(&mut s.proj_out, &layer.o_proj, &s.attn_output, threads);
            for (x, &o) in s.hidden_states.iter_mut().zip(&s.proj_out) {
                *x += o;
            }

            // 10. normed = RMSNorm(hidden_states; post_attention_layernorm)              [hidden]
            rms_norm(
                &mut s.normed,
                &s.hidden_states,
                &layer.post_attention_layernorm,
                eps,
            );

            // 11. MLP: gate = gate_proj · normed, up = up_proj · normed            [intermediate]
            //          gate = silu(gate) * up, silu(z) = z / (1 + exp(-z))         [intermediate]
            matvec(&mut s.gate, &layer.gate_proj, &s.normed, threads);
            matvec(&mut s.up, &layer.up_proj, &s.normed, threads);
            for (g, &u) in s.gate.iter_mut().zip(&s.up) {
                *g = silu(*g) * u;
            }

            // 12. down_proj and residual: hidden_states += down_proj · gate              [hidden]
            matvec(&mut s.proj_out, &layer.down_proj, &s.gate, threads);
            for (x, &o) in s.hidden_states.iter_mut().zip(&s.proj_out) {
                *x += o;
            }
        }

        // 13. Final norm: normed = RMSNorm(hidden_states; model.norm)                     [hidden]
        rms_norm(&mut s.normed, &s.hidden_states, &self.norm, eps);

        // 14. logits = lm_head · normed (lm_head = embed_tokens when tied)                 [vocab]
        let lm_head = self.lm_head.as_deref().unwrap_or(&self.embed_tokens);
        matvec(&mut s.logits, lm_head, &s.normed, threads); //                           [vocab]

        self.pos += 1;
        Ok(())
    }
}

crate::forward::impl_forward!(Reference);

/// HF `Qwen3RMSNorm`: `out = weight * (x * rsqrt(mean(x²) + eps))`, variance in f32.
fn rms_norm(out: &mut [f32], x: &[f32], weight: &[f32], eps: f32) {
    let r = rsqrt_mean_square(x, eps);
    for ((o, &xi), &w) in out.iter_mut().zip(x).zip(weight) {
        *o = w * (xi * r);
    }
}

/// [`rms_norm`] in place (per-head q_norm / k_norm).
fn rms_norm_in_place(x: &mut [f32], weight: &[f32], eps: f32) {
    let r = rsqrt_mean_square(x, eps);
    for (xi, &w) in x.iter_mut().zip(weight) {
        *xi = w * (*xi * r);
    }
}

/// `rsqrt(mean(x²) + eps)` in f32.
fn rsqrt_mean_square(x: &[f32], eps: f32) -> f32 {
    let variance = dot(x, x) / x.len() as f32;
    1.0 / (variance + eps).sqrt()
}

/// HF `apply_rotary_pos_emb` on one head `x` `[hd]`: `x·cos + rotate_half(x)·sin`, with
/// `rotate_half(x) = cat(-x[hd/2:], x[:hd/2])` and `cos`, `sin` the first half of `cat(c, c)`.
fn apply_rope(x: &mut [f32], cos: &[f32], sin: &[f32]) {
    let half = x.len() / 2;
    let (lo, hi) = x.split_at_mut(half);
    for i in 0..half {
        let (a, b) = (lo[i], hi[i]);
        lo[i] = a * cos[i] + (-b) * sin[i];
        hi[i] = b * cos[i] + a * sin[i];
    }
}

/// Softmax in place, in f32: `exp(x - max) / Σ exp(x - max)`.
fn softmax(x: &mut [f32]) {
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0.0f32;
    for v in x.iter_mut() {
        *v = (*v - max).exp();
        sum += *v;
    }
    for v in x.iter_mut() {
        *v /= sum;
    }
}

/// SiLU as torch computes it: `z / (1 + exp(-z))`.
fn silu(z: f32) -> f32 {
    z / (1.0 + (-z).exp())
}

/// Dot product accumulated in 16 independent f32 lanes (so the loop vectorises), lanes then summed
/// pairwise, tail added last.
#[inline]
fn dot(a: &[f32], b: &[f32]) -> f32 {
    const LANES: usize = 16;
    let n = a.len().min(b.len());
    let (a, b) = (&a[..n], &b[..n]);
    let (ac, bc) = (a.chunks_exact(LANES), b.chunks_exact(LANES));
    let mut tail = 0.0f32;
    for (&x, &y) in ac.remainder().iter().zip(bc.remainder()) {
        tail += x * y;
    }
    let mut acc = [0.0f32; LANES];
    for (x, y) in ac.zip(bc) {
        for i in 0..LANES {
            acc[i] += x[i] * y[i];
        }
    }
    let mut width = LANES;
    while width > 1 {
        width /= 2;
        for i in 0..width {
            acc[i] += acc[i + width];
        }
    }
    acc[0] + tail
}

/// `out = w · x` for row-major `w` `[out.len(), x.len()]`, single-threaded.
fn matvec_rows(out: &mut [f32], w: &[f32], x: &[f32]) {
    for (o, row) in out.iter_mut().zip(w.chunks_exact(x.len())) {
        *o = dot(row, x);
    }
}

/// `out = w · x` for row-major `w` `[out.len(), x.len()]`; large products are split into one block
/// of rows per thread, up to `threads` scoped threads. The calling thread then works through every
/// block no thread has taken, so a thread that cannot be spawned costs speed, never correctness.
fn matvec(out: &mut [f32], w: &[f32], x: &[f32], threads: usize) {
    let cols = x.len();
    debug_assert_eq!(w.len(), out.len() * cols);
    if cols == 0 {
        out.fill(0.0);
        return;
    }
    let threads = if out.len() * cols >= PARALLEL_MIN_MACS {
        threads.min(out.len())
    } else {
        1
    };
    if threads <= 1 {
        matvec_rows(out, w, x);
        return;
    }
    let rows_per = out.len().div_ceil(threads);
    type Block<'a> = Mutex<Option<(&'a mut [f32], &'a [f32])>>;
    let blocks: Vec<Block> = out
        .chunks_mut(rows_per)
        .zip(w.chunks(rows_per * cols))
        .map(|b| Mutex::new(Some(b)))
        .collect();
    let run = |block: &Block| {
        let job = block.lock().unwrap_or_else(PoisonError::into_inner).take();
        if let Some((o, wb)) = job {
            matvec_rows(o, wb, x);
        }
    };
    let run = &run;
    std::thread::scope(|scope| {
        for block in &blocks[1..] {
            // On failure the closure is dropped unrun and the loop below does the block.
            let _ = std::thread::Builder::new().spawn_scoped(scope, move || run(block));
        }
        for block in &blocks {
            run(block);
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn comparison_metrics() {
        assert_eq!(
            argmax(&[1.0, 3.0, 2.0, 3.0]),
            1,
            "argmax: the first of equal maxima"
        );
        let p = [0.0f32, (2.0f32).ln()]; // softmax 1/3, 2/3
        let lp = log_softmax(&p);
        assert!(
            (lp[0] - (1.0f64 / 3.0).ln()).abs() < 1e-7,
            "log_softmax: {lp:?}"
        );
        assert!(
            (lp[1] - (2.0f64 / 3.0).ln()).abs() < 1e-7,
            "log_softmax: {lp:?}"
        );
        assert_eq!(
            kl_divergence(&p, &p),
            0.0,
            "KL of a distribution with itself"
        );
        // KL((1/3, 2/3) ‖ (1/2, 1/2)) = 1/3 ln(2/3) + 2/3 ln(4/3)
        let want = (2.0f64 / 3.0).ln() / 3.0 + 2.0 * (4.0f64 / 3.0).ln() / 3.0;
        let got = kl_divergence(&p, &[5.0, 5.0]);
        assert!((got - want).abs() < 1e-7, "KL: {got} vs {want}");
    }

    #[test]
    fn dot_matches_naive_sum() {
        for n in [0, 1, 15, 16, 17, 100, 1024] {
            let a: Vec<f32> = (0..n).map(|i| ((i * 7 % 13) as f32 - 6.0) / 8.0).collect();
            let b: Vec<f32> = (0..n).map(|i| ((i * 5 % 11) as f32 - 5.0) / 4.0).collect();
            let naive: f64 = a.iter().zip(&b).map(|(&x, &y)| x as f64 * y as f64).sum();
            assert!((dot(&a, &b) as f64 - naive).abs() < 1e-4, "n {n}");
        }
    }

    #[test]
    fn threaded_matvec_is_bit_identical() {
        let (rows, cols) = (1000, 512);
        let w: Vec<f32> = (0..rows * cols)
            .map(|i| ((i * 2654435761usize) % 1000) as f32 / 1000.0 - 0.5)
            .collect();
        let x: Vec<f32> = (0..cols).map(|i| (i as f32).sin()).collect();
        let mut one = vec![0.0; rows];
        let mut many = vec![0.0; rows];
        matvec(&mut one, &w, &x, 1);
        matvec(&mut many, &w, &x, 3);
        assert_eq!(one, many);
    }

    #[test]
    fn rope_pairs_i_with_i_plus_half() {
        // Position with cos = 0, sin = 1 for every frequency: x' = rotate_half(x).
        let mut x = [1.0, 2.0, 3.0, 4.0];
        apply_rope(&mut x, &[0.0, 0.0], &[1.0, 1.0]);
        assert_eq!(x, [-3.0, -4.0, 1.0, 2.0]);
    }
}
