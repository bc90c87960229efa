//! The parts of regions whose contents a forked child does not get: ranges the program marked
//! `MADV_DONTFORK` (V8 marks every heap page so: the child has no mapping there) or
//! `MADV_WIPEONFORK` (the child's mapping there starts zero-filled; OpenSSL and other random
//! generators mark their state so). Their evicted pages need not come back before `fork`
//! (bringing a whole far heap back at each `child_process.spawn` would make local memory the
//! heap's size for the moment), and none of their pages is lent to a child (it would read the
//! parent's data where the kernel promises zeros).
//!
//! # Design
//!
//! Two sets of disjoint ranges, each inside a region when added. A mark that outlived its
//! mapping would make the next fork skip the pages of an unrelated new mapping there (the
//! child would read zeros), so marks are removed whenever the kernel's flag goes:
//! `MADV_DOFORK` / `MADV_KEEPONFORK`, an UNMAP event over the range, and a region adopted over
//! it (a new mapping carries no mark). A REMAP (mremap) moves them, as the kernel moves the
//! flags with the mapping.

use std::collections::BTreeMap;

/// The fork advice the program gave for a range (`madvise`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ForkAdvice {
    /// `MADV_DONTFORK`: the child has no mapping there.
    DontFork,
    /// `MADV_DOFORK`: undoes `DontFork`.
    DoFork,
    /// `MADV_WIPEONFORK`: the child's mapping there is zero-filled.
    WipeOnFork,
    /// `MADV_KEEPONFORK`: undoes `WipeOnFork`.
    KeepOnFork,
}

/// Disjoint ranges `start..end`, keyed by start.
#[derive(Default, Debug)]
struct Ranges(BTreeMap<usize, usize>);

impl Ranges {
    /// Marks `start..end`.
    fn add(&mut self, start: usize, end: usize) {
        if start >= end {
            return;
        }
        self.remove(start, end);
        self.0.insert(start, end);
    }

    /// Unmarks `start..end` (splitting ranges it covers partly); returns the parts that were
    /// marked.
    fn remove(&mut self, start: usize, end: usize) -> Vec<(usize, usize)> {
        if self.0.is_empty() || start >= end {
            return Vec::new();
        }
        let hit: Vec<(usize, usize)> = self
            .0
            .range(..end)
            .filter(|(_, e)| **e > start)
            .map(|(s, e)| (*s, *e))
            .collect();
        let mut removed = Vec::with_capacity(hit.len());
        for (s, e) in hit {
            self.0.remove(&s);
            if s < start {
                self.0.insert(s, start);
            }
            if e > end {
                self.0.insert(end, e);
            }
            removed.push((s.max(start), e.min(end)));
        }
        removed
    }

    /// Moves the marks of `from..from+len` to `to..to+len` (marks already at `to` go: the
    /// mapping there was replaced).
    fn moved(&mut self, from: usize, to: usize, len: usize) {
        let marked = self.remove(from, from + len);
        self.remove(to, to + len);
        for (s, e) in marked {
            self.add(s - from + to, e - from + to);
        }
    }

    /// Whether `addr` is marked.
    fn contains(&self, addr: usize) -> bool {
        self.0
            .range(..=addr)
            .next_back()
            .is_some_and(|(_, e)| addr < *e)
    }
}

/// The `MADV_DONTFORK` and `MADV_WIPEONFORK` marks of the regions.
#[derive(Default, Debug)]
pub(crate) struct ForkMarks {
    dont_fork: Ranges,
    wipe_on_fork: Ranges,
}

impl ForkMarks {
    /// Applies `advice` to `start..end` (a part of one region).
    pub(crate) fn advise(&mut self, start: usize, end: usize, advice: ForkAdvice) {
        match advice {
            ForkAdvice::DontFork => self.dont_fork.add(start, end),
            ForkAdvice::DoFork => drop(self.dont_fork.remove(start, end)),
            ForkAdvice::WipeOnFork => self.wipe_on_fork.add(start, end),
            ForkAdvice::KeepOnFork => drop(self.wipe_on_fork.remove(start, end)),
        }
    }

    /// `start..end` is no longer the mapping the marks were given for (unmapped, or a new
    /// mapping adopted there).
    pub(crate) fn forget(&mut self, start: usize, end: usize) {
        self.dont_fork.remove(start, end);
        self.wipe_on_fork.remove(start, end);
    }

    /// mremap moved `len` bytes from `from` to `to`.
    pub(crate) fn moved(&mut self, from: usize, to: usize, len: usize) {
        self.dont_fork.moved(from, to, len);
        self.wipe_on_fork.moved(from, to, len);
    }

    /// Whether a forked child gets the contents of the page at `addr`: it does not in a
    /// `MADV_DONTFORK` or `MADV_WIPEONFORK` range.
    pub(crate) fn child_gets(&self, addr: usize) -> bool {
        !self.dont_fork.contains(addr) && !self.wipe_on_fork.contains(addr)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marks_split_and_clear() {
        let mut d = Ranges::default();
        d.add(0x1000, 0x9000);
        assert!(d.contains(0x1000) && d.contains(0x8fff) && !d.contains(0x9000));
        d.remove(0x3000, 0x5000);
        assert!(d.contains(0x2fff) && !d.contains(0x3000) && !d.contains(0x4fff));
        assert!(d.contains(0x5000));
        d.add(0x2000, 0x6000);
        assert!(d.contains(0x3000) && d.contains(0x8000));
        d.remove(0, 0x10000);
        assert!(!d.contains(0x1000) && !d.contains(0x8000));
        assert!(d.0.is_empty());
    }

    #[test]
    fn marks_follow_a_move_and_replace_the_target() {
        let mut d = Ranges::default();
        d.add(0x2000, 0x4000); // marked part of the moved range
        d.add(0x20000, 0x21000); // a mark at the target: that mapping is replaced
        d.moved(0x1000, 0x10000, 0x12000);
        assert!(!d.contains(0x2000) && !d.contains(0x3fff));
        assert!(!d.contains(0x10000) && d.contains(0x11000) && d.contains(0x12fff));
        assert!(!d.contains(0x13000) && !d.contains(0x20000));
    }

    #[test]
    fn either_mark_keeps_the_contents_from_the_child() {
        let mut m = ForkMarks::default();
        m.advise(0x1000, 0x3000, ForkAdvice::WipeOnFork);
        m.advise(0x2000, 0x5000, ForkAdvice::DontFork);
        assert!(m.child_gets(0) && !m.child_gets(0x1000) && !m.child_gets(0x4000));
        m.advise(0x1000, 0x3000, ForkAdvice::KeepOnFork);
        assert!(m.child_gets(0x1000) && !m.child_gets(0x2000));
        m.advise(0, 0x10000, ForkAdvice::DoFork);
        assert!(m.child_gets(0x2000) && m.child_gets(0x4000));
        m.advise(0x1000, 0x2000, ForkAdvice::WipeOnFork);
        m.forget(0, 0x10000);
        assert!(m.child_gets(0x1000));
    }
}
