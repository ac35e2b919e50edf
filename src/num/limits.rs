//! Every size bound of the kernels, in one table: the Rust mirror of `src/bpf/limits.h` (the
//! `formats` program reports the C values, and a test checks that the two agree).
//!
//! [`check`] compares a model's dimensions with them when the model is opened, before anything is
//! converted or loaded, so a config that [`Config::validate`](crate::Config::validate) accepts but
//! the kernels cannot run is refused with [`Error::Limit`] naming the dimension, its value and
//! the limit, instead of computing truncated sums or panicking in a converter.

use crate::types::KvFormat;
use crate::types::Backend;
use crate::{Config, Error, Result};

/// Columns of one dot product, i.e. the width of every matrix (hidden, q_dim, intermediate):
/// the Q24 and SWAR dot-product loops are bounded by it. `LIM_COLS_MAX`.
pub const COLS_MAX: usize = 16384;
/// The Q24 matvec reads 8 columns per step: widths are multiples of it. `LIM_Q24_COLS_ALIGN`.
pub const Q24_COLS_ALIGN: usize = 8;
/// The SWAR (int4/int8) matvec quantises per group of 32 columns. `LIM_SWAR_COLS_ALIGN`.
pub const SWAR_COLS_ALIGN: usize = 32;
/// W4A8 matrices have rows in blocks of 8. `LIM_W4_ROWS_ALIGN`.
pub const W4_ROWS_ALIGN: usize = 8;
/// W8A16 matrices (the LM head of both int stores) have rows in blocks of 4. `LIM_W8_ROWS_ALIGN`.
pub const W8_ROWS_ALIGN: usize = 4;
/// Elements of one RMSNorm vector (hidden_size, head_dim). `LIM_NORM_MAX`.
pub const NORM_MAX: usize = 16384;
/// Per-head width of attention, both KV formats. `LIM_HEAD_DIM_MAX`.
pub const HEAD_DIM_MAX: usize = 512;
/// Vectors of one batched matvec or quantisation: the largest prefill block. `LIM_BATCH_MAX`.
pub const BATCH_MAX: usize = 64;

/// Logits one draw of the integer sampler takes (ids in 20 bits, so that the u64 sums of Q30
/// weights stay below 2^50): the largest vocabulary. `LIM_VOCAB_MAX`.
pub const VOCAB_MAX: usize = 1 << 20;
/// u64 buckets of the sampler's radix-select histogram (11 bits of d). `LIM_SAMPLE_BUCKETS`.
pub const SAMPLE_BUCKETS: usize = 2048;
/// The smallest non-zero temperature, Q16 (0.01: 1/T in Q16 stays below 2^23).
/// `LIM_SAMPLE_TEMP_MIN`.
pub const SAMPLE_TEMP_MIN: u32 = 656;
/// The largest temperature, Q16 (100). `LIM_SAMPLE_TEMP_MAX`.
pub const SAMPLE_TEMP_MAX: u32 = 100 << 16;
/// The smallest repetition penalty, Q16 (0.01). `LIM_SAMPLE_REP_MIN`.
pub const SAMPLE_REP_MIN: u32 = 656;
/// The largest repetition penalty, Q16 (100). `LIM_SAMPLE_REP_MAX`.
pub const SAMPLE_REP_MAX: u32 = 100 << 16;
/// The largest |presence| and |frequency| penalty, Q16 (64). `LIM_SAMPLE_PEN_MAX`.
pub const SAMPLE_PEN_MAX: u32 = 64 << 16;

/// Checks that the integer sampler can take a vocabulary of `vocab` tokens (at most
/// [`VOCAB_MAX`]): where sampling is accepted, since greedy decoding has no such bound.
pub fn check_sampler_vocab(vocab: usize) -> Result<()> {
    if vocab > VOCAB_MAX {
        return Err(limit(
            "vocab_size (logits the sampler takes)",
            vocab,
            format!("at most {VOCAB_MAX} for sampling; greedy decoding takes any"),
        ));
    }
    Ok(())
}

/// An [`Error::Limit`] for dimension `what`.
fn limit(what: &'static str, value: usize, limit: String) -> Error {
    Error::Limit { what, value, limit }
}

/// Checks `cfg` against every kernel bound that applies to `backend` and `kv`: `Ok` means every
/// operator of the forward pass takes the model's shapes.
pub fn check(cfg: &Config, backend: Backend, kv: KvFormat) -> Result<()> {
    let (hd, q_dim) = (cfg.head_dim(), cfg.q_dim());
    // (dimension, value): the columns of each matrix kind.
    let widths = [
        (
            "hidden_size (columns of q/k/v, gate/up, lm_head)",
            cfg.hidden_size,
        ),
        (
            "q_dim = num_attention_heads × head_dim (columns of o_proj)",
            q_dim,
        ),
        (
            "intermediate_size (columns of down_proj)",
            cfg.intermediate_size,
        ),
    ];
    let align = match backend {
        Backend::Q24 | Backend::Arena => Q24_COLS_ALIGN,
        Backend::Int4 | Backend::Int8 => SWAR_COLS_ALIGN,
    };
    for (what, v) in widths {
        if v > COLS_MAX {
            return Err(limit(what, v, format!("at most {COLS_MAX}")));
        }
        if v % align != 0 {
            return Err(limit(
                what,
                v,
                format!("a multiple of {align} for the {} store", backend.name()),
            ));
        }
    }
    if cfg.hidden_size > NORM_MAX {
        return Err(limit(
            "hidden_size (RMSNorm length)",
            cfg.hidden_size,
            format!("at most {NORM_MAX}"),
        ));
    }
    if hd > HEAD_DIM_MAX {
        return Err(limit(
            "head_dim",
            hd,
            format!("at most {HEAD_DIM_MAX} (attention, {} KV cache)", kv.name()),
        ));
    }
    if hd % 2 != 0 {
        return Err(limit("head_dim", hd, "even (RoPE pairs)".into()));
    }
    if matches!(backend, Backend::Int4 | Backend::Int8) {
        // Row counts: q/k/v stacked, o/down (hidden), gate/up stacked, and the W8A16 LM head.
        let w4 = backend == Backend::Int4;
        let rows_align = if w4 { W4_ROWS_ALIGN } else { W8_ROWS_ALIGN };
        let rows = [
            ("q_dim + 2 kv_dim (rows of q/k/v)", q_dim + 2 * cfg.kv_dim()),
            ("hidden_size (rows of o_proj, down_proj)", cfg.hidden_size),
            (
                "2 × intermediate_size (rows of gate/up)",
                2 * cfg.intermediate_size,
            ),
        ];
        for (what, v) in rows {
            if v % rows_align != 0 {
                return Err(limit(
                    what,
                    v,
                    format!(
                        "a multiple of {rows_align} for the {} store",
                        backend.name()
                    ),
                ));
            }
        }
        if cfg.vocab_size % W8_ROWS_ALIGN != 0 {
            return Err(limit(
                "vocab_size (rows of the 8-bit LM head)",
                cfg.vocab_size,
                format!(
                    "a multiple of {W8_ROWS_ALIGN} for the {} store",
                    backend.name()
                ),
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hf::synth::Preset;

    #[test]
    fn qwen3_shapes_pass_and_each_crossing_names_its_dimension() {
        let base = Preset::Qwen3_0_6B.config();
        for b in Backend::ALL {
            for kv in KvFormat::ALL {
                check(&base, b, kv).unwrap();
            }
        }
        let cases: [(&str, fn(&mut Config), &[Backend]); 4] = [
            (
                "intermediate_size",
                |c| c.intermediate_size = COLS_MAX + 32,
                &Backend::ALL,
            ),
            (
                "q_dim",
                |c| {
                    c.num_attention_heads = 40;
                    c.head_dim = Some(512)
                },
                &Backend::ALL,
            ),
            (
                "q_dim",
                |c| {
                    c.num_attention_heads = 3;
                    c.num_key_value_heads = 1;
                    c.head_dim = Some(16)
                },
                &[Backend::Int4, Backend::Int8],
            ),
            (
                "vocab_size",
                |c| c.vocab_size = 1001,
                &[Backend::Int4, Backend::Int8],
            ),
        ];
        for (word, change, refused) in cases {
            let mut c = base.clone();
            change(&mut c);
            for b in Backend::ALL {
                match check(&c, b, KvFormat::Q16) {
                    Err(Error::Limit { what, .. }) if refused.contains(&b) => {
                        assert!(what.contains(word), "{word}: {what}")
                    }
                    Ok(()) if !refused.contains(&b) => {}
                    other => panic!("{word} on {}: {other:?}", b.name()),
                }
            }
        }
    }
}

/// Text bytes of one in-kernel tokenize call. `LIM_TOK_TEXT_MAX`.
pub const TOK_TEXT_MAX: usize = 65536;
/// Ids one in-kernel tokenize call may write. `LIM_TOK_IDS_MAX`.
pub const TOK_IDS_MAX: usize = 65536;
/// Code points of one segment (text between added tokens) after canonical decomposition.
/// `LIM_TOK_CP_MAX`.
pub const TOK_CP_MAX: usize = 131072;
/// Bytes of one pre-tokenized piece, the word BPE merges. `LIM_TOK_WORD_MAX`.
pub const TOK_WORD_MAX: usize = 8192;
/// Non-starters (combining marks) in a row, which canonical reordering sorts. `LIM_TOK_MARKS_MAX`.
pub const TOK_MARKS_MAX: usize = 4096;
/// Added tokens of a tokenizer. `LIM_TOK_ADDED_MAX`.
pub const TOK_ADDED_MAX: usize = 4096;
/// Bytes of one added token. `LIM_TOK_ADDED_LEN`.
pub const TOK_ADDED_LEN: usize = 256;

/// Payload bytes a filter rule may read (`bytes` of the rule). `LIM_FILTER_BYTES_MAX`.
pub const FILTER_BYTES_MAX: usize = 1024;
/// Labels of a filter rule (at least 2). `LIM_FILTER_LABELS_MAX`.
pub const FILTER_LABELS_MAX: usize = 8;
/// Tokens of one label's text. `LIM_FILTER_LABEL_TOKENS_MAX`.
pub const FILTER_LABEL_TOKENS_MAX: usize = 4;
/// Destination ports of a filter rule. `LIM_FILTER_PORTS_MAX`.
pub const FILTER_PORTS_MAX: usize = 8;
/// Source prefixes of a filter rule. `LIM_FILTER_SOURCES_MAX`.
pub const FILTER_SOURCES_MAX: usize = 8;
/// `round(ln 2 · 2^16)`: the filter scores' `ln_q16` turns a Q16 log2 into a Q16 ln with it.
/// `LIM_LN2_Q16`.
pub const LN2_Q16: i64 = 45426;
