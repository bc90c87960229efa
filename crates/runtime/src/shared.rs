//! The runtime's shared core: the state behind the state mutex ([`State`]: page states, pool
//! slots, far pages, the staging queue) and everything the runtime threads share
//! ([`Shared`]: userfaultfds, the pool, condition variables, donors, counters, prefetching).
//! Built by [`Shared::start`]; used by the fault loop, the evictor, the sender, the prefetch
//! thread and fork handling, which sit above it.
//!
//! Lock order: the state mutex, then the prefetcher's `inner` mutex, then the stats mutex.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::sync::{Condvar, Mutex, MutexGuard};
use farmem_mm::{Advice, Mapping};
use farmem_uffd::{Features, Uffd, UffdError};

use crate::budget::Budget;
use crate::config::RuntimeConfig;
use crate::doorbell::Doorbell;
use crate::error::RuntimeError;
use crate::failure::{Failure, ThreadError};
use crate::far::Far;
use crate::pages::{Pages, Released};
use crate::prefetch::Prefetch;
use crate::slabs::farpages::FarPages;
use crate::slabs::memslabs::MemSlabs;
use crate::slots::{PoolMemory, Slots};
use crate::stats::{FaultKind, StatsCell};
use farmem_contract::local::LocalMemory;
use farmem_contract::OverBudget;
use farmem_proto::PAGE_SIZE;

/// A page copied out of the pool, waiting to be sent.
pub(crate) struct Staged {
    /// The page's address when staged (for an ack after it moved back: `ResidentSending`).
    pub(crate) addr: usize,
    pub(crate) slot: u32,
    pub(crate) gen: u32,
    pub(crate) far: u64,
    pub(crate) data: Box<[u8]>,
    /// `data` is sealed already: a send that failed is retried with the same sealed bytes.
    pub(crate) sealed: bool,
}

/// Everything behind the state mutex.
pub(crate) struct State {
    pub(crate) pages: Pages,
    pub(crate) slots: Slots,
    pub(crate) far_pages: FarPages,
    /// Far slabs held in memory: the host tier, local slabs.
    pub(crate) mem: MemSlabs,
    pub(crate) stage_gen: u32,
    /// Eviction is paused (fork in progress).
    pub(crate) paused: bool,
    /// Forks being prepared now ([`crate::fork`]): eviction resumes when the last is done.
    pub(crate) forks: u32,
    /// Lendable slabs are marked to be inherited (a fork lending them is being prepared).
    pub(crate) dofork: bool,
    /// The hold of the forks that left pages on donors ([`crate::forkhold`]): their far pages
    /// stay frozen while it lives.
    pub(crate) fork_hold: Option<crate::forkhold::ForkHold>,
    pub(crate) staging: VecDeque<Staged>,
    /// Parts of regions marked `MADV_DONTFORK` or `MADV_WIPEONFORK`: not brought back before
    /// fork, never lent.
    pub(crate) forkmarks: crate::forkmarks::ForkMarks,
    /// Victims being dropped as shared with a forked process ([`crate::threads::cow`]).
    pub(crate) drops: crate::drops::Drops,
    /// Whether pages installed ahead from the host tier go in writable ([`crate::fault`]).
    pub(crate) ahead_writes: farmem_policy::ahead_writes::AheadWrites,
    /// Which chunks of dirty pages the program keeps writing (the evictor keeps them).
    pub(crate) write_heat: farmem_policy::write_heat::WriteHeat,
}

impl State {
    /// Gives back what a released page held: its pool slot (discarded later) and far page.
    pub(crate) fn settle_released(&mut self, pf: &Prefetch, addr: usize, r: Released) {
        if let Some(slot) = r.slot {
            self.slots.release_stale(slot);
            pf.left(addr);
        }
        if let Some(far) = r.far {
            // Freed far pages are handed out again: a prefetch of this one in flight must
            // not be taken for the page's next contents there.
            pf.released(addr);
            self.far_pages.free(far);
        }
    }
}

/// Pool slots kept with a host tier: two evictor rounds (victims in flight, and pages waiting
/// while a new far slab is placed); the rest of the pool's share of local memory goes to the
/// budget. At 1024 slots an `xz -6 | md5sum` pipeline at 24 MiB took 67-70 s against 45-47 s,
/// its 3 MiB more of budget at the edge of its working set; every `compare` workload at 0.5
/// and 0.25 of peak was as fast or faster at 256, in two interleaved pairs.
const TIER_POOL_SLOTS: u32 = 2 * crate::budget::EVICT_BATCH as u32;

/// The runtime's shared core.
pub(crate) struct Shared {
    pub(crate) uffd: Uffd,
    pub(crate) pool_uffd: Uffd,
    pub(crate) pool: PoolMemory,
    pub(crate) state: Arc<Mutex<State>>,
    /// The evictor waits here for work.
    pub(crate) evict_cv: Condvar,
    /// Signalled when an eviction round commits.
    pub(crate) commit_cv: Condvar,
    /// The sender waits here for staged pages.
    pub(crate) stage_cv: Condvar,
    /// Signalled when the sender acknowledged pages (pool slots became reclaimable).
    pub(crate) slots_cv: Condvar,
    pub(crate) far: Arc<Far>,
    pub(crate) stats: Mutex<StatsCell>,
    pub(crate) shutdown: AtomicBool,
    /// Set in a forked child: no runtime threads exist there, never touch the uffd.
    pub(crate) in_child: AtomicBool,
    /// Resident-page limit and the evictor's watermarks ([`Budget`]); it can change while
    /// the runtime runs ([`crate::Runtime::set_budget_pages`]).
    pub(crate) budget: Budget,
    pub(crate) fetch_attempts: u32,
    /// How long a failed fetch waits for a stalled donor holding a copy
    /// ([`crate::fault`]'s `complete_fetch`).
    pub(crate) stall_patience: Duration,
    /// Limit for each donor request (a read waits this long on its last copy).
    pub(crate) request_timeout: Duration,
    /// Most bytes a second re-replication copies ([`crate::threads::heal`]).
    pub(crate) heal_rate_bytes: u64,
    pub(crate) thread_hook: Option<Arc<dyn Fn() + Send + Sync>>,
    pub(crate) zero: Box<[u8]>,
    /// Reads of userfaultfd events the fault thread has begun (one more before each read
    /// system call) and, of those, the last whose events it has handled: see
    /// [`Shared::wait_events_handled`].
    pub(crate) read_seq: AtomicU64,
    pub(crate) handled_seq: AtomicU64,
    /// Held by the fault thread around each read of events, and by another thread around
    /// each install into a region ([`Shared::install_gated`]).
    pub(crate) read_gate: Mutex<()>,
    /// The fault thread has read a REMOVE event it has not handled yet (set under the read
    /// gate).
    pub(crate) removes_unhandled: AtomicBool,
    /// Write-back is failing (the sender is retrying with back-off): the evictor cannot free
    /// pool slots. With [`OverBudget::Allow`] faults then do not wait for it; with
    /// [`OverBudget::Fail`] they wait (backpressure) until `failing_since` is older than the
    /// wait, and the process is then ended ([`Shared::far_memory_ran_out`]).
    pub(crate) send_failing: AtomicBool,
    /// When write-back started failing (None while it works).
    pub(crate) failing_since: Mutex<Option<Instant>>,
    pub(crate) over_budget: OverBudget,
    /// The evictor cannot make progress right now (three rounds in a row moved no victim:
    /// pages in ranges made read-only, or shared and not droppable): faults must not wait for
    /// it (the budget is exceeded meanwhile).
    pub(crate) evictor_blocked: AtomicBool,
    /// The evictor is dropping pages shared with a forked process ([`crate::threads::cow`]): each
    /// drop waits for the fault thread to read an event, so that thread must not wait for it.
    pub(crate) dropping: AtomicBool,
    /// Prefetching and the access trace ([`crate::prefetch`]).
    pub(crate) pf: Prefetch,
    /// Rung at shutdown: wakes the threads that wait on file descriptors and channels.
    pub(crate) doorbell: Doorbell,
}

fn required_features() -> Features {
    Features::PAGEFAULT_FLAG_WP
        | Features::EVENT_REMOVE
        | Features::EVENT_UNMAP
        | Features::EVENT_REMAP
        | Features::MOVE
}

/// Opens the region and pool userfaultfds and maps and registers the pool.
fn open_uffds(cfg: &RuntimeConfig) -> Result<(Uffd, Uffd, PoolMemory), RuntimeError> {
    let uffd = Uffd::open(required_features(), Features::THREAD_ID | Features::POISON).map_err(
        |source| RuntimeError::Uffd {
            step: "opening the region userfaultfd",
            source,
        },
    )?;
    // The pool's userfaultfd has no events (freeing pool pages never blocks) and SIGBUS
    // instead of fault messages: a runtime bug touching an empty slot crashes loudly.
    let pool_uffd =
        Uffd::open(Features::MOVE | Features::SIGBUS, Features::empty()).map_err(|source| {
            RuntimeError::Uffd {
                step: "opening the pool userfaultfd",
                source,
            }
        })?;
    let pool_bytes = cfg
        .pool_bytes
        .unwrap_or_else(|| LocalMemory::default_pool_bytes(cfg.budget_bytes));
    let pool_slots = (pool_bytes / PAGE_SIZE as u64).max(16) as u32;
    // One page more: the trash page (see PoolMemory).
    let pool_len = (pool_slots as usize + 1) * PAGE_SIZE;
    let pool = Mapping::anonymous(pool_len).map_err(|source| RuntimeError::Mmap {
        op: "mapping the write-back pool",
        len_bytes: pool_len,
        source,
    })?;
    pool.advise(Advice::NoHugePage);
    // A forked child never needs the pool (it has no runtime), and a pool page shared
    // copy-on-write with a child could not be MOVEd back (EBUSY) until written: a fork that
    // runs no fork handlers (raw clone) or another runtime's fork would leave such pages
    // behind. Not inherited, the pool's pages stay exclusive to this process.
    pool.advise(Advice::DontFork);
    crate::mm::register_pool(&pool_uffd, &pool).map_err(|source| RuntimeError::Uffd {
        step: "registering the write-back pool",
        source,
    })?;
    Ok((uffd, pool_uffd, PoolMemory::new(pool)))
}

impl Shared {
    /// Waits until the fault thread has handled every userfaultfd event read before this
    /// call — e.g. the UNMAP of a munmap, or the REMOVE of a madvise, that has returned (the
    /// kernel returns from those only once the event is read) — at most `limit`, and not past
    /// shutdown. Returns whether they are handled. An idle fault thread (asleep in `poll`)
    /// has handled everything it read, so this returns at once: counting loop iterations
    /// instead made a caller wait for the thread's next wake-up, up to its 1 s idle wait.
    pub(crate) fn wait_events_handled(&self, limit: Duration) -> bool {
        let want = self.read_seq.load(Ordering::SeqCst);
        // No deadline for a limit too long to add (Duration::MAX).
        let deadline = Instant::now().checked_add(limit);
        while self.handled_seq.load(Ordering::Acquire) < want {
            if self.shutdown.load(Ordering::Relaxed)
                || deadline.is_some_and(|d| Instant::now() >= d)
            {
                return false;
            }
            std::thread::sleep(Duration::from_micros(100));
        }
        true
    }

    /// Runs `install` — one UFFDIO_COPY or MOVE into the region page `addr` by a thread other
    /// than the fault thread, with the state lock held — unless the fault thread has read a
    /// REMOVE event it has not handled yet: the kernel zaps a madvise's range once its event is
    /// read, so the page might be installed after the zap with the contents from before the
    /// release, and the program read them after its madvise returned (decision 0069). The
    /// fault thread cannot read meanwhile (the read gate). Refused, it answers EAGAIN, as
    /// the kernel does while an event is unread, and the caller takes its EAGAIN path.
    pub(crate) fn install_gated(
        &self,
        addr: usize,
        install: impl FnOnce() -> Result<(), UffdError>,
    ) -> Result<(), UffdError> {
        let _gate = self.read_gate.lock();
        if self.removes_unhandled.load(Ordering::Acquire) {
            return Err(UffdError::Again {
                op: "install while a release is unhandled",
                addr,
                done_bytes: 0,
            });
        }
        install()
    }

    /// Builds the shared core: userfaultfds, the pool, donor connections, the prefetcher.
    /// The caller has checked the configuration.
    pub(crate) fn start(cfg: &RuntimeConfig) -> Result<Arc<Shared>, RuntimeError> {
        let policy = farmem_policy::evict::by_name(&cfg.evict)
            .map_err(|e| RuntimeError::Config(e.to_string()))?;
        let (uffd, pool_uffd, mut pool) = open_uffds(cfg)?;
        let mut budget_pages = cfg.budget_bytes / PAGE_SIZE as u64;
        let far = Arc::new(Far::connect(cfg)?);
        if far.tier.is_some() {
            // With a host tier, a victim leaves the pool when its eviction commits (its copy is
            // in the tier: `evict::leave_pool`), so the pool only holds victims in flight and
            // pages waiting for a slab to be placed. Its share of local memory goes to
            // resident pages instead: numpy's matmul at 335 MiB local moved 1.2 GiB out with
            // 271 MiB resident and 64 MiB of mostly empty pool, 0.8 GiB with 355 MiB resident.
            let kept = pool.slots().min(TIER_POOL_SLOTS);
            budget_pages += u64::from(pool.slots() - kept);
            pool.keep(kept);
        }
        let pf = Prefetch::new(cfg, &far)?;
        let slots = Slots::new(pool.slots());
        Ok(Arc::new(Shared {
            uffd,
            pool_uffd,
            pool,
            state: Arc::new(Mutex::new(State {
                pages: Pages::new(policy),
                slots,
                far_pages: FarPages::above(cfg.far_floor),
                mem: MemSlabs::default(),
                stage_gen: 0,
                paused: false,
                forks: 0,
                dofork: false,
                fork_hold: None,
                staging: VecDeque::new(),
                forkmarks: Default::default(),
                drops: Default::default(),
                ahead_writes: Default::default(),
                write_heat: Default::default(),
            })),
            evict_cv: Condvar::new(),
            commit_cv: Condvar::new(),
            stage_cv: Condvar::new(),
            slots_cv: Condvar::new(),
            far,
            stats: Mutex::new(StatsCell::new()),
            shutdown: AtomicBool::new(false),
            in_child: AtomicBool::new(false),
            budget: Budget::new(budget_pages),
            fetch_attempts: cfg.fetch_attempts,
            stall_patience: cfg.stall_patience,
            request_timeout: cfg.request_timeout,
            heal_rate_bytes: cfg.heal_rate_bytes,
            thread_hook: cfg.thread_hook.clone(),
            zero: vec![0u8; PAGE_SIZE].into_boxed_slice(),
            read_seq: AtomicU64::new(0),
            handled_seq: AtomicU64::new(0),
            read_gate: Mutex::new(()),
            removes_unhandled: AtomicBool::new(false),
            send_failing: AtomicBool::new(false),
            failing_since: Mutex::new(None),
            over_budget: cfg.over_budget,
            evictor_blocked: AtomicBool::new(false),
            dropping: AtomicBool::new(false),
            pf,
            doorbell: Doorbell::new().map_err(RuntimeError::Doorbell)?,
        }))
    }

    pub(crate) fn slot_addr(&self, slot: u32) -> usize {
        self.pool.slot_addr(slot)
    }

    /// Called first by every runtime thread: runs the thread hook (the preload library marks
    /// the thread as farmem's), then initialises the thread-local state the thread would
    /// otherwise set up on first use and that registers a destructor. glibc registers it with
    /// `__cxa_thread_atexit_impl`, which takes the dynamic loader's lock: a program thread in
    /// `dlopen` holds that lock, and when it faulted on a region page while the fault thread
    /// parked for the first time, each waited for the other (seen: the kmeans benchmark hung
    /// with python in `handle_userfault` and `farmem-fault` in `__cxa_thread_atexit_impl`).
    pub(crate) fn thread_started(&self) {
        crate::signals::block_all();
        if let Some(h) = &self.thread_hook {
            h();
        }
        // crossbeam's per-thread context (the tier thread's reclaim channel).
        let (_tx, rx) = crossbeam_channel::unbounded::<()>();
        let _ = rx.recv_timeout(Duration::from_micros(50));
        // std's current-thread handle and tracing's per-thread dispatch state.
        let _ = std::thread::current();
        tracing::trace!("runtime thread {:?} started", std::thread::current().name());
    }

    /// Records an error a thread met: counted by its kind, logged loudly, kept as `last_error`.
    pub(crate) fn report(&self, err: ThreadError) {
        tracing::error!("{err}");
        self.count_error(err);
    }

    /// Counts an error and keeps it as `last_error`, without logging it (a repeat of one
    /// already logged).
    pub(crate) fn count_error(&self, err: ThreadError) {
        let mut s = self.stats.lock();
        match err.kind() {
            Failure::Fetch => s.s.fetch_errors += 1,
            Failure::Send => s.s.send_errors += 1,
        }
        s.s.last_error = Some(err.to_string());
    }

    /// Counts a served fault of `kind` that started at `t0`. Call without the state lock.
    pub(crate) fn count_fault(&self, kind: FaultKind, t0: Instant) {
        self.stats
            .lock()
            .fault(kind, t0.elapsed().as_micros() as u64);
    }

    /// Waits until no eviction is half-done (release events move or drop entries and must not
    /// race the evictor's commit).
    pub(crate) fn settle_evictions<'a>(
        &self,
        mut st: MutexGuard<'a, State>,
    ) -> MutexGuard<'a, State> {
        // Not for pages being dropped: each drop waits for the fault thread, which calls this.
        while st.pages.evicting() > st.drops.len() {
            self.commit_cv.wait_for(&mut st, Duration::from_millis(5));
        }
        st
    }

    /// Before a page is installed: if resident pages are at the budget, wake the evictor and
    /// wait for it (the headroom normally makes this rare). When write-back is failing (the
    /// evictor cannot free pool slots), [`OverBudget`] decides: `Allow` does not wait (the
    /// budget is exceeded and the error is in the stats), `Fail` waits for write-back to work
    /// again and ends the process once it has failed for longer than its wait. Not when the
    /// evictor cannot make progress (`evictor_blocked`). Not for the fault thread: see
    /// [`Shared::room_for_fault`].
    pub(crate) fn make_room(&self, st: &mut MutexGuard<'_, State>) {
        self.wait_for_room(st, false);
    }

    /// Waits as [`Shared::make_room`]; `fault_thread` stops waiting as soon as the evictor
    /// drops shared pages, which needs that thread.
    fn wait_for_room(&self, st: &mut MutexGuard<'_, State>, fault_thread: bool) {
        let deadline = Instant::now() + Duration::from_secs(2);
        while self.must_wait_for_room(st)
            && !(fault_thread && self.dropping.load(Ordering::Acquire))
        {
            match self.backpressure() {
                // Write-back works: the evictor makes room soon; a safety valve all the same.
                None if Instant::now() >= deadline => return,
                None => {}
                Some(failing) => {
                    if let OverBudget::Fail { wait } = self.over_budget {
                        if failing >= wait {
                            self.far_memory_ran_out(wait);
                        }
                    }
                }
            }
            self.evict_cv.notify_one();
            self.commit_cv.wait_for(st, Duration::from_millis(2));
        }
    }

    /// How long write-back has been failing, if it is and faults are to wait for it
    /// ([`OverBudget::Fail`]).
    fn backpressure(&self) -> Option<Duration> {
        if !self.budget_enforced() || !self.send_failing.load(Ordering::Relaxed) {
            return None;
        }
        Some(
            self.failing_since
                .lock()
                .map_or(Duration::ZERO, |t| t.elapsed()),
        )
    }

    fn must_wait_for_room(&self, st: &State) -> bool {
        st.pages.resident() >= self.budget.limit()
            && !st.paused
            && (!self.send_failing.load(Ordering::Relaxed) || self.budget_enforced())
            && !self.evictor_blocked.load(Ordering::Relaxed)
    }

    /// Whether failing write-back makes faults wait and, in the end, kills the process
    /// ([`OverBudget::Fail`]). Not once the node that was the only place for pages has ended
    /// (`farmem run` or the node was killed): nothing can ever take the pages again, and
    /// killing the program would lose what it holds; it keeps them, over its budget.
    fn budget_enforced(&self) -> bool {
        matches!(self.over_budget, OverBudget::Fail { .. })
            && !(self.far.donors.is_empty()
                && self
                    .far
                    .tier
                    .as_ref()
                    .is_some_and(crate::far::tier::Tier::is_gone))
    }

    /// Far memory ran out and stayed out for `wait` with the program at its budget: ends the
    /// process as a memory cgroup's OOM kill would, saying what ran out (the last write-back
    /// error) and what the user can do.
    fn far_memory_ran_out(&self, wait: Duration) -> ! {
        let last = self.stats.lock().s.last_error.clone();
        let msg = format!(
            "farmem: far memory ran out: write-back has failed for {} s with this process at \
             its budget ({} pages), so it is killed, as a memory limit's OOM kill would (the \
             last error: {}); start more donors or give them more --capacity, raise \
             --local-mem, or run with --over-budget allow to let it grow past its budget",
            wait.as_secs(),
            self.budget.limit(),
            last.as_deref().unwrap_or("none recorded")
        );
        tracing::error!("{msg}");
        // SIGKILL cannot be caught or blocked: the process ends here, as an OOM kill ends it.
        let _ = nix::sys::signal::kill(nix::unistd::getpid(), nix::sys::signal::Signal::SIGKILL);
        unreachable!("SIGKILL to this process returned")
    }

    /// [`Shared::make_room`] for the fault thread. While the evictor drops shared pages it
    /// waits for this thread to read their events, so the fault cannot wait here: returns
    /// false when there is no room yet, and the caller puts the fault back in its queue.
    pub(crate) fn room_for_fault(&self, st: &mut MutexGuard<'_, State>) -> bool {
        self.wait_for_room(st, true);
        if self.dropping.load(Ordering::Acquire) && self.must_wait_for_room(st) {
            self.evict_cv.notify_one();
            return false;
        }
        true
    }

    /// After a page was installed: wakes the evictor once resident pages reach the high
    /// watermark.
    pub(crate) fn kick_evictor(&self, st: &State) {
        if st.pages.resident() >= self.budget.high_water() {
            self.evict_cv.notify_one();
        }
    }
}
