//! An exact LM-head argmax at low-bit cost: screen every row with a low-bit copy of the head,
//! bound each row's screening error in integers, and rescore exactly only the rows that can
//! still win.
//!
//! # The scheme
//!
//! At open, the store's exact head `W` (`[rows][k]`, in Q24 integer units: the Q24 weights
//! themselves, or `code * scale` of an 8-bit head) is quantised again, group-wise like
//! [`crate::num::swar`], to the screen `V` ([`W4A8`] or [`W8A16`] codes with Q24 scales, so that `V` is
//! also an integer matrix in Q24 units). Per row the two integer norms
//! `nd[r] >= ||W_r - V_r||_2` and `nv[r] >= ||V_r||_2` are kept (rounded up, in units of
//! `2^ws`).
//!
//! Per token, with `xe` the activations the exact head multiplies (Q16 integers: `x` itself for
//! the Q24 head, the 16-bit-quantised `xq << e` for a W8A16 head) and `xh` those the screen
//! multiplies (`xq << e` from [`crate::num::swar::quantize_x8`] or `quantize_x16`):
//!
//! 1. BPF: the screen logits `s[r] = sat32(rshr(B_r, 24))` by the unchanged SWAR matvec kernel
//!    (rows split across threads), `B_r = Σ_j V_rj · xh_j`.
//! 2. User space: `X >= ||xe||_2`, `Y >= ||xe - xh||_2` (rounded up, units of `2^xs`), and a
//!    shift `t = 24 - ws - xs` ([`token_bound`]).
//! 3. BPF (`screen_argmax`, one run): `E[r] = ceil((nd[r]·X + nv[r]·Y) / 2^t)`,
//!    `L = max_r (s[r] - E[r])`, and the exact logit (the store's own head kernel, on its rows
//!    or row blocks) of every row with `s[r] + E[r] >= L`; the answer is the first row with the
//!    largest exact logit among them.
//!
//! # Why the answer is the exact head's argmax (the proof)
//!
//! Let `A_r = Σ_j W_rj · xe_j` be the exact head's accumulator, so that its logit is
//! `y_r = sat32(rshr(A_r, 24))` (`lm_head_argmax`, `w8a16_lm_head_argmax`: `Σ_g (s·D) << e` is
//! exactly `Σ_j (code·s)(xq << e)`). Both accumulators are exact integers (they wrap in i64 in
//! the kernels): [`token_bound`] refuses the token — and the caller runs the exact head — unless
//! `l1 · max(|xe|, |xh|) < 2^62`, `l1` the largest `||W_r||_1` or `||V_r||_1`, which bounds every
//! partial sum of both.
//!
//! 1. `A_r - B_r = Σ (W_rj - V_rj) xe_j + Σ V_rj (xe_j - xh_j)`, so by Cauchy–Schwarz
//!    `|A_r - B_r| <= ||W_r - V_r||_2 ||xe||_2 + ||V_r||_2 ||xe - xh||_2
//!    <= (nd[r]·X + nv[r]·Y) · 2^(ws + xs) <= E[r] · 2^24`, every factor rounded up.
//! 2. `rshr(v, 24) = floor(v / 2^24 + 1/2)` and `floor(u + d) <= floor(u) + ceil(d)`, so
//!    `|rshr(A_r, 24) - rshr(B_r, 24)| <= E[r]`.
//! 3. `sat32` is monotone and `sat32(v) - e <= sat32(v - e)`, `sat32(v) + e >= sat32(v + e)` for
//!    `e >= 0`, so `lo[r] = s[r] - E[r] <= y_r <= s[r] + E[r] = hi[r]`.
//! 4. Let `r*` be the exact argmax (first on ties) and `L = max lo`, reached at some `r'`:
//!    `L <= y_r' <= y_r*`. Every row with the largest exact logit has `hi >= y_r* >= L`, so all
//!    of them are rescored and the first of them is `r*`; a row left out has `y < L <= y_r*`.
//!
//! The tests check each step: the bound on random and adversarial rows (weights on 4-bit
//! rounding boundaries, near-ties one unit apart, activation outliers), and the BPF result
//! against the full exact head at every position of the test sequences.
//!
//! # Cost
//!
//! The screen costs what a W4A8 (or W8A16) LM head costs; the rescoring is proportional to the
//! candidates, and the two scans of `screen_argmax` about 1 ms at 151,936 rows. The bound is a
//! worst case over all activations with the token's norms, about `sqrt(k)` times the typical
//! screening error. At the Qwen3-0.6B shape (k = 1024) on the synthetic checkpoint that makes a
//! 4-bit screen's window wider than the whole logit range (it rescored 147,036–151,936 rows per
//! token), while an 8-bit screen leaves 1–16 rows: the q24 store screens with W8A16 (head
//! 84 ms → 25 ms on two threads of a busy 2-vCPU machine), the int stores, whose head is
//! already W8A16, with W4A8 — which prunes to ~1 % on the tiny model (k = 64) and backs off
//! ([`BACKOFF_MAX`]) where it cannot prune.

use crate::num::swar::{Format, Int4Matrix, Int8Matrix, QuantX, GROUP, W4A8};

/// The low-bit copy of a head.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ScreenWeights {
    /// 4-bit codes, screened by the W4A8 kernel.
    W4(Int4Matrix),
    /// 8-bit codes, screened by the W8A16 kernel.
    W8(Int8Matrix),
}

/// A head's screen and the per-row norms its error bound needs (see the module docs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Screen {
    /// The screen weights `V`.
    pub weights: ScreenWeights,
    /// `nd[r] >= ||W_r - V_r||_2 / 2^ws`, below 2^31.
    pub nd: Vec<u32>,
    /// `nv[r] >= ||V_r||_2 / 2^ws`, below 2^31.
    pub nv: Vec<u32>,
    /// The norms' unit: `2^ws` Q24 units.
    pub ws: u32,
    /// The largest `||W_r||_1` or `||V_r||_1` (Q24 units): bounds the accumulators.
    pub l1: u128,
}

/// The per-token factors of the bound: `E[r] = ceil((nd[r]·x + nv[r]·y) / 2^shift)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TokenBound {
    /// `>= ||xe||_2 / 2^xs`, below 2^31.
    pub x: u64,
    /// `>= ||xe - xh||_2 / 2^xs`, below 2^31.
    pub y: u64,
    /// `24 - ws - xs`.
    pub shift: u32,
}

/// `ceil(sqrt(v))`.
pub fn ceil_sqrt(v: u128) -> u128 {
    let mut r = (v as f64).sqrt() as u128;
    while r * r > v {
        r -= 1;
    }
    while r * r < v {
        r += 1;
    }
    r
}

/// The least shift `sh` with `ceil(v / 2^sh) < 2^31` for every `v`, and the shifted values.
fn fit31(vs: &[u128]) -> (u32, Vec<u64>) {
    let m = vs.iter().copied().max().unwrap_or(0);
    let sh = (0..128)
        .find(|&sh| m.div_ceil(1u128 << sh) < 1 << 31)
        .unwrap_or(127);
    (
        sh,
        vs.iter().map(|&v| v.div_ceil(1u128 << sh) as u64).collect(),
    )
}

/// Whether a head of `rows` × `k` can be screened in `format`: whole row blocks, `k` a multiple
/// of 32 within the SWAR kernels' limit. Stores without such a shape run the exact head.
pub fn fits(format: Format, rows: usize, k: usize) -> bool {
    rows > 0
        && rows % format.rows_per_block == 0
        && k > 0
        && k % GROUP == 0
        && k <= crate::num::swar::K_MAX
}

impl Screen {
    /// Builds the screen of an exact head of `rows` × `k` in `format` ([`W4A8`] or
    /// [`crate::num::swar::W8A16`]). `row(r, w)` fills `w` (`k` long) with row `r` in Q24 integer units
    /// (each below 2^31 in magnitude). Quantisation: per (row, group of 32) the scale
    /// `s = ceil(max|w| / code_max)` and `code = round(w / s)` (half away from zero), so
    /// `|w - code·s| <= s/2`; any quantiser would do, the bound uses the actual `V`.
    ///
    /// # Panics
    /// On a shape the SWAR kernels cannot run ([`fits`]).
    pub fn build(
        format: Format,
        rows: usize,
        k: usize,
        row: impl Fn(usize, &mut [i64]) + Sync,
    ) -> Screen {
        assert!(
            fits(format, rows, k),
            "a {} screen of {rows}x{k}",
            format.name
        );
        let cmax = format.code_max as i64;
        let threads = std::thread::available_parallelism()
            .map_or(1, |n| n.get())
            .clamp(1, 4);
        let per = (rows.div_ceil(threads).div_ceil(8) * 8).max(8);
        // Every buffer is allocated here and lent to the threads in disjoint chunks: a thread
        // that allocated would get a glibc heap of its own, whose freed pages stay resident after
        // the thread ends (reopening models would then grow the process by megabytes each time).
        let groups = k / GROUP;
        let (mut codes, mut scales) = (vec![0i8; rows * k], vec![0u32; rows * groups]);
        let (mut dd, mut vv) = (vec![0u128; rows], vec![0u128; rows]);
        let mut work = vec![0i64; threads * k];
        let l1 = std::thread::scope(|s| {
            let hs: Vec<_> = codes
                .chunks_mut(per * k)
                .zip(scales.chunks_mut(per * groups))
                .zip(dd.chunks_mut(per).zip(vv.chunks_mut(per)))
                .zip(work.chunks_mut(k))
                .enumerate()
                .map(|(t, (((codes, scales), (dd, vv)), w))| {
                    let row = &row;
                    s.spawn(move || {
                        let mut l1 = 0u128;
                        for i in 0..dd.len() {
                            row(t * per + i, w);
                            let (mut w1, mut v1) = (0u128, 0u128);
                            for g in 0..groups {
                                let grp = &w[g * GROUP..(g + 1) * GROUP];
                                let m =
                                    grp.iter().map(|v| v.unsigned_abs()).max().unwrap_or(0) as i64;
                                let sc = (m + cmax - 1) / cmax;
                                scales[i * groups + g] = sc as u32;
                                for (j, &v) in grp.iter().enumerate() {
                                    let c = if sc == 0 {
                                        0
                                    } else {
                                        let q = (2 * v.abs() + sc) / (2 * sc);
                                        (if v < 0 { -q } else { q }).clamp(-cmax, cmax)
                                    };
                                    codes[i * k + g * GROUP + j] = c as i8;
                                    let (vq, d) = (c * sc, v - c * sc);
                                    dd[i] += (d as i128 * d as i128) as u128;
                                    vv[i] += (vq as i128 * vq as i128) as u128;
                                    w1 += v.unsigned_abs() as u128;
                                    v1 += vq.unsigned_abs() as u128;
                                }
                            }
                            l1 = l1.max(w1).max(v1);
                        }
                        l1
                    })
                })
                .collect();
            hs.into_iter()
                .map(|h| h.join().expect("screen builder"))
                .max()
                .unwrap_or(0)
        });
        drop(work);
        let dd: Vec<u128> = dd.into_iter().map(ceil_sqrt).collect();
        let vv: Vec<u128> = vv.into_iter().map(ceil_sqrt).collect();
        let weights = if format == W4A8 {
            ScreenWeights::W4(Int4Matrix::from_codes(rows, k, &codes, &scales))
        } else {
            ScreenWeights::W8(Int8Matrix::from_codes(rows, k, &codes, &scales))
        };
        let both: Vec<u128> = dd.iter().chain(&vv).copied().collect();
        let (ws, n) = fit31(&both);
        Screen {
            weights,
            nd: n[..rows].iter().map(|&v| v as u32).collect(),
            nv: n[rows..].iter().map(|&v| v as u32).collect(),
            ws,
            l1,
        }
    }

    /// Rows.
    pub fn rows(&self) -> usize {
        self.nd.len()
    }

    /// Arena bytes of the screen: packed words and scales, the two norms per row and the screen
    /// logits (i32 per row).
    pub fn arena_bytes(format: Format, rows: usize, k: usize) -> usize {
        rows * k * format.bits as usize / 8 + rows * (k / GROUP) * 4 + 3 * rows * 4
    }
}

/// The activations a quantised buffer stands for, `xq << e` (Q16 integers).
pub fn dequantize(xq: &QuantX) -> Vec<i64> {
    xq.q.iter()
        .enumerate()
        .map(|(j, &q)| q << xq.blocks[j / GROUP].shift)
        .collect()
}

/// The per-token factors for exact-path activations `xe` and screen activations `xh` (Q16
/// integers), given a screen's [`Screen::ws`] and [`Screen::l1`], or `None` when the screen
/// cannot be trusted for this token: an accumulator could wrap (`l1 · max|x| >= 2^62`) or the
/// shift would be negative.
pub fn token_bound(ws: u32, l1: u128, xe: &[i64], xh: &[i64]) -> Option<TokenBound> {
    let m = xe
        .iter()
        .chain(xh)
        .map(|v| v.unsigned_abs() as u128)
        .max()
        .unwrap_or(0);
    if l1.checked_mul(m)? >= 1 << 62 {
        return None;
    }
    let x2: u128 = xe.iter().map(|&v| (v as i128 * v as i128) as u128).sum();
    let y2: u128 = xe
        .iter()
        .zip(xh)
        .map(|(&a, &b)| ((a - b) as i128 * (a - b) as i128) as u128)
        .sum();
    let (xs, n) = fit31(&[ceil_sqrt(x2), ceil_sqrt(y2)]);
    let shift = 24i64 - ws as i64 - xs as i64;
    (shift >= 0).then_some(TokenBound {
        x: n[0],
        y: n[1],
        shift: shift as u32,
    })
}

/// `E[r]`: the bound on `|rshr(A_r, 24) - rshr(B_r, 24)|` in Q16 units.
pub fn bound(nd: u32, nv: u32, t: &TokenBound) -> i64 {
    ((nd as u64 * t.x + nv as u64 * t.y + (1u64 << t.shift) - 1) >> t.shift) as i64
}

/// The best lower bound `L = max_r (s[r] - E[r])` and the candidates `{r : s[r] + E[r] >= L}`,
/// in row order: the twin of the first two loops of `screen_argmax`.
pub fn candidates(s: &[i32], screen: &Screen, t: &TokenBound) -> (i64, Vec<usize>) {
    let e: Vec<i64> = (0..s.len())
        .map(|r| bound(screen.nd[r], screen.nv[r], t))
        .collect();
    let l = (0..s.len())
        .map(|r| s[r] as i64 - e[r])
        .max()
        .unwrap_or(i64::MIN);
    (
        l,
        (0..s.len()).filter(|&r| s[r] as i64 + e[r] >= l).collect(),
    )
}

/// The argmax (first on ties) of `exact` over `rows`: the rescoring step.
pub fn rescore(rows: &[usize], mut exact: impl FnMut(usize) -> i32) -> (usize, i32) {
    let mut best = (rows.first().copied().unwrap_or(0), i32::MIN);
    for &r in rows {
        let v = exact(r);
        if v > best.1 {
            best = (r, v);
        }
    }
    best
}
