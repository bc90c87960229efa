//! Where the fault thread and the evictor run: on one CPU, chosen by the process id among
//! those the process may use.
//!
//! The evictor's UFFDIO_MOVEs flush the TLB of every CPU the process is running on, and the
//! fault thread, polling for the next fault, is nearly always running; on different CPUs each
//! MOVE interrupted the fault thread's CPU and waited for it. Measured (2026-11-27, a 2-vCPU
//! VM, a 1 GiB stride-10 scan at 513 MiB, host tier, threads pinned by hand after start, one
//! run each): fault thread and evictor on one CPU, the program anywhere, 2.6 µs an access
//! (19–21 k faults); left to the scheduler 6.2 µs (71 k); fault thread and evictor on
//! different CPUs 7.0 µs (86 k); the other runtime threads pinned or not made no difference.
//! The program's threads stay where the scheduler puts them. The CPU follows the process id,
//! so that the runtimes of a process tree (each forked child pages with its own threads) are
//! spread over the CPUs instead of all sharing the one the parent was on when it forked.

use nix::sched::{sched_getaffinity, sched_setaffinity, CpuSet};
use nix::unistd::Pid;

/// The CPU for the fault thread and the evictor: one of those the calling thread may run on,
/// by the process id, when there are several (with one there is nothing to choose). None
/// when they cannot be read.
pub(crate) fn pick() -> Option<usize> {
    let cpus = allowed_cpus()?;
    if cpus.len() < 2 {
        return None;
    }
    Some(cpus[std::process::id() as usize % cpus.len()])
}

/// The CPUs the calling thread may run on, in order; None when they cannot be read.
fn allowed_cpus() -> Option<Vec<usize>> {
    let allowed = sched_getaffinity(Pid::from_raw(0)).ok()?;
    Some(
        (0..CpuSet::count())
            .filter(|&c| allowed.is_set(c).unwrap_or(false))
            .collect(),
    )
}

/// Pins the calling thread to `cpu`. A failure (the CPU went offline, a cpuset changed
/// meanwhile) only costs speed: the thread runs where the scheduler puts it.
pub(crate) fn pin(cpu: usize) {
    let mut set = CpuSet::new();
    let pinned = set
        .set(cpu)
        .and_then(|()| sched_setaffinity(Pid::from_raw(0), &set));
    if let Err(e) = pinned {
        tracing::debug!("runtime thread not pinned to CPU {cpu}: {e}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pinned_thread_runs_on_its_cpu_only() {
        let allowed = sched_getaffinity(Pid::from_raw(0)).unwrap();
        let cpus = allowed_cpus().unwrap();
        assert!(!cpus.is_empty());
        let cpu = *cpus.last().unwrap();
        let on = std::thread::spawn(move || {
            pin(cpu);
            (allowed_cpus().unwrap(), nix::sched::sched_getcpu().unwrap())
        })
        .join()
        .unwrap();
        assert_eq!(on, (vec![cpu], cpu));
        // This thread is untouched.
        assert_eq!(
            sched_getaffinity(Pid::from_raw(0)).unwrap(),
            allowed,
            "only the calling thread is pinned"
        );
        // A CPU that does not exist: logged, no panic.
        std::thread::spawn(|| pin(CpuSet::count() + 1))
            .join()
            .unwrap();
        match pick() {
            Some(c) => {
                assert!(cpus.len() > 1, "{cpus:?}");
                assert_eq!(c, cpus[std::process::id() as usize % cpus.len()], "by pid");
            }
            None => assert_eq!(cpus.len(), 1, "one CPU allowed: nothing to pick"),
        }
    }
}
