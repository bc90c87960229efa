//! `farmem-bench replicas`: what keeping two copies of every far slab costs, and what it buys,
//! measured in one run so every ratio compares figures taken on the same machine at the same
//! time. Three parts, each against three `farmem donor` child processes on loopback started by
//! the benchmark (child processes, so a kill -9 or a SIGSTOP is real):
//!
//! * **cost**: `farmem-bench compare --systems farmem --json` (this executable, as a child) on
//!   the compare workloads (default seq and redis) at one local fraction, with
//!   `--farmem-arg=--donor=…` ×3 and `--replicas` 1 or 2, interleaved over `--rounds` rounds
//!   (ABBA order, so a drift in machine load hits both alike), fresh donors for every run. Per
//!   workload: the medians and `slowdown` = replicas 2 ÷ replicas 1 of the time (throughput
//!   inverted for redis/memcached), target ≤ 1.15.
//! * **failover**: an in-process runtime (replicas 2, prefetching off, a 16-page write-back
//!   pool so reads go to the donors) fills a region, waits for write-back to settle, then the
//!   donor holding the first copy of the most slabs fails — `crash`: SIGKILL, `stall`: SIGSTOP
//!   — and every page is read back and checked. Reported: the runtime's `latency.failover` and
//!   `latency.remote` of that run and the loads as the program timed them. A wrong page fails
//!   the benchmark.
//! * **heal**: the same with a `--heal-size` region (default 1 GiB) at a small budget; one
//!   donor is killed and the time until every slab has two copies again (`last_heal_s`, from
//!   the death being declared) is reported with `heal_bytes` and seconds per GiB, once at the
//!   default heal rate (the paced time a user gets) and once unlimited (the mechanism's speed).

use std::process::{Command, ExitCode, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context};
use clap::Args;
use farmem_donor::{ChildDonor, ChildDonorCommand};
use farmem_runtime::{LatencySummary, Region, Runtime, RuntimeConfig, Stats, TierMode, PAGE_SIZE};
use hdrhistogram::Histogram;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use serde::Serialize;

use crate::compare::{parse_workload_list, Metric, Workload, WorkloadList};
use crate::mem::Pages;
use crate::units;

/// Donors every part starts (so one can fail while a slab keeps two copies elsewhere).
const DONORS: usize = 3;
/// The slowdown of replicas 2 over replicas 1 the issue allows.
const COST_TARGET: f64 = 1.15;
const GIB: f64 = (1u64 << 30) as f64;

/// Measure replicas: their cost on compare workloads (replicas 2 vs 1), the latency of a fault
/// served by the other copy after a donor crashes or stalls, and the time to copy a lost
/// donor's slabs again.
#[derive(Args, Debug)]
#[command(
    after_help = "What is measured (three loopback donors, started by the benchmark):
  cost      `farmem-bench compare --systems farmem` with --replicas 1 and 2, interleaved over
            --rounds rounds, fresh donors each run: medians and replicas-2 / replicas-1 slowdown
            (time; throughput for redis/memcached), target <= 1.15. Needs what compare needs
            (root for its memory cgroup, redis-server for redis).
  failover  in-process runtime, replicas 2, prefetch none: fill, settle, then the donor holding
            the first copy of the most slabs is killed (crash: SIGKILL) or stopped (stall:
            SIGSTOP); every page is read back and checked. Reports latency.failover (faults
            served by another copy) and latency.remote of the same run.
  heal      fill --heal-size, settle, kill one donor: last_heal_s (death declared -> every slab
            has two copies again), heal_bytes, seconds per GiB, at the default heal rate and
            unlimited.

Example (the full measurement, a few minutes on an idle machine):
  farmem-bench replicas --json > replicas.json"
)]
pub struct BenchReplicasArgs {
    /// Parts to run, comma-separated: cost, failover, heal, or all.
    #[arg(long, default_value = "all", value_parser = parse_parts)]
    pub parts: Parts,

    /// cost: rounds, each running replicas 1 and replicas 2 once (ABBA order).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=100))]
    pub rounds: u32,

    /// cost: compare workloads, comma-separated (see `farmem-bench compare --help`).
    #[arg(long, default_value = "seq,redis", value_parser = parse_workload_list)]
    pub workloads: WorkloadList,

    /// cost: fraction of the workload's peak memory allowed locally, in (0, 1].
    #[arg(long = "local", default_value_t = 0.5, value_parser = parse_fraction)]
    pub local: f64,

    /// cost: working set of seq/stride/random (compare's --wss).
    #[arg(long, default_value = "1GiB", value_parser = crate::compare::parse_wss)]
    pub wss: u64,

    /// cost: passes over the working set (compare's --passes).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..))]
    pub passes: u32,

    /// cost: keys loaded into redis/memcached (compare's --keys).
    #[arg(long, default_value_t = 600_000, value_parser = clap::value_parser!(u64).range(2..))]
    pub keys: u64,

    /// cost: requests of the key-value mix (compare's --ops).
    #[arg(long, default_value_t = 200_000, value_parser = clap::value_parser!(u64).range(1..))]
    pub ops: u64,

    /// cost: client connections of the key-value mix (compare's --clients).
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=256))]
    pub clients: u32,

    /// cost: a compare run longer than this (seconds) is killed (compare's --timeout).
    #[arg(long, default_value_t = 900, value_parser = clap::value_parser!(u64).range(1..))]
    pub timeout: u64,

    /// failover: failure kinds, comma-separated: crash (SIGKILL), stall (SIGSTOP).
    #[arg(long, default_value = "crash,stall", value_parser = parse_failures)]
    pub failures: Failures,

    /// failover: size of the region filled and read back.
    #[arg(long, default_value = "256MiB", value_parser = parse_region)]
    pub failover_region: u64,

    /// failover: the runtime's local memory budget (the rest of the region is on donors).
    #[arg(long, default_value = "32MiB", value_parser = parse_budget)]
    pub failover_budget: u64,

    /// failover: the runtime's request timeout (how long a stalled donor takes to be
    /// suspected; the runtime's default is 5s).
    #[arg(long, default_value = "5s", value_parser = parse_timeout)]
    pub request_timeout: Duration,

    /// failover: leave the fill's last pages dirty in local memory when the donor fails, so the
    /// read-back also writes them back (to the failed donor too: a stalled one holds
    /// write-back up until the request timeout). Default: they are written back first, so the
    /// read-back measures reads alone.
    #[arg(long)]
    pub failover_dirty: bool,

    /// heal: size of the region whose lost copies are made again.
    #[arg(long, default_value = "1GiB", value_parser = parse_region)]
    pub heal_size: u64,

    /// heal: the runtime's local memory budget.
    #[arg(long, default_value = "64MiB", value_parser = parse_budget)]
    pub heal_budget: u64,

    /// heal: give up waiting for re-replication after this long (then reported as not done).
    #[arg(long, default_value = "600s", value_parser = parse_timeout)]
    pub heal_timeout: Duration,

    /// Slab size of the donors (failover and heal: many slabs spread over the three donors).
    #[arg(long, default_value = "16MiB", value_parser = parse_slab)]
    pub slab_size: u64,

    /// Capacity of each donor (default: enough for one copy of every slab of the largest
    /// region or working set, plus four slabs).
    #[arg(long, value_parser = units::parse_size)]
    pub donor_capacity: Option<u64>,

    /// Print every figure as one JSON object (the table then goes to stderr).
    #[arg(long)]
    pub json: bool,
}

/// Which parts run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Parts {
    pub cost: bool,
    pub failover: bool,
    pub heal: bool,
}

fn parse_parts(text: &str) -> Result<Parts, String> {
    let mut p = Parts {
        cost: false,
        failover: false,
        heal: false,
    };
    for part in text.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        match part {
            "cost" => p.cost = true,
            "failover" => p.failover = true,
            "heal" => p.heal = true,
            "all" => (p.cost, p.failover, p.heal) = (true, true, true),
            other => {
                return Err(format!(
                    "unknown part `{other}`: expected cost, failover, heal or all"
                ))
            }
        }
    }
    if !(p.cost || p.failover || p.heal) {
        return Err("--parts needs at least one of cost, failover, heal".into());
    }
    Ok(p)
}

/// How the failed donor fails.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Failure {
    /// SIGKILL: the kernel resets its connections at once.
    Crash,
    /// SIGSTOP: connections stay open, nothing answers.
    Stall,
}

impl Failure {
    fn name(self) -> &'static str {
        match self {
            Failure::Crash => "crash",
            Failure::Stall => "stall",
        }
    }
}

/// The value of `--failures`, in the order given.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Failures(pub Vec<Failure>);

fn parse_failures(text: &str) -> Result<Failures, String> {
    let mut out = Vec::new();
    for part in text.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let f = match part {
            "crash" => Failure::Crash,
            "stall" => Failure::Stall,
            other => {
                return Err(format!(
                    "unknown failure `{other}`: expected crash (kill -9) or stall (SIGSTOP)"
                ))
            }
        };
        if !out.contains(&f) {
            out.push(f);
        }
    }
    if out.is_empty() {
        return Err("--failures needs crash, stall or both".into());
    }
    Ok(Failures(out))
}

fn parse_fraction(text: &str) -> Result<f64, String> {
    let f: f64 = text.trim().parse().map_err(|_| {
        format!("`{text}` is not a number: --local takes one fraction of the peak, e.g. 0.5")
    })?;
    if !(f > 0.0 && f <= 1.0) {
        return Err(format!(
            "--local {text} is out of range: the fraction must be in (0, 1], e.g. 0.5"
        ));
    }
    Ok(f)
}

/// A region size: whole pages, at least 1 MiB (a few slabs' worth of pages at the smallest).
fn parse_region(text: &str) -> Result<u64, String> {
    let b = units::parse_size(text)?;
    if b < 1 << 20 || b % PAGE_SIZE as u64 != 0 {
        return Err(format!(
            "region size `{text}` must be whole 4 KiB pages and at least 1MiB"
        ));
    }
    Ok(b)
}

/// A budget: at least the runtime's smallest.
fn parse_budget(text: &str) -> Result<u64, String> {
    let b = units::parse_size(text)?;
    let min = farmem_runtime::MIN_BUDGET_BYTES;
    if b < min {
        return Err(format!(
            "budget `{text}` is below the runtime's minimum ({min} bytes)"
        ));
    }
    Ok(b)
}

fn parse_timeout(text: &str) -> Result<Duration, String> {
    let d = units::parse_duration(text)?;
    if d < Duration::from_millis(100) {
        return Err(format!("`{text}` is too short: give at least 100ms"));
    }
    Ok(d)
}

fn parse_slab(text: &str) -> Result<u64, String> {
    let b = units::parse_size(text)?;
    if b < 1 << 20 || b % PAGE_SIZE as u64 != 0 {
        return Err(format!(
            "slab size `{text}` must be whole 4 KiB pages and at least 1MiB"
        ));
    }
    Ok(b)
}

// ---------------------------------------------------------------------------------------------
// Donors

/// Three child donors on loopback; dropping them kills them (stopped ones included: SIGKILL
/// ends a stopped process).
struct Donors {
    kids: Vec<ChildDonor>,
    addrs: Vec<String>,
}

impl Donors {
    fn start(capacity: u64, slab: u64) -> anyhow::Result<Donors> {
        let bin = crate::farmem_bin()?;
        let mut kids = Vec::new();
        for _ in 0..DONORS {
            let kid = ChildDonorCommand::new(&bin)
                .args([
                    "--capacity".to_string(),
                    capacity.to_string(),
                    "--slab-size".to_string(),
                    slab.to_string(),
                ])
                // Errors only: every runtime start has each donor warn about the refused
                // register of its second connection (which then attaches), and dropped clients
                // are routine here.
                .env("FARMEM_LOG", "error")
                .spawn()
                .context("starting a loopback donor (farmem donor)")?;
            kids.push(kid);
        }
        let addrs = kids.iter().map(|k| k.addr().to_string()).collect();
        Ok(Donors { kids, addrs })
    }

    /// Sends `sig` to donor `i`.
    fn signal(&self, i: usize, sig: Signal) -> anyhow::Result<()> {
        kill(self.pid(i), sig).with_context(|| format!("sending {sig} to donor {}", self.addrs[i]))
    }

    fn pid(&self, i: usize) -> Pid {
        Pid::from_raw(self.kids[i].pid() as i32)
    }

    /// Kills donor `i` and returns a thread that ends when the process has exited (not reaping
    /// it: the [`ChildDonor`] does) and says how long that took. A killed process keeps its
    /// sockets open until its memory is freed, so for that long it looks stalled, not crashed.
    fn kill9(&self, i: usize) -> anyhow::Result<std::thread::JoinHandle<Option<Duration>>> {
        let pid = self.pid(i);
        let t0 = Instant::now();
        self.signal(i, Signal::SIGKILL)?;
        Ok(std::thread::spawn(move || {
            use nix::sys::wait::{waitid, Id, WaitPidFlag};
            waitid(Id::Pid(pid), WaitPidFlag::WEXITED | WaitPidFlag::WNOWAIT)
                .ok()
                .map(|_| t0.elapsed())
        }))
    }
}

/// Each donor's capacity: one copy of every slab of the largest region (a donor holds at most
/// one copy of a slab), plus four slabs, capped at this machine's memory (the donor refuses
/// more).
fn donor_capacity(args: &BenchReplicasArgs) -> u64 {
    if let Some(c) = args.donor_capacity {
        return c;
    }
    let mut need = 0u64;
    if args.parts.cost {
        // redis/memcached: about 2 KiB of server memory per 1 KiB value.
        need = need.max(args.wss).max(args.keys.saturating_mul(2048));
    }
    if args.parts.failover {
        need = need.max(args.failover_region);
    }
    if args.parts.heal {
        need = need.max(args.heal_size);
    }
    let want = need.div_ceil(args.slab_size).saturating_add(4) * args.slab_size;
    match mem_total_bytes() {
        Some(total) => want.min(total / args.slab_size * args.slab_size),
        None => want,
    }
}

fn mem_total_bytes() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

// ---------------------------------------------------------------------------------------------
// Cost: compare with replicas 1 and 2

/// One workload's figures for one replica count, one value per round.
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct CostRuns {
    pub wall_s: Vec<f64>,
    pub throughput_ops: Vec<f64>,
    pub avg_access_us: Vec<f64>,
}

/// The cost of replicas on one workload.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct CostRow {
    pub workload: String,
    /// The figure compared: `wall_s` (lower is better) or `throughput_ops` (higher).
    pub metric: &'static str,
    pub replicas1: CostRuns,
    pub replicas2: CostRuns,
    pub replicas1_median: f64,
    pub replicas2_median: f64,
    /// How much slower replicas 2 is: time ratio 2 ÷ 1, or throughput ratio 1 ÷ 2.
    pub slowdown: f64,
    pub target: f64,
    pub within_target: bool,
}

/// The cost part's result.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct CostReport {
    pub local_fraction: f64,
    pub rounds: u32,
    pub donors: usize,
    /// A host `farmem node` was listening: compare's farmem used it in front of the donors.
    pub host_node: bool,
    pub workloads: Vec<CostRow>,
}

/// The figure `w` is judged by in this benchmark: time for the microbenchmarks and programs,
/// throughput for the key-value servers.
fn cost_metric(w: Workload) -> &'static str {
    match w.metric() {
        Metric::Throughput => "throughput_ops",
        Metric::AccessTime | Metric::Completion => "wall_s",
    }
}

fn median(v: &[f64]) -> f64 {
    let mut s: Vec<f64> = v.iter().copied().filter(|x| x.is_finite()).collect();
    if s.is_empty() {
        return f64::NAN;
    }
    s.sort_by(f64::total_cmp);
    let n = s.len();
    if n % 2 == 1 {
        s[n / 2]
    } else {
        (s[n / 2 - 1] + s[n / 2]) / 2.0
    }
}

/// Runs `farmem-bench compare` once with `replicas`, against fresh donors; returns its rows.
fn compare_once(
    args: &BenchReplicasArgs,
    replicas: usize,
    capacity: u64,
) -> anyhow::Result<Vec<serde_json::Value>> {
    let donors = Donors::start(capacity, args.slab_size)?;
    let exe = std::env::current_exe().context("cannot find the farmem-bench executable")?;
    let workloads: Vec<String> = args.workloads.0.iter().map(|w| w.to_string()).collect();
    let mut cmd = Command::new(&exe);
    cmd.arg("compare")
        .args(["--systems", "farmem", "--json"])
        .args(["--workload", &workloads.join(",")])
        .args(["--local", &args.local.to_string()])
        .args(["--wss", &args.wss.to_string()])
        .args(["--passes", &args.passes.to_string()])
        .args(["--keys", &args.keys.to_string()])
        .args(["--ops", &args.ops.to_string()])
        .args(["--clients", &args.clients.to_string()])
        .args(["--timeout", &args.timeout.to_string()]);
    for a in &donors.addrs {
        cmd.arg(format!("--farmem-arg=--donor={a}"));
    }
    cmd.arg(format!("--farmem-arg=--replicas={replicas}"));
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("running {} compare", exe.display()))?;
    drop(donors);
    let err = String::from_utf8_lossy(&out.stderr);
    let tail = || {
        let lines: Vec<&str> = err.lines().collect();
        lines[lines.len().saturating_sub(15)..].join("\n")
    };
    let rows: serde_json::Value = serde_json::from_slice(&out.stdout).with_context(|| {
        format!(
            "farmem-bench compare (replicas {replicas}) printed no JSON ({}); its stderr ends:\n{}",
            out.status,
            tail()
        )
    })?;
    let rows = rows.as_array().cloned().unwrap_or_default();
    for w in &args.workloads.0 {
        let name = w.to_string();
        let row = rows
            .iter()
            .find(|r| r["system"] == "farmem" && r["workload"] == name.as_str());
        let metric = cost_metric(*w);
        ensure!(
            row.is_some_and(|r| r[metric].is_number()),
            "farmem-bench compare (replicas {replicas}) gave no {metric} for farmem on {name} \
             ({}); its stderr ends:\n{}",
            out.status,
            tail()
        );
    }
    Ok(rows)
}

fn cost(args: &BenchReplicasArgs, capacity: u64) -> anyhow::Result<CostReport> {
    let mut runs: Vec<[CostRuns; 2]> = vec![Default::default(); args.workloads.0.len()];
    for round in 0..args.rounds {
        // ABBA: 1,2 then 2,1, so a steady drift in machine load favours neither.
        let order: [usize; 2] = if round % 2 == 0 { [1, 2] } else { [2, 1] };
        for replicas in order {
            eprintln!(
                "replicas: cost round {}/{}: compare with --replicas {replicas} ({})",
                round + 1,
                args.rounds,
                args.workloads
                    .0
                    .iter()
                    .map(|w| w.to_string())
                    .collect::<Vec<_>>()
                    .join(",")
            );
            let t0 = Instant::now();
            let rows = compare_once(args, replicas, capacity)?;
            for (i, w) in args.workloads.0.iter().enumerate() {
                let name = w.to_string();
                let Some(r) = rows
                    .iter()
                    .find(|r| r["system"] == "farmem" && r["workload"] == name.as_str())
                else {
                    continue;
                };
                let runs = &mut runs[i][replicas - 1];
                let num = |k: &str| r[k].as_f64().unwrap_or(f64::NAN);
                runs.wall_s.push(num("wall_s"));
                runs.throughput_ops.push(num("throughput_ops"));
                runs.avg_access_us.push(num("avg_access_us"));
            }
            eprintln!(
                "replicas: cost round {}/{}: --replicas {replicas} done in {:.0} s",
                round + 1,
                args.rounds,
                t0.elapsed().as_secs_f64()
            );
        }
    }
    let workloads = args
        .workloads
        .0
        .iter()
        .zip(runs)
        .map(|(w, [r1, r2])| {
            let metric = cost_metric(*w);
            let pick = |r: &CostRuns| match metric {
                "throughput_ops" => median(&r.throughput_ops),
                _ => median(&r.wall_s),
            };
            let (m1, m2) = (pick(&r1), pick(&r2));
            let slowdown = if metric == "throughput_ops" {
                m1 / m2
            } else {
                m2 / m1
            };
            CostRow {
                workload: w.to_string(),
                metric,
                replicas1: r1,
                replicas2: r2,
                replicas1_median: m1,
                replicas2_median: m2,
                slowdown,
                target: COST_TARGET,
                within_target: slowdown <= COST_TARGET,
            }
        })
        .collect();
    Ok(CostReport {
        local_fraction: args.local,
        rounds: args.rounds,
        donors: DONORS,
        host_node: farmem_node::default_socket_path().exists(),
        workloads,
    })
}

// ---------------------------------------------------------------------------------------------
// Failover and heal: an in-process runtime against child donors

/// The runtime both in-process parts start: the three donors, no host tier (the donors are
/// what is measured), prefetching off (every read-back page is one demand fault).
fn runtime_config(addrs: &[String], budget: u64) -> RuntimeConfig {
    RuntimeConfig {
        budget_bytes: budget,
        donors: addrs.to_vec(),
        replicas: Some(2),
        prefetch: "none".into(),
        tier: TierMode::Off,
        ..RuntimeConfig::default()
    }
}

/// What page `p` holds after the fill (never zero, so every page goes to the donors).
fn page_word(p: usize) -> u64 {
    (p as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1
}

/// Maps `bytes`, writes every page, and waits until write-back has settled (every page beyond
/// the budget is on its donors).
fn fill(rt: &Arc<Runtime>, bytes: u64) -> anyhow::Result<(Region, Stats)> {
    let region = rt
        .map(bytes as usize)
        .context("mapping the benchmark region")?;
    let mem = Pages::from(&region);
    for p in 0..region.len() / PAGE_SIZE {
        mem.stamp(p, page_word(p));
    }
    let settled = crate::measure::quiesce(rt);
    ensure!(
        settled.fetch_errors == 0 && settled.send_errors == 0,
        "the fill did not go cleanly to the donors: {:?}",
        settled.last_error
    );
    Ok((region, settled))
}

/// The donor holding the first copy (the one reads go to) of the most slabs.
fn busiest_first_copy(rt: &Runtime) -> (usize, u64, u64) {
    let firsts = rt.first_copies_per_donor();
    let slabs: u64 = firsts.iter().sum();
    let (i, n) = firsts
        .iter()
        .copied()
        .enumerate()
        .max_by_key(|(_, n)| *n)
        .unwrap_or((0, 0));
    (i, n, slabs)
}

/// One failover run's figures.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct FailoverRow {
    pub failure: &'static str,
    pub region_bytes: u64,
    pub budget_bytes: u64,
    /// `--failover-dirty`: pages written in the fill were still in local memory, unsent.
    pub dirty_at_failure: bool,
    /// Far slabs, and those whose first copy was on the failed donor.
    pub slabs: u64,
    pub victim_first_copies: u64,
    /// Pages read back, and how many held something else than was written (must be 0).
    pub pages: u64,
    pub wrong_pages: u64,
    /// Time to read every page back.
    pub read_s: f64,
    /// The runtime's figures for the read-back: faults served by another copy after the
    /// first failed or was slow, and ordinary remote faults, in the same run.
    pub failover: LatencySummary,
    pub remote: LatencySummary,
    /// Every load as the program timed it (µs).
    pub load_p50_us: f64,
    pub load_p99_us: f64,
    pub load_max_us: f64,
    /// crash: from the SIGKILL to the donor process having exited (its sockets closed), ms.
    pub victim_exit_ms: Option<f64>,
    /// Donors the runtime had declared dead when the read-back ended.
    pub dead_donors: Vec<String>,
    pub fetch_errors: u64,
}

fn hist() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 600_000_000_000, 3).expect("valid bounds")
}

fn failover_once(
    args: &BenchReplicasArgs,
    kind: Failure,
    capacity: u64,
) -> anyhow::Result<FailoverRow> {
    let donors = Donors::start(capacity, args.slab_size)?;
    let rt = Runtime::start(RuntimeConfig {
        request_timeout: args.request_timeout,
        ..runtime_config(&donors.addrs, args.failover_budget)
    })
    .context("starting the runtime")?;
    let (region, _) = fill(&rt, args.failover_region)?;
    let mem = Pages::from(&region);
    let pages = region.len() / PAGE_SIZE;
    if !args.failover_dirty {
        // Reading twice the budget from the start pushes the fill's dirty last pages out of
        // local memory and the pool (FIFO), so they are on the donors before one fails.
        let push = (2 * args.failover_budget as usize / PAGE_SIZE).min(pages);
        for p in 0..push {
            mem.word(p);
        }
        crate::measure::quiesce(&rt);
    }
    let (victim, victim_first_copies, slabs) = busiest_first_copy(&rt);
    let before = rt.stats();
    let exited = match kind {
        Failure::Crash => Some(donors.kill9(victim)?),
        Failure::Stall => {
            donors.signal(victim, Signal::SIGSTOP)?;
            None
        }
    };
    let mut h = hist();
    let mut wrong = 0u64;
    let t0 = Instant::now();
    for p in 0..pages {
        let t = Instant::now();
        let got = mem.word(p);
        let _ = h.record((t.elapsed().as_nanos() as u64).max(1));
        wrong += u64::from(got != page_word(p));
    }
    let read_s = t0.elapsed().as_secs_f64();
    let after = rt.stats();
    let victim_exit_ms = exited
        .and_then(|t| t.join().ok().flatten())
        .map(|d| d.as_secs_f64() * 1000.0);
    // Kill the stopped donor before the runtime goes, so its shutdown waits on no request.
    drop(donors);
    drop(region);
    drop(rt);
    ensure!(
        after.latency.remote.count > before.latency.remote.count,
        "no page was read back from the donors: the region fitted in the budget"
    );
    let us = |q: f64| h.value_at_quantile(q) as f64 / 1000.0;
    Ok(FailoverRow {
        failure: kind.name(),
        region_bytes: args.failover_region,
        budget_bytes: args.failover_budget,
        dirty_at_failure: args.failover_dirty,
        slabs,
        victim_first_copies,
        pages: pages as u64,
        wrong_pages: wrong,
        read_s,
        failover: after.latency.failover.clone(),
        remote: after.latency.remote.clone(),
        load_p50_us: us(0.5),
        load_p99_us: us(0.99),
        load_max_us: h.max() as f64 / 1000.0,
        victim_exit_ms,
        dead_donors: after.dead_donors.clone(),
        fetch_errors: after.fetch_errors,
    })
}

/// One re-replication run's figures.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct HealRow {
    /// The pace (`heal_rate_bytes`); null: unlimited.
    pub heal_rate_bytes: Option<u64>,
    pub region_bytes: u64,
    pub budget_bytes: u64,
    pub slabs: u64,
    /// Slab copies the killed donor held.
    pub victim_copies: u64,
    /// From the kill to the runtime declaring the donor dead.
    pub detect_s: Option<f64>,
    /// From the death being declared to every slab having two copies again (the runtime's
    /// `last_heal_s`); null: not done within --heal-timeout.
    pub last_heal_s: Option<f64>,
    pub heal_bytes: u64,
    pub slabs_healed: u64,
    pub slabs_degraded: u64,
    /// `last_heal_s` per GiB copied.
    pub s_per_gib: Option<f64>,
    pub dead_donors: Vec<String>,
}

fn heal_once(
    args: &BenchReplicasArgs,
    rate: Option<u64>,
    capacity: u64,
) -> anyhow::Result<HealRow> {
    let donors = Donors::start(capacity, args.slab_size)?;
    let mut cfg = runtime_config(&donors.addrs, args.heal_budget);
    cfg.heal_rate_bytes = rate.unwrap_or(u64::MAX);
    let rt = Runtime::start(cfg).context("starting the runtime")?;
    let (region, settled) = fill(&rt, args.heal_size)?;
    ensure!(
        settled.heal_bytes == 0 && settled.last_heal_s.is_none(),
        "re-replication ran before any donor failed ({} bytes): a donor was lost during the fill",
        settled.heal_bytes
    );
    let per = rt.slabs_per_donor();
    let (victim, victim_copies) = per
        .iter()
        .copied()
        .enumerate()
        .max_by_key(|(_, n)| *n)
        .unwrap_or((0, 0));
    let slabs = rt.first_copies_per_donor().iter().sum();
    let t0 = Instant::now();
    let _exited = donors.kill9(victim)?;
    let deadline = t0 + args.heal_timeout;
    let mut detect_s = None;
    let s = loop {
        let s = rt.stats();
        if detect_s.is_none() && !s.dead_donors.is_empty() {
            detect_s = Some(t0.elapsed().as_secs_f64());
        }
        if s.last_heal_s.is_some() || Instant::now() >= deadline {
            break s;
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    drop(donors);
    drop(region);
    drop(rt);
    Ok(HealRow {
        heal_rate_bytes: rate,
        region_bytes: args.heal_size,
        budget_bytes: args.heal_budget,
        slabs,
        victim_copies,
        detect_s,
        last_heal_s: s.last_heal_s,
        heal_bytes: s.heal_bytes,
        slabs_healed: s.slabs_healed,
        slabs_degraded: s.slabs_degraded,
        s_per_gib: s
            .last_heal_s
            .filter(|_| s.heal_bytes > 0)
            .map(|t| t / (s.heal_bytes as f64 / GIB)),
        dead_donors: s.dead_donors,
    })
}

// ---------------------------------------------------------------------------------------------
// Report

/// Every figure of one run (`--json`).
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct ReplicasReport {
    pub donor_capacity_bytes: u64,
    pub slab_bytes: u64,
    pub cost: Option<CostReport>,
    pub failover: Vec<FailoverRow>,
    pub heal: Vec<HealRow>,
}

fn opt(v: Option<f64>, digits: usize) -> String {
    match v {
        Some(x) if x.is_finite() => format!("{x:.digits$}"),
        _ => "-".into(),
    }
}

fn mib(b: u64) -> String {
    format!("{} MiB", b >> 20)
}

/// The readable table.
fn human(r: &ReplicasReport) -> String {
    let mut out = String::new();
    if let Some(c) = &r.cost {
        out += &format!(
            "== cost of replicas: farmem-bench compare, farmem with 3 loopback donors, local {}, median of {} rounds\n",
            c.local_fraction, c.rounds
        );
        if c.host_node {
            out += "   (a host farmem node was listening: farmem used it in front of the donors)\n";
        }
        out += &format!(
            "{:<10} {:<15} {:>12} {:>12} {:>9}  target <= {COST_TARGET:.2}\n",
            "workload", "metric", "replicas 1", "replicas 2", "slowdown"
        );
        for w in &c.workloads {
            out += &format!(
                "{:<10} {:<15} {:>12.3} {:>12.3} {:>9.3}  {}\n",
                w.workload,
                w.metric,
                w.replicas1_median,
                w.replicas2_median,
                w.slowdown,
                if w.within_target { "ok" } else { "OVER" }
            );
        }
    }
    if !r.failover.is_empty() {
        out += "\n== failover: replicas 2, the donor with the most first copies fails, every page read back\n";
        out += &format!(
            "{:<6} {:>9} {:>8} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10} {:>8} {:>6}  dead donors\n",
            "kind",
            "failovers",
            "fo p50",
            "fo p99",
            "fo max",
            "remote p50",
            "load p50",
            "load p99",
            "load max",
            "read s",
            "wrong"
        );
        for f in &r.failover {
            out += &format!(
                "{:<6} {:>9} {:>8.0} {:>10.0} {:>10.0} {:>10.1} {:>10.1} {:>10.1} {:>10.0} {:>8.2} {:>6}  {}\n",
                f.failure,
                f.failover.count,
                f.failover.p50_us,
                f.failover.p99_us,
                f.failover.max_us,
                f.remote.p50_us,
                f.load_p50_us,
                f.load_p99_us,
                f.load_max_us,
                f.read_s,
                f.wrong_pages,
                f.dead_donors.join("; ")
            );
        }
        out += "   (µs; fo = faults served by the other copy; load = every read-back load as the program timed it)\n";
        for f in &r.failover {
            if let Some(ms) = f.victim_exit_ms {
                out += &format!(
                    "   {}: the killed donor took {ms:.0} ms to exit (its connections stay open until then)\n",
                    f.failure
                );
            }
        }
    }
    if !r.heal.is_empty() {
        out += "\n== re-replication after a donor is killed (replicas 2, 3 donors)\n";
        out += &format!(
            "{:<12} {:>10} {:>9} {:>12} {:>12} {:>9} {:>8}\n",
            "heal rate", "region", "detect s", "last_heal_s", "heal bytes", "s per GiB", "healed"
        );
        for h in &r.heal {
            out += &format!(
                "{:<12} {:>10} {:>9} {:>12} {:>12} {:>9} {:>8}\n",
                h.heal_rate_bytes
                    .map(|b| format!("{}/s", mib(b)))
                    .unwrap_or_else(|| "unlimited".into()),
                mib(h.region_bytes),
                opt(h.detect_s, 2),
                opt(h.last_heal_s, 2),
                mib(h.heal_bytes),
                opt(h.s_per_gib, 2),
                h.slabs_healed
            );
        }
    }
    out
}

/// Runs the benchmark.
pub fn run(args: BenchReplicasArgs) -> anyhow::Result<ExitCode> {
    if args.parts.failover || args.parts.heal {
        for (what, region, budget) in [
            ("failover", args.failover_region, args.failover_budget),
            ("heal", args.heal_size, args.heal_budget),
        ] {
            if region < 2 * budget {
                bail!(
                    "the {what} region ({}) must be at least twice its budget ({}): pages beyond \
                     the budget are what goes to the donors",
                    mib(region),
                    mib(budget)
                );
            }
        }
    }
    let capacity = donor_capacity(&args);
    let mut report = ReplicasReport {
        donor_capacity_bytes: capacity,
        slab_bytes: args.slab_size,
        cost: None,
        failover: Vec::new(),
        heal: Vec::new(),
    };
    if args.parts.cost {
        report.cost = Some(cost(&args, capacity)?);
    }
    if args.parts.failover {
        for &kind in &args.failures.0 {
            eprintln!(
                "replicas: failover, {}: {} region, {} budget",
                kind.name(),
                mib(args.failover_region),
                mib(args.failover_budget)
            );
            let row = failover_once(&args, kind, capacity)
                .with_context(|| format!("failover benchmark ({})", kind.name()))?;
            ensure!(
                row.wrong_pages == 0,
                "after a donor {}, {} of {} pages read back wrong (a farmem bug)",
                kind.name(),
                row.wrong_pages,
                row.pages
            );
            report.failover.push(row);
        }
    }
    if args.parts.heal {
        let paced = RuntimeConfig::default().heal_rate_bytes;
        for rate in [Some(paced), None] {
            eprintln!(
                "replicas: heal, {} region, heal rate {}",
                mib(args.heal_size),
                rate.map(|b| format!("{}/s", mib(b)))
                    .unwrap_or_else(|| "unlimited".into())
            );
            report
                .heal
                .push(heal_once(&args, rate, capacity).context("heal benchmark")?);
        }
    }
    let table = human(&report);
    if args.json {
        eprint!("{table}");
        println!(
            "{}",
            serde_json::to_string_pretty(&report).context("writing the JSON report")?
        );
    } else {
        print!("{table}");
    }
    let unhealed = report
        .heal
        .iter()
        .filter(|h| h.last_heal_s.is_none())
        .count();
    if unhealed > 0 {
        eprintln!(
            "farmem-bench: {unhealed} re-replication run(s) did not finish within --heal-timeout"
        );
        return Ok(ExitCode::from(1));
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser, Debug)]
    struct Wrapper {
        #[command(flatten)]
        args: BenchReplicasArgs,
    }

    fn parse(args: &[&str]) -> Result<BenchReplicasArgs, String> {
        let mut argv = vec!["replicas"];
        argv.extend_from_slice(args);
        Wrapper::try_parse_from(argv)
            .map(|w| w.args)
            .map_err(|e| e.to_string())
    }

    #[test]
    fn defaults_are_the_issue_s_measurement() {
        let a = parse(&[]).unwrap();
        assert_eq!(
            a.parts,
            Parts {
                cost: true,
                failover: true,
                heal: true
            }
        );
        assert_eq!(a.rounds, 3);
        assert_eq!(a.local, 0.5);
        assert_eq!(a.workloads.0, vec![Workload::Seq, Workload::Redis]);
        assert_eq!(a.failures.0, vec![Failure::Crash, Failure::Stall]);
        assert_eq!(a.heal_size, 1 << 30);
        assert_eq!(a.failover_region, 256 << 20);
    }

    #[test]
    fn bad_flags_give_clear_errors() {
        let e = parse(&["--parts", "speed"]).unwrap_err();
        assert!(e.contains("unknown part `speed`"), "{e}");
        let e = parse(&["--failures", "flood"]).unwrap_err();
        assert!(e.contains("unknown failure `flood`"), "{e}");
        let e = parse(&["--local", "2"]).unwrap_err();
        assert!(e.contains("out of range"), "{e}");
        let e = parse(&["--rounds", "0"]).unwrap_err();
        assert!(e.contains("--rounds"), "{e}");
        let e = parse(&["--heal-size", "1 parsec"]).unwrap_err();
        assert!(e.contains("unknown unit `parsec`"), "{e}");
        let e = parse(&["--heal-size", "4KiB"]).unwrap_err();
        assert!(e.contains("at least 1MiB"), "{e}");
        let e = parse(&["--workloads", "tetris"]).unwrap_err();
        assert!(e.contains("tetris"), "{e}");
        let e = parse(&["--request-timeout", "1ms"]).unwrap_err();
        assert!(e.contains("too short"), "{e}");
    }

    #[test]
    fn slowdown_is_time_ratio_or_inverse_throughput_ratio() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), 2.5);
        assert!(median(&[f64::NAN]).is_nan());
        assert_eq!(cost_metric(Workload::Seq), "wall_s");
        assert_eq!(cost_metric(Workload::Redis), "throughput_ops");
    }

    #[test]
    fn capacity_holds_one_copy_of_the_largest_region() {
        let a = parse(&[
            "--parts",
            "heal",
            "--heal-size",
            "64MiB",
            "--slab-size",
            "4MiB",
        ])
        .unwrap();
        // 64 MiB + 4 slabs (well below any machine's memory, so not capped).
        assert_eq!(donor_capacity(&a), (64 + 16) << 20);
        let a = parse(&["--donor-capacity", "3GiB"]).unwrap();
        assert_eq!(donor_capacity(&a), 3 << 30);
    }
}
