//! A deterministic corpus for the in-kernel tokenizer (tests/tokenize_kernel.rs and
//! benches/tokenize.rs): every code point in chunks, emoji and ZWJ sequences, combining marks in
//! NFC and NFD order, whitespace runs, digits, contractions in any case, source code, 4 KiB
//! words, and text with added tokens (whole and partial).

/// A small xorshift generator: the same corpus on every run.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed | 1)
    }
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    pub fn pick<T: Copy>(&mut self, xs: &[T]) -> T {
        xs[self.below(xs.len())]
    }
}

const SPACES: &[&str] = &[
    " ", "  ", "\t", "\n", "\r", "\r\n", "\x0b", "\x0c", "\u{a0}", "\u{2028}", "\u{2029}",
    "\u{3000}", "\u{85}", "\u{2009}", "\u{200b}", "\u{feff}", "\u{1680}", " \n ", "\n\n", "\t\t ",
];
const WORDS: &[&str] = &[
    "hello",
    "World",
    "the",
    "ÉCOLE",
    "naïve",
    "Straße",
    "東京",
    "русский",
    "ελληνικά",
    "עברית",
    "العربية",
    "हिन्दी",
    "ไทย",
    "한국어",
    "日本語",
    "tokenizer",
    "BPF",
    "x",
    "I",
    "a",
    "über",
    "ǅemal",
    "ﬁne",
    "Ⅻ",
    "x²",
    "½",
    "٣٤٥",
    "１２３",
    "¡Hola!",
    "¿qué?",
    "—",
    "…",
    "$5",
    "100%",
    "e-mail",
    "C++",
    "don",
    "we",
    "they",
    "ſ",
    "İstanbul",
    "ß",
    "ǰ",
    "ﬀ",
];
const MARKS: &[char] = &[
    '\u{300}', '\u{301}', '\u{302}', '\u{303}', '\u{308}', '\u{30a}', '\u{323}', '\u{327}',
    '\u{328}', '\u{331}', '\u{345}', '\u{313}', '\u{314}', '\u{342}', '\u{1ab0}', '\u{20d7}',
    '\u{93c}', '\u{94d}', '\u{5b4}', '\u{651}', '\u{3099}', '\u{309a}', '\u{e48}', '\u{302a}',
];
const EMOJI: &[&str] = &[
    "😀",
    "👍🏽",
    "👨\u{200d}👩\u{200d}👧\u{200d}👦",
    "🏳\u{fe0f}\u{200d}🌈",
    "🇯🇵",
    "🇺🇸",
    "1\u{fe0f}\u{20e3}",
    "❤\u{fe0f}",
    "🧑\u{200d}💻",
    "👩🏾\u{200d}🚀",
    "🐈\u{200d}⬛",
    "🫠",
    "☺",
    "✌🏻",
    "🏴\u{e0067}\u{e0062}\u{e0073}\u{e0063}\u{e0074}\u{e007f}",
];
const ADDED: &[&str] = &[
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<think>",
    "</think>",
    "<tool_call>",
    "</tool_call>",
    "<|fim_prefix|>",
    "<|vision_pad|>",
    "<|im_st",
    "<|im_start",
    "<|",
    "|>",
    "<think",
    "</think",
    "<<|im_end|>>",
    "<|im_end|><|im_end|>",
    "<|endoftext|",
];
const CONTRACTIONS: &[&str] = &[
    "'s", "'S", "'t", "'T", "'re", "'RE", "'Re", "'rE", "'ve", "'VE", "'vE", "'m", "'M", "'ll",
    "'LL", "'Ll", "'lL", "'d", "'D", "'ſ", "'", "''", "'x", "'r", "'v", "'l",
];
const CODE: &str = include_str!("../../src/num/tok_twin.rs");
const C_CODE: &str = include_str!("../../src/bpf/common.h");

/// The corpus: at least 10,000 strings.
pub fn corpus() -> Vec<String> {
    let mut out = Vec::new();
    let mut rng = Rng::new(0x51ab_c0de);
    // every code point of planes 0-3 and 14 (the others are unassigned or private use), in
    // chunks of 128, three ways: alone, after an apostrophe and a space, after a letter with a
    // combining mark behind
    let cps: Vec<char> = (0..0x40000u32)
        .chain(0xe0000..0xe0200)
        .chain(0xf0000..0xf0100)
        .chain(0x10ff00..0x110000)
        .filter_map(char::from_u32)
        .collect();
    for chunk in cps.chunks(128) {
        out.push(chunk.iter().collect());
        out.push(chunk.iter().flat_map(|&c| ['\'', c, ' ']).collect());
        out.push(
            chunk
                .iter()
                .flat_map(|&c| ['a', c, '\u{301}', '1'])
                .collect(),
        );
    }
    // emoji and ZWJ sequences among words
    for _ in 0..400 {
        let mut s = String::new();
        for _ in 0..1 + rng.below(8) {
            s.push_str(rng.pick(EMOJI));
            if rng.below(2) == 0 {
                s.push_str(rng.pick(SPACES));
                s.push_str(rng.pick(WORDS));
            }
        }
        out.push(s);
    }
    // combining marks after letters (NFD order, shuffled order, precomposed + marks), Hangul
    for _ in 0..1500 {
        let mut s = String::new();
        for _ in 0..1 + rng.below(6) {
            s.push(rng.pick(&[
                'a', 'e', 'o', 'u', 'A', 'ω', 'Α', 'é', 'ü', 'n', 'c', 'ᄀ', '가', '각', 'क',
            ]));
            for _ in 0..rng.below(5) {
                s.push(rng.pick(MARKS));
            }
            match rng.below(4) {
                0 => s.push(' '),
                1 => s.push(char::from_u32(0x1161 + rng.below(21) as u32).unwrap()),
                2 => s.push(char::from_u32(0x11a7 + rng.below(28) as u32).unwrap()),
                _ => {}
            }
        }
        out.push(s);
    }
    // whitespace runs of every kind between words, leading and trailing
    for _ in 0..1500 {
        let mut s = String::new();
        for _ in 0..1 + rng.below(6) {
            for _ in 0..rng.below(4) {
                s.push_str(rng.pick(SPACES));
            }
            if rng.below(4) != 0 {
                s.push_str(rng.pick(WORDS));
            }
        }
        out.push(s);
    }
    // digits and contractions in any case
    for _ in 0..1000 {
        let mut s = String::new();
        for _ in 0..1 + rng.below(6) {
            match rng.below(3) {
                0 => s.push_str(&rng.next().to_string()[..1 + rng.below(12)]),
                1 => s.push_str(rng.pick(CONTRACTIONS)),
                _ => s.push_str(rng.pick(WORDS)),
            }
            if rng.below(2) == 0 {
                s.push_str(rng.pick(SPACES));
            }
        }
        out.push(s);
    }
    // source code: runs of lines of this repository's Rust and C
    for src in [CODE, C_CODE] {
        let lines: Vec<&str> = src.lines().collect();
        for i in (0..lines.len()).step_by(3) {
            out.push(lines[i..(i + 1 + rng.below(8)).min(lines.len())].join("\n"));
        }
    }
    // added tokens, whole and partial, inside text
    for _ in 0..1500 {
        let mut s = String::new();
        for _ in 0..1 + rng.below(6) {
            match rng.below(3) {
                0 => s.push_str(rng.pick(ADDED)),
                1 => s.push_str(rng.pick(SPACES)),
                _ => s.push_str(rng.pick(WORDS)),
            }
        }
        out.push(s);
    }
    out.push(
        "<|im_start|>user\nHi there!<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
            .into(),
    );
    // 4 KiB words and long runs
    for w in [
        "a", "ab", "Z", "é", "€", "=", "東", "x\u{301}", " ", "\n", "1", "😀", "'s",
    ] {
        out.push(w.repeat(4096 / w.len()));
    }
    out.push(
        (0..4096)
            .map(|_| (b'a' + rng.below(26) as u8) as char)
            .collect(),
    );
    out.push(String::new());
    // random mixtures of everything
    let palette: Vec<char> = "aZ09 \t\n\r\u{a0}\u{2028}'!?.,;:-_()[]{}<>|/\\\"#$%&*+=@^`~éü東京😀\u{301}\u{308}ſßİ½²٣가\u{200d}\u{fe0f}"
        .chars()
        .collect();
    while out.len() < 14000 {
        out.push((0..1 + rng.below(40)).map(|_| rng.pick(&palette)).collect());
    }
    out
}
