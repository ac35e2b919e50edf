//! Installs a model in the kernel, shows what an installed model reports, and removes it.
//!
//! ```text
//! qwen-bpf serve install --model DIR --name NAME --port P \
//!     [--iface IF] [--source ADDR]... [--slots N] [--backend q24|int4|int8] [--kv q16|int8] \
//!     [--max-context N] [--max-new N] [--timeout SECS] [--xdp-mode auto|generic|native] \
//!     [--text-bytes N] [--no-stop] [--cache-dir DIR] [--per-source-slots N] \
//!     [--rate PER_SECOND] [--burst N] [--no-rate-limit]
//! qwen-bpf serve status [NAME]
//! qwen-bpf serve remove NAME
//! ```
//!
//! `install` loads the model with `--slots` request contexts, puts the vocabulary of the model
//! directory's `tokenizer.json` in the arena, attaches the XDP program to `--iface` (default
//! `lo`) for UDP datagrams to `--port` from the `--source` addresses (default 127.0.0.1), pins
//! everything under `/sys/fs/bpf/qwen_bpf/NAME` (mounting the BPF filesystem if needed), prints
//! what it installed and exits: the model keeps answering (try the `ask` example) until
//! `remove`. The generation stops at the tokenizer's end-of-sequence tokens unless `--no-stop`.

use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use crate::{
    Backend, InstallConfig, Installed, KvFormat, Model, ModelOptions, RateLimit, Result, Tokenizer,
    XdpMode,
};
use clap::{Parser, Subcommand};

/// Install a Qwen3 model in the kernel, serving UDP requests with no process left running.
#[derive(Debug, Parser)]
#[command(name = "serve")]
pub struct Args {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Load a model and install it in the kernel under a name, then exit.
    Install(InstallArgs),
    /// Print what an installed model reports (every installed model without a name).
    Status {
        /// The installation's name.
        name: Option<String>,
    },
    /// List the names of the installed models, one a line.
    List,
    /// Detach an installed model and unpin it: the kernel frees its memory.
    Remove {
        /// The installation's name.
        name: String,
    },
}

#[derive(Debug, clap::Args)]
struct InstallArgs {
    /// Hugging Face Qwen3 directory (config.json, model.safetensors, tokenizer.json).
    #[arg(long)]
    model: PathBuf,
    /// The installation's name (its pins go to /sys/fs/bpf/qwen_bpf/NAME).
    #[arg(long)]
    name: String,
    /// The UDP port served.
    #[arg(long)]
    port: u16,
    /// The network interface the XDP program is attached to.
    #[arg(long, default_value = "lo")]
    iface: String,
    /// An IPv4 source address served (repeatable, at most 4; default 127.0.0.1).
    #[arg(long = "source", value_name = "ADDR")]
    sources: Vec<Ipv4Addr>,
    /// Request slots: requests generated at once, each with its own context (1 to 8).
    #[arg(long, default_value_t = 2)]
    slots: usize,
    /// The weight store (one that can be planned: q24, int4 or int8).
    #[arg(long, default_value = "q24", value_parser = super::common::parse_backend)]
    backend: Backend,
    /// The KV-cache format.
    #[arg(long, default_value = "q16", value_parser = super::common::parse_kv)]
    kv: KvFormat,
    /// Each request's context in tokens (prompt and generated tokens); every slot's KV cache
    /// is committed in full.
    #[arg(long, default_value_t = 1024)]
    max_context: usize,
    /// The most new tokens a request may ask for.
    #[arg(long, default_value_t = 256)]
    max_new: u32,
    /// Seconds without a poll after which a request's slot is given back.
    #[arg(long, default_value_t = 10.0)]
    timeout: f64,
    /// How the XDP program is attached: auto (the kernel's choice), generic (skb) or native
    /// (driver).
    #[arg(long, default_value = "auto", value_parser = super::common::parse_xdp_mode)]
    xdp_mode: XdpMode,
    /// The most text bytes a request generates (at most 16384).
    #[arg(long, default_value_t = crate::run::serve::TEXT_BYTES_MAX)]
    text_bytes: usize,
    /// Do not stop at the tokenizer's end-of-sequence tokens.
    #[arg(long)]
    no_stop: bool,
    /// Where the converted-weight cache goes (default: the model directory).
    #[arg(long)]
    cache_dir: Option<PathBuf>,
    /// The most slots one source address holds at once (default: 1 when several sources are
    /// served, every slot when one is).
    #[arg(long)]
    per_source_slots: Option<u32>,
    /// Requests a second each source may send, on average; requests over it are dropped.
    #[arg(long, default_value_t = RateLimit::default().per_second)]
    rate: f64,
    /// Requests a source may send at once, past its rate.
    #[arg(long, default_value_t = RateLimit::default().burst)]
    burst: u32,
    /// No request rate limit per source.
    #[arg(long, conflicts_with_all = ["rate", "burst"])]
    no_rate_limit: bool,
}

/// Runs `serve`.
pub fn main(args: Args) -> ExitCode {
    super::common::exit_with("serve", run(args))
}

fn run(args: Args) -> Result<()> {
    match args.command {
        Command::Install(a) => install(a),
        Command::Status { name: Some(name) } => {
            println!("{}", Installed::open(&name)?.status()?);
            Ok(())
        }
        Command::Status { name: None } => {
            let names = Installed::list()?;
            if names.is_empty() {
                println!("no model is installed");
            }
            for (i, name) in names.iter().enumerate() {
                if i > 0 {
                    println!();
                }
                match Installed::open(name).and_then(|m| m.status()) {
                    Ok(s) => println!("{s}"),
                    Err(e) => println!("name: {name}\nerror: {e}"),
                }
            }
            Ok(())
        }
        Command::List => {
            for name in Installed::list()? {
                println!("{name}");
            }
            Ok(())
        }
        Command::Remove { name } => {
            let memory = Installed::open(&name)
                .and_then(|m| m.status())
                .map(|s| s.kernel_memory)
                .ok();
            Installed::remove(&name)?;
            match memory {
                Some(m) => println!(
                    "removed {name}: detached and unpinned; the kernel frees its {}",
                    super::common::mib(m as usize)
                ),
                None => println!("removed {name}: detached and unpinned"),
            }
            Ok(())
        }
    }
}

fn install(a: InstallArgs) -> Result<()> {
    // the limits checked before the model loads (Model::install checks them again)
    let rate = (!a.no_rate_limit).then_some(RateLimit {
        per_second: a.rate,
        burst: a.burst,
    });
    if let Some(r) = rate {
        r.to_kernel()?;
    }
    if let Some(n) = a
        .per_source_slots
        .filter(|&n| n == 0 || n as usize > a.slots)
    {
        return Err(crate::Error::InvalidParameter {
            name: "per-source-slots",
            value: n as f64,
            expected: "1 to --slots",
        });
    }
    let tok = Tokenizer::from_model_dir(&a.model)?;
    let options = ModelOptions {
        backend: a.backend,
        kv: a.kv,
        max_context: a.max_context,
        event_slots: a.slots,
        cache_dir: a.cache_dir.clone(),
        progress: true,
        ..Default::default()
    };
    let mut model = Model::open(&a.model, &options)?;
    model.load_vocabulary(&tok)?;
    model.load_tokenizer(&tok)?;
    let memory = model.kernel_memory().total();
    let sources = if a.sources.is_empty() {
        vec![Ipv4Addr::LOCALHOST]
    } else {
        a.sources.clone()
    };
    let cfg = InstallConfig {
        max_new: a.max_new,
        stop_tokens: if a.no_stop { Vec::new() } else { tok.eos_ids() },
        timeout: Duration::try_from_secs_f64(a.timeout).map_err(|_| {
            crate::Error::InvalidParameter {
                name: "timeout",
                value: a.timeout,
                expected: "a positive number of seconds",
            }
        })?,
        xdp_mode: a.xdp_mode,
        text_bytes: a.text_bytes,
        per_source_slots: a.per_source_slots,
        rate,
        ..InstallConfig::on_interface(&a.iface, a.port, sources)
    };
    let installed = model.install(&a.name, &cfg)?;
    let s = installed.status()?;
    println!(
        "installed {} ({} store, {} KV, context {}) as {:?}: {} slots, {} of kernel memory \
         ({} reserved by the model)",
        a.model.display(),
        a.backend.name(),
        a.kv.name(),
        a.max_context,
        a.name,
        s.slots,
        super::common::mib(s.kernel_memory as usize),
        super::common::mib(memory)
    );
    println!("pins: {}", installed.path().display());
    println!("{s}");
    Ok(())
}
