//! The bpf(2) counter (`src/bpf/syscalls.bpf.c`): how many BPF system calls this process makes
//! while it is attached, e.g. to show that in-kernel generation needs none per token.

use std::mem::MaybeUninit;

use libbpf_rs::skel::{OpenSkel, SkelBuilder};
use libbpf_rs::OpenObject;

use super::load_error;
use super::skel::Owned;
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
    /// The link (detached first when dropped) and the skeleton.
    obj: Owned<(libbpf_rs::Link, SyscallsSkel<'static>)>,
}

impl BpfSyscalls {
    /// Loads and attaches the counter for this process.
    pub fn start() -> Result<BpfSyscalls> {
        if NR_BPF == u64::MAX {
            return Err(Error::Invalid(
                "counting bpf(2) calls: unknown system call number on this architecture".into(),
            ));
        }
        let obj = Owned::load(|storage| load(storage).map(|(skel, link)| (link, skel)))?;
        Ok(BpfSyscalls { obj })
    }

    /// bpf(2) calls of this process counted so far (read from the mapped .bss: no system call).
    pub fn count(&self) -> u64 {
        match self.obj.1.maps.bss_data.as_deref() {
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
