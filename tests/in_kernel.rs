//! Generation inside the kernel: the same tokens as the per-operator path, stop tokens honoured
//! in BPF, text carried out of the kernel, several invocations joined seamlessly. Each test runs
//! on the arena and, as its `array_` twin, on the array memory layer (issue 35), which a host
//! that refuses arenas and Linux 6.1 run natively.

mod common;

use std::path::Path;
use std::time::Duration;

use qwen_bpf::{
    Backend, Dispatch, Error, FinishReason, GenerateOptions, KvFormat, MemoryLayer, ModelOptions,
    SamplingParams, Tokenizer,
};

const PROMPT: [u32; 5] = [785, 3974, 13876, 38835, 916];

/// The options of the models here: `backend` with `kv` on memory layer `layer`, 64 positions,
/// weight caches in a directory of the backend's own; each test adds its threads and dispatch.
fn options(dir: &Path, backend: Backend, kv: KvFormat, layer: MemoryLayer) -> ModelOptions {
    ModelOptions::default()
        .with_backend(backend)
        .with_kv(kv)
        .with_max_context(64)
        .with_memory(layer)
        .with_cache_dir(dir.join(format!("cache-{}-{layer:?}", backend.name())))
}

#[test]
fn in_kernel_generation_equals_the_per_operator_tokens_for_every_store_and_thread_count() {
    equals_the_per_operator_tokens(MemoryLayer::Arena);
}

#[test]
fn array_in_kernel_generation_equals_the_per_operator_tokens_for_every_store_and_thread_count() {
    equals_the_per_operator_tokens(MemoryLayer::Array);
}

fn equals_the_per_operator_tokens(layer: MemoryLayer) {
    let dir = common::tiny_model("in-kernel");
    for (backend, kv) in [
        (Backend::Q24, KvFormat::Q16),
        (Backend::Int4, KvFormat::Int8),
        (Backend::Int8, KvFormat::Q16),
    ] {
        let mut reference = common::open(
            &dir,
            options(&dir, backend, kv, layer)
                .with_threads(1)
                .with_dispatch(Dispatch::PerOp),
        );
        let want = common::greedy_tokens(&mut reference, &PROMPT, 20);
        for threads in [1, 2] {
            let mut m = common::open(
                &dir,
                options(&dir, backend, kv, layer)
                    .with_threads(threads)
                    .with_dispatch(Dispatch::Kernel),
            );
            let runs = m.bpf_runs();
            let mut g = m
                .generate_in_kernel(&PROMPT, &GenerateOptions::new(20))
                .unwrap();
            let got: Vec<u32> = g.by_ref().map(|t| t.unwrap()).collect();
            let (finish, rounds) = (g.finish_reason(), g.invocations());
            drop(g);
            let what = format!(
                "{} store, {} KV, {threads} threads",
                backend.name(),
                kv.name()
            );
            assert_eq!(
                got, want,
                "in-kernel vs per-operator greedy tokens ({what})"
            );
            assert_eq!(finish, Some(FinishReason::MaxTokens), "{what}");
            assert_eq!(
                m.bpf_runs() - runs,
                rounds * threads as u64,
                "one generate invocation per thread and round ({what})"
            );
            assert_eq!(
                m.position(),
                PROMPT.len() + 19,
                "the prompt and all but the last token were fed ({what})"
            );
        }
    }
}

#[test]
fn stop_tokens_end_generation_in_the_kernel_and_are_not_yielded() {
    stop_tokens_end_generation(MemoryLayer::Arena);
}

#[test]
fn array_stop_tokens_end_generation_in_the_kernel_and_are_not_yielded() {
    stop_tokens_end_generation(MemoryLayer::Array);
}

fn stop_tokens_end_generation(layer: MemoryLayer) {
    let dir = common::tiny_model("in-kernel");
    let mut reference = common::open(
        &dir,
        options(&dir, Backend::Q24, KvFormat::Q16, layer)
            .with_threads(1)
            .with_dispatch(Dispatch::PerOp),
    );
    let want = common::greedy_tokens(&mut reference, &PROMPT, 12);
    let stop = want[6];
    let first = want.iter().position(|&t| t == stop).unwrap();
    let mut m = common::open(
        &dir,
        options(&dir, Backend::Q24, KvFormat::Q16, layer)
            .with_threads(2)
            .with_dispatch(Dispatch::Kernel),
    );
    let opts = GenerateOptions::new(12).with_stop_tokens(vec![999_999, stop]);
    let mut g = m.generate_in_kernel(&PROMPT, &opts).unwrap();
    let got: Vec<u32> = g.by_ref().map(|t| t.unwrap()).collect();
    assert_eq!(got, want[..first], "tokens before the first stop token");
    assert_eq!(g.finish_reason(), Some(FinishReason::Stop(stop)));
}

#[test]
fn a_generation_split_over_many_invocations_is_the_same_as_one() {
    split_generation_equals_one(MemoryLayer::Arena);
}

#[test]
fn array_a_generation_split_over_many_invocations_is_the_same_as_one() {
    split_generation_equals_one(MemoryLayer::Array);
}

fn split_generation_equals_one(layer: MemoryLayer) {
    let dir = common::tiny_model("in-kernel");
    let mut one = common::open(
        &dir,
        options(&dir, Backend::Q24, KvFormat::Q16, layer)
            .with_threads(1)
            .with_dispatch(Dispatch::Kernel),
    );
    let want: Vec<u32> = one
        .generate_in_kernel(&PROMPT, &GenerateOptions::new(16))
        .unwrap()
        .map(|t| t.unwrap())
        .collect();
    let mut m = common::open(
        &dir,
        options(&dir, Backend::Q24, KvFormat::Q16, layer)
            .with_threads(2)
            .with_dispatch(Dispatch::Kernel),
    );
    // a 1 ns budget: every invocation returns after one step
    let mut g = m
        .generate_in_kernel(&PROMPT, &GenerateOptions::new(16))
        .unwrap()
        .with_budget(Duration::from_nanos(1));
    let got: Vec<u32> = g.by_ref().map(|t| t.unwrap()).collect();
    assert_eq!(got, want, "tokens of 1-step invocations vs one invocation");
    assert!(
        g.invocations() >= 16,
        "one invocation per generated token, got {}",
        g.invocations()
    );
    // and it continues the context: the next generation starts where this one stopped
    drop(g);
    let pos = m.position();
    let more: Vec<u32> = m
        .generate_in_kernel(&[want[15]], &GenerateOptions::new(3))
        .unwrap()
        .map(|t| t.unwrap())
        .collect();
    assert_eq!(m.position(), pos + 3, "a continued generation feeds on");
    assert_eq!(more.len(), 3);
}

#[test]
fn the_kernel_sends_each_tokens_text_and_the_reader_joins_utf8() {
    text_joins_utf8(MemoryLayer::Arena);
}

#[test]
fn array_the_kernel_sends_each_tokens_text_and_the_reader_joins_utf8() {
    text_joins_utf8(MemoryLayer::Array);
}

fn text_joins_utf8(layer: MemoryLayer) {
    let dir = common::tiny_model_with_tokenizer("in-kernel-text");
    let tok = Tokenizer::from_model_dir(&dir).unwrap();
    let prompt = tok.encode("Héllo wörld, ünïcode ✓ ").unwrap();
    let mut reference = common::open(
        &dir,
        options(&dir, Backend::Q24, KvFormat::Q16, layer)
            .with_threads(1)
            .with_dispatch(Dispatch::PerOp),
    );
    let ids = common::greedy_tokens(&mut reference, &prompt, 24);
    let mut m = common::open(
        &dir,
        options(&dir, Backend::Q24, KvFormat::Q16, layer)
            .with_threads(2)
            .with_dispatch(Dispatch::Kernel),
    );
    m.load_vocabulary(&tok).unwrap();
    let text: String = m
        .generate_in_kernel(&prompt, &GenerateOptions::new(24))
        .unwrap()
        .text()
        .map(|p| p.unwrap())
        .collect();
    assert_eq!(
        text,
        tok.decode(&ids).unwrap(),
        "kernel text vs the tokenizer's decode"
    );
    // every token's bytes, joined, decode like the tokenizer (multi-byte characters included)
    let all: Vec<u8> = prompt
        .iter()
        .flat_map(|&t| tok.token_bytes(t).unwrap())
        .collect();
    assert_eq!(String::from_utf8(all).unwrap(), "Héllo wörld, ünïcode ✓ ");
}

#[test]
fn in_kernel_generation_refuses_what_the_kernel_cannot_do() {
    refuses_what_the_kernel_cannot_do(MemoryLayer::Arena);
}

#[test]
fn array_in_kernel_generation_refuses_what_the_kernel_cannot_do() {
    refuses_what_the_kernel_cannot_do(MemoryLayer::Array);
}

fn refuses_what_the_kernel_cannot_do(layer: MemoryLayer) {
    let dir = common::tiny_model("in-kernel");
    let mut m = common::open(
        &dir,
        options(&dir, Backend::Q24, KvFormat::Q16, layer)
            .with_threads(1)
            .with_dispatch(Dispatch::Kernel),
    );
    // sampling runs in the kernel, within the integer sampler's ranges
    let sampled = GenerateOptions::new(4).with_sampling(SamplingParams::new(500.0));
    assert!(matches!(
        m.generate_in_kernel(&PROMPT, &sampled),
        Err(Error::InvalidParameter {
            name: "temperature",
            ..
        })
    ));
    let many_stops = GenerateOptions::new(4).with_stop_tokens(0..9);
    assert!(matches!(
        m.generate_in_kernel(&PROMPT, &many_stops),
        Err(Error::InvalidParameter {
            name: "stop_tokens",
            ..
        })
    ));
    assert!(matches!(
        m.generate_in_kernel(&[1 << 30], &GenerateOptions::new(4)),
        Err(Error::TokenOutOfRange { .. })
    ));
    assert!(matches!(
        m.generate_in_kernel(&[1; 65], &GenerateOptions::new(4)),
        Err(Error::ContextOverflow { .. })
    ));
    assert_eq!(m.position(), 0, "refused generations feed nothing");
    let arena_opts = ModelOptions::default()
        .with_backend(Backend::Arena)
        .with_memory(layer)
        .with_max_context(16)
        .with_cache_dir(dir.join("cache-arena"));
    let mut arena = common::open(&dir, arena_opts);
    assert_eq!(
        arena.dispatch(),
        Dispatch::PerOp,
        "the arena store runs per operator"
    );
    assert!(matches!(
        arena.generate_in_kernel(&PROMPT, &GenerateOptions::new(4)),
        Err(Error::Invalid(_))
    ));
}
