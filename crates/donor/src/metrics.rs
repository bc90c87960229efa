//! The donor's counters and service-time histograms, the STATS answer, and the Prometheus text
//! endpoint (`--metrics ADDR`).
//!
//! # Design
//! Counters are relaxed atomics updated on the data path (no lock). Service time goes to two
//! places: fixed Prometheus buckets (atomics) and an `hdrhistogram` behind a mutex (held for one
//! `record` call, nanoseconds) from which STATS computes p50/p99.
//!
//! The endpoint is a tiny hand-written HTTP/1.1 responder rather than an HTTP framework: it
//! answers `GET /metrics` with one `Connection: close` response per connection, which is all a
//! Prometheus scraper needs, and it keeps the donor free of an async runtime and a large
//! dependency tree. It runs on its own thread; a scraper has [`REQUEST_DEADLINE`] for its whole
//! request, so a slow or hostile scraper can delay only other scrapers (and the donor's shutdown)
//! by seconds, and never the data path.
//!
//! # Limitations
//! One scrape is served at a time; request headers beyond 8 KiB are refused. A scraper that
//! keeps opening slow connections can keep other scrapers waiting.
use std::fmt::Write as _;
use std::io::{ErrorKind, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use farmem_proto::{DonorStats, Opcode, Status};
use hdrhistogram::Histogram;
use parking_lot::Mutex;

use crate::store::{SlabStore, TenantUse};

/// Each tenant's use, quota and clients, one sample per tenant (label `tenant`).
fn render_tenants(o: &mut String, store: &SlabStore) {
    let tenants = store.tenant_use();
    let family = |o: &mut String, name: &str, help: &str, v: &dyn Fn(&TenantUse) -> Option<u64>| {
        let _ = writeln!(o, "# HELP {name} {help}\n# TYPE {name} gauge");
        for t in &tenants {
            if let Some(v) = v(t) {
                let _ = writeln!(o, "{name}{{tenant=\"{}\"}} {v}", label_value(&t.name));
            }
        }
    };
    family(
        o,
        "farmem_donor_tenant_used_bytes",
        "Bytes in the slabs a tenant's clients hold.",
        &|t| Some(t.used_bytes),
    );
    family(
        o,
        "farmem_donor_tenant_quota_bytes",
        "A tenant's quota in bytes (tenants with one only).",
        &|t| t.quota_bytes,
    );
    family(
        o,
        "farmem_donor_tenant_clients",
        "A tenant's clients, connected or waiting out the orphan grace.",
        &|t| Some(t.clients),
    );
}

/// A Prometheus label value: backslash, double quote and newline escaped.
fn label_value(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// Upper bounds of the service-time histogram buckets, in seconds (Prometheus `le`).
pub const SERVICE_BUCKETS_S: [f64; 14] = [
    5e-6, 10e-6, 20e-6, 50e-6, 100e-6, 200e-6, 500e-6, 1e-3, 2e-3, 5e-3, 10e-3, 50e-3, 100e-3, 1.0,
];

/// Number of request-type slots: one per opcode plus one for unknown opcodes (index 0).
const TYPES: usize = Opcode::ALL.len() + 1;

fn type_index(op: Option<Opcode>) -> usize {
    op.map_or(0, |o| o as usize)
}

fn type_name(i: usize) -> &'static str {
    Opcode::ALL
        .iter()
        .find(|o| **o as usize == i)
        .map_or("unknown", |o| o.name())
}

/// Counters shared by every connection.
pub struct Metrics {
    start: Instant,
    requests: [AtomicU64; TYPES],
    bytes_in: [AtomicU64; TYPES],
    bytes_out: [AtomicU64; TYPES],
    errors: [AtomicU64; Status::ALL.len()],
    pages_read: AtomicU64,
    pages_written: AtomicU64,
    connections: AtomicU64,
    connections_total: AtomicU64,
    refused_full: AtomicU64,
    refused_bound: AtomicU64,
    evicted_unauthenticated: AtomicU64,
    reclaim_wanted_bytes: AtomicU64,
    reclaim_wanted_slabs: AtomicU64,
    reclaim_overdue_slabs: AtomicU64,
    slabs_given_back: AtomicU64,
    buckets: [AtomicU64; SERVICE_BUCKETS_S.len() + 1],
    service_sum_ns: AtomicU64,
    service_count: AtomicU64,
    hist: Mutex<Histogram<u64>>,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl Metrics {
    /// Fresh counters; the uptime clock starts now.
    pub fn new() -> Metrics {
        Metrics {
            start: Instant::now(),
            requests: Default::default(),
            bytes_in: Default::default(),
            bytes_out: Default::default(),
            errors: Default::default(),
            pages_read: AtomicU64::new(0),
            pages_written: AtomicU64::new(0),
            connections: AtomicU64::new(0),
            connections_total: AtomicU64::new(0),
            refused_full: AtomicU64::new(0),
            refused_bound: AtomicU64::new(0),
            evicted_unauthenticated: AtomicU64::new(0),
            reclaim_wanted_bytes: AtomicU64::new(0),
            reclaim_wanted_slabs: AtomicU64::new(0),
            reclaim_overdue_slabs: AtomicU64::new(0),
            slabs_given_back: AtomicU64::new(0),
            buckets: Default::default(),
            service_sum_ns: AtomicU64::new(0),
            service_count: AtomicU64::new(0),
            // 1 ns .. 1 h, 3 significant digits: bounds are constants, so this cannot fail.
            hist: Mutex::new(
                Histogram::new_with_bounds(1, 3_600_000_000_000, 3)
                    .expect("valid histogram bounds"),
            ),
        }
    }

    /// One request served: its type, outcome, wire bytes each way and service time.
    pub fn record(
        &self,
        op: Option<Opcode>,
        status: Status,
        bytes_in: u64,
        bytes_out: u64,
        service: Duration,
    ) {
        let t = type_index(op);
        self.requests[t].fetch_add(1, Ordering::Relaxed);
        self.bytes_in[t].fetch_add(bytes_in, Ordering::Relaxed);
        self.bytes_out[t].fetch_add(bytes_out, Ordering::Relaxed);
        if status != Status::Ok {
            self.errors[status.code() as usize].fetch_add(1, Ordering::Relaxed);
        }
        let ns = u64::try_from(service.as_nanos()).unwrap_or(u64::MAX).max(1);
        let secs = service.as_secs_f64();
        let b = SERVICE_BUCKETS_S
            .iter()
            .position(|&le| secs <= le)
            .unwrap_or(SERVICE_BUCKETS_S.len());
        self.buckets[b].fetch_add(1, Ordering::Relaxed);
        self.service_sum_ns.fetch_add(ns, Ordering::Relaxed);
        self.service_count.fetch_add(1, Ordering::Relaxed);
        self.hist.lock().saturating_record(ns);
    }

    /// Pages moved by a successful READ_PAGES / WRITE_PAGES.
    pub fn pages(&self, read: u64, written: u64) {
        self.pages_read.fetch_add(read, Ordering::Relaxed);
        self.pages_written.fetch_add(written, Ordering::Relaxed);
    }

    /// A connection was refused because every connection slot was taken.
    pub fn refused_full(&self) {
        self.refused_full.fetch_add(1, Ordering::Relaxed);
    }

    /// An authenticated connection was refused at AUTH: its client id or tenant at its bound,
    /// or the free slots kept for other tenants' fair shares.
    pub fn refused_bound(&self) {
        self.refused_bound.fetch_add(1, Ordering::Relaxed);
    }

    /// An unauthenticated connection was closed to make room for a newer one.
    pub fn evicted_unauthenticated(&self) {
        self.evicted_unauthenticated.fetch_add(1, Ordering::Relaxed);
    }

    /// The reclaim plan now: bytes wanted back, slabs asked for, and slabs asked for longer
    /// than `reclaim::OVERDUE_AFTER`.
    pub fn set_reclaim(&self, wanted_bytes: u64, wanted_slabs: u64, overdue_slabs: u64) {
        self.reclaim_wanted_bytes
            .store(wanted_bytes, Ordering::Relaxed);
        self.reclaim_wanted_slabs
            .store(wanted_slabs, Ordering::Relaxed);
        self.reclaim_overdue_slabs
            .store(overdue_slabs, Ordering::Relaxed);
    }

    /// A client freed a slab the donor had asked for.
    pub fn slab_given_back(&self) {
        self.slabs_given_back.fetch_add(1, Ordering::Relaxed);
    }

    /// Connections refused for want of a slot, and unauthenticated ones evicted.
    pub fn refusals(&self) -> (u64, u64) {
        (
            self.refused_full.load(Ordering::Relaxed),
            self.evicted_unauthenticated.load(Ordering::Relaxed),
        )
    }

    /// A connection opened (`+1`) or closed (`-1`).
    pub fn connection(&self, opened: bool) {
        if opened {
            self.connections.fetch_add(1, Ordering::Relaxed);
            self.connections_total.fetch_add(1, Ordering::Relaxed);
        } else {
            self.connections.fetch_sub(1, Ordering::Relaxed);
        }
    }

    fn sum(a: &[AtomicU64]) -> u64 {
        a.iter().map(|x| x.load(Ordering::Relaxed)).sum()
    }

    /// The STATS answer.
    pub fn stats(&self, store: &SlabStore) -> DonorStats {
        let (p50, p99) = {
            let h = self.hist.lock();
            if h.is_empty() {
                (0, 0)
            } else {
                (h.value_at_quantile(0.5), h.value_at_quantile(0.99))
            }
        };
        DonorStats {
            capacity_bytes: store.capacity_bytes(),
            used_bytes: store.used_bytes(),
            committed_bytes: store.committed_bytes(),
            slab_size_bytes: store.slab_size_bytes(),
            slabs: store.slab_count() as u64,
            clients: store.connected_clients() as u64,
            requests_total: Self::sum(&self.requests),
            errors_total: Self::sum(&self.errors),
            pages_read_total: self.pages_read.load(Ordering::Relaxed),
            pages_written_total: self.pages_written.load(Ordering::Relaxed),
            bytes_in_total: Self::sum(&self.bytes_in),
            bytes_out_total: Self::sum(&self.bytes_out),
            service_p50_ns: p50,
            service_p99_ns: p99,
            uptime_ms: self.start.elapsed().as_millis() as u64,
            reclaim_wanted_bytes: self.reclaim_wanted_bytes.load(Ordering::Relaxed),
            slabs_given_back_total: self.slabs_given_back.load(Ordering::Relaxed),
        }
    }

    /// Renders every metric in the Prometheus text exposition format (version 0.0.4).
    pub fn render(&self, store: &SlabStore) -> String {
        let mut o = String::with_capacity(4096);
        let gauge = |o: &mut String, name: &str, help: &str, v: u64| {
            let _ = writeln!(o, "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {v}");
        };
        gauge(
            &mut o,
            "farmem_donor_capacity_bytes",
            "Lendable capacity in bytes.",
            store.capacity_bytes(),
        );
        gauge(
            &mut o,
            "farmem_donor_used_bytes",
            "Bytes in allocated slabs.",
            store.used_bytes(),
        );
        gauge(
            &mut o,
            "farmem_donor_committed_bytes",
            "Bytes of slab memory written and not yet returned to the OS.",
            store.committed_bytes(),
        );
        gauge(
            &mut o,
            "farmem_donor_slab_size_bytes",
            "Size of one slab in bytes.",
            store.slab_size_bytes(),
        );
        gauge(
            &mut o,
            "farmem_donor_slabs",
            "Allocated slabs.",
            store.slab_count() as u64,
        );
        gauge(
            &mut o,
            "farmem_donor_clients",
            "Client ids with at least one open connection.",
            store.connected_clients() as u64,
        );
        gauge(
            &mut o,
            "farmem_donor_connections",
            "Open connections.",
            self.connections.load(Ordering::Relaxed),
        );
        gauge(
            &mut o,
            "farmem_donor_reclaim_wanted_bytes",
            "Bytes the donor wants back: lent beyond its capacity plus the host's shortfall below --keep-free.",
            self.reclaim_wanted_bytes.load(Ordering::Relaxed),
        );
        gauge(
            &mut o,
            "farmem_donor_reclaim_wanted_slabs",
            "Slabs the donor is asking clients to give back.",
            self.reclaim_wanted_slabs.load(Ordering::Relaxed),
        );
        gauge(
            &mut o,
            "farmem_donor_reclaim_overdue_slabs",
            "Slabs asked for more than 30 s ago and not given back yet.",
            self.reclaim_overdue_slabs.load(Ordering::Relaxed),
        );
        let _ = writeln!(
            o,
            "# HELP farmem_donor_uptime_seconds Seconds since the donor started.\n# TYPE farmem_donor_uptime_seconds gauge\nfarmem_donor_uptime_seconds {:.3}",
            self.start.elapsed().as_secs_f64()
        );
        render_tenants(&mut o, store);
        let counter = |o: &mut String, name: &str, help: &str, v: u64| {
            let _ = writeln!(o, "# HELP {name} {help}\n# TYPE {name} counter\n{name} {v}");
        };
        counter(
            &mut o,
            "farmem_donor_connections_total",
            "Connections accepted.",
            self.connections_total.load(Ordering::Relaxed),
        );
        let _ = writeln!(
            o,
            "# HELP farmem_donor_connections_refused_total Connections closed unserved: every slot taken (full), a client id or tenant at its connection bound (bound), or unauthenticated and evicted for a newer one (evicted).\n# TYPE farmem_donor_connections_refused_total counter\nfarmem_donor_connections_refused_total{{reason=\"full\"}} {}\nfarmem_donor_connections_refused_total{{reason=\"bound\"}} {}\nfarmem_donor_connections_refused_total{{reason=\"evicted\"}} {}",
            self.refused_full.load(Ordering::Relaxed),
            self.refused_bound.load(Ordering::Relaxed),
            self.evicted_unauthenticated.load(Ordering::Relaxed),
        );
        counter(
            &mut o,
            "farmem_donor_slabs_given_back_total",
            "Slabs clients freed after the donor asked for them back.",
            self.slabs_given_back.load(Ordering::Relaxed),
        );
        counter(
            &mut o,
            "farmem_donor_pages_read_total",
            "Pages read.",
            self.pages_read.load(Ordering::Relaxed),
        );
        counter(
            &mut o,
            "farmem_donor_pages_written_total",
            "Pages written.",
            self.pages_written.load(Ordering::Relaxed),
        );
        for (name, help, arr) in [
            (
                "farmem_donor_requests_total",
                "Requests served, by type.",
                &self.requests,
            ),
            (
                "farmem_donor_bytes_in_total",
                "Request bytes received, by type.",
                &self.bytes_in,
            ),
            (
                "farmem_donor_bytes_out_total",
                "Response bytes sent, by type.",
                &self.bytes_out,
            ),
        ] {
            let _ = writeln!(o, "# HELP {name} {help}\n# TYPE {name} counter");
            for (i, v) in arr.iter().enumerate() {
                let _ = writeln!(
                    o,
                    "{name}{{type=\"{}\"}} {}",
                    type_name(i),
                    v.load(Ordering::Relaxed)
                );
            }
        }
        let _ = writeln!(
            o,
            "# HELP farmem_donor_errors_total Requests answered with an error status, by status.\n# TYPE farmem_donor_errors_total counter"
        );
        for s in Status::ALL.iter().skip(1) {
            let _ = writeln!(
                o,
                "farmem_donor_errors_total{{status=\"{}\"}} {}",
                s.name(),
                self.errors[s.code() as usize].load(Ordering::Relaxed)
            );
        }
        let _ = writeln!(
            o,
            "# HELP farmem_donor_service_seconds Time to serve one request.\n# TYPE farmem_donor_service_seconds histogram"
        );
        let mut cum = 0;
        for (i, le) in SERVICE_BUCKETS_S.iter().enumerate() {
            cum += self.buckets[i].load(Ordering::Relaxed);
            let _ = writeln!(
                o,
                "farmem_donor_service_seconds_bucket{{le=\"{le}\"}} {cum}"
            );
        }
        cum += self.buckets[SERVICE_BUCKETS_S.len()].load(Ordering::Relaxed);
        let _ = writeln!(
            o,
            "farmem_donor_service_seconds_bucket{{le=\"+Inf\"}} {cum}"
        );
        let _ = writeln!(
            o,
            "farmem_donor_service_seconds_sum {:.9}",
            self.service_sum_ns.load(Ordering::Relaxed) as f64 / 1e9
        );
        let _ = writeln!(o, "farmem_donor_service_seconds_count {cum}");
        o
    }
}

/// Serves the metrics endpoint until `stop` is set (the listener is shut down to wake it).
pub(crate) fn serve(
    listener: TcpListener,
    metrics: Arc<Metrics>,
    store: Arc<SlabStore>,
    stop: &AtomicBool,
) {
    for conn in listener.incoming() {
        if stop.load(Ordering::Acquire) {
            break;
        }
        match conn {
            Ok(s) => {
                if let Err(e) = answer(s, &metrics, &store) {
                    tracing::debug!("metrics request failed: {e}");
                }
            }
            Err(e) => {
                if stop.load(Ordering::Acquire) {
                    break;
                }
                tracing::warn!("metrics endpoint: accept failed: {e}");
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }
}

/// The longest a scraper may take to send its whole request.
pub const REQUEST_DEADLINE: Duration = Duration::from_secs(5);
/// The longest one write of the answer may block on a scraper that does not read.
const WRITE_TIMEOUT: Duration = Duration::from_secs(2);

fn answer(mut s: TcpStream, metrics: &Metrics, store: &SlabStore) -> std::io::Result<()> {
    s.set_write_timeout(Some(WRITE_TIMEOUT))?;
    let deadline = Instant::now() + REQUEST_DEADLINE;
    let mut buf = [0u8; 8192];
    let mut n = 0;
    // Read until the end of the request headers, within one deadline for the whole request (a
    // per-read timeout alone would let a scraper dribbling bytes hold the endpoint, and the
    // donor's shutdown, for hours).
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
    let body = metrics.render(store);
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

    #[test]
    fn render_has_every_family_and_cumulative_buckets() {
        let m = Metrics::new();
        let store = SlabStore::new(1 << 30, 64 << 20, None);
        m.record(
            Some(Opcode::ReadPages),
            Status::Ok,
            30,
            4118,
            Duration::from_micros(7),
        );
        m.record(
            None,
            Status::UnknownRequest,
            20,
            40,
            Duration::from_millis(3),
        );
        let text = m.render(&store);
        assert!(text.contains("farmem_donor_capacity_bytes 1073741824\n"));
        m.set_reclaim(3 << 20, 2, 1);
        m.slab_given_back();
        let text = m.render(&store);
        assert!(text.contains("farmem_donor_reclaim_wanted_bytes 3145728\n"));
        assert!(text.contains("farmem_donor_reclaim_wanted_slabs 2\n"));
        assert!(text.contains("farmem_donor_reclaim_overdue_slabs 1\n"));
        assert!(text.contains("farmem_donor_slabs_given_back_total 1\n"));
        let st = m.stats(&store);
        assert_eq!(
            (st.reclaim_wanted_bytes, st.slabs_given_back_total),
            (3 << 20, 1)
        );
        assert!(text.contains("farmem_donor_requests_total{type=\"read_pages\"} 1\n"));
        assert!(text.contains("farmem_donor_requests_total{type=\"unknown\"} 1\n"));
        assert!(text.contains("farmem_donor_errors_total{status=\"unknown_request\"} 1\n"));
        assert!(text.contains("farmem_donor_service_seconds_bucket{le=\"0.00001\"} 1\n"));
        assert!(text.contains("farmem_donor_service_seconds_bucket{le=\"+Inf\"} 2\n"));
        let st = m.stats(&store);
        assert_eq!((st.requests_total, st.errors_total), (2, 1));
        assert!(st.service_p50_ns >= 7_000 && st.service_p99_ns >= 3_000_000);
    }
}
