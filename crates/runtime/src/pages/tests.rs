//! Unit tests of the page states: the legality table and one test per transition.

use super::*;

const P: usize = PAGE_SIZE;
const BASE: usize = 0x4000_0000;

fn pages() -> Pages {
    let mut p = Pages::new(farmem_policy::evict::by_name("fifo").unwrap());
    p.add_region(BASE, BASE + 64 * P);
    p
}

fn state(p: &Pages, addr: usize) -> PageState {
    p.get(addr).unwrap().state
}

/// What the evictor's pick does: the policy lets go of the page.
fn pick(p: &mut Pages, addr: usize) {
    let before = p.policy.len();
    p.policy.remove(pid_of(addr));
    assert_eq!(p.policy.len() + 1, before, "the page was in the policy");
}

/// Puts the page at `addr` in `s` through legal transitions.
fn reach(p: &mut Pages, addr: usize, s: PageState) {
    use PageState as S;
    match s {
        S::Empty => {}
        S::ResidentDirty => p.install_zero(addr),
        S::ResidentClean => {
            reach(p, addr, S::PoolSent);
            p.install_from_pool(addr, true, Origin::Demand);
        }
        S::ResidentSending => {
            reach(p, addr, S::PoolUnsent);
            p.install_from_pool(addr, true, Origin::Demand);
        }
        S::Evicting => {
            reach(p, addr, S::ResidentDirty);
            pick(p, addr);
            p.begin_eviction(addr);
        }
        S::PoolUnsent => {
            reach(p, addr, S::Evicting);
            p.commit_dirty(addr, 3, 7, 11);
        }
        S::PoolSent => {
            reach(p, addr, S::PoolUnsent);
            assert!(p.mark_sent(addr, Some(3), 7));
        }
        S::Remote => {
            reach(p, addr, S::PoolSent);
            assert!(p.reclaim(addr, 3));
        }
        S::Fetching => {
            reach(p, addr, S::Remote);
            p.begin_fetch(addr);
        }
    }
    assert_eq!(state(p, addr), s);
}

use PageState as S;
use Transition as T;

/// Every legal (transition, from, to); every other pair is illegal.
const LEGAL: &[(T, &[(S, S)])] = &[
    (T::InstallZero, &[(S::Empty, S::ResidentDirty)]),
    (
        T::InstallFromPoolMoved,
        &[
            (S::PoolSent, S::ResidentDirty),
            (S::PoolUnsent, S::ResidentDirty),
        ],
    ),
    (
        T::InstallFromPoolProtected,
        &[
            (S::PoolSent, S::ResidentClean),
            (S::PoolUnsent, S::ResidentSending),
        ],
    ),
    (
        T::InstallFetched { write: false },
        &[(S::Fetching, S::ResidentClean)],
    ),
    (
        T::InstallFetched { write: true },
        &[(S::Fetching, S::ResidentDirty)],
    ),
    (T::InstallPrefetched, &[(S::Remote, S::ResidentClean)]),
    (
        T::InstallForFork,
        &[
            (S::PoolSent, S::ResidentDirty),
            (S::PoolUnsent, S::ResidentDirty),
            (S::Remote, S::ResidentDirty),
        ],
    ),
    (T::Inherit, &[(S::Empty, S::Remote)]),
    (
        T::MarkDirty,
        &[
            (S::ResidentClean, S::ResidentDirty),
            (S::ResidentDirty, S::ResidentDirty),
            (S::ResidentSending, S::ResidentDirty),
        ],
    ),
    (T::BeginFetch, &[(S::Remote, S::Fetching)]),
    (T::AbandonFetch, &[(S::Fetching, S::Remote)]),
    (
        T::BeginEviction,
        &[
            (S::ResidentClean, S::Evicting),
            (S::ResidentDirty, S::Evicting),
            (S::ResidentSending, S::Evicting),
        ],
    ),
    (
        T::RefuseEviction { clean: false },
        &[(S::Evicting, S::ResidentDirty)],
    ),
    (
        T::RefuseEviction { clean: true },
        &[(S::Evicting, S::ResidentClean)],
    ),
    (T::CommitClean, &[(S::Evicting, S::PoolSent)]),
    (T::CommitZero, &[(S::Evicting, S::Empty)]),
    (T::CommitDirty, &[(S::Evicting, S::PoolUnsent)]),
    (
        T::MarkSent,
        &[
            (S::PoolUnsent, S::PoolSent),
            (S::ResidentSending, S::ResidentClean),
        ],
    ),
    (T::Reclaim, &[(S::PoolSent, S::Remote)]),
    (T::PrefetchToPool, &[(S::Remote, S::PoolSent)]),
    (
        T::Release,
        &[
            (S::Empty, S::Empty),
            (S::ResidentClean, S::Empty),
            (S::ResidentDirty, S::Empty),
            (S::ResidentSending, S::Empty),
            (S::Evicting, S::Empty),
            (S::PoolUnsent, S::Empty),
            (S::PoolSent, S::Empty),
            (S::Remote, S::Empty),
            (S::Fetching, S::Empty),
        ],
    ),
    (
        T::Remap,
        &[
            (S::Empty, S::Empty),
            (S::ResidentClean, S::ResidentClean),
            (S::ResidentDirty, S::ResidentDirty),
            (S::ResidentSending, S::ResidentDirty),
            (S::Evicting, S::Evicting),
            (S::PoolUnsent, S::PoolUnsent),
            (S::PoolSent, S::PoolSent),
            (S::Remote, S::Remote),
            (S::Fetching, S::Remote),
        ],
    ),
];

#[test]
fn legality_table_accepts_exactly_the_legal_pairs() {
    let legal = LEGAL;
    assert_eq!(
        legal.len(),
        Transition::ALL.len(),
        "every transition is in the table"
    );
    let mut checked = 0;
    for &t in &Transition::ALL {
        let row = legal
            .iter()
            .find(|(x, _)| *x == t)
            .expect("transition in the table")
            .1;
        for &from in &PageState::ALL {
            let want = row.iter().find(|(f, _)| *f == from).map(|(_, to)| *to);
            assert_eq!(next_state(from, t), want, "{t:?} from {from:?}");
            checked += 1;
        }
    }
    assert_eq!(checked, 22 * 9);
}

#[test]
fn install_zero_counts_residency_peak_and_policy() {
    let mut p = pages();
    p.install_zero(BASE);
    p.install_zero(BASE + P);
    assert_eq!(state(&p, BASE), PageState::ResidentDirty);
    assert_eq!((p.resident(), p.peak_resident()), (2, 2));
    let r = p.release(BASE);
    assert_eq!(r, Released::default());
    assert_eq!((p.resident(), p.peak_resident()), (1, 2));
    assert_eq!(p.pick_victim(), Some((BASE / P + 1) as u64));
    assert_eq!(p.pick_victim(), None, "the released page left the policy");
}

#[test]
fn adopt_is_a_resident_dirty_page() {
    let mut p = pages();
    p.adopt(BASE + 5 * P);
    assert_eq!(state(&p, BASE + 5 * P), PageState::ResidentDirty);
    assert_eq!(p.resident(), 1);
}

#[test]
fn install_from_pool_moved_or_protected() {
    let mut p = pages();
    reach(&mut p, BASE, PageState::PoolSent);
    assert_eq!(p.resident(), 0);
    assert_eq!(p.install_from_pool(BASE, false, Origin::Demand), Some(3));
    assert_eq!(state(&p, BASE), PageState::ResidentDirty);
    reach(&mut p, BASE + P, PageState::PoolUnsent);
    assert_eq!(
        p.install_from_pool(BASE + P, true, Origin::Prefetch),
        Some(3)
    );
    assert_eq!(state(&p, BASE + P), PageState::ResidentSending);
    assert_eq!((p.resident(), p.peak_resident()), (2, 2));
}

#[test]
fn fetch_begins_installs_or_is_abandoned() {
    let mut p = pages();
    reach(&mut p, BASE, PageState::Remote);
    assert_eq!(p.begin_fetch(BASE), Some(11));
    p.abandon_fetch(BASE);
    assert_eq!(state(&p, BASE), PageState::Remote);
    p.begin_fetch(BASE);
    p.install_fetched(BASE, false, Origin::Demand);
    assert_eq!(state(&p, BASE), PageState::ResidentClean);
    reach(&mut p, BASE + P, PageState::Fetching);
    p.install_fetched(BASE + P, true, Origin::Prefetch);
    assert_eq!(state(&p, BASE + P), PageState::ResidentDirty);
    assert_eq!(p.resident(), 2);
}

#[test]
fn install_prefetched_is_clean_and_counted() {
    let mut p = pages();
    reach(&mut p, BASE, PageState::Remote);
    p.install_prefetched(BASE, Origin::Prefetch, false);
    assert_eq!(state(&p, BASE), PageState::ResidentClean);
    assert_eq!((p.resident(), p.peak_resident()), (1, 1));
}

#[test]
fn install_for_fork_returns_the_pool_slot() {
    let mut p = pages();
    reach(&mut p, BASE, PageState::PoolUnsent);
    assert_eq!(p.install_for_fork(BASE), Some(3));
    reach(&mut p, BASE + P, PageState::Remote);
    assert_eq!(p.install_for_fork(BASE + P), None);
    assert_eq!(state(&p, BASE + P), PageState::ResidentDirty);
    assert_eq!(p.resident(), 2);
}

#[test]
fn mark_dirty_from_clean() {
    let mut p = pages();
    reach(&mut p, BASE, PageState::ResidentClean);
    p.mark_dirty(BASE);
    assert_eq!(state(&p, BASE), PageState::ResidentDirty);
}

#[test]
fn only_a_dirty_page_is_armed_and_its_next_transition_disarms_it() {
    let mut p = pages();
    reach(&mut p, BASE, PageState::ResidentClean);
    assert!(!p.arm(BASE), "a clean page is write-protected already");
    assert!(!p.arm(BASE + P), "an empty page");
    p.mark_dirty(BASE);
    assert!(p.arm(BASE));
    assert!(p.get(BASE).unwrap().armed);
    assert_eq!(p.resident(), 1, "arming is not an install");
    // Its write-protect fault reports the sample and clears it.
    assert!(p.mark_dirty(BASE).unwrap().armed);
    assert!(!p.get(BASE).unwrap().armed);
    // An eviction clears it too.
    assert!(p.arm(BASE));
    assert_eq!(p.begin_eviction(BASE), Some(false));
    assert!(!p.get(BASE).unwrap().armed);
}

#[test]
fn eviction_begins_and_commits_three_ways() {
    let mut p = pages();
    for i in 0..3 {
        p.install_zero(BASE + i * P);
        pick(&mut p, BASE + i * P);
        assert_eq!(p.begin_eviction(BASE + i * P), Some(false));
    }
    assert_eq!((p.evicting(), p.resident()), (3, 3));
    p.commit_clean(BASE, 1);
    p.commit_dirty(BASE + P, 2, 9, 40);
    let e = p.get(BASE + P).unwrap();
    assert_eq!(
        (e.state, e.slot, e.gen, e.far),
        (PageState::PoolUnsent, 2, 9, 40)
    );
    assert_eq!(p.commit_zero(BASE + 2 * P), None);
    assert_eq!(state(&p, BASE + 2 * P), PageState::Empty);
    assert_eq!(state(&p, BASE), PageState::PoolSent);
    assert_eq!((p.evicting(), p.resident()), (0, 0));
}

#[test]
fn refused_eviction_stays_resident() {
    let mut p = pages();
    reach(&mut p, BASE, PageState::ResidentClean);
    pick(&mut p, BASE);
    assert_eq!(p.begin_eviction(BASE), Some(true));
    p.refuse_eviction(BASE, true);
    assert_eq!(state(&p, BASE), PageState::ResidentClean);
    assert_eq!((p.evicting(), p.resident()), (0, 1));
    assert_eq!(p.pick_victim(), Some((BASE / P) as u64), "requeued");
}

#[test]
fn a_release_during_eviction_is_settled_at_commit() {
    let mut p = pages();
    reach(&mut p, BASE, PageState::Evicting);
    assert_eq!(p.release(BASE), Released::default());
    assert_eq!(p.resident(), 1, "the evictor settles it");
    p.eviction_lost();
    assert_eq!((p.evicting(), p.resident()), (0, 0));
}

#[test]
fn mark_sent_only_for_the_same_send() {
    let mut p = pages();
    reach(&mut p, BASE, PageState::PoolUnsent);
    assert!(!p.mark_sent(BASE, Some(3), 6), "another generation");
    assert!(!p.mark_sent(BASE, Some(4), 7), "another slot");
    assert!(p.mark_sent(BASE, Some(3), 7));
    assert_eq!(state(&p, BASE), PageState::PoolSent);
    reach(&mut p, BASE + P, PageState::ResidentSending);
    assert!(!p.mark_sent(BASE + P, None, 7), "resident: not a pool page");
    assert_eq!(state(&p, BASE + P), PageState::ResidentClean);
}

#[test]
fn reclaim_only_the_slots_sent_page() {
    let mut p = pages();
    reach(&mut p, BASE, PageState::PoolSent);
    assert!(!p.reclaim(BASE, 4));
    assert!(p.reclaim(BASE, 3));
    assert_eq!(state(&p, BASE), PageState::Remote);
    assert!(!p.reclaim(BASE, 3));
}

#[test]
fn prefetch_to_pool_records_the_slot() {
    let mut p = pages();
    reach(&mut p, BASE, PageState::Remote);
    p.prefetch_to_pool(BASE, 9);
    let e = p.get(BASE).unwrap();
    assert_eq!((e.state, e.slot, e.far), (PageState::PoolSent, 9, 11));
}

#[test]
fn release_returns_slot_and_far_page() {
    let mut p = pages();
    reach(&mut p, BASE, PageState::PoolSent);
    assert_eq!(
        p.release(BASE),
        Released {
            slot: Some(3),
            far: Some(11)
        }
    );
    assert_eq!(p.get(BASE), Some(Entry::default()));
    p.install_zero(BASE + P);
    let r = p.release_range(BASE, BASE + 8 * P, true);
    assert_eq!(r.len(), 1);
    assert_eq!(p.resident(), 0);
    assert_eq!(p.get(BASE), None, "unmapped");
}

#[test]
fn remap_moves_entries_and_drops_sends_and_fetches() {
    let mut p = pages();
    reach(&mut p, BASE, PageState::ResidentSending);
    reach(&mut p, BASE + P, PageState::Fetching);
    reach(&mut p, BASE + 2 * P, PageState::PoolSent);
    let to = 0x8000_0000;
    let moved = p.remap(BASE, to, 4 * P).unwrap();
    assert_eq!(moved.len(), 3);
    assert_eq!(state(&p, to), PageState::ResidentDirty);
    assert_eq!(state(&p, to + P), PageState::Remote);
    assert_eq!(state(&p, to + 2 * P), PageState::PoolSent);
    assert_eq!(p.get(BASE), None);
    assert_eq!(p.pick_victim(), Some((to / P) as u64));
    // Onto part of another region: forgotten.
    p.add_region(0x9000_0000, 0x9000_0000 + 2 * P);
    let gone = p.remap(to, 0x9000_0000 - P, 4 * P).unwrap_err();
    assert_eq!(gone.len(), 3);
    assert_eq!(p.resident(), 0);
}

#[test]
fn a_zero_install_stays_zeroed_while_resident_and_not_after() {
    let mut p = pages();
    p.install_zero(BASE);
    assert!(p.get(BASE).unwrap().zeroed);
    // A write-protect fault and a refused eviction keep it: the page never left.
    p.mark_dirty(BASE);
    pick(&mut p, BASE);
    p.begin_eviction(BASE);
    assert!(p.get(BASE).unwrap().zeroed);
    p.refuse_eviction(BASE, false);
    assert!(p.get(BASE).unwrap().zeroed);
    // Evicted and brought back from the pool: its contents are the program's now.
    pick(&mut p, BASE);
    p.begin_eviction(BASE);
    p.commit_dirty(BASE, 3, 7, 11);
    assert!(!p.get(BASE).unwrap().zeroed);
    p.install_from_pool(BASE, false, Origin::Demand);
    assert!(!p.get(BASE).unwrap().zeroed);
    // A page adopted at registration holds the program's data: not zeroed.
    p.adopt(BASE + P);
    assert!(!p.get(BASE + P).unwrap().zeroed);
}
