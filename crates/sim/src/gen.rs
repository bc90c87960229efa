//! Synthetic page-access traces over a working set of `wss_pages` pages (page numbers
//! `0..wss_pages`), `length` accesses long, one access per microsecond of trace time, all reads.
//!
//! | spec | pattern |
//! |---|---|
//! | `seq` | pages 0, 1, 2, … wrapping around the working set |
//! | `stride:K` | pages 0, K, 2K, …; at the end of the working set the next pass starts one page further (1, K+1, …), so K passes touch every page |
//! | `interleave:T:K1,K2,…` | T threads (ids 0..T), each walking its own 1/T of the working set with its own stride (the list is reused cyclically when shorter than T); accesses alternate between threads round-robin |
//! | `random` | uniform over the working set |
//! | `zipf:S` | Zipf with exponent S > 0 over the working set: rank r has weight 1/r^S; ranks are scattered over the pages by a fixed random permutation |
//! | `phases` | four equal phases with strides +1, −3, +2, +7 (the stride changes mid-run, as in Leap's Figure 5) |
//!
//! Random choices come from a seeded SplitMix64 generator: the same spec, sizes and seed give the
//! same trace.

use crate::trace::{AccessKind, Record};
use crate::SimError;

/// Nanoseconds of trace time between two generated accesses.
pub const ACCESS_INTERVAL_NS: u64 = 1000;
/// Longest generated trace (records are held in memory, 24 bytes each).
pub const MAX_LENGTH: u64 = 50_000_000;
/// Largest working set for `zipf` (16 bytes of tables per page).
pub const MAX_ZIPF_PAGES: u64 = 1 << 25;

/// A parsed generator spec; see the module docs.
#[derive(Debug, Clone, PartialEq)]
pub enum GenSpec {
    /// `seq`
    Seq,
    /// `stride:K`
    Stride(u64),
    /// `interleave:T:K1,K2,…`
    Interleave {
        /// Number of threads.
        threads: u32,
        /// Stride of each thread (cyclic).
        strides: Vec<u64>,
    },
    /// `random`
    Random,
    /// `zipf:S`
    Zipf(f64),
    /// `phases`
    Phases,
}

impl GenSpec {
    /// Parses a spec such as `stride:10` or `interleave:4:3,5,7,11`.
    pub fn parse(spec: &str) -> Result<Self, SimError> {
        let bad = |reason: &str| SimError::BadGenSpec {
            spec: spec.to_string(),
            reason: reason.to_string(),
        };
        let parts: Vec<&str> = spec.trim().split(':').collect();
        match parts.as_slice() {
            ["seq"] => Ok(Self::Seq),
            ["random"] => Ok(Self::Random),
            ["phases"] => Ok(Self::Phases),
            ["stride", k] => {
                let k: u64 = k
                    .parse()
                    .map_err(|_| bad("stride:K needs a whole number K ≥ 1"))?;
                if k == 0 {
                    return Err(bad("stride:K needs K ≥ 1"));
                }
                Ok(Self::Stride(k))
            }
            ["zipf", s] => {
                let s: f64 = s
                    .parse()
                    .map_err(|_| bad("zipf:S needs a number S > 0, e.g. zipf:0.99"))?;
                if !(s > 0.0 && s.is_finite()) {
                    return Err(bad("zipf:S needs a finite S > 0"));
                }
                Ok(Self::Zipf(s))
            }
            ["interleave", t, ks] => {
                let threads: u32 = t.parse().map_err(|_| {
                    bad("interleave:T:K1,K2,… needs a whole number of threads T ≥ 1")
                })?;
                if threads == 0 || threads > 4096 {
                    return Err(bad("interleave needs 1 to 4096 threads"));
                }
                let strides = ks
                    .split(',')
                    .map(|k| k.trim().parse::<u64>().ok().filter(|&k| k >= 1))
                    .collect::<Option<Vec<u64>>>()
                    .ok_or_else(|| {
                        bad("interleave strides must be whole numbers ≥ 1, comma separated")
                    })?;
                Ok(Self::Interleave { threads, strides })
            }
            _ => Err(bad(
                "use seq, stride:K, interleave:T:K1,K2,…, random, zipf:S or phases",
            )),
        }
    }
}

/// SplitMix64: small, fast, good enough for workload generation.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator from `seed`.
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }
    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in `0..n` (n ≥ 1), by multiply-shift.
    pub fn below(&mut self, n: u64) -> u64 {
        ((u128::from(self.next_u64()) * u128::from(n)) >> 64) as u64
    }
    /// Uniform in `[0, 1)`.
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// Walks `size` pages from `base` with a signed stride, one page further at each pass.
#[derive(Debug, Clone)]
struct StrideWalk {
    base: u64,
    size: u64,
    stride: u64,
    descending: bool,
    cur: u64,
    pass: u64,
}

impl StrideWalk {
    fn new(base: u64, size: u64, stride: i64) -> Self {
        let size = size.max(1);
        Self {
            base,
            size,
            stride: stride.unsigned_abs().clamp(1, size),
            descending: stride < 0,
            cur: 0,
            pass: 0,
        }
    }

    fn next_page(&mut self) -> u64 {
        let offset = if self.descending {
            self.size - 1 - self.cur
        } else {
            self.cur
        };
        self.cur += self.stride;
        if self.cur >= self.size {
            self.pass = (self.pass + 1) % self.stride;
            self.cur = self.pass;
        }
        self.base + offset
    }
}

/// Generates `length` accesses of `spec` over `wss_pages` pages.
pub fn generate(
    spec: &GenSpec,
    wss_pages: u64,
    length: u64,
    seed: u64,
) -> Result<Vec<Record>, SimError> {
    if wss_pages == 0 {
        return Err(SimError::BadParam(
            "the working set must hold at least 1 page".into(),
        ));
    }
    if wss_pages > 1 << 32 {
        return Err(SimError::BadParam(format!(
            "a working set of {wss_pages} pages is too large for the generators (at most 2^32 pages, 16 TiB)"
        )));
    }
    if length > MAX_LENGTH {
        return Err(SimError::BadParam(format!(
            "{length} accesses is more than the generators keep in memory (at most {MAX_LENGTH}); use a shorter --length"
        )));
    }
    if matches!(spec, GenSpec::Zipf(_)) && wss_pages > MAX_ZIPF_PAGES {
        return Err(SimError::BadParam(format!(
            "zipf keeps a table entry per page: at most {MAX_ZIPF_PAGES} pages, not {wss_pages}"
        )));
    }
    let mut rng = Rng::new(seed);
    let mut out = Vec::with_capacity(length.min(1 << 26) as usize);
    let rec = |i: u64, page: u64, thread: u32| Record {
        time_ns: i * ACCESS_INTERVAL_NS,
        page,
        thread,
        kind: AccessKind::Read,
    };
    match spec {
        GenSpec::Seq => out.extend((0..length).map(|i| rec(i, i % wss_pages, 0))),
        GenSpec::Stride(k) => {
            let mut w = StrideWalk::new(0, wss_pages, i64::try_from(*k).unwrap_or(i64::MAX));
            out.extend((0..length).map(|i| rec(i, w.next_page(), 0)));
        }
        GenSpec::Interleave { threads, strides } => {
            let t = u64::from(*threads);
            let share = wss_pages / t;
            if share == 0 {
                return Err(SimError::BadParam(format!(
                    "{threads} threads need a working set of at least {threads} pages"
                )));
            }
            let mut walks: Vec<StrideWalk> = (0..t)
                .map(|i| {
                    let k = strides[(i as usize) % strides.len()];
                    StrideWalk::new(i * share, share, i64::try_from(k).unwrap_or(i64::MAX))
                })
                .collect();
            for i in 0..length {
                let th = (i % t) as usize;
                out.push(rec(i, walks[th].next_page(), th as u32));
            }
        }
        GenSpec::Random => out.extend((0..length).map(|i| rec(i, rng.below(wss_pages), 0))),
        GenSpec::Zipf(s) => {
            let mut cdf = Vec::with_capacity(wss_pages as usize);
            let mut total = 0.0f64;
            for r in 1..=wss_pages {
                total += 1.0 / (r as f64).powf(*s);
                cdf.push(total);
            }
            let mut perm: Vec<u64> = (0..wss_pages).collect();
            for i in (1..perm.len()).rev() {
                let j = rng.below(i as u64 + 1) as usize;
                perm.swap(i, j);
            }
            for i in 0..length {
                let x = rng.unit() * total;
                let rank = cdf.partition_point(|&c| c <= x).min(cdf.len() - 1);
                out.push(rec(i, perm[rank], 0));
            }
        }
        GenSpec::Phases => {
            let strides = [1i64, -3, 2, 7];
            let phase_len = length.div_ceil(strides.len() as u64).max(1);
            let mut walk = StrideWalk::new(0, wss_pages, strides[0]);
            for i in 0..length {
                if i > 0 && i % phase_len == 0 {
                    walk = StrideWalk::new(0, wss_pages, strides[(i / phase_len) as usize]);
                }
                out.push(rec(i, walk.next_page(), 0));
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pages(spec: &str, wss: u64, len: u64) -> Vec<u64> {
        generate(&GenSpec::parse(spec).unwrap(), wss, len, 7)
            .unwrap()
            .iter()
            .map(|r| r.page)
            .collect()
    }

    #[test]
    fn seq_and_stride_walk_every_page() {
        assert_eq!(pages("seq", 4, 6), vec![0, 1, 2, 3, 0, 1]);
        assert_eq!(pages("stride:3", 7, 9), vec![0, 3, 6, 1, 4, 2, 5, 0, 3]);
        let mut all = pages("stride:10", 100, 100);
        all.sort_unstable();
        assert_eq!(
            all,
            (0..100).collect::<Vec<_>>(),
            "10 passes touch each page once"
        );
    }

    #[test]
    fn interleave_gives_each_thread_its_region_and_stride() {
        let recs = generate(&GenSpec::parse("interleave:2:3,5").unwrap(), 40, 8, 1).unwrap();
        let got: Vec<(u32, u64)> = recs.iter().map(|r| (r.thread, r.page)).collect();
        assert_eq!(
            got,
            vec![
                (0, 0),
                (1, 20),
                (0, 3),
                (1, 25),
                (0, 6),
                (1, 30),
                (0, 9),
                (1, 35)
            ]
        );
        assert!(recs
            .windows(2)
            .all(|w| w[1].time_ns == w[0].time_ns + ACCESS_INTERVAL_NS));
    }

    #[test]
    fn phases_change_stride_mid_run() {
        let p = pages("phases", 100, 16);
        let deltas: Vec<i64> = p.windows(2).map(|w| w[1] as i64 - w[0] as i64).collect();
        assert_eq!(&deltas[0..3], &[1, 1, 1]);
        assert_eq!(p[4], 99, "descending phase starts at the top");
        assert_eq!(&deltas[4..7], &[-3, -3, -3]);
        assert_eq!(&deltas[8..11], &[2, 2, 2]);
        assert_eq!(&deltas[12..15], &[7, 7, 7]);
    }

    #[test]
    fn random_and_zipf_stay_in_range_are_seeded_and_zipf_is_skewed() {
        let a = pages("random", 1000, 5000);
        assert!(a.iter().all(|&p| p < 1000));
        assert_eq!(a, pages("random", 1000, 5000), "same seed, same trace");
        let z = pages("zipf:1.2", 1000, 20000);
        assert!(z.iter().all(|&p| p < 1000));
        let mut counts = std::collections::HashMap::new();
        for p in &z {
            *counts.entry(*p).or_insert(0u32) += 1;
        }
        let mut c: Vec<u32> = counts.values().copied().collect();
        c.sort_unstable_by(|a, b| b.cmp(a));
        // Rank 1 of zipf(1.2) over 1000 pages has probability ~ 1/zeta ~ 0.2.
        assert!(c[0] > 20000 / 8, "hottest page seen {} times", c[0]);
        let u = pages("random", 1000, 20000);
        let mut uc = std::collections::HashMap::new();
        for p in &u {
            *uc.entry(*p).or_insert(0u32) += 1;
        }
        assert!(*uc.values().max().unwrap() < 60, "uniform: no page is hot");
    }

    #[test]
    fn bad_specs_are_rejected_with_the_reason() {
        for bad in [
            "",
            "seqq",
            "stride",
            "stride:0",
            "stride:x",
            "zipf:-1",
            "zipf:nan",
            "interleave:0:1",
            "interleave:2:",
            "interleave:2:3,0",
        ] {
            assert!(GenSpec::parse(bad).is_err(), "{bad:?} must be rejected");
        }
        assert_eq!(
            GenSpec::parse("stride:0").unwrap_err().to_string(),
            "bad trace generator \"stride:0\": stride:K needs K ≥ 1"
        );
        assert!(generate(&GenSpec::Seq, 0, 10, 1).is_err());
        assert!(generate(&GenSpec::Seq, 10, MAX_LENGTH + 1, 1)
            .unwrap_err()
            .to_string()
            .contains("shorter --length"));
        assert!(generate(&GenSpec::Zipf(1.0), MAX_ZIPF_PAGES + 1, 10, 1).is_err());
        assert!(generate(&GenSpec::parse("interleave:8:1").unwrap(), 4, 10, 1).is_err());
    }
}
