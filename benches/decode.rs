//! Decode speed and kernel throughput.
//!
//! ```text
//! cargo bench --bench decode                 # both groups
//! cargo bench --bench decode -- kernels      # one group
//! ```
//!
//! * `decode`: time per generated token (one forward pass with greedy argmax) of the f32
//!   reference (one thread) and of each BPF weight store, on the synthetic Qwen3-0.6B of
//!   `qwen_bpf::hf::default_model` (generated once, ~1.2 GB, plus each store's cache on its first
//!   load), or on the model directory in `$QWEN_BPF_BENCH_MODEL`. Throughput is tokens/s.
//! * `reference_parallel`: the f32 reference's time per token on one thread and on all the
//!   machine's threads (`Reference::set_threads`), at positions 1 to 32 of its context (then a
//!   reset, outside the timing), on the same model; its load time is printed:
//!   `cargo bench --bench decode -- reference_parallel`.
//! * `dispatch`: per store (q24, int4, int8), one decode step per operator run from user space
//!   (`per-op`) and as one `run_plan` invocation per thread (`kernel`), each with the store's
//!   default head (q24: screened) and with the full exact head (`-exact`), and 8 tokens
//!   generated in the kernel per iteration (`kernel-loop`, exact head), on one model per store
//!   switched between them (`Model::set_dispatch`): `cargo bench --bench decode -- dispatch`.
//! * `screened_head`: `next_token` with the screened LM head (`qwen_bpf::num::bound`, the default)
//!   against the full exact head, for the q24 and int4 stores, on one model per store switched
//!   between the two (`Model::set_screened_head`), so that their ratio is measured in one run:
//!   `cargo bench --bench decode -- screened_head`.
//! * `kernels`: the plain Q24 matrix-vector product, BPF (`Ops::matvec`) vs its Rust twin
//!   (`qwen_bpf::num::fixed::matvec`), and the SWAR W4A8 / W8A16 kernels (`Ops::w4a8_matvec`,
//!   `Ops::w8a16_matvec`) vs theirs (`qwen_bpf::num::swar::matvec_quantized`), at the 0.6B shapes, in
//!   one run so that their ratios are comparable. Throughput elements are multiply-adds, so
//!   criterion's `elem/s` is MAC/s.
//!
//! * `batched`: the weight-bearing operators of a prefill block on one and on two threads, at
//!   the 0.6B shapes: `Ops::matvec_batch` (Q24) and `Ops::swar_matvec_batch` (W4A8, W8A16) for
//!   one vector and for a block of `PREFILL_BLOCK` vectors, so that the gain of the block and of
//!   the second core are read as ratios within one run (`elem/s` is MAC/s):
//!   `cargo bench --bench decode -- batched`.
//!
//! * `threads`: the rest of the step on one and on two threads: one layer's attention at
//!   position 4,095 (Q16 and int8 caches), the embedding row and the LM head argmax (Q24 and
//!   W8A16) at the 0.6B shape: `cargo bench --bench decode -- threads`.
//!
//! * `layers`: one greedy decode step (`next_token`, each store's default dispatch and head) of
//!   the q24 and int4 stores on each memory layer this host gives (`arena`, `array`: issue 35;
//!   a layer the host refuses is skipped with its cause), beside the Rust twin of the q24 store
//!   (`twin/q24`: `qwen_bpf::verify::twin::TwinModel`, the same integers in user space, one
//!   thread), all in one run: `cargo bench --bench decode -- layers`.
//!
//! Needs root (or CAP_BPF + CAP_PERFMON). Sample sizes are small so that the run takes a few
//! minutes on two cores.

use std::hint::black_box;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use qwen_bpf::kernel::arena::Region;
use qwen_bpf::kernel::memory::LayerProbe;
use qwen_bpf::kernel::operators::Batch;
use qwen_bpf::kernel::ops::Ops;
use qwen_bpf::num::{fixed, swar};
use qwen_bpf::verify::reference::{self, Reference};
use qwen_bpf::verify::twin::TwinModel;
use qwen_bpf::{Backend, Checkpoint, Dispatch, GenerateOptions, MemoryLayer, Model, ModelOptions};

#[path = "../tests/common/rng.rs"]
mod rng;

/// The weight stores the decode group times, after the reference. A new store is one line here.
const STORES: &[Backend] = &Backend::ALL;

/// KV-cache capacity; an engine is reset when its context is full.
const MAX_CONTEXT: usize = 128;

/// The first token fed (" The"); the rest are the engine's own greedy choices.
const FIRST_TOKEN: u32 = 785;

/// Matrix shapes `rows × cols` of the kernel group: o_proj-like, gate/up-like, down_proj-like.
const SHAPES: [(usize, usize); 3] = [(1024, 1024), (3072, 1024), (1024, 3072)];

fn model_dir() -> PathBuf {
    match std::env::var_os("QWEN_BPF_BENCH_MODEL") {
        Some(dir) if !dir.is_empty() => PathBuf::from(dir),
        _ => qwen_bpf::ensure_default_model(None, true).expect("generating the default model"),
    }
}

/// Whether criterion's name filter (the first free command-line argument, if any) may select
/// benchmarks of `group`: the groups' setup (loading models) is skipped otherwise.
fn selected(group: &str) -> bool {
    match std::env::args().skip(1).find(|a| !a.starts_with('-')) {
        Some(f) => group.contains(f.as_str()) || f.starts_with(group),
        None => true,
    }
}

fn decode(c: &mut Criterion) {
    if !selected("decode") {
        return;
    }
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
                token = reference::argmax(&r.forward(token).expect("reference forward")) as u32;
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
        g.bench_function(backend.name(), |b| next_token_steps(b, &mut m, &mut token));
    }
    g.finish();
}

/// Positions the `reference_parallel` group times (1 to this) before it starts over.
const REFERENCE_POSITIONS: usize = 32;

/// Tokens fed by the `reference_parallel` group, in turn (ordinary Qwen3 ids).
const REFERENCE_TOKENS: [u32; 8] = [FIRST_TOKEN, 3974, 13876, 38835, 916, 279, 15678, 5562];

fn reference_parallel(c: &mut Criterion) {
    if !selected("reference_parallel") {
        return;
    }
    let dir = model_dir();
    let ck = Checkpoint::open(&dir).expect("opening the model");
    let t0 = Instant::now();
    let mut r = Reference::new(&ck, 256).expect("loading the f32 reference");
    eprintln!(
        "reference_parallel: {}: loaded {} parameters as f32 in {:.1} s",
        dir.display(),
        ck.config.num_parameters(),
        t0.elapsed().as_secs_f64()
    );
    drop(ck);
    let max_threads = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    let mut g = c.benchmark_group("reference_parallel");
    g.sample_size(10)
        .warm_up_time(Duration::from_secs(3))
        .measurement_time(Duration::from_secs(20))
        .throughput(Throughput::Elements(1));
    let mut counts = vec![1];
    if max_threads > 1 {
        counts.push(max_threads); // (criterion's ids must differ)
    }
    for threads in counts {
        r.set_threads(threads);
        r.reset();
        g.bench_function(BenchmarkId::new("reference", format!("t{threads}")), |b| {
            b.iter_custom(|iters| {
                let mut spent = Duration::ZERO;
                for _ in 0..iters {
                    if r.position() == 0 || r.position() > REFERENCE_POSITIONS {
                        r.reset();
                        r.forward(REFERENCE_TOKENS[0]).expect("reference forward");
                    }
                    let token = REFERENCE_TOKENS[r.position() % REFERENCE_TOKENS.len()];
                    let t = Instant::now();
                    black_box(r.forward(token).expect("reference forward"));
                    spent += t.elapsed();
                }
                spent
            })
        });
    }
    g.finish();
}

/// `backend`'s model with the default options and a context of [`MAX_CONTEXT`].
fn open_store(dir: &std::path::Path, backend: Backend) -> Model {
    let opts = ModelOptions {
        backend,
        max_context: MAX_CONTEXT,
        progress: true,
        ..Default::default()
    };
    Model::open(dir, &opts).unwrap_or_else(|e| panic!("opening the {} store: {e}", backend.name()))
}

/// One greedy decode step per iteration: `next_token`, from a fresh context when it is full.
fn next_token_steps(b: &mut criterion::Bencher<'_>, m: &mut Model, token: &mut u32) {
    b.iter(|| {
        if m.position() == MAX_CONTEXT {
            m.reset();
        }
        *token = m.next_token(*token).expect("BPF forward");
        black_box(*token)
    })
}

/// Tokens one `kernel-loop` iteration generates in the kernel.
const LOOP_TOKENS: usize = 8;

fn dispatch(c: &mut Criterion) {
    if !selected("dispatch") {
        return;
    }
    let dir = model_dir();
    let mut g = c.benchmark_group("dispatch");
    g.sample_size(10)
        .warm_up_time(Duration::from_secs(2))
        .measurement_time(Duration::from_secs(10));
    for backend in [Backend::Q24, Backend::Int4, Backend::Int8] {
        let mut m = open_store(&dir, backend);
        let mut token = FIRST_TOKEN;
        g.throughput(Throughput::Elements(1));
        // per-op: one test_run per operator run; kernel: one run_plan invocation per thread
        // and token. Both with the store's default head (q24: screened, the kernel running the
        // plan up to the head and the screen following), and with the full exact head (-exact).
        for (name, d, screened) in [
            ("per-op", Dispatch::PerOp, true),
            ("kernel", Dispatch::Kernel, true),
            ("per-op-exact", Dispatch::PerOp, false),
            ("kernel-exact", Dispatch::Kernel, false),
        ] {
            m.set_dispatch(d).expect("a planned store");
            m.set_screened_head(screened);
            g.bench_function(BenchmarkId::new(backend.name(), name), |b| {
                next_token_steps(b, &mut m, &mut token)
            });
        }
        // kernel-loop: LOOP_TOKENS greedy tokens generated in the kernel per iteration
        g.throughput(Throughput::Elements(LOOP_TOKENS as u64));
        let opts = GenerateOptions::new(LOOP_TOKENS);
        g.bench_function(BenchmarkId::new(backend.name(), "kernel-loop"), |b| {
            b.iter(|| {
                if m.position() + LOOP_TOKENS + 1 > MAX_CONTEXT {
                    m.reset();
                }
                for t in m
                    .generate_in_kernel(&[token], &opts)
                    .expect("in-kernel generation")
                {
                    token = t.expect("a generated token");
                }
                black_box(token)
            })
        });
    }
    g.finish();
}

fn screened_head(c: &mut Criterion) {
    if !selected("screened_head") {
        return;
    }
    let dir = model_dir();
    let mut g = c.benchmark_group("screened_head");
    g.sample_size(10)
        .warm_up_time(Duration::from_secs(2))
        .measurement_time(Duration::from_secs(8))
        .throughput(Throughput::Elements(1));
    for backend in [Backend::Q24, Backend::Int4] {
        let mut m = open_store(&dir, backend);
        let mut token = FIRST_TOKEN;
        for screened in [true, false] {
            m.set_screened_head(screened);
            let name = if screened { "screened" } else { "exact" };
            g.bench_function(BenchmarkId::new(backend.name(), name), |b| {
                next_token_steps(b, &mut m, &mut token)
            });
        }
    }
    g.finish();
}

/// Deterministic data, uniform in `[-m, m]`.
fn random_vec(seed: u64, n: usize, m: i64) -> Vec<i32> {
    rng::Rng(seed).vec(n, m)
}

fn kernels(c: &mut Criterion) {
    if !selected("kernels") {
        return;
    }
    let bytes: usize = SHAPES
        .iter()
        .map(|&(r, k)| {
            (r * k + k + r) * 4 * 3 + 16 * 4096 + 2 * qwen_bpf::num::swar::QuantX::bytes(k)
        })
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
            ops.arena.slice_mut::<i32>(r).unwrap().copy_from_slice(data);
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
        ops.matvec(rw, rx, ry, cols, 0..rows, false)
            .expect("BPF matvec");
        assert_eq!(
            ops.arena.slice::<i32>(ry).unwrap(),
            &want[..],
            "{shape}: BPF matvec differs from its twin"
        );

        // The SWAR kernels on the same shapes: weights ~N(0, 0.03) quantised group-wise,
        // activations quantised per 32-column block in BPF (once, outside the timing).
        let (m4, m8, r4, r8) = swar_matrices(&mut ops, &w, rows, cols);
        let (x8, x16) = (
            ops.alloc_quant_x(cols, swar::W4A8).expect("arena"),
            ops.alloc_quant_x(cols, swar::W8A16).expect("arena"),
        );
        ops.quantize_x(rx, &x8).expect("quantize_x8");
        ops.quantize_x(rx, &x16).expect("quantize_x16");
        let (q8, q16) = (swar::quantize_x8(&x), swar::quantize_x16(&x));
        g.bench_function(BenchmarkId::new("matvec_w4a8_bpf", &shape), |b| {
            b.iter(|| {
                ops.w4a8_matvec(&r4, &x8, ry, 0..rows, false)
                    .expect("BPF w4a8")
            })
        });
        g.bench_function(BenchmarkId::new("matvec_w4a8_twin", &shape), |b| {
            b.iter(|| {
                swar::matvec_quantized(black_box(&m4), black_box(&q8), 0..rows, black_box(&mut y))
            })
        });
        swar::matvec_quantized(&m4, &q8, 0..rows, &mut want);
        ops.w4a8_matvec(&r4, &x8, ry, 0..rows, false)
            .expect("BPF w4a8");
        assert_eq!(
            ops.arena.slice::<i32>(ry).unwrap(),
            &want[..],
            "{shape}: BPF w4a8 differs from its twin"
        );
        g.bench_function(BenchmarkId::new("matvec_w8a16_bpf", &shape), |b| {
            b.iter(|| {
                ops.w8a16_matvec(&r8, &x16, ry, 0..rows, false)
                    .expect("BPF w8a16")
            })
        });
        g.bench_function(BenchmarkId::new("matvec_w8a16_twin", &shape), |b| {
            b.iter(|| {
                swar::matvec_quantized(black_box(&m8), black_box(&q16), 0..rows, black_box(&mut y))
            })
        });
        swar::matvec_quantized(&m8, &q16, 0..rows, &mut want);
        ops.w8a16_matvec(&r8, &x16, ry, 0..rows, false)
            .expect("BPF w8a16");
        assert_eq!(
            ops.arena.slice::<i32>(ry).unwrap(),
            &want[..],
            "{shape}: BPF w8a16 differs from its twin"
        );
    }
    g.finish();
}

/// The Q24 weights `w` (`rows × cols`) scaled to ~N(0, 0.03), quantised group-wise to W4 and
/// W8, and both uploaded to the arena.
fn swar_matrices(
    ops: &mut Ops,
    w: &[i32],
    rows: usize,
    cols: usize,
) -> (
    swar::Int4Matrix,
    swar::Int8Matrix,
    qwen_bpf::kernel::swar_ops::PackedRegions,
    qwen_bpf::kernel::swar_ops::PackedRegions,
) {
    let wf: Vec<f32> = w
        .iter()
        .map(|&v| v as f32 / (1 << 24) as f32 * 0.6)
        .collect();
    let m4 = swar::quantize_int4(&wf, rows, cols).expect("int4 weights");
    let m8 = swar::quantize_int8(&wf, rows, cols).expect("int8 weights");
    let (r4, r8) = (
        ops.upload_int4(&m4).expect("arena"),
        ops.upload_int8(&m8).expect("arena"),
    );
    (m4, m8, r4, r8)
}

/// The `batched` group: each weight-bearing operator for 1 and for `PREFILL_BLOCK` vectors, on
/// 1 and 2 threads, the block's SWAR kernels both with each row block unpacked once (the model's
/// path) and from the packed words (`_packed`); the last vector's result is checked against its
/// twin outside the timing (Q24 in every configuration, the SWAR kernels for the whole block).
fn batched(c: &mut Criterion) {
    if !selected("batched") {
        return;
    }
    let nb_max = qwen_bpf::store::PREFILL_BLOCK;
    let bytes: usize = SHAPES
        .iter()
        .map(|&(r, k)| (r * k + (k + r) * nb_max) * 4 * 2 + 2 * nb_max * swar::QuantX::bytes(k))
        .sum();
    let k_max = SHAPES.iter().map(|&(_, k)| k).max().unwrap_or(32);
    let bytes = bytes + qwen_bpf::kernel::swar_ops::unpack_scratch_bytes(k_max);
    let mut ops = Ops::load(bytes).expect("loading the operator programs (needs root / CAP_BPF)");
    ops.alloc_unpack_scratch(k_max).expect("arena");
    let mut g = c.benchmark_group("batched");
    g.sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    for (i, &(rows, cols)) in SHAPES.iter().enumerate() {
        let w = random_vec(2 * i as u64 + 1, rows * cols, 1 << 20);
        let x = random_vec(2 * i as u64 + 2, cols * nb_max, 1 << 18);
        let mut put = |data: &[i32], what: &str| -> Region {
            let r = ops.arena.alloc(data.len() * 4, what).expect("arena space");
            ops.arena.slice_mut::<i32>(r).unwrap().copy_from_slice(data);
            r
        };
        let (rw, rx) = (put(&w, "W"), put(&x, "x"));
        let ry = ops
            .arena
            .alloc(rows * 4 * nb_max, "y")
            .expect("arena space");
        let (m4, m8, r4, r8) = swar_matrices(&mut ops, &w, rows, cols);
        let last = &x[(nb_max - 1) * cols..];
        let (mut want4, mut want8) = (vec![0i32; rows], vec![0i32; rows]);
        swar::matvec_quantized(&m4, &swar::quantize_x8(last), 0..rows, &mut want4);
        swar::matvec_quantized(&m8, &swar::quantize_x16(last), 0..rows, &mut want8);
        let (x8, x16) = (
            ops.alloc_quant_x_batch(cols, swar::W4A8, nb_max)
                .expect("arena"),
            ops.alloc_quant_x_batch(cols, swar::W8A16, nb_max)
                .expect("arena"),
        );
        ops.quantize_x_batch(rx, &x8, nb_max).expect("quantize_x8");
        ops.quantize_x_batch(rx, &x16, nb_max)
            .expect("quantize_x16");
        for nb in [1, nb_max] {
            let batch = Batch {
                n: nb,
                y_stride: rows * 4,
            };
            for threads in [1, 2] {
                ops.set_threads(threads);
                let id =
                    |op: &str| BenchmarkId::new(op, format!("{rows}x{cols}/nb{nb}/t{threads}"));
                g.throughput(Throughput::Elements((rows * cols * nb) as u64));
                g.bench_function(id("q24"), |b| {
                    b.iter(|| {
                        ops.matvec_batch(rw, rx, ry, cols, 0..rows, false, batch)
                            .expect("BPF matvec")
                    })
                });
                // once more outside the timing loop, which a filter may have skipped
                ops.matvec_batch(rw, rx, ry, cols, 0..rows, false, batch)
                    .expect("BPF matvec");
                let mut want = vec![0i32; rows];
                fixed::matvec(&w, &x[(nb - 1) * cols..nb * cols], 0..rows, &mut want);
                let got = ops.arena.slice::<i32>(ry).unwrap();
                assert_eq!(
                    &got[(nb - 1) * rows..nb * rows],
                    &want[..],
                    "q24 batch: last vector vs twin"
                );
                // a block's SWAR kernels unpack each row block once (the model's path), or
                // read the packed words for every vector ("_packed")
                let mut swar = vec![
                    ("w4a8", &r4, &x8, &want4, true),
                    ("w8a16", &r8, &x16, &want8, true),
                ];
                if nb > 1 {
                    swar.push(("w4a8_packed", &r4, &x8, &want4, false));
                    swar.push(("w8a16_packed", &r8, &x16, &want8, false));
                }
                for (name, m, xq, twin, unpack) in swar {
                    ops.set_unpacking(unpack);
                    g.bench_function(id(name), |b| {
                        b.iter(|| {
                            ops.swar_matvec_batch(m, xq, ry, 0..rows, false, batch)
                                .expect("BPF SWAR matvec")
                        })
                    });
                    if nb == nb_max {
                        ops.swar_matvec_batch(m, xq, ry, 0..rows, false, batch)
                            .expect("BPF SWAR matvec");
                        let got = ops.arena.slice::<i32>(ry).unwrap();
                        assert_eq!(
                            &got[(nb - 1) * rows..nb * rows],
                            &twin[..],
                            "{name} batch: last vector vs twin"
                        );
                    }
                }
            }
        }
    }
    g.finish();
}

/// Attention shape of the `threads` group: Qwen3-0.6B's heads at `THREADS_DEPTH` positions.
const THREADS_SHAPE: fixed::AttnShape = fixed::AttnShape {
    n_q: 16,
    n_kv: 8,
    hd: 128,
    max_ctx: 4096,
};
/// The position attended at in the `threads` group (the cache full).
const THREADS_DEPTH: usize = 4095;
/// Rows and columns of the LM head in the `threads` group (Qwen3-0.6B's).
const HEAD: (usize, usize) = (151_936, 1024);

/// The `threads` group: the operators the `batched` group leaves out, on one and on two
/// threads at the 0.6B shape: one layer's attention at position 4,095 over the Q16 and the
/// int8 cache (kv heads split across the threads), the embedding row (one copy, never split),
/// and the LM head argmax over all 151,936 rows in Q24 and in W8A16 (rows split). The caches and
/// weights hold random values: these kernels cost the same whatever they hold.
fn threads(c: &mut Criterion) {
    if !selected("threads") {
        return;
    }
    let s = THREADS_SHAPE;
    let (kvd, pairs) = (
        s.n_kv * s.hd,
        qwen_bpf::kernel::operators::kv8_pairs(s.n_q, s.n_kv),
    );
    let (rows, cols) = HEAD;
    let bytes = 2 * s.max_ctx * kvd * 4
        + 2 * s.max_ctx * (kvd + s.n_kv * 4)
        + s.n_q * s.max_ctx * 4
        + pairs * s.max_ctx * 8
        + rows * cols * 5
        + (64 << 20);
    let mut ops = Ops::load(bytes).expect("loading the operator programs (needs root / CAP_BPF)");
    ops.set_par_min_macs(0);
    let put = |ops: &mut Ops, data: &[i32], what: &str| -> Region {
        let r = ops.arena.alloc(data.len() * 4, what).expect("arena space");
        ops.arena.slice_mut::<i32>(r).unwrap().copy_from_slice(data);
        r
    };
    let exp2 = ops.arena.alloc(257 * 4, "exp2").expect("arena");
    ops.arena
        .slice_mut::<u32>(exp2)
        .unwrap()
        .copy_from_slice(&fixed::exp2_table());
    let q = put(&mut ops, &random_vec(31, s.n_q * s.hd, 1 << 20), "q");
    let k = put(&mut ops, &random_vec(32, kvd, 1 << 17), "k");
    let v = put(&mut ops, &random_vec(33, kvd, 1 << 17), "v");
    let q16 = qwen_bpf::kernel::operators::AttentionBuffers {
        q,
        k,
        v,
        k_cache: put(&mut ops, &random_vec(34, s.max_ctx * kvd, 1 << 17), "K"),
        v_cache: put(&mut ops, &random_vec(35, s.max_ctx * kvd, 1 << 17), "V"),
        probs: ops
            .arena
            .alloc(s.n_q * s.max_ctx * 4, "probs")
            .expect("arena"),
        acc: ops.arena.alloc(s.n_q * s.hd * 8, "acc").expect("arena"),
        out: ops.arena.alloc(s.n_q * s.hd * 4, "out").expect("arena"),
        exp2,
    };
    // int8 codes and steps as random words (any byte is a code; steps kept small)
    let codes = |ops: &mut Ops, seed: u64| {
        put(
            ops,
            &random_vec(seed, s.max_ctx * kvd / 4, 1 << 30),
            "codes",
        )
    };
    let steps = |ops: &mut Ops, seed: u64| {
        put(
            ops,
            &random_vec(seed, s.max_ctx * s.n_kv, 1 << 12)
                .iter()
                .map(|v| v.abs())
                .collect::<Vec<_>>(),
            "steps",
        )
    };
    let i8b = qwen_bpf::kernel::operators::AttentionI8Buffers {
        q,
        k,
        v,
        k_codes: codes(&mut ops, 36),
        k_steps: steps(&mut ops, 37),
        v_codes: codes(&mut ops, 38),
        v_steps: steps(&mut ops, 39),
        codes_stride: s.max_ctx * s.hd,
        steps_stride: s.max_ctx * 4,
        probs: q16.probs,
        wv: ops.arena.alloc(pairs * s.max_ctx * 8, "wv").expect("arena"),
        qq: ops.arena.alloc(pairs * s.hd * 8, "qq").expect("arena"),
        acc: ops.arena.alloc(pairs * s.hd * 8, "acc8").expect("arena"),
        out: q16.out,
        exp2,
        ksh: ops.arena.alloc(s.hd, "ksh").expect("arena"),
    };
    let table = put(
        &mut ops,
        &random_vec(40, 64 * cols, 1 << 22),
        "embedding rows",
    );
    let x = put(&mut ops, &random_vec(41, cols, 1 << 18), "x");
    let w = put(&mut ops, &random_vec(42, rows * cols, 1 << 20), "Q24 head");
    // a W8 head of arbitrary weights in -1..1 (the kernel's cost does not depend on them)
    let wf: Vec<f32> = (0..rows * cols)
        .map(|i| ((i * 2654435761) % 2001) as f32 / 1000.0 - 1.0)
        .collect();
    let r8 = ops
        .upload_int8(&swar::quantize_int8(&wf, rows, cols).expect("int8 head"))
        .expect("arena");
    drop(wf);
    let x16 = ops.alloc_quant_x(cols, swar::W8A16).expect("arena");
    ops.quantize_x(x, &x16).expect("quantize_x16");
    let scale = fixed::attn_scale_q22(s.hd);
    let mut g = c.benchmark_group("threads");
    g.sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    let mut heads = Vec::new();
    for t in [1, 2] {
        ops.set_threads(t);
        let id = |op: &str| BenchmarkId::new(op, format!("t{t}"));
        g.throughput(Throughput::Elements(
            (2 * (THREADS_DEPTH + 1) * s.n_q * s.hd) as u64,
        ));
        g.bench_function(id("attention_q16/pos4095"), |b| {
            b.iter(|| {
                ops.attention(&q16, THREADS_DEPTH, s, scale)
                    .expect("attention")
            })
        });
        g.bench_function(id("attention_i8/pos4095"), |b| {
            b.iter(|| {
                ops.attention_i8(&i8b, THREADS_DEPTH, s, scale)
                    .expect("attention_i8")
            })
        });
        g.throughput(Throughput::Elements(cols as u64));
        g.bench_function(id("embed"), |b| {
            b.iter(|| ops.embed(table, black_box(7), cols, x).expect("embed"))
        });
        g.throughput(Throughput::Elements((rows * cols) as u64));
        let mut best = (0, 0);
        g.bench_function(id("lm_head_q24"), |b| {
            b.iter(|| best = ops.lm_head_argmax(w, x, None, cols, 0..rows).expect("head"))
        });
        let mut best8 = (0, 0);
        g.bench_function(id("lm_head_w8a16"), |b| {
            b.iter(|| {
                best8 = ops
                    .swar_lm_head_argmax(&r8, &x16, None, 0..rows)
                    .expect("head")
            })
        });
        heads.push((best, best8));
    }
    g.finish();
    // the split heads find the argmax the one-thread heads do
    assert_eq!(heads[0], heads[1], "LM head argmax: 1 thread vs 2");
}

/// The `layers` group (see the top).
fn layers(c: &mut Criterion) {
    if !selected("layers") {
        return;
    }
    let dir = model_dir();
    let mut g = c.benchmark_group("layers");
    g.sample_size(10)
        .warm_up_time(Duration::from_secs(3))
        .measurement_time(Duration::from_secs(20))
        .throughput(Throughput::Elements(1));
    {
        // the twin has no reset: a fresh one (outside the timing) when its context is full
        let open = || TwinModel::open(&dir, &dir, MAX_CONTEXT).expect("opening the Rust twin");
        let (mut twin, mut fed, mut token) = (open(), 0, FIRST_TOKEN);
        g.bench_function(BenchmarkId::new("twin", "q24"), |b| {
            b.iter_custom(|iters| {
                let mut spent = Duration::ZERO;
                for _ in 0..iters {
                    if fed == MAX_CONTEXT {
                        (twin, fed) = (open(), 0);
                    }
                    let t = Instant::now();
                    token = twin.forward(token).expect("twin forward").1 as u32;
                    spent += t.elapsed();
                    fed += 1;
                }
                spent
            })
        });
    }
    let probe = LayerProbe::run();
    for backend in [Backend::Q24, Backend::Int4] {
        for layer in [MemoryLayer::Arena, MemoryLayer::Array] {
            if let Err(why) = probe.choose(layer) {
                eprintln!(
                    "layers: {} on the {layer} layer skipped: {why}",
                    backend.name()
                );
                continue;
            }
            let opts = ModelOptions {
                backend,
                max_context: MAX_CONTEXT,
                progress: true,
                memory: layer,
                ..Default::default()
            };
            let mut m = Model::open(&dir, &opts).unwrap_or_else(|e| {
                panic!(
                    "opening the {} store on the {layer} layer: {e}",
                    backend.name()
                )
            });
            let mut token = FIRST_TOKEN;
            g.bench_function(BenchmarkId::new(backend.name(), layer.to_string()), |b| {
                next_token_steps(b, &mut m, &mut token)
            });
        }
    }
    g.finish();
}

criterion_group!(
    benches,
    decode,
    layers,
    reference_parallel,
    dispatch,
    screened_head,
    kernels,
    batched,
    threads
);
criterion_main!(benches);
