//! Tokenizing speed: the in-kernel tokenizer (`src/bpf/tokenize.inc.c`, one `test_run` per
//! string), its Rust twin and the `tokenizers` crate on the same corpus (tests/tok_corpus: 14,000
//! strings, 4.8 MB), in MB of UTF-8 per second; the best of three passes each. Then the time of
//! one kernel call on the worst inputs a served text request (4,096 bytes, in the chat template)
//! can carry: the installed server's worker tokenizes in one workqueue invocation, which must stay
//! well inside the generation's time budget (`in_kernel::BUDGET`). Needs root for the kernel.
//!
//! ```text
//! cargo bench --bench tokenize [-- --tokenizer FILE] [--worst-only]
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
    if args.iter().any(|a| a == "--worst-only") {
        return worst_cases(&mut kernel);
    }
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
    worst_cases(&mut kernel);
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

/// The slowest inputs of a served text request (`wire::TEXT_IN_MAX` bytes): the combining marks'
/// canonical reordering (an insertion sort: alternating classes 230 and 220 after one base, about
/// two million shifts), BPE on one 4,096-letter word (repeated, and varied letters), and the
/// longest run of digits and of spaces. Each is timed as the worst of five kernel calls.
fn worst_cases(kernel: &mut KernelTokenizer) {
    let n = qwen_bpf::wire::TEXT_IN_MAX;
    let head = "<|im_start|>user\n";
    let tail = "<|im_end|>\n<|im_start|>assistant\n";
    let marks: String = std::iter::once('a')
        .chain((0..).map(|i| if i % 2 == 0 { '\u{301}' } else { '\u{316}' }))
        .take(1 + (n - 1) / 2)
        .collect();
    let varied: String = (0..n)
        .map(|i| (b'a' + (i * 7 % 26) as u8) as char)
        .collect();
    let cases = [
        ("combining marks, classes 230/220 alternating", marks),
        ("one word of 4,096 'a'", "a".repeat(n)),
        ("one word of 4,096 varied letters", varied),
        ("4,096 digits", "7".repeat(n)),
        ("4,096 spaces", " ".repeat(n)),
    ];
    let budget = qwen_bpf::run::in_kernel::BUDGET;
    for (name, text) in cases {
        let text = format!("{head}{text}{tail}");
        let worst = (0..5)
            .map(|_| {
                let t0 = Instant::now();
                kernel.encode(&text).expect("the worst case tokenizes");
                t0.elapsed()
            })
            .max()
            .unwrap();
        println!(
            "worst case: {name:<46} {:5} bytes: {:8.2} ms per kernel call ({:.1}% of the {} ms budget)",
            text.len(),
            worst.as_secs_f64() * 1e3,
            100.0 * worst.as_secs_f64() / budget.as_secs_f64(),
            budget.as_millis()
        );
    }
}
