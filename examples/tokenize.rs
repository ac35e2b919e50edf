//! Tokenizes stdin line by line and prints each line's ids, space-separated, one output line per
//! input line (an empty line gives an empty line).
//!
//! `cargo run --release --example tokenize -- ARGS` is `qwen-bpf tokenize ARGS`: the same code
//! (`src/cli/tokenize.rs`, where the flags are documented), flags and output.

fn main() -> std::process::ExitCode {
    qwen_bpf::cli::example(qwen_bpf::cli::tokenize::main)
}
