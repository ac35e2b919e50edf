//! The `qwen-bpf` command: one subcommand per job, each a module with its `Args` (clap derive)
//! and its `main`. The binary (`src/bin/qwen-bpf.rs`) parses `Cli`; the examples of the same
//! names parse one module's `Args` alone (`example`), with the same flags and output.
//!
//! Exit codes: 0 on success, 1 on any error (a usage error included; clap's own is 2), with one
//! line `COMMAND: error: CAUSE` on stderr. `doctor` exits 1 when a facility it reports is missing.

pub mod ask;
pub mod common;
pub mod doctor;
pub mod filter;
pub mod generate;
pub mod serve;
pub mod tokenize;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// What `qwen-bpf --help` shows after the subcommands.
const AFTER_HELP: &str = "\
Without --model, generate uses a synthetic Qwen3-0.6B-shaped model with random weights.
Exit status: 0 on success, 1 on any error (one line on stderr: COMMAND: error: CAUSE).
Most subcommands need root (or CAP_BPF + CAP_PERFMON; serve and filter also CAP_NET_ADMIN).";

/// The Qwen3 forward pass inside Linux eBPF: generate, tokenize, serve from XDP, filter packets.
#[derive(Debug, Parser)]
#[command(name = "qwen-bpf", version, after_help = AFTER_HELP)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
enum Command {
    /// Generate text with the forward pass in BPF, streamed to stdout.
    Generate(generate::Args),
    /// Tokenize stdin line by line: each line's token ids, space-separated.
    Tokenize(tokenize::Args),
    /// Install a model in the kernel (it answers UDP requests from XDP), list, status, remove.
    Serve(serve::Args),
    /// Ask a model installed by `serve install`: prints the generated text.
    Ask(ask::Args),
    /// Classify packet payloads with a model and a rule; install, status, remove the filter.
    Filter(filter::Args),
    /// What this kernel lets qwen_bpf do: facilities and, with --programs, every program.
    Doctor(doctor::Args),
}

/// Runs `qwen-bpf` on the process's arguments.
pub fn main() -> ExitCode {
    let cli = match common::parse_args::<Cli>() {
        Ok(cli) => cli,
        Err(code) => return code,
    };
    match cli.command {
        Command::Generate(a) => generate::main(a),
        Command::Tokenize(a) => tokenize::main(a),
        Command::Serve(a) => serve::main(a),
        Command::Ask(a) => ask::main(a),
        Command::Filter(a) => filter::main(a),
        Command::Doctor(a) => doctor::main(a),
    }
}

/// Runs one subcommand as a program of its own (the examples): parses its `T` from the process's
/// arguments and hands it to `main`.
pub fn example<T: Parser>(main: fn(T) -> ExitCode) -> ExitCode {
    match common::parse_args::<T>() {
        Ok(args) => main(args),
        Err(code) => code,
    }
}
