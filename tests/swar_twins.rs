//! The low-bit SWAR programs (`src/bpf/swar.inc.c`) against their Rust twins in
//! `qwen_bpf::num::swar`, bit for bit, at the model's real shapes and on edge cases, and their
//! refusal of mismatched arguments. These load real BPF programs: they need root (or CAP_BPF +
//! CAP_PERFMON). The twins' own accuracy and the quantisers' error bounds are
//! `tests/swar_accuracy.rs`.
//!
//! Speed: `cargo bench --bench swar` (and the `kernels` group of `cargo bench --bench decode`).
// Row ranges are passed as lists of consecutive ranges, often of one.
#![allow(clippy::single_range_in_vec_init, clippy::needless_range_loop)]

mod common;

use common::Rng;
use qwen_bpf::kernel::arena::Region;
use qwen_bpf::kernel::memory::MemoryLayer;
use qwen_bpf::kernel::ops::Ops;
use qwen_bpf::kernel::swar_ops::{PackedRegions, QuantXRegion};
use qwen_bpf::num::fixed::ACT_MAX;
use qwen_bpf::num::swar::{
    self, Format, Int4Matrix, Int8Matrix, PackedMatrix, QuantX, GROUP, W4A8, W8A16,
};

fn ops(bytes: usize, layer: MemoryLayer) -> Ops {
    common::ops_on(bytes, layer)
}

fn put<T: bytemuck::Pod>(o: &mut Ops, data: &[T]) -> Region {
    let len = std::mem::size_of_val(data);
    let r = o.arena.alloc(len.max(8), "test data").unwrap();
    o.arena
        .slice_mut::<T>(r.prefix(len).unwrap())
        .unwrap()
        .copy_from_slice(data);
    r.prefix(len).unwrap()
}

fn get(o: &Ops, r: Region, n: usize) -> Vec<i32> {
    o.arena
        .slice::<i32>(r.prefix(n * 4).unwrap())
        .unwrap()
        .to_vec()
}

fn q16(x: &[f32]) -> Vec<i32> {
    x.iter()
        .map(|&v| (v as f64 * 65536.0).round() as i32)
        .collect()
}

/// Uploads x, quantises it in BPF for `f`, and returns the buffer.
fn bpf_quantize(o: &mut Ops, x: &[i32], f: Format) -> QuantXRegion {
    let rx = put(o, x);
    let xq = o.alloc_quant_x(x.len(), f).unwrap();
    o.quantize_x(rx, &xq).unwrap();
    xq
}

fn twin_quantize(x: &[i32], f: Format) -> QuantX {
    if f == W4A8 {
        swar::quantize_x8(x)
    } else {
        swar::quantize_x16(x)
    }
}

/// Runs the format's BPF matvec over `splits` (consecutive row ranges) and the twin over the
/// whole range, from the same starting y, and asserts equal outputs.
#[allow(clippy::too_many_arguments)]
fn check_matvec<M: PackedMatrix>(
    o: &mut Ops,
    m: &M,
    rm: &PackedRegions,
    x: &[i32],
    y0: &[i32],
    splits: &[std::ops::Range<usize>],
    accumulate: bool,
    what: &str,
) {
    let f = M::FORMAT;
    let xq = bpf_quantize(o, x, f);
    let all = splits[0].start..splits[splits.len() - 1].end;
    let run = |o: &mut Ops, ry: Region| {
        for rows in splits {
            if f == W4A8 {
                o.w4a8_matvec(rm, &xq, ry, rows.clone(), accumulate)
                    .unwrap();
            } else {
                o.w8a16_matvec(rm, &xq, ry, rows.clone(), accumulate)
                    .unwrap();
            }
        }
    };
    let (got, want): (Vec<i64>, Vec<i64>) = if accumulate {
        // the i64 Q32 residual stream; values near ±ACT_MAX in y0 stand next to ±RES_MAX
        let y64: Vec<i64> = y0
            .iter()
            .map(|&v| {
                let v = v as i64;
                if v.abs() >= 1 << 30 {
                    v.signum()
                        * (qwen_bpf::num::fixed::RES_MAX
                            - (qwen_bpf::num::fixed::ACT_MAX - v.abs()))
                } else {
                    v << 16
                }
            })
            .collect();
        let ry = put(o, &y64);
        run(o, ry);
        let mut want = y64.clone();
        swar::matvec_quantized_residual(m, &twin_quantize(x, f), all, &mut want);
        (
            o.arena
                .slice::<i64>(ry.prefix(y64.len() * 8).unwrap())
                .unwrap()
                .to_vec(),
            want,
        )
    } else {
        let ry = put(o, y0);
        run(o, ry);
        let mut want = y0.to_vec();
        swar::matvec_quantized(m, &twin_quantize(x, f), all, &mut want);
        (
            get(o, ry, y0.len()).into_iter().map(i64::from).collect(),
            want.into_iter().map(i64::from).collect(),
        )
    };
    if let Some(i) = (0..want.len()).find(|&i| got[i] != want[i]) {
        panic!(
            "{} {what}: BPF y[{i}] = {} vs twin {} (first of {} differences)",
            f.name,
            got[i],
            want[i],
            (0..want.len()).filter(|&i| got[i] != want[i]).count()
        );
    }
}

#[test]
fn quantize_x_programs_match_twins_bit_for_bit() {
    quantize_x_programs_match_twins_bit_for_bit_on(MemoryLayer::Arena);
}

#[test]
fn array_quantize_x_programs_match_twins_bit_for_bit() {
    quantize_x_programs_match_twins_bit_for_bit_on(MemoryLayer::Array);
}

fn quantize_x_programs_match_twins_bit_for_bit_on(layer: MemoryLayer) {
    let mut o = ops(16 << 20, layer);
    let mut rng = Rng(11);
    let mut x = rng.vec(1024, 1 << 20);
    // block 0: extremes incl. i32::MIN; block 1: zeros; block 2: one huge value among tiny ones;
    // block 3: exact halves for even scales; block 4: all negative
    x[0] = i32::MIN;
    x[1] = i32::MAX;
    x[2] = -(ACT_MAX as i32);
    x[32..64].iter_mut().for_each(|v| *v = 0);
    x[64] = 1 << 30;
    x[65..96]
        .iter_mut()
        .enumerate()
        .for_each(|(i, v)| *v = i as i32 - 15);
    x[96..128]
        .iter_mut()
        .enumerate()
        .for_each(|(i, v)| *v = (2 * i as i32 + 1) * 127 * 3);
    x[128..160].iter_mut().for_each(|v| *v = -v.abs() - 1);
    for f in [W4A8, W8A16] {
        let xq = bpf_quantize(&mut o, &x, f);
        let got = o.arena.slice::<u64>(xq.region).unwrap().to_vec();
        let want = twin_quantize(&x, f);
        assert_eq!(
            QuantX::from_words(&got, x.len(), f.act_max),
            want,
            "{}: BPF quantised x (codes and blocks) vs twin",
            f.name
        );
        assert!(
            want.q.iter().all(|q| q.abs() <= f.act_max),
            "{}: codes within ±QMAX",
            f.name
        );
        assert_eq!(
            want.blocks[1],
            swar::XBlock { sum: 0, shift: 0 },
            "{}: an all-zero block has sum 0, shift 0",
            f.name
        );
    }
}

#[test]
fn w4a8_matvec_matches_twin_at_model_shapes() {
    w4a8_matvec_matches_twin_at_model_shapes_on(MemoryLayer::Arena);
}

#[test]
fn array_w4a8_matvec_matches_twin_at_model_shapes() {
    w4a8_matvec_matches_twin_at_model_shapes_on(MemoryLayer::Array);
}

fn w4a8_matvec_matches_twin_at_model_shapes_on(layer: MemoryLayer) {
    let mut o = ops(64 << 20, layer);
    let mut rng = Rng(12);
    for (rows, k) in [(1024, 1024), (3072, 1024), (1024, 3072)] {
        let m = swar::quantize_int4(&rng.weights(rows * k, 0.02), rows, k).unwrap();
        let rm = o.upload_int4(&m).unwrap();
        let x = q16(&rng.activations(k));
        let y0 = rng.vec(rows, 1 << 30);
        let half = rows / 2 / 8 * 8;
        check_matvec(
            &mut o,
            &m,
            &rm,
            &x,
            &y0,
            &[0..rows],
            false,
            &format!("{rows}x{k}"),
        );
        check_matvec(
            &mut o,
            &m,
            &rm,
            &x,
            &y0,
            &[0..half, half..rows],
            true,
            &format!("{rows}x{k} in two row ranges, accumulate"),
        );
    }
}

#[test]
fn w8a16_matvec_matches_twin_at_model_shapes() {
    w8a16_matvec_matches_twin_at_model_shapes_on(MemoryLayer::Arena);
}

#[test]
fn array_w8a16_matvec_matches_twin_at_model_shapes() {
    w8a16_matvec_matches_twin_at_model_shapes_on(MemoryLayer::Array);
}

fn w8a16_matvec_matches_twin_at_model_shapes_on(layer: MemoryLayer) {
    let mut o = ops(64 << 20, layer);
    let mut rng = Rng(13);
    for (rows, k) in [(1024, 1024), (3072, 1024), (1024, 3072)] {
        let m = swar::quantize_int8(&rng.weights(rows * k, 0.02), rows, k).unwrap();
        let rm = o.upload_int8(&m).unwrap();
        let x = q16(&rng.activations(k));
        let y0 = rng.vec(rows, 1 << 30);
        let half = rows / 2 / 4 * 4 + 4; // not a multiple of 8: W8A16 blocks are 4 rows
        check_matvec(
            &mut o,
            &m,
            &rm,
            &x,
            &y0,
            &[0..rows],
            false,
            &format!("{rows}x{k}"),
        );
        check_matvec(
            &mut o,
            &m,
            &rm,
            &x,
            &y0,
            &[0..half, half..rows],
            true,
            &format!("{rows}x{k} in two row ranges, accumulate"),
        );
    }
}

/// Codes at the ends of their range, scales from 0 to u32::MAX, activation blocks at the
/// extremes, zero and negative, accumulate into saturated y; and sums so large that they wrap
/// (outside the documented domain, where the kernel and twin still agree bit for bit).
#[test]
fn swar_matvecs_match_twins_on_edge_cases() {
    swar_matvecs_match_twins_on_edge_cases_on(MemoryLayer::Arena);
}

#[test]
fn array_swar_matvecs_match_twins_on_edge_cases() {
    swar_matvecs_match_twins_on_edge_cases_on(MemoryLayer::Array);
}

fn swar_matvecs_match_twins_on_edge_cases_on(layer: MemoryLayer) {
    let mut o = ops(64 << 20, layer);
    let mut rng = Rng(14);
    let (rows, k) = (64, 256);
    let ng = k / GROUP;
    // activation blocks: extremes; zeros; tiny; mixed huge + tiny; all negative; ±1; random; max positive
    let mut x = vec![0i32; k];
    for (g, blk) in x.chunks_mut(GROUP).enumerate() {
        for (j, v) in blk.iter_mut().enumerate() {
            *v = match g {
                0 => [i32::MIN, i32::MAX, -(ACT_MAX as i32), 0][j % 4],
                1 => 0,
                2 => (j as i32 % 5) - 2,
                3 if j == 7 => -(1 << 29),
                3 => (j as i32) * 3 - 40,
                4 => -(rng.sym(1 << 24) as i32).abs() - 1,
                5 => 1 - 2 * (j as i32 % 2),
                6 => rng.sym(1 << 18) as i32,
                _ => i32::MAX,
            };
        }
    }
    for f in [W4A8, W8A16] {
        let (lo, hi) = (-f.bias as i8, (f.bias - 1) as i8);
        // rows: all lo, all hi, alternating, random; scales: per row pattern incl. 0 and u32::MAX
        let mut codes = vec![0i8; rows * k];
        let mut scales = vec![0u32; rows * ng];
        for r in 0..rows {
            for j in 0..k {
                codes[r * k + j] = match r % 4 {
                    0 => lo,
                    1 => hi,
                    2 => [lo, hi][j % 2],
                    _ => rng.sym(f.bias as i64 - 1) as i8,
                };
            }
            for g in 0..ng {
                scales[r * ng + g] = match r / 4 % 4 {
                    0 => 1 << 20,                    // 1/16: ordinary
                    1 => [0, 1, u32::MAX, 3][g % 4], // zero, tiny and huge scales: wraps and saturates
                    2 => rng.next() as u32 >> 8,
                    _ => (1 << 24) + g as u32,
                };
            }
        }
        let y_sat: Vec<i32> = (0..rows)
            .map(|r| match r % 3 {
                0 => ACT_MAX as i32 - 5,
                1 => -(ACT_MAX as i32) + 5,
                _ => rng.sym(1 << 20) as i32,
            })
            .collect();
        for (name, xv) in [
            ("extreme blocks", x.clone()),
            ("negated", x.iter().map(|v| v.wrapping_neg()).collect()),
            ("all zero", vec![0; k]),
        ] {
            if f == W4A8 {
                let m = Int4Matrix::from_codes(rows, k, &codes, &scales);
                let rm = o.upload_int4(&m).unwrap();
                check_matvec(
                    &mut o,
                    &m,
                    &rm,
                    &xv,
                    &vec![0; rows],
                    &[0..rows],
                    false,
                    name,
                );
                check_matvec(
                    &mut o,
                    &m,
                    &rm,
                    &xv,
                    &y_sat,
                    &[0..32, 32..rows],
                    true,
                    &format!("{name}, accumulate into near-saturated y"),
                );
            } else {
                let m = Int8Matrix::from_codes(rows, k, &codes, &scales);
                let rm = o.upload_int8(&m).unwrap();
                check_matvec(
                    &mut o,
                    &m,
                    &rm,
                    &xv,
                    &vec![0; rows],
                    &[0..rows],
                    false,
                    name,
                );
                check_matvec(
                    &mut o,
                    &m,
                    &rm,
                    &xv,
                    &y_sat,
                    &[0..36, 36..rows],
                    true,
                    &format!("{name}, accumulate into near-saturated y"),
                );
            }
        }
    }
    // The largest D a lane must hold: every code at -bias times every activation code at -QMAX:
    // W4 32 * 8 * 127 = 32512 (< 2^15), W8 32 * 128 * 32767 (< 2^31). x = -(2 QMAX - 1) gives
    // e = 1 (a step of 2) and codes -QMAX; with scale 1 << 24 (1.0), y = D * 2 in Q16 exactly.
    for f in [W4A8, W8A16] {
        let x = vec![-(2 * f.act_max as i32 - 1); 32];
        let xq = twin_quantize(&x, f);
        assert_eq!(
            (xq.q[0], xq.blocks[0].shift),
            (-f.act_max, 1),
            "{}: x = {} quantises to -QMAX with e = 1",
            f.name,
            x[0]
        );
        let rows = f.rows_per_block;
        let codes = vec![-f.bias as i8; rows * 32];
        let want_y = vec![32 * f.bias * f.act_max as i32 * 2; rows];
        let mut want = vec![0; rows];
        if f == W4A8 {
            let m = Int4Matrix::from_codes(rows, 32, &codes, &vec![1 << 24; rows]);
            swar::matvec_quantized(&m, &xq, 0..rows, &mut want);
            let rm = o.upload_int4(&m).unwrap();
            check_matvec(
                &mut o,
                &m,
                &rm,
                &x,
                &want,
                &[0..rows],
                false,
                "largest lane sum",
            );
        } else {
            let m = Int8Matrix::from_codes(rows, 32, &codes, &vec![1 << 24; rows]);
            swar::matvec_quantized(&m, &xq, 0..rows, &mut want);
            let rm = o.upload_int8(&m).unwrap();
            check_matvec(
                &mut o,
                &m,
                &rm,
                &x,
                &want,
                &[0..rows],
                false,
                "largest lane sum",
            );
        }
        assert_eq!(
            want, want_y,
            "{}: twin: 32 x (-bias) x (-QMAX) x step 2",
            f.name
        );
    }
}

#[test]
fn swar_lm_heads_match_twins_with_ties_first() {
    swar_lm_heads_match_twins_with_ties_first_on(MemoryLayer::Arena);
}

#[test]
fn array_swar_lm_heads_match_twins_with_ties_first() {
    swar_lm_heads_match_twins_with_ties_first_on(MemoryLayer::Array);
}

fn swar_lm_heads_match_twins_with_ties_first_on(layer: MemoryLayer) {
    let mut o = ops(64 << 20, layer);
    let mut rng = Rng(15);
    let (rows, k) = (4096, 1024);
    let x = q16(&rng.activations(k));
    let w = rng.weights(rows * k, 0.05);
    let m4 = swar::quantize_int4(&w, rows, k).unwrap();
    let m8 = swar::quantize_int8(&w, rows, k).unwrap();
    let (r4, r8) = (o.upload_int4(&m4).unwrap(), o.upload_int8(&m8).unwrap());
    for (f, rm) in [(W4A8, r4), (W8A16, r8)] {
        let xq = bpf_quantize(&mut o, &x, f);
        let ry = o.arena.alloc(rows * 4, "logits").unwrap();
        let run = |o: &mut Ops, y: Option<Region>, rows: std::ops::Range<usize>| {
            if f == W4A8 {
                o.w4a8_lm_head_argmax(&rm, &xq, y, rows).unwrap()
            } else {
                o.w8a16_lm_head_argmax(&rm, &xq, y, rows).unwrap()
            }
        };
        let a = run(&mut o, Some(ry), 0..2048);
        let b = run(&mut o, Some(ry), 2048..rows);
        let c = run(&mut o, None, 0..rows);
        let tq = twin_quantize(&x, f);
        let mut want = vec![0; rows];
        let (wa, wb, wc) = if f == W4A8 {
            (
                swar::lm_head_argmax_quantized(&m4, &tq, 0..2048, Some(&mut want)),
                swar::lm_head_argmax_quantized(&m4, &tq, 2048..rows, Some(&mut want)),
                swar::lm_head_argmax_quantized(&m4, &tq, 0..rows, None),
            )
        } else {
            (
                swar::lm_head_argmax_quantized(&m8, &tq, 0..2048, Some(&mut want)),
                swar::lm_head_argmax_quantized(&m8, &tq, 2048..rows, Some(&mut want)),
                swar::lm_head_argmax_quantized(&m8, &tq, 0..rows, None),
            )
        };
        assert_eq!(get(&o, ry, rows), want, "{}: logits, BPF vs twin", f.name);
        assert_eq!(
            (a, b, c),
            (wa, wb, wc),
            "{}: argmax per row range and over all rows, BPF vs twin",
            f.name
        );
    }
    // ties: identical rows 3, 9 and 12 hold the largest logit; the first (3) wins, also across
    // row blocks and in a range that starts after it
    let (rows, k) = (16, 64);
    let mut codes = vec![0i8; rows * k];
    for r in [3, 9, 12] {
        codes[r * k..(r + 1) * k].iter_mut().for_each(|c| *c = 5);
    }
    let x = vec![1 << 16; k];
    for f in [W4A8, W8A16] {
        let xq = bpf_quantize(&mut o, &x, f);
        let scales = vec![1 << 24; rows * 2];
        let (best, range_best) = if f == W4A8 {
            let rm = o
                .upload_int4(&Int4Matrix::from_codes(rows, k, &codes, &scales))
                .unwrap();
            (
                o.w4a8_lm_head_argmax(&rm, &xq, None, 0..rows).unwrap(),
                o.w4a8_lm_head_argmax(&rm, &xq, None, 8..rows).unwrap(),
            )
        } else {
            let rm = o
                .upload_int8(&Int8Matrix::from_codes(rows, k, &codes, &scales))
                .unwrap();
            (
                o.w8a16_lm_head_argmax(&rm, &xq, None, 0..rows).unwrap(),
                o.w8a16_lm_head_argmax(&rm, &xq, None, 4..rows).unwrap(),
            )
        };
        assert_eq!(best.0, 3, "{}: argmax tie goes to the first row", f.name);
        assert_eq!(
            range_best.0, 9,
            "{}: argmax tie in a later row range goes to its first row",
            f.name
        );
        assert_eq!(best.1, range_best.1, "{}: tied logits are equal", f.name);
    }
    // all-negative logits: the best is still found (the initial best is below -ACT_MAX):
    // 32 columns of weight -8.0 times x = 1000.0 saturate to -32768.0
    let m = Int4Matrix::from_codes(8, 32, &[-8; 256], &[1 << 24; 8]);
    let rm = o.upload_int4(&m).unwrap();
    let xq = bpf_quantize(&mut o, &[1000 << 16; 32], W4A8);
    assert_eq!(
        o.w4a8_lm_head_argmax(&rm, &xq, None, 0..8).unwrap(),
        (0, -(ACT_MAX as i32)),
        "saturated negative logits: row 0, -ACT_MAX"
    );
}

#[test]
fn swar_ops_refuse_mismatched_arguments() {
    swar_ops_refuse_mismatched_arguments_on(MemoryLayer::Arena);
}

#[test]
fn array_swar_ops_refuse_mismatched_arguments() {
    swar_ops_refuse_mismatched_arguments_on(MemoryLayer::Array);
}

fn swar_ops_refuse_mismatched_arguments_on(layer: MemoryLayer) {
    let mut o = ops(16 << 20, layer);
    let m4 = Int4Matrix::from_codes(16, 64, &[1; 1024], &[1 << 24; 32]);
    let m8 = Int8Matrix::from_codes(16, 64, &[1; 1024], &[1 << 24; 32]);
    let (r4, r8) = (o.upload_int4(&m4).unwrap(), o.upload_int8(&m8).unwrap());
    let x8 = o.alloc_quant_x(64, W4A8).unwrap();
    let x16 = o.alloc_quant_x(64, W8A16).unwrap();
    let x8_32 = o.alloc_quant_x(32, W4A8).unwrap();
    let y = o.arena.alloc(16 * 4, "y").unwrap();
    assert!(
        o.w4a8_matvec(&r4, &x16, y, 0..16, false).is_err(),
        "W4A8 with activations quantised for W8A16"
    );
    assert!(
        o.w8a16_matvec(&r4, &x16, y, 0..16, false).is_err(),
        "W8A16 program with a W4 matrix"
    );
    assert!(
        o.w4a8_matvec(&r4, &x8_32, y, 0..16, false).is_err(),
        "x of 32 columns for a 64-column matrix"
    );
    assert!(
        o.w4a8_matvec(&r4, &x8, y, 4..16, false).is_err(),
        "W4A8 rows not whole blocks of 8"
    );
    assert!(
        o.w4a8_matvec(&r4, &x8, y, 0..24, false).is_err(),
        "rows beyond the matrix"
    );
    assert!(
        o.w4a8_matvec(&r4, &x8, y.prefix(8).unwrap(), 0..16, false)
            .is_err(),
        "y too short"
    );
    assert!(
        o.w8a16_matvec(&r8, &x16, y, 4..16, false).is_ok(),
        "W8A16 rows in blocks of 4"
    );
    assert!(o.alloc_quant_x(48, W4A8).is_err(), "k not a multiple of 32");
}
