//! The [`Runtime`] and its [`Region`]s: what a program calls. Creating and adopting
//! regions, the budget, the fork entry points and shutting down are here; starting the
//! runtime is in [`start`], its counters' snapshot ([`Runtime::stats`]) in [`snapshot`].

mod snapshot;
mod start;

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use crate::budget::Usage;
use crate::error::RuntimeError;
use crate::fork::{self, ForkPlan, Lent};
use crate::forkmarks::ForkAdvice;
use crate::shared::Shared;
use crate::sync::Mutex;
use crate::{far, mm};
use farmem_contract::local::LocalMemory;
use farmem_contract::Stats;
use farmem_mm::Mapping;
use farmem_proto::PAGE_SIZE;

/// The paging runtime of this process.
pub struct Runtime {
    sh: Arc<Shared>,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

/// A region created by [`Runtime::map`]: unmapped on drop.
pub struct Region {
    rt: Arc<Runtime>,
    /// Unmapped when the region is dropped, after [`Runtime::drop_region`] forgot it.
    mapping: Mapping,
}

impl Runtime {
    /// Creates a new region of `len_bytes` (rounded up to pages), paged by this runtime and
    /// unmapped when the [`Region`] is dropped. Fails with a clear error if the donors cannot
    /// hold what does not fit in the budget.
    pub fn map(self: &Arc<Self>, len_bytes: usize) -> Result<Region, RuntimeError> {
        if self.sh.in_child.load(Ordering::Relaxed) {
            return Err(RuntimeError::InChild);
        }
        if len_bytes == 0 {
            return Err(RuntimeError::BadRange {
                addr: 0,
                len_bytes,
                reason: "a region cannot be empty",
            });
        }
        let len = len_bytes.div_ceil(PAGE_SIZE) * PAGE_SIZE;
        let needed = (len as u64).saturating_sub(self.sh.budget.limit() * PAGE_SIZE as u64);
        let cap = self.sh.far.capacity_bytes();
        if needed > cap {
            return Err(RuntimeError::InsufficientCapacity {
                len_bytes: len as u64,
                needed_bytes: needed,
                capacity_bytes: cap,
            });
        }
        let mapping = mm::map_region(len)?;
        // On failure the mapping, never handed out, is unmapped when dropped here.
        self.adopt(mapping.addr(), len, false)?;
        Ok(Region {
            rt: self.clone(),
            mapping,
        })
    }

    /// Adopts an existing private anonymous mapping (page-aligned) as a region. The program
    /// keeps owning it: later munmap/mremap/MADV_DONTNEED are seen through userfaultfd events.
    ///
    /// The caller must not hold Rust references into the range that assume its pages stay in
    /// place (they are moved out and back in by the runtime, transparently for plain loads and
    /// stores).
    pub fn register(&self, addr: *mut u8, len_bytes: usize) -> Result<(), RuntimeError> {
        self.register_inner(addr, len_bytes, true)
    }

    fn register_inner(
        &self,
        addr: *mut u8,
        len_bytes: usize,
        scan_present: bool,
    ) -> Result<(), RuntimeError> {
        if self.sh.in_child.load(Ordering::Relaxed) {
            return Err(RuntimeError::InChild);
        }
        let a = addr as usize;
        if !a.is_multiple_of(PAGE_SIZE) || !len_bytes.is_multiple_of(PAGE_SIZE) || len_bytes == 0 {
            return Err(RuntimeError::BadRange {
                addr: a,
                len_bytes,
                reason: "address and length must be non-zero multiples of 4096",
            });
        }
        mm::no_huge_pages(a, len_bytes);
        self.adopt(a, len_bytes, scan_present)
    }

    /// Like [`Runtime::register`], for a mapping the caller has just created (by `mmap`): no
    /// page of it can be present yet, so the range is not scanned with `mincore` (whose
    /// per-page vector would be large for a big reservation: a 2 GiB Java heap, a wasm guard
    /// region).
    pub fn register_new(&self, addr: *mut u8, len_bytes: usize) -> Result<(), RuntimeError> {
        self.register_inner(addr, len_bytes, false)
    }

    /// The program gave fork `advice` for `addr..addr+len_bytes` (`madvise`): a forked child
    /// gets no contents of a `MADV_DONTFORK` or `MADV_WIPEONFORK` range, so before `fork` its
    /// evicted pages stay where they are and none is lent. Only the parts inside regions are
    /// kept.
    pub fn set_fork_advice(&self, addr: *mut u8, len_bytes: usize, advice: ForkAdvice) {
        let a = addr as usize;
        // The kernel applies advice to whole pages.
        let end = a.saturating_add(len_bytes).next_multiple_of(PAGE_SIZE);
        if self.sh.in_child.load(Ordering::Relaxed) || a >= end {
            return;
        }
        let mut st = self.sh.state.lock();
        for (s, e) in st.pages.ranges() {
            if s < end && e > a {
                st.forkmarks.advise(s.max(a), e.min(end), advice);
            }
        }
    }

    /// Whether any page of `addr..addr+len_bytes` lies in a region. The preload library asks
    /// before a `mmap(MAP_FIXED)` replaces part of a mapping: a commit or decommit inside a
    /// region (a managed runtime's heap reservation) is registered again, whatever its size.
    pub fn overlaps_region(&self, addr: *mut u8, len_bytes: usize) -> bool {
        let a = addr as usize;
        if len_bytes == 0 || self.sh.in_child.load(Ordering::Relaxed) {
            return false;
        }
        self.sh
            .state
            .lock()
            .pages
            .overlaps(a, a.saturating_add(len_bytes))
    }

    fn adopt(&self, addr: usize, len: usize, scan_present: bool) -> Result<(), RuntimeError> {
        let sh = &self.sh;
        let mut st = sh.state.lock();
        if st.pages.overlaps(addr, addr + len) {
            // Perhaps an old mapping there was unmapped and the fault loop has read, but not
            // yet processed, its UNMAP event: wait for it, then look again.
            drop(st);
            sh.wait_events_handled(Duration::from_secs(1));
            st = sh.state.lock();
        }
        if st.pages.overlaps(addr, addr + len) {
            return Err(RuntimeError::BadRange {
                addr,
                len_bytes: len,
                reason: "it overlaps a range already registered",
            });
        }
        // The range is private anonymous memory the program hands to the runtime (map:
        // created by the caller; register: the caller's promise).
        mm::register_region(&sh.uffd, addr, len).map_err(|source| RuntimeError::Uffd {
            step: "registering a region",
            source,
        })?;
        // Present pages are found after registering, with the state lock held: a page another
        // thread discards from now on raises a REMOVE event, served after this adoption, and
        // one it first touches faults and waits for the lock. Scanned before registering, a
        // page discarded in between (an allocator's purge) was adopted as resident with
        // nothing mapped, and its next access got SIGBUS.
        let mut present = vec![0u8; if scan_present { len / PAGE_SIZE } else { 0 }];
        if scan_present && farmem_mm::mincore(addr, &mut present).is_err() {
            let _ = sh.uffd.unregister(addr, len);
            return Err(RuntimeError::BadRange {
                addr,
                len_bytes: len,
                reason: "it is not (entirely) mapped",
            });
        }
        st.pages.add_region(addr, addr + len);
        st.forkmarks.forget(addr, addr + len); // a new mapping carries no fork advice
        for (i, b) in present.iter().enumerate() {
            if b & 1 != 0 {
                st.pages.adopt(addr + i * PAGE_SIZE);
            }
        }
        sh.kick_evictor(&st);
        Ok(())
    }

    /// Forgets a region created by `map` (its mapping is unmapped by the caller afterwards).
    fn drop_region(&self, addr: usize, len: usize) {
        let sh = &self.sh;
        if sh.in_child.load(Ordering::Relaxed) {
            return;
        }
        let st = sh.state.lock();
        let mut st = sh.settle_evictions(st);
        for (a, r) in st.pages.release_range(addr, addr + len, true) {
            st.settle_released(&sh.pf, a, r);
        }
        drop(st);
        // Unregister first so munmap raises no UNMAP event.
        let _ = sh.uffd.unregister(addr, len);
    }

    /// The runtime's own local page memory now: the write-back pool's mapping, then every
    /// memory slab (host tier slabs mapped from the node, local slabs): (start address, length
    /// in bytes). Not program memory, but farmem's: what is resident there is accounted by the
    /// runtime (the pool within `--local-mem`; the slabs in [`Stats::tier_slabs`] and
    /// [`Stats::local_slabs`]). Only the pool in a forked child.
    pub fn own_memory(&self) -> Vec<(usize, usize)> {
        let pool = self.sh.pool.mapping();
        let mut v = vec![(pool.addr(), pool.len())];
        if !self.sh.in_child.load(Ordering::Relaxed) {
            v.extend(self.sh.state.lock().mem.ranges());
        }
        v
    }

    /// Finishes the page-access trace (`RuntimeConfig::record_trace`): flushes it and writes
    /// its record count, so farmem-sim's reader accepts it; faults after this are not
    /// recorded. Returns the number of records (0 when no trace is recorded). Dropping the
    /// runtime does the same; a process that never drops its runtime calls this at exit.
    /// In a forked child it does nothing (the trace belongs to the parent).
    pub fn finish_trace(&self) -> Result<u64, RuntimeError> {
        if self.sh.in_child.load(Ordering::Relaxed) {
            return Ok(0);
        }
        self.sh.pf.finish_trace()
    }

    /// Slabs this runtime placed on each donor, in configuration order.
    pub fn slabs_per_donor(&self) -> Vec<u64> {
        far::slabs_per_donor(&self.sh.far)
    }

    /// Slabs whose first copy (the one demand reads go to while its donor is live) is on
    /// each donor, in configuration order: the donor whose failure the most faults notice.
    pub fn first_copies_per_donor(&self) -> Vec<u64> {
        far::first_copies_per_donor(&self.sh.far)
    }

    /// Changes the budget of resident region pages (at least 16). Lowering it wakes the
    /// evictor, which brings resident pages down at once; returns the budget now in force.
    pub fn set_budget_pages(&self, pages: u64) -> u64 {
        let set = self.sh.budget.set(pages);
        // Under the lock: an evictor between its look at the budget and its wait would
        // otherwise miss this wake-up and sleep over the budget for up to a second.
        drop(self.sh.state.lock());
        self.sh.evict_cv.notify_one();
        set
    }

    /// Changes the local pages this runtime may use, write-back pool and resident region pages
    /// together (a process tree's grant): the pool keeps a fifth of them (at most the slots it
    /// mapped at start, [`Runtime::pool_pages`]) and gives back cached pages above that at
    /// once, unsent ones as they are sent; the rest is the budget ([`Runtime::set_budget_pages`]).
    /// Returns `(pool_slots, budget_pages)` now in force.
    pub fn set_local_pages(&self, pages: u64) -> (u64, u64) {
        let (pool, budget) = LocalMemory::split_pages(pages, self.sh.pool.slots());
        let sh = &self.sh;
        if !sh.in_child.load(Ordering::Relaxed) {
            let mut st = sh.state.lock();
            let st = &mut *st;
            st.slots.set_limit(pool, &mut st.pages, &sh.pool, &sh.pf);
        }
        (u64::from(pool), self.set_budget_pages(budget))
    }

    /// What the runtime uses and moves, cheaply (for a coordinator polling every few tens
    /// of milliseconds; [`Runtime::stats`] computes percentiles and reads /proc).
    pub fn usage(&self) -> Usage {
        let sh = &self.sh;
        if sh.in_child.load(Ordering::Relaxed) {
            return Usage::default();
        }
        let used_pages = {
            let st = sh.state.lock();
            st.pages.resident() + st.slots.used()
        };
        let s = &sh.stats.lock().s;
        Usage {
            used_pages,
            budget_pages: sh.budget.limit(),
            fetched_pages: s.faults_remote
                + s.faults_tier
                + s.faults_pool_hit
                + s.prefetched_pages
                + s.tier_installed_ahead,
            evicted_pages: s.evicted_sent_dirty
                + s.tier_pages_written
                + s.evicted_dropped_clean
                + s.evicted_zero,
        }
    }

    /// Slots of the write-back pool (mapped at start; with a host tier only the slots it
    /// keeps). [`Runtime::set_local_pages`] may let it hold pages in fewer of them.
    pub fn pool_pages(&self) -> u64 {
        u64::from(self.sh.pool.slots())
    }

    /// Every region now: (start address, length in bytes), in address order (munmap and
    /// mremap split and move them, so this is a snapshot). Empty in a forked child:
    /// [`Runtime::before_fork`] returned the regions at fork.
    pub fn regions(&self) -> Vec<(usize, usize)> {
        if self.sh.in_child.load(Ordering::Relaxed) {
            return Vec::new();
        }
        let st = self.sh.state.lock();
        st.pages
            .ranges()
            .into_iter()
            .map(|(s, e)| (s, e - s))
            .collect()
    }

    /// Before `fork()`: pauses eviction and brings every evicted page of every region back
    /// into local memory (temporarily exceeding the budget) until
    /// [`Runtime::after_fork_parent`], so the child gets all region data as plain memory.
    /// Returns the regions (start address, length in bytes), for a child that starts a
    /// runtime of its own: it must not ask its copy of this one (see
    /// [`Runtime::after_fork_child`]). Empty in a forked child.
    pub fn before_fork(&self) -> Vec<(usize, usize)> {
        if self.sh.in_child.load(Ordering::Relaxed) {
            return Vec::new();
        }
        fork::before_fork(&self.sh, false).regions
    }

    /// Before `fork()`: [`Runtime::before_fork`], with everything the child needs. With `lend`
    /// (for a child that starts a runtime of its own) pages in the host tier stay there — the child inherits
    /// their slabs and borrows them ([`Runtime::borrow`] with [`ForkPlan::lent`]), so the
    /// budget holds during the fork. Falls back to bringing them back when the node refuses a
    /// hold. Pass the plan to [`Runtime::after_fork_parent_with`] in the parent.
    pub fn prepare_fork(&self, lend: bool) -> ForkPlan {
        if self.sh.in_child.load(Ordering::Relaxed) {
            return ForkPlan::default();
        }
        fork::before_fork(&self.sh, lend)
    }

    /// After `fork()` in the parent: resumes eviction (once every concurrent fork is done).
    pub fn after_fork_parent(&self) {
        if !self.sh.in_child.load(Ordering::Relaxed) {
            fork::after_fork_parent(&self.sh, None);
        }
    }

    /// After `fork()` in the parent, for a fork prepared with [`Runtime::prepare_fork`]: the
    /// lent pages stay frozen while a child maps them.
    pub fn after_fork_parent_with(&self, plan: Option<&ForkPlan>) {
        if !self.sh.in_child.load(Ordering::Relaxed) {
            fork::after_fork_parent(&self.sh, plan);
        }
    }

    /// In a forked child's own runtime (started with [`RuntimeConfig::far_floor`] at
    /// [`Lent::floor`], its regions registered): takes the slabs the parent lent as read-only
    /// memory slabs and marks every lent page not present here as remote there, so it is
    /// fetched on access like any other. Returns the pages borrowed. On an error nothing is
    /// borrowed; the child should copy the pages in ([`Lent::copy_in`]).
    pub fn borrow(&self, lent: &Lent) -> Result<usize, RuntimeError> {
        if self.sh.in_child.load(Ordering::Relaxed) {
            return Err(RuntimeError::InChild);
        }
        fork::borrow(&self.sh, lent)
    }

    /// After `fork()` in the child: the regions are plain memory there (no userfaultfd
    /// registration is inherited) and no runtime thread exists; the runtime refuses new work
    /// from now on and takes none of its locks (one of the parent's threads may have held
    /// any of them at the fork instant).
    pub fn after_fork_child(&self) {
        self.sh.in_child.store(true, Ordering::SeqCst);
    }
}

impl Drop for Runtime {
    fn drop(&mut self) {
        if self.sh.in_child.load(Ordering::Relaxed) {
            return;
        }
        self.sh.shutdown.store(true, Ordering::SeqCst);
        // Each lock once: a thread that looked at the flag before the store and has not
        // waited yet holds its lock, so the notifications below come after its wait began.
        drop(self.sh.state.lock());
        drop(self.sh.pf.queue.lock());
        self.sh.doorbell.ring();
        self.sh.far.wake_healer();
        self.sh.evict_cv.notify_all();
        self.sh.stage_cv.notify_all();
        self.sh.slots_cv.notify_all();
        self.sh.pf.wake();
        for t in self.threads.lock().drain(..) {
            let _ = t.join();
        }
        // The pool is unmapped when the shared core is dropped.
        let pool = self.sh.pool.mapping();
        let _ = self.sh.pool_uffd.unregister(pool.addr(), pool.len());
    }
}

impl Region {
    /// Start of the region.
    pub fn as_ptr(&self) -> *mut u8 {
        self.mapping.as_ptr()
    }

    /// Length in bytes (a multiple of 4096).
    pub fn len(&self) -> usize {
        self.mapping.len()
    }

    /// Whether the region is empty (never: regions have at least one page).
    pub fn is_empty(&self) -> bool {
        self.mapping.is_empty()
    }

    /// The runtime's counters (process-wide: the budget is shared by all regions).
    pub fn stats(&self) -> Stats {
        self.rt.stats()
    }

    /// The runtime this region belongs to.
    pub fn runtime(&self) -> &Arc<Runtime> {
        &self.rt
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        self.rt.drop_region(self.mapping.addr(), self.mapping.len());
    }
}
