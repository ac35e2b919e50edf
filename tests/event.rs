//! A kernel event starts the generation: UDP datagrams on the loopback interface, seen by XDP,
//! handed to BPF workqueue items, generated in the kernel; user space only sends and reads.

mod common;

use std::collections::HashMap;
use std::net::UdpSocket;
use std::path::Path;
use std::time::{Duration, Instant};

use qwen_bpf::kernel::syscalls::BpfSyscalls;
use qwen_bpf::run::event::{request_datagram, EventConfig};
use qwen_bpf::{Backend, Dispatch, Event, FinishReason, ModelOptions, Refusal};

const MAX_CONTEXT: usize = 48;

/// Held by each test for its whole run: an interface takes one XDP program at a time, and the
/// bpf(2) counter counts this whole process, so the tests of this file must not overlap.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// The options of every model here: `backend`, [`MAX_CONTEXT`] positions, weight caches in a
/// directory of the backend's own.
fn options(dir: &Path, backend: Backend) -> ModelOptions {
    ModelOptions::default()
        .with_backend(backend)
        .with_max_context(MAX_CONTEXT)
        .with_cache_dir(dir.join(format!("cache-{}", backend.name())))
}

/// Greedy tokens from user space, per operator, from a fresh context.
fn reference(dir: &Path, backend: Backend, prompt: &[u32], n: usize) -> Vec<u32> {
    let opts = options(dir, backend)
        .with_dispatch(Dispatch::PerOp)
        .with_threads(1);
    common::greedy_tokens(&mut common::open(dir, opts), prompt, n)
}

/// Sends `payload` from an unbound loopback socket to `port`.
fn send(payload: &[u8], port: u16) {
    let s = UdpSocket::bind("127.0.0.1:0").unwrap();
    s.send_to(payload, ("127.0.0.1", port)).unwrap();
}

/// Runs on CPU `cpu` from now on (so that its datagrams queue work on that CPU).
fn pin_to(cpu: usize) {
    // SAFETY: a zeroed cpu_set_t with one bit set, for this thread.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
}

/// Reads events until `n` requests are done or refused (or `limit` passes): per request, its
/// tokens and how it ended.
fn collect(
    server: &mut qwen_bpf::EventServer<'_>,
    n: usize,
    limit: Duration,
) -> HashMap<u32, (Vec<u32>, Option<Event>)> {
    let mut out: HashMap<u32, (Vec<u32>, Option<Event>)> = HashMap::new();
    let end = Instant::now() + limit;
    let mut ended = 0;
    while ended < n && Instant::now() < end {
        match server.next_event(Duration::from_millis(200)).unwrap() {
            Some(Event::Token { request, id, .. }) => out.entry(request).or_default().0.push(id),
            Some(e @ (Event::Done { .. } | Event::Refused { .. })) => {
                let r = match &e {
                    Event::Done { request, .. } | Event::Refused { request, .. } => *request,
                    _ => unreachable!(),
                };
                out.entry(r).or_default().1 = Some(e);
                ended += 1;
            }
            Some(_) | None => {}
        }
    }
    out
}

#[test]
fn a_datagram_starts_a_generation_in_the_kernel_with_no_bpf_syscall() {
    let _serial = serial();
    let dir = common::tiny_model("event");
    let prompt = [785, 3974, 13876, 38835, 916];
    let want = reference(&dir, Backend::Q24, &prompt, 12);
    let mut m = common::open(&dir, options(&dir, Backend::Q24).with_event_slots(2));
    let port = 47_001;
    let mut server = m
        .serve_events(&EventConfig::loopback(port).unwrap())
        .unwrap();
    let calls = BpfSyscalls::start().unwrap();
    let before = calls.count();
    send(&request_datagram(7, 12, &prompt), port);
    let got = collect(&mut server, 1, Duration::from_secs(60));
    let bpf_calls = calls.count() - before;
    let (tokens, end) = &got[&7];
    assert_eq!(
        tokens, &want,
        "tokens of the event path vs per-operator greedy"
    );
    assert!(
        matches!(
            end,
            Some(Event::Done {
                request: 7,
                finish: FinishReason::MaxTokens,
                ..
            })
        ),
        "request 7 ended at max tokens: {end:?}"
    );
    assert_eq!(bpf_calls, 0, "bpf(2) calls while the kernel generated");
    let c = server.counters();
    assert_eq!(
        (c.accepted, c.done, c.refused_busy, c.refused_invalid),
        (1, 1, 0, 0)
    );
}

#[test]
fn concurrent_requests_on_two_cpus_keep_their_results_apart() {
    let _serial = serial();
    let dir = common::tiny_model("event");
    let prompts: [Vec<u32>; 2] = [vec![785, 3974, 13876], vec![9707, 11, 1879, 220]];
    let want: Vec<Vec<u32>> = prompts
        .iter()
        .map(|p| reference(&dir, Backend::Int4, p, 16))
        .collect();
    let mut m = common::open(&dir, options(&dir, Backend::Int4).with_event_slots(2));
    let port = 47_002;
    let mut server = m
        .serve_events(&EventConfig::loopback(port).unwrap())
        .unwrap();
    std::thread::scope(|s| {
        for (i, p) in prompts.iter().enumerate() {
            s.spawn(move || {
                pin_to(i % 2);
                send(&request_datagram(100 + i as u32, 16, p), port);
            });
        }
    });
    let got = collect(&mut server, 2, Duration::from_secs(120));
    for (i, w) in want.iter().enumerate() {
        let (tokens, end) = &got[&(100 + i as u32)];
        assert_eq!(
            tokens, w,
            "request {i}'s tokens vs its own per-operator greedy"
        );
        assert!(
            matches!(
                end,
                Some(Event::Done {
                    finish: FinishReason::MaxTokens,
                    ..
                })
            ),
            "{end:?}"
        );
    }
}

#[test]
fn a_flood_of_malformed_oversized_and_excess_requests_is_answered_or_counted() {
    let _serial = serial();
    let dir = common::tiny_model("event");
    let mut m = common::open(&dir, options(&dir, Backend::Q24).with_event_slots(2));
    let port = 47_003;
    let cfg = EventConfig {
        max_new: 8,
        ..EventConfig::loopback(port).unwrap()
    };
    let vocab = m.config().vocab_size as u32;
    let mut server = m.serve_events(&cfg).unwrap();
    let good = |r: u32| request_datagram(r, 8, &[785, 3974, 13876]);
    let mut sent = Vec::new();
    let mut bad =
        |payload: Vec<u8>, request: u32, why: Refusal| sent.push((payload, request, Some(why)));
    bad(b"hello".to_vec(), 0, Refusal::Malformed);
    let mut wrong_magic = good(1);
    wrong_magic[0] ^= 1;
    bad(wrong_magic, 1, Refusal::Malformed);
    let mut truncated = good(2);
    truncated.truncate(truncated.len() - 2);
    bad(truncated, 2, Refusal::Malformed);
    bad(
        request_datagram(3, 8, &[1, vocab, 2]),
        3,
        Refusal::TokenOutOfRange,
    );
    bad(request_datagram(4, 9, &[1, 2]), 4, Refusal::Limit);
    bad(request_datagram(5, 8, &vec![1; 60]), 5, Refusal::Limit); // longer than the context
    bad(request_datagram(6, 8, &[]), 6, Refusal::Limit);
    bad(request_datagram(7, 0, &[1]), 7, Refusal::Limit);
    for r in 0..40u32 {
        sent.push((good(1000 + r), 1000 + r, None)); // far more than 2 slots at once
    }
    let t = Instant::now();
    for (payload, _, _) in &sent {
        send(payload, port);
    }
    let got = collect(&mut server, sent.len(), Duration::from_secs(120));
    let c = server.counters();
    assert_eq!(
        c.accepted + c.refused_busy + c.refused_invalid,
        sent.len() as u64,
        "every datagram to the port is accepted or counted as refused: {c:?}"
    );
    assert_eq!(c.refused_invalid, 8, "the 8 invalid datagrams: {c:?}");
    assert!(
        c.accepted >= 2 && c.refused_busy > 0,
        "2 slots, 40 requests at once: {c:?}"
    );
    for (_, request, why) in sent.iter().filter(|s| s.2.is_some()) {
        if *request > 0 {
            assert!(
                matches!(got[request].1, Some(Event::Refused { reason, .. }) if Some(reason) == *why),
                "request {request} refused as {why:?}: {:?}",
                got[request].1
            );
        }
    }
    let mut done = 0;
    for r in 1000..1040u32 {
        match &got[&r].1 {
            Some(Event::Done {
                finish: FinishReason::MaxTokens,
                ..
            }) => {
                assert_eq!(got[&r].0.len(), 8, "request {r} generated its 8 tokens");
                done += 1;
            }
            Some(Event::Refused {
                reason: Refusal::Busy,
                ..
            }) => {}
            other => panic!("request {r}: {other:?}"),
        }
    }
    assert_eq!(done as u64, c.accepted, "every accepted request ends");
    assert_eq!(c.done, c.accepted, "no worker left running");
    assert!(
        t.elapsed() < Duration::from_secs(120),
        "the flood is over in bounded time"
    );
    // the server still serves after the flood
    send(&good(5000), port);
    let after = collect(&mut server, 1, Duration::from_secs(30));
    assert!(
        matches!(after[&5000].1, Some(Event::Done { .. })),
        "served after the flood"
    );
}
