//! Committing an evictor round: each victim's outcome recorded in the page table (sent to the
//! pool, dropped clean, refused), and who waits for it woken ([`publish`]).

use crate::far::Home;
use crate::pages::PageState;
use crate::shared::{Shared, Staged, State};
use farmem_uffd::UffdError;

use super::{Committed, Evictor, Unmovable, Victim};

/// Commits a round's outcomes under the state lock.
pub(super) fn commit(sh: &Shared, ev: &mut Evictor) -> Committed {
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
            Err(err) if err.errno() == Some(libc::ENOENT) && gone_released(sh, &mut st, &v) => {
                st.slots.release_empty(v.slot);
            }
            Err(err) => commit_refused(&mut st, &v, &err, &mut c),
            Ok(()) if v.was_clean => commit_clean(sh, &mut st, &v, &mut c),
            Ok(()) if zero => {
                if let Some(far) = st.pages.commit_zero(v.addr) {
                    st.far_pages.free(far);
                }
                st.slots.release_stale(v.slot);
                c.zero += 1;
            }
            Ok(()) => commit_dirty(sh, &mut st, &v, &mut c),
        }
    }
    c
}

/// A victim that was gone from its region (ENOENT) after a zero install: a program release
/// the kernel applied late took it ([`crate::threads::events::released_late`]); it is
/// released, and its eviction settled. False for any other page.
fn gone_released(sh: &Shared, st: &mut State, v: &Victim) -> bool {
    let Some(e) = st.pages.get(v.addr) else {
        return false;
    };
    if !crate::threads::events::released_late(sh, st, v.addr, e) {
        return false;
    }
    // Released from `Evicting`: its residency is settled here, as for a page released
    // while being evicted.
    st.pages.eviction_lost();
    true
}

/// Not moved (gone: ENOENT; a slot already full: EEXIST): stays resident. A slot that turned
/// out to hold a page (EEXIST) is discarded before it is used again.
fn commit_refused(st: &mut State, v: &Victim, err: &UffdError, c: &mut Committed) {
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

/// A clean page moved to the pool: its far copy is up to date, so it stays cached in the pool
/// (or leaves it at once when that copy is in a memory slab).
fn commit_clean(sh: &Shared, st: &mut State, v: &Victim, c: &mut Committed) {
    st.pages.commit_clean(v.addr, v.slot);
    let far = st.pages.get(v.addr).map_or(crate::pages::NO_FAR, |e| e.far);
    if in_memory(sh, far) {
        leave_pool(st, v.addr, v.slot);
    } else {
        st.slots.cache(v.slot);
    }
    c.clean += 1;
}

/// A dirty page moved to the pool: it gets a far page, and is written to its memory slab at
/// once or staged for the sender.
fn commit_dirty(sh: &Shared, st: &mut State, v: &Victim, c: &mut Committed) {
    let far = far_for_dirty(sh, st, v);
    st.stage_gen = st.stage_gen.wrapping_add(1);
    let gen = st.stage_gen;
    st.pages.commit_dirty(v.addr, v.slot, gen, far);
    // Its slab is in memory (the host tier): one copy there and it is written back, no
    // message. Else it is staged for the sender.
    if let Some((Home::Memory(m), page)) = sh.far.home(far) {
        if write_to_memory(sh, st, v, gen, m, page, c) {
            return;
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

/// The far page a dirty victim goes to: its own, a new one when a forked child reads its own
/// (frozen) and the contents changed, or a new one when it has none.
fn far_for_dirty(sh: &Shared, st: &mut State, v: &Victim) -> u64 {
    match st.pages.get(v.addr).map(|e| e.far) {
        Some(f) if f != crate::pages::NO_FAR => {
            if st.far_pages.is_frozen(f) && !unchanged_in_memory(sh, st, f, v.slot) {
                // A forked child reads this far page ([`crate::fork`]): the new contents go
                // to a new one, the old is reused once it is thawed.
                st.far_pages.free(f);
                st.far_pages.alloc()
            } else {
                f
            }
        }
        _ => st.far_pages.alloc(),
    }
}

/// Writes a dirty victim into its memory slab `m` at `page`; true when it is written back
/// and left the pool (nothing to stage).
fn write_to_memory(
    sh: &Shared,
    s: &mut State,
    v: &Victim,
    gen: u32,
    m: u32,
    page: u32,
    c: &mut Committed,
) -> bool {
    // A page read from its slab is installed writable (no write-protect fault on its first
    // write, see `fault::serve_from_memory`): one that comes back unchanged is not written
    // again, so its slab copy stays clean for the write-through.
    let (same, written) = crate::mm::with_page_bytes(sh.pool.mapping(), v.slot, |src| {
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
        return true;
    }
    false
}

/// After a commit: wakes whoever waits for what it did, and counts it.
pub(super) fn publish(sh: &Shared, c: &Committed) {
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
