//! How far ahead prefetching must reach on this link: the pages the program consumes during
//! one prefetch batch's round trip (Little's law), from the measured batch times and the gaps
//! between prefetch hits. A window shorter than that makes a scan wait for every window on a
//! long link (Leap's windows were sized for RDMA); one longer only costs pages in flight.

use std::time::Duration;

use farmem_policy::prefetch::MAX_LOOKAHEAD_PAGES;

use super::MAX_IN_FLIGHT;

/// Weight of a new batch time in its moving average: 1/16, about the last few windows.
const WEIGHT: f64 = 1.0 / 16.0;
/// Hits per measured span of consumption: one gap is too noisy to size a window by.
const SPAN_HITS: u32 = 32;
/// Round trips of consumption the lookahead covers: a window is issued when its
/// predecessor's first page is touched, so it has about one window's consumption to arrive
/// in, and batch times swing with the load. With 1, a scan over a 2 ms link ran 26.1-26.9 µs
/// an access against 20.4-21.4 with 2 (interleaved pairs); a 0.5 ms link could not tell them
/// apart.
const LOOKAHEAD_FACTOR: f64 = 2.0;

/// The prefetch batch time (a moving average) and the gap between prefetch hits while the
/// program consumes them (the fastest recent span's, rising slowly).
#[derive(Default)]
pub(crate) struct Lookahead {
    batch_ns: Option<f64>,
    hit_gap_ns: Option<f64>,
    /// The span being measured: when it began, and hits since.
    span: Option<(u64, u32)>,
}

impl Lookahead {
    /// A prefetch batch was answered `took` after it was submitted.
    pub(crate) fn batch_done(&mut self, took: Duration) {
        let t = took.as_nanos() as f64;
        self.batch_ns = Some(match self.batch_ns {
            Some(a) => a + (t - a) * WEIGHT,
            None => t,
        });
    }

    /// A prefetch hit at `now_ns` (the prefetcher's clock). Every [`SPAN_HITS`] hits give a
    /// gap: taken at once when it is shorter than the one kept, else moved toward by 1/16.
    /// The window must keep up with the program's fastest consumption, and the mean gap swung
    /// with every stall (with it, Leap's cap crossed a power of two hundreds of times in one
    /// scan). A span whose mean gap is longer than a batch time is left out: the program
    /// paused or computed, the link kept up without lookahead, and a pause must not shrink
    /// the lookahead it needs when it scans again.
    pub(crate) fn hit(&mut self, now_ns: u64) {
        let Some((start, hits)) = self.span else {
            self.span = Some((now_ns, 0));
            return;
        };
        if hits + 1 < SPAN_HITS {
            self.span = Some((start, hits + 1));
            return;
        }
        self.span = Some((now_ns, 0));
        let gap = now_ns.saturating_sub(start) as f64 / f64::from(SPAN_HITS);
        if !self.batch_ns.is_some_and(|b| gap <= b) {
            return;
        }
        self.hit_gap_ns = Some(match self.hit_gap_ns {
            Some(g) if gap > g => g + (gap - g) * WEIGHT,
            _ => gap,
        });
    }

    /// A fault waited for its page's prefetch: the time up to it was the link's, not the
    /// program's; the span starts again. Counted in, it shrank the lookahead when the link
    /// was too slow for it, which made more faults wait.
    pub(crate) fn waited(&mut self) {
        self.span = None;
    }

    /// Pages consumed during [`LOOKAHEAD_FACTOR`] batch times (0 until both are measured),
    /// at most [`MAX_LOOKAHEAD_PAGES`].
    pub(crate) fn pages(&self) -> usize {
        match (self.batch_ns, self.hit_gap_ns) {
            (Some(batch), Some(gap)) => {
                let pages = (LOOKAHEAD_FACTOR * batch / gap.max(1.0)).ceil();
                (pages as usize).min(MAX_LOOKAHEAD_PAGES)
            }
            _ => 0,
        }
    }

    /// Most prefetched pages in flight that no fault has reached: two windows of the
    /// lookahead (the one being consumed and the next), at least [`MAX_IN_FLIGHT`].
    pub(crate) fn in_flight_cap(&self) -> usize {
        (2 * self.pages().next_power_of_two()).max(MAX_IN_FLIGHT)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const US: u64 = 1_000;

    /// `hits` hits `gap_us` apart from `from_us` on, a batch of `batch` answered with each.
    fn feed_from(l: &mut Lookahead, from_us: u64, batch: Duration, gap_us: u64, hits: u64) {
        for k in 0..hits {
            l.batch_done(batch);
            l.hit((from_us + k * gap_us) * US);
        }
    }

    fn feed(l: &mut Lookahead, batch: Duration, gap_us: u64, hits: u64) {
        feed_from(l, 0, batch, gap_us, hits);
    }

    /// A scan of 200 hits 10 us apart over 1 ms batches (it ends before 2 ms), and the
    /// lookahead it gives.
    fn scanning() -> (Lookahead, usize) {
        let mut l = Lookahead::default();
        feed(&mut l, Duration::from_millis(1), 10, 200);
        let pages = l.pages();
        (l, pages)
    }

    #[test]
    fn nothing_measured_asks_for_nothing_more() {
        let mut l = Lookahead::default();
        assert_eq!(l.pages(), 0);
        assert_eq!(l.in_flight_cap(), MAX_IN_FLIGHT);
        feed(&mut l, Duration::from_millis(1), 10, u64::from(SPAN_HITS));
        assert_eq!(l.pages(), 0, "fewer hits than a span give no gap");
    }

    #[test]
    fn the_lookahead_is_the_pages_consumed_in_two_batch_times() {
        // 1 ms batches, a hit every 10 us: 100 pages per round trip, 200 in two.
        let (l, pages) = scanning();
        assert_eq!(pages, 200);
        assert_eq!(l.in_flight_cap(), 512);
        // A fast link: 150 us batches -> 30 pages, and the floor for pages in flight.
        let mut l = Lookahead::default();
        feed(&mut l, Duration::from_micros(150), 10, 200);
        assert_eq!(l.pages(), 30);
        assert_eq!(l.in_flight_cap(), MAX_IN_FLIGHT);
        // Bounded however slow the link.
        let mut l = Lookahead::default();
        feed(&mut l, Duration::from_secs(1), 1, 200);
        assert_eq!(l.pages(), MAX_LOOKAHEAD_PAGES);
    }

    #[test]
    fn a_wait_for_the_link_is_not_a_gap_of_the_program() {
        let (mut l, before) = scanning();
        // A fault that waited 900 us for its prefetch in every span, then the scan goes on.
        for span in 0..10 {
            let t = 2_000 + span * 1_300;
            feed_from(&mut l, t, Duration::from_millis(1), 10, 20);
            l.waited();
            feed_from(&mut l, t + 1_100, Duration::from_millis(1), 10, 20);
        }
        assert_eq!(l.pages(), before);
    }

    #[test]
    fn a_stall_now_and_then_does_not_swing_the_lookahead() {
        let (mut l, before) = scanning();
        // One span in four slowed by a 300 us stall: the fastest spans still set the pace.
        let mut t = 2_000;
        for span in 0..8u64 {
            let gap = if span % 4 == 0 { 20 } else { 10 };
            feed_from(
                &mut l,
                t,
                Duration::from_millis(1),
                gap,
                u64::from(SPAN_HITS),
            );
            t += gap * u64::from(SPAN_HITS);
        }
        assert!(
            l.pages() * 10 >= before * 8,
            "{} against {before}",
            l.pages()
        );
    }

    #[test]
    fn a_pause_between_hits_does_not_shrink_the_lookahead() {
        let (mut l, before) = scanning();
        // Ten seconds without a hit, then the scan resumes.
        l.hit(10_000_000 * US);
        assert_eq!(l.pages(), before);
    }
}
