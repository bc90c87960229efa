//! Log rate limits keyed by who causes the lines: a peer address or a tenant, never a
//! connection (a token holder opening connection after connection would get a fresh allowance
//! with each).
//!
//! # Design
//! Each key ([`LogKey`]) gets [`LINES_PER_INTERVAL`] lines per [`LOG_INTERVAL`]; the lines
//! beyond are counted, and the key's first line of its next interval says how many were
//! suppressed. Memory is bounded: at most [`MAX_KEYS`] keys are tracked; when the table is full,
//! keys whose interval has ended are swept (at most once per interval, so a flood of new keys
//! cannot make every line pay for a sweep; a swept key's count of suppressed lines is lost
//! with it), and a key that still finds no room shares one
//! overflow allowance with every other such key. So however many sources a flood uses, it adds
//! at most [`LINES_PER_INTERVAL`] (+1 summary) lines per interval beyond the tracked keys'.
//!
//! The lines themselves are written by the caller with `tracing`; this module only says whether
//! to, and how many were suppressed before.
use std::collections::HashMap;
use std::net::IpAddr;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

/// Length of one rate-limit interval.
pub const LOG_INTERVAL: Duration = Duration::from_secs(10);
/// Lines logged per key per [`LOG_INTERVAL`] (the summary of suppressed lines not counted).
pub const LINES_PER_INTERVAL: u64 = 16;
/// Most keys tracked at once; beyond, new keys share one allowance.
pub const MAX_KEYS: usize = 4096;

/// Who a log line is charged to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum LogKey {
    /// A peer address (lines about connections that have not authenticated).
    Source(IpAddr),
    /// A tenant, by index (lines about its authenticated clients and connections).
    Tenant(usize),
    /// Every key the full table has no room for.
    Overflow,
}

/// What to do with one line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Log it; `suppressed` lines of this key were dropped in its previous interval (say so
    /// when non-zero).
    Log { suppressed: u64 },
    /// Drop it (counted).
    Drop,
}

#[derive(Debug, Clone, Copy)]
struct Bucket {
    since: Instant,
    logged: u64,
    suppressed: u64,
}

struct Table {
    buckets: HashMap<LogKey, Bucket>,
    last_sweep: Option<Instant>,
}

/// Rate limits for log lines, per [`LogKey`], in bounded memory.
pub(crate) struct LogLimiter {
    table: Mutex<Table>,
}

impl LogLimiter {
    pub(crate) fn new() -> LogLimiter {
        LogLimiter {
            table: Mutex::new(Table {
                buckets: HashMap::new(),
                last_sweep: None,
            }),
        }
    }

    /// Whether a line charged to `key` may be logged now.
    pub(crate) fn check(&self, key: LogKey) -> Verdict {
        self.check_at(key, Instant::now())
    }

    fn check_at(&self, key: LogKey, now: Instant) -> Verdict {
        let mut t = self.table.lock();
        let key = if t.buckets.contains_key(&key) || t.buckets.len() < MAX_KEYS {
            key
        } else {
            let sweep_due = t
                .last_sweep
                .is_none_or(|s| now.duration_since(s) >= LOG_INTERVAL);
            if sweep_due {
                t.last_sweep = Some(now);
                t.buckets.retain(|k, b| {
                    *k == LogKey::Overflow || now.duration_since(b.since) < LOG_INTERVAL
                });
            }
            if t.buckets.len() < MAX_KEYS {
                key
            } else {
                LogKey::Overflow
            }
        };
        let b = t.buckets.entry(key).or_insert(Bucket {
            since: now,
            logged: 0,
            suppressed: 0,
        });
        let mut carried = 0;
        if now.duration_since(b.since) >= LOG_INTERVAL {
            carried = b.suppressed;
            *b = Bucket {
                since: now,
                logged: 0,
                suppressed: 0,
            };
        }
        if b.logged < LINES_PER_INTERVAL {
            b.logged += 1;
            Verdict::Log {
                suppressed: carried,
            }
        } else {
            b.suppressed += 1;
            Verdict::Drop
        }
    }

    #[cfg(test)]
    fn keys(&self) -> usize {
        self.table.lock().buckets.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    fn ip(n: u32) -> LogKey {
        LogKey::Source(IpAddr::V4(Ipv4Addr::from(n)))
    }

    #[test]
    fn a_key_logs_its_allowance_then_reports_what_it_dropped() {
        let l = LogLimiter::new();
        let t0 = Instant::now();
        let k = LogKey::Tenant(0);
        for _ in 0..LINES_PER_INTERVAL {
            assert_eq!(l.check_at(k, t0), Verdict::Log { suppressed: 0 });
        }
        for _ in 0..5 {
            assert_eq!(l.check_at(k, t0), Verdict::Drop);
        }
        // Another key has its own allowance.
        assert_eq!(
            l.check_at(LogKey::Tenant(1), t0),
            Verdict::Log { suppressed: 0 }
        );
        let t1 = t0 + LOG_INTERVAL;
        assert_eq!(l.check_at(k, t1), Verdict::Log { suppressed: 5 });
        assert_eq!(l.check_at(k, t1), Verdict::Log { suppressed: 0 });
    }

    #[test]
    fn a_flood_of_keys_stays_bounded_and_shares_one_allowance() {
        let l = LogLimiter::new();
        let t0 = Instant::now();
        let mut logged = 0;
        for n in 0..(MAX_KEYS as u32 * 4) {
            if matches!(l.check_at(ip(n), t0), Verdict::Log { .. }) {
                logged += 1;
            }
        }
        assert!(l.keys() <= MAX_KEYS + 1, "{} keys", l.keys());
        assert_eq!(logged, MAX_KEYS as u64 + LINES_PER_INTERVAL);
        // Once their interval is over, the old keys are swept and new ones tracked again.
        let t1 = t0 + LOG_INTERVAL;
        assert_eq!(l.check_at(ip(u32::MAX), t1), Verdict::Log { suppressed: 0 });
        assert!(l.keys() <= 2, "{} keys after the sweep", l.keys());
    }
}
