//! The capability probe (`src/bpf/probe.bpf.c`): loads a tiny syscall program that sums 64
//! numbers from an arena with `bpf_loop`, and checks the answer. Run when a model is opened.

use std::mem::MaybeUninit;
use std::os::fd::AsFd;

use libbpf_rs::OpenObject;

use super::{load_skel, test_run};
use crate::{Error, Result};

skel_module!(mod "probe.skel.rs");
use skel::{types::probe_args, ProbeSkelBuilder};

/// Proves that BPF syscall programs, `bpf_loop` and arenas work for this process.
/// Returns a typed error naming the missing capability or kernel feature otherwise.
pub fn probe() -> Result<()> {
    let mut storage = MaybeUninit::<OpenObject>::uninit();
    let skel = load_skel(
        ProbeSkelBuilder::default(),
        &mut storage,
        "the probe program",
    )?;
    let base = super::arena::mapping(&skel.maps.probe_arena)? as *mut u32;
    // SAFETY: 64 u32 inside the one-page mapping.
    let buf = unsafe { std::slice::from_raw_parts_mut(base, 64) };
    for (i, v) in buf.iter_mut().enumerate() {
        *v = (i as u32 + 1) * 3;
    }
    let mut args = probe_args {
        buf: base as u64,
        n: 64,
        ..Default::default()
    };
    test_run(skel.progs.probe.as_fd(), "probe", &mut args)?;
    let want: u64 = (1..=64u64).map(|i| i * 3).sum();
    if args.r#loop != 64 || args.sum != want {
        return Err(Error::Bpf {
            what: "probe".into(),
            detail: format!(
                "bpf_loop returned {} (want 64), arena sum {} (want {want})",
                args.r#loop, args.sum
            ),
        });
    }
    Ok(())
}
