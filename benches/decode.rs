//! Decode speed and kernel throughput.
//!
//! ```text
//! cargo bench --bench decode                 # both groups
//! cargo bench --bench decode -- kernels      # one group
//! ```
//!
//! * `decode`: time per generated token (one forward pass with greedy argmax) of the f32
//!   reference (one thread) and of each BPF weight store, on the synthetic Qwen3-0.6B of
//!   `qwen_bpf::default_model` (generated once, ~1.2 GB, plus each store's cache on its first
//!   load), or on the model directory in `$QWEN_BPF_BENCH_MODEL`. Throughput is tokens/s.
//! * `kernels`: the plain Q24 matrix-vector product, BPF (`Ops::matvec`) vs its Rust twin
//!   (`qwen_bpf::fixed::matvec`), at the 0.6B shapes. Throughput elements are multiply-adds, so
//!   criterion's `elem/s` is MAC/s.
//!
//! Needs root (or CAP_BPF + CAP_PERFMON). Sample sizes are small so that the run takes a few
//! minutes on two cores.

use std::hint::black_box;
use std::path::PathBuf;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use qwen_bpf::fixed;
use qwen_bpf::kernel::arena::Region;
use qwen_bpf::kernel::ops::Ops;
use qwen_bpf::reference::Reference;
use qwen_bpf::{default_model, Backend, Checkpoint, Model, ModelOptions};

/// The weight stores the decode group times, after the reference. A new store is one line here.
const STORES: &[Backend] = &[Backend::Q24];

/// KV-cache capacity; an engine is reset when its context is full.
const MAX_CONTEXT: usize = 128;

/// The first token fed (" The"); the rest are the engine's own greedy choices.
const FIRST_TOKEN: u32 = 785;

/// Matrix shapes `rows × cols` of the kernel group: o_proj-like, gate/up-like, down_proj-like.
const SHAPES: [(usize, usize); 3] = [(1024, 1024), (3072, 1024), (1024, 3072)];

fn model_dir() -> PathBuf {
    match std::env::var_os("QWEN_BPF_BENCH_MODEL") {
        Some(dir) if !dir.is_empty() => PathBuf::from(dir),
        _ => default_model::ensure_default_model(None, true).expect("generating the default model"),
    }
}

fn index_of_max(v: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &x) in v.iter().enumerate() {
        if x > v[best] {
            best = i;
        }
    }
    best as u32
}

fn decode(c: &mut Criterion) {
    let dir = model_dir();
    let mut g = c.benchmark_group("decode");
    g.sample_size(10)
        .warm_up_time(Duration::from_secs(3))
        .measurement_time(Duration::from_secs(20))
        .throughput(Throughput::Elements(1));

    {
        let ck = Checkpoint::open(&dir).expect("opening the model");
        let mut r = Reference::new(&ck, MAX_CONTEXT).expect("loading the f32 reference");
        drop(ck);
        let mut token = FIRST_TOKEN;
        g.bench_function("reference", |b| {
            b.iter(|| {
                if r.position() == MAX_CONTEXT {
                    r.reset();
                }
                token = index_of_max(&r.forward(token).expect("reference forward"));
                black_box(token)
            })
        });
    }

    for &backend in STORES {
        let opts = ModelOptions {
            backend,
            max_context: MAX_CONTEXT,
            cache_dir: None,
            progress: true,
            ..Default::default()
        };
        let mut m = Model::open(&dir, &opts)
            .unwrap_or_else(|e| panic!("opening the {} store: {e}", backend.name()));
        let mut token = FIRST_TOKEN;
        g.bench_function(backend.name(), |b| {
            b.iter(|| {
                if m.position() == MAX_CONTEXT {
                    m.reset();
                }
                token = m.next_token(token).expect("BPF forward");
                black_box(token)
            })
        });
    }
    g.finish();
}

/// xorshift64*: deterministic data, uniform in `[-m, m]`.
fn random_vec(seed: u64, n: usize, m: i64) -> Vec<i32> {
    let mut s = seed;
    (0..n)
        .map(|_| {
            s ^= s >> 12;
            s ^= s << 25;
            s ^= s >> 27;
            let r = s.wrapping_mul(0x2545_F491_4F6C_DD1D);
            ((r % (2 * m as u64 + 1)) as i64 - m) as i32
        })
        .collect()
}

fn kernels(c: &mut Criterion) {
    let bytes: usize = SHAPES
        .iter()
        .map(|&(r, k)| (r * k + k + r) * 4 + 3 * 4096)
        .sum();
    let mut ops = Ops::load(bytes).expect("loading the operator programs (needs root / CAP_BPF)");
    let mut g = c.benchmark_group("kernels");
    g.sample_size(20)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(4));
    for (i, &(rows, cols)) in SHAPES.iter().enumerate() {
        // Typical magnitudes: weights ~0.05 in Q24, activations ~4 in Q16.
        let w = random_vec(2 * i as u64 + 1, rows * cols, 1 << 20);
        let x = random_vec(2 * i as u64 + 2, cols, 1 << 18);
        let put = |ops: &mut Ops, data: &[i32], what: &str| -> Region {
            let r = ops.arena.alloc(data.len() * 4, what).expect("arena space");
            ops.arena.slice_mut::<i32>(r).copy_from_slice(data);
            r
        };
        let (rw, rx) = (put(&mut ops, &w, "W"), put(&mut ops, &x, "x"));
        let ry = ops.arena.alloc(rows * 4, "y").expect("arena space");
        let shape = format!("{rows}x{cols}");
        g.throughput(Throughput::Elements((rows * cols) as u64));
        g.bench_function(BenchmarkId::new("matvec_q24_bpf", &shape), |b| {
            b.iter(|| {
                ops.matvec(rw, rx, ry, cols, 0..rows, false)
                    .expect("BPF matvec")
            })
        });
        let mut y = vec![0i32; rows];
        g.bench_function(BenchmarkId::new("matvec_q24_twin", &shape), |b| {
            b.iter(|| fixed::matvec(black_box(&w), black_box(&x), 0..rows, black_box(&mut y)))
        });
        let mut want = vec![0i32; rows];
        fixed::matvec(&w, &x, 0..rows, &mut want);
        assert_eq!(
            ops.arena.slice::<i32>(ry),
            &want[..],
            "{shape}: BPF matvec differs from its twin"
        );
    }
    g.finish();
}

criterion_group!(benches, decode, kernels);
criterion_main!(benches);
