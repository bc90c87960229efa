//! A fork that lends host-tier pages (a process tree's fork): the parent does not bring them
//! back, freezes their far pages while a child maps the hold, and a child without a runtime of
//! its own copies them in. Real userfaultfd, a real `fork()`, a node in this process.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use farmem_node::{NodeConfig, NodeServer, RunningNode};
use farmem_runtime::{Runtime, RuntimeConfig, TierMode};
use farmem_testkit::pages::{fill, mismatches};
use farmem_testkit::runtime::start;

const MIB: u64 = 1 << 20;
const PAGE: usize = 4096;

fn node(dir: &Path) -> RunningNode {
    NodeServer::bind(NodeConfig {
        socket_path: dir.join("node.sock"),
        capacity_bytes: 256 * MIB,
        slab_bytes: MIB,
        ..NodeConfig::default()
    })
    .unwrap_or_else(|e| panic!("the node did not start: {e}"))
    .spawn()
}

fn runtime(budget: u64, socket: &Path) -> Arc<Runtime> {
    start(RuntimeConfig {
        budget_bytes: budget,
        prefetch: "none".into(),
        tier: TierMode::Node(socket.to_path_buf()),
        ..RuntimeConfig::default()
    })
}

/// Maps `bytes` and fills every page with stamp `r`: (region, start, pages).
fn filled(rt: &Arc<Runtime>, bytes: u64, r: u64) -> (farmem_runtime::Region, usize, usize) {
    let region = rt.map(bytes as usize).unwrap();
    let (base, pages) = (region.as_ptr() as usize, region.len() / PAGE);
    fill(base, pages, r);
    (region, base, pages)
}

#[test]
fn lent_pages_stay_in_the_tier_and_stay_as_they_were_while_the_child_lives() {
    let dir = tempfile::tempdir().unwrap();
    let n = node(dir.path());
    let rt = runtime(2 * MIB, n.socket_path());
    let (a, a_base, pages) = filled(&rt, 8 * MIB, 1);
    let (b, b_base, _) = filled(&rt, 8 * MIB, 5);
    assert_eq!(
        mismatches(a_base, pages, 1) + mismatches(b_base, pages, 5),
        0
    );

    let plan = rt.prepare_fork(true);
    let lent = plan.lent.clone().expect("pages in the tier are lent");
    // Most of both regions is far: lent, not brought back.
    assert!(
        lent.pages() >= pages,
        "{} of {} lent",
        lent.pages(),
        2 * pages
    );
    let s = rt.stats();
    assert!(
        (s.resident_pages as usize) < pages,
        "brought back for the fork: {s:?}"
    );
    assert!(lent.floor() > 0);
    assert!(s.fork_pages_lent >= pages as u64, "{s:?}");
    let mut go = [0i32; 2];
    // SAFETY: a pipe into a local array of two fds.
    assert_eq!(unsafe { libc::pipe(go.as_mut_ptr()) }, 0);
    // SAFETY: the child only reads and copies memory (no allocation), waits on a pipe and
    // leaves with _exit.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork failed");
    if pid == 0 {
        rt.after_fork_child();
        let mut byte = [0u8; 1];
        // SAFETY: reading one byte from the pipe into a local buffer.
        unsafe { libc::read(go[0], byte.as_mut_ptr().cast(), 1) };
        // The parent has rewritten `a` and released `b` by now.
        lent.copy_in();
        let bad = mismatches(a_base, pages, 1) + mismatches(b_base, pages, 5);
        // SAFETY: leaving the child without running the parent's destructors.
        unsafe { libc::_exit(bad.min(255) as i32) };
    }
    rt.after_fork_parent_with(Some(&plan));
    // SAFETY: closing the read end the child uses.
    unsafe { libc::close(go[0]) };

    // The parent rewrites every page of `a` (evicted again: to new far pages, the lent ones
    // are frozen), releases `b` and fills new memory (`b`'s far pages must not be reused while
    // the child lives).
    fill(a_base, pages, 2);
    drop(b);
    let (other, other_base, _) = filled(&rt, 8 * MIB, 3);
    // SAFETY: one byte to the child, then reaping it.
    unsafe { libc::write(go[1], b"g".as_ptr().cast(), 1) };
    let mut status = 0;
    // SAFETY: reaping our own child.
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "the child read pages changed after the fork (status {status:#x}: that many wrong, \
         at most 255)"
    );
    assert_eq!(mismatches(a_base, pages, 2), 0);
    assert_eq!(mismatches(other_base, pages, 3), 0);

    // The child is gone: its hold is dead, the node releases what the parent had freed, and
    // `b`'s far pages (deferred while frozen) are free again: new memory written past the
    // budget reuses them instead of placing new slabs.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while n.stats().holds > 0 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(n.stats().holds, 0, "{:?}", n.stats());
    std::thread::sleep(Duration::from_millis(300)); // a tier thread round: thawed
    let before = rt.stats().tier_slabs;
    let (third, third_base, _) = filled(&rt, 8 * MIB, 4);
    assert_eq!(mismatches(third_base, pages, 4), 0);
    let after = rt.stats().tier_slabs;
    assert!(
        after <= before + 1,
        "far pages freed while frozen are reused after the thaw: {before} -> {after} tier slabs"
    );
    drop((a, other, third));
    // SAFETY: closing our write end.
    unsafe { libc::close(go[1]) };
}
