//! The screened LM head (`qwen_bpf::num::bound`): the BPF `screen_argmax` against its Rust twin and
//! the full exact head, on random and adversarial heads; the error bound never violated (the
//! proof's step 1–3, as a property test); and `Model::next_token` with the screen equal to the
//! full head's argmax at every position of the test sequences, per store. Loads BPF programs:
//! needs root (or CAP_BPF + CAP_PERFMON).

mod common;

use common::Rng;
use qwen_bpf::kernel::memory::MemoryLayer;
use qwen_bpf::kernel::swar_ops::ExactHead;
use qwen_bpf::num::bound::{self as screen, Screen, ScreenWeights};
use qwen_bpf::num::fixed::{self, rshr, sat32};
use qwen_bpf::num::swar::{self, Format, Int8Matrix, PackedMatrix, W4A8, W8A16};
use qwen_bpf::store::screen::ScreenedHead;
use qwen_bpf::{Backend, ModelOptions};

const TOKENS: [u32; 16] = [
    785, 3974, 13876, 38835, 916, 279, 15678, 5562, 13, 151644, 0, 9707, 11, 1879, 220, 108386,
];

/// The first row with the largest logit.
fn argmax_first(v: &[i32]) -> usize {
    let mut b = 0;
    for (i, &x) in v.iter().enumerate() {
        if x > v[b] {
            b = i;
        }
    }
    b
}

#[test]
fn next_token_with_the_screen_is_the_full_heads_argmax_at_every_position() {
    let dir = common::tiny_model("screen-tiny");
    for backend in [Backend::Q24, Backend::Int4, Backend::Int8] {
        let opts = ModelOptions::default()
            .with_backend(backend)
            .with_max_context(48)
            .with_cache_dir(&dir);
        let mut screened = common::open(
            &dir,
            ModelOptions {
                screened_head: true,
                ..opts.clone()
            },
        );
        let mut full = common::open(
            &dir,
            ModelOptions {
                screened_head: false,
                ..opts
            },
        );
        assert!(screened.screened_head() && !full.screened_head());
        let mem = screened.kernel_memory();
        assert!(
            mem.head_screen > 0 && mem.head_screen <= mem.weights,
            "{mem:?}"
        );
        assert_eq!(full.kernel_memory().head_screen, 0);
        // The prompt, then the models' own greedy tokens.
        let mut feed: Vec<u32> = TOKENS.to_vec();
        let mut cands = Vec::new();
        let mut i = 0;
        while i < 40 {
            let t = feed[i];
            let logits = full.forward_fixed(t).unwrap();
            let got = screened.next_token(t).unwrap();
            let want = argmax_first(&logits) as u32;
            assert_eq!(got, want, "{}: position {i}", backend.name());
            cands.push(
                screened
                    .head_screen_result()
                    .map_or(usize::MAX, |r| r.candidates),
            );
            if i + 1 == feed.len() {
                feed.push(got);
            }
            i += 1;
        }
        eprintln!("{}: rows rescored per token {cands:?}", backend.name());
    }
}

/// The exact head of a case: the Q24 matrix itself, or its 8-bit quantisation (the int stores).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Exact {
    Q24,
    W8,
}

/// A head `[rows][k]` in Q24 and activations in Q16.
struct Case {
    name: String,
    rows: usize,
    k: usize,
    w: Vec<i32>,
    x: Vec<i32>,
}

impl Case {
    fn int8(&self) -> Int8Matrix {
        let f: Vec<f32> = self
            .w
            .iter()
            .map(|&v| v as f32 / (1 << 24) as f32)
            .collect();
        swar::quantize_int8(&f, self.rows, self.k).unwrap()
    }

    /// The exact head's weights (Q24 integer units), logits and activations `xe`.
    fn exact(&self, kind: Exact) -> (Vec<i64>, Vec<i32>, Vec<i64>) {
        let (rows, k) = (self.rows, self.k);
        let mut y = vec![0i32; rows];
        match kind {
            Exact::Q24 => {
                fixed::lm_head_argmax(&self.w, &self.x, 0..rows, Some(&mut y));
                let xe = self.x.iter().map(|&v| v as i64).collect();
                (self.w.iter().map(|&v| v as i64).collect(), y, xe)
            }
            Exact::W8 => {
                let m = self.int8();
                let xq = swar::quantize_x16(&self.x);
                swar::matvec_quantized(&m, &xq, 0..rows, &mut y);
                let w = (0..rows * k)
                    .map(|i| m.code(i / k, i % k) as i64 * m.scale(i / k, i % k / 32) as i64)
                    .collect();
                (w, y, screen::dequantize(&xq))
            }
        }
    }
}

fn build(format: Format, w: &[i64], rows: usize, k: usize) -> Screen {
    Screen::build(format, rows, k, |r, out| {
        out.copy_from_slice(&w[r * k..(r + 1) * k])
    })
}

/// The screen's logits and activations, by the SWAR twins.
fn screen_logits(scr: &Screen, x: &[i32]) -> (Vec<i32>, Vec<i64>) {
    let mut y = vec![0i32; scr.rows()];
    let xq = match &scr.weights {
        ScreenWeights::W4(m) => {
            let xq = swar::quantize_x8(x);
            swar::matvec_quantized(m, &xq, 0..scr.rows(), &mut y);
            xq
        }
        ScreenWeights::W8(m) => {
            let xq = swar::quantize_x16(x);
            swar::matvec_quantized(m, &xq, 0..scr.rows(), &mut y);
            xq
        }
    };
    (y, screen::dequantize(&xq))
}

/// The screen's integer weights `V` (Q24 units).
fn screen_weights(scr: &Screen, r: usize, j: usize) -> i64 {
    match &scr.weights {
        ScreenWeights::W4(m) => m.code(r, j) as i64 * m.scale(r, j / 32) as i64,
        ScreenWeights::W8(m) => m.code(r, j) as i64 * m.scale(r, j / 32) as i64,
    }
}

/// Checks the proof's steps 1–3 on every row of `c`: `|A - B| <= E · 2^24` for the raw
/// accumulators and `s - E <= y <= s + E` for the logits. Returns false when the token was
/// refused (then nothing is screened).
fn check_bound(c: &Case, format: Format, kind: Exact) -> bool {
    let (w, y, xe) = c.exact(kind);
    let scr = build(format, &w, c.rows, c.k);
    let (s, xh) = screen_logits(&scr, &c.x);
    let Some(t) = screen::token_bound(scr.ws, scr.l1, &xe, &xh) else {
        return false;
    };
    for r in 0..c.rows {
        let e = screen::bound(scr.nd[r], scr.nv[r], &t);
        let (mut a, mut b) = (0i128, 0i128);
        for j in 0..c.k {
            a += w[r * c.k + j] as i128 * xe[j] as i128;
            b += screen_weights(&scr, r, j) as i128 * xh[j] as i128;
        }
        assert!(
            (a - b).abs() <= (e as i128) << 24,
            "{} {} {kind:?} row {r}: |A - B| = {} > E = {e} · 2^24",
            c.name,
            format.name,
            (a - b).abs()
        );
        assert_eq!(sat32(rshr(a as i64, 24)), y[r], "the exact twin's logit");
        let (lo, hi) = (s[r] as i64 - e, s[r] as i64 + e);
        assert!(
            lo <= y[r] as i64 && y[r] as i64 <= hi,
            "{} {} {kind:?} row {r}: exact {} outside [{lo}, {hi}]",
            c.name,
            format.name,
            y[r]
        );
    }
    true
}

fn random_case(rng: &mut Rng, name: &str, rows: usize, k: usize) -> Case {
    let wsd = (1u64 << (10 + rng.next() % 17)) as f64;
    let xsd = (1u64 << (4 + rng.next() % 16)) as f64;
    let outliers = rng.next() % 3;
    let w = (0..rows * k)
        .map(|_| {
            let v = if rng.next() % 300 == 0 {
                rng.normal(wsd * 10.0)
            } else {
                rng.normal(wsd)
            };
            v.clamp(-2e9, 2e9) as i32
        })
        .collect();
    let x = (0..k)
        .map(|j| {
            let big = outliers > 0 && j % 61 == outliers as usize;
            let v = rng.normal(xsd) * if big { 50.0 } else { 1.0 };
            if rng.next() % 17 == 0 {
                0
            } else {
                v.clamp(-2e9, 2e9) as i32
            }
        })
        .collect();
    Case {
        name: name.into(),
        rows,
        k,
        w,
        x,
    }
}

/// Heads built to defeat the screen: a pair of rows one exact unit apart (the later one higher)
/// that the screen cannot tell apart, an exact tie, and a pair whose weights sit just below and
/// exactly on 4-bit rounding boundaries so that the screen ranks them the wrong way round.
fn adversarial(rng: &mut Rng) -> Vec<Case> {
    let (rows, k) = (64usize, 256usize);
    let x: Vec<i32> = (0..k)
        .map(|j| {
            if j == 5 {
                1 << 16
            } else {
                (1 << 15) + rng.sym(1 << 14) as i32
            }
        })
        .collect();
    let background = |rng: &mut Rng| -> Vec<i32> {
        (0..rows * k)
            .map(|_| rng.normal((1 << 17) as f64) as i32)
            .collect()
    };
    let mut cases = Vec::new();

    // Near-tie: row 41 = row 20 + 256 at column 5, where x = 1.0: exactly one Q16 unit higher.
    let mut w = background(rng);
    for j in 0..k {
        w[20 * k + j] = (1 << 21) + rng.sym(1 << 12) as i32;
    }
    let row20: Vec<i32> = w[20 * k..21 * k].to_vec();
    w[41 * k..42 * k].copy_from_slice(&row20);
    w[41 * k + 5] += 256;
    cases.push(Case {
        name: "near-tie".into(),
        rows,
        k,
        w: w.clone(),
        x: x.clone(),
    });

    // Exact tie at the top: rows 10 and 30 identical; row 10 must win.
    let mut w = background(rng);
    for j in 0..k {
        w[10 * k + j] = (1 << 21) + rng.sym(1 << 12) as i32;
    }
    let row10: Vec<i32> = w[10 * k..11 * k].to_vec();
    w[30 * k..31 * k].copy_from_slice(&row10);
    cases.push(Case {
        name: "tie".into(),
        rows,
        k,
        w,
        x: x.clone(),
    });

    // Misranked by the screen, and one exact unit apart: k = 1024, x = 2^15 everywhere (exact in
    // 8 bits), 4-bit scale s = 2^18 per group (element 0 = 7s in both rows). Row 7 (B) sits on
    // the half-way points of 511 columns (rounded up) where row 12 (A) is 512 lower (rounded
    // down), and 2^18 lower than A on one column, on the grid. Exactly B - A = (511·512 - 2^18)
    // · 2^15 = -2^24: one Q16 unit below A; the screen puts B 510 steps above A.
    let k = 1024;
    let mut w: Vec<i32> = (0..rows * k)
        .map(|_| rng.normal((1 << 17) as f64) as i32)
        .collect();
    let s = 1i32 << 18;
    let mut half = 0;
    for j in 0..k {
        let c = (rng.next() % 6) as i32;
        let (a, b) = if j % 32 == 0 {
            (7 * s, 7 * s)
        } else if half < 511 {
            half += 1;
            ((2 * c + 1) * s / 2 - 512, (2 * c + 1) * s / 2)
        } else if half == 511 {
            half += 1;
            ((c + 1) * s, c * s)
        } else {
            (c * s, c * s)
        };
        w[12 * k + j] = a;
        w[7 * k + j] = b;
    }
    cases.push(Case {
        name: "misranked".into(),
        rows,
        k,
        w,
        x: vec![1 << 15; k],
    });
    cases
}

#[test]
fn adversarial_heads_defeat_the_screen_not_the_answer() {
    let mut rng = Rng(0x5c4ee9);
    let cases = adversarial(&mut rng);
    let ys: Vec<Vec<i32>> = cases.iter().map(|c| c.exact(Exact::Q24).1).collect();
    // They are what they claim to be.
    assert_eq!(ys[0][41], ys[0][20] + 1, "near-tie");
    assert_eq!(
        fixed::lm_head_argmax(&cases[0].w, &cases[0].x, 0..64, None).0,
        41
    );
    assert_eq!(
        fixed::lm_head_argmax(&cases[1].w, &cases[1].x, 0..64, None).0,
        10
    );
    assert_eq!(ys[2][12], ys[2][7] + 1, "misranked: A one unit above B");
    assert_eq!(
        fixed::lm_head_argmax(&cases[2].w, &cases[2].x, 0..64, None).0,
        12
    );
    let w: Vec<i64> = cases[2].w.iter().map(|&v| v as i64).collect();
    let (s4, _) = screen_logits(&build(W4A8, &w, 64, 1024), &cases[2].x);
    assert!(
        s4[7] > s4[12] + 1000,
        "the 4-bit screen ranks B above A: {} vs {}",
        s4[7],
        s4[12]
    );
    for c in &cases {
        for f in [W4A8, W8A16] {
            for kind in [Exact::Q24, Exact::W8] {
                assert!(check_bound(c, f, kind), "{}: token refused", c.name);
            }
        }
    }
    bpf_matches(&cases, MemoryLayer::Arena);
}

/// The bound holds for every row of random heads (magnitudes 2^10..2^26 Q24, activations
/// 2^4..2^20 Q16 with outlier channels and zeros), both screens, both exact heads.
#[test]
fn the_bound_is_never_violated() {
    let mut rng = Rng(0xb0u64 << 32 | 17);
    let mut checked = 0;
    for i in 0..120 {
        let k = [32, 64, 256, 1024][i % 4];
        let c = random_case(&mut rng, &format!("random {i}"), 16, k);
        for f in [W4A8, W8A16] {
            for kind in [Exact::Q24, Exact::W8] {
                checked += check_bound(&c, f, kind) as usize;
            }
        }
    }
    assert!(checked >= 400, "{checked} of 480 tokens screened");
}

/// Runs `screen_argmax` in BPF on each case with each screen and exact head, against the twin
/// (candidates and answer) and against the full exact head's BPF argmax, on one memory layer.
fn bpf_matches(cases: &[Case], layer: MemoryLayer) {
    for c in cases {
        // One load per case (loading verifies every program: seconds on a busy machine).
        let mut ops = common::ops_on((c.rows * c.k * 4) * 6 + (16 << 20), layer);
        for (format, kind) in [(W4A8, Exact::Q24), (W8A16, Exact::Q24), (W4A8, Exact::W8)] {
            let (w, y, xe) = c.exact(kind);
            let scr = build(format, &w, c.rows, c.k);
            let (s, xh) = screen_logits(&scr, &c.x);
            let t = screen::token_bound(scr.ws, scr.l1, &xe, &xh).expect("a trusted token");
            let (lower, cands) = screen::candidates(&s, &scr, &t);
            let want = screen::rescore(&cands, |r| y[r]);
            let full = {
                let mut b = 0;
                for r in 0..c.rows {
                    if y[r] > y[b] {
                        b = r;
                    }
                }
                (b, y[b])
            };
            assert_eq!(
                want, full,
                "{} {} {kind:?}: twin vs full head",
                c.name, format.name
            );

            let xr = ops.arena.alloc(c.k * 4, "x").unwrap();
            ops.arena
                .slice_mut::<i32>(xr)
                .unwrap()
                .copy_from_slice(&c.x);
            let mut head = ScreenedHead::upload(&mut ops, &scr).unwrap();
            let (exact, bpf_full) = match kind {
                Exact::Q24 => {
                    let wr = ops.arena.alloc(c.rows * c.k * 4, "w").unwrap();
                    ops.arena
                        .slice_mut::<i32>(wr)
                        .unwrap()
                        .copy_from_slice(&c.w);
                    let f = ops.lm_head_argmax(wr, xr, None, c.k, 0..c.rows).unwrap();
                    (ExactHead::Q24 { w: wr, x: xr }, f)
                }
                Exact::W8 => {
                    let m = ops.upload_int8(&c.int8()).unwrap();
                    let xq = ops.alloc_quant_x(c.k, W8A16).unwrap();
                    ops.quantize_x(xr, &xq).unwrap();
                    let f = ops.w8a16_lm_head_argmax(&m, &xq, None, 0..c.rows).unwrap();
                    (ExactHead::W8 { head: m, xq }, f)
                }
            };
            let got = head
                .argmax(&mut ops, xr, &exact)
                .unwrap()
                .expect("screened");
            let r = head.last.unwrap();
            let what = format!("{layer} layer, {} {} {kind:?}", c.name, format.name);
            assert_eq!(got, full, "{what}: BPF screened vs the full head");
            assert_eq!(bpf_full, full, "{what}: BPF full head vs its twin");
            assert_eq!(r.lower, lower, "{what}: L");
            let n = match kind {
                Exact::Q24 => cands.len(),
                Exact::W8 => {
                    let mut b: Vec<usize> = cands.iter().map(|r| r / 4).collect();
                    b.dedup();
                    4 * b.len()
                }
            };
            assert_eq!(r.candidates, n, "{what}: rows rescored");
        }
    }
}

#[test]
fn bpf_screen_argmax_matches_its_twin_and_the_full_head() {
    bpf_screen_argmax_matches_its_twin_and_the_full_head_on(MemoryLayer::Arena);
}

#[test]
fn array_bpf_screen_argmax_matches_its_twin_and_the_full_head() {
    bpf_screen_argmax_matches_its_twin_and_the_full_head_on(MemoryLayer::Array);
    // and the adversarial heads (their own test runs them on the arena)
    bpf_matches(&adversarial(&mut Rng(0x5c4ee9)), MemoryLayer::Array);
}

fn bpf_screen_argmax_matches_its_twin_and_the_full_head_on(layer: MemoryLayer) {
    let mut rng = Rng(0xa11ce);
    let cases: Vec<Case> = (0..6)
        .map(|i| {
            random_case(
                &mut rng,
                &format!("random {i}"),
                256,
                [64, 256, 1024][i % 3],
            )
        })
        .collect();
    bpf_matches(&cases, layer);
}
