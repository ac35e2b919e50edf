//! The operator object (`src/bpf/ops.bpf.c`): one skeleton, one arena, one method per operator.
//! Each method fills the operator's ctx with arena addresses and runs it once with `test_run`.

use std::mem::{ManuallyDrop, MaybeUninit};
use std::ops::Range;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};

use libbpf_rs::skel::{OpenSkel, Skel, SkelBuilder};
use libbpf_rs::OpenObject;

use super::arena::{self, Arena, Region, MAX_ARENA_BYTES, PAGE};
use super::{load_error, test_run};
use crate::kernel::plan::{self, Args, Entry, HeadFields, Patch, Var};
use crate::{Error, Result};

skel_module!(pub(crate) mod "ops.skel.rs");
/// The event path's configuration (`struct ev_config`).
pub(crate) use skel::types::ev_config as EventCfg;
pub use skel::types::formats_args as Formats;
/// The ctx of the `generate` program (`struct gen_args`).
pub(crate) use skel::types::gen_args as GenArgs;
/// The ctx of the `run_plan` program (`struct run_plan_args`).
pub(crate) use skel::types::run_plan_args as RunPlanArgs;
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
    threads: usize,
    par_min_macs: usize,
    /// The records of in-kernel generation.
    pub tokens: super::ring::TokenRing,
    /// While recording a plan: the entries so far (operators are recorded, not run).
    recording: Option<Vec<Entry>>,
    /// The per-token fields and head fields of the next run (set by the operator methods).
    pub(super) pending: (Vec<Patch>, Option<HeadFields>),
    /// Scratch for the batched SWAR kernels' unpacked row blocks and the most columns it serves
    /// (see [`Ops::alloc_unpack_scratch`]), and whether the kernels use it.
    pub(super) unpack: Option<(Region, usize)>,
    pub(super) unpack_on: bool,
}

/// Operators with at least this many multiply-adds are split across threads (see
/// [`Ops::set_threads`]): at the Qwen3-0.6B shape, every matrix. On two separate cores this
/// took the q24 decode step from ~183 to ~130 ms and int4 from ~56 to ~50 (`bench` example,
/// `tg`), where 5 Mi (the fused gate/up and the LM head only) had been chosen on SMT siblings.
pub const PAR_MIN_MACS: usize = 1 << 20;

// SAFETY: the generated skeleton is Send; `storage` is owned exclusively by this value (only the
// skeleton borrows it) and the arena mapping is process-wide memory.
unsafe impl Send for Ops {}

impl std::fmt::Debug for Ops {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ops")
            .field("arena", &self.arena)
            .field("runs", &self.runs)
            .finish()
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

/// Why [`Ops::run_plan`] did not complete.
#[derive(Debug)]
pub(crate) enum PlanFailure {
    /// A barrier waited too long: the threads were not running at the same time.
    TimedOut,
    /// Any other failure.
    Error(Error),
}

/// Runs `prog` once per element of `args`, concurrently (one thread each) when there are several;
/// multi-threaded runs of every model in the process take turns ([`PLAN_THREADS_LOCK`]).
fn run_threads<T: Send>(prog: BorrowedFd<'_>, name: &str, args: &mut [T]) -> Vec<Result<i32>> {
    match args {
        [] => vec![],
        [one] => vec![test_run(prog, name, one)],
        [first, rest @ ..] => {
            let _one_at_a_time = PLAN_THREADS_LOCK.lock();
            // Each worker on a CPU other than this thread's, so that none is queued behind a
            // thread that spins in the kernel without preemption, and this thread enters the
            // kernel only once they are about to.
            let cpus = other_cpus();
            let ready = std::sync::atomic::AtomicUsize::new(0);
            std::thread::scope(|s| {
                let others: Vec<_> = rest
                    .iter_mut()
                    .enumerate()
                    .map(|(i, a)| {
                        let (cpus, ready) = (&cpus, &ready);
                        s.spawn(move || {
                            if !cpus.is_empty() {
                                pin_to(cpus[i % cpus.len()]);
                            }
                            ready.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                            test_run(prog, name, a)
                        })
                    })
                    .collect();
                let t = std::time::Instant::now();
                while ready.load(std::sync::atomic::Ordering::SeqCst) < others.len()
                    && t.elapsed() < std::time::Duration::from_millis(100)
                {
                    std::thread::yield_now();
                }
                let mut rcs = vec![test_run(prog, name, first)];
                rcs.extend(others.into_iter().map(|h| {
                    h.join().unwrap_or_else(|_| {
                        Err(Error::Bpf {
                            what: name.into(),
                            detail: "worker thread panicked".into(),
                        })
                    })
                }));
                rcs
            })
        }
    }
}

/// The CPUs this thread may run on, but the one it runs on now.
fn other_cpus() -> Vec<usize> {
    // SAFETY: sched_getcpu takes nothing; sched_getaffinity fills a zeroed cpu_set_t of the
    // size given.
    unsafe {
        let here = libc::sched_getcpu();
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            return Vec::new();
        }
        (0..libc::CPU_SETSIZE as usize)
            .filter(|&c| libc::CPU_ISSET(c, &set) && c as i32 != here)
            .collect()
    }
}

/// Pins this thread to `cpu` (best effort: a failure leaves it where the scheduler puts it).
fn pin_to(cpu: usize) {
    // SAFETY: a zeroed cpu_set_t with one bit set, applied to this thread.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
}

/// The outcome of a plan program's runs: a barrier timeout anywhere is [`PlanFailure::TimedOut`].
fn plan_outcome(rcs: Vec<Result<i32>>, what: &str) -> std::result::Result<(), PlanFailure> {
    let mut timed_out = false;
    for rc in rcs {
        match rc.map_err(PlanFailure::Error)? {
            0 => {}
            plan::E_BARRIER => timed_out = true,
            rc => {
                return Err(PlanFailure::Error(Error::Bpf {
                    what: what.into(),
                    detail: if rc > 0 {
                        format!(
                            "the operator of plan entry {} refused its arguments",
                            rc - 1
                        )
                    } else {
                        format!("refused its arguments (ret {rc})")
                    },
                }))
            }
        }
    }
    if timed_out {
        return Err(PlanFailure::TimedOut);
    }
    Ok(())
}

/// Multi-threaded plan runs of every model in the process take turns: two models' threads
/// spinning at their barriers on all CPUs at once would wait for each other until they time out.
static PLAN_THREADS_LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Which rows of a matrix one operator run covers.
pub type Rows = Range<usize>;

impl Ops {
    /// Loads the operators with an arena of `arena_bytes` (rounded up to pages, at most 4 GiB).
    pub fn load(arena_bytes: usize) -> Result<Ops> {
        Self::load_with(arena_bytes, false)
    }

    /// [`Ops::load`], with the event path's programs (`src/bpf/event.bpf.h`) when `events`.
    pub fn load_with(arena_bytes: usize, events: bool) -> Result<Ops> {
        let pages = arena_bytes.div_ceil(PAGE).max(1);
        if pages * PAGE > MAX_ARENA_BYTES {
            return Err(Error::Resources {
                msg: format!(
                    "a BPF arena holds at most {MAX_ARENA_BYTES} bytes; {} were asked for",
                    pages * PAGE
                ),
            });
        }
        let storage = Box::into_raw(Box::new(MaybeUninit::<OpenObject>::uninit()));
        // SAFETY: storage stays allocated until Drop, after the skeleton that borrows it.
        let storage_ref: &'static mut MaybeUninit<OpenObject> = unsafe { &mut *storage };
        let loaded = open_and_load(storage_ref, pages as u32, events);
        let skel = match loaded {
            Ok(s) => s,
            Err(e) => {
                // SAFETY: nothing borrows storage any more.
                drop(unsafe { Box::from_raw(storage) });
                return Err(e);
            }
        };
        let base = arena::mapping(&skel.maps.arena)?;
        let tokens = super::ring::TokenRing::new(skel.maps.tokens.as_fd().as_raw_fd())?;
        // SAFETY: libbpf maps the whole arena (pages * PAGE bytes) read-write for the skeleton's life.
        let arena = unsafe { Arena::new(base, pages * PAGE) };
        Ok(Ops {
            skel: ManuallyDrop::new(skel),
            storage,
            arena,
            runs: 0,
            threads: 1,
            par_min_macs: PAR_MIN_MACS,
            tokens,
            recording: None,
            pending: (Vec::new(), None),
            unpack: None,
            unpack_on: true,
        })
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
        use libbpf_rs::libbpf_sys::{bpf_prog_get_info_by_fd, bpf_prog_info};
        self.skel
            .object()
            .progs()
            // the programs this Ops did not load (the event path's, unless asked for) have no fd
            .filter(|p| p.autoload())
            .map(|p| {
                let name = p.name().to_string_lossy().into_owned();
                let mut info = bpf_prog_info::default();
                let mut len = std::mem::size_of::<bpf_prog_info>() as u32;
                // SAFETY: the fd is the loaded program's; info is a zeroed bpf_prog_info of
                // `len` bytes, which the kernel fills up to that size.
                let rc =
                    unsafe { bpf_prog_get_info_by_fd(p.as_fd().as_raw_fd(), &mut info, &mut len) };
                if rc != 0 {
                    return Err(Error::Bpf {
                        what: name,
                        detail: format!(
                            "bpf_prog_get_info_by_fd: {}",
                            std::io::Error::from_raw_os_error(-rc)
                        ),
                    });
                }
                Ok((name, info.verified_insns))
            })
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
        let (patches, head) = std::mem::take(&mut self.pending);
        if let Some(rec) = &mut self.recording {
            rec.push(Entry::record(name, args, patches, head)?);
            return Ok(());
        }
        let prog = self
            .skel
            .object()
            .progs()
            .find(|p| p.name() == name)
            .ok_or_else(|| Error::Bpf {
                what: name.into(),
                detail: "no such program in ops.bpf.c".into(),
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

    /// Starts recording a plan: until [`Ops::finish_recording`], operator runs become plan
    /// entries instead of running (their outputs are not computed).
    pub(crate) fn start_recording(&mut self) {
        self.recording = Some(Vec::new());
    }

    /// Whether operator runs are being recorded.
    pub(crate) fn is_recording(&self) -> bool {
        self.recording.is_some()
    }

    /// The entries recorded since [`Ops::start_recording`]; runs operators again from now on.
    pub(crate) fn finish_recording(&mut self) -> Vec<Entry> {
        self.pending = (Vec::new(), None);
        self.recording.take().unwrap_or_default()
    }

    /// For tests: the plan entries that `f`'s operator calls record (none of them runs).
    #[doc(hidden)]
    pub fn record(&mut self, f: impl FnOnce(&mut Ops) -> Result<()>) -> Result<Vec<Entry>> {
        self.start_recording();
        let done = f(self);
        let entries = self.finish_recording();
        done.map(|()| entries)
    }

    /// Marks fields of the next run's ctx as per-token (see [`Patch`]).
    fn patch_next(&mut self, patches: Vec<Patch>) {
        self.pending.0 = patches;
    }

    /// Runs plan entry `e` for `token` at `pos`: each part with its per-token fields, one
    /// `test_run` each (concurrently when split). Returns the parts' ctx after the run.
    #[doc(hidden)]
    pub fn run_entry(&mut self, e: &Entry, token: u32, pos: u32) -> Result<Vec<Args>> {
        let mut parts = e.patched(token, pos)?;
        self.run_parts(e.name(), &mut parts)?;
        Ok(parts)
    }

    /// Runs the first `n_run` entries of the plan whose slots are at `slots` (`n_entries`
    /// entries on `threads` threads) for `token` at `pos`: one `run_plan` invocation per thread, concurrently. Returns each
    /// thread's LM-head argmax (row, logit), in row order; [`Error::Bpf`] when an operator
    /// refused its ctx, or (`timed_out`) when a barrier timed out because the threads did not
    /// run at the same time.
    pub(crate) fn run_plan(
        &mut self,
        slots: Region,
        n_entries: usize,
        n_run: usize,
        threads: usize,
        token: u32,
        pos: u32,
    ) -> std::result::Result<Vec<(usize, i64)>, PlanFailure> {
        if let Some(bss) = self.skel.maps.bss_data.as_deref_mut() {
            // SAFETY: a u64 of the mapped .bss; no program runs now (runs of this Ops are
            // sequential through &mut self).
            unsafe {
                std::ptr::write_volatile(&mut bss.plan_arrivals, 0);
                std::ptr::write_volatile(&mut bss.plan_abort, 0);
            }
        }
        let prog = self.skel.progs.run_plan.as_fd();
        let plan = self.arena.addr(slots);
        let mut args: Vec<run_plan_args> = (0..threads)
            .map(|t| run_plan_args {
                plan,
                n_entries: n_entries as u32,
                thread: t as u32,
                lane: t as u32,
                n_threads: threads as u32,
                token,
                pos,
                n_run: n_run as u32,
                ..Default::default()
            })
            .collect();
        let rcs = run_threads(prog, "run_plan", &mut args);
        self.runs += threads as u64;
        plan_outcome(rcs, "run_plan")?;
        Ok(args.iter().map(|a| (a.best as usize, a.best_val)).collect())
    }

    /// Runs the `generate` program once per element of `args` (one per thread, concurrently):
    /// each feeds and generates until done or out of its time budget (see
    /// `src/bpf/generate.bpf.h`); the records go to [`Ops::tokens`]. Returns like
    /// [`Ops::run_plan`].
    pub(crate) fn run_generate(
        &mut self,
        args: &mut [gen_args],
    ) -> std::result::Result<(), PlanFailure> {
        if let Some(bss) = self.skel.maps.bss_data.as_deref_mut() {
            // SAFETY: as in run_plan.
            unsafe {
                std::ptr::write_volatile(&mut bss.plan_arrivals, 0);
                std::ptr::write_volatile(&mut bss.plan_abort, 0);
                std::ptr::write_volatile(&mut bss.gen_stop, [0; 8]);
            }
        }
        let prog = self.skel.progs.generate.as_fd();
        let rcs = run_threads(prog, "generate", args);
        self.runs += args.len() as u64;
        plan_outcome(rcs, "generate")?;
        self.tokens.consume().map_err(PlanFailure::Error)
    }

    /// Configures the event path (`src/bpf/event.bpf.h`) with `cfg` and each slot's generation
    /// `templates`, initialises the slots' workqueue items when `init`, and attaches the XDP
    /// program to `cfg.ifindex`: requests are served until the returned link is dropped.
    pub(crate) fn start_events(
        &mut self,
        cfg: EventCfg,
        templates: &[GenArgs],
        init: bool,
    ) -> Result<libbpf_rs::Link> {
        let bss = self
            .skel
            .maps
            .bss_data
            .as_deref_mut()
            .ok_or_else(|| Error::Bpf {
                what: "the event path".into(),
                detail: "the operator object has no .bss".into(),
            })?;
        bss.ev_cfg = cfg;
        bss.ev_template[..templates.len()].copy_from_slice(templates);
        bss.ev_accepted = 0;
        bss.ev_refused_busy = 0;
        bss.ev_refused_invalid = 0;
        bss.ev_done = 0;
        if init {
            let mut none = 0u64;
            match test_run(self.skel.progs.ev_setup.as_fd(), "ev_setup", &mut none)? {
                0 => {}
                rc => {
                    return Err(Error::KernelFeature {
                        what: "initialising the event path's BPF workqueue items".into(),
                        feature: "BPF workqueues (bpf_wq)",
                        needs: "Linux >= 6.10",
                        detail: format!("ev_setup returned {rc}"),
                    })
                }
            }
        }
        self.skel
            .progs
            .ev_xdp
            .attach_xdp(cfg.ifindex as i32)
            .map_err(|e| load_error("the event path's XDP program", e))
    }

    /// The event path's counters: accepted, refused because every slot was busy, refused as
    /// invalid, done (read from the mapped .bss: no system call).
    pub(crate) fn event_counters(&self) -> [u64; 4] {
        match self.skel.maps.bss_data.as_deref() {
            // SAFETY: u64s the programs update atomically; each read once.
            Some(b) => unsafe {
                [
                    std::ptr::read_volatile(&b.ev_accepted),
                    std::ptr::read_volatile(&b.ev_refused_busy),
                    std::ptr::read_volatile(&b.ev_refused_invalid),
                    std::ptr::read_volatile(&b.ev_done),
                ]
            },
            None => [0; 4],
        }
    }

    /// Values the programs clamped to their fixed-point range since load (every `sat32` and
    /// `sat_res` of `src/bpf/fixed.h` that fired): 0 means no value left its format.
    pub fn saturations(&self) -> u64 {
        match self.skel.maps.bss_data.as_deref() {
            // SAFETY: a u64 in the mapped .bss that the programs update atomically; read once.
            Some(bss) => unsafe { std::ptr::read_volatile(&bss.saturations) },
            None => 0,
        }
    }

    /// The fixed-point constants and size limits compiled into the programs (see
    /// `src/bpf/fixed.h` and `src/bpf/limits.h`).
    pub fn formats(&mut self) -> Result<Formats> {
        let mut a = Formats::default();
        self.run("formats", &mut a)?;
        Ok(a)
    }

    /// `x = table[token]` (Q24 → Q16), `dim` wide.
    pub fn embed(&mut self, table: Region, token: u32, dim: usize, x: Region) -> Result<()> {
        let mut a = embed_args {
            table: self.addr_of(table),
            x: self.addr_of(x),
            token,
            dim: dim as u32,
        };
        self.patch_next(vec![Patch::new(
            std::mem::offset_of!(embed_args, token),
            4,
            Var::Token,
            1,
        )]);
        self.run("embed", &mut a)
    }

    /// RMSNorm of `nvec` consecutive `n`-wide vectors at `x` into `y` (Q16). `x` is the i64 Q32
    /// residual stream when `wide`, else i32 Q16 (and then `y` may equal `x`).
    #[allow(clippy::too_many_arguments)]
    pub fn rmsnorm(
        &mut self,
        x: Region,
        wide: bool,
        w: Region,
        y: Region,
        n: usize,
        nvec: usize,
        eps_q64: u64,
    ) -> Result<()> {
        let mut a = rmsnorm_args {
            x: self.addr_of(x),
            w: self.addr_of(w),
            y: self.addr_of(y),
            eps_q64,
            n: n as u32,
            nvec: nvec as u32,
            wide: wide as u32,
            ret: 0,
        };
        self.run("rmsnorm", &mut a)?;
        check_ret("rmsnorm", a.ret)
    }

    /// Per-head q_norm/k_norm and RoPE at `pos`, in place. `cos`/`sin` are the whole RoPE
    /// tables (`[max_ctx][hd/2]`).
    #[allow(clippy::too_many_arguments)]
    pub fn qk_norm_rope(
        &mut self,
        q: Region,
        k: Region,
        q_norm: Region,
        k_norm: Region,
        cos: Region,
        sin: Region,
        pos: usize,
        n_q: usize,
        n_k: usize,
        hd: usize,
        eps_q64: u64,
    ) -> Result<()> {
        let row = hd / 2 * 4;
        let (cos, sin) = (cos.sub(pos * row, row)?, sin.sub(pos * row, row)?);
        let mut a = qk_norm_rope_args {
            q: self.addr_of(q),
            k: self.addr_of(k),
            q_norm: self.addr_of(q_norm),
            k_norm: self.addr_of(k_norm),
            cos: self.addr_of(cos),
            sin: self.addr_of(sin),
            eps_q64,
            n_q: n_q as u32,
            n_k: n_k as u32,
            hd: hd as u32,
            ret: 0,
        };
        self.patch_next(vec![
            Patch::new(
                std::mem::offset_of!(qk_norm_rope_args, cos),
                8,
                Var::Pos,
                row,
            ),
            Patch::new(
                std::mem::offset_of!(qk_norm_rope_args, sin),
                8,
                Var::Pos,
                row,
            ),
        ]);
        self.run("qk_norm_rope", &mut a)?;
        check_ret("qk_norm_rope", a.ret)
    }

    /// `y[r] = W[r]·x` (y i32 Q16) or, when `accumulate`, `y[r] += W[r]·x` (y the i64 Q32
    /// residual stream), for r in `rows`. `w` holds exactly those rows (Q24, `k` columns): a
    /// resident matrix's sub-region or a staging window.
    pub fn matvec(
        &mut self,
        w: Region,
        x: Region,
        y: Region,
        k: usize,
        rows: Rows,
        accumulate: bool,
    ) -> Result<()> {
        self.matvec_batch(w, x, y, k, rows, accumulate, Batch::ONE)
    }

    /// [`Ops::matvec`] for each of `batch.n` vectors: x i32 Q16 `[n][k]`, vector b of y at
    /// `b * batch.y_stride` bytes. Each row block is read from memory once for the whole batch.
    #[allow(clippy::too_many_arguments)]
    pub fn matvec_batch(
        &mut self,
        w: Region,
        x: Region,
        y: Region,
        k: usize,
        rows: Rows,
        accumulate: bool,
        batch: Batch,
    ) -> Result<()> {
        let y_elem = if accumulate { 8 } else { 4 };
        batch.check("matvec", x, k * 4, y, rows.end * y_elem)?;
        let (w0, x, y) = (self.addr_of(w), self.addr_of(x), self.addr_of(y));
        let mut parts: Vec<matvec_args> = self
            .parts(rows.clone(), rows.len() * k * batch.n)
            .into_iter()
            .map(|p| matvec_args {
                w: w0 + ((p.start - rows.start) * k * 4) as u64,
                x,
                y,
                k: k as u32,
                row0: p.start as u32,
                nrows: p.len() as u32,
                accumulate: accumulate as u32,
                nb: batch.n as u32,
                ystride: batch.y_stride as u64,
                ..Default::default()
            })
            .collect();
        self.run_parts("matvec", &mut parts)
    }

    /// `y[r] = silu(gate[r]·x) * (up[r]·x)` for r in `rows`; `gate` and `up` hold those rows.
    #[allow(clippy::too_many_arguments)]
    pub fn gate_up_swiglu(
        &mut self,
        gate: Region,
        up: Region,
        x: Region,
        y: Region,
        exp2: Region,
        k: usize,
        rows: Rows,
    ) -> Result<()> {
        self.gate_up_swiglu_batch(gate, up, x, y, exp2, k, rows, Batch::ONE)
    }

    /// [`Ops::gate_up_swiglu`] for each of `batch.n` vectors (x i32 Q16 `[n][k]`, vector b of y
    /// at `b * batch.y_stride` bytes).
    #[allow(clippy::too_many_arguments)]
    pub fn gate_up_swiglu_batch(
        &mut self,
        gate: Region,
        up: Region,
        x: Region,
        y: Region,
        exp2: Region,
        k: usize,
        rows: Rows,
        batch: Batch,
    ) -> Result<()> {
        batch.check("gate_up_swiglu", x, k * 4, y, rows.end * 4)?;
        let (g0, u0, x, y, exp2) = (
            self.addr_of(gate),
            self.addr_of(up),
            self.addr_of(x),
            self.addr_of(y),
            self.addr_of(exp2),
        );
        let mut parts: Vec<gate_up_args> = self
            .parts(rows.clone(), 2 * rows.len() * k * batch.n)
            .into_iter()
            .map(|p| {
                let skip = ((p.start - rows.start) * k * 4) as u64;
                gate_up_args {
                    gate: g0 + skip,
                    up: u0 + skip,
                    x,
                    y,
                    exp2,
                    k: k as u32,
                    row0: p.start as u32,
                    nrows: p.len() as u32,
                    nb: batch.n as u32,
                    ystride: batch.y_stride as u64,
                }
            })
            .collect();
        self.run_parts("gate_up_swiglu", &mut parts)
    }

    /// `y[i] = silu(gate[i]) * up[i]` for `n` Q16 values (y may alias either input).
    pub fn swiglu(
        &mut self,
        gate: Region,
        up: Region,
        y: Region,
        exp2: Region,
        n: usize,
    ) -> Result<()> {
        let mut a = swiglu_args {
            gate: self.addr_of(gate),
            up: self.addr_of(up),
            y: self.addr_of(y),
            exp2: self.addr_of(exp2),
            n: n as u32,
            pad: 0,
        };
        self.run("swiglu_vec", &mut a)
    }

    /// Logits of `rows` (into `y`, indexed by row, when given) and their argmax: (row, Q16
    /// logit), the first row on ties. `w` holds those rows.
    pub fn lm_head_argmax(
        &mut self,
        w: Region,
        x: Region,
        y: Option<Region>,
        k: usize,
        rows: Rows,
    ) -> Result<(usize, i32)> {
        let (w0, x, y) = (
            self.addr_of(w),
            self.addr_of(x),
            y.map(|r| self.addr_of(r)).unwrap_or(0),
        );
        let mut parts: Vec<lm_head_args> = self
            .parts(rows.clone(), rows.len() * k)
            .into_iter()
            .map(|p| lm_head_args {
                w: w0 + ((p.start - rows.start) * k * 4) as u64,
                x,
                y,
                k: k as u32,
                row0: p.start as u32,
                nrows: p.len() as u32,
                ..Default::default()
            })
            .collect();
        self.pending.1 = Some(HeadFields::at(
            std::mem::offset_of!(lm_head_args, best),
            std::mem::offset_of!(lm_head_args, best_val),
        ));
        self.run_parts("lm_head_argmax", &mut parts)?;
        Ok(first_best(
            rows.start,
            parts.iter().map(|a| (a.best as usize, a.best_val)),
        ))
    }

    /// Causal GQA attention at `pos` (see [`crate::num::fixed::attention`]).
    pub fn attention(
        &mut self,
        b: &AttentionBuffers,
        pos: usize,
        s: crate::num::fixed::AttnShape,
        scale_q22: i32,
    ) -> Result<()> {
        // split by kv heads as attention_i8 is (a plan is recorded at position 0 for every one)
        let macs = 2 * (pos + 1) * s.n_q * s.hd;
        let n = if self.is_recording() || macs >= self.par_min_macs / 4 {
            self.threads.min(s.n_kv)
        } else {
            1
        };
        let a = attention_args {
            q: self.addr_of(b.q),
            k: self.addr_of(b.k),
            v: self.addr_of(b.v),
            k_cache: self.addr_of(b.k_cache),
            v_cache: self.addr_of(b.v_cache),
            probs: self.addr_of(b.probs),
            acc: self.addr_of(b.acc),
            out: self.addr_of(b.out),
            exp2: self.addr_of(b.exp2),
            pos: pos as u32,
            max_ctx: s.max_ctx as u32,
            n_q: s.n_q as u32,
            n_kv: s.n_kv as u32,
            hd: s.hd as u32,
            scale_q22,
            kv0: 0,
            kv1: s.n_kv as u32,
        };
        let mut parts: Vec<attention_args> = (0..n)
            .map(|i| attention_args {
                kv0: (i * s.n_kv / n) as u32,
                kv1: ((i + 1) * s.n_kv / n) as u32,
                ..a
            })
            .collect();
        self.patch_next(vec![Patch::new(
            std::mem::offset_of!(attention_args, pos),
            4,
            Var::Pos,
            1,
        )]);
        self.run_parts("attention", &mut parts)
    }
}

/// The arena regions one int8-KV attention run reads and writes (see `src/bpf/kv8.bpf.h`).
#[derive(Debug, Clone, Copy)]
pub struct AttentionI8Buffers {
    /// Queries `[n_q][hd]` (Q22).
    pub q: Region,
    /// This position's keys `[n_kv][hd]` (Q16).
    pub k: Region,
    /// This position's values `[n_kv][hd]` (Q16).
    pub v: Region,
    /// The layer's key codes `[n_kv][max_ctx][hd]` (i8), the kv heads `codes_stride` bytes apart.
    pub k_codes: Region,
    /// The layer's key steps `[n_kv][max_ctx]` (u32), the kv heads `steps_stride` bytes apart.
    pub k_steps: Region,
    /// The layer's value codes, laid out as the key codes.
    pub v_codes: Region,
    /// The layer's value steps, laid out as the key steps.
    pub v_steps: Region,
    /// Bytes from one kv head's codes to the next (at least `max_ctx * hd`).
    pub codes_stride: usize,
    /// Bytes from one kv head's steps to the next (at least `max_ctx * 4`).
    pub steps_stride: usize,
    /// Scratch `[n_q][max_ctx]` u32.
    pub probs: Region,
    /// Scratch `[n_pairs][max_ctx]` u64.
    pub wv: Region,
    /// Scratch `[n_pairs][hd]` u64.
    pub qq: Region,
    /// Scratch `[n_pairs][hd]` u64.
    pub acc: Region,
    /// Output `[n_q][hd]`.
    pub out: Region,
    /// The exp2 table.
    pub exp2: Region,
    /// The layer's key smoothing shifts `[hd]` (u8).
    pub ksh: Region,
}

/// A block of vectors through one batched operator (a prefill block): `n` vectors, x's
/// consecutive, y's `y_stride` bytes apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Batch {
    /// Vectors, 1..=[`crate::num::limits::BATCH_MAX`].
    pub n: usize,
    /// Bytes from one output vector to the next (unused when `n` is 1).
    pub y_stride: usize,
}

impl Batch {
    /// One vector: the decode step.
    pub const ONE: Batch = Batch { n: 1, y_stride: 0 };

    /// Checks the batch size and that `x` holds `n` vectors of `x_bytes` and `y` reaches
    /// `y_end` bytes into its last vector.
    pub(crate) fn check(
        &self,
        what: &str,
        x: Region,
        x_bytes: usize,
        y: Region,
        y_end: usize,
    ) -> Result<()> {
        let max = crate::num::limits::BATCH_MAX;
        if self.n == 0 || self.n > max {
            return Err(Error::Invalid(format!(
                "{what}: a batch of {} vectors (1..={max})",
                self.n
            )));
        }
        let y_need = (self.n - 1) * self.y_stride + y_end;
        if x.len < self.n * x_bytes || y.len < y_need {
            return Err(Error::Invalid(format!(
                "{what}: {} vectors need x of {} bytes and y of {y_need}, got {} and {}",
                self.n,
                self.n * x_bytes,
                x.len,
                y.len
            )));
        }
        Ok(())
    }
}

/// Query-head pairs of the int8-KV attention: `n_kv * ceil(group / 2)`.
pub fn kv8_pairs(n_q: usize, n_kv: usize) -> usize {
    n_kv * (n_q / n_kv).div_ceil(2)
}

impl Ops {
    /// Causal GQA attention at `pos` over the int8 KV cache (see [`crate::num::kv8::attention`]): the
    /// kv heads are split across threads once the step is large enough to gain from it.
    pub fn attention_i8(
        &mut self,
        b: &AttentionI8Buffers,
        pos: usize,
        s: crate::num::fixed::AttnShape,
        scale_q22: i32,
    ) -> Result<()> {
        // A plan is recorded at position 0 and runs at every position: split it as for long
        // contexts (a split costs a barrier, which the neighbouring entries need anyway).
        let macs = 2 * (pos + 1) * s.n_q * s.hd;
        let n = if self.is_recording() || macs >= self.par_min_macs / 4 {
            self.threads.min(s.n_kv)
        } else {
            1
        };
        // every kv head's part inside its region, the strides in the kernel's u32
        let n_kv = s.n_kv.max(1);
        let fits = |r: Region, stride: usize, row: usize| {
            stride >= s.max_ctx * row
                && stride <= u32::MAX as usize
                && r.len >= (n_kv - 1) * stride + s.max_ctx * row
        };
        if !(fits(b.k_codes, b.codes_stride, s.hd)
            && fits(b.v_codes, b.codes_stride, s.hd)
            && fits(b.k_steps, b.steps_stride, 4)
            && fits(b.v_steps, b.steps_stride, 4))
        {
            return Err(Error::Invalid(format!(
                "attention_i8: code and step arrays of {} kv heads, {} positions and head_dim {} \
                 do not fit regions of {}/{}/{}/{} bytes with head strides {} and {}",
                s.n_kv,
                s.max_ctx,
                s.hd,
                b.k_codes.len,
                b.k_steps.len,
                b.v_codes.len,
                b.v_steps.len,
                b.codes_stride,
                b.steps_stride
            )));
        }
        let a = |r: Region| self.addr_of(r);
        let mut parts: Vec<attention_i8_args> = (0..n)
            .map(|i| attention_i8_args {
                q: a(b.q),
                k: a(b.k),
                v: a(b.v),
                k_codes: a(b.k_codes),
                k_steps: a(b.k_steps),
                v_codes: a(b.v_codes),
                v_steps: a(b.v_steps),
                probs: a(b.probs),
                wv: a(b.wv),
                qq: a(b.qq),
                acc: a(b.acc),
                out: a(b.out),
                exp2: a(b.exp2),
                ksh: a(b.ksh),
                pos: pos as u32,
                max_ctx: s.max_ctx as u32,
                n_q: s.n_q as u32,
                n_kv: s.n_kv as u32,
                hd: s.hd as u32,
                kv0: (i * s.n_kv / n) as u32,
                kv1: ((i + 1) * s.n_kv / n) as u32,
                scale_q22,
                codes_stride: b.codes_stride as u32,
                steps_stride: b.steps_stride as u32,
            })
            .collect();
        self.patch_next(vec![Patch::new(
            std::mem::offset_of!(attention_i8_args, pos),
            4,
            Var::Pos,
            1,
        )]);
        self.run_parts("attention_i8", &mut parts)
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

fn open_and_load(
    storage: &'static mut MaybeUninit<OpenObject>,
    pages: u32,
    events: bool,
) -> Result<OpsSkel<'static>> {
    let mut open = OpsSkelBuilder::default()
        .open(storage)
        .map_err(|e| load_error("the operator programs", e))?;
    if !events {
        // the event path's programs (their verification repeats the whole plan's) load only
        // for a model that serves kernel events
        for p in [&mut open.progs.ev_setup, &mut open.progs.ev_xdp] {
            p.set_autoload(false);
        }
    }
    open.maps
        .arena
        .set_max_entries(pages)
        .map_err(|e| load_error("the arena map", e))?;
    open.load()
        .map_err(|e| load_error("the operator programs", e))
}

fn check_ret(what: &str, ret: i32) -> Result<()> {
    if ret != 0 {
        return Err(Error::Bpf {
            what: what.into(),
            detail: format!("rejected its arguments (ret {ret})"),
        });
    }
    Ok(())
}
