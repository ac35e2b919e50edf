//! Says what this kernel lets qwen_bpf do, like `bpftool feature probe`: the kernel facilities
//! (BTF, the JIT, arena maps, the memory layers, BPF workqueues, bpffs) and, program by program
//! for each memory layer the kernel gives, whether the verifier takes the operator object's
//! programs (each loaded alone) and how many instructions it processed.
//!
//! ```text
//! qwen-bpf doctor [--programs] [-v]
//! ```
//!
//! Exits 0 when every facility works and every program loads, 1 otherwise. Needs root (or
//! CAP_BPF + CAP_PERFMON) for the answers to mean anything.

use std::process::ExitCode;

use clap::Parser;

use crate::{program_loads, MemoryLayer};

#[derive(Parser, Debug)]
#[command(about = "What this kernel lets qwen_bpf do: facilities and programs")]
pub struct Args {
    /// Also load every program alone, on each memory layer, and report the verifier's answer.
    #[arg(long)]
    programs: bool,
    /// With --programs: print the end of the verifier's log of every refused program.
    #[arg(long, short)]
    verbose: bool,
}

/// Runs `doctor`: exits 0 when every facility works (and, with `--programs`, every program
/// loads), 1 otherwise.
pub fn main(args: Args) -> ExitCode {
    let mut ok = true;
    // the memory layers' probe, once: for the report's selftests and for the program loads
    let layers = crate::kernel::memory::LayerProbe::run();
    let report = crate::kernel::features::probe_with(&layers);
    println!("kernel {}", report.kernel);
    for f in &report.features {
        ok &= f.works();
        println!("  {:<24} {}", f.name, f.describe());
    }
    if args.programs {
        // each layer the kernel gives (a layer it does not give is named, with the cause)
        for layer in [MemoryLayer::Arena, MemoryLayer::Array] {
            if let Err(why) = layers.choose(layer) {
                println!("programs on the {layer} layer: not loaded ({why})");
                continue;
            }
            println!("programs on the {layer} layer (each loaded alone):");
            for p in program_loads(layer) {
                match &p.result {
                    Ok(insns) => println!(
                        "  {:<10} {:<22} ok, {insns} instructions verified",
                        p.kind.name(),
                        p.name
                    ),
                    Err(why) => {
                        ok = false;
                        println!("  {:<10} {:<22} REFUSED: {why}", p.kind.name(), p.name);
                        if args.verbose {
                            for l in &p.log_tail {
                                println!("      | {l}");
                            }
                        }
                    }
                }
            }
        }
    }
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
