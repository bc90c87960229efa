//! Slab memory: the donor's memory mappings and the only code that touches their bytes.
//!
//! This is the one module of the donor that uses `unsafe`. It owns four things:
//! - mapping a slab (a [`farmem_mm::Mapping`]: private anonymous memory with `MAP_NORESERVE`)
//!   and unmapping it when the last reference goes away (`munmap` returns the memory to the
//!   operating system);
//! - receiving page data from a socket straight into slab pages (`readv`);
//! - sending slab pages straight to a socket (`sendmsg` with `MSG_NOSIGNAL`);
//! - for sessions served over a byte stream that is not a socket (in-process, see
//!   `SessionDonor`), copying pages between slab memory and a buffer ([`copy_page_out`],
//!   [`copy_page_in`]).
//!
//! # Design
//! A slab is mapped at allocation time but costs nothing until written: the kernel backs a page
//! of a private anonymous mapping only on its first write fault, and a read of a never-written
//! page maps the shared zero page, so it reads as zeros and commits nothing. Transparent huge
//! pages are switched off for slabs (`MADV_NOHUGEPAGE`) so that writing one 4 KiB page commits
//! 4 KiB, not 2 MiB, and the donor's committed-bytes figure stays true.
//!
//! Slab bytes are read or written by the kernel, inside `readv`/`sendmsg`, or by this module's
//! page copies, which go through 8-byte atomic loads and stores (relaxed); no plain Rust
//! reference to slab memory is ever created. Two connections of one client that race on the same
//! page therefore cannot cause undefined behaviour in the donor: the page simply ends up with a
//! mix of the writes (the client's own race). A [`SlabMemory`] is kept alive (by `Arc`) for as long as
//! any transfer uses it, so a concurrent FREE_SLAB unmaps it only after the transfer ends.
//!
//! # Limitations
//! A write fault on a `MAP_NORESERVE` page when the host is out of memory makes the kernel fail
//! the `readv` (`EFAULT`) or, worse, invoke the OOM killer; the donor's capacity must be chosen
//! below the host's free memory; `--keep-free` makes the donor ask for slabs back before the host
//! runs out (see `reclaim`).
use farmem_mm::{Advice, Mapping};
use farmem_proto::PAGE_SIZE;
use std::io;
use std::os::fd::{AsFd, AsRawFd};
use std::sync::atomic::{AtomicU64, Ordering};

/// One slab's memory mapping ([`farmem_mm::Mapping`]). Unmapped on drop.
pub struct SlabMemory {
    map: Mapping,
}

impl SlabMemory {
    /// Maps `len` bytes (a non-zero multiple of [`PAGE_SIZE`]) of reserved-but-uncommitted memory.
    pub fn map(len: usize) -> io::Result<SlabMemory> {
        if len == 0 || !len.is_multiple_of(PAGE_SIZE) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("slab length {len} is not a non-zero multiple of {PAGE_SIZE}"),
            ));
        }
        let map = Mapping::anonymous(len)?;
        // Failure is harmless (committed figures get coarser).
        map.advise(Advice::NoHugePage);
        Ok(SlabMemory { map })
    }

    /// Pages in the mapping.
    pub fn pages(&self) -> u32 {
        u32::try_from(self.map.pages()).unwrap_or(u32::MAX)
    }

    /// Address of page `page`. Panics if out of range (callers check ranges first; a panic here
    /// is a donor bug, never reachable from client input).
    fn page_ptr(&self, page: u32) -> *mut u8 {
        let off = page as usize * PAGE_SIZE;
        assert!(
            off + PAGE_SIZE <= self.map.len(),
            "page {page} outside slab"
        );
        // Pointer arithmetic only (no dereference), inside the mapping (checked above).
        self.map.as_ptr().wrapping_add(off)
    }
}

/// Words of a page, for the atomic page copies.
const PAGE_WORDS: usize = PAGE_SIZE / 8;

/// The words of page `page` of `mem`, as atomics (the page is 4096-aligned, inside the mapping).
fn page_words(mem: &SlabMemory, page: u32) -> &[AtomicU64] {
    let p = mem.page_ptr(page).cast::<AtomicU64>();
    // SAFETY: `p` is the start of a whole page inside the mapping (`page_ptr` checks the range),
    // page-aligned so 8-aligned, and the mapping lives as long as the `&SlabMemory` borrow this
    // slice is tied to. The memory is only ever accessed as atomics here or by the kernel
    // (`readv`/`sendmsg`), never through plain references, so the shared atomic view aliases
    // nothing that Rust assumes unique; `AtomicU64` has the layout of `u64`.
    unsafe { std::slice::from_raw_parts(p, PAGE_WORDS) }
}

/// Copies page `page` of `mem` into `out` (one page long), for a session served over a byte
/// stream that is not a socket. Panics if `out` is not one page long or `page` is out of range
/// (callers check ranges first).
pub fn copy_page_out(mem: &SlabMemory, page: u32, out: &mut [u8]) {
    assert_eq!(out.len(), PAGE_SIZE, "a page copy takes one page");
    for (w, chunk) in page_words(mem, page).iter().zip(out.chunks_exact_mut(8)) {
        chunk.copy_from_slice(&w.load(Ordering::Relaxed).to_ne_bytes());
    }
}

/// Copies `data` (one page long) into page `page` of `mem`, the counterpart of
/// [`copy_page_out`].
pub fn copy_page_in(mem: &SlabMemory, page: u32, data: &[u8]) {
    assert_eq!(data.len(), PAGE_SIZE, "a page copy takes one page");
    for (w, chunk) in page_words(mem, page).iter().zip(data.chunks_exact(8)) {
        let mut b = [0u8; 8];
        b.copy_from_slice(chunk);
        w.store(u64::from_ne_bytes(b), Ordering::Relaxed);
    }
}

/// Maximum iovecs per syscall: header + one per page (pages are coalesced when adjacent).
const MAX_IOV: usize = farmem_proto::MAX_BATCH_PAGES + 2;

fn empty_iov() -> libc::iovec {
    libc::iovec {
        iov_base: std::ptr::null_mut(),
        iov_len: 0,
    }
}

/// Builds iovecs for `pages` after an optional prefix, coalescing adjacent pages of one slab.
/// Returns the number of iovecs used.
fn build_iovs<'a>(
    iovs: &mut [libc::iovec; MAX_IOV],
    prefix: &[u8],
    pages: impl IntoIterator<Item = (&'a SlabMemory, u32)>,
) -> usize {
    let mut n = 0;
    if !prefix.is_empty() {
        iovs[0] = libc::iovec {
            iov_base: prefix.as_ptr() as *mut libc::c_void,
            iov_len: prefix.len(),
        };
        n = 1;
    }
    let first_page_iov = n;
    for (mem, page) in pages {
        let p = mem.page_ptr(page);
        if n > first_page_iov {
            let last = &mut iovs[n - 1];
            // Pointer arithmetic only (no dereference): the end of the previous page region,
            // compared with `p` to coalesce contiguous pages into one iovec.
            let end = last.iov_base.cast::<u8>().wrapping_add(last.iov_len);
            if end == p {
                last.iov_len += PAGE_SIZE;
                continue;
            }
        }
        assert!(n < MAX_IOV, "more pages than a batch may hold");
        iovs[n] = libc::iovec {
            iov_base: p.cast(),
            iov_len: PAGE_SIZE,
        };
        n += 1;
    }
    n
}

/// Drops `done` bytes from the front of `iovs[..n]`, returning the new start index.
fn advance(iovs: &mut [libc::iovec], mut start: usize, n: usize, mut done: usize) -> usize {
    while start < n && done > 0 {
        let iov = &mut iovs[start];
        if done >= iov.iov_len {
            done -= iov.iov_len;
            start += 1;
        } else {
            // `done < iov_len`, so the new base stays inside the same region.
            iov.iov_base = iov.iov_base.cast::<u8>().wrapping_add(done).cast();
            iov.iov_len -= done;
            done = 0;
        }
    }
    // Skip empty trailing entries.
    while start < n && iovs[start].iov_len == 0 {
        start += 1;
    }
    start
}

/// Runs `syscall` on `iovs[start..n]` until every byte went through, handling short transfers
/// and EINTR. `before` runs before each syscall (e.g. to shorten the socket's timeout to what
/// is left of a deadline) and may end the transfer with its error. `syscall` gets the remaining
/// iovecs and returns the syscall's result; a result of 0 is `zero` (the peer closed, or the
/// socket took nothing).
fn transfer_all(
    iovs: &mut [libc::iovec; MAX_IOV],
    n: usize,
    zero: (io::ErrorKind, &'static str),
    mut before: impl FnMut() -> io::Result<()>,
    mut syscall: impl FnMut(&mut [libc::iovec]) -> isize,
) -> io::Result<()> {
    let mut start = 0;
    while start < n {
        before()?;
        let rc = syscall(&mut iovs[start..n]);
        if rc < 0 {
            let err = io::Error::last_os_error();
            if err.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(err);
        }
        if rc == 0 {
            return Err(io::Error::new(zero.0, zero.1));
        }
        start = advance(iovs, start, n, rc as usize);
    }
    Ok(())
}

/// Sends `prefix` followed by the bytes of `pages` (in order) with vectored writes, handling
/// short writes. The socket's send timeout (SO_SNDTIMEO) bounds how long a peer that stops
/// reading can hold this call: it then fails with `WouldBlock`/`TimedOut`. The sends use
/// `sendmsg` with `MSG_NOSIGNAL`, not `writev`: a connection that is gone or shut down fails with
/// EPIPE instead of raising SIGPIPE, which would kill a host process that keeps SIGPIPE's
/// default action (the donor is a library too).
pub fn send_pages<'a>(
    sock: &impl AsFd,
    prefix: &[u8],
    pages: impl IntoIterator<Item = (&'a SlabMemory, u32)>,
) -> io::Result<()> {
    let fd = sock.as_fd().as_raw_fd();
    let mut iovs = [empty_iov(); MAX_IOV];
    let n = build_iovs(&mut iovs, prefix, pages);
    let zero = (io::ErrorKind::WriteZero, "socket accepted no bytes");
    transfer_all(
        &mut iovs,
        n,
        zero,
        || Ok(()),
        |rest| {
            // SAFETY: `rest` describes live memory: `prefix` (borrowed for this call) and pages
            // inside slab mappings kept alive by the `&'a SlabMemory` borrows, which outlive this
            // call; the kernel only reads from them. `msg` is zeroed (no name, no control data)
            // except for `rest`, which it borrows only during the call. `fd` is a valid open socket
            // borrowed via AsFd.
            unsafe {
                let mut msg: libc::msghdr = std::mem::zeroed();
                msg.msg_iov = rest.as_mut_ptr();
                msg.msg_iovlen = rest.len() as _;
                libc::sendmsg(fd, &msg, libc::MSG_NOSIGNAL)
            }
        },
    )
}

/// Receives `pages.len()` pages from the socket straight into the given slab pages, in order,
/// handling short reads. `before_read` runs before every read and may end the transfer with its
/// error: the caller re-arms the socket's timeout to what is left of the request's deadline
/// there, so a peer trickling the data cannot stretch one request past it. Fails with
/// `UnexpectedEof` if the peer closes before all bytes came.
pub fn recv_pages<'a>(
    sock: &impl AsFd,
    pages: impl IntoIterator<Item = (&'a SlabMemory, u32)>,
    before_read: impl FnMut() -> io::Result<()>,
) -> io::Result<()> {
    let fd = sock.as_fd().as_raw_fd();
    let mut iovs = [empty_iov(); MAX_IOV];
    let n = build_iovs(&mut iovs, &[], pages);
    let zero = (
        io::ErrorKind::UnexpectedEof,
        "connection closed in the middle of WRITE_PAGES data",
    );
    transfer_all(&mut iovs, n, zero, before_read, |rest| {
        // SAFETY: `rest` lies inside slab mappings kept alive by the `&'a SlabMemory` borrows,
        // which outlive this call; no Rust reference to those bytes exists, so the kernel
        // writing them aliases nothing. `rest.len()` is at most MAX_IOV, far below IOV_MAX.
        // `fd` is a valid open socket borrowed via AsFd.
        unsafe { libc::readv(fd, rest.as_ptr(), rest.len() as libc::c_int) }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::os::unix::net::UnixStream;

    #[test]
    fn pages_round_trip_through_a_socket_and_unwritten_pages_are_zero() {
        let a = SlabMemory::map(8 * PAGE_SIZE).unwrap();
        let b = SlabMemory::map(4 * PAGE_SIZE).unwrap();
        assert_eq!(a.pages(), 8);
        let (mut x, y) = UnixStream::pair().unwrap();
        let mut data = Vec::new();
        for i in 0..3u8 {
            data.extend(std::iter::repeat_n(i + 1, PAGE_SIZE));
        }
        let writer = std::thread::spawn(move || {
            x.write_all(&data).unwrap();
            x
        });
        recv_pages(&y, [(&a, 2), (&a, 3), (&b, 0)], || Ok(())).unwrap();
        let mut x = writer.join().unwrap();

        send_pages(&y, b"hdr", [(&a, 3), (&a, 2), (&a, 7), (&b, 0), (&b, 1)]).unwrap();
        let mut got = vec![0u8; 3 + 5 * PAGE_SIZE];
        x.read_exact(&mut got).unwrap();
        assert_eq!(&got[..3], b"hdr");
        let page = |i: usize| &got[3 + i * PAGE_SIZE..3 + (i + 1) * PAGE_SIZE];
        assert!(page(0).iter().all(|&v| v == 2));
        assert!(page(1).iter().all(|&v| v == 1));
        assert!(
            page(2).iter().all(|&v| v == 0),
            "never-written page reads as zeros"
        );
        assert!(page(3).iter().all(|&v| v == 3));
        assert!(page(4).iter().all(|&v| v == 0));
    }

    #[test]
    fn page_copies_round_trip_and_unwritten_pages_are_zero() {
        let a = SlabMemory::map(4 * PAGE_SIZE).unwrap();
        let data: Vec<u8> = (0..PAGE_SIZE).map(|i| (i % 251) as u8).collect();
        copy_page_in(&a, 2, &data);
        let mut got = vec![1u8; PAGE_SIZE];
        copy_page_out(&a, 2, &mut got);
        assert_eq!(got, data);
        copy_page_out(&a, 3, &mut got);
        assert!(
            got.iter().all(|&v| v == 0),
            "never-written page reads as zeros"
        );
        // The kernel sees the copied bytes too.
        let (mut x, y) = UnixStream::pair().unwrap();
        send_pages(&y, &[], [(&a, 2)]).unwrap();
        x.read_exact(&mut got).unwrap();
        assert_eq!(got, data);
    }

    #[test]
    fn contiguous_pages_are_coalesced() {
        let a = SlabMemory::map(8 * PAGE_SIZE).unwrap();
        let mut iovs = [empty_iov(); MAX_IOV];
        let n = build_iovs(&mut iovs, b"h", [(&a, 0), (&a, 1), (&a, 2), (&a, 5)]);
        assert_eq!(n, 3);
        assert_eq!(iovs[1].iov_len, 3 * PAGE_SIZE);
        let n = build_iovs(&mut iovs, &[], [(&a, 0), (&a, 1)]);
        assert_eq!(n, 1);
    }

    #[test]
    fn bad_lengths_are_refused() {
        assert!(SlabMemory::map(0).is_err());
        assert!(SlabMemory::map(PAGE_SIZE + 1).is_err());
    }
}
