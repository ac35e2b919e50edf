//! Fixed-point formats and the Rust twin of every BPF operator.
//!
//! `src/bpf/fixed.h` and `src/bpf/ops.bpf.c` define the kernel side; each function here computes
//! exactly the same integers (the test suite checks both bit for bit). A value in format Qn is
//! `round(v * 2^n)` in a signed integer. Activations saturate to ±[`ACT_MAX`], never wrap.

use crate::{Error, Result};

/// Activations, K/V cache and logits: i32 Q16 (range ±32768).
pub const Q_ACT: u32 = 16;
/// The residual stream: i64 Q32, so that it keeps ~30 significant bits even where its rms is
/// small (embeddings are ~0.03: Q16 would leave 11).
pub const Q_RES: u32 = 32;
/// Queries after q_norm and RoPE: i32 Q22 (|q| < 512); their rounding error is multiplied by the
/// keys, which reach ~1000 where `k_norm` is large.
pub const Q_Q: u32 = 22;
/// Linear weights and embeddings: i32 Q24 (|w| < 128).
pub const Q_W: u32 = 24;
/// RMSNorm weights: i32 Q20 (|w| < 2048; real Qwen3 `k_norm` exceeds Q24's range).
pub const Q_NORM: u32 = 20;
/// A normalised value x / rms inside RMSNorm.
pub const Q_NRM: u32 = 24;
/// RoPE cos/sin, the exp2 table and attention probabilities: 1.0 = 2^30.
pub const Q_ONE: u32 = 30;
/// The attention scale head_dim^-0.5.
pub const Q_SCALE: u32 = 22;
/// exp2 table resolution: 2^(-i/256) for i = 0..=256.
pub const EXP2_BITS: u32 = 8;
/// round(log2(e) * 2^30).
pub const LOG2E_Q30: i64 = 1_549_082_005;
/// Activations saturate to ±ACT_MAX.
pub const ACT_MAX: i64 = i32::MAX as i64;
/// The residual stream saturates to ±RES_MAX.
pub const RES_MAX: i64 = 1 << 62;

/// Round-half-up arithmetic shift right by `sh >= 1` (no overflow from adding 2^(sh-1)).
#[inline(always)]
pub fn rshr(v: i64, sh: u32) -> i64 {
    (v >> sh) + ((v >> (sh - 1)) & 1)
}

/// Saturates to the activation range.
#[inline(always)]
pub fn sat32(v: i64) -> i32 {
    v.clamp(-ACT_MAX, ACT_MAX) as i32
}

/// Converts `v` to fixed point with `q` fractional bits, rejecting values whose magnitude reaches
/// `2^(31-q)` (the i32 range). `name` and `index` locate the value in errors.
pub fn to_fixed(v: f32, q: u32, format: &'static str, name: &str, index: usize) -> Result<i32> {
    let max = (1u64 << (31 - q)) as f64;
    let x = (v as f64 * (1u64 << q) as f64).round();
    if !v.is_finite() {
        return Err(Error::NonFinite {
            name: name.into(),
            index,
            value: v,
        });
    }
    if x.abs() > ACT_MAX as f64 {
        return Err(Error::OutOfRange {
            name: name.into(),
            index,
            value: v,
            format,
            max,
        });
    }
    Ok(x as i32)
}

/// Saturates to the residual range.
#[inline(always)]
pub fn sat_res(v: i64) -> i64 {
    v.clamp(-RES_MAX, RES_MAX)
}

/// A fixed-point value with `q` fractional bits as f32.
pub fn from_fixed(v: i32, q: u32) -> f32 {
    (v as f64 / (1u64 << q) as f64) as f32
}

/// `round(eps * 2^64)`, the epsilon the RMSNorm operators take (eps < 1).
pub fn eps_q64(eps: f64) -> u64 {
    (eps * 18_446_744_073_709_551_616.0).round() as u64
}

/// `round(head_dim^-0.5 * 2^22)`, the attention scale.
pub fn attn_scale_q22(head_dim: usize) -> i32 {
    ((1u64 << Q_SCALE) as f64 / (head_dim as f64).sqrt()).round() as i32
}

/// The exp2 table: `round(2^30 * 2^(-i/256))` for i = 0..=256.
pub fn exp2_table() -> [u32; 257] {
    std::array::from_fn(|i| ((1u64 << Q_ONE) as f64 * (-(i as f64) / 256.0).exp2()).round() as u32)
}

/// RoPE tables, Q30, `[max_ctx][head_dim/2]` each: angle = pos * theta^(-2i/head_dim).
pub fn rope_tables(theta: f64, head_dim: usize, max_ctx: usize) -> (Vec<i32>, Vec<i32>) {
    let half = head_dim / 2;
    let one = (1u64 << Q_ONE) as f64;
    let mut cos = Vec::with_capacity(max_ctx * half);
    let mut sin = Vec::with_capacity(max_ctx * half);
    for p in 0..max_ctx {
        for i in 0..half {
            let inv_freq = 1.0 / theta.powf((2 * i) as f64 / head_dim as f64);
            let a = p as f64 * inv_freq;
            cos.push((a.cos() * one).round() as i32);
            sin.push((a.sin() * one).round() as i32);
        }
    }
    (cos, sin)
}

fn bitlen(v: u64) -> u32 {
    64 - v.leading_zeros()
}

/// floor(sqrt(v)) for v in [2^60, 2^62), as fixed.h computes it: eight Newton steps, one correction.
fn isqrt(v: u64) -> u64 {
    let mut r = 1u64 << 31;
    for _ in 0..8 {
        r = (r + v / r) >> 1;
    }
    if r * r > v {
        r -= 1;
    }
    r
}

/// exp(-a) in Q30 for `a >= 0` in Q16, from the exp2 table with linear interpolation.
pub fn exp_neg(a: u64, tab: &[u32; 257]) -> u64 {
    let t = a.wrapping_mul(LOG2E_Q30 as u64) >> Q_ONE;
    let (ip, fr) = (t >> 16, t & 0xffff);
    let (idx, lo) = (
        (fr >> (16 - EXP2_BITS)) as usize & 255,
        fr & ((1 << (16 - EXP2_BITS)) - 1),
    );
    if ip >= 31 {
        return 0;
    }
    let (t0, t1) = (tab[idx] as u64, tab[idx + 1] as u64);
    let v = t0 - (((t0 - t1) * lo) >> (16 - EXP2_BITS));
    if ip > 0 {
        rshr(v as i64, ip as u32) as u64
    } else {
        v
    }
}

/// silu(g) · u, both Q16.
pub fn swiglu(g: i32, u: i32, tab: &[u32; 257]) -> i32 {
    let e = exp_neg(g.unsigned_abs() as u64, tab);
    let sig = if g >= 0 {
        (1u64 << 60) / ((1u64 << 30) + e)
    } else {
        (e << 30) / ((1u64 << 30) + e)
    };
    let silu = rshr(g as i64 * sig as i64, Q_ONE);
    sat32(rshr(silu.wrapping_mul(u as i64), Q_ACT))
}

/// RMSNorm of one vector: `y = w * x / sqrt(mean(x²) + eps)`; x in Q32 (the residual stream, or
/// Q16 activations shifted left by 16), w Q20, y in Q`q_out`. Returns false (leaving y alone) for an
/// empty or over-long vector, as the kernel does.
pub fn rmsnorm(x: &[i64], w: &[i32], eps_q64: u64, q_out: u32, y: &mut [i32]) -> bool {
    let n = x.len();
    if n == 0 || n > crate::num::limits::NORM_MAX {
        return false;
    }
    let maxabs = x.iter().map(|&v| v.unsigned_abs()).max().unwrap_or(0);
    let s = bitlen(maxabs).saturating_sub(24);
    let ss: u64 = x
        .iter()
        .map(|&v| (v.unsigned_abs() >> s).pow(2))
        .fold(0u64, u64::wrapping_add);
    let v = (ss / n as u64 + if s < 32 { eps_q64 >> (2 * s) } else { 0 }).max(1);
    let e = (62 - bitlen(v)) / 2;
    let r = isqrt(v << (2 * e));
    debug_assert!(r * r <= v << (2 * e) && (r + 1) * (r + 1) > v << (2 * e));
    let inv = (1u64 << 62) / r;
    for i in 0..n {
        let nrm = rshr((x[i] >> s).wrapping_mul(inv as i64), (38 - e) & 63);
        y[i] = sat32(rshr(nrm.wrapping_mul(w[i] as i64), Q_NRM + Q_NORM - q_out));
    }
    true
}

/// Q16 activations as Q32, the form [`rmsnorm`] takes.
pub fn q16_to_q32(x: &[i32]) -> Vec<i64> {
    x.iter().map(|&v| (v as i64) << (Q_RES - Q_ACT)).collect()
}

/// RoPE of one head in place: pairs (i, i + half), cos/sin Q30 rows of this position.
pub fn rope(x: &mut [i32], cos: &[i32], sin: &[i32]) {
    let half = x.len() / 2;
    for i in 0..half {
        let (a, b, c, s) = (
            x[i] as i64,
            x[i + half] as i64,
            cos[i] as i64,
            sin[i] as i64,
        );
        x[i] = sat32(rshr(a * c - b * s, Q_ONE));
        x[i + half] = sat32(rshr(b * c + a * s, Q_ONE));
    }
}

/// Per-head q_norm / k_norm then RoPE, in place, for the query heads in `q` (Q16 in, Q22 out) and
/// the key heads in `k` (Q16), each `hd` wide.
#[allow(clippy::too_many_arguments)]
pub fn qk_norm_rope(
    q: &mut [i32],
    k: &mut [i32],
    q_norm: &[i32],
    k_norm: &[i32],
    cos: &[i32],
    sin: &[i32],
    hd: usize,
    eps_q64: u64,
) {
    for (heads, w, q_out) in [(q, q_norm, Q_Q), (k, k_norm, Q_ACT)] {
        for h in heads.chunks_exact_mut(hd) {
            let x = q16_to_q32(h);
            rmsnorm(&x, w, eps_q64, q_out, h);
            rope(h, cos, sin);
        }
    }
}

/// `Σ w[j] x[j]`, Q24 × Q16 → Q40, wrapping like the kernel's s64.
#[inline(always)]
pub fn dot_q24(w: &[i32], x: &[i32]) -> i64 {
    w.iter()
        .zip(x)
        .fold(0i64, |acc, (&a, &b)| acc.wrapping_add(a as i64 * b as i64))
}

/// `y[r] = sat(round(W[r]·x / 2^24))` (Q16) for r in `rows`; W is `[rows][k]` Q24, k = x.len().
pub fn matvec(w: &[i32], x: &[i32], rows: std::ops::Range<usize>, y: &mut [i32]) {
    let k = x.len();
    for r in rows {
        y[r] = sat32(rshr(dot_q24(&w[r * k..(r + 1) * k], x), Q_W));
    }
}

/// The residual add: `y[r] = sat(y[r] + round(W[r]·x / 2^8))`, y the i64 Q32 residual stream.
pub fn matvec_residual(w: &[i32], x: &[i32], rows: std::ops::Range<usize>, y: &mut [i64]) {
    let k = x.len();
    for r in rows {
        y[r] = sat_res(y[r].wrapping_add(rshr(
            dot_q24(&w[r * k..(r + 1) * k], x),
            Q_W + Q_ACT - Q_RES,
        )));
    }
}

/// The fused MLP half: `y[r] = silu(gate[r]·x) * (up[r]·x)` for r in `rows`.
pub fn gate_up_swiglu(
    gate: &[i32],
    up: &[i32],
    x: &[i32],
    rows: std::ops::Range<usize>,
    tab: &[u32; 257],
    y: &mut [i32],
) {
    let k = x.len();
    for r in rows {
        let g = sat32(rshr(dot_q24(&gate[r * k..(r + 1) * k], x), Q_W));
        let u = sat32(rshr(dot_q24(&up[r * k..(r + 1) * k], x), Q_W));
        y[r] = swiglu(g, u, tab);
    }
}

/// Logits for `rows` (written into `y` when given) and their argmax (first on ties).
pub fn lm_head_argmax(
    w: &[i32],
    x: &[i32],
    rows: std::ops::Range<usize>,
    mut y: Option<&mut [i32]>,
) -> (usize, i32) {
    let k = x.len();
    let (mut best, mut best_val) = (rows.start, -ACT_MAX - 1);
    for r in rows {
        let l = sat32(rshr(dot_q24(&w[r * k..(r + 1) * k], x), Q_W));
        if let Some(y) = y.as_deref_mut() {
            y[r] = l;
        }
        if (l as i64) > best_val {
            best_val = l as i64;
            best = r;
        }
    }
    (best, best_val as i32)
}

/// Shapes of one attention step.
#[derive(Debug, Clone, Copy)]
pub struct AttnShape {
    /// Query heads.
    pub n_q: usize,
    /// Key/value heads.
    pub n_kv: usize,
    /// Head width.
    pub hd: usize,
    /// KV-cache capacity in positions.
    pub max_ctx: usize,
}

/// Causal GQA attention at `pos`: writes k, v (`[n_kv*hd]`) into the caches (`[max_ctx][n_kv*hd]`),
/// then `out[h] = softmax(q_h·K / sqrt(hd)) V` for each query head. Mirrors `attention` in
/// ops.bpf.c step for step.
#[allow(clippy::too_many_arguments)]
pub fn attention(
    q: &[i32],
    k: &[i32],
    v: &[i32],
    k_cache: &mut [i32],
    v_cache: &mut [i32],
    pos: usize,
    s: AttnShape,
    scale_q22: i32,
    tab: &[u32; 257],
    out: &mut [i32],
) {
    let (hd, kvd) = (s.hd, s.n_kv * s.hd);
    k_cache[pos * kvd..(pos + 1) * kvd].copy_from_slice(k);
    v_cache[pos * kvd..(pos + 1) * kvd].copy_from_slice(v);
    let group = s.n_q / s.n_kv;
    let mut p = vec![0u32; pos + 1];
    let mut acc = vec![0i64; hd];
    for h in 0..s.n_q {
        let kvh = h / group;
        let qh = &q[h * hd..(h + 1) * hd];
        // 1. scores in Q16 and their maximum
        let mut m = -ACT_MAX;
        for (t, pt) in p.iter_mut().enumerate() {
            let kt = &k_cache[t * kvd + kvh * hd..t * kvd + (kvh + 1) * hd];
            let dot = qh
                .iter()
                .zip(kt)
                .fold(0i64, |a, (&x, &y)| a.wrapping_add(x as i64 * y as i64));
            let sc = rshr(dot, Q_Q).clamp(-(1 << 40), 1 << 40);
            let sc = sat32(rshr(sc * scale_q22 as i64, Q_SCALE)) as i64;
            *pt = sc as i32 as u32;
            m = m.max(sc);
        }
        // 2. exp(s - m) in Q30 and the sum
        let mut sum = 0u64;
        for pt in p.iter_mut() {
            let d = ((m - (*pt as i32) as i64) as u64).min(ACT_MAX as u64);
            *pt = exp_neg(d, tab) as u32;
            sum += *pt as u64;
        }
        // 3. probabilities (Q30) times values
        acc.iter_mut().for_each(|a| *a = 0);
        for (t, &pt) in p.iter().enumerate() {
            let pr = (((pt as u64) << Q_ONE) / sum) as i64;
            let vt = &v_cache[t * kvd + kvh * hd..t * kvd + (kvh + 1) * hd];
            for d in 0..hd {
                acc[d] = acc[d].wrapping_add(pr * vt[d] as i64);
            }
        }
        for d in 0..hd {
            out[h * hd + d] = sat32(rshr(acc[d], Q_ONE));
        }
    }
}

/// `x = embed[token]`, Q24 → the Q32 residual stream (exact).
pub fn embed(table: &[i32], token: usize, dim: usize, x: &mut [i64]) {
    for (xi, &e) in x.iter_mut().zip(&table[token * dim..(token + 1) * dim]) {
        *xi = (e as i64) << (Q_RES - Q_W);
    }
}
