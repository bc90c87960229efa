//! Runtimes for tests: the configuration they start from, starting one, polling its counters.

use std::sync::Arc;
use std::time::{Duration, Instant};

use farmem_runtime::{Runtime, RuntimeConfig, Stats};

use crate::bins::farmem;

/// The configuration the tests start from: `budget` bytes of local memory, these donors (none:
/// the runtime starts its own child donor, with the `farmem` binary under test, which must then
/// be built), no prefetching.
pub fn config(budget: usize, donors: Vec<String>) -> RuntimeConfig {
    RuntimeConfig {
        budget_bytes: budget as u64,
        farmem_bin: donors.is_empty().then(farmem),
        donors,
        prefetch: "none".into(),
        ..RuntimeConfig::default()
    }
}

/// Starts a runtime; the test fails if it does not start.
pub fn start(config: RuntimeConfig) -> Arc<Runtime> {
    Runtime::start(config).unwrap_or_else(|e| panic!("the runtime did not start: {e}"))
}

/// Polls the runtime's counters every `poll` until `done` holds for them or `limit` has passed,
/// and returns the last ones read (the caller checks them).
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

/// Waits until the runtime's write-back has stopped sending (no page sent for 100 ms): every
/// page evicted so far is on its donor.
pub fn wait_for_sends_to_settle(rt: &Runtime) {
    let mut last = u64::MAX;
    loop {
        std::thread::sleep(Duration::from_millis(100));
        let sent = rt.stats().evicted_sent_dirty;
        if sent == last {
            return;
        }
        last = sent;
    }
}
