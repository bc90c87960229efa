//! Whether pages installed ahead of use go in writable or write-protected.
//!
//! # Design
//!
//! A page the prefetcher installs ahead from the host tier equals its far copy. Installed
//! write-protected, it stays clean until written, and an eviction drops it for free; but the
//! first write to it is a write-protect fault, a whole userfaultfd round trip. Installed
//! writable (as a demand fault's page is), a write costs nothing, and an eviction compares the
//! page with its far copy to learn whether it changed.
//!
//! Which is cheaper depends on the program: a scan that reads and then writes every page (a
//! managed heap's collector, an in-place update) takes a write-protect fault per page
//! (jvm-heap at 0.5 ran 25.1 and 22.0 s write-protected, 15.8 and 13.7 s writable), while a
//! read-only scan gains nothing from writable pages and pays the compare (seq, numpy and
//! kmeans 2–6 % slower writable). So the choice is measured, not fixed: [`AheadWrites`]
//! keeps the share of write-protected installs that were later written, and installs
//! writable while more than half were. Write-protected installs are the only ones that say
//! whether they were written, so in writable mode one install in `sample_every` stays
//! write-protected to keep the share measured. The counts halve every `window` installs, so
//! the share follows the program's current phase.
//!
//! # Limitations
//!
//! - A page installed write-protected and not written yet counts as not written: the share
//!   lags a program that writes its pages long after reading them.
//! - One share for the whole process: a program with a read-only scan and a read-write scan at
//!   once gets the mode of the larger.

use crate::PolicyError;

/// Configuration of [`AheadWrites`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AheadWritesConfig {
    /// Write-protected installs counted before the share decides anything (write-protected
    /// until then). Default 256.
    pub min_samples: u32,
    /// In writable mode, one install in this many stays write-protected, to keep measuring.
    /// Default 8.
    pub sample_every: u32,
    /// The counts halve when this many write-protected installs are counted. Default 4096.
    pub window: u32,
}

impl Default for AheadWritesConfig {
    fn default() -> Self {
        Self {
            min_samples: 256,
            sample_every: 8,
            window: 4096,
        }
    }
}

impl AheadWritesConfig {
    /// Checks the ranges: `sample_every` ≥ 2 (1 would never install writable), `window` ≥ 2
    /// and ≥ `min_samples` (the share must be able to reach its minimum).
    pub fn validate(&self) -> Result<(), PolicyError> {
        let bad = |reason: String| {
            Err(PolicyError::InvalidConfig {
                policy: "ahead-writes",
                reason,
            })
        };
        if self.sample_every < 2 {
            return bad(format!(
                "sample_every is {}; use at least 2",
                self.sample_every
            ));
        }
        if self.window < 2 || self.window < self.min_samples {
            return bad(format!(
                "window is {} with min_samples {}; use a window of at least 2 and at least \
                 min_samples",
                self.window, self.min_samples
            ));
        }
        Ok(())
    }
}

/// The share of pages installed ahead write-protected that were later written; see the
/// module docs.
#[derive(Debug, Clone)]
pub struct AheadWrites {
    cfg: AheadWritesConfig,
    /// Write-protected installs counted (halved every `window`).
    installed: u32,
    /// Of those, pages written later.
    written: u32,
    /// Installs asked for in writable mode, for sampling.
    asked: u32,
}

impl AheadWrites {
    /// A tracker with `cfg`, validated.
    pub fn new(cfg: AheadWritesConfig) -> Result<Self, PolicyError> {
        cfg.validate()?;
        Ok(Self {
            cfg,
            installed: 0,
            written: 0,
            asked: 0,
        })
    }

    /// Whether the next page installed ahead goes in writable. When this returns false the
    /// caller installs it write-protected and calls [`protected`](Self::protected) once
    /// it is in.
    pub fn writable(&mut self) -> bool {
        if !self.mostly_written() {
            return false;
        }
        self.asked = self.asked.wrapping_add(1);
        !self.asked.is_multiple_of(self.cfg.sample_every)
    }

    /// A page was installed ahead write-protected.
    pub fn protected(&mut self) {
        self.installed += 1;
        if self.installed >= self.cfg.window {
            self.installed /= 2;
            self.written /= 2;
        }
    }

    /// A page installed ahead write-protected was written (its write-protect fault).
    pub fn written(&mut self) {
        self.written = (self.written + 1).min(self.installed);
    }

    /// Whether more than half of the counted write-protected installs were written, over at
    /// least `min_samples` of them.
    pub fn mostly_written(&self) -> bool {
        self.installed >= self.cfg.min_samples.max(1) && 2 * self.written > self.installed
    }
}

impl Default for AheadWrites {
    fn default() -> Self {
        Self::new(AheadWritesConfig::default()).expect("the default configuration is valid")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tracker() -> AheadWrites {
        AheadWrites::new(AheadWritesConfig {
            min_samples: 16,
            sample_every: 4,
            window: 64,
        })
        .unwrap()
    }

    /// Installs `n` pages as the caller does, writing each sampled (write-protected) page
    /// when `write` says so; returns how many went in writable.
    fn run(t: &mut AheadWrites, n: usize, write: impl Fn(usize) -> bool) -> usize {
        let mut writable = 0;
        for i in 0..n {
            if t.writable() {
                writable += 1;
                continue;
            }
            t.protected();
            if write(i) {
                t.written();
            }
        }
        writable
    }

    #[test]
    fn a_read_only_scan_stays_write_protected() {
        let mut t = tracker();
        assert_eq!(run(&mut t, 1000, |_| false), 0);
        assert!(!t.mostly_written());
    }

    #[test]
    fn a_read_write_scan_goes_writable_and_keeps_sampling() {
        let mut t = tracker();
        let writable = run(&mut t, 1000, |_| true);
        assert!(t.mostly_written());
        // The first 16 write-protected, then 3 in 4 writable.
        assert!((700..=750).contains(&writable), "{writable}");
    }

    #[test]
    fn nothing_is_decided_before_min_samples() {
        let mut t = tracker();
        assert_eq!(run(&mut t, 15, |_| true), 0);
        assert!(!t.mostly_written());
        assert_eq!(run(&mut t, 1, |_| true), 0);
        assert!(t.mostly_written());
    }

    #[test]
    fn fewer_than_half_written_is_not_mostly_written() {
        let mut t = tracker();
        assert_eq!(run(&mut t, 1000, |i| i % 5 < 2), 0);
    }

    #[test]
    fn the_share_follows_a_change_of_phase() {
        let mut t = tracker();
        run(&mut t, 1000, |_| true);
        assert!(t.mostly_written());
        // Reads only from now on: only the samples say so, and the window forgets the writes.
        run(&mut t, 2000, |_| false);
        assert!(!t.mostly_written());
        assert_eq!(run(&mut t, 100, |_| false), 0);
        run(&mut t, 1000, |_| true);
        assert!(t.mostly_written());
    }

    #[test]
    fn a_write_never_counts_beyond_the_installs() {
        let mut t = tracker();
        for _ in 0..100 {
            t.written();
        }
        assert!(!t.mostly_written());
        run(&mut t, 16, |_| false);
        assert!(!t.mostly_written());
    }

    #[test]
    fn bad_configurations_are_refused_with_the_reason() {
        for cfg in [
            AheadWritesConfig {
                sample_every: 1,
                ..AheadWritesConfig::default()
            },
            AheadWritesConfig {
                window: 1,
                min_samples: 0,
                ..AheadWritesConfig::default()
            },
            AheadWritesConfig {
                window: 100,
                min_samples: 200,
                ..AheadWritesConfig::default()
            },
        ] {
            let e = AheadWrites::new(cfg).unwrap_err();
            assert!(e.to_string().contains("ahead-writes"), "{e}");
        }
        assert!(AheadWritesConfig::default().validate().is_ok());
    }
}
