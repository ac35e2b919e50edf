//! How much of a low-bit store's error is the weight rounding itself? Writes a copy of a
//! checkpoint whose decoder matrices are replaced by their 4- or 8-bit group-wise rounded values
//! (`qwen_bpf::swar::quantize_int4` / `quantize_int8`, dequantised, stored as F32), then runs the
//! f32 reference on both over a fixed 16-token sequence and prints the mean |Δlogit| and argmax
//! agreement. Compare with the int4 / int8 rows of `compare`: the difference is what the kernels
//! and the activation quantisation add.
//!
//! ```text
//! cargo run --release --example rounding -- --model DIR --bits 4|8 --out DIR
//! ```

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use qwen_bpf::checkpoint::tensor_specs;
use qwen_bpf::reference::Reference;
use qwen_bpf::swar::{self, PackedMatrix};
use qwen_bpf::{Checkpoint, Error, Result};

#[derive(Debug, Parser)]
#[command(about = "Measure the f32 reference's sensitivity to 4/8-bit rounded decoder weights")]
struct Args {
    /// Model directory (config.json + safetensors).
    #[arg(long)]
    model: PathBuf,
    /// Weight bits: 4 or 8.
    #[arg(long, value_parser = clap::builder::PossibleValuesParser::new(["4", "8"]))]
    bits: String,
    /// Where to write the rounded copy (config.json + an F32 model.safetensors).
    #[arg(long)]
    out: PathBuf,
}

const TOKENS: [u32; 16] = [
    785, 3974, 13876, 38835, 916, 279, 15678, 5562, 13, 151644, 0, 9707, 11, 1879, 220, 108386,
];

fn run(a: &Args) -> Result<()> {
    let ck = Checkpoint::open(&a.model)?;
    std::fs::create_dir_all(&a.out).map_err(|e| Error::io(&a.out, e))?;
    let mut data: Vec<(String, Vec<usize>, Vec<u8>)> = Vec::new();
    for (name, shape) in tensor_specs(&ck.config) {
        let mut w = ck.tensor_f32(&name)?;
        if shape.len() == 2 && name != "model.embed_tokens.weight" && name != "lm_head.weight" {
            let (r, c) = (shape[0], shape[1]);
            let d = if a.bits == "4" {
                swar::quantize_int4(&w, r, c)?.dequantize()
            } else {
                swar::quantize_int8(&w, r, c)?.dequantize()
            };
            w = d.into_iter().map(|v| v as f32).collect();
        }
        data.push((
            name,
            shape,
            w.iter().flat_map(|v| v.to_le_bytes()).collect(),
        ));
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
    let cfg = a.out.join("config.json");
    std::fs::copy(a.model.join("config.json"), &cfg).map_err(|e| Error::io(&cfg, e))?;
    let mut exact = Reference::new(&ck, TOKENS.len())?;
    let mut rounded = Reference::new(&Checkpoint::open(&a.out)?, TOKENS.len())?;
    let (mut sum, mut n, mut agree) = (0f64, 0usize, 0);
    let argmax = |v: &[f32]| {
        v.iter()
            .enumerate()
            .max_by(|x, y| x.1.total_cmp(y.1))
            .map(|m| m.0)
    };
    for &t in &TOKENS {
        let (x, y) = (exact.forward(t)?, rounded.forward(t)?);
        sum += x
            .iter()
            .zip(&y)
            .map(|(p, q)| (p - q).abs() as f64)
            .sum::<f64>();
        n += x.len();
        agree += (argmax(&x) == argmax(&y)) as usize;
    }
    println!(
        "f32 reference, int{}-rounded decoder matrices vs exact: mean |Δlogit| {:.4}, argmax {agree}/{}",
        a.bits,
        sum / n as f64,
        TOKENS.len()
    );
    Ok(())
}

fn main() -> ExitCode {
    let args = Args::parse();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
