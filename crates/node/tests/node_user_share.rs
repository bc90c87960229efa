//! Local users share a node fairly: no user can take all its slabs (`--max-share-per-uid`,
//! and the fair share with which a user holding everything is asked to give back room for a
//! newcomer), nor see other users' clients in STATS, nor lock root out with the connections
//! and holds of four user ids. Each user is a real process of another uid (`setpriv`)
//! speaking raw frames; a `farmem node` child process serves.
mod common;

use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::PermissionsExt;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use common::{Node, SLAB};
use farmem_node::{NodeError, NodeStats};

/// A client of the node in Python (`/usr/bin/python3`) driven line by line on stdin:
/// - `grab N`: ALLOCs up to N slabs (keeping their fds), prints
///   `got G held H refused CODE MESSAGE` (CODE 0: none refused);
/// - `reclaim`: waits for the node's RECLAIM (10 s at most), FREEs that many of its slabs,
///   prints `gave N` (`gave none` without one);
/// - `stats`: prints the STATS JSON on one line.
///
/// `swarm N`, as its argument instead, opens N connections and makes holds over one slab on
/// the first until refused (mapped and armed, so they outlive the connection), prints
/// `welcomed W refused R holds H`, and keeps them.
const TENANT: &str = r#"
import array, json, mmap, os, socket, struct, sys
path = sys.argv[1]
def rx(s, once=False):
    while True:
        msg, anc, _, _ = s.recvmsg(5, socket.CMSG_SPACE(16))
        fds = []
        for _, _, d in anc:
            fds += array.array('i', d[:len(d) - len(d) % 4]).tolist()
        if len(msg) < 5:
            msg += s.recv(5 - len(msg), socket.MSG_WAITALL)
        ln, op = struct.unpack('<IB', msg)
        p = s.recv(ln, socket.MSG_WAITALL) if ln else b''
        if op == 0x86:
            asked.append(struct.unpack('<I', p)[0])
            if once:
                return op, p, fds
            continue
        return op, p, fds
def hello():
    s = socket.socket(socket.AF_UNIX)
    s.connect(path)
    try:
        s.sendall(struct.pack('<IBH', 2, 0x01, 1))
    except (BrokenPipeError, ConnectionResetError):
        pass
    return s, rx(s)
def text(p):
    return p[22:].decode(errors='replace')
asked, slabs, keep = [], [], []
if len(sys.argv) > 3 and sys.argv[2] == 'swarm':
    conns, refused, why = [], 0, ''
    for _ in range(int(sys.argv[3])):
        s, (op, p, _) = hello()
        if op == 0x81:
            conns.append(s)
        else:
            refused += 1
            why = text(p)
            s.close()
    s = conns[0]
    s.sendall(struct.pack('<IBI', 4, 0x02, 1))
    op, p, fds = rx(s)
    assert op == 0x82, text(p)
    slab = struct.unpack('<IIQ', p)[1]
    holds = 0
    for j in range(4096):
        s.sendall(struct.pack('<IBIII', 12, 0x06, j, 0, slab))
        op, p, fds = rx(s)
        if op != 0x87:
            break
        m = mmap.mmap(fds[0], 4096, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        m[0] = 1
        keep.append(m)
        os.close(fds[0])
        hold = struct.unpack('<II', p[:8])[1]
        s.sendall(struct.pack('<IBIII', 12, 0x06, j, hold, slab))
        op, p, _ = rx(s)
        assert op == 0x83, text(p)
        holds += 1
    print('welcomed', len(conns), 'refused', refused, 'holds', holds, why, flush=True)
    sys.stdin.read()
    sys.exit(0)
s, (op, p, _) = hello()
assert op == 0x81, text(p)
req = 0
for line in sys.stdin:
    cmd = line.split()
    if not cmd:
        continue
    req += 1
    if cmd[0] == 'grab':
        got, code, why = 0, 0, ''
        for _ in range(int(cmd[1])):
            s.sendall(struct.pack('<IBI', 4, 0x02, req))
            op, p, fds = rx(s)
            if op != 0x82:
                code, why = struct.unpack('<H', p[4:6])[0], text(p)
                break
            slabs.append((struct.unpack('<IIQ', p)[1], fds))
            got += 1
        print('got', got, 'held', len(slabs), 'refused', code, why, flush=True)
    elif cmd[0] == 'reclaim':
        if not asked:
            s.settimeout(10)
            try:
                rx(s, once=True)
            except socket.timeout:
                pass
            s.settimeout(None)
        if not asked:
            print('gave none', flush=True)
            continue
        n = asked.pop(0)
        for _ in range(n):
            slab, fds = slabs.pop()
            for f in fds:
                os.close(f)
            s.sendall(struct.pack('<IBII', 8, 0x03, req, slab))
            op, p, _ = rx(s)
            assert op == 0x83, text(p)
        print('gave', n, flush=True)
    elif cmd[0] == 'stats':
        s.sendall(struct.pack('<IBI', 4, 0x04, req))
        op, p, _ = rx(s)
        assert op == 0x85, text(p)
        print(p[4:].decode(), flush=True)
"#;

/// A [`TENANT`] running as `uid` (group `uid`, or root's group to reach the socket).
struct Tenant {
    child: Child,
    input: ChildStdin,
    out: BufReader<ChildStdout>,
}

impl Tenant {
    fn start(node: &Node, uid: u32, args: &[&str]) -> Tenant {
        let mut child = Command::new("setpriv")
            .arg(format!("--reuid={uid}"))
            .arg(format!("--regid={uid}"))
            .args(["--groups=0", "/usr/bin/python3", "-c", TENANT])
            .arg(&node.path)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("setpriv (util-linux) and /usr/bin/python3 run the tenant");
        let input = child.stdin.take().unwrap();
        let out = BufReader::new(child.stdout.take().unwrap());
        Tenant { child, input, out }
    }

    /// Sends one command, returns its one line of output.
    fn ask(&mut self, cmd: &str) -> String {
        writeln!(self.input, "{cmd}").unwrap();
        self.line()
    }

    fn line(&mut self) -> String {
        let mut l = String::new();
        let n = self.out.read_line(&mut l).unwrap();
        assert!(n > 0, "the tenant ended early");
        l.trim().to_string()
    }

    fn stop(self) {
        let Tenant {
            mut child, input, ..
        } = self;
        drop(input);
        let status = child.wait().unwrap();
        assert!(status.success(), "the tenant failed: {status}");
    }
}

/// Lets the node's group (root's, which every [`Tenant`] is in) reach its socket.
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
fn a_user_is_refused_beyond_its_max_share_with_the_figures() {
    assert_root();
    let node = Node::start(&[
        "--capacity",
        &(8 * SLAB).to_string(),
        "--max-share-per-uid",
        "50%",
    ]);
    open_to_group(&node);
    let mut nobody = Tenant::start(&node, 65534, &[]);
    let got = nobody.ask("grab 8");
    // code 9: ShareUsed
    assert!(
        got.starts_with("got 4 held 4 refused 9 ")
            && got.contains("uid 65534 holds 4194304 of the node's 8388608 bytes")
            && got.contains("--max-share-per-uid allows one user 4194304"),
        "{got}"
    );
    // Root has the other half, and is bound the same way.
    let root = node.client();
    let mine: Vec<_> = (0..4)
        .map(|_| root.alloc_slab().expect("root takes the other half"))
        .collect();
    let e = root.alloc_slab().unwrap_err();
    assert!(
        matches!(&e, NodeError::ShareUsed { uid: 0, held_bytes, share_bytes, .. } if *held_bytes == 4 * SLAB && *share_bytes == 4 * SLAB),
        "{e}"
    );
    assert!(e.is_full(), "a program puts its pages elsewhere: {e}");
    assert_eq!(node.stats().refusals.share_used, 2);
    drop(mine);
    nobody.stop();
}

#[test]
fn a_bad_max_share_is_refused_naming_the_flag() {
    for (value, says) in [
        ("0", "--max-share-per-uid 0: a user could hold nothing"),
        (
            "150%",
            "--max-share-per-uid 150%: a percentage is a whole number",
        ),
        (
            "1KiB",
            "--max-share-per-uid is 1024 bytes of this node, not one slab",
        ),
    ] {
        let out = Command::new(farmem_testkit::bins::farmem())
            .args(["node", "--socket", "/tmp/farmem-never.sock", "--capacity"])
            .arg((8 * SLAB).to_string())
            .args(["--slab-size", "1MiB", "--max-share-per-uid", value])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && err.contains(says),
            "{value}: {err}"
        );
    }
}

#[test]
fn a_user_holding_everything_gives_a_newcomer_its_fair_share_back() {
    assert_root();
    let mut node = Node::start(&["--capacity", &(8 * SLAB).to_string()]);
    open_to_group(&node);
    let mut nobody = Tenant::start(&node, 65534, &[]);
    // Alone, a user may hold everything: nothing is stranded.
    let got = nobody.ask("grab 8");
    assert!(got.starts_with("got 8 held 8 refused 0"), "{got}");
    // Root arrives: refused (the node is full) but entitled to half, so nobody is asked back.
    let root = node.client();
    let e = root.alloc_slab().unwrap_err();
    assert!(
        matches!(&e, NodeError::Full { .. }),
        "the first ALLOC finds the node full: {e}"
    );
    assert_eq!(nobody.ask("reclaim"), "gave 4", "{}", node.stderr());
    let until = Instant::now() + Duration::from_secs(10);
    let mut mine = Vec::new();
    while mine.len() < 4 {
        match root.alloc_slab() {
            Ok(s) => mine.push(s),
            Err(e) => {
                assert!(Instant::now() < until, "root got {} slabs: {e}", mine.len());
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }
    // Each holds its fair share now; nobody cannot take the room back while root wants it.
    let got = nobody.ask("grab 1");
    assert!(got.starts_with("got 0 held 4 refused "), "{got}");
    let s = node.stats();
    let held = |uid| -> u64 {
        s.clients
            .iter()
            .filter(|c| c.uid == uid)
            .map(|c| c.slabs)
            .sum()
    };
    assert_eq!((held(65534), held(0)), (4, 4), "{s:#?}");
    drop(mine);
    nobody.stop();
}

#[test]
fn a_user_sees_only_its_own_clients_in_stats() {
    assert_root();
    let node = Node::start(&["--capacity", &(8 * SLAB).to_string()]);
    open_to_group(&node);
    let root = node.client();
    let mine = root.alloc_slab().unwrap();
    let mut nobody = Tenant::start(&node, 65534, &[]);
    let mut other = Tenant::start(&node, 65533, &[]);
    assert!(nobody.ask("grab 2").starts_with("got 2 "));
    assert!(other.ask("grab 1").starts_with("got 1 "));
    let seen: NodeStats = serde_json::from_str(&nobody.ask("stats")).unwrap();
    assert!(
        !seen.clients.is_empty() && seen.clients.iter().all(|c| c.uid == 65534),
        "nobody sees only its own clients: {seen:#?}"
    );
    assert_eq!(seen.clients.iter().map(|c| c.slabs).sum::<u64>(), 2);
    // The node-wide totals stay.
    assert_eq!((seen.slabs, seen.used_bytes), (4, 4 * SLAB), "{seen:#?}");
    // Root sees everyone.
    let all = root.stats().unwrap();
    let mut uids: Vec<u32> = all.clients.iter().map(|c| c.uid).collect();
    uids.sort_unstable();
    uids.dedup();
    assert_eq!(uids, vec![0, 65533, 65534], "{all:#?}");
    // `farmem stats --node` works for both.
    for uid in [0u32, 65534] {
        let out = Command::new("setpriv")
            .arg(format!("--reuid={uid}"))
            .arg(format!("--regid={uid}"))
            .arg("--groups=0")
            .arg(farmem_testkit::bins::farmem())
            .args(["stats", "--node"])
            .arg(&node.path)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && text.contains("4.0 MiB"),
            "uid {uid}: {text}{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    drop(mine);
    nobody.stop();
    other.stop();
}

/// The node's open descriptors (from /proc).
fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .count()
}

#[test]
fn four_users_at_their_bounds_leave_root_served_and_descriptors_bounded() {
    assert_root();
    let node = Node::start(&["--capacity", &(8 * SLAB).to_string()]);
    open_to_group(&node);
    let pid = node.child.pid();
    let before = open_fds(pid);
    // Each user: 300 connections asked (256 per user allowed), then holds until refused.
    let mut swarm = Vec::new();
    let mut lines = Vec::new();
    for uid in [65534u32, 65533, 65532, 65531] {
        let mut t = Tenant::start(&node, uid, &["swarm", "300"]);
        lines.push(t.line());
        swarm.push(t);
    }
    eprintln!("four-user attack: {lines:?}");
    for (i, l) in lines.iter().enumerate() {
        assert!(
            l.contains("holds 1024 "),
            "each user stops at 1024 holds: {lines:?}"
        );
        if i < 3 {
            assert!(l.starts_with("welcomed 256 refused 44 "), "{lines:?}");
        }
    }
    // The fourth user finds the connections other users may have taken: 7/8 of 1024.
    assert!(
        lines[3].starts_with("welcomed 128 refused 172 ")
            && lines[3].contains("connections of users other than root and its own"),
        "{lines:?}"
    );
    // Root is still served: connects, ALLOCs, holds, reads the figures.
    let root = node.client();
    let slab = root.alloc_slab().expect("root ALLOCs beside them");
    let hold = root.hold_slabs(&[slab.id]).expect("root holds beside them");
    let s = node.stats();
    assert_eq!(s.holds, 4 * 1024 + 1, "{}", s.holds);
    let during = open_fds(pid);
    // Two per connection, one per slab and hold, and the node's own few.
    let bound = 2 * (896 + 3) + 8 + 4 * 1024 + 1 + 64;
    eprintln!(
        "node descriptors: {before} before, {during} during the attack (bound {bound}; open-files \
         limit {})",
        std::fs::read_to_string(format!("/proc/{pid}/limits"))
            .unwrap()
            .lines()
            .find(|l| l.starts_with("Max open files"))
            .unwrap_or("?")
    );
    assert!(during <= bound, "{during} descriptors open, bound {bound}");
    drop(hold);
    drop(slab);
    for t in swarm {
        t.stop();
    }
    node.wait_for("the attackers' holds to die", |s| s.holds == 0);
}
