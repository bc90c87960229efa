//! What a fork leaves far for the child, decided over plain data: a page's state, where its
//! far copy lives ([`FarCopy`]) and what this fork may lend ([`Lendable`]). The fork's steps
//! ([`super::before_fork`], [`super::back`]) gather those under the state lock and act on the
//! answer; the rules are unit-tested here.

use std::collections::BTreeMap;

use crate::far::Home;
use crate::pages::{PageState, NO_FAR};
use crate::shared::{Shared, State};
use crate::slabs::memslabs::MemKind;

/// What a fork may leave far for the child.
#[derive(Default)]
pub(in crate::fork) struct Lendable {
    /// Memory slabs, by index, with their kind at the time they were held (a slab the node
    /// took back meanwhile changes kind, and its pages are brought back instead).
    pub(in crate::fork) memory: BTreeMap<u32, MemKind>,
    /// Pages on donors may be left there (the fork's hold is mapped).
    pub(in crate::fork) donors: bool,
}

impl Lendable {
    pub(in crate::fork) fn is_empty(&self) -> bool {
        self.memory.is_empty() && !self.donors
    }
}

/// Where a lent page's far copy is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(in crate::fork) enum LentAt {
    /// In memory slab `m` (the host tier, or one this process borrowed).
    Memory(u32),
    /// On this process's donors.
    Donors,
    /// On donors, borrowed from this process's parent ([`Home::Borrowed`]).
    Borrowed,
}

/// Where a page's far copy lives now: its slab's home and, for a memory slab, that slab's
/// kind.
#[derive(Clone, Copy, Debug, Default)]
pub(in crate::fork) struct FarCopy {
    home: Option<Home>,
    kind: Option<MemKind>,
}

impl FarCopy {
    /// Looks far page `far` up (nothing, when this fork lends nothing: the lookup is skipped).
    pub(in crate::fork) fn of(sh: &Shared, st: &State, lendable: &Lendable, far: u64) -> FarCopy {
        if far == NO_FAR || lendable.is_empty() {
            return FarCopy::default();
        }
        let home = sh.far.home(far).map(|(h, _)| h);
        let kind = match home {
            Some(Home::Memory(m)) => st.mem.get(m).map(|s| s.kind),
            _ => None,
        };
        FarCopy { home, kind }
    }
}

/// Whether a page in `state` with far copy `copy` is left where it is for the child: remote
/// in a lendable memory slab, or on donors when those are lendable and a copy is readable.
pub(in crate::fork) fn lent_at(
    state: PageState,
    copy: FarCopy,
    lendable: &Lendable,
) -> Option<LentAt> {
    if state != PageState::Remote {
        return None;
    }
    if let Some(m) = lendable_slab(copy, lendable) {
        return Some(LentAt::Memory(m));
    }
    // Donor pages are left far only with a hold to learn when the child is gone.
    if !lendable.donors {
        return None;
    }
    match copy.home {
        Some(Home::Donors(r)) if r.readable().next().is_some() => Some(LentAt::Donors),
        // Borrowed from this process's own parent: lent on (the child reads it as that
        // parent's client, as this process does).
        Some(Home::Borrowed(r)) if !r.is_empty() => Some(LentAt::Borrowed),
        _ => None,
    }
}

/// Whether a resident page in `state` has a copy in a lendable memory slab that the child may
/// use instead of the page (if the page still equals it): not while that copy is being
/// rewritten.
pub(in crate::fork) fn lent_copy(
    state: PageState,
    copy: FarCopy,
    lendable: &Lendable,
) -> Option<LentAt> {
    if state == PageState::ResidentSending {
        return None;
    }
    lendable_slab(copy, lendable).map(LentAt::Memory)
}

/// The lendable memory slab the copy lives in: held by this fork, and still of the kind it
/// had when held.
fn lendable_slab(copy: FarCopy, lendable: &Lendable) -> Option<u32> {
    let Some(Home::Memory(m)) = copy.home else {
        return None;
    };
    let kind = copy.kind?;
    (lendable.memory.get(&m) == Some(&kind)).then_some(m)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::slabs::replicas::Replicas;

    const TIER: MemKind = MemKind::Tier { id: 7 };

    fn lendable(memory: &[(u32, MemKind)], donors: bool) -> Lendable {
        Lendable {
            memory: memory.iter().copied().collect(),
            donors,
        }
    }

    fn in_memory(m: u32, kind: MemKind) -> FarCopy {
        FarCopy {
            home: Some(Home::Memory(m)),
            kind: Some(kind),
        }
    }

    fn on_donors(list: &[(usize, bool)]) -> FarCopy {
        FarCopy {
            home: Some(Home::Donors(Replicas::of(list))),
            kind: None,
        }
    }

    #[test]
    fn a_remote_page_in_a_held_tier_slab_is_lent_there() {
        let l = lendable(&[(3, TIER)], false);
        assert_eq!(
            lent_at(PageState::Remote, in_memory(3, TIER), &l),
            Some(LentAt::Memory(3))
        );
        // Another slab, not held by this fork: brought back.
        assert_eq!(lent_at(PageState::Remote, in_memory(4, TIER), &l), None);
    }

    #[test]
    fn a_slab_the_node_took_back_meanwhile_lends_nothing() {
        // Held as a tier slab; now private memory (the node asked for it back).
        let l = lendable(&[(3, TIER)], false);
        assert_eq!(
            lent_at(PageState::Remote, in_memory(3, MemKind::Local), &l),
            None
        );
        // Gone altogether.
        let gone = FarCopy {
            home: Some(Home::Memory(3)),
            kind: None,
        };
        assert_eq!(lent_at(PageState::Remote, gone, &l), None);
    }

    #[test]
    fn donor_pages_are_lent_only_with_the_forks_hold_and_a_readable_copy() {
        // (donor, still being filled)
        let copy = on_donors(&[(0, false), (1, false)]);
        assert_eq!(
            lent_at(PageState::Remote, copy, &lendable(&[], false)),
            None
        );
        assert_eq!(
            lent_at(PageState::Remote, copy, &lendable(&[], true)),
            Some(LentAt::Donors)
        );
        // No copy complete yet (each still being filled): the page is brought back.
        let filling = on_donors(&[(0, true), (1, true)]);
        assert_eq!(
            lent_at(PageState::Remote, filling, &lendable(&[], true)),
            None
        );
        // No copy at all (its donors lost).
        assert_eq!(
            lent_at(PageState::Remote, on_donors(&[]), &lendable(&[], true)),
            None
        );
    }

    #[test]
    fn pages_borrowed_from_a_parent_are_lent_on() {
        let borrowed = FarCopy {
            home: Some(Home::Borrowed(Replicas::of(&[(0, false)]))),
            kind: None,
        };
        assert_eq!(
            lent_at(PageState::Remote, borrowed, &lendable(&[], true)),
            Some(LentAt::Borrowed)
        );
        assert_eq!(
            lent_at(PageState::Remote, borrowed, &lendable(&[], false)),
            None
        );
    }

    #[test]
    fn only_remote_pages_are_left_far() {
        let l = lendable(&[(3, TIER)], true);
        for state in [
            PageState::Empty,
            PageState::ResidentClean,
            PageState::ResidentDirty,
            PageState::PoolSent,
            PageState::PoolUnsent,
            PageState::Fetching,
        ] {
            assert_eq!(lent_at(state, in_memory(3, TIER), &l), None, "{state:?}");
        }
    }

    #[test]
    fn a_resident_page_may_leave_its_held_copy_but_not_one_being_rewritten() {
        let l = lendable(&[(3, TIER)], false);
        assert_eq!(
            lent_copy(PageState::ResidentClean, in_memory(3, TIER), &l),
            Some(LentAt::Memory(3))
        );
        assert_eq!(
            lent_copy(PageState::ResidentSending, in_memory(3, TIER), &l),
            None
        );
        // A copy on donors is never used instead of a resident page.
        assert_eq!(
            lent_copy(
                PageState::ResidentClean,
                on_donors(&[(0, false)]),
                &lendable(&[], true)
            ),
            None
        );
    }

    #[test]
    fn nothing_lendable_means_nothing_lent() {
        let l = Lendable::default();
        assert!(l.is_empty());
        assert!(!lendable(&[], true).is_empty());
        assert_eq!(lent_at(PageState::Remote, in_memory(3, TIER), &l), None);
    }
}
