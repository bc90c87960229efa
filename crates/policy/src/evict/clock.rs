//! Clock (second chance) eviction: pages sit on a ring; the hand skips, and clears, pages whose
//! reference bit is set, and evicts the first page found unreferenced.
//!
//! The ring is an insertion-ordered list whose front is the hand: a referenced page at the
//! front loses its bit and moves to the back. Each bit set by [`touched`] is cleared at most once,
//! so a sweep is amortised O(1) per call.
//!
//! # Limitations
//!
//! The bit is set only by accesses the caller sees. The runtime sees faults and prefetch hits,
//! not the accesses to resident pages, so there clock degrades towards FIFO; the simulator
//! reports every access, as the hardware reference bits do in the memory-blade study.
//!
//! [`touched`]: super::EvictionPolicy::touched

use std::collections::HashSet;

use super::{Contains, EvictionPolicy};
use crate::linked::LinkedSet;
use crate::Origin;

/// Configuration of [`Clock`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClockConfig {
    /// Whether a page brought in by a demand fault starts with its reference bit set (it was
    /// just accessed). Prefetched pages always start unreferenced. Default: true.
    pub demand_starts_referenced: bool,
}

impl Default for ClockConfig {
    fn default() -> Self {
        Self {
            demand_starts_referenced: true,
        }
    }
}

/// Second-chance clock.
#[derive(Debug, Default)]
pub struct Clock {
    cfg: ClockConfig,
    ring: LinkedSet,
    referenced: HashSet<u64>,
}

impl Clock {
    /// An empty clock.
    pub fn new(cfg: ClockConfig) -> Self {
        Self {
            cfg,
            ring: LinkedSet::new(),
            referenced: HashSet::new(),
        }
    }
}

impl Contains for Clock {
    fn contains(&self, page: u64) -> bool {
        self.ring.contains(page)
    }
}

impl EvictionPolicy for Clock {
    fn name(&self) -> &'static str {
        "clock"
    }

    fn insert(&mut self, page: u64, origin: Origin) {
        if !self.ring.push_back(page) {
            self.touched(page);
            return;
        }
        if origin == Origin::Demand && self.cfg.demand_starts_referenced {
            self.referenced.insert(page);
        }
    }

    fn touched(&mut self, page: u64) {
        if self.ring.contains(page) {
            self.referenced.insert(page);
        }
    }

    fn remove(&mut self, page: u64) {
        self.ring.remove(page);
        self.referenced.remove(&page);
    }

    fn pick_victim(&mut self) -> Option<u64> {
        loop {
            let page = self.ring.front()?;
            self.ring.remove(page);
            if self.referenced.remove(&page) {
                self.ring.push_back(page); // second chance
            } else {
                return Some(page);
            }
        }
    }

    fn len(&self) -> usize {
        self.ring.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unreferenced() -> Clock {
        Clock::new(ClockConfig {
            demand_starts_referenced: false,
        })
    }

    #[test]
    fn referenced_pages_get_a_second_chance() {
        let mut c = unreferenced();
        for p in [1, 2, 3, 4] {
            c.insert(p, Origin::Demand);
        }
        c.touched(1);
        c.touched(3);
        // Hand: 1 (referenced: cleared, to back), 2 (evicted).
        assert_eq!(c.pick_victim(), Some(2));
        // Ring now 3,4,1 with 3 referenced: 3 to back, 4 evicted.
        assert_eq!(c.pick_victim(), Some(4));
        // Ring 1,3, both cleared: plain order.
        assert_eq!(c.pick_victim(), Some(1));
        assert_eq!(c.pick_victim(), Some(3));
        assert_eq!(c.pick_victim(), None);
    }

    #[test]
    fn all_referenced_degenerates_to_fifo_after_one_sweep() {
        let mut c = unreferenced();
        for p in [7, 8, 9] {
            c.insert(p, Origin::Demand);
            c.touched(p);
        }
        assert_eq!(c.pick_victim(), Some(7));
        assert_eq!(c.len(), 2);
    }

    #[test]
    fn demand_pages_start_referenced_by_default_prefetched_do_not() {
        let mut c = Clock::new(ClockConfig::default());
        c.insert(1, Origin::Demand);
        c.insert(2, Origin::Prefetch);
        c.insert(3, Origin::Demand);
        assert_eq!(c.pick_victim(), Some(2));
        assert_eq!(c.pick_victim(), Some(1));
    }

    #[test]
    fn remove_and_unknown_pages() {
        let mut c = unreferenced();
        c.insert(1, Origin::Demand);
        c.insert(2, Origin::Demand);
        c.touched(42); // not resident: ignored
        c.remove(1);
        c.remove(1);
        c.insert(2, Origin::Demand); // duplicate: becomes a touch
        assert_eq!(c.len(), 1);
        assert_eq!(c.pick_victim(), Some(2));
        assert!(c.is_empty());
    }
}
