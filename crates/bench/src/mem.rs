//! The benchmarks' own memory accesses, the one module of farmem-bench with unsafe code: a
//! private anonymous mapping ([`Scratch`]) and its userfaultfd registration, and loads and
//! stores into the pages of a scratch mapping or a farmem region ([`Pages`]).
//!
//! [`Pages`] can only be made from a live [`Scratch`] or [`Region`] it borrows, and checks
//! every page index against the mapping's length, so the loads and stores stay inside memory
//! the benchmark owns.

use std::marker::PhantomData;
use std::time::Instant;

use farmem_runtime::{Region, PAGE_SIZE};
use farmem_uffd::{RegisterMode, Uffd, UffdError};

/// A private anonymous mapping owned by the benchmark, unmapped on drop.
pub struct Scratch {
    addr: usize,
    len: usize,
}

impl Scratch {
    /// Maps `pages` pages (no huge pages: faults are taken per 4 KiB page).
    pub fn new(pages: usize) -> std::io::Result<Scratch> {
        let len = pages * PAGE_SIZE;
        // SAFETY: a fresh private anonymous mapping; the kernel picks the address.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: advice on the mapping just created.
        unsafe { libc::madvise(p, len, libc::MADV_NOHUGEPAGE) };
        Ok(Scratch {
            addr: p as usize,
            len,
        })
    }

    /// Registers the whole mapping with `uffd` for missing-page faults.
    pub fn register_missing(&self, uffd: &Uffd) -> Result<(), UffdError> {
        // SAFETY: the mapping is owned by this Scratch and only touched through `Pages`
        // (volatile loads), never through Rust references that assume its pages stay put.
        unsafe {
            uffd.register(
                self.addr,
                self.len,
                RegisterMode {
                    missing: true,
                    wp: false,
                },
            )
        }
        .map(|_ioctls| ())
    }

    /// Unregisters the mapping from `uffd`.
    pub fn unregister(&self, uffd: &Uffd) -> Result<(), UffdError> {
        uffd.unregister(self.addr, self.len)
    }

    /// The mapping's pages.
    pub fn pages(&self) -> Pages<'_> {
        Pages {
            addr: self.addr,
            len: self.len,
            _owner: PhantomData,
        }
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        // SAFETY: the benchmark's own mapping; `Pages` borrowing it are gone (borrow checker).
        unsafe { libc::munmap(self.addr as *mut libc::c_void, self.len) };
    }
}

/// The pages of a live mapping (a [`Scratch`] or a [`Region`]), for loads and stores.
#[derive(Clone, Copy)]
pub struct Pages<'a> {
    addr: usize,
    len: usize,
    _owner: PhantomData<&'a ()>,
}

impl<'a> From<&'a Region> for Pages<'a> {
    fn from(r: &'a Region) -> Pages<'a> {
        Pages {
            addr: r.as_ptr() as usize,
            len: r.len(),
            _owner: PhantomData,
        }
    }
}

impl Pages<'_> {
    /// The address of the first byte of page `page`; panics past the end.
    fn at(&self, page: usize) -> usize {
        assert!(
            page < self.len / PAGE_SIZE,
            "page {page} is past the end of a {}-page mapping",
            self.len / PAGE_SIZE
        );
        self.addr + page * PAGE_SIZE
    }

    /// Loads the first byte of page `page`.
    pub fn load(&self, page: usize) -> u8 {
        let a = self.at(page);
        // SAFETY: `a` is inside the live mapping this borrows (checked by `at`); the load is
        // volatile so it really happens (and takes the fault being measured).
        unsafe { std::ptr::read_volatile(a as *const u8) }
    }

    /// Times one load from page `page`, nanoseconds.
    pub fn timed_load(&self, page: usize) -> u64 {
        let t0 = Instant::now();
        self.load(page);
        t0.elapsed().as_nanos() as u64
    }

    /// Stores `v` into the first byte of page `page`.
    pub fn store(&self, page: usize, v: u8) {
        let a = self.at(page);
        // SAFETY: as in `load`; a volatile store into a page of the live mapping.
        unsafe { std::ptr::write_volatile(a as *mut u8, v) };
    }

    /// Stores the non-zero word `v | 1` at the start of page `page` (so the page is never an
    /// all-zero page the runtime would not send).
    pub fn stamp(&self, page: usize, v: u64) {
        let a = self.at(page);
        // SAFETY: as in `load`; page-aligned, so the word is aligned and inside the page.
        unsafe { std::ptr::write_volatile(a as *mut u64, v | 1) };
    }
}
