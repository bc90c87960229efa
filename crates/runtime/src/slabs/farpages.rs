//! Far-page allocation: far page numbers are handed out densely and reused once freed, so the
//! far address space (and the slabs placed for it) stays as small as the pages stored.
//!
//! # Frozen far pages (fork)
//!
//! A forked child of a process tree keeps reading the parent's far pages, from the tier slabs
//! it inherits or on the donors as the parent's client ([`crate::fork`]), so while such a
//! child lives the parent must not change what it reads: the far pages lent at fork are
//! *frozen*. A frozen far page is never written
//! again (the evictor gives a changed page a new far page, [`FarPages::is_frozen`]) and, once
//! its page is released or rewritten, is not reused until [`FarPages::thaw`] (every child that
//! borrowed it has exited or exec'd). A child's own far pages start above every far page it
//! borrowed (the *floor*): those stay frozen for good there.

/// The far pages in use.
#[derive(Default)]
pub(crate) struct FarPages {
    free: Vec<u64>,
    next: u64,
    /// Far pages below this are borrowed from the parent (a forked child): never written,
    /// never reused.
    floor: u64,
    /// Far pages lent to forked children (one bit a far page).
    frozen: Vec<u64>,
    /// Frozen far pages freed meanwhile: reusable after [`FarPages::thaw`].
    deferred: Vec<u64>,
}

impl FarPages {
    /// Far pages for a forked child that borrowed its parent's far pages below `floor`.
    pub(crate) fn above(floor: u64) -> FarPages {
        FarPages {
            next: floor,
            floor,
            ..FarPages::default()
        }
    }

    /// A far page number for a page written back for the first time (never a frozen one).
    pub(crate) fn alloc(&mut self) -> u64 {
        self.free.pop().unwrap_or_else(|| {
            self.next += 1;
            self.next - 1
        })
    }

    /// `far` holds nothing any more (its page was released, found all zeros, or moved to a
    /// new far page because this one is frozen).
    pub(crate) fn free(&mut self, far: u64) {
        if far < self.floor {
            return; // the parent's: not ours to reuse
        }
        if self.is_frozen(far) {
            self.deferred.push(far);
        } else {
            self.free.push(far);
        }
    }

    /// Whether `far` must not be written (a forked child may read it).
    pub(crate) fn is_frozen(&self, far: u64) -> bool {
        if far < self.floor {
            return true;
        }
        let (w, bit) = ((far / 64) as usize, far % 64);
        self.frozen.get(w).is_some_and(|x| x & (1 << bit) != 0)
    }

    /// Whether any far page of far slab `idx` (`slab_pages` pages) is frozen now (the floor
    /// aside).
    pub(crate) fn any_frozen_in_slab(&self, idx: u64, slab_pages: u64) -> bool {
        let first = idx * slab_pages;
        (first..first + slab_pages).any(|f| f >= self.floor && self.is_frozen(f))
    }

    /// Freezes `far` (lent to a child at fork).
    pub(crate) fn freeze(&mut self, far: u64) {
        let w = (far / 64) as usize;
        if self.frozen.len() <= w {
            self.frozen.resize(w + 1, 0);
        }
        self.frozen[w] |= 1 << (far % 64);
    }

    /// Whether any far page is frozen now (the floor aside).
    pub(crate) fn any_frozen(&self) -> bool {
        !self.frozen.is_empty()
    }

    /// No child reads the lent far pages any more: they are ordinary again, and those freed
    /// meanwhile are reused.
    pub(crate) fn thaw(&mut self) {
        self.frozen = Vec::new();
        self.free.append(&mut self.deferred);
    }

    /// Far pages below this are borrowed (0 but in a forked child).
    pub(crate) fn floor(&self) -> u64 {
        self.floor
    }

    /// One past the highest far page number handed out.
    pub(crate) fn end(&self) -> u64 {
        self.next
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_are_dense_and_reused() {
        let mut f = FarPages::default();
        assert_eq!((f.alloc(), f.alloc(), f.alloc()), (0, 1, 2));
        f.free(1);
        assert_eq!((f.alloc(), f.alloc()), (1, 3));
    }

    #[test]
    fn frozen_pages_are_reused_only_after_thaw() {
        let mut f = FarPages::default();
        assert_eq!((f.alloc(), f.alloc(), f.alloc()), (0, 1, 2));
        f.freeze(1);
        f.freeze(200);
        assert!(f.is_frozen(1) && f.is_frozen(200) && !f.is_frozen(0) && !f.is_frozen(2));
        f.free(1);
        f.free(2);
        // 2 is reused at once, 1 is not.
        assert_eq!((f.alloc(), f.alloc()), (2, 3));
        assert!(f.any_frozen());
        f.thaw();
        assert!(!f.any_frozen() && !f.is_frozen(1));
        assert_eq!(f.alloc(), 1);
    }

    #[test]
    fn a_childs_pages_start_above_the_floor_and_never_reuse_the_parents() {
        let mut f = FarPages::above(512);
        assert!(f.is_frozen(0) && f.is_frozen(511) && !f.is_frozen(512));
        assert_eq!(f.alloc(), 512);
        f.free(7); // the parent's: dropped
        f.free(512);
        assert_eq!((f.alloc(), f.alloc()), (512, 513));
        f.thaw();
        assert!(f.is_frozen(7));
        assert_eq!(f.end(), 514);
    }
}
