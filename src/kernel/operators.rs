//! The operators of the forward pass: one method per BPF program, each filling the program's
//! ctx with arena addresses and running it once (split across threads by rows where it is
//! large), or recording it while a plan is recorded.

use super::arena::Region;
use super::ops::skel::types::*;
use super::ops::{check_ret, first_best, Ops, Rows};
use super::plan::{Patch, Var, HeadFields};
use crate::{Error, Result};

/// The arena regions one int8-KV attention run reads and writes (see `src/bpf/kv8.inc.c`).
#[derive(Debug, Clone, Copy)]
pub struct AttentionI8Buffers {
    /// Queries `[n_q][hd]` (Q22).
    pub q: Region,
    /// This position's keys `[n_kv][hd]` (Q16).
    pub k: Region,
    /// This position's values `[n_kv][hd]` (Q16).
    pub v: Region,
    /// The layer's key codes `[n_kv][max_ctx][hd]` (i8), the kv heads `codes_stride` bytes apart.
    pub k_codes: Region,
    /// The layer's key steps `[n_kv][max_ctx]` (u32), the kv heads `steps_stride` bytes apart.
    pub k_steps: Region,
    /// The layer's value codes, laid out as the key codes.
    pub v_codes: Region,
    /// The layer's value steps, laid out as the key steps.
    pub v_steps: Region,
    /// Bytes from one kv head's codes to the next (at least `max_ctx * hd`).
    pub codes_stride: usize,
    /// Bytes from one kv head's steps to the next (at least `max_ctx * 4`).
    pub steps_stride: usize,
    /// Scratch `[n_q][max_ctx]` u32.
    pub probs: Region,
    /// Scratch `[n_pairs][max_ctx]` u64.
    pub wv: Region,
    /// Scratch `[n_pairs][hd]` u64.
    pub qq: Region,
    /// Scratch `[n_pairs][hd]` u64.
    pub acc: Region,
    /// Output `[n_q][hd]`.
    pub out: Region,
    /// The exp2 table.
    pub exp2: Region,
    /// The layer's key smoothing shifts `[hd]` (u8).
    pub ksh: Region,
}

/// A block of vectors through one batched operator (a prefill block): `n` vectors, x's
/// consecutive, y's `y_stride` bytes apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Batch {
    /// Vectors, 1..=[`crate::num::limits::BATCH_MAX`].
    pub n: usize,
    /// Bytes from one output vector to the next (unused when `n` is 1).
    pub y_stride: usize,
}

impl Batch {
    /// One vector: the decode step.
    pub const ONE: Batch = Batch { n: 1, y_stride: 0 };

    /// Checks the batch size and that `x` holds `n` vectors of `x_bytes` and `y` reaches
    /// `y_end` bytes into its last vector.
    pub(crate) fn check(
        &self,
        what: &str,
        x: Region,
        x_bytes: usize,
        y: Region,
        y_end: usize,
    ) -> Result<()> {
        let max = crate::num::limits::BATCH_MAX;
        if self.n == 0 || self.n > max {
            return Err(Error::Invalid(format!(
                "{what}: a batch of {} vectors (1..={max})",
                self.n
            )));
        }
        let y_need = (self.n - 1) * self.y_stride + y_end;
        if x.len < self.n * x_bytes || y.len < y_need {
            return Err(Error::Invalid(format!(
                "{what}: {} vectors need x of {} bytes and y of {y_need}, got {} and {}",
                self.n,
                self.n * x_bytes,
                x.len,
                y.len
            )));
        }
        Ok(())
    }
}

/// Query-head pairs of the int8-KV attention: `n_kv * ceil(group / 2)`.
pub fn kv8_pairs(n_q: usize, n_kv: usize) -> usize {
    n_kv * (n_q / n_kv).div_ceil(2)
}

/// The arena regions one attention run reads and writes.
#[derive(Debug, Clone, Copy)]
pub struct AttentionBuffers {
    /// Queries `[n_q][hd]`.
    pub q: Region,
    /// This position's keys `[n_kv][hd]`.
    pub k: Region,
    /// This position's values `[n_kv][hd]`.
    pub v: Region,
    /// The layer's key cache `[max_ctx][n_kv][hd]`.
    pub k_cache: Region,
    /// The layer's value cache.
    pub v_cache: Region,
    /// Scratch `[n_q][max_ctx]` u32.
    pub probs: Region,
    /// Scratch `[n_q][hd]` i64.
    pub acc: Region,
    /// Output `[n_q][hd]`.
    pub out: Region,
    /// The exp2 table.
    pub exp2: Region,
}

impl Ops {
    /// `x = table[token]` (Q24 → Q16), `dim` wide.
    pub fn embed(&mut self, table: Region, token: u32, dim: usize, x: Region) -> Result<()> {
        let mut a = embed_args {
            table: self.addr_of(table),
            x: self.addr_of(x),
            token,
            dim: dim as u32,
        };
        self.patch_next(vec![Patch::new(
            std::mem::offset_of!(embed_args, token),
            4,
            Var::Token,
            1,
        )]);
        self.run("embed", &mut a)
    }

    /// RMSNorm of `nvec` consecutive `n`-wide vectors at `x` into `y` (Q16). `x` is the i64 Q32
    /// residual stream when `wide`, else i32 Q16 (and then `y` may equal `x`).
    #[allow(clippy::too_many_arguments)]
    pub fn rmsnorm(
        &mut self,
        x: Region,
        wide: bool,
        w: Region,
        y: Region,
        n: usize,
        nvec: usize,
        eps_q64: u64,
    ) -> Result<()> {
        let mut a = rmsnorm_args {
            x: self.addr_of(x),
            w: self.addr_of(w),
            y: self.addr_of(y),
            eps_q64,
            n: n as u32,
            nvec: nvec as u32,
            wide: wide as u32,
            ret: 0,
        };
        self.run("rmsnorm", &mut a)?;
        check_ret("rmsnorm", a.ret)
    }

    /// Per-head q_norm/k_norm and RoPE at `pos`, in place. `cos`/`sin` are the whole RoPE
    /// tables (`[max_ctx][hd/2]`).
    #[allow(clippy::too_many_arguments)]
    pub fn qk_norm_rope(
        &mut self,
        q: Region,
        k: Region,
        q_norm: Region,
        k_norm: Region,
        cos: Region,
        sin: Region,
        pos: usize,
        n_q: usize,
        n_k: usize,
        hd: usize,
        eps_q64: u64,
    ) -> Result<()> {
        let row = hd / 2 * 4;
        let (cos, sin) = (cos.sub(pos * row, row)?, sin.sub(pos * row, row)?);
        let mut a = qk_norm_rope_args {
            q: self.addr_of(q),
            k: self.addr_of(k),
            q_norm: self.addr_of(q_norm),
            k_norm: self.addr_of(k_norm),
            cos: self.addr_of(cos),
            sin: self.addr_of(sin),
            eps_q64,
            n_q: n_q as u32,
            n_k: n_k as u32,
            hd: hd as u32,
            ret: 0,
        };
        self.patch_next(vec![
            Patch::new(
                std::mem::offset_of!(qk_norm_rope_args, cos),
                8,
                Var::Pos,
                row,
            ),
            Patch::new(
                std::mem::offset_of!(qk_norm_rope_args, sin),
                8,
                Var::Pos,
                row,
            ),
        ]);
        self.run("qk_norm_rope", &mut a)?;
        check_ret("qk_norm_rope", a.ret)
    }

    /// `y[r] = W[r]·x` (y i32 Q16) or, when `accumulate`, `y[r] += W[r]·x` (y the i64 Q32
    /// residual stream), for r in `rows`. `w` holds exactly those rows (Q24, `k` columns): a
    /// resident matrix's sub-region or a staging window.
    pub fn matvec(
        &mut self,
        w: Region,
        x: Region,
        y: Region,
        k: usize,
        rows: Rows,
        accumulate: bool,
    ) -> Result<()> {
        self.matvec_batch(w, x, y, k, rows, accumulate, Batch::ONE)
    }

    /// [`Ops::matvec`] for each of `batch.n` vectors: x i32 Q16 `[n][k]`, vector b of y at
    /// `b * batch.y_stride` bytes. Each row block is read from memory once for the whole batch.
    #[allow(clippy::too_many_arguments)]
    pub fn matvec_batch(
        &mut self,
        w: Region,
        x: Region,
        y: Region,
        k: usize,
        rows: Rows,
        accumulate: bool,
        batch: Batch,
    ) -> Result<()> {
        let y_elem = if accumulate { 8 } else { 4 };
        batch.check("matvec", x, k * 4, y, rows.end * y_elem)?;
        let (w0, x, y) = (self.addr_of(w), self.addr_of(x), self.addr_of(y));
        let mut parts: Vec<matvec_args> = self
            .parts(rows.clone(), rows.len() * k * batch.n)
            .into_iter()
            .map(|p| matvec_args {
                w: w0 + ((p.start - rows.start) * k * 4) as u64,
                x,
                y,
                k: k as u32,
                row0: p.start as u32,
                nrows: p.len() as u32,
                accumulate: accumulate as u32,
                nb: batch.n as u32,
                ystride: batch.y_stride as u64,
                ..Default::default()
            })
            .collect();
        self.run_parts("matvec", &mut parts)
    }

    /// `y[r] = silu(gate[r]·x) * (up[r]·x)` for r in `rows`; `gate` and `up` hold those rows.
    #[allow(clippy::too_many_arguments)]
    pub fn gate_up_swiglu(
        &mut self,
        gate: Region,
        up: Region,
        x: Region,
        y: Region,
        exp2: Region,
        k: usize,
        rows: Rows,
    ) -> Result<()> {
        self.gate_up_swiglu_batch(gate, up, x, y, exp2, k, rows, Batch::ONE)
    }

    /// [`Ops::gate_up_swiglu`] for each of `batch.n` vectors (x i32 Q16 `[n][k]`, vector b of y
    /// at `b * batch.y_stride` bytes).
    #[allow(clippy::too_many_arguments)]
    pub fn gate_up_swiglu_batch(
        &mut self,
        gate: Region,
        up: Region,
        x: Region,
        y: Region,
        exp2: Region,
        k: usize,
        rows: Rows,
        batch: Batch,
    ) -> Result<()> {
        batch.check("gate_up_swiglu", x, k * 4, y, rows.end * 4)?;
        let (g0, u0, x, y, exp2) = (
            self.addr_of(gate),
            self.addr_of(up),
            self.addr_of(x),
            self.addr_of(y),
            self.addr_of(exp2),
        );
        let mut parts: Vec<gate_up_args> = self
            .parts(rows.clone(), 2 * rows.len() * k * batch.n)
            .into_iter()
            .map(|p| {
                let skip = ((p.start - rows.start) * k * 4) as u64;
                gate_up_args {
                    gate: g0 + skip,
                    up: u0 + skip,
                    x,
                    y,
                    exp2,
                    k: k as u32,
                    row0: p.start as u32,
                    nrows: p.len() as u32,
                    nb: batch.n as u32,
                    ystride: batch.y_stride as u64,
                }
            })
            .collect();
        self.run_parts("gate_up_swiglu", &mut parts)
    }

    /// `y[i] = silu(gate[i]) * up[i]` for `n` Q16 values (y may alias either input).
    pub fn swiglu(
        &mut self,
        gate: Region,
        up: Region,
        y: Region,
        exp2: Region,
        n: usize,
    ) -> Result<()> {
        let mut a = swiglu_args {
            gate: self.addr_of(gate),
            up: self.addr_of(up),
            y: self.addr_of(y),
            exp2: self.addr_of(exp2),
            n: n as u32,
            pad: 0,
        };
        self.run("swiglu_vec", &mut a)
    }

    /// Logits of `rows` (into `y`, indexed by row, when given) and their argmax: (row, Q16
    /// logit), the first row on ties. `w` holds those rows.
    pub fn lm_head_argmax(
        &mut self,
        w: Region,
        x: Region,
        y: Option<Region>,
        k: usize,
        rows: Rows,
    ) -> Result<(usize, i32)> {
        let (w0, x, y) = (
            self.addr_of(w),
            self.addr_of(x),
            y.map(|r| self.addr_of(r)).unwrap_or(0),
        );
        let mut parts: Vec<lm_head_args> = self
            .parts(rows.clone(), rows.len() * k)
            .into_iter()
            .map(|p| lm_head_args {
                w: w0 + ((p.start - rows.start) * k * 4) as u64,
                x,
                y,
                k: k as u32,
                row0: p.start as u32,
                nrows: p.len() as u32,
                ..Default::default()
            })
            .collect();
        self.pending.1 = Some(HeadFields::at(
            std::mem::offset_of!(lm_head_args, best),
            std::mem::offset_of!(lm_head_args, best_val),
        ));
        self.run_parts("lm_head_argmax", &mut parts)?;
        Ok(first_best(
            rows.start,
            parts.iter().map(|a| (a.best as usize, a.best_val)),
        ))
    }

    /// Causal GQA attention at `pos` (see [`crate::num::fixed::attention`]).
    pub fn attention(
        &mut self,
        b: &AttentionBuffers,
        pos: usize,
        s: crate::num::fixed::AttnShape,
        scale_q22: i32,
    ) -> Result<()> {
        // split by kv heads as attention_i8 is (a plan is recorded at position 0 for every one)
        let macs = 2 * (pos + 1) * s.n_q * s.hd;
        let n = if self.is_recording() || macs >= self.par_min_macs / 4 {
            self.threads.min(s.n_kv)
        } else {
            1
        };
        let a = attention_args {
            q: self.addr_of(b.q),
            k: self.addr_of(b.k),
            v: self.addr_of(b.v),
            k_cache: self.addr_of(b.k_cache),
            v_cache: self.addr_of(b.v_cache),
            probs: self.addr_of(b.probs),
            acc: self.addr_of(b.acc),
            out: self.addr_of(b.out),
            exp2: self.addr_of(b.exp2),
            pos: pos as u32,
            max_ctx: s.max_ctx as u32,
            n_q: s.n_q as u32,
            n_kv: s.n_kv as u32,
            hd: s.hd as u32,
            scale_q22,
            kv0: 0,
            kv1: s.n_kv as u32,
        };
        let mut parts: Vec<attention_args> = (0..n)
            .map(|i| attention_args {
                kv0: (i * s.n_kv / n) as u32,
                kv1: ((i + 1) * s.n_kv / n) as u32,
                ..a
            })
            .collect();
        self.patch_next(vec![Patch::new(
            std::mem::offset_of!(attention_args, pos),
            4,
            Var::Pos,
            1,
        )]);
        self.run_parts("attention", &mut parts)
    }

    /// Causal GQA attention at `pos` over the int8 KV cache (see [`crate::num::kv8::attention`]): the
    /// kv heads are split across threads once the step is large enough to gain from it.
    pub fn attention_i8(
        &mut self,
        b: &AttentionI8Buffers,
        pos: usize,
        s: crate::num::fixed::AttnShape,
        scale_q22: i32,
    ) -> Result<()> {
        // A plan is recorded at position 0 and runs at every position: split it as for long
        // contexts (a split costs a barrier, which the neighbouring entries need anyway).
        let macs = 2 * (pos + 1) * s.n_q * s.hd;
        let n = if self.is_recording() || macs >= self.par_min_macs / 4 {
            self.threads.min(s.n_kv)
        } else {
            1
        };
        // every kv head's part inside its region, the strides in the kernel's u32
        let n_kv = s.n_kv.max(1);
        let fits = |r: Region, stride: usize, row: usize| {
            stride >= s.max_ctx * row
                && stride <= u32::MAX as usize
                && r.len >= (n_kv - 1) * stride + s.max_ctx * row
        };
        if !(fits(b.k_codes, b.codes_stride, s.hd)
            && fits(b.v_codes, b.codes_stride, s.hd)
            && fits(b.k_steps, b.steps_stride, 4)
            && fits(b.v_steps, b.steps_stride, 4))
        {
            return Err(Error::Invalid(format!(
                "attention_i8: code and step arrays of {} kv heads, {} positions and head_dim {} \
                 do not fit regions of {}/{}/{}/{} bytes with head strides {} and {}",
                s.n_kv,
                s.max_ctx,
                s.hd,
                b.k_codes.len,
                b.k_steps.len,
                b.v_codes.len,
                b.v_steps.len,
                b.codes_stride,
                b.steps_stride
            )));
        }
        let a = |r: Region| self.addr_of(r);
        let mut parts: Vec<attention_i8_args> = (0..n)
            .map(|i| attention_i8_args {
                q: a(b.q),
                k: a(b.k),
                v: a(b.v),
                k_codes: a(b.k_codes),
                k_steps: a(b.k_steps),
                v_codes: a(b.v_codes),
                v_steps: a(b.v_steps),
                probs: a(b.probs),
                wv: a(b.wv),
                qq: a(b.qq),
                acc: a(b.acc),
                out: a(b.out),
                exp2: a(b.exp2),
                ksh: a(b.ksh),
                pos: pos as u32,
                max_ctx: s.max_ctx as u32,
                n_q: s.n_q as u32,
                n_kv: s.n_kv as u32,
                hd: s.hd as u32,
                kv0: (i * s.n_kv / n) as u32,
                kv1: ((i + 1) * s.n_kv / n) as u32,
                scale_q22,
                codes_stride: b.codes_stride as u32,
                steps_stride: b.steps_stride as u32,
            })
            .collect();
        self.patch_next(vec![Patch::new(
            std::mem::offset_of!(attention_i8_args, pos),
            4,
            Var::Pos,
            1,
        )]);
        self.run_parts("attention_i8", &mut parts)
    }
}
