//! An installed model facing a spoofing sender: crafted frames run through the pinned XDP
//! program with `BPF_PROG_TEST_RUN` (the frame goes in as bytes, the program's verdict and the
//! frame it would send come back), so headers can lie as no kernel socket lets them. Shown:
//! no reply is larger than the frame that asked for it (a forged UDP or IPv4 length, a datagram
//! shorter than every reply); fragments and datagrams to other addresses or from other sources
//! pass to the stack untouched; every reply's lengths agree with its frame; every unanswered
//! datagram is counted; the server cookie is SipHash-2-4 of what it binds, and a poll without it
//! gets nothing. On a veth pair, a client writing its own frames through a packet socket meets
//! the same limits on a real link, and a flooding source leaves a second one served.
//!
//! Needs root and BPF arenas (in the VMs' smoke suite where the host refuses them); fails, never
//! skips, without them.

mod common;

use std::net::Ipv4Addr;
use std::os::fd::OwnedFd;
use std::time::Duration;

use common::serve::{install_in_process, pinned_prog, test_run, wire, Installation, CTX};
use common::wire::Udp;
use qwen_bpf::{InstallConfig, Installed, RateLimit, Refusal};

const XDP_DROP: u32 = 1;
const XDP_PASS: u32 = 2;
const XDP_TX: u32 = 3;
/// Ethernet, IPv4 without options, UDP.
const HDR: usize = 14 + 20 + 8;

/// An honest datagram from 127.0.0.1:40000 to 127.0.0.1:`dport` (lengths that agree, no
/// fragment bits, no padding), whose fields a test then forges.
fn honest(payload: &[u8], dport: u16) -> Udp<'_> {
    let lo = Ipv4Addr::LOCALHOST;
    Udp::honest((lo, 40_000), (lo, dport), payload)
}

/// The frame of `u` as loopback carries it (a zero Ethernet header).
fn lo_frame(u: &Udp) -> Vec<u8> {
    u.frame([0; 6], [0; 6])
}

/// A reply frame's own lengths agree with its size, and it is no larger than `asked`.
fn check_reply(asked: &[u8], reply: &[u8]) {
    assert!(
        reply.len() <= asked.len(),
        "a reply of {} bytes to a frame of {}",
        reply.len(),
        asked.len()
    );
    let ip_len = u16::from_be_bytes([reply[16], reply[17]]) as usize;
    let udp_len = u16::from_be_bytes([reply[38], reply[39]]) as usize;
    assert_eq!(
        (14 + ip_len, ip_len - 20),
        (reply.len(), udp_len),
        "the reply's lengths"
    );
    assert_eq!(wire::word(&reply[HDR..], 0), wire::REPLY, "the reply magic");
}

/// One installation on `lo` at a time: an interface takes one XDP program.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

#[test]
fn forged_lengths_fragments_and_short_datagrams_get_no_reply_larger_than_themselves() {
    let _serial = serial();
    let dir = common::tiny_model_with_tokenizer("netsafe");
    let (name, port) = ("test-net-safety", 47_331u16);
    let _cleanup = Installation::new(name);
    let cfg = InstallConfig {
        max_new: 2,
        timeout: Duration::from_millis(300),
        ..InstallConfig::loopback(port)
    };
    install_in_process(&dir, name, 2, CTX, &cfg);
    let installed = Installed::open(name).unwrap();
    let prog = pinned_prog(name, "ev_xdp");
    let before = installed.status().unwrap();

    // an honest request of one token (20 bytes): ACCEPTED, as long as the request
    let request = wire::request(9_001, 1, &[785]);
    let asked = lo_frame(&honest(&request, port));
    let (act, out) = test_run(&prog, &asked);
    assert_eq!(act, XDP_TX, "an honest request is answered");
    check_reply(&asked, &out);
    assert_eq!(wire::word(&out[HDR..], 1), wire::ACCEPTED);

    // its cookie: SipHash-2-4, under the installation's key, of the client's address and port,
    // the id and the slot's generation (a fresh slot's first request: 1)
    let cookie = wire::cookie(&out[HDR..]);
    let key = installed.cookie_key().unwrap();
    assert_eq!(
        cookie,
        siphash(key, Ipv4Addr::LOCALHOST, 40_000, 9_001, 1),
        "the kernel's cookie equals the standard library's SipHash-2-4"
    );
    // a poll carrying it is answered; a wrong cookie (one bit off, none) gets nothing, counted
    let good = lo_frame(&honest(&wire::poll(9_001, 0, cookie), port));
    let (act, out) = test_run(&prog, &good);
    assert_eq!(act, XDP_TX, "a poll with the request's cookie is answered");
    check_reply(&good, &out);
    assert_ne!(
        wire::word(&out[HDR..], 1),
        wire::REFUSED,
        "{:?}",
        &out[HDR..]
    );
    for wrong in [cookie ^ 1, cookie ^ 1 << 63, 0] {
        let bytes = lo_frame(&honest(&wire::poll(9_001, 0, wrong), port));
        let (act, _) = test_run(&prog, &bytes);
        assert_eq!(
            act, XDP_DROP,
            "a poll with cookie {wrong:#x} instead of {cookie:#x}"
        );
    }

    // Ethernet padding past the datagram (a 60-byte minimum on real links) is allowed
    let request = wire::request(9_002, 1, &[785]);
    let padded = lo_frame(&Udp {
        pad: 18,
        ..honest(&request, port)
    });
    let (act, out) = test_run(&prog, &padded);
    assert_eq!(act, XDP_TX, "a padded frame is served");
    check_reply(&padded, &out);

    // the amplification attempt: a 12-byte poll whose UDP header claims 1,052 bytes, in a
    // 54-byte frame; the IPv4 length forged too; a forged UDP length shorter than the datagram
    let poll = &wire::poll(9_001, 0, cookie)[..12];
    let mut unanswered = 0;
    let forged = [
        Udp {
            udp_len: 1_052,
            ..honest(poll, port)
        },
        Udp {
            udp_len: 1_052,
            ip_len: 1_072,
            ..honest(poll, port)
        },
        Udp {
            udp_len: 8 + 4,
            ..honest(&request, port)
        },
    ];
    for f in &forged {
        let bytes = lo_frame(f);
        let (act, out) = test_run(&prog, &bytes);
        assert_eq!(
            act,
            XDP_DROP,
            "UDP length {} and IPv4 length {} in a frame of {} bytes",
            f.udp_len,
            f.ip_len,
            bytes.len()
        );
        assert!(out.len() <= bytes.len());
        unanswered += 1;
    }

    // honest lengths, but shorter than every reply (20 bytes): no reply at all
    for payload in [&poll[..], &request[..16], &[][..]] {
        let bytes = lo_frame(&honest(payload, port));
        let (act, _) = test_run(&prog, &bytes);
        assert_eq!(act, XDP_DROP, "a datagram of {} bytes", payload.len());
        unanswered += 1;
    }

    // a poll padded to 32 bytes for an unknown id: REFUSED, no larger than it
    let mut poll32 = wire::poll(424_242, 0, 0);
    poll32.truncate(32);
    let bytes = lo_frame(&honest(&poll32, port));
    let (act, out) = test_run(&prog, &bytes);
    assert_eq!(act, XDP_TX);
    check_reply(&bytes, &out);
    assert_eq!(wire::word(&out[HDR..], 1), wire::REFUSED);

    // not ours: fragments (MF, or an offset), other destinations, other sources, other ports
    let not_ours = [
        (
            "a first fragment (MF)",
            Udp {
                frag: 0x2000,
                ..honest(&request, port)
            },
        ),
        (
            "a later fragment",
            Udp {
                frag: 0x0010,
                ..honest(&request, port)
            },
        ),
        (
            "to 127.0.0.2",
            Udp {
                dst: (Ipv4Addr::new(127, 0, 0, 2), port),
                ..honest(&request, port)
            },
        ),
        (
            "to a broadcast",
            Udp {
                dst: (Ipv4Addr::BROADCAST, port),
                ..honest(&request, port)
            },
        ),
        (
            "from 10.0.0.1",
            Udp {
                src: (Ipv4Addr::new(10, 0, 0, 1), 40_000),
                ..honest(&request, port)
            },
        ),
        ("to another port", honest(&request, port + 1)),
    ];
    for (what, f) in &not_ours {
        let bytes = lo_frame(f);
        let (act, out) = test_run(&prog, &bytes);
        assert_eq!(act, XDP_PASS, "{what} passes to the stack");
        assert_eq!(out, bytes, "{what} passes untouched");
    }

    let after = installed.status().unwrap();
    assert_eq!(
        after.unanswered - before.unanswered,
        unanswered,
        "every datagram left unanswered is counted: {after}"
    );
    assert_eq!(
        after.refused_for(Refusal::Malformed) - before.refused_for(Refusal::Malformed),
        3 + 3, // the forged frames, and the short ones (a poll shorter than FINAL's room too)
        "{after}"
    );
    assert_eq!(after.accepted - before.accepted, 2, "{after}");
    assert_eq!(
        after.bad_cookie - before.bad_cookie,
        3,
        "the wrong cookies: {after}"
    );
}

/// SipHash-2-4 of the 16 bytes a cookie hashes (`ev_cookie`), by the standard library's
/// `SipHasher`: the address's octets, then the port, the request id and the slot's generation as
/// little-endian u32s.
#[allow(deprecated)]
fn siphash(key: [u64; 2], addr: Ipv4Addr, port: u16, request: u32, generation: u32) -> u64 {
    use std::hash::Hasher;
    let mut h = std::hash::SipHasher::new_with_keys(key[0], key[1]);
    h.write(&addr.octets());
    h.write(&u32::from(port).to_le_bytes());
    h.write(&request.to_le_bytes());
    h.write(&generation.to_le_bytes());
    h.finish()
}

/// A request from `src`:`sport` through the pinned program: its action and reply words.
fn ask(prog: &OwnedFd, src: Ipv4Addr, sport: u16, port: u16, payload: &[u8]) -> (u32, Vec<u32>) {
    let bytes = lo_frame(&Udp {
        src: (src, sport),
        ..honest(payload, port)
    });
    let (act, out) = test_run(prog, &bytes);
    if act == XDP_TX {
        check_reply(&bytes, &out);
    }
    let words = out[HDR.min(out.len())..]
        .chunks_exact(4)
        .take(5)
        .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    (act, words)
}

/// Two tokens a request, for `sources` on `interface`: a poll timeout long enough that a
/// flooder's unpolled slot is still its own at the end, and a rate of a token each 10 s after a
/// burst of 4, so that none comes back while a test runs.
fn flood_config(interface: &str, port: u16, sources: Vec<Ipv4Addr>) -> InstallConfig {
    InstallConfig {
        max_new: 2,
        timeout: Duration::from_secs(60),
        rate: Some(RateLimit {
            per_second: 0.1,
            burst: 4,
        }),
        ..InstallConfig::on_interface(interface, port, sources)
    }
}

#[test]
fn a_source_flooding_holds_one_slot_meets_its_rate_and_leaves_the_others_served() {
    let _serial = serial();
    let dir = common::tiny_model_with_tokenizer("netsafe-flood");
    let (name, port) = ("test-net-flood", 47_341u16);
    let _cleanup = Installation::new(name);
    let (flooder, other) = (Ipv4Addr::new(10, 0, 0, 1), Ipv4Addr::LOCALHOST);
    let cfg = flood_config("lo", port, vec![other, flooder]);
    install_in_process(&dir, name, 3, CTX, &cfg);
    let installed = Installed::open(name).unwrap();
    let prog = pinned_prog(name, "ev_xdp");
    let s = installed.status().unwrap();
    assert_eq!(
        s.per_source_slots, 1,
        "two sources served: one slot each by default"
    );

    // the flooder, from 40 ports: its first request takes a slot, the next three (its burst)
    // are refused for its share, every one after is over its rate and dropped unanswered
    let request = |id: u32| wire::request(id, 2, &[785]);
    let mut replies = Vec::new();
    for i in 0..40u16 {
        replies.push(ask(
            &prog,
            flooder,
            50_000 + i,
            port,
            &request(1_000 + i as u32),
        ));
    }
    assert_eq!(replies[0].0, XDP_TX);
    assert_eq!(
        replies[0].1[1],
        wire::ACCEPTED,
        "the flooder's first request"
    );
    for (i, (act, w)) in replies[1..4].iter().enumerate() {
        assert_eq!(*act, XDP_TX);
        assert_eq!(
            (w[1], w[3]),
            (wire::REFUSED, Refusal::SourceBusy.code()),
            "the flooder's request {} while it holds its slot",
            i + 2
        );
    }
    for (i, (act, _)) in replies[4..].iter().enumerate() {
        assert_eq!(
            *act,
            XDP_DROP,
            "the flooder's request {} is over its rate",
            i + 5
        );
    }

    // the other source is served while the flooder floods: accepted, polled to its end
    let (act, w) = ask(&prog, other, 40_000, port, &request(7));
    assert_eq!((act, w[1]), (XDP_TX, wire::ACCEPTED), "the other source");
    let cookie = u64::from(w[4]) << 32 | u64::from(w[3]);
    let mut offset = 0;
    let finished = common::serve::eventually(Duration::from_secs(30), || {
        for i in 0..5u16 {
            // the flood goes on between polls
            ask(&prog, flooder, 51_000 + i, port, &request(2_000));
        }
        let (act, w) = ask(&prog, other, 40_000, port, &wire::poll(7, offset, cookie));
        assert_eq!(act, XDP_TX, "a poll of the other source");
        match w[1] {
            wire::TEXT => {
                offset += w[4];
                false
            }
            wire::FINAL => true,
            k => panic!("a poll of the other source answered {k}: {w:?}"),
        }
    });
    assert!(
        finished,
        "the other source's request ends while the flooder floods"
    );

    let s = installed.status().unwrap();
    assert_eq!(s.accepted, 2, "the flooder's one slot and the other's: {s}");
    assert_eq!(s.refused_for(Refusal::SourceBusy), 3, "{s}");
    assert!(
        s.rate_limited >= 36,
        "the flooder's requests past its burst are dropped and counted: {s}"
    );
    let shown = s.to_string();
    assert!(
        shown.contains("per source: 1 slots at most; rate 0.1 requests/s, bursts of 4"),
        "{shown}"
    );
}

/// The installed model on a real link: a client on a veth pair writes every frame itself (spoofed
/// served addresses, a forged UDP length, guessed cookies, a replay, a flood from 40 ports) and
/// every frame that comes back is checked against the frame that asked for it.
#[test]
fn on_a_veth_end_a_spoofer_gets_no_text_and_no_reply_outgrows_its_request() {
    use common::netns::{attach_xdp_pass, ifindex, Veth};
    use common::wire::{mac, PacketSocket};

    let _serial = serial();
    let dir = common::tiny_model_with_tokenizer("netsafe-veth");
    let (name, port) = ("test-net-veth", 47_351u16);
    let veth = Veth::new("qbpf-netsafe", "qbn-h", "qbn-n", [10, 208, 0]);
    // a client writes every frame itself from the namespace's end; the server's XDP_TX replies
    // come back to it (a veth end receives them only with an XDP program of its own)
    let sock = veth.run(|| {
        attach_xdp_pass(ifindex(veth.peer));
        PacketSocket::open(veth.peer)
    });
    let (me, server_mac) = (mac(Some(veth.ns), veth.peer), mac(None, veth.host));
    let server = (veth.host_addr, port);
    // two served sources, neither configured in the namespace: the flooder and a victim whose
    // address a spoofer also uses
    let (flooder, victim) = (Ipv4Addr::new(10, 208, 0, 10), Ipv4Addr::new(10, 208, 0, 11));
    let _cleanup = Installation::new(name);
    let cfg = flood_config(veth.host, port, vec![flooder, victim]);
    install_in_process(&dir, name, 3, CTX, &cfg);
    let installed = Installed::open(name).unwrap();

    // Sends `u` on the link; the reply frame to its source, if one comes within `wait`, is
    // checked to be no larger than the frame sent and its lengths to agree with its size.
    let exchange = |u: &Udp, wait: Duration| -> Option<Vec<u8>> {
        let sent = u.frame(me, server_mac);
        sock.send(&sent);
        let end = std::time::Instant::now() + wait;
        loop {
            let f = sock.recv(end.saturating_duration_since(std::time::Instant::now()))?;
            if f.len() >= HDR && f[23] == 17 && f[30..34] == u.src.0.octets()[..] {
                let dport = u16::from_be_bytes([f[36], f[37]]);
                if dport == u.src.1 {
                    check_reply(&sent, &f);
                    return Some(f[HDR..].to_vec());
                }
            }
        }
    };
    let quiet = Duration::from_millis(500);
    let answer = Duration::from_secs(10);

    // 1. a 12-byte poll whose UDP length claims 1,052 bytes: nothing comes back
    let poll12 = &wire::poll(1, 0, 0)[..12];
    let forged = Udp {
        udp_len: 1_052,
        ..Udp::honest((flooder, 40_000), server, poll12)
    };
    assert_eq!(exchange(&forged, quiet), None, "a forged UDP length");

    // 2. the victim's request: ACCEPTED with a cookie, no larger than the request
    let request = |id: u32| wire::request(id, 2, &[785]);
    let req = request(7);
    let r = exchange(&Udp::honest((victim, 41_000), server, &req), answer).expect("ACCEPTED");
    assert_eq!(wire::word(&r, 1), wire::ACCEPTED);
    let cookie = wire::cookie(&r);

    // 3. a spoofer polls the victim's request from the victim's address and port without the
    // cookie, or with a guess: no reply at all (no TEXT, no FINAL)
    for guess in [0, 1, cookie ^ 1, cookie ^ 1 << 40] {
        let p = wire::poll(7, 0, guess);
        let got = exchange(&Udp::honest((victim, 41_000), server, &p), quiet);
        assert_eq!(got, None, "a poll with cookie {guess:#x}");
    }

    // a replay of the victim's request (from its address: a reply to anyone else would be an
    // amplifier): its ACCEPTED again, with the same cookie, to the victim; no second slot
    let r = exchange(&Udp::honest((victim, 41_000), server, &req), answer).expect("a repeat");
    let again = wire::cookie(&r);
    assert_eq!((wire::word(&r, 1), again), (wire::ACCEPTED, cookie));
    assert_eq!(installed.status().unwrap().repeats, 1);

    // 4. the flooder from 40 ports: one slot, three refusals, then its rate drops it unanswered
    let mut answered = 0;
    for i in 0..40u16 {
        let req = request(100 + u32::from(i));
        let wait = if i < 4 {
            answer
        } else {
            Duration::from_millis(50)
        };
        if exchange(&Udp::honest((flooder, 50_000 + i), server, &req), wait).is_some() {
            answered += 1;
        }
    }
    assert_eq!(answered, 4, "the flooder's slot and its burst's refusals");

    // 5. the victim, with its cookie, is served to FINAL while the flooder goes on
    let mut offset = 0;
    let finished = common::serve::eventually(Duration::from_secs(60), || {
        let req = request(200);
        exchange(
            &Udp::honest((flooder, 51_000), server, &req),
            Duration::ZERO,
        );
        let p = wire::poll(7, offset, cookie);
        let r = exchange(&Udp::honest((victim, 41_000), server, &p), answer).expect("a reply");
        match wire::word(&r, 1) {
            wire::TEXT => {
                offset += wire::word(&r, 4);
                false
            }
            wire::FINAL => true,
            k => panic!("the victim's poll answered {k}: {:?}", &r[..20]),
        }
    });
    assert!(
        finished,
        "the victim's request ends while the flooder floods"
    );
    let s = installed.status().unwrap();
    assert_eq!(s.accepted, 2, "{s}");
    assert!(s.bad_cookie >= 4, "the spoofer's polls: {s}");
    assert!(s.rate_limited >= 36, "{s}");
}
