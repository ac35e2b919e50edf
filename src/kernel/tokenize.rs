//! The in-kernel tokenizer's driver: its tables ([`crate::num::tok_tables`]) placed in an arena
//! with a work area and text and id buffers ([`TokRegions`]), and the `tokenize_text` program
//! (`src/bpf/tokenize.inc.c`) run on them ([`Ops::tokenize`]), on either memory layer.
//! [`KernelTokenizer`] is all of it with memory of its own, no model weights needed;
//! `Model::load_tokenizer` puts the same regions into a model's memory.

use super::arena::{Arena, Region, PAGE};
use super::memory::MemoryLayer;
use super::ops::{Ops, TokenizeArgs};
use crate::num::limits::{
    TOK_CP_MAX, TOK_IDS_MAX, TOK_MARKS_MAX, TOK_TEXT_MAX, TOK_WORD_MAX,
};
use crate::num::tok_tables::TokTables;
use crate::num::tok_twin::err;
use crate::{Error, Result, Tokenizer};

/// Bytes of the kernel's work area (`TOK_SCRATCH_BYTES`): code points, then BPE's word bytes,
/// symbols, pair ranks and merged ids, and a slot for `tok_opaque`.
pub const SCRATCH_BYTES: usize = TOK_CP_MAX * 4 + TOK_WORD_MAX + 3 * TOK_WORD_MAX * 4 + 64;
/// The text buffer: one call's text, plus a page so that a test can hand the kernel a length
/// past the limit and see it refused there too.
const TEXT_BYTES: usize = TOK_TEXT_MAX + PAGE;

/// Where one tokenizer lives in an arena: its tables, the work area, the text and the ids.
#[derive(Debug, Clone, Copy)]
pub struct TokRegions {
    tables: Region,
    scratch: Region,
    text: Region,
    out: Region,
}

/// The arena bytes to reserve for the tables of a tokenizer with a vocabulary of `vocab` ids
/// and its buffers: the code-point tables (about 1.5 MiB, 4 MiB here), the merge table (at most
/// 64 bytes per id: 16-byte slots, a power of two at least twice the merges, fewer merges than
/// ids), the added tokens (1 MiB at most) and the buffers.
pub fn reserve_bytes(vocab: usize) -> usize {
    (4 << 20) + 64 * vocab + (1 << 20) + TokRegions::arena_bytes(0)
}

impl TokRegions {
    /// The arena bytes tables of `words` words need with the work area and buffers.
    pub fn arena_bytes(words: usize) -> usize {
        [words * 4, SCRATCH_BYTES, TEXT_BYTES, TOK_IDS_MAX * 4]
            .iter()
            .map(|b| b.div_ceil(PAGE) * PAGE)
            .sum()
    }

    /// Lays out `t` and the buffers in `r` (reserved, not yet committed: this commits and fills
    /// it). [`Error::Resources`] if `r` is too small.
    pub fn place(arena: &mut Arena, r: Region, t: &TokTables) -> Result<TokRegions> {
        let need = Self::arena_bytes(t.words.len());
        if need > r.len() {
            return Err(Error::Resources {
                msg: format!(
                    "the tokenizer's tables and buffers take {need} arena bytes; {} are reserved",
                    r.len()
                ),
            });
        }
        arena.commit(r, 0, need);
        let mut at = 0;
        let mut take = |len: usize| {
            let sub = r.sub(at, len)?;
            at += len.div_ceil(PAGE) * PAGE;
            // the array memory layer's programs index each as one vector of one element
            if !arena.in_one_element(sub) {
                return Err(Error::Resources {
                    msg: format!(
                        "a tokenizer buffer of {len} bytes would cross an element of the array \
                         memory layer ({} bytes): larger elements are needed",
                        arena.elem()
                    ),
                });
            }
            Ok(sub)
        };
        let regions = TokRegions {
            tables: take(t.words.len() * 4)?,
            scratch: take(SCRATCH_BYTES)?,
            text: take(TEXT_BYTES)?,
            out: take(TOK_IDS_MAX * 4)?,
        };
        arena
            .slice_mut::<u32>(regions.tables)?
            .copy_from_slice(&t.words);
        Ok(regions)
    }
}

impl Ops {
    /// Points the kernel's `tok_cfg` at the tokenizer at `r` and returns the address of its text
    /// buffer: what the event path's workers tokenize a request's text with
    /// (`src/bpf/event.inc.c`). The `tokenize_text` program sets `tok_cfg` again on each run.
    pub fn point_tokenizer(&mut self, r: &TokRegions) -> Result<u64> {
        let (tables, scratch, text) =
            (self.addr_of(r.tables), self.addr_of(r.scratch), self.addr_of(r.text));
        let bss = self.bss_mut("the tokenizer")?;
        bss.tok_cfg.tables = tables;
        bss.tok_cfg.scratch = scratch;
        Ok(text)
    }

    /// Runs the kernel's `tokenize` on `text` with the tokenizer at `r`, allowing `max_out` ids:
    /// the ids, or the kernel's negative `TOK_E_*` code. Only the buffers' sizes are checked
    /// here (the kernel checks its limits itself).
    pub fn tokenize_raw(
        &mut self,
        r: &TokRegions,
        text: &[u8],
        max_out: usize,
    ) -> Result<std::result::Result<Vec<u32>, i32>> {
        if text.len() > TEXT_BYTES || max_out > TOK_IDS_MAX {
            return Err(Error::Invalid(format!(
                "{} bytes of text and {max_out} ids exceed the tokenizer's buffers",
                text.len()
            )));
        }
        self.arena.slice_mut::<u8>(r.text)?[..text.len()].copy_from_slice(text);
        let mut a = TokenizeArgs {
            tables: self.addr_of(r.tables),
            scratch: self.addr_of(r.scratch),
            text: self.addr_of(r.text),
            out: self.addr_of(r.out),
            len: text.len() as u32,
            max_out: max_out as u32,
            ..Default::default()
        };
        self.run("tokenize_text", &mut a)?;
        if a.count < 0 {
            return Ok(Err(a.count));
        }
        Ok(Ok(
            self.arena.slice::<u32>(r.out)?[..a.count as usize].to_vec()
        ))
    }

    /// The ids of `text` by the tokenizer at `r`, computed in the kernel; every limit refused
    /// with [`Error::Limit`].
    pub fn tokenize(&mut self, r: &TokRegions, text: &str) -> Result<Vec<u32>> {
        let len = text.len();
        if len > TOK_TEXT_MAX {
            return Err(limit_error(err::TEXT, len));
        }
        self.tokenize_raw(r, text.as_bytes(), TOK_IDS_MAX)?
            .map_err(|code| limit_error(code, len))
    }
}

/// The error for the kernel's code `code` on a text of `len` bytes.
pub fn limit_error(code: i32, len: usize) -> Error {
    let (what, limit) = match code {
        err::TEXT => ("text bytes of one in-kernel tokenize call", TOK_TEXT_MAX),
        err::IDS => ("text bytes whose ids exceed the ids one call returns", TOK_IDS_MAX),
        err::CPS => ("text bytes decomposing past the code points of one segment", TOK_CP_MAX),
        err::WORD => ("text bytes with a pre-tokenized piece longer than the bytes of one word", TOK_WORD_MAX),
        err::MARKS => ("text bytes with a run of combining marks longer than", TOK_MARKS_MAX),
        err::UTF8 => {
            return Error::Invalid("the in-kernel tokenizer was given invalid UTF-8".into())
        }
        _ => {
            return Error::Bpf {
                what: "tokenize_text".into(),
                detail: format!("returned {code}"),
            }
        }
    };
    Error::Limit {
        what,
        value: len,
        limit: format!("the in-kernel tokenizer's limit of {limit}"),
    }
}

/// The Qwen3 tokenizer running in the kernel, with an arena of its own (no model needed):
/// [`KernelTokenizer::encode`] gives the ids the `tokenizers` crate gives.
pub struct KernelTokenizer {
    ops: Ops,
    regions: TokRegions,
}

impl std::fmt::Debug for KernelTokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KernelTokenizer")
            .field("regions", &self.regions)
            .finish()
    }
}

impl KernelTokenizer {
    /// Builds `tok`'s tables (refusing a tokenizer of another kind than Qwen's with
    /// [`Error::Tokenizer`]) and loads them into new shared memory with the BPF programs: an
    /// arena where this process may create one, array maps otherwise.
    pub fn load(tok: &Tokenizer) -> Result<KernelTokenizer> {
        Self::from_tables(&TokTables::build(tok)?)
    }

    /// Loads tables already built.
    pub fn from_tables(t: &TokTables) -> Result<KernelTokenizer> {
        Self::from_tables_on(t, MemoryLayer::Auto)
    }

    /// [`KernelTokenizer::from_tables`] on memory layer `layer` (refused with its cause where
    /// the kernel does not give it).
    pub fn from_tables_on(t: &TokTables, layer: MemoryLayer) -> Result<KernelTokenizer> {
        let bytes = TokRegions::arena_bytes(t.words.len());
        let mut ops = Ops::load_on(bytes, false, layer)?;
        ops.require("tokenize_text")?; // refused at load, not at the first text
        let r = ops.arena.reserve(bytes, "tokenizer")?;
        let regions = TokRegions::place(&mut ops.arena, r, t)?;
        Ok(KernelTokenizer { ops, regions })
    }

    /// The memory layer the programs run on.
    pub fn layer(&self) -> MemoryLayer {
        self.ops.layer()
    }

    /// The ids of `text`, computed in the kernel. A text past a kernel limit (see
    /// `src/bpf/limits.h`: at most 65,536 bytes, 65,536 ids, pieces of 8,192 bytes) is refused
    /// with [`Error::Limit`], never truncated.
    pub fn encode(&mut self, text: &str) -> Result<Vec<u32>> {
        self.ops.tokenize(&self.regions, text)
    }

    /// The kernel's own answer on `text` with room for `max_out` ids: the ids or its negative
    /// `TOK_E_*` code (its limits are checked by the kernel only).
    #[doc(hidden)]
    pub fn encode_raw(
        &mut self,
        text: &[u8],
        max_out: usize,
    ) -> Result<std::result::Result<Vec<u32>, i32>> {
        self.ops.tokenize_raw(&self.regions, text, max_out)
    }

    /// The verifier's processed instructions of each loaded program of the BPF object, by name
    /// (`tokenize_text` among them; the kernel refuses a program past 1,000,000).
    pub fn verified_instructions(&self) -> Result<Vec<(String, u32)>> {
        self.ops.verified_instructions()
    }
}
