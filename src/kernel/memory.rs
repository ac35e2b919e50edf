//! The memory layer (`src/bpf/mem.h`): which kind of map the programs share memory with user space
//! through, and its selftest.
//!
//! - **Arena** (Linux >= 6.9): one BPF arena, mmapped by libbpf.
//! - **Array** (any kernel with mmapable array maps: 5.5 on; for Linux 6.1-6.8 and for hosts
//!   whose policy refuses arenas): one `BPF_MAP_TYPE_ARRAY` with `BPF_F_MMAPABLE`, whose elements
//!   of 2^shift bytes are mmapped contiguously at an address reserved before load, so that an
//!   address means the same byte to user space and to BPF in both layers.
//!
//! Issue 35 moves every program onto this layer step by step (docs/plans/array-layer.md). So far
//! the layer, its selftest ([`selftest`]) and the operators of
//! [`ARRAY_PROGRAMS`](super::ops::ARRAY_PROGRAMS) are built in both forms
//! ([`Ops::load_on`](super::ops::Ops::load_on)); the rest use the arena only.

use std::fmt;
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, AsRawFd};

use libbpf_rs::skel::{OpenSkel, SkelBuilder};
use libbpf_rs::OpenObject;

use super::{check_kernel, load_error, probe_arena, test_run, verifier};
use crate::{Error, Result};

/// Which memory layer to use.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum MemoryLayer {
    /// The arena where this process may create one, array maps otherwise.
    #[default]
    Auto,
    /// A BPF arena (Linux >= 6.9, and a policy that allows it).
    Arena,
    /// Mmapable BPF array maps.
    Array,
}

impl fmt::Display for MemoryLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            MemoryLayer::Auto => "auto",
            MemoryLayer::Arena => "arena",
            MemoryLayer::Array => "array",
        })
    }
}

/// What the kernel answered when asked for each layer's map: 1, or the negative errno of the
/// refusal (see [`probe_arena`], [`probe_array`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LayerProbe {
    /// Creating a one-page arena map.
    pub arena: i32,
    /// Creating, mmapping and writing a one-page mmapable array map.
    pub array: i32,
}

impl LayerProbe {
    /// Asks the kernel (two map creations; milliseconds).
    pub fn run() -> LayerProbe {
        LayerProbe {
            arena: probe_arena(),
            array: probe_array(),
        }
    }

    /// The layer `want` resolves to here, with the reason; or why it cannot run.
    /// [`MemoryLayer::Auto`] takes the arena when the kernel gave one, else the array maps.
    pub fn choose(&self, want: MemoryLayer) -> std::result::Result<(MemoryLayer, String), String> {
        let why = |r: i32| match r {
            1 => "created".to_string(),
            0 => "not supported".to_string(),
            r => std::io::Error::from_raw_os_error(-r).to_string(),
        };
        let arena = format!("arena map: {}", why(self.arena));
        let array = format!("mmapable array map: {}", why(self.array));
        match want {
            MemoryLayer::Arena if self.arena == 1 => Ok((MemoryLayer::Arena, "asked for".into())),
            MemoryLayer::Array if self.array == 1 => Ok((MemoryLayer::Array, "asked for".into())),
            MemoryLayer::Arena => Err(arena),
            MemoryLayer::Array => Err(array),
            MemoryLayer::Auto if self.arena == 1 => Ok((MemoryLayer::Arena, arena)),
            MemoryLayer::Auto if self.array == 1 => Ok((MemoryLayer::Array, arena)),
            MemoryLayer::Auto => Err(format!("{arena}; {array}")),
        }
    }
}

/// Creates a one-page mmapable array map, maps it, writes and reads a word back: 1, or the
/// kernel's negative errno for the step that failed.
pub fn probe_array() -> i32 {
    let page = super::arena::PAGE;
    let mut opts: libbpf_rs::libbpf_sys::bpf_map_create_opts = unsafe { std::mem::zeroed() };
    opts.sz = std::mem::size_of_val(&opts) as _;
    opts.map_flags = libbpf_rs::libbpf_sys::BPF_F_MMAPABLE;
    // SAFETY: a map create with a valid opts struct and no name; the fd is closed below.
    let fd = unsafe {
        libbpf_rs::libbpf_sys::bpf_map_create(
            libbpf_rs::libbpf_sys::BPF_MAP_TYPE_ARRAY,
            std::ptr::null(),
            4,
            page as u32,
            1,
            &opts,
        )
    };
    let errno = || -std::io::Error::last_os_error().raw_os_error().unwrap_or(libc::EINVAL);
    if fd < 0 {
        return errno();
    }
    // SAFETY: maps the map's one page shared; unmapped below.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            page,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd,
            0,
        )
    };
    let r = if p == libc::MAP_FAILED {
        errno()
    } else {
        // SAFETY: p is a live, writable, page-aligned mapping of `page` bytes.
        let ok = unsafe {
            std::ptr::write_volatile(p as *mut u64, 0x5eed);
            let back = std::ptr::read_volatile(p as *const u64);
            libc::munmap(p, page);
            back == 0x5eed
        };
        if ok {
            1
        } else {
            -libc::EIO
        }
    };
    // SAFETY: fd is ours and open.
    unsafe { libc::close(fd) };
    r
}

/// An address range reserved (PROT_NONE) before an array map exists, then mapped over by it with
/// MAP_FIXED, so that BPF can be told the base address before load. Unmapped on drop.
#[derive(Debug)]
pub(crate) struct Reservation {
    base: *mut u8,
    len: usize,
}

// SAFETY: a plain address range owned by this value.
unsafe impl Send for Reservation {}

impl Reservation {
    /// Reserves `len` bytes of address space (no memory).
    pub fn new(len: usize) -> Result<Reservation> {
        // SAFETY: an anonymous PROT_NONE mapping chosen by the kernel.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(Error::Bpf {
                what: format!("reserving {len} bytes of address space for an array map"),
                detail: std::io::Error::last_os_error().to_string(),
            });
        }
        Ok(Reservation {
            base: p as *mut u8,
            len,
        })
    }

    /// The start of the range.
    pub fn base(&self) -> *mut u8 {
        self.base
    }

    /// Maps the loaded array map `fd` (all of its `len` bytes) over the range, shared.
    pub fn map(&mut self, fd: std::os::fd::BorrowedFd<'_>) -> Result<()> {
        // SAFETY: replaces our own reservation, which covers exactly base..base+len.
        let p = unsafe {
            libc::mmap(
                self.base as *mut _,
                self.len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_FIXED,
                fd.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED || p as *mut u8 != self.base {
            return Err(Error::Bpf {
                what: "mapping an array map".into(),
                detail: std::io::Error::last_os_error().to_string(),
            });
        }
        Ok(())
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        // SAFETY: the range is ours; nothing borrows it past this value.
        unsafe { libc::munmap(self.base as *mut _, self.len) };
    }
}

mod arena_skel {
    skel_module!(pub mod "mem.skel.rs");
}
mod array_skel {
    skel_module!(pub mod "mem_array.skel.rs");
}
use arena_skel::skel::types::mem_args;

/// The selftest's memory: four elements of 4 KiB in the array layer (four pages of arena).
const ELEM_SHIFT: u32 = 12;
const ELEM: usize = 1 << ELEM_SHIFT;
const ELEMS: usize = 4;
const BYTES: usize = ELEM * ELEMS;
/// Bytes summed through one span (`MEM_SPAN` in mem.bpf.c).
const SPAN: usize = 64;
/// Stored back XORed into every u64 read.
const FLIP: u64 = 0xa5a5_5a5a_0ff0_f00f;

/// Runs `mem_selftest` (src/bpf/mem.bpf.c) on `layer` and checks every integer it read, summed,
/// wrote and refused against [`selftest_twin`]: loads and stores at the start and end of an
/// element, a u64 and a 64-byte span that cross an element's end, the last span of the map, and
/// addresses past its end, below it and 0. Returns the layer that ran.
pub fn selftest(layer: MemoryLayer) -> Result<MemoryLayer> {
    let layer = LayerProbe::run()
        .choose(layer)
        .map_err(|why| Error::Bpf {
            what: format!("the {layer} memory layer"),
            detail: why,
        })?;
    let layer = layer.0;
    selftest_chosen(layer)?;
    Ok(layer)
}

/// [`selftest`] on `layer` as [`LayerProbe::choose`] resolved it (the arena or array maps, not
/// probed again).
pub(crate) fn selftest_chosen(layer: MemoryLayer) -> Result<()> {
    match layer {
        MemoryLayer::Array => selftest_array(),
        _ => selftest_arena(),
    }
}

fn selftest_arena() -> Result<()> {
    check_kernel()?;
    let mut storage = MaybeUninit::<OpenObject>::uninit();
    let mut open = arena_skel::skel::MemSkelBuilder::default()
        .open(&mut storage)
        .map_err(|e| load_error("the memory selftest (arena)", e))?;
    open.maps
        .mem
        .set_max_entries((BYTES / super::arena::PAGE) as u32)
        .map_err(|e| load_error("the memory selftest (arena)", e))?;
    let skel = verifier::load_explained(|| open.load())
        .map_err(|(e, why)| super::load_refused("the memory selftest (arena)", e, why))?;
    let base = super::arena::mapping(&skel.maps.mem)?;
    run(base, false, |args| {
        test_run(skel.progs.mem_selftest.as_fd(), "mem_selftest", args)
    })
}

fn selftest_array() -> Result<()> {
    let what = "the memory selftest (array maps)";
    let mut storage = MaybeUninit::<OpenObject>::uninit();
    let mut open = array_skel::skel::MemArraySkelBuilder::default()
        .open(&mut storage)
        .map_err(|e| load_error(what, e))?;
    let mut mem = Reservation::new(BYTES)?;
    let rodata = open.maps.rodata_data.as_deref_mut().ok_or_else(|| Error::Bpf {
        what: what.into(),
        detail: "the object has no .rodata".into(),
    })?;
    rodata.qb_mem_base = mem.base() as u64;
    rodata.qb_mem_shift = ELEM_SHIFT;
    let set = |m: &mut libbpf_rs::OpenMapMut<'_>| -> libbpf_rs::Result<()> {
        m.set_value_size(ELEM as u32)?;
        m.set_max_entries(ELEMS as u32)
    };
    set(&mut open.maps.mem).map_err(|e| load_error(what, e))?;
    let skel = verifier::load_explained(|| open.load())
        .map_err(|(e, why)| super::load_refused(what, e, why))?;
    mem.map(skel.maps.mem.as_fd())?;
    run(mem.base(), true, |args| {
        test_run(skel.progs.mem_selftest.as_fd(), "mem_selftest", args)
    })
}

/// The probes of the selftest, as offsets from the base (the first five lie inside the memory,
/// the last three outside: below it, past it, and address 0, which only the array layer can be
/// asked about).
fn probes(base: u64) -> [u64; 8] {
    let b = base;
    [
        b,                                // an element's first u64
        b + ELEM as u64 - 8,              // its last u64; a span from here crosses its end
        b + ELEM as u64 - 4,              // a u64 across the end of element 0
        b + ELEM as u64,                  // element 1's first u64
        b + (BYTES - SPAN) as u64,        // the map's last span
        b + BYTES as u64,                 // one past the end
        b.wrapping_sub(8),                // just below the base
        0,                                // no address
    ]
}

/// What `mem_selftest` computes, in Rust: the probes in order over a copy of the memory, each
/// access allowed where `fits(offset, len)`.
pub fn selftest_twin(
    mem: &mut [u8],
    base: u64,
    addr: &[u64],
    flip: u64,
    fits: impl Fn(u64, usize) -> bool,
) -> Vec<(i32, u64, i32, i32, u64)> {
    let mut out = Vec::new();
    for &a in addr {
        let off = a.wrapping_sub(base);
        let u64_at = |m: &[u8]| u64::from_le_bytes(m[off as usize..][..8].try_into().unwrap());
        let (ld, v, st) = if fits(off, 8) {
            let v = u64_at(mem);
            mem[off as usize..][..8].copy_from_slice(&(v ^ flip).to_le_bytes());
            (0, v, 0)
        } else {
            (-1, 0, -1)
        };
        let (span, sum) = if fits(off, SPAN) {
            let s = mem[off as usize..][..SPAN]
                .chunks(4)
                .map(|c| u32::from_le_bytes(c.try_into().unwrap()) as u64)
                .sum();
            (1, s)
        } else {
            (0, 0)
        };
        out.push((ld, v, st, span, sum));
    }
    out
}

/// What one of `mem_selftest`'s walks computes, in Rust: the `n` u32 at offset `off` summed and
/// each stored as `3x + 1` (wrapping), when `fits(off, 4n)`; `(1, sum)`, or `(0, 0)` refused.
pub fn walk_twin(
    mem: &mut [u8],
    off: u64,
    n: usize,
    fits: impl Fn(u64, usize) -> bool,
) -> (i32, u64) {
    if !fits(off, 4 * n) {
        return (0, 0);
    }
    let mut sum = 0u64;
    for w in mem[off as usize..][..4 * n].chunks_mut(4) {
        let x = u32::from_le_bytes(w.try_into().unwrap());
        sum += u64::from(x);
        w.copy_from_slice(&x.wrapping_mul(3).wrapping_add(1).to_le_bytes());
    }
    (1, sum)
}

/// Fills the memory at `base` (BYTES bytes, writable), runs the program through `go` on the
/// probes, and compares with the twin.
fn run(
    base: *mut u8,
    array: bool,
    go: impl FnOnce(&mut mem_args) -> Result<i32>,
) -> Result<()> {
    // SAFETY: base..base+BYTES is the live shared mapping of the caller's map.
    let mem = unsafe { std::slice::from_raw_parts_mut(base, BYTES) };
    for (k, w) in mem.chunks_mut(8).enumerate() {
        w.copy_from_slice(&(k as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15).to_le_bytes());
    }
    let b = base as u64;
    let addr = probes(b);
    // the arena has no element ends, and an address outside it is not a question it answers
    let n = if array { 8 } else { 5 };
    let fits = |off: u64, len: usize| {
        let in_map = off.checked_add(len as u64).is_some_and(|e| e <= BYTES as u64);
        in_map && (!array || (off % ELEM as u64) + len as u64 <= ELEM as u64)
    };
    let mut twin_mem = mem.to_vec();
    let want = selftest_twin(&mut twin_mem, b, &addr[..n], FLIP, fits);
    let mut args = mem_args {
        n: n as u32,
        flip: FLIP,
        ..Default::default()
    };
    args.addr = addr;
    // two walks (QB_EACH over QB_IX): one inside element 1, one across the end of element 1
    // (the array layer refuses it whole, before any access)
    let vecs = [(b + ELEM as u64 + 64, 900u32), (b + 2 * ELEM as u64 - 40, 30)];
    let want_vecs: Vec<(i32, u64)> = vecs
        .iter()
        .map(|&(a, n)| walk_twin(&mut twin_mem, a - b, n as usize, fits))
        .collect();
    for (k, &(a, n)) in vecs.iter().enumerate() {
        args.vec[k] = a;
        args.vec_n[k] = n;
    }
    let rc = go(&mut args)?;
    let got: Vec<_> = (0..n)
        .map(|i| (args.ld[i], args.val[i], args.st[i], args.span[i], args.sum[i]))
        .collect();
    let layer = if array { "array" } else { "arena" };
    let mismatch = |detail: String| Error::Bpf {
        what: format!("the memory selftest ({layer} layer)"),
        detail,
    };
    if rc != 0 {
        return Err(mismatch(format!("mem_selftest returned {rc}")));
    }
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        if g != w {
            return Err(mismatch(format!(
                "probe {i} at base{:+}: (load, value, store, span, sum) {g:?}, the twin {w:?}",
                addr[i].wrapping_sub(b) as i64
            )));
        }
    }
    for (k, w) in want_vecs.iter().enumerate() {
        let g = (args.vec_ok[k], args.vec_sum[k]);
        if g != *w {
            return Err(mismatch(format!(
                "walk {k} of {} u32 at base{:+}: (walked, sum) {g:?}, the twin {w:?}",
                vecs[k].1,
                vecs[k].0 - b
            )));
        }
    }
    if let Some(at) = (0..BYTES).find(|&i| mem[i] != twin_mem[i]) {
        return Err(mismatch(format!(
            "byte {at} after the stores is {:#x}, the twin's {:#x}",
            mem[at], twin_mem[at]
        )));
    }
    Ok(())
}
