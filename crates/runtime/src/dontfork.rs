//! The parts of regions the program marked `MADV_DONTFORK` (V8 marks every heap page so): a
//! forked child has no mapping there, so their evicted pages need not come back before `fork`
//! (bringing a whole far heap back at each `child_process.spawn` would make local memory the
//! heap's size for the moment).
//!
//! # Design
//!
//! A set of disjoint ranges, each inside a region when added. A mark that outlived its mapping
//! would make the next fork skip the pages of an unrelated new mapping there (the child would
//! read zeros), so marks are removed whenever the kernel's flag goes: `MADV_DOFORK`, an UNMAP or
//! REMAP event over the range, and a region adopted over it (a new mapping carries no mark).

use std::collections::BTreeMap;

/// Disjoint ranges `start..end`, keyed by start.
#[derive(Default, Debug)]
pub(crate) struct DontFork(BTreeMap<usize, usize>);

impl DontFork {
    /// Marks `start..end`.
    pub(crate) fn add(&mut self, start: usize, end: usize) {
        if start >= end {
            return;
        }
        self.remove(start, end);
        self.0.insert(start, end);
    }

    /// Unmarks `start..end` (splitting ranges it covers partly).
    pub(crate) fn remove(&mut self, start: usize, end: usize) {
        if self.0.is_empty() || start >= end {
            return;
        }
        let hit: Vec<(usize, usize)> = self
            .0
            .range(..end)
            .filter(|(_, e)| **e > start)
            .map(|(s, e)| (*s, *e))
            .collect();
        for (s, e) in hit {
            self.0.remove(&s);
            if s < start {
                self.0.insert(s, start);
            }
            if e > end {
                self.0.insert(end, e);
            }
        }
    }

    /// Whether `addr` is marked.
    pub(crate) fn contains(&self, addr: usize) -> bool {
        self.0
            .range(..=addr)
            .next_back()
            .is_some_and(|(_, e)| addr < *e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marks_split_and_clear() {
        let mut d = DontFork::default();
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
}
