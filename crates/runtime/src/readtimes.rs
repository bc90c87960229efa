//! The slowest recent demand read, and the failover delay derived from it
//! ([`crate::copies::failover`]): four times the slowest recent read (a maximum that decays by 1/64 a
//! read), at least 20 ms (a scheduling hiccup on a loaded 2-core machine is not a failure) and
//! at most half the request timeout. Also how long a demand read polls for its answer
//! ([`FAULT_PATH_SPIN`]).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// How long a demand read polls for its answer before sleeping (`ClientConfig::spin`): on
/// a one-pass random scan (256 MiB at 128 MiB local) the average access fell from 80-90 µs to
/// 52-56 µs (with the donor polling too).
pub(crate) const FAULT_PATH_SPIN: Duration = Duration::from_micros(50);

/// The failover delay's floor.
const MIN_DELAY: Duration = Duration::from_millis(20);
/// The failover delay in multiples of the slowest recent read.
const SLOW_FACTOR: u64 = 4;

/// The slowest recent demand read, µs (decaying maximum).
#[derive(Default)]
pub(crate) struct ReadTimes {
    slowest_us: AtomicU64,
}

impl ReadTimes {
    pub(crate) fn record(&self, took: Duration) {
        let us = took.as_micros() as u64;
        let old = self.slowest_us.load(Ordering::Relaxed);
        let new = us.max(old - old / 64);
        self.slowest_us.store(new, Ordering::Relaxed);
    }

    /// How long to wait for one replica before asking the next.
    pub(crate) fn failover_delay(&self, request_timeout: Duration) -> Duration {
        let slow = Duration::from_micros(self.slowest_us.load(Ordering::Relaxed) * SLOW_FACTOR);
        slow.max(MIN_DELAY)
            .min(request_timeout / 2)
            .max(Duration::from_millis(1))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_failover_delay_follows_the_slowest_recent_read_within_bounds() {
        let t = ReadTimes::default();
        let timeout = Duration::from_secs(5);
        assert_eq!(t.failover_delay(timeout), MIN_DELAY);
        t.record(Duration::from_millis(30));
        assert_eq!(t.failover_delay(timeout), Duration::from_millis(120));
        // Fast reads let it decay back to the floor.
        for _ in 0..2000 {
            t.record(Duration::from_micros(50));
        }
        assert_eq!(t.failover_delay(timeout), MIN_DELAY);
        t.record(Duration::from_secs(10));
        assert_eq!(t.failover_delay(timeout), timeout / 2);
    }
}
