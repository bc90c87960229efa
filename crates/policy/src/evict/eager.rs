//! Leap's eager eviction of prefetched pages, as a wrapper around another policy.
//!
//! Leap keeps prefetched pages on their own FIFO list. A prefetched page that has been hit has
//! done its job: it becomes the first eviction candidate, unless it is hit again, in which case
//! it is treated as an ordinary page from then on (Leap exempts repeatedly used pages). A
//! prefetched page never hit is evicted before ordinary pages, FIFO among its kind. Ordinary
//! (demand) pages follow the wrapped policy.
//!
//! Victim order: consumed prefetched pages (oldest first), then unused prefetched pages (oldest
//! first), then the wrapped policy's choice. Every call is O(1) plus the wrapped policy's cost.

use super::EvictionPolicy;
use crate::linked::LinkedSet;
use crate::Origin;

/// Configuration of [`Eager`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EagerConfig {
    /// Evict prefetched pages that were hit once before anything else (Leap). Default: true.
    pub evict_consumed_first: bool,
    /// Evict prefetched pages never hit before ordinary pages. Default: true.
    pub evict_unused_prefetch_first: bool,
}

impl Default for EagerConfig {
    fn default() -> Self {
        Self {
            evict_consumed_first: true,
            evict_unused_prefetch_first: true,
        }
    }
}

/// Leap's eager eviction around the policy `P`.
#[derive(Debug)]
pub struct Eager<P> {
    cfg: EagerConfig,
    inner: P,
    /// Prefetched, not yet hit.
    unused: LinkedSet,
    /// Prefetched and hit exactly once.
    consumed: LinkedSet,
}

impl<P: EvictionPolicy> Eager<P> {
    /// Wraps `inner`.
    pub fn new(inner: P, cfg: EagerConfig) -> Self {
        Self {
            cfg,
            inner,
            unused: LinkedSet::new(),
            consumed: LinkedSet::new(),
        }
    }

    /// The wrapped policy.
    pub fn inner(&self) -> &P {
        &self.inner
    }
}

impl<P: EvictionPolicy> EvictionPolicy for Eager<P> {
    fn name(&self) -> &'static str {
        self.inner.name()
    }

    fn insert(&mut self, page: u64, origin: Origin) {
        if self.unused.contains(page) || self.consumed.contains(page) {
            self.touched(page);
            return;
        }
        match origin {
            Origin::Prefetch => {
                self.unused.push_back(page);
            }
            Origin::Demand => self.inner.insert(page, origin),
        }
    }

    fn touched(&mut self, page: u64) {
        if self.unused.remove(page) {
            // First hit of a prefetched page: it has served its purpose.
            self.consumed.push_back(page);
        } else if self.consumed.remove(page) {
            // Hit again: used repeatedly, exempt from eager eviction from now on.
            self.inner.insert(page, Origin::Demand);
        } else {
            self.inner.touched(page);
        }
    }

    fn remove(&mut self, page: u64) {
        if !self.unused.remove(page) && !self.consumed.remove(page) {
            self.inner.remove(page);
        }
    }

    fn pick_victim(&mut self) -> Option<u64> {
        if self.cfg.evict_consumed_first {
            if let Some(p) = self.consumed.pop_front() {
                return Some(p);
            }
        }
        if self.cfg.evict_unused_prefetch_first {
            if let Some(p) = self.unused.pop_front() {
                return Some(p);
            }
        }
        if let Some(p) = self.inner.pick_victim() {
            return Some(p);
        }
        // The wrapped policy is empty: whatever prefetched pages remain go, oldest first.
        self.consumed
            .pop_front()
            .or_else(|| self.unused.pop_front())
    }

    fn len(&self) -> usize {
        self.inner.len() + self.unused.len() + self.consumed.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::evict::{Clock, ClockConfig, Fifo, FifoConfig};

    fn eager_fifo() -> Eager<Fifo> {
        Eager::new(Fifo::new(FifoConfig::default()), EagerConfig::default())
    }

    #[test]
    fn consumed_prefetch_goes_first_then_unused_fifo_then_demand() {
        let mut e = eager_fifo();
        e.insert(1, Origin::Demand);
        e.insert(10, Origin::Prefetch);
        e.insert(11, Origin::Prefetch);
        e.insert(12, Origin::Prefetch);
        e.insert(2, Origin::Demand);
        e.touched(12); // consumed once
        assert_eq!(e.len(), 5);
        assert_eq!(e.pick_victim(), Some(12));
        assert_eq!(e.pick_victim(), Some(10));
        assert_eq!(e.pick_victim(), Some(11));
        assert_eq!(e.pick_victim(), Some(1));
        assert_eq!(e.pick_victim(), Some(2));
        assert_eq!(e.pick_victim(), None);
    }

    #[test]
    fn prefetched_page_hit_twice_becomes_ordinary() {
        let mut e = eager_fifo();
        e.insert(5, Origin::Prefetch);
        e.insert(1, Origin::Demand);
        e.touched(5);
        e.touched(5); // second hit: joins the FIFO behind 1
        e.insert(6, Origin::Prefetch);
        assert_eq!(e.pick_victim(), Some(6));
        assert_eq!(e.pick_victim(), Some(1));
        assert_eq!(e.pick_victim(), Some(5));
    }

    #[test]
    fn remove_finds_the_page_on_any_list() {
        let mut e = Eager::new(Clock::new(ClockConfig::default()), EagerConfig::default());
        e.insert(1, Origin::Demand);
        e.insert(2, Origin::Prefetch);
        e.insert(3, Origin::Prefetch);
        e.touched(3);
        e.remove(1);
        e.remove(2);
        e.remove(3);
        e.remove(4);
        assert_eq!(e.len(), 0);
        assert_eq!(e.pick_victim(), None);
    }

    #[test]
    fn disabled_eagerness_defers_prefetched_pages_to_the_end() {
        let cfg = EagerConfig {
            evict_consumed_first: false,
            evict_unused_prefetch_first: false,
        };
        let mut e = Eager::new(Fifo::new(FifoConfig::default()), cfg);
        e.insert(9, Origin::Prefetch);
        e.insert(1, Origin::Demand);
        assert_eq!(e.pick_victim(), Some(1));
        assert_eq!(e.pick_victim(), Some(9));
    }
}
