//! Trains the packet filter's demonstration model (issue 25): a small Qwen3 that reads an HTTP
//! request line inside the filter rule's chat template and answers `benign` or `malicious`.
//!
//! ```text
//! cargo run --release -p qwen_bpf_dev --bin train_filter -- --out DIR [--tokenizer PATH] [--steps N] [--seed S]
//! ```
//!
//! Data: request lines (`METHOD TARGET HTTP/1.x`) generated here from seeded grammars
//! (`train_filter/grammar.rs`): half benign traffic (static files, pages, REST calls, searches,
//! tracking parameters, forms), half attacks of four families (path traversal, SQL injection,
//! command injection, scanner probes), each in many spellings and encodings. 6000 training and
//! 1000 test lines; no test line is in training, and every list of grammar values holds a quarter
//! of its values out of training, so the test measures generalisation.
//!
//! Prompt and labels as the filter's spec says: tokens =
//! enc(prefix) ++ enc(payload) ++ enc(suffix) ++ enc(label text), each part encoded on its own
//! with the Qwen3 tokenizer. The loss is the cross-entropy over the full 151,936-token vocabulary
//! at the label tokens only; a label's score is the sum of its tokens' log-probabilities.
//!
//! Model: the exact Qwen3 architecture (dev/src/train.rs) with Qwen3's vocabulary, tied
//! embeddings, 2 layers, hidden 128, 4 heads × 32, 2 KV heads, intermediate 384: 19.8 M
//! parameters, 19.4 M of them the embedding. Tokens the training data never contains cannot be
//! learned, so they share one embedding row (an "unknown token", trained like the others through
//! the loss's normalisation; the file has every row): the softmax over the whole vocabulary is
//! then exact at the cost of U+1 logits, U being the ~2800 tokens the data contains.
//!
//! Time: the default 400 steps of 32 lines take 2-3.5 minutes on 2 shared vCPUs (about 0.3 s of
//! CPU time per step), evaluation and the reference check another 20 s; held-out accuracy
//! 98-99 % (seeds 0-2), against 90 % for the regex baseline.
//!
//! DIR receives model/ (config.json, model.safetensors in BF16 with HF names, tokenizer.json: a
//! copy of the given one), rule (the filter rule JSON), data/train.tsv and data/test.tsv
//! (`label<TAB>payload`), and report.json: held-out accuracy, precision and recall (malicious is
//! positive) and per-family recall of the f32 model, of the BF16-rounded model and of a regex
//! baseline, plus the check that `qwen_bpf::Reference` on the written model gives candle's scores.

#[path = "train_filter/baseline.rs"]
mod baseline;
#[path = "train_filter/grammar.rs"]
mod grammar;
#[path = "train_filter/lists.rs"]
#[rustfmt::skip] // tables, in paragraphs
mod lists;

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use candle_core::{Device, Result as CResult, Tensor};
use clap::Parser;
use grammar::{Example, Family};
use qwen_bpf::hf::checkpoint::tensor_specs;
use qwen_bpf::hf::synth::Preset;
use qwen_bpf::{Checkpoint, Config, Reference, Tokenizer};
use qwen_bpf_dev::train::{self, io, linear, seeded, write_atomic, Res, Trainer, Weights};
use serde_json::{json, Value};

/// The rule's template: the payload goes in the user turn of Qwen3's chat template.
const TEMPLATE: &str = "<|im_start|>system\nIs this HTTP request benign or malicious?<|im_end|>\n\
                        <|im_start|>user\n{payload}<|im_end|>\n<|im_start|>assistant\n";
/// The labels: (name, text, action). Index 1 is the positive (malicious) class.
const LABELS: [(&str, &str, &str); 2] = [
    ("benign", "benign", "pass"),
    ("malicious", "malicious", "drop"),
];
const TRAIN_LINES: usize = 6000;
const TEST_LINES: usize = 1000;
const BATCH: usize = 32; //      lines per step
const LR: f64 = 3e-3; //         peak learning rate
const WARMUP: usize = 50; //     linear warmup steps, then cosine decay to LR / 10
const LOG_EVERY: usize = 25; //  steps between progress lines
const GROUP: usize = 8; //       sequences run at once (of similar lengths, little padding)
const CHECK_LINES: usize = 4; // test lines the reference re-scores

/// Train the packet filter's demonstration model and write it, its rule and its data.
#[derive(Debug, Parser)]
struct Args {
    /// Output directory (created if missing).
    #[arg(long)]
    out: PathBuf,
    /// The Qwen3 tokenizer.json (default: $QWEN_BPF_TOKENIZER, else
    /// ../shared/qwen3-tokenizer/tokenizer.json beside the workspace).
    #[arg(long)]
    tokenizer: Option<PathBuf>,
    /// Optimiser steps (default: 2-3.5 minutes on 2 vCPUs).
    #[arg(long, default_value_t = 400)]
    steps: usize,
    /// Seed of the data, the initial weights and the batches.
    #[arg(long, default_value_t = 0)]
    seed: u64,
}

/// The model config (HF Qwen3 `config.json` style): the tiny synthetic preset's (Qwen3's
/// vocabulary and special tokens, tied embeddings, RoPE theta 1e6, eps 1e-6), reshaped.
fn config() -> Config {
    Config {
        hidden_size: 128,
        intermediate_size: 384,
        num_hidden_layers: 2,
        num_attention_heads: 4,
        num_key_value_heads: 2,
        head_dim: Some(32),
        ..Preset::Tiny.config()
    }
}

/// The tokenizer to use: `--tokenizer`, else $QWEN_BPF_TOKENIZER, else the shared copy.
fn tokenizer_path(arg: &Option<PathBuf>) -> Res<PathBuf> {
    let env = std::env::var_os(qwen_bpf::TOKENIZER_ENV).filter(|v| !v.is_empty());
    let beside =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/qwen3-tokenizer/tokenizer.json");
    let path = arg.clone().or(env.map(PathBuf::from)).unwrap_or(beside);
    if !path.is_file() {
        let msg = format!(
            "no Qwen3 tokenizer at {}: give --tokenizer PATH or set ${}",
            path.display(),
            qwen_bpf::TOKENIZER_ENV
        );
        return Err(msg.into());
    }
    Ok(path)
}

/// The template's parts and the labels' tokens.
struct Prompt {
    tok: Tokenizer,
    vocab: usize,
    prefix: Vec<u32>,
    suffix: Vec<u32>,
    labels: Vec<Vec<u32>>,
}

impl Prompt {
    fn new(tok: Tokenizer, vocab: usize) -> Res<Prompt> {
        let (prefix, suffix) = TEMPLATE.split_once("{payload}").ok_or("no {payload}")?;
        let mut p = Prompt {
            tok,
            vocab,
            prefix: Vec::new(),
            suffix: Vec::new(),
            labels: Vec::new(),
        };
        (p.prefix, p.suffix) = (p.encode(prefix)?, p.encode(suffix)?);
        for (name, text, _) in LABELS {
            let ids = p.encode(text)?;
            if !(1..=4).contains(&ids.len()) {
                let n = ids.len();
                return Err(format!("label {name}: {text:?} is {n} tokens, not 1-4").into());
            }
            p.labels.push(ids);
        }
        Ok(p)
    }

    /// `text`'s tokens, each checked to be in the model's vocabulary.
    fn encode(&self, text: &str) -> Res<Vec<u32>> {
        let ids = self.tok.encode(text)?;
        if let Some(id) = ids.iter().find(|&&id| id as usize >= self.vocab) {
            let v = self.vocab;
            return Err(format!("token {id} of {text:?} is outside the vocabulary of {v}").into());
        }
        Ok(ids)
    }

    /// enc(prefix) ++ enc(payload) ++ enc(suffix).
    fn ids(&self, payload: &str) -> Res<Vec<u32>> {
        let mut ids = self.prefix.clone();
        ids.extend(self.encode(payload)?);
        ids.extend(&self.suffix);
        Ok(ids)
    }
}

/// The vocabulary as training sees it: the tokens of the training prompts and labels get their
/// own embedding rows ("compact" ids 0..U, in id order); every other token shares row U. The
/// model written has all V rows, those tokens' rows being copies of row U.
struct Vocab {
    /// The tokens with their own row, sorted.
    used: Vec<u32>,
    /// Compact id of every token id.
    compact: Vec<u32>,
}

impl Vocab {
    /// The split for training sequences `seqs` (whose ids are below `size`).
    fn new(size: usize, seqs: &[&[u32]]) -> Vocab {
        let mut seen = vec![false; size];
        seqs.iter()
            .flat_map(|s| s.iter())
            .for_each(|&t| seen[t as usize] = true);
        let used: Vec<u32> = (0..size as u32).filter(|&t| seen[t as usize]).collect();
        let mut compact = vec![used.len() as u32; size];
        for (c, &t) in used.iter().enumerate() {
            compact[t as usize] = c as u32;
        }
        Vocab { used, compact }
    }

    fn map(&self, ids: &[u32]) -> Vec<u32> {
        ids.iter().map(|&t| self.compact[t as usize]).collect()
    }
}

/// A prompt followed by a label's tokens, whose log-probabilities are wanted.
struct Seq<'a> {
    prompt: &'a [u32],
    label: &'a [u32],
}

/// Sequences (of similar lengths) right-padded to the longest: ids [B, T], and where the label
/// tokens are predicted: flat positions into [B*T] (the logits after prompt ++ label[..j] predict
/// label[j]) and the target ids.
fn pack(seqs: &[Seq], dev: &Device) -> CResult<(Tensor, Tensor, Tensor)> {
    let t = seqs
        .iter()
        .map(|s| s.prompt.len() + s.label.len())
        .max()
        .unwrap_or(1);
    let (mut ids, mut pos, mut tgt) = (Vec::new(), Vec::new(), Vec::new());
    for (i, s) in seqs.iter().enumerate() {
        let row = s.prompt.iter().chain(s.label).copied();
        ids.extend(row.chain(std::iter::repeat(0)).take(t));
        for (j, &l) in s.label.iter().enumerate() {
            pos.push((i * t + s.prompt.len() - 1 + j) as u32);
            tgt.push(l);
        }
    }
    let n = pos.len();
    Ok((
        Tensor::from_vec(ids, (seqs.len(), t), dev)?,
        Tensor::from_vec(pos, n, dev)?,
        Tensor::from_vec(tgt, n, dev)?,
    ))
}

/// The hidden states at the label positions of `seqs`, [N, H], and their targets, with the input
/// embedding `table`. Runs GROUP sequences at a time: sorted by length, they need little padding.
fn label_states(
    cfg: &Config,
    ws: &Weights,
    table: &Tensor,
    seqs: &[Seq],
) -> CResult<(Tensor, Tensor)> {
    let (mut hs, mut tgts) = (Vec::new(), Vec::new());
    for group in seqs.chunks(GROUP) {
        let (ids, pos, tgt) = pack(group, table.device())?;
        let (b, t) = ids.dims2()?;
        let x = table.index_select(&ids.flatten_all()?, 0)?; //                          [B*T, H]
        hs.push(train::body(cfg, ws, &x, b, t)?.index_select(&pos, 0)?); //             [N, H]
        tgts.push(tgt);
    }
    Ok((Tensor::cat(&hs, 0)?, Tensor::cat(&tgts, 0)?))
}

/// The logits over the whole vocabulary at the label positions of `seqs` (compact ids), and the
/// targets. The compact embedding [U+1, H] gives U+1 distinct logits; the last, the shared row's,
/// stands for `shared` tokens, so `ln(shared)` is added to it (`shared` equal logits z weigh
/// `shared · e^z = e^(z + ln shared)` in the softmax): every softmax is exactly the full one.
fn logits(cfg: &Config, ws: &Weights, shared: usize, seqs: &[Seq]) -> CResult<(Tensor, Tensor)> {
    let embed = train::w(ws, "model.embed_tokens.weight")?; //                         [U+1, H]
    let (h, tgt) = label_states(cfg, ws, embed, seqs)?;
    let u = embed.dim(0)? - 1;
    let mut bias = vec![0f32; u + 1];
    bias[u] = (shared as f32).ln();
    let bias = Tensor::from_vec(bias, u + 1, embed.device())?;
    Ok((linear(&h, embed)?.broadcast_add(&bias)?, tgt)) //                              [N, U+1]
}

/// Every label's score for each prompt (compact ids): the sum of the label tokens'
/// log-probabilities (nats) over the whole vocabulary.
fn scores(
    cfg: &Config,
    ws: &Weights,
    shared: usize,
    prompts: &[Vec<u32>],
    labels: &[Vec<u32>],
) -> CResult<Vec<Vec<f64>>> {
    // Prompts in length order, GROUP / labels at a time; results back in the given order.
    let mut order: Vec<usize> = (0..prompts.len()).collect();
    order.sort_by_key(|&i| prompts[i].len());
    let mut out = vec![Vec::new(); prompts.len()];
    for chunk in order.chunks(GROUP / labels.len()) {
        let seqs: Vec<Seq> = chunk
            .iter()
            .flat_map(|&i| {
                labels.iter().map(move |l| Seq {
                    prompt: &prompts[i],
                    label: l,
                })
            })
            .collect();
        let (z, tgt) = logits(cfg, ws, shared, &seqs)?;
        let lp = candle_nn::ops::log_softmax(&z, 1)?.gather(&tgt.unsqueeze(1)?, 1)?;
        let mut lp = lp
            .flatten_all()?
            .to_vec1::<f32>()?
            .into_iter()
            .map(f64::from);
        for &i in chunk {
            out[i] = labels
                .iter()
                .map(|l| lp.by_ref().take(l.len()).sum())
                .collect();
        }
    }
    Ok(out)
}

/// The first index of the largest score (the rule's choice with margin 0 and no threshold).
fn best(scores: &[f64]) -> usize {
    (0..scores.len()).fold(0, |b, i| if scores[i] > scores[b] { i } else { b })
}

/// Accuracy, precision and recall (malicious is positive) and the fraction of each family
/// classified correctly (for attacks, their recall).
fn metrics(test: &[Example], blocked: &[bool]) -> Value {
    let (mut tp, mut fp, mut tn, mut fneg) = (0, 0, 0, 0);
    for (e, &b) in test.iter().zip(blocked) {
        match (e.family.malicious(), b) {
            (true, true) => tp += 1,
            (false, true) => fp += 1,
            (false, false) => tn += 1,
            (true, false) => fneg += 1,
        }
    }
    let ratio = |a: usize, b: usize| if b == 0 { 0.0 } else { a as f64 / b as f64 };
    let mut families = serde_json::Map::new();
    for f in Family::ALL {
        let of = test.iter().zip(blocked).filter(|(e, _)| e.family == f);
        let (n, right) = of.fold((0, 0), |(n, r), (e, &b)| {
            (n + 1, r + (b == e.family.malicious()) as usize)
        });
        families.insert(
            f.name().into(),
            json!({ "lines": n, "correct": ratio(right, n) }),
        );
    }
    json!({
        "accuracy": ratio(tp + tn, test.len()),
        "precision": ratio(tp, tp + fp),
        "recall": ratio(tp, tp + fneg),
        "false_positive_rate": ratio(fp, fp + tn),
        "families": families,
    })
}

/// Prints a metrics row.
fn print_row(name: &str, m: &Value) {
    let f = |v: &Value| v.as_f64().unwrap_or(f64::NAN);
    let fam = |n: &str| f(&m["families"][n]["correct"]);
    eprintln!(
        "{name:<14} {:>8.4} {:>9.4} {:>7.4} {:>7.4} {:>9.4} {:>9.4} {:>9.4} {:>9.4}",
        f(&m["accuracy"]),
        f(&m["precision"]),
        f(&m["recall"]),
        fam("benign"),
        fam("path_traversal"),
        fam("sql_injection"),
        fam("command_injection"),
        fam("scanner_probe"),
    );
}

/// `label<TAB>payload` lines.
fn tsv(examples: &[Example]) -> String {
    let label = |e: &Example| LABELS[e.family.malicious() as usize].0;
    examples
        .iter()
        .map(|e| format!("{}\t{}\n", label(e), e.line))
        .collect()
}

/// The filter rule of the spec for this model (interface lo, TCP port 80).
fn rule() -> Value {
    let labels: Vec<Value> = LABELS
        .iter()
        .map(|(name, text, action)| json!({ "name": name, "text": text, "action": action }))
        .collect();
    json!({
        "interface": "lo",
        "protocol": "tcp",
        "ports": [80],
        "bytes": grammar::LINE_MAX,
        "first_line": true,
        "template": TEMPLATE,
        "labels": labels,
        "margin": 0.0,
        "threshold": null,
        "fallback": "benign",
        "pending": "drop",
        "overflow": "drop",
        "ttl_seconds": 300,
        "slots": 2,
    })
}

/// Label scores of the test `prompts` by `qwen_bpf::Reference` on the written model.
fn reference_scores(model: &Path, prompts: &[Vec<u32>], labels: &[Vec<u32>]) -> Res<Vec<Vec<f64>>> {
    let longest = prompts.iter().map(Vec::len).max().unwrap_or(0);
    let ck = Checkpoint::open(model)?;
    let mut r = Reference::new(&ck, longest + 4)?;
    r.set_threads(2);
    let lp = |logits: &[f32], t: u32| qwen_bpf::verify::reference::log_softmax(logits)[t as usize];
    let mut out = Vec::new();
    for p in prompts {
        r.reset();
        let mut after_prompt = Vec::new();
        for &t in p {
            after_prompt = r.forward(t)?.to_vec();
        }
        let mut line = Vec::new();
        for l in labels {
            r.rewind(p.len())?;
            let mut score = lp(&after_prompt, l[0]);
            for j in 1..l.len() {
                score += lp(r.forward(l[j - 1])?, l[j]);
            }
            line.push(score);
        }
        out.push(line);
    }
    Ok(out)
}

fn run(args: &Args) -> Res<()> {
    let (dev, cfg) = (Device::Cpu, config());
    let data_dir = args.out.join("data");
    io(std::fs::create_dir_all(&data_dir), &data_dir)?; // fail before training, not after
    let tok_path = tokenizer_path(&args.tokenizer)?;
    let tok_json = io(std::fs::read(&tok_path), &tok_path)?;
    let prompt = Prompt::new(Tokenizer::from_file(&tok_path)?, cfg.vocab_size)?;
    eprintln!("template: {TEMPLATE:?}");
    eprintln!(
        "prefix {} tokens, suffix {} tokens {:?}",
        prompt.prefix.len(),
        prompt.suffix.len(),
        prompt.suffix
    );
    for ((name, text, _), ids) in LABELS.iter().zip(&prompt.labels) {
        eprintln!("label {name}: text {text:?} = tokens {ids:?}");
    }

    // Data.
    let start = Instant::now();
    let (train_set, test_set) = grammar::datasets(args.seed, TRAIN_LINES, TEST_LINES)?;
    write_atomic(&data_dir.join("train.tsv"), tsv(&train_set).as_bytes())?;
    write_atomic(&data_dir.join("test.tsv"), tsv(&test_set).as_bytes())?;
    let encode = |set: &[Example]| -> Res<Vec<Vec<u32>>> {
        set.iter().map(|e| prompt.ids(&e.line)).collect()
    };
    let (train_ids, test_ids) = (encode(&train_set)?, encode(&test_set)?);
    let class = |e: &Example| e.family.malicious() as usize;
    let longest = train_ids
        .iter()
        .chain(&test_ids)
        .map(Vec::len)
        .max()
        .unwrap_or(0);
    let mut all: Vec<&[u32]> = train_ids.iter().map(Vec::as_slice).collect();
    all.extend(prompt.labels.iter().map(Vec::as_slice));
    let vocab = Vocab::new(cfg.vocab_size, &all);
    let malicious = train_set.iter().filter(|e| e.family.malicious()).count();
    eprintln!(
        "data: {} train lines ({malicious} malicious), {} test lines, prompts up to {longest} tokens, \
         {} distinct training tokens ({:.1} s)",
        train_set.len(),
        test_set.len(),
        vocab.used.len(),
        start.elapsed().as_secs_f64()
    );

    // Parameters: HF init, the embedding in compact ids (its last row the shared one).
    let (v, u) = (cfg.vocab_size, vocab.used.len());
    let mut rng = seeded(args.seed);
    let mut init = Vec::new();
    for (name, mut shape) in tensor_specs(&cfg) {
        if name == "model.embed_tokens.weight" {
            shape[0] = u + 1;
        }
        init.push((name, train::initial(&shape, &mut rng, &dev)?));
    }
    let mut trainer = Trainer::new(init, LR)?;
    let total: usize = tensor_specs(&cfg)
        .iter()
        .map(|(_, s)| s.iter().product::<usize>())
        .sum();
    eprintln!(
        "model: {total} parameters ({} distinct), {} steps of {BATCH} lines",
        trainer.parameters(),
        args.steps
    );
    // The HF weights: the [V, H] embedding is the compact one's rows in token order.
    let order = Tensor::from_vec(vocab.compact.clone(), v, &dev)?;
    let full = |ws: &Weights| -> CResult<Weights> {
        let mut ws = ws.clone();
        let e = train::w(&ws, "model.embed_tokens.weight")?.index_select(&order, 0)?;
        ws.insert("model.embed_tokens.weight".into(), e);
        Ok(ws)
    };

    // Training.
    let compact_labels: Vec<Vec<u32>> = prompt.labels.iter().map(|l| vocab.map(l)).collect();
    let compact_train: Vec<Vec<u32>> = train_ids.iter().map(|p| vocab.map(p)).collect();
    let (mut losses, mut window) = (Vec::new(), Vec::new());
    let (start, cpu0) = (Instant::now(), train::cpu_seconds());
    for step in 1..=args.steps {
        let lr = train::learning_rate(step, args.steps, LR, WARMUP);
        let mut batch: Vec<Seq> = (0..BATCH)
            .map(|_| {
                let i = (rng.next() % train_set.len() as u64) as usize;
                let label = &compact_labels[class(&train_set[i])];
                Seq {
                    prompt: &compact_train[i],
                    label,
                }
            })
            .collect();
        batch.sort_by_key(|s| s.prompt.len());
        let (z, tgt) = logits(&cfg, &trainer.weights(), v - u, &batch)?;
        let loss_t = candle_nn::loss::cross_entropy(&z, &tgt)?; // mean over the label tokens
        let gnorm = trainer.step(&loss_t, lr)?;
        window.push(loss_t.to_scalar::<f32>()?);
        if step % LOG_EVERY == 0 || step == args.steps {
            let l = window.iter().sum::<f32>() / window.len() as f32;
            let secs = start.elapsed().as_secs_f64();
            eprintln!("step {step:4}  lr {lr:.2e}  loss {l:.4}  |grad| {gnorm:.2}  ({secs:.0} s, {:.3} s/step)", secs / step as f64);
            losses.push(json!({ "step": step, "loss": l }));
            window.clear();
        }
    }
    let (train_secs, cpu_secs) = (start.elapsed().as_secs_f64(), train::cpu_seconds() - cpu0);
    eprintln!("trained in {train_secs:.0} s ({cpu_secs:.0} s of CPU time)");

    // The model: full HF weights, written in BF16; config.json last.
    let model_dir = args.out.join("model");
    train::save(&model_dir, &cfg, &full(&trainer.weights())?, &tok_json)?;
    eprintln!("wrote {}", model_dir.display());

    // Evaluation on the test lines.
    let start = Instant::now();
    let test_compact: Vec<Vec<u32>> = test_ids.iter().map(|p| vocab.map(p)).collect();
    let (f32_weights, shared) = (trainer.weights(), v - u);
    let bf16_weights = train::bf16_rounded(&f32_weights)?;
    let s32 = scores(&cfg, &f32_weights, shared, &test_compact, &compact_labels)?;
    let s16 = scores(&cfg, &bf16_weights, shared, &test_compact, &compact_labels)?;
    let base = baseline::Baseline::new()?;
    let model_f32 = metrics(
        &test_set,
        &s32.iter().map(|s| best(s) == 1).collect::<Vec<_>>(),
    );
    let model_bf16 = metrics(
        &test_set,
        &s16.iter().map(|s| best(s) == 1).collect::<Vec<_>>(),
    );
    let regex = metrics(
        &test_set,
        &test_set
            .iter()
            .map(|e| base.blocks(&e.line))
            .collect::<Vec<_>>(),
    );
    eprintln!(
        "held-out test, {} lines ({:.0} s):",
        test_set.len(),
        start.elapsed().as_secs_f64()
    );
    eprintln!(
        "{:<14} {:>8} {:>9} {:>7} {:>7} {:>9} {:>9} {:>9} {:>9}",
        "", "accuracy", "precision", "recall", "benign", "traversal", "sqli", "cmdi", "scanner"
    );
    print_row("model f32", &model_f32);
    print_row("model bf16", &model_bf16);
    print_row("regex WAF", &regex);

    // The written checkpoint is the trained one: the reference's label scores on it agree with
    // candle's on the same BF16-rounded weights (to float rounding), and nearly with f32 ones.
    let check = &test_ids[..CHECK_LINES.min(test_ids.len())];
    let r = reference_scores(&model_dir, check, &prompt.labels)?;
    let diff = |c: &[Vec<f64>]| {
        r.iter()
            .flatten()
            .zip(c.iter().flatten())
            .map(|(a, b)| (a - b).abs())
            .fold(0.0, f64::max)
    };
    let (d16, d32) = (diff(&s16[..check.len()]), diff(&s32[..check.len()]));
    eprintln!(
        "reference check, {} lines: label scores {:?}; max |reference - candle| {d16:.2e} (BF16 weights), {d32:.2e} (f32 weights)",
        check.len(),
        r.first()
    );
    // The model's mistakes, for reading.
    let mistakes: Vec<Value> = test_set
        .iter()
        .zip(&s32)
        .filter(|(e, s)| (best(s) == 1) != e.family.malicious())
        .map(|(e, s)| json!({ "family": e.family.name(), "line": e.line, "scores": s }))
        .collect();
    for m in mistakes.iter().take(12) {
        eprintln!("mistake: {m}");
    }
    let report = json!({
        "command": std::env::args().collect::<Vec<_>>().join(" "),
        "seed": args.seed,
        "steps": args.steps,
        "batch": BATCH,
        "train_seconds": train_secs,
        "train_cpu_seconds": cpu_secs,
        "parameters": total,
        "trained_parameters": trainer.parameters(),
        "config": serde_json::to_value(&cfg)?,
        "template": TEMPLATE,
        "labels": LABELS.iter().zip(&prompt.labels).map(|((n, t, _), ids)| json!({ "name": n, "text": t, "ids": ids })).collect::<Vec<_>>(),
        "data": { "train_lines": train_set.len(), "test_lines": test_set.len(), "train_malicious": malicious },
        "losses": losses,
        "model_f32": model_f32,
        "model_bf16": model_bf16,
        "baseline_regex": regex,
        "mistakes_f32": mistakes,
        "reference_check": { "lines": check.len(), "max_diff_bf16": d16, "max_diff_f32": d32 },
    });
    write_atomic(
        &args.out.join("report.json"),
        serde_json::to_string_pretty(&report)?.as_bytes(),
    )?;
    write_atomic(
        &args.out.join("rule"),
        serde_json::to_string_pretty(&rule())?.as_bytes(),
    )?;
    if d16 > 1e-2 || d32 > 0.25 {
        return Err("reference check failed: qwen_bpf's reference and candle disagree".into());
    }
    Ok(())
}

fn main() -> ExitCode {
    train::main_with::<Args>(run)
}
