//! The packet filter's in-kernel classifier (`filter_classify`: the steps the XDP filter's
//! workqueue runs — the text cut in BPF, the in-kernel tokenizer, the prompt fed after the
//! prefix's KV, the label log-probabilities by `flt_lse`, the decision) gives exactly the
//! integers of the user-space `Filter::classify`, for every label, on payloads that exercise
//! each step: HTTP lines, CR/LF cuts, a cut inside a character, invalid UTF-8, text longer than
//! `bytes`, NFC-lengthened text, empty text, binary bytes; with labels of one to four tokens, a
//! margin and a threshold. It also checks the refusals of the kernel side.
//! These load real BPF programs: they need root (or CAP_BPF + CAP_PERFMON).

mod common;

use qwen_bpf::filter::{Filter, FilterRule};
use qwen_bpf::{ModelOptions, Tokenizer};

fn rule(extra: &str) -> FilterRule {
    FilterRule::from_json(&format!(
        r#"{{"interface": "lo", "protocol": "tcp", "ports": [80], "bytes": 96, "first_line": true,
        "template": "<|im_start|>system\nIs this HTTP request benign or malicious?<|im_end|>\n<|im_start|>user\n{{payload}}<|im_end|>\n<|im_start|>assistant\n",
        "labels": [
          {{"name": "benign", "text": "benign", "action": "pass"}},
          {{"name": "malicious", "text": "malicious", "action": "drop"}},
          {{"name": "scan", "text": "malicious scanner probe", "action": "count"}}
        ]{extra}}}"#
    ))
    .expect("a valid rule")
}

fn payloads() -> Vec<Vec<u8>> {
    let mut p: Vec<Vec<u8>> = [
        "GET /index.html HTTP/1.1\r\nHost: example.com\r\n\r\n",
        "GET /../../etc/passwd HTTP/1.1",
        "POST /login.php?user=admin'-- HTTP/1.0",
        "GET /search?q=caf\u{e9}+cr\u{e8}me&page=2 HTTP/1.1",
        "",
        "\n",
        "GET /\u{1F600}\u{1F600}/\u{4F60}\u{597D} HTTP/1.1",
        "GET /cgi-bin/test.cgi?cmd=;cat%20/etc/passwd HTTP/1.1",
    ]
    .iter()
    .map(|s| s.as_bytes().to_vec())
    .collect();
    p.push(b"GET /\xff\xfe HTTP/1.1".to_vec());
    p.push(b"GET /\xe2\x82".to_vec()); // cut inside a character
    p.push(format!("GET /{} HTTP/1.1", "a".repeat(300)).into_bytes());
    p.push("\u{1D160}".repeat(20).into_bytes()); // NFC lengthens it
    p.push((0u8..=255).collect()); // binary: the text ends at the first CR/LF or bad byte
    p
}

#[test]
fn the_kernel_scores_every_label_with_the_integers_of_user_space() {
    let dir = common::tiny_model_with_tokenizer("filter-kernel");
    let tok = Tokenizer::from_file(common::tokenizer_path()).unwrap();
    for extra in [
        "",
        r#", "margin": 0.05, "fallback": "benign""#,
        r#", "threshold": -1.5"#,
    ] {
        let mut f = common::filter(&dir, &tok, rule(extra));
        for p in payloads() {
            let user = f.classify(&p).unwrap();
            let kernel = f.classify_in_kernel(&p).unwrap();
            assert_eq!(
                kernel,
                user,
                "kernel vs user space for {:?} (rule extra {extra:?})",
                String::from_utf8_lossy(&p)
            );
        }
    }
}

#[test]
fn the_kernel_side_refuses_a_model_without_slots_or_tokenizer() {
    let dir = common::tiny_model_with_tokenizer("filter-kernel");
    let tok = Tokenizer::from_file(common::tokenizer_path()).unwrap();
    let r = rule("");
    let ctx = r.compile(&tok).unwrap().context_needed();
    // no event slots: the rule's classification slots have no context
    let model = common::open(&dir, ModelOptions::default().with_max_context(ctx));
    let mut f = Filter::new(model, &tok, r.clone()).unwrap();
    let e = f.classify_in_kernel(b"GET / HTTP/1.1").unwrap_err();
    assert!(e.to_string().contains("event_slots"), "{e}");
    // slots, but no tokenizer in the arena
    let opts = ModelOptions::default()
        .with_max_context(ctx)
        .with_event_slots(2);
    let mut f = Filter::new(common::open(&dir, opts), &tok, r).unwrap();
    let e = f.classify_in_kernel(b"GET / HTTP/1.1").unwrap_err();
    assert!(e.to_string().contains("load_tokenizer"), "{e}");
}
