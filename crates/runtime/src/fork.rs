//! Fork handling: the runtime does not enable UFFD_FEATURE_EVENT_FORK, so a child's copy of a
//! region is unregistered plain memory. Before fork every evicted page is brought back and
//! eviction stays paused until the parent resumes after fork, so the child gets all the data
//! as ordinary memory. Pages of ranges marked `MADV_DONTFORK` ([`crate::dontfork`]; V8's
//! heap) stay where they are: the child has no mapping there.
//!
//! No lock is held across `fork()`: the child must not touch its copy of the parent's runtime
//! at all (its threads are gone, and any lock one of them held at the fork instant stays held
//! there), so [`before_fork`] hands the forking thread what the child needs — the regions —
//! and [`crate::Runtime::after_fork_child`] only marks the runtime as the parent's. Forks
//! from several threads at once are counted: eviction resumes when the last one is done.
//!
//! # Limitations
//!
//! - Local memory exceeds the budget while a fork is prepared (every page is resident).
//! - Pages shared with the child cannot be MOVEd (EBUSY) until the parent writes them; the
//!   evictor unshares them.

use std::time::Duration;

use farmem_uffd::UffdError;

use crate::far::Home;
use crate::pages::{Entry, PageState};
use crate::shared::{Shared, State};
use crate::{RuntimeError, PAGE_SIZE};

/// Before `fork()`: pauses eviction, brings every evicted page back and returns the regions
/// (start, length in bytes) for a child that pages its own memory.
pub(crate) fn before_fork(sh: &Shared) -> Vec<(usize, usize)> {
    {
        let mut st = sh.state.lock();
        st.forks += 1;
        st.paused = true;
        while st.pages.evicting() > 0 {
            sh.commit_cv.wait_for(&mut st, Duration::from_millis(5));
        }
    }
    if let Err(e) = bring_all_back(sh) {
        sh.report(
            format!(
                "before fork: bringing evicted pages back failed ({e}); the child will read \
                 zeros where those pages are"
            ),
            true,
        );
    }
    let mut st = sh.state.lock();
    if let Some(what) = check_all_back(&mut st) {
        sh.report(
            format!("before fork: {what}; the child will read zeros there"),
            true,
        );
    }
    st.pages
        .ranges()
        .into_iter()
        .map(|(s, e)| (s, e - s))
        .collect()
}

/// After `fork()` in the parent: eviction resumes once no other fork is being prepared.
pub(crate) fn after_fork_parent(sh: &Shared) {
    let mut st = sh.state.lock();
    st.forks = st.forks.saturating_sub(1);
    if st.forks == 0 && st.paused {
        st.paused = false;
        drop(st);
        sh.evict_cv.notify_one();
    }
}

/// Checks, with the state lock held right before `fork()`, that every page with contents is
/// resident (the child gets exactly the pages mapped at fork). Returns a description of the
/// pages that are not, for the error report: the child would read zeros there. Whether the
/// first such page is present in the page tables (`mincore`) is part of the description; it is
/// not itself checked, since a resident page may be swapped out by the kernel or released by
/// another thread whose REMOVE event is not processed yet, and the child is right either way.
fn check_all_back(st: &mut State) -> Option<String> {
    let mut bad = 0usize;
    let mut first: Option<(usize, PageState, bool)> = None;
    for (s, e) in st.pages.ranges() {
        let mut present = vec![0u8; (e - s) / PAGE_SIZE];
        if farmem_mm::mincore(s, &mut present).is_err() {
            continue; // not (entirely) mapped: an UNMAP event is on its way
        }
        for (a, en) in st.pages.entries_in(s, e) {
            let here = present[(a - s) / PAGE_SIZE] & 1 != 0;
            if en.state != PageState::Empty && !en.state.is_resident() && !st.dontfork.contains(a) {
                bad += 1;
                first.get_or_insert((a, en.state, here));
            }
        }
    }
    first.map(|(a, state, here)| {
        format!(
            "{bad} page(s) are not in local memory at fork (first {a:#x}: {state:?}, {}present)",
            if here { "" } else { "not " }
        )
    })
}

/// Brings every evicted page of every region back (before fork): called from a program thread
/// with eviction paused and no eviction half-done.
fn bring_all_back(sh: &Shared) -> Result<(), RuntimeError> {
    let mut guard = sh.state.lock();
    let st = &mut *guard;
    let mut todo: Vec<usize> = Vec::new();
    for (s, e) in st.pages.ranges() {
        todo.extend(
            st.pages
                .entries_in(s, e)
                .into_iter()
                .filter(|(a, _)| !st.dontfork.contains(*a))
                .filter(|(_, e)| {
                    matches!(
                        e.state,
                        PageState::PoolSent
                            | PageState::PoolUnsent
                            | PageState::Remote
                            | PageState::Fetching
                    )
                })
                .map(|(a, _)| a),
        );
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
fn bring_back(sh: &Shared, addr: usize) -> Result<(), RuntimeError> {
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
                match crate::mm::move_from_pool(&sh.uffd, addr, sh.slot_addr(e.slot), false) {
                    // MOVE needs both ranges writable: the program made this page's range
                    // read-only or PROT_NONE (mprotect) since it was evicted. COPY installs
                    // into any registered range.
                    Err(err) if err.errno() == Some(libc::EINVAL) => {
                        copied = true;
                        crate::mm::with_page_bytes(sh.pool.mapping(), e.slot, |data| {
                            sh.uffd.copy(addr, data, false, false)
                        })
                    }
                    r => r.map(|_| ()),
                }
            }
            PageState::Remote => match sh.far.home(e.far) {
                // In the host tier: one copy from its memory slab.
                Some((Home::Memory(m), page)) => st
                    .mem
                    .read(m, page, |src| sh.uffd.copy(addr, src, false, false))
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
                    sh.uffd.copy(addr, &data, false, false)
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
fn read_remote(sh: &Shared, e: Entry) -> Result<Vec<u8>, RuntimeError> {
    crate::failover::ReplicaRead::start(sh, e.far)
        .finish(sh)
        .map(|(data, _)| data)
        .map_err(|reason| RuntimeError::FetchBeforeFork { far: e.far, reason })
}
