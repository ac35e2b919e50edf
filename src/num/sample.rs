//! The integer sampler: the Rust twin of `src/bpf/sample.inc.c`'s `op_sample`, drawing the next
//! token from Q16 logits with fixed-point parameters ([`Params`]) and a splitmix64 generator.
//! The same logits, counts, parameters and state give the same token and the same new state as
//! the BPF function, bit for bit (`tests/sample_kernel.rs`).
//!
//! The steps (llama.cpp's order; docs/sampling.md has the spec and what differs from the f32
//! [`Sampler`](crate::Sampler)), tokens ordered by `d = vmax - v` ascending, then id:
//!
//! 1. penalties on the tokens counted in `counts` ([`penalise`]), written back into the logits;
//! 2. `vmax`, the largest penalised logit; temperature 0 returns the first token reaching it;
//! 3. top-k: the `k` first tokens in that order;
//! 4. top-p, at temperature 1 over what top-k kept: `w1 = exp(-d)` in Q30 ([`exp_neg`]), the
//!    shortest prefix whose `w1` sum reaches `floor(S1 · top_p / 2^16)`;
//! 5. min-p: only tokens with `w1 ≥ min_p · 2^14`;
//! 6. the draw: `wT = exp(-d / T)` in Q30 over what is kept, `r = splitmix64() mod ΣwT`, the first
//!    token in id order where the running sum of `wT` passes `r`.
//!
//! The BPF side finds the cuts of steps 3 and 4 by a radix select over `d` (no sort); this twin
//! finds the same cuts another way (a partial sort), so the two are independent implementations
//! of one definition: the smallest `(d, id)` whose running mass reaches the target.

use super::fixed::{exp_neg, ACT_MAX};
use super::limits::{
    SAMPLE_PEN_MAX, SAMPLE_REP_MAX, SAMPLE_REP_MIN, SAMPLE_TEMP_MAX, SAMPLE_TEMP_MIN, VOCAB_MAX,
};
use crate::{Error, Result};

/// 1.0 in Q16 (`SAMPLE_ONE`).
pub const ONE: u32 = 1 << 16;
/// `op_sample`'s return for a parameter out of range (`SAMPLE_E_PARAM`).
pub const E_PARAM: i32 = -10;
/// `op_sample`'s return when a pass stopped early (`SAMPLE_E_LOOP`).
pub const E_LOOP: i32 = -11;

/// The sampling parameters in fixed point: `struct qb_sample_params`, field for field.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Params {
    /// Temperature, Q16: 0 (greedy) or `SAMPLE_TEMP_MIN..=SAMPLE_TEMP_MAX`.
    pub temp_q16: u32,
    /// Keep the `top_k` best; 0 (or ≥ the vocabulary) keeps all.
    pub top_k: u32,
    /// Top-p, Q16, `1..=ONE`; `ONE` is off.
    pub top_p_q16: u32,
    /// Min-p, Q16, `0..=ONE`; 0 is off.
    pub min_p_q16: u32,
    /// Repetition penalty, Q16, `SAMPLE_REP_MIN..=SAMPLE_REP_MAX`; `ONE` is off.
    pub rep_q16: u32,
    /// Presence penalty, Q16, `|.| ≤ SAMPLE_PEN_MAX`.
    pub presence_q16: i32,
    /// Frequency penalty, Q16, `|.| ≤ SAMPLE_PEN_MAX`.
    pub frequency_q16: i32,
}

impl Default for Params {
    /// Greedy, no filter, no penalty.
    fn default() -> Self {
        Params {
            temp_q16: 0,
            top_k: 0,
            top_p_q16: ONE,
            min_p_q16: 0,
            rep_q16: ONE,
            presence_q16: 0,
            frequency_q16: 0,
        }
    }
}

impl Params {
    /// Checks every field against the ranges `op_sample` accepts: the first out of range is
    /// [`Error::InvalidParameter`] naming it (its value converted back from Q16).
    pub fn check(&self) -> Result<()> {
        let q = |v: i64| v as f64 / f64::from(ONE);
        let bad = |name, v: i64, expected| {
            Err(Error::InvalidParameter {
                name,
                value: q(v),
                expected,
            })
        };
        let t = self.temp_q16;
        if t != 0 && !(SAMPLE_TEMP_MIN..=SAMPLE_TEMP_MAX).contains(&t) {
            return bad(
                "temperature",
                t.into(),
                "0 (greedy) or 0.01..=100 (the integer sampler's Q16 range)",
            );
        }
        if !(1..=ONE).contains(&self.top_p_q16) {
            return bad("top_p", self.top_p_q16.into(), "2^-16..=1 in Q16 (1 = off)");
        }
        if self.min_p_q16 > ONE {
            return bad("min_p", self.min_p_q16.into(), "0..=1 (0 = off)");
        }
        if !(SAMPLE_REP_MIN..=SAMPLE_REP_MAX).contains(&self.rep_q16) {
            return bad(
                "repetition_penalty",
                self.rep_q16.into(),
                "0.01..=100 (1 = off)",
            );
        }
        for (name, v) in [
            ("presence_penalty", self.presence_q16),
            ("frequency_penalty", self.frequency_q16),
        ] {
            if v.unsigned_abs() > SAMPLE_PEN_MAX {
                return bad(name, v.into(), "-64..=64 (0 = off)");
            }
        }
        Ok(())
    }

    /// Whether any penalty is on.
    pub fn has_penalties(&self) -> bool {
        self.rep_q16 != ONE || self.presence_q16 != 0 || self.frequency_q16 != 0
    }
}

/// splitmix64 (Steele, Lea and Flood, 2014): advances `state` by the golden gamma and returns it
/// mixed.
pub fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Step 1 for a logit `v` seen `count > 0` times: divided (v > 0) or multiplied (v ≤ 0) by the
/// repetition penalty, rounded, minus `presence + count · frequency`, clamped to ±`ACT_MAX`.
pub fn penalise(v: i32, count: u32, p: &Params) -> i32 {
    let rep = u64::from(p.rep_q16);
    let mut x = i64::from(v);
    if p.rep_q16 != ONE {
        x = if x > 0 {
            (((x as u64) << 16) + rep / 2) as i64 / rep as i64
        } else {
            -((((-x) as u64 * rep + (1 << 15)) >> 16) as i64)
        };
    }
    let x = x - i64::from(p.presence_q16) - i64::from(count) * i64::from(p.frequency_q16);
    x.clamp(-ACT_MAX, ACT_MAX) as i32
}

/// `exp(-min(a, ACT_MAX))` in Q30.
fn w(a: u64, tab: &[u32; 257]) -> u64 {
    exp_neg(a.min(ACT_MAX as u64), tab)
}

/// Draws the next token from `logits` (Q16; penalised in place, as the BPF side does) with
/// `counts[i]` the times token i was seen (`None`: no penalties), advancing the generator
/// `rng` (not at temperature 0, which draws nothing). Returns the token, or
/// [`Error::InvalidParameter`] for parameters out of range and [`Error::Invalid`] for an empty
/// or too long vocabulary or counts of another length.
pub fn sample(
    p: &Params,
    logits: &mut [i32],
    counts: Option<&[u32]>,
    tab: &[u32; 257],
    rng: &mut u64,
) -> Result<u32> {
    let dist = distribution(p, logits, counts, tab)?;
    if p.temp_q16 == 0 {
        return Ok(dist[0].0);
    }
    let total: u64 = dist.iter().map(|&(_, w)| w).sum();
    let r = splitmix64(rng) % total;
    let mut acc = 0;
    for &(id, w) in &dist {
        acc += w;
        if acc > r {
            return Ok(id);
        }
    }
    unreachable!("the weights add up to more than r")
}

/// What [`sample`] draws from: the tokens kept by steps 1-5, in id order, each with its weight
/// `wT` (Q30; only non-zero ones), so that token i comes with probability `wT_i / ΣwT` exactly.
/// At temperature 0, the one greedy token with weight 1. Penalises `logits` in place and
/// errs as [`sample`].
pub fn distribution(
    p: &Params,
    logits: &mut [i32],
    counts: Option<&[u32]>,
    tab: &[u32; 257],
) -> Result<Vec<(u32, u64)>> {
    p.check()?;
    let n = logits.len();
    if n == 0 || n > VOCAB_MAX {
        return Err(Error::Invalid(format!(
            "sampling from {n} logits: the integer sampler takes 1..={VOCAB_MAX}"
        )));
    }
    if let Some(c) = counts.filter(|_| p.has_penalties()) {
        if c.len() != n {
            return Err(Error::Invalid(format!(
                "sampling: {} counts for {n} logits",
                c.len()
            )));
        }
        for (l, &c) in logits.iter_mut().zip(c).filter(|(_, &c)| c > 0) {
            *l = penalise(*l, c, p);
        }
    }
    // 2. the first largest (starting from -ACT_MAX - 1, as the BPF pass)
    let (mut vmax, mut arg) = (-ACT_MAX - 1, 0);
    for (i, &v) in logits.iter().enumerate() {
        if i64::from(v) > vmax {
            (vmax, arg) = (v.into(), i);
        }
    }
    if p.temp_q16 == 0 {
        return Ok(vec![(arg as u32, 1)]);
    }
    let t = u64::from(p.temp_q16);
    let inv_t = ((1u64 << 32) + t / 2) / t;
    let d = |i: usize| (vmax - i64::from(logits[i])) as u32;
    let key = |i: usize| u64::from(d(i)) << 20 | i as u64;
    // kept: key(i) <= cut (nothing cut: every d is below u32::MAX, every id below n)
    let mut cut = u64::from(u32::MAX) << 20 | n as u64;
    // 3. top-k: the k-th smallest key
    let k = p.top_k as usize;
    if k > 0 && k < n {
        let mut keys: Vec<u64> = (0..n).map(key).collect();
        cut = *keys.select_nth_unstable(k - 1).1;
    }
    // 4. top-p over what top-k kept, at temperature 1
    if p.top_p_q16 < ONE {
        let top_p = u64::from(p.top_p_q16);
        let mut kept: Vec<(u64, u64)> = (0..n)
            .filter(|&i| key(i) <= cut)
            .map(|i| (key(i), w(d(i).into(), tab)))
            .collect();
        let s1: u64 = kept.iter().map(|&(_, m)| m).sum();
        let target = ((s1 >> 16) * top_p + (((s1 & 0xffff) * top_p) >> 16)).max(1);
        // only tokens with mass can be where the running mass first reaches the target
        kept.retain(|&(_, m)| m > 0);
        kept.sort_unstable();
        let mut acc = 0;
        cut = kept
            .iter()
            .find(|&&(_, m)| {
                acc += m;
                acc >= target
            })
            .expect("the best token has mass 2^30 and the target is at most the total")
            .0;
    }
    // 5. min-p, and the weights at temperature T
    let min_w = u64::from(p.min_p_q16) << 14;
    Ok((0..n)
        .filter(|&i| key(i) <= cut && (p.min_p_q16 == 0 || w(d(i).into(), tab) >= min_w))
        .map(|i| (i as u32, w((u64::from(d(i)) * inv_t) >> 16, tab)))
        .filter(|&(_, w)| w > 0)
        .collect())
}
