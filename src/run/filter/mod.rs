//! The packet filter (issue 25): a rule ([`rule`]: which packets, what text of theirs, the
//! prompt, the labels and the decision) and its classifier in user space ([`classify`]), the
//! twin the in-kernel filter computes the same scores as.

pub mod classify;
pub mod install;
pub mod rule;
