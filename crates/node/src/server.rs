//! The node: listens on a Unix socket and lends each client memfd slabs of this host's memory.
//!
//! # Design
//! - **Socket**: bound with mode 0660 before it listens (no window with a laxer mode); its
//!   folder is created 0755 if missing. A path a live node answers on is refused; a stale
//!   socket file (nothing answers) is replaced; any other file is left alone and refused.
//! - **One thread per connection** (bounded by [`NodeConfig::max_clients`], and by
//!   [`NodeConfig::max_clients_per_uid`] for each user but root and the node's own, so one
//!   user's idle connections cannot lock the others out, and an eighth of `max_clients` kept
//!   for root and the node's own user, so several users cannot either; small stacks): it
//!   reads frames and answers them. Every peer is identified with SO_PEERCRED (pid, uid, gid),
//!   logged at info on connect and disconnect. The watcher thread writes RECLAIM frames to the
//!   same sockets; a per-connection lock keeps frames whole.
//! - **Slabs** ([`crate::slab`]): made and fallocated by the node (charged to the node's memory
//!   cgroup), sealed, sent with SCM_RIGHTS; the node keeps its fd. A slab belongs to the one
//!   connection it was sent on. FREE, a disconnect, or a client's death punches a hole over the
//!   slab before the node's fd is closed, and only then is it counted free — unless a live hold
//!   names it (below).
//! - **Holds** ([`crate::hold`]): a client about to fork asks for a hold over slabs its child
//!   may keep reading (HOLD → HELD with a 4 KiB memfd the client maps, arms, and lets the child
//!   inherit). A slab a live hold names is not punched when its client FREEs it or goes away:
//!   it becomes *kept* (no client's, still counted in used bytes) and is released when the last
//!   live hold naming it is dead. Holds outlive their connection. They are probed (F_SEAL_WRITE,
//!   EBUSY while mapped) every watcher round, on a FREE of a held slab, on a disconnect, and
//!   when a client reaches a bound (beyond it: ERROR BadRequest): [`MAX_HOLDS_PER_CLIENT`] live
//!   holds per connection, [`MAX_HOLDS_PER_UID`] per user, and in all what the open-files
//!   limit leaves once every client connection and every slab of the capacity has its
//!   descriptors (each hold keeps one open).
//! - **Capacity**: used bytes count slabs being made and being freed, so the cap holds at every
//!   instant. RESIZE (root or the node's own uid only) changes it at run time.
//! - **Shares** ([`crate::share`]): an ALLOC beyond the user's share is refused (ERROR
//!   ShareUsed with its figures); a user refused by a full node below its fair share makes the
//!   users above theirs be asked for the excess (RECLAIM, as below).
//! - **STATS**: a user other than root and the node's own sees only its own client rows.
//! - **Pressure and reclaim**: a watcher thread (every [`NodeConfig::watch_period`]) reads
//!   MemAvailable; below `--keep-free` the node refuses new slabs (ERROR Pressure). Whenever the
//!   node holds more than it should (used above capacity after a RESIZE, or the host below its
//!   watermark) it sends RECLAIM{n} to the largest users first, never asking a client for more
//!   than it holds nor again while an earlier ask is outstanding
//!   ([`NodeConfig::reclaim_patience`]). Kept slabs count in the excess (they are the host's
//!   memory) but no client can give them back: the clients are asked for what they hold, and
//!   the rest of the excess waits for the holds to die.
//! - **Hostile clients**: a bad frame, an oversized length, an unknown opcode, or half a frame
//!   followed by silence past [`NodeConfig::frame_deadline`] disconnects that client (its slabs
//!   freed) with one warn line, rate-limited; a connection must say HELLO within the same
//!   deadline. Idle connections between frames are fine (a runtime may hold slabs for hours).
//!
//! # Limitations
//! The node does not see which pages a client uses; it relies on the clients to pick the slabs
//! they give back. A client that ignores RECLAIM keeps its slabs (the node refuses new ones).
//! A FREE of a held slab counts as reclaimed though its memory returns only when its holds die.
//! Each user may keep up to [`MAX_HOLDS_PER_UID`] holds alive (one fd and one page each),
//! pinning only slabs that were its own, however often it reconnects.
//! Kept slabs, and the slabs of clients still connected, are never punched when the node stops:
//! its fds close, and the pages live as long as a process maps them (a client can read and
//! write the slabs it has, but gets no new ones).
use std::collections::{HashMap, HashSet};
use std::io::{ErrorKind, IoSlice, Read};
use std::mem::MaybeUninit;
use std::net::{SocketAddr, TcpListener};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use farmem_metrics::MetricsEndpoint;
use rustix::event::{poll, PollFd, PollFlags, Timespec};
use rustix::net::{sendmsg, SendAncillaryBuffer, SendAncillaryMessage, SendFlags, SocketAddrUnix};

use crate::hold::{self, Holds, Liveness};
use crate::metrics::{render_prometheus, ClientStats, Counters, NodeStats};
use crate::share::{fair_share_bytes, MaxShare, Wanting};
use crate::slab;
use crate::wire::{decode_client_frame, ClientFrame, ErrorCode, NodeFrame, PROTOCOL_VERSION};

pub use crate::hold::{MAX_HOLDS_PER_CLIENT, MAX_HOLDS_PER_UID};

/// The default slab size (4 MiB).
pub const DEFAULT_SLAB_BYTES: u64 = 4 << 20;
/// The default bound on connected clients.
pub const MAX_CLIENTS: usize = 1024;
/// The default bound on the connections of one user (uid) other than root and the node's own.
pub const MAX_CLIENTS_PER_UID: usize = 256;
/// File descriptors kept for what is not a client, a slab or a hold (the listener, metrics,
/// logs, the process's own).
const FD_RESERVE: u64 = 64;
/// The default time a client has for a whole frame once it started one (and for its HELLO).
pub const FRAME_DEADLINE: Duration = Duration::from_secs(5);
/// The longest one write to a client may block before the client is dropped.
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(2);
/// How many warn lines about bad clients are logged per [`WARN_INTERVAL`] at most.
pub const WARNS_PER_INTERVAL: u32 = 10;
/// See [`WARNS_PER_INTERVAL`].
pub const WARN_INTERVAL: Duration = Duration::from_secs(10);
const PAGE: u64 = farmem_mm::PAGE_SIZE as u64;

/// How a node runs.
#[derive(Debug, Clone)]
pub struct NodeConfig {
    /// The Unix socket to listen on.
    pub socket_path: PathBuf,
    /// Most bytes lent in all (slabs × slab size never exceeds it).
    pub capacity_bytes: u64,
    /// Size of one slab: a non-zero multiple of 4096.
    pub slab_bytes: u64,
    /// Refuse new slabs and ask for slabs back while MemAvailable is below this.
    pub keep_free_bytes: Option<u64>,
    /// Serve Prometheus metrics over HTTP at this address.
    pub metrics_listen: Option<String>,
    /// The socket's group (its members may connect when `socket_mode` lets the group in);
    /// `None` keeps the node's own group.
    pub socket_group: Option<u32>,
    /// The socket's permission bits: 0660 (owner and group, the default) or 0600 (owner
    /// only). Never open to others: clients refuse a socket anyone may write.
    pub socket_mode: u32,
    /// Most connections served at once.
    pub max_clients: usize,
    /// Most connections of one user served at once; root and the node's own user are bound
    /// by `max_clients` only (they may stop or resize the node anyway).
    pub max_clients_per_uid: usize,
    /// Most one user may hold, always (`--max-share-per-uid`); beside it, each user's fair
    /// share binds while others want memory ([`crate::share`]).
    pub max_share_per_uid: Option<MaxShare>,
    /// Time for a whole frame once started, and for the HELLO of a new connection.
    pub frame_deadline: Duration,
    /// How often the watcher checks MemAvailable and what the node holds.
    pub watch_period: Duration,
    /// How long a RECLAIM ask is outstanding before the client may be asked again.
    pub reclaim_patience: Duration,
    /// Where the watcher reads the host's available memory (`MemAvailable`; tests give their
    /// own).
    pub mem_available: fn() -> Option<u64>,
}

impl Default for NodeConfig {
    fn default() -> Self {
        NodeConfig {
            socket_path: crate::client::default_socket_path(),
            capacity_bytes: 0,
            slab_bytes: DEFAULT_SLAB_BYTES,
            keep_free_bytes: None,
            metrics_listen: None,
            socket_group: None,
            socket_mode: DEFAULT_SOCKET_MODE,
            max_clients: MAX_CLIENTS,
            max_clients_per_uid: MAX_CLIENTS_PER_UID,
            max_share_per_uid: None,
            frame_deadline: FRAME_DEADLINE,
            watch_period: Duration::from_millis(250),
            reclaim_patience: Duration::from_secs(2),
            mem_available: farmem_host::probe::mem_available_bytes,
        }
    }
}

/// Starting or running the node failed.
#[derive(Debug, thiserror::Error)]
pub enum NodeServerError {
    /// The socket mode is not 0660 or 0600.
    #[error("socket mode {0:04o} is not allowed: give 0660 (owner and group may connect) or 0600 (owner only); a socket others may use would let any process pose as the node's clients")]
    BadSocketMode(u32),
    /// The slab size is not a non-zero multiple of 4096.
    #[error("slab size {0} bytes is not a non-zero multiple of 4096 (e.g. --slab-size 4MiB)")]
    BadSlabSize(u64),
    /// The capacity holds not even one slab.
    #[error("capacity {capacity_bytes} bytes holds not one slab of {slab_bytes} bytes; give a larger --capacity or a smaller --slab-size")]
    CapacityTooSmall {
        capacity_bytes: u64,
        slab_bytes: u64,
    },
    /// `--max-share-per-uid` holds not one slab.
    #[error("--max-share-per-uid is {share_bytes} bytes of this node, not one slab of {slab_bytes} bytes: give a larger share or a smaller --slab-size")]
    ShareTooSmall { share_bytes: u64, slab_bytes: u64 },
    /// The capacity is above what the machine holds.
    #[error("capacity {capacity_bytes} bytes is more than {what} ({limit_bytes} bytes); give a --capacity of at most that")]
    CapacityTooLarge {
        capacity_bytes: u64,
        limit_bytes: u64,
        what: &'static str,
    },
    /// The socket's folder could not be created.
    #[error("cannot create the socket's folder {}: {source}", dir.display())]
    CreateDir {
        dir: PathBuf,
        source: std::io::Error,
    },
    /// The socket's folder belongs to another user, or others may write to it without the
    /// sticky bit: they could swap the socket for a link between its bind and its chmod.
    #[error("the socket's folder is unsafe: {0}")]
    UnsafeDir(#[source] farmem_fds::dirs::DirError),
    /// A live node already answers on the path.
    #[error("a node is already listening on {}; stop it first or pick another --socket", path.display())]
    AlreadyRunning { path: PathBuf },
    /// Something other than a socket is at the path.
    #[error("{} exists and is not a socket; remove it or pick another --socket", path.display())]
    NotASocket { path: PathBuf },
    /// Binding or preparing the socket failed.
    #[error("cannot listen on {}: {source}", path.display())]
    Bind {
        path: PathBuf,
        source: std::io::Error,
    },
    /// The metrics endpoint could not be started.
    #[error("cannot serve metrics on {addr} (is the port in use? pick another with --metrics): {source}")]
    Metrics {
        addr: String,
        source: std::io::Error,
    },
    /// A thread could not be started.
    #[error("cannot start the node's {what} thread: {source}")]
    Thread {
        what: &'static str,
        source: std::io::Error,
    },
    /// --exit-with-parent could not be honoured.
    #[error("--exit-with-parent {pid}: {why}")]
    Parent { pid: u32, why: String },
}

/// Arranges for this process to be killed when its parent `pid` dies (PR_SET_PDEATHSIG), and
/// checks that `pid` is still the parent (it may have died before the request).
pub fn exit_with_parent(pid: u32) -> Result<(), NodeServerError> {
    use rustix::process::{getppid, set_parent_process_death_signal, Pid};
    set_parent_process_death_signal(Some(rustix::process::Signal::KILL)).map_err(|e| {
        NodeServerError::Parent {
            pid,
            why: format!("PR_SET_PDEATHSIG failed: {e}"),
        }
    })?;
    let parent = getppid().map_or(0, |p| Pid::as_raw(Some(p)));
    if i64::from(parent) != i64::from(pid) {
        return Err(NodeServerError::Parent {
            pid,
            why: "that process is not our parent (gone already?); not starting".into(),
        });
    }
    Ok(())
}

/// Who a connection is (SO_PEERCRED at accept).
#[derive(Debug, Clone, Copy)]
struct Peer {
    pid: u32,
    uid: u32,
    gid: u32,
}

/// One lent slab.
struct Slab {
    /// The connection it belongs to; `None` once its client freed it or went away while a live
    /// hold names it (kept until the last such hold dies).
    owner: Option<u64>,
    fd: Arc<OwnedFd>,
}

/// The writing half of a connection: whole frames under one lock, never SIGPIPE.
struct Out {
    stream: UnixStream,
    lock: Mutex<()>,
}

impl Out {
    /// Sends `bytes`, with `fd` as SCM_RIGHTS on the first byte if given. A failure shuts the
    /// connection down (its reader then sees the end and cleans up).
    fn send(&self, bytes: &[u8], fd: Option<&OwnedFd>) -> std::io::Result<()> {
        let _whole = lock(&self.lock);
        let result = send_all(&self.stream, bytes, fd);
        if result.is_err() {
            let _ = self.stream.shutdown(std::net::Shutdown::Both);
        }
        result
    }
}

fn send_all(stream: &UnixStream, bytes: &[u8], fd: Option<&OwnedFd>) -> std::io::Result<()> {
    let mut sent = 0;
    if let Some(fd) = fd {
        let fds = [fd.as_fd()];
        let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
        let mut control = SendAncillaryBuffer::new(&mut space);
        if !control.push(SendAncillaryMessage::ScmRights(&fds)) {
            return Err(std::io::Error::other("no room for the slab's fd"));
        }
        sent = loop {
            match sendmsg(
                stream,
                &[IoSlice::new(bytes)],
                &mut control,
                SendFlags::NOSIGNAL,
            ) {
                Ok(n) => break n,
                Err(rustix::io::Errno::INTR) => continue,
                Err(e) => return Err(e.into()),
            }
        };
    }
    while sent < bytes.len() {
        match rustix::net::send(stream, &bytes[sent..], SendFlags::NOSIGNAL) {
            Ok(n) => sent += n,
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// A connection the node serves.
struct Client {
    peer: Peer,
    out: Arc<Out>,
    /// True once it said HELLO with the right version.
    welcomed: bool,
    slabs: HashSet<u32>,
    /// Slabs asked back and not yet given, and when they were asked.
    asked: u64,
    asked_at: Option<Instant>,
}

struct State {
    capacity_bytes: u64,
    /// Bytes in held slabs, slabs being made and slabs being freed.
    used_bytes: u64,
    slabs: HashMap<u32, Slab>,
    clients: HashMap<u64, Client>,
    holds: Holds,
    next_slab: u32,
    mem_available: Option<u64>,
    under_pressure: bool,
    /// Users refused a slab they were entitled to lately ([`crate::share`]).
    wanting: Wanting,
}

impl State {
    /// Slabs the connections of user `uid` hold.
    fn held_slabs(&self, uid: u32) -> u64 {
        self.clients
            .values()
            .filter(|c| c.peer.uid == uid)
            .map(|c| c.slabs.len() as u64)
            .sum()
    }

    /// Users holding slabs, wanting memory (`wanting`), or `asking`.
    fn active_users(&self, wanting: &[u32], asking: Option<u32>) -> HashSet<u32> {
        self.clients
            .values()
            .filter(|c| !c.slabs.is_empty())
            .map(|c| c.peer.uid)
            .chain(wanting.iter().copied())
            .chain(asking)
            .collect()
    }

    fn fresh_slab_id(&mut self) -> u32 {
        loop {
            let id = self.next_slab;
            self.next_slab = self.next_slab.wrapping_add(1).max(1);
            if !self.slabs.contains_key(&id) {
                return id;
            }
        }
    }
}

/// Rate limit for warn lines about bad clients.
struct WarnLimit {
    since: Instant,
    logged: u32,
    suppressed: u64,
}

struct Shared {
    cfg: NodeConfig,
    state: Mutex<State>,
    counters: Counters,
    stop: AtomicBool,
    connections: AtomicUsize,
    /// Connections per user (SO_PEERCRED uid).
    uid_connections: Mutex<HashMap<u32, usize>>,
    start: Instant,
    node_uid: u32,
    node_pid: u32,
    memory_limit: Option<(u64, &'static str)>,
    warns: Mutex<WarnLimit>,
    /// Serialises reclaim planning (watcher and RESIZE).
    reclaiming: Mutex<()>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Shared {
    /// Root and the node's own user: they may stop, resize and inspect the node.
    fn is_trusted(&self, uid: u32) -> bool {
        uid == 0 || uid == self.node_uid
    }

    /// Counts a new connection of user `uid`; false (nothing counted) when that user is at
    /// [`NodeConfig::max_clients_per_uid`] (root and the node's own user never are).
    fn admit_uid(&self, uid: u32) -> bool {
        let mut per = lock(&self.uid_connections);
        let n = per.entry(uid).or_insert(0);
        if !self.is_trusted(uid) && *n >= self.cfg.max_clients_per_uid {
            return false;
        }
        *n += 1;
        true
    }

    /// Connections of users other than root and the node's own, in all.
    fn untrusted_connections(&self) -> usize {
        lock(&self.uid_connections)
            .iter()
            .filter(|(uid, _)| !self.is_trusted(**uid))
            .map(|(_, n)| *n)
            .sum()
    }

    /// A connection of user `uid` ended.
    fn leave_uid(&self, uid: u32) {
        let mut per = lock(&self.uid_connections);
        if let Some(n) = per.get_mut(&uid) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                per.remove(&uid);
            }
        }
    }

    /// Why connection `id` of user `uid` may not make another hold now, if it may not.
    fn hold_refusal(&self, st: &State, id: u64, uid: u32) -> Option<String> {
        if st.holds.count_of(id) >= MAX_HOLDS_PER_CLIENT {
            return Some(format!(
                "this connection has {MAX_HOLDS_PER_CLIENT} live holds, the most a client may have: unmap the holds no process needs any more (a hold lives while any process maps it)"
            ));
        }
        if st.holds.count_of_uid(uid) >= MAX_HOLDS_PER_UID {
            return Some(format!(
                "uid {uid} has {MAX_HOLDS_PER_UID} live holds, the most one user may have: unmap the holds no process needs any more (a hold lives while any process maps it)"
            ));
        }
        // Read each time: an operator may change a running node's limit (prlimit).
        let open_files = open_files_limit();
        let room = hold_budget(&self.cfg, open_files, st.capacity_bytes.max(st.used_bytes));
        if st.holds.len() >= room {
            return Some(format!(
                "the node has {} live holds, the most its open-files limit ({open_files}) leaves room for beside its clients and slabs (each hold keeps a descriptor open); raise the node's limit (ulimit -n) or wait for holds to end",
                st.holds.len()
            ));
        }
        None
    }

    fn warn(&self, what: std::fmt::Arguments<'_>) {
        let mut w = lock(&self.warns);
        if w.since.elapsed() >= WARN_INTERVAL {
            if w.suppressed > 0 {
                tracing::warn!(
                    "{} more warnings about bad clients were not logged",
                    w.suppressed
                );
            }
            *w = WarnLimit {
                since: Instant::now(),
                logged: 0,
                suppressed: 0,
            };
        }
        if w.logged < WARNS_PER_INTERVAL {
            w.logged += 1;
            tracing::warn!("{what}");
        } else {
            w.suppressed += 1;
        }
    }

    fn snapshot(&self) -> NodeStats {
        let st = lock(&self.state);
        let mut clients: Vec<ClientStats> = st
            .clients
            .values()
            .filter(|c| c.welcomed)
            .map(|c| ClientStats {
                pid: c.peer.pid,
                uid: c.peer.uid,
                gid: c.peer.gid,
                slabs: c.slabs.len() as u64,
                bytes: c.slabs.len() as u64 * self.cfg.slab_bytes,
                reclaim_outstanding: c.asked,
            })
            .collect();
        clients.sort_by(|a, b| b.slabs.cmp(&a.slabs).then(a.pid.cmp(&b.pid)));
        let mut s = NodeStats {
            node_pid: self.node_pid,
            capacity_bytes: st.capacity_bytes,
            used_bytes: st.used_bytes,
            slab_bytes: self.cfg.slab_bytes,
            slabs: st.slabs.len() as u64,
            holds: st.holds.len() as u64,
            held_slabs: st.holds.held_slabs() as u64,
            kept_slabs: st.slabs.values().filter(|s| s.owner.is_none()).count() as u64,
            keep_free_bytes: self.cfg.keep_free_bytes,
            mem_available_bytes: st.mem_available,
            under_pressure: st.under_pressure,
            clients,
            uptime_ms: self.start.elapsed().as_millis() as u64,
            ..NodeStats::default()
        };
        drop(st);
        self.counters.fill(&mut s);
        s
    }

    /// An ERROR frame with the node's current figures.
    fn error(&self, req: u32, code: ErrorCode, message: String) -> Vec<u8> {
        let (used_bytes, capacity_bytes) = {
            let st = lock(&self.state);
            (st.used_bytes, st.capacity_bytes)
        };
        self.error_with(req, code, (used_bytes, capacity_bytes), message)
    }

    /// An ERROR frame with the figures given (for [`ErrorCode::ShareUsed`]: the user's).
    fn error_with(
        &self,
        req: u32,
        code: ErrorCode,
        (used_bytes, capacity_bytes): (u64, u64),
        message: String,
    ) -> Vec<u8> {
        self.counters.refused(code);
        NodeFrame::Error {
            req,
            code,
            used_bytes,
            capacity_bytes,
            message,
        }
        .encode()
    }

    /// Why user `uid` may not take one more slab, with its figures (held, share), if it may
    /// not: above `--max-share-per-uid`, or above its fair share while another user wants
    /// memory ([`crate::share`]).
    fn share_refusal(&self, st: &mut State, uid: u32) -> Option<(String, (u64, u64))> {
        let slab_bytes = self.cfg.slab_bytes;
        let held = st.held_slabs(uid) * slab_bytes;
        if let Some(max) = self
            .cfg
            .max_share_per_uid
            .map(|m| m.bytes(st.capacity_bytes))
        {
            if held + slab_bytes > max {
                return Some((
                    format!(
                        "uid {uid} holds {held} of the node's {} bytes, and --max-share-per-uid \
                         allows one user {max}",
                        st.capacity_bytes
                    ),
                    (held, max),
                ));
            }
        }
        let wanting = st.wanting.users();
        if !wanting.iter().any(|u| *u != uid) {
            return None;
        }
        let active = st.active_users(&wanting, Some(uid)).len();
        let fair = fair_share_bytes(st.capacity_bytes, slab_bytes, active);
        (held + slab_bytes > fair).then(|| {
            (
                format!(
                    "uid {uid} holds {held} bytes; {active} users want this node's {} bytes, a \
                     fair share is {fair}",
                    st.capacity_bytes
                ),
                (held, fair),
            )
        })
    }

    /// Returns slabs to the host (hole punched, fd closed), then counts them free.
    fn release(&self, slabs: Vec<Slab>) {
        if slabs.is_empty() {
            return;
        }
        let n = slabs.len() as u64;
        for s in slabs {
            if let Err(e) = slab::release(&*s.fd, self.cfg.slab_bytes) {
                tracing::error!("punching a hole in a freed slab failed: {e}");
            }
        }
        let mut st = lock(&self.state);
        st.used_bytes = st.used_bytes.saturating_sub(n * self.cfg.slab_bytes);
    }

    /// Probes every live hold; forgets the dead ones and releases the slabs kept only for them.
    fn prune_holds(&self) {
        let candidates: Vec<(u32, Arc<OwnedFd>, bool, bool)> = {
            let st = lock(&self.state);
            st.holds
                .iter()
                .map(|(id, h)| {
                    let connected = st.clients.contains_key(&h.owner);
                    (id, Arc::clone(&h.fd), h.armed, connected)
                })
                .collect()
        };
        if candidates.is_empty() {
            return;
        }
        // Probed outside the lock (a syscall or two per hold); `connected` was read first, so
        // an arm written before the client went away is seen below.
        let mut dead = Vec::new();
        let mut armed_now = Vec::new();
        for (id, fd, was_armed, connected) in candidates {
            if !was_armed {
                if hold::is_armed(&*fd) {
                    armed_now.push(id);
                } else {
                    // Not mapped yet: alive while its client may still map it.
                    if !connected {
                        dead.push((id, fd));
                    }
                    continue;
                }
            }
            match hold::probe(&*fd) {
                (Liveness::Dead, _) => dead.push((id, fd)),
                (Liveness::Alive, None) => {}
                (Liveness::Alive, Some(e)) => self.warn(format_args!(
                    "cannot probe hold {id} ({e}); keeping it and the slabs it names"
                )),
            }
        }
        let released: Vec<Slab> = {
            let mut st = lock(&self.state);
            for id in armed_now {
                st.holds.set_armed(id);
            }
            let mut released = Vec::new();
            for (id, fd) in dead {
                // Hold ids are not reused while live; the fd check makes that certain.
                if !st
                    .holds
                    .iter()
                    .any(|(i, h)| i == id && Arc::ptr_eq(&h.fd, &fd))
                {
                    continue;
                }
                for s in st.holds.remove(id) {
                    if st.slabs.get(&s).is_some_and(|x| x.owner.is_none()) {
                        released.extend(st.slabs.remove(&s));
                    }
                }
            }
            released
        };
        if !released.is_empty() {
            tracing::info!(
                slabs = released.len(),
                "releasing slabs kept for holds no process maps any more"
            );
        }
        self.release(released);
    }

    /// Asks clients for slabs while the node holds more than it should: above its capacity, or
    /// while the host is below its watermark. Largest users first; never more than a client
    /// holds; never again while an earlier ask is outstanding.
    fn reclaim_excess(&self) {
        let _one = lock(&self.reclaiming);
        let slab_bytes = self.cfg.slab_bytes;
        let mut asks = Vec::new();
        {
            let mut st = lock(&self.state);
            for c in st.clients.values_mut() {
                if c.asked_at
                    .is_some_and(|t| t.elapsed() >= self.cfg.reclaim_patience)
                {
                    c.asked = 0;
                    c.asked_at = None;
                }
            }
            let over = st.used_bytes.saturating_sub(st.capacity_bytes);
            let short = match (self.cfg.keep_free_bytes, st.mem_available) {
                (Some(keep), Some(avail)) => keep.saturating_sub(avail),
                _ => 0,
            };
            let excess_slabs = (over + short).div_ceil(slab_bytes);
            let outstanding: u64 = st.clients.values().map(|c| c.asked).sum();
            let mut need = excess_slabs.saturating_sub(outstanding);
            let mut order: Vec<(u64, usize)> = st
                .clients
                .iter()
                .filter(|(_, c)| c.asked == 0 && !c.slabs.is_empty())
                .map(|(id, c)| (*id, c.slabs.len()))
                .collect();
            order.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
            for (id, held) in order {
                if need == 0 {
                    break;
                }
                let n = need.min(held as u64);
                if let Some(c) = st.clients.get_mut(&id) {
                    c.asked = n;
                    c.asked_at = Some(Instant::now());
                    asks.push((Arc::clone(&c.out), c.peer, n));
                }
                need -= n;
            }
            asks.extend(self.share_asks(&mut st));
        }
        for (out, peer, n) in asks {
            let slabs = u32::try_from(n).unwrap_or(u32::MAX);
            tracing::info!(
                pid = peer.pid,
                uid = peer.uid,
                slabs,
                "asking a client to give slabs back"
            );
            if out
                .send(&NodeFrame::Reclaim { slabs }.encode(), None)
                .is_ok()
            {
                self.counters.reclaim_requested();
            }
        }
    }

    /// While a user wants memory and holds less than its fair share, asks each user above
    /// its share for the excess (its connections largest first, none asked twice while an ask
    /// is outstanding); returns the asks to send.
    fn share_asks(&self, st: &mut State) -> Vec<(Arc<Out>, Peer, u64)> {
        let wanting = st.wanting.users();
        if wanting.is_empty() {
            return Vec::new();
        }
        let users = st.active_users(&wanting, None);
        let fair = fair_share_bytes(st.capacity_bytes, self.cfg.slab_bytes, users.len())
            / self.cfg.slab_bytes;
        if !wanting.iter().any(|u| st.held_slabs(*u) < fair) {
            return Vec::new();
        }
        let mut asks = Vec::new();
        for uid in users {
            let held = st.held_slabs(uid);
            let outstanding: u64 = st
                .clients
                .values()
                .filter(|c| c.peer.uid == uid)
                .map(|c| c.asked)
                .sum();
            let mut over = held.saturating_sub(fair).saturating_sub(outstanding);
            let mut order: Vec<(u64, usize)> = st
                .clients
                .iter()
                .filter(|(_, c)| c.peer.uid == uid && c.asked == 0 && !c.slabs.is_empty())
                .map(|(id, c)| (*id, c.slabs.len()))
                .collect();
            order.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
            for (id, n) in order {
                if over == 0 {
                    break;
                }
                let n = over.min(n as u64);
                if let Some(c) = st.clients.get_mut(&id) {
                    c.asked = n;
                    c.asked_at = Some(Instant::now());
                    asks.push((Arc::clone(&c.out), c.peer, n));
                }
                over -= n;
            }
        }
        asks
    }

    /// One watcher round: holds, the host's available memory, then reclaim.
    fn watch_once(&self) {
        self.prune_holds();
        if let Some(keep) = self.cfg.keep_free_bytes {
            let avail = (self.cfg.mem_available)();
            let mut st = lock(&self.state);
            let was = st.under_pressure;
            st.mem_available = avail;
            st.under_pressure = avail.is_some_and(|a| a < keep);
            if st.under_pressure != was {
                if st.under_pressure {
                    tracing::warn!(
                        available_bytes = avail,
                        keep_free_bytes = keep,
                        "host memory below --keep-free: refusing new slabs, asking clients for slabs back"
                    );
                } else {
                    tracing::info!(
                        available_bytes = avail,
                        "host memory above --keep-free again"
                    );
                }
            }
        }
        self.reclaim_excess();
    }
}

/// A bound node, not yet serving.
pub struct NodeServer {
    shared: Arc<Shared>,
    listener: UnixListener,
    metrics: Option<MetricsEndpoint>,
}

/// Stops a node from another thread.
#[derive(Clone)]
pub struct ShutdownHandle(Arc<Shared>);

impl ShutdownHandle {
    /// Asks the node to stop; [`NodeServer::run`] returns soon after.
    pub fn shutdown(&self) {
        self.0.stop.store(true, Ordering::Release);
    }
}

/// Prepares the socket path: its folder, and whatever is there already.
fn prepare_path(path: &Path) -> Result<(), NodeServerError> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        if !dir.exists() {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o755)
                .create(dir)
                .map_err(|source| NodeServerError::CreateDir {
                    dir: dir.to_path_buf(),
                    source,
                })?;
        }
        farmem_fds::dirs::check_shared_parent(dir).map_err(NodeServerError::UnsafeDir)?;
    }
    let meta = match std::fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(()),
        Err(source) => {
            return Err(NodeServerError::Bind {
                path: path.into(),
                source,
            })
        }
    };
    if !meta.file_type().is_socket() {
        return Err(NodeServerError::NotASocket { path: path.into() });
    }
    match UnixStream::connect(path) {
        Ok(_) => Err(NodeServerError::AlreadyRunning { path: path.into() }),
        Err(e) if e.kind() == ErrorKind::ConnectionRefused => {
            tracing::info!("removing the stale socket {}", path.display());
            std::fs::remove_file(path).map_err(|source| NodeServerError::Bind {
                path: path.into(),
                source,
            })
        }
        Err(source) => Err(NodeServerError::Bind {
            path: path.into(),
            source,
        }),
    }
}

/// Raises this process's soft open-files limit to its hard limit (what a server that keeps a
/// descriptor per client, slab and hold wants); returns the limit now in force. For the
/// `farmem node` command: a process that embeds a node for tests keeps its own limit.
pub fn raise_open_files_limit() -> u64 {
    use rustix::process::{getrlimit, setrlimit, Resource};
    let mut lim = getrlimit(Resource::Nofile);
    // `None` is "unlimited" in rustix; Linux bounds the hard limit of NOFILE anyway.
    if let (Some(cur), Some(max)) = (lim.current, lim.maximum) {
        if cur < max {
            lim.current = Some(max);
            if let Err(e) = setrlimit(Resource::Nofile, lim) {
                tracing::warn!("raising the open-files limit to its hard limit failed: {e}");
            }
        }
    }
    open_files_limit()
}

/// This process's soft open-files limit (`u64::MAX` when unlimited).
fn open_files_limit() -> u64 {
    rustix::process::getrlimit(rustix::process::Resource::Nofile)
        .current
        .unwrap_or(u64::MAX)
}

/// How many holds may live at once with `capacity_bytes` lent in slabs of `cfg.slab_bytes`
/// and `open_files` descriptors: what is left once every client connection has two (its
/// socket and the writer's clone), every slab of the capacity one, and [`FD_RESERVE`] are
/// set aside. Without that bound one user's holds, which outlive their connections, took
/// every descriptor, and ALLOC and accept then failed for everyone.
fn hold_budget(cfg: &NodeConfig, open_files: u64, capacity_bytes: u64) -> usize {
    let slabs = capacity_bytes.div_ceil(cfg.slab_bytes);
    let clients = 2 * cfg.max_clients as u64;
    let left = open_files.saturating_sub(clients + slabs + FD_RESERVE);
    usize::try_from(left).unwrap_or(usize::MAX)
}

/// Connections of `max_clients` kept for root and the node's own user (an eighth).
fn trusted_reserve(max_clients: usize) -> usize {
    max_clients / 8
}

/// Binds the socket with mode 0660 before it listens.
/// The socket's default permission bits: its owner and group may connect.
pub const DEFAULT_SOCKET_MODE: u32 = 0o660;

/// True for the socket modes a node may use: owner read-write, the group all or nothing,
/// others nothing (clients refuse a socket others may write, [`crate::check_socket_trust`]).
pub fn socket_mode_allowed(mode: u32) -> bool {
    mode == 0o660 || mode == 0o600
}

fn bind_socket(
    path: &Path,
    group: Option<u32>,
    mode: u32,
) -> Result<UnixListener, NodeServerError> {
    use rustix::net::{bind, listen, socket_with, AddressFamily, SocketFlags, SocketType};
    let err = |source: std::io::Error| NodeServerError::Bind {
        path: path.into(),
        source,
    };
    let addr = SocketAddrUnix::new(path).map_err(|e| {
        err(std::io::Error::new(
            ErrorKind::InvalidInput,
            format!("{e} (a socket path is at most 107 bytes)"),
        ))
    })?;
    let fd = socket_with(
        AddressFamily::UNIX,
        SocketType::STREAM,
        SocketFlags::CLOEXEC,
        None,
    )
    .map_err(|e| err(e.into()))?;
    bind(&fd, &addr).map_err(|e| err(e.into()))?;
    // Group before mode: until the chmod the socket keeps the umask's bits, never wider.
    if let Some(gid) = group {
        std::os::unix::fs::lchown(path, None, Some(gid)).map_err(|e| {
            err(std::io::Error::new(
                e.kind(),
                format!("setting the socket's group to gid {gid}: {e} (only root or a member of that group may)"),
            ))
        })?;
    }
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).map_err(err)?;
    listen(&fd, 128).map_err(|e| err(e.into()))?;
    Ok(UnixListener::from(fd))
}

impl NodeServer {
    /// Checks the configuration against the machine, binds the socket (and the metrics
    /// endpoint), ready to [`run`](NodeServer::run).
    pub fn bind(cfg: NodeConfig) -> Result<NodeServer, NodeServerError> {
        if !socket_mode_allowed(cfg.socket_mode) {
            return Err(NodeServerError::BadSocketMode(cfg.socket_mode));
        }
        if cfg.slab_bytes == 0 || !cfg.slab_bytes.is_multiple_of(PAGE) {
            return Err(NodeServerError::BadSlabSize(cfg.slab_bytes));
        }
        if cfg.capacity_bytes < cfg.slab_bytes {
            return Err(NodeServerError::CapacityTooSmall {
                capacity_bytes: cfg.capacity_bytes,
                slab_bytes: cfg.slab_bytes,
            });
        }
        if let Some(m) = cfg.max_share_per_uid {
            let share_bytes = m.bytes(cfg.capacity_bytes);
            if share_bytes < cfg.slab_bytes {
                return Err(NodeServerError::ShareTooSmall {
                    share_bytes,
                    slab_bytes: cfg.slab_bytes,
                });
            }
        }
        let memory_limit = farmem_host::probe::memory_limit_bytes();
        if let Some((limit_bytes, what)) = memory_limit {
            if cfg.capacity_bytes > limit_bytes {
                return Err(NodeServerError::CapacityTooLarge {
                    capacity_bytes: cfg.capacity_bytes,
                    limit_bytes,
                    what,
                });
            }
        }
        let open_files = open_files_limit();
        let holds_room = hold_budget(&cfg, open_files, cfg.capacity_bytes);
        if holds_room < MAX_HOLDS_PER_CLIENT {
            tracing::warn!(
                "the open-files limit ({open_files}) leaves room for {holds_room} holds once {} \
                 client connections and the capacity's slabs have theirs: forked programs may \
                 not keep reading their parent's pages here; raise it (ulimit -n, \
                 LimitNOFILE=) or give a larger --slab-size",
                cfg.max_clients
            );
        }
        prepare_path(&cfg.socket_path)?;
        let listener = bind_socket(&cfg.socket_path, cfg.socket_group, cfg.socket_mode)?;
        let metrics_listener = match &cfg.metrics_listen {
            Some(addr) => Some(TcpListener::bind(addr.as_str()).map_err(|source| {
                NodeServerError::Metrics {
                    addr: addr.clone(),
                    source,
                }
            })?),
            None => None,
        };
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                capacity_bytes: cfg.capacity_bytes,
                used_bytes: 0,
                slabs: HashMap::new(),
                clients: HashMap::new(),
                holds: Holds::default(),
                next_slab: 1,
                mem_available: None,
                under_pressure: false,
                wanting: Wanting::default(),
            }),
            cfg,
            counters: Counters::default(),
            stop: AtomicBool::new(false),
            connections: AtomicUsize::new(0),
            uid_connections: Mutex::new(HashMap::new()),
            start: Instant::now(),
            node_uid: rustix::process::getuid().as_raw(),
            node_pid: std::process::id(),
            memory_limit,
            warns: Mutex::new(WarnLimit {
                since: Instant::now(),
                logged: 0,
                suppressed: 0,
            }),
            reclaiming: Mutex::new(()),
        });
        shared.watch_once();
        let metrics = match metrics_listener {
            Some(l) => {
                let sh = Arc::clone(&shared);
                let addr = l.local_addr().map(|a| a.to_string()).unwrap_or_default();
                Some(
                    MetricsEndpoint::start(l, "farmem-node-metrics", move || {
                        render_prometheus(&sh.snapshot())
                    })
                    .map_err(|source| NodeServerError::Metrics { addr, source })?,
                )
            }
            None => None,
        };
        Ok(NodeServer {
            shared,
            listener,
            metrics,
        })
    }

    /// The socket the node listens on.
    pub fn socket_path(&self) -> &Path {
        &self.shared.cfg.socket_path
    }

    /// The metrics endpoint's address, if one was configured.
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics.as_ref().map(MetricsEndpoint::addr)
    }

    /// A handle that stops the node from another thread.
    pub fn shutdown_handle(&self) -> ShutdownHandle {
        ShutdownHandle(Arc::clone(&self.shared))
    }

    /// The node's figures now.
    pub fn stats(&self) -> NodeStats {
        self.shared.snapshot()
    }

    /// Serves until [`ShutdownHandle::shutdown`]; then disconnects every client (their slabs are
    /// not punched: the clients map them, and may still be reading their pages there) and
    /// removes the socket file.
    pub fn run(self) -> Result<(), NodeServerError> {
        let sh = Arc::clone(&self.shared);
        let watcher = std::thread::Builder::new()
            .name("farmem-node-watch".into())
            .spawn(move || {
                while !sh.stop.load(Ordering::Acquire) {
                    sh.watch_once();
                    std::thread::sleep(sh.cfg.watch_period);
                }
            })
            .map_err(|source| NodeServerError::Thread {
                what: "watcher",
                source,
            })?;
        let tick = Timespec {
            tv_sec: 0,
            tv_nsec: 200_000_000,
        };
        while !self.shared.stop.load(Ordering::Acquire) {
            let mut fds = [PollFd::new(&self.listener, PollFlags::IN)];
            match poll(&mut fds, Some(&tick)) {
                Ok(0) | Err(rustix::io::Errno::INTR) => continue,
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!("polling the node socket failed: {e}");
                    std::thread::sleep(Duration::from_millis(50));
                    continue;
                }
            }
            match self.listener.accept() {
                Ok((stream, _)) => self.admit(stream),
                Err(e) => {
                    self.shared
                        .warn(format_args!("accepting a client failed: {e}"));
                    std::thread::sleep(Duration::from_millis(50));
                }
            }
        }
        let _ = watcher.join();
        let outs: Vec<Arc<Out>> = lock(&self.shared.state)
            .clients
            .values()
            .map(|c| Arc::clone(&c.out))
            .collect();
        for o in outs {
            let _ = o.stream.shutdown(std::net::Shutdown::Both);
        }
        let until = Instant::now() + Duration::from_secs(3);
        while self.shared.connections.load(Ordering::Acquire) > 0 && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = std::fs::remove_file(&self.shared.cfg.socket_path);
        tracing::info!("node stopped");
        Ok(())
    }

    /// Runs the node on a thread of its own (for tests and embedding).
    pub fn spawn(self) -> RunningNode {
        let handle = self.shutdown_handle();
        let path = self.socket_path().to_path_buf();
        let metrics_addr = self.metrics_addr();
        let thread = std::thread::Builder::new()
            .name("farmem-node".into())
            .spawn(move || self.run())
            .expect("starting the node thread");
        RunningNode {
            handle,
            path,
            metrics_addr,
            thread: Some(thread),
        }
    }

    /// Takes a new connection: bounded, identified, served on its own thread.
    fn admit(&self, stream: UnixStream) {
        let sh = &self.shared;
        let peer = match rustix::net::sockopt::socket_peercred(&stream) {
            Ok(c) => Peer {
                pid: rustix::process::Pid::as_raw(Some(c.pid)) as u32,
                uid: c.uid.as_raw(),
                gid: c.gid.as_raw(),
            },
            Err(e) => {
                tracing::warn!("refusing a connection whose peer is unknown (SO_PEERCRED: {e})");
                return;
            }
        };
        // Refused with one ERROR TooManyClients frame (the client says why) and a rate-limited
        // warn line naming the bound.
        let refuse = |message: String, why: std::fmt::Arguments<'_>| {
            let _ = stream.set_nonblocking(true);
            let frame = sh.error(0, ErrorCode::TooManyClients, message);
            let _ = rustix::net::send(&stream, &frame, SendFlags::NOSIGNAL);
            sh.warn(format_args!(
                "refused client pid {} uid {}: {why}",
                peer.pid, peer.uid
            ));
        };
        if sh.connections.load(Ordering::Acquire) >= sh.cfg.max_clients {
            let max = sh.cfg.max_clients;
            return refuse(
                format!("node full: it serves {max} clients, its limit; try again later"),
                format_args!("{max} clients connected already"),
            );
        }
        // A few connections are kept for root and the node's own user: four users at their
        // per-user bound filled the node, and root could not even ask it for its figures.
        let kept = trusted_reserve(sh.cfg.max_clients);
        if !sh.is_trusted(peer.uid) && sh.untrusted_connections() + kept >= sh.cfg.max_clients {
            let max = sh.cfg.max_clients - kept;
            return refuse(
                format!(
                    "node full: it serves {max} connections of users other than root and its \
                     own, its limit (--max-clients less {kept} kept for those); try again later"
                ),
                format_args!("{max} connections of other users already"),
            );
        }
        if !sh.admit_uid(peer.uid) {
            let max = sh.cfg.max_clients_per_uid;
            return refuse(
                format!(
                    "uid {} has {max} connections to this node, the most one user may have; \
                     close some or try again later",
                    peer.uid
                ),
                format_args!("that user has {max} connections already"),
            );
        }
        let out = match stream.try_clone() {
            Ok(s) => {
                let _ = s.set_write_timeout(Some(WRITE_TIMEOUT));
                Arc::new(Out {
                    stream: s,
                    lock: Mutex::new(()),
                })
            }
            Err(e) => {
                sh.leave_uid(peer.uid);
                sh.warn(format_args!(
                    "refusing a connection: cannot clone its socket: {e}"
                ));
                return;
            }
        };
        sh.connections.fetch_add(1, Ordering::AcqRel);
        let conn_sh = Arc::clone(sh);
        let spawned = std::thread::Builder::new()
            .name(format!("farmem-node-client-{}", peer.pid))
            .stack_size(256 << 10)
            .spawn(move || {
                Connection::new(conn_sh, stream, out, peer).serve();
            });
        if let Err(e) = spawned {
            sh.connections.fetch_sub(1, Ordering::AcqRel);
            sh.leave_uid(peer.uid);
            tracing::warn!("refusing a connection: cannot start its thread: {e}");
        }
    }
}

/// A node serving on its own thread; stopped by [`RunningNode::stop`] or on drop.
pub struct RunningNode {
    handle: ShutdownHandle,
    path: PathBuf,
    metrics_addr: Option<SocketAddr>,
    thread: Option<JoinHandle<Result<(), NodeServerError>>>,
}

impl RunningNode {
    /// The socket the node listens on.
    pub fn socket_path(&self) -> &Path {
        &self.path
    }

    /// The metrics endpoint's address, if any.
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics_addr
    }

    /// The node's figures now.
    pub fn stats(&self) -> NodeStats {
        self.handle.0.snapshot()
    }

    /// Stops the node and waits for it.
    pub fn stop(mut self) -> Result<(), NodeServerError> {
        self.finish()
    }

    fn finish(&mut self) -> Result<(), NodeServerError> {
        self.handle.shutdown();
        match self.thread.take() {
            Some(t) => t.join().unwrap_or(Ok(())),
            None => Ok(()),
        }
    }
}

impl Drop for RunningNode {
    fn drop(&mut self) {
        let _ = self.finish();
    }
}

/// Why a connection ends.
enum End {
    /// The client closed it or died.
    Gone,
    /// The client broke the protocol (the reason, for the warn line).
    Misbehaved(String),
    /// The node is stopping.
    Stopping,
}

/// One client's connection, served on its own thread.
struct Connection {
    sh: Arc<Shared>,
    id: u64,
    stream: UnixStream,
    out: Arc<Out>,
    peer: Peer,
}

impl Connection {
    fn new(sh: Arc<Shared>, stream: UnixStream, out: Arc<Out>, peer: Peer) -> Connection {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        let id = NEXT.fetch_add(1, Ordering::Relaxed);
        lock(&sh.state).clients.insert(
            id,
            Client {
                peer,
                out: Arc::clone(&out),
                welcomed: false,
                slabs: HashSet::new(),
                asked: 0,
                asked_at: None,
            },
        );
        Connection {
            sh,
            id,
            stream,
            out,
            peer,
        }
    }

    fn serve(self) {
        let end = self.read_loop();
        // A stopping node shuts every client's stream down, which its read sees as the client
        // gone: it is the node that goes.
        let end = if self.sh.stop.load(Ordering::Acquire) {
            End::Stopping
        } else {
            end
        };
        let (welcomed, slabs, kept) = {
            let mut st = lock(&self.sh.state);
            let client = st.clients.remove(&self.id);
            let welcomed = client.as_ref().is_some_and(|c| c.welcomed);
            let ids = client.map(|c| c.slabs).unwrap_or_default();
            let mut slabs = Vec::new();
            let mut kept = 0;
            for id in ids {
                if st.holds.is_held(id) {
                    // A forked child may still read it: kept until its holds die.
                    if let Some(s) = st.slabs.get_mut(&id) {
                        s.owner = None;
                        kept += 1;
                    }
                } else {
                    slabs.extend(st.slabs.remove(&id));
                }
            }
            (welcomed, slabs, kept)
        };
        let freed = slabs.len();
        if matches!(end, End::Stopping) {
            // The node stops, the client lives on: its slabs are not punched (it maps them and
            // reads its pages there; punched, a program stopped with its process group read
            // zeros). Closing the node's fds leaves the memory to the client's mappings, as
            // for kept slabs.
            drop(slabs);
        } else {
            self.sh.release(slabs);
        }
        // Its holds outlive it, but the unarmed ones (never mapped) die with it.
        self.sh.prune_holds();
        let Peer { pid, uid, gid } = self.peer;
        match end {
            End::Misbehaved(why) => {
                self.sh.warn(format_args!(
                    "disconnected client pid {pid} uid {uid}: {why}; {freed} slabs freed, {kept} kept for holds"
                ));
            }
            End::Gone | End::Stopping if welcomed => {
                tracing::info!(
                    pid,
                    uid,
                    gid,
                    slabs_freed = freed,
                    slabs_kept_for_holds = kept,
                    "client disconnected"
                );
            }
            End::Gone | End::Stopping => {}
        }
        let _ = self.stream.shutdown(std::net::Shutdown::Both);
        self.sh.connections.fetch_sub(1, Ordering::AcqRel);
        self.sh.leave_uid(self.peer.uid);
    }

    /// Reads and answers frames until the client goes away or misbehaves.
    fn read_loop(&self) -> End {
        let deadline = self.sh.cfg.frame_deadline;
        let mut buf: Vec<u8> = Vec::with_capacity(64);
        let mut chunk = [0u8; 512];
        let mut welcomed = false;
        // The HELLO is due within one deadline of the connection; later frames within one
        // deadline of their first byte.
        let mut due = Some(Instant::now() + deadline);
        loop {
            if self.sh.stop.load(Ordering::Acquire) {
                return End::Stopping;
            }
            loop {
                match decode_client_frame(&buf) {
                    Ok(Some((frame, used))) => {
                        buf.drain(..used);
                        if let Err(end) = self.answer(frame, &mut welcomed) {
                            return end;
                        }
                        due = (!buf.is_empty()).then(|| Instant::now() + deadline);
                    }
                    Ok(None) => break,
                    Err(e) => {
                        let _ = self.out.send(
                            &self
                                .sh
                                .error(0, ErrorCode::BadRequest, format!("bad frame: {e}")),
                            None,
                        );
                        return End::Misbehaved(format!("bad frame: {e}"));
                    }
                }
            }
            let timeout = match due {
                Some(t) => {
                    let left = t.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        self.sh.counters.refused(ErrorCode::BadRequest);
                        return End::Misbehaved(if welcomed {
                            format!("sent part of a frame, then nothing for {deadline:?}")
                        } else {
                            format!("no HELLO within {deadline:?}")
                        });
                    }
                    left.min(Duration::from_millis(500))
                }
                // Idle between frames: wake now and then only to notice a stop.
                None => Duration::from_millis(500),
            };
            let _ = self.stream.set_read_timeout(Some(timeout));
            match (&self.stream).read(&mut chunk) {
                Ok(0) => return End::Gone,
                Ok(n) => {
                    if buf.is_empty() && due.is_none() {
                        due = Some(Instant::now() + deadline);
                    }
                    buf.extend_from_slice(&chunk[..n]);
                }
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(_) => return End::Gone,
            }
        }
    }

    fn reply(&self, frame: Vec<u8>, fd: Option<&OwnedFd>) -> Result<(), End> {
        self.out.send(&frame, fd).map_err(|_| End::Gone)
    }

    fn answer(&self, frame: ClientFrame, welcomed: &mut bool) -> Result<(), End> {
        let sh = &self.sh;
        match frame {
            ClientFrame::Hello { version } if !*welcomed => {
                if version != PROTOCOL_VERSION {
                    let msg = format!(
                        "this node speaks protocol version {PROTOCOL_VERSION}, the client {version}: run the same farmem version on both sides"
                    );
                    let _ = self.reply(sh.error(0, ErrorCode::Version, msg.clone()), None);
                    return Err(End::Misbehaved(msg));
                }
                *welcomed = true;
                let capacity_bytes = {
                    let mut st = lock(&sh.state);
                    if let Some(c) = st.clients.get_mut(&self.id) {
                        c.welcomed = true;
                    }
                    st.capacity_bytes
                };
                let Peer { pid, uid, gid } = self.peer;
                tracing::info!(pid, uid, gid, "client connected");
                self.reply(
                    NodeFrame::Welcome {
                        version: PROTOCOL_VERSION,
                        slab_bytes: sh.cfg.slab_bytes,
                        capacity_bytes,
                        node_pid: sh.node_pid,
                    }
                    .encode(),
                    None,
                )
            }
            ClientFrame::Hello { .. } => Err(End::Misbehaved("sent HELLO twice".into())),
            _ if !*welcomed => Err(End::Misbehaved("sent a request before HELLO".into())),
            ClientFrame::Alloc { req } => self.alloc(req),
            ClientFrame::Free { req, slab } => self.free(req, slab),
            ClientFrame::Stats { req } => {
                let mut stats = sh.snapshot();
                // Other users' pids, uids and holdings are theirs: a user sees its own rows
                // and the node-wide totals; root and the node's own user see everything.
                if !sh.is_trusted(self.peer.uid) {
                    stats.clients.retain(|c| c.uid == self.peer.uid);
                }
                let json = serde_json::to_string(&stats).unwrap_or_default();
                self.reply(NodeFrame::StatsReply { req, json }.encode(), None)
            }
            ClientFrame::Resize {
                req,
                capacity_bytes,
            } => self.resize(req, capacity_bytes),
            ClientFrame::Hold { req, hold, slabs } => self.hold(req, hold, &slabs),
        }
    }

    fn alloc(&self, req: u32) -> Result<(), End> {
        let sh = &self.sh;
        let slab_bytes = sh.cfg.slab_bytes;
        let uid = self.peer.uid;
        // A refusal: its code, message, the figures of its frame, and whether users above
        // their share were asked for room.
        let refusal = {
            let mut st = lock(&sh.state);
            let figures = (st.used_bytes, st.capacity_bytes);
            if st.under_pressure {
                Some((
                    ErrorCode::Pressure,
                    format!(
                        "host memory is short (MemAvailable below --keep-free {} bytes): the node lends no new slabs now",
                        sh.cfg.keep_free_bytes.unwrap_or(0)
                    ),
                    figures,
                    false,
                ))
            } else if let Some((msg, user_figures)) = sh.share_refusal(&mut st, uid) {
                Some((ErrorCode::ShareUsed, msg, user_figures, false))
            } else if st.used_bytes + slab_bytes > st.capacity_bytes {
                // Below its fair share, the user wants memory: the users above theirs are
                // asked for room (after the reply), and its next ALLOC may succeed.
                let wanting = st.wanting.users();
                let active = st.active_users(&wanting, Some(uid)).len();
                let fair = fair_share_bytes(st.capacity_bytes, slab_bytes, active);
                let entitled = active > 1 && st.held_slabs(uid) * slab_bytes + slab_bytes <= fair;
                if entitled {
                    st.wanting.note(uid);
                }
                Some((
                    ErrorCode::Full,
                    format!(
                        "host tier full: {} of {} bytes in use{}",
                        st.used_bytes,
                        st.capacity_bytes,
                        if entitled {
                            format!(
                                "; users above their fair share ({fair} bytes) are asked to give \
                                 slabs back: try again shortly"
                            )
                        } else {
                            String::new()
                        }
                    ),
                    figures,
                    entitled,
                ))
            } else {
                st.used_bytes += slab_bytes;
                None
            }
        };
        if let Some((code, msg, figures, ask_back)) = refusal {
            self.reply(sh.error_with(req, code, figures, msg), None)?;
            if ask_back {
                sh.reclaim_excess();
            }
            return Ok(());
        }
        let fd = match slab::make(slab_bytes) {
            Ok(fd) => Arc::new(fd),
            Err(e) => {
                {
                    let mut st = lock(&sh.state);
                    st.used_bytes = st.used_bytes.saturating_sub(slab_bytes);
                }
                tracing::warn!("making a slab failed: {e}");
                let code = if e.is_out_of_memory() {
                    ErrorCode::Pressure
                } else {
                    ErrorCode::Internal
                };
                return self.reply(sh.error(req, code, format!("the node {e}")), None);
            }
        };
        let id = {
            let mut st = lock(&sh.state);
            let id = st.fresh_slab_id();
            st.slabs.insert(
                id,
                Slab {
                    owner: Some(self.id),
                    fd: Arc::clone(&fd),
                },
            );
            if let Some(c) = st.clients.get_mut(&self.id) {
                c.slabs.insert(id);
            }
            id
        };
        self.reply(
            NodeFrame::Slab {
                req,
                slab: id,
                len: slab_bytes,
            }
            .encode(),
            Some(&fd),
        )
    }

    fn free(&self, req: u32, slab_id: u32) -> Result<(), End> {
        let sh = &self.sh;
        /// What a FREE does to the slab.
        enum Freed {
            Released(Slab),
            /// A live hold names it: no one's now, released when its holds die.
            Kept,
            NotYours,
        }
        let freed = {
            let mut st = lock(&sh.state);
            if st
                .slabs
                .get(&slab_id)
                .is_some_and(|s| s.owner == Some(self.id))
            {
                if let Some(c) = st.clients.get_mut(&self.id) {
                    c.slabs.remove(&slab_id);
                    if c.asked > 0 {
                        c.asked -= 1;
                        sh.counters.slab_reclaimed();
                    }
                }
                if st.holds.is_held(slab_id) {
                    if let Some(s) = st.slabs.get_mut(&slab_id) {
                        s.owner = None;
                    }
                    Freed::Kept
                } else {
                    st.slabs
                        .remove(&slab_id)
                        .map_or(Freed::Kept, Freed::Released)
                }
            } else {
                Freed::NotYours
            }
        };
        match freed {
            Freed::Released(s) => {
                sh.release(vec![s]);
                self.reply(NodeFrame::Ok { req }.encode(), None)
            }
            Freed::Kept => {
                // Its holds may be dead already: then it goes back to the host now.
                sh.prune_holds();
                self.reply(NodeFrame::Ok { req }.encode(), None)
            }
            Freed::NotYours => self.reply(
                sh.error(
                    req,
                    ErrorCode::NotYours,
                    format!(
                        "slab {slab_id} is not yours: free only slabs this connection was given"
                    ),
                ),
                None,
            ),
        }
    }

    /// HOLD: a new hold over `slabs` (`hold_id` 0) or more slabs for one of this client's.
    fn hold(&self, req: u32, hold_id: u32, slabs: &[u32]) -> Result<(), End> {
        let sh = &self.sh;
        let refuse = |code, msg: String| self.reply(sh.error(req, code, msg), None);
        if slabs.is_empty() {
            return refuse(
                ErrorCode::BadRequest,
                "HOLD names no slab: name at least one slab to hold".into(),
            );
        }
        let mut seen = HashSet::with_capacity(slabs.len());
        if let Some(twice) = slabs.iter().find(|s| !seen.insert(**s)) {
            return refuse(
                ErrorCode::BadRequest,
                format!("HOLD names slab {twice} twice: name each slab once (nothing held)"),
            );
        }
        let not_mine = |st: &State| {
            slabs
                .iter()
                .find(|s| st.slabs.get(s).map(|x| x.owner) != Some(Some(self.id)))
                .map(|s| {
                    format!(
                        "slab {s} is not yours: hold only slabs this connection was given and has not freed (nothing held)"
                    )
                })
        };
        if hold_id != 0 {
            let outcome = {
                let mut st = lock(&sh.state);
                match not_mine(&st) {
                    Some(msg) => Err(msg),
                    None => st.holds.add(self.id, hold_id, slabs).map_err(|_| {
                        format!(
                            "hold {hold_id} is not yours (or is dead): add only to live holds this connection made (nothing held)"
                        )
                    }),
                }
            };
            return match outcome {
                Ok(()) => self.reply(NodeFrame::Ok { req }.encode(), None),
                Err(msg) => refuse(ErrorCode::NotYours, msg),
            };
        }
        // Checked before making a memfd for nothing (and again below, under the same lock as
        // the insert).
        let mine = not_mine(&lock(&sh.state));
        if let Some(msg) = mine {
            return refuse(ErrorCode::NotYours, msg);
        }
        // Each check takes the state lock and lets it go before anything else is done.
        let refusal = || sh.hold_refusal(&lock(&sh.state), self.id, self.peer.uid);
        if refusal().is_some() {
            // Dead holds may still be counted: probe before refusing (checked again below).
            sh.prune_holds();
        }
        if let Some(msg) = refusal() {
            return refuse(ErrorCode::BadRequest, msg);
        }
        let fd = match hold::make() {
            Ok(fd) => Arc::new(fd),
            Err(e) => {
                tracing::warn!("making a hold's memfd failed: {e}");
                return refuse(
                    ErrorCode::Internal,
                    format!("the node could not make a hold's memfd: {e}"),
                );
            }
        };
        let id = {
            let mut st = lock(&sh.state);
            if let Some(msg) = not_mine(&st) {
                return refuse(ErrorCode::NotYours, msg);
            }
            if let Some(msg) = sh.hold_refusal(&st, self.id, self.peer.uid) {
                // Another connection of the user took the last one meanwhile.
                drop(st);
                return refuse(ErrorCode::BadRequest, msg);
            }
            st.holds
                .create(self.id, self.peer.uid, Arc::clone(&fd), slabs)
        };
        self.reply(NodeFrame::Held { req, hold: id }.encode(), Some(&fd))
    }

    fn resize(&self, req: u32, capacity_bytes: u64) -> Result<(), End> {
        let sh = &self.sh;
        if self.peer.uid != 0 && self.peer.uid != sh.node_uid {
            let msg = format!(
                "only root or the node's own user (uid {}) may resize the node; uid {} may not",
                sh.node_uid, self.peer.uid
            );
            return self.reply(sh.error(req, ErrorCode::Denied, msg), None);
        }
        if let Some((limit, what)) = sh.memory_limit {
            if capacity_bytes > limit {
                let msg =
                    format!("capacity {capacity_bytes} bytes is more than {what} ({limit} bytes)");
                return self.reply(sh.error(req, ErrorCode::BadRequest, msg), None);
            }
        }
        let old = std::mem::replace(&mut lock(&sh.state).capacity_bytes, capacity_bytes);
        tracing::info!(
            pid = self.peer.pid,
            uid = self.peer.uid,
            old_bytes = old,
            new_bytes = capacity_bytes,
            "capacity changed"
        );
        self.reply(NodeFrame::Ok { req }.encode(), None)?;
        sh.reclaim_excess();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::{NodeClient, NodeClientConfig, NodeError};

    fn node(dir: &Path, capacity_bytes: u64) -> RunningNode {
        NodeServer::bind(NodeConfig {
            socket_path: dir.join("node.sock"),
            capacity_bytes,
            slab_bytes: 1 << 20,
            ..NodeConfig::default()
        })
        .unwrap()
        .spawn()
    }

    static AVAILABLE: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(u64::MAX);

    fn fake_available() -> Option<u64> {
        Some(AVAILABLE.load(Ordering::Relaxed))
    }

    #[test]
    fn below_keep_free_the_largest_users_are_asked_for_the_shortfall() {
        let dir = tempfile::tempdir().unwrap();
        let n = NodeServer::bind(NodeConfig {
            socket_path: dir.path().join("node.sock"),
            capacity_bytes: 16 << 20,
            slab_bytes: 1 << 20,
            keep_free_bytes: Some(100 << 20),
            watch_period: Duration::from_millis(20),
            mem_available: fake_available,
            ..NodeConfig::default()
        })
        .unwrap()
        .spawn();
        let big = NodeClient::connect(n.socket_path(), NodeClientConfig::default()).unwrap();
        let small = NodeClient::connect(n.socket_path(), NodeClientConfig::default()).unwrap();
        let a: Vec<_> = (0..3).map(|_| big.alloc_slab().unwrap()).collect();
        let b: Vec<_> = (0..2).map(|_| small.alloc_slab().unwrap()).collect();
        // 4.5 MiB short of the watermark: 5 slabs, more than the largest user holds, so the
        // next one is asked for the rest.
        AVAILABLE.store((100 << 20) - (9 << 19), Ordering::Relaxed);
        let first = big.reclaims().recv_timeout(Duration::from_secs(5)).unwrap();
        let second = small
            .reclaims()
            .recv_timeout(Duration::from_secs(5))
            .unwrap();
        assert_eq!((first.slabs, second.slabs), (3, 2));
        assert!(matches!(big.alloc_slab(), Err(NodeError::Pressure)));
        let s = n.stats();
        assert!(s.under_pressure);
        assert_eq!(s.reclaim_requests_total, 2);
        // Nobody is asked again while the asks are outstanding.
        std::thread::sleep(Duration::from_millis(200));
        assert!(big.reclaims().try_recv().is_err());
        AVAILABLE.store(u64::MAX, Ordering::Relaxed);
        let until = Instant::now() + Duration::from_secs(5);
        while n.stats().under_pressure && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(10));
        }
        let more = big.alloc_slab().unwrap();
        drop((a, b, more));
    }

    #[test]
    fn kept_slabs_are_never_asked_back_and_reclaim_does_not_stall_on_them() {
        let dir = tempfile::tempdir().unwrap();
        let n = NodeServer::bind(NodeConfig {
            socket_path: dir.path().join("node.sock"),
            capacity_bytes: 4 << 20,
            slab_bytes: 1 << 20,
            watch_period: Duration::from_millis(10),
            reclaim_patience: Duration::from_millis(50),
            ..NodeConfig::default()
        })
        .unwrap()
        .spawn();
        let c = NodeClient::connect(n.socket_path(), NodeClientConfig::default()).unwrap();
        let kept = c.alloc_slab().unwrap();
        let own = c.alloc_slab().unwrap();
        let mut hold = c.hold_slabs(&[kept.id]).unwrap();
        c.free_slab(kept.id).unwrap();
        // 2 slabs in use, capacity 0: the client is asked for the one it holds, never for the
        // kept one (no client's), however many rounds pass.
        c.resize(0).unwrap();
        let ask = c.reclaims().recv_timeout(Duration::from_secs(5)).unwrap();
        assert_eq!(ask.slabs, 1);
        let id = own.id;
        drop(own);
        c.free_slab(id).unwrap();
        std::thread::sleep(Duration::from_millis(300));
        let s = n.stats();
        assert_eq!((s.used_bytes, s.kept_slabs, s.holds), (1 << 20, 1, 1));
        assert_eq!(
            s.reclaim_requests_total, 1,
            "nobody holds what is left to ask for"
        );
        assert!(c.reclaims().try_recv().is_err());
        // The watcher kept running: the hold unmapped, the kept slab goes.
        hold.unmap();
        let until = Instant::now() + Duration::from_secs(10);
        while n.stats().used_bytes != 0 {
            assert!(Instant::now() < until, "{:?}", n.stats());
            std::thread::sleep(Duration::from_millis(10));
        }
        drop(kept);
    }

    #[test]
    fn a_client_beyond_the_bound_is_refused_clearly() {
        let dir = tempfile::tempdir().unwrap();
        let n = NodeServer::bind(NodeConfig {
            socket_path: dir.path().join("node.sock"),
            capacity_bytes: 4 << 20,
            slab_bytes: 1 << 20,
            max_clients: 2,
            ..NodeConfig::default()
        })
        .unwrap()
        .spawn();
        let _a = NodeClient::connect(n.socket_path(), NodeClientConfig::default()).unwrap();
        let _b = NodeClient::connect(n.socket_path(), NodeClientConfig::default()).unwrap();
        let e = NodeClient::connect(n.socket_path(), NodeClientConfig::default()).unwrap_err();
        assert!(
            matches!(e, NodeError::TooManyClients { ref message } if message.contains("node full")),
            "{e}"
        );
        assert_eq!(n.stats().refusals.too_many_clients, 1);
        drop(_a);
        let until = Instant::now() + Duration::from_secs(5);
        loop {
            match NodeClient::connect(n.socket_path(), NodeClientConfig::default()) {
                Ok(_) => break,
                Err(e) => assert!(Instant::now() < until, "{e}"),
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    #[test]
    fn slabs_are_lent_shared_capped_and_freed() {
        let dir = tempfile::tempdir().unwrap();
        let n = node(dir.path(), 2 << 20);
        let mode = std::fs::metadata(n.socket_path())
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o660);
        let c = NodeClient::connect(n.socket_path(), NodeClientConfig::default()).unwrap();
        assert_eq!(c.info().slab_bytes, 1 << 20);
        let a = c.alloc_slab().unwrap();
        let b = c.alloc_slab().unwrap();
        assert_ne!(a.id, b.id);
        let e = c.alloc_slab().unwrap_err();
        assert!(
            matches!(e, NodeError::Full { used_bytes, capacity_bytes } if used_bytes == 2 << 20 && capacity_bytes == 2 << 20),
            "{e}"
        );
        assert_eq!(n.stats().used_bytes, 2 << 20);
        assert!(matches!(
            c.free_slab(999),
            Err(NodeError::NotYours { slab: 999 })
        ));
        let id = a.id;
        drop(a);
        c.free_slab(id).unwrap();
        assert_eq!(c.stats().unwrap().used_bytes, 1 << 20);
        drop(b);
        drop(c);
        let until = Instant::now() + Duration::from_secs(5);
        while n.stats().used_bytes != 0 && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(n.stats().used_bytes, 0, "a closed client's slabs are freed");
        let path = n.socket_path().to_path_buf();
        n.stop().unwrap();
        assert!(!path.exists(), "the socket file is removed on stop");
    }
}
