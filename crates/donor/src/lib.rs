//! The farmem donor: a memory server that lends slabs of its host's memory to farmem clients
//! over the farmem wire protocol (`farmem-proto`).
//!
//! ```no_run
//! use farmem_donor::{DonorConfig, DonorServer};
//! let donor = DonorServer::bind(DonorConfig {
//!     listen: "127.0.0.1:0".into(),
//!     capacity_bytes: 1 << 30,
//!     ..DonorConfig::default()
//! })?;
//! println!("listening on {}", donor.local_addr());
//! let running = donor.spawn();
//! // ... clients connect to running.local_addr() ...
//! running.stop()?;
//! # Ok::<(), farmem_donor::DonorError>(())
//! ```
//!
//! # Design
//! - [`child`]: a `farmem donor` (or any `farmem` server) child process and its `listening on`
//!   banner.
//! - [`server`]: configuration, binding, accept loop, orphan reaper and shutdown.
//! - `logins`: the slots of connections logging in, and which one a flood evicts.
//! - `slots`: authenticated connections' slots: bounds per client id and tenant, fair shares.
//! - [`loglimit`]: log rate limits per peer address and per tenant, in bounded memory.
//! - `conn`: one thread per connection; request checking and the data path.
//! - [`store`]: slabs, owners, quotas, capacity, activity tags, orphaned clients.
//! - `mem`: the slab memory mappings and the only code touching their bytes (the crate's only
//!   `unsafe`, fenced there).
//! - [`metrics`]: counters, STATS, and the Prometheus text (served by `farmem-metrics`).
//! - [`reclaim`]: taking memory back (Valet): which slabs the donor wants back from which
//!   client, when its owner lowers its capacity ([`DonorControl`]) or its host's free memory
//!   falls below `--keep-free`.
//!
//! [`SessionDonor`] serves client sessions given as byte streams (any `Read + Write`) on the
//! caller's thread, without sockets: the connection code of the server's sockets over an
//! in-memory stream (the fuzz target and tests use it).
//!
//! Memory is committed when a slab page is first written and returned to the operating system
//! when the slab is freed (`munmap`). Slabs belong to a client's reconnect key, registered with
//! its client id by its first connection and proven (not sent) by every later one; several
//! connections may attach to one client, and a client that reconnects within the orphan grace
//! period finds its slabs intact (see [`store`]). [`host`] keeps the capacity within what the
//! machine holds.
//!
//! # Limitations
//! The donor takes memory back only by asking its clients to move slabs away (RECLAIMS); it
//! never moves or drops pages itself. No replication.
#![deny(unsafe_code)]

mod conn;
// The host's memory probes and the child launcher live in farmem-host; re-exported so the
// donor's users keep their paths.
pub use farmem_host::probe as host;
pub mod limits;
mod logins;
pub mod loglimit;
#[allow(unsafe_code)]
mod mem;
pub mod metrics;
mod poll;
pub mod reclaim;
pub mod server;
mod shared;
mod slots;
mod socket;
pub mod store;

pub use farmem_host::child::{
    ChildDonor, ChildDonorCommand, ChildDonorError, ChildServer, ChildServerCommand,
    ChildServerError, DonorBanner, DonorStderr, NotABanner, ServerBanner, ServerStderr,
};
pub use server::{
    DonorConfig, DonorControl, DonorError, DonorServer, RunningDonor, SessionDonor, ShutdownHandle,
    Tenant, HELLO_TIMEOUT, MAX_CONNECTIONS, MAX_CONNS_PER_CLIENT, MAX_UNAUTHENTICATED,
    MAX_UNAUTHENTICATED_PER_SOURCE, REFUSALS_LOGGED_PER_INTERVAL, REFUSAL_LOG_INTERVAL,
    STALL_TIMEOUT, WRITE_TIMEOUT,
};
pub use store::{SlabInfo, SlabStore, TenantQuota};
