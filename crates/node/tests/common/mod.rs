//! Fixtures for the node's tests: a real `farmem node` child process on a socket in a temp
//! folder, clients of it, and waiting for its figures to settle.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use farmem_donor::ServerStderr;
use farmem_node::{child_node_command, ChildNode, NodeClient, NodeClientConfig, NodeStats};
use farmem_testkit::bins::farmem;

/// Slab size the tests use (small, so tests stay light).
pub const SLAB: u64 = 1 << 20;

/// A running `farmem node` (info logs, stderr captured), killed when dropped.
pub struct Node {
    pub child: ChildNode,
    pub path: PathBuf,
    pub dir: tempfile::TempDir,
}

impl Node {
    /// `farmem node --socket DIR/node.sock --slab-size 1MiB ARGS…`.
    pub fn start(args: &[&str]) -> Node {
        let dir = tempfile::tempdir().expect("a temp folder");
        let path = dir.path().join("node.sock");
        Node::start_at(dir, path, args)
    }

    /// A node on `path` (inside `dir`, which the node keeps alive).
    pub fn start_at(dir: tempfile::TempDir, path: PathBuf, args: &[&str]) -> Node {
        let child = child_node_command(farmem(), &path)
            .args(["--slab-size", "1MiB"])
            .args(args)
            .env("FARMEM_LOG", "info")
            .stderr(ServerStderr::Capture)
            .spawn()
            .unwrap_or_else(|e| panic!("starting farmem node {args:?}: {e}"));
        assert_eq!(child.banner().path, path);
        Node { child, path, dir }
    }

    /// A node lending `slabs` slabs of [`SLAB`].
    pub fn with_slabs(slabs: u64) -> Node {
        Node::start(&["--capacity", &(slabs * SLAB).to_string()])
    }

    /// A new client.
    pub fn client(&self) -> NodeClient {
        NodeClient::connect(&self.path, NodeClientConfig::default())
            .unwrap_or_else(|e| panic!("connecting to the node: {e}"))
    }

    /// The node's figures, through a client of its own.
    pub fn stats(&self) -> NodeStats {
        self.client().stats().expect("STATS")
    }

    /// Waits (10 s at most) until `pred` holds for the node's figures; returns them.
    pub fn wait_for(&self, what: &str, pred: impl Fn(&NodeStats) -> bool) -> NodeStats {
        let until = Instant::now() + Duration::from_secs(10);
        loop {
            let s = self.stats();
            if pred(&s) {
                return s;
            }
            assert!(
                Instant::now() < until,
                "waited 10 s for {what}; the node's figures: {s:#?}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// What the node wrote to stderr so far.
    pub fn stderr(&mut self) -> String {
        self.child.stderr_text().unwrap_or_default()
    }
}

/// The socket path of a node, as text.
pub fn text(p: &Path) -> &str {
    p.to_str().expect("a UTF-8 temp path")
}
