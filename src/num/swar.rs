//! Low-bit weights for the SWAR kernels of `src/bpf/swar.inc.c`: quantisation, packing into the
//! kernels' layouts, and Rust twins computing the kernels' integers bit for bit.
//!
//! BPF has no vector instructions; these kernels get several multiply-adds out of each 64-bit
//! multiply by packing the weights of several rows for one column into the lanes of a `u64`
//! (SIMD within a register, "SWAR") and multiplying by that column's activation.
//!
//! # Formats
//!
//! Both formats use groups of [`GROUP`] = 32 columns.
//!
//! - **Weights**: a code `w` per element and a `u32` scale `s` per (row, group), Q24
//!   ([`SCALE_SHIFT`]): the weight is `w * s / 2^24`. Codes are `-8..=7` in [`W4A8`] and
//!   `-128..=127` in [`W8A16`]. [`quantize_int8`] uses `-127..=127` (symmetric:
//!   `s = ceil(max|w| * 2^24 / 127)` and `w = round(weight / step)`, half away from zero, so every
//!   weight is within half a step of its code); [`quantize_int4`] picks the group scale with the
//!   least squared error, which may clip the largest weight of a group to `-8` or `7`.
//! - **Activations**: `x` (i32 Q16) is quantised per block of 32 columns ([`quantize_x8`],
//!   [`quantize_x16`], and in BPF the programs `quantize_x8` / `quantize_x16`):
//!   a power-of-two scale `2^e`, `e` the least shift with `round(max|x| / 2^e) <= QMAX` (Q16
//!   units, so `x ≈ xq · 2^e`), and `xq = round(x / 2^e)`, half away from zero, in
//!   `-QMAX..=QMAX`; QMAX = 127 for W4A8, 32767 for W8A16. The kernels apply `2^e` as a shift:
//!   a multiply less per row and group (W4A8: 73 instead of 81 per 256 products, +5 % speed),
//!   for at most one bit of the code range.
//! - **Output**: `y[r] = sat(rshr(Σ_g (s[r][g] · D[r][g]) << e[g], 24))` in Q16 (saturating to
//!   ±[`ACT_MAX`], round half up), where `D[r][g] = Σ_{j in g} w[r][j] · xq[j]` exactly; with
//!   `accumulate`, y is the i64 Q32 residual stream: `y[r] = sat(y[r] + rshr(Σ_g …, 8))`. The sum is an i64 that wraps (identically in the
//!   kernel and the twin); it is exact while every partial sum stays below 2^23 in real terms,
//!   256 times the largest representable output.
//!
//! # Layouts (llama2.c style: shapes in brackets, row-major)
//!
//! ```text
//! W4A8  words   u64 [rows/8][cols/4][2]   word (b, q, h): rows 8b+4h+l (l = 0..4) x cols 4q+c
//!                                         (c = 0..4); nibble w+8 at bit 16l + 4c
//!       scales  u32 [rows/8][cols/32][8]  row 8b+l, group g
//! W8A16 words   u64 [rows/4][cols/4][2]   word (b, q, h): rows 4b+2h+l (l = 0..2) x cols 4q+c;
//!                                         byte w+128 at bit 32l + 8c
//!       scales  u32 [rows/4][cols/32][4]  row 4b+l, group g
//! x     xq      i64 [k], then XBlock [k/32] { sum of the block's xq, e }: one arena buffer
//! ```
//!
//! Rows come in blocks of 8 (W4A8) or 4 (W8A16): a kernel run covers whole blocks.
//!
//! # Why the lanes are exact
//!
//! Word arithmetic is in the ring of integers mod 2^64. A W4 word unpacked for column `c`,
//! `(v >> 4c) & 0x000F000F000F000F`, equals `Σ_l (w_l + 8) 2^(16l)`; summing its products with
//! `xq` over a group gives `A = Σ_l (D_l + 8S) 2^(16l)` with `S = Σ xq`, whatever carries crossed
//! lanes on the way. Adding `C - 8S·R` (R = 1 in every lane, C = 2^15 in lanes 0..2) leaves
//! `(D_0 + 2^15) + (D_1 + 2^15) 2^16 + (D_2 + 2^15) 2^32 + D_3 2^48`, and because
//! `|D| <= 32 · 8 · 127 < 2^15` the brackets are plain 16-bit digits: `D_l` is digit `l` minus
//! 2^15 (the last one an arithmetic shift). W8A16 is the same with two 32-bit lanes, bias 128
//! and `|D| <= 32 · 128 · 32767 < 2^31`. So the twins below simply compute `D` directly.
//!
//! # Design notes
//!
//! - Weights are biased (unsigned nibbles/bytes, so one shift and mask unpacks a column) and
//!   activations signed: the bias correction `bias · S` depends on the activations only, so no
//!   per-row weight sums are stored and no lane needs spilling inside a group.
//! - Activation codes stop at ±127 (not -128): 32 · 8 · 128 = 2^15 would not fit a lane.
//! - Memory per weight: W4A8 0.5 byte + 1/8 byte of scale, W8A16 1 + 1/8 (Q24 i32: 4 bytes).
//! - Speed on the 2-vCPU EPYC this was written on, one thread, 3072×1024 and 1024×3072:
//!   plain Q24 `matvec` ~2.0 GMAC/s, `w4a8_matvec` ~9.2 (4.6×), `w8a16_matvec` ~4.5 (2.3×);
//!   `cargo bench --bench swar`.

use std::ops::Range;

use crate::num::fixed::{rshr, sat32, sat_res, ACT_MAX, Q_ACT, Q_RES};
use crate::{Error, Result};

/// Columns per weight-scale group and per activation block.
pub const GROUP: usize = 32;
/// Weight scales are Q24: a weight is `code * scale / 2^SCALE_SHIFT`.
pub const SCALE_SHIFT: u32 = 24;
/// Most columns a kernel accepts.
pub const K_MAX: usize = crate::num::limits::COLS_MAX;

/// A packed low-bit format: how codes sit in the kernel's `u64` words.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Format {
    /// Name, as in the kernels' program names.
    pub name: &'static str,
    /// Bits per weight code.
    pub bits: u32,
    /// Rows per word (lanes).
    pub lanes: usize,
    /// Bits per lane.
    pub lane_bits: u32,
    /// Rows per block: the kernels' unit of work, two words per column quad.
    pub rows_per_block: usize,
    /// Codes are stored as `code + bias`, unsigned.
    pub bias: i32,
    /// Largest code magnitude the quantiser produces (symmetric).
    pub code_max: i32,
    /// Largest activation-code magnitude (QMAX).
    pub act_max: i64,
}

/// 4-bit weights, 8-bit activations: four 16-bit lanes per word.
pub const W4A8: Format = Format {
    name: "w4a8",
    bits: 4,
    lanes: 4,
    lane_bits: 16,
    rows_per_block: 8,
    bias: 8,
    code_max: 7,
    act_max: 127,
};
/// 8-bit weights, 16-bit activations: two 32-bit lanes per word.
pub const W8A16: Format = Format {
    name: "w8a16",
    bits: 8,
    lanes: 2,
    lane_bits: 32,
    rows_per_block: 4,
    bias: 128,
    code_max: 127,
    act_max: 32767,
};

impl Format {
    fn check_shape(&self, rows: usize, cols: usize) {
        assert!(
            rows % self.rows_per_block == 0 && cols % GROUP == 0 && cols > 0 && cols <= K_MAX,
            "{}: a {rows}x{cols} matrix needs rows a multiple of {} and cols a multiple of {GROUP} in 32..={K_MAX}",
            self.name,
            self.rows_per_block
        );
    }

    /// Index of the word holding element (r, j) and the bit of its code, in a matrix of `cols`.
    fn locate(&self, cols: usize, r: usize, j: usize) -> (usize, u32) {
        let (b, h, l) = (
            r / self.rows_per_block,
            (r % self.rows_per_block) / self.lanes,
            r % self.lanes,
        );
        (
            (b * (cols / 4) + j / 4) * 2 + h,
            self.lane_bits * l as u32 + self.bits * (j % 4) as u32,
        )
    }

    fn scale_index(&self, cols: usize, r: usize, g: usize) -> usize {
        (r / self.rows_per_block * (cols / GROUP) + g) * self.rows_per_block
            + r % self.rows_per_block
    }

    fn pack(&self, rows: usize, cols: usize, codes: &[i8], scales: &[u32]) -> (Vec<u64>, Vec<u32>) {
        self.check_shape(rows, cols);
        assert_eq!(
            codes.len(),
            rows * cols,
            "{}: codes are [rows][cols]",
            self.name
        );
        assert_eq!(
            scales.len(),
            rows * (cols / GROUP),
            "{}: scales are [rows][cols/32]",
            self.name
        );
        let (lo, hi) = (-self.bias, self.bias - 1);
        let mut words = vec![0u64; rows * cols * self.bits as usize / 64];
        let mut packed_scales = vec![0u32; scales.len()];
        for r in 0..rows {
            for j in 0..cols {
                let w = codes[r * cols + j] as i32;
                assert!(
                    (lo..=hi).contains(&w),
                    "{}: code {w} at ({r}, {j}) outside {lo}..={hi}",
                    self.name
                );
                let (i, sh) = self.locate(cols, r, j);
                words[i] |= ((w + self.bias) as u64) << sh;
            }
            for g in 0..cols / GROUP {
                packed_scales[self.scale_index(cols, r, g)] = scales[r * (cols / GROUP) + g];
            }
        }
        (words, packed_scales)
    }

    fn code(&self, words: &[u64], cols: usize, r: usize, j: usize) -> i32 {
        let (i, sh) = self.locate(cols, r, j);
        ((words[i] >> sh) & ((1 << self.bits) - 1)) as i32 - self.bias
    }

    /// Symmetric quantisation of `w` `[rows][cols]` (see the module docs).
    fn quantize(
        &self,
        w: &[f32],
        rows: usize,
        cols: usize,
        name: &str,
    ) -> Result<(Vec<u64>, Vec<u32>)> {
        self.check_shape(rows, cols);
        assert_eq!(
            w.len(),
            rows * cols,
            "{}: weights are [rows][cols]",
            self.name
        );
        if let Some(i) = w.iter().position(|v| !v.is_finite()) {
            return Err(Error::NonFinite {
                name: name.into(),
                index: i,
                value: w[i],
            });
        }
        let one = (1u64 << SCALE_SHIFT) as f64;
        let cmax = self.code_max as f64;
        let mut codes = vec![0i8; rows * cols];
        let mut scales = vec![0u32; rows * (cols / GROUP)];
        for r in 0..rows {
            for g in 0..cols / GROUP {
                let base = r * cols + g * GROUP;
                let grp = &w[base..base + GROUP];
                let (at, a) = grp.iter().enumerate().fold((0, 0f64), |m, (i, &v)| {
                    if (v as f64).abs() > m.1 {
                        (i, (v as f64).abs())
                    } else {
                        m
                    }
                });
                let s = (a * one / cmax).ceil();
                if s > u32::MAX as f64 {
                    return Err(Error::OutOfRange {
                        name: name.into(),
                        index: base + at,
                        value: grp[at],
                        format: if self.bits == 4 {
                            "int4 with a Q24 u32 group scale"
                        } else {
                            "int8 with a Q24 u32 group scale"
                        },
                        max: u32::MAX as f64 / one * cmax,
                    });
                }
                let (s, lo) = if self.bits == 4 {
                    mse_scale(grp, s, one)
                } else {
                    (s, -cmax)
                };
                scales[r * (cols / GROUP) + g] = s as u32;
                if s > 0.0 {
                    for (c, &v) in codes[base..base + GROUP].iter_mut().zip(grp) {
                        *c = (v as f64 * one / s).round().clamp(lo, cmax) as i8;
                    }
                }
            }
        }
        Ok(self.pack(rows, cols, &codes, &scales))
    }
}

/// The 4-bit group scale with the least squared error: candidates from the max-based scale `s`
/// (every weight within half a step) down to 0.70 × s, codes in -8..=7, so that a rare large
/// weight may be clipped when that makes the other 31 finer. Returns (scale, lowest code).
fn mse_scale(grp: &[f32], s: f64, one: f64) -> (f64, f64) {
    let sse = |sc: f64, lo: f64| -> f64 {
        grp.iter()
            .map(|&v| {
                let v = v as f64 * one;
                let q = (v / sc).round().clamp(lo, 7.0);
                (v - q * sc).powi(2)
            })
            .sum()
    };
    if s <= 0.0 {
        return (s, -7.0);
    }
    let mut best = (s, -7.0, sse(s, -7.0));
    for i in 1..=15 {
        let sc = (s * (1.0 - 0.02 * i as f64)).ceil().max(1.0);
        let e = sse(sc, -8.0);
        if e < best.2 {
            best = (sc, -8.0, e);
        }
    }
    (best.0, best.1)
}

/// A matrix in one of the packed formats: the words and scales a kernel reads, in its layout.
pub trait PackedMatrix {
    /// The packing.
    const FORMAT: Format;
    /// Rows.
    fn rows(&self) -> usize;
    /// Columns.
    fn cols(&self) -> usize;
    /// The packed code words, in the kernel's layout.
    fn words(&self) -> &[u64];
    /// The Q24 scales, in the kernel's layout.
    fn scales(&self) -> &[u32];
    /// The code of element (r, j).
    fn code(&self, r: usize, j: usize) -> i32 {
        Self::FORMAT.code(self.words(), self.cols(), r, j)
    }
    /// The Q24 scale of row `r`, group `g`.
    fn scale(&self, r: usize, g: usize) -> u32 {
        self.scales()[Self::FORMAT.scale_index(self.cols(), r, g)]
    }
    /// The weight element (r, j) stands for: `code * scale / 2^24` (exact in f64).
    fn weight(&self, r: usize, j: usize) -> f64 {
        self.code(r, j) as f64 * self.scale(r, j / GROUP) as f64 / (1u64 << SCALE_SHIFT) as f64
    }
    /// All weights, `[rows][cols]`.
    fn dequantize(&self) -> Vec<f64> {
        (0..self.rows())
            .flat_map(|r| (0..self.cols()).map(move |j| (r, j)))
            .map(|(r, j)| self.weight(r, j))
            .collect()
    }
}

macro_rules! packed_matrix {
    ($(#[$doc:meta])* $name:ident, $fmt:expr, $bits:literal) => {
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq, Eq)]
        pub struct $name {
            /// Rows (a multiple of the format's rows per block).
            pub rows: usize,
            /// Columns (a multiple of 32, at most 16384).
            pub cols: usize,
            /// Packed codes in the kernel's layout (module docs).
            pub words: Vec<u64>,
            /// Q24 scales in the kernel's layout (module docs).
            pub scales: Vec<u32>,
        }

        impl PackedMatrix for $name {
            const FORMAT: Format = $fmt;
            fn rows(&self) -> usize {
                self.rows
            }
            fn cols(&self) -> usize {
                self.cols
            }
            fn words(&self) -> &[u64] {
                &self.words
            }
            fn scales(&self) -> &[u32] {
                &self.scales
            }
        }

        impl $name {
            #[doc = concat!("Packs codes `[rows][cols]` (", $bits, "-bit, two's complement range) and Q24 scales `[rows][cols/32]`.")]
            ///
            /// # Panics
            /// On a shape the kernels cannot run or a code out of range.
            pub fn from_codes(rows: usize, cols: usize, codes: &[i8], scales: &[u32]) -> Self {
                let (words, scales) = $fmt.pack(rows, cols, codes, scales);
                $name { rows, cols, words, scales }
            }
        }
    };
}

packed_matrix!(
    /// 4-bit weights with a Q24 scale per (row, group of 32): the [`W4A8`] format.
    Int4Matrix,
    W4A8,
    "4"
);
packed_matrix!(
    /// 8-bit weights with a Q24 scale per (row, group of 32): the [`W8A16`] format.
    Int8Matrix,
    W8A16,
    "8"
);

/// Quantises `w` `[rows][cols]` to 4-bit codes with one Q24 scale per (row, group of 32): the
/// scale with the least squared error among `ceil(max|w| * 2^24 / 7)` (codes `-7..=7`, every
/// weight within half a step) and 15 smaller candidates down to 0.70 × that (codes `-8..=7`,
/// the largest weights may be clipped); `code = round(w * 2^24 / scale)` half away from zero,
/// clamped. Deterministic.
///
/// # Errors
/// A non-finite weight, or a group whose scale exceeds `u32` (|w| >= 1792).
///
/// # Panics
/// When rows is not a multiple of 8 or cols not a multiple of 32 in 32..=16384.
pub fn quantize_int4(w: &[f32], rows: usize, cols: usize) -> Result<Int4Matrix> {
    let (words, scales) = W4A8.quantize(w, rows, cols, "int4 weights")?;
    Ok(Int4Matrix {
        rows,
        cols,
        words,
        scales,
    })
}

/// Quantises `w` `[rows][cols]` to 8-bit codes `-127..=127` with one Q24 scale per (row, group of
/// 32): `scale = ceil(max|w| * 2^24 / 127)`, `code = round(w * 2^24 / scale)` half away from
/// zero, so every weight is within half a step of its code. Deterministic.
///
/// # Errors
/// A non-finite weight, or a group whose scale exceeds `u32` (|w| >= 32512).
///
/// # Panics
/// When rows is not a multiple of 4 or cols not a multiple of 32 in 32..=16384.
pub fn quantize_int8(w: &[f32], rows: usize, cols: usize) -> Result<Int8Matrix> {
    let (words, scales) = W8A16.quantize(w, rows, cols, "int8 weights")?;
    Ok(Int8Matrix {
        rows,
        cols,
        words,
        scales,
    })
}

/// Per-block statistics of quantised activations, as the kernels read them (16 bytes, C layout).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct XBlock {
    /// Sum of the block's codes (removes the weight bias in the kernels).
    pub sum: i64,
    /// `e`: a code stands for `code << e` in Q16 units; `0..=25`.
    pub shift: i64,
}

// SAFETY: repr(C), two i64 and no padding: every bit pattern is a valid XBlock.
unsafe impl bytemuck::Zeroable for XBlock {}
// SAFETY: as above; Copy and 'static.
unsafe impl bytemuck::Pod for XBlock {}

/// Activations quantised per block of 32 (see the module docs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuantX {
    /// QMAX: 127 ([`W4A8`]) or 32767 ([`W8A16`]).
    pub qmax: i64,
    /// Codes `[k]` in `-qmax..=qmax`.
    pub q: Vec<i64>,
    /// One per block `[k/32]`.
    pub blocks: Vec<XBlock>,
}

impl QuantX {
    /// Columns.
    pub fn k(&self) -> usize {
        self.q.len()
    }

    /// The arena image the kernels read: `q` then `blocks`, as u64 words (`k + k/16` of them).
    pub fn to_words(&self) -> Vec<u64> {
        let mut v: Vec<u64> = self.q.iter().map(|&q| q as u64).collect();
        v.extend(
            self.blocks
                .iter()
                .flat_map(|b| [b.sum as u64, b.shift as u64]),
        );
        v
    }

    /// Parses an arena image (the inverse of [`QuantX::to_words`]).
    pub fn from_words(words: &[u64], k: usize, qmax: i64) -> QuantX {
        let q = words[..k].iter().map(|&w| w as i64).collect();
        let blocks = words[k..k + k / GROUP * 2]
            .chunks_exact(2)
            .map(|p| XBlock {
                sum: p[0] as i64,
                shift: p[1] as i64,
            })
            .collect();
        QuantX { qmax, q, blocks }
    }

    /// Bytes of the arena image for `k` columns.
    pub fn bytes(k: usize) -> usize {
        k * 8 + k / GROUP * std::mem::size_of::<XBlock>()
    }
}

fn quantize_x(x: &[i32], qmax: i64) -> QuantX {
    assert!(
        x.len() % GROUP == 0 && !x.is_empty() && x.len() <= K_MAX,
        "x must have a multiple of 32 elements in 32..=16384, not {}",
        x.len()
    );
    let mut q = Vec::with_capacity(x.len());
    let mut blocks = Vec::with_capacity(x.len() / GROUP);
    for blk in x.chunks_exact(GROUP) {
        let m = blk
            .iter()
            .map(|&v| (v as i64).unsigned_abs())
            .max()
            .unwrap_or(0);
        let half = |e: u32| (1u64 << e) >> 1;
        let e = (0..31)
            .find(|&e| (m + half(e)) >> e <= qmax as u64)
            .unwrap_or(31);
        let mut sum = 0i64;
        for &v in blk {
            let a = (v as i64).unsigned_abs();
            let r = ((a + half(e)) >> e) as i64;
            let r = if v < 0 { -r } else { r };
            q.push(r);
            sum += r;
        }
        blocks.push(XBlock {
            sum,
            shift: e as i64,
        });
    }
    QuantX { qmax, q, blocks }
}

/// Quantises Q16 activations for the [`W4A8`] kernels: codes in -127..=127 per block of 32
/// (twin of the BPF program `quantize_x8`).
///
/// # Panics
/// When `x.len()` is not a multiple of 32 in 32..=16384.
pub fn quantize_x8(x: &[i32]) -> QuantX {
    quantize_x(x, W4A8.act_max)
}

/// Quantises Q16 activations for the [`W8A16`] kernels: codes in -32767..=32767 per block of 32
/// (twin of the BPF program `quantize_x16`).
///
/// # Panics
/// When `x.len()` is not a multiple of 32 in 32..=16384.
pub fn quantize_x16(x: &[i32]) -> QuantX {
    quantize_x(x, W8A16.act_max)
}

/// The unrounded row sums `Σ_g (s · D) << e` (wrapping, as the kernels) of the row block starting
/// at `r0`, one per row of the block.
fn block_sums<M: PackedMatrix>(m: &M, xq: &QuantX, r0: usize) -> Vec<u64> {
    let f = M::FORMAT;
    let (rpb, cols, words) = (f.rows_per_block, m.cols(), m.words());
    let mask = (1u64 << f.bits) - 1;
    let mut acc = vec![0u64; rpb];
    let mut d = vec![0i64; rpb];
    for g in 0..cols / GROUP {
        d.iter_mut().for_each(|v| *v = 0);
        for j in g * GROUP..(g + 1) * GROUP {
            let x = xq.q[j];
            for h in 0..2 {
                let (i, _) = f.locate(cols, r0 + h * f.lanes, j);
                let word = words[i] >> (f.bits * (j % 4) as u32);
                for l in 0..f.lanes {
                    let w = ((word >> (f.lane_bits * l as u32)) & mask) as i64 - f.bias as i64;
                    d[h * f.lanes + l] += w * x;
                }
            }
        }
        let e = xq.blocks[g].shift as u32;
        for (l, a) in acc.iter_mut().enumerate() {
            let s = m.scale(r0 + l, g) as u64;
            *a = a.wrapping_add((d[l] as u64).wrapping_mul(s) << e);
        }
    }
    acc
}

fn check_run<M: PackedMatrix>(m: &M, xq: &QuantX, rows: &Range<usize>) {
    let f = M::FORMAT;
    assert_eq!(
        xq.k(),
        m.cols(),
        "{}: x has {} columns, the matrix {}",
        f.name,
        xq.k(),
        m.cols()
    );
    assert_eq!(
        xq.qmax, f.act_max,
        "{}: x quantised with QMAX {}, the format needs {}",
        f.name, xq.qmax, f.act_max
    );
    assert!(
        rows.start % f.rows_per_block == 0
            && rows.end % f.rows_per_block == 0
            && rows.end <= m.rows(),
        "{}: row range {rows:?} must be whole blocks of {} inside {} rows",
        f.name,
        f.rows_per_block,
        m.rows()
    );
}

/// `y[r] = sat(rshr(Σ_g (s · D) << e, 24))` (Q16) for r in `rows`, from pre-quantised
/// activations: the twin of the BPF programs `w4a8_matvec` / `w8a16_matvec` in store mode.
///
/// # Panics
/// On mismatched shapes or formats, or a row range that is not whole row blocks.
pub fn matvec_quantized<M: PackedMatrix>(m: &M, xq: &QuantX, rows: Range<usize>, y: &mut [i32]) {
    check_run(m, xq, &rows);
    for r0 in rows.step_by(M::FORMAT.rows_per_block) {
        for (l, acc) in block_sums(m, xq, r0).into_iter().enumerate() {
            y[r0 + l] = sat32(rshr(acc as i64, SCALE_SHIFT));
        }
    }
}

/// The residual add: `y[r] = sat(y[r] + rshr(Σ_g (s · D) << e, 8))`, y the i64 Q32 residual
/// stream: the twin of `w4a8_matvec` / `w8a16_matvec` in accumulate mode.
///
/// # Panics
/// As [`matvec_quantized`].
pub fn matvec_quantized_residual<M: PackedMatrix>(
    m: &M,
    xq: &QuantX,
    rows: Range<usize>,
    y: &mut [i64],
) {
    check_run(m, xq, &rows);
    for r0 in rows.step_by(M::FORMAT.rows_per_block) {
        for (l, acc) in block_sums(m, xq, r0).into_iter().enumerate() {
            y[r0 + l] =
                sat_res(y[r0 + l].wrapping_add(rshr(acc as i64, SCALE_SHIFT - (Q_RES - Q_ACT))));
        }
    }
}

/// Logits of `rows` (into `y` when given) and their argmax, first on ties, from pre-quantised
/// activations: the twin of `w4a8_lm_head_argmax` / `w8a16_lm_head_argmax`.
///
/// # Panics
/// As [`matvec_quantized`].
pub fn lm_head_argmax_quantized<M: PackedMatrix>(
    m: &M,
    xq: &QuantX,
    rows: Range<usize>,
    mut y: Option<&mut [i32]>,
) -> (usize, i32) {
    check_run(m, xq, &rows);
    let (mut best, mut best_val) = (rows.start, -ACT_MAX - 1);
    for r0 in rows.step_by(M::FORMAT.rows_per_block) {
        for (l, acc) in block_sums(m, xq, r0).into_iter().enumerate() {
            let v = sat32(rshr(acc as i64, SCALE_SHIFT));
            if let Some(y) = y.as_deref_mut() {
                y[r0 + l] = v;
            }
            if v as i64 > best_val {
                (best, best_val) = (r0 + l, v as i64);
            }
        }
    }
    (best, best_val as i32)
}

/// W4A8 matvec of Q16 activations: [`quantize_x8`] then [`matvec_quantized`].
pub fn w4a8_matvec(m: &Int4Matrix, x: &[i32], rows: Range<usize>, y: &mut [i32]) {
    matvec_quantized(m, &quantize_x8(x), rows, y)
}

/// W8A16 matvec of Q16 activations: [`quantize_x16`] then [`matvec_quantized`].
pub fn w8a16_matvec(m: &Int8Matrix, x: &[i32], rows: Range<usize>, y: &mut [i32]) {
    matvec_quantized(m, &quantize_x16(x), rows, y)
}

/// W4A8 LM head with argmax of Q16 activations: [`quantize_x8`] then [`lm_head_argmax_quantized`].
pub fn w4a8_lm_head_argmax(
    m: &Int4Matrix,
    x: &[i32],
    rows: Range<usize>,
    y: Option<&mut [i32]>,
) -> (usize, i32) {
    lm_head_argmax_quantized(m, &quantize_x8(x), rows, y)
}

/// W8A16 LM head with argmax of Q16 activations: [`quantize_x16`] then [`lm_head_argmax_quantized`].
pub fn w8a16_lm_head_argmax(
    m: &Int8Matrix,
    x: &[i32],
    rows: Range<usize>,
    y: Option<&mut [i32]>,
) -> (usize, i32) {
    lm_head_argmax_quantized(m, &quantize_x16(x), rows, y)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The lane algebra of the kernels, run in Rust on packed words, equals the direct sums.
    #[test]
    fn swar_lanes_decode_to_exact_group_dots() {
        for (f, xmax) in [(W4A8, 127i64), (W8A16, 32767)] {
            // extremes: all codes at the negative end times all activations at either end
            for (code, x) in [
                (-f.bias, -xmax),
                (-f.bias, xmax),
                (f.bias - 1, -xmax),
                (f.bias - 1, xmax),
                (3, -5),
            ] {
                let lanes = f.lanes;
                let one_col: u64 = (0..lanes)
                    .map(|l| ((code + f.bias) as u64) << (f.lane_bits * l as u32))
                    .sum();
                let mask: u64 = (0..lanes)
                    .map(|l| ((1u64 << f.bits) - 1) << (f.lane_bits * l as u32))
                    .sum();
                let ones: u64 = (0..lanes).map(|l| 1u64 << (f.lane_bits * l as u32)).sum();
                let half: u64 = (0..lanes - 1)
                    .map(|l| 1u64 << (f.lane_bits * (l as u32 + 1) - 1))
                    .sum();
                let mut a = 0u64;
                for _ in 0..GROUP {
                    a = a.wrapping_add((one_col & mask).wrapping_mul(x as u64));
                }
                let s = x * GROUP as i64;
                let q = a.wrapping_add(
                    half.wrapping_sub(((f.bias as i64 * s) as u64).wrapping_mul(ones)),
                );
                let want = code as i64 * x * GROUP as i64;
                for l in 0..lanes {
                    let lb = f.lane_bits * l as u32;
                    let d = if l == lanes - 1 {
                        (q as i64) >> lb
                    } else {
                        ((q >> lb) & ((1u64 << f.lane_bits) - 1)) as i64
                            - (1i64 << (f.lane_bits - 1))
                    };
                    assert_eq!(d, want, "{} lane {l}: code {code} x {x}", f.name);
                }
            }
        }
    }
}
