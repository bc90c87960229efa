//! The paging runtime across fork, with a stalled or dead donor, and with several donors
//! (placement). Real userfaultfd, real `farmem donor` processes on loopback.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use farmem_runtime::{Runtime, RuntimeConfig};

const PAGE: usize = 4096;
const MIB: usize = 1 << 20;

fn farmem() -> std::path::PathBuf {
    std::path::PathBuf::from(env!("CARGO_BIN_EXE_farmem"))
}

struct Donor {
    child: Child,
    addr: String,
}

impl Donor {
    fn start(capacity: &str, slab: &str) -> Donor {
        let mut child = Command::new(farmem())
            .args(["donor", "--listen", "127.0.0.1:0", "--capacity", capacity])
            .args(["--slab-size", slab])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawning farmem donor");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let addr = line
            .trim()
            .strip_prefix("farmem donor listening on ")
            .unwrap_or_else(|| panic!("unexpected donor output {line:?}"))
            .to_string();
        Donor { child, addr }
    }

    fn signal(&self, sig: i32) {
        // SAFETY: signalling our own child process.
        unsafe { libc::kill(self.child.id() as i32, sig) };
    }
}

impl Drop for Donor {
    fn drop(&mut self) {
        self.signal(libc::SIGCONT);
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn word(p: usize, r: u64) -> u64 {
    ((p as u64) << 20) ^ r.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1
}

fn write_u64(addr: usize, v: u64) {
    // SAFETY: callers pass addresses inside regions the test owns and keeps alive.
    unsafe { (addr as *mut u64).write_volatile(v) }
}

fn read_u64(addr: usize) -> u64 {
    // SAFETY: callers pass addresses inside regions the test owns and keeps alive.
    unsafe { (addr as *const u64).read_volatile() }
}

fn fill(base: usize, pages: usize, r: u64) {
    for p in 0..pages {
        write_u64(base + p * PAGE, word(p, r));
        write_u64(base + p * PAGE + PAGE - 8, word(p, r) ^ 0xff);
    }
}

/// Number of pages whose two stamped words are not round `r`'s (allocation-free: used in a
/// forked child).
fn mismatches(base: usize, pages: usize, r: u64) -> usize {
    (0..pages)
        .filter(|p| {
            read_u64(base + p * PAGE) != word(*p, r)
                || read_u64(base + p * PAGE + PAGE - 8) != word(*p, r) ^ 0xff
        })
        .count()
}

fn runtime(budget: usize, donors: Vec<String>) -> Arc<Runtime> {
    Runtime::start(RuntimeConfig {
        budget_bytes: budget as u64,
        donors,
        farmem_bin: Some(farmem()),
        prefetch: "none".into(),
        ..RuntimeConfig::default()
    })
    .expect("runtime starts")
}

#[test]
fn fork_child_sees_all_data_as_plain_memory_and_parent_goes_on() {
    let budget = MIB;
    let donor = Donor::start("64MiB", "1MiB");
    let rt = runtime(budget, vec![donor.addr.clone()]);
    let region = rt.map(4 * budget).unwrap();
    let base = region.as_ptr() as usize;
    let pages = region.len() / PAGE;
    fill(base, pages, 1);
    assert!(
        rt.stats().resident_pages < pages as u64,
        "pages must be evicted"
    );
    rt.before_fork();
    // Every page is local now (the state is held until after fork: a fault here would hang,
    // so mincore checks first).
    let mut v = vec![0u8; pages];
    // SAFETY: mincore writes one byte per page of the region into `v`.
    let r = unsafe { libc::mincore(base as *mut _, pages * PAGE, v.as_mut_ptr()) };
    assert_eq!(r, 0);
    let missing = v.iter().filter(|b| **b & 1 == 0).count();
    assert_eq!(missing, 0, "pages still evicted after before_fork");
    let parent_bad = mismatches(base, pages, 1);
    // SAFETY: the child only reads memory, calls the allocation-free `after_fork_child`, and
    // leaves with _exit.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork failed");
    if pid == 0 {
        rt.after_fork_child();
        let bad = mismatches(base, pages, 1);
        // SAFETY: leaving the child without running the parent's destructors.
        unsafe { libc::_exit(bad.min(255) as i32) };
    }
    rt.after_fork_parent();
    assert_eq!(
        parent_bad, 0,
        "the parent's data is wrong after before_fork"
    );
    let mut status = 0;
    // SAFETY: reaping our own child.
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "the child saw wrong data (status {status:#x})"
    );
    // The parent pages again: new data over 4x the budget (written pages are exclusive again,
    // so they can be evicted), read back, and resident memory returns within the budget.
    fill(base, pages, 2);
    assert_eq!(mismatches(base, pages, 2), 0);
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let s = loop {
        let s = rt.stats();
        if s.resident_pages <= s.budget_pages || std::time::Instant::now() > deadline {
            break s;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(s.resident_pages <= s.budget_pages, "{s:?}");
    assert_eq!(mismatches(base, pages, 2), 0);
}

#[test]
fn several_donors_share_the_slabs() {
    let budget = 2 * MIB;
    let donors: Vec<Donor> = (0..3).map(|_| Donor::start("64MiB", "1MiB")).collect();
    let rt = runtime(budget, donors.iter().map(|d| d.addr.clone()).collect());
    let region = rt.map(16 * budget).unwrap();
    let base = region.as_ptr() as usize;
    let pages = region.len() / PAGE;
    fill(base, pages, 3);
    assert_eq!(mismatches(base, pages, 3), 0);
    let per = rt.slabs_per_donor();
    let s = rt.stats();
    assert_eq!(per.iter().sum::<u64>(), s.slabs_placed, "{per:?}");
    assert!(s.slabs_placed >= 20, "{s:?}");
    let (min, max) = (per.iter().min().unwrap(), per.iter().max().unwrap());
    assert!(
        max - min <= 3,
        "power of two choices should balance the slabs: {per:?}"
    );
}

/// The stalled/dead-donor scenario, run in a separate process (it ends with SIGBUS) by
/// `stalled_donor_gives_sigbus_not_a_hang` / `dead_donor_gives_sigbus_not_a_hang`.
#[test]
#[ignore = "helper process of the donor failure tests"]
fn donor_failure_scenario() {
    let addr = std::env::var("FARMEM_TEST_DONOR").expect("run by the donor failure tests");
    let budget = MIB;
    let rt = Runtime::start(RuntimeConfig {
        budget_bytes: budget as u64,
        donors: vec![addr],
        pool_bytes: Some(16 * PAGE as u64),
        request_timeout: Duration::from_millis(500),
        fetch_attempts: 2,
        prefetch: "none".into(),
        ..RuntimeConfig::default()
    })
    .unwrap();
    let region = rt.map(4 * budget).unwrap();
    let base = region.as_ptr() as usize;
    let pages = region.len() / PAGE;
    fill(base, pages, 4);
    // Wait until everything evicted is on the donor.
    let mut last = u64::MAX;
    loop {
        std::thread::sleep(Duration::from_millis(100));
        let s = rt.stats();
        if s.evicted_sent_dirty == last {
            break;
        }
        last = s.evicted_sent_dirty;
    }
    println!("READY");
    std::io::stdout().flush().unwrap();
    let mut line = String::new();
    std::io::stdin().read_line(&mut line).unwrap();
    // Page 0 was evicted first and is only on the (now unusable) donor.
    let v = read_u64(base);
    println!("READ {v:#x}");
    std::process::exit(0);
}

fn donor_failure(sig: i32) {
    let donor = Donor::start("64MiB", "1MiB");
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "donor_failure_scenario",
            "--ignored",
            "--nocapture",
        ])
        .env("FARMEM_TEST_DONOR", &donor.addr)
        .env("FARMEM_LOG", "error")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    loop {
        line.clear();
        assert!(
            out.read_line(&mut line).unwrap() > 0,
            "scenario ended early"
        );
        if line.trim() == "READY" {
            break;
        }
    }
    donor.signal(sig);
    writeln!(child.stdin.take().unwrap(), "GO").unwrap();
    // Bounded: 2 tries of 500 ms each, plus slack; a hang fails here.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            panic!("the faulting process hung on an unusable donor");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut rest = String::new();
    let _ = std::io::Read::read_to_string(&mut out, &mut rest);
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(
        status.signal(),
        Some(libc::SIGBUS),
        "expected SIGBUS, got {status}; stdout: {rest}"
    );
}

#[test]
fn stalled_donor_gives_sigbus_not_a_hang() {
    donor_failure(libc::SIGSTOP);
}

#[test]
fn dead_donor_gives_sigbus_not_a_hang() {
    donor_failure(libc::SIGKILL);
}
