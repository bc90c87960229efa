//! Evicting pages UFFDIO_MOVE refuses: pages shared copy-on-write with a forked process (its
//! parent or its child), and pages of ranges the program made read-only or inaccessible with
//! mprotect (MOVE takes pages of writable ranges only: EINVAL). Both are dropped the same way.
//!
//! UFFDIO_MOVE takes exclusive pages only: after a fork it refuses every shared page (EBUSY),
//! on both sides, until that side writes the page. Making such a page exclusive first (a
//! write fault) *copies* it, and the copy is what then moves out: a parent evicting while its
//! child lives doubled the tree's memory (redis BGSAVE at a 320 MiB budget: the parent
//! unshared its 323 MiB within 0.7 s of the fork, and the tree held 672 MiB).
//!
//! So a shared victim (and a victim of a range that is not writable) is *dropped* from this
//! process instead: write-protected (a write now waits for the fault thread), copied into its
//! pool slot (read through `/proc/self/mem`, which reads `PROT_NONE` pages too and fails
//! rather than faults on a page released meanwhile), and unmapped from this process alone with
//! `MADV_DONTNEED`. The other process keeps the page, counted by its own runtime,
//! and nothing is copied locally; from the slot the page goes where every victim goes.
//!
//! `MADV_DONTNEED` raises a REMOVE event on the runtime's own userfaultfd and waits until the
//! fault thread has read it. Hence:
//! - pages being dropped stay `Evicting`, but the fault thread never waits for them
//!   (`Shared::settle_evictions`); a fault at an address being dropped, whatever its state (the
//!   program may have released it meanwhile), waits in the fault thread's queue until the drop
//!   is committed, and nothing installs a page there; while the evictor drops pages a fault
//!   that finds no room waits in that queue too, not in the thread (`Shared::room_for_fault`),
//!   so the budget still holds;
//! - every page to drop is recorded here first, and each page of a REMOVE event is taken for
//!   the runtime's own while it has a record (one per drop). If the program releases a page
//!   at that instant there are two events for it; whichever is taken for the program's
//!   releases the page, which is what the program asked for.
//! - an mremap moving a page being dropped moves its record too, and a moved page is not
//!   dropped (its old address may hold something else); the evictor commits each page where
//!   it is then, by whether it is still mapped there: a madvise over several mappings may
//!   fail part-way. Known window: an mremap between that check and the madvise, followed by a
//!   new mapping at the old address, would lose that mapping's page there.

use std::os::unix::fs::FileExt;
use std::time::Duration;

use crate::pages::PageState;
use crate::runs::runs;
use crate::shared::Shared;
use farmem_proto::PAGE_SIZE;

/// Copies each page of `pages` (address, pool slot; ascending addresses, each `Evicting` and
/// recorded with [`crate::drops::Drops::begin`]) into its slot and drops it from this process. Returns, per
/// page, whether it was copied; whether it was dropped the caller sees by where the page is
/// ([`crate::mm::is_present`]): a madvise over several mappings may fail part-way.
pub(crate) fn copy_and_drop(sh: &Shared, pages: &[(usize, u32)]) -> Vec<bool> {
    let mut copied = vec![false; pages.len()];
    // Read through /proc/self/mem: a page that is not there (released meanwhile) fails the
    // read (the kernel's access takes no userfault) instead of faulting this thread into the
    // fault thread, which may be holding the fault back until this drop is done.
    let mem = match std::fs::File::open("/proc/self/mem") {
        Ok(f) => f,
        Err(e) => {
            tracing::warn!("opening /proc/self/mem to evict pages shared with a fork: {e}");
            return copied;
        }
    };
    // Write-protect first, a run at a time, so the copy cannot miss a write: a write from
    // now on faults and waits until the page is gone, then faults again on the missing page.
    let mut protected = vec![false; pages.len()];
    for (i, j) in runs(pages.len(), |k| pages[k].0 == pages[k - 1].0 + PAGE_SIZE) {
        let len = (j - i) * PAGE_SIZE;
        match sh.uffd.writeprotect(pages[i].0, len, true, true) {
            Ok(()) => protected[i..j].iter_mut().for_each(|p| *p = true),
            Err(e) => tracing::debug!("write-protecting {:#x}+{len:#x} failed: {e}", pages[i].0),
        }
    }
    // Copied through a buffer: a pool slot is filled only by the pool's userfaultfd.
    let mut buf = vec![0u8; PAGE_SIZE];
    for (k, &(addr, slot)) in pages.iter().enumerate() {
        copied[k] = protected[k]
            && mem.read_exact_at(&mut buf, addr as u64).is_ok()
            && match sh.pool_uffd.copy(sh.slot_addr(slot), &buf, false, false) {
                Ok(()) => true,
                Err(e) => {
                    tracing::debug!("copying shared page {addr:#x} into the pool: {e}");
                    false
                }
            };
    }
    // Recorded under the lock, and only where the page still is: a page an mremap moved
    // meanwhile is not dropped (the address may hold something else now).
    let drop: Vec<usize> = {
        let mut st = sh.state.lock();
        let mut drop = Vec::new();
        for (k, &(addr, _)) in pages.iter().enumerate() {
            let evicting = st.pages.get(addr).map(|e| e.state) == Some(PageState::Evicting);
            if copied[k] && evicting && st.drops.unmoved(addr) {
                st.drops.expect_remove(addr);
                drop.push(addr);
            }
        }
        drop
    };
    // One madvise per run of neighbouring pages (one event per run, or per mapping it spans).
    let mut failed = Vec::new();
    for (i, j) in runs(drop.len(), |k| drop[k] == drop[k - 1] + PAGE_SIZE) {
        let len = (j - i) * PAGE_SIZE;
        if let Err(e) = crate::mm::drop_region_pages(drop[i], len) {
            tracing::debug!(
                "dropping shared pages at {:#x}+{len:#x} failed: {e}",
                drop[i]
            );
            failed.extend_from_slice(&drop[i..j]);
        }
    }
    if !failed.is_empty() {
        // Part of a failed run may have raised its event (a run over several mappings): once
        // the fault thread has handled every event read so far, what is still expected was
        // never raised. That thread never waits for this one while pages are being dropped.
        sh.wait_events_handled(Duration::MAX);
        let mut st = sh.state.lock();
        for addr in failed {
            st.drops.unexpect_remove(addr);
        }
    }
    copied
}
