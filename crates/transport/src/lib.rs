//! The client side of the farmem protocol: connections to donors, with many requests in flight
//! per connection, timeouts, reconnection and an emulated link delay.
//!
//! ```no_run
//! use farmem_transport::{ClientConfig, DonorClient, PageAddr, PageWrite};
//! let client = DonorClient::connect("127.0.0.1:7070", ClientConfig::default())?;
//! let slab = client.alloc_slab()?;
//! let page = [7u8; 4096];
//! let addr = PageAddr { slab, page: 0 };
//! client.write_pages(&[PageWrite { addr, data: &page }])?;
//! let mut out = vec![0u8; 4096];
//! client.read_pages(&[addr], &mut out)?;
//! # Ok::<(), farmem_transport::TransportError>(())
//! ```
//!
//! # Design
//! - Blocking std I/O, lean for the page-fault path. A [`DonorClient`] is one TCP connection
//!   (TCP_NODELAY). The calling thread encodes its own frame and writes it under the connection's
//!   writer mutex in one vectored write (header and addresses, then the caller's page slices:
//!   page data is never copied on the way out). Any number of threads may have any number of
//!   requests in flight; responses are matched to requests by request id.
//! - Responses are read by the waiting threads themselves (leader/follower): a waiter reads the
//!   socket when no other thread is, files each response it reads for its own waiter, and hands
//!   the reader role on when its own response is in. A lone synchronous read is thus answered
//!   with one wake-up, like a plain blocking client; a dedicated reader thread (the first
//!   version) cost one more thread hand-off, measured at ~6.5 µs of a ~22 µs loopback round
//!   trip (p50) on the 2-core development VM.
//! - [`DonorClient::submit_read`] / [`DonorClient::submit_write`] return a [`Pending`] at once;
//!   [`Pending::wait`] blocks for at most the request timeout, measured from submission. The
//!   blocking calls are submit + wait.
//! - Failure: a read error, close, protocol violation, failed write or request timeout closes
//!   the connection and fails every request in flight on it ([`TransportError::Disconnected`],
//!   or [`TransportError::Protocol`] if the donor broke the protocol). The next call reconnects
//!   and attaches to the same client id, proving its reconnect key, so the donor hands back the
//!   same slabs within its orphan grace period. Requests are never retried behind the caller's
//!   back once sent.
//! - Handshake: HELLO, answered with a donor nonce; then AUTH with an HMAC of the nonce under
//!   the token (the token never crosses the wire) and, on the first connection of a client id,
//!   its [`ReconnectKey`] (registering the id), on every later one an HMAC of the nonce under
//!   that key (attaching to it). Clients sharing a [`ClientConfig`] (its `client_id` and
//!   `reconnect_key`) share slabs; nobody else can claim them.
//! - `link_delay_us` (the memory-blade study's link-latency knob) delays each response's
//!   delivery to its waiter by that much after it arrived, on the waiting thread, so it adds
//!   latency without serializing the pipeline.
//! - The crate spawns no threads; `thread_hook` is kept in the configuration for any it spawns
//!   later and is run first in each.
//!
//! # Limitations
//! - One TCP connection per client; a caller wanting more parallelism on the wire opens more
//!   clients (with the same client id they share slabs).
//! - Responses are read only while some thread waits: the response to a request that is
//!   submitted but not yet waited for stays in the socket (then in memory) until a waiter on the
//!   same connection reads past it. A connection that breaks while idle is noticed by the next
//!   request, which fails with [`TransportError::Disconnected`]; the one after reconnects.
//! - Sub-300 µs link delays are reached by yielding the CPU in a loop rather than sleeping, which
//!   costs CPU time on the waiting thread.
//! - A request timeout abandons the whole connection (the donor is presumed stalled), failing
//!   the other requests in flight on it.
#![forbid(unsafe_code)]

mod conn;
mod error;

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use farmem_proto::{
    encode_alloc_slab, encode_clients, encode_free_slab, encode_read_pages, encode_reclaims,
    encode_stats, encode_write_pages_header, EncodeError, Opcode,
};

pub use error::TransportError;
pub use farmem_proto::{
    token_from_file_bytes, ClientEntry, ClientsReply, DonorInfo, DonorStats, PageAddr,
    ReconnectKey, Status, MAX_BATCH_PAGES, MAX_RECLAIM_SLABS, MAX_TOKEN_LEN, PAGE_SIZE,
};

use conn::{Conn, Failure, Reply, SendError, Waited};

/// How a [`DonorClient`] connects and behaves.
#[derive(Clone)]
pub struct ClientConfig {
    /// Id of this client: reconnecting with the same id and [`ClientConfig::reconnect_key`]
    /// finds the same slabs (within the donor's orphan grace period). The default is random.
    pub client_id: u64,
    /// The secret the client's slabs belong to (registered with the id by the first connection,
    /// proven by the others). The default is random; clients that share slabs share it.
    pub reconnect_key: ReconnectKey,
    /// The auth token proven in AUTH (`--token-file`), if the donor wants one. It never crosses
    /// the wire.
    pub token: Option<Vec<u8>>,
    /// Limit for establishing the TCP connection. Default 3 s.
    pub connect_timeout: Duration,
    /// Limit for each request, from submission to response (and for each write to the socket).
    /// A stalled donor gives [`TransportError::Timeout`], never a hang. Default 5 s.
    pub request_timeout: Duration,
    /// Emulated extra link latency added to every request, microseconds. Default 0.
    pub link_delay_us: u64,
    /// Run first in every thread this crate spawns (the runtime marks its threads with it).
    /// The current design spawns none: responses are read by the waiting threads.
    pub thread_hook: Option<Arc<dyn Fn() + Send + Sync>>,
    /// How long a waiting thread polls the socket before it blocks in a read. A sleeping
    /// thread is woken through an idle CPU's halt, which on a virtual machine (an IPI through
    /// the hypervisor) costs about as much as a loopback round trip: worth spinning for on a
    /// latency-bound path (the runtime's fault-path reads), a waste of CPU on a
    /// throughput-bound one (batches). The poll yields the CPU between probes, so the donor
    /// (or the program) needing this CPU to make progress gets it: with polls that kept the
    /// CPU, a random scan over TCP on 2 cores took 48-58 µs an access, against 26-36 µs.
    /// Default zero: no spinning.
    pub spin: Duration,
    /// What this client is (its program and host), told to the donor after each handshake
    /// (IDENT) for its operators; cut to a valid label ([`farmem_proto::clean_label`]).
    /// Default none.
    pub label: Option<String>,
}

impl Default for ClientConfig {
    /// A configuration with a fresh random client id and reconnect key.
    ///
    /// # Panics
    /// If the operating system's random number generator fails (`getrandom`), which Linux
    /// does not do once booted.
    fn default() -> Self {
        ClientConfig {
            client_id: farmem_proto::random_client_id().expect("getrandom failed"),
            reconnect_key: ReconnectKey::random().expect("getrandom failed"),
            token: None,
            connect_timeout: Duration::from_secs(3),
            request_timeout: Duration::from_secs(5),
            link_delay_us: 0,
            thread_hook: None,
            spin: Duration::ZERO,
            label: None,
        }
    }
}

impl fmt::Debug for ClientConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientConfig")
            .field("client_id", &self.client_id)
            .field("reconnect_key", &self.reconnect_key)
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .field("connect_timeout", &self.connect_timeout)
            .field("request_timeout", &self.request_timeout)
            .field("link_delay_us", &self.link_delay_us)
            .field("thread_hook", &self.thread_hook.as_ref().map(|_| "<fn>"))
            .field("label", &self.label)
            .finish()
    }
}

/// One page to write: where, and its [`PAGE_SIZE`] bytes.
#[derive(Debug, Clone, Copy)]
pub struct PageWrite<'a> {
    /// The page on the donor.
    pub addr: PageAddr,
    /// Exactly [`PAGE_SIZE`] bytes.
    pub data: &'a [u8],
}

/// What a finished request returns.
#[derive(Debug, PartialEq, Eq)]
pub enum Completion {
    /// A write (or other request without data) succeeded.
    Done,
    /// The pages read: `4096 × n` bytes, in request order.
    Pages(Vec<u8>),
}

/// The client's own counters (the donor's are in [`DonorClient::stats`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ClientCounters {
    /// Requests sent.
    pub requests_total: u64,
    /// Pages asked for in READ_PAGES requests.
    pub pages_read_total: u64,
    /// Pages sent in WRITE_PAGES requests.
    pub pages_written_total: u64,
    /// Requests that timed out.
    pub timeouts_total: u64,
    /// Connections opened after the first one.
    pub reconnects_total: u64,
}

#[derive(Default)]
struct Counters {
    requests_total: AtomicU64,
    pages_read_total: AtomicU64,
    pages_written_total: AtomicU64,
    timeouts_total: AtomicU64,
    reconnects_total: AtomicU64,
}

fn bump(c: &AtomicU64, n: u64) {
    c.fetch_add(n, Ordering::Relaxed);
}

struct Inner {
    addr: Arc<str>,
    cfg: ClientConfig,
    next_id: AtomicU64,
    conn: Mutex<Option<Arc<Conn>>>,
    info: Mutex<DonorInfo>,
    /// This client's id is registered with the donor: reconnects attach to it.
    registered: AtomicBool,
    counters: Counters,
}

impl Drop for Inner {
    fn drop(&mut self) {
        if let Some(conn) = lock(&self.conn).take() {
            conn.close();
        }
    }
}

/// Refuses a token no donor could accept before anything is sent.
fn check_token(cfg: &ClientConfig) -> Result<(), TransportError> {
    if let Some(token) = &cfg.token {
        let token = farmem_proto::token_from_file_bytes(token);
        if token.is_empty() || token.len() > MAX_TOKEN_LEN {
            return Err(TransportError::TokenLength { len: token.len() });
        }
    }
    Ok(())
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Inner {
    fn next_id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    /// The live connection, reconnecting (with HELLO) if the last one failed.
    fn current_conn(&self) -> Result<Arc<Conn>, TransportError> {
        let mut current = lock(&self.conn);
        if let Some(conn) = current.as_ref().filter(|c| !c.is_closed()) {
            return Ok(Arc::clone(conn));
        }
        let registered = self.registered.load(Ordering::Relaxed);
        let (conn, info) = Conn::open(&self.addr, &self.cfg, &self.next_id, registered)?;
        self.registered.store(true, Ordering::Relaxed);
        let mut known = lock(&self.info);
        // A client made by `attach_later` learns the geometry now.
        if known.slab_size_bytes != 0 && *known != info {
            tracing::warn!(donor = %self.addr, before = ?*known, after = ?info, "donor geometry changed across a reconnect");
        }
        *known = info;
        if current.is_some() {
            bump(&self.counters.reconnects_total, 1);
            tracing::info!(donor = %self.addr, "reconnected to donor");
        }
        *current = Some(Arc::clone(&conn));
        Ok(conn)
    }
}

/// A connection to one donor. `Send + Sync`; clones share the connection.
#[derive(Clone)]
pub struct DonorClient {
    inner: Arc<Inner>,
}

impl fmt::Debug for DonorClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DonorClient")
            .field("addr", &self.inner.addr)
            .field("client_id", &self.inner.cfg.client_id)
            .finish()
    }
}

impl DonorClient {
    /// Connects to the donor at `addr` (`HOST:PORT`) and authenticates with HELLO.
    pub fn connect(addr: &str, cfg: ClientConfig) -> Result<DonorClient, TransportError> {
        check_token(&cfg)?;
        let addr: Arc<str> = Arc::from(addr);
        let next_id = AtomicU64::new(1);
        let (conn, info) = Conn::open(&addr, &cfg, &next_id, false)?;
        Ok(DonorClient {
            inner: Arc::new(Inner {
                addr,
                cfg,
                next_id,
                conn: Mutex::new(Some(conn)),
                info: Mutex::new(info),
                registered: AtomicBool::new(true),
                counters: Counters::default(),
            }),
        })
    }

    /// A connection of client `cfg` (its id and key), registered with the donor at `addr` by
    /// someone else, made (attaching) at the first request instead of now: a forked child's
    /// connection to a donor of its parent that did not answer at the child's start, which
    /// may come back and hold the parent's new copies. It never registers the id: until the
    /// donor knows it, requests fail ([`TransportError::Forgotten`] or a connection error).
    /// [`DonorClient::info`] is all zeros until the first connection.
    pub fn attach_later(addr: &str, cfg: ClientConfig) -> Result<DonorClient, TransportError> {
        DonorClient::later(addr, cfg, true)
    }

    /// A client `cfg` of the donor at `addr`, connected (and registered, or attached if
    /// another connection registered the id first) at its first request instead of now: a
    /// donor that did not answer when the runtime started, used once it does.
    /// [`DonorClient::info`] is all zeros until then.
    pub fn register_later(addr: &str, cfg: ClientConfig) -> Result<DonorClient, TransportError> {
        DonorClient::later(addr, cfg, false)
    }

    fn later(
        addr: &str,
        cfg: ClientConfig,
        registered: bool,
    ) -> Result<DonorClient, TransportError> {
        check_token(&cfg)?;
        Ok(DonorClient {
            inner: Arc::new(Inner {
                addr: Arc::from(addr),
                cfg,
                next_id: AtomicU64::new(1),
                conn: Mutex::new(None),
                info: Mutex::new(DonorInfo {
                    slab_size_bytes: 0,
                    capacity_bytes: 0,
                }),
                registered: AtomicBool::new(registered),
                counters: Counters::default(),
            }),
        })
    }

    /// The donor lost this client (it restarted with an empty store) and the caller holds no
    /// slab id from it any more: the next connection registers this client afresh, so the
    /// donor is used again as a new, empty one, instead of every request failing with
    /// [`TransportError::Forgotten`]. Only for a caller that has forgotten every slab id it had
    /// there: an old id could name a new slab.
    pub fn register_again(&self) {
        self.reconnect();
        self.inner.registered.store(false, Ordering::Relaxed);
    }

    /// Closes this client's connection, if it has one: the next request opens a new one, as
    /// the same client. For a connection left unused while its donor was down: it may still be
    /// one to the donor's old process (restarted) or one a partition broke, and the first
    /// request on it would fail although the donor is back.
    pub fn reconnect(&self) {
        if let Some(conn) = lock(&self.inner.conn).take() {
            conn.close();
        }
    }

    /// The donor address this client talks to.
    pub fn addr(&self) -> &str {
        &self.inner.addr
    }

    /// This client's id, as sent in AUTH.
    pub fn client_id(&self) -> u64 {
        self.inner.cfg.client_id
    }

    /// The secret this client's slabs belong to: another client given the same id and key
    /// (e.g. a second connection of one runtime) shares them.
    pub fn reconnect_key(&self) -> &ReconnectKey {
        &self.inner.cfg.reconnect_key
    }

    /// The donor's geometry, as told by its last HELLO answer.
    pub fn info(&self) -> DonorInfo {
        *lock(&self.inner.info)
    }

    /// This client's counters.
    pub fn counters(&self) -> ClientCounters {
        let c = &self.inner.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        ClientCounters {
            requests_total: get(&c.requests_total),
            pages_read_total: get(&c.pages_read_total),
            pages_written_total: get(&c.pages_written_total),
            timeouts_total: get(&c.timeouts_total),
            reconnects_total: get(&c.reconnects_total),
        }
    }

    /// Allocates one slab for this client; returns its id.
    pub fn alloc_slab(&self) -> Result<u32, TransportError> {
        let reply = self
            .submit(Opcode::AllocSlab, &[], |b, id| {
                encode_alloc_slab(b, id);
                Ok(())
            })?
            .wait_reply()?;
        match reply {
            Reply::Slab(slab) => Ok(slab),
            other => Err(self.unexpected(Opcode::AllocSlab, &other)),
        }
    }

    /// Frees one of this client's slabs.
    pub fn free_slab(&self, slab: u32) -> Result<(), TransportError> {
        let reply = self
            .submit(Opcode::FreeSlab, &[], |b, id| {
                encode_free_slab(b, id, slab);
                Ok(())
            })?
            .wait_reply()?;
        match reply {
            Reply::Done => Ok(()),
            other => Err(self.unexpected(Opcode::FreeSlab, &other)),
        }
    }

    /// Fetches the donor's counters.
    pub fn stats(&self) -> Result<DonorStats, TransportError> {
        let reply = self
            .submit(Opcode::Stats, &[], |b, id| {
                encode_stats(b, id);
                Ok(())
            })?
            .wait_reply()?;
        match reply {
            Reply::Stats(s) => Ok(s),
            other => Err(self.unexpected(Opcode::Stats, &other)),
        }
    }

    /// Asks for this client's tenant on the donor: its name, use, quota and clients (with the
    /// address each connects from and what it said it is). Never another tenant's.
    pub fn clients(&self) -> Result<farmem_proto::ClientsReply, TransportError> {
        let reply = self
            .submit(Opcode::Clients, &[], |b, id| {
                encode_clients(b, id);
                Ok(())
            })?
            .wait_reply()?;
        match reply {
            Reply::Clients(c) => Ok(c),
            other => Err(self.unexpected(Opcode::Clients, &other)),
        }
    }

    /// Asks which of this client's slabs the donor wants back now (RECLAIMS): at most
    /// [`MAX_RECLAIM_SLABS`] slab ids, least recently written first, empty when it wants
    /// nothing back. The donor asks because it is over its capacity (its owner lowered it) or
    /// its host is short of memory (`farmem donor --keep-free`); the caller gives a slab back
    /// by moving its pages elsewhere and then freeing it ([`DonorClient::free_slab`]). Until it
    /// does, the donor keeps asking (it never drops a client's data) and lends no new slabs.
    /// Meant to be polled (every few hundred milliseconds) by whoever places slabs.
    pub fn reclaims(&self) -> Result<Vec<u32>, TransportError> {
        let reply = self
            .submit(Opcode::Reclaims, &[], |b, id| {
                encode_reclaims(b, id);
                Ok(())
            })?
            .wait_reply()?;
        match reply {
            Reply::GiveBack(slabs) => Ok(slabs),
            other => Err(self.unexpected(Opcode::Reclaims, &other)),
        }
    }

    /// Writes 1 to [`MAX_BATCH_PAGES`] pages and waits until the donor has them.
    pub fn write_pages(&self, pages: &[PageWrite<'_>]) -> Result<(), TransportError> {
        self.submit_write(pages)?.wait().map(|_| ())
    }

    /// Reads 1 to [`MAX_BATCH_PAGES`] pages into `out`, which must be exactly
    /// `4096 × pages.len()` bytes; page `i` lands at `out[4096 * i..]`.
    pub fn read_pages(&self, pages: &[PageAddr], out: &mut [u8]) -> Result<(), TransportError> {
        let expected = pages.len() * PAGE_SIZE;
        if out.len() != expected {
            return Err(TransportError::OutputBuffer {
                expected,
                got: out.len(),
            });
        }
        match self.submit_read(pages)?.wait_reply()? {
            Reply::Pages(data) if data.len() == expected => {
                out.copy_from_slice(&data);
                Ok(())
            }
            other => Err(self.unexpected(Opcode::ReadPages, &other)),
        }
    }

    /// Sends a write of 1 to [`MAX_BATCH_PAGES`] pages and returns at once; the page bytes are
    /// on the wire (or in the socket buffer) when this returns, so `pages` may be reused.
    pub fn submit_write(&self, pages: &[PageWrite<'_>]) -> Result<Pending, TransportError> {
        let invalid = |source| TransportError::Invalid {
            op: Opcode::WritePages.name(),
            source,
        };
        if pages.is_empty() || pages.len() > MAX_BATCH_PAGES {
            return Err(invalid(EncodeError::BatchSize { count: pages.len() }));
        }
        if let Some((index, p)) = pages
            .iter()
            .enumerate()
            .find(|(_, p)| p.data.len() != PAGE_SIZE)
        {
            return Err(invalid(EncodeError::PageSize {
                index,
                len: p.data.len(),
            }));
        }
        let data: Vec<&[u8]> = pages.iter().map(|p| p.data).collect();
        let pending = self.submit(Opcode::WritePages, &data, |b, id| {
            encode_write_pages_header(b, id, pages.iter().map(|p| p.addr))
        })?;
        bump(&self.inner.counters.pages_written_total, pages.len() as u64);
        Ok(pending)
    }

    /// Sends a read of 1 to [`MAX_BATCH_PAGES`] pages and returns at once;
    /// [`Pending::wait`] gives [`Completion::Pages`].
    pub fn submit_read(&self, pages: &[PageAddr]) -> Result<Pending, TransportError> {
        if pages.is_empty() || pages.len() > MAX_BATCH_PAGES {
            return Err(TransportError::Invalid {
                op: Opcode::ReadPages.name(),
                source: EncodeError::BatchSize { count: pages.len() },
            });
        }
        let pending = self.submit(Opcode::ReadPages, &[], |b, id| {
            encode_read_pages(b, id, pages)
        })?;
        bump(&self.inner.counters.pages_read_total, pages.len() as u64);
        Ok(pending)
    }

    /// Registers and sends one request, reconnecting first if the connection is down. A
    /// connection found closed before anything was sent is replaced once.
    fn submit(
        &self,
        op: Opcode,
        pages: &[&[u8]],
        encode: impl Fn(&mut Vec<u8>, u64) -> Result<(), EncodeError>,
    ) -> Result<Pending, TransportError> {
        let inner = &self.inner;
        for _ in 0..2 {
            let conn = inner.current_conn()?;
            let id = inner.next_id();
            let submitted = Instant::now();
            match conn.send(op, id, inner.cfg.request_timeout, pages, |b| encode(b, id)) {
                Ok(()) => {
                    bump(&inner.counters.requests_total, 1);
                    return Ok(Pending {
                        client: Arc::clone(inner),
                        conn,
                        id,
                        op,
                        submitted,
                        finished: false,
                    });
                }
                Err(SendError::Closed) => continue,
                Err(SendError::Failed(e)) => {
                    if matches!(e, TransportError::Timeout { .. }) {
                        bump(&inner.counters.timeouts_total, 1);
                    }
                    return Err(e);
                }
            }
        }
        Err(TransportError::Disconnected {
            addr: inner.addr.to_string(),
            op: op.name(),
            reason: "the connection closed again right after it was re-established".into(),
        })
    }

    fn unexpected(&self, op: Opcode, reply: &Reply) -> TransportError {
        TransportError::Protocol {
            addr: self.inner.addr.to_string(),
            op: op.name(),
            detail: format!("unexpected reply {reply:?}"),
        }
    }
}

impl From<Reply> for Completion {
    fn from(r: Reply) -> Completion {
        match r {
            Reply::Pages(data) => Completion::Pages(data),
            Reply::Done
            | Reply::Slab(_)
            | Reply::Stats(_)
            | Reply::GiveBack(_)
            | Reply::Clients(_) => Completion::Done,
        }
    }
}

/// A request in flight. [`Pending::wait`] gives its result; dropping it forgets the request
/// (the response is discarded when it arrives).
pub struct Pending {
    client: Arc<Inner>,
    conn: Arc<Conn>,
    id: u64,
    op: Opcode,
    submitted: Instant,
    finished: bool,
}

impl fmt::Debug for Pending {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Pending")
            .field("donor", &self.client.addr)
            .field("op", &self.op.name())
            .field("id", &self.id)
            .finish()
    }
}

impl Pending {
    /// Waits for the response, for at most the request timeout counted from submission, plus
    /// the configured link delay.
    pub fn wait(self) -> Result<Completion, TransportError> {
        self.wait_reply().map(Completion::from)
    }

    /// Waits for the response until `until` at most. `None`: `until` came first (before the
    /// request timeout); the request stays in flight and may be waited for again, or dropped.
    /// Used to give up early on a slow donor when another copy of the page can be read.
    pub fn wait_until(&mut self, until: Instant) -> Option<Result<Completion, TransportError>> {
        let timeout_at = self.submitted + self.client.cfg.request_timeout;
        if until < timeout_at {
            match self.conn.wait_or_keep(self.id, until, false) {
                Waited::TimedOut => return None,
                Waited::Done(outcome) => {
                    self.finished = true;
                    return Some(self.completed(outcome).map(Completion::from));
                }
            }
        }
        let me = Pending {
            client: Arc::clone(&self.client),
            conn: Arc::clone(&self.conn),
            id: self.id,
            op: self.op,
            submitted: self.submitted,
            finished: false,
        };
        self.finished = true;
        Some(me.wait())
    }

    fn wait_reply(mut self) -> Result<Reply, TransportError> {
        let timeout = self.client.cfg.request_timeout;
        let waited = self.conn.wait(self.id, self.submitted + timeout);
        self.finished = true;
        let (result, arrived) = match waited {
            Waited::Done(outcome) => outcome,
            Waited::TimedOut => {
                bump(&self.client.counters.timeouts_total, 1);
                self.conn.fail(Failure::Lost(format!(
                    "a {} request got no answer within {} ms, so the connection was abandoned",
                    self.op.name(),
                    timeout.as_millis()
                )));
                return Err(TransportError::Timeout {
                    addr: self.client.addr.to_string(),
                    op: self.op.name(),
                    after: timeout,
                });
            }
        };
        self.completed((result, arrived))
    }

    /// A response that arrived: held back by the emulated link delay.
    fn completed(
        &self,
        (result, arrived): (Result<Reply, TransportError>, Instant),
    ) -> Result<Reply, TransportError> {
        let delay_us = self.client.cfg.link_delay_us;
        if delay_us > 0 && result.is_ok() {
            delay_until(arrived + Duration::from_micros(delay_us));
        }
        result
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        if !self.finished {
            self.conn.forget(self.id);
        }
    }
}

/// Blocks the calling thread until `until`: sleeps for long waits, yields for the last few
/// hundred microseconds (sleep granularity is too coarse for emulated link delays).
fn delay_until(until: Instant) {
    const SPIN: Duration = Duration::from_micros(300);
    loop {
        let now = Instant::now();
        if now >= until {
            return;
        }
        let left = until - now;
        if left > SPIN {
            std::thread::sleep(left - SPIN);
        } else {
            std::thread::yield_now();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn client_and_pending_are_send_and_sync() {
        fn check<T: Send + Sync>() {}
        check::<DonorClient>();
        check::<Pending>();
        check::<ClientConfig>();
    }

    #[test]
    fn default_config_matches_the_contract() {
        let c = ClientConfig::default();
        assert_eq!(c.connect_timeout, Duration::from_secs(3));
        assert_eq!(c.request_timeout, Duration::from_secs(5));
        assert_eq!(c.link_delay_us, 0);
        assert!(c.token.is_none() && c.thread_hook.is_none());
        let shown = format!(
            "{:?}",
            ClientConfig {
                token: Some(b"secret".to_vec()),
                ..c
            }
        );
        assert!(!shown.contains("secret"), "{shown}");
    }

    #[test]
    fn bad_addresses_and_refused_connections_are_clear_errors() {
        let err = DonorClient::connect("not an address", ClientConfig::default()).unwrap_err();
        assert!(matches!(err, TransportError::BadAddress { .. }), "{err}");
        // A port nobody listens on: bind, learn the port, close.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let err = DonorClient::connect(&format!("127.0.0.1:{port}"), ClientConfig::default())
            .unwrap_err();
        assert!(matches!(err, TransportError::Connect { .. }), "{err}");
        assert!(err.to_string().contains("farmem donor"), "{err}");
    }

    #[test]
    fn delay_until_waits_at_least_until_the_deadline() {
        let start = Instant::now();
        let until = start + Duration::from_micros(700);
        delay_until(until);
        assert!(Instant::now() >= until);
    }
}
