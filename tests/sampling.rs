//! Sampling and generation: the sampler's stages on hand-made logits (exact kept sets, typed
//! errors), its draws against the exact distribution (chi-square), `Model::generate` on the tiny
//! synthetic model in BPF (seeds, greedy = `next_token`, stop/max/context ends, text), and the
//! `generate` example's sampling flags.

mod common;

use std::path::Path;
use std::process::Command;

use qwen_bpf::hf::synth::{Preset, SynthOptions};
use qwen_bpf::Tokenizer;
use qwen_bpf::{Candidate, Sampler, SamplingParams};
use qwen_bpf::{Error, FinishReason, GenerateOptions, Model, ModelOptions};

// ---------------------------------------------------------------------------------------------
// (a) the stages on hand-made logits

fn ids(c: &[Candidate]) -> Vec<u32> {
    c.iter().map(|c| c.id).collect()
}

fn sampler(p: SamplingParams) -> Sampler {
    Sampler::new(&p.with_seed(0)).expect("valid parameters")
}

/// `ln` of each probability: logits whose softmax is exactly `probs` (they sum to 1).
fn ln(probs: &[f64]) -> Vec<f32> {
    probs.iter().map(|&p| p.ln() as f32).collect()
}

#[test]
fn defaults_are_greedy_with_everything_off() {
    let p = SamplingParams::default();
    assert_eq!(p, SamplingParams::greedy());
    assert!(p.is_greedy() && !p.has_penalties());
    assert_eq!(
        (p.temperature, p.top_k, p.top_p, p.min_p),
        (0.0, 0, 1.0, 0.0)
    );
    assert_eq!(
        (
            p.repetition_penalty,
            p.presence_penalty,
            p.frequency_penalty,
            p.seed
        ),
        (1.0, 0.0, 0.0, None)
    );
    let p = SamplingParams::new(0.8)
        .with_top_k(40)
        .with_top_p(0.95)
        .with_min_p(0.05)
        .with_repetition_penalty(1.1)
        .with_presence_penalty(0.5)
        .with_frequency_penalty(0.25)
        .with_seed(7);
    assert_eq!(
        (p.temperature, p.top_k, p.top_p, p.min_p, p.seed),
        (0.8, 40, 0.95, 0.05, Some(7))
    );
    assert!(!p.is_greedy() && p.has_penalties());
    assert!(p.validate().is_ok());
    let g = GenerateOptions::default();
    assert_eq!(g.sampling, SamplingParams::greedy());
    assert!(g.stop_tokens.is_empty());
    let g = GenerateOptions::new(5)
        .with_stop_tokens([1, 2])
        .with_sampling(p.clone());
    assert_eq!(
        (g.max_tokens, &g.stop_tokens[..], &g.sampling),
        (5, &[1, 2][..], &p)
    );
}

#[test]
fn top_k_keeps_the_k_highest_logits() {
    let logits = [1.0, 3.0, 2.0, 5.0, 4.0, -1.0];
    let s = sampler(SamplingParams::new(1.0).with_top_k(3));
    assert_eq!(ids(&s.candidates(&logits).unwrap()), [3, 4, 1]);
    // k = 1 at any temperature is the argmax; k ≥ the vocabulary (or 0) keeps everything.
    let s = sampler(SamplingParams::new(5.0).with_top_k(1));
    assert_eq!(ids(&s.candidates(&logits).unwrap()), [3]);
    for k in [0, 6, 100] {
        let s = sampler(SamplingParams::new(1.0).with_top_k(k));
        assert_eq!(ids(&s.candidates(&logits).unwrap()), [3, 4, 1, 2, 0, 5]);
    }
    // Ties at the cut: the lower id is kept.
    let s = sampler(SamplingParams::new(1.0).with_top_k(2));
    assert_eq!(ids(&s.candidates(&[0.5, 2.0, 0.5, 0.5]).unwrap()), [1, 0]);
}

#[test]
fn top_p_keeps_the_smallest_nucleus_reaching_p() {
    let logits = ln(&[0.5, 0.25, 0.15, 0.1]);
    for (p, kept) in [
        (0.3, &[0][..]),
        (0.7, &[0, 1][..]),
        (0.8, &[0, 1, 2][..]),
        (0.95, &[0, 1, 2, 3][..]),
        (1.0, &[0, 1, 2, 3][..]),
    ] {
        let s = sampler(SamplingParams::new(1.0).with_top_p(p));
        assert_eq!(ids(&s.candidates(&logits).unwrap()), kept, "top_p {p}");
    }
    // The nucleus is of the distribution top-k left, renormalised: 0.4 and 0.3 become 4/7 and
    // 3/7, so p = 0.55 keeps one token (without top-k, 0.4 < 0.55 would keep two).
    let logits = ln(&[0.4, 0.3, 0.2, 0.1]);
    let s = sampler(SamplingParams::new(1.0).with_top_p(0.55));
    assert_eq!(ids(&s.candidates(&logits).unwrap()), [0, 1]);
    let s = sampler(SamplingParams::new(1.0).with_top_k(2).with_top_p(0.55));
    assert_eq!(ids(&s.candidates(&logits).unwrap()), [0]);
}

#[test]
fn min_p_keeps_tokens_within_a_factor_of_the_best() {
    let logits = ln(&[0.5, 0.25, 0.15, 0.1]);
    for (m, kept) in [
        (0.9, &[0][..]),
        (0.4, &[0, 1][..]),
        (0.25, &[0, 1, 2][..]),
        (0.1, &[0, 1, 2, 3][..]),
        (0.0, &[0, 1, 2, 3][..]),
    ] {
        let s = sampler(SamplingParams::new(1.0).with_min_p(m));
        assert_eq!(ids(&s.candidates(&logits).unwrap()), kept, "min_p {m}");
    }
}

#[test]
fn temperature_reshapes_only_what_the_filters_kept() {
    // Top-p at temperature 1 keeps {0, 1}; temperature 2 then flattens those two.
    let logits = ln(&[0.5, 0.25, 0.15, 0.1]);
    let s = sampler(SamplingParams::new(2.0).with_top_p(0.7));
    let c = s.candidates(&logits).unwrap();
    assert_eq!(ids(&c), [0, 1]);
    let (a, b) = (0.5f64.powf(0.5), 0.25f64.powf(0.5));
    assert!((c[0].prob - a / (a + b)).abs() < 1e-6, "{c:?}");
    assert!((c[1].prob - b / (a + b)).abs() < 1e-6, "{c:?}");
    assert!((c[0].logit - f64::from(logits[0]) / 2.0).abs() < 1e-12);
    // Without filters, every token, with softmax(l / T).
    let s = sampler(SamplingParams::new(0.5));
    let c = s.candidates(&logits).unwrap();
    let w: Vec<f64> = [0.5f64, 0.25, 0.15, 0.1].iter().map(|p| p * p).collect();
    let total: f64 = w.iter().sum();
    for (c, w) in c.iter().zip(&w) {
        assert!((c.prob - w / total).abs() < 1e-6, "{c:?}");
    }
}

#[test]
fn penalties_follow_hf_and_openai() {
    let logits = [2.0f32, -2.0, 1.0, 0.5];
    // Repetition: positive logits divided, negative multiplied, unseen untouched; once per token.
    let mut s = sampler(SamplingParams::new(1.0).with_repetition_penalty(2.0));
    s.accept_all(&[0, 1, 1, 99]); // 99 is beyond the logits: ignored
    assert_eq!((s.seen(0), s.seen(1), s.seen(2)), (1, 2, 0));
    let mut l = logits;
    s.apply_penalties(&mut l);
    assert_eq!(l, [1.0, -4.0, 1.0, 0.5]);
    // Presence once, frequency per occurrence.
    let mut s = sampler(
        SamplingParams::new(1.0)
            .with_presence_penalty(0.5)
            .with_frequency_penalty(0.25),
    );
    s.accept_all(&[0, 1, 1]);
    let mut l = logits;
    s.apply_penalties(&mut l);
    assert_eq!(l, [1.25, -3.0, 1.0, 0.5]);
    // All three: repetition first, then the subtraction.
    let mut s = sampler(
        SamplingParams::new(1.0)
            .with_repetition_penalty(2.0)
            .with_presence_penalty(0.5)
            .with_frequency_penalty(0.25),
    );
    s.accept_all(&[0, 1, 1]);
    let mut l = logits;
    s.apply_penalties(&mut l);
    assert_eq!(l, [0.25, -5.0, 1.0, 0.5]);
    s.clear_history();
    let mut l = logits;
    s.apply_penalties(&mut l);
    assert_eq!(l, logits);

    // Greedy with a penalty: the argmax of the penalised logits, no draw.
    let mut s = sampler(SamplingParams::greedy().with_repetition_penalty(2.0));
    assert_eq!(s.sample(&[3.0, 2.0]).unwrap(), 0);
    s.accept(0);
    assert_eq!(s.sample(&[3.0, 2.0]).unwrap(), 1);
    let c = s.candidates(&[3.0, 2.0]).unwrap();
    assert_eq!((ids(&c), c[0].prob), (vec![1], 1.0));
    // Greedy ties: the lowest id.
    let mut s = sampler(SamplingParams::greedy());
    assert_eq!(s.sample(&[1.0, 4.0, 4.0, -3.0]).unwrap(), 1);
}

#[test]
fn invalid_parameters_are_typed_errors_naming_the_parameter() {
    let nan = f32::NAN;
    let cases: Vec<(SamplingParams, &str)> = vec![
        (SamplingParams::new(nan), "temperature"),
        (SamplingParams::new(-0.5), "temperature"),
        (SamplingParams::new(f32::INFINITY), "temperature"),
        (SamplingParams::new(1.0).with_top_p(0.0), "top_p"),
        (SamplingParams::new(1.0).with_top_p(1.5), "top_p"),
        (SamplingParams::new(1.0).with_top_p(nan), "top_p"),
        (SamplingParams::new(1.0).with_min_p(-0.1), "min_p"),
        (SamplingParams::new(1.0).with_min_p(1.01), "min_p"),
        (SamplingParams::new(1.0).with_min_p(nan), "min_p"),
        (
            SamplingParams::new(1.0).with_repetition_penalty(0.0),
            "repetition_penalty",
        ),
        (
            SamplingParams::new(1.0).with_repetition_penalty(-1.0),
            "repetition_penalty",
        ),
        (
            SamplingParams::greedy().with_repetition_penalty(nan),
            "repetition_penalty",
        ),
        (
            SamplingParams::new(1.0).with_presence_penalty(f32::INFINITY),
            "presence_penalty",
        ),
        (
            SamplingParams::new(1.0).with_frequency_penalty(nan),
            "frequency_penalty",
        ),
    ];
    for (p, want) in cases {
        let given = match want {
            "temperature" => p.temperature,
            "top_p" => p.top_p,
            "min_p" => p.min_p,
            "repetition_penalty" => p.repetition_penalty,
            "presence_penalty" => p.presence_penalty,
            _ => p.frequency_penalty,
        };
        for err in [p.validate().unwrap_err(), Sampler::new(&p).unwrap_err()] {
            match &err {
                Error::InvalidParameter { name, value, .. } => {
                    assert_eq!(*name, want, "{p:?}");
                    assert!(
                        *value == f64::from(given) || (value.is_nan() && given.is_nan()),
                        "{value} vs {given}"
                    );
                }
                other => panic!("{p:?}: expected InvalidParameter, got {other:?}"),
            }
            assert!(err.to_string().contains(want), "{err}");
        }
    }
    // Bad logits are errors too, never a panic.
    let mut s = sampler(SamplingParams::new(1.0));
    for bad in [&[][..], &[1.0, f32::NAN][..], &[f32::INFINITY, 0.0][..]] {
        assert!(matches!(s.sample(bad), Err(Error::Invalid(_))), "{bad:?}");
    }
    assert!(matches!(
        s.sample(&[f32::NEG_INFINITY; 3]),
        Err(Error::Invalid(_))
    ));
    // -inf masks a token: never drawn.
    for _ in 0..200 {
        assert_ne!(s.sample(&[0.0, f32::NEG_INFINITY, 0.0]).unwrap(), 1);
    }
}

#[test]
fn a_seed_fixes_the_draws() {
    let logits: Vec<f32> = (0..50).map(|i| (i as f32 * 0.37).sin()).collect();
    let draws = |p: &SamplingParams| {
        let mut s = Sampler::new(p).unwrap();
        (0..200)
            .map(|_| s.sample(&logits).unwrap())
            .collect::<Vec<_>>()
    };
    let p = SamplingParams::new(1.0).with_seed(42);
    assert_eq!(draws(&p), draws(&p));
    assert_ne!(draws(&p), draws(&p.clone().with_seed(43)));
    // Without a seed one is drawn, reported, and replays the run.
    let s = Sampler::new(&SamplingParams::new(1.0)).unwrap();
    let replay = SamplingParams::new(1.0).with_seed(s.seed());
    let mut s = s;
    let first: Vec<u32> = (0..200).map(|_| s.sample(&logits).unwrap()).collect();
    assert_eq!(first, draws(&replay));
}

// ---------------------------------------------------------------------------------------------
// (b) the draws against the exact distribution

/// The chi-square critical values at p = 1e-4 for 1..=15 degrees of freedom (the upper 1e-4
/// quantile of the chi-square distribution, e.g. 15.137 for 1 and 25.745 for 5, as in any table).
/// A correct sampler fails a check with probability 1e-4; the seeds are fixed, so the test is
/// deterministic anyway.
const CHI2_CRIT_1E4: [f64; 15] = [
    15.137, 18.421, 21.108, 23.513, 25.745, 27.856, 29.878, 31.828, 33.720, 35.564, 37.367, 39.134,
    40.871, 42.579, 44.263,
];

/// The distribution of `logits` under temperature `t`, top-k `k` (0 = off), top-p `p` and min-p
/// `m`, written out from the definitions independently of the sampler: returns the probability
/// of every token (0 for the dropped ones) and the smallest margin by which a top-p decision
/// cleared its threshold.
fn expected(logits: &[f32], t: f64, k: usize, p: f64, m: f64) -> (Vec<f64>, f64) {
    let n = logits.len();
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by(|&a, &b| logits[b].partial_cmp(&logits[a]).unwrap());
    let k = if k == 0 { n } else { k.min(n) };
    let mut kept: Vec<usize> = order[..k].to_vec();
    // top-p over the temperature-1 softmax of the top-k set
    let z: f64 = kept.iter().map(|&i| f64::from(logits[i]).exp()).sum();
    let mut cum = 0.0;
    let mut margin = f64::INFINITY;
    let mut cut = kept.len();
    for (j, &i) in kept.iter().enumerate() {
        cum += f64::from(logits[i]).exp() / z;
        margin = margin.min((cum - p).abs());
        if cum >= p {
            cut = j + 1;
            break;
        }
    }
    if p >= 1.0 {
        cut = kept.len();
        margin = f64::INFINITY;
    }
    kept.truncate(cut);
    // min-p: p_i ≥ m · p_max
    let best = f64::from(logits[kept[0]]).exp();
    kept.retain(|&i| f64::from(logits[i]).exp() >= m * best);
    // temperature over what is left
    let w: Vec<f64> = kept
        .iter()
        .map(|&i| (f64::from(logits[i]) / t).exp())
        .collect();
    let total: f64 = w.iter().sum();
    let mut probs = vec![0.0; n];
    for (&i, w) in kept.iter().zip(&w) {
        probs[i] = w / total;
    }
    (probs, margin)
}

#[test]
fn draws_fit_the_exact_distribution_chi_square() {
    const N: usize = 20_000;
    let logits = [2.0f32, 1.5, 1.0, 0.7, 0.3, 0.0, -0.5, -1.0, 0.9, -2.0];
    // (temperature, top_k, top_p, min_p, seed)
    let configs = [
        (1.0, 0, 1.0, 0.0, 1),
        (0.7, 6, 0.9, 0.0, 2),
        (1.5, 0, 0.8, 0.0, 3),
        (1.3, 8, 1.0, 0.12, 4),
        (0.5, 5, 1.0, 0.0, 5),
        (2.0, 0, 0.97, 0.05, 6),
    ];
    for (t, k, p, m, seed) in configs {
        let (probs, margin) = expected(&logits, t, k, p, m);
        assert!(margin > 1e-3, "top_p {p} sits on a cumulative boundary");
        let params = SamplingParams::new(t as f32)
            .with_top_k(k)
            .with_top_p(p as f32)
            .with_min_p(m as f32)
            .with_seed(seed);
        let mut s = Sampler::new(&params).unwrap();
        // The sampler's own distribution agrees with the independent one.
        let c = s.candidates(&logits).unwrap();
        let kept: Vec<usize> = (0..logits.len()).filter(|&i| probs[i] > 0.0).collect();
        let mut got = ids(&c).into_iter().map(|i| i as usize).collect::<Vec<_>>();
        got.sort_unstable();
        assert_eq!(got, kept, "{params:?}");
        for c in &c {
            assert!(
                (c.prob - probs[c.id as usize]).abs() < 1e-6,
                "{params:?}: {c:?}"
            );
        }

        let mut counts = vec![0usize; logits.len()];
        for _ in 0..N {
            counts[s.sample(&logits).unwrap() as usize] += 1;
        }
        for i in 0..logits.len() {
            if probs[i] == 0.0 {
                assert_eq!(counts[i], 0, "{params:?}: dropped token {i} was drawn");
            }
        }
        let chi2: f64 = kept
            .iter()
            .map(|&i| {
                let e = probs[i] * N as f64;
                (counts[i] as f64 - e).powi(2) / e
            })
            .sum();
        let df = kept.len() - 1;
        if df == 0 {
            continue;
        }
        let crit = CHI2_CRIT_1E4[df - 1];
        eprintln!("{params:?}: kept {kept:?}, chi2 {chi2:.2} (df {df}, critical {crit})");
        assert!(
            chi2 < crit,
            "{params:?}: chi2 {chi2:.2} ≥ {crit} (df {df}): counts {counts:?} vs probabilities {probs:?}"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// (c) Model::generate on the tiny model in BPF

const PROMPT: [u32; 5] = [785, 3974, 13876, 38835, 916];

fn generate(model: &mut Model, prompt: &[u32], opts: &GenerateOptions) -> Vec<u32> {
    model.reset();
    model
        .generate(prompt, opts)
        .expect("generate")
        .collect::<qwen_bpf::Result<Vec<u32>>>()
        .expect("generation")
}

#[test]
fn greedy_generation_is_next_token_in_a_loop() {
    let dir = common::tiny_model("sampling-tiny");
    // One thread: one kernel invocation per token, never a per-operator fallback (which a busy
    // machine can cause when two threads must meet), so that runs count forward passes.
    let opts = ModelOptions::default().with_max_context(64).with_threads(1);
    let mut m = common::open(&dir, opts);
    // The exact head, so that every token costs the same BPF runs (the screened head backs off
    // adaptively and runs a varying number); the token is the same either way (tests/screen.rs).
    m.set_screened_head(false);
    let n = 24;
    // Today's greedy loop: every prompt token through next_token, then the argmax fed back.
    let mut want = Vec::new();
    let mut next = 0;
    for &t in &PROMPT {
        next = m.next_token(t).unwrap();
    }
    for _ in 0..n {
        want.push(next);
        next = m.next_token(next).unwrap();
    }
    let runs_per_token = {
        m.reset();
        let r = m.bpf_runs();
        m.next_token(PROMPT[0]).unwrap();
        m.bpf_runs() - r
    };
    // the prompt before its last token goes through prefill, in a block (per operator)
    let prefill_runs = {
        m.reset();
        let r = m.bpf_runs();
        m.prefill(&PROMPT[..PROMPT.len() - 1]).unwrap();
        m.bpf_runs() - r
    };

    let r0 = m.bpf_runs();
    m.reset();
    let mut g = m.generate(&PROMPT, &GenerateOptions::new(n)).unwrap();
    let got: Vec<u32> = g.by_ref().map(Result::unwrap).collect();
    assert_eq!(got, want);
    assert_eq!(g.finish_reason(), Some(FinishReason::MaxTokens));
    assert_eq!(
        (g.generated(), g.decode_steps(), g.prompt_len()),
        (n, n - 1, 5)
    );
    assert_eq!(g.seed(), None, "greedy decoding draws nothing");
    // The last token yielded is not fed.
    assert_eq!(g.model().position(), PROMPT.len() + n - 1);
    assert!(g.next().is_none(), "an ended generation stays ended");
    drop(g);
    assert_eq!(
        m.bpf_runs() - r0,
        prefill_runs + n as u64 * runs_per_token,
        "the prompt's prefill, then one forward pass per token, argmax in BPF"
    );

    // Sampling goes through the Q16 logits and the integer sampler; top-k 1 at any temperature
    // is still the argmax.
    let top1 = GenerateOptions::new(n).with_sampling(SamplingParams::new(1.5).with_top_k(1));
    assert_eq!(generate(&mut m, &PROMPT, &top1), want);

    // A stop token ends the generation without being yielded.
    let stop = want[7];
    let first = want.iter().position(|&t| t == stop).unwrap();
    m.reset();
    let mut g = m
        .generate(&PROMPT, &GenerateOptions::new(n).with_stop_tokens([stop]))
        .unwrap();
    let got: Vec<u32> = g.by_ref().map(Result::unwrap).collect();
    assert_eq!(got, want[..first]);
    assert_eq!(g.finish_reason(), Some(FinishReason::Stop(stop)));

    // max_tokens 0 only feeds the prompt.
    m.reset();
    let mut g = m.generate(&PROMPT, &GenerateOptions::new(0)).unwrap();
    assert!(g.next().is_none());
    assert_eq!(g.finish_reason(), Some(FinishReason::MaxTokens));
    assert_eq!(g.model().position(), PROMPT.len());
}

#[test]
fn a_full_context_ends_generation_cleanly() {
    let dir = common::tiny_model("sampling-tiny");
    // Room for the prompt and 3 more tokens: 4 are yielded (the last is never fed).
    let mut m = common::open(
        &dir,
        ModelOptions::default().with_max_context(PROMPT.len() + 3),
    );
    for opts in [
        GenerateOptions::new(100),
        GenerateOptions::new(100).with_sampling(SamplingParams::new(1.0).with_seed(3)),
    ] {
        m.reset();
        let mut g = m.generate(&PROMPT, &opts).unwrap();
        let got: Vec<u32> = g.by_ref().map(Result::unwrap).collect();
        assert_eq!(got.len(), 4, "{opts:?}");
        assert_eq!(g.finish_reason(), Some(FinishReason::ContextFull));
        assert_eq!(g.model().position(), g.model().max_context());
    }
    // A prompt that fills the context exactly still yields its one token.
    let mut m = common::open(&dir, ModelOptions::default().with_max_context(PROMPT.len()));
    let mut g = m.generate(&PROMPT, &GenerateOptions::new(10)).unwrap();
    assert!(g.next().unwrap().is_ok());
    assert!(g.next().is_none());
    assert_eq!(g.finish_reason(), Some(FinishReason::ContextFull));
}

#[test]
fn seeds_fix_sampled_generations() {
    let dir = common::tiny_model("sampling-tiny");
    let mut m = common::open(&dir, ModelOptions::default().with_max_context(64));
    let n = 32;
    let opts =
        |seed| GenerateOptions::new(n).with_sampling(SamplingParams::new(1.5).with_seed(seed));
    let a = generate(&mut m, &PROMPT, &opts(11));
    assert_eq!(a.len(), n);
    assert_eq!(
        generate(&mut m, &PROMPT, &opts(11)),
        a,
        "same seed, same tokens"
    );

    // How likely would another seed be to repeat `a` exactly? The product of the probabilities
    // the sampler gave each token of `a` along the way: far below anything a test could hit.
    let s = Sampler::new(&opts(11).sampling).unwrap();
    m.reset();
    let mut logits = m.prefill(&PROMPT).unwrap().to_vec();
    let mut log_p = 0.0;
    for &t in &a {
        let c = s.candidates(&logits).unwrap();
        let p = c
            .iter()
            .find(|c| c.id == t)
            .expect("a drawn token is a candidate")
            .prob;
        log_p += p.ln();
        logits = m.forward(t).unwrap().to_vec();
    }
    eprintln!("P(another seed repeats the {n} tokens) = e^{log_p:.1}");
    assert!(
        log_p < (1e-9f64).ln(),
        "the tiny model is too sure: e^{log_p}"
    );
    let b = generate(&mut m, &PROMPT, &opts(12));
    assert_eq!(b.len(), n);
    assert_ne!(b, a, "another seed, other tokens");

    // Penalties make the sampler see the prompt and what it generated: a strong presence
    // penalty (the largest the integer sampler takes) at temperature 0 never repeats a token.
    let no_repeat = GenerateOptions::new(16)
        .with_sampling(SamplingParams::greedy().with_presence_penalty(64.0));
    let g = generate(&mut m, &PROMPT, &no_repeat);
    let mut all = PROMPT.to_vec();
    all.extend(&g);
    let mut uniq = all.clone();
    uniq.sort_unstable();
    uniq.dedup();
    assert_eq!(uniq.len(), all.len(), "{all:?}");
}

#[test]
fn generate_checks_everything_before_feeding() {
    let dir = common::tiny_model("sampling-tiny");
    let mut m = common::open(&dir, ModelOptions::default().with_max_context(8));
    let vocab = m.config().vocab_size;
    let bad = GenerateOptions::new(4).with_sampling(SamplingParams::new(f32::NAN));
    assert!(matches!(
        m.generate(&PROMPT, &bad),
        Err(Error::InvalidParameter {
            name: "temperature",
            ..
        })
    ));
    let opts = GenerateOptions::new(4);
    assert!(matches!(m.generate(&[], &opts), Err(Error::EmptyPrompt)));
    match m.generate(&[1, 2, vocab as u32], &opts) {
        Err(Error::TokenOutOfRange { id, index: 2, .. }) => assert_eq!(id as usize, vocab),
        other => panic!("expected TokenOutOfRange, got {other:?}"),
    }
    assert!(matches!(
        m.generate(&[1; 9], &opts),
        Err(Error::ContextOverflow { .. })
    ));
    assert_eq!(m.position(), 0, "nothing was fed");
    // The model is fine afterwards.
    assert_eq!(m.generate(&PROMPT, &opts).unwrap().count(), 4);
}

#[test]
fn text_streaming_matches_decoding_the_tokens() {
    let dir = common::tiny_model_with_tokenizer("sampling-text");
    let tok = Tokenizer::from_model_dir(&dir).unwrap();
    let mut m = common::open(&dir, ModelOptions::default().with_max_context(64));
    let opts = GenerateOptions::new(24).with_sampling(SamplingParams::new(1.0).with_seed(5));
    let tokens = generate(&mut m, &PROMPT, &opts);
    m.reset();
    let mut text = m.generate(&PROMPT, &opts).unwrap().text(&tok);
    let mut pieces = Vec::new();
    let mut unknown = 0;
    for piece in &mut text {
        match piece {
            Ok(p) => {
                assert!(!p.is_empty());
                pieces.push(p);
            }
            // A padding row of the embedding table: no token; skipped.
            Err(Error::TokenOutOfRange { .. }) => unknown += 1,
            Err(e) => panic!("{e}"),
        }
    }
    assert_eq!(text.finish_reason(), Some(FinishReason::MaxTokens));
    assert_eq!(text.tokens().generated(), 24);
    let known: Vec<u32> = tokens
        .iter()
        .copied()
        .filter(|&t| (t as usize) < tok.vocab_size())
        .collect();
    assert_eq!(unknown, tokens.len() - known.len());
    assert_eq!(pieces.concat(), tok.decode(&known).unwrap());
}

// ---------------------------------------------------------------------------------------------
// (d) the generate example's flags

/// Runs the `generate` example on `dir` with the fixed prompt ids and `extra` flags; returns
/// stdout and stderr.
fn run_generate(dir: &Path, extra: &[&str]) -> (String, String) {
    let o = Command::new(common::example_bin("generate"))
        .args(["--model", dir.to_str().unwrap()])
        .args(["--tokens", "785,3974,13876", "--max-tokens", "24"])
        .args(extra)
        .output()
        .unwrap();
    let (out, err) = (
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    );
    assert!(o.status.success(), "generate {extra:?}: {err}");
    assert!(err.contains("--- stopped:"), "{err}");
    (out, err)
}

#[test]
fn generate_example_samples_repeatably() {
    // No tokenizer.json: the prompt is given as ids and the output is printed as <id> tokens.
    let dir = common::model_with(
        "sampling-example",
        &Preset::Tiny.config(),
        &SynthOptions::default(),
    );
    assert!(!dir.join("tokenizer.json").exists());
    let flags = |seed| {
        [
            "--temperature",
            "0.8",
            "--top-k",
            "40",
            "--top-p",
            "0.95",
            "--seed",
            seed,
        ]
    };
    let (a, err) = run_generate(&dir, &flags("7"));
    assert_eq!(a.matches('<').count(), 24, "{a}");
    assert!(err.contains("seed 7"), "{err}");
    let (b, _) = run_generate(&dir, &flags("7"));
    assert_eq!(a, b, "same seed, same text");
    let (c, _) = run_generate(&dir, &flags("8"));
    assert_ne!(a, c, "another seed, other text");

    // --temperature 0 is the default greedy output.
    let (greedy, err) = run_generate(&dir, &[]);
    assert!(!err.contains("sampling:"), "{err}");
    let (t0, _) = run_generate(&dir, &["--temperature", "0"]);
    assert_eq!(t0, greedy);
    assert_ne!(greedy, a);

    // Bad values are refused before loading anything.
    let o = Command::new(common::example_bin("generate"))
        .args(["--model", dir.to_str().unwrap(), "--tokens", "1"])
        .args(["--top-p", "0"])
        .output()
        .unwrap();
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("top_p"), "{err}");
    assert!(!err.contains("loading"), "{err}");
}
