//! This host, for every farmem server and client on it:
//!
//! - [`probe`]: its memory — `MemAvailable` and `MemTotal` from /proc/meminfo, the memory
//!   cgroup's limit — read by the donor and the node to bound what they lend, and by the
//!   runtime to size its embedded donor;
//! - [`child`]: a `farmem` server subcommand (`farmem donor`, `farmem node`) started as a
//!   child process, and the one banner line it prints once it listens.
//!
//! A crate of its own so the runtime starts its embedded donor and private node, and reads the
//! host's memory, without linking the donor server.
#![forbid(unsafe_code)]

pub mod child;
pub mod probe;

pub use child::{
    ChildDonor, ChildDonorCommand, ChildDonorError, ChildServer, ChildServerCommand,
    ChildServerError, DonorBanner, DonorStderr, NotABanner, ServerBanner, ServerStderr,
};
