//! The evictor (`farmem-evict`): keeps resident pages at or below the low watermark (budget
//! minus a headroom), so a fault finds room without waiting.
//!
//! # Design
//!
//! Victims (from the eviction policy) are MOVEd into the write-back pool, a mapping
//! registered with a second, event-free userfaultfd (MOVE needs its destination registered
//! with the userfaultfd it is issued on; without events, freeing a pool page with
//! MADV_DONTNEED never blocks). Clean pages become reclaimable at once; all-zero pages are
//! dropped and forgotten; dirty pages are copied to the staging queue for the sender. A page
//! written during eviction is never lost: MOVE is atomic with respect to the page table, so
//! the write lands either before (and moves with the page) or after (and faults the page back
//! from the pool). Dirty tracking is synchronous userfaultfd write-protect rather than
//! asynchronous WP with PAGEMAP_SCAN: MOVE re-creates the page table entry without the uffd-wp
//! bit, so the written/clean answer has to be read before the MOVE, and a write between the
//! scan and the MOVE would be lost; the synchronous fault closes that window.
//!
//! A round: pick victims and take their slots (state lock held; pages become `Evicting`),
//! MOVE them (lock released), read the dirty ones, commit (lock held again).
//!
//! # Limitations
//!
//! - Pages shared copy-on-write with a forked process (EBUSY) and pages of ranges the program
//!   made read-only or inaccessible (EINVAL) cannot be MOVEd; they are copied and dropped from
//!   this process instead ([`crate::cow`]), after the round's commit. While nothing can be
//!   moved or dropped (mlocked memory), resident memory exceeds the budget.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use farmem_policy::write_heat::Verdict;
use farmem_uffd::UffdError;

use crate::budget::EVICT_BATCH;
use crate::doorbell::IDLE_WAIT;
use crate::far::Home;
use crate::pages::PageState;
use crate::runs::runs;
use crate::shared::{Shared, Staged, State};
use farmem_proto::PAGE_SIZE;

/// The widest hole, in pages, between two of a round's victims that the round closes by
/// taking the resident pages in it too ([`close_holes`]). Leap's eager eviction takes the
/// prefetched pages a scan has used first, and leaves the page whose fault started each
/// prefetch window (and a page installed alone) to the wrapped policy: the victims of a scan
/// were neighbours but for holes of one or two pages, 2 to 5 pages per UFFDIO_MOVE, and the
/// pages in the holes were evicted later, one MOVE (one TLB shootdown) each. Measured on this
/// machine in interleaved pairs (`compare -w seq,kmeans --local 0.5,0.25 --systems farmem`):
/// seq at 0.5 4.9 → 20 pages per MOVE, 4.97 and 5.16 → 2.71 and 2.82 µs an access; kmeans at
/// 0.25 2.2 → 8.4 pages per MOVE, 14.97 and 15.08 → 10.67 and 10.16 s. Holes wider than two
/// pages are left: a wider hole is less likely one scan's leftovers than pages in use.
const MAX_HOLE_PAGES: usize = 2;

/// Dirty pages a round may put back at the tail (write-heat samples and pages of chunks the
/// program keeps writing, [`farmem_policy::write_heat`]) before it lets go of the state lock,
/// so a long run of such pages at the head does not hold faults back.
const KEPT_PER_ROUND: u64 = 256;

/// Why MOVE refused a victim that is then dropped instead ([`crate::cow`]).
#[derive(Clone, Copy)]
enum Unmovable {
    /// Shared copy-on-write with a forked process (EBUSY).
    Shared,
    /// In a range the program made read-only or inaccessible with mprotect (EINVAL).
    NotWritable,
}

/// One picked victim.
struct Victim {
    addr: usize,
    slot: u32,
    was_clean: bool,
}

/// What happened to one victim: MOVE result, and whether it is a dirty all-zero page.
type Outcome = (Victim, Result<(), UffdError>, bool);

/// What one commit did, for the counters and the stall detection.
#[derive(Default)]
struct Committed {
    clean: u64,
    zero: u64,
    refused: usize,
    staged: usize,
    /// Dirty pages written straight into a memory slab.
    to_memory: u64,
}

/// The evictor's state between rounds.
struct Evictor {
    victims: Vec<Victim>,
    /// Dirty pages this round armed as write-heat samples, to write-protect.
    armed: Vec<usize>,
    keeping: Keeping,
    outcomes: Vec<Outcome>,
    draining: bool,
    /// Victims MOVE refused (shared with a forked process, or in a range that is not
    /// writable), still `Evicting`, to drop after the commit ([`crate::cow`]).
    unmovable: Vec<(Victim, Unmovable)>,
    stall_backoff: Duration,
    stalled_rounds: u32,
    last_stall_log: Option<Instant>,
}

/// The evictor. Runs until shutdown.
pub(crate) fn evict_loop(sh: Arc<Shared>) {
    let mut ev = Evictor {
        victims: Vec::with_capacity(EVICT_BATCH),
        armed: Vec::new(),
        keeping: Keeping::default(),
        outcomes: Vec::new(),
        draining: false,
        unmovable: Vec::new(),
        stall_backoff: Duration::from_millis(10),
        stalled_rounds: 0,
        last_stall_log: None,
    };
    while !sh.shutdown.load(Ordering::Relaxed) {
        let mut st = sh.state.lock();
        let resident = st.pages.resident();
        if resident >= sh.budget.high_water() {
            ev.draining = true;
        }
        if st.paused || !ev.draining || resident <= sh.budget.low_water() {
            ev.draining = false;
            // Woken by an install reaching the high watermark, a fault finding no room, a
            // lowered budget, the end of a fork or shutdown (see crate::doorbell).
            if !sh.shutdown.load(Ordering::Relaxed) {
                sh.evict_cv.wait_for(&mut st, IDLE_WAIT);
            }
            continue;
        }
        let want = ((resident - sh.budget.low_water()) as usize).min(EVICT_BATCH);
        let more = pick_victims(&sh, &mut st, &mut ev, want);
        if ev.victims.is_empty() {
            drop(st);
            write_protect_samples(&sh, &mut ev.armed);
            if !more {
                // No pool slot free: wait for the sender.
                let mut st = sh.state.lock();
                sh.slots_cv.wait_for(&mut st, Duration::from_millis(20));
            }
            continue;
        }
        drop(st);
        write_protect_samples(&sh, &mut ev.armed);
        move_and_read(&sh, &mut ev);
        let round = ev.outcomes.len();
        let c = commit(&sh, &mut ev);
        publish(&sh, &c);
        let unmovable = ev.unmovable.len();
        let dropped = if unmovable == 0 {
            0
        } else {
            drop_unmovable(&sh, &mut ev)
        };
        after_round(
            &sh,
            &mut ev,
            round,
            c.refused + unmovable - dropped == round,
        );
    }
}

/// Picks up to `want` victims and gives each a pool slot; they become `Evicting`. Victims
/// and slots are then paired in ascending order, so that runs of neighbouring pages go to
/// neighbouring slots and move with one ioctl (see [`move_victims`]).
///
/// A dirty page the program may still be writing goes back to the tail instead: a write-heat
/// sample (armed, pushed on `ev.armed` for the caller to write-protect) or a page of a chunk
/// whose samples were written ([`farmem_policy::write_heat`]). A sample reached again still
/// armed was not written: it cools its chunk and is evicted. After [`KEPT_PER_ROUND`] such
/// pages the round ends, and returns true: call again at once (it may have no victim yet).
/// See [`Keeping`] for hot data larger than the budget.
fn pick_victims(sh: &Shared, st: &mut State, ev: &mut Evictor, want: usize) -> bool {
    let (victims, armed, keeping) = (&mut ev.victims, &mut ev.armed, &mut ev.keeping);
    let mut skipped = Vec::new();
    let (mut sampled, mut kept) = (0u64, 0u64);
    let mut more = false;
    while victims.len() < want {
        if sampled + kept >= KEPT_PER_ROUND {
            more = true;
            break;
        }
        let prefetched = st.pages.next_is_prefetched();
        let Some(p) = st.pages.pick_victim() else {
            break;
        };
        let addr = p as usize * PAGE_SIZE;
        let Some(e) = st.pages.get(addr).filter(|e| e.state.is_resident()) else {
            continue; // stale: the policy will not return it again
        };
        if e.state == PageState::ResidentDirty && !prefetched {
            if e.armed {
                if armed.contains(&addr) {
                    // Armed in this round: the queue went round (fewer pages resident than a
                    // round puts back). It had no chance yet; the next round, at once, takes
                    // it (not a wait for a pool slot: there may be no victim only for this).
                    st.pages.requeue(addr);
                    more = true;
                    break;
                }
                st.write_heat.sample_unwritten(p);
            } else if keeping.may_keep(st.pages.resident()) {
                match st.write_heat.on_dirty(p, sh.budget.limit()) {
                    Verdict::Sample if st.pages.arm(addr) => {
                        armed.push(addr);
                        sampled += 1;
                        keeping.since_victim += 1;
                        continue;
                    }
                    Verdict::Keep => {
                        st.pages.requeue(addr);
                        kept += 1;
                        keeping.since_victim += 1;
                        continue;
                    }
                    _ => {}
                }
            }
        }
        let Some(slot) = st.slots.take(&mut st.pages, &sh.pool, &sh.pf) else {
            skipped.push(addr);
            break;
        };
        sh.pf.left(addr);
        let Some(was_clean) = st.pages.begin_eviction(addr) else {
            st.slots.release_empty(slot);
            continue;
        };
        keeping.evicted();
        victims.push(Victim {
            addr,
            slot,
            was_clean,
        });
    }
    for addr in skipped {
        // No pool slot: put the page back and wait for the sender.
        st.pages.requeue(addr);
    }
    if sampled + kept > 0 {
        let mut s = sh.stats.lock();
        s.s.write_heat_samples += sampled;
        s.s.write_heat_kept += kept;
    }
    victims.sort_unstable_by_key(|v| v.addr);
    let closed = close_holes(sh, st, victims);
    if closed > 0 {
        victims.sort_unstable_by_key(|v| v.addr);
        sh.stats.lock().s.evicted_out_of_order += closed;
    }
    let mut slots: Vec<u32> = victims.iter().map(|v| v.slot).collect();
    slots.sort_unstable();
    for (v, slot) in victims.iter_mut().zip(slots) {
        v.slot = slot;
        st.slots.set_owner(slot, v.addr);
    }
    more
}

/// The addresses in holes of at most [`MAX_HOLE_PAGES`] pages between neighbouring victims
/// (`addrs` sorted).
fn holes(addrs: impl Iterator<Item = usize>) -> Vec<usize> {
    let mut out = Vec::new();
    let mut prev: Option<usize> = None;
    for a in addrs {
        if let Some(p) =
            prev.filter(|&p| a > p + PAGE_SIZE && a - p <= (MAX_HOLE_PAGES + 1) * PAGE_SIZE)
        {
            out.extend((p + PAGE_SIZE..a).step_by(PAGE_SIZE));
        }
        prev = Some(a);
    }
    out
}

/// Takes the resident pages in the holes between the round's victims (sorted by address) as
/// victims too, so that their runs MOVE as one ([`MAX_HOLE_PAGES`]). Skipped: pages not
/// resident, write-heat samples, and dirty pages the write heat would sample or keep. Returns
/// how many were added (the victims are then no longer sorted).
fn close_holes(sh: &Shared, st: &mut State, victims: &mut Vec<Victim>) -> u64 {
    let mut added = 0;
    for addr in holes(victims.iter().map(|v| v.addr)) {
        let Some(e) = st.pages.get(addr) else {
            continue;
        };
        let evictable = match e.state {
            PageState::ResidentClean => true,
            PageState::ResidentDirty => {
                st.write_heat
                    .on_dirty(crate::pages::pid_of(addr), sh.budget.limit())
                    == Verdict::Evict
            }
            _ => false,
        };
        if !evictable || e.armed {
            continue;
        }
        let Some(slot) = st.slots.take(&mut st.pages, &sh.pool, &sh.pf) else {
            break;
        };
        let Some(was_clean) = st.pages.begin_eviction_out_of_order(addr) else {
            st.slots.release_empty(slot);
            continue;
        };
        sh.pf.left(addr);
        victims.push(Victim {
            addr,
            slot,
            was_clean,
        });
        added += 1;
    }
    added
}

/// Bounds the pages the evictor keeps ([`pick_victims`]). When it has put back as many pages
/// in a row as are resident (every dirty page it reaches is hot: hot data larger than the
/// budget), it evicts the next `resident` pages in FIFO order before keeping any again, so
/// the work per page evicted stays bounded.
#[derive(Default)]
struct Keeping {
    /// Pages put back since the last victim was taken.
    since_victim: u64,
    /// Victims still to take in plain FIFO order.
    plain_left: u64,
}

impl Keeping {
    /// Whether a dirty page reached now may be kept or sampled.
    fn may_keep(&mut self, resident: u64) -> bool {
        if self.plain_left == 0 && self.since_victim >= resident {
            self.plain_left = resident;
            self.since_victim = 0;
        }
        self.plain_left == 0
    }

    /// A victim was taken.
    fn evicted(&mut self) {
        self.since_victim = 0;
        self.plain_left = self.plain_left.saturating_sub(1);
    }
}

/// Write-protects the pages [`pick_victims`] armed, a run of neighbours per ioctl, and
/// empties `armed`. Done without the state lock (the ioctl flushes TLBs): a page that changed
/// meanwhile only loses its sample. A write before the ioctl is not seen, and a sample that
/// could not be protected comes back unwritten: both only cool its chunk.
fn write_protect_samples(sh: &Shared, armed: &mut Vec<usize>) {
    armed.sort_unstable();
    for (i, j) in runs(armed.len(), |k| armed[k] == armed[k - 1] + PAGE_SIZE) {
        if let Err(e) = sh
            .uffd
            .writeprotect(armed[i], (j - i) * PAGE_SIZE, true, false)
        {
            tracing::debug!(
                "write-heat samples at {:#x} not write-protected: {e}",
                armed[i]
            );
        }
    }
    armed.clear();
}

/// Whether far page `far` lives in a memory slab (the host tier, or a local slab).
fn in_memory(sh: &Shared, far: u64) -> bool {
    far != crate::pages::NO_FAR && matches!(sh.far.home(far), Some((Home::Memory(_), _)))
}

/// Whether the page in pool slot `slot` equals far page `far`'s copy in a memory slab (it
/// came back from there and was not changed).
fn unchanged_in_memory(sh: &Shared, st: &State, far: u64, slot: u32) -> bool {
    let Some((Home::Memory(m), page)) = sh.far.home(far) else {
        return false;
    };
    crate::mm::with_page_bytes(sh.pool.mapping(), slot, |src| {
        st.mem.read(m, page, |old| old == src) == Some(true)
    })
}

/// A victim whose copy is in a memory slab does not stay in the write-back pool: a later
/// fault copies it from the slab as cheaply as a pool hit would move it back, and its slot is
/// discarded with the next batch and reused at once. Keeping such pages cached filled the
/// pool, so every victim took a reclaimed slot from a scattered free list and neighbouring
/// victims could not be MOVEd as one run: 2 pages per UFFDIO_MOVE on a sequential scan, each
/// MOVE a TLB shootdown on the other CPU.
fn leave_pool(st: &mut State, addr: usize, slot: u32) {
    if st.pages.reclaim(addr, slot) {
        st.slots.release_stale(slot);
    }
}

/// MOVEs the victims into their slots and finds the all-zero ones among the dirty (the slots
/// are the evictor's alone until the commit, which copies the dirty pages where they go).
fn move_and_read(sh: &Shared, ev: &mut Evictor) {
    let (moved, moves) = move_victims(sh, &ev.victims);
    sh.stats.lock().s.evict_moves += moves;
    for (v, r) in ev.victims.drain(..).zip(moved) {
        let zero = r.is_ok()
            && !v.was_clean
            && crate::mm::with_page_bytes(sh.pool.mapping(), v.slot, |page| {
                page.iter().all(|b| *b == 0)
            });
        ev.outcomes.push((v, r, zero));
    }
}

/// Commits a round's outcomes under the state lock.
fn commit(sh: &Shared, ev: &mut Evictor) -> Committed {
    let mut st = sh.state.lock();
    let mut c = Committed::default();
    for (v, r, zero) in ev.outcomes.drain(..) {
        let still = st.pages.get(v.addr).map(|e| e.state) == Some(PageState::Evicting);
        if !still {
            // Released (or unmapped) while being evicted: whatever moved is garbage.
            if r.is_ok() {
                st.slots.release_stale(v.slot);
            } else {
                st.slots.release_empty(v.slot);
            }
            st.pages.eviction_lost();
            continue;
        }
        match r {
            // Shared copy-on-write with a forked process (MOVE takes exclusive pages only, and
            // the page stays shared until this side writes it, even after the other exits:
            // EBUSY), or in a range the program made read-only or inaccessible with mprotect
            // (MOVE takes pages of writable ranges only: EINVAL): it stays `Evicting`, with its
            // slot, and is dropped after this commit. A page that cannot be dropped either
            // (mlocked) stays resident there.
            Err(err) if matches!(err.errno(), Some(libc::EBUSY | libc::EINVAL)) => {
                st.drops.begin(v.addr, v.slot);
                let why = match err.errno() {
                    Some(libc::EBUSY) => Unmovable::Shared,
                    _ => Unmovable::NotWritable,
                };
                ev.unmovable.push((v, why));
            }
            Err(err) => {
                // Not moved (gone: ENOENT; a slot already full: EEXIST): stays resident. A slot that
                // turned out to hold a page (EEXIST) is discarded before it is used again.
                if matches!(err, UffdError::Exists { .. }) {
                    tracing::warn!(
                        "pool slot {} held a page when it was given to the evictor; it is \
                         discarded",
                        v.slot
                    );
                    st.slots.release_stale(v.slot);
                } else {
                    st.slots.release_empty(v.slot);
                }
                c.refused += 1;
                st.pages.refuse_eviction(v.addr, v.was_clean);
                tracing::debug!("evicting {:#x} failed: {err}", v.addr);
            }
            Ok(()) if v.was_clean => {
                st.pages.commit_clean(v.addr, v.slot);
                let far = st.pages.get(v.addr).map_or(crate::pages::NO_FAR, |e| e.far);
                if in_memory(sh, far) {
                    leave_pool(&mut st, v.addr, v.slot);
                } else {
                    st.slots.cache(v.slot);
                }
                c.clean += 1;
            }
            Ok(()) if zero => {
                if let Some(far) = st.pages.commit_zero(v.addr) {
                    st.far_pages.free(far);
                }
                st.slots.release_stale(v.slot);
                c.zero += 1;
            }
            Ok(()) => {
                let far = match st.pages.get(v.addr).map(|e| e.far) {
                    Some(f) if f != crate::pages::NO_FAR => {
                        if st.far_pages.is_frozen(f) && !unchanged_in_memory(sh, &st, f, v.slot) {
                            // A forked child reads this far page ([`crate::fork`]): the new
                            // contents go to a new one, the old is reused once it is thawed.
                            st.far_pages.free(f);
                            st.far_pages.alloc()
                        } else {
                            f
                        }
                    }
                    _ => st.far_pages.alloc(),
                };
                st.stage_gen = st.stage_gen.wrapping_add(1);
                let gen = st.stage_gen;
                st.pages.commit_dirty(v.addr, v.slot, gen, far);
                // Its slab is in memory (the host tier): one copy there and it is written
                // back, no message. Else it is staged for the sender.
                if let Some((Home::Memory(m), page)) = sh.far.home(far) {
                    let s = &mut *st;
                    // A page read from its slab is installed writable (no write-protect fault
                    // on its first write, see `fault::serve_from_memory`): one that comes back
                    // unchanged is not written again, so its slab copy stays clean for the
                    // write-through.
                    let (same, written) =
                        crate::mm::with_page_bytes(sh.pool.mapping(), v.slot, |src| {
                            if s.mem.read(m, page, |old| old == src) == Some(true) {
                                (true, true)
                            } else {
                                (false, s.mem.write(m, page, src))
                            }
                        });
                    s.write_heat.evicted(crate::pages::pid_of(v.addr), !same);
                    if written && s.pages.mark_sent(v.addr, Some(v.slot), gen) {
                        leave_pool(s, v.addr, v.slot);
                        if same {
                            c.clean += 1;
                        } else {
                            c.to_memory += 1;
                        }
                        continue;
                    }
                }
                if !matches!(sh.far.home(far), Some((Home::Memory(_), _))) {
                    // Bound for a donor: whether it changed is not known here.
                    st.write_heat.evicted(crate::pages::pid_of(v.addr), true);
                }
                let data = crate::mm::with_page_bytes(sh.pool.mapping(), v.slot, |src| {
                    src.to_vec().into_boxed_slice()
                });
                st.staging.push_back(Staged {
                    addr: v.addr,
                    slot: v.slot,
                    gen,
                    far,
                    data,
                    sealed: false,
                });
                c.staged += 1;
            }
        }
    }
    c
}

/// After a round: if nothing could be moved three rounds in a row (one such round happens
/// when the victims were released or faulted meanwhile), let faults go over the budget
/// instead of waiting for this thread, and try again later, backing off.
fn after_round(sh: &Shared, ev: &mut Evictor, round: usize, stalled: bool) {
    ev.stalled_rounds = if stalled { ev.stalled_rounds + 1 } else { 0 };
    if ev.stalled_rounds >= 3 {
        sh.evictor_blocked.store(true, Ordering::Relaxed);
        if ev
            .last_stall_log
            .is_none_or(|t| t.elapsed() >= Duration::from_secs(30))
        {
            ev.last_stall_log = Some(Instant::now());
            tracing::warn!(
                "the evictor can neither move nor drop any of {round} victims (mlocked, or \
                 released or remapped while being evicted): resident memory exceeds the budget \
                 until they can be evicted; retrying"
            );
        }
        let mut st = sh.state.lock();
        sh.evict_cv.wait_for(&mut st, ev.stall_backoff);
        ev.stall_backoff = (ev.stall_backoff * 2).min(Duration::from_secs(1));
    } else {
        sh.evictor_blocked.store(false, Ordering::Relaxed);
        ev.stall_backoff = Duration::from_millis(10);
    }
}

/// Moves every victim out of its region into its pool slot; one result per victim, in order.
/// A run of neighbouring pages bound for neighbouring slots moves with one UFFDIO_MOVE: each
/// ioctl flushes the TLB of every CPU the process runs on (an IPI, a hypervisor exit here),
/// and one ioctl for 64 pages cost 0.39 µs a page against 14.4 µs for 64 single-page ones
/// (measured on this machine with a second thread running). If a run fails part-way, the
/// slots say which pages moved (a slot is empty until its page arrives) and the rest are
/// moved one by one, so each gets its own outcome (EBUSY: shared after a fork).
fn move_victims(sh: &Shared, victims: &[Victim]) -> (Vec<Result<(), UffdError>>, u64) {
    let mut out: Vec<Result<(), UffdError>> = Vec::with_capacity(victims.len());
    let mut moves = 0u64;
    let neighbours = |k: usize| {
        victims[k].addr == victims[k - 1].addr + PAGE_SIZE
            && victims[k].slot == victims[k - 1].slot + 1
    };
    for (i, j) in runs(victims.len(), neighbours) {
        let run = &victims[i..j];
        let dst = sh.slot_addr(run[0].slot);
        let r = crate::mm::move_to_pool(&sh.pool_uffd, dst, run[0].addr, run.len() * PAGE_SIZE);
        moves += 1;
        match r {
            Ok(n) if n == run.len() * PAGE_SIZE => out.extend(run.iter().map(|_| Ok(()))),
            // Not all of the run moved: each page is looked at where it is, and tried alone if
            // it is still in the region. Trusting the reported count (or probing the slots
            // alone) put entries of pages that had left the region back to resident with
            // nothing mapped, and the next access got SIGBUS (kernel 6.18; see the docs).
            Ok(_) | Err(_) if run.len() > 1 => {
                for v in run {
                    if moved_anyway(sh, v) {
                        out.push(Ok(()));
                        continue;
                    }
                    out.push(move_one(sh, v));
                    moves += 1;
                }
            }
            r if r.is_err() => out.push(match moved_anyway(sh, &run[0]) {
                true => Ok(()),
                false => r.map(|_| ()),
            }),
            r => out.push(r.map(|_| ())),
        }
    }
    (out, moves)
}

/// MOVEs one victim into its slot; an error is checked against where the page is (see
/// [`moved_anyway`]).
fn move_one(sh: &Shared, v: &Victim) -> Result<(), UffdError> {
    match crate::mm::move_to_pool(&sh.pool_uffd, sh.slot_addr(v.slot), v.addr, PAGE_SIZE) {
        Ok(_) => Ok(()),
        Err(_) if moved_anyway(sh, v) => Ok(()),
        Err(e) => Err(e),
    }
}

/// Whether a victim's page is in its slot and gone from the region: moved, whatever the
/// MOVE that moved it reported. A slot that held a page before (EEXIST) is told apart by the
/// region page, which is then still there.
fn moved_anyway(sh: &Shared, v: &Victim) -> bool {
    let mut slot = [0u8; 1];
    let mut region = [0u8; 1];
    sh.pool
        .mapping()
        .mincore(v.slot as usize, &mut slot)
        .is_ok()
        && slot[0] & 1 != 0
        && farmem_mm::mincore(v.addr, &mut region).is_ok()
        && region[0] & 1 == 0
}

/// Drops the victims MOVE refused ([`crate::cow`]) and commits them: each is committed where it is now (an mremap may have moved it) if it left this
/// process; one still mapped there stays resident, one released meanwhile is forgotten.
/// Each drop waits for the fault thread to read its REMOVE event, so faults wait in that
/// thread's queue meanwhile (`dropping`). Returns how many pages were dropped.
fn drop_unmovable(sh: &Shared, ev: &mut Evictor) -> usize {
    sh.dropping.store(true, Ordering::Release);
    sh.commit_cv.notify_all();
    let pages: Vec<(usize, u32)> = ev.unmovable.iter().map(|(v, _)| (v.addr, v.slot)).collect();
    let done = crate::cow::copy_and_drop(sh, &pages);
    sh.dropping.store(false, Ordering::Release);
    let mut dropped = 0;
    let (mut shared, mut not_writable) = (0u64, 0u64);
    let mut kept = 0usize;
    {
        let mut st = sh.state.lock();
        for ((mut v, why), copied) in ev.unmovable.drain(..).zip(done) {
            let Some((now, slot)) = st.drops.finish(v.addr) else {
                debug_assert!(false, "no drop record for {:#x}", v.addr);
                continue;
            };
            let evicting = st.pages.get(now).map(|e| e.state) == Some(PageState::Evicting);
            if !evicting {
                // Released or unmapped meanwhile (maybe unregistered first, when the madvise
                // raised no event): a REMOVE still to come for it releases nothing.
                st.drops.unexpect_remove(v.addr);
            }
            v.addr = now;
            v.slot = slot;
            v.was_clean &= copied;
            // Decided by where the page is: a madvise over several mappings may have failed
            // part-way, and an mremap may have moved the page before it was dropped.
            if evicting && crate::mm::is_present(now) {
                // Still mapped: stays resident, written out when picked again (it may be
                // write-protected for the copy: a write marks it dirty as usual).
                st.pages.refuse_eviction(now, false);
                st.slots.release_stale(slot);
                kept += 1;
                continue;
            }
            // Gone without a copy: the program released it (its REMOVE is on its way), so
            // it reads zeros; committed as a zero page.
            let zero = !copied
                || (!v.was_clean
                    && crate::mm::with_page_bytes(sh.pool.mapping(), slot, |page| {
                        page.iter().all(|b| *b == 0)
                    }));
            if copied && evicting {
                dropped += 1;
                match why {
                    Unmovable::Shared => shared += 1,
                    Unmovable::NotWritable => not_writable += 1,
                }
            }
            // Not `Evicting` any more (released meanwhile): the commit forgets it.
            ev.outcomes.push((v, Ok(()), zero));
        }
    }
    let mut c = commit(sh, ev);
    c.refused += kept;
    publish(sh, &c);
    if dropped > 0 {
        let mut s = sh.stats.lock();
        s.s.shared_pages_dropped += shared;
        s.s.not_writable_pages_dropped += not_writable;
    }
    dropped
}

/// After a commit: wakes whoever waits for what it did, and counts it.
fn publish(sh: &Shared, c: &Committed) {
    sh.commit_cv.notify_all();
    if c.staged > 0 {
        sh.stage_cv.notify_one();
    }
    if c.to_memory > 0 {
        sh.slots_cv.notify_all();
    }
    if c.clean > 0 || c.zero > 0 || c.refused > 0 || c.to_memory > 0 {
        let mut s = sh.stats.lock();
        s.s.tier_pages_written += c.to_memory;
        s.s.evicted_dropped_clean += c.clean;
        s.s.evicted_zero += c.zero;
        s.s.evictions_refused += c.refused as u64;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pages(ps: &[usize]) -> Vec<usize> {
        ps.iter().map(|p| p * PAGE_SIZE).collect()
    }

    #[test]
    fn holes_of_one_or_two_pages_are_closed_and_wider_ones_left() {
        // 10..12 and 13 are neighbours but for page 12; 15 leaves 14 (one page); 18 leaves
        // 16 and 17 (two); 22 leaves three pages, too wide.
        let got = holes(pages(&[10, 11, 13, 15, 18, 22]).into_iter());
        assert_eq!(got, pages(&[12, 14, 16, 17]));
    }

    #[test]
    fn neighbours_and_a_lone_victim_have_no_holes() {
        assert!(holes(pages(&[1, 2, 3, 4]).into_iter()).is_empty());
        assert!(holes(pages(&[7]).into_iter()).is_empty());
        assert!(holes(std::iter::empty()).is_empty());
    }
}
