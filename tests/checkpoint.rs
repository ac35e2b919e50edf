//! `Checkpoint::open` and the tensor readers against good and deliberately broken checkpoints.
//! Every broken one must give its specific error variant, naming the file or tensor, never a panic.

mod common;

use std::path::Path;

use half::{bf16, f16};
use qwen_bpf::hf::checkpoint::tensor_specs;
use qwen_bpf::hf::synth::{write_checkpoint, KeyStyle, Preset, SynthOptions};
use qwen_bpf::{Checkpoint, Config, Error};
use safetensors::tensor::TensorView;
use safetensors::{Dtype, SafeTensors};
use serde_json::Value;

/// One tensor of a safetensors file, owned.
#[derive(Debug, Clone, PartialEq)]
struct Raw {
    name: String,
    dtype: Dtype,
    shape: Vec<usize>,
    data: Vec<u8>,
}

/// The tiny preset with a 1,000-token vocabulary: every shape of the real thing, 20x smaller.
fn small_config() -> Config {
    Config {
        vocab_size: 1000,
        ..Preset::Tiny.config()
    }
}

/// A fresh checkpoint for `cfg` in a scratch directory.
fn fresh(cfg: &Config, opts: &SynthOptions) -> tempfile::TempDir {
    let dir = common::scratch_dir();
    write_checkpoint(dir.path(), cfg, opts).unwrap();
    dir
}

fn fresh_small() -> tempfile::TempDir {
    fresh(
        &small_config(),
        &SynthOptions {
            seed: 11,
            ..Default::default()
        },
    )
}

fn read_raw(path: &Path) -> Vec<Raw> {
    let bytes = std::fs::read(path).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let mut v: Vec<Raw> = st
        .tensors()
        .into_iter()
        .map(|(name, t)| Raw {
            name,
            dtype: t.dtype(),
            shape: t.shape().to_vec(),
            data: t.data().to_vec(),
        })
        .collect();
    v.sort_by(|a, b| a.name.cmp(&b.name));
    v
}

fn write_raw(path: &Path, tensors: &[Raw]) {
    let views: Vec<(String, TensorView<'_>)> = tensors
        .iter()
        .map(|t| {
            (
                t.name.clone(),
                TensorView::new(t.dtype, t.shape.clone(), &t.data).unwrap(),
            )
        })
        .collect();
    safetensors::serialize_to_file(views, None, path).unwrap();
}

/// Rewrites `dir/model.safetensors` after `edit` changes its tensors.
fn edit_tensors(dir: &Path, edit: impl FnOnce(&mut Vec<Raw>)) {
    let path = dir.join("model.safetensors");
    let mut t = read_raw(&path);
    edit(&mut t);
    write_raw(&path, &t);
}

/// The JSON header of a safetensors file and the data bytes after it.
fn split_file(path: &Path) -> (Value, Vec<u8>) {
    let bytes = std::fs::read(path).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    (header, bytes[8 + n..].to_vec())
}

/// Writes a safetensors file from a header (as JSON text) and data bytes, verbatim.
fn join_file(path: &Path, header: &str, data: &[u8]) {
    let mut out = (header.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(header.as_bytes());
    out.extend_from_slice(data);
    std::fs::write(path, out).unwrap();
}

fn open_err(dir: &Path) -> Error {
    Checkpoint::open(dir).expect_err("the broken checkpoint must not open")
}

fn assert_names(err: &Error, words: &[&str]) {
    let msg = err.to_string();
    for w in words {
        assert!(msg.contains(w), "error {msg:?} should name {w:?}");
    }
}

/// Element offset, in the file's data section, of tensor `name`.
fn data_offset(path: &Path, name: &str) -> usize {
    let (header, _) = split_file(path);
    header[name]["data_offsets"][0].as_u64().unwrap() as usize
}

/// Overwrites BF16 element `index` of tensor `name` with `bits`.
fn poke_bf16(dir: &Path, name: &str, index: usize, bits: u16) {
    let path = dir.join("model.safetensors");
    let bytes = std::fs::read(&path).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let at = 8 + n + data_offset(&path, name) + 2 * index;
    let mut bytes = bytes;
    bytes[at..at + 2].copy_from_slice(&bits.to_le_bytes());
    std::fs::write(&path, bytes).unwrap();
}

// ---------------------------------------------------------------- broken safetensors files

#[test]
fn a_truncated_safetensors_file_is_a_safetensors_error_naming_it() {
    let dir = fresh_small();
    let path = dir.path().join("model.safetensors");
    let full = std::fs::read(&path).unwrap();
    let header_end = 8 + u64::from_le_bytes(full[..8].try_into().unwrap()) as usize;
    for keep in [
        full.len() - 1,
        full.len() - 1000,
        header_end,
        header_end - 10,
        8,
        4,
        0,
    ] {
        std::fs::write(&path, &full[..keep]).unwrap();
        let err = open_err(dir.path());
        assert!(
            matches!(err, Error::Safetensors { .. }),
            "kept {keep} bytes: {err}"
        );
        assert_names(&err, &["model.safetensors"]);
    }
}

#[test]
fn a_header_lying_about_offsets_shape_or_dtype_is_a_safetensors_error() {
    let dir = fresh_small();
    let path = dir.path().join("model.safetensors");
    let (header, data) = split_file(&path);
    let victim = "model.layers.0.self_attn.k_norm.weight";
    let (s, e) = (
        header[victim]["data_offsets"][0].as_u64().unwrap(),
        header[victim]["data_offsets"][1].as_u64().unwrap(),
    );
    let last = data.len() as u64;
    type Lie = Box<dyn Fn(&mut Value)>;
    let lies: Vec<(&str, Lie)> = vec![
        (
            "tensor longer than its shape",
            Box::new(move |h| h[victim]["data_offsets"][1] = (e + 2).into()),
        ),
        (
            "tensor overlapping the previous one",
            Box::new(move |h| h[victim]["data_offsets"][0] = (s - 2).into()),
        ),
        (
            "end before start",
            Box::new(move |h| h[victim]["data_offsets"] = serde_json::json!([e, s])),
        ),
        (
            "tensor past the end of the file",
            Box::new(move |h| {
                h[victim]["data_offsets"] = serde_json::json!([last, last + (e - s)])
            }),
        ),
        (
            "shape disagreeing with the offsets",
            Box::new(move |h| h[victim]["shape"] = serde_json::json!([7])),
        ),
        (
            "shape overflowing usize",
            Box::new(move |h| h[victim]["shape"] = serde_json::json!([u64::MAX / 2, 4])),
        ),
        (
            "unknown dtype",
            Box::new(move |h| h[victim]["dtype"] = "Q4_K".into()),
        ),
        (
            "offsets that are not numbers",
            Box::new(move |h| h[victim]["data_offsets"] = "everywhere".into()),
        ),
    ];
    for (what, lie) in lies {
        let mut h = header.clone();
        lie(&mut h);
        let mut text = serde_json::to_string(&h).unwrap();
        while text.len() % 8 != 0 {
            text.push(' ');
        }
        join_file(&path, &text, &data);
        let err = open_err(dir.path());
        eprintln!("{what}: {err}");
        assert!(matches!(err, Error::Safetensors { .. }), "{what}: {err}");
        assert_names(&err, &["model.safetensors"]);
    }
    // The original header and data still make a good file.
    join_file(&path, &serde_json::to_string(&header).unwrap(), &data);
    Checkpoint::open(dir.path()).unwrap();
}

#[test]
fn garbage_headers_are_errors_not_panics() {
    let dir = fresh_small();
    let path = dir.path().join("model.safetensors");
    let cases: Vec<(&str, Vec<u8>)> = vec![
        (
            "header length u64::MAX",
            [u64::MAX.to_le_bytes().as_slice(), b"{}"].concat(),
        ),
        (
            "header length beyond the file",
            [1000u64.to_le_bytes().as_slice(), b"{}"].concat(),
        ),
        (
            "header not JSON",
            [8u64.to_le_bytes().as_slice(), b"not json"].concat(),
        ),
        (
            "header not UTF-8",
            [4u64.to_le_bytes().as_slice(), &[0xff, 0xfe, 0xfd, 0xfc]].concat(),
        ),
        (
            "header a JSON array",
            [8u64.to_le_bytes().as_slice(), b"[1,2,3] "].concat(),
        ),
        (
            "data after an empty header",
            [8u64.to_le_bytes().as_slice(), b"{}      ", &[0u8; 16]].concat(),
        ),
    ];
    for (what, bytes) in cases {
        std::fs::write(&path, bytes).unwrap();
        let err = open_err(dir.path());
        eprintln!("{what}: {err}");
        assert!(matches!(err, Error::Safetensors { .. }), "{what}: {err}");
        assert_names(&err, &["model.safetensors"]);
    }
    // A well-formed but empty file: every tensor is missing.
    std::fs::write(&path, [2u64.to_le_bytes().as_slice(), b"{}"].concat()).unwrap();
    let err = open_err(dir.path());
    assert!(
        matches!(err, Error::MissingTensor { ref name, .. } if name == "model.embed_tokens.weight"),
        "{err}"
    );
}

#[test]
fn a_tensor_of_the_wrong_dtype_is_a_dtype_error_naming_it() {
    let dir = fresh_small();
    let victim = "model.layers.1.self_attn.q_norm.weight";
    edit_tensors(dir.path(), |ts| {
        let t = ts.iter_mut().find(|t| t.name == victim).unwrap();
        t.dtype = Dtype::I32;
        t.data = (0..t.shape[0] as i32)
            .flat_map(|i| i.to_le_bytes())
            .collect();
    });
    let err = open_err(dir.path());
    assert!(
        matches!(err, Error::Dtype { ref name, ref dtype, .. } if name == victim && dtype == "I32"),
        "{err}"
    );
    assert_names(&err, &[victim, "model.safetensors", "I32"]);
}

#[test]
fn a_tensor_of_the_wrong_shape_is_a_shape_error_naming_it() {
    let dir = fresh_small();
    let cfg = small_config();
    let victim = "model.layers.1.mlp.down_proj.weight";
    let (h, i) = (cfg.hidden_size, cfg.intermediate_size);
    edit_tensors(dir.path(), |ts| {
        ts.iter_mut().find(|t| t.name == victim).unwrap().shape = vec![i, h];
    });
    let err = open_err(dir.path());
    assert!(
        matches!(err, Error::Shape { ref name, ref found, ref expected, .. }
            if name == victim && *found == [i, h] && *expected == [h, i]),
        "{err}"
    );
    assert_names(&err, &[victim, "model.safetensors"]);

    // The same bytes as a flat vector are just as wrong.
    let dir = fresh_small();
    let victim = "model.norm.weight";
    edit_tensors(dir.path(), |ts| {
        ts.iter_mut().find(|t| t.name == victim).unwrap().shape = vec![2, h / 2]
    });
    let err = open_err(dir.path());
    assert!(
        matches!(err, Error::Shape { ref name, .. } if name == victim),
        "{err}"
    );
}

#[test]
fn a_tensor_missing_from_the_file_or_asked_for_is_a_missing_tensor_error() {
    let dir = fresh_small();
    let victim = "model.layers.0.post_attention_layernorm.weight";
    edit_tensors(dir.path(), |ts| ts.retain(|t| t.name != victim));
    let err = open_err(dir.path());
    assert!(
        matches!(err, Error::MissingTensor { ref name, .. } if name == victim),
        "{err}"
    );
    assert_names(&err, &[victim]);

    // An untied config needs lm_head.weight, which a tied checkpoint does not have.
    let dir = fresh_small();
    let cfg_path = dir.path().join("config.json");
    let text = std::fs::read_to_string(&cfg_path).unwrap();
    std::fs::write(
        &cfg_path,
        text.replace(
            r#""tie_word_embeddings": true"#,
            r#""tie_word_embeddings": false"#,
        ),
    )
    .unwrap();
    let err = open_err(dir.path());
    assert!(
        matches!(err, Error::MissingTensor { ref name, .. } if name == "lm_head.weight"),
        "{err}"
    );

    // Asking an open checkpoint for a tensor it does not have.
    let ck = Checkpoint::open(fresh_small().path()).unwrap();
    let err = ck
        .tensor_f32("model.layers.9.mlp.up_proj.weight")
        .unwrap_err();
    assert!(matches!(err, Error::MissingTensor { .. }), "{err}");
    assert!(ck.shape("nope").is_err() && !ck.has("nope"));
}

#[test]
fn a_missing_config_or_weights_file_is_an_io_error_naming_it() {
    let dir = fresh_small();
    std::fs::remove_file(dir.path().join("model.safetensors")).unwrap();
    let err = open_err(dir.path());
    assert!(
        matches!(err, Error::Io { ref path, .. } if path.ends_with("model.safetensors")),
        "{err}"
    );

    let dir = fresh_small();
    std::fs::remove_file(dir.path().join("config.json")).unwrap();
    let err = open_err(dir.path());
    assert!(
        matches!(err, Error::Io { ref path, .. } if path.ends_with("config.json")),
        "{err}"
    );
}

#[test]
fn non_finite_weights_are_errors_when_read_not_at_open() {
    let dir = fresh_small();
    let cfg = small_config();
    let up = "model.layers.0.mlp.up_proj.weight";
    let h = cfg.hidden_size;
    let nan_at = 37 * h + 5; // row 37
    poke_bf16(dir.path(), up, nan_at, 0x7FC0);
    let norm = "model.layers.1.input_layernorm.weight";
    poke_bf16(dir.path(), norm, 3, 0xFF80); // -inf

    // Values are checked when read, not at open.
    let ck = Checkpoint::open(dir.path()).unwrap();
    let err = ck.tensor_f32(up).unwrap_err();
    assert!(
        matches!(err, Error::NonFinite { ref name, index, value } if name == up && index == nan_at && value.is_nan()),
        "{err}"
    );
    assert_names(&err, &[up, &nan_at.to_string()]);

    let mut out = Vec::new();
    let err = ck.read_rows_f32(up, 30, 10, &mut out).unwrap_err();
    assert!(
        matches!(err, Error::NonFinite { index, .. } if index == nan_at),
        "{err}"
    );
    out.clear();
    ck.read_rows_f32(up, 0, 37, &mut out).unwrap();
    ck.read_rows_f32(up, 38, usize::MAX, &mut out).unwrap();
    assert_eq!(out.len(), (cfg.intermediate_size - 1) * h);

    let err = ck.tensor_f32(norm).unwrap_err();
    assert!(
        matches!(err, Error::NonFinite { ref name, index: 3, value } if name == norm && value == f32::NEG_INFINITY),
        "{err}"
    );
    assert_names(&err, &[norm]);
}

#[test]
fn a_bad_config_json_is_a_config_or_unsupported_error_naming_the_key() {
    let dir = fresh_small();
    let path = dir.path().join("config.json");
    let good = std::fs::read_to_string(&path).unwrap();

    std::fs::write(&path, "{ \"hidden_size\": 64, ").unwrap();
    let err = open_err(dir.path());
    assert!(matches!(err, Error::Config { .. }), "{err}");
    assert_names(&err, &["config.json"]);

    let v: Value = serde_json::from_str(&good).unwrap();
    let mut missing = v.clone();
    missing.as_object_mut().unwrap().remove("hidden_size");
    std::fs::write(&path, missing.to_string()).unwrap();
    let err = open_err(dir.path());
    assert!(matches!(err, Error::Config { .. }), "{err}");
    assert_names(&err, &["config.json", "hidden_size"]);

    let mut wrong_type = v.clone();
    wrong_type["num_hidden_layers"] = "two".into();
    std::fs::write(&path, wrong_type.to_string()).unwrap();
    let err = open_err(dir.path());
    assert!(matches!(err, Error::Config { .. }), "{err}");

    let mut zero = v.clone();
    zero["num_attention_heads"] = 0.into();
    std::fs::write(&path, zero.to_string()).unwrap();
    let err = open_err(dir.path());
    assert!(matches!(err, Error::Config { .. }), "{err}");
    assert_names(&err, &["num_attention_heads"]);

    let mut yarn = v.clone();
    yarn["rope_scaling"] = serde_json::json!({"rope_type": "yarn", "factor": 4.0});
    std::fs::write(&path, yarn.to_string()).unwrap();
    let err = open_err(dir.path());
    assert!(matches!(err, Error::Unsupported { .. }), "{err}");
    assert_names(&err, &["config.json", "rope_scaling"]);

    std::fs::write(&path, good).unwrap();
    Checkpoint::open(dir.path()).unwrap();
}

// ---------------------------------------------------------------- good checkpoints

/// Opens `dir` and checks every tensor of the config reads back with its shape, finite.
fn check_all_tensors(dir: &Path) -> Checkpoint {
    let ck = Checkpoint::open(dir).unwrap();
    let specs = tensor_specs(&ck.config);
    for (name, shape) in &specs {
        assert_eq!(ck.shape(name).unwrap(), shape.as_slice(), "{name}");
        let v = ck.tensor_f32(name).unwrap();
        assert_eq!(v.len(), shape.iter().product::<usize>(), "{name}");
        assert!(v.iter().all(|x| x.is_finite()), "{name}");
    }
    ck
}

#[test]
fn tied_and_untied_checkpoints_read_back() {
    let tied = common::tiny_model("tiny");
    let ck = check_all_tensors(&tied);
    assert!(ck.config.tie_word_embeddings && !ck.has("lm_head.weight"));
    assert_eq!(ck.config, Preset::Tiny.config());
    assert!(
        !tied.join("tokenizer.json").exists(),
        "no tokenizer unless asked for"
    );
    // A second call in the same process reuses the directory.
    assert_eq!(common::tiny_model("tiny"), tied);

    let cfg = Config {
        tie_word_embeddings: false,
        ..Preset::Tiny.config()
    };
    let untied = common::model_with("tiny-untied", &cfg, &SynthOptions::default());
    let ck = check_all_tensors(&untied);
    assert!(!ck.config.tie_word_embeddings && ck.has("lm_head.weight"));
    assert_eq!(ck.shape("lm_head.weight").unwrap(), [151_936, 64]);
    let e = ck.tensor_f32("model.embed_tokens.weight").unwrap();
    let l = ck.tensor_f32("lm_head.weight").unwrap();
    assert_ne!(e, l, "lm_head is generated independently of the embeddings");
}

#[test]
fn both_key_styles_load_alike() {
    let cfg = small_config();
    let t4 = fresh(
        &cfg,
        &SynthOptions {
            key_style: KeyStyle::Transformers4,
            ..Default::default()
        },
    );
    let t5 = fresh(
        &cfg,
        &SynthOptions {
            key_style: KeyStyle::Transformers5,
            ..Default::default()
        },
    );
    let text4 = std::fs::read_to_string(t4.path().join("config.json")).unwrap();
    let text5 = std::fs::read_to_string(t5.path().join("config.json")).unwrap();
    let (v4, v5): (Value, Value) = (
        serde_json::from_str(&text4).unwrap(),
        serde_json::from_str(&text5).unwrap(),
    );
    assert_eq!(v4["rope_theta"], 1e6);
    assert_eq!(v4["torch_dtype"], "bfloat16");
    assert!(
        v4.get("rope_parameters").is_none() && v4.get("dtype").is_none(),
        "{text4}"
    );
    assert_eq!(
        v5["rope_parameters"],
        serde_json::json!({"rope_theta": 1e6, "rope_type": "default"})
    );
    assert_eq!(v5["dtype"], "bfloat16");
    assert!(
        v5.get("rope_theta").is_none() && v5.get("torch_dtype").is_none(),
        "{text5}"
    );

    let (c4, c5) = (
        Checkpoint::open(t4.path()).unwrap(),
        Checkpoint::open(t5.path()).unwrap(),
    );
    assert_eq!(c4.config.rope_theta(), 1e6);
    assert_eq!(c5.config.rope_theta(), c4.config.rope_theta());
    assert_eq!(c4.config, cfg, "transformers-4 keys read back identically");
    for (name, _) in tensor_specs(&cfg) {
        assert_eq!(
            c4.tensor_f32(&name).unwrap(),
            c5.tensor_f32(&name).unwrap(),
            "{name}"
        );
    }
}

#[test]
fn seeds_are_deterministic() {
    let cfg = small_config();
    let a = fresh(
        &cfg,
        &SynthOptions {
            seed: 9,
            ..Default::default()
        },
    );
    let b = fresh(
        &cfg,
        &SynthOptions {
            seed: 9,
            ..Default::default()
        },
    );
    let c = fresh(
        &cfg,
        &SynthOptions {
            seed: 10,
            ..Default::default()
        },
    );
    let read = |d: &tempfile::TempDir| std::fs::read(d.path().join("model.safetensors")).unwrap();
    assert!(read(&a) == read(&b), "same seed, same bytes");
    assert!(read(&a) != read(&c), "another seed, other weights");
}

#[test]
fn sharded_checkpoint_reads_identical_values() {
    let single = fresh_small();
    let tensors = read_raw(&single.path().join("model.safetensors"));
    let sharded = common::scratch_dir();
    std::fs::copy(
        single.path().join("config.json"),
        sharded.path().join("config.json"),
    )
    .unwrap();
    let (first, second) = tensors.split_at(tensors.len() / 2);
    let names = [
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
    ];
    write_raw(&sharded.path().join(names[0]), first);
    write_raw(&sharded.path().join(names[1]), second);
    let mut weight_map = serde_json::Map::new();
    for (shard, part) in names.iter().zip([first, second]) {
        for t in part {
            weight_map.insert(t.name.clone(), (*shard).into());
        }
    }
    let total: usize = tensors.iter().map(|t| t.data.len()).sum();
    let index = serde_json::json!({"metadata": {"total_size": total}, "weight_map": weight_map});
    let index_path = sharded.path().join("model.safetensors.index.json");
    std::fs::write(&index_path, serde_json::to_string_pretty(&index).unwrap()).unwrap();

    let (a, b) = (
        Checkpoint::open(single.path()).unwrap(),
        check_all_tensors(sharded.path()),
    );
    for (name, _) in tensor_specs(&a.config) {
        assert_eq!(
            a.tensor_f32(&name).unwrap(),
            b.tensor_f32(&name).unwrap(),
            "{name}"
        );
    }
    let mut rows = Vec::new();
    b.read_rows_f32("model.embed_tokens.weight", 10, 3, &mut rows)
        .unwrap();
    let all = a.tensor_f32("model.embed_tokens.weight").unwrap();
    assert_eq!(rows, all[10 * 64..13 * 64]);

    // A missing shard, an index escaping the directory, an index without weight_map.
    std::fs::rename(
        sharded.path().join(names[1]),
        sharded.path().join("elsewhere"),
    )
    .unwrap();
    let err = open_err(sharded.path());
    assert!(
        matches!(err, Error::Io { ref path, .. } if path.ends_with(names[1])),
        "{err}"
    );
    let mut evil = index.clone();
    evil["weight_map"]["model.norm.weight"] = "../model.safetensors".into();
    std::fs::write(&index_path, evil.to_string()).unwrap();
    let err = open_err(sharded.path());
    assert!(matches!(err, Error::Safetensors { .. }), "{err}");
    assert_names(&err, &["model.safetensors.index.json", "model.norm.weight"]);
    std::fs::write(&index_path, r#"{"metadata": {}}"#).unwrap();
    let err = open_err(sharded.path());
    assert!(matches!(err, Error::Safetensors { .. }), "{err}");
    assert_names(&err, &["weight_map"]);
    std::fs::write(&index_path, "{").unwrap();
    assert!(matches!(
        open_err(sharded.path()),
        Error::Safetensors { .. }
    ));
}

#[test]
fn f16_and_f32_tensors_read_correctly() {
    let dir = fresh_small();
    let original = Checkpoint::open(dir.path()).unwrap();
    let as_f32 = [
        "model.embed_tokens.weight",
        "model.layers.0.self_attn.k_norm.weight",
        "model.norm.weight",
    ];
    let as_f16 = [
        "model.layers.1.self_attn.o_proj.weight",
        "model.layers.1.input_layernorm.weight",
    ];
    let expected: Vec<(String, Vec<f32>)> = tensor_specs(&original.config)
        .into_iter()
        .map(|(name, _)| {
            let v = original.tensor_f32(&name).unwrap();
            let v = if as_f16.contains(&name.as_str()) {
                v.iter().map(|&x| f16::from_f32(x).to_f32()).collect()
            } else {
                v
            };
            (name, v)
        })
        .collect();
    drop(original);
    edit_tensors(dir.path(), |ts| {
        for t in ts.iter_mut() {
            let vals = t
                .data
                .chunks_exact(2)
                .map(|b| bf16::from_le_bytes([b[0], b[1]]).to_f32());
            if as_f32.contains(&t.name.as_str()) {
                t.data = vals.flat_map(f32::to_le_bytes).collect();
                t.dtype = Dtype::F32;
            } else if as_f16.contains(&t.name.as_str()) {
                t.data = vals.flat_map(|x| f16::from_f32(x).to_le_bytes()).collect();
                t.dtype = Dtype::F16;
            }
        }
    });
    let ck = Checkpoint::open(dir.path()).unwrap();
    for (name, want) in &expected {
        assert_eq!(&ck.tensor_f32(name).unwrap(), want, "{name}");
    }
    // Row reads agree with whole reads for every dtype.
    for name in [as_f32[0], as_f16[0], "model.layers.0.mlp.gate_proj.weight"] {
        let shape = ck.shape(name).unwrap().to_vec();
        let all = ck.tensor_f32(name).unwrap();
        let mut rows = Vec::new();
        ck.read_rows_f32(name, 3, 5, &mut rows).unwrap();
        assert_eq!(rows, all[3 * shape[1]..8 * shape[1]], "{name}");
    }
}

#[test]
fn extra_tensors_are_tolerated() {
    let dir = fresh_small();
    edit_tensors(dir.path(), |ts| {
        ts.push(Raw {
            name: "model.rotary_emb.inv_freq".into(),
            dtype: Dtype::I64,
            shape: vec![2],
            data: vec![0; 16],
        })
    });
    let ck = Checkpoint::open(dir.path()).unwrap();
    assert!(ck.has("model.rotary_emb.inv_freq"));
    assert!(matches!(
        ck.tensor_f32("model.rotary_emb.inv_freq").unwrap_err(),
        Error::Dtype { .. }
    ));

    // Degenerate shapes of extra tensors read without panicking.
    let dir = fresh_small();
    let scalar = f32::to_le_bytes(2.5).to_vec();
    edit_tensors(dir.path(), |ts| {
        ts.push(Raw {
            name: "empty".into(),
            dtype: Dtype::BF16,
            shape: vec![0],
            data: vec![],
        });
        ts.push(Raw {
            name: "empty2d".into(),
            dtype: Dtype::F16,
            shape: vec![3, 0],
            data: vec![],
        });
        ts.push(Raw {
            name: "scalar".into(),
            dtype: Dtype::F32,
            shape: vec![],
            data: scalar,
        });
    });
    let ck = Checkpoint::open(dir.path()).unwrap();
    assert_eq!(ck.tensor_f32("empty").unwrap(), Vec::<f32>::new());
    assert_eq!(ck.tensor_f32("empty2d").unwrap(), Vec::<f32>::new());
    assert_eq!(ck.tensor_f32("scalar").unwrap(), [2.5]);
}

#[test]
fn row_reads_past_the_end_are_empty_not_panics() {
    let ck = Checkpoint::open(fresh_small().path()).unwrap();
    let name = "model.layers.0.mlp.up_proj.weight";
    let rows = ck.shape(name).unwrap()[0];
    let mut out = vec![1.0];
    ck.read_rows_f32(name, rows, 4, &mut out).unwrap();
    ck.read_rows_f32(name, rows + 1000, 4, &mut out).unwrap();
    ck.read_rows_f32(name, usize::MAX, usize::MAX, &mut out)
        .unwrap();
    ck.read_rows_f32("model.norm.weight", 1, 1, &mut out)
        .unwrap();
    assert_eq!(out, [1.0]);
    ck.read_rows_f32(name, rows - 1, 4, &mut out).unwrap();
    assert_eq!(out.len(), 1 + ck.shape(name).unwrap()[1]);
}

/// The full-size preset: 1.2 GB on disk, so only on demand:
/// `cargo test --release --test checkpoint -- --ignored`.
#[test]
#[ignore = "writes and reads the full-size qwen3-0.6b preset (1.2 GB): on demand only"]
fn qwen3_0_6b_preset_opens_and_reads() {
    let dir = common::scratch_dir();
    let t0 = std::time::Instant::now();
    write_checkpoint(
        dir.path(),
        &Preset::Qwen3_0_6B.config(),
        &SynthOptions::default(),
    )
    .unwrap();
    eprintln!(
        "generated qwen3-0.6b in {:.1} s",
        t0.elapsed().as_secs_f64()
    );
    let ck = check_all_tensors(dir.path());
    assert_eq!(ck.config.num_parameters(), 596_049_920);
}
