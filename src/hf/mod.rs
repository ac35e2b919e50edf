//! The Hugging Face side: a model directory's `config.json` ([`config`]), its safetensors
//! weights ([`checkpoint`]), its `tokenizer.json` and chat template ([`tokenizer`]), and the
//! synthetic checkpoints written in the same layout ([`synth`], [`default_model`]).

pub mod checkpoint;
pub mod config;
pub mod default_model;
pub mod synth;
pub mod tokenizer;
