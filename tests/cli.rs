//! The `qwen-bpf` command: its subcommands are listed, each refuses a bad input with one line
//! `COMMAND: error: CAUSE` and exit status 1 and leaves nothing installed, and each runs its happy
//! path. The tests named `kernel_*` need BPF arenas: `scripts/test.sh` runs them in the VMs of the
//! kernel matrix (`scripts/smoke.txt`) where the host refuses arenas, here otherwise.

mod common;

use std::io::Write;
use std::path::Path;
use std::process::{Command, Output, Stdio};

use qwen_bpf::Tokenizer;

/// `qwen-bpf ARGS` with `stdin` on its standard input.
fn qwen_bpf(args: &[&str], stdin: &[u8]) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_qwen-bpf"))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("running qwen-bpf");
    child.stdin.take().unwrap().write_all(stdin).unwrap();
    child.wait_with_output().unwrap()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// `qwen-bpf ARGS` succeeded: its stdout.
fn ok(args: &[&str], stdin: &[u8]) -> String {
    let o = qwen_bpf(args, stdin);
    assert!(
        o.status.success(),
        "qwen-bpf {args:?} failed ({}):\n{}\n{}",
        o.status,
        text(&o.stdout),
        text(&o.stderr)
    );
    text(&o.stdout)
}

/// `qwen-bpf ARGS` failed with exit status 1 and one stderr line `COMMAND: error: ...` that
/// contains `cause`.
fn refused(args: &[&str], cause: &str) {
    let o = qwen_bpf(args, b"");
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "qwen-bpf {args:?}: {err}");
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 1, "qwen-bpf {args:?}: one line, got:\n{err}");
    assert!(
        lines[0].starts_with(&format!("{}: error: ", args[0])) && lines[0].contains(cause),
        "qwen-bpf {args:?}: {err:?} should name {cause:?}"
    );
}

/// No pin directory of an installation called `name` exists.
fn nothing_installed(name: &str) {
    let dir = Path::new("/sys/fs/bpf/qwen_bpf").join(name);
    assert!(!dir.exists(), "{} was left behind", dir.display());
}

#[test]
fn help_lists_every_subcommand_and_theirs() {
    let help = ok(&["--help"], b"");
    for sub in ["generate", "tokenize", "serve", "ask", "filter", "doctor"] {
        assert!(
            help.lines().any(|l| l.trim_start().starts_with(sub)),
            "`qwen-bpf --help` lists no {sub}:\n{help}"
        );
    }
    assert!(help.contains("Exit status"), "{help}");
    for (sub, subs) in [
        ("serve", &["install", "status", "list", "remove"][..]),
        ("filter", &["classify", "install", "status", "remove"][..]),
    ] {
        let help = ok(&[sub, "--help"], b"");
        for s in subs {
            assert!(
                help.lines().any(|l| l.trim_start().starts_with(s)),
                "`qwen-bpf {sub} --help` lists no {s}:\n{help}"
            );
        }
    }
    // one spelling of the sampling flags, the old one kept as an alias
    let generate = ok(&["generate", "--help"], b"");
    let ask = ok(&["ask", "--help"], b"");
    for flag in [
        "--repetition-penalty",
        "--top-k",
        "--top-p",
        "--min-p",
        "--seed",
    ] {
        assert!(generate.contains(flag) && ask.contains(flag), "{flag}");
    }
    assert!(!generate.contains("--repeat-penalty"));
}

#[test]
fn a_usage_error_exits_1_with_clap_s_message() {
    let o = qwen_bpf(&["doctor", "--no-such-flag"], b"");
    assert_eq!(o.status.code(), Some(1));
    assert!(
        text(&o.stderr).starts_with("error: unexpected argument '--no-such-flag'"),
        "{}",
        text(&o.stderr)
    );
    let o = qwen_bpf(&["no-such-command"], b"");
    assert_eq!(o.status.code(), Some(1));
}

#[test]
fn every_subcommand_refuses_a_bad_input_in_one_line_and_installs_nothing() {
    let missing = "/nonexistent/qwen-bpf-test";
    refused(&["generate", "--temperature=-1"], "temperature");
    refused(&["tokenize", "--tokenizer", missing], missing);
    refused(
        &[
            "serve",
            "install",
            "--model",
            missing,
            "--name",
            "test-cli-bad",
            "--port",
            "47400",
        ],
        missing,
    );
    nothing_installed("test-cli-bad");
    refused(&["serve", "status", "test-cli-none"], "test-cli-none");
    refused(&["serve", "remove", "../etc"], "../etc");
    // the wire carries no presence penalty: refused before anything is sent
    refused(
        &["ask", "--port", "47401", "--presence-penalty", "0.5", "hi"],
        "presence_penalty",
    );
    refused(
        &[
            "filter",
            "install",
            "--model",
            missing,
            "--rule",
            missing,
            "--name",
            "test-cli-bad2",
        ],
        missing,
    );
    nothing_installed("test-cli-bad2");
    refused(
        &["filter", "classify", "--model", missing, "--rule", missing],
        missing,
    );
    refused(&["filter", "remove", "test-cli-none"], "test-cli-none");
}

#[test]
fn tokenize_prints_the_tokenizers_crate_s_ids_line_by_line() {
    let path = common::tokenizer_path();
    let tok = Tokenizer::from_file(&path).unwrap();
    let lines = ["Hello, world!", "", "héllo wörld 🙂", "  two  spaces"];
    let out = ok(
        &["tokenize", "--tokenizer", path.to_str().unwrap()],
        lines.join("\n").as_bytes(),
    );
    let want: String = lines
        .iter()
        .map(|l| {
            let ids: Vec<String> = tok.encode(l).unwrap().iter().map(u32::to_string).collect();
            format!("{}\n", ids.join(" "))
        })
        .collect();
    assert_eq!(out, want);
}

#[test]
fn doctor_reports_the_kernel_and_exits_0_only_when_every_facility_works() {
    let o = qwen_bpf(&["doctor"], b"");
    let out = text(&o.stdout);
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
    assert_eq!(
        out.lines().next(),
        Some(format!("kernel {}", release.trim()).as_str())
    );
    let facilities: Vec<&str> = out.lines().skip(1).collect();
    assert!(facilities.iter().any(|l| l.contains("arena")), "{out}");
    let missing = facilities.iter().any(|l| l.contains(" NO: "));
    assert_eq!(o.status.success(), !missing, "{out}");
}

/// `QWEN_BPF_SKIP_PROGRAMS=tokenizer`, as on a kernel whose verifier refuses the tokenizer's
/// program: `generate` by ids gives the same text as with every program, and the in-kernel
/// tokenizer is refused in one line that names why.
#[test]
fn kernel_without_the_tokenizer_generate_runs_by_ids() {
    let dir = common::tiny_model_with_tokenizer("cli");
    let args = [
        "generate",
        "--model",
        dir.to_str().unwrap(),
        "--tokens",
        "785,3974,13876",
        "--max-tokens",
        "5",
    ];
    let with_all = ok(&args, b"");
    let run = |args: &[&str]| {
        let mut child = Command::new(env!("CARGO_BIN_EXE_qwen-bpf"))
            .args(args)
            .env("QWEN_BPF_SKIP_PROGRAMS", "tokenizer")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let _ = child
            .stdin
            .take()
            .unwrap()
            .write_all(b"a line to tokenize\n");
        child.wait_with_output().unwrap()
    };
    let o = run(&args);
    assert!(o.status.success(), "{}", text(&o.stderr));
    assert_eq!(text(&o.stdout), with_all);
    let tokenizer = dir.join("tokenizer.json");
    let o = run(&[
        "tokenize",
        "--tokenizer",
        tokenizer.to_str().unwrap(),
        "--in-kernel",
    ]);
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.starts_with("tokenize: error: ")
            && err.contains("without the tokenizer: left out by QWEN_BPF_SKIP_PROGRAMS=tokenizer"),
        "{err}"
    );
}

/// The happy path of every subcommand on a tiny model: `generate`; `serve install`, `list`,
/// `status`, `ask` (the same text as `generate`), `remove`; `tokenize --in-kernel`; `filter
/// classify`, `install`, `status`, `remove`. (`scripts/smoke.sh` runs `doctor --programs` first.)
#[test]
fn kernel_every_subcommand_runs_its_happy_path() {
    let dir = common::tiny_model_with_tokenizer("cli");
    let model = dir.to_str().unwrap();
    let prompt = "The old lighthouse keeper";
    let generated = ok(
        &[
            "generate",
            "--model",
            model,
            "--prompt",
            prompt,
            "--max-tokens",
            "6",
        ],
        b"",
    );
    let generated = generated.strip_suffix('\n').unwrap_or(&generated);
    let continuation = generated
        .strip_prefix(prompt)
        .unwrap_or_else(|| panic!("generate echoes the prompt: {generated:?}"));

    let (name, port) = ("test-cli-serve", "47402");
    let out = ok(
        &[
            "serve",
            "install",
            "--model",
            model,
            "--name",
            name,
            "--port",
            port,
            "--slots",
            "1",
            "--max-context",
            "64",
        ],
        b"",
    );
    assert!(out.contains("installed"), "{out}");
    let served = std::panic::catch_unwind(|| {
        assert!(ok(&["serve", "list"], b"").lines().any(|l| l == name));
        let status = ok(&["serve", "status", name], b"");
        assert!(status.contains(name), "{status}");
        let answer = ok(&["ask", "--port", port, "--max-tokens", "6", prompt], b"");
        assert_eq!(
            answer, continuation,
            "ask and generate, greedy on one model"
        );
    });
    let removed = ok(&["serve", "remove", name], b"");
    assert!(removed.starts_with(&format!("removed {name}")), "{removed}");
    nothing_installed(name);
    if let Err(e) = served {
        std::panic::resume_unwind(e);
    }

    let tokenizer = dir.join("tokenizer.json");
    let tok = Tokenizer::from_file(&tokenizer).unwrap();
    let ids = ok(
        &[
            "tokenize",
            "--tokenizer",
            tokenizer.to_str().unwrap(),
            "--in-kernel",
        ],
        prompt.as_bytes(),
    );
    let want: Vec<String> = tok
        .encode(prompt)
        .unwrap()
        .iter()
        .map(u32::to_string)
        .collect();
    assert_eq!(ids, format!("{}\n", want.join(" ")));

    let scratch = common::scratch_dir();
    let rule = scratch.path().join("rule.json");
    std::fs::write(
        &rule,
        r#"{"interface": "lo", "protocol": "udp", "ports": [47403], "sources": ["127.0.0.0/8"],
        "bytes": 64, "template": "Is this datagram good or bad?\n{payload}\nAnswer:",
        "labels": [
          {"name": "good", "text": " good", "action": "pass"},
          {"name": "bad", "text": " bad", "action": "drop"}
        ]}"#,
    )
    .unwrap();
    let rule = rule.to_str().unwrap();
    let verdicts = ok(
        &["filter", "classify", "--model", model, "--rule", rule],
        b"GET / HTTP/1.1\nrm -rf /",
    );
    let labels: Vec<&str> = verdicts
        .lines()
        .map(|l| l.split(' ').next().unwrap())
        .collect();
    assert_eq!(labels.len(), 2, "{verdicts}");
    assert!(
        labels.iter().all(|l| ["good", "bad"].contains(l)),
        "{verdicts}"
    );
    let name = "test-cli-filter";
    let out = ok(
        &[
            "filter", "install", "--model", model, "--rule", rule, "--name", name,
        ],
        b"",
    );
    assert!(out.starts_with(&format!("installed {name}")), "{out}");
    let status = std::panic::catch_unwind(|| ok(&["filter", "status", name], b""));
    assert_eq!(
        ok(&["filter", "remove", name], b""),
        format!("removed {name}\n")
    );
    nothing_installed(name);
    let status = status.unwrap_or_else(|e| std::panic::resume_unwind(e));
    assert!(status.contains(name), "{status}");
}
