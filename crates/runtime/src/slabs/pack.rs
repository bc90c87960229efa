//! Far slabs packed into donor slabs: a donor's slab holds as many far slabs as fit in it.
//!
//! The far slab size is the smallest slab any home hands out (the host tier's 4 MiB beside
//! donors' 64 MiB, or donors of different slab sizes). Given a whole donor slab each, far
//! slabs used a sixteenth of what the donors lent: three donors of 1 GiB were "full" after
//! about 200 MiB of pages, and the budget then broke. So each donor's slabs are cut into
//! *pieces* of one far slab, and a far slab's copy on a donor is a piece ([`Piece`]): the
//! donor slab and the first page of the piece in it.
//!
//! # Design
//!
//! - One [`Pack`] per donor connection, behind its own lock (taken on placement, release and
//!   reclaim only, never on the fault path: a fault reads the piece from the far slab's home).
//! - [`Pack::take`] hands out a free piece of a donor slab already held, the fullest first so
//!   donor slabs fill before new ones are taken; only when none has room is a new donor slab
//!   allocated.
//! - [`Pack::release`] gives a piece back; a donor slab whose pieces are all free is returned
//!   to the caller to free on the donor, so a donor's committed memory follows what is used.
//! - A donor declared dead may come back restarted, its slabs gone or handed to others:
//!   [`Pack::close_all`] stops new pieces being cut from the slabs held then. A donor that
//!   asks for a slab back has the whole of it ([`Pack::take_back`]): every far slab on it moves.

use std::collections::HashMap;

/// Where one copy of a far slab lives on a donor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Piece {
    /// The donor's slab id.
    pub(crate) slab: u32,
    /// The first page of the piece in that slab.
    pub(crate) base: u32,
}

/// One donor slab: which of its pieces are used.
struct Held {
    used: Vec<bool>,
    in_use: usize,
    /// No new piece is cut from it (its donor died, or asked for it back).
    closed: bool,
}

/// The donor slabs of one donor and their pieces.
pub(crate) struct Pack {
    /// Far slab pages per piece.
    piece_pages: u32,
    /// Pieces per donor slab (at least one).
    pieces: usize,
    held: HashMap<u32, Held>,
}

impl Pack {
    /// A pack for a donor whose slabs are `donor_slab_pages` pages, cut into far slabs of
    /// `far_slab_pages` (the far slab size is the smallest of every home's, so at least one
    /// piece fits).
    pub(crate) fn new(donor_slab_pages: u64, far_slab_pages: u64) -> Pack {
        let far_slab_pages = far_slab_pages.max(1);
        Pack {
            piece_pages: u32::try_from(far_slab_pages).unwrap_or(u32::MAX),
            pieces: usize::try_from((donor_slab_pages / far_slab_pages).max(1)).unwrap_or(1),
            held: HashMap::new(),
        }
    }

    /// A free piece of a donor slab already held (the fullest open one), or one of a new donor
    /// slab from `alloc`.
    pub(crate) fn take<E>(&mut self, alloc: impl FnOnce() -> Result<u32, E>) -> Result<Piece, E> {
        let fullest = self
            .held
            .iter()
            .filter(|(_, h)| !h.closed && h.in_use < self.pieces)
            .max_by_key(|(slab, h)| (h.in_use, std::cmp::Reverse(**slab)))
            .map(|(slab, _)| *slab);
        let slab = match fullest {
            Some(s) => s,
            None => {
                let s = alloc()?;
                self.held.insert(
                    s,
                    Held {
                        used: vec![false; self.pieces],
                        in_use: 0,
                        closed: false,
                    },
                );
                s
            }
        };
        let h = self.held.get_mut(&slab).expect("held above");
        let i = h.used.iter().position(|u| !u).expect("has room");
        h.used[i] = true;
        h.in_use += 1;
        Ok(Piece {
            slab,
            base: i as u32 * self.piece_pages,
        })
    }

    /// Gives `p` back. Returns its donor slab when that slab is now unused, for the caller to
    /// free on the donor (also when the slab is not known here: a copy made before this pack
    /// knew it, freed as a whole as before).
    pub(crate) fn release(&mut self, p: Piece) -> Option<u32> {
        let Some(h) = self.held.get_mut(&p.slab) else {
            return Some(p.slab);
        };
        let i = (p.base / self.piece_pages.max(1)) as usize;
        if h.used.get(i).copied() == Some(true) {
            h.used[i] = false;
            h.in_use -= 1;
        }
        if h.in_use == 0 {
            self.held.remove(&p.slab);
            Some(p.slab)
        } else {
            None
        }
    }

    /// No new piece is cut from the donor slabs held now (their donor was declared dead: if
    /// it comes back restarted, those ids mean nothing, or another client's slabs).
    pub(crate) fn close_all(&mut self) {
        for h in self.held.values_mut() {
            h.closed = true;
        }
    }

    /// Closes donor slab `slab` (its donor asked for it back) and returns how many of its
    /// pieces are still used; once every far slab on it has moved, [`Pack::forget`] it.
    pub(crate) fn close(&mut self, slab: u32) -> usize {
        self.held.get_mut(&slab).map_or(0, |h| {
            h.closed = true;
            h.in_use
        })
    }

    /// Forgets every donor slab (their donor restarted: they are gone there).
    pub(crate) fn forget_all(&mut self) {
        self.held.clear();
    }

    /// Forgets donor slab `slab` (freed on the donor by the caller).
    pub(crate) fn forget(&mut self, slab: u32) {
        self.held.remove(&slab);
    }

    /// Donor slabs held, and pieces used in them: what this runtime takes of the donor
    /// against what it fills.
    pub(crate) fn usage(&self) -> (usize, usize) {
        (
            self.held.len(),
            self.held.values().map(|h| h.in_use).sum::<usize>(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counter() -> impl FnMut() -> Result<u32, ()> {
        let mut next = 100;
        move || {
            next += 1;
            Ok(next)
        }
    }

    #[test]
    fn pieces_fill_a_donor_slab_before_a_new_one_is_taken() {
        // 64 MiB donor slabs, 4 MiB far slabs: 16 pieces each.
        let mut p = Pack::new(16384, 1024);
        assert_eq!(p.pieces, 16);
        let mut alloc = counter();
        let got: Vec<Piece> = (0..17).map(|_| p.take(&mut alloc).unwrap()).collect();
        assert!(got[..16].iter().all(|x| x.slab == 101));
        let mut bases: Vec<u32> = got[..16].iter().map(|x| x.base).collect();
        bases.sort_unstable();
        assert_eq!(bases, (0..16).map(|i| i * 1024).collect::<Vec<_>>());
        assert_eq!(got[16], Piece { slab: 102, base: 0 });
        assert_eq!(p.usage(), (2, 17));
    }

    #[test]
    fn a_released_piece_is_reused_and_an_empty_slab_is_handed_back() {
        let mut p = Pack::new(4096, 1024);
        let mut alloc = counter();
        let a = p.take(&mut alloc).unwrap();
        let b = p.take(&mut alloc).unwrap();
        assert_eq!(p.release(a), None, "b still uses the slab");
        assert_eq!(p.take(&mut alloc).unwrap(), a, "the freed piece is reused");
        assert_eq!(p.release(a), None);
        assert_eq!(p.release(b), Some(101), "now empty: free it on the donor");
        assert_eq!(p.usage(), (0, 0));
        // A piece of a slab not known here (made before): freed as a whole.
        assert_eq!(p.release(Piece { slab: 7, base: 0 }), Some(7));
    }

    #[test]
    fn closed_slabs_cut_no_new_pieces() {
        let mut p = Pack::new(4096, 1024);
        let mut alloc = counter();
        let a = p.take(&mut alloc).unwrap();
        p.close_all();
        let b = p.take(&mut alloc).unwrap();
        assert_ne!(a.slab, b.slab, "a dead donor's old slab is not cut again");
        assert_eq!(p.close(b.slab), 1);
        let c = p.take(&mut alloc).unwrap();
        assert_ne!(c.slab, b.slab);
        p.forget(b.slab);
        assert_eq!(p.usage(), (2, 2));
    }

    #[test]
    fn a_failed_allocation_takes_nothing() {
        let mut p = Pack::new(4096, 1024);
        assert_eq!(p.take(|| Err::<u32, _>("full")), Err("full"));
        assert_eq!(p.usage(), (0, 0));
    }

    #[test]
    fn equal_slab_sizes_give_one_piece_per_slab() {
        let mut p = Pack::new(1024, 1024);
        let mut alloc = counter();
        let a = p.take(&mut alloc).unwrap();
        let b = p.take(&mut alloc).unwrap();
        assert_eq!((a.base, b.base), (0, 0));
        assert_ne!(a.slab, b.slab);
    }
}
