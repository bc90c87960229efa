//! [`Runtime::stats`]: a snapshot of the counters, filled in from each part that keeps some
//! (the page state and pool, the far side, the prefetcher) and from /proc.

use std::sync::atomic::Ordering;

use crate::far::Far;
use crate::prefetch::Prefetch;
use crate::shared::Shared;
use crate::stats;
use farmem_contract::Stats;

use super::Runtime;

impl Runtime {
    /// A snapshot of the counters.
    pub fn stats(&self) -> Stats {
        let sh = &self.sh;
        let local = Local::read(sh);
        let mut s = sh.stats.lock().snapshot();
        // Read from /proc, outside every lock.
        let cpu = stats::runtime_threads_cpu();
        (s.runtime_cpu_s, s.runtime_system_s) = (cpu.cpu_s, cpu.system_s);
        local.fill(sh, &mut s);
        far_counts(&sh.far, &mut s);
        if sh.in_child.load(Ordering::Relaxed) {
            return s; // the prefetch thread does not exist here; its lock may be held
        }
        prefetch_counts(&sh.pf, &mut s);
        s
    }
}

/// Resident pages, the pool and memory slabs, read under the state lock (in a forked child
/// only what needs no lock: the parent's threads may have held one at the fork).
struct Local {
    /// Resident and peak resident pages; none in a forked child.
    resident: Option<(u64, u64)>,
    pool_pages: u64,
    pool_limit: u32,
    /// Host tier and local memory slabs.
    mem: (u64, u64),
}

impl Local {
    fn read(sh: &Shared) -> Local {
        if sh.in_child.load(Ordering::Relaxed) {
            return Local {
                resident: None,
                pool_pages: 0,
                pool_limit: sh.pool.slots(),
                mem: (0, 0),
            };
        }
        let st = sh.state.lock();
        Local {
            resident: Some((st.pages.resident(), st.pages.peak_resident())),
            pool_pages: st.slots.used(),
            pool_limit: st.slots.limit(),
            mem: st.mem.counts(),
        }
    }

    /// Fills them in, with the budget now in force.
    fn fill(self, sh: &Shared, s: &mut Stats) {
        let Local {
            resident,
            pool_pages,
            pool_limit,
            mem,
        } = self;
        if let Some((resident, peak)) = resident {
            s.resident_pages = resident;
            s.peak_resident_pages = peak;
        }
        s.pool_pages = pool_pages;
        s.budget_pages = sh.budget.limit();
        s.pool_capacity_pages = u64::from(pool_limit);
        (s.tier_slabs, s.local_slabs) = mem;
    }
}

/// Slabs, donors (their use, deaths and returns), replicas, the backup, sealing and the tier.
fn far_counts(far: &Far, s: &mut Stats) {
    s.slabs_placed = far.slabs_placed();
    (s.donor_bytes_taken, s.donor_bytes_filled) = far.donor_bytes();
    s.donors = far.donor_uses();
    s.replicas = far.replicas as u64;
    (s.slabs_degraded, s.slabs_lost) = far.slab_health();
    s.donors_back = far
        .donors
        .iter()
        .flat_map(|d| {
            d.health
                .past_deaths()
                .into_iter()
                .map(move |(cause, lasted)| {
                    format!(
                        "{}: {cause}, back after {:.1} s",
                        d.read.addr(),
                        lasted.as_secs_f64()
                    )
                })
        })
        .collect();
    s.dead_donors = far
        .donors
        .iter()
        .filter_map(|d| {
            let (cause, _) = d.health.death()?;
            Some(format!("{}: {cause}", d.read.addr()))
        })
        .collect();
    if let Some(b) = &far.backup {
        s.backup_pages_written = b.pages_written.load(Ordering::Relaxed);
        s.backup_pages_read = b.pages_read.load(Ordering::Relaxed);
    }
    s.sealed = far.sealer.is_some();
    s.tier_node = far.tier.as_ref().map(|t| t.socket().display().to_string());
}

/// The prefetcher's counters: what it fetched, hit, dropped, and how timely.
fn prefetch_counts(pf: &Prefetch, s: &mut Stats) {
    let c = pf.counters();
    s.prefetched_pages = c.summary.prefetched;
    s.prefetch_hits = c.summary.prefetch_hits;
    s.prefetch_hits_waited = c.hits_waited;
    s.prefetch_hits_inferred = c.inferred_hits;
    s.prefetch_demand_faults = c.summary.demand_faults;
    s.prefetch_dropped = c.dropped;
    s.prefetch_pollution = c.summary.pollution;
    s.prefetch_batches = c.batches;
    s.prefetch_accuracy = c.summary.accuracy;
    s.prefetch_coverage = c.summary.coverage;
    s.prefetch_timeliness_p50_us = c.summary.timeliness_p50_ns.map(|v| v as f64 / 1000.0);
    s.prefetch_timeliness_p95_us = c.summary.timeliness_p95_ns.map(|v| v as f64 / 1000.0);
}
