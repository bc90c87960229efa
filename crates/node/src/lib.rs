//! The farmem node: the host tier. One `farmem node` per machine lends idle host memory to every
//! farmem program on it, as memfd slabs shared over a Unix socket (one copy each way, no message
//! per page).
//!
//! ```no_run
//! use farmem_node::{NodeClient, NodeClientConfig, NodeConfig, NodeServer};
//! let node = NodeServer::bind(NodeConfig {
//!     socket_path: "/tmp/farmem-node.sock".into(),
//!     capacity_bytes: 1 << 30,
//!     ..NodeConfig::default()
//! })?
//! .spawn();
//! let client = NodeClient::connect(node.socket_path(), NodeClientConfig::default())?;
//! let slab = client.alloc_slab()?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Design
//! - [`wire`]: the frames (pure, fuzzed).
//! - [`server`]: the node: socket, peers, slabs, capacity, pressure watcher, reclaim.
//! - [`slab`]: a slab's memory: a sealed memfd the node allocates itself (so it is charged to
//!   the node's memory cgroup), and the hole punched when it is freed.
//! - [`hold`]: holds: slabs a forked child may still read are not punched until no process
//!   maps the hold's memfd any more (probed with F_ADD_SEALS(F_SEAL_WRITE)).
//! - [`share`]: each user's share of the slabs (fair among the users that want memory, and
//!   `--max-share-per-uid`).
//! - [`client`]: what the runtime uses: trusted connect, slabs mapped shared, RECLAIM channel,
//!   holds ([`SlabHold`]).
//! - [`child`]: the `farmem node listening on PATH` banner; a node started as a child process.
//! - [`metrics`]: [`NodeStats`] (STATS, `farmem stats --node`) and its Prometheus text.
//!
//! # Limitations
//! The node lends memory on its own host only; the clients choose which slabs to give back.
#![forbid(unsafe_code)]

pub mod child;
pub mod client;
pub mod hold;
pub mod metrics;
pub mod server;
pub mod share;
pub mod slab;
pub mod wire;

pub use child::{child_node_command, ChildNode, ChildNodeCommand, NodeBanner};
pub use client::{
    check_socket_trust, default_socket_path, NodeClient, NodeClientConfig, NodeError, NodeInfo,
    Reclaim, SlabHold, TierSlab, DEFAULT_SOCKET_PATH,
};
pub use metrics::{ClientStats, NodeStats};
pub use server::{
    exit_with_parent, raise_open_files_limit, socket_mode_allowed, NodeConfig, NodeServer,
    NodeServerError, RunningNode, ShutdownHandle, DEFAULT_SLAB_BYTES, DEFAULT_SOCKET_MODE,
    MAX_CLIENTS, MAX_CLIENTS_PER_UID, MAX_HOLDS_PER_CLIENT, MAX_HOLDS_PER_UID,
};
pub use share::{MaxShare, MaxShareError};
