//! What the heal thread ([`crate::threads::heal`]) decides, over plain data: what to do with
//! one far slab (wait, forget dead copies, copy it, no room, nothing to heal from), when its
//! periodic rounds are due, and how long a healing episode took. The heal thread applies these
//! decisions to the runtime; kept apart so they are unit-tested without donors.

use std::time::{Duration, Instant};

use crate::copies::slabcopy::Source;
use crate::slabs::replicas::Replicas;

/// How often dead donors are probed to see whether they came back.
pub(crate) const DEAD_PROBE_EVERY: Duration = Duration::from_secs(2);
/// How often donors are asked which slabs they want back ([`crate::threads::migrate`]).
pub(crate) const RECLAIM_POLL_EVERY: Duration = Duration::from_millis(250);
/// After re-replication found no donor to copy to, how long before it looks again.
pub(crate) const NO_ROOM_RETRY: Duration = Duration::from_secs(1);

/// A donor's health as re-replication sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum DonorState {
    Live,
    Suspect,
    Dead,
}

/// What re-replication does with one far slab.
pub(crate) enum SlabPlan {
    /// A copy's donor is suspected: wait for the verdict.
    Wait,
    /// Enough complete live copies: forget the copies on these dead donors.
    Enough { forget: Vec<usize> },
    /// Short of copies: copy it from `Source` to a new donor.
    Copy(Source),
    /// Short of copies, but every live donor already holds one.
    NoRoom,
    /// No copy left to heal from (and no backup file): lost unless its donor returns.
    Lost,
}

/// Decides what to do with a far slab whose copies are `r`, when `wanted` copies are wanted,
/// `live_donors` donors are live and `backup` says whether a backup file can be copied from.
pub(crate) fn plan_slab(
    r: &Replicas,
    state: impl Fn(usize) -> DonorState,
    wanted: usize,
    live_donors: usize,
    backup: bool,
) -> SlabPlan {
    if r.as_slice()
        .iter()
        .any(|x| state(x.donor) == DonorState::Suspect)
    {
        return SlabPlan::Wait;
    }
    let live: Vec<_> = r
        .readable()
        .filter(|x| state(x.donor) == DonorState::Live)
        .collect();
    if live.len() >= wanted {
        let forget = r
            .as_slice()
            .iter()
            .filter(|x| state(x.donor) == DonorState::Dead)
            .map(|x| x.donor)
            .collect();
        return SlabPlan::Enough { forget };
    }
    let source = match live.first() {
        Some(x) => Source::Donor(*x),
        None if backup => Source::Backup,
        None => return SlabPlan::Lost,
    };
    if live_donors <= live.len() {
        return SlabPlan::NoRoom;
    }
    SlabPlan::Copy(source)
}

/// What one step of re-replication did.
pub(crate) enum Healed {
    /// Copied one slab.
    One,
    /// Slabs need copies but no live donor can take one now (why, when a try failed).
    NoRoom { why: Option<String> },
    /// Nothing (more) to do.
    Nothing,
}

/// When the heal thread's periodic work is due.
pub(crate) struct Rounds {
    next_dead_probe: Instant,
    next_reclaim_poll: Instant,
    /// Re-replication waits until then (no donor had room).
    blocked_until: Instant,
    /// The last step copied a slab: the next one follows without waiting.
    pub(crate) more: bool,
}

impl Rounds {
    /// Rounds starting at `now`: the first reclaim poll at once, the first dead probe later.
    pub(crate) fn new(now: Instant) -> Rounds {
        Rounds {
            next_dead_probe: now + DEAD_PROBE_EVERY,
            next_reclaim_poll: now,
            blocked_until: now,
            more: false,
        }
    }

    /// When the next periodic work is due (the thread sleeps until then unless woken).
    pub(crate) fn due(&self) -> Instant {
        self.next_reclaim_poll.min(self.next_dead_probe)
    }

    /// Whether dead donors are probed in this round (the next such round is then scheduled).
    pub(crate) fn dead_round(&mut self, now: Instant) -> bool {
        let due = now >= self.next_dead_probe;
        if due {
            self.next_dead_probe = now + DEAD_PROBE_EVERY;
        }
        due
    }

    /// Whether donors are asked for their reclaims now.
    pub(crate) fn reclaim_due(&self, now: Instant) -> bool {
        now >= self.next_reclaim_poll
    }

    /// The reclaim poll is done at `now`.
    pub(crate) fn reclaimed(&mut self, now: Instant) {
        self.next_reclaim_poll = now + RECLAIM_POLL_EVERY;
    }

    /// Whether re-replication may take a step now (not waiting after finding no room).
    pub(crate) fn may_heal(&mut self, now: Instant) -> bool {
        self.more = false;
        now >= self.blocked_until
    }

    /// A step of re-replication ended with `healed` at `now`.
    pub(crate) fn healed(&mut self, healed: &Healed, now: Instant) {
        match healed {
            Healed::One => self.more = true,
            Healed::NoRoom { .. } => self.blocked_until = now + NO_ROOM_RETRY,
            Healed::Nothing => {}
        }
    }
}

/// A healing episode: since when slabs have been re-replicated without a pause, timed from
/// the donor death that started it (each death once).
pub(crate) struct Episode {
    since: Option<Instant>,
    /// The death each donor had when last looked at: a new one starts an episode.
    deaths_seen: Vec<Option<Instant>>,
}

impl Episode {
    /// No episode, with `donors` donors.
    pub(crate) fn new(donors: usize) -> Episode {
        Episode {
            since: None,
            deaths_seen: vec![None; donors],
        }
    }

    /// Donor `d`'s death (when declared), as seen now.
    pub(crate) fn saw(&mut self, d: usize, death: Option<Instant>) {
        let seen = &mut self.deaths_seen[d];
        if death.is_some() && death != *seen {
            *seen = death;
            if let Some(at) = death {
                self.since.get_or_insert(at);
            }
        }
    }

    /// A slab was copied at `now`.
    pub(crate) fn copied(&mut self, now: Instant) {
        self.since.get_or_insert(now);
    }

    /// Nothing is left to heal at `now`: how long the episode took, if one was running.
    pub(crate) fn done(&mut self, now: Instant) -> Option<Duration> {
        self.since
            .take()
            .map(|t0| now.saturating_duration_since(t0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn states(s: &'static [DonorState]) -> impl Fn(usize) -> DonorState {
        move |d| s[d]
    }

    use DonorState::{Dead, Live, Suspect};

    #[test]
    fn a_slab_with_enough_live_copies_is_not_copied_and_forgets_dead_ones() {
        let r = Replicas::of(&[(0, false), (1, false), (2, false)]);
        match plan_slab(&r, states(&[Live, Live, Dead, Live]), 2, 3, false) {
            SlabPlan::Enough { forget } => assert_eq!(forget, vec![2]),
            _ => panic!("a slab with 2 live copies of 2 wanted is not healed"),
        }
    }

    #[test]
    fn a_slab_short_of_copies_is_copied_from_its_first_live_complete_copy() {
        // Donor 0's copy is still filling: not a source.
        let r = Replicas::of(&[(0, true), (1, false), (2, false)]);
        match plan_slab(&r, states(&[Live, Dead, Live, Live]), 2, 3, false) {
            SlabPlan::Copy(Source::Donor(x)) => assert_eq!(x.donor, 2),
            _ => panic!("one live complete copy of 2 wanted: copied from donor 2"),
        }
    }

    #[test]
    fn a_suspected_copy_waits_for_the_verdict() {
        let r = Replicas::of(&[(0, false), (1, false)]);
        assert!(matches!(
            plan_slab(&r, states(&[Live, Suspect, Live]), 2, 2, true),
            SlabPlan::Wait
        ));
    }

    #[test]
    fn no_room_when_every_live_donor_holds_a_copy() {
        let r = Replicas::of(&[(0, false), (1, false)]);
        assert!(matches!(
            plan_slab(&r, states(&[Live, Dead, Dead]), 2, 1, false),
            SlabPlan::NoRoom
        ));
    }

    #[test]
    fn without_a_live_copy_the_backup_is_the_source_or_the_slab_is_lost() {
        let r = Replicas::of(&[(0, false)]);
        assert!(matches!(
            plan_slab(&r, states(&[Dead, Live]), 1, 1, true),
            SlabPlan::Copy(Source::Backup)
        ));
        assert!(matches!(
            plan_slab(&r, states(&[Dead, Live]), 1, 1, false),
            SlabPlan::Lost
        ));
    }

    #[test]
    fn after_no_room_healing_waits_a_second_then_retries() {
        let t0 = Instant::now();
        let mut rounds = Rounds::new(t0);
        assert!(rounds.may_heal(t0));
        rounds.healed(&Healed::NoRoom { why: None }, t0);
        assert!(!rounds.may_heal(t0 + NO_ROOM_RETRY / 2));
        assert!(rounds.may_heal(t0 + NO_ROOM_RETRY));
        rounds.healed(&Healed::One, t0);
        assert!(rounds.more, "a copied slab is followed by the next at once");
        assert!(rounds.may_heal(t0 + NO_ROOM_RETRY));
        assert!(!rounds.more);
    }

    #[test]
    fn dead_probes_and_reclaim_polls_come_when_due() {
        let t0 = Instant::now();
        let mut rounds = Rounds::new(t0);
        assert_eq!(rounds.due(), t0, "the first reclaim poll is at once");
        assert!(rounds.reclaim_due(t0));
        rounds.reclaimed(t0);
        assert!(!rounds.reclaim_due(t0 + RECLAIM_POLL_EVERY / 2));
        assert_eq!(rounds.due(), t0 + RECLAIM_POLL_EVERY);
        assert!(!rounds.dead_round(t0 + Duration::from_secs(1)));
        let t1 = t0 + DEAD_PROBE_EVERY;
        assert!(rounds.dead_round(t1));
        assert!(
            !rounds.dead_round(t1),
            "one dead round, then the next is scheduled"
        );
        assert!(rounds.dead_round(t1 + DEAD_PROBE_EVERY));
    }

    #[test]
    fn an_episode_is_timed_from_the_first_death_and_counts_each_death_once() {
        let t0 = Instant::now();
        let mut e = Episode::new(2);
        assert_eq!(e.done(t0), None, "no episode without a death or a copy");
        e.saw(0, Some(t0));
        e.saw(1, None);
        e.copied(t0 + Duration::from_secs(1));
        assert_eq!(
            e.done(t0 + Duration::from_secs(3)),
            Some(Duration::from_secs(3))
        );
        // The same death seen again starts nothing; a copy alone starts an episode at once.
        e.saw(0, Some(t0));
        assert_eq!(e.done(t0 + Duration::from_secs(4)), None);
        e.copied(t0 + Duration::from_secs(5));
        assert_eq!(
            e.done(t0 + Duration::from_secs(6)),
            Some(Duration::from_secs(1))
        );
    }
}
