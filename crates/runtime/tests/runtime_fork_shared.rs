//! The paging runtime after a fork whose child stays alive: the pages brought back before the
//! fork are shared copy-on-write with the child, UFFDIO_MOVE refuses them (EBUSY), and the
//! parent still has to page past its budget (dropping shared pages, even while it rewrites
//! them) without hanging, losing a write or changing what the child sees; and a fork while other threads' faults are being served from the donor (the
//! child must get those pages too). Real userfaultfd, a donor in this process on loopback, real
//! forked children.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use farmem_runtime::{Runtime, RuntimeConfig};
use farmem_testkit::donor::in_process;
use farmem_testkit::pages::{fill, mismatches, read_u64, word, MIB, PAGE};
use farmem_testkit::runtime::{config, start, wait_for_stats};

/// Far beyond what the work below needs on a loaded 2-core machine; only a hang reaches it.
const HANG_LIMIT: Duration = Duration::from_secs(120);

/// Waits until resident pages are back within the budget, or `HANG_LIMIT`.
fn wait_within_budget(rt: &Runtime) -> farmem_runtime::Stats {
    wait_for_stats(rt, HANG_LIMIT, Duration::from_millis(20), |s| {
        s.resident_pages <= s.budget_pages
    })
}

/// What the parent's side of the scenario reports to the watching test thread.
enum Step {
    Forked(libc::pid_t),
    Done(Result<(), String>),
}

/// The parent: evicted data, before_fork, fork a child that checks the data, stays alive
/// until told, and checks it again; meanwhile the parent writes a second region past its
/// budget (faults need the evictor, whose only victims are pages shared with the child),
/// reads everything back, and returns within the budget.
fn scenario(donor: String, tx: mpsc::Sender<Step>) -> Result<(), String> {
    let budget = MIB;
    let rt: Arc<Runtime> =
        Runtime::start(config(budget, vec![donor])).map_err(|e| format!("runtime start: {e}"))?;
    let a = rt.map(4 * budget).map_err(|e| format!("map: {e}"))?;
    let (a_base, a_pages) = (a.as_ptr() as usize, a.len() / PAGE);
    fill(a_base, a_pages, 1);
    let s = rt.stats();
    if s.resident_pages >= a_pages as u64 {
        return Err(format!("no page was evicted before the fork: {s:?}"));
    }
    let mut fds = [0; 2];
    // SAFETY: pipe writes two fds into the array.
    if unsafe { libc::pipe(fds.as_mut_ptr()) } != 0 {
        return Err("pipe failed".into());
    }
    rt.before_fork();
    // SAFETY: the child only reads memory, calls the allocation-free `after_fork_child`, reads
    // from a pipe and leaves with _exit.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        rt.after_fork_child();
        // SAFETY: closing the child's copy of the pipe's write end.
        unsafe { libc::close(fds[1]) };
        let before = mismatches(a_base, a_pages, 1);
        let mut b = [0u8; 1];
        // SAFETY: reading into a local byte; returns 0 when the parent closes its end.
        unsafe { libc::read(fds[0], b.as_mut_ptr().cast(), 1) };
        let after = mismatches(a_base, a_pages, 1);
        // SAFETY: leaving the child without running the parent's destructors.
        unsafe {
            libc::_exit(if before != 0 {
                1
            } else if after != 0 {
                2
            } else {
                0
            })
        };
    }
    rt.after_fork_parent();
    if pid < 0 {
        return Err("fork failed".into());
    }
    let _ = tx.send(Step::Forked(pid));
    // SAFETY: closing the parent's copy of the pipe's read end.
    unsafe { libc::close(fds[0]) };
    let brought_back = rt.stats();
    // Every page of A is resident and shared with the child now. Page a second region past
    // the budget: each new page needs room, and the only victims are shared pages.
    let b = rt.map(2 * budget).map_err(|e| format!("map: {e}"))?;
    let (b_base, b_pages) = (b.as_ptr() as usize, b.len() / PAGE);
    fill(b_base, b_pages, 2);
    let s = wait_within_budget(&rt);
    if s.resident_pages > s.budget_pages {
        return Err(format!(
            "resident memory did not return within the budget while the child shares the \
             pages (resident {} after fork, now {s:?})",
            brought_back.resident_pages
        ));
    }
    // Read everything back (from the pool and the donor) while the child is alive.
    let bad_a = mismatches(a_base, a_pages, 1);
    let bad_b = mismatches(b_base, b_pages, 2);
    if bad_a != 0 || bad_b != 0 {
        return Err(format!(
            "the parent's data is wrong with the child alive: {bad_a} pages of A, {bad_b} of B"
        ));
    }
    // Rewrite A while the child still shares its pages: the evictor drops shared victims
    // while these writes fault and need room, and a write to a page being dropped must land
    // (it waits until the page is gone, then faults it back). The child keeps seeing A as it
    // was at the fork.
    fill(a_base, a_pages, 4);
    if mismatches(a_base, a_pages, 4) != 0 {
        return Err("a write to A was lost while its shared pages were being dropped".into());
    }
    // Let the child check its copy again and exit.
    // SAFETY: closing the write end wakes the child's read with end-of-file.
    unsafe { libc::close(fds[1]) };
    let mut status = 0;
    // SAFETY: reaping our own child.
    if unsafe { libc::waitpid(pid, &mut status, 0) } != pid {
        return Err("waitpid failed".into());
    }
    if !libc::WIFEXITED(status) || libc::WEXITSTATUS(status) != 0 {
        return Err(format!(
            "the child saw wrong data (status {status:#x}: exit 1 = wrong at once, 2 = wrong \
             after the parent paged)"
        ));
    }
    // The child is gone, but pages it shared stay non-exclusive until written: the parent
    // reads A (faulting its evicted pages back while B's pages and the still-shared ones must
    // make room) and pages B again.
    if mismatches(a_base, a_pages, 4) != 0 {
        return Err("A changed after the child exited".into());
    }
    fill(b_base, b_pages, 3);
    if mismatches(b_base, b_pages, 3) != 0 || mismatches(a_base, a_pages, 4) != 0 {
        return Err("data wrong when paging after the child exited".into());
    }
    let s = wait_within_budget(&rt);
    if s.resident_pages > s.budget_pages {
        return Err(format!("resident memory stays above the budget: {s:?}"));
    }
    if s.fetch_errors != 0 || s.send_errors != 0 {
        return Err(format!("the runtime recorded errors: {s:?}"));
    }
    // Shared pages were evicted by dropping them from this process, not by copying them.
    if s.shared_pages_dropped == 0 {
        return Err(format!("no shared page was dropped: {s:?}"));
    }
    Ok(())
}

#[test]
fn parent_pages_past_its_budget_while_a_forked_child_shares_its_pages() {
    let donor = in_process(64 << 20, 1 << 20);
    let (tx, rx) = mpsc::channel();
    let addr = donor.local_addr().to_string();
    let tx2 = tx.clone();
    std::thread::spawn(move || {
        let r = scenario(addr, tx2.clone());
        let _ = tx2.send(Step::Done(r));
    });
    drop(tx);
    let deadline = Instant::now() + HANG_LIMIT * 2;
    let mut child = None;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(Step::Forked(pid)) => child = Some(pid),
            Ok(Step::Done(Ok(()))) => return,
            Ok(Step::Done(Err(e))) => panic!("{e}"),
            Err(_) => {
                if let Some(pid) = child {
                    // SAFETY: killing our own forked child so it does not outlive the test.
                    unsafe { libc::kill(pid, libc::SIGKILL) };
                }
                panic!(
                    "HANG: the parent did not finish paging within {:?} while its forked child \
                     shares the pages brought back before the fork (faults waiting for an \
                     evictor that cannot move shared pages?)",
                    HANG_LIMIT * 2
                );
            }
        }
    }
}

/// Forks while two other threads keep faulting evicted pages in from a donor with an emulated
/// 2 ms link (so a fault is often in flight, its page `Fetching`, when `before_fork` runs). The
/// child checks every page: a page skipped by the bring-back because its fetch was in flight
/// would be missing at fork and read as zeros there.
#[test]
fn fork_while_other_threads_fetch_pages_gives_the_child_every_page() {
    let donor = in_process(64 << 20, 1 << 20);
    let budget = MIB;
    let rt: Arc<Runtime> = start(RuntimeConfig {
        pool_bytes: Some(16 * PAGE as u64),
        link_delay_us: 2000,
        ..config(budget, vec![donor.local_addr().to_string()])
    });
    let region = rt.map(2 * budget).unwrap();
    let (base, pages) = (region.as_ptr() as usize, region.len() / PAGE);
    fill(base, pages, 5);
    let stop = Arc::new(AtomicBool::new(false));
    let readers: Vec<_> = (0..2)
        .map(|t| {
            let stop = stop.clone();
            std::thread::spawn(move || {
                // Walk the pages downwards (the bring-back goes upwards, so these meet the
                // pages it reaches last), each reader from its own offset; count wrong pages.
                let mut bad = 0usize;
                let mut p = pages - 1 - t * 7;
                while !stop.load(Ordering::Relaxed) {
                    if read_u64(base + p * PAGE) != word(p, 5) {
                        bad += 1;
                    }
                    p = if p == 0 { pages - 1 } else { p - 1 };
                }
                bad
            })
        })
        .collect();
    let mut failures = Vec::new();
    for round in 0..6 {
        std::thread::sleep(Duration::from_millis(30));
        rt.before_fork();
        // SAFETY: the child only reads memory, calls the allocation-free `after_fork_child`
        // and leaves with _exit.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            rt.after_fork_child();
            let bad = mismatches(base, pages, 5);
            // SAFETY: leaving the child without running the parent's destructors.
            unsafe { libc::_exit(bad.min(255) as i32) };
        }
        rt.after_fork_parent();
        assert!(pid > 0, "fork failed");
        let mut status = 0;
        // SAFETY: reaping our own child.
        assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
        if !libc::WIFEXITED(status) || libc::WEXITSTATUS(status) != 0 {
            failures.push(format!(
                "round {round}: the child saw {} wrong pages (status {status:#x})",
                libc::WEXITSTATUS(status)
            ));
        }
        // Let the parent evict again (the pages the readers touch next are evicted ones).
        fill(base, pages, 5);
    }
    stop.store(true, Ordering::Relaxed);
    let bad_reads: usize = readers.into_iter().map(|r| r.join().unwrap()).sum();
    let s = rt.stats();
    assert!(failures.is_empty(), "{failures:?}; {s:?}");
    assert_eq!(bad_reads, 0, "the reader threads saw wrong data");
    assert_eq!(s.fetch_errors, 0, "the runtime recorded errors: {s:?}");
    assert_eq!(mismatches(base, pages, 5), 0);
}
