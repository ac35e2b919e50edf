//! The low-bit SWAR programs of `src/bpf/swar.inc.c` (part of the operator object): uploading
//! packed matrices into the arena, quantising activations, W4A8 / W8A16 matvec and LM head.
//! Formats and layouts are documented in [`crate::num::swar`], whose functions are the bit-exact
//! twins of these programs.

use super::arena::Region;
use super::operators::Batch;
use super::ops::{first_best, Ops, Rows};
use crate::num::swar::{
    Format, Int4Matrix, Int8Matrix, PackedMatrix, QuantX, GROUP, K_MAX, W4A8, W8A16,
};
use crate::{Error, Result};

use super::ops::skel::types::{quantize_x_args, screen_argmax_args, swar_mv_args};
use crate::num::bound::TokenBound;

/// A packed matrix in the arena (see [`Ops::upload_int4`], [`Ops::upload_int8`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PackedRegions {
    /// Which packing the words use.
    pub format: Format,
    /// The code words, in the kernel's layout.
    pub words: Region,
    /// The Q24 scales, in the kernel's layout.
    pub scales: Region,
    /// Rows.
    pub rows: usize,
    /// Columns.
    pub cols: usize,
}

/// An arena buffer for activations quantised per block of 32: `i64 q[k]` then the blocks
/// (see [`crate::num::swar::QuantX`]). Filled by [`Ops::quantize_x`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QuantXRegion {
    /// The buffer, [`QuantX::bytes`]`(k)` long.
    pub region: Region,
    /// Columns.
    pub k: usize,
    /// The format whose kernels read it (its QMAX decides the codes' range).
    pub format: Format,
}

/// Arena bytes of [`Ops::alloc_unpack_scratch`] for matrices of up to `k_max` columns: one
/// unpacked row block (16 bytes per column) for each of up to
/// [`crate::kernel::plan::THREADS_MAX`] threads.
pub fn unpack_scratch_bytes(k_max: usize) -> usize {
    crate::kernel::plan::THREADS_MAX * 16 * k_max
}

fn invalid(msg: String) -> Error {
    Error::Invalid(msg)
}

impl Ops {
    fn upload_packed<M: PackedMatrix>(&mut self, m: &M) -> Result<PackedRegions> {
        let f = M::FORMAT;
        let words = self
            .arena
            .alloc(m.words().len() * 8, &format!("{} weight words", f.name))?;
        self.arena
            .slice_mut::<u64>(words)?
            .copy_from_slice(m.words());
        let scales = self
            .arena
            .alloc(m.scales().len() * 4, &format!("{} weight scales", f.name))?;
        self.arena
            .slice_mut::<u32>(scales)?
            .copy_from_slice(m.scales());
        Ok(PackedRegions {
            format: f,
            words,
            scales,
            rows: m.rows(),
            cols: m.cols(),
        })
    }

    /// Copies a 4-bit matrix into newly allocated arena regions.
    pub fn upload_int4(&mut self, m: &Int4Matrix) -> Result<PackedRegions> {
        self.upload_packed(m)
    }

    /// Copies an 8-bit matrix into newly allocated arena regions.
    pub fn upload_int8(&mut self, m: &Int8Matrix) -> Result<PackedRegions> {
        self.upload_packed(m)
    }

    /// Allocates the scratch with which the batched SWAR matvecs ([`Ops::swar_matvec_batch`] of
    /// two or more vectors, on matrices of up to `k_max` columns) unpack each row block's words
    /// once for the whole batch instead of once per vector: the same integers, fewer
    /// instructions. [`unpack_scratch_bytes`]`(k_max)` bytes. Without it they read the packed
    /// words for every vector.
    pub fn alloc_unpack_scratch(&mut self, k_max: usize) -> Result<()> {
        if k_max == 0 || k_max % GROUP != 0 || k_max > K_MAX {
            return Err(invalid(format!(
                "unpack scratch for {k_max} columns: need a multiple of {GROUP} in {GROUP}..={K_MAX}"
            )));
        }
        let r = self
            .arena
            .alloc(unpack_scratch_bytes(k_max), "SWAR unpacked row blocks")?;
        self.unpack = Some((r, k_max));
        Ok(())
    }

    /// For benchmarks and tests: whether the batched SWAR matvecs use the scratch of
    /// [`Ops::alloc_unpack_scratch`] (the default once it is allocated) or read the packed words
    /// for every vector. Both give the same integers.
    pub fn set_unpacking(&mut self, on: bool) {
        self.unpack_on = on;
    }

    /// The scratch of [`Ops::alloc_unpack_scratch`], if allocated: part i of a batched SWAR
    /// matvec on `k_max`-column scratch unpacks into its bytes from `i * 16 * k_max`.
    pub fn unpack_scratch(&self) -> Option<Region> {
        self.unpack.map(|(r, _)| r)
    }

    /// Allocates a quantised-activation buffer of `k` columns for the kernels of `format`.
    pub fn alloc_quant_x(&mut self, k: usize, format: Format) -> Result<QuantXRegion> {
        self.alloc_quant_x_batch(k, format, 1)
    }

    /// Allocates quantised-activation buffers of `k` columns for `n` consecutive vectors.
    pub fn alloc_quant_x_batch(
        &mut self,
        k: usize,
        format: Format,
        n: usize,
    ) -> Result<QuantXRegion> {
        if k == 0 || k % GROUP != 0 || k > K_MAX {
            return Err(invalid(format!(
                "quantised x of {k} columns: need a multiple of {GROUP} in {GROUP}..={K_MAX}"
            )));
        }
        let region = self.arena.alloc(
            n.max(1) * QuantX::bytes(k),
            &format!("{} quantised activations", format.name),
        )?;
        Ok(QuantXRegion { region, k, format })
    }

    /// Quantises the Q16 activations `x` (`k` i32) into `xq` in BPF: `quantize_x8` for W4A8,
    /// `quantize_x16` for W8A16 (twins [`crate::num::swar::quantize_x8`], [`crate::num::swar::quantize_x16`]).
    pub fn quantize_x(&mut self, x: Region, xq: &QuantXRegion) -> Result<()> {
        self.quantize_x_batch(x, xq, 1)
    }

    /// [`Ops::quantize_x`] of `n` consecutive vectors (x i32 Q16 `[n][k]`) into `n` consecutive
    /// quantised vectors of `QuantX::bytes(k)` each.
    pub fn quantize_x_batch(&mut self, x: Region, xq: &QuantXRegion, n: usize) -> Result<()> {
        let max = crate::num::limits::BATCH_MAX;
        if n == 0 || n > max {
            return Err(invalid(format!(
                "quantize_x: a batch of {n} vectors (1..={max})"
            )));
        }
        if x.len < n * xq.k * 4 || xq.region.len < n * QuantX::bytes(xq.k) {
            return Err(invalid(format!(
                "quantize_x: x of {} bytes or xq of {} for {n} vectors of k = {}",
                x.len, xq.region.len, xq.k
            )));
        }
        let mut a = quantize_x_args {
            x: self.addr_of(x),
            xq: self.addr_of(xq.region),
            k: xq.k as u32,
            nb: n as u32,
        };
        let prog = if xq.format == W4A8 {
            "quantize_x8"
        } else {
            "quantize_x16"
        };
        self.run(prog, &mut a)
    }

    /// Checks shapes and builds the ctx of one SWAR matrix program.
    fn swar_args(
        &self,
        f: Format,
        m: &PackedRegions,
        xq: &QuantXRegion,
        y: Option<Region>,
        rows: &Rows,
    ) -> Result<swar_mv_args> {
        let what = f.name;
        if m.format != f || xq.format != f {
            return Err(invalid(format!(
                "{what}: matrix in {} and activations for {}",
                m.format.name, xq.format.name
            )));
        }
        if xq.k != m.cols {
            return Err(invalid(format!(
                "{what}: x has {} columns, the matrix {}",
                xq.k, m.cols
            )));
        }
        let rpb = f.rows_per_block;
        if rows.start % rpb != 0
            || rows.end % rpb != 0
            || rows.end > m.rows
            || rows.start > rows.end
        {
            return Err(invalid(format!(
                "{what}: rows {rows:?} must be whole blocks of {rpb} inside {} rows",
                m.rows
            )));
        }
        if let Some(y) = y {
            if y.len < rows.end * 4 {
                return Err(invalid(format!(
                    "{what}: y of {} bytes for rows up to {}",
                    y.len, rows.end
                )));
            }
        }
        Ok(swar_mv_args {
            w: self.addr_of(m.words),
            s: self.addr_of(m.scales),
            xq: self.addr_of(xq.region),
            y: y.map(|r| self.addr_of(r)).unwrap_or(0),
            k: m.cols as u32,
            row0: rows.start as u32,
            nrows: rows.len() as u32,
            nb: 1,
            ..Default::default()
        })
    }

    #[allow(clippy::too_many_arguments)]
    fn swar_matvec_as(
        &mut self,
        f: Format,
        m: &PackedRegions,
        xq: &QuantXRegion,
        y: Region,
        rows: Rows,
        accumulate: bool,
        batch: Batch,
    ) -> Result<()> {
        let y_elem = if accumulate { 8 } else { 4 };
        batch.check(f.name, xq.region, QuantX::bytes(xq.k), y, rows.end * y_elem)?;
        let a = swar_mv_args {
            nb: batch.n as u32,
            ystride: batch.y_stride as u64,
            ..self.swar_args(f, m, xq, Some(y), &rows)?
        };
        // each part (thread) unpacks its row blocks into scratch of its own
        let unpack = match self.unpack {
            Some((r, k_max)) if self.unpack_on && batch.n > 1 && m.cols <= k_max => {
                Some((self.addr_of(r), k_max))
            }
            _ => None,
        };
        let mut parts: Vec<swar_mv_args> = self
            .parts(rows.clone(), rows.len() * m.cols * batch.n)
            .into_iter()
            .enumerate()
            .map(|(i, p)| swar_mv_args {
                row0: p.start as u32,
                nrows: p.len() as u32,
                accumulate: accumulate as u32,
                unpack: unpack.map_or(0, |(at, k_max)| at + (i * 16 * k_max) as u64),
                ..a
            })
            .collect();
        self.run_parts(&format!("{}_matvec", f.name), &mut parts)
    }

    fn swar_lm_head_as(
        &mut self,
        f: Format,
        m: &PackedRegions,
        xq: &QuantXRegion,
        y: Option<Region>,
        rows: Rows,
    ) -> Result<(usize, i32)> {
        let a = self.swar_args(f, m, xq, y, &rows)?;
        let mut parts: Vec<swar_mv_args> = self
            .parts(rows.clone(), rows.len() * m.cols)
            .into_iter()
            .map(|p| swar_mv_args {
                row0: p.start as u32,
                nrows: p.len() as u32,
                ..a
            })
            .collect();
        self.pending.1 = Some(crate::kernel::plan::HeadFields::at(
            std::mem::offset_of!(swar_mv_args, best),
            std::mem::offset_of!(swar_mv_args, best_val),
        ));
        self.run_parts(&format!("{}_lm_head_argmax", f.name), &mut parts)?;
        Ok(first_best(
            rows.start,
            parts.iter().map(|p| (p.best as usize, p.best_val)),
        ))
    }

    /// [`Ops::w4a8_matvec`] or [`Ops::w8a16_matvec`], whichever `m.format` is: for callers that
    /// hold matrices of either format.
    pub fn swar_matvec(
        &mut self,
        m: &PackedRegions,
        xq: &QuantXRegion,
        y: Region,
        rows: Rows,
        accumulate: bool,
    ) -> Result<()> {
        self.swar_matvec_as(m.format, m, xq, y, rows, accumulate, Batch::ONE)
    }

    /// [`Ops::swar_matvec`] for each of `batch.n` vectors quantised by
    /// [`Ops::quantize_x_batch`]; vector b of y at `b * batch.y_stride` bytes. Each row block is
    /// read from memory once for the whole batch.
    pub fn swar_matvec_batch(
        &mut self,
        m: &PackedRegions,
        xq: &QuantXRegion,
        y: Region,
        rows: Rows,
        accumulate: bool,
        batch: Batch,
    ) -> Result<()> {
        self.swar_matvec_as(m.format, m, xq, y, rows, accumulate, batch)
    }

    /// [`Ops::w4a8_lm_head_argmax`] or [`Ops::w8a16_lm_head_argmax`], whichever `m.format` is.
    pub fn swar_lm_head_argmax(
        &mut self,
        m: &PackedRegions,
        xq: &QuantXRegion,
        y: Option<Region>,
        rows: Rows,
    ) -> Result<(usize, i32)> {
        self.swar_lm_head_as(m.format, m, xq, y, rows)
    }

    /// `y[r] = W x` (y i32 Q16) or, when `accumulate`, `y[r] += W x` (y the i64 Q32 residual
    /// stream), for r in `rows` (whole blocks of 8), W 4-bit, x from [`Ops::quantize_x`] into a
    /// W4A8 buffer. Twins: [`crate::num::swar::matvec_quantized`], [`crate::num::swar::matvec_quantized_residual`].
    pub fn w4a8_matvec(
        &mut self,
        m: &PackedRegions,
        xq: &QuantXRegion,
        y: Region,
        rows: Rows,
        accumulate: bool,
    ) -> Result<()> {
        self.swar_matvec_as(W4A8, m, xq, y, rows, accumulate, Batch::ONE)
    }

    /// As [`Ops::w4a8_matvec`] for rows in whole blocks of 4, W 8-bit, x quantised into a W8A16
    /// buffer.
    pub fn w8a16_matvec(
        &mut self,
        m: &PackedRegions,
        xq: &QuantXRegion,
        y: Region,
        rows: Rows,
        accumulate: bool,
    ) -> Result<()> {
        self.swar_matvec_as(W8A16, m, xq, y, rows, accumulate, Batch::ONE)
    }

    /// 4-bit logits of `rows` (into `y` when given) and their argmax (row, Q16 logit), first on
    /// ties. Twin: [`crate::num::swar::lm_head_argmax_quantized`].
    pub fn w4a8_lm_head_argmax(
        &mut self,
        m: &PackedRegions,
        xq: &QuantXRegion,
        y: Option<Region>,
        rows: Rows,
    ) -> Result<(usize, i32)> {
        self.swar_lm_head_as(W4A8, m, xq, y, rows)
    }

    /// 8-bit logits of `rows` (into `y` when given) and their argmax, first on ties.
    pub fn w8a16_lm_head_argmax(
        &mut self,
        m: &PackedRegions,
        xq: &QuantXRegion,
        y: Option<Region>,
        rows: Rows,
    ) -> Result<(usize, i32)> {
        self.swar_lm_head_as(W8A16, m, xq, y, rows)
    }
}

/// The exact head the `screen_argmax` program rescores candidates with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExactHead {
    /// Q24 rows `[rows][k]` (`lm_head_argmax`'s integers) times the Q16 activations `x`.
    Q24 {
        /// The whole head.
        w: Region,
        /// `k` i32 Q16 activations.
        x: Region,
    },
    /// A W8A16 head (`w8a16_lm_head_argmax`'s integers) times its quantised activations.
    W8 {
        /// The whole head.
        head: PackedRegions,
        /// The activations, quantised by `quantize_x16`.
        xq: QuantXRegion,
    },
}

/// Arena regions of a screened head (see [`crate::num::bound`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScreenRegions {
    /// The screen logits, i32 `[rows]`.
    pub s: Region,
    /// `nd`, u32 `[rows]`.
    pub nd: Region,
    /// `nv`, u32 `[rows]`.
    pub nv: Region,
}

/// What `screen_argmax` found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScreenResult {
    /// The exact argmax (first on ties).
    pub best: usize,
    /// Its exact Q16 logit.
    pub best_val: i32,
    /// Rows rescored exactly (whole blocks of 4 for a W8 head).
    pub candidates: usize,
    /// The best lower bound `L`.
    pub lower: i64,
}

impl Ops {
    /// The exact argmax over `rows` rows of the head from screen logits already in `r.s`, the
    /// per-row norms and the token's bound factors (BPF `screen_argmax`, one run; twin:
    /// [`crate::num::bound::candidates`] then [`crate::num::bound::rescore`]).
    pub fn screen_argmax(
        &mut self,
        r: &ScreenRegions,
        exact: &ExactHead,
        rows: usize,
        k: usize,
        t: &TokenBound,
    ) -> Result<ScreenResult> {
        if r.s.len < rows * 4 || r.nd.len < rows * 4 || r.nv.len < rows * 4 {
            return Err(invalid(format!(
                "screen_argmax: buffers too small for {rows} rows"
            )));
        }
        let (w, ws, x, w8) = match exact {
            ExactHead::Q24 { w, x } => {
                if w.len < rows * k * 4 || x.len < k * 4 {
                    return Err(invalid(format!("screen_argmax: a Q24 head of {rows}x{k}")));
                }
                (self.addr_of(*w), 0, self.addr_of(*x), 0)
            }
            ExactHead::W8 { head, xq } => {
                if head.format != W8A16
                    || xq.format != W8A16
                    || head.cols != k
                    || xq.k != k
                    || head.rows < rows
                {
                    return Err(invalid(format!("screen_argmax: a W8 head of {rows}x{k}")));
                }
                (
                    self.addr_of(head.words),
                    self.addr_of(head.scales),
                    self.addr_of(xq.region),
                    1,
                )
            }
        };
        let mut a = screen_argmax_args {
            s: self.addr_of(r.s),
            nd: self.addr_of(r.nd),
            nv: self.addr_of(r.nv),
            w,
            ws,
            x,
            bx: t.x,
            by: t.y,
            k: k as u32,
            rows: rows as u32,
            shift: t.shift,
            w8,
            ..Default::default()
        };
        self.run("screen_argmax", &mut a)?;
        Ok(ScreenResult {
            best: a.best as usize,
            best_val: a.best_val as i32,
            candidates: a.candidates as usize,
            lower: a.lower,
        })
    }

    /// The activations in a quantised buffer, as the twin's [`QuantX`].
    pub fn read_quant_x(&self, xq: &QuantXRegion) -> Result<QuantX> {
        let words = self.arena.slice::<u64>(xq.region)?;
        Ok(QuantX::from_words(words, xq.k, xq.format.act_max))
    }
}
