//! The short soak of CI: `farmem-bench soak --minutes 2` with a seed of its own (printed, so a
//! failure can be replayed with `--seed`): every program's output right, nothing lost, every
//! donor death a runtime reported explained by a failure injected. Also the soak's refusals of
//! bad arguments. Needs root (network namespaces) and the soak's programs (scripts/setup.sh).
//!
//! CI injects every kind of failure: donor kill -9, restart, stall, link down, capacity
//! lowered, node kill. Before a failure hits a donor the soak waits until the runs have repaired
//! the last one (two copies survive one donor's loss at a time: `soak/repaired.rs`). Kills and
//! restarts were left out for a while: they lost pages through a donor suspected again right
//! after it was taken back (a stale prefetch connection, a read deadline breaking a frame),
//! fixed in issue 43.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn soak() -> Command {
    Command::new(env!("CARGO_BIN_EXE_farmem-bench"))
}

#[test]
fn a_short_soak_with_failures_injected_passes() {
    let o = soak()
        .args(["soak", "--minutes", "2", "--json"])
        .output()
        .expect("running farmem-bench soak");
    let err = String::from_utf8_lossy(&o.stderr);
    let seed_line = err
        .lines()
        .find(|l| l.contains("replay:"))
        .unwrap_or("(no seed printed)");
    let v: serde_json::Value = serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("no JSON verdict ({e}); {seed_line}\n{err}"));
    for key in [
        "seed",
        "failures_injected",
        "wrong_outputs",
        "state_lost_pages",
        "pages_lost",
        "seal_rejected",
        "failures_misreported",
        "injected_before_repair",
    ] {
        assert!(v.get(key).is_some(), "the verdict lacks {key}: {v}");
    }
    assert!(
        o.status.success() && v["passed"] == true,
        "the soak failed; {seed_line}\nverdict: {v:#}\n{err}"
    );
    assert!(v["failures_injected"].as_u64().unwrap() >= 5, "{v:#}");
    let programs = v["runs_by_program"].as_object().unwrap();
    assert_eq!(programs.len(), 6, "every program ran: {v:#}");
}

#[test]
fn bad_arguments_are_refused_with_a_reason() {
    for (args, says) in [
        (&["soak", "--minutes", "0"][..], "--minutes 0"),
        (&["soak", "--minutes", "-3"][..], "'-3'"),
        (&["soak", "--local-mem", "lots"][..], "lots"),
        (&["soak", "--programs", "doom"][..], "doom"),
        (&["soak", "--failures", "meteor"][..], "meteor"),
        (&["soak", "--seed", "x"][..], "x"),
        (&["soak", "--failures", ""][..], "--failures"),
        (
            &["soak", "--no-failures", "--failures", "node-kill"][..],
            "cannot be used with",
        ),
    ] {
        let o = soak().args(args).output().unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "{args:?} was accepted");
        assert!(err.contains(says), "{args:?}: {err}");
    }
}

/// The namespaces process `pid` created (the test kit names them after their owner).
fn namespaces_of(pid: u32) -> Vec<String> {
    let o = Command::new("ip").args(["netns", "list"]).output().unwrap();
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|ns| farmem_testkit::netns::ns_owner(ns) == Some(pid))
        .map(String::from)
        .collect()
}

#[test]
fn an_interrupted_soak_ends_its_runs_and_removes_what_it_set_up() {
    let mut child = soak()
        .args([
            "soak",
            "--minutes",
            "10",
            "--programs",
            "threads",
            "--no-failures",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting farmem-bench soak");
    let pid = child.id();
    let (tx, rx) = std::sync::mpsc::channel();
    let err = BufReader::new(child.stderr.take().unwrap());
    let reader = std::thread::spawn(move || {
        let mut all = String::new();
        for line in err.lines().map_while(Result::ok) {
            if let Some(dir) = line.strip_prefix("farmem-bench soak: work directory ") {
                let _ = tx.send(dir.to_string());
            }
            all.push_str(&line);
            all.push('\n');
        }
        all
    });
    let dir = rx
        .recv_timeout(Duration::from_secs(60))
        .expect("the soak names its work directory");
    // Its three donors' namespaces are up, and a run is under way.
    let up = Instant::now() + Duration::from_secs(120);
    while namespaces_of(pid).len() < 3 {
        assert!(Instant::now() < up, "the soak's namespaces did not come up");
        std::thread::sleep(Duration::from_millis(200));
    }
    std::thread::sleep(Duration::from_secs(5));
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::SIGINT,
    )
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(90);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("the interrupted soak did not end within 90 s");
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let log = reader.join().unwrap();
    assert_eq!(status.code(), Some(130), "{status}\n{log}");
    assert!(log.contains("cleaned up, no verdict"), "{log}");
    assert_eq!(namespaces_of(pid), Vec::<String>::new(), "{log}");
    assert!(
        !std::path::Path::new(&dir).exists(),
        "the work directory {dir} is left\n{log}"
    );
}
