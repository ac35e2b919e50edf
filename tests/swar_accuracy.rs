//! The Rust twins of the low-bit SWAR kernels (`qwen_bpf::num::swar`) on their own, no BPF: the
//! quantisers' error bounds, the twins' accuracy against f64 products of the original f32 weights
//! and activations, and the unquantised wrappers equal to the quantised path. The kernels equal
//! these twins bit for bit (`tests/swar_twins.rs`), so what holds here holds for them.
#![allow(clippy::needless_range_loop)]

mod common;

use common::Rng;
use qwen_bpf::num::swar::{self, PackedMatrix, QuantX, GROUP};

/// `x` in Q16.
fn q16(x: &[f32]) -> Vec<i32> {
    x.iter()
        .map(|&v| (v as f64 * 65536.0).round() as i32)
        .collect()
}

#[test]
fn quantize_dequantize_error_is_at_most_half_a_step() {
    let mut rng = Rng(16);
    let (rows, k) = (64, 1024);
    let mut w = rng.weights(rows * k, 0.03);
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
    let w = rng.weights(rows * k, 0.02);
    let xf = rng.activations(k);
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
fn twin_of_unquantised_wrapper_equals_quantised_path() {
    // w4a8_matvec(x) == matvec_quantized(quantize_x8(x)); the same for W8A16 and the LM heads
    let mut rng = Rng(19);
    let (rows, k) = (32, 128);
    let w = rng.weights(rows * k, 0.1);
    let x = q16(&rng.activations(k));
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
