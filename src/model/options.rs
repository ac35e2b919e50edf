//! How to open a model ([`ModelOptions`]) and what kernel memory it takes ([`KernelMemory`]).

use std::path::PathBuf;

use crate::kernel::memory::MemoryLayer;
use crate::types::{Backend, Dispatch, KvFormat};

/// How to open a [`Model`](crate::Model): [`ModelOptions::default`] and the `with_*` methods, or a struct
/// literal ending in `..Default::default()`.
///
/// ```
/// use qwen_bpf::{Backend, KvFormat, ModelOptions};
/// let opts = ModelOptions::default().with_max_context(256).with_kv(KvFormat::Int8);
/// let same = ModelOptions { max_context: 256, kv: KvFormat::Int8, ..Default::default() };
/// assert_eq!((opts.max_context, opts.kv), (same.max_context, same.kv));
/// ```
///
/// Not `#[non_exhaustive]` on purpose: that would forbid the struct-update form above outside
/// the crate. Fields added later come with a default, so code using either form keeps compiling.
#[derive(Debug, Clone)]
pub struct ModelOptions {
    /// Which weight store to use (default [`Backend::Q24`](crate::Backend::Q24)).
    pub backend: Backend,
    /// KV-cache capacity in tokens; feeding more is [`Error::ContextOverflow`](crate::Error::ContextOverflow). The cache is
    /// reserved for all of it, but kernel memory is committed only for positions reached.
    pub max_context: usize,
    /// How the KV cache stores keys and values (default [`KvFormat::Q16`], exact).
    pub kv: KvFormat,
    /// Where converted-weight cache files go (default: the model directory).
    pub cache_dir: Option<PathBuf>,
    /// Show progress bars on stderr while converting weights (default: off).
    pub progress: bool,
    /// Threads for the largest operators (fused gate/up, LM head): each such operator becomes one
    /// BPF run per thread over its share of the rows. Default: the CPUs available, at most 2.
    pub threads: usize,
    /// [`Model::next_token`](crate::Model::next_token) screens the LM head with a low-bit copy and rescores exactly only
    /// the rows that can win (see `num::bound`): the same token as the full head, faster
    /// where the screen prunes. Default true for the q24 and int stores (the screen costs arena
    /// memory, reported in [`KernelMemory::head_screen`]); false runs the full exact head.
    pub screened_head: bool,
    /// How each token's step is run (default [`Dispatch::Auto`]: in the kernel, one `run_plan`
    /// invocation per thread, wherever the store allows it).
    pub dispatch: Dispatch,
    /// Contexts for generations that kernel events start ([`Model::serve_events`](crate::Model::serve_events)), each with
    /// its own KV cache, scratch and one-thread plan; at most 8. Default 0: no event path (its
    /// programs are not even loaded).
    pub event_slots: usize,
    /// Where the kernel memory lives (default [`MemoryLayer::Arena`]). [`MemoryLayer::Array`]
    /// (mmapable array maps: Linux 6.1, or a host whose policy refuses arenas) runs the forward
    /// pass, per operator or through the plan interpreter ([`Dispatch`] as on the arena), the
    /// BPF sampler, the in-kernel tokenizer and generation in the kernel
    /// ([`Model::generate_in_kernel`](crate::Model::generate_in_kernel)); kernel events need
    /// the arena until they move too (issue 35).
    /// [`MemoryLayer::Auto`] takes the arena where this process may create one.
    pub memory: MemoryLayer,
}

impl Default for ModelOptions {
    fn default() -> Self {
        let cpus = std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1);
        ModelOptions {
            backend: Backend::Q24,
            max_context: 2048,
            kv: KvFormat::Q16,
            cache_dir: None,
            progress: false,
            threads: cpus.min(2),
            screened_head: true,
            dispatch: Dispatch::Auto,
            event_slots: 0,
            memory: MemoryLayer::Arena,
        }
    }
}

impl ModelOptions {
    /// Sets [`ModelOptions::backend`].
    pub fn with_backend(mut self, backend: Backend) -> Self {
        self.backend = backend;
        self
    }

    /// Sets [`ModelOptions::max_context`].
    pub fn with_max_context(mut self, max_context: usize) -> Self {
        self.max_context = max_context;
        self
    }

    /// Sets [`ModelOptions::kv`].
    pub fn with_kv(mut self, kv: KvFormat) -> Self {
        self.kv = kv;
        self
    }

    /// Sets [`ModelOptions::cache_dir`].
    pub fn with_cache_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.cache_dir = Some(dir.into());
        self
    }

    /// Sets [`ModelOptions::progress`].
    pub fn with_progress(mut self, progress: bool) -> Self {
        self.progress = progress;
        self
    }

    /// Sets [`ModelOptions::threads`].
    pub fn with_threads(mut self, threads: usize) -> Self {
        self.threads = threads;
        self
    }

    /// Sets [`ModelOptions::event_slots`].
    pub fn with_event_slots(mut self, slots: usize) -> Self {
        self.event_slots = slots;
        self
    }

    /// Sets [`ModelOptions::dispatch`].
    pub fn with_dispatch(mut self, dispatch: Dispatch) -> Self {
        self.dispatch = dispatch;
        self
    }

    /// Sets [`ModelOptions::memory`].
    pub fn with_memory(mut self, memory: MemoryLayer) -> Self {
        self.memory = memory;
        self
    }
}

/// Kernel (arena) memory a model uses, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct KernelMemory {
    /// Weights: resident tensors or staging windows, as the store keeps them.
    pub weights: usize,
    /// The KV cache reserved for `max_context` positions (arena address space): layers ×
    /// max_context × the format's bytes per position and layer.
    pub kv_cache: usize,
    /// The part of the KV cache committed (kernel memory in use): the positions reached so far,
    /// rounded up to the commit step.
    pub kv_committed: usize,
    /// Activations, RoPE/exp tables, attention scratch, logits.
    pub scratch: usize,
    /// The LM-head screen of [`ModelOptions::screened_head`] (low-bit head copy, scales, per-row
    /// norms, screen logits): part of `weights`.
    pub head_screen: usize,
    /// Arena address space reserved for the in-kernel tokenizer's tables and buffers
    /// ([`crate::Model::load_tokenizer`]); committed only when they are loaded.
    pub tokenizer: usize,
}

impl KernelMemory {
    /// The whole arena, as reserved.
    pub fn total(&self) -> usize {
        self.weights + self.kv_cache + self.scratch + self.tokenizer
    }
}
