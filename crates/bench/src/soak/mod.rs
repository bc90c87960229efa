//! `farmem-bench soak`: real programs that check their own memory, run again and again under
//! `farmem run` on a host tier and three donors in network namespaces, while failures are
//! injected one at a time on a schedule drawn from a seed. The verdict: every program's own
//! verdict and output (against a run without farmem), and farmem's counters summed over every
//! run (`state_lost_pages`, `pages_lost`, seal rejections), and each donor death a runtime
//! reported matched to the failure that explains it.
//!
//! A seed fixes the failures and when they happen, not the programs' interleaving with them: a
//! failing seed replays the same schedule, which makes the failure likely again, not certain.
//!
//! SIGINT or SIGTERM ends the runs in progress and removes what the soak set up (namespaces,
//! donors, node, work directory), with no verdict and exit status 128 + the signal.

mod cluster;
mod failures;
mod programs;
mod repaired;
mod verdict;

use std::process::ExitCode;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

use cluster::Cluster;
use failures::Kind;
use programs::Name;
use verdict::{Injected, Run};

/// Donors of the soak's cluster (each in a network namespace of its own).
const DONORS: usize = 3;
/// The longest the soak waits for the runs to repair one failure before the next hits a
/// donor (a heal of the soak's few hundred MiB takes seconds; this is for a stuck one).
const REPAIR_LIMIT: Duration = Duration::from_secs(120);

/// Run a mix of self-checking programs under farmem for N minutes while injecting failures.
///
/// Needs root (network namespaces) and the programs: stress-ng, python3, a JDK, a C compiler
/// (scripts/setup.sh installs them). Prints the seed first; `--seed S` replays a run's
/// failures. Exits 0 when every run was right and nothing was lost, 1 otherwise.
#[derive(clap::Args)]
pub struct SoakArgs {
    /// How long to run, in minutes (a fraction is allowed: 2.5). Runs in progress at the end
    /// are finished and judged.
    #[arg(long, default_value_t = 10.0)]
    minutes: f64,
    /// Seed of the failure schedule (default: a random one, printed).
    #[arg(long)]
    seed: Option<u64>,
    /// Local memory of each program (`farmem run --local-mem`).
    #[arg(long, default_value = "32MiB", value_parser = crate::units::parse_size)]
    local_mem: u64,
    /// Programs to run, comma-separated (default: all).
    #[arg(long, value_enum, value_delimiter = ',')]
    programs: Option<Vec<Name>>,
    /// Failures to inject, comma-separated (default: all).
    #[arg(long, value_enum, value_delimiter = ',')]
    failures: Option<Vec<Kind>>,
    /// Inject no failure (the programs alone under farmem: a baseline for a failing soak).
    #[arg(long, conflicts_with = "failures")]
    no_failures: bool,
    /// Print the verdict as JSON on stdout (keys: seed, passed, failures_injected,
    /// wrong_outputs, state_lost_pages, pages_lost, seal_rejected, failures_misreported, …).
    #[arg(long)]
    json: bool,
}

/// The signal (SIGINT or SIGTERM) that interrupted the soak, or 0: runs in progress are
/// killed, none and no failure starts after it, and the soak cleans up (namespaces, donors,
/// node, work directory) and exits with 128 + the signal, without a verdict.
static INTERRUPTED: AtomicI32 = AtomicI32::new(0);

/// Whether SIGINT or SIGTERM came.
pub(crate) fn interrupted() -> bool {
    INTERRUPTED.load(Ordering::SeqCst) != 0
}

/// Catches SIGINT and SIGTERM: the first interrupts the soak ([`INTERRUPTED`]), a second
/// ends the process at once (what it set up is then left; the next soak's namespaces remove
/// a dead process's leftovers).
fn catch_interrupts() -> anyhow::Result<()> {
    use signal_hook::consts::{SIGINT, SIGTERM};
    let mut signals = signal_hook::iterator::Signals::new([SIGINT, SIGTERM])
        .context("installing the SIGINT/SIGTERM handler")?;
    std::thread::Builder::new()
        .name("soak-signals".into())
        .spawn(move || {
            for sig in signals.forever() {
                if INTERRUPTED.swap(sig, Ordering::SeqCst) != 0 {
                    std::process::exit(128 + sig);
                }
                eprintln!(
                    "farmem-bench soak: interrupted (signal {sig}): ending the runs and \
                     cleaning up (again to quit at once)"
                );
            }
        })
        .context("starting the signal thread")?;
    Ok(())
}

/// Sleeps for `d`, or less when interrupted; returns whether the soak goes on.
fn sleep_unless_interrupted(d: Duration) -> bool {
    let end = Instant::now() + d;
    while !interrupted() {
        let left = end.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return true;
        }
        std::thread::sleep(left.min(Duration::from_millis(100)));
    }
    false
}

pub(crate) fn run(a: SoakArgs) -> anyhow::Result<ExitCode> {
    if !(a.minutes > 0.0 && a.minutes <= 24.0 * 60.0) {
        bail!(
            "--minutes {}: give a length from above 0 to 1440 (a day)",
            a.minutes
        );
    }
    if !nix::unistd::Uid::effective().is_root() {
        bail!(
            "soak needs root: its donors run in network namespaces of their own (run it with sudo)"
        );
    }
    let seed = match a.seed {
        Some(s) => s,
        None => {
            let mut b = [0u8; 8];
            farmem_proto::random_bytes(&mut b).context("drawing a seed")?;
            u64::from_le_bytes(b) >> 16 // short enough to type
        }
    };
    eprintln!(
        "farmem-bench soak: seed {seed} (replay: farmem-bench soak --minutes {} --seed {seed})",
        a.minutes
    );
    catch_interrupts()?;
    let length = Duration::from_secs_f64(a.minutes * 60.0);
    let kinds = match (a.no_failures, a.failures) {
        (true, _) => Vec::new(),
        (false, f) => f.unwrap_or_else(|| Kind::ALL.to_vec()),
    };
    let schedule = failures::schedule(seed, &kinds, DONORS, length);
    let dir = tempfile::Builder::new()
        .prefix("farmem-soak-")
        .tempdir()
        .context("making a work directory")?;
    eprintln!("farmem-bench soak: work directory {}", dir.path().display());
    let names = a.programs.unwrap_or_else(|| Name::ALL.to_vec());
    let progs = programs::prepare(dir.path(), &names)?;
    let cluster = Cluster::start(dir.path(), DONORS)?;
    let farmem_args = cluster.run_args(&a.local_mem.to_string());
    let t0 = Instant::now();
    let deadline = t0 + length;
    let runs: Mutex<Vec<Run>> = Mutex::new(Vec::new());
    let mut injected = Vec::new();
    std::thread::scope(|s| -> anyhow::Result<()> {
        let mut jobs = Vec::new();
        for (i, p) in progs.iter().enumerate() {
            let (cluster, farmem_args, runs, dir) = (&cluster, &farmem_args, &runs, dir.path());
            jobs.push(s.spawn(move || -> anyhow::Result<()> {
                // Staggered, so the programs' phases do not line up.
                std::thread::sleep(Duration::from_millis(700 * i as u64));
                let mut n = 0;
                while Instant::now() < deadline && !interrupted() {
                    let stats = dir.join(format!("stats-{:?}-{n}.json", p.name));
                    let gate = cluster.starting.read().unwrap();
                    let outcome = programs::run_farmem(p, farmem_args, &stats, || drop(gate))?;
                    if let Some(why) = &outcome.wrong {
                        eprintln!("farmem-bench soak: {:?} run {n} was wrong: {why}", p.name);
                    }
                    runs.lock().unwrap().push(Run {
                        program: p.name,
                        outcome,
                    });
                    n += 1;
                }
                Ok(())
            }));
        }
        for step in &schedule {
            let at = Instant::now() + step.gap;
            if at + step.hold > deadline {
                break;
            }
            if !sleep_unless_interrupted(step.gap) {
                break;
            }
            // One failure at a time: the next hits a donor only once the runs have made
            // the copies the last one cost (two copies survive one loss, not two).
            let mut after_repair = true;
            if step.kind.hits_donor() {
                let (waited, repaired) = repaired::wait(dir.path(), REPAIR_LIMIT, interrupted);
                after_repair = repaired;
                if !repaired && !interrupted() {
                    eprintln!(
                        "farmem-bench soak: a run is still short of copies after {:.0} s; \
                         injecting {:?} anyway",
                        waited.as_secs_f64(),
                        step.kind
                    );
                }
            }
            if interrupted() || Instant::now() + step.hold > deadline {
                break;
            }
            let started = Instant::now();
            let error = cluster
                .inject(step.kind, step.donor, step.hold)
                .err()
                .map(|e| format!("{e:#}"));
            if let Some(e) = &error {
                eprintln!("farmem-bench soak: injecting {:?}: {e}", step.kind);
            }
            injected.push(Injected {
                kind: step.kind,
                donor: step.kind.hits_donor().then_some(step.donor),
                started,
                ended: Instant::now(),
                error,
                after_repair,
            });
        }
        for j in jobs {
            j.join().expect("a soak job panicked")?;
        }
        Ok(())
    })?;
    let sig = INTERRUPTED.load(Ordering::SeqCst);
    if sig != 0 {
        drop(cluster);
        drop(dir);
        eprintln!("farmem-bench soak: interrupted; cleaned up, no verdict");
        return Ok(ExitCode::from((128 + sig) as u8));
    }
    let runs = runs.into_inner().unwrap();
    let v = verdict::judge(seed, a.minutes, t0, cluster.donor_addrs(), &injected, &runs);
    report(&v);
    if a.json {
        println!("{}", serde_json::to_string_pretty(&v)?);
    }
    if v.passed {
        return Ok(ExitCode::SUCCESS);
    }
    drop(cluster);
    let kept = dir.keep();
    eprintln!(
        "farmem-bench soak: the work directory is kept for a look: {} (each wrong run's whole \
         output in stats-PROGRAM-N.log, its counters in stats-PROGRAM-N.json)",
        kept.display()
    );
    Ok(ExitCode::from(1))
}

fn report(v: &verdict::Verdict) {
    let programs: Vec<String> = v
        .runs_by_program
        .iter()
        .map(|(n, p)| format!("{n} {}/{}", p.runs - p.wrong, p.runs))
        .collect();
    eprintln!(
        "farmem-bench soak: seed {}, {} min: {} runs right of {} ({}); {} failures injected \
         ({} unnoticed by any run); wrong outputs {}, state_lost_pages {}, pages_lost {}, seal \
         rejections {}, misreported failures {}, injected before a repair {}: {}",
        v.seed,
        v.minutes,
        v.runs - v.wrong_outputs,
        v.runs,
        programs.join(", "),
        v.failures_injected,
        v.failures_unnoticed,
        v.wrong_outputs,
        v.state_lost_pages,
        v.pages_lost,
        v.seal_rejected,
        v.failures_misreported,
        v.injected_before_repair,
        if v.passed { "PASSED" } else { "FAILED" }
    );
    for m in &v.misreported {
        eprintln!("farmem-bench soak: misreported: {m}");
    }
}
