//! The coordinator on a real Unix socket with real clients, well-behaved and hostile.
//!
//! These run under heavy parallel load in CI: every state is awaited by polling until it shows
//! (deadline [`DEADLINE`]), never by a fixed sleep followed by one check.
use std::io::{ErrorKind, Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::time::{Duration, Instant};

use farmem_tree::{Admission, Coordinator, Report, TreeClient, TreeSnapshot};

const TOTAL: u64 = 65_536;
const MIN: u64 = 1024;
const DEADLINE: Duration = Duration::from_secs(10);

/// Calls `f` until it returns `Some`, failing with `what` after [`DEADLINE`].
fn until<T>(what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + DEADLINE;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(2));
    }
}

fn report(used: u64, fetched: u64, evicted: u64) -> Report {
    Report {
        used_pages: used,
        fetched_pages: fetched,
        evicted_pages: evicted,
    }
}

fn share(s: &TreeSnapshot, pid: u32) -> Option<farmem_tree::ProcessShare> {
    s.processes.iter().find(|p| p.pid == pid).copied()
}

/// Reads until the coordinator closes the connection; returns what it sent before.
fn read_until_closed(mut s: UnixStream) -> Vec<u8> {
    s.set_read_timeout(Some(DEADLINE)).unwrap();
    let mut got = Vec::new();
    let mut chunk = [0u8; 1024];
    loop {
        match s.read(&mut chunk) {
            Ok(0) => return got,
            Ok(n) => got.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) if e.kind() == ErrorKind::ConnectionReset => return got,
            Err(e) => panic!("the coordinator did not close the connection: {e}"),
        }
    }
}

#[test]
fn demand_moves_memory_from_the_idle_process_to_the_faulting_one() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tree.sock");
    let coordinator = Coordinator::start(&path, TOTAL, Admission::Anyone).unwrap();
    let (mut idle, g) = TreeClient::connect(&path, 1001, MIN).unwrap();
    assert_eq!(g, TOTAL, "the first process gets everything");
    let (mut busy, g) = TreeClient::connect(&path, 1002, MIN).unwrap();
    assert_eq!(
        g, MIN,
        "the second gets its min out of the first's unused grant"
    );

    // The idle one filled its grant and no longer fetches; the busy one faults at its grant.
    // Each gives back what its grant no longer covers (as its runtime would by evicting).
    let mut idle_used = TOTAL;
    let (mut fetched, mut evicted) = (0, 0);
    until("the faulting process to hold 3/4 of the budget", || {
        idle_used = idle_used.min(idle.grant());
        idle.exchange(report(idle_used, 0, 0)).unwrap();
        fetched += 500;
        evicted += 50;
        busy.exchange(report(busy.grant(), fetched, evicted))
            .unwrap();
        (busy.grant() >= (TOTAL - MIN) * 3 / 4).then_some(())
    });
    assert!(idle.grant() >= MIN);
    assert!(idle.grant() + busy.grant() <= TOTAL);
    let s = coordinator.snapshot();
    assert_eq!(s.total_pages, TOTAL);
    assert_eq!(s.processes_seen, 2);
    assert_eq!(s.overcommitted_pages, 0);
    assert_eq!(share(&s, 1002).unwrap().grant_pages, busy.grant());
    assert_eq!(share(&s, 1001).unwrap().peak_used_pages, TOTAL);
    assert!(s.peak_total_used_pages >= TOTAL);
}

#[test]
fn a_process_that_leaves_returns_its_grant_to_the_next_one() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tree.sock");
    let coordinator = Coordinator::start(&path, TOTAL, Admission::Anyone).unwrap();
    let (mut first, _) = TreeClient::connect(&path, 2001, MIN).unwrap();
    first.exchange(report(30_000, 10, 0)).unwrap();
    let (_second, g) = TreeClient::connect(&path, 2002, MIN).unwrap();
    assert_eq!(g, MIN);
    until("the first process's grant to be lowered", || {
        first.exchange(report(30_000, 10, 0)).unwrap();
        (first.grant() == TOTAL - MIN).then_some(())
    });
    drop(first);
    until("the first process to be counted as gone", || {
        let s = coordinator.snapshot();
        let p = share(&s, 2001)?;
        (!p.running && p.grant_pages == 0 && p.peak_used_pages == 30_000).then_some(())
    });
    let (_third, g) = TreeClient::connect(&path, 2003, MIN).unwrap();
    assert_eq!(g, TOTAL - MIN, "the third gets what the first gave back");
    assert_eq!(coordinator.snapshot().processes_seen, 3);
}

#[test]
fn hostile_clients_are_dropped_and_the_others_keep_their_grants() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tree.sock");
    let coordinator = Coordinator::start(&path, TOTAL, Admission::Anyone).unwrap();
    let (mut good, g) = TreeClient::connect(&path, 3001, MIN).unwrap();
    assert_eq!(g, TOTAL);

    let hostile: Vec<(&str, Vec<u8>)> = vec![
        ("garbage", b"hello there\n".to_vec()),
        ("a 10 KB line", vec![b'{'; 10 * 1024]),
        (
            "a report before hello",
            b"{\"report\":{\"used_pages\":1,\"fetched_pages\":0,\"evicted_pages\":0}}\n".to_vec(),
        ),
        (
            "a wrong version",
            b"{\"hello\":{\"version\":2,\"pid\":3009,\"min_pages\":1}}\n".to_vec(),
        ),
        (
            "a least share above the whole budget",
            format!(
                "{{\"hello\":{{\"version\":1,\"pid\":3007,\"min_pages\":{}}}}}\n",
                TOTAL + 1
            )
            .into_bytes(),
        ),
        (
            "an unknown field",
            b"{\"hello\":{\"version\":1,\"pid\":3008,\"min_pages\":1,\"x\":1}}\n".to_vec(),
        ),
    ];
    for (what, bytes) in hostile {
        let mut s = UnixStream::connect(&path).unwrap();
        // The coordinator may close before it has read everything: a failed write is fine.
        let _ = s.write_all(&bytes);
        let got = read_until_closed(s);
        assert!(got.is_empty(), "{what}: the coordinator answered {got:?}");
        good.exchange(report(good.grant(), 0, 0))
            .unwrap_or_else(|e| panic!("after {what}: {e}"));
    }

    // Half a line, then close, after a proper hello: dropped, its grant returns.
    let mut half = UnixStream::connect(&path).unwrap();
    half.write_all(b"{\"hello\":{\"version\":1,\"pid\":3002,\"min_pages\":2048}}\n")
        .unwrap();
    half.set_read_timeout(Some(DEADLINE)).unwrap();
    let mut line = [0u8; 64];
    let n = half.read(&mut line).unwrap();
    assert!(
        line[..n].starts_with(b"{\"grant\":{\"pages\":"),
        "{:?}",
        &line[..n]
    );
    until(
        "the good client to receive its grant lowered for the newcomer",
        || {
            good.exchange(report(good.grant(), 0, 0)).unwrap();
            (good.grant() == TOTAL - 2048).then_some(())
        },
    );
    half.write_all(b"{\"report\":{\"used_pa").unwrap();
    drop(half);
    until("the half-line client to be dropped", || {
        let s = coordinator.snapshot();
        (!share(&s, 3002)?.running).then_some(())
    });

    // The good one evicted down to its new grant (as its runtime would).
    good.exchange(report(good.grant(), 0, 0)).unwrap();
    until("the good client's eviction to be seen", || {
        let s = coordinator.snapshot();
        (share(&s, 3001)?.used_pages == TOTAL - 2048).then_some(())
    });
    // What the half-line client held is free again: the next process gets it.
    let (_other, g) = TreeClient::connect(&path, 3003, MIN).unwrap();
    assert_eq!(g, 2048);
    good.exchange(report(good.grant(), 0, 0)).unwrap();
    assert_eq!(good.grant(), TOTAL - 2048);
    let s = coordinator.snapshot();
    assert_eq!(s.processes_seen, 3, "{s:?}");
    assert!(share(&s, 3009).is_none() && share(&s, 3008).is_none() && share(&s, 3007).is_none());
}

#[test]
fn a_client_sees_the_coordinator_go_away() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tree.sock");
    let coordinator = Coordinator::start(&path, TOTAL, Admission::Anyone).unwrap();
    let (mut c, _) = TreeClient::connect(&path, 4001, MIN).unwrap();
    c.exchange(report(1, 0, 0)).unwrap();
    drop(coordinator);
    assert!(!path.exists(), "the socket file is removed");
    let e = until("the client to see the coordinator gone", || {
        c.exchange(report(1, 0, 0)).err()
    });
    assert_eq!(e.kind(), ErrorKind::ConnectionAborted, "{e}");
    assert!(e.to_string().contains("went away"), "{e}");

    let e = TreeClient::connect(&path, 4002, MIN).unwrap_err();
    assert!(e.to_string().contains(&path.display().to_string()), "{e}");
}

#[test]
fn the_socket_is_private_and_a_live_one_is_not_taken_over() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tree.sock");
    let coordinator = Coordinator::start(&path, TOTAL, Admission::Anyone).unwrap();
    let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    let e = Coordinator::start(&path, TOTAL, Admission::Anyone)
        .err()
        .expect("a live socket is refused");
    assert_eq!(e.kind(), ErrorKind::AddrInUse, "{e}");
    // The first one still serves.
    TreeClient::connect(&path, 5001, MIN).unwrap();
    drop(coordinator);

    // A stale socket (nothing listens) is replaced.
    let stale = dir.path().join("stale.sock");
    drop(UnixListener::bind(&stale).unwrap());
    assert!(stale.exists());
    let c = Coordinator::start(&stale, TOTAL, Admission::Anyone).unwrap();
    TreeClient::connect(&stale, 5002, MIN).unwrap();
    drop(c);

    // Anything else is left alone.
    let file = dir.path().join("file");
    std::fs::write(&file, b"keep").unwrap();
    assert!(Coordinator::start(&file, TOTAL, Admission::Anyone).is_err());
    assert_eq!(std::fs::read(&file).unwrap(), b"keep");
    assert!(Path::new(&file).exists());
}

/// A process outside the tree is refused whatever it claims; one inside is known by the pid
/// the kernel gives, not the one it claims.
#[test]
fn only_the_tree_s_processes_join_and_under_their_own_pid() {
    let dir = tempfile::tempdir().unwrap();
    let me = std::process::id();

    // A tree rooted at a child of this test: this process is not in it.
    let mut other_root = std::process::Command::new("sleep")
        .arg("60")
        .spawn()
        .expect("spawning sleep");
    let path = dir.path().join("theirs.sock");
    let theirs = Coordinator::start(
        &path,
        TOTAL,
        Admission::Descendants {
            root: other_root.id(),
        },
    )
    .unwrap();
    let e = TreeClient::connect(&path, other_root.id(), MIN)
        .expect_err("a process outside the tree is refused");
    assert_eq!(e.kind(), ErrorKind::ConnectionAborted, "{e}");
    let mut raw = UnixStream::connect(&path).unwrap();
    let _ = raw.write_all(b"{\"hello\":{\"version\":1,\"pid\":1,\"min_pages\":7000}}\n");
    assert!(read_until_closed(raw).is_empty());
    let s = theirs.snapshot();
    assert_eq!(s.processes_seen, 0, "{s:?}");
    drop(theirs);
    other_root.kill().unwrap();
    other_root.wait().unwrap();

    // A tree rooted at this test: it joins under its own pid whatever it claims, and so does a
    // real child process (python, speaking the wire protocol by hand) claiming pid 1.
    let path = dir.path().join("ours.sock");
    let ours = Coordinator::start(&path, TOTAL, Admission::Descendants { root: me }).unwrap();
    let (_me_client, g) = TreeClient::connect(&path, 1, MIN).unwrap();
    assert_eq!(g, TOTAL);
    let mut child = std::process::Command::new("python3")
        .arg("-c")
        .arg(
            "import socket, sys\n\
             s = socket.socket(socket.AF_UNIX)\n\
             s.connect(sys.argv[1])\n\
             s.sendall(b'{\"hello\":{\"version\":1,\"pid\":1,\"min_pages\":1024}}\\n')\n\
             print(s.recv(100).decode().strip(), flush=True)\n\
             sys.stdin.read()\n",
        )
        .arg(&path)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("spawning python3 (a prerequisite of the tests)");
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(child.stdout.as_mut().unwrap()),
        &mut line,
    )
    .unwrap();
    assert!(line.starts_with("{\"grant\":{\"pages\":"), "{line:?}");
    let s = ours.snapshot();
    assert!(
        share(&s, 1).is_none(),
        "nobody is known by the pid claimed: {s:?}"
    );
    assert!(share(&s, me).is_some_and(|p| p.running), "{s:?}");
    assert!(share(&s, child.id()).is_some_and(|p| p.running), "{s:?}");
    drop(child.stdin.take());
    assert!(child.wait().unwrap().success());
    until("the child's departure", || {
        (!share(&ours.snapshot(), child.id())?.running).then_some(())
    });
}
