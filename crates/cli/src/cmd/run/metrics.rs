//! `farmem run --metrics ADDR`: the program tree's paging counters in Prometheus form while it
//! runs.
//!
//! # Design
//! The endpoint lives in `farmem run`, not in the program: every process of the tree already
//! rewrites its stats file about once a second (see `run_tree`), and the budget coordinator
//! knows each process's local pages at its last report, so a scrape reads those and adds them
//! up. Nothing runs inside the program for it, a scraper can never slow the program's faults,
//! and a process that forks or exits needs no endpoint of its own.
//!
//! Counters (`_total`) add up every process that ever wrote a file, exited ones included (their
//! last file stays), so they only go up; gauges (what is resident, pooled, held on a donor)
//! count only the processes still running. Figures are at most about a second old.
//!
//! # Limitations
//! A pid reused within one run (a tree that starts more processes than the pid space) replaces
//! the earlier process's file, and its counts leave the totals.
use std::net::TcpListener;
use std::path::PathBuf;

use anyhow::Context;
use farmem_contract::{DonorUse, Stats, StatsFile};
use farmem_metrics::{Exposition, Kind, MetricsEndpoint};
use farmem_runtime::PAGE_SIZE;
use farmem_tree::{CoordinatorView, TreeSnapshot};

use crate::cmd::run_tree;

/// Binds `--metrics ADDR` before the program starts, so an address in use fails the run at
/// once with a message rather than after the program has done work.
pub(super) fn bind(addr: &str) -> anyhow::Result<TcpListener> {
    TcpListener::bind(addr).with_context(|| {
        format!(
            "--metrics {addr}: cannot listen there (is the port in use, or the address not \
             this host's?): give a free HOST:PORT such as 127.0.0.1:9179, or port 0 for any"
        )
    })
}

/// Serves the tree's metrics on `listener` until dropped.
pub(super) fn serve(
    listener: TcpListener,
    stats_dir: PathBuf,
    coordinator: CoordinatorView,
    local_mem: u64,
) -> anyhow::Result<MetricsEndpoint> {
    let me = nix::unistd::geteuid().as_raw();
    MetricsEndpoint::start(listener, "farmem-run-metrics", move || {
        render(
            &run_tree::processes_in(&stats_dir, 0, me),
            &coordinator.snapshot(),
            local_mem,
        )
    })
    .context("starting the --metrics endpoint")
}

/// The tree's metrics from its processes' stats files and the coordinator's shares.
pub(super) fn render(files: &[StatsFile], tree: &TreeSnapshot, local_mem: u64) -> String {
    let page = PAGE_SIZE as u64;
    let all: Vec<&Stats> = files.iter().filter_map(|f| f.runtime.as_ref()).collect();
    let running: Vec<&Stats> = files
        .iter()
        .filter(|f| !f.is_final)
        .filter_map(|f| f.runtime.as_ref())
        .collect();
    let sum = |of: &[&Stats], f: fn(&Stats) -> u64| of.iter().map(|s| f(s)).sum::<u64>();
    let total = |f: fn(&Stats) -> u64| sum(&all, f);
    let now = |f: fn(&Stats) -> u64| sum(&running, f);

    let mut e = Exposition::new("run");
    let live = tree.processes.iter().filter(|p| p.running).count();
    e.single(
        "farmem_run_processes",
        Kind::Gauge,
        "Processes of the program's tree sharing the local memory now.",
        live,
    );
    e.single(
        "farmem_run_processes_started_total",
        Kind::Counter,
        "Processes of the program's tree that ever took a share of the local memory.",
        tree.processes_seen,
    );
    let used: u64 = tree.processes.iter().map(|p| p.used_pages).sum();
    for (name, help, v) in [
        (
            "farmem_run_local_memory_bytes",
            "The local memory the tree may use (--local-mem): resident and pooled pages.",
            local_mem,
        ),
        (
            "farmem_run_local_used_bytes",
            "Resident and pooled pages of the tree now, as its processes last reported them (a \
             page shared since a fork counts in each process that maps it).",
            used * page,
        ),
        (
            "farmem_run_local_used_peak_bytes",
            "The most resident and pooled pages the tree held at once (shared pages counted \
             in each process).",
            tree.peak_total_used_pages * page,
        ),
        (
            "farmem_run_resident_bytes",
            "Pages of far-memory regions resident in the tree's processes now (shared pages \
             counted in each process).",
            now(|s| s.resident_pages) * page,
        ),
        (
            "farmem_run_pooled_bytes",
            "Pages held in the write-back pools now (evicted, not yet sent, or prefetched).",
            now(|s| s.pool_pages) * page,
        ),
    ] {
        e.single(name, Kind::Gauge, help, v);
    }

    e.family(
        "farmem_run_faults_total",
        Kind::Counter,
        "Page faults served, by where the page came from.",
    );
    for (source, v) in [
        ("zero", total(|s| s.faults_zero)),
        ("pool", total(|s| s.faults_pool_hit)),
        ("host_tier", total(|s| s.faults_tier)),
        ("remote", total(|s| s.faults_remote)),
        ("write_protect", total(|s| s.faults_write_protect)),
    ] {
        e.sample("farmem_run_faults_total", &[("source", source)], v);
    }
    e.family(
        "farmem_run_page_bytes_total",
        Kind::Counter,
        "Page bytes moved between the program and far memory, by tier and direction.",
    );
    for (tier, direction, v) in [
        (
            "host",
            "in",
            total(|s| s.faults_tier + s.tier_installed_ahead) * page,
        ),
        ("host", "out", total(|s| s.tier_pages_written) * page),
        ("remote", "in", total(|s| s.bytes_received)),
        ("remote", "out", total(|s| s.bytes_sent)),
    ] {
        e.sample(
            "farmem_run_page_bytes_total",
            &[("tier", tier), ("direction", direction)],
            v,
        );
    }
    e.family(
        "farmem_run_evicted_pages_total",
        Kind::Counter,
        "Pages evicted, by what eviction did with them.",
    );
    for (how, v) in [
        ("sent", total(|s| s.evicted_sent_dirty)),
        ("host_tier", total(|s| s.tier_pages_written)),
        ("clean", total(|s| s.evicted_dropped_clean)),
        ("zero", total(|s| s.evicted_zero)),
    ] {
        e.sample("farmem_run_evicted_pages_total", &[("how", how)], v);
    }

    prefetch(&mut e, &total);
    far(&mut e, &running, &total);
    e.finish()
}

/// Prefetching: its counters, and accuracy and coverage over the whole run (absent until
/// defined).
fn prefetch(e: &mut Exposition, total: &dyn Fn(fn(&Stats) -> u64) -> u64) {
    let prefetched = total(|s| s.prefetched_pages);
    let hits = total(|s| s.prefetch_hits);
    let misses = total(|s| s.prefetch_demand_faults);
    for (name, help, v) in [
        (
            "farmem_run_prefetched_pages_total",
            "Pages brought in by prefetching.",
            prefetched,
        ),
        (
            "farmem_run_prefetch_hits_total",
            "First touches of prefetched pages.",
            hits,
        ),
        (
            "farmem_run_prefetch_misses_total",
            "Faults served from a donor that prefetching did not cover.",
            misses,
        ),
    ] {
        e.single(name, Kind::Counter, help, v);
    }
    let ratio = |a: u64, b: u64| (b > 0).then(|| format!("{:.6}", a as f64 / b as f64));
    for (name, help, v) in [
        (
            "farmem_run_prefetch_accuracy_ratio",
            "Prefetch hits per prefetched page over the run (no sample before any prefetch).",
            ratio(hits, prefetched),
        ),
        (
            "farmem_run_prefetch_coverage_ratio",
            "Prefetch hits per far fault (hits and misses) over the run (no sample before any).",
            ratio(hits, hits + misses),
        ),
    ] {
        e.family(name, Kind::Gauge, help);
        if let Some(v) = v {
            e.sample(name, &[], v);
        }
    }
}

/// Donors and copies: each donor's health and what the running processes hold there, the
/// copies short or lost, and what failures cost.
fn far(e: &mut Exposition, running: &[&Stats], total: &dyn Fn(fn(&Stats) -> u64) -> u64) {
    let donors = run_tree::donors_in_use(running);
    e.family(
        "farmem_run_donor_health",
        Kind::Gauge,
        "1 for each donor's health now (live, suspect or dead; the worst any process sees).",
    );
    for (addr, d) in &donors {
        for state in run_tree::DONOR_HEALTH {
            let v = u8::from(d.health == state);
            e.sample(
                "farmem_run_donor_health",
                &[("donor", addr), ("state", state)],
                v,
            );
        }
    }
    let per_donor: [DonorFigure; 3] = [
        (
            "farmem_run_donor_slabs",
            "Far slab copies the program holds on each donor now.",
            |d| d.far_slabs,
        ),
        (
            "farmem_run_donor_taken_bytes",
            "Bytes of each donor's slabs the program holds now.",
            |d| d.bytes_taken,
        ),
        (
            "farmem_run_donor_capacity_bytes",
            "What each donor lends in all, as it said when the program connected.",
            |d| d.capacity_bytes,
        ),
    ];
    for (name, help, f) in per_donor {
        e.by_label(
            name,
            Kind::Gauge,
            help,
            "donor",
            donors.iter().map(|(a, d)| (a, f(d))),
        );
    }
    let replicas = running.iter().map(|s| s.replicas).max().unwrap_or(0);
    e.single(
        "farmem_run_replicas",
        Kind::Gauge,
        "Copies of every far page the program keeps on distinct donors (--replicas).",
        replicas,
    );
    let now = |f: fn(&Stats) -> u64| running.iter().map(|s| f(s)).sum::<u64>();
    e.single(
        "farmem_run_slabs_degraded",
        Kind::Gauge,
        "Far slabs with fewer live copies than --replicas now.",
        now(|s| s.slabs_degraded),
    );
    e.single(
        "farmem_run_slabs_lost",
        Kind::Gauge,
        "Far slabs with no copy on a live donor and none in the backup file now.",
        now(|s| s.slabs_lost),
    );
    for (name, help, v) in [
        (
            "farmem_run_failovers_total",
            "Donor reads served by another copy after the first failed or was slow.",
            total(|s| s.failovers),
        ),
        (
            "farmem_run_slabs_healed_total",
            "Slab copies made again elsewhere after a donor died or asked for its memory back.",
            total(|s| s.slabs_healed),
        ),
        (
            "farmem_run_heal_bytes_total",
            "Bytes copied between donors to make copies again.",
            total(|s| s.heal_bytes),
        ),
        (
            "farmem_run_fetch_errors_total",
            "Failed reads of pages from donors (each retried elsewhere).",
            total(|s| s.fetch_errors),
        ),
        (
            "farmem_run_send_errors_total",
            "Failed sends of pages to donors (retried; the pages stay in the pool).",
            total(|s| s.send_errors),
        ),
        (
            "farmem_run_seal_rejected_pages_total",
            "Pages a donor handed back that failed their seal check (altered, swapped or old): \
             never installed.",
            total(|s| s.seal_rejected),
        ),
        (
            "farmem_run_pages_lost_total",
            "Pages no copy could bring back (each access got SIGBUS): alert on any.",
            total(|s| s.pages_lost + s.state_lost_pages),
        ),
    ] {
        e.single(name, Kind::Counter, help, v);
    }
}

/// A family of one figure per donor: its name, its help, the figure.
type DonorFigure = (&'static str, &'static str, fn(&DonorUse) -> u64);

#[cfg(test)]
mod tests {
    use super::*;
    use farmem_tree::ProcessShare;

    fn process(pid: u32, is_final: bool, faults_remote: u64, health: &str) -> StatsFile {
        StatsFile {
            pid,
            is_final,
            runtime: Some(Stats {
                faults_remote,
                faults_zero: 1,
                resident_pages: 10,
                pool_pages: 2,
                bytes_received: faults_remote * 4096,
                prefetched_pages: 4,
                prefetch_hits: 3,
                prefetch_demand_faults: 1,
                replicas: 2,
                donors: vec![DonorUse {
                    addr: "10.0.0.2:7070".into(),
                    health: health.into(),
                    far_slabs: 5,
                    bytes_taken: 4 << 20,
                    capacity_bytes: 1 << 30,
                    ..DonorUse::default()
                }],
                ..Stats::default()
            }),
            ..StatsFile::default()
        }
    }

    fn sample<'a>(text: &'a str, series: &str) -> Option<&'a str> {
        text.lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
    }

    #[test]
    fn counters_add_every_process_and_gauges_the_running_ones() {
        let files = [
            process(10, false, 100, "live"),
            process(11, true, 50, "dead"),
            process(12, false, 7, "suspect"),
        ];
        let tree = TreeSnapshot {
            processes: vec![
                ProcessShare {
                    pid: 10,
                    used_pages: 30,
                    running: true,
                    ..ProcessShare::default()
                },
                ProcessShare {
                    pid: 12,
                    used_pages: 4,
                    running: true,
                    ..ProcessShare::default()
                },
            ],
            peak_total_used_pages: 40,
            overcommitted_pages: 0,
            processes_seen: 3,
            total_pages: 64,
        };
        let t = render(&files, &tree, 256 << 10);
        assert!(t.starts_with("# HELP farmem_build_info"), "{t}");
        let at = |s: &str| sample(&t, s).unwrap_or_else(|| panic!("no {s} in\n{t}"));
        assert_eq!(at("farmem_run_processes"), "2");
        assert_eq!(at("farmem_run_processes_started_total"), "3");
        assert_eq!(at("farmem_run_local_memory_bytes"), "262144");
        assert_eq!(at("farmem_run_local_used_bytes"), (34 * 4096).to_string());
        assert_eq!(
            at("farmem_run_local_used_peak_bytes"),
            (40 * 4096).to_string()
        );
        // The exited process's counts stay in the counters, not in the gauges.
        assert_eq!(at("farmem_run_faults_total{source=\"remote\"}"), "157");
        assert_eq!(at("farmem_run_faults_total{source=\"zero\"}"), "3");
        assert_eq!(
            at("farmem_run_page_bytes_total{tier=\"remote\",direction=\"in\"}"),
            (157 * 4096).to_string()
        );
        assert_eq!(at("farmem_run_resident_bytes"), (20 * 4096).to_string());
        assert_eq!(at("farmem_run_pooled_bytes"), (4 * 4096).to_string());
        assert_eq!(at("farmem_run_prefetch_accuracy_ratio"), "0.750000");
        assert_eq!(at("farmem_run_prefetch_coverage_ratio"), "0.750000");
        // The worst health a running process sees; the exited one's "dead" is not current.
        assert_eq!(
            at("farmem_run_donor_health{donor=\"10.0.0.2:7070\",state=\"suspect\"}"),
            "1"
        );
        assert_eq!(
            at("farmem_run_donor_health{donor=\"10.0.0.2:7070\",state=\"dead\"}"),
            "0"
        );
        assert_eq!(at("farmem_run_donor_slabs{donor=\"10.0.0.2:7070\"}"), "10");
        assert_eq!(at("farmem_run_replicas"), "2");
    }

    #[test]
    fn a_ratio_with_nothing_to_divide_has_no_sample_and_no_family_is_written_twice() {
        let t = render(&[], &TreeSnapshot::default(), 1 << 20);
        assert!(t.contains("# TYPE farmem_run_prefetch_accuracy_ratio gauge"));
        assert_eq!(sample(&t, "farmem_run_prefetch_accuracy_ratio"), None);
        let mut seen = std::collections::HashSet::new();
        for l in t.lines().filter_map(|l| l.strip_prefix("# TYPE ")) {
            let name = l.split(' ').next().unwrap();
            assert!(seen.insert(name.to_string()), "{name} written twice:\n{t}");
        }
    }
}
