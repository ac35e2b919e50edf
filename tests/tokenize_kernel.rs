//! The in-kernel tokenizer (`src/bpf/tokenize.inc.c`) against its Rust twin
//! (`qwen_bpf::num::tok_twin`) and the `tokenizers` crate, on a generated corpus of 14,000
//! strings, and its refusals. The kernel tests load real BPF programs (root), on the arena; the
//! `array_` ones the same on the array memory layer (mmapable array maps: every kernel, and a
//! host that refuses arenas).

mod common;
#[path = "tok_corpus/mod.rs"]
mod tok_corpus;

use std::sync::OnceLock;

use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use qwen_bpf::num::limits::{TOK_IDS_MAX, TOK_MARKS_MAX, TOK_TEXT_MAX, TOK_WORD_MAX};
use qwen_bpf::num::tok_tables::TokTables;
use qwen_bpf::num::tok_twin::{self, err};
use qwen_bpf::{Error, KernelTokenizer, MemoryLayer, ModelOptions, Tokenizer};

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

/// The kernel tokenizer of the Qwen3 tables on `layer` (one BPF object per layer for the whole
/// test binary).
fn kernel_on(layer: MemoryLayer) -> MutexGuard<'static, KernelTokenizer> {
    static K: [OnceLock<Mutex<KernelTokenizer>>; 2] = [OnceLock::new(), OnceLock::new()];
    K[(layer == MemoryLayer::Array) as usize]
        .get_or_init(|| {
            let k = KernelTokenizer::from_tables_on(tables(), layer)
                .unwrap_or_else(|e| panic!("load the kernel tokenizer on the {layer} layer: {e}"));
            assert_eq!(k.layer(), layer);
            Mutex::new(k)
        })
        .lock()
        .unwrap()
}

fn kernel() -> MutexGuard<'static, KernelTokenizer> {
    kernel_on(MemoryLayer::Arena)
}

fn array_kernel() -> MutexGuard<'static, KernelTokenizer> {
    kernel_on(MemoryLayer::Array)
}

fn mb_s(bytes: usize, t: Duration) -> f64 {
    bytes as f64 / 1e6 / t.as_secs_f64()
}

#[test]
fn the_kernel_equals_the_twin_and_the_tokenizers_crate_on_the_corpus() {
    equals_the_twin_and_the_crate_on_the_corpus(kernel());
}

#[test]
fn array_the_kernel_equals_the_twin_and_the_tokenizers_crate_on_the_corpus() {
    equals_the_twin_and_the_crate_on_the_corpus(array_kernel());
}

fn equals_the_twin_and_the_crate_on_the_corpus(mut k: MutexGuard<'static, KernelTokenizer>) {
    let corpus = tok_corpus::corpus();
    let bytes: usize = corpus.iter().map(String::len).sum();
    assert!(corpus.len() >= 10_000);
    let t0 = Instant::now();
    let want: Vec<Vec<u32>> = corpus
        .iter()
        .map(|s| tokenizer().encode(s).unwrap())
        .collect();
    let t_crate = t0.elapsed();
    let t0 = Instant::now();
    let got: Vec<Vec<u32>> = corpus.iter().map(|s| k.encode(s).unwrap()).collect();
    let t_kernel = t0.elapsed();
    let t0 = Instant::now();
    let twin: Vec<Vec<u32>> = corpus
        .iter()
        .map(|s| tok_twin::tokenize(&tables().words, s.as_bytes(), TOK_IDS_MAX).unwrap())
        .collect();
    let t_twin = t0.elapsed();
    eprintln!(
        "corpus: {} strings, {bytes} bytes, {} ids; kernel ({} layer) {:.2} MB/s, tokenizers crate {:.2} MB/s, twin {:.2} MB/s",
        corpus.len(),
        want.iter().map(Vec::len).sum::<usize>(),
        k.layer(),
        mb_s(bytes, t_kernel),
        mb_s(bytes, t_crate),
        mb_s(bytes, t_twin),
    );
    assert_eq!(mismatches("kernel vs crate", &got, &want, &corpus), 0);
    assert_eq!(mismatches("twin vs crate", &twin, &want, &corpus), 0);
}

#[test]
fn the_kernel_refuses_what_exceeds_its_limits_as_the_twin_does() {
    refuses_what_exceeds_its_limits_as_the_twin_does(kernel());
}

#[test]
fn array_the_kernel_refuses_what_exceeds_its_limits_as_the_twin_does() {
    refuses_what_exceeds_its_limits_as_the_twin_does(array_kernel());
}

fn refuses_what_exceeds_its_limits_as_the_twin_does(mut k: MutexGuard<'static, KernelTokenizer>) {
    let w = &tables().words;
    // (text, max_out, the code both must give)
    let long_word = "a".repeat(TOK_WORD_MAX + 1);
    let marks = format!("a{}", "\u{301}".repeat(TOK_MARKS_MAX + 1));
    let cases: Vec<(Vec<u8>, usize, i32)> = vec![
        (vec![b'a'; TOK_TEXT_MAX + 1], TOK_IDS_MAX, err::TEXT),
        ("hello world, hello kernel".into(), 3, err::IDS),
        ("<|im_start|><|im_end|>".into(), 1, err::IDS),
        ("x".into(), TOK_IDS_MAX + 1, err::IDS),
        (long_word.into_bytes(), TOK_IDS_MAX, err::WORD),
        (marks.into_bytes(), TOK_IDS_MAX, err::MARKS),
        (vec![b'a', 0xc3, b'(', b'b'], TOK_IDS_MAX, err::UTF8),
        (vec![0xed, 0xa0, 0x80], TOK_IDS_MAX, err::UTF8),
        (vec![0xc0, 0xaf], TOK_IDS_MAX, err::UTF8),
    ];
    for (text, max_out, code) in cases {
        let head = String::from_utf8_lossy(&text[..text.len().min(40)]).into_owned();
        let twin = tok_twin::tokenize(w, &text, max_out);
        assert_eq!(twin, Err(code), "twin on {head:?}…");
        if max_out <= TOK_IDS_MAX {
            assert_eq!(
                k.encode_raw(&text, max_out).unwrap(),
                Err(code),
                "kernel on {head:?}…"
            );
        }
    }
    // the limits themselves still pass
    let word = "a".repeat(TOK_WORD_MAX);
    assert_eq!(k.encode(&word).unwrap(), tokenizer().encode(&word).unwrap());
    let text = "ab ".repeat(TOK_TEXT_MAX / 3);
    assert_eq!(k.encode(&text).unwrap(), tokenizer().encode(&text).unwrap());
    let ids = tokenizer().encode("hello world").unwrap();
    assert_eq!(k.encode_raw(b"hello world", ids.len()).unwrap(), Ok(ids));
    // the public API names the limit
    match k.encode(&"a".repeat(TOK_TEXT_MAX + 1)) {
        Err(Error::Limit { value, .. }) => assert_eq!(value, TOK_TEXT_MAX + 1),
        other => panic!("an over-long text gave {other:?}"),
    }
    assert!(matches!(
        k.encode(&"b".repeat(TOK_WORD_MAX + 1)),
        Err(Error::Limit { .. })
    ));
}

/// `tokenizer.json` changed by `edit`, loaded.
fn edited(edit: impl Fn(&mut serde_json::Value)) -> Tokenizer {
    let mut j: serde_json::Value = serde_json::from_slice(&std::fs::read(QWEN3).unwrap()).unwrap();
    edit(&mut j);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tokenizer.json");
    std::fs::write(&path, serde_json::to_vec(&j).unwrap()).unwrap();
    Tokenizer::from_file(&path).unwrap()
}

#[test]
fn tokenizers_of_another_kind_are_refused_with_a_typed_error() {
    use serde_json::json;
    type Edit = Box<dyn Fn(&mut serde_json::Value)>;
    let edits: Vec<(&str, Edit)> = vec![
        (
            "NFKC",
            Box::new(|j| j["normalizer"] = json!({"type": "NFKC"})),
        ),
        ("no normalizer", Box::new(|j| j["normalizer"] = json!(null))),
        (
            "GPT-2 byte level",
            Box::new(|j| {
                j["pre_tokenizer"] = json!({"type": "ByteLevel", "add_prefix_space": false,
                    "trim_offsets": true, "use_regex": true})
            }),
        ),
        (
            "another split regex",
            Box::new(|j| {
                j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = json!(r"\s+")
            }),
        ),
        (
            "ignore_merges",
            Box::new(|j| j["model"]["ignore_merges"] = json!(true)),
        ),
        (
            "an lstrip added token",
            Box::new(|j| j["added_tokens"][3]["lstrip"] = json!(true)),
        ),
    ];
    for (what, edit) in edits {
        match TokTables::build(&edited(edit)) {
            Err(Error::Tokenizer { msg, .. }) => eprintln!("{what}: refused: {msg:.120}"),
            other => panic!("{what}: expected a refusal, got {:?}", other.map(|_| ())),
        }
    }
}

/// A tokenizer of the same structure with another vocabulary: Qwen's first `n` merges, the
/// tokens they make and the bytes, renumbered, and the added tokens after them.
fn small_vocab(n: usize) -> Tokenizer {
    edited(|j| {
        let merges: Vec<serde_json::Value> = j["model"]["merges"].as_array().unwrap()[..n].to_vec();
        let old = j["model"]["vocab"].as_object().unwrap().clone();
        let mut byte_tokens: Vec<(&String, u64)> = old
            .iter()
            .map(|(t, id)| (t, id.as_u64().unwrap()))
            .filter(|(t, _)| t.chars().count() == 1)
            .collect();
        byte_tokens.sort_by_key(|&(_, id)| id);
        let mut vocab = serde_json::Map::new();
        for (t, _) in byte_tokens {
            let id = vocab.len();
            vocab.insert(t.clone(), id.into());
        }
        for m in &merges {
            let t = format!("{}{}", m[0].as_str().unwrap(), m[1].as_str().unwrap());
            if !vocab.contains_key(&t) {
                let id = vocab.len();
                vocab.insert(t, id.into());
            }
        }
        let base = vocab.len();
        for (i, a) in j["added_tokens"]
            .as_array_mut()
            .unwrap()
            .iter_mut()
            .enumerate()
        {
            a["id"] = (base + i).into();
        }
        j["model"]["vocab"] = vocab.into();
        j["model"]["merges"] = merges.into();
    })
}

#[test]
fn another_vocabulary_of_the_same_structure_gives_the_crates_ids_in_the_kernel() {
    let tok = small_vocab(3000);
    let t = TokTables::build(&tok).unwrap();
    let mut k = KernelTokenizer::from_tables(&t).unwrap();
    let corpus: Vec<String> = tok_corpus::corpus().into_iter().step_by(5).collect();
    let want: Vec<Vec<u32>> = corpus.iter().map(|s| tok.encode(s).unwrap()).collect();
    let got: Vec<Vec<u32>> = corpus.iter().map(|s| k.encode(s).unwrap()).collect();
    let twin: Vec<Vec<u32>> = corpus
        .iter()
        .map(|s| tok_twin::tokenize(&t.words, s.as_bytes(), TOK_IDS_MAX).unwrap())
        .collect();
    assert_eq!(mismatches("kernel (small vocab)", &got, &want, &corpus), 0);
    assert_eq!(mismatches("twin (small vocab)", &twin, &want, &corpus), 0);
    // and a genuine directory layout: tokenizer.json found by Tokenizer::from_model_dir
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(QWEN3, dir.path().join("tokenizer.json")).unwrap();
    let from_dir = Tokenizer::from_model_dir(dir.path()).unwrap();
    assert_eq!(TokTables::build(&from_dir).unwrap().words, tables().words);
}

#[test]
fn verifier_instructions_of_the_tokenizer_program() {
    verifier_instructions(kernel());
}

#[test]
fn array_verifier_instructions_of_the_tokenizer_program() {
    verifier_instructions(array_kernel());
}

fn verifier_instructions(k: MutexGuard<'static, KernelTokenizer>) {
    let counts = k.verified_instructions().unwrap();
    let (_, n) = counts
        .iter()
        .find(|(name, _)| name == "tokenize_text")
        .expect("the tokenize_text program is loaded");
    eprintln!(
        "verified instructions ({} layer): tokenize_text {n}",
        k.layer()
    );
    assert!(
        *n > 0 && *n <= 500_000,
        "tokenize_text: {n} processed instructions"
    );
}

#[test]
fn a_models_arena_tokenizes_with_the_same_program() {
    a_model_tokenizes_with_the_same_program(MemoryLayer::Arena);
}

#[test]
fn array_a_models_array_maps_tokenize_with_the_same_program() {
    a_model_tokenizes_with_the_same_program(MemoryLayer::Array);
}

fn a_model_tokenizes_with_the_same_program(layer: MemoryLayer) {
    let dir = common::tiny_model_with_tokenizer("tokenize-kernel");
    let tok = Tokenizer::from_model_dir(&dir).unwrap();
    let mut m = common::open(
        &dir,
        ModelOptions::default()
            .with_max_context(16)
            .with_cache_dir(dir.join(format!("cache-{layer}")))
            .with_memory(layer),
    );
    assert!(
        matches!(m.tokenize_in_kernel("x"), Err(Error::Invalid(_))),
        "no tables loaded yet"
    );
    m.load_tokenizer(&tok).unwrap();
    assert!(m.load_tokenizer(&tok).is_err(), "loaded twice");
    eprintln!(
        "tables: {} bytes; reserved in the model's arena: {} bytes",
        tables().words.len() * 4,
        m.kernel_memory().tokenizer
    );
    let corpus: Vec<String> = tok_corpus::corpus().into_iter().step_by(20).collect();
    for s in &corpus {
        assert_eq!(
            m.tokenize_in_kernel(s).unwrap(),
            tok.encode(s).unwrap(),
            "{s:?}"
        );
    }
    // and the model still runs after it
    let ids = m.tokenize_in_kernel("Hello").unwrap();
    assert!(m.forward(ids[0]).is_ok());
}

#[test]
fn the_tokenize_example_prints_the_same_ids_both_ways() {
    use std::io::Write;
    use std::process::{Command, Stdio};
    let input = "Hello, world!\n\n<|im_start|>user\nnaïve café 's\n  trailing  \n東京 😀 123\n";
    let run = |kernel: bool| {
        let mut cmd = Command::new(common::example_bin("tokenize"));
        cmd.args(["--tokenizer", QWEN3]);
        if kernel {
            cmd.arg("--in-kernel");
        }
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        child
            .stdin
            .take()
            .unwrap()
            .write_all(input.as_bytes())
            .unwrap();
        let o = child.wait_with_output().unwrap();
        assert!(o.status.success(), "tokenize example (in kernel: {kernel})");
        String::from_utf8(o.stdout).unwrap()
    };
    let want: String = input
        .lines()
        .map(|l| {
            let ids = tokenizer().encode(l).unwrap();
            ids.iter().map(u32::to_string).collect::<Vec<_>>().join(" ") + "\n"
        })
        .collect();
    assert_eq!(want.lines().nth(1), Some(""), "an empty line stays empty");
    assert_eq!(run(false), want);
    assert_eq!(run(true), want);
}
