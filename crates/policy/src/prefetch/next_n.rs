//! The `next-n` prefetcher (next-N-line): on every fault, the N pages that follow the faulting
//! page. Aggressive and blind; one of the rivals Leap's paper compares against.

use super::{Access, Prefetcher};
use crate::PolicyError;

/// Configuration of [`NextN`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NextNConfig {
    /// Pages brought after each fault. Default 8 (Leap's PW_max, for a fair comparison).
    pub pages: usize,
}

impl Default for NextNConfig {
    fn default() -> Self {
        Self { pages: 8 }
    }
}

/// Next-N-line prefetcher.
#[derive(Debug)]
pub struct NextN {
    cfg: NextNConfig,
}

impl NextN {
    /// A next-N prefetcher; fails if `pages` is not in 1..=256.
    pub fn new(cfg: NextNConfig) -> Result<Self, PolicyError> {
        if cfg.pages == 0 || cfg.pages > 256 {
            return Err(PolicyError::InvalidConfig {
                policy: "next-n",
                reason: format!("pages is {}; use 1..=256", cfg.pages),
            });
        }
        Ok(Self { cfg })
    }
}

impl Prefetcher for NextN {
    fn name(&self) -> &'static str {
        "next-n"
    }

    fn on_access(&mut self, access: &Access, out: &mut Vec<u64>) {
        if access.prefetch_hit {
            return; // only a miss triggers it
        }
        out.extend((1..=self.cfg.pages as u64).filter_map(|i| access.page.checked_add(i)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::prefetch::test_access;

    #[test]
    fn brings_the_n_pages_after_each_miss_and_nothing_on_hits() {
        let mut p = NextN::new(NextNConfig { pages: 3 }).unwrap();
        let mut out = Vec::new();
        p.on_access(&test_access(100, false), &mut out);
        assert_eq!(out, vec![101, 102, 103]);
        p.on_access(
            &Access {
                thread: 0,
                time_ns: 1,
                ..test_access(101, true)
            },
            &mut out,
        );
        assert_eq!(out, vec![101, 102, 103]);
        p.on_access(
            &Access {
                thread: 3,
                time_ns: 2,
                ..test_access(7, false)
            },
            &mut out,
        );
        assert_eq!(out, vec![101, 102, 103, 8, 9, 10]);
        p.on_access(
            &Access {
                thread: 0,
                time_ns: 3,
                ..test_access(u64::MAX - 1, false)
            },
            &mut out,
        );
        assert_eq!(
            out.last(),
            Some(&u64::MAX),
            "never wraps past the last page"
        );
    }

    #[test]
    fn rejects_zero_pages() {
        let e = NextN::new(NextNConfig { pages: 0 }).unwrap_err();
        assert_eq!(
            e.to_string(),
            "invalid next-n configuration: pages is 0; use 1..=256"
        );
    }
}
