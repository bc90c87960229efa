//! The simulator: replays a trace through a prefetcher, an eviction policy and a cache of a given
//! number of pages, and reports what Leap and Kona measure.
//!
//! # Design (the model)
//!
//! - **Far memory holds every page of the trace** from the start; the local cache starts empty.
//!   A prefetcher's prediction is kept only for pages that appear somewhere in the trace (the
//!   runtime likewise only fetches pages that exist in far memory) and are not resident.
//! - **Each access** to a resident page is a hit: the eviction policy is told
//!   ([`EvictionPolicy::touched`]; the simulator reports every access, like hardware reference
//!   bits). If the page was prefetched and this is its first use, it is a prefetch hit and the
//!   prefetcher is told ([`Access::prefetch_hit`] = true). Any other access is a fault: the page is
//!   brought in on demand (evicting a victim when the cache is full) and the prefetcher is told.
//! - **Prefetched pages arrive in time**: the pages a prefetcher names are made resident at once,
//!   before the next access of the trace, each evicting a victim if the cache is full (at most
//!   `cache_pages - 1` per access). A prefetch never evicts the page just accessed nor another
//!   page prefetched for the same access: when the policy offers one of those, the next
//!   candidate is taken instead (otherwise Leap's rule "unused prefetched pages go first" would
//!   make each batch evict its own beginning). The runtime should do the same. This is the best case for every prefetcher alike; how much slack each one
//!   really had is its **timeliness**, the trace time from a page's prefetch to its first hit
//!   (p50, p95): a link slower than that would have made the hit late.
//! - **AMAT** (Kona's average memory access time) = hit ratio × `hit_us` + (1 − hit ratio) ×
//!   `miss_us`, where `miss_us` is the whole cost of a remote fault.
//!
//! [`EvictionPolicy::touched`]: farmem_policy::evict::EvictionPolicy::touched
//! [`Access::prefetch_hit`]: farmem_policy::prefetch::Access::prefetch_hit

use std::collections::HashSet;

use farmem_policy::evict::{self, EvictionPolicy};
use farmem_policy::measures::PrefetchStats;
use farmem_policy::prefetch::{self, Access, Prefetcher};
use farmem_policy::Origin;

use crate::trace::Record;
use crate::{parse_pages, SimError};

/// Latencies for the AMAT.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Latency {
    /// Cost of an access served from local memory, µs.
    pub hit_us: f64,
    /// Cost of an access that faults to far memory, µs.
    pub miss_us: f64,
}

impl Default for Latency {
    /// 0.1 µs local, 35 µs remote (a userfaultfd fault served over loopback TCP on the
    /// development machine, see DESIGN.md).
    fn default() -> Self {
        Self {
            hit_us: 0.1,
            miss_us: 35.0,
        }
    }
}

/// One simulated combination. Serialises to JSON with exactly the keys `prefetcher, evict,
/// cache_pages, accesses, faults, hit_ratio, prefetched, prefetch_hits, accuracy, coverage,
/// pollution, amat_us` (timeliness is shown in the table only).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Row {
    /// Prefetcher name.
    pub prefetcher: String,
    /// Eviction policy name.
    pub evict: String,
    /// Cache size, pages.
    pub cache_pages: u64,
    /// Accesses replayed.
    pub accesses: u64,
    /// Accesses that faulted.
    pub faults: u64,
    /// (accesses − faults) / accesses.
    pub hit_ratio: f64,
    /// Pages brought in by prefetching.
    pub prefetched: u64,
    /// First uses of prefetched pages.
    pub prefetch_hits: u64,
    /// prefetch_hits / prefetched.
    pub accuracy: f64,
    /// prefetch_hits / (prefetch_hits + faults).
    pub coverage: f64,
    /// Prefetched pages evicted unused.
    pub pollution: u64,
    /// Average memory access time, µs.
    pub amat_us: f64,
    /// Median trace time from prefetch to first hit, µs.
    #[serde(skip)]
    pub timeliness_p50_us: Option<f64>,
    /// 95th percentile of the time from prefetch to first hit, µs.
    #[serde(skip)]
    pub timeliness_p95_us: Option<f64>,
}

/// The pages a trace touches: its working set.
pub fn working_set(trace: &[Record]) -> HashSet<u64> {
    trace.iter().map(|r| r.page).collect()
}

/// Parses one cache size: a percentage of the working set (`25%`, rounded up, at least 1 page),
/// a page count (`4096`) or a byte size (`16MiB`).
pub fn parse_cache(spec: &str, wss_pages: u64) -> Result<u64, SimError> {
    let s = spec.trim();
    let pages = if let Some(pct) = s.strip_suffix('%') {
        let pct: f64 = pct.trim().parse().map_err(|_| SimError::BadCacheSize {
            spec: spec.to_string(),
            reason: "a percentage needs a number, e.g. 25%".to_string(),
        })?;
        if !(pct > 0.0 && pct <= 100.0) {
            return Err(SimError::BadCacheSize {
                spec: spec.to_string(),
                reason: "a percentage of the working set must be in (0, 100]".to_string(),
            });
        }
        ((wss_pages as f64 * pct / 100.0).ceil() as u64).max(1)
    } else {
        parse_pages(s).map_err(|e| SimError::BadCacheSize {
            spec: spec.to_string(),
            reason: e.to_string(),
        })?
    };
    if pages == 0 {
        return Err(SimError::BadCacheSize {
            spec: spec.to_string(),
            reason: "the cache must hold at least 1 page".to_string(),
        });
    }
    Ok(pages)
}

/// Replays `trace` with the prefetcher and eviction policy given by name ([`prefetch::by_name`],
/// [`evict::by_name`]) and a cache of `cache_pages` pages. `universe` is the set of pages in far
/// memory (normally [`working_set`] of the trace).
pub fn simulate(
    trace: &[Record],
    universe: &HashSet<u64>,
    prefetcher: &str,
    evict_policy: &str,
    cache_pages: u64,
    latency: Latency,
) -> Result<Row, SimError> {
    let mut pf = prefetch::by_name(prefetcher)?;
    let mut ev = evict::by_name(evict_policy)?;
    simulate_with(
        trace,
        universe,
        pf.as_mut(),
        ev.as_mut(),
        cache_pages,
        latency,
    )
}

/// [`simulate`] with policies built by the caller (any configuration).
pub fn simulate_with(
    trace: &[Record],
    universe: &HashSet<u64>,
    pf: &mut dyn Prefetcher,
    ev: &mut dyn EvictionPolicy,
    cache_pages: u64,
    latency: Latency,
) -> Result<Row, SimError> {
    if trace.is_empty() {
        return Err(SimError::EmptyTrace);
    }
    if cache_pages == 0 {
        return Err(SimError::BadParam(
            "the cache must hold at least 1 page".into(),
        ));
    }
    if !(latency.hit_us >= 0.0 && latency.miss_us >= 0.0) {
        return Err(SimError::BadParam("latencies must be ≥ 0 µs".into()));
    }
    let cap = usize::try_from(cache_pages).unwrap_or(usize::MAX);
    let mut resident: HashSet<u64> = HashSet::with_capacity(cap.min(universe.len()) + 1);
    let mut stats = PrefetchStats::new();
    let mut faults = 0u64;
    let mut predicted = Vec::with_capacity(64);

    // Makes room for one page. The page just accessed (`current`) and the pages prefetched for
    // this same access (`batch`) are not eligible: when the policy offers one, it is set aside
    // and the next candidate taken, then the set-aside pages are given back (at most
    // `batch.len() + 1` of them, so this stays O(PW)). Returns false if nothing else is left.
    let make_room = |resident: &mut HashSet<u64>,
                     ev: &mut dyn EvictionPolicy,
                     stats: &mut PrefetchStats,
                     current: Option<u64>,
                     batch: &[u64],
                     skipped: &mut Vec<(u64, Origin)>|
     -> bool {
        skipped.clear();
        let mut ok = true;
        while resident.len() >= cap {
            match ev.pick_victim() {
                Some(v) if Some(v) == current => skipped.push((v, Origin::Demand)),
                Some(v) if batch.contains(&v) => skipped.push((v, Origin::Prefetch)),
                Some(v) => {
                    if resident.remove(&v) {
                        stats.evicted(v);
                    }
                }
                None => {
                    ok = false;
                    break;
                }
            }
        }
        for &(v, origin) in skipped.iter() {
            ev.insert(v, origin);
        }
        ok
    };
    let mut skipped: Vec<(u64, Origin)> = Vec::with_capacity(64);
    let mut batch: Vec<u64> = Vec::with_capacity(64);

    for rec in trace {
        let page = rec.page;
        let prefetch_hit = if resident.contains(&page) {
            ev.touched(page);
            if !stats.prefetch_hit(page, rec.time_ns) {
                continue; // an ordinary hit: invisible to the prefetcher
            }
            true
        } else {
            faults += 1;
            stats.demand_fault();
            make_room(&mut resident, ev, &mut stats, None, &[], &mut skipped);
            resident.insert(page);
            ev.insert(page, Origin::Demand);
            false
        };
        predicted.clear();
        pf.on_access(
            &Access {
                page,
                thread: rec.thread,
                time_ns: rec.time_ns,
                prefetch_hit,
            },
            &mut predicted,
        );
        batch.clear();
        for &p in &predicted {
            if batch.len() + 1 >= cap {
                break;
            }
            if resident.contains(&p) || !universe.contains(&p) {
                continue;
            }
            if !make_room(
                &mut resident,
                ev,
                &mut stats,
                Some(page),
                &batch,
                &mut skipped,
            ) {
                break;
            }
            resident.insert(p);
            ev.insert(p, Origin::Prefetch);
            stats.prefetched(p, rec.time_ns);
            batch.push(p);
        }
        debug_assert!(resident.len() <= cap, "cache over capacity");
        debug_assert_eq!(ev.len(), resident.len(), "policy and cache disagree");
    }

    let m = stats.summary();
    let accesses = trace.len() as u64;
    let hit_ratio = (accesses - faults) as f64 / accesses as f64;
    Ok(Row {
        prefetcher: pf.name().to_string(),
        evict: ev.name().to_string(),
        cache_pages,
        accesses,
        faults,
        hit_ratio,
        prefetched: m.prefetched,
        prefetch_hits: m.prefetch_hits,
        accuracy: m.accuracy,
        coverage: m.coverage,
        pollution: m.pollution,
        amat_us: hit_ratio * latency.hit_us + (1.0 - hit_ratio) * latency.miss_us,
        timeliness_p50_us: m.timeliness_p50_ns.map(|ns| ns as f64 / 1000.0),
        timeliness_p95_us: m.timeliness_p95_ns.map(|ns| ns as f64 / 1000.0),
    })
}

/// Every combination of `prefetchers` × `evicts` × `caches` (in pages), cache size outermost.
pub fn run_matrix(
    trace: &[Record],
    prefetchers: &[String],
    evicts: &[String],
    caches: &[u64],
    latency: Latency,
) -> Result<Vec<Row>, SimError> {
    let universe = working_set(trace);
    let mut rows = Vec::with_capacity(prefetchers.len() * evicts.len() * caches.len());
    for &cache in caches {
        for e in evicts {
            for p in prefetchers {
                rows.push(simulate(trace, &universe, p, e, cache, latency)?);
            }
        }
    }
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::AccessKind;

    fn trace(pages: &[u64]) -> Vec<Record> {
        pages
            .iter()
            .enumerate()
            .map(|(i, &page)| Record {
                time_ns: i as u64 * 1000,
                page,
                thread: 0,
                kind: AccessKind::Read,
            })
            .collect()
    }

    #[test]
    fn no_prefetch_fifo_counts_by_hand() {
        // Cache of 2, FIFO: 1 F, 2 F, 1 H, 3 F (evicts 1), 1 F (evicts 2), 2 F (evicts 3), 2 H.
        let t = trace(&[1, 2, 1, 3, 1, 2, 2]);
        let u = working_set(&t);
        let r = simulate(
            &t,
            &u,
            "none",
            "fifo",
            2,
            Latency {
                hit_us: 1.0,
                miss_us: 11.0,
            },
        )
        .unwrap();
        assert_eq!(
            (r.accesses, r.faults, r.prefetched, r.prefetch_hits),
            (7, 5, 0, 0)
        );
        assert!((r.hit_ratio - 2.0 / 7.0).abs() < 1e-12);
        assert!((r.amat_us - (2.0 * 1.0 + 5.0 * 11.0) / 7.0).abs() < 1e-9);
        assert_eq!((r.accuracy, r.coverage), (0.0, 0.0));
    }

    #[test]
    fn clock_keeps_the_referenced_page_fifo_does_not() {
        // Cache of 3: 1 2 3 4 2 5 2. At 4 the clock hand clears every bit and evicts 1 (like
        // FIFO). 2 is then touched; at 5 FIFO evicts 2 (the oldest) and faults on the last 2,
        // while clock skips 2 (referenced) and evicts 3.
        let t = trace(&[1, 2, 3, 4, 2, 5, 2]);
        let u = working_set(&t);
        let fifo = simulate(&t, &u, "none", "fifo", 3, Latency::default()).unwrap();
        let clock = simulate(&t, &u, "none", "clock", 3, Latency::default()).unwrap();
        assert_eq!(fifo.faults, 6);
        assert_eq!(clock.faults, 5);
    }

    #[test]
    fn next_n_prefetches_only_pages_in_far_memory_and_counts_pollution() {
        // Pages 0..8 then 100: next-n (8) at the fault on 0 brings 1..=7 (8 is absent from the
        // trace); all hit. The fault on 100 brings nothing (101.. are not in the trace).
        let t = trace(&[0, 1, 2, 3, 4, 5, 6, 7, 100]);
        let u = working_set(&t);
        let r = simulate(&t, &u, "next-n", "fifo", 16, Latency::default()).unwrap();
        assert_eq!(
            (r.faults, r.prefetched, r.prefetch_hits, r.pollution),
            (2, 7, 7, 0)
        );
        assert!((r.coverage - 7.0 / 9.0).abs() < 1e-12);
        // Hits 1..7 µs after the prefetch at t=0: median 4 µs, to the histogram's 1/16.
        let p50 = r.timeliness_p50_us.unwrap();
        assert!((3.75..=4.0).contains(&p50), "{p50}");
        // A cache of 4: 0 faults in with 1, 2, 3 (3 = cache - 1 per access); 4 faults, evicting
        // the consumed 1, 2, 3 for 4, 5, 6; for 7 the policy offers 5 (same batch, skipped) and
        // 6 (skipped), then the demand page 0, which goes; 5, 6, 7 hit; 100 faults.
        let small = simulate(&t, &u, "next-n", "fifo", 4, Latency::default()).unwrap();
        let got = (
            small.faults,
            small.prefetched,
            small.prefetch_hits,
            small.pollution,
        );
        assert_eq!(got, (3, 6, 6, 0));
    }

    #[test]
    fn unused_prefetches_are_pollution() {
        // Stride, cache of 2: at 10 (stride 10) it brings 20 (evicting 0). At 5 (stride -5),
        // 5 evicts 10 (unused prefetches within the grace go after ordinary pages) and its
        // prefetch of 0 can only evict 20, unused: pollution. 6 and 20 evict ordinary pages;
        // 0 is still resident and unused at the end (not pollution); 7 and 34 do not exist.
        let t = trace(&[0, 10, 5, 6, 20]);
        let u = working_set(&t);
        let r = simulate(&t, &u, "stride", "fifo", 2, Latency::default()).unwrap();
        assert_eq!(
            (r.faults, r.prefetched, r.prefetch_hits, r.pollution),
            (5, 2, 0, 1)
        );
    }

    #[test]
    fn leap_on_a_long_sequential_scan_hides_nearly_every_fault() {
        let t: Vec<Record> = trace(&(0..4000u64).map(|i| i % 1000).collect::<Vec<_>>());
        let u = working_set(&t);
        let r = simulate(&t, &u, "leap", "fifo", 250, Latency::default()).unwrap();
        let none = simulate(&t, &u, "none", "fifo", 250, Latency::default()).unwrap();
        assert_eq!(
            none.faults, 4000,
            "a cyclic scan larger than the cache always misses"
        );
        assert!(r.hit_ratio > 0.95, "{r:?}");
        assert!(r.accuracy > 0.95, "{r:?}");
        assert!(r.amat_us < none.amat_us / 10.0);
    }

    #[test]
    fn bad_inputs() {
        let u = HashSet::new();
        assert!(matches!(
            simulate(&[], &u, "leap", "fifo", 4, Latency::default()),
            Err(SimError::EmptyTrace)
        ));
        let t = trace(&[1]);
        assert!(simulate(&t, &u, "leap", "fifo", 0, Latency::default()).is_err());
        assert!(simulate(&t, &u, "oracle", "fifo", 4, Latency::default()).is_err());
        assert!(simulate(&t, &u, "leap", "lru", 4, Latency::default()).is_err());
        assert_eq!(parse_cache("25%", 1000).unwrap(), 250);
        assert_eq!(parse_cache("0.1%", 10).unwrap(), 1);
        assert_eq!(parse_cache("512", 1000).unwrap(), 512);
        assert_eq!(parse_cache("1MiB", 1000).unwrap(), 256);
        for bad in ["0%", "101%", "x%", "0", "lots"] {
            assert!(parse_cache(bad, 1000).is_err(), "{bad}");
        }
    }
}
