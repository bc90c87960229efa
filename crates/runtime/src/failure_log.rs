//! Which repeats of a lasting failure are logged: the first at once, one with another cause at
//! once, the same one again every [`FAILURE_LOG_EVERY`] with how many times it happened
//! meanwhile. A condition is keyed by its cause, not by the page or slab it met: write-back
//! retried every second and re-replication tried for each slab printed one line per try
//! (145 a second for 75 s in a user's trial with full donors).

use std::time::{Duration, Instant};

/// How often a lasting failure with one cause is logged again.
pub(crate) const FAILURE_LOG_EVERY: Duration = Duration::from_secs(30);

/// The log state of one kind of failure.
#[derive(Default)]
pub(crate) struct FailureLog {
    last: Option<(Instant, String)>,
    /// Repeats since the cause was last logged.
    suppressed: u64,
}

impl FailureLog {
    /// Whether to log a failure with `cause` now: `Some(n)`, with `n` repeats not logged since
    /// it was last said (0 for a new cause), or `None` (count it, do not log it).
    pub(crate) fn should_log(&mut self, cause: &str) -> Option<u64> {
        let due = match &self.last {
            None => true,
            Some((t, c)) => c != cause || t.elapsed() >= FAILURE_LOG_EVERY,
        };
        let same = self.last.as_ref().is_some_and(|(_, c)| c == cause);
        if !due {
            self.suppressed += 1;
            return None;
        }
        let n = if same { self.suppressed } else { 0 };
        self.last = Some((Instant::now(), cause.to_string()));
        self.suppressed = 0;
        Some(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lasting_cause_is_said_once_then_counted() {
        let mut l = FailureLog::default();
        assert_eq!(l.should_log("donors full"), Some(0));
        for _ in 0..100 {
            assert_eq!(l.should_log("donors full"), None);
        }
        // Another cause is said at once, and starts its own count.
        assert_eq!(l.should_log("node gone"), Some(0));
        assert_eq!(l.should_log("node gone"), None);
        // Due again: said with the repeats since.
        l.last = Some((Instant::now() - FAILURE_LOG_EVERY, "node gone".into()));
        assert_eq!(l.should_log("node gone"), Some(1));
    }
}
