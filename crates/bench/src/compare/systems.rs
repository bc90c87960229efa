//! The systems a workload runs under — `local`, `farmem`, `farmem-tcp`, `farmem-remote`, `swap`,
//! `zram` — and the machine
//! state they need: memory cgroups (v1 or v2), a swap file, a zram device, and the machine's own
//! swap areas, which are switched off for the run and switched back on afterwards.
//!
//! # Design
//!
//! Every change to the machine is paired, at the moment it is made, with the action that undoes
//! it, pushed on a [`Cleanup`] stack. Normal teardown runs those actions one by one; an early
//! return or a panic runs the rest when the [`CleanupGuard`] drops; SIGINT/SIGTERM run them from
//! the signal thread ([`install_signal_cleanup`]) before the process exits with 130/143. Running
//! processes are entries too (kill their process group), so an interrupted run never leaves a
//! workload holding a swap area that must be switched off.
//!
//! # Limitations
//!
//! Swap areas are switched with the util-linux `swapon`/`swapoff`/`mkswap` programs and the
//! swap file is allocated with `fallocate`; a SIGKILL of the harness cannot be caught, and then
//! `swapoff`, `rmdir` of the cgroup and `echo 1 > /sys/class/zram-control/hot_remove` are left
//! to the operator (the progress lines name the swap file and the device).

use std::collections::BTreeSet;
use std::fmt;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::ThreadId;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

/// One way of giving a workload its memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum SystemKind {
    /// No limit: the baseline, and the run that measures the workload's peak memory.
    Local,
    /// `farmem run --local-mem LIMIT`: pages beyond the budget go to the host tier (the host's
    /// `farmem node`, else a private one), or to the donors named with `--farmem-arg`.
    Farmem,
    /// `farmem run --local-donor tcp --local-mem LIMIT`: no host tier; pages beyond the budget
    /// go to the embedded donor over loopback TCP (farmem's default before the host tier).
    FarmemTcp,
    /// `farmem run --donor ADDR --token-file FILE --local-mem LIMIT`: pages beyond the budget go
    /// to a `farmem donor` on another "machine" (a network namespace of its own behind a veth
    /// link, [`super::remote`]), sealed as `--seal auto` chooses for a donor on another host.
    FarmemRemote,
    /// Linux swap to a swap file on local disk, the workload in a memory cgroup with the limit.
    Swap,
    /// Linux swap on a zram device (lz4), the workload in a memory cgroup with the limit.
    Zram,
}

impl SystemKind {
    /// Every system, in the order runs happen.
    pub const ALL: [SystemKind; 6] = [
        SystemKind::Local,
        SystemKind::Farmem,
        SystemKind::FarmemTcp,
        SystemKind::FarmemRemote,
        SystemKind::Swap,
        SystemKind::Zram,
    ];

    /// The name used on the command line and in the output.
    pub fn name(self) -> &'static str {
        match self {
            SystemKind::Local => "local",
            SystemKind::Farmem => "farmem",
            SystemKind::FarmemTcp => "farmem-tcp",
            SystemKind::FarmemRemote => "farmem-remote",
            SystemKind::Swap => "swap",
            SystemKind::Zram => "zram",
        }
    }

    /// What `farmem run` is given for `--local-donor` (None: its default, the host tier).
    pub fn local_donor(self) -> Option<&'static str> {
        (self == SystemKind::FarmemTcp).then_some("tcp")
    }
}

impl fmt::Display for SystemKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Parses `--systems`: a comma-separated list of `local`, `farmem`, `farmem-tcp`,
/// `farmem-remote`, `swap`, `zram` (or `all`).
/// `local` is always included (it measures the peak every limit derives from and is the
/// baseline of every ratio); the result is in run order without duplicates.
pub fn parse_systems(text: &str) -> Result<Vec<SystemKind>, String> {
    let mut set = BTreeSet::new();
    set.insert(SystemKind::Local);
    let mut any = false;
    for part in text.split(',').map(str::trim) {
        if part.is_empty() {
            continue;
        }
        any = true;
        if part == "all" {
            set.extend(SystemKind::ALL);
            continue;
        }
        let kind = SystemKind::ALL.into_iter().find(|k| k.name() == part).ok_or_else(|| {
            format!("unknown system `{part}`: expected a comma-separated list of local, farmem, farmem-tcp, farmem-remote, swap, zram (or all)")
        })?;
        set.insert(kind);
    }
    if !any {
        return Err(
            "no system given: expected e.g. `local,farmem,farmem-remote,swap,zram`".to_string(),
        );
    }
    Ok(set.into_iter().collect())
}

// ---------------------------------------------------------------------------------------------
// Cleanup stack

type Action = Box<dyn FnOnce() -> anyhow::Result<()> + Send>;

struct Entry {
    id: u64,
    what: String,
    action: Action,
}

/// Handle of one pending undo action.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use = "a cleanup token must be run or discarded"]
pub struct Token(u64);

/// The stack of actions that undo what the harness changed on the machine. Cheap to clone;
/// clones share the stack (the signal thread holds one).
///
/// Actions run one at a time: running one holds an execution lock that is reentrant for the
/// thread holding it (so an action may run other tokens), and the signal path's
/// [`Cleanup::close_and_run_all`] waits for the action in progress on the main thread, then
/// runs the rest. A change recorded after that is undone at once.
#[derive(Clone, Default)]
pub struct Cleanup {
    inner: Arc<Inner>,
}

#[derive(Default)]
struct Inner {
    entries: Mutex<Vec<Entry>>,
    exec: Mutex<ExecState>,
    exec_free: Condvar,
}

#[derive(Default)]
struct ExecState {
    owner: Option<ThreadId>,
    depth: usize,
    closed: bool,
}

struct ExecGuard<'a>(&'a Inner);

impl Drop for ExecGuard<'_> {
    fn drop(&mut self) {
        let mut st = lock_ignoring_poison(&self.0.exec);
        st.depth -= 1;
        if st.depth == 0 {
            st.owner = None;
            self.0.exec_free.notify_all();
        }
    }
}

fn lock_ignoring_poison<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A panic inside an action must not make the rest of the cleanup impossible.
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

static NEXT_TOKEN: AtomicU64 = AtomicU64::new(1);

impl Cleanup {
    /// An empty stack.
    pub fn new() -> Cleanup {
        Cleanup::default()
    }

    /// Records `action` as the undo of a change just made; `what` names it in messages.
    /// After [`Cleanup::close_and_run_all`] began, the action runs at once instead.
    pub fn push(
        &self,
        what: impl Into<String>,
        action: impl FnOnce() -> anyhow::Result<()> + Send + 'static,
    ) -> Token {
        let id = NEXT_TOKEN.fetch_add(1, Ordering::Relaxed);
        let what = what.into();
        if lock_ignoring_poison(&self.inner.exec).closed {
            if let Err(err) = action() {
                eprintln!("farmem-bench: cleanup failed: {what}: {err:#}");
            }
            return Token(id);
        }
        let entry = Entry {
            id,
            what,
            action: Box::new(action),
        };
        self.lock().push(entry);
        Token(id)
    }

    fn enter(&self) -> ExecGuard<'_> {
        let me = std::thread::current().id();
        let mut st = lock_ignoring_poison(&self.inner.exec);
        while st.owner.is_some_and(|o| o != me) {
            st = self
                .inner
                .exec_free
                .wait(st)
                .unwrap_or_else(|poisoned| poisoned.into_inner());
        }
        st.owner = Some(me);
        st.depth += 1;
        ExecGuard(&self.inner)
    }

    /// Runs the action of `token` now (normal teardown). Does nothing if it already ran.
    pub fn run(&self, token: Token) -> anyhow::Result<()> {
        let _exec = self.enter();
        let entry = {
            let mut entries = self.lock();
            let Some(pos) = entries.iter().position(|e| e.id == token.0) else {
                return Ok(()); // already run (by the signal path or an enclosing action)
            };
            entries.remove(pos)
        };
        let what = entry.what.clone();
        (entry.action)().with_context(|| format!("cleanup failed: {what}"))
    }

    /// Runs every pending action, newest first; an action that fails does not stop the others.
    /// Returns what failed.
    pub fn run_all(&self) -> Vec<String> {
        let _exec = self.enter();
        let mut failures = Vec::new();
        loop {
            let Some(entry) = self.lock().pop() else {
                break;
            };
            if let Err(err) = (entry.action)() {
                failures.push(format!("{}: {err:#}", entry.what));
            }
        }
        failures
    }

    /// The signal path: waits for the action in progress, marks the stack closed (later
    /// changes are undone as soon as they are recorded) and runs every pending action.
    pub fn close_and_run_all(&self) -> Vec<String> {
        let _exec = self.enter();
        lock_ignoring_poison(&self.inner.exec).closed = true;
        self.run_all()
    }

    /// Names of the pending actions, oldest first.
    pub fn pending(&self) -> Vec<String> {
        self.lock().iter().map(|e| e.what.clone()).collect()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Entry>> {
        lock_ignoring_poison(&self.inner.entries)
    }
}

/// Runs every pending cleanup action when dropped (early return, `?`, panic).
pub struct CleanupGuard(pub Cleanup);

impl Drop for CleanupGuard {
    fn drop(&mut self) {
        for failure in self.0.run_all() {
            eprintln!("farmem-bench: cleanup failed: {failure}");
        }
    }
}

/// Starts a thread that, on SIGINT or SIGTERM, undoes every pending change (killing the
/// running workload first) and exits with 128 + the signal number.
pub fn install_signal_cleanup(cleanup: Cleanup) -> anyhow::Result<()> {
    use signal_hook::consts::{SIGINT, SIGTERM};
    let mut signals = signal_hook::iterator::Signals::new([SIGINT, SIGTERM])
        .context("cannot install the SIGINT/SIGTERM handler that restores the swap state")?;
    std::thread::Builder::new()
        .name("bench-signals".into())
        .spawn(move || {
            if let Some(sig) = signals.forever().next() {
                eprintln!(
                    "farmem-bench: interrupted (signal {sig}): undoing {} change(s) to the machine",
                    cleanup.pending().len()
                );
                for failure in cleanup.close_and_run_all() {
                    eprintln!("farmem-bench: cleanup failed: {failure}");
                }
                std::process::exit(128 + sig);
            }
        })
        .context("cannot start the signal thread")?;
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Machine facts

/// Whether this process runs as root (effective uid 0), from /proc/self/status.
pub fn is_root() -> bool {
    fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines().find(|l| l.starts_with("Uid:")).map(|l| {
                l.split_whitespace()
                    .nth(2)
                    .map(|euid| euid == "0")
                    .unwrap_or(false)
            })
        })
        .unwrap_or(false)
}

/// Flushes dirty data and drops the page cache, dentries and inodes, so that every run starts
/// with the same cold cache.
pub fn drop_page_cache() -> anyhow::Result<()> {
    let status = Command::new("sync").status().context("cannot run `sync`")?;
    if !status.success() {
        bail!("`sync` failed with {status}");
    }
    fs::write("/proc/sys/vm/drop_caches", "3")
        .context("cannot drop the page cache (write 3 to /proc/sys/vm/drop_caches): run as root")
}

/// A field of /proc/vmstat.
pub fn parse_vmstat_field(text: &str, name: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let mut it = l.split_whitespace();
        (it.next()? == name).then(|| it.next()?.parse().ok())?
    })
}

/// Held while a benchmark changes the machine's swap and cgroups.
pub struct MachineLock {
    _lock: nix::fcntl::Flock<fs::File>,
}

/// Path of the lock file that keeps two `farmem-bench compare` runs from overlapping.
pub const LOCK_PATH: &str = "/run/farmem-bench.lock";

/// Takes the machine-wide benchmark lock, or says which process holds it.
pub fn lock_machine() -> anyhow::Result<MachineLock> {
    use std::io::{Read, Seek, Write};
    let mut file = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(LOCK_PATH)
        .with_context(|| format!("cannot open the lock file {LOCK_PATH}"))?;
    match nix::fcntl::Flock::lock(
        file.try_clone()?,
        nix::fcntl::FlockArg::LockExclusiveNonblock,
    ) {
        Ok(mut lock) => {
            lock.set_len(0)?;
            lock.rewind()?;
            write!(lock, "{}", std::process::id())?;
            Ok(MachineLock { _lock: lock })
        }
        Err((_, errno)) => {
            let mut holder = String::new();
            let _ = file.read_to_string(&mut holder);
            bail!(
                "another `farmem-bench compare` (pid {}) is changing this machine's swap ({errno}):                  wait for it to finish; two runs would switch each other's swap areas off",
                holder.trim()
            )
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Memory cgroups

/// Which memory controller the machine offers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CgroupMount {
    /// cgroup v1: the `memory` hierarchy is mounted at this path.
    V1(PathBuf),
    /// cgroup v2: the unified hierarchy is mounted here and offers the `memory` controller.
    V2(PathBuf),
}

/// Finds the memory controller from the text of /proc/self/mounts. `v2_has_memory` tells
/// whether a cgroup2 mount point lists `memory` in its `cgroup.controllers` (a v1 hierarchy
/// that holds the controller wins, as the kernel then keeps it away from v2).
pub fn find_memory_cgroup(
    mounts: &str,
    v2_has_memory: impl Fn(&Path) -> bool,
) -> Option<CgroupMount> {
    let mut v2 = None;
    for line in mounts.lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        if fields.len() < 4 {
            continue;
        }
        let (mount_point, fstype, options) = (fields[1], fields[2], fields[3]);
        match fstype {
            "cgroup" if options.split(',').any(|o| o == "memory") => {
                return Some(CgroupMount::V1(PathBuf::from(mount_point)));
            }
            "cgroup2" if v2.is_none() && v2_has_memory(Path::new(mount_point)) => {
                v2 = Some(CgroupMount::V2(PathBuf::from(mount_point)));
            }
            _ => {}
        }
    }
    v2
}

/// The machine's memory controller, or why there is none.
pub fn detect_memory_cgroup() -> anyhow::Result<CgroupMount> {
    let mounts =
        fs::read_to_string("/proc/self/mounts").context("cannot read /proc/self/mounts")?;
    find_memory_cgroup(&mounts, |p| {
        fs::read_to_string(p.join("cgroup.controllers"))
            .map(|c| c.split_whitespace().any(|w| w == "memory"))
            .unwrap_or(false)
    })
    .context(
        "no memory cgroup controller is mounted (neither a cgroup v1 `memory` hierarchy nor a \
         cgroup2 mount offering `memory`): mount one, e.g. `mount -t cgroup -o memory none /sys/fs/cgroup/memory`",
    )
}

/// A memory cgroup the harness created for one run; removed by its cleanup entry.
#[derive(Clone, Debug)]
pub struct Cgroup {
    pub path: PathBuf,
    pub mount: CgroupMount,
}

impl Cgroup {
    /// Creates `farmem-bench-<pid>-<n>` under the controller with the given limit (None: no
    /// limit) and registers its removal.
    pub fn create(
        mount: &CgroupMount,
        limit_bytes: Option<u64>,
        cleanup: &Cleanup,
    ) -> anyhow::Result<(Cgroup, Token)> {
        static SEQ: AtomicU64 = AtomicU64::new(0);
        let name = format!(
            "farmem-bench-{}-{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        );
        let root = match mount {
            CgroupMount::V1(p) | CgroupMount::V2(p) => p.clone(),
        };
        if let CgroupMount::V2(_) = mount {
            // The child only gets memory.* files if the parent delegates the controller.
            let ctl = root.join("cgroup.subtree_control");
            let current = fs::read_to_string(&ctl).unwrap_or_default();
            if !current.split_whitespace().any(|w| w == "memory") {
                fs::write(&ctl, "+memory").with_context(|| {
                    format!("cannot enable the memory controller in {}", ctl.display())
                })?;
            }
        }
        let path = root.join(name);
        fs::create_dir(&path).with_context(|| {
            format!(
                "cannot create the memory cgroup {}: run as root",
                path.display()
            )
        })?;
        let cg = Cgroup {
            path: path.clone(),
            mount: mount.clone(),
        };
        let token = cleanup.push(format!("remove cgroup {}", path.display()), move || {
            remove_cgroup_dir(&path)
        });
        if let Some(limit) = limit_bytes {
            let (file, value) = match mount {
                CgroupMount::V1(_) => ("memory.limit_in_bytes", limit.to_string()),
                CgroupMount::V2(_) => ("memory.max", limit.to_string()),
            };
            fs::write(cg.path.join(file), value)
                .with_context(|| format!("cannot set {file} of {}", cg.path.display()))?;
        }
        Ok((cg, token))
    }

    /// The file a process writes its pid to in order to join.
    pub fn procs_file(&self) -> PathBuf {
        self.path.join("cgroup.procs")
    }

    /// The highest memory use the cgroup saw, bytes.
    pub fn peak_bytes(&self) -> anyhow::Result<u64> {
        let file = match self.mount {
            CgroupMount::V1(_) => "memory.max_usage_in_bytes",
            CgroupMount::V2(_) => "memory.peak",
        };
        let text = fs::read_to_string(self.path.join(file))
            .with_context(|| format!("cannot read {file} of {}", self.path.display()))?;
        text.trim()
            .parse()
            .with_context(|| format!("{file} is not a number: {text:?}"))
    }
}

fn remove_cgroup_dir(path: &Path) -> anyhow::Result<()> {
    // Killed processes take a moment to leave (longer when their memory is in swap).
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match fs::remove_dir(path) {
            Ok(()) => return Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) if Instant::now() < deadline => {
                let _ = e;
                std::thread::sleep(Duration::from_millis(50));
            }
            Err(e) => {
                return Err(e).with_context(|| {
                    format!(
                        "cannot remove cgroup {} (processes still in it?)",
                        path.display()
                    )
                })
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Swap areas

/// One line of /proc/swaps.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SwapArea {
    pub path: String,
    pub size_kib: u64,
    pub priority: i64,
}

/// Parses /proc/swaps (the kernel escapes spaces in paths as `\040`).
pub fn parse_swaps(text: &str) -> Vec<SwapArea> {
    text.lines()
        .skip(1)
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            if f.len() < 5 {
                return None;
            }
            Some(SwapArea {
                path: f[0].replace("\\040", " "),
                size_kib: f[2].parse().ok()?,
                priority: f[4].parse().ok()?,
            })
        })
        .collect()
}

/// The swap areas active now.
pub fn active_swaps() -> anyhow::Result<Vec<SwapArea>> {
    Ok(parse_swaps(
        &fs::read_to_string("/proc/swaps").context("cannot read /proc/swaps")?,
    ))
}

fn run_tool(program: &str, args: &[&str]) -> anyhow::Result<()> {
    let out = Command::new(program)
        .args(args)
        .output()
        .with_context(|| format!("cannot run `{program}` (util-linux): is it installed?"))?;
    if !out.status.success() {
        bail!(
            "`{program} {}` failed ({}): {}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

fn swapon(path: &str, priority: i64) -> anyhow::Result<()> {
    run_tool("swapon", &["-p", &priority.to_string(), path])
}

fn swapoff(path: &str) -> anyhow::Result<()> {
    run_tool("swapoff", &[path])
}

/// Switches off the machine's own swap areas so that only the area under test is active, and
/// registers switching them back on (same priorities).
pub fn quiesce_machine_swap(cleanup: &Cleanup) -> anyhow::Result<Vec<SwapArea>> {
    let areas = active_swaps()?;
    for area in &areas {
        swapoff(&area.path).with_context(|| {
            format!(
                "cannot switch off the machine's swap area {} for the benchmark",
                area.path
            )
        })?;
        let restore = area.clone();
        // Restoring is its own entry per area so one failure does not keep the others off.
        let _token = cleanup.push(
            format!("switch swap area {} back on", area.path),
            move || swapon(&restore.path, restore.priority),
        );
    }
    Ok(areas)
}

/// An active swap area the harness made: a swap file or a zram device.
pub struct SwapUnderTest {
    pub description: String,
    token: Token,
}

impl SwapUnderTest {
    /// Switches the area off and removes it.
    pub fn teardown(self, cleanup: &Cleanup) -> anyhow::Result<()> {
        cleanup.run(self.token)
    }
}

/// Creates a swap file of `size_bytes` in `dir` (allocated, never sparse), and switches it on.
pub fn create_swap_file(
    dir: &Path,
    size_bytes: u64,
    cleanup: &Cleanup,
) -> anyhow::Result<SwapUnderTest> {
    let path = dir.join(format!("farmem-bench-{}.swap", std::process::id()));
    let path_str = path
        .to_str()
        .context("swap directory path is not UTF-8")?
        .to_string();
    let _ = fs::remove_file(&path);
    let remove_path = path.clone();
    let file_token =
        cleanup.push(
            format!("remove swap file {path_str}"),
            move || match fs::remove_file(&remove_path) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    Err(e).with_context(|| format!("cannot remove {}", remove_path.display()))
                }
                _ => Ok(()),
            },
        );
    let size_mib = size_bytes.div_ceil(1 << 20).max(16);
    let result = (|| {
        run_tool("fallocate", &["-l", &format!("{size_mib}MiB"), &path_str])
            .with_context(|| format!("cannot allocate the swap file in {}", dir.display()))?;
        use std::os::unix::fs::PermissionsExt;
        fs::set_permissions(&path, fs::Permissions::from_mode(0o600))?;
        run_tool("mkswap", &[&path_str])?;
        swapon(&path_str, 10)
    })();
    if let Err(err) = result {
        let _ = cleanup.run(file_token);
        return Err(err);
    }
    let off_path = path_str.clone();
    let off_token = cleanup.push(format!("switch off swap file {path_str}"), move || {
        swapoff(&off_path)
    });
    // One token for the pair: swapoff, then remove the file.
    let c = cleanup.clone();
    let token = cleanup.push(format!("swap file {path_str}"), move || {
        let off = c.run(off_token);
        let rm = c.run(file_token);
        off.and(rm)
    });
    Ok(SwapUnderTest {
        description: format!("swap file {path_str} ({size_mib} MiB)"),
        token,
    })
}

/// Creates a zram device of `size_bytes` (uncompressed capacity) with lz4 and switches it on.
pub fn create_zram(size_bytes: u64, cleanup: &Cleanup) -> anyhow::Result<SwapUnderTest> {
    let control = Path::new("/sys/class/zram-control/hot_add");
    if !control.exists() {
        bail!("zram is not available: /sys/class/zram-control is missing (the kernel has no zram module; `modprobe zram` where modules can be loaded)");
    }
    let id: u32 = fs::read_to_string(control)
        .context("cannot add a zram device (read /sys/class/zram-control/hot_add)")?
        .trim()
        .parse()
        .context("hot_add returned no device number")?;
    let sys = PathBuf::from(format!("/sys/block/zram{id}"));
    let dev = format!("/dev/zram{id}");
    let remove_token = cleanup.push(format!("remove zram device {dev}"), move || {
        let _ = fs::write(format!("/sys/block/zram{id}/reset"), "1");
        fs::write("/sys/class/zram-control/hot_remove", id.to_string())
            .with_context(|| format!("cannot remove zram device {id} (hot_remove)"))
    });
    let result = (|| {
        let algos = fs::read_to_string(sys.join("comp_algorithm")).unwrap_or_default();
        if !algos
            .split_whitespace()
            .any(|a| a.trim_matches(['[', ']']) == "lz4")
        {
            bail!(
                "zram on this kernel has no lz4 compressor (offers: {})",
                algos.trim()
            );
        }
        fs::write(sys.join("comp_algorithm"), "lz4").context("cannot select lz4 for zram")?;
        fs::write(sys.join("disksize"), size_bytes.to_string())
            .context("cannot size the zram device")?;
        if !Path::new(&dev).exists() {
            bail!("{dev} did not appear (no devtmpfs/udev to create the device node)");
        }
        run_tool("mkswap", &[&dev])?;
        swapon(&dev, 10)
    })();
    if let Err(err) = result {
        let _ = cleanup.run(remove_token);
        return Err(err);
    }
    let off_dev = dev.clone();
    let off_token = cleanup.push(format!("switch off {dev}"), move || swapoff(&off_dev));
    let c = cleanup.clone();
    let token = cleanup.push(format!("zram device {dev}"), move || {
        let off = c.run(off_token);
        let rm = c.run(remove_token);
        off.and(rm)
    });
    Ok(SwapUnderTest {
        description: format!("{dev} (lz4, {} MiB)", size_bytes >> 20),
        token,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn systems_parse_in_run_order_with_local_always_first() {
        assert_eq!(
            parse_systems("zram,swap").unwrap(),
            vec![SystemKind::Local, SystemKind::Swap, SystemKind::Zram]
        );
        assert_eq!(parse_systems("all").unwrap(), SystemKind::ALL.to_vec());
        assert_eq!(
            parse_systems("farmem, farmem").unwrap(),
            vec![SystemKind::Local, SystemKind::Farmem]
        );
    }

    #[test]
    fn farmem_tcp_is_a_system_of_its_own_beside_farmem() {
        assert_eq!(
            parse_systems("farmem-tcp, swap,farmem").unwrap(),
            vec![
                SystemKind::Local,
                SystemKind::Farmem,
                SystemKind::FarmemTcp,
                SystemKind::Swap
            ]
        );
        assert_eq!(SystemKind::FarmemTcp.to_string(), "farmem-tcp");
        assert!(SystemKind::ALL.contains(&SystemKind::FarmemTcp));
        for k in SystemKind::ALL {
            assert_eq!(parse_systems(k.name()).unwrap().last(), Some(&k), "{k}");
        }
        assert_eq!(SystemKind::FarmemTcp.local_donor(), Some("tcp"));
        assert_eq!(SystemKind::Farmem.local_donor(), None);
        assert_eq!(SystemKind::FarmemRemote.local_donor(), None);
        assert_eq!(
            parse_systems("farmem-remote").unwrap(),
            vec![SystemKind::Local, SystemKind::FarmemRemote]
        );
        let err = parse_systems("farmem_tcp").unwrap_err();
        assert!(err.contains("farmem-tcp"), "{err}");
    }

    #[test]
    fn systems_reject_unknown_and_empty() {
        let err = parse_systems("local,zswap").unwrap_err();
        assert!(err.contains("unknown system `zswap`"), "{err}");
        assert!(parse_systems(" , ").unwrap_err().contains("no system"));
    }

    #[test]
    fn cleanup_runs_newest_first_and_once() {
        let c = Cleanup::new();
        let log = Arc::new(Mutex::new(Vec::new()));
        let mk = |name: &'static str| {
            let log = log.clone();
            move || {
                log.lock().unwrap().push(name);
                Ok(())
            }
        };
        let _a = c.push("a", mk("a"));
        let b = c.push("b", mk("b"));
        let _c = c.push("c", mk("c"));
        c.run(b).unwrap();
        c.run(b).unwrap(); // second run is a no-op
        assert!(c.run_all().is_empty());
        assert!(c.run_all().is_empty());
        assert_eq!(*log.lock().unwrap(), vec!["b", "c", "a"]);
    }

    #[test]
    fn cleanup_failure_does_not_stop_the_rest() {
        let c = Cleanup::new();
        let ran = Arc::new(Mutex::new(0));
        let r = ran.clone();
        let _a = c.push("first", move || {
            *r.lock().unwrap() += 1;
            Ok(())
        });
        let _b = c.push("second", || bail!("swapoff failed"));
        let failures = c.run_all();
        assert_eq!(failures.len(), 1);
        assert!(
            failures[0].starts_with("second: swapoff failed"),
            "{failures:?}"
        );
        assert_eq!(*ran.lock().unwrap(), 1);
    }

    #[test]
    fn guard_runs_what_teardown_left() {
        let c = Cleanup::new();
        let log = Arc::new(Mutex::new(Vec::new()));
        let l1 = log.clone();
        let t = c.push("kill", move || {
            l1.lock().unwrap().push("kill");
            Ok(())
        });
        let l2 = log.clone();
        let _k = c.push("restore swap", move || {
            l2.lock().unwrap().push("restore");
            Ok(())
        });
        c.run(t).unwrap();
        assert_eq!(c.pending(), vec!["restore swap".to_string()]);
        drop(CleanupGuard(c.clone()));
        assert_eq!(*log.lock().unwrap(), vec!["kill", "restore"]);
        assert!(c.pending().is_empty());
    }

    #[test]
    fn nested_tokens_run_their_parts_once() {
        // The shape create_swap_file uses: a pair token that runs two inner tokens.
        let c = Cleanup::new();
        let log = Arc::new(Mutex::new(Vec::new()));
        let (l1, l2) = (log.clone(), log.clone());
        let file = c.push("rm", move || {
            l1.lock().unwrap().push("rm");
            Ok(())
        });
        let off = c.push("off", move || {
            l2.lock().unwrap().push("off");
            Ok(())
        });
        // run_all pops the pair first; its inner runs must not deadlock on the stack's lock.
        let c2 = c.clone();
        let _pair = c.push("pair", move || {
            let a = c2.run(off);
            let b = c2.run(file);
            a.and(b)
        });
        assert_eq!(c.run_all().len(), 0);
        assert_eq!(*log.lock().unwrap(), vec!["off", "rm"]);
    }

    #[test]
    fn signal_path_waits_for_the_action_in_progress() {
        // The main thread is inside an action (swapoff, say) when the signal thread starts the
        // cleanup: the file must not be removed before that action is over.
        let c = Cleanup::new();
        let log = Arc::new(Mutex::new(Vec::new()));
        let l1 = log.clone();
        let _rm = c.push("rm file", move || {
            l1.lock().unwrap().push("rm");
            Ok(())
        });
        let l2 = log.clone();
        let (started_tx, started_rx) = std::sync::mpsc::channel();
        let off = c.push("swapoff", move || {
            started_tx.send(()).unwrap();
            std::thread::sleep(Duration::from_millis(100));
            l2.lock().unwrap().push("off");
            Ok(())
        });
        let c2 = c.clone();
        let main = std::thread::spawn(move || c2.run(off).unwrap());
        started_rx.recv().unwrap();
        assert!(c.close_and_run_all().is_empty());
        main.join().unwrap();
        assert_eq!(*log.lock().unwrap(), vec!["off", "rm"]);
        // After closing, a new change is undone at once.
        let l3 = log.clone();
        let _late = c.push("late", move || {
            l3.lock().unwrap().push("late");
            Ok(())
        });
        assert_eq!(*log.lock().unwrap(), vec!["off", "rm", "late"]);
        assert!(c.pending().is_empty());
    }

    #[test]
    fn mounts_v1_memory_wins_over_v2() {
        let mounts = "tmpfs /sys/fs/cgroup tmpfs rw 0 0\n\
            cgroup /sys/fs/cgroup/cpu cgroup rw,relatime,cpu 0 0\n\
            cgroup /sys/fs/cgroup/memory cgroup rw,relatime,memory 0 0\n\
            cgroup2 /sys/fs/cgroup/unified cgroup2 rw,relatime 0 0\n";
        assert_eq!(
            find_memory_cgroup(mounts, |_| true),
            Some(CgroupMount::V1(PathBuf::from("/sys/fs/cgroup/memory")))
        );
        let v2only = "cgroup2 /sys/fs/cgroup cgroup2 rw,nsdelegate 0 0\n";
        assert_eq!(
            find_memory_cgroup(v2only, |p| p == Path::new("/sys/fs/cgroup")),
            Some(CgroupMount::V2(PathBuf::from("/sys/fs/cgroup")))
        );
        assert_eq!(find_memory_cgroup(v2only, |_| false), None);
    }

    #[test]
    fn proc_swaps_and_vmstat_parse() {
        let text = "Filename\t\t\t\tType\t\tSize\t\tUsed\t\tPriority\n\
            /var/tmp/my\\040swap                         file\t\t65532\t\t0\t\t-2\n\
            /dev/zram1                              partition\t65532\t\t12\t\t100\n";
        let swaps = parse_swaps(text);
        assert_eq!(swaps.len(), 2);
        assert_eq!(
            swaps[0],
            SwapArea {
                path: "/var/tmp/my swap".into(),
                size_kib: 65532,
                priority: -2
            }
        );
        assert_eq!(swaps[1].priority, 100);
        assert_eq!(
            parse_vmstat_field("pswpin 3\npswpout 17\n", "pswpout"),
            Some(17)
        );
        assert_eq!(parse_vmstat_field("pswpin 3\n", "pswpout"), None);
    }
}
