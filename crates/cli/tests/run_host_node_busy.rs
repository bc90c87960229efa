//! `farmem run`'s default uses the host's node on /run/farmem/node.sock when one answers; a node
//! that serves as many connections as it may, or does not answer in time, must not stop the
//! program: it runs without that node (on a private one), and says so.
//!
//! A test binary of its own, with one test: while its node listens on the default socket, any
//! other test's `farmem run` running beside it would use that node.

use std::path::Path;
use std::process::Command;

use farmem_node::child::child_node_command;
use farmem_node::{NodeClient, NodeClientConfig, DEFAULT_SOCKET_PATH};
use farmem_testkit::bins::farmem;
use farmem_testkit::run::*;

/// Removes the default socket when the test ends, however it ends.
struct RemoveSocket;

impl Drop for RemoveSocket {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(DEFAULT_SOCKET_PATH);
    }
}

#[test]
fn a_program_runs_without_the_host_s_node_when_it_is_full_or_stuck() {
    let default = Path::new(DEFAULT_SOCKET_PATH);
    assert!(
        NodeClient::connect(default, NodeClientConfig::default()).is_err(),
        "a farmem node already answers on {DEFAULT_SOCKET_PATH}: this test needs that socket \
         (stop that node, or run the test on another machine)"
    );
    let _cleanup = RemoveSocket;
    let dir = Scratch::new("node-busy");
    let prog = dir.path("seq_scan");
    compile_c(&c_source("seq_scan.c"), &prog, &[]);
    let want = Command::new(&prog).arg("96").output().unwrap().stdout;
    // A node that serves one connection, and a client that takes it.
    let node = child_node_command(farmem(), default)
        .args([
            "--capacity",
            "64MiB",
            "--slab-size",
            "4MiB",
            "--max-clients",
            "1",
        ])
        .spawn()
        .unwrap_or_else(|e| panic!("starting a node on {DEFAULT_SOCKET_PATH} (run as root): {e}"));
    let taken = NodeClient::connect(default, NodeClientConfig::default())
        .expect("the node's one connection");
    // Runs the scan; checks its output, that its overflow went to a private node, and that
    // it said why it did without the host's node.
    let run = |tag: &str, why: &str| {
        let stats = dir.path(&format!("{tag}.json"));
        let o = farmem_run(
            &["--local-mem", "32MiB", "--stats", stats.to_str().unwrap()],
            &[prog.to_str().unwrap(), "96"],
        );
        let t = text(&o);
        assert!(o.status.success(), "{tag}: {t}");
        assert_eq!(o.stdout, want, "{tag}: {t}");
        let s = read_stats(&stats);
        assert!(
            counter(&s, "tier_bytes_out") > 32 << 20,
            "{tag}: its overflow went to a private node: {s}"
        );
        assert!(
            t.contains(&format!(
                "not using the host's node at {DEFAULT_SOCKET_PATH}"
            )) && t.contains(why),
            "{tag}: the program says why it did without the host's node: {t}"
        );
    };
    run("full", "node full: it serves 1 clients");
    // A node that accepts but never answers (stopped).
    drop(taken);
    let pid = node.pid().to_string();
    let signal = |sig: &str| Command::new("kill").args([sig, &pid]).status().unwrap();
    assert!(signal("-STOP").success());
    run("stuck", "did not answer in time");
    signal("-CONT");
    drop(node);
}
