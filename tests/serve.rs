//! A model installed in the kernel (`Model::install`, the `serve` and `ask` examples): installed
//! by a process that exits, answered from XDP with no process left, refusals answered and
//! counted, slots given back, removed with its memory freed, and served on a veth pair in
//! native XDP mode. The clients speak the wire format with plain `std::net::UdpSocket`s and
//! the byte tables of docs/in-kernel.md, not the crate's helpers.
//!
//! Needs root (BPF, XDP, the BPF filesystem, network namespaces); every test fails, never
//! skips, without them.

mod common;

use common::netns::{in_netns, native_xdp, Veth};
use common::serve::{
    eventually, install_in_process, options, reference, text_of, wire, Client, Installation, CTX,
};

use std::net::{Ipv4Addr, SocketAddr, UdpSocket};
use std::process::Command;
use std::time::{Duration, Instant};

use qwen_bpf::kernel::pins::map_exists;
use qwen_bpf::run::serve::pin_dir;
use qwen_bpf::{Error, InstallConfig, Installed, Model, Refusal, Tokenizer, XdpMode};

/// The tests of this file take turns: `lo` takes one XDP program at a time, and each test
/// reads counters that only its own datagrams move.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

#[test]
fn installed_by_a_process_that_exited_it_answers_with_the_per_operator_text_until_removed() {
    let _serial = serial();
    let dir = common::tiny_model_with_tokenizer("serve");
    let tok = Tokenizer::from_model_dir(&dir).unwrap();
    let prompt = tok.encode("The old lighthouse keeper climbed").unwrap();
    let max_new = 24;
    let (ids, stopped) = reference(&dir, &prompt, max_new, &tok.eos_ids());
    let want = text_of(&tok, &ids, stopped);
    let (name, port) = ("test-serve-child", 47_301u16);
    let _cleanup = Installation::new(name);
    // installed by a child process, which exits
    let bin = common::example_bin("serve");
    let (ctx, cache) = (CTX.to_string(), dir.join("cache-q24"));
    let out = common::run(
        Command::new(&bin)
            .args(["install", "--model"])
            .arg(&dir)
            .args([
                "--name",
                name,
                "--port",
                &port.to_string(),
                "--slots",
                "2",
                "--max-context",
                &ctx,
                "--cache-dir",
            ])
            .arg(&cache),
    );
    assert!(out.contains("installed"), "{out}");
    let installed = Installed::open(name).unwrap();
    let arena = installed.status().unwrap().arena_map_id;
    assert!(map_exists(arena));
    let client = Client::new("127.0.0.1:0", (Ipv4Addr::LOCALHOST, port).into());
    // the request is text: the kernel tokenizes it (the reference's prompt is the tokenizers
    // crate's ids for it)
    let r = client.ask(&wire::text_request(
        7,
        max_new as u32,
        0,
        wire::GREEDY,
        b"The old lighthouse keeper climbed",
    ));
    assert_eq!(
        (wire::word(&r, 1), wire::word(&r, 2)),
        (wire::ACCEPTED, 7),
        "ACCEPTED 7"
    );
    let (text, fin) = client.poll_to_end(7);
    assert_eq!(
        String::from_utf8(text).unwrap(),
        want,
        "the kernel's text vs per-operator greedy decoded"
    );
    let finish = if stopped { 1 } else { 2 };
    assert_eq!(
        &fin[4..7],
        &[finish, prompt.len() as u32, ids.len() as u32],
        "FINAL: finish, prompt tokens, generated tokens"
    );
    if stopped {
        assert_eq!(fin[7], *ids.last().unwrap(), "the stop token");
    }
    let s = installed.status().unwrap();
    println!("{s}");
    assert_eq!((s.accepted, s.done, s.tokens), (1, 1, ids.len() as u64));
    assert!(s.polls >= 2, "{s}");
    assert!(s.refused.iter().all(|&(_, n)| n == 0), "{s}");
    assert_eq!(
        (s.port, s.slots, s.interface.as_deref()),
        (port, 2, Some("lo"))
    );
    assert!(s.kernel_memory > 0);
    // removed by another child: the pins go, the kernel frees the arena
    let out = common::run(Command::new(&bin).args(["remove", name]));
    assert!(out.contains("removed"), "{out}");
    assert!(!pin_dir(name).exists(), "the pins are gone");
    assert!(matches!(
        Installed::open(name),
        Err(Error::NotInstalled { .. })
    ));
    drop(installed);
    assert!(
        eventually(Duration::from_secs(10), || !map_exists(arena)),
        "arena map {arena} still exists"
    );
    // the port is the stack's again: a datagram reaches a socket bound to it
    let listener = UdpSocket::bind(("127.0.0.1", port)).unwrap();
    listener
        .set_read_timeout(Some(Duration::from_secs(2)))
        .unwrap();
    let d = wire::request(8, 4, &prompt);
    client.sock.send(&d).unwrap();
    let mut buf = [0u8; 2048];
    let n = listener.recv(&mut buf).unwrap();
    assert_eq!(&buf[..n], &d[..]);
}

#[test]
fn refusals_are_answered_with_their_reason_and_counted_and_others_pass_untouched() {
    let _serial = serial();
    let dir = common::tiny_model_with_tokenizer("serve");
    let tok = Tokenizer::from_model_dir(&dir).unwrap();
    let (name, port) = ("test-serve-refusals", 47_302u16);
    let _cleanup = Installation::new(name);
    let cfg = InstallConfig {
        max_new: 8,
        ..InstallConfig::loopback(port)
    };
    install_in_process(&dir, name, 2, CTX, &cfg);
    // a second model under the same name is refused
    let mut again = Model::open(&dir, &options(&dir, 1, CTX)).unwrap();
    again.load_vocabulary(&tok).unwrap();
    again.load_tokenizer(&tok).unwrap();
    assert!(matches!(
        again.install(name, &cfg),
        Err(Error::AlreadyInstalled { .. })
    ));
    let vocab = 151_936;
    let server: SocketAddr = (Ipv4Addr::LOCALHOST, port).into();
    let a = Client::new("127.0.0.1:0", server);
    let b = Client::new("127.0.0.1:0", server);
    // a socket on the served port: what the kernel answers never reaches it
    let listener = UdpSocket::bind(server).unwrap();
    listener.set_nonblocking(true).unwrap();
    // no reply is larger than its datagram: 5 bytes get none; 20 zero bytes, a refusal
    a.unanswered(b"hello");
    a.refused(&[0u8; 20], 0, Refusal::Malformed);
    let mut wrong_magic = wire::request(1, 8, &[785, 3974]);
    wrong_magic[0] ^= 1;
    a.refused(&wrong_magic, 1, Refusal::Malformed);
    let mut truncated = wire::request(2, 8, &[785, 3974]);
    truncated.truncate(truncated.len() - 2);
    a.refused(&truncated, 2, Refusal::Malformed);
    a.refused(
        &wire::request(3, 8, &[1, vocab, 2]),
        3,
        Refusal::TokenOutOfRange,
    );
    a.refused(&wire::request(4, 9, &[1, 2]), 4, Refusal::Limit);
    a.unanswered(&wire::request(5, 8, &[])); // 16 bytes
    a.refused(&wire::request(6, 8, &[1; CTX + 1]), 6, Refusal::Limit);
    // text requests: not UTF-8 (a lone continuation byte, a surrogate, an overlong form), too
    // long, an unknown flag, a length past the datagram, a temperature past its limit
    a.refused(
        &wire::text_request(10, 8, 0, wire::GREEDY, b"ab\x80c"),
        10,
        Refusal::BadUtf8,
    );
    a.refused(
        &wire::text_request(11, 8, 0, wire::GREEDY, "x\u{e9}".as_bytes()[..2].as_ref()),
        11,
        Refusal::BadUtf8,
    );
    a.refused(
        &wire::text_request(12, 8, 0, wire::GREEDY, b"\xed\xa0\x80"),
        12,
        Refusal::BadUtf8,
    );
    a.refused(
        &wire::text_request(13, 8, 0, wire::GREEDY, b"\xc0\xaf"),
        13,
        Refusal::BadUtf8,
    );
    a.refused(
        &wire::text_request(14, 8, 0, wire::GREEDY, &[b'a'; 4097]),
        14,
        Refusal::Limit,
    );
    a.refused(
        &wire::text_request(15, 8, 2, wire::GREEDY, b"hi"),
        15,
        Refusal::Malformed,
    );
    let mut long = wire::text_request(16, 8, 0, wire::GREEDY, b"hi");
    long.truncate(long.len() - 1);
    a.refused(&long, 16, Refusal::Malformed);
    a.refused(
        &wire::text_request(17, 8, 0, [101 << 16, 0, 0, 0, 0, 0, 0], b"hi"),
        17,
        Refusal::Limit,
    );
    // a poll too short for the FINAL record, and for any reply
    a.unanswered(&wire::words(&[wire::POLL, 50, 0]));
    let prompt = [785, 3974, 13876];
    let r = a.ask(&wire::request(50, 8, &prompt));
    assert_eq!((wire::word(&r, 1), wire::word(&r, 2)), (wire::ACCEPTED, 50));
    a.refused(&a.poll(51, 0), 51, Refusal::UnknownRequest);
    b.refused(&a.poll(50, 0), 50, Refusal::UnknownRequest); // another source port
    a.refused(&a.poll(50, 1_000_000), 50, Refusal::BadOffset);
    // a wrong cookie: no reply
    a.unanswered(&wire::poll(50, 0, a.cookie(50) ^ 1));
    let (text, fin) = a.poll_to_end(50);
    assert_eq!(fin[4], 2, "max tokens");
    assert_eq!(fin[6], 8, "8 tokens generated");
    let (ids, _) = reference(&dir, &prompt, 8, &[]);
    assert_eq!(text, text_of(&tok, &ids, false).into_bytes());
    // a request sent again is answered, not started again
    let r = a.ask(&wire::request(50, 8, &prompt));
    assert_eq!((wire::word(&r, 1), wire::word(&r, 2)), (wire::ACCEPTED, 50));
    let mut buf = [0u8; 2048];
    assert!(
        listener.recv(&mut buf).is_err(),
        "a datagram the kernel answered reached the socket"
    );
    let s = Installed::open(name).unwrap().status().unwrap();
    println!("{s}");
    let counts: Vec<(Refusal, u64)> = s.refused.iter().copied().filter(|c| c.1 > 0).collect();
    assert_eq!(
        counts,
        [
            (Refusal::Malformed, 7),
            (Refusal::TokenOutOfRange, 1),
            (Refusal::Limit, 5),
            (Refusal::UnknownRequest, 2),
            (Refusal::BadOffset, 1),
            (Refusal::BadUtf8, 4),
        ]
    );
    assert_eq!((s.accepted, s.repeats, s.tokens), (1, 1, 8));
    assert_eq!(
        s.unanswered, 3,
        "the three datagrams shorter than any reply"
    );
    // from a source not configured, or to another port: passed to the stack untouched
    listener.set_nonblocking(false).unwrap();
    listener
        .set_read_timeout(Some(Duration::from_secs(2)))
        .unwrap();
    let stranger = UdpSocket::bind("127.0.0.2:0").unwrap();
    let d = wire::request(60, 8, &prompt);
    stranger.send_to(&d, server).unwrap();
    let n = listener.recv(&mut buf).unwrap();
    assert_eq!(&buf[..n], &d[..], "from 127.0.0.2");
    let other = UdpSocket::bind(("127.0.0.1", port + 1)).unwrap();
    other
        .set_read_timeout(Some(Duration::from_secs(2)))
        .unwrap();
    a.sock.send_to(&d, ("127.0.0.1", port + 1)).unwrap();
    let n = other.recv(&mut buf).unwrap();
    assert_eq!(&buf[..n], &d[..], "to another port");
    let after = Installed::open(name).unwrap().status().unwrap();
    assert_eq!(
        (after.accepted, after.refused.clone(), after.polls),
        (s.accepted, s.refused.clone(), s.polls),
        "passed datagrams are not counted"
    );
}

#[test]
fn a_full_text_buffer_ends_with_length_and_silent_clients_lose_their_slot() {
    let _serial = serial();
    let dir = common::tiny_model_with_tokenizer("serve");
    let tok = Tokenizer::from_model_dir(&dir).unwrap();
    let prompt = [785, 3974, 13876];
    let server: SocketAddr = (Ipv4Addr::LOCALHOST, 47_303).into();
    {
        let name = "test-serve-length";
        let _cleanup = Installation::new(name);
        let cfg = InstallConfig {
            text_bytes: 16,
            max_new: 40,
            ..InstallConfig::loopback(server.port())
        };
        install_in_process(&dir, name, 1, CTX, &cfg);
        let (text, fin) = Client::new("127.0.0.1:0", server).generate(1, 40, &prompt);
        let (ids, _) = reference(&dir, &prompt, 40, &[]);
        // the whole tokens whose bytes fit 16
        let mut want = Vec::new();
        let mut fitted = 0;
        for &t in &ids {
            let b = tok.token_bytes(t).unwrap();
            if want.len() + b.len() > 16 {
                break;
            }
            want.extend_from_slice(&b);
            fitted += 1;
        }
        assert_eq!(text, want);
        assert_eq!(fin[4], 4, "finish: length");
        assert_eq!(
            fin[6],
            fitted + 1,
            "the tokens that fit and the one that did not"
        );
    }
    let name = "test-serve-timeout";
    let _cleanup = Installation::new(name);
    let cfg = InstallConfig {
        timeout: Duration::from_secs(1),
        max_new: 1000,
        ..InstallConfig::loopback(server.port())
    };
    install_in_process(&dir, name, 1, 1024, &cfg);
    let installed = Installed::open(name).unwrap();
    let (a, b) = (
        Client::new("127.0.0.1:0", server),
        Client::new("127.0.0.1:0", server),
    );
    // a long generation nobody polls: its worker gives the slot back after the timeout
    let r = a.ask(&wire::request(1, 1000, &prompt));
    assert_eq!(wire::word(&r, 1), wire::ACCEPTED);
    b.refused(&wire::request(2, 4, &prompt), 2, Refusal::Busy);
    assert!(
        eventually(Duration::from_secs(5), || installed
            .status()
            .unwrap()
            .reclaimed
            == 1),
        "the silent running request was given back"
    );
    let s = installed.status().unwrap();
    assert_eq!((s.slots_busy, s.slots_finished), (0, 0), "{s}");
    assert!(s.tokens < 1000, "stopped early: {s}");
    a.refused(&a.poll(1, 0), 1, Refusal::UnknownRequest);
    // a finished one nobody polls keeps its slot until the timeout, then a request takes it
    let r = a.ask(&wire::request(3, 2, &prompt));
    assert_eq!(wire::word(&r, 1), wire::ACCEPTED);
    assert!(eventually(Duration::from_millis(900), || {
        installed.status().unwrap().slots_finished == 1
    }));
    b.refused(&wire::request(4, 2, &prompt), 4, Refusal::Busy);
    std::thread::sleep(Duration::from_millis(1200));
    let r = b.ask(&wire::request(5, 2, &prompt));
    assert_eq!((wire::word(&r, 1), wire::word(&r, 2)), (wire::ACCEPTED, 5));
    a.refused(&a.poll(3, 0), 3, Refusal::UnknownRequest);
    let (_, fin) = b.poll_to_end(5);
    assert_eq!(fin[4], 2);
    // and once its FINAL record was sent, the slot is free at once
    let (_, fin) = a.generate(6, 2, &prompt);
    assert_eq!(fin[4], 2);
    let s = installed.status().unwrap();
    println!("{s}");
    assert_eq!(
        (s.accepted, s.reclaimed, s.refused_for(Refusal::Busy)),
        (4, 2, 2)
    );
}

#[test]
fn ask_prints_the_text_and_gives_up_when_nothing_answers() {
    let _serial = serial();
    let dir = common::tiny_model_with_tokenizer("serve");
    let tok = Tokenizer::from_model_dir(&dir).unwrap();
    let ask = common::example_bin("ask");
    let port = 47_304u16;
    let t = Instant::now();
    let out = Command::new(&ask)
        .args(["--port", &port.to_string(), "--tokenizer"])
        .arg(common::tokenizer_path())
        .arg("Hello")
        .output()
        .unwrap();
    let took = t.elapsed();
    assert!(!out.status.success(), "ask with nothing on the port");
    // its 9 s deadline (`--timeout`), with room for a slow start under TCG beside other tests
    assert!(took < Duration::from_secs(20), "gave up after {took:?}");
    let name = "test-serve-ask";
    let _cleanup = Installation::new(name);
    let cfg = InstallConfig {
        stop_tokens: tok.eos_ids(),
        ..InstallConfig::loopback(port)
    };
    install_in_process(&dir, name, 2, CTX, &cfg);
    let prompt = "The old lighthouse keeper";
    let (ids, stopped) = reference(&dir, &tok.encode(prompt).unwrap(), 20, &tok.eos_ids());
    let out = common::run(
        Command::new(&ask)
            .args(["--port", &port.to_string(), "--max-tokens", "20", "--model"])
            .arg(&dir)
            .arg(prompt),
    );
    assert_eq!(out, text_of(&tok, &ids, stopped), "ask's stdout");
}

/// Attaches a program that passes every frame to `dev` in namespace `ns`, in native mode (see
/// `netns::attach_xdp_pass`).
fn attach_pass_program(ns: &str, dev: &str) {
    in_netns(ns, || {
        common::netns::attach_xdp_pass(common::netns::ifindex(dev));
    });
}

#[test]
fn on_a_veth_pair_in_native_mode_a_client_in_a_namespace_is_answered() {
    let _serial = serial();
    let dir = common::tiny_model_with_tokenizer("serve");
    let tok = Tokenizer::from_model_dir(&dir).unwrap();
    let veth = Veth::new("qbpf-serve-test", "qbs-h", "qbs-n", [10, 203, 0]);
    let (ns, host, peer) = (veth.ns, veth.host, veth.peer);
    attach_pass_program(ns, peer);
    let (name, port) = ("test-serve-veth", 47_305u16);
    let _cleanup = Installation::new(name);
    let cfg = InstallConfig {
        xdp_mode: XdpMode::Native,
        stop_tokens: tok.eos_ids(),
        ..InstallConfig::on_interface(host, port, vec![veth.peer_addr])
    };
    install_in_process(&dir, name, 2, CTX, &cfg);
    assert!(native_xdp(host), "attached in native mode");
    let prompt_text = "The old lighthouse keeper";
    let prompt = tok.encode(prompt_text).unwrap();
    let (ids, stopped) = reference(&dir, &prompt, 16, &tok.eos_ids());
    let want = text_of(&tok, &ids, stopped);
    let server: SocketAddr = (veth.host_addr, port).into();
    let (text, fin) = in_netns(ns, || {
        Client::new(&format!("{}:0", veth.peer_addr), server).generate(9, 16, &prompt)
    });
    assert_eq!(String::from_utf8(text).unwrap(), want);
    assert_eq!(fin[6], ids.len() as u32);
    // and ask, run inside the namespace
    let out = common::run(
        Command::new("ip")
            .args(["netns", "exec", ns])
            .arg(common::example_bin("ask"))
            .args([
                "--host",
                &veth.host_addr.to_string(),
                "--port",
                &port.to_string(),
            ])
            .args(["--max-tokens", "16", "--model"])
            .arg(&dir)
            .arg(prompt_text),
    );
    assert_eq!(out, want, "ask's stdout in the namespace");
    let s = Installed::open(name).unwrap().status().unwrap();
    println!("{s}");
    assert_eq!((s.accepted, s.reply_failures), (2, 0));
    assert_eq!(s.interface.as_deref(), Some(host));
}
