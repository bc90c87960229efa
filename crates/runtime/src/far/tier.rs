//! The host tier: a `farmem node`'s memory, shared with this process as memfd slabs
//! ([`crate::slabs::memslabs`]), in front of the donors; placement across the tiers; and the tier
//! thread (`farmem-tier`), which answers the node's requests to give slabs back.
//!
//! # Design
//!
//! - Which node ([`crate::TierMode`]): `Auto` uses the host's node when one listens on the
//!   default socket and takes the connection (one that serves as many as it may, or does not
//!   answer in time, is passed over with a warning); with no node there and no donor named,
//!   the runtime starts a private node
//!   for itself (`farmem node --socket <private dir> --exit-with-parent`, from a keeper thread,
//!   like the embedded TCP donor), so the embedded default pays one copy each way instead of a
//!   loopback TCP round trip per page. `Node(path)`: that node, or an error — but a node that
//!   serves as many connections as it may or does not answer in time is done without, as
//!   `Auto` does without a host's node (`farmem run` checked it before the program started;
//!   it may have filled since, or before a child of the program starts). `Off`: none.
//! - Placement ([`crate::threads::tier`]): a far slab goes to the host tier while the node lends slabs,
//!   then to the donors. A refusal from a full node is remembered for a second, so a full tier
//!   costs one request per second, not one per slab.
//! - Fallback: with no donors, a *host's* node that has no room for this program (full, this
//!   user's share of it used, the host short of memory; not one that went away) would leave evicted pages
//!   nowhere, and the budget would break. The runtime then starts a private node of its own
//!   (once, with one warning saying why; same slab size) and places the slabs the host's node
//!   refuses there ([`MemKind::Fallback`]); the host's node is asked again a second later, so
//!   a program gets its share back when the node has room again.
//! - Write-through (with donors configured): the tier is a write-back cache in front of the
//!   donors. The tier thread gives each memory slab a donor slab and writes the pages written
//!   since their last write-through (a bit a page) in the background, at most
//!   [`WRITE_THROUGH_PAGES`] a round: copied out under the state lock, sealed when pages are
//!   sealed, written without it; a page written again meanwhile is marked again.
//! - Reclaim: the node asks for `n` slabs back (its host is short of memory, or its capacity was
//!   lowered). The tier thread picks the `n` least recently written tier slabs (Valet's
//!   activity-based victims). A slab whose donor copy is complete just lives on the donor from
//!   then on: no copy. Any other is copied into private memory of this process (a *local* slab,
//!   same index, so placements do not change) under the state lock; the write-through then
//!   completes its donor copy and retires it. Without donors, local slabs stay local. Nothing is
//!   lost at any step; the program keeps running.
//! - The node dying loses nothing: the slabs already mapped stay valid (the mappings keep the
//!   memfd pages alive). New slabs then go to the donors; with none, write-back fails with an
//!   error saying so and the pages stay in the write-back pool.
//!
//! # Limitations
//!
//! - The write-through is rate-limited, so right after a burst of evictions some slabs are not
//!   yet complete on their donor; a reclaim then copies those into local memory first.
//! - With donors, the donors hold a copy of everything in the tier (that is what makes a reclaim
//!   free), so they need room for it.
//! - Copying a slab into local memory holds the state lock for the copy (about 10 ms for
//!   64 MiB here): faults wait that long once per slab reclaimed.
//! - Without donors, slabs the node takes back stay in this process's memory, beyond the
//!   budget.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::sync::Mutex;
use farmem_mm::Advice;
use farmem_node::{NodeClient, NodeClientConfig, NodeError, SlabHold, TierSlab};

use crate::config::RuntimeConfig;
use crate::error::RuntimeError;
use crate::slabs::memslabs::MemKind;
use farmem_contract::TierMode;

/// How long a full (or gone) node is not asked for slabs again.
const FULL_RETRY: Duration = Duration::from_secs(1);

/// The host tier this runtime uses.
pub(crate) struct Tier {
    client: NodeClient,
    path: PathBuf,
    /// Until when the node is taken to be full.
    full_until: Mutex<Option<Instant>>,
    /// Holds taken for forks ([`crate::fork`]): mapped here until the fork is done, then alive
    /// while a child maps them.
    holds: Mutex<Vec<SlabHold>>,
    /// Wakes the tier thread when far pages are frozen for a fork: it may sleep for
    /// [`IDLE_WAIT`] while nothing is frozen, and then looks for dead holds every 100 ms.
    kick: (
        crossbeam_channel::Sender<()>,
        crossbeam_channel::Receiver<()>,
    ),
    /// Kept alive for as long as the runtime: dropping it stops a private node.
    _private: Option<crate::embedded::PrivateNode>,
    /// How to start the fallback when this is the host's node and no donor is named.
    fallback_cfg: Option<RuntimeConfig>,
    /// The private node started when the host's node had no room (see the module doc).
    fallback: Mutex<Fallback>,
}

/// The fallback private node, once needed.
enum Fallback {
    /// Not needed yet.
    None,
    /// Started: its client, and the node (stopped when dropped).
    Running(NodeClient, crate::embedded::PrivateNode),
    /// Could not be started (said once); not tried again.
    Failed,
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
            TierMode::Node(path) => match Tier::connect(path, ncfg.clone(), None) {
                Ok(t) => Ok(Some(t.with_fallback(cfg))),
                // `farmem run` checked this node before the program started; one that fills up
                // or stalls since (or before a child of the program starts) must not stop it.
                Err(RuntimeError::Node { source, .. }) if source.is_busy() => {
                    tracing::warn!("not using the node at {}: {source}", path.display());
                    Tier::without_host_node(cfg, ncfg)
                }
                Err(e) => Err(e),
            },
            TierMode::Auto => {
                let path = farmem_node::default_socket_path();
                if path.exists() {
                    match Tier::connect(&path, ncfg.clone(), None) {
                        Ok(t) => return Ok(Some(t.with_fallback(cfg))),
                        // A node socket nobody answers on (a node that died), or one this
                        // user may not use: carry on as if there were none (the message says
                        // which).
                        Err(RuntimeError::Node {
                            source: source @ NodeError::Connect { .. },
                            ..
                        }) => {
                            tracing::warn!("not using the host's tier: {source}");
                        }
                        Err(RuntimeError::Node { source, .. }) if source.is_busy() => {
                            tracing::warn!(
                                "not using the host's tier at {}: {source}",
                                path.display()
                            );
                        }
                        Err(e) => return Err(e),
                    }
                }
                Tier::without_host_node(cfg, ncfg)
            }
        }
    }

    /// With no node to use: none when donors are named, else a private node of this runtime's.
    fn without_host_node(
        cfg: &RuntimeConfig,
        ncfg: NodeClientConfig,
    ) -> Result<Option<Tier>, RuntimeError> {
        if !cfg.donors.is_empty() {
            return Ok(None);
        }
        let private = crate::embedded::PrivateNode::for_runtime(cfg)?;
        let path = private.socket().to_path_buf();
        Tier::connect(&path, ncfg, Some(private)).map(Some)
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
            holds: Mutex::new(Vec::new()),
            kick: crossbeam_channel::bounded(1),
            _private: private,
            fallback_cfg: None,
            fallback: Mutex::new(Fallback::None),
        })
    }

    /// A tier on a node this runtime did not start: without donors it falls back to a private
    /// node when that node has no room (see the module doc). `farmem run`'s private node is
    /// named like the host's, and falls back the same way (harmless: it is this run's alone).
    fn with_fallback(mut self, cfg: &RuntimeConfig) -> Tier {
        if cfg.donors.is_empty() {
            self.fallback_cfg = Some(cfg.clone());
        }
        self
    }

    /// Far pages were frozen for a fork: the tier thread starts looking for dead holds.
    pub(crate) fn frozen(&self) {
        let _ = self.kick.0.try_send(());
    }

    /// Woken by [`Tier::frozen`] (the tier thread waits on it).
    pub(crate) fn kicked(&self) -> &crossbeam_channel::Receiver<()> {
        &self.kick.1
    }

    /// The node's asks for slabs back.
    pub(crate) fn reclaims(&self) -> &crossbeam_channel::Receiver<farmem_node::Reclaim> {
        self.client.reclaims()
    }

    /// Gives tier slab `id` back to the node.
    pub(crate) fn free_slab(&self, id: u32) -> Result<(), NodeError> {
        self.client.free_slab(id)
    }

    pub(crate) fn slab_bytes(&self) -> u64 {
        self.client.info().slab_bytes
    }

    pub(crate) fn capacity_bytes(&self) -> u64 {
        self.client.info().capacity_bytes
    }

    /// Whether the node has ended (its connection is closed).
    pub(crate) fn is_gone(&self) -> bool {
        !self.client.is_alive()
    }

    /// "the host tier (node at PATH)", for messages.
    pub(crate) fn describe(&self) -> String {
        format!("the host tier (node at {})", self.path.display())
    }

    pub(crate) fn socket(&self) -> &Path {
        &self.path
    }

    /// The node connection's socket descriptor (a forked child closes its copy).
    pub(crate) fn socket_fd(&self) -> std::os::fd::RawFd {
        self.client.socket_fd()
    }

    /// Holds tier slabs `ids` (this process's) for a fork: the node punches none of them
    /// while the hold lives, even after FREE. Returns the hold's id.
    pub(crate) fn hold(&self, ids: &[u32]) -> Result<u32, NodeError> {
        let hold = self.client.hold_slabs(ids)?;
        let id = hold.id;
        self.holds.lock().push(hold);
        Ok(id)
    }

    /// The fork hold `id` was taken for is done (in the parent): this process unmaps the
    /// hold, which now lives as long as a child maps it.
    pub(crate) fn fork_done(&self, id: u32) {
        if let Some(h) = self.holds.lock().iter_mut().find(|h| h.id == id) {
            h.unmap();
        }
    }

    /// Forgets dead holds; returns how many live (mapped here, or by a child).
    pub(crate) fn live_holds(&self) -> usize {
        let mut holds = self.holds.lock();
        holds.retain(|h| h.is_mapped() || h.is_alive());
        holds.len()
    }

    /// A new tier slab of at least `len` bytes and its kind, or `None` when the node is full,
    /// under pressure or gone (remembered for [`FULL_RETRY`]) and there is no fallback.
    pub(crate) fn alloc(&self, len: usize) -> Result<Option<(TierSlab, MemKind)>, RuntimeError> {
        if self.full_until.lock().is_some_and(|t| Instant::now() < t) {
            return self.alloc_fallback(len, None);
        }
        match self.client.alloc_slab() {
            Ok(slab) => {
                let id = slab.id;
                self.checked(slab, len, &self.path)
                    .map(|s| Some((s, MemKind::Tier { id })))
            }
            Err(e) if e.is_full() || !self.client.is_alive() => {
                tracing::debug!("{}: no slab: {e}", self.describe());
                *self.full_until.lock() = Some(Instant::now() + FULL_RETRY);
                // A node that went away is not one without room: that is reported as such
                // (write-back fails naming it), not papered over.
                self.alloc_fallback(len, e.is_full().then_some(&e))
            }
            Err(source) => Err(RuntimeError::Node {
                path: self.path.clone(),
                step: "allocating a slab",
                source,
            }),
        }
    }

    /// `slab` if it holds `len` bytes (made ready for use), else the node at `path` broke the
    /// protocol.
    fn checked(&self, slab: TierSlab, len: usize, path: &Path) -> Result<TierSlab, RuntimeError> {
        if slab.mapping.len() < len {
            return Err(RuntimeError::Node {
                path: path.to_path_buf(),
                step: "allocating a slab",
                source: NodeError::Protocol(format!(
                    "the node handed out a slab of {} bytes, not the {len} it announced",
                    slab.mapping.len()
                )),
            });
        }
        slab.mapping.advise(Advice::DontFork);
        Ok(slab)
    }

    /// A slab of the fallback private node, started on the first refusal `why` of the host's
    /// node (see the module doc); `None` without a fallback, or when it is full too.
    fn alloc_fallback(
        &self,
        len: usize,
        why: Option<&NodeError>,
    ) -> Result<Option<(TierSlab, MemKind)>, RuntimeError> {
        let Some(cfg) = &self.fallback_cfg else {
            return Ok(None);
        };
        let mut fallback = self.fallback.lock();
        if matches!(*fallback, Fallback::None) {
            let Some(why) = why else {
                return Ok(None);
            };
            *fallback = match self.start_fallback(cfg) {
                Ok((client, node)) => {
                    tracing::warn!(
                        "{} has no room for this program ({why}); its pages that do not fit go \
                         to a private node of its own (at {}), so its budget holds",
                        self.describe(),
                        node.socket().display()
                    );
                    Fallback::Running(client, node)
                }
                Err(e) => {
                    tracing::warn!(
                        "{} has no room for this program ({why}), and no private node could be \
                         started for it ({e}): evicted pages have nowhere to go",
                        self.describe()
                    );
                    Fallback::Failed
                }
            };
        }
        let Fallback::Running(client, node) = &*fallback else {
            return Ok(None);
        };
        match client.alloc_slab() {
            Ok(slab) => {
                let id = slab.id;
                self.checked(slab, len, node.socket())
                    .map(|s| Some((s, MemKind::Fallback { id })))
            }
            Err(e) if e.is_full() || !client.is_alive() => Ok(None),
            Err(source) => Err(RuntimeError::Node {
                path: node.socket().to_path_buf(),
                step: "allocating a slab of the fallback private node",
                source,
            }),
        }
    }

    /// Starts the fallback private node with the host node's slab size and connects to it.
    fn start_fallback(
        &self,
        cfg: &RuntimeConfig,
    ) -> Result<(NodeClient, crate::embedded::PrivateNode), RuntimeError> {
        let node = crate::embedded::PrivateNode::fallback_for(cfg, self.slab_bytes())?;
        let ncfg = NodeClientConfig {
            thread_hook: cfg.thread_hook.clone(),
            timeout: cfg.request_timeout,
        };
        let client =
            NodeClient::connect(node.socket(), ncfg).map_err(|source| RuntimeError::Node {
                path: node.socket().to_path_buf(),
                step: "connecting to the fallback private node",
                source,
            })?;
        Ok((client, node))
    }
}
