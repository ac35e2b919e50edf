//! What the examples share beyond `qwen_bpf::cli::common` (argument parsers, logging, exit
//! codes, which this re-exports): the fixed prompt of the measuring examples.
#![allow(dead_code)]

use std::path::Path;

use qwen_bpf::{Backend, Error, Result, Tokenizer};

pub use qwen_bpf::cli::common::*;

/// Every weight store the examples offer ([`Backend::ALL`]).
pub const BACKENDS: &[Backend] = &Backend::ALL;

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
