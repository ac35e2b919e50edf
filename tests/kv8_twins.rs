//! The int8 KV-cache attention (`attention_i8` in `src/bpf/kv8.inc.c`) against its Rust twin
//! `qwen_bpf::num::kv8::attention`, bit for bit: codes, steps and outputs, over a long history, for
//! GQA groups of one, two and three heads, head widths that are and are not multiples of four,
//! on one thread and on kv heads split across two. Also: what committing arena memory ahead of
//! use is for (a BPF store to a page never committed is dropped). Needs root (loads BPF).

mod common;

use common::Rng;
use qwen_bpf::kernel::arena::Region;
use qwen_bpf::kernel::memory::MemoryLayer;
use qwen_bpf::kernel::operators::{kv8_pairs, AttentionI8Buffers};
use qwen_bpf::kernel::ops::Ops;
use qwen_bpf::num::fixed::{self, AttnShape};
use qwen_bpf::num::kv8;

fn ops(layer: MemoryLayer) -> Ops {
    common::ops_on(256 << 20, layer)
}

/// Key smoothing shifts with a few large ones (k_norm outlier pairs), up to the largest.
fn shifts(hd: usize) -> Vec<u8> {
    (0..hd)
        .map(|d| match d % 11 {
            3 => 6,
            7 if d % 2 == 0 => kv8::SHIFT_MAX as u8,
            _ => 0,
        })
        .collect()
}

/// Every buffer of one attention run for shape `s`, the exp2 table and the shifts `ksh` filled in.
/// Each kv head's codes and steps start `pad` bytes after the previous head's end (0: dense, as
/// the twin's arrays; the model's heads are page aligned).
fn buffers(o: &mut Ops, s: AttnShape, ksh: &[u8], pad: usize) -> AttentionI8Buffers {
    let (kvd, pairs) = (s.n_kv * s.hd, kv8_pairs(s.n_q, s.n_kv));
    let (cs, ss) = (s.max_ctx * s.hd + pad, s.max_ctx * 4 + pad);
    let a = &mut o.arena;
    let b = AttentionI8Buffers {
        q: a.alloc(s.n_q * s.hd * 4, "q").unwrap(),
        k: a.alloc(kvd * 4, "k").unwrap(),
        v: a.alloc(kvd * 4, "v").unwrap(),
        k_codes: a.alloc(s.n_kv * cs, "kc").unwrap(),
        k_steps: a.alloc(s.n_kv * ss, "ks").unwrap(),
        v_codes: a.alloc(s.n_kv * cs, "vc").unwrap(),
        v_steps: a.alloc(s.n_kv * ss, "vs").unwrap(),
        codes_stride: cs,
        steps_stride: ss,
        probs: a.alloc(s.n_q * s.max_ctx * 4, "p").unwrap(),
        wv: a.alloc(pairs * s.max_ctx * 8, "wv").unwrap(),
        qq: a.alloc(pairs * s.hd * 8, "qq").unwrap(),
        acc: a.alloc(pairs * s.hd * 8, "acc").unwrap(),
        out: a.alloc(s.n_q * s.hd * 4, "out").unwrap(),
        exp2: a.alloc(257 * 4, "exp2").unwrap(),
        ksh: a.alloc(s.hd, "ksh").unwrap(),
    };
    a.slice_mut::<u32>(b.exp2)
        .unwrap()
        .copy_from_slice(&fixed::exp2_table());
    a.slice_mut::<u8>(b.ksh).unwrap().copy_from_slice(ksh);
    b
}

/// kv head j's part of an arena array of heads `stride` bytes apart, `n` elements each.
fn head<T: bytemuck::Pod>(o: &Ops, r: Region, stride: usize, j: usize, n: usize) -> &[T] {
    let r = r.sub(j * stride, n * size_of::<T>()).unwrap();
    o.arena.slice::<T>(r).unwrap()
}

fn check(layer: MemoryLayer, s: AttnShape, threads: usize, seed: u64, extremes: bool, pad: usize) {
    let mut o = ops(layer);
    o.set_threads(threads);
    o.set_par_min_macs(0); // split kv heads across the threads at every position
    let mut rng = Rng(seed);
    let tab = fixed::exp2_table();
    let scale = fixed::attn_scale_q22(s.hd);
    let kvd = s.n_kv * s.hd;
    let ksh = shifts(s.hd);
    let b = buffers(&mut o, s, &ksh, pad);
    let mut cache = kv8::Cache::new(s);
    let mut out = vec![0; s.n_q * s.hd];
    for pos in 0..s.max_ctx {
        // k_norm outliers now and then (peaked softmaxes), all-zero rows, the largest
        // activations, and ordinary values; negative values throughout
        let (qmax, kmax, vmax) = match pos % 13 {
            3 => (1 << 20, 1 << 26, 1 << 12),
            7 if extremes => ((1 << 31) - 1, (1 << 31) - 1, (1 << 31) - 1),
            9 => (1 << 18, 0, 0),
            _ => (1 << 18, 1 << 18, 1 << 16),
        };
        let q = rng.vec(s.n_q * s.hd, qmax);
        let k = rng.vec(kvd, kmax);
        let v = rng.vec(kvd, vmax);
        o.arena.slice_mut::<i32>(b.q).unwrap().copy_from_slice(&q);
        o.arena.slice_mut::<i32>(b.k).unwrap().copy_from_slice(&k);
        o.arena.slice_mut::<i32>(b.v).unwrap().copy_from_slice(&v);
        o.attention_i8(&b, pos, s, scale).unwrap();
        kv8::attention(&q, &k, &v, &mut cache, &ksh, pos, s, scale, &tab, &mut out);
        if pos % 40 == 0 || pos == s.max_ctx - 1 {
            let (n, cs, ss) = (s.max_ctx, b.codes_stride, b.steps_stride);
            for j in 0..s.n_kv {
                let (codes, steps) = (j * n * s.hd..(j + 1) * n * s.hd, j * n..(j + 1) * n);
                assert_eq!(
                    head::<i8>(&o, b.k_codes, cs, j, n * s.hd),
                    &cache.k_codes[codes.clone()],
                    "{s:?}: key codes of kv head {j} at pos {pos}, BPF vs twin"
                );
                assert_eq!(
                    head::<u32>(&o, b.k_steps, ss, j, n),
                    &cache.k_steps[steps.clone()],
                    "{s:?}: key steps of kv head {j} at pos {pos}, BPF vs twin"
                );
                assert_eq!(
                    head::<i8>(&o, b.v_codes, cs, j, n * s.hd),
                    &cache.v_codes[codes],
                    "{s:?}: value codes of kv head {j} at pos {pos}, BPF vs twin"
                );
                assert_eq!(
                    head::<u32>(&o, b.v_steps, ss, j, n),
                    &cache.v_steps[steps],
                    "{s:?}: value steps of kv head {j} at pos {pos}, BPF vs twin"
                );
            }
        }
        assert_eq!(
            o.arena.slice::<i32>(b.out).unwrap(),
            &out[..],
            "{s:?}, {threads} thread(s), {layer} layer: attention output at pos {pos}, BPF vs twin"
        );
    }
    assert!(
        o.attention_i8(&b, s.max_ctx, s, scale).is_err(),
        "pos == max_ctx must be refused by the kernel"
    );
}

#[test]
fn int8_attention_matches_twin_qwen3_shape() {
    int8_attention_matches_twin_qwen3_shape_on(MemoryLayer::Arena);
}

#[test]
fn array_int8_attention_matches_twin_qwen3_shape() {
    int8_attention_matches_twin_qwen3_shape_on(MemoryLayer::Array);
}

fn int8_attention_matches_twin_qwen3_shape_on(layer: MemoryLayer) {
    let s = AttnShape {
        n_q: 16,
        n_kv: 8,
        hd: 128,
        // past one block of KV8_TBLOCK = 256 value rows, so that kv8_axpys runs full blocks of
        // eight-row steps, a second block, and every remainder n % 8
        max_ctx: 270,
    };
    check(layer, s, 1, 11, true, 0);
    // kv heads apart by more than their rows, as the model's page-aligned parts are
    check(layer, s, 2, 16, false, 4096 + 12);
}

#[test]
fn int8_attention_matches_twin_on_two_threads_and_odd_groups() {
    int8_attention_matches_twin_on_two_threads_and_odd_groups_on(MemoryLayer::Arena);
}

#[test]
fn array_int8_attention_matches_twin_on_two_threads_and_odd_groups() {
    int8_attention_matches_twin_on_two_threads_and_odd_groups_on(MemoryLayer::Array);
}

fn int8_attention_matches_twin_on_two_threads_and_odd_groups_on(layer: MemoryLayer) {
    // group of three (a pair and a single head), head_dim not a multiple of four
    check(
        layer,
        AttnShape {
            n_q: 6,
            n_kv: 2,
            hd: 66,
            max_ctx: 120,
        },
        2,
        12,
        true,
        0,
    );
    // no GQA (single heads only), wide heads
    check(
        layer,
        AttnShape {
            n_q: 2,
            n_kv: 2,
            hd: 256,
            max_ctx: 90,
        },
        2,
        13,
        false,
        36,
    );
    // one kv head for four query heads, hd at the lane algebra's limit
    check(
        layer,
        AttnShape {
            n_q: 4,
            n_kv: 1,
            hd: 512,
            max_ctx: 40,
        },
        2,
        14,
        true,
        0,
    );
}

#[test]
fn int8_attention_is_close_to_exact_attention() {
    // the int8 cache's error against the Q16 path, on ordinary values: a few Q16 units per
    // output of magnitude ~2^16, i.e. well below 1 % (one int8 step is 1/127 of a row's max)
    let s = AttnShape {
        n_q: 4,
        n_kv: 2,
        hd: 64,
        max_ctx: 64,
    };
    let mut rng = Rng(15);
    let tab = fixed::exp2_table();
    let scale = fixed::attn_scale_q22(s.hd);
    let kvd = s.n_kv * s.hd;
    let (mut kc, mut vc) = (vec![0; s.max_ctx * kvd], vec![0; s.max_ctx * kvd]);
    let mut cache = kv8::Cache::new(s);
    let (mut exact, mut approx) = (vec![0; s.n_q * s.hd], vec![0; s.n_q * s.hd]);
    let (mut worst, mut vmax_seen) = (0i64, 0i64);
    for pos in 0..s.max_ctx {
        let q = rng.vec(s.n_q * s.hd, 1 << 22);
        let k = rng.vec(kvd, 1 << 16);
        let v = rng.vec(kvd, 1 << 16);
        fixed::attention(
            &q, &k, &v, &mut kc, &mut vc, pos, s, scale, &tab, &mut exact,
        );
        kv8::attention(
            &q,
            &k,
            &v,
            &mut cache,
            &vec![0; s.hd],
            pos,
            s,
            scale,
            &tab,
            &mut approx,
        );
        for (e, a) in exact.iter().zip(&approx) {
            worst = worst.max((*e as i64 - *a as i64).abs());
            vmax_seen = vmax_seen.max((*e as i64).abs());
        }
    }
    assert!(
        vmax_seen > 1 << 12,
        "the test's outputs are not trivially small ({vmax_seen})"
    );
    // one value step is 2^16 / 127 ~ 516 units; attention averages, so the error stays below it
    assert!(
        worst < 1 << 10,
        "int8 attention differs from exact by up to {worst} Q16 units"
    );
}

#[test]
fn a_bpf_store_to_an_uncommitted_page_is_dropped_and_commit_makes_it_land() {
    // the arena's lazily allocated pages (array maps are allocated whole when created)
    let mut o = ops(MemoryLayer::Arena);
    let s = AttnShape {
        n_q: 2,
        n_kv: 1,
        hd: 64,
        max_ctx: 8,
    };
    let scale = fixed::attn_scale_q22(s.hd);
    let mut b = buffers(&mut o, s, &vec![0; s.hd], 0);
    // key codes in reserved, never-touched pages
    b.k_codes = o.arena.reserve(s.max_ctx * s.hd, "kc").unwrap();
    o.arena.slice_mut::<i32>(b.k).unwrap().fill(1 << 16);
    o.arena.slice_mut::<i32>(b.v).unwrap().fill(1 << 16);
    o.attention_i8(&b, 0, s, scale).unwrap();
    assert!(
        o.arena
            .slice::<i8>(b.k_codes)
            .unwrap()
            .iter()
            .all(|&c| c == 0),
        "the kernel's key codes went to an uncommitted page and must have been dropped"
    );
    o.arena.commit(b.k_codes, 0, b.k_codes.len());
    o.attention_i8(&b, 0, s, scale).unwrap();
    assert!(
        o.arena.slice::<i8>(b.k_codes).unwrap()[..s.hd]
            .iter()
            .all(|&c| c == 127),
        "after commit the kernel's key codes land"
    );
}
