//! `farmem-bench fault`: the cost of one page fault, next to its baselines, in one run.
//!
//! Starts a donor in this process on 127.0.0.1:0 and measures (see [`crate::measure`]):
//! the userfaultfd floor (fault answered from memory, no network), the donor round trip for
//! one 4 KiB page, farmem's demand-fault latency for evicted pages fetched from the donor
//! (prefetching off), and the write-back pool hit latency. The target is
//! `miss_p50 <= 1.3 x (floor_p50 + rtt_p50)`.

use std::process::ExitCode;

use crate::measure::{fault_bench, FaultBenchConfig};
use anyhow::Context;
use clap::Args;
use farmem_donor::{DonorConfig, DonorServer};

/// Measure page-fault latency: userfaultfd floor, donor round trip, remote miss, pool hit.
#[derive(Args, Debug)]
pub struct BenchFaultArgs {
    /// Print exactly {"floor_p50_us", "rtt_p50_us", "miss_p50_us", "miss_p99_us",
    /// "pool_hit_p50_us"} as JSON.
    #[arg(long)]
    pub json: bool,
    /// Faults (or reads) measured per figure.
    #[arg(long, default_value_t = 2000, value_name = "N")]
    pub samples: usize,
}

/// Runs the benchmark and prints the figures.
pub fn run(args: BenchFaultArgs) -> anyhow::Result<ExitCode> {
    let donor = DonorServer::bind(DonorConfig {
        listen: "127.0.0.1:0".into(),
        capacity_bytes: 1 << 30,
        slab_size_bytes: 16 << 20,
        ..DonorConfig::default()
    })
    .context("starting the bench donor on 127.0.0.1")?
    .spawn();
    let r = fault_bench(&FaultBenchConfig {
        donor: donor.local_addr().to_string(),
        samples: args.samples,
    })
    .context("running the fault benchmark")?;
    if args.json {
        // Written by hand to keep exactly this key order.
        println!(
            "{{\"floor_p50_us\": {}, \"rtt_p50_us\": {}, \"miss_p50_us\": {}, \"miss_p99_us\": {}, \"pool_hit_p50_us\": {}}}",
            json_f64(r.floor_p50_us),
            json_f64(r.rtt_p50_us),
            json_f64(r.miss_p50_us),
            json_f64(r.miss_p99_us),
            json_f64(r.pool_hit_p50_us),
        );
        return Ok(ExitCode::SUCCESS);
    }
    let base = r.floor_p50_us + r.rtt_p50_us;
    println!("userfaultfd floor p50   {:8.1} us", r.floor_p50_us);
    println!("donor round trip p50    {:8.1} us", r.rtt_p50_us);
    println!(
        "remote miss p50 / p99   {:8.1} / {:.1} us  ({:.2} x (floor + rtt); target <= 1.30; {:.0}% served remotely)",
        r.miss_p50_us,
        r.miss_p99_us,
        r.miss_p50_us / base,
        r.miss_remote_fraction * 100.0
    );
    println!(
        "pool hit p50            {:8.1} us  ({:.2} x floor; {:.0}% served from the pool)",
        r.pool_hit_p50_us,
        r.pool_hit_p50_us / r.floor_p50_us,
        r.pool_hit_fraction * 100.0
    );
    Ok(ExitCode::SUCCESS)
}

/// A finite f64 as a JSON number (serde_json's formatting).
fn json_f64(v: f64) -> String {
    serde_json::Value::from(v).to_string()
}
