//! First-touch readahead: which never-written pages to map ahead of a thread that writes a
//! fresh buffer in order (a `memset`, a `numpy` fill, a `read(2)` into a new array).
//!
//! # Design
//!
//! The kernel serves a first touch of anonymous memory in about a microsecond; under
//! userfaultfd every first touch is a round trip through the fault thread. A thread that
//! writes fresh memory in order touches page `p + 1` right after `p`, so once two first
//! touches of a stream are adjacent, the pages after it are mapped (zeroed) at once, in one
//! run. The window doubles (2, 4, … `max_window_pages`) each time the stream's next first touch
//! lands exactly on the page after the previous window (the window was used: nothing else
//! faults in between), and starts again from nothing when the thread touches anywhere else.
//! Mapped-ahead pages the program never touches cost only their budget until evicted (an
//! all-zero page is dropped, never sent).
//!
//! Streams are per thread (the fault message names the faulting thread); at most
//! `max_streams` are kept, the least recently active forgotten first.
//!
//! # Limitations
//!
//! Only ascending scans are detected (fills run forwards).

use std::collections::HashMap;
use std::ops::Range;

use crate::linked::LinkedSet;
use crate::PolicyError;

/// Configuration of [`FirstTouch`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FirstTouchConfig {
    /// Largest window, in pages. Default 64 (256 KiB: one UFFDIO_COPY of a zeroed run).
    /// 0 disables first-touch readahead.
    pub max_window_pages: u64,
    /// Most thread streams kept at once. Default 4096.
    pub max_streams: usize,
}

impl Default for FirstTouchConfig {
    fn default() -> Self {
        Self {
            max_window_pages: 64,
            max_streams: 4096,
        }
    }
}

impl FirstTouchConfig {
    /// Checks the ranges: a window of at most 4096 pages (16 MiB), at least one stream.
    pub fn validate(&self) -> Result<(), PolicyError> {
        let bad = |reason: String| {
            Err(PolicyError::InvalidConfig {
                policy: "first-touch",
                reason,
            })
        };
        if self.max_window_pages > 4096 {
            return bad(format!(
                "max_window_pages is {}; use 0..=4096",
                self.max_window_pages
            ));
        }
        if self.max_streams == 0 {
            return bad("max_streams is 0; use at least 1".into());
        }
        Ok(())
    }
}

/// One thread's stream of first touches.
#[derive(Debug, Clone, Copy)]
struct Stream {
    /// The page a sequential stream touches next (first page after the last window).
    next: u64,
    /// The last window's size.
    window: u64,
}

/// First-touch readahead; see the module docs.
#[derive(Debug)]
pub struct FirstTouch {
    cfg: FirstTouchConfig,
    streams: HashMap<u32, Stream>,
    /// Thread ids, least recently active first.
    recency: LinkedSet,
}

impl FirstTouch {
    /// A first-touch readahead; fails if `cfg` is out of range.
    pub fn new(cfg: FirstTouchConfig) -> Result<Self, PolicyError> {
        cfg.validate()?;
        Ok(Self {
            cfg,
            streams: HashMap::new(),
            recency: LinkedSet::new(),
        })
    }

    /// `thread` touched never-written page `page` (a fault). Returns the pages to map ahead
    /// (empty when the stream is not sequential). The caller maps what it can of them, in
    /// order; pages it skips (resident already, no room) are simply not mapped.
    pub fn on_first_touch(&mut self, page: u64, thread: u32) -> Range<u64> {
        let id = u64::from(thread);
        if !self.recency.remove(id) && self.streams.len() >= self.cfg.max_streams {
            if let Some(oldest) = self.recency.pop_front() {
                self.streams.remove(&(oldest as u32));
            }
        }
        self.recency.push_back(id);
        let start = page.saturating_add(1);
        let s = self.streams.entry(thread).or_insert(Stream {
            next: u64::MAX,
            window: 0,
        });
        let window = if page == s.next {
            (s.window * 2).max(2).min(self.cfg.max_window_pages)
        } else {
            0
        };
        let end = start.saturating_add(window);
        *s = Stream { next: end, window };
        start..end
    }

    /// The caller mapped the window [`on_first_touch`](Self::on_first_touch) returned for
    /// `thread` only up to `end` (exclusive; no room, or a page there is in use): the stream's
    /// next first touch is expected there, and counts as sequential.
    pub fn mapped_until(&mut self, thread: u32, end: u64) {
        if let Some(s) = self.streams.get_mut(&thread) {
            s.next = end;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ft(max: u64) -> FirstTouch {
        FirstTouch::new(FirstTouchConfig {
            max_window_pages: max,
            ..FirstTouchConfig::default()
        })
        .unwrap()
    }

    #[test]
    fn sequential_first_touches_grow_the_window_to_the_maximum() {
        let mut f = ft(8);
        assert_eq!(f.on_first_touch(100, 1), 101..101); // a new stream: nothing yet
        assert_eq!(f.on_first_touch(101, 1), 102..104); // adjacent: 2 pages
        assert_eq!(f.on_first_touch(104, 1), 105..109); // the window was used: 4
        assert_eq!(f.on_first_touch(109, 1), 110..118); // 8
        assert_eq!(f.on_first_touch(118, 1), 119..127); // capped at 8
    }

    #[test]
    fn a_window_mapped_in_part_continues_where_the_mapping_stopped() {
        let mut f = ft(64);
        f.on_first_touch(0, 1);
        assert_eq!(f.on_first_touch(1, 1), 2..4);
        f.mapped_until(1, 2); // no room: nothing mapped
        assert_eq!(f.on_first_touch(2, 1), 3..7); // still sequential: the window grows
        f.mapped_until(7, 100); // another thread's stream: unknown, ignored
        assert_eq!(f.on_first_touch(7, 1), 8..16);
    }

    #[test]
    fn a_jump_restarts_the_stream() {
        let mut f = ft(64);
        f.on_first_touch(10, 1);
        assert_eq!(f.on_first_touch(11, 1), 12..14);
        // Touching elsewhere (the window was not consumed in order): nothing mapped.
        assert_eq!(f.on_first_touch(500, 1), 501..501);
        assert_eq!(f.on_first_touch(501, 1), 502..504);
    }

    #[test]
    fn threads_have_their_own_streams() {
        let mut f = ft(64);
        f.on_first_touch(0, 1);
        f.on_first_touch(1000, 2);
        assert_eq!(f.on_first_touch(1, 1), 2..4);
        assert_eq!(f.on_first_touch(1001, 2), 1002..1004);
    }

    #[test]
    fn zero_window_disables_it() {
        let mut f = ft(0);
        f.on_first_touch(0, 1);
        assert_eq!(f.on_first_touch(1, 1), 2..2);
        assert_eq!(f.on_first_touch(2, 1), 3..3);
    }

    #[test]
    fn streams_are_bounded_least_recent_forgotten() {
        let mut f = FirstTouch::new(FirstTouchConfig {
            max_window_pages: 8,
            max_streams: 2,
        })
        .unwrap();
        f.on_first_touch(0, 1);
        f.on_first_touch(100, 2);
        f.on_first_touch(200, 3); // forgets thread 1
        assert_eq!(f.streams.len(), 2);
        assert_eq!(f.on_first_touch(1, 1), 2..2); // thread 1 starts over
        assert_eq!(f.on_first_touch(201, 3), 202..204);
    }

    #[test]
    fn last_page_does_not_overflow() {
        let mut f = ft(8);
        f.on_first_touch(u64::MAX - 1, 1);
        assert_eq!(f.on_first_touch(u64::MAX, 1), u64::MAX..u64::MAX);
    }

    #[test]
    fn config_is_validated() {
        assert!(FirstTouchConfig::default().validate().is_ok());
        let e = FirstTouch::new(FirstTouchConfig {
            max_window_pages: 5000,
            ..FirstTouchConfig::default()
        })
        .unwrap_err();
        assert!(e.to_string().contains("use 0..=4096"), "{e}");
        assert!(FirstTouch::new(FirstTouchConfig {
            max_streams: 0,
            ..FirstTouchConfig::default()
        })
        .is_err());
    }
}
