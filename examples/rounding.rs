//! How sensitive is a checkpoint to its weights being rounded? Writes a copy of a checkpoint whose
//! decoder matrices (q/k/v/o and gate/up/down of every layer; not the embedding or LM head) are
//! perturbed, then runs the f32 reference on both over the fixed prompt of `compare` and prints
//! the mean |Δlogit|, the KL divergence and the argmax agreement. The perturbation is one of:
//!
//! * `--bits 4|8`: the weights rounded by the low-bit stores' own quantisers
//!   (`qwen_bpf::num::swar::quantize_int4` / `quantize_int8`, dequantised). Compare with the int4 /
//!   int8 rows of `compare`: the difference is what the kernels and the activation quantisation
//!   add to the rounding itself.
//! * `--noise EPS`: Gaussian noise of EPS × each row's RMS added to every weight (seeded): how
//!   strongly this checkpoint amplifies a weight error of known size (4-bit rounding is about
//!   0.1 × RMS, 8-bit about 0.006 ×).
//!
//! `--only NAME` perturbs only the matrices whose name contains NAME (e.g. `down_proj`): which
//! kinds of matrix the error comes from.
//!
//! ```text
//! cargo run --release --example rounding -- --model DIR (--bits 4|8 | --noise EPS) [--only NAME] \
//!     [--tokens 16] --out DIR
//! ```

mod common;

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use qwen_bpf::hf::checkpoint::tensor_specs;
use qwen_bpf::num::swar::{self, PackedMatrix};
use qwen_bpf::verify::reference::{self, Reference};
use qwen_bpf::{Checkpoint, Error, Result};

#[derive(Debug, Parser)]
#[command(about = "Measure the f32 reference's sensitivity to rounded or noisy decoder weights")]
struct Args {
    /// Model directory (config.json + safetensors).
    #[arg(long)]
    model: PathBuf,
    /// Round to this many bits with the low-bit stores' quantiser: 4 or 8.
    #[arg(long, value_parser = clap::builder::PossibleValuesParser::new(["4", "8"]),
          required_unless_present = "noise", conflicts_with = "noise")]
    bits: Option<String>,
    /// Instead, add Gaussian noise of this many times each row's RMS.
    #[arg(long)]
    noise: Option<f64>,
    /// Perturb only the matrices whose name contains this (e.g. `down_proj`).
    #[arg(long)]
    only: Option<String>,
    /// Prompt length in tokens.
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u32).range(1..))]
    tokens: u32,
    /// Where to write the perturbed copy (config.json + an F32 model.safetensors).
    #[arg(long)]
    out: PathBuf,
}

/// A deterministic standard-normal source (xorshift64 and the Box–Muller transform).
struct Normal(u64);

impl Normal {
    fn next(&mut self) -> f64 {
        let mut uniform = || {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            ((self.0 >> 11) as f64 + 0.5) / (1u64 << 53) as f64
        };
        let (u, v) = (uniform(), uniform());
        (-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()
    }
}

/// The perturbed copy of the `[rows][cols]` matrix `w`.
fn perturb(a: &Args, w: Vec<f32>, rows: usize, cols: usize, rng: &mut Normal) -> Result<Vec<f32>> {
    let dequantised = match a.bits.as_deref() {
        Some("4") => swar::quantize_int4(&w, rows, cols)?.dequantize(),
        Some(_) => swar::quantize_int8(&w, rows, cols)?.dequantize(),
        None => {
            let eps = a.noise.unwrap_or(0.0);
            let mut w = w;
            for row in w.chunks_mut(cols) {
                let rms =
                    (row.iter().map(|&v| v as f64 * v as f64).sum::<f64>() / cols as f64).sqrt();
                for v in row {
                    *v += (eps * rms * rng.next()) as f32;
                }
            }
            return Ok(w);
        }
    };
    Ok(dequantised.into_iter().map(|v| v as f32).collect())
}

fn run(a: &Args) -> Result<()> {
    let ck = Checkpoint::open(&a.model)?;
    let (source, prompt) = common::prompt(&a.model, ck.config.vocab_size, a.tokens as usize)?;
    std::fs::create_dir_all(&a.out).map_err(|e| Error::io(&a.out, e))?;
    let mut rng = Normal(0x9E37_79B9_7F4A_7C15);
    let mut data: Vec<(String, Vec<usize>, Vec<u8>)> = Vec::new();
    let mut perturbed = 0;
    for (name, shape) in tensor_specs(&ck.config) {
        let mut w = ck.tensor_f32(&name)?;
        let decoder = shape.len() == 2 && name.starts_with("model.layers.");
        if decoder && a.only.as_ref().is_none_or(|o| name.contains(o.as_str())) {
            w = perturb(a, w, shape[0], shape[1], &mut rng)?;
            perturbed += 1;
        }
        data.push((
            name,
            shape,
            w.iter().flat_map(|v| v.to_le_bytes()).collect(),
        ));
    }
    if perturbed == 0 {
        return Err(Error::Invalid(format!(
            "--only {:?} matches no decoder matrix",
            a.only.as_deref().unwrap_or("")
        )));
    }
    let views: HashMap<String, safetensors::tensor::TensorView> = data
        .iter()
        .map(|(n, s, b)| {
            Ok((
                n.clone(),
                safetensors::tensor::TensorView::new(safetensors::Dtype::F32, s.clone(), b)
                    .map_err(|e| Error::Invalid(e.to_string()))?,
            ))
        })
        .collect::<Result<_>>()?;
    let st = a.out.join("model.safetensors");
    safetensors::serialize_to_file(&views, None, &st).map_err(|e| Error::Safetensors {
        path: st.clone(),
        msg: e.to_string(),
    })?;
    drop(views);
    drop(data);
    let cfg = a.out.join("config.json");
    std::fs::copy(a.model.join("config.json"), &cfg).map_err(|e| Error::io(&cfg, e))?;

    let mut exact = Reference::new(&ck, prompt.len())?;
    let mut rounded = Reference::new(&Checkpoint::open(&a.out)?, prompt.len())?;
    let (mut abs, mut kl, mut agree) = (0f64, 0f64, 0);
    for &t in &prompt {
        let (x, y) = (exact.forward(t)?.to_vec(), rounded.forward(t)?);
        let sum: f64 = x.iter().zip(y).map(|(p, q)| (p - q).abs() as f64).sum();
        abs += sum / x.len() as f64;
        kl += reference::kl_divergence(&x, y);
        agree += (reference::argmax(&x) == reference::argmax(y)) as usize;
    }
    let what = match (&a.bits, a.noise) {
        (Some(b), _) => format!("int{b}-rounded"),
        (None, e) => format!("noise {} × RMS on", e.unwrap_or(0.0)),
    };
    let n = prompt.len();
    println!(
        "f32 reference, {what} {perturbed} decoder matrices{} vs exact, {n} tokens of {source}: \
         mean |Δlogit| {:.4}, KL {:.2e}, argmax {agree}/{n}",
        a.only
            .as_ref()
            .map(|o| format!(" (*{o}*)"))
            .unwrap_or_default(),
        abs / n as f64,
        kl / n as f64,
    );
    Ok(())
}

fn main() -> ExitCode {
    match common::parse_args::<Args>() {
        Ok(args) => common::exit_with("rounding", run(&args)),
        Err(code) => code,
    }
}
