//! The host tier: a `farmem node`'s memory, shared with this process as memfd slabs
//! ([`crate::memslabs`]), in front of the donors; placement across the tiers; and the tier
//! thread (`farmem-tier`), which answers the node's requests to give slabs back.
//!
//! # Design
//!
//! - Which node ([`crate::TierMode`]): `Auto` uses the host's node when one listens on the
//!   default socket; with no node there and no donor named, the runtime starts a private node
//!   for itself (`farmem node --socket <private dir> --exit-with-parent`, from a keeper thread,
//!   like the embedded TCP donor), so the embedded default pays one copy each way instead of a
//!   loopback TCP round trip per page. `Node(path)`: that node, or an error. `Off`: none.
//! - Placement ([`Shared::place`]): a far slab goes to the host tier while the node lends slabs,
//!   then to the donors. A refusal from a full node is remembered for a second, so a full tier
//!   costs one request per second, not one per slab.
//! - Reclaim: the node asks for `n` slabs back (its host is short of memory, or its capacity was
//!   lowered). The tier thread picks the `n` least recently written tier slabs, copies each into
//!   private memory of this process (a *local* slab, same index, so placements do not change)
//!   under the state lock, and frees the tier slab. With donors configured, local slabs are then
//!   moved on to a donor in the background: copied out under the lock, written (sealed, if
//!   pages are sealed) without it, and switched over only if no write reached the slab
//!   meanwhile, else tried again. Nothing is lost at any step; the program keeps running.
//! - The node dying loses nothing: the slabs already mapped stay valid (the mappings keep the
//!   memfd pages alive). New slabs then go to the donors; with none, write-back fails with an
//!   error saying so and the pages stay in the write-back pool.
//!
//! # Limitations
//!
//! - Tier copies are the only copies: with donors configured, pages are not also written
//!   through to them in the background, so a reclaim costs a copy into local memory and a
//!   migration, not nothing.
//! - Copying a slab into local memory holds the state lock for the copy (about 10 ms for
//!   64 MiB here): faults wait that long once per slab reclaimed.
//! - Without donors, slabs the node takes back stay in this process's memory, beyond the
//!   budget.

use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use farmem_mm::{Advice, Mapping};
use farmem_node::{NodeClient, NodeClientConfig, NodeError, TierSlab};
use farmem_transport::PageWrite;
use parking_lot::Mutex;

use crate::far::Home;
use crate::memslabs::MemKind;
use crate::shared::Shared;
use crate::{RuntimeConfig, RuntimeError, TierMode, PAGE_SIZE};

/// How long a full (or gone) node is not asked for slabs again.
const FULL_RETRY: Duration = Duration::from_secs(1);

/// The host tier this runtime uses.
pub(crate) struct Tier {
    client: NodeClient,
    path: PathBuf,
    /// Until when the node is taken to be full.
    full_until: Mutex<Option<Instant>>,
    /// Kept alive for as long as the runtime: dropping it stops a private node.
    _private: Option<crate::embedded::PrivateNode>,
}

impl Tier {
    /// Opens the host tier `cfg.tier` asks for (see the module doc); `None`: no tier.
    pub(crate) fn open(cfg: &RuntimeConfig) -> Result<Option<Tier>, RuntimeError> {
        let ncfg = NodeClientConfig {
            thread_hook: cfg.thread_hook.clone(),
            timeout: cfg.request_timeout,
        };
        match &cfg.tier {
            TierMode::Off => Ok(None),
            TierMode::Node(path) => Tier::connect(path, ncfg, None).map(Some),
            TierMode::Auto => {
                let path = farmem_node::default_socket_path();
                if path.exists() {
                    match Tier::connect(&path, ncfg.clone(), None) {
                        Ok(t) => return Ok(Some(t)),
                        // A node socket nobody answers on (a node that died): carry on as
                        // if there were none.
                        Err(RuntimeError::Node {
                            source: NodeError::Connect { .. },
                            ..
                        }) => {
                            tracing::warn!(
                                "no node answers on {} (a stale socket?): not using the host's \
                                 tier",
                                path.display()
                            );
                        }
                        Err(e) => return Err(e),
                    }
                }
                if !cfg.donors.is_empty() {
                    return Ok(None);
                }
                let private = crate::embedded::PrivateNode::for_runtime(cfg)?;
                let path = private.socket().to_path_buf();
                Tier::connect(&path, ncfg, Some(private)).map(Some)
            }
        }
    }

    fn connect(
        path: &Path,
        cfg: NodeClientConfig,
        private: Option<crate::embedded::PrivateNode>,
    ) -> Result<Tier, RuntimeError> {
        let client = NodeClient::connect(path, cfg).map_err(|source| RuntimeError::Node {
            path: path.to_path_buf(),
            step: "connecting to the node",
            source,
        })?;
        Ok(Tier {
            client,
            path: path.to_path_buf(),
            full_until: Mutex::new(None),
            _private: private,
        })
    }

    pub(crate) fn slab_bytes(&self) -> u64 {
        self.client.info().slab_bytes
    }

    pub(crate) fn capacity_bytes(&self) -> u64 {
        self.client.info().capacity_bytes
    }

    /// "the host tier (node at PATH)", for messages.
    pub(crate) fn describe(&self) -> String {
        format!("the host tier (node at {})", self.path.display())
    }

    pub(crate) fn socket(&self) -> &Path {
        &self.path
    }

    /// A new tier slab of at least `len` bytes, or `None` when the node is full, under
    /// pressure or gone (remembered for [`FULL_RETRY`]).
    fn alloc(&self, len: usize) -> Result<Option<TierSlab>, RuntimeError> {
        if self.full_until.lock().is_some_and(|t| Instant::now() < t) {
            return Ok(None);
        }
        match self.client.alloc_slab() {
            Ok(slab) if slab.mapping.len() >= len => {
                slab.mapping.advise(Advice::DontFork);
                Ok(Some(slab))
            }
            Ok(slab) => Err(RuntimeError::Node {
                path: self.path.clone(),
                step: "allocating a slab",
                source: NodeError::Protocol(format!(
                    "the node handed out a slab of {} bytes, not the {len} it announced",
                    slab.mapping.len()
                )),
            }),
            Err(e) if e.is_full() || !self.client.is_alive() => {
                tracing::debug!("{}: no slab: {e}", self.describe());
                *self.full_until.lock() = Some(Instant::now() + FULL_RETRY);
                Ok(None)
            }
            Err(source) => Err(RuntimeError::Node {
                path: self.path.clone(),
                step: "allocating a slab",
                source,
            }),
        }
    }
}

impl Shared {
    /// Where far page `far` lives and its page index there, placing its slab first if it has
    /// no home yet: in the host tier while the node lends slabs, else on a donor. Called by
    /// the sender only (one placer, so a slab is never placed twice); without the state lock.
    pub(crate) fn place(&self, far: u64) -> Result<(Home, u32), RuntimeError> {
        if let Some(h) = self.far.home(far) {
            return Ok(h);
        }
        let idx = far / self.far.slab_pages;
        let len = self.far.slab_pages as usize * PAGE_SIZE;
        let tier_slab = match &self.far.tier {
            Some(t) => t.alloc(len)?,
            None => None,
        };
        let home = match tier_slab {
            Some(slab) => {
                let mut st = self.state.lock();
                let m = st
                    .mem
                    .insert(slab.mapping, MemKind::Tier { id: slab.id }, idx);
                let home = Home::Memory(m);
                self.far.set_home(idx, Some(home));
                home
            }
            None if self.far.donors.is_empty() => {
                return Err(RuntimeError::NowhereToPlace {
                    tier: self
                        .far
                        .tier
                        .as_ref()
                        .map_or_else(|| "no host tier".into(), Tier::describe),
                })
            }
            None => {
                let home = self.far.alloc_on_donor()?;
                self.far.set_home(idx, Some(home));
                home
            }
        };
        Ok((home, (far % self.far.slab_pages) as u32))
    }
}

/// The tier thread. Runs until shutdown when a tier is used.
pub(crate) fn tier_loop(sh: Arc<Shared>) {
    if let Some(h) = &sh.thread_hook {
        h();
    }
    let Some(tier) = &sh.far.tier else {
        return;
    };
    let mut next_migration = Instant::now();
    let mut backoff = Duration::from_millis(100);
    while !sh.shutdown.load(Ordering::Relaxed) {
        match tier
            .client
            .reclaims()
            .recv_timeout(Duration::from_millis(100))
        {
            Ok(r) => give_back(&sh, tier, r.slabs as usize),
            Err(crossbeam_channel::RecvTimeoutError::Timeout) => {}
            // The node is gone: nothing more will be asked; local slabs may still move on.
            Err(crossbeam_channel::RecvTimeoutError::Disconnected) => {
                std::thread::sleep(Duration::from_millis(100))
            }
        }
        if sh.far.donors.is_empty() || Instant::now() < next_migration {
            continue;
        }
        match migrate_local(&sh) {
            Ok(()) => backoff = Duration::from_millis(100),
            Err(e) => {
                sh.report(
                    format!("moving local slabs on to a donor failed (kept, retrying): {e}"),
                    false,
                );
                next_migration = Instant::now() + backoff;
                backoff = (backoff * 2).min(Duration::from_secs(5));
            }
        }
    }
}

/// Gives `n` tier slabs back to the node: the least recently written, each copied into local
/// memory first (see the module doc).
fn give_back(sh: &Shared, tier: &Tier, n: usize) {
    let mut freed: Vec<(u32, Mapping)> = Vec::new();
    {
        let mut st = sh.state.lock();
        for m in st.mem.least_recently_written_tier(n) {
            let Some(len) = st.mem.get(m).map(|s| s.mapping.len()) else {
                continue;
            };
            let local = match Mapping::anonymous(len) {
                Ok(l) => l,
                Err(e) => {
                    drop(st);
                    sh.report(
                        format!(
                            "the node asked for {n} slabs back, but no local memory could be \
                             mapped to hold them ({e}); they stay in the host tier"
                        ),
                        false,
                    );
                    return;
                }
            };
            local.advise(Advice::DontFork);
            local.advise(Advice::NoHugePage);
            crate::mm::copy_mapping(&local, &st.mem.get(m).expect("looked up").mapping);
            if let Some((old, MemKind::Tier { id })) = st.mem.replace(m, local, MemKind::Local) {
                freed.push((id, old));
            }
        }
    }
    let given = freed.len() as u64;
    for (id, mapping) in freed {
        drop(mapping); // unmapped first: the node punches the slab's pages out on FREE
        if let Err(e) = tier.client.free_slab(id) {
            tracing::warn!("giving tier slab {id} back to the node: {e}");
        }
    }
    tracing::info!("the node asked for {n} slabs back: gave {given}");
    sh.stats.lock().s.tier_reclaimed_slabs += given;
}

/// Moves every local slab on to a donor, oldest written first.
fn migrate_local(sh: &Shared) -> Result<(), RuntimeError> {
    let locals = sh.state.lock().mem.local();
    for m in locals {
        if sh.shutdown.load(Ordering::Relaxed) {
            return Ok(());
        }
        migrate_one(sh, m)?;
    }
    Ok(())
}

/// Tries to switch over a copy this many times before leaving the slab for the next round.
const MIGRATION_TRIES: u32 = 3;

/// Moves local slab `m` to a donor: copy out under the lock, write without it, switch over
/// if nothing wrote the slab meanwhile.
fn migrate_one(sh: &Shared, m: u32) -> Result<(), RuntimeError> {
    let Some(far_slab) = sh.state.lock().mem.get(m).map(|s| s.far_slab) else {
        return Ok(());
    };
    let home = sh.far.alloc_on_donor()?;
    let Home::Donor { donor, slab } = home else {
        return Err(RuntimeError::Internal(
            "a donor placement that is not on a donor",
        ));
    };
    let pages = sh.far.slab_pages;
    let first_far = far_slab * pages;
    for _ in 0..MIGRATION_TRIES {
        let (copy, writes) = {
            let st = sh.state.lock();
            let Some(s) = st.mem.get(m) else {
                return Ok(());
            };
            let mut copy = vec![0u8; pages as usize * PAGE_SIZE];
            for p in 0..pages as u32 {
                crate::mm::with_page_bytes(&s.mapping, p, |b| {
                    copy[p as usize * PAGE_SIZE..][..PAGE_SIZE].copy_from_slice(b)
                });
            }
            (copy, s.writes)
        };
        let mut copy = copy;
        if let Some(sealer) = &sh.far.sealer {
            for (p, page) in copy.chunks_exact_mut(PAGE_SIZE).enumerate() {
                sealer.seal(first_far + p as u64, page);
            }
        }
        for (c, chunk) in copy
            .chunks(farmem_transport::MAX_BATCH_PAGES * PAGE_SIZE)
            .enumerate()
        {
            let base = (c * farmem_transport::MAX_BATCH_PAGES) as u32;
            let writes: Vec<PageWrite<'_>> = chunk
                .chunks_exact(PAGE_SIZE)
                .enumerate()
                .map(|(i, data)| PageWrite {
                    addr: farmem_transport::PageAddr {
                        slab,
                        page: base + i as u32,
                    },
                    data,
                })
                .collect();
            sh.far.write(donor, &writes)?;
        }
        let mut st = sh.state.lock();
        if st.mem.get(m).map(|s| s.writes) != Some(writes) {
            continue; // written meanwhile: copy again
        }
        sh.far.set_home(far_slab, Some(home));
        st.mem.remove(m);
        drop(st);
        let mut s = sh.stats.lock();
        s.s.local_slabs_migrated += 1;
        s.s.bytes_sent += pages * PAGE_SIZE as u64;
        return Ok(());
    }
    Ok(())
}
