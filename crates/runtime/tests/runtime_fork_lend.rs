//! A fork that lends far pages (a process tree's fork): the parent does not bring them back,
//! freezes their far pages while a child maps the fork's hold, and a child without a runtime
//! of its own copies them in: from the host tier's slabs (a node in this process), or from
//! the donor, read as the parent's client (donors only, pages sealed). A donor asking for its
//! memory back gets the slabs a child reads only once the child is gone. Real userfaultfd, a
//! real `fork()`.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use farmem_node::{NodeConfig, NodeServer, RunningNode};
use farmem_runtime::{ForkPlan, Runtime, RuntimeConfig, SealMode, TierMode};
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

    let plan = prepare_lending(&rt, pages);
    assert!(plan.lent.as_ref().is_some_and(|l| l.donors().is_none()));
    let reader = Reader::fork(&rt, &plan, &[(a_base, pages, 1), (b_base, pages, 5)]);

    let other = change_all_while_the_child_waits(&rt, reader, a_base, b, pages);

    // The child is gone: its hold is dead, the node releases what the parent had freed, and
    // `b`'s far pages (deferred while frozen) are free again: new memory written past the
    // budget reuses them instead of placing new slabs.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while n.stats().holds > 0 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(n.stats().holds, 0, "{:?}", n.stats());
    std::thread::sleep(Duration::from_millis(300)); // a tier thread round: thawed
    let third = fill_reusing_thawed(&rt, pages, |s| s.tier_slabs);
    drop((a, other, third));
}

/// While `reader` waits, the parent rewrites every page of the region at `a_base` (evicted
/// again: to new far pages, the lent ones are frozen), releases `b` and fills new memory
/// (`b`'s far pages must not be reused while the child lives); then the child reads and
/// checks, and so does the parent. Returns the new memory.
fn change_all_while_the_child_waits(
    rt: &Arc<Runtime>,
    reader: Reader,
    a_base: usize,
    b: farmem_runtime::Region,
    pages: usize,
) -> farmem_runtime::Region {
    fill(a_base, pages, 2);
    drop(b);
    let (other, other_base, _) = filled(rt, 8 * MIB, 3);
    reader.release_and_check();
    assert_eq!(mismatches(a_base, pages, 2), 0);
    assert_eq!(mismatches(other_base, pages, 3), 0);
    other
}

/// Fills a new region of `pages` pages once the child is gone and its far pages are thawed:
/// the far pages freed while they were frozen are reused, so at most one more slab (counted
/// by `slabs`) is placed.
fn fill_reusing_thawed(
    rt: &Arc<Runtime>,
    pages: usize,
    slabs: fn(&farmem_runtime::Stats) -> u64,
) -> farmem_runtime::Region {
    let before = slabs(&rt.stats());
    let (third, third_base, _) = filled(rt, 8 * MIB, 4);
    assert_eq!(mismatches(third_base, pages, 4), 0);
    let after = slabs(&rt.stats());
    assert!(
        after <= before + 1,
        "far pages freed while frozen are reused after the thaw: {before} -> {after} slabs"
    );
    third
}

/// Prepares a lending fork of two regions of `pages` pages each, mostly far: at least one
/// region's worth lent, not brought back.
fn prepare_lending(rt: &Arc<Runtime>, pages: usize) -> ForkPlan {
    let plan = rt.prepare_fork(true);
    let lent = plan.lent.as_ref().expect("far pages are lent");
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
    plan
}

/// A runtime paging to `donor` only (no host tier), pages sealed.
fn donor_runtime(donor: &farmem_donor::RunningDonor) -> Arc<Runtime> {
    start(RuntimeConfig {
        budget_bytes: 2 * MIB,
        prefetch: "none".into(),
        tier: TierMode::Off,
        donors: vec![donor.local_addr().to_string()],
        seal: SealMode::On,
        ..RuntimeConfig::default()
    })
}

/// A forked child without a runtime of its own that, once released, copies in what `lent`
/// lent and checks `regions` (start, pages, stamp) as at the fork.
struct Reader {
    pid: libc::pid_t,
    go: i32,
}

impl Reader {
    fn fork(rt: &Arc<Runtime>, plan: &ForkPlan, regions: &[(usize, usize, u64)]) -> Reader {
        let lent = plan.lent.clone().expect("pages were lent");
        let mut go = [0i32; 2];
        // SAFETY: a pipe into a local array of two fds.
        assert_eq!(unsafe { libc::pipe(go.as_mut_ptr()) }, 0);
        // SAFETY: the child reads from the donor over new connections (the parent's donor
        // server threads serve it), copies pages in, waits on a pipe and leaves with _exit.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork failed");
        if pid == 0 {
            rt.after_fork_child();
            let mut byte = [0u8; 1];
            // SAFETY: closing the parent's end (so a parent that fails ends the wait), then
            // reading one byte from the pipe into a local buffer.
            unsafe {
                libc::close(go[1]);
                libc::read(go[0], byte.as_mut_ptr().cast(), 1);
            }
            let copied = lent.copy_in();
            let want: usize = regions.iter().map(|r| r.1).sum();
            let bad: usize = regions.iter().map(|&(b, n, r)| mismatches(b, n, r)).sum();
            let code = if copied < want / 2 {
                254
            } else {
                bad.min(253) as i32
            };
            // SAFETY: leaving the child without running the parent's destructors.
            unsafe { libc::_exit(code) };
        }
        rt.after_fork_parent_with(Some(plan));
        // SAFETY: closing the read end the child uses.
        unsafe { libc::close(go[0]) };
        Reader { pid, go: go[1] }
    }

    /// Lets the child read, and waits for its verdict.
    fn release_and_check(self) {
        // SAFETY: one byte to the child, then reaping it and closing our end.
        unsafe { libc::write(self.go, b"g".as_ptr().cast(), 1) };
        let mut status = 0;
        // SAFETY: reaping our own child.
        assert_eq!(unsafe { libc::waitpid(self.pid, &mut status, 0) }, self.pid);
        // SAFETY: closing our write end.
        unsafe { libc::close(self.go) };
        assert!(
            libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
            "the child read pages changed after the fork, or could not read them (status \
             {status:#x}: 254 = too few copied, else that many wrong)"
        );
    }
}

/// The same with donors only (no host tier), pages sealed: the parent leaves its remote pages
/// on the donor; a child without a runtime reads them there as the parent's client, opened
/// with the parent's key as they were at the fork, while the parent rewrites and releases
/// them; once the child is gone the frozen far pages are reused (no new donor slab).
#[test]
fn pages_on_donors_are_lent_and_read_there_as_they_were_at_the_fork() {
    let donor = farmem_testkit::donor::in_process(256 * MIB, MIB);
    let rt = donor_runtime(&donor);
    let (a, a_base, pages) = filled(&rt, 8 * MIB, 1);
    let (b, b_base, _) = filled(&rt, 8 * MIB, 5);

    let plan = prepare_lending(&rt, pages);
    let lent = plan.lent.as_ref().expect("checked above");
    assert!(lent.donors().is_some(), "lent on donors: {lent:?}");
    let reader = Reader::fork(&rt, &plan, &[(a_base, pages, 1), (b_base, pages, 5)]);

    let other = change_all_while_the_child_waits(&rt, reader, a_base, b, pages);

    // The child is gone: its hold is dead; within a heal-thread round (250 ms) the far
    // pages frozen for it are thawed, and `b`'s (freed meanwhile) are reused by new memory
    // instead of new slabs.
    std::thread::sleep(Duration::from_millis(800));
    let third = fill_reusing_thawed(&rt, pages, |s| s.slabs_placed);
    drop((a, other, third));
}

/// A donor asking for its memory back while a child reads pages lent there: the parent moves
/// none of those slabs until the child is gone (moved and freed, the child's reads would
/// fail), then gives them all back, losing nothing.
#[test]
fn slabs_a_child_reads_are_given_back_to_the_donor_only_once_the_child_is_gone() {
    let donor = farmem_testkit::donor::in_process(256 * MIB, MIB);
    let rt = donor_runtime(&donor);
    let (a, a_base, pages) = filled(&rt, 8 * MIB, 6);
    let plan = rt.prepare_fork(true);
    let reader = Reader::fork(&rt, &plan, &[(a_base, pages, 6)]);

    let used = donor.store().used_bytes();
    donor.control().set_capacity_bytes(MIB).unwrap();
    // A dozen reclaim polls: the lent slabs stay on the donor.
    std::thread::sleep(Duration::from_secs(3));
    assert!(
        donor.store().used_bytes() + 2 * MIB >= used,
        "slabs a child reads were taken from the donor: {} of {used} bytes left",
        donor.store().used_bytes()
    );
    reader.release_and_check();

    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while donor.store().used_bytes() > MIB && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    let s = rt.stats();
    assert!(
        donor.store().used_bytes() <= MIB && s.slabs_migrated > 0,
        "given back once the child was gone: {} bytes used, {s:?}",
        donor.store().used_bytes()
    );
    assert_eq!(mismatches(a_base, pages, 6), 0, "pages lost in the move");
    drop(a);
}
