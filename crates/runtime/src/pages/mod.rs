//! Page state with one owner: the page table, each page's [`PageState`], and the checked
//! transitions between states. Every other module changes a page's state, the resident count,
//! the eviction policy's set of pages and the peak residency only through [`Pages`]' methods
//! (one per legal transition), so these four stay consistent.
//!
//! # Design
//!
//! Transitions (the diagram is in docs/architecture.md, "Paging runtime"):
//!
//! | method | from | to |
//! |---|---|---|
//! | `install_zero`, `adopt` | Empty | ResidentDirty |
//! | `install_from_pool` | PoolSent / PoolUnsent | ResidentDirty (MOVE), ResidentClean / ResidentSending (WP copy) |
//! | `install_fetched` | Fetching | ResidentClean (read), ResidentDirty (write) |
//! | `install_prefetched` | Remote | ResidentClean |
//! | `install_for_fork` | PoolSent / PoolUnsent / Remote | ResidentDirty |
//! | `inherit` | Empty | Remote |
//! | `mark_dirty` | Resident* | ResidentDirty |
//! | `begin_fetch` / `abandon_fetch` | Remote / Fetching | Fetching / Remote |
//! | `begin_eviction` | Resident* | Evicting |
//! | `refuse_eviction` | Evicting | ResidentClean / ResidentDirty |
//! | `commit_clean` / `commit_zero` / `commit_dirty` | Evicting | PoolSent / Empty / PoolUnsent |
//! | `mark_sent` | PoolUnsent / ResidentSending | PoolSent / ResidentClean |
//! | `reclaim` | PoolSent | Remote |
//! | `prefetch_to_pool` | Remote | PoolSent |
//! | `release` | any | Empty |
//! | `remap` | any | same, except ResidentSending → ResidentDirty, Fetching → Remote |
//!
//! [`Pages::arm`] marks a `ResidentDirty` page as a write-heat sample
//! ([`farmem_policy::write_heat`]) without changing its state; its next transition clears the
//! mark, as it clears the `ahead` mark.
//!
//! Legality is the pure function [`next_state`]: a transition from a state it does not start
//! from is rejected. The methods assert legality in debug builds; in release builds an illegal
//! transition is logged and leaves the page unchanged (so the counts stay consistent). The
//! table-driven unit test exercises `next_state` for every (state, transition) pair.
//!
//! Entries are the page table's ([`table`]); a transition also keeps the entry's pool slot,
//! staging generation and far page number. Pool slots and far pages themselves are owned by
//! [`crate::slots`] and [`crate::slabs::farpages`]: transitions that free one return it to the caller.
//!
//! # Limitations
//!
//! - An illegal transition in a release build (a runtime bug) is only logged: the page keeps
//!   its state, and the caller's own bookkeeping (a pool slot taken for it) is not undone.
//! - The peak residency counts pages found present when a mapping is adopted
//!   ([`Pages::adopt`]), like any other install.

mod state;
mod table;

use farmem_policy::evict::EvictionPolicy;
use farmem_policy::Origin;

use farmem_proto::PAGE_SIZE;
pub(crate) use state::{next_state, Entry, PageState, Transition, NO_FAR};
use table::Table;

/// The page number of `addr` (the policies' page ids).
pub(crate) fn pid_of(addr: usize) -> u64 {
    (addr / PAGE_SIZE) as u64
}

/// What a released page held, for its owners to take back.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Released {
    /// The pool slot it occupied (still holding its bytes: discard before reuse).
    pub(crate) slot: Option<u32>,
    /// Its far page number.
    pub(crate) far: Option<u64>,
}

/// Every page's state, the resident count, the eviction policy and the peak residency.
pub(crate) struct Pages {
    table: Table,
    policy: Box<dyn EvictionPolicy>,
    resident: u64,
    /// Entries in the `Evicting` state right now.
    evicting: u64,
    peak_resident: u64,
}

impl Pages {
    pub(crate) fn new(policy: Box<dyn EvictionPolicy>) -> Pages {
        Pages {
            table: Table::default(),
            policy,
            resident: 0,
            evicting: 0,
            peak_resident: 0,
        }
    }

    /// Resident pages now.
    pub(crate) fn resident(&self) -> u64 {
        self.resident
    }

    /// The most pages resident at once so far.
    pub(crate) fn peak_resident(&self) -> u64 {
        self.peak_resident
    }

    /// Pages being evicted right now (their commit is pending).
    pub(crate) fn evicting(&self) -> u64 {
        self.evicting
    }

    /// The entry of the page at `addr`, if it lies in a region.
    pub(crate) fn get(&self, addr: usize) -> Option<Entry> {
        self.table.get(addr)
    }

    /// Whether `start..end` overlaps a known region.
    pub(crate) fn overlaps(&self, start: usize, end: usize) -> bool {
        self.table.overlaps(start, end)
    }

    /// All regions: (start, end).
    pub(crate) fn ranges(&self) -> Vec<(usize, usize)> {
        self.table.ranges()
    }

    /// Adds the region `start..end` (page-aligned, not overlapping any other); all its pages
    /// are `Empty`.
    pub(crate) fn add_region(&mut self, start: usize, end: usize) {
        self.table.add(start, end);
    }

    /// Every entry in `start..end` that is not empty: (address, entry).
    pub(crate) fn entries_in(&mut self, start: usize, end: usize) -> Vec<(usize, Entry)> {
        let mut out = Vec::new();
        self.table.for_each_in(start, end, |a, e| out.push((a, *e)));
        out
    }

    /// The next victim the eviction policy picks (page number), if any.
    pub(crate) fn pick_victim(&mut self) -> Option<u64> {
        self.policy.pick_victim()
    }

    /// Whether the eviction policy's next victim is a prefetched page (used once or not yet).
    pub(crate) fn next_is_prefetched(&self) -> bool {
        self.policy.next_is_prefetched()
    }

    /// Hands a resident page back to the eviction policy (a picked victim that could not be
    /// evicted now). Pages no longer resident are ignored.
    pub(crate) fn requeue(&mut self, addr: usize) {
        if self.get(addr).is_some_and(|e| e.state.is_resident()) {
            self.policy.insert(pid_of(addr), Origin::Demand);
        }
    }

    /// Tells the eviction policy that a resident page was used (an inferred prefetch hit).
    pub(crate) fn touched(&mut self, addr: usize) {
        self.policy.touched(pid_of(addr));
    }

    /// Applies `t` to the page at `addr`: checks legality and sets the new state. Returns the
    /// entry (before and a handle to it after), or `None` if the page is in no region or the
    /// transition is illegal from its state (a bug: asserted in debug builds, logged in
    /// release builds, and the page is left unchanged).
    fn apply(&mut self, addr: usize, t: Transition) -> Option<(Entry, &mut Entry)> {
        let e = self.table.get_mut(addr)?;
        let before = *e;
        let Some(to) = next_state(before.state, t) else {
            debug_assert!(
                false,
                "illegal transition {t:?} from {:?} at {addr:#x}",
                before.state
            );
            tracing::error!(
                "internal error: illegal page transition {t:?} from {:?} at {addr:#x}; ignored",
                before.state
            );
            return None;
        };
        e.state = to;
        e.ahead = false;
        e.armed = false;
        e.zeroed &= to.is_resident() || to == PageState::Evicting;
        Some((before, e))
    }

    /// Counts a newly resident page: resident count, peak, eviction policy.
    fn count_install(&mut self, addr: usize, origin: Origin, touched: bool) {
        self.resident += 1;
        self.peak_resident = self.peak_resident.max(self.resident);
        self.policy.insert(pid_of(addr), origin);
        if touched {
            self.policy.touched(pid_of(addr));
        }
    }

    /// `Empty` → `ResidentDirty`: a zero page was installed (marked `zeroed`).
    pub(crate) fn install_zero(&mut self, addr: usize) {
        if let Some((_, e)) = self.apply(addr, Transition::InstallZero) {
            e.zeroed = true;
            self.count_install(addr, Origin::Demand, false);
        }
    }

    /// `Empty` → `ResidentDirty`: a page present when its mapping was adopted (its contents
    /// are the program's: not `zeroed`).
    pub(crate) fn adopt(&mut self, addr: usize) {
        if self.apply(addr, Transition::InstallZero).is_some() {
            self.count_install(addr, Origin::Demand, false);
        }
    }

    /// A pool page is back in its region: moved (`protected` false: `ResidentDirty`, slot
    /// empty) or copied write-protected (`PoolSent` → `ResidentClean`, `PoolUnsent` →
    /// `ResidentSending`; the slot still holds the bytes). Inserted into the policy as
    /// `origin` (a prefetch hit is touched at once). Returns the slot it left.
    pub(crate) fn install_from_pool(
        &mut self,
        addr: usize,
        protected: bool,
        origin: Origin,
    ) -> Option<u32> {
        let t = if protected {
            Transition::InstallFromPoolProtected
        } else {
            Transition::InstallFromPoolMoved
        };
        let (before, _) = self.apply(addr, t)?;
        self.count_install(addr, origin, origin == Origin::Prefetch);
        Some(before.slot)
    }

    /// `Fetching` → resident: a fetched page was installed for a fault (a read fault's page
    /// write-protected and clean, a write fault's dirty). An awaited prefetch is inserted as
    /// a touched prefetched page.
    pub(crate) fn install_fetched(&mut self, addr: usize, write: bool, origin: Origin) {
        if self
            .apply(addr, Transition::InstallFetched { write })
            .is_some()
        {
            self.count_install(addr, origin, origin == Origin::Prefetch);
        }
    }

    /// `Remote` → `ResidentClean`: a prefetched page installed eagerly (marker mode, or from
    /// the host tier), write-protected, inserted into the eviction policy as `origin`.
    /// `ahead` marks it so that [`Pages::mark_dirty`] reports its first write.
    pub(crate) fn install_prefetched(&mut self, addr: usize, origin: Origin, ahead: bool) {
        if let Some((_, e)) = self.apply(addr, Transition::InstallPrefetched) {
            e.ahead = ahead;
            self.count_install(addr, origin, false);
        }
    }

    /// `Remote` → `ResidentDirty`: a page installed ahead, writable, from a memory slab (the
    /// evictor compares it with its slab copy, as for a tier fault), inserted into the eviction
    /// policy as `origin`.
    pub(crate) fn install_prefetched_writable(&mut self, addr: usize, origin: Origin) {
        if self.apply(addr, Transition::BeginFetch).is_some()
            && self
                .apply(addr, Transition::InstallFetched { write: true })
                .is_some()
        {
            self.count_install(addr, origin, false);
        }
    }

    /// Pool*/`Remote` → `ResidentDirty`: brought back before fork. Returns the pool slot it
    /// left (empty now: MOVEd out), if it was in the pool.
    pub(crate) fn install_for_fork(&mut self, addr: usize) -> Option<u32> {
        let (before, _) = self.apply(addr, Transition::InstallForFork)?;
        self.count_install(addr, Origin::Demand, false);
        before.state.in_pool().then_some(before.slot)
    }

    /// `Empty` → `Remote` at far page `far`: a forked child's page its parent left in a tier
    /// slab lent to the child ([`crate::fork`]). Returns false if the page was not `Empty`.
    pub(crate) fn inherit(&mut self, addr: usize, far: u64) -> bool {
        if self.get(addr).map(|e| e.state) != Some(PageState::Empty) {
            return false;
        }
        match self.apply(addr, Transition::Inherit) {
            Some((_, e)) => {
                e.far = far;
                true
            }
            None => false,
        }
    }

    /// Resident → `ResidentDirty`: a write-protect fault (the policy sees the use).
    ///
    /// Returns the entry before: its `ahead` says whether the page had been installed ahead
    /// write-protected ([`Pages::install_prefetched`]) and not written since, its `armed`
    /// whether it was a write-heat sample ([`Pages::arm`]).
    pub(crate) fn mark_dirty(&mut self, addr: usize) -> Option<Entry> {
        let (before, _) = self.apply(addr, Transition::MarkDirty)?;
        self.policy.touched(pid_of(addr));
        Some(before)
    }

    /// Marks the `ResidentDirty` page at `addr` as a write-heat sample and hands it back to
    /// the eviction policy (the caller write-protects it). Not a transition: the page stays
    /// dirty, and its next transition (a write-protect fault, an eviction) clears the mark.
    /// Returns false, and does nothing, if the page is not `ResidentDirty`.
    pub(crate) fn arm(&mut self, addr: usize) -> bool {
        match self.table.get_mut(addr) {
            Some(e) if e.state == PageState::ResidentDirty => {
                e.armed = true;
                self.policy.insert(pid_of(addr), Origin::Demand);
                true
            }
            _ => false,
        }
    }

    /// `Remote` → `Fetching`. Returns the far page to read.
    pub(crate) fn begin_fetch(&mut self, addr: usize) -> Option<u64> {
        self.apply(addr, Transition::BeginFetch).map(|(b, _)| b.far)
    }

    /// `Fetching` → `Remote`.
    pub(crate) fn abandon_fetch(&mut self, addr: usize) {
        let _ = self.apply(addr, Transition::AbandonFetch);
    }

    /// Resident → `Evicting`: picked as a victim, bound for `slot`. Returns whether it was
    /// clean (its donor copy is current).
    pub(crate) fn begin_eviction(&mut self, addr: usize) -> Option<bool> {
        let (before, _) = self.apply(addr, Transition::BeginEviction)?;
        self.evicting += 1;
        Some(before.state == PageState::ResidentClean)
    }

    /// Resident → `Evicting` for a page taken out of the eviction policy's order (a page
    /// between two victims, [`crate::evict`]): it leaves the policy first. Returns whether it
    /// was clean; None (and nothing changes) unless it is resident and not a write-heat sample.
    pub(crate) fn begin_eviction_out_of_order(&mut self, addr: usize) -> Option<bool> {
        if !self
            .get(addr)
            .is_some_and(|e| e.state.is_resident() && !e.armed)
        {
            return None;
        }
        self.policy.remove(pid_of(addr));
        self.begin_eviction(addr)
    }

    /// `Evicting` → resident again, `clean` as it was picked: the MOVE was refused. The page
    /// goes back to the eviction policy.
    pub(crate) fn refuse_eviction(&mut self, addr: usize, clean: bool) {
        self.evicting -= 1;
        if self
            .apply(addr, Transition::RefuseEviction { clean })
            .is_some()
        {
            self.policy.insert(pid_of(addr), Origin::Demand);
        }
    }

    /// An eviction whose page was released meanwhile (its entry is no longer `Evicting`):
    /// only the counts are settled.
    pub(crate) fn eviction_lost(&mut self) {
        self.evicting -= 1;
        self.resident -= 1;
    }

    /// `Evicting` → `PoolSent` in `slot`: a clean page.
    pub(crate) fn commit_clean(&mut self, addr: usize, slot: u32) {
        self.evicting -= 1;
        if let Some((_, e)) = self.apply(addr, Transition::CommitClean) {
            e.slot = slot;
            self.resident -= 1;
        }
    }

    /// `Evicting` → `Empty`: an all-zero page, dropped. Returns its far page, to free.
    pub(crate) fn commit_zero(&mut self, addr: usize) -> Option<u64> {
        self.evicting -= 1;
        let (before, e) = self.apply(addr, Transition::CommitZero)?;
        *e = Entry::default();
        self.resident -= 1;
        (before.far != NO_FAR).then_some(before.far)
    }

    /// `Evicting` → `PoolUnsent` in `slot`, staged with generation `gen` for far page `far`.
    pub(crate) fn commit_dirty(&mut self, addr: usize, slot: u32, gen: u32, far: u64) {
        self.evicting -= 1;
        if let Some((_, e)) = self.apply(addr, Transition::CommitDirty) {
            e.slot = slot;
            e.gen = gen;
            e.far = far;
            self.resident -= 1;
        }
    }

    /// Its donor acknowledged the send of generation `gen` of the page at `addr`: marks it
    /// sent if it is still that send's page, in the pool (`slot`: `PoolSent`, returns true)
    /// or moved back unmodified (`ResidentSending` → `ResidentClean`). Anything else (written,
    /// released, sent again) is left alone.
    pub(crate) fn mark_sent(&mut self, addr: usize, slot: Option<u32>, gen: u32) -> bool {
        let Some(e) = self.get(addr) else {
            return false;
        };
        let ours = e.gen == gen
            && match (e.state, slot) {
                (PageState::PoolUnsent, Some(s)) => e.slot == s,
                (PageState::ResidentSending, None) => true,
                _ => false,
            };
        ours && self.apply(addr, Transition::MarkSent).is_some() && e.state.in_pool()
    }

    /// `PoolSent` in `slot` → `Remote`: its slot is reclaimed. False (nothing changed) if the
    /// page is not that slot's sent page any more.
    pub(crate) fn reclaim(&mut self, addr: usize, slot: u32) -> bool {
        match self.get(addr) {
            Some(e) if e.state == PageState::PoolSent && e.slot == slot => {
                self.apply(addr, Transition::Reclaim).is_some()
            }
            _ => false,
        }
    }

    /// `Remote` → `PoolSent` in `slot`: a prefetched page landed in the pool.
    pub(crate) fn prefetch_to_pool(&mut self, addr: usize, slot: u32) {
        if let Some((_, e)) = self.apply(addr, Transition::PrefetchToPool) {
            e.slot = slot;
        }
    }

    /// Any state → `Empty`: the program released the page. Returns the pool slot and far page
    /// it held. A page being evicted keeps its residency until the evictor's commit sees it
    /// gone ([`Pages::eviction_lost`]).
    pub(crate) fn release(&mut self, addr: usize) -> Released {
        let Some((before, e)) = self.apply(addr, Transition::Release) else {
            return Released::default();
        };
        *e = Entry::default();
        self.settle_release(addr, before)
    }

    /// The counts and policy of a released page whose entry was `before`.
    fn settle_release(&mut self, addr: usize, before: Entry) -> Released {
        if before.state.is_resident() {
            self.resident -= 1;
            self.policy.remove(pid_of(addr));
        }
        Released {
            slot: before.state.in_pool().then_some(before.slot),
            far: (before.far != NO_FAR).then_some(before.far),
        }
    }

    /// Releases every page of `start..end` (see [`Pages::release`]) and, if `unmapped`,
    /// removes the range from the regions. Returns what the released pages held.
    pub(crate) fn release_range(
        &mut self,
        start: usize,
        end: usize,
        unmapped: bool,
    ) -> Vec<(usize, Released)> {
        let out = self
            .entries_in(start, end)
            .into_iter()
            .map(|(a, _)| (a, self.release(a)))
            .collect();
        if unmapped {
            self.table.remove_range(start, end);
        }
        out
    }

    /// mremap moved `len` bytes from `from` to `to`: moves their entries (a send in flight is
    /// forgotten and the page resent later; a fetch in flight is dropped). Returns the moved
    /// entries by new address (for the pool slots' owners), or `Err` with what the pages held
    /// if `to` partly overlaps another region (the pages are then forgotten). The only
    /// `Evicting` pages may be ones being dropped ([`crate::threads::cow`], which follows them): the
    /// caller settles the other evictions first.
    #[allow(clippy::type_complexity)]
    pub(crate) fn remap(
        &mut self,
        from: usize,
        to: usize,
        len: usize,
    ) -> Result<Vec<(usize, Entry)>, Vec<(usize, Released)>> {
        let moved = self.entries_in(from, from + len);
        self.table.remove_range(from, from + len);
        if self.table.find(to).is_none_or(|(_, end)| end < to + len) {
            if self.table.overlaps(to, to + len) {
                let released = moved
                    .into_iter()
                    .map(|(a, e)| (a, self.settle_release(a, e)))
                    .collect();
                return Err(released);
            }
            self.table.add(to, to + len);
        }
        let mut out = Vec::with_capacity(moved.len());
        for (a, mut e) in moved {
            let new = to + (a - from);
            let Some(state) = next_state(e.state, Transition::Remap) else {
                debug_assert!(false, "remap of a page in state {:?}", e.state);
                tracing::error!(
                    "internal error: remap of page {a:#x} in state {:?}",
                    e.state
                );
                continue;
            };
            if e.state.is_resident() {
                self.policy.remove(pid_of(a));
                self.policy.insert(pid_of(new), Origin::Demand);
            }
            e.state = state;
            if let Some(m) = self.table.get_mut(new) {
                *m = e;
            }
            out.push((new, e));
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests;
