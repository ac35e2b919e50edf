//! An installed model under abuse: 100,000 random and mutated datagrams (truncated headers,
//! lengths past the packet, huge `max_new`, polls for unknown ids and from another port, random
//! bytes, bit flips of valid requests, text requests with invalid UTF-8, too long or with
//! sampling past its limits), 1,000 requests among them abandoned ones and bursts past
//! the slots. Every datagram as long as a reply is answered (a shorter one never: no reply is
//! longer than what asked for it), nothing is answered to the wrong sender, no slot stays
//! stuck, the kernel's memory and BPF objects are what they were, and the server answers a
//! request correctly afterwards.
//!
//! Needs root (BPF, XDP, the BPF filesystem); fails, never skips, without it.

mod common;

use std::collections::HashSet;
use std::net::{Ipv4Addr, SocketAddr, UdpSocket};
use std::time::{Duration, Instant};

use common::serve::{
    eventually, install_in_process, reference, text_of, wire, Client, Installation, CTX,
};
use common::Rng;
use qwen_bpf::{InstallConfig, Installed, Refusal, Tokenizer};

const VOCAB: u32 = 151_936;
/// Datagrams sent before their replies are read.
const BURST: u64 = 16;
/// The shortest reply's payload (REFUSED and ACCEPTED: five words). A shorter datagram gets no
/// reply: none is longer than what asked for it.
const REPLY_MIN: usize = 20;

/// The installation's BPF objects: every program that uses its arena (map `arena`), by id, with
/// the ids of the maps each uses. (Objects of other processes come and go: not these.)
fn objects_of(arena: u32) -> Vec<(u32, Vec<u32>)> {
    use libbpf_rs::query::{ProgInfoIter, ProgInfoQueryOptions};
    let opts = ProgInfoQueryOptions::default().include_map_ids(true);
    let mut out: Vec<(u32, Vec<u32>)> = ProgInfoIter::with_query_opts(opts)
        .filter(|p| p.map_ids.contains(&arena))
        .map(|p| {
            let mut maps = p.map_ids.clone();
            maps.sort();
            (p.id, maps)
        })
        .collect();
    out.sort();
    out
}

/// Kernel memory that a leak per request would grow: unreclaimable slab, per-CPU and vmalloc
/// (the arena's pages), in KiB, from /proc/meminfo.
fn kernel_kib() -> [u64; 3] {
    let m = std::fs::read_to_string("/proc/meminfo").unwrap();
    ["SUnreclaim:", "Percpu:", "VmallocUsed:"].map(|k| {
        m.lines()
            .find(|l| l.starts_with(k))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("{k} in /proc/meminfo"))
    })
}

/// One abusive datagram: a mutation of a valid request or poll, or noise.
fn mutant(rng: &mut Rng, victim: u32) -> Vec<u8> {
    let valid = wire::request(
        rng.next() as u32 % 1000 + 10_000,
        1 + rng.next() as u32 % 8,
        &[785, 3974, 13876][..1 + rng.next() as usize % 3],
    );
    match rng.next() % 13 {
        // truncated headers, down to nothing
        0 => valid[..rng.next() as usize % 16].to_vec(),
        // n past the packet
        1 => {
            let mut d = valid.clone();
            d[12..16].copy_from_slice(&(4 + rng.next() as u32 % 1_000_000).to_le_bytes());
            d
        }
        // a huge max_new, or none
        2 => {
            let mut d = valid.clone();
            let m = [0, 9, u32::MAX, 1 << 31][rng.next() as usize % 4];
            d[8..12].copy_from_slice(&m.to_le_bytes());
            d
        }
        // token ids at and past the vocabulary
        3 => wire::request(rng.next() as u32, 4, &[VOCAB + rng.next() as u32 % 1000, 1]),
        // polls for unknown ids, for the victim's (from the wrong port), with wild offsets and
        // guessed cookies
        4 => wire::poll(rng.next() as u32, rng.next() as u32 % 64, rng.next()),
        5 => wire::poll(victim, rng.next() as u32 % 64, rng.next()),
        // a poll too short for the FINAL record
        6 => wire::words(&[wire::POLL, victim, 0]),
        // random bytes, sometimes behind a valid magic
        7 => {
            let mut d: Vec<u8> = (0..rng.next() % 64).map(|_| rng.next() as u8).collect();
            if rng.next() % 2 == 0 && d.len() >= 4 {
                d[..4].copy_from_slice(&wire::REQUEST.to_le_bytes());
            }
            d
        }
        // text requests: invalid UTF-8, too long, a huge max_new, sampling past its limits
        10 => {
            let mut t: Vec<u8> = b"hello w\xc3\xb6rld".to_vec();
            let i = rng.next() as usize % t.len();
            t[i] = [0x80, 0xc0, 0xed, 0xf5, 0xff][rng.next() as usize % 5];
            wire::text_request(rng.next() as u32, 4, 0, wire::GREEDY, &t)
        }
        11 => {
            let n = [4097, 5000, 0][rng.next() as usize % 3];
            let max_new = [1 << 31, 4][rng.next() as usize % 2];
            let temp = [101 << 16, 1, 0][rng.next() as usize % 3];
            wire::text_request(
                rng.next() as u32,
                max_new,
                0,
                [temp, 0, 0, 0, 0, 0, 0],
                &vec![b'a'; n],
            )
        }
        // bit flips of a valid text request
        12 => {
            let mut d = wire::text_request(
                rng.next() as u32 % 1000 + 20_000,
                2,
                1,
                wire::GREEDY,
                "Hi there".as_bytes(),
            );
            for _ in 0..1 + rng.next() % 3 {
                let i = rng.next() as usize % d.len();
                d[i] ^= 1 << (rng.next() % 8);
            }
            d
        }
        // bit flips of a valid request
        _ => {
            let mut d = valid.clone();
            for _ in 0..1 + rng.next() % 3 {
                let i = rng.next() as usize % d.len();
                d[i] ^= 1 << (rng.next() % 8);
            }
            d
        }
    }
}

/// One reply to flooder `which`: a reply, and about a request of its own unless a refusal.
fn check(which: usize, d: &[u8], own: &mut HashSet<(usize, u32)>, leaked: &mut Vec<(u32, u32)>) {
    assert!(d.len() >= 20, "a reply of {} bytes", d.len());
    assert_eq!(wire::word(d, 0), wire::REPLY);
    let (kind, id) = (wire::word(d, 1), wire::word(d, 2));
    match kind {
        wire::ACCEPTED => {
            own.insert((which, id));
        }
        wire::REFUSED => {}
        _ if own.contains(&(which, id)) => {}
        _ => leaked.push((kind, id)),
    }
}

#[test]
fn a_flood_of_100k_abusive_datagrams_and_1000_requests_leave_the_server_as_it_was() {
    let dir = common::tiny_model_with_tokenizer("serve");
    let tok = Tokenizer::from_model_dir(&dir).unwrap();
    let (name, port) = ("test-serve-abuse", 47_311u16);
    let _cleanup = Installation::new(name);
    let cfg = InstallConfig {
        max_new: 8,
        timeout: Duration::from_millis(300),
        rate: None, // the flood is the server's to answer or count, not the rate limiter's
        ..InstallConfig::loopback(port)
    };
    install_in_process(&dir, name, 2, CTX, &cfg);
    let installed = Installed::open(name).unwrap();
    let server: SocketAddr = (Ipv4Addr::LOCALHOST, port).into();
    let prompt = [785, 3974, 13876];
    let (ids, _) = reference(&dir, &prompt, 8, &[]);
    let want = text_of(&tok, &ids, false).into_bytes();

    // a victim with a finished request whose text the flood must never see
    let victim = Client::new("127.0.0.1:0", server);
    let (text, _) = victim.generate(7, 8, &prompt);
    assert_eq!(text, want);

    let arena = installed.status().unwrap().arena_map_id;
    let objects = objects_of(arena);
    assert!(
        objects.len() >= 2,
        "the installation's programs: {objects:?}"
    );
    let before = kernel_kib();

    // 1,000 requests: most polled to their end, every tenth abandoned, and bursts of three at
    // once for two slots
    let clients: Vec<Client> = (0..4).map(|_| Client::new("127.0.0.1:0", server)).collect();
    let (mut finished, mut busy, mut abandoned) = (0, 0, 0);
    let mut rid = 100u32;
    while rid < 1100 {
        let burst = if rid % 50 == 0 { 3 } else { 1 };
        let mut live = Vec::new();
        for c in clients.iter().take(burst) {
            let r = c.ask(&wire::request(rid, 8, &prompt));
            assert_eq!(wire::word(&r, 2), rid);
            match (wire::word(&r, 1), wire::word(&r, 3)) {
                (wire::ACCEPTED, _) => live.push((c, rid)),
                (wire::REFUSED, code) if code == Refusal::Busy.code() => busy += 1,
                other => panic!("request {rid}: {other:?}"),
            }
            rid += 1;
        }
        for (c, id) in live {
            if id % 10 == 3 {
                abandoned += 1;
                continue;
            }
            let (text, fin) = c.poll_to_end(id);
            assert_eq!(text, want, "request {id}'s text");
            assert_eq!(
                (fin[4], fin[6]),
                (2, 8),
                "request {id}: max tokens, 8 generated"
            );
            finished += 1;
        }
    }
    println!("1,000 requests: {finished} finished, {abandoned} abandoned, {busy} busy");
    assert_eq!(finished + abandoned + busy, 1000);
    assert!(
        busy > 0 && abandoned > 0,
        "bursts past the slots and abandoned requests happened"
    );

    // 100,000 abusive datagrams, from two sockets, in bursts of 16 whose replies are read before
    // the next burst goes (a reply keeps the request's buffer: 16 replies to 5 KB requests fit
    // a socket's default receive buffer, 64 did not)
    let flooders = [
        UdpSocket::bind("127.0.0.1:0").unwrap(),
        UdpSocket::bind("127.0.0.1:0").unwrap(),
    ];
    for f in &flooders {
        f.connect(server).unwrap();
        f.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
    }
    // the victim's live request, kept alive by a poll between bursts (the slot timeout is short)
    let r = victim.ask(&wire::request(8, 8, &prompt));
    assert_eq!(
        wire::word(&r, 1),
        wire::ACCEPTED,
        "the victim's live request"
    );
    let mut rng = Rng(0x5EED_AB05E);
    let (mut sent, mut answered, mut unanswered, mut leaked) = (0u64, 0u64, 0u64, Vec::new());
    let mut own: HashSet<(usize, u32)> = HashSet::new(); // (flooder, id) of accepted mutants
    let mut buf = vec![0u8; 4096];
    let mut owed = [0u64; 2];
    let start = Instant::now();
    while sent < 100_000 {
        let which = (sent / BURST % 2) as usize;
        let f = &flooders[which];
        let r = victim.ask(&victim.poll(8, 0));
        assert_eq!(
            wire::word(&r, 2),
            8,
            "the victim's poll is answered about its request"
        );
        let mut burst = Vec::new();
        for _ in 0..BURST {
            let d = mutant(&mut rng, 8);
            f.send(&d).unwrap();
            burst.push(d);
        }
        sent += BURST;
        // the replies owed to this socket (late ones from earlier bursts included): none to a
        // datagram shorter than every reply, which would make the server an amplifier
        let short = burst.iter().filter(|d| d.len() < REPLY_MIN).count() as u64;
        unanswered += short;
        owed[which] += burst.len() as u64 - short;
        while owed[which] > 0 {
            let Ok(n) = f.recv(&mut buf) else { break };
            owed[which] -= 1;
            answered += 1;
            check(which, &buf[..n], &mut own, &mut leaked);
        }
    }
    // the last late replies
    for (which, f) in flooders.iter().enumerate() {
        f.set_read_timeout(Some(Duration::from_millis(500)))
            .unwrap();
        while owed[which] > 0 {
            let Ok(n) = f.recv(&mut buf) else { break };
            owed[which] -= 1;
            answered += 1;
            check(which, &buf[..n], &mut own, &mut leaked);
        }
    }
    let secs = start.elapsed().as_secs_f64();
    println!(
        "{sent} abusive datagrams in {secs:.1} s ({:.0}/s), {answered} answered, {} accepted",
        sent as f64 / secs,
        own.len()
    );
    assert!(
        leaked.is_empty(),
        "replies about others' requests: {leaked:?}"
    );
    assert!(
        unanswered > 1_000,
        "{unanswered} datagrams shorter than a reply"
    );
    assert_eq!(
        answered + unanswered,
        sent,
        "every datagram to the port as long as a reply is answered"
    );

    // the victim's request is still its own, and whole
    let (text, fin) = victim.poll_to_end(8);
    assert_eq!(text, want, "the victim's text after the flood");
    assert_eq!(fin[4], 2);

    // no slot stays stuck: abandoned ones are given back once their clients are silent
    assert!(
        eventually(Duration::from_secs(5), || {
            let s = installed.status().unwrap();
            s.slots_busy == 0
        }),
        "a slot stayed busy: {}",
        installed.status().unwrap()
    );
    let s = installed.status().unwrap();
    println!("{s}");
    assert_eq!(s.reply_failures, 0, "{s}");
    assert_eq!(
        s.unanswered, unanswered,
        "the datagrams shorter than a reply, counted: {s}"
    );
    assert!(s.refused_for(Refusal::Malformed) > 10_000, "{s}");
    assert!(s.refused_for(Refusal::UnknownRequest) > 10_000, "{s}");
    assert!(s.refused_for(Refusal::Limit) > 1_000, "{s}");
    assert!(s.refused_for(Refusal::TokenOutOfRange) > 1_000, "{s}");
    assert!(s.refused_for(Refusal::BadUtf8) > 1_000, "{s}");
    assert!(s.reclaimed >= abandoned as u64 / 2, "{s}");

    // the kernel holds what it held: the same BPF objects, and memory within noise (other
    // processes' allocations are the noise: this runs alone in CI)
    assert_eq!(
        objects_of(arena),
        objects,
        "the installation's programs and maps, by id"
    );
    let after = kernel_kib();
    for (k, (a, b)) in ["SUnreclaim", "Percpu", "VmallocUsed"]
        .iter()
        .zip(before.iter().zip(after))
    {
        println!("{k}: {a} KiB before, {b} KiB after");
        assert!(b < a + 8 * 1024, "{k} grew from {a} to {b} KiB");
    }

    // and it still serves correctly
    let fresh = Client::new("127.0.0.1:0", server);
    let (text, _) = fresh.generate(5000, 8, &prompt);
    assert_eq!(text, want, "a request after the flood");
}
