//! The clients of the installed-model tests (tests/serve*.rs): the wire format written out from
//! the byte tables of docs/in-kernel.md with plain `std::net::UdpSocket`s, not the crate's
//! helpers, and an installation removed when dropped.

use std::net::{SocketAddr, UdpSocket};
use std::path::Path;
use std::time::{Duration, Instant};

use qwen_bpf::{
    Backend, Dispatch, InstallConfig, Installed, Model, ModelOptions, Refusal, Tokenizer,
};

/// The context of the installed test models.
pub const CTX: usize = 64;

/// The wire format, written out from the tables of docs/in-kernel.md.
pub mod wire {
    pub const REQUEST: u32 = 0x4650_4251; // "QBPF"
    pub const TEXT_REQUEST: u32 = 0x5450_4251; // "QBPT"
    pub const POLL: u32 = 0x4C50_4251; // "QBPL"
    pub const REPLY: u32 = 0x5250_4251; // "QBPR"
    pub const ACCEPTED: u32 = 1;
    pub const REFUSED: u32 = 2;
    pub const TEXT: u32 = 3;
    pub const FINAL: u32 = 4;

    pub fn words(w: &[u32]) -> Vec<u8> {
        w.iter().flat_map(|w| w.to_le_bytes()).collect()
    }

    pub fn request(id: u32, max_new: u32, prompt: &[u32]) -> Vec<u8> {
        let mut w = vec![REQUEST, id, max_new, prompt.len() as u32];
        w.extend_from_slice(prompt);
        words(&w)
    }

    /// A text request: twelve header words (magic, id, max_new, flags, temperature, top_k,
    /// top_p, min_p, repetition penalty, seed low, seed high, length), then the text's bytes.
    pub fn text_request(
        id: u32,
        max_new: u32,
        flags: u32,
        sampling: [u32; 7],
        text: &[u8],
    ) -> Vec<u8> {
        let mut w = vec![TEXT_REQUEST, id, max_new, flags];
        w.extend_from_slice(&sampling);
        w.push(text.len() as u32);
        let mut d = words(&w);
        d.extend_from_slice(text);
        d
    }

    /// Greedy: every sampling field 0.
    pub const GREEDY: [u32; 7] = [0; 7];

    /// A poll with the cookie of its ACCEPTED reply (words 3 and 4), padded to 1044 bytes: room
    /// for a reply with 1024 text bytes.
    pub fn poll(id: u32, offset: u32, cookie: u64) -> Vec<u8> {
        let mut d = words(&[POLL, id, offset, cookie as u32, (cookie >> 32) as u32]);
        d.resize(1044, 0);
        d
    }

    /// The server cookie an ACCEPTED reply's payload `d` carries (words 3 and 4).
    pub fn cookie(d: &[u8]) -> u64 {
        u64::from(word(d, 4)) << 32 | u64::from(word(d, 3))
    }

    pub fn word(d: &[u8], i: usize) -> u32 {
        u32::from_le_bytes(d[4 * i..4 * i + 4].try_into().unwrap())
    }
}

/// A UDP client of the installed model.
pub struct Client {
    pub sock: UdpSocket,
    /// The cookie of each request id's last ACCEPTED reply.
    cookies: std::sync::Mutex<std::collections::HashMap<u32, u64>>,
}

impl Client {
    pub fn new(bind: &str, server: SocketAddr) -> Client {
        let sock = UdpSocket::bind(bind).unwrap();
        sock.connect(server).unwrap();
        sock.set_read_timeout(Some(Duration::from_millis(200)))
            .unwrap();
        Client {
            sock,
            cookies: Default::default(),
        }
    }

    /// Sends `d`, a datagram shorter than any reply to it, and shows that nothing comes back
    /// (the server never answers more bytes than it was sent).
    #[allow(dead_code)]
    pub fn unanswered(&self, d: &[u8]) {
        let mut buf = vec![0u8; 4096];
        self.sock.send(d).unwrap();
        for _ in 0..5 {
            if let Ok(n) = self.sock.recv(&mut buf) {
                panic!("a datagram of {} bytes was answered with {n}", d.len());
            }
        }
    }

    /// The cookie of request `id`'s last ACCEPTED reply (0 if none).
    pub fn cookie(&self, id: u32) -> u64 {
        self.cookies.lock().unwrap().get(&id).copied().unwrap_or(0)
    }

    /// A poll for `id` from `offset` with the cookie this client was given for it.
    pub fn poll(&self, id: u32, offset: u32) -> Vec<u8> {
        wire::poll(id, offset, self.cookie(id))
    }

    /// Sends `d` and returns the reply to it (sent again every 200 ms; panics after 10 s).
    pub fn ask(&self, d: &[u8]) -> Vec<u8> {
        let end = Instant::now() + Duration::from_secs(10);
        let mut buf = vec![0u8; 4096];
        while Instant::now() < end {
            self.sock.send(d).unwrap();
            if let Ok(n) = self.sock.recv(&mut buf) {
                assert!(n >= 20, "a reply of {n} bytes");
                assert_eq!(wire::word(&buf, 0), wire::REPLY, "the reply magic");
                if wire::word(&buf, 1) == wire::ACCEPTED {
                    let cookie = wire::cookie(&buf);
                    self.cookies
                        .lock()
                        .unwrap()
                        .insert(wire::word(&buf, 2), cookie);
                }
                return buf[..n].to_vec();
            }
        }
        panic!("no reply in 10 s to a datagram of {} bytes", d.len());
    }

    /// Requests a generation, polls it to its end: the text and the FINAL record's words.
    pub fn generate(&self, id: u32, max_new: u32, prompt: &[u32]) -> (Vec<u8>, Vec<u32>) {
        let r = self.ask(&wire::request(id, max_new, prompt));
        assert_eq!(
            (wire::word(&r, 1), wire::word(&r, 2)),
            (wire::ACCEPTED, id),
            "ACCEPTED {id}"
        );
        self.poll_to_end(id)
    }

    pub fn poll_to_end(&self, id: u32) -> (Vec<u8>, Vec<u32>) {
        let mut text = Vec::new();
        let end = Instant::now() + Duration::from_secs(60);
        while Instant::now() < end {
            let r = self.ask(&self.poll(id, text.len() as u32));
            assert_eq!(wire::word(&r, 2), id);
            match wire::word(&r, 1) {
                wire::TEXT => {
                    assert_eq!(wire::word(&r, 3) as usize, text.len(), "the offset echoed");
                    let n = wire::word(&r, 4) as usize;
                    assert_eq!(r.len(), 20 + n, "TEXT carries its n bytes");
                    text.extend_from_slice(&r[20..]);
                    if n == 0 {
                        std::thread::sleep(Duration::from_millis(5));
                    }
                }
                wire::FINAL => {
                    assert_eq!(r.len(), 32, "FINAL is 8 words");
                    assert_eq!(wire::word(&r, 3) as usize, text.len(), "the whole text");
                    return (text, (0..8).map(|i| wire::word(&r, i)).collect());
                }
                k => panic!("reply kind {k} to a poll: {r:?}"),
            }
        }
        panic!("request {id} did not end in 60 s");
    }

    /// Expects a REFUSED reply to `d` with `reason` for `request`.
    pub fn refused(&self, d: &[u8], request: u32, reason: Refusal) {
        let r = self.ask(d);
        assert_eq!(
            (wire::word(&r, 1), wire::word(&r, 2), wire::word(&r, 3)),
            (wire::REFUSED, request, reason.code()),
            "REFUSED {request} as {reason:?}"
        );
    }
}

/// Removes installation `name` when dropped (and any left over by an earlier run when made),
/// so that a failing test leaves no model in the kernel.
pub struct Installation(String);

impl Installation {
    pub fn new(name: &str) -> Installation {
        let _ = Installed::remove(name);
        Installation(name.into())
    }
}

impl Drop for Installation {
    fn drop(&mut self) {
        let _ = Installed::remove(&self.0);
    }
}

/// Waits up to `limit` for `f` to hold.
pub fn eventually(limit: Duration, mut f: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + limit;
    while Instant::now() < end {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    f()
}

pub fn options(dir: &Path, slots: usize, ctx: usize) -> ModelOptions {
    ModelOptions {
        backend: Backend::Q24,
        max_context: ctx,
        event_slots: slots,
        cache_dir: Some(dir.join("cache-q24")),
        ..Default::default()
    }
}

/// The test model, driven one operator at a time on one thread: the reference of the served
/// answers.
pub fn per_op_model(dir: &Path) -> Model {
    Model::open(
        dir,
        &ModelOptions {
            dispatch: Dispatch::PerOp,
            threads: 1,
            ..options(dir, 0, CTX)
        },
    )
    .unwrap()
}

/// The tokens greedy per-operator generation gives (one thread), up to `n`, ending at a stop
/// token (included, as the kernel counts it): the tokens and whether one stopped it.
pub fn reference(dir: &Path, prompt: &[u32], n: usize, stops: &[u32]) -> (Vec<u32>, bool) {
    let mut m = per_op_model(dir);
    let mut ids = super::greedy_tokens(&mut m, prompt, n);
    match ids.iter().position(|t| stops.contains(t)) {
        Some(i) => {
            ids.truncate(i + 1);
            (ids, true)
        }
        None => (ids, false),
    }
}

/// The text of `ids` (a stop token at the end left out): the tokenizer's decoding, checked
/// against the vocabulary bytes joined.
pub fn text_of(tok: &Tokenizer, ids: &[u32], stopped: bool) -> String {
    let ids = &ids[..ids.len() - stopped as usize];
    let bytes: Vec<u8> = ids
        .iter()
        .flat_map(|&t| tok.token_bytes(t).unwrap())
        .collect();
    let text = tok.decode(ids).unwrap();
    assert_eq!(text.as_bytes(), bytes, "decode vs the vocabulary's bytes");
    text
}

pub fn install_in_process(dir: &Path, name: &str, slots: usize, ctx: usize, cfg: &InstallConfig) {
    let tok = Tokenizer::from_model_dir(dir).unwrap();
    let mut m = Model::open(dir, &options(dir, slots, ctx)).unwrap();
    m.load_vocabulary(&tok).unwrap();
    m.load_tokenizer(&tok).unwrap();
    m.install(name, cfg).unwrap();
}

/// The program `prog` pinned by the installation `name` (`bpf_obj_get`).
pub fn pinned_prog(name: &str, prog: &str) -> std::os::fd::OwnedFd {
    use libbpf_rs::libbpf_sys;
    use std::os::fd::FromRawFd;
    let path = qwen_bpf::run::serve::pin_dir(name).join(prog);
    let c = std::ffi::CString::new(path.into_os_string().into_encoded_bytes()).unwrap();
    // SAFETY: a NUL-terminated path.
    let fd = unsafe { libbpf_sys::bpf_obj_get(c.as_ptr()) };
    assert!(
        fd >= 0,
        "the pin of {prog}: {}",
        std::io::Error::last_os_error()
    );
    // SAFETY: a new fd that nothing else owns.
    unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) }
}

/// Runs program `prog` once on `frame` with `BPF_PROG_TEST_RUN` (the frame goes in as bytes):
/// its return value and the frame it leaves (at most 4 KiB).
pub fn test_run(prog: &std::os::fd::OwnedFd, frame: &[u8]) -> (u32, Vec<u8>) {
    use libbpf_rs::libbpf_sys;
    use std::os::fd::AsRawFd;
    let mut out = vec![0u8; 4096];
    // SAFETY: zeroed options, then the size and buffers of this call, which outlive it.
    let mut opts: libbpf_sys::bpf_test_run_opts = unsafe { std::mem::zeroed() };
    opts.sz = std::mem::size_of::<libbpf_sys::bpf_test_run_opts>() as _;
    opts.data_in = frame.as_ptr() as *const _;
    opts.data_size_in = frame.len() as u32;
    opts.data_out = out.as_mut_ptr() as *mut _;
    opts.data_size_out = out.len() as u32;
    opts.repeat = 1;
    // SAFETY: a program fd and options whose buffers are live for the call.
    let rc = unsafe { libbpf_sys::bpf_prog_test_run_opts(prog.as_raw_fd(), &mut opts) };
    assert_eq!(
        rc,
        0,
        "BPF_PROG_TEST_RUN: {}",
        std::io::Error::last_os_error()
    );
    out.truncate(opts.data_size_out as usize);
    (opts.retval, out)
}
