//! The fault loop (`farmem-fault`, one thread): the only reader of the region userfaultfd.
//!
//! # Design
//!
//! It reads messages in batches and handles them in order: release events (REMOVE, UNMAP,
//! REMAP: [`crate::threads::events`]) update the page table at once (never calling madvise itself: the
//! program thread that raised the event is blocked until it is read); a fault is answered by
//! the cheapest source: a zero page for never-written pages, a MOVE back from the write-back
//! pool, or a read from the donor issued by this thread, which waits for it directly (the only
//! other thread involved is the transport's socket reader). Remote reads of one batch are all
//! submitted before the first is waited for, so concurrent faults overlap on the wire.
//! Several messages for one page (threads faulting together) are served once: the first
//! install wakes every waiter, later messages find the page resident and only wake.
//!
//! Dirty tracking: a page installed from an up-to-date donor copy by a read fault is
//! installed write-protected (`ResidentClean`); its first write raises a WP fault that marks
//! it dirty and unprotects it. Write faults install writable pages directly. Pages installed
//! ahead from the host tier go in write-protected, or writable while most of those the
//! program wrote took such a WP fault ([`farmem_policy::ahead_writes`]).
//!
//! Failure: a page that cannot be fetched (donor dead or stalled past the transport's
//! request timeout, after `fetch_attempts` tries, and past `stall_patience` while a copy is on
//! a donor that stalled or was cut off) is logged as an error, counted, and answered with
//! UFFDIO_POISON: the faulting thread gets SIGBUS rather than hanging or reading wrong data.
//!
//! # Limitations
//!
//! - One thread serves every fault; a remote read blocks the faults behind it in its batch
//!   (they are submitted together, so they wait for the slowest of them).

use rustix::event::{PollFd, PollFlags};

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::sync::MutexGuard;
use farmem_policy::first_touch::{FirstTouch, FirstTouchConfig};
use farmem_policy::Origin;
use farmem_uffd::{Event, UffdError};

use crate::copies::failover::ReplicaRead;
use crate::failure::ThreadError;
use crate::far::Home;
use crate::pages::{Entry, PageState, NO_FAR};
use crate::shared::{Shared, State};
use crate::stats::FaultKind;
use farmem_proto::PAGE_SIZE;

mod ahead;
mod fetch;
mod rounds;
mod zero;

use ahead::install_ahead;
use fetch::{complete_fetch, fail_fetch, install_fetched};
use rounds::FaultWorld;
use zero::serve_zero;

/// A fault waiting to be served (again).
pub(super) struct FaultMsg {
    addr: usize,
    write: bool,
    wp: bool,
    /// The faulting thread's id (for the prefetcher's per-thread streams).
    thread: u32,
    t0: Instant,
}

/// A remote read in flight.
pub(super) struct Fetch {
    msg: FaultMsg,
    far: u64,
    read: Option<ReplicaRead>,
    attempts: u32,
}

/// The fault loop's queues between iterations, and its first-touch readahead.
pub(super) struct Queues {
    /// Streams of first touches (fault thread only, so no lock).
    first_touch: FirstTouch,
    /// Zeroes for a run of pages mapped ahead (one UFFDIO_COPY).
    zeros: Box<[u8]>,
    /// Faults to serve again (pending events, or the page changed while waiting).
    retry: VecDeque<FaultMsg>,
    /// Pages fetched whose install met pending events.
    installs: VecDeque<(FaultMsg, Box<[u8]>, FaultKind)>,
    /// Remote reads submitted in this batch.
    fetches: Vec<Fetch>,
}

/// The fault loop. Runs until shutdown.
pub(crate) fn fault_loop(sh: Arc<Shared>) {
    let cfg = FirstTouchConfig::default();
    let q = Queues {
        zeros: vec![0u8; cfg.max_window_pages as usize * PAGE_SIZE].into_boxed_slice(),
        first_touch: FirstTouch::new(cfg).expect("the default configuration is valid"),
        retry: VecDeque::new(),
        installs: VecDeque::new(),
        fetches: Vec::new(),
    };
    rounds::run(&mut FaultThread { sh, q });
}

/// The runtime as the fault loop sees it ([`FaultWorld`]).
struct FaultThread {
    sh: Arc<Shared>,
    q: Queues,
}

impl FaultWorld for FaultThread {
    fn stopping(&self) -> bool {
        self.sh.shutdown.load(Ordering::Relaxed)
    }
    fn spin(&mut self, events: &mut Vec<Event>) -> bool {
        spin_for_events(&self.sh, events)
    }
    fn wait(&mut self, timeout: Duration) -> rustix::io::Result<()> {
        wait_for_events(&self.sh, timeout)
    }
    fn read(&mut self, events: &mut Vec<Event>) -> Result<usize, UffdError> {
        read_events(&self.sh, events)
    }
    fn handle(&mut self, ev: Event) {
        handle_event(&self.sh, ev, &mut self.q);
    }
    fn serve_waiting(&mut self) {
        let (sh, q) = (&*self.sh, &mut self.q);
        // Pages fetched earlier whose install met pending events.
        for _ in 0..q.installs.len() {
            let (msg, data, kind) = q.installs.pop_front().expect("counted");
            install_fetched(sh, msg, data, kind, q);
        }
        // Remote reads submitted in this batch: wait for each and install.
        complete_fetches(sh, q);
        for _ in 0..q.retry.len() {
            let msg = q.retry.pop_front().expect("counted");
            serve(sh, msg, q);
        }
        complete_fetches(sh, q);
    }
    fn waiting(&self) -> bool {
        !(self.q.retry.is_empty() && self.q.installs.is_empty())
    }
    fn releases_handled(&mut self) {
        self.sh.removes_unhandled.store(false, Ordering::Release);
    }
    fn handled(&mut self) {
        // Only this thread reads events.
        self.sh
            .handled_seq
            .store(self.sh.read_seq.load(Ordering::SeqCst), Ordering::Release);
    }
    fn report(&self, err: ThreadError) {
        self.sh.report(err);
    }
    fn pause(&self, wait: Duration) {
        std::thread::sleep(wait);
    }
}

/// Sleeps until the userfaultfd has events, shutdown rings the doorbell, or `timeout` passes.
fn wait_for_events(sh: &Shared, timeout: Duration) -> rustix::io::Result<()> {
    let timeout = rustix::event::Timespec {
        tv_sec: timeout.as_secs() as i64,
        tv_nsec: i64::from(timeout.subsec_nanos()),
    };
    let mut fds = [
        PollFd::new(&sh.uffd, PollFlags::IN),
        PollFd::from_borrowed_fd(sh.doorbell.fd(), PollFlags::IN),
    ];
    match rustix::event::poll(&mut fds, Some(&timeout)) {
        Ok(_) | Err(rustix::io::Errno::INTR) => Ok(()),
        Err(e) => Err(e),
    }
}

fn handle_event(sh: &Shared, ev: Event, q: &mut Queues) {
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
            serve(sh, msg, q);
        }
        Event::Remove { start, end } | Event::Unmap { start, end } => {
            crate::threads::events::release(sh, start, end, matches!(ev, Event::Unmap { .. }));
        }
        Event::Remap { from, to, len } => crate::threads::events::remap(sh, from, to, len),
        Event::Fork { .. } => {
            // EVENT_FORK is never enabled; dropping the fd would be the answer.
        }
    }
}

fn complete_fetches(sh: &Shared, q: &mut Queues) {
    // Taken and put back so the vector keeps its capacity (completing a fetch never submits
    // another).
    let mut fetches = std::mem::take(&mut q.fetches);
    for f in fetches.drain(..) {
        complete_fetch(sh, f, q);
    }
    q.fetches = fetches;
}

/// How long the fault thread keeps polling for the next event after serving some, before it
/// sleeps in poll(2). A faulting program usually faults again within microseconds; a sleeping
/// fault thread costs a wake-up on every fault, which on a virtual machine with idle vCPUs
/// (halted, woken by an IPI through the hypervisor) is tens of microseconds.
const SPIN: Duration = Duration::from_micros(50);

/// Reads events without sleeping for up to [`SPIN`]; true when some arrived. Yields the CPU
/// between reads, as the other polls do: on two vCPUs the program's thread, the evictor and the
/// sender may be waiting for the CPU this poll holds (measured: redis, memcached and jvm-heap
/// faster, with less CPU a page; see docs/architecture.md, "Threads").
fn spin_for_events(sh: &Shared, events: &mut Vec<Event>) -> bool {
    let start = Instant::now();
    while start.elapsed() < SPIN {
        match read_events(sh, events) {
            Ok(n) if n > 0 => return true,
            Ok(_) => std::thread::yield_now(),
            Err(_) => break, // reported by the blocking path
        }
    }
    // Nothing read: nothing left to handle before the thread goes to sleep in poll.
    sh.handled_seq
        .store(sh.read_seq.load(Ordering::SeqCst), Ordering::Release);
    false
}

/// Reads the events queued now, without sleeping. Counted before the read: a munmap or
/// madvise whose event it dequeues returns only after that (see
/// [`Shared::wait_events_handled`]). Under the read gate, which closes installs by other
/// threads while a REMOVE it dequeues is not handled ([`Shared::install_gated`]).
fn read_events(sh: &Shared, events: &mut Vec<Event>) -> Result<usize, UffdError> {
    let _gate = sh.read_gate.lock();
    sh.read_seq.fetch_add(1, Ordering::SeqCst);
    let n = sh.uffd.read_events(events)?;
    if events.iter().any(|e| matches!(e, Event::Remove { .. })) {
        sh.removes_unhandled.store(true, Ordering::Release);
    }
    Ok(n)
}

/// Serves one fault message from local state, or starts its remote read.
fn serve(sh: &Shared, msg: FaultMsg, q: &mut Queues) {
    let st = sh.state.lock();
    let Some(e) = st.pages.get(msg.addr) else {
        drop(st);
        return serve_unknown(sh, msg, q);
    };
    let Some((mut st, e)) = wait_for_commit(sh, st, e, &msg) else {
        q.retry.push_back(msg);
        return;
    };
    if msg.wp {
        return serve_write_protect(sh, st, e, msg, q);
    }
    let installs = matches!(
        e.state,
        PageState::Empty | PageState::PoolSent | PageState::PoolUnsent
    );
    if installs && (!sh.room_for_fault(&mut st) || st.pages.get(msg.addr) != Some(e)) {
        // No room yet, or changed while waiting (released, or brought in): look again.
        drop(st);
        q.retry.push_back(msg);
        return;
    }
    match e.state {
        PageState::Empty => serve_zero(sh, st, msg, q),
        PageState::ResidentClean
        | PageState::ResidentDirty
        | PageState::ResidentSending
        | PageState::Fetching => serve_served(sh, st, e, msg, q),
        PageState::PoolSent | PageState::PoolUnsent => serve_from_pool(sh, st, e, msg, q),
        PageState::Remote => match sh.far.home(e.far) {
            Some((Home::Memory(m), page)) => serve_from_memory(sh, st, e, m, page, msg, q),
            _ => serve_remote(sh, st, msg, q),
        },
        PageState::Evicting => unreachable!("waited above"),
    }
}

/// Not a region we know (being dropped, or a race with munmap): zero it so the thread does
/// not wait forever.
fn serve_unknown(sh: &Shared, msg: FaultMsg, q: &mut Queues) {
    match sh.uffd.zeropage(msg.addr, PAGE_SIZE, false) {
        Ok(()) => {}
        Err(UffdError::Again { .. }) => q.retry.push_back(msg),
        Err(_) => {
            let _ = sh.uffd.wake(msg.addr, PAGE_SIZE);
        }
    }
}

/// Waits for an eviction in progress to commit, unless the page is being dropped
/// ([`crate::threads::cow`]): a write to it (write-protected for its copy), or an access after the
/// program released it meanwhile. The drop waits for this thread, so the fault waits in the
/// queue (None: the caller queues it again) until the drop is committed; installing a page
/// now would have it dropped too. Checked on every wake-up: a victim MOVE refuses becomes a
/// drop while this thread waits for it (the fork test hung once in about 15 runs, this
/// thread waiting for the page and the evictor for this thread to read the drop's REMOVE
/// event).
fn wait_for_commit<'a>(
    sh: &Shared,
    mut st: MutexGuard<'a, State>,
    mut e: Entry,
    msg: &FaultMsg,
) -> Option<(MutexGuard<'a, State>, Entry)> {
    loop {
        if st.drops.contains(msg.addr) {
            return None;
        }
        if e.state != PageState::Evicting {
            return Some((st, e));
        }
        sh.commit_cv.wait_for(&mut st, Duration::from_millis(1));
        e = st.pages.get(msg.addr).unwrap_or_default();
    }
}

/// A page resident or being fetched: served already (another thread's fault on the same
/// page), or the install wakes every waiter.
fn serve_served(
    sh: &Shared,
    mut st: MutexGuard<'_, State>,
    e: Entry,
    msg: FaultMsg,
    q: &mut Queues,
) {
    if e.state == PageState::Fetching {
        drop(st);
        sh.stats.lock().s.faults_already_served += 1;
        return;
    }
    // Installs happen under the state lock, so a resident page whose region page is absent
    // was taken away behind the runtime's back: by a program release the kernel applied late
    // (a zero install: it reads zeros now), or the state is wrong, and waking the thread
    // would only make it fault again, forever (seen once: 75 million wakes of one page):
    // the access fails loudly.
    let mut present = [0u8; 1];
    let absent = farmem_mm::mincore(msg.addr, &mut present).is_ok() && present[0] & 1 == 0;
    if absent {
        if crate::threads::events::released_late(sh, &mut st, msg.addr, e) {
            drop(st);
            q.retry.push_back(msg);
            return;
        }
        drop(st);
        return state_lost(sh, e, &msg);
    }
    drop(st);
    let _ = sh.uffd.wake(msg.addr, PAGE_SIZE);
    sh.stats.lock().s.faults_already_served += 1;
}

/// A page taken for resident is not mapped: its contents are lost; the faulting thread gets
/// SIGBUS.
fn state_lost(sh: &Shared, e: Entry, msg: &FaultMsg) {
    sh.report(ThreadError::ResidentNotMapped {
        addr: msg.addr,
        state: e.state,
        pid: std::process::id(),
        thread: msg.thread,
    });
    sh.stats.lock().s.state_lost_pages += 1;
    if sh.uffd.poison(msg.addr, PAGE_SIZE, false).is_err() {
        let _ = sh.uffd.wake(msg.addr, PAGE_SIZE);
    }
}

/// A write-protect fault: the page is written for the first time since it was installed
/// clean; unprotect it and mark it dirty.
fn serve_write_protect(
    sh: &Shared,
    mut st: MutexGuard<'_, State>,
    e: Entry,
    msg: FaultMsg,
    q: &mut Queues,
) {
    if !e.state.is_resident() {
        // The page left since the fault was raised: wake the writer, it faults again on
        // the missing page.
        drop(st);
        let _ = sh.uffd.wake(msg.addr, PAGE_SIZE);
        return;
    }
    match sh.uffd.writeprotect(msg.addr, PAGE_SIZE, false, false) {
        Ok(()) => {
            if let Some(before) = st.pages.mark_dirty(msg.addr) {
                if before.ahead {
                    st.ahead_writes.written();
                }
                if before.armed {
                    st.write_heat.sample_written((msg.addr / PAGE_SIZE) as u64);
                    sh.stats.lock().s.write_heat_samples_written += 1;
                }
            }
            drop(st);
            sh.count_fault(FaultKind::WriteProtect, msg.t0);
        }
        Err(UffdError::Again { .. }) => q.retry.push_back(msg),
        Err(err) => {
            drop(st);
            sh.report(ThreadError::WriteProtect {
                addr: msg.addr,
                source: err,
            });
            let _ = sh.uffd.wake(msg.addr, PAGE_SIZE);
        }
    }
}

/// A page in the write-back pool: moved (or copied write-protected) back into its region.
fn serve_from_pool(
    sh: &Shared,
    mut st: MutexGuard<'_, State>,
    e: Entry,
    msg: FaultMsg,
    q: &mut Queues,
) {
    // Read faults keep tracking writes: a sent page comes back clean, an unsent one as
    // "sending" (clean once its send is acked). Such a page is installed write-protected by
    // COPY|WP, atomically: MOVE then WRITEPROTECT would map it writable for a moment (another
    // thread's write there would be lost), and the kernel rejects WRITEPROTECT with
    // WP|DONTWAKE (EINVAL), which left every pool hit dirty. Other faults take the page back
    // with MOVE (no copy).
    let protect = !msg.write && (e.state == PageState::PoolUnsent || e.far != NO_FAR);
    let copy = |wp: bool| {
        crate::mm::with_page_bytes(sh.pool.mapping(), e.slot, |data| {
            sh.uffd.copy(msg.addr, data, false, wp).map(|()| PAGE_SIZE)
        })
    };
    let mut copied = protect;
    let r = if protect {
        copy(true)
    } else {
        match crate::mm::move_from_pool(&sh.uffd, msg.addr, sh.slot_addr(e.slot), true) {
            // MOVE needs both ranges writable: the program made this page's range read-only
            // (mprotect) after it was evicted. COPY installs into any registered range.
            Err(err) if err.errno() == Some(libc::EINVAL) => {
                copied = true;
                copy(false)
            }
            r => r,
        }
    };
    match r {
        Ok(_) => {
            if !copied {
                // MOVE was issued with DONTWAKE; COPY woke the waiters itself.
                let _ = sh.uffd.wake(msg.addr, PAGE_SIZE);
            }
            if copied {
                st.slots.release_stale(e.slot); // COPY left the page in the slot
            } else {
                st.slots.release_empty(e.slot); // MOVE emptied it
            }
            // A prefetch hit is inserted into the eviction policy as such; the prefetcher is
            // fed after the install.
            let (origin, now) = sh.pf.pool_fault(msg.addr);
            st.pages.install_from_pool(msg.addr, protect, origin);
            let hit = origin == Origin::Prefetch;
            feed(sh, &mut st, msg.addr, msg.thread, hit, now);
            sh.kick_evictor(&st);
            drop(st);
            sh.count_fault(FaultKind::PoolHit, msg.t0);
        }
        Err(UffdError::Again { .. }) => q.retry.push_back(msg),
        Err(UffdError::Exists { .. }) => {
            drop(st);
            let _ = sh.uffd.wake(msg.addr, PAGE_SIZE);
        }
        Err(err) => {
            drop(st);
            sh.report(ThreadError::MoveBack {
                addr: msg.addr,
                source: err,
            });
            let _ = sh.uffd.wake(msg.addr, PAGE_SIZE);
        }
    }
}

/// A page whose slab is in memory (the host tier, or a local slab): one UFFDIO_COPY straight
/// from the slab, under the state lock (which keeps the slab in place), no message. Installed
/// writable and dirty even for a read fault; the evictor compares it with its slab copy and
/// writes it back only if it changed.
#[allow(clippy::too_many_arguments)]
fn serve_from_memory(
    sh: &Shared,
    mut st: MutexGuard<'_, State>,
    e: Entry,
    m: u32,
    page: u32,
    msg: FaultMsg,
    q: &mut Queues,
) {
    if !sh.room_for_fault(&mut st) || st.pages.get(msg.addr) != Some(e) {
        drop(st);
        q.retry.push_back(msg);
        return;
    }
    // Installed writable even for a read: a write-protect fault costs a userfaultfd round trip
    // (numpy's matmul took one after every read fault on its result matrix), while an
    // unchanged page costs only a compare with its slab copy when it is evicted.
    let r = st
        .mem
        .read(m, page, |src| sh.uffd.copy(msg.addr, src, false, false));
    match r {
        Some(Ok(())) | Some(Err(UffdError::Exists { .. })) => {
            st.pages.begin_fetch(msg.addr);
            st.pages.install_fetched(msg.addr, true, Origin::Demand);
            if sh.pf.enabled() {
                let (hit, now) = sh.pf.on_tier_fault(msg.addr);
                feed(sh, &mut st, msg.addr, msg.thread, hit, now);
            }
            sh.kick_evictor(&st);
            drop(st);
            sh.count_fault(FaultKind::Tier, msg.t0);
        }
        Some(Err(UffdError::Again { .. })) => {
            drop(st);
            q.retry.push_back(msg);
        }
        Some(Err(err)) => {
            drop(st);
            tracing::debug!("installing page {:#x} from memory: {err}", msg.addr);
            let _ = sh.uffd.wake(msg.addr, PAGE_SIZE);
        }
        None => {
            // A bug: poison the page (fail_fetch takes a fetching page) rather than hang.
            st.pages.begin_fetch(msg.addr);
            drop(st);
            sh.report(ThreadError::NoMemSlab {
                addr: msg.addr,
                far: e.far,
            });
            fail_fetch(sh, msg, q);
        }
    }
}

/// A page on its donor only: wait for its prefetch if one is in flight, else send a demand
/// read (waited for after the batch's other reads are submitted).
fn serve_remote(sh: &Shared, mut st: MutexGuard<'_, State>, msg: FaultMsg, q: &mut Queues) {
    let Some(far) = st.pages.begin_fetch(msg.addr) else {
        // Refused (a bug, logged by the page states): never leave the thread waiting.
        drop(st);
        let _ = sh.uffd.wake(msg.addr, PAGE_SIZE);
        return;
    };
    if let Some(now) = sh.pf.wait_for_prefetch(msg.addr, far, msg.t0) {
        // Its prefetch is on the wire: the prefetch thread installs it on arrival (waking
        // this fault), sooner than a demand read sent now would.
        feed(sh, &mut st, msg.addr, msg.thread, true, now);
        return;
    }
    drop(st);
    let read = Some(ReplicaRead::start(sh, far));
    let (addr, thread) = (msg.addr, msg.thread);
    q.fetches.push(Fetch {
        msg,
        far,
        read,
        attempts: 1,
    });
    // The demand read is on the wire: now feed the prefetcher, whose pages go out on the
    // prefetch thread's own connection.
    let mut st = sh.state.lock();
    let (hit, now) = sh.pf.on_remote_fault(addr);
    feed(sh, &mut st, addr, thread, hit, now);
}

/// Feeds a fault on `addr` (or a prefetch hit) to the prefetcher, with the state lock held:
/// predicted pages in a memory slab are installed at once ([`install_ahead`]), those on a
/// donor only are queued to the prefetch thread.
fn feed(sh: &Shared, st: &mut State, addr: usize, thread: u32, hit: bool, now: u64) {
    if !sh.pf.enabled() {
        return;
    }
    let out = sh.pf.predict(&mut st.pages, addr, thread, hit, now);
    if out.is_empty() || st.paused {
        return;
    }
    let remote = install_ahead(sh, st, &out, addr, thread, now);
    sh.pf.queue_fetches(&st.pages, &remote, addr, thread);
}
