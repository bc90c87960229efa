//! The link between the library and the farmem runtime: start-up, region registration, fork
//! handlers and the stats file.
//!
//! Every function here runs as farmem code (see [`crate::internal`]): what it allocates comes
//! from glibc, never from region memory.

use std::ffi::c_int;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use farmem_contract::LocalMemory;
use farmem_runtime::{
    ForkAdvice, ForkPlan, Runtime, RuntimeConfig, StatsFile, StatsSummary, UnmanagedReport,
};

use crate::config::RunSettings;
use crate::unmanaged;

/// This process's runtime: set at start-up and again in a forked child that starts its own.
/// An atomic pointer to a leaked `Arc`, not a lock: a forked child must be able to read and
/// replace it whatever another thread of the parent was doing at the fork.
static RUNTIME: AtomicPtr<Arc<Runtime>> = AtomicPtr::new(std::ptr::null_mut());
/// Set in a forked child that has no runtime of its own: it never writes the stats file and
/// its memory is plain memory.
static IN_FORK_CHILD: AtomicBool = AtomicBool::new(false);
static REGISTER_WARNINGS: AtomicU64 = AtomicU64::new(0);

/// The runtime serving this process now, if any.
fn runtime() -> Option<&'static Arc<Runtime>> {
    let p = RUNTIME.load(Ordering::Acquire);
    // SAFETY: a non-null pointer comes from `Box::into_raw` in `set_runtime` and is never freed
    // (runtimes live as long as the process), so it is valid for 'static.
    unsafe { p.as_ref() }
}

/// The process the library's state is for (set at start-up, and in a forked child that
/// starts its own runtime): a vfork child, which shares the parent's memory, runs no fork
/// handler and must not write the parent's statistics, has another pid.
static OWNER_PID: AtomicU32 = AtomicU32::new(0);

fn set_runtime(rt: Arc<Runtime>) -> &'static Arc<Runtime> {
    OWNER_PID.store(std::process::id(), Ordering::Release);
    let p = Box::into_raw(Box::new(rt));
    RUNTIME.store(p, Ordering::Release);
    // SAFETY: just leaked; never freed.
    unsafe { &*p }
}

/// Starts the runtime described by `cfg` (nothing in allocator-only mode). Runs in the
/// constructor, as farmem code.
pub(crate) fn start(cfg: &RunSettings) -> Result<(), String> {
    OWNER_PID.store(std::process::id(), Ordering::Release);
    if cfg.allocator_only {
        return Ok(());
    }
    let rt = Runtime::start(runtime_config(cfg)?)
        .map_err(|e| error_chain("starting the farmem runtime", &e))?;
    let rt = set_runtime(rt);
    if let Some(dir) = &cfg.tree_dir {
        join_tree(rt, dir);
    }
    Ok(())
}

/// Takes this process's share of the tree's budget; a process that cannot (it is not in the
/// tree — started through a daemon with the tree's environment — or `farmem run` is gone)
/// keeps its runtime at the least share: slower than a share, but nothing stops or is lost.
fn join_tree(rt: &'static Arc<Runtime>, dir: &std::path::Path) {
    if let Err(e) = crate::tree::join(rt, dir) {
        let kept = crate::tree::keep_least_share(rt);
        eprintln!(
            "farmem: warning: process {} pages within {} KiB of local memory, outside the \
             process tree's shared budget: {e}",
            std::process::id(),
            kept >> 10
        );
    }
}

/// The runtime's configuration from the settings.
fn runtime_config(cfg: &RunSettings) -> Result<RuntimeConfig, String> {
    let token = match &cfg.token_file {
        Some(f) => Some(
            std::fs::read(f).map_err(|e| format!("reading the token file {}: {e}", f.display()))?,
        ),
        None => None,
    };
    // --local-mem covers the region pages and the write-back pool together.
    let mut local = LocalMemory::new(cfg.local_mem_bytes).map_err(|e| e.to_string())?;
    if cfg.tree_dir.is_some() {
        // Every process of a tree has a pool of its own, and its share of the budget can be
        // small: a pool of a fifth of the whole budget each would overcommit it.
        local = local.in_tree();
    }
    let mut rc = RuntimeConfig {
        budget_bytes: local.resident_bytes(),
        pool_bytes: Some(local.pool_bytes()),
        donors: cfg.donors.clone(),
        token,
        thread_hook: Some(Arc::new(crate::mark_runtime_thread)),
        farmem_bin: cfg.farmem_bin.clone(),
        record_trace: cfg.record_trace.clone(),
        seal: cfg.seal,
        tier: cfg.tier.clone(),
        replicas: cfg.replicas,
        backup_file: cfg.backup_file.clone(),
        over_budget: cfg.over_budget,
        ..Default::default()
    };
    if let Some(r) = cfg.heal_rate_bytes {
        rc.heal_rate_bytes = r;
    }
    if let Some(e) = &cfg.evict {
        rc.evict = e.clone();
    }
    if let Some(p) = &cfg.prefetch {
        rc.prefetch = p.clone();
    }
    if let Some(m) = &cfg.prefetch_install {
        rc.prefetch_install = m
            .parse()
            .map_err(|e| error_chain("--prefetch-install", &e))?;
    }
    Ok(rc)
}

fn error_chain(what: &str, e: &dyn std::error::Error) -> String {
    let mut s = format!("{what}: {e}");
    let mut src = e.source();
    while let Some(x) = src {
        s.push_str(&format!(": {x}"));
        src = x.source();
    }
    s
}

/// Makes `[addr, addr + len)` a region. Returns 0 or an errno.
pub(crate) fn register(addr: *mut u8, len: usize, is_heap: bool) -> c_int {
    let Some(rt) = runtime() else {
        return 0; // allocator-only mode: plain memory
    };
    if IN_FORK_CHILD.load(Ordering::Relaxed) {
        return 0; // a forked child has no runtime: its memory is plain memory
    }
    // Heap chunks were reserved and mappings just mapped by the shim: nothing is present yet.
    match rt.register_new(addr, len) {
        Ok(()) => 0,
        Err(e) => {
            if REGISTER_WARNINGS.fetch_add(1, Ordering::Relaxed) < 5 {
                eprintln!(
                    "farmem: warning: {}",
                    error_chain(
                        &format!(
                            "could not make {} at {addr:p} (+{len} bytes) a region",
                            if is_heap { "a heap chunk" } else { "a mapping" }
                        ),
                        &e
                    )
                );
            }
            libc::ENOMEM
        }
    }
}

/// The program gave fork `advice` for `[addr, addr + len)`.
pub(crate) fn set_fork_advice(addr: *mut u8, len: usize, advice: ForkAdvice) {
    if let Some(rt) = runtime() {
        if !IN_FORK_CHILD.load(Ordering::Relaxed) {
            rt.set_fork_advice(addr, len, advice);
        }
    }
}

/// Whether `[addr, addr + len)` overlaps a region (false without a runtime, or in a forked
/// child).
pub(crate) fn overlaps_region(addr: *mut u8, len: usize) -> bool {
    let Some(rt) = runtime() else {
        return false;
    };
    !IN_FORK_CHILD.load(Ordering::Relaxed) && rt.overlaps_region(addr, len)
}

/// Whether a memory lock the program asks for (`mlockall`, or `mlock` over `addr..+len`, all
/// of memory when `None`) is to be skipped: pages farmem manages cannot be locked in RAM and
/// stay within `--local-mem` (`mlockall(MCL_CURRENT)` faulted in every region page and the
/// write-back pool, and locked pages cannot be evicted: memcached -k held 1.08 GB at a 64 MiB
/// budget). Warns once.
pub(crate) fn skip_lock(range: Option<(*mut u8, usize)>) -> bool {
    static WARNED: AtomicBool = AtomicBool::new(false);
    let managed = match range {
        None => runtime().is_some() && !IN_FORK_CHILD.load(Ordering::Relaxed),
        Some((addr, len)) => overlaps_region(addr, len),
    };
    if managed && !WARNED.swap(true, Ordering::Relaxed) {
        crate::internal(|| {
            eprintln!(
                "farmem: warning: process {} asked to lock its memory in RAM (mlock/mlockall); \
                 farmem pages it within --local-mem instead, so the lock is not applied to the \
                 memory farmem manages",
                std::process::id()
            )
        });
    }
    managed
}

thread_local! {
    /// The fork this thread is making ([`Runtime::prepare_fork`]): the child (this thread,
    /// there) registers its regions and borrows what was lent without asking its copy of the
    /// parent's runtime. Per thread, since threads may fork at once; the glibc heap serves it
    /// (internal).
    static FORK_PLAN: std::cell::RefCell<Option<ForkPlan>> = const { std::cell::RefCell::new(None) };
}

extern "C" fn fork_prepare() {
    if let Some(rt) = runtime() {
        crate::internal(|| {
            // A child of a process tree starts a runtime of its own and can borrow the pages
            // left in the host tier; any other child gets everything as plain memory.
            let lend = crate::active_config().is_some_and(|c| c.tree_dir.is_some());
            let plan = rt.prepare_fork(lend);
            FORK_PLAN.with(|p| *p.borrow_mut() = Some(plan));
        });
    }
}

extern "C" fn fork_parent() {
    if let Some(rt) = runtime() {
        crate::internal(|| {
            let plan = FORK_PLAN.with(|p| p.borrow_mut().take());
            rt.after_fork_parent_with(plan.as_ref());
        });
    }
}

/// In a forked child: the parent's runtime is unusable here (its threads did not survive the
/// fork and its userfaultfd acts on the parent). In a process tree the child starts a runtime
/// of its own, registers the ranges the parent had and borrows the pages the parent left in
/// the host tier for it, and takes its own share of the budget; otherwise its memory is plain
/// memory (the lent pages, if any, are copied in: nothing is lost).
extern "C" fn fork_child() {
    let Some(old) = runtime() else {
        return;
    };
    let _blocked = farmem_runtime::signals::Blocked::new();
    crate::internal(|| {
        old.after_fork_child();
        new_tracker();
        let plan = FORK_PLAN
            .with(|p| p.borrow_mut().take())
            .unwrap_or_default();
        if let Some(fd) = plan.node_fd {
            // The parent's node connection: its copy here would keep the parent looking alive
            // to the node after the parent died. Nothing here uses it (the parent's runtime is
            // never dropped or used in the child).
            // SAFETY: a plain close of a descriptor only the leaked parent runtime refers to.
            unsafe { libc::close(fd) };
        }
        let restarted = match crate::active_config() {
            Some(cfg) if cfg.tree_dir.is_some() => match restart_in_child(cfg, &plan) {
                Ok(()) => true,
                Err(e) => {
                    eprintln!(
                        "farmem: warning: process {} (forked) runs without farmem: {e}",
                        std::process::id()
                    );
                    false
                }
            },
            _ => false,
        };
        if !restarted {
            IN_FORK_CHILD.store(true, Ordering::SeqCst);
            // SAFETY: a plain store in the shim; the child's mappings are ordinary memory.
            unsafe { crate::shim::fmp_set_regions_active(0) };
            if let Some(lent) = &plan.lent {
                lent.copy_in();
            }
        }
    });
}

/// Starts the forked child's own runtime over the parent's ranges (see [`fork_child`]).
fn restart_in_child(cfg: &RunSettings, plan: &ForkPlan) -> Result<(), String> {
    let mut rc = runtime_config(cfg)?;
    rc.far_floor = plan.lent.as_ref().map_or(0, |l| l.floor());
    // Pages the parent left on donors: read as the parent's client there.
    rc.lent_donors = plan.lent.as_ref().and_then(|l| l.donors().cloned());
    // The tree's processes page at once: pinned, their runtimes crowded the CPUs they were
    // given (`mp` at 0.5 of its peak: 5.9 s against 4.3 s unpinned).
    rc.share_cpu = false;
    let rt = Runtime::start(rc).map_err(|e| error_chain("starting its farmem runtime", &e))?;
    if let Some(lent) = &plan.lent {
        // Before registering: pages shared with the parent that equal their far copy are
        // borrowed, not counted (and dropped, to evict them) by this runtime too.
        lent.discard_unchanged();
    }
    register_mapped(&rt, &plan.regions)?;
    let rt = set_runtime(rt);
    // At once: until borrowed, a lent page not present here reads as a new (zero) page, and
    // any thread started from here on (the tree's budget thread) may read one as it starts.
    if let Some(lent) = &plan.lent {
        if let Err(e) = rt.borrow(lent) {
            eprintln!(
                "farmem: warning: process {} (forked) copies the {} pages its parent left far \
                 (host tier or donors): {}",
                std::process::id(),
                lent.pages(),
                error_chain("borrowing them", &e)
            );
            lent.copy_in();
        }
    }
    if let Some(dir) = &cfg.tree_dir {
        // The runtime serves this process's regions now: it stays, at worst at the least share.
        join_tree(rt, dir);
    }
    // The first write from the writer thread, not here: this runs inside fork().
    start_stats_writer(cfg, false);
    Ok(())
}

/// Registers the parts of the parent's ranges the child has: a range the parent marked
/// `MADV_DONTFORK` (V8 marks its heap pages) is not mapped here at all.
fn register_mapped(rt: &Runtime, ranges: &[(usize, usize)]) -> Result<(), String> {
    let maps = std::fs::read_to_string("/proc/self/maps")
        .map_err(|e| format!("reading /proc/self/maps: {e}"))?;
    // Mapped ranges in address order, adjacent ones joined.
    let mut mapped: Vec<(usize, usize)> = Vec::new();
    for line in maps.lines() {
        let Some((s, e)) = line
            .split_whitespace()
            .next()
            .and_then(|r| r.split_once('-'))
            .and_then(|(s, e)| {
                Some((
                    usize::from_str_radix(s, 16).ok()?,
                    usize::from_str_radix(e, 16).ok()?,
                ))
            })
        else {
            continue;
        };
        match mapped.last_mut() {
            Some(last) if last.1 == s => last.1 = e,
            _ => mapped.push((s, e)),
        }
    }
    for &(addr, len) in ranges {
        let end = addr + len;
        for &(s, e) in &mapped {
            let (lo, hi) = (s.max(addr), e.min(end));
            if lo < hi {
                rt.register(lo as *mut u8, hi - lo).map_err(|e| {
                    error_chain(&format!("registering {lo:#x} (+{} bytes)", hi - lo), &e)
                })?;
            }
        }
    }
    Ok(())
}

extern "C" fn at_exit() {
    finish();
}

/// Called by the `_exit` wrapper ([`crate::exports`]): a process that ends with `_exit` (dash
/// does; so do many forked children) runs no `atexit` handler, and its statistics would stay
/// unfinished. `_exit` may be called from a signal handler, which may have interrupted this
/// very thread inside the allocator or a stats write: so the final write is asked of the stats
/// thread and waited for a bounded time (a flag and a futex, both safe in a signal handler),
/// and the process ends without it if the thread cannot finish.
pub(crate) fn before_exit() {
    let me = std::process::id();
    if STATS_THREAD_PID.load(Ordering::Acquire) != me || OWNER_PID.load(Ordering::Acquire) != me {
        return; // no stats thread here (a vfork child, a child without a runtime)
    }
    FINAL_ASKED.store(me, Ordering::Release);
    futex_wake(&FINAL_ASKED);
    let deadline = Instant::now() + FINAL_WRITE_LIMIT;
    loop {
        let written = FINAL_WRITTEN.load(Ordering::Acquire);
        if written == me {
            return;
        }
        let now = Instant::now();
        if now >= deadline {
            return;
        }
        futex_wait(&FINAL_WRITTEN, written, deadline - now);
    }
}

/// How long `_exit` waits for the stats thread's final write.
const FINAL_WRITE_LIMIT: Duration = Duration::from_secs(1);

/// How often the stats thread writes the stats file.
const STATS_EVERY: Duration = Duration::from_secs(1);

/// Sleeps until `word` may no longer hold `seen`, someone calls [`futex_wake`] on it, or `limit`
/// passes. A futex, not a condition variable: [`before_exit`] runs inside `_exit`, possibly in
/// a signal handler, where only plain system calls are safe; the futex lets the stats thread
/// sleep a whole second yet answer at once (it used to poll a flag every 20 ms).
fn futex_wait(word: &AtomicU32, seen: u32, limit: Duration) {
    let timeout = rustix::thread::futex::Timespec {
        tv_sec: limit.as_secs() as i64,
        tv_nsec: i64::from(limit.subsec_nanos()),
    };
    // Errors (EAGAIN: the word changed; EINTR; ETIMEDOUT) all mean "look again".
    let _ = rustix::thread::futex::wait(
        word,
        rustix::thread::futex::Flags::PRIVATE,
        seen,
        Some(&timeout),
    );
}

/// Wakes every thread in [`futex_wait`] on `word`.
fn futex_wake(word: &AtomicU32) {
    let _ = rustix::thread::futex::wake(word, rustix::thread::futex::Flags::PRIVATE, u32::MAX);
}

/// The process whose stats thread is running (a forked child that starts its own sets it).
static STATS_THREAD_PID: AtomicU32 = AtomicU32::new(0);
/// The process that asked its stats thread for the final write ([`before_exit`]).
static FINAL_ASKED: AtomicU32 = AtomicU32::new(0);
/// The process whose final write is done.
static FINAL_WRITTEN: AtomicU32 = AtomicU32::new(0);

/// The final statistics, once per process: written by the first of `atexit` and `_exit`.
/// Not in a forked child without a runtime of its own, nor in a vfork child (see
/// [`OWNER_PID`]).
fn finish() {
    static DONE: AtomicU32 = AtomicU32::new(0);
    let me = std::process::id();
    if IN_FORK_CHILD.load(Ordering::SeqCst)
        || OWNER_PID.load(Ordering::Acquire) != me
        || DONE.swap(me, Ordering::SeqCst) == me
    {
        return;
    }
    crate::internal(|| {
        // The runtime is never dropped in the program: finish the trace here so its record
        // count is written and farmem-sim accepts the file.
        if let Some(rt) = runtime() {
            if let Err(e) = rt.finish_trace() {
                eprintln!("farmem: the page-access trace could not be finished: {e}");
            }
        }
        if let Some(path) = crate::active_config().and_then(stats_path) {
            let _ = write_stats(&path, true);
        }
    });
}

/// Where this process writes its stats: its own file in the tree directory, or the file of
/// `--stats` (no tree).
fn stats_path(cfg: &RunSettings) -> Option<PathBuf> {
    match &cfg.tree_dir {
        Some(dir) => Some(
            dir.join(farmem_contract::TREE_STATS_DIR)
                .join(format!("{}.json", std::process::id())),
        ),
        None => cfg.stats_file.clone(),
    }
}

/// The stats file's content now (see [`StatsFile`]).
fn stats_file(is_final: bool) -> StatsFile {
    let runtime = runtime().map(|rt| rt.stats());
    StatsFile {
        pid: std::process::id(),
        is_final,
        summary: runtime.as_ref().map(StatsSummary::from),
        preload: crate::shim_counters().into(),
        runtime,
        tree: None,
        unmanaged: measure_unmanaged(),
    }
}

/// Measures the process's memory outside the managed ranges (regions, and the runtime's own
/// memory) from /proc/self/smaps, and keeps the peaks. Costs milliseconds in a big process:
/// called only when the stats file is written (the stats thread, start-up and exit).
/// Called only with the stats writers' lock held ([`WriterLock`]).
fn measure_unmanaged() -> Option<UnmanagedReport> {
    let (regions, own) = runtime()
        .map(|rt| (rt.regions(), rt.own_memory()))
        .unwrap_or_default();
    let mut t = tracker().lock().unwrap_or_else(|p| p.into_inner());
    match unmanaged::measure(&regions, &own) {
        Ok((m, peak_rss)) => Some(t.update(m, peak_rss)),
        Err(e) => {
            static WARNED: AtomicBool = AtomicBool::new(false);
            if !WARNED.swap(true, Ordering::Relaxed) {
                eprintln!(
                    "farmem: warning: the memory outside farmem's regions is not reported: {e}"
                );
            }
            t.last()
        }
    }
}

/// Writes the stats file atomically, without following a link another user planted there
/// ([`farmem_fds::files::replace`]: a temporary file with a random name, then a rename).
fn write_stats(path: &Path, final_: bool) -> Result<(), farmem_fds::files::FileError> {
    // The periodic writer and the exit hook write the same file: one at a time, so the
    // last rename is the newest content.
    let _one_writer = WriterLock::take();
    farmem_fds::files::replace(path, |w| {
        serde_json::to_writer(&mut *w, &stats_file(final_))?;
        w.write_all(b"\n")
    })
}

/// The stats writers' lock: the pid of the process whose thread holds it. Not a mutex: a
/// forked child inherits a lock its parent's writer thread held at the fork, and that thread
/// does not exist in the child, so a holder that is another process is taken over.
static WRITER: AtomicU32 = AtomicU32::new(0);

struct WriterLock;

impl WriterLock {
    fn take() -> WriterLock {
        let me = std::process::id();
        loop {
            match WRITER.compare_exchange(0, me, Ordering::Acquire, Ordering::Relaxed) {
                Ok(_) => return WriterLock,
                Err(holder) if holder != me => {
                    if WRITER
                        .compare_exchange(holder, me, Ordering::Acquire, Ordering::Relaxed)
                        .is_ok()
                    {
                        return WriterLock;
                    }
                }
                Err(_) => std::thread::sleep(Duration::from_millis(1)),
            }
        }
    }
}

impl Drop for WriterLock {
    fn drop(&mut self) {
        WRITER.store(0, Ordering::Release);
    }
}

/// The unmanaged-memory peaks of this process. Behind an atomic pointer so a forked child can
/// start a fresh one: the parent's stats thread may have held its lock at the fork.
static TRACKER: AtomicPtr<std::sync::Mutex<unmanaged::Tracker>> =
    AtomicPtr::new(std::ptr::null_mut());

fn tracker() -> &'static std::sync::Mutex<unmanaged::Tracker> {
    let p = TRACKER.load(Ordering::Acquire);
    if p.is_null() {
        new_tracker()
    } else {
        // SAFETY: non-null pointers come from `Box::leak` in `new_tracker`, never freed.
        unsafe { &*p }
    }
}

fn new_tracker() -> &'static std::sync::Mutex<unmanaged::Tracker> {
    let t: &'static _ = Box::leak(Box::new(std::sync::Mutex::new(unmanaged::Tracker::new())));
    TRACKER.store(
        (t as *const std::sync::Mutex<_>).cast_mut(),
        Ordering::Release,
    );
    t
}

/// Called once the heap is ready: fork handlers, the stats writer, the exit hook.
pub(crate) fn after_heap_ready(cfg: &RunSettings) {
    // SAFETY: registers three handlers that stay valid for the life of the process (static
    // functions of this library, which is never unloaded: it is preloaded).
    let r =
        unsafe { libc::pthread_atfork(Some(fork_prepare), Some(fork_parent), Some(fork_child)) };
    if r != 0 {
        crate::fatal("pthread_atfork failed: cannot keep a forked child's memory correct");
    }
    start_stats_writer(cfg, true);
    // SAFETY: registers a static function of this never-unloaded library.
    if unsafe { libc::atexit(at_exit) } != 0 {
        crate::fatal("atexit failed: the final statistics could not be written");
    }
}

/// Writes this process's stats file (now, with `first_now`, else from the thread at once)
/// and then every second, from a thread of its own.
fn start_stats_writer(cfg: &RunSettings, first_now: bool) {
    let Some(path) = stats_path(cfg) else {
        return;
    };
    if first_now {
        let _ = write_stats(&path, false);
    }
    let spawned = std::thread::Builder::new()
        .name("farmem-stats".into())
        .spawn(move || {
            crate::mark_runtime_thread();
            let me = std::process::id();
            STATS_THREAD_PID.store(me, Ordering::Release);
            if !first_now {
                let _ = write_stats(&path, false);
            }
            // Every second; at once when `_exit` asks for the final write.
            let mut next = Instant::now() + STATS_EVERY;
            loop {
                let asked = FINAL_ASKED.load(Ordering::Acquire);
                if asked != me {
                    futex_wait(
                        &FINAL_ASKED,
                        asked,
                        next.saturating_duration_since(Instant::now()),
                    );
                }
                if IN_FORK_CHILD.load(Ordering::SeqCst) {
                    return;
                }
                if FINAL_ASKED.load(Ordering::Acquire) == me {
                    finish();
                    FINAL_WRITTEN.store(me, Ordering::Release);
                    futex_wake(&FINAL_WRITTEN);
                    return;
                }
                if Instant::now() >= next {
                    next = Instant::now() + STATS_EVERY;
                    let _ = write_stats(&path, false);
                }
            }
        });
    if let Err(e) = spawned {
        crate::fatal(&format!("starting the stats writer thread: {e}"));
    }
}
