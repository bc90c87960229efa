//! The donor copies of one far slab: up to [`MAX_REPLICAS`] (donor, piece of a donor slab), kept
//! inline so a slab's home stays a small `Copy` value that is looked up on every fault.
//!
//! The first replica in the list is the one reads go to while its donor is alive; the order
//! otherwise carries no meaning. A replica being filled by re-replication ([`crate::threads::heal`]) is
//! written by the sender like the others but not read until its copy is complete.

use farmem_transport::PageAddr;

use crate::slabs::pack::Piece;

/// Most replicas of one slab (`--replicas` is at most this).
pub const MAX_REPLICAS: usize = 4;

/// One donor copy of a far slab.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Replica {
    /// Index of the donor in the far side's donors (`Far::donors`, `far/mod.rs`).
    pub(crate) donor: usize,
    /// The donor's slab id.
    pub(crate) slab: u32,
    /// The far slab's first page in that donor slab ([`crate::slabs::pack`]: a donor slab holds
    /// several far slabs).
    pub(crate) base: u32,
    /// Being filled by re-replication: written, not yet read from.
    pub(crate) filling: bool,
}

impl Replica {
    /// A copy of a far slab on donor `donor`, in `piece`.
    pub(crate) fn new(donor: usize, piece: Piece, filling: bool) -> Replica {
        Replica {
            donor,
            slab: piece.slab,
            base: piece.base,
            filling,
        }
    }

    /// Where the copy of page `page` of the far slab is on the donor.
    pub(crate) fn addr(&self, page: u32) -> PageAddr {
        PageAddr {
            slab: self.slab,
            page: self.base + page,
        }
    }

    /// The piece of a donor slab this copy takes.
    pub(crate) fn piece(&self) -> Piece {
        Piece {
            slab: self.slab,
            base: self.base,
        }
    }
}

/// The donor copies of one far slab.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Replicas {
    r: [Replica; MAX_REPLICAS],
    n: u8,
}

impl Replicas {
    /// For tests: one replica a `(donor, filling)`, the i-th in slab i at base 0.
    #[cfg(test)]
    pub(crate) fn of(list: &[(usize, bool)]) -> Replicas {
        let mut r = Replicas::empty();
        for (i, &(donor, filling)) in list.iter().enumerate() {
            let piece = crate::slabs::pack::Piece {
                slab: i as u32,
                base: 0,
            };
            r.push(Replica::new(donor, piece, filling));
        }
        r
    }

    /// No replica.
    pub(crate) fn empty() -> Replicas {
        let none = Replica {
            donor: usize::MAX,
            slab: 0,
            base: 0,
            filling: false,
        };
        Replicas {
            r: [none; MAX_REPLICAS],
            n: 0,
        }
    }

    /// The replicas, in order.
    pub(crate) fn as_slice(&self) -> &[Replica] {
        &self.r[..usize::from(self.n)]
    }

    pub(crate) fn len(&self) -> usize {
        usize::from(self.n)
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.n == 0
    }

    /// Whether donor `d` holds a replica.
    pub(crate) fn has(&self, d: usize) -> bool {
        self.as_slice().iter().any(|r| r.donor == d)
    }

    /// Adds a replica (ignored when full or when the donor already has one: a slab never
    /// has two copies on one donor).
    pub(crate) fn push(&mut self, x: Replica) {
        if self.len() < MAX_REPLICAS && !self.has(x.donor) {
            self.r[self.len()] = x;
            self.n += 1;
        }
    }

    /// Removes donor `d`'s replica, returning it.
    pub(crate) fn remove(&mut self, d: usize) -> Option<Replica> {
        let i = self.as_slice().iter().position(|r| r.donor == d)?;
        let gone = self.r[i];
        let n = self.len();
        self.r.copy_within(i + 1..n, i);
        self.n -= 1;
        Some(gone)
    }

    /// Marks donor `d`'s replica complete (readable).
    pub(crate) fn filled(&mut self, d: usize) {
        let n = self.len();
        if let Some(r) = self.r[..n].iter_mut().find(|r| r.donor == d) {
            r.filling = false;
        }
    }

    /// The replicas that may be read, in order.
    pub(crate) fn readable(&self) -> impl Iterator<Item = Replica> + '_ {
        self.as_slice().iter().copied().filter(|r| !r.filling)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replicas_keep_order_refuse_duplicates_and_remove() {
        let mut r = Replicas::empty();
        r.push(Replica::new(2, Piece { slab: 10, base: 0 }, false));
        r.push(Replica::new(0, Piece { slab: 11, base: 0 }, false));
        r.push(Replica::new(2, Piece { slab: 12, base: 0 }, false)); // a second copy on donor 2 is refused
        r.push(Replica::new(1, Piece { slab: 13, base: 0 }, true));
        assert_eq!(r.len(), 3);
        assert_eq!(
            r.readable().map(|x| x.donor).collect::<Vec<_>>(),
            vec![2, 0]
        );
        r.filled(1);
        assert_eq!(r.readable().count(), 3);
        assert_eq!(r.remove(2).map(|x| x.slab), Some(10));
        assert_eq!(
            r.as_slice().iter().map(|x| x.donor).collect::<Vec<_>>(),
            vec![0, 1]
        );
        assert!(r.remove(2).is_none());
        for d in 3..9 {
            r.push(Replica::new(d, Piece { slab: 0, base: 0 }, false));
        }
        assert_eq!(r.len(), MAX_REPLICAS);
        assert!(!Replicas::empty().has(0) && Replicas::empty().is_empty());
    }
}
