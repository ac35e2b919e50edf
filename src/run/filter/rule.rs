//! The packet filter's rule: which packets are classified (interface, protocol, ports, sources),
//! what text of theirs the model reads (the first `bytes` of the payload, [`payload_text`]), the
//! prompt around it (`template`), the labels it chooses between and what each does, and the
//! decision's margin, threshold and fallback. [`FilterRule`] is the JSON file, checked field by
//! field ([`FilterRule::validate`]); [`CompiledRule`] is it tokenized, the token ids the kernel
//! is given.

use std::fmt;
use std::net::Ipv4Addr;
use std::path::Path;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::hf::tokenizer::Tokenizer;
use crate::num::limits::{
    FILTER_BYTES_MAX, FILTER_LABELS_MAX, FILTER_LABEL_TOKENS_MAX, FILTER_PORTS_MAX,
    FILTER_SOURCES_MAX,
};
use crate::run::event::SLOTS_MAX;
use crate::{Error, Result};

/// Where the payload goes in a rule's `template`.
pub const PAYLOAD: &str = "{payload}";
/// The longest label name, in bytes.
pub const LABEL_NAME_MAX: usize = 32;
/// The longest interface name, in bytes (Linux's `IFNAMSIZ` less the NUL).
pub const INTERFACE_MAX: usize = 15;
/// The longest flow lifetime, in seconds (a day).
pub const TTL_MAX: u32 = 86_400;
/// The largest `margin` and `|threshold|`, in nats.
pub const NATS_MAX: f64 = 1e6;
/// How many tokens one byte of payload text may become at most: Unicode NFC, which the Qwen3
/// tokenizer applies first, lengthens UTF-8 text at most 3 times (UAX #15), and every
/// byte-level token holds at least one byte.
pub const TOKENS_PER_BYTE_MAX: usize = 3;

/// The transport protocol a rule classifies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase", try_from = "String")]
pub enum Protocol {
    /// UDP: a flow's first datagram with a payload is classified; its verdict applies to the
    /// flow's later datagrams.
    Udp,
    /// TCP: the first segment of a flow that carries data is classified.
    Tcp,
}

impl Protocol {
    /// The `pending` and `overflow` policies of a rule that names none: TCP fails closed (a
    /// dropped segment is sent again), UDP open (a dropped datagram is lost).
    pub fn default_policy(self) -> Policy {
        match self {
            Protocol::Tcp => Policy::Drop,
            Protocol::Udp => Policy::Pass,
        }
    }
}

/// What a label does to the packets of a flow classified as it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase", try_from = "String")]
pub enum Action {
    /// Let them through.
    Pass,
    /// Drop them.
    Drop,
    /// Let them through and count them.
    Count,
}

/// What happens to packets while no verdict applies (`pending`, `overflow`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase", try_from = "String")]
pub enum Policy {
    /// Let them through (UDP's default).
    #[default]
    Pass,
    /// Drop them (TCP's default).
    Drop,
}

/// The JSON names of a string enum, and its parsing with an error that names what it is.
macro_rules! named {
    ($t:ty, $what:literal, [$($v:ident = $s:literal),*]) => {
        impl $t {
            /// Every value, in declaration order.
            pub const ALL: &'static [$t] = &[$(<$t>::$v),*];

            /// The name in a rule file.
            pub fn name(self) -> &'static str {
                match self { $(<$t>::$v => $s),* }
            }
        }

        impl TryFrom<String> for $t {
            type Error = String;
            fn try_from(s: String) -> std::result::Result<Self, String> {
                Self::ALL.iter().copied().find(|v| v.name() == s).ok_or_else(|| {
                    let names: Vec<String> =
                        Self::ALL.iter().map(|v| format!("{:?}", v.name())).collect();
                    format!("{} {s:?}: expected one of {}", $what, names.join(", "))
                })
            }
        }

        impl fmt::Display for $t {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.name())
            }
        }
    };
}

named!(Protocol, "protocol", [Udp = "udp", Tcp = "tcp"]);
named!(Action, "label action", [Pass = "pass", Drop = "drop", Count = "count"]);
named!(Policy, "policy (pending, overflow)", [Pass = "pass", Drop = "drop"]);

/// An IPv4 prefix, `a.b.c.d/len` (`a.b.c.d` alone is a /32). Host bits set below the prefix
/// length are refused rather than masked: `10.1.2.3/8` may mean the host or the network, so
/// the error names the network, `10.0.0.0/8`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize)]
#[serde(try_from = "String")]
pub struct Ipv4Prefix {
    addr: Ipv4Addr,
    len: u8,
}

impl Ipv4Prefix {
    /// `addr/len`; `len` above 32 or host bits set is [`Error::Rule`].
    pub fn new(addr: Ipv4Addr, len: u8) -> Result<Ipv4Prefix> {
        let bad = |msg: String| Error::Rule {
            field: "sources".into(),
            msg,
        };
        if len > 32 {
            return Err(bad(format!("{addr}/{len}: the length must be 0..=32")));
        }
        let p = Ipv4Prefix { addr, len };
        if u32::from(addr) & !p.mask() != 0 {
            let net = Ipv4Addr::from(u32::from(addr) & p.mask());
            return Err(bad(format!(
                "{addr}/{len} has host bits set: the network is {net}/{len}"
            )));
        }
        Ok(p)
    }

    /// The network address.
    pub fn addr(&self) -> Ipv4Addr {
        self.addr
    }

    /// The prefix length, 0..=32 (0: every address).
    pub fn prefix_len(&self) -> u8 {
        self.len
    }

    /// The mask as a host-order number (`/8` is `0xff00_0000`).
    pub fn mask(&self) -> u32 {
        u32::MAX.checked_shl(32 - u32::from(self.len)).unwrap_or(0)
    }

    /// The network address in network byte order, as a packet's `saddr` holds it: compare
    /// `saddr & mask_be() == addr_be()`.
    pub fn addr_be(&self) -> u32 {
        u32::from_ne_bytes(self.addr.octets())
    }

    /// The mask in network byte order.
    pub fn mask_be(&self) -> u32 {
        u32::from_ne_bytes(self.mask().to_be_bytes())
    }

    /// Whether `a` is in this prefix.
    pub fn contains(&self, a: Ipv4Addr) -> bool {
        u32::from(a) & self.mask() == u32::from(self.addr)
    }
}

impl FromStr for Ipv4Prefix {
    type Err = Error;
    fn from_str(s: &str) -> Result<Ipv4Prefix> {
        let bad = || Error::Rule {
            field: "sources".into(),
            msg: format!("{s:?}: expected an IPv4 prefix a.b.c.d/len (len 0..=32) or an address"),
        };
        let (a, len) = match s.split_once('/') {
            Some((a, l)) if !l.is_empty() && l.bytes().all(|b| b.is_ascii_digit()) => {
                (a, l.parse::<u8>().map_err(|_| bad())?)
            }
            Some(_) => return Err(bad()),
            None => (s, 32),
        };
        Ipv4Prefix::new(a.parse().map_err(|_| bad())?, len)
    }
}

impl TryFrom<String> for Ipv4Prefix {
    type Error = String;
    fn try_from(s: String) -> std::result::Result<Self, String> {
        s.parse().map_err(|e: Error| match e {
            Error::Rule { field, msg } => format!("{field}: {msg}"),
            e => e.to_string(),
        })
    }
}

impl fmt::Display for Ipv4Prefix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.len)
    }
}

impl Serialize for Ipv4Prefix {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// One label of a rule: what the model may answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Label {
    /// Its name, printed with verdicts: 1..=32 (`LABEL_NAME_MAX`) bytes, no whitespace or control
    /// characters, unique in the rule.
    pub name: String,
    /// The answer's text, scored after the prompt: 1..=4 (`FILTER_LABEL_TOKENS_MAX`) tokens.
    pub text: String,
    /// What its packets get.
    pub action: Action,
}

/// A packet-filter rule, as its JSON file says (docs: the filter spec). Unknown fields are
/// refused; [`FilterRule::from_json`] and [`FilterRule::load`] also [`validate`](Self::validate)
/// every value, so a rule they return is usable.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FilterRule {
    /// The network interface the filter is attached to (e.g. `lo`).
    pub interface: String,
    /// UDP or TCP.
    pub protocol: Protocol,
    /// Destination ports classified: 1..=8 (`FILTER_PORTS_MAX`), non-zero, distinct.
    pub ports: Vec<u16>,
    /// Sources classified: 0..=8 (`FILTER_SOURCES_MAX`) distinct prefixes; none (or absent) is any.
    #[serde(default)]
    pub sources: Vec<Ipv4Prefix>,
    /// Payload bytes read: 1..=1024 (`FILTER_BYTES_MAX`).
    pub bytes: usize,
    /// Cut the text at its first `\r` or `\n` (default false).
    #[serde(default)]
    pub first_line: bool,
    /// The prompt, with exactly one `{payload}` where the payload's text goes.
    pub template: String,
    /// 2..=8 (`FILTER_LABELS_MAX`) labels.
    pub labels: Vec<Label>,
    /// The least lead, in nats, of the best label's score over the second's (default 0: off).
    #[serde(default)]
    pub margin: f64,
    /// The least score, in nats (≤ 0), of the best label (default none).
    #[serde(default)]
    pub threshold: Option<f64>,
    /// The label chosen when the margin or threshold is not met (default: the first label).
    #[serde(default)]
    pub fallback: Option<String>,
    /// Packets of a flow whose verdict is not ready yet, the packet judged among them; absent:
    /// [`FilterRule::pending_policy`]'s default (drop for TCP, pass for UDP).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pending: Option<Policy>,
    /// A new flow that finds every classification slot busy; absent:
    /// [`FilterRule::overflow_policy`]'s default (drop for TCP, pass for UDP).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub overflow: Option<Policy>,
    /// Seconds a flow's verdict is kept: 1..=86,400 (`TTL_MAX`) (default 300).
    #[serde(default = "default_ttl")]
    pub ttl_seconds: u32,
    /// Classifications run at once: 1..=8, the event path's slots (default 2).
    #[serde(default = "default_slots")]
    pub slots: u32,
    /// TCP: the slots one source address may hold at once (reading a flow's text or judging
    /// it), 1..=`slots`; a new flow of a source that holds them meets the overflow policy,
    /// counted. Absent: 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub per_source: Option<u32>,
}

fn default_ttl() -> u32 {
    300
}
fn default_slots() -> u32 {
    2
}

/// An [`Error::Rule`] for `field`.
fn rule_err(field: impl Into<String>, msg: impl Into<String>) -> Error {
    Error::Rule {
        field: field.into(),
        msg: msg.into(),
    }
}

impl FilterRule {
    /// The policy for packets of a flow whose verdict is not ready: the rule's, else fail
    /// closed for TCP (`drop`: the client retransmits, and the retransmission meets the
    /// verdict) and open for UDP (`pass`: a datagram dropped is lost, so the judged datagram
    /// itself reaches the server before its verdict exists; say `drop` to judge first).
    pub fn pending_policy(&self) -> Policy {
        self.pending.unwrap_or(self.protocol.default_policy())
    }

    /// The policy for a new flow that finds every classification slot busy: the rule's, else
    /// `drop` for TCP (fail closed) and `pass` for UDP (fail open), as
    /// [`pending_policy`](Self::pending_policy).
    pub fn overflow_policy(&self) -> Policy {
        self.overflow.unwrap_or(self.protocol.default_policy())
    }

    /// Parses and [validates](Self::validate) a rule. Text that is not a rule (bad JSON, a
    /// value of the wrong type, an unknown or missing field) is [`Error::Rule`] with field
    /// `JSON` and serde's message, which gives the line and column.
    pub fn from_json(text: &str) -> Result<FilterRule> {
        let rule: FilterRule =
            serde_json::from_str(text).map_err(|e| rule_err("JSON", e.to_string()))?;
        rule.validate()?;
        Ok(rule)
    }

    /// Reads and parses the rule file at `path` ([`FilterRule::from_json`]); its errors name
    /// the file.
    pub fn load(path: impl AsRef<Path>) -> Result<FilterRule> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
        Self::from_json(&text).map_err(|e| match e {
            Error::Rule { field, msg } => rule_err(field, format!("{msg} (in {})", path.display())),
            e => e,
        })
    }

    /// Checks every field against its range (what the tokenizer decides, the labels' token
    /// counts, is checked by [`FilterRule::compile`]). The first field out of range is
    /// [`Error::Rule`] naming it, its value and what is allowed.
    pub fn validate(&self) -> Result<()> {
        let ifname = &self.interface;
        if ifname.is_empty()
            || ifname.len() > INTERFACE_MAX
            || ifname == "."
            || ifname == ".."
            || ifname.contains(|c: char| c == '/' || c == ':' || c.is_whitespace())
        {
            return Err(rule_err(
                "interface",
                format!("{ifname:?}: a Linux interface name is 1..={INTERFACE_MAX} bytes without '/', ':' or spaces"),
            ));
        }
        if self.ports.is_empty() || self.ports.len() > FILTER_PORTS_MAX {
            return Err(rule_err(
                "ports",
                format!("{} ports: expected 1..={FILTER_PORTS_MAX}", self.ports.len()),
            ));
        }
        for (i, &p) in self.ports.iter().enumerate() {
            if p == 0 {
                return Err(rule_err(format!("ports[{i}]"), "port 0: expected 1..=65535"));
            }
            if self.ports[..i].contains(&p) {
                return Err(rule_err(format!("ports[{i}]"), format!("port {p} is listed twice")));
            }
        }
        if self.sources.len() > FILTER_SOURCES_MAX {
            return Err(rule_err(
                "sources",
                format!("{} prefixes: expected 0..={FILTER_SOURCES_MAX} (none: any source)", self.sources.len()),
            ));
        }
        // each prefix was checked when it was made (Ipv4Prefix::new)
        for (i, s) in self.sources.iter().enumerate() {
            if self.sources[..i].contains(s) {
                return Err(rule_err(format!("sources[{i}]"), format!("{s} is listed twice")));
            }
        }
        if !(1..=FILTER_BYTES_MAX).contains(&self.bytes) {
            return Err(rule_err(
                "bytes",
                format!("{}: expected 1..={FILTER_BYTES_MAX}", self.bytes),
            ));
        }
        let holes = self.template.matches(PAYLOAD).count();
        if holes != 1 {
            return Err(rule_err(
                "template",
                format!("{holes} {PAYLOAD}: expected exactly one, where the payload's text goes"),
            ));
        }
        self.validate_labels()?;
        if !(0.0..=NATS_MAX).contains(&self.margin) {
            return Err(rule_err(
                "margin",
                format!("{}: expected 0..={NATS_MAX} nats (0: off)", self.margin),
            ));
        }
        if let Some(t) = self.threshold {
            if !(-NATS_MAX..=0.0).contains(&t) {
                return Err(rule_err(
                    "threshold",
                    format!("{t}: expected -{NATS_MAX}..=0 nats (a log-probability), or null"),
                ));
            }
        }
        let ranges = [
            ("ttl_seconds", self.ttl_seconds, TTL_MAX),
            ("slots", self.slots, SLOTS_MAX as u32),
        ];
        for (field, v, max) in ranges {
            if !(1..=max).contains(&v) {
                return Err(rule_err(field, format!("{v}: expected 1..={max}")));
            }
        }
        if let Some(n) = self.per_source {
            if !(1..=self.slots).contains(&n) {
                return Err(rule_err(
                    "per_source",
                    format!("{n}: expected 1..={} (the rule's slots)", self.slots),
                ));
            }
        }
        Ok(())
    }

    /// The labels' count, names and texts, and the fallback's name.
    fn validate_labels(&self) -> Result<()> {
        let n = self.labels.len();
        if !(2..=FILTER_LABELS_MAX).contains(&n) {
            return Err(rule_err(
                "labels",
                format!("{n} labels: expected 2..={FILTER_LABELS_MAX}"),
            ));
        }
        for (i, l) in self.labels.iter().enumerate() {
            let name = &l.name;
            if name.is_empty()
                || name.len() > LABEL_NAME_MAX
                || name.contains(|c: char| c.is_whitespace() || c.is_control())
            {
                return Err(rule_err(
                    format!("labels[{i}].name"),
                    format!("{name:?}: expected 1..={LABEL_NAME_MAX} bytes without spaces or control characters"),
                ));
            }
            if self.labels[..i].iter().any(|o| &o.name == name) {
                return Err(rule_err(
                    format!("labels[{i}].name"),
                    format!("{name:?} is the name of an earlier label: names must be unique"),
                ));
            }
            if l.text.is_empty() {
                return Err(rule_err(
                    format!("labels[{i}].text"),
                    format!("empty: expected text of 1..={FILTER_LABEL_TOKENS_MAX} tokens"),
                ));
            }
        }
        self.fallback_index().map(|_| ())
    }

    /// The fallback label's index: the label named `fallback`, or the first.
    pub fn fallback_index(&self) -> Result<usize> {
        match &self.fallback {
            None => Ok(0),
            Some(f) => self.labels.iter().position(|l| &l.name == f).ok_or_else(|| {
                let names: Vec<&str> = self.labels.iter().map(|l| l.name.as_str()).collect();
                rule_err(
                    "fallback",
                    format!("{f:?} is no label's name: expected one of {names:?}"),
                )
            }),
        }
    }

    /// The template's text before and after `{payload}`. Assumes a validated rule (the whole
    /// template and nothing after it otherwise).
    pub fn template_parts(&self) -> (&str, &str) {
        self.template.split_once(PAYLOAD).unwrap_or((&self.template, ""))
    }

    /// Validates the rule and tokenizes it with `tok` (`Tokenizer::encode`: no special token
    /// added, added tokens such as `<|im_start|>` recognised): the template's text before and
    /// after `{payload}`, and every label's text. A label of no token or more than
    /// 4 (`FILTER_LABEL_TOKENS_MAX`), or a template ending in `{payload}` (whose suffix has no
    /// token, so that an empty payload would leave nothing to score after), is [`Error::Rule`].
    pub fn compile(&self, tok: &Tokenizer) -> Result<CompiledRule> {
        self.validate()?;
        let (before, after) = self.template_parts();
        let prefix = if before.is_empty() {
            Vec::new()
        } else {
            tok.encode(before)?
        };
        let suffix = if after.is_empty() {
            Vec::new()
        } else {
            tok.encode(after)?
        };
        if suffix.is_empty() {
            return Err(rule_err(
                "template",
                format!("nothing after {PAYLOAD}: the prompt must end with at least one token of the template (e.g. the assistant's turn)"),
            ));
        }
        let mut labels = Vec::with_capacity(self.labels.len());
        for (i, l) in self.labels.iter().enumerate() {
            let ids = tok.encode(&l.text)?;
            if !(1..=FILTER_LABEL_TOKENS_MAX).contains(&ids.len()) {
                return Err(rule_err(
                    format!("labels[{i}].text"),
                    format!(
                        "{:?} is {} tokens: expected 1..={FILTER_LABEL_TOKENS_MAX}",
                        l.text,
                        ids.len()
                    ),
                ));
            }
            labels.push(ids);
        }
        Ok(CompiledRule {
            prefix,
            suffix,
            labels,
            margin_q16: nats_q16(self.margin),
            threshold_q16: self.threshold.map(nats_q16),
            fallback: self.fallback_index()?,
            rule: self.clone(),
        })
    }
}

/// `round(v · 2^16)`: nats in Q16 (|v| ≤ 10^6 (`NATS_MAX`) in a validated rule).
fn nats_q16(v: f64) -> i64 {
    (v * 65536.0).round() as i64
}

/// A validated rule with its token ids: what the classifier (and the kernel) feeds and scores.
/// Made by [`FilterRule::compile`].
#[derive(Debug, Clone, PartialEq)]
pub struct CompiledRule {
    rule: FilterRule,
    prefix: Vec<u32>,
    suffix: Vec<u32>,
    labels: Vec<Vec<u32>>,
    margin_q16: i64,
    threshold_q16: Option<i64>,
    fallback: usize,
}

impl CompiledRule {
    /// The rule.
    pub fn rule(&self) -> &FilterRule {
        &self.rule
    }

    /// The template's tokens before `{payload}` (possibly none): fed once, at positions `0..P`.
    pub fn prefix(&self) -> &[u32] {
        &self.prefix
    }

    /// The template's tokens after `{payload}` (at least one), fed after each payload's.
    pub fn suffix(&self) -> &[u32] {
        &self.suffix
    }

    /// Every label's tokens (1..=4 (`FILTER_LABEL_TOKENS_MAX`) each), in the rule's order.
    pub fn labels(&self) -> &[Vec<u32>] {
        &self.labels
    }

    /// `margin` in Q16 nats (`round(margin · 65536)`; 0: off).
    pub fn margin_q16(&self) -> i64 {
        self.margin_q16
    }

    /// `threshold` in Q16 nats, if set.
    pub fn threshold_q16(&self) -> Option<i64> {
        self.threshold_q16
    }

    /// The fallback label's index.
    pub fn fallback(&self) -> usize {
        self.fallback
    }

    /// The most tokens a payload's text can become: 3 (`TOKENS_PER_BYTE_MAX`) per byte read.
    pub fn text_tokens_max(&self) -> usize {
        TOKENS_PER_BYTE_MAX * self.rule.bytes
    }

    /// The positions one classification can reach: the prefix, the longest text, the suffix,
    /// and all but the last token of the longest label (fed to score the tokens after them).
    /// A model with this `max_context` classifies every payload.
    pub fn context_needed(&self) -> usize {
        let label_max = self.labels.iter().map(Vec::len).max().unwrap_or(1);
        self.prefix.len() + self.text_tokens_max() + self.suffix.len() + label_max - 1
    }
}

/// The text of `payload` the rule's model reads (the kernel extracts the same bytes): its first
/// `rule.bytes` bytes, cut at the first `\r` or `\n` when `rule.first_line`, then cut to the
/// longest prefix that is valid UTF-8 (RFC 3629, as `std::str::from_utf8` checks it: an invalid
/// byte or a sequence cut short ends the text). Possibly empty.
pub fn payload_text<'a>(rule: &FilterRule, payload: &'a [u8]) -> &'a str {
    let mut p = &payload[..payload.len().min(rule.bytes)];
    if rule.first_line {
        if let Some(end) = p.iter().position(|&b| b == b'\r' || b == b'\n') {
            p = &p[..end];
        }
    }
    match std::str::from_utf8(p) {
        Ok(s) => s,
        // the prefix up to valid_up_to is valid by definition
        Err(e) => std::str::from_utf8(&p[..e.valid_up_to()]).unwrap_or_default(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(bytes: usize, first_line: bool) -> FilterRule {
        let mut r = FilterRule::from_json(
            r#"{"interface": "lo", "protocol": "udp", "ports": [53], "bytes": 1,
                "template": "{payload}?", "labels": [
                  {"name": "a", "text": "a", "action": "pass"},
                  {"name": "b", "text": "b", "action": "drop"}]}"#,
        )
        .unwrap();
        r.bytes = bytes;
        r.first_line = first_line;
        r
    }

    #[test]
    fn payload_text_cuts_at_bytes_line_ends_and_invalid_utf8() {
        let r = rule(8, false);
        assert_eq!(payload_text(&r, b""), "");
        assert_eq!(payload_text(&r, b"GET / HTTP/1.1"), "GET / HT");
        assert_eq!(payload_text(&r, b"short"), "short");
        // no first_line: line ends are text
        assert_eq!(payload_text(&r, b"a\r\nb"), "a\r\nb");
        // "é" is 2 bytes, "€" 3: bytes = 8 cuts inside the second "€"
        assert_eq!(payload_text(&r, "aé€€".as_bytes()), "aé€");
        // an invalid byte in the middle ends the text; so does a lone continuation byte
        assert_eq!(payload_text(&r, b"ab\xffcd"), "ab");
        assert_eq!(payload_text(&r, b"\x80abc"), "");
        // an overlong encoding and a surrogate are not UTF-8 (RFC 3629)
        assert_eq!(payload_text(&r, b"x\xc0\xafy"), "x");
        assert_eq!(payload_text(&r, b"x\xed\xa0\x80y"), "x");
        let r = rule(1024, true);
        assert_eq!(payload_text(&r, b"GET / HTTP/1.1\r\nHost: x\r\n"), "GET / HTTP/1.1");
        assert_eq!(payload_text(&r, b"one\ntwo"), "one");
        assert_eq!(payload_text(&r, b"\r\n"), "");
        // the cut at bytes comes first: a line end past it does not matter
        let r = rule(3, true);
        assert_eq!(payload_text(&r, b"abcd\n"), "abc");
        // and the line cut before the UTF-8 check: an invalid byte after it does not matter
        let r = rule(16, true);
        assert_eq!(payload_text(&r, b"ok\n\xff"), "ok");
    }

    #[test]
    fn prefixes_parse_mask_and_refuse_host_bits() {
        let p: Ipv4Prefix = "10.0.0.0/8".parse().unwrap();
        assert_eq!((p.addr(), p.prefix_len(), p.mask()), (Ipv4Addr::new(10, 0, 0, 0), 8, 0xff00_0000));
        assert_eq!(p.addr_be().to_ne_bytes(), [10, 0, 0, 0]);
        assert_eq!(p.mask_be().to_ne_bytes(), [255, 0, 0, 0]);
        assert!(p.contains(Ipv4Addr::new(10, 9, 8, 7)) && !p.contains(Ipv4Addr::new(11, 0, 0, 0)));
        let host: Ipv4Prefix = "127.0.0.1".parse().unwrap();
        assert_eq!((host.prefix_len(), host.mask()), (32, u32::MAX));
        let any: Ipv4Prefix = "0.0.0.0/0".parse().unwrap();
        assert!(any.prefix_len() == 0 && any.contains(Ipv4Addr::new(1, 2, 3, 4)) && any.mask() == 0);
        assert_eq!(p.to_string(), "10.0.0.0/8");
        let e = "10.1.2.3/8".parse::<Ipv4Prefix>().unwrap_err().to_string();
        assert!(e.contains("host bits") && e.contains("10.0.0.0/8"), "{e}");
        for bad in ["10.0.0.0/33", "10.0.0/8", "10.0.0.0/", "/8", "10.0.0.0/+8", "a.b.c.d", "", "10.0.0.0/8/8"] {
            let e = bad.parse::<Ipv4Prefix>().unwrap_err();
            assert!(matches!(&e, Error::Rule { field, .. } if field == "sources"), "{bad}: {e}");
        }
    }
}
