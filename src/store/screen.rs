//! The screened LM head resident in the arena: the BPF side of the scheme [`crate::num::bound`]
//! proves exact (screen with a low-bit copy, bound each row's error, rescore the rows that can
//! still win).

use crate::kernel::arena::{Region, PAGE};
use crate::kernel::ops::Ops;
use crate::kernel::swar_ops::{
    ExactHead, PackedRegions, QuantXRegion, ScreenRegions, ScreenResult,
};
use crate::num::bound::{dequantize, token_bound, Screen, ScreenWeights};
use crate::num::swar::{Format, QuantX, GROUP};
use crate::Result;

/// A screen resident in the arena, driving the BPF side of the scheme for one store.
#[derive(Debug)]
pub struct ScreenedHead {
    mat: PackedRegions,
    regions: ScreenRegions,
    xq: QuantXRegion,
    ws: u32,
    l1: u128,
    rows: usize,
    k: usize,
    /// What the last screened token found (`None`: none yet, or the exact head ran).
    pub last: Option<ScreenResult>,
    /// Tokens left before the screen is tried again, and the current back-off.
    skip: u32,
    backoff: u32,
}

/// A screen that rescored more than this fraction of the rows (1 / BACKOFF_FRACTION) cost more
/// than it saved: it is skipped for the next 1, 2, 4, … [`BACKOFF_MAX`] tokens, doubling while
/// it keeps failing (the exact head runs meanwhile; the answer is the same either way).
pub const BACKOFF_FRACTION: usize = 4;
/// The longest back-off, in tokens.
pub const BACKOFF_MAX: u32 = 64;

impl ScreenedHead {
    /// Arena bytes [`ScreenedHead::upload`] takes for a `rows` × `k` head screened in `format`,
    /// page-rounded per buffer.
    pub fn arena_bytes(format: Format, rows: usize, k: usize) -> usize {
        let page = |b: usize| b.div_ceil(PAGE) * PAGE;
        page(rows * k * format.bits as usize / 8)
            + page(rows * (k / GROUP) * 4)
            + 3 * page(rows * 4)
            + page(QuantX::bytes(k))
    }

    /// Copies `screen` into the arena, with its logit and activation buffers.
    pub fn upload(ops: &mut Ops, screen: &Screen) -> Result<ScreenedHead> {
        let mat = match &screen.weights {
            ScreenWeights::W4(m) => ops.upload_int4(m)?,
            ScreenWeights::W8(m) => ops.upload_int8(m)?,
        };
        let (rows, k) = (mat.rows, mat.cols);
        let mut put = |v: &[u32], what: &str| -> Result<Region> {
            let r = ops.arena.alloc(v.len() * 4, what)?;
            ops.arena.slice_mut::<u32>(r)?.copy_from_slice(v);
            Ok(r)
        };
        let regions = ScreenRegions {
            nd: put(&screen.nd, "screen error norms")?,
            nv: put(&screen.nv, "screen weight norms")?,
            s: ops.arena.alloc(rows * 4, "screen logits")?,
        };
        let xq = ops.alloc_quant_x(k, mat.format)?;
        Ok(ScreenedHead {
            mat,
            regions,
            xq,
            ws: screen.ws,
            l1: screen.l1,
            rows,
            k,
            last: None,
            skip: 0,
            backoff: 0,
        })
    }

    /// The exact argmax of the whole head for the Q16 activations `x` (for a W8 head, already
    /// quantised into its `xq`), or `None` when the bound cannot be trusted for this token (see
    /// [`token_bound`]): then the caller runs the exact head.
    pub fn argmax(
        &mut self,
        ops: &mut Ops,
        x: Region,
        exact: &ExactHead,
    ) -> Result<Option<(usize, i32)>> {
        self.last = None;
        if self.skip > 0 {
            self.skip -= 1;
            return Ok(None);
        }
        ops.quantize_x(x, &self.xq)?;
        let xh = dequantize(&ops.read_quant_x(&self.xq)?);
        let xe: Vec<i64> = match exact {
            ExactHead::Q24 { x, .. } => ops
                .arena
                .slice::<i32>(x.sub(0, self.k * 4)?)?
                .iter()
                .map(|&v| v as i64)
                .collect(),
            ExactHead::W8 { xq, .. } => dequantize(&ops.read_quant_x(xq)?),
        };
        let Some(t) = token_bound(self.ws, self.l1, &xe, &xh) else {
            return Ok(None);
        };
        ops.swar_matvec(&self.mat, &self.xq, self.regions.s, 0..self.rows, false)?;
        let r = ops.screen_argmax(&self.regions, exact, self.rows, self.k, &t)?;
        self.last = Some(r);
        if r.candidates * BACKOFF_FRACTION > self.rows {
            self.backoff = (self.backoff * 2).clamp(1, BACKOFF_MAX);
            self.skip = self.backoff;
        } else {
            self.backoff = 0;
        }
        Ok(Some((r.best, r.best_val)))
    }
}
