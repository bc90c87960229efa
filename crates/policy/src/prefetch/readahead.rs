//! The `readahead` prefetcher: Linux's swap readahead (`swapin_readahead` with the window of
//! `swapin_nr_pages`, mm/swap_state.c), the default Leap's paper measures against.
//!
//! On a fault at page `p` it reads the aligned block of `n` pages containing `p`
//! (`p & !(n-1) .. +n`, all but `p` itself being prefetches), where `n` is decided from the
//! readahead hits since the previous fault, as Linux does:
//!
//! - `hits + 2`; if that is 2 (no hits), `n` is 2 when `p` is adjacent to the previous such
//!   fault (the "access history of size 2") and 1, no readahead, otherwise;
//!   else rounded up to a power of two ≥ 4;
//! - capped at `2^page_cluster` (default 8 pages);
//! - never less than half the previous window ("don't shrink readahead too fast").
//!
//! # Limitations
//!
//! Linux counts hits per system (one global counter); here they are per prefetcher instance,
//! i.e. per process.

use super::{Access, Prefetcher};
use crate::PolicyError;

/// Configuration of [`Readahead`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadaheadConfig {
    /// log2 of the largest window (Linux's `vm.page-cluster`). Default 3: 8 pages.
    pub page_cluster: u32,
}

impl Default for ReadaheadConfig {
    fn default() -> Self {
        Self { page_cluster: 3 }
    }
}

/// Linux swap readahead.
#[derive(Debug)]
pub struct Readahead {
    max_pages: u64,
    hits: u64,
    prev_offset: u64,
    last_window: u64,
}

impl Readahead {
    /// A readahead prefetcher; fails if `page_cluster` is above 8 (256 pages).
    pub fn new(cfg: ReadaheadConfig) -> Result<Self, PolicyError> {
        if cfg.page_cluster > 8 {
            return Err(PolicyError::InvalidConfig {
                policy: "readahead",
                reason: format!("page_cluster is {}; use 0..=8", cfg.page_cluster),
            });
        }
        Ok(Self {
            max_pages: 1 << cfg.page_cluster,
            hits: 0,
            prev_offset: 0,
            last_window: 0,
        })
    }

    /// The window size chosen at the last fault, in pages.
    pub fn last_window(&self) -> u64 {
        self.last_window
    }

    fn window(&mut self, page: u64) -> u64 {
        if self.max_pages <= 1 {
            return 1;
        }
        let mut pages = std::mem::take(&mut self.hits) + 2;
        if pages == 2 {
            if page != self.prev_offset.wrapping_add(1) && page != self.prev_offset.wrapping_sub(1)
            {
                pages = 1;
            }
            self.prev_offset = page;
        } else {
            pages = pages.next_power_of_two().max(4);
        }
        pages = pages.min(self.max_pages);
        pages = pages.max(self.last_window / 2);
        self.last_window = pages;
        pages
    }
}

impl Prefetcher for Readahead {
    fn name(&self) -> &'static str {
        "readahead"
    }

    fn on_access(&mut self, access: &Access, out: &mut Vec<u64>) {
        if access.prefetch_hit {
            self.hits += 1;
            return;
        }
        let n = self.window(access.page);
        if n <= 1 {
            return;
        }
        let start = access.page & !(n - 1);
        out.extend((start..start.saturating_add(n)).filter(|&p| p != access.page));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::prefetch::test_access as acc;

    #[test]
    fn isolated_faults_read_nothing_adjacent_faults_read_an_aligned_pair() {
        let mut r = Readahead::new(ReadaheadConfig::default()).unwrap();
        let mut out = Vec::new();
        r.on_access(&acc(1000, false), &mut out);
        r.on_access(&acc(77, false), &mut out);
        assert!(out.is_empty(), "no hits, not adjacent: window 1");
        r.on_access(&acc(78, false), &mut out);
        assert_eq!(out, vec![79], "adjacent to 77: aligned block 78..80");
        assert_eq!(r.last_window(), 2);
    }

    #[test]
    fn hits_grow_the_aligned_window_and_it_shrinks_by_halves() {
        let mut r = Readahead::new(ReadaheadConfig::default()).unwrap();
        let mut out = Vec::new();
        r.on_access(&acc(9, false), &mut out);
        r.on_access(&acc(10, false), &mut out);
        assert_eq!(out, vec![11]);
        out.clear();
        r.on_access(&acc(11, true), &mut out); // 1 hit: 3 -> 4
        r.on_access(&acc(12, false), &mut out);
        assert_eq!(out, vec![13, 14, 15], "block 12..16");
        out.clear();
        for p in 13..16 {
            r.on_access(&acc(p, true), &mut out); // 3 hits: 5 -> 8
        }
        r.on_access(&acc(21, false), &mut out);
        assert_eq!(
            out,
            vec![16, 17, 18, 19, 20, 22, 23],
            "aligned block 16..24 around 21"
        );
        assert_eq!(r.last_window(), 8);
        out.clear();
        r.on_access(&acc(500, false), &mut out); // no hits, not adjacent: 1, but >= 8/2
        assert_eq!(r.last_window(), 4);
        assert_eq!(out, vec![501, 502, 503]);
        out.clear();
        r.on_access(&acc(900, false), &mut out);
        assert_eq!(r.last_window(), 2);
        assert_eq!(out, vec![901]);
        out.clear();
        r.on_access(&acc(3000, false), &mut out);
        assert_eq!(r.last_window(), 1);
        assert!(out.is_empty());
    }

    #[test]
    fn rejects_huge_clusters() {
        assert!(Readahead::new(ReadaheadConfig { page_cluster: 9 }).is_err());
        let mut r = Readahead::new(ReadaheadConfig { page_cluster: 0 }).unwrap();
        let mut out = Vec::new();
        r.on_access(&acc(1, false), &mut out);
        r.on_access(&acc(2, false), &mut out);
        assert!(out.is_empty(), "page_cluster 0 disables readahead");
    }
}
