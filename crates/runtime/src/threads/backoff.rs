//! Exponential back-off between retries of a failing step, shared by the sender (write-back)
//! and the tier thread (write-through): each wait doubles up to a cap, and a success starts
//! again from the first.

use std::time::Duration;

/// How long to wait before the next retry.
pub(crate) struct Backoff {
    first: Duration,
    max: Duration,
    next: Duration,
}

impl Backoff {
    /// Waits starting at `first`, doubling up to `max`.
    pub(crate) fn new(first: Duration, max: Duration) -> Backoff {
        Backoff {
            first,
            max,
            next: first,
        }
    }

    /// The wait before this retry; the next one is twice as long (at most the cap).
    pub(crate) fn next(&mut self) -> Duration {
        let wait = self.next;
        self.next = (self.next * 2).min(self.max);
        wait
    }

    /// The step succeeded: the next failure waits the first wait again.
    pub(crate) fn reset(&mut self) {
        self.next = self.first;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_double_up_to_the_cap_and_start_again_after_a_success() {
        let ms = Duration::from_millis;
        let mut b = Backoff::new(ms(10), ms(50));
        let waits: Vec<Duration> = (0..5).map(|_| b.next()).collect();
        assert_eq!(waits, vec![ms(10), ms(20), ms(40), ms(50), ms(50)]);
        b.reset();
        assert_eq!(b.next(), ms(10));
    }
}
