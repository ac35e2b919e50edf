//! The batched operators of a prefill block (`nb` vectors through one matrix: `matvec`,
//! `gate_up_swiglu`, `quantize_x8`/`quantize_x16`, `w4a8_matvec`/`w8a16_matvec`) against their
//! Rust twins applied vector by vector, bit for bit, split across two threads, with y's vectors
//! at a stride that leaves a guard between them; and the batch bounds refused with typed
//! errors. These load real BPF programs: they need root (or CAP_BPF + CAP_PERFMON).

mod common;

use common::Rng;
use qwen_bpf::kernel::arena::Region;
use qwen_bpf::kernel::memory::MemoryLayer;
use qwen_bpf::kernel::operators::Batch;
use qwen_bpf::kernel::ops::Ops;
use qwen_bpf::num::fixed;
use qwen_bpf::num::limits::BATCH_MAX;
use qwen_bpf::num::swar::{self, PackedMatrix, QuantX, W4A8, W8A16};

/// Vectors per batch: odd, and past one thread part's worth of anything.
const NB: usize = 5;
/// Guard bytes between y's vectors: a kernel that ignores the stride overwrites them.
const GUARD: usize = 32;
/// What the guards hold.
const GUARD_BYTE: u8 = 0xA5;

fn ops(layer: MemoryLayer) -> Ops {
    let mut o = common::ops_on(64 << 20, layer);
    // two threads, and every operator split between them
    o.set_threads(2);
    o.set_par_min_macs(0);
    o
}

fn put<T: bytemuck::Pod>(o: &mut Ops, data: &[T]) -> Region {
    let len = std::mem::size_of_val(data);
    let r = o.arena.alloc(len, "test data").unwrap();
    o.arena.slice_mut::<T>(r).unwrap().copy_from_slice(data);
    r
}

fn random(rng: &mut Rng, n: usize, m: i64) -> Vec<i32> {
    (0..n)
        .map(|_| (rng.next() % (2 * m as u64 + 1)) as i64 - m)
        .map(|v| v as i32)
        .collect()
}

/// y for `NB` vectors of `len` elements of `T` at a stride of `len * size + GUARD` bytes, the
/// vectors set to `init(b)` and the guards to [`GUARD_BYTE`]. Returns the region and the batch.
fn strided_y<T: bytemuck::Pod>(
    o: &mut Ops,
    len: usize,
    init: impl Fn(usize) -> Vec<T>,
) -> (Region, Batch) {
    let size = std::mem::size_of::<T>();
    let stride = len * size + GUARD;
    let r = o.arena.alloc(NB * stride, "batched y").unwrap();
    let bytes = o.arena.slice_mut::<u8>(r).unwrap();
    bytes.fill(GUARD_BYTE);
    for b in 0..NB {
        let v = init(b);
        bytes[b * stride..b * stride + len * size].copy_from_slice(bytemuck::cast_slice(&v));
    }
    (
        r,
        Batch {
            n: NB,
            y_stride: stride,
        },
    )
}

/// Vector `b` of a strided y, after checking that its guard is untouched.
fn vector<T: bytemuck::Pod>(o: &Ops, r: Region, len: usize, b: usize, what: &str) -> Vec<T> {
    let size = std::mem::size_of::<T>();
    let stride = len * size + GUARD;
    let bytes = o.arena.slice::<u8>(r).unwrap();
    let guard = &bytes[b * stride + len * size..(b + 1) * stride];
    assert!(
        guard.iter().all(|&g| g == GUARD_BYTE),
        "{what}: the guard after vector {b} was overwritten"
    );
    bytemuck::cast_slice(&bytes[b * stride..b * stride + len * size]).to_vec()
}

#[test]
fn batched_q24_matvec_and_gate_up_equal_their_twins_per_vector() {
    batched_q24_matvec_and_gate_up_equal_their_twins_per_vector_on(MemoryLayer::Arena);
}

#[test]
fn array_batched_q24_matvec_and_gate_up_equal_their_twins_per_vector() {
    batched_q24_matvec_and_gate_up_equal_their_twins_per_vector_on(MemoryLayer::Array);
}

fn batched_q24_matvec_and_gate_up_equal_their_twins_per_vector_on(layer: MemoryLayer) {
    let mut o = ops(layer);
    let mut rng = Rng(21);
    let (rows, k) = (71, 256); // an odd row count: the last row runs alone
    let w = random(&mut rng, rows * k, 1 << 22);
    let w2 = random(&mut rng, rows * k, 1 << 22);
    let x = random(&mut rng, NB * k, 1 << 19);
    let (rw, rw2, rx) = (put(&mut o, &w), put(&mut o, &w2), put(&mut o, &x));
    let xs = |b: usize| &x[b * k..(b + 1) * k];

    // store mode: y i32 Q16
    let (ry, batch) = strided_y::<i32>(&mut o, rows, |_| vec![0; rows]);
    o.matvec_batch(rw, rx, ry, k, 0..rows, false, batch)
        .unwrap();
    for b in 0..NB {
        let mut want = vec![0i32; rows];
        fixed::matvec(&w, xs(b), 0..rows, &mut want);
        assert_eq!(
            vector::<i32>(&o, ry, rows, b, "matvec"),
            want,
            "matvec vector {b}: BPF vs twin"
        );
    }

    // accumulate mode: y the i64 Q32 residual stream, different in every vector
    let y0 = |b: usize| -> Vec<i64> {
        (0..rows)
            .map(|r| ((r as i64 - 30) << 28) + b as i64)
            .collect()
    };
    let (ry, batch) = strided_y::<i64>(&mut o, rows, y0);
    o.matvec_batch(rw, rx, ry, k, 0..rows, true, batch).unwrap();
    for b in 0..NB {
        let mut want = y0(b);
        fixed::matvec_residual(&w, xs(b), 0..rows, &mut want);
        assert_eq!(
            vector::<i64>(&o, ry, rows, b, "residual matvec"),
            want,
            "residual matvec vector {b}: BPF vs twin"
        );
    }

    // the fused gate/up half of the MLP
    let tab = fixed::exp2_table();
    let rt = put(&mut o, &tab[..]);
    let (ry, batch) = strided_y::<i32>(&mut o, rows, |_| vec![0; rows]);
    o.gate_up_swiglu_batch(rw, rw2, rx, ry, rt, k, 0..rows, batch)
        .unwrap();
    for b in 0..NB {
        let mut want = vec![0i32; rows];
        fixed::gate_up_swiglu(&w, &w2, xs(b), 0..rows, &tab, &mut want);
        assert_eq!(
            vector::<i32>(&o, ry, rows, b, "gate_up_swiglu"),
            want,
            "gate_up_swiglu vector {b}: BPF vs twin"
        );
    }
}

/// The packed words of whichever of the two matrices is in format `f`.
fn rm_words<'a>(f: swar::Format, m4: &'a swar::Int4Matrix, m8: &'a swar::Int8Matrix) -> &'a [u64] {
    if f == W4A8 {
        m4.words()
    } else {
        m8.words()
    }
}

#[test]
fn batched_quantisation_and_swar_matvecs_equal_their_twins_per_vector() {
    batched_quantisation_and_swar_matvecs_equal_their_twins_per_vector_on(MemoryLayer::Arena);
}

#[test]
fn array_batched_quantisation_and_swar_matvecs_equal_their_twins_per_vector() {
    batched_quantisation_and_swar_matvecs_equal_their_twins_per_vector_on(MemoryLayer::Array);
}

fn batched_quantisation_and_swar_matvecs_equal_their_twins_per_vector_on(layer: MemoryLayer) {
    let mut o = ops(layer);
    let mut rng = Rng(22);
    let (rows, k) = (64, 256);
    let wf: Vec<f32> = (0..rows * k).map(|_| rng.normal(0.05) as f32).collect();
    // activations with a different magnitude in every vector (different block shifts)
    let x: Vec<i32> = (0..NB * k)
        .map(|i| (rng.normal(1.0) * 65536.0 * (1 + i / k) as f64) as i32)
        .collect();
    let rx = put(&mut o, &x);
    let xs = |b: usize| &x[b * k..(b + 1) * k];
    let m4 = swar::quantize_int4(&wf, rows, k).unwrap();
    let m8 = swar::quantize_int8(&wf, rows, k).unwrap();
    let (r4, r8) = (o.upload_int4(&m4).unwrap(), o.upload_int8(&m8).unwrap());
    for (f, rm) in [(W4A8, r4), (W8A16, r8)] {
        let twin_q = |b: usize| {
            if f == W4A8 {
                swar::quantize_x8(xs(b))
            } else {
                swar::quantize_x16(xs(b))
            }
        };
        let xq = o.alloc_quant_x_batch(k, f, NB).unwrap();
        o.quantize_x_batch(rx, &xq, NB).unwrap();
        let words = o.arena.slice::<u64>(xq.region).unwrap().to_vec();
        let per = QuantX::bytes(k) / 8;
        for b in 0..NB {
            assert_eq!(
                words[b * per..(b + 1) * per],
                twin_q(b).to_words()[..],
                "{} quantisation of vector {b}: BPF vs twin",
                f.name
            );
        }
        // the packed words read for every vector, then (scratch for k columns) unpacked once
        // per row block: both must give the twin's integers
        for unpacked in [false, true] {
            let mode = if unpacked { "unpacked" } else { "packed" };
            if unpacked {
                o.alloc_unpack_scratch(k).unwrap();
            }
            let (ry, batch) = strided_y::<i32>(&mut o, rows, |_| vec![0; rows]);
            o.swar_matvec_batch(&rm, &xq, ry, 0..rows, false, batch)
                .unwrap();
            if unpacked {
                // part 0 (the first half of the rows) left its last row block's unpacked words
                let rpb = f.rows_per_block;
                let (blk, words) = (rows / 2 / rpb - 1, rm_words(f, &m4, &m8));
                let (cb, mask) = if f == W4A8 {
                    (4, 0x000F_000F_000F_000Fu64)
                } else {
                    (8, 0x0000_00FF_0000_00FFu64)
                };
                let want: Vec<u64> = (0..k / 4)
                    .flat_map(|q| (0..4).flat_map(move |c| (0..2).map(move |h| (q, c, h))))
                    .map(|(q, c, h)| (words[(blk * k / 4 + q) * 2 + h] >> (cb * c)) & mask)
                    .collect();
                let scratch = o.unpack_scratch().expect("allocated above");
                assert_eq!(
                o.arena.slice::<u64>(scratch).unwrap()[..want.len()],
                want[..],
                "{}: the scratch holds part 0's last row block unpacked (the unpacked kernel ran)",
                f.name
            );
            }
            let y0 = |b: usize| -> Vec<i64> {
                (0..rows)
                    .map(|r| ((r as i64 - 30) << 30) - b as i64)
                    .collect()
            };
            let (rr, rbatch) = strided_y::<i64>(&mut o, rows, y0);
            o.swar_matvec_batch(&rm, &xq, rr, 0..rows, true, rbatch)
                .unwrap();
            for b in 0..NB {
                let (mut want, mut res) = (vec![0i32; rows], y0(b));
                if f == W4A8 {
                    swar::matvec_quantized(&m4, &twin_q(b), 0..rows, &mut want);
                    swar::matvec_quantized_residual(&m4, &twin_q(b), 0..rows, &mut res);
                } else {
                    swar::matvec_quantized(&m8, &twin_q(b), 0..rows, &mut want);
                    swar::matvec_quantized_residual(&m8, &twin_q(b), 0..rows, &mut res);
                }
                let what = format!("{} matvec ({mode} words) vector {b}", f.name);
                assert_eq!(
                    vector::<i32>(&o, ry, rows, b, &what),
                    want,
                    "{what}: BPF vs twin"
                );
                assert_eq!(
                    vector::<i64>(&o, rr, rows, b, &what),
                    res,
                    "{what}, residual: BPF vs twin"
                );
            }
        }
        assert_eq!(m4.rows(), rows);
    }
}

#[test]
fn batch_sizes_and_short_buffers_are_refused() {
    batch_sizes_and_short_buffers_are_refused_on(MemoryLayer::Arena);
}

#[test]
fn array_batch_sizes_and_short_buffers_are_refused() {
    batch_sizes_and_short_buffers_are_refused_on(MemoryLayer::Array);
}

fn batch_sizes_and_short_buffers_are_refused_on(layer: MemoryLayer) {
    let mut o = ops(layer);
    let (rows, k) = (8, 64);
    let w = put(&mut o, &vec![0i32; rows * k]);
    let x = put(&mut o, &vec![0i32; BATCH_MAX * k]);
    let y = put(&mut o, &vec![0i32; (BATCH_MAX + 1) * rows]);
    for n in [0, BATCH_MAX + 1] {
        let batch = Batch {
            n,
            y_stride: rows * 4,
        };
        let err = o
            .matvec_batch(w, x, y, k, 0..rows, false, batch)
            .unwrap_err();
        assert!(
            err.to_string().contains("batch of"),
            "a batch of {n}: {err}"
        );
    }
    // x holds BATCH_MAX vectors; y is one short of BATCH_MAX vectors at this stride
    let batch = Batch {
        n: BATCH_MAX,
        y_stride: rows * 8,
    };
    let err = o
        .matvec_batch(w, x, y, k, 0..rows, false, batch)
        .unwrap_err();
    assert!(err.to_string().contains("need x of"), "short y: {err}");
    let xq = o.alloc_quant_x_batch(k, W4A8, 2).unwrap();
    let err = o.quantize_x_batch(x, &xq, 3).unwrap_err();
    assert!(err.to_string().contains("3 vectors"), "short xq: {err}");
    // the largest batch runs
    let batch = Batch {
        n: BATCH_MAX,
        y_stride: rows * 4,
    };
    o.matvec_batch(w, x, y, k, 0..rows, false, batch).unwrap();
}
