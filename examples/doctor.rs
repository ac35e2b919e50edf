//! Says what this kernel lets qwen_bpf do, like `bpftool feature probe`: the kernel facilities
//! (BTF, the JIT, arena maps, BPF workqueues, bpffs) and, program by program, whether the
//! verifier takes the operator object's programs (each loaded alone) and how many instructions
//! it processed.
//!
//! `cargo run --release --example doctor -- ARGS` is `qwen-bpf doctor ARGS`: the same code
//! (`src/cli/doctor.rs`, where the flags are documented), flags and output.

fn main() -> std::process::ExitCode {
    qwen_bpf::cli::example(qwen_bpf::cli::doctor::main)
}
