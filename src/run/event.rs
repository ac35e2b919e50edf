//! A kernel event starts a generation ([`crate::Model::serve_events`]): a UDP datagram to a
//! port, seen by an XDP program, hands its prompt to a BPF workqueue item whose callback runs the
//! generation in the kernel; user space only reads the results from the ring buffer.
//!
//! See `src/bpf/event.inc.c` for the kernel side. Each request gets one of the model's
//! [`crate::ModelOptions::event_slots`] contexts (its own KV cache, scratch and plan), so that
//! requests are served at once and their results kept apart; a request finding every slot busy,
//! or failing a check, is refused with a record and counted, never dropped silently.

use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use crate::run::generate::FinishReason;
use crate::kernel::ring::{GenToken, Record};
use crate::{Error, Model, Result};

/// Refusal reason: every slot was busy (`EV_R_BUSY`).
pub const R_BUSY: u32 = 1;
/// Refusal reason: a malformed datagram (`EV_R_MALFORMED`).
pub const R_MALFORMED: u32 = 2;
/// Refusal reason: a token id at or past the vocabulary (`EV_R_TOKEN`).
pub const R_TOKEN: u32 = 3;
/// Refusal reason: too many prompt tokens or new tokens (`EV_R_LIMIT`).
pub const R_LIMIT: u32 = 4;

/// Refusal reason: a poll for a request that is not there, or from another sender (`EV_R_UNKNOWN`).
pub const R_UNKNOWN: u32 = 5;
/// Refusal reason: a poll's offset past the text made so far (`EV_R_OFFSET`).
pub const R_OFFSET: u32 = 6;

/// Refusal reason: a text request whose text is not UTF-8 (`EV_R_UTF8`).
pub const R_UTF8: u32 = 7;
/// Refusal reason: the request's source address holds its share of the slots (`EV_R_SOURCE`).
pub const R_SOURCE: u32 = 8;

/// Request slots a model can have (`EV_SLOTS_MAX`): one per `run_plan` lane.
pub const SLOTS_MAX: usize = crate::kernel::plan::THREADS_MAX;
/// Prompt tokens one datagram may carry (`EV_PROMPT_MAX`).
pub const PROMPT_MAX: usize = 1024;
/// The first word of a request datagram (`EV_MAGIC`, "QBPF").
pub const MAGIC: u32 = 0x4650_4251;
/// Sources a server may accept (`EV_SOURCES_MAX`).
pub const SOURCES_MAX: usize = 4;
/// `EV_F_RING`: the event path writes ring-buffer records for a reader.
pub(crate) const FLAG_RING: u32 = 1;
/// `EV_F_REPLY`: the event path answers datagrams itself and keeps each slot's text for polls.
pub(crate) const FLAG_REPLY: u32 = 2;

/// What a server serves.
#[derive(Debug, Clone, PartialEq)]
pub struct EventConfig {
    /// The UDP destination port.
    pub port: u16,
    /// The interface the XDP program is attached to (its index).
    pub ifindex: u32,
    /// IPv4 sources whose datagrams are served (at most `SOURCES_MAX`); others pass by.
    pub sources: Vec<Ipv4Addr>,
    /// The most new tokens a request may ask for.
    pub max_new: u32,
    /// Tokens that end a generation (at most 8).
    pub stop_tokens: Vec<u32>,
    /// The most slots one source address holds at once (1 to the model's slots); `None`: 1
    /// when several sources are served, every slot when one is. A request past it is refused
    /// ([`Refusal::SourceBusy`]), so that one source cannot keep the others out.
    pub per_source_slots: Option<u32>,
    /// Each source's request rate (polls are not counted); requests over it are dropped
    /// unanswered and counted. `None`: no limit.
    pub rate: Option<RateLimit>,
}

/// A request rate per source address: a token bucket of `burst` requests refilled at
/// `per_second` (kept in the kernel as GCRA, one word per source in an LRU map).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RateLimit {
    /// Requests a second, on average: 0.001 to 1,000,000.
    pub per_second: f64,
    /// Requests a source may send at once: 1 to 1,000,000.
    pub burst: u32,
}

impl Default for RateLimit {
    /// 20 requests a second, in bursts of up to 40: a generation takes far longer than 50 ms,
    /// so a client that waits for its answers never meets it.
    fn default() -> RateLimit {
        RateLimit {
            per_second: 20.0,
            burst: 40,
        }
    }
}

impl RateLimit {
    /// The kernel's form: one request per `rate_ns`, a bucket of `tau_ns` more. Refuses a rate
    /// or burst outside their ranges.
    pub(crate) fn to_kernel(self) -> Result<(u64, u64)> {
        if !(0.001..=1e6).contains(&self.per_second) {
            return Err(Error::InvalidParameter {
                name: "rate",
                value: self.per_second,
                expected: "0.001 to 1000000 requests a second",
            });
        }
        if !(1..=1_000_000).contains(&self.burst) {
            return Err(Error::InvalidParameter {
                name: "burst",
                value: self.burst as f64,
                expected: "1 to 1000000 requests",
            });
        }
        let rate_ns = (1e9 / self.per_second).round() as u64;
        Ok((rate_ns, rate_ns * u64::from(self.burst - 1)))
    }
}

impl EventConfig {
    /// Requests from 127.0.0.1 to `port` on the loopback interface, up to 256 new tokens each,
    /// with no stop tokens: each generation runs to its `max_new` or the end of the context
    /// unless [`EventConfig::stop_tokens`] is set (e.g. to [`crate::Tokenizer::eos_ids`]). No
    /// rate limit.
    pub fn loopback(port: u16) -> Result<EventConfig> {
        Ok(EventConfig {
            port,
            ifindex: ifindex("lo")?,
            sources: vec![Ipv4Addr::LOCALHOST],
            max_new: 256,
            stop_tokens: Vec::new(),
            per_source_slots: None,
            rate: None,
        })
    }

    /// Requests from `sources` to `port` on the network interface called `interface` (e.g.
    /// `eth0`), up to 256 new tokens each, with no stop tokens and no rate limit. An interface
    /// that does not exist is [`Error::Invalid`].
    pub fn on_interface(interface: &str, port: u16, sources: Vec<Ipv4Addr>) -> Result<EventConfig> {
        Ok(EventConfig {
            port,
            ifindex: ifindex(interface)?,
            sources,
            max_new: 256,
            stop_tokens: Vec::new(),
            per_source_slots: None,
            rate: None,
        })
    }
}

/// The index of network interface `name`.
pub fn ifindex(name: &str) -> Result<u32> {
    let c = std::ffi::CString::new(name)
        .map_err(|_| Error::Invalid(format!("interface name {name:?}")))?;
    // SAFETY: a NUL-terminated string.
    match unsafe { libc::if_nametoindex(c.as_ptr()) } {
        0 => Err(Error::Invalid(format!("no network interface {name:?}"))),
        i => Ok(i),
    }
}

/// Addresses of one interface served (`EV_DESTS_MAX`): the server answers datagrams to these
/// only.
pub const DESTS_MAX: usize = 8;

/// The IPv4 addresses of the interface `ifindex` (at most [`DESTS_MAX`]), in this network
/// namespace, as `getifaddrs(3)` reports them. An error when it has none or more than
/// [`DESTS_MAX`]: the server answers only datagrams sent to the interface's own addresses.
pub fn ipv4_addresses(ifindex: u32) -> Result<Vec<Ipv4Addr>> {
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills `head` with a list freed below by freeifaddrs.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        return Err(Error::io("getifaddrs(3)", std::io::Error::last_os_error()));
    }
    let mut out = Vec::new();
    let mut cur = head;
    while !cur.is_null() {
        // SAFETY: a node of the list getifaddrs returned, not freed yet.
        let ifa = unsafe { &*cur };
        cur = ifa.ifa_next;
        if ifa.ifa_addr.is_null() || ifa.ifa_name.is_null() {
            continue;
        }
        // SAFETY: ifa_addr points to a sockaddr whose family says its type; the name is a C string.
        unsafe {
            if (*ifa.ifa_addr).sa_family as i32 != libc::AF_INET
                || libc::if_nametoindex(ifa.ifa_name) != ifindex
            {
                continue;
            }
            let sin = &*(ifa.ifa_addr as *const libc::sockaddr_in);
            let a = Ipv4Addr::from(sin.sin_addr.s_addr.to_ne_bytes());
            if !out.contains(&a) {
                out.push(a);
            }
        }
    }
    // SAFETY: the list getifaddrs returned, freed once.
    unsafe { libc::freeifaddrs(head) };
    if out.is_empty() || out.len() > DESTS_MAX {
        return Err(Error::Invalid(format!(
            "interface {ifindex} has {} IPv4 addresses: the server answers datagrams sent to \
             the interface's own addresses, 1 to {DESTS_MAX} of them",
            out.len()
        )));
    }
    Ok(out)
}

/// A new key for the server cookies of one installation (`ev_config.secret`), from the kernel's
/// cryptographic generator (getrandom(2)); `bpf_get_prandom_u32`, which the BPF side could call
/// itself, is not meant to be unguessable.
pub(crate) fn cookie_secret() -> Result<[u64; 2]> {
    let mut key = [0u8; 16];
    // SAFETY: a writable buffer of that length; no flags (blocks only before the pool is ready).
    let n = unsafe { libc::getrandom(key.as_mut_ptr().cast(), key.len(), 0) };
    if n != key.len() as isize {
        return Err(Error::io("getrandom(2)", std::io::Error::last_os_error()));
    }
    let (a, b) = key.split_at(8);
    Ok([
        u64::from_le_bytes(a.try_into().unwrap()),
        u64::from_le_bytes(b.try_into().unwrap()),
    ])
}

/// The payload of a request datagram (the layout is in docs/in-kernel.md): the magic
/// `0x46504251` ("QBPF"), `request`, `max_new`, the prompt's length and its token ids, each a
/// little-endian u32.
pub fn request_datagram(request: u32, max_new: u32, prompt: &[u32]) -> Vec<u8> {
    [MAGIC, request, max_new, prompt.len() as u32]
        .iter()
        .chain(prompt)
        .flat_map(|w| w.to_le_bytes())
        .collect()
}

/// Why a request was refused (`EV_R_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Refusal {
    /// Every slot was busy.
    Busy,
    /// The datagram was not a well-formed request.
    Malformed,
    /// A prompt token was at or past the vocabulary.
    TokenOutOfRange,
    /// Too many prompt tokens or text bytes, too many new tokens asked for, or a sampling
    /// parameter past its limit.
    Limit,
    /// A poll for a request that this address and port did not make, or that is gone (an
    /// installed model's replies: `run::serve`).
    UnknownRequest,
    /// A poll at an offset past the text generated so far.
    BadOffset,
    /// A text request whose text is not UTF-8.
    BadUtf8,
    /// The request's source address holds its share of the slots
    /// ([`EventConfig::per_source_slots`]).
    SourceBusy,
}

impl Refusal {
    /// Every reason, in the order of their codes.
    pub const ALL: [Refusal; 8] = [
        Refusal::Busy,
        Refusal::Malformed,
        Refusal::TokenOutOfRange,
        Refusal::Limit,
        Refusal::UnknownRequest,
        Refusal::BadOffset,
        Refusal::BadUtf8,
        Refusal::SourceBusy,
    ];

    /// The reason's code on the wire and in the kernel (`EV_R_*`): 1 to 8.
    pub fn code(self) -> u32 {
        match self {
            Refusal::Busy => R_BUSY,
            Refusal::Malformed => R_MALFORMED,
            Refusal::TokenOutOfRange => R_TOKEN,
            Refusal::Limit => R_LIMIT,
            Refusal::UnknownRequest => R_UNKNOWN,
            Refusal::BadOffset => R_OFFSET,
            Refusal::BadUtf8 => R_UTF8,
            Refusal::SourceBusy => R_SOURCE,
        }
    }

    /// The reason with code `code`, if any.
    pub fn from_code(code: u32) -> Option<Refusal> {
        Refusal::ALL.into_iter().find(|r| r.code() == code)
    }

    /// A short name: `busy`, `malformed`, `bad-token`, `limit`, `unknown-request`, `bad-offset`,
    /// `bad-utf8`, `source-busy`.
    pub fn name(self) -> &'static str {
        match self {
            Refusal::Busy => "busy",
            Refusal::Malformed => "malformed",
            Refusal::TokenOutOfRange => "bad-token",
            Refusal::Limit => "limit",
            Refusal::UnknownRequest => "unknown-request",
            Refusal::BadOffset => "bad-offset",
            Refusal::BadUtf8 => "bad-utf8",
            Refusal::SourceBusy => "source-busy",
        }
    }
}

/// What the ring buffer reported.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Event {
    /// Request `request` generated `id` (with its text bytes when a vocabulary is loaded).
    Token {
        /// The request id from the datagram.
        request: u32,
        /// The token.
        id: u32,
        /// Its text bytes, possibly part of a UTF-8 character.
        bytes: Vec<u8>,
    },
    /// Request `request` ended.
    Done {
        /// The request id.
        request: u32,
        /// Why: a stop token, max tokens or a full context; [`FinishReason::Error`] when the
        /// kernel failed it (`error` says how).
        finish: FinishReason,
        /// The kernel's error code when `finish` is [`FinishReason::Error`].
        error: i32,
    },
    /// Request `request` was refused.
    Refused {
        /// The request id (0 when the datagram was too short to carry one).
        request: u32,
        /// Why.
        reason: Refusal,
    },
}

impl Event {
    fn from_record(r: GenToken) -> Event {
        match r.kind {
            Record::Token => Event::Token {
                request: r.request,
                id: r.id,
                bytes: r.bytes,
            },
            Record::Done => {
                let (finish, error) = match r.id as i32 {
                    2 => (FinishReason::Stop(r.pos), 0),
                    3 => (FinishReason::MaxTokens, 0),
                    4 => (FinishReason::ContextFull, 0),
                    e => (FinishReason::Error, e),
                };
                Event::Done {
                    request: r.request,
                    finish,
                    error,
                }
            }
            Record::Refused => Event::Refused {
                request: r.request,
                reason: Refusal::from_code(r.id).unwrap_or(Refusal::Malformed),
            },
        }
    }
}

/// The event path's counters: every datagram to the port lands in exactly one of the first
/// three; `done` counts accepted requests that have ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct EventCounters {
    /// Requests accepted (a slot was free).
    pub accepted: u64,
    /// Valid requests refused because every slot was busy.
    pub refused_busy: u64,
    /// Datagrams refused as invalid (malformed, bad token, over a limit).
    pub refused_invalid: u64,
    /// Accepted requests that ended.
    pub done: u64,
}

/// A model serving requests from kernel events; dropping it detaches the XDP program and waits
/// (at most a minute) for the generations still running to end.
pub struct EventServer<'m> {
    model: &'m mut Model,
    link: Option<libbpf_rs::Link>,
}

impl std::fmt::Debug for EventServer<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventServer")
            .field("counters", &self.counters())
            .finish()
    }
}

impl<'m> EventServer<'m> {
    pub(crate) fn new(model: &'m mut Model, link: libbpf_rs::Link) -> Self {
        EventServer {
            model,
            link: Some(link),
        }
    }

    /// The next record, waiting up to `timeout` for one (an epoll wait on the ring buffer: no
    /// bpf(2) call).
    pub fn next_event(&mut self, timeout: Duration) -> Result<Option<Event>> {
        let end = Instant::now() + timeout;
        loop {
            if let Some(r) = self.model.next_generated() {
                return Ok(Some(Event::from_record(r)));
            }
            let left = end.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(None);
            }
            self.model
                .poll_records(left.as_millis().clamp(1, i32::MAX as u128) as i32)?;
        }
    }

    /// The counters so far (read from the mapped .bss: no system call).
    pub fn counters(&self) -> EventCounters {
        let [accepted, refused_busy, refused_invalid, done] = self.model.event_counters();
        EventCounters {
            accepted,
            refused_busy,
            refused_invalid,
            done,
        }
    }
}

impl Drop for EventServer<'_> {
    fn drop(&mut self) {
        drop(self.link.take());
        let end = Instant::now() + Duration::from_secs(60);
        while Instant::now() < end {
            let c = self.counters();
            if c.done >= c.accepted {
                break;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

impl Model {
    /// Serves generations started by kernel events (see `run::event`) until the returned
    /// server is dropped: attaches the XDP program to `cfg.ifindex` for UDP datagrams to
    /// `cfg.port` from `cfg.sources`. Needs [`ModelOptions::event_slots`](crate::ModelOptions::event_slots) > 0; every slot's KV
    /// cache is committed in full first. Each request starts a fresh context at position 0.
    pub fn serve_events(
        &mut self,
        cfg: &EventConfig,
    ) -> Result<EventServer<'_>> {
        let (ev, templates) = self.event_setup(cfg, FLAG_RING, None)?;
        self.ops.tokens().clear();
        let link = self.ops.start_events(ev, &templates, !self.events_ready)?;
        self.events_ready = true;
        Ok(EventServer::new(self, link))
    }

    /// Checks `cfg` and builds the event path's configuration (with `flags`, `EV_F_*`) and each
    /// slot's generation template, committing every slot's KV cache. With `text`, each slot
    /// keeps its text in its reply buffer, up to that many bytes (see `run::serve`), and writes
    /// no ring-buffer records.
    pub(crate) fn event_setup(
        &mut self,
        cfg: &EventConfig,
        flags: u32,
        text: Option<u32>,
    ) -> Result<(crate::kernel::ops::EventCfg, Vec<crate::kernel::ops::GenArgs>)> {
        use {PROMPT_MAX, SOURCES_MAX};
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
        let stops = crate::run::in_kernel::kernel_stops(&cfg.stop_tokens)?;
        if cfg.max_new == 0 {
            return Err(Error::InvalidParameter {
                name: "max_new",
                value: 0.0,
                expected: "at least 1",
            });
        }
        let slots = self.events.len() as u32;
        let per_source = match cfg.per_source_slots {
            Some(n) if n == 0 || n > slots => {
                return Err(Error::InvalidParameter {
                    name: "per_source_slots",
                    value: n as f64,
                    expected: "1 to the model's event slots",
                })
            }
            Some(n) => n,
            None if cfg.sources.len() > 1 => 1,
            None => slots,
        };
        let (rate_ns, rate_tau_ns) = match cfg.rate {
            Some(r) => r.to_kernel()?,
            None => (0, 0),
        };
        let templates = self.slot_templates(stops, cfg.stop_tokens.len() as u32, text)?;
        let mut sources = [0u32; SOURCES_MAX];
        for (s, a) in sources.iter_mut().zip(&cfg.sources) {
            *s = u32::from_ne_bytes(a.octets());
        }
        // text requests: the tokenizer's tables, when Model::load_tokenizer put them there
        let tok_text = match self.tok {
            Some(r) => self.ops.point_tokenizer(&r)?,
            None => 0,
        };
        // the interface's own addresses: datagrams to any other pass to the stack
        let own = ipv4_addresses(cfg.ifindex)?;
        let mut dests = [0u32; DESTS_MAX];
        for (d, a) in dests.iter_mut().zip(&own) {
            *d = u32::from_ne_bytes(a.octets());
        }
        let ev = crate::kernel::ops::EventCfg {
            port: cfg.port as u32,
            ifindex: cfg.ifindex,
            n_sources: cfg.sources.len() as u32,
            sources,
            n_dests: own.len() as u32,
            dests,
            vocab: self.cfg.vocab_size as u32,
            max_new: cfg.max_new,
            max_prompt: PROMPT_MAX.min(self.max_context) as u32,
            n_slots: slots,
            per_source,
            rate_ns,
            rate_tau_ns,
            flags,
            tok_text,
            secret: cookie_secret()?,
            ..Default::default()
        };
        Ok((ev, templates))
    }

    /// Each event slot's generation template: its context's plan, prompt, KV, logits and
    /// sampler buffers, `n_stops` of `stops`, greedy; with `text`, the slot keeps its text in
    /// its reply buffer (up to that many bytes) and writes no ring-buffer records. Commits
    /// every slot's KV cache in full.
    pub(crate) fn slot_templates(
        &mut self,
        stops: [u32; crate::run::in_kernel::STOPS_MAX],
        n_stops: u32,
        text: Option<u32>,
    ) -> Result<Vec<crate::kernel::ops::GenArgs>> {
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
            n_stops,
            stops,
            text: text.map_or(0, |_| self.ops.arena.addr(b.text)),
            text_cap: text.map_or(0, |t| t.min(b.text.len() as u32)),
            quiet: text.is_some() as u32,
            // greedy until a request sets its parameters and seed (event.inc.c); the
            // context's own logits, counts and histogram
            sample: crate::kernel::ops::sample_args(
                &crate::SamplingParams::greedy().to_fixed()?,
                self.ops.arena.addr(b.logits),
                self.cfg.vocab_size as u32,
                self.ops.arena.addr(b.counts),
                self.ops.arena.addr(b.hist),
                self.ops.arena.addr(b.exp2),
                0,
            ),
            ..Default::default()
        });
    }
        Ok(templates)
    }

    /// Waits up to `timeout_ms` for ring-buffer records.
    pub(crate) fn poll_records(&mut self, timeout_ms: i32) -> Result<()> {
        self.ops.tokens().poll(timeout_ms)
    }

    /// The event path's counters.
    pub(crate) fn event_counters(&self) -> [u64; 4] {
        self.ops.event_counters()
    }
}
