//! The tables of the in-kernel tokenizer: a Qwen2/Qwen3-style byte-level BPE tokenizer
//! (NFC normaliser, the Qwen split regex then ByteLevel, a BPE model, added tokens; read from its
//! `tokenizer.json` by [`crate::hf::tok_source`]) turned into one array of `u32` words that is copied into the BPF arena as it is. `src/bpf/tokenize.inc.c`
//! and its Rust twin ([`super::tok_twin`]) read exactly these words.
//!
//! Layout (every offset in the header counts `u32` words from the start of the array):
//!
//! | header field | shape | what |
//! |---|---|---|
//! | `stage1` | `u32 [0x1100]` | block number of each 256 code points |
//! | `stage2` | `u32 [blocks][256]` | record of a code point: `class \| SECOND \| ccc << 8 \| decomp << 16` |
//! | `decomp` | `u32 [..]` | at a record's `decomp` (0: none): `len`, then `len` words `cp \| W_SECOND \| ccc << 24` |
//! | `comp` | `u32 [comp_mask + 1][4]` | NFC pairs: `a, b, composite, 0` (a = 0: empty slot) |
//! | `merge` | `u32 [merge_mask + 1][4]` | BPE merges: `left + 1, right, rank, merged id` (0: empty) |
//! | `byte_id` | `u32 [256]` | the id of each byte alone ([`NONE`]: not in the vocabulary) |
//! | `added` | `u32 [n_added][4]` | added tokens sorted by first byte: `pool offset, len, id, 0` |
//! | `added_first` | `u32 [256]` | `first index \| count << 16` of the added tokens starting with a byte |
//! | `pool` | `u8 [..]` | the added tokens' text |
//!
//! The character classes are those of the pre-tokenizer's regex (`\p{L}`, `\p{N}`, `\s`, and
//! `\r`/`\n`), computed with the regex engine `tokenizers` itself uses, so that they follow its
//! Unicode version; the NFC data (canonical decompositions, combining classes, the primary
//! composites) come from `unicode-normalization-alignments`, the crate whose NFC `tokenizers`
//! runs (Unicode 9). Hangul syllables are decomposed and composed arithmetically, not by table.

use std::collections::HashMap;

use unicode_normalization_alignments::char as uchar;

use crate::hf::tok_source::BpeSource;
use crate::hf::tokenizer::Tokenizer;
use crate::num::limits::{TOK_ADDED_LEN, TOK_ADDED_MAX};
use crate::{Error, Result};

/// `TOK_MAGIC`: the first header word.
pub const MAGIC: u32 = 0x4b4f_5451; // "QTOK"
/// No id / no entry (`TOK_NONE`).
pub const NONE: u32 = u32::MAX;
/// Character classes of the pre-tokenizer (`TOK_C_*`): other, letter, number, whitespace other
/// than CR/LF, CR or LF.
pub const C_OTHER: u32 = 0;
/// `\p{L}`.
pub const C_LETTER: u32 = 1;
/// `\p{N}`.
pub const C_NUMBER: u32 = 2;
/// `\s` except `\r` and `\n`.
pub const C_SPACE: u32 = 3;
/// `\r` or `\n`.
pub const C_NEWLINE: u32 = 4;
/// Record bit: the code point is the second of some composition (an NFC pair or a Hangul
/// vowel or trailing consonant), so that composition looks pairs up only for these.
pub const SECOND: u32 = 1 << 7;
/// [`SECOND`] in a code-point word of the NFC stages (`cp | W_SECOND | ccc << 24`).
pub const W_SECOND: u32 = 1 << 23;
/// Code points per stage-1 entry.
pub const BLOCK: usize = 256;
/// Stage-1 entries (0x110000 / 256).
pub const STAGE1: usize = 0x110000 / BLOCK;

/// Header words, in order (`struct tok_header` in tokenize.inc.c).
pub mod h {
    /// [`super::MAGIC`].
    pub const MAGIC: usize = 0;
    /// Offset of `stage1`.
    pub const STAGE1: usize = 1;
    /// Offset of `stage2`.
    pub const STAGE2: usize = 2;
    /// Offset of `decomp`.
    pub const DECOMP: usize = 3;
    /// Offset of `comp`.
    pub const COMP: usize = 4;
    /// Slots of `comp` minus one (a power of two minus one).
    pub const COMP_MASK: usize = 5;
    /// Offset of `merge`.
    pub const MERGE: usize = 6;
    /// Slots of `merge` minus one.
    pub const MERGE_MASK: usize = 7;
    /// Offset of `byte_id`.
    pub const BYTE_ID: usize = 8;
    /// Offset of `added`.
    pub const ADDED: usize = 9;
    /// Number of added tokens.
    pub const N_ADDED: usize = 10;
    /// Offset of `added_first`.
    pub const ADDED_FIRST: usize = 11;
    /// Offset of `pool`.
    pub const POOL: usize = 12;
    /// Words in all.
    pub const WORDS: usize = 13;
    /// Header words (rounded up to 16).
    pub const LEN: usize = 16;
}

/// The hash of a pair of u32 keys (NFC pairs and BPE merges), the same in C (`tok_hash`).
pub fn hash(a: u32, b: u32) -> u32 {
    let h = a.wrapping_mul(0x9E37_79B1) ^ b.wrapping_mul(0x85EB_CA6B);
    h ^ (h >> 15)
}

/// The tables of one tokenizer, ready to copy into the arena.
#[derive(Debug, Clone)]
pub struct TokTables {
    /// The header and every table (see the module's documentation).
    pub words: Vec<u32>,
}

impl TokTables {
    /// The header word `field` (one of [`h`]).
    pub fn header(&self, field: usize) -> u32 {
        self.words[field]
    }

    /// Builds the tables of `tok`, refusing (with [`Error::Tokenizer`]) a tokenizer whose
    /// normaliser, pre-tokenizer, model or added tokens are of another kind than Qwen3's (the
    /// `tokenizer.json` is read by [`BpeSource::of`]; this takes its bytes and ids).
    pub fn build(tok: &Tokenizer) -> Result<TokTables> {
        let refuse = |msg: String| Error::Tokenizer {
            path: tok.path().to_path_buf(),
            msg: format!("the in-kernel tokenizer cannot run it: {msg}"),
        };
        let BpeSource {
            vocab,
            merges,
            added,
        } = BpeSource::of(tok)?;
        if added.len() > TOK_ADDED_MAX {
            return Err(refuse(format!(
                "{} added tokens; the kernel takes at most {TOK_ADDED_MAX}",
                added.len()
            )));
        }
        if let Some((t, _)) = added.iter().find(|(t, _)| t.len() > TOK_ADDED_LEN) {
            return Err(refuse(format!(
                "added token {:?} has {} bytes (at most {TOK_ADDED_LEN})",
                String::from_utf8_lossy(t),
                t.len()
            )));
        }

        let mut w = vec![0u32; h::LEN];
        w[h::MAGIC] = MAGIC;
        let pairs = compositions();
        let (stage1, stage2, decomp) = code_points(&pairs).map_err(refuse)?;
        w[h::STAGE1] = push(&mut w, &stage1);
        w[h::STAGE2] = push(&mut w, &stage2);
        w[h::DECOMP] = push(&mut w, &decomp);
        let (comp, mask) = hash_table(&pairs, |&(a, b, c)| [a, b, c, 0]);
        w[h::COMP_MASK] = mask;
        w[h::COMP] = push(&mut w, &comp);
        let (table, mask) = hash_table(&merges, |&(l, r, rank, id)| [l + 1, r, rank, id]);
        w[h::MERGE_MASK] = mask;
        w[h::MERGE] = push(&mut w, &table);
        let byte_id: Vec<u32> = (0..=255u8)
            .map(|b| vocab.get(&[b][..]).copied().unwrap_or(NONE))
            .collect();
        w[h::BYTE_ID] = push(&mut w, &byte_id);
        // added tokens by first byte, their text in the pool
        let mut sorted = added;
        sorted.sort_by_key(|(text, _)| text[0]);
        let (mut entries, mut pool, mut first) = (Vec::new(), Vec::<u8>::new(), vec![0u32; 256]);
        for (i, (text, id)) in sorted.iter().enumerate() {
            let f = &mut first[text[0] as usize];
            if *f >> 16 == 0 {
                *f = i as u32;
            }
            *f += 1 << 16;
            entries.extend_from_slice(&[pool.len() as u32, text.len() as u32, *id, 0]);
            pool.extend_from_slice(text);
        }
        w[h::N_ADDED] = sorted.len() as u32;
        w[h::ADDED] = push(&mut w, &entries);
        w[h::ADDED_FIRST] = push(&mut w, &first);
        pool.resize(pool.len().div_ceil(4) * 4, 0);
        let pool: Vec<u32> = pool
            .chunks(4)
            .map(|c| u32::from_ne_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        w[h::POOL] = push(&mut w, &pool);
        w[h::WORDS] = w.len() as u32;
        Ok(TokTables { words: w })
    }
}

/// Appends `data` to `w`; returns its offset.
fn push(w: &mut Vec<u32>, data: &[u32]) -> u32 {
    let off = w.len() as u32;
    w.extend_from_slice(data);
    off
}

/// An open-addressing table of 4-word entries keyed by their first two words (a power of two of
/// slots, at least twice the entries; linear probing; a later entry with the same key replaces
/// an earlier one, as a Rust `HashMap` collected from the list would). Returns the slots and the
/// mask.
fn hash_table<T>(items: &[T], entry: impl Fn(&T) -> [u32; 4]) -> (Vec<u32>, u32) {
    let slots = (items.len() * 2).next_power_of_two().max(16);
    let mask = slots as u32 - 1;
    let mut t = vec![0u32; slots * 4];
    for it in items {
        let e = entry(it);
        let mut i = hash(e[0], e[1]) & mask;
        while t[i as usize * 4] != 0 && (t[i as usize * 4], t[i as usize * 4 + 1]) != (e[0], e[1])
        {
            i = (i + 1) & mask;
        }
        t[i as usize * 4..i as usize * 4 + 4].copy_from_slice(&e);
    }
    (t, mask)
}

/// The per-code-point records (two-stage table) and the decomposition list.
#[allow(clippy::type_complexity)]
fn code_points(
    pairs: &[(u32, u32, u32)],
) -> std::result::Result<(Vec<u32>, Vec<u32>, Vec<u32>), String> {
    let class = regex_classes()?;
    let mut second = vec![false; 0x110000];
    for &(_, b, _) in pairs {
        second[b as usize] = true;
    }
    // Hangul vowels (L + V) and trailing consonants (LV + T)
    for b in (0x1161..0x1161 + 21).chain(0x11a8..0x11a7 + 28) {
        second[b] = true;
    }
    let flag = |cp: u32| if second[cp as usize] { SECOND } else { 0 };
    let word = |cp: u32| cp | ccc(cp) << 24 | if second[cp as usize] { W_SECOND } else { 0 };
    let mut decomp = vec![0u32]; // offset 0: no decomposition
    let mut stage1 = vec![0u32; STAGE1];
    let mut stage2: Vec<u32> = Vec::new();
    let mut blocks: HashMap<Vec<u32>, u32> = HashMap::new();
    for (blk, slot) in stage1.iter_mut().enumerate() {
        let mut recs = vec![0u32; BLOCK];
        for (i, rec) in recs.iter_mut().enumerate() {
            let cp = (blk * BLOCK + i) as u32;
            let Some(c) = char::from_u32(cp) else {
                continue;
            };
            let mut d = Vec::new();
            if !is_hangul(cp) {
                uchar::decompose_canonical(c, |x| d.push(x as u32));
            }
            let mut off = 0;
            if d != [cp] && !d.is_empty() {
                off = decomp.len() as u32;
                decomp.push(d.len() as u32);
                decomp.extend(d.iter().map(|&x| word(x)));
            }
            if off > 0xffff {
                return Err("the decomposition table outgrew 16 bits".into());
            }
            *rec = class[cp as usize] as u32 | flag(cp) | ccc(cp) << 8 | off << 16;
        }
        let next = blocks.len() as u32;
        let b = *blocks.entry(recs.clone()).or_insert_with(|| {
            stage2.extend_from_slice(&recs);
            next
        });
        *slot = b;
    }
    Ok((stage1, stage2, decomp))
}

fn ccc(cp: u32) -> u32 {
    char::from_u32(cp).map_or(0, |c| uchar::canonical_combining_class(c) as u32)
}

fn is_hangul(cp: u32) -> bool {
    (0xAC00..0xAC00 + 11172).contains(&cp)
}

/// Every primary composite as (first, second, composite): the pairs `compose` accepts among
/// the splits of each canonical decomposition (Hangul excepted: arithmetic).
fn compositions() -> Vec<(u32, u32, u32)> {
    let full = |c: char| {
        let mut d = Vec::new();
        uchar::decompose_canonical(c, |x| d.push(x));
        d
    };
    // full decomposition → the char that has it (for the first part of a pair)
    // (several chars share one: U+00C5 and U+212B both decompose to A + ring)
    let mut by_decomp: HashMap<Vec<char>, Vec<char>> = HashMap::new();
    let chars: Vec<char> = (0..0x110000u32)
        .filter(|&c| !is_hangul(c))
        .filter_map(char::from_u32)
        .collect();
    for &c in &chars {
        by_decomp.entry(full(c)).or_default().push(c);
    }
    let mut out = Vec::new();
    for &c in &chars {
        let d = full(c);
        for k in 1..d.len() {
            let none = Vec::new();
            let (firsts, seconds) = (
                by_decomp.get(&d[..k]).unwrap_or(&none),
                by_decomp.get(&d[k..]).unwrap_or(&none),
            );
            for &a in firsts {
                for &b in seconds {
                    if uchar::compose(a, b) == Some(c) {
                        out.push((a as u32, b as u32, c as u32));
                    }
                }
            }
        }
    }
    out.sort_unstable();
    out.dedup();
    out
}

/// The class of every code point, by the regex engine the `tokenizers` crate runs its
/// pre-tokenizer with (so that `\p{L}`, `\p{N}` and `\s` follow its Unicode tables).
fn regex_classes() -> std::result::Result<Vec<u8>, String> {
    let all: String = (0..0x110000u32).filter_map(char::from_u32).collect();
    let mut class = vec![C_OTHER as u8; 0x110000];
    for (pat, cl) in [
        (r"\p{L}+", C_LETTER),
        (r"\p{N}+", C_NUMBER),
        (r"\s+", C_SPACE),
    ] {
        let re = tokenizers::utils::SysRegex::new(pat).map_err(|e| e.to_string())?;
        for (s, e) in re.find_iter(&all) {
            for c in all[s..e].chars() {
                class[c as usize] = cl as u8;
            }
        }
    }
    class['\r' as usize] = C_NEWLINE as u8;
    class['\n' as usize] = C_NEWLINE as u8;
    Ok(class)
}
