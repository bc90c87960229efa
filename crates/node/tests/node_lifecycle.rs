//! A node's life and death as its clients see it: kill -9 of the node leaves every mapped slab
//! valid (written pages intact, still writable) while requests fail with `Gone`; SIGTERM stops
//! it cleanly and removes its socket; a private node (`--exit-with-parent`) dies with the
//! thread that started it.

mod common;

use std::time::{Duration, Instant};

use common::{text, Node, SLAB};
use farmem_node::{child_node_command, NodeClient, NodeClientConfig, NodeError};
use farmem_testkit::bins::farmem;
use farmem_testkit::pages::{Stamp, PAGE};
use farmem_testkit::scenario::{self, Scenario};

fn wait_until(what: &str, limit: Duration, cond: impl Fn() -> bool) {
    let until = Instant::now() + limit;
    while !cond() {
        assert!(Instant::now() < until, "waited {limit:?} for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn kill_9_of_the_node_keeps_mapped_slabs_and_fails_requests_with_gone() {
    let node = Node::with_slabs(4);
    let c = node.client();
    let slabs: Vec<_> = (0..2).map(|_| c.alloc_slab().unwrap()).collect();
    let pages = SLAB as usize / PAGE;
    let stamp = Stamp {
        step: 16,
        salt: 0x5eed,
    };
    for (i, s) in slabs.iter().enumerate() {
        for p in 0..pages {
            stamp.write_page(s.mapping.addr(), p, i as u64);
        }
    }
    assert!(c.is_alive());
    drop(node); // SIGKILL and reap
    wait_until(
        "the client to see the node gone",
        Duration::from_secs(10),
        || !c.is_alive(),
    );
    assert!(matches!(c.alloc_slab(), Err(NodeError::Gone)));
    assert!(matches!(c.free_slab(slabs[0].id), Err(NodeError::Gone)));
    assert!(matches!(c.stats(), Err(NodeError::Gone)));
    // Nothing already written is lost, and the slabs stay usable.
    for (i, s) in slabs.iter().enumerate() {
        for p in 0..pages {
            stamp.check_page(s.mapping.addr(), p, i as u64);
            stamp.write_page(s.mapping.addr(), p, 10 + i as u64);
            stamp.check_page(s.mapping.addr(), p, 10 + i as u64);
        }
    }
    assert!(NodeError::Gone
        .to_string()
        .contains("slabs already mapped stay valid"));
}

#[test]
fn sigterm_stops_the_node_cleanly_and_removes_its_socket() {
    let mut node = Node::with_slabs(2);
    let c = node.client();
    let _slab = c.alloc_slab().unwrap();
    let pid = rustix::process::Pid::from_raw(node.child.pid() as i32).unwrap();
    rustix::process::kill_process(pid, rustix::process::Signal::TERM).unwrap();
    let status = node
        .child
        .wait_timeout(Duration::from_secs(30))
        .unwrap()
        .expect("the node exits on SIGTERM");
    assert!(status.success(), "{status:?}: {}", node.stderr());
    assert!(!node.path.exists(), "the socket file is removed");
    assert_eq!(
        node.child.stdout_after_banner().as_deref(),
        Some(""),
        "the banner is the only stdout line"
    );
    wait_until(
        "the client to see the node gone",
        Duration::from_secs(10),
        || !c.is_alive(),
    );
}

/// In its own process: starts a private node on FARMEM_TEST_NODE, says READY, and on GO dies
/// by SIGKILL (the node must follow it).
#[test]
#[ignore = "run by a_private_node_dies_with_its_parent in a process of its own"]
fn scenario_parent_of_a_private_node() {
    let path = std::env::var("FARMEM_TEST_NODE").expect("FARMEM_TEST_NODE");
    let _node = child_node_command(farmem(), path.as_ref())
        .args(["--capacity", "4MiB", "--slab-size", "1MiB"])
        .spawn()
        .unwrap();
    scenario::ready();
    let me = rustix::process::getpid();
    rustix::process::kill_process(me, rustix::process::Signal::KILL).unwrap();
}

#[test]
fn a_private_node_dies_with_its_parent() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("private.sock");
    let parent = Scenario::start(
        "scenario_parent_of_a_private_node",
        &[("FARMEM_TEST_NODE", text(&path).to_string())],
    );
    NodeClient::connect(&path, NodeClientConfig::default()).expect("the private node serves");
    let _ = parent.go(Duration::from_secs(30));
    wait_until(
        "the private node to die with its parent",
        Duration::from_secs(10),
        || std::os::unix::net::UnixStream::connect(&path).is_err(),
    );
}
