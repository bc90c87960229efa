//! The runtime's counters and fault latency histograms, and their serializable snapshot
//! [`Stats`] (what `fm_stats`, `Region::stats` and `farmem run --stats` show).
//!
//! Counters are updated by the runtime threads under one small mutex (never on a path that
//! waits for the network); latencies are recorded in microseconds with hdrhistogram, from the
//! moment the fault message was read to the moment the faulting thread was woken.

use hdrhistogram::Histogram;
use serde::Serialize;

/// The kinds of fault the runtime serves, for latency histograms.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum FaultKind {
    Zero,
    PoolHit,
    Remote,
    WriteProtect,
}

/// Latency percentiles of one fault kind, microseconds.
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct LatencySummary {
    pub count: u64,
    pub p50_us: f64,
    pub p99_us: f64,
    pub p999_us: f64,
    pub max_us: f64,
}

/// Fault latency by kind.
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct FaultLatency {
    pub zero: LatencySummary,
    pub pool_hit: LatencySummary,
    pub remote: LatencySummary,
    pub write_protect: LatencySummary,
}

/// A snapshot of the runtime's counters (process-wide).
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct Stats {
    /// Faults on never-written (or released) pages, answered with a zero page.
    pub faults_zero: u64,
    /// Faults served from the write-back pool (page moved back, no copy).
    pub faults_pool_hit: u64,
    /// Faults whose page was fetched from a donor.
    pub faults_remote: u64,
    /// Write-protect faults: first write to a clean page (it becomes dirty).
    pub faults_write_protect: u64,
    /// Fault messages for pages that were already resident (another thread's fault on the same
    /// page was served first): answered with a wake, nothing fetched twice.
    pub faults_already_served: u64,
    /// Evicted pages that were dirty and were sent to a donor.
    pub evicted_sent_dirty: u64,
    /// Evicted pages that were clean (unchanged since fetched, still on the donor): not resent.
    pub evicted_dropped_clean: u64,
    /// Evicted pages that were all zero: never sent, they come back as zero pages.
    pub evicted_zero: u64,
    /// Victims UFFDIO_MOVE refused (shared copy-on-write with a forked child, or busy): they
    /// stay resident and are tried again; pages shared after a fork are unshared first.
    pub evictions_refused: u64,
    /// Page data bytes sent to donors.
    pub bytes_sent: u64,
    /// Page data bytes received from donors.
    pub bytes_received: u64,
    /// Region pages resident now.
    pub resident_pages: u64,
    /// Most region pages resident at once.
    pub peak_resident_pages: u64,
    /// The budget, in pages.
    pub budget_pages: u64,
    /// Pages held in the write-back pool now.
    pub pool_pages: u64,
    /// Size of the write-back pool, in pages.
    pub pool_capacity_pages: u64,
    /// Slabs placed on donors.
    pub slabs_placed: u64,
    /// Failed fetches (each retried; a page that cannot be fetched is poisoned: SIGBUS).
    pub fetch_errors: u64,
    /// Failed sends (retried; pages stay in the pool meanwhile).
    pub send_errors: u64,
    /// Pages brought in by prefetching (landed, or faulted while in flight).
    pub prefetched_pages: u64,
    /// First touches of prefetched pages (prefetch hits), including those that waited and
    /// those inferred (marker mode).
    pub prefetch_hits: u64,
    /// Prefetch hits on pages still in flight when touched (served by their demand read).
    pub prefetch_hits_waited: u64,
    /// Prefetch hits inferred from a window's marker (marker install mode only).
    pub prefetch_hits_inferred: u64,
    /// Faults served from a donor that were not prefetch hits (the misses prefetching did not
    /// cover; the denominator of coverage with the hits).
    pub prefetch_demand_faults: u64,
    /// Prefetched pages dropped on arrival (already faulted in, released, remapped, or no pool
    /// slot).
    pub prefetch_dropped: u64,
    /// Prefetched pages evicted (or released) before their first touch.
    pub prefetch_pollution: u64,
    /// Prefetch batches received from donors.
    pub prefetch_batches: u64,
    /// prefetch_hits / prefetched_pages (0 when nothing was prefetched).
    pub prefetch_accuracy: f64,
    /// prefetch_hits / (prefetch_hits + prefetch_demand_faults) (0 when both are 0).
    pub prefetch_coverage: f64,
    /// Median time from a page's arrival to its first touch, µs.
    pub prefetch_timeliness_p50_us: Option<f64>,
    /// 95th percentile of the time from a page's arrival to its first touch, µs.
    pub prefetch_timeliness_p95_us: Option<f64>,
    /// The last error the runtime reported, if any.
    pub last_error: Option<String>,
    /// Fault latency by kind.
    pub latency: FaultLatency,
}

/// Counters plus histograms, owned by the runtime.
pub(crate) struct StatsCell {
    pub(crate) s: Stats,
    zero: Histogram<u64>,
    pool_hit: Histogram<u64>,
    remote: Histogram<u64>,
    write_protect: Histogram<u64>,
}

fn hist() -> Histogram<u64> {
    // 1 µs .. 100 s, 3 significant digits: bounded memory (~100 KiB each).
    Histogram::new_with_bounds(1, 100_000_000, 3).expect("valid histogram bounds")
}

fn summary(h: &Histogram<u64>) -> LatencySummary {
    if h.is_empty() {
        return LatencySummary::default();
    }
    LatencySummary {
        count: h.len(),
        p50_us: h.value_at_quantile(0.5) as f64,
        p99_us: h.value_at_quantile(0.99) as f64,
        p999_us: h.value_at_quantile(0.999) as f64,
        max_us: h.max() as f64,
    }
}

impl StatsCell {
    pub(crate) fn new() -> StatsCell {
        StatsCell {
            s: Stats::default(),
            zero: hist(),
            pool_hit: hist(),
            remote: hist(),
            write_protect: hist(),
        }
    }

    /// Records one served fault of `kind` that took `latency_us`.
    pub(crate) fn fault(&mut self, kind: FaultKind, latency_us: u64) {
        let v = latency_us.clamp(1, 100_000_000);
        match kind {
            FaultKind::Zero => {
                self.s.faults_zero += 1;
                let _ = self.zero.record(v);
            }
            FaultKind::PoolHit => {
                self.s.faults_pool_hit += 1;
                let _ = self.pool_hit.record(v);
            }
            FaultKind::Remote => {
                self.s.faults_remote += 1;
                let _ = self.remote.record(v);
            }
            FaultKind::WriteProtect => {
                self.s.faults_write_protect += 1;
                let _ = self.write_protect.record(v);
            }
        }
    }

    /// The snapshot with the percentiles filled in.
    pub(crate) fn snapshot(&self) -> Stats {
        let mut s = self.s.clone();
        s.latency = FaultLatency {
            zero: summary(&self.zero),
            pool_hit: summary(&self.pool_hit),
            remote: summary(&self.remote),
            write_protect: summary(&self.write_protect),
        };
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_by_kind() {
        let mut c = StatsCell::new();
        for v in 1..=100 {
            c.fault(FaultKind::Remote, v);
        }
        c.fault(FaultKind::Zero, 0);
        let s = c.snapshot();
        assert_eq!(s.faults_remote, 100);
        assert_eq!(s.faults_zero, 1);
        assert_eq!(s.latency.remote.count, 100);
        assert_eq!(s.latency.remote.p50_us, 50.0);
        assert_eq!(s.latency.remote.p99_us, 99.0);
        assert_eq!(
            s.latency.zero.p50_us, 1.0,
            "0 µs is recorded as the 1 µs floor"
        );
        assert_eq!(s.latency.pool_hit, LatencySummary::default());
        let json = serde_json::to_string(&s).unwrap();
        assert!(json.contains("\"faults_remote\":100"), "{json}");
    }
}
