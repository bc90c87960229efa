//! The soak's programs: real programs that check their own memory, each run once without
//! farmem first (its output is then what every run under farmem must print), then again and
//! again under `farmem run` on the cluster.

use std::io::Read;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use farmem_contract::{StatsFile, StatsSummary};

/// The C programs: the run checks of the `farmem` tests (malloc API, read(2) into evicted
/// memory, threads, fork, mremap, MADV_DONTNEED/FREE, calloc, MAP_POPULATE, MAP_SHARED,
/// MADV_WIPEONFORK), and the soak's forking server and threaded heap.
const RUN_CHECKS_C: &str = include_str!("../../../cli/tests/c/run_checks.c");
const SOAK_C: &str = include_str!("../../soak/soak.c");
const SOAK_JAVA: &str = include_str!("../../soak/Soak.java");
const SOAK_PY: &str = include_str!("../../soak/soak.py");

/// One program of the mix.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Name {
    /// tests/c/run_checks.c on 64 MiB: every check of the C API and madvise/mremap/fork.
    CChecks,
    /// stress-ng's verifying memory stressors (vm with every method, mmap, mremap, madvise,
    /// mlock), 20 s.
    StressNg,
    /// A forking server: children check the table as it was at the fork while the parent
    /// rewrites it.
    Forker,
    /// Four threads writing and verifying their parts of one heap.
    Threads,
    /// Python: a heap of small objects visited in a seeded random order.
    Python,
    /// Java: a heap of small arrays visited in a seeded random order.
    Jvm,
}

impl Name {
    pub(crate) const ALL: [Name; 6] = [
        Name::CChecks,
        Name::StressNg,
        Name::Forker,
        Name::Threads,
        Name::Python,
        Name::Jvm,
    ];
}

/// A program ready to run, with what a right run prints.
pub(crate) struct Program {
    pub name: Name,
    argv: Vec<String>,
    /// Exactly what it printed without farmem; None: its own verdict only (stress-ng's
    /// output holds timings).
    want: Option<String>,
}

/// How one run under farmem ended.
pub(crate) struct Outcome {
    pub started: Instant,
    pub ended: Instant,
    /// Why the run was wrong, if it was.
    pub wrong: Option<String>,
    /// The run's counters (its process tree's total), when its stats file was written.
    pub summary: Option<StatsSummary>,
}

/// Builds the programs of `names` in `dir` and runs each once without farmem.
pub(crate) fn prepare(dir: &Path, names: &[Name]) -> anyhow::Result<Vec<Program>> {
    names.iter().map(|&n| prepare_one(dir, n)).collect()
}

fn prepare_one(dir: &Path, name: Name) -> anyhow::Result<Program> {
    let s = |x: &str| x.to_string();
    let argv: Vec<String> = match name {
        Name::CChecks => vec![compile_c(dir, "run_checks", RUN_CHECKS_C)?, s("64")],
        Name::Forker => vec![
            compile_c(dir, "soak", SOAK_C)?,
            s("forker"),
            s("64"),
            s("6"),
        ],
        Name::Threads => {
            let bin = compile_c(dir, "soak", SOAK_C)?;
            vec![bin, s("threads"), s("96"), s("4"), s("8")]
        }
        Name::StressNg => {
            let mut a = vec![need("stress-ng", "stress-ng")?];
            a.extend(
                "--vm 1 --vm-bytes 64M --vm-method all --mmap 1 --mmap-bytes 32M --mremap 1 \
                 --mremap-bytes 32M --madvise 1 --mlock 1 --verify -t 20s"
                    .split(' ')
                    .map(String::from),
            );
            a
        }
        Name::Python => {
            let py = dir.join("soak.py");
            std::fs::write(&py, SOAK_PY).context("writing soak.py")?;
            let bin = need("/usr/bin/python3", "python3")?;
            vec![bin, py.display().to_string(), s("200000"), s("2")]
        }
        Name::Jvm => {
            let classes = dir.join("java");
            let src = dir.join("Soak.java");
            std::fs::write(&src, SOAK_JAVA).context("writing Soak.java")?;
            let javac = need("javac", "openjdk-17-jdk-headless")?;
            let o = Command::new(javac)
                .arg("-d")
                .arg(&classes)
                .arg(&src)
                .output()
                .context("running javac")?;
            if !o.status.success() {
                bail!(
                    "javac Soak.java failed: {}",
                    String::from_utf8_lossy(&o.stderr)
                );
            }
            let java = need("java", "openjdk-17-jdk-headless")?;
            vec![java, s("-Xmx512m"), s("-XX:+UseSerialGC"), s("-cp")]
                .into_iter()
                .chain([
                    classes.display().to_string(),
                    s("Soak"),
                    s("200000"),
                    s("2"),
                ])
                .collect()
        }
    };
    let mut p = Program {
        name,
        argv,
        want: None,
    };
    let (ok, out) = run_plain(&p)?;
    if !ok {
        bail!(
            "{:?} fails without farmem (so the soak cannot judge it): {out}",
            p.name
        );
    }
    if name != Name::StressNg {
        p.want = Some(out);
    }
    Ok(p)
}

/// The path of `program` (searched in PATH unless absolute), or an error naming the Debian
/// package that has it.
fn need(program: &str, package: &str) -> anyhow::Result<String> {
    let found = if program.starts_with('/') {
        Path::new(program).is_file().then(|| PathBuf::from(program))
    } else {
        std::env::var_os("PATH").and_then(|paths| {
            std::env::split_paths(&paths)
                .map(|d| d.join(program))
                .find(|p| p.is_file())
        })
    };
    found.map(|p| p.display().to_string()).with_context(|| {
        format!("{program} is missing: the soak runs it (apt-get install {package}, or scripts/setup.sh)")
    })
}

fn compile_c(dir: &Path, name: &str, source: &str) -> anyhow::Result<String> {
    let bin = dir.join(name);
    if bin.is_file() {
        return Ok(bin.display().to_string());
    }
    let src = dir.join(format!("{name}.c"));
    std::fs::write(&src, source).with_context(|| format!("writing {name}.c"))?;
    let cc = need("cc", "build-essential")?;
    let o = Command::new(cc)
        .args(["-O2", "-pthread", "-w", "-o"])
        .arg(&bin)
        .arg(&src)
        .output()
        .context("running cc")?;
    if !o.status.success() {
        bail!(
            "compiling {name}.c failed: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    }
    Ok(bin.display().to_string())
}

/// How long one run may take before it counts as hung (and is killed).
const RUN_LIMIT: Duration = Duration::from_secs(600);

/// Runs `p` without farmem: whether it succeeded, and its stdout (or why it failed).
fn run_plain(p: &Program) -> anyhow::Result<(bool, String)> {
    let mut cmd = Command::new(&p.argv[0]);
    cmd.args(&p.argv[1..]);
    let (status, out, err) = wait(spawn(cmd)?)?;
    let status = status.context("it did not finish within 10 minutes")?;
    let ok = status.success() && verdict_ok(p.name, &out, &err);
    Ok((
        ok,
        if ok {
            out
        } else {
            format!("{status}: {out}{err}")
        },
    ))
}

/// Runs `p` under `farmem run FARMEM_ARGS --stats FILE` and judges it. `started` is called
/// once the runtime is up (its first stats file written) or after a few seconds.
pub(crate) fn run_farmem(
    p: &Program,
    farmem_args: &[String],
    stats: &Path,
    started: impl FnOnce(),
) -> anyhow::Result<Outcome> {
    let _ = std::fs::remove_file(stats);
    let mut cmd = Command::new(crate::farmem_bin()?);
    cmd.arg("run")
        .args(farmem_args)
        .arg("--stats")
        .arg(stats)
        .arg("--")
        .args(&p.argv);
    // In the work directory: a JVM killed by SIGBUS writes its error report there.
    cmd.current_dir(stats.parent().unwrap_or(Path::new("/")));
    let t0 = Instant::now();
    let child = spawn(cmd)?;
    let up = Instant::now() + Duration::from_secs(5);
    while !stats.exists() && Instant::now() < up {
        std::thread::sleep(Duration::from_millis(20));
    }
    started();
    let done = wait(child)?;
    let ended = Instant::now();
    let mut summary = std::fs::read(stats)
        .ok()
        .and_then(|b| serde_json::from_slice::<StatsFile>(&b).ok())
        .and_then(|f| f.summary);
    let (status, out, err) = done;
    if let Some(s) = &mut summary {
        counted_in_log(s, &err);
    }
    let wrong = match status {
        None => Some(format!(
            "hung: killed after {} s, {} faults served by then",
            RUN_LIMIT.as_secs(),
            summary.as_ref().map_or(0, |s| s.faults)
        )),
        Some(status) => judge(p, status, &out, &err),
    };
    if wrong.is_some() {
        // Whole, beside its stats file, for whoever looks into it (the soak keeps its work
        // directory when it fails).
        let _ = std::fs::write(stats.with_extension("log"), format!("{out}\n---\n{err}"));
    }
    Ok(Outcome {
        started: t0,
        ended,
        wrong,
        summary,
    })
}

/// A process killed by the SIGBUS of a lost page (a JVM aborts on it) writes no last stats
/// file: its last one may be a second old. The runtime logs each such page as it happens, so
/// the run's log is counted too, and the larger count kept.
fn counted_in_log(s: &mut StatsSummary, log: &str) {
    let count = |needle: &str| log.lines().filter(|l| l.contains(needle)).count() as u64;
    // Messages of farmem-runtime's fault/fetch.rs and failure.rs.
    s.pages_lost = s
        .pages_lost
        .max(count("cannot be brought back from its donor"));
    s.state_lost_pages = s
        .state_lost_pages
        .max(count("but is not mapped; its contents are lost"));
    let rejected = log.matches("failed its integrity check").count() as u64;
    s.seal_rejected = s.seal_rejected.max(rejected);
}

/// Why a finished run is wrong, if it is.
fn judge(p: &Program, status: std::process::ExitStatus, out: &str, err: &str) -> Option<String> {
    let tail = |s: &str| {
        let lines: Vec<&str> = s.lines().collect();
        lines[lines.len().saturating_sub(8)..].join("\n")
    };
    if !status.success() || !verdict_ok(p.name, out, err) {
        return Some(format!("{status}\n{}\n{}", tail(out), tail(err)));
    }
    match &p.want {
        Some(w) if w != out => Some(format!(
            "output differs:\n{}\nwanted:\n{}",
            tail(out),
            tail(w)
        )),
        _ => None,
    }
}

/// The program's own verdict in what it printed.
fn verdict_ok(name: Name, out: &str, err: &str) -> bool {
    match name {
        Name::CChecks => out.contains("all checks passed"),
        // "unsuccessful run completed" when a stressor failed (a verify error among them).
        Name::StressNg => [out, err]
            .iter()
            .any(|s| s.contains("] successful run completed")),
        _ => out.lines().last().is_some_and(|l| l.starts_with("ok ")),
    }
}

/// How a run ended (None: killed after [`RUN_LIMIT`]), and what it printed.
type Finished = (Option<std::process::ExitStatus>, String, String);

fn spawn(mut cmd: Command) -> anyhow::Result<std::process::Child> {
    // Its own process group, so a hung run is killed with every process of its tree.
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    cmd.spawn().with_context(|| format!("starting {cmd:?}"))
}

fn wait(mut child: std::process::Child) -> anyhow::Result<Finished> {
    let (mut so, mut se) = (child.stdout.take().unwrap(), child.stderr.take().unwrap());
    let out = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = so.read_to_string(&mut s);
        s
    });
    let err = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = se.read_to_string(&mut s);
        s
    });
    let deadline = Instant::now() + RUN_LIMIT;
    let status = loop {
        if let Some(st) = child.try_wait().context("waiting for a program")? {
            break Some(st);
        }
        // Hung, or the soak was interrupted (SIGINT or SIGTERM).
        if Instant::now() > deadline || super::interrupted() {
            let pgid = nix::unistd::Pid::from_raw(child.id() as i32);
            let _ = nix::sys::signal::killpg(pgid, nix::sys::signal::SIGKILL);
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let (out, err) = (
        out.join().unwrap_or_default(),
        err.join().unwrap_or_default(),
    );
    Ok((status, out, err))
}
