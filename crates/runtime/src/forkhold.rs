//! A fork's lifetime signal for pages lent on donors: how the parent learns that every child
//! that may read them has exited or exec'd.
//!
//! Pages in the host tier are held by the node (the far side's tier, `far/tier.rs`: the node's holds), which also
//! keeps their slabs from being punched. A donor needs no such promise (this runtime never
//! frees a donor slab a child reads, [`crate::threads::migrate`]), but the parent still must know when
//! it may rewrite and reuse the far pages it lent: the same one-page memfd as the node's hold,
//! made here. The parent maps it `MAP_SHARED` read-write right before `fork()` (not
//! `MADV_DONTFORK`: the child inherits the mapping) and unmaps it after; the child keeps it
//! mapped until it exits or execs, whatever descriptors it closes, and so does any descendant.
//! `F_ADD_SEALS(F_SEAL_WRITE)` fails with EBUSY while any process maps it writably
//! ([`farmem_node::hold::probe`], measured on Linux 6.18).
//!
//! One hold serves every fork until it is found dead: each fork maps it again, so it lives as
//! long as any child that may read lent pages. The thaw is all or nothing anyway (every far
//! page frozen is thawed at once), and one memfd costs the program one descriptor however
//! many children it has (a pre-fork server's workers). A probe that finds it dead seals it
//! against writes, so it cannot be mapped again: the next fork makes a new one.

use std::os::fd::{AsFd, AsRawFd, OwnedFd};

use farmem_mm::Mapping;
use farmem_node::hold::{self, Liveness};

/// The hold over the far pages this process's forks lent on donors.
pub(crate) struct ForkHold {
    fd: OwnedFd,
    /// This process's mapping, while forks are being made.
    mapping: Option<Mapping>,
    /// Forks being made now (from several threads at once).
    forks: u32,
}

impl ForkHold {
    /// A new hold, not mapped yet.
    pub(crate) fn new() -> std::io::Result<ForkHold> {
        let fd = farmem_fds::protect(hold::make().map_err(std::io::Error::from)?);
        Ok(ForkHold {
            fd,
            mapping: None,
            forks: 0,
        })
    }

    /// Before a fork: maps the hold here, so the child inherits the mapping.
    pub(crate) fn begin_fork(&mut self) -> std::io::Result<()> {
        if self.mapping.is_none() {
            self.mapping = Some(Mapping::shared(
                self.fd.as_fd(),
                0,
                hold::HOLD_BYTES as usize,
            )?);
        }
        self.forks += 1;
        Ok(())
    }

    /// In the parent, once a fork is done: unmapped here when no other fork is being made;
    /// the hold then lives as long as a child maps it.
    pub(crate) fn end_fork(&mut self) {
        self.forks = self.forks.saturating_sub(1);
        if self.forks == 0 {
            self.mapping = None;
        }
    }

    /// Whether this process (making a fork) or a child still maps it. A probe that fails for
    /// another reason than EBUSY counts as alive (frozen pages kept a little longer, never a
    /// child's pages rewritten under it), and is logged. Once dead, it stays dead.
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

impl Drop for ForkHold {
    fn drop(&mut self) {
        // Closed with the fd: no longer one of farmem's to guard.
        farmem_fds::forget(self.fd.as_raw_fd());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hold_lives_while_any_writable_mapping_of_it_does() {
        let mut h = ForkHold::new().unwrap();
        h.begin_fork().unwrap();
        h.begin_fork().unwrap();
        assert!(h.is_alive());
        // What a child's inherited mapping is to the probe: another writable shared mapping.
        let child = Mapping::shared(h.fd.as_fd(), 0, hold::HOLD_BYTES as usize).unwrap();
        h.end_fork();
        assert!(h.is_alive(), "another fork is still being made");
        h.end_fork();
        assert!(h.is_alive(), "another mapping of it lives");
        drop(child);
        assert!(!h.is_alive(), "nobody maps it any more");
        assert!(!h.is_alive(), "and it stays dead");
        assert!(
            h.begin_fork().is_err(),
            "a dead hold cannot be mapped again"
        );
    }
}
