//! Text generation with the BPF forward pass, streaming the text as it is generated.
//!
//! `cargo run --release --example generate -- ARGS` is `qwen-bpf generate ARGS`: the same code
//! (`src/cli/generate.rs`, where the flags are documented), flags and output.

fn main() -> std::process::ExitCode {
    qwen_bpf::cli::example(qwen_bpf::cli::generate::main)
}
