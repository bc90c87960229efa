//! Prefetching in the runtime: the fault loop feeds a [`farmem_policy::prefetch::Prefetcher`]
//! with every fault that needed data and every prefetch hit it sees; the pages it predicts are
//! fetched by a prefetch thread on connections of their own and made local before the program
//! touches them. Also the page-access trace (`RuntimeConfig::record_trace`).
//!
//! This file holds the prefetcher's state, its construction and the trace; what the fault path
//! tells it is in [`faults`], the prefetch thread in [`crate::threads::prefetch`].
//!
//! # Design
//!
//! - **Feeding.** Faults served from the write-back pool, the host tier or a donor are accesses
//!   Leap would see as swap-ins: each is reported with its page number (virtual address / 4096),
//!   the faulting thread id (from the fault message) and the time. Zero-page faults (never
//!   written pages: nothing to fetch) and write-protect faults are not reported.
//! - **Filtering.** Predicted pages are fetched only if their entry is `Remote` (on a donor
//!   only) and not already in flight; at most [`MAX_IN_FLIGHT`] pages not yet reached by a
//!   demand fault are in flight at once (beyond that, predictions are not issued). Requests a
//!   demand fault reached while still queued are skipped, so a prefetch thread that fell
//!   behind (a loaded machine) catches up rather than fetching stale pages.
//! - **Pages in the host tier** (a memory slab) are not fetched: the fault thread copies them
//!   straight into the region as soon as they are predicted (`fault::install_ahead`, one
//!   UFFDIO_COPY each, write-protected and clean), except the window's first page, its
//!   marker, left in the tier. The marker's fault is a tier fault seen as a prefetch hit, and
//!   the window's pages installed before it that are still resident are reported as (inferred)
//!   hits first, so Leap's window grows as it does in marker mode. Tier faults feed the
//!   prefetcher like pool hits and donor faults.
//! - **Fetching.** The prefetch thread (`farmem-prefetch`) takes every queued request, groups
//!   them by donor in batches of up to 256 pages, submits all batches, then waits for each.
//!   It uses one extra [`DonorClient`] per donor (same client id, so the same slabs): a demand
//!   read never queues behind a prefetch batch on the fault path's connection, and the fault
//!   loop never waits for a prefetch.
//! - **Arrival.** Under the state lock, a page is kept only if its entry is still `Remote` with
//!   the same far page, the page is still wanted (not consumed by a demand fault meanwhile)
//!   and eviction is not paused (fork); otherwise it is dropped (`prefetch_dropped`). Released
//!   or remapped pages change their entry, so their late copies are dropped the same way.
//! - **Feedback (install mode).** A page installed into the region raises no event when the
//!   program touches it. [`PrefetchInstall::Buffer`] (default) copies prefetched pages into
//!   write-back pool slots (state `PoolSent`: they equal their donor copy); the program's first
//!   touch faults and is served by a local MOVE, which the runtime sees: every prefetch hit is
//!   reported and measured exactly. [`PrefetchInstall::Marker`] installs each window's pages
//!   into the region at once (write-protected, clean) except the first one of the window
//!   (Leap's pipelining marker), kept in the pool; the marker's fault is the only hit seen, so
//!   the eagerly installed pages of the stream's previous window that are still resident are
//!   reported as (inferred) hits first, as Linux's readahead infers consumption from its
//!   marker. `farmem bench prefetch` measures both; docs/architecture.md has the figures.
//! - **Eager eviction.** A page served as a prefetch hit is inserted with `Origin::Prefetch`
//!   and touched, so the eviction policy evicts consumed prefetched pages first; eagerly
//!   installed pages are inserted with `Origin::Prefetch`.
//! - **Measures.** [`PrefetchStats`]: a page counts as prefetched when it lands; a fault on
//!   an unused prefetched page is a prefetch hit; a fault served from a donor is a demand fault
//!   (Leap's coverage counts the accesses that would have gone to far memory: a fault served
//!   from the write-back pool on a page that was not prefetched is a local cache hit, neither). A fault on a page whose prefetch is still in flight counts as a prefetch hit that
//!   waited (`prefetch_hits_waited`, also in `prefetch_hits`): the prediction was right and in
//!   time to be issued, only the transfer was late. The fault waits for that transfer
//!   ([`Prefetch::wait_for_prefetch`]): the page is `Fetching` and its arrival installs it and wakes the
//!   thread; a failed batch hands the page back to the demand path (the thread faults again).
//!   A demand read of its own would queue behind the batch anyway, and a scan that outruns its
//!   prefetches would send one per page. This keeps coverage a property of the predictions,
//!   not of the machine's load.
//! - **Trace.** Every fault message read (demand, write-protect, zero) is appended to the
//!   trace (time since the runtime started, page number, thread id, read/write) by the fault
//!   loop through a buffered [`TraceWriter`]; [`crate::Runtime::finish_trace`] or dropping the
//!   runtime writes the header's count.
//!
//! Lock order: the state mutex, then this module's `inner` mutex, then the stats mutex.
//!
//! # Limitations
//!
//! - A page that was in flight when faulted is inserted into the eviction policy as a demand
//!   page (it arrives through the demand path).
//! - Pages predicted while they sit in the write-back pool are not touched (already local).
//! - In marker mode, hits on eagerly installed pages are inferred, not observed.

use std::collections::{HashMap, VecDeque};
use std::fs::File;
use std::path::PathBuf;
use std::time::Instant;

use crate::sync::{Condvar, Mutex};
use farmem_contract::PrefetchInstall;
use farmem_policy::measures::{PrefetchStats, PrefetchSummary};
use farmem_policy::prefetch::Prefetcher;
use farmem_trace::{AccessKind, Record, TraceWriter};
use farmem_transport::{ClientConfig, DonorClient};

use crate::config::RuntimeConfig;
use crate::error::RuntimeError;
use crate::far::Far;
use farmem_proto::PAGE_SIZE;

mod faults;
mod lookahead;

pub(crate) use lookahead::Lookahead;

/// Most prefetched pages in flight at once that no demand fault has reached yet, unless the
/// link's lookahead asks for more ([`Lookahead::in_flight_cap`]); predictions beyond it are
/// not issued.
pub(crate) const MAX_IN_FLIGHT: usize = 256;
/// Most in-flight entries kept, consumed ones included (bounds memory if the prefetch thread
/// stalls).
const MAX_TRACKED: usize = 65_536;

/// A page to prefetch.
pub(crate) struct Req {
    pub(crate) addr: usize,
    pub(crate) far: u64,
    pub(crate) thread: u32,
    /// Address of the first page of the window this page belongs to (its marker).
    pub(crate) window: usize,
}

/// A prefetch in flight.
pub(crate) struct InFlight {
    pub(crate) far: u64,
    /// A demand fault reached the page first and was served by its own read (counted as a
    /// waited hit): drop the copy.
    pub(crate) consumed: bool,
    /// A fault reached the page first and waits for this copy (counted as a waited hit): the
    /// page is `Fetching`, and its arrival installs it and wakes the fault (when it raised).
    pub(crate) waiter: Option<Instant>,
}

/// State shared by the fault loop and the prefetch thread.
#[derive(Default)]
pub(crate) struct Inner {
    pub(crate) measures: PrefetchStats,
    pub(crate) in_flight: HashMap<usize, InFlight>,
    pub(crate) hits_waited: u64,
    pub(crate) dropped: u64,
    pub(crate) batches: u64,
    pub(crate) inferred_hits: u64,
    /// In-flight pages not consumed by a demand fault yet.
    pub(crate) live: usize,
    /// How far ahead this link needs prefetches to reach (told to the prefetcher).
    pub(crate) lookahead: Lookahead,
    /// Marker mode: eagerly installed pages of each window, by the window's marker address.
    pub(crate) windows: HashMap<usize, Vec<usize>>,
    /// Marker mode: markers kept in the pool, and their stream.
    pub(crate) markers: HashMap<usize, u32>,
    /// Marker mode: the marker each stream hit last (the window it is consuming).
    pub(crate) last_marker: HashMap<u32, usize>,
}

/// Marker-mode bookkeeping is cleared when it holds more windows than this (markers never
/// hit: the stream changed).
pub(crate) const MAX_WINDOWS: usize = 4096;

/// The prefetch counters, for [`crate::Stats`].
#[derive(Clone, Copy, Debug)]
pub(crate) struct PrefetchCounters {
    pub(crate) summary: PrefetchSummary,
    pub(crate) hits_waited: u64,
    pub(crate) dropped: u64,
    pub(crate) batches: u64,
    pub(crate) inferred_hits: u64,
}

/// The runtime's prefetching and tracing.
pub(crate) struct Prefetch {
    /// None when the prefetcher is "none".
    pub(crate) predictor: Option<Mutex<Box<dyn Prefetcher>>>,
    pub(crate) mode: PrefetchInstall,
    pub(crate) queue: Mutex<VecDeque<Req>>,
    pub(crate) queue_cv: Condvar,
    /// One prefetch connection per donor, in the order of `Far::donors`.
    pub(crate) clients: Vec<DonorClient>,
    pub(crate) inner: Mutex<Inner>,
    trace: Mutex<Option<TraceWriter<File>>>,
    trace_path: Option<PathBuf>,
    epoch: Instant,
}

pub(crate) fn page_of(addr: usize) -> u64 {
    (addr / PAGE_SIZE) as u64
}

/// The address of page number `page` (a prefetcher's prediction), if it is one.
pub(crate) fn addr_of(page: u64) -> Option<usize> {
    usize::try_from(page).ok()?.checked_mul(PAGE_SIZE)
}

impl Prefetch {
    /// Builds the prefetcher, its donor connections and the trace writer.
    pub(crate) fn new(cfg: &RuntimeConfig, far: &Far) -> Result<Prefetch, RuntimeError> {
        let predictor = if cfg.prefetch == "none" {
            None
        } else {
            Some(Mutex::new(
                farmem_policy::prefetch::by_name(&cfg.prefetch)
                    .map_err(|e| RuntimeError::Config(e.to_string()))?,
            ))
        };
        let mut clients = Vec::new();
        if predictor.is_some() {
            for d in &far.donors {
                let addr = d.read.addr().to_string();
                let ccfg = ClientConfig {
                    client_id: d.read.client_id(),
                    reconnect_key: d.read.reconnect_key().clone(),
                    token: cfg.token.clone(),
                    request_timeout: cfg.request_timeout,
                    link_delay_us: cfg.link_delay_us,
                    thread_hook: cfg.thread_hook.clone(),
                    ..ClientConfig::default()
                };
                // A donor down (at start, or since): this connection attaches once the
                // runtime's own has registered there again.
                let down = d.geometry.load(std::sync::atomic::Ordering::Relaxed)
                    != crate::far::GEOMETRY_KNOWN;
                let c = if down {
                    DonorClient::attach_later(&addr, ccfg)
                } else {
                    DonorClient::connect(&addr, ccfg.clone())
                        .or_else(|_| DonorClient::attach_later(&addr, ccfg))
                }
                .map_err(|source| RuntimeError::Donor {
                    addr: addr.clone(),
                    step: "connecting (prefetch)",
                    source,
                })?;
                clients.push(c);
            }
            // A forked child's connections to its parent's client (pages lent on donors):
            // batches share the fault path's connection.
            clients.extend(far.borrowed.iter().map(|d| d.read.clone()));
        }
        let trace =
            match &cfg.record_trace {
                Some(p) => Some(TraceWriter::create(p).map_err(|e| {
                    RuntimeError::Config(format!("record_trace {}: {e}", p.display()))
                })?),
                None => None,
            };
        Ok(Prefetch {
            predictor,
            mode: cfg.prefetch_install,
            queue: Mutex::new(VecDeque::new()),
            queue_cv: Condvar::new(),
            clients,
            inner: Mutex::new(Inner::default()),
            trace: Mutex::new(trace),
            trace_path: cfg.record_trace.clone(),
            epoch: Instant::now(),
        })
    }

    /// Whether a prefetcher runs (a prefetch thread is needed).
    pub(crate) fn enabled(&self) -> bool {
        self.predictor.is_some()
    }

    pub(crate) fn now_ns(&self) -> u64 {
        self.epoch.elapsed().as_nanos() as u64
    }

    /// Appends one fault message to the trace, if one is recorded. Fault loop only.
    pub(crate) fn record(&self, addr: usize, thread: u32, write: bool) {
        let mut t = self.trace.lock();
        let Some(w) = t.as_mut() else {
            return;
        };
        let rec = Record {
            time_ns: self.now_ns(),
            page: page_of(addr),
            thread,
            kind: if write {
                AccessKind::Write
            } else {
                AccessKind::Read
            },
        };
        if let Err(e) = w.write(&rec) {
            tracing::error!(
                "recording the trace to {}: {e}; recording stops",
                self.trace_path
                    .as_deref()
                    .unwrap_or(std::path::Path::new("?"))
                    .display()
            );
            *t = None;
        }
    }

    /// Finishes the trace (writes its record count); later faults are not recorded.
    pub(crate) fn finish_trace(&self) -> Result<u64, RuntimeError> {
        let Some(w) = self.trace.lock().take() else {
            return Ok(0);
        };
        let n = w.count();
        w.finish().map_err(|e| {
            RuntimeError::Config(format!(
                "finishing the trace {}: {e}",
                self.trace_path
                    .as_deref()
                    .unwrap_or(std::path::Path::new("?"))
                    .display()
            ))
        })?;
        Ok(n)
    }

    /// The counters now.
    pub(crate) fn counters(&self) -> PrefetchCounters {
        let i = self.inner.lock();
        PrefetchCounters {
            summary: i.measures.summary(),
            hits_waited: i.hits_waited,
            dropped: i.dropped,
            batches: i.batches,
            inferred_hits: i.inferred_hits,
        }
    }

    /// A page left residency or the pool (evicted, reclaimed, released): an unused prefetched
    /// page counts as pollution. Called with the state lock held.
    pub(crate) fn left(&self, addr: usize) {
        let mut i = self.inner.lock();
        i.measures.evicted(page_of(addr));
    }

    /// The page at `addr` was released and its far page freed. A prefetch of it in flight
    /// now stands for no far page: its copy is dropped on arrival, and a fault waiting for it
    /// is woken to fault again (`threads/prefetch.rs:arrive`). Else the far page, handed out
    /// again and written, would match the old request, whose copy holds the contents from
    /// before the release (found by the page model, decision 0069). Called with the state lock
    /// held.
    pub(crate) fn released(&self, addr: usize) {
        let mut i = self.inner.lock();
        let Some(f) = i.in_flight.get_mut(&addr) else {
            return;
        };
        f.far = crate::pages::NO_FAR;
        if !f.consumed && f.waiter.is_none() {
            f.consumed = true;
            i.live -= 1;
        }
    }

    /// Wakes the prefetch thread (shutdown).
    pub(crate) fn wake(&self) {
        self.queue_cv.notify_all();
    }
}

impl crate::slots::Departures for Prefetch {
    fn left(&self, addr: usize) {
        Prefetch::left(self, addr);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn install_modes_parse_and_reject_others() {
        assert_eq!(
            "buffer".parse::<PrefetchInstall>().unwrap(),
            PrefetchInstall::Buffer
        );
        assert_eq!(
            "marker".parse::<PrefetchInstall>().unwrap(),
            PrefetchInstall::Marker
        );
        let e = "eager".parse::<PrefetchInstall>().unwrap_err().to_string();
        assert!(e.contains("choose buffer or marker"), "{e}");
    }
}
