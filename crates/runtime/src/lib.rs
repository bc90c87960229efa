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
//! - Paging engine ([`engine`]): a fault loop answering faults (zero page, write-back pool
//!   hit moved back with UFFDIO_MOVE, or donor fetch), an evictor keeping resident pages below
//!   the budget by moving victims into the write-back pool, and a sender writing pool pages to
//!   donors in batches. Dirty tracking with synchronous userfaultfd write-protect: clean pages
//!   are dropped at eviction without resending; all-zero pages are never sent.
//! - Page table ([`table`]): sparse, per region, chunked.
//! - Far side ([`far`]): far page numbers, slabs placed on donors when first written (power of
//!   two choices among several donors), the embedded donor child when none is configured.
//! - Counters ([`stats`]): faults by kind, evictions by kind, bytes, residency, latencies.
//! - Prefetching ([`prefetch`]): the fault loop feeds the prefetcher (default `leap`, one
//!   stream per thread); a prefetch thread fetches its predictions on connections of its own
//!   and keeps them in the write-back pool, where the first touch finds them; counters for
//!   accuracy and coverage; the optional page-access trace (`record_trace`).
//! - Budget: the evictor keeps resident region pages between a low and a high watermark below
//!   the budget (headroom 1/16 of it, at most 256 pages) in the background, so a fault
//!   normally finds room at once; only a fault that would exceed the budget itself waits for
//!   the evictor (not while write-back is failing: then the budget is exceeded and the error
//!   is in [`Stats::last_error`]). The write-back pool is local memory in addition to the
//!   budget (`pool_bytes`).
//! - Fork ([`Runtime::before_fork`]): the runtime does not enable UFFD_FEATURE_EVENT_FORK, so a
//!   child's copy of a region is unregistered plain memory. Every evicted page is therefore
//!   brought back before fork (eviction paused), the child gets all the data as ordinary
//!   memory and no runtime threads; the parent resumes after fork. Pages shared with a child
//!   cannot be MOVEd (EBUSY) until the parent writes them; they stay resident meanwhile.
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

mod engine;
mod far;
mod pool;
mod prefetch;
pub mod run_settings;
mod stats;
mod table;

use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use farmem_uffd::{Features, RegisterMode, Uffd, UffdError};
use parking_lot::{Condvar, Mutex};

pub use prefetch::PrefetchInstall;
pub use stats::{FaultLatency, LatencySummary, PreloadCounters, Stats, StatsFile, StatsSummary};

use engine::{Shared, State};
use table::{PageState, Table};

/// The page size the runtime manages.
pub const PAGE_SIZE: usize = 4096;

/// The smallest budget [`Runtime::start`] accepts (16 pages).
pub const MIN_BUDGET_BYTES: u64 = 16 * PAGE_SIZE as u64;

/// The smallest write-back pool (16 slots).
const MIN_POOL_BYTES: u64 = 16 * PAGE_SIZE as u64;

/// The smallest local memory [`split_local_memory`] accepts: the minimum budget and pool.
pub const MIN_LOCAL_BYTES: u64 = MIN_BUDGET_BYTES + MIN_POOL_BYTES;

/// Splits one limit on local memory into the region budget and the write-back pool
/// (`(budget_bytes, pool_bytes)`), so that resident region pages and pool pages together stay
/// within it: the pool gets a fifth, 64 KiB to 64 MiB, in whole pages. `farmem run
/// --local-mem` means this total, so a program under farmem uses no more local page memory
/// than the limit a swap-based comparison gives its cgroup. `None` below [`MIN_LOCAL_BYTES`].
pub fn split_local_memory(local_bytes: u64) -> Option<(u64, u64)> {
    if local_bytes < MIN_LOCAL_BYTES {
        return None;
    }
    let page = PAGE_SIZE as u64;
    let pool = ((local_bytes / 5).clamp(MIN_POOL_BYTES, 64 << 20) / page) * page;
    let budget = ((local_bytes - pool) / page) * page;
    Some((budget, pool))
}

/// How a [`Runtime`] runs.
#[derive(Clone)]
pub struct RuntimeConfig {
    /// Bytes of local memory the resident region pages may use.
    pub budget_bytes: u64,
    /// Donor addresses (HOST:PORT); empty → start the embedded local donor (child process).
    pub donors: Vec<String>,
    /// Auth token presented to donors.
    pub token: Option<Vec<u8>>,
    /// Eviction policy name (`farmem_policy::evict::NAMES`), default "fifo".
    pub evict: String,
    /// Prefetcher name (`farmem_policy::prefetch::NAMES`), default "leap" (one stream per
    /// thread); "none" disables prefetching.
    pub prefetch: String,
    /// How prefetched pages are made local: kept in the write-back pool until their first
    /// touch (default) or installed at once except one marker page per window.
    pub prefetch_install: PrefetchInstall,
    /// Run first in every runtime and transport thread.
    pub thread_hook: Option<Arc<dyn Fn() + Send + Sync>>,
    /// The `farmem` binary used to start the embedded donor (else $FARMEM_BIN, else PATH).
    pub farmem_bin: Option<PathBuf>,
    /// Record every fault (time, page, thread, read/write) to this file in farmem-sim's trace
    /// format; complete once [`Runtime::finish_trace`] returns or the runtime is dropped.
    pub record_trace: Option<PathBuf>,
    /// Size of the write-back pool; default budget/4, within 1 MiB..64 MiB.
    pub pool_bytes: Option<u64>,
    /// Capacity the embedded donor lends (default 16 GiB; committed only when written).
    pub embedded_capacity_bytes: u64,
    /// Slab size of the embedded donor (default 64 MiB).
    pub embedded_slab_size_bytes: u64,
    /// Limit for each donor request (transport); default 5 s.
    pub request_timeout: Duration,
    /// Emulated extra link latency per request, µs (transport); default 0.
    pub link_delay_us: u64,
    /// Tries for a demand fetch before the page is poisoned; default 2.
    pub fetch_attempts: u32,
}

impl Default for RuntimeConfig {
    fn default() -> Self {
        RuntimeConfig {
            budget_bytes: 256 << 20,
            donors: Vec::new(),
            token: None,
            evict: "fifo".into(),
            prefetch: "leap".into(),
            prefetch_install: PrefetchInstall::Buffer,
            thread_hook: None,
            farmem_bin: None,
            record_trace: None,
            pool_bytes: None,
            embedded_capacity_bytes: 16 << 30,
            embedded_slab_size_bytes: 64 << 20,
            request_timeout: Duration::from_secs(5),
            link_delay_us: 0,
            fetch_attempts: 2,
        }
    }
}

impl std::fmt::Debug for RuntimeConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RuntimeConfig")
            .field("budget_bytes", &self.budget_bytes)
            .field("donors", &self.donors)
            .field("evict", &self.evict)
            .field("prefetch", &self.prefetch)
            .field("prefetch_install", &self.prefetch_install)
            .field("record_trace", &self.record_trace)
            .field("pool_bytes", &self.pool_bytes)
            .finish_non_exhaustive()
    }
}

/// Errors of the runtime: each names the failing step and what to do.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    #[error("invalid runtime configuration: {0}")]
    Config(String),
    #[error("userfaultfd: {step}")]
    Uffd {
        step: &'static str,
        #[source]
        source: UffdError,
    },
    #[error("donor {addr}: {step} failed")]
    Donor {
        addr: String,
        step: &'static str,
        #[source]
        source: farmem_transport::TransportError,
    },
    #[error(
        "the donors are full: no slab could be placed on any of {donors} donor(s) lending \
         {capacity_bytes} bytes in total (last refusal from {addr}); start more donors or give \
         them more --capacity, or raise the budget"
    )]
    DonorsFull {
        donors: usize,
        capacity_bytes: u64,
        addr: String,
        #[source]
        source: farmem_transport::TransportError,
    },
    #[error(
        "a region of {len_bytes} bytes needs up to {needed_bytes} bytes of far memory beyond \
         the budget, but the donors lend only {capacity_bytes} bytes: start more donors, give \
         them more --capacity, or raise the budget"
    )]
    InsufficientCapacity {
        len_bytes: u64,
        needed_bytes: u64,
        capacity_bytes: u64,
    },
    #[error("donor {addr} is unusable: {reason}")]
    BadDonor { addr: String, reason: String },
    #[error("the embedded donor could not be started: {reason}")]
    EmbeddedDonor { reason: String },
    #[error("could not start {what}")]
    Spawn {
        what: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("{op} of {len_bytes} bytes failed")]
    Mmap {
        op: &'static str,
        len_bytes: usize,
        #[source]
        source: std::io::Error,
    },
    #[error("{addr:#x}+{len_bytes:#x} cannot be registered: {reason}")]
    BadRange {
        addr: usize,
        len_bytes: usize,
        reason: &'static str,
    },
    #[error("the runtime cannot be used in a forked child (its threads exist only in the parent)")]
    InChild,
    #[error("internal error: {0}")]
    Internal(&'static str),
}

/// The paging runtime of this process.
pub struct Runtime {
    sh: Arc<Shared>,
    threads: Mutex<Vec<JoinHandle<()>>>,
    fork_locked: AtomicBool,
}

/// A region created by [`Runtime::map`]: unmapped on drop.
pub struct Region {
    rt: Arc<Runtime>,
    addr: usize,
    len: usize,
}

// SAFETY: a Region is an address range plus a runtime handle; the memory is accessed through
// the raw pointer by the caller, who owns the synchronization of its contents.
unsafe impl Send for Region {}
// SAFETY: as above; `&Region` only gives out the pointer and length.
unsafe impl Sync for Region {}

fn required_features() -> Features {
    Features::PAGEFAULT_FLAG_WP
        | Features::EVENT_REMOVE
        | Features::EVENT_UNMAP
        | Features::EVENT_REMAP
        | Features::MOVE
}

fn mmap_anon(len: usize, what: &'static str) -> Result<usize, RuntimeError> {
    // SAFETY: a fresh private anonymous mapping; the kernel picks the address.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(RuntimeError::Mmap {
            op: what,
            len_bytes: len,
            source: std::io::Error::last_os_error(),
        });
    }
    // SAFETY: advice on the mapping just created.
    unsafe { libc::madvise(p, len, libc::MADV_NOHUGEPAGE) };
    Ok(p as usize)
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
        let policy = farmem_policy::evict::by_name(&cfg.evict)
            .map_err(|e| RuntimeError::Config(e.to_string()))?;
        let uffd = Uffd::open(required_features(), Features::THREAD_ID | Features::POISON)
            .map_err(|source| RuntimeError::Uffd {
                step: "opening the region userfaultfd",
                source,
            })?;
        // The pool's userfaultfd has no events (freeing pool pages never blocks) and SIGBUS
        // instead of fault messages: a runtime bug touching an empty slot crashes loudly.
        let pool_uffd =
            Uffd::open(Features::MOVE | Features::SIGBUS, Features::empty()).map_err(|source| {
                RuntimeError::Uffd {
                    step: "opening the pool userfaultfd",
                    source,
                }
            })?;
        let budget_pages = cfg.budget_bytes / PAGE_SIZE as u64;
        let pool_bytes = cfg
            .pool_bytes
            .unwrap_or((cfg.budget_bytes / 4).clamp(1 << 20, 64 << 20));
        let pool_slots = (pool_bytes / PAGE_SIZE as u64).max(16) as u32;
        let pool_len = pool_slots as usize * PAGE_SIZE;
        let pool_base = mmap_anon(pool_len, "mapping the write-back pool")?;
        // A forked child never needs the pool (it has no runtime), and a pool page shared
        // copy-on-write with a child could not be MOVEd back (EBUSY) until written: a fork
        // that runs no fork handlers (raw clone) or another runtime's fork would leave such
        // pages behind. Not inherited, the pool's pages stay exclusive to this process.
        // SAFETY: advice on the pool mapping just created and owned by the runtime.
        unsafe {
            libc::madvise(
                pool_base as *mut libc::c_void,
                pool_len,
                libc::MADV_DONTFORK,
            )
        };
        // SAFETY: the pool mapping was just created and is owned by the runtime; no Rust
        // reference points into it.
        unsafe {
            pool_uffd.register(
                pool_base,
                pool_len,
                RegisterMode {
                    missing: true,
                    wp: false,
                },
            )
        }
        .map_err(|source| RuntimeError::Uffd {
            step: "registering the write-back pool",
            source,
        })?;
        let far = Arc::new(far::Far::connect(&cfg)?);
        let pf = prefetch::Prefetch::new(&cfg, &far)?;
        let headroom = (budget_pages / 16).clamp(2, 256);
        let sh = Arc::new(Shared {
            uffd,
            pool_uffd,
            pool_base,
            pool_slots,
            self_pidfd: pool::self_pidfd(),
            state: Mutex::new(State {
                table: Table::default(),
                policy,
                resident: 0,
                evicting: 0,
                slot_owner: vec![0; pool_slots as usize],
                pool_free: (0..pool_slots).rev().collect(),
                pool_stale: Vec::new(),
                pool_cached: VecDeque::new(),
                far_free: Vec::new(),
                far_next: 0,
                stage_gen: 0,
                paused: false,
                staging: VecDeque::new(),
            }),
            evict_cv: Condvar::new(),
            commit_cv: Condvar::new(),
            stage_cv: Condvar::new(),
            slots_cv: Condvar::new(),
            far,
            stats: Mutex::new(stats::StatsCell::new()),
            shutdown: AtomicBool::new(false),
            in_child: AtomicBool::new(false),
            budget_pages,
            low_water: budget_pages - headroom,
            high_water: budget_pages - headroom / 2,
            fetch_attempts: cfg.fetch_attempts,
            thread_hook: cfg.thread_hook.clone(),
            zero: vec![0u8; PAGE_SIZE].into_boxed_slice(),
            loop_seq: std::sync::atomic::AtomicU64::new(0),
            send_failing: AtomicBool::new(false),
            evictor_blocked: AtomicBool::new(false),
            pf,
        });
        let mut threads = Vec::new();
        let spawn = |name: &str, f: fn(Arc<Shared>), sh: Arc<Shared>| {
            std::thread::Builder::new()
                .name(name.into())
                .spawn(move || f(sh))
                .map_err(|source| RuntimeError::Spawn {
                    what: "a runtime thread",
                    source,
                })
        };
        threads.push(spawn("farmem-fault", engine::fault_loop, sh.clone())?);
        threads.push(spawn("farmem-evict", engine::evict_loop, sh.clone())?);
        threads.push(spawn("farmem-send", engine::send_loop, sh.clone())?);
        if sh.pf.enabled() {
            threads.push(spawn(
                "farmem-prefetch",
                prefetch::prefetch_loop,
                sh.clone(),
            )?);
        }
        tracing::debug!(
            "farmem runtime started: budget {} pages, pool {} pages, {} donor(s), slab {} pages",
            budget_pages,
            pool_slots,
            sh.far.donors.len(),
            sh.far.slab_pages
        );
        Ok(Arc::new(Runtime {
            sh,
            threads: Mutex::new(threads),
            fork_locked: AtomicBool::new(false),
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
        let needed = (len as u64).saturating_sub(self.sh.budget_pages * PAGE_SIZE as u64);
        let cap = self.sh.far.capacity_bytes();
        if needed > cap {
            return Err(RuntimeError::InsufficientCapacity {
                len_bytes: len as u64,
                needed_bytes: needed,
                capacity_bytes: cap,
            });
        }
        let addr = mmap_anon(len, "mapping a region")?;
        if let Err(e) = self.adopt(addr, len, false) {
            // SAFETY: unmapping the mapping created just above, never handed out.
            unsafe { libc::munmap(addr as *mut libc::c_void, len) };
            return Err(e);
        }
        Ok(Region {
            rt: self.clone(),
            addr,
            len,
        })
    }

    /// Adopts an existing private anonymous mapping (page-aligned) as a region. The program
    /// keeps owning it: later munmap/mremap/MADV_DONTNEED are seen through userfaultfd events.
    ///
    /// The caller must not hold Rust references into the range that assume its pages stay in
    /// place (they are moved out and back in by the runtime, transparently for plain loads and
    /// stores).
    pub fn register(&self, addr: *mut u8, len_bytes: usize) -> Result<(), RuntimeError> {
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
        // SAFETY: advice only; fails harmlessly on ranges that are not mapped.
        unsafe { libc::madvise(addr.cast(), len_bytes, libc::MADV_NOHUGEPAGE) };
        self.adopt(a, len_bytes, true)
    }

    fn adopt(&self, addr: usize, len: usize, scan_present: bool) -> Result<(), RuntimeError> {
        let sh = &self.sh;
        let mut st = sh.state.lock();
        if st.table.overlaps(addr, addr + len) {
            // Perhaps an old mapping there was unmapped and the fault loop has read, but not
            // yet processed, its UNMAP event: let it finish two iterations, then look again.
            drop(st);
            let seen = sh.loop_seq.load(Ordering::Acquire);
            let deadline = std::time::Instant::now() + Duration::from_secs(1);
            while sh.loop_seq.load(Ordering::Acquire) < seen + 2
                && std::time::Instant::now() < deadline
            {
                std::thread::sleep(Duration::from_micros(200));
            }
            st = sh.state.lock();
        }
        if st.table.overlaps(addr, addr + len) {
            return Err(RuntimeError::BadRange {
                addr,
                len_bytes: len,
                reason: "it overlaps a range already registered",
            });
        }
        let present = if scan_present {
            let mut v = vec![0u8; len / PAGE_SIZE];
            // SAFETY: mincore writes one byte per page of the range into `v`, which has
            // exactly that many.
            let r = unsafe { libc::mincore(addr as *mut libc::c_void, len, v.as_mut_ptr()) };
            if r != 0 {
                return Err(RuntimeError::BadRange {
                    addr,
                    len_bytes: len,
                    reason: "it is not (entirely) mapped",
                });
            }
            v
        } else {
            Vec::new()
        };
        // SAFETY: the range is private anonymous memory the program hands to the runtime
        // (map: created above; register: the caller's promise); no Rust reference relies on
        // its pages staying in place.
        unsafe {
            sh.uffd.register(
                addr,
                len,
                RegisterMode {
                    missing: true,
                    wp: true,
                },
            )
        }
        .map_err(|source| RuntimeError::Uffd {
            step: "registering a region",
            source,
        })?;
        st.table.add(addr, addr + len);
        for (i, b) in present.iter().enumerate() {
            if b & 1 != 0 {
                let a = addr + i * PAGE_SIZE;
                if let Some(m) = st.table.get_mut(a) {
                    m.state = PageState::ResidentDirty;
                }
                st.resident += 1;
                st.policy
                    .insert((a / PAGE_SIZE) as u64, farmem_policy::Origin::Demand);
            }
        }
        if st.resident >= sh.high_water {
            sh.evict_cv.notify_one();
        }
        Ok(())
    }

    /// Forgets and unmaps a region created by `map`.
    fn drop_region(&self, addr: usize, len: usize) {
        let sh = &self.sh;
        if !sh.in_child.load(Ordering::Relaxed) {
            let mut st = sh.state.lock();
            while st.evicting > 0 {
                sh.commit_cv.wait_for(&mut st, Duration::from_millis(5));
            }
            let mut entries = Vec::new();
            st.table
                .for_each_in(addr, addr + len, |a, e| entries.push((a, *e)));
            for (a, mut e) in entries {
                sh.forget(&mut st, a, &mut e);
            }
            st.table.remove_range(addr, addr + len);
            drop(st);
            // Unregister first so munmap raises no UNMAP event.
            let _ = sh.uffd.unregister(addr, len);
        }
        // SAFETY: the region's own mapping, created by `map`, no longer referenced.
        unsafe { libc::munmap(addr as *mut libc::c_void, len) };
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> Stats {
        let sh = &self.sh;
        let (resident, pool_pages) = if sh.in_child.load(Ordering::Relaxed) {
            (0, 0)
        } else {
            let st = sh.state.lock();
            (
                st.resident,
                st.slot_owner.iter().filter(|o| **o != 0).count() as u64,
            )
        };
        let mut s = sh.stats.lock().snapshot();
        s.resident_pages = resident;
        s.pool_pages = pool_pages;
        s.budget_pages = sh.budget_pages;
        s.pool_capacity_pages = u64::from(sh.pool_slots);
        s.slabs_placed = sh.far.slabs_placed();
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

    /// Before `fork()`: pauses eviction, brings every evicted page of every region back into
    /// local memory (temporarily exceeding the budget), and holds the runtime's state until
    /// [`Runtime::after_fork_parent`] / [`Runtime::after_fork_child`]. The child then gets all
    /// region data as plain memory.
    pub fn before_fork(&self) {
        let sh = &self.sh;
        if sh.in_child.load(Ordering::Relaxed) {
            return;
        }
        {
            let mut st = sh.state.lock();
            st.paused = true;
            while st.evicting > 0 {
                sh.commit_cv.wait_for(&mut st, Duration::from_millis(5));
            }
        }
        if let Err(e) = engine::bring_all_back(sh) {
            sh.report(
                format!(
                    "before fork: bringing evicted pages back failed ({e}); the child will \
                     read zeros where those pages are"
                ),
                true,
            );
        }
        // Hold the state lock across fork so the child's copy is consistent.
        let mut st = sh.state.lock();
        if let Some(what) = engine::check_all_back(&mut st) {
            sh.report(
                format!("before fork: {what}; the child will read zeros there"),
                true,
            );
        }
        std::mem::forget(st);
        self.fork_locked.store(true, Ordering::SeqCst);
    }

    /// After `fork()` in the parent: releases the state and resumes eviction.
    pub fn after_fork_parent(&self) {
        let sh = &self.sh;
        if self.fork_locked.swap(false, Ordering::SeqCst) {
            // SAFETY: `before_fork` locked the state mutex and forgot the guard; this thread
            // releases that lock exactly once (guarded by `fork_locked`).
            unsafe { sh.state.force_unlock() };
            let mut st = sh.state.lock();
            st.paused = false;
            drop(st);
            sh.evict_cv.notify_one();
        }
    }

    /// After `fork()` in the child: the regions are plain memory there (no userfaultfd
    /// registration is inherited) and no runtime thread exists; the runtime refuses new work.
    pub fn after_fork_child(&self) {
        let sh = &self.sh;
        sh.in_child.store(true, Ordering::SeqCst);
        if self.fork_locked.swap(false, Ordering::SeqCst) {
            // SAFETY: the child's copy of the mutex was locked by `before_fork` in the
            // parent's forking thread, which is this thread in the child.
            unsafe { sh.state.force_unlock() };
        }
    }
}

impl Drop for Runtime {
    fn drop(&mut self) {
        if self.sh.in_child.load(Ordering::Relaxed) {
            return;
        }
        if self.fork_locked.swap(false, Ordering::SeqCst) {
            // SAFETY: `before_fork` locked the state mutex and forgot the guard, and no
            // `after_fork_*` released it (a caller bug or a panic in between): release it so
            // the runtime threads can stop.
            unsafe { self.sh.state.force_unlock() };
        }
        self.sh.shutdown.store(true, Ordering::SeqCst);
        self.sh.evict_cv.notify_all();
        self.sh.stage_cv.notify_all();
        self.sh.slots_cv.notify_all();
        self.sh.pf.wake();
        for t in self.threads.lock().drain(..) {
            let _ = t.join();
        }
        let len = self.sh.pool_slots as usize * PAGE_SIZE;
        let _ = self.sh.pool_uffd.unregister(self.sh.pool_base, len);
        // SAFETY: the pool mapping is owned by the runtime and no thread uses it any more.
        unsafe { libc::munmap(self.sh.pool_base as *mut libc::c_void, len) };
    }
}

impl Region {
    /// Start of the region.
    pub fn as_ptr(&self) -> *mut u8 {
        self.addr as *mut u8
    }

    /// Length in bytes (a multiple of 4096).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the region is empty (never: regions have at least one page).
    pub fn is_empty(&self) -> bool {
        self.len == 0
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
        self.rt.drop_region(self.addr, self.len);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn local_memory_split_stays_within_the_limit() {
        assert_eq!(split_local_memory(MIN_LOCAL_BYTES - 1), None);
        assert_eq!(
            split_local_memory(MIN_LOCAL_BYTES),
            Some((MIN_BUDGET_BYTES, MIN_POOL_BYTES))
        );
        let mib = 1u64 << 20;
        assert_eq!(split_local_memory(100 * mib), Some((80 * mib, 20 * mib)));
        // The pool is capped at 64 MiB.
        assert_eq!(split_local_memory(1000 * mib), Some((936 * mib, 64 * mib)));
        for local in [MIN_LOCAL_BYTES, 200_001, 3 * mib + 17, 513 * mib + 4095] {
            let (budget, pool) = split_local_memory(local).unwrap();
            assert!(budget + pool <= local, "{local}");
            assert!(
                budget >= MIN_BUDGET_BYTES && pool >= MIN_POOL_BYTES,
                "{local}"
            );
            assert_eq!((budget % PAGE_SIZE as u64, pool % PAGE_SIZE as u64), (0, 0));
        }
    }
}
