//! The real `farmem donor` process: its one stdout line, clean shutdown on SIGTERM/SIGINT, the
//! auth token (refusal logged), and clear errors for bad flags.
use std::io::{BufRead, BufReader, Read};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use farmem_transport::{ClientConfig, DonorClient, PageAddr, PageWrite, PAGE_SIZE};

struct Donor {
    child: Child,
    addr: SocketAddr,
    stderr: Arc<Mutex<String>>,
    stdout_rest: std::thread::JoinHandle<String>,
}

fn spawn_donor(extra: &[&str]) -> Donor {
    let mut child = Command::new(env!("CARGO_BIN_EXE_farmem"))
        .args(["donor", "--listen", "127.0.0.1:0", "--slab-size", "1MiB"])
        .args(extra)
        .env("FARMEM_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start farmem donor");
    let stderr = Arc::new(Mutex::new(String::new()));
    {
        let sink = Arc::clone(&stderr);
        let mut pipe = child.stderr.take().unwrap();
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n) = pipe.read(&mut buf) {
                if n == 0 {
                    break;
                }
                sink.lock()
                    .unwrap()
                    .push_str(&String::from_utf8_lossy(&buf[..n]));
            }
        });
    }
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line)
        .expect("read the donor's first line");
    let addr = line
        .strip_prefix("farmem donor listening on ")
        .and_then(|rest| rest.strip_suffix('\n'))
        .unwrap_or_else(|| {
            panic!(
                "unexpected first stdout line {line:?}; stderr: {}",
                stderr.lock().unwrap()
            )
        })
        .parse()
        .expect("the line names a socket address");
    let stdout_rest = std::thread::spawn(move || {
        let mut rest = String::new();
        let _ = out.read_to_string(&mut rest);
        rest
    });
    Donor {
        child,
        addr,
        stderr,
        stdout_rest,
    }
}

fn signal(child: &Child, sig: &str) {
    let ok = Command::new("kill")
        .args([sig, &child.id().to_string()])
        .status()
        .expect("run kill(1)")
        .success();
    assert!(ok, "kill {sig} failed");
}

fn wait_exit(child: &mut Child) -> std::process::ExitStatus {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        if let Some(st) = child.try_wait().unwrap() {
            return st;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("the donor did not exit within 15 s of the signal");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
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
    signal(&d.child, sig);
    let status = wait_exit(&mut d.child);
    let stderr = d.stderr.lock().unwrap().clone();
    assert!(status.success(), "exit {status:?}; stderr:\n{stderr}");
    assert!(stderr.contains("donor stopped"), "stderr:\n{stderr}");
    assert_eq!(
        d.stdout_rest.join().unwrap(),
        "",
        "only one line goes to stdout"
    );
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
    signal(&d.child, "-TERM");
    assert!(wait_exit(&mut d.child).success());
    let stderr = d.stderr.lock().unwrap().clone();
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
        &["--capacity", "1GiB", "--listen", "0.0.0.0:0"],
        "refusing to listen on 0.0.0.0:0 without an auth token",
    );
    fails_with(
        &["--capacity", "1GiB", "--listen", "nonsense"],
        "cannot resolve listen address",
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
}
