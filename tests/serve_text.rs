//! Text requests to an installed model: the kernel tokenizes the text (in the chat template when
//! asked) and samples with the request's parameters, so that the answer is what the library
//! gives for the tokenizers crate's ids of the same text: greedy per-operator generation, or
//! `Model::generate` with the same sampling parameters and seed. Two requests tokenized at once
//! take turns in the tokenizer; a text whose tokens do not fit ends with the `prompt` finish.
//!
//! The client speaks the wire format with a plain `std::net::UdpSocket` (tests/common/serve.rs).
//! Needs root (BPF, XDP, the BPF filesystem); fails, never skips, without it.

mod common;

use std::net::{Ipv4Addr, SocketAddr};
use std::path::Path;

use common::serve::{
    install_in_process, per_op_model, reference, text_of, wire, Client, Installation, CTX,
};
use qwen_bpf::{GenerateOptions, InstallConfig, SamplingParams, Tokenizer};

/// Sends text request `id` and polls it to its end: the text and the FINAL record's words.
fn ask_text(
    c: &Client,
    id: u32,
    max_new: u32,
    flags: u32,
    sampling: [u32; 7],
    text: &str,
) -> (Vec<u8>, Vec<u32>) {
    let r = c.ask(&wire::text_request(
        id,
        max_new,
        flags,
        sampling,
        text.as_bytes(),
    ));
    assert_eq!(
        (wire::word(&r, 1), wire::word(&r, 2)),
        (wire::ACCEPTED, id),
        "ACCEPTED {id}"
    );
    c.poll_to_end(id)
}

/// The tokens `Model::generate` samples for `prompt` with `p` (one thread, per operator).
fn sampled(dir: &Path, prompt: &[u32], n: usize, p: &SamplingParams) -> Vec<u32> {
    let mut m = per_op_model(dir);
    let g = m
        .generate(prompt, &GenerateOptions::new(n).with_sampling(p.clone()))
        .unwrap();
    g.map(|t| t.unwrap()).collect()
}

/// A sampling parameter in the wire's Q16.16.
fn q16(v: f32) -> u32 {
    (v as f64 * 65536.0).round() as u32
}

#[test]
fn text_requests_are_tokenized_and_sampled_in_the_kernel_as_the_library_does() {
    let dir = common::tiny_model_with_tokenizer("serve");
    let tok = Tokenizer::from_model_dir(&dir).unwrap();
    let (name, port) = ("test-serve-text", 47_321u16);
    let _cleanup = Installation::new(name);
    let cfg = InstallConfig {
        max_new: 16,
        ..InstallConfig::loopback(port)
    };
    install_in_process(&dir, name, 2, CTX, &cfg);
    let server: SocketAddr = (Ipv4Addr::LOCALHOST, port).into();
    let c = Client::new("127.0.0.1:0", server);

    // greedy, plain and in the chat template: the per-operator text of the crate's ids
    let text = "Ünïcödé façade, naïve café — 42 words' worth\tof tests!";
    let (got, fin) = ask_text(&c, 1, 12, 0, wire::GREEDY, text);
    let prompt = tok.encode(text).unwrap();
    let (ids, _) = reference(&dir, &prompt, 12, &[]);
    assert_eq!(got, text_of(&tok, &ids, false).into_bytes(), "greedy text");
    assert_eq!(
        &fin[4..7],
        &[2, prompt.len() as u32, 12],
        "FINAL: max tokens, the prompt's tokens"
    );
    let (got, fin) = ask_text(&c, 2, 12, 1, wire::GREEDY, "What is eBPF?");
    let prompt = tok.encode_chat("What is eBPF?").unwrap();
    let (ids, _) = reference(&dir, &prompt, 12, &[]);
    assert_eq!(got, text_of(&tok, &ids, false).into_bytes(), "chat text");
    assert_eq!(fin[5], prompt.len() as u32, "the chat prompt's tokens");

    // sampled: the tokens of Model::generate with the same parameters and seed
    let prompt_text = "The old lighthouse keeper climbed";
    let prompt = tok.encode(prompt_text).unwrap();
    for (i, seed) in [7u64, 8, 1 << 40].into_iter().enumerate() {
        let p = SamplingParams::new(0.8)
            .with_top_k(40)
            .with_top_p(0.9)
            .with_min_p(0.02)
            .with_repetition_penalty(1.1)
            .with_seed(seed);
        let w = [
            q16(0.8),
            40,
            q16(0.9),
            q16(0.02),
            q16(1.1),
            seed as u32,
            (seed >> 32) as u32,
        ];
        let id = 10 + i as u32;
        let (got, fin) = ask_text(&c, id, 16, 0, w, prompt_text);
        let ids = sampled(&dir, &prompt, 16, &p);
        assert_eq!(fin[6], ids.len() as u32, "seed {seed}: tokens generated");
        assert_eq!(
            got,
            text_of(&tok, &ids, false).into_bytes(),
            "seed {seed}: sampled text"
        );
    }

    // two texts at once: their tokenizations take turns, each answer is its own
    let d = Client::new("127.0.0.1:0", server);
    let (a, b) = std::thread::scope(|s| {
        let a = s.spawn(|| ask_text(&c, 20, 8, 0, wire::GREEDY, "First of two"));
        let b = s.spawn(|| ask_text(&d, 21, 8, 0, wire::GREEDY, "Second of the two requests"));
        (a.join().unwrap(), b.join().unwrap())
    });
    for (text, (got, _)) in [("First of two", a), ("Second of the two requests", b)] {
        let (ids, _) = reference(&dir, &tok.encode(text).unwrap(), 8, &[]);
        assert_eq!(got, text_of(&tok, &ids, false).into_bytes(), "{text}");
    }

    // a text whose tokens pass the prompt limit (the context): FINAL says prompt, -2 (TOK_E_IDS)
    let long = "word ".repeat(200);
    let (got, fin) = ask_text(&c, 30, 8, 0, wire::GREEDY, &long);
    assert!(got.is_empty());
    assert_eq!(
        (fin[4], fin[7] as i32),
        (6, -2),
        "FINAL: prompt, too many ids"
    );
    // and the server goes on
    let (got, _) = ask_text(&c, 31, 12, 0, wire::GREEDY, text);
    let (ids, _) = reference(&dir, &tok.encode(text).unwrap(), 12, &[]);
    assert_eq!(got, text_of(&tok, &ids, false).into_bytes());
}
