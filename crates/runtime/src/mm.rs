//! Every `unsafe` operation of the runtime, each behind a safe function whose contract is
//! documented here (the crate root denies `unsafe_code`; this module alone allows it).
//!
//! What is unsafe in the runtime is memory it does not own as a Rust value: the program's
//! region pages (registered with userfaultfd, moved out and back with UFFDIO_MOVE, faulted in
//! writable to break copy-on-write sharing) and the bytes of write-back pool slots (read by
//! the evictor and copied back to regions). The mappings themselves are
//! [`farmem_mm::Mapping`]s (the pool, regions created by [`crate::Runtime::map`]).
//!
//! # Design
//!
//! The runtime never holds a Rust reference into a region, and into a pool slot only inside
//! [`with_page_bytes`], while the slot's page cannot move (its owner holds the state lock, or
//! the evictor reads a slot it alone owns until its commit). These are the invariants every
//! `SAFETY:` comment here relies on.
#![allow(unsafe_code)]

use farmem_mm::{Advice, Mapping};
use farmem_uffd::{MoveMode, RegisterMode, Uffd, UffdError};

use crate::error::RuntimeError;
use farmem_proto::PAGE_SIZE;

/// Whether this process runs in secure-execution mode (`getauxval(AT_SECURE)`: set-user-ID,
/// set-group-ID or file capabilities): see [`crate::secure`].
pub(crate) fn at_secure() -> bool {
    // SAFETY: getauxval only reads the auxiliary vector the kernel gave the process, which
    // lives as long as the process; it has no preconditions (an absent entry reads as 0).
    unsafe { libc::getauxval(libc::AT_SECURE) != 0 }
}

/// Maps a new region of `len` bytes: private anonymous memory, 4 KiB pages only.
pub(crate) fn map_region(len: usize) -> Result<Mapping, RuntimeError> {
    let m = Mapping::anonymous(len).map_err(|source| RuntimeError::Mmap {
        op: "mapping a region",
        len_bytes: len,
        source,
    })?;
    m.advise(Advice::NoHugePage);
    Ok(m)
}

/// Backs `addr..addr+len` of a program's mapping with 4 KiB pages only (advice; fails
/// harmlessly on ranges that are not mapped).
pub(crate) fn no_huge_pages(addr: usize, len: usize) {
    // SAFETY: advice only: it changes how the kernel backs the range, never its contents.
    unsafe { farmem_mm::raw::advise(addr, len, Advice::NoHugePage) }
}

/// Registers a region (missing and write-protect faults) with the region userfaultfd.
/// The range must be private anonymous memory handed to the runtime: created by
/// [`map_region`], or adopted through [`crate::Runtime::register`], whose caller promises no
/// Rust reference relies on its pages staying in place.
pub(crate) fn register_region(uffd: &Uffd, addr: usize, len: usize) -> Result<(), UffdError> {
    let _ioctls =
    // SAFETY: the range is region memory as described above; the runtime only moves its
    // pages with userfaultfd ioctls, transparently for loads and stores.
    unsafe {
        uffd.register(
            addr,
            len,
            RegisterMode {
                missing: true,
                wp: true,
            },
        )
    }?;
    Ok(())
}

/// Registers the write-back pool with the pool userfaultfd (missing faults: MOVE needs its
/// destination registered).
pub(crate) fn register_pool(uffd: &Uffd, pool: &Mapping) -> Result<(), UffdError> {
    let _ioctls =
    // SAFETY: the pool mapping is owned by the runtime and no Rust reference points into it
    // (slot bytes are only borrowed inside `with_page_bytes`).
    unsafe {
        uffd.register(
            pool.addr(),
            pool.len(),
            RegisterMode {
                missing: true,
                wp: false,
            },
        )
    }?;
    Ok(())
}

/// MOVEs `len` bytes of region pages at `src` into the empty pool slots at `dst` (with
/// DONTWAKE); returns the bytes moved.
pub(crate) fn move_to_pool(
    pool_uffd: &Uffd,
    dst: usize,
    src: usize,
    len: usize,
) -> Result<usize, UffdError> {
    debug_assert!(len.is_multiple_of(PAGE_SIZE));
    // SAFETY: `src..` are region pages the runtime manages (no Rust reference points into
    // regions) and `dst..` are empty pool slots the evictor owns; MOVE takes the pages out
    // atomically with respect to the page table.
    unsafe { pool_uffd.move_pages(dst, src, len, MoveMode::DONT_WAKE) }
}

/// Takes the region page at `addr` away without raising an event on the region userfaultfd
/// (the fault thread, the only reader of those events, cannot `MADV_DONTNEED` it): MOVEs it
/// onto the pool's trash page and discards it there. Returns whether a page was there.
pub(crate) fn take_out_region_page(
    pool_uffd: &Uffd,
    pool: &crate::slots::PoolMemory,
    addr: usize,
) -> Result<bool, UffdError> {
    let mut tries = 0;
    loop {
        // SAFETY: `addr` is a region page the runtime manages (no Rust reference points into
        // regions) whose contents the program released; the trash page is the pool's, empty
        // (emptied after every MOVE onto it) and never read.
        let r = unsafe {
            pool_uffd.move_pages(pool.trash_addr(), addr, PAGE_SIZE, MoveMode::DONT_WAKE)
        };
        match r {
            Ok(_) => {
                pool.empty_trash();
                return Ok(true);
            }
            Err(e) if e.errno() == Some(libc::ENOENT) => return Ok(false),
            // The trash page still held a page (a discard that failed), or the page was
            // locked for a moment: once more.
            Err(e) if tries < 3 && matches!(e.errno(), Some(libc::EEXIST | libc::EAGAIN)) => {
                pool.empty_trash();
                tries += 1;
            }
            Err(e) => return Err(e),
        }
    }
}

/// MOVEs one page from the pool slot at `src` back into the region page `dst`; `dontwake`
/// leaves the waiting threads for a later wake.
pub(crate) fn move_from_pool(
    uffd: &Uffd,
    dst: usize,
    src: usize,
    dontwake: bool,
) -> Result<usize, UffdError> {
    // SAFETY: `src` is a pool slot holding this page, owned by the caller (state lock held);
    // nothing references it; MOVE hands the page to the region without copying.
    unsafe {
        uffd.move_pages(
            dst,
            src,
            PAGE_SIZE,
            MoveMode {
                dont_wake: dontwake,
                ..MoveMode::WAKE
            },
        )
    }
}

/// Runs `f` on the bytes of page `page` of `m`: a pool slot, or a page of a memory slab
/// ([`crate::slabs::memslabs`]). The page must not move or be discarded during the call: the caller
/// holds the state lock and the page is owned by it, or it is the evictor reading a victim's
/// slot before its commit. (A memory slab from the host tier is shared with the node process,
/// which could write it meanwhile; the bytes are only ever copied, never interpreted.)
pub(crate) fn with_page_bytes<R>(m: &Mapping, page: u32, f: impl FnOnce(&[u8]) -> R) -> R {
    with_pages_bytes(m, page, 1, f)
}

/// [`with_page_bytes`] for the `n` pages from `page` on, as one slice (a run of a memory
/// slab installed with one UFFDIO_COPY); the same contract holds for every page of the run.
pub(crate) fn with_pages_bytes<R>(
    m: &Mapping,
    page: u32,
    n: usize,
    f: impl FnOnce(&[u8]) -> R,
) -> R {
    assert!(
        n >= 1 && (page as usize).saturating_add(n) <= m.pages(),
        "pages {page}..+{n} outside the mapping"
    );
    // SAFETY: the pages lie inside the mapping (checked above), which outlives the call; per
    // this function's contract nothing in this process moves, discards or writes them while
    // `f` runs (the kernel only reads them when `f` passes them to UFFDIO_COPY), and the
    // slice does not escape `f`.
    let bytes = unsafe {
        std::slice::from_raw_parts(
            (m.addr() + page as usize * PAGE_SIZE) as *const u8,
            n * PAGE_SIZE,
        )
    };
    f(bytes)
}

/// Writes `src` (one page) into page `page` of the memory slab `m`. The caller holds the state
/// lock, under which alone memory slabs are read or written.
pub(crate) fn write_page(m: &Mapping, page: u32, src: &[u8]) {
    assert!(
        (page as usize) < m.pages(),
        "page {page} outside the mapping"
    );
    assert_eq!(src.len(), PAGE_SIZE);
    // SAFETY: the destination page lies inside the mapping (checked above), which is owned by
    // the runtime and outlives the call; no Rust reference points into it (readers borrow it
    // only inside `with_page_bytes`, under the same lock the caller holds); `src` is a
    // separate buffer (a pool slot or a heap page), so the ranges do not overlap.
    unsafe {
        std::ptr::copy_nonoverlapping(
            src.as_ptr(),
            (m.addr() + page as usize * PAGE_SIZE) as *mut u8,
            PAGE_SIZE,
        )
    }
}

/// Copies the whole of `src` into `dst` (same length): a memory slab moving from the host
/// tier into local memory. The caller holds the state lock.
pub(crate) fn copy_mapping(dst: &Mapping, src: &Mapping) {
    assert_eq!(dst.len(), src.len(), "memory slabs of different sizes");
    // SAFETY: both mappings are owned by the runtime, distinct, of the same length, and
    // outlive the call; no Rust reference points into either (see `write_page`).
    unsafe { std::ptr::copy_nonoverlapping(src.as_ptr() as *const u8, dst.as_ptr(), src.len()) }
}

/// Whether the page at `addr` is mapped in this process now.
pub(crate) fn is_present(addr: usize) -> bool {
    let mut v = [0u8; 1];
    farmem_mm::mincore(addr, &mut v).is_ok() && v[0] & 1 != 0
}

/// Unmaps the region pages `addr..addr + len` from this process (`MADV_DONTNEED`), leaving
/// them to the process they are shared with ([`crate::threads::cow`]). Raises a REMOVE event on the
/// region userfaultfd and returns once the fault thread has read it.
pub(crate) fn drop_region_pages(addr: usize, len: usize) -> std::io::Result<()> {
    // SAFETY: the range is region pages whose contents are in pool slots and which are
    // write-protected, so no write is lost; no Rust reference points into regions.
    unsafe { farmem_mm::raw::dont_need(addr, len) }
}

/// In a forked child: takes the tier slab mapping it inherited at `addr` (`len` bytes) as its
/// own memory (a borrowed slab, [`crate::fork`]).
pub(crate) fn adopt_inherited(addr: usize, len: usize) -> std::io::Result<Mapping> {
    // SAFETY: called only in a forked child (the runtime checks `Lent` came from this process's
    // fork) for a slab the parent marked to be inherited; the child's copy of the parent's
    // runtime, which owned the mapping there, is never dropped or used in the child, so
    // nothing else unmaps it. `adopt` checks the length.
    unsafe { Mapping::adopt(addr, len) }
}

/// Copies the page at `src` (a lent slab's) into the region page `dst`, in a forked child that
/// pages nothing itself.
pub(crate) fn copy_inherited_page(dst: usize, src: usize) {
    // SAFETY: `dst` is a region page of this process (plain memory in a child without a
    // runtime, no Rust reference into it) that the caller found mapped; `src` is a page inside
    // a slab this process inherited at fork, mapped for the life of the process (see
    // `adopt_inherited`); the two never overlap (a slab is not a region).
    unsafe { farmem_mm::raw::copy_page(dst, src) }
}

/// In a forked child, before its regions are registered: drops the page at `dst` (shared with
/// the parent) if it equals the lent slab page at `src`. Returns whether it was dropped.
pub(crate) fn drop_inherited_page_if_equal(dst: usize, src: usize) -> bool {
    // SAFETY: `dst` is a mapped region page of this process (the caller checked with mincore)
    // and `src` a page of a slab inherited at fork (see `adopt_inherited`); both are only read
    // here and no Rust reference points into either.
    let same = unsafe {
        std::slice::from_raw_parts(dst as *const u8, PAGE_SIZE)
            == std::slice::from_raw_parts(src as *const u8, PAGE_SIZE)
    };
    if same {
        // SAFETY: the region is not registered with a userfaultfd yet (no event), and the page
        // equals its far copy, which the runtime installs on the next access.
        unsafe { farmem_mm::raw::discard(dst, PAGE_SIZE) };
    }
    same
}

/// The words of a shared mapping this process made (a lender's table of lent copies,
/// [`crate::lentcopies`]), as atomics.
pub(crate) fn shared_words(m: &Mapping) -> &[std::sync::atomic::AtomicU64] {
    // SAFETY: the mapping is page-aligned (so 8-byte aligned), `len` bytes long and lives as
    // long as the borrow of `m`; its memory is only ever accessed through atomics (here, in
    // this process's other threads, and in forked children through `inherited_words`), so no
    // non-atomic reference aliases it.
    unsafe {
        std::slice::from_raw_parts(
            m.as_ptr().cast::<std::sync::atomic::AtomicU64>(),
            m.len() / 8,
        )
    }
}

/// In a descendant of a lender: the `words` words of its table of lent copies, inherited at
/// `addr` by fork ([`crate::lentcopies`]).
pub(crate) fn inherited_words(
    addr: usize,
    words: usize,
) -> &'static [std::sync::atomic::AtomicU64] {
    // SAFETY: `addr` comes from the lender's own `shared_words` mapping, carried in the `Lent`
    // that only a fork of it hands over; a fork copies the mapping to the same address, and
    // nothing in a descendant unmaps it (the lender's runtime, which owns it, is never dropped
    // there: see `adopt_inherited`), so it lives as long as the process. Accessed as atomics
    // only, as in the lender.
    unsafe { std::slice::from_raw_parts(addr as *const std::sync::atomic::AtomicU64, words) }
}
