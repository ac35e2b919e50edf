//! Helpers shared by the examples: the weight-store list, argument parsing, formatting.
#![allow(dead_code)]

use std::process::ExitCode;

use clap::Parser;
use qwen_bpf::Backend;

/// Every weight store the examples offer ([`Backend::ALL`]).
pub const BACKENDS: &[Backend] = &Backend::ALL;

/// The store called `s` on the command line ([`Backend::from_name`]).
pub fn parse_backend(s: &str) -> Result<Backend, String> {
    Backend::from_name(s)
        .ok_or_else(|| format!("unknown backend {s:?}; known: {}", backend_names()))
}

/// The names of [`BACKENDS`], comma-separated.
pub fn backend_names() -> String {
    BACKENDS
        .iter()
        .map(|b| b.name())
        .collect::<Vec<_>>()
        .join(", ")
}

/// Parses the command line; usage errors exit with 1 like every other error (clap's own
/// convention is 2), `--help` with 0.
pub fn parse_args<T: Parser>() -> Result<T, ExitCode> {
    T::try_parse().map_err(|e| {
        let _ = e.print();
        if e.use_stderr() {
            ExitCode::FAILURE
        } else {
            ExitCode::SUCCESS
        }
    })
}

/// Runs `f`, printing its error (Display) to stderr with `name` and exiting with 1.
pub fn exit_with<E: std::fmt::Display>(name: &str, result: Result<(), E>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{name}: error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// `bytes` in MiB with one decimal.
pub fn mib(bytes: usize) -> String {
    format!("{:.1} MiB", bytes as f64 / (1024.0 * 1024.0))
}

/// The index of the largest value; the first one on ties (like the BPF LM head's argmax).
pub fn argmax(v: &[f32]) -> usize {
    let mut best = 0;
    for (i, &x) in v.iter().enumerate() {
        if x > v[best] {
            best = i;
        }
    }
    best
}
