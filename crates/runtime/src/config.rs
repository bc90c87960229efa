//! How a [`crate::Runtime`] runs: [`RuntimeConfig`], and the split of one local memory limit
//! into the region budget and the write-back pool.

use crate::{OverBudget, SealMode, TierMode};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crate::{PrefetchInstall, PAGE_SIZE};

/// The smallest budget [`crate::Runtime::start`] accepts (16 pages).
pub const MIN_BUDGET_BYTES: u64 = 16 * PAGE_SIZE as u64;

/// The smallest write-back pool (16 slots).
const MIN_POOL_BYTES: u64 = 16 * PAGE_SIZE as u64;

/// The smallest local memory [`split_local_memory`] accepts: the minimum budget and pool.
pub const MIN_LOCAL_BYTES: u64 = MIN_BUDGET_BYTES + MIN_POOL_BYTES;

/// Splits one limit on local memory into the region budget and the write-back pool
/// (`(budget_bytes, pool_bytes)`), so that resident region pages and pool pages together stay
/// within it: the pool gets a fifth, 64 KiB to 64 MiB, in whole pages. `farmem run
/// --local-mem` means this total, so a program under farmem uses no more local page memory
/// than the limit a swap-based comparison gives its cgroup. `None` below [`MIN_LOCAL_BYTES`].
pub fn split_local_memory(local_bytes: u64) -> Option<(u64, u64)> {
    if local_bytes < MIN_LOCAL_BYTES {
        return None;
    }
    let page = PAGE_SIZE as u64;
    let pool = ((local_bytes / POOL_FRACTION).clamp(MIN_POOL_BYTES, 64 << 20) / page) * page;
    let budget = ((local_bytes - pool) / page) * page;
    Some((budget, pool))
}

/// The pool's share of local memory (one part in this many).
const POOL_FRACTION: u64 = 5;

/// Splits a local-page grant that changes while the runtime runs (a process tree's share) into
/// pool slots and region pages, `(pool_slots, budget_pages)`: the pool gets the same fifth as
/// in [`split_local_memory`], at least the smallest pool and at most `slots`, the slots mapped
/// at start. The budget may come out below the runtime's least (it then keeps its least).
pub fn split_local_pages(local_pages: u64, slots: u32) -> (u32, u64) {
    let min_pool = MIN_POOL_BYTES / PAGE_SIZE as u64;
    let pool = (local_pages / POOL_FRACTION).clamp(min_pool, u64::from(slots).max(1));
    (pool as u32, local_pages.saturating_sub(pool))
}

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
    /// of a page is gone ([`crate::backup`]); created new, removed at the end.
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
    pub lent_donors: Option<crate::LentDonors>,
    /// What happens when write-back fails for good (far memory ran out) with resident pages at
    /// the budget ([`OverBudget`]).
    pub over_budget: OverBudget,
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

    #[test]
    fn local_memory_split_stays_within_the_limit() {
        assert_eq!(split_local_memory(MIN_LOCAL_BYTES - 1), None);
        assert_eq!(
            split_local_memory(MIN_LOCAL_BYTES),
            Some((MIN_BUDGET_BYTES, MIN_POOL_BYTES))
        );
        let mib = 1u64 << 20;
        assert_eq!(split_local_memory(100 * mib), Some((80 * mib, 20 * mib)));
        // The pool is capped at 64 MiB.
        assert_eq!(split_local_memory(1000 * mib), Some((936 * mib, 64 * mib)));
        for local in [MIN_LOCAL_BYTES, 200_001, 3 * mib + 17, 513 * mib + 4095] {
            let (budget, pool) = split_local_memory(local).unwrap();
            assert!(budget + pool <= local, "{local}");
            assert!(
                budget >= MIN_BUDGET_BYTES && pool >= MIN_POOL_BYTES,
                "{local}"
            );
            assert_eq!((budget % PAGE_SIZE as u64, pool % PAGE_SIZE as u64), (0, 0));
        }
    }

    #[test]
    fn a_changing_grant_shrinks_the_pool_with_it_within_its_slots() {
        // A whole tree budget in one process: the pool mapped at start, as before.
        assert_eq!(split_local_pages(12_288, 1024), (1024, 11_264));
        // An idle process trimmed to its least share: a fifth goes to the pool.
        assert_eq!(split_local_pages(1280, 1024), (256, 1024));
        // Never below the smallest pool, never above the slots mapped.
        assert_eq!(split_local_pages(40, 1024), (16, 24));
        assert_eq!(split_local_pages(10, 1024), (16, 0));
        assert_eq!(split_local_pages(1 << 30, 16), (16, (1 << 30) - 16));
        for local in [0, 1, 17, 300, 5000, 1 << 20] {
            let (pool, budget) = split_local_pages(local, 1024);
            assert!(u64::from(pool) + budget >= local, "{local}");
            assert!((16..=1024).contains(&pool), "{local}");
        }
    }
}
