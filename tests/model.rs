//! The whole BPF forward pass on the synthetic tiny checkpoint: bit for bit equal to its Rust twin,
//! within the accuracy bounds of the f32 reference, and typed errors for bad input.

mod common;

use qwen_bpf::verify::twin::TwinModel;
use qwen_bpf::{Checkpoint, Dispatch, Error, Forward, Model, ModelOptions, Reference};

const TOKENS: [u32; 16] = [
    785, 3974, 13876, 38835, 916, 279, 15678, 5562, 13, 151644, 0, 9707, 11, 1879, 220, 108386,
];

#[test]
fn bpf_forward_equals_twin_bit_for_bit_and_counts_runs() {
    let dir = common::tiny_model("model-tiny");
    let open = |threads, dispatch| {
        let opts = ModelOptions::default()
            .with_max_context(32)
            .with_threads(threads)
            .with_dispatch(dispatch);
        common::open(&dir, opts)
    };
    let mut per_op = open(1, Dispatch::PerOp);
    // (model, BPF runs per token): the kernel runs the whole step in one invocation per thread
    let mut kernel = [
        (open(1, Dispatch::Kernel), 1),
        (open(2, Dispatch::Kernel), 2),
        (open(2, Dispatch::PerOp), 0),
    ];
    assert_eq!(kernel[1].0.dispatch(), Dispatch::Kernel);
    let mut twin = TwinModel::open(&dir, &dir, 32).unwrap();
    let layers = per_op.config().num_hidden_layers as u64;
    for (i, &t) in TOKENS.iter().enumerate() {
        let before = per_op.bpf_runs();
        let got = per_op.forward_fixed(t).unwrap().to_vec();
        assert_eq!(
            per_op.bpf_runs() - before,
            8 * layers + 3,
            "BPF runs for token {i} on one thread, per operator"
        );
        let (want, best) = twin.forward(t).unwrap();
        assert_eq!(got, want, "logits at position {i}: BPF vs Rust twin");
        for (m, runs) in &mut kernel {
            let (before, fell_back) = (m.bpf_runs(), m.kernel_fallbacks());
            let what = format!("{} threads, {:?}", m.plan().unwrap().threads, m.dispatch());
            assert_eq!(
                m.forward_fixed(t).unwrap(),
                want,
                "logits at position {i}: BPF ({what}) vs Rust twin"
            );
            // (a token whose two threads could not meet, on a busy machine, ran per operator)
            if *runs > 0 && m.kernel_fallbacks() == fell_back {
                assert_eq!(
                    m.bpf_runs() - before,
                    *runs,
                    "BPF runs for token {i} ({what})"
                );
            }
        }
        let argmax = got
            .iter()
            .enumerate()
            .max_by_key(|&(j, &v)| (v, std::cmp::Reverse(j)))
            .unwrap()
            .0;
        assert_eq!(argmax, best, "twin argmax at position {i}");
    }
    assert_eq!(
        kernel[0].0.kernel_fallbacks(),
        0,
        "one thread never falls back"
    );
    assert!(
        kernel[1].0.kernel_fallbacks() <= TOKENS.len() as u64 / 4,
        "most two-thread kernel runs met at their barriers: {} fallbacks",
        kernel[1].0.kernel_fallbacks()
    );
}

#[test]
fn bpf_forward_is_within_bounds_of_the_f32_reference() {
    let dir = common::tiny_model("model-tiny");
    let mut m = common::open(&dir, ModelOptions::default().with_max_context(32));
    let mut r = Reference::new(&Checkpoint::open(&dir).unwrap(), 32).unwrap();
    let (mut sum, mut n, mut worst) = (0f64, 0usize, 0f32);
    for (i, &t) in TOKENS.iter().enumerate() {
        let got = m.forward(t).unwrap().to_vec();
        let want = r.forward(t).unwrap().to_vec();
        let max = got
            .iter()
            .zip(&want)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        sum += got
            .iter()
            .zip(&want)
            .map(|(a, b)| (a - b).abs() as f64)
            .sum::<f64>();
        n += got.len();
        worst = worst.max(max);
        let mut sorted = want.clone();
        sorted.sort_by(|a, b| b.total_cmp(a));
        let ref_best = want
            .iter()
            .enumerate()
            .max_by(|a, b| a.1.total_cmp(b.1))
            .unwrap()
            .0;
        let got_best = got
            .iter()
            .enumerate()
            .max_by(|a, b| a.1.total_cmp(b.1))
            .unwrap()
            .0;
        if sorted[0] - sorted[1] > 2.0 * max {
            assert_eq!(
                got_best,
                ref_best,
                "argmax at position {i} (gap {} > 2 × max err {max})",
                sorted[0] - sorted[1]
            );
        }
    }
    let mean = sum / n as f64;
    eprintln!("tiny: mean |Δlogit| {mean:.6}, max {worst:.6}");
    assert!(mean <= 0.0004, "mean |Δlogit| {mean} > 0.0004");
    assert!(worst <= 0.004, "max |Δlogit| {worst} > 0.004");
}

#[test]
fn next_token_is_the_argmax_of_forward_and_reset_replays() {
    let dir = common::tiny_model("model-tiny");
    let mut a = common::open(&dir, ModelOptions::default().with_max_context(32));
    let mut b = common::open(&dir, ModelOptions::default().with_max_context(32));
    for &t in &TOKENS[..6] {
        let logits = a.forward_fixed(t).unwrap();
        let best = logits
            .iter()
            .enumerate()
            .max_by_key(|&(j, &v)| (v, std::cmp::Reverse(j)))
            .unwrap()
            .0;
        assert_eq!(
            b.next_token(t).unwrap() as usize,
            best,
            "next_token vs argmax of forward"
        );
    }
    let first = {
        a.reset();
        a.forward_fixed(TOKENS[0]).unwrap()
    };
    b.reset();
    assert_eq!(
        b.forward_fixed(TOKENS[0]).unwrap(),
        first,
        "after reset, position 0 again"
    );
    assert_eq!(b.position(), 1);
}

#[test]
fn bad_tokens_and_context_overflow_are_typed_errors() {
    let dir = common::tiny_model("model-tiny");
    let mut m = common::open(&dir, ModelOptions::default().with_max_context(3));
    let vocab = m.config().vocab_size as u32;
    match m.forward(vocab) {
        Err(Error::TokenOutOfRange {
            id,
            index: 0,
            vocab: v,
        }) => assert_eq!((id, v), (vocab, vocab as usize)),
        other => panic!("token id = vocab: want TokenOutOfRange, got {other:?}"),
    }
    for &t in &TOKENS[..3] {
        m.forward(t).unwrap();
    }
    match m.forward(1) {
        Err(Error::ContextOverflow {
            pos: 3,
            max_context: 3,
            tokens: 1,
        }) => {}
        other => panic!("4th token with max_context 3: want ContextOverflow, got {other:?}"),
    }
    match Model::open(
        &dir,
        &ModelOptions {
            max_context: 0,
            ..Default::default()
        },
    ) {
        Err(Error::Invalid(msg)) => assert!(msg.contains("max_context"), "{msg}"),
        other => panic!("max_context 0: want Invalid, got {other:?}"),
    }
}

#[test]
fn model_is_send_and_runs_on_another_thread() {
    fn assert_send<T: Send>(_: &T) {}
    let dir = common::tiny_model("model-tiny");
    let mut m = common::open(&dir, ModelOptions::default().with_max_context(8));
    assert_send(&m);
    let first = m.forward_fixed(TOKENS[0]).unwrap().to_vec();
    let mut m = std::thread::spawn(move || {
        m.reset();
        assert_eq!(
            m.forward_fixed(TOKENS[0]).unwrap(),
            first,
            "same logits on another thread"
        );
        m
    })
    .join()
    .unwrap();
    assert_eq!(m.position(), 1);
    m.reset();
}

/// [`Forward`] drives the BPF model and the f32 reference alike: rewinding and feeding the same
/// token again reproduces its logits exactly, rewinding past the position is refused, and reset
/// starts over. The borrowed logits have the vocabulary's length.
#[test]
fn forward_trait_rewinds_and_resets_model_and_reference_alike() {
    let dir = common::tiny_model("model-tiny");
    let mut m = common::open(&dir, ModelOptions::default().with_max_context(8));
    let mut r = Reference::new(&Checkpoint::open(&dir).unwrap(), 8).unwrap();
    let engines: [(&str, &mut dyn Forward); 2] = [("model", &mut m), ("reference", &mut r)];
    for (name, e) in engines {
        let first: Vec<Vec<f32>> = TOKENS[..4]
            .iter()
            .map(|&t| e.forward(t).unwrap().to_vec())
            .collect();
        assert_eq!(first[0].len(), e.config().vocab_size, "{name}");
        assert_eq!((e.position(), e.max_context()), (4, 8), "{name}");
        e.rewind(2).unwrap();
        assert_eq!(e.position(), 2, "{name}");
        assert_eq!(
            e.forward(TOKENS[2]).unwrap(),
            first[2],
            "{name} after rewind"
        );
        assert!(
            matches!(
                e.rewind(4),
                Err(Error::InvalidParameter {
                    name: "position",
                    ..
                })
            ),
            "{name}: rewind forward"
        );
        assert_eq!(e.position(), 3, "{name}: a refused rewind changes nothing");
        e.reset();
        assert_eq!(e.position(), 0, "{name}");
        assert_eq!(
            e.forward(TOKENS[0]).unwrap(),
            first[0],
            "{name} after reset"
        );
    }
}
