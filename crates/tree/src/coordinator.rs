//! The coordinator: `farmem run` hosts it on a Unix socket; every process of the tree connects,
//! reports, and is told its grant.
//!
//! # Design
//! - **Socket**: bound with mode 0600 before it listens. A path something answers on is
//!   refused; a stale socket file (nothing answers) is replaced; any other file is refused.
//! - **One thread per connection** reads lines through a bounded [`LineBuffer`]. The
//!   [`Budget`] sits behind one mutex; after a Hello the process joins and its first Grant is
//!   written under that lock (so no later grant can overtake it); after every Report and every
//!   departure the budget is rebalanced and each changed grant is written to its process.
//! - **Writers**: every joined connection's stream (a clone) is kept by id so a rebalance run on
//!   any thread reaches every process. Writes have a [`WRITE_TIMEOUT`] and never raise SIGPIPE;
//!   a write that fails drops that process (its grant returns to the free pages at once).
//! - **Who joins**: the kernel names each connection's process (SO_PEERCRED) when it is
//!   accepted; [`Admission`] says whether that process belongs to the tree (for `farmem run`:
//!   the run and its descendants) and which pid it is known by. A process outside the tree is
//!   closed at once with one warn line, so no other process of the user can take the budget.
//! - **Hostile clients**: garbage, a line over [`MAX_LINE_BYTES`](crate::wire::MAX_LINE_BYTES),
//!   a Report before the Hello, a second Hello, a wrong protocol version, or half a line then
//!   a close drop that connection with one warn line; the others are not affected.
//! - **Stop**: dropping the [`Coordinator`] stops accepting, closes every connection, waits for
//!   their threads and removes the socket file.
//!
//! # Limitations
//! A connection that never says Hello holds a thread until it closes (the socket is the
//! user's own, mode 0600). One process that stops reading its grants can stall the others'
//! grants for up to [`WRITE_TIMEOUT`] before it is dropped.
use std::collections::HashMap;
use std::io::{self, ErrorKind, Read};
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

use rustix::event::{poll, PollFd, PollFlags, Timespec};
use serde::{Deserialize, Serialize};

use crate::membership::Admission;
use crate::policy::{Budget, ProcessShare};
use crate::wire::{LineBuffer, ToCoordinator, ToProcess, WireError, TREE_PROTOCOL_VERSION};

/// The longest one write of a grant may block before its process is dropped.
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(2);

/// The tree's budget as the run's summary shows it.
#[derive(Serialize, Deserialize, Debug, Clone, Default, PartialEq, Eq)]
pub struct TreeSnapshot {
    /// The processes present, then the departed ones (with their peaks).
    pub processes: Vec<ProcessShare>,
    /// The most pages the tree had in use at once.
    pub peak_total_used_pages: u64,
    /// Pages granted at joins beyond the free ones (see [`Budget::overcommitted_pages`]).
    pub overcommitted_pages: u64,
    /// Processes that ever joined.
    pub processes_seen: u64,
    /// The tree's budget in pages.
    pub total_pages: u64,
}

/// Why a connection was dropped.
#[derive(Debug, thiserror::Error)]
enum Dropped {
    #[error("reading from it failed: {0}")]
    Read(#[source] io::Error),
    #[error("writing its grant failed: {0}")]
    Write(#[source] io::Error),
    #[error("{0}")]
    Wire(#[from] WireError),
    #[error("it sent a report before its hello")]
    ReportBeforeHello,
    #[error("it sent a second hello")]
    SecondHello,
    #[error("it speaks protocol version {got}, this coordinator speaks {TREE_PROTOCOL_VERSION}")]
    WrongVersion { got: u32 },
    #[error("it closed the connection in the middle of a line ({bytes} bytes)")]
    Truncated { bytes: usize },
    #[error(
        "its hello asks for at least {min_pages} pages, more than the tree's whole budget of \
         {total_pages}"
    )]
    MinAboveBudget { min_pages: u64, total_pages: u64 },
}

struct Shared {
    admission: Admission,
    budget: Mutex<Budget>,
    /// Joined connections' streams, by connection id: where grants are written.
    writers: Mutex<HashMap<u64, UnixStream>>,
    /// Every open connection, by connection id: closed when the coordinator stops.
    connections: Mutex<HashMap<u64, UnixStream>>,
    threads: Mutex<Vec<JoinHandle<()>>>,
    stop: AtomicBool,
    next_id: AtomicU64,
}

/// The process tree's coordinator, serving on its own threads until dropped.
pub struct Coordinator {
    shared: Arc<Shared>,
    socket_path: PathBuf,
    acceptor: Option<JoinHandle<()>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic on one connection's thread must not stop the others: the data stays usable.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn named(path: &Path, what: &str, e: io::Error) -> io::Error {
    io::Error::new(
        e.kind(),
        format!(
            "process-tree coordinator socket {}: {what}: {e}",
            path.display()
        ),
    )
}

/// Refuses a path something answers on or that is not a socket; removes a stale socket.
fn prepare_path(path: &Path) -> io::Result<()> {
    let meta = match std::fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(named(path, "cannot inspect it", e)),
    };
    if !meta.file_type().is_socket() {
        return Err(io::Error::new(
            ErrorKind::AlreadyExists,
            format!(
                "{} exists and is not a socket; remove it or pick another path",
                path.display()
            ),
        ));
    }
    match UnixStream::connect(path) {
        Ok(_) => Err(io::Error::new(
            ErrorKind::AddrInUse,
            format!(
                "something already listens on {}; stop it or pick another path",
                path.display()
            ),
        )),
        Err(e) if e.kind() == ErrorKind::ConnectionRefused => {
            tracing::info!("removing the stale socket {}", path.display());
            std::fs::remove_file(path).map_err(|e| named(path, "cannot remove the stale socket", e))
        }
        Err(e) => Err(named(path, "cannot check whether it is in use", e)),
    }
}

/// Binds the socket with mode 0600 before it listens.
fn bind_socket(path: &Path) -> io::Result<UnixListener> {
    use rustix::net::{
        bind, listen, socket_with, AddressFamily, SocketAddrUnix, SocketFlags, SocketType,
    };
    let addr = SocketAddrUnix::new(path).map_err(|e| {
        named(
            path,
            "cannot bind",
            io::Error::new(
                ErrorKind::InvalidInput,
                format!("{e} (a socket path is at most 107 bytes)"),
            ),
        )
    })?;
    let fd = socket_with(
        AddressFamily::UNIX,
        SocketType::STREAM,
        SocketFlags::CLOEXEC,
        None,
    )
    .map_err(|e| named(path, "cannot make a socket", e.into()))?;
    bind(&fd, &addr).map_err(|e| named(path, "cannot bind", e.into()))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
        .map_err(|e| named(path, "cannot set its mode to 0600", e))?;
    listen(&fd, 128).map_err(|e| named(path, "cannot listen", e.into()))?;
    Ok(UnixListener::from(fd))
}

/// Writes all of `bytes` without raising SIGPIPE.
pub(crate) fn send_all(stream: &UnixStream, mut bytes: &[u8]) -> io::Result<()> {
    while !bytes.is_empty() {
        match rustix::net::send(stream, bytes, rustix::net::SendFlags::NOSIGNAL) {
            Ok(0) => return Err(ErrorKind::WriteZero.into()),
            Ok(n) => bytes = &bytes[n..],
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// Whether writing failed because the process closed its end (it exited, or is exiting).
fn closed_by_peer(e: &io::Error) -> bool {
    matches!(e.kind(), ErrorKind::BrokenPipe | ErrorKind::ConnectionReset)
}

impl Coordinator {
    /// Listens on `socket_path` for the processes of a tree sharing `total_pages` local pages;
    /// `admission` says which connecting processes may join.
    pub fn start(
        socket_path: &Path,
        total_pages: u64,
        admission: Admission,
    ) -> io::Result<Coordinator> {
        prepare_path(socket_path)?;
        let listener = bind_socket(socket_path)?;
        let shared = Arc::new(Shared {
            admission,
            budget: Mutex::new(Budget::new(total_pages)),
            writers: Mutex::new(HashMap::new()),
            connections: Mutex::new(HashMap::new()),
            threads: Mutex::new(Vec::new()),
            stop: AtomicBool::new(false),
            next_id: AtomicU64::new(1),
        });
        let sh = Arc::clone(&shared);
        let acceptor = std::thread::Builder::new()
            .name("farmem-tree".into())
            .spawn(move || sh.accept_loop(listener))
            .map_err(|e| named(socket_path, "cannot start its thread", e))?;
        tracing::debug!(
            "process-tree coordinator listening on {} for {total_pages} pages",
            socket_path.display()
        );
        Ok(Coordinator {
            shared,
            socket_path: socket_path.to_path_buf(),
            acceptor: Some(acceptor),
        })
    }

    /// The socket the coordinator listens on.
    pub fn socket_path(&self) -> &Path {
        &self.socket_path
    }

    /// Every process's share now (and the departed ones'), for the run's summary.
    pub fn snapshot(&self) -> TreeSnapshot {
        self.view().snapshot()
    }

    /// A handle another thread can read the shares through (the run's metrics endpoint).
    pub fn view(&self) -> CoordinatorView {
        CoordinatorView {
            shared: Arc::clone(&self.shared),
        }
    }
}

/// Read-only access to a coordinator's shares from another thread. Once the coordinator has
/// stopped it shows the shares as they were then.
#[derive(Clone)]
pub struct CoordinatorView {
    shared: Arc<Shared>,
}

impl CoordinatorView {
    /// What [`Coordinator::snapshot`] gives.
    pub fn snapshot(&self) -> TreeSnapshot {
        let b = lock(&self.shared.budget);
        TreeSnapshot {
            processes: b.snapshot(),
            peak_total_used_pages: b.peak_total_used_pages(),
            overcommitted_pages: b.overcommitted_pages(),
            processes_seen: b.processes_seen(),
            total_pages: b.total_pages(),
        }
    }
}

impl Drop for Coordinator {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        if let Some(a) = self.acceptor.take() {
            let _ = a.join();
        }
        for c in lock(&self.shared.connections).values() {
            let _ = c.shutdown(std::net::Shutdown::Both);
        }
        let threads = std::mem::take(&mut *lock(&self.shared.threads));
        for t in threads {
            let _ = t.join();
        }
        let _ = std::fs::remove_file(&self.socket_path);
        tracing::debug!("process-tree coordinator stopped");
    }
}

impl Shared {
    fn accept_loop(self: Arc<Self>, listener: UnixListener) {
        let tick = Timespec {
            tv_sec: 0,
            tv_nsec: 100_000_000,
        };
        while !self.stop.load(Ordering::Acquire) {
            let mut fds = [PollFd::new(&listener, PollFlags::IN)];
            match poll(&mut fds, Some(&tick)) {
                Ok(0) | Err(rustix::io::Errno::INTR) => continue,
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!("polling the process-tree socket failed: {e}");
                    std::thread::sleep(Duration::from_millis(50));
                    continue;
                }
            }
            match listener.accept() {
                Ok((stream, _)) => self.admit(stream),
                Err(e) => {
                    tracing::warn!("accepting a process of the tree failed: {e}");
                    std::thread::sleep(Duration::from_millis(50));
                }
            }
        }
    }

    fn admit(self: &Arc<Self>, stream: UnixStream) {
        let peer = match rustix::net::sockopt::socket_peercred(&stream) {
            Ok(c) => rustix::process::Pid::as_raw(Some(c.pid)) as u32,
            Err(e) => {
                tracing::warn!("refusing a process of the tree: SO_PEERCRED names no one: {e}");
                return;
            }
        };
        if let Err(why) = self.admission.admits(peer) {
            tracing::warn!("refusing a connection to the process tree's budget: {why}");
            return;
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let registered = match stream.try_clone() {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!("refusing a process of the tree: cannot clone its socket: {e}");
                return;
            }
        };
        lock(&self.connections).insert(id, registered);
        if self.stop.load(Ordering::Acquire) {
            let _ = stream.shutdown(std::net::Shutdown::Both);
        }
        let sh = Arc::clone(self);
        let spawned = std::thread::Builder::new()
            .name(format!("farmem-tree-{id}"))
            .stack_size(256 << 10)
            .spawn(move || sh.serve(id, peer, stream));
        let mut threads = lock(&self.threads);
        threads.retain(|t| !t.is_finished());
        match spawned {
            Ok(t) => threads.push(t),
            Err(e) => {
                lock(&self.connections).remove(&id);
                tracing::warn!("refusing a process of the tree: cannot start its thread: {e}");
            }
        }
    }

    /// Serves connection `id` until it closes or misbehaves; then its grant returns.
    /// `peer`: the pid the kernel gives for the connection's process.
    fn serve(&self, id: u64, peer: u32, stream: UnixStream) {
        let mut pid = None;
        let result = self.serve_lines(id, peer, &stream, &mut pid);
        lock(&self.connections).remove(&id);
        let _ = stream.shutdown(std::net::Shutdown::Both);
        if pid.is_some() {
            let mut budget = lock(&self.budget);
            lock(&self.writers).remove(&id);
            if budget.leave(id) {
                let changed = budget.rebalance();
                self.send_grants(&mut budget, changed);
            }
        }
        let who = match pid {
            Some(p) => format!("process {p}"),
            None => "a process that did not say hello".to_string(),
        };
        match result {
            Ok(()) => tracing::debug!("{who} left the tree (connection {id})"),
            Err(e) if self.stop.load(Ordering::Acquire) => {
                tracing::debug!("{who} disconnected at stop: {e}")
            }
            Err(Dropped::Write(e)) if closed_by_peer(&e) => {
                tracing::debug!(
                    "{who} left the tree before its grant was written (connection {id}): {e}"
                )
            }
            Err(e) => tracing::warn!("dropping {who} from the process tree (connection {id}): {e}"),
        }
    }

    fn serve_lines(
        &self,
        id: u64,
        peer: u32,
        stream: &UnixStream,
        pid: &mut Option<u32>,
    ) -> Result<(), Dropped> {
        let mut lines = LineBuffer::new();
        let mut chunk = [0u8; 4096];
        loop {
            let n = match (&*stream).read(&mut chunk) {
                Ok(0) if lines.pending_bytes() == 0 => return Ok(()),
                Ok(0) => {
                    return Err(Dropped::Truncated {
                        bytes: lines.pending_bytes(),
                    })
                }
                Ok(n) => n,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                // A process that exits with a grant unread resets the connection: that is
                // its departure, not a fault.
                Err(e) if closed_by_peer(&e) => return Ok(()),
                Err(e) => return Err(Dropped::Read(e)),
            };
            lines.push(&chunk[..n]);
            while let Some(line) = lines.next_line()? {
                match (ToCoordinator::decode(&line)?, *pid) {
                    (ToCoordinator::Hello { version, .. }, None)
                        if version != TREE_PROTOCOL_VERSION =>
                    {
                        return Err(Dropped::WrongVersion { got: version });
                    }
                    (
                        ToCoordinator::Hello {
                            pid: p, min_pages, ..
                        },
                        None,
                    ) => {
                        let known = self.admission.pid_of(peer, p);
                        if known != p {
                            tracing::debug!(
                                "process {known} says it is process {p} (another pid namespace, \
                                 or a lie): known as {known}"
                            );
                        }
                        self.join(id, known, min_pages, stream)?;
                        *pid = Some(known);
                    }
                    (ToCoordinator::Hello { .. }, Some(_)) => return Err(Dropped::SecondHello),
                    (ToCoordinator::Report(_), None) => return Err(Dropped::ReportBeforeHello),
                    (ToCoordinator::Report(r), Some(_)) => {
                        let mut budget = lock(&self.budget);
                        budget.report(id, r);
                        let changed = budget.rebalance();
                        self.send_grants(&mut budget, changed);
                    }
                }
            }
        }
    }

    /// Joins the process and writes its first Grant before any other grant can reach it.
    fn join(&self, id: u64, pid: u32, min_pages: u64, stream: &UnixStream) -> Result<(), Dropped> {
        let writer = stream.try_clone().map_err(Dropped::Write)?;
        writer
            .set_write_timeout(Some(WRITE_TIMEOUT))
            .map_err(Dropped::Write)?;
        let mut budget = lock(&self.budget);
        // No process of the tree can run with more than all of it; granting it would lower
        // every other process to its least share.
        if min_pages > budget.total_pages() {
            return Err(Dropped::MinAboveBudget {
                min_pages,
                total_pages: budget.total_pages(),
            });
        }
        let grant = budget.join(id, pid, min_pages);
        if let Err(e) = send_all(&writer, &ToProcess::Grant { pages: grant }.encode()) {
            budget.leave(id);
            let changed = budget.rebalance();
            self.send_grants(&mut budget, changed);
            return Err(Dropped::Write(e));
        }
        tracing::debug!("process {pid} joined the tree with {grant} pages (min {min_pages})");
        lock(&self.writers).insert(id, writer);
        let changed = budget.rebalance();
        self.send_grants(&mut budget, changed);
        Ok(())
    }

    /// Writes changed grants; a process whose write fails is dropped (its grant returns and
    /// the budget is rebalanced again).
    fn send_grants(&self, budget: &mut Budget, mut changed: Vec<(u64, u64)>) {
        while !changed.is_empty() {
            let mut failed = Vec::new();
            {
                let writers = lock(&self.writers);
                for (id, pages) in changed {
                    let Some(w) = writers.get(&id) else {
                        continue;
                    };
                    if let Err(e) = send_all(w, &ToProcess::Grant { pages }.encode()) {
                        if closed_by_peer(&e) {
                            // It exited before its connection's thread saw the end: the
                            // usual end of a process, nothing to tell the user.
                            tracing::debug!("process tree connection {id} closed: {e}");
                        } else {
                            tracing::warn!(
                                "dropping connection {id} from the process tree: writing its grant failed: {e}"
                            );
                        }
                        let _ = w.shutdown(std::net::Shutdown::Both);
                        failed.push(id);
                    }
                }
            }
            let mut writers = lock(&self.writers);
            for id in &failed {
                writers.remove(id);
                budget.leave(*id);
            }
            drop(writers);
            changed = if failed.is_empty() {
                Vec::new()
            } else {
                budget.rebalance()
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_grant_to_a_process_that_closed_its_end_fails_as_closed_by_peer() {
        let (ours, theirs) = UnixStream::pair().unwrap();
        // Shut down before closing: another test's fork (between fork and exec) may hold a copy
        // of `theirs` for a moment, and then dropping this one would not close the socket.
        theirs.shutdown(std::net::Shutdown::Both).unwrap();
        drop(theirs);
        let e = send_all(&ours, b"{\"Grant\":{\"pages\":1}}\n").unwrap_err();
        assert!(closed_by_peer(&e), "{e:?}");
        assert!(!closed_by_peer(&io::Error::from(ErrorKind::WriteZero)));
        assert!(!closed_by_peer(&io::Error::from(ErrorKind::TimedOut)));
    }
}
