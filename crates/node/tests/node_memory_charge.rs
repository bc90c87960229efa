//! Where the host tier's memory is charged: a real `farmem node` in one memory cgroup, a client
//! process in another with a 32 MiB limit. The client maps 64 MiB of slabs and writes every page;
//! its cgroup's peak grows by far less than 64 MiB (the node allocated the pages, so they are
//! the node's), the node's cgroup grows by the 64 MiB, and the client reads its pages back.
//!
//! Uses cgroup v2 when it has the memory controller, else the v1 memory hierarchy (this machine
//! kind has only v1's); with neither the test fails and says so. The test cgroups are made
//! inside this process's own memory cgroup and removed afterwards.

mod common;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use common::{Node, SLAB};
use farmem_testkit::pages::{fill, mismatches, PAGE};
use farmem_testkit::scenario::{self, Scenario};

const MIB: u64 = 1 << 20;
const SLABS: u64 = 64;

#[derive(Clone, Copy, Debug)]
enum Version {
    V1,
    V2,
}

/// A memory cgroup made for the test, removed when dropped (after its processes are gone).
struct TestCgroup {
    path: PathBuf,
    version: Version,
}

/// This process's memory cgroup folder and the hierarchy's version.
fn own_memory_cgroup() -> (PathBuf, Version) {
    let cgroups = std::fs::read_to_string("/proc/self/cgroup").expect("reading /proc/self/cgroup");
    let has_memory = |root: &str| {
        std::fs::read_to_string(format!("{root}/cgroup.controllers"))
            .is_ok_and(|c| c.split_whitespace().any(|x| x == "memory"))
    };
    for line in cgroups.lines() {
        let mut parts = line.splitn(3, ':');
        let (_, controllers, rel) = (parts.next(), parts.next(), parts.next());
        let (Some(controllers), Some(rel)) = (controllers, rel) else {
            continue;
        };
        let rel = rel.trim_start_matches('/');
        if controllers.is_empty() {
            for root in ["/sys/fs/cgroup", "/sys/fs/cgroup/unified"] {
                if has_memory(root) {
                    return (PathBuf::from(root).join(rel), Version::V2);
                }
            }
        } else if controllers.split(',').any(|c| c == "memory") {
            let root = PathBuf::from("/sys/fs/cgroup/memory");
            if root.join("memory.limit_in_bytes").exists() {
                return (root.join(rel), Version::V1);
            }
        }
    }
    panic!(
        "this test needs a cgroup memory controller: cgroup v2 with `memory` in \
         /sys/fs/cgroup/cgroup.controllers, or the v1 hierarchy at /sys/fs/cgroup/memory; \
         neither is there (mount one, e.g. `mount -t cgroup2 none /sys/fs/cgroup`)"
    );
}

impl TestCgroup {
    fn create(tag: &str, limit_bytes: Option<u64>) -> TestCgroup {
        let (parent, version) = own_memory_cgroup();
        if let Version::V2 = version {
            // Children get the memory controller only if the parent hands it down.
            let _ = std::fs::write(parent.join("cgroup.subtree_control"), "+memory");
        }
        let path = parent.join(format!("farmem-test-{}-{tag}", std::process::id()));
        std::fs::create_dir(&path)
            .unwrap_or_else(|e| panic!("creating the cgroup {}: {e}", path.display()));
        let cg = TestCgroup { path, version };
        if let Some(limit) = limit_bytes {
            let file = match version {
                Version::V1 => "memory.limit_in_bytes",
                Version::V2 => "memory.max",
            };
            cg.write(file, &limit.to_string());
        }
        cg
    }

    fn write(&self, file: &str, value: &str) {
        std::fs::write(self.path.join(file), value)
            .unwrap_or_else(|e| panic!("writing {value} to {}/{file}: {e}", self.path.display()));
    }

    fn read(&self, file: &str) -> u64 {
        let p = self.path.join(file);
        std::fs::read_to_string(&p)
            .unwrap_or_else(|e| panic!("reading {}: {e}", p.display()))
            .trim()
            .parse()
            .unwrap_or_else(|e| panic!("{} is not a number: {e}", p.display()))
    }

    fn procs(&self) -> PathBuf {
        self.path.join("cgroup.procs")
    }

    fn add(&self, pid: u32) {
        self.write("cgroup.procs", &pid.to_string());
    }

    fn current(&self) -> u64 {
        self.read(match self.version {
            Version::V1 => "memory.usage_in_bytes",
            Version::V2 => "memory.current",
        })
    }

    fn peak(&self) -> u64 {
        match self.version {
            Version::V1 => self.read("memory.max_usage_in_bytes"),
            Version::V2 if self.path.join("memory.peak").exists() => self.read("memory.peak"),
            Version::V2 => self.current(),
        }
    }
}

impl Drop for TestCgroup {
    fn drop(&mut self) {
        // The processes were killed first; the kernel may take a moment to let go.
        let until = Instant::now() + Duration::from_secs(10);
        while std::fs::remove_dir(&self.path).is_err() && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// In its own process: joins the cgroup whose `cgroup.procs` is FARMEM_TEST_CGROUP_PROCS, takes
/// 64 slabs from the node at FARMEM_TEST_NODE, writes every page, says READY; on GO checks every
/// page and exits.
#[test]
#[ignore = "run by the_tier_is_charged_to_the_node_not_the_client in a process of its own"]
fn scenario_client_in_a_small_cgroup() {
    let procs = std::env::var("FARMEM_TEST_CGROUP_PROCS").expect("FARMEM_TEST_CGROUP_PROCS");
    std::fs::write(&procs, std::process::id().to_string()).expect("joining the client cgroup");
    let node = std::env::var("FARMEM_TEST_NODE").expect("FARMEM_TEST_NODE");
    let c = farmem_node::NodeClient::connect(node.as_ref(), Default::default()).unwrap();
    let pages = (SLAB as usize) / PAGE;
    let slabs: Vec<_> = (0..SLABS).map(|_| c.alloc_slab().unwrap()).collect();
    for (i, s) in slabs.iter().enumerate() {
        fill(s.mapping.addr(), pages, i as u64);
    }
    scenario::ready();
    for (i, s) in slabs.iter().enumerate() {
        assert_eq!(mismatches(s.mapping.addr(), pages, i as u64), 0, "slab {i}");
    }
}

#[test]
fn the_tier_is_charged_to_the_node_not_the_client() {
    let node_cg = TestCgroup::create("node", None);
    let client_cg = TestCgroup::create("client", Some(32 * MIB));
    let node = Node::start(&["--capacity", &(SLABS * SLAB).to_string()]);
    node_cg.add(node.child.pid());
    let node_before = node_cg.current();
    let client = Scenario::start(
        "scenario_client_in_a_small_cgroup",
        &[
            ("FARMEM_TEST_NODE", common::text(&node.path).to_string()),
            (
                "FARMEM_TEST_CGROUP_PROCS",
                client_cg.procs().to_str().unwrap().to_string(),
            ),
        ],
    );
    let client_peak = client_cg.peak();
    let node_after = node_cg.current();
    assert_eq!(node.stats().used_bytes, SLABS * SLAB);
    assert!(
        client_peak < 16 * MIB,
        "the client's cgroup peaked at {} MiB for {} MiB of tier pages written: they were charged to it",
        client_peak / MIB,
        SLABS * SLAB / MIB
    );
    assert!(
        node_after.saturating_sub(node_before) >= (SLABS - 4) * SLAB,
        "the node's cgroup grew by only {} MiB for {} MiB of slabs",
        node_after.saturating_sub(node_before) / MIB,
        SLABS * SLAB / MIB
    );
    let (status, out, err) = client.go(Duration::from_secs(60));
    assert!(
        status.success(),
        "the client read its pages back: {status:?}\n{out}\n{err}"
    );
    drop(node);
}
