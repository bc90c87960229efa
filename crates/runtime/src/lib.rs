//! farmem-runtime: regions of a program's memory paged to donors with userfaultfd.
//!
//! A [`Runtime`] owns a process-wide budget of local memory. Memory in its regions
//! ([`Runtime::map`] creates one, [`Runtime::register`] adopts an existing anonymous mapping)
//! stays resident up to the budget; the rest lives on donors and comes back on access,
//! transparently: the program just reads and writes memory. The C API (crate farmem-capi,
//! `crates/capi/include/farmem.h`) exposes the same to programs that opt in explicitly.
//!
//! # Design
//!
//! - Page state ([`pages`]): the one owner of every page's state, the resident count, the
//!   eviction policy's pages and the peak residency; the rest of the runtime changes them only
//!   through its checked transitions. The page table is sparse, per region, chunked.
//! - Threads, one module each, above a shared core ([`shared`]): the fault loop ([`fault`],
//!   with the release events in [`events`]) answering faults (zero page, write-back pool hit
//!   moved back with UFFDIO_MOVE, or donor fetch); the evictor ([`evict`]) keeping resident
//!   pages below the budget by moving victims into the write-back pool ([`slots`]); the sender
//!   ([`threads::send`]) writing pool pages to donors in batches; the prefetch thread
//!   ([`threads::prefetch`]). Dirty tracking with synchronous userfaultfd write-protect: clean
//!   pages are dropped at eviction without resending; all-zero pages are never sent. Every
//!   runtime thread blocks every signal ([`signals`]): the program's handlers run on its own
//!   threads only. The fault thread and the evictor share one CPU ([`cpu`]).
//! - Far side ([`far`], [`farpages`]): far page numbers, slabs placed on donors when first
//!   written (power of two choices among several donors), the embedded donor child when none
//!   is configured.
//! - Unsafe code: only in [`mm`] (the crate denies `unsafe_code` elsewhere); mappings are
//!   [`farmem_mm::Mapping`]s.
//! - Counters ([`stats`]): faults by kind, evictions by kind, bytes, residency, latencies.
//! - Prefetching ([`prefetch`]): the fault loop feeds the prefetcher (default `leap`, one
//!   stream per thread); a prefetch thread fetches its predictions on connections of its own
//!   and keeps them in the write-back pool, where the first touch finds them; counters for
//!   accuracy and coverage; the optional page-access trace (`record_trace`).
//! - Budget: the evictor keeps resident region pages between a low and a high watermark below
//!   the budget (headroom 1/16 of it, at most 1024 pages) in the background, so a fault
//!   normally finds room at once; only a fault that would exceed the budget itself waits for
//!   the evictor (not while write-back is failing: then the budget is exceeded and the error
//!   is in [`Stats::last_error`]). The write-back pool is local memory in addition to the
//!   budget (`pool_bytes`).
//! - Fork ([`fork`], [`Runtime::before_fork`]): the runtime does not enable UFFD_FEATURE_EVENT_FORK, so a
//!   child's copy of a region is unregistered plain memory. Evicted pages are brought back
//!   before fork (eviction paused) — except, for a child that starts a runtime of its own
//!   ([`Runtime::prepare_fork`] with `lend`), pages in the host tier or on donors, which the
//!   child borrows ([`Runtime::borrow`], [`RuntimeConfig::lent_donors`]); the parent resumes
//!   after fork. Pages shared with a child cannot be MOVEd (EBUSY): either side drops its own
//!   mapping of one to evict it ([`threads::cow`]).
//! - Donor failure: a page that cannot be fetched after `fetch_attempts` tries (each bounded by
//!   `request_timeout`) is poisoned; the faulting thread gets SIGBUS, the error is logged and
//!   counted. Write-back failures (donor full, donor gone) are retried while the pages stay in
//!   the pool; the program keeps running on local memory and the error is in
//!   [`Stats::last_error`].
//!
//! # Limitations
//!
//! - Far slabs are not returned to donors while the runtime lives (freed far pages are reused).
//! - Pages present in an adopted mapping are found with mincore at [`Runtime::register`];
//!   pages populated between that scan and the registration are never evicted.
//! - A forked child cannot use the runtime (no threads there): [`Runtime::map`] fails in it.

#![deny(unsafe_code)]

mod backup;
mod budget;
mod config;
mod cpu;
mod dontfork;
mod doorbell;
mod drops;
mod embedded;
mod error;
mod evict;
mod failover;
mod failure_log;
mod far;
mod far_connect;
mod farpages;
mod fault;
mod fork;
mod forkhold;
mod health;
mod lentdonors;
mod memslabs;
mod mm;
mod pack;
mod pages;
mod prefetch;
mod readtimes;
mod replicas;
mod runs;
mod seal;
pub mod secure;
mod shared;
pub mod signals;
mod slabcopy;
mod slots;
mod stats;
mod sync;
mod threads;
mod tier;

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use crate::sync::Mutex;
use farmem_mm::Mapping;

pub use budget::Usage;
pub use config::RuntimeConfig;
pub use farmem_contract::local::{LocalMemory, MIN_BUDGET_BYTES, MIN_LOCAL_BYTES};
// The contract with `farmem run` and the benchmarks (crate farmem-contract), re-exported so
// the runtime's users name one crate.
pub use embedded::PrivateNode;
pub use error::RuntimeError;
pub use error::{CopyFailure, ReadFailed};
pub use farmem_contract::{
    modes, run_settings, DonorUse, FaultLatency, LatencySummary, OverBudget, PrefetchInstall,
    PreloadCounters, SealMode, Stats, StatsFile, StatsSummary, TierMode, TreeProcess, TreeStats,
    UnknownMode, UnmanagedMapping, UnmanagedReport, UnpagedProcess, TREE_BUDGET_SOCKET,
    TREE_STATS_DIR,
};
pub use fork::{ForkPlan, Lent};
pub use lentdonors::LentDonors;
pub use seal::SealError;
pub use stats::{clock_ticks_per_s, parse_proc_stat, runtime_threads_cpu, ProcStat, ThreadsCpu};

use shared::Shared;
use threads::{heal::heal_loop, prefetch::prefetch_loop, send::send_loop, tier::tier_loop};

/// The page size the runtime manages: the wire's page (farmem-proto), which the memory and
/// userfaultfd crates (below the wire, so with constants of their own) must agree with.
pub use farmem_proto::PAGE_SIZE;
const _: () = assert!(PAGE_SIZE == farmem_mm::PAGE_SIZE && PAGE_SIZE == farmem_uffd::PAGE_SIZE);

/// The paging runtime of this process.
pub struct Runtime {
    sh: Arc<Shared>,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

/// A region created by [`Runtime::map`]: unmapped on drop.
pub struct Region {
    rt: Arc<Runtime>,
    /// Unmapped when the region is dropped, after [`Runtime::drop_region`] forgot it.
    mapping: Mapping,
}

impl Runtime {
    /// Starts the runtime: opens the userfaultfds, connects to the donors (or starts the
    /// embedded one) and starts the fault loop, evictor and sender threads.
    pub fn start(cfg: RuntimeConfig) -> Result<Arc<Runtime>, RuntimeError> {
        if cfg.budget_bytes < MIN_BUDGET_BYTES {
            return Err(RuntimeError::Config(format!(
                "budget {} bytes is below the minimum of {MIN_BUDGET_BYTES} bytes (64 KiB)",
                cfg.budget_bytes
            )));
        }
        farmem_policy::prefetch::by_name(&cfg.prefetch)
            .map_err(|e| RuntimeError::Config(e.to_string()))?;
        if cfg.fetch_attempts == 0 {
            return Err(RuntimeError::Config(
                "fetch_attempts must be at least 1".into(),
            ));
        }
        // Threads started from here on (the runtime's, the transport's, the node client's)
        // inherit a mask that blocks every signal (see `signals`).
        let _blocked = signals::Blocked::new();
        let sh = Shared::start(&cfg)?;
        let budget_pages = sh.budget.limit();
        let mut threads = Vec::new();
        let (started_tx, started) = crossbeam_channel::unbounded::<()>();
        // The fault thread and the evictor share a CPU (see `cpu`).
        let shared_cpu = if cfg.share_cpu { cpu::pick() } else { None };
        let spawn = |name: &str, f: fn(Arc<Shared>), sh: Arc<Shared>, pin: Option<usize>| {
            let started_tx = started_tx.clone();
            std::thread::Builder::new()
                .name(name.into())
                .spawn(move || {
                    if let Some(c) = pin {
                        cpu::pin(c);
                    }
                    sh.thread_started();
                    let _ = started_tx.send(());
                    // Dropped now, not when the loop ends: a thread that dies before sending
                    // ends the wait below once every other thread has sent.
                    drop(started_tx);
                    f(sh)
                })
                .map_err(|source| RuntimeError::Spawn {
                    what: "a runtime thread",
                    source,
                })
        };
        threads.push(spawn(
            "farmem-fault",
            fault::fault_loop,
            sh.clone(),
            shared_cpu,
        )?);
        threads.push(spawn(
            "farmem-evict",
            evict::evict_loop,
            sh.clone(),
            shared_cpu,
        )?);
        threads.push(spawn("farmem-send", send_loop, sh.clone(), None)?);
        if sh.far.tier.is_some() {
            threads.push(spawn("farmem-tier", tier_loop, sh.clone(), None)?);
        }
        if !sh.far.donors.is_empty() {
            threads.push(spawn("farmem-heal", heal_loop, sh.clone(), None)?);
        }
        if sh.far.backup.is_some() {
            threads.push(spawn(
                "farmem-backup",
                |sh| {
                    if let Some(b) = &sh.far.backup {
                        b.run(&sh.shutdown);
                    }
                },
                sh.clone(),
                None,
            )?);
        }
        if sh.pf.enabled() {
            threads.push(spawn("farmem-prefetch", prefetch_loop, sh.clone(), None)?);
        }
        // Every thread past its start before any region can exist: a thread library reads
        // program data while it starts a thread (glibc: the locale), and a forked child
        // registers its inherited regions, evicted pages and all, right after this returns.
        // A runtime thread still starting then could fault before the fault thread serves.
        drop(started_tx);
        for _ in &threads {
            if started.recv().is_err() {
                break; // a thread died before it started (its panic is reported)
            }
        }
        tracing::debug!(
            "farmem runtime started: budget {} pages, pool {} pages, {} donor(s), slab {} pages",
            budget_pages,
            sh.pool.slots(),
            sh.far.donors.len(),
            sh.far.slab_pages
        );
        Ok(Arc::new(Runtime {
            sh,
            threads: Mutex::new(threads),
        }))
    }

    /// Creates a new region of `len_bytes` (rounded up to pages), paged by this runtime and
    /// unmapped when the [`Region`] is dropped. Fails with a clear error if the donors cannot
    /// hold what does not fit in the budget.
    pub fn map(self: &Arc<Self>, len_bytes: usize) -> Result<Region, RuntimeError> {
        if self.sh.in_child.load(Ordering::Relaxed) {
            return Err(RuntimeError::InChild);
        }
        if len_bytes == 0 {
            return Err(RuntimeError::BadRange {
                addr: 0,
                len_bytes,
                reason: "a region cannot be empty",
            });
        }
        let len = len_bytes.div_ceil(PAGE_SIZE) * PAGE_SIZE;
        let needed = (len as u64).saturating_sub(self.sh.budget.limit() * PAGE_SIZE as u64);
        let cap = self.sh.far.capacity_bytes();
        if needed > cap {
            return Err(RuntimeError::InsufficientCapacity {
                len_bytes: len as u64,
                needed_bytes: needed,
                capacity_bytes: cap,
            });
        }
        let mapping = mm::map_region(len)?;
        // On failure the mapping, never handed out, is unmapped when dropped here.
        self.adopt(mapping.addr(), len, false)?;
        Ok(Region {
            rt: self.clone(),
            mapping,
        })
    }

    /// Adopts an existing private anonymous mapping (page-aligned) as a region. The program
    /// keeps owning it: later munmap/mremap/MADV_DONTNEED are seen through userfaultfd events.
    ///
    /// The caller must not hold Rust references into the range that assume its pages stay in
    /// place (they are moved out and back in by the runtime, transparently for plain loads and
    /// stores).
    pub fn register(&self, addr: *mut u8, len_bytes: usize) -> Result<(), RuntimeError> {
        self.register_inner(addr, len_bytes, true)
    }

    fn register_inner(
        &self,
        addr: *mut u8,
        len_bytes: usize,
        scan_present: bool,
    ) -> Result<(), RuntimeError> {
        if self.sh.in_child.load(Ordering::Relaxed) {
            return Err(RuntimeError::InChild);
        }
        let a = addr as usize;
        if !a.is_multiple_of(PAGE_SIZE) || !len_bytes.is_multiple_of(PAGE_SIZE) || len_bytes == 0 {
            return Err(RuntimeError::BadRange {
                addr: a,
                len_bytes,
                reason: "address and length must be non-zero multiples of 4096",
            });
        }
        mm::no_huge_pages(a, len_bytes);
        self.adopt(a, len_bytes, scan_present)
    }

    /// Like [`Runtime::register`], for a mapping the caller has just created (by `mmap`): no
    /// page of it can be present yet, so the range is not scanned with `mincore` (whose
    /// per-page vector would be large for a big reservation: a 2 GiB Java heap, a wasm guard
    /// region).
    pub fn register_new(&self, addr: *mut u8, len_bytes: usize) -> Result<(), RuntimeError> {
        self.register_inner(addr, len_bytes, false)
    }

    /// The program marked `addr..addr+len_bytes` `MADV_DONTFORK` (`dont_fork`) or
    /// `MADV_DOFORK`: a forked child gets no copy of a marked range, so before `fork` its
    /// evicted pages stay where they are. Only the parts inside regions are kept.
    pub fn set_dont_fork(&self, addr: *mut u8, len_bytes: usize, dont_fork: bool) {
        let a = addr as usize;
        // The kernel applies advice to whole pages.
        let end = a.saturating_add(len_bytes).next_multiple_of(PAGE_SIZE);
        if self.sh.in_child.load(Ordering::Relaxed) || a >= end {
            return;
        }
        let mut st = self.sh.state.lock();
        if !dont_fork {
            st.dontfork.remove(a, end);
            return;
        }
        for (s, e) in st.pages.ranges() {
            if s < end && e > a {
                st.dontfork.add(s.max(a), e.min(end));
            }
        }
    }

    /// Whether any page of `addr..addr+len_bytes` lies in a region. The preload library asks
    /// before a `mmap(MAP_FIXED)` replaces part of a mapping: a commit or decommit inside a
    /// region (a managed runtime's heap reservation) is registered again, whatever its size.
    pub fn overlaps_region(&self, addr: *mut u8, len_bytes: usize) -> bool {
        let a = addr as usize;
        if len_bytes == 0 || self.sh.in_child.load(Ordering::Relaxed) {
            return false;
        }
        self.sh
            .state
            .lock()
            .pages
            .overlaps(a, a.saturating_add(len_bytes))
    }

    fn adopt(&self, addr: usize, len: usize, scan_present: bool) -> Result<(), RuntimeError> {
        let sh = &self.sh;
        let mut st = sh.state.lock();
        if st.pages.overlaps(addr, addr + len) {
            // Perhaps an old mapping there was unmapped and the fault loop has read, but not
            // yet processed, its UNMAP event: wait for it, then look again.
            drop(st);
            sh.wait_events_handled(Duration::from_secs(1));
            st = sh.state.lock();
        }
        if st.pages.overlaps(addr, addr + len) {
            return Err(RuntimeError::BadRange {
                addr,
                len_bytes: len,
                reason: "it overlaps a range already registered",
            });
        }
        // The range is private anonymous memory the program hands to the runtime (map:
        // created by the caller; register: the caller's promise).
        mm::register_region(&sh.uffd, addr, len).map_err(|source| RuntimeError::Uffd {
            step: "registering a region",
            source,
        })?;
        // Present pages are found after registering, with the state lock held: a page another
        // thread discards from now on raises a REMOVE event, served after this adoption, and
        // one it first touches faults and waits for the lock. Scanned before registering, a
        // page discarded in between (an allocator's purge) was adopted as resident with
        // nothing mapped, and its next access got SIGBUS.
        let mut present = vec![0u8; if scan_present { len / PAGE_SIZE } else { 0 }];
        if scan_present && farmem_mm::mincore(addr, &mut present).is_err() {
            let _ = sh.uffd.unregister(addr, len);
            return Err(RuntimeError::BadRange {
                addr,
                len_bytes: len,
                reason: "it is not (entirely) mapped",
            });
        }
        st.pages.add_region(addr, addr + len);
        st.dontfork.remove(addr, addr + len); // a new mapping carries no MADV_DONTFORK
        for (i, b) in present.iter().enumerate() {
            if b & 1 != 0 {
                st.pages.adopt(addr + i * PAGE_SIZE);
            }
        }
        sh.kick_evictor(&st);
        Ok(())
    }

    /// Forgets a region created by `map` (its mapping is unmapped by the caller afterwards).
    fn drop_region(&self, addr: usize, len: usize) {
        let sh = &self.sh;
        if sh.in_child.load(Ordering::Relaxed) {
            return;
        }
        let st = sh.state.lock();
        let mut st = sh.settle_evictions(st);
        for (a, r) in st.pages.release_range(addr, addr + len, true) {
            st.settle_released(&sh.pf, a, r);
        }
        drop(st);
        // Unregister first so munmap raises no UNMAP event.
        let _ = sh.uffd.unregister(addr, len);
    }

    /// The runtime's own local page memory now: the write-back pool's mapping, then every
    /// memory slab (host tier slabs mapped from the node, local slabs): (start address, length
    /// in bytes). Not program memory, but farmem's: what is resident there is accounted by the
    /// runtime (the pool within `--local-mem`; the slabs in [`Stats::tier_slabs`] and
    /// [`Stats::local_slabs`]). Only the pool in a forked child.
    pub fn own_memory(&self) -> Vec<(usize, usize)> {
        let pool = self.sh.pool.mapping();
        let mut v = vec![(pool.addr(), pool.len())];
        if !self.sh.in_child.load(Ordering::Relaxed) {
            v.extend(self.sh.state.lock().mem.ranges());
        }
        v
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> Stats {
        let sh = &self.sh;
        let (resident, pool_pages, pool_limit, mem) = if sh.in_child.load(Ordering::Relaxed) {
            (None, 0, sh.pool.slots(), (0, 0))
        } else {
            let st = sh.state.lock();
            (
                Some((st.pages.resident(), st.pages.peak_resident())),
                st.slots.used(),
                st.slots.limit(),
                st.mem.counts(),
            )
        };
        let mut s = sh.stats.lock().snapshot();
        // Read from /proc, outside every lock.
        let cpu = stats::runtime_threads_cpu();
        (s.runtime_cpu_s, s.runtime_system_s) = (cpu.cpu_s, cpu.system_s);
        if let Some((resident, peak)) = resident {
            s.resident_pages = resident;
            s.peak_resident_pages = peak;
        }
        s.pool_pages = pool_pages;
        s.budget_pages = sh.budget.limit();
        s.pool_capacity_pages = u64::from(pool_limit);
        s.slabs_placed = sh.far.slabs_placed();
        (s.donor_bytes_taken, s.donor_bytes_filled) = sh.far.donor_bytes();
        s.donors = sh.far.donor_uses();
        s.replicas = sh.far.replicas as u64;
        (s.slabs_degraded, s.slabs_lost) = sh.far.slab_health();
        s.donors_back = sh
            .far
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
        s.dead_donors = sh
            .far
            .donors
            .iter()
            .filter_map(|d| {
                let (cause, _) = d.health.death()?;
                Some(format!("{}: {cause}", d.read.addr()))
            })
            .collect();
        if let Some(b) = &sh.far.backup {
            s.backup_pages_written = b.pages_written.load(Ordering::Relaxed);
            s.backup_pages_read = b.pages_read.load(Ordering::Relaxed);
        }
        s.sealed = sh.far.sealer.is_some();
        (s.tier_slabs, s.local_slabs) = mem;
        s.tier_node = sh
            .far
            .tier
            .as_ref()
            .map(|t| t.socket().display().to_string());
        if sh.in_child.load(Ordering::Relaxed) {
            return s; // the prefetch thread does not exist here; its lock may be held
        }
        let c = sh.pf.counters();
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
        s
    }

    /// Finishes the page-access trace (`RuntimeConfig::record_trace`): flushes it and writes
    /// its record count, so farmem-sim's reader accepts it; faults after this are not
    /// recorded. Returns the number of records (0 when no trace is recorded). Dropping the
    /// runtime does the same; a process that never drops its runtime calls this at exit.
    /// In a forked child it does nothing (the trace belongs to the parent).
    pub fn finish_trace(&self) -> Result<u64, RuntimeError> {
        if self.sh.in_child.load(Ordering::Relaxed) {
            return Ok(0);
        }
        self.sh.pf.finish_trace()
    }

    /// Slabs this runtime placed on each donor, in configuration order.
    pub fn slabs_per_donor(&self) -> Vec<u64> {
        far::slabs_per_donor(&self.sh.far)
    }

    /// Slabs whose first copy (the one demand reads go to while its donor is live) is on
    /// each donor, in configuration order: the donor whose failure the most faults notice.
    pub fn first_copies_per_donor(&self) -> Vec<u64> {
        far::first_copies_per_donor(&self.sh.far)
    }

    /// Changes the budget of resident region pages (at least 16). Lowering it wakes the
    /// evictor, which brings resident pages down at once; returns the budget now in force.
    pub fn set_budget_pages(&self, pages: u64) -> u64 {
        let set = self.sh.budget.set(pages);
        // Under the lock: an evictor between its look at the budget and its wait would
        // otherwise miss this wake-up and sleep over the budget for up to a second.
        drop(self.sh.state.lock());
        self.sh.evict_cv.notify_one();
        set
    }

    /// Changes the local pages this runtime may use, write-back pool and resident region pages
    /// together (a process tree's grant): the pool keeps a fifth of them (at most the slots it
    /// mapped at start, [`Runtime::pool_pages`]) and gives back cached pages above that at
    /// once, unsent ones as they are sent; the rest is the budget ([`Runtime::set_budget_pages`]).
    /// Returns `(pool_slots, budget_pages)` now in force.
    pub fn set_local_pages(&self, pages: u64) -> (u64, u64) {
        let (pool, budget) = LocalMemory::split_pages(pages, self.sh.pool.slots());
        let sh = &self.sh;
        if !sh.in_child.load(Ordering::Relaxed) {
            let mut st = sh.state.lock();
            let st = &mut *st;
            st.slots.set_limit(pool, &mut st.pages, &sh.pool, &sh.pf);
        }
        (u64::from(pool), self.set_budget_pages(budget))
    }

    /// What the runtime uses and moves, cheaply (for a coordinator polling every few tens
    /// of milliseconds; [`Runtime::stats`] computes percentiles and reads /proc).
    pub fn usage(&self) -> Usage {
        let sh = &self.sh;
        if sh.in_child.load(Ordering::Relaxed) {
            return Usage::default();
        }
        let used_pages = {
            let st = sh.state.lock();
            st.pages.resident() + st.slots.used()
        };
        let s = &sh.stats.lock().s;
        Usage {
            used_pages,
            budget_pages: sh.budget.limit(),
            fetched_pages: s.faults_remote
                + s.faults_tier
                + s.faults_pool_hit
                + s.prefetched_pages
                + s.tier_installed_ahead,
            evicted_pages: s.evicted_sent_dirty
                + s.tier_pages_written
                + s.evicted_dropped_clean
                + s.evicted_zero,
        }
    }

    /// Slots of the write-back pool (mapped at start; with a host tier only the slots it
    /// keeps). [`Runtime::set_local_pages`] may let it hold pages in fewer of them.
    pub fn pool_pages(&self) -> u64 {
        u64::from(self.sh.pool.slots())
    }

    /// Every region now: (start address, length in bytes), in address order (munmap and
    /// mremap split and move them, so this is a snapshot). Empty in a forked child:
    /// [`Runtime::before_fork`] returned the regions at fork.
    pub fn regions(&self) -> Vec<(usize, usize)> {
        if self.sh.in_child.load(Ordering::Relaxed) {
            return Vec::new();
        }
        let st = self.sh.state.lock();
        st.pages
            .ranges()
            .into_iter()
            .map(|(s, e)| (s, e - s))
            .collect()
    }

    /// Before `fork()`: pauses eviction and brings every evicted page of every region back
    /// into local memory (temporarily exceeding the budget) until
    /// [`Runtime::after_fork_parent`], so the child gets all region data as plain memory.
    /// Returns the regions (start address, length in bytes), for a child that starts a
    /// runtime of its own: it must not ask its copy of this one (see
    /// [`Runtime::after_fork_child`]). Empty in a forked child.
    pub fn before_fork(&self) -> Vec<(usize, usize)> {
        if self.sh.in_child.load(Ordering::Relaxed) {
            return Vec::new();
        }
        fork::before_fork(&self.sh, false).regions
    }

    /// Before `fork()`: [`Runtime::before_fork`], with everything the child needs. With `lend`
    /// (for a child that starts a runtime of its own) pages in the host tier stay there — the child inherits
    /// their slabs and borrows them ([`Runtime::borrow`] with [`ForkPlan::lent`]), so the
    /// budget holds during the fork. Falls back to bringing them back when the node refuses a
    /// hold. Pass the plan to [`Runtime::after_fork_parent_with`] in the parent.
    pub fn prepare_fork(&self, lend: bool) -> ForkPlan {
        if self.sh.in_child.load(Ordering::Relaxed) {
            return ForkPlan::default();
        }
        fork::before_fork(&self.sh, lend)
    }

    /// After `fork()` in the parent: resumes eviction (once every concurrent fork is done).
    pub fn after_fork_parent(&self) {
        if !self.sh.in_child.load(Ordering::Relaxed) {
            fork::after_fork_parent(&self.sh, None);
        }
    }

    /// After `fork()` in the parent, for a fork prepared with [`Runtime::prepare_fork`]: the
    /// lent pages stay frozen while a child maps them.
    pub fn after_fork_parent_with(&self, plan: Option<&ForkPlan>) {
        if !self.sh.in_child.load(Ordering::Relaxed) {
            fork::after_fork_parent(&self.sh, plan);
        }
    }

    /// In a forked child's own runtime (started with [`RuntimeConfig::far_floor`] at
    /// [`Lent::floor`], its regions registered): takes the slabs the parent lent as read-only
    /// memory slabs and marks every lent page not present here as remote there, so it is
    /// fetched on access like any other. Returns the pages borrowed. On an error nothing is
    /// borrowed; the child should copy the pages in ([`Lent::copy_in`]).
    pub fn borrow(&self, lent: &Lent) -> Result<usize, RuntimeError> {
        if self.sh.in_child.load(Ordering::Relaxed) {
            return Err(RuntimeError::InChild);
        }
        fork::borrow(&self.sh, lent)
    }

    /// After `fork()` in the child: the regions are plain memory there (no userfaultfd
    /// registration is inherited) and no runtime thread exists; the runtime refuses new work
    /// from now on and takes none of its locks (one of the parent's threads may have held
    /// any of them at the fork instant).
    pub fn after_fork_child(&self) {
        self.sh.in_child.store(true, Ordering::SeqCst);
    }
}

impl Drop for Runtime {
    fn drop(&mut self) {
        if self.sh.in_child.load(Ordering::Relaxed) {
            return;
        }
        self.sh.shutdown.store(true, Ordering::SeqCst);
        // Each lock once: a thread that looked at the flag before the store and has not
        // waited yet holds its lock, so the notifications below come after its wait began.
        drop(self.sh.state.lock());
        drop(self.sh.pf.queue.lock());
        self.sh.doorbell.ring();
        self.sh.far.wake_healer();
        self.sh.evict_cv.notify_all();
        self.sh.stage_cv.notify_all();
        self.sh.slots_cv.notify_all();
        self.sh.pf.wake();
        for t in self.threads.lock().drain(..) {
            let _ = t.join();
        }
        // The pool is unmapped when the shared core is dropped.
        let pool = self.sh.pool.mapping();
        let _ = self.sh.pool_uffd.unregister(pool.addr(), pool.len());
    }
}

impl Region {
    /// Start of the region.
    pub fn as_ptr(&self) -> *mut u8 {
        self.mapping.as_ptr()
    }

    /// Length in bytes (a multiple of 4096).
    pub fn len(&self) -> usize {
        self.mapping.len()
    }

    /// Whether the region is empty (never: regions have at least one page).
    pub fn is_empty(&self) -> bool {
        self.mapping.is_empty()
    }

    /// The runtime's counters (process-wide: the budget is shared by all regions).
    pub fn stats(&self) -> Stats {
        self.rt.stats()
    }

    /// The runtime this region belongs to.
    pub fn runtime(&self) -> &Arc<Runtime> {
        &self.rt
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        self.rt.drop_region(self.mapping.addr(), self.mapping.len());
    }
}
