//! The packet filter's classifier (`Filter`) on the tiny synthetic model with the real Qwen3
//! tokenizer: its scores are exactly those of a from-scratch computation (a fresh context, the
//! whole prompt and a label's earlier tokens fed token by token with `forward_fixed`, scored with
//! `num::classify`), so that the prefix's KV reuse, the prefill blocks and the rewinds change no
//! integer; it is deterministic; it agrees with the f32 `Reference`'s log-softmax; and its
//! refusals (a model too small for the rule, ids outside the vocabulary) are typed errors.
//! These load real BPF programs: they need root (or CAP_BPF + CAP_PERFMON).

mod common;

use qwen_bpf::filter::{payload_text, CompiledRule, Filter, FilterRule};
use qwen_bpf::hf::synth::{Preset, SynthOptions};
use qwen_bpf::num::classify::{decide, log_prob_q16, lse_q16};
use qwen_bpf::num::fixed::exp2_table;
use qwen_bpf::{Checkpoint, Error, Model, ModelOptions, Reference, Tokenizer};

/// A rule like the spec's, on 64 bytes, with labels of one to four tokens, two of them starting
/// alike.
fn rule_json(extra: &str) -> String {
    format!(
        r#"{{"interface": "lo", "protocol": "tcp", "ports": [80], "bytes": 64, "first_line": true,
        "template": "<|im_start|>system\nIs this HTTP request benign or malicious?<|im_end|>\n<|im_start|>user\n{{payload}}<|im_end|>\n<|im_start|>assistant\n",
        "labels": [
          {{"name": "benign", "text": "benign", "action": "pass"}},
          {{"name": "malicious", "text": "malicious", "action": "drop"}},
          {{"name": "scan", "text": "malicious scanner probe", "action": "count"}}
        ]{extra}}}"#
    )
}

/// Payloads: HTTP request lines, an empty one, one cut inside a character, invalid UTF-8, one
/// longer than `bytes`, and one of characters that NFC lengthens.
fn payloads() -> Vec<Vec<u8>> {
    let mut p: Vec<Vec<u8>> = [
        "GET /index.html HTTP/1.1\r\nHost: example.com\r\n\r\n",
        "GET /../../etc/passwd HTTP/1.1",
        "POST /login.php?user=admin'-- HTTP/1.0",
        "",
        "\r\n",
        "GET /caf\u{e9}/\u{1F600}\u{1F600} HTTP/1.1",
    ]
    .iter()
    .map(|s| s.as_bytes().to_vec())
    .collect();
    p.push(b"GET /\xff\xfe HTTP/1.1".to_vec());
    p.push(format!("GET /{} HTTP/1.1", "a".repeat(200)).into_bytes());
    // U+1D160 (4 bytes) is 12 bytes after NFC
    p.push("\u{1D160}".repeat(16).into_bytes());
    p
}

fn tokenizer() -> Tokenizer {
    Tokenizer::from_file(common::tokenizer_path()).expect("the Qwen3 tokenizer")
}

fn options(max_context: usize) -> ModelOptions {
    ModelOptions::default().with_max_context(max_context)
}

/// Every label's score, computed from scratch: for each label, a fresh context fed the whole
/// prompt and the label's earlier tokens one by one with `forward_fixed`.
fn from_scratch(m: &mut Model, c: &CompiledRule, tok: &Tokenizer, payload: &[u8]) -> Vec<i64> {
    let tab = exp2_table();
    let text = payload_text(c.rule(), payload);
    let mut prompt = c.prefix().to_vec();
    if !text.is_empty() {
        prompt.extend(tok.encode(text).unwrap());
    }
    prompt.extend_from_slice(c.suffix());
    c.labels()
        .iter()
        .map(|label| {
            m.reset();
            let mut score = 0;
            let mut fed = prompt.clone();
            fed.extend_from_slice(&label[..label.len() - 1]);
            let mut logits = Vec::new();
            let first = prompt.len() - 1; // the logits after this token score label[0]
            for (i, &t) in fed.iter().enumerate() {
                logits = m.forward_fixed(t).unwrap().to_vec();
                if i >= first {
                    let next = label[i - first] as usize;
                    score += log_prob_q16(&logits, next, lse_q16(&logits, &tab));
                }
            }
            assert!(!logits.is_empty());
            score
        })
        .collect()
}

#[test]
fn classify_equals_a_from_scratch_computation_and_is_deterministic() {
    let dir = common::tiny_model_with_tokenizer("filter-classify");
    let tok = tokenizer();
    let rule = FilterRule::from_json(&rule_json("")).unwrap();
    let c = rule.compile(&tok).unwrap();
    let lens: Vec<usize> = c.labels().iter().map(Vec::len).collect();
    assert!(
        lens.iter().any(|&n| n > 1),
        "the labels' token counts {lens:?}: a rewind needs one of several tokens"
    );
    assert_eq!(c.labels()[1][0], c.labels()[2][0], "two labels start alike");
    let ctx = c.context_needed();
    let model = common::open(&dir, options(ctx));
    let mut f = Filter::new(model, &tok, rule.clone()).unwrap();
    assert_eq!(f.model_mut().position(), c.prefix().len());
    let mut scratch = common::open(&dir, options(ctx));
    let payloads = payloads();
    let mut first = Vec::new();
    for p in &payloads {
        let v = f.classify(p).unwrap();
        let want = from_scratch(&mut scratch, &c, &tok, p);
        assert_eq!(
            v.scores_q16,
            want,
            "{:?}: Filter::classify vs from scratch",
            String::from_utf8_lossy(p)
        );
        let text = payload_text(&rule, p);
        let n = if text.is_empty() {
            0
        } else {
            tok.encode(text).unwrap().len()
        };
        assert_eq!(v.tokens, n);
        assert!(v.tokens <= c.text_tokens_max());
        assert_eq!(v.label, decide(&want, 0, None, 0));
        assert_eq!(v.score_q16, want[v.label]);
        assert_eq!(v.name, rule.labels[v.label].name);
        assert_eq!(v.action, rule.labels[v.label].action);
        assert_eq!(
            v.to_string(),
            format!("{} {:.4}", v.name, v.score_q16 as f64 / 65536.0)
        );
        assert!(
            v.scores_q16.iter().all(|&s| s <= 16),
            "log-probabilities: {:?}",
            v.scores_q16
        );
        eprintln!(
            "{:?}: {v} ({} tokens) {:?}",
            String::from_utf8_lossy(p),
            v.tokens,
            v.scores_q16
        );
        first.push(v);
    }
    // NFC lengthened the last payload: more tokens than bytes
    assert!(
        first.last().unwrap().tokens > 64,
        "{}",
        first.last().unwrap().tokens
    );
    // again, in another order: the same verdicts
    for (p, want) in payloads.iter().zip(&first).rev() {
        assert_eq!(&f.classify(p).unwrap(), want);
    }
    // a model reset through model_mut gets its prefix again
    f.model_mut().reset();
    assert_eq!(f.classify(&payloads[1]).unwrap(), first[1]);
    let (model, compiled) = f.into_parts();
    assert_eq!(model.position(), c.prefix().len());
    assert_eq!(compiled, c);
}

#[test]
fn the_margin_and_threshold_fall_back_on_the_same_scores() {
    let dir = common::tiny_model_with_tokenizer("filter-classify");
    let tok = tokenizer();
    let plain = FilterRule::from_json(&rule_json("")).unwrap();
    let ctx = plain.compile(&tok).unwrap().context_needed();
    let p = b"GET /index.html HTTP/1.1";
    let mut f = Filter::new(common::open(&dir, options(ctx)), &tok, plain).unwrap();
    let base = f.classify(p).unwrap();
    let model = f.into_parts().0;
    // an unreachable margin: always the fallback, with its own score
    let wide =
        FilterRule::from_json(&rule_json(r#", "margin": 1000, "fallback": "scan""#)).unwrap();
    let mut f = Filter::new(model, &tok, wide).unwrap();
    let v = f.classify(p).unwrap();
    assert_eq!((v.label, v.name.as_str()), (2, "scan"));
    assert_eq!(v.scores_q16, base.scores_q16);
    assert_eq!(v.score_q16, base.scores_q16[2]);
    let model = f.into_parts().0;
    // a threshold of 0: only a certain label passes it
    let sure =
        FilterRule::from_json(&rule_json(r#", "threshold": 0, "fallback": "malicious""#)).unwrap();
    let mut f = Filter::new(model, &tok, sure).unwrap();
    let v = f.classify(p).unwrap();
    assert!(base.score_q16 < 0);
    assert_eq!(
        (v.label, v.scores_q16.clone()),
        (1, base.scores_q16.clone())
    );
    // a margin met by the gap: the best label
    let gap = {
        let mut s = base.scores_q16.clone();
        s.sort_unstable();
        s[2] - s[1]
    };
    let model = f.into_parts().0;
    let met = format!(
        r#", "margin": {}, "fallback": "scan""#,
        gap as f64 / 65536.0
    );
    let mut f = Filter::new(
        model,
        &tok,
        FilterRule::from_json(&rule_json(&met)).unwrap(),
    )
    .unwrap();
    assert_eq!(f.classify(p).unwrap().label, base.label);
}

#[test]
fn scores_agree_with_the_f32_reference_log_softmax() {
    let dir = common::tiny_model_with_tokenizer("filter-classify");
    let tok = tokenizer();
    let rule = FilterRule::from_json(&rule_json("")).unwrap();
    let c = rule.compile(&tok).unwrap();
    let ctx = c.context_needed();
    let mut f = Filter::new(common::open(&dir, options(ctx)), &tok, rule.clone()).unwrap();
    let mut r = Reference::new(&Checkpoint::open(&dir).unwrap(), ctx).unwrap();
    let mut worst = 0.0f64;
    for p in payloads() {
        let v = f.classify(&p).unwrap();
        let text = payload_text(&rule, &p);
        let mut prompt = c.prefix().to_vec();
        if !text.is_empty() {
            prompt.extend(tok.encode(text).unwrap());
        }
        prompt.extend_from_slice(c.suffix());
        for (label, &got) in c.labels().iter().zip(&v.scores_q16) {
            r.reset();
            let mut fed = prompt.clone();
            fed.extend_from_slice(&label[..label.len() - 1]);
            let first = prompt.len() - 1;
            let mut want = 0.0f64;
            for (i, &t) in fed.iter().enumerate() {
                let logits = r.forward(t).unwrap();
                if i >= first {
                    let m = logits.iter().fold(f32::MIN, |a, &b| a.max(b)) as f64;
                    let lse = m + logits
                        .iter()
                        .map(|&z| (z as f64 - m).exp())
                        .sum::<f64>()
                        .ln();
                    want += logits[label[i - first] as usize] as f64 - lse;
                }
            }
            let err = (got as f64 / 65536.0 - want).abs();
            worst = worst.max(err);
            assert!(
                err < 0.01,
                "{:?}, label {label:?}: {} vs f32 {want}",
                String::from_utf8_lossy(&p),
                got as f64 / 65536.0
            );
        }
    }
    eprintln!("label scores vs the f32 reference: max |difference| {worst:.5} nats");
}

#[test]
fn a_model_too_small_for_the_rule_is_refused() {
    let tok = tokenizer();
    let rule = FilterRule::from_json(&rule_json("")).unwrap();
    let need = rule.compile(&tok).unwrap().context_needed();
    let dir = common::tiny_model_with_tokenizer("filter-classify");
    match Filter::new(common::open(&dir, options(need - 1)), &tok, rule.clone()) {
        Err(Error::ContextOverflow {
            max_context,
            tokens,
            ..
        }) => {
            assert_eq!((max_context, tokens), (need - 1, need))
        }
        other => panic!("context {} for a rule needing {need}: {other:?}", need - 1),
    }
    // a vocabulary without the chat markers' ids
    let mut cfg = Preset::Tiny.config();
    cfg.vocab_size = 4096;
    let small = common::model_with("filter-vocab-4096", &cfg, &SynthOptions::default());
    match Filter::new(common::open(&small, options(need)), &tok, rule) {
        Err(Error::TokenOutOfRange { id, vocab, .. }) => {
            assert_eq!(vocab, 4096);
            assert!(id >= 4096);
        }
        other => panic!("a vocabulary of 4096: {other:?}"),
    }
}

#[test]
fn the_filter_example_prints_each_lines_verdict() {
    let dir = common::tiny_model_with_tokenizer("filter-classify");
    let tok = tokenizer();
    let scratch = common::scratch_dir();
    let rule_path = scratch.path().join("rule.json");
    std::fs::write(
        &rule_path,
        rule_json(r#", "first_line": false"#).replace(r#""first_line": true,"#, ""),
    )
    .unwrap();
    let rule = FilterRule::load(&rule_path).unwrap();
    assert!(!rule.first_line);
    // lines end at \n only: the \r of the second line is part of its payload
    let input: &[u8] = b"GET /index.html HTTP/1.1\nGET / HTTP/1.1\r\n\nPOST /x\xff HTTP/1.0";
    let lines: Vec<&[u8]> = input.split(|&b| b == b'\n').collect();
    let mut child = std::process::Command::new(common::example_bin("filter"))
        .args(["classify", "--model"])
        .arg(&dir)
        .arg("--rule")
        .arg(&rule_path)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run the filter example");
    use std::io::Write;
    child.stdin.take().unwrap().write_all(input).unwrap();
    let o = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "filter classify: {err}");
    let got = String::from_utf8(o.stdout).unwrap();
    let ctx = rule.compile(&tok).unwrap().context_needed();
    let mut f = Filter::new(common::open(&dir, options(ctx)), &tok, rule).unwrap();
    let want: String = lines
        .iter()
        .map(|l| format!("{}\n", f.classify(l).unwrap()))
        .collect();
    assert_eq!(got, want, "stderr: {err}");
    assert_eq!(got.lines().count(), 4);
    // with and without the \r: two payloads
    assert_ne!(
        f.classify(b"GET / HTTP/1.1\r").unwrap().scores_q16,
        f.classify(b"GET / HTTP/1.1").unwrap().scores_q16
    );
    // a bad rule: a message and a failure
    std::fs::write(
        &rule_path,
        rule_json(r#", "bytes": 0"#).replace(r#""bytes": 64,"#, ""),
    )
    .unwrap();
    let o = std::process::Command::new(common::example_bin("filter"))
        .args(["classify", "--model"])
        .arg(&dir)
        .arg("--rule")
        .arg(&rule_path)
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && err.contains("bytes: 0: expected 1..=1024"),
        "{err}"
    );
}
