//! Which written pages the program keeps writing: sampled write-protection, per chunk of
//! neighbouring pages, so the evictor keeps a hot written array and lets a streamed one go.
//!
//! # Design
//!
//! A user-space pager sees no access to a resident page, so FIFO evicts a matrix the program
//! rewrites on every pass as readily as one it read once; the kernel's LRU keeps it, because
//! its accessed bits show it in use (numpy's matmul at 0.5 of its peak: the output matrix
//! faulted 2.7 times a page under farmem and was written back twice, and swap moved half the
//! pages). Write-protection is the one access signal userfaultfd gives for a resident page,
//! and a write-protect fault costs a whole round trip, so it is sampled: when the evictor
//! reaches a dirty page among the first `chunk_pages / sample_every` pages of its chunk, it
//! write-protects it ("armed") and puts it back at the queue's tail instead. The samples are
//! neighbours, so the evictor protects them with one ioctl (each one flushes the TLB of every
//! CPU the program runs on), and every chunk has as many. If the program writes it before the evictor reaches it again,
//! the fault says so ([`WriteHeat::sample_written`]) and the page's chunk (`chunk_pages`
//! neighbouring pages) warms; if not ([`WriteHeat::sample_unwritten`]), it cools and the page
//! is evicted. A dirty page in a warm chunk goes back to the tail too ([`Verdict::Keep`]).
//! Programs lay out an array in consecutive pages, so a chunk's samples speak for the pages
//! around them: with the defaults a chunk has 8 samples (pages 0 to 7 of each 128).
//!
//! Samples cost a write-protect ioctl (a TLB flush on every CPU) and a fault when written,
//! so only chunks whose dirty pages evicted lately had mostly changed are sampled
//! ([`WriteHeat::evicted`]): a page read from the host tier is installed writable and
//! compared with its slab copy when evicted, so a read-only scan stops sampling after one
//! pass over its chunks (a stride-10 scan ran 29% slower sampling every chunk).
//!
//! Pages are kept only while the warm chunks fit in `keep_within_pct` percent of the budget:
//! hot data larger than that cannot all stay, and the rest of the program needs room too.
//! The caller neither samples nor keeps the pages Leap's eager eviction takes first
//! (prefetched pages used once, or not yet): putting those back would leave the evictor
//! the pages prefetched for the program's next accesses.
//!
//! # Limitations
//!
//! - Only writes warm a chunk: data the program reads again and again (and never writes) is
//!   evicted in FIFO order as before.
//! - A warm chunk keeps all its dirty pages, also those written once long ago; its own samples
//!   coming back unwritten are what cool it.

use std::collections::HashMap;

use crate::PolicyError;

/// How many changed evictions a chunk's count of them holds: that many unchanged ones in a
/// row stop its sampling (a read-only pass after the fill stops within a few pages).
pub const WRITTEN_MAX: u8 = 3;

/// Configuration of [`WriteHeat`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WriteHeatConfig {
    /// Pages per chunk, a power of two. Default 128 (512 KiB).
    pub chunk_pages: u64,
    /// One page in this many is a sample: the first `chunk_pages / sample_every` of each
    /// chunk. Default 16.
    pub sample_every: u32,
    /// The most heat a chunk holds (a written sample adds 1, an unwritten one takes 2).
    /// Default 4: two unwritten samples in a row cool a chunk whose samples were all written.
    pub max_heat: u8,
    /// Pages of warm chunks are kept only while all warm chunks take at most this percentage
    /// of the budget. Default 75: the rest of the program keeps a quarter.
    pub keep_within_pct: u8,
}

impl Default for WriteHeatConfig {
    fn default() -> Self {
        Self {
            chunk_pages: 128,
            sample_every: 16,
            max_heat: 4,
            keep_within_pct: 75,
        }
    }
}

impl WriteHeatConfig {
    /// Checks the ranges: `chunk_pages` a power of two, `sample_every` from 1 to
    /// `chunk_pages` (a chunk has at least one sample), `max_heat` ≥ 1, `keep_within_pct` 1 to
    /// 100.
    pub fn validate(&self) -> Result<(), PolicyError> {
        let bad = |reason: String| {
            Err(PolicyError::InvalidConfig {
                policy: "write-heat",
                reason,
            })
        };
        if !self.chunk_pages.is_power_of_two() {
            return bad(format!(
                "chunk_pages is {}; use a power of two",
                self.chunk_pages
            ));
        }
        if self.sample_every == 0 || u64::from(self.sample_every) > self.chunk_pages {
            return bad(format!(
                "sample_every is {} with chunk_pages {}; use 1 to chunk_pages",
                self.sample_every, self.chunk_pages
            ));
        }
        if self.max_heat == 0 {
            return bad("max_heat is 0; use at least 1".into());
        }
        if !(1..=100).contains(&self.keep_within_pct) {
            return bad(format!(
                "keep_within_pct is {}; use 1 to 100",
                self.keep_within_pct
            ));
        }
        Ok(())
    }
}

/// What the evictor does with a dirty page it reached (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Evict it.
    Evict,
    /// Write-protect it and put it back at the tail: a sample.
    Sample,
    /// Put it back at the tail: its chunk is being written.
    Keep,
}

/// Per-chunk write heat from sampled write-protection; see the module docs.
#[derive(Debug, Clone)]
pub struct WriteHeat {
    cfg: WriteHeatConfig,
    /// Heat of the chunks that have any (absent: cold).
    heat: HashMap<u64, u8>,
    /// Chunks whose dirty pages evicted lately had changed: +1 a changed page (at most
    /// [`WRITTEN_MAX`]), −1 an unchanged one (absent: 0).
    written: HashMap<u64, u8>,
}

impl WriteHeat {
    /// A tracker with `cfg`, validated.
    pub fn new(cfg: WriteHeatConfig) -> Result<Self, PolicyError> {
        cfg.validate()?;
        Ok(Self {
            cfg,
            heat: HashMap::new(),
            written: HashMap::new(),
        })
    }

    fn chunk(&self, page: u64) -> u64 {
        page / self.cfg.chunk_pages
    }

    /// The evictor reached dirty page `page`, not armed, with a budget of `budget_pages`: what
    /// to do with it.
    pub fn on_dirty(&self, page: u64, budget_pages: u64) -> Verdict {
        let sample_slot =
            page % self.cfg.chunk_pages < self.cfg.chunk_pages / u64::from(self.cfg.sample_every);
        if sample_slot && self.written.contains_key(&self.chunk(page)) {
            Verdict::Sample
        } else if self.is_hot(page) && self.fits(budget_pages) {
            Verdict::Keep
        } else {
            Verdict::Evict
        }
    }

    /// Dirty page `page` was evicted, and had `changed` since it was installed (true when
    /// the caller cannot tell): a chunk is sampled while its changed evictions lately
    /// outnumber its unchanged ones (counted up to [`WRITTEN_MAX`]). Clean pages (installed
    /// write-protected and not written) are not reported: a page prefetched and evicted
    /// unused says nothing about the chunk's writes.
    pub fn evicted(&mut self, page: u64, changed: bool) {
        let c = self.chunk(page);
        if changed {
            let w = self.written.entry(c).or_insert(0);
            *w = (*w + 1).min(WRITTEN_MAX);
        } else if let Some(w) = self.written.get_mut(&c) {
            *w -= 1;
            if *w == 0 {
                self.written.remove(&c);
            }
        }
    }

    /// Sample `page` was written before the evictor reached it again.
    pub fn sample_written(&mut self, page: u64) {
        let max = self.cfg.max_heat;
        let h = self.heat.entry(self.chunk(page)).or_insert(0);
        *h = (*h + 1).min(max);
    }

    /// Sample `page` came back to the evictor unwritten. Cools twice as fast as a written
    /// sample warms: three written samples in four keep a chunk warm, two in three do not, so
    /// an array rewritten as a whole keeps its heat and memory written here and there does
    /// not.
    pub fn sample_unwritten(&mut self, page: u64) {
        let c = self.chunk(page);
        if let Some(h) = self.heat.get_mut(&c) {
            *h = h.saturating_sub(2);
            if *h == 0 {
                self.heat.remove(&c);
            }
        }
    }

    /// Whether `page`'s chunk is warm.
    pub fn is_hot(&self, page: u64) -> bool {
        self.heat.contains_key(&self.chunk(page))
    }

    /// Warm chunks now.
    pub fn hot_chunks(&self) -> usize {
        self.heat.len()
    }

    /// Whether the warm chunks fit in `keep_within_pct` of `budget_pages`.
    fn fits(&self, budget_pages: u64) -> bool {
        let hot = self.heat.len() as u64 * self.cfg.chunk_pages;
        hot * 100 <= budget_pages * u64::from(self.cfg.keep_within_pct)
    }
}

impl Default for WriteHeat {
    fn default() -> Self {
        Self::new(WriteHeatConfig::default()).expect("the default configuration is valid")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tracker() -> WriteHeat {
        WriteHeat::new(WriteHeatConfig {
            chunk_pages: 8,
            sample_every: 4,
            max_heat: 2,
            keep_within_pct: 50,
        })
        .unwrap()
    }

    const BUDGET: u64 = 128;

    /// Drives `t` as the evictor does over a FIFO of `pages` for `rounds` passes; the program
    /// writes every page `written` says between passes. Returns the pages evicted.
    fn passes(
        t: &mut WriteHeat,
        pages: std::ops::Range<u64>,
        rounds: usize,
        written: impl Fn(u64) -> bool,
    ) -> Vec<u64> {
        let mut armed = std::collections::HashSet::new();
        let mut evicted = Vec::new();
        // Every page was written (filled) and evicted once before.
        for p in pages.clone() {
            t.evicted(p, true);
        }
        for _ in 0..rounds {
            for p in pages.clone() {
                if armed.remove(&p) {
                    if written(p) {
                        t.sample_written(p);
                    } else {
                        t.sample_unwritten(p);
                        t.evicted(p, false);
                        evicted.push(p);
                        continue;
                    }
                }
                match t.on_dirty(p, BUDGET) {
                    Verdict::Sample => {
                        armed.insert(p);
                    }
                    Verdict::Keep => {}
                    Verdict::Evict => {
                        t.evicted(p, written(p));
                        evicted.push(p);
                    }
                }
            }
        }
        evicted
    }

    #[test]
    fn the_first_pages_of_chunks_last_evicted_changed_are_their_samples() {
        let mut t = tracker();
        // A chunk never evicted, or whose last eviction was unchanged, is not sampled.
        assert_eq!(t.on_dirty(0, BUDGET), Verdict::Evict);
        t.evicted(3, true);
        t.evicted(12, true);
        t.evicted(13, false);
        assert_eq!(t.on_dirty(8, BUDGET), Verdict::Evict);
        for _ in 0..10 {
            t.evicted(13, true);
        }
        // Counted up to WRITTEN_MAX: that many unchanged evictions stop its sampling.
        for _ in 0..WRITTEN_MAX {
            assert_eq!(t.on_dirty(8, BUDGET), Verdict::Sample);
            t.evicted(13, false);
        }
        assert_eq!(t.on_dirty(8, BUDGET), Verdict::Evict);
        t.evicted(13, true);
        let v: Vec<Verdict> = (0..16).map(|p| t.on_dirty(p, BUDGET)).collect();
        let samples: Vec<usize> = (0..16).filter(|p| v[*p] == Verdict::Sample).collect();
        assert_eq!(samples, [0, 1, 8, 9], "{v:?}");
        assert!(!v.contains(&Verdict::Keep), "nothing is warm yet: {v:?}");
    }

    #[test]
    fn a_chunk_whose_samples_are_written_is_kept_and_an_unwritten_one_is_not() {
        let mut t = tracker();
        // Pages 0..32 rewritten every pass, 32..64 never.
        let evicted = passes(&mut t, 0..64, 6, |p| p < 32);
        let late: Vec<u64> = evicted.iter().copied().skip(64).collect();
        assert!(
            late.iter().all(|p| *p >= 32),
            "rewritten chunks kept after the first pass: {late:?}"
        );
        assert!(
            late.len() > 100,
            "the cold half keeps leaving: {}",
            late.len()
        );
        assert_eq!(t.hot_chunks(), 4);
        assert!(t.is_hot(0) && !t.is_hot(40));
    }

    #[test]
    fn a_chunk_cools_when_its_samples_stop_being_written() {
        let mut t = tracker();
        passes(&mut t, 0..32, 4, |_| true);
        assert_eq!(t.hot_chunks(), 4);
        passes(&mut t, 0..32, 8, |_| false);
        assert_eq!(t.hot_chunks(), 0);
        assert!(!t.is_hot(0));
    }

    #[test]
    fn warm_chunks_larger_than_their_share_of_the_budget_are_not_kept() {
        let mut t = tracker();
        // 4 warm chunks of 8 pages: 32 pages, half of a 64-page budget.
        for c in 0..4 {
            t.sample_written(c * 8);
        }
        assert_eq!(t.on_dirty(5, 64), Verdict::Keep);
        assert_eq!(t.on_dirty(5, 63), Verdict::Evict);
        // Samples are still taken, so the heat stays measured.
        t.evicted(8, true);
        assert_eq!(t.on_dirty(8, 16), Verdict::Sample);
    }

    #[test]
    fn heat_is_capped_at_max_heat() {
        let mut t = WriteHeat::default();
        for _ in 0..100 {
            t.sample_written(3);
        }
        t.sample_unwritten(3);
        assert!(t.is_hot(3));
        t.sample_unwritten(3);
        assert!(!t.is_hot(3));
        // A cold chunk's unwritten sample changes nothing.
        t.sample_unwritten(3);
        assert!(!t.is_hot(3));
    }

    #[test]
    fn three_written_samples_in_four_keep_a_chunk_warm_and_two_in_three_do_not() {
        // (written samples, unwritten samples) per cycle, and whether the chunk ends warm.
        for (written, unwritten, warm) in [(3, 1, true), (2, 1, false), (1, 1, false)] {
            let mut t = WriteHeat::default();
            for _ in 0..50 {
                for _ in 0..written {
                    t.sample_written(0);
                }
                for _ in 0..unwritten {
                    t.sample_unwritten(0);
                }
            }
            assert_eq!(t.is_hot(0), warm, "{written} written, {unwritten} not");
        }
    }

    #[test]
    fn bad_configurations_are_refused_with_the_reason() {
        for cfg in [
            WriteHeatConfig {
                chunk_pages: 100,
                ..WriteHeatConfig::default()
            },
            WriteHeatConfig {
                sample_every: 0,
                ..WriteHeatConfig::default()
            },
            WriteHeatConfig {
                sample_every: 256,
                ..WriteHeatConfig::default()
            },
            WriteHeatConfig {
                max_heat: 0,
                ..WriteHeatConfig::default()
            },
            WriteHeatConfig {
                keep_within_pct: 0,
                ..WriteHeatConfig::default()
            },
            WriteHeatConfig {
                keep_within_pct: 101,
                ..WriteHeatConfig::default()
            },
        ] {
            let e = WriteHeat::new(cfg).unwrap_err();
            assert!(e.to_string().contains("write-heat"), "{e}");
        }
        assert!(WriteHeatConfig::default().validate().is_ok());
    }
}
