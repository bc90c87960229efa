//! The link between the library and the farmem runtime: start-up, region registration, fork
//! handlers and the stats file.
//!
//! Every function here runs as farmem code (see [`crate::internal`]): what it allocates comes
//! from glibc, never from region memory.

use std::ffi::c_int;
use std::io::Write;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use farmem_runtime::{Runtime, RuntimeConfig, StatsFile, StatsSummary};

use crate::config::RunSettings;

static RUNTIME: OnceLock<Arc<Runtime>> = OnceLock::new();
/// Set in a forked child: it never writes the parent's stats file.
static IN_FORK_CHILD: AtomicBool = AtomicBool::new(false);
static REGISTER_WARNINGS: AtomicU64 = AtomicU64::new(0);

/// Starts the runtime described by `cfg` (nothing in allocator-only mode). Runs in the
/// constructor, as farmem code.
pub(crate) fn start(cfg: &RunSettings) -> Result<(), String> {
    if cfg.allocator_only {
        return Ok(());
    }
    let token = match &cfg.token_file {
        Some(f) => Some(
            std::fs::read(f).map_err(|e| format!("reading the token file {}: {e}", f.display()))?,
        ),
        None => None,
    };
    // --local-mem covers the region pages and the write-back pool together.
    let (budget_bytes, pool_bytes) = farmem_runtime::split_local_memory(cfg.budget_bytes)
        .ok_or_else(|| {
            format!(
                "--local-mem of {} bytes is below the minimum of {} bytes",
                cfg.budget_bytes,
                farmem_runtime::MIN_LOCAL_BYTES
            )
        })?;
    let mut rc = RuntimeConfig {
        budget_bytes,
        pool_bytes: Some(pool_bytes),
        donors: cfg.donors.clone(),
        token,
        thread_hook: Some(Arc::new(crate::mark_runtime_thread)),
        farmem_bin: cfg.farmem_bin.clone(),
        record_trace: cfg.record_trace.clone(),
        seal: cfg.seal,
        tier: cfg.tier.clone(),
        replicas: cfg.replicas,
        backup_file: cfg.backup_file.clone(),
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
    let rt = Runtime::start(rc).map_err(|e| error_chain("starting the farmem runtime", &e))?;
    let _ = RUNTIME.set(rt);
    Ok(())
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
    let Some(rt) = RUNTIME.get() else {
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

/// The program marked `[addr, addr + len)` `MADV_DONTFORK` (`dont_fork`) or `MADV_DOFORK`.
pub(crate) fn set_dont_fork(addr: *mut u8, len: usize, dont_fork: bool) {
    if let Some(rt) = RUNTIME.get() {
        if !IN_FORK_CHILD.load(Ordering::Relaxed) {
            rt.set_dont_fork(addr, len, dont_fork);
        }
    }
}

/// Whether `[addr, addr + len)` overlaps a region (false without a runtime, or in a forked
/// child).
pub(crate) fn overlaps_region(addr: *mut u8, len: usize) -> bool {
    let Some(rt) = RUNTIME.get() else {
        return false;
    };
    !IN_FORK_CHILD.load(Ordering::Relaxed) && rt.overlaps_region(addr, len)
}

extern "C" fn fork_prepare() {
    if let Some(rt) = RUNTIME.get() {
        crate::internal(|| rt.before_fork());
    }
}

extern "C" fn fork_parent() {
    if let Some(rt) = RUNTIME.get() {
        crate::internal(|| rt.after_fork_parent());
    }
}

extern "C" fn fork_child() {
    IN_FORK_CHILD.store(true, Ordering::SeqCst);
    // SAFETY: a plain store in the shim; the child's mappings are ordinary memory.
    unsafe { crate::shim::fmp_set_regions_active(0) };
    if let Some(rt) = RUNTIME.get() {
        crate::internal(|| rt.after_fork_child());
    }
}

extern "C" fn at_exit() {
    if IN_FORK_CHILD.load(Ordering::SeqCst) {
        return;
    }
    crate::internal(|| {
        // The runtime is never dropped in the program: finish the trace here so its record
        // count is written and farmem-sim accepts the file.
        if let Some(rt) = RUNTIME.get() {
            if let Err(e) = rt.finish_trace() {
                eprintln!("farmem: the page-access trace could not be finished: {e}");
            }
        }
        if let Some(cfg) = crate::active_config() {
            if let Some(path) = &cfg.stats_file {
                let _ = write_stats(path, true);
            }
        }
    });
}

/// The stats file's content now (see [`StatsFile`]).
fn stats_file(is_final: bool) -> StatsFile {
    let runtime = RUNTIME.get().map(|rt| rt.stats());
    StatsFile {
        pid: std::process::id(),
        is_final,
        summary: runtime.as_ref().map(StatsSummary::from),
        preload: crate::shim_counters().into(),
        runtime,
    }
}

/// Writes the stats file atomically (temporary file + rename).
fn write_stats(path: &Path, final_: bool) -> std::io::Result<()> {
    // The periodic writer and the exit hook share one temporary path: one writer at a time,
    // or their bytes interleave into a corrupt file.
    static WRITING: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one_writer = WRITING.lock().unwrap_or_else(|p| p.into_inner());
    let tmp = path.with_extension(format!("tmp.{}", std::process::id()));
    {
        let mut f = std::fs::File::create(&tmp)?;
        serde_json::to_writer(&mut f, &stats_file(final_))?;
        f.write_all(b"\n")?;
    }
    std::fs::rename(&tmp, path)
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
    if let Some(path) = cfg.stats_file.clone() {
        let _ = write_stats(&path, false);
        let spawned = std::thread::Builder::new()
            .name("farmem-stats".into())
            .spawn(move || {
                crate::mark_runtime_thread();
                loop {
                    std::thread::sleep(Duration::from_secs(1));
                    if IN_FORK_CHILD.load(Ordering::SeqCst) {
                        return;
                    }
                    let _ = write_stats(&path, false);
                }
            });
        if let Err(e) = spawned {
            crate::fatal(&format!("starting the stats writer thread: {e}"));
        }
        // SAFETY: registers a static function of this never-unloaded library.
        if unsafe { libc::atexit(at_exit) } != 0 {
            crate::fatal("atexit failed: the final statistics could not be written");
        }
    }
}
