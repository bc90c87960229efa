//! `farmem doctor` end to end: it passes on this machine (root, /dev/userfaultfd, Linux >= 6.8)
//! and prints one line per check; `--json` says the same; a check that fails (a donor address
//! that refuses connections) makes it exit non-zero, naming the address and what to do; a
//! refused token, a careless token file, several donors and a node this user may not use are
//! each told apart with their fix; so is each grant userfaultfd lacks (the device's permission,
//! a seccomp filter, vm.unprivileged_userfaultfd). In a container: tests/container.rs.

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
    "/dev/userfaultfd",
    "seccomp",
    "vm.unprivileged_userfaultfd",
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
        .find(|l| l.contains(&format!("donor {addr}")))
        .unwrap_or_else(|| panic!("no donor line:\n{out}"));
    assert!(line.starts_with("FAILED "), "{line}");
    assert!(line.contains("nothing answers at"), "{line}");
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

/// The line of check `name` in doctor's table output.
fn line_of(o: &Output, name: &str) -> String {
    let out = String::from_utf8_lossy(&o.stdout);
    out.lines()
        .find(|l| l.get(8..).is_some_and(|r| r.starts_with(name)))
        .unwrap_or_else(|| panic!("no line for {name}:\n{out}"))
        .to_string()
}

#[test]
fn a_refused_token_is_named_as_the_cause_and_each_donor_is_checked() {
    use farmem_testkit::donor::Donor;
    use std::os::unix::fs::PermissionsExt;
    let dir = farmem_testkit::run::Scratch::new("doctor-token");
    let good = dir.path("good");
    let wrong = dir.path("wrong");
    std::fs::write(&good, "the-donors-token\n").unwrap();
    std::fs::write(&wrong, "not-the-token\n").unwrap();
    for f in [&good, &wrong] {
        std::fs::set_permissions(f, std::fs::Permissions::from_mode(0o600)).unwrap();
    }
    let a = Donor::spawn(&[
        "--capacity",
        "64MiB",
        "--token-file",
        good.to_str().unwrap(),
    ]);
    let b = Donor::spawn(&[
        "--capacity",
        "64MiB",
        "--token-file",
        good.to_str().unwrap(),
    ]);
    let (a, b) = (a.addr.to_string(), b.addr.to_string());
    // The wrong token: the refusal is the cause, not "start a donor there".
    let o = doctor(&["--donor", &a, "--token-file", wrong.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let line = line_of(&o, &format!("donor {a}"));
    assert!(
        line.starts_with("FAILED ") && line.contains("refused the auth token"),
        "{line}"
    );
    assert!(!line.contains("start a donor"), "{line}");
    // The right one, two donors: a line each, with what each lends.
    let o = doctor(&[
        "--donor",
        &a,
        "--donor",
        &b,
        "--token-file",
        good.to_str().unwrap(),
    ]);
    for d in [&a, &b] {
        let line = line_of(&o, &format!("donor {d}"));
        assert!(
            line.starts_with("ok ") && line.contains("lends 64.0 MiB in slabs of"),
            "{line}"
        );
    }
    assert!(line_of(&o, "token file").starts_with("ok "), "{}", text(&o));
    // A token file others may read: said, with the fix, and the donors not asked with it.
    std::fs::set_permissions(&wrong, std::fs::Permissions::from_mode(0o644)).unwrap();
    let o = doctor(&["--donor", &a, "--token-file", wrong.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let line = line_of(&o, "token file");
    assert!(
        line.starts_with("FAILED ") && line.contains("chmod 600"),
        "{line}"
    );
}

#[test]
fn a_node_this_user_may_not_use_is_told_from_one_not_running() {
    use std::os::unix::fs::PermissionsExt;
    let setpriv = farmem_testkit::run::require_program("setpriv", "util-linux");
    let dir = farmem_testkit::run::Scratch::new("doctor-node");
    std::fs::set_permissions(&dir.0, std::fs::Permissions::from_mode(0o755)).unwrap();
    let socket = dir.path("node.sock");
    // Not running: a note (farmem run starts a private node).
    let o = doctor(&["--node", socket.to_str().unwrap()]);
    let line = line_of(&o, "host tier node");
    assert!(
        line.starts_with("note ") && line.contains("no node runs at"),
        "{line}"
    );
    let _node = farmem_node::child::child_node_command(env!("CARGO_BIN_EXE_farmem"), &socket)
        .args(["--capacity", "64MiB"])
        .spawn()
        .unwrap_or_else(|e| panic!("the node did not start: {e}"));
    std::fs::set_permissions(&socket, std::fs::Permissions::from_mode(0o600)).unwrap();
    // Root uses it.
    let o = doctor(&["--node", socket.to_str().unwrap()]);
    let line = line_of(&o, "host tier node");
    assert!(
        line.starts_with("ok ") && line.contains("lends 64.0 MiB"),
        "{line}"
    );
    // Another user may not: said so, with the socket's mode and owner, not "start one".
    let o = Command::new(setpriv)
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(env!("CARGO_BIN_EXE_farmem"))
        .args(["doctor", "--node", socket.to_str().unwrap()])
        .output()
        .unwrap();
    let line = line_of(&o, "host tier node");
    assert!(
        line.starts_with("FAILED ") && line.contains("this user may not use it"),
        "{line}"
    );
    assert!(line.contains("mode 0600, uid 0"), "{line}");
    assert!(!line.contains("start one"), "{line}");
}

/// Under a seccomp filter that refuses userfaultfd (as a container engine's default profile
/// does), doctor and run name the filter and the fix, not a missing permission of this user.
#[test]
fn a_seccomp_filter_refusing_userfaultfd_is_named_with_the_fix() {
    use farmem_testkit::run::{c_source, compile_c, Scratch};
    let dir = Scratch::new("doctor-seccomp");
    let jail = dir.path("no_uffd_seccomp");
    compile_c(&c_source("no_uffd_seccomp.c"), &jail, &[]);
    let o = Command::new(&jail)
        .arg(env!("CARGO_BIN_EXE_farmem"))
        .arg("doctor")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let line = line_of(&o, "userfaultfd ");
    assert!(line.starts_with("FAILED "), "{line}");
    assert!(
        line.contains("refused under the seccomp filter on this process"),
        "{line}"
    );
    assert!(line.contains("--security-opt seccomp="), "{line}");
    assert!(!line.contains("run as root"), "{line}");
    // Root opens the device, so the refusal was its ioctl's: the filter is named, the device
    // and the sysctl are not missing.
    let sec = line_of(&o, "seccomp");
    assert!(
        sec.starts_with("FAILED ") && sec.contains("refuses USERFAULTFD_IOC_NEW"),
        "{sec}"
    );
    assert!(
        line_of(&o, "/dev/userfaultfd").starts_with("ok "),
        "{}",
        text(&o)
    );
    assert!(
        line_of(&o, "vm.unprivileged_userfaultfd").starts_with("ok "),
        "{}",
        text(&o)
    );

    farmem_testkit::bins::require_preload_lib();
    let o = Command::new(&jail)
        .arg(env!("CARGO_BIN_EXE_farmem"))
        .args(["run", "--local-mem", "64MiB", "--", "true"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("refused under the seccomp filter"), "{err}");
}

/// The donors' room against the far memory expected: counted with the copies `farmem run`
/// keeps, a full donor and a donor whose small slabs set every far slab's size are named, and
/// more replicas than donors fails.
#[test]
fn far_capacity_is_checked_against_far_mem_with_replicas() {
    use farmem_testkit::donor::Donor;
    use farmem_transport::{ClientConfig, DonorClient};
    let big = Donor::spawn(&["--capacity", "256MiB", "--slab-size", "4MiB"]);
    let small_slabs = Donor::spawn(&["--capacity", "64MiB", "--slab-size", "128KiB"]);
    let full = Donor::spawn(&["--capacity", "8MiB", "--slab-size", "4MiB"]);
    let holder = DonorClient::connect(&full.addr.to_string(), ClientConfig::default()).unwrap();
    holder.alloc_slab().unwrap();
    holder.alloc_slab().unwrap();
    let (a, b, c) = (
        big.addr.to_string(),
        small_slabs.addr.to_string(),
        full.addr.to_string(),
    );
    let args = |extra: &[&str]| {
        let mut v = vec!["--donor", &a, "--donor", &b, "--donor", &c];
        v.extend_from_slice(extra);
        v.iter().map(|s| s.to_string()).collect::<Vec<_>>()
    };
    let run = |extra: &[&str]| {
        let a = args(extra);
        doctor(&a.iter().map(String::as_str).collect::<Vec<_>>())
    };

    // 320 MiB free over three donors, two copies of each page: room for 64 MiB (the small
    // donor pairs with the big one; the full one holds nothing).
    let o = run(&["--far-mem", "1GiB"]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let cap = line_of(&o, "far capacity");
    assert!(cap.starts_with("FAILED "), "{cap}");
    assert!(
        cap.contains("3 of 3 donor(s) answer with 320.0 MiB free; 2 copies of each far page: room for 64.0 MiB"),
        "{cap}"
    );
    assert!(cap.contains("less than --far-mem 1.0 GiB"), "{cap}");
    assert!(
        cap.contains("add donors, raise their --capacity, or lower --replicas"),
        "{cap}"
    );
    let room = line_of(&o, &format!("donor {c} room"));
    assert!(
        room.starts_with("note ") && room.contains("full: 8.0 MiB of 8.0 MiB used"),
        "{room}"
    );
    let trip = line_of(&o, &format!("donor {c} "));
    assert!(
        trip.starts_with("note ") && trip.contains("has no room for a slab now"),
        "{trip}"
    );
    let slabs = line_of(&o, "donor slab sizes");
    assert!(
        slabs.contains(&format!(
            "{b}'s slabs of 128.0 KiB set every far slab to that size (32x"
        )),
        "{slabs}"
    );

    // One copy: room for all 320 MiB; enough for 200 MiB, so no failure (notes only).
    let o = run(&["--far-mem", "200MiB", "--replicas", "1"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let cap = line_of(&o, "far capacity");
    assert!(
        cap.starts_with("ok ") && cap.contains("room for 320.0 MiB"),
        "{cap}"
    );
    assert!(cap.contains("enough for --far-mem 200.0 MiB"), "{cap}");

    let o = run(&["--replicas", "4"]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(
        line_of(&o, "far capacity").contains("--replicas 4 needs 4 donors, 3 given"),
        "{}",
        text(&o)
    );
    // --far-mem without a donor is a usage error.
    let o = doctor(&["--far-mem", "1GiB"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
}

/// A user the device is not given to, on this host: the device's permission is named with the
/// fix for this uid, no seccomp filter is blamed, and vm.unprivileged_userfaultfd is told as
/// the host has it (read, never written).
#[test]
fn a_user_without_the_device_is_told_each_missing_grant() {
    let setpriv = farmem_testkit::run::require_program("setpriv", "util-linux");
    let o = Command::new(setpriv)
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(env!("CARGO_BIN_EXE_farmem"))
        .arg("doctor")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let dev = line_of(&o, "/dev/userfaultfd");
    assert!(
        dev.starts_with("FAILED ") && dev.contains("but uid 65534 may not open it"),
        "{dev}"
    );
    assert!(
        dev.contains("setfacl -m u:65534:rw /dev/userfaultfd"),
        "{dev}"
    );
    let sec = line_of(&o, "seccomp");
    assert!(
        sec.starts_with("ok ") && sec.contains("no seccomp filter"),
        "{sec}"
    );
    let sysctl = std::fs::read_to_string("/proc/sys/vm/unprivileged_userfaultfd").unwrap();
    let ctl = line_of(&o, "vm.unprivileged_userfaultfd");
    if sysctl.trim() == "0" {
        assert!(
            ctl.starts_with("FAILED ") && ctl.contains("0, and this process lacks CAP_SYS_PTRACE"),
            "{ctl}"
        );
        assert!(
            ctl.contains("sysctl -w vm.unprivileged_userfaultfd=1"),
            "{ctl}"
        );
    } else {
        assert!(
            ctl.starts_with("ok ") && ctl.contains("1: every user"),
            "{ctl}"
        );
    }
}
