//! `farmem-bench prefetch`: what prefetching buys on scans, and which way of making prefetched
//! pages local is faster, all measured in one run against prefetching off.
//!
//! Starts a donor in this process on 127.0.0.1:0. For each access pattern (`seq`, `stride:10`)
//! and each configuration — prefetch `none` (the baseline), `leap` with the `buffer` install
//! mode (prefetched pages wait in the write-back pool; the first touch is a local fault) and
//! `leap` with the `marker` install mode (pages installed at once but the first of each
//! window) — it starts a runtime with a budget of half the region, writes the whole region
//! (so half of it is evicted to the donor), waits for write-back to settle, and times one scan
//! that reads one byte of every page in the pattern's order. Rounds are interleaved
//! (none, buffer, marker, none, …) and the median of the rounds is reported, with the ratio of
//! each configuration's scan time to `none`'s for the same pattern.

use std::process::ExitCode;
use std::time::Duration;

use crate::measure::scan_once;
use anyhow::Context;
use clap::Args;
use farmem_donor::{DonorConfig, DonorServer};
use farmem_runtime::{PrefetchInstall, RuntimeConfig, Stats, TierMode};
use serde::Serialize;

const PAGE: usize = farmem_runtime::PAGE_SIZE;

/// Measure prefetching on sequential and stride-10 scans: none vs buffer vs marker install.
#[derive(Args, Debug)]
pub struct BenchPrefetchArgs {
    /// Print a JSON list of rows (pattern, prefetch, install, pages, budget_pages, scan_ms,
    /// us_per_access, ratio_to_none, faults_remote, faults_pool_hit, prefetched,
    /// prefetch_hits, accuracy, coverage).
    #[arg(long)]
    pub json: bool,
    /// Region size: pages scanned per run (the budget is half of it).
    #[arg(long, default_value_t = 16384, value_name = "N")]
    pub pages: usize,
    /// Rounds per configuration (the median is reported).
    #[arg(long, default_value_t = 3, value_name = "N")]
    pub rounds: usize,
    /// Emulated extra link latency per donor request, µs.
    #[arg(long, default_value_t = 0, value_name = "US")]
    pub link_delay_us: u64,
}

/// One row of the report.
#[derive(Debug, Clone, Serialize)]
struct Row {
    pattern: &'static str,
    prefetch: &'static str,
    install: &'static str,
    pages: usize,
    budget_pages: u64,
    scan_ms: f64,
    us_per_access: f64,
    ratio_to_none: f64,
    faults_remote: u64,
    faults_pool_hit: u64,
    prefetched: u64,
    prefetch_hits: u64,
    accuracy: f64,
    coverage: f64,
}

const CONFIGS: [(&str, &str, PrefetchInstall); 3] = [
    ("none", "-", PrefetchInstall::Buffer),
    ("leap", "buffer", PrefetchInstall::Buffer),
    ("leap", "marker", PrefetchInstall::Marker),
];

fn order(pattern: &str, pages: usize) -> Vec<usize> {
    match pattern {
        "seq" => (0..pages).collect(),
        _ => (0..10).flat_map(|s| (s..pages).step_by(10)).collect(),
    }
}

/// One run: the scan time and the counters around it.
fn one(
    donor: &str,
    args: &BenchPrefetchArgs,
    prefetch: &str,
    install: PrefetchInstall,
    idx: &[usize],
) -> anyhow::Result<(Duration, Stats, Stats)> {
    let r = scan_once(
        RuntimeConfig {
            budget_bytes: (args.pages / 2 * PAGE) as u64,
            donors: vec![donor.to_string()],
            // The donor only: pages in a host tier (a node on this machine) are not prefetched.
            tier: TierMode::Off,
            prefetch: prefetch.into(),
            prefetch_install: install,
            link_delay_us: args.link_delay_us,
            ..RuntimeConfig::default()
        },
        args.pages,
        idx,
    )?;
    Ok((r.took, r.before, r.after))
}

/// Runs the benchmark and prints the figures.
pub fn run(args: BenchPrefetchArgs) -> anyhow::Result<ExitCode> {
    anyhow::ensure!(
        args.pages >= 256,
        "--pages {} is too small: give at least 256",
        args.pages
    );
    anyhow::ensure!(args.rounds >= 1, "--rounds must be at least 1");
    let donor = DonorServer::bind(DonorConfig {
        listen: "127.0.0.1:0".into(),
        // Every run places its own slabs (returned only after the donor's orphan grace).
        capacity_bytes: (args.pages * PAGE) as u64 * (2 * CONFIGS.len() * args.rounds) as u64
            + (64 << 20),
        slab_size_bytes: 4 << 20,
        ..DonorConfig::default()
    })
    .context("starting the bench donor on 127.0.0.1")?
    .spawn();
    let addr = donor.local_addr().to_string();
    let mut rows = Vec::new();
    for pattern in ["seq", "stride:10"] {
        let idx = order(pattern, args.pages);
        let mut runs: Vec<Vec<(Duration, Stats, Stats)>> = vec![Vec::new(); CONFIGS.len()];
        for _ in 0..args.rounds {
            for (c, (prefetch, _, install)) in CONFIGS.iter().enumerate() {
                runs[c].push(
                    one(&addr, &args, prefetch, *install, &idx)
                        .with_context(|| format!("{pattern} with prefetch {prefetch}"))?,
                );
            }
        }
        let mut medians = Vec::new();
        for r in &mut runs {
            r.sort_by_key(|x| x.0);
            medians.push(r[r.len() / 2].clone());
        }
        let none = medians[0].0.as_secs_f64();
        for (c, (took, b, a)) in medians.into_iter().enumerate() {
            let (prefetch, install, _) = CONFIGS[c];
            let hits = a.prefetch_hits - b.prefetch_hits;
            let prefetched = a.prefetched_pages - b.prefetched_pages;
            let demand = a.prefetch_demand_faults - b.prefetch_demand_faults;
            let ratio = |x: u64, y: u64| if y == 0 { 0.0 } else { x as f64 / y as f64 };
            rows.push(Row {
                pattern,
                prefetch,
                install,
                pages: args.pages,
                budget_pages: a.budget_pages,
                scan_ms: took.as_secs_f64() * 1e3,
                us_per_access: took.as_secs_f64() * 1e6 / idx.len() as f64,
                ratio_to_none: took.as_secs_f64() / none,
                faults_remote: a.faults_remote - b.faults_remote,
                faults_pool_hit: a.faults_pool_hit - b.faults_pool_hit,
                prefetched,
                prefetch_hits: hits,
                accuracy: ratio(hits, prefetched),
                coverage: ratio(hits, hits + demand),
            });
        }
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&rows)?);
        return Ok(ExitCode::SUCCESS);
    }
    println!(
        "{:<10} {:<5} {:<7} {:>9} {:>8} {:>7} {:>8} {:>7} {:>10} {:>6} {:>8} {:>8}",
        "pattern",
        "pf",
        "install",
        "scan_ms",
        "us/acc",
        "x none",
        "remote",
        "pool",
        "prefetched",
        "hits",
        "accuracy",
        "coverage"
    );
    for r in &rows {
        println!(
            "{:<10} {:<5} {:<7} {:>9.1} {:>8.2} {:>7.2} {:>8} {:>7} {:>10} {:>6} {:>8.3} {:>8.3}",
            r.pattern,
            r.prefetch,
            r.install,
            r.scan_ms,
            r.us_per_access,
            r.ratio_to_none,
            r.faults_remote,
            r.faults_pool_hit,
            r.prefetched,
            r.prefetch_hits,
            r.accuracy,
            r.coverage
        );
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_visit_every_page_once() {
        for pattern in ["seq", "stride:10"] {
            let mut o = order(pattern, 1000);
            assert_eq!(o.len(), 1000);
            o.sort_unstable();
            assert_eq!(o, (0..1000).collect::<Vec<_>>(), "{pattern}");
        }
        assert_eq!(&order("stride:10", 25)[..4], &[0, 10, 20, 1]);
    }
}
