//! The `qwen-bpf` binary. It runs `qwen_bpf::cli::main`: `qwen-bpf --help` lists the subcommands.
fn main() -> std::process::ExitCode {
    qwen_bpf::cli::main()
}
