//! The `logits` example's command-line contract on genuine Hugging Face layouts: both config key
//! styles (transformers 4 and 5), tied and untied LM heads, f32 reference and BPF backends.

mod common;

use std::path::Path;
use std::process::Command;

use qwen_bpf::hf::synth::{KeyStyle, Preset, SynthOptions};
use qwen_bpf::Checkpoint;
use qwen_bpf::Reference;

/// Runs `logits` and returns the array's shape and values.
fn run_logits(
    dir: &Path,
    backend: &str,
    tokens: &str,
    out: &Path,
    cache: &Path,
) -> (Vec<u64>, Vec<f32>) {
    let o = Command::new(common::example_bin("logits"))
        .args([
            "--model",
            dir.to_str().unwrap(),
            "--tokens",
            tokens,
            "--backend",
            backend,
            "--out",
        ])
        .arg(out)
        .arg("--cache-dir")
        .arg(cache)
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "logits --backend {backend} on {}: {}",
        dir.display(),
        String::from_utf8_lossy(&o.stderr)
    );
    let bytes = std::fs::read(out).unwrap();
    let npy = npyz::NpyFile::new(&bytes[..]).unwrap();
    let shape = npy.shape().to_vec();
    (shape, npy.into_vec::<f32>().unwrap())
}

#[test]
fn logits_example_writes_reference_and_q24_rows_on_every_hf_layout() {
    let tokens = [785u32, 3974, 13876];
    let scratch = common::scratch_dir();
    for (tied, style) in [
        (true, KeyStyle::Transformers4),
        (false, KeyStyle::Transformers4),
        (true, KeyStyle::Transformers5),
        (false, KeyStyle::Transformers5),
    ] {
        let mut cfg = Preset::Tiny.config();
        cfg.tie_word_embeddings = tied;
        let tag = format!(
            "examples-{}-{:?}",
            if tied { "tied" } else { "untied" },
            style
        )
        .to_lowercase();
        let dir = common::model_with(
            &tag,
            &cfg,
            &SynthOptions {
                seed: 5,
                key_style: style,
                ..Default::default()
            },
        );
        let vocab = cfg.vocab_size as u64;
        let what = tag.clone();

        let (shape, reference) = run_logits(
            &dir,
            "reference",
            "785,3974,13876",
            &scratch.path().join(format!("{tag}-ref.npy")),
            scratch.path(),
        );
        assert_eq!(shape, vec![3, vocab], "{what}: reference .npy shape");
        let mut r = Reference::new(&Checkpoint::open(&dir).unwrap(), 8).unwrap();
        for (i, &t) in tokens.iter().enumerate() {
            let want = r.forward(t).unwrap();
            assert_eq!(
                &reference[i * vocab as usize..(i + 1) * vocab as usize],
                &want[..],
                "{what}: row {i} is the logits after token {i}"
            );
        }

        let (shape, q24) = run_logits(
            &dir,
            "q24",
            "785,3974,13876",
            &scratch.path().join(format!("{tag}-q24.npy")),
            scratch.path(),
        );
        assert_eq!(shape, vec![3, vocab], "{what}: q24 .npy shape");
        let max = q24
            .iter()
            .zip(&reference)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        assert!(max <= 0.004, "{what}: q24 vs reference max |Δlogit| {max}");
    }
}

#[test]
fn logits_example_rejects_bad_input_with_a_message() {
    let dir = common::tiny_model("examples-bad");
    let scratch = common::scratch_dir();
    let out = scratch.path().join("x.npy");
    for (tokens, backend, needle) in [
        ("785,999999999", "reference", "999999999"),
        ("1,2", "int3", "unknown backend"),
        ("abc", "q24", "abc"),
    ] {
        let o = Command::new(common::example_bin("logits"))
            .args([
                "--model",
                dir.to_str().unwrap(),
                "--tokens",
                tokens,
                "--backend",
                backend,
                "--out",
                out.to_str().unwrap(),
            ])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(
            !o.status.success() && err.contains(needle),
            "tokens {tokens} backend {backend}: exit {:?}, stderr {err}",
            o.status
        );
        assert!(!err.contains("panicked"), "no panic: {err}");
        assert!(!out.exists(), "no output file on error");
    }
}

/// The ```` ```rust ```` blocks of README.md, each as its lines.
fn readme_rust_blocks() -> Vec<Vec<String>> {
    let readme = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md"))
        .expect("reading README.md");
    let mut blocks = Vec::new();
    let mut current: Option<Vec<String>> = None;
    for line in readme.lines() {
        match (&mut current, line.trim_end()) {
            (None, "```rust") => current = Some(Vec::new()),
            (Some(_), "```") => blocks.extend(current.take()),
            (Some(block), l) => block.push(l.to_string()),
            (None, _) => {}
        }
    }
    blocks
}

#[test]
fn readme_rust_code_is_the_compiled_library_example() {
    let example =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/library.rs"))
            .expect("reading examples/library.rs");
    // Compared without indentation: the README may quote a part of a function at column 0.
    let code: Vec<&str> = example.lines().map(str::trim).collect();
    let blocks = readme_rust_blocks();
    assert!(
        blocks.len() >= 2,
        "README.md has {} rust blocks",
        blocks.len()
    );
    let whole: Vec<&str> = code
        .iter()
        .copied()
        .skip_while(|l| l.is_empty() || l.starts_with("//!"))
        .collect();
    let first: Vec<&str> = blocks[0].iter().map(|l| l.trim()).collect();
    assert_eq!(
        first, whole,
        "README's first rust block is examples/library.rs"
    );
    for block in &blocks[1..] {
        let lines: Vec<&str> = block.iter().map(|l| l.trim()).collect();
        assert!(
            code.windows(lines.len()).any(|w| w == lines.as_slice()),
            "this README rust block is not in examples/library.rs:\n{}",
            block.join("\n")
        );
    }
}

#[test]
fn library_example_runs_and_is_repeatable() {
    let dir = common::tiny_model_with_tokenizer("examples-library");
    let run = |dir: &Path| {
        Command::new(common::example_bin("library"))
            .arg(dir)
            .output()
            .unwrap()
    };
    let a = run(&dir);
    let (out, err) = (
        String::from_utf8_lossy(&a.stdout),
        String::from_utf8_lossy(&a.stderr),
    );
    assert!(a.status.success(), "library example: {err}");
    // Greedy text, then sampled text: two lines at least, something generated.
    assert!(out.lines().count() >= 2 && out.trim().len() > 10, "{out:?}");
    let b = run(&dir);
    assert_eq!(
        a.stdout, b.stdout,
        "greedy and seeded sampling repeat exactly"
    );

    // No model there: an error, not a panic.
    let missing = run(&dir.join("missing"));
    let err = String::from_utf8_lossy(&missing.stderr);
    assert!(
        !missing.status.success() && !err.contains("panicked"),
        "{err}"
    );
}

#[test]
fn generate_gives_the_same_tokens_for_every_dispatch_and_no_bpf_syscall_for_events() {
    let dir = common::tiny_model("examples-dispatch");
    let scratch = common::scratch_dir();
    let cache = scratch.path().join("cache");
    let run = |dispatch: &str| {
        let o = Command::new(common::example_bin("generate"))
            .args([
                "--model",
                dir.to_str().unwrap(),
                "--tokens",
                "785,3974,13876",
            ])
            .args(["--max-tokens", "12", "--dispatch", dispatch, "--cache-dir"])
            .arg(&cache)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr).into_owned();
        assert!(o.status.success(), "generate --dispatch {dispatch}: {err}");
        let calls = err
            .lines()
            .find_map(|l| l.strip_prefix("bpf syscalls: "))
            .and_then(|l| l.split_whitespace().next())
            .and_then(|n| n.parse::<f64>().ok())
            .unwrap_or_else(|| panic!("no bpf syscalls line: {err}"));
        (String::from_utf8_lossy(&o.stdout).into_owned(), calls)
    };
    let (per_op, per_op_calls) = run("per-op");
    let (kernel, kernel_calls) = run("kernel");
    let (event, event_calls) = run("event");
    assert!(
        per_op.matches('<').count() == 12,
        "12 tokens printed: {per_op}"
    );
    assert_eq!(kernel, per_op, "tokens with --dispatch kernel vs per-op");
    assert_eq!(event, per_op, "tokens with --dispatch event vs per-op");
    assert_eq!(
        event_calls, 0.0,
        "bpf(2) calls per generated token with --dispatch event"
    );
    assert!(
        kernel_calls < per_op_calls,
        "the kernel dispatch needs fewer bpf(2) calls ({kernel_calls} vs {per_op_calls})"
    );
}
