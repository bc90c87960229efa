//! Local memory: one owner for `--local-mem` and how it is shared out between resident region
//! pages (the runtime's budget) and the write-back pool, in one process or in each process of
//! a tree. `farmem run`, the preload library, the runtime and the tree's summary all take the
//! split from here, so they cannot disagree.
//!
//! The pool gets a fifth of local memory, in whole pages, at least [`MIN_POOL_BYTES`] and at
//! most 64 MiB (in a tree at most [`TREE_POOL_BYTES`] each: every process has a pool of its
//! own, and its share of the budget can be small); resident pages get the rest. So a program
//! under farmem uses no more local page memory than the limit a swap-based comparison gives its
//! cgroup.

use farmem_proto::PAGE_SIZE;

const PAGE: u64 = PAGE_SIZE as u64;

/// The smallest resident budget a runtime accepts (16 pages).
pub const MIN_BUDGET_BYTES: u64 = 16 * PAGE;
/// The smallest write-back pool (16 slots).
pub const MIN_POOL_BYTES: u64 = 16 * PAGE;
/// The smallest local memory: the smallest budget and pool.
pub const MIN_LOCAL_BYTES: u64 = MIN_BUDGET_BYTES + MIN_POOL_BYTES;
/// The most pool one process of a tree maps.
pub const TREE_POOL_BYTES: u64 = 4 << 20;
/// The most pool one process maps.
const MAX_POOL_BYTES: u64 = 64 << 20;
/// The pool's share of local memory (one part in this many).
const POOL_FRACTION: u64 = 5;

/// `--local-mem` below [`MIN_LOCAL_BYTES`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("--local-mem of {0} bytes is below the minimum of {MIN_LOCAL_BYTES} bytes")]
pub struct TooLittle(pub u64);

/// One limit on local memory and its split.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LocalMemory {
    total_bytes: u64,
    in_tree: bool,
}

impl LocalMemory {
    /// `total_bytes` of local memory for one process.
    pub fn new(total_bytes: u64) -> Result<LocalMemory, TooLittle> {
        if total_bytes < MIN_LOCAL_BYTES {
            return Err(TooLittle(total_bytes));
        }
        Ok(LocalMemory {
            total_bytes,
            in_tree: false,
        })
    }

    /// The same limit for a process of a tree: its pool is at most [`TREE_POOL_BYTES`].
    pub fn in_tree(self) -> LocalMemory {
        LocalMemory {
            in_tree: true,
            ..self
        }
    }

    /// The whole limit.
    pub fn total_bytes(&self) -> u64 {
        self.total_bytes
    }

    /// The write-back pool's part.
    pub fn pool_bytes(&self) -> u64 {
        let pool = self.fifth_bytes();
        if self.in_tree {
            pool.min(TREE_POOL_BYTES)
        } else {
            pool
        }
    }

    /// The resident region pages' part (the runtime's budget): the limit less a fifth, so the
    /// pool a tree's process maps below its fifth is no resident page more (its share of the
    /// tree's budget, [`LocalMemory::split_pages`], is what binds there).
    pub fn resident_bytes(&self) -> u64 {
        ((self.total_bytes - self.fifth_bytes()) / PAGE) * PAGE
    }

    fn fifth_bytes(&self) -> u64 {
        ((self.total_bytes / POOL_FRACTION).clamp(MIN_POOL_BYTES, MAX_POOL_BYTES) / PAGE) * PAGE
    }

    /// Splits a grant of local pages that changes while a runtime runs (a process's share of
    /// its tree) into `(pool_slots, resident_pages)`: the pool gets the same fifth, at least
    /// the smallest pool and at most `slots`, the slots mapped at start. The resident part may
    /// come out below the runtime's least (it then keeps its least).
    pub fn split_pages(local_pages: u64, slots: u32) -> (u32, u64) {
        let min_pool = MIN_POOL_BYTES / PAGE;
        let pool = (local_pages / POOL_FRACTION).clamp(min_pool, u64::from(slots).max(1));
        (pool as u32, local_pages.saturating_sub(pool))
    }

    /// The pool of a runtime started directly with only a resident budget (not through
    /// `farmem run`): a quarter of it, 1 to 64 MiB.
    pub fn default_pool_bytes(resident_bytes: u64) -> u64 {
        (resident_bytes / 4).clamp(1 << 20, MAX_POOL_BYTES)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(total: u64) -> Option<(u64, u64)> {
        LocalMemory::new(total)
            .ok()
            .map(|l| (l.resident_bytes(), l.pool_bytes()))
    }

    #[test]
    fn local_memory_split_stays_within_the_limit() {
        assert_eq!(split(MIN_LOCAL_BYTES - 1), None);
        assert_eq!(
            split(MIN_LOCAL_BYTES),
            Some((MIN_BUDGET_BYTES, MIN_POOL_BYTES))
        );
        let mib = 1u64 << 20;
        assert_eq!(split(100 * mib), Some((80 * mib, 20 * mib)));
        // The pool is capped at 64 MiB.
        assert_eq!(split(1000 * mib), Some((936 * mib, 64 * mib)));
        for local in [MIN_LOCAL_BYTES, 200_001, 3 * mib + 17, 513 * mib + 4095] {
            let (budget, pool) = split(local).unwrap();
            assert!(budget + pool <= local, "{local}");
            assert!(
                budget >= MIN_BUDGET_BYTES && pool >= MIN_POOL_BYTES,
                "{local}"
            );
            assert_eq!((budget % PAGE, pool % PAGE), (0, 0));
        }
    }

    #[test]
    fn a_changing_grant_shrinks_the_pool_with_it_within_its_slots() {
        // A whole tree budget in one process: the pool mapped at start, as before.
        assert_eq!(LocalMemory::split_pages(12_288, 1024), (1024, 11_264));
        // An idle process trimmed to its least share: a fifth goes to the pool.
        assert_eq!(LocalMemory::split_pages(1280, 1024), (256, 1024));
        // Never below the smallest pool, never above the slots mapped.
        assert_eq!(LocalMemory::split_pages(40, 1024), (16, 24));
        assert_eq!(LocalMemory::split_pages(10, 1024), (16, 0));
        assert_eq!(LocalMemory::split_pages(1 << 30, 16), (16, (1 << 30) - 16));
        for local in [0, 1, 17, 300, 5000, 1 << 20] {
            let (pool, budget) = LocalMemory::split_pages(local, 1024);
            assert!(u64::from(pool) + budget >= local, "{local}");
            assert!((16..=1024).contains(&pool), "{local}");
        }
    }

    #[test]
    fn resident_and_pool_stay_within_the_limit_in_whole_pages() {
        for total in [
            MIN_LOCAL_BYTES,
            1 << 20,
            64 << 20,
            96 << 20,
            1 << 30,
            16 << 30,
            12345678,
        ] {
            let l = LocalMemory::new(total).unwrap();
            for l in [l, l.in_tree()] {
                assert!(l.resident_bytes() + l.pool_bytes() <= total, "{l:?}");
                assert_eq!(l.resident_bytes() % PAGE, 0);
                assert_eq!(l.pool_bytes() % PAGE, 0);
                assert!(l.pool_bytes() >= MIN_POOL_BYTES && l.resident_bytes() >= MIN_BUDGET_BYTES);
            }
        }
        let l = LocalMemory::new(1 << 30).unwrap();
        assert_eq!(l.pool_bytes(), 64 << 20, "a fifth, at most 64 MiB");
        assert_eq!(l.resident_bytes(), (1 << 30) - (64 << 20));
        assert_eq!(l.in_tree().pool_bytes(), TREE_POOL_BYTES);
        assert_eq!(l.in_tree().resident_bytes(), l.resident_bytes());
        let l = LocalMemory::new(100 << 20).unwrap();
        assert_eq!(l.pool_bytes(), 20 << 20);
        assert_eq!(l.resident_bytes(), 80 << 20);
    }

    #[test]
    fn too_little_is_refused_with_the_minimum() {
        let e = LocalMemory::new(MIN_LOCAL_BYTES - 1).unwrap_err();
        assert_eq!(e, TooLittle(MIN_LOCAL_BYTES - 1));
        assert!(e
            .to_string()
            .contains(&format!("minimum of {MIN_LOCAL_BYTES} bytes")));
    }

    #[test]
    fn a_changing_share_splits_the_same_way_within_the_mapped_slots() {
        assert_eq!(LocalMemory::split_pages(1000, 1024), (200, 800));
        assert_eq!(LocalMemory::split_pages(1000, 100), (100, 900));
        assert_eq!(LocalMemory::split_pages(10, 1024), (16, 0));
    }
}
