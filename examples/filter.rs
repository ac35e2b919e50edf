//! The packet filter: classifies packet payloads with a model and a rule file (issue 25).
//!
//! ```text
//! cargo run --release --example filter -- classify --model DIR --rule FILE \
//!     [--tokenizer FILE] [--backend q24] < payloads
//! ```
//!
//! `classify` reads one payload per line on stdin: the line's bytes without its `\n` (any other
//! byte, a `\r` before the `\n` included, is part of the payload, as in a packet; a rule with
//! `first_line` cuts the text there), and prints `label score` for each as soon as it is
//! classified (the chosen label's name and its log-probability in nats, 4 decimals). The
//! tokenizer is the model directory's `tokenizer.json` unless `--tokenizer` is given; the model
//! is opened with the context the rule needs (`CompiledRule::context_needed`). A summary goes to
//! stderr.

mod common;

use std::io::{BufRead, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use clap::{Args, Parser, Subcommand};
use qwen_bpf::{Backend, Error, Filter, FilterRule, Model, ModelOptions, Result, Tokenizer};

/// Classify packet payloads with a model and a rule.
#[derive(Debug, Parser)]
#[command(name = "filter")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

/// What to do.
#[derive(Debug, Subcommand)]
enum Command {
    /// Classify payloads read from stdin, one per line, in user space: prints `label score`.
    Classify(ClassifyArgs),
}

/// The model and rule of a filter.
#[derive(Debug, Args)]
struct FilterArgs {
    /// Hugging Face Qwen3 directory (config.json, model.safetensors, tokenizer.json).
    #[arg(long)]
    model: PathBuf,
    /// The rule file (JSON).
    #[arg(long)]
    rule: PathBuf,
    /// A tokenizer.json to use (default: the model directory's).
    #[arg(long)]
    tokenizer: Option<PathBuf>,
    /// Weight store.
    #[arg(long, default_value = "q24", value_parser = common::parse_backend)]
    backend: Backend,
}

/// `classify`'s arguments.
#[derive(Debug, Args)]
struct ClassifyArgs {
    #[command(flatten)]
    filter: FilterArgs,
}

fn main() -> ExitCode {
    match common::parse_args::<Cli>() {
        Ok(cli) => common::exit_with("filter", run(cli)),
        Err(code) => code,
    }
}

fn run(cli: Cli) -> Result<()> {
    match cli.command {
        Command::Classify(a) => classify(&a),
    }
}

/// The filter of `a`: the rule compiled with the tokenizer, the model opened with the context
/// the rule needs and the prefix fed.
fn open_filter(a: &FilterArgs) -> Result<Filter> {
    let tok = match &a.tokenizer {
        Some(t) => Tokenizer::from_file(t)?,
        None => Tokenizer::from_model_dir(&a.model)?,
    };
    let rule = FilterRule::load(&a.rule)?;
    let context = rule.compile(&tok)?.context_needed();
    let opts = ModelOptions::default()
        .with_backend(a.backend)
        .with_max_context(context);
    let model = Model::open(&a.model, &opts)?;
    Filter::new(model, &tok, rule)
}

fn classify(a: &ClassifyArgs) -> Result<()> {
    let mut filter = open_filter(&a.filter)?;
    let mut counts = vec![0usize; filter.rule().labels().len()];
    let (stdin, mut out) = (std::io::stdin().lock(), std::io::stdout().lock());
    let t0 = Instant::now();
    for line in stdin.split(b'\n') {
        let payload = line.map_err(|e| Error::io("stdin", e))?;
        let v = filter.classify(&payload)?;
        counts[v.label] += 1;
        writeln!(out, "{v}")
            .and_then(|()| out.flush())
            .map_err(|e| Error::io("stdout", e))?;
    }
    let n: usize = counts.iter().sum();
    let names = &filter.rule().rule().labels;
    let per_label: Vec<String> = names
        .iter()
        .zip(&counts)
        .map(|(l, c)| format!("{} {c}", l.name))
        .collect();
    eprintln!(
        "[{n} payloads: {}; {:.1} ms each]",
        per_label.join(", "),
        t0.elapsed().as_secs_f64() * 1e3 / n.max(1) as f64
    );
    common::warn_saturations(filter.model_mut().saturations());
    Ok(())
}
