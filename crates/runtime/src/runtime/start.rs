//! Starting a [`Runtime`]: the configuration checked, the shared core, one thread per loop
//! (fault, evict, send; tier, heal, backup and prefetch when they have work), and the wait
//! until every thread has started.

use std::sync::Arc;
use std::thread::JoinHandle;

use crossbeam_channel::{Receiver, Sender};

use crate::config::RuntimeConfig;
use crate::error::RuntimeError;
use crate::shared::Shared;
use crate::sync::Mutex;
use crate::threads::{heal::heal_loop, prefetch::prefetch_loop, send::send_loop, tier::tier_loop};
use crate::{cpu, evict, fault, signals};

use super::Runtime;

impl Runtime {
    /// Starts the runtime: opens the userfaultfds, connects to the donors (or starts the
    /// embedded one) and starts the fault loop, evictor and sender threads.
    pub fn start(cfg: RuntimeConfig) -> Result<Arc<Runtime>, RuntimeError> {
        cfg.validate()?;
        // Threads started from here on (the runtime's, the transport's, the node client's)
        // inherit a mask that blocks every signal (see `signals`).
        let _blocked = signals::Blocked::new();
        let sh = Shared::start(&cfg)?;
        let budget_pages = sh.budget.limit();
        let (started_tx, started) = crossbeam_channel::unbounded::<()>();
        let threads = spawn_threads(&cfg, &sh, &started_tx)?;
        drop(started_tx);
        wait_started(&started, threads.len());
        tracing::debug!(
            "farmem runtime started: budget {} pages, pool {} pages, {} donor(s), slab {} pages",
            budget_pages,
            sh.pool.slots(),
            sh.far.donors.len(),
            sh.far.slab_pages
        );
        Ok(Arc::new(Runtime {
            sh,
            threads: Mutex::new(threads),
        }))
    }
}

/// The runtime's threads: the fault loop, the evictor and the sender always; the tier thread
/// with a host tier, the healer with donors, the backup writer with a backup file, the
/// prefetch thread with a prefetcher.
fn spawn_threads(
    cfg: &RuntimeConfig,
    sh: &Arc<Shared>,
    started_tx: &Sender<()>,
) -> Result<Vec<JoinHandle<()>>, RuntimeError> {
    // The fault thread and the evictor share a CPU (see `cpu`).
    let shared_cpu = if cfg.share_cpu { cpu::pick() } else { None };
    let spawn = |name: &str, f: fn(Arc<Shared>), pin: Option<usize>| {
        spawn_one(name, f, sh.clone(), pin, started_tx.clone())
    };
    let mut threads = vec![
        spawn("farmem-fault", fault::fault_loop, shared_cpu)?,
        spawn("farmem-evict", evict::evict_loop, shared_cpu)?,
        spawn("farmem-send", send_loop, None)?,
    ];
    if sh.far.tier.is_some() {
        threads.push(spawn("farmem-tier", tier_loop, None)?);
    }
    if !sh.far.donors.is_empty() {
        threads.push(spawn("farmem-heal", heal_loop, None)?);
    }
    if sh.far.backup.is_some() {
        threads.push(spawn("farmem-backup", backup_loop, None)?);
    }
    if sh.pf.enabled() {
        threads.push(spawn("farmem-prefetch", prefetch_loop, None)?);
    }
    Ok(threads)
}

/// The backup thread: writes the backup file until shutdown.
fn backup_loop(sh: Arc<Shared>) {
    if let Some(b) = &sh.far.backup {
        b.run(&sh.shutdown);
    }
}

/// Spawns one runtime thread running `f`, pinned to `pin`, that says on `started_tx` when it
/// has started.
fn spawn_one(
    name: &str,
    f: fn(Arc<Shared>),
    sh: Arc<Shared>,
    pin: Option<usize>,
    started_tx: Sender<()>,
) -> Result<JoinHandle<()>, RuntimeError> {
    std::thread::Builder::new()
        .name(name.into())
        .spawn(move || {
            if let Some(c) = pin {
                cpu::pin(c);
            }
            sh.thread_started();
            let _ = started_tx.send(());
            // Dropped now, not when the loop ends: a thread that dies before sending
            // ends the wait below once every other thread has sent.
            drop(started_tx);
            f(sh)
        })
        .map_err(|source| RuntimeError::Spawn {
            what: "a runtime thread",
            source,
        })
}

/// Waits until each of `threads` threads has started (or died before it could say so).
///
/// Every thread past its start before any region can exist: a thread library reads program
/// data while it starts a thread (glibc: the locale), and a forked child registers its
/// inherited regions, evicted pages and all, right after `start` returns. A runtime thread
/// still starting then could fault before the fault thread serves.
fn wait_started(started: &Receiver<()>, threads: usize) {
    for _ in 0..threads {
        if started.recv().is_err() {
            break; // a thread died before it started (its panic is reported)
        }
    }
}
