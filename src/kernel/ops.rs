//! The operator object (`src/bpf/ops.bpf.c`): one skeleton, one arena, and running its
//! programs. The methods are split by job: the operators of the forward pass in
//! [`super::operators`] (and the SWAR ones in [`super::swar_ops`]), the plan, generation and
//! event drivers in [`super::drivers`], the thread fan-out in [`super::threads`].

use std::mem::MaybeUninit;
use std::ops::Range;
use std::os::fd::{AsFd, AsRawFd};

use libbpf_rs::skel::{OpenSkel, Skel, SkelBuilder};
use libbpf_rs::OpenObject;

use super::arena::{self, Arena, Region, MAX_ARENA_BYTES, PAGE};
use super::memory::{LayerProbe, MemoryLayer, Reservation};
use super::verifier::ProgramKind;
use super::skel::Owned;
use super::threads::run_threads;
use super::load_error;
use crate::kernel::plan::{Entry, HeadFields, Patch};
use crate::{Error, Result};

skel_module!(pub(crate) mod "ops.skel.rs");
/// The event path's configuration (`struct ev_config`).
pub(crate) use skel::types::ev_config as EventCfg;
pub use skel::types::constants_args as Constants;
pub use skel::types::formats_args as Formats;
/// The ctx of the `generate` program (`struct gen_args`).
pub(crate) use skel::types::gen_args as GenArgs;
/// The ctx of the `sample` program and the in-kernel sampler's state (`struct qb_sample_args`).
pub use skel::types::qb_sample_args as SampleArgs;
/// The ctx of the `run_plan` program (`struct run_plan_args`).
pub(crate) use skel::types::run_plan_args as RunPlanArgs;
/// The ctx of the `tokenize_text` program (`struct tokenize_args`).
pub(crate) use skel::types::tokenize_args as TokenizeArgs;
use skel::{OpsSkel, OpsSkelBuilder};

pub(super) mod array_skel {
    skel_module!(pub mod "ops_array.skel.rs");
}
use array_skel::skel::{OpenOpsArrayMaps, OpsArraySkel, OpsArraySkelBuilder};

/// The loaded object: the arena build of `src/bpf/ops.bpf.c`, or its array build (issue 35:
/// so far [`ARRAY_PROGRAMS`]: the forward pass's operators, the plan interpreter, the sampler,
/// the tokenizer and generation), which keeps its memory mapped over `mem`.
pub(super) enum OpsObject {
    Arena(Owned<OpsSkel<'static>>),
    Array {
        skel: Owned<OpsArraySkel<'static>>,
        _mem: Reservation,
    },
}

/// The programs the array build of ops.bpf.c has so far; every other is refused by name.
pub const ARRAY_PROGRAMS: &[&str] = &[
    "formats",
    "embed",
    "rmsnorm",
    "qk_norm_rope",
    "matvec",
    "gate_up_swiglu",
    "swiglu_vec",
    "lm_head_argmax",
    "quantize_x8",
    "quantize_x16",
    "w4a8_matvec",
    "w8a16_matvec",
    "w4a8_lm_head_argmax",
    "w8a16_lm_head_argmax",
    "attention",
    "screen_argmax",
    "attention_i8",
    "run_plan",
    "sample",
    "tokenize_text",
    "generate",
];

/// The loaded operator programs and their arena. Dropping it unloads the programs and frees the
/// arena (the kernel objects live exactly as long as this value).
pub struct Ops {
    pub(super) obj: OpsObject,
    /// The shared memory the operators compute on.
    pub arena: Arena,
    pub(super) runs: u64,
    pub(super) threads: usize,
    pub(super) par_min_macs: usize,
    /// The records of in-kernel generation (the `tokens` ring buffer of either build).
    tokens: super::ring::TokenRing,
    /// While recording a plan: the entries so far (operators are recorded, not run).
    pub(super) recording: Option<Vec<Entry>>,
    /// The per-token fields and head fields of the next run (set by the operator methods).
    pub(super) pending: (Vec<Patch>, Option<HeadFields>),
    /// Scratch for the batched SWAR kernels' unpacked row blocks and the most columns it serves
    /// (see [`Ops::alloc_unpack_scratch`]), and whether the kernels use it.
    pub(super) unpack: Option<(Region, usize)>,
    pub(super) unpack_on: bool,
    /// The program kinds loaded without, and why: refused by this kernel's verifier, or left
    /// out by [`SKIP_ENV`]. Running one of their programs is an error that says so.
    pub(crate) without: Vec<(ProgramKind, String)>,
}

/// `QWEN_BPF_SKIP_PROGRAMS=tokenizer,sampler,...`: program kinds ([`ProgramKind::name`]) the
/// operator object is loaded without, as if the kernel refused them (the forward pass cannot
/// be left out). For kernels whose verifier takes long over a kind not needed, and for tests.
pub const SKIP_ENV: &str = "QWEN_BPF_SKIP_PROGRAMS";

/// The kinds [`SKIP_ENV`] names.
fn skipped_by_env() -> Result<Vec<(ProgramKind, String)>> {
    let Some(v) = std::env::var_os(SKIP_ENV) else {
        return Ok(Vec::new());
    };
    skip_list(&v.to_string_lossy())
}

/// The kinds a [`SKIP_ENV`] value `v` names, each with the reason it is left out.
fn skip_list(v: &str) -> Result<Vec<(ProgramKind, String)>> {
    let mut out = Vec::new();
    for name in v.split(',').map(str::trim).filter(|n| !n.is_empty()) {
        match ProgramKind::from_name(name) {
            Some(ProgramKind::Forward) | None => {
                let known: Vec<_> = ProgramKind::ALL[1..].iter().map(|k| k.name()).collect();
                return Err(Error::Invalid(format!(
                    "{SKIP_ENV}: {name:?} is not a program kind that can be left out; known: {}",
                    known.join(", ")
                )));
            }
            Some(k) => out.push((k, format!("left out by {SKIP_ENV}={v}"))),
        }
    }
    Ok(out)
}

/// Operators with at least this many multiply-adds are split across threads (see
/// [`Ops::set_threads`]): at the Qwen3-0.6B shape, every matrix. On two separate cores this
/// took the q24 decode step from ~183 to ~130 ms and int4 from ~56 to ~50 (`bench` example,
/// `tg`), where 5 Mi (the fused gate/up and the LM head only) had been chosen on SMT siblings.
pub const PAR_MIN_MACS: usize = 1 << 20;

impl std::fmt::Debug for Ops {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ops")
            .field("arena", &self.arena)
            .field("runs", &self.runs)
            .finish()
    }
}

/// Which rows of a matrix one operator run covers.
pub type Rows = Range<usize>;

impl Ops {
    /// Loads the operators with an arena of `arena_bytes` (rounded up to pages, at most 4 GiB).
    pub fn load(arena_bytes: usize) -> Result<Ops> {
        Self::load_with(arena_bytes, false)
    }

    /// [`Ops::load`], with the event path's programs (`src/bpf/event.inc.c`) when `events`.
    pub fn load_with(arena_bytes: usize, events: bool) -> Result<Ops> {
        // the arena until every program runs on array maps too (issue 35)
        Self::load_on(arena_bytes, events, MemoryLayer::Arena)
    }

    /// [`Ops::load_with`] on memory layer `layer` ([`MemoryLayer::Auto`]: the arena where this
    /// process may create one, array maps otherwise). The array layer runs only
    /// [`ARRAY_PROGRAMS`] so far (issue 35); the others are refused by name.
    pub fn load_on(arena_bytes: usize, events: bool, layer: MemoryLayer) -> Result<Ops> {
        let (layer, _why) = LayerProbe::run()
            .choose(layer)
            .map_err(|why| Error::Bpf {
                what: format!("the {layer} memory layer"),
                detail: why,
            })?;
        Self::load_chosen(arena_bytes, events, layer)
    }

    /// [`Ops::load_on`] on `layer` as [`LayerProbe::choose`] resolved it (the arena or array
    /// maps, not probed again): for `Model::open`, which has probed the layers already.
    pub(crate) fn load_chosen(arena_bytes: usize, events: bool, layer: MemoryLayer) -> Result<Ops> {
        if layer == MemoryLayer::Array {
            return Self::load_array(arena_bytes);
        }
        let pages = arena_bytes.div_ceil(PAGE).max(1);
        if pages * PAGE > MAX_ARENA_BYTES {
            return Err(Error::Resources {
                msg: format!(
                    "a BPF arena holds at most {MAX_ARENA_BYTES} bytes; {} were asked for",
                    pages * PAGE
                ),
            });
        }
        let (skel, without) = load_without(skipped_by_env()?, |skip, refused| {
            Owned::load(|storage| open_and_load(storage, pages as u32, events, skip, refused))
        })?;
        let base = arena::mapping(&skel.maps.arena)?;
        let tokens = super::ring::TokenRing::new(skel.maps.tokens.as_fd().as_raw_fd())?;
        // SAFETY: libbpf maps the whole arena (pages * PAGE bytes) read-write for the skeleton's life.
        let arena = unsafe { Arena::new(base, pages * PAGE) };
        Ok(Self::new(OpsObject::Arena(skel), arena, tokens, without))
    }

    fn new(
        obj: OpsObject,
        arena: Arena,
        tokens: super::ring::TokenRing,
        without: Vec<(ProgramKind, String)>,
    ) -> Ops {
        Ops {
            obj,
            arena,
            runs: 0,
            threads: 1,
            par_min_macs: PAR_MIN_MACS,
            tokens,
            recording: None,
            pending: (Vec::new(), None),
            unpack: None,
            unpack_on: true,
            without,
        }
    }

    /// The array build (`ops_array.bpf.o`): one mmapable array map of `bytes` (rounded up to
    /// whole elements) in elements of [`array_elem_shift`]`(bytes)`, mapped at an address
    /// reserved before load and told to the programs, so that addresses mean the same byte on
    /// both sides as in the arena.
    fn load_array(bytes: usize) -> Result<Ops> {
        let what = "the operator programs (array memory layer)";
        let shift = match std::env::var(ELEM_SHIFT_ENV) {
            Err(_) => array_elem_shift(bytes),
            Ok(v) => match v.trim().parse::<u32>() {
                Ok(s) if (12..=29).contains(&s) => s,
                _ => {
                    return Err(Error::Invalid(format!(
                        "{ELEM_SHIFT_ENV}={v:?}: an element size's log2 from 12 (a page) to 29 (512 MiB)"
                    )))
                }
            },
        };
        let elem = 1usize << shift;
        // One element more when there are several: an allocation that fits an element but not
        // the rest of the current one starts the next, and the bytes it skips need a home.
        let elems = bytes.max(1).div_ceil(elem);
        let elems = if elems > 1 { elems + 1 } else { elems };
        if elems * elem > MAX_ARENA_BYTES {
            return Err(Error::Resources {
                msg: format!(
                    "the array memory layer holds at most {MAX_ARENA_BYTES} bytes; {} were asked for",
                    elems * elem
                ),
            });
        }
        let mut mem = Reservation::new(elems * elem)?;
        let base = mem.base();
        let (skel, mut without) = load_without(skipped_by_env()?, |skip, refused| {
            Owned::load(|storage| {
                let mut open = OpsArraySkelBuilder::default()
                    .open(storage)
                    .map_err(|e| load_error(what, e))?;
                size_array_map(&mut open.maps, base as u64, shift, elems as u32)
                    .map_err(|e| load_error("the array memory map", e))?;
                for mut p in open.open_object_mut().progs_mut() {
                    if skip.contains(&ProgramKind::of(&p.name().to_string_lossy())) {
                        p.set_autoload(false);
                    }
                }
                super::verifier::load_explained(|| open.load()).map_err(|(e, why)| {
                    refused.clone_from(&why);
                    super::load_refused(what, e, why)
                })
            })
        })?;
        mem.map(skel.maps.arena.as_fd())?;
        let tokens = super::ring::TokenRing::new(skel.maps.tokens.as_fd().as_raw_fd())?;
        without.extend(
            ProgramKind::ALL[1..]
                .iter()
                .filter(|&&k| {
                    !matches!(
                        k,
                        ProgramKind::Sampler | ProgramKind::Tokenizer | ProgramKind::Generation
                    )
                })
                .map(|&k| (k, "not on the array memory layer yet (issue 35)".to_string())),
        );
        // SAFETY: mem maps the whole array map (elems * elem bytes) read-write for as long as
        // the OpsObject that owns it.
        let arena = unsafe { Arena::new_array(base, elems * elem, elem) };
        Ok(Self::new(OpsObject::Array { skel, _mem: mem }, arena, tokens, without))
    }

    /// Which memory layer the programs run on.
    pub fn layer(&self) -> MemoryLayer {
        match self.obj {
            OpsObject::Arena(_) => MemoryLayer::Arena,
            OpsObject::Array { .. } => MemoryLayer::Array,
        }
    }

    /// The loaded object.
    pub(super) fn object(&self) -> &libbpf_rs::Object {
        match &self.obj {
            OpsObject::Arena(s) => s.object(),
            OpsObject::Array { skel, .. } => skel.object(),
        }
    }

    /// The arena build's skeleton, for `what`, which only it runs so far: an error naming the
    /// array memory layer otherwise.
    pub(super) fn skel(&self, what: &str) -> Result<&OpsSkel<'static>> {
        match &self.obj {
            OpsObject::Arena(s) => Ok(s),
            OpsObject::Array { .. } => Err(not_on_array(what)),
        }
    }

    /// [`Ops::skel`], mutable.
    pub(super) fn skel_mut(&mut self, what: &str) -> Result<&mut OpsSkel<'static>> {
        match &mut self.obj {
            OpsObject::Arena(s) => Ok(s),
            OpsObject::Array { .. } => Err(not_on_array(what)),
        }
    }

    /// The records of in-kernel generation (the ring buffer the programs write them to).
    pub(crate) fn tokens(&mut self) -> &mut super::ring::TokenRing {
        &mut self.tokens
    }

    /// Whether the program `name`'s kind was loaded: an error naming why not (the kind refused
    /// by the verifier, or left out by [`SKIP_ENV`]). The event path's and the filter's
    /// programs, left out of a model opened without event slots, are not checked here: `Model`
    /// refuses their use for that model before it gets here.
    pub(crate) fn require(&self, name: &str) -> Result<()> {
        let kind = ProgramKind::of(name);
        if let Some((_, why)) = self.without.iter().find(|w| w.0 == kind) {
            return Err(Error::Bpf {
                what: format!("running `{name}` (the {} program)", kind.name()),
                detail: format!("this model's programs were loaded without the {}: {why}", kind.name()),
            });
        }
        Ok(())
    }

    /// The program kinds this object was loaded without, and why.
    pub fn without(&self) -> &[(ProgramKind, String)] {
        &self.without
    }

    /// BPF program runs since load.
    pub fn runs(&self) -> u64 {
        self.runs
    }

    /// The arena address of region `r`, as programs take it.
    pub(crate) fn addr_of(&self, r: Region) -> u64 {
        self.arena.addr(r)
    }

    /// How many threads large row-parallel operators are split across (default 1).
    pub fn set_threads(&mut self, threads: usize) {
        self.threads = threads.clamp(1, crate::kernel::plan::THREADS_MAX);
    }

    /// The multiply-adds from which an operator is split across threads (default
    /// [`PAR_MIN_MACS`]; attention splits from a quarter of it). Tests set 0 to split everything.
    pub fn set_par_min_macs(&mut self, macs: usize) {
        self.par_min_macs = macs;
    }

    /// Splits `rows` into up to `threads` contiguous parts (multiples of 8 rows) when the operator
    /// does at least [`PAR_MIN_MACS`] multiply-adds; otherwise one part.
    pub(crate) fn parts(&self, rows: Rows, macs: usize) -> Vec<Rows> {
        let n = if macs >= self.par_min_macs {
            self.threads
        } else {
            1
        };
        let step = rows.len().div_ceil(n).div_ceil(8) * 8;
        (0..n)
            .map(|i| {
                (rows.start + i * step).min(rows.end)..(rows.start + (i + 1) * step).min(rows.end)
            })
            .filter(|r| !r.is_empty())
            .collect()
    }

    /// How many instructions the verifier processed for each loaded program, by name
    /// (the kernel refuses a program past 1,000,000 with E2BIG). The count depends on the
    /// kernel's verifier as much as on the program: `tests/limits.rs` keeps every program well
    /// under the limit so that other kernel builds load them too.
    pub fn verified_instructions(&self) -> Result<Vec<(String, u32)>> {
        self.object()
            .progs()
            // the programs this Ops did not load (the event path's, unless asked for) have no fd
            .filter(|p| p.autoload())
            .map(|p| Ok((p.name().to_string_lossy().into_owned(), verified_insns(p.as_fd())?)))
            .collect()
    }

    /// Runs program `name` of the object once with `args` as its ctx; a non-zero return value
    /// (the programs' "bad arguments") is an error.
    pub(crate) fn run<T: Send + Copy>(&mut self, name: &str, args: &mut T) -> Result<()> {
        self.run_parts(name, std::slice::from_mut(args))
    }

    /// Runs program `name` once per element of `args`, concurrently (one thread each) when there
    /// are several: the row-split form of an operator.
    pub(crate) fn run_parts<T: Send + Copy>(&mut self, name: &str, args: &mut [T]) -> Result<()> {
        self.require(name)?;
        let (patches, head) = std::mem::take(&mut self.pending);
        if let Some(rec) = &mut self.recording {
            rec.push(Entry::record(name, args, patches, head)?);
            return Ok(());
        }
        let prog = self
            .object()
            .progs()
            .find(|p| p.name() == name)
            .ok_or_else(|| match self.obj {
                OpsObject::Array { .. } => not_on_array(&format!("`{name}`")),
                OpsObject::Arena(_) => Error::Bpf {
                    what: name.into(),
                    detail: "no such program in ops.bpf.c".into(),
                },
            })?;
        let fd = prog.as_fd();
        let check = |rc: Result<i32>| match rc {
            Ok(0) => Ok(()),
            Ok(rc) => Err(Error::Bpf {
                what: name.into(),
                detail: format!("returned {rc} (bad arguments)"),
            }),
            Err(e) => Err(e),
        };
        // the parts run on different CPUs (run_threads pins them): a long part queued behind
        // another on one CPU of this non-preemptible kernel would wait for it to finish
        // (every part has finished: the first refusal is the error)
        let result = run_threads(fd, name, args).into_iter().try_for_each(check);
        self.runs += args.len() as u64;
        result
    }

    /// Values the programs clamped to their fixed-point range since load (every `sat32` and
    /// `sat_res` of `src/bpf/fixed.h` that fired): 0 means no value left its format.
    pub fn saturations(&self) -> u64 {
        // SAFETY: a u64 in the mapped .bss that the programs update atomically; read once.
        let read = |v: &u64| unsafe { std::ptr::read_volatile(v) };
        match &self.obj {
            OpsObject::Arena(s) => s.maps.bss_data.as_deref().map_or(0, |b| read(&b.saturations)),
            OpsObject::Array { skel, .. } => {
                skel.maps.bss_data.as_deref().map_or(0, |b| read(&b.saturations))
            }
        }
    }

    /// The fixed-point constants and size limits compiled into the programs (see
    /// `src/bpf/fixed.h` and `src/bpf/limits.h`).
    pub fn formats(&mut self) -> Result<Formats> {
        let mut a = Formats::default();
        self.run("formats", &mut a)?;
        Ok(a)
    }

    /// The other constants C and Rust share (the plan's format, the event path's, generation's,
    /// the SWAR and int8-KV bounds), as compiled into the programs (the `constants` program).
    pub fn constants(&mut self) -> Result<Constants> {
        let mut a = Constants::default();
        self.run("constants", &mut a)?;
        Ok(a)
    }

}

/// The ctx of one draw of `op_sample` (`src/bpf/sample.inc.c`): the parameters `p` (the Rust
/// mirror, [`crate::num::sample::Params`], copied field by field), the arena addresses of the
/// `n` Q16 logits, the counts (0: no penalties), the histogram scratch and the exp2 table, and
/// the generator's state `rng`.
pub fn sample_args(
    p: &crate::num::sample::Params,
    logits: u64,
    n: u32,
    counts: u64,
    hist: u64,
    exp2: u64,
    rng: u64,
) -> SampleArgs {
    SampleArgs {
        p: skel::types::qb_sample_params {
            temp_q16: p.temp_q16,
            top_k: p.top_k,
            top_p_q16: p.top_p_q16,
            min_p_q16: p.min_p_q16,
            rep_q16: p.rep_q16,
            presence_q16: p.presence_q16,
            frequency_q16: p.frequency_q16,
            ..Default::default()
        },
        logits,
        counts,
        hist,
        exp2,
        rng,
        n,
        ..Default::default()
    }
}

impl Ops {
    /// Runs the `sample` program (`op_sample`) once on `args`: its return value (0, or
    /// `SAMPLE_E_*`: [`crate::num::sample::E_PARAM`], [`crate::num::sample::E_LOOP`]); the token
    /// and the new generator state are in `args`.
    pub fn sample(&mut self, args: &mut SampleArgs) -> Result<i32> {
        self.require("sample")?;
        self.runs += 1;
        let prog = match &self.obj {
            OpsObject::Arena(s) => s.progs.sample.as_fd(),
            OpsObject::Array { skel, .. } => skel.progs.sample.as_fd(),
        };
        super::test_run(prog, "sample", args)
    }
}

/// The overall argmax of row ranges' argmaxes `(row, logit)`, given in row order: a later range
/// wins only with a strictly larger logit, so ties go to the first row as within a range.
/// `start` is the answer when there are none.
pub fn first_best(start: usize, parts: impl IntoIterator<Item = (usize, i64)>) -> (usize, i32) {
    let best = parts
        .into_iter()
        .fold((start, i64::MIN), |b, p| if p.1 > b.1 { p } else { b });
    (best.0, best.1 as i32)
}

/// The error for `what`, which the array memory layer does not run yet.
fn not_on_array(what: &str) -> Error {
    Error::Bpf {
        what: what.into(),
        detail: "not on the array memory layer yet (issue 35: so far it runs the forward pass's \
                 operators, the plan interpreter, the sampler, the tokenizer and generation; the arena \
                 layer runs everything)"
            .into(),
    }
}

/// Forces the array layer's element size (its log2, 12 to 29) instead of
/// [`array_elem_shift`]'s: for tests of buffers that span several elements on a small model.
pub const ELEM_SHIFT_ENV: &str = "QWEN_BPF_ARRAY_ELEM_SHIFT";

/// log2 of the array layer's element size for `bytes` of memory: the smallest power of two that
/// holds them, from a page up to 512 MiB (the largest offset the verifier lets a program add to a
/// map value: measured on Linux 6.1 and 6.18, docs/plans/array-layer.md). Memory beyond one
/// element takes several; a buffer never crosses an element's end ([`Arena::new_array`]).
pub fn array_elem_shift(bytes: usize) -> u32 {
    let want = bytes.max(PAGE).next_power_of_two().trailing_zeros();
    want.min(29)
}

/// Sizes the array build's memory map before load: `elems` elements of 2^`shift` bytes, element 0
/// mapped at `base` (the programs are told both through `.rodata`).
pub(super) fn size_array_map(
    maps: &mut OpenOpsArrayMaps<'_>,
    base: u64,
    shift: u32,
    elems: u32,
) -> libbpf_rs::Result<()> {
    let rodata = maps.rodata_data.as_deref_mut().ok_or_else(|| {
        std::io::Error::new(std::io::ErrorKind::InvalidData, "the object has no .rodata")
    })?;
    rodata.qb_mem_base = base;
    rodata.qb_mem_shift = shift;
    maps.arena.set_value_size(1 << shift)?;
    maps.arena.set_max_entries(elems)
}

/// Loads an object by `attempt(skip, refused)` (which loads it without the programs of the kinds
/// in `skip` and, when the verifier refuses a program, sets `refused` to its name and the
/// verifier's last line), starting with the kinds `without` already names. A kernel whose
/// verifier refuses a program of a kind other than the forward pass (the tokenizer, the sampler,
/// generation, the server, the filter) gets the object without that kind: one load per refused
/// kind, each refusal logged and kept in the `without` returned.
fn load_without<S>(
    mut without: Vec<(ProgramKind, String)>,
    mut attempt: impl FnMut(&[ProgramKind], &mut Option<(String, String)>) -> Result<S>,
) -> Result<(S, Vec<(ProgramKind, String)>)> {
    loop {
        let skip: Vec<ProgramKind> = without.iter().map(|w| w.0).collect();
        let mut refused = None;
        match (attempt(&skip, &mut refused), refused) {
            (Ok(s), _) => return Ok((s, without)),
            (Err(e), Some((prog, line))) => {
                let kind = ProgramKind::of(&prog);
                if kind == ProgramKind::Forward || skip.contains(&kind) {
                    return Err(e);
                }
                let why = format!(
                    "kernel {}'s verifier refused `{prog}`: {line}",
                    super::kernel_release().unwrap_or_else(|| "(unknown)".into())
                );
                log::warn!("loading the operator programs without the {}: {why}", kind.name());
                without.push((kind, why));
            }
            (Err(e), None) => return Err(e),
        }
    }
}

/// Opens and loads the object without the programs of the kinds in `skip`; when the verifier
/// refuses a program, `refused` gets its name and the verifier's last line.
fn open_and_load(
    storage: &'static mut MaybeUninit<OpenObject>,
    pages: u32,
    events: bool,
    skip: &[ProgramKind],
    refused: &mut Option<(String, String)>,
) -> Result<OpsSkel<'static>> {
    let mut open = OpsSkelBuilder::default()
        .open(storage)
        .map_err(|e| load_error("the operator programs", e))?;
    if !events {
        // the event path's and the filter's programs (their verification repeats the whole
        // plan's) load only for a model that serves kernel events
        for p in [
            &mut open.progs.ev_setup,
            &mut open.progs.ev_xdp,
            &mut open.progs.flt_setup,
            &mut open.progs.flt_xdp,
            &mut open.progs.flt_egress,
            &mut open.progs.filter_classify,
        ] {
            p.set_autoload(false);
        }
    }
    for mut p in open.open_object_mut().progs_mut() {
        if skip.contains(&ProgramKind::of(&p.name().to_string_lossy())) {
            p.set_autoload(false);
        }
    }
    open.maps
        .arena
        .set_max_entries(pages)
        .map_err(|e| load_error("the arena map", e))?;
    super::verifier::load_explained(|| open.load()).map_err(|(e, why)| {
        refused.clone_from(&why);
        super::load_refused("the operator programs", e, why)
    })
}

/// How many instructions the verifier processed for the loaded program `prog`.
pub(crate) fn verified_insns(prog: std::os::fd::BorrowedFd<'_>) -> Result<u32> {
    use libbpf_rs::libbpf_sys::{bpf_prog_get_info_by_fd, bpf_prog_info};
    let mut info = bpf_prog_info::default();
    let mut len = std::mem::size_of::<bpf_prog_info>() as u32;
    // SAFETY: the fd is a loaded program's; info is a zeroed bpf_prog_info of `len` bytes, which
    // the kernel fills up to that size.
    let rc = unsafe { bpf_prog_get_info_by_fd(prog.as_raw_fd(), &mut info, &mut len) };
    if rc != 0 {
        return Err(Error::Bpf {
            what: "bpf_prog_get_info_by_fd".into(),
            detail: std::io::Error::from_raw_os_error(-rc).to_string(),
        });
    }
    Ok(info.verified_insns)
}

pub(super) fn check_ret(what: &str, ret: i32) -> Result<()> {
    if ret != 0 {
        return Err(Error::Bpf {
            what: what.into(),
            detail: format!("rejected its arguments (ret {ret})"),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_skip_list_names_kinds_but_never_the_forward_pass() {
        let kinds: Vec<ProgramKind> = skip_list("tokenizer, sampler,,")
            .unwrap()
            .into_iter()
            .map(|w| w.0)
            .collect();
        assert_eq!(kinds, [ProgramKind::Tokenizer, ProgramKind::Sampler]);
        assert!(skip_list("").unwrap().is_empty());
        for bad in ["forward", "tokeniser", "tokenizer,plan"] {
            let e = skip_list(bad).unwrap_err().to_string();
            assert!(e.contains(SKIP_ENV) && e.contains("known: generation"), "{e}");
        }
    }
}
