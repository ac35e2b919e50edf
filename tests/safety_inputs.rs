//! Failing cleanly and leaving nothing behind, for everything a caller hands in, as tested facts:
//! every bad checkpoint, token or prompt gives its typed error without kernel objects, file
//! descriptors or cache files left over, and leaves a model unchanged; damaged, stale or foreign
//! caches are rebuilt, never used, and concurrent converters do not corrupt the cache; oversized
//! requests are refused before anything is loaded. (`tests/safety_kernel.rs` has the rest:
//! privileges and kernel resources.)
//!
//! These tests need BPF for real (root, or CAP_BPF + CAP_PERFMON) and fail loudly otherwise.
//! Tests that count file descriptors take [`serial`] so that no other test in this binary opens
//! or closes any while they count.

mod common;

use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use common::safety::{
    child, child_env, child_mode, child_results, copy_model, fds, files_in, opts, run_logits,
    serial, small_config, small_model,
};
use qwen_bpf::hf::synth::SynthOptions;
use qwen_bpf::model::open::check_memory;
use qwen_bpf::store::{cache, q24};
use qwen_bpf::{Checkpoint, Config, Error, Model};
use serde_json::Value;

// ------------------------------------------------------------------------------------ helpers

/// The JSON header of a safetensors file and the data bytes after it.
fn split(path: &Path) -> (Value, Vec<u8>) {
    let bytes = std::fs::read(path).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    (
        serde_json::from_slice(&bytes[8..8 + n]).unwrap(),
        bytes[8 + n..].to_vec(),
    )
}

/// Writes a safetensors file from a header and data bytes, verbatim (header padded to 8 bytes).
fn join(path: &Path, header: &Value, data: &[u8]) {
    let mut text = serde_json::to_string(header).unwrap();
    while text.len() % 8 != 0 {
        text.push(' ');
    }
    let mut out = (text.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(text.as_bytes());
    out.extend_from_slice(data);
    std::fs::write(path, out).unwrap();
}

/// Overwrites element `index` of BF16 tensor `name` with `value`.
fn poke(dir: &Path, name: &str, index: usize, value: f32) {
    let path = dir.join("model.safetensors");
    let (header, mut data) = split(&path);
    let at = header[name]["data_offsets"][0].as_u64().unwrap() as usize + 2 * index;
    data[at..at + 2].copy_from_slice(&half::bf16::from_f32(value).to_le_bytes());
    join(&path, &header, &data);
}

fn edit_header(dir: &Path, edit: impl FnOnce(&mut Value)) {
    let path = dir.join("model.safetensors");
    let (mut header, data) = split(&path);
    edit(&mut header);
    join(&path, &header, &data);
}

fn edit_config(dir: &Path, edit: impl FnOnce(&mut Value)) {
    let path = dir.join("config.json");
    let mut v: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    edit(&mut v);
    std::fs::write(path, v.to_string()).unwrap();
}

/// Helper processes: with `QWEN_BPF_SAFETY_CHILD` set, one of the processes the tests below start
/// (through [`child`]), printing `RESULT: ...` lines. Ignored in a normal run, where it would
/// have nothing to check; run without the variable it fails.
#[test]
#[ignore = "a helper process, started by the other safety tests with QWEN_BPF_SAFETY_CHILD set"]
fn child_process_entry() {
    let mode = child_mode();
    let env = |k: &str| child_env(&mode, k);
    match mode.as_str() {
        "convert" => {
            let start: u128 = env("START_AT").parse().unwrap();
            let ck = Checkpoint::open(env("MODEL_DIR")).expect("helper: open the checkpoint");
            while SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .unwrap()
                .as_nanos()
                < start
            {
                std::thread::sleep(Duration::from_millis(1));
            }
            let c = q24::open_or_convert(&ck, Path::new(&env("CACHE_DIR")), false)
                .expect("helper: convert");
            println!("RESULT: {}", c.header.checksum);
        }
        other => panic!("unknown helper mode {other:?}"),
    }
}

// ------------------------------------------------------------------- bad checkpoints and inputs

#[test]
fn bad_checkpoints_give_typed_errors_and_leave_nothing_behind() {
    let _g = serial();
    let good = small_model();
    let cfg = small_config();
    let (h, i) = (cfg.hidden_size, cfg.intermediate_size);
    type Damage = Box<dyn Fn(&Path)>;
    type Check = Box<dyn Fn(&Error) -> bool>;
    let gate = "model.layers.1.mlp.gate_proj.weight";
    let k_norm = "model.layers.0.self_attn.k_norm.weight";
    let o_proj = "model.layers.0.self_attn.o_proj.weight";
    let cases: Vec<(&str, Damage, Check)> = vec![
        (
            "a linear weight of 200.0 (Q24 holds |w| < 128)",
            Box::new(move |d| poke(d, gate, 5 * 64 + 7, 200.0)),
            Box::new(move |e| {
                matches!(e, Error::OutOfRange { name, index, value, format: "Q24", max }
                    if name == gate && *index == 5 * 64 + 7 && *value == 200.0 && *max == 128.0)
            }),
        ),
        (
            "an embedding of -130.0",
            Box::new(|d| poke(d, "model.embed_tokens.weight", 999 * 64, -130.0)),
            Box::new(
                |e| matches!(e, Error::OutOfRange { name, index: 63936, value, .. } if name == "model.embed_tokens.weight" && *value == -130.0),
            ),
        ),
        (
            "a norm weight of 4096.0 (Q20 holds |w| < 2048)",
            Box::new(move |d| poke(d, k_norm, 3, 4096.0)),
            Box::new(
                move |e| matches!(e, Error::OutOfRange { name, index: 3, format: "Q20", max, .. } if name == k_norm && *max == 2048.0),
            ),
        ),
        (
            "a NaN weight",
            Box::new(move |d| poke(d, o_proj, 100, f32::NAN)),
            Box::new(
                move |e| matches!(e, Error::NonFinite { name, index: 100, value } if name == o_proj && value.is_nan()),
            ),
        ),
        (
            "an infinite weight",
            Box::new(|d| poke(d, "model.norm.weight", 0, f32::INFINITY)),
            Box::new(
                |e| matches!(e, Error::NonFinite { name, index: 0, .. } if name == "model.norm.weight"),
            ),
        ),
        (
            "a truncated model.safetensors",
            Box::new(|d| {
                let p = d.join("model.safetensors");
                let n = std::fs::metadata(&p).unwrap().len();
                std::fs::OpenOptions::new()
                    .write(true)
                    .open(&p)
                    .unwrap()
                    .set_len(n - 4096)
                    .unwrap();
            }),
            Box::new(
                |e| matches!(e, Error::Safetensors { path, .. } if path.ends_with("model.safetensors")),
            ),
        ),
        (
            "a header whose offsets run past the file",
            Box::new(move |d| {
                edit_header(d, |hd| {
                    hd[k_norm]["data_offsets"] = serde_json::json!([1 << 30, (1 << 30) + 32])
                })
            }),
            Box::new(|e| matches!(e, Error::Safetensors { .. })),
        ),
        (
            "a header whose size field lies",
            Box::new(|d| {
                let p = d.join("model.safetensors");
                let mut b = std::fs::read(&p).unwrap();
                let n = u64::from_le_bytes(b[..8].try_into().unwrap()) + 16;
                b[..8].copy_from_slice(&n.to_le_bytes());
                std::fs::write(&p, b).unwrap();
            }),
            Box::new(|e| matches!(e, Error::Safetensors { .. })),
        ),
        (
            "a wrong dtype",
            Box::new(move |d| edit_header(d, |hd| hd[k_norm]["dtype"] = "I16".into())),
            Box::new(
                move |e| matches!(e, Error::Dtype { name, dtype, .. } if name == k_norm && dtype == "I16"),
            ),
        ),
        (
            "a wrong shape",
            Box::new(move |d| edit_header(d, |hd| hd[gate]["shape"] = serde_json::json!([h, i]))),
            Box::new(
                move |e| matches!(e, Error::Shape { name, found, expected, .. } if name == gate && *found == [h, i] && *expected == [i, h]),
            ),
        ),
        (
            "a missing tensor",
            Box::new(|d| {
                edit_header(d, |hd| {
                    let v = hd
                        .as_object_mut()
                        .unwrap()
                        .remove("model.norm.weight")
                        .unwrap();
                    hd["model.norm.weight.renamed"] = v;
                })
            }),
            Box::new(
                |e| matches!(e, Error::MissingTensor { name, .. } if name == "model.norm.weight"),
            ),
        ),
        (
            "a config whose intermediate_size contradicts the tensors",
            Box::new(|d| edit_config(d, |c| c["intermediate_size"] = 224.into())),
            Box::new(
                |e| matches!(e, Error::Shape { name, expected, .. } if name == "model.layers.0.mlp.gate_proj.weight" && *expected == [224, 64]),
            ),
        ),
        (
            "a config with more layers than the tensors",
            Box::new(|d| edit_config(d, |c| c["num_hidden_layers"] = 3.into())),
            Box::new(
                |e| matches!(e, Error::MissingTensor { name, .. } if name.starts_with("model.layers.2.")),
            ),
        ),
        (
            "a config that is not JSON",
            Box::new(|d| std::fs::write(d.join("config.json"), "{\"vocab_size\": ").unwrap()),
            Box::new(|e| matches!(e, Error::Config { path, .. } if path.ends_with("config.json"))),
        ),
    ];
    // Warm up libbpf (its first load caches kernel BTF) before counting.
    drop(Model::open(&good, &opts(4, &good)).unwrap());
    for (what, damage, check) in cases {
        let dir = copy_model(&good);
        let cache_dir = common::scratch_dir();
        damage(dir.path());
        let before = fds();
        let err = Model::open(dir.path(), &opts(8, cache_dir.path()))
            .map(drop)
            .expect_err(what);
        assert!(check(&err), "{what}: unexpected error {err:?}");
        eprintln!("{what}: {err}");
        assert_eq!(
            fds(),
            before,
            "{what}: file descriptors after the failed open"
        );
        assert_eq!(
            files_in(cache_dir.path()),
            Vec::<String>::new(),
            "{what}: nothing may be left in the cache directory"
        );
    }
    // Values beyond the format also name the tensor and value in the message.
    let dir = copy_model(&good);
    poke(dir.path(), gate, 0, 200.0);
    let msg = Model::open(dir.path(), &opts(8, dir.path()))
        .unwrap_err()
        .to_string();
    for w in [gate, "200", "Q24", "128"] {
        assert!(msg.contains(w), "{msg:?} should name {w:?}");
    }
}

#[test]
fn bad_tokens_empty_prompts_and_overflow_are_typed_and_change_nothing() {
    let _g = serial();
    let dir = small_model();
    let mut m = Model::open(&dir, &opts(4, &dir)).unwrap();
    let mut fresh = Model::open(&dir, &opts(4, &dir)).unwrap();
    let before = fds();
    let want: Vec<Vec<f32>> = [1u32, 2, 3, 4]
        .iter()
        .map(|&t| fresh.forward(t).unwrap().to_vec())
        .collect();

    assert!(
        matches!(m.prefill(&[]), Err(Error::EmptyPrompt)),
        "empty prompt"
    );
    assert!(matches!(
        m.forward(1000),
        Err(Error::TokenOutOfRange {
            id: 1000,
            index: 0,
            vocab: 1000
        })
    ));
    assert!(matches!(
        m.next_token(u32::MAX),
        Err(Error::TokenOutOfRange { id: u32::MAX, .. })
    ));
    match m.prefill(&[1, 2, 77_777, 3]) {
        Err(Error::TokenOutOfRange {
            id: 77_777,
            index: 2,
            vocab: 1000,
        }) => {}
        other => panic!("id 77777 at index 2: want TokenOutOfRange, got {other:?}"),
    }
    match m.prefill(&[1, 2, 3, 4, 5]) {
        Err(Error::ContextOverflow {
            max_context: 4,
            tokens: 5,
            ..
        }) => {}
        other => {
            panic!("5 tokens into a context of 4: want ContextOverflow naming the 5, got {other:?}")
        }
    }
    assert_eq!(m.position(), 0, "rejected input must not advance the model");

    // The model is untouched: it computes exactly what a fresh one does, then overflows.
    assert_eq!(
        m.prefill(&[1, 2]).unwrap(),
        want[1],
        "prefill returns the logits after its last token"
    );
    assert!(matches!(
        m.prefill(&[3, 4, 5]),
        Err(Error::ContextOverflow { .. })
    ));
    assert_eq!(m.forward(3).unwrap(), want[2]);
    assert_eq!(m.forward(4).unwrap(), want[3]);
    match m.forward(5) {
        Err(Error::ContextOverflow {
            pos: 4,
            max_context: 4,
            tokens: 1,
        }) => {}
        other => panic!("generation past max_context: want ContextOverflow, got {other:?}"),
    }
    assert!(matches!(
        m.prefill(&[5]),
        Err(Error::ContextOverflow { .. })
    ));
    m.reset();
    assert_eq!(m.forward(1).unwrap(), want[0], "after reset");
    assert_eq!(fds(), before, "errors open or close no file descriptor");
}

// ------------------------------------------------------------------------------- cache files

#[test]
fn caches_of_another_version_format_or_checkpoint_are_rebuilt_never_used() {
    let _g = serial();
    let dir = small_model();
    let other = common::model_with(
        "safety-small-other",
        &small_config(),
        &SynthOptions {
            seed: 6,
            ..Default::default()
        },
    );
    let ck = Checkpoint::open(&dir).unwrap();
    let cache_dir = common::scratch_dir();
    let file = cache_dir.path().join(q24::FILE_NAME);
    let want = run_logits(
        &mut Model::open(&dir, &opts(4, cache_dir.path())).unwrap(),
        &[1, 2],
    );
    let good = std::fs::read(&file).unwrap();
    let other_cache = {
        let d = common::scratch_dir();
        drop(Model::open(&other, &opts(4, d.path())).unwrap());
        std::fs::read(d.path().join(q24::FILE_NAME)).unwrap()
    };
    assert_ne!(other_cache, good);
    // The file with its header edited (and re-serialised as the writer does), payload unchanged.
    let with_header = |edit: &dyn Fn(&mut cache::Header)| {
        let hlen = u32::from_le_bytes(good[12..16].try_into().unwrap()) as usize;
        let mut h: cache::Header = serde_json::from_slice(&good[16..16 + hlen]).unwrap();
        edit(&mut h);
        let text = serde_json::to_vec(&h).unwrap();
        let mut b = [&good[..12], &(text.len() as u32).to_le_bytes(), &text].concat();
        b.resize((16 + text.len()).div_ceil(4096) * 4096, 0);
        b.extend_from_slice(&good[(16 + hlen).div_ceil(4096) * 4096..]);
        b
    };
    assert!(
        with_header(&|_| {}) == good,
        "an unedited header rebuilds the same file"
    );
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        (
            "another format version",
            [&good[..8], &(cache::VERSION + 1).to_le_bytes(), &good[12..]].concat(),
            "format version",
        ),
        (
            "another version in the header",
            with_header(&|h| h.version = 7),
            "v7",
        ),
        (
            "another store format",
            with_header(&|h| h.format = "q42".into()),
            "\"q42\"",
        ),
        ("another checkpoint", other_cache, "another checkpoint"),
        (
            "another config",
            with_header(&|h| h.config.rms_norm_eps = 2e-6),
            "another config",
        ),
        (
            "a tensor outside the payload",
            with_header(&|h| h.tensors[3].offset = h.payload_bytes),
            "outside the payload",
        ),
    ];
    for (what, bytes, reason) in cases {
        std::fs::write(&file, &bytes).unwrap();
        match cache::open(&file, "q24", &ck.identity(), &ck.config).unwrap() {
            Err(r) => assert!(
                r.contains(reason),
                "{what}: reason {r:?} should say {reason:?}"
            ),
            Ok(_) => panic!("{what}: cache accepted"),
        }
        let got = run_logits(
            &mut Model::open(&dir, &opts(4, cache_dir.path())).unwrap(),
            &[1, 2],
        );
        assert_eq!(got, want, "{what}: logits after the rebuild");
        assert!(
            std::fs::read(&file).unwrap() == good,
            "{what}: rebuilt to the same bytes"
        );
    }
    assert_eq!(
        files_in(cache_dir.path()),
        vec![q24::FILE_NAME.to_string()],
        "no temporary files left"
    );
}

#[test]
fn concurrent_converters_do_not_corrupt_the_cache() {
    let _g = serial();
    let dir = small_model();
    let ck = Checkpoint::open(&dir).unwrap();
    let cache_dir = common::scratch_dir();
    let file = cache_dir.path().join(q24::FILE_NAME);
    for round in ["no cache yet", "a truncated cache"] {
        if file.exists() {
            let n = std::fs::metadata(&file).unwrap().len();
            std::fs::OpenOptions::new()
                .write(true)
                .open(&file)
                .unwrap()
                .set_len(n / 3)
                .unwrap();
        }
        let start = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_nanos()
            + 400_000_000;
        let children: Vec<_> = (0..3)
            .map(|_| {
                child(
                    "convert",
                    &[
                        ("MODEL_DIR", dir.display().to_string()),
                        ("CACHE_DIR", cache_dir.path().display().to_string()),
                        ("START_AT", start.to_string()),
                    ],
                )
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
            })
            .collect();
        let sums: Vec<String> = children
            .into_iter()
            .map(|c| child_results(c.wait_with_output().unwrap(), round).remove(0))
            .collect();
        assert!(
            sums.windows(2).all(|w| w[0] == w[1]),
            "{round}: every converter verified the same payload: {sums:?}"
        );
        let c = cache::open(&file, "q24", &ck.identity(), &ck.config)
            .unwrap()
            .unwrap_or_else(|r| panic!("{round}: cache unusable: {r}"));
        assert_eq!(c.header.checksum, sums[0]);
        assert_eq!(
            files_in(cache_dir.path()),
            vec![q24::FILE_NAME.to_string()],
            "{round}: no temporary files left"
        );
    }
    let mut m = Model::open(&dir, &opts(4, cache_dir.path())).unwrap();
    let mut fresh = Model::open(&dir, &opts(4, &dir)).unwrap();
    assert_eq!(
        run_logits(&mut m, &[1, 2, 3]),
        run_logits(&mut fresh, &[1, 2, 3])
    );
}

// ---------------------------------------------------------------------------------- bounds

#[test]
fn oversized_requests_are_refused_before_anything_is_loaded() {
    let _g = serial();
    let cfg = Config {
        max_position_embeddings: 1 << 62,
        ..small_config()
    };
    let dir = common::model_with(
        "safety-long-context",
        &cfg,
        &SynthOptions {
            seed: 5,
            ..Default::default()
        },
    );
    drop(Model::open(&dir, &opts(4, &dir)).unwrap()); // warm-up
    let kv_per_token = 2 * cfg.num_hidden_layers * cfg.kv_dim() * 4; // 512 bytes
    let cases: [(usize, &[String]); 3] = [
        // the KV cache alone exceeds the arena: 2^24 tokens x 512 bytes = 8 GiB
        (
            1 << 24,
            &[
                (512u64 << 24).to_string(),
                "max_context 16777216".into(),
                "4294967296".into(),
            ],
        ),
        // sizes that would overflow 64-bit arithmetic are refused, not wrapped
        (1 << 60, &[(512u128 << 60).to_string(), "4294967296".into()]),
        // the KV cache fits exactly, weights and scratch push the arena over
        (
            (1 << 32) / kv_per_token,
            &[
                (1u64 << 32).to_string(),
                "KV cache (max_context 8388608)".into(),
                "4294967296".into(),
            ],
        ),
    ];
    for (max_context, words) in cases {
        let cache_dir = common::scratch_dir();
        let before = fds();
        match Model::open(&dir, &opts(max_context, cache_dir.path())) {
            Err(Error::Resources { msg }) => {
                eprintln!("max_context {max_context}: {msg}");
                for w in words {
                    assert!(msg.contains(w.as_str()), "{msg:?} should contain {w:?}");
                }
            }
            other => panic!(
                "max_context {max_context}: want Error::Resources, got {:?}",
                other.map(drop)
            ),
        }
        assert_eq!(
            fds(),
            before,
            "max_context {max_context}: no BPF object or file left open"
        );
        assert!(
            files_in(cache_dir.path()).is_empty(),
            "refused before converting anything"
        );
    }

    // The machine's memory: refused with the numbers, before anything is loaded.
    let err = check_memory(3 << 30, 2 << 30, 5 << 20, 4096, Some(1 << 30)).unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, Error::Resources { .. }), "{err:?}");
    for w in [
        "5373952000",
        "3221225472",
        "2147483648",
        "5242880",
        "max_context 4096",
        "1073741824",
        "MemAvailable",
    ] {
        assert!(msg.contains(w), "{msg:?} should contain {w}");
    }
    check_memory(3 << 30, 2 << 30, 5 << 20, 4096, Some(6 << 30)).unwrap();
    check_memory(usize::MAX, usize::MAX, 1, 1, None).unwrap();
    let avail = qwen_bpf::model::open::mem_available().expect("MemAvailable in /proc/meminfo");
    assert!(avail > 1 << 20, "MemAvailable {avail}");
}
