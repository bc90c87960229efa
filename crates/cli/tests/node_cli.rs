//! `farmem node` and `farmem stats --node` end to end: a real node process on a socket in a
//! temp folder; refusals at start (capacity above the machine's memory, bad sizes and flags)
//! each in one clear line; `--help`; `--resize` by root and refused for another user; the
//! stats table and JSON with a client holding slabs, before and after it takes a hold.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

use farmem_node::{child_node_command, ChildNode, NodeClient, NodeClientConfig, NodeStats};
use farmem_testkit::run::output_within;

fn farmem(args: &[&str]) -> Output {
    output_within(
        Command::new(env!("CARGO_BIN_EXE_farmem")).args(args),
        Duration::from_secs(60),
    )
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// A node on DIR/node.sock (DIR 0755, so other users may reach the socket if its mode lets
/// them).
fn node(dir: &Path, capacity: &str) -> ChildNode {
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    child_node_command(env!("CARGO_BIN_EXE_farmem"), &dir.join("node.sock"))
        .args(["--capacity", capacity, "--slab-size", "1MiB"])
        .stderr(farmem_donor::ServerStderr::Capture)
        .spawn()
        .unwrap_or_else(|e| panic!("starting farmem node: {e}"))
}

fn sock(dir: &Path) -> String {
    dir.join("node.sock").to_str().unwrap().to_string()
}

#[test]
fn a_capacity_above_the_machines_memory_is_refused_in_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let out = farmem(&["node", "--capacity", "64TiB", "--socket", &sock(dir.path())]);
    assert!(!out.status.success());
    let err = stderr(&out);
    assert_eq!(err.trim().lines().count(), 1, "one line: {err}");
    assert!(
        err.contains("more than the machine's memory") || err.contains("cgroup limit"),
        "{err}"
    );
    assert!(err.contains("give a --capacity of at most"), "{err}");
    assert!(out.stdout.is_empty(), "no banner");
    assert!(
        !dir.path().join("node.sock").exists(),
        "no socket left behind"
    );
}

#[test]
fn bad_sizes_and_flags_are_clear_errors() {
    let dir = tempfile::tempdir().unwrap();
    let s = sock(dir.path());
    for (args, needle) in [
        (
            vec!["node", "--capacity", "12XB", "--socket", &s],
            "unknown unit",
        ),
        (
            vec![
                "node",
                "--capacity",
                "64MiB",
                "--slab-size",
                "1000",
                "--socket",
                &s,
            ],
            "multiple of 4096",
        ),
        (
            vec!["node", "--capacity", "1MiB", "--socket", &s],
            "holds not one slab",
        ),
        (vec!["node", "--socket", &s], "--capacity"),
        (
            vec![
                "node",
                "--capacity",
                "64MiB",
                "--resize",
                "1GiB",
                "--socket",
                &s,
            ],
            "cannot be used with",
        ),
        (
            vec!["node", "--capacity", "64MiB", "--bogus"],
            "unexpected argument",
        ),
        (
            vec!["node", "--resize", "1GiB", "--socket", &s],
            "no farmem node runs at",
        ),
    ] {
        let out = farmem(&args);
        assert!(!out.status.success(), "{args:?} succeeded");
        let err = stderr(&out);
        assert!(
            err.contains(needle),
            "{args:?}: {needle:?} missing from {err}"
        );
    }
}

#[test]
fn help_says_what_the_node_is_for_who_may_connect_and_what_pressure_does() {
    let out = farmem(&["node", "--help"]);
    assert!(out.status.success());
    let help = String::from_utf8_lossy(&out.stdout);
    for needle in [
        "host tier",
        "mode 0660",
        "owner and group",
        "Clients check the socket",
        "--keep-free",
        "MemAvailable",
        "give back",
        "--resize",
        "/run/farmem/node.sock",
    ] {
        assert!(
            help.contains(needle),
            "{needle:?} missing from --help:\n{help}"
        );
    }
}

#[test]
fn resize_by_root_works_and_another_user_is_denied() {
    let dir = tempfile::tempdir().unwrap();
    let _node = node(dir.path(), "8MiB");
    let s = sock(dir.path());
    let out = farmem(&["node", "--resize", "4MiB", "--socket", &s]);
    assert!(out.status.success(), "{}", stderr(&out));
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(said.contains("capacity 8.0 MiB -> 4.0 MiB"), "{said}");
    // nobody may connect (the socket's group is made nobody's) but not resize.
    std::os::unix::fs::chown(dir.path().join("node.sock"), None, Some(65534)).unwrap();
    let out = output_within(
        Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
            .arg(env!("CARGO_BIN_EXE_farmem"))
            .args(["node", "--resize", "1GiB", "--socket", &s]),
        Duration::from_secs(60),
    );
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(err.contains("only root or the node's own user"), "{err}");
    let c = NodeClient::connect(Path::new(&s), NodeClientConfig::default()).unwrap();
    assert_eq!(c.stats().unwrap().capacity_bytes, 4 << 20);
}

#[test]
fn stats_node_prints_a_table_and_json_with_the_clients() {
    let dir = tempfile::tempdir().unwrap();
    let node = node(dir.path(), "8MiB");
    let s = sock(dir.path());
    let c = NodeClient::connect(&node.banner().path, NodeClientConfig::default()).unwrap();
    let slabs: Vec<_> = (0..3).map(|_| c.alloc_slab().unwrap()).collect();
    let out = farmem(&["stats", "--node", &s, "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let st: NodeStats = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(st.capacity_bytes, 8 << 20);
    assert_eq!(st.used_bytes, 3 << 20);
    assert_eq!(
        st.clients.len(),
        1,
        "the stats command itself is not listed: {st:?}"
    );
    assert_eq!(st.clients[0].pid, std::process::id());
    assert_eq!(st.clients[0].slabs, 3);
    assert_eq!((st.holds, st.held_slabs, st.kept_slabs), (0, 0, 0));
    let out = farmem(&["stats", "--node", &s]);
    assert!(out.status.success(), "{}", stderr(&out));
    let table = String::from_utf8_lossy(&out.stdout);
    for needle in [
        format!("node {s}"),
        "capacity     8.0 MiB".to_string(),
        "3.0 MiB (37.5%) in 3 slabs of 1.0 MiB".to_string(),
        "keep-free    off".to_string(),
        "holds        0 live, naming 0 slabs".to_string(),
        "kept         0 slabs no client holds".to_string(),
        "reclaims     0 asked".to_string(),
        format!("pid {:<8}", std::process::id()),
        "3 slabs (3.0 MiB)".to_string(),
    ] {
        assert!(table.contains(&needle), "{needle:?} missing from\n{table}");
    }

    // A hold over two of the slabs, one of them then freed: that one is kept for the hold (still
    // used, no longer the client's).
    let hold = c.hold_slabs(&[slabs[0].id, slabs[1].id]).unwrap();
    c.free_slab(slabs[0].id).unwrap();
    let out = farmem(&["stats", "--node", &s, "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let st: NodeStats = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        (st.holds, st.held_slabs, st.kept_slabs),
        (1, 2, 1),
        "{st:?}"
    );
    let out = farmem(&["stats", "--node", &s]);
    assert!(out.status.success(), "{}", stderr(&out));
    let table = String::from_utf8_lossy(&out.stdout);
    for needle in [
        "3.0 MiB (37.5%) in 3 slabs of 1.0 MiB",
        "holds        1 live, naming 2 slabs",
        "kept         1 slabs no client holds",
        "2 slabs (2.0 MiB)",
    ] {
        assert!(table.contains(needle), "{needle:?} missing from\n{table}");
    }
    drop((hold, slabs));
    // No node there: a clear error.
    let out = farmem(&["stats", "--node", "/nonexistent/node.sock"]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("could not reach the node"),
        "{}",
        stderr(&out)
    );
}
