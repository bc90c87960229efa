//! A forked child reads the pages its parent lent it on donors after every donor that held
//! their copies at the fork has died: the parent healed those slabs onto another donor, and
//! the child follows it there (the parent's table of lent copies, `lentcopies.rs`).

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use farmem_testkit::bins::{farmem, require_preload_lib};
use farmem_testkit::donor::Donor;
use farmem_testkit::run::{read_stats, Scratch};

const PYTHON: &str = "/usr/bin/python3";

/// Bytes in the slabs `d` has allocated (`farmem stats --json`).
fn used(d: &Donor) -> u64 {
    let out = Command::new(farmem())
        .args(["stats", "--json", "--interval-ms", "0", "--donor"])
        .arg(d.addr.to_string())
        .output()
        .expect("running farmem stats");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("stats JSON");
    v["used_bytes"].as_u64().expect("used_bytes")
}

/// Waits until `f` gives the same value twice 500 ms apart and `done` holds for it.
fn settled(what: &str, f: impl Fn() -> u64, done: impl Fn(u64) -> bool) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(90);
    let mut last = f();
    loop {
        std::thread::sleep(Duration::from_millis(500));
        let now = f();
        if now == last && done(now) {
            return now;
        }
        assert!(Instant::now() < deadline, "{what}: still {now} after 90 s");
        last = now;
    }
}

/// Three donors, two copies of every slab. After the fork the test kills one donor and
/// waits for the parent to heal (every slab has its two copies on the other two again), then
/// kills a second: a slab whose fork-time copies were on those two has none of them left (with
/// 4 MiB slabs and 128 MiB of state, nearly every run has such slabs: each does with odds 1 in
/// 3). The child then reads the whole state, through the copies on the third donor.
#[test]
fn a_forked_child_reads_its_lent_pages_after_both_donors_it_knew_died() {
    require_preload_lib();
    let scratch = Scratch::new("tree-heal");
    let stats = scratch.path("stats.json");
    let donors: Vec<Donor> = (0..3).map(|_| Donor::start("1GiB", "4MiB")).collect();
    let mut cmd = Command::new(farmem());
    cmd.args([
        "run",
        "--local-mem",
        "48MiB",
        "--replicas",
        "2",
        "--seal",
        "on",
    ])
    .arg("--stats")
    .arg(&stats);
    for d in &donors {
        cmd.args(["--donor", &d.addr.to_string()]);
    }
    let prog = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/tree/fork_heal.py");
    let mut child = cmd
        .arg("--")
        .args([PYTHON, prog.to_str().unwrap(), "128"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting farmem run");
    let (tx, lines) = mpsc::channel::<String>();
    let stdout = child.stdout.take().unwrap();
    std::thread::spawn(move || {
        for l in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = tx.send(l);
        }
    });
    let stderr = child.stderr.take().unwrap();
    let errs = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = std::io::Read::read_to_string(&mut BufReader::new(stderr), &mut s);
        s
    });
    let first = lines.recv_timeout(Duration::from_secs(120));
    assert_eq!(first.as_deref(), Ok("forked"), "the program did not fork");

    let total = || donors.iter().map(used).sum::<u64>();
    let before = settled("the donors' use before the kills", total, |_| true);
    assert!(before > 0, "nothing on the donors");
    donors[0].signal("-KILL");
    let others = || used(&donors[1]) + used(&donors[2]);
    settled("the parent's heal onto the two donors left", others, |u| {
        u >= before
    });
    donors[1].signal("-KILL");

    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(b"go\n").unwrap();
    drop(stdin);
    let mut out = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(180);
    while let Some(left) = deadline.checked_duration_since(Instant::now()) {
        match lines.recv_timeout(left) {
            Ok(l) => out.push(l),
            Err(_) => break,
        }
    }
    let status = child.wait().expect("waiting for farmem run");
    let errs = errs.join().unwrap();
    let out = out.join("\n");
    assert!(
        out.contains("ok ") && out.contains("child status 0") && status.success(),
        "the child could not read what its parent lent it ({status}):\n{out}\n{errs}"
    );
    let summary = &read_stats(&stats)["summary"];
    let count = |k: &str| summary[k].as_u64().unwrap_or(0);
    assert!(count("pages_borrowed") > 0, "nothing borrowed: {summary}");
    assert_eq!(count("pages_lost"), 0, "{summary}");
}
