//! Release events read by the fault loop: REMOVE and UNMAP (the program released or unmapped
//! a range: every copy of its pages is forgotten) and REMAP (mremap moved a range: its entries
//! move with it). Each waits until no eviction is half-done, so it never races the evictor's
//! commit.
//!
//! # A release the kernel applies while the runtime installs
//!
//! `madvise(MADV_DONTNEED)` (or `MADV_FREE`) sends its REMOVE event and waits only until the
//! fault loop has *read* it; the kernel then zaps the range, while the runtime applies the
//! release when it *handles* the event (found by the page model; docs/decisions/0069):
//!
//! - Nothing is installed between the read and the handling, where it could land after the
//!   zap with contents from before the release: the fault loop handles a batch's releases
//!   before its faults ([`crate::fault`]), and other threads install only while no REMOVE read
//!   is unhandled ([`Shared::install_gated`]). A zero fault that meets a page (EEXIST) takes
//!   that page out first ([`crate::mm::take_out_region_page`]): it is one the zap has still
//!   to reach.
//! - A page installed after the handling is a zero install (the release forgot every copy),
//!   and the zap may still come and remove it: such a page (`zeroed`) found gone is taken
//!   for released, not lost ([`released_late`]). Its only contents were written while the
//!   madvise was running, which the kernel's own order lets the release discard.

use farmem_proto::PAGE_SIZE;

use crate::pages::Entry;
use crate::shared::{Shared, State};

/// REMOVE / UNMAP: the program released `start..end`; forget every copy.
pub(crate) fn release(sh: &Shared, start: usize, end: usize, unmapped: bool) {
    let mut st = sh.state.lock();
    // Pages the evictor dropped as shared with a forked process are not the program's
    // ([`crate::threads::cow`]).
    let runs = if unmapped {
        vec![(start, end)]
    } else {
        st.drops.program_part(start, end)
    };
    if runs.is_empty() {
        return;
    }
    let mut st = sh.settle_evictions(st);
    if unmapped {
        st.forkmarks.forget(start, end);
    }
    for (start, end) in runs {
        for (addr, r) in st.pages.release_range(start, end, unmapped) {
            st.settle_released(&sh.pf, addr, r);
        }
    }
}

/// A `zeroed` page the state says resident is gone: a program release the kernel applied
/// after the runtime had handled its event removed it (see the module's docs). Releases it,
/// so the fault that found it reads zeros. Returns false, and changes nothing, for any other
/// page: that one is lost.
pub(crate) fn released_late(sh: &Shared, st: &mut State, addr: usize, e: Entry) -> bool {
    if !e.zeroed {
        return false;
    }
    for (a, r) in st.pages.release_range(addr, addr + PAGE_SIZE, false) {
        st.settle_released(&sh.pf, a, r);
    }
    sh.stats.lock().s.late_release_pages += 1;
    true
}

/// REMAP: `len` bytes moved from `from` to `to`; move their entries (far copies stay where
/// they are: far page numbers do not depend on addresses).
pub(crate) fn remap(sh: &Shared, from: usize, to: usize, len: usize) {
    let st = sh.state.lock();
    let mut st = sh.settle_evictions(st);
    // The kernel moves the fork flags with the mapping.
    st.forkmarks.moved(from, to, len);
    // Pages being dropped (still `Evicting`) move too; the evictor commits them where they are.
    for (slot, now) in st.drops.remap(from, to, len) {
        st.slots.set_owner(slot, now);
    }
    match st.pages.remap(from, to, len) {
        Ok(moved) => {
            for (addr, e) in moved {
                if e.state.in_pool() {
                    st.slots.set_owner(e.slot, addr);
                }
            }
        }
        Err(released) => {
            tracing::warn!(
                "mremap to {to:#x}+{len:#x} overlaps a region partly; its pages are forgotten"
            );
            for (addr, r) in released {
                st.settle_released(&sh.pf, addr, r);
            }
        }
    }
}
