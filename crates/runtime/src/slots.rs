//! Write-back pool slots: which page each slot holds, which are free, which are cached
//! (reclaimable), and returning their memory to the system in batches.
//!
//! # Design
//!
//! - A slot is free (memory already discarded), stale (free but still holding a page's bytes),
//!   or owned by a page (`owner`). Owned slots whose page is `PoolSent` are also queued in
//!   `cached`, oldest first: [`Slots::take`] reclaims them (the page becomes `Remote` through
//!   [`Pages::reclaim`]) when no free slot is left.
//! - Every `MADV_DONTNEED` on a slot flushes the TLB of every CPU this process runs on: an
//!   IPI, which on a virtual machine is a trip through the hypervisor. A perf profile of a
//!   sequential scan had the fault thread and the evictor spend a large share of their time
//!   there (one discard per pool hit and per reclaimed slot). Freed slots that still hold a
//!   page are therefore kept aside (`stale`) and discarded together when a slot is needed,
//!   with one `process_madvise(2)` ([`farmem_mm::Mapping::discard_pages`]).
//! - The pool may hold fewer pages than it has slots: [`Slots::set_limit`]. A process of a
//!   tree whose grant is lowered gives back its pool's share too (an idle shell held a 4 MiB
//!   pool beside a 1 MiB budget); taken slots beyond the limit are reclaimed as soon as their
//!   pages are sent ([`Slots::trim`]), and none is taken while at the limit.

use std::collections::VecDeque;
use std::os::fd::OwnedFd;

use farmem_mm::Mapping;

use crate::pages::Pages;
use farmem_proto::PAGE_SIZE;

/// Told of every page that leaves the pool unread when its slot is reclaimed (the
/// prefetcher, whose accuracy counts such a page as a miss).
pub(crate) trait Departures {
    /// The page at `addr` left the pool.
    fn left(&self, addr: usize);
}

/// No page owns this pool slot.
const NO_OWNER: usize = 0;

/// Most cached pool pages [`Slots::take`] reclaims at once (an eighth of the pool at most).
const RECLAIM_BATCH: usize = 32;

/// The pool's memory: a mapping registered with the pool userfaultfd, and this process's
/// pidfd for batched discards. Its last page is no slot but the trash page, where the runtime
/// MOVEs a region page it must take away without raising an event on the region
/// userfaultfd ([`crate::mm::take_out_region_page`]). Unmapped on drop, only in the process that mapped it: a forked
/// child does not inherit the pool (`MADV_DONTFORK`), and there its range may hold another
/// mapping by then.
pub(crate) struct PoolMemory {
    /// Always `Some` until dropped.
    mapping: Option<Mapping>,
    pidfd: Option<OwnedFd>,
    /// The process that mapped it.
    pid: u32,
    /// Slots in use: the whole mapping, or its first slots only ([`PoolMemory::keep`]).
    slots: u32,
}

impl PoolMemory {
    /// `mapping` holds the slots and, last, the trash page.
    pub(crate) fn new(mapping: Mapping) -> PoolMemory {
        assert!(
            mapping.pages() >= 2,
            "a pool needs a slot and the trash page"
        );
        PoolMemory {
            slots: mapping.pages() as u32 - 1,
            mapping: Some(mapping),
            pidfd: farmem_mm::self_pidfd(),
            pid: std::process::id(),
        }
    }

    /// Uses only the first `slots` slots (at most the mapping's): the rest of the mapping is
    /// never touched, so it costs no memory.
    pub(crate) fn keep(&mut self, slots: u32) {
        self.slots = self.slots.min(slots);
    }

    /// The pool mapping.
    pub(crate) fn mapping(&self) -> &Mapping {
        self.mapping
            .as_ref()
            .expect("the pool is mapped until dropped")
    }

    /// Slots in the pool.
    pub(crate) fn slots(&self) -> u32 {
        self.slots
    }

    /// Address of `slot`.
    pub(crate) fn slot_addr(&self, slot: u32) -> usize {
        self.mapping().addr() + slot as usize * PAGE_SIZE
    }

    /// Address of the trash page.
    pub(crate) fn trash_addr(&self) -> usize {
        let m = self.mapping();
        m.addr() + m.len() - PAGE_SIZE
    }

    /// Discards whatever was MOVEd onto the trash page.
    pub(crate) fn empty_trash(&self) {
        let m = self.mapping();
        m.discard_pages(&mut [m.pages() as u32 - 1], self.pidfd.as_ref());
    }
}

impl Drop for PoolMemory {
    fn drop(&mut self) {
        if std::process::id() != self.pid {
            // Not ours to unmap here (see the type's docs).
            std::mem::forget(self.mapping.take());
        }
    }
}

/// Which page each pool slot holds, and the free lists.
pub(crate) struct Slots {
    /// Address of the page each slot holds.
    owner: Vec<usize>,
    /// Free slots whose memory is already discarded.
    free: Vec<u32>,
    /// Free slots that still hold a page: discarded all at once when a slot is needed.
    stale: Vec<u32>,
    /// Slots holding reclaimable pages (sent or clean), oldest first; may hold stale slots.
    cached: VecDeque<u32>,
    /// The most slots taken at once (neither free nor stale).
    limit: u32,
}

impl Slots {
    pub(crate) fn new(slots: u32) -> Slots {
        Slots {
            owner: vec![NO_OWNER; slots as usize],
            free: (0..slots).rev().collect(),
            stale: Vec::new(),
            cached: VecDeque::new(),
            limit: slots,
        }
    }

    /// Slots taken: holding a page or about to (neither free nor stale).
    fn taken(&self) -> u32 {
        (self.owner.len() - self.free.len() - self.stale.len()) as u32
    }

    /// The most slots the pool holds pages in: at least 1, at most every slot.
    pub(crate) fn limit(&self) -> u32 {
        self.limit
    }

    /// Lets the pool hold pages in at most `limit` slots (clamped to 1..=all). Lowering it
    /// reclaims cached pages at once ([`Slots::trim`]); unsent ones follow as they are sent.
    pub(crate) fn set_limit(
        &mut self,
        limit: u32,
        pages: &mut Pages,
        pool: &PoolMemory,
        pf: &impl Departures,
    ) {
        self.limit = limit.clamp(1, self.owner.len() as u32);
        self.trim(pages, pool, pf);
    }

    /// Reclaims the oldest cached pages until no more slots are taken than the limit allows,
    /// and discards their memory. Cheap when within the limit; called after sends complete.
    pub(crate) fn trim(&mut self, pages: &mut Pages, pool: &PoolMemory, pf: &impl Departures) {
        if self.taken() <= self.limit {
            return;
        }
        let over = (self.taken() - self.limit) as usize;
        self.reclaim(over, pages, pf);
        self.discard_stale(pool);
    }

    /// Reclaims up to `n` of the oldest cached pages (their pages become `Remote`; the
    /// prefetcher's measures see them leave); their slots become stale.
    fn reclaim(&mut self, n: usize, pages: &mut Pages, pf: &impl Departures) {
        let mut done = 0;
        while done < n {
            let Some(s) = self.cached.pop_front() else {
                break;
            };
            let Some(owner) = self.owner(s) else {
                continue;
            };
            if !pages.reclaim(owner, s) {
                continue;
            }
            pf.left(owner);
            self.release_stale(s);
            done += 1;
        }
    }

    /// Discards the stale slots' memory in one batch: they become free.
    fn discard_stale(&mut self, pool: &PoolMemory) {
        if self.stale.is_empty() {
            return;
        }
        pool.mapping()
            .discard_pages(&mut self.stale, pool.pidfd.as_ref());
        self.free.append(&mut self.stale);
    }

    /// The page `slot` holds, if any.
    pub(crate) fn owner(&self, slot: u32) -> Option<usize> {
        Some(self.owner[slot as usize]).filter(|o| *o != NO_OWNER)
    }

    /// Slots holding a page.
    pub(crate) fn used(&self) -> u64 {
        self.owner.iter().filter(|o| **o != NO_OWNER).count() as u64
    }

    /// `slot` now holds the page at `addr`.
    pub(crate) fn set_owner(&mut self, slot: u32, addr: usize) {
        self.owner[slot as usize] = addr;
    }

    /// `slot`'s page is reclaimable (sent, clean or prefetched).
    pub(crate) fn cache(&mut self, slot: u32) {
        self.cached.push_back(slot);
    }

    /// `slot` is free and empty (its page was MOVEd out, or never arrived).
    pub(crate) fn release_empty(&mut self, slot: u32) {
        self.owner[slot as usize] = NO_OWNER;
        self.free.push(slot);
    }

    /// `slot` is free but still holds bytes: discarded with the next batch.
    pub(crate) fn release_stale(&mut self, slot: u32) {
        self.owner[slot as usize] = NO_OWNER;
        self.stale.push(slot);
    }

    /// Takes a free slot, reclaiming the oldest cached pages if needed (their pages become
    /// `Remote`; the prefetcher's measures see them leave). `None` when every slot the limit
    /// allows holds an unsent page.
    pub(crate) fn take(
        &mut self,
        pages: &mut Pages,
        pool: &PoolMemory,
        pf: &impl Departures,
    ) -> Option<u32> {
        let at_limit = self.taken() >= self.limit;
        if !at_limit {
            if let Some(s) = self.free.pop() {
                return Some(s);
            }
        }
        if self.stale.is_empty() || at_limit {
            // Reclaim a few of the oldest cached pages at once, so their discard is one batch;
            // at the limit, at least enough to take one slot within it.
            let batch = (self.limit as usize / 8).clamp(1, RECLAIM_BATCH);
            let need = (self.taken() + 1).saturating_sub(self.limit) as usize;
            let want = if self.stale.is_empty() {
                batch.max(need)
            } else {
                need
            };
            self.reclaim(want, pages, pf);
        }
        if self.taken() >= self.limit {
            return None;
        }
        self.discard_stale(pool);
        self.free.pop()
    }
}
