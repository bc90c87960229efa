//! The workloads of `farmem-bench compare`: what each runs, how it is started under a system,
//! and what it measures.
//!
//! * `seq`, `stride:K`, `random`: Leap's microbenchmarks, bench/workloads/micro.c compiled with
//!   `cc -O2` into a temporary directory (the source is built into this binary).
//! * `redis`, `memcached`: the server runs under the system; the load generator ([`super::kv`])
//!   runs in the harness, outside the limit.
//! * `numpy`, `kmeans`: bench/workloads/numpy_matmul.py and kmeans.py, run with Debian's
//!   python3 (`--python`, default /usr/bin/python3, which sees python3-numpy/python3-sklearn).
//! * `mp`: bench/workloads/mp.py, same python: a parent forks `--mp-workers` multiprocessing
//!   workers, each paging its own `--mp-worker-bytes` array, so one limit covers a process
//!   tree (the cgroup wrapper's children inherit its cgroup; `farmem run` follows forks).
//! * `node-heap`, `jvm-heap`: bench/workloads/heap.js under `node` and Heap.java (compiled with
//!   `javac` into the temporary directory) under `java`: about `--heap-bytes` of small live
//!   objects on the runtime's garbage-collected heap, built, then `--passes` read-modify-write
//!   passes over them. The runtimes' heap sizes are pinned on the command line ([`node_argv`],
//!   [`java_argv`]) so that the cgroup limit cannot change them: both size their heaps from the
//!   cgroup's limit when they see one, which would make the limited runs a different program.
//!
//! Every workload checks its own data (micro: a checksum of the bytes read; the python scripts:
//! a result check; the heap programs: every record against values computed from its index; the
//! servers: every GET must hit a value of the right size), so a paging
//! system that loses a page fails the run instead of looking fast.

use std::ffi::OsString;
use std::fmt;
use std::fs;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

use super::cost::{TreeCpu, TreeWatch};
use super::kv::{self, Protocol};
use super::systems::{Cleanup, Token};

const MICRO_C: &str = include_str!("../../workloads/micro.c");
const NUMPY_PY: &str = include_str!("../../workloads/numpy_matmul.py");
const KMEANS_PY: &str = include_str!("../../workloads/kmeans.py");
const MP_PY: &str = include_str!("../../workloads/mp.py");
const HEAP_JS: &str = include_str!("../../workloads/heap.js");
const HEAP_JAVA: &str = include_str!("../../workloads/Heap.java");

/// One workload.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Workload {
    Seq,
    Stride(u64),
    Random,
    Redis,
    Memcached,
    Numpy,
    Kmeans,
    Mp,
    NodeHeap,
    JvmHeap,
}

/// The figure a workload is judged by (and that the ratios compare).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Metric {
    /// Average time of one page access, µs (lower is better).
    AccessTime,
    /// Requests per second (higher is better).
    Throughput,
    /// Completion time, s (lower is better).
    Completion,
}

impl Metric {
    pub fn describe(self) -> &'static str {
        match self {
            Metric::AccessTime => "average access time (lower is better)",
            Metric::Throughput => "throughput (higher is better)",
            Metric::Completion => "completion time (lower is better)",
        }
    }
}

impl Workload {
    /// What `all` means: every workload, stride 10 as in Leap.
    pub const ALL: [Workload; 10] = [
        Workload::Seq,
        Workload::Stride(10),
        Workload::Random,
        Workload::Redis,
        Workload::Memcached,
        Workload::Numpy,
        Workload::Kmeans,
        Workload::Mp,
        Workload::NodeHeap,
        Workload::JvmHeap,
    ];

    pub fn metric(self) -> Metric {
        match self {
            Workload::Seq | Workload::Stride(_) | Workload::Random => Metric::AccessTime,
            Workload::Redis | Workload::Memcached => Metric::Throughput,
            Workload::Numpy
            | Workload::Kmeans
            | Workload::Mp
            | Workload::NodeHeap
            | Workload::JvmHeap => Metric::Completion,
        }
    }

    fn is_micro(self) -> bool {
        self.metric() == Metric::AccessTime
    }
}

impl fmt::Display for Workload {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Workload::Seq => f.write_str("seq"),
            Workload::Stride(k) => write!(f, "stride:{k}"),
            Workload::Random => f.write_str("random"),
            Workload::Redis => f.write_str("redis"),
            Workload::Memcached => f.write_str("memcached"),
            Workload::Numpy => f.write_str("numpy"),
            Workload::Kmeans => f.write_str("kmeans"),
            Workload::Mp => f.write_str("mp"),
            Workload::NodeHeap => f.write_str("node-heap"),
            Workload::JvmHeap => f.write_str("jvm-heap"),
        }
    }
}

const WORKLOAD_HELP: &str =
    "expected seq, stride:K (K >= 2), random, redis, memcached, numpy, kmeans, mp, node-heap, \
     jvm-heap, or all";

/// Parses one workload name.
pub fn parse_workload(text: &str) -> Result<Workload, String> {
    let text = text.trim();
    Ok(match text {
        "seq" => Workload::Seq,
        "random" => Workload::Random,
        "redis" => Workload::Redis,
        "memcached" => Workload::Memcached,
        "numpy" => Workload::Numpy,
        "kmeans" => Workload::Kmeans,
        "mp" => Workload::Mp,
        "node-heap" => Workload::NodeHeap,
        "jvm-heap" => Workload::JvmHeap,
        _ => {
            if let Some(k) = text.strip_prefix("stride:") {
                let k: u64 = k
                    .parse()
                    .map_err(|_| format!("bad stride in `{text}`: {WORKLOAD_HELP}"))?;
                if k < 2 {
                    return Err(format!(
                        "stride must be at least 2 in `{text}` (stride:1 is seq)"
                    ));
                }
                Workload::Stride(k)
            } else {
                return Err(format!("unknown workload `{text}`: {WORKLOAD_HELP}"));
            }
        }
    })
}

/// The value of `--workload`: a comma-separated list, or `all`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorkloadList(pub Vec<Workload>);

/// Parses `--workload`.
pub fn parse_workload_list(text: &str) -> Result<WorkloadList, String> {
    let mut out = Vec::new();
    for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let items = if part == "all" {
            Workload::ALL.to_vec()
        } else {
            vec![parse_workload(part)?]
        };
        for w in items {
            if !out.contains(&w) {
                out.push(w);
            }
        }
    }
    if out.is_empty() {
        return Err(format!("no workload given: {WORKLOAD_HELP}"));
    }
    Ok(WorkloadList(out))
}

/// Sizes and knobs of the workloads (from the command line).
#[derive(Clone, Debug)]
pub struct Sizes {
    pub wss_bytes: u64,
    pub passes: u32,
    pub keys: u64,
    pub ops: u64,
    pub clients: u32,
    pub zipf_theta: f64,
    pub matrix_n: u64,
    pub kmeans_samples: u64,
    pub kmeans_features: u64,
    pub kmeans_clusters: u64,
    pub kmeans_iterations: u64,
    pub mp_worker_bytes: u64,
    pub mp_workers: u32,
    pub heap_bytes: u64,
    pub timeout: Duration,
    pub seed: u64,
}

/// How one run starts the workload's process.
#[derive(Clone, Debug)]
pub enum Wrap {
    /// As is (no memory cgroup available: local run only).
    Direct,
    /// Joins the cgroup whose `cgroup.procs` is given, then execs the workload.
    Cgroup(PathBuf),
    /// Under `farmem run [--local-donor KIND] --local-mem BUDGET --stats FILE --quiet [extra]
    /// -- …`.
    Farmem {
        exe: PathBuf,
        /// `--local-donor` (`tcp` for the `farmem-tcp` system); None: farmem's default.
        local_donor: Option<&'static str>,
        budget_bytes: u64,
        stats: PathBuf,
        extra: Vec<String>,
    },
}

impl Wrap {
    /// The command that runs `argv` under this wrap.
    pub fn command(&self, argv: &[OsString]) -> Command {
        let mut cmd = match self {
            Wrap::Direct => {
                let mut c = Command::new(&argv[0]);
                c.args(&argv[1..]);
                c
            }
            Wrap::Cgroup(procs) => {
                let mut c = Command::new("/bin/sh");
                c.arg("-c")
                    .arg("echo $$ > \"$0\" && exec \"$@\"")
                    .arg(procs)
                    .args(argv);
                c
            }
            Wrap::Farmem {
                exe,
                local_donor,
                budget_bytes,
                stats,
                extra,
            } => {
                let mut c = Command::new(exe);
                c.arg("run");
                if let Some(kind) = local_donor {
                    c.arg("--local-donor").arg(kind);
                }
                c.arg("--local-mem")
                    .arg(budget_bytes.to_string())
                    .arg("--stats")
                    .arg(stats)
                    .arg("--quiet")
                    .args(extra)
                    .arg("--")
                    .args(argv);
                c
            }
        };
        // Own process group: the cleanup kills the whole tree, and a terminal's ^C reaches
        // only the harness, which then undoes its changes in order.
        std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
        cmd
    }
}

/// The figures one run produced.
#[derive(Clone, Debug, Default)]
pub struct Measured {
    pub wall_s: Option<f64>,
    pub throughput_ops: Option<f64>,
    pub avg_access_us: Option<f64>,
    pub p50_us: Option<f64>,
    pub p99_us: Option<f64>,
    /// Free-form details for the notes (phase times, misses).
    pub detail: String,
    /// CPU time of the workload's process tree, from spawn to reap (see [`super::cost`]).
    pub tree: Option<TreeCpu>,
}

/// Built programs and written scripts, in a temporary directory removed on drop.
pub struct Toolbox {
    pub dir: tempfile::TempDir,
    micro: Option<PathBuf>,
    numpy_py: PathBuf,
    kmeans_py: PathBuf,
    mp_py: PathBuf,
    python: PathBuf,
    /// `node` and heap.js, when node-heap is among the workloads.
    node_heap: Option<(PathBuf, PathBuf)>,
    /// `java` and the directory of the compiled Heap class, when jvm-heap is.
    jvm_heap: Option<(PathBuf, PathBuf)>,
    runs: std::cell::Cell<u32>,
}

/// Finds `program` in PATH.
pub fn which(program: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(program))
        .find(|p| p.is_file())
}

impl Toolbox {
    /// Builds what `workloads` need and checks their prerequisites, naming the Debian package
    /// to install when one is missing.
    pub fn prepare(workloads: &[Workload], python: &Path) -> anyhow::Result<Toolbox> {
        let dir = tempfile::Builder::new()
            .prefix("farmem-bench-")
            .tempdir()
            .context("cannot create a temporary directory for the workload programs")?;
        let numpy_py = dir.path().join("numpy_matmul.py");
        let kmeans_py = dir.path().join("kmeans.py");
        fs::write(&numpy_py, NUMPY_PY)?;
        let mp_py = dir.path().join("mp.py");
        fs::write(&kmeans_py, KMEANS_PY)?;
        fs::write(&mp_py, MP_PY)?;
        let mut micro = None;
        if workloads.iter().any(|w| w.is_micro()) {
            let src = dir.path().join("micro.c");
            let bin = dir.path().join("micro");
            fs::write(&src, MICRO_C)?;
            let cc = which("cc").context(
                "no C compiler `cc` in PATH for the micro workloads: apt-get install gcc",
            )?;
            let out = Command::new(cc)
                .args(["-O2", "-o"])
                .arg(&bin)
                .arg(&src)
                .output()
                .context("cannot run cc")?;
            if !out.status.success() {
                bail!(
                    "compiling micro.c failed: {}",
                    String::from_utf8_lossy(&out.stderr)
                );
            }
            micro = Some(bin);
        }
        let mut node_heap = None;
        if workloads.contains(&Workload::NodeHeap) {
            let node = which("node").context(
                "node is not installed (no `node` in PATH) for the node-heap workload: \
                 apt-get install nodejs",
            )?;
            let script = dir.path().join("heap.js");
            fs::write(&script, HEAP_JS)?;
            node_heap = Some((node, script));
        }
        let mut jvm_heap = None;
        if workloads.contains(&Workload::JvmHeap) {
            let missing = |p: &str| {
                format!(
                    "{p} is not installed (no `{p}` in PATH) for the jvm-heap workload: \
                     apt-get install openjdk-17-jdk-headless"
                )
            };
            let java = which("java").with_context(|| missing("java"))?;
            let javac = which("javac").with_context(|| missing("javac"))?;
            let classes = dir.path().join("classes");
            compile_heap_java(&javac, dir.path(), &classes)?;
            jvm_heap = Some((java, classes));
        }
        for w in workloads {
            match w {
                Workload::Redis if which("redis-server").is_none() => {
                    bail!("redis-server is not installed: apt-get install redis-server")
                }
                Workload::Memcached if which("memcached").is_none() => {
                    bail!("memcached is not installed: apt-get install memcached")
                }
                Workload::Numpy | Workload::Kmeans | Workload::Mp => {
                    let module = if *w == Workload::Kmeans {
                        "sklearn"
                    } else {
                        "numpy"
                    };
                    let ok = Command::new(python)
                        .args(["-c", &format!("import {module}")])
                        .stdout(Stdio::null())
                        .stderr(Stdio::null())
                        .status()
                        .map(|s| s.success())
                        .unwrap_or(false);
                    if !ok {
                        bail!(
                            "{} cannot import {module}: apt-get install python3-numpy python3-sklearn \
                             (or point --python at an interpreter that has it)",
                            python.display()
                        );
                    }
                }
                _ => {}
            }
        }
        Ok(Toolbox {
            dir,
            micro,
            numpy_py,
            kmeans_py,
            mp_py,
            python: python.to_path_buf(),
            node_heap,
            jvm_heap,
            runs: 0.into(),
        })
    }

    fn next_log(&self, what: &str) -> PathBuf {
        let n = self.runs.get() + 1;
        self.runs.set(n);
        self.dir.path().join(format!("{n:03}-{what}"))
    }
}

/// Writes Heap.java into `dir` and compiles it with `javac` into `classes` (outside every limit:
/// the compiler is not part of the measured run).
fn compile_heap_java(javac: &Path, dir: &Path, classes: &Path) -> anyhow::Result<()> {
    let src = dir.join("Heap.java");
    fs::write(&src, HEAP_JAVA)?;
    let out = Command::new(javac)
        .arg("-d")
        .arg(classes)
        .arg(&src)
        .output()
        .with_context(|| format!("cannot run {}", javac.display()))?;
    if !out.status.success() {
        bail!(
            "compiling Heap.java failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(())
}

/// `heap_bytes` in MiB, rounded up.
fn mib_ceil(bytes: u64) -> u64 {
    bytes.div_ceil(1 << 20)
}

/// The command line of the node-heap workload. V8's limits are pinned: node sizes its old and
/// young generations from the cgroup's memory limit when it sees one (`uv_get_constrained_memory`),
/// so without the flags the limited runs would get a smaller heap (and fail with "heap out of
/// memory", or collect more often) than the local run. The old space may grow to 4 × the live
/// heap + 512 MiB (a cap, not a reservation: V8 grows it as the live data needs); the semi-spaces
/// stay at their 64-bit default of 16 MiB.
pub fn node_argv(node: &Path, script: &Path, sizes: &Sizes) -> Vec<OsString> {
    vec![
        node.into(),
        format!(
            "--max-old-space-size={}",
            4 * mib_ceil(sizes.heap_bytes) + 512
        )
        .into(),
        "--max-semi-space-size=16".into(),
        script.into(),
        sizes.heap_bytes.to_string().into(),
        sizes.passes.to_string().into(),
        sizes.seed.to_string().into(),
    ]
}

/// The command line of the jvm-heap workload. `-XX:-UseContainerSupport`: HotSpot would otherwise
/// take the cgroup's limit as the machine's memory, and with it choose a different collector
/// (Serial below 1792 MiB) and a different initial heap in the limited runs than in the local
/// one; G1 is also named, as the test of managed heaps does (the default collector on a server,
/// and the harder case: it commits its heap and bitmaps inside `PROT_NONE` reservations).
/// `-Xmx` is 2 × the live heap + 128 MiB (G1 copies the young objects, all of them live here,
/// so it needs room beyond the live data). `-XX:-UsePerfData`: no hsperfdata file in /tmp.
pub fn java_argv(java: &Path, classes: &Path, sizes: &Sizes) -> Vec<OsString> {
    vec![
        java.into(),
        "-XX:-UseContainerSupport".into(),
        "-XX:+UseG1GC".into(),
        "-XX:-UsePerfData".into(),
        format!("-Xmx{}m", 2 * mib_ceil(sizes.heap_bytes) + 128).into(),
        "-cp".into(),
        classes.into(),
        "Heap".into(),
        sizes.heap_bytes.to_string().into(),
        sizes.passes.to_string().into(),
        sizes.seed.to_string().into(),
    ]
}

/// A workload process the cleanup stack kills (its whole process group) if the harness is
/// interrupted.
struct Running {
    child: Child,
    token: Token,
    started: Instant,
    stderr_path: PathBuf,
    watch: TreeWatch,
}

/// Starts `argv` under `wrap`, its output into the toolbox's logs.
fn spawn(
    wrap: &Wrap,
    argv: &[OsString],
    tb: &Toolbox,
    cleanup: &Cleanup,
    what: &str,
) -> anyhow::Result<(Running, PathBuf)> {
    let cmd = &mut wrap.command(argv);
    let out_path = tb.next_log(&format!("{what}.out"));
    let err_path = tb.next_log(&format!("{what}.err"));
    cmd.stdin(Stdio::null())
        .stdout(fs::File::create(&out_path)?)
        .stderr(fs::File::create(&err_path)?);
    let started = Instant::now();
    let child = cmd
        .spawn()
        .with_context(|| format!("cannot start {what}: {cmd:?}"))?;
    let pgid = child.id() as i32;
    let token = cleanup.push(format!("kill {what} (process group {pgid})"), move || {
        let _ =
            nix::sys::signal::killpg(nix::unistd::Pid::from_raw(pgid), nix::sys::signal::SIGKILL);
        Ok(())
    });
    let watch = TreeWatch::start(child.id(), matches!(wrap, Wrap::Farmem { .. }));
    Ok((
        Running {
            child,
            token,
            started,
            stderr_path: err_path,
            watch,
        },
        out_path,
    ))
}

fn tail(path: &Path) -> String {
    let text = fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(6)..].join(" | ")
}

impl Running {
    /// The exit status if the process has ended (reaping it). Before reaping, the zombie's
    /// final CPU times are read ([`TreeWatch::root_exited`]).
    fn try_wait(&mut self) -> std::io::Result<Option<std::process::ExitStatus>> {
        use nix::sys::wait::{waitid, Id, WaitPidFlag, WaitStatus};
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        match waitid(
            Id::Pid(pid),
            WaitPidFlag::WEXITED | WaitPidFlag::WNOHANG | WaitPidFlag::WNOWAIT,
        ) {
            Ok(WaitStatus::StillAlive) => return Ok(None),
            Ok(_) => self.watch.root_exited(),
            // Already reaped (or not ours): std's try_wait says which.
            Err(_) => {}
        }
        self.child.try_wait()
    }

    /// Waits for the exit, killing the group at `timeout`. Returns the wall time and what the
    /// tree used.
    fn wait(
        mut self,
        timeout: Duration,
        cleanup: &Cleanup,
        what: &str,
    ) -> anyhow::Result<(f64, TreeCpu)> {
        let status = loop {
            if let Some(status) = self.try_wait()? {
                break status;
            }
            if self.started.elapsed() > timeout {
                let _ = cleanup.run(self.token);
                let _ = self.child.wait();
                bail!("{what} did not finish within {timeout:?} and was killed (raise --timeout)");
            }
            std::thread::sleep(Duration::from_millis(2));
        };
        let wall = self.started.elapsed().as_secs_f64();
        let tree = self.watch.finish();
        // The group may hold stragglers (farmem's donor child); the token kills them.
        let _ = cleanup.run(self.token);
        if !status.success() {
            bail!("{what} failed ({status}): {}", tail(&self.stderr_path));
        }
        Ok((wall, tree))
    }

    fn check_alive(&mut self, what: &str) -> anyhow::Result<()> {
        if let Some(status) = self.try_wait()? {
            bail!(
                "{what} exited early ({status}): {}",
                tail(&self.stderr_path)
            );
        }
        Ok(())
    }
}

fn free_port() -> anyhow::Result<u16> {
    let l = TcpListener::bind("127.0.0.1:0").context("cannot find a free port on 127.0.0.1")?;
    Ok(l.local_addr()?.port())
}

fn json_line(path: &Path) -> anyhow::Result<serde_json::Value> {
    let text = fs::read_to_string(path)?;
    let line = text
        .lines()
        .rev()
        .find(|l| l.trim_start().starts_with('{'))
        .with_context(|| {
            format!(
                "the workload printed no JSON result (stdout: {:?})",
                text.trim()
            )
        })?;
    serde_json::from_str(line).with_context(|| format!("bad JSON result line {line:?}"))
}

fn num(v: &serde_json::Value, key: &str) -> Option<f64> {
    v.get(key).and_then(serde_json::Value::as_f64)
}

/// Runs `workload` once under `wrap` and measures it.
pub fn run(
    workload: Workload,
    sizes: &Sizes,
    tb: &Toolbox,
    wrap: &Wrap,
    cleanup: &Cleanup,
) -> anyhow::Result<Measured> {
    let name = workload.to_string().replace(':', "");
    match workload {
        Workload::Seq | Workload::Stride(_) | Workload::Random => {
            let micro = tb.micro.as_ref().context("micro was not built")?;
            let argv: Vec<OsString> = vec![
                micro.into(),
                workload.to_string().into(),
                sizes.wss_bytes.to_string().into(),
                sizes.passes.to_string().into(),
                sizes.seed.to_string().into(),
            ];
            let (running, out) = spawn(wrap, &argv, tb, cleanup, &name)?;
            let (wall, tree) = running.wait(sizes.timeout, cleanup, &name)?;
            let v = json_line(&out)?;
            Ok(Measured {
                wall_s: Some(wall),
                throughput_ops: None,
                avg_access_us: num(&v, "avg_ns").map(|x| x / 1e3),
                p50_us: num(&v, "p50_ns").map(|x| x / 1e3),
                p99_us: num(&v, "p99_ns").map(|x| x / 1e3),
                detail: format!(
                    "init {:.2} s, access phase {:.2} s, {} accesses",
                    num(&v, "init_s").unwrap_or(f64::NAN),
                    num(&v, "access_s").unwrap_or(f64::NAN),
                    num(&v, "accesses").unwrap_or(0.0)
                ),
                tree: Some(tree),
            })
        }
        Workload::Numpy | Workload::Kmeans | Workload::Mp => {
            let mut argv: Vec<OsString> = vec![tb.python.clone().into()];
            match workload {
                Workload::Numpy => {
                    argv.push(tb.numpy_py.clone().into());
                    argv.push(sizes.matrix_n.to_string().into());
                    argv.push(sizes.seed.to_string().into());
                }
                Workload::Kmeans => {
                    argv.push(tb.kmeans_py.clone().into());
                    for v in [
                        sizes.kmeans_samples,
                        sizes.kmeans_features,
                        sizes.kmeans_clusters,
                        sizes.kmeans_iterations,
                        sizes.seed,
                    ] {
                        argv.push(v.to_string().into());
                    }
                }
                _ => {
                    argv.push(tb.mp_py.clone().into());
                    for (flag, v) in [
                        ("--worker-bytes", sizes.mp_worker_bytes),
                        ("--workers", sizes.mp_workers.into()),
                        ("--passes", sizes.passes.into()),
                        ("--seed", sizes.seed),
                    ] {
                        argv.push(flag.into());
                        argv.push(v.to_string().into());
                    }
                }
            }
            let (running, out) = spawn(wrap, &argv, tb, cleanup, &name)?;
            let (wall, tree) = running.wait(sizes.timeout, cleanup, &name)?;
            let v = json_line(&out)?;
            let phase = match workload {
                Workload::Numpy => "matmul_s",
                Workload::Kmeans => "fit_s",
                _ => "passes_s",
            };
            Ok(Measured {
                wall_s: Some(wall),
                detail: format!(
                    "generate {:.2} s, {} {:.2} s",
                    num(&v, "generate_s").unwrap_or(f64::NAN),
                    phase.trim_end_matches("_s"),
                    num(&v, phase).unwrap_or(f64::NAN)
                ),
                tree: Some(tree),
                ..Measured::default()
            })
        }
        Workload::NodeHeap | Workload::JvmHeap => {
            let argv = if workload == Workload::NodeHeap {
                let (node, script) = tb.node_heap.as_ref().context("heap.js was not written")?;
                node_argv(node, script, sizes)
            } else {
                let (java, classes) = tb.jvm_heap.as_ref().context("Heap.java was not built")?;
                java_argv(java, classes, sizes)
            };
            let (running, out) = spawn(wrap, &argv, tb, cleanup, &name)?;
            let (wall, tree) = running.wait(sizes.timeout, cleanup, &name)?;
            let v = json_line(&out)?;
            // The program exits 3 on a mismatch (so `wait` has failed the run already); a
            // result line that does not say so is refused too.
            if v["checksum_ok"] != serde_json::Value::Bool(true) {
                bail!("{name} did not confirm its records: {v}");
            }
            Ok(Measured {
                wall_s: Some(wall),
                detail: heap_detail(&v),
                tree: Some(tree),
                ..Measured::default()
            })
        }
        Workload::Redis | Workload::Memcached => {
            run_server(workload, sizes, tb, wrap, cleanup, &name)
        }
    }
}

/// The note of a heap run: phase times, records and the heap the runtime said it used.
fn heap_detail(v: &serde_json::Value) -> String {
    format!(
        "build {:.2} s, passes {:.2} s, {} records ({:.0} MiB live, heap used {:.0} MiB)",
        num(v, "generate_s").unwrap_or(f64::NAN),
        num(v, "passes_s").unwrap_or(f64::NAN),
        num(v, "records").unwrap_or(0.0),
        num(v, "live_bytes").unwrap_or(f64::NAN) / (1u64 << 20) as f64,
        num(v, "heap_used_bytes").unwrap_or(f64::NAN) / (1u64 << 20) as f64,
    )
}

fn run_server(
    workload: Workload,
    sizes: &Sizes,
    tb: &Toolbox,
    wrap: &Wrap,
    cleanup: &Cleanup,
    name: &str,
) -> anyhow::Result<Measured> {
    let port = free_port()?;
    let (proto, argv): (Protocol, Vec<OsString>) = if workload == Workload::Redis {
        let args = [
            "redis-server",
            "--port",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--protected-mode",
            "no",
            "--daemonize",
            "no",
            "--loglevel",
            "warning",
        ];
        let mut argv: Vec<OsString> = args.iter().map(OsString::from).collect();
        // Its own empty directory: never load a dump.rdb lying in the working directory.
        argv.push("--dir".into());
        argv.push(tb.dir.path().into());
        (Protocol::Redis, argv)
    } else {
        // Enough item memory for every key (about 1.2 KiB each with item headers).
        let item_mib = ((sizes.keys * 1300) >> 20) * 2 + 64;
        let mut args: Vec<String> = [
            "memcached",
            "-l",
            "127.0.0.1",
            "-p",
            &port.to_string(),
            "-U",
            "0",
            "-t",
            "2",
            "-A",
            "-m",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        args.push(item_mib.to_string());
        if super::systems::is_root() {
            args.extend(["-u".to_string(), "root".to_string()]);
        }
        (
            Protocol::Memcached,
            args.into_iter().map(OsString::from).collect(),
        )
    };
    let mut argv = argv;
    argv[0] = which(&argv[0].to_string_lossy())
        .with_context(|| format!("{} is not installed", argv[0].to_string_lossy()))?
        .into();
    let (mut running, _out) = spawn(wrap, &argv, tb, cleanup, name)?;
    let result = (|| -> anyhow::Result<Measured> {
        kv::wait_ready(proto, port, Duration::from_secs(60), || {
            running.check_alive(name)
        })?;
        let t0 = Instant::now();
        kv::load(proto, port, sizes.keys, sizes.seed).context("loading the keys")?;
        let load_s = t0.elapsed().as_secs_f64();
        let cfg = kv::MixConfig {
            keys: sizes.keys,
            ops: sizes.ops,
            clients: sizes.clients,
            set_fraction: 0.05,
            zipf_theta: sizes.zipf_theta,
            max_duration: sizes.timeout,
            seed: sizes.seed,
        };
        let mix = kv::run_mix(proto, port, &cfg).context("running the GET/SET mix")?;
        if mix.misses > 0 {
            bail!(
                "{} GETs of loaded keys missed: the server lost data",
                mix.misses
            );
        }
        let us = |q: f64| mix.latency_ns.value_at_quantile(q) as f64 / 1e3;
        Ok(Measured {
            wall_s: Some(mix.elapsed_s),
            throughput_ops: Some(mix.ops as f64 / mix.elapsed_s),
            avg_access_us: None,
            p50_us: Some(us(0.50)),
            p99_us: Some(us(0.99)),
            detail: format!(
                "load {load_s:.1} s, {} requests, {} clients",
                mix.ops, sizes.clients
            ),
            tree: None,
        })
    })();
    kv::shutdown(proto, port);
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut exited = false;
    while Instant::now() < deadline {
        match running.try_wait() {
            Ok(None) => std::thread::sleep(Duration::from_millis(20)),
            Ok(Some(_)) => {
                exited = true;
                break;
            }
            Err(_) => break,
        }
    }
    let _ = cleanup.run(running.token);
    if !exited {
        // Killed by the token: reap it, reading its zombie first (its children, orphaned by
        // the kill, are reaped by init and not counted).
        while let Ok(None) = running.try_wait() {
            std::thread::sleep(Duration::from_millis(5));
        }
    }
    let _ = running.child.wait();
    let tree = running.watch.finish();
    result.map(|m| Measured {
        tree: Some(tree),
        ..m
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workload_names_round_trip() {
        for w in Workload::ALL {
            assert_eq!(parse_workload(&w.to_string()).unwrap(), w);
        }
        assert_eq!(parse_workload("stride:64").unwrap(), Workload::Stride(64));
    }

    #[test]
    fn bad_workloads_say_what_is_expected() {
        assert!(parse_workload("stride:1")
            .unwrap_err()
            .contains("at least 2"));
        assert!(parse_workload("stride:x")
            .unwrap_err()
            .contains("bad stride"));
        let err = parse_workload("postgres").unwrap_err();
        assert!(
            err.contains("unknown workload `postgres`") && err.contains("stride:K"),
            "{err}"
        );
        assert!(parse_workload_list(",")
            .unwrap_err()
            .contains("no workload"));
    }

    #[test]
    fn workload_list_expands_all_and_dedups() {
        let l = parse_workload_list("seq,all,seq").unwrap().0;
        assert_eq!(l, Workload::ALL.to_vec());
        let l = parse_workload_list("redis, stride:4").unwrap().0;
        assert_eq!(l, vec![Workload::Redis, Workload::Stride(4)]);
        let l = parse_workload_list("kmeans,mp").unwrap().0;
        assert_eq!(l, vec![Workload::Kmeans, Workload::Mp]);
        assert!(Workload::ALL.contains(&Workload::Mp));
        assert_eq!(Workload::Mp.metric(), Metric::Completion);
    }

    /// mp.py at tiny sizes, straight from python (no harness): it forks its workers, their
    /// checks pass, and it prints the JSON line the harness reads. Skipped without numpy.
    #[test]
    fn mp_script_runs_and_prints_its_times() {
        let python = "/usr/bin/python3";
        let has_numpy = Command::new(python)
            .args(["-c", "import numpy"])
            .status()
            .map(|s| s.success())
            .unwrap_or(false);
        assert!(
            has_numpy,
            "{python} cannot import numpy: install the Debian package python3-numpy"
        );
        let dir = tempfile::tempdir().unwrap();
        let script = dir.path().join("mp.py");
        fs::write(&script, MP_PY).unwrap();
        let out = Command::new(python)
            .arg(&script)
            .args(["--worker-bytes", "4MiB", "--workers", "3", "--passes", "2"])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{stderr}");
        let p = dir.path().join("out");
        fs::write(&p, &out.stdout).unwrap();
        let v = json_line(&p).unwrap();
        assert_eq!(v["checksum_ok"], true);
        assert_eq!(num(&v, "workers"), Some(3.0));
        assert_eq!(num(&v, "data_bytes"), Some((12 << 20) as f64));
        for key in ["generate_s", "passes_s", "elapsed_s"] {
            assert!(num(&v, key).is_some_and(|s| s > 0.0), "{key}: {v}");
        }
        // The harness passes plain byte counts; a size below a page is refused.
        let out = Command::new(python)
            .arg(&script)
            .args(["--worker-bytes", "100"])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2));
    }

    fn sizes(heap_bytes: u64, passes: u32) -> Sizes {
        Sizes {
            wss_bytes: 1 << 20,
            passes,
            keys: 2,
            ops: 1,
            clients: 1,
            zipf_theta: 0.99,
            matrix_n: 2,
            kmeans_samples: 16,
            kmeans_features: 1,
            kmeans_clusters: 2,
            kmeans_iterations: 1,
            mp_worker_bytes: 4096,
            mp_workers: 1,
            heap_bytes,
            timeout: Duration::from_secs(60),
            seed: 42,
        }
    }

    fn strings(argv: &[OsString]) -> Vec<String> {
        argv.iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect()
    }

    #[test]
    fn heap_command_lines_pin_the_runtimes_heap_sizes() {
        let s = sizes(100 << 20, 2);
        let a = strings(&node_argv(
            Path::new("/n/node"),
            Path::new("/t/heap.js"),
            &s,
        ));
        assert_eq!(
            a,
            [
                "/n/node",
                "--max-old-space-size=912",
                "--max-semi-space-size=16",
                "/t/heap.js",
                "104857600",
                "2",
                "42"
            ]
        );
        let a = strings(&java_argv(
            Path::new("/j/java"),
            Path::new("/t/classes"),
            &s,
        ));
        assert_eq!(
            a,
            [
                "/j/java",
                "-XX:-UseContainerSupport",
                "-XX:+UseG1GC",
                "-XX:-UsePerfData",
                "-Xmx328m",
                "-cp",
                "/t/classes",
                "Heap",
                "104857600",
                "2",
                "42"
            ]
        );
        // A size that is not whole MiB rounds the limits up.
        let a = strings(&java_argv(
            Path::new("java"),
            Path::new("c"),
            &sizes((1 << 20) + 1, 1),
        ));
        assert_eq!(a[4], "-Xmx132m");
    }

    /// Runs one heap program's command line (as the harness builds it, without a wrap) and
    /// returns its JSON result.
    fn run_heap(argv: &[OsString]) -> serde_json::Value {
        let out = Command::new(&argv[0]).args(&argv[1..]).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{argv:?}: {stderr}");
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("out");
        fs::write(&p, &out.stdout).unwrap();
        json_line(&p).unwrap()
    }

    /// heap.js and Heap.java at tiny sizes, straight from the runtimes (no harness): their
    /// checks pass, they print the JSON line the harness reads, and, given the same number of
    /// records, the same pass sums (the two programs compute the same values from the indices;
    /// the sums are run-independent). Needs node and a JDK (scripts/setup.sh installs them).
    #[test]
    fn heap_programs_run_check_and_agree() {
        let node = which("node").expect("node is not installed: apt-get install nodejs");
        let javac = which("javac")
            .expect("javac is not installed: apt-get install openjdk-17-jdk-headless");
        let java =
            which("java").expect("java is not installed: apt-get install openjdk-17-jre-headless");
        let dir = tempfile::tempdir().unwrap();
        let script = dir.path().join("heap.js");
        fs::write(&script, HEAP_JS).unwrap();
        let classes = dir.path().join("classes");
        compile_heap_java(&javac, dir.path(), &classes).unwrap();
        // 100 000 records in each: 56 and 28 bytes a record.
        let js = run_heap(&node_argv(&node, &script, &sizes(5_600_000, 2)));
        let jv = run_heap(&java_argv(&java, &classes, &sizes(2_800_000, 2)));
        for v in [&js, &jv] {
            assert_eq!(v["checksum_ok"], true, "{v}");
            assert_eq!(num(v, "records"), Some(100_000.0), "{v}");
            assert_eq!(v["sums"].as_array().map(Vec::len), Some(2), "{v}");
            for key in ["generate_s", "passes_s", "elapsed_s", "heap_used_bytes"] {
                assert!(num(v, key).is_some_and(|s| s > 0.0), "{key}: {v}");
            }
            assert!(
                heap_detail(v).contains("100000 records"),
                "{}",
                heap_detail(v)
            );
        }
        assert_eq!(js["sums"], jv["sums"], "node {js} java {jv}");
        // A size below a page is refused with exit status 2.
        for argv in [
            node_argv(&node, &script, &sizes(100, 1)),
            java_argv(&java, &classes, &sizes(100, 1)),
        ] {
            let out = Command::new(&argv[0]).args(&argv[1..]).output().unwrap();
            assert_eq!(out.status.code(), Some(2), "{argv:?}");
            assert!(
                String::from_utf8_lossy(&out.stderr).contains("HEAP_BYTES must be"),
                "{argv:?}"
            );
        }
    }

    #[test]
    fn heap_workloads_parse_and_measure_completion() {
        assert_eq!(parse_workload("node-heap").unwrap(), Workload::NodeHeap);
        assert_eq!(parse_workload("jvm-heap").unwrap(), Workload::JvmHeap);
        assert_eq!(Workload::NodeHeap.metric(), Metric::Completion);
        assert_eq!(Workload::JvmHeap.metric(), Metric::Completion);
        let l = parse_workload_list("mp,node-heap,jvm-heap").unwrap().0;
        assert_eq!(l, vec![Workload::Mp, Workload::NodeHeap, Workload::JvmHeap]);
        assert!(parse_workload("java-heap")
            .unwrap_err()
            .contains("jvm-heap"));
    }

    #[test]
    fn wraps_build_the_expected_command_lines() {
        let argv: Vec<OsString> = vec!["/bin/prog".into(), "a b".into()];
        let c = Wrap::Cgroup("/sys/fs/cgroup/memory/x/cgroup.procs".into()).command(&argv);
        let args: Vec<_> = c
            .get_args()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        assert_eq!(c.get_program(), "/bin/sh");
        assert_eq!(args[2], "/sys/fs/cgroup/memory/x/cgroup.procs");
        assert_eq!(&args[3..], ["/bin/prog", "a b"]);
        let c = Wrap::Farmem {
            exe: "/x/farmem".into(),
            local_donor: None,
            budget_bytes: 1 << 20,
            stats: "/tmp/s.json".into(),
            extra: vec!["--prefetch=leap".into()],
        }
        .command(&argv);
        let args: Vec<_> = c
            .get_args()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        assert_eq!(
            args,
            [
                "run",
                "--local-mem",
                "1048576",
                "--stats",
                "/tmp/s.json",
                "--quiet",
                "--prefetch=leap",
                "--",
                "/bin/prog",
                "a b"
            ]
        );
        // farmem-tcp: the embedded TCP donor instead of the host tier.
        let c = Wrap::Farmem {
            exe: "/x/farmem".into(),
            local_donor: Some("tcp"),
            budget_bytes: 1 << 20,
            stats: "/tmp/s.json".into(),
            extra: vec![],
        }
        .command(&argv);
        let args: Vec<_> = c
            .get_args()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        assert_eq!(
            args,
            [
                "run",
                "--local-donor",
                "tcp",
                "--local-mem",
                "1048576",
                "--stats",
                "/tmp/s.json",
                "--quiet",
                "--",
                "/bin/prog",
                "a b"
            ]
        );
    }

    /// The cgroup wrapper really writes the pid and execs (a temp file stands in for
    /// cgroup.procs, so no root side effects).
    #[test]
    fn cgroup_wrapper_writes_its_pid_then_execs() {
        let dir = tempfile::tempdir().unwrap();
        let procs = dir.path().join("cgroup.procs");
        let argv: Vec<OsString> = vec!["/bin/sh".into(), "-c".into(), "echo $$".into()];
        let out = Wrap::Cgroup(procs.clone()).command(&argv).output().unwrap();
        assert!(out.status.success());
        let written = fs::read_to_string(&procs).unwrap();
        // exec keeps the pid: what the program prints is what joined the cgroup.
        assert_eq!(written.trim(), String::from_utf8_lossy(&out.stdout).trim());
    }

    #[test]
    fn json_result_line_is_found_after_other_output() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("out");
        fs::write(&p, "warming up\n{\"avg_ns\": 1500.0, \"p50_ns\": 900}\n").unwrap();
        let v = json_line(&p).unwrap();
        assert_eq!(num(&v, "avg_ns"), Some(1500.0));
        fs::write(&p, "no json here\n").unwrap();
        assert!(json_line(&p)
            .unwrap_err()
            .to_string()
            .contains("printed no JSON"));
    }
}
