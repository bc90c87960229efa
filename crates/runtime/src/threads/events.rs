//! Release events read by the fault loop: REMOVE and UNMAP (the program released or unmapped
//! a range: every copy of its pages is forgotten) and REMAP (mremap moved a range: its entries
//! move with it). Each waits until no eviction is half-done, so it never races the evictor's
//! commit.

use crate::shared::Shared;

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
