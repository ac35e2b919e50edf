//! Feeds a token sequence one token at a time through a backend and writes every step's logits
//! to an `.npy` file, for comparing backends against each other.
//!
//! ```text
//! cargo run --release --example logits -- --model DIR --tokens 785,3974,13876 \
//!     --backend reference|q24 --out FILE.npy [--max-context N] [--cache-dir DIR] \
//!     [--kv q16|int8] [--load-context FILE] [--save-context FILE]
//! ```
//!
//! With `--load-context` the tokens continue a saved context (written by `--save-context` or
//! `generate --save-context`); `--save-context` saves the context after the last token.
//!
//! `reference` is the f32 reference forward pass; any other backend is a weight store of the BPF
//! engine (`qwen_bpf::Model`), whose Q16 logits are converted to f32.
//!
//! The output is an f32 array of shape `[n_tokens, vocab]`; row `i` holds the logits after token
//! `i` (i.e. the prediction for position `i + 1`).

use std::io::BufWriter;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

mod common;

use clap::Parser;
use npyz::WriterBuilder;
use qwen_bpf::{Checkpoint, Error, Forward, KvFormat, Model, ModelOptions, Reference, Result};

/// Which engine computes the logits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum BackendKind {
    /// The f32 reference forward pass (`qwen_bpf::Reference`).
    Reference,
    /// The BPF engine with this weight store.
    Bpf(qwen_bpf::Backend),
}

impl BackendKind {
    fn name(self) -> &'static str {
        match self {
            BackendKind::Reference => "reference",
            BackendKind::Bpf(b) => b.name(),
        }
    }
}

fn parse_backend_kind(s: &str) -> std::result::Result<BackendKind, String> {
    if s.eq_ignore_ascii_case("reference") {
        return Ok(BackendKind::Reference);
    }
    common::parse_backend(s).map(BackendKind::Bpf).map_err(|_| {
        format!(
            "unknown backend {s:?}; known: reference, {}",
            common::backend_names()
        )
    })
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
    /// The engine to run: "reference" (f32) or a BPF weight store ("q24", ...).
    #[arg(long, value_parser = parse_backend_kind)]
    backend: BackendKind,
    /// Output .npy file: f32, shape [n_tokens, vocab].
    #[arg(long)]
    out: PathBuf,
    /// KV-cache capacity in tokens (default: the number of tokens).
    #[arg(long)]
    max_context: Option<usize>,
    /// Where BPF weight stores keep their converted-weight cache (default: the model directory).
    #[arg(long)]
    cache_dir: Option<PathBuf>,
    /// The KV-cache format of the BPF engine: q16 (exact) or int8.
    #[arg(long, default_value = "q16", value_parser = common::parse_kv)]
    kv: KvFormat,
    /// Continue a saved context (BPF engine only).
    #[arg(long)]
    load_context: Option<PathBuf>,
    /// Save the context after the last token (BPF engine only).
    #[arg(long)]
    save_context: Option<PathBuf>,
}

/// One token in, one row of logits out ([`Forward`]), and the context saved at the end.
trait Backend: Forward {
    fn save_context(&self, path: &Path) -> Result<()>;
    /// Values clamped to their fixed-point range (0 for the f32 reference).
    fn saturations(&self) -> u64 {
        0
    }
}

impl Backend for Reference {
    fn save_context(&self, _: &Path) -> Result<()> {
        Err(Error::Invalid("--save-context needs a BPF backend".into()))
    }
}

impl Backend for Model {
    fn save_context(&self, path: &Path) -> Result<()> {
        Model::save_context(self, path)
    }
    fn saturations(&self) -> u64 {
        Model::saturations(self)
    }
}

fn open_backend<'a>(
    args: &Args,
    ckpt: &'a Checkpoint,
    max_context: usize,
) -> Result<Box<dyn Backend + 'a>> {
    Ok(match args.backend {
        BackendKind::Reference if args.load_context.is_some() => {
            return Err(Error::Invalid("--load-context needs a BPF backend".into()))
        }
        BackendKind::Reference => Box::new(Reference::new(ckpt, max_context)?),
        BackendKind::Bpf(backend) => {
            let opts = ModelOptions {
                backend,
                max_context,
                kv: args.kv,
                cache_dir: args.cache_dir.clone(),
                progress: true,
                ..Default::default()
            };
            let mut model = Model::open(&args.model, &opts)?;
            if let Some(path) = &args.load_context {
                model.load_context(path)?;
            }
            Box::new(model)
        }
    })
}

fn main() -> ExitCode {
    match common::parse_args::<Args>() {
        Ok(args) => common::exit_with("logits", run(&args)),
        Err(code) => code,
    }
}

fn run(args: &Args) -> Result<()> {
    let n = args.tokens.len();
    if n == 0 {
        return Err(Error::EmptyPrompt);
    }
    let saved = match &args.load_context {
        Some(path) => qwen_bpf::saved_position(path)?,
        None => 0,
    };
    let max_context = args.max_context.unwrap_or(saved + n);
    if max_context < saved + n {
        return Err(Error::ContextOverflow {
            pos: max_context,
            max_context,
            tokens: n,
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
    let mut backend = open_backend(args, &ckpt, max_context)?;

    // Rows are streamed to a temporary file beside `out` that replaces it only once every row is
    // written (and is deleted on failure), so a failure never leaves a truncated .npy behind.
    let dir = match args.out.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let mut tmp = tempfile::Builder::new()
        .permissions(std::os::unix::fs::PermissionsExt::from_mode(0o644))
        .tempfile_in(dir)
        .map_err(|e| Error::io(dir, e))?;
    let elapsed = write_logits(backend.as_mut(), &args.tokens, vocab, &mut tmp)?;
    tmp.persist(&args.out)
        .map_err(|e| Error::io(&args.out, e.error))?;
    if let Some(path) = &args.save_context {
        backend.save_context(path)?;
    }

    common::warn_saturations(backend.saturations());
    println!(
        "{} tokens, vocab {vocab}, backend {} -> {} ({:.2} ms/token)",
        n,
        args.backend.name(),
        args.out.display(),
        elapsed * 1e3 / n as f64
    );
    Ok(())
}

/// Runs every token through `backend`, writing each row to `file`; returns the seconds spent in
/// the forward passes.
fn write_logits(
    backend: &mut dyn Backend,
    tokens: &[u32],
    vocab: usize,
    file: &mut tempfile::NamedTempFile,
) -> Result<f64> {
    let path = file.path().to_path_buf();
    let io = |e| Error::io(&path, e);
    let mut npy = npyz::WriteOptions::new()
        .default_dtype()
        .shape(&[tokens.len() as u64, vocab as u64])
        .writer(BufWriter::new(file.as_file_mut()))
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
