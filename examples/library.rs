//! The code of README.md's "Using the library" and "Sampling" sections, compiled with the other
//! examples and run by `tests/examples.rs` (which also checks that the README still quotes it):
//! greedy generation from a chat prompt, then the same prompt sampled with a fixed seed.
//!
//! ```text
//! cargo run --release --example library -- /path/to/Qwen3-0.6B
//! ```

use std::path::PathBuf;

use qwen_bpf::{GenerateOptions, Model, ModelOptions, SamplingParams, Tokenizer};

fn main() -> qwen_bpf::Result<()> {
    // A Hugging Face directory: config.json, model.safetensors, tokenizer.json.
    let dir: PathBuf = std::env::args_os()
        .nth(1)
        .unwrap_or("/path/to/Qwen3-0.6B".into())
        .into();
    let tok = Tokenizer::from_model_dir(&dir)?;
    let options = ModelOptions {
        max_context: 256,
        ..Default::default()
    };
    // Converts the weights to a Q24 cache file in `dir` on the first open.
    let mut model = Model::open(&dir, &options)?;

    // Greedy decoding, token by token.
    let prompt = tok.encode_chat("What is eBPF?")?;
    let mut next = 0;
    for &id in &prompt {
        next = model.next_token(id)?; // one forward pass; argmax computed in BPF
    }
    let eos = tok.eos_ids();
    let mut text = tok.stream(); // emits whole UTF-8 characters only
    while !eos.contains(&next) && model.position() < model.max_context() {
        if let Some(piece) = text.push(next)? {
            print!("{piece}");
        }
        next = model.next_token(next)?;
    }
    println!();

    // The same prompt, sampled: `generate` feeds it and streams the text.
    model.reset();
    let sampling = SamplingParams::new(0.8)
        .with_top_k(40)
        .with_top_p(0.95)
        .with_seed(7);
    let opts = GenerateOptions::new(128)
        .with_stop_tokens(tok.eos_ids())
        .with_sampling(sampling);
    for piece in model.generate(&prompt, &opts)?.text(&tok) {
        print!("{}", piece?);
    }
    println!();

    // Greedy again, wholly inside the kernel: it feeds the prompt, takes each argmax, checks
    // the stop tokens, and sends every token's text out on a ring buffer.
    model.reset();
    model.load_vocabulary(&tok)?;
    let opts = GenerateOptions::new(64).with_stop_tokens(tok.eos_ids());
    for piece in model.generate_in_kernel(&prompt, &opts)?.text() {
        print!("{}", piece?);
    }
    println!();
    Ok(())
}
