//! `farmem-bench fault`: the cost of one page fault, next to its baselines, in one run.
//!
//! Starts a donor in this process on 127.0.0.1:0 and a `farmem node` on a socket in a private
//! temporary directory, and measures (see [`crate::measure`]): the userfaultfd floor (fault
//! answered from memory, no network), the donor round trip for one 4 KiB page, farmem's
//! demand-fault latency for evicted pages fetched from the donor (prefetching off, no host
//! tier), the same for evicted pages in the host tier (the node's shared memory, no donor), and
//! the write-back pool hit latency; and, unless `--local-only`, the round trip and the miss
//! again with the donor on another "machine" (a `farmem donor` in a network namespace of its
//! own behind a veth link, with a token, so pages are sealed: needs root). The targets are
//! `miss_p50 <= 1.3 x (floor_p50 + rtt_p50)`, the same over the link, and
//! `host_miss_p50 <= 1.3 x floor_p50`.

use std::process::ExitCode;

use crate::measure::{fault_bench, host_tier_capacity_bytes, FaultBenchConfig, FaultBenchReport};
use anyhow::Context;
use clap::Args;
use farmem_donor::{DonorConfig, DonorServer};
use farmem_node::{NodeConfig, NodeServer};

/// Slab size of the bench donor and the bench node (the same, so both place alike).
const SLAB_BYTES: u64 = 16 << 20;

/// Measure page-fault latency: userfaultfd floor, donor round trip, remote miss, host tier
/// miss, pool hit, and the round trip and miss over a link to a donor on another host.
#[derive(Args, Debug)]
pub struct BenchFaultArgs {
    /// Print exactly {"floor_p50_us", "rtt_p50_us", "miss_p50_us", "miss_p99_us",
    /// "host_miss_p50_us", "host_miss_p99_us", "pool_hit_p50_us", "remote_rtt_p50_us",
    /// "remote_miss_p50_us", "remote_miss_p99_us"} as JSON (the last three null with
    /// --local-only).
    #[arg(long)]
    pub json: bool,
    /// Skip the figures over a link (they need root: the donor runs in a network namespace
    /// of its own).
    #[arg(long)]
    pub local_only: bool,
    /// Faults (or reads) measured per figure.
    #[arg(long, default_value_t = 2000, value_name = "N")]
    pub samples: usize,
}

/// Runs the benchmark and prints the figures.
pub fn run(args: BenchFaultArgs) -> anyhow::Result<ExitCode> {
    let donor = DonorServer::bind(DonorConfig {
        listen: "127.0.0.1:0".into(),
        capacity_bytes: 1 << 30,
        slab_size_bytes: SLAB_BYTES,
        ..DonorConfig::default()
    })
    .context("starting the bench donor on 127.0.0.1")?
    .spawn();
    let node_dir = tempfile::Builder::new()
        .prefix("farmem-bench-node-")
        .tempdir()
        .context("creating a directory for the bench node's socket")?;
    let node = NodeServer::bind(NodeConfig {
        socket_path: node_dir.path().join("node.sock"),
        capacity_bytes: host_tier_capacity_bytes(args.samples, SLAB_BYTES),
        slab_bytes: SLAB_BYTES,
        ..NodeConfig::default()
    })
    .context("starting the bench node (the host tier)")?
    .spawn();
    // Dropped at the end: the donor is killed and its namespace deleted.
    let host_donor = if args.local_only {
        None
    } else {
        let capacity = host_tier_capacity_bytes(args.samples, SLAB_BYTES).to_string();
        let slab = SLAB_BYTES.to_string();
        let args = ["--capacity", &capacity, "--slab-size", &slab];
        let d = crate::netns::bench_token()
            .and_then(|token| crate::netns::host_donor(&args, token))
            .map_err(|e| anyhow::anyhow!("{e} (or give --local-only)"))?;
        Some(d)
    };
    let r = fault_bench(&FaultBenchConfig {
        donor: donor.local_addr().to_string(),
        node: node.socket_path().to_path_buf(),
        samples: args.samples,
        remote: host_donor
            .as_ref()
            .map(|d| (d.addr().to_string(), d.token().to_vec())),
    })
    .context("running the fault benchmark")?;
    if args.json {
        println!("{}", json(&r));
    } else {
        print!("{}", human(&r));
    }
    Ok(ExitCode::SUCCESS)
}

/// The `--json` line. Written by hand to keep exactly this key order.
fn json(r: &FaultBenchReport) -> String {
    format!(
        "{{\"floor_p50_us\": {}, \"rtt_p50_us\": {}, \"miss_p50_us\": {}, \"miss_p99_us\": {}, \"host_miss_p50_us\": {}, \"host_miss_p99_us\": {}, \"pool_hit_p50_us\": {}, \"remote_rtt_p50_us\": {}, \"remote_miss_p50_us\": {}, \"remote_miss_p99_us\": {}}}",
        json_f64(r.floor_p50_us),
        json_f64(r.rtt_p50_us),
        json_f64(r.miss_p50_us),
        json_f64(r.miss_p99_us),
        json_f64(r.host_miss_p50_us),
        json_f64(r.host_miss_p99_us),
        json_f64(r.pool_hit_p50_us),
        json_opt(r.remote_rtt_p50_us),
        json_opt(r.remote_miss_p50_us),
        json_opt(r.remote_miss_p99_us),
    )
}

/// The human-readable figures, each with its ratio to its baseline and target.
fn human(r: &FaultBenchReport) -> String {
    let base = r.floor_p50_us + r.rtt_p50_us;
    let mut out = String::new();
    out += &format!("userfaultfd floor p50   {:8.1} us\n", r.floor_p50_us);
    out += &format!("donor round trip p50    {:8.1} us\n", r.rtt_p50_us);
    out += &format!(
        "remote miss p50 / p99   {:8.1} / {:.1} us  ({:.2} x (floor + rtt); target <= 1.30; {:.0}% served remotely)\n",
        r.miss_p50_us,
        r.miss_p99_us,
        r.miss_p50_us / base,
        r.miss_remote_fraction * 100.0
    );
    out += &format!(
        "host miss p50 / p99     {:8.1} / {:.1} us  ({:.2} x floor; target <= 1.30; {:.0}% served from the host tier)\n",
        r.host_miss_p50_us,
        r.host_miss_p99_us,
        r.host_miss_p50_us / r.floor_p50_us,
        r.host_miss_tier_fraction * 100.0
    );
    out += &format!(
        "pool hit p50            {:8.1} us  ({:.2} x floor; {:.0}% served from the pool)\n",
        r.pool_hit_p50_us,
        r.pool_hit_p50_us / r.floor_p50_us,
        r.pool_hit_fraction * 100.0
    );
    if let (Some(rtt), Some(p50), Some(p99), Some(served)) = (
        r.remote_rtt_p50_us,
        r.remote_miss_p50_us,
        r.remote_miss_p99_us,
        r.remote_miss_fraction,
    ) {
        out += &format!("link round trip p50     {rtt:8.1} us  (a donor on another host, token)\n");
        out += &format!(
            "link miss p50 / p99     {:8.1} / {:.1} us  ({:.2} x (floor + link rtt); target <= 1.30; sealed; {:.0}% served remotely)\n",
            p50,
            p99,
            p50 / (r.floor_p50_us + rtt),
            served * 100.0
        );
    }
    out
}

/// A finite f64 as a JSON number (serde_json's formatting).
fn json_f64(v: f64) -> String {
    serde_json::Value::from(v).to_string()
}

/// A figure that may be missing: its number, or null.
fn json_opt(v: Option<f64>) -> String {
    v.map_or_else(|| "null".to_string(), json_f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report() -> FaultBenchReport {
        FaultBenchReport {
            floor_p50_us: 9.0,
            rtt_p50_us: 18.0,
            miss_p50_us: 32.4,
            miss_p99_us: 370.0,
            host_miss_p50_us: 10.8,
            host_miss_p99_us: 41.5,
            pool_hit_p50_us: 12.6,
            remote_rtt_p50_us: Some(40.0),
            remote_miss_p50_us: Some(63.7),
            remote_miss_p99_us: Some(400.0),
            remote_miss_fraction: Some(1.0),
            miss_remote_fraction: 1.0,
            host_miss_tier_fraction: 1.0,
            pool_hit_fraction: 1.0,
        }
    }

    #[test]
    fn json_has_exactly_the_documented_keys_in_order() {
        let line = json(&report());
        let v: serde_json::Value = serde_json::from_str(&line).unwrap();
        let obj = v.as_object().unwrap();
        assert_eq!(obj.len(), 10, "{line}");
        assert_eq!(obj["remote_miss_p50_us"], 63.7);
        assert_eq!(obj["host_miss_p50_us"], 10.8);
        assert_eq!(obj["host_miss_p99_us"], 41.5);
        assert_eq!(obj["miss_p50_us"], 32.4);
        // serde_json's map may sort keys: check the order on the text itself.
        let keys = [
            "floor_p50_us",
            "rtt_p50_us",
            "miss_p50_us",
            "miss_p99_us",
            "host_miss_p50_us",
            "host_miss_p99_us",
            "pool_hit_p50_us",
            "remote_rtt_p50_us",
            "remote_miss_p50_us",
            "remote_miss_p99_us",
        ];
        let at: Vec<usize> = keys
            .iter()
            .map(|k| line.find(&format!("\"{k}\"")).unwrap())
            .collect();
        assert!(at.windows(2).all(|w| w[0] < w[1]), "{line}");
    }

    #[test]
    fn human_output_gives_the_host_miss_as_a_ratio_to_the_floor() {
        let text = human(&report());
        let line = text
            .lines()
            .find(|l| l.starts_with("host miss p50 / p99"))
            .unwrap();
        assert!(line.contains("10.8 / 41.5 us"), "{line}");
        assert!(line.contains("(1.20 x floor; target <= 1.30"), "{line}");
        assert!(line.contains("100% served from the host tier"), "{line}");
        let miss = text.lines().find(|l| l.starts_with("remote miss")).unwrap();
        assert!(miss.contains("1.20 x (floor + rtt)"), "{miss}");
        let link = text.lines().find(|l| l.starts_with("link miss")).unwrap();
        assert!(link.contains("1.30 x (floor + link rtt)"), "{link}");
    }

    #[test]
    fn without_a_link_the_remote_figures_are_null_and_unprinted() {
        let r = FaultBenchReport {
            remote_rtt_p50_us: None,
            remote_miss_p50_us: None,
            remote_miss_p99_us: None,
            remote_miss_fraction: None,
            ..report()
        };
        let v: serde_json::Value = serde_json::from_str(&json(&r)).unwrap();
        assert!(v["remote_miss_p50_us"].is_null() && v["remote_rtt_p50_us"].is_null());
        assert!(!human(&r).contains("link"));
    }

    #[test]
    fn the_node_lends_every_page_of_the_host_miss_rig() {
        // 2000 samples: 2000 + 1024 + 16 pages = 11.9 MiB, one 16 MiB slab, two to spare.
        assert_eq!(host_tier_capacity_bytes(2000, SLAB_BYTES), 3 * SLAB_BYTES);
        let cap = host_tier_capacity_bytes(100_000, 1 << 20);
        assert!(cap >= (100_000 + 1024 + 16) * 4096, "{cap}");
        assert_eq!(cap % (1 << 20), 0);
    }
}
