//! Active and inactive lists with refault detection: Linux's page-cache working-set rule, with
//! only what a userfaultfd pager can observe.
//!
//! # Design
//!
//! The kernel orders its lists by the accessed bits of page-table entries; a user-space pager
//! never sees an access to a resident page, only faults. FIFO therefore evicts a page that the
//! program uses all the time as readily as one it touched once, and the hot page faults straight
//! back (a numpy matmul swept its 200 MB result matrix twenty times and FIFO evicted it every
//! time: 4x the pages swap moved). What the pager does see is a *refault*: a page faulting
//! back in shortly after it was evicted. This policy keeps
//!
//! - an **inactive** list (FIFO) where pages enter, and victims come from;
//! - an **active** list (FIFO) of pages that proved they are in use: a refault, or an access the
//!   caller saw while resident (a write-protect fault, a prefetch hit used again);
//! - a **ghost** list of the most recently evicted page numbers, as many as resident pages: a
//!   page inserted while in it refaulted within one memory's worth of evictions — it would
//!   have stayed resident with a little more memory or a better choice — and enters the active
//!   list.
//!
//! The active list is bounded (`active_share`, default 3/4 of the tracked pages): beyond it,
//! its oldest pages go back to the tail of the inactive list, where they get a full round to be
//! re-activated by a touch before they can be evicted. A streaming scan larger than memory
//! never refaults within the ghost's reach and stays on the inactive list: it behaves as FIFO.
//!
//! # Limitations
//!
//! Ghost entries are page numbers: a released page whose address is reused by a new mapping
//! may be activated once by mistake (costs only its protection).

use super::{Contains, EvictionPolicy};
use crate::linked::LinkedSet;
use crate::{Origin, PolicyError};

/// Configuration of [`Refault`].
#[derive(Debug, Clone, PartialEq)]
pub struct RefaultConfig {
    /// Largest share of tracked pages on the active list, in (0, 1). Default 0.75.
    pub active_share: f64,
}

impl Default for RefaultConfig {
    fn default() -> Self {
        Self { active_share: 0.75 }
    }
}

impl RefaultConfig {
    /// Checks `active_share` is strictly between 0 and 1.
    pub fn validate(&self) -> Result<(), PolicyError> {
        if !(self.active_share > 0.0 && self.active_share < 1.0) {
            return Err(PolicyError::InvalidConfig {
                policy: "refault",
                reason: format!(
                    "active_share is {}; use a value strictly between 0 and 1",
                    self.active_share
                ),
            });
        }
        Ok(())
    }
}

/// Active/inactive lists with refault detection; see the module docs.
#[derive(Debug)]
pub struct Refault {
    cfg: RefaultConfig,
    inactive: LinkedSet,
    active: LinkedSet,
    /// Recently evicted pages, oldest first, at most as many as tracked pages.
    ghost: LinkedSet,
    /// Pages activated by a refault (for tests and tuning).
    activations: u64,
}

impl Refault {
    /// An empty policy; fails if `cfg` is out of range.
    pub fn new(cfg: RefaultConfig) -> Result<Self, PolicyError> {
        cfg.validate()?;
        Ok(Self {
            cfg,
            inactive: LinkedSet::new(),
            active: LinkedSet::new(),
            ghost: LinkedSet::new(),
            activations: 0,
        })
    }

    /// Pages that entered the active list because they refaulted.
    pub fn refault_activations(&self) -> u64 {
        self.activations
    }

    fn max_active(&self) -> usize {
        ((self.len() as f64) * self.cfg.active_share) as usize
    }
}

impl Contains for Refault {
    fn contains(&self, page: u64) -> bool {
        self.inactive.contains(page) || self.active.contains(page)
    }
}

impl EvictionPolicy for Refault {
    fn name(&self) -> &'static str {
        "refault"
    }

    fn insert(&mut self, page: u64, _origin: Origin) {
        if self.contains(page) {
            self.touched(page);
            return;
        }
        if self.ghost.remove(page) {
            self.activations += 1;
            self.active.push_back(page);
        } else {
            self.inactive.push_back(page);
        }
    }

    fn touched(&mut self, page: u64) {
        // Seen in use while resident: to the active list's tail (refreshed if there already).
        if self.inactive.remove(page) || self.active.remove(page) {
            self.active.push_back(page);
        }
    }

    fn remove(&mut self, page: u64) {
        if !self.inactive.remove(page) {
            self.active.remove(page);
        }
    }

    fn pick_victim(&mut self) -> Option<u64> {
        let max_active = self.max_active();
        while self.active.len() > max_active {
            match self.active.pop_front() {
                Some(p) => {
                    self.inactive.push_back(p);
                }
                None => break,
            }
        }
        let victim = self
            .inactive
            .pop_front()
            .or_else(|| self.active.pop_front())?;
        self.ghost.push_back(victim);
        let cap = self.len().max(1);
        while self.ghost.len() > cap {
            self.ghost.pop_front();
        }
        Some(victim)
    }

    fn len(&self) -> usize {
        self.inactive.len() + self.active.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy() -> Refault {
        Refault::new(RefaultConfig::default()).unwrap()
    }

    #[test]
    fn a_page_that_refaults_is_protected_from_a_stream() {
        let mut p = policy();
        for page in 0..8 {
            p.insert(page, Origin::Demand);
        }
        // Page 0 is evicted first (FIFO among inactive pages) and faults right back.
        assert_eq!(p.pick_victim(), Some(0));
        p.insert(0, Origin::Demand);
        assert_eq!(p.refault_activations(), 1);
        // A stream of new pages: each evicts the oldest inactive page, never page 0.
        let mut victims = Vec::new();
        for page in 100..120 {
            victims.push(p.pick_victim().unwrap());
            p.insert(page, Origin::Demand);
        }
        assert!(!victims.contains(&0), "{victims:?}");
        assert_eq!(&victims[..7], &[1, 2, 3, 4, 5, 6, 7]);
        assert!(p.contains(0));
    }

    #[test]
    fn a_stream_larger_than_memory_is_fifo() {
        let mut p = policy();
        let mem = 16u64;
        for page in 0..mem {
            p.insert(page, Origin::Demand);
        }
        // Scanning 64 pages twice through 16: reuse distance 64 > the ghost's 16, no activation.
        let mut evicted = Vec::new();
        for _ in 0..2 {
            for page in 0..64u64 {
                if p.contains(page) {
                    continue;
                }
                evicted.push(p.pick_victim().unwrap());
                p.insert(page, Origin::Demand);
            }
        }
        assert_eq!(p.refault_activations(), 0);
        assert_eq!(&evicted[..4], &[0, 1, 2, 3]);
    }

    #[test]
    fn touched_pages_become_active_and_the_active_list_is_bounded() {
        let mut p = Refault::new(RefaultConfig { active_share: 0.5 }).unwrap();
        for page in 0..4 {
            p.insert(page, Origin::Demand);
        }
        for page in 0..4 {
            p.touched(page); // all active now
        }
        p.touched(99); // unknown: ignored
                       // Active holds at most half of 4: its two oldest go back to the inactive list first.
        assert_eq!(p.pick_victim(), Some(0));
        assert_eq!(p.pick_victim(), Some(1));
        // 2 and 3 remain; 2 is demoted when the bound (half of 2 = 1) is exceeded.
        assert_eq!(p.pick_victim(), Some(2));
        assert_eq!(p.pick_victim(), Some(3));
        assert_eq!(p.pick_victim(), None);
    }

    #[test]
    fn the_ghost_list_holds_at_most_as_many_pages_as_are_tracked() {
        let mut p = policy();
        for page in 0..4 {
            p.insert(page, Origin::Demand);
        }
        for _ in 0..4 {
            p.pick_victim();
        }
        // Nothing tracked: at most one ghost (the newest).
        assert_eq!(p.ghost.len(), 1);
        p.insert(3, Origin::Demand);
        assert_eq!(p.refault_activations(), 1);
        p.insert(0, Origin::Demand); // forgotten: an ordinary insert
        assert_eq!(p.refault_activations(), 1);
    }

    #[test]
    fn config_is_validated() {
        for bad in [0.0, 1.0, -0.5, f64::NAN] {
            let e = Refault::new(RefaultConfig { active_share: bad }).unwrap_err();
            assert!(e.to_string().contains("strictly between 0 and 1"), "{e}");
        }
    }
}
