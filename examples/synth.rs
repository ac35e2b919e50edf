//! Writes a synthetic Qwen3 checkpoint (see `qwen_bpf::hf::synth`).
//!
//! ```text
//! cargo run --release --example synth -- --preset tiny --out /tmp/tiny \
//!     --tokenizer ../shared/qwen3-tokenizer/tokenizer.json
//! ```

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use clap::Parser;
use qwen_bpf::hf::synth::{self, KeyStyle, Preset, SynthOptions};

/// Write a synthetic Qwen3 checkpoint with trained-like weight statistics.
#[derive(Debug, Parser)]
#[command(name = "synth")]
struct Args {
    /// Model shape: "tiny" or "qwen3-0.6b".
    #[arg(long, value_parser = parse_preset)]
    preset: Preset,
    /// Output directory (created if missing).
    #[arg(long)]
    out: PathBuf,
    /// Seed of every weight.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// A tokenizer.json to copy into the checkpoint.
    #[arg(long)]
    tokenizer: Option<PathBuf>,
    /// Untie the embeddings: also write lm_head.weight.
    #[arg(long)]
    untied: bool,
    /// Write config.json with transformers-5 keys (rope_parameters, dtype).
    #[arg(long)]
    transformers5: bool,
}

fn parse_preset(s: &str) -> Result<Preset, String> {
    Preset::from_name(s).ok_or_else(|| {
        let names: Vec<&str> = Preset::ALL.iter().map(|p| p.name()).collect();
        format!("unknown preset {s:?}; known: {}", names.join(", "))
    })
}

fn main() -> ExitCode {
    // Usage errors exit with 1 like every other error (clap's own convention is 2).
    let args = match Args::try_parse() {
        Ok(a) => a,
        Err(e) => {
            let _ = e.print();
            return if e.use_stderr() {
                ExitCode::FAILURE
            } else {
                ExitCode::SUCCESS
            };
        }
    };
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("synth: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: &Args) -> qwen_bpf::Result<()> {
    let mut cfg = args.preset.config();
    cfg.tie_word_embeddings = !args.untied;
    let opts = SynthOptions {
        seed: args.seed,
        key_style: if args.transformers5 {
            KeyStyle::Transformers5
        } else {
            KeyStyle::Transformers4
        },
        tokenizer: args.tokenizer.clone(),
        progress: true,
    };
    let t0 = Instant::now();
    synth::write_checkpoint(&args.out, &cfg, &opts)?;
    let secs = t0.elapsed().as_secs_f64();
    println!(
        "wrote {} preset to {} in {secs:.1} s (seed {}, {} parameters, {} embeddings, {:?} keys)",
        args.preset.name(),
        args.out.display(),
        args.seed,
        cfg.num_parameters(),
        if cfg.tie_word_embeddings {
            "tied"
        } else {
            "untied"
        },
        opts.key_style,
    );
    let mut files = vec!["config.json", "model.safetensors"];
    if args.tokenizer.is_some() {
        files.push("tokenizer.json");
    }
    for name in files {
        let path = args.out.join(name);
        if let Ok(md) = std::fs::metadata(&path) {
            println!("  {:<18} {:>14} bytes", name, md.len());
        }
    }
    Ok(())
}
