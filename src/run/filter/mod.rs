//! The packet filter (`qwen_bpf::filter`): a rule ([`FilterRule`]: which packets, what text of
//! theirs, the prompt, the labels and the decision), its classifier in user space ([`Filter`],
//! the twin the in-kernel filter computes the same scores as), and the filter installed in the
//! kernel ([`InstalledFilter`]). docs/filter.md has the rule file and the measurements.

pub(crate) mod classify;
pub(crate) mod install;
pub(crate) mod rule;

pub use classify::{Filter, Verdict};
pub use install::{
    FilterInstall, FilterStatus, InstalledFilter, LabelStatus, TcpCounters, VerdictRecord,
};
pub use rule::{
    payload_text, Action, CompiledRule, FilterRule, Ipv4Prefix, Label, Policy, Protocol,
};
