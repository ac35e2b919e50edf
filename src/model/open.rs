//! Opening a model: check the kernel and the checkpoint, size the arena (refusing what cannot
//! fit before anything is converted), open the weight store, load the programs, allocate the
//! buffers and record the step as a plan.

use std::path::Path;

use super::buffers::{self, Buffers, Shape};
use super::{Head, KernelMemory, Model, ModelOptions};
use crate::kernel::arena::{MAX_ARENA_BYTES, PAGE};
use crate::kernel::memory::{LayerProbe, MemoryLayer};
use crate::kernel::ops::Ops;
use crate::kernel::plan::{self, Plan};
use crate::num::{fixed, kv8};
use crate::store::Norm;
use crate::types::{Backend, Dispatch, KvFormat};
use crate::{Checkpoint, Error, Result};

/// The dispatch a model runs with when `asked` for it: the kernel wherever the store can be
/// planned ([`Dispatch::Auto`]), per operator otherwise; the kernel for a store that cannot be
/// planned is an error.
pub(crate) fn resolve_dispatch(asked: Dispatch, plannable: bool, store: &str) -> Result<Dispatch> {
    match asked {
        Dispatch::Kernel if !plannable => Err(Error::Invalid(format!(
            "dispatch kernel needs every weight resident in the arena; the {store} store moves weights from user space between operators (use per-op)"
        ))),
        Dispatch::Auto | Dispatch::Kernel if plannable => Ok(Dispatch::Kernel),
        _ => Ok(Dispatch::PerOp),
    }
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

impl Model {
    /// Opens the Hugging Face directory `dir`: checks BPF can be used here, validates the
    /// checkpoint, converts or reuses the weight cache, sizes the arena (refusing sizes beyond the
    /// kernel's 4 GiB arena limit before loading anything) and loads the programs.
    pub fn open(dir: impl AsRef<Path>, opts: &ModelOptions) -> Result<Model> {
        let dir = dir.as_ref();
        // The memory layer. On array maps the forward pass runs (per operator or through the
        // plan interpreter); the event path is on the arena only, so far (issue 35).
        let (layer, why) = LayerProbe::run()
            .choose(opts.memory)
            .map_err(|why| Error::Bpf {
                what: format!("the {} memory layer", opts.memory),
                detail: why,
            })?;
        if layer == MemoryLayer::Arena {
            crate::kernel::probe::probe()?;
        } else if opts.event_slots > 0 {
            return Err(Error::Invalid(format!(
                "kernel events need the arena memory layer ({}); on array maps the forward pass runs without event slots",
                if opts.memory == MemoryLayer::Array { "the array layer was asked for" } else { &why }
            )));
        }
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
        // one event slot per run_plan lane (`EV_SLOTS_MAX` is `PLAN_THREADS_MAX`)
        if opts.event_slots > plan::THREADS_MAX {
            return Err(Error::Invalid(format!(
                "event_slots {} must be at most {}",
                opts.event_slots,
                plan::THREADS_MAX
            )));
        }
        if opts.threads == 0 || opts.threads > plan::THREADS_MAX {
            return Err(Error::InvalidParameter {
                name: "threads",
                value: opts.threads as f64,
                expected: "1 to 8 threads",
            });
        }
        let shape = Shape {
            cfg: &cfg,
            max_ctx: opts.max_context,
            kv: opts.kv,
            threads: opts.threads,
            block: opts.backend.prefill_block(),
            text: 0,
        };
        // every event context has buffers and a KV cache of its own, one thread and one token
        let event_shape = Shape {
            threads: 1,
            block: 1,
            text: buffers::REPLY_TEXT_BYTES,
            ..shape
        };
        let (scratch, kv) = Buffers::arena_bytes(&shape);
        let (scratch, kv) = (
            scratch + opts.event_slots * Buffers::arena_bytes(&event_shape).0,
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
            tokenizer: crate::kernel::tokenize::reserve_bytes(cfg.vocab_size),
        };
        // Again with the store's exact weight bytes (the estimate above covers only q24).
        check_arena(weights, kv, scratch, opts.max_context)?;
        check_memory(weights, kv, scratch, opts.max_context, mem_available())?;
        let mut ops = Ops::load_chosen(memory.total(), opts.event_slots > 0, layer)?;
        ops.set_threads(opts.threads);
        store.upload(&mut ops)?;
        // the int8 cache's key smoothing shifts, from each layer's k_norm weights
        let key_shifts = match opts.kv {
            KvFormat::Q16 => Vec::new(),
            KvFormat::Int8 => (0..cfg.num_hidden_layers)
                .map(|l| Ok(kv8::key_shifts(ops.arena.slice::<i32>(store.norm(Norm::K(l)))?)))
                .collect::<Result<Vec<_>>>()?,
        };
        let b = Buffers::alloc(&mut ops.arena, &shape, &key_shifts)?;
        let events = (0..opts.event_slots)
            .map(|_| Buffers::alloc(&mut ops.arena, &event_shape, &key_shifts))
            .collect::<Result<Vec<_>>>()?;
        // address space only: load_tokenizer commits what the tables need
        let tok_space = ops.arena.reserve(memory.tokenizer, "tokenizer tables")?;
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
            tok_space,
            tok: None,
            events: Vec::new(),
            events_ready: false,
            filter_ready: false,
        })
        .and_then(|mut m| {
            if plannable {
                m.plan = Some(std::sync::Arc::new(m.record()?));
            }
            for (i, b) in events.into_iter().enumerate() {
                let main = std::mem::replace(&mut m.b, b);
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
}
