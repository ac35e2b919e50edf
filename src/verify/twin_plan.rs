//! The third executor of a [`Plan`]: every entry computed by the Rust twins ([`crate::num::fixed`],
//! [`crate::num::swar`], [`crate::num::kv8`]) on the arena the BPF programs use.
//!
//! Each part's ctx is decoded into the operator's C struct (the types generated from
//! `src/bpf/ops.bpf.c`), patched for the token and position like `run_plan` does, and executed
//! by one function per operator that reads its inputs from, and writes its outputs to, the arena
//! addresses in the ctx (the row sub-blocks, accumulate modes, `y == 0` and head ranges exactly as
//! the C does). Outputs kept in the ctx (`ret`, `best`, `best_val`) are written back into the
//! part, as the kernel writes them back into its slot. Arguments the C refuses (it returns
//! non-zero) are refused with an error.
//!
//! The twins keep their intermediates to themselves: the attention scratch buffers (`probs`,
//! `acc`, `wv`, `qq`) are not written. No operator reads them before rewriting them.

use std::marker::PhantomData;

use bytemuck::Pod;

use crate::num::fixed::{self, AttnShape, Q_ACT};
use crate::kernel::arena::Arena;
use crate::kernel::ops::first_best;
use crate::kernel::ops::skel::types::{
    attention_args, attention_i8_args, embed_args, gate_up_args, lm_head_args, matvec_args,
    qk_norm_rope_args, quantize_x_args, rmsnorm_args, swar_mv_args, swiglu_args,
};
use crate::num::limits::{COLS_MAX, HEAD_DIM_MAX, NORM_MAX, Q24_COLS_ALIGN, SWAR_COLS_ALIGN};
use crate::kernel::plan::{Args, Entry, Plan, ARGS_WORDS, OPS};
use crate::num::swar::{self, Format, Int4Matrix, Int8Matrix, PackedMatrix, QuantX};
use crate::num::kv8;
use crate::{Error, Result};

/// Runs the whole plan for `token` at `pos`; returns the LM head's argmax (row, Q16 logit),
/// combined over its parts as [`crate::Model`] does.
pub fn run_plan(arena: &mut Arena, plan: &Plan, token: u32, pos: u32) -> Result<(usize, i32)> {
    let mut best = None;
    for e in &plan.entries {
        let parts = run_entry(arena, e, token, pos)?;
        if let Some(h) = e.head {
            best = Some(first_best(0, parts.iter().map(|a| h.read(a))));
        }
    }
    best.ok_or_else(|| Error::Invalid("the plan has no LM head".into()))
}

/// Runs entry `e` for `token` at `pos`, its parts one after another. Returns the parts' ctx
/// after the run (outputs included), like [`crate::kernel::ops::Ops::run_entry`].
pub fn run_entry(arena: &mut Arena, e: &Entry, token: u32, pos: u32) -> Result<Vec<Args>> {
    let mut parts = e.patched(token, pos)?;
    let name = OPS.get(e.op as usize).copied().unwrap_or("?");
    for a in &mut parts {
        let ok = match name {
            "embed" => with(a, |c| embed(arena, c))?,
            "rmsnorm" => with(a, |c| rmsnorm(arena, c))?,
            "qk_norm_rope" => with(a, |c| qk_norm_rope(arena, c))?,
            "matvec" => with(a, |c| matvec(arena, c))?,
            "gate_up_swiglu" => with(a, |c| gate_up_swiglu(arena, c))?,
            "swiglu_vec" => with(a, |c| swiglu_vec(arena, c))?,
            "lm_head_argmax" => with(a, |c| lm_head_argmax(arena, c))?,
            "attention" => with(a, |c| attention(arena, c))?,
            "quantize_x8" => with(a, |c| quantize_x(arena, c, swar::W4A8))?,
            "quantize_x16" => with(a, |c| quantize_x(arena, c, swar::W8A16))?,
            "w4a8_matvec" => with(a, |c| swar_mv::<Int4Matrix>(arena, c, false))?,
            "w8a16_matvec" => with(a, |c| swar_mv::<Int8Matrix>(arena, c, false))?,
            "w4a8_lm_head_argmax" => with(a, |c| swar_mv::<Int4Matrix>(arena, c, true))?,
            "w8a16_lm_head_argmax" => with(a, |c| swar_mv::<Int8Matrix>(arena, c, true))?,
            "attention_i8" => with(a, |c| attention_i8(arena, c))?,
            _ => {
                return Err(Error::Invalid(format!(
                    "plan entry with operator id {} (`{name}`): not an operator the twins run",
                    e.op
                )))
            }
        };
        if !ok {
            return Err(Error::Invalid(format!(
                "`{name}` refused its arguments (the BPF program returns non-zero)"
            )));
        }
    }
    Ok(parts)
}

/// The ctx structs of the operator programs: plain C data, every bit pattern valid.
///
/// # Safety
/// Only for `repr(C)` structs of integer fields (and explicit padding) of at most
/// [`ARGS_WORDS`] words.
unsafe trait Ctx: Copy {}
macro_rules! ctx {
    ($($t:ty),*) => {
        $(
            const _: () = assert!(std::mem::size_of::<$t>() <= ARGS_WORDS * 8);
            // SAFETY: a ctx struct generated from ops.bpf.c: integers only, checked to fit.
            unsafe impl Ctx for $t {}
        )*
    };
}
ctx!(
    embed_args,
    rmsnorm_args,
    qk_norm_rope_args,
    matvec_args,
    gate_up_args,
    swiglu_args,
    lm_head_args,
    attention_args,
    quantize_x_args,
    swar_mv_args,
    attention_i8_args
);

/// Decodes `a` as a `T`, runs `f` on it (false: refused) and writes the struct back into `a`.
fn with<T: Ctx>(a: &mut Args, f: impl FnOnce(&mut T) -> Result<bool>) -> Result<bool> {
    // SAFETY: T is plain data of at most ARGS_WORDS * 8 bytes (Ctx), so reading its bytes from
    // the front of `a` gives a valid T; unaligned reads and writes need no alignment.
    let mut c: T = unsafe { std::ptr::read_unaligned(a.as_ptr() as *const T) };
    let ok = f(&mut c)?;
    // SAFETY: as above, writing size_of::<T>() <= size_of::<Args>() bytes.
    unsafe { std::ptr::write_unaligned(a.as_mut_ptr() as *mut T, c) };
    Ok(ok)
}

/// The `n` elements of type `T` at arena address `addr`.
fn read<T: Pod>(arena: &Arena, addr: u64, n: usize) -> Result<&[T]> {
    arena.slice(arena.region_at(addr, n * std::mem::size_of::<T>())?)
}

/// Writes `v` at arena address `addr`.
fn write<T: Pod>(arena: &mut Arena, addr: u64, v: &[T]) -> Result<()> {
    let r = arena.region_at(addr, std::mem::size_of_val(v))?;
    arena.slice_mut(r)?.copy_from_slice(v);
    Ok(())
}

/// The exp2 table at `addr`.
fn exp2_table(arena: &Arena, addr: u64) -> Result<&[u32; 257]> {
    Ok(read::<u32>(arena, addr, 257)?
        .try_into()
        .expect("257 entries"))
}

/// Byte offset `i * size` as an address offset.
fn off(i: usize, size: usize) -> u64 {
    (i * size) as u64
}

/// `x = table[token]`: table i32 Q24 `[vocab][dim]`, x i64 Q32 `[dim]`.
fn embed(arena: &mut Arena, c: &mut embed_args) -> Result<bool> {
    let (t, dim) = (c.token as usize, c.dim as usize);
    let mut x = vec![0i64; dim];
    fixed::embed(read(arena, c.table, (t + 1) * dim)?, t, dim, &mut x);
    write(arena, c.x, &x)?;
    Ok(true)
}

/// RMSNorm of `nvec` vectors of `n`: x i64 Q32 `[nvec][n]` (wide) or i32 Q16 `[nvec][n]`,
/// w i32 Q20 `[n]`, y i32 Q16 `[nvec][n]` (may be x when not wide).
fn rmsnorm(arena: &mut Arena, c: &mut rmsnorm_args) -> Result<bool> {
    let (n, wide) = (c.n as usize, c.wide != 0);
    c.ret = 0;
    for h in 0..c.nvec as usize {
        let x = if wide {
            read::<i64>(arena, c.x + off(h * n, 8), n)?.to_vec()
        } else {
            fixed::q16_to_q32(read::<i32>(arena, c.x + off(h * n, 4), n)?)
        };
        let mut y = vec![0i32; n];
        if fixed::rmsnorm(&x, read(arena, c.w, n)?, c.eps_q64, Q_ACT, &mut y) {
            write(arena, c.y + off(h * n, 4), &y)?;
        } else {
            c.ret = 1;
        }
    }
    Ok(c.ret == 0)
}

/// Per-head norms then RoPE, in place: q i32 `[n_q][hd]` (Q16 in, Q22 out), k i32 Q16
/// `[n_k][hd]`, norms i32 Q20 `[hd]`, cos/sin i32 Q30 `[hd/2]` (this position's table row).
fn qk_norm_rope(arena: &mut Arena, c: &mut qk_norm_rope_args) -> Result<bool> {
    let (nq, nk, hd) = (c.n_q as usize, c.n_k as usize, c.hd as usize);
    if nq + nk > 0 && (hd == 0 || hd > NORM_MAX) {
        c.ret = 1; // every head's norm refuses the length
        return Ok(false);
    }
    let mut q = read::<i32>(arena, c.q, nq * hd)?.to_vec();
    let mut k = read::<i32>(arena, c.k, nk * hd)?.to_vec();
    fixed::qk_norm_rope(
        &mut q,
        &mut k,
        read(arena, c.q_norm, hd)?,
        read(arena, c.k_norm, hd)?,
        read(arena, c.cos, hd / 2)?,
        read(arena, c.sin, hd / 2)?,
        hd,
        c.eps_q64,
    );
    write(arena, c.q, &q)?;
    write(arena, c.k, &k)?;
    c.ret = 0;
    Ok(true)
}

/// Whether the Q24 row programs take `k` columns (`q24_cols_ok`).
fn q24_cols_ok(k: usize) -> bool {
    k != 0 && k % Q24_COLS_ALIGN == 0 && k <= COLS_MAX
}

/// Whether a batched operator takes `nb` vectors (`batch_ok`).
fn batch_ok(nb: u32) -> bool {
    nb != 0 && nb as usize <= crate::num::limits::BATCH_MAX
}

/// `y[r] = W[r]·x` (y i32 Q16) or `y[r] += W[r]·x` (accumulate: y the i64 Q32 residual) for r in
/// `row0..row0 + nrows`; w i32 Q24 `[nrows][k]` (rows row0..), x i32 Q16 `[k]`; for each of the
/// nb vectors (x `[nb][k]`, y's `ystride` bytes apart).
fn matvec(arena: &mut Arena, c: &mut matvec_args) -> Result<bool> {
    let (k, r0, n) = (c.k as usize, c.row0 as usize, c.nrows as usize);
    if !q24_cols_ok(k) || !batch_ok(c.nb) {
        return Ok(false);
    }
    for b in 0..c.nb as u64 {
        let (xa, ya) = (c.x + b * k as u64 * 4, c.y + b * c.ystride);
        let (w, x) = (read(arena, c.w, n * k)?, read(arena, xa, k)?);
        if c.accumulate != 0 {
            let mut y = read::<i64>(arena, ya + off(r0, 8), n)?.to_vec();
            fixed::matvec_residual(w, x, 0..n, &mut y);
            write(arena, ya + off(r0, 8), &y)?;
        } else if c.y != 0 {
            let mut y = vec![0i32; n];
            fixed::matvec(w, x, 0..n, &mut y);
            write(arena, ya + off(r0, 4), &y)?;
        }
    }
    Ok(true)
}

/// `y[r] = silu(gate[r]·x) * (up[r]·x)` for r in `row0..row0 + nrows`: gate, up i32 Q24
/// `[nrows][k]` (rows row0..), x i32 Q16 `[k]`, y i32 Q16 `[rows]`; for each of the nb vectors
/// (x `[nb][k]`, y's `ystride` bytes apart).
fn gate_up_swiglu(arena: &mut Arena, c: &mut gate_up_args) -> Result<bool> {
    let (k, r0, n) = (c.k as usize, c.row0 as usize, c.nrows as usize);
    if !q24_cols_ok(k) || !batch_ok(c.nb) {
        return Ok(false);
    }
    for b in 0..c.nb as u64 {
        let mut y = vec![0i32; n];
        fixed::gate_up_swiglu(
            read(arena, c.gate, n * k)?,
            read(arena, c.up, n * k)?,
            read(arena, c.x + b * k as u64 * 4, k)?,
            0..n,
            exp2_table(arena, c.exp2)?,
            &mut y,
        );
        write(arena, c.y + b * c.ystride + off(r0, 4), &y)?;
    }
    Ok(true)
}

/// `y[i] = silu(gate[i]) * up[i]`, all i32 Q16 `[n]` (y may be gate or up).
fn swiglu_vec(arena: &mut Arena, c: &mut swiglu_args) -> Result<bool> {
    let n = c.n as usize;
    let (g, u) = (read::<i32>(arena, c.gate, n)?, read::<i32>(arena, c.up, n)?);
    let tab = exp2_table(arena, c.exp2)?;
    let y: Vec<i32> = g
        .iter()
        .zip(u)
        .map(|(&g, &u)| fixed::swiglu(g, u, tab))
        .collect();
    write(arena, c.y, &y)?;
    Ok(true)
}

/// Logits of rows `row0..row0 + nrows` into y i32 Q16 `[vocab]` (unless y == 0) and their argmax
/// into `best`, `best_val`: w i32 Q24 `[nrows][k]` (rows row0..), x i32 Q16 `[k]`.
fn lm_head_argmax(arena: &mut Arena, c: &mut lm_head_args) -> Result<bool> {
    let (k, r0, n) = (c.k as usize, c.row0 as usize, c.nrows as usize);
    if !q24_cols_ok(k) {
        return Ok(false);
    }
    let mut y = vec![0i32; n];
    let logits = (c.y != 0).then_some(&mut y[..]);
    let (best, val) =
        fixed::lm_head_argmax(read(arena, c.w, n * k)?, read(arena, c.x, k)?, 0..n, logits);
    (c.best, c.best_val) = ((r0 + best) as u32, val as i64);
    if c.y != 0 {
        write(arena, c.y + off(r0, 4), &y)?;
    }
    Ok(true)
}

/// Causal GQA attention at `pos` over the Q16 cache: appends k, v (i32 Q16 `[n_kv][hd]`) to the
/// caches (i32 Q16 `[max_ctx][n_kv][hd]`), then out i32 Q16 `[n_q][hd]` from q i32 Q22 `[n_q][hd]`.
fn attention(arena: &mut Arena, c: &mut attention_args) -> Result<bool> {
    let (pos, nq, nkv, hd) = (
        c.pos as usize,
        c.n_q as usize,
        c.n_kv as usize,
        c.hd as usize,
    );
    if c.pos >= c.max_ctx || nkv == 0 || nq % nkv != 0 || hd > HEAD_DIM_MAX {
        return Ok(false);
    }
    let (kv0, kv1) = (c.kv0 as usize, c.kv1 as usize);
    if kv0 >= kv1 || kv1 > nkv {
        return Ok(false);
    }
    let (kvd, npos) = (nkv * hd, pos + 1);
    let s = AttnShape {
        n_q: nq,
        n_kv: nkv,
        hd,
        max_ctx: c.max_ctx as usize,
    };
    let mut kc = read::<i32>(arena, c.k_cache, npos * kvd)?.to_vec();
    let mut vc = read::<i32>(arena, c.v_cache, npos * kvd)?.to_vec();
    let mut out = vec![0i32; nq * hd];
    fixed::attention(
        read(arena, c.q, nq * hd)?,
        read(arena, c.k, kvd)?,
        read(arena, c.v, kvd)?,
        &mut kc,
        &mut vc,
        pos,
        s,
        c.scale_q22,
        exp2_table(arena, c.exp2)?,
        &mut out,
    );
    // this part's kv heads' columns of the new cache row, and its query heads' outputs
    let (cols, g) = (pos * kvd + kv0 * hd..pos * kvd + kv1 * hd, nq / nkv);
    write(arena, c.k_cache + off(cols.start, 4), &kc[cols.clone()])?;
    write(arena, c.v_cache + off(cols.start, 4), &vc[cols])?;
    let rows = kv0 * g * hd..kv1 * g * hd;
    write(arena, c.out + off(rows.start, 4), &out[rows])?;
    Ok(true)
}

/// Causal GQA attention at `pos` over the int8 cache, for kv heads `kv0..kv1` only: quantises
/// and appends their rows of k, v (i32 Q16 `[n_kv][hd]`) to the codes (i8 `[n_kv][max_ctx][hd]`)
/// and steps (u32 `[n_kv][max_ctx]`), each kv head `codes_stride` (`steps_stride`) bytes after the
/// previous, then writes out i32 Q16 `[n_q][hd]` for their query heads (head h reads kv head
/// h / group). The twin runs on those heads' slice of everything.
fn attention_i8(arena: &mut Arena, c: &mut attention_i8_args) -> Result<bool> {
    let (pos, nq, nkv, hd) = (
        c.pos as usize,
        c.n_q as usize,
        c.n_kv as usize,
        c.hd as usize,
    );
    let (cs, ss) = (c.codes_stride as usize, c.steps_stride as usize);
    if c.pos >= c.max_ctx
        || nkv == 0
        || nq % nkv != 0
        || !(4..=kv8::HD_MAX).contains(&hd)
        || c.kv0 >= c.kv1
        || c.kv1 as usize > nkv
        || cs < c.max_ctx as usize * hd
        || ss < c.max_ctx as usize * 4
    {
        return Ok(false);
    }
    let (kv0, kv1, g, npos) = (c.kv0 as usize, c.kv1 as usize, nq / nkv, pos + 1);
    let s = AttnShape {
        n_q: (kv1 - kv0) * g,
        n_kv: kv1 - kv0,
        hd,
        max_ctx: npos,
    };
    // this run's heads over positions 0..=pos: [kv1 - kv0][npos][hd] codes, [kv1 - kv0][npos] steps
    let mut cache = kv8::Cache::new(s);
    for (i, j) in (kv0..kv1).enumerate() {
        let (rows, steps) = (i * npos * hd..(i + 1) * npos * hd, i * npos..(i + 1) * npos);
        cache.k_codes[rows.clone()].copy_from_slice(read(
            arena,
            c.k_codes + off(j, cs),
            npos * hd,
        )?);
        cache.v_codes[rows].copy_from_slice(read(arena, c.v_codes + off(j, cs), npos * hd)?);
        cache.k_steps[steps.clone()].copy_from_slice(read(arena, c.k_steps + off(j, ss), npos)?);
        cache.v_steps[steps].copy_from_slice(read(arena, c.v_steps + off(j, ss), npos)?);
    }
    let qs = kv0 * g * hd..kv1 * g * hd; // this run's query heads
    let mut out = vec![0i32; qs.len()];
    kv8::attention(
        &read::<i32>(arena, c.q, nq * hd)?[qs],
        &read::<i32>(arena, c.k, nkv * hd)?[kv0 * hd..kv1 * hd],
        &read::<i32>(arena, c.v, nkv * hd)?[kv0 * hd..kv1 * hd],
        &mut cache,
        read(arena, c.ksh, hd)?,
        pos,
        s,
        c.scale_q22,
        exp2_table(arena, c.exp2)?,
        &mut out,
    );
    // position pos of this run's heads, and their query heads' output
    for (i, j) in (kv0..kv1).enumerate() {
        let (at, code) = (i * npos + pos, off(j, cs) + off(pos, hd));
        let step = off(j, ss) + off(pos, 4);
        write(
            arena,
            c.k_codes + code,
            &cache.k_codes[at * hd..(at + 1) * hd],
        )?;
        write(
            arena,
            c.v_codes + code,
            &cache.v_codes[at * hd..(at + 1) * hd],
        )?;
        write(arena, c.k_steps + step, &cache.k_steps[at..at + 1])?;
        write(arena, c.v_steps + step, &cache.v_steps[at..at + 1])?;
    }
    write(arena, c.out + off(kv0 * g * hd, 4), &out)?;
    Ok(true)
}

/// Quantises x i32 Q16 `[k]` per block of 32 for the kernels of `f` into xq: i64 codes `[k]`,
/// then `{sum, shift}` `[k/32]`.
fn quantize_x(arena: &mut Arena, c: &mut quantize_x_args, f: Format) -> Result<bool> {
    let k = c.k as usize;
    if k == 0 || k % SWAR_COLS_ALIGN != 0 || k > COLS_MAX || !batch_ok(c.nb) {
        return Ok(false);
    }
    for b in 0..c.nb as u64 {
        let x = read::<i32>(arena, c.x + b * k as u64 * 4, k)?;
        let xq = if f == swar::W4A8 {
            swar::quantize_x8(x)
        } else {
            swar::quantize_x16(x)
        };
        write(arena, c.xq + b * QuantX::bytes(k) as u64, &xq.to_words())?;
    }
    Ok(true)
}

/// Row blocks of a packed matrix in the arena, borrowed: the twins' view of the kernel's words.
struct Packed<'a, M> {
    rows: usize,
    cols: usize,
    words: &'a [u64],
    scales: &'a [u32],
    format: PhantomData<M>,
}

impl<M: PackedMatrix> PackedMatrix for Packed<'_, M> {
    const FORMAT: Format = M::FORMAT;
    fn rows(&self) -> usize {
        self.rows
    }
    fn cols(&self) -> usize {
        self.cols
    }
    fn words(&self) -> &[u64] {
        self.words
    }
    fn scales(&self) -> &[u32] {
        self.scales
    }
}

/// The SWAR matvec (`argmax` false) or LM head of format `M::FORMAT` over rows
/// `row0..row0 + nrows` (whole blocks): w the whole matrix's words, u64 `[rows/rpb][k/4][2]`,
/// s its scales, u32 `[rows/rpb][k/32][rpb]`, xq from `quantize_x`; y i32 Q16 `[rows]`
/// (store, or logits unless y == 0) or the i64 Q32 residual (accumulate). The LM head's
/// argmax goes to `best`, `best_val`.
fn swar_mv<M: PackedMatrix>(arena: &mut Arena, c: &mut swar_mv_args, argmax: bool) -> Result<bool> {
    let f = M::FORMAT;
    let (k, r0, n, rpb) = (
        c.k as usize,
        c.row0 as usize,
        c.nrows as usize,
        f.rows_per_block,
    );
    if k == 0 || k % SWAR_COLS_ALIGN != 0 || k > COLS_MAX || r0 % rpb != 0 || n % rpb != 0 {
        return Ok(false);
    }
    if !argmax && c.y == 0 || !batch_ok(c.nb) || argmax && c.nb != 1 {
        return Ok(false);
    }
    // a row block is k/2 words (rpb rows of k codes of f.bits bits) and rpb * k/32 scales
    let (bw, bs) = (rpb * k * f.bits as usize / 64, rpb * (k / swar::GROUP));
    let (b0, nb) = (r0 / rpb, n / rpb);
    let m = Packed::<M> {
        rows: n,
        cols: k,
        words: read(arena, c.w + off(b0 * bw, 8), nb * bw)?,
        scales: read(arena, c.s + off(b0 * bs, 4), nb * bs)?,
        format: PhantomData,
    };
    if !argmax {
        // each vector in turn, as the kernel does (the outputs are written once m's borrow of
        // the arena ends; no vector's output is another's input)
        let (mut res, mut out) = (Vec::new(), Vec::new());
        for b in 0..c.nb as u64 {
            let xa = c.xq + b * QuantX::bytes(k) as u64;
            let ya = c.y + b * c.ystride;
            let xq = QuantX::from_words(read(arena, xa, QuantX::bytes(k) / 8)?, k, f.act_max);
            if c.accumulate != 0 {
                let mut y = read::<i64>(arena, ya + off(r0, 8), n)?.to_vec();
                swar::matvec_quantized_residual(&m, &xq, 0..n, &mut y);
                res.push((ya + off(r0, 8), y));
            } else {
                let mut y = vec![0i32; n];
                swar::matvec_quantized(&m, &xq, 0..n, &mut y);
                out.push((ya + off(r0, 4), y));
            }
        }
        for (a, y) in res {
            write(arena, a, &y)?;
        }
        for (a, y) in out {
            write(arena, a, &y)?;
        }
        return Ok(true);
    }
    let xq = QuantX::from_words(read(arena, c.xq, QuantX::bytes(k) / 8)?, k, f.act_max);
    {
        let mut y = vec![0i32; n];
        let logits = (c.y != 0).then_some(&mut y[..]);
        let (best, val) = swar::lm_head_argmax_quantized(&m, &xq, 0..n, logits);
        (c.best, c.best_val) = ((r0 + best) as u32, val as i64);
        if c.y != 0 {
            write(arena, c.y + off(r0, 4), &y)?;
        }
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::arena::PAGE;
    use crate::kernel::plan::HeadFields;

    /// An arena over ordinary memory (8-byte aligned, as the BPF mapping is).
    fn arena(words: &mut [u64]) -> Arena {
        // SAFETY: the buffer outlives the arena in every test below.
        unsafe { Arena::new(words.as_mut_ptr() as *mut u8, words.len() * 8) }
    }

    fn entry(op: u32, args: Args) -> Entry {
        Entry {
            op,
            parts: vec![args],
            patches: vec![],
            head: None,
        }
    }

    #[test]
    fn unknown_operators_and_refused_ctx_are_errors() {
        let mut mem = vec![0u64; PAGE / 8];
        let mut a = arena(&mut mem);
        for op in [0, OPS.len() as u32, u32::MAX] {
            let r = run_entry(&mut a, &entry(op, [0; ARGS_WORDS]), 0, 0);
            assert!(
                matches!(r, Err(Error::Invalid(_))),
                "operator id {op}: an error, not {r:?}"
            );
        }
        // a Q24 matvec of 3 columns: refused like the C's q24_cols_ok
        let x = a.alloc(64, "x").unwrap();
        let c = matvec_args {
            w: a.addr(x),
            x: a.addr(x),
            y: a.addr(x),
            k: 3,
            nrows: 1,
            nb: 1,
            ..Default::default()
        };
        let mut args = [0; ARGS_WORDS];
        with(&mut args, |slot: &mut matvec_args| {
            *slot = c;
            Ok(true)
        })
        .unwrap();
        let r = run_entry(&mut a, &entry(4, args), 0, 0);
        assert!(
            matches!(r, Err(Error::Invalid(_))),
            "matvec with k = 3: {r:?}"
        );
        // an address outside the arena
        let far = matvec_args { k: 8, x: 0, ..c };
        with(&mut args, |slot: &mut matvec_args| {
            *slot = far;
            Ok(true)
        })
        .unwrap();
        let r = run_entry(&mut a, &entry(4, args), 0, 0);
        assert!(
            matches!(r, Err(Error::ArenaView(_))),
            "x at address 0: {r:?}"
        );
        let plan = Plan::new(vec![entry(2, [0; ARGS_WORDS])]).unwrap();
        let r = run_plan(&mut a, &plan, 0, 0);
        assert!(r.is_err(), "a plan of one empty rmsnorm and no head: {r:?}");
    }

    #[test]
    fn the_lm_head_writes_its_argmax_back_into_the_part() {
        // rows 8..12 of a 16-row Q24 head over k = 8, logits skipped (y == 0)
        let mut mem = vec![0u64; 2 * PAGE / 8];
        let mut a = arena(&mut mem);
        let (w, x) = (
            a.alloc(4 * 8 * 4, "w").unwrap(),
            a.alloc(8 * 4, "x").unwrap(),
        );
        let rows: Vec<i32> = (0..4 * 8)
            .map(|i| if i / 8 == 2 { 1 << 24 } else { 0 })
            .collect();
        a.slice_mut::<i32>(w).unwrap().copy_from_slice(&rows);
        a.slice_mut::<i32>(x).unwrap().fill(1 << 16);
        let c = lm_head_args {
            w: a.addr(w),
            x: a.addr(x),
            y: 0,
            k: 8,
            row0: 8,
            nrows: 4,
            ..Default::default()
        };
        let mut args = [0; ARGS_WORDS];
        with(&mut args, |slot: &mut lm_head_args| {
            *slot = c;
            Ok(true)
        })
        .unwrap();
        let h = HeadFields::at(
            std::mem::offset_of!(lm_head_args, best),
            std::mem::offset_of!(lm_head_args, best_val),
        );
        let e = Entry {
            head: Some(h),
            ..entry(7, args)
        };
        let parts = run_entry(&mut a, &e, 0, 0).unwrap();
        assert_eq!(
            h.read(&parts[0]),
            (10, 8 << 16),
            "(row, Q16 logit) of the head part"
        );
        let plan = Plan::new(vec![e]).unwrap();
        assert_eq!(
            run_plan(&mut a, &plan, 0, 0).unwrap(),
            (10, 8 << 16),
            "the plan's argmax"
        );
    }
}
