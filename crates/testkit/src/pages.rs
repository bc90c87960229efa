//! Reading, writing and stamping pages: values that name their page and round, so a page that
//! comes back from the wrong place or an old round is caught.

use std::sync::atomic::{AtomicU64, Ordering};

/// Bytes in a page.
pub const PAGE: usize = farmem_proto::PAGE_SIZE;
/// Bytes in a MiB.
pub const MIB: usize = 1 << 20;

/// The word at `addr` (8-byte aligned), as an atomic: a test program's threads read words
/// another thread writes (a page rewritten while others read it), which is a data race with
/// plain or volatile accesses and is reported by ThreadSanitizer (`scripts/sanitize.sh`). A
/// relaxed load or store compiles to the same single move on x86-64.
fn word_at<'a>(addr: usize) -> &'a AtomicU64 {
    assert!(
        addr.is_multiple_of(8),
        "word address {addr:#x} is not 8-byte aligned"
    );
    // SAFETY: callers pass aligned addresses inside regions or mappings the test owns and
    // keeps alive while it uses them; every access to such words goes through atomics.
    unsafe { AtomicU64::from_ptr(addr as *mut u64) }
}

/// Reads the word at `addr`.
pub fn read_u64(addr: usize) -> u64 {
    word_at(addr).load(Ordering::Relaxed)
}

/// Writes `v` to the word at `addr`.
pub fn write_u64(addr: usize, v: u64) {
    word_at(addr).store(v, Ordering::Relaxed)
}

/// Page stamping: word `w` of page `p` holds a value of `p`, `w`, the round and `salt`, for
/// every `step`-th word of the page.
pub struct Stamp {
    pub step: usize,
    pub salt: u64,
}

impl Stamp {
    /// The 8-byte word stored at word `w` of page `p` in round `r`.
    pub fn word(&self, p: usize, w: usize, r: u64) -> u64 {
        ((p as u64) << 32) ^ ((w as u64) << 8) ^ r.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ self.salt
    }

    /// Stamps page `p` of the region at `base` with round `r`.
    pub fn write_page(&self, base: usize, p: usize, r: u64) {
        let ptr = (base + p * PAGE) as *mut u64;
        for w in (0..PAGE / 8).step_by(self.step) {
            // SAFETY: inside a live region owned by the test.
            unsafe { ptr.add(w).write_volatile(self.word(p, w, r)) };
        }
    }

    /// Fails the test unless page `p` of the region at `base` holds round `r`'s stamp.
    pub fn check_page(&self, base: usize, p: usize, r: u64) {
        let ptr = (base + p * PAGE) as *const u64;
        for w in (0..PAGE / 8).step_by(self.step) {
            // SAFETY: inside a live region owned by the test.
            let v = unsafe { ptr.add(w).read_volatile() };
            assert_eq!(v, self.word(p, w, r), "page {p} word {w} round {r}");
        }
    }
}

/// The word stamped at both ends of page `p` in round `r` by [`fill`] (the last one `^ 0xff`).
pub fn word(p: usize, r: u64) -> u64 {
    ((p as u64) << 20) ^ r.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1
}

/// Stamps the first and last word of each of the `pages` pages at `base` with round `r`.
pub fn fill(base: usize, pages: usize, r: u64) {
    for p in 0..pages {
        write_u64(base + p * PAGE, word(p, r));
        write_u64(base + p * PAGE + PAGE - 8, word(p, r) ^ 0xff);
    }
}

/// Number of pages whose two stamped words are not round `r`'s (allocation-free: used in
/// forked children).
pub fn mismatches(base: usize, pages: usize, r: u64) -> usize {
    (0..pages)
        .filter(|p| {
            read_u64(base + p * PAGE) != word(*p, r)
                || read_u64(base + p * PAGE + PAGE - 8) != word(*p, r) ^ 0xff
        })
        .count()
}

/// The pages among the `pages` pages at `base` that are not present in memory (evicted: in the
/// write-back pool or only on a donor), lowest first, found with mincore, which does not touch
/// the pages.
pub fn absent_pages(base: usize, pages: usize) -> Vec<usize> {
    let mut present = vec![0u8; pages];
    // SAFETY: mincore writes one byte per page of the range into `present`, which has exactly
    // that many; the caller passes a mapped range; it does not touch the pages.
    let r = unsafe {
        libc::mincore(
            base as *mut libc::c_void,
            pages * PAGE,
            present.as_mut_ptr(),
        )
    };
    assert_eq!(r, 0, "mincore: {}", std::io::Error::last_os_error());
    (0..pages).filter(|p| present[*p] & 1 == 0).collect()
}

/// Reads the first word of evicted pages, lowest first, handing each value to `report`, until
/// one read has had to come from a donor (a scenario whose donor is unusable or hostile ends
/// there with SIGBUS). Not simply the first evicted page: an eviction the kernel refused for a
/// moment (a MOVE that met a locked page) puts the page back at the end of the queue, so a low
/// page can be among the last evicted, still in the write-back pool (`pool_pages` slots), and
/// read from there.
pub fn read_evicted(
    base: usize,
    pages: usize,
    pool_pages: usize,
    mut report: impl FnMut(usize, u64),
) {
    let evicted = absent_pages(base, pages);
    let reads = pool_pages + 1;
    assert!(
        evicted.len() > reads,
        "too few pages were evicted: {}",
        evicted.len()
    );
    for p in evicted.into_iter().take(reads) {
        report(p, read_u64(base + p * PAGE));
    }
}
