//! A slab's memory: a sealed memfd whose pages the node allocates itself.
//!
//! # Design
//! - [`make`]: `memfd_create`, `ftruncate` to the slab size, then **fallocate the whole slab**:
//!   shared-memory pages are charged to the memory cgroup of whoever allocates them first, so
//!   the node allocating them keeps the tier's memory in the node's cgroup, never the client's
//!   (a client writing into a hole would be charged for that page). Then sealed against
//!   growing, shrinking and further sealing: a client mapping the slab can rely on its size (a
//!   shrink would turn its accesses into SIGBUS).
//! - [`release`]: punches a hole over the whole slab before the node closes its fd, so the
//!   memory returns to the host even if a misbehaving client kept its mapping (it then reads
//!   zeros).
//! - [`check_received`]: what a client checks of an fd before mapping it.
//!
//! # Limitations
//! A slab is one memfd: a client holding many slabs holds as many mappings.
use std::os::fd::{AsFd, OwnedFd};

use rustix::fs::{
    fallocate, fcntl_add_seals, fcntl_get_seals, fstat, ftruncate, memfd_create, FallocateFlags,
    FileType, MemfdFlags, SealFlags,
};
use rustix::io::Errno;

/// The seals every slab carries.
pub const SLAB_SEALS: SealFlags = SealFlags::GROW
    .union(SealFlags::SHRINK)
    .union(SealFlags::SEAL);

/// Which step of making a slab failed.
#[derive(Debug, thiserror::Error)]
pub enum SlabError {
    /// memfd_create failed.
    #[error("memfd_create failed: {0}")]
    Create(#[source] Errno),
    /// ftruncate failed.
    #[error("sizing the memfd to {len} bytes failed: {source}")]
    Size { len: u64, source: Errno },
    /// fallocate failed: usually the host (or the node's cgroup) is out of memory.
    #[error("allocating {len} bytes for the slab failed (is the host or the node's memory cgroup out of memory?): {source}")]
    Allocate { len: u64, source: Errno },
    /// Adding the seals failed.
    #[error("sealing the memfd failed: {0}")]
    Seal(#[source] Errno),
}

impl SlabError {
    /// True when the failure means the host has no memory for the slab.
    pub fn is_out_of_memory(&self) -> bool {
        matches!(
            self,
            SlabError::Allocate {
                source: Errno::NOMEM | Errno::NOSPC,
                ..
            }
        )
    }
}

/// A new slab of `len` bytes: a sealed memfd whose pages are all allocated (and charged to the
/// calling process's memory cgroup).
pub fn make(len: u64) -> Result<OwnedFd, SlabError> {
    let fd = memfd_create(
        "farmem-tier",
        MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING,
    )
    .map_err(SlabError::Create)?;
    ftruncate(&fd, len).map_err(|source| SlabError::Size { len, source })?;
    fallocate(&fd, FallocateFlags::empty(), 0, len)
        .map_err(|source| SlabError::Allocate { len, source })?;
    fcntl_add_seals(&fd, SLAB_SEALS).map_err(SlabError::Seal)?;
    Ok(fd)
}

/// Returns a slab's pages to the host (a hole over all of it); the caller then closes the fd.
pub fn release(fd: impl AsFd, len: u64) -> Result<(), Errno> {
    fallocate(
        fd,
        FallocateFlags::PUNCH_HOLE | FallocateFlags::KEEP_SIZE,
        0,
        len,
    )
}

/// Checks an fd received as a slab of `len` bytes before it is mapped: a regular file (a memfd)
/// of exactly `len` bytes, sealed so that it can neither shrink nor grow.
pub fn check_received(fd: impl AsFd, len: u64) -> Result<(), String> {
    check_memfd(fd, len, "slab").map(|_| ())
}

/// What slabs and holds share: `fd` (the `what`'s) is a regular file (a memfd) of exactly `len`
/// bytes, sealed against shrinking and growing. Returns its seals for further checks.
pub(crate) fn check_memfd(fd: impl AsFd, len: u64, what: &str) -> Result<SealFlags, String> {
    let st = fstat(&fd).map_err(|e| format!("fstat of the {what}'s fd failed: {e}"))?;
    if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile {
        return Err(format!("the {what}'s fd is not a memfd"));
    }
    if u64::try_from(st.st_size).ok() != Some(len) {
        return Err(format!(
            "the {what}'s memfd holds {} bytes, not the {len} announced",
            st.st_size
        ));
    }
    let seals = fcntl_get_seals(&fd).map_err(|e| format!("reading the {what}'s seals: {e}"))?;
    if !seals.contains(SealFlags::SHRINK | SealFlags::GROW) {
        return Err(format!(
            "the {what}'s memfd is not sealed against shrinking and growing"
        ));
    }
    Ok(seals)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slab_is_sized_allocated_and_sealed() {
        let fd = make(1 << 20).unwrap();
        check_received(&fd, 1 << 20).unwrap();
        // The seals hold: neither grow nor shrink.
        assert_eq!(ftruncate(&fd, 2 << 20), Err(Errno::PERM));
        assert_eq!(ftruncate(&fd, 4096), Err(Errno::PERM));
        // Allocated: st_blocks covers the whole slab.
        assert!(fstat(&fd).unwrap().st_blocks as u64 * 512 >= 1 << 20);
        release(&fd, 1 << 20).unwrap();
        assert_eq!(fstat(&fd).unwrap().st_blocks, 0);
        assert_eq!(fstat(&fd).unwrap().st_size, 1 << 20);
        assert!(check_received(&fd, 2 << 20)
            .unwrap_err()
            .contains("not the"));
    }

    #[test]
    fn an_unsealed_fd_is_refused() {
        let fd = memfd_create("t", MemfdFlags::CLOEXEC).unwrap();
        ftruncate(&fd, 4096).unwrap();
        assert!(check_received(&fd, 4096).unwrap_err().contains("sealed"));
    }
}
