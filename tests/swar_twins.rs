//! The low-bit SWAR programs (`src/bpf/swar.bpf.h`) against their Rust twins in
//! `qwen_bpf::num::swar`, bit for bit, at the model's real shapes and on edge cases; the twins'
//! accuracy against f64 products of the original f32 weights and activations; and the
//! quantisers' error bounds. These load real BPF programs: they need root (or CAP_BPF +
//! CAP_PERFMON).
//!
//! Speed: `cargo bench --bench swar` (and the `kernels` group of `cargo bench --bench decode`).
// Row ranges are passed as lists of consecutive ranges, often of one.
#![allow(clippy::single_range_in_vec_init, clippy::needless_range_loop)]

mod common;

use common::Rng;
use qwen_bpf::kernel::arena::Region;
use qwen_bpf::kernel::ops::Ops;
use qwen_bpf::kernel::swar_ops::{PackedRegions, QuantXRegion};
use qwen_bpf::num::fixed::ACT_MAX;
use qwen_bpf::num::swar::{
    self, Format, Int4Matrix, Int8Matrix, PackedMatrix, QuantX, GROUP, W4A8, W8A16,
};

/// Weights like a trained layer's: normal with a few large outliers.
fn weights(rng: &mut Rng, n: usize, sd: f64) -> Vec<f32> {
    (0..n)
        .map(|_| {
            (if rng.next() % 500 == 0 {
                rng.normal(sd * 8.0)
            } else {
                rng.normal(sd)
            }) as f32
        })
        .collect()
}

/// Activations in f32 with per-column magnitudes and outlier channels, as after RMSNorm.
fn activations(rng: &mut Rng, n: usize) -> Vec<f32> {
    (0..n)
        .map(|j| (rng.normal(1.0) * if j % 97 == 5 { 40.0 } else { 1.0 }) as f32)
        .collect()
}

fn ops(bytes: usize) -> Ops {
    Ops::load(bytes).expect("loading the operator programs (needs root / CAP_BPF)")
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
    let mut o = ops(16 << 20);
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
    let mut o = ops(64 << 20);
    let mut rng = Rng(12);
    for (rows, k) in [(1024, 1024), (3072, 1024), (1024, 3072)] {
        let m = swar::quantize_int4(&weights(&mut rng, rows * k, 0.02), rows, k).unwrap();
        let rm = o.upload_int4(&m).unwrap();
        let x = q16(&activations(&mut rng, k));
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
    let mut o = ops(64 << 20);
    let mut rng = Rng(13);
    for (rows, k) in [(1024, 1024), (3072, 1024), (1024, 3072)] {
        let m = swar::quantize_int8(&weights(&mut rng, rows * k, 0.02), rows, k).unwrap();
        let rm = o.upload_int8(&m).unwrap();
        let x = q16(&activations(&mut rng, k));
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
    let mut o = ops(64 << 20);
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
    let mut o = ops(64 << 20);
    let mut rng = Rng(15);
    let (rows, k) = (4096, 1024);
    let x = q16(&activations(&mut rng, k));
    let w = weights(&mut rng, rows * k, 0.05);
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
fn quantize_dequantize_error_is_at_most_half_a_step() {
    let mut rng = Rng(16);
    let (rows, k) = (64, 1024);
    let mut w = weights(&mut rng, rows * k, 0.03);
    w[5] = 0.0;
    w[k..k + 32].iter_mut().for_each(|v| *v = 0.0); // an all-zero group
    w[2 * k] = 1700.0; // near the INT4 limit
    w[3 * k] = -3e-9; // a tiny group maximum
    w[3 * k + 1..3 * k + 32].iter_mut().for_each(|v| *v = 1e-9);
    let one = (1u64 << swar::SCALE_SHIFT) as f64;
    let m4 = swar::quantize_int4(&w, rows, k).unwrap();
    let m8 = swar::quantize_int8(&w, rows, k).unwrap();
    for (name, d, scale, cmax) in [
        (
            "int4",
            m4.dequantize(),
            (0..rows * k)
                .map(|i| m4.scale(i / k, i % k / GROUP))
                .collect::<Vec<_>>(),
            7,
        ),
        (
            "int8",
            m8.dequantize(),
            (0..rows * k)
                .map(|i| m8.scale(i / k, i % k / GROUP))
                .collect::<Vec<_>>(),
            127,
        ),
    ] {
        for i in 0..rows * k {
            let step = scale[i] as f64 / one;
            let err = (w[i] as f64 - d[i]).abs();
            // int4 scales are chosen for the least squared error and may clip a rare large
            // weight: only weights inside the code range are bound to half a step
            if cmax == 127 || (w[i] as f64).abs() <= 7.0 * step {
                assert!(
                    err <= step / 2.0 * (1.0 + 1e-12),
                    "{name}: weight {i} = {} dequantises to {} (error {err}, step {step})",
                    w[i],
                    d[i]
                );
            }
        }
        if cmax == 7 {
            // and no group does worse than the max-based scale (every weight within half a step)
            for grp in 0..rows * k / 32 {
                let ws = &w[grp * 32..grp * 32 + 32];
                let a = ws.iter().map(|v| v.abs() as f64).fold(0.0, f64::max);
                let s = (a * one / 7.0).ceil() / one;
                let max_based: f64 = ws
                    .iter()
                    .map(|&v| (v as f64 - (v as f64 / s).round().clamp(-7.0, 7.0) * s).powi(2))
                    .sum::<f64>();
                let chosen: f64 = ws
                    .iter()
                    .zip(&d[grp * 32..grp * 32 + 32])
                    .map(|(&v, &q)| (v as f64 - q).powi(2))
                    .sum();
                assert!(
                    s == 0.0 || chosen <= max_based * (1.0 + 1e-9),
                    "int4 group {grp}: squared error {chosen} > max-based {max_based}"
                );
            }
        }
        assert_eq!(
            &d[k..k + 32],
            &[0.0; 32],
            "{name}: an all-zero group dequantises to zeros"
        );
        // the step is the group maximum / code_max, rounded up by less than one Q24 unit (for
        // int4, a group whose maximum dwarfs the rest keeps it)
        let (r, g) = (2, 0);
        let a = w[r * k..r * k + 32]
            .iter()
            .map(|v| v.abs() as f64)
            .fold(0.0, f64::max);
        let step = scale[r * k + g * 32] as f64 / one;
        assert!(
            step >= a / cmax as f64 && step < a / cmax as f64 + 1.0 / one,
            "{name}: step {step} for a group maximum {a}"
        );
    }
    assert!(
        swar::quantize_int4(&[f32::NAN; 256], 8, 32).is_err(),
        "NaN weights are an error"
    );
    assert!(
        swar::quantize_int4(&[2000.0; 256], 8, 32).is_err(),
        "INT4 weights >= 1792 are an error"
    );
    assert!(
        swar::quantize_int8(&[2000.0; 128], 4, 32).is_ok(),
        "INT8 holds 2000"
    );
}

/// Accuracy of the twins (hence of the kernels) against f64 products of the ORIGINAL f32 weights
/// and activations, at a real shape.
///
/// Rigorous bound, per output: the kernel computes `Σ ŵ x̂` exactly (ŵ = code * s, x̂ = xq · 2^e)
/// and rounds once to Q16, so with e_w = |ŵ - w| <= s/2 (checked above) and
/// e_x = |x̂ - x| <= 2^e/2 + 2^-17 (activation code rounding plus the f32 -> Q16 rounding),
/// `|y - Σ w x| <= Σ (|ŵ| e_x + e_w |x|) + 2^-17`. We check it with the actual scales.
///
/// Typical error: rounding errors are close to uniform and independent, so the relative RMS error
/// is about `sqrt(Σ x² step²/12) / sqrt(Σ w² x²)` ≈ (step / σ_w) / sqrt(12). For normal weights a
/// group's maximum of 32 is ≈ 2.1-2.5 σ (more with outliers), so INT4 (step = max/7) gives about
/// 0.35 σ / 3.46 ≈ 10%, INT8 (max/127) ≈ 0.6%; we assert 14% and 1% (and print the values).
#[test]
fn swar_twins_are_accurate_against_f32_weights_and_activations() {
    let mut rng = Rng(17);
    let (rows, k) = (1024, 3072);
    let w = weights(&mut rng, rows * k, 0.02);
    let xf = activations(&mut rng, k);
    let x = q16(&xf);
    let exact: Vec<f64> = (0..rows)
        .map(|r| (0..k).map(|j| w[r * k + j] as f64 * xf[j] as f64).sum())
        .collect();
    let m4 = swar::quantize_int4(&w, rows, k).unwrap();
    let m8 = swar::quantize_int8(&w, rows, k).unwrap();
    let (mut y4, mut y8) = (vec![0; rows], vec![0; rows]);
    swar::w4a8_matvec(&m4, &x, 0..rows, &mut y4);
    swar::w8a16_matvec(&m8, &x, 0..rows, &mut y8);
    let rel4 = check_accuracy(&m4, &swar::quantize_x8(&x), &y4, &w, &xf, &exact);
    let rel8 = check_accuracy(&m8, &swar::quantize_x16(&x), &y8, &w, &xf, &exact);
    println!("relative RMS error vs f32 weights and activations ({rows}x{k}): w4a8 {rel4:.4}, w8a16 {rel8:.4}");
    assert!(rel4 <= 0.14, "w4a8: relative RMS error {rel4} above 0.14");
    assert!(rel8 <= 0.01, "w8a16: relative RMS error {rel8} above 0.01");
}

/// Checks every output of `y` (twin of `m` times `xq`) against the rigorous bound around `exact`
/// (the f64 products of the original `w` and `xf`); returns the relative RMS error.
fn check_accuracy<M: PackedMatrix>(
    m: &M,
    xq: &QuantX,
    y: &[i32],
    w: &[f32],
    xf: &[f32],
    exact: &[f64],
) -> f64 {
    let (rows, k) = (m.rows(), m.cols());
    let one = (1u64 << swar::SCALE_SHIFT) as f64;
    let mut sq = 0.0;
    for r in 0..rows {
        let got = y[r] as f64 / 65536.0;
        let err = got - exact[r];
        sq += err * err;
        let mut bound = 0.5 / 65536.0;
        for j in 0..k {
            let ex = ((1u64 << xq.blocks[j / GROUP].shift) as f64 / 2.0 + 0.5) / 65536.0;
            let ew = m.scale(r, j / GROUP) as f64 / one / 2.0;
            bound += m.weight(r, j).abs() * ex + ew * (xf[j] as f64).abs();
        }
        assert!(
            err.abs() <= bound,
            "{} row {r}: y = {got} vs f64 {} (error {err} above the bound {bound}; w[r][0] = {})",
            M::FORMAT.name,
            exact[r],
            w[r * k]
        );
    }
    let norm = exact.iter().map(|v| v * v).sum::<f64>();
    (sq / norm).sqrt()
}

#[test]
fn swar_ops_refuse_mismatched_arguments() {
    let mut o = ops(16 << 20);
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

#[test]
fn twin_of_unquantised_wrapper_equals_quantised_path() {
    // w4a8_matvec(x) == matvec_quantized(quantize_x8(x)); the same for W8A16 and the LM heads
    let mut rng = Rng(19);
    let (rows, k) = (32, 128);
    let w = weights(&mut rng, rows * k, 0.1);
    let x = q16(&activations(&mut rng, k));
    let (m4, m8) = (
        swar::quantize_int4(&w, rows, k).unwrap(),
        swar::quantize_int8(&w, rows, k).unwrap(),
    );
    let (mut a, mut b) = (vec![0; rows], vec![0; rows]);
    swar::w4a8_matvec(&m4, &x, 0..rows, &mut a);
    swar::matvec_quantized(&m4, &swar::quantize_x8(&x), 0..rows, &mut b);
    assert_eq!(a, b, "w4a8_matvec vs quantize_x8 + matvec_quantized");
    swar::w8a16_matvec(&m8, &x, 0..rows, &mut a);
    swar::matvec_quantized(&m8, &swar::quantize_x16(&x), 0..rows, &mut b);
    assert_eq!(a, b, "w8a16_matvec vs quantize_x16 + matvec_quantized");
    assert_eq!(
        swar::w4a8_lm_head_argmax(&m4, &x, 0..rows, None),
        swar::lm_head_argmax_quantized(&m4, &swar::quantize_x8(&x), 0..rows, None),
        "w4a8 LM head"
    );
    assert_eq!(
        swar::w8a16_lm_head_argmax(&m8, &x, 0..rows, None),
        swar::lm_head_argmax_quantized(&m8, &swar::quantize_x16(&x), 0..rows, None),
        "w8a16 LM head"
    );
}
