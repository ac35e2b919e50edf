//! The operator object (`src/bpf/ops.bpf.c`): one skeleton, one arena, one method per operator.
//! Each method fills the operator's ctx with arena addresses and runs it once with `test_run`.

use std::mem::{ManuallyDrop, MaybeUninit};
use std::ops::Range;
use std::os::fd::AsFd;

use libbpf_rs::skel::{OpenSkel, Skel, SkelBuilder};
use libbpf_rs::OpenObject;

use super::arena::{self, Arena, Region, MAX_ARENA_BYTES, PAGE};
use super::{load_error, test_run};
use crate::{Error, Result};

mod skel {
    #![allow(missing_docs, clippy::all, non_camel_case_types, dead_code, unused_imports)]
    include!(concat!(env!("OUT_DIR"), "/ops.skel.rs"));
}
pub use skel::types::formats_args as Formats;
use skel::types::*;
use skel::{OpsSkel, OpsSkelBuilder};

/// The loaded operator programs and their arena. Dropping it unloads the programs and frees the
/// arena (the kernel objects live exactly as long as this value).
pub struct Ops {
    skel: ManuallyDrop<OpsSkel<'static>>,
    storage: *mut MaybeUninit<OpenObject>,
    /// The shared memory the operators compute on.
    pub arena: Arena,
    runs: u64,
}

impl std::fmt::Debug for Ops {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ops").field("arena", &self.arena).field("runs", &self.runs).finish()
    }
}

impl Drop for Ops {
    fn drop(&mut self) {
        // SAFETY: the skeleton borrows *storage, so it goes first; storage came from Box::into_raw.
        unsafe {
            ManuallyDrop::drop(&mut self.skel);
            drop(Box::from_raw(self.storage));
        }
    }
}

/// Which rows of a matrix one operator run covers.
pub type Rows = Range<usize>;

impl Ops {
    /// Loads the operators with an arena of `arena_bytes` (rounded up to pages, at most 4 GiB).
    pub fn load(arena_bytes: usize) -> Result<Ops> {
        let pages = arena_bytes.div_ceil(PAGE).max(1);
        if pages * PAGE > MAX_ARENA_BYTES {
            return Err(Error::Resources {
                msg: format!("a BPF arena holds at most {MAX_ARENA_BYTES} bytes; {} were asked for", pages * PAGE),
            });
        }
        let storage = Box::into_raw(Box::new(MaybeUninit::<OpenObject>::uninit()));
        // SAFETY: storage stays allocated until Drop, after the skeleton that borrows it.
        let storage_ref: &'static mut MaybeUninit<OpenObject> = unsafe { &mut *storage };
        let loaded = open_and_load(storage_ref, pages as u32);
        let skel = match loaded {
            Ok(s) => s,
            Err(e) => {
                // SAFETY: nothing borrows storage any more.
                drop(unsafe { Box::from_raw(storage) });
                return Err(e);
            }
        };
        let base = arena::mapping(&skel.maps.arena)?;
        // SAFETY: libbpf maps the whole arena (pages * PAGE bytes) read-write for the skeleton's life.
        let arena = unsafe { Arena::new(base, pages * PAGE) };
        Ok(Ops { skel: ManuallyDrop::new(skel), storage, arena, runs: 0 })
    }

    /// BPF program runs since load.
    pub fn runs(&self) -> u64 {
        self.runs
    }

    /// Runs program `name` of the object once with `args` as its ctx; a non-zero return value
    /// (the programs' "bad arguments") is an error.
    pub(crate) fn addr_of(&self, r: Region) -> u64 {
        self.arena.addr(r)
    }

    pub(crate) fn run<T>(&mut self, name: &str, args: &mut T) -> Result<()> {
        let prog = self
            .skel
            .object()
            .progs()
            .find(|p| p.name() == name)
            .ok_or_else(|| Error::Bpf { what: name.into(), detail: "no such program in ops.bpf.c".into() })?;
        let rc = test_run(prog.as_fd(), name, args)?;
        self.runs += 1;
        if rc != 0 {
            return Err(Error::Bpf { what: name.into(), detail: format!("returned {rc} (bad arguments)") });
        }
        Ok(())
    }

    fn addr(&self, r: Region) -> u64 {
        self.arena.addr(r)
    }

    /// The fixed-point constants compiled into the programs (see `src/bpf/fixed.h`).
    pub fn formats(&mut self) -> Result<Formats> {
        let mut a = Formats::default();
        self.run("formats", &mut a)?;
        Ok(a)
    }

    /// `x = table[token]` (Q24 → Q16), `dim` wide.
    pub fn embed(&mut self, table: Region, token: u32, dim: usize, x: Region) -> Result<()> {
        let mut a = embed_args { table: self.addr(table), x: self.addr(x), token, dim: dim as u32 };
        self.run("embed", &mut a)
    }

    /// RMSNorm of `nvec` consecutive `n`-wide vectors at `x` into `y` (Q16). `x` is the i64 Q32
    /// residual stream when `wide`, else i32 Q16 (and then `y` may equal `x`).
    #[allow(clippy::too_many_arguments)]
    pub fn rmsnorm(&mut self, x: Region, wide: bool, w: Region, y: Region, n: usize, nvec: usize, eps_q64: u64) -> Result<()> {
        let mut a = rmsnorm_args {
            x: self.addr(x),
            w: self.addr(w),
            y: self.addr(y),
            eps_q64,
            n: n as u32,
            nvec: nvec as u32,
            wide: wide as u32,
            ret: 0,
        };
        self.run("rmsnorm", &mut a)?;
        check_ret("rmsnorm", a.ret)
    }

    /// Per-head q_norm/k_norm and RoPE, in place. `cos`/`sin` are this position's table rows.
    #[allow(clippy::too_many_arguments)]
    pub fn qk_norm_rope(&mut self, q: Region, k: Region, q_norm: Region, k_norm: Region, cos: Region, sin: Region, n_q: usize, n_k: usize, hd: usize, eps_q64: u64) -> Result<()> {
        let mut a = qk_norm_rope_args {
            q: self.addr(q),
            k: self.addr(k),
            q_norm: self.addr(q_norm),
            k_norm: self.addr(k_norm),
            cos: self.addr(cos),
            sin: self.addr(sin),
            eps_q64,
            n_q: n_q as u32,
            n_k: n_k as u32,
            hd: hd as u32,
            ret: 0,
        };
        self.run("qk_norm_rope", &mut a)?;
        check_ret("qk_norm_rope", a.ret)
    }

    /// `y[r] = W[r]·x` (y i32 Q16) or, when `accumulate`, `y[r] += W[r]·x` (y the i64 Q32
    /// residual stream), for r in `rows`; W `[.][k]` Q24.
    pub fn matvec(&mut self, w: Region, x: Region, y: Region, k: usize, rows: Rows, accumulate: bool) -> Result<()> {
        let mut a = matvec_args {
            w: self.addr(w),
            x: self.addr(x),
            y: self.addr(y),
            k: k as u32,
            row0: rows.start as u32,
            nrows: rows.len() as u32,
            accumulate: accumulate as u32,
        };
        self.run("matvec", &mut a)
    }

    /// `y[r] = silu(gate[r]·x) * (up[r]·x)` for r in `rows`.
    #[allow(clippy::too_many_arguments)]
    pub fn gate_up_swiglu(&mut self, gate: Region, up: Region, x: Region, y: Region, exp2: Region, k: usize, rows: Rows) -> Result<()> {
        let mut a = gate_up_args {
            gate: self.addr(gate),
            up: self.addr(up),
            x: self.addr(x),
            y: self.addr(y),
            exp2: self.addr(exp2),
            k: k as u32,
            row0: rows.start as u32,
            nrows: rows.len() as u32,
            pad: 0,
        };
        self.run("gate_up_swiglu", &mut a)
    }

    /// Logits of `rows` (into `y` when given) and their argmax: (row, logit Q16).
    pub fn lm_head_argmax(&mut self, w: Region, x: Region, y: Option<Region>, k: usize, rows: Rows) -> Result<(usize, i32)> {
        let mut a = lm_head_args {
            w: self.addr(w),
            x: self.addr(x),
            y: y.map(|r| self.addr(r)).unwrap_or(0),
            k: k as u32,
            row0: rows.start as u32,
            nrows: rows.len() as u32,
            ..Default::default()
        };
        self.run("lm_head_argmax", &mut a)?;
        Ok((a.best as usize, a.best_val as i32))
    }

    /// Causal GQA attention at `pos` (see [`crate::fixed::attention`]).
    pub fn attention(&mut self, b: &AttentionBuffers, pos: usize, s: crate::fixed::AttnShape, scale_q22: i32) -> Result<()> {
        let mut a = attention_args {
            q: self.addr(b.q),
            k: self.addr(b.k),
            v: self.addr(b.v),
            k_cache: self.addr(b.k_cache),
            v_cache: self.addr(b.v_cache),
            probs: self.addr(b.probs),
            acc: self.addr(b.acc),
            out: self.addr(b.out),
            exp2: self.addr(b.exp2),
            pos: pos as u32,
            max_ctx: s.max_ctx as u32,
            n_q: s.n_q as u32,
            n_kv: s.n_kv as u32,
            hd: s.hd as u32,
            scale_q22,
        };
        self.run("attention", &mut a)
    }
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

fn open_and_load(storage: &'static mut MaybeUninit<OpenObject>, pages: u32) -> Result<OpsSkel<'static>> {
    let mut open = OpsSkelBuilder::default().open(storage).map_err(|e| load_error("the operator programs", e))?;
    open.maps.arena.set_max_entries(pages).map_err(|e| load_error("the arena map", e))?;
    open.load().map_err(|e| load_error("the operator programs", e))
}

fn check_ret(what: &str, ret: i32) -> Result<()> {
    if ret != 0 {
        return Err(Error::Bpf { what: what.into(), detail: format!("rejected its arguments (ret {ret})") });
    }
    Ok(())
}
