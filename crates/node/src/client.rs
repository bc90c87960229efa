//! The client of a `farmem node`: what the runtime uses to get host-tier slabs.
//!
//! ```no_run
//! use farmem_node::{default_socket_path, NodeClient, NodeClientConfig};
//! let node = NodeClient::connect(&default_socket_path(), NodeClientConfig::default())?;
//! let slab = node.alloc_slab()?; // slab.mapping: MAP_SHARED, read-write, node.info().slab_bytes
//! // ... write pages into slab.mapping, read them back with one copy ...
//! let id = slab.id;
//! drop(slab.mapping);
//! node.free_slab(id)?;
//! # Ok::<(), farmem_node::NodeError>(())
//! ```
//!
//! # Design
//! - **Trust before use**: a node sees every page a client puts in the tier, so
//!   [`NodeClient::connect`] refuses ([`NodeError::Untrusted`], with the command that fixes it)
//!   a socket not owned by root or by this process's uid, one others may write (mode o+w), one
//!   in a folder others may write without the sticky bit, and a listener running as another
//!   uid (SO_PEERCRED). The peer must then answer HELLO with WELCOME.
//! - **One reader thread** (started with [`NodeClientConfig::thread_hook`] first, as the runtime
//!   marks its threads, and running before `connect` returns) matches replies to requests by
//!   `req` and forwards RECLAIM to [`NodeClient::reclaims`]. Requests are made from any thread
//!   (`&self`); each waits at most [`NodeClientConfig::timeout`]. A slab that arrives after its
//!   request gave up is given back.
//! - **The node going away**: pending and later requests fail with [`NodeError::Gone`] and
//!   [`NodeClient::is_alive`] turns false. Mapped slabs stay valid: the mapping keeps the memfd's
//!   pages alive after the node's fd and the client's fd are closed.
//! - Received fds are checked ([`crate::slab::check_received`]) before mapping: a memfd of
//!   exactly the announced size, sealed against shrinking (a shrink would make accesses SIGBUS).
//! - **Holds** ([`NodeClient::hold_slabs`], [`SlabHold`]): before forking, a runtime whose
//!   child will keep reading slabs asks the node to hold them; it gets a 4 KiB memfd, maps it
//!   `MAP_SHARED` read-write (not MADV_DONTFORK: the child must inherit it), arms it (a byte at
//!   offset 0) and confirms with one more request, so the node has seen the hold armed while
//!   this connection was up (an unarmed hold dies with its connection, see [`crate::hold`]).
//!   After fork the parent calls [`SlabHold::unmap`]; the node keeps the slabs (even FREEd, even
//!   after this client is gone) until no process maps the hold. [`SlabHold::is_alive`] probes
//!   it the node's way.
//! - Writes use `MSG_NOSIGNAL`: a client runs inside arbitrary programs, whose SIGPIPE
//!   disposition may be the default (death).
//!
//! # Limitations
//! One connection; no reconnect (a new node means new slabs: connect again). A HELD that
//! arrives after its request gave up, or fails its checks, is dropped unmapped: the node
//! counts that hold until this connection ends (then it dies, never having been armed).
//! A forked child inherits this connection's socket too (close-on-exec does not help without
//! exec): it must not use it, and should close it, or the node does not see the parent die
//! (and free its unheld slabs) until the child exits. Closing it is the runtime's fork code's
//! job, as is taking the hold before fork and unmapping it in the parent after.
use std::collections::{HashMap, VecDeque};
use std::io::IoSliceMut;
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};
use farmem_mm::Mapping;
use rustix::net::{recvmsg, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, ReturnFlags};

use crate::hold::{self, Liveness, HOLD_BYTES};
use crate::metrics::NodeStats;
use crate::slab;
use crate::wire::{
    decode_node_frame, ClientFrame, ErrorCode, NodeFrame, MAX_HOLD_SLABS, PROTOCOL_VERSION,
};

/// Where a host's node listens unless told otherwise.
pub const DEFAULT_SOCKET_PATH: &str = "/run/farmem/node.sock";

/// `/run/farmem/node.sock`.
pub fn default_socket_path() -> PathBuf {
    PathBuf::from(DEFAULT_SOCKET_PATH)
}

/// How a client runs.
#[derive(Clone)]
pub struct NodeClientConfig {
    /// Run first in every thread the client starts (the runtime marks its threads).
    pub thread_hook: Option<Arc<dyn Fn() + Send + Sync>>,
    /// Limit for each request (default 5 s).
    pub timeout: Duration,
}

impl Default for NodeClientConfig {
    fn default() -> Self {
        NodeClientConfig {
            thread_hook: None,
            timeout: Duration::from_secs(5),
        }
    }
}

impl std::fmt::Debug for NodeClientConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeClientConfig")
            .field("thread_hook", &self.thread_hook.as_ref().map(|_| "Fn"))
            .field("timeout", &self.timeout)
            .finish()
    }
}

/// What the node said in WELCOME.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NodeInfo {
    /// Size of every slab.
    pub slab_bytes: u64,
    /// The node's capacity when this client connected.
    pub capacity_bytes: u64,
    /// The node's process id (in its own pid namespace).
    pub node_pid: u32,
}

/// A slab of the host tier: a `MAP_SHARED` read-write mapping of the node's memfd (the fd is
/// closed once mapped). Drop the mapping before [`NodeClient::free_slab`].
#[derive(Debug)]
pub struct TierSlab {
    /// The node's id for the slab (for FREE).
    pub id: u32,
    /// The slab's memory.
    pub mapping: Mapping,
}

/// A hold over some of this client's slabs (see the module docs): while any process maps its
/// memfd, the node punches none of them, even after FREE or this client's exit.
#[derive(Debug)]
pub struct SlabHold {
    /// The node's id for the hold.
    pub id: u32,
    fd: OwnedFd,
    mapping: Option<Mapping>,
}

impl SlabHold {
    /// Drops this process's mapping of the hold (the parent, right after fork). The hold then
    /// lives as long as a child (or its descendants, until they exec) maps it.
    pub fn unmap(&mut self) {
        self.mapping = None;
    }

    /// True while this process maps the hold.
    pub fn is_mapped(&self) -> bool {
        self.mapping.is_some()
    }

    /// The hold's memfd (close-on-exec).
    pub fn fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// True while any process maps the hold: `F_ADD_SEALS(F_SEAL_WRITE)` fails with EBUSY.
    /// Once false it stays false (the probe sealed the memfd). A probe that fails otherwise
    /// counts as alive (the safe answer) and is logged.
    pub fn is_alive(&self) -> bool {
        match hold::probe(&self.fd) {
            (Liveness::Dead, _) => false,
            (Liveness::Alive, None) => true,
            (Liveness::Alive, Some(e)) => {
                tracing::warn!(
                    hold = self.id,
                    "cannot probe a slab hold ({e}); taking it as alive"
                );
                true
            }
        }
    }
}

/// The node asks for slabs back: free this many (the least recently written).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reclaim {
    /// How many slabs to give back.
    pub slabs: u32,
}

/// A client call failed.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    /// Nothing answers on the socket, or this user may not use it (the message tells which).
    #[error("{}", connect_message(path, source))]
    Connect {
        path: PathBuf,
        source: std::io::Error,
    },
    /// The socket, its folder or the process behind it is not trusted with this program's pages.
    #[error("not using the farmem node socket {}: {reason}", path.display())]
    Untrusted { path: PathBuf, reason: String },
    /// The host tier is full.
    #[error("host tier full: {used_bytes} of {capacity_bytes} bytes in use; pages must go elsewhere (a remote donor) or the node needs a larger --capacity")]
    Full {
        used_bytes: u64,
        capacity_bytes: u64,
    },
    /// This user holds its share of the node (others want memory too, or the node's
    /// `--max-share-per-uid`): the node lends it no more now.
    #[error("the farmem node lends uid {uid} no more slabs: it holds {held_bytes} bytes, its share is {share_bytes} bytes ({message}); pages must go elsewhere")]
    ShareUsed {
        uid: u32,
        held_bytes: u64,
        share_bytes: u64,
        message: String,
    },
    /// The host is short of memory: the node lends no new slabs now.
    #[error("the farmem node lends no new slabs while the host is short of memory (below its --keep-free); pages must go elsewhere")]
    Pressure,
    /// FREE of a slab this client does not hold.
    #[error("slab {slab} is not held by this client; nothing was freed")]
    NotYours { slab: u32 },
    /// HOLD naming a slab this client does not hold, or adding to a hold it did not make.
    #[error("the farmem node refused the hold: {message}")]
    HoldNotYours { message: String },
    /// The node refused a control request from this user.
    #[error("the farmem node refused: {message}")]
    Denied { message: String },
    /// The node serves as many connections as it may (in all, or of this user) and refused
    /// this one; the program may do without the host tier.
    #[error("the farmem node refused the connection: {message}")]
    TooManyClients { message: String },
    /// The node refused for another reason (its words).
    #[error("the farmem node refused: {message}")]
    Refused { message: String },
    /// The node closed the connection or died; slabs already mapped stay valid.
    #[error("the farmem node went away (stopped or died); slabs already mapped stay valid, new ones must go elsewhere; restart the node and connect again")]
    Gone,
    /// The peer broke the protocol (or is not a farmem node).
    #[error("farmem node protocol error: {0}")]
    Protocol(String),
    /// A system call failed.
    #[error("farmem node client: {0}")]
    Io(#[from] std::io::Error),
    /// The node did not answer in time.
    #[error("the farmem node did not answer in time (is it overloaded or stuck?)")]
    Timeout,
}

impl NodeError {
    /// True when the tier has no room for this client now ([`NodeError::Full`],
    /// [`NodeError::ShareUsed`] or [`NodeError::Pressure`]): the caller should put pages
    /// elsewhere.
    pub fn is_full(&self) -> bool {
        matches!(
            self,
            NodeError::Full { .. } | NodeError::ShareUsed { .. } | NodeError::Pressure
        )
    }

    /// True when the node could not take this client now ([`NodeError::TooManyClients`]) or
    /// did not answer in time ([`NodeError::Timeout`]): a program does without that node
    /// rather than fail (one user's idle connections, or a stuck node, must not stop
    /// everyone's programs).
    pub fn is_busy(&self) -> bool {
        matches!(self, NodeError::TooManyClients { .. } | NodeError::Timeout)
    }
}

/// Tells "a node runs there but this user may not use it" (its socket's mode, owner and
/// group, and the fix) from "no node runs there" (how to start one) from anything else.
fn connect_message(path: &Path, source: &std::io::Error) -> String {
    use std::io::ErrorKind;
    let shown = path.display();
    match source.kind() {
        ErrorKind::PermissionDenied => {
            let who = rustix::process::getuid().as_raw();
            let socket = std::fs::metadata(path)
                .map(|m| {
                    format!(
                        " (socket mode {:04o}, owner uid {}, group gid {})",
                        m.mode() & 0o7777,
                        m.uid(),
                        m.gid()
                    )
                })
                .unwrap_or_default();
            format!(
                "a farmem node runs at {shown} but this user (uid {who}) may not use it{socket}: \
                 {source}; ask its operator to add this user to the socket's group (`farmem node \
                 --socket-group GROUP`), or use a node of your own (--node PATH)"
            )
        }
        ErrorKind::NotFound | ErrorKind::ConnectionRefused => format!(
            "no farmem node runs at {shown} ({source}); start one (`farmem node --capacity SIZE \
             --socket {shown}`) or name another socket"
        ),
        _ => format!("cannot connect to the farmem node at {shown}: {source}"),
    }
}

/// Checks that `path` may be trusted with this program's pages (see the module docs).
pub fn check_socket_trust(path: &Path) -> Result<(), NodeError> {
    let untrusted = |reason: String| NodeError::Untrusted {
        path: path.to_path_buf(),
        reason,
    };
    let real = std::fs::canonicalize(path).map_err(|source| NodeError::Connect {
        path: path.to_path_buf(),
        source,
    })?;
    let meta = std::fs::metadata(&real).map_err(|source| NodeError::Connect {
        path: path.to_path_buf(),
        source,
    })?;
    let me = rustix::process::getuid().as_raw();
    let shown = real.display();
    if !meta.file_type().is_socket() {
        return Err(untrusted(format!("{shown} is not a socket")));
    }
    if meta.uid() != 0 && meta.uid() != me {
        return Err(untrusted(format!(
            "{shown} is owned by uid {}, neither root nor this user (uid {me}); if that user's node is \
             the one to use, run `chown root {shown}` as root, else start your own node",
            meta.uid()
        )));
    }
    let mode = meta.mode() & 0o7777;
    if mode & 0o002 != 0 {
        return Err(untrusted(format!(
            "any user may write to {shown} (mode {mode:04o}), so any process could pose as the \
             node's clients; run `chmod o-w {shown}` (the node makes it 0660)"
        )));
    }
    if let Some(dir) = real.parent() {
        let d = std::fs::metadata(dir).map_err(|source| NodeError::Connect {
            path: path.to_path_buf(),
            source,
        })?;
        let dmode = d.mode() & 0o7777;
        if dmode & 0o002 != 0 && dmode & 0o1000 == 0 {
            return Err(untrusted(format!(
                "any user may replace the socket in {} (mode {dmode:04o}, no sticky bit); run \
                 `chmod o-w {}` (or `chmod +t {}`)",
                dir.display(),
                dir.display(),
                dir.display()
            )));
        }
    }
    Ok(())
}

/// A reply to one request.
enum Reply {
    Slab {
        slab: u32,
        len: u64,
        fd: Option<OwnedFd>,
    },
    Held {
        hold: u32,
        fd: Option<OwnedFd>,
    },
    Ok,
    Error {
        code: ErrorCode,
        used_bytes: u64,
        capacity_bytes: u64,
        message: String,
    },
    Stats(String),
}

/// Requests waiting for their reply; closed once the reader ends.
struct Pending {
    open: bool,
    waiting: HashMap<u32, Sender<Reply>>,
}

struct Inner {
    stream: UnixStream,
    write: Mutex<()>,
    pending: Mutex<Pending>,
    alive: AtomicBool,
    next_req: AtomicU32,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Inner {
    fn send(&self, frame: &ClientFrame) -> Result<(), NodeError> {
        let bytes = frame.encode();
        let _whole = lock(&self.write);
        let mut sent = 0;
        while sent < bytes.len() {
            match rustix::net::send(
                &self.stream,
                &bytes[sent..],
                rustix::net::SendFlags::NOSIGNAL,
            ) {
                Ok(n) => sent += n,
                Err(rustix::io::Errno::INTR) => {}
                Err(rustix::io::Errno::AGAIN) => {
                    // A half-written frame cannot be taken back: the connection is unusable.
                    if sent > 0 {
                        let _ = self.stream.shutdown(std::net::Shutdown::Both);
                    }
                    return Err(NodeError::Timeout);
                }
                Err(_) => return Err(NodeError::Gone),
            }
        }
        Ok(())
    }

    /// Ends the connection: later and pending requests fail with `Gone`.
    fn close(&self) {
        self.alive.store(false, Ordering::Release);
        let mut p = lock(&self.pending);
        p.open = false;
        p.waiting.clear();
    }
}

/// Reads node frames and the fds that come with them.
struct FrameReader {
    stream: UnixStream,
    buf: Vec<u8>,
    fds: VecDeque<OwnedFd>,
}

/// Why reading stopped.
enum ReadEnd {
    Eof,
    TimedOut,
    Failed(NodeError),
}

impl FrameReader {
    fn next(&mut self) -> Result<(NodeFrame, Option<OwnedFd>), ReadEnd> {
        loop {
            match decode_node_frame(&self.buf) {
                Ok(Some((frame, used))) => {
                    self.buf.drain(..used);
                    // The fd was sent with the frame's first byte, so it has arrived.
                    let fd = match frame {
                        NodeFrame::Slab { .. } | NodeFrame::Held { .. } => self.fds.pop_front(),
                        _ => None,
                    };
                    return Ok((frame, fd));
                }
                Ok(None) => {}
                Err(e) => return Err(ReadEnd::Failed(NodeError::Protocol(e.to_string()))),
            }
            let mut chunk = [0u8; 4096];
            let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(8))];
            let mut control = RecvAncillaryBuffer::new(&mut space);
            let got = match recvmsg(
                &self.stream,
                &mut [IoSliceMut::new(&mut chunk)],
                &mut control,
                RecvFlags::CMSG_CLOEXEC,
            ) {
                Ok(m) => m,
                Err(rustix::io::Errno::INTR) => continue,
                Err(rustix::io::Errno::AGAIN) => return Err(ReadEnd::TimedOut),
                Err(rustix::io::Errno::CONNRESET) => return Err(ReadEnd::Eof),
                Err(e) => return Err(ReadEnd::Failed(NodeError::Io(e.into()))),
            };
            for msg in control.drain() {
                if let RecvAncillaryMessage::ScmRights(fds) = msg {
                    self.fds.extend(fds);
                }
            }
            if got.flags.contains(ReturnFlags::CTRUNC) {
                return Err(ReadEnd::Failed(NodeError::Protocol(
                    "the node sent more file descriptors than expected".into(),
                )));
            }
            if got.bytes == 0 {
                return Err(ReadEnd::Eof);
            }
            self.buf.extend_from_slice(&chunk[..got.bytes]);
        }
    }
}

/// A connection to a `farmem node` (see the module docs).
pub struct NodeClient {
    inner: Arc<Inner>,
    info: NodeInfo,
    reclaims: Receiver<Reclaim>,
    timeout: Duration,
    reader: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for NodeClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeClient")
            .field("info", &self.info)
            .field("alive", &self.is_alive())
            .finish()
    }
}

impl NodeClient {
    /// Checks the socket at `path` (see the module docs), connects, and checks that a farmem
    /// node answers (HELLO → WELCOME) within `cfg.timeout`.
    pub fn connect(path: &Path, cfg: NodeClientConfig) -> Result<NodeClient, NodeError> {
        check_socket_trust(path)?;
        let stream = UnixStream::connect(path)
            .map(farmem_fds::protect)
            .map_err(|source| NodeError::Connect {
                path: path.to_path_buf(),
                source,
            })?;
        let cred =
            rustix::net::sockopt::socket_peercred(&stream).map_err(|e| NodeError::Io(e.into()))?;
        let me = rustix::process::getuid().as_raw();
        if cred.uid.as_raw() != 0 && cred.uid.as_raw() != me {
            return Err(NodeError::Untrusted {
                path: path.to_path_buf(),
                reason: format!(
                    "the process listening on it runs as uid {}, neither root nor this user (uid {me})",
                    cred.uid.as_raw()
                ),
            });
        }
        let timeout = cfg.timeout.max(Duration::from_millis(1));
        stream.set_read_timeout(Some(timeout))?;
        stream.set_write_timeout(Some(timeout))?;
        let inner = Arc::new(Inner {
            stream,
            write: Mutex::new(()),
            pending: Mutex::new(Pending {
                open: true,
                waiting: HashMap::new(),
            }),
            alive: AtomicBool::new(true),
            next_req: AtomicU32::new(1),
        });
        // A node that refuses the connection (too many clients) may have answered and closed
        // before HELLO is sent: its answer is still worth reading.
        let hello = inner.send(&ClientFrame::Hello {
            version: PROTOCOL_VERSION,
        });
        let mut reader = FrameReader {
            stream: farmem_fds::protect(inner.stream.try_clone()?),
            buf: Vec::new(),
            fds: VecDeque::new(),
        };
        let not_a_node = |why: String| {
            NodeError::Protocol(format!(
                "{} did not answer as a farmem node: {why}",
                path.display()
            ))
        };
        let info = match reader.next() {
            Ok((
                NodeFrame::Welcome {
                    version,
                    slab_bytes,
                    capacity_bytes,
                    node_pid,
                },
                _,
            )) => {
                if version != PROTOCOL_VERSION {
                    return Err(not_a_node(format!(
                        "it speaks protocol version {version}, this client {PROTOCOL_VERSION}"
                    )));
                }
                if slab_bytes == 0
                    || !slab_bytes.is_multiple_of(farmem_mm::PAGE_SIZE as u64)
                    || usize::try_from(slab_bytes).is_err()
                {
                    return Err(not_a_node(format!("a slab size of {slab_bytes} bytes")));
                }
                NodeInfo {
                    slab_bytes,
                    capacity_bytes,
                    node_pid,
                }
            }
            Ok((
                NodeFrame::Error {
                    code: ErrorCode::TooManyClients,
                    message,
                    ..
                },
                _,
            )) => return Err(NodeError::TooManyClients { message }),
            Ok((NodeFrame::Error { message, .. }, _)) => {
                return Err(NodeError::Refused { message })
            }
            _ if hello.is_err() => return Err(hello.err().unwrap_or(NodeError::Gone)),
            Ok((other, _)) => return Err(not_a_node(format!("{other:?} instead of WELCOME"))),
            Err(ReadEnd::Eof) => return Err(not_a_node("it closed the connection".into())),
            Err(ReadEnd::TimedOut) => return Err(NodeError::Timeout),
            Err(ReadEnd::Failed(e)) => return Err(not_a_node(e.to_string())),
        };
        reader.stream.set_read_timeout(None)?;
        let (tx, reclaims) = crossbeam_channel::unbounded();
        let hook = cfg.thread_hook.clone();
        let shared = Arc::clone(&inner);
        let (started_tx, started) = crossbeam_channel::bounded::<()>(1);
        let thread = std::thread::Builder::new()
            .name("farmem-node-reader".into())
            .spawn(move || {
                if let Some(h) = hook {
                    h();
                }
                drop(started_tx);
                read_replies(&shared, reader, &tx);
            })?;
        // Started before this returns: every fetch waits on this thread, so it must be past
        // its start (where the thread library reads program data) before the caller makes
        // regions that could fault there.
        let _ = started.recv();
        Ok(NodeClient {
            inner,
            info,
            reclaims,
            timeout,
            reader: Some(thread),
        })
    }

    /// What the node said when this client connected.
    pub fn info(&self) -> NodeInfo {
        self.info
    }

    /// The connection's socket descriptor: a forked child closes its copy (otherwise the node
    /// sees this client's end only when the child exits too), never using it.
    pub fn socket_fd(&self) -> std::os::fd::RawFd {
        use std::os::fd::AsRawFd;
        self.inner.stream.as_raw_fd()
    }

    /// False once the node closed the connection or died.
    pub fn is_alive(&self) -> bool {
        self.inner.alive.load(Ordering::Acquire)
    }

    /// RECLAIM requests from the node: give back that many slabs (least recently written).
    pub fn reclaims(&self) -> &Receiver<Reclaim> {
        &self.reclaims
    }

    /// Sends `frame` (built with a fresh request id) and waits for its reply.
    fn request(&self, frame: impl FnOnce(u32) -> ClientFrame) -> Result<Reply, NodeError> {
        if !self.is_alive() {
            return Err(NodeError::Gone);
        }
        let req = loop {
            let r = self.inner.next_req.fetch_add(1, Ordering::Relaxed);
            if r != 0 {
                break r;
            }
        };
        let (tx, rx) = crossbeam_channel::bounded(1);
        {
            let mut p = lock(&self.inner.pending);
            if !p.open {
                return Err(NodeError::Gone);
            }
            p.waiting.insert(req, tx);
        }
        let forget = || {
            lock(&self.inner.pending).waiting.remove(&req);
        };
        if let Err(e) = self.inner.send(&frame(req)) {
            forget();
            return Err(e);
        }
        match rx.recv_timeout(self.timeout) {
            Ok(r) => Ok(r),
            Err(RecvTimeoutError::Timeout) => {
                forget();
                Err(NodeError::Timeout)
            }
            Err(RecvTimeoutError::Disconnected) => Err(NodeError::Gone),
        }
    }

    /// A new slab of [`NodeInfo::slab_bytes`], mapped shared and read-write. Thread-safe.
    pub fn alloc_slab(&self) -> Result<TierSlab, NodeError> {
        match self.request(|req| ClientFrame::Alloc { req })? {
            Reply::Slab { slab, len, fd } => {
                let mapped = map_slab(fd, len, self.info.slab_bytes);
                if mapped.is_err() {
                    // Not usable here: give it back rather than hold it until disconnect.
                    let _ = self.inner.send(&ClientFrame::Free { req: 0, slab });
                }
                Ok(TierSlab {
                    id: slab,
                    mapping: mapped?,
                })
            }
            other => Err(refusal(other, None)),
        }
    }

    /// Gives slab `id` back (drop its mapping first: the node punches a hole in it).
    pub fn free_slab(&self, id: u32) -> Result<(), NodeError> {
        match self.request(|req| ClientFrame::Free { req, slab: id })? {
            Reply::Ok => Ok(()),
            other => Err(refusal(other, Some(id))),
        }
    }

    /// The node's figures.
    pub fn stats(&self) -> Result<NodeStats, NodeError> {
        match self.request(|req| ClientFrame::Stats { req })? {
            Reply::Stats(json) => serde_json::from_str(&json)
                .map_err(|e| NodeError::Protocol(format!("unreadable STATS reply: {e}"))),
            other => Err(refusal(other, None)),
        }
    }

    /// A hold over `slabs` (this client's, not freed; repeats are ignored), mapped and armed:
    /// call [`SlabHold::unmap`] in the parent after fork. A list longer than one HOLD frame
    /// carries ([`MAX_HOLD_SLABS`]) is sent in several (the first makes the hold, the others add
    /// to it). Thread-safe.
    ///
    /// Errors: [`NodeError::HoldNotYours`] (nothing held), [`NodeError::Refused`] for an empty
    /// list or too many live holds, [`NodeError::Protocol`] for a malformed HELD.
    pub fn hold_slabs(&self, slabs: &[u32]) -> Result<SlabHold, NodeError> {
        let mut ids = slabs.to_vec();
        ids.sort_unstable();
        ids.dedup();
        let mut chunks = ids.chunks(MAX_HOLD_SLABS);
        let first = chunks.next().unwrap_or(&[]);
        let (id, fd) = match self.request(|req| ClientFrame::Hold {
            req,
            hold: 0,
            slabs: first.to_vec(),
        })? {
            Reply::Held { hold, fd } => (hold, fd),
            other => return Err(hold_refusal(other)),
        };
        let fd =
            fd.ok_or_else(|| NodeError::Protocol("a HELD reply came without its memfd".into()))?;
        if id == 0 {
            return Err(NodeError::Protocol("a HELD reply naming hold 0".into()));
        }
        hold::check_received(&fd).map_err(NodeError::Protocol)?;
        let mapping = Mapping::shared(fd.as_fd(), 0, HOLD_BYTES as usize)?;
        hold::arm(&fd).map_err(|e| NodeError::Io(e.into()))?;
        let held = SlabHold {
            id,
            fd,
            mapping: Some(mapping),
        };
        // The rest of the list; with none, the first slab again: either way one more request
        // answered on this connection after the arm (see the module docs).
        let rest: Vec<&[u32]> = chunks.collect();
        let confirm = [first.first().copied().unwrap_or(0)];
        let adds = if rest.is_empty() {
            vec![&confirm[..]]
        } else {
            rest
        };
        for chunk in adds {
            match self.request(|req| ClientFrame::Hold {
                req,
                hold: id,
                slabs: chunk.to_vec(),
            })? {
                Reply::Ok => {}
                other => return Err(hold_refusal(other)),
            }
        }
        Ok(held)
    }

    /// Changes the node's capacity (root or the node's own uid only). Below what is in use, the
    /// node asks its clients for the excess and lends nothing until under it.
    pub fn resize(&self, capacity_bytes: u64) -> Result<(), NodeError> {
        match self.request(|req| ClientFrame::Resize {
            req,
            capacity_bytes,
        })? {
            Reply::Ok => Ok(()),
            other => Err(refusal(other, None)),
        }
    }
}

impl Drop for NodeClient {
    fn drop(&mut self) {
        // The reader sees the end of the stream and exits; the node frees our slabs.
        let _ = self.inner.stream.shutdown(std::net::Shutdown::Both);
        if let Some(t) = self.reader.take() {
            let _ = t.join();
        }
    }
}

/// Maps a received slab after checking its fd; the fd is closed on return.
fn map_slab(fd: Option<OwnedFd>, len: u64, slab_bytes: u64) -> Result<Mapping, NodeError> {
    let fd = fd.ok_or_else(|| NodeError::Protocol("a SLAB reply came without its memfd".into()))?;
    if len != slab_bytes {
        return Err(NodeError::Protocol(format!(
            "a slab of {len} bytes, not the {slab_bytes} announced"
        )));
    }
    slab::check_received(&fd, len).map_err(NodeError::Protocol)?;
    let len =
        usize::try_from(len).map_err(|_| NodeError::Protocol(format!("a slab of {len} bytes")))?;
    Ok(Mapping::shared(fd.as_fd(), 0, len)?)
}

/// The error for a reply that is not the success the request expected.
fn refusal(reply: Reply, slab: Option<u32>) -> NodeError {
    match reply {
        Reply::Error {
            code,
            used_bytes,
            capacity_bytes,
            message,
        } => match code {
            ErrorCode::Full => NodeError::Full {
                used_bytes,
                capacity_bytes,
            },
            ErrorCode::Pressure => NodeError::Pressure,
            ErrorCode::ShareUsed => NodeError::ShareUsed {
                // SO_PEERCRED: the node counted this process's own uid.
                uid: rustix::process::getuid().as_raw(),
                held_bytes: used_bytes,
                share_bytes: capacity_bytes,
                message,
            },
            ErrorCode::NotYours => NodeError::NotYours {
                slab: slab.unwrap_or(0),
            },
            ErrorCode::Denied => NodeError::Denied { message },
            _ => NodeError::Refused { message },
        },
        Reply::Slab { .. } => NodeError::Protocol("an unexpected SLAB reply".into()),
        Reply::Held { .. } => NodeError::Protocol("an unexpected HELD reply".into()),
        Reply::Ok => NodeError::Protocol("an unexpected OK reply".into()),
        Reply::Stats(_) => NodeError::Protocol("an unexpected STATS reply".into()),
    }
}

/// The error for a reply to HOLD that is not the success it expected.
fn hold_refusal(reply: Reply) -> NodeError {
    match reply {
        Reply::Error {
            code: ErrorCode::NotYours,
            message,
            ..
        } => NodeError::HoldNotYours { message },
        other => refusal(other, None),
    }
}

/// The reader thread: replies to their requests, RECLAIM to the channel, until the end.
fn read_replies(inner: &Inner, mut reader: FrameReader, reclaims: &Sender<Reclaim>) {
    loop {
        let (frame, fd) = match reader.next() {
            Ok(f) => f,
            Err(ReadEnd::Eof) => break,
            Err(ReadEnd::TimedOut) => continue,
            Err(ReadEnd::Failed(e)) => {
                tracing::warn!("farmem node connection ends: {e}");
                break;
            }
        };
        let (req, reply) = match frame {
            NodeFrame::Reclaim { slabs } => {
                let _ = reclaims.send(Reclaim { slabs });
                continue;
            }
            NodeFrame::Slab { req, slab, len } => (req, Reply::Slab { slab, len, fd }),
            NodeFrame::Held { req, hold } => (req, Reply::Held { hold, fd }),
            NodeFrame::Ok { req } => (req, Reply::Ok),
            NodeFrame::StatsReply { req, json } => (req, Reply::Stats(json)),
            NodeFrame::Error {
                req,
                code,
                used_bytes,
                capacity_bytes,
                message,
            } => {
                if req == 0 {
                    tracing::warn!("the farmem node reports: {message}");
                    continue;
                }
                (
                    req,
                    Reply::Error {
                        code,
                        used_bytes,
                        capacity_bytes,
                        message,
                    },
                )
            }
            NodeFrame::Welcome { .. } => {
                tracing::warn!("farmem node connection ends: a second WELCOME");
                break;
            }
        };
        let waiter = lock(&inner.pending).waiting.remove(&req);
        match (waiter, reply) {
            (Some(tx), reply) => {
                let _ = tx.send(reply);
            }
            // A slab whose request gave up (timeout): give it back.
            (None, Reply::Slab { slab, .. }) => {
                let _ = inner.send(&ClientFrame::Free { req: 0, slab });
            }
            (None, _) => {}
        }
    }
    inner.close();
    let _ = reader.stream.shutdown(std::net::Shutdown::Both);
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn full_and_pressure_are_full() {
        assert!(NodeError::Full {
            used_bytes: 1,
            capacity_bytes: 1
        }
        .is_full());
        assert!(NodeError::Pressure.is_full());
        assert!(!NodeError::Gone.is_full());
        let e = NodeError::Full {
            used_bytes: 8,
            capacity_bytes: 8,
        };
        assert!(e
            .to_string()
            .contains("host tier full: 8 of 8 bytes in use"));
    }

    /// A fake node: WELCOME, then one HELD per HOLD, carrying each of `fds` in turn (or none).
    fn fake_node(path: &Path, fds: Vec<Option<OwnedFd>>) -> JoinHandle<()> {
        use rustix::net::{sendmsg, SendAncillaryBuffer, SendAncillaryMessage, SendFlags};
        use std::io::{Read, Write};
        let listener = std::os::unix::net::UnixListener::bind(path).unwrap();
        std::thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            let frame = |s: &mut UnixStream| {
                let mut head = [0u8; 5];
                s.read_exact(&mut head).ok()?;
                let mut payload =
                    vec![0; u32::from_le_bytes(head[..4].try_into().unwrap()) as usize];
                s.read_exact(&mut payload).ok()?;
                Some(payload)
            };
            frame(&mut s).unwrap();
            let welcome = NodeFrame::Welcome {
                version: PROTOCOL_VERSION,
                slab_bytes: 4096,
                capacity_bytes: 4096,
                node_pid: 1,
            };
            s.write_all(&welcome.encode()).unwrap();
            for fd in fds {
                let Some(payload) = frame(&mut s) else { return };
                let req = u32::from_le_bytes(payload[..4].try_into().unwrap());
                let held = NodeFrame::Held { req, hold: 9 }.encode();
                let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
                let mut control = SendAncillaryBuffer::new(&mut space);
                let one;
                if let Some(fd) = &fd {
                    one = [fd.as_fd()];
                    assert!(control.push(SendAncillaryMessage::ScmRights(&one)));
                }
                sendmsg(
                    &s,
                    &[std::io::IoSlice::new(&held)],
                    &mut control,
                    SendFlags::NOSIGNAL,
                )
                .unwrap();
            }
            let _ = frame(&mut s);
        })
    }

    #[test]
    fn a_malformed_held_is_a_protocol_error() {
        use rustix::fs::{fcntl_add_seals, ftruncate, memfd_create, MemfdFlags, SealFlags};
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("fake.sock");
        let memfd = |len: u64, seals: SealFlags| {
            let fd = memfd_create("t", MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING).unwrap();
            ftruncate(&fd, len).unwrap();
            fcntl_add_seals(&fd, seals).unwrap();
            Some(fd)
        };
        let sized = SealFlags::GROW | SealFlags::SHRINK;
        let node = fake_node(
            &path,
            vec![
                None,
                memfd(8192, sized),
                memfd(4096, SealFlags::GROW),
                memfd(4096, sized | SealFlags::SEAL),
            ],
        );
        let c = NodeClient::connect(&path, NodeClientConfig::default()).unwrap();
        for why in [
            "without its memfd",
            "not the 4096",
            "shrinking",
            "cannot hold",
        ] {
            let e = c.hold_slabs(&[1]).unwrap_err();
            assert!(
                matches!(&e, NodeError::Protocol(m) if m.contains(why)),
                "{why}: {e}"
            );
        }
        drop(c);
        node.join().unwrap();
    }

    #[test]
    fn a_world_writable_socket_or_folder_is_untrusted() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.sock");
        let _l = std::os::unix::net::UnixListener::bind(&path).unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o660)).unwrap();
        check_socket_trust(&path).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666)).unwrap();
        let e = check_socket_trust(&path).unwrap_err();
        assert!(matches!(e, NodeError::Untrusted { .. }), "{e}");
        assert!(e.to_string().contains("chmod o-w"), "{e}");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o660)).unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
        let e = check_socket_trust(&path).unwrap_err();
        assert!(e.to_string().contains("no sticky bit"), "{e}");
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o1777)).unwrap();
        check_socket_trust(&path).unwrap();
        let file = dir.path().join("plain");
        std::fs::write(&file, b"").unwrap();
        assert!(check_socket_trust(&file)
            .unwrap_err()
            .to_string()
            .contains("not a socket"));
        assert!(matches!(
            check_socket_trust(&dir.path().join("missing")),
            Err(NodeError::Connect { .. })
        ));
    }
}
