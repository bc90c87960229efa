//! The prefetch thread (`farmem-prefetch`): takes the requests [`crate::prefetch`] queued,
//! fetches them in batches on its own donor connections, and makes the pages that arrive
//! local through the page-state transitions the fault path uses.
//!
//! # Design
//!
//! - It takes every queued request, drops those a demand fault already reached, groups the
//!   rest by donor in batches of up to 256 pages, submits all batches, then waits for each.
//! - Arrival, under the state lock: a page is kept only if its entry is still `Remote` with the
//!   same far page, it is still wanted and eviction is not paused (fork); otherwise it is
//!   dropped (`prefetch_dropped`). Kept pages go to a pool slot (`PoolSent`), or in marker
//!   mode straight into the region (`ResidentClean`) except each window's marker.
//! - A page a fault waits for (it is `Fetching`) is installed for that fault and the fault is
//!   woken; if its batch failed, the page goes back to `Remote` and the fault, woken, sends a
//!   demand read of its own.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use crate::sync::MutexGuard;
use farmem_policy::Origin;
use farmem_transport::{Completion, Pending, TransportError};
use farmem_uffd::UffdError;

use crate::failure_log::FailureLog;
use crate::pages::PageState;
use crate::prefetch::{page_of, Req, MAX_WINDOWS};
use crate::shared::{Shared, State};
use crate::stats::FaultKind;
use crate::threads::prefetch_plan::{batches, drop_consumed};
use farmem_contract::PrefetchInstall;
use farmem_proto::PAGE_SIZE;

/// A prefetched page a fault waits for arrived (`data`) or could not be fetched (`None`):
/// installs it and wakes the fault, or hands the page back to the demand path (state
/// `Remote`, fault woken: it faults again and sends its own read). State lock held.
fn arrive_awaited(
    sh: &Shared,
    st: &mut MutexGuard<'_, State>,
    addr: usize,
    far: u64,
    t0: Instant,
    data: Option<&[u8]>,
) {
    let ours = |st: &State| {
        st.pages
            .get(addr)
            .is_some_and(|e| e.state == PageState::Fetching && e.far == far)
    };
    if !ours(st) {
        // Released or remapped meanwhile: the fault is retried on what the page is now.
        let _ = sh.uffd.wake(addr, PAGE_SIZE);
        return;
    }
    if let Some(d) = data.filter(|_| !st.paused) {
        sh.make_room(st);
        if ours(st) {
            // Write-protected and clean: it equals its donor copy; a write faults once more
            // and marks it dirty.
            match sh.install_gated(addr, || sh.uffd.copy(addr, d, false, true)) {
                Ok(()) | Err(UffdError::Exists { .. }) => {
                    st.pages.install_fetched(addr, false, Origin::Prefetch);
                    sh.kick_evictor(st);
                    sh.count_fault(FaultKind::Remote, t0);
                    return;
                }
                Err(e) => tracing::debug!("installing awaited prefetched page {addr:#x}: {e}"),
            }
        }
    }
    if ours(st) {
        st.pages.abandon_fetch(addr);
    }
    let _ = sh.uffd.wake(addr, PAGE_SIZE);
}

/// The prefetch thread. Runs until shutdown.
pub(crate) fn prefetch_loop(sh: Arc<Shared>) {
    let pf = &sh.pf;
    let mut reqs: Vec<Req> = Vec::new();
    // A donor that is gone fails every batch sent to it (a forked child's connections to
    // its parent's donors are never suspected, so batches keep going there): one line per
    // cause, not one per batch.
    let mut failures = FailureLog::default();
    // Each donor's returns from the dead as of this thread's last batch there.
    let mut returns: Vec<u32> = (0..pf.clients.len())
        .map(|d| sh.far.donor(d).health.returns())
        .collect();
    while !sh.shutdown.load(Ordering::Relaxed) {
        take_queued(&sh, &mut reqs);
        drop_consumed(&mut pf.inner.lock(), &mut reqs);
        if reqs.is_empty() {
            continue;
        }
        // A batch counts only within one restart epoch (Far::read_epoch): taken before the
        // copies are looked up.
        let epoch = sh.far.read_epoch();
        let (batches, lost) = batches(
            reqs.drain(..),
            pf.clients.len(),
            |far| sh.far.read_sources(far).first().copied(),
            |d| sh.far.donor(d).health.is_live(),
            farmem_transport::MAX_BATCH_PAGES,
        );
        let submitted: Vec<_> = batches
            .into_iter()
            .map(|b| {
                reopen_after_return(&sh, b.donor, &mut returns[b.donor]);
                let p = pf.clients[b.donor].submit_read(&b.addrs);
                (b.donor, b.reqs, p, Instant::now())
            })
            .collect();
        if !lost.is_empty() {
            arrive(&sh, lost, None);
        }
        for (d, reqs, p, sent) in submitted {
            finish_batch(&sh, d, reqs, p, sent, epoch, &mut failures);
        }
    }
}

/// Opens this thread's connection to donor `d` again if the donor came back from the dead
/// since the thread last used it: left unused meanwhile, it may lead to the donor's old
/// process, and the batch failing on it had the donor, just taken back, suspected again and
/// its copies left out of writes (one copy of those slabs, lost with the other donor: found
/// by a forked child's test under load).
fn reopen_after_return(sh: &Shared, d: usize, seen: &mut u32) {
    let now = sh.far.donor(d).health.returns();
    if now != *seen {
        *seen = now;
        sh.pf.clients[d].reconnect();
    }
}

/// Takes every queued request into `reqs`, waiting for one if there is none.
fn take_queued(sh: &Shared, reqs: &mut Vec<Req>) {
    let pf = &sh.pf;
    let mut q = pf.queue.lock();
    // Woken by each queued fetch, and at shutdown (crate::doorbell).
    if q.is_empty() && !sh.shutdown.load(Ordering::Relaxed) {
        pf.queue_cv.wait_for(&mut q, crate::doorbell::IDLE_WAIT);
    }
    reqs.extend(q.drain(..));
}

/// Waits for the batch `p` submitted to donor `d` at `sent` and makes its pages arrive.
///
/// With another copy to read from, a batch is waited for only as long as batches usually
/// take (the failover delay of batch times): pages faulted on while a stalled donor holds
/// their prefetch then go to the demand path, which fails over, instead of waiting out the
/// request timeout.
fn finish_batch(
    sh: &Shared,
    d: usize,
    reqs: Vec<Req>,
    p: Result<Pending, TransportError>,
    sent: Instant,
    epoch: u64,
    failures: &mut FailureLog,
) {
    let other_copy = sh.far.replicas > 1 || sh.far.backup.is_some();
    let failed = |e: TransportError| {
        sh.far.on_error(d, &e);
        e.to_string()
    };
    let result = match p {
        Err(e) => Err(failed(e)),
        Ok(p) if !other_copy => p.wait().map_err(failed),
        Ok(mut p) => {
            let delay = sh.far.batch_times.failover_delay(sh.request_timeout);
            match p.wait_until(sent + delay) {
                Some(r) => r.map_err(failed),
                // Slow, not failed: nothing to suspect. Counted as a batch that took the
                // delay, so a donor slow for good soon gets four times longer.
                None => {
                    sh.far.batch_times.record(delay);
                    tracing::debug!(
                        "donor {} did not answer a prefetch batch within {} ms; its pages go \
                         to the demand path",
                        sh.far.donor(d).read.addr(),
                        delay.as_millis()
                    );
                    arrive(sh, reqs, None);
                    return;
                }
            }
        }
    };
    if result.is_ok() {
        sh.far.batch_times.record(sent.elapsed());
        sh.pf.inner.lock().lookahead.batch_done(sent.elapsed());
    }
    match result {
        Ok(Completion::Pages(_)) if sh.far.read_epoch() != epoch => {
            tracing::debug!(
                "a prefetch batch overlapped a restarted donor being taken back: its pages go \
                 to the demand path"
            );
            arrive(sh, reqs, None);
        }
        Ok(Completion::Pages(mut data)) if data.len() == reqs.len() * PAGE_SIZE => {
            sh.pf.inner.lock().batches += 1;
            sh.stats.lock().s.bytes_received += data.len() as u64;
            arrive_opened(sh, reqs, &mut data);
        }
        other => {
            let why = match other {
                Err(e) => e,
                Ok(_) => "the donor answered with the wrong amount of data".into(),
            };
            if let Some(n) = failures.should_log(&why.to_string()) {
                let again = if n > 0 {
                    format!(" ({n} more batches failed so since said)")
                } else {
                    String::new()
                };
                tracing::warn!("prefetching {} pages failed: {why}{again}", reqs.len());
            }
            arrive(sh, reqs, None);
        }
    }
}

/// Pages of one batch arrived (`data`, in request order): opens each when pages are sealed;
/// pages that fail their integrity check are treated as not arrived (never kept: a fault on
/// one fetches it again on the demand path, which reports it).
///
/// Only pages [`arrive`] may still use are opened. A page a demand fault reached first may
/// have been written since and evicted again to the same far page while this batch was on
/// the wire: the donor then sent a page being overwritten (its two connections do not order
/// one client's requests; ThreadSanitizer shows the two copies meet). Opened, it failed its
/// check and was reported as tampering; it is dropped unread anyway.
fn arrive_opened(sh: &Shared, reqs: Vec<Req>, data: &mut [u8]) {
    let used: Vec<bool> = {
        let i = sh.pf.inner.lock();
        reqs.iter()
            .map(|r| {
                i.in_flight
                    .get(&r.addr)
                    .is_some_and(|f| f.far == r.far && (f.waiter.is_some() || !f.consumed))
            })
            .collect()
    };
    let rejected: Vec<bool> = reqs
        .iter()
        .zip(data.chunks_exact_mut(PAGE_SIZE))
        .zip(&used)
        .map(|((r, page), used)| *used && sh.far.open(r.far, page).is_err())
        .collect();
    let bad = rejected.iter().filter(|r| **r).count();
    if bad == 0 {
        arrive(sh, reqs, Some(data));
        return;
    }
    sh.stats.lock().s.seal_rejected += bad as u64;
    tracing::error!("{bad} prefetched pages failed their integrity check and were dropped");
    let (mut good, mut failed, mut good_data) = (Vec::new(), Vec::new(), Vec::new());
    for ((r, page), rejected) in reqs
        .into_iter()
        .zip(data.chunks_exact(PAGE_SIZE))
        .zip(rejected)
    {
        if rejected {
            failed.push(r);
        } else {
            good_data.extend_from_slice(page);
            good.push(r);
        }
    }
    arrive(sh, good, Some(&good_data));
    arrive(sh, failed, None);
}

/// Pages of one batch arrived (`data`, in request order) or failed (`None`): keep each if
/// still wanted.
fn arrive(sh: &Shared, reqs: Vec<Req>, data: Option<&[u8]>) {
    let pf = &sh.pf;
    let mut st = sh.state.lock();
    for (k, r) in reqs.into_iter().enumerate() {
        let flight = {
            let mut i = pf.inner.lock();
            let f = i.in_flight.remove(&r.addr);
            if f.as_ref().is_some_and(|f| !f.consumed) {
                i.live -= 1;
            }
            f
        };
        let page = data.map(|d| &d[k * PAGE_SIZE..(k + 1) * PAGE_SIZE]);
        // The flight's far page, not the request's: a release sets it to none
        // (Prefetch::released), and the fault is then woken to fault again.
        if let Some((far, t0)) = flight.as_ref().and_then(|f| f.waiter.map(|t0| (f.far, t0))) {
            arrive_awaited(sh, &mut st, r.addr, far, t0, page);
            continue;
        }
        let Some(page_data) = page else {
            continue; // failed: nothing counted (never prefetched)
        };
        let wanted = match &flight {
            Some(f) => !f.consumed && f.far == r.far,
            None => false,
        };
        let current = st.pages.get(r.addr);
        let still = current.is_some_and(|e| e.state == PageState::Remote && e.far == r.far);
        if !wanted || !still || st.paused {
            let mut i = pf.inner.lock();
            i.dropped += 1;
            if wanted {
                // Not consumed by a counted waited hit: a late (or released) prefetch.
                i.measures.late();
            }
            continue;
        }
        keep(sh, &mut st, &r, page_data);
    }
}

/// Makes an arrived, still wanted prefetched page local: in marker mode straight into its
/// region (unless it is its window's marker or resident pages are at the high watermark),
/// else into a pool slot.
fn keep(sh: &Shared, st: &mut State, r: &Req, page_data: &[u8]) {
    let pf = &sh.pf;
    let now = pf.now_ns();
    let marker = r.addr == r.window;
    if pf.mode == PrefetchInstall::Marker && !marker && st.pages.resident() < sh.budget.high_water()
    {
        match sh.install_gated(r.addr, || sh.uffd.copy(r.addr, page_data, false, true)) {
            Ok(()) => {
                st.pages.install_prefetched(r.addr, Origin::Prefetch, false);
                sh.kick_evictor(st);
                let mut i = pf.inner.lock();
                i.measures.prefetched(page_of(r.addr), now);
                if i.windows.len() > MAX_WINDOWS {
                    i.windows.clear();
                }
                i.windows.entry(r.window).or_default().push(r.addr);
                return;
            }
            Err(UffdError::Exists { .. }) => {
                // Present although the table says remote: never overwrite it.
                pf.inner.lock().dropped += 1;
                return;
            }
            Err(_) => {} // pending events (EAGAIN) or the mapping changed: use the pool
        }
    }
    let Some(slot) = st.slots.take(&mut st.pages, &sh.pool, pf) else {
        pf.inner.lock().dropped += 1;
        return;
    };
    match sh
        .pool_uffd
        .copy(sh.slot_addr(slot), page_data, false, false)
    {
        Ok(()) => {
            st.slots.set_owner(slot, r.addr);
            st.slots.cache(slot);
            st.pages.prefetch_to_pool(r.addr, slot);
            let mut i = pf.inner.lock();
            i.measures.prefetched(page_of(r.addr), now);
            if pf.mode == PrefetchInstall::Marker && marker {
                if i.markers.len() > MAX_WINDOWS {
                    i.markers.clear();
                }
                i.markers.insert(r.addr, r.thread);
            }
        }
        Err(e) => {
            tracing::debug!("copying a prefetched page into the pool: {e}");
            if matches!(e, UffdError::Exists { .. }) {
                st.slots.release_stale(slot); // it held a page: discarded before reuse
            } else {
                st.slots.release_empty(slot);
            }
            pf.inner.lock().dropped += 1;
        }
    }
}
