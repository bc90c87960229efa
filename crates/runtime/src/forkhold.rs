//! A fork's lifetime signal for pages lent on donors: how the parent learns that every child
//! that may read them has exited or exec'd.
//!
//! Pages in the host tier are held by the node ([`crate::tier`]: the node's holds), which also
//! keeps their slabs from being punched. A donor needs no such promise (this runtime never
//! frees a donor slab a child reads, [`crate::migrate`]), but the parent still must know when
//! it may rewrite and reuse the far pages it lent: the same one-page memfd as the node's hold,
//! made here. The parent maps it `MAP_SHARED` read-write right before `fork()` (not
//! `MADV_DONTFORK`: the child inherits the mapping) and unmaps it after; the child keeps it
//! mapped until it exits or execs, whatever descriptors it closes, and so does any descendant.
//! `F_ADD_SEALS(F_SEAL_WRITE)` fails with EBUSY while any process maps it writably
//! ([`farmem_node::hold::probe`], measured on Linux 6.18).

use std::os::fd::{AsFd, OwnedFd};

use farmem_mm::Mapping;
use farmem_node::hold::{self, Liveness};

/// Most fork holds for donor pages alive at once; a fork beyond it brings its donor pages
/// back instead (as the node bounds its holds per client).
pub(crate) const MAX_FORK_HOLDS: usize = 1024;

/// One fork's hold over the far pages it lent on donors.
pub(crate) struct ForkHold {
    /// Which fork it was taken for ([`crate::ForkPlan`]).
    pub(crate) id: u64,
    fd: OwnedFd,
    /// This process's mapping, until the fork is done.
    mapping: Option<Mapping>,
}

impl ForkHold {
    /// A new hold, mapped here (to be inherited by the child).
    pub(crate) fn new(id: u64) -> std::io::Result<ForkHold> {
        let fd = farmem_fds::protect(hold::make().map_err(std::io::Error::from)?);
        let mapping = Mapping::shared(fd.as_fd(), 0, hold::HOLD_BYTES as usize)?;
        Ok(ForkHold {
            id,
            fd,
            mapping: Some(mapping),
        })
    }

    /// In the parent, once the fork is done: the hold now lives as long as a child maps it.
    pub(crate) fn unmap(&mut self) {
        self.mapping = None;
    }

    /// Whether this process or a child still maps it. A probe that fails for another reason
    /// than EBUSY counts as alive (frozen pages kept a little longer, never a child's pages
    /// rewritten under it), and is logged.
    pub(crate) fn is_alive(&self) -> bool {
        if self.mapping.is_some() {
            return true;
        }
        match hold::probe(&self.fd) {
            (Liveness::Dead, _) => false,
            (Liveness::Alive, None) => true,
            (Liveness::Alive, Some(e)) => {
                tracing::warn!("cannot probe a fork's hold ({e}); taking it as alive");
                true
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hold_lives_while_any_writable_mapping_of_it_does() {
        let mut h = ForkHold::new(1).unwrap();
        assert!(h.is_alive());
        // What a child's inherited mapping is to the probe: another writable shared mapping.
        let child = Mapping::shared(h.fd.as_fd(), 0, hold::HOLD_BYTES as usize).unwrap();
        h.unmap();
        assert!(h.is_alive(), "another mapping of it lives");
        drop(child);
        assert!(!h.is_alive(), "nobody maps it any more");
        assert!(!h.is_alive(), "and it stays dead");
    }
}
