//! The BPF arena as user space sees it: one shared mapping, carved into buffers by a bump
//! allocator. BPF programs receive buffer addresses (user-space virtual addresses of the
//! mapping) through their ctx.

use crate::{Error, Result};

/// Arena page size.
pub const PAGE: usize = 4096;

/// Largest arena the kernel allows (4 GiB).
pub const MAX_ARENA_BYTES: usize = 1 << 32;

/// A region of the arena: byte offset and length, inside the arena that handed it out.
///
/// Only [`Arena::alloc`], [`Arena::reserve`] and [`Region::sub`] make regions, so a region never
/// extends past the arena it came from; [`Arena::slice`] checks it anyway (bounds against the
/// mapping, alignment and size for the element type), so that no safe call can create an invalid
/// reference, whatever region it is given.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Region {
    /// Offset from the arena's start.
    pub(crate) off: usize,
    /// Length in bytes.
    pub(crate) len: usize,
}

impl Region {
    /// Offset of the region from the arena's start, in bytes.
    pub fn off(self) -> usize {
        self.off
    }

    /// Length of the region in bytes.
    pub fn len(self) -> usize {
        self.len
    }

    /// Whether the region has no bytes.
    pub fn is_empty(self) -> bool {
        self.len == 0
    }

    /// The `len` bytes at byte offset `at` inside this region; [`Error::ArenaView`] if they do not
    /// lie inside it.
    pub fn sub(self, at: usize, len: usize) -> Result<Region> {
        match at.checked_add(len) {
            Some(end) if end <= self.len => Ok(Region {
                off: self.off + at,
                len,
            }),
            _ => Err(Error::ArenaView(format!(
                "sub-region of {len} bytes at {at} outside a region of {} bytes",
                self.len
            ))),
        }
    }

    /// The first `len` bytes of this region ([`Region::sub`] at 0).
    pub fn prefix(self, len: usize) -> Result<Region> {
        self.sub(0, len)
    }
}

/// User-space view of a BPF arena map: base address of libbpf's mmap and a bump allocator.
#[derive(Debug)]
pub struct Arena {
    base: *mut u8,
    len: usize,
    next: usize,
    /// The array memory layer's element size (0 in an arena): a region of at most this many
    /// bytes is never placed across an element's end, where the programs could not reach it
    /// whole (`src/bpf/mem.h`).
    elem: usize,
    /// The ends of elements that regions skipped (`off..end`, page aligned): later regions
    /// that fit go there first, so that skipping an end costs memory only while nothing fits.
    holes: Vec<(usize, usize)>,
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
        Arena {
            base,
            len,
            next: 0,
            elem: 0,
            holes: Vec::new(),
        }
    }

    /// [`Arena::new`] over the array memory layer's mapping, in elements of `elem` bytes (a
    /// power of two, at least a page).
    ///
    /// # Safety
    /// As [`Arena::new`].
    pub(crate) unsafe fn new_array(base: *mut u8, len: usize, elem: usize) -> Arena {
        debug_assert!(elem.is_power_of_two() && elem >= PAGE);
        Arena {
            base,
            len,
            next: 0,
            elem,
            holes: Vec::new(),
        }
    }

    /// The array memory layer's element size in bytes (0 in an arena).
    pub fn elem(&self) -> usize {
        self.elem
    }

    /// Whether `r` lies inside one element of the array memory layer (always in an arena): what
    /// a buffer a program reaches as one vector needs (`src/bpf/mem.h`).
    pub fn in_one_element(&self, r: Region) -> bool {
        self.elem == 0 || r.len == 0 || r.off / self.elem == (r.off + r.len - 1) / self.elem
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
        let mut off = self.next;
        // on array maps, a region that fits in an element starts the next one rather than
        // cross an element's end (or goes into a hole an earlier one left)
        if self.elem != 0 && len <= self.elem {
            if let Some(i) = self.holes.iter().position(|&(o, e)| e - o >= len) {
                let (o, e) = self.holes[i];
                let used = len.div_ceil(PAGE) * PAGE;
                if o + used < e {
                    self.holes[i].0 = o + used;
                } else {
                    self.holes.remove(i);
                }
                return Ok(Region { off: o, len });
            }
            if off % self.elem + len > self.elem {
                let end = off.next_multiple_of(self.elem);
                if off < end {
                    self.holes.push((off, end.min(self.len)));
                }
                off = end;
            }
        }
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
    /// before: the write would clear what a committed page holds. Pages outside the arena are
    /// skipped.
    pub fn commit(&mut self, r: Region, from: usize, to: usize) {
        let end = r.off.saturating_add(to.min(r.len)).min(self.len);
        let mut page = r.off.saturating_add(from).div_ceil(PAGE) * PAGE;
        while page < end {
            // SAFETY: page < end <= self.len: inside the mapping.
            unsafe { std::ptr::write_volatile(self.base.add(page), 0u8) };
            page += PAGE;
        }
    }

    /// The address BPF programs use for byte `off` of region `r`.
    pub fn addr(&self, r: Region) -> u64 {
        self.base as u64 + r.off as u64
    }

    /// The region of `len` bytes at address `addr`, the inverse of [`Arena::addr`]: what a
    /// program's ctx points at. [`Error::ArenaView`] unless it lies inside the mapping.
    pub fn region_at(&self, addr: u64, len: usize) -> Result<Region> {
        let off = addr.checked_sub(self.base as u64).map(|o| o as usize);
        match off {
            Some(off) if off.checked_add(len).is_some_and(|end| end <= self.len) => {
                Ok(Region { off, len })
            }
            _ => Err(Error::ArenaView(format!(
                "{len} bytes at address {addr:#x}: outside the arena of {} bytes",
                self.len
            ))),
        }
    }

    /// Checks that region `r` can be viewed as `[T]`: inside the mapping, a whole number of
    /// non-zero-sized `T`, and aligned for `T`. Returns the element count.
    fn check_view<T>(&self, r: Region) -> Result<usize> {
        let (size, align) = (size_of::<T>(), align_of::<T>());
        let refuse = |why: String| {
            Err(Error::ArenaView(format!(
                "{} bytes at offset {} as [{}]: {why}",
                r.len,
                r.off,
                std::any::type_name::<T>()
            )))
        };
        match r.off.checked_add(r.len) {
            Some(end) if end <= self.len => {}
            _ => return refuse(format!("outside the arena of {} bytes", self.len)),
        }
        if size == 0 {
            return refuse("zero-sized element type".into());
        }
        if r.len % size != 0 {
            return refuse(format!("not a multiple of the element size {size}"));
        }
        if (self.base as usize + r.off) % align != 0 {
            return refuse(format!("not aligned to {align} bytes"));
        }
        Ok(r.len / size)
    }

    /// Region `r` as a typed slice; [`Error::ArenaView`] if it lies outside the arena, is not a
    /// whole number of `T` or is misaligned for `T`.
    pub fn slice<T: bytemuck::Pod>(&self, r: Region) -> Result<&[T]> {
        let n = self.check_view::<T>(r)?;
        // SAFETY: check_view proved the n elements in bounds of the live mapping and aligned;
        // every bit pattern is a valid Pod T. The borrow of self keeps the mapping alive.
        Ok(unsafe { std::slice::from_raw_parts(self.base.add(r.off) as *const T, n) })
    }

    /// Region `r` as a typed mutable slice, checked as in [`Arena::slice`].
    pub fn slice_mut<T: bytemuck::Pod>(&mut self, r: Region) -> Result<&mut [T]> {
        let n = self.check_view::<T>(r)?;
        // SAFETY: as in `slice`, and &mut self makes the borrow exclusive on the user side.
        Ok(unsafe { std::slice::from_raw_parts_mut(self.base.add(r.off) as *mut T, n) })
    }
}

use std::mem::{align_of, size_of};

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

#[cfg(test)]
mod tests {
    use super::*;

    /// An arena over `words` u64s of ordinary memory (8-byte aligned), as the BPF mapping is.
    fn arena(words: &mut [u64]) -> Arena {
        // SAFETY: the buffer outlives the arena in every test below.
        unsafe { Arena::new(words.as_mut_ptr() as *mut u8, words.len() * 8) }
    }

    #[test]
    fn array_regions_never_cross_an_element_end_and_fill_the_holes_they_leave() {
        let mut words = vec![0u64; 12 * PAGE / 8];
        // SAFETY: the buffer outlives the arena; elements of four pages
        let mut a = unsafe { Arena::new_array(words.as_mut_ptr() as *mut u8, 12 * PAGE, 4 * PAGE) };
        let off = |r: Region| r.off / PAGE;
        assert_eq!(off(a.alloc(3 * PAGE, "a").unwrap()), 0);
        // two pages do not fit the first element's last: the second element, leaving a hole
        assert_eq!(off(a.alloc(2 * PAGE, "b").unwrap()), 4);
        // the hole takes what fits it
        assert_eq!(off(a.alloc(100, "c").unwrap()), 3);
        // larger than an element: placed where it falls, across an end (its rows are checked)
        assert_eq!(off(a.alloc(5 * PAGE, "d").unwrap()), 6);
        assert!(a.alloc(2 * PAGE, "e").is_err(), "one page left");
    }

    #[test]
    fn sub_past_the_end_is_refused() {
        let r = Region { off: 0, len: 64 };
        assert_eq!(r.sub(16, 48).unwrap(), Region { off: 16, len: 48 });
        assert!(matches!(r.sub(16, 49), Err(Error::ArenaView(_))));
        assert!(matches!(r.sub(65, 0), Err(Error::ArenaView(_))));
        assert!(matches!(r.sub(usize::MAX, 2), Err(Error::ArenaView(_))));
        assert!(matches!(r.prefix(65), Err(Error::ArenaView(_))));
    }

    #[test]
    fn views_outside_the_mapping_are_refused() {
        let mut mem = vec![0u64; 2 * PAGE / 8];
        let mut a = arena(&mut mem);
        let r = a.alloc(PAGE, "test").unwrap();
        assert_eq!(a.slice::<u32>(r).unwrap().len(), PAGE / 4);
        for bad in [
            Region {
                off: PAGE,
                len: PAGE + 4,
            },
            Region {
                off: 2 * PAGE,
                len: 4,
            },
            Region {
                off: usize::MAX - 3,
                len: 8,
            },
        ] {
            assert!(
                matches!(a.slice::<u8>(bad), Err(Error::ArenaView(_))),
                "{bad:?}"
            );
            assert!(
                matches!(a.slice_mut::<u8>(bad), Err(Error::ArenaView(_))),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn misaligned_or_partial_views_are_refused() {
        let mut mem = vec![0u64; PAGE / 8];
        let mut a = arena(&mut mem);
        let r = a.alloc(64, "test").unwrap();
        let odd = r.sub(1, 8).unwrap();
        assert!(matches!(a.slice::<u32>(odd), Err(Error::ArenaView(_))));
        assert!(matches!(a.slice_mut::<u64>(odd), Err(Error::ArenaView(_))));
        assert_eq!(a.slice::<u8>(odd).unwrap().len(), 8);
        let partial = r.sub(0, 6).unwrap();
        assert!(matches!(a.slice::<i32>(partial), Err(Error::ArenaView(_))));
        assert!(matches!(a.slice::<()>(r), Err(Error::ArenaView(_))));
        a.slice_mut::<i64>(r.sub(8, 16).unwrap()).unwrap()[1] = -1;
        assert_eq!(a.slice::<i64>(r).unwrap()[2], -1);
    }

    #[test]
    fn region_at_inverts_addr_inside_the_mapping_only() {
        let mut mem = vec![0u64; PAGE / 8];
        let mut a = arena(&mut mem);
        let r = a.alloc(64, "test").unwrap().sub(8, 16).unwrap();
        assert_eq!(
            a.region_at(a.addr(r), 16).unwrap(),
            r,
            "an address back to its region"
        );
        let end = a.addr(Region::default()) + PAGE as u64;
        assert!(a.region_at(end, 0).is_ok(), "an empty region at the end");
        for (addr, len) in [(end, 1), (end - 4, 8), (0, 4), (u64::MAX, 2)] {
            assert!(
                matches!(a.region_at(addr, len), Err(Error::ArenaView(_))),
                "{len} bytes at {addr:#x}"
            );
        }
    }

    #[test]
    fn on_array_maps_no_region_that_fits_an_element_crosses_one() {
        const E: usize = 2 * PAGE;
        let mut mem = vec![0u64; 4 * E / 8];
        // SAFETY: the buffer outlives the arena.
        let mut a = unsafe { Arena::new_array(mem.as_mut_ptr() as *mut u8, 4 * E, E) };
        assert_eq!(a.alloc(100, "a").unwrap().off, 0);
        assert_eq!(a.alloc(PAGE, "b").unwrap().off, PAGE, "it fits before the element's end");
        let moved = a.alloc(PAGE + 8, "c").unwrap();
        assert_eq!(moved.off, E, "one that would cross starts the next element");
        let big = a.reserve(E + 8, "d").unwrap();
        assert_eq!(big.off, 2 * E, "one larger than an element is not moved");
        let e = a.alloc(E, "e");
        assert!(e.is_err(), "moved past the end: an error, not a region outside ({e:?})");
        // in an arena nothing moves
        let mut mem2 = vec![0u64; 3 * E / 8];
        let mut b = arena(&mut mem2);
        b.alloc(100, "a").unwrap();
        b.alloc(PAGE, "b").unwrap();
        assert_eq!(b.alloc(PAGE + 8, "c").unwrap().off, 2 * PAGE);
    }

    #[test]
    fn commit_stays_inside_the_mapping() {
        let mut mem = vec![7u64; 2 * PAGE / 8];
        let mut a = arena(&mut mem);
        a.commit(
            Region {
                off: PAGE,
                len: 8 * PAGE,
            },
            0,
            8 * PAGE,
        );
        assert_eq!(mem[PAGE / 8], 0, "the page inside the arena was faulted in");
        assert_eq!(mem[0], 7, "the page before the region was left alone");
    }
}
