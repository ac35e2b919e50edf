//! The installed packet filter on `lo` (generic XDP), with UDP flows and the tiny synthetic model:
//! a new flow's first datagram meets the pending policy and starts a classification; its
//! verdict (label and score) is exactly user space's for that payload, arrives in the verdict
//! log and the counters; the flow's later datagrams meet the verdict's action at once; a burst
//! of new flows past the slots meets the overflow policy, counted; other ports and sources pass
//! untouched; and misuse is refused (an interface that does not exist, a model larger than the
//! memory allowed, a name in use). These attach XDP programs: they need root.

mod common;

use std::net::UdpSocket;
use std::sync::Mutex;
use std::time::Duration;

use common::serve::{eventually, Installation};
use qwen_bpf::filter::{FilterInstall, FilterRule, InstalledFilter};
use qwen_bpf::{Error, Tokenizer};

/// One XDP program on `lo` at a time.
static LO: Mutex<()> = Mutex::new(());

fn rule(port: u16, pending: &str, overflow: &str, slots: u32) -> FilterRule {
    FilterRule::from_json(&format!(
        r#"{{"interface": "lo", "protocol": "udp", "ports": [{port}], "sources": ["127.0.0.0/8"],
        "bytes": 64, "template": "Is this datagram good or bad?\n{{payload}}\nAnswer:",
        "labels": [
          {{"name": "good", "text": " good", "action": "drop"}},
          {{"name": "bad", "text": " bad request", "action": "drop"}}
        ], "pending": "{pending}", "overflow": "{overflow}", "slots": {slots}}}"#
    ))
    .expect("a valid rule")
}

fn receiver(port: u16) -> UdpSocket {
    let s = UdpSocket::bind(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_millis(300)))
        .unwrap();
    s
}

fn got(r: &UdpSocket, want: &[u8]) -> bool {
    let mut buf = [0u8; 2048];
    loop {
        match r.recv_from(&mut buf) {
            Ok((n, _)) if &buf[..n] == want => return true,
            Ok(_) => continue,
            Err(_) => return false,
        }
    }
}

#[test]
fn a_flow_is_judged_as_user_space_judges_it_and_its_later_packets_meet_the_verdict() {
    let _lo = LO.lock().unwrap_or_else(|e| e.into_inner());
    let dir = common::tiny_model_with_tokenizer("filter-install");
    let tok = Tokenizer::from_file(common::tokenizer_path()).unwrap();
    let port = 47_311;
    let payload = b"GET /index.html?user=alice HTTP/1.1";
    // what user space says (a second model: the first goes into the kernel)
    let want = common::filter(&dir, &tok, rule(port, "pass", "drop", 1))
        .classify(payload)
        .unwrap();

    let _guard = Installation::new("test-filter-udp");
    let f = common::filter(&dir, &tok, rule(port, "pass", "drop", 1))
        .install("test-filter-udp", &FilterInstall::default())
        .unwrap();
    let rx = receiver(port);
    let tx = UdpSocket::bind("127.0.0.1:0").unwrap();
    tx.send_to(payload, ("127.0.0.1", port)).unwrap();
    assert!(
        got(&rx, payload),
        "the first datagram meets the pending policy: pass"
    );
    let mut record = None;
    f.follow_log(Duration::from_secs(20), |r| {
        record = Some(r);
        false
    })
    .unwrap();
    let r = record.expect("a verdict record within 20 s");
    assert_eq!(
        (r.label, r.score_q16),
        (want.label, want.score_q16),
        "kernel vs user space"
    );
    assert_eq!(r.source.1, tx.local_addr().unwrap().port());
    assert_eq!(r.destination.1, port);
    assert_eq!(&r.excerpt[..], &payload[..]);
    let s = f.status().unwrap();
    assert_eq!((s.started, s.judged, s.errors), (1, 1, 0));
    assert_eq!(s.labels[want.label].flows, 1);

    // both labels drop: the flow's later datagrams are dropped, counted under its label
    tx.send_to(b"anything", ("127.0.0.1", port)).unwrap();
    assert!(
        !got(&rx, b"anything"),
        "a judged flow's datagram meets its verdict"
    );
    let s = f.status().unwrap();
    assert_eq!(s.labels[want.label].packets, 1);
    assert!(s.dropped >= 1);

    // another port, or a datagram without the rule's port, passes untouched
    let other = receiver(port + 1);
    tx.send_to(b"other port", ("127.0.0.1", port + 1)).unwrap();
    assert!(got(&other, b"other port"));
    assert_eq!(
        f.status().unwrap().packets,
        s.packets,
        "not the rule's traffic"
    );

    // a burst of new flows past the one slot: the overflow policy (drop), counted
    let senders: Vec<UdpSocket> = (0..8)
        .map(|_| UdpSocket::bind("127.0.0.1:0").unwrap())
        .collect();
    for t in &senders {
        t.send_to(payload, ("127.0.0.1", port)).unwrap();
    }
    assert!(eventually(Duration::from_secs(30), || {
        let s = f.status().unwrap();
        s.slots_busy == 0 && s.started + s.overflow == 1 + 8
    }));
    let s = f.status().unwrap();
    assert!(s.overflow >= 1, "8 new flows at once for one slot: {s:?}");
    assert_eq!(s.errors, 0);

    drop(f); // its handles on the pinned maps
    InstalledFilter::remove("test-filter-udp").unwrap();
    // the kernel frees the arena once nothing refers to it (after an RCU grace period)
    assert!(
        eventually(Duration::from_secs(5), || {
            !qwen_bpf::kernel::pins::map_exists(s.arena_map_id)
        }),
        "the arena map is gone after remove"
    );
    tx.send_to(b"after remove", ("127.0.0.1", port)).unwrap();
    assert!(got(&rx, b"after remove"), "no filter after remove");
}

#[test]
fn misuse_is_refused_with_its_reason() {
    let _lo = LO.lock().unwrap_or_else(|e| e.into_inner());
    let dir = common::tiny_model_with_tokenizer("filter-install");
    let tok = Tokenizer::from_file(common::tokenizer_path()).unwrap();
    let r = rule(47_321, "pass", "pass", 1);

    let opts = FilterInstall {
        interface: Some("qbpf-no-such0".into()),
        ..Default::default()
    };
    let e = common::filter(&dir, &tok, r.clone())
        .install("test-filter-bad", &opts)
        .unwrap_err();
    assert!(e.to_string().contains("qbpf-no-such0"), "{e}");

    let opts = FilterInstall {
        max_memory: Some(1 << 20),
        ..Default::default()
    };
    let e = common::filter(&dir, &tok, r.clone())
        .install("test-filter-bad", &opts)
        .unwrap_err();
    assert!(matches!(e, Error::Resources { .. }), "{e}");

    let _guard = Installation::new("test-filter-twice");
    common::filter(&dir, &tok, r.clone())
        .install("test-filter-twice", &FilterInstall::default())
        .unwrap();
    let e = common::filter(&dir, &tok, r)
        .install("test-filter-twice", &FilterInstall::default())
        .unwrap_err();
    assert!(matches!(e, Error::AlreadyInstalled { .. }), "{e}");
    assert!(matches!(
        InstalledFilter::open("test-filter-none").unwrap_err(),
        Error::NotInstalled { .. }
    ));
}
