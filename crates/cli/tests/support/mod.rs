//! Shared fixtures of the paging-runtime integration tests (runtime_*.rs): the `farmem` binary
//! under test, the runtime configuration they start from, polling the runtime's counters, and
//! stamping pages with data that names its page and round. The donor child process is
//! `donor_support::Donor`.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use farmem_runtime::{Runtime, RuntimeConfig, Stats};

pub const PAGE: usize = 4096;
pub const MIB: usize = 1 << 20;

/// The `farmem` binary under test.
pub fn farmem() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_farmem"))
}

/// The configuration the tests start from: `budget` bytes of local memory, these donors (none:
/// the runtime starts its own child donor, with the binary under test), no prefetching.
pub fn config(budget: usize, donors: Vec<String>) -> RuntimeConfig {
    RuntimeConfig {
        budget_bytes: budget as u64,
        donors,
        farmem_bin: Some(farmem()),
        prefetch: "none".into(),
        ..RuntimeConfig::default()
    }
}

/// Starts a runtime; the test fails if it does not start.
pub fn start(config: RuntimeConfig) -> Arc<Runtime> {
    Runtime::start(config).expect("runtime starts")
}

/// Polls the runtime's counters every `poll` until `done` holds for them or `limit` has passed,
/// and returns the last ones read (the caller checks them).
#[allow(dead_code)] // not used by runtime_prefetch
pub fn wait_for_stats(
    rt: &Runtime,
    limit: Duration,
    poll: Duration,
    done: impl Fn(&Stats) -> bool,
) -> Stats {
    let deadline = Instant::now() + limit;
    loop {
        let s = rt.stats();
        if done(&s) || Instant::now() > deadline {
            return s;
        }
        std::thread::sleep(poll);
    }
}

/// Reads the word at `addr`.
#[allow(dead_code)] // not used by runtime_prefetch, runtime_pool_clean
pub fn read_u64(addr: usize) -> u64 {
    // SAFETY: callers pass addresses inside regions or mappings the test owns and keeps alive.
    unsafe { (addr as *const u64).read_volatile() }
}

/// Writes `v` to the word at `addr`.
#[allow(dead_code)] // used by runtime_fork_failure, runtime_fork_shared only
pub fn write_u64(addr: usize, v: u64) {
    // SAFETY: callers pass addresses inside regions the test owns and keeps alive.
    unsafe { (addr as *mut u64).write_volatile(v) }
}

/// Page stamping: word `w` of page `p` holds a value of `p`, `w`, the round and `salt`, for
/// every `step`-th word of the page.
#[allow(dead_code)] // used by runtime_paging, runtime_pool_clean only
pub struct Stamp {
    pub step: usize,
    pub salt: u64,
}

#[allow(dead_code)] // used by runtime_paging, runtime_pool_clean only
impl Stamp {
    /// The 8-byte word stored at word `w` of page `p` in round `r`.
    pub fn word(&self, p: usize, w: usize, r: u64) -> u64 {
        ((p as u64) << 32) ^ ((w as u64) << 8) ^ r.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ self.salt
    }

    /// Stamps page `p` of the region at `base` with round `r`.
    pub fn write_page(&self, base: usize, p: usize, r: u64) {
        let ptr = (base + p * PAGE) as *mut u64;
        for w in (0..PAGE / 8).step_by(self.step) {
            // SAFETY: inside a live region owned by the test.
            unsafe { ptr.add(w).write_volatile(self.word(p, w, r)) };
        }
    }

    /// Fails the test unless page `p` of the region at `base` holds round `r`'s stamp.
    pub fn check_page(&self, base: usize, p: usize, r: u64) {
        let ptr = (base + p * PAGE) as *const u64;
        for w in (0..PAGE / 8).step_by(self.step) {
            // SAFETY: inside a live region owned by the test.
            let v = unsafe { ptr.add(w).read_volatile() };
            assert_eq!(v, self.word(p, w, r), "page {p} word {w} round {r}");
        }
    }
}

/// The word stamped at both ends of page `p` in round `r` by `fill` (the last one `^ 0xff`).
#[allow(dead_code)] // used by runtime_fork_failure, runtime_fork_shared only
pub fn word(p: usize, r: u64) -> u64 {
    ((p as u64) << 20) ^ r.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1
}

/// Stamps the first and last word of each of the `pages` pages at `base` with round `r`.
#[allow(dead_code)] // used by runtime_fork_failure, runtime_fork_shared only
pub fn fill(base: usize, pages: usize, r: u64) {
    for p in 0..pages {
        write_u64(base + p * PAGE, word(p, r));
        write_u64(base + p * PAGE + PAGE - 8, word(p, r) ^ 0xff);
    }
}

/// Number of pages whose two stamped words are not round `r`'s (allocation-free: used in
/// forked children).
#[allow(dead_code)] // used by runtime_fork_failure, runtime_fork_shared only
pub fn mismatches(base: usize, pages: usize, r: u64) -> usize {
    (0..pages)
        .filter(|p| {
            read_u64(base + p * PAGE) != word(*p, r)
                || read_u64(base + p * PAGE + PAGE - 8) != word(*p, r) ^ 0xff
        })
        .count()
}
