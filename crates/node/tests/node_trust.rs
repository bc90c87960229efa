//! Trusting the node's socket, and the socket path's life: a socket others may write, one owned
//! by another user, one in a folder anyone may write, and a listener running as another user
//! are refused by clients (`Untrusted`); a second node on a live path refuses to start; a stale
//! socket file is replaced; anything else at the path is left alone.

mod common;

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::process::Command;
use std::time::Duration;

use common::{text, Node};
use farmem_node::{NodeClient, NodeClientConfig, NodeError};
use farmem_testkit::bins::farmem;
use farmem_testkit::run::output_within;

const NOBODY: u32 = 65534;

fn connect(path: &std::path::Path) -> Result<NodeClient, NodeError> {
    NodeClient::connect(path, NodeClientConfig::default())
}

fn untrusted(path: &std::path::Path, needle: &str) {
    match connect(path) {
        Err(e @ NodeError::Untrusted { .. }) => {
            assert!(e.to_string().contains(needle), "{needle:?} missing: {e}")
        }
        Err(e) => panic!("expected Untrusted, got {e}"),
        Ok(_) => panic!("connected to an untrusted socket"),
    }
}

#[test]
fn the_socket_is_0660_and_its_folder_is_made_0755() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("made/here/node.sock");
    let node = Node::start_at(dir, path.clone(), &["--capacity", "4MiB"]);
    let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o7777;
    assert_eq!(mode(&path), 0o660);
    assert_eq!(mode(path.parent().unwrap()), 0o755);
    connect(&node.path).unwrap();
}

#[test]
fn a_socket_others_may_write_is_untrusted() {
    let node = Node::with_slabs(2);
    std::fs::set_permissions(&node.path, std::fs::Permissions::from_mode(0o666)).unwrap();
    untrusted(&node.path, "chmod o-w");
    std::fs::set_permissions(&node.path, std::fs::Permissions::from_mode(0o660)).unwrap();
    connect(&node.path).unwrap();
}

#[test]
fn a_socket_owned_by_another_user_is_untrusted() {
    let node = Node::with_slabs(2);
    std::os::unix::fs::chown(&node.path, Some(NOBODY), None).unwrap();
    untrusted(&node.path, &format!("owned by uid {NOBODY}"));
    std::os::unix::fs::chown(&node.path, Some(0), None).unwrap();
    connect(&node.path).unwrap();
}

#[test]
fn a_socket_in_a_folder_anyone_may_write_is_untrusted_unless_sticky() {
    let node = Node::with_slabs(2);
    let dir = node.path.parent().unwrap();
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o777)).unwrap();
    untrusted(&node.path, "no sticky bit");
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o1777)).unwrap();
    connect(&node.path).unwrap();
}

#[test]
fn a_listener_running_as_another_user_is_untrusted() {
    // A node run as nobody, in a folder nobody owns; then its socket is made root's, so only
    // the peer's credentials (SO_PEERCRED) give it away.
    let top = tempfile::tempdir().unwrap();
    std::fs::set_permissions(top.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let dir = top.path().join("nobody");
    std::fs::create_dir(&dir).unwrap();
    std::os::unix::fs::chown(&dir, Some(NOBODY), Some(NOBODY)).unwrap();
    let path = dir.join("node.sock");
    let mut child = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(farmem())
        .args(["node", "--capacity", "4MiB", "--socket", text(&path)])
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("setpriv (util-linux) runs the node as nobody");
    let until = std::time::Instant::now() + Duration::from_secs(15);
    while !path.exists() {
        assert!(
            std::time::Instant::now() < until,
            "the node as nobody did not start"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(std::fs::metadata(&path).unwrap().uid(), NOBODY);
    std::os::unix::fs::chown(&dir, Some(0), Some(0)).unwrap();
    std::os::unix::fs::chown(&path, Some(0), Some(0)).unwrap();
    let outcome = connect(&path);
    let _ = child.kill();
    let _ = child.wait();
    match outcome {
        Err(e @ NodeError::Untrusted { .. }) => {
            assert!(e.to_string().contains("runs as uid 65534"), "{e}")
        }
        Err(e) => panic!("expected Untrusted, got {e}"),
        Ok(_) => panic!("trusted a node run by another user"),
    }
}

#[test]
fn a_second_node_on_a_live_socket_refuses_to_start() {
    let node = Node::with_slabs(2);
    let out = output_within(
        Command::new(farmem()).args(["node", "--capacity", "4MiB", "--socket", text(&node.path)]),
        Duration::from_secs(30),
    );
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.trim().lines().count(), 1, "one clear line: {err}");
    assert!(err.contains("already listening on"), "{err}");
    assert!(out.stdout.is_empty(), "no banner");
    // The first one still serves.
    connect(&node.path).unwrap().alloc_slab().unwrap();
}

#[test]
fn a_stale_socket_file_is_replaced_and_other_files_are_left_alone() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("node.sock");
    drop(std::os::unix::net::UnixListener::bind(&path).unwrap());
    assert!(path.exists(), "a stale socket file");
    let node = Node::start_at(dir, path, &["--capacity", "4MiB"]);
    connect(&node.path).unwrap().alloc_slab().unwrap();

    let other = tempfile::tempdir().unwrap();
    let file = other.path().join("node.sock");
    std::fs::write(&file, b"precious").unwrap();
    let out = output_within(
        Command::new(farmem()).args(["node", "--capacity", "4MiB", "--socket", text(&file)]),
        Duration::from_secs(30),
    );
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("is not a socket"), "{err}");
    assert_eq!(std::fs::read(&file).unwrap(), b"precious");
}

#[test]
fn a_peer_that_is_not_a_node_is_refused() {
    // Something listens on the socket but never says WELCOME.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("fake.sock");
    let l = std::os::unix::net::UnixListener::bind(&path).unwrap();
    let t = std::thread::spawn(move || {
        let (s, _) = l.accept().unwrap();
        std::thread::sleep(Duration::from_millis(300));
        drop(s);
    });
    let e = NodeClient::connect(
        &path,
        NodeClientConfig {
            timeout: Duration::from_secs(2),
            ..NodeClientConfig::default()
        },
    )
    .unwrap_err();
    assert!(
        matches!(e, NodeError::Protocol(ref m) if m.contains("did not answer as a farmem node")),
        "{e}"
    );
    t.join().unwrap();
}
