//! `farmem node --socket-group GROUP --socket-mode MODE`: the socket is given to the group
//! with the mode asked for, a member of that group (user nobody with the group as a
//! supplementary group) uses the node, and a user outside it is told that a node runs but
//! this user may not use it — in `farmem stats --node` and `farmem run` alike — not that no
//! node runs; with no node there, the advice is to start one. Bad groups and modes are refused
//! at start in one line.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

use farmem_node::{child_node_command, ChildNode};
use farmem_testkit::run::{output_within, require_program};

/// The group the tests give the socket to: one this machine has (Debian's `nogroup`,
/// gid 65534, is what nobody's primary group is; a different one shows the flag works).
const GROUP: &str = "users";
const GID: u32 = 100;

fn farmem() -> Command {
    Command::new(env!("CARGO_BIN_EXE_farmem"))
}

fn text(o: &Output) -> String {
    format!(
        "status {:?}\nstdout:\n{}\nstderr:\n{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// A folder user nobody may search, for the socket.
fn open_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    dir
}

fn node(sock: &Path, extra: &[&str]) -> ChildNode {
    child_node_command(env!("CARGO_BIN_EXE_farmem"), sock)
        .args(["--capacity", "64MiB", "--slab-size", "1MiB"])
        .args(extra)
        .stderr(farmem_donor::ServerStderr::Capture)
        .spawn()
        .unwrap_or_else(|e| panic!("starting farmem node: {e}"))
}

/// `farmem ARGS` as user nobody; `groups` are its supplementary groups (none when empty).
/// It keeps CAP_SYS_PTRACE (ambient), which lets it open a userfaultfd without this machine's
/// /dev/userfaultfd or sysctls being changed: the node socket is what is tested here.
fn as_nobody(groups: &str, args: &[&str]) -> Output {
    let setpriv = require_program("setpriv", "util-linux");
    let mut c = Command::new(setpriv);
    c.args([
        "--reuid=65534",
        "--regid=65534",
        "--inh-caps=+sys_ptrace",
        "--ambient-caps=+sys_ptrace",
    ]);
    if groups.is_empty() {
        c.arg("--clear-groups");
    } else {
        c.arg(format!("--groups={groups}"));
    }
    c.arg(env!("CARGO_BIN_EXE_farmem")).args(args);
    output_within(&mut c, Duration::from_secs(60))
}

fn group_exists() {
    let g = std::fs::read_to_string("/etc/group").expect("reading /etc/group");
    assert!(
        g.lines()
            .any(|l| l.starts_with(&format!("{GROUP}:x:{GID}:"))),
        "this test needs group {GROUP} (gid {GID}) in /etc/group, as Debian has it"
    );
}

#[test]
fn a_member_of_the_socket_group_uses_the_node_and_others_are_told_they_may_not() {
    group_exists();
    let dir = open_dir();
    let sock = dir.path().join("node.sock");
    let _node = node(&sock, &["--socket-group", GROUP]);
    let meta = std::fs::metadata(&sock).unwrap();
    assert_eq!(meta.gid(), GID, "the socket's group");
    assert_eq!(meta.mode() & 0o7777, 0o660, "the socket's mode");
    let s = sock.to_str().unwrap();

    // A member: the node answers (its own clients only, the node's totals).
    let o = as_nobody(&GID.to_string(), &["stats", "--node", s, "--json"]);
    assert!(o.status.success(), "{}", text(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}", text(&o)));
    assert_eq!(v["capacity_bytes"], 64 << 20, "{v}");

    // Not a member: "runs but may not use it", with the socket's group and the fix.
    let o = as_nobody("", &["stats", "--node", s]);
    assert!(!o.status.success(), "{}", text(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains(&format!(
            "a farmem node runs at {s} but this user (uid 65534) may not use it"
        )),
        "{err}"
    );
    assert!(err.contains(&format!("group gid {GID}")), "{err}");
    assert!(err.contains("--socket-group GROUP"), "{err}");
    assert!(!err.contains("start one"), "not 'start one': {err}");

    // `farmem run` told to use that node says the same, and runs nothing (it was asked for
    // this node by name; without --node a program the host's node refuses runs without it).
    let o = as_nobody(
        "",
        &[
            "run",
            "--local-mem",
            "32MiB",
            "--node",
            s,
            "--",
            "/bin/sh",
            "-c",
            "echo ran",
        ],
    );
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(o.stdout.is_empty(), "{}", text(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("this user (uid 65534) may not use it"),
        "{err}"
    );
    assert!(!err.contains("start one"), "{err}");

    // And doctor.
    let o = as_nobody("", &["doctor", "--node", s]);
    let out = String::from_utf8_lossy(&o.stdout);
    let line = out
        .lines()
        .find(|l| l.contains("host tier node"))
        .unwrap_or_else(|| panic!("no node line: {}", text(&o)));
    assert!(line.starts_with("FAILED"), "{line}");
    assert!(line.contains("may not use it"), "{line}");
}

#[test]
fn mode_0600_keeps_the_group_out_and_bad_groups_and_modes_are_refused() {
    let dir = open_dir();
    let sock = dir.path().join("node.sock");
    {
        let _node = node(&sock, &["--socket-mode", "0600", "--socket-group", "100"]);
        let meta = std::fs::metadata(&sock).unwrap();
        assert_eq!(meta.mode() & 0o7777, 0o600);
        let o = as_nobody("100", &["stats", "--node", sock.to_str().unwrap()]);
        assert!(!o.status.success(), "{}", text(&o));
        assert!(
            String::from_utf8_lossy(&o.stderr).contains("may not use it"),
            "{}",
            text(&o)
        );
    }
    // No node there: the advice is to start one, not a permission problem.
    let gone = dir.path().join("none.sock");
    let o = output_within(
        farmem().args(["stats", "--node", gone.to_str().unwrap()]),
        Duration::from_secs(30),
    );
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("no farmem node runs at"), "{err}");
    assert!(
        err.contains("start one (`farmem node --capacity SIZE"),
        "{err}"
    );

    let s = dir.path().join("bad.sock");
    let s = s.to_str().unwrap();
    for (args, needle) in [
        (
            vec!["--socket-group", "no-such-group-farmem"],
            "no group named \"no-such-group-farmem\"",
        ),
        (vec!["--socket-mode", "0666"], "mode 0666 is not allowed"),
        (vec!["--socket-mode", "0640"], "mode 0640 is not allowed"),
        (vec!["--socket-mode", "rw"], "is not an octal mode"),
    ] {
        let o = output_within(
            farmem()
                .args(["node", "--capacity", "64MiB", "--socket", s])
                .args(&args),
            Duration::from_secs(30),
        );
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", text(&o));
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains(needle), "{args:?}: {err}");
        assert!(!Path::new(s).exists(), "no socket left: {args:?}");
    }
}
