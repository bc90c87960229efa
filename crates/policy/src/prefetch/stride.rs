//! The `stride` prefetcher: on a fault, follows the stride between the last two accesses it was
//! told about (faults and prefetch hits; in the runtime both are faults), bringing `degree` pages
//! along it. The degree comes from past accuracy: after each fault it looks at the pages issued
//! and the prefetch hits seen since the previous adjustment, doubles the degree (up to
//! `max_degree`) when at least `raise_accuracy` of them were used and halves it (down to 1) when
//! fewer than `lower_accuracy` were. One of the rivals in Leap's paper (after Chen and Baer).

use super::{offset, Access, Prefetcher};
use crate::PolicyError;

/// Configuration of [`Stride`].
#[derive(Debug, Clone, PartialEq)]
pub struct StrideConfig {
    /// Largest number of pages per prefetch. Default 8.
    pub max_degree: usize,
    /// Accuracy at or above which the degree doubles. Default 0.75.
    pub raise_accuracy: f64,
    /// Accuracy below which the degree halves. Default 0.25.
    pub lower_accuracy: f64,
}

impl Default for StrideConfig {
    fn default() -> Self {
        Self {
            max_degree: 8,
            raise_accuracy: 0.75,
            lower_accuracy: 0.25,
        }
    }
}

/// Stride prefetcher with accuracy-driven degree.
#[derive(Debug)]
pub struct Stride {
    cfg: StrideConfig,
    last_page: Option<u64>,
    stride: i64,
    degree: usize,
    issued: u64,
    hits: u64,
}

impl Stride {
    /// A stride prefetcher; fails if the degree or the accuracy thresholds are out of range.
    pub fn new(cfg: StrideConfig) -> Result<Self, PolicyError> {
        let bad = |reason: String| {
            Err(PolicyError::InvalidConfig {
                policy: "stride",
                reason,
            })
        };
        if cfg.max_degree == 0 || cfg.max_degree > 256 {
            return bad(format!("max_degree is {}; use 1..=256", cfg.max_degree));
        }
        if !(0.0..=1.0).contains(&cfg.lower_accuracy)
            || !(0.0..=1.0).contains(&cfg.raise_accuracy)
            || cfg.lower_accuracy > cfg.raise_accuracy
        {
            return bad(format!(
                "accuracy thresholds are {} (lower) and {} (raise); use 0 <= lower <= raise <= 1",
                cfg.lower_accuracy, cfg.raise_accuracy
            ));
        }
        Ok(Self {
            cfg,
            last_page: None,
            stride: 0,
            degree: 1,
            issued: 0,
            hits: 0,
        })
    }

    /// Pages brought per fault now.
    pub fn degree(&self) -> usize {
        self.degree
    }
}

impl Prefetcher for Stride {
    fn name(&self) -> &'static str {
        "stride"
    }

    fn on_access(&mut self, access: &Access, out: &mut Vec<u64>) {
        if let Some(prev) = self.last_page {
            self.stride = access.page.wrapping_sub(prev) as i64;
        }
        self.last_page = Some(access.page);
        if access.prefetch_hit {
            self.hits += 1;
            return;
        }
        if self.issued > 0 {
            let accuracy = self.hits as f64 / self.issued as f64;
            if accuracy >= self.cfg.raise_accuracy {
                self.degree = (self.degree * 2).min(self.cfg.max_degree);
            } else if accuracy < self.cfg.lower_accuracy {
                self.degree = (self.degree / 2).max(1);
            }
            self.issued = 0;
            self.hits = 0;
        }
        if self.stride == 0 {
            return;
        }
        let start = out.len();
        out.extend((1..=self.degree as u64).filter_map(|i| offset(access.page, self.stride, i)));
        self.issued += (out.len() - start) as u64;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::prefetch::test_access as acc;

    #[test]
    fn follows_the_last_stride_and_grows_with_accuracy() {
        let mut s = Stride::new(StrideConfig::default()).unwrap();
        let mut out = Vec::new();
        s.on_access(&acc(100, false), &mut out);
        assert!(out.is_empty(), "one access: no stride yet");
        s.on_access(&acc(110, false), &mut out);
        assert_eq!(out, vec![120]);
        out.clear();
        s.on_access(&acc(120, true), &mut out);
        s.on_access(&acc(130, false), &mut out); // 1 of 1 used: degree 2
        assert_eq!(out, vec![140, 150]);
        out.clear();
        s.on_access(&acc(140, true), &mut out);
        s.on_access(&acc(150, true), &mut out);
        s.on_access(&acc(160, false), &mut out); // 2 of 2: degree 4
        assert_eq!(out, vec![170, 180, 190, 200]);
        assert_eq!(s.degree(), 4);
    }

    #[test]
    fn inaccurate_prefetches_shrink_the_degree_and_a_new_stride_is_followed() {
        let mut s = Stride::new(StrideConfig::default()).unwrap();
        let mut out = Vec::new();
        for (p, h) in [
            (0, false),
            (1, false),
            (2, true),
            (3, false),
            (4, true),
            (5, true),
            (6, false),
        ] {
            s.on_access(&acc(p, h), &mut out);
        }
        assert_eq!(s.degree(), 4);
        out.clear();
        // Misses with a new stride of -7: the 4 pages issued at 6 were never used.
        s.on_access(&acc(1000, false), &mut out);
        assert_eq!(s.degree(), 2);
        out.clear();
        s.on_access(&acc(993, false), &mut out);
        assert_eq!(s.degree(), 1);
        assert_eq!(out, vec![986]);
    }

    #[test]
    fn repeated_page_means_no_stride() {
        let mut s = Stride::new(StrideConfig::default()).unwrap();
        let mut out = Vec::new();
        s.on_access(&acc(5, false), &mut out);
        s.on_access(&acc(5, false), &mut out);
        assert!(out.is_empty());
    }

    #[test]
    fn rejects_bad_thresholds() {
        let cfg = StrideConfig {
            lower_accuracy: 0.9,
            raise_accuracy: 0.5,
            ..StrideConfig::default()
        };
        assert!(Stride::new(cfg)
            .unwrap_err()
            .to_string()
            .contains("lower <= raise"));
        assert!(Stride::new(StrideConfig {
            max_degree: 0,
            ..StrideConfig::default()
        })
        .is_err());
    }
}
