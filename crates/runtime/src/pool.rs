//! Returning the memory of write-back pool slots to the system, in batches.
//!
//! Every `MADV_DONTNEED` on a slot flushes the TLB of every CPU this process runs on: an IPI,
//! which on a virtual machine is a trip through the hypervisor. A perf profile of a sequential
//! scan had the fault thread and the evictor spend a large share of their time there (one
//! discard per pool hit and per reclaimed slot). Freed slots that still hold a page are
//! therefore kept aside (`State::pool_stale`) and discarded together when a slot is needed:
//! one `process_madvise(2)` over all of them, which the kernel serves with one TLB flush
//! (measured here with a second thread running: 64 scattered single-page `madvise` calls made
//! 62–64 TLB shootdowns, one `process_madvise` over the same pages 1). Where it cannot
//! be used (older kernels refuse `MADV_DONTNEED` through it), contiguous runs fall back to
//! one `madvise` each.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use crate::PAGE_SIZE;

/// Most ranges in one process_madvise call (the kernel's UIO_MAXIOV).
const MAX_IOV: usize = 1024;

/// A pidfd for this process, for process_madvise; `None` if the kernel has no pidfd_open.
pub(crate) fn self_pidfd() -> Option<OwnedFd> {
    // SAFETY: pidfd_open takes a pid and flags and returns a new fd or -1; no memory is passed.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, libc::getpid(), 0) };
    if fd < 0 {
        return None;
    }
    // SAFETY: `fd` is a fresh descriptor this process owns; wrapping it closes it on drop.
    Some(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// Discards the pages of `slots` (indices into the pool mapping at `pool_base`). Sorts them.
pub(crate) fn discard_slots(pool_base: usize, slots: &mut [u32], pidfd: Option<&OwnedFd>) {
    slots.sort_unstable();
    // Coalesce contiguous slots into ranges.
    let mut ranges: Vec<libc::iovec> = Vec::with_capacity(slots.len());
    for &s in slots.iter() {
        let addr = pool_base + s as usize * PAGE_SIZE;
        match ranges.last_mut() {
            Some(r) if r.iov_base as usize + r.iov_len == addr => r.iov_len += PAGE_SIZE,
            _ => ranges.push(libc::iovec {
                iov_base: addr as *mut libc::c_void,
                iov_len: PAGE_SIZE,
            }),
        }
    }
    for chunk in ranges.chunks(MAX_IOV) {
        let total: usize = chunk.iter().map(|r| r.iov_len).sum();
        let done = pidfd.map_or(-1, |fd| {
            // SAFETY: `chunk` is a valid array of iovecs naming pool pages this runtime owns;
            // the kernel only reads it. DONTNEED drops the slots' pages, which is the intent:
            // no reference points into the pool.
            unsafe {
                libc::syscall(
                    libc::SYS_process_madvise,
                    fd.as_raw_fd(),
                    chunk.as_ptr(),
                    chunk.len(),
                    libc::MADV_DONTNEED,
                    0,
                )
            }
        });
        if done == total as i64 {
            continue;
        }
        for r in chunk {
            // SAFETY: as above, one range of pool pages; a range already discarded by a
            // partial process_madvise is discarded again harmlessly.
            unsafe {
                libc::madvise(r.iov_base, r.iov_len, libc::MADV_DONTNEED);
            }
        }
    }
}
