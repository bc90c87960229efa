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
//!   this process instead ([`crate::threads::cow`]), after the round's commit. While nothing can be
//!   moved or dropped (mlocked memory), resident memory exceeds the budget.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use farmem_policy::write_heat::Verdict;
use farmem_uffd::UffdError;

use crate::budget::EVICT_BATCH;
use crate::doorbell::IDLE_WAIT;
use crate::pages::PageState;
use crate::runs::runs;

mod commit;
mod moves;
mod plan;

use commit::{commit, publish};

use crate::shared::{Shared, State};
use farmem_proto::PAGE_SIZE;
use moves::{drop_unmovable, move_victims};
use plan::{AfterRound, Drain, Keeping, Stall};

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
pub(super) const MAX_HOLE_PAGES: usize = 2;

/// Dirty pages a round may put back at the tail (write-heat samples and pages of chunks the
/// program keeps writing, [`farmem_policy::write_heat`]) before it lets go of the state lock,
/// so a long run of such pages at the head does not hold faults back.
pub(super) const KEPT_PER_ROUND: u64 = 256;

/// Why MOVE refused a victim that is then dropped instead ([`crate::threads::cow`]).
#[derive(Clone, Copy)]
pub(super) enum Unmovable {
    /// Shared copy-on-write with a forked process (EBUSY).
    Shared,
    /// In a range the program made read-only or inaccessible with mprotect (EINVAL).
    NotWritable,
}

/// One picked victim.
pub(super) struct Victim {
    addr: usize,
    slot: u32,
    was_clean: bool,
}

/// What happened to one victim: MOVE result, and whether it is a dirty all-zero page.
type Outcome = (Victim, Result<(), UffdError>, bool);

/// What one commit did, for the counters and the stall detection.
#[derive(Default)]
pub(super) struct Committed {
    clean: u64,
    zero: u64,
    refused: usize,
    staged: usize,
    /// Dirty pages written straight into a memory slab.
    to_memory: u64,
}

/// The evictor's state between rounds.
pub(super) struct Evictor {
    victims: Vec<Victim>,
    /// Dirty pages this round armed as write-heat samples, to write-protect.
    armed: Vec<usize>,
    keeping: Keeping,
    outcomes: Vec<Outcome>,
    drain: Drain,
    /// Victims MOVE refused (shared with a forked process, or in a range that is not
    /// writable), still `Evicting`, to drop after the commit ([`crate::threads::cow`]).
    unmovable: Vec<(Victim, Unmovable)>,
    stall: Stall,
}

/// The evictor. Runs until shutdown.
pub(crate) fn evict_loop(sh: Arc<Shared>) {
    let mut ev = Evictor {
        victims: Vec::with_capacity(EVICT_BATCH),
        armed: Vec::new(),
        keeping: Keeping::default(),
        outcomes: Vec::new(),
        drain: Drain::default(),
        unmovable: Vec::new(),
        stall: Stall::default(),
    };
    while !sh.shutdown.load(Ordering::Relaxed) {
        let mut st = sh.state.lock();
        let resident = st.pages.resident();
        let (high, low) = (sh.budget.high_water(), sh.budget.low_water());
        let Some(want) = ev.drain.want(resident, high, low, st.paused) else {
            // Woken by an install reaching the high watermark, a fault finding no room, a
            // lowered budget, the end of a fork or shutdown (see crate::doorbell).
            if !sh.shutdown.load(Ordering::Relaxed) {
                sh.evict_cv.wait_for(&mut st, IDLE_WAIT);
            }
            continue;
        };
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
            match hold_dirty(sh, st, armed, keeping, p, e.armed) {
                Dirty::Evict => {}
                Dirty::Sampled => {
                    sampled += 1;
                    continue;
                }
                Dirty::Kept => {
                    kept += 1;
                    continue;
                }
                Dirty::WentRound => {
                    more = true;
                    break;
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
    pair_slots(sh, st, victims);
    more
}

/// What [`pick_victims`] does with a dirty page the policy picked.
enum Dirty {
    /// Evict it.
    Evict,
    /// Armed as a write-heat sample (write-protected by the caller): not evicted now.
    Sampled,
    /// Kept: its chunk is being written; back to the tail.
    Kept,
    /// Armed in this round already: the queue went round; the round ends.
    WentRound,
}

/// Whether the dirty page `p` (armed as a sample: `armed_sample`) is evicted or held back
/// ([`farmem_policy::write_heat`]); a page held back is requeued or armed here.
fn hold_dirty(
    sh: &Shared,
    st: &mut State,
    armed: &mut Vec<usize>,
    keeping: &mut Keeping,
    p: u64,
    armed_sample: bool,
) -> Dirty {
    let addr = p as usize * PAGE_SIZE;
    if armed_sample {
        if armed.contains(&addr) {
            // Armed in this round: the queue went round (fewer pages resident than a round
            // puts back). It had no chance yet; the next round, at once, takes it (not a wait
            // for a pool slot: there may be no victim only for this).
            st.pages.requeue(addr);
            return Dirty::WentRound;
        }
        st.write_heat.sample_unwritten(p);
    } else if keeping.may_keep(st.pages.resident()) {
        match st.write_heat.on_dirty(p, sh.budget.limit()) {
            Verdict::Sample if st.pages.arm(addr) => {
                armed.push(addr);
                keeping.kept();
                return Dirty::Sampled;
            }
            Verdict::Keep => {
                st.pages.requeue(addr);
                keeping.kept();
                return Dirty::Kept;
            }
            _ => {}
        }
    }
    Dirty::Evict
}

/// Sorts the victims by address (closing small holes between them, [`close_holes`]) and
/// pairs them with their slots in ascending order, so runs of neighbouring pages go to
/// neighbouring slots.
fn pair_slots(sh: &Shared, st: &mut State, victims: &mut Vec<Victim>) {
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

/// After a round: if nothing could be moved several rounds in a row, let faults go over the
/// budget instead of waiting for this thread, and try again later, backing off ([`Stall`]).
fn after_round(sh: &Shared, ev: &mut Evictor, round: usize, stalled: bool) {
    match ev.stall.after_round(stalled, Instant::now()) {
        AfterRound::Going => sh.evictor_blocked.store(false, Ordering::Relaxed),
        AfterRound::Blocked { wait, say } => {
            sh.evictor_blocked.store(true, Ordering::Relaxed);
            if say {
                tracing::warn!(
                    "the evictor can neither move nor drop any of {round} victims (mlocked, or \
                     released or remapped while being evicted): resident memory exceeds the \
                     budget until they can be evicted; retrying"
                );
            }
            let mut st = sh.state.lock();
            sh.evict_cv.wait_for(&mut st, wait);
        }
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
