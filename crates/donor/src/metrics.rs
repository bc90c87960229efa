//! The donor's counters and service-time histograms, the STATS answer, and the Prometheus text
//! endpoint (`--metrics ADDR`).
//!
//! # Design
//! Counters are relaxed atomics updated on the data path (no lock). Service time goes to two
//! places: fixed Prometheus buckets (atomics) and an `hdrhistogram` behind a mutex (held for one
//! `record` call, nanoseconds) from which STATS computes p50/p99.
//!
//! The text is written with `farmem-metrics`' renderer and served by its endpoint (one scrape at
//! a time on its own thread, with a deadline and a head limit: see that crate), so a slow or
//! hostile scraper never delays the data path.
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use farmem_metrics::{Exposition, Kind};
use farmem_proto::{DonorStats, Opcode, Status};
use hdrhistogram::Histogram;
use parking_lot::Mutex;

use crate::store::{SlabStore, TenantUse};

/// Each tenant's use, quota and clients, one sample per tenant (label `tenant`).
fn render_tenants(e: &mut Exposition, store: &SlabStore) {
    let tenants = store.tenant_use();
    let mut family = |name: &str, help: &str, v: &dyn Fn(&TenantUse) -> Option<u64>| {
        let samples = tenants.iter().filter_map(|t| Some((&t.name, v(t)?)));
        e.by_label(name, Kind::Gauge, help, "tenant", samples);
    };
    family(
        "farmem_donor_tenant_used_bytes",
        "Bytes in the slabs a tenant's clients hold.",
        &|t| Some(t.used_bytes),
    );
    family(
        "farmem_donor_tenant_quota_bytes",
        "A tenant's quota in bytes (tenants with one only).",
        &|t| t.quota_bytes,
    );
    family(
        "farmem_donor_tenant_clients",
        "A tenant's clients, connected or waiting out the orphan grace.",
        &|t| Some(t.clients),
    );
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
        let mut e = Exposition::new("donor");
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        for (name, help, v) in [
            ("farmem_donor_capacity_bytes", "Lendable capacity in bytes.", store.capacity_bytes()),
            ("farmem_donor_used_bytes", "Bytes in allocated slabs.", store.used_bytes()),
            (
                "farmem_donor_committed_bytes",
                "Bytes of slab memory written and not yet returned to the OS.",
                store.committed_bytes(),
            ),
            ("farmem_donor_slab_size_bytes", "Size of one slab in bytes.", store.slab_size_bytes()),
            ("farmem_donor_slabs", "Allocated slabs.", store.slab_count() as u64),
            (
                "farmem_donor_clients",
                "Client ids with at least one open connection.",
                store.connected_clients() as u64,
            ),
            ("farmem_donor_connections", "Open connections.", load(&self.connections)),
            (
                "farmem_donor_reclaim_wanted_bytes",
                "Bytes the donor wants back: lent beyond its capacity plus the host's shortfall below --keep-free.",
                load(&self.reclaim_wanted_bytes),
            ),
            (
                "farmem_donor_reclaim_wanted_slabs",
                "Slabs the donor is asking clients to give back.",
                load(&self.reclaim_wanted_slabs),
            ),
            (
                "farmem_donor_reclaim_overdue_slabs",
                "Slabs asked for more than 30 s ago and not given back yet.",
                load(&self.reclaim_overdue_slabs),
            ),
        ] {
            e.single(name, Kind::Gauge, help, v);
        }
        e.single(
            "farmem_donor_uptime_seconds",
            Kind::Gauge,
            "Seconds since the donor started.",
            format_args!("{:.3}", self.start.elapsed().as_secs_f64()),
        );
        render_tenants(&mut e, store);
        e.single(
            "farmem_donor_connections_total",
            Kind::Counter,
            "Connections accepted.",
            load(&self.connections_total),
        );
        e.by_label(
            "farmem_donor_connections_refused_total",
            Kind::Counter,
            "Connections closed unserved: every slot taken (full), a client id or tenant at its connection bound (bound), or unauthenticated and evicted for a newer one (evicted).",
            "reason",
            [
                ("full", load(&self.refused_full)),
                ("bound", load(&self.refused_bound)),
                ("evicted", load(&self.evicted_unauthenticated)),
            ],
        );
        for (name, help, v) in [
            (
                "farmem_donor_slabs_given_back_total",
                "Slabs clients freed after the donor asked for them back.",
                &self.slabs_given_back,
            ),
            (
                "farmem_donor_pages_read_total",
                "Pages read.",
                &self.pages_read,
            ),
            (
                "farmem_donor_pages_written_total",
                "Pages written.",
                &self.pages_written,
            ),
        ] {
            e.single(name, Kind::Counter, help, load(v));
        }
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
            let samples = arr.iter().enumerate().map(|(i, v)| (type_name(i), load(v)));
            e.by_label(name, Kind::Counter, help, "type", samples);
        }
        e.by_label(
            "farmem_donor_errors_total",
            Kind::Counter,
            "Requests answered with an error status, by status.",
            "status",
            Status::ALL
                .iter()
                .skip(1)
                .map(|s| (s.name(), load(&self.errors[s.code() as usize]))),
        );
        let buckets: Vec<u64> = self.buckets.iter().map(load).collect();
        e.histogram(
            "farmem_donor_service_seconds",
            "Time to serve one request.",
            &SERVICE_BUCKETS_S,
            &buckets,
            format_args!("{:.9}", load(&self.service_sum_ns) as f64 / 1e9),
        );
        e.finish()
    }
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
