//! The tier thread's loop ([`crate::threads::tier`]) over the narrow interface it needs
//! ([`TierWorld`]: stop, wait for the node or a kick, give slabs back, thaw, write through,
//! report), so its rounds — how long it waits, when it writes through, how it backs off a
//! failing donor, what it does once the node is gone — are unit-tested with a fake.

use std::time::{Duration, Instant};

use crate::doorbell::IDLE_WAIT;
use crate::error::RuntimeError;
use crate::failure::ThreadError;
use crate::threads::backoff::Backoff;

/// What ended the tier thread's wait.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Woken {
    /// The node asks for this many slabs back.
    Reclaim(usize),
    /// The node's connection closed: it will ask for nothing more.
    NodeGone,
    /// A slab was written to the tier (write-through has work).
    Kicked,
    /// Shutdown rang the doorbell.
    Shutdown,
    /// The round's wait ran out.
    Timeout,
}

/// What the tier loop needs from the runtime.
pub(crate) trait TierWorld {
    /// Shutdown was asked for.
    fn stopping(&self) -> bool;
    /// The time now.
    fn now(&self) -> Instant;
    /// Donors are configured (something to write through to).
    fn has_donors(&self) -> bool;
    /// Far pages are frozen for a forked child (thawed when its hold is gone).
    fn any_frozen(&self) -> bool;
    /// Waits up to `wait` for the node's reclaims (not once `node_gone`), a kick or shutdown.
    fn wait(&self, wait: Duration, node_gone: bool) -> Woken;
    /// Gives `slabs` tier slabs back to the node.
    fn give_back(&self, slabs: usize);
    /// Reuses far pages frozen for forked children that are gone.
    fn thaw(&self);
    /// One round of write-through: the pages written.
    fn write_through(&self) -> Result<usize, RuntimeError>;
    /// Counts and logs a failure.
    fn report(&self, err: ThreadError);
}

/// First and longest wait after a failed write-through.
const RETRY_FIRST: Duration = Duration::from_millis(100);
const RETRY_MAX: Duration = Duration::from_secs(5);

/// The tier thread's loop: runs until `w` is stopping or shut down.
pub(crate) fn run(w: &impl TierWorld) {
    let mut next_round = w.now();
    let mut backoff = Backoff::new(RETRY_FIRST, RETRY_MAX);
    let mut busy = false;
    let mut node_gone = false;
    while !w.stopping() {
        let wait = round_wait(busy, w.has_donors(), || w.any_frozen());
        match w.wait(wait, node_gone) {
            Woken::Reclaim(slabs) => w.give_back(slabs),
            // Nothing more will be asked; the write-through goes on.
            Woken::NodeGone => node_gone = true,
            Woken::Shutdown => break,
            Woken::Kicked | Woken::Timeout => {}
        }
        w.thaw();
        if !w.has_donors() || w.now() < next_round {
            continue;
        }
        match w.write_through() {
            Ok(pages) => {
                busy = pages > 0;
                backoff.reset();
            }
            Err(e) => {
                busy = false;
                w.report(ThreadError::WriteThrough(e));
                next_round = w.now() + backoff.next();
            }
        }
    }
}

/// How long the tier thread waits for a reclaim or a kick before its next round. Busy writing
/// through: 10 ms rounds. Idle with donors to write through to, or with far pages frozen for a
/// forked child (thawed when its hold is gone; asked only without donors): 100 ms, so a page
/// reaches a donor, and frozen pages are reused, soon. Otherwise only the node's reclaims wake
/// it (or shutdown: crate::doorbell).
fn round_wait(busy: bool, donors: bool, frozen: impl FnOnce() -> bool) -> Duration {
    if busy {
        Duration::from_millis(10)
    } else if donors || frozen() {
        Duration::from_millis(100)
    } else {
        IDLE_WAIT
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::{Cell, RefCell};
    use std::collections::VecDeque;

    /// A runtime whose clock moves by each wait it is asked for (or by nothing when woken),
    /// whose wake-ups and write-through results come from scripts, and which shuts down when
    /// its wake-up script runs out.
    struct Fake {
        now: Cell<Instant>,
        donors: bool,
        frozen: bool,
        wakes: RefCell<VecDeque<Woken>>,
        writes: RefCell<VecDeque<Result<usize, RuntimeError>>>,
        waits: RefCell<Vec<(Duration, bool)>>,
        write_times: RefCell<Vec<Instant>>,
        given_back: RefCell<Vec<usize>>,
        thaws: Cell<usize>,
        reports: RefCell<Vec<String>>,
    }

    impl Fake {
        fn new(donors: bool, wakes: Vec<Woken>, writes: Vec<Result<usize, RuntimeError>>) -> Fake {
            Fake {
                now: Cell::new(Instant::now()),
                donors,
                frozen: false,
                wakes: RefCell::new(wakes.into()),
                writes: RefCell::new(writes.into()),
                waits: RefCell::default(),
                write_times: RefCell::default(),
                given_back: RefCell::default(),
                thaws: Cell::new(0),
                reports: RefCell::default(),
            }
        }

        fn waits(&self) -> Vec<Duration> {
            self.waits.borrow().iter().map(|w| w.0).collect()
        }
    }

    impl TierWorld for Fake {
        fn stopping(&self) -> bool {
            false
        }
        fn now(&self) -> Instant {
            self.now.get()
        }
        fn has_donors(&self) -> bool {
            self.donors
        }
        fn any_frozen(&self) -> bool {
            self.frozen
        }
        fn wait(&self, wait: Duration, node_gone: bool) -> Woken {
            self.waits.borrow_mut().push((wait, node_gone));
            let woken = self
                .wakes
                .borrow_mut()
                .pop_front()
                .unwrap_or(Woken::Shutdown);
            if woken == Woken::Timeout {
                self.now.set(self.now.get() + wait);
            }
            woken
        }
        fn give_back(&self, slabs: usize) {
            self.given_back.borrow_mut().push(slabs);
        }
        fn thaw(&self) {
            self.thaws.set(self.thaws.get() + 1);
        }
        fn write_through(&self) -> Result<usize, RuntimeError> {
            self.write_times.borrow_mut().push(self.now.get());
            self.writes.borrow_mut().pop_front().unwrap_or(Ok(0))
        }
        fn report(&self, err: ThreadError) {
            self.reports.borrow_mut().push(err.to_string());
        }
    }

    const MS: fn(u64) -> Duration = Duration::from_millis;

    #[test]
    fn rounds_are_short_while_busy_and_idle_waits_only_without_work_to_come() {
        assert_eq!(round_wait(true, false, || false), MS(10));
        assert_eq!(
            round_wait(false, true, || panic!(
                "frozen pages are asked only without donors"
            )),
            MS(100)
        );
        assert_eq!(round_wait(false, false, || true), MS(100));
        assert_eq!(round_wait(false, false, || false), IDLE_WAIT);
    }

    #[test]
    fn busy_write_through_keeps_rounds_short_until_nothing_is_left() {
        let f = Fake::new(
            true,
            vec![Woken::Timeout; 4],
            vec![Ok(2048), Ok(2048), Ok(0)],
        );
        run(&f);
        // The first round waits as idle; two busy rounds follow, then idle again.
        assert_eq!(f.waits(), vec![MS(100), MS(10), MS(10), MS(100), MS(100)]);
        assert_eq!(f.write_times.borrow().len(), 4);
        assert_eq!(f.thaws.get(), 4, "every round thaws, shutdown's does not");
        assert!(f.reports.borrow().is_empty());
    }

    #[test]
    fn a_failing_write_through_backs_off_doubling_and_is_reported_each_time() {
        let fail = || Err(RuntimeError::Internal("the donor hung up"));
        let f = Fake::new(
            true,
            vec![Woken::Timeout; 9],
            vec![fail(), fail(), fail(), Ok(0)],
        );
        let t0 = f.now();
        run(&f);
        let at: Vec<Duration> = f.write_times.borrow().iter().map(|t| *t - t0).collect();
        // Rounds come every 100 ms; after failures at 100 and 200 ms (waits 100, 200 ms),
        // the third failure is at 400 ms and the next try waits 400 ms more, to 800 ms.
        assert_eq!(at, vec![MS(100), MS(200), MS(400), MS(800), MS(900)]);
        let reports = f.reports.borrow();
        assert_eq!(reports.len(), 3);
        assert!(reports[0].starts_with("writing the host tier through to the donors failed"));
    }

    #[test]
    fn reclaims_are_given_back_and_a_gone_node_is_no_longer_waited_for() {
        let f = Fake::new(
            false,
            vec![Woken::Reclaim(3), Woken::NodeGone, Woken::Kicked],
            vec![],
        );
        run(&f);
        assert_eq!(*f.given_back.borrow(), vec![3]);
        let gone: Vec<bool> = f.waits.borrow().iter().map(|w| w.1).collect();
        assert_eq!(gone, vec![false, false, true, true]);
        assert!(
            f.write_times.borrow().is_empty(),
            "without donors nothing is written through"
        );
        assert_eq!(f.waits()[0], IDLE_WAIT, "no donors, nothing frozen: idle");
    }

    #[test]
    fn shutdown_ends_the_loop_at_once() {
        let f = Fake::new(true, vec![Woken::Shutdown], vec![Ok(5)]);
        run(&f);
        assert_eq!(f.waits.borrow().len(), 1);
        assert_eq!(f.thaws.get(), 0);
        assert!(f.write_times.borrow().is_empty());
    }
}
