//! The budget of resident region pages and the evictor's watermarks derived from it.
//!
//! The budget changes while the runtime runs: under `farmem run` every process of a program's
//! tree shares one `--local-mem`, and a coordinator moves budget to the processes that fault
//! (crate farmem-tree). Readers take one relaxed load per check; a change is seen by the next
//! check, and the evictor is woken so a lowered budget is enforced at once.

use std::sync::atomic::{AtomicU64, Ordering};

/// Victims picked per evictor round (the high watermark is half the headroom, up to 512
/// pages, above the low one: a wake-up's worth takes up to four rounds). Each round costs its MOVE
/// ioctls' TLB flushes (an IPI to every other CPU the program runs on, waited for), the state
/// lock twice and a wake of the sender. At 32 a round every `compare` workload at 0.5 did
/// worse, in pairs interleaved on one machine, by 2-28% and with more CPU (seq 6.56 vs 5.12
/// µs an access, kmeans 7.37 vs 6.17 s, jvm-heap 17.98 vs 14.47 s, numpy 8.24 and 7.93 vs
/// 7.84 and 7.74 s, node-heap 12.09 vs 11.77 s); 256 was no better than 128.
pub(crate) const EVICT_BATCH: usize = 128;

/// Resident-page limit and watermarks, all in pages.
#[derive(Debug)]
pub(crate) struct Budget {
    limit: AtomicU64,
    low: AtomicU64,
    high: AtomicU64,
}

/// What a runtime uses and moves ([`crate::Runtime::usage`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    /// Local pages in use: resident region pages plus write-back pool pages in use.
    pub used_pages: u64,
    /// The budget of resident region pages now.
    pub budget_pages: u64,
    /// Pages brought back from far memory so far (faults served from the pool, the host tier
    /// or a donor, and pages installed or prefetched ahead).
    pub fetched_pages: u64,
    /// Pages evicted so far.
    pub evicted_pages: u64,
}

/// The least budget a runtime accepts (the evictor needs some room to work with).
pub(crate) const MIN_BUDGET_PAGES: u64 = 16;

impl Budget {
    pub(crate) fn new(pages: u64) -> Budget {
        let b = Budget {
            limit: AtomicU64::new(0),
            low: AtomicU64::new(0),
            high: AtomicU64::new(0),
        };
        b.set(pages);
        b
    }

    /// Sets the limit (at least [`MIN_BUDGET_PAGES`]). The evictor brings resident pages down
    /// to `low` (the limit minus a headroom of 1/16, 2 to 1024 pages) once they reach `high`
    /// (halfway between), so it works in batches and a fault rarely waits for it. Pages are
    /// installed ahead only below `high` (`fault::install_ahead`): at most 256 pages, a
    /// pure stream's 64-page windows were cut short and its scan took 2.5x the faults (seq
    /// at 0.5, 1 GiB: 77-90 k tier faults against 32 k).
    pub(crate) fn set(&self, pages: u64) -> u64 {
        let pages = pages.max(MIN_BUDGET_PAGES);
        let headroom = (pages / 16).clamp(2, 1024);
        // Lower the watermarks first when shrinking, the limit first when growing, so a
        // reader never sees a low watermark above the limit.
        if pages < self.limit.load(Ordering::Relaxed) {
            self.low.store(pages - headroom, Ordering::Relaxed);
            self.high.store(pages - headroom / 2, Ordering::Relaxed);
            self.limit.store(pages, Ordering::Relaxed);
        } else {
            self.limit.store(pages, Ordering::Relaxed);
            self.high.store(pages - headroom / 2, Ordering::Relaxed);
            self.low.store(pages - headroom, Ordering::Relaxed);
        }
        pages
    }

    pub(crate) fn limit(&self) -> u64 {
        self.limit.load(Ordering::Relaxed)
    }

    pub(crate) fn low_water(&self) -> u64 {
        self.low.load(Ordering::Relaxed)
    }

    pub(crate) fn high_water(&self) -> u64 {
        self.high.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn watermarks_follow_the_limit_both_ways() {
        let b = Budget::new(1024);
        assert_eq!((b.limit(), b.low_water(), b.high_water()), (1024, 960, 992));
        b.set(100_000);
        assert_eq!(
            (b.limit(), b.low_water(), b.high_water()),
            (100_000, 98_976, 99_488)
        );
        assert_eq!(b.set(3), MIN_BUDGET_PAGES);
        assert_eq!((b.limit(), b.low_water(), b.high_water()), (16, 14, 15));
    }
}
