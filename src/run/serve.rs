//! A model installed in the kernel: loaded once, pinned in the BPF filesystem, and serving on
//! its own after the process that installed it has exited ([`Model::install`], [`Installed`]).
//!
//! The XDP program of the event path (`src/bpf/event.inc.c`) answers every datagram itself with
//! XDP_TX: a request is accepted or refused at once, and the client polls the generated text,
//! which the workqueue generation appends to the request's slot in the arena, until a final
//! record ([`crate::run::wire`]). No process is left running: the pins under
//! `/sys/fs/bpf/qwen_bpf/NAME` hold the maps and the link, and [`Installed::remove`] detaches the
//! program and unpins them, after which the kernel frees the memory.
//!
//! Requests carry token ids made by a tokenizer in user space (the interim format, until the
//! kernel tokenizes text itself); the text comes back as the vocabulary's bytes.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::event::{ifindex, EventConfig, RateLimit, Refusal, FLAG_REPLY, SOURCES_MAX};
use crate::kernel::pins::{self, PinnedEvents, XdpMode, BPFFS};
use crate::model::REPLY_TEXT_BYTES;
use crate::{Error, Model, Result};

/// Where installed models are pinned, under the BPF filesystem: `/sys/fs/bpf/qwen_bpf`.
pub const PIN_ROOT: &str = "qwen_bpf";
/// A slot's text buffer: the most text bytes one request can generate (16 KiB).
pub const TEXT_BYTES_MAX: usize = REPLY_TEXT_BYTES;

/// What an installed model serves.
#[derive(Debug, Clone, PartialEq)]
pub struct InstallConfig {
    /// The network interface the XDP program is attached to (`lo`, `eth0`, …).
    pub interface: String,
    /// The UDP port served.
    pub port: u16,
    /// IPv4 sources whose datagrams are served (1 to 4); datagrams from others pass untouched.
    pub sources: Vec<Ipv4Addr>,
    /// The most new tokens a request may ask for.
    pub max_new: u32,
    /// Tokens that end a generation (at most 8), e.g. [`crate::Tokenizer::eos_ids`].
    pub stop_tokens: Vec<u32>,
    /// A request whose client has not polled for this long is given back: while it runs (its
    /// generation stops) or after it finished (its text is dropped when a new request needs
    /// the slot). A finished request whose final record was sent is given back at once.
    pub timeout: Duration,
    /// How the XDP program is attached.
    pub xdp_mode: XdpMode,
    /// The most text bytes a request generates (at most 16 KiB, the slot's buffer); a generation
    /// whose next token's text would not fit ends with [`crate::run::wire::Finish::Length`].
    pub text_bytes: usize,
    /// The most slots one source address holds at once; `None`: 1 when several sources are
    /// served, every slot when one is ([`EventConfig::per_source_slots`]).
    pub per_source_slots: Option<u32>,
    /// Each source's request rate; requests over it are dropped unanswered and counted
    /// ([`InstallStatus::rate_limited`]). `None`: no limit.
    pub rate: Option<RateLimit>,
}

impl InstallConfig {
    /// Requests from 127.0.0.1 to `port` on `lo` (where XDP runs in generic mode), up to 256 new
    /// tokens each, no stop tokens, a 10 s poll timeout, the default rate limit.
    pub fn loopback(port: u16) -> InstallConfig {
        InstallConfig::on_interface("lo", port, vec![Ipv4Addr::LOCALHOST])
    }

    /// Requests from `sources` to `port` on `interface`, up to 256 new tokens each, no stop
    /// tokens, a 10 s poll timeout, the attach mode the kernel picks, one slot per source when
    /// several are served, and [`RateLimit::default`] (20 requests a second per source).
    pub fn on_interface(interface: &str, port: u16, sources: Vec<Ipv4Addr>) -> InstallConfig {
        InstallConfig {
            interface: interface.to_string(),
            port,
            sources,
            max_new: 256,
            stop_tokens: Vec::new(),
            timeout: Duration::from_secs(10),
            xdp_mode: XdpMode::Auto,
            text_bytes: TEXT_BYTES_MAX,
            per_source_slots: None,
            rate: Some(RateLimit::default()),
        }
    }
}

/// The pin directory of name `name`: `/sys/fs/bpf/qwen_bpf/NAME`.
pub fn pin_dir(name: &str) -> PathBuf {
    Path::new(BPFFS).join(PIN_ROOT).join(name)
}

/// Creates the private pin directory of a new installation `name` (see
/// [`pins::create_install_dir`]); [`Error::AlreadyInstalled`] when it exists.
pub(crate) fn create_pin_dir(name: &str) -> Result<PathBuf> {
    check_name(name)?;
    let dir = pin_dir(name);
    if !pins::create_install_dir(&Path::new(BPFFS).join(PIN_ROOT), &dir)? {
        return Err(Error::AlreadyInstalled {
            name: name.into(),
            path: dir,
        });
    }
    Ok(dir)
}

pub(crate) fn check_name(name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name != "."
        && name != ".."
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c));
    if ok {
        Ok(())
    } else {
        Err(Error::Invalid(format!(
            "installation name {name:?}: 1 to 64 characters of A-Z, a-z, 0-9, '-', '_', '.'"
        )))
    }
}

impl Model {
    /// Installs the model in the kernel as `name`: attaches the event path's XDP program to
    /// `cfg.interface` for datagrams to `cfg.port` from `cfg.sources`, answering them itself,
    /// and pins the program, its link and maps under `/sys/fs/bpf/qwen_bpf/NAME` (mounting the BPF
    /// filesystem at `/sys/fs/bpf` if needed). The model is consumed: when it is dropped, the
    /// process's handles close and the installed model serves on alone until
    /// [`Installed::remove`].
    ///
    /// Needs [`ModelOptions::event_slots`](crate::ModelOptions::event_slots) > 0,
    /// [`Model::load_vocabulary`] (replies carry text) and [`Model::load_tokenizer`] (requests
    /// do). Errors: [`Error::AlreadyInstalled`] for a name in use, [`Error::Bpffs`] when the BPF filesystem is missing and cannot be mounted.
    pub fn install(mut self, name: &str, cfg: &InstallConfig) -> Result<Installed> {
        check_name(name)?;
        if !self.vocab_loaded {
            return Err(Error::Invalid(
                "an installed model replies with text: call Model::load_vocabulary first".into(),
            ));
        }
        if self.tok.is_none() {
            return Err(Error::Invalid(
                "an installed model takes text: call Model::load_tokenizer first".into(),
            ));
        }
        if cfg.sources.is_empty() || cfg.sources.len() > SOURCES_MAX {
            return Err(Error::InvalidParameter {
                name: "sources",
                value: cfg.sources.len() as f64,
                expected: "1 to 4 IPv4 sources",
            });
        }
        if cfg.text_bytes == 0 || cfg.text_bytes > TEXT_BYTES_MAX {
            return Err(Error::InvalidParameter {
                name: "text_bytes",
                value: cfg.text_bytes as f64,
                expected: "1 to 16384 bytes",
            });
        }
        if cfg.timeout.is_zero() {
            return Err(Error::InvalidParameter {
                name: "timeout",
                value: 0.0,
                expected: "a positive duration",
            });
        }
        let events = EventConfig {
            port: cfg.port,
            ifindex: ifindex(&cfg.interface)?,
            sources: cfg.sources.clone(),
            max_new: cfg.max_new,
            stop_tokens: cfg.stop_tokens.clone(),
            per_source_slots: cfg.per_source_slots,
            rate: cfg.rate,
        };
        let (mut ev, templates) =
            self.event_setup(&events, FLAG_REPLY, Some(cfg.text_bytes as u32))?;
        ev.timeout_ns = cfg.timeout.as_nanos().min(u64::MAX as u128) as u64;
        pins::ensure_bpffs()?;
        let dir = create_pin_dir(name)?;
        let pinned = self
            .ops
            .configure_events(ev, &templates, !self.events_ready)
            .and_then(|()| {
                self.events_ready = true;
                self.ops.pin(&pins::EVENT_PINS, events.ifindex, cfg.xdp_mode, &dir)
            });
        if let Err(e) = pinned {
            let _ = std::fs::remove_dir(&dir);
            return Err(e);
        }
        log::info!(
            "installed as {name:?}: UDP port {} on {} ({} slots, pins in {})",
            cfg.port,
            cfg.interface,
            self.events.len(),
            dir.display()
        );
        drop(self);
        // an installation that cannot be opened back is not left attached
        Installed::open(name).inspect_err(|_| {
            let _ = pins::remove(&dir);
        })
    }
}

/// An installed model, found by its name (reading it changes nothing; dropping it leaves the
/// model installed).
#[derive(Debug)]
pub struct Installed {
    name: String,
    dir: PathBuf,
    pins: PinnedEvents,
}

/// What an installed model reports ([`Installed::status`]), read from its pinned maps.
#[derive(Debug, Clone, PartialEq)]
pub struct InstallStatus {
    /// The installation's name.
    pub name: String,
    /// The UDP port served.
    pub port: u16,
    /// The interface's index, and its name if it still exists.
    pub ifindex: u32,
    /// The interface's name (`None` if it is gone).
    pub interface: Option<String>,
    /// The sources served.
    pub sources: Vec<Ipv4Addr>,
    /// Request slots.
    pub slots: usize,
    /// Slots generating a request.
    pub slots_busy: usize,
    /// Slots holding a finished request's text for its client (taken by a new request once
    /// its final record was sent or its client stopped polling).
    pub slots_finished: usize,
    /// Requests accepted (generations started).
    pub accepted: u64,
    /// Requests and polls refused, by reason (every reason, in code order).
    pub refused: Vec<(Refusal, u64)>,
    /// Polls answered with text or a final record.
    pub polls: u64,
    /// Requests sent again while their first copy was held: answered, not started again.
    pub repeats: u64,
    /// Generations ended (finished, or given back after the timeout).
    pub done: u64,
    /// Tokens generated in all.
    pub tokens: u64,
    /// Slots given back because their client stopped polling.
    pub reclaimed: u64,
    /// Replies the program could not build (the frame could not be resized).
    pub reply_failures: u64,
    /// Datagrams left unanswered: their reply would have been longer than their frame (a
    /// REFUSED reply to a few bytes), or the frame's UDP length, IPv4 total length and size
    /// disagree. No reply is ever larger than what asked for it.
    pub unanswered: u64,
    /// Polls dropped without a reply because their cookie was not their request's: a spoofed
    /// poll, or one for an earlier request of the same id.
    pub bad_cookie: u64,
    /// Requests dropped without a reply because their source was over its rate.
    pub rate_limited: u64,
    /// The most slots one source holds at once.
    pub per_source_slots: u32,
    /// Each source's request rate, if limited.
    pub rate: Option<RateLimit>,
    /// Kernel memory the model holds: the arena's size in bytes.
    pub kernel_memory: u64,
    /// The arena map's id (`bpftool map show id N`); it no longer exists once removed.
    pub arena_map_id: u32,
    /// The most new tokens a request may ask for.
    pub max_new: u32,
    /// The poll timeout.
    pub timeout: Duration,
}

impl InstallStatus {
    /// Refusals for `reason`.
    pub fn refused_for(&self, reason: Refusal) -> u64 {
        self.refused
            .iter()
            .find(|(r, _)| *r == reason)
            .map_or(0, |(_, n)| *n)
    }
}

impl std::fmt::Display for InstallStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let sources: Vec<String> = self.sources.iter().map(|s| s.to_string()).collect();
        writeln!(f, "name: {}", self.name)?;
        writeln!(
            f,
            "serving: UDP port {} on {} (ifindex {}) from {}",
            self.port,
            self.interface.as_deref().unwrap_or("<gone>"),
            self.ifindex,
            sources.join(", ")
        )?;
        writeln!(
            f,
            "slots: {}, generating {}, finished {}",
            self.slots, self.slots_busy, self.slots_finished
        )?;
        writeln!(f, "requests accepted: {}", self.accepted)?;
        let refused: Vec<String> = self
            .refused
            .iter()
            .map(|(r, n)| format!("{} {n}", r.name()))
            .collect();
        writeln!(f, "refused: {}", refused.join(", "))?;
        writeln!(
            f,
            "polls answered: {}, repeated requests: {}",
            self.polls, self.repeats
        )?;
        writeln!(
            f,
            "generations ended: {}, given back after the {} s timeout: {}",
            self.done,
            self.timeout.as_secs_f64(),
            self.reclaimed
        )?;
        writeln!(f, "tokens generated: {}", self.tokens)?;
        writeln!(
            f,
            "unanswered (a reply longer than its datagram, or lengths that disagree): {}",
            self.unanswered
        )?;
        writeln!(f, "polls with a wrong cookie (dropped): {}", self.bad_cookie)?;
        let rate = match self.rate {
            Some(r) => format!("{} requests/s, bursts of {}", r.per_second, r.burst),
            None => "no limit".into(),
        };
        writeln!(
            f,
            "per source: {} slots at most; rate {rate}; requests over the rate (dropped): {}",
            self.per_source_slots, self.rate_limited
        )?;
        if self.reply_failures > 0 {
            writeln!(
                f,
                "replies that could not be built: {}",
                self.reply_failures
            )?;
        }
        write!(
            f,
            "kernel memory: {} bytes ({:.1} MiB, arena map id {})",
            self.kernel_memory,
            self.kernel_memory as f64 / (1024.0 * 1024.0),
            self.arena_map_id
        )
    }
}

/// The pin directory of the model installed as `name`: [`Error::NotInstalled`] if there is none.
pub(crate) fn installed_dir(name: &str) -> Result<PathBuf> {
    check_name(name)?;
    let dir = pin_dir(name);
    if std::fs::symlink_metadata(&dir).is_err() {
        return Err(Error::NotInstalled {
            name: name.into(),
            path: dir,
        });
    }
    pins::check_private_dir(&dir)?;
    Ok(dir)
}

impl Installed {
    /// The model installed as `name`: [`Error::NotInstalled`] if there is none,
    /// [`Error::LostPin`] if one of its pins is missing.
    pub fn open(name: &str) -> Result<Installed> {
        let dir = installed_dir(name)?;
        if dir.join("flt_xdp").exists() {
            return Err(Error::Invalid(format!(
                "{name:?} is an installed packet filter, not a served model (see InstalledFilter)"
            )));
        }
        let pins = PinnedEvents::open(&dir)?;
        Ok(Installed {
            name: name.into(),
            dir,
            pins,
        })
    }

    /// The names installed, served models and packet filters (empty when the BPF filesystem is
    /// not mounted).
    pub fn list() -> Result<Vec<String>> {
        let root = Path::new(BPFFS).join(PIN_ROOT);
        let Ok(entries) = std::fs::read_dir(&root) else {
            return Ok(Vec::new());
        };
        let mut names = Vec::new();
        for e in entries {
            let e = e.map_err(|e| Error::io(&root, e))?;
            if e.path().is_dir() {
                names.push(e.file_name().to_string_lossy().into_owned());
            }
        }
        names.sort();
        Ok(names)
    }

    /// The installation's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Its pin directory.
    pub fn path(&self) -> &Path {
        &self.dir
    }

    /// For tests: the installation's cookie key (`ev_config.secret`), to recompute a cookie
    /// with a SipHash of their own.
    #[cfg(feature = "internals")]
    pub fn cookie_key(&self) -> Result<[u64; 2]> {
        Ok(self.pins.state()?.bss.ev_cfg.secret)
    }

    /// The counters and configuration, read from the pinned maps.
    pub fn status(&self) -> Result<InstallStatus> {
        let s = self.pins.state()?;
        let b = &s.bss;
        let cfg = b.ev_cfg;
        let interface = {
            let mut buf = [0 as libc::c_char; libc::IF_NAMESIZE];
            // SAFETY: buf has IF_NAMESIZE bytes, as if_indextoname needs.
            let p = unsafe { libc::if_indextoname(cfg.ifindex, buf.as_mut_ptr()) };
            // SAFETY: on success buf holds a NUL-terminated name.
            (!p.is_null()).then(|| {
                unsafe { std::ffi::CStr::from_ptr(buf.as_ptr()) }
                    .to_string_lossy()
                    .into_owned()
            })
        };
        Ok(InstallStatus {
            name: self.name.clone(),
            port: cfg.port as u16,
            ifindex: cfg.ifindex,
            interface,
            sources: cfg.sources[..(cfg.n_sources as usize).min(SOURCES_MAX)]
                .iter()
                .map(|s| Ipv4Addr::from(s.to_ne_bytes()))
                .collect(),
            slots: s.slot_states.len(),
            // EV_BUSY, or EV_CLAIMED while a request is being set up
            slots_busy: s
                .slot_states
                .iter()
                .filter(|&&st| st == 1 || st == 3)
                .count(),
            slots_finished: s.slot_states.iter().filter(|&&st| st == 2).count(),
            accepted: b.ev_accepted,
            refused: Refusal::ALL
                .iter()
                .map(|&r| (r, b.ev_refusals[r.code() as usize % b.ev_refusals.len()]))
                .collect(),
            polls: b.ev_polls,
            repeats: b.ev_repeats,
            done: b.ev_done,
            tokens: b.ev_tokens,
            reclaimed: b.ev_reclaimed,
            reply_failures: b.ev_reply_failed,
            unanswered: b.ev_unanswered,
            bad_cookie: b.ev_bad_cookie,
            rate_limited: b.ev_rate_limited,
            per_source_slots: cfg.per_source,
            rate: (cfg.rate_ns > 0).then(|| RateLimit {
                per_second: 1e9 / cfg.rate_ns as f64,
                burst: (cfg.rate_tau_ns / cfg.rate_ns) as u32 + 1,
            }),
            kernel_memory: s.arena_bytes,
            arena_map_id: s.arena_id,
            max_new: cfg.max_new,
            timeout: Duration::from_nanos(cfg.timeout_ns),
        })
    }

    /// Removes the model installed as `name`: detaches its XDP program and unpins everything;
    /// the kernel then frees its memory (the arena and every map) once the last reference goes
    /// (a generation still running finishes its round first). [`Error::NotInstalled`] if there
    /// is none. Pins missing already are skipped.
    pub fn remove(name: &str) -> Result<()> {
        let dir = installed_dir(name)?;
        pins::remove(&dir)?;
        log::info!("removed {name:?} ({})", dir.display());
        Ok(())
    }
}
