//! Completing remote reads: installing a fetched page, failing over between copies, and
//! poisoning a page that cannot be brought back.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use farmem_policy::Origin;
use farmem_uffd::UffdError;

use crate::copies::failover::ReplicaRead;
use crate::failure::ThreadError;
use crate::far::health::Cause;
use crate::pages::PageState;
use crate::shared::Shared;
use crate::stats::FaultKind;
use farmem_proto::PAGE_SIZE;

use super::{FaultMsg, Fetch, Queues};

/// How often the waiting fault tries its copies again.
const STALL_RETRY: Duration = Duration::from_millis(250);

/// Waits for one remote read (failing over between its copies, retrying on failure) and
/// installs the page. When every try failed but a copy is on a donor that stalled or was cut
/// off, it waits for that donor up to `stall_patience` (a page that exists is worth a wait
/// rather than SIGBUS; one on a donor that crashed or restarted is gone); the faults behind it
/// in this thread wait too.
pub(super) fn complete_fetch(sh: &Shared, mut f: Fetch, q: &mut Queues) {
    // Since when the tries are over and the fault waits for a stalled donor.
    let mut waiting: Option<Instant> = None;
    loop {
        let read = f
            .read
            .take()
            .unwrap_or_else(|| ReplicaRead::start(sh, f.far));
        match read.finish(sh) {
            Ok((data, failed_over)) => {
                let kind = if failed_over {
                    FaultKind::Failover
                } else {
                    FaultKind::Remote
                };
                install_fetched(sh, f.msg, data.into_boxed_slice(), kind, q);
                return;
            }
            Err(source) if waiting.is_none() => sh.report(ThreadError::Fetch {
                addr: f.msg.addr,
                far: f.far,
                attempt: f.attempts,
                attempts: sh.fetch_attempts,
                source,
            }),
            Err(_) => {}
        }
        if f.attempts < sh.fetch_attempts {
            f.attempts += 1;
            continue;
        }
        let since = *waiting.get_or_insert_with(|| {
            if sh.far.lender_may_heal(f.far) {
                tracing::warn!(
                    "page {:#x} (lent far page {}): every copy known failed; waiting up to \
                     {:.1} s for the parent process to copy it elsewhere",
                    f.msg.addr,
                    f.far,
                    sh.stall_patience.as_secs_f64()
                );
            } else if may_come_back(sh, f.far) {
                tracing::warn!(
                    "page {:#x} (far page {}) has a copy only on a donor that stalled or was \
                     cut off: waiting up to {:.1} s for it to come back",
                    f.msg.addr,
                    f.far,
                    sh.stall_patience.as_secs_f64()
                );
            }
            Instant::now()
        });
        if since.elapsed() >= sh.stall_patience
            || sh.shutdown.load(Ordering::Relaxed)
            || !may_come_back(sh, f.far)
        {
            fail_fetch(sh, f.msg, q);
            return;
        }
        std::thread::sleep(STALL_RETRY);
    }
}

/// Whether a copy of far page `far` is on a donor that may come back with it: suspected (no
/// verdict yet), or declared dead for a stall or a partition; or, in a forked child, whether
/// the parent that lent it lives and may heal its slab elsewhere.
fn may_come_back(sh: &Shared, far: u64) -> bool {
    sh.far.lender_may_heal(far)
        || sh.far.read_sources(far).iter().any(|&(d, _)| {
            let h = &sh.far.donor(d).health;
            h.is_suspect() || matches!(h.death(), Some((Cause::Stall | Cause::Partition, _)))
        })
}

/// A page that cannot be brought back: poison it so the faulting thread gets SIGBUS.
pub(super) fn fail_fetch(sh: &Shared, msg: FaultMsg, q: &mut Queues) {
    let mut st = sh.state.lock();
    match st.pages.get(msg.addr).map(|e| e.state) {
        Some(PageState::Fetching) => st.pages.abandon_fetch(msg.addr),
        Some(_) => {
            // Released meanwhile: serve whatever it is now.
            drop(st);
            q.retry.push_back(msg);
            return;
        }
        None => {}
    }
    drop(st);
    sh.stats.lock().s.pages_lost += 1;
    tracing::error!(
        "page {:#x} cannot be brought back from its donor: the faulting thread gets SIGBUS",
        msg.addr
    );
    if sh.uffd.poison(msg.addr, PAGE_SIZE, false).is_err() {
        eprintln!(
            "farmem: fatal: page {:#x} cannot be brought back from its donor and cannot be \
             poisoned; aborting rather than returning wrong data",
            msg.addr
        );
        std::process::abort();
    }
}

/// Installs a fetched page if it is still wanted.
pub(super) fn install_fetched(
    sh: &Shared,
    msg: FaultMsg,
    data: Box<[u8]>,
    kind: FaultKind,
    q: &mut Queues,
) {
    let mut st = sh.state.lock();
    if !sh.room_for_fault(&mut st) {
        drop(st);
        q.installs.push_back((msg, data, kind));
        return;
    }
    let state = st.pages.get(msg.addr).map(|e| e.state);
    if state != Some(PageState::Fetching) {
        // Released or remapped while in flight: serve what the page is now.
        drop(st);
        q.retry.push_back(msg);
        return;
    }
    // Read faults get the page write-protected so that a later write is seen (clean pages are
    // dropped at eviction without resending).
    match sh.uffd.copy(msg.addr, &data, false, !msg.write) {
        Ok(()) | Err(UffdError::Exists { .. }) => {
            st.pages
                .install_fetched(msg.addr, msg.write, Origin::Demand);
            sh.kick_evictor(&st);
            drop(st);
            sh.count_fault(kind, msg.t0);
        }
        Err(UffdError::Again { .. }) => {
            drop(st);
            q.installs.push_back((msg, data, kind));
        }
        Err(err) => {
            st.pages.abandon_fetch(msg.addr);
            drop(st);
            tracing::debug!("installing page {:#x}: {err}", msg.addr);
            let _ = sh.uffd.wake(msg.addr, PAGE_SIZE);
        }
    }
}
