//! Feeds a token sequence one token at a time through a backend and writes every step's logits
//! to an `.npy` file, for comparing backends against each other.
//!
//! ```text
//! cargo run --release --example logits -- --model DIR --tokens 785,3974,13876 \
//!     --backend reference --out FILE.npy [--max-context N]
//! ```
//!
//! The output is an f32 array of shape `[n_tokens, vocab]`; row `i` holds the logits after token
//! `i` (i.e. the prediction for position `i + 1`).

use std::fs::File;
use std::io::BufWriter;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use clap::{Parser, ValueEnum};
use npyz::WriterBuilder;
use qwen_bpf::{Checkpoint, Error, Result};

/// Which engine computes the logits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum BackendKind {
    /// The f32 reference forward pass (`qwen_bpf::reference`).
    Reference,
}

#[derive(Debug, Parser)]
#[command(about = "Write the logits after each token of a sequence to an .npy file")]
struct Args {
    /// Model directory (config.json + safetensors).
    #[arg(long)]
    model: PathBuf,
    /// Comma-separated token ids, fed one at a time.
    #[arg(long, value_name = "ID,ID,...", value_delimiter = ',', required = true)]
    tokens: Vec<u32>,
    /// The engine to run.
    #[arg(long, value_enum)]
    backend: BackendKind,
    /// Output .npy file: f32, shape [n_tokens, vocab].
    #[arg(long)]
    out: PathBuf,
    /// KV-cache capacity in tokens (default: the number of tokens).
    #[arg(long)]
    max_context: Option<usize>,
}

/// One token in, one row of logits out.
trait Backend {
    fn forward(&mut self, token: u32) -> Result<Vec<f32>>;
}

impl Backend for qwen_bpf::reference::Reference {
    fn forward(&mut self, token: u32) -> Result<Vec<f32>> {
        qwen_bpf::reference::Reference::forward(self, token)
    }
}

fn open_backend(
    kind: BackendKind,
    ckpt: &Checkpoint,
    max_context: usize,
) -> Result<Box<dyn Backend + '_>> {
    Ok(match kind {
        BackendKind::Reference => Box::new(qwen_bpf::reference::Reference::new(ckpt, max_context)?),
    })
}

fn main() -> ExitCode {
    let args = Args::parse();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: &Args) -> Result<()> {
    let n = args.tokens.len();
    if n == 0 {
        return Err(Error::EmptyPrompt);
    }
    let max_context = args.max_context.unwrap_or(n);
    if max_context < n {
        return Err(Error::ContextOverflow {
            pos: max_context,
            max_context,
        });
    }

    let ckpt = Checkpoint::open(&args.model)?;
    let vocab = ckpt.config.vocab_size;
    if let Some((index, &id)) = args
        .tokens
        .iter()
        .enumerate()
        .find(|(_, &id)| id as usize >= vocab)
    {
        return Err(Error::TokenOutOfRange { id, index, vocab });
    }
    let mut backend = open_backend(args.backend, &ckpt, max_context)?;

    // Rows are streamed to a side file that replaces `out` only once every row is written, so a
    // failure never leaves a truncated .npy under the requested name.
    let mut partial = args.out.clone().into_os_string();
    partial.push(".partial");
    let partial = PathBuf::from(partial);
    let result = write_logits(backend.as_mut(), &args.tokens, vocab, &partial);
    let elapsed = match result {
        Ok(elapsed) => elapsed,
        Err(e) => {
            let _ = std::fs::remove_file(&partial);
            return Err(e);
        }
    };
    std::fs::rename(&partial, &args.out).map_err(|e| Error::io(&args.out, e))?;

    println!(
        "{} tokens, vocab {vocab}, backend {} -> {} ({:.2} ms/token)",
        n,
        args.backend
            .to_possible_value()
            .map_or_else(String::new, |v| v.get_name().to_string()),
        args.out.display(),
        elapsed * 1e3 / n as f64
    );
    Ok(())
}

/// Runs every token through `backend`, writing each row to `path`; returns the seconds spent in
/// the forward passes.
fn write_logits(
    backend: &mut dyn Backend,
    tokens: &[u32],
    vocab: usize,
    path: &Path,
) -> Result<f64> {
    let file = File::create(path).map_err(|e| Error::io(path, e))?;
    let io = |e| Error::io(path, e);
    let mut npy = npyz::WriteOptions::new()
        .default_dtype()
        .shape(&[tokens.len() as u64, vocab as u64])
        .writer(BufWriter::new(file))
        .begin_nd()
        .map_err(io)?;
    let mut seconds = 0.0;
    for (index, &token) in tokens.iter().enumerate() {
        let t = Instant::now();
        let logits = backend.forward(token)?;
        seconds += t.elapsed().as_secs_f64();
        if logits.len() != vocab {
            return Err(Error::Invalid(format!(
                "backend returned {} logits for token {token} at index {index}, expected {vocab}",
                logits.len()
            )));
        }
        npy.extend(logits.iter().copied()).map_err(io)?;
    }
    npy.finish().map_err(io)?;
    Ok(seconds)
}
