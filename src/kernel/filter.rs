//! The packet filter's programs (`src/bpf/filter.inc.c`): configuring them, classifying one
//! payload with `filter_classify`, pinning the XDP filter, and reading its state back from the
//! pins ([`PinnedFilter`]).

use std::os::fd::AsFd;
use std::path::{Path, PathBuf};

use libbpf_rs::{MapCore, MapFlags, MapHandle};

use super::ops::skel::types::{bss, flt_slot};
use super::ops::{GenArgs, Ops};
use super::pins;
use super::test_run;
use crate::{Error, Result};

/// The filter's configuration (`struct flt_config`).
pub(crate) use super::ops::skel::types::flt_config as FilterCfg;
/// A label as the kernel holds it (`struct flt_label`).
pub(crate) use super::ops::skel::types::flt_label as FilterLabel;
/// The ctx of `filter_classify` (`struct flt_run_args`).
pub(crate) use super::ops::skel::types::flt_run_args as FilterRunArgs;

pub use crate::num::limits::{
    FILTER_BYTES_MAX as BYTES_MAX, FILTER_LABELS_MAX as LABELS_MAX,
    FILTER_LABEL_TOKENS_MAX as LABEL_TOKENS_MAX,
};
/// Tokens of the template after the payload (`FLT_SUFFIX_MAX`).
pub const SUFFIX_MAX: usize = 512;
/// Label steps the kernel takes (`FLT_STEPS_MAX`): every label token after a label's first.
pub const STEPS_MAX: usize = 32;
const _: () = assert!(STEPS_MAX >= LABELS_MAX * (LABEL_TOKENS_MAX - 1));
/// Bytes of a label's name the kernel keeps for `status`, its NUL included (`FLT_NAME_MAX`).
pub const NAME_MAX: usize = 32;
/// Entries of the flow table (`FLT_FLOWS`), least recently used evicted first.
pub const FLOWS: usize = 65536;
/// Payload bytes a verdict record carries (`FLT_EXCERPT`).
pub const EXCERPT: usize = 64;
/// `flt_step`'s "call again" (`FLT_MORE`).
pub const MORE: i32 = 1;
/// Actions and policies: pass (`FLT_PASS`), drop (`FLT_DROP`), count (`FLT_COUNT`).
pub const PASS: u32 = 0;
/// See [`PASS`].
pub const DROP: u32 = 1;
/// See [`PASS`].
pub const COUNT: u32 = 2;


/// What `filter_classify` computed for one payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelVerdict {
    /// The label chosen.
    pub chosen: usize,
    /// Every label's score (Q16 log-probability).
    pub scores: Vec<i64>,
    /// The text's bytes (after the cuts).
    pub text_bytes: usize,
    /// The tokens fed after the prefix (text and suffix).
    pub prompt_tokens: usize,
}

impl Ops {
    /// Writes the filter's configuration and each slot's context template into the mapped
    /// .bss, zeroes its counters, and initialises the slots' workqueue items when `init`.
    pub(crate) fn configure_filter(
        &mut self,
        cfg: FilterCfg,
        templates: &[GenArgs],
        init: bool,
    ) -> Result<()> {
        let bss = self.bss_mut("the filter")?;
        bss.flt_cfg = cfg;
        bss.ev_template[..templates.len()].copy_from_slice(templates);
        bss.flt_packets = 0;
        bss.flt_bare = 0;
        bss.flt_pending_packets = 0;
        bss.flt_overflow = 0;
        bss.flt_fragments = 0;
        bss.flt_dropped = 0;
        bss.flt_started = 0;
        bss.flt_judged = 0;
        bss.flt_errors = 0;
        bss.flt_log_lost = 0;
        bss.flt_untracked = 0;
        bss.flt_out_of_order = 0;
        bss.flt_bad_checksum = 0;
        bss.flt_source_busy = 0;
        bss.flt_mismatch = 0;
        bss.flt_reclaimed = 0;
        bss.flt_label_flows = [0; LABELS_MAX];
        bss.flt_label_packets = [0; LABELS_MAX];
        if init {
            self.require("flt_setup")?;
            let mut none = 0u64;
            let rc = test_run(self.skel("the filter")?.progs.flt_setup.as_fd(), "flt_setup", &mut none)?;
            if rc != 0 {
                return Err(Error::KernelFeature {
                    what: "initialising the filter's BPF workqueue items".into(),
                    feature: "BPF workqueues (bpf_wq)",
                    needs: "Linux >= 6.10",
                    detail: format!(
                        "flt_setup: step {} failed: {}",
                        rc >> 16,
                        std::io::Error::from_raw_os_error(rc & 0xffff)
                    ),
                });
            }
        }
        Ok(())
    }

    /// Classifies `payload` in slot `slot` with `filter_classify` (the steps the XDP filter's
    /// worker runs), calling it until it is done.
    pub(crate) fn classify_in_kernel(&mut self, slot: u32, payload: &[u8]) -> Result<KernelVerdict> {
        if payload.len() > BYTES_MAX {
            return Err(Error::Limit {
                what: "payload bytes of one classification",
                value: payload.len(),
                limit: format!("at most {BYTES_MAX}"),
            });
        }
        let mut a = FilterRunArgs {
            slot,
            n_payload: payload.len() as u32,
            ..Default::default()
        };
        a.payload[..payload.len()].copy_from_slice(payload);
        self.require("filter_classify")?;
        let prog = self.skel("the filter")?.progs.filter_classify.as_fd();
        let mut runs = 0;
        let done = loop {
            let rc = match test_run(prog, "filter_classify", &mut a) {
                Ok(rc) => rc,
                Err(e) => break Err(e),
            };
            runs += 1;
            if rc != 0 {
                break Err(Error::Bpf {
                    what: "filter_classify".into(),
                    detail: match rc {
                        2 => "the slot is classifying a flow".into(),
                        _ => format!("rejected its arguments (ret {rc})"),
                    },
                });
            }
            if a.status != MORE {
                break Ok(());
            }
            a.resume = 1;
        };
        self.runs += runs;
        done?;
        if a.status != 0 {
            return Err(Error::Bpf {
                what: "filter_classify".into(),
                detail: format!(
                    "the classification failed with {} (tokenizer: {})",
                    a.status, a.tok_result
                ),
            });
        }
        let n = self.bss_mut("the filter")?.flt_cfg.n_labels as usize;
        Ok(KernelVerdict {
            chosen: a.chosen as usize,
            scores: a.scores[..n.min(LABELS_MAX)].to_vec(),
            text_bytes: a.n_text as usize,
            prompt_tokens: a.n_prompt as usize,
        })
    }
}

/// A filter pinned under a directory, opened from its pins.
#[derive(Debug)]
pub struct PinnedFilter {
    dir: PathBuf,
    bss: MapHandle,
    arena: MapHandle,
    slots: MapHandle,
    flows: MapHandle,
    log: MapHandle,
}

/// What a pinned filter's maps say.
#[derive(Debug, Clone)]
pub struct FilterState {
    /// The object's `.bss`: the rule as compiled (`flt_cfg`) and the counters.
    pub bss: Box<bss>,
    /// Slots classifying a flow.
    pub slots_busy: usize,
    /// Flows in the table (verdicts and pending).
    pub flows: usize,
    /// The arena's bytes: the kernel memory the model holds.
    pub arena_bytes: u64,
    /// The arena map's id.
    pub arena_id: u32,
}

impl PinnedFilter {
    /// Opens the pins under `dir`; [`Error::LostPin`] names the first that is missing.
    pub fn open(dir: &Path) -> Result<PinnedFilter> {
        // FILTER_PINS.maps: arena, bss, flt_slots, flt_flows, flt_syns, flt_log
        let [arena, bss, slots, flows, _syns, log]: [MapHandle; 6] =
            pins::open_set(&pins::FILTER_PINS, dir)?
                .try_into()
                .expect("FILTER_PINS has six maps");
        Ok(PinnedFilter {
            dir: dir.to_path_buf(),
            bss,
            arena,
            slots,
            flows,
            log,
        })
    }

    /// The verdict log's ring buffer map, for a reader to follow.
    pub fn log_map(&self) -> &MapHandle {
        &self.log
    }

    /// Reads the state: the `.bss`, the slots' states, the number of flows, the arena.
    pub fn state(&self) -> Result<FilterState> {
        let err = |what: &str, e: String| Error::Bpf {
            what: format!("reading {} of {}", what, self.dir.display()),
            detail: e,
        };
        let bss = pins::read_bss(&self.bss, &self.dir)?;
        let n = (bss.flt_cfg.n_slots as usize).min(self.slots.max_entries() as usize);
        let mut slots_busy = 0;
        for i in 0..n as u32 {
            let v = self
                .slots
                .lookup(&i.to_ne_bytes(), MapFlags::ANY)
                .map_err(|e| err("a slot", e.to_string()))?
                .ok_or_else(|| err("a slot", format!("no element {i}")))?;
            if v.len() < std::mem::size_of::<flt_slot>() {
                return Err(err("a slot", format!("{} bytes", v.len())));
            }
            // SAFETY: flt_slot is integers only (its bpf_wq is opaque integers).
            let s: flt_slot = unsafe { std::ptr::read_unaligned(v.as_ptr().cast()) };
            slots_busy += (s.state != 0) as usize;
        }
        let flows = self.flows.keys().count();
        let info = self
            .arena
            .info()
            .map_err(|e| err("the arena's info", e.to_string()))?;
        Ok(FilterState {
            bss,
            slots_busy,
            flows,
            arena_bytes: info.info.max_entries as u64 * super::arena::PAGE as u64,
            arena_id: info.info.id,
        })
    }
}
