//! IPv4 fragments meet the filter as their datagram's flow does (issue 31): crafted fragments run
//! through the pinned `flt_xdp` with `BPF_PROG_TEST_RUN`. A UDP rule that lets pending datagrams
//! pass (UDP's default) and drops both labels: once a flow is judged, its datagrams sent in
//! fragments are dropped, first fragment and later ones alike, counted under the label; a
//! fragmented datagram of a flow not yet judged meets the pending policy; fragments of datagrams
//! to another port pass and are not counted; a later fragment whose first was never seen meets
//! the pending policy. (TCP's fragments: tests/filter_tcp.rs.)
//!
//! Needs root and BPF arenas (in the VMs' smoke suite where the host refuses them); fails, never
//! skips, without them.

mod common;

use std::net::Ipv4Addr;
use std::time::Duration;

use common::serve::{pinned_prog, test_run, Installation};
use common::wire::{fragments, Udp};
use qwen_bpf::filter::{FilterInstall, FilterRule, InstalledFilter};
use qwen_bpf::Tokenizer;

const XDP_DROP: u32 = 1;
const XDP_PASS: u32 = 2;
const PORT: u16 = 47_361;

#[test]
fn fragments_of_a_judged_flow_get_its_verdict_and_others_the_pending_policy() {
    let dir = common::tiny_model_with_tokenizer("filter-frag");
    let tok = Tokenizer::from_file(common::tokenizer_path()).unwrap();
    let rule = FilterRule::from_json(&format!(
        r#"{{"interface": "lo", "protocol": "udp", "ports": [{PORT}], "bytes": 64,
        "template": "Is this datagram good or bad?\n{{payload}}\nAnswer:",
        "labels": [
          {{"name": "good", "text": " good", "action": "drop"}},
          {{"name": "bad", "text": " bad request", "action": "drop"}}
        ], "pending": "pass", "slots": 2}}"#
    ))
    .unwrap();
    let name = "test-filter-frag";
    let _guard = Installation::new(name);
    let f = common::filter(&dir, &tok, rule)
        .install(name, &FilterInstall::default())
        .unwrap();
    let xdp = pinned_prog(name, "flt_xdp");
    let run = |frame: &[u8]| test_run(&xdp, frame).0;
    let server = Ipv4Addr::LOCALHOST;
    let (a, b) = (Ipv4Addr::new(10, 0, 0, 1), Ipv4Addr::new(10, 0, 0, 2));
    let payload = b"a datagram long enough to be sent in several fragments, 64 bytes+";
    let frags = |src: (Ipv4Addr, u16), port: u16| {
        let u = Udp::honest(src, (server, port), payload);
        fragments([0; 6], [0; 6], (src.0, server, 17), &u.udp(), 24)
    };

    // a's flow: its first datagram, whole, meets `pending` (pass) and is judged
    let whole = Udp::honest((a, 4000), (server, PORT), payload).frame([0; 6], [0; 6]);
    assert_eq!(run(&whole), XDP_PASS, "the first datagram, pending");
    let mut record = None;
    f.follow_log(Duration::from_secs(60), |r| {
        record = Some(r);
        false
    })
    .unwrap();
    let label = record.expect("a verdict within 60 s").label;

    // the flow's datagram in fragments: each dropped under its verdict
    let judged = frags((a, 4000), PORT);
    assert!(judged.len() >= 3);
    for (i, fr) in judged.iter().enumerate() {
        assert_eq!(
            run(fr),
            XDP_DROP,
            "fragment {i} of a judged flow's datagram"
        );
    }
    // b's flow, never judged: its fragments meet `pending` (pass); another port's pass uncounted
    for fr in frags((b, 5000), PORT)
        .iter()
        .chain(&frags((a, 4000), PORT + 1))
    {
        assert_eq!(run(fr), XDP_PASS);
    }
    // a later fragment whose first was never seen (from a source not seen before)
    let orphan = &frags((Ipv4Addr::new(10, 0, 0, 3), 6000), PORT)[1];
    assert_eq!(run(orphan), XDP_PASS, "pending: pass");

    let s = f.status().unwrap();
    let n = judged.len() as u64;
    assert_eq!(s.labels[label].packets, n, "under the label: {s:?}");
    assert_eq!(s.fragments, 2 * n + 1, "a's, b's and the orphan: {s:?}");
    drop(f);
    InstalledFilter::remove(name).unwrap();
}
