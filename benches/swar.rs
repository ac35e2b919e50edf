//! The low-bit SWAR kernels against the plain Q24 matrix-vector product, on weights like a
//! trained layer's (normal, a few large outliers) and activations with outlier channels, at the
//! 0.6B model's gate/up and down_proj shapes, in one run so that their ratios are comparable:
//!
//! ```text
//! cargo bench --bench swar
//! ```
//!
//! Per shape: `Ops::matvec` (Q24), `Ops::w4a8_matvec` and `Ops::w8a16_matvec` on activations
//! quantised once, each of them again with the activations' quantisation (`Ops::quantize_x`)
//! in the timing, and the W4A8 LM head's argmax (`Ops::w4a8_lm_head_argmax`, no logits).
//! Throughput elements are multiply-adds, so criterion's `elem/s` is MAC/s. The same kernels
//! against their Rust twins are the `kernels` group of `benches/decode.rs`.
//!
//! Needs root (or CAP_BPF + CAP_PERFMON).

use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use qwen_bpf::kernel::arena::Region;
use qwen_bpf::kernel::ops::Ops;
use qwen_bpf::num::swar::{self, W4A8, W8A16};

#[path = "../tests/common/rng.rs"]
mod rng;

use rng::Rng;

/// Matrix shapes `rows × cols`: gate/up-like and down_proj-like.
const SHAPES: [(usize, usize); 2] = [(3072, 1024), (1024, 3072)];

/// `x` in Q16.
fn q16(x: &[f32]) -> Vec<i32> {
    x.iter()
        .map(|&v| (v as f64 * 65536.0).round() as i32)
        .collect()
}

/// `data` copied into a fresh arena region.
fn put(o: &mut Ops, data: &[i32]) -> Region {
    let r = o
        .arena
        .alloc(data.len() * 4, "bench data")
        .expect("arena space");
    o.arena.slice_mut::<i32>(r).unwrap().copy_from_slice(data);
    r
}

fn swar(c: &mut Criterion) {
    let mut o = Ops::load(256 << 20).expect("loading the operator programs (needs root / CAP_BPF)");
    let mut rng = Rng(18);
    let mut g = c.benchmark_group("swar");
    g.sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));
    for (rows, k) in SHAPES {
        let wq24 = rng.vec(rows * k, 1 << 22);
        let wf = rng.weights(rows * k, 0.02);
        let x = q16(&rng.activations(k));
        let (rw, rx) = (put(&mut o, &wq24), put(&mut o, &x));
        let ry = o.arena.alloc(rows * 4, "y").expect("arena space");
        let m4 = o
            .upload_int4(&swar::quantize_int4(&wf, rows, k).expect("int4 weights"))
            .expect("arena space");
        let m8 = o
            .upload_int8(&swar::quantize_int8(&wf, rows, k).expect("int8 weights"))
            .expect("arena space");
        let (x8, x16) = (
            o.alloc_quant_x(k, W4A8).expect("arena space"),
            o.alloc_quant_x(k, W8A16).expect("arena space"),
        );
        o.quantize_x(rx, &x8).expect("quantize_x8");
        o.quantize_x(rx, &x16).expect("quantize_x16");
        type Run<'a> = Box<dyn Fn(&mut Ops) + 'a>;
        let kernels: Vec<(&str, Run)> = vec![
            (
                "matvec_q24",
                Box::new(|o: &mut Ops| o.matvec(rw, rx, ry, k, 0..rows, false).expect("matvec")),
            ),
            (
                "w4a8_matvec",
                Box::new(|o: &mut Ops| {
                    o.w4a8_matvec(&m4, &x8, ry, 0..rows, false)
                        .expect("w4a8_matvec")
                }),
            ),
            (
                "w8a16_matvec",
                Box::new(|o: &mut Ops| {
                    o.w8a16_matvec(&m8, &x16, ry, 0..rows, false)
                        .expect("w8a16_matvec")
                }),
            ),
            (
                "quantize_x8+w4a8",
                Box::new(|o: &mut Ops| {
                    o.quantize_x(rx, &x8).expect("quantize_x8");
                    o.w4a8_matvec(&m4, &x8, ry, 0..rows, false)
                        .expect("w4a8_matvec")
                }),
            ),
            (
                "quantize_x16+w8a16",
                Box::new(|o: &mut Ops| {
                    o.quantize_x(rx, &x16).expect("quantize_x16");
                    o.w8a16_matvec(&m8, &x16, ry, 0..rows, false)
                        .expect("w8a16_matvec")
                }),
            ),
            (
                "w4a8_lm_head_argmax",
                Box::new(|o: &mut Ops| {
                    o.w4a8_lm_head_argmax(&m4, &x8, None, 0..rows)
                        .expect("w4a8_lm_head_argmax");
                }),
            ),
        ];
        g.throughput(Throughput::Elements((rows * k) as u64));
        let shape = format!("{rows}x{k}");
        for (name, run) in &kernels {
            g.bench_function(BenchmarkId::new(*name, &shape), |b| b.iter(|| run(&mut o)));
        }
    }
    g.finish();
}

criterion_group!(benches, swar);
criterion_main!(benches);
