//! The process tree: one local-memory budget shared by every process started under one
//! `farmem run` (forked children, exec'd programs), like a memory cgroup for the whole tree.
//!
//! Each process has its own paging runtime and its own budget of local pages; together they
//! stay within `--local-mem`. `farmem run` hosts a [`Coordinator`] on a Unix socket; each
//! process's preload library runs a [`TreeClient`] that reports its state every ~50 ms and
//! applies the grant the coordinator gives it. Budget moves to the processes that fault; a
//! process that exits gives its share back at once.
//!
//! ```no_run
//! use farmem_tree::{Admission, Coordinator, Report, TreeClient};
//! let root = std::process::id();
//! let coordinator = Coordinator::start(
//!     "/tmp/farmem-tree.sock".as_ref(),
//!     262_144,
//!     Admission::Descendants { root },
//! )?;
//! let (mut client, grant_pages) =
//!     TreeClient::connect(coordinator.socket_path(), std::process::id(), 1024)?;
//! let newer_grant = client.exchange(Report { used_pages: 10, ..Report::default() })?;
//! # Ok::<(), std::io::Error>(())
//! ```
//!
//! # Design
//! - [`wire`]: the messages (newline-delimited JSON, one typed enum per direction) and the
//!   bounded line buffer both sides read with (pure).
//! - [`policy`]: [`Budget`], who gets how many pages (pure, no I/O, no clocks).
//! - [`membership`]: which connecting processes belong to the tree (by the kernel's pid).
//! - [`coordinator`]: the server: socket, one thread per process, the budget behind a mutex.
//! - [`client`]: what the preload library uses: connect, then a non-blocking exchange.
//!
//! # Limitations
//! A grant is advice the runtime applies by evicting; the coordinator cannot take pages from
//! a process that ignores it (it only stops giving it more).
#![forbid(unsafe_code)]

pub mod client;
pub mod coordinator;
pub mod membership;
pub mod policy;
pub mod wire;

/// The least budget of region pages a process of the tree asks for beside its write-back pool
/// (the preload library's `Hello`): `farmem run` refuses a `--local-mem` that cannot hold one.
pub const LEAST_SHARE_BYTES: u64 = 1 << 20;

pub use client::TreeClient;
pub use coordinator::{Coordinator, CoordinatorView, TreeSnapshot};
pub use membership::Admission;
pub use policy::{Budget, ProcessShare};
pub use wire::{Report, ToCoordinator, ToProcess, MAX_LINE_BYTES, TREE_PROTOCOL_VERSION};
