//! The bpf(2) counter (`src/bpf/syscalls.bpf.c`): how many BPF system calls this process makes
//! while it is attached, e.g. to show that in-kernel generation needs none per token.

use std::mem::{ManuallyDrop, MaybeUninit};

use libbpf_rs::skel::{OpenSkel, SkelBuilder};
use libbpf_rs::OpenObject;

use super::load_error;
use crate::{Error, Result};

skel_module!(mod "syscalls.skel.rs");
use skel::{SyscallsSkel, SyscallsSkelBuilder};

/// `__NR_bpf` of the architecture this was built for.
const NR_BPF: u64 = if cfg!(target_arch = "x86_64") {
    321
} else if cfg!(target_arch = "aarch64") {
    280
} else {
    u64::MAX
};

/// Counts this process's bpf(2) calls from [`BpfSyscalls::start`] until it is dropped
/// (its own loading and attaching come before the count starts).
pub struct BpfSyscalls {
    skel: ManuallyDrop<SyscallsSkel<'static>>,
    storage: *mut MaybeUninit<OpenObject>,
    _link: ManuallyDrop<libbpf_rs::Link>,
}

// SAFETY: as for `Ops`: the skeleton is Send and `storage` is owned by this value.
unsafe impl Send for BpfSyscalls {}

impl BpfSyscalls {
    /// Loads and attaches the counter for this process.
    pub fn start() -> Result<BpfSyscalls> {
        if NR_BPF == u64::MAX {
            return Err(Error::Invalid(
                "counting bpf(2) calls: unknown system call number on this architecture".into(),
            ));
        }
        let storage = Box::into_raw(Box::new(MaybeUninit::<OpenObject>::uninit()));
        // SAFETY: storage stays allocated until Drop, after the skeleton that borrows it.
        let storage_ref: &'static mut MaybeUninit<OpenObject> = unsafe { &mut *storage };
        let loaded = load(storage_ref);
        match loaded {
            Ok((skel, link)) => Ok(BpfSyscalls {
                skel: ManuallyDrop::new(skel),
                storage,
                _link: ManuallyDrop::new(link),
            }),
            Err(e) => {
                // SAFETY: nothing borrows storage any more.
                drop(unsafe { Box::from_raw(storage) });
                Err(e)
            }
        }
    }

    /// bpf(2) calls of this process counted so far (read from the mapped .bss: no system call).
    pub fn count(&self) -> u64 {
        match self.skel.maps.bss_data.as_deref() {
            // SAFETY: a u64 the program updates atomically; read once.
            Some(bss) => unsafe { std::ptr::read_volatile(&bss.bpf_calls) },
            None => 0,
        }
    }
}

fn load(
    storage: &'static mut MaybeUninit<OpenObject>,
) -> Result<(SyscallsSkel<'static>, libbpf_rs::Link)> {
    let mut open = SyscallsSkelBuilder::default()
        .open(storage)
        .map_err(|e| load_error("the bpf(2) counter", e))?;
    let ro = open
        .maps
        .rodata_data
        .as_deref_mut()
        .ok_or_else(|| Error::Bpf {
            what: "the bpf(2) counter".into(),
            detail: "no .rodata".into(),
        })?;
    ro.tgid = std::process::id();
    ro.nr_bpf = NR_BPF;
    let skel = open
        .load()
        .map_err(|e| load_error("the bpf(2) counter", e))?;
    let link = skel
        .progs
        .count_bpf
        .attach()
        .map_err(|e| load_error("the bpf(2) counter's raw tracepoint", e))?;
    Ok((skel, link))
}

impl Drop for BpfSyscalls {
    fn drop(&mut self) {
        // SAFETY: the link and the skeleton borrow *storage, so they go first.
        unsafe {
            ManuallyDrop::drop(&mut self._link);
            ManuallyDrop::drop(&mut self.skel);
            drop(Box::from_raw(self.storage));
        }
    }
}
