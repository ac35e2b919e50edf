//! # qwen_bpf
//!
//! The Qwen3 forward pass inside Linux eBPF. Verifier-checked, JIT-compiled `SEC("syscall")`
//! programs do every matrix product, norm, RoPE rotation, attention step and the final argmax in
//! fixed-point integers; Rust does the tokenizer, weight loading and conversion, and scheduling.
//!
//! ```no_run
//! use qwen_bpf::{GenerateOptions, Model, ModelOptions, SamplingParams, Tokenizer};
//!
//! # fn main() -> qwen_bpf::Result<()> {
//! let dir = std::path::Path::new("/path/to/Qwen3-0.6B");
//! let tok = Tokenizer::from_model_dir(dir)?;
//! let mut model = Model::open(dir, &ModelOptions::default().with_max_context(256))?;
//! let opts = GenerateOptions::new(64)
//!     .with_stop_tokens(tok.eos_ids())
//!     .with_sampling(SamplingParams::new(0.7).with_top_p(0.9).with_seed(1));
//! for piece in model.generate(&tok.encode_chat("What is eBPF?")?, &opts)?.text(&tok) {
//!     print!("{}", piece?);
//! }
//! # Ok(())
//! # }
//! ```
//!
//! - [`Model`] opens a Hugging Face Qwen3 directory ([`Checkpoint`], [`Config`]) with
//!   [`ModelOptions`]: a weight store ([`Backend`]), a KV-cache format ([`KvFormat`]) and size.
//!   [`Model::generate`] streams tokens ([`Generation`], [`TextGeneration`]) chosen greedily by
//!   the BPF argmax or drawn with [`SamplingParams`] by the integer sampler that the kernel runs
//!   too (one seed, one text on every path; [`Sampler`] is its f32 reference).
//! - The kernel runs the step of each token in one BPF invocation per thread ([`Dispatch`]);
//!   [`Model::generate_in_kernel`] runs a whole generation in the kernel, greedy or sampled, streaming tokens
//!   and their text on a ring buffer ([`KernelGeneration`]); [`Model::serve_events`] lets a UDP
//!   datagram start one, with no system call driving it ([`EventServer`]);
//!   [`Model::install`] leaves a model in the kernel that answers datagrams itself, with no
//!   process left running ([`Installed`], [`wire`]).
//! - [`Reference`] is the f32 forward pass the fixed-point engine is measured against; both
//!   implement [`Forward`].
//! - [`filter`]: the packet filter. [`filter::Filter`] classifies packet payloads by a
//!   [`filter::FilterRule`] (a JSON file: the prompt around the payload's text, the labels to
//!   choose between and their actions), scoring each label in integers as the kernel does;
//!   [`filter::InstalledFilter`] is the filter left in the kernel.
//! - [`Tokenizer`] is the Qwen3 tokenizer and chat template; [`ensure_default_model`] writes the
//!   synthetic Qwen3-0.6B-shaped model the examples fall back to.
//! - Every failure is an [`Error`]. The library reports what it does (cache rebuilds, default
//!   model generation) through the [`log`](https://docs.rs/log) crate; progress bars are shown
//!   only when [`ModelOptions::progress`] asks for them.
//!
//! The internals (the layers below) are private; the `internals` feature makes them public,
//! undocumented and outside semver, for this crate's own tests, benches, examples and `dev/`.
#![warn(missing_docs)]
#![cfg_attr(not(feature = "internals"), allow(dead_code))]

/// Declares the crate's layers: public (and hidden from the docs) with the `internals` feature,
/// private without it. The order is the layering (`tests/layers.rs` checks it): a module may use
/// its own layer and those listed before it, never one after it.
macro_rules! layers {
    ($($(#[$m:meta])* $name:ident;)*) => {$(
        $(#[$m])*
        #[cfg(feature = "internals")]
        #[doc(hidden)]
        pub mod $name;
        $(#[$m])*
        #[cfg(not(feature = "internals"))]
        mod $name;
    )*};
}

layers! {
    error;
    hf;
    types;
    forward;
    num;
    kernel;
    store;
    verify;
    model;
    run;
}

/// The `qwen-bpf` command line: one module per subcommand, which the `qwen-bpf` binary and the
/// examples of the same names run. Outside semver; the library API is the crate root.
#[cfg(feature = "cli")]
#[doc(hidden)]
pub mod cli;

pub use error::{Error, Result};
pub use forward::Forward;
pub use hf::checkpoint::Checkpoint;
pub use hf::config::{Config, RopeParameters};
pub use hf::default_model::{default_model_dir, ensure_default_model, TOKENIZER_ENV};
pub use hf::tokenizer::{TextStream, Tokenizer};
pub use kernel::check_kernel;
pub use kernel::features::{probe, Feature, ProbeReport};
pub use kernel::memory::MemoryLayer;
pub use kernel::pins::XdpMode;
pub use kernel::report::{program_loads, ProgramLoad};
pub use kernel::tokenize::KernelTokenizer;
pub use kernel::verifier::ProgramKind;
pub use model::kv::saved_position;
pub use model::{KernelMemory, Model, ModelOptions};
pub use run::event::{
    request_datagram, Event, EventConfig, EventCounters, EventServer, RateLimit, Refusal,
};
pub use run::filter;
pub use run::generate::{FinishReason, GenerateOptions, Generation, TextGeneration};
pub use run::in_kernel::{KernelGeneration, KernelText};
pub use run::sampling::{Candidate, Sampler, SamplingParams};
pub use run::serve::{InstallConfig, InstallStatus, Installed};
pub use run::wire;
pub use types::{Backend, Dispatch, KvFormat};
pub use verify::reference::Reference;

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
