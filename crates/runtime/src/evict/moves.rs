//! Moving victims out of their regions (UFFDIO_MOVE, one ioctl per run of neighbours) and
//! dropping those MOVE refuses ([`crate::threads::cow`]).

use crate::pages::PageState;
use crate::runs::runs;
use crate::shared::Shared;
use farmem_proto::PAGE_SIZE;
use farmem_uffd::UffdError;
use std::sync::atomic::Ordering;

use super::commit::{commit, publish};
use super::{Evictor, Unmovable, Victim};

/// Moves every victim out of its region into its pool slot; one result per victim, in order.
/// A run of neighbouring pages bound for neighbouring slots moves with one UFFDIO_MOVE: each
/// ioctl flushes the TLB of every CPU the process runs on (an IPI, a hypervisor exit here),
/// and one ioctl for 64 pages cost 0.39 µs a page against 14.4 µs for 64 single-page ones
/// (measured on this machine with a second thread running). If a run fails part-way, the
/// slots say which pages moved (a slot is empty until its page arrives) and the rest are
/// moved one by one, so each gets its own outcome (EBUSY: shared after a fork).
pub(super) fn move_victims(sh: &Shared, victims: &[Victim]) -> (Vec<Result<(), UffdError>>, u64) {
    let mut out: Vec<Result<(), UffdError>> = Vec::with_capacity(victims.len());
    let mut moves = 0u64;
    let neighbours = |k: usize| {
        victims[k].addr == victims[k - 1].addr + PAGE_SIZE
            && victims[k].slot == victims[k - 1].slot + 1
    };
    for (i, j) in runs(victims.len(), neighbours) {
        let run = &victims[i..j];
        let dst = sh.slot_addr(run[0].slot);
        let r = crate::mm::move_to_pool(&sh.pool_uffd, dst, run[0].addr, run.len() * PAGE_SIZE);
        moves += 1;
        match r {
            Ok(n) if n == run.len() * PAGE_SIZE => out.extend(run.iter().map(|_| Ok(()))),
            // Not all of the run moved: each page is looked at where it is, and tried alone if
            // it is still in the region. Trusting the reported count (or probing the slots
            // alone) put entries of pages that had left the region back to resident with
            // nothing mapped, and the next access got SIGBUS (kernel 6.18; see the docs).
            Ok(_) | Err(_) if run.len() > 1 => {
                for v in run {
                    if moved_anyway(sh, v) {
                        out.push(Ok(()));
                        continue;
                    }
                    out.push(move_one(sh, v));
                    moves += 1;
                }
            }
            r if r.is_err() => out.push(match moved_anyway(sh, &run[0]) {
                true => Ok(()),
                false => r.map(|_| ()),
            }),
            r => out.push(r.map(|_| ())),
        }
    }
    (out, moves)
}

/// MOVEs one victim into its slot; an error is checked against where the page is (see
/// [`moved_anyway`]).
pub(super) fn move_one(sh: &Shared, v: &Victim) -> Result<(), UffdError> {
    match crate::mm::move_to_pool(&sh.pool_uffd, sh.slot_addr(v.slot), v.addr, PAGE_SIZE) {
        Ok(_) => Ok(()),
        Err(_) if moved_anyway(sh, v) => Ok(()),
        Err(e) => Err(e),
    }
}

/// Whether a victim's page is in its slot and gone from the region: moved, whatever the
/// MOVE that moved it reported. A slot that held a page before (EEXIST) is told apart by the
/// region page, which is then still there.
pub(super) fn moved_anyway(sh: &Shared, v: &Victim) -> bool {
    let mut slot = [0u8; 1];
    let mut region = [0u8; 1];
    sh.pool
        .mapping()
        .mincore(v.slot as usize, &mut slot)
        .is_ok()
        && slot[0] & 1 != 0
        && farmem_mm::mincore(v.addr, &mut region).is_ok()
        && region[0] & 1 == 0
}

/// Drops the victims MOVE refused ([`crate::threads::cow`]) and commits them: each is committed where it is now (an mremap may have moved it) if it left this
/// process; one still mapped there stays resident, one released meanwhile is forgotten.
/// Each drop waits for the fault thread to read its REMOVE event, so faults wait in that
/// thread's queue meanwhile (`dropping`). Returns how many pages were dropped.
pub(super) fn drop_unmovable(sh: &Shared, ev: &mut Evictor) -> usize {
    sh.dropping.store(true, Ordering::Release);
    sh.commit_cv.notify_all();
    let pages: Vec<(usize, u32)> = ev.unmovable.iter().map(|(v, _)| (v.addr, v.slot)).collect();
    let done = crate::threads::cow::copy_and_drop(sh, &pages);
    sh.dropping.store(false, Ordering::Release);
    let mut dropped = 0;
    let (mut shared, mut not_writable) = (0u64, 0u64);
    let mut kept = 0usize;
    {
        let mut st = sh.state.lock();
        for ((mut v, why), copied) in ev.unmovable.drain(..).zip(done) {
            let Some((now, slot)) = st.drops.finish(v.addr) else {
                debug_assert!(false, "no drop record for {:#x}", v.addr);
                continue;
            };
            let evicting = st.pages.get(now).map(|e| e.state) == Some(PageState::Evicting);
            if !evicting {
                // Released or unmapped meanwhile (maybe unregistered first, when the madvise
                // raised no event): a REMOVE still to come for it releases nothing.
                st.drops.unexpect_remove(v.addr);
            }
            v.addr = now;
            v.slot = slot;
            v.was_clean &= copied;
            // Decided by where the page is: a madvise over several mappings may have failed
            // part-way, and an mremap may have moved the page before it was dropped.
            if evicting && crate::mm::is_present(now) {
                // Still mapped: stays resident, written out when picked again (it may be
                // write-protected for the copy: a write marks it dirty as usual).
                st.pages.refuse_eviction(now, false);
                st.slots.release_stale(slot);
                kept += 1;
                continue;
            }
            // Gone without a copy: the program released it (its REMOVE is on its way), so
            // it reads zeros; committed as a zero page.
            let zero = !copied
                || (!v.was_clean
                    && crate::mm::with_page_bytes(sh.pool.mapping(), slot, |page| {
                        page.iter().all(|b| *b == 0)
                    }));
            if copied && evicting {
                dropped += 1;
                match why {
                    Unmovable::Shared => shared += 1,
                    Unmovable::NotWritable => not_writable += 1,
                }
            }
            // Not `Evicting` any more (released meanwhile): the commit forgets it.
            ev.outcomes.push((v, Ok(()), zero));
        }
    }
    let mut c = commit(sh, ev);
    c.refused += kept;
    publish(sh, &c);
    if dropped > 0 {
        let mut s = sh.stats.lock();
        s.s.shared_pages_dropped += shared;
        s.s.not_writable_pages_dropped += not_writable;
    }
    dropped
}
