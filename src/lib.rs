//! # qwen_bpf
//!
//! The Qwen3 forward pass inside Linux eBPF. Verifier-checked, JIT-compiled `SEC("syscall")`
//! programs do every matrix product, norm, RoPE rotation, attention step and the final argmax in
//! fixed-point integers; Rust does the tokenizer, weight loading and conversion, and scheduling.
//!
//! Layout: [`config`] and [`checkpoint`] read Hugging Face directories, [`synth`] writes synthetic
//! ones, [`reference`] is the f32 ground truth, [`tokenizer`] wraps `tokenizers`, [`kernel`] is the
//! BPF side.
#![warn(missing_docs)]

pub mod checkpoint;
pub mod config;
pub mod error;
pub mod fixed;
pub mod kernel;
pub mod reference;
pub mod synth;
pub mod tokenizer;

pub use checkpoint::Checkpoint;
pub use config::Config;
pub use error::{Error, Result};
