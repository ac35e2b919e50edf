//! The `logits` example's command-line contract on genuine Hugging Face layouts: both config key
//! styles (transformers 4 and 5), tied and untied LM heads, f32 reference and BPF backends.

mod common;

use std::path::Path;
use std::process::Command;

use qwen_bpf::synth::{KeyStyle, Preset, SynthOptions};
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
