//! How a [`crate::Runtime`] runs: [`RuntimeConfig`]. The split of one local memory limit into
//! the region budget and the write-back pool is farmem-contract's `LocalMemory`.

use crate::error::RuntimeError;
use crate::lentdonors::LentDonors;
use farmem_contract::local::MIN_BUDGET_BYTES;
use farmem_contract::OverBudget;
use farmem_contract::SealMode;
use farmem_contract::TierMode;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use farmem_contract::PrefetchInstall;

/// How a [`crate::Runtime`] runs.
#[derive(Clone)]
pub struct RuntimeConfig {
    /// Bytes of local memory the resident region pages may use.
    pub budget_bytes: u64,
    /// Donor addresses (HOST:PORT); empty → start the embedded local donor (child process).
    pub donors: Vec<String>,
    /// Auth token presented to donors.
    pub token: Option<Vec<u8>>,
    /// Eviction policy name (`farmem_policy::evict::NAMES`), default "fifo".
    pub evict: String,
    /// Prefetcher name (`farmem_policy::prefetch::NAMES`), default "leap" (one stream per
    /// thread); "none" disables prefetching.
    pub prefetch: String,
    /// How prefetched pages are made local: kept in the write-back pool until their first
    /// touch (default) or installed at once except one marker page per window.
    pub prefetch_install: PrefetchInstall,
    /// Run first in every runtime and transport thread.
    pub thread_hook: Option<Arc<dyn Fn() + Send + Sync>>,
    /// Run the fault thread and the evictor on one CPU (default; see docs/architecture.md,
    /// Threads). A forked child's runtime leaves them to the scheduler: the workers of a
    /// process tree, one runtime each, ran slower with theirs pinned.
    pub share_cpu: bool,
    /// The `farmem` binary used to start the embedded donor (else $FARMEM_BIN, else PATH).
    pub farmem_bin: Option<PathBuf>,
    /// Record every fault (time, page, thread, read/write) to this file in farmem-sim's trace
    /// format; complete once [`crate::Runtime::finish_trace`] returns or the runtime is dropped.
    pub record_trace: Option<PathBuf>,
    /// Size of the write-back pool; default budget/4, within 1 MiB..64 MiB.
    pub pool_bytes: Option<u64>,
    /// Capacity the embedded donor lends (default 16 GiB; committed only when written).
    pub embedded_capacity_bytes: u64,
    /// Slab size of the embedded donor (default 64 MiB).
    pub embedded_slab_size_bytes: u64,
    /// Limit for each donor request (transport); default 5 s.
    pub request_timeout: Duration,
    /// Emulated extra link latency per request, µs (transport); default 0.
    pub link_delay_us: u64,
    /// Tries for a demand fetch before the page is poisoned; default 2.
    pub fetch_attempts: u32,
    /// How long a demand fetch whose tries failed still waits while a copy of its page is on
    /// a donor that stalled or was cut off (it may come back with the page); default 60 s.
    pub stall_patience: Duration,
    /// Whether pages are sealed (encrypted and authenticated) before they leave the process;
    /// default [`SealMode::Auto`]: sealed when any donor is on another host.
    pub seal: SealMode,
    /// Whether evicted pages go to the host tier (a `farmem node`'s shared memory) before
    /// donors; default [`TierMode::Auto`].
    pub tier: TierMode,
    /// Copies of every donor slab, on distinct donors; `None`: 2 with two or more donors
    /// configured, else 1.
    pub replicas: Option<usize>,
    /// Also write every page sent to this local file, and read from it when every replica
    /// of a page is gone (the far side's backup file, `far/backup.rs`); created new, removed at the end.
    pub backup_file: Option<PathBuf>,
    /// Most bytes a second re-replication copies between donors (default 256 MiB/s), so a
    /// donor's loss does not take the program's bandwidth.
    pub heal_rate_bytes: u64,
    /// A forked child's runtime: far pages below this are the ones its parent lent it
    /// ([`crate::Lent::floor`]), which it borrows with [`crate::Runtime::borrow`] and never
    /// writes; its own start here. 0 elsewhere.
    pub far_floor: u64,
    /// A forked child's runtime whose parent left pages on donors ([`crate::Lent::donors`]):
    /// it reads them as the parent's client. `None` elsewhere.
    pub lent_donors: Option<LentDonors>,
    /// What happens when write-back fails for good (far memory ran out) with resident pages at
    /// the budget ([`OverBudget`]).
    pub over_budget: OverBudget,
}

impl RuntimeConfig {
    /// The one place the runtime checks its configuration ([`crate::Runtime::start`] calls
    /// it first): the budget's minimum, the prefetcher's name, `fetch_attempts`.
    pub fn validate(&self) -> Result<(), RuntimeError> {
        if self.budget_bytes < MIN_BUDGET_BYTES {
            return Err(RuntimeError::Config(format!(
                "budget {} bytes is below the minimum of {MIN_BUDGET_BYTES} bytes (64 KiB)",
                self.budget_bytes
            )));
        }
        check_prefetch(&self.prefetch).map_err(RuntimeError::Config)?;
        if self.fetch_attempts == 0 {
            return Err(RuntimeError::Config(
                "fetch_attempts must be at least 1".into(),
            ));
        }
        Ok(())
    }
}

/// Whether `name` names a prefetcher (farmem-policy's, or `none`): the one check of the name,
/// used by [`RuntimeConfig::validate`] and by `farmem run` before it starts anything. The
/// error is the policy crate's message.
pub fn check_prefetch(name: &str) -> Result<(), String> {
    farmem_policy::prefetch::by_name(name)
        .map(|_| ())
        .map_err(|e| e.to_string())
}

impl Default for RuntimeConfig {
    fn default() -> Self {
        RuntimeConfig {
            budget_bytes: 256 << 20,
            donors: Vec::new(),
            token: None,
            evict: "fifo".into(),
            prefetch: "leap".into(),
            prefetch_install: PrefetchInstall::Buffer,
            thread_hook: None,
            share_cpu: true,
            farmem_bin: None,
            record_trace: None,
            pool_bytes: None,
            embedded_capacity_bytes: 16 << 30,
            embedded_slab_size_bytes: 64 << 20,
            request_timeout: Duration::from_secs(5),
            link_delay_us: 0,
            fetch_attempts: 2,
            stall_patience: Duration::from_secs(60),
            seal: SealMode::Auto,
            tier: TierMode::Auto,
            replicas: None,
            backup_file: None,
            heal_rate_bytes: 256 << 20,
            far_floor: 0,
            lent_donors: None,
            // The library's default: an embedding program decides; `farmem run` fails.
            over_budget: OverBudget::Allow,
        }
    }
}

impl std::fmt::Debug for RuntimeConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RuntimeConfig")
            .field("budget_bytes", &self.budget_bytes)
            .field("donors", &self.donors)
            .field("evict", &self.evict)
            .field("prefetch", &self.prefetch)
            .field("prefetch_install", &self.prefetch_install)
            .field("share_cpu", &self.share_cpu)
            .field("record_trace", &self.record_trace)
            .field("pool_bytes", &self.pool_bytes)
            .field("seal", &self.seal)
            .field("tier", &self.tier)
            .field("replicas", &self.replicas)
            .field("backup_file", &self.backup_file)
            .field("heal_rate_bytes", &self.heal_rate_bytes)
            .field("over_budget", &self.over_budget)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The message of `validate`'s error, or None when the config is accepted.
    fn refusal(cfg: RuntimeConfig) -> Option<String> {
        cfg.validate().err().map(|e| e.to_string())
    }

    #[test]
    fn validate_accepts_the_default_and_refuses_each_bad_field() {
        assert_eq!(refusal(RuntimeConfig::default()), None);
        let small = refusal(RuntimeConfig {
            budget_bytes: MIN_BUDGET_BYTES - 1,
            ..RuntimeConfig::default()
        });
        assert!(small.is_some_and(|m| m.contains("below the minimum")));
        let unknown = refusal(RuntimeConfig {
            prefetch: "no-such-prefetcher".into(),
            ..RuntimeConfig::default()
        });
        assert!(unknown.is_some_and(|m| m.contains("no-such-prefetcher")));
        let attempts = refusal(RuntimeConfig {
            fetch_attempts: 0,
            ..RuntimeConfig::default()
        });
        assert!(attempts.is_some_and(|m| m.contains("fetch_attempts")));
    }

    #[test]
    fn check_prefetch_knows_the_policy_crates_names_and_none() {
        assert_eq!(check_prefetch("leap"), Ok(()));
        assert_eq!(check_prefetch("none"), Ok(()));
        assert!(check_prefetch("no-such-prefetcher").is_err());
    }
}
