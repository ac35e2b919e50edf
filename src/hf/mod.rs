//! The Hugging Face side: a model directory's `config.json` ([`config`]), its safetensors
//! weights ([`checkpoint`]), its `tokenizer.json` and chat template ([`tokenizer`]), and the
//! synthetic checkpoints written in the same layout ([`synth`], [`default_model`]), and the
//! byte-level BPE parts of a `tokenizer.json` the in-kernel tokenizer is built from
//! ([`tok_source`]).

pub mod checkpoint;
pub mod config;
pub mod default_model;
pub mod synth;
pub mod tok_source;
pub mod tokenizer;
