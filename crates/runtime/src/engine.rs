//! The paging engine: shared state and the three runtime threads (fault loop, evictor,
//! sender).
//!
//! # Design
//!
//! - **Fault loop** (`farmem-fault`, one thread): the only reader of the region userfaultfd.
//!   It reads messages in batches and handles them in order: release events (REMOVE, UNMAP,
//!   REMAP) update the page table at once (never calling madvise itself: the program thread
//!   that raised the event is blocked until it is read); a fault is answered by the cheapest
//!   source: a zero page for never-written pages, a MOVE back from the write-back pool, or a
//!   read from the donor issued by this thread, which waits for it directly (the only other
//!   thread involved is the transport's socket reader). Remote reads of one batch are all
//!   submitted before the first is waited for, so concurrent faults overlap on the wire.
//!   Several messages for one page (threads faulting together) are served once: the first
//!   install wakes every waiter, later messages find the page resident and only wake.
//! - **Evictor** (`farmem-evict`): keeps resident pages at or below the low watermark (budget
//!   minus a headroom), so a fault finds room without waiting. Victims (from the eviction
//!   policy) are MOVEd into the write-back pool, a mapping registered with a second, event-free
//!   userfaultfd (MOVE needs its destination registered with the userfaultfd it is issued on;
//!   without events, freeing a pool page with MADV_DONTNEED never blocks). Clean pages become
//!   reclaimable at once; all-zero pages are dropped and forgotten; dirty pages are copied to
//!   a staging queue. A page written during eviction is never lost: MOVE is atomic with respect
//!   to the page table, so the write lands either before (and moves with the page) or after
//!   (and faults the page back from the pool).
//! - **Sender** (`farmem-send`): drains the staging queue in batches of up to 256 pages per
//!   donor, places slabs on first write, and marks acknowledged pages `PoolSent`: reclaimable
//!   cache that the evictor frees (oldest first) when it needs pool slots.
//! - **Dirty tracking**: synchronous userfaultfd write-protect. A page installed from an
//!   up-to-date donor copy by a read fault is installed write-protected (`ResidentClean`); its
//!   first write raises a WP fault that marks it dirty and unprotects it. Write faults install
//!   writable pages directly. Asynchronous WP with PAGEMAP_SCAN was not used: MOVE re-creates
//!   the page table entry without the uffd-wp bit, so the written/clean answer has to be read
//!   before the MOVE, and a write between the scan and the MOVE would be lost; the synchronous
//!   fault closes that window (the writer waits, is woken with UFFDIO_WAKE once the page is in
//!   the pool, and faults it back).
//! - **Failure**: a page that cannot be fetched (donor dead or stalled past the transport's
//!   request timeout, after `fetch_attempts` tries) is logged as an error, counted, and
//!   answered with UFFDIO_POISON: the faulting thread gets SIGBUS rather than hanging or
//!   reading wrong data. Send failures are retried with back-off while the pages stay in the
//!   pool (the program keeps running; the pool fills and resident memory may exceed the
//!   budget); the error is logged and kept in [`crate::Stats::last_error`].
//!
//! Lock order: the state mutex, then the stats mutex. The runtime threads never touch region
//! memory; they read pool pages and their own buffers only.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use farmem_policy::evict::EvictionPolicy;
use farmem_policy::Origin;
use farmem_transport::{Completion, PageWrite, Pending};
use farmem_uffd::{Event, Uffd, UffdError};
use parking_lot::{Condvar, Mutex};

use crate::far::Far;
use crate::stats::{FaultKind, StatsCell};
use crate::table::{Entry, PageState, Table, NO_FAR};
use crate::{RuntimeError, PAGE_SIZE};

/// No page owns this pool slot.
const NO_OWNER: usize = 0;
/// Victims picked per evictor round.
const EVICT_BATCH: usize = 32;

/// A page copied out of the pool, waiting to be sent.
pub(crate) struct Staged {
    /// The page's address when staged (for an ack after it moved back: `ResidentSending`).
    addr: usize,
    slot: u32,
    gen: u32,
    far: u64,
    data: Box<[u8]>,
}

/// Everything behind the state mutex.
pub(crate) struct State {
    pub(crate) table: Table,
    pub(crate) policy: Box<dyn EvictionPolicy>,
    pub(crate) resident: u64,
    /// Entries in the `Evicting` state right now.
    pub(crate) evicting: u64,
    /// Address of the page each pool slot holds.
    pub(crate) slot_owner: Vec<usize>,
    /// Free slots whose memory is already discarded.
    pub(crate) pool_free: Vec<u32>,
    /// Free slots that still hold a page: discarded all at once when a slot is needed
    /// ([`take_slot`]; one TLB flush for all, see `pool.rs`).
    pub(crate) pool_stale: Vec<u32>,
    /// Slots holding reclaimable pages (sent or clean), oldest first; may hold stale slots.
    pub(crate) pool_cached: VecDeque<u32>,
    pub(crate) far_free: Vec<u64>,
    pub(crate) far_next: u64,
    pub(crate) stage_gen: u32,
    /// Eviction is paused (fork in progress).
    pub(crate) paused: bool,
    pub(crate) staging: VecDeque<Staged>,
}

/// The runtime's shared core.
pub(crate) struct Shared {
    pub(crate) uffd: Uffd,
    pub(crate) pool_uffd: Uffd,
    pub(crate) pool_base: usize,
    pub(crate) pool_slots: u32,
    /// This process's pidfd, for batched discards of pool slots (process_madvise).
    pub(crate) self_pidfd: Option<std::os::fd::OwnedFd>,
    pub(crate) state: Mutex<State>,
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
    pub(crate) budget_pages: u64,
    /// The evictor brings resident pages down to this (budget minus a headroom)...
    pub(crate) low_water: u64,
    /// ...once they reach this (halfway between it and the budget), so it works in batches
    /// and the fault path rarely has to wake it.
    pub(crate) high_water: u64,
    pub(crate) fetch_attempts: u32,
    pub(crate) thread_hook: Option<Arc<dyn Fn() + Send + Sync>>,
    pub(crate) zero: Box<[u8]>,
    /// Fault-loop iterations completed (lets callers wait until events already read by the
    /// kernel's count — e.g. the UNMAP of a munmap that has returned — are processed).
    pub(crate) loop_seq: std::sync::atomic::AtomicU64,
    /// Write-back is failing (the sender is retrying with back-off): the evictor cannot free
    /// pool slots, so faults must not wait for it.
    pub(crate) send_failing: AtomicBool,
    /// The evictor cannot make progress right now (its last round moved no victim: pages
    /// shared with a forked child that could not be unshared) or is unsharing pages, which
    /// needs the fault thread: faults must not wait for it (the budget is exceeded meanwhile).
    pub(crate) evictor_blocked: AtomicBool,
    /// Prefetching and the access trace ([`crate::prefetch`]).
    pub(crate) pf: crate::prefetch::Prefetch,
}

fn pid_of(addr: usize) -> u64 {
    (addr / PAGE_SIZE) as u64
}

impl Shared {
    pub(crate) fn slot_addr(&self, slot: u32) -> usize {
        self.pool_base + slot as usize * PAGE_SIZE
    }

    /// Records an error: counted, logged loudly, kept as `last_error`.
    pub(crate) fn report(&self, msg: String, fetch: bool) {
        tracing::error!("{msg}");
        let mut s = self.stats.lock();
        if fetch {
            s.s.fetch_errors += 1;
        } else {
            s.s.send_errors += 1;
        }
        s.s.last_error = Some(msg);
    }

    /// Forgets everything stored for a page leaving the program (released, unmapped): frees
    /// its pool slot and far page, updates residency and the policy. The entry becomes empty.
    pub(crate) fn forget(&self, st: &mut State, addr: usize, e: &mut Entry) {
        match e.state {
            PageState::ResidentClean | PageState::ResidentDirty | PageState::ResidentSending => {
                st.resident -= 1;
                st.policy.remove(pid_of(addr));
            }
            PageState::Evicting => {
                // The evictor owns the transition; it sees the page gone when it commits.
                // Residency is settled there too.
                e.far = NO_FAR;
                return;
            }
            PageState::PoolSent | PageState::PoolUnsent => {
                st.slot_owner[e.slot as usize] = NO_OWNER;
                st.pool_stale.push(e.slot);
                self.pf.left(addr);
            }
            _ => {}
        }
        if e.far != NO_FAR {
            st.far_free.push(e.far);
        }
        *e = Entry::default();
    }

    /// Waits until no eviction is half-done (release events move or drop entries and must not
    /// race the evictor's commit).
    fn settle_evictions<'a>(
        &self,
        mut st: parking_lot::MutexGuard<'a, State>,
    ) -> parking_lot::MutexGuard<'a, State> {
        while st.evicting > 0 {
            self.commit_cv.wait_for(&mut st, Duration::from_millis(5));
        }
        st
    }

    pub(crate) fn update_peak(&self, st: &State) {
        let mut s = self.stats.lock();
        if st.resident > s.s.peak_resident_pages {
            s.s.peak_resident_pages = st.resident;
        }
    }

    /// Before a page is installed: if resident pages are at the budget, wake the evictor and
    /// wait for it (the headroom normally makes this rare). Not when write-back is failing
    /// (the evictor cannot free pool slots), where waiting would only stall the program: the
    /// budget is then exceeded and the error is in the stats. Nor when the evictor cannot
    /// make progress or is unsharing pages (`evictor_blocked`): unsharing needs this thread.
    pub(crate) fn make_room(&self, st: &mut parking_lot::MutexGuard<'_, State>) {
        let deadline = Instant::now() + Duration::from_secs(2);
        while st.resident >= self.budget_pages
            && !st.paused
            && !self.send_failing.load(Ordering::Relaxed)
            && !self.evictor_blocked.load(Ordering::Relaxed)
            && Instant::now() < deadline
        {
            self.evict_cv.notify_one();
            self.commit_cv.wait_for(st, Duration::from_millis(2));
        }
    }

    pub(crate) fn kick_evictor(&self, st: &State) {
        if st.resident >= self.high_water {
            self.evict_cv.notify_one();
        }
    }
}

/// A fault waiting to be served (again).
struct FaultMsg {
    addr: usize,
    write: bool,
    wp: bool,
    /// The faulting thread's id (for the prefetcher's per-thread streams).
    thread: u32,
    t0: Instant,
}

/// A remote read in flight.
struct Fetch {
    msg: FaultMsg,
    far: u64,
    pending: Option<Pending>,
    attempts: u32,
}

/// The fault loop. Runs until shutdown.
pub(crate) fn fault_loop(sh: Arc<Shared>) {
    if let Some(h) = &sh.thread_hook {
        h();
    }
    let mut events: Vec<Event> = Vec::with_capacity(64);
    let mut retry: VecDeque<FaultMsg> = VecDeque::new();
    let mut installs: VecDeque<(FaultMsg, Box<[u8]>)> = VecDeque::new();
    let mut fetches: Vec<Fetch> = Vec::new();
    let mut busy = false;
    while !sh.shutdown.load(Ordering::Relaxed) {
        events.clear();
        // Busy: look for the next events without sleeping first.
        if !(busy && spin_for_events(&sh, &mut events)) {
            let timeout = if retry.is_empty() && installs.is_empty() {
                100
            } else {
                1
            };
            if let Err(e) = sh.uffd.wait_readable(timeout) {
                sh.report(format!("fault loop: {e}"), true);
                std::thread::sleep(Duration::from_millis(10));
            }
            if let Err(e) = sh.uffd.read_events(&mut events) {
                sh.report(format!("fault loop: {e}"), true);
                continue;
            }
        }
        busy = !events.is_empty();
        for ev in events.drain(..) {
            match ev {
                Event::Pagefault {
                    addr,
                    write,
                    wp,
                    thread_id,
                } => {
                    let msg = FaultMsg {
                        addr: addr & !(PAGE_SIZE - 1),
                        write,
                        wp,
                        thread: thread_id,
                        t0: Instant::now(),
                    };
                    sh.pf.record(msg.addr, thread_id, write);
                    serve(&sh, msg, &mut retry, &mut fetches);
                }
                Event::Remove { start, end } | Event::Unmap { start, end } => {
                    release(&sh, start, end, matches!(ev, Event::Unmap { .. }));
                }
                Event::Remap { from, to, len } => remap(&sh, from, to, len),
                Event::Fork { .. } => {
                    // EVENT_FORK is never enabled; dropping the fd would be the answer.
                }
            }
        }
        // Pages fetched earlier whose install met pending events.
        for _ in 0..installs.len() {
            let (msg, data) = installs.pop_front().expect("counted");
            install_fetched(&sh, msg, data, &mut installs, &mut retry);
        }
        // Remote reads submitted in this batch: wait for each and install.
        for f in fetches.drain(..) {
            complete_fetch(&sh, f, &mut installs, &mut retry);
        }
        for _ in 0..retry.len() {
            let msg = retry.pop_front().expect("counted");
            serve(&sh, msg, &mut retry, &mut fetches);
        }
        for f in fetches.drain(..) {
            complete_fetch(&sh, f, &mut installs, &mut retry);
        }
        sh.loop_seq.fetch_add(1, Ordering::Release);
    }
}

/// How long the fault thread keeps polling for the next event after serving some, before it
/// sleeps in poll(2). A faulting program usually faults again within microseconds; a sleeping
/// fault thread costs a wake-up on every fault, which on a virtual machine with idle vCPUs
/// (halted, woken by an IPI through the hypervisor) is tens of microseconds.
const SPIN: Duration = Duration::from_micros(50);

/// Reads events without sleeping for up to [`SPIN`]; true when some arrived.
fn spin_for_events(sh: &Shared, events: &mut Vec<Event>) -> bool {
    let start = Instant::now();
    while start.elapsed() < SPIN {
        match sh.uffd.read_events(events) {
            Ok(n) if n > 0 => return true,
            Ok(_) => std::hint::spin_loop(),
            Err(_) => return false, // reported by the blocking path
        }
    }
    false
}

/// Serves one fault message from local state, or starts its remote read.
fn serve(sh: &Shared, msg: FaultMsg, retry: &mut VecDeque<FaultMsg>, fetches: &mut Vec<Fetch>) {
    let mut st = sh.state.lock();
    let Some(mut e) = st.table.get(msg.addr) else {
        // Not a region we know (being dropped, or a race with munmap): zero it so the thread
        // does not wait forever.
        drop(st);
        match sh.uffd.zeropage(msg.addr, PAGE_SIZE, false) {
            Ok(()) => {}
            Err(UffdError::Again { .. }) => retry.push_back(msg),
            Err(_) => {
                let _ = sh.uffd.wake(msg.addr, PAGE_SIZE);
            }
        }
        return;
    };
    while e.state == PageState::Evicting {
        sh.commit_cv.wait_for(&mut st, Duration::from_millis(1));
        e = st.table.get(msg.addr).unwrap_or_default();
    }
    if msg.wp {
        match e.state {
            PageState::ResidentClean | PageState::ResidentDirty | PageState::ResidentSending => {
                match sh.uffd.writeprotect(msg.addr, PAGE_SIZE, false, false) {
                    Ok(()) => {
                        if let Some(m) = st.table.get_mut(msg.addr) {
                            m.state = PageState::ResidentDirty;
                        }
                        st.policy.touched(pid_of(msg.addr));
                        drop(st);
                        sh.stats
                            .lock()
                            .fault(FaultKind::WriteProtect, msg.t0.elapsed().as_micros() as u64);
                    }
                    Err(UffdError::Again { .. }) => retry.push_back(msg),
                    Err(err) => {
                        drop(st);
                        sh.report(
                            format!("write-protect fault at {:#x}: {err}", msg.addr),
                            true,
                        );
                        let _ = sh.uffd.wake(msg.addr, PAGE_SIZE);
                    }
                }
            }
            _ => {
                // The page left since the fault was raised: wake the writer, it faults again
                // on the missing page.
                drop(st);
                let _ = sh.uffd.wake(msg.addr, PAGE_SIZE);
            }
        }
        return;
    }
    if matches!(
        e.state,
        PageState::Empty | PageState::PoolSent | PageState::PoolUnsent
    ) {
        sh.make_room(&mut st);
        match st.table.get(msg.addr) {
            Some(now) if now == e => {}
            _ => {
                // Changed while waiting (released, or brought in): look again.
                drop(st);
                retry.push_back(msg);
                return;
            }
        }
    }
    match e.state {
        PageState::Empty => {
            let r = if msg.write {
                sh.uffd.copy(msg.addr, &sh.zero, false, false)
            } else {
                sh.uffd.zeropage(msg.addr, PAGE_SIZE, false)
            };
            match r {
                Ok(()) | Err(UffdError::Exists { .. }) => {
                    let m = st.table.get_mut(msg.addr).expect("found above");
                    m.state = PageState::ResidentDirty;
                    st.resident += 1;
                    st.policy.insert(pid_of(msg.addr), Origin::Demand);
                    sh.update_peak(&st);
                    sh.kick_evictor(&st);
                    drop(st);
                    sh.stats
                        .lock()
                        .fault(FaultKind::Zero, msg.t0.elapsed().as_micros() as u64);
                }
                Err(UffdError::Again { .. }) => retry.push_back(msg),
                Err(err) => {
                    drop(st);
                    tracing::debug!("zero fault at {:#x}: {err}", msg.addr);
                    let _ = sh.uffd.wake(msg.addr, PAGE_SIZE);
                }
            }
        }
        PageState::ResidentClean
        | PageState::ResidentDirty
        | PageState::ResidentSending
        | PageState::Fetching => {
            // Served already (another thread's fault on the same page), or being fetched:
            // the install wakes every waiter.
            if e.state != PageState::Fetching {
                drop(st);
                let _ = sh.uffd.wake(msg.addr, PAGE_SIZE);
            }
            sh.stats.lock().s.faults_already_served += 1;
        }
        PageState::PoolSent | PageState::PoolUnsent => {
            let src = sh.slot_addr(e.slot);
            // Read faults keep tracking writes: a sent page comes back clean, an unsent one
            // as "sending" (clean once its send is acked). Such a page is installed
            // write-protected by COPY|WP, atomically: MOVE then WRITEPROTECT would map it
            // writable for a moment (another thread's write there would be lost), and the
            // kernel rejects WRITEPROTECT with WP|DONTWAKE (EINVAL), which left every pool
            // hit dirty. Other faults take the page back with MOVE (no copy).
            let protect = !msg.write && (e.state == PageState::PoolUnsent || e.far != NO_FAR);
            let r = if protect {
                // SAFETY: `src` is a populated pool slot the runtime owns holding this page;
                // nothing writes it while the state lock is held; the kernel only reads it.
                let data = unsafe { std::slice::from_raw_parts(src as *const u8, PAGE_SIZE) };
                sh.uffd
                    .copy(msg.addr, data, false, true)
                    .map(|()| PAGE_SIZE)
            } else {
                // SAFETY: `src` is a pool slot the runtime owns holding this page; nothing
                // references it; MOVE hands the page to the region without copying.
                unsafe { sh.uffd.move_pages(msg.addr, src, PAGE_SIZE, true, false) }
            };
            match r {
                Ok(_) => {
                    if !protect {
                        // MOVE was issued with DONTWAKE; COPY woke the waiters itself.
                        let _ = sh.uffd.wake(msg.addr, PAGE_SIZE);
                    }
                    st.slot_owner[e.slot as usize] = NO_OWNER;
                    if protect {
                        st.pool_stale.push(e.slot); // COPY left the page in the slot
                    } else {
                        st.pool_free.push(e.slot); // MOVE emptied it
                    }
                    let m = st.table.get_mut(msg.addr).expect("found above");
                    m.state = match (protect, e.state) {
                        (false, _) => PageState::ResidentDirty,
                        (true, PageState::PoolSent) => PageState::ResidentClean,
                        (true, _) => PageState::ResidentSending,
                    };
                    st.resident += 1;
                    // Inserts the page into the eviction policy (as a prefetch hit or not) and
                    // feeds the prefetcher.
                    crate::prefetch::on_pool_fault(sh, &mut st, msg.addr, msg.thread);
                    sh.update_peak(&st);
                    sh.kick_evictor(&st);
                    drop(st);
                    sh.stats
                        .lock()
                        .fault(FaultKind::PoolHit, msg.t0.elapsed().as_micros() as u64);
                }
                Err(UffdError::Again { .. }) => retry.push_back(msg),
                Err(UffdError::Exists { .. }) => {
                    drop(st);
                    let _ = sh.uffd.wake(msg.addr, PAGE_SIZE);
                }
                Err(err) => {
                    drop(st);
                    sh.report(
                        format!("moving page {:#x} back from the pool: {err}", msg.addr),
                        true,
                    );
                    let _ = sh.uffd.wake(msg.addr, PAGE_SIZE);
                }
            }
        }
        PageState::Remote => {
            let m = st.table.get_mut(msg.addr).expect("found above");
            m.state = PageState::Fetching;
            let far = m.far;
            if crate::prefetch::wait_for_prefetch(sh, &mut st, msg.addr, far, msg.thread, msg.t0) {
                // Its prefetch is on the wire: the prefetch thread installs it on arrival
                // (waking this fault), sooner than a demand read sent now would.
                drop(st);
                return;
            }
            drop(st);
            let pending = sh.far.submit_read(far).ok();
            let (addr, thread) = (msg.addr, msg.thread);
            fetches.push(Fetch {
                msg,
                far,
                pending,
                attempts: 1,
            });
            // The demand read is on the wire: now feed the prefetcher, whose pages go out on
            // the prefetch thread's own connection.
            crate::prefetch::on_remote_fault(sh, addr, thread);
        }
        PageState::Evicting => unreachable!("waited above"),
    }
}

/// Waits for one remote read (retrying on failure) and installs the page.
fn complete_fetch(
    sh: &Shared,
    mut f: Fetch,
    installs: &mut VecDeque<(FaultMsg, Box<[u8]>)>,
    retry: &mut VecDeque<FaultMsg>,
) {
    loop {
        let result = match f.pending.take() {
            Some(p) => p.wait().map_err(|e| e.to_string()),
            None => match sh.far.submit_read(f.far) {
                Ok(p) => p.wait().map_err(|e| e.to_string()),
                Err(e) => Err(e.to_string()),
            },
        };
        match result {
            Ok(Completion::Pages(data)) if data.len() == PAGE_SIZE => {
                sh.stats.lock().s.bytes_received += PAGE_SIZE as u64;
                install_fetched(sh, f.msg, data.into_boxed_slice(), installs, retry);
                return;
            }
            Ok(_) => {
                sh.report(
                    format!(
                        "donor answered a page read with no page (far page {})",
                        f.far
                    ),
                    true,
                );
            }
            Err(e) => sh.report(
                format!(
                    "fetching page {:#x} (far page {}) failed (try {} of {}): {e}",
                    f.msg.addr, f.far, f.attempts, sh.fetch_attempts
                ),
                true,
            ),
        }
        if f.attempts >= sh.fetch_attempts {
            fail_fetch(sh, f.msg, retry);
            return;
        }
        f.attempts += 1;
    }
}

/// A page that cannot be brought back: poison it so the faulting thread gets SIGBUS.
fn fail_fetch(sh: &Shared, msg: FaultMsg, retry: &mut VecDeque<FaultMsg>) {
    let mut st = sh.state.lock();
    if let Some(m) = st.table.get_mut(msg.addr) {
        if m.state == PageState::Fetching {
            m.state = PageState::Remote;
        } else {
            // Released meanwhile: serve whatever it is now.
            drop(st);
            retry.push_back(msg);
            return;
        }
    }
    drop(st);
    tracing::error!(
        "page {:#x} cannot be brought back from its donor: the faulting thread gets SIGBUS",
        msg.addr
    );
    if sh.uffd.poison(msg.addr, PAGE_SIZE, false).is_err() {
        eprintln!(
            "farmem: fatal: page {:#x} cannot be brought back from its donor and cannot be \
             poisoned; aborting rather than returning wrong data",
            msg.addr
        );
        std::process::abort();
    }
}

/// Installs a fetched page if it is still wanted.
fn install_fetched(
    sh: &Shared,
    msg: FaultMsg,
    data: Box<[u8]>,
    installs: &mut VecDeque<(FaultMsg, Box<[u8]>)>,
    retry: &mut VecDeque<FaultMsg>,
) {
    let mut st = sh.state.lock();
    sh.make_room(&mut st);
    let state = st.table.get(msg.addr).map(|e| e.state);
    if state != Some(PageState::Fetching) {
        // Released or remapped while in flight: serve what the page is now.
        drop(st);
        retry.push_back(msg);
        return;
    }
    // Read faults get the page write-protected so that a later write is seen (clean pages are
    // dropped at eviction without resending).
    match sh.uffd.copy(msg.addr, &data, false, !msg.write) {
        Ok(()) | Err(UffdError::Exists { .. }) => {
            let m = st.table.get_mut(msg.addr).expect("checked above");
            m.state = if msg.write {
                PageState::ResidentDirty
            } else {
                PageState::ResidentClean
            };
            st.resident += 1;
            st.policy.insert(pid_of(msg.addr), Origin::Demand);
            sh.update_peak(&st);
            sh.kick_evictor(&st);
            drop(st);
            sh.stats
                .lock()
                .fault(FaultKind::Remote, msg.t0.elapsed().as_micros() as u64);
        }
        Err(UffdError::Again { .. }) => {
            drop(st);
            installs.push_back((msg, data));
        }
        Err(err) => {
            let m = st.table.get_mut(msg.addr).expect("checked above");
            m.state = PageState::Remote;
            drop(st);
            tracing::debug!("installing page {:#x}: {err}", msg.addr);
            let _ = sh.uffd.wake(msg.addr, PAGE_SIZE);
        }
    }
}

/// REMOVE / UNMAP: the program released `start..end`; forget every copy.
fn release(sh: &Shared, start: usize, end: usize, unmapped: bool) {
    let st = sh.state.lock();
    let mut st = sh.settle_evictions(st);
    let mut touched: Vec<(usize, Entry)> = Vec::new();
    st.table
        .for_each_in(start, end, |a, e| touched.push((a, *e)));
    for (a, mut e) in touched {
        sh.forget(&mut st, a, &mut e);
        if let Some(m) = st.table.get_mut(a) {
            *m = e;
        }
    }
    if unmapped {
        st.table.remove_range(start, end);
    }
}

/// REMAP: `len` bytes moved from `from` to `to`; move their entries (far copies stay where
/// they are: far page numbers do not depend on addresses).
fn remap(sh: &Shared, from: usize, to: usize, len: usize) {
    let st = sh.state.lock();
    let mut st = sh.settle_evictions(st);
    let mut moved: Vec<(usize, Entry)> = Vec::new();
    st.table
        .for_each_in(from, from + len, |a, e| moved.push((a - from, *e)));
    st.table.remove_range(from, from + len);
    if st.table.find(to).is_none_or(|(_, end)| end < to + len) {
        if st.table.overlaps(to, to + len) {
            tracing::warn!(
                "mremap to {to:#x}+{len:#x} overlaps a region partly; its pages are forgotten"
            );
            for (off, mut e) in moved {
                sh.forget(&mut st, from + off, &mut e);
            }
            return;
        }
        st.table.add(to, to + len);
    }
    for (off, mut e) in moved {
        match e.state {
            PageState::ResidentClean | PageState::ResidentDirty | PageState::ResidentSending => {
                if e.state == PageState::ResidentSending {
                    // The send in flight is matched by address: forget it, resend later.
                    e.state = PageState::ResidentDirty;
                }
                st.policy.remove(pid_of(from + off));
                st.policy.insert(pid_of(to + off), Origin::Demand);
            }
            PageState::PoolSent | PageState::PoolUnsent => {
                st.slot_owner[e.slot as usize] = to + off;
            }
            PageState::Fetching => e.state = PageState::Remote,
            _ => {}
        }
        if let Some(m) = st.table.get_mut(to + off) {
            *m = e;
        }
    }
}

/// Takes a free pool slot, reclaiming the oldest cached page if needed. Called with the
/// state lock held.
pub(crate) fn take_slot(sh: &Shared, st: &mut State) -> Option<u32> {
    if let Some(s) = st.pool_free.pop() {
        return Some(s);
    }
    if st.pool_stale.is_empty() {
        // Reclaim a few of the oldest cached pages at once, so their discard is one batch.
        let batch = (sh.pool_slots as usize / 8).clamp(1, RECLAIM_BATCH);
        while st.pool_stale.len() < batch {
            let Some(s) = st.pool_cached.pop_front() else {
                break;
            };
            let owner = st.slot_owner[s as usize];
            if owner == NO_OWNER {
                continue;
            }
            let Some(m) = st.table.get_mut(owner) else {
                continue;
            };
            if m.state != PageState::PoolSent || m.slot != s {
                continue;
            }
            m.state = PageState::Remote;
            st.slot_owner[s as usize] = NO_OWNER;
            sh.pf.left(owner);
            st.pool_stale.push(s);
        }
    }
    if st.pool_stale.is_empty() {
        return None;
    }
    crate::pool::discard_slots(sh.pool_base, &mut st.pool_stale, sh.self_pidfd.as_ref());
    let stale = std::mem::take(&mut st.pool_stale);
    st.pool_free.extend(stale);
    st.pool_free.pop()
}

/// Most cached pool pages [`take_slot`] reclaims at once (an eighth of the pool at most).
const RECLAIM_BATCH: usize = 32;

/// What happened to one victim: MOVE result, all-zero, copy of its data if dirty.
type Outcome = (Victim, Result<(), UffdError>, bool, Option<Box<[u8]>>);

/// One picked victim.
struct Victim {
    addr: usize,
    slot: u32,
    was_clean: bool,
}

/// The evictor. Runs until shutdown.
pub(crate) fn evict_loop(sh: Arc<Shared>) {
    if let Some(h) = &sh.thread_hook {
        h();
    }
    let mut victims: Vec<Victim> = Vec::with_capacity(EVICT_BATCH);
    let mut outcomes: Vec<Outcome> = Vec::new();
    let mut buf = vec![0u8; PAGE_SIZE];
    let mut draining = false;
    // Victims MOVE refused with EBUSY (shared with a forked child), to unshare after commit.
    let mut shared: Vec<usize> = Vec::new();
    let mut stall_backoff = Duration::from_millis(10);
    let mut stalled_rounds = 0u32;
    let mut last_stall_log: Option<Instant> = None;
    while !sh.shutdown.load(Ordering::Relaxed) {
        let mut st = sh.state.lock();
        if st.resident >= sh.high_water {
            draining = true;
        }
        if st.paused || !draining || st.resident <= sh.low_water {
            draining = false;
            sh.evict_cv.wait_for(&mut st, Duration::from_millis(50));
            continue;
        }
        let want = ((st.resident - sh.low_water) as usize).min(EVICT_BATCH);
        let mut skipped = Vec::new();
        while victims.len() < want {
            let Some(p) = st.policy.pick_victim() else {
                break;
            };
            let addr = p as usize * PAGE_SIZE;
            let state = st.table.get(addr).map(|e| e.state);
            let was_clean = match state {
                Some(PageState::ResidentClean) => true,
                Some(PageState::ResidentDirty) | Some(PageState::ResidentSending) => false,
                _ => continue, // stale: the policy will not return it again
            };
            let Some(slot) = take_slot(&sh, &mut st) else {
                skipped.push(p);
                break;
            };
            sh.pf.left(addr);
            let m = st.table.get_mut(addr).expect("checked above");
            m.state = PageState::Evicting;
            st.evicting += 1;
            st.slot_owner[slot as usize] = addr;
            victims.push(Victim {
                addr,
                slot,
                was_clean,
            });
        }
        for p in skipped {
            // No pool slot: put the page back and wait for the sender.
            st.policy.insert(p, Origin::Demand);
        }
        if victims.is_empty() {
            sh.slots_cv.wait_for(&mut st, Duration::from_millis(20));
            continue;
        }
        // Victims by address and slots in ascending order, so that runs of neighbouring
        // pages go to neighbouring slots and move with one ioctl (see `move_victims`).
        victims.sort_unstable_by_key(|v| v.addr);
        let mut slots: Vec<u32> = victims.iter().map(|v| v.slot).collect();
        slots.sort_unstable();
        for (v, slot) in victims.iter_mut().zip(slots) {
            v.slot = slot;
            st.slot_owner[slot as usize] = v.addr;
        }
        drop(st);
        let moved = move_victims(&sh, &victims);
        for (v, r) in victims.drain(..).zip(moved) {
            let dst = sh.slot_addr(v.slot);
            let mut zero = false;
            if r.is_ok() && !v.was_clean {
                // SAFETY: the slot now holds a page (MOVE succeeded) in the pool mapping the
                // runtime owns; only this thread reads it until it is committed.
                let page = unsafe { std::slice::from_raw_parts(dst as *const u8, PAGE_SIZE) };
                zero = page.iter().all(|b| *b == 0);
                if !zero {
                    buf.copy_from_slice(page);
                }
            }
            let data = (!zero && !v.was_clean && r.is_ok()).then(|| buf.clone().into_boxed_slice());
            outcomes.push((v, r, zero, data));
        }
        let mut st = sh.state.lock();
        let mut counts = (0u64, 0u64); // (clean dropped, zero)
        let mut new_staged = 0;
        let round = outcomes.len();
        let mut failed = 0usize;
        for (v, r, zero, data) in outcomes.drain(..) {
            st.evicting -= 1;
            let cur = st.table.get(v.addr);
            let still = cur.map(|e| e.state) == Some(PageState::Evicting);
            if !still {
                // Released (or unmapped) while being evicted: whatever moved is garbage.
                st.slot_owner[v.slot as usize] = NO_OWNER;
                if r.is_ok() {
                    st.pool_stale.push(v.slot);
                } else {
                    st.pool_free.push(v.slot);
                }
                st.resident -= 1;
                continue;
            }
            let m = st.table.get_mut(v.addr).expect("checked above");
            match r {
                Err(err) => {
                    // Not moved (page shared after fork: EBUSY; gone: ENOENT): stays resident.
                    m.state = if v.was_clean {
                        PageState::ResidentClean
                    } else {
                        PageState::ResidentDirty
                    };
                    st.slot_owner[v.slot as usize] = NO_OWNER;
                    st.pool_free.push(v.slot);
                    failed += 1;
                    if err.errno() == Some(libc::EBUSY) {
                        // Shared copy-on-write with a forked child (MOVE takes exclusive
                        // pages only, and the page stays shared until the parent writes it,
                        // even after the child exits): unshared below, then a victim again.
                        shared.push(v.addr);
                    } else {
                        st.policy.insert(pid_of(v.addr), Origin::Demand);
                        tracing::debug!("evicting {:#x} failed: {err}", v.addr);
                    }
                }
                Ok(()) if v.was_clean => {
                    m.state = PageState::PoolSent;
                    m.slot = v.slot;
                    st.pool_cached.push_back(v.slot);
                    st.resident -= 1;
                    counts.0 += 1;
                }
                Ok(()) if zero => {
                    let far = m.far;
                    *m = Entry::default();
                    if far != NO_FAR {
                        st.far_free.push(far);
                    }
                    st.slot_owner[v.slot as usize] = NO_OWNER;
                    st.pool_stale.push(v.slot);
                    st.resident -= 1;
                    counts.1 += 1;
                }
                Ok(()) => {
                    let far = if m.far != NO_FAR {
                        m.far
                    } else {
                        st.far_free.pop().unwrap_or_else(|| {
                            st.far_next += 1;
                            st.far_next - 1
                        })
                    };
                    st.stage_gen = st.stage_gen.wrapping_add(1);
                    let gen = st.stage_gen;
                    let m = st.table.get_mut(v.addr).expect("checked above");
                    m.far = far;
                    m.state = PageState::PoolUnsent;
                    m.slot = v.slot;
                    m.gen = gen;
                    st.resident -= 1;
                    let data = data.expect("a dirty, non-zero moved page was copied");
                    st.staging.push_back(Staged {
                        addr: v.addr,
                        slot: v.slot,
                        gen,
                        far,
                        data,
                    });
                    new_staged += 1;
                }
            }
        }
        drop(st);
        sh.commit_cv.notify_all();
        if new_staged > 0 {
            sh.stage_cv.notify_one();
        }
        if counts != (0, 0) || failed > 0 {
            let mut s = sh.stats.lock();
            s.s.evicted_dropped_clean += counts.0;
            s.s.evicted_zero += counts.1;
            s.s.evictions_refused += failed as u64;
        }
        let unshared = if shared.is_empty() {
            0
        } else {
            unshare(&sh, &mut shared)
        };
        stalled_rounds = if failed == round && unshared == 0 {
            stalled_rounds + 1
        } else {
            0
        };
        if stalled_rounds >= 3 {
            // Nothing could be moved three rounds in a row (one such round happens when the
            // victims were released or faulted meanwhile): let faults go over the budget
            // instead of waiting for this thread, and try again later, backing off.
            sh.evictor_blocked.store(true, Ordering::Relaxed);
            if last_stall_log.is_none_or(|t| t.elapsed() >= Duration::from_secs(30)) {
                last_stall_log = Some(Instant::now());
                tracing::warn!(
                    "the evictor cannot move any of {round} victims (pages shared with a forked \
                     child that cannot be unshared?): resident memory exceeds the budget until \
                     they can be evicted; retrying"
                );
            }
            let mut st = sh.state.lock();
            sh.evict_cv.wait_for(&mut st, stall_backoff);
            stall_backoff = (stall_backoff * 2).min(Duration::from_secs(1));
        } else {
            sh.evictor_blocked.store(false, Ordering::Relaxed);
            stall_backoff = Duration::from_millis(10);
        }
    }
}

/// Moves every victim out of its region into its pool slot; one result per victim, in order.
/// A run of neighbouring pages bound for neighbouring slots moves with one UFFDIO_MOVE: each
/// ioctl flushes the TLB of every CPU the process runs on (an IPI, a hypervisor exit here),
/// and one ioctl for 64 pages cost 0.39 µs a page against 14.4 µs for 64 single-page ones
/// (measured on this machine with a second thread running). If a run fails part-way, the
/// slots say which pages moved (a slot is empty until its page arrives) and the rest are
/// moved one by one, so each gets its own outcome (EBUSY: shared after a fork).
fn move_victims(sh: &Shared, victims: &[Victim]) -> Vec<Result<(), UffdError>> {
    let mut out: Vec<Result<(), UffdError>> = Vec::with_capacity(victims.len());
    let mut i = 0;
    while i < victims.len() {
        let mut j = i + 1;
        while j < victims.len()
            && victims[j].addr == victims[j - 1].addr + PAGE_SIZE
            && victims[j].slot == victims[j - 1].slot + 1
        {
            j += 1;
        }
        let run = &victims[i..j];
        let dst = sh.slot_addr(run[0].slot);
        // SAFETY: the run's pages are region pages the runtime manages (no Rust reference
        // points into regions) and `dst..` are empty pool slots it owns; MOVE takes the pages
        // out atomically with respect to the page table.
        let r = unsafe {
            sh.pool_uffd
                .move_pages(dst, run[0].addr, run.len() * PAGE_SIZE, true, false)
        };
        match r {
            Ok(n) if n == run.len() * PAGE_SIZE => out.extend(run.iter().map(|_| Ok(()))),
            Ok(_) | Err(_) if run.len() > 1 => {
                let mut present = vec![0u8; run.len()];
                // SAFETY: mincore writes one byte per page of the run's slots (inside the
                // pool mapping) into `present`, which has exactly that many.
                let rc = unsafe {
                    libc::mincore(
                        dst as *mut libc::c_void,
                        run.len() * PAGE_SIZE,
                        present.as_mut_ptr(),
                    )
                };
                for (k, v) in run.iter().enumerate() {
                    if rc == 0 && present[k] & 1 != 0 {
                        out.push(Ok(()));
                        continue;
                    }
                    // SAFETY: as above, for one page and its empty slot.
                    let one = unsafe {
                        sh.pool_uffd.move_pages(
                            sh.slot_addr(v.slot),
                            v.addr,
                            PAGE_SIZE,
                            true,
                            false,
                        )
                    };
                    out.push(one.map(|_| ()));
                }
            }
            r => out.push(r.map(|_| ())),
        }
        i = j;
    }
    out
}

/// Makes pages that UFFDIO_MOVE refused because they are shared copy-on-write with a forked
/// child exclusive again, the way a write by the program would, but without changing their
/// contents: `MADV_POPULATE_WRITE` takes a write fault on each (a write-protect fault, served
/// by the fault thread, marks a clean page dirty first; the copy-on-write then gives this
/// process its own copy). The pages are then handed back to the eviction policy. Faults do not
/// wait for the evictor meanwhile (`evictor_blocked`): the fault thread must be free to serve
/// these write faults. Returns how many pages were unshared; empties `pages`.
fn unshare(sh: &Shared, pages: &mut Vec<usize>) -> usize {
    sh.evictor_blocked.store(true, Ordering::Relaxed);
    sh.commit_cv.notify_all();
    let mut done = 0;
    let mut gone = 0;
    for &addr in pages.iter() {
        if sh.shutdown.load(Ordering::Relaxed) || sh.state.lock().paused {
            break; // a fork is starting: the rest waits for the next round
        }
        // SAFETY: `addr` is one page of a region the runtime manages; POPULATE_WRITE only
        // faults it in writable (breaking copy-on-write sharing) and never changes its
        // contents, and no Rust reference points into regions. If the program unmapped the
        // page meanwhile the call fails harmlessly; if it released it, a zero page is
        // installed through the fault thread, which is what the program reads there anyway.
        let r = unsafe {
            libc::madvise(
                addr as *mut libc::c_void,
                PAGE_SIZE,
                libc::MADV_POPULATE_WRITE,
            )
        };
        if r == 0 {
            done += 1;
        } else {
            gone += 1;
            tracing::debug!(
                "unsharing page {addr:#x} failed: {}",
                std::io::Error::last_os_error()
            );
        }
    }
    let mut st = sh.state.lock();
    for addr in pages.drain(..) {
        if let Some(e) = st.table.get(addr) {
            if matches!(
                e.state,
                PageState::ResidentClean | PageState::ResidentDirty | PageState::ResidentSending
            ) {
                st.policy.insert(pid_of(addr), Origin::Demand);
            }
        }
    }
    drop(st);
    if done > 0 || gone > 0 {
        tracing::debug!("unshared {done} pages shared with a forked child ({gone} failed)");
    }
    done
}

/// Whether a staged page still needs sending: it still sits in its pool slot unsent, or it
/// was moved back unmodified while its send was pending.
fn staged_live(st: &State, s: &Staged) -> bool {
    let owner = st.slot_owner[s.slot as usize];
    let in_pool = st
        .table
        .get(owner)
        .is_some_and(|e| e.state == PageState::PoolUnsent && e.slot == s.slot && e.gen == s.gen);
    in_pool
        || st
            .table
            .get(s.addr)
            .is_some_and(|e| e.state == PageState::ResidentSending && e.gen == s.gen)
}

/// The sender. Runs until shutdown.
pub(crate) fn send_loop(sh: Arc<Shared>) {
    if let Some(h) = &sh.thread_hook {
        h();
    }
    let mut backoff = Duration::from_millis(10);
    while !sh.shutdown.load(Ordering::Relaxed) {
        let mut st = sh.state.lock();
        if st.staging.is_empty() {
            sh.stage_cv.wait_for(&mut st, Duration::from_millis(50));
            continue;
        }
        // Take up to 256 still-wanted pages, oldest first.
        let mut batch: Vec<Staged> = Vec::new();
        while batch.len() < farmem_transport::MAX_BATCH_PAGES {
            let Some(s) = st.staging.pop_front() else {
                break;
            };
            let live = staged_live(&st, &s);
            if live {
                batch.push(s);
            }
        }
        drop(st);
        if batch.is_empty() {
            continue;
        }
        // Group by donor, placing slabs on first write.
        let mut groups: Vec<Vec<(farmem_transport::PageAddr, usize)>> =
            vec![Vec::new(); sh.far.donors.len()];
        let mut failed: Option<RuntimeError> = None;
        for (i, s) in batch.iter().enumerate() {
            match sh.far.place(s.far) {
                Ok((d, a)) => groups[d].push((a, i)),
                Err(e) => {
                    failed = Some(e);
                    break;
                }
            }
        }
        if failed.is_none() {
            for (d, g) in groups.iter().enumerate() {
                if g.is_empty() {
                    continue;
                }
                let writes: Vec<PageWrite<'_>> = g
                    .iter()
                    .map(|(a, i)| PageWrite {
                        addr: *a,
                        data: &batch[*i].data,
                    })
                    .collect();
                if let Err(e) = sh.far.write(d, &writes) {
                    failed = Some(e);
                    break;
                }
            }
        }
        if let Some(e) = failed {
            sh.report(
                format!(
                    "write-back of {} evicted pages failed (kept in the write-back pool, \
                     retrying): {e}",
                    batch.len()
                ),
                false,
            );
            sh.send_failing.store(true, Ordering::Relaxed);
            sh.commit_cv.notify_all();
            let mut st = sh.state.lock();
            for s in batch.into_iter().rev() {
                st.staging.push_front(s);
            }
            drop(st);
            std::thread::sleep(backoff);
            backoff = (backoff * 2).min(Duration::from_secs(1));
            continue;
        }
        backoff = Duration::from_millis(10);
        sh.send_failing.store(false, Ordering::Relaxed);
        let mut st = sh.state.lock();
        let mut sent = 0u64;
        for s in &batch {
            let owner = st.slot_owner[s.slot as usize];
            if let Some(m) = st.table.get_mut(owner) {
                if m.state == PageState::PoolUnsent && m.slot == s.slot && m.gen == s.gen {
                    m.state = PageState::PoolSent;
                    st.pool_cached.push_back(s.slot);
                }
            }
            if let Some(m) = st.table.get_mut(s.addr) {
                if m.state == PageState::ResidentSending && m.gen == s.gen {
                    m.state = PageState::ResidentClean;
                }
            }
            sent += 1;
        }
        drop(st);
        sh.slots_cv.notify_all();
        let mut stats = sh.stats.lock();
        stats.s.evicted_sent_dirty += sent;
        stats.s.bytes_sent += sent * PAGE_SIZE as u64;
    }
}

/// Checks, with the state lock held right before `fork()`, that every page with contents is
/// resident (the child gets exactly the pages mapped at fork). Returns a description of the
/// pages that are not, for the error report: the child would read zeros there. Whether the
/// first such page is present in the page tables (`mincore`) is part of the description; it is
/// not itself checked, since a resident page may be swapped out by the kernel or released by
/// another thread whose REMOVE event is not processed yet, and the child is right either way.
pub(crate) fn check_all_back(st: &mut State) -> Option<String> {
    let mut bad = 0usize;
    let mut first: Option<(usize, PageState, bool)> = None;
    for (s, e) in st.table.ranges() {
        let mut present = vec![0u8; (e - s) / PAGE_SIZE];
        // SAFETY: mincore writes one byte per page of `s..e` into `present`, which has exactly
        // that many; it only inspects the page tables and never faults.
        let r = unsafe { libc::mincore(s as *mut libc::c_void, e - s, present.as_mut_ptr()) };
        if r != 0 {
            continue; // not (entirely) mapped: an UNMAP event is on its way
        }
        st.table.for_each_in(s, e, |a, en| {
            let resident = matches!(
                en.state,
                PageState::ResidentClean | PageState::ResidentDirty | PageState::ResidentSending
            );
            let here = present[(a - s) / PAGE_SIZE] & 1 != 0;
            if en.state != PageState::Empty && !resident {
                bad += 1;
                first.get_or_insert((a, en.state, here));
            }
        });
    }
    first.map(|(a, state, here)| {
        format!(
            "{bad} page(s) are not in local memory at fork (first {a:#x}: {state:?}, {}present)",
            if here { "" } else { "not " }
        )
    })
}

/// Brings every evicted page of every region back (before fork): called from a program thread
/// with eviction paused and no eviction half-done.
pub(crate) fn bring_all_back(sh: &Shared) -> Result<(), RuntimeError> {
    let mut st = sh.state.lock();
    let mut todo: Vec<(usize, Entry)> = Vec::new();
    for (s, e) in st.table.ranges() {
        st.table.for_each_in(s, e, |a, e| {
            if matches!(
                e.state,
                PageState::PoolSent
                    | PageState::PoolUnsent
                    | PageState::Remote
                    | PageState::Fetching
            ) {
                todo.push((a, *e));
            }
        });
    }
    drop(st);
    let mut first_err: Option<RuntimeError> = None;
    for (addr, _) in todo {
        loop {
            let mut st = sh.state.lock();
            // Act on the entry as it is now: the sender may have acknowledged a pool page
            // (PoolUnsent → PoolSent) since the list was made.
            let Some(e) = st.table.get(addr) else {
                break;
            };
            if e.state == PageState::Fetching {
                // Another thread's fault is being served from the donor right now: the fault
                // thread installs it (or, if the fetch fails, leaves it Remote). Skipping it
                // would fork with the page missing, and the child would read zeros there.
                drop(st);
                std::thread::sleep(Duration::from_micros(200));
                continue;
            }
            if !matches!(
                e.state,
                PageState::PoolSent | PageState::PoolUnsent | PageState::Remote
            ) {
                break; // resident already, or released
            }
            let r = match e.state {
                // SAFETY: a pool slot the runtime owns holding this page; nothing references it.
                PageState::PoolSent | PageState::PoolUnsent => unsafe {
                    sh.uffd
                        .move_pages(addr, sh.slot_addr(e.slot), PAGE_SIZE, false, false)
                        .map(|_| ())
                },
                _ => {
                    drop(st);
                    let mut data = vec![0u8; PAGE_SIZE];
                    let Some((d, a)) = sh.far.locate(e.far) else {
                        first_err
                            .get_or_insert(RuntimeError::Internal("remote page without placement"));
                        break;
                    };
                    if let Err(source) = sh.far.donors[d].read.read_pages(&[a], &mut data) {
                        first_err.get_or_insert(RuntimeError::Donor {
                            addr: sh.far.donors[d].read.addr().to_string(),
                            step: "bringing pages back before fork",
                            source,
                        });
                        break;
                    }
                    st = sh.state.lock();
                    if st.table.get(addr) != Some(e) {
                        continue; // changed meanwhile: look again
                    }
                    sh.uffd.copy(addr, &data, false, false)
                }
            };
            match r {
                Ok(()) | Err(UffdError::Exists { .. }) => {
                    if matches!(e.state, PageState::PoolSent | PageState::PoolUnsent) {
                        st.slot_owner[e.slot as usize] = NO_OWNER;
                        st.pool_free.push(e.slot);
                    }
                    let m = st.table.get_mut(addr).expect("checked");
                    m.state = PageState::ResidentDirty;
                    st.resident += 1;
                    st.policy.insert(pid_of(addr), Origin::Demand);
                    sh.update_peak(&st);
                    break;
                }
                Err(UffdError::Again { .. }) => {
                    drop(st);
                    std::thread::sleep(Duration::from_micros(200));
                }
                Err(source) => {
                    // Go on with the other pages: one failure must not cost the child the
                    // rest (the first error is reported).
                    first_err.get_or_insert(RuntimeError::Uffd {
                        step: "bringing pages back before fork",
                        source,
                    });
                    break;
                }
            }
        }
    }
    first_err.map_or(Ok(()), Err)
}
