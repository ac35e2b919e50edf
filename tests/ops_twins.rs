//! Every BPF operator against its Rust twin in `qwen_bpf::num::fixed`, bit for bit, on random inputs
//! and on edge cases (largest norm weights, long attention history, negative and saturating
//! values). These load real BPF programs: they need root (or CAP_BPF + CAP_PERFMON).
//!
//! The operators the array memory layer runs so far (issue 35: `ARRAY_PROGRAMS`) are tested on
//! both layers by the same bodies: the `array_` tests on array maps (natively on a host that
//! refuses arenas, and on Linux 6.1), the others on the arena; each layer equals the twin, so the
//! two equal each other bit for bit.

mod common;

use common::Rng;
use qwen_bpf::kernel::arena::Region;
use qwen_bpf::kernel::memory::MemoryLayer;
use qwen_bpf::kernel::operators::AttentionBuffers;
use qwen_bpf::kernel::ops::{Ops, ARRAY_PROGRAMS};
use qwen_bpf::num::fixed::{self, AttnShape};

fn ops() -> Ops {
    Ops::load(64 << 20).expect("loading the operator programs (needs root / CAP_BPF)")
}

fn ops_on(layer: MemoryLayer) -> Ops {
    common::ops_on(64 << 20, layer)
}

fn put<T: bytemuck::Pod>(o: &mut Ops, data: &[T]) -> Region {
    let r = o
        .arena
        .alloc(std::mem::size_of_val(data).max(8), "test data")
        .unwrap();
    o.arena
        .slice_mut::<T>(r.prefix(std::mem::size_of_val(data)).unwrap())
        .unwrap()
        .copy_from_slice(data);
    r
}

/// The bytes of `rows` of an i32 matrix with `k` columns stored at `w`.
fn rows_of(w: Region, k: usize, rows: std::ops::Range<usize>) -> Region {
    w.sub(rows.start * k * 4, rows.len() * k * 4).unwrap()
}

fn get(o: &Ops, r: Region, n: usize) -> Vec<i32> {
    o.arena
        .slice::<i32>(r.prefix(n * 4).unwrap())
        .unwrap()
        .to_vec()
}

const EPS: f64 = 1e-6;

#[test]
fn formats_agree_between_fixed_h_and_fixed_rs() {
    formats_case(MemoryLayer::Arena);
}

#[test]
fn array_formats_agree_between_fixed_h_and_fixed_rs() {
    formats_case(MemoryLayer::Array);
}

fn formats_case(layer: MemoryLayer) {
    let f = ops_on(layer).formats().unwrap();
    assert_eq!(
        (
            f.q_act,
            f.q_w,
            f.q_norm,
            f.q_nrm,
            f.q_one,
            f.q_scale,
            f.exp2_bits
        ),
        (
            fixed::Q_ACT,
            fixed::Q_W,
            fixed::Q_NORM,
            fixed::Q_NRM,
            fixed::Q_ONE,
            fixed::Q_SCALE,
            fixed::EXP2_BITS
        ),
        "Q formats in src/bpf/fixed.h vs src/num/fixed.rs"
    );
    assert_eq!(
        (f.log2e_q30, f.act_max),
        (fixed::LOG2E_Q30, fixed::ACT_MAX),
        "LOG2E_Q30 and ACT_MAX"
    );
    assert_eq!(
        (f.q_res, f.res_max, f.q_q),
        (fixed::Q_RES, fixed::RES_MAX, fixed::Q_Q),
        "Q_RES, RES_MAX and Q_Q"
    );
}

#[test]
fn matvec_matches_twin_including_residual_add_and_saturation() {
    matvec_case(MemoryLayer::Arena);
}

#[test]
fn array_matvec_matches_twin_including_residual_add_and_saturation() {
    matvec_case(MemoryLayer::Array);
}

fn matvec_case(layer: MemoryLayer) {
    let mut o = ops_on(layer);
    let mut rng = Rng(1);
    for (rows, k, wmax, xmax) in [
        (64, 1024, 1 << 22, 1 << 18),
        (96, 3072, 1 << 24, 1 << 24),
        (8, 32, (1 << 31) - 1, (1 << 31) - 1),
        // 3 * 64 + 8 columns: the array build's steps of 64 columns, then one of 8
        (16, 200, 1 << 24, 1 << 20),
    ] {
        let w = rng.vec(rows * k, wmax);
        let x = rng.vec(k, xmax);
        let (rw, rx) = (put(&mut o, &w), put(&mut o, &x));
        // y = W x (Q16), in two row ranges (w pointing at each range's first row)
        let ry = o.arena.alloc(rows * 4, "y").unwrap();
        o.matvec(rows_of(rw, k, 0..rows / 2), rx, ry, k, 0..rows / 2, false)
            .unwrap();
        o.matvec(
            rows_of(rw, k, rows / 2..rows),
            rx,
            ry,
            k,
            rows / 2..rows,
            false,
        )
        .unwrap();
        let mut want = vec![0; rows];
        fixed::matvec(&w, &x, 0..rows, &mut want);
        assert_eq!(
            get(&o, ry, rows),
            want,
            "matvec {rows}x{k} in two row ranges on the {layer} layer: BPF vs twin"
        );
        // and split across two threads inside Ops (large enough to be split)
        o.set_threads(2);
        let ry2 = o.arena.alloc(rows * 4, "y2").unwrap();
        o.matvec(rw, rx, ry2, k, 0..rows, false).unwrap();
        o.set_threads(1);
        assert_eq!(
            get(&o, ry2, rows),
            want,
            "matvec {rows}x{k} on two threads on the {layer} layer: BPF vs twin"
        );
        // residual add into an i64 Q32 stream, including values next to the saturation bound
        let mut res: Vec<i64> = (0..rows)
            .map(|i| {
                if i % 4 == 0 {
                    fixed::RES_MAX - 5
                } else {
                    rng.sym(1 << 30) * 4096
                }
            })
            .collect();
        let rres = put(&mut o, &res);
        o.matvec(rw, rx, rres, k, 0..rows, true).unwrap();
        fixed::matvec_residual(&w, &x, 0..rows, &mut res);
        assert_eq!(
            o.arena
                .slice::<i64>(rres.prefix(rows * 8).unwrap())
                .unwrap(),
            &res[..],
            "residual add {rows}x{k} on the {layer} layer: BPF vs twin"
        );
    }
}

#[test]
fn rmsnorm_matches_twin_wide_and_per_head_with_large_weights() {
    rmsnorm_case(MemoryLayer::Arena);
}

#[test]
fn array_rmsnorm_matches_twin_wide_and_per_head_with_large_weights() {
    rmsnorm_case(MemoryLayer::Array);
}

fn rmsnorm_case(layer: MemoryLayer) {
    let mut o = ops_on(layer);
    let mut rng = Rng(2);
    let eps = fixed::eps_q64(EPS);
    // (n, nvec, |x| max in Q16, |w| max): ordinary, per-head, tiny inputs, huge activations, k_norm-like weights
    for (n, nvec, xmax, wmax) in [
        (1024, 1, 1 << 16, 1 << 21),
        (128, 16, 1 << 17, 1 << 20),
        (128, 8, 3, 90 << 20),
        (1024, 1, (1 << 31) - 1, 1 << 20),
        (64, 4, 1 << 12, (2047 << 20) + 1),
    ] {
        let x = rng.vec(n * nvec, xmax);
        let w = rng.vec(n, wmax);
        let (rx, rw) = (put(&mut o, &x), put(&mut o, &w));
        let ry = o.arena.alloc(n * nvec * 4, "y").unwrap();
        o.rmsnorm(rx, false, rw, ry, n, nvec, eps).unwrap();
        let mut want = vec![0; n * nvec];
        for (xv, yv) in x.chunks(n).zip(want.chunks_mut(n)) {
            assert!(fixed::rmsnorm(
                &fixed::q16_to_q32(xv),
                &w,
                eps,
                fixed::Q_ACT,
                yv
            ));
        }
        assert_eq!(
            get(&o, ry, n * nvec),
            want,
            "rmsnorm (Q16 input) n={n} nvec={nvec} |x|<={xmax} |w|<={wmax}: BPF vs twin"
        );
    }
    // the wide (i64 Q32 residual) form, from tiny to saturated values
    for (n, xmax) in [
        (1024usize, 1i64 << 26),
        (64, 1 << 40),
        (1024, fixed::RES_MAX),
        (16, 7),
    ] {
        let x: Vec<i64> = (0..n)
            .map(|_| ((rng.next() % (2 * xmax as u64 + 1)) as i64).wrapping_sub(xmax))
            .collect();
        let w = rng.vec(n, 4 << 20);
        let (rx, rw) = (put(&mut o, &x), put(&mut o, &w));
        let ry = o.arena.alloc(n * 4, "y").unwrap();
        o.rmsnorm(rx, true, rw, ry, n, 1, eps).unwrap();
        let mut want = vec![0; n];
        assert!(fixed::rmsnorm(&x, &w, eps, fixed::Q_ACT, &mut want));
        assert_eq!(
            get(&o, ry, n),
            want,
            "rmsnorm (Q32 residual input) n={n} |x|<={xmax}: BPF vs twin"
        );
    }
    // all-zero input: defined output (zeros), no division by zero
    let z = put(&mut o, &[0i32; 64]);
    let w = put(&mut o, &[1i32 << 20; 64]);
    o.rmsnorm(z, false, w, z, 64, 1, eps).unwrap();
    assert_eq!(get(&o, z, 64), vec![0; 64], "rmsnorm of zeros");
}

#[test]
fn rmsnorm_twin_is_accurate() {
    let mut rng = Rng(3);
    // a small-rms residual (like embeddings, ~0.03) and an ordinary one
    for scale in [1i64 << 10, 1 << 17] {
        let x: Vec<i64> = (0..1024).map(|_| rng.sym(scale) * 65536).collect();
        let w: Vec<i32> = (0..1024).map(|i| (1 << 20) + i * 1000).collect();
        let mut y = vec![0; 1024];
        fixed::rmsnorm(&x, &w, fixed::eps_q64(EPS), fixed::Q_ACT, &mut y);
        let xf: Vec<f64> = x.iter().map(|&v| v as f64 / 2f64.powi(32)).collect();
        let inv = 1.0 / (xf.iter().map(|v| v * v).sum::<f64>() / 1024.0 + EPS).sqrt();
        for i in 0..1024 {
            let want = xf[i] * inv * (w[i] as f64 / (1 << 20) as f64);
            let got = y[i] as f64 / 65536.0;
            assert!(
                (got - want).abs() <= 1.0 / 65536.0,
                "rmsnorm[{i}] (scale {scale}): fixed {got} vs f64 {want}"
            );
        }
    }
}

#[test]
fn qk_norm_rope_matches_twin() {
    qk_norm_rope_case(MemoryLayer::Arena);
}

#[test]
fn array_qk_norm_rope_matches_twin() {
    qk_norm_rope_case(MemoryLayer::Array);
}

fn qk_norm_rope_case(layer: MemoryLayer) {
    let mut o = ops_on(layer);
    let mut rng = Rng(4);
    let (n_q, n_k, hd, max_ctx) = (16, 8, 128, 64);
    let (cos, sin) = fixed::rope_tables(1e6, hd, max_ctx);
    let (rcos, rsin) = (put(&mut o, &cos), put(&mut o, &sin));
    let mut qn = rng.vec(hd, 1 << 20);
    let mut kn = rng.vec(hd, 1 << 20);
    qn[5] = 1 << 17; // small q_norm where k_norm is large, like real Qwen3
    kn[5] = 90 << 20;
    let (rqn, rkn) = (put(&mut o, &qn), put(&mut o, &kn));
    for pos in [0, 1, 37, 63] {
        let mut q = rng.vec(n_q * hd, 1 << 19);
        let mut k = rng.vec(n_k * hd, 1 << 19);
        let (rq, rk) = (put(&mut o, &q), put(&mut o, &k));
        o.qk_norm_rope(
            rq,
            rk,
            rqn,
            rkn,
            rcos, // the whole tables: the operator takes row pos
            rsin,
            pos,
            n_q,
            n_k,
            hd,
            fixed::eps_q64(EPS),
        )
        .unwrap();
        let half = hd / 2;
        let (c, s) = (
            &cos[pos * half..(pos + 1) * half],
            &sin[pos * half..(pos + 1) * half],
        );
        fixed::qk_norm_rope(&mut q, &mut k, &qn, &kn, c, s, hd, fixed::eps_q64(EPS));
        assert_eq!(
            get(&o, rq, n_q * hd),
            q,
            "q after q_norm+RoPE at pos {pos}: BPF vs twin"
        );
        assert_eq!(
            get(&o, rk, n_k * hd),
            k,
            "k after k_norm+RoPE at pos {pos}: BPF vs twin"
        );
    }
}

#[test]
fn gate_up_swiglu_matches_twin_over_the_silu_range() {
    let mut o = ops();
    gate_up_case(&mut o);
    swiglu_vec_case(&mut o);
    // the scalar silu against f64, from -40 to 40
    let tab = fixed::exp2_table();
    for i in -400..=400 {
        let gv = i as f64 / 10.0;
        let got = fixed::swiglu((gv * 65536.0) as i32, 65536, &tab) as f64 / 65536.0;
        let want = gv / (1.0 + (-gv).exp());
        assert!((got - want).abs() < 4e-5, "silu({gv}) = {got}, want {want}");
    }
}

#[test]
fn array_gate_up_swiglu_matches_twin() {
    gate_up_case(&mut ops_on(MemoryLayer::Array));
}

/// The fused gate/up projections and SwiGLU.
fn gate_up_case(o: &mut Ops) {
    let layer = o.layer();
    let mut rng = Rng(5);
    let tab = fixed::exp2_table();
    let rt = put(o, &tab);
    for (rows, k, wmax, xmax) in [(64, 1024, 1 << 22, 1 << 18), (32, 256, 1 << 24, 1 << 22)] {
        let g = rng.vec(rows * k, wmax);
        let u = rng.vec(rows * k, wmax);
        let x = rng.vec(k, xmax);
        let (rg, ru, rx) = (put(o, &g), put(o, &u), put(o, &x));
        let ry = o.arena.alloc(rows * 4, "y").unwrap();
        o.gate_up_swiglu(rg, ru, rx, ry, rt, k, 0..rows).unwrap();
        let mut want = vec![0; rows];
        fixed::gate_up_swiglu(&g, &u, &x, 0..rows, &tab, &mut want);
        assert_eq!(
            get(o, ry, rows),
            want,
            "gate_up_swiglu {rows}x{k} on the {layer} layer: BPF vs twin"
        );
    }
}

#[test]
fn array_swiglu_vec_matches_twin_over_the_q16_range() {
    swiglu_vec_case(&mut ops_on(MemoryLayer::Array));
}

/// The elementwise form over the whole Q16 range.
fn swiglu_vec_case(o: &mut Ops) {
    let layer = o.layer();
    let mut rng = Rng(5);
    let tab = fixed::exp2_table();
    let rt = put(o, &tab);
    let n = 4096;
    let (g, u) = (rng.vec(n, (1 << 31) - 1), rng.vec(n, 1 << 20));
    let (rg, ru) = (put(o, &g), put(o, &u));
    let ry = o.arena.alloc(n * 4, "y").unwrap();
    o.swiglu(rg, ru, ry, rt, n).unwrap();
    let want: Vec<i32> = g
        .iter()
        .zip(&u)
        .map(|(&a, &b)| fixed::swiglu(a, b, &tab))
        .collect();
    assert_eq!(
        get(o, ry, n),
        want,
        "swiglu_vec on the {layer} layer: BPF vs twin"
    );
}

/// The array layer loads exactly the programs it has so far and refuses the others by name.
#[test]
fn array_the_layer_runs_its_programs_and_refuses_the_others_by_name() {
    let mut o = ops_on(MemoryLayer::Array);
    let mut loaded: Vec<String> = o
        .verified_instructions()
        .unwrap()
        .into_iter()
        .map(|(name, _)| name)
        .collect();
    loaded.sort();
    // (less what this kernel's verifier is known to refuse: scripts/known-refusals.txt)
    let mut want: Vec<&str> = ARRAY_PROGRAMS
        .iter()
        .copied()
        .filter(|p| !common::known_refused("array", p))
        .collect();
    want.sort();
    assert_eq!(loaded, want, "the array build's programs");
    let e = o.constants().unwrap_err().to_string();
    assert!(
        e.contains("`constants`") && e.contains("not on the array memory layer yet"),
        "{e}"
    );
}

#[test]
fn lm_head_argmax_matches_twin() {
    lm_head_case(MemoryLayer::Arena);
}

#[test]
fn array_lm_head_argmax_matches_twin() {
    lm_head_case(MemoryLayer::Array);
}

fn lm_head_case(layer: MemoryLayer) {
    let mut o = ops_on(layer);
    let mut rng = Rng(6);
    let (rows, k) = (5000, 64);
    let w = rng.vec(rows * k, 1 << 23);
    let x = rng.vec(k, 1 << 18);
    let (rw, rx) = (put(&mut o, &w), put(&mut o, &x));
    let ry = o.arena.alloc(rows * 4, "logits").unwrap();
    let (a, av) = o
        .lm_head_argmax(rows_of(rw, k, 0..3000), rx, Some(ry), k, 0..3000)
        .unwrap();
    let (b, bv) = o
        .lm_head_argmax(rows_of(rw, k, 3000..rows), rx, Some(ry), k, 3000..rows)
        .unwrap();
    let mut want = vec![0; rows];
    let (wa, wav) = fixed::lm_head_argmax(&w, &x, 0..3000, Some(&mut want));
    let (wb, wbv) = fixed::lm_head_argmax(&w, &x, 3000..rows, Some(&mut want));
    assert_eq!(
        get(&o, ry, rows),
        want,
        "logits on the {layer} layer: BPF vs twin"
    );
    assert_eq!(
        ((a, av), (b, bv)),
        ((wa, wav), (wb, wbv)),
        "argmax per row range: BPF vs twin"
    );
    // a 151,936 x 32 head split over two threads: same argmax as the twin over all rows
    let (rows2, k2) = (151_936, 48);
    let w2 = rng.vec(rows2 * k2, 1 << 23);
    let x2 = rng.vec(k2, 1 << 18);
    let (rw2, rx2) = (put(&mut o, &w2), put(&mut o, &x2));
    o.set_threads(2);
    let before = o.runs();
    let got = o.lm_head_argmax(rw2, rx2, None, k2, 0..rows2).unwrap();
    assert_eq!(
        o.runs() - before,
        2,
        "a 7.3M-MAC head runs as two BPF runs on two threads"
    );
    assert_eq!(
        got,
        fixed::lm_head_argmax(&w2, &x2, 0..rows2, None),
        "two-thread argmax vs twin"
    );
    o.set_threads(1);
    // ties go to the first row
    let w3 = vec![1 << 20; 4 * 32];
    let x3 = vec![1 << 16; 32];
    let (rw3, rx3) = (put(&mut o, &w3), put(&mut o, &x3));
    assert_eq!(
        o.lm_head_argmax(rw3, rx3, None, 32, 0..4).unwrap().0,
        0,
        "argmax tie goes to row 0"
    );
}

/// The Qwen3-0.6B head shape over 300 positions, and a head width that is not a multiple of the
/// kernels' four-column steps (their remainder columns).
const ATTENTION_SHAPES: [AttnShape; 2] = [
    AttnShape {
        n_q: 16,
        n_kv: 8,
        hd: 128,
        max_ctx: 300,
    },
    AttnShape {
        n_q: 6,
        n_kv: 2,
        hd: 34,
        max_ctx: 40,
    },
];

#[test]
fn attention_matches_twin_over_a_long_history() {
    for s in ATTENTION_SHAPES {
        attention_case(MemoryLayer::Arena, s);
    }
}

#[test]
fn array_attention_matches_twin_over_a_long_history() {
    for s in ATTENTION_SHAPES {
        attention_case(MemoryLayer::Array, s);
    }
}

fn attention_case(layer: MemoryLayer, s: AttnShape) {
    let mut o = ops_on(layer);
    let mut rng = Rng(7);
    let tab = fixed::exp2_table();
    let scale = fixed::attn_scale_q22(s.hd);
    let kvd = s.n_kv * s.hd;
    let b = AttentionBuffers {
        q: o.arena.alloc(s.n_q * s.hd * 4, "q").unwrap(),
        k: o.arena.alloc(kvd * 4, "k").unwrap(),
        v: o.arena.alloc(kvd * 4, "v").unwrap(),
        k_cache: o.arena.alloc(s.max_ctx * kvd * 4, "kc").unwrap(),
        v_cache: o.arena.alloc(s.max_ctx * kvd * 4, "vc").unwrap(),
        probs: o.arena.alloc(s.n_q * s.max_ctx * 4, "p").unwrap(),
        acc: o.arena.alloc(s.n_q * s.hd * 8, "acc").unwrap(),
        out: o.arena.alloc(s.n_q * s.hd * 4, "out").unwrap(),
        exp2: put(&mut o, &tab),
    };
    let mut kc = vec![0; s.max_ctx * kvd];
    let mut vc = vec![0; s.max_ctx * kvd];
    let mut out = vec![0; s.n_q * s.hd];
    for pos in 0..s.max_ctx {
        // large keys now and then (k_norm outliers) make peaked softmaxes; negative values throughout
        let kmax = if pos % 17 == 3 { 1 << 26 } else { 1 << 18 };
        let q = rng.vec(s.n_q * s.hd, 1 << 18);
        let k = rng.vec(kvd, kmax);
        let v = rng.vec(kvd, 1 << 20);
        o.arena.slice_mut::<i32>(b.q).unwrap().copy_from_slice(&q);
        o.arena.slice_mut::<i32>(b.k).unwrap().copy_from_slice(&k);
        o.arena.slice_mut::<i32>(b.v).unwrap().copy_from_slice(&v);
        o.attention(&b, pos, s, scale).unwrap();
        fixed::attention(&q, &k, &v, &mut kc, &mut vc, pos, s, scale, &tab, &mut out);
        if pos % 50 == 0 || pos == s.max_ctx - 1 {
            assert_eq!(
                get(&o, b.k_cache, s.max_ctx * kvd),
                kc,
                "k cache at pos {pos}"
            );
        }
        assert_eq!(
            get(&o, b.out, s.n_q * s.hd),
            out,
            "attention output at pos {pos}, hd {}: BPF vs twin",
            s.hd
        );
    }
    assert!(
        o.attention(&b, s.max_ctx, s, scale).is_err(),
        "pos == max_ctx must be refused by the kernel"
    );
}

#[test]
fn embed_matches_twin() {
    embed_case(MemoryLayer::Arena);
}

#[test]
fn array_embed_matches_twin() {
    embed_case(MemoryLayer::Array);
}

fn embed_case(layer: MemoryLayer) {
    let mut o = ops_on(layer);
    let mut rng = Rng(8);
    let (vocab, dim) = (100, 64);
    let t = rng.vec(vocab * dim, (1 << 31) - 1);
    let rt = put(&mut o, &t);
    let rx = o.arena.alloc(dim * 8, "x").unwrap();
    for tok in [0u32, 57, 99] {
        o.embed(rt, tok, dim, rx).unwrap();
        let mut want = vec![0i64; dim];
        fixed::embed(&t, tok as usize, dim, &mut want);
        assert_eq!(
            o.arena.slice::<i64>(rx).unwrap(),
            &want[..],
            "embed row {tok}"
        );
    }
}

#[test]
fn odd_row_counts_and_ranges_match_twin() {
    odd_rows_case(MemoryLayer::Arena);
}

#[test]
fn array_odd_row_counts_and_ranges_match_twin() {
    odd_rows_case(MemoryLayer::Array);
}

fn odd_rows_case(layer: MemoryLayer) {
    // the kernels take rows two at a time: odd counts and odd range starts end on a single row
    let mut o = ops_on(layer);
    let mut rng = Rng(9);
    let (rows, k) = (13, 64);
    let w = rng.vec(rows * k, 1 << 23);
    let x = rng.vec(k, 1 << 18);
    let (rw, rx) = (put(&mut o, &w), put(&mut o, &x));
    let ry = o.arena.alloc(rows * 4, "y").unwrap();
    for (a, b) in [(0, 5), (5, 13)] {
        o.matvec(rows_of(rw, k, a..b), rx, ry, k, a..b, false)
            .unwrap();
    }
    let mut want = vec![0; rows];
    fixed::matvec(&w, &x, 0..rows, &mut want);
    assert_eq!(
        get(&o, ry, rows),
        want,
        "matvec over rows 0..5 and 5..13 on the {layer} layer: BPF vs twin"
    );
    let mut res: Vec<i64> = (0..rows as i64).map(|i| i << 40).collect();
    let rres = put(&mut o, &res);
    o.matvec(rows_of(rw, k, 3..10), rx, rres, k, 3..10, true)
        .unwrap();
    fixed::matvec_residual(&w, &x, 3..10, &mut res);
    assert_eq!(
        o.arena
            .slice::<i64>(rres.prefix(rows * 8).unwrap())
            .unwrap(),
        &res[..],
        "residual add over rows 3..10 on the {layer} layer"
    );
    for (a, b) in [(0, 13), (1, 12), (4, 5)] {
        let got = o
            .lm_head_argmax(rows_of(rw, k, a..b), rx, None, k, a..b)
            .unwrap();
        assert_eq!(
            got,
            fixed::lm_head_argmax(&w, &x, a..b, None),
            "argmax over rows {a}..{b} on the {layer} layer"
        );
    }
}

/// The real BPF arena refuses, with a typed error, every view that would be an invalid
/// reference: a sub-region past its region's end, a view misaligned for its element type, a
/// length that is not a whole number of elements, and a region past the mapping.
#[test]
fn arena_views_refuse_misaligned_and_out_of_bounds_regions() {
    use qwen_bpf::Error;
    let mut o = ops();
    let r = o.arena.alloc(64, "test").unwrap();
    let refused = |e: Result<Region, Error>| matches!(e, Err(Error::ArenaView(_)));
    assert!(refused(r.sub(60, 8)), "sub past the end");
    assert!(
        refused(r.sub(usize::MAX, 1)),
        "sub with an overflowing offset"
    );
    let odd = r.sub(2, 8).unwrap();
    assert!(matches!(
        o.arena.slice::<i32>(odd),
        Err(Error::ArenaView(_))
    ));
    assert!(matches!(
        o.arena.slice_mut::<i64>(odd),
        Err(Error::ArenaView(_))
    ));
    assert_eq!(
        o.arena.slice::<u16>(odd).unwrap().len(),
        4,
        "aligned for u16"
    );
    let ragged = r.sub(0, 6).unwrap();
    assert!(matches!(
        o.arena.slice::<u32>(ragged),
        Err(Error::ArenaView(_))
    ));
    // Every region of this arena ends inside it; one of a larger arena may not.
    let mut big = Ops::load(128 << 20).unwrap();
    let far = big.arena.reserve(100 << 20, "far").unwrap();
    assert!(matches!(o.arena.slice::<u8>(far), Err(Error::ArenaView(_))));
    assert!(big.arena.slice_mut::<u8>(far.sub(0, 8).unwrap()).is_ok());
}
