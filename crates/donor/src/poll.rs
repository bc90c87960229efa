//! Whether a connection polls for its client's next single-page read, decided by measuring
//! what the poll saves.
//!
//! # Design
//!
//! A client reading one page at a time is waiting on it (a demand fault), and asks again soon.
//! Polling for that next request spares the donor's thread a wake-up (on a VM, an IPI through
//! the hypervisor) on every request. But the poll holds a CPU, and when the client runs on the
//! same machine (a loopback donor, `farmem run --local-donor tcp`, the benchmarks) its threads
//! may need that CPU more: measured on a 2-vCPU VM, `farmem-bench fault`'s donor miss took
//! 48–71 µs with the poll and 33–36 µs without, while a random scan over the same loopback
//! took 38.8 µs an access with it and 58.7 µs without. Neither setting is right everywhere, and
//! the donor cannot see its client's CPUs; it can see the pace of its client's reads.
//!
//! So the connection measures the time between consecutive single-page reads (the client's
//! whole cycle: its wake-up, its fault, the round trip, our service) in epochs of
//! [`EPOCH_INTERVALS`], under one setting at a time. It starts by trying both (polling first),
//! keeps the one whose epoch was faster, and every [`PROBE_EVERY`] epochs spends one epoch on
//! the other setting, switching only when that epoch is faster by more than
//! [`SWITCH_MARGIN`]. A gap longer than [`MAX_GAP`] (the client was not faulting page after
//! page) or any other request between two reads is not counted: it is the same under both
//! settings and would only add noise.

use std::time::{Duration, Instant};

/// Intervals between single-page reads per epoch.
pub(crate) const EPOCH_INTERVALS: u32 = 64;
/// Every this many epochs, one epoch tries the setting not in use.
pub(crate) const PROBE_EVERY: u32 = 16;
/// The setting not in use is taken when its epoch's mean interval is below this share of the
/// last epoch's under the setting in use.
pub(crate) const SWITCH_MARGIN: f64 = 0.85;
/// Longer gaps between two reads are not a client waiting on faults back to back.
pub(crate) const MAX_GAP: Duration = Duration::from_millis(1);

/// The poll setting of one connection and its measurements.
#[derive(Debug)]
pub(crate) struct PollChoice {
    /// The setting in use between probes.
    chosen: bool,
    /// Epochs finished so far.
    epochs: u64,
    /// The current epoch: its setting, the intervals counted and their sum.
    polling: bool,
    counted: u32,
    sum: Duration,
    /// Mean interval of the last epoch under `chosen`.
    chosen_mean: Option<Duration>,
    /// When the previous single-page read arrived, if the last request was one.
    last_read: Option<Instant>,
}

impl Default for PollChoice {
    fn default() -> Self {
        Self {
            chosen: true,
            epochs: 0,
            polling: true,
            counted: 0,
            sum: Duration::ZERO,
            chosen_mean: None,
            last_read: None,
        }
    }
}

impl PollChoice {
    /// Whether to poll for the next request after a single-page read now.
    pub(crate) fn polling(&self) -> bool {
        self.polling
    }

    /// A request arrived at `now`; `single_read` says whether it reads exactly one page.
    pub(crate) fn on_request(&mut self, single_read: bool, now: Instant) {
        if !single_read {
            self.last_read = None;
            return;
        }
        if let Some(gap) = self.last_read.map(|t| now.saturating_duration_since(t)) {
            if gap <= MAX_GAP {
                self.counted += 1;
                self.sum += gap;
                if self.counted >= EPOCH_INTERVALS {
                    self.end_epoch();
                }
            }
        }
        self.last_read = Some(now);
    }

    fn end_epoch(&mut self) {
        let mean = self.sum / self.counted;
        (self.counted, self.sum) = (0, Duration::ZERO);
        // The previous request was read under the old setting: do not count across the change.
        self.last_read = None;
        if self.polling == self.chosen {
            self.chosen_mean = Some(mean);
        } else if self
            .chosen_mean
            .is_none_or(|c| mean.as_secs_f64() < c.as_secs_f64() * self.margin())
        {
            self.chosen = self.polling;
            self.chosen_mean = Some(mean);
        }
        self.epochs += 1;
        // Epoch 1 tries the other setting at once; then one epoch in PROBE_EVERY does.
        let probe = self.epochs == 1 || self.epochs.is_multiple_of(u64::from(PROBE_EVERY));
        self.polling = if probe { !self.chosen } else { self.chosen };
    }

    /// The first comparison (epoch 1) keeps the faster setting; later probes need a margin.
    fn margin(&self) -> f64 {
        if self.epochs == 1 {
            1.0
        } else {
            SWITCH_MARGIN
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds `epochs` epochs in which the client's cycle is `poll` while polling and `sleep`
    /// otherwise; returns the settings used, epoch by epoch.
    fn run(
        p: &mut PollChoice,
        now: &mut Instant,
        epochs: u32,
        poll: Duration,
        sleep: Duration,
    ) -> Vec<bool> {
        let mut used = Vec::new();
        for _ in 0..epochs {
            let setting = p.polling();
            used.push(setting);
            let start = p.epochs;
            while p.epochs == start {
                *now += if p.polling() { poll } else { sleep };
                p.on_request(true, *now);
            }
        }
        used
    }

    const US: Duration = Duration::from_micros(1);

    #[test]
    fn keeps_polling_where_the_poll_pays() {
        let (mut p, mut now) = (PollChoice::default(), Instant::now());
        let used = run(&mut p, &mut now, 48, 39 * US, 59 * US);
        // Tried both, then polls but for one probe epoch in PROBE_EVERY.
        assert_eq!(&used[..3], &[true, false, true]);
        assert_eq!(used.iter().filter(|&&u| !u).count(), 1 + 48 / 16 - 1);
        assert!(p.chosen);
    }

    #[test]
    fn stops_polling_where_the_poll_costs_the_client_its_cpu() {
        let (mut p, mut now) = (PollChoice::default(), Instant::now());
        let used = run(&mut p, &mut now, 48, 65 * US, 35 * US);
        assert_eq!(&used[..3], &[true, false, false]);
        assert_eq!(used.iter().filter(|&&u| u).count(), 1 + 48 / 16 - 1);
        assert!(!p.chosen);
    }

    #[test]
    fn a_probe_switches_only_for_a_clear_gain_and_follows_a_change() {
        let (mut p, mut now) = (PollChoice::default(), Instant::now());
        run(&mut p, &mut now, 20, 40 * US, 60 * US);
        assert!(p.polling());
        // Not polling becomes 10% faster: within the margin, the setting stays.
        run(&mut p, &mut now, 40, 40 * US, 36 * US);
        assert!(p.chosen);
        // Then twice as fast: the next probe switches.
        run(&mut p, &mut now, 20, 40 * US, 20 * US);
        assert!(!p.chosen);
    }

    #[test]
    fn idle_gaps_and_other_requests_are_not_counted() {
        let (mut p, mut now) = (PollChoice::default(), Instant::now());
        for _ in 0..500 {
            now += 2 * MAX_GAP;
            p.on_request(true, now);
        }
        for _ in 0..500 {
            now += 10 * US;
            p.on_request(false, now);
            now += 10 * US;
            p.on_request(true, now);
        }
        assert_eq!((p.epochs, p.counted), (0, 0));
        // Reads back to back are counted.
        now += 10 * US;
        p.on_request(true, now);
        assert_eq!(p.counted, 1);
    }
}
