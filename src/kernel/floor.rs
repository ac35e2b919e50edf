//! The BPF multiply peak (`src/bpf/floor.bpf.c`): how many 64-bit multiplies per second this
//! machine's JIT-compiled BPF code issues, the floor under every kernel of the forward pass.
//! Benches divide a kernel's multiplies by it to say how close the kernel is to the limit
//! (`cargo bench --bench depth -- floor`).

use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd};

use libbpf_rs::OpenObject;

use super::{load_skel, test_run};
use crate::{Error, Result};

skel_module!(mod "floor.skel.rs");
use skel::{types::mul_peak_args, FloorSkelBuilder};

/// Multiplies per iteration of the program's loop.
pub const MULS_PER_ITER: u64 = 12;
/// Iterations per program run (`MUL_PEAK_ITERS_MAX` in floor.bpf.c).
pub const ITERS_PER_RUN: u64 = 4_000_000;
/// The chains' multiplier: odd, so that no chain reaches zero.
pub const X: u64 = 0x9e37_79b9_7f4a_7c15;

/// The loaded multiply-peak program, lent to the closure of [`with_mul_peak`].
pub struct MulPeak<'a> {
    prog: BorrowedFd<'a>,
}

/// Loads the multiply-peak program, hands it to `f`, and releases it when `f` returns.
pub fn with_mul_peak<T>(f: impl FnOnce(&MulPeak<'_>) -> Result<T>) -> Result<T> {
    let mut storage = MaybeUninit::<OpenObject>::uninit();
    let skel = load_skel(
        FloorSkelBuilder::default(),
        &mut storage,
        "the multiply-peak program",
    )?;
    f(&MulPeak {
        prog: skel.progs.mul_peak.as_fd(),
    })
}

/// The twin of one run of `iters` iterations: `xor_j (j + 1) * (X^2)^iters` (mod 2^64).
pub fn mul_peak_twin(iters: u32) -> u64 {
    let p = X.wrapping_mul(X).wrapping_pow(iters);
    (1..=6u64).fold(0, |acc, j| acc ^ j.wrapping_mul(p))
}

impl MulPeak<'_> {
    /// Runs at least `multiplies` 64-bit multiplies in BPF (rounded up to whole iterations),
    /// split evenly over `threads` threads, each thread's share in runs of at most
    /// [`ITERS_PER_RUN`] iterations. Every run's result is checked against its twin; returns
    /// the multiplies done.
    pub fn run(&self, multiplies: u64, threads: usize) -> Result<u64> {
        if threads == 0 {
            return Err(Error::InvalidParameter {
                name: "threads",
                value: 0.0,
                expected: "at least one thread",
            });
        }
        let per_thread = multiplies.div_ceil(threads as u64).div_ceil(MULS_PER_ITER);
        let work = || -> Result<()> {
            let mut left = per_thread;
            while left > 0 {
                let iters = left.min(ITERS_PER_RUN) as u32;
                let mut args = mul_peak_args {
                    x: X,
                    iters,
                    ..Default::default()
                };
                let rc = test_run(self.prog, "mul_peak", &mut args)?;
                let want = mul_peak_twin(iters); // about 25 multiplies: square and multiply
                if rc != 0 || args.out != want {
                    return Err(Error::Bpf {
                        what: "mul_peak".into(),
                        detail: format!(
                            "{iters} iterations: returned {rc}, chains {:#x} (twin {want:#x})",
                            args.out
                        ),
                    });
                }
                left -= u64::from(iters);
            }
            Ok(())
        };
        std::thread::scope(|s| {
            let handles: Vec<_> = (1..threads).map(|_| s.spawn(work)).collect();
            let mine = work();
            handles
                .into_iter()
                .map(|h| h.join().expect("a multiply-peak thread panicked"))
                .chain([mine])
                .collect::<Result<Vec<()>>>()
        })?;
        Ok(per_thread * MULS_PER_ITER * threads as u64)
    }
}
