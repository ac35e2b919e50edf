//! An installed model's answers against `generate`, in one run: the time to the first token of
//! an answer and the tokens per second of each request, for one request and for as many at once
//! as the model has slots.
//!
//! ```text
//! cargo bench --bench serve                      # the synthetic Qwen3-0.6B, 2 slots, 32 tokens
//! QWEN_BPF_BENCH_MODEL=DIR cargo bench --bench serve -- --slots 2 --tokens 64
//! ```
//!
//! Rows:
//! - `generate`: [`Model::generate`] on one thread, the library's own loop in user space;
//! - `generate_in_kernel`: the same, one BPF invocation per time budget, on one thread;
//! - `served, 1 request`: an installed model (no process of ours in its path) asked over UDP on
//!   loopback by a client that polls every millisecond; the first token is the first text a
//!   poll returns, tokens/s counts the tokens after it;
//! - `served, N at once`: N clients, one per slot, asking together (each slot runs on one
//!   thread, as `generate` here does).
//!
//! Each served request is sent twice: as token ids (the prompt tokenized here) and as text (the
//! kernel tokenizes it). Needs root.

use std::net::{Ipv4Addr, SocketAddr, UdpSocket};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use qwen_bpf::wire::{poll_datagram, request_datagram, text_request_datagram, Reply, WireSampling};
use qwen_bpf::{GenerateOptions, InstallConfig, Installed, Model, ModelOptions, Tokenizer};

const PROMPT: &str = "The old lighthouse keeper climbed the stairs and";
const PORT: u16 = 47_391;
const NAME: &str = "bench-serve";

fn model_dir() -> PathBuf {
    match std::env::var_os("QWEN_BPF_BENCH_MODEL") {
        Some(dir) if !dir.is_empty() => PathBuf::from(dir),
        _ => qwen_bpf::ensure_default_model(None, true).expect("generating the default model"),
    }
}

/// `--name value` from the command line (cargo bench passes `--bench` too: ignored).
fn arg(name: &str, default: usize) -> usize {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .map(|v| v.parse().unwrap_or_else(|_| panic!("{name} {v}")))
        .unwrap_or(default)
}

/// One answer: the time to its first token and the tokens/s after it.
#[derive(Clone, Copy)]
struct Timing {
    first: Duration,
    rest: Duration,
    tokens: usize,
}

impl Timing {
    fn per_s(&self) -> f64 {
        (self.tokens.saturating_sub(1)) as f64 / self.rest.as_secs_f64().max(1e-9)
    }
}

/// Asks the installed model with `datagram` (request `id`) and polls every millisecond.
fn ask(server: SocketAddr, id: u32, datagram: &[u8]) -> Timing {
    let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
    sock.connect(server).unwrap();
    sock.set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let mut buf = vec![0u8; 2048];
    let mut exchange = |d: &[u8]| loop {
        sock.send(d).unwrap();
        if let Ok(n) = sock.recv(&mut buf) {
            match Reply::parse(&buf[..n]) {
                Some(r) => return r,
                None => panic!("not a reply: {:?}", &buf[..n]),
            }
        }
    };
    let t0 = Instant::now();
    let cookie = match exchange(datagram) {
        Reply::Accepted { cookie, .. } => cookie,
        r => panic!("request {id}: {r:?}"),
    };
    let (mut offset, mut first) = (0u32, None);
    loop {
        match exchange(&poll_datagram(id, offset, cookie)) {
            Reply::Text { bytes, .. } if bytes.is_empty() => {
                std::thread::sleep(Duration::from_millis(1))
            }
            Reply::Text { bytes, .. } => {
                first.get_or_insert_with(|| t0.elapsed());
                offset += bytes.len() as u32;
            }
            Reply::Final {
                generated_tokens, ..
            } => {
                let all = t0.elapsed();
                let first = first.unwrap_or(all);
                return Timing {
                    first,
                    rest: all - first,
                    tokens: generated_tokens as usize,
                };
            }
            r => panic!("poll of {id}: {r:?}"),
        }
    }
}

/// A generation's timing from `t0`: its first token, then the rest.
fn timed(t0: Instant, mut g: impl Iterator<Item = qwen_bpf::Result<u32>>) -> Timing {
    g.next().unwrap().unwrap();
    let first = t0.elapsed();
    let tokens = g.map(|t| t.unwrap()).count() + 1;
    Timing {
        first,
        rest: t0.elapsed() - first,
        tokens,
    }
}

fn row(what: &str, t: &[Timing]) {
    let n = t.len() as f64;
    let first = t.iter().map(|t| t.first.as_secs_f64()).sum::<f64>() / n * 1e3;
    let per_s = t.iter().map(Timing::per_s).sum::<f64>() / n;
    println!(
        "| {what:<40} | {first:>10.1} | {per_s:>13.2} | {:>12.2} |",
        per_s * n
    );
}

fn main() {
    let dir = model_dir();
    let slots = arg("--slots", 2);
    let tokens = arg("--tokens", 32);
    // the model's tokenizer.json, else the Qwen3 one beside the source tree (the synthetic model
    // has none)
    let beside =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/qwen3-tokenizer/tokenizer.json");
    let tok = Tokenizer::from_model_dir(&dir)
        .or_else(|_| Tokenizer::from_file(&beside))
        .expect("a tokenizer: the model's or ../shared/qwen3-tokenizer/tokenizer.json");
    let prompt = tok.encode(PROMPT).unwrap();
    let opts = ModelOptions {
        threads: 1,
        max_context: 256,
        event_slots: slots,
        progress: true,
        ..Default::default()
    };
    let gen = GenerateOptions::new(tokens);
    println!(
        "model {}, {} prompt tokens, {tokens} new tokens",
        dir.display(),
        prompt.len()
    );
    println!("| {:<40} | first (ms) | tokens/s each | tokens/s all |", "");
    println!("|{:-<42}|{:->12}|{:->15}|{:->14}|", "", "", "", "");

    let mut m = Model::open(&dir, &opts).expect("opening the model");
    // the clock starts before the call, which may prefill at once or at the first token
    row(
        "generate (1 thread)",
        &[timed(Instant::now(), m.generate(&prompt, &gen).unwrap())],
    );
    row(
        "generate_in_kernel (1 thread)",
        &[timed(
            Instant::now(),
            m.generate_in_kernel(&prompt, &gen).unwrap(),
        )],
    );

    let _ = Installed::remove(NAME);
    m.load_tokenizer(&tok)
        .expect("the kernel tokenizer's tables");
    m.load_vocabulary(&tok).unwrap();
    let cfg = InstallConfig {
        max_new: tokens as u32,
        rate: None, // the bench sends as fast as the server answers
        ..InstallConfig::loopback(PORT)
    };
    m.install(NAME, &cfg).expect("installing");
    let server: SocketAddr = (Ipv4Addr::LOCALHOST, PORT).into();
    let ids = |id| request_datagram(id, tokens as u32, &prompt);
    let text =
        |id| text_request_datagram(id, tokens as u32, PROMPT, false, &WireSampling::default());
    for (what, make) in [
        ("token ids", &ids as &dyn Fn(u32) -> Vec<u8>),
        ("text", &text as &dyn Fn(u32) -> Vec<u8>),
    ] {
        row(
            &format!("served, 1 request, {what}"),
            &[ask(server, 1, &make(1))],
        );
        let all: Vec<Timing> = std::thread::scope(|s| {
            let h: Vec<_> = (0..slots as u32)
                .map(|i| {
                    let d = make(10 + i);
                    s.spawn(move || ask(server, 10 + i, &d))
                })
                .collect();
            h.into_iter().map(|h| h.join().unwrap()).collect()
        });
        row(&format!("served, {slots} at once, {what}"), &all);
    }
    Installed::remove(NAME).unwrap();
}
