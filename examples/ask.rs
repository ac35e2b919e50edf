//! Asks a model installed in the kernel (the `serve` example) for text.
//!
//! `cargo run --release --example ask -- ARGS` is `qwen-bpf ask ARGS`: the same code
//! (`src/cli/ask.rs`, where the flags are documented), flags and output.

fn main() -> std::process::ExitCode {
    qwen_bpf::cli::example(qwen_bpf::cli::ask::main)
}
