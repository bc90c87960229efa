//! The sender's loop ([`crate::threads::send`]) over the narrow interface it needs
//! ([`SendWorld`]: stop, take a batch of wanted pages, write it, say it failed or succeeded,
//! pause), so how it retries — back-off doubling while write-back fails, a lasting failure said
//! once and then counted, both starting again after a success — is unit-tested with a fake.

use std::time::Duration;

use crate::error::RuntimeError;
use crate::failure::ThreadError;
use crate::failure_log::FailureLog;
use crate::threads::backoff::Backoff;

/// What the sender's loop needs from the runtime.
pub(crate) trait SendWorld {
    /// A staged page.
    type Page;
    /// Shutdown was asked for.
    fn stopping(&self) -> bool;
    /// The next batch of still-wanted staged pages, oldest first; `None` when none is staged
    /// (after waiting a while for some) or none of those taken was still wanted.
    fn next_batch(&self) -> Option<Vec<Self::Page>>;
    /// Writes the batch where its pages live; leaves in it the pages to acknowledge.
    fn write(&self, batch: &mut Vec<Self::Page>) -> Result<(), RuntimeError>;
    /// Writing `batch` failed with `err`: counts it (logs it too when `say`), marks
    /// write-back failing and stages the batch again, in its order, before newer pages.
    fn failed(&self, batch: Vec<Self::Page>, err: ThreadError, say: bool);
    /// Writing `batch` succeeded: marks its pages sent and write-back healthy.
    fn succeeded(&self, batch: &[Self::Page]);
    /// Waits `wait` before retrying.
    fn pause(&self, wait: Duration);
}

/// First and longest wait after a failed write-back.
const RETRY_FIRST: Duration = Duration::from_millis(10);
const RETRY_MAX: Duration = Duration::from_secs(1);

/// The sender's loop: runs until `w` is stopping.
pub(crate) fn run<W: SendWorld>(w: &W) {
    let mut backoff = Backoff::new(RETRY_FIRST, RETRY_MAX);
    // A failure that lasts (a node gone, donors full) is said again only every
    // FAILURE_LOG_EVERY: logging each retry filled the program's stderr.
    let mut failing = FailureLog::default();
    while !w.stopping() {
        let Some(mut batch) = w.next_batch() else {
            continue;
        };
        if let Err(source) = w.write(&mut batch) {
            let said = failing.should_log(&source.to_string());
            let err = ThreadError::WriteBack {
                pages: batch.len(),
                repeats: said.unwrap_or(0),
                source,
            };
            w.failed(batch, err, said.is_some());
            w.pause(backoff.next());
            continue;
        }
        backoff.reset();
        failing = FailureLog::default();
        w.succeeded(&batch);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::{Cell, RefCell};
    use std::collections::VecDeque;

    /// A runtime whose batches and write results come from scripts and which stops when its
    /// batches run out; it records what the loop told it.
    struct Fake {
        batches: RefCell<VecDeque<Option<Vec<u32>>>>,
        writes: RefCell<VecDeque<Result<(), RuntimeError>>>,
        written: RefCell<Vec<Vec<u32>>>,
        failed: RefCell<Vec<(Vec<u32>, String, bool)>>,
        succeeded: RefCell<Vec<Vec<u32>>>,
        pauses: RefCell<Vec<Duration>>,
        stop: Cell<bool>,
    }

    impl Fake {
        fn new(batches: Vec<Option<Vec<u32>>>, writes: Vec<Result<(), RuntimeError>>) -> Fake {
            Fake {
                batches: RefCell::new(batches.into()),
                writes: RefCell::new(writes.into()),
                written: RefCell::default(),
                failed: RefCell::default(),
                succeeded: RefCell::default(),
                pauses: RefCell::default(),
                stop: Cell::new(false),
            }
        }
    }

    impl SendWorld for Fake {
        type Page = u32;
        fn stopping(&self) -> bool {
            self.stop.get()
        }
        fn next_batch(&self) -> Option<Vec<u32>> {
            let next = self.batches.borrow_mut().pop_front();
            match next {
                Some(b) => b,
                None => {
                    self.stop.set(true);
                    None
                }
            }
        }
        fn write(&self, batch: &mut Vec<u32>) -> Result<(), RuntimeError> {
            self.written.borrow_mut().push(batch.clone());
            self.writes.borrow_mut().pop_front().unwrap_or(Ok(()))
        }
        fn failed(&self, batch: Vec<u32>, err: ThreadError, say: bool) {
            self.failed.borrow_mut().push((batch, err.to_string(), say));
        }
        fn succeeded(&self, batch: &[u32]) {
            self.succeeded.borrow_mut().push(batch.to_vec());
        }
        fn pause(&self, wait: Duration) {
            self.pauses.borrow_mut().push(wait);
        }
    }

    fn down() -> Result<(), RuntimeError> {
        Err(RuntimeError::Internal("the donor hung up"))
    }

    const MS: fn(u64) -> Duration = Duration::from_millis;

    #[test]
    fn a_lasting_failure_backs_off_doubling_is_said_once_and_the_batch_is_kept() {
        let f = Fake::new(
            vec![Some(vec![1, 2]); 4],
            vec![down(), down(), down(), Ok(())],
        );
        run(&f);
        assert_eq!(*f.pauses.borrow(), vec![MS(10), MS(20), MS(40)]);
        let failed = f.failed.borrow();
        let said: Vec<bool> = failed.iter().map(|f| f.2).collect();
        assert_eq!(said, vec![true, false, false], "said once, then counted");
        assert!(
            failed.iter().all(|f| f.0 == vec![1, 2]),
            "the batch goes back whole"
        );
        assert!(failed[0]
            .1
            .starts_with("write-back of 2 evicted pages failed"));
        assert_eq!(*f.succeeded.borrow(), vec![vec![1, 2]]);
    }

    #[test]
    fn after_a_success_a_new_failure_is_said_and_waits_the_first_wait_again() {
        let f = Fake::new(
            vec![Some(vec![1]), Some(vec![1]), Some(vec![2]), Some(vec![3])],
            vec![down(), Ok(()), down(), Ok(())],
        );
        run(&f);
        assert_eq!(*f.pauses.borrow(), vec![MS(10), MS(10)]);
        let said: Vec<bool> = f.failed.borrow().iter().map(|f| f.2).collect();
        assert_eq!(said, vec![true, true]);
        assert_eq!(*f.succeeded.borrow(), vec![vec![1], vec![3]]);
    }

    #[test]
    fn nothing_wanted_writes_nothing() {
        let f = Fake::new(vec![None, None, Some(vec![7])], vec![]);
        run(&f);
        assert_eq!(*f.written.borrow(), vec![vec![7]]);
        assert!(f.pauses.borrow().is_empty());
    }
}
