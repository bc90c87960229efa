//! Shared helpers of the `farmem run` integration tests (run_*.rs): locating the binary and
//! the preload library, required programs, free loopback ports, a minimal RESP client,
//! deterministic values, and reading the stats file.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// The `farmem` binary under test.
pub fn farmem() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_farmem"))
}

/// Fails unless libfarmem_preload.so sits where `farmem run` looks for it.
pub fn require_preload_lib() {
    let bin = farmem();
    let dir = bin.parent().unwrap();
    let ok = std::env::var_os("FARMEM_PRELOAD").is_some()
        || dir.join("libfarmem_preload.so").is_file()
        || dir.join("deps/libfarmem_preload.so").is_file();
    assert!(
        ok,
        "libfarmem_preload.so is missing next to {}: build it first (cargo build --release \
         --workspace, as scripts/setup.sh does)",
        bin.display()
    );
}

/// The path of `program`, or a test failure naming the Debian package that provides it.
pub fn require_program(program: &str, package: &str) -> PathBuf {
    let path = std::env::var_os("PATH").unwrap_or_default();
    for dir in
        std::env::split_paths(&path).chain([PathBuf::from("/usr/bin"), PathBuf::from("/usr/sbin")])
    {
        let p = dir.join(program);
        if p.is_file() {
            return p;
        }
    }
    panic!(
        "{program} is not installed: install the Debian package {package} (scripts/setup.sh does)"
    );
}

/// A scratch directory removed on drop.
pub struct Scratch(pub PathBuf);

impl Scratch {
    pub fn new(tag: &str) -> Scratch {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos();
        let p =
            std::env::temp_dir().join(format!("farmem-test-{tag}-{}-{nanos}", std::process::id()));
        std::fs::create_dir_all(&p).unwrap();
        Scratch(p)
    }
    pub fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Compiles a C file of tests/c/ with the system C compiler.
pub fn compile_c(source: &str, out: &Path, extra: &[&str]) {
    let cc = require_program("cc", "build-essential");
    let src = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/c")
        .join(source);
    let o = Command::new(cc)
        .args(["-O2", "-pthread", "-Wall", "-o"])
        .arg(out)
        .arg(&src)
        .args(extra)
        .output()
        .expect("running cc");
    assert!(
        o.status.success(),
        "compiling {}: {}",
        src.display(),
        String::from_utf8_lossy(&o.stderr)
    );
}

/// `farmem run ARGS -- COMMAND`, waiting for it.
pub fn farmem_run(args: &[&str], command: &[&str]) -> Output {
    require_preload_lib();
    Command::new(farmem())
        .arg("run")
        .args(args)
        .arg("--")
        .args(command)
        .stdin(Stdio::null())
        .output()
        .expect("starting farmem run")
}

/// A `farmem run` started in the background, in its own process group, its output in a log
/// file. Dropping it kills the whole group (farmem run, the program, the embedded donor), so a
/// failing test leaves nothing behind.
pub struct Running {
    pub child: Child,
    pub log: PathBuf,
}

impl Running {
    /// The log so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits up to `timeout` for `farmem run` to end; a test failure (with the log) otherwise.
    pub fn wait(&mut self, timeout: Duration) -> std::process::ExitStatus {
        let start = Instant::now();
        loop {
            if let Some(st) = self.child.try_wait().unwrap() {
                return st;
            }
            assert!(
                start.elapsed() < timeout,
                "farmem run did not end within {timeout:?}; log:\n{}",
                self.log_text()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Sends `sig` to `farmem run` (which passes SIGTERM/SIGHUP on to the program).
    pub fn signal(&self, sig: &str) {
        let st = Command::new("kill")
            .args([&format!("-{sig}"), &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(st.success());
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            // the group's id is farmem run's pid (process_group(0) below)
            let _ = Command::new("kill")
                .args(["-KILL", "--", &format!("-{}", self.child.id())])
                .status();
            let _ = self.child.wait();
        }
    }
}

/// Starts `farmem run ARGS -- COMMAND` in the background, output to `log`.
pub fn farmem_spawn(args: &[&str], command: &[&str], log: &Path) -> Running {
    use std::os::unix::process::CommandExt;
    require_preload_lib();
    let out = std::fs::File::create(log).unwrap();
    let err = out.try_clone().unwrap();
    let child = Command::new(farmem())
        .arg("run")
        .args(args)
        .arg("--")
        .args(command)
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .process_group(0)
        .spawn()
        .expect("starting farmem run");
    Running {
        child,
        log: log.to_path_buf(),
    }
}

/// Runs `cmd` to completion within `timeout` (killed and a test failure otherwise).
pub fn output_within(cmd: &mut Command, timeout: Duration) -> Output {
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let start = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if start.elapsed() > timeout {
            let _ = child.kill();
            let o = child.wait_with_output().unwrap();
            panic!("{cmd:?} did not finish within {timeout:?}: {}", text(&o));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    child.wait_with_output().unwrap()
}

/// Text of an output, for messages.
pub fn text(o: &Output) -> String {
    format!(
        "status {:?}\n--- stdout\n{}\n--- stderr\n{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// The stats file written by the library, as JSON.
pub fn read_stats(path: &Path) -> serde_json::Value {
    let s = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("reading the stats file {}: {e}", path.display()));
    serde_json::from_str(&s).unwrap_or_else(|e| panic!("stats file is not JSON ({e}): {s}"))
}

/// A figure of the stats file's `summary` object.
pub fn counter(stats: &serde_json::Value, key: &str) -> u64 {
    stats["summary"][key]
        .as_u64()
        .unwrap_or_else(|| panic!("stats have no summary figure {key}: {stats}"))
}

/// A free TCP port on 127.0.0.1.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Connects to 127.0.0.1:port, retrying until `timeout` (a server starting up under farmem).
pub fn connect_retry(port: u16, timeout: Duration, r: &mut Running) -> TcpStream {
    let start = Instant::now();
    loop {
        if let Ok(s) = TcpStream::connect(("127.0.0.1", port)) {
            s.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
            return s;
        }
        if let Ok(Some(st)) = r.child.try_wait() {
            panic!(
                "the server exited before listening ({st}): {}",
                r.log_text()
            );
        }
        assert!(
            start.elapsed() < timeout,
            "nothing listens on 127.0.0.1:{port} after {timeout:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Connects to a server started without farmem (`child`), retrying until `timeout`.
pub fn connect_plain(port: u16, timeout: Duration, child: &mut Child) -> TcpStream {
    let start = Instant::now();
    loop {
        if let Ok(s) = TcpStream::connect(("127.0.0.1", port)) {
            s.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
            return s;
        }
        if let Ok(Some(st)) = child.try_wait() {
            panic!("the server exited before listening ({st})");
        }
        assert!(
            start.elapsed() < timeout,
            "nothing listens on 127.0.0.1:{port} after {timeout:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Deterministic pseudo-random bytes for item `i` (so tests need not keep the dataset).
pub fn value_of(i: u64, len: usize) -> Vec<u8> {
    let mut x = i.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0xD1B5_4A32_D192_ED03;
    let mut v = Vec::with_capacity(len + 8);
    while v.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.extend_from_slice(&x.to_le_bytes());
    }
    v.truncate(len);
    v
}

/// A minimal RESP (redis) client: pipelined commands, replies read in order.
pub struct Resp {
    r: BufReader<TcpStream>,
    w: std::io::BufWriter<TcpStream>,
}

/// One RESP reply.
#[derive(Debug, PartialEq, Eq)]
pub enum Reply {
    Status(String),
    Error(String),
    Int(i64),
    Bulk(Option<Vec<u8>>),
    Array(Vec<Reply>),
}

impl Resp {
    pub fn new(s: TcpStream) -> Resp {
        Resp {
            r: BufReader::new(s.try_clone().unwrap()),
            w: std::io::BufWriter::new(s),
        }
    }
    pub fn send(&mut self, args: &[&[u8]]) {
        write!(self.w, "*{}\r\n", args.len()).unwrap();
        for a in args {
            write!(self.w, "${}\r\n", a.len()).unwrap();
            self.w.write_all(a).unwrap();
            self.w.write_all(b"\r\n").unwrap();
        }
    }
    pub fn flush(&mut self) {
        self.w.flush().unwrap();
    }
    pub fn read(&mut self) -> Reply {
        let mut line = Vec::new();
        self.r.read_until(b'\n', &mut line).unwrap();
        assert!(line.ends_with(b"\r\n"), "truncated RESP reply {line:?}");
        let body = String::from_utf8_lossy(&line[1..line.len() - 2]).into_owned();
        match line[0] {
            b'+' => Reply::Status(body),
            b'-' => Reply::Error(body),
            b':' => Reply::Int(body.parse().unwrap()),
            b'$' => {
                let n: i64 = body.parse().unwrap();
                if n < 0 {
                    return Reply::Bulk(None);
                }
                let mut buf = vec![0u8; n as usize + 2];
                self.r.read_exact(&mut buf).unwrap();
                buf.truncate(n as usize);
                Reply::Bulk(Some(buf))
            }
            b'*' => {
                let n: i64 = body.parse().unwrap();
                Reply::Array((0..n.max(0)).map(|_| self.read()).collect())
            }
            c => panic!("unexpected RESP type byte {c:?}"),
        }
    }
    /// One command, one reply.
    pub fn call(&mut self, args: &[&[u8]]) -> Reply {
        self.send(args);
        self.flush();
        self.read()
    }
}

/// redis-benchmark's key for item i (so its GETs hit the loaded keys).
pub fn redis_key(i: u64) -> String {
    format!("key:{i:012}")
}
