//! FIFO eviction: pages leave in the order they arrived, whatever their use since.
//!
//! The memory-blade study found this round-robin replacement as good as Clock once remote
//! accesses cost microseconds, because it costs nothing per access; it is farmem's default.

use super::{Contains, EvictionPolicy};
use crate::linked::LinkedSet;
use crate::Origin;

/// Configuration of [`Fifo`] (it has no knobs; kept for uniformity with the other policies).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FifoConfig {}

/// First in, first out.
#[derive(Debug, Default)]
pub struct Fifo {
    order: LinkedSet,
}

impl Fifo {
    /// An empty FIFO.
    pub fn new(_cfg: FifoConfig) -> Self {
        Self {
            order: LinkedSet::new(),
        }
    }
}

impl Contains for Fifo {
    fn contains(&self, page: u64) -> bool {
        self.order.contains(page)
    }
}

impl EvictionPolicy for Fifo {
    fn name(&self) -> &'static str {
        "fifo"
    }

    fn insert(&mut self, page: u64, _origin: Origin) {
        self.order.push_back(page);
    }

    fn touched(&mut self, _page: u64) {}

    fn remove(&mut self, page: u64) {
        self.order.remove(page);
    }

    fn pick_victim(&mut self) -> Option<u64> {
        self.order.pop_front()
    }

    fn len(&self) -> usize {
        self.order.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn evicts_in_arrival_order_ignoring_touches() {
        let mut f = Fifo::new(FifoConfig::default());
        for p in [10, 20, 30, 40] {
            f.insert(p, Origin::Demand);
        }
        f.touched(10);
        f.touched(10);
        f.remove(30);
        f.remove(999); // unknown: ignored
        f.insert(20, Origin::Demand); // already resident: not moved, not duplicated
        assert_eq!(f.len(), 3);
        assert_eq!(f.pick_victim(), Some(10));
        f.insert(50, Origin::Prefetch);
        assert_eq!(f.pick_victim(), Some(20));
        assert_eq!(f.pick_victim(), Some(40));
        assert_eq!(f.pick_victim(), Some(50));
        assert_eq!(f.pick_victim(), None);
        assert!(f.is_empty());
    }
}
