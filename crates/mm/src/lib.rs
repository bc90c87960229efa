//! farmem-mm: memory mappings and the system calls farmem makes on them.
//!
//! A [`Mapping`] is an `mmap`'d range owned by one value and unmapped when it is dropped:
//! anonymous private memory (the runtime's write-back pool and regions, the donor's slabs) or
//! a shared mapping of a file descriptor (memfd slabs of the host tier). Around it: `mincore`
//! ([`mincore`]), batched discard of many ranges with one `process_madvise(2)`
//! ([`Mapping::discard_pages`]), `MADV_DONTNEED` with its error reported, and the other
//! `madvise` advice farmem uses.
//!
//! It is its own crate (rather than a module of the runtime) so that the donor can map its
//! slabs with it without depending on the runtime.
//!
//! # Design
//!
//! - A `Mapping` never hands out Rust references into its memory: callers get its address and
//!   move bytes with system calls (readv, sendmsg, userfaultfd ioctls) or through their own
//!   fenced `unsafe`. So the kernel changing the pages under it (MOVE, DONTNEED, a client's
//!   write) aliases nothing, and every method here that changes the mapping's pages is safe.
//! - Operations on memory the caller does not own as a `Mapping` (a program's region pages)
//!   are `unsafe fn`s in [`raw`]: the caller vouches that no Rust reference relies on the
//!   pages' contents.
//! - Discarding a page (`MADV_DONTNEED`) flushes the TLB of every CPU the process runs on: an
//!   IPI, which on a virtual machine is a trip through the hypervisor.
//!   [`Mapping::discard_pages`] discards many scattered pages with one `process_madvise(2)`,
//!   which the kernel serves with one TLB flush (measured: 64 scattered single-page `madvise`
//!   calls made 62–64 TLB shootdowns, one `process_madvise` over the same pages 1). Where it
//!   cannot be used (no pidfd, older kernels refusing `MADV_DONTNEED` through it), contiguous
//!   runs fall back to one `madvise` each.
//!
//! # Limitations
//!
//! - Advice failures that only make memory accounting coarser (`MADV_NOHUGEPAGE`,
//!   `MADV_DONTFORK`) are ignored, as before this crate existed.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::ptr::NonNull;

/// The page size farmem manages.
pub const PAGE_SIZE: usize = 4096;

/// Most ranges in one process_madvise call (the kernel's UIO_MAXIOV).
const MAX_IOV: usize = 1024;

/// Advice farmem gives about a whole mapping.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Advice {
    /// Back it with 4 KiB pages only (`MADV_NOHUGEPAGE`): writing one page commits 4 KiB.
    NoHugePage,
    /// A forked child does not inherit it (`MADV_DONTFORK`).
    DontFork,
    /// A forked child inherits it again (`MADV_DOFORK`): a tier slab lent to a child.
    DoFork,
}

impl Advice {
    fn raw(self) -> libc::c_int {
        match self {
            Advice::NoHugePage => libc::MADV_NOHUGEPAGE,
            Advice::DontFork => libc::MADV_DONTFORK,
            Advice::DoFork => libc::MADV_DOFORK,
        }
    }
}

/// An `mmap`'d range, unmapped on drop.
#[derive(Debug)]
pub struct Mapping {
    base: NonNull<u8>,
    len: usize,
}

// SAFETY: a `Mapping` owns its range exclusively and never hands out references into it (bytes
// are only touched by the kernel, or by callers through their own fenced `unsafe`); the range
// is process-wide and stays valid until `Drop`, so moving or sharing the handle is sound.
unsafe impl Send for Mapping {}
// SAFETY: see `Send`; the `&self` methods only pass the range to the kernel.
unsafe impl Sync for Mapping {}

fn check_len(len: usize) -> io::Result<()> {
    if len == 0 || !len.is_multiple_of(PAGE_SIZE) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("a mapping of {len} bytes is not a non-zero multiple of {PAGE_SIZE}"),
        ));
    }
    Ok(())
}

impl Mapping {
    /// Maps `len` bytes (a non-zero multiple of [`PAGE_SIZE`]) of private anonymous memory,
    /// reserved but not committed (`MAP_NORESERVE`): a page costs memory only once written.
    pub fn anonymous(len: usize) -> io::Result<Mapping> {
        check_len(len)?;
        let flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE;
        Self::map(len, flags, -1, 0)
    }

    /// Maps `len` bytes of `fd` from `offset` (`MAP_SHARED`): every process mapping the same
    /// file (a memfd slab) sees the same pages. The mapping stays valid after `fd` is closed.
    pub fn shared(fd: BorrowedFd<'_>, offset: u64, len: usize) -> io::Result<Mapping> {
        check_len(len)?;
        let offset = libc::off_t::try_from(offset).map_err(|_| {
            io::Error::new(io::ErrorKind::InvalidInput, "mapping offset out of range")
        })?;
        Self::map(len, libc::MAP_SHARED, fd.as_raw_fd(), offset)
    }

    /// Takes ownership of `addr..addr + len`, a mapping this process already has (a forked
    /// child's copy of a shared slab its parent mapped): unmapped when the result is dropped.
    ///
    /// # Safety
    ///
    /// The range must be mapped, and nothing else may unmap it or rely on it staying mapped
    /// (in a forked child: the parent's copy of its owner is never dropped there).
    pub unsafe fn adopt(addr: usize, len: usize) -> io::Result<Mapping> {
        check_len(len)?;
        let base = NonNull::new(addr as *mut u8)
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "null mapping"))?;
        Ok(Mapping { base, len })
    }

    fn map(
        len: usize,
        flags: libc::c_int,
        fd: libc::c_int,
        offset: libc::off_t,
    ) -> io::Result<Mapping> {
        // SAFETY: a fresh mapping at an address of the kernel's choosing (no MAP_FIXED), so it
        // cannot overlap any existing Rust object; the arguments are valid by construction and
        // an invalid `fd` only makes mmap fail.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                flags,
                fd,
                offset,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let base =
            NonNull::new(ptr.cast::<u8>()).ok_or_else(|| io::Error::other("mmap gave null"))?;
        Ok(Mapping { base, len })
    }

    /// First byte of the mapping.
    pub fn addr(&self) -> usize {
        self.base.as_ptr() as usize
    }

    /// Pointer to the first byte (for system calls that take one).
    pub fn as_ptr(&self) -> *mut u8 {
        self.base.as_ptr()
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the mapping is empty (never: mappings have at least one page).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Pages in the mapping.
    pub fn pages(&self) -> usize {
        self.len / PAGE_SIZE
    }

    /// Gives `advice` about the whole mapping. Failure is ignored: it only makes memory
    /// accounting coarser (see the crate docs).
    pub fn advise(&self, advice: Advice) {
        // SAFETY: the range is this mapping, still mapped; these advice values only change how
        // the kernel backs it or whether a child inherits it, never its contents.
        let _ = unsafe { libc::madvise(self.base.as_ptr().cast(), self.len, advice.raw()) };
    }

    /// Discards the pages at `pages` (page indexes into the mapping, sorted here): they read
    /// as zeros (anonymous) or the file's contents again, and their memory is returned.
    /// One `process_madvise` over all of them when `pidfd` (this process's, from
    /// [`self_pidfd`]) is given and the kernel takes it; else one `madvise` per contiguous run.
    pub fn discard_pages(&self, pages: &mut [u32], pidfd: Option<&OwnedFd>) {
        pages.sort_unstable();
        let mut ranges: Vec<libc::iovec> = Vec::with_capacity(pages.len());
        for &p in pages.iter() {
            assert!((p as usize) < self.pages(), "page {p} outside the mapping");
            let addr = self.addr() + p as usize * PAGE_SIZE;
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
                // SAFETY: `chunk` is a valid array of iovecs naming pages of this mapping (checked
                // above); the kernel only reads it. DONTNEED drops those pages, which is the
                // intent: no Rust reference points into a `Mapping`.
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
                // SAFETY: as above, one range of this mapping; a range already discarded by a
                // partial process_madvise is discarded again harmlessly.
                unsafe {
                    libc::madvise(r.iov_base, r.iov_len, libc::MADV_DONTNEED);
                }
            }
        }
    }

    /// Which of the pages `first..first + present.len()` are in memory: one byte each into
    /// `present`, bit 0 set when present.
    pub fn mincore(&self, first: usize, present: &mut [u8]) -> io::Result<()> {
        assert!(
            first + present.len() <= self.pages(),
            "pages outside the mapping"
        );
        mincore(self.addr() + first * PAGE_SIZE, present)
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: `base..base+len` is the range mapped in `map`, still mapped (dropped once),
        // and no reference into it exists (a `Mapping` never hands any out).
        let rc = unsafe { libc::munmap(self.base.as_ptr().cast(), self.len) };
        if rc != 0 {
            // Only a bug can get here (the range was ours); the memory stays mapped.
            eprintln!(
                "farmem: munmap of a {}-byte mapping failed: {}",
                self.len,
                io::Error::last_os_error()
            );
        }
    }
}

/// Which pages of `addr..addr + present.len() * PAGE_SIZE` (page-aligned) are in memory: one
/// byte each into `present`, bit 0 set when present. Fails (ENOMEM) when part of the range is
/// not mapped. Only inspects page tables: it never faults and never reads the memory.
pub fn mincore(addr: usize, present: &mut [u8]) -> io::Result<()> {
    // SAFETY: mincore writes one byte per page of the range into `present`, which has exactly
    // that many; it only inspects the page tables (any address is safe to ask about).
    let rc = unsafe {
        libc::mincore(
            addr as *mut libc::c_void,
            present.len() * PAGE_SIZE,
            present.as_mut_ptr(),
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// A pidfd for this process (for [`Mapping::discard_pages`]); `None` if the kernel has no
/// `pidfd_open`.
pub fn self_pidfd() -> Option<OwnedFd> {
    // SAFETY: pidfd_open takes a pid and flags and returns a new fd or -1; no memory is passed.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, libc::getpid(), 0) };
    if fd < 0 {
        return None;
    }
    // SAFETY: `fd` is a fresh descriptor this process owns; wrapping it closes it on drop.
    Some(farmem_fds::protect(unsafe {
        OwnedFd::from_raw_fd(fd as i32)
    }))
}

/// Operations on memory that is not a [`Mapping`] (a program's pages).
pub mod raw {
    use std::io;

    use super::Advice;

    /// Drops the pages of `addr..addr + len` (`MADV_DONTNEED`): private anonymous memory reads
    /// zeros (or faults, if registered with a userfaultfd) afterwards. Failure is ignored.
    ///
    /// # Safety
    ///
    /// The range must be memory the caller manages whose contents it no longer needs (or has a
    /// copy of); no Rust reference may point into it.
    pub unsafe fn discard(addr: usize, len: usize) {
        // SAFETY: the caller's promise.
        let _ = unsafe { libc::madvise(addr as *mut libc::c_void, len, libc::MADV_DONTNEED) };
    }

    /// Drops the pages of `addr..addr + len` (`MADV_DONTNEED`), like [`discard`], but reports
    /// failure (the range unmapped, or locked).
    ///
    /// # Safety
    ///
    /// As for [`discard`].
    pub unsafe fn dont_need(addr: usize, len: usize) -> io::Result<()> {
        // SAFETY: the caller's promise.
        let r = unsafe { libc::madvise(addr as *mut libc::c_void, len, libc::MADV_DONTNEED) };
        if r == 0 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        }
    }

    /// Copies one page from `src` to `dst` (both page-aligned).
    ///
    /// # Safety
    ///
    /// Both pages must be mapped, `src` readable and `dst` writable, and no Rust reference may
    /// point into `dst`; the pages must not overlap.
    pub unsafe fn copy_page(dst: usize, src: usize) {
        // SAFETY: the caller's promise: two distinct mapped pages.
        unsafe {
            std::ptr::copy_nonoverlapping(src as *const u8, dst as *mut u8, crate::PAGE_SIZE)
        };
    }

    /// Gives `advice` about `addr..addr + len`. Failure (e.g. the range is not mapped) is
    /// ignored, as for [`super::Mapping::advise`].
    ///
    /// # Safety
    ///
    /// The range must be memory the caller manages; the advice changes only how the kernel
    /// backs it or whether a child inherits it.
    pub unsafe fn advise(addr: usize, len: usize, advice: Advice) {
        // SAFETY: the caller's promise; the advice never changes the contents.
        let _ = unsafe { libc::madvise(addr as *mut libc::c_void, len, advice.raw()) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::fd::AsFd;

    /// Reads byte `off` of `m` (the tests' own fenced access).
    fn byte(m: &Mapping, off: usize) -> u8 {
        assert!(off < m.len());
        // SAFETY: inside the mapping; no reference is kept.
        unsafe { std::ptr::read_volatile(m.as_ptr().add(off)) }
    }

    fn set(m: &Mapping, off: usize, v: u8) {
        assert!(off < m.len());
        // SAFETY: inside the mapping, writable; no reference is kept.
        unsafe { std::ptr::write_volatile(m.as_ptr().add(off), v) }
    }

    #[test]
    fn anonymous_pages_read_zero_and_discard_returns_them() {
        let m = Mapping::anonymous(8 * PAGE_SIZE).unwrap();
        m.advise(Advice::NoHugePage);
        assert_eq!(m.pages(), 8);
        let mut present = [0u8; 8];
        m.mincore(0, &mut present).unwrap();
        assert!(present.iter().all(|p| p & 1 == 0), "{present:?}");
        for p in [1, 2, 5] {
            set(&m, p * PAGE_SIZE, 7);
        }
        m.mincore(0, &mut present).unwrap();
        assert_eq!(present.map(|p| p & 1), [0, 1, 1, 0, 0, 1, 0, 0]);
        let pidfd = self_pidfd();
        m.discard_pages(&mut [5, 1], pidfd.as_ref());
        m.mincore(0, &mut present).unwrap();
        assert_eq!(present.map(|p| p & 1), [0, 0, 1, 0, 0, 0, 0, 0]);
        assert_eq!((byte(&m, PAGE_SIZE), byte(&m, 2 * PAGE_SIZE)), (0, 7));
        // The fallback path (no pidfd) discards too.
        m.discard_pages(&mut [2], None);
        assert_eq!(byte(&m, 2 * PAGE_SIZE), 0);
    }

    #[test]
    fn shared_mappings_of_one_file_see_the_same_pages() {
        let mut f = tempfile_memfd();
        f.write_all(&vec![3u8; 2 * PAGE_SIZE]).unwrap();
        let a = Mapping::shared(f.as_fd(), 0, 2 * PAGE_SIZE).unwrap();
        let b = Mapping::shared(f.as_fd(), PAGE_SIZE as u64, PAGE_SIZE).unwrap();
        drop(f);
        assert_eq!(byte(&b, 0), 3);
        set(&a, PAGE_SIZE, 9);
        assert_eq!(byte(&b, 0), 9);
    }

    fn tempfile_memfd() -> std::fs::File {
        // SAFETY: memfd_create with a NUL-terminated name; returns a new fd or -1.
        let fd = unsafe { libc::memfd_create(c"farmem-mm-test".as_ptr(), 0) };
        assert!(fd >= 0, "memfd_create: {}", io::Error::last_os_error());
        // SAFETY: a fresh descriptor this test owns.
        std::fs::File::from(unsafe { OwnedFd::from_raw_fd(fd) })
    }

    #[test]
    fn bad_lengths_and_unmapped_ranges_are_refused() {
        assert!(Mapping::anonymous(0).is_err());
        assert!(Mapping::anonymous(PAGE_SIZE + 1).is_err());
        // Page zero: below vm.mmap_min_addr (unless an administrator set it to 0), and never
        // chosen by an mmap without MAP_FIXED. A page just unmapped was not safe: another test
        // thread's mapping took its place, and madvise succeeded on it (a fresh-clone CI run).
        let addr = 0;
        assert!(mincore(addr, &mut [0u8; 1]).is_err());
        // SAFETY: the range is unmapped: the call must fail without touching anything.
        assert!(unsafe { raw::dont_need(addr, PAGE_SIZE) }.is_err());
    }
}
