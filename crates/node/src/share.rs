//! Each user's share of the node's slabs, so one local user cannot take them all.
//!
//! # Design
//! - A user (uid) is *active* while it holds slabs, or *wants* memory: an ALLOC of its was
//!   refused for lack of room within the last [`WANT_WINDOW`]. Connections alone do not count:
//!   a STATS-only connection (`farmem stats --node`) must not shrink anyone's share.
//! - The *fair share* is the capacity divided among the active users (rounded up to whole
//!   slabs), the asking user counted. It binds only while another user wants memory, so one
//!   user alone (or several that ask for no more) may use the whole capacity: nothing is
//!   stranded. When a user wants memory and is below its fair share, the users above theirs
//!   are asked (RECLAIM, the give-back `--resize` and `--keep-free` use) for the excess; their
//!   runtimes move those pages elsewhere, nothing is lost.
//! - [`MaxShare`] (`--max-share-per-uid SIZE|PERCENT`) bounds every user always, whatever the
//!   others want. Root and the node's own user are bound like everyone else: they can resize
//!   the node, but a program of theirs must not starve the others by accident either.
//!
//! # Limitations
//! A user's processes share one share: a user with many programs gets no more than a user
//! with one. A uid is the unit: two people sharing one uid are one user.
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// How long a refused ALLOC keeps its user counted as wanting memory (a runtime tries again
/// about once a second while it has pages to place).
pub const WANT_WINDOW: Duration = Duration::from_secs(5);

/// `--max-share-per-uid`: the most one user may hold, always.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MaxShare {
    /// At most this many bytes.
    Bytes(u64),
    /// At most this percentage (1–100) of the capacity.
    Percent(u8),
}

/// A `--max-share-per-uid` value that cannot be read.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum MaxShareError {
    #[error("--max-share-per-uid {0}: a percentage is a whole number from 1 to 100, e.g. 50%")]
    BadPercent(String),
    #[error("--max-share-per-uid {0}: {1}")]
    BadSize(String, String),
    #[error("--max-share-per-uid 0: a user could hold nothing; give a size (e.g. 1GiB) or a percentage (e.g. 50%)")]
    Zero,
}

impl MaxShare {
    /// Reads `50%` or a size (`parse_size` reads sizes: the caller's units).
    pub fn parse(
        text: &str,
        parse_size: impl Fn(&str) -> Result<u64, String>,
    ) -> Result<MaxShare, MaxShareError> {
        let t = text.trim();
        if let Some(p) = t.strip_suffix('%') {
            return match p.trim().parse::<u8>() {
                Ok(n) if (1..=100).contains(&n) => Ok(MaxShare::Percent(n)),
                _ => Err(MaxShareError::BadPercent(text.into())),
            };
        }
        match parse_size(t) {
            Ok(0) => Err(MaxShareError::Zero),
            Ok(b) => Ok(MaxShare::Bytes(b)),
            Err(e) => Err(MaxShareError::BadSize(text.into(), e)),
        }
    }

    /// The bound in bytes for a node of `capacity_bytes`.
    pub fn bytes(self, capacity_bytes: u64) -> u64 {
        match self {
            MaxShare::Bytes(b) => b,
            MaxShare::Percent(p) => {
                u64::try_from(u128::from(capacity_bytes) * u128::from(p) / 100).unwrap_or(u64::MAX)
            }
        }
    }
}

/// The fair share of one of `active` users (at least 1) of `capacity_bytes`, in whole slabs.
pub fn fair_share_bytes(capacity_bytes: u64, slab_bytes: u64, active: usize) -> u64 {
    let slabs = capacity_bytes / slab_bytes;
    slabs.div_ceil(active.max(1) as u64) * slab_bytes
}

/// Users refused an ALLOC for lack of room lately.
#[derive(Debug, Default)]
pub struct Wanting {
    since: HashMap<u32, Instant>,
}

impl Wanting {
    /// `uid` was refused a slab it is entitled to now.
    pub fn note(&mut self, uid: u32) {
        self.since.insert(uid, Instant::now());
    }

    /// The users that want memory now (forgetting the others).
    pub fn users(&mut self) -> Vec<u32> {
        self.since.retain(|_, t| t.elapsed() < WANT_WINDOW);
        self.since.keys().copied().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn size(t: &str) -> Result<u64, String> {
        t.strip_suffix("MiB")
            .and_then(|n| n.parse::<u64>().ok())
            .map(|n| n << 20)
            .ok_or_else(|| "bad size".into())
    }

    #[test]
    fn max_share_reads_sizes_and_percentages_and_refuses_the_rest() {
        assert_eq!(
            MaxShare::parse("64MiB", size),
            Ok(MaxShare::Bytes(64 << 20))
        );
        assert_eq!(MaxShare::parse("50%", size), Ok(MaxShare::Percent(50)));
        assert!(matches!(
            MaxShare::parse("0%", size),
            Err(MaxShareError::BadPercent(_))
        ));
        assert!(matches!(
            MaxShare::parse("101%", size),
            Err(MaxShareError::BadPercent(_))
        ));
        assert_eq!(MaxShare::parse("0MiB", size), Err(MaxShareError::Zero));
        assert!(MaxShare::parse("lots", size)
            .unwrap_err()
            .to_string()
            .contains("--max-share-per-uid lots"));
        assert_eq!(MaxShare::Percent(25).bytes(400), 100);
    }

    #[test]
    fn the_fair_share_divides_whole_slabs_and_one_user_gets_everything() {
        assert_eq!(fair_share_bytes(256, 1, 1), 256);
        assert_eq!(fair_share_bytes(256, 1, 2), 128);
        assert_eq!(fair_share_bytes(256, 1, 3), 86);
        assert_eq!(fair_share_bytes(16 << 20, 4 << 20, 3), 8 << 20);
        assert_eq!(fair_share_bytes(16, 1, 0), 16);
    }
}
