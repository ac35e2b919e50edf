//! The capability probe runs for real: these tests need root (or CAP_BPF + CAP_PERFMON) and a
//! kernel with arenas, and fail loudly otherwise.

#[test]
fn probe_loads_runs_and_sums_through_the_arena() {
    qwen_bpf::kernel::probe::probe().expect("BPF probe: syscall program + bpf_loop + arena");
}

/// The multiply-peak program (the benches' floor) computes its six chains exactly: every run is
/// checked against the twin inside `run`, and the chains' values are checked here against a
/// multiply loop written out, for a run shorter than one program run, for two threads, and for a
/// count that needs a full run plus a tail.
#[test]
fn mul_peak_runs_the_multiplies_its_twin_computes() {
    use qwen_bpf::kernel::floor::{mul_peak_twin, with_mul_peak, ITERS_PER_RUN, MULS_PER_ITER, X};

    // the twin against the loop it stands for: c_j <- c_j * X, twice per iteration
    let mut c = [1u64, 2, 3, 4, 5, 6];
    for _ in 0..2 * 1000 {
        c.iter_mut().for_each(|c| *c = c.wrapping_mul(X));
    }
    assert_eq!(
        mul_peak_twin(1000),
        c.iter().fold(0, |a, c| a ^ c),
        "mul_peak_twin(1000) vs six chains multiplied out"
    );
    with_mul_peak(|peak| {
        assert_eq!(
            peak.run(1000 * MULS_PER_ITER, 1)?,
            1000 * MULS_PER_ITER,
            "one short run"
        );
        assert_eq!(
            peak.run(13, 2)?,
            2 * MULS_PER_ITER,
            "rounded up to whole iterations per thread"
        );
        let n = (ITERS_PER_RUN + 5) * MULS_PER_ITER;
        assert_eq!(
            peak.run(n, 1)?,
            n,
            "a full run and a tail of five iterations"
        );
        assert!(peak.run(1, 0).is_err(), "zero threads is refused");
        Ok(())
    })
    .expect("the multiply-peak program loads and runs");
}
