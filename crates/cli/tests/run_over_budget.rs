//! When far memory runs out the budget still holds: with `--over-budget fail` (the default)
//! faulting threads wait for write-back, the program goes on if far memory comes back, and is
//! killed, saying what ran out, if it does not; `--over-budget allow` lets it grow past its
//! budget instead. Before, a program whose donors were full ran on far past its budget (6.5×
//! in a user's trial; in a container with a hard limit, an OOM kill).

use std::process::Command;
use std::time::Duration;

use farmem_testkit::bins::require_preload_lib;
use farmem_testkit::donor::Donor;
use farmem_testkit::run::*;

/// Writes 128 blocks of 1 MiB (far memory) and hashes them.
const PROGRAM: &str = "
import hashlib
blocks = [hashlib.sha256(str(i).encode()).digest() * 32768 for i in range(128)]
h = hashlib.sha256()
for b in blocks:
    h.update(b)
print(h.hexdigest())
";

fn python() -> String {
    require_preload_lib();
    require_program("python3", "python3")
        .to_str()
        .unwrap()
        .to_string()
}

fn run(donor: &Donor, extra: &[&str]) -> std::process::Output {
    let addr = donor.addr.to_string();
    let mut args = vec!["--local-mem", "32MiB", "--donor", &addr];
    args.extend_from_slice(extra);
    farmem_run(&args, &[&python(), "-c", PROGRAM])
}

#[test]
fn far_memory_that_runs_out_ends_the_program_within_its_budget() {
    let donor = Donor::start("16MiB", "1MiB");
    let o = run(&donor, &["--over-budget-wait", "2"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(
        o.status.code(),
        Some(137),
        "killed as an OOM kill: {}",
        text(&o)
    );
    assert!(err.contains("far memory ran out"), "{err}");
    assert!(
        err.contains("capacity exhausted"),
        "what ran out is said: {err}"
    );
    assert!(err.contains("--over-budget allow"), "{err}");
    assert!(!err.contains("did not hold"), "{err}");
}

#[test]
fn over_budget_allow_lets_the_program_grow_past_its_budget() {
    let native = Command::new(python())
        .args(["-c", PROGRAM])
        .output()
        .unwrap();
    let donor = Donor::start("16MiB", "1MiB");
    let o = run(&donor, &["--over-budget", "allow"]);
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(o.stdout, native.stdout);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("the budget did not hold"), "{err}");
}

#[test]
fn a_program_waits_for_far_memory_to_come_back_and_keeps_its_budget() {
    let native = Command::new(python())
        .args(["-c", PROGRAM])
        .output()
        .unwrap();
    let dir = Scratch::new("over-budget-wait");
    let cap = dir.path("capacity");
    std::fs::write(&cap, "16MiB\n").unwrap();
    let donor = Donor::spawn(&[
        "--capacity-file",
        cap.to_str().unwrap(),
        "--slab-size",
        "1MiB",
    ]);
    let addr = donor.addr.to_string();
    let log = dir.path("run.log");
    let mut r = farmem_spawn(
        &[
            "--local-mem",
            "32MiB",
            "--donor",
            &addr,
            "--over-budget-wait",
            "120",
        ],
        &[&python(), "-c", PROGRAM],
        &log,
    );
    // Far memory runs out: the program waits (write-back fails, nothing grows).
    let t0 = std::time::Instant::now();
    while !r.log_text().contains("capacity exhausted") {
        assert!(t0.elapsed() < Duration::from_secs(60), "{}", r.log_text());
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_secs(1));
    // The donor's owner lends more: write-back goes on, and so does the program.
    std::fs::write(&cap, "256MiB\n").unwrap();
    donor.signal("-HUP");
    let status = r.wait(Duration::from_secs(120));
    let out = r.log_text();
    assert!(status.success(), "{out}");
    assert!(
        out.contains(String::from_utf8_lossy(&native.stdout).trim()),
        "{out}"
    );
    assert!(!out.contains("did not hold"), "{out}");
    assert!(!out.contains("far memory ran out"), "{out}");
}
