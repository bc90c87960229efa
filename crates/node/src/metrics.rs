//! The node's figures: the [`NodeStats`] struct STATS returns (JSON) and `farmem stats --node`
//! prints, the counters behind it, and its Prometheus text (`--metrics ADDR`).
//!
//! # Design
//! The server builds one [`NodeStats`] snapshot under its state lock; both the STATS reply and
//! the Prometheus text are rendered from that snapshot, so the two never disagree. Counters
//! that are not state (reclaims, refusals) are relaxed atomics in [`Counters`].
//!
//! The text is written with `farmem-metrics`' renderer and served by its endpoint (one scrape at
//! a time on its own thread, with a deadline and a head limit: see that crate), so a slow
//! scraper never delays a client of the node.
use std::sync::atomic::{AtomicU64, Ordering};

use farmem_metrics::{Exposition, Kind};
use serde::{Deserialize, Serialize};

use crate::wire::ErrorCode;

/// One client of the node, as STATS reports it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClientStats {
    /// The client's process id (from SO_PEERCRED, in the node's pid namespace).
    pub pid: u32,
    /// Its user id.
    pub uid: u32,
    /// Its group id.
    pub gid: u32,
    /// Slabs it holds.
    pub slabs: u64,
    /// Bytes in those slabs.
    pub bytes: u64,
    /// Slabs it was asked to give back and has not yet.
    pub reclaim_outstanding: u64,
}

/// Requests the node refused since it started, by reason.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Refusals {
    /// ALLOC refused: capacity used up.
    pub full: u64,
    /// ALLOC refused: the host is short of memory.
    pub pressure: u64,
    /// FREE of a slab the client does not hold.
    pub not_yours: u64,
    /// Malformed or impossible requests (garbage frames included).
    pub bad_request: u64,
    /// RESIZE from a uid that may not.
    pub denied: u64,
    /// Connections refused because the node served as many clients as it may.
    pub too_many_clients: u64,
    /// Connections with another protocol version.
    pub version: u64,
    /// The node failed to make a slab.
    pub internal: u64,
    /// ALLOC refused: the user holds its share ([`crate::share`]); absent from older nodes.
    #[serde(default)]
    pub share_used: u64,
}

impl Refusals {
    /// Each count with its reason (snake_case, the metrics' `reason` label), in a fixed order.
    pub fn by_reason(&self) -> [(&'static str, u64); 9] {
        [
            ("full", self.full),
            ("pressure", self.pressure),
            ("not_yours", self.not_yours),
            ("bad_request", self.bad_request),
            ("denied", self.denied),
            ("too_many_clients", self.too_many_clients),
            ("version", self.version),
            ("internal", self.internal),
            ("share_used", self.share_used),
        ]
    }
}

/// The node's figures (the STATS answer, JSON on the wire).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeStats {
    /// The node's process id.
    pub node_pid: u32,
    /// Bytes the node may lend.
    pub capacity_bytes: u64,
    /// Bytes in slabs held by clients, kept for holds, or being freed.
    pub used_bytes: u64,
    /// Size of one slab.
    pub slab_bytes: u64,
    /// Slabs lent: held by clients, or kept for holds.
    pub slabs: u64,
    /// Live holds (see [`crate::hold`]); absent in the JSON of older nodes.
    #[serde(default)]
    pub holds: u64,
    /// Slabs a live hold names (still a client's or kept).
    #[serde(default)]
    pub held_slabs: u64,
    /// Slabs no client holds any more (freed, or their client went away), kept — and counted in
    /// `used_bytes` — until the last live hold naming them dies.
    #[serde(default)]
    pub kept_slabs: u64,
    /// The `--keep-free` watermark, if any.
    pub keep_free_bytes: Option<u64>,
    /// The host's MemAvailable at the last check, if read.
    pub mem_available_bytes: Option<u64>,
    /// True while MemAvailable is below the watermark (new slabs refused).
    pub under_pressure: bool,
    /// Connected clients, largest users first.
    pub clients: Vec<ClientStats>,
    /// RECLAIM frames sent.
    pub reclaim_requests_total: u64,
    /// Slabs given back by clients that had been asked to.
    pub reclaimed_slabs_total: u64,
    /// Refused requests by reason.
    pub refusals: Refusals,
    /// Milliseconds since the node started.
    pub uptime_ms: u64,
}

/// Counters the server bumps as things happen.
#[derive(Debug, Default)]
pub struct Counters {
    reclaim_requests: AtomicU64,
    reclaimed_slabs: AtomicU64,
    refusals: [AtomicU64; ErrorCode::ALL.len()],
}

impl Counters {
    /// One RECLAIM frame sent.
    pub fn reclaim_requested(&self) {
        self.reclaim_requests.fetch_add(1, Ordering::Relaxed);
    }

    /// A slab given back by a client that was asked to.
    pub fn slab_reclaimed(&self) {
        self.reclaimed_slabs.fetch_add(1, Ordering::Relaxed);
    }

    /// A request or connection refused with `code`.
    pub fn refused(&self, code: ErrorCode) {
        if let Some(i) = ErrorCode::ALL.iter().position(|c| *c == code) {
            self.refusals[i].fetch_add(1, Ordering::Relaxed);
        }
    }

    fn refusals_of(&self, code: ErrorCode) -> u64 {
        ErrorCode::ALL
            .iter()
            .position(|c| *c == code)
            .map_or(0, |i| self.refusals[i].load(Ordering::Relaxed))
    }

    /// Fills the counter fields of `stats`.
    pub fn fill(&self, stats: &mut NodeStats) {
        stats.reclaim_requests_total = self.reclaim_requests.load(Ordering::Relaxed);
        stats.reclaimed_slabs_total = self.reclaimed_slabs.load(Ordering::Relaxed);
        stats.refusals = Refusals {
            full: self.refusals_of(ErrorCode::Full),
            pressure: self.refusals_of(ErrorCode::Pressure),
            not_yours: self.refusals_of(ErrorCode::NotYours),
            bad_request: self.refusals_of(ErrorCode::BadRequest),
            denied: self.refusals_of(ErrorCode::Denied),
            too_many_clients: self.refusals_of(ErrorCode::TooManyClients),
            version: self.refusals_of(ErrorCode::Version),
            internal: self.refusals_of(ErrorCode::Internal),
            share_used: self.refusals_of(ErrorCode::ShareUsed),
        };
    }
}

/// `stats` in the Prometheus text exposition format (version 0.0.4).
pub fn render_prometheus(stats: &NodeStats) -> String {
    let mut e = Exposition::new("node");
    let single: [(&str, &str, u64); 8] = [
        (
            "farmem_node_capacity_bytes",
            "Bytes the node may lend.",
            stats.capacity_bytes,
        ),
        (
            "farmem_node_used_bytes",
            "Bytes in slabs held by clients or kept for holds.",
            stats.used_bytes,
        ),
        (
            "farmem_node_slab_bytes",
            "Size of one slab in bytes.",
            stats.slab_bytes,
        ),
        (
            "farmem_node_clients",
            "Connected clients.",
            stats.clients.len() as u64,
        ),
        (
            "farmem_node_under_pressure",
            "1 while the host's MemAvailable is below --keep-free (new slabs refused).",
            u64::from(stats.under_pressure),
        ),
        (
            "farmem_node_holds",
            "Live holds (slabs a forked child may still read).",
            stats.holds,
        ),
        (
            "farmem_node_held_slabs",
            "Slabs named by a live hold.",
            stats.held_slabs,
        ),
        (
            "farmem_node_kept_slabs",
            "Slabs no client holds, kept (and counted in used bytes) until their holds die.",
            stats.kept_slabs,
        ),
    ];
    for (name, help, v) in single {
        e.single(name, Kind::Gauge, help, v);
    }
    let slabs = "farmem_node_slabs";
    e.family(slabs, Kind::Gauge, "Slabs held, by client.");
    for c in &stats.clients {
        let (pid, uid) = (c.pid.to_string(), c.uid.to_string());
        e.sample(slabs, &[("pid", &pid), ("uid", &uid)], c.slabs);
    }
    for (name, help, v) in [
        (
            "farmem_node_reclaim_requests_total",
            "RECLAIM requests sent to clients.",
            stats.reclaim_requests_total,
        ),
        (
            "farmem_node_reclaimed_slabs_total",
            "Slabs given back by clients asked to reclaim.",
            stats.reclaimed_slabs_total,
        ),
    ] {
        e.single(name, Kind::Counter, help, v);
    }
    e.by_label(
        "farmem_node_refusals_total",
        Kind::Counter,
        "Requests and connections refused, by reason.",
        "reason",
        stats.refusals.by_reason(),
    );
    e.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> NodeStats {
        let c = Counters::default();
        c.reclaim_requested();
        c.slab_reclaimed();
        c.slab_reclaimed();
        c.refused(ErrorCode::Full);
        let mut s = NodeStats {
            capacity_bytes: 1 << 30,
            used_bytes: 8 << 20,
            slab_bytes: 4 << 20,
            slabs: 2,
            holds: 3,
            held_slabs: 2,
            kept_slabs: 1,
            clients: vec![ClientStats {
                pid: 42,
                uid: 1000,
                gid: 1000,
                slabs: 2,
                bytes: 8 << 20,
                reclaim_outstanding: 0,
            }],
            ..NodeStats::default()
        };
        c.fill(&mut s);
        s
    }

    #[test]
    fn the_prometheus_text_has_every_family() {
        let t = render_prometheus(&sample());
        for line in [
            "farmem_node_capacity_bytes 1073741824\n",
            "farmem_node_used_bytes 8388608\n",
            "farmem_node_clients 1\n",
            "farmem_node_holds 3\n",
            "farmem_node_held_slabs 2\n",
            "farmem_node_kept_slabs 1\n",
            "farmem_node_slabs{pid=\"42\",uid=\"1000\"} 2\n",
            "farmem_node_reclaim_requests_total 1\n",
            "farmem_node_reclaimed_slabs_total 2\n",
            "farmem_node_refusals_total{reason=\"full\"} 1\n",
            "farmem_node_refusals_total{reason=\"pressure\"} 0\n",
            "# TYPE farmem_node_refusals_total counter\n",
        ] {
            assert!(t.contains(line), "{line:?} missing from\n{t}");
        }
    }

    #[test]
    fn stats_survive_json() {
        let s = sample();
        let j = serde_json::to_string(&s).unwrap();
        assert_eq!(serde_json::from_str::<NodeStats>(&j).unwrap(), s);
    }
}
