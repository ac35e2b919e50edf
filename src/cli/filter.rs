//! The packet filter: classifies packet payloads with a model and a rule file (issue 25).
//!
//! ```text
//! qwen-bpf filter classify --model DIR --rule FILE \
//!     [--tokenizer FILE] [--backend q24] [--in-kernel] < payloads
//! qwen-bpf filter install --model DIR --rule FILE --name NAME \
//!     [--interface IF] [--xdp-mode auto|native|generic] [--max-memory MIB]
//! qwen-bpf filter status [NAME] [--follow SECONDS]
//! qwen-bpf filter remove NAME
//! ```
//!
//! `install` leaves the filter in the kernel (pinned under `/sys/fs/bpf/qwen_bpf/NAME`): it
//! classifies each new flow of the rule's traffic and enforces the verdicts with no process of
//! ours running; `status` prints its counters (with `--follow`, the verdicts as they come, for
//! that many seconds), `remove` takes it out. `classify --in-kernel` runs the classification
//! steps of the installed filter's worker in the kernel (same output as without).
//!
//! `classify` reads one payload per line on stdin: the line's bytes without its `\n` (any other
//! byte, a `\r` before the `\n` included, is part of the payload, as in a packet; a rule with
//! `first_line` cuts the text there), and prints `label score` for each as soon as it is
//! classified (the chosen label's name and its log-probability in nats, 4 decimals). The
//! tokenizer is the model directory's `tokenizer.json` unless `--tokenizer` is given; the model
//! is opened with the context the rule needs (`CompiledRule::context_needed`). A summary goes to
//! stderr.

use std::io::{BufRead, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use crate::filter::{Filter, FilterInstall, FilterRule, InstalledFilter};
use crate::{Backend, Error, Model, ModelOptions, Result, Tokenizer, XdpMode};
use clap::{Parser, Subcommand};

/// Classify packet payloads with a model and a rule.
#[derive(Debug, Parser)]
#[command(name = "filter")]
pub struct Args {
    #[command(subcommand)]
    command: Command,
}

/// What to do.
#[derive(Debug, Subcommand)]
enum Command {
    /// Classify payloads read from stdin, one per line: prints `label score`.
    Classify(ClassifyArgs),
    /// Install a filter in the kernel: it runs on its own until `remove`.
    Install(InstallArgs),
    /// An installed filter's counters (every installed filter's without NAME).
    Status(StatusArgs),
    /// Remove an installed filter.
    Remove {
        /// The installation's name.
        name: String,
    },
}

/// `install`'s arguments.
#[derive(Debug, clap::Args)]
struct InstallArgs {
    #[command(flatten)]
    filter: FilterArgs,
    /// The installation's name (1 to 64 of A-Z a-z 0-9 - _ .).
    #[arg(long)]
    name: String,
    /// The interface to attach to, instead of the rule's.
    #[arg(long)]
    interface: Option<String>,
    /// How XDP is attached: auto (the driver's mode where it has one), native or generic.
    #[arg(long, default_value = "auto", value_parser = super::common::parse_xdp_mode)]
    xdp_mode: XdpMode,
    /// Refuse a model needing more kernel memory than this (MiB).
    #[arg(long)]
    max_memory: Option<u64>,
}

/// `status`'s arguments.
#[derive(Debug, clap::Args)]
struct StatusArgs {
    /// The installation's name.
    name: Option<String>,
    /// Then print the verdicts as they come, for this many seconds.
    #[arg(long)]
    follow: Option<u64>,
}

/// The model and rule of a filter.
#[derive(Debug, clap::Args)]
struct FilterArgs {
    /// Hugging Face Qwen3 directory (config.json, model.safetensors, tokenizer.json).
    #[arg(long)]
    model: PathBuf,
    /// The rule file (JSON).
    #[arg(long)]
    rule: PathBuf,
    /// A tokenizer.json to use (default: the model directory's).
    #[arg(long)]
    tokenizer: Option<PathBuf>,
    /// Weight store.
    #[arg(long, default_value = "q24", value_parser = super::common::parse_backend)]
    backend: Backend,
}

/// `classify`'s arguments.
#[derive(Debug, clap::Args)]
struct ClassifyArgs {
    #[command(flatten)]
    filter: FilterArgs,
    /// Classify in the kernel (the installed filter's steps, run by `filter_classify`).
    #[arg(long)]
    in_kernel: bool,
}

/// Runs `filter`.
pub fn main(args: Args) -> ExitCode {
    super::common::exit_with("filter", run(args))
}

fn run(cli: Args) -> Result<()> {
    match cli.command {
        Command::Classify(a) => classify(&a),
        Command::Install(a) => install(&a),
        Command::Status(a) => status(&a),
        Command::Remove { name } => {
            InstalledFilter::remove(&name)?;
            println!("removed {name}");
            Ok(())
        }
    }
}

fn install(a: &InstallArgs) -> Result<()> {
    let filter = open_filter(&a.filter, true)?;
    let opts = FilterInstall {
        interface: a.interface.clone(),
        xdp_mode: a.xdp_mode,
        max_memory: a.max_memory.map(|m| m << 20),
    };
    let f = filter.install(&a.name, &opts)?;
    println!("installed {} (pins in {})", f.name(), f.path().display());
    print_status(&f)
}

fn print_status(f: &InstalledFilter) -> Result<()> {
    let s = f.status()?;
    println!(
        "{}: {:?} ports {:?} on {} (ifindex {}), sources {}",
        s.name,
        s.protocol,
        s.ports,
        s.interface.as_deref().unwrap_or("(gone)"),
        s.ifindex,
        if s.sources.is_empty() {
            "any".to_string()
        } else {
            s.sources
                .iter()
                .map(|(a, l)| format!("{a}/{l}"))
                .collect::<Vec<_>>()
                .join(" ")
        }
    );
    println!(
        "  flows: {} judged, {} started, {} failed, {} in the table; slots {}/{} busy",
        s.judged, s.started, s.errors, s.flows, s.slots_busy, s.slots
    );
    for l in &s.labels {
        println!(
            "  label {:<16} {:<5} flows {:>8}  packets {:>10}",
            l.name,
            format!("{:?}", l.action).to_lowercase(),
            l.flows,
            l.packets
        );
    }
    println!(
        "  packets: {} matched, {} pending ({:?}), {} overflow ({:?}), {} dropped, {} fragments, \
         {} without payload; log lost {}",
        s.packets,
        s.pending,
        s.pending_policy,
        s.overflow,
        s.overflow_policy,
        s.dropped,
        s.fragments,
        s.bare,
        s.log_lost
    );
    if s.protocol == crate::filter::Protocol::Tcp {
        let t = &s.tcp;
        println!(
            "  tcp: {} untracked, {} out of order, {} bad checksum, {} changed retransmissions; \
             flows refused for their source {} (at most {} slots each), slots taken back {}",
            t.untracked,
            t.out_of_order,
            t.bad_checksum,
            t.mismatch,
            t.source_busy,
            s.per_source,
            t.reclaimed
        );
    }
    println!(
        "  verdicts live {} s; kernel memory {} MiB (arena map id {})",
        s.ttl.as_secs(),
        s.kernel_memory >> 20,
        s.arena_map_id
    );
    Ok(())
}

fn status(a: &StatusArgs) -> Result<()> {
    let names = match &a.name {
        Some(n) => vec![n.clone()],
        None => crate::Installed::list()?,
    };
    for n in &names {
        match InstalledFilter::open(n) {
            Ok(f) => {
                print_status(&f)?;
                if let Some(secs) = a.follow {
                    let names: Vec<String> =
                        f.status()?.labels.into_iter().map(|l| l.name).collect();
                    f.follow_log(std::time::Duration::from_secs(secs), |r| {
                        println!(
                            "{}:{} -> {}:{} {} {:.4} ({:.1} ms) {:?}",
                            r.source.0,
                            r.source.1,
                            r.destination.0,
                            r.destination.1,
                            names.get(r.label).map_or("?", |s| s.as_str()),
                            r.score_q16 as f64 / 65536.0,
                            r.elapsed.as_secs_f64() * 1e3,
                            String::from_utf8_lossy(&r.excerpt)
                        );
                        true
                    })?;
                }
            }
            // not a filter (a served model): skipped when listing all
            Err(e) if a.name.is_none() => log::debug!("{n}: {e}"),
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// The filter of `a`: the rule compiled with the tokenizer, the model opened with the context
/// the rule needs and the prefix fed.
fn open_filter(a: &FilterArgs, kernel: bool) -> Result<Filter> {
    let tok = match &a.tokenizer {
        Some(t) => Tokenizer::from_file(t)?,
        None => Tokenizer::from_model_dir(&a.model)?,
    };
    let rule = FilterRule::load(&a.rule)?;
    let context = rule.compile(&tok)?.context_needed();
    let mut opts = ModelOptions::default()
        .with_backend(a.backend)
        .with_max_context(context);
    if kernel {
        // the kernel's classification slots, and its tokenizer
        opts = opts.with_event_slots(rule.slots as usize);
    }
    let mut model = Model::open(&a.model, &opts)?;
    if kernel {
        model.load_tokenizer(&tok)?;
    }
    Filter::new(model, &tok, rule)
}

fn classify(a: &ClassifyArgs) -> Result<()> {
    let mut filter = open_filter(&a.filter, a.in_kernel)?;
    let mut counts = vec![0usize; filter.rule().labels().len()];
    let (stdin, mut out) = (std::io::stdin().lock(), std::io::stdout().lock());
    let t0 = Instant::now();
    for line in stdin.split(b'\n') {
        let payload = line.map_err(|e| Error::io("stdin", e))?;
        let v = if a.in_kernel {
            filter.classify_in_kernel(&payload)?
        } else {
            filter.classify(&payload)?
        };
        counts[v.label] += 1;
        writeln!(out, "{v}")
            .and_then(|()| out.flush())
            .map_err(|e| Error::io("stdout", e))?;
    }
    let n: usize = counts.iter().sum();
    let names = &filter.rule().rule().labels;
    let per_label: Vec<String> = names
        .iter()
        .zip(&counts)
        .map(|(l, c)| format!("{} {c}", l.name))
        .collect();
    eprintln!(
        "[{n} payloads: {}; {:.1} ms each]",
        per_label.join(", "),
        t0.elapsed().as_secs_f64() * 1e3 / n.max(1) as f64
    );
    super::common::warn_saturations(filter.model_mut().saturations());
    Ok(())
}
