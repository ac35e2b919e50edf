//! Greedy text generation with the BPF forward pass, streaming the text as it is generated.
//!
//! ```text
//! cargo run --release --example generate -- [--model DIR] [--prompt TEXT] [--max-tokens N] \
//!     [--backend q24] [--chat] [--max-context N] [--tokenizer FILE] [--tokens ID,ID,...]
//! ```
//!
//! Without `--model` it uses the default model (`qwen_bpf::default_model`): a synthetic checkpoint
//! with the Qwen3-0.6B shapes and random weights, generated once. Its text is meaningless.
//!
//! The prompt is fed one token at a time (each token is one forward pass, 227 BPF runs at the
//! 0.6B shape), then tokens are chosen greedily by the BPF LM head's argmax
//! ([`Model::next_token`]) until an end-of-sequence token, `--max-tokens` or a full context.
//! A summary goes to stderr at the end.

mod common;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::Parser;
use qwen_bpf::default_model;
use qwen_bpf::tokenizer::{TextStream, Tokenizer};
use qwen_bpf::{Backend, Config, Error, Model, ModelOptions, Result};

/// Generate text greedily with the Qwen3 forward pass in BPF.
#[derive(Debug, Parser)]
#[command(name = "generate")]
struct Args {
    /// Hugging Face Qwen3 directory (config.json, model.safetensors, tokenizer.json). Default:
    /// a synthetic Qwen3-0.6B with random weights, generated on first use.
    #[arg(long)]
    model: Option<PathBuf>,
    /// The prompt text.
    #[arg(long, default_value = "Once upon a time")]
    prompt: String,
    /// The prompt as comma-separated token ids instead of text.
    #[arg(
        long,
        value_name = "ID,ID,...",
        value_delimiter = ',',
        conflicts_with = "chat"
    )]
    tokens: Option<Vec<u32>>,
    /// The most tokens to generate.
    #[arg(long, default_value_t = 32, value_parser = clap::value_parser!(u32).range(1..))]
    max_tokens: u32,
    /// The weight store.
    #[arg(long, default_value = "q24", value_parser = common::parse_backend)]
    backend: Backend,
    /// Wrap the prompt in the Qwen3 chat template (one user turn).
    #[arg(long)]
    chat: bool,
    /// KV-cache capacity in tokens (default: prompt + max tokens); generation stops when full.
    #[arg(long)]
    max_context: Option<usize>,
    /// A tokenizer.json to use (default: the model directory's).
    #[arg(long)]
    tokenizer: Option<PathBuf>,
    /// Where the converted-weight cache goes (default: the model directory).
    #[arg(long)]
    cache_dir: Option<PathBuf>,
}

fn main() -> ExitCode {
    match common::parse_args::<Args>() {
        Ok(args) => common::exit_with("generate", run(&args)),
        Err(code) => code,
    }
}

fn run(args: &Args) -> Result<()> {
    let dir = match &args.model {
        Some(dir) => dir.clone(),
        None => {
            let dir = default_model::ensure_default_model(args.tokenizer.as_deref(), true)?;
            eprintln!(
                "note: no --model given, so this is the synthetic Qwen3-0.6B in {}.\n\
                 note: its weights are random: the text it generates is meaningless (it exercises the engine at the real size).\n\
                 note: for real text pass --model /path/to/Qwen3-0.6B, a Hugging Face directory with config.json, \
                 model.safetensors and tokenizer.json.",
                dir.display()
            );
            dir
        }
    };
    let cfg = Config::from_file(&dir.join("config.json"))?;
    let tokenizer = open_tokenizer(&dir, args.tokenizer.as_deref())?;

    // The prompt, as ids.
    let (prompt, echo): (Vec<u32>, Option<String>) = match (&args.tokens, &tokenizer) {
        (Some(ids), Some(tok)) => (ids.clone(), tok.decode(ids).ok()),
        (Some(ids), None) => (ids.clone(), None),
        (None, Some(tok)) if args.chat => (tok.encode_chat(&args.prompt)?, None),
        (None, Some(tok)) => (tok.encode(&args.prompt)?, Some(args.prompt.clone())),
        (None, None) if args.chat => {
            return Err(Error::Invalid(
                "--chat needs a tokenizer: the model directory has no tokenizer.json; pass --tokenizer FILE".into(),
            ))
        }
        (None, None) => {
            eprintln!(
                "note: no tokenizer: the prompt is fed as raw UTF-8 bytes (Qwen's byte-level tokens 0-255, no merges) \
                 and generated tokens are printed as <id>; pass --tokenizer FILE for text"
            );
            (args.prompt.bytes().map(byte_token).collect(), Some(args.prompt.clone()))
        }
    };
    if prompt.is_empty() {
        return Err(Error::EmptyPrompt);
    }
    if let Some((index, &id)) = prompt
        .iter()
        .enumerate()
        .find(|(_, &id)| id as usize >= cfg.vocab_size)
    {
        return Err(Error::TokenOutOfRange {
            id,
            index,
            vocab: cfg.vocab_size,
        });
    }
    let max_tokens = args.max_tokens as usize;
    let max_context = match args.max_context {
        Some(m) => m,
        None => (prompt.len() + max_tokens - 1).min(cfg.max_position_embeddings),
    };
    if prompt.len() > max_context {
        return Err(Error::Invalid(format!(
            "the prompt has {} tokens but the context holds {max_context} (--max-context)",
            prompt.len()
        )));
    }
    // <|im_end|> and <|endoftext|> (or, without a tokenizer, the config's eos_token_id).
    let eos: Vec<u32> = match &tokenizer {
        Some(tok) => tok.eos_ids(),
        None => cfg.eos_token_id.into_iter().collect(),
    };

    eprintln!(
        "loading {} with the {} store (max context {max_context}; a first load converts the weights into a cache file, which takes a while)",
        dir.display(),
        args.backend.name()
    );
    let t = Instant::now();
    let opts = ModelOptions {
        backend: args.backend,
        max_context,
        cache_dir: args.cache_dir.clone(),
        progress: true,
        ..Default::default()
    };
    let mut model = Model::open(&dir, &opts)?;
    let load = t.elapsed();

    let mut out = Output {
        stdout: std::io::stdout().lock(),
        stream: tokenizer.as_ref().map(Tokenizer::stream),
    };
    if let Some(text) = &echo {
        out.write(text)?;
    }

    // Prefill: every prompt token is one forward pass; the last one yields the first new token.
    let runs0 = model.bpf_runs();
    let t = Instant::now();
    let mut next = 0;
    for &id in &prompt {
        next = model.next_token(id)?;
    }
    let prefill = t.elapsed();

    // Decode.
    let (mut generated, mut decode, mut decode_passes) = (0usize, Duration::ZERO, 0usize);
    let stop = loop {
        if eos.contains(&next) {
            break format!("end-of-sequence token {next}");
        }
        out.token(next)?;
        generated += 1;
        if generated == max_tokens {
            break "--max-tokens reached".to_string();
        }
        if model.position() == model.max_context() {
            break format!("context full ({} tokens)", model.max_context());
        }
        let t = Instant::now();
        next = model.next_token(next)?;
        decode += t.elapsed();
        decode_passes += 1;
    };
    out.finish()?;

    let passes = prompt.len() + decode_passes;
    let runs = model.bpf_runs() - runs0;
    let mem = model.kernel_memory();
    eprintln!("--- stopped: {stop}");
    eprintln!(
        "prompt:    {} tokens, prefill {:.2} s ({:.1} ms/token)",
        prompt.len(),
        prefill.as_secs_f64(),
        prefill.as_secs_f64() * 1e3 / prompt.len() as f64
    );
    if decode_passes > 0 {
        let ms = decode.as_secs_f64() * 1e3 / decode_passes as f64;
        eprintln!(
            "generated: {generated} tokens; decode {ms:.1} ms/token, {:.2} tokens/s ({decode_passes} forward passes after the prompt)",
            1e3 / ms
        );
    } else {
        eprintln!("generated: {generated} tokens (all from the prompt's last forward pass: no decode step to time)");
    }
    eprintln!(
        "BPF runs:  {} per token ({runs} in {passes} forward passes)",
        runs / passes as u64
    );
    eprintln!(
        "load:      {:.2} s ({} store, {})",
        load.as_secs_f64(),
        model.backend_name(),
        dir.display()
    );
    eprintln!(
        "kernel memory: {} (weights {}, KV cache {}, scratch {})",
        common::mib(mem.total()),
        common::mib(mem.weights),
        common::mib(mem.kv_cache),
        common::mib(mem.scratch)
    );
    Ok(())
}

/// The tokenizer: `explicit` if given, else `dir/tokenizer.json` if present, else none.
fn open_tokenizer(dir: &Path, explicit: Option<&Path>) -> Result<Option<Tokenizer>> {
    if let Some(path) = explicit {
        return Tokenizer::from_file(path).map(Some);
    }
    if dir.join("tokenizer.json").is_file() {
        return Tokenizer::from_model_dir(dir).map(Some);
    }
    eprintln!("note: {} has no tokenizer.json", dir.display());
    Ok(None)
}

/// The id of byte `b`'s token in Qwen's byte-level vocabulary: ids 0-255 are the 256 bytes in
/// the GPT-2 byte-to-unicode order (the printable bytes `!`..`~`, `¡`..`¬`, `®`..`ÿ` first, in
/// byte order, then the others in byte order).
fn byte_token(b: u8) -> u32 {
    let printable = |c: u8| matches!(c, 33..=126 | 161..=172 | 174..=255);
    let before = (0..b).filter(|&c| printable(c) == printable(b)).count() as u32;
    if printable(b) {
        before
    } else {
        188 + before
    }
}

/// Generated text on stdout, flushed token by token.
struct Output<'a> {
    stdout: std::io::StdoutLock<'static>,
    stream: Option<TextStream<'a>>,
}

impl Output<'_> {
    fn write(&mut self, text: &str) -> Result<()> {
        let io = |e| Error::io("<stdout>", e);
        self.stdout.write_all(text.as_bytes()).map_err(io)?;
        self.stdout.flush().map_err(io)
    }

    /// Prints token `id`: its text, or `<id>` without a tokenizer or for ids the tokenizer has no
    /// token for (the padding rows of the embedding table, ≥ 151,669 for Qwen3).
    fn token(&mut self, id: u32) -> Result<()> {
        let Some(stream) = self.stream.as_mut() else {
            return self.write(&format!("<{id}>"));
        };
        match stream.push(id) {
            Ok(Some(piece)) => self.write(&piece),
            Ok(None) => Ok(()),
            Err(Error::TokenOutOfRange { .. }) => {
                // The stream refused the id before taking it: flush what it holds, then the id.
                let held = stream.finish()?.unwrap_or_default();
                self.write(&format!("{held}<{id}>"))
            }
            Err(e) => Err(e),
        }
    }

    fn finish(&mut self) -> Result<()> {
        let rest = match self.stream.as_mut() {
            Some(s) => s.finish()?.unwrap_or_default(),
            None => String::new(),
        };
        self.write(&format!("{rest}\n"))
    }
}
