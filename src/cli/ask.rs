//! Asks a model installed in the kernel (`qwen-bpf serve install`) for text.
//!
//! ```text
//! qwen-bpf ask --port P [--host H] [--chat] [--max-tokens N] \
//!     [--temperature T --seed S [--top-k K] [--top-p P] [--min-p M] [--repetition-penalty R]] \
//!     [--model DIR | --tokenizer FILE] "prompt"
//! ```
//!
//! Sends the prompt as text (the kernel tokenizes it; `--chat` wraps it in the chat template),
//! polls the text until the final record and prints exactly the generated text to stdout; a
//! summary goes to stderr. Greedy unless `--temperature` is given. With `--model` or
//! `--tokenizer` the prompt is tokenized here instead and sent as token ids (greedy only). Exits non-zero when the request is refused, or when nothing
//! answers: within 9 s of starting for the request (`--timeout`), 9 s for each poll.

use std::io::Write;
use std::net::{ToSocketAddrs, UdpSocket};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use crate::wire::{
    poll_datagram, request_datagram, text_request_datagram, Reply, WireSampling, TEXT_IN_MAX,
};
use crate::{Error, Result, Tokenizer};
use clap::Parser;

/// Ask a model installed in the kernel: prints the generated text.
#[derive(Debug, Parser)]
#[command(name = "ask")]
pub struct Args {
    /// The prompt.
    prompt: String,
    /// The UDP port the model serves.
    #[arg(long)]
    port: u16,
    /// The host it serves on (an IPv4 address or name).
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// Tokenize here with this model directory's tokenizer.json and send token ids (greedy).
    #[arg(long, conflicts_with = "tokenizer")]
    model: Option<PathBuf>,
    /// Tokenize here with this tokenizer.json and send token ids (greedy).
    #[arg(long)]
    tokenizer: Option<PathBuf>,
    #[command(flatten)]
    sampling: super::common::SamplingArgs,
    /// The most tokens to generate.
    #[arg(long, default_value_t = 64)]
    max_tokens: u32,
    /// Wrap the prompt in the Qwen3 chat template (one user turn).
    #[arg(long)]
    chat: bool,
    /// Seconds without an answer after which ask gives up (the first answer counts from the
    /// start of ask).
    #[arg(long, default_value_t = 9.0)]
    timeout: f64,
}

/// Runs `ask`.
pub fn main(args: Args) -> ExitCode {
    let start = Instant::now(); // the request's answer must come within --timeout of it
    super::common::exit_with("ask", run(&args, start))
}

/// The request datagram: text for the kernel to tokenize, or (`--model`, `--tokenizer`) token
/// ids made here.
fn request(args: &Args, request: u32) -> Result<Vec<u8>> {
    let tok = match (&args.tokenizer, &args.model) {
        (Some(t), _) => Some(Tokenizer::from_file(t)?),
        (None, Some(m)) => Some(Tokenizer::from_model_dir(m)?),
        (None, None) => None,
    };
    let params = args.sampling.params()?;
    let Some(tok) = tok else {
        if args.prompt.len() > TEXT_IN_MAX {
            return Err(Error::Invalid(format!(
                "the prompt has {} bytes; a request carries at most {TEXT_IN_MAX}",
                args.prompt.len()
            )));
        }
        let sampling = WireSampling::from_params(&params)?;
        return Ok(text_request_datagram(
            request,
            args.max_tokens,
            &args.prompt,
            args.chat,
            &sampling,
        ));
    };
    if !params.is_greedy() {
        return Err(Error::Invalid(
            "a request of token ids is generated greedily: sample with a text request (no --model or --tokenizer)".into(),
        ));
    }
    let prompt = if args.chat {
        tok.encode_chat(&args.prompt)?
    } else {
        tok.encode(&args.prompt)?
    };
    if prompt.is_empty() {
        return Err(Error::EmptyPrompt);
    }
    Ok(request_datagram(request, args.max_tokens, &prompt))
}

/// Sends `datagram` (the `what`) and waits for the reply to it, resending every 500 ms, until
/// `end`.
fn exchange(
    sock: &UdpSocket,
    datagram: &[u8],
    what: &str,
    request: u32,
    end: Instant,
) -> Result<Reply> {
    let io = |e: std::io::Error| Error::Invalid(format!("UDP: {e}"));
    let mut buf = vec![0u8; 2048];
    loop {
        sock.send(datagram).map_err(io)?;
        let resend = (Instant::now() + Duration::from_millis(500)).min(end);
        while Instant::now() < resend {
            match sock.recv(&mut buf) {
                Ok(n) => match Reply::parse(&buf[..n]) {
                    Some(r) if reply_request(&r) == request => return Ok(r),
                    _ => {} // another request's, or not a reply
                },
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock
                            | std::io::ErrorKind::TimedOut
                            | std::io::ErrorKind::ConnectionRefused
                    ) => {}
                Err(e) => return Err(io(e)),
            }
        }
        if Instant::now() >= end {
            return Err(Error::Invalid(format!(
                "no answer to the {what}: is a model installed on that port (serve status)?"
            )));
        }
    }
}

fn reply_request(r: &Reply) -> u32 {
    match r {
        Reply::Accepted { request, .. }
        | Reply::Refused { request, .. }
        | Reply::Text { request, .. }
        | Reply::Final { request, .. } => *request,
    }
}

fn run(args: &Args, start: Instant) -> Result<()> {
    let give_up = Duration::try_from_secs_f64(args.timeout)
        .map_err(|_| Error::Invalid(format!("--timeout {}", args.timeout)))?;
    let io = |e: std::io::Error| Error::Invalid(format!("UDP: {e}"));
    let server = (args.host.as_str(), args.port)
        .to_socket_addrs()
        .map_err(io)?
        .find(|a| a.is_ipv4())
        .ok_or_else(|| Error::Invalid(format!("no IPv4 address for {}", args.host)))?;
    let sock = UdpSocket::bind("0.0.0.0:0").map_err(io)?;
    sock.connect(server).map_err(io)?;
    sock.set_read_timeout(Some(Duration::from_millis(50)))
        .map_err(io)?;
    // an id of our own, unguessable (getrandom(2)): a sender spoofing our address cannot
    // send it first
    let mut id = [0u8; 4];
    // SAFETY: a writable buffer of that length.
    if unsafe { libc::getrandom(id.as_mut_ptr().cast(), id.len(), 0) } != id.len() as isize {
        return Err(Error::io("getrandom(2)", std::io::Error::last_os_error()));
    }
    let request = u32::from_le_bytes(id);
    let t0 = Instant::now();
    let datagram = self::request(args, request)?;
    let cookie = match exchange(&sock, &datagram, "request", request, start + give_up)? {
        Reply::Accepted { cookie, .. } => cookie,
        Reply::Refused { reason, code, .. } => {
            return Err(Error::Invalid(format!(
                "the request was refused: {} (code {code})",
                reason.map_or("unknown reason", |r| r.name())
            )))
        }
        other => return Err(Error::Invalid(format!("unexpected reply {other:?}"))),
    };
    let mut out = std::io::stdout().lock();
    let mut offset = 0u32;
    let mut first = None;
    loop {
        let poll = poll_datagram(request, offset, cookie);
        match exchange(&sock, &poll, "poll", request, Instant::now() + give_up)? {
            // a late copy of an earlier poll's reply
            Reply::Text { offset: at, .. } if at != offset => continue,
            Reply::Text { bytes, .. } => {
                if bytes.is_empty() {
                    std::thread::sleep(Duration::from_millis(5));
                    continue;
                }
                first.get_or_insert_with(|| t0.elapsed());
                out.write_all(&bytes)
                    .and_then(|()| out.flush())
                    .map_err(|e| Error::io("stdout", e))?;
                offset += bytes.len() as u32;
            }
            Reply::Final {
                finish,
                prompt_tokens,
                generated_tokens,
                text_len,
                ..
            } => {
                let total = t0.elapsed();
                eprintln!(
                    "\n[{} prompt tokens, {generated_tokens} generated, {text_len} bytes; finish: {}; first text after {:.0} ms, all in {:.0} ms]",
                    prompt_tokens,
                    finish.map_or("unknown", |f| f.name()),
                    first.unwrap_or(total).as_secs_f64() * 1e3,
                    total.as_secs_f64() * 1e3
                );
                return Ok(());
            }
            Reply::Refused { reason, code, .. } => {
                return Err(Error::Invalid(format!(
                    "a poll was refused: {} (code {code})",
                    reason.map_or("unknown reason", |r| r.name())
                )))
            }
            other => return Err(Error::Invalid(format!("unexpected reply {other:?}"))),
        }
    }
}
