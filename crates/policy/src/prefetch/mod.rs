//! Prefetchers: given each access the caller saw, which pages to bring in ahead of use.
//!
//! One file per prefetcher: [`leap`] (Leap's majority-trend prefetcher, per thread or per
//! process), and its rivals [`none`], [`next_n`], [`stride`] and [`readahead`].

pub mod leap;
pub mod next_n;
pub mod none;
pub mod readahead;
pub mod stride;

pub use leap::{AccessHistory, Leap, LeapConfig};
pub use next_n::{NextN, NextNConfig};
pub use none::{NoPrefetch, NoPrefetchConfig};
pub use readahead::{Readahead, ReadaheadConfig};
pub use stride::{Stride, StrideConfig};

use crate::PolicyError;

/// One access, as the caller reports it to a prefetcher.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Access {
    /// Page number (far address space offset / 4096).
    pub page: u64,
    /// Id of the thread that made the access (any stable number per thread).
    pub thread: u32,
    /// When it happened, in nanoseconds from any fixed origin (non-decreasing per thread).
    pub time_ns: u64,
    /// True when this is the first access to a page a prefetch brought in (a prefetch hit);
    /// false when the access faulted (the page was not resident).
    pub prefetch_hit: bool,
}

/// Predicts the pages the program will touch next.
///
/// # What the caller guarantees
///
/// - It calls [`on_access`](Self::on_access) for every access that faulted and for every
///   prefetch hit it can see (the first access to a prefetched page), in the order they
///   happened; it does not report later accesses to resident pages (it cannot see them).
/// - It serialises calls (`&mut self`).
///
/// # What the implementation guarantees
///
/// - `on_access` only appends to `out` (it never clears or reads it), at most a bounded number of
///   pages per call (the policy's maximum window), in the order they should be fetched.
/// - It may name pages that are resident, in flight, or outside any region: the caller filters
///   them (the prefetcher has no view of residency).
/// - Each call costs O(1) (for Leap, O(H_size)); state grows with the number of threads, not pages.
pub trait Prefetcher: Send {
    /// The prefetcher's name as accepted by [`by_name`].
    fn name(&self) -> &'static str;
    /// Feeds one access; appends the pages to bring in to `out`.
    fn on_access(&mut self, access: &Access, out: &mut Vec<u64>);
    /// The caller's measured lookahead: how many pages a stream consumes during one fetch
    /// round trip (a slow or long link needs more pages in flight to keep a scan from
    /// waiting). A prefetcher may widen its largest window toward it, within its own bounds
    /// (never past [`MAX_LOOKAHEAD_PAGES`]); by default it is ignored.
    fn set_lookahead(&mut self, pages: usize) {
        let _ = pages;
    }
}

/// The largest window any prefetcher issues at once, in pages.
pub const MAX_LOOKAHEAD_PAGES: usize = 256;

/// Names accepted by [`by_name`]; `leap` (per-thread streams) is the default.
pub const NAMES: &[&str] = &[
    "leap",
    "leap-process",
    "leap-rows",
    "none",
    "next-n",
    "stride",
    "readahead",
];

/// The prefetcher called `name`, with its default configuration: `leap` (Leap, one history
/// per thread), `leap-process` (Leap as published, one history per process), `leap-rows` (per
/// thread, following the rows of interleaved strided walks: `LeapConfig::follow_rows`), `none`,
/// `next-n`, `stride`, `readahead`.
pub fn by_name(name: &str) -> Result<Box<dyn Prefetcher>, PolicyError> {
    match name {
        "leap" => Ok(Box::new(Leap::new(LeapConfig::default())?)),
        "leap-process" => Ok(Box::new(Leap::new(LeapConfig {
            per_thread: false,
            ..LeapConfig::default()
        })?)),
        "leap-rows" => Ok(Box::new(Leap::new(LeapConfig {
            follow_rows: true,
            ..LeapConfig::default()
        })?)),
        "none" => Ok(Box::new(NoPrefetch::new(NoPrefetchConfig::default()))),
        "next-n" => Ok(Box::new(NextN::new(NextNConfig::default())?)),
        "stride" => Ok(Box::new(Stride::new(StrideConfig::default())?)),
        "readahead" => Ok(Box::new(Readahead::new(ReadaheadConfig::default())?)),
        other => Err(PolicyError::UnknownPolicy {
            kind: "prefetch",
            name: other.to_string(),
            known: NAMES.join(", "),
        }),
    }
}

/// Adds `delta * i` to `page`, or `None` when the result leaves the u64 range.
pub(crate) fn offset(page: u64, delta: i64, i: u64) -> Option<u64> {
    let step = i128::from(delta) * i128::from(i);
    u64::try_from(i128::from(page) + step).ok()
}

/// An access for unit tests: thread 0, time 0.
#[cfg(test)]
pub(crate) fn test_access(page: u64, prefetch_hit: bool) -> Access {
    Access {
        page,
        thread: 0,
        time_ns: 0,
        prefetch_hit,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn by_name_knows_every_name_and_rejects_others() {
        for name in NAMES {
            assert_eq!(by_name(name).expect("listed names build").name(), *name);
        }
        let err = by_name("oracle").err().expect("not a prefetcher");
        assert!(err
            .to_string()
            .starts_with("unknown prefetch policy \"oracle\": choose one of leap, leap-process, leap-rows, none, next-n, stride, readahead"));
    }

    #[test]
    fn offset_stays_in_range() {
        assert_eq!(offset(10, -3, 2), Some(4));
        assert_eq!(offset(1, -3, 1), None);
        assert_eq!(offset(u64::MAX, 1, 1), None);
    }
}
