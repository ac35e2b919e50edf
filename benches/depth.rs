//! One decode step at context depth: the int4 store at depths 0, 1,024, 4,096, 16,384 and
//! 40,959, for each KV format, in one run so that the ratios between depths and formats are
//! comparable; then the floor under attention at each depth.
//!
//! ```text
//! cargo bench --bench depth
//! cargo bench --bench depth -- 'depth/int8/(0|4096)$|floor'   # the issue's ratio and its floor
//! ```
//!
//! The `floor` group times the 64-bit multiplies that int8 attention needs at a depth (one per
//! key or value code and pair of query heads: layers × kv heads × ⌈group / 2⌉ × positions ×
//! head_dim × 2) as a bare BPF multiply loop (`qwen_bpf::kernel::floor`) on the model's threads:
//! what the attention part of a step costs at the least on this machine, whatever its kernel.
//!
//! On the synthetic Qwen3-0.6B of `qwen_bpf::hf::default_model` (or `$QWEN_BPF_BENCH_MODEL`). The
//! cache is filled by repeating the K/V rows of a few real tokens (`Model::bench_fill_context`),
//! not by decoding 40,000 tokens: attention costs the same whatever the rows hold. Q16 KV stops
//! at the deepest context whose cache (224 KiB per position at the 0.6B shape) fits the 4 GiB
//! arena beside the weights. Needs root (or CAP_BPF + CAP_PERFMON).

use std::hint::black_box;
use std::path::PathBuf;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use qwen_bpf::kernel::floor::with_mul_peak;
use qwen_bpf::kernel::operators::kv8_pairs;
use qwen_bpf::{Backend, Checkpoint, KvFormat, Model, ModelOptions};

/// The first token fed (" The").
const FIRST_TOKEN: u32 = 785;

fn model_dir() -> PathBuf {
    match std::env::var_os("QWEN_BPF_BENCH_MODEL") {
        Some(dir) if !dir.is_empty() => PathBuf::from(dir),
        _ => qwen_bpf::ensure_default_model(None, true).expect("generating the default model"),
    }
}

/// Context depths of the depth group.
const DEPTHS: [usize; 5] = [0, 1024, 4096, 16384, 40959];

fn depth(c: &mut Criterion) {
    let dir = model_dir();
    let max_pos = Checkpoint::open(&dir)
        .expect("opening the model")
        .config
        .max_position_embeddings;
    let mut g = c.benchmark_group("depth");
    g.sample_size(10)
        .warm_up_time(Duration::from_secs(2))
        .measurement_time(Duration::from_secs(10))
        .throughput(Throughput::Elements(1));
    for kv in KvFormat::ALL {
        let depths: Vec<usize> = DEPTHS.iter().copied().filter(|&d| d < max_pos).collect();
        // the deepest context this format's cache fits beside the int4 weights
        let mut fits = depths.clone();
        let mut model = None;
        while let Some(&deepest) = fits.last() {
            let opts = ModelOptions {
                backend: Backend::Int4,
                kv,
                max_context: deepest + 1,
                progress: true,
                ..Default::default()
            };
            match Model::open(&dir, &opts) {
                Ok(m) => {
                    model = Some(m);
                    break;
                }
                Err(e) => {
                    eprintln!("depth: {} KV at {deepest} does not open: {e}", kv.name());
                    fits.pop();
                }
            }
        }
        let Some(mut m) = model else { continue };
        // a few real tokens, whose K/V rows then fill the deeper positions
        let warm = [FIRST_TOKEN, 3974, 13876, 38835, 916, 279, 15678, 5562];
        for &d in &fits {
            let start = d;
            // from the warm tokens each time: a depth skipped by a filter leaves no state behind
            m.rewind(0).expect("rewinding");
            m.prefill(&warm).expect("feeding the first tokens");
            if start > warm.len() {
                m.bench_fill_context(start).expect("filling the context");
            } else {
                m.rewind(start).expect("rewinding");
            }
            g.bench_with_input(BenchmarkId::new(kv.name(), d), &start, |b, &start| {
                b.iter(|| {
                    m.rewind(start).expect("rewinding");
                    black_box(m.next_token(FIRST_TOKEN).expect("BPF forward"))
                })
            });
        }
    }
    g.finish();
}

/// The `floor` group: int8 attention's multiplies at each depth (position `d` attends `d + 1`
/// positions), as bare BPF multiplies on the library's default thread count.
fn floor(c: &mut Criterion) {
    let cfg = Checkpoint::open(model_dir())
        .expect("opening the model")
        .config;
    let threads = ModelOptions::default().threads;
    let pairs = kv8_pairs(cfg.num_attention_heads, cfg.num_key_value_heads);
    let mut g = c.benchmark_group("floor");
    g.sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(5))
        .throughput(Throughput::Elements(1));
    with_mul_peak(|peak| {
        for d in DEPTHS
            .iter()
            .copied()
            .filter(|&d| d > 0 && d < cfg.max_position_embeddings)
        {
            let muls = (cfg.num_hidden_layers * pairs * (d + 1) * cfg.head_dim() * 2) as u64;
            eprintln!("floor: attention at {d} positions: {muls} multiplies on {threads} threads");
            g.bench_with_input(
                BenchmarkId::new("attention_i8_multiplies", d),
                &muls,
                |b, &m| b.iter(|| black_box(peak.run(m, threads).expect("BPF multiply peak"))),
            );
        }
        Ok(())
    })
    .expect("loading the multiply-peak program");
    g.finish();
}

criterion_group!(benches, depth, floor);
criterion_main!(benches);
