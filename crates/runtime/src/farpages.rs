//! Far-page allocation: far page numbers are handed out densely and reused once freed, so the
//! far address space (and the slabs placed for it) stays as small as the pages stored.

/// The far pages in use.
#[derive(Default)]
pub(crate) struct FarPages {
    free: Vec<u64>,
    next: u64,
}

impl FarPages {
    /// A far page number for a page written back for the first time.
    pub(crate) fn alloc(&mut self) -> u64 {
        self.free.pop().unwrap_or_else(|| {
            self.next += 1;
            self.next - 1
        })
    }

    /// `far` holds nothing any more (its page was released or found all zeros).
    pub(crate) fn free(&mut self, far: u64) {
        self.free.push(far);
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
}
