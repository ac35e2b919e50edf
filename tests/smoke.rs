//! The smoke suite's own tests: what every kernel of the matrix must do, small enough to run
//! under TCG in a VM (`scripts/vm-test.sh NAME -- scripts/smoke.sh`). They need BPF arenas and
//! fail loudly without them, but for the `array_` ones, which use the array memory layer. Each
//! opens one tiny model and checks integers, never timings:
//! the forward pass against the Rust twin (per operator and in one invocation), generation in
//! the kernel (greedy and seeded) against user space, and the in-kernel tokenizer against the
//! `tokenizers` crate.

mod common;
#[path = "tok_corpus/mod.rs"]
mod tok_corpus;

use qwen_bpf::verify::twin::TwinModel;
use qwen_bpf::{
    Dispatch, GenerateOptions, KernelTokenizer, MemoryLayer, ModelOptions, SamplingParams,
    Tokenizer,
};

const TOKENS: [u32; 5] = [785, 3974, 13876, 151644, 0];

fn options(dispatch: Dispatch) -> ModelOptions {
    ModelOptions::default()
        .with_max_context(32)
        .with_threads(1)
        .with_dispatch(dispatch)
}

#[test]
fn forward_per_operator_and_in_one_invocation_equals_the_twin() {
    let dir = common::tiny_model("smoke-tiny");
    let mut per_op = common::open(&dir, options(Dispatch::PerOp));
    let mut plan = common::open(&dir, options(Dispatch::Kernel));
    assert_eq!(
        plan.dispatch(),
        Dispatch::Kernel,
        "the plan runs in the kernel"
    );
    let mut twin = TwinModel::open(&dir, &dir, 32).unwrap();
    for (i, &t) in TOKENS.iter().enumerate() {
        let (want, _) = twin.forward(t).unwrap();
        let got = per_op.forward_fixed(t).unwrap().to_vec();
        assert_eq!(
            got, want,
            "logits at position {i}: BPF per operator vs Rust twin"
        );
        let got = plan.forward_fixed(t).unwrap().to_vec();
        assert_eq!(
            got, want,
            "logits at position {i}: BPF plan (one invocation) vs Rust twin"
        );
    }
}

#[test]
fn generation_in_the_kernel_greedy_and_seeded_equals_user_space() {
    generation_equals_user_space(MemoryLayer::Arena);
}

#[test]
fn array_generation_in_the_kernel_greedy_and_seeded_equals_user_space() {
    generation_equals_user_space(MemoryLayer::Array);
}

fn generation_equals_user_space(layer: MemoryLayer) {
    let dir = common::tiny_model("smoke-tiny");
    let mut m = common::open(&dir, options(Dispatch::Kernel).with_memory(layer));
    assert_eq!(m.memory_layer(), layer, "the layer asked for");
    let prompt = [785, 3974, 13876];
    for sampling in [
        SamplingParams::greedy(),
        SamplingParams::new(0.8)
            .with_top_k(40)
            .with_top_p(0.95)
            .with_seed(7),
    ] {
        let opts = GenerateOptions::new(8).with_sampling(sampling.clone());
        m.reset();
        let want: Vec<u32> = m
            .generate(&prompt, &opts)
            .unwrap()
            .map(Result::unwrap)
            .collect();
        m.reset();
        let got: Vec<u32> = m
            .generate_in_kernel(&prompt, &opts)
            .unwrap()
            .map(Result::unwrap)
            .collect();
        assert_eq!(got.len(), 8, "{sampling:?}: eight tokens");
        assert_eq!(got, want, "{sampling:?}: in-kernel vs user-space tokens");
    }
}

#[test]
fn the_kernel_tokenizer_equals_the_tokenizers_crate_on_300_strings() {
    tokenizer_equals_the_crate_on_300_strings(MemoryLayer::Arena);
}

#[test]
fn array_the_kernel_tokenizer_equals_the_tokenizers_crate_on_300_strings() {
    tokenizer_equals_the_crate_on_300_strings(MemoryLayer::Array);
}

fn tokenizer_equals_the_crate_on_300_strings(layer: MemoryLayer) {
    let tok = Tokenizer::from_file(common::tokenizer_path()).unwrap();
    let tables = qwen_bpf::num::tok_tables::TokTables::build(&tok).unwrap();
    let mut kernel = KernelTokenizer::from_tables_on(&tables, layer)
        .unwrap_or_else(|e| panic!("load the kernel tokenizer on the {layer} layer: {e}"));
    let corpus = tok_corpus::corpus();
    // spread over the corpus: every kind of text it holds, not only its first lines
    let step = (corpus.len() / 300).max(1);
    let mut checked = 0;
    for s in corpus.iter().step_by(step).take(300) {
        let want = tok.encode(s).unwrap();
        assert_eq!(
            kernel.encode(s).unwrap(),
            want,
            "ids of {s:?}: kernel vs tokenizers crate"
        );
        checked += 1;
    }
    assert_eq!(checked, 300);
}
