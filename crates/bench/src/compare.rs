//! `farmem-bench compare`: one workload under local memory, farmem (with the host tier and with
//! the embedded TCP donor), Linux swap to a file and zram, side by side in one run on one
//! machine, every figure a ratio to `local` and `swap` measured in that same run.
//!
//! # Design
//!
//! For each workload the `local` run comes first, in a memory cgroup without a limit: it is the
//! baseline and measures the workload's peak memory (the cgroup's high-water mark, so page cache
//! the program needs counts as it does under the limit). Each `--local F` then gives the limit
//! `F × peak`, and each other system runs the workload once, in a fresh process, after the page
//! cache is dropped:
//!
//! * `farmem`: `farmem run --local-mem LIMIT --stats FILE --quiet -- WORKLOAD` (the `farmem`
//!   binary beside this one): its default, the host tier (the host's `farmem node`, else a
//!   private one);
//! * `farmem-tcp`: the same with `--local-donor tcp`: no host tier, the embedded donor over
//!   loopback TCP, so the tier's gain shows in one run;
//! * `swap`: a swap file on local disk (`--swap-dir`) is the only active swap area, the workload
//!   runs in a memory cgroup limited to LIMIT;
//! * `zram`: a new zram device with lz4 is the only active swap area, same cgroup limit.
//!
//! The machine's own swap areas are off during the benchmark and back on afterwards; every
//! change is undone on every path, including SIGINT/SIGTERM (see [`systems`]). A system the
//! machine cannot provide is skipped with a note in its row. The output is one table (or
//! `--json` rows), an optional SVG (`--plot`), and with `--save DIR` all three plus the machine's
//! description, as kept in bench/results/.
//!
//! Every row also says what paging cost ([`cost`]): pages moved in and out (`in_pages`,
//! `out_pages`), the CPU seconds spent on paging (`cpu_s`), `us_per_page = cpu_s / (in + out)`
//! and `moved_vs_swap = (in + out) / swap's (in + out)` at the same fraction, where
//!
//! * `local`: `cpu_s` = the workload tree's system time (the baseline);
//! * `swap`, `zram`: `cpu_s` = the tree's system time + kswapd's user and system time over the
//!   run; pages = the `pswpin`/`pswpout` deltas;
//! * `farmem`, `farmem-tcp`: `cpu_s` = the tree's system time + the user time of the program's
//!   `farmem-…` threads (`runtime_cpu_s - runtime_system_s` from the stats file) + the user
//!   time of the tree's `farmem` processes (`farmem run`, its private node or embedded donor);
//!   pages = host tier + donor bytes in and out ÷ 4096.
//!
//! The tree's times are `getrusage(RUSAGE_CHILDREN)` from spawn to reap: system time is taken
//! from there only, user time only from farmem's own threads and processes, so nothing counts
//! twice (the details and what is missed are in [`cost`]).
//!
//! # Limitations
//!
//! The limit is the same number for all systems, but what it covers differs: the cgroup limit
//! covers all the workload's memory (anonymous and the page cache of its files), farmem's budget
//! covers the pages of its regions. zram's compressed store lives outside the cgroup, as it does
//! in production. The swap figures depend on the disk behind `--swap-dir` (a virtio disk here).

mod cost;
mod kv;
mod remote;
mod report;
mod systems;
mod workloads;

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use farmem_contract::StatsFile;

use crate::units;
use cost::{CpuParts, SwapCounters};
use remote::{RemoteDonor, RemoteUse};
use report::RunRow;
use systems::{Cgroup, CgroupMount, Cleanup, CleanupGuard, SystemKind};
use workloads::{Sizes, Toolbox, Wrap};
// `farmem-bench replicas` runs compare as a child and reads its rows per workload.
pub use workloads::{parse_workload_list, Metric, Workload, WorkloadList};

/// Arguments of `farmem-bench compare`.
#[derive(Args, Debug)]
#[command(
    after_help = "Example: farmem-bench compare --workload seq,stride:10,redis --local 0.5,0.25 --plot out.svg\n\
                  Managed heaps 2x the budget: farmem-bench compare --workload node-heap,jvm-heap --local 0.5 --systems farmem,swap"
)]
pub struct CompareArgs {
    /// Workloads, comma-separated: seq, stride:K, random, redis, memcached, numpy, kmeans, mp,
    /// node-heap (live JS objects under node), jvm-heap (live Java objects under java), or all.
    #[arg(long, short = 'w', value_parser = workloads::parse_workload_list)]
    pub workload: WorkloadList,

    /// Fraction(s) of the workload's peak memory allowed locally, comma-separated, each in (0, 1].
    #[arg(long = "local", default_value = "0.5", value_parser = parse_fractions)]
    pub local: Fractions,

    /// Systems to compare, comma-separated: local, farmem (host tier), farmem-tcp (embedded TCP
    /// donor, no tier), farmem-remote (a donor in a network namespace of its own behind a veth
    /// link, with a token and sealing: another machine), swap, zram, or all (local always runs).
    #[arg(
        long,
        default_value = "local,farmem,farmem-tcp,farmem-remote,swap,zram",
        value_parser = parse_system_list
    )]
    pub systems: SystemList,

    /// Working set of the seq/stride/random microbenchmarks (e.g. 512MiB, 1GiB).
    #[arg(long, default_value = "1GiB", value_parser = parse_wss)]
    pub wss: u64,

    /// Passes over the working set of the microbenchmarks, of each mp worker and of the
    /// node-heap/jvm-heap records (after the pass that fills it).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..))]
    pub passes: u32,

    /// Keys loaded into redis/memcached (1 KiB random values each).
    #[arg(long, default_value_t = 600_000, value_parser = clap::value_parser!(u64).range(2..))]
    pub keys: u64,

    /// Requests of the 95% GET / 5% SET mix (all clients together).
    #[arg(long, default_value_t = 200_000, value_parser = clap::value_parser!(u64).range(1..))]
    pub ops: u64,

    /// Client connections (threads) of the mix, each closed-loop.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=256))]
    pub clients: u32,

    /// Zipfian skew of the keys, in (0, 1).
    #[arg(long, default_value_t = 0.99)]
    pub zipf: f64,

    /// numpy: multiply two N×N float64 matrices (operands 3·N²·8 bytes).
    #[arg(long, default_value_t = 5000, value_parser = clap::value_parser!(u64).range(2..))]
    pub matrix_n: u64,

    /// kmeans: samples of the generated data set.
    #[arg(long, default_value_t = 1_000_000, value_parser = clap::value_parser!(u64).range(16..))]
    pub kmeans_samples: u64,

    /// kmeans: features per sample (float64).
    #[arg(long, default_value_t = 32, value_parser = clap::value_parser!(u64).range(1..))]
    pub kmeans_features: u64,

    /// kmeans: clusters.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u64).range(2..))]
    pub kmeans_clusters: u64,

    /// kmeans: maximum Lloyd iterations.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..))]
    pub kmeans_iterations: u64,

    /// mp: working set of each worker process (e.g. 256MiB); peak ≈ workers × this + ~26 MiB.
    #[arg(long, default_value = "256MiB", value_parser = parse_wss)]
    pub mp_worker_bytes: u64,

    /// mp: worker processes the parent forks (multiprocessing, 'fork' start method).
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=256))]
    pub mp_workers: u32,

    /// node-heap, jvm-heap: live objects built on the runtime's heap (e.g. 512MiB); peak ≈ this +
    /// the runtime's own memory and its collector's room. `--local 0.5` gives a budget of half
    /// the peak: a heap 2× the budget.
    #[arg(long, default_value = "1GiB", value_parser = parse_wss)]
    pub heap_bytes: u64,

    /// A run that takes longer than this (seconds) is killed and reported as failed.
    #[arg(long, default_value_t = 900, value_parser = clap::value_parser!(u64).range(1..))]
    pub timeout: u64,

    /// Seed of every generator (values, access orders, matrices).
    #[arg(long, default_value_t = 42)]
    pub seed: u64,

    /// Python interpreter for numpy/kmeans/mp (Debian's, which sees python3-numpy/python3-sklearn).
    #[arg(long, default_value = "/usr/bin/python3")]
    pub python: PathBuf,

    /// Directory on local disk for the swap file of the `swap` system.
    #[arg(long, default_value = "/var/tmp")]
    pub swap_dir: PathBuf,

    /// Extra argument passed to `farmem run` (repeatable), e.g. --farmem-arg=--prefetch=none.
    #[arg(long = "farmem-arg", allow_hyphen_values = true)]
    pub farmem_args: Vec<String>,

    /// Print the rows as JSON (the table then goes to stderr).
    #[arg(long)]
    pub json: bool,

    /// Draw the rows as grouped bars into this SVG file.
    #[arg(long)]
    pub plot: Option<PathBuf>,

    /// Also write results.md (machine + table), results.json and results.svg into this directory.
    #[arg(long)]
    pub save: Option<PathBuf>,
}

/// The value of `--local`: fractions in (0, 1], in the order given.
#[derive(Clone, Debug, PartialEq)]
pub struct Fractions(pub Vec<f64>);

/// Parses `--local`: comma-separated fractions in (0, 1].
pub fn parse_fractions(text: &str) -> Result<Fractions, String> {
    let mut out = Vec::new();
    for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let f: f64 = part
            .parse()
            .map_err(|_| format!("`{part}` is not a number: --local takes fractions of the peak memory, e.g. 0.5 or 0.5,0.25"))?;
        if !(f > 0.0 && f <= 1.0) {
            return Err(format!(
                "--local {part} is out of range: each fraction must be in (0, 1], e.g. 0.5"
            ));
        }
        if !out.contains(&f) {
            out.push(f);
        }
    }
    if out.is_empty() {
        return Err("--local needs at least one fraction, e.g. 0.5".into());
    }
    Ok(Fractions(out))
}

/// The value of `--systems`, in run order, `local` first.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SystemList(pub Vec<SystemKind>);

fn parse_system_list(text: &str) -> Result<SystemList, String> {
    systems::parse_systems(text).map(SystemList)
}

/// Parses the microbenchmarks' working set: a size as every subcommand takes it
/// ([`units::parse_size`]), at least one page.
pub fn parse_wss(text: &str) -> Result<u64, String> {
    let bytes = units::parse_size(text)?;
    if bytes < 4096 {
        return Err(format!("size `{text}` is below one page (4 KiB)"));
    }
    Ok(bytes)
}

/// The limit for fraction `f` of `peak_bytes`, rounded up to whole pages.
pub fn limit_for(peak_bytes: u64, f: f64) -> u64 {
    let raw = (peak_bytes as f64 * f).ceil() as u64;
    raw.div_ceil(4096).max(1) * 4096
}

/// Bytes farmem moved out of the program's memory, from its stats file: to donors and into
/// the host tier (None without a runtime).
pub fn farmem_moved_bytes(stats: &StatsFile) -> Option<u64> {
    stats
        .summary
        .as_ref()
        .map(|s| s.remote_bytes_out + s.tier_bytes_out)
}

/// Where a farmem run's time went, from its stats file: remote faults and their handler
/// latency, host tier faults (when there were any) and theirs, write-back pool hits, prefetch
/// accuracy and the share of prefetched pages evicted unused (when something was prefetched),
/// and what became of the evicted pages (written back, unchanged so not written again, all
/// zero), so that the row's pages moved read as faults + prefetches in and write-backs out.
pub fn farmem_fault_note(stats: &StatsFile) -> Option<String> {
    let rt = stats.runtime.as_ref()?;
    let mut parts = vec![format!(
        "{} remote faults (handler p50 {:.0} µs)",
        rt.faults_remote, rt.latency.remote.p50_us
    )];
    if rt.faults_tier > 0 {
        parts.push(format!(
            "{} tier faults (handler p50 {:.0} µs)",
            rt.faults_tier, rt.latency.tier.p50_us
        ));
    }
    parts.push(format!("{} pool hits", rt.faults_pool_hit));
    if let Some(a) = stats.summary.as_ref().and_then(|s| s.prefetch_accuracy) {
        parts.push(format!("prefetch accuracy {:.0}%", a * 100.0));
    }
    if rt.prefetched_pages > 0 {
        parts.push(format!(
            "{} pages prefetched ({:.0}% evicted unused)",
            rt.prefetched_pages,
            100.0 * rt.prefetch_pollution as f64 / rt.prefetched_pages as f64
        ));
    }
    let written = rt.evicted_sent_dirty + rt.tier_pages_written;
    if written + rt.evicted_dropped_clean + rt.evicted_zero > 0 {
        parts.push(format!(
            "evicted {written} written back, {} unchanged, {} all zero",
            rt.evicted_dropped_clean, rt.evicted_zero
        ));
    }
    Some(parts.join(", "))
}

/// Reads the stats file `farmem run --stats` wrote (None if it is missing or unreadable: the
/// row then has no moved bytes and no fault note).
fn read_stats_file(path: &Path) -> Option<StatsFile> {
    let text = std::fs::read_to_string(path).ok()?;
    serde_json::from_str(&text).ok()
}

struct Ctx<'a> {
    args: &'a CompareArgs,
    sizes: Sizes,
    tb: Toolbox,
    cleanup: Cleanup,
    cgroup: Option<CgroupMount>,
    run_no: usize,
    runs_total: usize,
    cache_note_shown: bool,
}

impl Ctx<'_> {
    fn progress(&mut self, what: &str) -> String {
        self.run_no += 1;
        let tag = format!("[{}/{}] {what}", self.run_no, self.runs_total);
        if !self.cache_note_shown {
            if let Err(err) = systems::drop_page_cache() {
                eprintln!("farmem-bench: note: page cache not dropped before runs: {err:#}");
                self.cache_note_shown = true;
            }
        } else {
            let _ = systems::drop_page_cache();
        }
        tag
    }
}

fn blank_row(system: SystemKind, workload: Workload, f: f64, limit: Option<u64>) -> RunRow {
    RunRow {
        system,
        workload,
        local_fraction: f,
        limit_bytes: limit,
        wall_s: None,
        throughput_ops: None,
        avg_access_us: None,
        p50_us: None,
        p99_us: None,
        moved_bytes: None,
        in_pages: None,
        out_pages: None,
        cpu: None,
        remote: None,
        note: None,
        failed: false,
    }
}

fn fill(row: &mut RunRow, m: workloads::Measured) {
    row.wall_s = m.wall_s;
    row.throughput_ops = m.throughput_ops;
    row.avg_access_us = m.avg_access_us;
    row.p50_us = m.p50_us;
    row.p99_us = m.p99_us;
    row.note = Some(m.detail);
}

fn summary(row: &RunRow) -> String {
    match row.workload.metric() {
        workloads::Metric::AccessTime => {
            format!("avg access {:.2} µs", row.avg_access_us.unwrap_or(f64::NAN))
        }
        workloads::Metric::Throughput => {
            format!("{:.0} ops/s", row.throughput_ops.unwrap_or(f64::NAN))
        }
        workloads::Metric::Completion => {
            format!("completed in {:.2} s", row.wall_s.unwrap_or(f64::NAN))
        }
    }
}

/// Runs the local baseline of `w`; returns its row and the peak memory.
fn run_local(ctx: &mut Ctx<'_>, w: Workload) -> (RunRow, Option<u64>) {
    let tag = ctx.progress(&format!("{w} local"));
    eprintln!("{tag}: running (no limit)");
    let mut row = blank_row(SystemKind::Local, w, 1.0, None);
    let result = (|| -> anyhow::Result<(workloads::Measured, Option<u64>)> {
        match &ctx.cgroup {
            Some(mount) => {
                let (cg, token) = Cgroup::create(mount, None, &ctx.cleanup)?;
                let m = workloads::run(
                    w,
                    &ctx.sizes,
                    &ctx.tb,
                    &Wrap::Cgroup(cg.procs_file()),
                    &ctx.cleanup,
                );
                let peak = cg.peak_bytes();
                ctx.cleanup.run(token)?;
                Ok((m?, Some(peak?)))
            }
            None => Ok((
                workloads::run(w, &ctx.sizes, &ctx.tb, &Wrap::Direct, &ctx.cleanup)?,
                None,
            )),
        }
    })();
    match result {
        Ok((m, peak)) => {
            (row.in_pages, row.out_pages) = (Some(0), Some(0));
            row.cpu = m
                .tree
                .and_then(|t| CpuParts::of(SystemKind::Local, &t, 0.0, None));
            fill(&mut row, m);
            eprintln!(
                "{tag}: done, {}, peak {}",
                summary(&row),
                peak.map(report::bytes)
                    .unwrap_or_else(|| "not measured (no memory cgroup)".into())
            );
            (row, peak)
        }
        Err(err) => {
            eprintln!("{tag}: FAILED: {err:#}");
            row.note = Some(format!("failed: {err:#}"));
            row.failed = true;
            (row, None)
        }
    }
}

/// What a limited run measured besides the workload's own figures.
struct Outcome {
    m: workloads::Measured,
    /// Bytes moved out (swap: pswpout; farmem: into the tier and to donors).
    moved_bytes: Option<u64>,
    /// Pages moved (in, out).
    pages: Option<(u64, u64)>,
    cpu: Option<CpuParts>,
    /// The remote donor's CPU and link bytes (farmem-remote).
    remote: Option<RemoteUse>,
}

/// Runs `w` under `system` with `limit_bytes`. Err(skip note) when the system cannot be set up.
fn run_limited(
    ctx: &mut Ctx<'_>,
    system: SystemKind,
    w: Workload,
    f: f64,
    peak: u64,
    limit_bytes: u64,
) -> Result<RunRow, String> {
    let tag = ctx.progress(&format!("{w} @{f} {system}"));
    let mut row = blank_row(system, w, f, Some(limit_bytes));
    // Twice the peak: with the area more than half full the kernel frees a page's swap slot when
    // it comes back in (vm_swap_full), so a clean page would be written again on every eviction;
    // real machines are not sized that tight, and zram only uses memory for stored pages.
    let swap_size = 2 * peak + (64 << 20);
    let outcome: anyhow::Result<Outcome> = match system {
        SystemKind::Local => unreachable!("local runs in run_local"),
        SystemKind::Farmem | SystemKind::FarmemTcp | SystemKind::FarmemRemote => {
            run_farmem(ctx, system, w, limit_bytes, swap_size, &tag)?
        }
        SystemKind::Swap | SystemKind::Zram => {
            let mount = ctx.cgroup.clone().ok_or("no memory cgroup controller")?;
            let area = if system == SystemKind::Swap {
                systems::create_swap_file(&ctx.args.swap_dir, swap_size, &ctx.cleanup)
            } else {
                systems::create_zram(swap_size, &ctx.cleanup)
            }
            .map_err(|e| format!("{e:#}"))?;
            let (cg, cg_token) = match Cgroup::create(&mount, Some(limit_bytes), &ctx.cleanup) {
                Ok(x) => x,
                Err(e) => {
                    let _ = area.teardown(&ctx.cleanup);
                    return Err(format!("{e:#}"));
                }
            };
            eprintln!(
                "{tag}: running in a cgroup limited to {}, swap on {}",
                report::bytes(limit_bytes),
                area.description
            );
            let (swap_before, kswapd_before) = (SwapCounters::now(), cost::kswapd_cpu_s());
            let m = workloads::run(
                w,
                &ctx.sizes,
                &ctx.tb,
                &Wrap::Cgroup(cg.procs_file()),
                &ctx.cleanup,
            );
            let swapped = SwapCounters::now().since(swap_before);
            let kswapd_s = (cost::kswapd_cpu_s() - kswapd_before).max(0.0);
            let teardown = ctx.cleanup.run(cg_token).and(area.teardown(&ctx.cleanup));
            match (m, teardown) {
                (Ok(m), Ok(())) => Ok(Outcome {
                    remote: None,
                    moved_bytes: Some(swapped.pswpout * cost::PAGE_BYTES),
                    pages: Some((swapped.pswpin, swapped.pswpout)),
                    cpu: m
                        .tree
                        .and_then(|t| CpuParts::of(system, &t, kswapd_s, None)),
                    m,
                }),
                (Err(e), _) | (Ok(_), Err(e)) => Err(e),
            }
        }
    };
    match outcome {
        Ok(o) => {
            fill(&mut row, o.m);
            row.moved_bytes = o.moved_bytes;
            (row.in_pages, row.out_pages) = (o.pages.map(|p| p.0), o.pages.map(|p| p.1));
            row.cpu = o.cpu;
            row.remote = o.remote;
            eprintln!("{tag}: done, {}", summary(&row));
        }
        Err(err) => {
            eprintln!("{tag}: FAILED: {err:#}");
            row.note = Some(format!("failed: {err:#}"));
            row.failed = true;
        }
    }
    Ok(row)
}

/// Runs `w` under `farmem run` as `system` gives it its far memory: the host tier, the
/// embedded TCP donor, or a donor on another "machine" ([`remote`], started for this run and
/// stopped after it; `far_bytes` is its capacity). Err(skip note) when it cannot be set up.
fn run_farmem(
    ctx: &mut Ctx<'_>,
    system: SystemKind,
    w: Workload,
    limit_bytes: u64,
    far_bytes: u64,
    tag: &str,
) -> Result<anyhow::Result<Outcome>, String> {
    let stats = ctx
        .tb
        .dir
        .path()
        .join(format!("farmem-stats-{}.json", ctx.run_no));
    let exe = crate::farmem_bin().map_err(|e| format!("{e:#}"))?;
    let local_donor = system.local_donor();
    let mut extra = ctx.args.farmem_args.clone();
    let donor = match system {
        SystemKind::FarmemRemote => {
            let d = RemoteDonor::start(far_bytes, &ctx.cleanup)?;
            extra.extend(d.farmem_args());
            Some(d)
        }
        _ => None,
    };
    eprintln!(
        "{tag}: running under farmem run {}--local-mem {}{}",
        local_donor
            .map(|k| format!("--local-donor {k} "))
            .unwrap_or_default(),
        report::bytes(limit_bytes),
        donor
            .as_ref()
            .map(|d| format!(" {}", d.farmem_args().join(" ")))
            .unwrap_or_default()
    );
    let wrap = Wrap::Farmem {
        exe,
        local_donor,
        budget_bytes: limit_bytes,
        stats: stats.clone(),
        extra,
    };
    let before = donor.as_ref().map(RemoteDonor::sample);
    let measured = workloads::run(w, &ctx.sizes, &ctx.tb, &wrap, &ctx.cleanup);
    let remote = donor.as_ref().zip(before).map(|(d, b)| d.sample().since(b));
    let stopped = donor.map_or(Ok(()), |d| d.stop(&ctx.cleanup));
    Ok(measured.and_then(|mut m| {
        stopped?;
        let stats = read_stats_file(&stats);
        let moved_bytes = stats.as_ref().and_then(farmem_moved_bytes);
        if let Some(note) = stats.as_ref().and_then(farmem_fault_note) {
            m.detail = format!("{}; {note}", m.detail);
        }
        let pages = stats.as_ref().and_then(cost::farmem_moved_pages);
        let cpu = m
            .tree
            .and_then(|t| CpuParts::of(system, &t, 0.0, stats.as_ref()));
        Ok(Outcome {
            m,
            moved_bytes,
            pages,
            cpu,
            remote,
        })
    }))
}

/// Why a system cannot run on this machine at all (before trying), if it cannot.
fn precheck(
    system: SystemKind,
    root: bool,
    cgroup: &anyhow::Result<CgroupMount>,
) -> Option<String> {
    match system {
        SystemKind::Local => None,
        SystemKind::FarmemRemote if !root => {
            Some("skipped: needs root (runs the donor in a network namespace of its own)".into())
        }
        SystemKind::Farmem | SystemKind::FarmemTcp | SystemKind::FarmemRemote => {
            let exe = match crate::farmem_bin() {
                Ok(exe) => exe,
                Err(e) => return Some(format!("skipped: {e:#}")),
            };
            let help = std::process::Command::new(&exe)
                .args(["run", "--help"])
                .output()
                .ok()
                .filter(|o| o.status.success())
                .map(|o| String::from_utf8_lossy(&o.stdout).into_owned());
            let Some(help) = help else {
                return Some(format!(
                    "skipped: `{} run` is not available in this build",
                    exe.display()
                ));
            };
            farmem_run_lacks(system, &help).map(|flag| {
                format!(
                    "skipped: `{} run` has no {flag} in this build",
                    exe.display()
                )
            })
        }
        SystemKind::Swap | SystemKind::Zram => {
            if !root {
                Some("skipped: needs root (creates a swap area and a memory cgroup)".into())
            } else {
                cgroup.as_ref().err().map(|e| format!("skipped: {e:#}"))
            }
        }
    }
}

/// The `farmem run` flag `system` needs that `help` (its `--help` text) does not offer.
fn farmem_run_lacks(system: SystemKind, help: &str) -> Option<&'static str> {
    (system.local_donor().is_some() && !help.contains("--local-donor")).then_some("--local-donor")
}

/// Runs `farmem-bench compare`.
pub fn run(args: CompareArgs) -> anyhow::Result<ExitCode> {
    if !(args.zipf > 0.0 && args.zipf < 1.0) {
        anyhow::bail!(
            "--zipf {} is out of range: the zipfian skew must be in (0, 1), e.g. 0.99",
            args.zipf
        );
    }
    let workloads = args.workload.0.clone();
    let fractions = args.local.0.clone();
    let systems_wanted = args.systems.0.clone();
    let cleanup = Cleanup::new();
    systems::install_signal_cleanup(cleanup.clone())?;
    let _guard = CleanupGuard(cleanup.clone());

    let root = systems::is_root();
    let cgroup_probe = if root {
        systems::detect_memory_cgroup()
    } else {
        Err(anyhow::anyhow!("not root: cannot create memory cgroups"))
    };
    let mut unavailable: Vec<(SystemKind, String)> = systems_wanted
        .iter()
        .filter_map(|s| precheck(*s, root, &cgroup_probe).map(|n| (*s, n)))
        .collect();
    for (s, note) in &unavailable {
        eprintln!("farmem-bench: {s}: {note}");
    }
    let uses_swap = systems_wanted.iter().any(|s| {
        matches!(s, SystemKind::Swap | SystemKind::Zram) && !unavailable.iter().any(|(u, _)| u == s)
    });
    let limited_runs = systems_wanted
        .iter()
        .any(|s| *s != SystemKind::Local && !unavailable.iter().any(|(u, _)| u == s));
    // Two harnesses would switch each other's swap areas off: one at a time per machine.
    let _instance_lock = if root && limited_runs {
        Some(systems::lock_machine()?)
    } else {
        None
    };
    if root && limited_runs {
        // Only the swap area under test may be active, during every run (farmem's included).
        match systems::quiesce_machine_swap(&cleanup) {
            Ok(areas) if !areas.is_empty() => eprintln!(
                "farmem-bench: switched off the machine's swap ({}) for the benchmark; it is switched back on at the end",
                areas.iter().map(|a| a.path.as_str()).collect::<Vec<_>>().join(", ")
            ),
            Ok(_) => {}
            Err(e) if uses_swap => {
                for s in [SystemKind::Swap, SystemKind::Zram] {
                    unavailable.push((s, format!("skipped: {e:#}")));
                }
            }
            Err(e) => eprintln!("farmem-bench: note: {e:#}"),
        }
    }
    let tb = Toolbox::prepare(&workloads, &args.python)?;
    let sizes = Sizes {
        wss_bytes: args.wss,
        passes: args.passes,
        keys: args.keys,
        ops: args.ops,
        clients: args.clients,
        zipf_theta: args.zipf,
        matrix_n: args.matrix_n,
        kmeans_samples: args.kmeans_samples,
        kmeans_features: args.kmeans_features,
        kmeans_clusters: args.kmeans_clusters,
        kmeans_iterations: args.kmeans_iterations,
        mp_worker_bytes: args.mp_worker_bytes,
        mp_workers: args.mp_workers,
        heap_bytes: args.heap_bytes,
        timeout: Duration::from_secs(args.timeout),
        seed: args.seed,
    };
    let runnable: Vec<SystemKind> = systems_wanted
        .iter()
        .copied()
        .filter(|s| *s != SystemKind::Local && !unavailable.iter().any(|(u, _)| u == s))
        .collect();
    let mut ctx = Ctx {
        args: &args,
        sizes,
        tb,
        cleanup: cleanup.clone(),
        cgroup: cgroup_probe.ok(),
        run_no: 0,
        runs_total: workloads.len() * (1 + fractions.len() * runnable.len()),
        cache_note_shown: !root,
    };
    if !root {
        eprintln!("farmem-bench: note: not root, so the page cache is not dropped between runs");
    }

    let mut rows: Vec<RunRow> = Vec::new();
    let mut peaks: Vec<(Workload, u64)> = Vec::new();
    for &w in &workloads {
        let (local_row, peak) = run_local(&mut ctx, w);
        let local_failed = local_row.failed;
        rows.push(local_row);
        if let Some(p) = peak {
            peaks.push((w, p));
        }
        for &f in &fractions {
            for &system in systems_wanted.iter().filter(|s| **s != SystemKind::Local) {
                if let Some((_, note)) = unavailable.iter().find(|(u, _)| *u == system) {
                    let mut row = blank_row(system, w, f, None);
                    row.note = Some(note.clone());
                    rows.push(row);
                    continue;
                }
                let Some(peak) = peak else {
                    let mut row = blank_row(system, w, f, None);
                    row.note = Some(if local_failed {
                        "skipped: the local run failed, so there is no peak to take a fraction of"
                            .into()
                    } else {
                        "skipped: the peak memory could not be measured (no memory cgroup)".into()
                    });
                    rows.push(row);
                    continue;
                };
                let limit = limit_for(peak, f);
                match run_limited(&mut ctx, system, w, f, peak, limit) {
                    Ok(row) => rows.push(row),
                    Err(note) => {
                        let note = format!("skipped: {note}");
                        eprintln!("farmem-bench: {system}: {note}");
                        let mut row = blank_row(system, w, f, Some(limit));
                        row.note = Some(note.clone());
                        rows.push(row);
                        unavailable.push((system, note));
                    }
                }
            }
        }
    }
    drop(ctx);
    for failure in cleanup.run_all() {
        eprintln!("farmem-bench: cleanup failed: {failure}");
    }

    let table = report::table(&rows, &peaks);
    if args.json {
        eprint!("{table}");
        println!("{}", report::json(&rows));
    } else {
        print!("{table}");
    }
    if let Some(path) = &args.plot {
        std::fs::write(path, report::svg(&rows))
            .with_context(|| format!("cannot write the plot to {}", path.display()))?;
    }
    if let Some(dir) = &args.save {
        save(dir, &rows, &table)?;
    }
    let failed = rows.iter().filter(|r| r.failed).count();
    if failed > 0 {
        eprintln!("farmem-bench: {failed} run(s) failed (see the notes)");
        return Ok(ExitCode::from(1));
    }
    Ok(ExitCode::SUCCESS)
}

fn save(dir: &Path, rows: &[RunRow], table: &str) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let command: Vec<String> = std::env::args().collect();
    let md = format!(
        "# farmem-bench compare — results\n\nCommand: `{}`\n\nMachine:\n{}\n```text{}```\n",
        command.join(" "),
        report::machine_description(),
        table
    );
    std::fs::write(dir.join("results.md"), md)?;
    std::fs::write(dir.join("results.json"), report::json(rows) + "\n")?;
    std::fs::write(dir.join("results.svg"), report::svg(rows))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser, Debug)]
    struct Wrapper {
        #[command(flatten)]
        args: CompareArgs,
    }

    fn parse(args: &[&str]) -> Result<CompareArgs, String> {
        let mut argv = vec!["compare"];
        argv.extend_from_slice(args);
        Wrapper::try_parse_from(argv)
            .map(|w| w.args)
            .map_err(|e| e.to_string())
    }

    /// A stats file holding `rt` (and the summary made from it), as `farmem run` writes one.
    pub(super) fn stats_file(rt: farmem_contract::Stats) -> StatsFile {
        StatsFile {
            summary: Some((&rt).into()),
            runtime: Some(rt),
            ..StatsFile::default()
        }
    }

    #[test]
    fn fractions_parse_and_reject_out_of_range() {
        assert_eq!(
            parse_fractions("0.5,0.25, 0.5").unwrap(),
            Fractions(vec![0.5, 0.25])
        );
        assert_eq!(parse_fractions("1").unwrap(), Fractions(vec![1.0]));
        assert!(parse_fractions("0").unwrap_err().contains("(0, 1]"));
        assert!(parse_fractions("1.5").unwrap_err().contains("out of range"));
        assert!(parse_fractions("half")
            .unwrap_err()
            .contains("not a number"));
        assert!(parse_fractions(",").unwrap_err().contains("at least one"));
    }

    #[test]
    fn sizes_parse_with_units() {
        assert_eq!(parse_wss("1GiB").unwrap(), 1 << 30);
        assert_eq!(parse_wss("512MiB").unwrap(), 512 << 20);
        assert_eq!(parse_wss("64m").unwrap(), 64 << 20);
        assert_eq!(parse_wss("1.5GiB").unwrap(), 3 << 29);
        assert_eq!(parse_wss("8192").unwrap(), 8192);
        assert!(parse_wss("12 parsecs")
            .unwrap_err()
            .contains("unknown unit `parsecs`"));
        assert!(parse_wss("GiB").unwrap_err().contains("bad size"));
        assert!(parse_wss("100").unwrap_err().contains("below one page"));
    }

    #[test]
    fn limits_are_whole_pages_of_the_fraction() {
        assert_eq!(limit_for(1 << 30, 0.5), 512 << 20);
        assert_eq!(limit_for(10_000, 0.25), 4096);
        assert_eq!(limit_for(1 << 30, 0.25) % 4096, 0);
    }

    #[test]
    fn command_line_defaults_and_lists() {
        let a = parse(&[
            "--workload",
            "seq,stride:10",
            "--local",
            "0.5,0.25",
            "--systems",
            "swap,zram",
        ])
        .unwrap();
        assert_eq!(a.workload.0, vec![Workload::Seq, Workload::Stride(10)]);
        assert_eq!(a.local.0, vec![0.5, 0.25]);
        assert_eq!(
            a.systems.0,
            vec![SystemKind::Local, SystemKind::Swap, SystemKind::Zram]
        );
        assert_eq!(a.wss, 1 << 30);
        let a = parse(&[
            "-w",
            "redis",
            "--farmem-arg=--prefetch=none",
            "--farmem-arg",
            "--evict=clock",
        ])
        .unwrap();
        assert_eq!(a.farmem_args, ["--prefetch=none", "--evict=clock"]);
        assert_eq!(a.systems.0, SystemKind::ALL.to_vec());
        let a = parse(&["-w", "mp"]).unwrap();
        assert_eq!(a.workload.0, vec![Workload::Mp]);
        assert_eq!((a.mp_worker_bytes, a.mp_workers), (256 << 20, 4));
        let a = parse(&[
            "-w",
            "mp",
            "--mp-worker-bytes",
            "64MiB",
            "--mp-workers",
            "2",
        ])
        .unwrap();
        assert_eq!((a.mp_worker_bytes, a.mp_workers), (64 << 20, 2));
        let a = parse(&["-w", "node-heap,jvm-heap"]).unwrap();
        assert_eq!(a.workload.0, vec![Workload::NodeHeap, Workload::JvmHeap]);
        assert_eq!((a.heap_bytes, a.passes), (1 << 30, 3));
        let a = parse(&[
            "-w",
            "jvm-heap",
            "--heap-bytes",
            "64MiB",
            "--passes",
            "1",
            "--local",
            "0.5",
            "--systems",
            "farmem,swap",
        ])
        .unwrap();
        assert_eq!((a.heap_bytes, a.passes), (64 << 20, 1));
        assert_eq!(
            a.systems.0,
            vec![SystemKind::Local, SystemKind::Farmem, SystemKind::Swap]
        );
        let a = parse(&["-w", "all"]).unwrap();
        assert!(
            a.workload.0.contains(&Workload::NodeHeap),
            "{:?}",
            a.workload
        );
        assert!(
            a.workload.0.contains(&Workload::JvmHeap),
            "{:?}",
            a.workload
        );
    }

    #[test]
    fn bad_flags_give_clear_errors() {
        let e = parse(&["--local", "0.5"]).unwrap_err();
        assert!(e.contains("--workload"), "{e}");
        let e = parse(&["-w", "seq", "--local", "2"]).unwrap_err();
        assert!(e.contains("out of range"), "{e}");
        let e = parse(&["-w", "stride:0"]).unwrap_err();
        assert!(e.contains("at least 2"), "{e}");
        let e = parse(&["-w", "seq", "--systems", "zswap"]).unwrap_err();
        assert!(e.contains("unknown system `zswap`"), "{e}");
        let e = parse(&["-w", "seq", "--wss", "1 furlong"]).unwrap_err();
        assert!(e.contains("unknown unit `furlong`"), "{e}");
        let e = parse(&["-w", "seq", "--passes", "0"]).unwrap_err();
        assert!(e.contains("--passes"), "{e}");
        let e = parse(&["-w", "mp", "--mp-worker-bytes", "100"]).unwrap_err();
        assert!(e.contains("below one page"), "{e}");
        let e = parse(&["-w", "mp", "--mp-workers", "0"]).unwrap_err();
        assert!(e.contains("--mp-workers"), "{e}");
        let e = parse(&["-w", "node-heap", "--heap-bytes", "100"]).unwrap_err();
        assert!(
            e.contains("--heap-bytes") && e.contains("below one page"),
            "{e}"
        );
        let e = parse(&["-w", "jvm-heap", "--heap-bytes", "2 stone"]).unwrap_err();
        assert!(e.contains("unknown unit `stone`"), "{e}");
        let e = parse(&["-w", "python-heap"]).unwrap_err();
        assert!(
            e.contains("unknown workload `python-heap`")
                && e.contains("node-heap")
                && e.contains("jvm-heap"),
            "{e}"
        );
        let e = parse(&["-w", "node-heap", "--heap-size", "64MiB"]).unwrap_err();
        assert!(e.contains("--heap-size"), "{e}");
    }

    #[test]
    fn farmem_fault_note_summarises_the_stats() {
        let mut rt = farmem_contract::Stats {
            faults_remote: 120,
            faults_pool_hit: 7,
            prefetched_pages: 10,
            prefetch_accuracy: 0.5,
            ..farmem_contract::Stats::default()
        };
        rt.latency.remote.p50_us = 23.0;
        let file = stats_file(rt);
        assert_eq!(
            farmem_fault_note(&file).unwrap(),
            "120 remote faults (handler p50 23 µs), 7 pool hits, prefetch accuracy 50%, \
             10 pages prefetched (0% evicted unused)"
        );
        assert_eq!(farmem_fault_note(&StatsFile::default()), None);
    }

    #[test]
    fn farmem_fault_note_counts_tier_faults_when_there_are_some() {
        let mut rt = farmem_contract::Stats {
            faults_remote: 3,
            faults_tier: 900,
            faults_pool_hit: 7,
            ..farmem_contract::Stats::default()
        };
        rt.latency.remote.p50_us = 23.0;
        rt.latency.tier.p50_us = 4.4;
        let file = stats_file(rt);
        assert_eq!(
            farmem_fault_note(&file).unwrap(),
            "3 remote faults (handler p50 23 µs), 900 tier faults (handler p50 4 µs), 7 pool hits"
        );
    }

    #[test]
    fn farmem_fault_note_says_what_became_of_prefetched_and_evicted_pages() {
        let rt = farmem_contract::Stats {
            faults_tier: 50,
            prefetched_pages: 200,
            prefetch_pollution: 50,
            evicted_sent_dirty: 3,
            tier_pages_written: 40,
            evicted_dropped_clean: 60,
            evicted_zero: 2,
            ..farmem_contract::Stats::default()
        };
        let file = stats_file(rt);
        let note = farmem_fault_note(&file).unwrap();
        assert!(
            note.ends_with(
                "200 pages prefetched (25% evicted unused), evicted 43 written back, \
                 60 unchanged, 2 all zero"
            ),
            "{note}"
        );
    }

    #[test]
    fn farmem_moved_bytes_are_the_bytes_sent_to_donors_and_into_the_tier() {
        let rt = farmem_contract::Stats {
            bytes_received: 4096,
            bytes_sent: 8192,
            ..farmem_contract::Stats::default()
        };
        let file = stats_file(rt);
        assert_eq!(farmem_moved_bytes(&file), Some(8192));
        assert_eq!(farmem_moved_bytes(&StatsFile::default()), None);
        // Host tier only (farmem's default): the pages written into the tier.
        let rt = farmem_contract::Stats {
            tier_pages_written: 3,
            faults_tier: 2,
            ..farmem_contract::Stats::default()
        };
        let file = stats_file(rt);
        assert_eq!(farmem_moved_bytes(&file), Some(3 * 4096));
        // Both: a tier in front of donors.
        let rt = farmem_contract::Stats {
            tier_pages_written: 2,
            bytes_sent: 4096,
            ..farmem_contract::Stats::default()
        };
        let file = stats_file(rt);
        assert_eq!(farmem_moved_bytes(&file), Some(3 * 4096));
    }

    #[test]
    fn farmem_tcp_needs_local_donor_in_farmem_run() {
        let new =
            "Usage: farmem run [OPTIONS] -- <PROGRAM>...\n      --local-donor <KIND>  What holds";
        let old = "Usage: farmem run [OPTIONS] -- <PROGRAM>...\n      --donor <HOST:PORT>";
        assert_eq!(farmem_run_lacks(SystemKind::FarmemTcp, new), None);
        assert_eq!(
            farmem_run_lacks(SystemKind::FarmemTcp, old),
            Some("--local-donor")
        );
        assert_eq!(farmem_run_lacks(SystemKind::Farmem, old), None);
    }

    #[test]
    fn farmem_tcp_is_chosen_with_systems_and_runs_by_default() {
        let a = parse(&["-w", "seq", "--systems", "farmem-tcp,farmem"]).unwrap();
        assert_eq!(
            a.systems.0,
            vec![SystemKind::Local, SystemKind::Farmem, SystemKind::FarmemTcp]
        );
        let a = parse(&["-w", "seq"]).unwrap();
        assert!(
            a.systems.0.contains(&SystemKind::FarmemTcp),
            "{:?}",
            a.systems
        );
        assert!(a.systems.0.contains(&SystemKind::Farmem), "{:?}", a.systems);
    }

    #[test]
    fn the_stats_file_is_read_from_disk() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("stats.json");
        assert_eq!(read_stats_file(&path), None);
        let file = StatsFile {
            pid: 42,
            ..StatsFile::default()
        };
        std::fs::write(&path, serde_json::to_string(&file).unwrap()).unwrap();
        assert_eq!(read_stats_file(&path), Some(file));
        std::fs::write(&path, "{\"pid\": 1}").unwrap();
        assert_eq!(read_stats_file(&path), None, "an incomplete file");
    }
}
