//! The benchmarks' loads and stores into farmem regions ([`Pages`]), the one module of
//! farmem-bench with unsafe code.
//!
//! [`Pages`] can only be made from a live [`Region`] it borrows, and checks every page index
//! against the region's length, so the loads and stores stay inside memory the benchmark owns.

use std::marker::PhantomData;
use std::time::Instant;

use farmem_runtime::{Region, PAGE_SIZE};

/// The pages of a live [`Region`], for loads and stores.
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

    /// Loads the first word of page `page` (what [`Pages::stamp`] stored).
    pub fn word(&self, page: usize) -> u64 {
        let a = self.at(page);
        // SAFETY: as in `load`; page-aligned, so the word is aligned and inside the page.
        unsafe { std::ptr::read_volatile(a as *const u64) }
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
