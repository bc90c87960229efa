//! The slab store: which slabs exist, who owns them, quotas, capacity, activity tags and the
//! bookkeeping of connected and orphaned clients.
//!
//! # Design
//! One `parking_lot::RwLock` guards the maps (slab id → slab, client id → client state). It is
//! held only for map look-ups and updates, never across socket I/O: the data path resolves a
//! whole batch of page addresses under one read lock into `Arc<Slab>` handles and then does its
//! I/O without the lock. Freeing a slab removes it from the map at once (later requests naming it
//! get `NoSuchSlab`); its memory is unmapped when the last in-flight transfer drops its handle.
//!
//! A client is a client id registered ([`SlabStore::register`]) with a reconnect key by its
//! first connection; its slabs belong to whoever holds that key. Every further connection
//! ([`SlabStore::attach`]) proves the key against its connection's nonce, so another holder of
//! the same auth token cannot take a client's slabs by sending its id, whether the client is
//! connected or orphaned. Several connections may attach to one client at once (they share its
//! slabs); the orphan clock of a client starts when its last connection closes, and an attach
//! within the grace period cancels it. This makes a reconnect work even when the donor has not
//! yet noticed that the old connection died (a half-open TCP connection).
//!
//! Every client belongs to a tenant (the token it authenticated with); a tenant's quota bounds
//! the bytes all its clients hold together, so many client ids cannot take more than it.
//!
//! Activity tag (Valet): every slab records the time of its last write; [`SlabStore::slabs`]
//! exposes it so reclaim can pick the least recently written slab as the migration victim.
use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use farmem_proto::{
    attach_proof, proofs_match, ClientEntry, ClientsReply, ReconnectKey, Status,
    MAX_CLIENTS_LISTED, NONCE_LEN, PAGE_SIZE, PROOF_LEN,
};
use parking_lot::RwLock;

use crate::mem::SlabMemory;

/// One slab: its memory, owner, written-page bitmap and activity tag.
pub struct Slab {
    id: u32,
    owner: u64,
    mem: SlabMemory,
    /// One bit per page: set once the page has been written (committed).
    written: Box<[AtomicU64]>,
    committed_pages: AtomicU64,
    /// The store's committed-bytes total, kept in step with `committed_pages`.
    committed_total: Arc<AtomicU64>,
    /// Nanoseconds since the store's epoch of the last write, plus one; 0 = never written.
    last_write_ns: AtomicU64,
}

impl Drop for Slab {
    fn drop(&mut self) {
        // The memory is unmapped right after this (field drop), so its pages leave the total.
        let pages = self.committed_pages.load(Ordering::Relaxed);
        self.committed_total
            .fetch_sub(pages * PAGE_SIZE as u64, Ordering::Relaxed);
    }
}

impl Slab {
    /// The slab id.
    pub fn id(&self) -> u32 {
        self.id
    }

    /// The owning client id.
    pub fn owner(&self) -> u64 {
        self.owner
    }

    /// The slab's memory.
    pub(crate) fn mem(&self) -> &SlabMemory {
        &self.mem
    }

    /// Pages in the slab.
    pub fn pages(&self) -> u32 {
        self.mem.pages()
    }

    /// Marks `page` written; returns true if this is its first write.
    fn mark_written(&self, page: u32) -> bool {
        let bit = 1u64 << (page % 64);
        let old = self.written[(page / 64) as usize].fetch_or(bit, Ordering::Relaxed);
        if old & bit == 0 {
            self.committed_pages.fetch_add(1, Ordering::Relaxed);
            self.committed_total
                .fetch_add(PAGE_SIZE as u64, Ordering::Relaxed);
            true
        } else {
            false
        }
    }
}

/// A snapshot of one slab, for reclaim decisions and diagnostics.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlabInfo {
    /// Slab id.
    pub id: u32,
    /// Owning client id.
    pub owner: u64,
    /// Bytes of the slab committed (pages written at least once).
    pub committed_bytes: u64,
    /// Activity tag: time since the donor started of the slab's last write; `None` if never written.
    pub last_write: Option<Duration>,
    /// Whether the owner currently has no connection (the slab is waiting out the orphan grace).
    pub orphaned: bool,
}

#[derive(Debug, Default)]
struct ClientState {
    tenant: usize,
    key: Option<ReconnectKey>,
    connections: usize,
    slabs: Vec<u32>,
    used_bytes: u64,
    disconnected_at: Option<Instant>,
    /// Where its last connection came from.
    address: Option<IpAddr>,
    /// What it said it is (IDENT).
    label: Option<String>,
}

#[derive(Default)]
struct Inner {
    slabs: HashMap<u32, Arc<Slab>>,
    clients: HashMap<u64, ClientState>,
    tenant_used: Vec<u64>,
    next_id: u32,
    used_bytes: u64,
}

/// Why a store operation was refused: the status to answer with and a message for the client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// Status code for the response.
    pub status: Status,
    /// Human-readable reason.
    pub message: String,
}

impl Refusal {
    fn new(status: Status, message: String) -> Refusal {
        Refusal { status, message }
    }
}

/// One tenant's use of the donor ([`SlabStore::tenant_use`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TenantUse {
    /// Its name.
    pub name: String,
    /// Its quota, if any.
    pub quota_bytes: Option<u64>,
    /// Bytes its clients hold.
    pub used_bytes: u64,
    /// Its clients, connected or orphaned.
    pub clients: u64,
}

/// A tenant's name and the most bytes its clients may hold together (`None`: no limit beyond
/// capacity).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TenantQuota {
    /// The tenant's name (in messages and logs).
    pub name: String,
    /// Its quota in bytes.
    pub quota_bytes: Option<u64>,
}

/// The donor's slabs and clients. Shared by all connection threads.
pub struct SlabStore {
    slab_size_bytes: u64,
    /// Whole slabs; changed at run time by [`SlabStore::set_capacity_bytes`].
    capacity_bytes: AtomicU64,
    quota_bytes: Option<u64>,
    tenants: Vec<TenantQuota>,
    epoch: Instant,
    committed_bytes: Arc<AtomicU64>,
    inner: RwLock<Inner>,
}

impl SlabStore {
    /// A store lending at most `capacity_bytes` (whole slabs) in slabs of `slab_size_bytes`
    /// (a non-zero multiple of the page size, checked by the caller), `quota_bytes` per client,
    /// with one tenant (index 0) without a quota of its own.
    pub fn new(capacity_bytes: u64, slab_size_bytes: u64, quota_bytes: Option<u64>) -> SlabStore {
        let default = TenantQuota {
            name: "default".into(),
            quota_bytes: None,
        };
        SlabStore::with_tenants(capacity_bytes, slab_size_bytes, quota_bytes, vec![default])
    }

    /// Like [`SlabStore::new`] with the tenants `tenants` (at least one; a client's tenant is
    /// its index in this list).
    pub fn with_tenants(
        capacity_bytes: u64,
        slab_size_bytes: u64,
        quota_bytes: Option<u64>,
        tenants: Vec<TenantQuota>,
    ) -> SlabStore {
        SlabStore {
            slab_size_bytes,
            capacity_bytes: AtomicU64::new(capacity_bytes),
            quota_bytes,
            inner: RwLock::new(Inner {
                next_id: 1,
                tenant_used: vec![0; tenants.len()],
                ..Inner::default()
            }),
            tenants,
            epoch: Instant::now(),
            committed_bytes: Arc::new(AtomicU64::new(0)),
        }
    }

    /// Bytes the clients of tenant `tenant` hold.
    pub fn tenant_used_bytes(&self, tenant: usize) -> u64 {
        self.inner
            .read()
            .tenant_used
            .get(tenant)
            .copied()
            .unwrap_or(0)
    }

    /// Slab size in bytes.
    pub fn slab_size_bytes(&self) -> u64 {
        self.slab_size_bytes
    }

    /// Lendable capacity in bytes.
    pub fn capacity_bytes(&self) -> u64 {
        self.capacity_bytes.load(Ordering::Relaxed)
    }

    /// Sets the capacity to `bytes` rounded down to whole slabs, and returns that. Slabs lent
    /// beyond a lowered capacity stay lent (the donor asks for them back, see `reclaim`); no
    /// new slab is lent until the lent bytes are below the capacity again. The caller checks
    /// that the result is at least one slab.
    pub fn set_capacity_bytes(&self, bytes: u64) -> u64 {
        let whole = bytes / self.slab_size_bytes * self.slab_size_bytes;
        // Under the write lock, so no allocation checks against a capacity half-changed.
        let _inner = self.inner.write();
        self.capacity_bytes.store(whole, Ordering::Relaxed);
        whole
    }

    /// Bytes in allocated slabs.
    pub fn used_bytes(&self) -> u64 {
        self.inner.read().used_bytes
    }

    /// Bytes of slab memory that have been written (pages committed) and not yet returned to
    /// the operating system.
    pub fn committed_bytes(&self) -> u64 {
        self.committed_bytes.load(Ordering::Relaxed)
    }

    /// Number of allocated slabs.
    pub fn slab_count(&self) -> usize {
        self.inner.read().slabs.len()
    }

    /// Number of client ids with at least one open connection.
    pub fn connected_clients(&self) -> usize {
        self.inner
            .read()
            .clients
            .values()
            .filter(|c| c.connections > 0)
            .count()
    }

    /// Open connections of client id `client`.
    pub fn client_connections(&self, client: u64) -> usize {
        self.inner
            .read()
            .clients
            .get(&client)
            .map_or(0, |c| c.connections)
    }

    /// Snapshot of every slab (sorted by id), including its activity tag.
    pub fn slabs(&self) -> Vec<SlabInfo> {
        let inner = self.inner.read();
        let mut out: Vec<SlabInfo> = inner
            .slabs
            .values()
            .map(|s| {
                let t = s.last_write_ns.load(Ordering::Relaxed);
                SlabInfo {
                    id: s.id,
                    owner: s.owner,
                    committed_bytes: s.committed_pages.load(Ordering::Relaxed) * PAGE_SIZE as u64,
                    last_write: (t > 0).then(|| Duration::from_nanos(t - 1)),
                    orphaned: inner
                        .clients
                        .get(&s.owner)
                        .is_none_or(|c| c.connections == 0),
                }
            })
            .collect();
        out.sort_by_key(|s| s.id);
        out
    }

    /// The slab whose last write is oldest (never-written slabs first): the migration victim
    /// Valet's activity-based selection would choose.
    pub fn least_recently_written(&self) -> Option<SlabInfo> {
        self.slabs()
            .into_iter()
            .min_by_key(|s| (s.last_write.unwrap_or(Duration::ZERO), s.id))
    }

    /// A connection of tenant `tenant` registers the new client id `client`, whose slabs will
    /// belong to `key`. Refused with [`Status::ClientIdTaken`] if the id is registered.
    pub fn register(&self, client: u64, tenant: usize, key: ReconnectKey) -> Result<(), Refusal> {
        let mut inner = self.inner.write();
        if inner.clients.contains_key(&client) {
            return Err(Refusal::new(
                Status::ClientIdTaken,
                format!("client id {client} is registered already: attach with its reconnect key, or register another id"),
            ));
        }
        inner.clients.insert(
            client,
            ClientState {
                tenant,
                key: Some(key),
                connections: 1,
                ..ClientState::default()
            },
        );
        Ok(())
    }

    /// A connection of tenant `tenant` attaches to the registered client `client`, proving its
    /// reconnect key with `proof` ([`attach_proof`] of the key, `nonce` and `client`).
    pub fn attach(
        &self,
        client: u64,
        tenant: usize,
        nonce: &[u8; NONCE_LEN],
        proof: &[u8; PROOF_LEN],
    ) -> Result<(), Refusal> {
        let mut inner = self.inner.write();
        let Some(c) = inner.clients.get_mut(&client) else {
            return Err(Refusal::new(
                Status::UnknownClient,
                format!("client id {client} is not registered (its slabs, if any, are gone): register it"),
            ));
        };
        let good = match &c.key {
            Some(key) => proofs_match(&attach_proof(key, nonce, client), proof),
            None => false,
        };
        if !good || c.tenant != tenant {
            return Err(Refusal::new(
                Status::AuthFailed,
                format!("wrong reconnect key for client id {client}"),
            ));
        }
        c.connections += 1;
        if c.disconnected_at.take().is_some() {
            tracing::info!(
                client,
                slabs = c.slabs.len(),
                "client reconnected within the orphan grace period; its slabs are intact"
            );
        }
        Ok(())
    }

    /// Notes where `client`'s latest connection comes from (`None`: in-process).
    pub fn connected_from(&self, client: u64, address: Option<IpAddr>) {
        if let Some(c) = self.inner.write().clients.get_mut(&client) {
            c.address = address;
        }
    }

    /// `client` says what it is (IDENT: a checked label); the last word counts.
    pub fn identify(&self, client: u64, label: &str) {
        if let Some(c) = self.inner.write().clients.get_mut(&client) {
            c.label = Some(label.to_string());
        }
    }

    /// CLIENTS for a client of tenant `tenant`: that tenant's name, use, quota and clients
    /// (sorted by id; at most [`MAX_CLIENTS_LISTED`]). Never another tenant's.
    pub fn clients_of(&self, tenant: usize) -> ClientsReply {
        let inner = self.inner.read();
        let mut clients: Vec<ClientEntry> = inner
            .clients
            .iter()
            .filter(|(_, c)| c.tenant == tenant)
            .map(|(&id, c)| ClientEntry {
                client_id: id,
                connections: u16::try_from(c.connections).unwrap_or(u16::MAX),
                slabs: u32::try_from(c.slabs.len()).unwrap_or(u32::MAX),
                used_bytes: c.used_bytes,
                orphaned: c.connections == 0,
                address: c
                    .address
                    .unwrap_or(IpAddr::V6(std::net::Ipv6Addr::UNSPECIFIED)),
                label: c.label.clone().unwrap_or_default(),
            })
            .collect();
        clients.sort_by_key(|c| c.client_id);
        clients.truncate(MAX_CLIENTS_LISTED);
        let t = self.tenants.get(tenant);
        ClientsReply {
            tenant: t.map_or_else(String::new, |t| t.name.clone()),
            tenant_used_bytes: inner.tenant_used.get(tenant).copied().unwrap_or(0),
            tenant_quota_bytes: t.and_then(|t| t.quota_bytes),
            clients,
        }
    }

    /// Each tenant's name, quota, bytes held and clients (connected or orphaned), for the
    /// metrics endpoint.
    pub fn tenant_use(&self) -> Vec<TenantUse> {
        let inner = self.inner.read();
        self.tenants
            .iter()
            .enumerate()
            .map(|(i, t)| TenantUse {
                name: t.name.clone(),
                quota_bytes: t.quota_bytes,
                used_bytes: inner.tenant_used.get(i).copied().unwrap_or(0),
                clients: inner.clients.values().filter(|c| c.tenant == i).count() as u64,
            })
            .collect()
    }

    /// A connection of `client` closed. Returns the number of slabs now orphaned (0 if the
    /// client still has connections or owns nothing).
    pub fn disconnect(&self, client: u64) -> usize {
        let mut inner = self.inner.write();
        let Some(c) = inner.clients.get_mut(&client) else {
            return 0;
        };
        c.connections = c.connections.saturating_sub(1);
        if c.connections > 0 {
            return 0;
        }
        if c.slabs.is_empty() {
            inner.clients.remove(&client);
            return 0;
        }
        c.disconnected_at = Some(Instant::now());
        c.slabs.len()
    }

    /// Frees the slabs of every client that has been disconnected for at least `grace`.
    /// Returns (clients reaped, slabs freed).
    pub fn reap_orphans(&self, grace: Duration) -> (usize, usize) {
        let now = Instant::now();
        let mut inner = self.inner.write();
        let expired: Vec<u64> = inner
            .clients
            .iter()
            .filter(|(_, c)| {
                c.connections == 0
                    && c.disconnected_at
                        .is_some_and(|t| now.saturating_duration_since(t) >= grace)
            })
            .map(|(id, _)| *id)
            .collect();
        let mut freed = 0;
        for id in &expired {
            let Some(c) = inner.clients.remove(id) else {
                continue;
            };
            for slab in c.slabs {
                if let Some(s) = inner.slabs.remove(&slab) {
                    inner.used_bytes -= self.slab_size_bytes;
                    inner.tenant_used[c.tenant] -= self.slab_size_bytes;
                    drop(s); // unmapped now, or when its last in-flight transfer ends
                    freed += 1;
                }
            }
            tracing::info!(
                client = id,
                "freed the slabs of a client disconnected longer than the orphan grace period"
            );
        }
        (expired.len(), freed)
    }

    /// Allocates a slab for `client`.
    pub fn alloc(&self, client: u64) -> Result<u32, Refusal> {
        let slab_size = self.slab_size_bytes;
        let mut inner = self.inner.write();
        let capacity = self.capacity_bytes();
        if inner.used_bytes + slab_size > capacity {
            return Err(Refusal::new(
                Status::CapacityExhausted,
                format!(
                    "donor capacity exhausted: {} of {capacity} bytes lent; use another donor or free slabs",
                    inner.used_bytes
                ),
            ));
        }
        let (client_used, tenant) = inner
            .clients
            .get(&client)
            .map_or((0, 0), |c| (c.used_bytes, c.tenant));
        let t = &self.tenants[tenant];
        if let Some(quota) = t.quota_bytes {
            let used = inner.tenant_used[tenant];
            if used + slab_size > quota {
                return Err(Refusal::new(
                    Status::QuotaExceeded,
                    format!(
                        "tenant {} quota exceeded: its clients hold {used} of {quota} bytes, a slab is {slab_size}",
                        t.name
                    ),
                ));
            }
        }
        if let Some(quota) = self.quota_bytes {
            if client_used + slab_size > quota {
                return Err(Refusal::new(
                    Status::QuotaExceeded,
                    format!(
                        "client quota exceeded: {client_used} of {quota} bytes used, a slab is {slab_size}"
                    ),
                ));
            }
        }
        let len = usize::try_from(slab_size).map_err(|_| {
            Refusal::new(Status::Internal, "slab size does not fit in memory".into())
        })?;
        let mem = SlabMemory::map(len).map_err(|e| {
            tracing::error!("mapping a {len}-byte slab failed: {e}");
            Refusal::new(Status::Internal, format!("donor could not map a slab: {e}"))
        })?;
        let mut id = inner.next_id;
        while id == 0 || inner.slabs.contains_key(&id) {
            id = id.wrapping_add(1);
        }
        inner.next_id = id.wrapping_add(1);
        let words = (mem.pages() as usize).div_ceil(64);
        let slab = Arc::new(Slab {
            id,
            owner: client,
            mem,
            written: (0..words).map(|_| AtomicU64::new(0)).collect(),
            committed_pages: AtomicU64::new(0),
            committed_total: Arc::clone(&self.committed_bytes),
            last_write_ns: AtomicU64::new(0),
        });
        inner.slabs.insert(id, slab);
        inner.used_bytes += slab_size;
        inner.tenant_used[tenant] += slab_size;
        let c = inner.clients.entry(client).or_default();
        c.slabs.push(id);
        c.used_bytes += slab_size;
        Ok(id)
    }

    /// Frees `client`'s slab `slab`; returns the bytes of it that were committed (they go back
    /// to the operating system now, or when the last transfer still using the slab ends).
    pub fn free(&self, client: u64, slab: u32) -> Result<u64, Refusal> {
        let mut inner = self.inner.write();
        match inner.slabs.get(&slab) {
            Some(s) if s.owner == client => {}
            _ => return Err(no_such_slab(slab)),
        }
        let s = inner.slabs.remove(&slab).expect("checked above");
        let committed = s.committed_pages.load(Ordering::Relaxed) * PAGE_SIZE as u64;
        inner.used_bytes -= self.slab_size_bytes;
        let slab_size = self.slab_size_bytes;
        if let Some(c) = inner.clients.get_mut(&client) {
            c.slabs.retain(|&x| x != slab);
            c.used_bytes -= slab_size;
            let tenant = c.tenant;
            inner.tenant_used[tenant] -= slab_size;
        }
        drop(inner);
        drop(s); // unmapped now, or when its last in-flight transfer ends
        Ok(committed)
    }

    /// Resolves a batch of page addresses of `client` into slab handles (deduplicated into
    /// `slabs`) and `(index into slabs, page)` pairs in `out`. All-or-nothing: on a refusal the
    /// outputs are left cleared.
    pub fn resolve(
        &self,
        client: u64,
        addrs: impl Iterator<Item = farmem_proto::PageAddr>,
        slabs: &mut Vec<Arc<Slab>>,
        out: &mut Vec<(usize, u32)>,
    ) -> Result<(), Refusal> {
        slabs.clear();
        out.clear();
        let inner = self.inner.read();
        for a in addrs {
            let idx = match slabs.iter().rposition(|s| s.id == a.slab) {
                Some(i) => i,
                None => match inner.slabs.get(&a.slab) {
                    Some(s) if s.owner == client => {
                        slabs.push(Arc::clone(s));
                        slabs.len() - 1
                    }
                    _ => {
                        drop(inner);
                        slabs.clear();
                        out.clear();
                        return Err(no_such_slab(a.slab));
                    }
                },
            };
            let pages = slabs[idx].pages();
            if a.page >= pages {
                drop(inner);
                slabs.clear();
                out.clear();
                return Err(Refusal::new(
                    Status::PageOutOfRange,
                    format!(
                        "page {} is outside slab {} (it has {pages} pages)",
                        a.page, a.slab
                    ),
                ));
            }
            out.push((idx, a.page));
        }
        Ok(())
    }

    /// Records that the resolved pages are about to be written: commits them in the bitmaps
    /// and stamps each slab's activity tag.
    pub fn note_writes(&self, slabs: &[Arc<Slab>], pages: &[(usize, u32)]) {
        for &(i, p) in pages {
            slabs[i].mark_written(p);
        }
        let now = self.epoch.elapsed().as_nanos() as u64 + 1;
        for s in slabs {
            s.last_write_ns.fetch_max(now, Ordering::Relaxed);
        }
    }
}

fn no_such_slab(slab: u32) -> Refusal {
    Refusal::new(
        Status::NoSuchSlab,
        format!("slab {slab} does not exist, was freed, or belongs to another client"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use farmem_proto::PageAddr;

    const SLAB: u64 = 16 * PAGE_SIZE as u64;

    #[test]
    fn capacity_quota_and_ownership_are_enforced() {
        let store = SlabStore::new(3 * SLAB, SLAB, Some(2 * SLAB));
        let a1 = store.alloc(1).unwrap();
        let _a2 = store.alloc(1).unwrap();
        assert_eq!(store.alloc(1).unwrap_err().status, Status::QuotaExceeded);
        let b1 = store.alloc(2).unwrap();
        assert_eq!(
            store.alloc(2).unwrap_err().status,
            Status::CapacityExhausted
        );
        assert_eq!(store.free(2, a1).unwrap_err().status, Status::NoSuchSlab);
        let (mut slabs, mut out) = (Vec::new(), Vec::new());
        let err = store
            .resolve(
                1,
                [PageAddr { slab: b1, page: 0 }].into_iter(),
                &mut slabs,
                &mut out,
            )
            .unwrap_err();
        assert_eq!(err.status, Status::NoSuchSlab);
        let err = store
            .resolve(
                1,
                [PageAddr { slab: a1, page: 16 }].into_iter(),
                &mut slabs,
                &mut out,
            )
            .unwrap_err();
        assert_eq!(err.status, Status::PageOutOfRange);
        assert!(slabs.is_empty() && out.is_empty());
        store.free(1, a1).unwrap();
        assert_eq!(store.free(1, a1).unwrap_err().status, Status::NoSuchSlab);
        assert_eq!(store.used_bytes(), 2 * SLAB);
    }

    #[test]
    fn writes_commit_pages_once_and_stamp_the_activity_tag() {
        let store = SlabStore::new(4 * SLAB, SLAB, None);
        let a = store.alloc(7).unwrap();
        let b = store.alloc(7).unwrap();
        let (mut slabs, mut out) = (Vec::new(), Vec::new());
        let addrs = [
            PageAddr { slab: a, page: 1 },
            PageAddr { slab: a, page: 1 },
            PageAddr { slab: a, page: 2 },
        ];
        store
            .resolve(7, addrs.into_iter(), &mut slabs, &mut out)
            .unwrap();
        assert_eq!(slabs.len(), 1);
        store.note_writes(&slabs, &out);
        assert_eq!(store.committed_bytes(), 2 * PAGE_SIZE as u64);
        let infos = store.slabs();
        assert!(infos[0].last_write.is_some());
        assert_eq!(infos[1].last_write, None);
        assert_eq!(store.least_recently_written().unwrap().id, b);
        store.free(7, a).unwrap();
        assert_eq!(
            store.committed_bytes(),
            2 * PAGE_SIZE as u64,
            "still mapped while a transfer holds the slab"
        );
        slabs.clear();
        assert_eq!(store.committed_bytes(), 0);
    }

    #[test]
    fn orphans_are_kept_within_grace_and_reaped_after() {
        let store = SlabStore::new(4 * SLAB, SLAB, None);
        let key = ReconnectKey([3; farmem_proto::KEY_LEN]);
        store.register(5, 0, key.clone()).unwrap();
        let s = store.alloc(5).unwrap();
        assert_eq!(store.disconnect(5), 1);
        assert_eq!(store.reap_orphans(Duration::from_secs(60)), (0, 0));
        let nonce = [9; NONCE_LEN];
        store
            .attach(5, 0, &nonce, &attach_proof(&key, &nonce, 5))
            .unwrap();
        assert_eq!(
            store.reap_orphans(Duration::ZERO),
            (0, 0),
            "connected again"
        );
        store.disconnect(5);
        assert_eq!(store.reap_orphans(Duration::ZERO), (1, 1));
        assert_eq!(store.slab_count(), 0);
        assert_eq!(store.free(5, s).unwrap_err().status, Status::NoSuchSlab);
    }

    #[test]
    fn a_client_id_cannot_be_claimed_without_its_key() {
        let store = SlabStore::new(4 * SLAB, SLAB, None);
        let key = ReconnectKey([1; farmem_proto::KEY_LEN]);
        let thief = ReconnectKey([2; farmem_proto::KEY_LEN]);
        store.register(5, 0, key.clone()).unwrap();
        let err = store.register(5, 0, thief.clone()).unwrap_err();
        assert_eq!(err.status, Status::ClientIdTaken);
        let nonce = [9; NONCE_LEN];
        let err = store
            .attach(5, 0, &nonce, &attach_proof(&thief, &nonce, 5))
            .unwrap_err();
        assert_eq!(err.status, Status::AuthFailed);
        let err = store
            .attach(5, 1, &nonce, &attach_proof(&key, &nonce, 5))
            .unwrap_err();
        assert_eq!(err.status, Status::AuthFailed, "another tenant, right key");
        let err = store
            .attach(6, 0, &nonce, &attach_proof(&key, &nonce, 6))
            .unwrap_err();
        assert_eq!(err.status, Status::UnknownClient);
    }

    #[test]
    fn a_tenant_quota_bounds_all_its_clients_together() {
        let tenants = vec![
            TenantQuota {
                name: "a".into(),
                quota_bytes: Some(2 * SLAB),
            },
            TenantQuota {
                name: "b".into(),
                quota_bytes: Some(2 * SLAB),
            },
        ];
        let store = SlabStore::with_tenants(8 * SLAB, SLAB, None, tenants);
        for id in 1..=33u64 {
            store.register(id, 0, ReconnectKey([id as u8; 32])).unwrap();
        }
        store.register(100, 1, ReconnectKey([100; 32])).unwrap();
        let mut got = 0;
        for id in 1..=33u64 {
            match store.alloc(id) {
                Ok(_) => got += 1,
                Err(r) => assert_eq!(r.status, Status::QuotaExceeded),
            }
        }
        assert_eq!(got, 2, "33 client ids of tenant a hold its quota, no more");
        assert_eq!(store.tenant_used_bytes(0), 2 * SLAB);
        store.alloc(100).unwrap();
        store.alloc(100).unwrap();
        assert_eq!(store.alloc(100).unwrap_err().status, Status::QuotaExceeded);
    }
}
