//! Tokenizing speed: the in-kernel tokenizer (`src/bpf/tokenize.inc.c`, one `test_run` per
//! string), its Rust twin and the `tokenizers` crate on the same corpus (tests/tok_corpus: 14,000
//! strings, 4.8 MB), in MB of UTF-8 per second; the best of three passes each. Needs root for
//! the kernel.
//!
//! ```text
//! cargo bench --bench tokenize [-- --tokenizer FILE]
//! ```

#[path = "../tests/tok_corpus/mod.rs"]
mod tok_corpus;

use std::time::{Duration, Instant};

use qwen_bpf::num::limits::TOK_IDS_MAX;
use qwen_bpf::num::tok_tables::TokTables;
use qwen_bpf::num::tok_twin;
use qwen_bpf::{KernelTokenizer, Tokenizer};

/// The best of three passes of `f` over the corpus.
fn best(corpus: &[String], mut f: impl FnMut(&str) -> usize) -> (Duration, usize) {
    (0..3)
        .map(|_| {
            let t0 = Instant::now();
            let ids = corpus.iter().map(|s| f(s)).sum();
            (t0.elapsed(), ids)
        })
        .min()
        .unwrap()
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let path = args
        .iter()
        .position(|a| a == "--tokenizer")
        .map(|i| args[i + 1].clone())
        .unwrap_or_else(|| "/work/shared/qwen3-tokenizer/tokenizer.json".into());
    let tok = Tokenizer::from_file(&path).expect("the tokenizer.json");
    let tables = TokTables::build(&tok).expect("the tokenizer's tables");
    let mut kernel = KernelTokenizer::from_tables(&tables).expect("the kernel tokenizer");
    let corpus = tok_corpus::corpus();
    let bytes: usize = corpus.iter().map(String::len).sum();
    // by part: the 4 KiB words (BPE's worst case), the code-point walk, the rest
    let long: Vec<String> = corpus.iter().filter(|s| s.len() >= 4000).cloned().collect();
    let cps: Vec<String> = corpus[..6000].to_vec();
    let rest: Vec<String> = corpus[6000..]
        .iter()
        .filter(|s| s.len() < 4000)
        .cloned()
        .collect();
    for (name, part) in [("long", &long), ("cps", &cps), ("rest", &rest)] {
        let b: usize = part.iter().map(String::len).sum();
        let (tk, _) = best(part, |s| kernel.encode(s).unwrap().len());
        let (tc, _) = best(part, |s| tok.encode(s).unwrap().len());
        println!(
            "{name:>5}: {:5} strings, {b:8} bytes: kernel {:.3} s, tokenizers crate {:.3} s",
            part.len(),
            tk.as_secs_f64(),
            tc.as_secs_f64()
        );
    }
    let rows = [
        (
            "kernel (BPF)",
            best(&corpus, |s| kernel.encode(s).unwrap().len()),
        ),
        (
            "tokenizers crate",
            best(&corpus, |s| tok.encode(s).unwrap().len()),
        ),
        (
            "Rust twin",
            best(&corpus, |s| {
                tok_twin::tokenize(&tables.words, s.as_bytes(), TOK_IDS_MAX)
                    .unwrap()
                    .len()
            }),
        ),
    ];
    println!("corpus: {} strings, {bytes} bytes", corpus.len());
    for (name, (t, ids)) in rows {
        println!(
            "{name:>16}: {:7.2} MB/s  ({} ids, {:.3} s)",
            bytes as f64 / 1e6 / t.as_secs_f64(),
            ids,
            t.as_secs_f64()
        );
    }
}
