//! Prefetchers and eviction policies for farmem: pure logic, no I/O, no threads, no clocks.
//!
//! The runtime (crates/runtime) and the simulator (crates/sim) drive the same code:
//!
//! - [`evict`]: which resident page leaves next ([`evict::EvictionPolicy`]); `fifo` and `clock`,
//!   both wrapped by [`evict::by_name`] with Leap's eager eviction of prefetched pages.
//! - [`prefetch`]: which pages to bring in after an access ([`prefetch::Prefetcher`]); Leap's
//!   majority-trend prefetcher (per thread or per process) and its rivals.
//! - [`first_touch`]: which never-written pages to map ahead of a thread filling fresh memory
//!   in order (first-touch readahead).
//! - [`ahead_writes`]: whether pages installed ahead of use go in writable or
//!   write-protected, from the share of them the program writes.
//! - [`write_heat`]: which written pages the program keeps writing (sampled
//!   write-protection per chunk), so the evictor keeps them.
//! - [`measures`]: prefetch accuracy, coverage, timeliness and pollution, as Leap defines them,
//!   in one reusable accounting struct.
//!
//! # Design
//!
//! Every policy call is O(1) or amortised O(1) in the number of resident pages (Leap's trend
//! search is O(H_size), a constant): they run on the fault path. Each policy lives in its own
//! file with a `…Config` that implements `Default`.
#![forbid(unsafe_code)]

pub mod ahead_writes;
pub mod evict;
pub mod first_touch;
mod linked;
pub mod measures;

pub mod prefetch;
pub mod write_heat;

/// How a page became resident.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Origin {
    /// Brought in because the program touched it (a fault).
    Demand,
    /// Brought in ahead of use by a prefetcher.
    Prefetch,
}

/// Errors of the policy crate: choosing or configuring a policy.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PolicyError {
    /// The name given matches no policy of that kind.
    #[error("unknown {kind} policy {name:?}: choose one of {known}")]
    UnknownPolicy {
        /// "eviction" or "prefetch".
        kind: &'static str,
        /// The name that was asked for.
        name: String,
        /// The valid names, comma separated.
        known: String,
    },
    /// A configuration value is out of its valid range.
    #[error("invalid {policy} configuration: {reason}")]
    InvalidConfig {
        /// The policy being configured.
        policy: &'static str,
        /// What is wrong and what is accepted.
        reason: String,
    },
}
