//! The int8 KV-cache format and the Rust twin of its attention (`src/bpf/kv8.inc.c`).
//!
//! Per layer, position and kv head, K and V each keep `head_dim` signed 8-bit codes and one u32
//! step (Q23): `step = ceil(amax * 128 / 127)` for the row's largest |x| (Q16), and
//! `code = round(|x| * 128 / step)` with x's sign, so `x ≈ code * step / 2^7`. At head_dim 128 a
//! head's row costs 132 bytes instead of Q16's 512.
//!
//! Keys are smoothed first: Qwen3's `k_norm` weights are 60–90 on a few channels and about 1
//! elsewhere, so with one step per row the ordinary channels would keep one or two codes. Each
//! layer has a shift per channel ([`key_shifts`], from its `k_norm` weights): keys are quantised
//! as `round(k / 2^sh)` and queries multiplied by `2^sh`, which leaves every `q·k` unchanged.
//!
//! Attention packs the query heads of a GQA group two at a time into the two signed 32-bit lanes
//! of a u64, so one 64-bit multiply by a key or value code serves both heads (see the header
//! comment of `kv8.inc.c` for the bounds that keep the lanes from carrying). Every function here
//! computes the same integers as the kernel, step for step.

use crate::num::fixed::{exp_neg, rshr, sat32, AttnShape, ACT_MAX, Q_ONE, Q_SCALE};

/// Largest packed query code.
pub const QMAX: u64 = 32767;
/// Largest head_dim the lane algebra allows (`32767 * 127 * 512 < 2^31`).
pub const HD_MAX: usize = 512;

/// Bytes per layer, position and kv head of one of K or V: the codes and the step.
pub fn row_bytes(hd: usize) -> usize {
    hd + 4
}

/// Largest key smoothing shift.
pub const SHIFT_MAX: u32 = 16;

/// A layer's key smoothing shifts `[hd]` from its `k_norm` weights (Q20): for each RoPE pair of
/// channels `(j, j + hd/2)` (which RoPE mixes), `floor(log2(m / median))` clamped to
/// `0..=SHIFT_MAX`, where m is the pair's larger |weight| and the median is over all pairs.
pub fn key_shifts(k_norm_q20: &[i32]) -> Vec<u8> {
    let hd = k_norm_q20.len();
    let half = hd / 2;
    let pair = |j: usize| -> u64 {
        let a = (k_norm_q20[j] as i64).unsigned_abs();
        if j < half {
            a.max((k_norm_q20[j + half] as i64).unsigned_abs())
        } else {
            a
        }
    };
    let mut ms: Vec<u64> = (0..hd.div_ceil(2).max(half)).map(pair).collect();
    ms.sort_unstable();
    let base = ms.get(ms.len() / 2).copied().unwrap_or(0).max(1);
    (0..hd)
        .map(|d| {
            let m = pair(if d >= half && d < 2 * half {
                d - half
            } else {
                d
            });
            let mut sh = 0u32;
            while sh < SHIFT_MAX && base << (sh + 1) <= m {
                sh += 1;
            }
            sh as u8
        })
        .collect()
}

/// `round(x / 2^sh)` (half up), as the kernel's `kv8_smooth`.
fn smooth(x: i32, sh: u8) -> i64 {
    let k = (sh & 31) as u32;
    (x as i64 + ((1i64 << k) >> 1)) >> k
}

/// Quantises one Q16 row, each value divided by `2^sh[d]` when `sh` is given, into `codes` and
/// returns its step (Q23).
pub fn quant_row(x: &[i32], sh: Option<&[u8]>, codes: &mut [i8]) -> u32 {
    let v = |d: usize| sh.map_or(x[d] as i64, |s| smooth(x[d], s[d]));
    let amax = (0..x.len()).map(|d| v(d).unsigned_abs()).max().unwrap_or(0);
    let step = (amax * 128 + 126) / 127;
    for (d, c) in codes.iter_mut().enumerate().take(x.len()) {
        let v = v(d);
        let a = v.unsigned_abs() * 128;
        let r = if step == 0 {
            0
        } else {
            ((2 * a + step) / (2 * step)) as i64
        };
        *c = (if v < 0 { -r } else { r }) as i8;
    }
    step as u32
}

/// Lane 0 of a packed word.
fn lane0(w: u64) -> i64 {
    w as i32 as i64
}

/// Lane 1 of a packed word.
fn lane1(w: u64) -> i64 {
    (w.wrapping_sub(lane0(w) as u64) as i64) >> 32
}

/// `q[d] * 2^sh[d]`.
fn smoothed_query(q: &[i32], sh: &[u8]) -> Vec<i64> {
    q.iter()
        .zip(sh)
        .map(|(&v, &s)| (v as i64) << (s & 31))
        .collect()
}

/// The least shift e with `round(max|q| / 2^e) <= QMAX`.
fn query_shift(q: &[i64]) -> u32 {
    let m = q.iter().map(|&v| v.unsigned_abs()).max().unwrap_or(0);
    let mut e = 0u32;
    while e < 63 && ((m + ((1u64 << e) >> 1)) >> e) > QMAX {
        e += 1;
    }
    e
}

fn qcode(v: i64, e: u32) -> i64 {
    let r = ((v.unsigned_abs() + ((1u64 << e) >> 1)) >> e) as i64;
    if v < 0 {
        -r
    } else {
        r
    }
}

fn score(dot: i64, kstep: u32, e: u32, scale: i64) -> i64 {
    let s = dot.wrapping_mul(kstep as i64);
    let s = if e < 29 {
        rshr(s, 29 - e)
    } else {
        let lim = (1i64 << 40) >> (e - 29);
        s.clamp(-lim, lim) << (e - 29)
    };
    let s = s.clamp(-(1 << 40), 1 << 40);
    sat32(rshr(s * scale, Q_SCALE)) as i64
}

/// One layer's int8 cache, head-major as in the kernel: codes `[n_kv][max_ctx][hd]`, steps
/// `[n_kv][max_ctx]`, for K and V (the kernel's heads sit a page-rounded stride apart; here they
/// are dense).
#[derive(Debug, Clone)]
pub struct Cache {
    /// Key codes.
    pub k_codes: Vec<i8>,
    /// Key steps.
    pub k_steps: Vec<u32>,
    /// Value codes.
    pub v_codes: Vec<i8>,
    /// Value steps.
    pub v_steps: Vec<u32>,
}

impl Cache {
    /// An empty (zero) cache for `s`.
    pub fn new(s: AttnShape) -> Cache {
        Cache {
            k_codes: vec![0; s.max_ctx * s.n_kv * s.hd],
            k_steps: vec![0; s.max_ctx * s.n_kv],
            v_codes: vec![0; s.max_ctx * s.n_kv * s.hd],
            v_steps: vec![0; s.max_ctx * s.n_kv],
        }
    }
}

/// Causal GQA attention at `pos` over the int8 cache: quantises and appends k (smoothed by
/// `ksh`, `[hd]`) and v (`[n_kv*hd]`), then writes `out[h]` for every query head. Mirrors `attention_i8` in `kv8.inc.c` (whatever
/// split of kv heads across runs the kernel uses: heads are independent).
#[allow(clippy::too_many_arguments)]
pub fn attention(
    q: &[i32],
    k: &[i32],
    v: &[i32],
    c: &mut Cache,
    ksh: &[u8],
    pos: usize,
    s: AttnShape,
    scale_q22: i32,
    tab: &[u32; 257],
    out: &mut [i32],
) {
    let (hd, n_kv) = (s.hd, s.n_kv);
    let at = |j: usize, t: usize| j * s.max_ctx + t; // kv head j, position t
    for j in 0..n_kv {
        let at = at(j, pos);
        c.k_steps[at] = quant_row(
            &k[j * hd..(j + 1) * hd],
            Some(ksh),
            &mut c.k_codes[at * hd..(at + 1) * hd],
        );
        c.v_steps[at] = quant_row(
            &v[j * hd..(j + 1) * hd],
            None,
            &mut c.v_codes[at * hd..(at + 1) * hd],
        );
    }
    let g = s.n_q / n_kv;
    let npos = pos + 1;
    let scale = scale_q22 as i64;
    for j in 0..n_kv {
        for h0 in (j * g..(j + 1) * g).step_by(2) {
            let two = h0 + 1 < (j + 1) * g;
            let heads = if two { 2 } else { 1 };
            // 1. packed queries
            let qs: Vec<Vec<i64>> = (0..heads)
                .map(|i| smoothed_query(&q[(h0 + i) * hd..(h0 + i + 1) * hd], ksh))
                .collect();
            let e: Vec<u32> = qs.iter().map(|q| query_shift(q)).collect();
            let qq: Vec<u64> = (0..hd)
                .map(|d| {
                    let lo = qcode(qs[0][d], e[0]) as u64;
                    let hi = if two { qcode(qs[1][d], e[1]) as u64 } else { 0 };
                    lo.wrapping_add(hi << 32)
                })
                .collect();
            // 2. scores, maxima, the largest value step
            let mut p = vec![vec![0i64; npos]; heads];
            let mut m = vec![-ACT_MAX; heads];
            let mut vmax = 0u64;
            for t in 0..npos {
                let row = &c.k_codes[at(j, t) * hd..(at(j, t) + 1) * hd];
                let w = qq.iter().zip(row).fold(0u64, |a, (&x, &y)| {
                    a.wrapping_add(x.wrapping_mul(y as i64 as u64))
                });
                let kstep = c.k_steps[at(j, t)];
                for (i, lane) in [lane0(w), lane1(w)].into_iter().take(heads).enumerate() {
                    p[i][t] = score(lane, kstep, e[i], scale);
                    m[i] = m[i].max(p[i][t]);
                }
                vmax = vmax.max(c.v_steps[at(j, t)] as u64);
            }
            // 3. exp(s - m), sums
            let mut inv = [0u64; 2];
            for i in 0..heads {
                let mut sum = 0u64;
                for pt in p[i].iter_mut() {
                    let d = ((m[i] - (*pt as i32) as i64) as u64).min(ACT_MAX as u64);
                    *pt = exp_neg(d, tab) as i64;
                    sum += *pt as u64;
                }
                inv[i] = (1u64 << 62) / sum;
            }
            let invv = if vmax > 0 { (1u64 << 55) / vmax } else { 0 };
            // 4-5. packed value weights and the weighted sums of value codes
            let mut acc = vec![0u64; hd];
            for t in 0..npos {
                let r = (c.v_steps[at(j, t)] as u64 * invv) >> 32;
                let w: Vec<u64> = (0..heads)
                    .map(|i| ((((p[i][t] as u64) * inv[i]) >> 32) * r) >> Q_ONE)
                    .collect();
                let ww = w[0].wrapping_add(w.get(1).copied().unwrap_or(0) << 32);
                let row = &c.v_codes[at(j, t) * hd..(at(j, t) + 1) * hd];
                for (a, &cv) in acc.iter_mut().zip(row) {
                    *a = a.wrapping_add(ww.wrapping_mul(cv as i64 as u64));
                }
            }
            for (d, &a) in acc.iter().enumerate() {
                out[h0 * hd + d] = sat32(rshr(lane0(a) * vmax as i64, 30));
                if two {
                    out[(h0 + 1) * hd + d] = sat32(rshr(lane1(a) * vmax as i64, 30));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lanes_read_back_signed_values() {
        for (lo, hi) in [
            (5i64, -7i64),
            (-(1 << 31) + 1, (1 << 31) - 1),
            (-1, -1),
            (0, 3),
        ] {
            let w = (lo as u64).wrapping_add((hi as u64) << 32);
            assert_eq!((lane0(w), lane1(w)), (lo, hi), "lanes of {lo}, {hi}");
        }
    }

    #[test]
    fn quant_row_bounds_codes_and_reconstructs() {
        let x: Vec<i32> = (0..128).map(|i| (i - 64) * 40_000 + 17).collect();
        let mut c = vec![0i8; 128];
        let step = quant_row(&x, None, &mut c);
        let amax = x.iter().map(|v| v.unsigned_abs()).max().unwrap() as f64;
        for (&v, &q) in x.iter().zip(&c) {
            assert!((-127..=127).contains(&q));
            let back = q as f64 * step as f64 / 128.0;
            assert!(
                (back - v as f64).abs() <= amax / 127.0,
                "{v} -> {q} -> {back}"
            );
        }
        assert_eq!(
            quant_row(&[0; 8], None, &mut [0; 8]),
            0,
            "a zero row has step 0"
        );
    }

    #[test]
    fn key_shifts_single_out_large_k_norm_pairs() {
        let one = 1 << 20; // 1.0 in Q20
        let mut w = vec![one; 16];
        w[3] = 75 * one; // channel 3 and its RoPE partner 11 share a shift
        w[6] = -3 * one;
        let sh = key_shifts(&w);
        assert_eq!(sh[3], 6, "75 ~ 2^6.2");
        assert_eq!(sh[11], 6, "RoPE partner of 3");
        assert_eq!((sh[6], sh[14]), (1, 1), "|-3| ~ 2^1.6");
        assert!(sh
            .iter()
            .enumerate()
            .all(|(d, &s)| s == 0 || [3, 11, 6, 14].contains(&d)));
        assert!(
            key_shifts(&[0; 8]).iter().all(|&s| s == 0),
            "zero weights: no shifts"
        );
    }
}
