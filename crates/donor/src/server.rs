//! The donor server: configuration, binding, the accept loop, the orphan reaper, shutdown.
//!
//! # Design
//! One thread per connection, blocking I/O. A connection's thread is the only one that reads or
//! writes its socket, so a client that stops reading (its thread blocks in `sendmsg` until the
//! send timeout closes the connection) or sends garbage (its connection is closed) cannot stall
//! another: the shared state (the slab store, the counters) is never locked across socket I/O.
//! The number of connections is capped ([`DonorConfig::max_connections`]); a connection must
//! complete the handshake (HELLO and AUTH) within [`DonorConfig::hello_timeout`] (default
//! [`HELLO_TIMEOUT`]) counted from its accept, however it spreads its bytes. Connections logging
//! in have slots of their own (`logins`): a new one beyond their bounds evicts one of
//! the source holding the most, so a flood evicts only itself, and authenticated connections
//! are never evicted. Authenticated connections hold slots bounded per client id and per
//! tenant, and each tenant is guaranteed a fair share of them (`slots`). A connection
//! refused because every slot is taken, or at AUTH because of a bound, gets an error frame
//! saying so ([`Status::DonorFull`](farmem_proto::Status::DonorFull)). Refusals and evictions
//! are counted (Prometheus). Log lines are rate-limited per peer address and per tenant
//! ([`crate::loglimit`]), and those about connections that never authenticated also donor-wide
//! ([`REFUSALS_LOGGED_PER_INTERVAL`] lines per [`REFUSAL_LOG_INTERVAL`], then a count).
//!
//! An authenticated client may stay idle between requests as long as it likes, but once a
//! request's first byte arrives the whole request must arrive within
//! [`DonorConfig::stall_timeout`] (default [`STALL_TIMEOUT`]), however its bytes trickle: a
//! half-sent request would otherwise hold its thread, and the slabs it names, forever.
//!
//! Shutdown ([`ShutdownHandle::shutdown`]) sets a flag, shuts the listening sockets down (which
//! wakes the blocked `accept`) and shuts every open connection down (which wakes its blocked
//! read); `run` then joins every thread it started and returns.
//!
//! [`SessionDonor`] serves client sessions handed to it as byte streams, on the caller's thread,
//! with no socket: the same connection code over an in-memory stream, with the same checks of
//! the configuration ([`DonorServer::bind`] and it share them), for the fuzz target and tests.
use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use farmem_metrics::MetricsEndpoint;
use farmem_proto::{encode_error, Opcode, Status, MAX_TOKEN_LEN, PAGE_SIZE};
use parking_lot::{Condvar, Mutex, MutexGuard};

use crate::conn::{Connection, Peer, Stream};
use crate::host;
pub use crate::limits::{
    HELLO_TIMEOUT, MAX_CONNECTIONS, REFUSALS_LOGGED_PER_INTERVAL, REFUSAL_LOG_INTERVAL,
    STALL_TIMEOUT, WRITE_TIMEOUT,
};
use crate::logins::Logins;
pub use crate::logins::{MAX_UNAUTHENTICATED, MAX_UNAUTHENTICATED_PER_SOURCE};
use crate::loglimit::LogLimiter;
use crate::metrics::Metrics;
use crate::reclaim::{Reclaimer, RECLAIM_TICK};
use crate::shared::Shared;
pub use crate::slots::MAX_CONNS_PER_CLIENT;
use crate::slots::{SlotBounds, Slots};
use crate::socket::Socket;
use crate::store::{SlabStore, TenantQuota};

/// Stack size of a connection thread (the data path needs little: buffers live on the heap).
const CONN_STACK_BYTES: usize = 256 * 1024;

/// A tenant: the clients that authenticate with its token, and the most bytes they may hold
/// together. Its `Debug` output hides the token.
#[derive(Clone, PartialEq, Eq)]
pub struct Tenant {
    /// Its name (in logs and messages).
    pub name: String,
    /// Its auth token (1 to [`MAX_TOKEN_LEN`] bytes).
    pub token: Vec<u8>,
    /// Most bytes its clients may hold together; `None`: no limit beyond capacity.
    pub quota_bytes: Option<u64>,
    /// Most connections its clients may hold together; `None`:
    /// [`DonorConfig::max_conns_per_tenant`].
    pub max_connections: Option<usize>,
}

impl std::fmt::Debug for Tenant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tenant")
            .field("name", &self.name)
            .field("token", &"<redacted>")
            .field("quota_bytes", &self.quota_bytes)
            .field("max_connections", &self.max_connections)
            .finish()
    }
}

/// The donor's configuration. Its `Debug` output hides the tokens.
#[derive(Clone)]
pub struct DonorConfig {
    /// Address to listen on, e.g. `127.0.0.1:7070` (`:0` picks a free port).
    pub listen: String,
    /// Most bytes lent in total (whole slabs).
    pub capacity_bytes: u64,
    /// Size of one slab (a multiple of 4096), default 64 MiB.
    pub slab_size_bytes: u64,
    /// Auth token clients must prove in AUTH (one tenant, "default"); `None` with no
    /// `tenants` accepts any client (loopback only unless `insecure`).
    pub token: Option<Vec<u8>>,
    /// Tenants, each with its own token and quota (`farmem donor --tenants`); exclusive with
    /// `token`.
    pub tenants: Vec<Tenant>,
    /// Most bytes one client id may hold, `None` for no limit beyond capacity.
    pub quota_bytes: Option<u64>,
    /// How long the slabs of a disconnected client are kept for it to reconnect, default 60 s.
    pub orphan_grace: Duration,
    /// Allow listening on a non-loopback address without a token.
    pub insecure: bool,
    /// Address of the Prometheus text endpoint, if any.
    pub metrics_listen: Option<String>,
    /// How long a new connection may take, in total, to complete the handshake before it is
    /// closed; default [`HELLO_TIMEOUT`].
    pub hello_timeout: Duration,
    /// Most connections served at once; default [`MAX_CONNECTIONS`].
    pub max_connections: usize,
    /// Most authenticated connections of one client id; default [`MAX_CONNS_PER_CLIENT`].
    pub max_conns_per_client: usize,
    /// Most authenticated connections of one tenant (unless [`Tenant::max_connections`] says
    /// otherwise); `None`: bounded only by the fair-share rule of `slots`.
    pub max_conns_per_tenant: Option<usize>,
    /// The donor lends no new slab while the host's `MemAvailable` is below this many bytes;
    /// `None`: [`host::default_watermark_bytes`] of `MemTotal` (5 %, at least 256 MiB);
    /// `Some(0)`: never.
    pub memory_watermark_bytes: Option<u64>,
    /// How long an authenticated client may pause inside a request (between two of its bytes)
    /// before its connection is closed; pauses between requests are unlimited. Default
    /// [`STALL_TIMEOUT`].
    pub stall_timeout: Duration,
    /// `--keep-free`: while the host's `MemAvailable` is below this many bytes the donor lends
    /// no new slab and asks clients to give back enough slabs to cover the shortfall (see
    /// [`crate::reclaim`]). `None`: it never takes memory back for the host.
    pub keep_free_bytes: Option<u64>,
    /// Where `MemAvailable` is read for the watermark and `keep_free_bytes`: default
    /// [`host::MEMINFO`]; tests point it at a file of their own in the same format.
    pub meminfo_path: PathBuf,
}

impl std::fmt::Debug for DonorConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DonorConfig")
            .field("listen", &self.listen)
            .field("capacity_bytes", &self.capacity_bytes)
            .field("slab_size_bytes", &self.slab_size_bytes)
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .field("tenants", &self.tenants)
            .field("quota_bytes", &self.quota_bytes)
            .field("orphan_grace", &self.orphan_grace)
            .field("insecure", &self.insecure)
            .field("metrics_listen", &self.metrics_listen)
            .field("hello_timeout", &self.hello_timeout)
            .field("stall_timeout", &self.stall_timeout)
            .field("max_connections", &self.max_connections)
            .field("max_conns_per_client", &self.max_conns_per_client)
            .field("max_conns_per_tenant", &self.max_conns_per_tenant)
            .field("memory_watermark_bytes", &self.memory_watermark_bytes)
            .field("keep_free_bytes", &self.keep_free_bytes)
            .field("meminfo_path", &self.meminfo_path)
            .finish()
    }
}

impl Default for DonorConfig {
    fn default() -> Self {
        DonorConfig {
            listen: "127.0.0.1:7070".to_string(),
            capacity_bytes: 1 << 30,
            slab_size_bytes: 64 << 20,
            token: None,
            tenants: Vec::new(),
            quota_bytes: None,
            orphan_grace: Duration::from_secs(60),
            insecure: false,
            metrics_listen: None,
            hello_timeout: HELLO_TIMEOUT,
            stall_timeout: STALL_TIMEOUT,
            max_connections: MAX_CONNECTIONS,
            max_conns_per_client: MAX_CONNS_PER_CLIENT,
            max_conns_per_tenant: None,
            memory_watermark_bytes: None,
            keep_free_bytes: None,
            meminfo_path: PathBuf::from(host::MEMINFO),
        }
    }
}

/// Why the donor could not start or keep running.
#[derive(Debug, thiserror::Error)]
pub enum DonorError {
    /// A configuration value is unusable.
    #[error("invalid donor configuration: {0}")]
    Config(String),
    /// The capacity is more than the host can hold.
    #[error("--capacity {capacity} bytes is more than {what} ({limit} bytes): a donor filled past it would be killed by the kernel and every client's pages lost; give a smaller --capacity")]
    CapacityAboveHost {
        /// The capacity asked for.
        capacity: u64,
        /// The host's limit.
        limit: u64,
        /// Which limit.
        what: &'static str,
    },
    /// The listen address did not resolve.
    #[error("cannot resolve address {addr:?} (use HOST:PORT, e.g. 127.0.0.1:7070)")]
    Resolve {
        /// The address given.
        addr: String,
        /// The resolver's error.
        #[source]
        source: io::Error,
    },
    /// Listening without a token on an address other hosts can reach.
    #[error("refusing to listen on {addr} without an auth token: it is reachable from other hosts; give --token-file, listen on 127.0.0.1, or pass --insecure")]
    InsecureListen {
        /// The address.
        addr: String,
    },
    /// Binding the data listener failed.
    #[error("cannot listen on {addr} (is another donor already using this port? pick another with --listen)")]
    Bind {
        /// The address.
        addr: String,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// Binding the metrics listener failed.
    #[error("cannot serve metrics on {addr} (is the port in use? pick another with --metrics)")]
    MetricsBind {
        /// The address.
        addr: String,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// A socket operation needed to set up the server failed.
    #[error("setting up the donor's sockets failed")]
    Socket(#[source] io::Error),
    /// Starting a thread failed.
    #[error("starting a donor thread failed (the host may be out of threads or memory)")]
    Spawn(#[source] io::Error),
    /// The donor's thread panicked.
    #[error("the donor thread panicked")]
    Panicked,
}

/// Stops a donor from any thread. Cheap to clone.
#[derive(Clone)]
pub struct ShutdownHandle(Arc<Shared>);

impl ShutdownHandle {
    /// Asks the donor to stop: it stops accepting, closes every connection, and `run` returns.
    /// Idempotent.
    pub fn shutdown(&self) {
        self.0.shutdown();
    }
}

/// The donor owner's control over a running donor (the CLI drives it from SIGHUP and
/// `--capacity-file`). Cheap to clone.
#[derive(Clone)]
pub struct DonorControl(Arc<Shared>);

impl DonorControl {
    /// The capacity now, in bytes (whole slabs).
    pub fn capacity_bytes(&self) -> u64 {
        self.0.store.capacity_bytes()
    }

    /// Sets the capacity to `bytes` (rounded down to whole slabs) and returns it. Lowered below
    /// what is lent, the donor asks clients for the difference back (least recently written
    /// slabs first) and lends nothing new until it is under the capacity again; raised, it lends
    /// again. Refused, leaving the capacity as it was, when `bytes` is less than one slab or more
    /// than the host's memory.
    pub fn set_capacity_bytes(&self, bytes: u64) -> Result<u64, DonorError> {
        let slab = self.0.store.slab_size_bytes();
        if bytes < slab {
            return Err(DonorError::Config(format!(
                "capacity {bytes} bytes is smaller than one slab ({slab} bytes); to take every slab back, stop the donor instead"
            )));
        }
        if let Some((limit, what)) = host::memory_limit_bytes() {
            if bytes > limit {
                return Err(DonorError::CapacityAboveHost {
                    capacity: bytes,
                    limit,
                    what,
                });
            }
        }
        let old = self.0.store.capacity_bytes();
        let new = self.0.store.set_capacity_bytes(bytes);
        let lent = self.0.store.used_bytes();
        tracing::info!(
            old_capacity_bytes = old,
            capacity_bytes = new,
            lent_bytes = lent,
            "capacity changed{}",
            if lent > new {
                "; asking clients to give back the slabs lent beyond it"
            } else {
                ""
            }
        );
        self.0.wake_reclaim();
        Ok(new)
    }
}

impl std::fmt::Debug for DonorControl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("DonorControl")
    }
}

impl std::fmt::Debug for ShutdownHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ShutdownHandle")
    }
}

/// A bound, not yet running donor.
pub struct DonorServer {
    shared: Arc<Shared>,
    local_addr: SocketAddr,
    metrics_listener: Option<TcpListener>,
    metrics_addr: Option<SocketAddr>,
}

fn resolve(addr: &str) -> Result<Vec<SocketAddr>, DonorError> {
    let addrs: Vec<SocketAddr> = addr
        .to_socket_addrs()
        .map_err(|source| DonorError::Resolve {
            addr: addr.to_string(),
            source,
        })?
        .collect();
    if addrs.is_empty() {
        return Err(DonorError::Resolve {
            addr: addr.to_string(),
            source: io::Error::new(io::ErrorKind::NotFound, "no addresses"),
        });
    }
    Ok(addrs)
}

/// What a checked configuration makes of a donor before any socket: the store's shape, the
/// tenants, the limits. [`DonorServer::bind`] and [`SessionDonor::new`] share it.
struct Plan {
    /// Whole slabs.
    capacity_bytes: u64,
    slab_size_bytes: u64,
    quota_bytes: Option<u64>,
    quotas: Vec<TenantQuota>,
    /// Each tenant's token; `None`: an open donor.
    tokens: Option<Vec<Vec<u8>>>,
    memory_watermark_bytes: u64,
    keep_free_bytes: u64,
    meminfo_path: PathBuf,
    max_connections: usize,
    slot_bounds: SlotBounds,
    hello_timeout: Duration,
    stall_timeout: Duration,
    orphan_grace: Duration,
}

impl Plan {
    /// Checks `cfg` (all but its addresses), its capacity against the host's memory included.
    fn check(cfg: &DonorConfig) -> Result<Plan, DonorError> {
        let page = PAGE_SIZE as u64;
        if cfg.slab_size_bytes == 0 || !cfg.slab_size_bytes.is_multiple_of(page) {
            return Err(DonorError::Config(format!(
                "slab size {} bytes is not a positive multiple of the page size ({page} bytes)",
                cfg.slab_size_bytes
            )));
        }
        if cfg.slab_size_bytes / page > u64::from(u32::MAX) {
            return Err(DonorError::Config(format!(
                "slab size {} bytes holds more pages than a page index can name",
                cfg.slab_size_bytes
            )));
        }
        if cfg.capacity_bytes < cfg.slab_size_bytes {
            return Err(DonorError::Config(format!(
                "capacity {} bytes is smaller than one slab ({} bytes); raise --capacity or lower --slab-size",
                cfg.capacity_bytes, cfg.slab_size_bytes
            )));
        }
        if let Some(q) = cfg.quota_bytes {
            if q < cfg.slab_size_bytes {
                return Err(DonorError::Config(format!(
                    "quota {q} bytes is smaller than one slab ({} bytes): no client could allocate anything",
                    cfg.slab_size_bytes
                )));
            }
        }
        if cfg.stall_timeout.is_zero() {
            return Err(DonorError::Config(
                "the stall timeout is zero: every request would be cut off; give it a positive duration"
                    .into(),
            ));
        }
        if cfg.hello_timeout.is_zero() {
            return Err(DonorError::Config(
                "the HELLO timeout is zero: no client could ever connect; give it a positive duration"
                    .into(),
            ));
        }
        if cfg.token.is_some() && !cfg.tenants.is_empty() {
            return Err(DonorError::Config(
                "both a token and tenants were given: put the token in the tenants file instead"
                    .into(),
            ));
        }
        let mut tenants: Vec<Tenant> = match &cfg.token {
            Some(t) => vec![Tenant {
                name: "default".into(),
                token: t.clone(),
                quota_bytes: None,
                max_connections: None,
            }],
            None => cfg.tenants.clone(),
        };
        for t in &mut tenants {
            t.token = farmem_proto::token_from_file_bytes(&t.token).to_vec();
        }
        for (i, t) in tenants.iter().enumerate() {
            if t.token.is_empty() {
                return Err(DonorError::Config(format!(
                    "tenant {}: the auth token is empty",
                    t.name
                )));
            }
            if t.token.len() > MAX_TOKEN_LEN {
                return Err(DonorError::Config(format!(
                    "tenant {}: the auth token is {} bytes; at most {MAX_TOKEN_LEN} are allowed",
                    t.name,
                    t.token.len()
                )));
            }
            if let Some(q) = t.quota_bytes {
                if q < cfg.slab_size_bytes {
                    return Err(DonorError::Config(format!(
                        "tenant {} has a quota of {q} bytes, smaller than one slab ({} bytes)",
                        t.name, cfg.slab_size_bytes
                    )));
                }
            }
            if t.max_connections == Some(0) {
                return Err(DonorError::Config(format!(
                    "tenant {} has a connection bound of 0: none of its clients could connect; give at least 1",
                    t.name
                )));
            }
            if let Some(d) = tenants[..i].iter().find(|o| o.name == t.name) {
                return Err(DonorError::Config(format!(
                    "two tenants are named {}",
                    d.name
                )));
            }
            if tenants[..i].iter().any(|o| o.token == t.token) {
                return Err(DonorError::Config(format!(
                    "tenant {} has the same token as another tenant: give each its own",
                    t.name
                )));
            }
        }
        if cfg.max_connections == 0 {
            return Err(DonorError::Config(
                "the connection limit is zero: no client could connect".into(),
            ));
        }
        if cfg.max_conns_per_client == 0 {
            return Err(DonorError::Config(
                "--max-conns-per-client is 0: no client could connect; give at least 1".into(),
            ));
        }
        if cfg.max_conns_per_tenant == Some(0) {
            return Err(DonorError::Config(
                "--max-conns-per-tenant is 0: no client could connect; give at least 1".into(),
            ));
        }
        if let Some((limit, what)) = host::memory_limit_bytes() {
            if cfg.capacity_bytes > limit {
                return Err(DonorError::CapacityAboveHost {
                    capacity: cfg.capacity_bytes,
                    limit,
                    what,
                });
            }
        }
        let keep_free_bytes = cfg.keep_free_bytes.unwrap_or(0);
        if keep_free_bytes > 0 && host::mem_available_bytes_in(&cfg.meminfo_path).is_none() {
            return Err(DonorError::Config(format!(
                "--keep-free needs the host's MemAvailable, which {} does not give",
                cfg.meminfo_path.display()
            )));
        }
        let memory_watermark_bytes = cfg
            .memory_watermark_bytes
            .unwrap_or_else(|| host::mem_total_bytes().map_or(0, host::default_watermark_bytes));
        let quotas = if tenants.is_empty() {
            vec![TenantQuota {
                name: "default".into(),
                quota_bytes: None,
            }]
        } else {
            tenants
                .iter()
                .map(|t| TenantQuota {
                    name: t.name.clone(),
                    quota_bytes: t.quota_bytes,
                })
                .collect()
        };
        let slot_tenants = if tenants.is_empty() {
            vec![("default".to_string(), cfg.max_conns_per_tenant)]
        } else {
            tenants
                .iter()
                .map(|t| {
                    (
                        t.name.clone(),
                        t.max_connections.or(cfg.max_conns_per_tenant),
                    )
                })
                .collect()
        };
        // Slots kept for connections logging in; the rest is the authenticated pool.
        let login_reserve = MAX_UNAUTHENTICATED.min(cfg.max_connections / 4);
        let slot_bounds = SlotBounds {
            pool: cfg.max_connections - login_reserve,
            per_client: cfg.max_conns_per_client,
            tenants: slot_tenants,
        };
        let tokens = (!tenants.is_empty()).then(|| tenants.into_iter().map(|t| t.token).collect());
        Ok(Plan {
            capacity_bytes: cfg.capacity_bytes / cfg.slab_size_bytes * cfg.slab_size_bytes,
            slab_size_bytes: cfg.slab_size_bytes,
            quota_bytes: cfg.quota_bytes,
            quotas,
            tokens,
            memory_watermark_bytes,
            keep_free_bytes,
            meminfo_path: cfg.meminfo_path.clone(),
            max_connections: cfg.max_connections,
            slot_bounds,
            hello_timeout: cfg.hello_timeout,
            stall_timeout: cfg.stall_timeout,
            orphan_grace: cfg.orphan_grace,
        })
    }

    /// The state a donor's connections share: an empty store, the counters `metrics`, and the
    /// listener, if any.
    fn shared(&self, metrics: Arc<Metrics>, listener: Option<TcpListener>) -> Shared {
        Shared {
            store: Arc::new(SlabStore::with_tenants(
                self.capacity_bytes,
                self.slab_size_bytes,
                self.quota_bytes,
                self.quotas.clone(),
            )),
            reclaimer: Reclaimer::new(
                self.keep_free_bytes,
                self.meminfo_path.clone(),
                Arc::clone(&metrics),
            ),
            keep_free_bytes: self.keep_free_bytes,
            meminfo_path: self.meminfo_path.clone(),
            reclaim_lock: Mutex::new(()),
            reclaim_wake: Condvar::new(),
            metrics,
            tokens: self.tokens.clone(),
            tenant_names: self.quotas.iter().map(|t| t.name.clone()).collect(),
            stop: AtomicBool::new(false),
            memory_watermark_bytes: self.memory_watermark_bytes,
            max_connections: self.max_connections,
            logins: Mutex::new(Logins::default()),
            slots: Slots::new(self.slot_bounds.clone()),
            log_limiter: LogLimiter::new(),
            refusal_log: Mutex::new((None, 0, 0)),
            hello_timeout: self.hello_timeout,
            stall_timeout: self.stall_timeout,
            listener,
            conns: Mutex::new(HashMap::new()),
            next_conn: AtomicU64::new(1),
            orphan_grace: self.orphan_grace,
            reaper_lock: Mutex::new(()),
            reaper_wake: Condvar::new(),
        }
    }
}

impl DonorServer {
    /// Checks the configuration and binds the listening sockets (nothing is served until
    /// [`DonorServer::run`] or [`DonorServer::spawn`]).
    pub fn bind(cfg: DonorConfig) -> Result<DonorServer, DonorError> {
        let plan = Plan::check(&cfg)?;
        let addrs = resolve(&cfg.listen)?;
        if plan.tokens.is_none() && !cfg.insecure {
            if let Some(a) = addrs.iter().find(|a| !a.ip().is_loopback()) {
                return Err(DonorError::InsecureListen {
                    addr: a.to_string(),
                });
            }
        }
        let listener = TcpListener::bind(&addrs[..]).map_err(|source| DonorError::Bind {
            addr: cfg.listen.clone(),
            source,
        })?;
        let local_addr = listener.local_addr().map_err(DonorError::Socket)?;
        let metrics_listener = match &cfg.metrics_listen {
            None => None,
            Some(m) => {
                let maddrs = resolve(m)?;
                Some(
                    TcpListener::bind(&maddrs[..]).map_err(|source| DonorError::MetricsBind {
                        addr: m.clone(),
                        source,
                    })?,
                )
            }
        };
        let metrics_addr = match &metrics_listener {
            Some(l) => Some(l.local_addr().map_err(DonorError::Socket)?),
            None => None,
        };
        let metrics = Arc::new(Metrics::new());
        Ok(DonorServer {
            shared: Arc::new(plan.shared(metrics, Some(listener))),
            local_addr,
            metrics_listener,
            metrics_addr,
        })
    }

    /// The address the donor listens on (with the real port when `:0` was asked).
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// The metrics endpoint's address, if one was configured.
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics_addr
    }

    /// A handle that stops the donor.
    pub fn shutdown_handle(&self) -> ShutdownHandle {
        ShutdownHandle(Arc::clone(&self.shared))
    }

    /// The slab store (slabs, owners, activity tags), for inspection.
    pub fn store(&self) -> Arc<SlabStore> {
        Arc::clone(&self.shared.store)
    }

    /// The owner's control over the running donor (its capacity).
    pub fn control(&self) -> DonorControl {
        DonorControl(Arc::clone(&self.shared))
    }

    /// Serves until shut down, then closes every connection and joins every thread.
    pub fn run(self) -> Result<(), DonorError> {
        let shared = self.shared;
        tracing::info!(
            addr = %self.local_addr,
            capacity_bytes = shared.store.capacity_bytes(),
            slab_size_bytes = shared.store.slab_size_bytes(),
            tenants = shared.tokens.as_ref().map_or(0, Vec::len),
            memory_watermark_bytes = shared.memory_watermark_bytes,
            keep_free_bytes = shared.keep_free_bytes,
            "donor serving"
        );
        let reclaim = {
            let sh = Arc::clone(&shared);
            std::thread::Builder::new()
                .name("farmem-donor-reclaim".into())
                .spawn(move || reclaim_loop(&sh))
                .map_err(DonorError::Spawn)?
        };
        let reaper = {
            let sh = Arc::clone(&shared);
            std::thread::Builder::new()
                .name("farmem-donor-reaper".into())
                .spawn(move || reap_loop(&sh))
                .map_err(DonorError::Spawn)?
        };
        let metrics_endpoint = match self.metrics_listener {
            None => None,
            Some(l) => {
                let (m, s) = (Arc::clone(&shared.metrics), Arc::clone(&shared.store));
                Some(
                    MetricsEndpoint::start(l, "farmem-donor-metrics", move || m.render(&s))
                        .map_err(DonorError::Spawn)?,
                )
            }
        };
        let mut threads: Vec<JoinHandle<()>> = Vec::new();
        let result = accept_loop(&shared, &mut threads);
        shared.shutdown();
        // Stops the endpoint (after the scrape it may be answering).
        drop(metrics_endpoint);
        for t in threads {
            let _ = t.join();
        }
        let _ = reaper.join();
        let _ = reclaim.join();
        tracing::info!("donor stopped");
        result
    }

    /// Runs the donor on its own thread.
    pub fn spawn(self) -> RunningDonor {
        let handle = self.shutdown_handle();
        let (local_addr, metrics_addr) = (self.local_addr, self.metrics_addr);
        let store = self.store();
        let control = self.control();
        let thread = std::thread::Builder::new()
            .name("farmem-donor".into())
            .spawn(move || self.run());
        let thread = match thread {
            Ok(t) => Some(t),
            Err(e) => {
                tracing::error!("starting the donor thread failed: {e}");
                None
            }
        };
        RunningDonor {
            handle,
            thread,
            local_addr,
            metrics_addr,
            store,
            control,
        }
    }
}

fn accept_loop(shared: &Arc<Shared>, threads: &mut Vec<JoinHandle<()>>) -> Result<(), DonorError> {
    let Some(listener) = &shared.listener else {
        return Ok(());
    };
    loop {
        let accepted = listener.accept();
        if shared.stop.load(Ordering::Acquire) {
            return Ok(());
        }
        let (stream, peer) = match accepted {
            Ok(x) => x,
            Err(e) => {
                // Transient (out of fds, aborted handshake): log and keep serving.
                tracing::warn!("accept failed: {e}");
                std::thread::sleep(Duration::from_millis(20));
                continue;
            }
        };
        threads.retain(|t| !t.is_finished());
        if threads.len() >= shared.max_connections {
            refuse_full(shared, stream, peer, threads.len());
            continue;
        }
        let id = shared.next_conn.fetch_add(1, Ordering::Relaxed);
        match stream.try_clone() {
            Ok(s) => {
                shared.conns.lock().insert(id, s);
            }
            Err(e) => {
                tracing::warn!(%peer, "refused a connection: cloning its socket failed: {e}");
                continue;
            }
        }
        shared.admit_unauthenticated(id, peer.ip());
        // A shutdown between the flag check and the insert above would miss this socket.
        if shared.stop.load(Ordering::Acquire) {
            let _ = stream.shutdown(std::net::Shutdown::Both);
        }
        let sh = Arc::clone(shared);
        let spawned = std::thread::Builder::new()
            .name("farmem-donor-conn".into())
            .stack_size(CONN_STACK_BYTES)
            .spawn(move || {
                let _guard = ConnGuard::new(Arc::clone(&sh), id);
                Connection::new(Socket::new(stream), Peer::Tcp(peer), id, sh).serve();
            });
        match spawned {
            Ok(t) => threads.push(t),
            Err(e) => {
                tracing::warn!(%peer, "refused a connection: starting its thread failed: {e}");
                shared.conns.lock().remove(&id);
                shared.logins.lock().remove(id);
            }
        }
    }
}

/// Tells a connection that every slot is taken, then closes it.
fn refuse_full(shared: &Shared, stream: TcpStream, peer: SocketAddr, open: usize) {
    let mut frame = Vec::new();
    let message = format!(
        "donor full: {open} connections (the most it serves at once); try again later or use another donor"
    );
    encode_error(
        &mut frame,
        Opcode::Hello as u8,
        0,
        Status::DonorFull,
        &message,
    );
    // The frame fits in any socket buffer: this does not block the accept loop.
    let _ = stream.set_write_timeout(Some(Duration::from_millis(100)));
    let _ = (&stream).write_all(&frame);
    let _ = stream.shutdown(std::net::Shutdown::Both);
    shared.metrics.refused_full();
    shared.note_refusal(Some(peer.ip()), &format!("refused a connection: {message}"));
}

/// Counts a connection open for as long as it lives and unregisters it however its thread ends.
struct ConnGuard {
    shared: Arc<Shared>,
    id: u64,
}

impl ConnGuard {
    fn new(shared: Arc<Shared>, id: u64) -> ConnGuard {
        shared.metrics.connection(true);
        ConnGuard { shared, id }
    }
}

impl Drop for ConnGuard {
    fn drop(&mut self) {
        self.shared.metrics.connection(false);
        self.shared.conns.lock().remove(&self.id);
        self.shared.logins.lock().remove(self.id);
    }
}

fn reap_loop(shared: &Shared) {
    let grace = shared.orphan_grace;
    let tick = (grace / 4).clamp(Duration::from_millis(10), Duration::from_secs(1));
    let mut guard = shared.reaper_lock.lock();
    while !shared.stop.load(Ordering::Acquire) {
        let (clients, slabs) = shared.store.reap_orphans(grace);
        if clients > 0 {
            tracing::info!(clients, slabs, "reaped orphaned slabs");
        }
        let _ = shared.reaper_wake.wait_for(&mut guard, tick);
    }
}

/// Every [`RECLAIM_TICK`], or when woken: reads the host's memory and re-plans what to take back.
fn reclaim_loop(shared: &Shared) {
    let mut guard = shared.reclaim_lock.lock();
    while !shared.stop.load(Ordering::Acquire) {
        MutexGuard::unlocked(&mut guard, || shared.reclaimer.tick(&shared.store));
        let _ = shared.reclaim_wake.wait_for(&mut guard, RECLAIM_TICK);
    }
}

/// A donor running on its own thread. Dropping it stops the donor too.
pub struct RunningDonor {
    handle: ShutdownHandle,
    thread: Option<JoinHandle<Result<(), DonorError>>>,
    local_addr: SocketAddr,
    metrics_addr: Option<SocketAddr>,
    store: Arc<SlabStore>,
    control: DonorControl,
}

impl RunningDonor {
    /// The owner's control over the donor (its capacity).
    pub fn control(&self) -> DonorControl {
        self.control.clone()
    }

    /// The address the donor listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// The metrics endpoint's address, if any.
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics_addr
    }

    /// A handle that stops the donor.
    pub fn shutdown_handle(&self) -> ShutdownHandle {
        self.handle.clone()
    }

    /// The slab store (slabs, owners, activity tags), for inspection.
    pub fn store(&self) -> Arc<SlabStore> {
        Arc::clone(&self.store)
    }

    /// Stops the donor and waits for it to finish.
    pub fn stop(mut self) -> Result<(), DonorError> {
        self.stop_inner()
    }

    fn stop_inner(&mut self) -> Result<(), DonorError> {
        self.handle.shutdown();
        match self.thread.take() {
            Some(t) => t.join().map_err(|_| DonorError::Panicked)?,
            None => Ok(()),
        }
    }
}

impl Drop for RunningDonor {
    fn drop(&mut self) {
        if let Err(e) = self.stop_inner() {
            tracing::error!("donor stopped with an error: {e}");
        }
    }
}

/// A donor without sockets: it serves client sessions handed to it as byte streams
/// ([`SessionDonor::serve`]), each on the calling thread, with the request handling of a
/// [`DonorServer`]'s connections (the same code), against a store of its own. For in-process
/// use: the donor fuzz target, tests.
///
/// A session has no clock: its reads return bytes or the end of the stream, so the HELLO and
/// stall timeouts, which bound socket reads, do not apply; its service times are not measured
/// (recorded as zero); and a session's course depends on its bytes alone (and on the host's free
/// memory when ALLOC_SLAB checks the memory watermark, unless that is 0). Sessions are not counted against the connection limits, which are about sockets.
/// There is no reaper thread: the slabs of clients disconnected longer than the orphan grace are
/// freed when a session ends.
pub struct SessionDonor {
    shared: Arc<Shared>,
    plan: Arc<Plan>,
}

impl SessionDonor {
    /// Checks the configuration as [`DonorServer::bind`] does (its `listen`, `insecure` and
    /// `metrics_listen` are not used) and binds nothing.
    pub fn new(cfg: DonorConfig) -> Result<SessionDonor, DonorError> {
        let plan = Plan::check(&cfg)?;
        let shared = Arc::new(plan.shared(Arc::new(Metrics::new()), None));
        Ok(SessionDonor {
            shared,
            plan: Arc::new(plan),
        })
    }

    /// The same donor with nothing lent: the same configuration and counters, an empty store
    /// (whose slab ids start again at 1). Cheap (no check of the host, no socket): a fuzz target
    /// runs each input against one, so that what an input does never depends on the inputs
    /// before it.
    pub fn with_empty_store(&self) -> SessionDonor {
        SessionDonor {
            shared: Arc::new(self.plan.shared(Arc::clone(&self.shared.metrics), None)),
            plan: Arc::clone(&self.plan),
        }
    }

    /// Serves one client session over `stream` (the client's bytes are read from it, the
    /// donor's answers written to it and flushed) until the stream ends or the session breaks
    /// the protocol, exactly as a connection accepted by a [`DonorServer`] is served. Then frees
    /// the slabs of clients disconnected longer than the orphan grace (with a zero grace, the
    /// slabs this session's client held, unless another session still holds the client).
    pub fn serve<S: Read + Write>(&self, stream: S) {
        let id = self.shared.next_conn.fetch_add(1, Ordering::Relaxed);
        {
            let _guard = ConnGuard::new(Arc::clone(&self.shared), id);
            Connection::new(
                Stream::new(stream),
                Peer::InProcess,
                id,
                Arc::clone(&self.shared),
            )
            .serve();
        }
        let (clients, slabs) = self.shared.store.reap_orphans(self.shared.orphan_grace);
        if clients > 0 {
            tracing::info!(clients, slabs, "reaped orphaned slabs");
        }
    }

    /// The slab store (slabs, owners, activity tags), for inspection.
    pub fn store(&self) -> Arc<SlabStore> {
        Arc::clone(&self.shared.store)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_configurations_are_refused_with_the_reason() {
        let base = DonorConfig {
            listen: "127.0.0.1:0".into(),
            capacity_bytes: 1 << 20,
            slab_size_bytes: 64 << 10,
            ..DonorConfig::default()
        };
        let err = |cfg: DonorConfig| match DonorServer::bind(cfg) {
            Err(e) => e.to_string(),
            Ok(_) => panic!("configuration accepted"),
        };
        assert!(err(DonorConfig {
            slab_size_bytes: 1000,
            ..base.clone()
        })
        .contains("multiple of the page size"));
        assert!(err(DonorConfig {
            capacity_bytes: 4096,
            ..base.clone()
        })
        .contains("smaller than one slab"));
        assert!(err(DonorConfig {
            quota_bytes: Some(4096),
            ..base.clone()
        })
        .contains("quota"));
        assert!(err(DonorConfig {
            token: Some(Vec::new()),
            ..base.clone()
        })
        .contains("token is empty"));
        assert!(err(DonorConfig {
            hello_timeout: Duration::ZERO,
            ..base.clone()
        })
        .contains("HELLO timeout is zero"));
        assert!(err(DonorConfig {
            stall_timeout: Duration::ZERO,
            ..base.clone()
        })
        .contains("stall timeout is zero"));
        let total = host::mem_total_bytes().expect("/proc/meminfo has MemTotal");
        let e = err(DonorConfig {
            capacity_bytes: total + (64 << 10),
            ..base.clone()
        });
        assert!(e.contains("--capacity") && e.contains("MemTotal"), "{e}");
        let tenant = |name: &str, token: &[u8]| Tenant {
            name: name.into(),
            token: token.to_vec(),
            quota_bytes: None,
            max_connections: None,
        };
        assert!(err(DonorConfig {
            tenants: vec![tenant("a", b"x"), tenant("a", b"y")],
            ..base.clone()
        })
        .contains("two tenants are named a"));
        assert!(err(DonorConfig {
            tenants: vec![tenant("a", b"x"), tenant("b", b"x\n")],
            ..base.clone()
        })
        .contains("same token"));
        assert!(err(DonorConfig {
            tenants: vec![tenant("a", b"x")],
            token: Some(b"y".to_vec()),
            ..base.clone()
        })
        .contains("both a token and tenants"));
        // Refused before anything is bound (tests never listen beyond loopback).
        assert!(err(DonorConfig {
            listen: "0.0.0.0:0".into(),
            ..base.clone()
        })
        .contains("refusing to listen"));
    }

    #[test]
    fn debug_output_hides_the_token() {
        let cfg = DonorConfig {
            token: Some(b"hunter2".to_vec()),
            ..DonorConfig::default()
        };
        let text = format!("{cfg:?}");
        assert!(!text.contains("hunter2") && !text.contains("104"), "{text}");
        assert!(text.contains("redacted"));
    }
}
