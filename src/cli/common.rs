//! What the subcommands share: argument parsers, the sampling flags, logging, exit codes.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::Parser;

use crate::{Backend, KvFormat, Result, SamplingParams, XdpMode};

/// The store called `s` on the command line ([`Backend::from_name`]).
pub fn parse_backend(s: &str) -> Result<Backend, String> {
    Backend::from_name(s)
        .ok_or_else(|| format!("unknown backend {s:?}; known: {}", backend_names()))
}

/// The KV format called `s` on the command line ([`KvFormat::from_name`]).
pub fn parse_kv(s: &str) -> Result<KvFormat, String> {
    KvFormat::from_name(s).ok_or_else(|| {
        let known: Vec<_> = KvFormat::ALL.iter().map(|f| f.name()).collect();
        format!("unknown KV format {s:?}; known: {}", known.join(", "))
    })
}

/// The names of [`Backend::ALL`], comma-separated.
pub fn backend_names() -> String {
    Backend::ALL
        .iter()
        .map(|b| b.name())
        .collect::<Vec<_>>()
        .join(", ")
}

/// Where the examples look for a Qwen3 `tokenizer.json` for the default model when none is given:
/// `$QWEN_BPF_TOKENIZER` (which the library reads itself), else
/// `../shared/qwen3-tokenizer/tokenizer.json` next to this source tree, else the same path
/// relative to the current directory. The first existing file wins.
pub fn find_tokenizer() -> Option<PathBuf> {
    if std::env::var_os(crate::TOKENIZER_ENV).is_some_and(|v| !v.is_empty()) {
        return None; // the library uses the variable
    }
    let rel = Path::new("..")
        .join("shared")
        .join("qwen3-tokenizer")
        .join("tokenizer.json");
    let mut candidates = vec![Path::new(env!("CARGO_MANIFEST_DIR")).join(&rel)];
    if let Ok(cwd) = std::env::current_dir() {
        candidates.push(cwd.join(&rel));
    }
    candidates.into_iter().find(|p| p.is_file())
}

/// Prints the library's log records at `info` and above to stderr as `qwen_bpf: message`
/// (`warn` and `error` records say so), so that an example shows what the library does.
struct StderrLogger;

impl log::Log for StderrLogger {
    fn enabled(&self, m: &log::Metadata<'_>) -> bool {
        m.level() <= log::Level::Info
    }

    fn log(&self, r: &log::Record<'_>) {
        if self.enabled(r.metadata()) {
            let target = r.target().split("::").next().unwrap_or("");
            match r.level() {
                log::Level::Info => eprintln!("{target}: {}", r.args()),
                level => eprintln!("{target}: {}: {}", level.as_str().to_lowercase(), r.args()),
            }
        }
    }

    fn flush(&self) {}
}

/// Sends the library's log records to stderr (`StderrLogger`); a second call does nothing.
pub fn init_logging() {
    static LOGGER: StderrLogger = StderrLogger;
    if log::set_logger(&LOGGER).is_ok() {
        log::set_max_level(log::LevelFilter::Info);
    }
}

/// Parses the command line (after [`init_logging`]); usage errors exit with 1 like every other
/// error (clap's own convention is 2), `--help` with 0.
pub fn parse_args<T: Parser>() -> Result<T, ExitCode> {
    init_logging();
    T::try_parse().map_err(|e| {
        let _ = e.print();
        if e.use_stderr() {
            ExitCode::FAILURE
        } else {
            ExitCode::SUCCESS
        }
    })
}

/// Runs `f`, printing its error (Display) to stderr with `name` and exiting with 1.
pub fn exit_with<E: std::fmt::Display>(name: &str, result: Result<(), E>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{name}: error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// `bytes` in MiB with one decimal.
pub fn mib(bytes: usize) -> String {
    format!("{:.1} MiB", bytes as f64 / (1024.0 * 1024.0))
}

/// Warns on stderr when the kernels clamped `n` values to their fixed-point range: the output may
/// then be far from the f32 reference (docs/safety.md, "Fixed-point headroom").
pub fn warn_saturations(n: u64) {
    if n > 0 {
        eprintln!(
            "warning: {n} values saturated their fixed-point format (e.g. an activation beyond \
             ±32768); the logits may be far from the f32 reference (docs/safety.md, \"Fixed-point headroom\")"
        );
    }
}

/// How XDP is attached, as `--xdp-mode` spells it: `auto`, `generic` (or `skb`), `native` (or
/// `driver`).
pub fn parse_xdp_mode(s: &str) -> Result<XdpMode, String> {
    match s {
        "auto" => Ok(XdpMode::Auto),
        "generic" | "skb" => Ok(XdpMode::Generic),
        "native" | "driver" => Ok(XdpMode::Native),
        _ => Err(format!(
            "unknown XDP mode {s:?}; known: auto, generic, native"
        )),
    }
}

/// The sampling flags, one spelling for every subcommand that samples (`generate`, `ask`):
/// applied in the order penalties, top-k, top-p, min-p, temperature ([`SamplingParams`]).
#[derive(Debug, Clone, clap::Args)]
pub struct SamplingArgs {
    /// Sampling temperature; 0 is greedy (the BPF argmax).
    #[arg(long, default_value_t = 0.0)]
    pub temperature: f32,
    /// Sample from the K most likely tokens only; 0 keeps all.
    #[arg(long, default_value_t = 0)]
    pub top_k: usize,
    /// Sample from the smallest set of most likely tokens with probability >= P; 1 keeps all.
    #[arg(long, default_value_t = 1.0)]
    pub top_p: f32,
    /// Drop tokens less than P times as likely as the most likely one; 0 keeps all.
    #[arg(long, default_value_t = 0.0)]
    pub min_p: f32,
    /// Repetition penalty on tokens already seen (prompt included); 1 is off.
    #[arg(long, alias = "repeat-penalty", default_value_t = 1.0)]
    pub repetition_penalty: f32,
    /// Subtracted from the logit of every token already seen; 0 is off (not carried by `ask`'s
    /// requests).
    #[arg(long, default_value_t = 0.0)]
    pub presence_penalty: f32,
    /// Subtracted from a token's logit once per time it was seen; 0 is off (not carried by
    /// `ask`'s requests).
    #[arg(long, default_value_t = 0.0)]
    pub frequency_penalty: f32,
    /// Seed of the sampler's random generator (default: a random seed).
    #[arg(long)]
    pub seed: Option<u64>,
}

impl SamplingArgs {
    /// The sampling parameters, validated ([`SamplingParams::validate`]).
    pub fn params(&self) -> Result<SamplingParams> {
        let mut p = SamplingParams::new(self.temperature)
            .with_top_k(self.top_k)
            .with_top_p(self.top_p)
            .with_min_p(self.min_p)
            .with_repetition_penalty(self.repetition_penalty)
            .with_presence_penalty(self.presence_penalty)
            .with_frequency_penalty(self.frequency_penalty);
        if let Some(seed) = self.seed {
            p = p.with_seed(seed);
        }
        p.validate()?;
        Ok(p)
    }
}
