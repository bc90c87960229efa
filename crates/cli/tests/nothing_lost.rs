//! Real programs under `farmem run` survive donor failures (docs/architecture.md, "Nothing
//! lost"): each donor runs in a network namespace of its own (testkit's `HostDonor`) and is
//! crashed (SIGKILL), stalled (SIGSTOP), cut off (link down), restarted empty or resumed with
//! stale pages while redis-server, a numpy job or a C program keeps reading and checking its
//! data. Every test checks the data (every redis key, the numpy result against the same job
//! without farmem, every word of the C program's working set) and the mechanism in the stats
//! file (the dead donor and its cause, slab copies re-made, reads failed over, pages read from
//! the backup file), never timings. A donor asked for its memory back (its capacity lowered, its
//! host short of memory) gets it while the program runs on, unaffected (the donor's lent and
//! resident memory, the slabs the runtime migrated).
//!
//! Working sets are 96–128 MiB at 32 MiB of local memory, on donors with 4 MiB slabs, so there
//! are dozens of slabs to re-replicate.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use farmem_runtime::{Stats, StatsFile};
use farmem_testkit::clients::*;
use farmem_testkit::netns::{Host, HostDonor};
use farmem_testkit::run::*;
use farmem_transport::{ClientConfig, DonorClient, DonorStats};

const LOCAL_MEM: &str = "32MiB";
const SLAB: &str = "4MiB";
const CAPACITY: &str = "512MiB";
/// How long a failure may take to be detected and healed on this loaded 2-core machine
/// (detection of a stall or cut link alone takes the request timeout plus a probe, ~10 s).
const RECOVERY: Duration = Duration::from_secs(120);

// ---------------------------------------------------------------------------------------------
// donors and runs

/// `n` donors, each in a host of its own, sharing one token (`farmem run` takes one
/// `--token-file`). Started on the test's thread: a donor dies with the thread that started it.
fn donors(n: usize) -> Vec<HostDonor> {
    let token = run_token();
    (0..n)
        .map(|_| HostDonor::start_with_token(CAPACITY, SLAB, token.as_bytes()))
        .collect()
}

/// A fresh token for the donors of one run.
fn run_token() -> String {
    static RUNS: AtomicU32 = AtomicU32::new(0);
    format!(
        "nothing-lost-{}-{}",
        std::process::id(),
        RUNS.fetch_add(1, Ordering::Relaxed)
    )
}

/// A donor started with `args` (besides `--slab-size`), then `n - 1` plain ones, all sharing
/// one token.
fn donors_first_with(n: usize, args: &[&str]) -> Vec<HostDonor> {
    let token = run_token();
    let mut first = args.to_vec();
    first.extend(["--slab-size", SLAB]);
    let mut ds = vec![HostDonor::spawn_with_token(
        Host::new(),
        &first,
        token.clone().into_bytes(),
    )];
    ds.extend((1..n).map(|_| HostDonor::start_with_token(CAPACITY, SLAB, token.as_bytes())));
    ds
}

/// `farmem run`'s options: the donors, their token, the stats file, then `extra`.
fn run_args(donors: &[HostDonor], stats: &Path, extra: &[&str]) -> Vec<String> {
    let mut a: Vec<String> = vec!["--local-mem".into(), LOCAL_MEM.into()];
    for d in donors {
        a.push("--donor".into());
        a.push(d.addr().to_string());
    }
    a.push("--token-file".into());
    a.push(donors[0].token_file().to_str().unwrap().into());
    a.push("--stats".into());
    a.push(stats.to_str().unwrap().into());
    a.extend(extra.iter().map(|s| s.to_string()));
    a
}

fn strs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

/// The runtime's counters in the stats file, if it has been written yet (it is replaced
/// atomically every second, and at exit).
fn runtime_stats(path: &Path) -> Option<Stats> {
    let text = std::fs::read_to_string(path).ok()?;
    let f: StatsFile = serde_json::from_str(&text)
        .unwrap_or_else(|e| panic!("the stats file does not parse ({e}): {text}"));
    f.runtime
}

/// The stats file written at exit.
fn final_stats(path: &Path) -> StatsFile {
    let test = std::thread::current().name().unwrap_or("?").to_string();
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("reading the stats file {}: {e}", path.display()));
    let f: StatsFile = serde_json::from_str(&text)
        .unwrap_or_else(|e| panic!("the stats file does not parse ({e}): {text}"));
    assert!(f.is_final, "the stats file was not written at exit: {text}");
    if let Some(s) = &f.runtime {
        report(&test, s);
    }
    f
}

/// Prints the failure figures (seen with `--nocapture`).
fn report(test: &str, s: &Stats) {
    eprintln!(
        "{test}: dead {:?}, failovers {}, slabs healed {} ({} MiB, last in {:?} s), degraded \
         {}, lost {}, backup pages written {} read {}, fetch errors {}",
        s.dead_donors,
        s.failovers,
        s.slabs_healed,
        s.heal_bytes >> 20,
        s.last_heal_s,
        s.slabs_degraded,
        s.slabs_lost,
        s.backup_pages_written,
        s.backup_pages_read,
        s.fetch_errors
    );
}

/// Whether the stats list `d` as dead for `cause` ("crash", "stall", "partition", "restart").
fn dead_as(s: &Stats, d: &HostDonor, cause: &str) -> bool {
    let want = format!("{}: {cause} ", d.addr());
    s.dead_donors.iter().any(|x| x.starts_with(&want))
}

/// Donor `d` is dead of `cause`, or was and came back.
fn died_as(s: &Stats, d: &HostDonor, cause: &str) -> bool {
    let want = format!("{}: {cause} ", d.addr());
    s.dead_donors
        .iter()
        .chain(&s.donors_back)
        .any(|x| x.starts_with(&want))
}

/// Every slab has its copies again after re-replication made some.
fn healed(s: &Stats) -> bool {
    s.slabs_healed > 0 && s.slabs_degraded == 0 && s.slabs_lost == 0 && s.last_heal_s.is_some()
}

/// Calls `work` (the program's own checking, for a server the test drives) until the stats
/// satisfy `done`; a test failure with the last stats and the log otherwise, or if the
/// program ends first.
fn until_stats(
    what: &str,
    run: &mut Running,
    stats: &Path,
    mut work: impl FnMut(),
    done: impl Fn(&Stats) -> bool,
) -> Stats {
    let start = Instant::now();
    loop {
        let s = runtime_stats(stats);
        if let Some(s) = s.as_ref().filter(|s| done(s)) {
            return s.clone();
        }
        if let Ok(Some(st)) = run.child.try_wait() {
            panic!(
                "{what}: the program ended first ({st}); stats {s:?}\nlog:\n{}",
                log_tail(run)
            );
        }
        assert!(
            start.elapsed() < RECOVERY,
            "{what}: not seen within {RECOVERY:?}; stats {s:?}\nlog:\n{}",
            log_tail(run)
        );
        work();
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The end of the run's log, for failure messages (a failing donor can log tens of thousands
/// of lines).
fn log_tail(run: &Running) -> String {
    let log = run.log_text();
    let lines: Vec<&str> = log.lines().collect();
    let from = lines.len().saturating_sub(80);
    format!(
        "({} lines, the last {})\n{}",
        lines.len(),
        lines.len() - from,
        lines[from..].join("\n")
    )
}

/// Waits for the program to create `dir/name` (it reached a step).
fn until_file(run: &mut Running, dir: &Scratch, name: &str) {
    let start = Instant::now();
    while !dir.path(name).exists() {
        if let Ok(Some(st)) = run.child.try_wait() {
            panic!(
                "the program ended ({st}) before {name}; log:\n{}",
                log_tail(run)
            );
        }
        assert!(
            start.elapsed() < RECOVERY,
            "the program did not reach {name}; log:\n{}",
            log_tail(run)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn touch(dir: &Scratch, name: &str) {
    std::fs::write(dir.path(name), b"").unwrap();
}

/// Waits for a successful exit; a test failure with the log otherwise.
fn finish(run: &mut Running) -> String {
    let st = run.wait(RECOVERY);
    let log = run.log_text();
    assert!(st.success(), "farmem run failed ({st}); log:\n{log}");
    assert!(
        !log.contains("SIGBUS"),
        "the program saw SIGBUS; log:\n{log}"
    );
    log
}

// ---------------------------------------------------------------------------------------------
// redis

const KEYS: u64 = 100_000;
const VALUE_BYTES: usize = 1024;

struct Redis {
    run: Running,
    c: Resp,
    stats: PathBuf,
    _dir: Scratch,
}

/// redis-server under `farmem run` with `args` on a fresh port.
fn redis(args: impl FnOnce(&Path) -> Vec<String>) -> Redis {
    let server = require_program("redis-server", "redis-server");
    let dir = Scratch::new("lost-redis");
    let stats = dir.path("stats.json");
    let port = free_port();
    let port_s = port.to_string();
    let args = args(&stats);
    let mut run = farmem_spawn(
        &strs(&args),
        &[
            server.to_str().unwrap(),
            "--port",
            &port_s,
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
        ],
        &dir.path("farmem-run.log"),
    );
    let mut c = Resp::new(connect_retry(port, Duration::from_secs(30), &mut run));
    redis_load(&mut c, KEYS, VALUE_BYTES);
    Redis {
        run,
        c,
        stats,
        _dir: dir,
    }
}

impl Redis {
    /// Reads every key back and checks its value.
    fn verify(&mut self, what: &str) {
        redis_verify(&mut self.c, KEYS, VALUE_BYTES, what)
    }

    /// Checks every key again and again until the stats satisfy `done`.
    fn verify_until(&mut self, what: &str, done: impl Fn(&Stats) -> bool) -> Stats {
        let Redis { run, c, stats, .. } = self;
        until_stats(
            what,
            run,
            stats,
            || redis_verify(c, KEYS, VALUE_BYTES, what),
            done,
        )
    }

    /// Checks every key a last time, shuts redis down and returns the final stats and log.
    fn shutdown(mut self) -> (StatsFile, String) {
        self.verify("at the end");
        self.c.send(&[b"SHUTDOWN", b"NOSAVE"]);
        self.c.flush();
        let log = finish(&mut self.run);
        (final_stats(&self.stats), log)
    }
}

// ---------------------------------------------------------------------------------------------
// numpy

/// Two 4096×2048 float64 arrays (128 MiB). After building them the job announces `at-fail`
/// and hashes both again and again (failing if they ever change) until `go` exists, then
/// rewrites one (every page written again after the failure) and prints hash, sum and a
/// product. Without farmem `go` exists from the start: the printed result is the same.
const NUMPY_JOB: &str = r#"
import hashlib, json, os, sys
import numpy as np
d = sys.argv[1]
rows, cols = 4096, 2048
rng = np.random.default_rng(2024)
a = rng.random((rows, cols))
b = a * 3.0
def digest():
    h = hashlib.sha256()
    for x in (a, b):
        for i in range(0, rows, 256):
            h.update(x[i:i + 256].tobytes())
    return h.hexdigest()
first = digest()
open(os.path.join(d, "at-fail"), "w").close()
while not os.path.exists(os.path.join(d, "go")):
    if digest() != first:
        print("FAIL: the arrays changed while donors failed", flush=True)
        sys.exit(1)
b += a
print(json.dumps({"sha": digest(), "total": float(b.sum()), "mm": float((a[:256] @ b[:256].T).sum())}))
"#;

fn python() -> &'static str {
    // Debian's interpreter with Debian's numpy; a PATH python3 may be a shim script.
    let py = "/usr/bin/python3";
    assert!(
        Path::new(py).is_file(),
        "{py} is missing: install the Debian package python3"
    );
    let o = Command::new(py)
        .args(["-c", "import numpy"])
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "numpy is missing for {py}: install the Debian package python3-numpy"
    );
    py
}

fn numpy_result(out: &str) -> serde_json::Value {
    let line = out
        .lines()
        .find(|l| l.starts_with("{\"sha\""))
        .unwrap_or_else(|| panic!("no result printed:\n{out}"));
    serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"))
}

/// The job's result without farmem.
fn numpy_expected() -> serde_json::Value {
    let dir = Scratch::new("lost-numpy-plain");
    touch(&dir, "go");
    let o = Command::new(python())
        .args(["-c", NUMPY_JOB])
        .arg(&dir.0)
        .output()
        .unwrap();
    assert!(o.status.success(), "without farmem: {}", text(&o));
    numpy_result(&String::from_utf8_lossy(&o.stdout))
}

/// The same result: the hash bit for bit, sums within rounding (BLAS and reductions may round
/// differently with differently aligned data).
fn assert_same_result(got: &serde_json::Value, want: &serde_json::Value) {
    assert_eq!(got["sha"], want["sha"], "element-wise results differ");
    for k in ["total", "mm"] {
        let (x, y) = (got[k].as_f64().unwrap(), want[k].as_f64().unwrap());
        assert!(
            (x - y).abs() <= 1e-9 * x.abs().max(y.abs()),
            "{k}: {x} vs {y}"
        );
    }
}

/// The numpy job under `farmem run ARGS`, started; returns it once it announced `at-fail`.
fn numpy_job(dir: &Scratch, args: &[String]) -> Running {
    let mut run = farmem_spawn(
        &strs(args),
        &[python(), "-c", NUMPY_JOB, dir.0.to_str().unwrap()],
        &dir.path("farmem-run.log"),
    );
    until_file(&mut run, dir, "at-fail");
    run
}

/// Lets the numpy job finish; checks its result against `want`; returns the log.
fn numpy_finish(run: &mut Running, dir: &Scratch, want: &serde_json::Value) -> String {
    touch(dir, "go");
    let log = finish(run);
    assert_same_result(&numpy_result(&log), want);
    log
}

// ---------------------------------------------------------------------------------------------
// the C program

fn phases(dir: &Scratch) -> PathBuf {
    let prog = dir.path("phases");
    compile_c(&c_source("phases.c"), &prog, &[]);
    prog
}

// ---------------------------------------------------------------------------------------------
// 1. one donor of three fails, for each kind of failure

#[test]
fn redis_keeps_every_key_when_a_donor_crashes() {
    let mut ds = donors(3);
    let mut r = redis(|stats| run_args(&ds, stats, &["--replicas", "2"]));
    r.verify("before the crash");
    ds[1].crash();
    let s = r.verify_until("the crash healed", |s| {
        dead_as(s, &ds[1], "crash") && healed(s)
    });
    assert_eq!(s.replicas, 2, "{s:?}");
    let (f, log) = r.shutdown();
    let s = f.runtime.unwrap();
    assert!(dead_as(&s, &ds[1], "crash"), "{s:?}");
    assert!(healed(&s), "{s:?}");
    assert_eq!(s.fetch_errors, 0, "{s:?}");
    assert!(
        log.contains("dead donors:") && log.contains("slab copies re-made"),
        "the summary does not tell the failure:\n{log}"
    );
}

#[test]
fn numpy_result_unchanged_when_a_donor_stalls() {
    let want = numpy_expected();
    let ds = donors(3);
    let dir = Scratch::new("lost-numpy-stall");
    let stats = dir.path("stats.json");
    let mut run = numpy_job(&dir, &run_args(&ds, &stats, &["--replicas", "2"]));
    ds[0].stall();
    until_stats(
        "the stall healed",
        &mut run,
        &stats,
        || {},
        |s| dead_as(s, &ds[0], "stall") && healed(s),
    );
    let log = numpy_finish(&mut run, &dir, &want);
    let s = final_stats(&stats).runtime.unwrap();
    assert!(dead_as(&s, &ds[0], "stall"), "{s:?}");
    assert!(healed(&s), "{s:?}");
    assert!(log.contains("dead donors:"), "{log}");
    ds[0].resume();
}

#[test]
fn redis_keeps_every_key_when_a_donor_is_cut_off() {
    let ds = donors(3);
    let mut r = redis(|stats| run_args(&ds, stats, &["--replicas", "2"]));
    r.verify("before the cut");
    ds[2].partition();
    r.verify_until("the cut link healed", |s| {
        dead_as(s, &ds[2], "partition") && healed(s)
    });
    let (f, log) = r.shutdown();
    let s = f.runtime.unwrap();
    assert!(dead_as(&s, &ds[2], "partition"), "{s:?}");
    assert!(healed(&s), "{s:?}");
    assert_eq!(s.fetch_errors, 0, "{s:?}");
    assert!(log.contains("slab copies re-made"), "{log}");
}

// ---------------------------------------------------------------------------------------------
// 2. two donors lost, one after the other

#[test]
fn redis_keeps_every_key_when_two_donors_die_one_after_the_other() {
    let mut ds = donors(4);
    let mut r = redis(|stats| run_args(&ds, stats, &["--replicas", "2"]));
    r.verify("before the first crash");
    ds[0].crash();
    let first = r.verify_until("the first crash healed", |s| {
        dead_as(s, &ds[0], "crash") && healed(s)
    });
    // The second loss hits copies re-replication just made, too.
    ds[3].stall();
    let second = r.verify_until("the stall healed", |s| {
        dead_as(s, &ds[3], "stall") && s.slabs_healed > first.slabs_healed && healed(s)
    });
    let (f, _log) = r.shutdown();
    let s = f.runtime.unwrap();
    assert!(
        dead_as(&s, &ds[0], "crash") && dead_as(&s, &ds[3], "stall"),
        "{s:?}"
    );
    assert!(healed(&s) && s.slabs_healed >= second.slabs_healed, "{s:?}");
    assert_eq!(s.fetch_errors, 0, "{s:?}");
    ds[3].resume();
}

// ---------------------------------------------------------------------------------------------
// 3. every copy lost, the backup file serves

#[test]
fn numpy_result_unchanged_from_the_backup_file_when_every_donor_crashes() {
    let want = numpy_expected();
    let mut ds = donors(2);
    let dir = Scratch::new("lost-numpy-backup");
    let stats = dir.path("stats.json");
    let backup = dir.path("backup.pages");
    let backup_s = backup.to_str().unwrap();
    let mut run = numpy_job(
        &dir,
        &run_args(&ds, &stats, &["--replicas", "2", "--backup-file", backup_s]),
    );
    assert!(backup.exists(), "no backup file at {backup_s}");
    ds[0].crash();
    ds[1].crash();
    until_stats(
        "both crashes seen",
        &mut run,
        &stats,
        || {},
        |s| dead_as(s, &ds[0], "crash") && dead_as(s, &ds[1], "crash") && s.backup_pages_read > 0,
    );
    let log = numpy_finish(&mut run, &dir, &want);
    let s = final_stats(&stats).runtime.unwrap();
    assert!(
        s.backup_pages_read > 0 && s.backup_pages_written > 0,
        "{s:?}"
    );
    assert!(
        dead_as(&s, &ds[0], "crash") && dead_as(&s, &ds[1], "crash"),
        "{s:?}"
    );
    assert_eq!(s.slabs_lost, 0, "{s:?}");
    assert!(log.contains("pages read from the backup file"), "{log}");
    assert!(
        !backup.exists(),
        "the backup file {backup_s} is left behind"
    );
}

/// Waits until restarted donor `d` is taken back and holds copies again, every slab whole
/// (`what` says it in a failure); returns its address.
fn until_taken_back(what: &str, run: &mut Running, stats: &Path, d: &HostDonor) -> String {
    let back = d.addr().to_string();
    until_stats(
        what,
        run,
        stats,
        || {},
        |s| {
            died_as(s, d, "restart")
                && !s.dead_donors.iter().any(|x| x.starts_with(&back))
                && s.slabs_degraded == 0
                && s.donors.iter().any(|x| x.addr == back && x.far_slabs > 0)
        },
    );
    back
}

/// Starts the phases program on 128 MiB under `farmem run --replicas 2` on `ds`, with `steps`;
/// returns its folder, its stats file and the run.
fn phases_run(ds: &[HostDonor], tag: &str, steps: &[&str]) -> (Scratch, PathBuf, Running) {
    let dir = Scratch::new(tag);
    let prog = phases(&dir);
    let stats = dir.path("stats.json");
    let args = run_args(ds, &stats, &["--replicas", "2"]);
    let mut command = vec![prog.to_str().unwrap(), "128", dir.0.to_str().unwrap()];
    command.extend_from_slice(steps);
    let run = farmem_spawn(&strs(&args), &command, &dir.path("farmem-run.log"));
    (dir, stats, run)
}

// ---------------------------------------------------------------------------------------------
// 4. a donor comes back: empty after a restart, stale after a stall

#[test]
fn a_restarted_empty_donor_is_never_read() {
    let mut ds = donors(3);
    let (dir, stats, mut run) = phases_run(
        &ds,
        "lost-restart",
        &[
            "fill:1",
            "check:1",
            // Idle while the donor restarts, so the runtime's first contact finds the new,
            // empty donor on the same address (not the refused connects of a crash).
            "wait:restarted",
            "loop:1:healed",
            "fill:2",
            "check:2",
        ],
    );
    until_file(&mut run, &dir, "at-restarted");
    ds[1].restart();
    touch(&dir, "restarted");
    until_stats(
        "the restart healed",
        &mut run,
        &stats,
        || {},
        |s| died_as(s, &ds[1], "restart") && healed(s),
    );
    touch(&dir, "healed");
    let log = finish(&mut run);
    assert!(log.contains("ok "), "{log}");
    let s = final_stats(&stats).runtime.unwrap();
    assert!(died_as(&s, &ds[1], "restart"), "{s:?}");
    assert!(healed(&s), "{s:?}");
    assert_eq!(s.fetch_errors, 0, "{s:?}");
}

#[test]
fn a_restarted_donor_is_used_again_and_then_holds_the_only_copies() {
    // Two donors, two copies: while one restarts, every slab is one copy short and no other
    // donor can take the second. The restarted donor must be used again (as a new, empty one)
    // and get the copies back, so that losing the other donor then loses nothing. (It used
    // to stay dead for good: the second loss lost pages.)
    let mut ds = donors(2);
    let (dir, stats, mut run) = phases_run(
        &ds,
        "lost-restart-again",
        &[
            "fill:1",
            "check:1",
            "wait:restarted",
            "loop:1:crashed",
            "check:1",
        ],
    );
    until_file(&mut run, &dir, "at-restarted");
    ds[1].restart();
    touch(&dir, "restarted");
    let back = until_taken_back(
        "the restarted donor holding copies again",
        &mut run,
        &stats,
        &ds[1],
    );
    ds[0].crash();
    touch(&dir, "crashed");
    let log = finish(&mut run);
    assert!(log.contains("ok "), "{log}");
    assert!(
        log.contains(&format!("donor {back} restarted: used again")),
        "the log does not say the donor was used again:\n{log}"
    );
    let s = final_stats(&stats).runtime.unwrap();
    assert!(dead_as(&s, &ds[0], "crash"), "{s:?}");
    assert_eq!((s.slabs_lost, s.pages_lost), (0, 0), "{s:?}");
}

#[test]
fn a_forked_child_reads_its_pages_through_copies_its_parent_made_on_a_restarted_donor() {
    // The same with a forked child that borrows the parent's pages on the donors and reads
    // them only at the end. The parent must take the restarted donor back although the child
    // lives, and the child must follow it there: once the other donor is lost, every page it
    // reads comes from a copy made after the fork, on a donor restarted after the fork. (The
    // parent did not take a restarted donor back while a child lived, and the child knew
    // only the copies of the fork: its reads failed, SIGBUS.)
    let mut ds = donors(2);
    let (dir, stats, mut run) = phases_run(
        &ds,
        "lost-fork-restart",
        &[
            "fill:1",
            "fork:1:read",
            "wait:restarted",
            "loop:1:crashed",
            "check:1",
        ],
    );
    until_file(&mut run, &dir, "at-restarted");
    // The child's runtime has started (and connected to both donors for its own pages).
    until_file(&mut run, &dir, "at-read");
    ds[1].restart();
    touch(&dir, "restarted");
    until_taken_back(
        "the restarted donor taken back while the child lives, holding copies again",
        &mut run,
        &stats,
        &ds[1],
    );
    // The child's runtime also holds slabs of its own (pages it shared with the parent and
    // copied out to evict): it must have healed them onto the restarted donor too.
    let (old, new) = (stats_client(&ds[0]), stats_client(&ds[1]));
    let deadline = Instant::now() + RECOVERY;
    while !every_client_copied(&old, &new) {
        assert!(
            Instant::now() < deadline,
            "the child's own slabs not copied to the restarted donor within {RECOVERY:?}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    // The parent's counters again, from a stats file written after that (each process
    // rewrites its own every second): the ones above may predate it by a second.
    std::thread::sleep(Duration::from_millis(1500));
    until_taken_back(
        "the parent's slabs all with two copies just before the other donor crashes",
        &mut run,
        &stats,
        &ds[1],
    );
    ds[0].crash();
    touch(&dir, "read");
    touch(&dir, "crashed");
    let log = finish(&mut run);
    assert!(
        log.contains("child ok") && log.contains("ok "),
        "the child or the parent read a wrong page or none:\n{log}"
    );
    let s = final_stats(&stats).runtime.unwrap();
    assert!(dead_as(&s, &ds[0], "crash"), "{s:?}");
    assert!(
        s.fork_pages_lent > 0,
        "nothing was lent to the child: {s:?}"
    );
    assert_eq!(
        (s.slabs_lost, s.pages_lost, s.seal_rejected),
        (0, 0, 0),
        "{s:?}"
    );
}

#[test]
fn a_donor_resumed_after_a_stall_never_hands_back_stale_pages() {
    let ds = donors(3);
    let (dir, stats, mut run) = phases_run(
        &ds,
        "lost-resume",
        &[
            "fill:1",
            "check:1",
            "wait:stalled",
            // Every page written again while the donor is stopped: its copies are now stale.
            "fill:2",
            "loop:2:resumed",
            "check:2",
        ],
    );
    until_file(&mut run, &dir, "at-stalled");
    ds[0].stall();
    touch(&dir, "stalled");
    let during = until_stats(
        "the stall healed",
        &mut run,
        &stats,
        || {},
        |s| dead_as(s, &ds[0], "stall") && healed(s),
    );
    ds[0].resume();
    // Dead donors are probed every 2 s: once back it leaves the dead list and serves again,
    // while the program goes on reading every page.
    let addr = ds[0].addr().to_string();
    until_stats(
        "the donor back",
        &mut run,
        &stats,
        || {},
        |s| !s.dead_donors.iter().any(|d| d.starts_with(&addr)),
    );
    until_file(&mut run, &dir, "at-resumed");
    touch(&dir, "resumed");
    let log = finish(&mut run);
    assert!(log.contains("ok "), "{log}");
    assert!(
        log.contains(&format!("donor {addr} is back")),
        "the log does not say the donor came back:\n{log}"
    );
    let s = final_stats(&stats).runtime.unwrap();
    assert!(s.slabs_healed >= during.slabs_healed, "{s:?}");
    assert_eq!(s.slabs_degraded, 0, "{s:?}");
    assert_eq!(s.fetch_errors, 0, "{s:?}");
    assert_eq!(s.seal_rejected, 0, "a stale page was read: {s:?}");
}

// ---------------------------------------------------------------------------------------------
// 5. donors unreachable at start

#[test]
fn a_donor_down_at_start_is_named_and_taken_in_once_it_answers() {
    // Three donors, two copies; the third is down when the program starts. Every slab gets
    // its two copies on the two that answered. Then the third comes up and must be taken in:
    // when the first crashes, its copies are made again there, so that losing the second
    // too loses nothing. (It used to be left out for good: the second loss lost pages.)
    let mut ds = donors(3);
    ds[2].crash();
    let dir = Scratch::new("lost-start");
    let prog = phases(&dir);
    let stats = dir.path("stats.json");
    let args = run_args(&ds, &stats, &["--replicas", "2"]);
    let mut run = farmem_spawn(
        &strs(&args),
        &[
            prog.to_str().unwrap(),
            "96",
            dir.0.to_str().unwrap(),
            "fill:1",
            "check:1",
            "wait:copied",
            "check:1",
        ],
        &dir.path("farmem-run.log"),
    );
    until_file(&mut run, &dir, "at-copied");
    // Both copies of every slab end up on the two live donors. Not asserted at exit alone: a
    // live donor's request timing out under load (CI runs two tests on two cores) leaves a
    // slab one copy short until the next heal round copies it; a down donor counted as a
    // place for copies would leave slabs short for good.
    let live = until_stats(
        "every slab on both live donors",
        &mut run,
        &stats,
        || {},
        |s| s.slabs_placed > 0 && s.slabs_degraded == 0,
    );
    let down = ds[2].addr().to_string();
    assert!(
        live.dead_donors.iter().any(|x| x.starts_with(&down)),
        "the down donor is not said dead: {live:?}"
    );
    ds[2].restart();
    until_stats(
        "the donor down at start taken in",
        &mut run,
        &stats,
        || {},
        |s| !s.dead_donors.iter().any(|x| x.starts_with(&down)),
    );
    ds[0].crash();
    until_stats(
        "the first donor's copies made again on the one down at start",
        &mut run,
        &stats,
        || {},
        |s| {
            dead_as(s, &ds[0], "crash")
                && s.slabs_degraded == 0
                && s.donors.iter().any(|d| d.addr == down && d.far_slabs > 0)
        },
    );
    ds[1].crash();
    touch(&dir, "copied");
    let log = finish(&mut run);
    assert!(log.contains("ok "), "{log}");
    assert!(
        log.lines()
            .any(|l| l.contains("warning") && l.contains(&down)),
        "no warning names the donor down at start ({down}):\n{log}"
    );
    assert!(
        log.contains(&format!(
            "donor {down}, down when this program started, answers"
        )),
        "the log does not say the donor was taken in:\n{log}"
    );
    let s = final_stats(&stats).runtime.unwrap();
    assert_eq!((s.slabs_lost, s.pages_lost), (0, 0), "{s:?}");
    assert!(s.bytes_received > 0, "{s:?}");
}

#[test]
fn no_donor_reachable_at_start_fails_clearly() {
    let mut ds = donors(2);
    ds[0].crash();
    ds[1].partition();
    let dir = Scratch::new("lost-none");
    let prog = phases(&dir);
    let stats = dir.path("stats.json");
    let args = run_args(&ds, &stats, &[]);
    let o = farmem_run(
        &strs(&args),
        &[
            prog.to_str().unwrap(),
            "16",
            dir.0.to_str().unwrap(),
            "fill:1",
        ],
    );
    assert!(!o.status.success(), "{}", text(&o));
    assert!(
        !String::from_utf8_lossy(&o.stdout).contains("ok"),
        "the program ran: {}",
        text(&o)
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("none of the 2 donor(s) can be reached"),
        "{}",
        text(&o)
    );
    ds[1].heal_link();
}

// ---------------------------------------------------------------------------------------------
// 6. a donor takes memory back mid-run (Valet's migration)

const SLAB_BYTES: u64 = 4 << 20;

/// A connection to `d` for its counters (STATS) with the run's token. It holds no slab, so
/// the donor never asks it for any.
fn stats_client(d: &HostDonor) -> DonorClient {
    let cfg = ClientConfig {
        token: Some(d.token().to_vec()),
        ..ClientConfig::default()
    };
    DonorClient::connect(&d.addr().to_string(), cfg)
        .unwrap_or_else(|e| panic!("connecting to the donor {} for its stats: {e}", d.addr()))
}

/// Whether every client holding slabs on the donor of `from` holds as many bytes on that of
/// `to` (two donors, two copies: each runtime's slabs fully copied there).
fn every_client_copied(from: &DonorClient, to: &DonorClient) -> bool {
    let (Ok(a), Ok(b)) = (from.clients(), to.clients()) else {
        return false;
    };
    a.clients.iter().filter(|c| c.slabs > 0).all(|c| {
        b.clients
            .iter()
            .any(|x| x.client_id == c.client_id && x.used_bytes >= c.used_bytes)
    })
}

fn donor_stats(c: &DonorClient) -> DonorStats {
    c.stats()
        .unwrap_or_else(|e| panic!("the donor's STATS: {e}"))
}

/// The donor process's anonymous resident memory: its slabs' committed pages, and little else.
fn rss_anon_bytes(d: &HostDonor) -> u64 {
    let pid = d.pid().expect("the donor runs");
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("RssAnon:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("RssAnon in /proc/PID/status");
    kb * 1024
}

/// Writes `text` to `path` (mode 600) through a rename, so the donor never reads half of it.
fn put(path: &Path, text: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o600)).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

/// SIGHUP: the donor re-reads its `--capacity-file`.
fn hup(d: &HostDonor) {
    let pid = d.pid().expect("the donor runs");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGHUP,
    )
    .unwrap_or_else(|e| panic!("SIGHUP to the donor {pid}: {e}"));
}

/// phases.c over 128 MiB: written and checked, then checked again and again while the donor
/// gives memory back (until `back`), then every word written again and checked (writes to the
/// slabs' new homes), then idle until `end`.
fn giving_back_run(ds: &[HostDonor], dir: &Scratch) -> (Running, PathBuf) {
    let prog = phases(dir);
    let stats = dir.path("stats.json");
    let args = run_args(ds, &stats, &["--replicas", "2"]);
    let mut run = farmem_spawn(
        &strs(&args),
        &[
            prog.to_str().unwrap(),
            "128",
            dir.0.to_str().unwrap(),
            "fill:1",
            "check:1",
            "loop:1:back",
            "fill:2",
            "check:2",
            "wait:end",
        ],
        &dir.path("farmem-run.log"),
    );
    until_file(&mut run, dir, "at-back");
    (run, stats)
}

/// What the donor gave back, between `before` (when asked) and `after` (done): the figures, and
/// that its process's memory fell by at least half of the committed bytes it gave back (the
/// rest of RssAnon is buffers that come and go).
fn gave_back(test: &str, d: &HostDonor, before: (DonorStats, u64), after: (DonorStats, u64)) {
    let ((b, rss_b), (a, rss_a)) = (before, after);
    let freed = b.committed_bytes.saturating_sub(a.committed_bytes);
    eprintln!(
        "{test}: donor {} lent {} MiB ({} MiB committed, RssAnon {} MiB), now {} MiB ({} MiB \
         committed, RssAnon {} MiB) at capacity {} MiB; slabs given back {}",
        d.addr(),
        b.used_bytes >> 20,
        b.committed_bytes >> 20,
        rss_b >> 20,
        a.used_bytes >> 20,
        a.committed_bytes >> 20,
        rss_a >> 20,
        a.capacity_bytes >> 20,
        a.slabs_given_back_total
    );
    assert!(a.slabs_given_back_total > 0, "{a:?}");
    assert!(
        rss_a + freed / 2 <= rss_b,
        "giving back {freed} committed bytes did not return memory: RssAnon {rss_b} -> {rss_a}"
    );
}

/// Lets the program write and check everything again while `host` keeps playing the donor's
/// host, then waits until `within` (the donor lends no more than it was asked to keep to);
/// checks that the program ended well, with nothing lost, no donor dead, and slabs migrated.
fn unaffected(
    run: &mut Running,
    dir: &Scratch,
    stats: &Path,
    during: &Stats,
    mut host: impl FnMut(),
    within: impl Fn() -> bool,
) {
    touch(dir, "back");
    let at_end = dir.path("at-end");
    until_stats(
        "every page written and checked again",
        run,
        stats,
        &mut host,
        |_| at_end.exists(),
    );
    until_stats(
        "the donor within its limit after every page was written again",
        run,
        stats,
        &mut host,
        |_| within(),
    );
    touch(dir, "end");
    let log = finish(run);
    assert!(log.contains("ok "), "{log}");
    let s = final_stats(stats).runtime.unwrap();
    eprintln!(
        "{}: slabs placed {}, migrated {}, local slabs {}, degraded {}, lost {}",
        std::thread::current().name().unwrap_or("?"),
        s.slabs_placed,
        s.slabs_migrated,
        s.local_slabs,
        s.slabs_degraded,
        s.slabs_lost
    );
    assert!(
        s.slabs_migrated > 0 && s.slabs_migrated >= during.slabs_migrated,
        "{s:?}"
    );
    assert!(s.dead_donors.is_empty(), "{s:?}");
    assert_eq!(s.fetch_errors, 0, "{s:?}");
    assert_eq!(s.seal_rejected, 0, "{s:?}");
    assert_eq!(s.slabs_lost, 0, "{s:?}");
    // Two other donors with room: every slab moved went to one of them (none into this
    // process's memory), and every slab has its two copies again.
    assert_eq!(s.local_slabs, 0, "{s:?}");
    assert_eq!(s.slabs_degraded, 0, "{s:?}");
}

#[test]
fn a_donor_asked_for_half_its_memory_back_gets_it_and_the_program_is_unaffected() {
    let test = "a_donor_asked_for_half_its_memory_back";
    let dir = Scratch::new("lost-capacity");
    let cap_file = dir.path("capacity");
    put(&cap_file, &format!("{CAPACITY}\n"));
    let ds = donors_first_with(3, &["--capacity-file", cap_file.to_str().unwrap()]);
    let (mut run, stats) = giving_back_run(&ds, &dir);
    let c = stats_client(&ds[0]);
    let before = (donor_stats(&c), rss_anon_bytes(&ds[0]));
    // Half of what it lends, in whole slabs.
    let cap = before.0.used_bytes / 2 / SLAB_BYTES * SLAB_BYTES;
    assert!(
        cap >= SLAB_BYTES,
        "the donor lends too little to halve: {:?}",
        before.0
    );
    put(&cap_file, &format!("{}MiB\n", cap >> 20));
    hup(&ds[0]);
    let during = until_stats(
        "the donor's memory given back",
        &mut run,
        &stats,
        || {},
        |s| {
            let d = donor_stats(&c);
            s.slabs_migrated > 0
                && d.capacity_bytes == cap
                && d.used_bytes <= cap
                && d.reclaim_wanted_bytes == 0
        },
    );
    let after = (donor_stats(&c), rss_anon_bytes(&ds[0]));
    gave_back(test, &ds[0], before, after);
    assert!(
        after.0.slabs_given_back_total * SLAB_BYTES >= before.0.used_bytes - cap,
        "{:?}",
        after.0
    );
    unaffected(
        &mut run,
        &dir,
        &stats,
        &during,
        || {},
        || {
            let d = donor_stats(&c);
            d.used_bytes <= cap && d.reclaim_wanted_bytes == 0
        },
    );
    eprintln!("{test}: at the end the donor lends {:?}", donor_stats(&c));
}

/// `--keep-free` for the test: the host's memory is a fake /proc/meminfo.
const KEEP_FREE: u64 = 4 << 30;

fn meminfo(available: u64) -> String {
    format!(
        "MemTotal: {} kB\nMemAvailable: {} kB\n",
        (16u64 << 30) / 1024,
        available / 1024
    )
}

#[test]
fn a_donor_whose_host_runs_short_gets_half_its_memory_back_and_the_program_is_unaffected() {
    let test = "a_donor_whose_host_runs_short";
    let dir = Scratch::new("lost-keep-free");
    let info = dir.path("meminfo");
    put(&info, &meminfo(4 * KEEP_FREE));
    let keep_free = format!("{}GiB", KEEP_FREE >> 30);
    let ds = donors_first_with(
        3,
        &[
            "--capacity",
            CAPACITY,
            "--keep-free",
            &keep_free,
            "--meminfo-file",
            info.to_str().unwrap(),
        ],
    );
    let (mut run, stats) = giving_back_run(&ds, &dir);
    let c = stats_client(&ds[0]);
    let before = (donor_stats(&c), rss_anon_bytes(&ds[0]));
    // The host falls short by half of what the donor has committed; as a real host's would,
    // its available memory grows again by what the donor frees.
    let want = before.0.committed_bytes / 2;
    assert!(
        want >= SLAB_BYTES,
        "the donor lends too little to halve: {:?}",
        before.0
    );
    let short = KEEP_FREE - want;
    put(&info, &meminfo(short));
    let host = || {
        let freed = before
            .0
            .committed_bytes
            .saturating_sub(donor_stats(&c).committed_bytes);
        put(&info, &meminfo(short + freed));
    };
    let during = until_stats(
        "the host's shortfall given back",
        &mut run,
        &stats,
        host,
        |s| {
            let d = donor_stats(&c);
            s.slabs_migrated > 0
                && d.committed_bytes + want <= before.0.committed_bytes
                && d.reclaim_wanted_bytes == 0
        },
    );
    let after = (donor_stats(&c), rss_anon_bytes(&ds[0]));
    gave_back(test, &ds[0], before, after);
    unaffected(&mut run, &dir, &stats, &during, host, || {
        let d = donor_stats(&c);
        d.committed_bytes + want <= before.0.committed_bytes && d.reclaim_wanted_bytes == 0
    });
    eprintln!("{test}: at the end the donor lends {:?}", donor_stats(&c));
}
