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

use std::collections::VecDeque;
use std::os::fd::OwnedFd;

use farmem_mm::Mapping;

use crate::pages::Pages;
use crate::prefetch::Prefetch;
use crate::PAGE_SIZE;

/// No page owns this pool slot.
const NO_OWNER: usize = 0;

/// Most cached pool pages [`Slots::take`] reclaims at once (an eighth of the pool at most).
const RECLAIM_BATCH: usize = 32;

/// The pool's memory: a mapping registered with the pool userfaultfd, and this process's
/// pidfd for batched discards. Unmapped on drop, only in the process that mapped it: a forked
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
    pub(crate) fn new(mapping: Mapping) -> PoolMemory {
        PoolMemory {
            slots: mapping.pages() as u32,
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
}

impl Slots {
    pub(crate) fn new(slots: u32) -> Slots {
        Slots {
            owner: vec![NO_OWNER; slots as usize],
            free: (0..slots).rev().collect(),
            stale: Vec::new(),
            cached: VecDeque::new(),
        }
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
    /// `Remote`; the prefetcher's measures see them leave). `None` when every slot holds an
    /// unsent page.
    pub(crate) fn take(
        &mut self,
        pages: &mut Pages,
        pool: &PoolMemory,
        pf: &Prefetch,
    ) -> Option<u32> {
        if let Some(s) = self.free.pop() {
            return Some(s);
        }
        if self.stale.is_empty() {
            // Reclaim a few of the oldest cached pages at once, so their discard is one batch.
            let batch = (pool.slots() as usize / 8).clamp(1, RECLAIM_BATCH);
            while self.stale.len() < batch {
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
            }
        }
        if self.stale.is_empty() {
            return None;
        }
        pool.mapping()
            .discard_pages(&mut self.stale, pool.pidfd.as_ref());
        self.free.append(&mut self.stale);
        self.free.pop()
    }
}
