//! The drivers of whole steps: recording operator runs into a plan, running a plan's entries
//! per operator or all at once (`run_plan`), in-kernel generation (`generate`) and the event
//! path (`ev_xdp`, `ev_setup`).

use std::os::fd::AsFd;

use libbpf_rs::MapCore;

use super::arena::Region;
use super::ops::{skel::types::run_plan_args, EventCfg, GenArgs, Ops, OpsObject};
use super::plan::{self, Args, Entry, Patch};
use super::threads::run_threads;
use super::{load_error, test_run};
use crate::{Error, Result};

/// Why [`Ops::run_plan`] did not complete.
#[derive(Debug)]
pub(crate) enum PlanFailure {
    /// A barrier waited too long: the threads were not running at the same time.
    TimedOut,
    /// Any other failure.
    Error(Error),
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
                    } else if rc == plan::E_ARGS {
                        "refused its thread, thread count or plan length".into()
                    } else if rc == crate::num::sample::E_PARAM {
                        "the in-kernel sampler refused its parameters or vocabulary size".into()
                    } else if rc == crate::num::sample::E_LOOP {
                        "an in-kernel sampler pass stopped before the end of the logits".into()
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

impl Ops {
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
    #[cfg(feature = "internals")]
    pub fn record(&mut self, f: impl FnOnce(&mut Ops) -> Result<()>) -> Result<Vec<Entry>> {
        self.start_recording();
        let done = f(self);
        let entries = self.finish_recording();
        done.map(|()| entries)
    }

    /// Marks fields of the next run's ctx as per-token (see [`Patch`]).
    pub(super) fn patch_next(&mut self, patches: Vec<Patch>) {
        self.pending.0 = patches;
    }

    /// Runs plan entry `e` for `token` at `pos`: each part with its per-token fields, one
    /// `test_run` each (concurrently when split). Returns the parts' ctx after the run.
    pub fn run_entry(&mut self, e: &Entry, token: u32, pos: u32) -> Result<Vec<Args>> {
        let mut parts = e.patched(token, pos)?;
        self.run_parts(e.name(), &mut parts)?;
        Ok(parts)
    }

    /// Zeroes the plan barrier's counters (`plan_arrivals`, `plan_abort` of
    /// `src/bpf/plan.inc.c`) in the mapped `.bss`, before a `run_plan` or `generate` invocation.
    fn reset_barrier(&mut self) {
        let counters = match &mut self.obj {
            OpsObject::Arena(skel) => skel
                .maps
                .bss_data
                .as_deref_mut()
                .map(|b| (&mut b.plan_arrivals, &mut b.plan_abort)),
            OpsObject::Array { skel, .. } => skel
                .maps
                .bss_data
                .as_deref_mut()
                .map(|b| (&mut b.plan_arrivals, &mut b.plan_abort)),
        };
        if let Some((arrivals, abort)) = counters {
            // SAFETY: a u64 and a u32 of the mapped .bss; no program runs now (runs of this Ops
            // are sequential through &mut self).
            unsafe {
                std::ptr::write_volatile(arrivals, 0);
                std::ptr::write_volatile(abort, 0);
            }
        }
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
        let plan = self.arena.addr(slots);
        self.reset_barrier();
        let prog = match &self.obj {
            OpsObject::Arena(skel) => skel.progs.run_plan.as_fd(),
            OpsObject::Array { skel, .. } => skel.progs.run_plan.as_fd(),
        };
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
    /// `src/bpf/generate.inc.c`); the records go to [`Ops::tokens`]. Returns like
    /// [`Ops::run_plan`].
    pub(crate) fn run_generate(
        &mut self,
        args: &mut [GenArgs],
    ) -> std::result::Result<(), PlanFailure> {
        self.require("generate").map_err(PlanFailure::Error)?;
        self.reset_barrier();
        // thread 0's decisions of the last generation are not this one's
        let stops = match &mut self.obj {
            OpsObject::Arena(skel) => skel.maps.bss_data.as_deref_mut().map(|b| &mut b.gen_stop),
            OpsObject::Array { skel, .. } => {
                skel.maps.bss_data.as_deref_mut().map(|b| &mut b.gen_stop)
            }
        };
        if let Some(stops) = stops {
            // SAFETY: as in reset_barrier.
            unsafe { std::ptr::write_volatile(stops, [0; 8]) };
        }
        let prog = match &self.obj {
            OpsObject::Arena(skel) => skel.progs.generate.as_fd(),
            OpsObject::Array { skel, .. } => skel.progs.generate.as_fd(),
        };
        let rcs = run_threads(prog, "generate", args);
        self.runs += args.len() as u64;
        plan_outcome(rcs, "generate")?;
        self.tokens().consume().map_err(PlanFailure::Error)
    }

    /// Configures the event path (`src/bpf/event.inc.c`) with `cfg` and each slot's generation
    /// `templates`, initialises the slots' workqueue items when `init`, and attaches the XDP
    /// program to `cfg.ifindex`: requests are served until the returned link is dropped.
    pub(crate) fn start_events(
        &mut self,
        cfg: EventCfg,
        templates: &[GenArgs],
        init: bool,
    ) -> Result<libbpf_rs::Link> {
        self.configure_events(cfg, templates, init)?;
        self.skel("the event path")?
            .progs
            .ev_xdp
            .attach_xdp(cfg.ifindex as i32)
            .map_err(|e| load_error("the event path's XDP program", e))
    }

    /// The object's mapped `.bss`, for `what` to write into.
    pub(crate) fn bss_mut(&mut self, what: &str) -> Result<&mut super::ops::skel::types::bss> {
        self.skel_mut(what)?
            .maps
            .bss_data
            .as_deref_mut()
            .ok_or_else(|| Error::Bpf {
                what: what.into(),
                detail: "the operator object has no .bss".into(),
            })
    }

    /// Writes the event path's configuration and slot templates into the mapped .bss, zeroes
    /// its counters, and initialises the slots' workqueue items when `init`.
    pub(crate) fn configure_events(
        &mut self,
        cfg: EventCfg,
        templates: &[GenArgs],
        init: bool,
    ) -> Result<()> {
        let bss = self.bss_mut("the event path")?;
        bss.ev_cfg = cfg;
        bss.ev_template[..templates.len()].copy_from_slice(templates);
        bss.ev_accepted = 0;
        bss.ev_refused_busy = 0;
        bss.ev_refused_invalid = 0;
        bss.ev_done = 0;
        bss.ev_refusals = Default::default();
        bss.ev_polls = 0;
        bss.ev_repeats = 0;
        bss.ev_tokens = 0;
        bss.ev_reclaimed = 0;
        bss.ev_reply_failed = 0;
        bss.ev_unanswered = 0;
        bss.ev_bad_cookie = 0;
        bss.ev_rate_limited = 0;
        // the rate limiter starts afresh: no source is owed anything from an earlier setup
        let skel = self.skel("the event path")?;
        let sources: Vec<Vec<u8>> = skel.maps.ev_rate.keys().collect();
        for k in sources {
            let _ = skel.maps.ev_rate.delete(&k); // gone already: nothing to forget
        }
        if init {
            self.require("ev_setup")?;
            let mut none = 0u64;
            let prog = self.skel("the event path")?.progs.ev_setup.as_fd();
            match test_run(prog, "ev_setup", &mut none)? {
                0 => {}
                rc => {
                    return Err(Error::KernelFeature {
                        what: "initialising the event path's BPF workqueue items".into(),
                        feature: "BPF workqueues (bpf_wq)",
                        needs: "Linux >= 6.10",
                        detail: format!(
                            "ev_setup: {} failed: {}",
                            if rc >> 16 == 3 { "bpf_wq_set_callback" } else { "bpf_wq_init" },
                            std::io::Error::from_raw_os_error(rc as i32 & 0xffff)
                        ),
                    })
                }
            }
        }
        Ok(())
    }

    /// The event path's counters: accepted, refused because every slot was busy, refused as
    /// invalid, done (read from the mapped .bss: no system call).
    pub(crate) fn event_counters(&self) -> [u64; 4] {
        match self.skel("the event counters").ok().and_then(|s| s.maps.bss_data.as_deref()) {
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
}
