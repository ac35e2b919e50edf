//! The packet filter's demonstration model: runs this crate's `train_filter` binary (a short run,
//! 150 steps, about a minute and a half on 2 cores) and checks what it writes: the model
//! directory, the filter rule with the spec's fields, train and test sets that share no line, and
//! a held-out accuracy of at least 90 % for the f32 model.

#[path = "../../tests/common/mod.rs"]
mod common;

use std::collections::HashSet;
use std::process::Command;

use qwen_bpf::{Checkpoint, Tokenizer};
use serde_json::Value;

/// The `label<TAB>payload` lines of a data file, each checked to be well formed.
fn lines(path: &std::path::Path) -> Vec<(String, String)> {
    let text = std::fs::read_to_string(path).unwrap();
    text.lines()
        .map(|l| {
            let (label, payload) = l
                .split_once('\t')
                .unwrap_or_else(|| panic!("no tab: {l:?}"));
            assert!(
                label == "benign" || label == "malicious",
                "label {label:?} in {}",
                path.display()
            );
            assert!(
                payload.len() <= 256 && !payload.contains(['\r', '\n']),
                "payload {payload:?}: the filter would not read all of it"
            );
            (label.to_string(), payload.to_string())
        })
        .collect()
}

#[test]
fn train_filter_writes_a_model_its_rule_and_honest_data() {
    let dir = common::scratch_dir();
    let out = dir.path().join("filter");
    let o = Command::new(env!("CARGO_BIN_EXE_train_filter"))
        .args(["--steps", "150", "--tokenizer"])
        .arg(common::tokenizer_path())
        .arg("--out")
        .arg(&out)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "train_filter failed: {stderr}");

    // The model directory opens as a checkpoint, with the Qwen3 tokenizer beside it.
    let model = out.join("model");
    for f in ["config.json", "model.safetensors", "tokenizer.json"] {
        assert!(model.join(f).is_file(), "no model/{f}");
    }
    let ck = Checkpoint::open(&model).unwrap();
    assert_eq!(ck.config.vocab_size, 151_936);
    assert!(ck.config.tie_word_embeddings);
    let tok = Tokenizer::from_model_dir(&model).unwrap();

    // The rule: the spec's fields, for TCP port 80 on lo, with a template holding one {payload}
    // and labels of 1-4 tokens.
    let rule: Value = serde_json::from_str(&std::fs::read_to_string(out.join("rule")).unwrap())
        .expect("the rule is JSON");
    assert_eq!(rule["interface"], "lo");
    assert_eq!(rule["protocol"], "tcp");
    assert_eq!(rule["ports"], serde_json::json!([80]));
    assert_eq!(rule["bytes"], 256);
    assert_eq!(rule["first_line"], true);
    let template = rule["template"].as_str().unwrap();
    assert_eq!(template.matches("{payload}").count(), 1);
    let labels = rule["labels"].as_array().unwrap();
    let names: Vec<&str> = labels.iter().map(|l| l["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["benign", "malicious"]);
    assert_eq!(labels[0]["action"], "pass");
    assert_eq!(labels[1]["action"], "drop");
    for l in labels {
        let n = tok.encode(l["text"].as_str().unwrap()).unwrap().len();
        assert!((1..=4).contains(&n), "label {l}: {n} tokens");
    }
    assert_eq!(rule["margin"], 0.0);
    assert_eq!(rule["fallback"], "benign");
    assert_eq!(rule["pending"], "drop");
    assert_eq!(rule["overflow"], "drop");
    assert_eq!(rule["ttl_seconds"], 300);
    assert_eq!(rule["slots"], 2);
    // and the library's parser takes it as it is
    let parsed = qwen_bpf::filter::FilterRule::load(out.join("rule")).expect("the rule parses");
    let compiled = parsed.compile(&tok).expect("the rule compiles");
    assert_eq!(compiled.labels().len(), 2);

    // The data: both classes in both sets, and no test line in training.
    let train = lines(&out.join("data/train.tsv"));
    let test = lines(&out.join("data/test.tsv"));
    assert!(
        train.len() >= 2000 && test.len() >= 500,
        "{} / {} lines",
        train.len(),
        test.len()
    );
    for (name, set) in [("train", &train), ("test", &test)] {
        let bad = set.iter().filter(|(l, _)| l == "malicious").count() as f64 / set.len() as f64;
        assert!((0.35..=0.65).contains(&bad), "{name}: {bad:.2} malicious");
    }
    let seen: HashSet<&str> = train.iter().map(|(_, p)| p.as_str()).collect();
    let shared = test
        .iter()
        .filter(|(_, p)| seen.contains(p.as_str()))
        .count();
    assert_eq!(shared, 0, "{shared} test lines are in the training set");

    // The held-out accuracy of the f32 model, and the reference's agreement with candle on the
    // written (BF16) checkpoint.
    let report: Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("report.json")).unwrap()).unwrap();
    let accuracy = report["model_f32"]["accuracy"].as_f64().unwrap();
    eprintln!(
        "f32 accuracy {accuracy:.4}, baseline {}",
        report["baseline_regex"]["accuracy"]
    );
    assert!(
        accuracy >= 0.9,
        "held-out accuracy {accuracy:.4} < 0.9\n{stderr}"
    );
    let diff = report["reference_check"]["max_diff_bf16"].as_f64().unwrap();
    assert!(
        diff < 1e-2,
        "reference and candle label scores differ by {diff}"
    );
}
