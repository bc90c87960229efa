//! Every wrapper against the real kernel userfaultfd: faults served by COPY/ZEROPAGE/MOVE, a
//! fault inside read(2), write-protect faults, release events, poison.

use farmem_uffd::{Event, Features, MoveMode, RegisterMode, Uffd, PAGE_SIZE};
use std::time::Duration;

struct Map {
    addr: usize,
    len: usize,
}

impl Map {
    fn new(len: usize) -> Map {
        // SAFETY: fresh private anonymous mapping; checked below.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED, "mmap failed");
        Map {
            addr: p as usize,
            len,
        }
    }
}

impl Drop for Map {
    fn drop(&mut self) {
        // SAFETY: unmapping the mapping this struct created.
        unsafe { libc::munmap(self.addr as *mut _, self.len) };
    }
}

/// The tests of this file run one at a time: they fork, register and move pages in one process,
/// and a fork or MOVE in one test while another test's thread faults on its own region has
/// crashed the test process (SIGSEGV) on this kernel. Serialising keeps each test's checks
/// exactly as they are.
fn serial() -> std::sync::MutexGuard<'static, ()> {
    static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());
    SERIAL
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn all() -> Features {
    Features::PAGEFAULT_FLAG_WP
        | Features::EVENT_REMOVE
        | Features::EVENT_UNMAP
        | Features::EVENT_REMAP
        | Features::THREAD_ID
        | Features::MOVE
        | Features::POISON
}

const BOTH: RegisterMode = RegisterMode {
    missing: true,
    wp: true,
};

/// Reads events until one arrives (the test threads produce it), 5 s at most.
fn next_event(u: &Uffd) -> Event {
    let mut v = next_events(u, 1);
    v.pop().unwrap()
}

/// Reads events until `n` have arrived, 5 s at most, and fails on more. A thread that
/// raises several events in a row (two munmaps) may have the next one queued by the time a
/// read drains the first, so they are gathered, not read one per call.
fn next_events(u: &Uffd, n: usize) -> Vec<Event> {
    let mut v = Vec::new();
    for _ in 0..50 {
        u.wait_readable(100).unwrap();
        u.read_events(&mut v).unwrap();
        assert!(v.len() <= n, "expected {n} event(s), got {v:?}");
        if v.len() == n {
            return v;
        }
    }
    panic!("{} of {n} userfaultfd event(s) within 5 s: {v:?}", v.len());
}

fn read_u64(addr: usize) -> u64 {
    // SAFETY: test-owned mapping, volatile read of a live address.
    unsafe { std::ptr::read_volatile(addr as *const u64) }
}

#[test]
fn probe_reports_the_features_farmem_needs() {
    let _serial = serial();
    let f = Uffd::probe().expect("userfaultfd must be usable (root or /dev/userfaultfd access)");
    for need in [
        Features::MOVE,
        Features::PAGEFAULT_FLAG_WP,
        Features::EVENT_REMOVE,
    ] {
        assert!(f.contains(need), "kernel lacks {:?}", need.names());
    }
    let u = Uffd::open(all(), Features::empty()).unwrap();
    assert!(u.features().contains(all()));
}

#[test]
fn missing_fault_served_by_copy_and_zeropage_with_thread_id() {
    let _serial = serial();
    let m = Map::new(2 * PAGE_SIZE);
    // Declared after the mappings: dropped first, so munmap raises no UNMAP event that
    // nobody would read.
    let u = Uffd::open(all(), Features::empty()).unwrap();
    // SAFETY: the mapping belongs to this test and is only accessed through read_u64.
    unsafe { u.register(m.addr, m.len, BOTH).unwrap() };
    let a = m.addr;
    let t = std::thread::spawn(move || {
        // SAFETY: gettid has no preconditions.
        let tid = unsafe { libc::gettid() } as u32;
        (read_u64(a), read_u64(a + PAGE_SIZE), tid)
    });
    let mut page = vec![0u8; PAGE_SIZE];
    page[..8].copy_from_slice(&0x1122_3344_5566_7788u64.to_ne_bytes());
    let ev = next_event(&u);
    let tid_seen = match ev {
        Event::Pagefault {
            addr,
            write,
            wp,
            thread_id,
        } => {
            assert_eq!((addr, write, wp), (a, false, false));
            thread_id
        }
        e => panic!("{e:?}"),
    };
    u.copy(a, &page, false, false).unwrap();
    // A second COPY to the same page reports that it is already there.
    assert!(matches!(
        u.copy(a, &page, false, false),
        Err(farmem_uffd::UffdError::Exists { .. })
    ));
    match next_event(&u) {
        Event::Pagefault { addr, .. } => assert_eq!(addr, a + PAGE_SIZE),
        e => panic!("{e:?}"),
    }
    u.zeropage(a + PAGE_SIZE, PAGE_SIZE, false).unwrap();
    let (x, y, tid) = t.join().unwrap();
    assert_eq!((x, y), (0x1122_3344_5566_7788, 0));
    assert_eq!(tid_seen, tid);
}

#[test]
fn fault_inside_read_syscall_is_served() {
    let _serial = serial();
    let m = Map::new(PAGE_SIZE);
    // Declared after the mappings: dropped first, so munmap raises no UNMAP event that
    // nobody would read.
    let u = Uffd::open(all(), Features::empty()).unwrap();
    // SAFETY: test-owned mapping only written by the kernel in read(2) below.
    unsafe { u.register(m.addr, m.len, BOTH).unwrap() };
    let mut fds = [0; 2];
    // SAFETY: pipe(2) with a 2-int array.
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
    // SAFETY: writing 5 bytes from a static buffer to our pipe.
    let written = unsafe { libc::write(fds[1], b"hello".as_ptr().cast(), 5) };
    assert_eq!(written, 5);
    let a = m.addr;
    let rfd = fds[0];
    // SAFETY: read(2) into the registered page; the fault is served by the main thread.
    let t = std::thread::spawn(move || unsafe { libc::read(rfd, a as *mut _, 5) });
    match next_event(&u) {
        Event::Pagefault { addr, write, .. } => assert_eq!((addr, write), (a, true)),
        e => panic!("{e:?}"),
    }
    u.copy(a, &vec![0u8; PAGE_SIZE], false, false).unwrap();
    assert_eq!(
        t.join().unwrap(),
        5,
        "read(2) into a registered page must succeed"
    );
    assert_eq!(
        read_u64(a) & 0xff_ffff_ffff,
        u64::from_ne_bytes(*b"hello\0\0\0")
    );
    // SAFETY: closing our pipe.
    unsafe {
        libc::close(fds[0]);
        libc::close(fds[1]);
    }
}

#[test]
fn write_protect_fault_then_unprotect_wakes_writer() {
    let _serial = serial();
    let m = Map::new(PAGE_SIZE);
    // Declared after the mappings: dropped first, so munmap raises no UNMAP event that
    // nobody would read.
    let u = Uffd::open(all(), Features::empty()).unwrap();
    // SAFETY: test-owned mapping.
    unsafe { u.register(m.addr, m.len, BOTH).unwrap() };
    u.copy(m.addr, &vec![7u8; PAGE_SIZE], false, true).unwrap();
    assert_eq!(
        read_u64(m.addr),
        0x0707_0707_0707_0707,
        "reads need no fault"
    );
    let a = m.addr;
    // SAFETY: volatile write to the test mapping.
    let t = std::thread::spawn(move || unsafe { std::ptr::write_volatile(a as *mut u64, 9) });
    match next_event(&u) {
        Event::Pagefault {
            addr, write, wp, ..
        } => assert_eq!((addr, write, wp), (a, true, true)),
        e => panic!("{e:?}"),
    }
    u.writeprotect(a, PAGE_SIZE, false, false).unwrap();
    t.join().unwrap();
    assert_eq!(read_u64(a), 9);
}

#[test]
fn move_takes_a_page_out_and_back_without_copy() {
    let _serial = serial();
    let region = Map::new(PAGE_SIZE);
    let pool = Map::new(PAGE_SIZE);
    // Declared after the mappings: dropped first, so munmap raises no UNMAP event that
    // nobody would read.
    let u = Uffd::open(all(), Features::empty()).unwrap();
    // The pool is registered with its own userfaultfd (no events), as the runtime does.
    let pool_uffd = Uffd::open(Features::MOVE | Features::SIGBUS, Features::empty()).unwrap();
    // SAFETY: both mappings belong to this test; no references into them.
    unsafe {
        u.register(region.addr, region.len, BOTH).unwrap();
        pool_uffd
            .register(
                pool.addr,
                pool.len,
                RegisterMode {
                    missing: true,
                    wp: false,
                },
            )
            .unwrap();
    }
    u.copy(region.addr, &vec![5u8; PAGE_SIZE], false, true)
        .unwrap();
    // SAFETY: the region page is owned by this test and no reference points into it.
    let moved = unsafe {
        pool_uffd
            .move_pages(pool.addr, region.addr, PAGE_SIZE, MoveMode::DONT_WAKE)
            .unwrap()
    };
    assert_eq!(moved, PAGE_SIZE);
    assert_eq!(read_u64(pool.addr), 0x0505_0505_0505_0505);
    // The region page is missing again: a reader faults, and MOVE brings the page back.
    let a = region.addr;
    let t = std::thread::spawn(move || read_u64(a));
    assert!(matches!(next_event(&u), Event::Pagefault { .. }));
    // SAFETY: the pool page is ours and nothing references it.
    unsafe {
        u.move_pages(a, pool.addr, PAGE_SIZE, MoveMode::WAKE)
            .unwrap()
    };
    assert_eq!(t.join().unwrap(), 0x0505_0505_0505_0505);
}

#[test]
fn release_events_remove_unmap_remap() {
    let _serial = serial();
    let m = Map::new(4 * PAGE_SIZE);
    // Declared after the mappings: dropped first, so munmap raises no UNMAP event that
    // nobody would read.
    let u = Uffd::open(all(), Features::empty()).unwrap();
    // SAFETY: test-owned mapping.
    unsafe { u.register(m.addr, m.len, BOTH).unwrap() };
    u.zeropage(m.addr, m.len, false).unwrap();
    let a = m.addr;
    // madvise blocks until the event is read: do it from another thread.
    // SAFETY: releasing pages of the test mapping.
    let t = std::thread::spawn(move || unsafe {
        libc::madvise(a as *mut _, PAGE_SIZE, libc::MADV_DONTNEED)
    });
    match next_event(&u) {
        Event::Remove { start, end } => assert_eq!((start, end), (a, a + PAGE_SIZE)),
        e => panic!("{e:?}"),
    }
    assert_eq!(t.join().unwrap(), 0);
    // A target area for the move (mremap with MREMAP_FIXED replaces it).
    let target = Map::new(2 * PAGE_SIZE);
    let target_addr = target.addr;
    std::mem::forget(target);
    // SAFETY: mremap of the last two pages of the test mapping onto the target area.
    let t = std::thread::spawn(move || unsafe {
        libc::mremap(
            (a + 2 * PAGE_SIZE) as *mut _,
            2 * PAGE_SIZE,
            2 * PAGE_SIZE,
            libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED,
            target_addr as *mut libc::c_void,
        ) as usize
    });
    // mremap with MREMAP_FIXED raises REMAP, and UNMAP for the replaced target: keep reading
    // until the mremap returns.
    let mut evs = Vec::new();
    for _ in 0..500 {
        if t.is_finished() {
            break;
        }
        u.wait_readable(10).unwrap();
        u.read_events(&mut evs).unwrap();
    }
    let to = t.join().unwrap();
    assert_eq!(to, target_addr);
    assert!(
        evs.iter()
            .any(|e| matches!(e, Event::Remap { from, to: t, len }
            if (*from, *t, *len) == (a + 2 * PAGE_SIZE, to, 2 * PAGE_SIZE))),
        "no REMAP event in {evs:?}"
    );
    // SAFETY: unmapping the pages the test created (the moved ones, then the second page).
    let t = std::thread::spawn(move || unsafe {
        libc::munmap(to as *mut _, 2 * PAGE_SIZE);
        libc::munmap((a + PAGE_SIZE) as *mut _, PAGE_SIZE)
    });
    let unmapped: Vec<(usize, usize)> = next_events(&u, 2)
        .into_iter()
        .map(|e| match e {
            Event::Unmap { start, end } => (start, end),
            e => panic!("{e:?}"),
        })
        .collect();
    assert_eq!(
        unmapped,
        [(to, to + 2 * PAGE_SIZE), (a + PAGE_SIZE, a + 2 * PAGE_SIZE)]
    );
    assert_eq!(t.join().unwrap(), 0);
    std::thread::sleep(Duration::from_millis(1));
}

#[test]
fn poisoned_page_raises_sigbus() {
    let _serial = serial();
    let m = Map::new(PAGE_SIZE);
    // Declared after the mappings: dropped first, so munmap raises no UNMAP event that
    // nobody would read.
    let u = Uffd::open(all(), Features::empty()).unwrap();
    // SAFETY: test-owned mapping.
    unsafe { u.register(m.addr, m.len, BOTH).unwrap() };
    u.poison(m.addr, PAGE_SIZE, false).unwrap();
    // SAFETY: the child only reads the poisoned page and exits; no allocation or locking.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0);
    if pid == 0 {
        let _ = read_u64(m.addr);
        // SAFETY: leaving the child without running the parent's destructors.
        unsafe { libc::_exit(0) };
    }
    let mut status = 0;
    // SAFETY: waiting for our own child.
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    assert!(
        libc::WIFSIGNALED(status) && libc::WTERMSIG(status) == libc::SIGBUS,
        "status {status:#x}"
    );
}

#[test]
fn unregister_wakes_and_stops_reporting() {
    let _serial = serial();
    let m = Map::new(PAGE_SIZE);
    // Declared after the mappings: dropped first, so munmap raises no UNMAP event that
    // nobody would read.
    let u = Uffd::open(all(), Features::empty()).unwrap();
    // SAFETY: test-owned mapping.
    unsafe { u.register(m.addr, m.len, BOTH).unwrap() };
    u.unregister(m.addr, m.len).unwrap();
    assert_eq!(
        read_u64(m.addr),
        0,
        "an unregistered page faults in normally"
    );
    assert!(!u.wait_readable(0).unwrap());
    // WAKE on a range nobody waits on is harmless.
    u.wake(m.addr, m.len).unwrap();
}

/// The kernel behaviour the runtime's fork design rests on: after fork (even once the child
/// has exited), MOVE refuses pages not written since (no longer exclusive: EBUSY) and accepts
/// pages written since (copy-on-write made them exclusive again).
#[test]
fn move_refuses_pages_shared_since_fork_until_written() {
    let _serial = serial();
    let region = Map::new(2 * PAGE_SIZE);
    let pool = Map::new(2 * PAGE_SIZE);
    let u = Uffd::open(all(), Features::empty()).unwrap();
    let pool_uffd = Uffd::open(Features::MOVE, Features::empty()).unwrap();
    // SAFETY: both mappings belong to this test; no references into them.
    unsafe {
        u.register(region.addr, region.len, BOTH).unwrap();
        let missing = RegisterMode {
            missing: true,
            wp: false,
        };
        pool_uffd.register(pool.addr, pool.len, missing).unwrap();
    }
    u.copy(region.addr, &vec![5u8; 2 * PAGE_SIZE], false, false)
        .unwrap();
    // SAFETY: the child exits at once without touching anything.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0);
    if pid == 0 {
        // SAFETY: leaving the child immediately.
        unsafe { libc::_exit(0) };
    }
    let mut status = 0;
    // SAFETY: reaping our own child.
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    // SAFETY: a store into the test's own mapping.
    unsafe { std::ptr::write_volatile(region.addr as *mut u64, 9) };
    // SAFETY: the region pages belong to this test and nothing references them.
    let (written, untouched) = unsafe {
        (
            pool_uffd.move_pages(pool.addr, region.addr, PAGE_SIZE, MoveMode::DONT_WAKE),
            pool_uffd.move_pages(
                pool.addr + PAGE_SIZE,
                region.addr + PAGE_SIZE,
                PAGE_SIZE,
                MoveMode::DONT_WAKE,
            ),
        )
    };
    assert_eq!(written.unwrap(), PAGE_SIZE);
    assert_eq!(untouched.unwrap_err().errno(), Some(libc::EBUSY));
}
