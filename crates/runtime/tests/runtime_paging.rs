//! The paging runtime against real userfaultfd and donors on loopback (in this process, and the
//! embedded `farmem donor` child the runtime starts when given none):
//! data integrity at 4x the budget with 4 threads under both eviction policies, read(2) into
//! evicted buffers, release (MADV_DONTNEED, munmap + new mapping), clean/zero page accounting,
//! a donor too small, and the C API.

use std::sync::Arc;
use std::time::Duration;

use farmem_donor::RunningDonor;
use farmem_runtime::{Region, Runtime, RuntimeConfig, RuntimeError, TierMode};
use farmem_testkit::donor::in_process;
use farmem_testkit::pages::{read_u64, Stamp, MIB, PAGE};
use farmem_testkit::runtime::{config, start, wait_for_sends_to_settle, wait_for_stats};

/// What this file stamps pages with.
const STAMP: Stamp = Stamp {
    step: 37,
    salt: 0x5555,
};

fn runtime(budget: usize, donors: Vec<String>, evict: &str) -> Arc<Runtime> {
    start(RuntimeConfig {
        evict: evict.into(),
        ..config(budget, donors)
    })
}

/// A region four times `budget` on a FIFO runtime paging to its own donor (1 MiB slabs).
/// Fields drop in order: the region, then the runtime, then the donor.
struct Setup {
    _region: Region,
    base: usize,
    pages: usize,
    rt: Arc<Runtime>,
    _donor: RunningDonor,
}

fn setup(budget: usize) -> Setup {
    let donor = in_process(64 << 20, 1 << 20);
    let rt = runtime(budget, vec![donor.local_addr().to_string()], "fifo");
    let region = rt.map(4 * budget).unwrap();
    Setup {
        base: region.as_ptr() as usize,
        pages: region.len() / PAGE,
        _region: region,
        rt,
        _donor: donor,
    }
}

fn four_threads_4x_budget(evict: &str) {
    let budget = 4 * MIB;
    let donor = in_process(256 << 20, 4 << 20);
    let rt = runtime(budget, vec![donor.local_addr().to_string()], evict);
    let region = rt.map(4 * budget).unwrap();
    let base = region.as_ptr() as usize;
    let pages = region.len() / PAGE;
    let per = pages / 4;
    // Each thread owns a quarter; two rounds of write-all then read-all, so pages come back
    // from the pool and from the donor while the other threads evict theirs.
    let hs: Vec<_> = (0..4)
        .map(|t| {
            std::thread::spawn(move || {
                let mine = t * per..(t + 1) * per;
                for r in 1..=2u64 {
                    for p in mine.clone() {
                        STAMP.write_page(base, p, r);
                    }
                    for p in mine.clone() {
                        STAMP.check_page(base, p, r);
                    }
                }
            })
        })
        .collect();
    for h in hs {
        h.join().unwrap();
    }
    // Every thread reads every page at once: concurrent faults on the same pages.
    let hs: Vec<_> = (0..4)
        .map(|_| {
            std::thread::spawn(move || {
                for p in 0..pages {
                    STAMP.check_page(base, p, 2);
                }
            })
        })
        .collect();
    for h in hs {
        h.join().unwrap();
    }
    let s = rt.stats();
    assert!(s.faults_remote > 0, "{s:?}");
    assert_eq!(s.fetch_errors, 0, "{s:?}");
    assert_eq!(s.send_errors, 0, "{s:?}");
    assert_evicted_within_budget(&s);
    assert_eq!(s.bytes_sent, s.evicted_sent_dirty * PAGE as u64);
}

#[test]
fn data_4x_budget_4_threads_fifo() {
    four_threads_4x_budget("fifo");
}

#[test]
fn data_4x_budget_4_threads_clock() {
    four_threads_4x_budget("clock");
}

#[test]
fn embedded_donor_serves_and_read_syscall_fills_evicted_buffer() {
    read_syscall_fills_evicted_buffer(TierMode::Off);
}

#[test]
fn private_node_serves_and_read_syscall_fills_evicted_buffer() {
    read_syscall_fills_evicted_buffer(TierMode::Auto);
}

/// No donor named: the runtime starts its own child donor (`tier` Off) or private node
/// (Auto, with no node on this host).
fn read_syscall_fills_evicted_buffer(tier: TierMode) {
    let budget = 2 * MIB;
    let rt = start(RuntimeConfig {
        tier: tier.clone(),
        ..config(budget, Vec::new())
    });
    let region = rt.map(4 * budget).unwrap();
    let base = region.as_ptr() as usize;
    let pages = region.len() / PAGE;
    for p in 0..pages {
        STAMP.write_page(base, p, 7);
    }
    // Page 0 is long evicted. read(2) from a file into it: the fault happens inside the
    // system call and must be served.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("data");
    let content: Vec<u8> = (0..2 * PAGE).map(|i| (i * 7 % 251) as u8).collect();
    std::fs::write(&path, &content).unwrap();
    let f = std::fs::File::open(&path).unwrap();
    use std::os::fd::AsRawFd;
    // SAFETY: reading into the first two pages of the region owned by this test.
    let n = unsafe { libc::read(f.as_raw_fd(), base as *mut libc::c_void, 2 * PAGE) };
    assert_eq!(n, (2 * PAGE) as isize, "read(2) into an evicted buffer");
    // SAFETY: the region is live; reading what read(2) wrote.
    let got = unsafe { std::slice::from_raw_parts(base as *const u8, 2 * PAGE) };
    assert_eq!(got, &content[..]);
    for p in 2..pages {
        STAMP.check_page(base, p, 7);
    }
    let s = rt.stats();
    if tier == TierMode::Off {
        assert!(s.faults_remote + s.faults_pool_hit > 0, "{s:?}");
    } else {
        assert!(s.faults_tier > 0 && s.tier_node.is_some(), "{s:?}");
    }
}

#[test]
fn madvise_dontneed_then_reads_are_zero() {
    let budget = MIB;
    let env = setup(budget);
    let (base, pages) = (env.base, env.pages);
    for p in 0..pages {
        STAMP.write_page(base, p, 3);
    }
    // Release the first half (evicted: in the pool or on the donor) and the last 8 pages
    // (resident).
    // SAFETY: releasing pages of the test's own region.
    unsafe {
        assert_eq!(
            libc::madvise(base as *mut _, pages / 2 * PAGE, libc::MADV_DONTNEED),
            0
        );
        let tail = base + (pages - 8) * PAGE;
        assert_eq!(
            libc::madvise(tail as *mut _, 8 * PAGE, libc::MADV_DONTNEED),
            0
        );
    }
    for p in (0..pages / 2).chain(pages - 8..pages) {
        let ptr = (base + p * PAGE) as *const u64;
        for w in (0..PAGE / 8).step_by(STAMP.step) {
            assert_eq!(read_u64(ptr as usize + w * 8), 0, "page {p} after release");
        }
    }
    for p in pages / 2..pages - 8 {
        STAMP.check_page(base, p, 3);
    }
}

#[test]
fn munmap_and_new_mapping_at_same_address_has_no_old_data() {
    let budget = MIB;
    let donor = in_process(64 << 20, 1 << 20);
    let rt = runtime(budget, vec![donor.local_addr().to_string()], "fifo");
    let len = 4 * budget;
    let map = |hint: usize, fixed: bool| -> Option<usize> {
        // SAFETY: a fresh private anonymous mapping (at `hint`, which the test just unmapped,
        // when `fixed`; never over another mapping: MAP_FIXED_NOREPLACE).
        let p = unsafe {
            libc::mmap(
                hint as *mut _,
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE
                    | libc::MAP_ANONYMOUS
                    | if fixed { libc::MAP_FIXED_NOREPLACE } else { 0 },
                -1,
                0,
            )
        };
        (p != libc::MAP_FAILED).then_some(p as usize)
    };
    // Another thread of the test process (a parallel test, a runtime thread) may map memory
    // into the hole between munmap and the new mmap: then the test starts over elsewhere.
    let mut b = None;
    for _ in 0..10 {
        let a = map(0, false).expect("mmap");
        rt.register(a as *mut u8, len).unwrap();
        for p in 0..len / PAGE {
            STAMP.write_page(a, p, 9);
        }
        // SAFETY: unmapping the test's own mapping; the runtime sees an UNMAP event.
        assert_eq!(unsafe { libc::munmap(a as *mut _, len) }, 0);
        if let Some(new) = map(a, true) {
            assert_eq!(a, new, "the new mapping is at the old address");
            b = Some(new);
            break;
        }
    }
    let b = b.expect("the old address was taken by another mapping 10 times in a row");
    rt.register(b as *mut u8, len).unwrap();
    for p in 0..len / PAGE {
        let ptr = (b + p * PAGE) as *const u64;
        for w in (0..PAGE / 8).step_by(STAMP.step) {
            assert_eq!(read_u64(ptr as usize + w * 8), 0, "old data in page {p}");
        }
    }
    // SAFETY: done with the mapping.
    unsafe { libc::munmap(b as *mut _, len) };
}

#[test]
fn clean_pages_not_resent_and_zero_pages_never_sent() {
    let budget = MIB;
    let env = setup(budget);
    let (rt, base, pages) = (&env.rt, env.base, env.pages);
    // Even pages hold data; odd pages are written with zeros (touched, but all zero).
    for p in 0..pages {
        if p % 2 == 0 {
            STAMP.write_page(base, p, 5);
        } else {
            // SAFETY: inside the live region.
            unsafe { ((base + p * PAGE) as *mut u64).write_volatile(0) };
        }
    }
    // Two read-only passes: pages come back clean and leave without being sent again.
    for _ in 0..2 {
        for p in (0..pages).step_by(2) {
            STAMP.check_page(base, p, 5);
        }
    }
    let before = rt.stats();
    for p in (0..pages).step_by(2) {
        STAMP.check_page(base, p, 5);
    }
    let after = rt.stats();
    let data_pages = pages.div_ceil(2) as u64;
    assert!(after.evicted_zero > 0, "{after:?}");
    assert!(
        after.evicted_sent_dirty <= data_pages,
        "sent {} pages but only {data_pages} ever held data: zero or clean pages were sent",
        after.evicted_sent_dirty
    );
    assert_eq!(
        after.evicted_sent_dirty, before.evicted_sent_dirty,
        "a read-only pass resent pages"
    );
    assert!(
        after.evicted_dropped_clean > before.evicted_dropped_clean,
        "{after:?}"
    );
    // Zero pages came back as zero pages, never from the donor.
    for p in (1..pages).step_by(2) {
        assert_eq!(read_u64(base + p * PAGE), 0);
    }
    let last = rt.stats();
    assert!(last.faults_zero > before.faults_zero, "{last:?}");
}

#[test]
fn donor_with_too_little_capacity_gives_a_clear_error() {
    let budget = MIB;
    let donor = in_process(1 << 20, 1 << 20);
    let rt = runtime(budget, vec![donor.local_addr().to_string()], "fifo");
    // A region that cannot fit: refused at once, with the numbers and what to do.
    let err = rt.map(8 * budget).err().expect("must be refused");
    assert!(
        matches!(err, RuntimeError::InsufficientCapacity { .. }),
        "{err}"
    );
    let msg = err.to_string();
    assert!(msg.contains("start more donors"), "{msg}");
    // An adopted mapping is not checked up front: writing past budget + capacity must neither
    // hang nor crash; the data stays correct locally and the error is reported.
    let len = 4 * budget;
    // SAFETY: a fresh private anonymous mapping.
    let a = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    } as usize;
    rt.register(a as *mut u8, len).unwrap();
    for p in 0..len / PAGE {
        STAMP.write_page(a, p, 11);
    }
    for p in 0..len / PAGE {
        STAMP.check_page(a, p, 11);
    }
    let s = wait_for_stats(
        &rt,
        Duration::from_secs(10),
        Duration::from_millis(20),
        |s| s.last_error.is_some(),
    );
    let e = s.last_error.clone().expect("the full donor is reported");
    assert!(e.contains("donors are full"), "{e}");
    // What ran out, in the donor's words, and what this program holds of it.
    assert!(
        e.contains("refused: ") && e.contains("capacity exhausted"),
        "{e}"
    );
    assert!(e.contains("bytes of donor slabs"), "{e}");
    // SAFETY: done with the mapping.
    unsafe { libc::munmap(a as *mut _, len) };
}

#[test]
fn concurrent_faults_on_one_page_are_served_once() {
    let budget = MIB;
    let env = setup(budget);
    let (rt, base, pages) = (&env.rt, env.base, env.pages);
    for p in 0..pages {
        STAMP.write_page(base, p, 13);
    }
    // The first pages are evicted (most of them: the evictor keeps a page of them now and
    // then, and a resident page takes no fault). Four threads touch each of them at the same
    // moment.
    let k = 64;
    wait_for_sends_to_settle(rt);
    let mut present = vec![0u8; k];
    farmem_mm::mincore(base, &mut present).unwrap();
    let resident = present.iter().filter(|p| *p & 1 != 0).count() as u64;
    let before = rt.stats();
    let barrier = Arc::new(std::sync::Barrier::new(4));
    let hs: Vec<_> = (0..4)
        .map(|_| {
            let barrier = barrier.clone();
            std::thread::spawn(move || {
                for p in 0..k {
                    barrier.wait();
                    STAMP.check_page(base, p, 13);
                }
            })
        })
        .collect();
    for h in hs {
        h.join().unwrap();
    }
    let after = rt.stats();
    // Pages read from the donor: each at most once. Counted in bytes, not in faults: about
    // one run in twelve counted 63 remote faults (and no pool hit) while the 64 pages were
    // received, each once — a fault's kind is not a count of fetches.
    let brought_in = (after.bytes_received - before.bytes_received) / PAGE as u64;
    assert!(
        brought_in <= k as u64 && brought_in + resident >= k as u64,
        "each page must be brought in once however many threads fault on it: {brought_in} \
         read from the donor, {resident} of {k} resident before: {after:?}"
    );
}

/// Starting a runtime with an embedded donor must not fork this process: a fork leaves every
/// page of the other runtimes' regions shared copy-on-write, UFFDIO_MOVE refuses to evict
/// such pages, and their budget was overshot (seen in CI when tests ran side by side).
#[test]
fn starting_an_embedded_donor_leaves_other_regions_evictable() {
    let budget = 2 * MIB;
    let env = setup(budget);
    let (rt, base, pages) = (&env.rt, env.base, env.pages);
    // Fill the budget, so every resident page would be shared by a fork now.
    let resident = budget / PAGE - budget / PAGE / 16;
    for p in 0..resident {
        STAMP.write_page(base, p, 1);
    }
    // Another runtime in this process starts its embedded donor.
    let other = runtime(budget, Vec::new(), "fifo");
    let o = other.map(budget).unwrap();
    STAMP.write_page(o.as_ptr() as usize, 0, 1);
    // Now go well past the budget: the resident pages must be evictable as before.
    for p in resident..pages {
        STAMP.write_page(base, p, 1);
    }
    for p in 0..pages {
        STAMP.check_page(base, p, 1);
    }
    let s = rt.stats();
    assert_eq!(s.evictions_refused, 0, "pages were left shared: {s:?}");
    assert_evicted_within_budget(&s);
}

/// Pages were written back, and residency never went over the budget.
fn assert_evicted_within_budget(s: &farmem_runtime::Stats) {
    assert!(s.evicted_sent_dirty > 0, "{s:?}");
    assert!(
        s.peak_resident_pages <= s.budget_pages,
        "peak resident {} above budget {}: {s:?}",
        s.peak_resident_pages,
        s.budget_pages
    );
}

#[test]
fn regions_lists_every_region_and_own_memory_the_pool() {
    let donor = in_process(64 << 20, 1 << 20);
    let rt = runtime(MIB, vec![donor.local_addr().to_string()], "fifo");
    assert!(rt.regions().is_empty(), "{:?}", rt.regions());
    let a = rt.map(2 * MIB).unwrap();
    let b = rt.map(3 * MIB + 1).unwrap();
    let mut want = vec![
        (a.as_ptr() as usize, 2 * MIB),
        (b.as_ptr() as usize, 3 * MIB + PAGE),
    ];
    want.sort_unstable();
    assert_eq!(rt.regions(), want);
    let own = rt.own_memory();
    let pool = rt.stats().pool_capacity_pages as usize * PAGE;
    assert!(!own.is_empty() && own[0].1 >= pool, "{own:?}, pool {pool}");
    for (start, len) in &own {
        for (r, rl) in &want {
            assert!(
                start + len <= *r || r + rl <= *start,
                "pool overlaps a region"
            );
        }
    }
    drop(a);
    assert_eq!(rt.regions(), vec![(b.as_ptr() as usize, 3 * MIB + PAGE)]);
}

/// A page another thread discards (`MADV_DONTNEED`, as an allocator purges) while its mapping
/// is being registered is never taken for resident with nothing mapped: read afterwards, each
/// page is its data or zeros, and no access gets SIGBUS. (Present pages were once scanned
/// before the range was registered, so a discard in between went unseen.)
#[test]
fn a_page_discarded_while_its_mapping_is_registered_reads_as_data_or_zero() {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    const PAGES: usize = 16;
    let donor = in_process(64 << 20, 1 << 20);
    let rt = runtime(32 * MIB, vec![donor.local_addr().to_string()], "fifo");
    let len = PAGES * PAGE;
    for round in 0..1000u64 {
        // Unmapped when dropped, at the end of the round (the runtime sees an UNMAP event).
        let mapping = farmem_mm::Mapping::anonymous(len).expect("mmap");
        let a = mapping.addr();
        let stop = AtomicBool::new(false);
        let flips = AtomicUsize::new(0);
        std::thread::scope(|s| {
            // Pages flip between present (stamped) and discarded, before, during and after
            // the registration.
            s.spawn(|| {
                let mut n = 0usize;
                while !stop.load(Ordering::Relaxed) {
                    let p = n % PAGES;
                    STAMP.write_page(a, p, round);
                    // SAFETY: discards one page of the test's own mapping (it reads as zeros
                    // afterwards, which the check below accepts).
                    unsafe { libc::madvise((a + p * PAGE) as *mut _, PAGE, libc::MADV_DONTNEED) };
                    STAMP.write_page(a, (p + PAGES / 2) % PAGES, round);
                    n += 1;
                    flips.store(n, Ordering::Relaxed);
                }
            });
            while flips.load(Ordering::Relaxed) < PAGES {
                std::hint::spin_loop();
            }
            rt.register(a as *mut u8, len).unwrap();
            stop.store(true, Ordering::Relaxed);
        });
        for p in 0..PAGES {
            if read_u64(a + p * PAGE) != 0 {
                STAMP.check_page(a, p, round);
            }
        }
        drop(mapping);
    }
}
