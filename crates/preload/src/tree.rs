//! This process's share of its tree's budget: under `farmem run` every process of the program's
//! tree has a runtime of its own, and together they stay within `--local-mem`. A coordinator
//! in `farmem run` (crate farmem-tree) grants each a number of local pages; this module joins
//! it when the runtime starts, then reports what the runtime uses and moves every
//! [`PERIOD`] from a thread of its own and applies the grants it gets back.

use std::os::fd::AsRawFd;
use std::path::Path;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use farmem_runtime::{Runtime, TREE_BUDGET_SOCKET};
use farmem_tree::{Report, TreeClient};

/// Each process's write-back pool in a tree (the host tier's pool size): a fifth of the whole
/// budget per process would overcommit it with a few processes.
pub(crate) const POOL_BYTES: u64 = 4 << 20;

/// The least budget of region pages a process asks for beside its pool (1 MiB).
const MIN_SHARE_PAGES: u64 = 256;

/// How often the process reports to the coordinator (and so how soon a grant takes effect).
const PERIOD: Duration = Duration::from_millis(50);

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
    let min_pages = rt.pool_pages() + MIN_SHARE_PAGES;
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
            loop {
                std::thread::sleep(PERIOD);
                let u = rt.usage();
                let report = Report {
                    used_pages: u.used_pages,
                    fetched_pages: u.fetched_pages,
                    evicted_pages: u.evicted_pages,
                };
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

/// A grant covers the pool and the resident region pages.
fn apply(rt: &Runtime, grant_pages: u64) {
    rt.set_budget_pages(grant_pages.saturating_sub(rt.pool_pages()));
}
