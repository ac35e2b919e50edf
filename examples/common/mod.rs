//! Helpers shared by the examples: the weight-store list, argument parsing, formatting.
#![allow(dead_code)]

use std::process::ExitCode;

use std::path::Path;

use std::path::PathBuf;

use clap::Parser;
use qwen_bpf::{Backend, Error, KvFormat, Result, Tokenizer};

/// Every weight store the examples offer ([`Backend::ALL`]).
pub const BACKENDS: &[Backend] = &Backend::ALL;

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

/// The names of [`BACKENDS`], comma-separated.
pub fn backend_names() -> String {
    BACKENDS
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
    if std::env::var_os(qwen_bpf::TOKENIZER_ENV).is_some_and(|v| !v.is_empty()) {
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

/// Sends the library's log records to stderr ([`StderrLogger`]); a second call does nothing.
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

/// The prompt when the model has a tokenizer (cut or repeated to the wanted length).
pub const PROMPT_TEXT: &str = "The old lighthouse keeper climbed the spiral stairs every evening at dusk, \
    counting the steps as his father had taught him. From the lamp room he could see the fishing \
    boats returning to the harbour, their lights scattered across the dark water like fallen stars. \
    He trimmed the wick, polished the great lens until it shone, and wrote the date, the weather and \
    the names of the boats in a leather logbook that had belonged to three keepers before him.";

/// The prompt without a tokenizer (cut or repeated to the wanted length): ordinary Qwen3 ids.
pub const PROMPT_IDS: [u32; 16] = [
    785, 3974, 13876, 38835, 916, 279, 15678, 5562, 13, 9707, 11, 1879, 220, 3555, 374, 264,
];

/// The fixed prompt of `n` tokens for the model in `dir`: [`PROMPT_TEXT`] encoded by its
/// tokenizer.json, else [`PROMPT_IDS`]; returns a description of the source and the ids.
/// An id outside the vocabulary is [`Error::TokenOutOfRange`].
pub fn prompt(dir: &Path, vocab: usize, n: usize) -> Result<(&'static str, Vec<u32>)> {
    let (source, base) = if dir.join("tokenizer.json").is_file() {
        let ids = Tokenizer::from_model_dir(dir)?.encode(PROMPT_TEXT)?;
        ("a fixed English text", ids)
    } else {
        ("fixed token ids (no tokenizer.json)", PROMPT_IDS.to_vec())
    };
    let prompt: Vec<u32> = base.iter().copied().cycle().take(n).collect();
    if let Some((index, &id)) = prompt
        .iter()
        .enumerate()
        .find(|(_, &id)| id as usize >= vocab)
    {
        return Err(Error::TokenOutOfRange { id, index, vocab });
    }
    Ok((source, prompt))
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
