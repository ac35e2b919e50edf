//! Running one program on several threads at once: one `test_run` per thread, each pinned to a
//! CPU of its own, and multi-threaded runs of every model in the process taking turns.

use std::os::fd::BorrowedFd;

use super::test_run;
use crate::{Error, Result};

/// Runs `prog` once per element of `args`, concurrently (one thread each) when there are several;
/// multi-threaded runs of every model in the process take turns ([`PLAN_THREADS_LOCK`]).
pub(super) fn run_threads<T: Send>(prog: BorrowedFd<'_>, name: &str, args: &mut [T]) -> Vec<Result<i32>> {
    match args {
        [] => vec![],
        [one] => vec![test_run(prog, name, one)],
        [first, rest @ ..] => {
            let _one_at_a_time = PLAN_THREADS_LOCK.lock();
            // Each worker on a CPU other than this thread's, so that none is queued behind a
            // thread that spins in the kernel without preemption, and this thread enters the
            // kernel only once they are about to.
            let cpus = other_cpus();
            let ready = std::sync::atomic::AtomicUsize::new(0);
            std::thread::scope(|s| {
                let others: Vec<_> = rest
                    .iter_mut()
                    .enumerate()
                    .map(|(i, a)| {
                        let (cpus, ready) = (&cpus, &ready);
                        s.spawn(move || {
                            if !cpus.is_empty() {
                                pin_to(cpus[i % cpus.len()]);
                            }
                            ready.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                            test_run(prog, name, a)
                        })
                    })
                    .collect();
                let t = std::time::Instant::now();
                while ready.load(std::sync::atomic::Ordering::SeqCst) < others.len()
                    && t.elapsed() < std::time::Duration::from_millis(100)
                {
                    std::thread::yield_now();
                }
                let mut rcs = vec![test_run(prog, name, first)];
                rcs.extend(others.into_iter().map(|h| {
                    h.join().unwrap_or_else(|_| {
                        Err(Error::Bpf {
                            what: name.into(),
                            detail: "worker thread panicked".into(),
                        })
                    })
                }));
                rcs
            })
        }
    }
}

/// The CPUs this thread may run on, but the one it runs on now.
fn other_cpus() -> Vec<usize> {
    // SAFETY: sched_getcpu takes nothing; sched_getaffinity fills a zeroed cpu_set_t of the
    // size given.
    unsafe {
        let here = libc::sched_getcpu();
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            return Vec::new();
        }
        (0..libc::CPU_SETSIZE as usize)
            .filter(|&c| libc::CPU_ISSET(c, &set) && c as i32 != here)
            .collect()
    }
}

/// Pins this thread to `cpu` (best effort: a failure leaves it where the scheduler puts it).
fn pin_to(cpu: usize) {
    // SAFETY: a zeroed cpu_set_t with one bit set, applied to this thread.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
}

/// Multi-threaded plan runs of every model in the process take turns: two models' threads
/// spinning at their barriers on all CPUs at once would wait for each other until they time out.
static PLAN_THREADS_LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
