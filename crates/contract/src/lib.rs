//! The contract between `farmem run`, the preload library, the runtime and `farmem-bench`:
//!
//! - [`run_settings`]: what `farmem run` asks of the library it puts in front of a program;
//! - [`modes`]: the modes those settings name (over budget, host tier, sealing, prefetch
//!   install);
//! - [`local`]: `--local-mem` and its split into resident pages and the write-back pool;
//! - [`stats`]: the counters' snapshot and the stats file the library writes and `farmem run`
//!   and the benchmarks read.
//!
//! A crate of its own so each side reads the other's words without linking the other's code.
#![forbid(unsafe_code)]

pub mod local;
pub mod modes;
pub mod run_settings;
pub mod stats;

pub use local::LocalMemory;
pub use modes::{OverBudget, PrefetchInstall, SealMode, TierMode, UnknownMode};
pub use run_settings::{RunSettings, TREE_BUDGET_SOCKET, TREE_STATS_DIR};
pub use stats::{
    DonorUse, FaultLatency, LatencySummary, PreloadCounters, Stats, StatsFile, StatsSummary,
    TreeProcess, TreeStats, UnmanagedMapping, UnmanagedReport, UnpagedProcess,
};
