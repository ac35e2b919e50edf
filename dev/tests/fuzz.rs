//! Property tests over hostile inputs: mutated `config.json` text, mutated safetensors files and
//! indexes, and mutated cache files. None may panic; each gives `Ok` or one of its typed errors,
//! and a cache file is accepted only if it is byte for byte the one that was written.
//!
//! Cases per property: `PROPTEST_CASES` (default 128); inputs are small, so the file runs in
//! seconds. Failures are not persisted to disk: a crashing input found here is kept as an
//! explicit regression test at the end of this file.

#[path = "../../tests/common/mod.rs"]
mod common;

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use proptest::prelude::*;
use proptest::sample::Index;
use proptest::test_runner::{Config as ProptestConfig, FileFailurePersistence};
use qwen_bpf::hf::checkpoint::tensor_specs;
use qwen_bpf::hf::synth::{self, Preset, SynthOptions};
use qwen_bpf::store::cache;
use qwen_bpf::{Checkpoint, Config, Error};
use serde_json::Value;

fn proptest_config() -> ProptestConfig {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(128);
    ProptestConfig {
        cases,
        failure_persistence: Some(Box::new(FileFailurePersistence::Off)),
        ..ProptestConfig::default()
    }
}

/// The smallest valid config: one layer, hidden 32, two heads of 16, vocabulary 64.
fn small_config() -> Config {
    Config {
        vocab_size: 64,
        hidden_size: 32,
        intermediate_size: 32,
        num_hidden_layers: 1,
        num_attention_heads: 2,
        num_key_value_heads: 1,
        head_dim: Some(16),
        ..Preset::Tiny.config()
    }
}

/// A valid checkpoint for [`small_config`], written once per process; its safetensors bytes.
fn original_checkpoint() -> &'static (PathBuf, Vec<u8>) {
    static ORIG: OnceLock<(PathBuf, Vec<u8>)> = OnceLock::new();
    ORIG.get_or_init(|| {
        let dir = common::model_with(
            "fuzz-small",
            &small_config(),
            &SynthOptions {
                seed: 3,
                ..Default::default()
            },
        );
        let bytes = std::fs::read(dir.join("model.safetensors")).unwrap();
        (dir, bytes)
    })
}

/// A scratch directory holding the small checkpoint's config.json, for one property.
fn checkpoint_scratch() -> tempfile::TempDir {
    let (dir, _) = original_checkpoint();
    let d = common::scratch_dir();
    std::fs::copy(dir.join("config.json"), d.path().join("config.json")).unwrap();
    d
}

// ------------------------------------------------------------------------------ JSON values

fn interesting_number() -> impl Strategy<Value = Value> {
    prop_oneof![
        prop::sample::select(vec![
            0i64,
            1,
            -1,
            2,
            3,
            15,
            16,
            17,
            31,
            32,
            33,
            48,
            64,
            96,
            128,
            512,
            513,
            1024,
            1025,
            16_384,
            65_536,
            1 << 24,
            (1 << 24) + 1,
            1 << 32,
            1 << 62,
            i64::MAX,
            i64::MIN
        ])
        .prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        prop::sample::select(vec![
            0.0,
            -0.0,
            1e-6,
            9.9e-3,
            1e-2,
            0.5,
            1.0,
            1.5,
            1e6,
            1e300,
            -1e300,
            f64::MIN_POSITIVE,
            f64::MAX
        ])
        .prop_map(Value::from),
        any::<f64>().prop_filter_map("finite", |f| f.is_finite().then(|| Value::from(f))),
    ]
}

fn leaf() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        interesting_number(),
        interesting_number(),
        prop::sample::select(vec![
            "silu", "gelu", "qwen3", "llama", "default", "yarn", "bfloat16", "", "null"
        ])
        .prop_map(Value::from),
        "\\PC{0,12}".prop_map(Value::from),
    ]
}

fn json_value() -> impl Strategy<Value = Value> {
    leaf().prop_recursive(2, 12, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::btree_map("[a-z_]{1,12}", inner.clone(), 0..4)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
            (inner.clone(), inner)
                .prop_map(|(t, r)| serde_json::json!({"rope_theta": t, "rope_type": r})),
        ]
    })
}

// --------------------------------------------------------------------------- config.json

const CONFIG_KEYS: &[&str] = &[
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "max_position_embeddings",
    "rms_norm_eps",
    "rope_theta",
    "rope_parameters",
    "rope_scaling",
    "tie_word_embeddings",
    "attention_bias",
    "use_sliding_window",
    "hidden_act",
    "torch_dtype",
    "dtype",
    "bos_token_id",
    "eos_token_id",
    "architectures",
    "model_type",
    "some_unknown_key",
];

#[derive(Debug, Clone)]
enum ConfigEdit {
    Set(&'static str, Value),
    Remove(&'static str),
}

#[derive(Debug, Clone)]
enum TextEdit {
    None,
    Truncate(Index),
    Byte(Index, u8),
    Insert(Index, String),
}

fn config_edit() -> impl Strategy<Value = ConfigEdit> {
    let key = prop::sample::select(CONFIG_KEYS);
    prop_oneof![4 => (key.clone(), json_value()).prop_map(|(k, v)| ConfigEdit::Set(k, v)), 1 => key.prop_map(ConfigEdit::Remove)]
}

fn text_edit() -> impl Strategy<Value = TextEdit> {
    prop_oneof![
        4 => Just(TextEdit::None),
        1 => any::<Index>().prop_map(TextEdit::Truncate),
        1 => (any::<Index>(), any::<u8>()).prop_map(|(i, b)| TextEdit::Byte(i, b)),
        1 => (any::<Index>(), prop::sample::select(vec!["{", "}", "[", "\"", ",", ":", "null", "1e999", "-", "\\u0000"]).prop_map(String::from))
            .prop_map(|(i, s)| TextEdit::Insert(i, s)),
    ]
}

fn apply_text(text: &str, edit: &TextEdit) -> String {
    let mut b = text.as_bytes().to_vec();
    match edit {
        TextEdit::None => {}
        TextEdit::Truncate(i) => b.truncate(i.index(b.len() + 1)),
        TextEdit::Byte(i, v) => {
            let at = i.index(b.len());
            b[at] = *v;
        }
        TextEdit::Insert(i, s) => {
            let at = i.index(b.len() + 1);
            b.splice(at..at, s.bytes());
        }
    }
    String::from_utf8_lossy(&b).into_owned()
}

/// What parsing `text` must come to: `Ok` with a config that is usable everywhere, or a typed
/// config error naming the file.
fn check_config_text(text: &str) -> std::result::Result<(), TestCaseError> {
    let path = Path::new("fuzz/config.json");
    match Config::from_json(text, path) {
        Ok(cfg) => {
            cfg.validate(path)
                .map_err(|e| TestCaseError::fail(format!("accepted, then invalid: {e}")))?;
            // Everything the engine derives from a config must be computable.
            let _ = (
                cfg.head_dim(),
                cfg.q_dim(),
                cfg.kv_dim(),
                cfg.gqa_ratio(),
                cfg.rope_theta(),
            );
            let specs = tensor_specs(&cfg);
            prop_assert_eq!(
                specs.len(),
                1 + 11 * cfg.num_hidden_layers + 1 + usize::from(!cfg.tie_word_embeddings)
            );
            let params: u128 = specs
                .iter()
                .map(|(_, s)| s.iter().map(|&d| d as u128).product::<u128>())
                .sum();
            prop_assert_eq!(params, cfg.num_parameters() as u128);
            let again = Config::from_json(&serde_json::to_string(&cfg).unwrap(), path)
                .expect("a config serialised back must parse");
            prop_assert_eq!(again, cfg);
        }
        Err(Error::Config { path: p, .. } | Error::Unsupported { path: p, .. }) => {
            prop_assert_eq!(p.as_path(), path)
        }
        Err(other) => {
            return Err(TestCaseError::fail(format!(
                "untyped config error: {other:?}"
            )))
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(proptest_config())]

    #[test]
    fn config_json_mutations_never_panic(edits in prop::collection::vec(config_edit(), 1..6), text in text_edit()) {
        let mut v = serde_json::to_value(small_config()).unwrap();
        for e in &edits {
            match e {
                ConfigEdit::Set(k, x) => v[*k] = x.clone(),
                ConfigEdit::Remove(k) => { v.as_object_mut().unwrap().remove(*k); }
            }
        }
        check_config_text(&apply_text(&v.to_string(), &text))?;
    }
}

// -------------------------------------------------------------------------- safetensors

#[derive(Debug, Clone)]
enum StEdit {
    /// Keep this many bytes.
    Truncate(Index),
    /// Flip one bit; in the header when the flag is set.
    Flip(Index, u8, bool),
    /// Overwrite a byte; in the header when the flag is set.
    Byte(Index, u8, bool),
    /// Replace the header length field.
    HeaderLen(u64),
    /// Set a field of one tensor's header entry (or the whole entry) to a value.
    Field(Index, &'static str, Value),
    /// Remove one tensor's header entry.
    Drop(Index),
    /// Append bytes to the file.
    Append(Vec<u8>),
}

fn header_value() -> impl Strategy<Value = Value> {
    prop_oneof![
        prop::sample::select(vec![
            "BF16", "F16", "F32", "F64", "I8", "U8", "I16", "I32", "I64", "BOOL", "F8_E4M3",
            "E8M0", "bf16", "Q4"
        ])
        .prop_map(Value::from),
        prop::collection::vec(
            prop::sample::select(vec![0u64, 1, 2, 16, 32, 64, 1 << 31, 1 << 40, u64::MAX]),
            0..4
        )
        .prop_map(Value::from),
        (any::<u16>(), any::<u16>()).prop_map(|(a, b)| serde_json::json!([a, b])),
        prop::collection::vec(any::<u64>(), 0..3).prop_map(Value::from),
        json_value(),
    ]
}

fn st_edit() -> impl Strategy<Value = StEdit> {
    prop_oneof![
        1 => any::<Index>().prop_map(StEdit::Truncate),
        3 => (any::<Index>(), 0u8..8, prop::bool::weighted(0.8)).prop_map(|(i, b, h)| StEdit::Flip(i, b, h)),
        2 => (any::<Index>(), any::<u8>(), prop::bool::weighted(0.8)).prop_map(|(i, b, h)| StEdit::Byte(i, b, h)),
        1 => prop_oneof![Just(0u64), Just(1), Just(7), Just(u64::MAX), Just(1 << 32), any::<u64>(), 0u64..5000].prop_map(StEdit::HeaderLen),
        4 => (any::<Index>(), prop::sample::select(vec!["dtype", "shape", "data_offsets", "", "extra"]), header_value())
            .prop_map(|(i, f, v)| StEdit::Field(i, f, v)),
        1 => any::<Index>().prop_map(StEdit::Drop),
        1 => prop::collection::vec(any::<u8>(), 1..64).prop_map(StEdit::Append),
    ]
}

/// `bytes` with `edit` applied. Structured edits re-serialise the header (keeping the data).
fn apply_st(bytes: &[u8], edit: &StEdit) -> Vec<u8> {
    let mut b = bytes.to_vec();
    let header_end = || {
        let n = b
            .get(..8)
            .map(|h| u64::from_le_bytes(h.try_into().unwrap()))
            .unwrap_or(0);
        usize::try_from(n)
            .ok()
            .and_then(|n| n.checked_add(8))
            .unwrap_or(usize::MAX)
            .min(b.len())
    };
    let parsed = || -> Option<(serde_json::Map<String, Value>, usize)> {
        let end = header_end();
        let v: Value = serde_json::from_slice(b.get(8..end)?).ok()?;
        Some((v.as_object()?.clone(), end))
    };
    let rebuild = |map: serde_json::Map<String, Value>, data: &[u8]| {
        let text = Value::Object(map).to_string();
        [
            &(text.len() as u64).to_le_bytes()[..],
            text.as_bytes(),
            data,
        ]
        .concat()
    };
    match edit {
        StEdit::Truncate(i) => b.truncate(i.index(b.len() + 1)),
        StEdit::Flip(i, bit, in_header) | StEdit::Byte(i, bit, in_header) if !b.is_empty() => {
            let span = if *in_header {
                header_end().max(1)
            } else {
                b.len()
            };
            let at = i.index(span);
            match edit {
                StEdit::Flip(..) => b[at] ^= 1 << bit,
                _ => b[at] = *bit,
            }
        }
        StEdit::Flip(..) | StEdit::Byte(..) => {}
        StEdit::HeaderLen(n) => {
            if b.len() >= 8 {
                b[..8].copy_from_slice(&n.to_le_bytes());
            }
        }
        StEdit::Field(i, field, value) => {
            if let Some((mut map, end)) = parsed() {
                let names: Vec<String> = map.keys().cloned().collect();
                let name = &names[i.index(names.len())];
                match *field {
                    "" => {
                        map.insert(name.clone(), value.clone());
                    }
                    "extra" => {
                        map.insert(format!("{name}.extra"), value.clone());
                    }
                    f => {
                        if let Some(o) = map.get_mut(name).and_then(Value::as_object_mut) {
                            o.insert(f.to_string(), value.clone());
                        }
                    }
                }
                b = rebuild(map, &bytes[end..]);
            }
        }
        StEdit::Drop(i) => {
            if let Some((mut map, end)) = parsed() {
                let names: Vec<String> = map.keys().cloned().collect();
                map.remove(&names[i.index(names.len())]);
                b = rebuild(map, &bytes[end..]);
            }
        }
        StEdit::Append(extra) => b.extend_from_slice(extra),
    }
    b
}

/// Opens the checkpoint in `dir` (whose model.safetensors is `bytes`) and reads every tensor.
fn check_checkpoint(dir: &Path, bytes: &[u8]) -> std::result::Result<(), TestCaseError> {
    let (_, original) = original_checkpoint();
    match Checkpoint::open(dir) {
        Ok(ck) => {
            for (name, shape) in tensor_specs(&ck.config) {
                prop_assert_eq!(ck.shape(&name).unwrap(), shape.as_slice());
                match ck.tensor_f32(&name) {
                    Ok(v) => prop_assert_eq!(v.len(), shape.iter().product::<usize>()),
                    Err(Error::NonFinite { name: n, .. }) => prop_assert_eq!(n, name),
                    Err(e) => {
                        return Err(TestCaseError::fail(format!(
                            "reading `{name}` of an accepted checkpoint: {e:?}"
                        )))
                    }
                }
            }
        }
        Err(
            Error::Safetensors { path, .. } | Error::Dtype { path, .. } | Error::Shape { path, .. },
        ) => {
            prop_assert!(path.starts_with(dir), "error names {}", path.display());
            prop_assert!(
                bytes != original.as_slice(),
                "the original checkpoint must open"
            );
        }
        Err(Error::MissingTensor { .. } | Error::Io { .. }) => {
            prop_assert!(bytes != original.as_slice())
        }
        Err(other) => return Err(TestCaseError::fail(format!("unexpected error: {other:?}"))),
    }
    Ok(())
}

proptest! {
    #![proptest_config(proptest_config())]

    #[test]
    fn safetensors_mutations_never_panic(edits in prop::collection::vec(st_edit(), 0..4)) {
        thread_local!(static DIR: tempfile::TempDir = checkpoint_scratch());
        let (_, original) = original_checkpoint();
        let bytes = edits.iter().fold(original.clone(), |b, e| apply_st(&b, e));
        DIR.with(|d| {
            std::fs::write(d.path().join("model.safetensors"), &bytes).unwrap();
            check_checkpoint(d.path(), &bytes)
        })?;
    }

    #[test]
    fn sharded_index_mutations_never_panic(
        index in prop_oneof![
            json_value(),
            prop::collection::btree_map(
                prop::sample::select(vec!["model.embed_tokens.weight", "model.norm.weight", "x"]),
                prop_oneof![
                    prop::sample::select(vec!["model.safetensors", "shard.safetensors", "../model.safetensors", "/etc/passwd", "a/b", "..", ""]).prop_map(Value::from),
                    leaf(),
                ],
                0..4,
            )
            .prop_map(|m| serde_json::json!({ "weight_map": m })),
        ]
    ) {
        thread_local!(static DIR: tempfile::TempDir = {
            let d = checkpoint_scratch();
            std::fs::write(d.path().join("shard.safetensors"), &original_checkpoint().1).unwrap();
            d
        });
        DIR.with(|d| {
            std::fs::write(d.path().join("model.safetensors.index.json"), index.to_string()).unwrap();
            match Checkpoint::open(d.path()) {
                // Only an index naming the one real shard may open.
                Ok(_) => prop_assert!(index["weight_map"].as_object().is_some_and(|m| m.values().all(|f| f == "shard.safetensors"))),
                Err(Error::Safetensors { .. } | Error::Io { .. } | Error::MissingTensor { .. }) => {}
                Err(other) => return Err(TestCaseError::fail(format!("unexpected error: {other:?}"))),
            }
            Ok(())
        })?;
    }
}

// ------------------------------------------------------------------------------ cache files

const IDENTITY: &str = "model.safetensors:1234:5678;";

/// A small valid cache file's bytes: three tensors, 200 payload bytes.
fn original_cache() -> &'static Vec<u8> {
    static ORIG: OnceLock<Vec<u8>> = OnceLock::new();
    ORIG.get_or_init(|| {
        let d = common::scratch_dir();
        let path = d.path().join("c");
        let entries = vec![
            cache::Entry {
                name: "a".into(),
                q: 24,
                offset: 0,
                len: 64,
            },
            cache::Entry {
                name: "b.weight".into(),
                q: 20,
                offset: 64,
                len: 100,
            },
            cache::Entry {
                name: "c".into(),
                q: 24,
                offset: 164,
                len: 36,
            },
        ];
        let payload: Vec<u8> = (0..200u32).map(|i| (i * 37 + 11) as u8).collect();
        cache::write(&path, "fuzz", IDENTITY, &small_config(), entries, |sink| {
            sink(&payload)
        })
        .unwrap();
        std::fs::read(&path).unwrap()
    })
}

#[derive(Debug, Clone)]
enum CacheEdit {
    Truncate(Index),
    /// Flip a bit: in the first 4 KiB (magic, version, header, padding) when the flag is set.
    Flip(Index, u8, bool),
    Byte(Index, u8, bool),
    Append(Vec<u8>),
    /// Overwrite the u32 at byte 8 (version) or 12 (header length).
    Word(bool, u32),
}

fn cache_edit() -> impl Strategy<Value = CacheEdit> {
    prop_oneof![
        1 => any::<Index>().prop_map(CacheEdit::Truncate),
        4 => (any::<Index>(), 0u8..8, prop::bool::weighted(0.7)).prop_map(|(i, b, h)| CacheEdit::Flip(i, b, h)),
        2 => (any::<Index>(), any::<u8>(), prop::bool::weighted(0.7)).prop_map(|(i, b, h)| CacheEdit::Byte(i, b, h)),
        1 => prop::collection::vec(any::<u8>(), 1..16).prop_map(CacheEdit::Append),
        1 => (any::<bool>(), prop_oneof![Just(0u32), Just(1), Just(2), Just(u32::MAX), 0u32..5000, any::<u32>()]).prop_map(|(v, w)| CacheEdit::Word(v, w)),
    ]
}

fn apply_cache(b: &mut Vec<u8>, e: &CacheEdit) {
    match e {
        CacheEdit::Truncate(i) => b.truncate(i.index(b.len() + 1)),
        CacheEdit::Flip(i, bit, head) if !b.is_empty() => {
            let at = i.index(if *head { b.len().min(4096) } else { b.len() });
            b[at] ^= 1 << bit;
        }
        CacheEdit::Byte(i, v, head) if !b.is_empty() => {
            let at = i.index(if *head { b.len().min(4096) } else { b.len() });
            b[at] = *v;
        }
        CacheEdit::Flip(..) | CacheEdit::Byte(..) => {}
        CacheEdit::Append(x) => b.extend_from_slice(x),
        CacheEdit::Word(version, w) => {
            let at = if *version { 8 } else { 12 };
            if b.len() >= at + 4 {
                b[at..at + 4].copy_from_slice(&w.to_le_bytes());
            }
        }
    }
}

/// Opens the cache file at `path` holding `bytes`: accepted only if `bytes` is the original.
fn check_cache(path: &Path, bytes: &[u8]) -> std::result::Result<(), TestCaseError> {
    let original = original_cache();
    match cache::open(path, "fuzz", IDENTITY, &small_config()) {
        Ok(Ok(c)) => {
            prop_assert!(
                bytes == original.as_slice(),
                "a modified cache file was accepted"
            );
            for e in &c.header.tensors {
                prop_assert_eq!(c.bytes(&e.name).unwrap().len(), e.len);
            }
        }
        Ok(Err(reason)) => prop_assert!(
            bytes != original.as_slice(),
            "the original was rejected: {}",
            reason
        ),
        Err(e) => {
            return Err(TestCaseError::fail(format!(
                "cache::open failed instead of asking for a rebuild: {e:?}"
            )))
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(proptest_config())]

    #[test]
    fn cache_file_mutations_are_never_accepted(edits in prop::collection::vec(cache_edit(), 0..4)) {
        thread_local!(static DIR: tempfile::TempDir = common::scratch_dir());
        let mut bytes = original_cache().clone();
        for e in &edits {
            apply_cache(&mut bytes, e);
        }
        DIR.with(|d| {
            let path = d.path().join("c");
            std::fs::write(&path, &bytes).unwrap();
            check_cache(&path, &bytes)
        })?;
    }

    #[test]
    fn cache_header_edits_are_never_accepted(
        field in 0usize..8,
        index in any::<Index>(),
        number in prop_oneof![Just(0usize), Just(1), 0usize..300, Just(usize::MAX)],
        text in "[a-z0-9]{0,4}",
    ) {
        // A header that parses and is re-serialised exactly as the writer would: only the edit
        // differs, so only the checksum over header and payload can catch it.
        thread_local!(static DIR: tempfile::TempDir = common::scratch_dir());
        let original = original_cache();
        let hlen = u32::from_le_bytes(original[12..16].try_into().unwrap()) as usize;
        let mut h: cache::Header = serde_json::from_slice(&original[16..16 + hlen]).unwrap();
        let t = index.index(h.tensors.len());
        match field {
            0 => h.tensors[t].offset = number,
            1 => h.tensors[t].len = number,
            2 => h.tensors[t].q = number as u32,
            3 => h.tensors[t].name = text.clone(),
            4 => h.payload_bytes = number,
            5 => { h.tensors.remove(t); }
            6 => h.tensors.swap(t, (t + 1) % 3),
            _ => h.config.max_position_embeddings = number,
        }
        let json = serde_json::to_vec(&h).unwrap();
        let mut bytes = [&original[..12], &(json.len() as u32).to_le_bytes(), &json].concat();
        bytes.resize((16 + json.len()).div_ceil(4096) * 4096, 0);
        bytes.extend_from_slice(&original[(16 + hlen).div_ceil(4096) * 4096..]);
        DIR.with(|d| {
            let path = d.path().join("c");
            std::fs::write(&path, &bytes).unwrap();
            check_cache(&path, &bytes)
        })?;
    }
}

// ---------------------------------------------------------------------- deterministic cases

#[test]
fn unmodified_inputs_are_accepted() {
    let (dir, _) = original_checkpoint();
    Checkpoint::open(dir).unwrap();
    check_config_text(&serde_json::to_string(&small_config()).unwrap()).unwrap();
    let d = common::scratch_dir();
    let path = d.path().join("c");
    std::fs::write(&path, original_cache()).unwrap();
    assert!(cache::open(&path, "fuzz", IDENTITY, &small_config())
        .unwrap()
        .is_ok());
    // and the synthetic generator agrees with the config it was given
    assert!(synth::write_checkpoint(
        &d.path().join("m"),
        &small_config(),
        &SynthOptions::default()
    )
    .is_ok());
}

// Regressions: inputs the properties above found, kept as plain tests.

/// Found by `cache_header_edits_are_never_accepted`: a tensor's offset moved inside the payload
/// (`b.weight` from 64 to 0) was accepted with the payload checksum intact, so a store would have
/// read another tensor's bytes. The checksum now covers the header.
#[test]
fn regression_cache_with_a_moved_tensor_offset_is_rejected() {
    let original = original_cache();
    let hlen = u32::from_le_bytes(original[12..16].try_into().unwrap()) as usize;
    let mut h: cache::Header = serde_json::from_slice(&original[16..16 + hlen]).unwrap();
    h.tensors[1].offset = 0;
    let json = serde_json::to_vec(&h).unwrap();
    let mut bytes = [&original[..12], &(json.len() as u32).to_le_bytes(), &json].concat();
    bytes.resize((16 + json.len()).div_ceil(4096) * 4096, 0);
    bytes.extend_from_slice(&original[(16 + hlen).div_ceil(4096) * 4096..]);
    let d = common::scratch_dir();
    let path = d.path().join("c");
    std::fs::write(&path, &bytes).unwrap();
    let reason = cache::open(&path, "fuzz", IDENTITY, &small_config())
        .unwrap()
        .expect_err("an edited tensor table must be rejected");
    assert!(reason.contains("checksum"), "{reason}");
}

/// Found by `cache_file_mutations_are_never_accepted`: one flipped bit in the zero padding
/// between header and payload went unnoticed. Padding must now be zero.
#[test]
fn regression_cache_with_a_flipped_padding_bit_is_rejected() {
    let mut bytes = original_cache().clone();
    let hlen = u32::from_le_bytes(bytes[12..16].try_into().unwrap()) as usize;
    assert!(16 + hlen < 765 && 765 < 4096, "byte 765 is padding");
    bytes[765] ^= 1;
    let d = common::scratch_dir();
    let path = d.path().join("c");
    std::fs::write(&path, &bytes).unwrap();
    let reason = cache::open(&path, "fuzz", IDENTITY, &small_config())
        .unwrap()
        .expect_err("a flipped padding bit must be rejected");
    assert!(reason.contains("non-zero"), "{reason}");
}

/// A header key renamed by a bit flip (`attention_bias` to `attention_bibs`) parses to the same
/// config, because the field has a default: rejected as not written by `cache::write`.
#[test]
fn regression_cache_with_a_renamed_defaulted_key_is_rejected() {
    let mut bytes = original_cache().clone();
    let at = bytes
        .windows(14)
        .position(|w| w == b"attention_bias")
        .expect("the key is in the header")
        + 12;
    bytes[at] ^= b'a' ^ b'b';
    let d = common::scratch_dir();
    let path = d.path().join("c");
    std::fs::write(&path, &bytes).unwrap();
    let reason = cache::open(&path, "fuzz", IDENTITY, &small_config())
        .unwrap()
        .expect_err("an edited header must be rejected");
    assert!(reason.contains("not as written"), "{reason}");
}
