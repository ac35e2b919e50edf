//! The f32 reference's contract: typed errors for bad tokens and context overflow, exact resets,
//! non-finite weights reported. Its agreement with candle-transformers' Qwen3 is checked by
//! `dev/tests/candle_peer.rs` (in the `qwen_bpf_dev` workspace member).

mod common;

use common::spread_tokens as tokens;
use qwen_bpf::hf::synth::{self, Preset, SynthOptions};
use qwen_bpf::Reference;
use qwen_bpf::{Checkpoint, Error};

/// Context length of the runs: the 16 tokens of `spread_tokens`.
const SEQ_LEN: usize = 16;

/// Tag of the shared `tiny` checkpoint (tied, seed 0).
const TINY: &str = "reference-tiny";

#[test]
fn bad_tokens_and_context_overflow_are_errors() {
    let dir = common::tiny_model(TINY);
    let ck = Checkpoint::open(&dir).expect("open checkpoint");
    let vocab = ck.config.vocab_size;

    let err = Reference::new(&ck, 0).unwrap_err();
    assert!(matches!(err, Error::Invalid(_)), "max_context 0: {err}");

    let mut r = Reference::new(&ck, 3).expect("load reference");
    // Out of range at position 0, and again after two good tokens: nothing advances.
    let err = r.forward(vocab as u32).unwrap_err();
    assert!(
        matches!(err, Error::TokenOutOfRange { id, index: 0, vocab: v } if id == vocab as u32 && v == vocab),
        "{err}"
    );
    assert_eq!(r.position(), 0);
    r.forward(1).unwrap();
    r.forward(2).unwrap();
    let err = r.forward(u32::MAX).unwrap_err();
    assert!(
        matches!(err, Error::TokenOutOfRange { id: u32::MAX, index: 2, vocab: v } if v == vocab),
        "{err}"
    );
    assert_eq!(r.position(), 2);

    // The third token fills max_context 3; the fourth overflows, and keeps overflowing.
    r.forward(3).unwrap();
    assert_eq!(r.position(), 3);
    for _ in 0..2 {
        let err = r.forward(4).unwrap_err();
        assert!(
            matches!(
                err,
                Error::ContextOverflow {
                    pos: 3,
                    max_context: 3,
                    tokens: 1,
                }
            ),
            "{err}"
        );
        assert_eq!(r.position(), 3);
    }
    r.reset();
    assert_eq!(r.position(), 0);
    r.forward(4).expect("reset frees the context");
}

#[test]
fn reset_reproduces_identical_logits() {
    let dir = common::tiny_model(TINY);
    let ck = Checkpoint::open(&dir).expect("open checkpoint");
    let seq = tokens(ck.config.vocab_size);
    let mut r = Reference::new(&ck, SEQ_LEN).expect("load reference");
    let first: Vec<Vec<f32>> = seq
        .iter()
        .map(|&t| r.forward(t).unwrap().to_vec())
        .collect();
    r.reset();
    assert_eq!(r.position(), 0);
    let second: Vec<Vec<f32>> = seq
        .iter()
        .map(|&t| r.forward(t).unwrap().to_vec())
        .collect();
    for (pos, (a, b)) in first.iter().zip(&second).enumerate() {
        assert!(a == b, "position {pos}: logits after reset differ");
    }
    // Different prefixes do give different logits, so the comparison above is not vacuous.
    assert_ne!(first[1], first[0]);
    // A fresh model agrees bit for bit too.
    let mut fresh = Reference::new(&ck, SEQ_LEN).expect("load reference");
    assert!(fresh.forward(seq[0]).unwrap() == first[0]);
}

#[test]
fn non_finite_weights_are_reported() {
    // Overwrite one bf16 value of model.norm.weight with NaN: loading must fail with NonFinite.
    let dir = common::scratch_dir();
    let opts = SynthOptions {
        seed: 5,
        ..SynthOptions::default()
    };
    synth::write_checkpoint(dir.path(), &Preset::Tiny.config(), &opts).expect("write checkpoint");
    let path = dir.path().join("model.safetensors");
    let bytes = std::fs::read(&path).unwrap();
    let header_len = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + header_len]).unwrap();
    let start = header["model.norm.weight"]["data_offsets"][0]
        .as_u64()
        .unwrap() as usize;
    let mut bytes = bytes;
    let at = 8 + header_len + start + 2 * 3; // element 3
    bytes[at..at + 2].copy_from_slice(&half::bf16::NAN.to_le_bytes());
    std::fs::write(&path, bytes).unwrap();
    let ck = Checkpoint::open(dir.path()).expect("shapes and dtypes are still valid");
    let err = Reference::new(&ck, 4).unwrap_err();
    assert!(
        matches!(&err, Error::NonFinite { name, index: 3, .. } if name == "model.norm.weight"),
        "{err}"
    );
}
