//! The integer sampler: the BPF `op_sample` (`src/bpf/sample.inc.c`) against its Rust twin
//! (`src/num/sample.rs`) bit for bit on many logit vectors and parameter sets, its refusals, its
//! distribution against the f32 `Sampler`'s (and that a wrong temperature fails that check), and
//! in-kernel sampled generation against `Model::generate` token for token.

mod common;

use std::path::Path;

use common::Rng;
use qwen_bpf::kernel::arena::Region;
use qwen_bpf::kernel::memory::MemoryLayer;
use qwen_bpf::kernel::ops::{sample_args, Ops};
use qwen_bpf::num::fixed::{exp2_table, ACT_MAX};
use qwen_bpf::num::sample::{self, Params, E_PARAM, ONE};
use qwen_bpf::{
    Backend, Dispatch, Error, GenerateOptions, KvFormat, ModelOptions, Sampler, SamplingParams,
};

const VOCAB: usize = 151_936;

/// The arena buffers of one draw.
struct Bufs {
    logits: Region,
    counts: Region,
    hist: Region,
    exp2: Region,
}

fn load() -> (Ops, Bufs) {
    load_on(MemoryLayer::Arena)
}

fn load_on(layer: MemoryLayer) -> (Ops, Bufs) {
    let mut ops = common::ops_on(4 << 20, layer);
    let b = Bufs {
        logits: ops.arena.alloc(VOCAB * 4, "logits").unwrap(),
        counts: ops.arena.alloc(VOCAB * 4, "counts").unwrap(),
        hist: ops.arena.alloc(2048 * 8, "hist").unwrap(),
        exp2: ops.arena.alloc(257 * 4, "exp2").unwrap(),
    };
    ops.arena
        .slice_mut::<u32>(b.exp2)
        .unwrap()
        .copy_from_slice(&exp2_table());
    (ops, b)
}

/// One draw in BPF: (return value, token, new rng state, the logits after it).
fn bpf_draw(
    ops: &mut Ops,
    b: &Bufs,
    p: &Params,
    logits: &[i32],
    counts: Option<&[u32]>,
    rng: u64,
) -> (i32, u32, u64, Vec<i32>) {
    let n = logits.len();
    ops.arena.slice_mut::<i32>(b.logits).unwrap()[..n].copy_from_slice(logits);
    if let Some(c) = counts {
        ops.arena.slice_mut::<u32>(b.counts).unwrap()[..n].copy_from_slice(c);
    }
    let mut a = sample_args(
        p,
        ops.arena.addr(b.logits),
        n as u32,
        counts.map_or(0, |_| ops.arena.addr(b.counts)),
        ops.arena.addr(b.hist),
        ops.arena.addr(b.exp2),
        rng,
    );
    let rc = ops.sample(&mut a).expect("run the sample program");
    let after = ops.arena.slice::<i32>(b.logits).unwrap()[..n].to_vec();
    (rc, a.token, a.rng, after)
}

/// The kinds of logit vectors: random, few distinct values (ties), all equal, extremes, one
/// dominant, LLM-like (a few high, a long normal tail).
fn logits(kind: usize, n: usize, rng: &mut Rng) -> Vec<i32> {
    let q = |v: f64| {
        (v * 65536.0)
            .round()
            .clamp(-(ACT_MAX as f64), ACT_MAX as f64) as i32
    };
    match kind {
        0 => rng.vec(n, 8 << 16),
        1 => (0..n).map(|_| (rng.next() % 4) as i32 * 30_000).collect(),
        2 => vec![12_345; n],
        3 => (0..n)
            .map(|_| match rng.next() % 4 {
                0 => ACT_MAX as i32,
                1 => -(ACT_MAX as i32),
                2 => i32::MIN,
                _ => rng.sym(1 << 30) as i32,
            })
            .collect(),
        4 => {
            let mut l = rng.vec(n, 1 << 16);
            let at = (rng.next() % n as u64) as usize;
            l[at] = 40 << 16;
            l
        }
        _ => (0..n)
            .map(|i| q(rng.normal(2.0) + if i % 97 == 5 { 12.0 } else { 0.0 }))
            .collect(),
    }
}

/// A parameter set drawn from the interesting values of each field.
fn params(rng: &mut Rng, n: usize) -> Params {
    let pick = |rng: &mut Rng, v: &[u32]| v[(rng.next() % v.len() as u64) as usize];
    let ks = [0, 1, 2, 5, 40, n as u32 - 1, n as u32, n as u32 + 5, 1000];
    Params {
        temp_q16: pick(rng, &[0, 656, 19_661, ONE, 163_840, 100 << 16]),
        top_k: pick(rng, &ks),
        top_p_q16: pick(rng, &[ONE, ONE, 58_982, 32_768, 1]),
        min_p_q16: pick(rng, &[0, 0, 3_277, ONE]),
        rep_q16: pick(rng, &[ONE, ONE, 85_197, 45_875, 656, 100 << 16]),
        presence_q16: pick(rng, &[0, 0, 32_768, (-32_768i32) as u32, 64 << 16]) as i32,
        frequency_q16: pick(rng, &[0, 0, 16_384, (-(64i32 << 16)) as u32]) as i32,
    }
}

#[test]
fn bpf_sampler_equals_the_twin_bit_for_bit() {
    equals_the_twin(MemoryLayer::Arena);
}

#[test]
fn array_bpf_sampler_equals_the_twin_bit_for_bit() {
    equals_the_twin(MemoryLayer::Array);
}

fn equals_the_twin(layer: MemoryLayer) {
    let (mut ops, b) = load_on(layer);
    let tab = exp2_table();
    let mut rng = Rng(0x5a17_e5ee_d123_4567);
    let mut drawn = 0;
    let sizes = [1, 2, 3, 7, 64, 1000, 4099];
    for case in 0..600 {
        let n = if case % 100 == 99 {
            VOCAB
        } else {
            sizes[case % sizes.len()]
        };
        let kind = case / sizes.len() % 6;
        let l = logits(kind, n, &mut rng);
        let p = params(&mut rng, n);
        let counts: Option<Vec<u32>> = (case % 3 != 0).then(|| {
            (0..n)
                .map(|_| (rng.next() % 8).saturating_sub(5) as u32)
                .collect()
        });
        let mut state = rng.next();
        // three draws in a row from one state, as a generation makes them
        for _ in 0..3 {
            let (rc, token, next, after) = bpf_draw(&mut ops, &b, &p, &l, counts.as_deref(), state);
            let mut twin_l = l.clone();
            let mut twin_state = state;
            let want = sample::sample(&p, &mut twin_l, counts.as_deref(), &tab, &mut twin_state)
                .unwrap_or_else(|e| panic!("case {case}: twin refused {p:?}: {e}"));
            let what = format!("case {case}: n {n}, kind {kind}, {p:?}");
            assert_eq!(rc, 0, "{what}");
            assert_eq!(token, want, "token, {what}");
            assert_eq!(next, twin_state, "generator state, {what}");
            assert!(after == twin_l, "penalised logits, {what}");
            assert!((token as usize) < n);
            state = next;
            drawn += 1;
        }
    }
    eprintln!("{drawn} draws equal");
}

/// Parameters out of the sampler's ranges, each with the name the twin's refusal gives.
fn bad_params() -> [(&'static str, Params); 10] {
    let ok = Params {
        temp_q16: ONE,
        ..Params::default()
    };
    [
        (
            "temperature",
            Params {
                temp_q16: 655,
                ..ok
            },
        ),
        (
            "temperature",
            Params {
                temp_q16: (100 << 16) + 1,
                ..ok
            },
        ),
        ("top_p", Params { top_p_q16: 0, ..ok }),
        (
            "top_p",
            Params {
                top_p_q16: ONE + 1,
                ..ok
            },
        ),
        (
            "min_p",
            Params {
                min_p_q16: ONE + 1,
                ..ok
            },
        ),
        ("repetition_penalty", Params { rep_q16: 0, ..ok }),
        (
            "repetition_penalty",
            Params {
                rep_q16: (100 << 16) + 1,
                ..ok
            },
        ),
        (
            "presence_penalty",
            Params {
                presence_q16: (64 << 16) + 1,
                ..ok
            },
        ),
        (
            "frequency_penalty",
            Params {
                frequency_q16: -(64 << 16) - 1,
                ..ok
            },
        ),
        (
            "frequency_penalty",
            Params {
                frequency_q16: i32::MIN,
                ..ok
            },
        ),
    ]
}

#[test]
fn array_out_of_range_parameters_and_misplaced_vectors_are_refused() {
    let (mut ops, b) = load_on(MemoryLayer::Array);
    for (name, p) in bad_params() {
        let (rc, ..) = bpf_draw(&mut ops, &b, &p, &[1, 2, 3], None, 1);
        assert_eq!(rc, E_PARAM, "{name}: BPF accepted {p:?}");
    }
    let ok = Params {
        temp_q16: ONE,
        ..Params::default()
    };
    let (rc, ..) = bpf_draw(&mut ops, &b, &ok, &[], None, 1);
    assert_eq!(rc, E_PARAM, "BPF accepted no logits");
    // a logits vector past the memory's end (the array build checks every vector whole)
    let mut a = sample_args(
        &ok,
        ops.arena.addr(b.logits) + (4 << 20),
        4,
        0,
        ops.arena.addr(b.hist),
        ops.arena.addr(b.exp2),
        1,
    );
    assert_eq!(
        ops.sample(&mut a).unwrap(),
        E_PARAM,
        "logits outside the memory"
    );
}

#[test]
fn out_of_range_parameters_are_refused_by_both_sides() {
    let (mut ops, b) = load();
    let tab = exp2_table();
    let ok = Params {
        temp_q16: ONE,
        ..Params::default()
    };
    let cases = bad_params();
    let l = [1, 2, 3];
    for (name, p) in cases {
        let (rc, ..) = bpf_draw(&mut ops, &b, &p, &l, None, 1);
        assert_eq!(rc, E_PARAM, "BPF accepted {p:?}");
        match sample::sample(&p, &mut l.clone(), None, &tab, &mut 1) {
            Err(Error::InvalidParameter { name: got, .. }) => assert_eq!(got, name, "{p:?}"),
            other => panic!("twin: {p:?} gave {other:?}"),
        }
    }
    // an empty vocabulary, or counts of another length
    let (rc, ..) = bpf_draw(&mut ops, &b, &ok, &[], None, 1);
    assert_eq!(rc, E_PARAM, "BPF accepted no logits");
    assert!(matches!(
        sample::sample(&ok, &mut [], None, &tab, &mut 1),
        Err(Error::Invalid(_))
    ));
    let pen = Params {
        rep_q16: 2 * ONE,
        ..ok
    };
    assert!(matches!(
        sample::sample(&pen, &mut [1, 2], Some(&[1]), &tab, &mut 1),
        Err(Error::Invalid(_))
    ));
    // a vocabulary past the sampler's bound is a typed limit where sampling is accepted
    use qwen_bpf::num::limits::{check_sampler_vocab, VOCAB_MAX};
    assert!(check_sampler_vocab(VOCAB_MAX).is_ok());
    assert!(matches!(
        check_sampler_vocab(VOCAB_MAX + 1),
        Err(Error::Limit { what, .. }) if what.contains("vocab_size")
    ));
    let (rc, ..) = bpf_draw(&mut ops, &b, &ok, &vec![0; 4], None, 1);
    assert_eq!(rc, 0);
    // the f32 parameters past the integer sampler's ranges: refused with the value given
    for (p, name) in [
        (SamplingParams::new(0.001), "temperature"),
        (SamplingParams::new(500.0), "temperature"),
        (SamplingParams::new(1.0).with_top_p(1e-6), "top_p"),
        (
            SamplingParams::new(1.0).with_repetition_penalty(0.001),
            "repetition_penalty",
        ),
        (
            SamplingParams::greedy().with_presence_penalty(100.0),
            "presence_penalty",
        ),
        (
            SamplingParams::new(1.0).with_frequency_penalty(-65.0),
            "frequency_penalty",
        ),
    ] {
        let dir = common::tiny_model("sample-kernel");
        let mut m = common::open(&dir, options(&dir, Backend::Q24, 1, MemoryLayer::Arena));
        let opts = GenerateOptions::new(4).with_sampling(p.clone());
        for r in [
            m.generate(&[1, 2], &opts).map(|_| ()),
            m.generate_in_kernel(&[1, 2], &opts).map(|_| ()),
        ] {
            match r {
                Err(Error::InvalidParameter {
                    name: got, value, ..
                }) => {
                    assert_eq!(got, name, "{p:?}");
                    assert!(value != 0.0 && value.is_finite(), "{p:?}: {value}");
                }
                other => panic!("{p:?}: expected InvalidParameter, got {other:?}"),
            }
        }
        assert_eq!(m.position(), 0, "refused generations feed nothing");
    }
}

/// The f32 reference's probabilities for `logits` (Q16) after accepting `history`, per token.
fn f32_probs(p: &SamplingParams, l: &[i32], history: &[u32]) -> Vec<f64> {
    let mut s = Sampler::new(p).unwrap();
    s.accept_all(history);
    let f: Vec<f32> = l.iter().map(|&v| v as f32 / 65536.0).collect();
    let mut probs = vec![0.0; l.len()];
    for c in s.candidates(&f).unwrap() {
        probs[c.id as usize] = c.prob;
    }
    probs
}

fn tv(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).sum::<f64>() / 2.0
}

#[test]
fn draws_follow_the_f32_samplers_distribution_and_a_wrong_temperature_does_not() {
    let tab = exp2_table();
    let mut rng = Rng(77);
    // 48 tokens: a few likely ones and a tail; a history of repeats for the penalties
    let l: Vec<i32> = (0..48)
        .map(|i| ((3.0 - 0.21 * i as f64 + rng.normal(0.4)) * 65536.0).round() as i32)
        .collect();
    let history = [0u32, 3, 3, 7, 12];
    let mut counts = vec![0u32; l.len()];
    history.iter().for_each(|&t| counts[t as usize] += 1);
    let sp = SamplingParams::new(0.8)
        .with_top_k(30)
        .with_top_p(0.93)
        .with_min_p(0.02)
        .with_repetition_penalty(1.3)
        .with_presence_penalty(0.2)
        .with_frequency_penalty(0.1);
    let want = f32_probs(&sp, &l, &history);
    let fixed = |sp: &SamplingParams| {
        let q = |v: f32| (v as f64 * 65536.0).round();
        Params {
            temp_q16: q(sp.temperature) as u32,
            top_k: sp.top_k as u32,
            top_p_q16: q(sp.top_p) as u32,
            min_p_q16: q(sp.min_p) as u32,
            rep_q16: q(sp.repetition_penalty) as u32,
            presence_q16: q(sp.presence_penalty) as i32,
            frequency_q16: q(sp.frequency_penalty) as i32,
        }
    };
    // The exact integer distribution against the f32 one: the arithmetic's own difference.
    let exact = |p: &Params| {
        let d = sample::distribution(p, &mut l.clone(), Some(&counts), &tab).unwrap();
        let total: u64 = d.iter().map(|&(_, w)| w).sum();
        let mut probs = vec![0.0; l.len()];
        d.iter()
            .for_each(|&(i, w)| probs[i as usize] = w as f64 / total as f64);
        probs
    };
    let p = fixed(&sp);
    let exact_tv = tv(&exact(&p), &want);
    eprintln!("exact integer vs f32 distribution: total variation {exact_tv:.2e}");
    assert!(
        exact_tv < 1e-3,
        "integer vs f32 distribution: TV {exact_tv}"
    );
    // The same over the whole vocabulary, LLM-like logits, a few settings (no penalties).
    let big = logits(5, VOCAB, &mut rng);
    for sp in [
        SamplingParams::new(1.0),
        SamplingParams::new(0.7).with_top_k(40),
        SamplingParams::new(0.8).with_top_p(0.95).with_min_p(0.01),
        SamplingParams::new(1.5),
    ] {
        let d = sample::distribution(&fixed(&sp), &mut big.clone(), None, &tab).unwrap();
        let total: u64 = d.iter().map(|&(_, w)| w).sum();
        let mut probs = vec![0.0; VOCAB];
        d.iter()
            .for_each(|&(i, w)| probs[i as usize] = w as f64 / total as f64);
        let t = tv(&probs, &f32_probs(&sp, &big, &[]));
        eprintln!("{VOCAB} logits, {sp:?}: exact total variation {t:.2e}");
        assert!(t < 1e-3, "{sp:?}: TV {t}");
    }
    // N draws: the empirical frequencies against the f32 probabilities. Sampling noise gives a
    // TV of about 0.4 sum_i sqrt(p_i / N) ~ 0.003 here; the bound is 0.01.
    let n = 200_000;
    let draws = |p: &Params| {
        let mut freq = vec![0.0; l.len()];
        let mut state = 2026;
        for _ in 0..n {
            let t = sample::sample(p, &mut l.clone(), Some(&counts), &tab, &mut state).unwrap();
            freq[t as usize] += 1.0 / n as f64;
        }
        freq
    };
    let got = draws(&p);
    let drawn_tv = tv(&got, &want);
    eprintln!("{n} draws vs f32 distribution: total variation {drawn_tv:.4}");
    assert!(drawn_tv < 0.01, "draws vs f32 distribution: TV {drawn_tv}");
    for (i, (&g, &w)) in got.iter().zip(&want).enumerate() {
        assert!(
            w > 0.0 || g == 0.0,
            "token {i} drawn but the f32 sampler drops it"
        );
    }
    // The check has teeth: a sampler with a temperature 15% off, or without the penalties,
    // fails it.
    for (what, bad) in [
        (
            "temperature 0.92 for 0.8",
            fixed(&sp.clone().with_temperature(0.92)),
        ),
        ("no repetition penalty", Params { rep_q16: ONE, ..p }),
    ] {
        let bad_tv = tv(&draws(&bad), &want);
        eprintln!("mutant ({what}): total variation {bad_tv:.4}");
        assert!(
            bad_tv > 0.01,
            "the check missed a sampler with {what}: TV {bad_tv}"
        );
    }
}

/// Model options for the generation tests: `backend`, `threads`, the kernel dispatch, `layer`.
fn options(dir: &Path, backend: Backend, threads: usize, layer: MemoryLayer) -> ModelOptions {
    ModelOptions::default()
        .with_backend(backend)
        .with_kv(KvFormat::Q16)
        .with_max_context(64)
        .with_threads(threads)
        .with_dispatch(Dispatch::Kernel)
        .with_memory(layer)
        .with_cache_dir(dir.join(format!("cache-{}-{layer:?}", backend.name())))
}

#[test]
fn in_kernel_sampling_gives_the_tokens_of_generate_for_each_seed() {
    sampling_gives_the_tokens_of_generate(MemoryLayer::Arena);
}

#[test]
fn array_in_kernel_sampling_gives_the_tokens_of_generate_for_each_seed() {
    sampling_gives_the_tokens_of_generate(MemoryLayer::Array);
}

fn sampling_gives_the_tokens_of_generate(layer: MemoryLayer) {
    let dir = common::tiny_model("sample-kernel");
    let prompt = [785, 3974, 13876, 38835, 916, 3974];
    let settings = [
        SamplingParams::new(1.0),
        SamplingParams::new(0.7).with_top_k(40).with_top_p(0.9),
        SamplingParams::new(1.3)
            .with_min_p(0.05)
            .with_repetition_penalty(1.5)
            .with_frequency_penalty(0.3),
        SamplingParams::greedy().with_presence_penalty(2.0),
    ];
    for (backend, threads) in [(Backend::Q24, 1), (Backend::Q24, 2), (Backend::Int8, 1)] {
        let mut m = common::open(&dir, options(&dir, backend, threads, layer));
        for (i, sp) in settings.iter().enumerate() {
            let mut texts = Vec::new();
            for seed in [1, 2, 99] {
                let opts = GenerateOptions::new(24).with_sampling(sp.clone().with_seed(seed));
                m.reset();
                let want: Vec<u32> = m
                    .generate(&prompt, &opts)
                    .unwrap()
                    .map(Result::unwrap)
                    .collect();
                m.reset();
                let mut g = m.generate_in_kernel(&prompt, &opts).unwrap();
                let got: Vec<u32> = g.by_ref().map(Result::unwrap).collect();
                let what = format!(
                    "{} store, {threads} threads, setting {i}, seed {seed}",
                    backend.name()
                );
                assert_eq!(g.seed(), Some(seed), "{what}");
                assert_eq!(got, want, "in-kernel vs user-space sampled tokens ({what})");
                assert_eq!(got.len(), 24, "{what}");
                texts.push(got);
            }
            if sp.is_greedy() {
                assert!(texts.iter().all(|t| *t == texts[0]), "greedy draws nothing");
            } else {
                assert!(
                    texts[0] != texts[1] || texts[1] != texts[2],
                    "seeds change the text"
                );
            }
        }
    }
}

/// What a sampled token costs against the argmax, measured in one run and printed (no timing is
/// asserted; the draws are checked against the twin): the `sample` program over the full
/// vocabulary per setting, the 0.6B-shaped LM head with its fused argmax (the greedy path's
/// whole head), and the tiny model's in-kernel generation greedy vs sampled.
#[test]
fn sampling_cost_against_the_argmax_is_printed() {
    use std::time::Instant;
    let (k, rows) = (1024, VOCAB);
    let mut ops = Ops::load(rows * k * 4 + (8 << 20)).expect("load the operator programs");
    let mut rng = Rng(9);
    let b = Bufs {
        logits: ops.arena.alloc(VOCAB * 4, "logits").unwrap(),
        counts: ops.arena.alloc(VOCAB * 4, "counts").unwrap(),
        hist: ops.arena.alloc(2048 * 8, "hist").unwrap(),
        exp2: ops.arena.alloc(257 * 4, "exp2").unwrap(),
    };
    let tab = exp2_table();
    ops.arena
        .slice_mut::<u32>(b.exp2)
        .unwrap()
        .copy_from_slice(&tab);
    let w = ops.arena.alloc(rows * k * 4, "head").unwrap();
    let x = ops.arena.alloc(k * 4, "x").unwrap();
    for v in ops.arena.slice_mut::<i32>(w).unwrap() {
        *v = rng.sym(1 << 20) as i32; // |w| < 1/16 in Q24
    }
    for v in ops.arena.slice_mut::<i32>(x).unwrap() {
        *v = rng.sym(2 << 16) as i32;
    }
    let reps = 5;
    let t = Instant::now();
    for _ in 0..reps {
        ops.lm_head_argmax(w, x, Some(b.logits), k, 0..rows)
            .unwrap();
    }
    let head = t.elapsed().as_secs_f64() / reps as f64;
    eprintln!(
        "LM head + argmax, {rows} x {k} (0.6B shape), one thread: {:.2} ms",
        head * 1e3
    );
    let l = ops.arena.slice::<i32>(b.logits).unwrap().to_vec();
    let counts: Vec<u32> = (0..VOCAB).map(|i| u32::from(i % 50 == 0)).collect();
    let settings = [
        ("temperature 0.8", SamplingParams::new(0.8)),
        ("+ top-k 40", SamplingParams::new(0.8).with_top_k(40)),
        ("+ top-p 0.95", SamplingParams::new(0.8).with_top_p(0.95)),
        (
            "top-k 40, top-p 0.95, min-p 0.05, penalties",
            SamplingParams::new(0.8)
                .with_top_k(40)
                .with_top_p(0.95)
                .with_min_p(0.05)
                .with_repetition_penalty(1.1)
                .with_frequency_penalty(0.1),
        ),
    ];
    for (what, sp) in settings {
        let q = |v: f32| (v as f64 * 65536.0).round();
        let p = Params {
            temp_q16: q(sp.temperature) as u32,
            top_k: sp.top_k as u32,
            top_p_q16: q(sp.top_p) as u32,
            min_p_q16: q(sp.min_p) as u32,
            rep_q16: q(sp.repetition_penalty) as u32,
            presence_q16: 0,
            frequency_q16: q(sp.frequency_penalty) as i32,
        };
        let t = Instant::now();
        let mut state = 5;
        for _ in 0..reps {
            let (rc, token, next, _) = bpf_draw(&mut ops, &b, &p, &l, Some(&counts), state);
            let want = sample::sample(&p, &mut l.clone(), Some(&counts), &tab, &mut state).unwrap();
            assert_eq!((rc, token, next), (0, want, state), "{what}");
        }
        // the twin's draw and the copies are in the loop too: time the program alone
        let total = t.elapsed().as_secs_f64();
        let t = Instant::now();
        for _ in 0..reps {
            bpf_draw(&mut ops, &b, &p, &l, Some(&counts), state);
        }
        let bpf = t.elapsed().as_secs_f64() / reps as f64;
        eprintln!(
            "sample ({what}), {VOCAB} logits: {:.2} ms a draw (with copies), {:.3} x the head \
             (checked against the twin in {:.0} ms)",
            bpf * 1e3,
            bpf / head,
            total * 1e3
        );
    }
    drop(ops);
    // the tiny model (hidden 64, the real vocabulary): the head is small, so the draw shows
    let dir = common::tiny_model("sample-kernel");
    let mut m = common::open(&dir, options(&dir, Backend::Q24, 1, MemoryLayer::Arena));
    let n = 48;
    let mut per_token = Vec::new();
    for sp in [
        SamplingParams::greedy(),
        SamplingParams::new(0.8).with_top_k(40).with_top_p(0.95),
    ] {
        m.reset();
        let opts = GenerateOptions::new(n).with_sampling(sp.with_seed(3));
        let t = Instant::now();
        let got = m.generate_in_kernel(&[1, 2, 3], &opts).unwrap().count();
        per_token.push(t.elapsed().as_secs_f64() / n as f64);
        assert_eq!(got, n);
    }
    eprintln!(
        "tiny model in the kernel: greedy {:.2} ms/token, sampled {:.2} ms/token ({:.2} x)",
        per_token[0] * 1e3,
        per_token[1] * 1e3,
        per_token[1] / per_token[0]
    );
}
