//! Waiting, before each failure that hits a donor, until the programs running have repaired
//! the last one: two copies of every page survive one donor's loss at a time, not a second
//! loss while the first one's copies are still being made. The 60-minute soak (seed
//! 227705834663434) lost a page exactly so: a donor killed while the copies of another
//! one's slabs were still filling onto it after its restart. A fixed gap cannot know how long
//! a heal takes on a loaded machine; the programs' own counters can.
use std::path::Path;
use std::time::{Duration, Instant, SystemTime};

use farmem_contract::StatsFile;

/// A stats file rewritten within this long belongs to a run still going (`farmem run`
/// rewrites `--stats` several times a second).
const FRESH: Duration = Duration::from_secs(3);

/// Waits until no running program in `dir` reports a far slab short of its copies, at most
/// `limit` or until `stop` says so. Returns how long it waited, and whether they were repaired.
pub(crate) fn wait(dir: &Path, limit: Duration, stop: impl Fn() -> bool) -> (Duration, bool) {
    let t0 = Instant::now();
    loop {
        if degraded(dir) == 0 {
            return (t0.elapsed(), true);
        }
        if t0.elapsed() >= limit || stop() {
            return (t0.elapsed(), false);
        }
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// Far slabs short of copies, summed over the runs still going.
fn degraded(dir: &Path) -> u64 {
    let now = SystemTime::now();
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| {
            let name = e.file_name();
            let name = name.to_string_lossy();
            name.starts_with("stats-") && name.ends_with(".json")
        })
        .filter(|e| {
            e.metadata()
                .and_then(|m| m.modified())
                .is_ok_and(|t| now.duration_since(t).unwrap_or_default() < FRESH)
        })
        .filter_map(|e| std::fs::read(e.path()).ok())
        .filter_map(|b| serde_json::from_slice::<StatsFile>(&b).ok())
        .filter(|f| !f.is_final)
        .filter_map(|f| f.summary)
        .map(|s| s.slabs_degraded)
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use farmem_contract::StatsSummary;

    fn write(dir: &Path, name: &str, degraded: u64, is_final: bool) {
        let f = StatsFile {
            is_final,
            summary: Some(StatsSummary {
                slabs_degraded: degraded,
                ..StatsSummary::default()
            }),
            ..StatsFile::default()
        };
        std::fs::write(dir.join(name), serde_json::to_vec(&f).unwrap()).unwrap();
    }

    #[test]
    fn a_running_program_short_of_copies_holds_the_next_failure_back() {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), "stats-Forker-0.json", 0, false);
        write(dir.path(), "stats-Threads-3.json", 0, true);
        assert!(wait(dir.path(), Duration::ZERO, || false).1);
        // An ended run's last file does not count; a running one does.
        write(dir.path(), "stats-Threads-3.json", 4, true);
        assert!(wait(dir.path(), Duration::ZERO, || false).1);
        write(dir.path(), "stats-Forker-0.json", 2, false);
        let (waited, repaired) = wait(dir.path(), Duration::from_millis(300), || false);
        assert!(!repaired && waited >= Duration::from_millis(300));
        assert!(
            !wait(dir.path(), Duration::from_secs(60), || true).1,
            "stopped"
        );
    }
}
