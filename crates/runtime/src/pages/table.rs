//! The sparse page table: where every page of every region is right now. Private to
//! [`crate::pages`], which changes entries only through its transitions.
//!
//! Regions are address ranges kept in a `BTreeMap` by start address; each holds its page
//! entries in lazily allocated chunks of 512, so a large, mostly untouched reservation (the
//! preload library reserves big heaps) costs one pointer per 2 MiB until it is used.
//!
//! An [`Entry`] is the page's [`PageState`], the write-back pool slot holding it (if any), the
//! staging generation of its last send, and its far page number (where its donor copy lives,
//! [`NO_FAR`] if none). Far page numbers are handed out by the runtime's far-page allocator,
//! independent of addresses, so `mremap` moves entries without moving donor data.

use std::collections::BTreeMap;

use super::{Entry, PageState, NO_FAR};
use farmem_proto::PAGE_SIZE;

/// Pages per table chunk.
const CHUNK_PAGES: usize = 512;

/// One registered address range and its entries.
pub(super) struct RegionRec {
    pub(super) end: usize,
    chunks: Vec<Option<Box<[Entry]>>>,
}

impl RegionRec {
    pub(super) fn new(start: usize, end: usize) -> RegionRec {
        let pages = (end - start) / PAGE_SIZE;
        RegionRec {
            end,
            chunks: (0..pages.div_ceil(CHUNK_PAGES)).map(|_| None).collect(),
        }
    }
}

/// The page table of all regions.
#[derive(Default)]
pub(super) struct Table {
    regions: BTreeMap<usize, RegionRec>,
}

impl Table {
    /// Adds the range `start..end` (page-aligned, not overlapping any other).
    pub(super) fn add(&mut self, start: usize, end: usize) {
        self.regions.insert(start, RegionRec::new(start, end));
    }

    /// The region containing `addr`: (start, end).
    pub(super) fn find(&self, addr: usize) -> Option<(usize, usize)> {
        let (s, r) = self.regions.range(..=addr).next_back()?;
        (addr < r.end).then_some((*s, r.end))
    }

    /// Whether `start..end` overlaps a known region.
    pub(super) fn overlaps(&self, start: usize, end: usize) -> bool {
        self.regions
            .range(..end)
            .next_back()
            .is_some_and(|(_, r)| r.end > start)
    }

    /// The entry of the page at `addr`, if it lies in a region (never allocates).
    pub(super) fn get(&self, addr: usize) -> Option<Entry> {
        let (s, r) = self.regions.range(..=addr).next_back()?;
        if addr >= r.end {
            return None;
        }
        let i = (addr - s) / PAGE_SIZE;
        Some(match &r.chunks[i / CHUNK_PAGES] {
            Some(c) => c[i % CHUNK_PAGES],
            None => Entry::default(),
        })
    }

    /// The entry of the page at `addr` for update (allocating its chunk), if in a region.
    pub(super) fn get_mut(&mut self, addr: usize) -> Option<&mut Entry> {
        let (s, r) = self.regions.range_mut(..=addr).next_back()?;
        if addr >= r.end {
            return None;
        }
        let i = (addr - *s) / PAGE_SIZE;
        let c = r.chunks[i / CHUNK_PAGES]
            .get_or_insert_with(|| vec![Entry::default(); CHUNK_PAGES].into_boxed_slice());
        Some(&mut c[i % CHUNK_PAGES])
    }

    /// Calls `f(addr, entry)` for every non-empty entry in `start..end`, letting it change the
    /// entry. Unallocated chunks are skipped (all their entries are empty).
    pub(super) fn for_each_in(
        &mut self,
        start: usize,
        end: usize,
        mut f: impl FnMut(usize, &mut Entry),
    ) {
        let keys: Vec<usize> = self
            .regions
            .range(..end)
            .filter(|(s, r)| r.end > start && **s < end)
            .map(|(s, _)| *s)
            .collect();
        for s in keys {
            let r = self.regions.get_mut(&s).expect("key just listed");
            let lo = start.max(s);
            let hi = end.min(r.end);
            let mut addr = lo & !(PAGE_SIZE - 1);
            while addr < hi {
                let i = (addr - s) / PAGE_SIZE;
                match &mut r.chunks[i / CHUNK_PAGES] {
                    None => {
                        // Skip to the next chunk.
                        let next = s + (i / CHUNK_PAGES + 1) * CHUNK_PAGES * PAGE_SIZE;
                        addr = next;
                    }
                    Some(c) => {
                        let e = &mut c[i % CHUNK_PAGES];
                        if e.state != PageState::Empty || e.far != NO_FAR {
                            f(addr, e);
                        }
                        addr += PAGE_SIZE;
                    }
                }
            }
        }
    }

    /// Removes `start..end` from the regions (splitting or trimming them); the caller has
    /// already released the entries there.
    pub(super) fn remove_range(&mut self, start: usize, end: usize) {
        let keys: Vec<usize> = self
            .regions
            .range(..end)
            .filter(|(s, r)| r.end > start && **s < end)
            .map(|(s, _)| *s)
            .collect();
        for s in keys {
            let r = self.regions.remove(&s).expect("key just listed");
            // Keep the parts outside start..end, copying their entries.
            let old_end = r.end;
            if s < start {
                let mut left = RegionRec::new(s, start);
                copy_entries(&r, s, &mut left, s, s, start);
                self.regions.insert(s, left);
            }
            if old_end > end {
                let mut right = RegionRec::new(end, old_end);
                copy_entries(&r, s, &mut right, end, end, old_end);
                self.regions.insert(end, right);
            }
        }
    }

    /// All regions: (start, end).
    pub(super) fn ranges(&self) -> Vec<(usize, usize)> {
        self.regions.iter().map(|(s, r)| (*s, r.end)).collect()
    }
}

fn copy_entries(
    from: &RegionRec,
    from_start: usize,
    to: &mut RegionRec,
    to_start: usize,
    lo: usize,
    hi: usize,
) {
    let mut addr = lo;
    while addr < hi {
        let i = (addr - from_start) / PAGE_SIZE;
        if let Some(c) = &from.chunks[i / CHUNK_PAGES] {
            let e = c[i % CHUNK_PAGES];
            if e != Entry::default() {
                let j = (addr - to_start) / PAGE_SIZE;
                let tc = to.chunks[j / CHUNK_PAGES]
                    .get_or_insert_with(|| vec![Entry::default(); CHUNK_PAGES].into_boxed_slice());
                tc[j % CHUNK_PAGES] = e;
            }
        }
        addr += PAGE_SIZE;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const P: usize = PAGE_SIZE;

    #[test]
    fn find_get_and_sparse_iteration() {
        let mut t = Table::default();
        let base = 0x1000_0000;
        t.add(base, base + 2000 * P);
        assert_eq!(t.find(base + 5 * P), Some((base, base + 2000 * P)));
        assert_eq!(t.find(base + 2000 * P), None);
        assert_eq!(t.find(base - 1), None);
        assert_eq!(t.get(base + 7 * P), Some(Entry::default()));
        t.get_mut(base + 7 * P).unwrap().state = PageState::ResidentDirty;
        t.get_mut(base + 1500 * P).unwrap().state = PageState::Remote;
        let mut seen = Vec::new();
        t.for_each_in(base, base + 2000 * P, |a, e| {
            seen.push(((a - base) / P, e.state))
        });
        assert_eq!(
            seen,
            vec![(7, PageState::ResidentDirty), (1500, PageState::Remote)]
        );
        assert!(t.overlaps(base + 10 * P, base + 11 * P));
        assert!(!t.overlaps(base + 2000 * P, base + 2001 * P));
    }

    #[test]
    fn remove_range_splits_and_keeps_entries() {
        let mut t = Table::default();
        let base = 0x2000_0000;
        t.add(base, base + 1200 * P);
        t.get_mut(base + 2 * P).unwrap().state = PageState::Remote;
        t.get_mut(base + 1100 * P).unwrap().state = PageState::PoolSent;
        t.remove_range(base + 10 * P, base + 1000 * P);
        assert_eq!(
            t.ranges(),
            vec![(base, base + 10 * P), (base + 1000 * P, base + 1200 * P)]
        );
        assert_eq!(t.get(base + 2 * P).unwrap().state, PageState::Remote);
        assert_eq!(t.get(base + 1100 * P).unwrap().state, PageState::PoolSent);
        assert_eq!(t.get(base + 500 * P), None);
    }
}
