//! Tokenizes stdin line by line and prints each line's ids, space-separated, one output line per
//! input line (an empty line gives an empty line).
//!
//! ```text
//! qwen-bpf tokenize --tokenizer FILE [--in-kernel]
//! ```
//!
//! Without `--in-kernel` the ids come from the `tokenizers` crate (`qwen_bpf::Tokenizer`); with
//! it, from the BPF program `src/bpf/tokenize.inc.c` (`crate::KernelTokenizer`), which gives
//! the same ids. Needs root (or CAP_BPF + CAP_PERFMON) for `--in-kernel`.

use std::io::{BufRead, BufWriter, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use crate::{Error, KernelTokenizer, Result, Tokenizer};
use clap::Parser;

#[derive(Parser, Debug)]
#[command(about = "Tokenize stdin line by line with a Qwen3 tokenizer.json")]
pub struct Args {
    /// The tokenizer.json.
    #[arg(long)]
    tokenizer: PathBuf,
    /// Tokenize in the kernel (BPF) instead of with the tokenizers crate.
    #[arg(long)]
    in_kernel: bool,
}

fn run(args: &Args) -> Result<()> {
    let tok = Tokenizer::from_file(&args.tokenizer)?;
    let mut kernel = match args.in_kernel {
        true => Some(KernelTokenizer::load(&tok)?),
        false => None,
    };
    let out = std::io::stdout();
    let mut out = BufWriter::new(out.lock());
    let io = |e: std::io::Error| Error::io("stdin/stdout", e);
    for line in std::io::stdin().lock().lines() {
        let line = line.map_err(io)?;
        let ids = match &mut kernel {
            Some(k) => k.encode(&line)?,
            None => tok.encode(&line)?,
        };
        let text: Vec<String> = ids.iter().map(u32::to_string).collect();
        writeln!(out, "{}", text.join(" ")).map_err(io)?;
    }
    out.flush().map_err(io)
}

/// Runs `tokenize`.
pub fn main(args: Args) -> ExitCode {
    super::common::exit_with("tokenize", run(&args))
}
