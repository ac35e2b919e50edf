//! The installed filter reading TCP flows as a spoofing or evading sender meets it (issue 31):
//! crafted segments run through the pinned `flt_xdp` (arriving) and the server's SYN-ACKs
//! through the pinned `flt_egress` (leaving) with `BPF_PROG_TEST_RUN`, so that checksums,
//! sequence numbers and flags can lie as no kernel socket lets them. Shown:
//! - data with no handshake seen (or a handshake whose ACK did not acknowledge the server's
//!   SYN-ACK, as a blind spoofer's cannot) meets the pending policy and takes no slot;
//! - a flow's bytes are read in order: a segment past the next byte is dropped, a segment with a
//!   bad checksum is dropped and not read;
//! - a 1-byte first segment is not judged alone: segments that do not complete the text pass,
//!   the one that completes it is held (dropped) until the verdict, which is user space's
//!   verdict on the whole text, integer for integer;
//! - the held segment sent again passes with the bytes judged, and is dropped with others;
//! - a segment that ends a write (PSH) before the text is whole is judged on what came; on a
//!   pass the flow reads on and is judged again on its whole text;
//! - a source holding its slots (per_source) cannot take another, while another source can;
//! - without `first_line`, a short request sent without PSH is held and judged all the same;
//! - a drop verdict drops the flow's later segments, and its segments sent in IPv4 fragments.
//!
//! Needs root and BPF arenas (in the VMs' smoke suite where the host refuses them); fails, never
//! skips, without them.

mod common;

use std::net::Ipv4Addr;
use std::os::fd::OwnedFd;
use std::time::Duration;

use common::serve::{eventually, pinned_prog, test_run, Installation};
use common::wire::{Segment, ACK, FIN, PSH, SYN};
use qwen_bpf::filter::{FilterInstall, FilterRule, InstalledFilter, VerdictRecord};
use qwen_bpf::Tokenizer;

const XDP_DROP: u32 = 1;
const XDP_PASS: u32 = 2;
const PORT: u16 = 47_331;
const SERVER: Ipv4Addr = Ipv4Addr::LOCALHOST;

fn rule(action: &str, first_line: bool) -> FilterRule {
    FilterRule::from_json(&format!(
        r#"{{"interface": "lo", "protocol": "tcp", "ports": [{PORT}], "bytes": 64,
        "first_line": {first_line}, "template": "Is this request good or bad?\n{{payload}}\nAnswer:",
        "labels": [
          {{"name": "good", "text": " good", "action": "{action}"}},
          {{"name": "bad", "text": " bad request", "action": "{action}"}}
        ], "slots": 2, "per_source": 1}}"#
    ))
    .expect("a valid rule")
}

/// An Ethernet frame (loopback's: zero addresses) carrying an IPv4 TCP segment from
/// `src`:`sport` to the server, with a correct checksum unless `corrupt`.
fn segment(
    src: Ipv4Addr,
    sport: u16,
    seq: u32,
    ack: u32,
    flags: u8,
    payload: &[u8],
    corrupt: bool,
) -> Vec<u8> {
    let s = Segment {
        src: (src, sport),
        dst: (SERVER, PORT),
        seq,
        ack,
        flags,
        payload,
        corrupt,
    };
    s.frame([0; 6], [0; 6])
}

/// The server's SYN-ACK to `client`:`cport`, leaving.
fn syn_ack(client: Ipv4Addr, cport: u16, seq: u32, ack: u32) -> Vec<u8> {
    let s = Segment {
        src: (SERVER, PORT),
        dst: (client, cport),
        seq,
        ack,
        flags: SYN | ACK,
        payload: b"",
        corrupt: false,
    };
    s.frame([0; 6], [0; 6])
}

/// Runs a pinned program once on `frame`: its return value.
fn run(prog: &OwnedFd, frame: &[u8]) -> u32 {
    test_run(prog, frame).0
}

/// The installed filter's programs and one client flow's sequence numbers.
struct Wire {
    xdp: OwnedFd,
    egress: OwnedFd,
}

impl Wire {
    /// The three steps of a handshake from `src`:`sport` (client ISN `isn`, server's `srv`): the
    /// flow is read from `isn + 1`.
    fn handshake(&self, src: Ipv4Addr, sport: u16, isn: u32, srv: u32) {
        assert_eq!(
            run(&self.xdp, &segment(src, sport, isn, 0, SYN, b"", false)),
            XDP_PASS,
            "a SYN"
        );
        assert_eq!(
            run(&self.egress, &syn_ack(src, sport, srv, isn + 1)),
            0,
            "the SYN-ACK leaves"
        );
        let ack = segment(src, sport, isn + 1, srv + 1, ACK, b"", false);
        assert_eq!(run(&self.xdp, &ack), XDP_PASS, "the handshake's ACK");
    }

    fn data(
        &self,
        src: Ipv4Addr,
        sport: u16,
        seq: u32,
        srv: u32,
        flags: u8,
        payload: &[u8],
    ) -> u32 {
        run(
            &self.xdp,
            &segment(src, sport, seq, srv + 1, ACK | flags, payload, false),
        )
    }
}

/// The next verdict record of `f` (within 60 s: TCG is slow).
fn next_verdict(f: &InstalledFilter) -> VerdictRecord {
    let mut record = None;
    f.follow_log(Duration::from_secs(60), |r| {
        record = Some(r);
        false
    })
    .unwrap();
    record.expect("a verdict record within 60 s")
}

#[test]
fn tcp_flows_are_read_from_the_handshake_judged_whole_and_held_until_judged() {
    let dir = common::tiny_model_with_tokenizer("filter-tcp");
    let tok = Tokenizer::from_file(common::tokenizer_path()).unwrap();
    let mut user = common::filter(&dir, &tok, rule("count", true));
    let name = "test-filter-tcp";
    let _lock = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let _guard = Installation::new(name);
    let f = common::filter(&dir, &tok, rule("count", true))
        .install(name, &FilterInstall::default())
        .unwrap();
    let w = Wire {
        xdp: pinned_prog(name, "flt_xdp"),
        egress: pinned_prog(name, "flt_egress"),
    };
    let (a, b, c) = (
        Ipv4Addr::new(10, 0, 0, 1),
        Ipv4Addr::new(10, 0, 0, 2),
        Ipv4Addr::new(10, 0, 0, 3),
    );

    // 1. data on a flow whose handshake was not seen: the pending policy (drop for TCP), no slot
    let request = b"GET /index.html HTTP/1.1\r\nHost: x\r\n\r\n";
    assert_eq!(
        w.data(a, 1000, 1, 1, PSH, request),
        XDP_DROP,
        "no handshake"
    );
    // a blind spoofer: SYN, the server answers someone else, the third ACK guesses wrong
    assert_eq!(
        run(&w.xdp, &segment(c, 1001, 500, 0, SYN, b"", false)),
        XDP_PASS
    );
    assert_eq!(run(&w.egress, &syn_ack(c, 1001, 7_000, 501)), 0);
    assert_eq!(
        w.data(c, 1001, 501, 4_241, PSH, request),
        XDP_DROP,
        "a guessed ACK"
    );
    // data in a SYN (TCP Fast Open) would reach the server unread
    assert_eq!(
        run(
            &w.xdp,
            &segment(c, 1002, 900, 0, SYN, b"GET / HTTP/1.1\r\n", false)
        ),
        XDP_DROP
    );
    let s = f.status().unwrap();
    assert_eq!(
        (s.tcp.untracked, s.started, s.slots_busy),
        (3, 0, 0),
        "{s:?}"
    );

    // 2. a real handshake, then a 1-byte first segment: read, not judged alone
    let (isn, srv) = (1_000u32, 90_000u32);
    w.handshake(a, 2000, isn, srv);
    let mut seq = isn + 1;
    assert_eq!(
        w.data(a, 2000, seq, srv, 0, b"G"),
        XDP_PASS,
        "an incomplete text passes"
    );
    seq += 1;
    assert_eq!(
        f.status().unwrap().slots_busy,
        1,
        "the flow's text holds a slot"
    );
    // past the next byte: dropped (TCP sends it again in order)
    assert_eq!(
        w.data(a, 2000, seq + 2, srv, 0, b"T /"),
        XDP_DROP,
        "out of order"
    );
    // a bad checksum: dropped and never read (the stack would drop it too)
    let bad = segment(a, 2000, seq, srv + 1, ACK, b"ET /evil HTTP/1.1\r\n", true);
    assert_eq!(run(&w.xdp, &bad), XDP_DROP, "a bad checksum");
    assert_eq!(w.data(a, 2000, seq, srv, 0, b"ET /index.html"), XDP_PASS);
    seq += 14;
    let s = f.status().unwrap();
    assert_eq!(
        (s.tcp.out_of_order, s.tcp.bad_checksum, s.started),
        (1, 1, 0),
        "{s:?}"
    );

    // 3. per source: a holds its one slot, so its second flow meets the overflow policy;
    //    another source still gets a slot
    w.handshake(a, 2001, 40, 41);
    assert_eq!(
        w.data(a, 2001, 41, 41, 0, b"X"),
        XDP_DROP,
        "a's second flow"
    );
    assert_eq!(f.status().unwrap().tcp.source_busy, 1);
    w.handshake(b, 3000, 60, 61);
    assert_eq!(
        w.data(b, 3000, 61, 61, 0, b"Y"),
        XDP_PASS,
        "b gets the other slot"
    );
    assert_eq!(f.status().unwrap().slots_busy, 2);

    // 4. the segment that ends the line completes the text: held (dropped) until the verdict
    let rest = b" HTTP/1.1\r\nHost: x\r\n\r\n";
    assert_eq!(
        w.data(a, 2000, seq, srv, 0, rest),
        XDP_DROP,
        "the completing segment is held"
    );
    assert_eq!(
        w.data(a, 2000, seq, srv, 0, rest),
        XDP_DROP,
        "held while pending"
    );
    let want = user
        .classify(b"GET /index.html HTTP/1.1\r\nHost: x\r\n")
        .unwrap();
    let r = next_verdict(&f);
    assert_eq!(
        (r.label, r.score_q16),
        (want.label, want.score_q16),
        "kernel vs user space"
    );
    assert_eq!(
        &r.excerpt[..],
        b"GET /index.html HTTP/1.1",
        "judged on the whole line"
    );
    assert_eq!((r.source.0, r.source.1), (a, 2000));

    // 5. sent again: with the bytes judged it passes, with others it is dropped
    let mut other = rest.to_vec();
    other[2] = b'X';
    assert!(eventually(Duration::from_secs(5), || w
        .data(a, 2000, seq, srv, 0, rest)
        == XDP_PASS));
    assert_eq!(
        w.data(a, 2000, seq, srv, 0, &other),
        XDP_DROP,
        "other bytes than judged"
    );
    assert_eq!(f.status().unwrap().tcp.mismatch, 1);
    // the text is whole: later bytes (keep-alive) pass under the verdict, unread
    let later = seq + rest.len() as u32;
    assert_eq!(
        w.data(a, 2000, later, srv, PSH, b"GET /next HTTP/1.1\r\n"),
        XDP_PASS
    );
    assert_eq!(w.data(a, 2000, later, srv, FIN, b""), XDP_PASS);

    // 6. a write that ends (PSH) before the line does: judged on what came, read on after a pass
    w.handshake(c, 4000, 7, 8);
    assert_eq!(
        w.data(c, 4000, 8, 8, PSH, b"GET /a"),
        XDP_DROP,
        "held at the end of a write"
    );
    let first = next_verdict(&f);
    assert_eq!(&first.excerpt[..], b"GET /a");
    let want = user.classify(b"GET /a").unwrap();
    assert_eq!((first.label, first.score_q16), (want.label, want.score_q16));
    assert!(eventually(Duration::from_secs(5), || w
        .data(c, 4000, 8, 8, PSH, b"GET /a")
        == XDP_PASS));
    assert_eq!(
        w.data(c, 4000, 14, 8, PSH, b" HTTP/1.0\r\n"),
        XDP_DROP,
        "held: the line ends"
    );
    let second = next_verdict(&f);
    assert_eq!(
        &second.excerpt[..],
        b"GET /a HTTP/1.0",
        "judged again on the whole text"
    );
    let want = user.classify(b"GET /a HTTP/1.0\r\n").unwrap();
    assert_eq!(
        (second.label, second.score_q16),
        (want.label, want.score_q16)
    );

    let s = f.status().unwrap();
    assert_eq!((s.judged, s.errors), (3, 0), "{s:?}");
    drop(f);
    InstalledFilter::remove(name).unwrap();
}

/// Without `first_line`, a short request sent without PSH (as a raw sender may) is held and
/// judged all the same; its drop verdict then drops the flow and its retransmissions.
#[test]
fn a_drop_verdict_drops_the_flow_and_its_retransmissions() {
    let dir = common::tiny_model_with_tokenizer("filter-tcp");
    let tok = Tokenizer::from_file(common::tokenizer_path()).unwrap();
    let name = "test-filter-tcp-drop";
    let _lock = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let _guard = Installation::new(name);
    let mut user = common::filter(&dir, &tok, rule("drop", false));
    let f = common::filter(&dir, &tok, rule("drop", false))
        .install(name, &FilterInstall::default())
        .unwrap();
    let w = Wire {
        xdp: pinned_prog(name, "flt_xdp"),
        egress: pinned_prog(name, "flt_egress"),
    };
    let a = Ipv4Addr::new(10, 0, 0, 9);
    w.handshake(a, 5000, 1, 2);
    let line = b"GET /evil HTTP/1.1\r\n";
    assert_eq!(
        w.data(a, 5000, 2, 2, 0, line),
        XDP_DROP,
        "held, though short of `bytes` and without PSH"
    );
    let r = next_verdict(&f);
    assert_eq!(&r.excerpt[..], line, "judged on the whole request");
    let want = user.classify(line).unwrap();
    assert_eq!((r.label, r.score_q16), (want.label, want.score_q16));
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(
        w.data(a, 5000, 2, 2, 0, line),
        XDP_DROP,
        "the retransmission meets the verdict"
    );
    assert_eq!(
        w.data(a, 5000, 2 + line.len() as u32, 2, FIN, b""),
        XDP_DROP
    );
    // the flow's request in IPv4 fragments: the first carries the ports and meets the flow's
    // drop verdict, the later ones the same; a later fragment whose first was never seen meets
    // `pending` (drop); fragments to another port pass
    let seg = |dport: u16, src: (Ipv4Addr, u16)| Segment {
        src,
        dst: (SERVER, dport),
        seq: 2,
        ack: 3,
        flags: ACK | PSH,
        payload: line,
        corrupt: false,
    };
    let frags = seg(PORT, (a, 5000)).fragments([0; 6], [0; 6], 16);
    for fr in &frags {
        assert_eq!(
            run(&w.xdp, fr),
            XDP_DROP,
            "a fragment of a flow judged drop"
        );
    }
    let orphan = &seg(PORT, (Ipv4Addr::new(10, 0, 0, 10), 5001)).fragments([0; 6], [0; 6], 16)[1];
    assert_eq!(
        run(&w.xdp, orphan),
        XDP_DROP,
        "a fragment without its first"
    );
    for fr in seg(PORT + 1, (a, 5000)).fragments([0; 6], [0; 6], 16) {
        assert_eq!(run(&w.xdp, &fr), XDP_PASS, "another port's fragment");
    }
    let s = f.status().unwrap();
    assert_eq!(s.fragments, frags.len() as u64 + 1, "{s:?}");
    assert_eq!(s.labels[r.label].packets, 2 + frags.len() as u64, "{s:?}");
    assert_eq!(s.slots_busy, 0, "a final verdict frees the slot");
    drop(f);
    InstalledFilter::remove(name).unwrap();
}

/// One XDP program on `lo` at a time.
static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
