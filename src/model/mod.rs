//! `Model`: a Qwen3 checkpoint whose forward pass runs as BPF programs over a [`WeightStore`].
//!
//! `Model::emit` is the forward pass: one flat function, numbered like `modeling_qwen3.py`, one
//! operator call per step over whole vectors or matrices. `Model::open` records it once into a
//! plan ([`crate::kernel::plan`]) that the kernel runs in one `run_plan` invocation per thread and token
//! ([`Dispatch::Kernel`]), or that user space replays one `test_run` per operator run
//! ([`Dispatch::PerOp`]: 8 runs per layer plus 3 with the resident Q24 store on one thread, 227 at
//! the Qwen3-0.6B shape; the low-bit stores add activation quantisation runs). The arena-batch
//! store, which moves weight windows from user space, runs `emit` live, per operator.

mod buffers;
mod context;
mod emit;
pub mod kv;
pub mod open;
mod options;
mod step;

use crate::kernel::ops::Ops;
use crate::kernel::plan::Plan;
use crate::store::WeightStore;
use crate::types::{Dispatch, KvFormat};
use crate::Config;

pub(crate) use buffers::{Buffers, REPLY_TEXT_BYTES};
pub use options::{KernelMemory, ModelOptions};

/// What a step does with the LM head.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Head {
    /// Writes the logits (and finds their argmax).
    Logits,
    /// Finds the argmax only (screened where the model has a screen).
    Argmax,
    /// Nothing: a prompt token whose next-token prediction is not wanted.
    Skip,
}

/// A Qwen3 model loaded into BPF. Dropping it unloads the programs and frees the arena.
pub struct Model {
    pub(crate) cfg: Config,
    pub(crate) max_context: usize,
    pub(crate) ops: Ops,
    pub(crate) store: Box<dyn WeightStore>,
    pub(crate) b: Buffers,
    pub(crate) pos: usize,
    pub(crate) eps_q64: u64,
    pub(crate) scale_q22: i32,
    pub(crate) memory: KernelMemory,
    pub(crate) identity: String,
    /// The last logits [`Model::forward`] returned, converted to f32 (`vocab_size`).
    pub(crate) logits: Vec<f32>,
    /// Whether `next_token` uses the screened LM head (`ModelOptions::screened_head`).
    pub(crate) screened: bool,
    /// The recorded step, when the store can be planned (see [`crate::kernel::plan`]).
    pub(crate) plan: Option<std::sync::Arc<Plan>>,
    /// How the plan runs: [`Dispatch::Kernel`] or [`Dispatch::PerOp`].
    pub(crate) dispatch: Dispatch,
    /// Kernel runs whose barrier timed out and that ran per operator instead.
    pub(crate) fallbacks: u64,
    /// Whether [`Model::load_vocabulary`] put the tokens' text in the arena.
    pub(crate) vocab_loaded: bool,
    /// The arena space reserved for the in-kernel tokenizer, and where its tables are once
    /// [`Model::load_tokenizer`] has put them there.
    pub(crate) tok_space: crate::kernel::arena::Region,
    pub(crate) tok: Option<crate::kernel::tokenize::TokRegions>,
    /// The contexts of [`ModelOptions::event_slots`]: buffers and their one-thread plan.
    pub(crate) events: Vec<(Buffers, std::sync::Arc<Plan>)>,
    /// Whether the event path's workqueue items have been initialised.
    pub(crate) events_ready: bool,
    /// The filter's workqueue items are initialised (`flt_setup` ran).
    pub(crate) filter_ready: bool,
}

impl std::fmt::Debug for Model {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Model")
            .field("store", &self.store.name())
            .field("pos", &self.pos)
            .field("memory", &self.memory)
            .finish()
    }
}

impl Model {
    /// Whether this model's programs were loaded without those of `kind` (its kernel's verifier
    /// refused them, or `QWEN_BPF_SKIP_PROGRAMS` left them out).
    pub(crate) fn loaded_without(&self, kind: crate::kernel::verifier::ProgramKind) -> bool {
        self.ops.without().iter().any(|w| w.0 == kind)
    }

    /// The model's config.
    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// Tokens fed since open or the last [`Model::reset`].
    pub fn position(&self) -> usize {
        self.pos
    }

    /// KV-cache capacity.
    pub fn max_context(&self) -> usize {
        self.max_context
    }

    /// BPF program runs since open.
    pub fn bpf_runs(&self) -> u64 {
        self.ops.runs()
    }

    /// Values the kernels clamped to their fixed-point range since open (an activation beyond
    /// ±32768, a residual beyond ±2^30, …; see docs/safety.md, "Fixed-point headroom"). 0 means the
    /// logits are as exact as the formats promise; otherwise some values were saturated and the
    /// logits may be far from the f32 reference.
    pub fn saturations(&self) -> u64 {
        self.ops.saturations()
    }

    /// Kernel memory by purpose: reserved, and for the KV cache also committed.
    pub fn kernel_memory(&self) -> KernelMemory {
        KernelMemory {
            kv_committed: self.b.kv.committed_bytes(),
            ..self.memory
        }
    }

    /// The KV-cache format.
    pub fn kv_format(&self) -> KvFormat {
        self.b.kv.format
    }

    /// The weight store's name.
    pub fn backend_name(&self) -> &'static str {
        self.store.name()
    }
}

crate::forward::impl_forward!(Model);
