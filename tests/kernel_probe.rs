//! The capability probe runs for real: these tests need root (or CAP_BPF + CAP_PERFMON) and a
//! kernel with arenas, and fail loudly otherwise.

#[test]
fn probe_loads_runs_and_sums_through_the_arena() {
    qwen_bpf::kernel::probe::probe().expect("BPF probe: syscall program + bpf_loop + arena");
}
