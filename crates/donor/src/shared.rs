//! The state the accept loop, the connections, the reaper and the shutdown handles share.

use std::collections::HashMap;
use std::net::{IpAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use farmem_proto::Status;
use parking_lot::{Condvar, Mutex};

use crate::host;
use crate::limits::{REFUSALS_LOGGED_PER_INTERVAL, REFUSAL_LOG_INTERVAL};
use crate::logins::Logins;
use crate::loglimit::{LogKey, LogLimiter, Verdict, LOG_INTERVAL};
use crate::metrics::Metrics;
use crate::reclaim::Reclaimer;
use crate::slots::Slots;
use crate::store::{Refusal, SlabStore};

/// State shared by the accept loop, the connections, the reaper and shutdown handles.
pub(crate) struct Shared {
    pub(crate) store: Arc<SlabStore>,
    pub(crate) metrics: Arc<Metrics>,
    /// Each tenant's token, by tenant index; `None`: an open donor (one tenant, no token).
    pub(crate) tokens: Option<Vec<Vec<u8>>>,
    pub(crate) tenant_names: Vec<String>,
    pub(crate) stop: AtomicBool,
    pub(crate) memory_watermark_bytes: u64,
    /// `--keep-free` (0: none).
    pub(crate) keep_free_bytes: u64,
    pub(crate) meminfo_path: PathBuf,
    /// What the donor wants back, and from whom.
    pub(crate) reclaimer: Reclaimer,
    pub(crate) reclaim_lock: Mutex<()>,
    pub(crate) reclaim_wake: Condvar,
    pub(crate) max_connections: usize,
    /// Connections logging in.
    pub(crate) logins: Mutex<Logins>,
    /// Authenticated connections' slots.
    pub(crate) slots: Slots,
    /// Log rate limits per peer address and per tenant.
    pub(crate) log_limiter: LogLimiter,
    /// Donor-wide logging of unauthenticated failures: when the current interval began, lines
    /// in it, and those not logged.
    pub(crate) refusal_log: Mutex<(Option<Instant>, u64, u64)>,
    pub(crate) hello_timeout: Duration,
    pub(crate) stall_timeout: Duration,
    /// The data listener (`None` for a [`SessionDonor`]).
    pub(crate) listener: Option<TcpListener>,
    pub(crate) conns: Mutex<HashMap<u64, TcpStream>>,
    pub(crate) next_conn: AtomicU64,
    pub(crate) orphan_grace: Duration,
    pub(crate) reaper_lock: Mutex<()>,
    pub(crate) reaper_wake: Condvar,
}

impl Shared {
    /// A connection of `tenant`'s client left; wake the reaper when the grace is zero so it
    /// acts now.
    pub(crate) fn client_left(&self, client: u64, tenant: usize) {
        let orphaned = self.store.disconnect(client);
        if orphaned > 0 && self.allow_log(LogKey::Tenant(tenant)) {
            tracing::info!(
                client,
                slabs = orphaned,
                grace_ms = self.orphan_grace.as_millis() as u64,
                "client disconnected; its slabs are kept for the orphan grace period"
            );
            if self.orphan_grace.is_zero() {
                self.reaper_wake.notify_all();
            }
        }
    }

    /// The refusal ALLOC_SLAB answers while the host is under memory pressure: `MemAvailable`
    /// below the watermark, or below `--keep-free` (then the donor is taking slabs back too).
    pub(crate) fn memory_pressure(&self) -> Option<Refusal> {
        let floor = self.memory_watermark_bytes.max(self.keep_free_bytes);
        if floor == 0 {
            return None;
        }
        let available = host::mem_available_bytes_in(&self.meminfo_path)?;
        if available >= floor {
            return None;
        }
        let message = if available < self.keep_free_bytes {
            format!(
                "donor host short of memory: {available} bytes available, below --keep-free {}; it lends no new slabs and is taking slabs back: use another donor",
                self.keep_free_bytes
            )
        } else {
            format!(
                "donor host under memory pressure: {available} bytes available, below the {}-byte watermark; it lends no new slabs: use another donor",
                self.memory_watermark_bytes
            )
        };
        Some(Refusal {
            status: Status::MemoryPressure,
            message,
        })
    }

    /// Wakes the reclaim thread to re-plan now (the capacity changed, or shutdown).
    pub(crate) fn wake_reclaim(&self) {
        let _g = self.reclaim_lock.lock();
        self.reclaim_wake.notify_all();
    }

    /// Connection `id` completed its handshake from `ip`: it no longer holds a login slot, and
    /// `ip` is known from now on (`logins`).
    pub(crate) fn logged_in(&self, id: u64, ip: Option<IpAddr>) {
        self.logins.lock().authenticated(id, ip);
    }

    /// Whether a log line charged to `key` may be written now (see [`crate::loglimit`]); when
    /// lines of `key` were suppressed before, says how many first.
    pub(crate) fn allow_log(&self, key: LogKey) -> bool {
        match self.log_limiter.check(key) {
            Verdict::Drop => false,
            Verdict::Log { suppressed } => {
                if suppressed > 0 {
                    let who = match key {
                        LogKey::Source(ip) => format!("connections from {ip}"),
                        LogKey::Tenant(t) => format!("tenant {}", self.tenant_names[t]),
                        LogKey::Overflow => "other peers".to_string(),
                    };
                    tracing::warn!(
                        suppressed,
                        "{suppressed} more log lines about {who} were suppressed in the last {} s",
                        LOG_INTERVAL.as_secs()
                    );
                }
                true
            }
        }
    }

    /// Logs a refused, evicted or failed unauthenticated connection from `source` (if known):
    /// within the rate limit of `source`, then donor-wide the first
    /// [`REFUSALS_LOGGED_PER_INTERVAL`] of each [`REFUSAL_LOG_INTERVAL`] in full, the rest only
    /// counted, and their number reported with the first line of the next interval.
    pub(crate) fn note_refusal(&self, source: Option<IpAddr>, what: &str) {
        if let Some(ip) = source {
            if !self.allow_log(LogKey::Source(ip)) {
                return;
            }
        }
        let mut log = self.refusal_log.lock();
        let now = Instant::now();
        if log
            .0
            .is_none_or(|t| now.duration_since(t) >= REFUSAL_LOG_INTERVAL)
        {
            if log.2 > 0 {
                let (full, evicted) = self.metrics.refusals();
                tracing::warn!(
                    not_logged = log.2,
                    refused_full_total = full,
                    evicted_unauthenticated_total = evicted,
                    "{} more refused or failed unauthenticated connections were not logged in the last {} s",
                    log.2,
                    REFUSAL_LOG_INTERVAL.as_secs()
                );
            }
            *log = (Some(now), 0, 0);
        }
        log.1 += 1;
        if log.1 <= REFUSALS_LOGGED_PER_INTERVAL {
            tracing::warn!("{what}");
        } else {
            log.2 += 1;
        }
    }

    /// Gives the new connection `id` from `source` a login slot, evicting (closing) the one
    /// [`Logins::admit`] picks to make room.
    pub(crate) fn admit_unauthenticated(&self, id: u64, source: IpAddr) {
        let victim = self.logins.lock().admit(id, source);
        if let Some(old) = victim {
            if let Some(s) = self.conns.lock().get(&old) {
                let _ = s.shutdown(std::net::Shutdown::Both);
            }
            self.metrics.evicted_unauthenticated();
            self.note_refusal(
                Some(source),
                "closed an unauthenticated connection of the source holding the most login slots to make room for a newer one",
            );
        }
    }

    pub(crate) fn shutdown(&self) {
        if self.stop.swap(true, Ordering::AcqRel) {
            return;
        }
        tracing::info!("donor shutting down");
        // Wakes the blocked accept() (Linux answers it with EINVAL).
        if let Some(l) = &self.listener {
            let _ = rustix::net::shutdown(l, rustix::net::Shutdown::Read);
        }
        for s in self.conns.lock().values() {
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
        {
            let _g = self.reaper_lock.lock();
            self.reaper_wake.notify_all();
        }
        self.wake_reclaim();
    }
}
