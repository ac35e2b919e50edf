//! The packet filter's scores in integers: the Rust twin of the kernel's classifier, which scores
//! each label of a rule by the log-probability the model gives its tokens (docs: the filter spec,
//! "Scores"). Everything is Q16 like the logits the LM head writes, so that the kernel computes
//! exactly these integers:
//!
//! - [`lse_q16`]: `lse = m + ln(Σ exp(z_i - m))` with `m = max z`, the terms `exp_neg` in Q30
//!   (the sampler's exp2 table, `d` clamped to [`ACT_MAX`] as `sample_w1` does);
//! - [`ln_q16`]: the natural log of a Q30 sum, bit by bit (squaring the mantissa 16 times);
//! - [`log_prob_q16`]: `z_t - lse`;
//! - [`decide`]: the best label, or the fallback when the margin or threshold is not met.

use super::fixed::{exp_neg, ACT_MAX, Q_ONE};
use super::limits::LN2_Q16;

/// `ln(s / 2^30)` in Q16 for a Q30 value `s` (`s ≥ 2^30` in the scores, where the largest term
/// of the sum is exactly 1.0; any `s ≥ 1` works, giving negative logs below 2^30; `s = 0`, the
/// log of nothing, is taken as `s = 1`).
///
/// The algorithm (the kernel computes the same integers):
/// 1. `k = 63 - clz(s)`, the position of the top bit, so `s = 2^(k-30) · y / 2^30` with the
///    mantissa `y = s >> (k-30)` (or `s << (30-k)`) in `[2^30, 2^31)`, i.e. `[1, 2)` in Q30;
/// 2. the 16 fraction bits of `log2(y)`, most significant first: squaring `y` doubles its log,
///    so after `y = y² >> 30` the log's next bit is 1 exactly when `y ≥ 2` (then `y /= 2`);
///    every product is below `2^62` and is truncated;
/// 3. `log2(s) = ((k - 30) << 16) + f` (Q16), and `ln = (log2 · LN2_Q16) >> 16`, the shift
///    arithmetic (flooring) for the negative logs of `s < 2^30`.
///
/// Every step truncates and `LN2_Q16` is below ln 2, so for `s ≥ 2^30` the result is never above
/// `ln` and at most a few Q16 units below it (a unit is 2^-16 nats): 3.6 for the scores' sums
/// (`2^30 ≤ s < 2^50`), 4.9 for any `s`, as the test below measures.
pub fn ln_q16(s: u64) -> i64 {
    let s = s.max(1);
    let k = 63 - i64::from(s.leading_zeros());
    let mut y = if k >= 30 {
        s >> (k - 30)
    } else {
        s << (30 - k)
    };
    let mut f = 0i64;
    for _ in 0..16 {
        y = (y * y) >> Q_ONE;
        f <<= 1;
        if y >= 1 << 31 {
            y >>= 1;
            f |= 1;
        }
    }
    let log2 = ((k - 30) << 16) + f;
    (log2 * LN2_Q16) >> 16
}

/// `ln Σ_i exp(z_i)` in Q16 for Q16 logits: `m + ln_q16(S)` with `m = max z` and
/// `S = Σ exp_neg(min(m - z_i, ACT_MAX))` (Q30, u64: at most 2^20 logits of at most 2^30 each,
/// so no overflow). `tab` is the exp2 table ([`exp2_table`](super::fixed::exp2_table)). An empty
/// slice, the log of an empty sum, gives `i64::MIN`.
pub fn lse_q16(logits: &[i32], tab: &[u32; 257]) -> i64 {
    let Some(m) = logits.iter().copied().max() else {
        return i64::MIN;
    };
    let m = i64::from(m);
    let s: u64 = logits
        .iter()
        .map(|&z| exp_neg(((m - i64::from(z)) as u64).min(ACT_MAX as u64), tab))
        .sum();
    m + ln_q16(s)
}

/// `log p(token)` in Q16: `logits[token] - lse` with `lse` from [`lse_q16`] over the same logits
/// (`≤ 0` up to rounding).
///
/// # Panics
/// If `token` is not below `logits.len()` (callers check ids against the vocabulary first).
pub fn log_prob_q16(logits: &[i32], token: usize, lse: i64) -> i64 {
    i64::from(logits[token]) - lse
}

/// The label chosen from the labels' `scores` (Q16 log-probabilities):
/// `best` is the first index with the largest score, `second` the largest score among the
/// others; `fallback` is chosen instead when `margin_q16 > 0` and `score[best] - second <
/// margin_q16`, or when `threshold_q16` is set and `score[best] < threshold_q16`; else `best`.
/// No score (an empty slice) gives `fallback`; a single score has no second and so always
/// meets the margin.
pub fn decide(
    scores: &[i64],
    margin_q16: i64,
    threshold_q16: Option<i64>,
    fallback: usize,
) -> usize {
    let Some(&top) = scores.iter().max() else {
        return fallback;
    };
    let best = scores
        .iter()
        .position(|&s| s == top)
        .expect("the maximum is in the slice");
    let second = scores
        .iter()
        .enumerate()
        .filter(|&(i, _)| i != best)
        .map(|(_, &s)| s)
        .max();
    let narrow = margin_q16 > 0 && second.is_some_and(|s| top.saturating_sub(s) < margin_q16);
    let low = threshold_q16.is_some_and(|t| top < t);
    if narrow || low {
        fallback
    } else {
        best
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::num::fixed::exp2_table;

    /// xorshift64*: deterministic test data.
    fn next(state: &mut u64) -> u64 {
        *state ^= *state >> 12;
        *state ^= *state << 25;
        *state ^= *state >> 27;
        state.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// `ln(s / 2^30)` in Q16 units, in f64.
    fn ln_f64(s: u64) -> f64 {
        ((s as f64).ln() - 30.0 * std::f64::consts::LN_2) * 65536.0
    }

    /// The largest `|ln - ln_q16(s)|` over the values, in Q16 units, checking that `ln_q16` is
    /// never above `ln` for `s ≥ 2^30` (every step truncates, and LN2_Q16 < ln 2).
    fn max_err(values: impl IntoIterator<Item = u64>) -> f64 {
        values
            .into_iter()
            .map(|s| {
                let e = ln_f64(s) - ln_q16(s) as f64;
                if s >= 1 << 30 {
                    assert!(e > -1e-6, "ln_q16({s}) = {} above ln {}", ln_q16(s), ln_f64(s));
                }
                e.abs()
            })
            .fold(0.0, f64::max)
    }

    #[test]
    fn ln_q16_is_within_a_few_units_of_ln() {
        let mut r = 0x9e37_79b9_7f4a_7c15u64;
        // the sums of the scores: 2^30 ≤ S < 2^50 (at most 2^20 terms of at most 2^30), densely,
        // at random, and around every power of two
        let mut scores: Vec<u64> = (0..200_000).map(|i| (1u64 << 30) + i * 11_258_999).collect();
        scores.extend((0..200_000).map(|_| (1u64 << 30) + (next(&mut r) >> (14 + next(&mut r) % 34))));
        scores.extend((30..50).flat_map(|k| {
            let p = 1u64 << k;
            [p, p - 1, p + 1, p + (p >> 1)]
        }));
        scores.retain(|&s| (1u64 << 30..1u64 << 50).contains(&s));
        // everything else: below 2^30 and up to 2^64
        let mut rest: Vec<u64> = (0..64)
            .flat_map(|k| {
                let p = 1u64 << k;
                [p, (p - 1).max(1), p + (p >> 1), p.saturating_add(1)]
            })
            .collect();
        rest.extend((0..200_000).map(|_| next(&mut r) >> (next(&mut r) % 64)).filter(|&v| v > 0));
        let (err, err_all) = (max_err(scores.iter().copied()), max_err(rest.iter().copied()));
        eprintln!(
            "ln_q16: max error {err:.3} Q16 units over {} sums in [2^30, 2^50), {err_all:.3} over {} other values",
            scores.len(),
            rest.len()
        );
        // measured 3.51 and 4.80: the truncated squarings (about 1.8 units at 2^30), LN2_Q16
        // below ln 2 by 0.097 units per unit of log2's integer part (2 at 2^50, 3.2 at 2^63),
        // and the final floor
        assert!(err < 4.0, "ln_q16 max error {err} Q16 units on the scores' sums");
        assert!(err_all < 5.5, "ln_q16 max error {err_all} Q16 units");
        // exact where the log is exact
        assert_eq!(ln_q16(1 << 30), 0);
        assert_eq!(ln_q16(1 << 31), LN2_Q16);
        assert_eq!(ln_q16(1 << 29), -LN2_Q16);
        assert_eq!(ln_q16(0), ln_q16(1));
    }

    #[test]
    fn lse_and_log_probs_agree_with_f64() {
        let tab = exp2_table();
        let mut r = 0x1234_5678_9abc_def1u64;
        let mut worst = 0.0f64;
        for case in 0..200 {
            let n = 1 + (next(&mut r) % 5000) as usize;
            // spreads from 1/4 to 64 nats; a few cases far apart (terms that underflow)
            let spread = 1i64 << (14 + case % 9);
            let mut z: Vec<i32> = (0..n)
                .map(|_| ((next(&mut r) % (2 * spread as u64 + 1)) as i64 - spread) as i32)
                .collect();
            if case % 10 == 0 {
                z[0] = i32::MAX;
                z[n - 1] = -i32::MAX;
            }
            let lse = lse_q16(&z, &tab);
            let m = z.iter().map(|&v| v as f64 / 65536.0).fold(f64::MIN, f64::max);
            let want = m + z
                .iter()
                .map(|&v| (v as f64 / 65536.0 - m).exp())
                .sum::<f64>()
                .ln();
            let err = (lse as f64 / 65536.0 - want).abs();
            worst = worst.max(err);
            // exp_neg's relative error is ~1e-5, ln_q16's 2^-15 nats
            assert!(err < 1e-4, "case {case}: lse {lse} vs {want}: {err} nats");
            let t = (next(&mut r) % n as u64) as usize;
            let lp = log_prob_q16(&z, t, lse);
            assert!(lp <= 2, "case {case}: log p = {lp} > 0");
            assert_eq!(lp, i64::from(z[t]) - lse);
        }
        eprintln!("lse_q16: max error {worst:.2e} nats");
        assert_eq!(lse_q16(&[], &tab), i64::MIN);
        // one logit: log p = 0 exactly
        assert_eq!(log_prob_q16(&[12345], 0, lse_q16(&[12345], &tab)), 0);
    }

    #[test]
    fn decide_takes_the_first_best_and_falls_back_on_margin_and_threshold() {
        // ties: the first index wins
        assert_eq!(decide(&[-5, -3, -3], 0, None, 0), 1);
        // a tie with a margin: the gap 0 is below it
        assert_eq!(decide(&[-5, -3, -3], 1, None, 0), 0);
        // the gap 2 meets margin 2, misses margin 3
        assert_eq!(decide(&[-5, -3, -1], 2, None, 0), 2);
        assert_eq!(decide(&[-5, -3, -1], 3, None, 1), 1);
        // margin 0 (and a negative one) is off
        assert_eq!(decide(&[-1, -1], 0, None, 1), 0);
        assert_eq!(decide(&[-1, -1], -4, None, 1), 0);
        // threshold: the best must reach it
        assert_eq!(decide(&[-70_000, -65_536], 0, Some(-65_536), 0), 1);
        assert_eq!(decide(&[-70_000, -65_537], 0, Some(-65_536), 0), 0);
        assert_eq!(decide(&[-70_000, -65_537], 0, Some(-65_536), 1), 1);
        // both set, both met
        assert_eq!(decide(&[-10, -200, -100], 50, Some(-20), 2), 0);
        // no second score, no score
        assert_eq!(decide(&[-9], 1 << 20, None, 3), 0);
        assert_eq!(decide(&[], 0, None, 3), 3);
        // extreme gaps do not overflow
        assert_eq!(decide(&[i64::MAX, i64::MIN], i64::MAX, None, 1), 0);
    }
}
