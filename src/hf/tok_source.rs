//! The parts of a Qwen2/Qwen3-style byte-level BPE `tokenizer.json` that the in-kernel
//! tokenizer's tables are built from ([`crate::num::tok_tables`]): the vocabulary and merges as
//! bytes and ids, the added tokens. Reading the JSON happens here, so that `num/` stays pure
//! integer work; a tokenizer of another kind than Qwen3's is refused with its reason.

use std::collections::HashMap;

use serde_json::Value;

use super::tokenizer::Tokenizer;
use crate::{Error, Result};

/// The pre-tokenizer regex of Qwen2 and Qwen3, the only one the kernel's state machine follows.
pub const QWEN_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// A byte-level BPE tokenizer as bytes and ids.
#[derive(Debug, Clone)]
pub struct BpeSource {
    /// Token bytes → id (tokens outside the byte-level alphabet left out: no merge reaches them).
    pub vocab: HashMap<Vec<u8>, u32>,
    /// `(left id, right id, rank, merged id)`, in rank order.
    pub merges: Vec<(u32, u32, u32, u32)>,
    /// The added tokens as (text, id).
    pub added: Vec<(Vec<u8>, u32)>,
}

impl BpeSource {
    /// The parts of `tok`, refusing (with [`Error::Tokenizer`]) a tokenizer whose normaliser,
    /// pre-tokenizer, model or added tokens are of another kind than Qwen3's.
    pub fn of(tok: &Tokenizer) -> Result<BpeSource> {
        let refuse = |msg: String| Error::Tokenizer {
            path: tok.path().to_path_buf(),
            msg: format!("the in-kernel tokenizer cannot run it: {msg}"),
        };
        let json = serde_json::to_value(tok.inner()).map_err(|e| refuse(e.to_string()))?;
        check_kind(&json).map_err(refuse)?;
        let model = &json["model"];
        let vocab = vocabulary(&model["vocab"]).map_err(refuse)?;
        let merges = merges(&model["merges"], &vocab).map_err(refuse)?;
        let added = added_tokens(&json["added_tokens"]).map_err(refuse)?;
        Ok(BpeSource {
            vocab,
            merges,
            added,
        })
    }
}

/// Refuses any tokenizer whose pipeline is not NFC → Qwen split (Isolated) + ByteLevel → BPE.
fn check_kind(j: &Value) -> std::result::Result<(), String> {
    let ty = |v: &Value| v["type"].as_str().unwrap_or("none").to_string();
    if ty(&j["normalizer"]) != "NFC" {
        return Err(format!("its normalizer is {}, not NFC", j["normalizer"]));
    }
    let pre = &j["pre_tokenizer"];
    let seq = pre["pretokenizers"].as_array();
    let ok = ty(pre) == "Sequence"
        && seq.is_some_and(|s| {
            s.len() == 2
                && ty(&s[0]) == "Split"
                && s[0]["pattern"]["Regex"].as_str() == Some(QWEN_SPLIT)
                && s[0]["behavior"] == "Isolated"
                && s[0]["invert"] == false
                && ty(&s[1]) == "ByteLevel"
                && s[1]["add_prefix_space"] == false
                && s[1]["use_regex"] == false
        });
    if !ok {
        return Err(format!(
            "its pre-tokenizer is not Qwen's Split(regex, Isolated) + ByteLevel(no prefix space, no regex): {pre}"
        ));
    }
    let m = &j["model"];
    let empty = |v: &Value| v.is_null() || v == "";
    if ty(m) != "BPE"
        || !m["dropout"].is_null()
        || !m["unk_token"].is_null()
        || !empty(&m["continuing_subword_prefix"])
        || !empty(&m["end_of_word_suffix"])
        || m["byte_fallback"] == true
        || m["ignore_merges"] == true
    {
        return Err(format!(
            "its model is not a byte-level BPE without dropout, unk token, subword affixes, byte fallback or ignore_merges (type {})",
            ty(m)
        ));
    }
    if !j["truncation"].is_null() || !j["padding"].is_null() {
        return Err("it truncates or pads".into());
    }
    Ok(())
}

/// The GPT-2 byte-level alphabet: the char that stands for each byte in the vocabulary.
fn byte_chars() -> [char; 256] {
    let mut map = ['\0'; 256];
    let mut n = 0;
    for b in 0..256u32 {
        let printable = (0x21..=0x7e).contains(&b) || (0xa1..=0xac).contains(&b) || b >= 0xae;
        map[b as usize] = if printable {
            char::from_u32(b).unwrap()
        } else {
            n += 1;
            char::from_u32(255 + n).unwrap()
        };
    }
    map
}

/// The byte each char of the byte-level alphabet stands for (the inverse of [`byte_chars`]).
fn byte_values() -> HashMap<char, u8> {
    byte_chars()
        .iter()
        .enumerate()
        .map(|(b, &c)| (c, b as u8))
        .collect()
}

/// A byte-level token string as the bytes it stands for (`None`: a char outside the alphabet).
fn token_bytes(s: &str, rev: &HashMap<char, u8>) -> Option<Vec<u8>> {
    s.chars().map(|c| rev.get(&c).copied()).collect()
}

/// The vocabulary: bytes → id. Tokens outside the byte-level alphabet are never produced by
/// the BPE (no merge chain reaches them), so they are left out.
fn vocabulary(v: &Value) -> std::result::Result<HashMap<Vec<u8>, u32>, String> {
    let rev = byte_values();
    let obj = v.as_object().ok_or("the model has no vocab object")?;
    let mut out = HashMap::with_capacity(obj.len());
    for (tok, id) in obj {
        let id = id.as_u64().ok_or("a vocab id is not a number")? as u32;
        if let Some(b) = token_bytes(tok, &rev) {
            out.insert(b, id);
        }
    }
    Ok(out)
}

/// The merges as `(left id, right id, rank, merged id)`, in rank order.
fn merges(
    v: &Value,
    vocab: &HashMap<Vec<u8>, u32>,
) -> std::result::Result<Vec<(u32, u32, u32, u32)>, String> {
    let rev = byte_values();
    let list = v.as_array().ok_or("the model has no merges list")?;
    let mut out = Vec::with_capacity(list.len());
    for (rank, m) in list.iter().enumerate() {
        // ["a", "b"] or the older "a b"
        let (a, b) = match m {
            Value::Array(p) if p.len() == 2 => (
                p[0].as_str().unwrap_or_default().to_string(),
                p[1].as_str().unwrap_or_default().to_string(),
            ),
            Value::String(s) => match s.split_once(' ') {
                Some((a, b)) => (a.to_string(), b.to_string()),
                None => return Err(format!("merge {rank} is not a pair: {s}")),
            },
            _ => return Err(format!("merge {rank} is not a pair: {m}")),
        };
        let bytes = |s: &str| {
            token_bytes(s, &rev).ok_or(format!("merge {rank} has a non-byte-level token {s:?}"))
        };
        let (a, b) = (bytes(&a)?, bytes(&b)?);
        let id = |t: &[u8]| {
            vocab
                .get(t)
                .copied()
                .ok_or(format!("merge {rank}: a token is not in the vocabulary"))
        };
        let merged = [a.as_slice(), b.as_slice()].concat();
        out.push((id(&a)?, id(&b)?, rank as u32, id(&merged)?));
    }
    Ok(out)
}

/// The added tokens as (text, id); refuses those the kernel does not match as Qwen's are
/// matched (normalized, single_word, lstrip, rstrip), empty ones and repeated ones (the kernel's
/// limits on their number and length are checked by [`crate::num::tok_tables`]).
fn added_tokens(v: &Value) -> std::result::Result<Vec<(Vec<u8>, u32)>, String> {
    let list = v.as_array().map(Vec::as_slice).unwrap_or_default();
    let mut out: Vec<(Vec<u8>, u32)> = Vec::new();
    for t in list {
        let text = t["content"].as_str().unwrap_or_default().as_bytes().to_vec();
        let flags = ["normalized", "single_word", "lstrip", "rstrip"];
        if let Some(f) = flags.iter().find(|f| t[**f] == true) {
            return Err(format!("added token {t} has {f} set"));
        }
        if text.is_empty() {
            return Err(format!("added token {t} is empty"));
        }
        if out.iter().any(|(o, _)| *o == text) {
            return Err(format!("added token {t} appears twice"));
        }
        let id = t["id"].as_u64().ok_or("an added token has no id")? as u32;
        out.push((text, id));
    }
    Ok(out)
}
