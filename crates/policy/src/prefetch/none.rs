//! The `none` prefetcher: brings nothing; the baseline every other prefetcher is compared to.

use super::{Access, Prefetcher};

/// Configuration of [`NoPrefetch`] (no knobs).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NoPrefetchConfig {}

/// Never prefetches.
#[derive(Debug, Default)]
pub struct NoPrefetch;

impl NoPrefetch {
    /// The no-op prefetcher.
    pub fn new(_cfg: NoPrefetchConfig) -> Self {
        Self
    }
}

impl Prefetcher for NoPrefetch {
    fn name(&self) -> &'static str {
        "none"
    }

    fn on_access(&mut self, _access: &Access, _out: &mut Vec<u64>) {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn brings_nothing_even_on_a_perfect_sequence() {
        let mut p = NoPrefetch::new(NoPrefetchConfig::default());
        let mut out = vec![99];
        for page in 0..100 {
            p.on_access(
                &Access {
                    page,
                    thread: 0,
                    time_ns: page,
                    prefetch_hit: false,
                },
                &mut out,
            );
        }
        assert_eq!(out, vec![99], "only appends, and appends nothing");
    }
}
