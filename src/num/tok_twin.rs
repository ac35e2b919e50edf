//! The Rust twin of the in-kernel tokenizer (`src/bpf/tokenize.inc.c`): the same stages over the
//! same table words ([`super::tok_tables`]) and the same integers, step for step, so that a test
//! can hold the kernel, this twin and the `tokenizers` crate equal on every string.
//!
//! Stages of [`tokenize`]: (1) added tokens are matched in the raw text, leftmost-longest; each
//! stretch between them is (2) decoded from UTF-8 and canonically decomposed into code points
//! (Hangul arithmetically), (3) reordered by combining class (a stable insertion sort within each
//! run of non-starters), (4) composed, (5) split into pieces by a state machine equal to Qwen's
//! split regex, and (6) each piece's UTF-8 bytes are merged by byte-level BPE: repeatedly the
//! adjacent pair of lowest merge rank, the leftmost on ties (done in rounds: each merges the
//! pairs of the lowest rank left to right until a merge makes a pair of lower rank).

use super::limits::{TOK_CP_MAX, TOK_IDS_MAX, TOK_MARKS_MAX, TOK_TEXT_MAX, TOK_WORD_MAX};
use super::tok_tables::{
    h, hash, C_LETTER, C_NEWLINE, C_NUMBER, C_OTHER, C_SPACE, MAGIC, NONE, SECOND, W_SECOND,
};

/// Error codes of `tokenize` (`TOK_E_*`), negative like the kernel's returns.
pub mod err {
    /// The text is longer than `TOK_TEXT_MAX` bytes.
    pub const TEXT: i32 = -1;
    /// More ids than `max_out` (or `max_out` above `TOK_IDS_MAX`).
    pub const IDS: i32 = -2;
    /// The text is not valid UTF-8.
    pub const UTF8: i32 = -3;
    /// A segment decomposes into more than `TOK_CP_MAX` code points.
    pub const CPS: i32 = -4;
    /// A pre-tokenized piece is longer than `TOK_WORD_MAX` bytes.
    pub const WORD: i32 = -5;
    /// More than `TOK_MARKS_MAX` non-starters in a row.
    pub const MARKS: i32 = -6;
    /// The tables are not tokenizer tables (bad magic).
    pub const TABLES: i32 = -7;
    /// A kernel loop reached its bound with work left (kernel only; never expected).
    pub const BUDGET: i32 = -8;
}

const S_BASE: u32 = 0xAC00;
const L_BASE: u32 = 0x1100;
const V_BASE: u32 = 0x1161;
const T_BASE: u32 = 0x11A7;
const L_COUNT: u32 = 19;
const V_COUNT: u32 = 21;
const T_COUNT: u32 = 28;
const N_COUNT: u32 = V_COUNT * T_COUNT;
const S_COUNT: u32 = L_COUNT * N_COUNT;
const CP_MASK: u32 = 0x1f_ffff;

/// The tokenizer over the table words `w`.
struct Tok<'a> {
    w: &'a [u32],
}

impl Tok<'_> {
    fn at(&self, field: usize) -> usize {
        self.w[field] as usize
    }

    /// A code point's record: `class | ccc << 8 | decomp << 16`.
    fn record(&self, cp: u32) -> u32 {
        let blk = self.w[self.at(h::STAGE1) + (cp >> 8) as usize];
        self.w[self.at(h::STAGE2) + blk as usize * 256 + (cp & 255) as usize]
    }

    /// The primary composite of `a` and `b`, or 0.
    fn compose(&self, a: u32, b: u32) -> u32 {
        if (L_BASE..L_BASE + L_COUNT).contains(&a) && (V_BASE..V_BASE + V_COUNT).contains(&b) {
            return S_BASE + ((a - L_BASE) * V_COUNT + (b - V_BASE)) * T_COUNT;
        }
        if (S_BASE..S_BASE + S_COUNT).contains(&a)
            && (a - S_BASE) % T_COUNT == 0
            && b > T_BASE
            && b < T_BASE + T_COUNT
        {
            return a + (b - T_BASE);
        }
        let (t, mask) = (self.at(h::COMP), self.w[h::COMP_MASK]);
        let mut i = hash(a, b) & mask;
        for _ in 0..=mask {
            let e = t + i as usize * 4;
            if self.w[e] == 0 {
                return 0;
            }
            if self.w[e] == a && self.w[e + 1] == b {
                return self.w[e + 2];
            }
            i = (i + 1) & mask;
        }
        0
    }

    /// The merge of ids (l, r): (rank, merged id), rank [`NONE`] if none.
    fn merge(&self, l: u32, r: u32) -> (u32, u32) {
        let (t, mask) = (self.at(h::MERGE), self.w[h::MERGE_MASK]);
        let mut i = hash(l + 1, r) & mask;
        for _ in 0..=mask {
            let e = t + i as usize * 4;
            if self.w[e] == 0 {
                break;
            }
            if self.w[e] == l + 1 && self.w[e + 1] == r {
                return (self.w[e + 2], self.w[e + 3]);
            }
            i = (i + 1) & mask;
        }
        (NONE, 0)
    }

    /// Byte `i` of the added tokens' pool.
    fn pool(&self, i: usize) -> u8 {
        self.w[self.at(h::POOL) + i / 4].to_ne_bytes()[i % 4]
    }

    /// The leftmost-longest added token at or after `pos`: (start, index), or (len, NONE).
    fn added_find(&self, t: &[u8], pos: usize) -> (usize, u32) {
        let (first, added) = (self.at(h::ADDED_FIRST), self.at(h::ADDED));
        for p in pos..t.len() {
            let f = self.w[first + t[p] as usize];
            let mut best = (0, NONE);
            for k in (f & 0xffff)..(f & 0xffff) + (f >> 16) {
                let e = added + k as usize * 4;
                let (off, len) = (self.w[e] as usize, self.w[e + 1] as usize);
                if len > best.0
                    && p + len <= t.len()
                    && (0..len).all(|j| t[p + j] == self.pool(off + j))
                {
                    best = (len, k);
                }
            }
            if best.1 != NONE {
                return (p, best.1);
            }
        }
        (t.len(), NONE)
    }

    /// Stages 2-4: the NFC code points of `t`, each `cp | class << 24`.
    fn nfc(&self, t: &[u8]) -> Result<Vec<u32>, i32> {
        let mut cps: Vec<u32> = Vec::new();
        let push = |x: u32, cps: &mut Vec<u32>| {
            if cps.len() >= TOK_CP_MAX {
                return Err(err::CPS);
            }
            cps.push(x);
            Ok(())
        };
        // decode and decompose: words cp | W_SECOND | ccc << 24
        let mut p = 0;
        while p < t.len() {
            let (cp, n) = decode(&t[p..]).ok_or(err::UTF8)?;
            p += n;
            if (S_BASE..S_BASE + S_COUNT).contains(&cp) {
                let s = cp - S_BASE;
                push(L_BASE + s / N_COUNT, &mut cps)?;
                push((V_BASE + (s % N_COUNT) / T_COUNT) | W_SECOND, &mut cps)?;
                if s % T_COUNT != 0 {
                    push((T_BASE + s % T_COUNT) | W_SECOND, &mut cps)?;
                }
                continue;
            }
            let rec = self.record(cp);
            let d = (rec >> 16) as usize;
            if d == 0 {
                let second = if rec & SECOND != 0 { W_SECOND } else { 0 };
                push(cp | second | (rec >> 8 & 0xff) << 24, &mut cps)?;
            } else {
                let base = self.at(h::DECOMP) + d;
                for k in 0..self.w[base] as usize {
                    push(self.w[base + 1 + k], &mut cps)?;
                }
            }
        }
        // canonical order: stable insertion sort of each run of non-starters by class
        let mut run = 0;
        for i in 0..cps.len() {
            let (x, c) = (cps[i], cps[i] >> 24);
            if c == 0 {
                run = 0;
                continue;
            }
            run += 1;
            if run > TOK_MARKS_MAX {
                return Err(err::MARKS);
            }
            let mut j = i;
            while j > 0 && cps[j - 1] >> 24 > c {
                cps[j] = cps[j - 1];
                j -= 1;
            }
            cps[j] = x;
        }
        // compose in place: `starter` the composee's index, `last` the class of the last
        // character kept after it (0x100: none)
        let (mut w, mut starter, mut last) = (0usize, usize::MAX, 0x100u32);
        for r in 0..cps.len() {
            let (x, c) = (cps[r], cps[r] >> 24);
            if starter != usize::MAX && (last == 0x100 || last < c) && x & W_SECOND != 0 {
                let comp = self.compose(cps[starter] & CP_MASK, x & CP_MASK);
                if comp != 0 {
                    cps[starter] = comp;
                    continue;
                }
            }
            if c == 0 {
                starter = w;
                last = 0x100;
            } else if starter != usize::MAX {
                last = c;
            }
            cps[w] = x;
            w += 1;
        }
        cps.truncate(w);
        for x in &mut cps {
            let cp = *x & CP_MASK;
            *x = cp | (self.record(cp) & 0xf) << 24;
        }
        Ok(cps)
    }

    /// Stage 5: the end of the piece that starts at `i` (Qwen's split regex; see tokenize.inc.c).
    fn piece_end(&self, cps: &[u32], i: usize) -> usize {
        let n = cps.len();
        let cp = |k: usize| cps[k] & CP_MASK;
        let cl = |k: usize| cps[k] >> 24;
        let run = |mut k: usize, f: &dyn Fn(u32) -> bool| {
            while k < n && f(cl(k)) {
                k += 1;
            }
            k
        };
        let (c, k) = (cp(i), cl(i));
        // (?i:'s|'t|'re|'ve|'m|'ll|'d)
        if c == '\'' as u32 && i + 1 < n {
            let a = fold(cp(i + 1));
            if matches!(a, 's' | 't' | 'm' | 'd') {
                return i + 2;
            }
            if i + 2 < n && matches!((a, fold(cp(i + 2))), ('r', 'e') | ('v', 'e') | ('l', 'l')) {
                return i + 3;
            }
        }
        // [^\r\n\p{L}\p{N}]?\p{L}+
        if k == C_LETTER {
            return run(i, &|x| x == C_LETTER);
        }
        if (k == C_OTHER || k == C_SPACE) && i + 1 < n && cl(i + 1) == C_LETTER {
            return run(i + 1, &|x| x == C_LETTER);
        }
        // \p{N}
        if k == C_NUMBER {
            return i + 1;
        }
        // ` ?[^\s\p{L}\p{N}]+[\r\n]*`
        if c == ' ' as u32 && i + 1 < n && cl(i + 1) == C_OTHER {
            return run(run(i + 1, &|x| x == C_OTHER), &|x| x == C_NEWLINE);
        }
        if k == C_OTHER {
            return run(run(i, &|x| x == C_OTHER), &|x| x == C_NEWLINE);
        }
        // whitespace: \s*[\r\n]+ ends after the run's last CR/LF; else \s+(?!\S) leaves the
        // run's last character to the next piece unless the text ends; else \s+
        let j = run(i, &|x| x == C_SPACE || x == C_NEWLINE);
        if let Some(m) = (i..j).rev().find(|&m| cl(m) == C_NEWLINE) {
            return m + 1;
        }
        if j == n || j - i < 2 {
            j
        } else {
            j - 1
        }
    }

    /// Stage 6: the BPE ids of the code points `cps`, appended to `out`.
    fn bpe(&self, cps: &[u32], out: &mut Vec<u32>, max_out: usize) -> Result<(), i32> {
        let mut bytes = Vec::new();
        for &x in cps {
            let c = char::from_u32(x & CP_MASK).ok_or(err::UTF8)?;
            bytes.extend_from_slice(c.encode_utf8(&mut [0; 4]).as_bytes());
        }
        if bytes.len() > TOK_WORD_MAX {
            return Err(err::WORD);
        }
        let byte_id = self.at(h::BYTE_ID);
        let mut sym: Vec<u32> = bytes
            .iter()
            .map(|&b| self.w[byte_id + b as usize])
            .filter(|&id| id != NONE)
            .collect();
        let n0 = sym.len();
        let (mut rank, mut merged) = (vec![NONE; n0], vec![0; n0]);
        for k in 0..n0.saturating_sub(1) {
            (rank[k], merged[k]) = self.merge(sym[k], sym[k + 1]);
        }
        // rounds: the lowest rank among the pairs, then one pass merging its pairs left to right
        // until a merge makes a pair of a lower rank (which the next round takes first): the
        // same merges, in the same order, as one merge per round
        let mut n = n0;
        loop {
            let best = rank[..n.saturating_sub(1)].iter().copied().min().unwrap_or(NONE);
            if best == NONE {
                break;
            }
            let (mut w, mut k, mut stop) = (0, 0, false);
            while k < n {
                if !stop && k + 1 < n && rank[k] == best {
                    sym[w] = merged[k];
                    if w > 0 {
                        (rank[w - 1], merged[w - 1]) = self.merge(sym[w - 1], sym[w]);
                        stop |= rank[w - 1] < best;
                    }
                    rank[w] = NONE;
                    if k + 2 < n {
                        (rank[w], merged[w]) = self.merge(sym[w], sym[k + 2]);
                        stop |= rank[w] < best;
                    }
                    k += 2;
                } else {
                    (sym[w], rank[w], merged[w]) = (sym[k], rank[k], merged[k]);
                    k += 1;
                }
                w += 1;
            }
            n = w;
        }
        if out.len() + n > max_out {
            return Err(err::IDS);
        }
        out.extend_from_slice(&sym[..n]);
        Ok(())
    }
}

/// The ASCII letter a code point matches case-insensitively in the contractions (`ſ` is `s`
/// under the regex engine's case folding); other code points give `'\0'`.
fn fold(cp: u32) -> char {
    match cp {
        0x41..=0x5a => char::from_u32(cp + 32).unwrap(),
        0x61..=0x7a => char::from_u32(cp).unwrap(),
        0x17f => 's',
        _ => '\0',
    }
}

/// The code point at the start of `t` and its length in bytes, `None` if not valid UTF-8.
fn decode(t: &[u8]) -> Option<(u32, usize)> {
    let b0 = t[0] as u32;
    let (n, min, init) = match b0 {
        0x00..=0x7f => return Some((b0, 1)),
        0xc0..=0xdf => (2, 0x80, b0 & 0x1f),
        0xe0..=0xef => (3, 0x800, b0 & 0x0f),
        0xf0..=0xf7 => (4, 0x10000, b0 & 0x07),
        _ => return None,
    };
    if t.len() < n {
        return None;
    }
    let mut cp = init;
    for &b in &t[1..n] {
        if b & 0xc0 != 0x80 {
            return None;
        }
        cp = cp << 6 | (b & 0x3f) as u32;
    }
    if cp < min || cp > 0x10ffff || (0xd800..0xe000).contains(&cp) {
        return None;
    }
    Some((cp, n))
}

/// The ids of `text` by the tables `w`, at most `max_out` of them, or a negative [`err`] code:
/// what the kernel's `tokenize` returns.
pub fn tokenize(w: &[u32], text: &[u8], max_out: usize) -> Result<Vec<u32>, i32> {
    if w.len() < h::LEN || w[h::MAGIC] != MAGIC {
        return Err(err::TABLES);
    }
    if text.len() > TOK_TEXT_MAX {
        return Err(err::TEXT);
    }
    if max_out > TOK_IDS_MAX {
        return Err(err::IDS);
    }
    let tok = Tok { w };
    let mut out = Vec::new();
    let mut pos = 0;
    while pos < text.len() {
        let (m, k) = tok.added_find(text, pos);
        if m > pos {
            let cps = tok.nfc(&text[pos..m])?;
            let mut i = 0;
            while i < cps.len() {
                let e = tok.piece_end(&cps, i);
                tok.bpe(&cps[i..e], &mut out, max_out)?;
                i = e;
            }
        }
        if k == NONE {
            break;
        }
        if out.len() >= max_out {
            return Err(err::IDS);
        }
        let e = tok.at(h::ADDED) + k as usize * 4;
        out.push(w[e + 2]);
        pos = m + w[e + 1] as usize;
    }
    Ok(out)
}
