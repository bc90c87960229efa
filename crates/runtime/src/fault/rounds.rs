//! The fault loop ([`super::fault_loop`]) over the narrow interface it needs ([`FaultWorld`]:
//! stop, look for events while busy, sleep for them, read them, handle one, serve what waits,
//! say that all read are handled), so its order — spin only after a busy round, a short sleep
//! while faults wait to be served again, every event read handled before the round says so —
//! is unit-tested with a fake.

use std::time::Duration;

use farmem_uffd::{Event, UffdError};

use crate::doorbell::IDLE_WAIT;
use crate::failure::ThreadError;

/// What the fault loop needs from the runtime.
pub(super) trait FaultWorld {
    /// Shutdown was asked for.
    fn stopping(&self) -> bool;
    /// Reads events without sleeping for a short while ([`super::SPIN`]); true when some
    /// arrived. When none did, every event read so far counts as handled.
    fn spin(&mut self, events: &mut Vec<Event>) -> bool;
    /// Sleeps until the userfaultfd has events, shutdown rings the doorbell, or `timeout`.
    fn wait(&mut self, timeout: Duration) -> rustix::io::Result<()>;
    /// Reads the events queued now, without sleeping (counted before the read: a munmap
    /// whose event it dequeues returns only once the round says it is handled).
    fn read(&mut self, events: &mut Vec<Event>) -> Result<usize, UffdError>;
    /// Handles one event: a fault is served or its remote read started; a release updates
    /// the page table.
    fn handle(&mut self, ev: Event);
    /// The release events of the batch read are handled (its faults are not yet).
    fn releases_handled(&mut self);
    /// Serves what the events left: installs that met pending events, remote reads started,
    /// faults to serve again.
    fn serve_waiting(&mut self);
    /// Faults or installs wait to be served again.
    fn waiting(&self) -> bool;
    /// Every event read so far is handled.
    fn handled(&mut self);
    /// Says a failure of the loop.
    fn report(&self, err: ThreadError);
    /// Waits after a failed sleep, so a lasting error does not spin.
    fn pause(&self, wait: Duration);
}

/// How long to sleep for events while faults wait to be served again.
const WAITING_SLEEP: Duration = Duration::from_millis(1);
/// How long to pause after poll(2) failed.
const WAIT_FAILED_PAUSE: Duration = Duration::from_millis(10);

/// How long the next sleep for events may last.
pub(super) fn sleep_for(waiting: bool) -> Duration {
    if waiting {
        WAITING_SLEEP
    } else {
        IDLE_WAIT
    }
}

/// The fault loop: runs until `w` is stopping.
pub(super) fn run<W: FaultWorld>(w: &mut W) {
    let mut events: Vec<Event> = Vec::with_capacity(64);
    let mut faults: Vec<Event> = Vec::with_capacity(64);
    let mut busy = false;
    while !w.stopping() {
        events.clear();
        // Busy: look for the next events without sleeping first.
        if !(busy && w.spin(&mut events)) {
            if let Err(e) = w.wait(sleep_for(w.waiting())) {
                w.report(ThreadError::WaitEvents(e));
                w.pause(WAIT_FAILED_PAUSE);
            }
            if let Err(e) = w.read(&mut events) {
                w.report(ThreadError::ReadEvents(e));
                continue;
            }
        }
        busy = !events.is_empty();
        // Release events first, in order, then the faults, in order: the kernel zaps a
        // madvise's range once its REMOVE is read, so a page installed for a fault read before
        // it but served before its handling could keep its pre-release contents past the
        // madvise (decision 0069). A fault read with a release may get zeros, as a fault
        // racing the madvise may.
        for ev in events.drain(..) {
            if matches!(ev, Event::Pagefault { .. }) {
                faults.push(ev);
            } else {
                w.handle(ev);
            }
        }
        w.releases_handled();
        for ev in faults.drain(..) {
            w.handle(ev);
        }
        w.serve_waiting();
        w.handled();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::{Cell, RefCell};
    use std::collections::VecDeque;

    /// One step the fake saw, in order.
    #[derive(Debug, PartialEq)]
    enum Step {
        Spin,
        Wait(Duration),
        Read,
        Handle(usize),
        Release(usize),
        ReleasesHandled,
        Serve,
        Handled,
        Report(String),
        Pause(Duration),
    }

    /// A runtime whose reads come from a script (stopping when it runs out) and whose
    /// faults to retry are counted down by each serving round.
    #[derive(Default)]
    struct Fake {
        reads: VecDeque<Result<Vec<usize>, UffdError>>,
        spins: VecDeque<Vec<usize>>,
        wait_fails: usize,
        retries: usize,
        steps: RefCell<Vec<Step>>,
        stop: Cell<bool>,
    }

    /// A scripted event: a fault at `addr`, or at an odd `addr` the REMOVE of the page below.
    fn fault(addr: usize) -> Event {
        if addr % 2 == 1 {
            return Event::Remove {
                start: addr - 1,
                end: addr - 1 + 0x1000,
            };
        }
        Event::Pagefault {
            addr,
            write: false,
            wp: false,
            thread_id: 1,
        }
    }

    impl FaultWorld for Fake {
        fn stopping(&self) -> bool {
            self.stop.get()
        }
        fn spin(&mut self, events: &mut Vec<Event>) -> bool {
            self.steps.borrow_mut().push(Step::Spin);
            match self.spins.pop_front() {
                Some(addrs) if !addrs.is_empty() => {
                    events.extend(addrs.into_iter().map(fault));
                    true
                }
                _ => {
                    self.steps.borrow_mut().push(Step::Handled);
                    false
                }
            }
        }
        fn wait(&mut self, timeout: Duration) -> rustix::io::Result<()> {
            self.steps.borrow_mut().push(Step::Wait(timeout));
            if self.wait_fails > 0 {
                self.wait_fails -= 1;
                return Err(rustix::io::Errno::NOMEM);
            }
            Ok(())
        }
        fn read(&mut self, events: &mut Vec<Event>) -> Result<usize, UffdError> {
            self.steps.borrow_mut().push(Step::Read);
            let Some(next) = self.reads.pop_front() else {
                self.stop.set(true);
                return Ok(0);
            };
            let addrs = next?;
            events.extend(addrs.iter().map(|&a| fault(a)));
            Ok(addrs.len())
        }
        fn handle(&mut self, ev: Event) {
            let step = match ev {
                Event::Pagefault { addr, .. } => Step::Handle(addr),
                Event::Remove { start, .. } => Step::Release(start),
                _ => panic!("only faults and removes are scripted"),
            };
            self.steps.borrow_mut().push(step);
        }
        fn releases_handled(&mut self) {
            self.steps.borrow_mut().push(Step::ReleasesHandled);
        }
        fn serve_waiting(&mut self) {
            self.steps.borrow_mut().push(Step::Serve);
            self.retries = self.retries.saturating_sub(1);
        }
        fn waiting(&self) -> bool {
            self.retries > 0
        }
        fn handled(&mut self) {
            self.steps.borrow_mut().push(Step::Handled);
        }
        fn report(&self, err: ThreadError) {
            self.steps.borrow_mut().push(Step::Report(err.to_string()));
        }
        fn pause(&self, wait: Duration) {
            self.steps.borrow_mut().push(Step::Pause(wait));
        }
    }

    fn run_fake(mut f: Fake) -> Vec<Step> {
        run(&mut f);
        f.steps.into_inner()
    }

    #[test]
    fn every_event_read_is_handled_before_the_round_says_so() {
        let f = Fake {
            reads: VecDeque::from([Ok(vec![0x1000, 0x2000])]),
            ..Fake::default()
        };
        let steps = run_fake(f);
        assert_eq!(
            &steps[..7],
            &[
                Step::Wait(IDLE_WAIT),
                Step::Read,
                Step::ReleasesHandled,
                Step::Handle(0x1000),
                Step::Handle(0x2000),
                Step::Serve,
                Step::Handled,
            ]
        );
    }

    #[test]
    fn a_batch_s_releases_are_handled_before_its_faults() {
        // Fault 0x1000, REMOVE of 0x2000, fault 0x2000, REMOVE of 0x3000 in one read.
        let f = Fake {
            reads: VecDeque::from([Ok(vec![0x1000, 0x2001, 0x2000, 0x3001])]),
            ..Fake::default()
        };
        let steps = run_fake(f);
        assert_eq!(
            &steps[..9],
            &[
                Step::Wait(IDLE_WAIT),
                Step::Read,
                Step::Release(0x2000),
                Step::Release(0x3000),
                Step::ReleasesHandled,
                Step::Handle(0x1000),
                Step::Handle(0x2000),
                Step::Serve,
                Step::Handled,
            ]
        );
    }

    #[test]
    fn a_busy_round_looks_for_events_before_it_sleeps() {
        let f = Fake {
            reads: VecDeque::from([Ok(vec![0x1000])]),
            spins: VecDeque::from([vec![0x3000], vec![]]),
            ..Fake::default()
        };
        let steps = run_fake(f);
        // After the first round found a fault: spin finds the next one without sleeping,
        // then finds none, says so, and the loop sleeps again.
        assert_eq!(
            &steps[6..],
            &[
                Step::Spin,
                Step::ReleasesHandled,
                Step::Handle(0x3000),
                Step::Serve,
                Step::Handled,
                Step::Spin,
                Step::Handled,
                Step::Wait(IDLE_WAIT),
                Step::Read,
                Step::ReleasesHandled,
                Step::Serve,
                Step::Handled,
            ]
        );
    }

    #[test]
    fn an_idle_round_does_not_spin() {
        let f = Fake {
            reads: VecDeque::from([Ok(vec![]), Ok(vec![])]),
            ..Fake::default()
        };
        let steps = run_fake(f);
        assert!(!steps.contains(&Step::Spin), "{steps:?}");
    }

    #[test]
    fn faults_waiting_to_be_served_again_shorten_the_sleep() {
        let f = Fake {
            reads: VecDeque::from([Ok(vec![]), Ok(vec![]), Ok(vec![])]),
            retries: 2,
            ..Fake::default()
        };
        let waits: Vec<Duration> = run_fake(f)
            .into_iter()
            .filter_map(|s| match s {
                Step::Wait(d) => Some(d),
                _ => None,
            })
            .collect();
        assert_eq!(
            waits,
            [WAITING_SLEEP, WAITING_SLEEP, IDLE_WAIT, IDLE_WAIT],
            "two rounds serve the two retries, then the loop sleeps long"
        );
    }

    #[test]
    fn a_failed_read_neither_handles_nor_says_handled() {
        let f = Fake {
            reads: VecDeque::from([
                Err(UffdError::Again {
                    op: "read",
                    addr: 0,
                    done_bytes: 0,
                }),
                Ok(vec![0x1000]),
            ]),
            ..Fake::default()
        };
        let steps = run_fake(f);
        assert!(
            matches!(&steps[2], Step::Report(m) if m.contains("fault loop")),
            "{steps:?}"
        );
        assert_eq!(
            &steps[3..7],
            &[
                Step::Wait(IDLE_WAIT),
                Step::Read,
                Step::ReleasesHandled,
                Step::Handle(0x1000)
            ],
            "the failed read's round ends at once, unhandled: {steps:?}"
        );
    }

    #[test]
    fn a_failed_sleep_pauses_and_still_reads() {
        let f = Fake {
            reads: VecDeque::from([Ok(vec![0x1000])]),
            wait_fails: 1,
            ..Fake::default()
        };
        let steps = run_fake(f);
        assert!(matches!(&steps[1], Step::Report(_)), "{steps:?}");
        assert_eq!(
            &steps[2..6],
            &[
                Step::Pause(WAIT_FAILED_PAUSE),
                Step::Read,
                Step::ReleasesHandled,
                Step::Handle(0x1000)
            ],
            "{steps:?}"
        );
    }

    #[test]
    fn sleeps_are_short_only_while_something_waits() {
        assert_eq!(sleep_for(true), WAITING_SLEEP);
        assert_eq!(sleep_for(false), IDLE_WAIT);
        assert!(WAITING_SLEEP < IDLE_WAIT);
    }
}
