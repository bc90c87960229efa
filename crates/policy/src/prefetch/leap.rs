//! Leap's majority-trend prefetcher (Leap, ATC'20, section 3), per thread or per process.
//!
//! # Design
//!
//! Each stream keeps an [`AccessHistory`]: a circular buffer of the last H_size deltas between
//! consecutive accesses (faults and prefetch hits; the first access records a delta of 0).
//! [`AccessHistory::find_trend`] is the paper's FINDTREND: a Boyer-Moore majority vote over the
//! newest `w = H_size / N_split` deltas, kept only if it occurs more than `w / 2` times, doubling
//! `w` up to H_size until a majority is found.
//!
//! The prefetch window (GETPREFETCHWINDOWSIZE) follows the prefetch hits `C` since the previous
//! prefetch: `C > 0` gives the next power of two ≥ `C + 1`, capped at PW_max; `C = 0` gives 1 if
//! a trend exists now and 0 otherwise; and the window never falls below half the previous one,
//! so it shrinks smoothly (8, 4, 2, 1, 0) and reaches 0, suspended, only when hits stay at zero.
//! **Departure (`max_stream_window_pages`, default 64): a pure stream's window grows past
//! PW_max.** When every one of the H_size newest deltas is one or more whole steps of the
//! trend, in its direction (a scan with nothing else in between; a step of two or more is a
//! page of it the caller did not see, one installed ahead and evicted before its use), the
//! cap is `max_stream_window_pages` instead: such a window cannot mispredict but past the
//! stream's end, and each window costs the stream one fault on its marker. A history with
//! any other delta in it keeps PW_max (a larger PW_max for every stream moved numpy's matmul
//! 1.6x the pages).
//! DOPREFETCH then brings `p + Δ, p + 2Δ, … p + PW·Δ` for the trend Δ, or, with no trend but a
//! non-zero window, follows the previous trend speculatively; while suspended, nothing.
//!
//! **Streams.** `leap` keeps one history per thread id (the runtime knows which thread
//! faulted), so interleaved strides from several threads are seen as the separate regular
//! streams they are; Leap's paper uses one history per process (`leap-process`) and names
//! thread-specific prefetching as future work. At most `max_streams` thread streams are kept;
//! the least recently active is forgotten first.
//!
//! **Pipelining (our extension, `pipelined`, default on).** Leap's kernel prefetches only on a
//! cache miss, so even a perfect sequential scan with PW_max = 8 faults once every 9 pages. Here
//! the first page of each prefetched window is its *marker*: when the program hits the marker,
//! the next window is computed at once (same window rule) and continues from the end of the
//! previous window when the trend is unchanged, so a stream that keeps its trend stops faulting.
//! This is the trigger Linux's file readahead uses (`PG_readahead`); the runtime can leave that
//! page uninstalled to see the hit. With `pipelined = false` the prefetcher is the paper's.
//!
//! **Late pages (ours, pipelined pure streams).** The caller may bring in only part of a
//! window (the runtime installs ahead only below its high watermark). A miss on a page of
//! the windows already issued (on the stream's path, behind the last window's end by at most
//! two windows) is then no change of trend: it stays out of the history (it would record a
//! step back and end the stream's purity), the window is not recomputed (no hits were seen
//! since, so it would halve), and `out` is that page followed by the rest of the issued pages
//! up to the pending marker, which still starts the next window. Without this, every window
//! cut short halved the next, and a strided scan at its memory budget ran on windows of 2–8.
//!
//! # Limitations
//!
//! The window grows from the prefetch hits the caller reports: a caller that sees only the
//! marker hit (one per window) keeps windows of 2 pages.

use std::collections::HashMap;

use super::{offset, Access, Prefetcher};
use crate::linked::LinkedSet;
use crate::PolicyError;

/// Configuration of [`Leap`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeapConfig {
    /// H_size: number of deltas kept per stream. Default 32 (the paper's).
    pub history_size: usize,
    /// N_split: the first trend window is `history_size / n_split`. Default 4.
    pub n_split: usize,
    /// PW_max: largest prefetch window, in pages. Default 8 (the paper's).
    pub max_window_pages: usize,
    /// Largest window of a pure stream, whose full history is the trend: at least PW_max.
    /// Default 64. Equal to `max_window_pages`, the paper's rule.
    pub max_stream_window_pages: usize,
    /// One history per thread id (true, `leap`) or one for the process (false, `leap-process`).
    pub per_thread: bool,
    /// Issue the next window when the marker page of the previous one is hit. Default true.
    pub pipelined: bool,
    /// Most thread streams kept at once (per-thread mode). Default 4096.
    pub max_streams: usize,
    /// Follow the rows of an interleaved strided walk ([`AccessHistory::find_rows`]) when the
    /// majority delta runs against it or there is none (`leap-rows`). Default false: it cut
    /// numpy's pages in by a fifth, but lowered the simulator's coverage of four threads'
    /// interleaved strides from above 0.9 to 0.65, not understood yet.
    pub follow_rows: bool,
}

impl Default for LeapConfig {
    fn default() -> Self {
        Self {
            history_size: 32,
            n_split: 4,
            max_window_pages: 8,
            max_stream_window_pages: 64,
            per_thread: true,
            pipelined: true,
            max_streams: 4096,
            follow_rows: false,
        }
    }
}

impl LeapConfig {
    fn validate(&self) -> Result<(), PolicyError> {
        let bad = |reason: String| {
            Err(PolicyError::InvalidConfig {
                policy: "leap",
                reason,
            })
        };
        if self.history_size < 2 || self.history_size > 4096 {
            return bad(format!(
                "history_size is {}; use 2..=4096 (the paper uses 32)",
                self.history_size
            ));
        }
        if self.n_split == 0 || self.n_split > self.history_size {
            return bad(format!(
                "n_split is {}; use 1..=history_size ({})",
                self.n_split, self.history_size
            ));
        }
        if self.max_window_pages == 0 || self.max_window_pages > 256 {
            return bad(format!(
                "max_window_pages is {}; use 1..=256 (the paper uses 8)",
                self.max_window_pages
            ));
        }
        if self.max_stream_window_pages < self.max_window_pages
            || self.max_stream_window_pages > super::MAX_LOOKAHEAD_PAGES
        {
            return bad(format!(
                "max_stream_window_pages is {}; use max_window_pages ({})..=256",
                self.max_stream_window_pages, self.max_window_pages
            ));
        }
        if self.max_streams == 0 {
            return bad("max_streams is 0; keep at least 1 stream".to_string());
        }
        Ok(())
    }
}

/// The fewest distinct pages [`AccessHistory::find_rows`] takes for rows.
const MIN_ROWS: usize = 8;

/// The widest gap within one band of rows, in pitches (rows still resident leave gaps).
const MAX_ROW_GAP: u64 = 4;

/// Leap's ACCESSHISTORY: the last H_size deltas between consecutive accesses of one stream.
#[derive(Debug, Clone)]
pub struct AccessHistory {
    deltas: Vec<i64>,
    /// Index of the newest delta.
    head: usize,
    len: usize,
    last_page: Option<u64>,
}

impl AccessHistory {
    /// An empty history of `size` deltas (`size` ≥ 1).
    pub fn new(size: usize) -> Self {
        let size = size.max(1);
        Self {
            deltas: vec![0; size],
            head: size - 1,
            len: 0,
            last_page: None,
        }
    }

    /// Records an access to `page`; returns the delta stored (0 for the first access).
    pub fn record(&mut self, page: u64) -> i64 {
        let delta = match self.last_page {
            Some(prev) => page.wrapping_sub(prev) as i64,
            None => 0,
        };
        self.last_page = Some(page);
        self.head = (self.head + 1) % self.deltas.len();
        self.deltas[self.head] = delta;
        self.len = (self.len + 1).min(self.deltas.len());
        delta
    }

    /// The newest `k` deltas (fewer if fewer were recorded), newest first.
    fn newest(&self, k: usize) -> impl Iterator<Item = i64> + '_ {
        let size = self.deltas.len();
        (0..k.min(self.len)).map(move |i| self.deltas[(self.head + size - i) % size])
    }

    /// Whether the history is full and every delta in it moves along `trend`: one or more
    /// whole steps of it, in its direction. A stream whose pages are sometimes not seen (a
    /// page installed ahead and evicted before its use, a step that skipped a resident
    /// page) is still the one stream.
    pub fn follows(&self, trend: i64) -> bool {
        trend != 0
            && self.len == self.deltas.len()
            && self
                .newest(self.len)
                .all(|d| d != 0 && d % trend == 0 && d / trend >= 1)
    }

    /// The last page and the `k` before it (by the newest `k` deltas), newest first.
    fn newest_pages(&self, k: usize) -> Vec<u64> {
        let Some(mut page) = self.last_page else {
            return Vec::new();
        };
        let mut pages = vec![page];
        for d in self.newest(k) {
            page = page.wrapping_sub(d as u64);
            pages.push(page);
        }
        pages
    }

    /// ROWS: the stream's recent pages in address order, for a walk that touches one page per
    /// row of a matrix but several rows at a time (numpy's matmul: OpenBLAS packs rows about
    /// ten pages apart, and one thread's faults go round cycles such as +88, −39, −39, whose
    /// majority delta points backwards). When most gaps between the recorded pages in address
    /// order are g or g + 1 pages (rows of a fractional pitch, g ≥ 2) and the stream moved one
    /// way overall, returns the farthest page that way and the mean of those gaps, signed.
    pub fn find_rows(&self) -> Option<(u64, f64)> {
        if self.len < MIN_ROWS {
            return None;
        }
        let pages = self.newest_pages(self.len);
        let moved = pages[0].wrapping_sub(*pages.last()?) as i64;
        let mut sorted = pages;
        sorted.sort_unstable();
        sorted.dedup();
        // Rows need a few of them: four processes' first pages are no matrix.
        if moved == 0 || sorted.len() < MIN_ROWS {
            return None;
        }
        // The rows' pitch: the gap g (or g + 1, a fractional pitch) that most gaps in address
        // order have, if that is more than half of them; a scan (gap 1) is Leap's own case.
        let gaps: Vec<u64> = sorted.windows(2).map(|w| w[1] - w[0]).collect();
        let near = |g: u64| gaps.iter().filter(move |&&x| x == g || x == g + 1);
        let g = gaps
            .iter()
            .copied()
            .filter(|&g| g >= 2)
            .max_by_key(|&g| (near(g).count(), std::cmp::Reverse(g)))?;
        // One band of rows: a gap of more than a few rows is another region, or a stride walk
        // wrapping around its region (whose pages, sorted, look like rows moving backwards).
        if near(g).count() * 2 <= gaps.len() || gaps.iter().any(|&x| x > MAX_ROW_GAP * (g + 1)) {
            return None;
        }
        let pitch = near(g).sum::<u64>() as f64 / near(g).count() as f64;
        let (first, last) = (sorted[0], *sorted.last()?);
        Some(if moved > 0 {
            (last, pitch)
        } else {
            (first, -pitch)
        })
    }

    /// FINDTREND: the majority delta of the newest `w` deltas, starting at
    /// `w = size / n_split` and doubling up to `size`; a delta is the majority of a window of
    /// `w` only if it occurs more than `w / 2` times in it (slots not yet filled vote for none).
    pub fn find_trend(&self, n_split: usize) -> Option<i64> {
        let size = self.deltas.len();
        let mut w = (size / n_split.max(1)).max(1);
        loop {
            // Boyer-Moore majority vote, then a counting pass to confirm.
            let mut candidate = 0i64;
            let mut votes = 0usize;
            for d in self.newest(w) {
                if votes == 0 {
                    candidate = d;
                    votes = 1;
                } else if d == candidate {
                    votes += 1;
                } else {
                    votes -= 1;
                }
            }
            if votes > 0 {
                let count = self.newest(w).filter(|&d| d == candidate).count();
                if count > w / 2 {
                    return Some(candidate);
                }
            }
            if w >= size {
                return None;
            }
            w = (w * 2).min(size);
        }
    }
}

/// Per-stream state: history, window and the pipelining marker.
#[derive(Debug, Clone)]
struct Stream {
    history: AccessHistory,
    prev_window: usize,
    hits_since_prefetch: usize,
    last_trend: Option<i64>,
    /// First page of the last window issued: its hit triggers the next window.
    marker: Option<u64>,
    /// Last page of the last window issued, and the delta it followed.
    frontier: Option<(u64, i64)>,
    /// Whether that window was a pure stream's (its history all along its delta).
    pure: bool,
}

impl Stream {
    fn new(cfg: &LeapConfig) -> Self {
        Self {
            history: AccessHistory::new(cfg.history_size),
            prev_window: 0,
            hits_since_prefetch: 0,
            last_trend: None,
            marker: None,
            frontier: None,
            pure: false,
        }
    }

    /// GETPREFETCHWINDOWSIZE, capped at PW_max, or at `max_stream_window_pages` for a pure
    /// stream (`pure`).
    fn window_size(&mut self, cfg: &LeapConfig, trend_now: bool, pure: bool) -> usize {
        let hits = self.hits_since_prefetch;
        let mut window = if hits == 0 {
            usize::from(trend_now)
        } else {
            (hits + 1).next_power_of_two()
        };
        let cap = if pure {
            cfg.max_stream_window_pages
        } else {
            cfg.max_window_pages
        };
        window = window.min(cap);
        if window < self.prev_window / 2 {
            window = (self.prev_window / 2).min(cap); // shrink smoothly
        }
        self.prev_window = window;
        window
    }

    /// Pipelined: whether a miss on `page` is a page of the issued windows that was not
    /// brought in (the caller had no room for it then): on the path of the last window's
    /// delta, behind its frontier by at most two windows (the one being consumed and the
    /// one issued after it). Returns the delta and the pages after `page` still to bring in,
    /// up to the next pending marker (excluded: its fault must still start the next window).
    fn late(&self, page: u64) -> Option<(i64, u64)> {
        if !self.pure {
            return None;
        }
        let (frontier, delta) = self.frontier?;
        let behind = steps_between(page, frontier, delta)?;
        if behind < 0 || behind > 2 * self.prev_window as i128 {
            return None;
        }
        let mut rest = behind as u64;
        if let Some(to_marker) = self
            .marker
            .and_then(|m| steps_between(page, m, delta))
            .filter(|&n| n > 0)
        {
            rest = rest.min(to_marker as u64 - 1);
        }
        Some((delta, rest))
    }

    fn on_access(&mut self, cfg: &LeapConfig, access: &Access, out: &mut Vec<u64>) {
        if cfg.pipelined && !access.prefetch_hit {
            if let Some((delta, rest)) = self.late(access.page) {
                // Not a change of trend: the stream is where its windows said. It stays out
                // of the history (it would record a step back), and the window is not
                // recomputed (no hits were seen since, it would halve). The page itself
                // comes first, so that none of `out` is taken for a marker.
                out.push(access.page);
                out.extend((1..=rest).filter_map(|i| offset(access.page, delta, i)));
                return;
            }
        }
        self.history.record(access.page);
        let from_marker = if access.prefetch_hit {
            self.hits_since_prefetch += 1;
            if !(cfg.pipelined && self.marker == Some(access.page)) {
                return; // Leap prefetches on faults (and, pipelined, on marker hits)
            }
            true
        } else {
            false
        };
        // DOPREFETCH
        let trend = self.history.find_trend(cfg.n_split);
        let rows = if cfg.follow_rows {
            self.history
                .find_rows()
                .filter(|(_, pitch)| trend.is_none_or(|d| (d > 0) != (*pitch > 0.0)))
        } else {
            None
        };
        let pure = rows.is_none() && trend.is_some_and(|t| self.history.follows(t));
        let window = self.window_size(cfg, trend.is_some() || rows.is_some(), pure);
        self.pure = pure;
        self.hits_since_prefetch = 0;
        self.marker = None;
        if window == 0 {
            return; // suspended until a new trend appears
        }
        if let Some((far, pitch)) = rows {
            // Rows ahead of the farthest one seen; the marker is the first of them.
            self.last_trend = None;
            self.frontier = None;
            let start = out.len();
            let sign = if pitch > 0.0 { 1 } else { -1 };
            for i in 1..=window {
                let step = (pitch.abs() * i as f64).round() as u64;
                if let Some(p) = offset(far, sign, step) {
                    out.push(p);
                }
            }
            self.marker = out.get(start).copied();
            return;
        }
        let delta = match trend {
            Some(d) => {
                self.last_trend = Some(d);
                d
            }
            None => match self.last_trend {
                Some(d) => d, // speculative: follow the previous trend
                None => return,
            },
        };
        if delta == 0 {
            return;
        }
        let base = match self.frontier {
            Some((page, d)) if from_marker && d == delta => page,
            _ => access.page,
        };
        let start = out.len();
        for i in 1..=window as u64 {
            if let Some(p) = offset(base, delta, i) {
                out.push(p);
            }
        }
        if out.len() > start {
            self.marker = Some(out[start]);
            self.frontier = out.last().map(|&p| (p, delta));
        }
    }
}

/// Leap's prefetcher; see the module docs.
#[derive(Debug)]
pub struct Leap {
    cfg: LeapConfig,
    /// The configured `max_stream_window_pages`: the lookahead never lowers the cap below it.
    stream_floor: usize,
    process: Stream,
    threads: HashMap<u32, Stream>,
    /// Thread ids, least recently active first.
    recency: LinkedSet,
}

impl Leap {
    /// A Leap prefetcher; fails if `cfg` is out of range.
    pub fn new(cfg: LeapConfig) -> Result<Self, PolicyError> {
        cfg.validate()?;
        Ok(Self {
            process: Stream::new(&cfg),
            threads: HashMap::new(),
            recency: LinkedSet::new(),
            stream_floor: cfg.max_stream_window_pages,
            cfg,
        })
    }

    /// The trend the stream of `thread` (ignored per process) would follow now, if any.
    pub fn current_trend(&self, thread: u32) -> Option<i64> {
        let stream = if self.cfg.per_thread {
            self.threads.get(&thread)?
        } else {
            &self.process
        };
        stream.history.find_trend(self.cfg.n_split)
    }

    /// The window size used by the last prefetch decision of `thread`'s stream.
    pub fn current_window(&self, thread: u32) -> usize {
        let stream = if self.cfg.per_thread {
            self.threads.get(&thread)
        } else {
            Some(&self.process)
        };
        stream.map_or(0, |s| s.prev_window)
    }
}

impl Prefetcher for Leap {
    fn name(&self) -> &'static str {
        match (self.cfg.per_thread, self.cfg.follow_rows) {
            (true, false) => "leap",
            (true, true) => "leap-rows",
            (false, _) => "leap-process",
        }
    }

    /// A pure stream's window may grow to the lookahead (rounded up to a power of two, as
    /// windows are), never below `max_stream_window_pages` nor past 256 pages. Other streams
    /// keep PW_max: their windows can mispredict.
    fn set_lookahead(&mut self, pages: usize) {
        self.cfg.max_stream_window_pages = pages
            .next_power_of_two()
            .clamp(self.stream_floor, super::MAX_LOOKAHEAD_PAGES);
    }

    fn on_access(&mut self, access: &Access, out: &mut Vec<u64>) {
        if !self.cfg.per_thread {
            self.process.on_access(&self.cfg, access, out);
            return;
        }
        let id = u64::from(access.thread);
        if !self.recency.remove(id) && self.threads.len() >= self.cfg.max_streams {
            if let Some(oldest) = self.recency.pop_front() {
                self.threads.remove(&(oldest as u32));
            }
        }
        self.recency.push_back(id);
        let cfg = &self.cfg;
        self.threads
            .entry(access.thread)
            .or_insert_with(|| Stream::new(cfg))
            .on_access(cfg, access, out);
    }
}

/// How many steps of `delta` lead from `from` to `to`, if `to` is on that path (negative when
/// it lies behind `from`).
fn steps_between(from: u64, to: u64, delta: i64) -> Option<i128> {
    let gap = i128::from(to) - i128::from(from);
    (gap % i128::from(delta) == 0).then(|| gap / i128::from(delta))
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::prefetch::{test_access, MAX_LOOKAHEAD_PAGES};

    fn miss(page: u64, thread: u32) -> Access {
        Access {
            thread,
            ..test_access(page, false)
        }
    }
    fn hit(page: u64, thread: u32) -> Access {
        Access {
            thread,
            ..test_access(page, true)
        }
    }

    /// Leap, section 3.2 and Figure 5: H_size 8, N_split 2.
    #[test]
    fn paper_worked_example_trends() {
        let pages = [
            0x48, 0x45, 0x42, 0x3F, 0x3C, 0x02, 0x04, 0x06, 0x08, 0x0A, 0x0C, 0x10, 0x39, 0x12,
            0x14, 0x16,
        ];
        let mut h = AccessHistory::new(8);
        let trends: Vec<Option<i64>> = pages
            .iter()
            .map(|&p| {
                h.record(p);
                h.find_trend(2)
            })
            .collect();
        // The paper's checkpoints.
        assert_eq!(trends[3], Some(-3), "t3: -3 within t0-t3");
        assert_eq!(
            trends[7], None,
            "t7: neither t4-t7 nor t0-t7 has a majority"
        );
        assert_eq!(trends[8], Some(2), "t8: +2 within t5-t8");
        assert_eq!(trends[15], Some(2), "t15: +2 within t8-t15 despite t11-t13");
        // Every step, worked out by hand with the same rule.
        let expected = [
            None,
            None,
            None,
            Some(-3),
            Some(-3),
            Some(-3),
            None,
            None,
            Some(2),
            Some(2),
            Some(2),
            Some(2),
            Some(2),
            Some(2),
            Some(2),
            Some(2),
        ];
        assert_eq!(trends, expected);
    }

    #[test]
    fn history_stores_deltas_like_the_paper() {
        // Section 4: faults 0x2, 0x5, 0x4, 0x6, 0x1, 0x9 store 0, +3, -1, +2, -5, +8.
        let mut h = AccessHistory::new(32);
        let d: Vec<i64> = [2u64, 5, 4, 6, 1, 9].iter().map(|&p| h.record(p)).collect();
        assert_eq!(d, vec![0, 3, -1, 2, -5, 8]);
    }

    fn paper_leap() -> Leap {
        Leap::new(LeapConfig {
            pipelined: false,
            ..LeapConfig::default()
        })
        .unwrap()
    }

    #[test]
    fn window_grows_with_hits_and_caps_at_pw_max() {
        let mut l = paper_leap();
        let mut out = Vec::new();
        for p in 0..3 {
            l.on_access(&miss(p, 0), &mut out);
        }
        assert!(out.is_empty(), "no trend yet in 3 deltas of a window of 8");
        // Deltas 0,1,1,1 then 0,1,1,1,1: a window of 8 needs five equal deltas.
        l.on_access(&miss(3, 0), &mut out);
        l.on_access(&miss(4, 0), &mut out);
        assert!(out.is_empty());
        l.on_access(&miss(5, 0), &mut out); // deltas 0,1,1,1,1,1: five 1s > 4
        assert_eq!(out, vec![6], "no hits yet: window 1 along the trend");
        out.clear();
        l.on_access(&hit(6, 0), &mut out);
        assert!(out.is_empty(), "the paper's Leap prefetches only on faults");
        l.on_access(&miss(7, 0), &mut out); // 1 hit since last prefetch -> 2
        assert_eq!(out, vec![8, 9]);
        out.clear();
        l.on_access(&hit(8, 0), &mut out);
        l.on_access(&hit(9, 0), &mut out);
        l.on_access(&miss(10, 0), &mut out); // 2 hits -> 4
        assert_eq!(out, vec![11, 12, 13, 14]);
        out.clear();
        for p in 11..=14 {
            l.on_access(&hit(p, 0), &mut out);
        }
        l.on_access(&miss(15, 0), &mut out); // 4 hits -> 8
        assert_eq!(out, (16..=23).collect::<Vec<_>>());
        out.clear();
        for p in 16..=23 {
            l.on_access(&hit(p, 0), &mut out);
        }
        l.on_access(&miss(24, 0), &mut out); // 8 hits -> 16, capped at 8
        assert_eq!(out, (25..=32).collect::<Vec<_>>());
        assert_eq!(l.current_window(0), 8);
    }

    /// Drives the paper's Leap along a +1 scan: a miss, then a hit on every page of the window
    /// it gave, `rounds` times, with an access to `stray` (once) after round `stray_after`.
    /// Returns the windows.
    fn scan_windows(rounds: usize, stray: Option<(usize, u64)>) -> Vec<usize> {
        scan_windows_with(paper_leap(), rounds, stray)
    }

    fn scan_windows_with(mut l: Leap, rounds: usize, stray: Option<(usize, u64)>) -> Vec<usize> {
        let mut out = Vec::new();
        let mut windows = Vec::new();
        let mut next = 0u64;
        for round in 0..rounds {
            l.on_access(&miss(next, 0), &mut out);
            next += 1;
            windows.push(out.len());
            for p in std::mem::take(&mut out) {
                assert_eq!(p, next, "the window follows the scan");
                l.on_access(&hit(p, 0), &mut out);
                next += 1;
            }
            if let Some((_, page)) = stray.filter(|(after, _)| *after == round) {
                l.on_access(&miss(page, 0), &mut out);
                out.clear();
            }
        }
        windows
    }

    #[test]
    fn a_pure_stream_s_window_grows_past_pw_max_and_any_other_delta_caps_it() {
        let w = scan_windows(14, None);
        // PW_max (8) until the history (32 deltas) holds nothing but the scan's +1.
        assert!(w.iter().take(5).all(|&x| x <= 8), "{w:?}");
        assert_eq!(w.iter().max(), Some(&64), "{w:?}");
        assert_eq!(*w.last().unwrap(), 64, "{w:?}");
        // One access elsewhere in the history: back to PW_max until it has left the history.
        let w = scan_windows(20, Some((7, 1_000_000)));
        assert!(w[8] <= 8, "{w:?}");
        assert_eq!(*w.last().unwrap(), 64, "{w:?}");
        let capped = LeapConfig {
            max_stream_window_pages: 8,
            ..LeapConfig::default()
        };
        assert!(
            Leap::new(capped).is_ok(),
            "equal to PW_max: the paper's rule"
        );
        let bad = LeapConfig {
            max_stream_window_pages: 4,
            ..LeapConfig::default()
        };
        assert!(Leap::new(bad).is_err(), "below PW_max");
    }

    #[test]
    fn a_lookahead_widens_a_pure_stream_s_window_within_bounds_only() {
        let leap = |lookahead: usize| {
            let mut l = paper_leap();
            l.set_lookahead(lookahead);
            l
        };
        // A long link: 150 pages consumed per round trip -> pure windows of 256 (the next
        // power of two); PW_max still binds until the history is pure.
        let w = scan_windows_with(leap(150), 16, None);
        assert!(w.iter().take(5).all(|&x| x <= 8), "{w:?}");
        assert_eq!(*w.last().unwrap(), 256, "{w:?}");
        // A short one never lowers the configured stream window, nor does a huge one pass 256.
        assert_eq!(*scan_windows_with(leap(3), 14, None).last().unwrap(), 64);
        let w = scan_windows_with(leap(100_000), 16, None);
        assert_eq!(w.iter().max(), Some(&MAX_LOOKAHEAD_PAGES), "{w:?}");
        // A stray access still caps the window at PW_max.
        let w = scan_windows_with(leap(150), 20, Some((7, 1_000_000)));
        assert!(w[8] <= 8, "{w:?}");
    }

    #[test]
    fn a_stream_with_pages_not_seen_is_still_pure() {
        // A +10 scan where every third window has a page the caller never reports (installed
        // ahead and evicted before its use): deltas of 10 and 20, all steps along the trend.
        let mut l = paper_leap();
        let mut out = Vec::new();
        let mut next = 0u64;
        let mut windows = Vec::new();
        for round in 0..40 {
            l.on_access(&miss(next, 0), &mut out);
            windows.push(out.len());
            let window = std::mem::take(&mut out);
            for (i, p) in window.iter().enumerate() {
                if i != 2 || round % 3 != 0 {
                    l.on_access(&hit(*p, 0), &mut out);
                }
            }
            next = window.last().map_or(next, |&p| p) + 10;
        }
        assert_eq!(*windows.last().unwrap(), 64, "{windows:?}");
        // A step back (or a delta off the trend's steps) is another stream: PW_max.
        let mut h = AccessHistory::new(4);
        for p in [0, 10, 30, 40, 50] {
            h.record(p);
        }
        assert!(h.follows(10));
        assert!(!h.follows(20), "10 is not a step of 20");
        assert!(!h.follows(-10), "the other direction");
        h.record(45);
        assert!(!h.follows(10), "a step back");
        assert!(!h.follows(0));
    }

    /// Drives a pipelined Leap along a +1 scan that hits every page it was given, up to
    /// `end`. Returns the pages issued and not reached yet, and the last window's marker.
    fn pipelined_scan(l: &mut Leap, end: u64) -> (Vec<u64>, u64) {
        let mut out = Vec::new();
        for p in 0..6 {
            l.on_access(&miss(p, 0), &mut out);
        }
        let mut marker = out[0];
        let mut issued: std::collections::VecDeque<u64> = out.drain(..).collect();
        for page in 6..end {
            let is_hit = issued.front() == Some(&page);
            assert!(is_hit, "page {page} was issued");
            issued.pop_front();
            let mut new = Vec::new();
            l.on_access(&test_access(page, true), &mut new);
            if let Some(&m) = new.first() {
                marker = m;
            }
            issued.extend(new);
        }
        (issued.into(), marker)
    }

    #[test]
    fn a_miss_on_a_page_of_an_issued_window_brings_the_rest_and_keeps_the_pipeline() {
        let mut l = Leap::new(LeapConfig::default()).unwrap();
        let (issued, marker) = pipelined_scan(&mut l, 300);
        assert_eq!(l.current_window(0), 64);
        // The caller had no room for the pages from 303 on: the program misses on 303.
        let late = 303;
        assert!(
            late < marker && issued.contains(&late),
            "{issued:?} {marker}"
        );
        let mut out = Vec::new();
        l.on_access(&miss(late, 0), &mut out);
        let expected: Vec<u64> = (late..marker).collect();
        assert_eq!(
            out, expected,
            "the page itself first, then up to the marker"
        );
        assert_eq!(l.current_window(0), 64, "the window is kept");
        // The marker still starts the next window, after the last one issued.
        out.clear();
        l.on_access(&hit(marker, 0), &mut out);
        assert_eq!(out.first(), Some(&(issued.last().unwrap() + 1)), "{out:?}");
        assert_eq!(out.len(), 64);
        // A miss off the stream's path is no late page: a new window from it.
        let mut l = Leap::new(LeapConfig::default()).unwrap();
        pipelined_scan(&mut l, 300);
        out.clear();
        l.on_access(&miss(100_000, 0), &mut out);
        assert_ne!(out.first(), Some(&100_000), "{out:?}");
    }

    #[test]
    fn window_shrinks_smoothly_and_suspends_when_the_trend_stays_away() {
        let mut l = paper_leap();
        let mut out = Vec::new();
        // A +1 trend with hits until the window is full (8).
        for p in 0..6 {
            l.on_access(&miss(p, 0), &mut out);
        }
        for _ in 0..4 {
            let window: Vec<u64> = std::mem::take(&mut out);
            for &p in &window {
                l.on_access(&hit(p, 0), &mut out);
            }
            let next = window.last().copied().unwrap() + 1;
            l.on_access(&miss(next, 0), &mut out);
        }
        assert_eq!(l.current_window(0), 8);
        // Now scattered faults and no hits. The +1 majority survives in the larger windows for a
        // while (window 1 along it, after halving from 8), then vanishes and the window reaches 0.
        let mut state = 12345u64;
        let mut steps = Vec::new();
        for _ in 0..40 {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let page = (state >> 20) % 1_000_000;
            out.clear();
            l.on_access(&miss(page, 0), &mut out);
            steps.push((l.current_window(0), out.len(), l.current_trend(0)));
        }
        let windows: Vec<usize> = steps.iter().map(|s| s.0).collect();
        assert_eq!(
            &windows[..3],
            &[4, 2, 1],
            "halves, never drops straight to the new size"
        );
        let zero_at = windows
            .iter()
            .position(|&w| w == 0)
            .expect("prefetching must stop");
        for (i, &(w, issued, trend)) in steps.iter().enumerate() {
            assert_eq!(issued, w, "step {i}: issues exactly the window");
            if (3..zero_at).contains(&i) {
                assert_eq!(
                    (w, trend),
                    (1, Some(1)),
                    "step {i}: the old trend still holds"
                );
            }
            if i >= zero_at {
                assert_eq!(w, 0, "step {i}: suspended");
            }
        }
    }

    #[test]
    fn speculative_prefetch_follows_the_previous_trend_while_the_window_lasts() {
        let cfg = LeapConfig {
            history_size: 4,
            n_split: 1,
            pipelined: false,
            ..LeapConfig::default()
        };
        let mut l = Leap::new(cfg).unwrap();
        let mut out = Vec::new();
        for p in [0u64, 3, 6, 9] {
            l.on_access(&miss(p, 0), &mut out);
        }
        assert_eq!(out, vec![12], "deltas 0,3,3,3: trend +3, window 1");
        out.clear();
        l.on_access(&hit(12, 0), &mut out);
        l.on_access(&miss(15, 0), &mut out);
        assert_eq!(out, vec![18, 21]);
        out.clear();
        l.on_access(&hit(18, 0), &mut out);
        l.on_access(&hit(21, 0), &mut out);
        l.on_access(&miss(24, 0), &mut out);
        assert_eq!(out, vec![27, 30, 33, 36]);
        out.clear();
        for p in [27, 30, 33, 36] {
            l.on_access(&hit(p, 0), &mut out);
        }
        l.on_access(&miss(100, 0), &mut out); // deltas 3,3,3,64: still +3; 4 hits -> 8
        assert_eq!(out, (1..=8).map(|i| 100 + 3 * i).collect::<Vec<_>>());
        let mut issued = Vec::new();
        for p in [500u64, 7, 2000, 40, 41] {
            out.clear();
            l.on_access(&miss(p, 0), &mut out);
            assert_eq!(l.current_trend(0), None, "no majority after {p}");
            issued.push(out.clone());
        }
        assert_eq!(
            issued,
            vec![
                vec![503, 506, 509, 512],
                vec![10, 13],
                vec![2003],
                vec![],
                vec![]
            ],
            "no trend: previous +3 followed speculatively while the window shrinks 4, 2, 1, 0"
        );
    }

    #[test]
    fn pipelined_marker_hit_extends_the_window_without_faults() {
        let mut l = Leap::new(LeapConfig::default()).unwrap();
        let mut out = Vec::new();
        for p in 0..6 {
            l.on_access(&miss(p, 0), &mut out);
        }
        assert_eq!(out, vec![6]);
        // Simulate a program that only hits prefetched pages from now on.
        let mut faults = 0;
        let mut issued: std::collections::VecDeque<u64> = out.drain(..).collect();
        let mut page = 6;
        while page < 200 {
            let is_hit = issued.front() == Some(&page);
            if is_hit {
                issued.pop_front();
            } else {
                faults += 1;
                issued.clear();
            }
            let mut new = Vec::new();
            l.on_access(&test_access(page, is_hit), &mut new);
            issued.extend(new.into_iter().filter(|&p| p > page));
            page += 1;
        }
        assert_eq!(
            faults, 0,
            "a sequential stream never faults once the trend is found"
        );
        // A pure stream: its window grew past PW_max.
        assert_eq!(l.current_window(0), 64);
    }

    #[test]
    fn per_thread_streams_separate_interleaved_strides() {
        let mut per_thread = Leap::new(LeapConfig::default()).unwrap();
        let mut per_process = Leap::new(LeapConfig {
            per_thread: false,
            ..LeapConfig::default()
        })
        .unwrap();
        let strides = [3u64, 5, 7, 11];
        let (mut a, mut b) = (Vec::new(), Vec::new());
        for i in 0..40u64 {
            for (t, s) in strides.iter().enumerate() {
                let page = (t as u64) * 1_000_000 + i * s;
                let acc = miss(page, t as u32);
                per_thread.on_access(&acc, &mut a);
                per_process.on_access(&acc, &mut b);
            }
        }
        for (t, s) in strides.iter().enumerate() {
            assert_eq!(per_thread.current_trend(t as u32), Some(*s as i64));
        }
        assert_eq!(
            per_process.current_trend(0),
            None,
            "interleaving hides every stride"
        );
        assert!(b.is_empty(), "per process: never a trend, never a prefetch");
        assert!(
            a.len() >= 4 * 30,
            "per thread: each stream prefetches: {}",
            a.len()
        );
    }

    #[test]
    fn stream_table_is_bounded() {
        let mut l = Leap::new(LeapConfig {
            max_streams: 2,
            ..LeapConfig::default()
        })
        .unwrap();
        let mut out = Vec::new();
        for t in 0..5 {
            l.on_access(&miss(7, t), &mut out);
        }
        assert_eq!(l.threads.len(), 2);
        assert!(l.threads.contains_key(&3) && l.threads.contains_key(&4));
    }

    #[test]
    fn invalid_configs_are_rejected_with_the_reason() {
        let e = Leap::new(LeapConfig {
            n_split: 0,
            ..LeapConfig::default()
        })
        .unwrap_err();
        assert_eq!(
            e.to_string(),
            "invalid leap configuration: n_split is 0; use 1..=history_size (32)"
        );
        assert!(Leap::new(LeapConfig {
            history_size: 1,
            ..LeapConfig::default()
        })
        .is_err());
        assert!(Leap::new(LeapConfig {
            max_window_pages: 0,
            ..LeapConfig::default()
        })
        .is_err());
        assert!(Leap::new(LeapConfig {
            max_streams: 0,
            ..LeapConfig::default()
        })
        .is_err());
    }

    /// Row `k` of a matrix whose rows are 9.77 pages apart (5000 doubles), from page 10 000.
    fn row(k: u64) -> u64 {
        10_000 + (k as f64 * 9.77).round() as u64
    }

    /// One thread's faults in numpy's matmul: rows visited three at a time, (t, t+9, t+5) for
    /// t = 0, 1, 2…, pages +88, −39, −39 apart. Returns the prediction made at the last fault.
    fn interleaved_rows(follow_rows: bool) -> (Vec<u64>, u64) {
        let mut l = Leap::new(LeapConfig {
            follow_rows,
            ..LeapConfig::default()
        })
        .unwrap();
        let mut out = Vec::new();
        let mut farthest = 0;
        for t in 0..20 {
            for k in [t, t + 9, t + 5] {
                out.clear();
                farthest = farthest.max(row(k));
                l.on_access(&miss(row(k), 0), &mut out);
            }
        }
        (out, farthest)
    }

    #[test]
    fn rows_of_an_interleaved_walk_are_followed_forward() {
        let (out, farthest) = interleaved_rows(true);
        assert!(!out.is_empty());
        let rows: Vec<u64> = (0..60).map(row).collect();
        for p in &out {
            assert!(
                *p > farthest,
                "{p} is behind the farthest row {farthest}: {out:?}"
            );
            assert!(
                rows.iter().any(|r| r.abs_diff(*p) <= 1),
                "{p} is not within a page of a row: {out:?}"
            );
        }
        // The majority delta alone points backwards, over rows already seen.
        let (out, farthest) = interleaved_rows(false);
        assert!(out.iter().all(|p| *p < farthest), "{out:?}");
    }

    #[test]
    fn a_scan_and_scattered_pages_are_no_rows() {
        let mut h = AccessHistory::new(32);
        for p in 100..140 {
            h.record(p);
        }
        assert_eq!(h.find_rows(), None, "a scan is Leap's own trend");
        let mut h = AccessHistory::new(32);
        let mut x = 12_345u64;
        for _ in 0..40 {
            x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1) % 1_000_003;
            h.record(x);
        }
        assert_eq!(h.find_rows(), None, "pages at random are no rows");
        let mut h = AccessHistory::new(32);
        // Stride 3 over a region of 4096 pages, the history straddling the wrap: its pages,
        // sorted, are gaps of 3 and one of a whole region, and the walk moved backwards.
        for i in 1350..1375u64 {
            h.record(1_000 + (i * 3) % 4096);
        }
        assert_eq!(
            h.find_rows(),
            None,
            "a stride walk wrapping around its region"
        );
        let mut h = AccessHistory::new(32);
        for k in (0..40).rev() {
            h.record(row(k));
        }
        let (far, pitch) = h.find_rows().expect("rows walked backwards");
        assert_eq!(far, row(0));
        assert!((-10.0..=-9.5).contains(&pitch), "{pitch}");
    }
}
