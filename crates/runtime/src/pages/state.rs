//! The page states, the transitions between them and their legality ([`next_state`]): pure
//! data, used by [`super::Pages`] and tested for every (state, transition) pair.

/// No far copy.
pub(crate) const NO_FAR: u64 = u64::MAX;

/// Where a page is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub(crate) enum PageState {
    /// Never written, or released by the program: reads as zeros, nothing stored anywhere.
    #[default]
    Empty,
    /// Resident, write-protected since it was installed from an up-to-date donor copy.
    ResidentClean,
    /// Resident and possibly written since its donor copy (or it has none).
    ResidentDirty,
    /// Resident, write-protected, and equal to the write-back send in flight (generation
    /// `gen`): becomes `ResidentClean` when the donor acknowledges it, `ResidentDirty` on a
    /// write.
    ResidentSending,
    /// The evictor is moving it to the pool right now.
    Evicting,
    /// In a pool slot, not yet acknowledged by its donor.
    PoolUnsent,
    /// In a pool slot, and its donor holds the same data (reclaimable cache).
    PoolSent,
    /// Only on its donor.
    Remote,
    /// The fault loop is fetching it from its donor (or waits for its prefetch).
    Fetching,
}

#[cfg(test)]
impl PageState {
    /// Every state, for tables and tests.
    pub(crate) const ALL: [PageState; 9] = [
        PageState::Empty,
        PageState::ResidentClean,
        PageState::ResidentDirty,
        PageState::ResidentSending,
        PageState::Evicting,
        PageState::PoolUnsent,
        PageState::PoolSent,
        PageState::Remote,
        PageState::Fetching,
    ];
}

impl PageState {
    /// Mapped in its region (counted in the resident pages).
    pub(crate) fn is_resident(self) -> bool {
        matches!(
            self,
            PageState::ResidentClean | PageState::ResidentDirty | PageState::ResidentSending
        )
    }

    /// In a write-back pool slot.
    pub(crate) fn in_pool(self) -> bool {
        matches!(self, PageState::PoolSent | PageState::PoolUnsent)
    }
}

/// One page's entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Entry {
    pub(crate) state: PageState,
    /// Pool slot (meaningful in the Pool* states).
    pub(crate) slot: u32,
    /// Staging generation of the send in flight (PoolUnsent, ResidentSending).
    pub(crate) gen: u32,
    /// Far page number of its donor copy, or [`NO_FAR`].
    pub(crate) far: u64,
    /// Installed ahead write-protected and not written since (cleared by every transition):
    /// its write-protect fault tells [`farmem_policy::ahead_writes`] it was written.
    pub(crate) ahead: bool,
    /// Dirty, and write-protected by the evictor as a sample of its chunk's writes, not
    /// written since (cleared by every transition): [`farmem_policy::write_heat`].
    pub(crate) armed: bool,
    /// Resident since a zero install (kept while it stays resident): a program release the
    /// kernel applies after the runtime handled its event may still take it away, which makes
    /// it released, not lost ([`crate::threads::events`]).
    pub(crate) zeroed: bool,
}

impl Default for Entry {
    fn default() -> Self {
        Entry {
            state: PageState::Empty,
            slot: 0,
            gen: 0,
            far: NO_FAR,
            ahead: false,
            armed: false,
            zeroed: false,
        }
    }
}

/// A change of a page's state. Each has one method on [`super::Pages`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Transition {
    /// A zero page for a never-written page, or a present page adopted at registration.
    InstallZero,
    /// A pool page handed back with MOVE (writable).
    InstallFromPoolMoved,
    /// A pool page copied back write-protected (it still equals, or is being sent as, its
    /// donor copy).
    InstallFromPoolProtected,
    /// A page fetched from its donor (demand read or awaited prefetch) installed for a fault.
    InstallFetched { write: bool },
    /// A prefetched page installed eagerly (marker mode), write-protected.
    InstallPrefetched,
    /// An evicted page brought back before fork.
    InstallForFork,
    /// A forked child's page left in a tier slab its parent lent it: remote from the start.
    Inherit,
    /// A write-protect fault: the page is written.
    MarkDirty,
    /// A demand read (or a wait for its prefetch) starts.
    BeginFetch,
    /// The read failed, or the page's install was refused: it is on its donor only again.
    AbandonFetch,
    /// The evictor picked the page and is moving it to a pool slot.
    BeginEviction,
    /// The MOVE was refused: the page stays resident (clean or dirty as before).
    RefuseEviction { clean: bool },
    /// Moved, and clean: its donor copy is current.
    CommitClean,
    /// Moved, and all zeros: dropped and forgotten.
    CommitZero,
    /// Moved, and dirty: staged for sending.
    CommitDirty,
    /// The donor acknowledged the send: a pool page becomes reclaimable, a resident page
    /// moved back while sending becomes clean.
    MarkSent,
    /// A sent pool page's slot is reclaimed: the page is on its donor only.
    Reclaim,
    /// A prefetched page landed in a pool slot.
    PrefetchToPool,
    /// The program released or unmapped the page: every copy is forgotten.
    Release,
    /// The page's entry moved with mremap.
    Remap,
}

#[cfg(test)]
impl Transition {
    /// Every transition, for tables and tests.
    pub(crate) const ALL: [Transition; 22] = [
        Transition::InstallZero,
        Transition::InstallFromPoolMoved,
        Transition::InstallFromPoolProtected,
        Transition::InstallFetched { write: false },
        Transition::InstallFetched { write: true },
        Transition::InstallPrefetched,
        Transition::InstallForFork,
        Transition::Inherit,
        Transition::MarkDirty,
        Transition::BeginFetch,
        Transition::AbandonFetch,
        Transition::BeginEviction,
        Transition::RefuseEviction { clean: false },
        Transition::RefuseEviction { clean: true },
        Transition::CommitClean,
        Transition::CommitZero,
        Transition::CommitDirty,
        Transition::MarkSent,
        Transition::Reclaim,
        Transition::PrefetchToPool,
        Transition::Release,
        Transition::Remap,
    ];
}

/// The state `t` leads to from `from`, or `None` when `t` is illegal there.
pub(crate) fn next_state(from: PageState, t: Transition) -> Option<PageState> {
    use PageState as S;
    use Transition as T;
    Some(match (t, from) {
        (T::InstallZero, S::Empty) => S::ResidentDirty,
        (T::InstallFromPoolMoved, S::PoolSent | S::PoolUnsent) => S::ResidentDirty,
        (T::InstallFromPoolProtected, S::PoolSent) => S::ResidentClean,
        (T::InstallFromPoolProtected, S::PoolUnsent) => S::ResidentSending,
        (T::InstallFetched { write: false }, S::Fetching) => S::ResidentClean,
        (T::InstallFetched { write: true }, S::Fetching) => S::ResidentDirty,
        (T::InstallPrefetched, S::Remote) => S::ResidentClean,
        (T::InstallForFork, S::PoolSent | S::PoolUnsent | S::Remote) => S::ResidentDirty,
        (T::Inherit, S::Empty) => S::Remote,
        (T::MarkDirty, s) if s.is_resident() => S::ResidentDirty,
        (T::BeginFetch, S::Remote) => S::Fetching,
        (T::AbandonFetch, S::Fetching) => S::Remote,
        (T::BeginEviction, s) if s.is_resident() => S::Evicting,
        (T::RefuseEviction { clean: true }, S::Evicting) => S::ResidentClean,
        (T::RefuseEviction { clean: false }, S::Evicting) => S::ResidentDirty,
        (T::CommitClean, S::Evicting) => S::PoolSent,
        (T::CommitZero, S::Evicting) => S::Empty,
        (T::CommitDirty, S::Evicting) => S::PoolUnsent,
        (T::MarkSent, S::PoolUnsent) => S::PoolSent,
        (T::MarkSent, S::ResidentSending) => S::ResidentClean,
        (T::Reclaim, S::PoolSent) => S::Remote,
        (T::PrefetchToPool, S::Remote) => S::PoolSent,
        (T::Release, _) => S::Empty,
        (T::Remap, S::ResidentSending) => S::ResidentDirty,
        (T::Remap, S::Fetching) => S::Remote,
        (T::Remap, s) => s,
        _ => return None,
    })
}
