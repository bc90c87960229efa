//! Prefetching in the runtime: the fault loop feeds a [`farmem_policy::prefetch::Prefetcher`]
//! with every fault that needed data and every prefetch hit it sees; the pages it predicts are
//! fetched by a prefetch thread on connections of their own and made local before the program
//! touches them. Also the page-access trace (`RuntimeConfig::record_trace`).
//!
//! # Design
//!
//! - **Feeding.** Faults served from the write-back pool or from a donor are accesses Leap
//!   would see as swap-ins: each is reported with its page number (virtual address / 4096),
//!   the faulting thread id (from the fault message) and the time. Zero-page faults (never
//!   written pages: nothing to fetch) and write-protect faults are not reported.
//! - **Filtering.** Predicted pages are fetched only if their entry is `Remote` (on a donor
//!   only) and not already in flight; at most [`MAX_IN_FLIGHT`] pages not yet reached by a
//!   demand fault are in flight at once (beyond that, predictions are not issued). Requests a
//!   demand fault reached while still queued are skipped, so a prefetch thread that fell
//!   behind (a loaded machine) catches up rather than fetching stale pages.
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
//!   ([`wait_for_prefetch`]): the page is `Fetching` and its arrival installs it and wakes the
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
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use farmem_policy::measures::{PrefetchStats, PrefetchSummary};
use farmem_policy::prefetch::{Access, Prefetcher};
use farmem_policy::Origin;
use farmem_sim::trace::{AccessKind, Record, TraceWriter};
use farmem_transport::{ClientConfig, Completion, DonorClient, PageAddr, Pending};
use farmem_uffd::UffdError;
use parking_lot::{Condvar, Mutex};

use crate::engine::{Shared, State};
use crate::far::Far;
use crate::stats::FaultKind;
use crate::table::{PageState, NO_FAR};
use crate::{RuntimeConfig, RuntimeError, PAGE_SIZE};

/// Most prefetched pages in flight at once that no demand fault has reached yet (the
/// prefetchers' lookahead is far smaller; predictions beyond it are not issued).
pub(crate) const MAX_IN_FLIGHT: usize = 256;
/// Most in-flight entries kept, consumed ones included (bounds memory if the prefetch thread
/// stalls).
const MAX_TRACKED: usize = 65_536;

/// How prefetched pages are made local (see the module docs).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum PrefetchInstall {
    /// Keep them in the write-back pool; the first touch is a cheap local fault, seen as a hit.
    #[default]
    Buffer,
    /// Install them into the region at once, except each window's first page (the marker).
    Marker,
}

impl std::str::FromStr for PrefetchInstall {
    type Err = RuntimeError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "buffer" => Ok(PrefetchInstall::Buffer),
            "marker" => Ok(PrefetchInstall::Marker),
            other => Err(RuntimeError::Config(format!(
                "unknown prefetch install mode {other:?}: choose buffer or marker"
            ))),
        }
    }
}

/// A page to prefetch.
struct Req {
    addr: usize,
    far: u64,
    thread: u32,
    /// Address of the first page of the window this page belongs to (its marker).
    window: usize,
}

/// A prefetch in flight.
struct InFlight {
    far: u64,
    /// A demand fault reached the page first and was served by its own read (counted as a
    /// waited hit): drop the copy.
    consumed: bool,
    /// A fault reached the page first and waits for this copy (counted as a waited hit): the
    /// page is `Fetching`, and its arrival installs it and wakes the fault (when it raised).
    waiter: Option<Instant>,
}

/// State shared by the fault loop and the prefetch thread.
#[derive(Default)]
struct Inner {
    measures: PrefetchStats,
    in_flight: HashMap<usize, InFlight>,
    hits_waited: u64,
    dropped: u64,
    batches: u64,
    inferred_hits: u64,
    /// In-flight pages not consumed by a demand fault yet.
    live: usize,
    /// Marker mode: eagerly installed pages of each window, by the window's marker address.
    windows: HashMap<usize, Vec<usize>>,
    /// Marker mode: markers kept in the pool, and their stream.
    markers: HashMap<usize, u32>,
    /// Marker mode: the marker each stream hit last (the window it is consuming).
    last_marker: HashMap<u32, usize>,
}

/// Marker-mode bookkeeping is cleared when it holds more windows than this (markers never
/// hit: the stream changed).
const MAX_WINDOWS: usize = 4096;

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
    predictor: Option<Mutex<Box<dyn Prefetcher>>>,
    mode: PrefetchInstall,
    queue: Mutex<VecDeque<Req>>,
    queue_cv: Condvar,
    /// One prefetch connection per donor, in the order of `Far::donors`.
    clients: Vec<DonorClient>,
    inner: Mutex<Inner>,
    trace: Mutex<Option<TraceWriter<File>>>,
    trace_path: Option<PathBuf>,
    epoch: Instant,
}

fn page_of(addr: usize) -> u64 {
    (addr / PAGE_SIZE) as u64
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
                let c =
                    DonorClient::connect(&addr, ccfg).map_err(|source| RuntimeError::Donor {
                        addr: addr.clone(),
                        step: "connecting (prefetch)",
                        source,
                    })?;
                clients.push(c);
            }
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

    fn now_ns(&self) -> u64 {
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

    /// Wakes the prefetch thread (shutdown).
    pub(crate) fn wake(&self) {
        self.queue_cv.notify_all();
    }
}

/// A fault on `addr` served from the write-back pool, with the state lock held, before the
/// page is inserted into the eviction policy: inserts it (as a prefetch hit or a demand page),
/// feeds the prefetcher and queues its predictions.
pub(crate) fn on_pool_fault(sh: &Shared, st: &mut State, addr: usize, thread: u32) {
    let pf = &sh.pf;
    let page = page_of(addr);
    let now = pf.now_ns();
    // A pool page that was not prefetched is a local cache hit (an evicted page not yet
    // reclaimed): it would not have gone to a donor without prefetching either, so it is
    // neither a prefetch hit nor a demand fault in the measures.
    let hit = pf.inner.lock().measures.prefetch_hit(page, now);
    if hit {
        st.policy.insert(page, Origin::Prefetch);
        st.policy.touched(page);
    } else {
        st.policy.insert(page, Origin::Demand);
    }
    feed(sh, st, addr, thread, hit, now);
}

/// A fault on `addr` whose remote read was just submitted (state lock not held): counts it,
/// feeds the prefetcher and queues its predictions.
pub(crate) fn on_remote_fault(sh: &Shared, addr: usize, thread: u32) {
    let pf = &sh.pf;
    let page = page_of(addr);
    let now = pf.now_ns();
    let mut st = sh.state.lock();
    let hit = {
        let mut i = pf.inner.lock();
        let waited = match i.in_flight.get_mut(&addr) {
            Some(f) if !f.consumed => {
                f.consumed = true;
                i.live -= 1;
                true
            }
            _ => false,
        };
        if waited {
            i.hits_waited += 1;
            i.measures.prefetched(page, now);
            i.measures.prefetch_hit(page, now);
        } else {
            // An unused prefetched page reaching here was evicted: pollution.
            i.measures.evicted(page);
            i.measures.demand_fault();
        }
        waited
    };
    feed(sh, &mut st, addr, thread, hit, now);
}

/// A fault on `addr` (far page `far`, just marked `Fetching`), with the state lock held: if
/// the page's prefetch is in flight, the fault waits for it instead of sending a demand read
/// of its own (the batch is on its way; a new read would only queue behind it on a loaded
/// link, and a sequential scan that outruns its prefetches would send one read per page).
/// Counts a waited hit, feeds the prefetcher and returns true; false when nothing is in
/// flight for it.
pub(crate) fn wait_for_prefetch(
    sh: &Shared,
    st: &mut State,
    addr: usize,
    far: u64,
    thread: u32,
    t0: Instant,
) -> bool {
    let pf = &sh.pf;
    let now = pf.now_ns();
    {
        let mut i = pf.inner.lock();
        match i.in_flight.get_mut(&addr) {
            Some(f) if !f.consumed && f.waiter.is_none() && f.far == far => f.waiter = Some(t0),
            _ => return false,
        }
        i.hits_waited += 1;
        i.measures.prefetched(page_of(addr), now);
        i.measures.prefetch_hit(page_of(addr), now);
    }
    feed(sh, st, addr, thread, true, now);
    true
}

/// A prefetched page a fault waits for arrived (`data`) or could not be fetched (`None`):
/// installs it and wakes the fault, or hands the page back to the demand path (state
/// `Remote`, fault woken: it faults again and sends its own read). State lock held.
fn arrive_awaited(
    sh: &Shared,
    st: &mut parking_lot::MutexGuard<'_, State>,
    addr: usize,
    far: u64,
    t0: Instant,
    data: Option<&[u8]>,
) {
    let ours = |st: &State| {
        st.table
            .get(addr)
            .is_some_and(|e| e.state == PageState::Fetching && e.far == far)
    };
    if !ours(st) {
        // Released or remapped meanwhile: the fault is retried on what the page is now.
        let _ = sh.uffd.wake(addr, PAGE_SIZE);
        return;
    }
    if let Some(d) = data.filter(|_| !st.paused) {
        sh.make_room(st);
        if ours(st) {
            // Write-protected and clean: it equals its donor copy; a write faults once more
            // and marks it dirty.
            match sh.uffd.copy(addr, d, false, true) {
                Ok(()) | Err(UffdError::Exists { .. }) => {
                    let m = st.table.get_mut(addr).expect("checked above");
                    m.state = PageState::ResidentClean;
                    st.resident += 1;
                    st.policy.insert(page_of(addr), Origin::Prefetch);
                    st.policy.touched(page_of(addr));
                    sh.update_peak(st);
                    sh.kick_evictor(st);
                    sh.stats
                        .lock()
                        .fault(FaultKind::Remote, t0.elapsed().as_micros() as u64);
                    return;
                }
                Err(e) => tracing::debug!("installing awaited prefetched page {addr:#x}: {e}"),
            }
        }
    }
    if let Some(m) = st.table.get_mut(addr) {
        if m.state == PageState::Fetching && m.far == far {
            m.state = PageState::Remote;
        }
    }
    let _ = sh.uffd.wake(addr, PAGE_SIZE);
}

/// Feeds one access to the prefetcher and queues the pages worth fetching.
fn feed(sh: &Shared, st: &mut State, addr: usize, thread: u32, hit: bool, now: u64) {
    let pf = &sh.pf;
    let Some(pred) = &pf.predictor else {
        return;
    };
    let page = page_of(addr);
    if pf.mode == PrefetchInstall::Marker && hit {
        infer_hits(sh, st, addr, thread, now);
    }
    let mut out = Vec::new();
    pred.lock().on_access(
        &Access {
            page,
            thread,
            time_ns: now,
            prefetch_hit: hit,
        },
        &mut out,
    );
    if out.is_empty() || st.paused {
        return;
    }
    let mut reqs = Vec::new();
    let window = usize::try_from(out[0])
        .ok()
        .and_then(|p| p.checked_mul(PAGE_SIZE))
        .unwrap_or(usize::MAX);
    {
        let mut i = pf.inner.lock();
        for p in &out {
            if i.live >= MAX_IN_FLIGHT || i.in_flight.len() >= MAX_TRACKED {
                break;
            }
            let Some(a) = usize::try_from(*p)
                .ok()
                .and_then(|p| p.checked_mul(PAGE_SIZE))
            else {
                continue;
            };
            if a == addr {
                continue;
            }
            let Some(e) = st.table.get(a) else { continue };
            if e.state != PageState::Remote || e.far == NO_FAR || i.in_flight.contains_key(&a) {
                continue;
            }
            i.live += 1;
            i.in_flight.insert(
                a,
                InFlight {
                    far: e.far,
                    consumed: false,
                    waiter: None,
                },
            );
            reqs.push(Req {
                addr: a,
                far: e.far,
                thread,
                window,
            });
        }
    }
    if !reqs.is_empty() {
        pf.queue.lock().extend(reqs);
        pf.queue_cv.notify_one();
    }
}

/// Marker mode: the marker of a window of `thread`'s stream was hit, so the stream went
/// through the window it was in before: report that window's eagerly installed pages still
/// resident as hits, then remember the new window.
fn infer_hits(sh: &Shared, st: &mut State, addr: usize, thread: u32, now: u64) {
    let pf = &sh.pf;
    let pages = {
        let mut i = pf.inner.lock();
        if i.markers.remove(&addr).is_none() {
            return;
        }
        let prev = i.last_marker.insert(thread, addr);
        prev.and_then(|m| i.windows.remove(&m)).unwrap_or_default()
    };
    let Some(pred) = &pf.predictor else { return };
    let mut sink = Vec::new();
    for a in pages {
        let resident = st.table.get(a).is_some_and(|e| {
            matches!(
                e.state,
                PageState::ResidentClean | PageState::ResidentDirty | PageState::ResidentSending
            )
        });
        if !resident {
            continue;
        }
        let p = page_of(a);
        let counted = {
            let mut i = pf.inner.lock();
            let c = i.measures.prefetch_hit(p, now);
            if c {
                i.inferred_hits += 1;
            }
            c
        };
        if !counted {
            continue;
        }
        st.policy.touched(p);
        pred.lock().on_access(
            &Access {
                page: p,
                thread,
                time_ns: now,
                prefetch_hit: true,
            },
            &mut sink,
        );
    }
}

/// The prefetch thread. Runs until shutdown.
pub(crate) fn prefetch_loop(sh: Arc<Shared>) {
    if let Some(h) = &sh.thread_hook {
        h();
    }
    let pf = &sh.pf;
    let mut reqs: Vec<Req> = Vec::new();
    while !sh.shutdown.load(Ordering::Relaxed) {
        {
            let mut q = pf.queue.lock();
            if q.is_empty() {
                pf.queue_cv.wait_for(&mut q, Duration::from_millis(50));
            }
            reqs.extend(q.drain(..));
        }
        // Pages a demand fault already brought in (counted as waited hits) are not fetched:
        // a prefetch thread that fell behind catches up instead of fetching stale pages.
        {
            let mut i = pf.inner.lock();
            let before = reqs.len();
            reqs.retain(|r| {
                let consumed = i.in_flight.get(&r.addr).is_some_and(|f| f.consumed);
                if consumed {
                    i.in_flight.remove(&r.addr);
                }
                !consumed
            });
            i.dropped += (before - reqs.len()) as u64;
        }
        if reqs.is_empty() {
            continue;
        }
        // Group by donor; pages whose slab is unknown cannot be remote: drop them.
        let mut groups: Vec<Vec<(PageAddr, Req)>> =
            (0..pf.clients.len()).map(|_| Vec::new()).collect();
        let mut lost = Vec::new();
        for r in reqs.drain(..) {
            match sh.far.locate(r.far) {
                Some((d, a)) if d < groups.len() => groups[d].push((a, r)),
                _ => lost.push(r),
            }
        }
        let mut batches: Vec<(Vec<Req>, Result<Pending, String>)> = Vec::new();
        for (d, g) in groups.into_iter().enumerate() {
            let mut g = g.into_iter().peekable();
            while g.peek().is_some() {
                let chunk: Vec<(PageAddr, Req)> =
                    g.by_ref().take(farmem_transport::MAX_BATCH_PAGES).collect();
                let addrs: Vec<PageAddr> = chunk.iter().map(|(a, _)| *a).collect();
                let reqs: Vec<Req> = chunk.into_iter().map(|(_, r)| r).collect();
                let p = pf.clients[d].submit_read(&addrs).map_err(|e| e.to_string());
                batches.push((reqs, p));
            }
        }
        if !lost.is_empty() {
            arrive(&sh, lost, None);
        }
        for (reqs, p) in batches {
            let result = p.and_then(|p| p.wait().map_err(|e| e.to_string()));
            match result {
                Ok(Completion::Pages(data)) if data.len() == reqs.len() * PAGE_SIZE => {
                    sh.pf.inner.lock().batches += 1;
                    sh.stats.lock().s.bytes_received += data.len() as u64;
                    arrive(&sh, reqs, Some(&data));
                }
                other => {
                    let why = match other {
                        Err(e) => e,
                        Ok(_) => "the donor answered with the wrong amount of data".into(),
                    };
                    tracing::warn!("prefetching {} pages failed: {why}", reqs.len());
                    arrive(&sh, reqs, None);
                }
            }
        }
    }
}

/// Pages of one batch arrived (`data`, in request order) or failed (`None`): keep each if
/// still wanted.
fn arrive(sh: &Shared, reqs: Vec<Req>, data: Option<&[u8]>) {
    let pf = &sh.pf;
    let mut st = sh.state.lock();
    for (k, r) in reqs.into_iter().enumerate() {
        let flight = {
            let mut i = pf.inner.lock();
            let f = i.in_flight.remove(&r.addr);
            if f.as_ref().is_some_and(|f| !f.consumed) {
                i.live -= 1;
            }
            f
        };
        let page = data.map(|d| &d[k * PAGE_SIZE..(k + 1) * PAGE_SIZE]);
        if let Some(t0) = flight.as_ref().and_then(|f| f.waiter) {
            arrive_awaited(sh, &mut st, r.addr, r.far, t0, page);
            continue;
        }
        let Some(page_data) = page else {
            continue; // failed: nothing counted (never prefetched)
        };
        let wanted = match &flight {
            Some(f) => !f.consumed && f.far == r.far,
            None => false,
        };
        let current = st.table.get(r.addr);
        let still = current.is_some_and(|e| e.state == PageState::Remote && e.far == r.far);
        if !wanted || !still || st.paused {
            let mut i = pf.inner.lock();
            i.dropped += 1;
            if wanted {
                // Not consumed by a counted waited hit: a late (or released) prefetch.
                i.measures.late();
            }
            continue;
        }
        let now = pf.now_ns();
        let marker = r.addr == r.window;
        if pf.mode == PrefetchInstall::Marker && !marker && st.resident < sh.high_water {
            match sh.uffd.copy(r.addr, page_data, false, true) {
                Ok(()) => {
                    let m = st.table.get_mut(r.addr).expect("checked above");
                    m.state = PageState::ResidentClean;
                    st.resident += 1;
                    st.policy.insert(page_of(r.addr), Origin::Prefetch);
                    if st.resident >= sh.high_water {
                        sh.evict_cv.notify_one();
                    }
                    let mut i = pf.inner.lock();
                    i.measures.prefetched(page_of(r.addr), now);
                    if i.windows.len() > MAX_WINDOWS {
                        i.windows.clear();
                    }
                    i.windows.entry(r.window).or_default().push(r.addr);
                    continue;
                }
                Err(UffdError::Exists { .. }) => {
                    // Present although the table says remote: never overwrite it.
                    pf.inner.lock().dropped += 1;
                    continue;
                }
                Err(_) => {} // pending events (EAGAIN) or the mapping changed: use the pool
            }
        }
        let Some(slot) = crate::engine::take_slot(sh, &mut st) else {
            pf.inner.lock().dropped += 1;
            continue;
        };
        match sh
            .pool_uffd
            .copy(sh.slot_addr(slot), page_data, false, false)
        {
            Ok(()) => {
                st.slot_owner[slot as usize] = r.addr;
                st.pool_cached.push_back(slot);
                let m = st.table.get_mut(r.addr).expect("checked above");
                m.state = PageState::PoolSent;
                m.slot = slot;
                let mut i = pf.inner.lock();
                i.measures.prefetched(page_of(r.addr), now);
                if pf.mode == PrefetchInstall::Marker && marker {
                    if i.markers.len() > MAX_WINDOWS {
                        i.markers.clear();
                    }
                    i.markers.insert(r.addr, r.thread);
                }
            }
            Err(e) => {
                tracing::debug!("copying a prefetched page into the pool: {e}");
                st.pool_free.push(slot);
                pf.inner.lock().dropped += 1;
            }
        }
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
