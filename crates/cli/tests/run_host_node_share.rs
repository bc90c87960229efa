//! A local user that takes every slab of the host's node must not break another user's budget:
//! root's `farmem run` on that node (no donors) falls back to a private node for the pages the
//! node has no room for, says why once, keeps its budget and prints the right output.
//!
//! The hostile user is a real process of uid 65534 (`setpriv`) speaking raw frames to a real
//! `farmem node`; the program is a real C program paging twice its budget.

use std::io::{BufRead, BufReader};
use std::os::unix::fs::PermissionsExt;
use std::process::{Command, Stdio};

use farmem_node::child::child_node_command;
use farmem_node::{NodeClient, NodeClientConfig};
use farmem_testkit::bins::farmem;
use farmem_testkit::run::*;

/// ALLOCs slabs until refused, prints `got N`, keeps them until stdin closes.
const GRAB_ALL: &str = r#"
import socket, struct, sys
s = socket.socket(socket.AF_UNIX)
s.connect(sys.argv[1])
s.sendall(struct.pack('<IBH', 2, 0x01, 1))
fds, got = [], 0
def rx():
    msg, anc, _, _ = s.recvmsg(5, socket.CMSG_SPACE(16))
    fds.extend(anc)
    if len(msg) < 5:
        msg += s.recv(5 - len(msg), socket.MSG_WAITALL)
    ln, op = struct.unpack('<IB', msg)
    return op, (s.recv(ln, socket.MSG_WAITALL) if ln else b'')
assert rx()[0] == 0x81
while True:
    s.sendall(struct.pack('<IBI', 4, 0x02, got))
    op, p = rx()
    if op != 0x82:
        break
    got += 1
print('got', got, flush=True)
sys.stdin.read()
"#;

#[test]
fn a_program_keeps_its_budget_when_another_user_took_the_whole_node() {
    assert_eq!(
        nix::unistd::getuid().as_raw(),
        0,
        "this test runs a client as another user (setpriv): run it as root"
    );
    let dir = Scratch::new("node-share");
    // nobody (in root's group) may reach the socket.
    std::fs::set_permissions(&dir.0, std::fs::Permissions::from_mode(0o750)).unwrap();
    let prog = dir.path("seq_scan");
    compile_c(&c_source("seq_scan.c"), &prog, &[]);
    let want = Command::new(&prog).arg("128").output().unwrap().stdout;
    let socket = dir.path("node.sock");
    let node = child_node_command(farmem(), &socket)
        .args(["--capacity", "64MiB", "--slab-size", "4MiB"])
        .spawn()
        .unwrap_or_else(|e| panic!("the node did not start: {e}"));
    let mut nobody = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--groups=0"])
        .args(["/usr/bin/python3", "-c", GRAB_ALL])
        .arg(&socket)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("setpriv (util-linux) and /usr/bin/python3 run the hostile client");
    let mut line = String::new();
    BufReader::new(nobody.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line.trim(), "got 16", "nobody took every slab");

    let stats = dir.path("run.json");
    let o = farmem_run(
        &[
            "--node",
            socket.to_str().unwrap(),
            "--local-mem",
            "64MiB",
            "--stats",
            stats.to_str().unwrap(),
        ],
        &[prog.to_str().unwrap(), "128"],
    );
    let t = text(&o);
    assert!(o.status.success(), "{t}");
    assert_eq!(o.stdout, want, "the program's output: {t}");
    let s = read_stats(&stats);
    let (peak, budget) = (
        counter(&s, "peak_resident_bytes"),
        counter(&s, "budget_bytes"),
    );
    eprintln!(
        "peak resident {peak} bytes at a budget of {budget}; {} bytes to the host tier",
        counter(&s, "tier_bytes_out")
    );
    // Before, the pages had nowhere to go: peak 134246400 bytes here.
    assert!(peak <= budget, "the budget held: peak {peak}: {s}");
    assert!(
        counter(&s, "tier_bytes_out") > 64 << 20,
        "the overflow went to a (private) node: {s}"
    );
    assert_eq!(
        t.matches("has no room for this program").count(),
        1,
        "one warning says why a private node was started: {t}"
    );
    assert!(
        t.contains("host tier full"),
        "the warning names the node's refusal: {t}"
    );
    // The node kept serving: root connects beside the one holding everything.
    let figures = NodeClient::connect(&socket, NodeClientConfig::default())
        .and_then(|c| c.stats())
        .expect("the node still answers");
    assert_eq!(figures.slabs, 16, "{figures:#?}");
    drop(nobody.stdin.take());
    let _ = nobody.wait();
    drop(node);
}
