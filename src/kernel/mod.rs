//! The kernel side: BPF objects built from `src/bpf/*.bpf.c`, the arena they share with user
//! space, and running `SEC("syscall")` programs with `test_run`.
//!
//! One module per BPF object: [`probe`] (can this process use BPF here?) and [`ops`] (every
//! operator of the forward pass).

pub mod arena;
pub mod ops;
pub mod probe;
pub mod swar_ops;

use std::mem::size_of;
use std::os::fd::{AsRawFd, BorrowedFd};

use libbpf_rs::libbpf_sys;

use crate::{Error, Result};

/// The capabilities a process needs to load and run qwen_bpf's programs.
pub const CAPABILITIES: &str = "CAP_BPF and CAP_PERFMON";

/// Runs syscall program `prog` once with `args` as its in/out ctx; returns the program's return
/// value. `what` names the program in errors.
pub(crate) fn test_run<T>(prog: BorrowedFd<'_>, what: &str, args: &mut T) -> Result<i32> {
    let mut opts: libbpf_sys::bpf_test_run_opts = unsafe { std::mem::zeroed() };
    opts.sz = size_of::<libbpf_sys::bpf_test_run_opts>() as _;
    opts.ctx_in = args as *mut T as *const _;
    opts.ctx_size_in = size_of::<T>() as u32;
    // SAFETY: ctx_in points at a live, writable T of ctx_size_in bytes; the kernel copies the
    // (possibly modified) ctx back into it.
    let rc = unsafe { libbpf_sys::bpf_prog_test_run_opts(prog.as_raw_fd(), &mut opts) };
    if rc != 0 {
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::EPERM) {
            return Err(Error::Privileges { what: format!("running BPF program `{what}`"), capability: CAPABILITIES });
        }
        return Err(Error::Bpf { what: format!("test_run of `{what}`"), detail: e.to_string() });
    }
    Ok(opts.retval as i32)
}

/// Checks, before loading anything, that the kernel has what qwen_bpf needs and that this
/// process may use it. Missing privileges and missing features become distinct typed errors.
pub fn check_kernel() -> Result<()> {
    // SAFETY: plain probe calls without pointers.
    let arena = unsafe { libbpf_sys::libbpf_probe_bpf_map_type(33 /* BPF_MAP_TYPE_ARENA */, std::ptr::null()) };
    let syscall_prog = unsafe { libbpf_sys::libbpf_probe_bpf_prog_type(libbpf_sys::BPF_PROG_TYPE_SYSCALL, std::ptr::null()) };
    let bpf_loop = unsafe {
        libbpf_sys::libbpf_probe_bpf_helper(libbpf_sys::BPF_PROG_TYPE_SYSCALL, libbpf_sys::BPF_FUNC_loop, std::ptr::null())
    };
    for r in [arena, syscall_prog, bpf_loop] {
        if r == -libc::EPERM || r == -libc::EACCES {
            return Err(Error::Privileges { what: "probing BPF features".into(), capability: CAPABILITIES });
        }
    }
    let missing = |feature: &'static str, needs: &'static str, r: i32| Error::KernelFeature {
        what: "probing BPF features".into(),
        feature,
        needs,
        detail: if r < 0 { std::io::Error::from_raw_os_error(-r).to_string() } else { "not supported".into() },
    };
    if syscall_prog != 1 {
        return Err(missing("BPF_PROG_TYPE_SYSCALL programs", "Linux >= 5.14", syscall_prog));
    }
    if bpf_loop != 1 {
        return Err(missing("the bpf_loop helper", "Linux >= 5.17", bpf_loop));
    }
    if arena != 1 {
        return Err(missing("BPF arena maps", "Linux >= 6.9 with CONFIG_BPF_SYSCALL and an MMU", arena));
    }
    Ok(())
}

/// Turns a libbpf-rs failure while opening or loading `what` into the crate's error.
pub(crate) fn load_error(what: &str, e: libbpf_rs::Error) -> Error {
    // EPERM is a missing capability; EACCES at load is the verifier's rejection.
    if e.kind() == libbpf_rs::ErrorKind::PermissionDenied && format!("{e:#}").contains("os error 1)") {
        return Error::Privileges { what: format!("loading {what}"), capability: CAPABILITIES };
    }
    Error::Bpf { what: format!("loading {what}"), detail: format!("{e:#}") }
}
