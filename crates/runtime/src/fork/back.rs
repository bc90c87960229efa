//! Before a fork that lends nothing: checking that every page with contents is resident or
//! lent, and bringing back the pages that are not.

use std::time::Duration;

use farmem_uffd::UffdError;

use crate::error::RuntimeError;
use crate::failure::ThreadError;
use crate::far::Home;
use crate::pages::{Entry, PageState};
use crate::shared::{Shared, State};
use farmem_proto::PAGE_SIZE;

use super::plan::{lent_at, lent_copy, FarCopy, Lendable, LentAt};

/// Checks, with the state lock held right before `fork()`, that every page with contents is
/// resident (the child gets exactly the pages mapped at fork) or lent (left in a lendable
/// slab). Returns a description of the pages that are neither, for the error report — the
/// child would read zeros there — the lent pages (address, far page, memory slab) and how many
/// of them are remote (the rest are resident, with a copy the child may use). Whether
/// the first missing page is present in the page tables (`mincore`) is part of the
/// description; it is not itself checked, since a resident page may be swapped out by the
/// kernel or released by another thread whose REMOVE event is not processed yet, and the
/// child is right either way.
pub(super) fn check_all_back(
    sh: &Shared,
    st: &mut State,
    lendable: &Lendable,
) -> (Option<ThreadError>, Vec<(usize, u64, LentAt)>, usize) {
    let mut bad = 0usize;
    let mut first: Option<(usize, PageState, bool)> = None;
    let mut lent = Vec::new();
    let mut remote = 0;
    for (s, e) in st.pages.ranges() {
        let mut present = vec![0u8; (e - s) / PAGE_SIZE];
        if farmem_mm::mincore(s, &mut present).is_err() {
            continue; // not (entirely) mapped: an UNMAP event is on its way
        }
        for (a, en) in st.pages.entries_in(s, e) {
            if en.state == PageState::Empty || !st.forkmarks.child_gets(a) {
                continue;
            }
            if en.state.is_resident() {
                // The child drops its copy if it still equals the far one
                // ([`Lent::discard_unchanged`]).
                if let Some(m) =
                    lent_copy(en.state, FarCopy::of(sh, st, lendable, en.far), lendable)
                {
                    lent.push((a, en.far, m));
                }
                continue;
            }
            if let Some(m) = lent_at(en.state, FarCopy::of(sh, st, lendable, en.far), lendable) {
                lent.push((a, en.far, m));
                remote += 1;
                continue;
            }
            let here = present[(a - s) / PAGE_SIZE] & 1 != 0;
            bad += 1;
            first.get_or_insert((a, en.state, here));
        }
    }
    let not_back = first.map(|(first, state, present)| ThreadError::NotBackBeforeFork {
        pages: bad,
        first,
        state,
        present,
    });
    (not_back, lent, remote)
}

/// Brings every evicted page of every region back (before fork), but those left for the child
/// in a `lendable` slab: called from a program thread with eviction paused and no eviction
/// half-done.
pub(super) fn bring_all_back(sh: &Shared, lendable: &Lendable) -> Result<(), RuntimeError> {
    let mut guard = sh.state.lock();
    let st = &mut *guard;
    let mut todo: Vec<usize> = Vec::new();
    for (s, e) in st.pages.ranges() {
        for (a, en) in st.pages.entries_in(s, e) {
            let evicted = matches!(
                en.state,
                PageState::PoolSent
                    | PageState::PoolUnsent
                    | PageState::Remote
                    | PageState::Fetching
            );
            if evicted
                && st.forkmarks.child_gets(a)
                && lent_at(en.state, FarCopy::of(sh, st, lendable, en.far), lendable).is_none()
            {
                todo.push(a);
            }
        }
    }
    drop(guard);
    let mut first_err: Option<RuntimeError> = None;
    for addr in todo {
        if let Err(e) = bring_back(sh, addr) {
            // Go on with the other pages: one failure must not cost the child the rest (the
            // first error is reported).
            first_err.get_or_insert(e);
        }
    }
    first_err.map_or(Ok(()), Err)
}

/// Brings one page back, acting on its entry as it is now: the sender may have acknowledged
/// a pool page (PoolUnsent → PoolSent) since the list was made.
pub(super) fn bring_back(sh: &Shared, addr: usize) -> Result<(), RuntimeError> {
    loop {
        let mut st = sh.state.lock();
        let Some(e) = st.pages.get(addr) else {
            return Ok(());
        };
        if e.state == PageState::Fetching {
            // Another thread's fault is being served from the donor right now: the fault
            // thread installs it (or, if the fetch fails, leaves it Remote). Skipping it would
            // fork with the page missing, and the child would read zeros there.
            drop(st);
            std::thread::sleep(Duration::from_micros(200));
            continue;
        }
        let mut copied = false;
        let r = match e.state {
            PageState::PoolSent | PageState::PoolUnsent => {
                let moved = sh.install_gated(addr, || {
                    crate::mm::move_from_pool(&sh.uffd, addr, sh.slot_addr(e.slot), false)
                        .map(|_| ())
                });
                match moved {
                    // MOVE needs both ranges writable: the program made this page's range
                    // read-only or PROT_NONE (mprotect) since it was evicted. COPY installs
                    // into any registered range.
                    Err(err) if err.errno() == Some(libc::EINVAL) => {
                        copied = true;
                        crate::mm::with_page_bytes(sh.pool.mapping(), e.slot, |data| {
                            sh.install_gated(addr, || sh.uffd.copy(addr, data, false, false))
                        })
                    }
                    r => r,
                }
            }
            PageState::Remote => match sh.far.home(e.far) {
                // In the host tier: one copy from its memory slab.
                Some((Home::Memory(m), page)) => st
                    .mem
                    .read(m, page, |src| {
                        sh.install_gated(addr, || sh.uffd.copy(addr, src, false, false))
                    })
                    .ok_or(RuntimeError::Internal(
                        "a page in the host tier has no memory slab",
                    ))?,
                _ => {
                    drop(st);
                    let data = read_remote(sh, e)?;
                    st = sh.state.lock();
                    if st.pages.get(addr) != Some(e) {
                        continue; // changed meanwhile: look again
                    }
                    sh.install_gated(addr, || sh.uffd.copy(addr, &data, false, false))
                }
            },
            _ => return Ok(()), // resident already, or released
        };
        match r {
            Ok(()) | Err(UffdError::Exists { .. }) => {
                // EEXIST: the region page is there already and the pool page was not moved.
                let left_in_slot = copied || r.is_err();
                if let Some(slot) = st.pages.install_for_fork(addr) {
                    if left_in_slot {
                        st.slots.release_stale(slot);
                    } else {
                        st.slots.release_empty(slot);
                    }
                }
                return Ok(());
            }
            Err(UffdError::Again { .. }) => {
                drop(st);
                std::thread::sleep(Duration::from_micros(200));
            }
            Err(source) => {
                return Err(RuntimeError::Uffd {
                    step: "bringing pages back before fork",
                    source,
                })
            }
        }
    }
}

/// Reads a remote page's data from its donors (failing over between copies).
pub(super) fn read_remote(sh: &Shared, e: Entry) -> Result<Vec<u8>, RuntimeError> {
    crate::copies::failover::ReplicaRead::start(sh, e.far)
        .finish(sh)
        .map(|(data, _)| data)
        .map_err(|source| RuntimeError::FetchBeforeFork { far: e.far, source })
}
