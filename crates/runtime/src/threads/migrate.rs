//! Giving slabs back to a donor that asks for its memory (Valet's migration): the heal thread
//! polls each live donor's RECLAIMS about four times a second ([`poll`]) and moves every slab
//! named off that donor before freeing it there, so the donor's memory falls while the program
//! keeps running and loses nothing.
//!
//! # Design
//!
//! Where a slab named goes, in order of preference:
//! 1. to a live donor that holds no copy of it, copied like a re-replication
//!    ([`crate::copies::slabcopy::copy_slab`], from the asking donor's own copy, which is still complete);
//! 2. nowhere, when another live donor already holds a complete copy: the asking donor's copy
//!    is simply dropped (the slab runs with one copy fewer until a donor has room);
//! 3. into this process's memory (a local memory slab, [`crate::slabs::memslabs`]) when the asking
//!    donor holds the only copy: pages are read in batches (and opened, when sealed) into
//!    private memory, and the slab's home switches to it with the copy gate held and the state
//!    lock taken, so no write-back and no fault sees half a move. That memory is beyond the
//!    budget: the price of not losing pages when nowhere else can take them (swap has no
//!    better answer); the stats count it in `local_slabs`.
//!
//! A memory slab's donor copy that is named is dropped and freed; the write-through makes a new
//! one elsewhere. Every slab moved is freed on the donor at once — but a slab holding far pages
//! frozen for a forked child, which reads them there ([`crate::fork`]), is left until the
//! child is gone (the donor asks again; moved and freed, the child's reads would fail).

use farmem_mm::{Advice, Mapping};
use farmem_transport::PageAddr;

use crate::copies::slabcopy::{copy_slab, Source};
use crate::error::RuntimeError;
use crate::far::Home;
use crate::shared::Shared;
use crate::slabs::memslabs::MemKind;
use crate::slabs::replicas::{Replica, Replicas};
use farmem_proto::PAGE_SIZE;

/// Asks every live donor which of this runtime's slabs it wants back and moves them.
pub(crate) fn poll(sh: &Shared) {
    for d in 0..sh.far.donors.len() {
        if !sh.far.donors[d].health.is_live() {
            continue;
        }
        let wanted = match sh.far.donors[d].write.reclaims() {
            Ok(w) => w,
            Err(e) => {
                sh.far.on_error(d, &e);
                continue;
            }
        };
        for slab in wanted {
            if sh.shutdown.load(std::sync::atomic::Ordering::Relaxed) {
                return;
            }
            match give_back(sh, d, slab) {
                Ok(true) => sh.stats.lock().s.slabs_migrated += 1,
                Ok(false) => {}
                Err(e) => tracing::warn!(
                    "donor {} asked for slab {slab} back; moving it failed (asked again \
                     later): {e}",
                    sh.far.donors[d].write.addr()
                ),
            }
        }
    }
}

/// Moves every far slab packed into donor `d`'s slab `slab` elsewhere and frees it there.
/// `Ok(false)`: not one of this runtime's (already given back), or kept for now.
fn give_back(sh: &Shared, d: usize, slab: u32) -> Result<bool, RuntimeError> {
    let far = &sh.far;
    // No new far slab goes into it while its far slabs move out.
    let pieces = far.donors[d].pack.lock().close(slab);
    let on_it: Vec<(u64, Replicas, Replica)> = far
        .donor_slabs()
        .into_iter()
        .filter_map(|(idx, r)| {
            let x = r
                .as_slice()
                .iter()
                .find(|x| x.donor == d && x.slab == slab)
                .copied();
            x.map(|x| (idx, r, x))
        })
        .collect();
    if let Some((idx, ..)) = on_it.iter().find(|(idx, ..)| lent(sh, *idx)) {
        tracing::debug!(
            "donor {} asked for slab {slab} back: kept while a forked child reads far slab \
             {idx} in it",
            far.donors[d].write.addr()
        );
        return Ok(false);
    }
    for (idx, r, x) in &on_it {
        if !move_slab(sh, *idx, *r, *x)? {
            return Ok(false);
        }
    }
    let memory_copies = drop_memory_copies(sh, d, slab);
    // Stale copies dropped there earlier go with it (never freed twice: the id may be reused).
    let stale = {
        let mut dropped = far.dropped.lock();
        let before = dropped.len();
        dropped.retain(|x| !(x.donor == d && x.slab == slab));
        before - dropped.len()
    };
    if pieces == 0 && on_it.is_empty() && memory_copies == 0 && stale == 0 {
        return Ok(false);
    }
    far.donors[d]
        .write
        .free_slab(slab)
        .map_err(|source| RuntimeError::Donor {
            addr: far.donors[d].write.addr().to_string(),
            step: "freeing a slab given back",
            source,
        })?;
    far.donors[d].pack.lock().forget(slab);
    let mut placed = far.donors[d].slabs_placed.lock();
    *placed = placed.saturating_sub((on_it.len() + memory_copies) as u64);
    Ok(true)
}

/// Whether far slab `idx` holds far pages frozen for a forked child, which reads its copies
/// as they were at the fork: moved or freed under it, its reads would fail, so it is asked
/// for again once the child is gone. Checked again, with the copy gate and the state lock
/// held, right before a move is committed: a fork may lend the slab while its pages are
/// copied.
fn lent(sh: &Shared, idx: u64) -> bool {
    sh.state
        .lock()
        .far_pages
        .any_frozen_in_slab(idx, sh.far.slab_pages)
}

/// How a far slab moves off the donor asking for it back.
#[derive(Debug, PartialEq, Eq)]
struct MovePlan {
    /// A live donor without a copy may take one: copy the slab there first.
    copy: bool,
    /// What happens when no copy was made.
    otherwise: Otherwise,
}

/// What happens to a slab that could not be copied to another donor.
#[derive(Debug, PartialEq, Eq)]
enum Otherwise {
    /// Another live donor holds a complete copy: the asking donor's copy is just dropped.
    DropCopy,
    /// The asking donor holds the only copy: the slab moves into this process's memory.
    ToLocalMemory,
}

/// Decides how a far slab with copies `r` moves off donor `d`, of `donors` donors (`live`
/// says which are): see the module doc.
fn plan_move(r: &Replicas, d: usize, donors: usize, live: impl Fn(usize) -> bool) -> MovePlan {
    let copy = (0..donors).any(|x| !r.has(x) && live(x));
    let other_copy = r.readable().any(|x| x.donor != d && live(x.donor));
    let otherwise = if other_copy {
        Otherwise::DropCopy
    } else {
        Otherwise::ToLocalMemory
    };
    MovePlan { copy, otherwise }
}

/// Moves far slab `idx` (copies `r`) off the donor of its copy `x`: see the module doc.
/// `Ok(false)`: a fork lent the slab meanwhile, and that copy stays.
fn move_slab(sh: &Shared, idx: u64, r: Replicas, x: Replica) -> Result<bool, RuntimeError> {
    let far = &sh.far;
    let d = x.donor;
    let plan = plan_move(&r, d, far.donors.len(), |x| far.donors[x].health.is_live());
    if plan.copy && copy_slab(sh, idx, r, Source::Donor(x)).is_ok() {
        // Copied: the asking donor's copy is one too many now.
    } else if plan.otherwise == Otherwise::ToLocalMemory {
        return to_local_memory(sh, idx, x);
    }
    let _gate = far.copy_gate.write();
    if lent(sh, idx) {
        return Ok(false); // the new copy stays too: one more than wanted, until given back
    }
    far.update_replicas(idx, |x| {
        x.remove(d);
    });
    Ok(true)
}

/// Takes donor `d`'s copies in its slab `slab` away from the memory slabs holding them; their
/// pages are written through again to new copies. Returns how many.
fn drop_memory_copies(sh: &Shared, d: usize, slab: u32) -> usize {
    let _gate = sh.far.copy_gate.write();
    let mut st = sh.state.lock();
    let mut dropped = 0;
    for m in st.mem.oldest_first() {
        if let Some(s) = st.mem.get_mut(m) {
            if s.donors
                .as_slice()
                .iter()
                .any(|x| x.donor == d && x.slab == slab)
            {
                s.donors.remove(d);
                s.mark_all_unflushed();
                dropped += 1;
            }
        }
    }
    dropped
}

/// Moves far slab `idx`, whose only copy is `x`, into private memory of this process, and
/// makes that its home. `Ok(false)`: a fork lent the slab meanwhile, and it stays on the
/// donor.
fn to_local_memory(sh: &Shared, idx: u64, x: Replica) -> Result<bool, RuntimeError> {
    let far = &sh.far;
    let (d, slab) = (x.donor, x.slab);
    let pages = far.slab_pages as usize;
    let local = Mapping::anonymous(pages * PAGE_SIZE).map_err(|source| RuntimeError::Mmap {
        op: "mapping local memory for a slab a donor asked back",
        len_bytes: pages * PAGE_SIZE,
        source,
    })?;
    local.advise(Advice::DontFork);
    local.advise(Advice::NoHugePage);
    // No write to the slab's copies while it moves (the sender would write the donor's copy
    // after it was read).
    let _gate = far.copy_gate.write();
    let first_far = idx * far.slab_pages;
    let batch = farmem_transport::MAX_BATCH_PAGES;
    let mut data = vec![0u8; batch * PAGE_SIZE];
    for start in (0..pages).step_by(batch) {
        let n = batch.min(pages - start);
        let addrs: Vec<PageAddr> = (start..start + n).map(|p| x.addr(p as u32)).collect();
        let buf = &mut data[..n * PAGE_SIZE];
        far.donors[d]
            .write
            .read_pages(&addrs, buf)
            .map_err(|source| RuntimeError::Donor {
                addr: far.donors[d].write.addr().to_string(),
                step: "reading a slab to take it into local memory",
                source,
            })?;
        for (i, page) in buf.chunks_exact_mut(PAGE_SIZE).enumerate() {
            let p = start + i;
            // A page never sent has no seal and holds nothing: it stays zero.
            if far.open(first_far + p as u64, page).is_ok() {
                crate::mm::write_page(&local, p as u32, page);
            }
        }
    }
    let mut st = sh.state.lock();
    if st.far_pages.any_frozen_in_slab(idx, far.slab_pages) {
        return Ok(false); // lent meanwhile: see `lent`
    }
    let m = st.mem.insert(local, MemKind::Local, idx);
    far.set_home(idx, Some(Home::Memory(m)));
    drop(st);
    tracing::warn!(
        "donor {} asked for slab {slab} back and no other donor can take it: far slab {idx} \
         now lives in this process's memory (beyond the budget)",
        far.donors[d].write.addr()
    );
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slab_goes_to_a_live_donor_without_a_copy_else_its_copy_is_dropped() {
        // Copies on 0 (asking) and 1; donor 2 live and without one.
        let r = Replicas::of(&[(0, false), (1, false)]);
        let plan = plan_move(&r, 0, 3, |_| true);
        assert_eq!(
            plan,
            MovePlan {
                copy: true,
                otherwise: Otherwise::DropCopy
            }
        );
        // Donor 2 dead: no copy is made, and the other copy lets this one go.
        let plan = plan_move(&r, 0, 3, |x| x != 2);
        assert!(!plan.copy);
        assert_eq!(plan.otherwise, Otherwise::DropCopy);
    }

    #[test]
    fn a_sole_copy_goes_to_local_memory_when_it_cannot_be_copied() {
        // Donor 1's copy is still filling, and donor 2's is on a dead donor: neither counts.
        let r = Replicas::of(&[(0, false), (1, true), (2, false)]);
        let plan = plan_move(&r, 0, 3, |x| x != 2);
        assert_eq!(
            plan,
            MovePlan {
                copy: false,
                otherwise: Otherwise::ToLocalMemory
            }
        );
        assert!(plan_move(&r, 0, 4, |x| x != 2).copy, "donor 3 may take one");
    }
}
