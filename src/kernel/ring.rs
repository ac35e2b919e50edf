//! The `tokens` ring buffer of `src/bpf/generate.inc.c`: the records of in-kernel generation,
//! read from its mmap (libbpf's ring_buffer API; consuming makes no system call, waiting for
//! records is an epoll wait).

use std::cell::RefCell;
use std::collections::VecDeque;
use std::os::fd::RawFd;

use libbpf_rs::libbpf_sys;

use crate::{Error, Result};

/// Text bytes a record carries at most (`GEN_TEXT_MAX`).
pub const TEXT_MAX: usize = 256;

/// One generated token, as the kernel wrote it (`struct gen_token`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GenToken {
    /// The token.
    pub id: u32,
    /// The position it is fed at next.
    pub pos: u32,
    /// The request that made it (the event path's request slot; 0 otherwise).
    pub request: u32,
    /// Its text bytes (empty without a loaded vocabulary); possibly part of a UTF-8 character.
    pub bytes: Vec<u8>,
    /// What the record is: [`Record::Token`] for a generated token (`id`), else a request's
    /// outcome on the event path.
    pub kind: Record,
}

/// `kind` of a token record (`REC_TOKEN`).
pub const REC_TOKEN: u32 = 0;
/// `kind` of a request's outcome (`REC_DONE`).
pub const REC_DONE: u32 = 1;
/// `kind` of a refusal (`REC_REFUSED`).
pub const REC_REFUSED: u32 = 2;

/// What a ring-buffer record reports (`kind` of `struct gen_token`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Record {
    /// A generated token.
    Token,
    /// A request ended; `id` is its status (`GEN_*`) or a negative plan error.
    Done,
    /// A request was refused; `id` is the reason (`EV_R_*`).
    Refused,
}

impl GenToken {
    fn parse(data: &[u8]) -> Option<GenToken> {
        let word = |i: usize| {
            Some(u32::from_ne_bytes(
                data.get(4 * i..4 * i + 4)?.try_into().ok()?,
            ))
        };
        let len = (word(3)? as usize).min(TEXT_MAX);
        Some(GenToken {
            id: word(0)?,
            pos: word(1)?,
            request: word(2)?,
            bytes: data.get(24..24 + len)?.to_vec(),
            kind: match word(4)? {
                REC_TOKEN => Record::Token,
                REC_DONE => Record::Done,
                _ => Record::Refused,
            },
        })
    }
}

type Queue = RefCell<VecDeque<GenToken>>;

/// A reader of the ring buffer; records are queued in arrival order.
pub struct TokenRing {
    rb: *mut libbpf_sys::ring_buffer,
    queue: Box<Queue>,
}

// SAFETY: the ring_buffer handle and the queue are owned by this value and used only through
// &mut self (or &self for the epoll fd), never shared between threads at once.
unsafe impl Send for TokenRing {}

impl std::fmt::Debug for TokenRing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenRing")
            .field("queued", &self.queue.borrow().len())
            .finish()
    }
}

unsafe extern "C" fn on_record(
    ctx: *mut std::ffi::c_void,
    data: *mut std::ffi::c_void,
    size: libbpf_sys::size_t,
) -> i32 {
    // SAFETY: ctx is the Box<Queue> of the TokenRing that registered this callback, alive while
    // the ring buffer is; data points at `size` readable bytes of the record.
    let (queue, data) = unsafe {
        (
            &*(ctx as *const Queue),
            std::slice::from_raw_parts(data as *const u8, size as usize),
        )
    };
    if let Some(t) = GenToken::parse(data) {
        queue.borrow_mut().push_back(t);
    }
    0
}

impl TokenRing {
    /// A reader of the ring buffer map `map_fd`.
    pub fn new(map_fd: RawFd) -> Result<TokenRing> {
        let queue: Box<Queue> = Box::default();
        // SAFETY: the callback's ctx is the boxed queue, which outlives the ring buffer (Drop
        // frees the ring buffer first).
        let rb = unsafe {
            libbpf_sys::ring_buffer__new(
                map_fd,
                Some(on_record),
                &*queue as *const Queue as *mut std::ffi::c_void,
                std::ptr::null(),
            )
        };
        if rb.is_null() {
            return Err(Error::Bpf {
                what: "opening the tokens ring buffer".into(),
                detail: std::io::Error::last_os_error().to_string(),
            });
        }
        Ok(TokenRing { rb, queue })
    }

    /// Moves every record written so far into the queue (no system call).
    pub fn consume(&mut self) -> Result<()> {
        // SAFETY: rb is a live ring buffer.
        let n = unsafe { libbpf_sys::ring_buffer__consume(self.rb) };
        if n < 0 {
            return Err(Error::Bpf {
                what: "reading the tokens ring buffer".into(),
                detail: std::io::Error::from_raw_os_error(-n).to_string(),
            });
        }
        Ok(())
    }

    /// Waits up to `timeout_ms` for records (epoll_wait), then queues them.
    pub fn poll(&mut self, timeout_ms: i32) -> Result<()> {
        // SAFETY: rb is a live ring buffer.
        let n = unsafe { libbpf_sys::ring_buffer__poll(self.rb, timeout_ms) };
        if n < 0 && n != -libc::EINTR {
            return Err(Error::Bpf {
                what: "waiting on the tokens ring buffer".into(),
                detail: std::io::Error::from_raw_os_error(-n).to_string(),
            });
        }
        Ok(())
    }

    /// The oldest queued record.
    pub fn pop(&mut self) -> Option<GenToken> {
        self.queue.borrow_mut().pop_front()
    }

    /// Drops every queued record.
    pub fn clear(&mut self) {
        self.queue.borrow_mut().clear();
    }
}

impl Drop for TokenRing {
    fn drop(&mut self) {
        // SAFETY: rb came from ring_buffer__new and is freed once.
        unsafe { libbpf_sys::ring_buffer__free(self.rb) };
    }
}
