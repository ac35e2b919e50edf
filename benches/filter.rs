//! The packet filter's costs (issue 25), in one run, so that they are read as ratios:
//!
//! * `verdict`: the time to a flow's verdict, by the payload's length (16, 64 and 256 bytes of
//!   text) and by model: in the kernel (`Filter::classify_in_kernel`: the `filter_classify`
//!   program, the steps the XDP filter's worker runs: the text cut and tokenized in BPF, fed
//!   after the prefix's KV, every label scored) and in user space (`Filter::classify`, the same
//!   integers: checked before timing). Both on one thread, as one classification slot runs.
//!   Models: the tests' tiny synthetic one, the default synthetic Qwen3-0.6B
//!   (`qwen_bpf::ensure_default_model`), and the directory in `$QWEN_BPF_FILTER_MODEL` if set
//!   (a Hugging Face Qwen3 directory, or `train_filter`'s output directory: its `model/`),
//!   named `given`. The rule is the spec's (an HTTP request, benign or malicious), reading up
//!   to 256 bytes of the whole payload.
//! * `fast_path`: the cost per packet of flows with a verdict. 64-byte UDP datagrams are sent
//!   from a network namespace through a veth pair to a UDP receiver, and timed from the first
//!   sent to the last received, on three identical pairs at once: (a) with no XDP program;
//!   (b) with a program that passes every frame, attached natively (a veth end with an XDP
//!   program receives through its own NAPI: the filter's baseline); (c) with the filter
//!   installed natively, to a port its rule does not match (its early exit) and to a flow of its
//!   rule that has a verdict (one datagram judged first: the model does not run again, which is
//!   checked). Criterion times each row; the table's medians come from short rounds in which
//!   the rows take turns, so that the machine's load moves them alike, and each row's difference
//!   to the passing program is the median of the rounds' differences, printed with their middle
//!   half: on a shared machine that spread is far wider than the program's own time, which the
//!   next line measures. Then the program alone, by the
//!   kernel's clock (`BPF_PROG_TEST_RUN` on the pinned `flt_xdp`, a million runs of the judged
//!   flow's frame and of another port's), and `installed`: the time from a packet to its flow's
//!   verdict as the installed filter logs it (XDP, the BPF workqueue, the classification), for
//!   new flows of each payload length on the tiny model.
//!
//! A table of medians ends the run. Needs root (BPF, XDP, network namespaces).
//!
//! ```text
//! cargo bench --bench filter                    # both groups
//! cargo bench --bench filter -- fast_path       # one group
//! cargo bench --bench filter -- verdict/tiny    # one model (tiny, 0.6b, given)
//! QWEN_BPF_FILTER_MODEL=DIR cargo bench --bench filter -- verdict/given
//! ```

#[path = "../tests/common/netns.rs"]
mod netns;

use std::collections::BTreeMap;
use std::net::{SocketAddr, UdpSocket};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use qwen_bpf::filter::{Filter, FilterInstall, FilterRule, InstalledFilter};
use qwen_bpf::hf::synth::{self, Preset, SynthOptions};
use qwen_bpf::{Checkpoint, Model, ModelOptions, Tokenizer, XdpMode};

/// Payload lengths of the `verdict` group, in bytes of text.
const LENGTHS: [usize; 3] = [16, 64, 256];
/// Text the payloads are cut from: an HTTP request head (ASCII, one byte a character).
const REQUEST: &str = "GET /api/v2/search?q=lighthouse+keeper&page=3&sort=date HTTP/1.1\r\n\
Host: shop.example.org\r\nUser-Agent: Mozilla/5.0 (X11; Linux x86_64; rv:128.0) Gecko/20100101 \
Firefox/128.0\r\nAccept: text/html,application/xhtml+xml\r\nAccept-Language: en-US,en;q=0.5\r\n\
Referer: https://shop.example.org/index.html\r\nCookie: session=6f1c2a9e0b7d4e3f8a5c\r\n\r\n";
/// The spec's template and labels.
const TEMPLATE: &str = "<|im_start|>system\nIs this HTTP request benign or malicious?<|im_end|>\n\
<|im_start|>user\n{payload}<|im_end|>\n<|im_start|>assistant\n";
/// The port of the flood's rule and one it does not match.
const PORT: u16 = 47_391;
const OTHER_PORT: u16 = 47_392;
const NAME: &str = "bench-filter";
/// Bytes of each flood datagram.
const DATAGRAM: usize = 64;

/// Times recorded while the groups run (row → one time per measurement, each per flow or per
/// packet), printed as the table: their medians.
static TIMES: Mutex<BTreeMap<String, Vec<Duration>>> = Mutex::new(BTreeMap::new());

/// Records a measurement of `row`: `count` flows or packets in `total`.
fn record(row: &str, total: Duration, count: u64) {
    let per = total.div_f64(count.max(1) as f64);
    TIMES
        .lock()
        .unwrap()
        .entry(row.to_string())
        .or_default()
        .push(per);
}

/// The median of `row`'s measurements.
fn median(row: &str) -> Option<Duration> {
    let t = TIMES.lock().unwrap();
    let mut v = t.get(row)?.clone();
    v.sort();
    v.get(v.len() / 2).copied()
}

/// Whether criterion's name filter (the first free command-line argument, if any) may select
/// benchmarks of `group`: the group's setup (loading models) is skipped otherwise.
fn selected(group: &str) -> bool {
    match std::env::args().skip(1).find(|a| !a.starts_with('-')) {
        Some(f) => group.contains(f.as_str()) || f.starts_with(group),
        None => true,
    }
}

/// The Qwen3 tokenizer beside the source tree.
fn tokenizer_path() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/qwen3-tokenizer/tokenizer.json")
}

/// The tests' tiny synthetic model (with the Qwen3 tokenizer), written once.
fn tiny_model() -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("models/filter-bench-tiny");
    if Checkpoint::open(&dir).is_err() || !dir.join("tokenizer.json").is_file() {
        let opts = SynthOptions {
            tokenizer: Some(tokenizer_path()),
            ..Default::default()
        };
        synth::write_checkpoint(&dir, &Preset::Tiny.config(), &opts).expect("the tiny model");
    }
    dir
}

/// The models timed: (name, directory); only the one named `only` if given.
fn models(only: Option<&str>) -> Vec<(String, PathBuf)> {
    let wanted = |name: &str| only.is_none_or(|o| o == name);
    let mut m = Vec::new();
    if wanted("tiny") {
        m.push(("tiny".to_string(), tiny_model()));
    }
    if wanted("0.6b") {
        let dir = qwen_bpf::ensure_default_model(None, true).expect("the default model");
        m.push(("0.6b".to_string(), dir));
    }
    if let Some(dir) = std::env::var_os("QWEN_BPF_FILTER_MODEL").filter(|d| !d.is_empty()) {
        let dir = PathBuf::from(dir);
        let model = if dir.join("model/config.json").is_file() {
            dir.join("model")
        } else {
            dir
        };
        if wanted("given") {
            m.push(("given".to_string(), model));
        }
    }
    m
}

/// The spec's rule, on `protocol` and `port`, reading up to 256 bytes of the whole payload.
fn rule(protocol: &str, port: u16, labels: [&str; 2], sources: &str) -> FilterRule {
    let json = serde_json::json!({
        "interface": "lo", "protocol": protocol, "ports": [port], "sources": [sources],
        "bytes": 256, "first_line": false, "template": TEMPLATE,
        "labels": [
            {"name": "benign", "text": "benign", "action": labels[0]},
            {"name": "malicious", "text": "malicious", "action": labels[1]},
        ],
        "pending": "pass", "overflow": "pass", "slots": 2,
    });
    FilterRule::from_json(&json.to_string()).expect("the bench's rule")
}

/// A filter of `rule` on the model in `dir`: one thread, the rule's slots, the kernel
/// tokenizer loaded (what `classify_in_kernel` and `install` need).
fn open_filter(dir: &Path, rule: FilterRule) -> Filter {
    let tok = Tokenizer::from_model_dir(dir)
        .or_else(|_| Tokenizer::from_file(tokenizer_path()))
        .expect("a tokenizer: the model's or ../shared/qwen3-tokenizer/tokenizer.json");
    let ctx = rule
        .compile(&tok)
        .expect("compiling the rule")
        .context_needed();
    let opts = ModelOptions {
        threads: 1,
        max_context: ctx,
        event_slots: rule.slots as usize,
        progress: true,
        ..Default::default()
    };
    let mut m = Model::open(dir, &opts).expect("opening the model");
    m.load_tokenizer(&tok)
        .expect("the kernel tokenizer's tables");
    Filter::new(m, &tok, rule).expect("the filter")
}

fn verdict(c: &mut Criterion) {
    if !selected("verdict") {
        return;
    }
    let mut g = c.benchmark_group("verdict");
    g.sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(3));
    // `verdict/MODEL` opens that model only
    let only = std::env::args()
        .skip(1)
        .find(|a| !a.starts_with('-'))
        .and_then(|f| {
            f.strip_prefix("verdict/")
                .map(|m| m.split('/').next().unwrap().to_string())
        });
    for (name, dir) in models(only.as_deref()) {
        let mut f = open_filter(&dir, rule("tcp", 80, ["pass", "drop"], "0.0.0.0/0"));
        for len in LENGTHS {
            let payload = &REQUEST.as_bytes()[..len];
            // the two paths agree before they are timed
            let (user, kernel) = (f.classify(payload), f.classify_in_kernel(payload));
            assert_eq!(user.unwrap(), kernel.unwrap(), "{name}, {len} bytes");
            for (path, kernel) in [("kernel", true), ("user", false)] {
                let row = format!("{name} {len:>3} B {path}");
                g.bench_function(BenchmarkId::new(format!("{name}/{path}"), len), |b| {
                    b.iter_custom(|iters| {
                        let t0 = Instant::now();
                        for _ in 0..iters {
                            let v = if kernel {
                                f.classify_in_kernel(payload)
                            } else {
                                f.classify(payload)
                            };
                            std::hint::black_box(v.expect("classify"));
                        }
                        let t = t0.elapsed();
                        record(&row, t, iters);
                        t
                    })
                });
            }
        }
    }
    g.finish();
}

/// A UDP receiver on `addr` counting datagrams until dropped.
struct Receiver {
    count: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Receiver {
    fn new(addr: SocketAddr) -> Receiver {
        let sock = UdpSocket::bind(addr).expect("binding the receiver");
        set_buffer(&sock, libc::SO_RCVBUFFORCE);
        sock.set_read_timeout(Some(Duration::from_millis(50)))
            .unwrap();
        let count = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (c, s) = (count.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            let mut buf = [0u8; 2048];
            while !s.load(Ordering::Relaxed) {
                if sock.recv(&mut buf).is_ok() {
                    c.fetch_add(1, Ordering::Relaxed);
                }
            }
        });
        Receiver {
            count,
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// An 8 MiB socket buffer (`opt`: SO_RCVBUFFORCE or SO_SNDBUFFORCE; root needs no rmem_max).
fn set_buffer(sock: &UdpSocket, opt: libc::c_int) {
    use std::os::fd::AsRawFd;
    let n: libc::c_int = 8 << 20;
    // SAFETY: a valid socket and a c_int option value of its size.
    let rc = unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            opt,
            (&n as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    assert_eq!(rc, 0, "setsockopt: {}", std::io::Error::last_os_error());
}

/// Sends `n` datagrams on `sock` and waits for `rx` to count them (or to stop counting for
/// 20 ms): the time from the first sent to the last received, scaled to `n` delivered, and the
/// number delivered.
fn flood(sock: &UdpSocket, rx: &Receiver, n: u64) -> (Duration, u64) {
    let d = [b'x'; DATAGRAM];
    let before = rx.count.load(Ordering::Relaxed);
    let t0 = Instant::now();
    for _ in 0..n {
        let _ = sock.send(&d); // a full queue drops it: counted as not delivered
    }
    let mut last = (before, Instant::now());
    loop {
        let c = rx.count.load(Ordering::Relaxed);
        if c >= before + n {
            last = (c, Instant::now());
            break;
        }
        if c != last.0 {
            last = (c, Instant::now());
        } else if last.1.elapsed() > Duration::from_millis(20) {
            break;
        }
        std::thread::sleep(Duration::from_micros(100));
    }
    let delivered = (last.0 - before).max(1);
    (
        (last.1 - t0).mul_f64(n as f64 / delivered as f64),
        delivered,
    )
}

/// A frame from `src` to `dst` (Ethernet, IPv4, UDP) carrying `DATAGRAM` bytes.
fn udp_frame(src: SocketAddr, dst: SocketAddr) -> Vec<u8> {
    let (SocketAddr::V4(s), SocketAddr::V4(d)) = (src, dst) else {
        panic!("IPv4 addresses")
    };
    let len = 20 + 8 + DATAGRAM;
    let mut f = vec![0u8; 14 + len];
    f[..12].copy_from_slice(&[2, 0, 0, 0, 0, 1, 2, 0, 0, 0, 0, 2]);
    f[12..14].copy_from_slice(&[0x08, 0x00]);
    let ip = &mut f[14..34];
    ip[0] = 0x45;
    ip[2..4].copy_from_slice(&(len as u16).to_be_bytes());
    ip[8] = 64;
    ip[9] = 17;
    ip[12..16].copy_from_slice(&s.ip().octets());
    ip[16..20].copy_from_slice(&d.ip().octets());
    let sum: u32 = ip
        .chunks(2)
        .map(|w| u16::from_be_bytes([w[0], w[1]]) as u32)
        .sum();
    let sum = (sum & 0xffff) + (sum >> 16);
    ip[10..12].copy_from_slice(&(!((sum & 0xffff) + (sum >> 16)) as u16).to_be_bytes());
    let udp = &mut f[34..42];
    udp[0..2].copy_from_slice(&s.port().to_be_bytes());
    udp[2..4].copy_from_slice(&d.port().to_be_bytes());
    udp[4..6].copy_from_slice(&((8 + DATAGRAM) as u16).to_be_bytes());
    f[42..].fill(b'x');
    f
}

/// The installed filter's XDP program run on `frame` by `BPF_PROG_TEST_RUN`, `repeat` times,
/// as if it arrived on `ifindex`: its verdict (XDP_*) and the kernel's mean time per run.
fn program_run(frame: &[u8], ifindex: u32, repeat: i32) -> (u32, Duration) {
    use libbpf_rs::libbpf_sys;
    use std::os::fd::{FromRawFd, OwnedFd};
    let pin = std::ffi::CString::new(format!("/sys/fs/bpf/qwen_bpf/{NAME}/flt_xdp")).unwrap();
    // SAFETY: a NUL-terminated path; a non-negative result is an fd we own.
    let fd = unsafe { libbpf_sys::bpf_obj_get(pin.as_ptr()) };
    assert!(fd >= 0, "{pin:?}: {}", std::io::Error::last_os_error());
    // SAFETY: the fd bpf_obj_get returned, owned here only.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let ctx = libbpf_sys::xdp_md {
        data_end: frame.len() as u32,
        ingress_ifindex: ifindex,
        ..Default::default()
    };
    let mut opts = libbpf_sys::bpf_test_run_opts {
        sz: std::mem::size_of::<libbpf_sys::bpf_test_run_opts>() as _,
        data_in: frame.as_ptr().cast(),
        data_size_in: frame.len() as u32,
        ctx_in: (&ctx as *const libbpf_sys::xdp_md).cast(),
        ctx_size_in: std::mem::size_of::<libbpf_sys::xdp_md>() as u32,
        repeat,
        ..Default::default()
    };
    // SAFETY: the options point at the frame and the context, alive for the call.
    let rc = unsafe {
        libbpf_sys::bpf_prog_test_run_opts(std::os::fd::AsRawFd::as_raw_fd(&fd), &mut opts)
    };
    assert_eq!(
        rc,
        0,
        "BPF_PROG_TEST_RUN: {}",
        std::io::Error::last_os_error()
    );
    (opts.retval, Duration::from_nanos(opts.duration as u64))
}

/// Datagrams delivered and sent per flood row, for the table.
static DELIVERED: Mutex<BTreeMap<String, (u64, u64)>> = Mutex::new(BTreeMap::new());

/// A program that passes every frame (`r0 = XDP_PASS; exit`) attached natively to `ifindex`
/// until dropped: the veth end's XDP receive path without the filter.
struct XdpPass(i32);

impl XdpPass {
    fn attach(ifindex: u32) -> XdpPass {
        netns::attach_xdp_pass(ifindex as i32);
        XdpPass(ifindex as i32)
    }
}

impl Drop for XdpPass {
    fn drop(&mut self) {
        // SAFETY: detaches whatever native program the device has (ours).
        unsafe {
            libbpf_rs::libbpf_sys::bpf_xdp_detach(
                self.0,
                libbpf_rs::libbpf_sys::XDP_FLAGS_DRV_MODE,
                std::ptr::null(),
            )
        };
    }
}

/// Removes the filter `NAME` when made (one left by a killed run) and when dropped.
struct Installation;

impl Installation {
    fn new() -> Installation {
        let _ = InstalledFilter::remove(NAME);
        Installation
    }
}

impl Drop for Installation {
    fn drop(&mut self) {
        let _ = InstalledFilter::remove(NAME);
    }
}

/// The fast path's rows: (name, veth pair, destination port).
const ROWS: [(&str, usize, u16); 4] = [
    ("no XDP", 0, PORT),
    ("XDP_PASS program", 1, PORT),
    ("filter, another port", 2, OTHER_PORT),
    ("filter, flow with a verdict", 2, PORT),
];
/// The veth pairs: (namespace, host end, peer end, subnet); the filter goes on the third.
const PAIRS: [(&str, &str, &str, [u8; 3]); 3] = [
    ("qbpf-fbench0", "qbb-h0", "qbb-n0", [10, 206, 0]),
    ("qbpf-fbench1", "qbb-h1", "qbb-n1", [10, 206, 1]),
    ("qbpf-fbench2", "qbb-h2", "qbb-n2", [10, 206, 2]),
];
/// Interleaved rounds of the table, and datagrams per row and round.
const ROUNDS: usize = 200;
const ROUND_PACKETS: u64 = 5_000;

fn ifindex(dev: &str) -> u32 {
    let name = std::ffi::CString::new(dev).unwrap();
    // SAFETY: a NUL-terminated interface name.
    unsafe { libc::if_nametoindex(name.as_ptr()) }
}

fn fast_path(c: &mut Criterion) {
    if !selected("fast_path") {
        return;
    }
    // three identical veth pairs at once, so that the rows can take turns: none, a pass
    // program, the filter (a veth end with a native XDP program receives through its own NAPI:
    // the filter's baseline is that path with a program that passes everything)
    let pairs: Vec<netns::Veth> = PAIRS
        .iter()
        .map(|&(ns, host, peer, net)| netns::Veth::new(ns, host, peer, net))
        .collect();
    let _pass = XdpPass::attach(ifindex(PAIRS[1].1));
    assert!(
        netns::native_xdp(PAIRS[1].1),
        "the pass program attached natively"
    );
    let flows: Vec<(UdpSocket, Receiver)> = ROWS
        .iter()
        .map(|&(_, pair, port)| {
            let v = &pairs[pair];
            let to = SocketAddr::from((v.host_addr, port));
            // made in the namespace: a socket stays in its namespace
            let sock = v.run(|| {
                let s = UdpSocket::bind((v.peer_addr, 0)).unwrap();
                set_buffer(&s, libc::SO_SNDBUFFORCE);
                s.connect(to).unwrap();
                s
            });
            (sock, Receiver::new(to))
        })
        .collect();

    // the filter on the third pair's receiving end: a UDP rule on PORT from its peer, both
    // labels passing; its flow judged once
    let _installation = Installation::new();
    let filtered = &pairs[2];
    let source = filtered.peer_addr.to_string();
    let f = open_filter(&tiny_model(), rule("udp", PORT, ["pass", "count"], &source));
    let opts = FilterInstall {
        interface: Some(filtered.host.into()),
        xdp_mode: XdpMode::Native,
        ..Default::default()
    };
    let installed = f.install(NAME, &opts).expect("installing the filter");
    assert!(netns::native_xdp(filtered.host), "attached in native mode");
    let judged_sock = &flows[3].0;
    judged_sock.send(&[b'x'; DATAGRAM]).unwrap();
    let end = Instant::now() + Duration::from_secs(60);
    while installed.status().unwrap().judged < 1 {
        assert!(Instant::now() < end, "no verdict in 60 s");
        std::thread::sleep(Duration::from_millis(10));
    }
    let label_packets =
        |s: &qwen_bpf::filter::FilterStatus| s.labels.iter().map(|l| l.packets).sum::<u64>();
    let before = installed.status().unwrap();

    let mut g = c.benchmark_group("fast_path");
    g.sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
        .throughput(Throughput::Elements(1));
    for (&(row, ..), (sock, rx)) in ROWS.iter().zip(&flows) {
        g.bench_function(row, |b| b.iter_custom(|n| flood(sock, rx, n).0));
    }
    g.finish();
    // the table's rows take turns, in a rotating order, ROUNDS times: the medians
    for round in 0..ROUNDS {
        for k in 0..ROWS.len() {
            let i = (round + k) % ROWS.len();
            let (sock, rx) = &flows[i];
            let (t, delivered) = flood(sock, rx, ROUND_PACKETS);
            record(ROWS[i].0, t, ROUND_PACKETS);
            let mut d = DELIVERED.lock().unwrap();
            let e = d.entry(ROWS[i].0.to_string()).or_default();
            e.0 += delivered;
            e.1 += ROUND_PACKETS;
        }
    }
    let after = installed.status().unwrap();
    println!(
        "fast path: {} packets met the flow's verdict, {} classifications ran after the first",
        label_packets(&after) - label_packets(&before),
        after.started - before.started
    );
    assert_eq!(after.started, before.started, "the model ran again");

    // the program alone, on the judged flow's packet and on another port's, by the kernel's
    // clock (BPF_PROG_TEST_RUN, a million runs, best of 5)
    let from = judged_sock.local_addr().unwrap();
    for (row, port) in [
        ("program, another port", OTHER_PORT),
        ("program, flow with a verdict", PORT),
    ] {
        let frame = udp_frame(from, (filtered.host_addr, port).into());
        let times: Vec<Duration> = (0..5)
            .map(|_| {
                let (verdict, t) = program_run(&frame, ifindex(filtered.host), 1_000_000);
                assert_eq!(verdict, 2, "{row}: XDP_PASS");
                t
            })
            .collect();
        record(row, *times.iter().min().unwrap(), 1);
    }
    let judged = installed.status().unwrap();
    assert_eq!(
        label_packets(&judged) - label_packets(&after),
        5_000_000,
        "the test runs met the flow's verdict"
    );

    // packet to verdict, as the installed filter logs it: new flows (new source ports)
    for len in LENGTHS {
        let row = format!("installed tiny {len:>3} B");
        for _ in 0..5 {
            let s = filtered.run(|| UdpSocket::bind((filtered.peer_addr, 0)).unwrap());
            let port = s.local_addr().unwrap().port();
            s.send_to(&REQUEST.as_bytes()[..len], (filtered.host_addr, PORT))
                .unwrap();
            let mut elapsed = None;
            installed
                .follow_log(Duration::from_secs(60), |r| {
                    if r.source.1 == port {
                        elapsed = Some(r.elapsed);
                    }
                    elapsed.is_none()
                })
                .unwrap();
            record(&row, elapsed.expect("the flow's verdict record"), 1);
        }
    }
    drop(installed);
    InstalledFilter::remove(NAME).expect("removing the filter");
}

/// The table of medians.
fn table(_: &mut Criterion) {
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let mut models: Vec<String> = Vec::new();
    for k in TIMES.lock().unwrap().keys() {
        let m = k.split(' ').next().unwrap().to_string();
        if k.ends_with(" kernel") && !models.contains(&m) {
            models.push(m);
        }
    }
    if !models.is_empty() {
        println!("\ntime to a verdict per flow (ms; one thread)\n");
        println!("| model | payload | in the kernel | user space | kernel / user |");
        println!("|---|---:|---:|---:|---:|");
        for m in &models {
            for len in LENGTHS {
                let k = median(&format!("{m} {len:>3} B kernel"));
                let u = median(&format!("{m} {len:>3} B user"));
                if let (Some(k), Some(u)) = (k, u) {
                    let r = k.as_secs_f64() / u.as_secs_f64();
                    println!("| {m} | {len} B | {:.2} | {:.2} | {r:.2} |", ms(k), ms(u));
                }
            }
        }
    }
    let ns = |row: &str| median(row).map(|d| d.as_secs_f64() * 1e9);
    if let Some(base) = ns(ROWS[1].0) {
        println!(
            "\nfast path: {DATAGRAM}-byte UDP datagrams through a veth pair, ns per packet \
             (median of {ROUNDS} interleaved rounds of {ROUND_PACKETS}); the difference to \
             XDP_PASS is the median of the rounds' differences, with their middle half\n"
        );
        println!(
            "| receiving end | ns/packet | ratio to XDP_PASS | + ns/packet | middle half | delivered |"
        );
        println!("|---|---:|---:|---:|---:|---:|");
        let times = TIMES.lock().unwrap().clone();
        for (row, ..) in ROWS {
            let Some(v) = ns(row) else { continue };
            // the rows took turns: a round's time of `row` against the same round's XDP_PASS
            let mut d: Vec<f64> = times[row]
                .iter()
                .zip(&times[ROWS[1].0])
                .map(|(a, b)| (a.as_secs_f64() - b.as_secs_f64()) * 1e9)
                .collect();
            d.sort_by(f64::total_cmp);
            let q = |f: f64| d[((d.len() - 1) as f64 * f).round() as usize];
            let (n_ok, n) = DELIVERED.lock().unwrap()[row];
            let delivered = n_ok as f64 / n.max(1) as f64 * 100.0;
            println!(
                "| {row} | {v:.0} | {:.2} | {:+.0} | {:+.0} to {:+.0} | {delivered:.1} % |",
                v / base,
                q(0.5),
                q(0.25),
                q(0.75)
            );
        }
    }
    if let (Some(other), Some(judged)) = (
        ns("program, another port"),
        ns("program, flow with a verdict"),
    ) {
        println!(
            "\nthe XDP program alone (BPF_PROG_TEST_RUN, ns per run): another port {other:.0}, \
             a flow with a verdict {judged:.0} ({:+.0})",
            judged - other
        );
    }
    let rows: Vec<String> = LENGTHS
        .iter()
        .map(|len| format!("installed tiny {len:>3} B"))
        .filter(|r| median(r).is_some())
        .collect();
    if !rows.is_empty() {
        println!("\ninstalled filter, tiny model: packet to verdict (ms, the log's elapsed, 5 flows each)\n");
        println!("| payload | ms |");
        println!("|---:|---:|");
        for (row, len) in rows.iter().zip(LENGTHS) {
            println!("| {len} B | {:.2} |", ms(median(row).unwrap()));
        }
    }
}

criterion_group!(benches, verdict, fast_path, table);
criterion_main!(benches);
