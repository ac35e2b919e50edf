//! Batched prefill (`Model::prefill`, blocks of `Model::prefill_block` tokens through each
//! weight matrix) against feeding the same tokens one by one: the last token's logits and the
//! whole KV cache bit for bit equal, for every weight store and KV format, on one and two
//! threads, with a prompt of whole blocks and a remainder; and both equal to the Rust twin.
//! These load real BPF programs: they need root (or CAP_BPF + CAP_PERFMON).

mod common;

use qwen_bpf::verify::twin::TwinModel;
use qwen_bpf::{Backend, KvFormat, Model, ModelOptions};

const MAX_CONTEXT: usize = 64;

/// `n` token ids spread over the vocabulary (repeats included).
fn prompt(vocab: usize, n: usize) -> Vec<u32> {
    let base = common::spread_tokens(vocab);
    (0..n)
        .map(|i| (base[i % base.len()] as usize + i / base.len() * 7) as u32 % vocab as u32)
        .collect()
}

/// The saved context (KV cache and position) of `m`, as bytes.
fn context_bytes(m: &Model, tag: &str) -> Vec<u8> {
    let dir = common::scratch_dir();
    let path = dir.path().join(format!("{tag}.ctx"));
    m.save_context(&path).expect("save the context");
    std::fs::read(&path).expect("read the saved context")
}

#[test]
fn prefill_in_blocks_equals_token_by_token_for_every_store() {
    let dir = common::tiny_model("model-tiny-prefill");
    let runs = [
        (Backend::Q24, KvFormat::Q16, 1),
        (Backend::Q24, KvFormat::Int8, 2),
        (Backend::Arena, KvFormat::Q16, 2),
        (Backend::Int4, KvFormat::Int8, 1),
        (Backend::Int4, KvFormat::Q16, 2),
        (Backend::Int8, KvFormat::Q16, 2),
    ];
    for (backend, kv, threads) in runs {
        let what = format!("{} store, {kv:?} KV, {threads} threads", backend.name());
        let opts = ModelOptions::default()
            .with_backend(backend)
            .with_kv(kv)
            .with_threads(threads)
            .with_max_context(MAX_CONTEXT);
        let mut blocked = common::open(&dir, opts.clone());
        let mut single = common::open(&dir, opts);
        let block = blocked.prefill_block();
        assert!(block > 1, "{what}: prefill block {block}");
        // two whole blocks and a remainder, so that every code path runs
        let tokens = prompt(blocked.config().vocab_size, 2 * block + 3);
        let runs_before = blocked.bpf_runs();
        let got = blocked.prefill(&tokens).unwrap().to_vec();
        let blocked_runs = blocked.bpf_runs() - runs_before;
        let mut want = Vec::new();
        for &t in &tokens {
            want = single.forward(t).unwrap().to_vec();
        }
        assert_eq!(
            blocked.position(),
            tokens.len(),
            "{what}: position after prefill"
        );
        let same = got
            .iter()
            .zip(&want)
            .all(|(a, b)| a.to_bits() == b.to_bits());
        assert!(
            same,
            "{what}: last-token logits, blocked prefill vs token by token"
        );
        assert_eq!(
            context_bytes(&blocked, "blocked"),
            context_bytes(&single, "single"),
            "{what}: KV cache after blocked prefill vs token by token"
        );
        // decoding goes on from identical states
        for (i, &t) in tokens.iter().take(3).enumerate() {
            assert_eq!(
                blocked.forward_fixed(t).unwrap(),
                single.forward_fixed(t).unwrap(),
                "{what}: logits of decode step {i} after prefill"
            );
        }
        eprintln!(
            "{what}: block {block}, {blocked_runs} BPF runs for {} prompt tokens",
            tokens.len()
        );
    }
}

#[test]
fn blocked_prefill_equals_the_rust_twin() {
    let dir = common::tiny_model("model-tiny-prefill");
    let opts = ModelOptions::default()
        .with_backend(Backend::Q24)
        .with_kv(KvFormat::Q16)
        .with_threads(2)
        .with_max_context(MAX_CONTEXT);
    let mut m = common::open(&dir, opts);
    let mut twin = TwinModel::open(&dir, &dir, MAX_CONTEXT).unwrap();
    let tokens = prompt(m.config().vocab_size, m.prefill_block() + 5);
    let got = m.prefill(&tokens).unwrap().to_vec();
    let mut want = Vec::new();
    for &t in &tokens {
        want = twin.forward(t).unwrap().0;
    }
    let want: Vec<f32> = want
        .iter()
        .map(|&v| qwen_bpf::num::fixed::from_fixed(v, qwen_bpf::num::fixed::Q_ACT))
        .collect();
    assert_eq!(
        got, want,
        "last-token logits: blocked BPF prefill vs Rust twin token by token"
    );
}
