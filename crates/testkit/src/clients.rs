//! Clients of the servers tests run under farmem: free loopback ports, connecting with
//! retries, a minimal RESP (redis) client, and deterministic values.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::Child;
use std::time::{Duration, Instant};

use crate::run::Running;

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

/// Stores keys `0..keys` ([`redis_key`]) with values [`value_of`]`(i, value_bytes)`, pipelined
/// 1000 at a time, checking every reply.
pub fn redis_load(c: &mut Resp, keys: u64, value_bytes: usize) {
    for start in (0..keys).step_by(PIPELINE as usize) {
        let end = (start + PIPELINE).min(keys);
        for i in start..end {
            c.send(&[b"SET", redis_key(i).as_bytes(), &value_of(i, value_bytes)]);
        }
        c.flush();
        for i in start..end {
            assert_eq!(c.read(), Reply::Status("OK".into()), "SET {i}");
        }
    }
}

/// Reads back every key [`redis_load`] stored (and checks there are no others); `what` names
/// the moment in failure messages.
pub fn redis_verify(c: &mut Resp, keys: u64, value_bytes: usize, what: &str) {
    assert_eq!(
        c.call(&[b"DBSIZE"]),
        Reply::Int(keys as i64),
        "{what}: DBSIZE"
    );
    for start in (0..keys).step_by(PIPELINE as usize) {
        let end = (start + PIPELINE).min(keys);
        for i in start..end {
            c.send(&[b"GET", redis_key(i).as_bytes()]);
        }
        c.flush();
        for i in start..end {
            match c.read() {
                Reply::Bulk(Some(v)) => {
                    assert!(v == value_of(i, value_bytes), "{what}: key {i} differs")
                }
                other => panic!("{what}: GET {i} gave {other:?}"),
            }
        }
    }
}

/// Commands sent before their replies are read.
const PIPELINE: u64 = 1000;

/// `GET path` over HTTP/1.1 from `addr` (a metrics endpoint): the response's head and body.
pub fn http_get(addr: impl std::net::ToSocketAddrs, path: &str) -> (String, String) {
    let mut s = TcpStream::connect(addr).expect("connecting to the HTTP endpoint");
    write!(s, "GET {path} HTTP/1.1\r\nHost: localhost\r\n\r\n").unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text)
        .expect("reading the HTTP response");
    let (head, body) = text
        .split_once("\r\n\r\n")
        .unwrap_or_else(|| panic!("no HTTP head and body in {text:?}"));
    (head.to_string(), body.to_string())
}
