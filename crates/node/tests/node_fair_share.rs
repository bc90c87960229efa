//! One user cannot lock the others out of a node: its connections and its holds are bounded
//! per user (uid), and holds in all by what the node's open-files limit leaves. Each attack is
//! made by a real process of another user (`setpriv` as nobody) speaking raw frames, as an
//! attacker would; a `farmem node` child process serves.
mod common;

use std::io::{BufRead, BufReader};
use std::os::unix::fs::PermissionsExt;
use std::process::{Child, ChildStdout, Command, Stdio};

use common::{Node, SLAB};

/// A hostile client in Python (`/usr/bin/python3`), run as another user:
/// - `slots N`: opens N connections, says HELLO on each, prints `welcomed W refused R MSG`;
/// - `holds ROUNDS`: each round connects, ALLOCs a slab and makes holds over it (mapped and
///   armed, so they outlive the connection) until one is refused or 1024 are made, prints
///   `round R made M refused MSG`, and disconnects.
///
/// Then it prints `ready` and keeps everything (connections, mappings) until stdin closes.
const HOSTILE: &str = r#"
import array, mmap, os, socket, struct, sys
path, mode, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
def rx(s):
    msg, anc, _, _ = s.recvmsg(5, socket.CMSG_SPACE(16))
    fds = []
    for _, _, d in anc:
        fds += array.array('i', d[:len(d) - len(d) % 4]).tolist()
    if len(msg) < 5:
        msg += s.recv(5 - len(msg), socket.MSG_WAITALL)
    ln, op = struct.unpack('<IB', msg)
    p = s.recv(ln, socket.MSG_WAITALL) if ln else b''
    return op, p, fds
def hello():
    s = socket.socket(socket.AF_UNIX)
    s.connect(path)
    try:
        s.sendall(struct.pack('<IBH', 2, 0x01, 1))
    except (BrokenPipeError, ConnectionResetError):
        pass  # refused at accept: the refusal is in the receive queue
    return s, rx(s)
def text(p):
    return p[22:].decode(errors='replace')
keep = []
if mode == 'slots':
    welcomed, refused, why = 0, 0, ''
    for _ in range(n):
        s, (op, p, _) = hello()
        if op == 0x81:
            welcomed += 1
            keep.append(s)
        else:
            refused += 1
            why = text(p)
            s.close()
    print('welcomed', welcomed, 'refused', refused, why, flush=True)
else:
    for r in range(n):
        s, (op, p, _) = hello()
        assert op == 0x81, text(p)
        s.sendall(struct.pack('<IBI', 4, 0x02, 1))
        op, p, fds = rx(s)
        assert op == 0x82, text(p)
        slab = struct.unpack('<IIQ', p)[1]
        for f in fds:
            os.close(f)
        made, why = 0, ''
        for j in range(1024):
            s.sendall(struct.pack('<IBIII', 12, 0x06, j, 0, slab))
            op, p, fds = rx(s)
            if op != 0x87:
                why = text(p)
                break
            m = mmap.mmap(fds[0], 4096, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
            m[0] = 1
            keep.append(m)
            os.close(fds[0])
            hold = struct.unpack('<II', p[:8])[1]
            s.sendall(struct.pack('<IBIII', 12, 0x06, j, hold, slab))
            op, p, _ = rx(s)
            assert op == 0x83, text(p)
            made += 1
        print('round', r, 'made', made, 'refused', why, flush=True)
        s.close()
print('ready', flush=True)
sys.stdin.read()
"#;

/// A [`HOSTILE`] client running as `uid` in the socket's group (root's), and its output so
/// far.
struct Hostile {
    child: Child,
    out: BufReader<ChildStdout>,
}

impl Hostile {
    fn start(node: &Node, uid: u32, mode: &str, n: u32) -> Hostile {
        let mut child = Command::new("setpriv")
            .arg(format!("--reuid={uid}"))
            .arg("--regid=0")
            .args(["--clear-groups", "/usr/bin/python3", "-c", HOSTILE])
            .arg(&node.path)
            .args([mode, &n.to_string()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("setpriv (util-linux) and /usr/bin/python3 run the hostile client");
        let out = BufReader::new(child.stdout.take().unwrap());
        Hostile { child, out }
    }

    /// Its lines up to `ready` (it then keeps what it made until [`Hostile::stop`]).
    fn lines(&mut self) -> Vec<String> {
        let mut lines = Vec::new();
        loop {
            let mut l = String::new();
            let n = self.out.read_line(&mut l).unwrap();
            assert!(
                n > 0,
                "the hostile client ended early; its lines: {lines:?}"
            );
            if l.trim() == "ready" {
                return lines;
            }
            lines.push(l.trim().to_string());
        }
    }

    /// Closes its stdin: it lets go of everything and exits.
    fn stop(mut self) {
        drop(self.child.stdin.take());
        let status = self.child.wait().unwrap();
        assert!(status.success(), "the hostile client failed: {status}");
    }
}

/// Lets the node's group (root's, which [`Hostile`] joins) reach its socket: the socket is
/// 0660 already, its temp folder private.
fn open_to_group(node: &Node) {
    std::fs::set_permissions(node.dir.path(), std::fs::Permissions::from_mode(0o750)).unwrap();
}

fn assert_root() {
    assert_eq!(
        rustix::process::getuid().as_raw(),
        0,
        "these tests run clients as other users (setpriv): run them as root"
    );
}

#[test]
fn one_user_s_idle_connections_leave_room_for_the_others() {
    assert_root();
    let node = Node::start(&[
        "--capacity",
        &(8 * SLAB).to_string(),
        "--max-clients",
        "8",
        "--max-clients-per-uid",
        "3",
    ]);
    open_to_group(&node);
    let mut nobody = Hostile::start(&node, 65534, "slots", 5);
    let lines = nobody.lines();
    assert!(
        lines[0].starts_with("welcomed 3 refused 2 ")
            && lines[0].contains("uid 65534 has 3 connections to this node, the most one user"),
        "{lines:?}"
    );
    // Another user, and root, are served beside the one at its bound.
    let mut other = Hostile::start(&node, 65533, "slots", 1);
    assert_eq!(other.lines(), vec!["welcomed 1 refused 0".to_string()]);
    let root = node.client();
    let slab = root.alloc_slab().expect("root ALLOCs beside them");
    drop(slab);
    assert_eq!(node.stats().clients.len(), 3 + 1 + 2, "3 + 1 + root's two");
    // A user's count is given back when its connections close.
    nobody.stop();
    other.stop();
    node.wait_for("the hostile connections to close", |s| s.clients.len() == 2);
    let mut again = Hostile::start(&node, 65534, "slots", 3);
    assert_eq!(again.lines(), vec!["welcomed 3 refused 0".to_string()]);
    again.stop();
    node.wait_for("those to close too", |s| s.clients.len() == 2);
    // Root and the node's own user are bound by --max-clients only: with `root`, 8.
    let roots: Vec<_> = (0..7).map(|_| node.client()).collect();
    let Err(e) = farmem_node::NodeClient::connect(&node.path, Default::default()) else {
        panic!("the ninth connection is refused");
    };
    assert!(
        matches!(&e, farmem_node::NodeError::TooManyClients { message } if message.contains("node full")),
        "{e}"
    );
    drop(roots);
}

#[test]
fn one_user_s_holds_are_bounded_however_often_it_reconnects() {
    assert_root();
    let node = Node::start(&["--capacity", &(8 * SLAB).to_string()]);
    open_to_group(&node);
    let mut nobody = Hostile::start(&node, 65534, "holds", 3);
    let lines = nobody.lines();
    // Before, each round made 1024 more (they outlive the connection) until the node ran out
    // of descriptors, and then ALLOC and accept failed for everyone.
    assert_eq!(lines[0], "round 0 made 1024 refused", "{lines:?}");
    for l in &lines[1..] {
        assert!(
            l.contains("made 0 refused")
                && l.contains("uid 65534 has 1024 live holds, the most one user may have"),
            "{lines:?}"
        );
    }
    let stats = node.stats();
    assert_eq!(stats.holds, 1024, "{stats:#?}");
    // Root is still served: a slab, and a hold over it.
    let root = node.client();
    let slab = root.alloc_slab().expect("root ALLOCs beside them");
    let hold = root
        .hold_slabs(&[slab.id])
        .expect("root takes a hold beside them");
    drop(hold);
    nobody.stop();
    node.wait_for("nobody's holds to die", |s| s.holds == 0);
}

#[test]
fn holds_leave_the_node_the_descriptors_its_clients_and_slabs_need() {
    assert_root();
    let node = Node::start(&["--capacity", &(8 * SLAB).to_string(), "--max-clients", "8"]);
    // 2 per client, 1 per slab, 64 kept: 100 are left for holds.
    let limit = 2 * 8 + 8 + 64 + 100;
    let status = Command::new("prlimit")
        .arg(format!("--pid={}", node.child.pid()))
        .arg(format!("--nofile={limit}:{limit}"))
        .status()
        .expect("prlimit (util-linux) sets the node's open-files limit");
    assert!(status.success());
    let c = node.client();
    let slab = c.alloc_slab().expect("a slab");
    let mut holds = Vec::new();
    let e = loop {
        match c.hold_slabs(&[slab.id]) {
            Ok(h) => holds.push(h),
            Err(e) => break e,
        }
        assert!(
            holds.len() <= 100,
            "more holds than the limit leaves room for"
        );
    };
    assert_eq!(holds.len(), 100);
    assert!(
        e.to_string().contains(&format!(
            "the most its open-files limit ({limit}) leaves room for"
        )),
        "{e}"
    );
    // The node still accepts (up to --max-clients with the STATS client below) and lends
    // every slab of its capacity.
    let others: Vec<_> = (0..6).map(|_| node.client()).collect();
    let slabs: Vec<_> = (0..7)
        .map(|_| others[0].alloc_slab().expect("the rest of the capacity"))
        .collect();
    assert_eq!(node.stats().slabs, 8);
    drop((slabs, others, holds));
}
