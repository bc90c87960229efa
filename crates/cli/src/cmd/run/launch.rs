//! Starting the program under farmem and waiting for it: its environment (`LD_PRELOAD`, the run
//! settings), the signals passed on to it, the tree's `--stats` file while it runs, and the wait
//! for the processes it leaves behind.

use std::ffi::{OsStr, OsString};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::Context;
use farmem_contract::run_settings::{RunSettings, RUN_SETTINGS_VAR, RUN_SETTINGS_VERSION};
use farmem_contract::StatsFile;
use farmem_tree::Coordinator;

use super::servers::Far;
use super::{Checked, RunArgs};
use crate::cmd::run_tree::{self, TreeDir};
use crate::cmd::treemem::TreeRss;

/// The settings every process of the program's tree reads (one environment variable).
pub(super) fn settings(
    args: &RunArgs,
    far: &Far,
    backup_file: Option<PathBuf>,
    tree: &TreeDir,
) -> anyhow::Result<RunSettings> {
    Ok(RunSettings {
        version: RUN_SETTINGS_VERSION,
        local_mem_bytes: args.local_mem,
        donors: far.donors.clone(),
        // Absolute: a process of the tree that changed directory (a pyenv shim does) reads it
        // when its runtime starts.
        token_file: args
            .token_file
            .as_deref()
            .map(std::path::absolute)
            .transpose()
            .context("resolving --token-file")?,
        evict: args.evict.clone(),
        prefetch: args.prefetch.clone(),
        prefetch_install: args.prefetch_install.clone(),
        seal: args.seal,
        tier: far.tier.clone(),
        replicas: args.replicas.map(usize::from),
        backup_file,
        heal_rate_bytes: args.heal_rate,
        over_budget: match args.over_budget.as_str() {
            "allow" => farmem_contract::OverBudget::Allow,
            _ => farmem_contract::OverBudget::Fail {
                wait: Duration::from_secs(args.over_budget_wait),
            },
        },
        stats_file: None,
        tree_dir: Some(tree.path().to_path_buf()),
        record_trace: args.record_trace.clone(),
        mmap_threshold_bytes: args.mmap_threshold,
        heap_reserve_bytes: args.heap_reserve,
        allocator_only: args.allocator_only,
        farmem_bin: std::env::current_exe().ok(),
        orig_ld_preload: std::env::var("LD_PRELOAD").ok(),
    })
}

/// The program's command: the preload library first in `LD_PRELOAD`, and `settings`.
pub(super) fn command(
    checked: &Checked,
    cmd: &OsStr,
    cmd_args: &[OsString],
    settings: &RunSettings,
) -> anyhow::Result<Command> {
    let lib = &checked.lib;
    let preload = match settings.orig_ld_preload.as_deref() {
        None | Some("") => lib.display().to_string(),
        Some(orig) => format!("{}:{orig}", lib.display()),
    };
    let mut command = Command::new(&checked.program);
    command
        .arg0(cmd)
        .args(cmd_args)
        .env("LD_PRELOAD", preload)
        .env(RUN_SETTINGS_VAR, settings.encode()?);
    Ok(command)
}

/// Starts the program, waits for it and the rest of its tree, and returns its status and the
/// tree's account.
pub(super) fn run_program(
    mut command: Command,
    program: &Path,
    args: &RunArgs,
    tree: &TreeDir,
    coordinator: &Coordinator,
) -> anyhow::Result<(ExitStatus, Option<StatsFile>)> {
    // Like a shell, let ^C and ^\ reach the program (same process group) and not end us
    // before we can report; SIGTERM/SIGHUP sent to us are passed on to the program.
    let interrupted = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGQUIT] {
        signal_hook::flag::register(sig, interrupted.clone())
            .context("installing the SIGINT/SIGQUIT handlers")?;
    }
    // The program's orphans (a background job whose shell exited, a daemon's double fork)
    // become our children rather than init's, so the wait for the tree sees them.
    if let Err(e) = nix::sys::prctl::set_child_subreaper(true) {
        tracing::debug!("PR_SET_CHILD_SUBREAPER: {e}");
    }
    let mut child = command
        .spawn()
        .with_context(|| format!("starting {}", program.display()))?;
    let pid = child.id();
    let forwarder = Forwarder::start(pid, interrupted.clone())?;
    // The tree's memory from outside, and the processes farmem does not reach.
    let sampler = TreeRss::start(pid).context("starting the tree's memory sampler")?;
    let status = wait(&mut child, args, tree, coordinator, &interrupted)
        .context("waiting for the program")?;
    forwarder.stop();
    let sampled = sampler.stop();
    let account = run_tree::account(
        &tree.processes(pid),
        Some(&coordinator.snapshot()),
        Some(&sampled),
        args.local_mem,
    );
    Ok((status, account))
}

/// Passes SIGTERM and SIGHUP sent to us on to the program (and stops the wait for its tree).
struct Forwarder {
    handle: signal_hook::iterator::Handle,
    thread: JoinHandle<()>,
}

impl Forwarder {
    fn start(pid: u32, interrupted: Arc<AtomicBool>) -> anyhow::Result<Forwarder> {
        let mut forward = signal_hook::iterator::Signals::new([
            signal_hook::consts::SIGTERM,
            signal_hook::consts::SIGHUP,
        ])
        .context("installing the SIGTERM/SIGHUP handlers")?;
        let handle = forward.handle();
        let thread = std::thread::spawn(move || {
            for sig in forward.forever() {
                interrupted.store(true, Ordering::Relaxed);
                if let Ok(s) = nix::sys::signal::Signal::try_from(sig) {
                    let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), s);
                }
            }
        });
        Ok(Forwarder { handle, thread })
    }

    fn stop(self) {
        self.handle.close();
        let _ = self.thread.join();
    }
}

/// Waits for the program, then for the rest of its tree, writing the tree's account in the
/// `--stats` file every second meanwhile.
fn wait(
    child: &mut Child,
    args: &RunArgs,
    tree: &TreeDir,
    coordinator: &Coordinator,
    interrupted: &AtomicBool,
) -> std::io::Result<ExitStatus> {
    let pid = child.id();
    let writing = AtomicBool::new(true);
    std::thread::scope(|s| {
        let w = args.stats.as_ref().map(|path| {
            let writing = &writing;
            s.spawn(move || {
                while writing.load(Ordering::Relaxed) {
                    std::thread::sleep(Duration::from_millis(250));
                    let processes = tree.processes(pid);
                    if let Some(acc) = run_tree::account(
                        &processes,
                        Some(&coordinator.snapshot()),
                        None,
                        args.local_mem,
                    ) {
                        let _ = run_tree::write(path, &acc);
                    }
                }
            })
        });
        let status = child.wait();
        // Only a signal from now on stops the wait for the rest of the tree.
        interrupted.store(false, Ordering::Relaxed);
        wait_for_the_tree(coordinator, interrupted, args.quiet);
        writing.store(false, Ordering::Relaxed);
        if let Some(w) = w {
            let _ = w.join();
        }
        status
    })
}

/// After the program exits: the processes of its tree that outlive it (a daemon, a background
/// job) are paged through this process (the budget's coordinator, the private node or the
/// embedded donor): waits until they are gone too, like a service manager's scope. They used to
/// lose all three at once (a background job failed to start its runtime; `redis-server
/// --daemonize yes` ran unbounded). A SIGINT, SIGTERM or SIGHUP ends the wait: they go on
/// with the memory they have, without a coordinator or new host-tier memory.
fn wait_for_the_tree(coordinator: &Coordinator, stop: &AtomicBool, quiet: bool) {
    let started = Instant::now();
    let mut said = false;
    loop {
        // Processes still connected to the coordinator (a process that just exited may not have
        // been seen leaving yet: it has no /proc entry), and our children but the servers we
        // started (orphans of the tree are ours: we are their subreaper; a forked child may
        // not have joined the coordinator yet).
        let mut live: Vec<u32> = coordinator
            .snapshot()
            .processes
            .iter()
            .filter(|p| p.running && Path::new(&format!("/proc/{}", p.pid)).exists())
            .map(|p| p.pid)
            .collect();
        for c in adopted_children() {
            if !live.contains(&c) {
                live.push(c);
            }
        }
        if live.is_empty() {
            return;
        }
        if stop.load(Ordering::Relaxed) {
            if !quiet {
                eprintln!(
                    "farmem: stopped waiting for {} process(es) of the program's tree (pids {}): \
                     they go on with the memory they have, without a budget coordinator or new \
                     host-tier memory",
                    live.len(),
                    pids_list(&live)
                );
            }
            return;
        }
        // Not for a process that is only slow to be seen leaving.
        if !said && !quiet && started.elapsed() >= Duration::from_millis(500) {
            eprintln!(
                "farmem: the program exited; {} process(es) it started still run under farmem \
                 (pids {}): waiting for them to end (Ctrl-C stops waiting)",
                live.len(),
                pids_list(&live)
            );
            said = true;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// This process's living children other than the servers it started (which run with
/// `--exit-with-parent`); exited ones are reaped.
fn adopted_children() -> Vec<u32> {
    let me = std::process::id();
    let mut out = Vec::new();
    let tasks = std::fs::read_dir(format!("/proc/{me}/task"))
        .into_iter()
        .flatten();
    for t in tasks.flatten() {
        let children = std::fs::read_to_string(t.path().join("children")).unwrap_or_default();
        for pid in children
            .split_whitespace()
            .filter_map(|c| c.parse::<u32>().ok())
        {
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            if cmdline
                .split(|b| *b == 0)
                .any(|a| a == b"--exit-with-parent")
            {
                continue;
            }
            let reaped = matches!(
                nix::sys::wait::waitpid(
                    nix::unistd::Pid::from_raw(pid as i32),
                    Some(nix::sys::wait::WaitPidFlag::WNOHANG)
                ),
                Ok(s) if s != nix::sys::wait::WaitStatus::StillAlive
            );
            if !reaped {
                out.push(pid);
            }
        }
    }
    out
}

fn pids_list(pids: &[u32]) -> String {
    let mut s: Vec<String> = pids.iter().take(8).map(u32::to_string).collect();
    if pids.len() > 8 {
        s.push("…".into());
    }
    s.join(", ")
}
