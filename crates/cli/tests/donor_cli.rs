//! The real `farmem donor` process: its one stdout line, clean shutdown on SIGTERM/SIGINT, the
//! auth token (refusal logged), and clear errors for bad flags.
use std::io::Read;
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::time::Duration;

use farmem_transport::{ClientConfig, DonorClient, PageAddr, PageWrite, PAGE_SIZE};

use farmem_testkit::donor::Donor;

fn spawn_donor(extra: &[&str]) -> Donor {
    let mut args = vec!["--slab-size", "1MiB"];
    args.extend_from_slice(extra);
    Donor::spawn(&args)
}

fn client(
    addr: SocketAddr,
    token: Option<&[u8]>,
) -> Result<DonorClient, farmem_transport::TransportError> {
    DonorClient::connect(
        &addr.to_string(),
        ClientConfig {
            client_id: 42,
            token: token.map(<[u8]>::to_vec),
            ..ClientConfig::default()
        },
    )
}

fn round_trip(c: &DonorClient) {
    let slab = c.alloc_slab().expect("alloc");
    let data = vec![0x5au8; PAGE_SIZE];
    let addr = PageAddr { slab, page: 3 };
    c.write_pages(&[PageWrite { addr, data: &data }])
        .expect("write");
    let mut out = vec![0u8; PAGE_SIZE];
    c.read_pages(&[addr], &mut out).expect("read");
    assert_eq!(out, data);
}

fn stop_with(sig: &str) {
    let mut d = spawn_donor(&["--capacity", "64MiB", "--metrics", "127.0.0.1:0"]);
    let c = client(d.addr, None).expect("connect");
    assert_eq!(c.info().capacity_bytes, 64 << 20);
    assert_eq!(c.info().slab_size_bytes, 1 << 20);
    round_trip(&c);
    d.signal(sig);
    let status = d.wait_exit();
    let (stdout_rest, stderr) = d.output_after_exit();
    assert!(status.success(), "exit {status:?}; stderr:\n{stderr}");
    assert!(stderr.contains("donor stopped"), "stderr:\n{stderr}");
    assert_eq!(stdout_rest, "", "only one line goes to stdout");
    assert!(c.stats().is_err(), "the donor is gone");
}

#[test]
fn sigterm_stops_the_donor_cleanly() {
    stop_with("-TERM");
}

#[test]
fn sigint_stops_the_donor_cleanly() {
    stop_with("-INT");
}

#[test]
fn a_wrong_token_is_refused_and_logged() {
    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, b"correct horse battery staple").unwrap();
    // Token files must be private (mode 600).
    std::fs::set_permissions(
        &token_file,
        std::os::unix::fs::PermissionsExt::from_mode(0o600),
    )
    .unwrap();
    let mut d = spawn_donor(&[
        "--capacity",
        "16MiB",
        "--token-file",
        token_file.to_str().unwrap(),
    ]);
    assert!(client(d.addr, Some(b"wrong")).is_err());
    assert!(client(d.addr, None).is_err());
    let c = client(d.addr, Some(b"correct horse battery staple")).expect("right token");
    round_trip(&c);
    d.signal("-TERM");
    assert!(d.wait_exit().success());
    let (_, stderr) = d.output_after_exit();
    assert!(
        stderr.matches("authentication failed").count() >= 2,
        "stderr:\n{stderr}"
    );
}

fn fails_with(args: &[&str], expect: &str) {
    let out = Command::new(env!("CARGO_BIN_EXE_farmem"))
        .arg("donor")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run farmem donor");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{args:?} should fail");
    assert!(out.stdout.is_empty(), "{args:?} printed to stdout");
    assert!(
        stderr.contains(expect),
        "{args:?}: expected {expect:?} in:\n{stderr}"
    );
}

#[test]
fn bad_flags_are_clear_errors() {
    fails_with(&["--capacity", "12XB"], "unknown unit `xb`");
    fails_with(&["--capacity", "lots"], "bad size `lots`");
    fails_with(&["--listen", "127.0.0.1:0"], "--capacity");
    fails_with(
        &["--capacity", "1GiB", "--slab-size", "1000"],
        "multiple of the page size",
    );
    fails_with(
        &["--capacity", "1MiB", "--listen", "127.0.0.1:0"],
        "smaller than one slab",
    );
    fails_with(
        &["--capacity", "1GiB", "--orphan-grace", "5parsecs"],
        "bad duration `5parsecs`",
    );
    fails_with(
        &["--capacity", "1GiB", "--capacity-file", "/nonexistent/cap"],
        "cannot be used with",
    );
    fails_with(
        &[
            "--capacity-file",
            "/nonexistent/cap",
            "--listen",
            "127.0.0.1:0",
        ],
        "reading the capacity file /nonexistent/cap",
    );
    fails_with(
        &["--capacity", "1GiB", "--keep-free", "much"],
        "bad size `much`",
    );
    fails_with(
        &["--capacity", "1GiB", "--listen", "0.0.0.0:0"],
        "refusing to listen on 0.0.0.0:0 without an auth token",
    );
    fails_with(
        &["--capacity", "1GiB", "--listen", "nonsense"],
        "cannot resolve address \"nonsense\"",
    );
    fails_with(
        &[
            "--capacity",
            "1GiB",
            "--listen",
            "127.0.0.1:0",
            "--token-file",
            "/nonexistent/token",
        ],
        "reading the token file /nonexistent/token",
    );
    // An embedded donor is told its parent's pid; a donor whose parent is not that process
    // (the runtime died before it started) does not start.
    fails_with(
        &[
            "--capacity",
            "1GiB",
            "--listen",
            "127.0.0.1:0",
            "--exit-with-parent",
            "1",
        ],
        "--exit-with-parent 1: that process is not our parent",
    );
}

/// A request frame built by hand (header layout: crates/proto/src/lib.rs), so bad ones can be.
fn frame(version: u8, opcode: u8, request_id: u64, payload_len: u32, payload: &[u8]) -> Vec<u8> {
    let mut f = Vec::with_capacity(20 + payload.len());
    f.extend_from_slice(b"FM");
    f.push(version);
    f.push(opcode);
    f.extend_from_slice(&request_id.to_le_bytes());
    f.extend_from_slice(&[0, 0, 0, 0]);
    f.extend_from_slice(&payload_len.to_le_bytes());
    f.extend_from_slice(payload);
    f
}

fn req(opcode: u8, payload: &[u8]) -> Vec<u8> {
    frame(2, opcode, 7, payload.len() as u32, payload)
}

/// Sends `f` and returns the response's status and payload; `None` if the donor closed.
fn exchange(s: &mut std::net::TcpStream, f: &[u8]) -> Option<(u16, Vec<u8>)> {
    use std::io::Write;
    s.write_all(f).unwrap();
    let mut head = [0u8; 20];
    s.read_exact(&mut head).ok()?;
    let len = u32::from_le_bytes(head[16..20].try_into().unwrap()) as usize;
    let mut payload = vec![0u8; len];
    s.read_exact(&mut payload).ok()?;
    Some((u16::from_le_bytes([head[12], head[13]]), payload))
}

fn hello_stream(addr: SocketAddr, client: u64) -> std::net::TcpStream {
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    // HELLO (protocol version 2), then AUTH registering `client` (this donor has no token, so
    // any token proof passes) with a reconnect key.
    assert_eq!(
        exchange(&mut s, &req(1, &2u16.to_le_bytes())).unwrap().0,
        0,
        "HELLO"
    );
    let mut p = client.to_le_bytes().to_vec();
    p.push(0);
    p.extend_from_slice(&[0u8; 32]);
    p.extend_from_slice(&[client as u8; 32]);
    assert_eq!(exchange(&mut s, &req(7, &p)).unwrap().0, 0, "AUTH");
    s
}

fn read_req(slab: u32, page: u32) -> Vec<u8> {
    let mut p = 1u16.to_le_bytes().to_vec();
    p.extend_from_slice(&slab.to_le_bytes());
    p.extend_from_slice(&page.to_le_bytes());
    req(5, &p)
}

#[test]
fn every_bad_input_gets_a_log_line() {
    let mut d = spawn_donor(&["--capacity", "16MiB"]);
    let mut owner = hello_stream(d.addr, 1);
    let (st, slab) = exchange(&mut owner, &req(2, &[])).unwrap();
    assert_eq!(st, 0);
    let slab = u32::from_le_bytes(slab[..4].try_into().unwrap());

    let mut s = hello_stream(d.addr, 2);
    // Unknown request type, another client's slab, page out of range, batch over the limit:
    // error statuses (4, 7, 8, 6), connection kept.
    assert_eq!(exchange(&mut s, &req(0x42, b"")).unwrap().0, 4);
    assert_eq!(exchange(&mut s, &read_req(slab, 0)).unwrap().0, 7);
    let (_, own) = exchange(&mut s, &req(2, &[])).unwrap();
    let own = u32::from_le_bytes(own[..4].try_into().unwrap());
    assert_eq!(exchange(&mut s, &read_req(own, 256)).unwrap().0, 8);
    let mut p = 300u16.to_le_bytes().to_vec();
    p.extend_from_slice(&[0u8; 8]);
    assert_eq!(exchange(&mut s, &req(5, &p)).unwrap().0, 6);
    // Wrong version and a frame too long: answered, then closed.
    let mut v = std::net::TcpStream::connect(d.addr).unwrap();
    assert_eq!(exchange(&mut v, &frame(9, 6, 1, 0, b"")).unwrap().0, 1);
    let mut l = hello_stream(d.addr, 3);
    assert_eq!(
        exchange(&mut l, &frame(2, 4, 1, u32::MAX, b"")).unwrap().0,
        5
    );
    // A truncated frame: the client goes away mid-header.
    let mut t = hello_stream(d.addr, 4);
    {
        use std::io::Write;
        t.write_all(&req(6, b"")[..9]).unwrap();
    }
    t.shutdown(std::net::Shutdown::Write).unwrap();
    let mut rest = Vec::new();
    let _ = t.read_to_end(&mut rest);
    // The owner still reads its slab.
    assert_eq!(exchange(&mut owner, &read_req(slab, 3)).unwrap().0, 0);

    d.signal("-TERM");
    assert!(d.wait_exit().success());
    let (_, stderr) = d.output_after_exit();
    for needle in [
        "unknown request type 0x42",
        "belongs to another client",
        "is outside slab",
        "outside 1..=256",
        "protocol version 9 is not supported",
        "exceeds the limit",
        "truncated frame",
    ] {
        assert!(
            stderr.contains(needle),
            "no log line with {needle:?} in:\n{stderr}"
        );
    }
}

#[test]
fn a_busy_port_or_bad_address_names_the_cause_once() {
    let busy = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = busy.local_addr().unwrap().to_string();
    for (args, expect) in [
        (
            vec!["--capacity", "1GiB", "--listen", port.as_str()],
            "another donor",
        ),
        (
            vec![
                "--capacity",
                "1GiB",
                "--listen",
                "127.0.0.1:0",
                "--metrics",
                port.as_str(),
            ],
            "cannot serve metrics",
        ),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_farmem"))
            .arg("donor")
            .args(&args)
            .stdin(Stdio::null())
            .output()
            .expect("run farmem donor");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} should fail");
        assert!(stderr.contains(expect), "{args:?}: {stderr}");
        assert_eq!(
            stderr.matches("Address already in use").count(),
            1,
            "{args:?}: the OS error should appear once: {stderr}"
        );
    }
}

#[test]
fn help_explains_the_stdout_line_stopping_and_security() {
    let out = Command::new(env!("CARGO_BIN_EXE_farmem"))
        .args(["donor", "--help"])
        .output()
        .expect("run farmem donor --help");
    assert!(out.status.success());
    let help = String::from_utf8_lossy(&out.stdout);
    for needle in [
        "farmem donor listening on ADDR",
        "SIGTERM",
        "--token-file",
        "--insecure",
        "--orphan-grace",
        "--keep-free",
        "--capacity-file",
        "SIGHUP",
        "least recently written",
        "Examples:",
    ] {
        assert!(help.contains(needle), "{needle:?} missing from:\n{help}");
    }
}
