//! The sender (`farmem-send`): drains the staging queue in batches of up to 256 pages per
//! donor, places slabs on first write, and marks acknowledged pages sent ([`Pages::mark_sent`]:
//! `PoolSent`, reclaimable cache that the evictor frees oldest first when it needs pool slots).
//!
//! # Design
//!
//! A staged page is sent only if it is still wanted: still in its pool slot unsent, or moved
//! back unmodified while its send was pending (`ResidentSending`, matched by generation).
//! Send failures are retried with back-off while the pages stay in the pool (the program keeps
//! running; the pool fills and resident memory may exceed the budget); the error is logged
//! and kept in [`crate::Stats::last_error`].
//!
//! [`Pages::mark_sent`]: crate::pages::Pages::mark_sent

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use crate::error::RuntimeError;
use crate::failure::ThreadError;
use crate::far::Home;
use crate::pages::PageState;
use crate::shared::{Shared, Staged, State};
use crate::slabs::replicas::Replicas;
use crate::threads::send_rounds::{run, SendWorld};
use farmem_proto::PAGE_SIZE;

/// Whether a staged page still needs sending: it still sits in its pool slot unsent, or it
/// was moved back unmodified while its send was pending.
fn staged_live(st: &State, s: &Staged) -> bool {
    let in_pool = st
        .slots
        .owner(s.slot)
        .and_then(|o| st.pages.get(o))
        .is_some_and(|e| e.state == PageState::PoolUnsent && e.slot == s.slot && e.gen == s.gen);
    in_pool
        || st
            .pages
            .get(s.addr)
            .is_some_and(|e| e.state == PageState::ResidentSending && e.gen == s.gen)
}

/// The sender. Runs until shutdown.
pub(crate) fn send_loop(sh: Arc<Shared>) {
    run(&*sh);
}

impl SendWorld for Shared {
    type Page = Staged;

    fn stopping(&self) -> bool {
        self.shutdown.load(Ordering::Relaxed)
    }

    fn next_batch(&self) -> Option<Vec<Staged>> {
        let mut st = self.state.lock();
        if st.staging.is_empty() {
            // Woken by each commit that stages pages, and at shutdown (crate::doorbell).
            if !self.shutdown.load(Ordering::Relaxed) {
                self.stage_cv.wait_for(&mut st, crate::doorbell::IDLE_WAIT);
            }
            return None;
        }
        // Taken out while it is read: whether a page is still wanted looks at the rest of
        // the state.
        let mut staging = std::mem::take(&mut st.staging);
        let batch = take_batch(&mut staging, farmem_transport::MAX_BATCH_PAGES, |s| {
            staged_live(&st, s)
        });
        st.staging = staging;
        (!batch.is_empty()).then_some(batch)
    }

    fn write(&self, batch: &mut Vec<Staged>) -> Result<(), RuntimeError> {
        write_batch(self, batch)
    }

    /// Commits waiting for the pool see write-back failing.
    fn failed(&self, batch: Vec<Staged>, err: ThreadError, say: bool) {
        if say {
            self.report(err);
        } else {
            self.count_error(err);
        }
        self.failing_since
            .lock()
            .get_or_insert_with(std::time::Instant::now);
        self.send_failing.store(true, Ordering::Relaxed);
        self.commit_cv.notify_all();
        requeue(&mut self.state.lock().staging, batch);
    }

    fn succeeded(&self, batch: &[Staged]) {
        self.send_failing.store(false, Ordering::Relaxed);
        *self.failing_since.lock() = None;
        acknowledge(self, batch);
    }

    fn pause(&self, wait: Duration) {
        std::thread::sleep(wait);
    }
}

/// Takes up to `max` still-wanted (`live`) pages off the front of `staging`, oldest first;
/// those no longer wanted are dropped from it on the way.
fn take_batch<T>(
    staging: &mut VecDeque<T>,
    max: usize,
    mut live: impl FnMut(&T) -> bool,
) -> Vec<T> {
    let mut batch = Vec::new();
    while batch.len() < max {
        let Some(s) = staging.pop_front() else {
            break;
        };
        if live(&s) {
            batch.push(s);
        }
    }
    batch
}

/// Puts a batch that could not be sent back at the front of `staging`, in its order.
fn requeue<T>(staging: &mut VecDeque<T>, batch: Vec<T>) {
    for s in batch.into_iter().rev() {
        staging.push_front(s);
    }
}

/// Writes a batch where its pages live, placing slabs on first write: pages whose slab is in
/// memory (the host tier) are copied there under the state lock, if still wanted, and are
/// written back at once; the rest are sealed (when pages are sealed) and written to every
/// live replica of their slabs ([`crate::far::Far::write_replicas`]). Leaves in `batch` only
/// the pages that went to donors, for [`acknowledge`].
fn write_batch(sh: &Shared, batch: &mut Vec<Staged>) -> Result<(), RuntimeError> {
    // Held while replica lists are read and written to: re-replication never copies a page
    // between the two (see Far::copy_gate).
    let _gate = sh.far.copy_gate.read();
    let mut remote: Vec<(Replicas, u32, usize)> = Vec::new();
    let mut memory: Vec<(u32, u32, usize)> = Vec::new();
    for (i, s) in batch.iter().enumerate() {
        match sh.place(s.far)? {
            (Home::Donors(r), page) => remote.push((r, page, i)),
            (Home::Memory(m), page) => memory.push((m, page, i)),
            // Far pages below the floor are frozen for good: never written.
            (Home::Borrowed(_), _) => {
                return Err(RuntimeError::Internal(
                    "a page was written back to a far page its parent lent",
                ))
            }
        }
    }
    if !memory.is_empty() {
        write_to_memory(sh, batch, &memory);
    }
    if let Some(sealer) = &sh.far.sealer {
        // A retried batch keeps its sealed bytes, so a retry sends exactly what the recorded
        // seal covers.
        for (_, _, i) in &remote {
            let s = &mut batch[*i];
            if !s.sealed {
                sealer.seal(s.far, &mut s.data);
                s.sealed = true;
            }
        }
    }
    let writes: Vec<(Replicas, u32, u64, &[u8])> = remote
        .iter()
        .map(|(r, page, i)| (*r, *page, batch[*i].far, &batch[*i].data[..]))
        .collect();
    sh.far.write_replicas(&writes)?;
    // Only the pages that went to donors remain to be acknowledged.
    let mut on_donors = vec![false; batch.len()];
    for (_, _, i) in &remote {
        on_donors[*i] = true;
    }
    let mut k = 0;
    batch.retain(|_| {
        k += 1;
        on_donors[k - 1]
    });
    Ok(())
}

/// Copies the staged pages `memory` ((slab, page, batch index)) into their memory slabs, each
/// if still wanted, and marks them written back.
fn write_to_memory(sh: &Shared, batch: &[Staged], memory: &[(u32, u32, usize)]) {
    let mut st = sh.state.lock();
    let mut written = 0u64;
    for &(m, page, i) in memory {
        let s = &batch[i];
        if staged_live(&st, s) && st.mem.write(m, page, &s.data) {
            acknowledge_one(&mut st, s);
            written += 1;
        }
    }
    drop(st);
    sh.slots_cv.notify_all();
    sh.stats.lock().s.tier_pages_written += written;
}

/// The donors hold the batch: its pages still in the pool become reclaimable, those moved
/// back unmodified become clean.
fn acknowledge(sh: &Shared, batch: &[Staged]) {
    let mut st = sh.state.lock();
    for s in batch {
        acknowledge_one(&mut st, s);
    }
    // A lowered pool limit takes back the slots sent pages held beyond it.
    let st_ref = &mut *st;
    st_ref.slots.trim(&mut st_ref.pages, &sh.pool, &sh.pf);
    drop(st);
    sh.slots_cv.notify_all();
    let sent = batch.len() as u64;
    let mut stats = sh.stats.lock();
    stats.s.evicted_sent_dirty += sent;
    stats.s.bytes_sent += sent * PAGE_SIZE as u64;
}

/// One staged page is written back: in the pool it becomes reclaimable, moved back unmodified
/// it becomes clean.
fn acknowledge_one(st: &mut State, s: &Staged) {
    if let Some(owner) = st.slots.owner(s.slot) {
        if st.pages.mark_sent(owner, Some(s.slot), s.gen) {
            st.slots.cache(s.slot);
        }
    }
    st.pages.mark_sent(s.addr, None, s.gen);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_takes_at_most_the_limit_of_wanted_pages_oldest_first() {
        // Odd pages are no longer wanted: dropped on the way, not sent.
        let mut staging: VecDeque<u32> = (0..10).collect();
        let batch = take_batch(&mut staging, 3, |p| p % 2 == 0);
        assert_eq!(batch, vec![0, 2, 4]);
        assert_eq!(staging, VecDeque::from(vec![5, 6, 7, 8, 9]));
        let batch = take_batch(&mut staging, 3, |p| p % 2 == 0);
        assert_eq!(batch, vec![6, 8]);
        assert!(staging.is_empty());
    }

    #[test]
    fn a_failed_batch_goes_back_before_pages_staged_since() {
        let mut staging: VecDeque<u32> = VecDeque::from(vec![7, 8]);
        requeue(&mut staging, vec![1, 2, 3]);
        assert_eq!(staging, VecDeque::from(vec![1, 2, 3, 7, 8]));
    }
}
