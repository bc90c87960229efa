//! The servers a runtime starts for itself when it is given none: the private node (the host
//! tier of the embedded default, [`PrivateNode`]) and, with the tier turned off, the embedded
//! TCP donor ([`EmbeddedDonor`]).
//!
//! # Design
//!
//! Each is a `farmem` child process, spawned from a keeper thread that lives as long as the
//! runtime: the child sets `PR_SET_PDEATHSIG(SIGKILL)` itself (`--exit-with-parent`), and the
//! kernel sends that signal when the *thread* that spawned it ends. Dropping the handle closes
//! the keeper's stop channel; the keeper then drops the child, which kills and reaps it. No
//! `pre_exec` hook: std would fork instead of posix_spawn, and a fork marks every region page
//! shared copy-on-write, which UFFDIO_MOVE refuses to evict.

use std::path::PathBuf;
use std::sync::{mpsc, Arc};

use farmem_host::{ChildDonorCommand, ChildDonorError};

use crate::config::RuntimeConfig;
use crate::error::RuntimeError;

/// The `farmem` binary that starts the children: `RuntimeConfig::farmem_bin`, else
/// `$FARMEM_BIN`, else `farmem` on PATH. In secure execution only an absolute
/// `RuntimeConfig::farmem_bin`: the environment and PATH are the user's, and what they name
/// would run with the program's rights ([`crate::secure`]).
fn farmem_binary(cfg: &RuntimeConfig) -> Result<PathBuf, String> {
    if crate::secure::secure_execution() {
        return match &cfg.farmem_bin {
            Some(bin) if bin.is_absolute() => Ok(bin.clone()),
            _ => Err(
                "this program runs set-user-ID, set-group-ID or with file capabilities, \
                      so farmem starts no binary named by FARMEM_BIN, PATH or a relative path: \
                      set RuntimeConfig::farmem_bin to the farmem binary's absolute path, or \
                      name donors"
                    .into(),
            ),
        };
    }
    Ok(cfg
        .farmem_bin
        .clone()
        .or_else(|| std::env::var_os("FARMEM_BIN").map(PathBuf::from))
        .unwrap_or_else(|| PathBuf::from("farmem")))
}

/// What to tell a user whose child could not even be spawned.
fn spawn_hint(e: impl std::fmt::Display) -> String {
    format!(
        "{e}: put the farmem binary on PATH, set FARMEM_BIN or RuntimeConfig::farmem_bin, or \
         name donors (or a node) explicitly"
    )
}

/// Spawns a child with `spawn` from a keeper thread and returns what it reported (its
/// address), with the sender whose drop stops it.
fn keep<C: Send + 'static>(
    hook: Option<Arc<dyn Fn() + Send + Sync>>,
    what: &'static str,
    spawn: impl FnOnce() -> Result<(C, String), String> + Send + 'static,
) -> Result<(String, mpsc::Sender<()>), String> {
    let (addr_tx, addr_rx) = mpsc::channel::<Result<String, String>>();
    let (stop_tx, stop_rx) = mpsc::channel::<()>();
    std::thread::Builder::new()
        .name(format!("farmem-{what}-keeper"))
        .spawn(move || {
            if let Some(h) = &hook {
                h();
            }
            match spawn() {
                Ok((child, addr)) => {
                    let _ = addr_tx.send(Ok(addr));
                    let _ = stop_rx.recv();
                    drop(child);
                }
                Err(e) => {
                    let _ = addr_tx.send(Err(e));
                }
            }
        })
        .map_err(|e| format!("could not start the {what} keeper thread: {e}"))?;
    match addr_rx.recv() {
        Ok(Ok(addr)) => Ok((addr, stop_tx)),
        Ok(Err(reason)) => Err(reason),
        Err(_) => Err(format!("the {what} keeper thread ended without reporting")),
    }
}

/// A `farmem donor` child process serving this runtime on a loopback port.
pub(crate) struct EmbeddedDonor {
    pub(crate) addr: String,
    /// Dropping this stops the keeper thread, which kills the child.
    _stop: mpsc::Sender<()>,
}

impl EmbeddedDonor {
    pub(crate) fn start(cfg: &RuntimeConfig) -> Result<EmbeddedDonor, RuntimeError> {
        let bin = farmem_binary(cfg).map_err(|reason| RuntimeError::EmbeddedDonor { reason })?;
        let command = ChildDonorCommand::new(bin)
            .arg("--capacity")
            .arg(cfg.embedded_capacity_bytes.to_string())
            .arg("--slab-size")
            .arg(cfg.embedded_slab_size_bytes.to_string());
        let (addr, stop) = keep(cfg.thread_hook.clone(), "donor", move || {
            match command.spawn() {
                Ok(c) => {
                    let addr = c.addr().to_string();
                    Ok((c, addr))
                }
                Err(e @ ChildDonorError::Spawn { .. }) => Err(spawn_hint(e)),
                Err(e) => Err(e.to_string()),
            }
        })
        .map_err(|reason| RuntimeError::EmbeddedDonor { reason })?;
        Ok(EmbeddedDonor { addr, _stop: stop })
    }
}

/// A `farmem node` child process holding a host tier for one program (the runtime's, or the
/// program `farmem run` starts), on a socket in a private directory (mode 0700) removed when
/// the node stops.
pub struct PrivateNode {
    socket: PathBuf,
    dir: PathBuf,
    /// Dropping this stops the keeper thread, which kills the child.
    stop: Option<mpsc::Sender<()>>,
}

impl PrivateNode {
    /// Starts `BIN node` lending up to `capacity_bytes` (capped at what this machine, or its
    /// memory cgroup, holds: a node refuses to promise more) in slabs of `slab_bytes`.
    /// `thread_hook` runs first in the keeper thread.
    pub fn start(
        bin: PathBuf,
        capacity_bytes: u64,
        slab_bytes: u64,
        thread_hook: Option<Arc<dyn Fn() + Send + Sync>>,
    ) -> Result<PrivateNode, RuntimeError> {
        let dir = private_dir().map_err(|e| RuntimeError::PrivateNode {
            reason: format!("could not make a private directory for its socket: {e}"),
        })?;
        let socket = dir.join("node.sock");
        let capacity = farmem_host::probe::memory_limit_bytes()
            .map_or(capacity_bytes, |(limit, _)| capacity_bytes.min(limit));
        let command = farmem_node::child::child_node_command(bin, &socket)
            .arg("--capacity")
            .arg(capacity.to_string())
            .arg("--slab-size")
            .arg(slab_bytes.to_string())
            // A node started from inside a program under `farmem run` (the host's node had no
            // room) must not load the program's library and join its process tree.
            .env("LD_PRELOAD", "")
            // the node's per-client logs are not the program's output
            .env(
                "FARMEM_LOG",
                crate::secure::env_var_os("FARMEM_LOG").unwrap_or_else(|| "warn".into()),
            );
        let started = keep(thread_hook, "node", move || match command.spawn() {
            Ok(c) => Ok((c, String::new())),
            Err(e @ ChildDonorError::Spawn { .. }) => Err(spawn_hint(e)),
            Err(e) => Err(e.to_string()),
        });
        match started {
            Ok((_, stop)) => Ok(PrivateNode {
                socket,
                dir,
                stop: Some(stop),
            }),
            Err(reason) => {
                let _ = farmem_fds::dirs::remove_private_dir(&dir);
                Err(RuntimeError::PrivateNode { reason })
            }
        }
    }

    /// Starts the private node of a runtime configured with `cfg`.
    pub(crate) fn for_runtime(cfg: &RuntimeConfig) -> Result<PrivateNode, RuntimeError> {
        PrivateNode::start(
            farmem_binary(cfg).map_err(|reason| RuntimeError::PrivateNode { reason })?,
            cfg.embedded_capacity_bytes,
            cfg.embedded_slab_size_bytes,
            cfg.thread_hook.clone(),
        )
    }

    /// Starts the private node a runtime falls back to when the host's node has no room for
    /// it: slabs of the host node's `slab_bytes`, so far slabs keep their size.
    pub(crate) fn fallback_for(
        cfg: &RuntimeConfig,
        slab_bytes: u64,
    ) -> Result<PrivateNode, RuntimeError> {
        PrivateNode::start(
            farmem_binary(cfg).map_err(|reason| RuntimeError::PrivateNode { reason })?,
            cfg.embedded_capacity_bytes,
            slab_bytes,
            cfg.thread_hook.clone(),
        )
    }

    /// The node's socket.
    pub fn socket(&self) -> &std::path::Path {
        &self.socket
    }
}

impl Drop for PrivateNode {
    fn drop(&mut self) {
        drop(self.stop.take());
        // The node is killed (SIGKILL), so its socket file stays behind: remove it. (Its
        // keeper may still be reaping it; the socket file is not needed for that.)
        let _ = farmem_fds::dirs::remove_private_dir(&self.dir);
    }
}

/// A new directory only this user can enter, under the temporary directory (an unguessable
/// name; a temporary directory other users could rename entries of is refused).
fn private_dir() -> std::io::Result<PathBuf> {
    // The temporary directory as the secure-execution rules allow (crate::secure).
    farmem_fds::dirs::private_dir(&crate::secure::temp_dir(), "farmem-node-")
        .map_err(std::io::Error::other)
}
