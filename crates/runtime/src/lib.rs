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
//! - Far side ([`far`], [`slabs`], [`copies`]): far page numbers, slabs placed on donors when first
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
//!   `request_timeout`), and no sooner than `stall_patience` while a copy is on a donor that
//!   stalled or was cut off, is poisoned; the faulting thread gets SIGBUS, the error is logged
//!   and counted. Write-back failures (donor full, donor gone) are retried while the pages stay in
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

mod budget;
mod config;
mod copies;
mod cpu;
mod doorbell;
mod drops;
mod embedded;
mod error;
mod evict;
mod failure;
mod failure_log;
mod far;
mod fault;
mod fork;
mod forkhold;
mod forkmarks;
mod lentcopies;
mod lentdonors;
mod mm;
mod pages;
mod prefetch;
mod readtimes;
mod runs;
mod runtime;
pub mod secure;
mod shared;
pub mod signals;
mod slabs;
mod slots;
mod stats;
mod sync;
mod threads;

pub use budget::Usage;
pub use config::{check_prefetch, RuntimeConfig};
pub use farmem_contract::local::{LocalMemory, MIN_BUDGET_BYTES, MIN_LOCAL_BYTES};
// The contract with `farmem run` and the benchmarks (crate farmem-contract), re-exported so
// the runtime's users name one crate.
pub use embedded::PrivateNode;
pub use error::RuntimeError;
pub use error::SealError;
pub use error::{CopyFailure, ReadFailed};
pub use farmem_contract::{
    modes, run_settings, DonorUse, FaultLatency, LatencySummary, OverBudget, PrefetchInstall,
    PreloadCounters, SealMode, Stats, StatsFile, StatsSummary, TierMode, TreeProcess, TreeStats,
    UnknownMode, UnmanagedMapping, UnmanagedReport, UnpagedProcess, TREE_BUDGET_SOCKET,
    TREE_STATS_DIR,
};
pub use fork::{ForkPlan, Lent};
pub use forkmarks::ForkAdvice;
pub use lentdonors::LentDonors;
pub use stats::{clock_ticks_per_s, parse_proc_stat, runtime_threads_cpu, ProcStat, ThreadsCpu};

pub use runtime::{Region, Runtime};

/// The page size the runtime manages: the wire's page (farmem-proto), which the memory and
/// userfaultfd crates (below the wire, so with constants of their own) must agree with.
pub use farmem_proto::PAGE_SIZE;
const _: () = assert!(PAGE_SIZE == farmem_mm::PAGE_SIZE && PAGE_SIZE == farmem_uffd::PAGE_SIZE);
