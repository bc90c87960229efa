//! The record of pages being dropped by the copy-and-drop path ([`crate::threads::cow`]) and of the
//! REMOVE events those drops raise on the runtime's own userfaultfd, so the fault thread tells
//! them from the program's own releases. Part of the state, under the state lock.

use std::collections::HashMap;

use farmem_proto::PAGE_SIZE;

/// Pages being dropped and the REMOVE events the drops raise (part of the state, under the
/// state lock).
#[derive(Default)]
pub(crate) struct Drops {
    /// Pages being dropped: address when picked → (address now, pool slot).
    pages: HashMap<usize, (usize, u32)>,
    /// Pages whose REMOVE event, raised by the runtime's own `MADV_DONTNEED`, is not read yet.
    own: HashMap<usize, u32>,
}

impl Drops {
    /// Pages being dropped now (each also counted by `Pages::evicting`).
    pub(crate) fn len(&self) -> u64 {
        self.pages.len() as u64
    }

    /// `addr` (a victim bound for `slot`) is about to be dropped.
    pub(crate) fn begin(&mut self, addr: usize, slot: u32) {
        self.pages.insert(addr, (addr, slot));
    }

    /// Whether the page at `addr` is being dropped (where it was picked, or where an mremap
    /// moved it).
    pub(crate) fn contains(&self, addr: usize) -> bool {
        !self.pages.is_empty()
            && (self.pages.contains_key(&addr) || self.pages.values().any(|&(now, _)| now == addr))
    }

    /// Whether the page picked at `picked` is still being dropped where it was picked.
    pub(crate) fn unmoved(&self, picked: usize) -> bool {
        self.pages
            .get(&picked)
            .is_some_and(|&(now, _)| now == picked)
    }

    /// The drop of the page picked at `picked` is over: where the page is now, and its slot.
    pub(crate) fn finish(&mut self, picked: usize) -> Option<(usize, u32)> {
        self.pages.remove(&picked)
    }

    /// The runtime is about to drop `addr` with `MADV_DONTNEED`.
    pub(crate) fn expect_remove(&mut self, addr: usize) {
        *self.own.entry(addr).or_default() += 1;
    }

    /// No REMOVE event for `addr` is to be taken for the runtime's any more: its madvise failed
    /// and every event read before has been handled, or the page was released meanwhile (a
    /// late event of ours then releases a page that is gone already).
    pub(crate) fn unexpect_remove(&mut self, addr: usize) {
        self.take_own(addr);
    }

    /// A REMOVE event for `start..end`: takes the pages the runtime's own drops account for
    /// and returns the runs left, which the program released.
    pub(crate) fn program_part(&mut self, start: usize, end: usize) -> Vec<(usize, usize)> {
        if self.own.is_empty() {
            return vec![(start, end)];
        }
        let mut ours: Vec<usize> = self
            .own
            .keys()
            .copied()
            .filter(|a| (start..end).contains(a))
            .collect();
        ours.sort_unstable();
        let mut left = Vec::new();
        let mut from = start;
        for a in ours {
            self.take_own(a);
            if a > from {
                left.push((from, a));
            }
            from = a + PAGE_SIZE;
        }
        if from < end {
            left.push((from, end));
        }
        left
    }

    fn take_own(&mut self, addr: usize) -> bool {
        match self.own.get_mut(&addr) {
            Some(n) if *n > 1 => {
                *n -= 1;
                true
            }
            Some(_) => {
                self.own.remove(&addr);
                true
            }
            None => false,
        }
    }

    /// mremap moved `from..from + len` to `to`: pages being dropped there follow. Returns
    /// their (slot, new address), for the slots' owners.
    pub(crate) fn remap(&mut self, from: usize, to: usize, len: usize) -> Vec<(u32, usize)> {
        let mut moved = Vec::new();
        for (now, slot) in self.pages.values_mut() {
            if (from..from + len).contains(now) {
                *now = to + (*now - from);
                moved.push((*slot, *now));
            }
        }
        moved
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_removes_are_told_from_the_program_page_by_page() {
        let mut d = Drops::default();
        assert_eq!(d.program_part(0x10000, 0x20000), vec![(0x10000, 0x20000)]);
        d.expect_remove(0x11000);
        d.expect_remove(0x12000);
        d.expect_remove(0x15000);
        // The runtime's run: its pages are taken, the rest is the program's.
        assert_eq!(
            d.program_part(0x10000, 0x16000),
            vec![(0x10000, 0x11000), (0x13000, 0x15000)]
        );
        // Each record is taken once: the second event for a page is the program's.
        assert_eq!(d.program_part(0x11000, 0x12000), vec![(0x11000, 0x12000)]);
        d.expect_remove(0x10000);
        d.expect_remove(0x10000);
        assert_eq!(d.program_part(0x10000, 0x11000), vec![]);
        d.unexpect_remove(0x10000);
        assert_eq!(d.program_part(0x10000, 0x11000), vec![(0x10000, 0x11000)]);
    }

    #[test]
    fn pages_being_dropped_follow_mremap() {
        let mut d = Drops::default();
        d.begin(0x10000, 3);
        d.begin(0x20000, 4);
        assert!(d.contains(0x10000));
        assert!(d.unmoved(0x10000));
        assert_eq!(d.remap(0x10000, 0x50000, 0x2000), vec![(3, 0x50000)]);
        // Faults wait at both addresses; the moved page is not dropped.
        assert!(d.contains(0x10000) && d.contains(0x50000));
        assert!(!d.unmoved(0x10000) && d.unmoved(0x20000));
        assert!(!d.contains(0x30000));
        assert_eq!(d.len(), 2);
        assert_eq!(d.finish(0x10000), Some((0x50000, 3)));
        assert_eq!(d.finish(0x20000), Some((0x20000, 4)));
        assert_eq!(d.finish(0x20000), None);
        assert_eq!(d.len(), 0);
    }
}
