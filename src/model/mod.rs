//! `Model`: a Qwen3 checkpoint whose forward pass runs as BPF programs over a [`WeightStore`].
//!
//! `Model::emit` is the forward pass: one flat function, numbered like `modeling_qwen3.py`, one
//! operator call per step over whole vectors or matrices. `Model::open` records it once into a
//! plan ([`crate::kernel::plan`]) that the kernel runs in one `run_plan` invocation per thread and token
//! ([`Dispatch::Kernel`]), or that user space replays one `test_run` per operator run
//! ([`Dispatch::PerOp`]: 8 runs per layer plus 3 with the resident Q24 store on one thread, 227 at
//! the Qwen3-0.6B shape; the low-bit stores add activation quantisation runs). The arena-batch
//! store, which moves weight windows from user space, runs `emit` live, per operator.

pub mod kv;

use std::path::{Path, PathBuf};

use crate::num::fixed::{self, AttnShape};
use crate::kernel::arena::{Region, MAX_ARENA_BYTES, PAGE};
use crate::kernel::ops::{
    first_best, kv8_pairs, AttentionBuffers, AttentionI8Buffers, Ops, PlanFailure,
};
use kv::{ContextHeader, KvCache};
use crate::types::{Backend, Dispatch, KvFormat};
use crate::kernel::plan::{self, Plan};
use crate::store::{linear_rows, Linear, Norm, WeightStore};
use crate::{Checkpoint, Config, Error, Forward, GenerateOptions, Result, Tokenizer};

/// How to open a [`Model`]: [`ModelOptions::default`] and the `with_*` methods, or a struct
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
    /// Which weight store to use.
    pub backend: Backend,
    /// KV-cache capacity in tokens; feeding more is [`Error::ContextOverflow`]. The cache is
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
    /// [`Model::next_token`] screens the LM head with a low-bit copy and rescores exactly only
    /// the rows that can win (see [`crate::num::bound`]): the same token as the full head, faster
    /// where the screen prunes. Default true for the q24 and int stores (the screen costs arena
    /// memory, reported in [`KernelMemory::head_screen`]); false runs the full exact head.
    pub screened_head: bool,
    /// How each token's step is run (default [`Dispatch::Auto`]: in the kernel, one `run_plan`
    /// invocation per thread, wherever the store allows it).
    pub dispatch: Dispatch,
    /// Contexts for generations that kernel events start ([`Model::serve_events`]), each with
    /// its own KV cache, scratch and one-thread plan; at most 8. Default 0: no event path (its
    /// programs are not even loaded).
    pub event_slots: usize,
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
}

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
}

impl KernelMemory {
    /// The whole arena, as reserved.
    pub fn total(&self) -> usize {
        self.weights + self.kv_cache + self.scratch
    }
}

/// Arena buffers of the forward pass. `block` is the prefill block ([`Backend::prefill_block`]
/// tokens; 1 for the event contexts): a block's tokens go through each operator together.
#[derive(Debug)]
struct Buffers {
    x: Region,        // i64 Q32 [block][hidden]: the residual stream
    xn: Region,       // i32 Q16 [block][hidden]: RMSNorm output
    qkv: Region,      // i32 Q16 [block][q_dim + 2 kv_dim]: q, k, v of each position
    att: Region,      // i32 Q16 [block][q_dim]: attention output
    mlp: Region,      // i32 Q16 [block][intermediate]: silu(gate) * up
    logits: Region,   // i32 Q16 [vocab]
    probs: Region,    // u32 Q30 [n_q][max_ctx]: attention scratch
    acc: Region,      // i64 [n_q][head_dim]: attention scratch
    wv: Region,       // u64 [n_pairs][max_ctx]: int8-KV attention scratch (else empty)
    qq: Region,       // u64 [n_pairs][head_dim]: int8-KV attention scratch (else empty)
    exp2: Region,     // u32 Q30 [257]
    cos: Region,      // i32 Q30 [max_ctx][head_dim/2]
    sin: Region,      // i32 Q30 [max_ctx][head_dim/2]
    kv: KvCache,      // per layer: Q16 K, V [max_ctx][kv_dim], or int8 codes and steps
    ksh: Vec<Region>, // per layer u8 [head_dim]: int8 KV key smoothing shifts (else empty)
    plan: Region,     // plan::Slot [threads][entries]: the recorded step (see crate::kernel::plan)
    prompt: Region,   // u32 [max_ctx]: the prompt of in-kernel generation
    vocab: Region, // u32 offsets [vocab + 1], then the bytes: each token's text, for in-kernel generation
    block: usize,  // tokens the block buffers above hold
}

/// Bytes of each forward-pass buffer for `cfg` and `max_ctx`: the one list that both sizes the
/// arena up front and allocates it.
struct BufferSizes {
    x: usize,
    xn: usize,
    qkv: usize,
    att: usize,
    mlp: usize,
    logits: usize,
    probs: usize,
    acc: usize,
    wv: usize,
    qq: usize,
    exp2: usize,
    rope: usize, // each of cos and sin
    kv: usize,   // the whole KV cache, page-rounded per array
    ksh: usize,  // each layer's key smoothing shifts (int8 KV)
    ksh_layers: usize,
    plan: usize, // the plan's slots, for up to ENTRIES_PER_LAYER per layer
    prompt: usize,
    vocab: usize,
}

impl BufferSizes {
    fn new(
        cfg: &Config,
        max_ctx: usize,
        kv: KvFormat,
        threads: usize,
        block: usize,
    ) -> BufferSizes {
        let (hd, nq) = (cfg.head_dim(), cfg.num_attention_heads);
        let (pairs, ksh_layers) = match kv {
            KvFormat::Q16 => (0, 0),
            KvFormat::Int8 => (
                kv8_pairs(nq, cfg.num_key_value_heads),
                cfg.num_hidden_layers,
            ),
        };
        BufferSizes {
            x: block * cfg.hidden_size * 8,
            xn: block * cfg.hidden_size * 4,
            qkv: block * (cfg.q_dim() + 2 * cfg.kv_dim()) * 4,
            att: block * cfg.q_dim() * 4,
            mlp: block * cfg.intermediate_size * 4,
            logits: cfg.vocab_size * 4,
            probs: nq * max_ctx * 4,
            acc: nq * hd * 8,
            wv: pairs * max_ctx * 8,
            qq: pairs * hd * 8,
            exp2: 257 * 4,
            rope: max_ctx * hd / 2 * 4,
            kv: KvCache::reserved_bytes(kv, cfg, max_ctx),
            ksh: hd,
            ksh_layers,
            plan: Plan::arena_bytes(plan_capacity(cfg), threads.clamp(1, plan::THREADS_MAX)),
            prompt: max_ctx * 4,
            vocab: vocab_bytes(cfg.vocab_size),
        }
    }

    /// Arena bytes of the scratch buffers and of the KV cache, page-rounded as the arena allocates.
    fn arena_bytes(&self) -> (usize, usize) {
        let page = |b: usize| b.div_ceil(PAGE) * PAGE;
        let s = self;
        let scratch = [
            s.x, s.xn, s.qkv, s.att, s.mlp, s.logits, s.probs, s.acc, s.wv, s.qq, s.exp2, s.rope,
            s.rope, s.plan, s.prompt, s.vocab,
        ]
        .iter()
        .map(|&b| page(b))
        .sum::<usize>()
            + s.ksh_layers * page(s.ksh);
        (scratch, s.kv)
    }
}

/// Arena bytes reserved for the vocabulary's text: the offsets and 16 bytes per token (Qwen3's
/// tokens average under 7; pages are committed only as they are written).
fn vocab_bytes(vocab: usize) -> usize {
    (vocab + 1) * 4 + vocab * 16
}

/// The stop tokens as the kernel takes them: at most [`crate::run::in_kernel::STOPS_MAX`].
fn kernel_stops(tokens: &[u32]) -> Result<[u32; crate::run::in_kernel::STOPS_MAX]> {
    let mut stops = [0u32; crate::run::in_kernel::STOPS_MAX];
    if tokens.len() > stops.len() {
        return Err(Error::InvalidParameter {
            name: "stop_tokens",
            value: tokens.len() as f64,
            expected: "at most 8 stop tokens in the kernel",
        });
    }
    stops[..tokens.len()].copy_from_slice(tokens);
    Ok(stops)
}

/// The dispatch a model runs with when `asked` for it: the kernel wherever the store can be
/// planned ([`Dispatch::Auto`]), per operator otherwise; the kernel for a store that cannot be
/// planned is an error.
fn resolve_dispatch(asked: Dispatch, plannable: bool, store: &str) -> Result<Dispatch> {
    match asked {
        Dispatch::Kernel if !plannable => Err(Error::Invalid(format!(
            "dispatch kernel needs every weight resident in the arena; the {store} store moves weights from user space between operators (use per-op)"
        ))),
        Dispatch::Auto | Dispatch::Kernel if plannable => Ok(Dispatch::Kernel),
        _ => Ok(Dispatch::PerOp),
    }
}

/// Plan entries the arena holds room for.
fn plan_capacity(cfg: &Config) -> usize {
    plan::ENTRIES_PER_LAYER * (cfg.num_hidden_layers + 1)
}

/// Refuses an arena of `weights + kv + scratch` bytes beyond the kernel's 4 GiB limit.
fn check_arena(weights: usize, kv: usize, scratch: usize, max_context: usize) -> Result<()> {
    if weights.saturating_add(kv).saturating_add(scratch) > MAX_ARENA_BYTES {
        return Err(Error::Resources {
            msg: format!(
                "{weights} weights + {kv} KV cache (max_context {max_context}) + {scratch} scratch bytes exceed the {MAX_ARENA_BYTES}-byte BPF arena limit"
            ),
        });
    }
    Ok(())
}

/// `MemAvailable` of `/proc/meminfo` in bytes: memory the kernel can hand out without swapping.
pub fn mem_available() -> Option<usize> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let kb = text
        .lines()
        .find_map(|l| l.strip_prefix("MemAvailable:"))?
        .trim()
        .strip_suffix("kB")?
        .trim()
        .parse::<usize>()
        .ok()?;
    kb.checked_mul(1024)
}

/// Refuses an arena of `weights + kv + scratch` bytes (the KV cache sized for `max_context`) that
/// the machine's `available` memory cannot hold; `None` (unknown) passes. Arena pages are
/// kernel memory that cannot be swapped, so this runs before anything is converted or loaded.
pub fn check_memory(
    weights: usize,
    kv: usize,
    scratch: usize,
    max_context: usize,
    available: Option<usize>,
) -> Result<()> {
    let need = weights.saturating_add(kv).saturating_add(scratch);
    match available {
        Some(avail) if need > avail => Err(Error::Resources {
            msg: format!(
                "the arena needs {need} bytes ({weights} weights + {kv} KV cache for max_context {max_context} + {scratch} scratch) \
                 but only {avail} bytes are available (MemAvailable)"
            ),
        }),
        _ => Ok(()),
    }
}

/// A Qwen3 model loaded into BPF. Dropping it unloads the programs and frees the arena.
pub struct Model {
    cfg: Config,
    max_context: usize,
    ops: Ops,
    store: Box<dyn WeightStore>,
    b: Buffers,
    pos: usize,
    eps_q64: u64,
    scale_q22: i32,
    memory: KernelMemory,
    identity: String,
    /// The last logits [`Model::forward`] returned, converted to f32 (`vocab_size`).
    logits: Vec<f32>,
    /// Whether `next_token` uses the screened LM head (`ModelOptions::screened_head`).
    screened: bool,
    /// The recorded step, when the store can be planned (see [`crate::kernel::plan`]).
    plan: Option<std::sync::Arc<Plan>>,
    /// How the plan runs: [`Dispatch::Kernel`] or [`Dispatch::PerOp`].
    dispatch: Dispatch,
    /// Kernel runs whose barrier timed out and that ran per operator instead.
    fallbacks: u64,
    /// Whether [`Model::load_vocabulary`] put the tokens' text in the arena.
    vocab_loaded: bool,
    /// The contexts of [`ModelOptions::event_slots`]: buffers and their one-thread plan.
    events: Vec<(Buffers, std::sync::Arc<Plan>)>,
    /// Whether the event path's workqueue items have been initialised.
    events_ready: bool,
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
    /// Opens the Hugging Face directory `dir`: checks BPF can be used here, validates the
    /// checkpoint, converts or reuses the weight cache, sizes the arena (refusing sizes beyond the
    /// kernel's 4 GiB arena limit before loading anything) and loads the programs.
    pub fn open(dir: impl AsRef<Path>, opts: &ModelOptions) -> Result<Model> {
        let dir = dir.as_ref();
        crate::kernel::probe::probe()?;
        let ck = Checkpoint::open(dir)?;
        let cfg = ck.config.clone();
        if opts.max_context == 0 || opts.max_context > cfg.max_position_embeddings {
            return Err(Error::Invalid(format!(
                "max_context {} must be in 1..={} (max_position_embeddings)",
                opts.max_context, cfg.max_position_embeddings
            )));
        }
        // Every kernel bound (matrix widths, head_dim, row blocks), before anything is converted.
        crate::num::limits::check(&cfg, opts.backend, opts.kv)?;
        // The KV cache alone must fit the arena; checking it first also keeps every size below
        // far from overflowing (max_context may be anything up to max_position_embeddings).
        let kv_per_token = opts.kv.bytes_per_position(&cfg);
        if opts.max_context.saturating_mul(kv_per_token) > MAX_ARENA_BYTES {
            return Err(Error::Resources {
                msg: format!(
                    "a KV cache of {} bytes ({kv_per_token} bytes per token × max_context {}) exceeds the {MAX_ARENA_BYTES}-byte BPF arena limit",
                    opts.max_context as u128 * kv_per_token as u128,
                    opts.max_context
                ),
            });
        }
        if opts.event_slots > crate::run::event::SLOTS_MAX {
            return Err(Error::Invalid(format!(
                "event_slots {} must be at most {}",
                opts.event_slots,
                crate::run::event::SLOTS_MAX
            )));
        }
        let block = opts.backend.prefill_block();
        let (scratch, kv) =
            BufferSizes::new(&cfg, opts.max_context, opts.kv, opts.threads, block).arena_bytes();
        // every event context has buffers and a KV cache of its own
        let (scratch, kv) = (
            scratch
                + opts.event_slots
                    * BufferSizes::new(&cfg, opts.max_context, opts.kv, 1, 1)
                        .arena_bytes()
                        .0,
            kv * (1 + opts.event_slots),
        );
        // Only the resident Q24 store's weight bytes are known before conversion.
        let weights_estimate = if opts.backend == Backend::Q24 {
            cfg.num_parameters() * 4
        } else {
            0
        };
        check_arena(weights_estimate, kv, scratch, opts.max_context)?;
        check_memory(
            weights_estimate,
            kv,
            scratch,
            opts.max_context,
            mem_available(),
        )?;
        let identity = ck.identity();
        let cache_dir = opts.cache_dir.clone().unwrap_or_else(|| dir.to_path_buf());
        let mut store = opts.backend.open(&ck, &cache_dir, opts.progress)?;
        let plannable = store.enable_plan(1 + opts.event_slots);
        if opts.event_slots > 0 && !plannable {
            return Err(Error::Invalid(format!(
                "kernel events need a store that can be planned, not {}",
                store.name()
            )));
        }
        let dispatch = resolve_dispatch(opts.dispatch, plannable, store.name())?;
        let screened = opts.screened_head && store.enable_screen();
        drop(ck);
        let weights = store.arena_bytes().div_ceil(PAGE) * PAGE;
        let memory = KernelMemory {
            weights,
            kv_cache: kv,
            kv_committed: 0,
            scratch,
            head_screen: store.screen_bytes(),
        };
        // Again with the store's exact weight bytes (the estimate above covers only q24).
        check_arena(weights, kv, scratch, opts.max_context)?;
        check_memory(weights, kv, scratch, opts.max_context, mem_available())?;
        let mut ops = Ops::load_with(memory.total(), opts.event_slots > 0)?;
        ops.set_threads(opts.threads);
        store.upload(&mut ops)?;
        let mut b = Self::alloc_buffers(
            &mut ops,
            &cfg,
            opts.max_context,
            opts.kv,
            opts.threads,
            block,
        )?;
        if opts.kv == KvFormat::Int8 {
            for l in 0..cfg.num_hidden_layers {
                let w = ops.arena.slice::<i32>(store.norm(Norm::K(l)))?.to_vec();
                let r = ops.arena.alloc(cfg.head_dim(), "key smoothing shifts")?;
                ops.arena
                    .slice_mut::<u8>(r)?
                    .copy_from_slice(&crate::num::kv8::key_shifts(&w));
                b.ksh.push(r);
            }
        }
        Ok(Model {
            identity,
            logits: vec![0.0; cfg.vocab_size],
            eps_q64: fixed::eps_q64(cfg.rms_norm_eps),
            scale_q22: fixed::attn_scale_q22(cfg.head_dim()),
            cfg,
            max_context: opts.max_context,
            ops,
            store,
            b,
            pos: 0,
            memory,
            screened,
            plan: None,
            dispatch,
            fallbacks: 0,
            vocab_loaded: false,
            events: Vec::new(),
            events_ready: false,
        })
        .and_then(|mut m| {
            if plannable {
                m.plan = Some(std::sync::Arc::new(m.record()?));
            }
            for i in 0..opts.event_slots {
                let b = Self::alloc_buffers(&mut m.ops, &m.cfg, m.max_context, opts.kv, 1, 1)?;
                let main = std::mem::replace(&mut m.b, b);
                m.b.ksh = main.ksh.clone();
                m.ops.set_threads(1);
                m.store.set_context(1 + i);
                let plan = m.record();
                m.store.set_context(0);
                m.ops.set_threads(opts.threads);
                let b = std::mem::replace(&mut m.b, main);
                m.events.push((b, std::sync::Arc::new(plan?)));
            }
            Ok(m)
        })
    }

    /// Records the step as a plan (token 0 at position 0; see [`crate::kernel::plan`]) and uploads its
    /// slots to the arena.
    fn record(&mut self) -> Result<Plan> {
        self.ops.start_recording();
        let emitted = self.emit(&[0], 0, Head::Logits);
        let entries = self.ops.finish_recording();
        emitted?;
        let plan = Plan::new(entries)?;
        if plan.entries.last().and_then(|e| e.head).is_none() {
            return Err(Error::Invalid(
                "the recorded step does not end with the LM head".into(),
            ));
        }
        let slots = plan.slots();
        let bytes: &[u8] = bytemuck::cast_slice(&slots);
        if bytes.len() > self.b.plan.len() {
            return Err(Error::Invalid(format!(
                "the recorded step needs {} bytes of plan slots; {} were reserved",
                bytes.len(),
                self.b.plan.len()
            )));
        }
        let dst = self.b.plan.prefix(bytes.len())?;
        self.ops.arena.slice_mut::<u8>(dst)?.copy_from_slice(bytes);
        Ok(plan)
    }

    fn alloc_buffers(
        ops: &mut Ops,
        cfg: &Config,
        max_ctx: usize,
        kv: KvFormat,
        threads: usize,
        block: usize,
    ) -> Result<Buffers> {
        let a = &mut ops.arena;
        let z = BufferSizes::new(cfg, max_ctx, kv, threads, block);
        let b = Buffers {
            x: a.alloc(z.x, "x")?,
            xn: a.alloc(z.xn, "xn")?,
            qkv: a.alloc(z.qkv, "qkv")?,
            att: a.alloc(z.att, "att")?,
            mlp: a.alloc(z.mlp, "mlp")?,
            logits: a.alloc(z.logits, "logits")?,
            probs: a.alloc(z.probs, "attention probabilities")?,
            acc: a.alloc(z.acc, "attention accumulators")?,
            wv: a.alloc(z.wv, "attention value weights")?,
            qq: a.alloc(z.qq, "attention packed queries")?,
            exp2: a.alloc(z.exp2, "exp2 table")?,
            cos: a.alloc(z.rope, "RoPE cos")?,
            sin: a.alloc(z.rope, "RoPE sin")?,
            kv: KvCache::reserve(a, kv, cfg, max_ctx)?,
            ksh: Vec::new(),
            plan: a.alloc(z.plan, "plan slots")?,
            prompt: a.alloc(z.prompt, "in-kernel prompt")?,
            vocab: a.alloc(z.vocab, "vocabulary text")?,
            block,
        };
        a.slice_mut::<u32>(b.exp2)?
            .copy_from_slice(&fixed::exp2_table());
        let (cos, sin) = fixed::rope_tables(cfg.rope_theta(), cfg.head_dim(), max_ctx);
        a.slice_mut::<i32>(b.cos)?.copy_from_slice(&cos);
        a.slice_mut::<i32>(b.sin)?.copy_from_slice(&sin);
        Ok(b)
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
    /// ±32768, a residual beyond ±2^30, …; see README, "Fixed-point headroom"). 0 means the
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

    /// What a saved context of this model must match.
    fn context_header(&self) -> ContextHeader {
        ContextHeader {
            identity: self.identity.clone(),
            config: self.cfg.clone(),
            store: self.store.name().into(),
            kv: self.b.kv.format.name().into(),
            position: self.pos,
            payload_bytes: 0,
            checksum: String::new(),
        }
    }

    /// Writes the context (the KV cache of every position fed so far, and the position) to
    /// `path`, checksummed, through a temporary file renamed into place. [`Model::load_context`]
    /// in any process restores it into a model of the same checkpoint, weight store and KV
    /// format, which then continues exactly as this one would.
    pub fn save_context(&self, path: impl AsRef<Path>) -> Result<()> {
        kv::save(
            path.as_ref(),
            &self.ops.arena,
            &self.b.kv,
            self.context_header(),
        )
    }

    /// Replaces the context with the one saved at `path`. A file that is damaged, truncated, or
    /// was saved by a model of another checkpoint, weight store or KV format is refused with
    /// [`Error::Context`]; one longer than this model's `max_context` with
    /// [`Error::ContextOverflow`]. The model is unchanged on error.
    pub fn load_context(&mut self, path: impl AsRef<Path>) -> Result<()> {
        let path = path.as_ref();
        let (header, payload) = kv::read(path, &self.context_header())?;
        if header.position > self.max_context {
            return Err(Error::ContextOverflow {
                pos: header.position,
                max_context: self.max_context,
            });
        }
        kv::load_into(
            path,
            &mut self.ops.arena,
            &mut self.b.kv,
            header.position,
            &payload,
        )?;
        self.pos = header.position;
        Ok(())
    }

    /// The weight store's name.
    pub fn backend_name(&self) -> &'static str {
        self.store.name()
    }

    /// Forgets the context (the KV cache is overwritten as positions are reused).
    pub fn reset(&mut self) {
        self.pos = 0;
    }

    /// Keeps only the first `position` tokens of the context, so that generation can continue
    /// from there (e.g. after a shared prompt). A position beyond the current one is
    /// [`Error::ContextOverflow`].
    pub fn rewind(&mut self, position: usize) -> Result<()> {
        if position > self.pos {
            return Err(Error::ContextOverflow {
                pos: position,
                max_context: self.pos,
            });
        }
        self.pos = position;
        Ok(())
    }

    /// For benchmarks at depth: extends the context to `position` tokens by repeating the KV
    /// rows of the positions fed so far (at least one), as if that many tokens had been fed.
    /// Attention then costs what it costs at that depth; the logits mean nothing.
    #[doc(hidden)]
    pub fn bench_fill_context(&mut self, position: usize) -> Result<()> {
        if self.pos == 0 || position > self.max_context {
            return Err(Error::Invalid(format!(
                "bench_fill_context({position}) needs a fed token and position <= max_context {}",
                self.max_context
            )));
        }
        self.b.kv.ensure(&mut self.ops.arena, position);
        self.b
            .kv
            .repeat_rows(&mut self.ops.arena, self.pos, position)?;
        self.pos = position;
        Ok(())
    }

    /// Feeds `token` and returns the next-token logits (`vocab_size` f32, converted from Q16),
    /// borrowed until the next call ([`Forward::forward`]).
    pub fn forward(&mut self, token: u32) -> Result<&[f32]> {
        self.step(token, Head::Logits)?;
        self.logits_f32()
    }

    /// The logits the last step wrote, converted from Q16 to f32 into `self.logits`.
    fn logits_f32(&mut self) -> Result<&[f32]> {
        let q16 = self.ops.arena.slice::<i32>(self.b.logits)?;
        for (out, &v) in self.logits.iter_mut().zip(q16) {
            *out = fixed::from_fixed(v, fixed::Q_ACT);
        }
        Ok(&self.logits)
    }

    /// Feeds `token` and returns the logits exactly as the kernel computed them (Q16), borrowed
    /// from the arena until the next call.
    pub fn forward_fixed(&mut self, token: u32) -> Result<&[i32]> {
        self.step(token, Head::Logits)?;
        self.ops.arena.slice::<i32>(self.b.logits)
    }

    /// Feeds `token` and returns the most likely next token, computed by the BPF LM head with a
    /// fused argmax (no logits are copied out): the screened head ([`crate::num::bound`]) unless the
    /// model was opened with [`ModelOptions::screened_head`] false; the same token either way.
    pub fn next_token(&mut self, token: u32) -> Result<u32> {
        Ok(self.step(token, Head::Argmax)?.0 as u32)
    }

    /// Whether [`Model::next_token`] uses the screened head (see [`ModelOptions::screened_head`]).
    pub fn screened_head(&self) -> bool {
        self.screened
    }

    /// For benchmarks and tests: switches [`Model::next_token`] between the screened head (when
    /// the model was opened with one) and the full exact head.
    #[doc(hidden)]
    pub fn set_screened_head(&mut self, on: bool) {
        self.screened = on && self.memory.head_screen > 0;
    }

    /// What the screened head found at the last [`Model::next_token`]: rows rescored exactly,
    /// the best lower bound. `None` when the full head ran.
    pub fn head_screen_result(&self) -> Option<crate::kernel::swar_ops::ScreenResult> {
        self.store.screen_result().filter(|_| self.screened)
    }

    /// Feeds a whole prompt and returns the logits after its last token. The prompt is checked
    /// before anything is fed, so on error the model is unchanged: no token is
    /// [`Error::EmptyPrompt`], an id outside the vocabulary is [`Error::TokenOutOfRange`] (with its
    /// index in `tokens`), and a prompt longer than the remaining context is
    /// [`Error::ContextOverflow`] (at the first position that does not fit). The logits are
    /// borrowed as in [`Model::forward`].
    ///
    /// The prompt goes through the model in blocks of [`Model::prefill_block`] tokens: each
    /// weight matrix is read once per block and multiplied by the block's vectors, attention
    /// runs position by position inside the block, and only the last token gets the LM head.
    /// Every token's integers (its KV rows, the last token's logits) are exactly those of
    /// feeding the tokens one by one with [`Model::forward`].
    pub fn prefill(&mut self, tokens: &[u32]) -> Result<&[f32]> {
        self.check_prompt(tokens)?;
        let block = self.b.block;
        let n = tokens.len();
        let mut fed = 0;
        while fed < n {
            let chunk = &tokens[fed..(fed + block).min(n)];
            fed += chunk.len();
            // only the last prompt token's logits are wanted
            let head = if fed == n { Head::Logits } else { Head::Skip };
            match chunk {
                [t] => {
                    self.step(*t, head)?;
                }
                _ => {
                    // checked above: every id is in the vocabulary and the context has room
                    self.b
                        .kv
                        .ensure(&mut self.ops.arena, self.pos + chunk.len());
                    self.emit(chunk, self.pos, head)?;
                    self.pos += chunk.len();
                }
            }
        }
        self.logits_f32()
    }

    /// Tokens per prefill block: how many prompt tokens [`Model::prefill`] runs through each
    /// weight matrix at once ([`Backend::prefill_block`] of the store).
    pub fn prefill_block(&self) -> usize {
        self.b.block
    }

    /// How the step runs: [`Dispatch::Kernel`] (one `run_plan` invocation per thread and
    /// token) or [`Dispatch::PerOp`] (one `test_run` per operator run).
    pub fn dispatch(&self) -> Dispatch {
        self.dispatch
    }

    /// For benchmarks and tests: switches between [`Dispatch::Kernel`] and [`Dispatch::PerOp`]
    /// ([`Dispatch::Auto`] picks the kernel); the kernel needs a store that can be planned.
    #[doc(hidden)]
    pub fn set_dispatch(&mut self, dispatch: Dispatch) -> Result<()> {
        self.dispatch = resolve_dispatch(dispatch, self.plan.is_some(), self.store.name())?;
        Ok(())
    }

    /// Puts every token's text bytes ([`Tokenizer::token_bytes`]) in the arena, so that
    /// [`Model::generate_in_kernel`] carries the text of each token out of the kernel with it.
    /// A vocabulary whose text exceeds the space reserved for it, or with a token longer than a
    /// ring-buffer record holds (256 bytes), is refused.
    pub fn load_vocabulary(&mut self, tok: &Tokenizer) -> Result<()> {
        let n = self.cfg.vocab_size;
        let bytes = tok.vocabulary_bytes(n);
        if let Some((id, b)) = bytes
            .iter()
            .enumerate()
            .find(|(_, b)| b.len() > crate::kernel::ring::TEXT_MAX)
        {
            return Err(Error::Invalid(format!(
                "token {id} has {} bytes of text; in-kernel generation carries at most {}",
                b.len(),
                crate::kernel::ring::TEXT_MAX
            )));
        }
        let head = (n + 1) * 4;
        let total = head + bytes.iter().map(Vec::len).sum::<usize>();
        if total > self.b.vocab.len() {
            return Err(Error::Invalid(format!(
                "the vocabulary's text takes {total} bytes; {} are reserved",
                self.b.vocab.len()
            )));
        }
        let mut table = Vec::with_capacity(total);
        let mut off = head as u32;
        for b in bytes.iter().map(|b| b.len() as u32).chain([0]) {
            table.extend_from_slice(&off.to_ne_bytes());
            off += b;
        }
        bytes.iter().for_each(|b| table.extend_from_slice(b));
        let dst = self.b.vocab.prefix(total)?;
        self.ops.arena.slice_mut::<u8>(dst)?.copy_from_slice(&table);
        self.vocab_loaded = true;
        Ok(())
    }

    /// Greedy generation inside the kernel: one BPF invocation per thread feeds `prompt` and
    /// generates up to `opts.max_tokens` tokens (stopping at `opts.stop_tokens`), the argmax of
    /// each step fed back in the kernel, writing each token to a BPF ring buffer as it is made;
    /// the returned iterator reads them. An invocation runs at most
    /// [`crate::run::in_kernel::BUDGET`] (the first one returns after the first new token) and the
    /// iterator invokes again until the generation ends.
    /// Needs a store that can be planned; `opts.sampling` must be greedy (the kernel has no
    /// sampler). The prompt is checked as in [`Model::prefill`].
    pub fn generate_in_kernel(
        &mut self,
        prompt: &[u32],
        opts: &GenerateOptions,
    ) -> Result<crate::run::in_kernel::KernelGeneration<'_>> {
        let Some(plan) = self.plan.clone() else {
            return Err(Error::Invalid(format!(
                "in-kernel generation needs a store that can be planned, not {}",
                self.store.name()
            )));
        };
        let p = &opts.sampling;
        for (name, value, greedy) in [
            ("temperature", p.temperature, 0.0),
            ("repetition_penalty", p.repetition_penalty, 1.0),
            ("presence_penalty", p.presence_penalty, 0.0),
            ("frequency_penalty", p.frequency_penalty, 0.0),
        ] {
            if value != greedy {
                return Err(Error::InvalidParameter {
                    name,
                    value: value as f64,
                    expected: "the greedy setting: in-kernel generation takes the argmax",
                });
            }
        }
        let stops = kernel_stops(&opts.stop_tokens)?;
        self.check_prompt(prompt)?;
        let max_new = opts.max_tokens.min(u32::MAX as usize - 1) as u32;
        // every position this generation can feed, committed ahead (a store to an uncommitted
        // arena page would be lost)
        let reach = (self.pos + prompt.len() + max_new as usize).min(self.max_context);
        self.b.kv.ensure(&mut self.ops.arena, reach);
        let dst = self.b.prompt.prefix(prompt.len() * 4)?;
        self.ops
            .arena
            .slice_mut::<u32>(dst)?
            .copy_from_slice(prompt);
        self.ops.tokens.clear();
        let head = plan.entries.last().expect("a plan ends with the head");
        let args = (0..plan.threads)
            .map(|t| crate::kernel::ops::GenArgs {
                run: crate::kernel::ops::RunPlanArgs {
                    plan: self.ops.addr_of(self.b.plan),
                    n_entries: plan.entries.len() as u32,
                    thread: t as u32,
                    lane: t as u32,
                    n_threads: plan.threads as u32,
                    pos: self.pos as u32,
                    ..Default::default()
                },
                prompt: self.ops.addr_of(self.b.prompt),
                vocab: if self.vocab_loaded {
                    self.ops.addr_of(self.b.vocab)
                } else {
                    0
                },
                budget_ns: crate::run::in_kernel::BUDGET.as_nanos() as u64,
                n_prompt: prompt.len() as u32,
                max_new,
                max_ctx: self.max_context as u32,
                head_parts: head.parts.len() as u32,
                n_stops: opts.stop_tokens.len() as u32,
                stops,
                ..Default::default()
            })
            .collect();
        Ok(crate::run::in_kernel::KernelGeneration::new(self, args))
    }

    /// One round of in-kernel generation (see [`crate::run::in_kernel`]): runs `args` and moves the
    /// position to where the kernel stopped.
    pub(crate) fn invoke_generate(
        &mut self,
        args: &mut [crate::kernel::ops::GenArgs],
    ) -> std::result::Result<(), PlanFailure> {
        let r = self.ops.run_generate(args);
        self.pos = args[0].run.pos as usize;
        r
    }

    /// Serves generations started by kernel events (see [`crate::run::event`]) until the returned
    /// server is dropped: attaches the XDP program to `cfg.ifindex` for UDP datagrams to
    /// `cfg.port` from `cfg.sources`. Needs [`ModelOptions::event_slots`] > 0; every slot's KV
    /// cache is committed in full first. Each request starts a fresh context at position 0.
    pub fn serve_events(
        &mut self,
        cfg: &crate::run::event::EventConfig,
    ) -> Result<crate::run::event::EventServer<'_>> {
        use crate::run::event::{PROMPT_MAX, SOURCES_MAX};
        if self.events.is_empty() {
            return Err(Error::Invalid(
                "serving kernel events needs a model opened with event_slots > 0".into(),
            ));
        }
        if cfg.sources.is_empty() || cfg.sources.len() > SOURCES_MAX {
            return Err(Error::InvalidParameter {
                name: "sources",
                value: cfg.sources.len() as f64,
                expected: "1 to 4 IPv4 sources",
            });
        }
        let stops = kernel_stops(&cfg.stop_tokens)?;
        if cfg.max_new == 0 {
            return Err(Error::InvalidParameter {
                name: "max_new",
                value: 0.0,
                expected: "at least 1",
            });
        }
        let vocab = if self.vocab_loaded {
            self.ops.addr_of(self.b.vocab)
        } else {
            0
        };
        let mut templates = Vec::new();
        for (i, (b, plan)) in self.events.iter_mut().enumerate() {
            b.kv.ensure(&mut self.ops.arena, self.max_context);
            templates.push(crate::kernel::ops::GenArgs {
                run: crate::kernel::ops::RunPlanArgs {
                    plan: self.ops.arena.addr(b.plan),
                    n_entries: plan.entries.len() as u32,
                    n_threads: 1,
                    lane: i as u32,
                    ..Default::default()
                },
                prompt: self.ops.arena.addr(b.prompt),
                vocab,
                budget_ns: crate::run::in_kernel::BUDGET.as_nanos() as u64,
                max_ctx: self.max_context as u32,
                head_parts: 1,
                n_stops: cfg.stop_tokens.len() as u32,
                stops,
                ..Default::default()
            });
        }
        let mut sources = [0u32; SOURCES_MAX];
        for (s, a) in sources.iter_mut().zip(&cfg.sources) {
            *s = u32::from_ne_bytes(a.octets());
        }
        let ev = crate::kernel::ops::EventCfg {
            port: cfg.port as u32,
            ifindex: cfg.ifindex,
            n_sources: cfg.sources.len() as u32,
            sources,
            vocab: self.cfg.vocab_size as u32,
            max_new: cfg.max_new,
            max_prompt: PROMPT_MAX.min(self.max_context) as u32,
            n_slots: self.events.len() as u32,
        };
        self.ops.tokens.clear();
        let link = self.ops.start_events(ev, &templates, !self.events_ready)?;
        self.events_ready = true;
        Ok(crate::run::event::EventServer::new(self, link))
    }

    /// Waits up to `timeout_ms` for ring-buffer records.
    pub(crate) fn poll_records(&mut self, timeout_ms: i32) -> Result<()> {
        self.ops.tokens.poll(timeout_ms)
    }

    /// The event path's counters.
    pub(crate) fn event_counters(&self) -> [u64; 4] {
        self.ops.event_counters()
    }

    /// The next record of in-kernel generation, if one has arrived.
    pub(crate) fn next_generated(&mut self) -> Option<crate::kernel::ring::GenToken> {
        self.ops.tokens.pop()
    }

    /// Checks a prompt before anything is fed (see [`Model::prefill`]).
    fn check_prompt(&self, tokens: &[u32]) -> Result<()> {
        if tokens.is_empty() {
            return Err(Error::EmptyPrompt);
        }
        let vocab = self.cfg.vocab_size;
        if let Some((index, &id)) = tokens
            .iter()
            .enumerate()
            .find(|&(_, &t)| t as usize >= vocab)
        {
            return Err(Error::TokenOutOfRange { id, index, vocab });
        }
        if tokens.len() > self.max_context - self.pos {
            return Err(Error::ContextOverflow {
                pos: self.max_context,
                max_context: self.max_context,
            });
        }
        Ok(())
    }

    /// The recorded step (`None` for the arena-batch store, whose step runs live).
    #[doc(hidden)]
    pub fn plan(&self) -> Option<&Plan> {
        self.plan.as_deref()
    }

    /// Kernel runs whose threads did not meet at a barrier in time (another process held the
    /// CPUs), so that the token ran per operator instead; the result is the same.
    #[doc(hidden)]
    pub fn kernel_fallbacks(&self) -> u64 {
        self.fallbacks
    }

    /// For tests: [`Model::forward_fixed`] with the recorded step executed by the Rust twins
    /// ([`crate::verify::twin_plan`]) on this model's arena instead of BPF. Returns the logits and the
    /// head's argmax (row, Q16 logit).
    #[doc(hidden)]
    pub fn twin_forward_fixed(&mut self, token: u32) -> Result<(&[i32], (usize, i32))> {
        let plan = self.plan.clone().ok_or_else(|| {
            Error::Invalid(format!("the {} store records no plan", self.store.name()))
        })?;
        self.begin_step(token)?;
        let best = crate::verify::twin_plan::run_plan(&mut self.ops.arena, &plan, token, self.pos as u32)?;
        self.pos += 1;
        Ok((self.ops.arena.slice::<i32>(self.b.logits)?, best))
    }

    /// Checks that `token` can be fed at the current position and commits its KV pages.
    fn begin_step(&mut self, token: u32) -> Result<()> {
        let c = &self.cfg;
        if token as usize >= c.vocab_size {
            return Err(Error::TokenOutOfRange {
                id: token,
                index: self.pos,
                vocab: c.vocab_size,
            });
        }
        if self.pos >= self.max_context {
            return Err(Error::ContextOverflow {
                pos: self.pos,
                max_context: self.max_context,
            });
        }
        self.b.kv.ensure(&mut self.ops.arena, self.pos + 1);
        Ok(())
    }

    /// One decoder pass at the current position. Returns the argmax (row, Q16 logit; (0, 0)
    /// with [`Head::Skip`]).
    fn step(&mut self, token: u32, head: Head) -> Result<(usize, i32)> {
        self.begin_step(token)?;
        let best = match self.plan.clone() {
            None => self.emit(&[token], self.pos, head)?,
            Some(plan) => self.run_plan(&plan, token, head)?,
        };
        self.pos += 1;
        Ok(best)
    }

    /// Runs the recorded step for `token` at the current position, as [`Model::dispatch`] says.
    fn run_plan(&mut self, plan: &Plan, token: u32, mode: Head) -> Result<(usize, i32)> {
        let pos = self.pos as u32;
        let head = plan
            .entries
            .last()
            .expect("a recorded plan ends with the head");
        let screened = mode == Head::Argmax && self.screened;
        if self.dispatch == Dispatch::Kernel {
            // With the screened head, the kernel runs everything before the head and the
            // screen follows from user space (its activation norms are computed there).
            let n = plan.entries.len();
            let n_run = if screened || mode == Head::Skip {
                n - 1
            } else {
                n
            };
            match self
                .ops
                .run_plan(self.b.plan, n, n_run, plan.threads, token, pos)
            {
                Ok(_) if mode == Head::Skip => return Ok((0, 0)),
                Ok(_) if screened => {
                    return self.store.lm_head_argmax(
                        &mut self.ops,
                        self.b.xn,
                        0..self.cfg.vocab_size,
                    )
                }
                // threads past the head's parts ran no part of it
                Ok(best) => return Ok(first_best(0, best.into_iter().take(head.parts.len()))),
                Err(PlanFailure::TimedOut) => self.fallbacks += 1,
                Err(PlanFailure::Error(e)) => return Err(e),
            }
        }
        let body = &plan.entries[..plan.entries.len() - 1];
        for e in body {
            self.ops.run_entry(e, token, pos)?;
        }
        if mode == Head::Skip {
            return Ok((0, 0));
        }
        if screened {
            return self
                .store
                .lm_head_argmax(&mut self.ops, self.b.xn, 0..self.cfg.vocab_size);
        }
        let parts = self.ops.run_entry(head, token, pos)?;
        let fields = head.head.expect("the last entry is the head");
        Ok(first_best(0, parts.iter().map(|a| fields.read(a))))
    }

    /// The forward pass of the `tokens` at positions `pos..`, one operator after another: the
    /// one statement of the step. Decoding feeds one token; prefill feeds a block of up to
    /// `b.block`, each weight-bearing operator taking the block's vectors at once (the
    /// per-position operators run token by token), so every token's integers are those of
    /// feeding it alone. It runs live for stores that cannot be planned and for blocks, and is
    /// recorded once at open into the plan ([`crate::kernel::plan`]) for one token. `head` says what
    /// step 10 does, for the last token.
    fn emit(&mut self, tokens: &[u32], pos: usize, head: Head) -> Result<(usize, i32)> {
        let c = &self.cfg;
        let (h, hd, eps) = (c.hidden_size, c.head_dim(), self.eps_q64);
        let (nq, nkv, qd, kvd) = (
            c.num_attention_heads,
            c.num_key_value_heads,
            c.q_dim(),
            c.kv_dim(),
        );
        let (ops, store, b) = (&mut self.ops, &mut self.store, &self.b);
        let n = tokens.len();
        if n == 0 || n > b.block {
            return Err(Error::Invalid(format!(
                "a block of {n} tokens (1..={})",
                b.block
            )));
        }
        let qkv_row = (qd + 2 * kvd) * 4;
        let shape = AttnShape {
            n_q: nq,
            n_kv: nkv,
            hd,
            max_ctx: self.max_context,
        };

        // 0. x = embed_tokens[token], for each token                x [n][hidden]
        for (t, &token) in tokens.iter().enumerate() {
            store.embed(ops, token, b.x.sub(t * h * 8, h * 8)?)?;
        }
        for l in 0..c.num_hidden_layers {
            // 1. xn = RMSNorm(x; input_layernorm)                      xn [n][hidden]
            ops.rmsnorm(b.x, true, store.norm(Norm::Input(l)), b.xn, h, n, eps)?;
            // 2. q, k, v = q_proj·xn, k_proj·xn, v_proj·xn (one matrix) qkv [n][q_dim + 2 kv_dim]
            store.matvec(
                ops,
                Linear::Qkv(l),
                b.xn,
                b.qkv,
                0..linear_rows(c, Linear::Qkv(l)),
                false,
                n,
            )?;
            for t in 0..n {
                let (pos, qkv) = (pos + t, b.qkv.sub(t * qkv_row, qkv_row)?);
                let q = qkv.sub(0, qd * 4)?; // [n_q][hd]
                let k = qkv.sub(qd * 4, kvd * 4)?; // [n_kv][hd]
                let v = qkv.sub((qd + kvd) * 4, kvd * 4)?; // [n_kv][hd]
                let att = b.att.sub(t * qd * 4, qd * 4)?; // [q_dim]

                // 3. per-head q_norm / k_norm, then RoPE at pos        q [n_q][hd], k [n_kv][hd]
                ops.qk_norm_rope(
                    q,
                    k,
                    store.norm(Norm::Q(l)),
                    store.norm(Norm::K(l)),
                    b.cos, // [max_ctx][hd/2], the row at pos
                    b.sin,
                    pos,
                    nq,
                    nkv,
                    hd,
                    eps,
                )?;
                // 4. append k, v to the cache; causal GQA attention    att [q_dim]
                let kv = |a: usize| b.kv.array(l, a);
                match b.kv.format {
                    KvFormat::Q16 => {
                        let ab = AttentionBuffers {
                            q,
                            k,
                            v,
                            k_cache: kv(0).span,
                            v_cache: kv(1).span,
                            probs: b.probs,
                            acc: b.acc,
                            out: att,
                            exp2: b.exp2,
                        };
                        ops.attention(&ab, pos, shape, self.scale_q22)?;
                    }
                    KvFormat::Int8 => {
                        let ab = AttentionI8Buffers {
                            q,
                            k,
                            v,
                            k_codes: kv(0).span,
                            k_steps: kv(1).span,
                            v_codes: kv(2).span,
                            v_steps: kv(3).span,
                            codes_stride: kv(0).stride,
                            steps_stride: kv(1).stride,
                            probs: b.probs,
                            wv: b.wv,
                            qq: b.qq,
                            acc: b.acc,
                            out: att,
                            exp2: b.exp2,
                            ksh: b.ksh[l],
                        };
                        ops.attention_i8(&ab, pos, shape, self.scale_q22)?;
                    }
                }
            }
            // 5. x += o_proj · att                                     x [n][hidden]
            store.matvec(ops, Linear::O(l), b.att, b.x, 0..h, true, n)?;
            // 6. xn = RMSNorm(x; post_attention_layernorm)             xn [n][hidden]
            ops.rmsnorm(
                b.x,
                true,
                store.norm(Norm::PostAttention(l)),
                b.xn,
                h,
                n,
                eps,
            )?;
            // 7. mlp = silu(gate_proj · xn) * (up_proj · xn)           mlp [n][intermediate]
            store.gate_up_swiglu(ops, l, b.xn, b.mlp, b.exp2, 0..c.intermediate_size, n)?;
            // 8. x += down_proj · mlp                                  x [n][hidden]
            store.matvec(ops, Linear::Down(l), b.mlp, b.x, 0..h, true, n)?;
        }
        // 9. xn = RMSNorm(x; model.norm), of the last token only       xn [hidden]
        let last = b.x.sub((n - 1) * h * 8, h * 8)?;
        ops.rmsnorm(last, true, store.norm(Norm::Final), b.xn, h, 1, eps)?;
        // 10. logits = lm_head · xn, and their argmax                  logits [vocab]
        match head {
            Head::Logits => store.lm_head(ops, b.xn, Some(b.logits), 0..c.vocab_size),
            Head::Argmax if self.screened => store.lm_head_argmax(ops, b.xn, 0..c.vocab_size),
            Head::Argmax => store.lm_head(ops, b.xn, None, 0..c.vocab_size),
            Head::Skip => Ok((0, 0)),
        }
    }
}

impl Forward for Model {
    fn config(&self) -> &Config {
        Model::config(self)
    }

    fn position(&self) -> usize {
        Model::position(self)
    }

    fn max_context(&self) -> usize {
        Model::max_context(self)
    }

    fn forward(&mut self, token: u32) -> Result<&[f32]> {
        Model::forward(self, token)
    }

    fn reset(&mut self) {
        Model::reset(self)
    }

    fn rewind(&mut self, position: usize) -> Result<()> {
        Model::rewind(self, position)
    }
}
