//! The kernel side: BPF objects built from `src/bpf/*.bpf.c`, the arena they share with user
//! space, and running `SEC("syscall")` programs with `test_run`.
//!
//! One module per BPF object: [`probe`] (can this process use BPF here?), [`floor`] (the BPF
//! multiply peak, for benches) and [`ops`] (every operator of the forward pass), whose low-bit
//! SWAR programs have their methods in [`swar_ops`]; [`arena`] is the user-space view of the
//! shared memory, and [`memory`] the layer (arena or array maps) it is shared through.

/// `[vis] mod skel`: the libbpf-rs skeleton that build.rs generated for one BPF object
/// (`$OUT_DIR/<file>`), with the lints that generated code does not meet allowed.
macro_rules! skel_module {
    ($vis:vis mod $file:literal) => {
        $vis mod skel {
            #![allow(
                missing_docs,
                clippy::all,
                non_camel_case_types,
                dead_code,
                unused_imports
            )]
            include!(concat!(env!("OUT_DIR"), "/", $file));
        }
    };
}

pub mod arena;
pub mod drivers;
pub mod features;
pub mod filter;
pub mod floor;
pub mod memory;
pub mod operators;
pub mod ops;
pub mod pins;
pub mod plan;
pub mod probe;
pub mod report;
pub mod ring;
mod skel;
pub mod swar_ops;
pub mod syscalls;
mod threads;
pub mod tokenize;
pub mod verifier;

use std::mem::{size_of, MaybeUninit};
use std::os::fd::{AsRawFd, BorrowedFd};

use libbpf_rs::libbpf_sys;
use libbpf_rs::skel::{OpenSkel, SkelBuilder};
use libbpf_rs::OpenObject;

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
            return Err(Error::Privileges {
                what: format!("running BPF program `{what}`"),
                capability: CAPABILITIES,
            });
        }
        return Err(Error::Bpf {
            what: format!("test_run of `{what}`"),
            detail: e.to_string(),
        });
    }
    Ok(opts.retval as i32)
}

/// What [`check_kernel`] asks the kernel, as raw answers: libbpf's feature probes (1 supported,
/// 0 not, negative an errno) and the calling thread's effective capabilities.
///
/// libbpf's probes cannot tell "not supported" from "not allowed": without CAP_BPF every probe
/// answers 0. [`classify`] therefore consults the capabilities before blaming the kernel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProbeResults {
    /// Creating a one-page arena map: 1, or the negative errno of the refusal (unlike libbpf's
    /// probe, which answers 0 for every failure, this tells EPERM from EINVAL).
    pub arena: i32,
    /// `libbpf_probe_bpf_prog_type(BPF_PROG_TYPE_SYSCALL)`.
    pub syscall_prog: i32,
    /// `libbpf_probe_bpf_helper(BPF_PROG_TYPE_SYSCALL, BPF_FUNC_loop)`.
    pub bpf_loop: i32,
    /// The effective capability set (`CapEff` of `/proc/thread-self/status`), when readable.
    pub cap_eff: Option<u64>,
    /// The kernel's release (`uname -r`), when known.
    pub release: Option<String>,
}

/// The first kernel with BPF arena maps.
pub const ARENA_SINCE: (u32, u32) = (6, 9);

/// `(major, minor)` of a kernel release such as `6.18.44-fc-v1272` or `7.3.4+deb13-amd64`.
pub fn release_version(release: &str) -> Option<(u32, u32)> {
    let mut it = release.split(|c: char| !c.is_ascii_digit());
    Some((it.next()?.parse().ok()?, it.next()?.parse().ok()?))
}

/// The running kernel's release (`uname -r`).
pub fn kernel_release() -> Option<String> {
    std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .ok()
        .map(|s| s.trim().to_string())
}

/// Creates (and closes) a one-page BPF arena map: 1, or the kernel's negative errno.
pub fn probe_arena() -> i32 {
    let mut opts: libbpf_sys::bpf_map_create_opts = unsafe { std::mem::zeroed() };
    opts.sz = size_of::<libbpf_sys::bpf_map_create_opts>() as _;
    opts.map_flags = libbpf_sys::BPF_F_MMAPABLE;
    // SAFETY: a map create with a valid opts struct and no name; the fd is closed below.
    let fd = unsafe {
        libbpf_sys::bpf_map_create(33 /* BPF_MAP_TYPE_ARENA */, std::ptr::null(), 0, 0, 1, &opts)
    };
    if fd < 0 {
        return if fd == -1 {
            -std::io::Error::last_os_error().raw_os_error().unwrap_or(libc::EINVAL)
        } else {
            fd
        };
    }
    // SAFETY: fd is ours and open.
    unsafe { libc::close(fd) };
    1
}

/// Capability numbers from `linux/capability.h`.
pub const CAP_SYS_ADMIN: u32 = 21;
/// `CAP_PERFMON` (Linux >= 5.8).
pub const CAP_PERFMON: u32 = 38;
/// `CAP_BPF` (Linux >= 5.8).
pub const CAP_BPF: u32 = 39;

/// Runs libbpf's feature probes and reads the capabilities (see [`ProbeResults`]).
pub fn probe_results() -> ProbeResults {
    let arena = probe_arena();
    // SAFETY: plain probe calls without pointers.
    let syscall_prog = unsafe {
        libbpf_sys::libbpf_probe_bpf_prog_type(libbpf_sys::BPF_PROG_TYPE_SYSCALL, std::ptr::null())
    };
    let bpf_loop = unsafe {
        libbpf_sys::libbpf_probe_bpf_helper(
            libbpf_sys::BPF_PROG_TYPE_SYSCALL,
            libbpf_sys::BPF_FUNC_loop,
            std::ptr::null(),
        )
    };
    let cap_eff = std::fs::read_to_string("/proc/thread-self/status")
        .or_else(|_| std::fs::read_to_string("/proc/self/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("CapEff:").map(|v| v.trim().to_string()))
        })
        .and_then(|v| u64::from_str_radix(&v, 16).ok());
    ProbeResults {
        release: kernel_release(),
        arena,
        syscall_prog,
        bpf_loop,
        cap_eff,
    }
}

/// Turns probe answers into the crate's verdict: [`Error::Privileges`] naming the missing
/// capabilities when the process lacks CAP_BPF or CAP_PERFMON (CAP_SYS_ADMIN implies both; both
/// are needed: without CAP_PERFMON the programs are refused at load even though libbpf's probes
/// pass), `Ok` when all three features answered 1, [`Error::Refused`] when a kernel that has
/// arenas (>= 6.9) refused one, [`Error::Privileges`] when a probe was refused (EPERM/EACCES)
/// otherwise, and else [`Error::KernelFeature`] naming the first missing feature.
pub fn classify(p: &ProbeResults) -> Result<()> {
    let what = "probing BPF features";
    if let Some(caps) = p.cap_eff {
        let has = |c: u32| caps & (1 << c) != 0 || caps & (1 << CAP_SYS_ADMIN) != 0;
        let capability = match (has(CAP_BPF), has(CAP_PERFMON)) {
            (false, false) => Some(CAPABILITIES),
            (false, true) => Some("CAP_BPF"),
            (true, false) => Some("CAP_PERFMON"),
            (true, true) => None,
        };
        if let Some(capability) = capability {
            return Err(Error::Privileges {
                what: what.into(),
                capability,
            });
        }
    }
    if p.arena == 1 && p.syscall_prog == 1 && p.bpf_loop == 1 {
        return Ok(());
    }
    // An arena refused on a kernel that has arenas: a policy or a capability, said as such
    // (not "this kernel lacks arenas", which sends the user after the wrong cause).
    let refused = |r: i32| r == -libc::EPERM || r == -libc::EACCES;
    if refused(p.arena) && p.syscall_prog == 1 && p.bpf_loop == 1 {
        if let Some(release) = &p.release {
            if release_version(release).is_some_and(|v| v >= ARENA_SINCE) {
                return Err(Error::Refused {
                    what: what.into(),
                    feature: "a BPF arena",
                    plural: "arenas",
                    since: "6.9",
                    kernel: release.clone(),
                    detail: std::io::Error::from_raw_os_error(-p.arena).to_string(),
                });
            }
        }
    }
    for r in [p.arena, p.syscall_prog, p.bpf_loop] {
        if refused(r) {
            return Err(Error::Privileges {
                what: what.into(),
                capability: CAPABILITIES,
            });
        }
    }
    let missing = |feature: &'static str, needs: &'static str, r: i32| Error::KernelFeature {
        what: what.into(),
        feature,
        needs,
        detail: if r < 0 {
            std::io::Error::from_raw_os_error(-r).to_string()
        } else {
            "not supported".into()
        },
    };
    if p.syscall_prog != 1 {
        return Err(missing(
            "BPF_PROG_TYPE_SYSCALL programs",
            "Linux >= 5.14",
            p.syscall_prog,
        ));
    }
    if p.bpf_loop != 1 {
        return Err(missing("the bpf_loop helper", "Linux >= 5.17", p.bpf_loop));
    }
    Err(missing(
        "BPF arena maps",
        "Linux >= 6.9 with CONFIG_BPF_SYSCALL and an MMU",
        p.arena,
    ))
}

/// Checks, before loading anything, that the kernel has what qwen_bpf needs and that this
/// process may use it: syscall programs, `bpf_loop` and BPF arenas, with CAP_BPF and
/// CAP_PERFMON. Missing privileges ([`Error::Privileges`]), an arena refused by a kernel that has
/// them ([`Error::Refused`]: a policy) and a kernel too old ([`Error::KernelFeature`]) are
/// distinct typed errors. [`probe`](crate::probe) reports every facility.
pub fn check_kernel() -> Result<()> {
    classify(&probe_results())
}

/// Checks the kernel ([`check_kernel`]), then opens and loads the skeleton `builder` makes in
/// `storage`, for the objects that need no set-up between the two; `what` names it in errors.
pub(crate) fn load_skel<'obj, B: SkelBuilder<'obj>>(
    builder: B,
    storage: &'obj mut MaybeUninit<OpenObject>,
    what: &str,
) -> Result<<B::Output as OpenSkel<'obj>>::Output> {
    check_kernel()?;
    let open = builder.open(storage).map_err(|e| load_error(what, e))?;
    verifier::load_explained(|| open.load()).map_err(|(e, why)| load_refused(what, e, why))
}

/// [`load_error`], naming the program the verifier refused and its last line when known
/// (from [`verifier::load_explained`]), with the kernel's release.
pub(crate) fn load_refused(what: &str, e: libbpf_rs::Error, why: Option<(String, String)>) -> Error {
    match (load_error(what, e), why) {
        (Error::Bpf { what, detail }, Some((prog, line))) => Error::Bpf {
            what,
            detail: format!(
                "kernel {}'s verifier refused program `{prog}`: {line} ({detail}; \
                 `qwen-bpf doctor --programs -v` prints every program's answer)",
                kernel_release().unwrap_or_else(|| "(unknown)".into())
            ),
        },
        (other, _) => other,
    }
}

/// Turns a libbpf-rs failure while opening or loading `what` into the crate's error.
pub(crate) fn load_error(what: &str, e: libbpf_rs::Error) -> Error {
    // EPERM is a missing capability; EACCES at load is the verifier's rejection.
    if e.kind() == libbpf_rs::ErrorKind::PermissionDenied
        && format!("{e:#}").contains("os error 1)")
    {
        return Error::Privileges {
            what: format!("loading {what}"),
            capability: CAPABILITIES,
        };
    }
    Error::Bpf {
        what: format!("loading {what}"),
        detail: format!("{e:#}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALL: u64 = (1 << CAP_BPF) | (1 << CAP_PERFMON);

    fn probe(arena: i32, release: &str) -> ProbeResults {
        ProbeResults {
            arena,
            syscall_prog: 1,
            bpf_loop: 1,
            cap_eff: Some(ALL),
            release: Some(release.into()),
        }
    }

    #[test]
    fn kernel_releases_parse_to_major_and_minor() {
        assert_eq!(release_version("6.18.44-fc-v1272"), Some((6, 18)));
        assert_eq!(release_version("7.3.4+deb13-amd64"), Some((7, 3)));
        assert_eq!(release_version("6.1.0-57-amd64"), Some((6, 1)));
        assert_eq!(release_version("5"), None);
        assert_eq!(release_version(""), None);
    }

    #[test]
    fn an_arena_refused_on_a_kernel_that_has_arenas_is_a_policy_not_an_old_kernel() {
        let msg = classify(&probe(-libc::EPERM, "6.18.44-fc-v1272"))
            .unwrap_err()
            .to_string();
        assert!(
            msg.contains("the kernel refused a BPF arena: Operation not permitted")
                && msg.contains("kernel 6.18.44-fc-v1272 supports arenas (Linux >= 6.9), so a security policy or a missing capability forbids it"),
            "{msg}"
        );
        assert!(!msg.contains("lacks"), "{msg}");
        // EACCES (an LSM's usual answer) is the same cause
        assert!(matches!(
            classify(&probe(-libc::EACCES, "7.3.4+deb13-amd64")),
            Err(Error::Refused { .. })
        ));
        // a kernel before arenas that refuses the map type: an old kernel, named with the first
        // one that has them
        let msg = classify(&probe(-libc::EINVAL, "6.1.0-57-amd64"))
            .unwrap_err()
            .to_string();
        assert!(msg.contains("this kernel lacks BPF arena maps (needs Linux >= 6.9"), "{msg}");
        // EPERM on a kernel before 6.9 or of unknown release: privileges, as before
        assert!(matches!(
            classify(&probe(-libc::EPERM, "6.1.0-57-amd64")),
            Err(Error::Privileges { .. })
        ));
        assert!(classify(&probe(1, "6.12.57+deb12-amd64")).is_ok());
    }
}
