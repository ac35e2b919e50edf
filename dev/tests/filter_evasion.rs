//! The filter against a sender that tries to walk around it (issue 31), on a real link: the
//! filter installed on the server's end of a veth pair in front of a real HTTP server (a
//! `TcpListener` in this namespace), and a client that writes every frame itself through a
//! packet socket on the other end, so that it can split, corrupt, reorder, change and fragment
//! its segments as no kernel socket would. The client's addresses are not configured in its
//! namespace (a static neighbour entry sends the server's answers to its link), so its kernel
//! never answers for it: the test runs its TCP by hand.
//!
//! The model is the tiny synthetic one; which requests are "bad" is whatever user space's
//! `Filter::classify` says of them under the rule (a margin splits the candidates when the
//! random model prefers one label for all), and the kernel must agree integer for integer.
//! Shown, each request on its own flow:
//! - a good request split into a 1-byte first segment and three more reaches the server;
//! - a bad one sent as "G" and the rest never does: the rest is held, judged, and its
//!   retransmission dropped;
//! - a segment with a bad checksum, or out of the window, carrying a good line into a bad flow
//!   is dropped and never read: the verdict is on the bytes the server would have read;
//! - a retransmission of a judged-good segment with other bytes is dropped; the true one passes;
//! - a request in IPv4 fragments never reaches the server (fragments meet `pending`);
//! - data from 64 spoofed sources with no handshake takes no slot, and a good flow is then
//!   still served.
//!
//! Needs root and BPF arenas (the VMs' smoke suite where the host refuses them).

#[path = "../../tests/common/mod.rs"]
mod common;

use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

use common::http::HttpServer;
use common::netns::Veth;
use common::serve::{eventually, Installation};
use common::wire::{mac, PacketSocket, Segment, ACK, PSH, SYN};
use qwen_bpf::filter::{FilterInstall, FilterRule, InstalledFilter, Verdict};
use qwen_bpf::Tokenizer;

const NAME: &str = "test-filter-evasion";
const PORT: u16 = 47_390;
const NET: [u8; 3] = [10, 207, 0];
/// How long a verdict may take (the tiny model; TCG is slow).
const VERDICT: Duration = Duration::from_secs(90);

/// The rule: the first line of a request to PORT on `dev`, "good" passes, "bad" is dropped;
/// `margin` (Q16 nats) and `fallback` split the candidates (see `split`).
fn rule(dev: &str, margin_q16: i64, fallback: &str) -> FilterRule {
    FilterRule::from_json(&format!(
        r#"{{"interface": "{dev}", "protocol": "tcp", "ports": [{PORT}], "bytes": 64,
        "first_line": true, "template": "Is this request good or bad?\n{{payload}}\nAnswer:",
        "labels": [
          {{"name": "good", "text": " good", "action": "pass"}},
          {{"name": "bad", "text": " bad request", "action": "drop"}}
        ], "margin": {}, "fallback": "{fallback}", "slots": 2, "per_source": 1}}"#,
        margin_q16 as f64 / 65_536.0
    ))
    .expect("a valid rule")
}

/// The request for `path`.
fn request(path: &str) -> Vec<u8> {
    format!(
        "GET /{path} HTTP/1.1\r\nHost: {}.1\r\n\r\n",
        NET.map(|b| b.to_string()).join(".")
    )
    .into_bytes()
}

/// A margin and fallback under which user space calls some candidates good and some bad: the
/// labels as scored when they already differ, else the candidates split at the median of the
/// winner's lead (those below it get the other label).
fn split(scores: &[(i64, i64)]) -> (i64, &'static str) {
    let good = scores.iter().filter(|(g, b)| g >= b).count();
    if good >= 3 && scores.len() - good >= 3 {
        return (0, "good");
    }
    let mut lead: Vec<i64> = scores.iter().map(|(g, b)| (g - b).abs()).collect();
    lead.sort();
    lead.dedup();
    assert!(lead.len() >= 6, "too few distinct scores: {lead:?}");
    let m = lead.len() / 2;
    let margin = (lead[m - 1] + lead[m]) / 2 + 1;
    (margin, if good > 0 { "bad" } else { "good" })
}

/// The client: a packet socket on the namespace's end, the MACs of both ends.
struct Client {
    sock: PacketSocket,
    mac: [u8; 6],
    server_mac: [u8; 6],
    server: (Ipv4Addr, u16),
}

/// One flow of the client's: its address and port, and both initial sequence numbers.
#[derive(Clone, Copy)]
struct Flow {
    src: (Ipv4Addr, u16),
    isn: u32,
    srv: u32,
}

impl Client {
    fn send(&self, s: &Segment) {
        self.sock.send(&s.frame(self.mac, self.server_mac));
    }

    /// A segment of `flow` at byte `off` of its data.
    fn seg<'a>(&self, flow: Flow, off: u32, flags: u8, payload: &'a [u8]) -> Segment<'a> {
        Segment {
            src: flow.src,
            dst: self.server,
            seq: flow.isn.wrapping_add(1 + off),
            ack: flow.srv.wrapping_add(1),
            flags: ACK | flags,
            payload,
            corrupt: false,
        }
    }

    /// The handshake from `src` (client ISN `isn`): SYN, the server's SYN-ACK read, ACK.
    fn connect(&self, src: (Ipv4Addr, u16), isn: u32) -> Flow {
        let mut syn = self.seg(Flow { src, isn, srv: 0 }, 0, 0, b"");
        (syn.seq, syn.ack, syn.flags) = (isn, 0, SYN);
        self.send(&syn);
        let sa = self
            .sock
            .recv_tcp(self.server, src, Duration::from_secs(10))
            .expect("the server's SYN-ACK");
        assert_eq!((sa.flags & (SYN | ACK), sa.ack), (SYN | ACK, isn + 1));
        let flow = Flow {
            src,
            isn,
            srv: sa.seq,
        };
        self.send(&self.seg(flow, 0, 0, b""));
        flow
    }
}

/// The excerpt and label of the next verdict `f` logs.
fn next_verdict(f: &InstalledFilter) -> (Vec<u8>, usize, i64) {
    let mut record = None;
    f.follow_log(VERDICT, |r| {
        record = Some(r);
        false
    })
    .unwrap();
    let r = record.expect("a verdict record");
    (r.excerpt, r.label, r.score_q16)
}

#[test]
fn requests_split_corrupted_changed_fragmented_or_spoofed_never_walk_a_bad_request_past() {
    let dir = common::tiny_model_with_tokenizer("filter-evasion");
    let tok = Tokenizer::from_file(common::tokenizer_path()).unwrap();
    let veth = Veth::new("qbpf-evasion", "qbe-h", "qbe-n", NET);

    // 1. the candidates scored by user space; good and bad ones chosen
    let paths: Vec<String> = (0..48)
        .map(|i| match i % 4 {
            0 => format!("index{i}.html"),
            1 => format!("../../etc/passwd{i}"),
            2 => format!("api/v{i}/items?id={}", i * 7),
            _ => format!("cgi-bin/x{i}.sh;cat%20/etc/shadow"),
        })
        .collect();
    let mut user = common::filter(&dir, &tok, rule(veth.host, 0, "good"));
    let scores: Vec<(i64, i64)> = paths
        .iter()
        .map(|p| {
            let v = user.classify(&request(p)).unwrap();
            (v.scores_q16[0], v.scores_q16[1])
        })
        .collect();
    let (margin, fallback) = split(&scores);
    let rule = rule(veth.host, margin, fallback);
    let mut user = common::filter(&dir, &tok, rule.clone());
    let verdicts: Vec<(Vec<u8>, Verdict)> = paths
        .iter()
        .map(|p| (request(p), user.classify(&request(p)).unwrap()))
        .collect();
    let good: Vec<&(Vec<u8>, Verdict)> = verdicts.iter().filter(|(_, v)| v.label == 0).collect();
    let bad: Vec<&(Vec<u8>, Verdict)> = verdicts.iter().filter(|(_, v)| v.label == 1).collect();
    println!(
        "margin {margin} (Q16), fallback {fallback}: {} good, {} bad of {}",
        good.len(),
        bad.len(),
        paths.len()
    );
    assert!(good.len() >= 3 && bad.len() >= 3);
    drop(user);

    // 2. the server, the filter on its end, the client on the other
    let server_addr = SocketAddr::from((veth.host_addr, PORT));
    let server = HttpServer::start(server_addr);
    let _installation = Installation::new(NAME);
    let f = common::filter(&dir, &tok, rule.clone())
        .install(NAME, &FilterInstall::default())
        .unwrap();
    let sock = veth.run(|| PacketSocket::open(veth.peer));
    let c = Client {
        sock,
        mac: mac(Some(veth.ns), veth.peer),
        server_mac: mac(None, veth.host),
        server: (veth.host_addr, PORT),
    };
    // the client's addresses: reached through its link, unknown to its namespace's stack
    let addr = |n: u8| Ipv4Addr::new(NET[0], NET[1], NET[2], n);
    let m = c.mac.map(|b| format!("{b:02x}")).join(":");
    for n in 10..20 {
        common::netns::ip(&[
            "neigh",
            "replace",
            &addr(n).to_string(),
            "lladdr",
            &m,
            "dev",
            veth.host,
            "nud",
            "permanent",
        ]);
    }
    let reached = |req: &[u8]| server.requests().iter().any(|r| r == req);
    // `seg`, sent again after its verdict, brings `req` whole to the server
    let served = |seg: &Segment, req: &[u8], what: &str| {
        c.send(seg);
        assert!(
            eventually(Duration::from_secs(10), || reached(req)),
            "{what}"
        );
    };
    let judged = |want: &Verdict, req: &[u8]| {
        let (excerpt, label, score) = next_verdict(&f);
        let text = qwen_bpf::filter::payload_text(&rule, req);
        assert_eq!(
            excerpt,
            text.as_bytes(),
            "judged on the bytes the server reads"
        );
        assert_eq!(
            (label, score),
            (want.label, want.score_q16),
            "kernel vs user space"
        );
    };

    // 3. a good request in four segments, the first of one byte: the last is held until the
    // verdict, and sent again reaches the server
    let (req, v) = good[0];
    let flow = c.connect((addr(10), 40_010), 1_000);
    let cut = [1, 3, 9];
    let mut off = 0;
    for &end in &cut {
        c.send(&c.seg(flow, off as u32, 0, &req[off..end]));
        off = end;
    }
    let last = c.seg(flow, off as u32, PSH, &req[off..]);
    c.send(&last);
    judged(v, req);
    served(
        &last,
        req,
        "a good request split four ways reaches the server",
    );

    // 4. a bad request as "G" and the rest: held, judged bad, its retransmission dropped
    let (req, v) = bad[0];
    let flow = c.connect((addr(11), 40_011), 2_000);
    c.send(&c.seg(flow, 0, 0, &req[..1]));
    let rest = c.seg(flow, 1, PSH, &req[1..]);
    c.send(&rest);
    judged(v, req);
    for _ in 0..3 {
        c.send(&rest);
    }
    assert!(
        eventually(Duration::from_secs(5), || f.status().unwrap().labels[1]
            .packets
            == 3),
        "the retransmissions met the verdict: {:?}",
        f.status().unwrap()
    );

    // 5. a good line inserted into a bad flow, with a bad checksum and out of the window: both
    // dropped unread; the verdict is on the bad line that follows
    let (req, v) = bad[1];
    let flow = c.connect((addr(12), 40_012), 3_000);
    c.send(&c.seg(flow, 0, 0, &req[..1]));
    let decoy = &good[1].0[1..];
    let mut forged = c.seg(flow, 1, PSH, decoy);
    forged.corrupt = true;
    c.send(&forged);
    c.send(&c.seg(flow, 1 + 4_000, PSH, decoy));
    assert!(
        eventually(Duration::from_secs(5), || {
            let s = f.status().unwrap();
            (s.tcp.bad_checksum, s.tcp.out_of_order) == (1, 1)
        }),
        "one bad checksum, one out of the window: {:?}",
        f.status().unwrap()
    );
    let rest = c.seg(flow, 1, PSH, &req[1..]);
    c.send(&rest);
    judged(v, req);
    c.send(&rest);

    // 6. a judged-good segment sent again with other bytes: dropped; the true one passes
    let (req, v) = good[2];
    let flow = c.connect((addr(13), 40_013), 4_000);
    c.send(&c.seg(flow, 0, 0, &req[..1]));
    let rest = c.seg(flow, 1, PSH, &req[1..]);
    c.send(&rest);
    judged(v, req);
    let evil = &bad[2].0;
    c.send(&c.seg(flow, 1, PSH, &evil[1..]));
    assert!(
        eventually(Duration::from_secs(5), || f.status().unwrap().tcp.mismatch
            == 1),
        "the changed retransmission is counted"
    );
    served(&rest, req, "the true retransmission reaches the server");

    // 7. a bad request in IPv4 fragments (the stack would reassemble it): dropped, counted
    let (req, _) = bad[2];
    let flow = c.connect((addr(14), 40_014), 5_000);
    let whole = c.seg(flow, 0, PSH, req);
    let frags = whole.fragments(c.mac, c.server_mac, 16);
    assert!(frags.len() >= 3);
    for fr in &frags {
        c.sock.send(fr);
    }
    assert!(
        eventually(Duration::from_secs(5), || f.status().unwrap().fragments
            == frags.len() as u64),
        "every fragment met the pending policy: {:?}",
        f.status().unwrap()
    );

    // 8. a slot flood from spoofed sources: data with no handshake takes no slot; a good flow
    // is still read, judged and served
    let before = f.status().unwrap().tcp.untracked;
    for n in 0..64u32 {
        // addresses of the test's own link: nothing outside its namespaces is ever aimed at
        let src = (addr(100 + n as u8), 50_000);
        let spoof = Flow {
            src,
            isn: n,
            srv: n,
        };
        c.send(&c.seg(spoof, 0, PSH, b"GET / HTTP/1.1\r\n"));
    }
    assert!(
        eventually(Duration::from_secs(5), || f.status().unwrap().tcp.untracked
            - before
            == 64),
        "every spoofed segment untracked: {:?}",
        f.status().unwrap()
    );
    assert_eq!(
        f.status().unwrap().slots_busy,
        0,
        "no slot taken by the flood"
    );
    let (req, v) = good[1];
    let flow = c.connect((addr(15), 40_015), 6_000);
    let whole = c.seg(flow, 0, PSH, req);
    c.send(&whole);
    judged(v, req);
    served(&whole, req, "a good flow is served after the flood");

    // no bad request reached the server; every good one sent did
    std::thread::sleep(Duration::from_secs(1));
    for (req, _) in &bad {
        assert!(
            !reached(req),
            "{:?} reached the server",
            String::from_utf8_lossy(req)
        );
    }
    let mut read = server.requests();
    read.sort();
    let mut want = vec![good[0].0.clone(), good[1].0.clone(), good[2].0.clone()];
    want.sort();
    assert_eq!(read, want, "the requests the server read");
    let s = f.status().unwrap();
    assert_eq!((s.judged, s.errors), (5, 0), "{s:?}");
    drop(f);
    InstalledFilter::remove(NAME).unwrap();
}
