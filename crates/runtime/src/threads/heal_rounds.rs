//! The heal thread's loop ([`crate::threads::heal`]) over the narrow interface it needs
//! ([`HealWorld`]: stop, wait, look at donors, the reclaim round, one step of re-replication,
//! say there is no room, record a finished healing), so its rounds are unit-tested with a fake.
//! The runtime's implementation is in [`crate::threads::heal`].

use std::time::{Duration, Instant};

use crate::failure_log::FailureLog;
use crate::threads::heal_plan::{Episode, Healed, Rounds};

/// What the heal loop needs from the runtime.
pub(crate) trait HealWorld {
    /// Shutdown was asked for.
    fn stopping(&self) -> bool;
    /// The time now.
    fn now(&self) -> Instant;
    /// How many donors there are.
    fn donors(&self) -> usize;
    /// Sleeps until `rounds` is due, unless woken or `rounds.more`.
    fn wait_for_work(&self, rounds: &Rounds);
    /// Probes suspected donors (and dead ones in a dead round); returns each donor's death,
    /// when declared.
    fn look_at_donors(&self, dead_round: bool) -> Vec<Option<Instant>>;
    /// Thaws, frees stale copies and moves slabs donors want back.
    fn reclaim_round(&self);
    /// One step of re-replication.
    fn heal_one(&self) -> Healed;
    /// Re-replication found no donor with room, because of `why`.
    fn no_room(&self, log: &mut FailureLog, why: String);
    /// Every slab that can be healed has its copies, `took` after the episode began.
    fn healed_all(&self, took: Duration);
}

/// The heal thread's loop: runs until `w` is stopping.
pub(crate) fn run(w: &impl HealWorld) {
    let mut rounds = Rounds::new(w.now());
    let mut episode = Episode::new(w.donors());
    let mut no_room_log = FailureLog::default();
    while !w.stopping() {
        w.wait_for_work(&rounds);
        let dead_round = rounds.dead_round(w.now());
        // Healing is timed from the death being declared (each death once).
        for (d, death) in w.look_at_donors(dead_round).into_iter().enumerate() {
            episode.saw(d, death);
        }
        if rounds.reclaim_due(w.now()) {
            w.reclaim_round();
            rounds.reclaimed(w.now());
        }
        if !rounds.may_heal(w.now()) {
            continue;
        }
        let healed = w.heal_one();
        rounds.healed(&healed, w.now());
        match healed {
            Healed::One => episode.copied(w.now()),
            Healed::NoRoom { why: Some(why) } => w.no_room(&mut no_room_log, why),
            Healed::NoRoom { why: None } => {}
            Healed::Nothing => {
                if let Some(took) = episode.done(w.now()) {
                    w.healed_all(took);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::{Cell, RefCell};
    use std::collections::VecDeque;

    use crate::threads::heal_plan::{DEAD_PROBE_EVERY, NO_ROOM_RETRY, RECLAIM_POLL_EVERY};

    /// A runtime whose clock moves 50 ms a sleep, whose re-replication answers from a script
    /// (then `Nothing`), and which stops after `rounds` waits.
    struct Fake {
        t0: Instant,
        now: Cell<Instant>,
        rounds: Cell<usize>,
        script: RefCell<VecDeque<Healed>>,
        death: Option<Instant>,
        heals: RefCell<Vec<Instant>>,
        reclaims: RefCell<Vec<Instant>>,
        dead_rounds: RefCell<Vec<Instant>>,
        no_room: RefCell<Vec<String>>,
        healed_all: RefCell<Vec<Duration>>,
    }

    const TICK: Duration = Duration::from_millis(50);

    impl Fake {
        fn new(rounds: usize, script: Vec<Healed>, death: Option<Duration>) -> Fake {
            let t0 = Instant::now();
            Fake {
                t0,
                now: Cell::new(t0),
                rounds: Cell::new(rounds),
                script: RefCell::new(script.into()),
                death: death.map(|d| t0 + d),
                heals: RefCell::default(),
                reclaims: RefCell::default(),
                dead_rounds: RefCell::default(),
                no_room: RefCell::default(),
                healed_all: RefCell::default(),
            }
        }

        fn since(&self, at: &[Instant]) -> Vec<Duration> {
            at.iter().map(|t| *t - self.t0).collect()
        }
    }

    impl HealWorld for Fake {
        fn stopping(&self) -> bool {
            self.rounds.get() == 0
        }
        fn now(&self) -> Instant {
            self.now.get()
        }
        fn donors(&self) -> usize {
            1
        }
        fn wait_for_work(&self, rounds: &Rounds) {
            self.rounds.set(self.rounds.get() - 1);
            if !rounds.more {
                self.now.set(self.now.get() + TICK);
            }
        }
        fn look_at_donors(&self, dead_round: bool) -> Vec<Option<Instant>> {
            if dead_round {
                self.dead_rounds.borrow_mut().push(self.now());
            }
            vec![self.death.filter(|at| *at <= self.now())]
        }
        fn reclaim_round(&self) {
            self.reclaims.borrow_mut().push(self.now());
        }
        fn heal_one(&self) -> Healed {
            self.heals.borrow_mut().push(self.now());
            self.script
                .borrow_mut()
                .pop_front()
                .unwrap_or(Healed::Nothing)
        }
        fn no_room(&self, _: &mut FailureLog, why: String) {
            self.no_room.borrow_mut().push(why);
        }
        fn healed_all(&self, took: Duration) {
            self.healed_all.borrow_mut().push(took);
        }
    }

    #[test]
    fn after_no_room_re_replication_retries_a_second_later() {
        let why = || Healed::NoRoom {
            why: Some("donors full".into()),
        };
        let w = Fake::new(50, vec![why(), why()], None);
        run(&w);
        let heals = w.since(&w.heals.borrow());
        // At 50 ms, then not before the retry delay, then every tick once nothing is left.
        assert_eq!(heals[0], TICK);
        assert_eq!(heals[1], TICK + NO_ROOM_RETRY);
        assert_eq!(heals[2], TICK + 2 * NO_ROOM_RETRY);
        assert_eq!(heals[3], TICK + 2 * NO_ROOM_RETRY + TICK);
        assert_eq!(w.no_room.borrow().len(), 2);
        assert!(
            w.healed_all.borrow().is_empty(),
            "no death, no copy: no episode"
        );
    }

    #[test]
    fn slabs_are_copied_back_to_back_and_healing_is_timed_from_the_death() {
        let w = Fake::new(
            10,
            vec![Healed::One, Healed::One, Healed::One],
            Some(Duration::ZERO),
        );
        run(&w);
        let heals = w.since(&w.heals.borrow());
        // Copies follow each other without a sleep; the fourth step finds nothing.
        assert_eq!(heals[..4], [TICK, TICK, TICK, TICK]);
        assert_eq!(heals[4], 2 * TICK);
        assert_eq!(
            *w.healed_all.borrow(),
            vec![TICK],
            "one episode, from the death"
        );
    }

    #[test]
    fn reclaim_polls_and_dead_probes_come_on_their_periods() {
        let w = Fake::new(50, vec![], None); // 2.5 s of 50 ms ticks
        run(&w);
        let reclaims = w.since(&w.reclaims.borrow());
        assert_eq!(reclaims[0], TICK);
        assert!(reclaims
            .windows(2)
            .all(|p| p[1] - p[0] >= RECLAIM_POLL_EVERY && p[1] - p[0] < RECLAIM_POLL_EVERY + TICK));
        assert_eq!(w.since(&w.dead_rounds.borrow()), vec![DEAD_PROBE_EVERY]);
    }

    #[test]
    fn the_loop_stops_when_asked_and_does_nothing_more() {
        let w = Fake::new(0, vec![Healed::One], None);
        run(&w);
        assert!(w.heals.borrow().is_empty());
        assert!(w.reclaims.borrow().is_empty());
        let w = Fake::new(3, vec![], None);
        run(&w);
        assert_eq!(w.heals.borrow().len(), 3, "one step a round until stopped");
    }
}
