//! The scrape endpoint: `GET /metrics` over HTTP/1.1 on a thread of its own, one
//! `Connection: close` answer per connection.
//!
//! # Design
//! One scrape is served at a time, on the endpoint's own thread, so a scraper never delays the
//! server's clients. A scraper has [`SCRAPE_DEADLINE`] for its whole request head and the head
//! may be at most [`HEAD_LIMIT`] bytes: a slow or hostile scraper can delay only other scrapers
//! (and the server's shutdown) by seconds.
//!
//! # Limitations
//! A scraper that keeps opening slow connections can keep other scrapers waiting.
use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The longest a scraper may take to send its whole request head.
pub const SCRAPE_DEADLINE: Duration = Duration::from_secs(5);
/// The largest request head answered; a larger one is refused (431).
pub const HEAD_LIMIT: usize = 8192;
/// The longest one write of the answer may block on a scraper that does not read.
const WRITE_TIMEOUT: Duration = Duration::from_secs(2);

/// The metrics endpoint: a listener and the thread answering it. Dropping it stops the thread.
pub struct MetricsEndpoint {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    /// The listener, kept to wake the blocked accept when stopping.
    listener: TcpListener,
    thread: Option<JoinHandle<()>>,
}

impl MetricsEndpoint {
    /// Serves `render()` (Prometheus text) at `http://ADDR/metrics` on a thread named
    /// `thread_name`.
    pub fn start<F>(
        listener: TcpListener,
        thread_name: &str,
        render: F,
    ) -> std::io::Result<MetricsEndpoint>
    where
        F: Fn() -> String + Send + 'static,
    {
        let addr = listener.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let (flag, accepting) = (Arc::clone(&stop), listener.try_clone()?);
        let thread = std::thread::Builder::new()
            .name(thread_name.into())
            .spawn(move || serve(&accepting, &flag, &render))?;
        Ok(MetricsEndpoint {
            addr,
            stop,
            listener,
            thread: Some(thread),
        })
    }

    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for MetricsEndpoint {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        // Wakes the blocked accept() (Linux answers it with EINVAL); the thread sees the flag.
        let _ = rustix::net::shutdown(&self.listener, rustix::net::Shutdown::Read);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Answers scrapers one at a time until `stop` is set.
fn serve(listener: &TcpListener, stop: &AtomicBool, render: &dyn Fn() -> String) {
    for conn in listener.incoming() {
        if stop.load(Ordering::Acquire) {
            break;
        }
        match conn {
            Ok(s) => {
                if let Err(e) = answer(s, render) {
                    tracing::debug!("metrics request failed: {e}");
                }
            }
            Err(e) => {
                tracing::warn!("metrics endpoint: accept failed: {e}");
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }
}

/// Reads one request head (bounded in size and time) and answers it.
fn answer(mut s: TcpStream, render: &dyn Fn() -> String) -> std::io::Result<()> {
    s.set_write_timeout(Some(WRITE_TIMEOUT))?;
    let deadline = Instant::now() + SCRAPE_DEADLINE;
    let mut buf = [0u8; HEAD_LIMIT];
    let mut n = 0;
    // Read until the end of the head, within one deadline for the whole head (a per-read timeout
    // alone would let a scraper dribbling bytes hold the endpoint, and the shutdown, for hours).
    while !buf[..n].windows(4).any(|w| w == b"\r\n\r\n") {
        if n == buf.len() {
            return respond(
                &mut s,
                "431 Request Header Fields Too Large",
                "request headers too large\n",
            );
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return respond(
                &mut s,
                "408 Request Timeout",
                "the request took too long to arrive\n",
            );
        }
        s.set_read_timeout(Some(left))?;
        let r = match s.read(&mut buf[n..]) {
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => continue,
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            r => r?,
        };
        if r == 0 {
            break;
        }
        n += r;
    }
    let line = buf[..n].split(|&b| b == b'\r').next().unwrap_or(&[]);
    let mut parts = line.split(|&b| b == b' ');
    let (method, path) = (parts.next().unwrap_or(&[]), parts.next().unwrap_or(&[]));
    if method != b"GET" {
        return respond(&mut s, "405 Method Not Allowed", "only GET is supported\n");
    }
    if path != b"/metrics" && path != b"/" {
        return respond(&mut s, "404 Not Found", "metrics are at /metrics\n");
    }
    let body = render();
    let head = format!(
        "HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes())?;
    s.write_all(body.as_bytes())?;
    s.flush()
}

fn respond(s: &mut TcpStream, status: &str, body: &str) -> std::io::Result<()> {
    let msg = format!(
        "HTTP/1.1 {status}\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    s.write_all(msg.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn endpoint() -> MetricsEndpoint {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        MetricsEndpoint::start(l, "metrics-test", || "up 1\n".to_string()).unwrap()
    }

    fn request(ep: &MetricsEndpoint, bytes: &[u8]) -> String {
        let mut s = TcpStream::connect(ep.addr()).unwrap();
        s.write_all(bytes).unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        out
    }

    #[test]
    fn the_endpoint_serves_metrics_and_refuses_the_rest() {
        let ep = endpoint();
        let get = |path: &str| {
            request(
                &ep,
                format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes(),
            )
        };
        let ok = get("/metrics");
        assert!(ok.starts_with("HTTP/1.1 200 OK"), "{ok}");
        assert!(
            ok.contains("Content-Type: text/plain; version=0.0.4"),
            "{ok}"
        );
        assert!(ok.contains("Connection: close\r\n"), "{ok}");
        assert!(ok.ends_with("\r\n\r\nup 1\n"), "{ok}");
        assert!(get("/").starts_with("HTTP/1.1 200 OK"));
        assert!(get("/other").starts_with("HTTP/1.1 404"));
        let post = request(&ep, b"POST /metrics HTTP/1.1\r\n\r\n");
        assert!(post.starts_with("HTTP/1.1 405"), "{post}");
    }

    #[test]
    fn a_head_over_the_limit_is_refused() {
        let ep = endpoint();
        let mut s = TcpStream::connect(ep.addr()).unwrap();
        s.write_all(b"GET /metrics HTTP/1.1\r\nX-Big: ").unwrap();
        // The endpoint answers and closes once the limit is reached; later writes may fail.
        let _ = s.write_all(&vec![b'a'; HEAD_LIMIT]);
        let mut out = String::new();
        let _ = s.read_to_string(&mut out);
        assert!(out.starts_with("HTTP/1.1 431"), "{out}");
    }

    #[test]
    fn a_scraper_that_never_finishes_its_head_is_answered_at_the_deadline_and_stops_nothing() {
        let ep = endpoint();
        let started = Instant::now();
        let mut slow = TcpStream::connect(ep.addr()).unwrap();
        slow.write_all(b"GET /metrics HTTP/1.1\r\n").unwrap();
        // The next scraper waits for the slow one's deadline, no longer.
        let ok = request(&ep, b"GET /metrics HTTP/1.1\r\n\r\n");
        assert!(ok.starts_with("HTTP/1.1 200 OK"), "{ok}");
        let waited = started.elapsed();
        assert!(
            waited >= SCRAPE_DEADLINE - Duration::from_millis(100) && waited < SCRAPE_DEADLINE * 3,
            "{waited:?}"
        );
        let mut out = String::new();
        slow.read_to_string(&mut out).unwrap();
        assert!(out.starts_with("HTTP/1.1 408"), "{out}");
        // Dropping the endpoint stops its thread, promptly.
        let stopping = Instant::now();
        drop(ep);
        assert!(stopping.elapsed() < Duration::from_secs(2));
    }
}
