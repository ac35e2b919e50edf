//! The third executor of the recorded plan: the Rust twins (`qwen_bpf::verify::twin_plan`) run on a
//! model's own arena compute the same logits and argmax as the BPF kernel, bit for bit, for every
//! weight store that records a plan, both KV formats, and one or two threads (whose plans split
//! the LM head and the int8-KV attention into parts).

mod common;

use qwen_bpf::kernel::arena::Region;
use qwen_bpf::kernel::ops::Ops;
use qwen_bpf::num::swar;
use qwen_bpf::verify::twin_plan;
use qwen_bpf::{Backend, KvFormat, ModelOptions};

/// Tokens fed at positions 0, 1, ...: both ends of the vocabulary, a repeat.
const TOKENS: [u32; 12] = [
    785, 3974, 0, 38835, 916, 151_935, 15678, 785, 13, 151_644, 9707, 11,
];

/// For each KV format and thread count: model `bpf` runs each token in the kernel (logits, then
/// again at the same position for the kernel head's argmax); model `twin`, opened alike, runs
/// its own plan with the twin executor.
fn twin_plan_matches_bpf(backend: Backend) {
    let dir = common::tiny_model("plan-twin");
    for kv in [KvFormat::Q16, KvFormat::Int8] {
        for threads in [1, 2] {
            let what = format!(
                "{} store, {} KV, {threads} threads",
                backend.name(),
                kv.name()
            );
            let opts = ModelOptions {
                screened_head: false, // next_token runs the plan's own head
                ..ModelOptions::default()
                    .with_backend(backend)
                    .with_kv(kv)
                    .with_threads(threads)
                    .with_max_context(40)
            };
            let mut bpf = common::open(&dir, opts.clone());
            let mut twin = common::open(&dir, opts);
            let plan = twin.plan().expect("the store records a plan");
            assert_eq!(plan.threads, threads, "{what}: threads of the plan");
            let head = plan.entries.last().expect("a plan ends with the head");
            assert_eq!(
                head.parts.len(),
                threads,
                "{what}: parts of the LM head entry"
            );
            if kv == KvFormat::Int8 {
                let attn = plan.entries.iter().find(|e| e.name() == "attention_i8");
                assert_eq!(
                    attn.map(|e| e.parts.len()),
                    Some(threads),
                    "{what}: parts of the int8-KV attention entry (kv heads split)"
                );
            }
            for (pos, &t) in TOKENS.iter().enumerate() {
                let want = bpf.forward_fixed(t).unwrap().to_vec();
                bpf.rewind(pos).unwrap();
                let bpf_best = bpf.next_token(t).unwrap() as usize;
                let (got, (best, best_val)) = twin.twin_forward_fixed(t).unwrap();
                assert!(
                    got == want,
                    "{what}: logits at position {pos}, twin executor vs BPF: {} of {} differ, first at row {:?}",
                    got.iter().zip(&want).filter(|(a, b)| a != b).count(),
                    want.len(),
                    got.iter().zip(&want).position(|(a, b)| a != b)
                );
                assert_eq!(
                    best, bpf_best,
                    "{what}: argmax row at position {pos}, twin executor vs BPF head"
                );
                assert_eq!(
                    best_val, want[best],
                    "{what}: argmax logit at position {pos}, twin executor vs the BPF logits"
                );
                let first_max = (0..want.len()).max_by_key(|&r| (want[r], std::cmp::Reverse(r)));
                assert_eq!(
                    Some(best),
                    first_max,
                    "{what}: argmax row at position {pos}, twin executor vs the first maximum of the BPF logits"
                );
            }
            assert_eq!(
                (bpf.position(), twin.position()),
                (TOKENS.len(), TOKENS.len()),
                "{what}: positions after the tokens, BPF and twin executor"
            );
        }
    }
}

#[test]
fn twin_plan_matches_bpf_q24() {
    twin_plan_matches_bpf(Backend::Q24);
}

#[test]
fn twin_plan_matches_bpf_int4() {
    twin_plan_matches_bpf(Backend::Int4);
}

#[test]
fn twin_plan_matches_bpf_int8() {
    twin_plan_matches_bpf(Backend::Int8);
}

/// Every SWAR entry (both quantisers, store and accumulate matvecs, the LM heads with and
/// without logits, split in parts), run once in BPF and once by the twin executor from the same
/// arena: the whole arena afterwards, and the parts' ctx (argmaxes), are identical. The W4A8 LM
/// head is covered only here: both int stores use a W8A16 head.
#[test]
fn swar_entries_match_bpf_byte_for_byte() {
    let mut o = Ops::load(8 << 20).expect("loading the operator programs (needs root / CAP_BPF)");
    o.set_threads(2);
    o.set_par_min_macs(0); // every matrix entry in two parts
    let (rows, k) = (64, 96);
    let mut rng = common::Rng(0x5eed);
    let w: Vec<f32> = (0..rows * k).map(|_| rng.normal(0.05) as f32).collect();
    let m4 = o
        .upload_int4(&swar::quantize_int4(&w, rows, k).unwrap())
        .unwrap();
    let m8 = o
        .upload_int8(&swar::quantize_int8(&w, rows, k).unwrap())
        .unwrap();
    let put = |o: &mut Ops, bytes: &[u8]| {
        let r = o.arena.alloc(bytes.len(), "test data").unwrap();
        o.arena.slice_mut::<u8>(r).unwrap().copy_from_slice(bytes);
        r
    };
    let x = put(&mut o, bytemuck::cast_slice(&rng.vec(k, 3 << 16)));
    let residual: Vec<i64> = (0..rows).map(|_| rng.sym(1 << 34)).collect();
    let res = put(&mut o, bytemuck::cast_slice(&residual));
    let y = o.arena.alloc(rows * 4, "logits").unwrap();
    let xq4 = o.alloc_quant_x(k, swar::W4A8).unwrap();
    let xq8 = o.alloc_quant_x(k, swar::W8A16).unwrap();
    let entries = o
        .record(|o| {
            o.quantize_x(x, &xq4)?;
            o.quantize_x(x, &xq8)?;
            o.w4a8_matvec(&m4, &xq4, y, 8..rows, false)?;
            o.w4a8_matvec(&m4, &xq4, res, 0..rows, true)?;
            o.w8a16_matvec(&m8, &xq8, y, 4..rows - 4, false)?;
            o.w8a16_matvec(&m8, &xq8, res, 4..rows, true)?;
            o.w4a8_lm_head_argmax(&m4, &xq4, Some(y), 0..rows)?;
            o.w4a8_lm_head_argmax(&m4, &xq4, None, 16..rows)?;
            o.w8a16_lm_head_argmax(&m8, &xq8, Some(y), 0..rows)?;
            o.w8a16_lm_head_argmax(&m8, &xq8, None, 8..rows - 8)?;
            Ok(())
        })
        .unwrap();
    let all = o
        .arena
        .region_at(o.arena.addr(Region::default()), o.arena.used())
        .unwrap();
    for (i, e) in entries.iter().enumerate() {
        let what = format!("entry {i} ({}, {} parts)", e.name(), e.parts.len());
        let before = o.arena.slice::<u8>(all).unwrap().to_vec();
        let bpf_parts = o.run_entry(e, 0, 0).unwrap();
        let bpf = o.arena.slice::<u8>(all).unwrap().to_vec();
        o.arena
            .slice_mut::<u8>(all)
            .unwrap()
            .copy_from_slice(&before);
        let twin_parts = twin_plan::run_entry(&mut o.arena, e, 0, 0).unwrap();
        let twin = o.arena.slice::<u8>(all).unwrap();
        assert!(
            twin == bpf,
            "{what}: the arena after the run, twin executor vs BPF: first difference at byte {:?}",
            twin.iter().zip(&bpf).position(|(a, b)| a != b)
        );
        if e.head.is_none() {
            assert!(before != bpf, "{what}: the run wrote to the arena");
        }
        assert_eq!(
            twin_parts, bpf_parts,
            "{what}: the parts' ctx after the run, twin executor vs BPF"
        );
    }
}
