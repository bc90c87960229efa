//! Prefetch accounting, with the measures exactly as Leap defines them (section 3.1):
//!
//! - **accuracy** = prefetch hits / pages prefetched;
//! - **coverage** = prefetch hits / accesses that would have faulted without prefetching, i.e.
//!   prefetch hits + demand faults;
//! - **timeliness** = time from a page's prefetch to its first hit (p50 and p95 reported);
//! - **pollution** = prefetched pages evicted before they were ever used.
//!
//! [`PrefetchStats`] is fed by the simulator and by the runtime (which keeps one behind its
//! fault-path lock). Every call is O(1); memory is proportional to the prefetched pages still
//! resident and unused.

use std::collections::HashMap;

/// A log-linear histogram of `u64` values (e.g. nanoseconds): values below 16 are exact, larger
/// ones land in one of 16 sub-buckets per power of two (at most 1/16 ≈ 6% relative error).
#[derive(Debug, Clone)]
pub struct LatencyHistogram {
    counts: Vec<u64>,
    total: u64,
    max: u64,
}

const SUB_BITS: u32 = 4;
const SUB: u64 = 1 << SUB_BITS;

impl Default for LatencyHistogram {
    fn default() -> Self {
        Self {
            counts: vec![0; (64 * SUB) as usize],
            total: 0,
            max: 0,
        }
    }
}

impl LatencyHistogram {
    /// An empty histogram.
    pub fn new() -> Self {
        Self::default()
    }

    fn bucket(v: u64) -> usize {
        if v < SUB {
            return v as usize;
        }
        let exp = 63 - v.leading_zeros(); // >= SUB_BITS
        let sub = (v >> (exp - SUB_BITS)) & (SUB - 1);
        ((u64::from(exp - SUB_BITS + 1) << SUB_BITS) + sub) as usize
    }

    /// Smallest value that falls in bucket `b`.
    fn bucket_low(b: usize) -> u64 {
        let b = b as u64;
        if b < SUB {
            return b;
        }
        let exp = (b >> SUB_BITS) + u64::from(SUB_BITS) - 1;
        let sub = b & (SUB - 1);
        (1u64 << exp) | (sub << (exp - u64::from(SUB_BITS)))
    }

    /// Records one value.
    pub fn record(&mut self, v: u64) {
        self.counts[Self::bucket(v)] += 1;
        self.total += 1;
        self.max = self.max.max(v);
    }

    /// Number of values recorded.
    pub fn count(&self) -> u64 {
        self.total
    }

    /// The value at quantile `q` (0.0..=1.0): the lower bound of its bucket (exact below 16),
    /// never above the largest value recorded; `None` when empty.
    pub fn quantile(&self, q: f64) -> Option<u64> {
        if self.total == 0 {
            return None;
        }
        let rank = ((q.clamp(0.0, 1.0) * self.total as f64).ceil() as u64).max(1);
        let mut seen = 0;
        for (b, &c) in self.counts.iter().enumerate() {
            seen += c;
            if seen >= rank {
                return Some(Self::bucket_low(b).min(self.max));
            }
        }
        Some(self.max)
    }
}

/// A snapshot of [`PrefetchStats`], with the ratios computed.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PrefetchSummary {
    /// Accesses that faulted (page not resident).
    pub demand_faults: u64,
    /// Pages brought in by prefetching.
    pub prefetched: u64,
    /// First accesses to prefetched pages.
    pub prefetch_hits: u64,
    /// Prefetched pages evicted unused.
    pub pollution: u64,
    /// Prefetched pages that arrived after the program had already faulted them in (dropped).
    pub late: u64,
    /// prefetch_hits / prefetched (0 when nothing was prefetched).
    pub accuracy: f64,
    /// prefetch_hits / (prefetch_hits + demand_faults) (0 when both are 0).
    pub coverage: f64,
    /// Median time from prefetch to first hit, ns.
    pub timeliness_p50_ns: Option<u64>,
    /// 95th percentile of the time from prefetch to first hit, ns.
    pub timeliness_p95_ns: Option<u64>,
}

/// Counts prefetches, hits, faults and pollution; see the module docs for the definitions.
///
/// The caller reports: [`prefetched`](Self::prefetched) when a prefetched page is brought in,
/// [`prefetch_hit`](Self::prefetch_hit) for accesses to resident pages it sees,
/// [`demand_fault`](Self::demand_fault) for each fault, [`evicted`](Self::evicted) for every
/// page leaving residency, and [`late`](Self::late) when a prefetched page is dropped because
/// a demand fault got there first.
#[derive(Debug, Clone, Default)]
pub struct PrefetchStats {
    /// Prefetched pages not yet hit, with the time they were prefetched.
    unused: HashMap<u64, u64>,
    demand_faults: u64,
    prefetched: u64,
    prefetch_hits: u64,
    pollution: u64,
    late: u64,
    timeliness_ns: LatencyHistogram,
}

impl PrefetchStats {
    /// Empty counters.
    pub fn new() -> Self {
        Self::default()
    }

    /// `page` was brought in by a prefetch at `time_ns`. Returns false (and counts nothing) if
    /// it is already counted as prefetched and unused.
    pub fn prefetched(&mut self, page: u64, time_ns: u64) -> bool {
        if self.unused.contains_key(&page) {
            return false;
        }
        self.unused.insert(page, time_ns);
        self.prefetched += 1;
        true
    }

    /// An access at `time_ns` to resident `page`. If `page` was prefetched and is used for the
    /// first time, counts a prefetch hit, records its timeliness and returns true; otherwise
    /// (an ordinary hit) returns false and counts nothing. The caller can call this on every
    /// hit it sees and use the result as [`Access::prefetch_hit`].
    ///
    /// [`Access::prefetch_hit`]: crate::prefetch::Access::prefetch_hit
    pub fn prefetch_hit(&mut self, page: u64, time_ns: u64) -> bool {
        match self.unused.remove(&page) {
            Some(at) => {
                self.prefetch_hits += 1;
                self.timeliness_ns.record(time_ns.saturating_sub(at));
                true
            }
            None => false,
        }
    }

    /// An access faulted: the page was not resident.
    pub fn demand_fault(&mut self) {
        self.demand_faults += 1;
    }

    /// `page` left residency. Returns true, counting pollution, if it was prefetched and never
    /// used.
    pub fn evicted(&mut self, page: u64) -> bool {
        if self.unused.remove(&page).is_some() {
            self.pollution += 1;
            true
        } else {
            false
        }
    }

    /// A prefetch of a page was issued but the page is dropped on arrival (the program faulted
    /// it in first). Counts as prefetched, never as a hit.
    pub fn late(&mut self) {
        self.prefetched += 1;
        self.late += 1;
    }

    /// Whether `page` is a prefetched page not used yet.
    pub fn is_unused_prefetch(&self, page: u64) -> bool {
        self.unused.contains_key(&page)
    }

    /// The counters and measures now.
    pub fn summary(&self) -> PrefetchSummary {
        let ratio = |a: u64, b: u64| if b == 0 { 0.0 } else { a as f64 / b as f64 };
        PrefetchSummary {
            demand_faults: self.demand_faults,
            prefetched: self.prefetched,
            prefetch_hits: self.prefetch_hits,
            pollution: self.pollution,
            late: self.late,
            accuracy: ratio(self.prefetch_hits, self.prefetched),
            coverage: ratio(self.prefetch_hits, self.prefetch_hits + self.demand_faults),
            timeliness_p50_ns: self.timeliness_ns.quantile(0.50),
            timeliness_p95_ns: self.timeliness_ns.quantile(0.95),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leap_measures_on_a_small_history() {
        let mut s = PrefetchStats::new();
        // 3 faults; 4 pages prefetched; 2 of them hit (after 10 and 30 ns); 1 evicted unused;
        // 1 still resident and unused; 1 prefetch dropped because it arrived late.
        s.demand_fault();
        assert!(s.prefetched(10, 100));
        assert!(s.prefetched(11, 100));
        assert!(s.prefetched(12, 100));
        assert!(s.prefetched(13, 100));
        assert!(!s.prefetched(13, 105), "already counted");
        assert!(s.prefetch_hit(10, 110));
        assert!(!s.prefetch_hit(10, 111), "second access: ordinary hit");
        assert!(!s.prefetch_hit(99, 111), "never prefetched");
        assert!(s.prefetch_hit(11, 130));
        assert!(s.evicted(12));
        assert!(!s.evicted(10), "used before eviction: not pollution");
        s.demand_fault();
        s.demand_fault();
        s.late();
        assert!(s.is_unused_prefetch(13));
        let m = s.summary();
        assert_eq!(m.demand_faults, 3);
        assert_eq!(m.prefetched, 5);
        assert_eq!(m.prefetch_hits, 2);
        assert_eq!(m.pollution, 1);
        assert_eq!(m.late, 1);
        assert!((m.accuracy - 2.0 / 5.0).abs() < 1e-12);
        assert!((m.coverage - 2.0 / 5.0).abs() < 1e-12);
        assert_eq!(m.timeliness_p50_ns, Some(10));
        // Values below 32 are exact (one bucket per value).
        assert_eq!(m.timeliness_p95_ns, Some(30));
    }

    #[test]
    fn empty_stats_have_zero_ratios_and_no_timeliness() {
        let m = PrefetchStats::new().summary();
        assert_eq!((m.accuracy, m.coverage), (0.0, 0.0));
        assert_eq!(m.timeliness_p50_ns, None);
    }

    #[test]
    fn histogram_quantiles_are_within_one_sixteenth() {
        let mut h = LatencyHistogram::new();
        for v in 1..=10_000u64 {
            h.record(v * 1000);
        }
        assert_eq!(h.count(), 10_000);
        for (q, exact) in [(0.5, 5_000_000u64), (0.95, 9_500_000), (0.99, 9_900_000)] {
            let got = h.quantile(q).unwrap();
            assert!(
                got <= exact && got as f64 >= exact as f64 * (1.0 - 1.0 / 16.0),
                "q{q}: {got}"
            );
        }
        let top = h.quantile(1.0).unwrap();
        assert!(
            (10_000_000 / 16 * 15..=10_000_000).contains(&top),
            "max: {top}"
        );
        let mut small = LatencyHistogram::new();
        for v in [0, 3, 3, 15] {
            small.record(v);
        }
        assert_eq!(small.quantile(0.5), Some(3));
        assert_eq!(small.quantile(1.0), Some(15));
        assert_eq!(
            LatencyHistogram::bucket_low(LatencyHistogram::bucket(u64::MAX)),
            0xF8 << 56
        );
    }
}
