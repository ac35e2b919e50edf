//! # qwen_bpf
//!
//! The Qwen3 forward pass inside Linux eBPF. Verifier-checked, JIT-compiled `SEC("syscall")`
//! programs do every matrix product, norm, RoPE rotation, attention step and the final argmax in
//! fixed-point integers; Rust does the tokenizer, weight loading and conversion, and scheduling.
//!
//! Layout: [`config`] and [`checkpoint`] read Hugging Face directories, [`synth`] writes synthetic
//! ones, [`mod@reference`] is the f32 ground truth, [`tokenizer`] wraps `tokenizers`, [`kernel`] is the
//! BPF side. [`Model::generate`] ([`mod@generate`]) streams generated tokens, chosen greedily or by
//! [`sampling`].
#![warn(missing_docs)]

pub mod checkpoint;
pub mod config;
pub mod default_model;
pub mod error;
pub mod fixed;
pub mod generate;
pub mod kernel;
pub mod kv;
pub mod kv8;
pub mod limits;
pub mod model;
pub mod reference;
pub mod sampling;
pub mod screen;
pub mod store;
pub mod swar;
pub mod synth;
pub mod tokenizer;
pub mod twin;

pub use checkpoint::Checkpoint;
pub use config::Config;
pub use error::{Error, Result};
pub use generate::{FinishReason, GenerateOptions, Generation, TextGeneration};
pub use kv::KvFormat;
pub use model::{KernelMemory, Model, ModelOptions};
pub use sampling::{Sampler, SamplingParams};
pub use store::Backend;

/// A progress bar on stderr for long conversions (`total` items).
pub(crate) fn progress_bar(total: u64, what: &str) -> indicatif::ProgressBar {
    let bar = indicatif::ProgressBar::new(total);
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "{msg:>6} [{bar:40}] {percent:>3}% {elapsed_precise} eta {eta}",
        )
        .expect("static template")
        .progress_chars("=> "),
    );
    bar.set_message(what.to_string());
    bar
}
