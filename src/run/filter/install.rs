//! The packet filter in the kernel: the rule compiled into the filter's configuration, the
//! prefix's KV computed once in every classification slot, payloads classified by the same
//! BPF steps the XDP filter's worker runs ([`Filter::classify_in_kernel`]), and the filter
//! installed on an interface, pinned, working with no process of ours left
//! ([`Filter::install`], [`InstalledFilter`]).

use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::time::Duration;

use super::classify::{Filter, Verdict};
use super::rule::{Action, CompiledRule, Policy, Protocol};
use crate::kernel::filter::{
    FilterCfg, FilterLabel, PinnedFilter, BYTES_MAX, COUNT, DROP, EXCERPT, LABELS_MAX, NAME_MAX,
    PASS, STEPS_MAX, SUFFIX_MAX,
};
use crate::kernel::pins::{self, XdpMode};
use crate::run::event::ifindex;
use crate::run::serve::{check_name, create_pin_dir, installed_dir};
use crate::{Error, Model, Result};

/// A pending flow whose classification has not ended after this long is classified again at
/// its next packet with a payload (a classification takes milliseconds; this only matters if
/// one is lost).
pub const PENDING_TIMEOUT: Duration = Duration::from_secs(10);
/// `GEN_MORE` (src/bpf/generate.inc.c): the generation's time budget ran out.
const GEN_MORE: i32 = 1;

fn action_code(a: Action) -> u32 {
    match a {
        Action::Pass => PASS,
        Action::Drop => DROP,
        Action::Count => COUNT,
    }
}

fn policy_code(p: Policy) -> u32 {
    match p {
        Policy::Pass => PASS,
        Policy::Drop => DROP,
    }
}

impl Model {
    /// Sets the filter's kernel side up for `rule` on interface `ifindex` (0: none, for
    /// [`Filter::classify_in_kernel`]): the configuration (`struct flt_config`), and in each of
    /// the rule's slots the prefix fed from position 0 by the `generate` program, so that every
    /// classification starts at position P with the prefix's KV in place.
    pub(crate) fn filter_setup(&mut self, rule: &CompiledRule, ifindex: u32) -> Result<()> {
        let r = rule.rule();
        let slots = r.slots as usize;
        if self.events.len() < slots {
            return Err(Error::Invalid(format!(
                "the rule asks for {slots} classification slots: open the model with \
                 ModelOptions::with_event_slots({slots}) or more (it has {})",
                self.events.len()
            )));
        }
        let Some(tok) = self.tok else {
            return Err(Error::Invalid(
                "the kernel filter tokenizes payloads: call Model::load_tokenizer first".into(),
            ));
        };
        if rule.suffix().len() > SUFFIX_MAX {
            return Err(Error::Limit {
                what: "tokens of the template after {payload}",
                value: rule.suffix().len(),
                limit: format!("at most {SUFFIX_MAX}"),
            });
        }
        crate::types::check_room(rule.context_needed(), 0, self.max_context)?;
        let mut templates = self.slot_templates(Default::default(), 0, None)?;
        templates.truncate(slots);
        // the prefix's KV, once per slot: its tokens fed from position 0 (one token generated
        // and ignored), never overwritten since every classification starts at P
        let prefix = rule.prefix();
        if !prefix.is_empty() {
            for (i, t) in templates.iter().enumerate() {
                let region = self.events[i].0.prompt;
                self.ops.arena.slice_mut::<u32>(region)?[..prefix.len()]
                    .copy_from_slice(prefix);
                let mut a = *t;
                a.n_prompt = prefix.len() as u32;
                a.max_new = 1;
                a.quiet = 1;
                loop {
                    // one thread: no barrier to time out
                    self.ops
                        .run_generate(std::slice::from_mut(&mut a))
                        .map_err(|f| match f {
                            crate::kernel::drivers::PlanFailure::Error(e) => e,
                            crate::kernel::drivers::PlanFailure::TimedOut => Error::Bpf {
                                what: "feeding the filter's prefix".into(),
                                detail: "a barrier timed out".into(),
                            },
                        })?;
                    if a.status != GEN_MORE {
                        break;
                    }
                }
                if a.status < 0 {
                    return Err(Error::Bpf {
                        what: "feeding the filter's prefix".into(),
                        detail: format!("generate ended with {}", a.status),
                    });
                }
            }
        }
        let mut labels = [FilterLabel::default(); LABELS_MAX];
        let mut names = [[0i8; NAME_MAX]; LABELS_MAX];
        let mut steps = [0u32; STEPS_MAX];
        let mut n_steps = 0;
        for (i, (ids, l)) in rule.labels().iter().zip(&r.labels).enumerate() {
            labels[i].n = ids.len() as u32;
            labels[i].action = action_code(l.action);
            labels[i].tokens[..ids.len()].copy_from_slice(ids);
            for (d, b) in names[i].iter_mut().zip(l.name.bytes().take(NAME_MAX - 1)) {
                *d = b as i8;
            }
            for t in 1..ids.len() {
                steps[n_steps] = (i as u32) << 8 | t as u32;
                n_steps += 1;
            }
        }
        let mut ports = [0u32; 8];
        for (d, &p) in ports.iter_mut().zip(&r.ports) {
            *d = p as u32;
        }
        let (mut src_net, mut src_mask) = ([0u32; 8], [0u32; 8]);
        for (i, p) in r.sources.iter().enumerate() {
            src_net[i] = p.addr_be() & p.mask_be();
            src_mask[i] = p.mask_be();
        }
        let mut suffix = [0u32; SUFFIX_MAX];
        suffix[..rule.suffix().len()].copy_from_slice(rule.suffix());
        let cfg = FilterCfg {
            ifindex,
            proto: match r.protocol {
                Protocol::Udp => 17,
                Protocol::Tcp => 6,
            },
            n_ports: r.ports.len() as u32,
            n_sources: r.sources.len() as u32,
            ports,
            src_net,
            src_mask,
            bytes: r.bytes.min(BYTES_MAX) as u32,
            first_line: r.first_line as u32,
            n_labels: r.labels.len() as u32,
            fallback: rule.fallback() as u32,
            pending: policy_code(r.pending_policy()),
            overflow: policy_code(r.overflow_policy()),
            n_slots: slots as u32,
            prefix_len: prefix.len() as u32,
            n_suffix: rule.suffix().len() as u32,
            has_threshold: rule.threshold_q16().is_some() as u32,
            margin_q16: rule.margin_q16(),
            threshold_q16: rule.threshold_q16().unwrap_or(0),
            ttl_ns: r.ttl_seconds as u64 * 1_000_000_000,
            pending_ns: PENDING_TIMEOUT.as_nanos() as u64,
            tok_text: self.ops.point_tokenizer(&tok)?,
            max_text_tokens: rule.text_tokens_max() as u32,
            vocab: self.cfg.vocab_size as u32,
            per_source: r.per_source.unwrap_or(1),
            hash_key: crate::run::event::cookie_secret()?,
            labels,
            n_steps: n_steps as u32,
            steps,
            suffix,
            names,
            ..Default::default()
        };
        self.ops.configure_filter(cfg, &templates, !self.filter_ready)?;
        self.filter_ready = true;
        Ok(())
    }
}

/// How a filter is installed ([`Filter::install`]).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct FilterInstall {
    /// The interface, instead of the rule's.
    pub interface: Option<String>,
    /// How the XDP program is attached.
    pub xdp_mode: XdpMode,
    /// The most kernel memory the installation may hold (bytes): a model whose arena is larger
    /// is refused with [`Error::Resources`]. `None`: no limit.
    pub max_memory: Option<u64>,
}

impl Filter {
    /// Classifies `payload` in the kernel: the `filter_classify` program runs the steps of the
    /// XDP filter's worker (the text cut, tokenized by the in-kernel tokenizer, fed after the
    /// prefix's KV, every label scored, the decision) in classification slot 0. The same
    /// [`Verdict`] as [`Filter::classify`], integer for integer. Needs a model opened with
    /// event slots (as many as the rule's `slots`) and [`Model::load_tokenizer`].
    pub fn classify_in_kernel(&mut self, payload: &[u8]) -> Result<Verdict> {
        let payload = &payload[..payload.len().min(BYTES_MAX)];
        if !self.kernel_ready {
            let rule = self.rule().clone();
            self.model_mut().filter_setup(&rule, 0)?;
            self.kernel_ready = true;
        }
        let k = self.model_mut().ops.classify_in_kernel(0, payload)?;
        let rule = self.rule();
        let l = &rule.rule().labels[k.chosen];
        Ok(Verdict {
            label: k.chosen,
            name: l.name.clone(),
            action: l.action,
            score_q16: k.scores[k.chosen],
            scores_q16: k.scores,
            tokens: k.prompt_tokens.saturating_sub(rule.suffix().len()),
        })
    }

    /// Installs the filter as `name`: its XDP program attached to the rule's interface (or
    /// `opts.interface`), pinned with its maps under `/sys/fs/bpf/qwen_bpf/NAME`; from then on
    /// it classifies flows and enforces their verdicts on its own, until
    /// [`InstalledFilter::remove`]. Errors: [`Error::AlreadyInstalled`], [`Error::Invalid`] for
    /// an interface that does not exist, [`Error::Resources`] for a model larger than
    /// `opts.max_memory`, [`Error::Bpffs`].
    pub fn install(self, name: &str, opts: &FilterInstall) -> Result<InstalledFilter> {
        check_name(name)?;
        let (mut model, rule) = self.into_parts();
        let interface = opts
            .interface
            .clone()
            .unwrap_or_else(|| rule.rule().interface.clone());
        let ifindex = ifindex(&interface)?;
        let memory = model.kernel_memory().total() as u64;
        if let Some(max) = opts.max_memory {
            if memory > max {
                return Err(Error::Resources {
                    msg: format!(
                        "the model needs {memory} bytes of kernel memory (its arena); at most \
                         {max} were allowed"
                    ),
                });
            }
        }
        model.filter_setup(&rule, ifindex)?;
        pins::ensure_bpffs()?;
        let dir = create_pin_dir(name)?;
        if let Err(e) = model.ops.pin(&pins::FILTER_PINS, ifindex, opts.xdp_mode, &dir) {
            let _ = std::fs::remove_dir(&dir);
            return Err(e);
        }
        log::info!(
            "filter {name:?} installed on {interface} ({} slots, pins in {})",
            rule.rule().slots,
            dir.display()
        );
        drop(model);
        // an installation that cannot be opened back is not left attached
        InstalledFilter::open(name).inspect_err(|_| {
            let _ = pins::remove(&dir);
        })
    }
}

/// An installed filter, found by its name (reading it changes nothing; dropping it leaves the
/// filter installed).
#[derive(Debug)]
pub struct InstalledFilter {
    name: String,
    dir: PathBuf,
    pins: PinnedFilter,
}

/// One label's counters ([`FilterStatus::labels`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LabelStatus {
    /// The label's name (its first 31 bytes).
    pub name: String,
    /// What it does.
    pub action: Action,
    /// Flows judged as it.
    pub flows: u64,
    /// Packets that met its verdict (the fast path).
    pub packets: u64,
}

/// What an installed filter reports ([`InstalledFilter::status`]), read from its pinned maps.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FilterStatus {
    /// The installation's name.
    pub name: String,
    /// The interface's index, and its name if it still exists.
    pub ifindex: u32,
    /// The interface's name (`None` if it is gone).
    pub interface: Option<String>,
    /// The protocol judged.
    pub protocol: Protocol,
    /// Destination ports judged.
    pub ports: Vec<u16>,
    /// Source prefixes judged (`(address, length)`; none: every source).
    pub sources: Vec<(Ipv4Addr, u8)>,
    /// Each label, in the rule's order.
    pub labels: Vec<LabelStatus>,
    /// Packets the rule matched.
    pub packets: u64,
    /// Packets without payload of flows with no verdict (passed: handshakes, bare ACKs).
    pub bare: u64,
    /// Packets that met the pending policy (a classification running, or a fragment).
    pub pending: u64,
    /// New flows that found every slot busy (the overflow policy).
    pub overflow: u64,
    /// IPv4 fragments (the pending policy).
    pub fragments: u64,
    /// Packets dropped: by a label's verdict, the pending or the overflow policy.
    pub dropped: u64,
    /// Classifications started, judged, and failed (a failed flow is classified again at its
    /// next packet with a payload).
    pub started: u64,
    /// See [`FilterStatus::started`].
    pub judged: u64,
    /// See [`FilterStatus::started`].
    pub errors: u64,
    /// Verdict records the log had no room for.
    pub log_lost: u64,
    /// TCP only: what the reading of flows turned away (see [`TcpCounters`]).
    pub tcp: TcpCounters,
    /// TCP: the slots one source address may hold.
    pub per_source: u32,
    /// Classification slots, and those busy (reading a TCP flow's text, or judging).
    pub slots: usize,
    /// See [`FilterStatus::slots`].
    pub slots_busy: usize,
    /// Flows in the table (verdicts and pending; at most 65,536, least recently used evicted).
    pub flows: usize,
    /// A verdict's life.
    pub ttl: Duration,
    /// The pending and overflow policies.
    pub pending_policy: Policy,
    /// See [`FilterStatus::pending_policy`].
    pub overflow_policy: Policy,
    /// Kernel memory the model holds: the arena's size in bytes.
    pub kernel_memory: u64,
    /// The arena map's id (it no longer exists once removed).
    pub arena_map_id: u32,
}

/// What a TCP rule's reading of flows turned away ([`FilterStatus::tcp`]), in packets except
/// `source_busy` and `reclaimed` (flows).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TcpCounters {
    /// Segments with a payload on a flow whose handshake was not seen (the pending policy): a
    /// flow older than the rule, a spoofed segment, data in a SYN.
    pub untracked: u64,
    /// Segments past the next byte expected (dropped: TCP sends them again).
    pub out_of_order: u64,
    /// Segments with a bad TCP checksum (dropped, never read), or longer than 16 KiB.
    pub bad_checksum: u64,
    /// Retransmissions of a judged segment with other bytes than were judged (dropped).
    pub mismatch: u64,
    /// New flows refused a slot because their source held `per_source` (the overflow policy).
    pub source_busy: u64,
    /// Slots taken back from a flow whose text stopped arriving (its later segments meet the
    /// overflow policy).
    pub reclaimed: u64,
}

/// One verdict as the log carries it ([`InstalledFilter::follow_log`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerdictRecord {
    /// The flow: source address and port, destination address and port.
    pub source: (Ipv4Addr, u16),
    /// See [`VerdictRecord::source`].
    pub destination: (Ipv4Addr, u16),
    /// The label chosen.
    pub label: usize,
    /// Its score (Q16 nats).
    pub score_q16: i64,
    /// From the packet's arrival to the verdict.
    pub elapsed: Duration,
    /// The text's length in bytes.
    pub text_bytes: usize,
    /// Its first bytes (at most 64).
    pub excerpt: Vec<u8>,
}

impl VerdictRecord {
    fn parse(d: &[u8]) -> Option<VerdictRecord> {
        let u32_at = |i: usize| Some(u32::from_ne_bytes(d.get(i..i + 4)?.try_into().ok()?));
        let port = |i: usize| Some(u16::from_be_bytes(d.get(i..i + 2)?.try_into().ok()?));
        let ip = |i: usize| Some(Ipv4Addr::from(<[u8; 4]>::try_from(d.get(i..i + 4)?).ok()?));
        let n = u32_at(20)? as usize;
        let score = i64::from_ne_bytes(d.get(24..32)?.try_into().ok()?);
        let ns = u64::from_ne_bytes(d.get(32..40)?.try_into().ok()?);
        Some(VerdictRecord {
            source: (ip(0)?, port(8)?),
            destination: (ip(4)?, port(10)?),
            label: u32_at(16)? as usize,
            score_q16: score,
            elapsed: Duration::from_nanos(ns),
            text_bytes: n,
            excerpt: d.get(40..40 + n.min(EXCERPT))?.to_vec(),
        })
    }
}

impl InstalledFilter {
    /// Opens the filter installed as `name`: [`Error::NotInstalled`] when there is none,
    /// [`Error::LostPin`] when a pin is missing.
    pub fn open(name: &str) -> Result<InstalledFilter> {
        let dir = installed_dir(name)?;
        if dir.join("ev_xdp").exists() {
            return Err(Error::Invalid(format!(
                "{name:?} is an installed model serving requests, not a filter (see Installed)"
            )));
        }
        let pins = PinnedFilter::open(&dir)?;
        Ok(InstalledFilter {
            name: name.into(),
            dir,
            pins,
        })
    }

    /// The installation's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The directory of its pins.
    pub fn path(&self) -> &std::path::Path {
        &self.dir
    }

    /// The filter's counters and configuration, read from its pinned maps.
    pub fn status(&self) -> Result<FilterStatus> {
        let st = self.pins.state()?;
        let (b, c) = (&st.bss, &st.bss.flt_cfg);
        let n = (c.n_labels as usize).min(LABELS_MAX);
        let action = |a: u32| match a {
            DROP => Action::Drop,
            COUNT => Action::Count,
            _ => Action::Pass,
        };
        let policy = |p: u32| if p == DROP { Policy::Drop } else { Policy::Pass };
        let labels = (0..n)
            .map(|i| {
                let raw: Vec<u8> = c.names[i].iter().map(|&b| b as u8).take_while(|&b| b != 0).collect();
                LabelStatus {
                    name: String::from_utf8_lossy(&raw).into_owned(),
                    action: action(c.labels[i].action),
                    flows: b.flt_label_flows[i],
                    packets: b.flt_label_packets[i],
                }
            })
            .collect();
        let mut name = [0u8; libc::IF_NAMESIZE];
        // SAFETY: a buffer of IF_NAMESIZE bytes, as if_indextoname requires.
        let interface = unsafe {
            let p = libc::if_indextoname(c.ifindex, name.as_mut_ptr().cast());
            (!p.is_null()).then(|| {
                let end = name.iter().position(|&b| b == 0).unwrap_or(name.len());
                String::from_utf8_lossy(&name[..end]).into_owned()
            })
        };
        Ok(FilterStatus {
            name: self.name.clone(),
            ifindex: c.ifindex,
            interface,
            protocol: if c.proto == 17 { Protocol::Udp } else { Protocol::Tcp },
            ports: c.ports[..(c.n_ports as usize).min(8)].iter().map(|&p| p as u16).collect(),
            sources: (0..(c.n_sources as usize).min(8))
                .map(|i| {
                    let net = Ipv4Addr::from(c.src_net[i].to_ne_bytes());
                    (net, u32::from_be(c.src_mask[i]).count_ones() as u8)
                })
                .collect(),
            labels,
            packets: b.flt_packets,
            bare: b.flt_bare,
            pending: b.flt_pending_packets,
            overflow: b.flt_overflow,
            fragments: b.flt_fragments,
            dropped: b.flt_dropped,
            started: b.flt_started,
            judged: b.flt_judged,
            errors: b.flt_errors,
            log_lost: b.flt_log_lost,
            tcp: TcpCounters {
                untracked: b.flt_untracked,
                out_of_order: b.flt_out_of_order,
                bad_checksum: b.flt_bad_checksum,
                mismatch: b.flt_mismatch,
                source_busy: b.flt_source_busy,
                reclaimed: b.flt_reclaimed,
            },
            per_source: c.per_source,
            slots: c.n_slots as usize,
            slots_busy: st.slots_busy,
            flows: st.flows,
            ttl: Duration::from_nanos(c.ttl_ns),
            pending_policy: policy(c.pending),
            overflow_policy: policy(c.overflow),
            kernel_memory: st.arena_bytes,
            arena_map_id: st.arena_id,
        })
    }

    /// Follows the verdict log for up to `timeout`, calling `f` with each record as it comes;
    /// returns when `f` returns false or the time is up. Nothing needs a reader: records the
    /// log has no room for are counted ([`FilterStatus::log_lost`]).
    pub fn follow_log(
        &self,
        timeout: Duration,
        mut f: impl FnMut(VerdictRecord) -> bool,
    ) -> Result<()> {
        let stop = std::cell::Cell::new(false);
        let mut builder = libbpf_rs::RingBufferBuilder::new();
        builder
            .add(self.pins.log_map(), |d: &[u8]| {
                if let Some(r) = VerdictRecord::parse(d) {
                    if !stop.get() && !f(r) {
                        stop.set(true);
                    }
                }
                0
            })
            .map_err(|e| Error::Bpf {
                what: "following the verdict log".into(),
                detail: e.to_string(),
            })?;
        let ring = builder.build().map_err(|e| Error::Bpf {
            what: "following the verdict log".into(),
            detail: e.to_string(),
        })?;
        let end = std::time::Instant::now() + timeout;
        while !stop.get() {
            let left = end.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                break;
            }
            ring.poll(left.min(Duration::from_millis(100)))
                .map_err(|e| Error::Bpf {
                    what: "following the verdict log".into(),
                    detail: e.to_string(),
                })?;
        }
        Ok(())
    }

    /// Removes the filter installed as `name`: detaches its XDP program and unpins everything
    /// (the kernel then frees the model's memory). [`Error::NotInstalled`] when there is none.
    pub fn remove(name: &str) -> Result<()> {
        let dir = installed_dir(name)?;
        pins::remove(&dir)
    }
}
