//! Accuracy and speed of each BPF weight store against the f32 reference, as a Markdown table.
//!
//! ```text
//! cargo run --release --example compare -- --model DIR [--tokens 16] [--backends q24,...] \
//!     [--continuation 32] [--max-context N] [--cache-dir DIR] [--kv q16|int8] [--kv-baseline q16]
//! ```
//!
//! `--kv` picks the stores' KV-cache format. With `--kv-baseline FORMAT`, each store is compared
//! with the same store using that KV format instead of the f32 reference (e.g. `--kv int8
//! --kv-baseline q16`: what the int8 KV cache alone changes).
//!
//! Every engine is fed the same fixed prompt of `--tokens` tokens (a fixed English text if the
//! model directory has a tokenizer.json, else a fixed list of token ids) and its logits after
//! every prompt token are compared with the reference's over the full vocabulary. Then each engine
//! greedily decodes `--continuation` tokens from the prompt on its own (the BPF engine with its
//! fused argmax, [`Model::next_token`]) and the leading tokens that agree are counted.
//!
//! The gate column checks the accuracy bar of the fixed-point design: wherever the reference's
//! top-1/top-2 logit gap exceeds twice the largest |Δlogit| at that position, the argmax must agree.

mod common;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::Parser;
use qwen_bpf::verify::reference::{self, Reference};
use qwen_bpf::{Backend, Checkpoint, Error, KernelMemory, KvFormat, Model, ModelOptions, Result};

/// Compare every weight store with the f32 reference.
#[derive(Debug, Parser)]
#[command(name = "compare")]
struct Args {
    /// Model directory (config.json + safetensors).
    #[arg(long)]
    model: PathBuf,
    /// Prompt length in tokens: logits are compared after each.
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u32).range(1..))]
    tokens: u32,
    /// Comma-separated weight stores (default: all).
    #[arg(long, value_delimiter = ',', value_parser = common::parse_backend)]
    backends: Vec<Backend>,
    /// Tokens each engine decodes greedily after the prompt.
    #[arg(long, default_value_t = 32)]
    continuation: usize,
    /// KV-cache capacity (default: prompt + continuation).
    #[arg(long)]
    max_context: Option<usize>,
    /// Where weight stores keep their converted-weight cache (default: the model directory).
    #[arg(long)]
    cache_dir: Option<PathBuf>,
    /// The stores' KV-cache format.
    #[arg(long, default_value = "q16", value_parser = common::parse_kv)]
    kv: KvFormat,
    /// Compare each store with itself using this KV format, instead of with the f32 reference.
    #[arg(long, value_parser = common::parse_kv)]
    kv_baseline: Option<KvFormat>,
}

fn main() -> ExitCode {
    match common::parse_args::<Args>() {
        Ok(args) => common::exit_with("compare", run(&args)),
        Err(code) => code,
    }
}

/// What one engine produced.
struct Run {
    /// Logits after each prompt token.
    logits: Vec<Vec<f32>>,
    /// The greedy continuation.
    continuation: Vec<u32>,
    load: Duration,
    ms_per_token: f64,
    memory: Option<KernelMemory>,
}

/// One engine, fed a token at a time.
trait Engine {
    fn logits(&mut self, token: u32) -> Result<Vec<f32>>;
    fn next_token(&mut self, token: u32) -> Result<u32>;
}

impl Engine for Reference {
    fn logits(&mut self, token: u32) -> Result<Vec<f32>> {
        Ok(self.forward(token)?.to_vec())
    }
    fn next_token(&mut self, token: u32) -> Result<u32> {
        Ok(reference::argmax(self.forward(token)?) as u32)
    }
}

impl Engine for Model {
    fn logits(&mut self, token: u32) -> Result<Vec<f32>> {
        Ok(self.forward(token)?.to_vec())
    }
    fn next_token(&mut self, token: u32) -> Result<u32> {
        Model::next_token(self, token)
    }
}

/// Feeds `prompt` (keeping every step's logits), then decodes `n` tokens greedily. ms/token is
/// measured over the decode steps after the first (or over the prompt if there are none).
fn drive(e: &mut dyn Engine, prompt: &[u32], n: usize) -> Result<(Vec<Vec<f32>>, Vec<u32>, f64)> {
    let t = Instant::now();
    let mut logits = Vec::with_capacity(prompt.len());
    for &id in prompt {
        logits.push(e.logits(id)?);
    }
    let prompt_ms = t.elapsed().as_secs_f64() * 1e3 / prompt.len() as f64;
    let mut cont = Vec::with_capacity(n);
    if n > 0 {
        cont.push(reference::argmax(logits.last().expect("prompt is non-empty")) as u32);
    }
    let t = Instant::now();
    while cont.len() < n {
        let next = e.next_token(*cont.last().expect("non-empty"))?;
        cont.push(next);
    }
    let ms = if n > 1 {
        t.elapsed().as_secs_f64() * 1e3 / (n - 1) as f64
    } else {
        prompt_ms
    };
    Ok((logits, cont, ms))
}

fn run(args: &Args) -> Result<()> {
    let ck = Checkpoint::open(&args.model)?;
    let vocab = ck.config.vocab_size;
    let n = args.tokens as usize;
    let (source, prompt) = common::prompt(&args.model, vocab, n)?;
    let max_context = args.max_context.unwrap_or(n + args.continuation);
    if max_context < n + args.continuation.saturating_sub(1) {
        return Err(Error::Invalid(format!(
            "--max-context {max_context} cannot hold {n} prompt tokens and {} continuation tokens",
            args.continuation
        )));
    }
    let backends: Vec<Backend> = if args.backends.is_empty() {
        common::BACKENDS.to_vec()
    } else {
        args.backends.clone()
    };

    eprintln!(
        "reference (f32): loading and running {n} + {} tokens",
        args.continuation
    );
    let t = Instant::now();
    let mut reference = Reference::new(&ck, max_context)?;
    let load = t.elapsed();
    let (logits, continuation, ms_per_token) = drive(&mut reference, &prompt, args.continuation)?;
    drop(reference);
    drop(ck);
    let want = Run {
        logits,
        continuation,
        load,
        ms_per_token,
        memory: None,
    };

    let run_store = |backend: Backend, kv: KvFormat| -> Result<Run> {
        eprintln!(
            "{} ({} KV): loading and running {n} + {} tokens",
            backend.name(),
            kv.name(),
            args.continuation
        );
        let t = Instant::now();
        let opts = ModelOptions {
            backend,
            max_context,
            kv,
            cache_dir: args.cache_dir.clone(),
            progress: true,
            ..Default::default()
        };
        let mut model = Model::open(&args.model, &opts)?;
        let load = t.elapsed();
        let (logits, continuation, ms_per_token) = drive(&mut model, &prompt, args.continuation)?;
        Ok(Run {
            logits,
            continuation,
            load,
            ms_per_token,
            memory: Some(model.kernel_memory()),
        })
    };
    let mut rows = Vec::new();
    for &backend in &backends {
        let got = run_store(backend, args.kv)?;
        let (name, base) = match args.kv_baseline {
            Some(b) => (
                format!(
                    "{} {} KV vs {} KV",
                    backend.name(),
                    args.kv.name(),
                    b.name()
                ),
                Some(run_store(backend, b)?),
            ),
            None => (format!("{} ({} KV)", backend.name(), args.kv.name()), None),
        };
        rows.push((name, got, base));
    }

    println!(
        "{} — {n} prompt tokens ({source}), greedy continuation of {}, max context {max_context}, vocabulary {vocab}\n",
        args.model.display(),
        args.continuation
    );
    println!(
        "| engine | mean abs Δlogit | max abs Δlogit | argmax agree | top-5 overlap | KL(ref ‖ store) | greedy agree | gate violations | kernel memory | load | ms/token |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    println!(
        "| reference (f32, 1 thread) | — | — | — | — | — | — | — | — (CPU) | {:.1} s | {:.1} |",
        want.load.as_secs_f64(),
        want.ms_per_token
    );
    let mut failed = Vec::new();
    for (name, got, base) in &rows {
        let s = stats(base.as_ref().unwrap_or(&want), got)?;
        let mem = got
            .memory
            .map_or_else(|| "—".into(), |m| common::mib(m.total()));
        println!(
            "| {name} | {:.6} | {:.6} | {:.1} % ({}/{n}) | {:.3} | {:.3e} | {}/{} | {} of {} | {mem} | {:.1} s | {:.1} |",
            s.mean_abs,
            s.max_abs,
            100.0 * s.argmax_agree as f64 / n as f64,
            s.argmax_agree,
            s.top5,
            s.kl,
            s.greedy,
            args.continuation,
            s.gate_violations,
            s.gated,
            got.load.as_secs_f64(),
            got.ms_per_token
        );
        if s.gate_violations > 0 {
            failed.push(format!(
                "{name}: {} violations at positions {:?}",
                s.gate_violations, s.violation_positions
            ));
        }
    }
    println!();
    println!(
        "Δlogit over all {n} positions × {vocab} logits; top-5 overlap = mean |top5(ref) ∩ top5(store)| / 5; \
         KL in nats, mean over positions (f64, stable softmax); greedy agree = leading tokens equal to the reference's \
         (with --kv-baseline: the same store's with the baseline KV format, which then stands for the reference in every column); \
         gate = positions where the reference's top-1/top-2 gap exceeds 2 × that position's max |Δlogit| (the argmax must agree there); \
         ms/token = greedy decode steps."
    );
    if failed.is_empty() {
        println!("\nGate: argmax agrees wherever the reference's top-1/top-2 gap exceeds twice the max error: PASS");
    } else {
        println!("\nGate: FAIL ({})", failed.join("; "));
    }
    Ok(())
}

/// Accuracy of one store against the reference.
struct Stats {
    mean_abs: f64,
    max_abs: f32,
    argmax_agree: usize,
    top5: f64,
    kl: f64,
    greedy: usize,
    gated: usize,
    gate_violations: usize,
    violation_positions: Vec<usize>,
}

fn stats(want: &Run, got: &Run) -> Result<Stats> {
    let n = want.logits.len();
    let (mut sum, mut count, mut max_abs) = (0f64, 0usize, 0f32);
    let (mut argmax_agree, mut top5, mut kl) = (0usize, 0f64, 0f64);
    let (mut gated, mut violation_positions) = (0usize, Vec::new());
    for (i, (r, s)) in want.logits.iter().zip(&got.logits).enumerate() {
        if r.len() != s.len() {
            return Err(Error::Invalid(format!(
                "position {i}: {} reference logits vs {} store logits",
                r.len(),
                s.len()
            )));
        }
        let mut pos_max = 0f32;
        for (a, b) in r.iter().zip(s) {
            let d = (a - b).abs();
            sum += d as f64;
            pos_max = pos_max.max(d);
        }
        count += r.len();
        max_abs = max_abs.max(pos_max);
        let (ra, sa) = (reference::argmax(r), reference::argmax(s));
        argmax_agree += (ra == sa) as usize;
        let (rt, st) = (top_k(r, 5), top_k(s, 5));
        top5 += rt.iter().filter(|j| st.contains(j)).count() as f64 / 5.0;
        kl += reference::kl_divergence(r, s);
        let gap = r[rt[0]] - r[rt[1]];
        if gap > 2.0 * pos_max {
            gated += 1;
            if ra != sa {
                violation_positions.push(i);
            }
        }
    }
    let greedy = want
        .continuation
        .iter()
        .zip(&got.continuation)
        .take_while(|(a, b)| a == b)
        .count();
    Ok(Stats {
        mean_abs: sum / count as f64,
        max_abs,
        argmax_agree,
        top5: top5 / n as f64,
        kl: kl / n as f64,
        greedy,
        gated,
        gate_violations: violation_positions.len(),
        violation_positions,
    })
}

/// Indices of the `k` largest values, largest first (lower index first on ties).
fn top_k(v: &[f32], k: usize) -> Vec<usize> {
    let mut idx: Vec<usize> = (0..v.len()).collect();
    let by_value = |a: &usize, b: &usize| v[*b].total_cmp(&v[*a]).then(a.cmp(b));
    let k = k.min(v.len());
    if k < v.len() {
        idx.select_nth_unstable_by(k, by_value);
        idx.truncate(k);
    }
    idx.sort_by(by_value);
    idx
}
