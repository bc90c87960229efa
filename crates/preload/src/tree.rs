//! This process's share of its tree's budget: under `farmem run` every process of the program's
//! tree has a runtime of its own, and together they stay within `--local-mem`. A coordinator
//! in `farmem run` (crate farmem-tree) grants each a number of local pages; this module joins
//! it when the runtime starts, then reports what the runtime uses and moves from a thread of
//! its own, every [`PERIOD`] while that changes and up to every [`IDLE_PERIOD`] while it does
//! not, and applies the grants it gets back (read as soon as the coordinator pushes one).

use std::os::fd::AsRawFd;
use std::path::Path;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use farmem_runtime::{Runtime, TREE_BUDGET_SOCKET};
use farmem_tree::{Report, TreeClient};

/// The least budget of region pages a process asks for beside its pool.
const MIN_SHARE_PAGES: u64 = farmem_tree::LEAST_SHARE_BYTES / 4096;

/// The least share a process asks for, pool included: the runtime gives a fifth of a grant to
/// the pool ([`Runtime::set_local_pages`]), so this leaves [`MIN_SHARE_PAGES`] of budget. Not
/// the whole pool mapped at start: an idle shell of a pipeline then held 5 MiB of the budget,
/// and xz beside it faulted 1.6 times as often as alone.
const LEAST_LOCAL_PAGES: u64 = MIN_SHARE_PAGES + MIN_SHARE_PAGES / 4;

/// How often the process reports to the coordinator while what it uses or moves changes.
const PERIOD: Duration = Duration::from_millis(50);

/// The longest it waits between reports while nothing changes: each unchanged report doubles
/// the wait up to this (an idle process woke 20 times a second for them). A grant the
/// coordinator pushes (it rebalances when a process joins, leaves or reports) is read at once.
const IDLE_PERIOD: Duration = Duration::from_secs(1);

/// The coordinator connection's descriptor, so a forked child can close its copy: otherwise
/// the parent's share would not come back when the parent exits while the child lives.
static CLIENT_FD: AtomicI32 = AtomicI32::new(-1);

/// Joins the tree's budget: takes the initial grant, then keeps reporting from a thread.
pub(crate) fn join(rt: &'static Arc<Runtime>, dir: &Path) -> Result<(), String> {
    let inherited = CLIENT_FD.swap(-1, Ordering::SeqCst);
    if inherited >= 0 {
        // SAFETY: the parent's connection, copied by fork; nothing in this process uses it.
        unsafe { libc::close(inherited) };
    }
    let socket = dir.join(TREE_BUDGET_SOCKET);
    let min_pages = LEAST_LOCAL_PAGES;
    let (mut client, grant) =
        TreeClient::connect(&socket, std::process::id(), min_pages).map_err(|e| {
            format!(
                "joining the process tree's budget at {}: {e}",
                socket.display()
            )
        })?;
    CLIENT_FD.store(client.as_raw_fd(), Ordering::SeqCst);
    apply(rt, grant);
    std::thread::Builder::new()
        .name("farmem-tree".into())
        .spawn(move || {
            crate::mark_runtime_thread();
            let mut wait = PERIOD;
            let mut last = None;
            loop {
                let pushed = client.wait(wait);
                let u = rt.usage();
                let report = Report {
                    used_pages: u.used_pages,
                    fetched_pages: u.fetched_pages,
                    evicted_pages: u.evicted_pages,
                };
                wait = next_wait(wait, pushed, last == Some(report));
                last = Some(report);
                match client.exchange(report) {
                    Ok(Some(grant)) => apply(rt, grant),
                    Ok(None) => {}
                    Err(e) => {
                        // farmem run is gone (the program is being torn down) or broke the
                        // protocol: keep the last share.
                        tracing::warn!("the process tree's budget coordinator: {e}");
                        return;
                    }
                }
            }
        })
        .map_err(|e| format!("starting the budget thread: {e}"))?;
    Ok(())
}

/// Pages within the least share a tree member is granted, for a process whose runtime started
/// but that could not join the tree (the coordinator refused it or is gone). Returns that
/// share in bytes.
pub(crate) fn keep_least_share(rt: &Runtime) -> u64 {
    apply(rt, LEAST_LOCAL_PAGES);
    LEAST_LOCAL_PAGES * 4096
}

/// The wait before the next report: [`PERIOD`] after a change or a pushed grant, else twice
/// the last, at most [`IDLE_PERIOD`].
fn next_wait(wait: Duration, pushed: bool, unchanged: bool) -> Duration {
    if pushed || !unchanged {
        PERIOD
    } else {
        (wait * 2).min(IDLE_PERIOD)
    }
}

/// A grant covers the pool and the resident region pages.
fn apply(rt: &Runtime, grant_pages: u64) {
    rt.set_local_pages(grant_pages);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reports_slow_down_while_nothing_changes_and_speed_up_at_once() {
        let mut w = PERIOD;
        let mut waits = Vec::new();
        for _ in 0..6 {
            w = next_wait(w, false, true);
            waits.push(w.as_millis());
        }
        assert_eq!(waits, vec![100, 200, 400, 800, 1000, 1000]);
        assert_eq!(next_wait(IDLE_PERIOD, false, false), PERIOD);
        assert_eq!(next_wait(IDLE_PERIOD, true, true), PERIOD);
    }

    #[test]
    fn the_least_share_leaves_the_least_budget_beside_its_pool() {
        let pool_slots = (farmem_contract::local::TREE_POOL_BYTES / 4096) as u32;
        let (pool, budget) =
            farmem_contract::LocalMemory::split_pages(LEAST_LOCAL_PAGES, pool_slots);
        assert_eq!(budget, MIN_SHARE_PAGES);
        assert!(pool >= 16 && u64::from(pool) < MIN_SHARE_PAGES, "{pool}");
    }
}
