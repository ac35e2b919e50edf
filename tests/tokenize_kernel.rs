//! The in-kernel tokenizer (`src/bpf/tokenize.inc.c`) against its Rust twin
//! (`qwen_bpf::num::tok_twin`) and the `tokenizers` crate, on a generated corpus of 14,000
//! strings, and its refusals. The kernel tests load real BPF programs (root).

#[path = "tok_corpus/mod.rs"]
mod tok_corpus;

use std::sync::OnceLock;

use qwen_bpf::num::limits::TOK_IDS_MAX;
use qwen_bpf::num::tok_tables::TokTables;
use qwen_bpf::num::tok_twin;
use qwen_bpf::{KernelTokenizer, Tokenizer};

const QWEN3: &str = "/work/shared/qwen3-tokenizer/tokenizer.json";

fn tokenizer() -> &'static Tokenizer {
    static T: OnceLock<Tokenizer> = OnceLock::new();
    T.get_or_init(|| Tokenizer::from_file(QWEN3).expect("the Qwen3 tokenizer.json"))
}

fn tables() -> &'static TokTables {
    static T: OnceLock<TokTables> = OnceLock::new();
    T.get_or_init(|| TokTables::build(tokenizer()).expect("build the tables"))
}

/// Every mismatch, the string escaped with both id lists (at most `show` printed).
fn mismatches(what: &str, got: &[Vec<u32>], want: &[Vec<u32>], corpus: &[String]) -> usize {
    let mut n = 0;
    for ((g, w), s) in got.iter().zip(want).zip(corpus) {
        if g != w {
            if n < 20 {
                eprintln!("{what} differs on {s:?}\n  got  {g:?}\n  want {w:?}");
            }
            n += 1;
        }
    }
    n
}

#[test]
fn the_twin_equals_the_tokenizers_crate_on_the_corpus() {
    let corpus = tok_corpus::corpus();
    assert!(corpus.len() >= 10_000);
    let want: Vec<Vec<u32>> = corpus
        .iter()
        .map(|s| tokenizer().encode(s).unwrap())
        .collect();
    let got: Vec<Vec<u32>> = corpus
        .iter()
        .map(|s| tok_twin::tokenize(&tables().words, s.as_bytes(), TOK_IDS_MAX).unwrap())
        .collect();
    assert_eq!(mismatches("twin", &got, &want, &corpus), 0);
}

#[test]
fn the_twin_composes_every_code_point_as_the_crate_does() {
    // NFC of each code point alone and of its canonical decomposition, through the whole
    // tokenizer: the ids of "x" + c + "x" equal the crate's for every code point
    let mut bad = 0;
    for c in (0..0x110000u32).filter_map(char::from_u32) {
        let s = format!("x{c}\u{301}x");
        let want = tokenizer().encode(&s).unwrap();
        let got = tok_twin::tokenize(&tables().words, s.as_bytes(), TOK_IDS_MAX).unwrap();
        if got != want {
            if bad < 20 {
                eprintln!("U+{:04X}: got {got:?} want {want:?}", c as u32);
            }
            bad += 1;
        }
    }
    assert_eq!(bad, 0);
}

fn kernel() -> std::sync::MutexGuard<'static, KernelTokenizer> {
    static K: OnceLock<std::sync::Mutex<KernelTokenizer>> = OnceLock::new();
    K.get_or_init(|| {
        std::sync::Mutex::new(
            KernelTokenizer::from_tables(tables()).expect("load the kernel tokenizer"),
        )
    })
    .lock()
    .unwrap()
}

#[test]
fn kernel_smoke() {
    let mut k = kernel();
    for s in [
        "hello world",
        "<|im_start|>user\nhé\u{301}llo 's 123<|im_end|>",
        "  \n\n x",
        "",
    ] {
        let got = k.encode(s).unwrap();
        let want = tokenizer().encode(s).unwrap();
        assert_eq!(got, want, "{s:?}");
    }
}
