//! Holds on a real node (served in this process on a real socket, watcher every 20 ms) with real
//! forked children: a held slab its client FREEs, or leaves by disconnecting, keeps its pages
//! while any process maps the hold, and goes back to the host soon after none does. Hostile
//! HOLDs are refused without holding anything, and a bystander client is served throughout.

use std::io::{Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use farmem_node::wire::{decode_node_frame, ClientFrame, ErrorCode, NodeFrame, PROTOCOL_VERSION};
use farmem_node::{
    NodeClient, NodeClientConfig, NodeConfig, NodeError, NodeServer, NodeStats, RunningNode,
    TierSlab, MAX_HOLDS_PER_CLIENT,
};
use farmem_testkit::pages::{read_u64, Stamp, PAGE};

const SLAB: u64 = 1 << 20;
const PAGES: usize = SLAB as usize / PAGE;
const WATCH: Duration = Duration::from_millis(20);
const STAMP: Stamp = Stamp {
    step: 64,
    salt: 0x5eed,
};

/// A forked child inherits every mapping of this process, other tests' holds included: the
/// tests of this file run one at a time so that a child keeps alive only its own test's hold.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn one_at_a_time() -> MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner())
}

/// What every test starts from: its turn (see [`ONE_AT_A_TIME`]), a node served in this
/// process, and a bystander client that takes nothing unless [`Node::still_served`] asks it to.
struct Node {
    /// Dropped first, then the node, then the turn: as when they were a test's own locals.
    bystander: NodeClient,
    node: RunningNode,
    _dir: tempfile::TempDir,
    _one: MutexGuard<'static, ()>,
}

impl Node {
    /// A node lending `slabs` slabs of [`SLAB`].
    fn with_slabs(slabs: u64) -> Node {
        Node::sized(slabs, SLAB)
    }

    fn sized(slabs: u64, slab_bytes: u64) -> Node {
        let one = one_at_a_time();
        let dir = tempfile::tempdir().unwrap();
        let node = NodeServer::bind(NodeConfig {
            socket_path: dir.path().join("node.sock"),
            capacity_bytes: slabs * slab_bytes,
            slab_bytes,
            watch_period: WATCH,
            ..NodeConfig::default()
        })
        .unwrap()
        .spawn();
        let bystander =
            NodeClient::connect(node.socket_path(), NodeClientConfig::default()).unwrap();
        Node {
            bystander,
            node,
            _dir: dir,
            _one: one,
        }
    }

    fn path(&self) -> &Path {
        self.node.socket_path()
    }

    fn client(&self) -> NodeClient {
        NodeClient::connect(self.path(), NodeClientConfig::default()).unwrap()
    }

    /// A new client that took `N` slabs (in the order of the array).
    fn client_with_slabs<const N: usize>(&self) -> (NodeClient, [TierSlab; N]) {
        let c = self.client();
        let slabs = std::array::from_fn(|_| c.alloc_slab().unwrap());
        (c, slabs)
    }

    /// The bystander is served: a new slab, written and read back, freed.
    fn still_served(&self) {
        let s = self
            .bystander
            .alloc_slab()
            .expect("a bystander is still served");
        stamp(&s, 99);
        check(&s, 99);
        let id = s.id;
        drop(s);
        self.bystander.free_slab(id).unwrap();
    }

    fn stats(&self) -> NodeStats {
        self.node.stats()
    }

    /// Polls the node's figures (10 s at most) until `pred` holds.
    fn wait_for(&self, what: &str, pred: impl Fn(&NodeStats) -> bool) -> NodeStats {
        let until = Instant::now() + Duration::from_secs(10);
        loop {
            let s = self.stats();
            if pred(&s) {
                return s;
            }
            assert!(Instant::now() < until, "waited 10 s for {what}: {s:#?}");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Lets the watcher run a few rounds (what must not change is then checked).
    fn let_the_watcher_run(&self) {
        std::thread::sleep(WATCH * 10);
    }
}

fn stamp(s: &TierSlab, round: u64) {
    for p in 0..PAGES {
        STAMP.write_page(s.mapping.addr(), p, round);
    }
}

fn check(s: &TierSlab, round: u64) {
    for p in 0..PAGES {
        STAMP.check_page(s.mapping.addr(), p, round);
    }
}

fn zeroed(s: &TierSlab) -> bool {
    (0..PAGES).all(|p| read_u64(s.mapping.addr() + p * PAGE) == 0)
}

/// The forked reader's body: waits for a byte on `go` (60 s at most, or until every writer
/// closed it), checks the stamps of `slabs`, writes 1 (intact) or 0 to `result`, and exits.
/// Allocation-free and lock-free: it runs in a forked copy of a multi-threaded process.
fn read_on_go(go: &OwnedFd, result: &OwnedFd, slabs: &[(usize, u64)]) -> ! {
    let mut fds = [rustix::event::PollFd::new(go, rustix::event::PollFlags::IN)];
    let limit = rustix::event::Timespec {
        tv_sec: 60,
        tv_nsec: 0,
    };
    let _ = rustix::event::poll(&mut fds, Some(&limit));
    let mut intact = true;
    for &(base, round) in slabs {
        for p in 0..PAGES {
            for w in (0..PAGE / 8).step_by(STAMP.step) {
                intact &= read_u64(base + p * PAGE + w * 8) == STAMP.word(p, w, round);
            }
        }
    }
    let _ = rustix::io::write(result, &[u8::from(intact)]);
    // SAFETY: ends the forked process at once, running nothing of the parent's.
    unsafe { libc::_exit(0) }
}

/// Who reads the slabs: a forked child, or a grandchild whose parent (the child) exits at once.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Reader {
    Child,
    Grandchild,
}

/// A forked copy of this process that keeps every mapping it inherited until told to go (or
/// until this process closes its end of the pipe), then checks the stamps of the slabs it was
/// given, reports through a pipe and exits.
struct Forked {
    /// The direct child, while it is still to be reaped.
    pid: Option<rustix::process::Pid>,
    go: OwnedFd,
    result: OwnedFd,
}

impl Forked {
    fn start(reader: Reader, slabs: &[(usize, u64)]) -> Forked {
        let cloexec = rustix::pipe::PipeFlags::CLOEXEC;
        let (go_read, go) = rustix::pipe::pipe_with(cloexec).unwrap();
        let (result, result_write) = rustix::pipe::pipe_with(cloexec).unwrap();
        // SAFETY: the child runs only code that neither allocates nor takes a lock (another
        // thread may have held one at fork): fork, close, poll, read and write through libc and
        // rustix's raw system calls, volatile reads of mappings it inherited, arithmetic, and
        // _exit (no destructors, no atexit handlers). `slabs` was built before the fork.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork failed: {}", std::io::Error::last_os_error());
        if pid == 0 {
            drop(go);
            drop(result);
            if reader == Reader::Grandchild {
                // SAFETY: as above.
                let grandchild = unsafe { libc::fork() };
                if grandchild != 0 {
                    // SAFETY: ends the forked child at once, running nothing of the parent's.
                    unsafe { libc::_exit(if grandchild > 0 { 0 } else { 3 }) };
                }
            }
            read_on_go(&go_read, &result_write, slabs);
        }
        drop(result_write);
        let mut pid = Some(rustix::process::Pid::from_raw(pid).unwrap());
        if reader == Reader::Grandchild {
            let (_, status) =
                rustix::process::waitpid(pid.take(), rustix::process::WaitOptions::empty())
                    .unwrap()
                    .unwrap();
            assert_eq!(
                status.exit_status(),
                Some(0),
                "the child forked the grandchild"
            );
        }
        Forked { pid, go, result }
    }

    /// Tells the reader to check and exit; true when it read every stamp intact.
    fn finish(mut self) -> bool {
        rustix::io::write(&self.go, &[1]).unwrap();
        let mut r = [0u8; 1];
        let n = rustix::io::read(&self.result, &mut r).unwrap();
        if let Some(pid) = self.pid.take() {
            let _ = rustix::process::waitpid(Some(pid), rustix::process::WaitOptions::empty());
        }
        n == 1 && r[0] == 1
    }
}

impl Drop for Forked {
    fn drop(&mut self) {
        // A failed test: the reader sees the pipe close (from here) and ends by itself too.
        if let Some(pid) = self.pid.take() {
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
            let _ = rustix::process::waitpid(Some(pid), rustix::process::WaitOptions::empty());
        }
    }
}

#[test]
fn a_held_slab_its_client_frees_keeps_its_pages_until_the_hold_is_unmapped() {
    let node = Node::with_slabs(4);
    let (c, [slab, other]) = node.client_with_slabs();
    stamp(&slab, 1);
    let mut hold = c.hold_slabs(&[slab.id]).unwrap();
    assert!(hold.is_mapped() && hold.is_alive());
    let s = node.stats();
    assert_eq!((s.holds, s.held_slabs, s.kept_slabs), (1, 1, 0), "{s:#?}");

    // FREE: the slab is no longer the client's, but nothing is punched (the FREE itself probed
    // the holds, and so do the watcher rounds that follow).
    c.free_slab(slab.id).unwrap();
    node.let_the_watcher_run();
    check(&slab, 1);
    let s = node.stats();
    assert_eq!(s.used_bytes, 2 * SLAB, "a kept slab stays counted");
    assert_eq!((s.slabs, s.holds, s.held_slabs, s.kept_slabs), (2, 1, 1, 1));
    assert!(matches!(
        c.free_slab(slab.id),
        Err(NodeError::NotYours { .. })
    ));
    // Nor can it be held again: it is no one's now.
    assert!(matches!(
        c.hold_slabs(&[slab.id]),
        Err(NodeError::HoldNotYours { .. })
    ));
    node.still_served();
    check(&slab, 1);

    // No process maps the hold any more: the node releases the slab within a few rounds.
    hold.unmap();
    let s = node.wait_for("the kept slab to be released", |s| s.used_bytes == SLAB);
    assert_eq!((s.slabs, s.holds, s.held_slabs, s.kept_slabs), (1, 0, 0, 0));
    assert!(zeroed(&slab), "the released slab was punched");
    assert!(!hold.is_alive());
    // The slab not held was never touched by any of this, and is freed as always.
    let id = other.id;
    drop(other);
    c.free_slab(id).unwrap();
    assert_eq!(node.stats().used_bytes, 0);
    node.still_served();
}

#[test]
fn a_forked_child_keeps_held_slabs_after_its_parent_disconnects() {
    let node = Node::with_slabs(4);
    let (c, [a, b, loose]) = node.client_with_slabs();
    stamp(&a, 2);
    stamp(&b, 3);
    let mut hold = c.hold_slabs(&[a.id, b.id]).unwrap();
    let child = Forked::start(
        Reader::Child,
        &[(a.mapping.addr(), 2), (b.mapping.addr(), 3)],
    );
    // The parent's part after fork: drop its own mapping of the hold, then go away.
    hold.unmap();
    assert!(hold.is_alive(), "the child maps the hold");
    drop(c);
    let s = node.wait_for("the client's slabs to be kept or freed", |s| {
        s.kept_slabs == 2 && s.used_bytes == 2 * SLAB
    });
    assert_eq!((s.holds, s.held_slabs), (1, 2), "{s:#?}");
    assert!(zeroed(&loose), "a slab no hold names is freed as always");
    node.let_the_watcher_run();
    check(&a, 2);
    check(&b, 3);
    assert_eq!(node.stats().used_bytes, 2 * SLAB);
    node.still_served();

    // The child reads its parent's pages, intact, then exits: the node releases them.
    assert!(child.finish(), "the child read intact pages");
    let s = node.wait_for("the kept slabs to be released", |s| s.used_bytes == 0);
    assert_eq!((s.slabs, s.holds, s.held_slabs, s.kept_slabs), (0, 0, 0, 0));
    assert!(zeroed(&a) && zeroed(&b));
    assert!(!hold.is_alive());
    node.still_served();
}

#[test]
fn a_grandchild_keeps_slabs_its_grandparent_freed() {
    let node = Node::with_slabs(2);
    let (c, [slab]) = node.client_with_slabs();
    stamp(&slab, 4);
    let mut hold = c.hold_slabs(&[slab.id]).unwrap();
    // The child forks a grandchild and exits: the grandchild alone keeps the hold.
    let grandchild = Forked::start(Reader::Grandchild, &[(slab.mapping.addr(), 4)]);
    hold.unmap();
    assert!(hold.is_alive(), "the grandchild maps the hold");
    let id = slab.id;
    c.free_slab(id).unwrap();
    node.let_the_watcher_run();
    let s = node.stats();
    assert_eq!(
        (s.used_bytes, s.kept_slabs, s.holds),
        (SLAB, 1, 1),
        "{s:#?}"
    );
    check(&slab, 4);
    // A second hold over another slab, kept by this process, does not hold the first.
    let second = c.alloc_slab().unwrap();
    let mine = c.hold_slabs(&[second.id]).unwrap();
    assert!(grandchild.finish(), "the grandchild read intact pages");
    node.wait_for("the freed slab to be released", |s| {
        s.used_bytes == SLAB && s.holds == 1
    });
    assert!(zeroed(&slab));
    assert!(mine.is_alive());
    drop(mine);
    node.wait_for("the unmapped hold to be pruned", |s| s.holds == 0);
    assert_eq!(
        node.stats().used_bytes,
        SLAB,
        "the second slab is still the client's"
    );
}

/// A raw connection that has said HELLO; replies are read as whole frames (any fd that comes
/// with one is dropped by the kernel: this client never maps a hold).
struct Raw(UnixStream);

impl Raw {
    fn connect(node: &Node) -> Raw {
        let mut s = UnixStream::connect(node.path()).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s.write_all(
            &ClientFrame::Hello {
                version: PROTOCOL_VERSION,
            }
            .encode(),
        )
        .unwrap();
        let mut raw = Raw(s);
        assert!(matches!(raw.reply(), NodeFrame::Welcome { .. }));
        raw
    }

    fn reply(&mut self) -> NodeFrame {
        let mut buf = Vec::new();
        let mut byte = [0u8; 1];
        loop {
            if let Some((f, _)) = decode_node_frame(&buf).unwrap() {
                return f;
            }
            self.0.read_exact(&mut byte).unwrap();
            buf.push(byte[0]);
        }
    }

    fn ask(&mut self, f: ClientFrame) -> NodeFrame {
        self.0.write_all(&f.encode()).unwrap();
        self.reply()
    }

    fn alloc(&mut self) -> u32 {
        match self.ask(ClientFrame::Alloc { req: 1 }) {
            NodeFrame::Slab { slab, .. } => slab,
            other => panic!("{other:?}"),
        }
    }
}

fn refused(f: NodeFrame, code: ErrorCode, words: &str) {
    match f {
        NodeFrame::Error {
            code: got, message, ..
        } => {
            assert_eq!(got, code, "{message}");
            assert!(message.contains(words), "{message:?} lacks {words:?}");
        }
        other => panic!("{other:?} instead of ERROR {code:?}"),
    }
}

#[test]
fn hostile_holds_are_refused_and_hold_nothing() {
    let node = Node::with_slabs(4);
    let (owner, [theirs]) = node.client_with_slabs();
    let (thief, [mine]) = node.client_with_slabs();

    // Another client's slab, alone or among its own: nothing held.
    for list in [vec![theirs.id], vec![mine.id, theirs.id], vec![12345]] {
        let e = thief.hold_slabs(&list).unwrap_err();
        assert!(
            matches!(&e, NodeError::HoldNotYours { message } if message.contains("not yours")),
            "{e}"
        );
    }
    // An empty list.
    let e = thief.hold_slabs(&[]).unwrap_err();
    assert!(
        matches!(&e, NodeError::Refused { message } if message.contains("names no slab")),
        "{e}"
    );
    let s = node.stats();
    assert_eq!((s.holds, s.held_slabs), (0, 0), "nothing held: {s:#?}");
    assert_eq!((s.refusals.not_yours, s.refusals.bad_request), (3, 1));

    // Raw frames the client library never sends: a repeated id, and an add to another
    // client's hold.
    let mut raw = Raw::connect(&node);
    let own = raw.alloc();
    refused(
        raw.ask(ClientFrame::Hold {
            req: 2,
            hold: 0,
            slabs: vec![own, own],
        }),
        ErrorCode::BadRequest,
        "twice",
    );
    let held = owner.hold_slabs(&[theirs.id]).unwrap();
    refused(
        raw.ask(ClientFrame::Hold {
            req: 3,
            hold: held.id,
            slabs: vec![own],
        }),
        ErrorCode::NotYours,
        &format!("hold {} is not yours", held.id),
    );
    refused(
        raw.ask(ClientFrame::Hold {
            req: 4,
            hold: 777,
            slabs: vec![own],
        }),
        ErrorCode::NotYours,
        "not yours",
    );
    let s = node.stats();
    assert_eq!(
        (s.holds, s.held_slabs),
        (1, 1),
        "only the owner's hold: {s:#?}"
    );

    // A hold the raw client never maps (its fd was dropped) lives while it is connected; then
    // it leaves half a frame and goes: the connection ends as today and its slab is freed,
    // since an unarmed hold dies with its connection.
    let unarmed = match raw.ask(ClientFrame::Hold {
        req: 5,
        hold: 0,
        slabs: vec![own],
    }) {
        NodeFrame::Held { hold, .. } => hold,
        other => panic!("{other:?}"),
    };
    assert_ne!(unarmed, held.id);
    node.let_the_watcher_run();
    assert_eq!(
        node.stats().holds,
        2,
        "an unarmed hold lives while its client is connected"
    );
    raw.0
        .write_all(&ClientFrame::Free { req: 6, slab: own }.encode()[..6])
        .unwrap();
    drop(raw);
    node.wait_for("the raw client's slab and hold to go", |s| {
        s.holds == 1 && s.used_bytes == 2 * SLAB && s.kept_slabs == 0
    });
    node.still_served();
    drop((held, theirs, mine));
}

#[test]
fn a_client_has_a_bounded_number_of_live_holds_and_dead_ones_make_room() {
    let node = Node::with_slabs(2);
    let (c, [slab]) = node.client_with_slabs();
    let mut holds: Vec<_> = (0..MAX_HOLDS_PER_CLIENT)
        .map(|_| c.hold_slabs(&[slab.id]).unwrap())
        .collect();
    let e = c.hold_slabs(&[slab.id]).unwrap_err();
    assert!(
        matches!(&e, NodeError::Refused { message } if message.contains("1024 live holds")),
        "{e}"
    );
    let s = node.stats();
    assert_eq!((s.holds, s.held_slabs), (MAX_HOLDS_PER_CLIENT as u64, 1));
    // One hold unmapped: the next HOLD probes, finds it dead, and takes its place.
    holds.pop();
    c.hold_slabs(&[slab.id]).unwrap();
    assert_eq!(node.stats().holds, MAX_HOLDS_PER_CLIENT as u64);
    node.still_served();
    drop(holds);
    node.wait_for("the unmapped holds to be pruned", |s| s.holds <= 1);
}

#[test]
fn a_hold_over_more_slabs_than_one_frame_carries_is_one_hold() {
    // Page-sized slabs, so that more slabs than one HOLD frame names stay cheap.
    const N: usize = farmem_node::wire::MAX_HOLD_SLABS + 100;
    let node = Node::sized(N as u64 + 1, PAGE as u64);
    let (c, slabs) = node.client_with_slabs::<N>();
    let mut ids: Vec<u32> = slabs.iter().map(|s| s.id).collect();
    ids.push(ids[0]); // a repeat: the library sends each id once
    let mut hold = c.hold_slabs(&ids).unwrap();
    let s = node.stats();
    assert_eq!(
        (s.holds, s.held_slabs),
        (1, N as u64),
        "one hold names every slab"
    );
    assert!(hold.is_alive());
    assert!(hold.fd().as_fd().try_clone_to_owned().is_ok());
    // All of them freed: all kept; the hold unmapped: all released.
    for s in &slabs {
        c.free_slab(s.id).unwrap();
    }
    assert_eq!(node.stats().kept_slabs, N as u64);
    hold.unmap();
    node.wait_for("every kept slab to be released", |s| {
        s.used_bytes == 0 && s.holds == 0
    });
}

/// In its own process (a client of the node at FARMEM_TEST_NODE): takes a slab, stamps it,
/// holds it, forks a reader (which closes every other fd, waits on the inherited
/// FARMEM_TEST_GO_FD and reports on FARMEM_TEST_RESULT_FD), unmaps its hold, says READY, and
/// on GO dies by SIGKILL.
#[test]
#[ignore = "run by a_killed_clients_forked_child_keeps_its_held_slab in a process of its own"]
fn scenario_client_forks_a_reader_then_dies() {
    use std::os::fd::{AsRawFd, FromRawFd};
    let inherited = |name: &str| -> OwnedFd {
        let fd: i32 = std::env::var(name).unwrap().parse().unwrap();
        // SAFETY: the test opened this fd without CLOEXEC for this process, which owns it alone.
        unsafe { OwnedFd::from_raw_fd(fd) }
    };
    let (go, result) = (
        inherited("FARMEM_TEST_GO_FD"),
        inherited("FARMEM_TEST_RESULT_FD"),
    );
    let path = std::env::var("FARMEM_TEST_NODE").unwrap();
    let c = NodeClient::connect(path.as_ref(), NodeClientConfig::default()).unwrap();
    let slab = c.alloc_slab().unwrap();
    stamp(&slab, 5);
    let mut hold = c.hold_slabs(&[slab.id]).unwrap();
    let slabs = [(slab.mapping.addr(), 5)];
    let keep = [go.as_raw_fd(), result.as_raw_fd()];
    // SAFETY: as in `Forked::start`: the child closes fds and runs `read_on_go`.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0);
    if pid == 0 {
        // Like a daemon, the child closes every fd it inherited but its two pipes: stdout and
        // stderr (the test reads them to their end), and the client's socket, whose copy here
        // would otherwise keep the connection open: the node would not see the parent die
        // until this child exits.
        for fd in (0..4096).filter(|fd| !keep.contains(fd)) {
            // SAFETY: closes fds of this forked process only; none is used after.
            unsafe { libc::close(fd) };
        }
        read_on_go(&go, &result, &slabs);
    }
    drop((go, result));
    hold.unmap();
    farmem_testkit::scenario::ready();
    let me = rustix::process::getpid();
    rustix::process::kill_process(me, rustix::process::Signal::KILL).unwrap();
    std::thread::sleep(Duration::from_secs(600));
}

#[test]
fn a_killed_clients_forked_child_keeps_its_held_slab() {
    use std::os::fd::AsRawFd;
    let node = Node::with_slabs(2);
    // Without CLOEXEC: the scenario process, and its reader, inherit these.
    let (go_read, go) = rustix::pipe::pipe().unwrap();
    let (result, result_write) = rustix::pipe::pipe().unwrap();
    for mine in [&go, &result] {
        rustix::io::fcntl_setfd(mine, rustix::io::FdFlags::CLOEXEC).unwrap();
    }
    let victim = farmem_testkit::scenario::Scenario::start(
        "scenario_client_forks_a_reader_then_dies",
        &[
            (
                "FARMEM_TEST_NODE",
                node.path().to_str().unwrap().to_string(),
            ),
            ("FARMEM_TEST_GO_FD", go_read.as_raw_fd().to_string()),
            (
                "FARMEM_TEST_RESULT_FD",
                result_write.as_raw_fd().to_string(),
            ),
        ],
    );
    drop((go_read, result_write));
    let (status, _, stderr) = victim.go(Duration::from_secs(30));
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&status),
        Some(9),
        "the client died by SIGKILL: {status:?} {stderr}"
    );
    let s = node.wait_for("the dead client's slab to be kept", |s| {
        s.kept_slabs == 1 && s.clients.len() == 1
    });
    assert_eq!((s.used_bytes, s.holds), (SLAB, 1), "{s:#?}");
    node.let_the_watcher_run();
    assert_eq!(node.stats().kept_slabs, 1, "kept while the reader lives");
    node.still_served();
    rustix::io::write(&go, &[1]).unwrap();
    let mut r = [0u8; 1];
    assert_eq!(
        rustix::io::read(&result, &mut r).unwrap(),
        1,
        "the reader reported"
    );
    assert_eq!(r[0], 1, "the reader read its dead parent's pages intact");
    node.wait_for("the kept slab to be released", |s| {
        s.used_bytes == 0 && s.holds == 0
    });
    node.still_served();
}
