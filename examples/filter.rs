//! The packet filter: classifies packet payloads with a model and a rule file (issue 25).
//!
//! `cargo run --release --example filter -- ARGS` is `qwen-bpf filter ARGS`: the same code
//! (`src/cli/filter.rs`, where the flags are documented), flags and output.

fn main() -> std::process::ExitCode {
    qwen_bpf::cli::example(qwen_bpf::cli::filter::main)
}
