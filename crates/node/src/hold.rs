//! Holds: a client's promise that processes it forked may still read some of its slabs, so the
//! node must not punch them even after the client FREEs them or goes away.
//!
//! A forked child inherits its parent's slab mappings and may keep reading far pages straight
//! from them. The node cannot see the child, so the parent asks for a hold over the slabs first:
//! a tiny memfd that the parent maps `MAP_SHARED` read-write right before fork and unmaps after
//! it. The child (and every descendant that does not exec) inherits that mapping; it ends at
//! exec and at exit, and survives the child closing all its fds.
//!
//! # Design
//! - **The liveness probe** ([`probe`]): `fcntl(F_ADD_SEALS, F_SEAL_WRITE)` on the hold's memfd
//!   fails with EBUSY while any process maps it writably, and succeeds once none does (measured
//!   on Linux 6.18: survives close-all, ends at exec, kept alive by grandchildren). A success
//!   seals the memfd against writes for good, which is fine: a dead hold stays dead, and adding
//!   the seal again succeeds again. Any other error is read as alive (a hold that cannot be
//!   probed keeps its slabs: losing a child's pages is worse than holding memory).
//! - **Armed**: a hold's memfd is not mapped by anyone between the node making it and the client
//!   mapping it, so the probe would call it dead. The client therefore writes a non-zero byte at
//!   offset 0 once it has mapped it ([`arm`]); the node reads that byte ([`is_armed`]) and treats
//!   an unarmed hold as alive while its client is connected, and as dead once the client is gone
//!   (it never mapped it, so no child can have inherited it).
//! - [`make`]: `memfd_create("farmem-hold", CLOEXEC|ALLOW_SEALING)`, 4096 bytes, allocated by
//!   the node (its cgroup pays for the page, as for slabs), sealed GROW|SHRINK only: F_SEAL_SEAL
//!   would forbid the probe's F_SEAL_WRITE.
//! - `Holds`: the node's table of live holds (owner connection, memfd, slabs named), with the
//!   count of live holds naming each slab; pure bookkeeping, the server probes and acts.
//!
//! # Limitations
//! A client that adds F_SEAL_SEAL to its hold's memfd makes it unprobeable: it is kept alive,
//! pinning the slabs it names (counted against the node's capacity) until the node stops. A
//! hold over slabs shared with a child only protects those slabs from the node; writes by the
//! parent after fork are seen by the child (the pages are shared, not copied).
use std::collections::{HashMap, HashSet};
use std::os::fd::{AsFd, OwnedFd};
use std::sync::Arc;

use rustix::fs::{
    fallocate, fcntl_add_seals, ftruncate, memfd_create, FallocateFlags, MemfdFlags, SealFlags,
};
use rustix::io::Errno;

/// Size of a hold's memfd: one page.
pub const HOLD_BYTES: u64 = 4096;
/// The most live holds one client connection may have at once.
pub const MAX_HOLDS_PER_CLIENT: usize = 1024;
/// The most live holds the connections of one user (uid) may have at once, all together:
/// holds outlive their connection, so a per-connection bound alone let one user reconnect and
/// make holds until the node ran out of file descriptors.
pub const MAX_HOLDS_PER_UID: usize = 1024;
/// The seals the node puts on a hold's memfd (not F_SEAL_SEAL: the probe adds F_SEAL_WRITE).
pub const HOLD_SEALS: SealFlags = SealFlags::GROW.union(SealFlags::SHRINK);

/// What a probe of a hold found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Liveness {
    /// Some process still maps the hold writably (or the probe failed: kept, to be safe).
    Alive,
    /// No process maps it any more; it never will again.
    Dead,
}

/// A new hold's memfd: 4096 bytes, allocated, sealed against growing and shrinking.
pub fn make() -> Result<OwnedFd, Errno> {
    let fd = memfd_create(
        "farmem-hold",
        MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING,
    )?;
    ftruncate(&fd, HOLD_BYTES)?;
    fallocate(&fd, FallocateFlags::empty(), 0, HOLD_BYTES)?;
    fcntl_add_seals(&fd, HOLD_SEALS)?;
    Ok(fd)
}

/// Probes a hold (see the module docs): EBUSY → alive, success → dead, any other error →
/// alive, with the error for the caller to log.
pub fn probe(fd: impl AsFd) -> (Liveness, Option<Errno>) {
    match fcntl_add_seals(fd, SealFlags::WRITE) {
        Ok(()) => (Liveness::Dead, None),
        Err(Errno::BUSY) => (Liveness::Alive, None),
        Err(e) => (Liveness::Alive, Some(e)),
    }
}

/// Marks a hold as mapped by its client (a non-zero byte at offset 0).
pub fn arm(fd: impl AsFd) -> Result<(), Errno> {
    match rustix::io::pwrite(fd, &[1], 0)? {
        1 => Ok(()),
        _ => Err(Errno::IO),
    }
}

/// True once the client has [`arm`]ed the hold. A read error counts as armed, so the probe
/// decides (it keeps the hold alive on errors too).
pub fn is_armed(fd: impl AsFd) -> bool {
    let mut b = [0u8; 1];
    match rustix::io::pread(fd, &mut b, 0) {
        Ok(1) => b[0] != 0,
        Ok(_) => false,
        Err(_) => true,
    }
}

/// Checks an fd received as a hold before it is mapped: a memfd of [`HOLD_BYTES`], sealed
/// against shrinking and growing, not sealed against writes (that one is dead already).
pub fn check_received(fd: impl AsFd) -> Result<(), String> {
    let seals = crate::slab::check_memfd(fd, HOLD_BYTES, "hold")?;
    if seals.intersects(SealFlags::WRITE | SealFlags::SEAL) {
        return Err("the hold's memfd is sealed against writes or seals: it cannot hold".into());
    }
    Ok(())
}

/// One live hold.
pub(crate) struct Hold {
    /// The connection that made it (it outlives that connection).
    pub owner: u64,
    /// The user (SO_PEERCRED uid) of that connection.
    pub uid: u32,
    /// The node's fd of the memfd (shared with the probe, which runs outside the state lock).
    pub fd: Arc<OwnedFd>,
    /// Set once the client armed it (never unset).
    pub armed: bool,
    slabs: HashSet<u32>,
}

/// Why a HOLD that adds slabs was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AddError {
    /// No live hold has that id, or it is another connection's.
    NotYours,
}

/// The node's live holds.
#[derive(Default)]
pub(crate) struct Holds {
    holds: HashMap<u32, Hold>,
    /// For each slab, how many live holds name it.
    named: HashMap<u32, u32>,
    next: u32,
}

impl Holds {
    /// A new hold by connection `owner` of user `uid` over `slabs` (ids the caller checked);
    /// its id (never 0).
    pub fn create(&mut self, owner: u64, uid: u32, fd: Arc<OwnedFd>, slabs: &[u32]) -> u32 {
        let id = loop {
            self.next = self.next.wrapping_add(1).max(1);
            if !self.holds.contains_key(&self.next) {
                break self.next;
            }
        };
        self.holds.insert(
            id,
            Hold {
                owner,
                uid,
                fd,
                armed: false,
                slabs: HashSet::new(),
            },
        );
        let _ = self.add(owner, id, slabs);
        id
    }

    /// Adds `slabs` to hold `id` of connection `owner` (a slab it names already stays named once).
    pub fn add(&mut self, owner: u64, id: u32, slabs: &[u32]) -> Result<(), AddError> {
        let hold = match self.holds.get_mut(&id) {
            Some(h) if h.owner == owner => h,
            _ => return Err(AddError::NotYours),
        };
        for &s in slabs {
            if hold.slabs.insert(s) {
                *self.named.entry(s).or_insert(0) += 1;
            }
        }
        Ok(())
    }

    /// True while a live hold names `slab`.
    pub fn is_held(&self, slab: u32) -> bool {
        self.named.contains_key(&slab)
    }

    /// Live holds made by connection `owner`.
    pub fn count_of(&self, owner: u64) -> usize {
        self.holds.values().filter(|h| h.owner == owner).count()
    }

    /// Live holds made by the connections of user `uid`.
    pub fn count_of_uid(&self, uid: u32) -> usize {
        self.holds.values().filter(|h| h.uid == uid).count()
    }

    /// Live holds in all.
    pub fn len(&self) -> usize {
        self.holds.len()
    }

    /// Slabs named by at least one live hold.
    pub fn held_slabs(&self) -> usize {
        self.named.len()
    }

    /// Every live hold, by id.
    pub fn iter(&self) -> impl Iterator<Item = (u32, &Hold)> {
        self.holds.iter().map(|(id, h)| (*id, h))
    }

    /// Records that hold `id` was seen armed.
    pub fn set_armed(&mut self, id: u32) {
        if let Some(h) = self.holds.get_mut(&id) {
            h.armed = true;
        }
    }

    /// Forgets a dead hold; returns the slabs no live hold names any more.
    pub fn remove(&mut self, id: u32) -> Vec<u32> {
        let Some(hold) = self.holds.remove(&id) else {
            return Vec::new();
        };
        let mut unheld = Vec::new();
        for s in hold.slabs {
            if let Some(n) = self.named.get_mut(&s) {
                *n -= 1;
                if *n == 0 {
                    self.named.remove(&s);
                    unheld.push(s);
                }
            }
        }
        unheld
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use farmem_mm::Mapping;

    #[test]
    fn a_hold_is_alive_while_mapped_writably_and_dead_for_good_after() {
        let fd = make().unwrap();
        check_received(&fd).unwrap();
        assert!(!is_armed(&fd));
        let m = Mapping::shared(fd.as_fd(), 0, HOLD_BYTES as usize).unwrap();
        arm(&fd).unwrap();
        assert!(is_armed(&fd));
        assert_eq!(probe(&fd), (Liveness::Alive, None));
        assert_eq!(
            probe(&fd),
            (Liveness::Alive, None),
            "a probe changes nothing"
        );
        drop(m);
        assert_eq!(probe(&fd), (Liveness::Dead, None));
        assert_eq!(probe(&fd), (Liveness::Dead, None), "dead stays dead");
        assert!(check_received(&fd)
            .unwrap_err()
            .contains("sealed against writes"));
        // A dead hold cannot be brought back: a writable shared mapping is refused.
        assert!(Mapping::shared(fd.as_fd(), 0, HOLD_BYTES as usize).is_err());
    }

    #[test]
    fn a_hold_sealed_against_sealing_is_kept_alive_and_says_why() {
        let fd = make().unwrap();
        fcntl_add_seals(&fd, SealFlags::SEAL).unwrap();
        assert_eq!(probe(&fd), (Liveness::Alive, Some(Errno::PERM)));
        assert!(check_received(&fd).is_err());
    }

    #[test]
    fn the_table_counts_each_slab_once_per_live_hold() {
        let fd = || Arc::new(make().unwrap());
        let mut h = Holds::default();
        let a = h.create(1, 500, fd(), &[10, 11]);
        let b = h.create(1, 500, fd(), &[11]);
        let c = h.create(3, 500, fd(), &[11]);
        let d = h.create(4, 501, fd(), &[11]);
        assert_eq!((h.count_of_uid(500), h.count_of_uid(501)), (3, 1));
        assert!(h.remove(c).is_empty() && h.remove(d).is_empty());
        assert_ne!(a, b);
        assert_eq!(h.add(2, a, &[12]), Err(AddError::NotYours), "not its hold");
        assert_eq!(
            h.add(1, 999, &[12]),
            Err(AddError::NotYours),
            "no such hold"
        );
        h.add(1, a, &[11, 12]).unwrap();
        assert_eq!(
            (h.len(), h.held_slabs(), h.count_of(1), h.count_of(2)),
            (2, 3, 2, 0)
        );
        let mut unheld = h.remove(a);
        unheld.sort_unstable();
        assert_eq!(unheld, vec![10, 12], "11 is still named by the other hold");
        assert!(h.is_held(11) && !h.is_held(10));
        assert_eq!(h.remove(b), vec![11]);
        assert_eq!(h.remove(b), Vec::<u32>::new());
        assert_eq!(h.len(), 0);
    }
}
