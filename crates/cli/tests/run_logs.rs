//! What the program's user is told while a condition lasts: once, with a count, then at most
//! every 30 s — not a line per slab and per try. In a user's trial, re-replication with the
//! donors full printed "re-replicating far slab N: the donors are full …" 145 times a second
//! for 75 s into the program's own stderr.

use std::time::Duration;

use farmem_testkit::bins::require_preload_lib;
use farmem_testkit::donor::Donor;
use farmem_testkit::run::*;

/// Writes 96 MiB, says so, waits, and hashes it.
const PROGRAM: &str = "
import hashlib, sys, time
blocks = [hashlib.sha256(str(i).encode()).digest() * 32768 for i in range(96)]
print('written', flush=True)
time.sleep(6)
h = hashlib.sha256()
for b in blocks:
    h.update(b)
print(h.hexdigest())
";

#[test]
fn re_replication_with_no_room_is_said_once_with_what_ran_out() {
    require_preload_lib();
    let python = require_program("python3", "python3");
    let dir = Scratch::new("run-logs");
    // Two roomy donors and one that fills at once: when a roomy one dies, its slabs' new
    // copies have nowhere to go (the other roomy one holds their other copy).
    let mut roomy = Donor::start("256MiB", "1MiB");
    let other = Donor::start("256MiB", "1MiB");
    let small = Donor::start("8MiB", "1MiB");
    let (a, b, c) = (
        roomy.addr.to_string(),
        other.addr.to_string(),
        small.addr.to_string(),
    );
    let log = dir.path("run.log");
    let mut r = farmem_spawn(
        &[
            "--local-mem",
            "32MiB",
            "--donor",
            &a,
            "--donor",
            &b,
            "--donor",
            &c,
        ],
        &[python.to_str().unwrap(), "-c", PROGRAM],
        &log,
    );
    let t0 = std::time::Instant::now();
    while !r.log_text().contains("written") {
        assert!(t0.elapsed() < Duration::from_secs(60), "{}", r.log_text());
        std::thread::sleep(Duration::from_millis(50));
    }
    roomy.signal("-KILL");
    let _ = roomy.wait_exit();
    let status = r.wait(Duration::from_secs(120));
    let out = r.log_text();
    assert!(status.success(), "{out}");
    let waits = out.matches("re-replication waits").count();
    assert!(
        (1..=2).contains(&waits),
        "said {waits} times over a 6 s wait: {out}"
    );
    assert!(!out.contains("re-replicating far slab"), "{out}");
    // What ran out, in the donor's words, and how many donors are live now.
    assert!(out.contains("capacity exhausted"), "{out}");
    assert!(out.contains("(2 of 3 donors live)"), "{out}");
}

/// Writes 64 MiB, says so, waits, and hashes it.
const SHORT_PROGRAM: &str = "
import hashlib, time
blocks = [hashlib.sha256(str(i).encode()).digest() * 32768 for i in range(64)]
print('written', flush=True)
time.sleep(2)
h = hashlib.sha256()
for b in blocks:
    h.update(b)
print(h.hexdigest())
";

/// Runs SHORT_PROGRAM on three donors with `extra` flags, killing one donor once it wrote
/// (`kill`), and returns the exit status and the log.
fn run_with_donor_loss(extra: &[&str], kill: bool) -> (std::process::ExitStatus, String) {
    require_preload_lib();
    let python = require_program("python3", "python3");
    let dir = Scratch::new("run-degraded");
    let mut donors: Vec<Donor> = (0..3).map(|_| Donor::start("256MiB", "1MiB")).collect();
    let addrs: Vec<String> = donors.iter().map(|d| d.addr.to_string()).collect();
    let mut args = vec!["--local-mem", "32MiB"];
    for a in &addrs {
        args.extend(["--donor", a.as_str()]);
    }
    args.extend_from_slice(extra);
    let log = dir.path("run.log");
    let mut r = farmem_spawn(
        &args,
        &[python.to_str().unwrap(), "-c", SHORT_PROGRAM],
        &log,
    );
    let t0 = std::time::Instant::now();
    while !r.log_text().contains("written") {
        assert!(t0.elapsed() < Duration::from_secs(60), "{}", r.log_text());
        std::thread::sleep(Duration::from_millis(50));
    }
    if kill {
        donors[0].signal("-KILL");
        let _ = donors[0].wait_exit();
    }
    let status = r.wait(Duration::from_secs(120));
    (status, r.log_text())
}

#[test]
fn a_run_that_lost_a_donor_says_it_ended_degraded_and_can_fail_for_scripts() {
    let (status, out) = run_with_donor_loss(&["--fail-if-degraded"], true);
    assert_eq!(status.code(), Some(75), "{out}");
    assert!(
        out.contains("the run ended degraded (dead donors: "),
        "{out}"
    );
    assert!(out.contains("crash"), "{out}");
    let (status, out) = run_with_donor_loss(&[], true);
    assert!(status.success(), "{out}");
    assert!(
        out.contains("farmem: warning: the run ended degraded: dead donors: "),
        "{out}"
    );
    let (status, out) = run_with_donor_loss(&["--fail-if-degraded"], false);
    assert!(status.success(), "{out}");
    assert!(!out.contains("degraded"), "{out}");
}

#[test]
fn the_stats_file_says_what_the_run_holds_on_each_donor() {
    require_preload_lib();
    let python = require_program("python3", "python3");
    let dir = Scratch::new("run-per-donor");
    let donors: Vec<Donor> = (0..2).map(|_| Donor::start("256MiB", "1MiB")).collect();
    let (a, b) = (donors[0].addr.to_string(), donors[1].addr.to_string());
    let stats = dir.path("stats.json");
    let o = farmem_run(
        &[
            "--local-mem",
            "32MiB",
            "--donor",
            &a,
            "--donor",
            &b,
            "--stats",
            stats.to_str().unwrap(),
        ],
        &[python.to_str().unwrap(), "-c", SHORT_PROGRAM],
    );
    assert!(o.status.success(), "{}", text(&o));
    let v = read_stats(&stats);
    let per = v["summary"]["donors"]
        .as_array()
        .expect("per-donor figures");
    assert_eq!(per.len(), 2, "{v}");
    for (d, addr) in per.iter().zip([&a, &b]) {
        assert_eq!(d["addr"], addr.as_str(), "{d}");
        assert_eq!(d["health"], "live", "{d}");
        assert_eq!(d["capacity_bytes"], 256u64 << 20, "{d}");
        // Two copies of every far slab: both donors hold some.
        assert!(d["far_slabs"].as_u64().unwrap() > 0, "{d}");
        assert!(d["bytes_taken"].as_u64().unwrap() >= d["bytes_filled"].as_u64().unwrap());
    }
}
