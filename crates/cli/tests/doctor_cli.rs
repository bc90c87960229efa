//! `farmem doctor` end to end: it passes on this machine (root, /dev/userfaultfd, Linux >= 6.8)
//! and prints one line per check; `--json` says the same; a check that fails (a donor address
//! that refuses connections) makes it exit non-zero, naming the address and what to do.

use std::process::{Command, Output};

fn doctor(extra: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_farmem"))
        .arg("doctor")
        .args(extra)
        .output()
        .expect("cannot run the farmem binary")
}

fn text(o: &Output) -> String {
    format!(
        "stdout:\n{}\nstderr:\n{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

const CHECKS: &[&str] = &[
    "kernel",
    "userfaultfd",
    "UFFD_FEATURE_PAGEFAULT_FLAG_WP",
    "UFFD_FEATURE_MOVE",
    "UFFD_FEATURE_POISON",
    "userfaultfd fault floor",
    "donor round trip",
];

#[test]
fn doctor_passes_here_and_prints_each_check() {
    let o = doctor(&[]);
    assert!(o.status.success(), "{}", text(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    for name in CHECKS {
        let line = out
            .lines()
            // "{status:<7} {name:<32} {detail}"
            .find(|l| l.get(8..40).map(str::trim_end) == Some(name))
            .unwrap_or_else(|| panic!("no line for {name}:\n{out}"));
        assert!(line.starts_with("ok "), "{line}");
    }
    assert!(!out.contains("FAILED"), "{out}");
    let floor = out
        .lines()
        .find(|l| l.contains("userfaultfd fault floor"))
        .unwrap();
    assert!(floor.contains("p50 ") && floor.contains(" µs"), "{floor}");
    let rtt = out
        .lines()
        .find(|l| l.contains("donor round trip"))
        .unwrap();
    assert!(rtt.contains("in-process donor 127.0.0.1:"), "{rtt}");
}

#[test]
fn doctor_json_lists_every_check() {
    let o = doctor(&["--json"]);
    assert!(o.status.success(), "{}", text(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("stdout is not JSON ({e}): {}", text(&o)));
    assert_eq!(v["ok"], true, "{v}");
    let checks = v["checks"].as_array().unwrap();
    for name in CHECKS {
        let c = checks
            .iter()
            .find(|c| c["name"] == *name)
            .unwrap_or_else(|| panic!("no check {name} in {v}"));
        assert_eq!(c["status"], "ok", "{c}");
        assert!(c["detail"].as_str().is_some_and(|d| !d.is_empty()), "{c}");
    }
}

#[test]
fn a_donor_that_refuses_connections_fails_the_doctor() {
    // A loopback port nobody listens on: bound, noted, released.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .unwrap()
        .port();
    let addr = format!("127.0.0.1:{port}");
    let o = doctor(&["--donor", &addr]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    let line = out
        .lines()
        .find(|l| l.contains("donor round trip"))
        .unwrap_or_else(|| panic!("no donor line:\n{out}"));
    assert!(line.starts_with("FAILED "), "{line}");
    assert!(line.contains(&addr), "{line}");
    assert!(line.contains("farmem donor --listen"), "{line}");
    // The other checks still ran and passed.
    assert!(
        out.lines()
            .any(|l| l.starts_with("ok ") && l.contains("kernel")),
        "{out}"
    );
    let json = doctor(&["--donor", &addr, "--json"]);
    assert_eq!(json.status.code(), Some(1), "{}", text(&json));
    let v: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    assert_eq!(v["ok"], false, "{v}");
}
