//! The BPF arena as user space sees it: one shared mapping, carved into buffers by a bump
//! allocator. BPF programs receive buffer addresses (user-space virtual addresses of the
//! mapping) through their ctx.

use crate::{Error, Result};

/// Arena page size.
pub const PAGE: usize = 4096;

/// Largest arena the kernel allows (4 GiB).
pub const MAX_ARENA_BYTES: usize = 1 << 32;

/// A region of the arena: byte offset and length.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Region {
    /// Offset from the arena's start.
    pub off: usize,
    /// Length in bytes.
    pub len: usize,
}

impl Region {
    /// The `len` bytes at byte offset `at` inside this region.
    pub fn sub(self, at: usize, len: usize) -> Region {
        assert!(
            at + len <= self.len,
            "sub-region {at}+{len} outside a region of {}",
            self.len
        );
        Region {
            off: self.off + at,
            len,
        }
    }
}

/// User-space view of a BPF arena map: base address of libbpf's mmap and a bump allocator.
#[derive(Debug)]
pub struct Arena {
    base: *mut u8,
    len: usize,
    next: usize,
}

// SAFETY: the mapping lives as long as the owning skeleton; access goes through &mut self or
// through regions the caller owns.
unsafe impl Send for Arena {}

impl Arena {
    /// Wraps the mapping at `base` of `len` bytes.
    ///
    /// # Safety
    /// `base..base+len` must be a live read-write mapping of the arena for the Arena's lifetime.
    pub(crate) unsafe fn new(base: *mut u8, len: usize) -> Arena {
        Arena { base, len, next: 0 }
    }

    /// Total size of the arena in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the arena has no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Bytes handed out so far.
    pub fn used(&self) -> usize {
        self.next
    }

    /// Reserves `len` bytes, page aligned, and zero-fills them (which also faults the pages in:
    /// BPF programs cannot fault arena pages in themselves). `what` names the buffer in errors.
    pub fn alloc(&mut self, len: usize, what: &str) -> Result<Region> {
        let r = self.reserve(len, what)?;
        // SAFETY: reserve checked that the region lies inside the mapping.
        unsafe { std::ptr::write_bytes(self.base.add(r.off), 0, len) };
        Ok(r)
    }

    /// Reserves `len` bytes, page aligned, without touching them: no kernel memory is committed
    /// until [`Arena::commit`] faults the pages in. BPF programs cannot fault arena pages in (a
    /// BPF load from a page never committed reads 0 and a store to it is dropped), so every
    /// page a program will use must be committed first.
    pub fn reserve(&mut self, len: usize, what: &str) -> Result<Region> {
        let off = self.next;
        match off.checked_add(len).map(|e| e.div_ceil(PAGE) * PAGE) {
            Some(end) if end <= self.len => {
                self.next = end;
                Ok(Region { off, len })
            }
            _ => Err(Error::Resources {
                msg: format!(
                    "arena of {} bytes has {} free; `{what}` needs {len}",
                    self.len,
                    self.len - self.next
                ),
            }),
        }
    }

    /// Commits the pages of `r` that hold its bytes `from..to` (clamped to the region), by
    /// faulting each in from user space with a write of zero. Only for pages never committed
    /// before: the write would clear what a committed page holds.
    pub fn commit(&mut self, r: Region, from: usize, to: usize) {
        let to = to.min(r.len);
        let first = (r.off + from).div_ceil(PAGE) * PAGE;
        let mut page = first;
        while page < r.off + to {
            // SAFETY: page lies inside the region, which lies inside the mapping.
            unsafe { std::ptr::write_volatile(self.base.add(page), 0u8) };
            page += PAGE;
        }
    }

    /// The address BPF programs use for byte `off` of region `r`.
    pub fn addr(&self, r: Region) -> u64 {
        self.base as u64 + r.off as u64
    }

    /// Region `r` as a typed slice.
    pub fn slice<T: bytemuck::Pod>(&self, r: Region) -> &[T] {
        assert!(r.off + r.len <= self.len && r.len % size_of::<T>() == 0);
        // SAFETY: in bounds, page aligned (so aligned for T), and every bit pattern is a valid T.
        unsafe {
            std::slice::from_raw_parts(self.base.add(r.off) as *const T, r.len / size_of::<T>())
        }
    }

    /// Region `r` as a typed mutable slice.
    pub fn slice_mut<T: bytemuck::Pod>(&mut self, r: Region) -> &mut [T] {
        assert!(r.off + r.len <= self.len && r.len % size_of::<T>() == 0);
        // SAFETY: as in `slice`, and &mut self makes the borrow exclusive on the user side.
        unsafe {
            std::slice::from_raw_parts_mut(self.base.add(r.off) as *mut T, r.len / size_of::<T>())
        }
    }
}

use std::mem::size_of;

/// The user-space address of libbpf's mmap of arena map `map` (libbpf maps arenas at load).
pub(crate) fn mapping(map: &libbpf_rs::Map<'_>) -> Result<*mut u8> {
    use libbpf_rs::AsRawLibbpf;
    let mut size = 0u64;
    // SAFETY: returns libbpf's mapping of the loaded map, or null; `size` is written.
    let base = unsafe {
        libbpf_rs::libbpf_sys::bpf_map__initial_value(map.as_libbpf_object().as_ptr(), &mut size)
    };
    if base.is_null() {
        return Err(Error::Bpf {
            what: "arena map".into(),
            detail: "libbpf did not mmap it".into(),
        });
    }
    Ok(base as *mut u8)
}
