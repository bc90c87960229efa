//! What the evictor decides, over plain numbers, apart from how it moves pages: when a round
//! runs and how many victims it wants ([`Drain`]: between the watermarks, with hysteresis),
//! how many hot dirty pages it may keep before evicting in plain FIFO order ([`Keeping`]), and
//! what it does when nothing can be moved ([`Stall`]: let faults go over the budget, back off,
//! say so now and then). Unit-tested here without userfaultfd.

use std::time::{Duration, Instant};

use crate::budget::EVICT_BATCH;

/// Rounds run from the high watermark down to the low one; then the evictor sleeps.
#[derive(Default)]
pub(super) struct Drain {
    draining: bool,
}

impl Drain {
    /// How many victims this round wants (at most [`EVICT_BATCH`]), or `None`: sleep until
    /// woken (below the watermarks, drained down to the low one, or paused for a fork).
    pub(super) fn want(
        &mut self,
        resident: u64,
        high: u64,
        low: u64,
        paused: bool,
    ) -> Option<usize> {
        if resident >= high {
            self.draining = true;
        }
        if paused || !self.draining || resident <= low {
            self.draining = false;
            return None;
        }
        Some(((resident - low) as usize).min(EVICT_BATCH))
    }
}

/// Bounds the pages the evictor keeps ([`super::pick_victims`]). When it has put back as many
/// pages in a row as are resident (every dirty page it reaches is hot: hot data larger than
/// the budget), it evicts the next `resident` pages in FIFO order before keeping any again, so
/// the work per page evicted stays bounded.
#[derive(Default)]
pub(super) struct Keeping {
    /// Pages put back since the last victim was taken.
    since_victim: u64,
    /// Victims still to take in plain FIFO order.
    plain_left: u64,
}

impl Keeping {
    /// Whether a dirty page reached now may be kept or sampled.
    pub(super) fn may_keep(&mut self, resident: u64) -> bool {
        if self.plain_left == 0 && self.since_victim >= resident {
            self.plain_left = resident;
            self.since_victim = 0;
        }
        self.plain_left == 0
    }

    /// A page was put back instead of evicted.
    pub(super) fn kept(&mut self) {
        self.since_victim += 1;
    }

    /// A victim was taken.
    pub(super) fn evicted(&mut self) {
        self.since_victim = 0;
        self.plain_left = self.plain_left.saturating_sub(1);
    }
}

/// Rounds in a row that moved and dropped nothing before the evictor counts as blocked (one
/// such round happens when the victims were released or faulted meanwhile).
const STALLED_ROUNDS: u32 = 3;
const STALL_FIRST: Duration = Duration::from_millis(10);
const STALL_MAX: Duration = Duration::from_secs(1);
/// How often a lasting stall is said again.
const STALL_LOG_EVERY: Duration = Duration::from_secs(30);

/// Whether the evictor is blocked (nothing could be moved or dropped several rounds in a row).
pub(super) struct Stall {
    rounds: u32,
    backoff: Duration,
    last_log: Option<Instant>,
}

/// What to do after a round.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum AfterRound {
    /// Progress: faults wait for the evictor as usual.
    Going,
    /// Blocked: faults may go over the budget; wait `wait` before the next round, and warn
    /// first if `say`.
    Blocked { wait: Duration, say: bool },
}

impl Default for Stall {
    fn default() -> Self {
        Stall {
            rounds: 0,
            backoff: STALL_FIRST,
            last_log: None,
        }
    }
}

impl Stall {
    /// A round ended at `now`; `stalled`: it neither moved nor dropped any victim.
    pub(super) fn after_round(&mut self, stalled: bool, now: Instant) -> AfterRound {
        self.rounds = if stalled { self.rounds + 1 } else { 0 };
        if self.rounds < STALLED_ROUNDS {
            self.backoff = STALL_FIRST;
            return AfterRound::Going;
        }
        let say = self
            .last_log
            .is_none_or(|t| now.saturating_duration_since(t) >= STALL_LOG_EVERY);
        if say {
            self.last_log = Some(now);
        }
        let wait = self.backoff;
        self.backoff = (self.backoff * 2).min(STALL_MAX);
        AfterRound::Blocked { wait, say }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounds_start_at_the_high_watermark_and_run_down_to_the_low_one() {
        let mut d = Drain::default();
        assert_eq!(d.want(90, 100, 80, false), None, "below high: not started");
        assert_eq!(d.want(100, 100, 80, false), Some(20));
        assert_eq!(d.want(95, 100, 80, false), Some(15), "goes on below high");
        assert_eq!(d.want(80, 100, 80, false), None, "down to low: stops");
        assert_eq!(d.want(95, 100, 80, false), None, "and waits for high again");
        let big = 80 + EVICT_BATCH as u64 * 3;
        assert_eq!(
            d.want(big, 100, 80, false),
            Some(EVICT_BATCH),
            "a round's batch at most"
        );
    }

    #[test]
    fn a_fork_pauses_draining() {
        let mut d = Drain::default();
        assert_eq!(d.want(120, 100, 80, true), None);
        assert_eq!(
            d.want(95, 100, 80, false),
            None,
            "the pause ended the drain"
        );
        assert_eq!(d.want(120, 100, 80, false), Some(40));
    }

    #[test]
    fn after_keeping_as_many_pages_as_are_resident_the_next_are_evicted_in_order() {
        let mut k = Keeping::default();
        for _ in 0..4 {
            assert!(k.may_keep(4));
            k.kept();
        }
        // Four kept with four resident: the next four are plain FIFO victims.
        for _ in 0..4 {
            assert!(!k.may_keep(4));
            k.evicted();
        }
        assert!(k.may_keep(4), "keeping again after them");
    }

    #[test]
    fn a_victim_taken_restarts_the_count_of_kept_pages() {
        let mut k = Keeping::default();
        for _ in 0..3 {
            assert!(k.may_keep(4));
            k.kept();
        }
        k.evicted();
        for _ in 0..3 {
            assert!(k.may_keep(4));
            k.kept();
        }
    }

    #[test]
    fn three_stalled_rounds_block_with_doubling_waits_said_once_in_a_while() {
        let mut s = Stall::default();
        let t0 = Instant::now();
        assert_eq!(s.after_round(true, t0), AfterRound::Going);
        assert_eq!(s.after_round(true, t0), AfterRound::Going);
        let ms = Duration::from_millis;
        let mut got = Vec::new();
        for i in 0..9 {
            got.push(s.after_round(true, t0 + ms(i)));
        }
        let waits: Vec<Duration> = got
            .iter()
            .map(|r| match r {
                AfterRound::Blocked { wait, .. } => *wait,
                AfterRound::Going => Duration::ZERO,
            })
            .collect();
        assert_eq!(
            waits,
            vec![
                ms(10),
                ms(20),
                ms(40),
                ms(80),
                ms(160),
                ms(320),
                ms(640),
                ms(1000),
                ms(1000)
            ]
        );
        let said = got
            .iter()
            .filter(|r| matches!(r, AfterRound::Blocked { say: true, .. }));
        assert_eq!(said.count(), 1, "said once within 30 s");
        assert!(matches!(
            s.after_round(true, t0 + STALL_LOG_EVERY),
            AfterRound::Blocked { say: true, .. }
        ));
    }

    #[test]
    fn progress_unblocks_and_restarts_the_back_off() {
        let mut s = Stall::default();
        let t0 = Instant::now();
        for _ in 0..4 {
            s.after_round(true, t0);
        }
        assert_eq!(s.after_round(false, t0), AfterRound::Going);
        for _ in 0..2 {
            assert_eq!(s.after_round(true, t0), AfterRound::Going);
        }
        assert_eq!(
            s.after_round(true, t0),
            AfterRound::Blocked {
                wait: Duration::from_millis(10),
                say: false
            }
        );
    }
}
