//! Installs a model in the kernel, shows what an installed model reports, and removes it.
//!
//! `cargo run --release --example serve -- ARGS` is `qwen-bpf serve ARGS`: the same code
//! (`src/cli/serve.rs`, where the flags are documented), flags and output.

fn main() -> std::process::ExitCode {
    qwen_bpf::cli::example(qwen_bpf::cli::serve::main)
}
