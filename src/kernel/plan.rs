//! The forward pass as data: a plan, recorded once at open from [`crate::Model`]'s own step, and
//! executed three ways.
//!
//! `Model::open` runs its step once with the operator object ([`crate::kernel::ops::Ops`]) in
//! recording mode: every operator run it would have made becomes an [`Entry`] (the program, the
//! ctx of each thread's part, and the per-token fields as [`Patch`]es), so the sequence of the
//! forward pass is written once, in `Model::emit`. The plan is then:
//!
//! - run by the kernel in one invocation per thread and token: `run_plan` in
//!   `src/bpf/plan.inc.c` walks the [`Slot`]s uploaded to the arena, calling the operators'
//!   global functions in order, with a barrier between dependent entries when several threads
//!   split the rows ([`Dispatch::Kernel`]);
//! - replayed from user space one `test_run` per entry and part ([`Dispatch::PerOp`]);
//! - executed by the Rust twins ([`crate::verify::twin_plan`]), which compute the same integers.
//!
//! A slot's layout is `struct plan_slot`, its operator ids `enum plan_op_id`; [`OPS`] is the
//! same table in Rust.

use bytemuck::{Pod, Zeroable};

use crate::{Error, Result};

/// Operator programs by id (`enum plan_op_id` in `src/bpf/plan.inc.c`; 0 is "no operator").
pub const OPS: [&str; 16] = [
    "nop",
    "embed",
    "rmsnorm",
    "qk_norm_rope",
    "matvec",
    "gate_up_swiglu",
    "swiglu_vec",
    "lm_head_argmax",
    "attention",
    "quantize_x8",
    "quantize_x16",
    "w4a8_matvec",
    "w8a16_matvec",
    "w4a8_lm_head_argmax",
    "w8a16_lm_head_argmax",
    "attention_i8",
];

/// u64 words of a slot's ctx (`PLAN_ARGS_WORDS`): the largest operator ctx fits.
pub const ARGS_WORDS: usize = 20;
/// Threads a plan can be split across (`PLAN_THREADS_MAX`).
pub const THREADS_MAX: usize = 8;
/// Entries a plan may hold per decoder layer (arena space is reserved for this many).
pub const ENTRIES_PER_LAYER: usize = 16;
/// `PLAN_SYNC`: all threads meet after this entry.
pub const SYNC: u32 = 1;
/// `PLAN_HEAD`: the LM head, with its argmax fields' words in bits 16..32.
pub const HEAD: u32 = 2;
/// `run_plan` return value: a barrier timed out.
pub const E_BARRIER: i32 = -1;
/// `run_plan` return value: a bad thread, thread count or plan length (`PLAN_E_ARGS`).
pub const E_ARGS: i32 = -2;
/// Per-token fields a slot may patch (`PLAN_PATCHES`).
pub const PATCHES: usize = 2;

/// A ctx as the plan holds it.
pub type Args = [u64; ARGS_WORDS];

/// What a per-token field depends on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Var {
    /// The token fed (`PLAN_VAR_TOKEN`).
    Token = 0,
    /// Its position (`PLAN_VAR_POS`).
    Pos = 1,
}

/// A per-token field of a ctx: `field = base + var * mul` (`struct plan_patch`).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct Patch {
    /// Byte offset of the field in the ctx; `size` 0 means no patch.
    pub off: u16,
    /// 4 or 8 bytes.
    pub size: u8,
    /// [`Var`] as a number.
    pub var: u8,
    /// Multiplier.
    pub mul: u32,
    /// The field's value at var = 0.
    pub base: u64,
}

impl Patch {
    /// A patch of the `size`-byte field at `off` by `var * mul`; its base is filled in when the
    /// entry is recorded (the field's value then, at token 0 and position 0).
    pub fn new(off: usize, size: usize, var: Var, mul: usize) -> Patch {
        Patch {
            off: off as u16,
            size: size as u8,
            var: var as u8,
            mul: mul as u32,
            base: 0,
        }
    }

    /// Writes this patch's field into `args` for `token` at `pos` (what `plan_patch` does).
    pub fn apply(&self, args: &mut Args, token: u32, pos: u32) -> Result<()> {
        let var = if self.var == Var::Pos as u8 {
            pos
        } else {
            token
        };
        let v = self.base.wrapping_add(var as u64 * self.mul as u64);
        let bytes: &mut [u8] = bytemuck::cast_slice_mut(args);
        let off = self.off as usize;
        match self.size {
            0 => {}
            4 if off + 4 <= bytes.len() && off % 4 == 0 => {
                bytes[off..off + 4].copy_from_slice(&(v as u32).to_ne_bytes())
            }
            8 if off + 8 <= bytes.len() && off % 8 == 0 => {
                bytes[off..off + 8].copy_from_slice(&v.to_ne_bytes())
            }
            _ => return Err(Error::Invalid(format!("malformed plan patch {self:?}"))),
        }
        Ok(())
    }

    /// The field's current value in `args` (to fill in the base at recording).
    fn read(&self, args: &Args) -> u64 {
        let bytes: &[u8] = bytemuck::cast_slice(args);
        let off = self.off as usize;
        match self.size {
            4 => u32::from_ne_bytes(bytes[off..off + 4].try_into().unwrap()) as u64,
            _ => u64::from_ne_bytes(bytes[off..off + 8].try_into().unwrap()),
        }
    }
}

/// One operator run of one thread, as the arena holds it (`struct plan_slot`).
#[repr(C)]
#[derive(Debug, Clone, Copy, Pod, Zeroable)]
pub struct Slot {
    /// Index into [`OPS`].
    pub op: u32,
    /// [`SYNC`], [`HEAD`].
    pub flags: u32,
    /// The per-token fields.
    pub patch: [Patch; PATCHES],
    /// The operator's ctx.
    pub args: Args,
}

const _: () = assert!(std::mem::size_of::<Slot>() == 200);
const _: () = assert!(std::mem::size_of::<Patch>() == 16);

/// Where an LM-head entry's argmax lands in its ctx: the u32 word of `best` and the u64 word
/// of `best_val`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeadFields {
    /// `best` (row), in u32 words.
    pub best: usize,
    /// `best_val` (Q16 logit), in u64 words.
    pub best_val: usize,
}

impl HeadFields {
    /// From the byte offsets of the two fields.
    pub fn at(best_off: usize, best_val_off: usize) -> HeadFields {
        HeadFields {
            best: best_off / 4,
            best_val: best_val_off / 8,
        }
    }

    /// (row, logit) of a part's ctx.
    pub fn read(&self, args: &Args) -> (usize, i64) {
        let words: &[u32] = bytemuck::cast_slice(args);
        (words[self.best] as usize, args[self.best_val] as i64)
    }
}

/// One operator of the forward pass: the program and each part's ctx (one part per thread that
/// takes rows of it).
#[derive(Debug, Clone)]
pub struct Entry {
    /// Index into [`OPS`].
    pub op: u32,
    /// The ctx of each part, in row order.
    pub parts: Vec<Args>,
    /// The per-token fields (the same in every part).
    pub patches: Vec<Patch>,
    /// For the LM head: where its argmax is.
    pub head: Option<HeadFields>,
}

impl Entry {
    /// Records one operator run: `op` names the program, `parts` its ctx per part (each at most
    /// [`ARGS_WORDS`] words), `patches` its per-token fields (their bases read from the first
    /// part, recorded at token 0 and position 0).
    pub fn record<T: Copy>(
        op: &str,
        parts: &[T],
        mut patches: Vec<Patch>,
        head: Option<HeadFields>,
    ) -> Result<Entry> {
        let id = OPS
            .iter()
            .position(|&n| n == op)
            .filter(|&i| i > 0)
            .ok_or_else(|| Error::Invalid(format!("`{op}` cannot be part of a plan")))?;
        let size = std::mem::size_of::<T>();
        if size > ARGS_WORDS * 8 || patches.len() > 2 {
            return Err(Error::Invalid(format!(
                "`{op}`: a ctx of {size} bytes with {} patches does not fit a plan slot",
                patches.len()
            )));
        }
        let parts: Vec<Args> = parts
            .iter()
            .map(|p| {
                let mut a = [0u64; ARGS_WORDS];
                // SAFETY: T is a plain-data ctx struct generated from the BPF object (integer
                // fields and explicit padding, no pointers), at most ARGS_WORDS * 8 bytes.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        p as *const T as *const u8,
                        a.as_mut_ptr() as *mut u8,
                        size,
                    )
                };
                a
            })
            .collect();
        if let Some(first) = parts.first() {
            for p in &mut patches {
                p.base = p.read(first);
            }
        }
        Ok(Entry {
            op: id as u32,
            parts,
            patches,
            head,
        })
    }

    /// The program's name.
    pub fn name(&self) -> &'static str {
        OPS[self.op as usize]
    }

    /// Each part's ctx for `token` at `pos`.
    pub fn patched(&self, token: u32, pos: u32) -> Result<Vec<Args>> {
        let mut parts = self.parts.clone();
        for a in &mut parts {
            for p in &self.patches {
                p.apply(a, token, pos)?;
            }
        }
        Ok(parts)
    }
}

/// The forward pass of one token, as recorded.
#[derive(Debug, Clone)]
pub struct Plan {
    /// The operator runs in order.
    pub entries: Vec<Entry>,
    /// Threads the entries' parts are spread over (the most parts of any entry).
    pub threads: usize,
}

impl Plan {
    /// A plan of `entries`, checked: at most [`THREADS_MAX`] parts per entry, every entry with
    /// at least one part.
    pub fn new(entries: Vec<Entry>) -> Result<Plan> {
        let threads = entries.iter().map(|e| e.parts.len()).max().unwrap_or(1);
        if threads > THREADS_MAX || entries.iter().any(|e| e.parts.is_empty()) {
            return Err(Error::Invalid(format!(
                "a plan needs 1..={THREADS_MAX} parts per entry"
            )));
        }
        Ok(Plan { entries, threads })
    }

    /// The slots as the arena holds them: `[threads][entries]`. Thread t runs part t of each
    /// entry, or nothing where an entry has fewer parts; an entry is followed by a barrier when
    /// it or the next one is split (the next reads what all parts wrote, or all parts read what
    /// thread 0 alone wrote).
    pub fn slots(&self) -> Vec<Slot> {
        let n = self.entries.len();
        let split = |i: usize| self.entries.get(i).is_some_and(|e| e.parts.len() > 1);
        let mut slots = vec![Slot::zeroed(); self.threads * n];
        for (i, e) in self.entries.iter().enumerate() {
            let mut flags = 0;
            if self.threads > 1 && (split(i) || split(i + 1)) {
                flags |= SYNC;
            }
            if let Some(h) = e.head {
                flags |= HEAD | (h.best as u32) << 16 | (h.best_val as u32) << 24;
            }
            let mut patch = [Patch::default(); 2];
            patch[..e.patches.len()].copy_from_slice(&e.patches);
            for t in 0..self.threads {
                slots[t * n + i] = Slot {
                    op: if t < e.parts.len() { e.op } else { 0 },
                    flags,
                    patch,
                    args: e.parts.get(t).copied().unwrap_or([0; ARGS_WORDS]),
                };
            }
        }
        slots
    }

    /// Arena bytes of the slots of a plan of `entries` entries on `threads` threads.
    pub fn arena_bytes(entries: usize, threads: usize) -> usize {
        entries * threads * std::mem::size_of::<Slot>()
    }
}


#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patches_write_base_plus_var_times_mul_and_refuse_bad_offsets() {
        let mut a = [0u64; ARGS_WORDS];
        let p = Patch {
            base: 100,
            ..Patch::new(8, 8, Var::Pos, 512)
        };
        p.apply(&mut a, 7, 3).unwrap();
        assert_eq!(a[1], 100 + 3 * 512, "an 8-byte position patch");
        let t = Patch::new(4, 4, Var::Token, 1);
        t.apply(&mut a, 42, 3).unwrap();
        assert_eq!(
            a[0] >> 32,
            42,
            "a 4-byte token patch in the upper half of word 0"
        );
        assert!(Patch::new(158, 8, Var::Pos, 1).apply(&mut a, 0, 0).is_err());
        assert!(Patch::new(6, 4, Var::Pos, 1).apply(&mut a, 0, 0).is_err());
    }

    #[test]
    fn slots_split_entries_and_put_barriers_around_split_ones() {
        let e = |parts: usize| Entry {
            op: 2,
            parts: vec![[1; ARGS_WORDS]; parts],
            patches: vec![],
            head: None,
        };
        let plan = Plan::new(vec![e(1), e(1), e(2), e(1)]).unwrap();
        let s = plan.slots();
        assert_eq!((plan.threads, s.len()), (2, 8));
        let flags: Vec<u32> = s[..4].iter().map(|s| s.flags).collect();
        assert_eq!(
            flags,
            [0, SYNC, SYNC, 0],
            "barriers before and after the split entry"
        );
        let thread1_ops: Vec<u32> = s[4..].iter().map(|s| s.op).collect();
        assert_eq!(
            thread1_ops,
            [0, 0, 2, 0],
            "thread 1 runs only its part of the split entry"
        );
    }
}
