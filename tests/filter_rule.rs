//! The packet filter's rule file (`FilterRule`): the spec's example parses with its defaults and
//! compiles with the real Qwen3 tokenizer into the token ids of its parts; every bad field is
//! refused with `Error::Rule` naming the field and what is allowed; and `payload_text` cuts the
//! payload as the spec says. No BPF here.

mod common;

use std::net::Ipv4Addr;

use qwen_bpf::filter::{payload_text, Action, FilterRule, Policy, Protocol};
use qwen_bpf::{Error, Tokenizer};
use serde_json::{json, Value};

/// The spec's example rule.
fn example() -> Value {
    json!({
      "interface": "lo",
      "protocol": "tcp",
      "ports": [80],
      "sources": ["10.0.0.0/8"],
      "bytes": 256,
      "first_line": true,
      "template": "<|im_start|>system\nIs this HTTP request benign or malicious?<|im_end|>\n<|im_start|>user\n{payload}<|im_end|>\n<|im_start|>assistant\n",
      "labels": [
        {"name": "benign", "text": "benign", "action": "pass"},
        {"name": "malicious", "text": "malicious", "action": "drop"}
      ],
      "margin": 0.0,
      "threshold": null,
      "fallback": "benign",
      "pending": "pass",
      "overflow": "pass",
      "ttl_seconds": 300,
      "slots": 2
    })
}

fn tokenizer() -> Tokenizer {
    Tokenizer::from_file(common::tokenizer_path()).expect("the Qwen3 tokenizer")
}

/// `v` with `change` applied, parsed.
fn parse(change: impl FnOnce(&mut Value)) -> qwen_bpf::Result<FilterRule> {
    let mut v = example();
    change(&mut v);
    FilterRule::from_json(&serde_json::to_string_pretty(&v).unwrap())
}

/// Asserts that `r` is `Error::Rule` for `field` with a message containing every one of `words`.
fn refused<T: std::fmt::Debug>(r: qwen_bpf::Result<T>, field: &str, words: &[&str]) {
    match r {
        Err(Error::Rule { field: f, msg }) => {
            assert_eq!(f, field, "the field of {msg:?}");
            for w in words {
                assert!(msg.contains(w), "{field}: {msg:?} lacks {w:?}");
            }
            eprintln!("refused: filter rule: {f}: {msg}");
        }
        other => panic!("{field}: expected Error::Rule, got {other:?}"),
    }
}

#[test]
fn the_example_rule_parses_with_its_defaults_and_compiles_into_its_parts_tokens() {
    let r = parse(|_| {}).unwrap();
    assert_eq!(r.protocol, Protocol::Tcp);
    assert_eq!(r.ports, [80]);
    assert_eq!(r.sources.len(), 1);
    assert_eq!(r.sources[0].addr(), Ipv4Addr::new(10, 0, 0, 0));
    assert_eq!(r.sources[0].prefix_len(), 8);
    assert!(r.sources[0].contains(Ipv4Addr::new(10, 1, 2, 3)));
    assert_eq!(r.labels[1].action, Action::Drop);
    // the defaults of every optional field
    let minimal = FilterRule::from_json(
        r#"{"interface": "eth0", "protocol": "udp", "ports": [53, 5353], "bytes": 64,
            "template": "Q: {payload}\nA:", "labels": [
              {"name": "ok", "text": " yes", "action": "count"},
              {"name": "bad", "text": " no", "action": "drop"}]}"#,
    )
    .unwrap();
    assert!(minimal.sources.is_empty() && !minimal.first_line);
    assert_eq!(
        (minimal.margin, minimal.threshold, minimal.fallback.clone()),
        (0.0, None, None)
    );
    // a UDP rule that names no policy fails open (a dropped datagram is lost), a TCP one closed
    // (a dropped segment is sent again): the judged packet does not reach the server first
    assert_eq!((minimal.pending, minimal.overflow), (None, None));
    assert_eq!(
        (minimal.pending_policy(), minimal.overflow_policy()),
        (Policy::Pass, Policy::Pass)
    );
    let mut tcp = minimal.clone();
    tcp.protocol = Protocol::Tcp;
    assert_eq!(
        (tcp.pending_policy(), tcp.overflow_policy()),
        (Policy::Drop, Policy::Drop)
    );
    tcp.pending = Some(Policy::Pass);
    assert_eq!(
        (tcp.pending_policy(), tcp.overflow_policy()),
        (Policy::Pass, Policy::Drop),
        "a policy the rule names is kept"
    );
    assert_eq!((minimal.ttl_seconds, minimal.slots), (300, 2));
    // a rule written back as JSON reads back the same
    let text = serde_json::to_string(&r).unwrap();
    assert_eq!(FilterRule::from_json(&text).unwrap(), r);

    let tok = tokenizer();
    let c = r.compile(&tok).unwrap();
    let (before, after) = r.template.split_once("{payload}").unwrap();
    assert_eq!(c.prefix(), tok.encode(before).unwrap());
    assert_eq!(c.suffix(), tok.encode(after).unwrap());
    // the chat markers are single added tokens
    let im_start = tok.token_id("<|im_start|>").unwrap();
    assert_eq!(c.prefix()[0], im_start);
    assert_eq!(*c.suffix().last().unwrap(), tok.encode("\n").unwrap()[0]);
    assert!(c.suffix().contains(&im_start));
    for (ids, l) in c.labels().iter().zip(&r.labels) {
        assert_eq!(ids, &tok.encode(&l.text).unwrap());
        assert!((1..=4).contains(&ids.len()), "{}: {ids:?}", l.text);
    }
    assert_eq!(
        (c.margin_q16(), c.threshold_q16(), c.fallback()),
        (0, None, 0)
    );
    let label_max = c.labels().iter().map(Vec::len).max().unwrap();
    assert_eq!(c.text_tokens_max(), 3 * 256);
    assert_eq!(
        c.context_needed(),
        c.prefix().len() + 3 * 256 + c.suffix().len() + label_max - 1
    );
    assert_eq!(c.rule(), &r);

    // margin, threshold and fallback in Q16
    let r = parse(|v| {
        v["margin"] = json!(0.25);
        v["threshold"] = json!(-1.5);
        v["fallback"] = json!("malicious");
    })
    .unwrap();
    let c = r.compile(&tok).unwrap();
    assert_eq!(
        (c.margin_q16(), c.threshold_q16(), c.fallback()),
        (16_384, Some(-98_304), 1)
    );
    // no prefix is allowed: the prompt starts with the payload
    let c = parse(|v| v["template"] = json!("{payload} is"))
        .unwrap()
        .compile(&tok)
        .unwrap();
    assert!(c.prefix().is_empty() && !c.suffix().is_empty());
}

#[test]
fn every_bad_field_is_refused_with_its_name_and_range() {
    type Change = fn(&mut Value);
    let cases: &[(&str, &[&str], Change)] = &[
        ("interface", &["1..=15"], |v| v["interface"] = json!("")),
        ("interface", &["1..=15"], |v| {
            v["interface"] = json!("a-very-long-name0")
        }),
        ("interface", &["'/'"], |v| v["interface"] = json!("eth/0")),
        ("ports", &["0 ports", "1..=8"], |v| v["ports"] = json!([])),
        ("ports", &["9 ports", "1..=8"], |v| {
            v["ports"] = json!([1, 2, 3, 4, 5, 6, 7, 8, 9])
        }),
        ("ports[1]", &["port 0"], |v| v["ports"] = json!([80, 0])),
        ("ports[2]", &["80", "twice"], |v| {
            v["ports"] = json!([80, 81, 80])
        }),
        ("sources", &["9 prefixes", "0..=8"], |v| {
            v["sources"] = json!((1..=9).map(|i| format!("10.0.0.{i}")).collect::<Vec<_>>())
        }),
        ("sources[1]", &["10.0.0.0/8", "twice"], |v| {
            v["sources"] = json!(["10.0.0.0/8", "10.0.0.0/8"])
        }),
        ("bytes", &["0", "1..=1024"], |v| v["bytes"] = json!(0)),
        ("bytes", &["1025", "1..=1024"], |v| v["bytes"] = json!(1025)),
        ("template", &["0 {payload}", "exactly one"], |v| {
            v["template"] = json!("no hole")
        }),
        ("template", &["2 {payload}", "exactly one"], |v| {
            v["template"] = json!("{payload} and {payload}")
        }),
        ("labels", &["1 labels", "2..=8"], |v| {
            v["labels"] = json!([v["labels"][0]])
        }),
        ("labels", &["9 labels", "2..=8"], |v| {
            v["labels"] = json!((0..9)
                .map(|i| json!({"name": format!("l{i}"), "text": "x", "action": "pass"}))
                .collect::<Vec<_>>())
        }),
        ("labels[1].name", &["\"benign\"", "unique"], |v| {
            v["labels"][1]["name"] = json!("benign")
        }),
        ("labels[0].name", &["1..=32"], |v| {
            v["labels"][0]["name"] = json!("")
        }),
        ("labels[0].name", &["1..=32"], |v| {
            v["labels"][0]["name"] = json!("x".repeat(33))
        }),
        ("labels[1].name", &["spaces"], |v| {
            v["labels"][1]["name"] = json!("very bad")
        }),
        ("labels[0].text", &["empty", "1..=4"], |v| {
            v["labels"][0]["text"] = json!("")
        }),
        ("margin", &["-0.1", "0..="], |v| v["margin"] = json!(-0.1)),
        ("threshold", &["0.5", "..=0"], |v| {
            v["threshold"] = json!(0.5)
        }),
        ("fallback", &["\"evil\"", "benign", "malicious"], |v| {
            v["fallback"] = json!("evil")
        }),
        ("ttl_seconds", &["0", "1..=86400"], |v| {
            v["ttl_seconds"] = json!(0)
        }),
        ("ttl_seconds", &["86401", "1..=86400"], |v| {
            v["ttl_seconds"] = json!(86_401)
        }),
        // the flow table's size is the kernel's (65,536 flows), not a rule's
        ("JSON", &["unknown field `flows`"], |v| {
            v["flows"] = json!(65_536)
        }),
        ("slots", &["0", "1..=8"], |v| v["slots"] = json!(0)),
        ("slots", &["9", "1..=8"], |v| v["slots"] = json!(9)),
        // what serde refuses: named by serde's message, with the line and column
        ("JSON", &["unknown field `colour`", "line"], |v| {
            v["colour"] = json!("red")
        }),
        ("JSON", &["unknown field `weight`", "line"], |v| {
            v["labels"][0]["weight"] = json!(1)
        }),
        ("JSON", &["missing field `template`"], |v| {
            v.as_object_mut().unwrap().remove("template");
        }),
        (
            "JSON",
            &["protocol \"icmp\"", "\"udp\", \"tcp\"", "line"],
            |v| v["protocol"] = json!("icmp"),
        ),
        ("JSON", &["label action \"reject\"", "\"count\""], |v| {
            v["labels"][1]["action"] = json!("reject")
        }),
        ("JSON", &["policy", "\"maybe\""], |v| {
            v["pending"] = json!("maybe")
        }),
        ("JSON", &["policy", "\"queue\""], |v| {
            v["overflow"] = json!("queue")
        }),
        ("JSON", &["70000", "u16"], |v| v["ports"] = json!([70000])),
        ("JSON", &["sources", "10.0.0.0/33"], |v| {
            v["sources"] = json!(["10.0.0.0/33"])
        }),
        ("JSON", &["sources", "10.0.0"], |v| {
            v["sources"] = json!(["10.0.0/8"])
        }),
        ("JSON", &["host bits", "10.0.0.0/8"], |v| {
            v["sources"] = json!(["10.1.2.3/8"])
        }),
        ("JSON", &["invalid type"], |v| v["bytes"] = json!("256")),
        ("JSON", &["invalid value", "-1"], |v| v["bytes"] = json!(-1)),
    ];
    for (field, words, change) in cases {
        refused(parse(change), field, words);
    }
    // not JSON at all: serde's line and column
    refused(
        FilterRule::from_json("{\n  \"interface\": \"lo\",\n  oops\n}"),
        "JSON",
        &["line 3 column 3"],
    );
    refused(FilterRule::from_json(""), "JSON", &["EOF"]);
}

#[test]
fn compiling_refuses_labels_of_too_many_tokens_and_a_template_ending_in_the_payload() {
    let tok = tokenizer();
    let r =
        parse(|v| v["labels"][1]["text"] = json!("a malicious request, most probably")).unwrap();
    let n = tok.encode(&r.labels[1].text).unwrap().len();
    assert!(n > 4, "the long label is {n} tokens");
    refused(
        r.compile(&tok),
        "labels[1].text",
        &[&format!("is {n} tokens"), "1..=4"],
    );
    let r = parse(|v| v["template"] = json!("Classify: {payload}")).unwrap();
    refused(r.compile(&tok), "template", &["nothing after {payload}"]);
    // compile validates a rule changed in code
    let mut r = parse(|_| {}).unwrap();
    r.bytes = 5000;
    refused(r.compile(&tok), "bytes", &["5000"]);
}

#[test]
fn loading_a_rule_file_names_the_file_in_its_errors() {
    let dir = common::scratch_dir();
    let path = dir.path().join("rule.json");
    std::fs::write(&path, serde_json::to_string(&example()).unwrap()).unwrap();
    assert_eq!(FilterRule::load(&path).unwrap(), parse(|_| {}).unwrap());
    let mut v = example();
    v["bytes"] = json!(0);
    std::fs::write(&path, serde_json::to_string(&v).unwrap()).unwrap();
    let e = FilterRule::load(&path).unwrap_err();
    refused::<()>(Err(e), "bytes", &[&path.display().to_string()]);
    let missing = dir.path().join("none.json");
    match FilterRule::load(&missing) {
        Err(Error::Io { path, .. }) => assert_eq!(path, missing),
        other => panic!("a missing file: {other:?}"),
    }
}

#[test]
fn payload_text_takes_the_first_bytes_the_first_line_and_the_longest_valid_utf8() {
    let mut r = parse(|v| v["bytes"] = json!(10)).unwrap();
    // first_line (the example's)
    assert_eq!(
        payload_text(&r, b"GET / HTTP/1.1\r\nHost: a\r\n"),
        "GET / HTTP"
    );
    assert_eq!(payload_text(&r, b"GET /\r\nHost: a"), "GET /");
    assert_eq!(payload_text(&r, b"GET /\nHost: a"), "GET /");
    assert_eq!(payload_text(&r, b"\nGET"), "");
    assert_eq!(payload_text(&r, b""), "");
    // a 4-byte character cut by bytes = 10 (its first byte is the 10th)
    assert_eq!(payload_text(&r, "abcdefghi😀".as_bytes()), "abcdefghi");
    assert_eq!(payload_text(&r, "abcdef😀".as_bytes()), "abcdef😀");
    // an invalid byte in the middle
    assert_eq!(payload_text(&r, b"GET /\xfe/x"), "GET /");
    r.first_line = false;
    assert_eq!(payload_text(&r, b"a\r\nb\nc"), "a\r\nb\nc");
    assert_eq!(payload_text(&r, b"\xc3"), "");
    assert_eq!(payload_text(&r, "é".as_bytes()), "é");
}
