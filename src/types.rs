//! The small types every layer shares: which weight store ([`Backend`]), which KV-cache format
//! ([`KvFormat`]) and how a model runs its step ([`Dispatch`]). Their behaviour lives with the
//! layer that owns it (opening a store in `store`, the cache layout in `model::kv`); here they
//! are only names, so that a low layer (the limits table, the kernel) can take them without
//! reaching up. [`check_feed`] is the one check of tokens against a context.

use crate::{Error, Result};

/// The weight-store backends `Model` can open.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Backend {
    /// Q24 weights converted once to a cache file and kept resident in the arena.
    Q24,
    /// The same Q24 cache, streamed through a 2 MiB arena window before each operator run.
    Arena,
    /// 4-bit attention and MLP weights, 8-bit LM head, SWAR kernels (`store::int::INT4`).
    Int4,
    /// 8-bit weights with 16-bit activations, SWAR kernels (`store::int::INT8`).
    Int8,
}

impl Backend {
    /// The backend's name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Backend::Q24 => "q24",
            Backend::Arena => "arena",
            Backend::Int4 => "int4",
            Backend::Int8 => "int8",
        }
    }

    /// Every backend, in the order reports list them.
    pub const ALL: [Backend; 4] = [Backend::Q24, Backend::Arena, Backend::Int4, Backend::Int8];

    /// The backend called `name` on the command line.
    pub fn from_name(name: &str) -> Option<Backend> {
        Backend::ALL.into_iter().find(|b| b.name() == name)
    }
}

/// How the KV cache stores keys and values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum KvFormat {
    /// i32 Q16, as the activations: exact, `4 * head_dim` bytes per head and position for each
    /// of K and V. The reference format.
    #[default]
    Q16,
    /// int8 codes with one u32 step per (position, kv head) (`num::kv8`): `head_dim + 4`
    /// bytes per head and position for each of K and V, attention with SWAR-packed products.
    Int8,
}

impl KvFormat {
    /// Every format, in the order reports list them.
    pub const ALL: [KvFormat; 2] = [KvFormat::Q16, KvFormat::Int8];

    /// The name on the command line (`q16`, `int8`).
    pub fn name(self) -> &'static str {
        match self {
            KvFormat::Q16 => "q16",
            KvFormat::Int8 => "int8",
        }
    }

    /// The format called `name` on the command line.
    pub fn from_name(name: &str) -> Option<KvFormat> {
        KvFormat::ALL.into_iter().find(|f| f.name() == name)
    }
}

/// How a [`crate::Model`] runs its plan.
///
/// A store *can be planned* when every weight it multiplies is resident in the arena, so that
/// the whole step of a token can be recorded once at open and replayed (by the kernel or per
/// operator): the q24, int4 and int8 stores. The arena-batch store ([`Backend::Arena`]) moves
/// weight windows from user space between operators and cannot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Dispatch {
    /// The fastest that works for the store: [`Dispatch::Kernel`] where the store can be
    /// planned, else [`Dispatch::PerOp`].
    #[default]
    Auto,
    /// One `test_run` per operator run, from user space (every store).
    PerOp,
    /// One `test_run` of `run_plan` per thread and token: the kernel runs the whole step.
    /// Not for the arena-batch store, which moves weight windows from user space.
    Kernel,
}

impl Dispatch {
    /// The name on the command line (`auto`, `per-op`, `kernel`).
    pub fn name(self) -> &'static str {
        match self {
            Dispatch::Auto => "auto",
            Dispatch::PerOp => "per-op",
            Dispatch::Kernel => "kernel",
        }
    }

    /// The dispatch called `name`.
    pub fn from_name(name: &str) -> Option<Dispatch> {
        [Dispatch::Auto, Dispatch::PerOp, Dispatch::Kernel]
            .into_iter()
            .find(|d| d.name() == name)
    }
}

/// The one check of input before anything is fed: `tokens` (at least one) fed at position `pos`
/// of a context of `max_context` positions over a vocabulary of `vocab` ids. An empty input is
/// [`Error::EmptyPrompt`]; an id outside the vocabulary [`Error::TokenOutOfRange`] (at the
/// position it would have had); an input longer than the room left [`Error::ContextOverflow`].
pub(crate) fn check_feed(tokens: &[u32], pos: usize, max_context: usize, vocab: usize) -> Result<()> {
    if tokens.is_empty() {
        return Err(Error::EmptyPrompt);
    }
    if let Some((i, &id)) = tokens.iter().enumerate().find(|&(_, &t)| t as usize >= vocab) {
        return Err(Error::TokenOutOfRange { id, index: pos + i, vocab });
    }
    check_room(tokens.len(), pos, max_context)
}

/// The one context check: `tokens` more tokens fit a context of `max_context` from position
/// `pos`, or [`Error::ContextOverflow`]. [`check_feed`] runs it on every feed; the filter on the
/// most tokens a rule may feed (`CompiledRule::context_needed`, from position 0).
pub(crate) fn check_room(tokens: usize, pos: usize, max_context: usize) -> Result<()> {
    if tokens > max_context.saturating_sub(pos) {
        return Err(Error::ContextOverflow { pos: pos.max(max_context), max_context, tokens });
    }
    Ok(())
}

/// The check of a rewind: a context keeps a prefix of what was fed, so `position` may not pass
/// the current `pos` ([`Error::InvalidParameter`]).
pub(crate) fn check_rewind(position: usize, pos: usize) -> Result<()> {
    if position > pos {
        return Err(Error::InvalidParameter {
            name: "position",
            value: position as f64,
            expected: "at most the current position (rewind keeps a prefix of what was fed)",
        });
    }
    Ok(())
}
