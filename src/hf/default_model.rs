//! The default model: a synthetic checkpoint with the exact Qwen3-0.6B shapes, generated once on
//! first use so that the examples run without downloading anything.
//!
//! Its weights are random (with trained-like statistics, see [`crate::hf::synth`]), so the text it
//! generates is meaningless; it exercises the whole engine at the real size. For real output, pass
//! a Hugging Face Qwen3 directory (`config.json`, `model.safetensors`, `tokenizer.json`) instead.
//!
//! It lives in [`default_model_dir`]: `$QWEN_BPF_HOME`, else `$XDG_CACHE_HOME/qwen_bpf`, else
//! `~/.cache/qwen_bpf`, followed by `synthetic-qwen3-0.6b`. The checkpoint takes 1.2 GB; the Q24
//! weight cache that [`crate::Model::open`] writes next to it on first load takes 2.4 GB more.

use std::path::{Path, PathBuf};

use crate::hf::synth::{self, Preset, SynthOptions};
use crate::{Checkpoint, Error, Result};

/// The environment variable that overrides where the default model is kept.
pub const HOME_ENV: &str = "QWEN_BPF_HOME";

/// The default model's directory name inside the cache root.
pub const DIR_NAME: &str = "synthetic-qwen3-0.6b";

/// The seed the default model is generated with.
pub const SEED: u64 = 0;

/// Where qwen_bpf keeps generated models: `$QWEN_BPF_HOME`, else `$XDG_CACHE_HOME/qwen_bpf`, else
/// `$HOME/.cache/qwen_bpf`, else `qwen_bpf` in the system's temporary directory. Empty variables
/// count as unset.
pub fn cache_root() -> PathBuf {
    let var = |name: &str| {
        std::env::var_os(name)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    if let Some(home) = var(HOME_ENV) {
        return home;
    }
    if let Some(xdg) = var("XDG_CACHE_HOME") {
        return xdg.join("qwen_bpf");
    }
    if let Some(home) = var("HOME") {
        return home.join(".cache").join("qwen_bpf");
    }
    std::env::temp_dir().join("qwen_bpf")
}

/// The default model's directory: `cache_root``/synthetic-qwen3-0.6b`.
pub fn default_model_dir() -> PathBuf {
    cache_root().join(DIR_NAME)
}

/// The environment variable naming a Qwen3 `tokenizer.json` for the default model when
/// [`ensure_default_model`] is given none.
pub const TOKENIZER_ENV: &str = "QWEN_BPF_TOKENIZER";

/// The tokenizer named by `$QWEN_BPF_TOKENIZER` ([`TOKENIZER_ENV`]), if set and not empty.
fn tokenizer_from_env() -> Option<PathBuf> {
    std::env::var_os(TOKENIZER_ENV)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
}

/// Returns the default model's directory, generating the synthetic Qwen3-0.6B checkpoint (preset
/// `qwen3-0.6b`, seed 0) there first if it does not hold a valid one (one that
/// [`Checkpoint::open`] accepts). An existing checkpoint is reused untouched, so weight caches
/// keyed on its files stay valid.
///
/// The tokenizer copied in as `tokenizer.json` is `tokenizer` when given, else the file named
/// by `$QWEN_BPF_TOKENIZER` ([`TOKENIZER_ENV`]) if that is set. A given `tokenizer` also replaces
/// the copy in an existing directory; one from the environment is only added where there is
/// none. A tokenizer file that does not exist is [`Error::Io`]. Without any tokenizer the model
/// still works on token ids: callers cannot encode or decode text (a warning is logged).
///
/// What it does is logged (target `qwen_bpf`); `progress` shows a progress bar on stderr while
/// generating.
pub fn ensure_default_model(tokenizer: Option<&Path>, progress: bool) -> Result<PathBuf> {
    let dir = default_model_dir();
    let from_env = tokenizer_from_env();
    let given = tokenizer.map(Path::to_path_buf);
    let found = given.clone().or(from_env);
    if let Some(t) = &found {
        if !t.is_file() {
            return Err(Error::io(
                t,
                std::io::Error::new(std::io::ErrorKind::NotFound, "no such tokenizer file"),
            ));
        }
    }
    let dest = dir.join("tokenizer.json");
    if Checkpoint::open(&dir).is_ok() {
        match (&given, &found) {
            (Some(t), _) => copy_atomically(t, &dest)?,
            (None, Some(t)) if !dest.is_file() => copy_atomically(t, &dest)?,
            _ => {}
        }
    } else {
        log::info!(
            "generating the default model (synthetic Qwen3-0.6B shapes, random weights, seed {SEED}) in {} (1.2 GB, once)",
            dir.display()
        );
        let opts = SynthOptions {
            seed: SEED,
            tokenizer: found.clone(),
            progress,
            ..Default::default()
        };
        synth::write_checkpoint(&dir, &Preset::Qwen3_0_6B.config(), &opts)?;
    }
    if !dest.is_file() {
        log::warn!(
            "no tokenizer.json for the default model in {} (give one, or set ${TOKENIZER_ENV}): \
             the model works on token ids only; text cannot be encoded or decoded",
            dir.display()
        );
    }
    Ok(dir)
}

/// Copies `from` to `to` through a temporary file in `to`'s directory and a rename.
fn copy_atomically(from: &Path, to: &Path) -> Result<()> {
    let bytes = std::fs::read(from).map_err(|e| Error::io(from, e))?;
    synth::write_atomic(to, &bytes)
}
