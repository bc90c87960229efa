//! The process tree of `farmem run`: its private directory (every process's stats file and the
//! budget coordinator's socket) and the tree's account, the stats file `--stats` names.
//!
//! Every process of the program's tree that runs a farmem runtime writes `stats/PID.json` in
//! the tree directory (a [`StatsFile`] of its own, about once a second and at its exit) and
//! takes its share of `--local-mem` from the coordinator (crate farmem-tree) that `farmem run`
//! hosts on `budget.sock`. This module adds them up: the summary line and `--stats` give the
//! tree's totals, with each process's own figures and the coordinator's peak beside them.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::Context;
use farmem_runtime::{
    DonorUse, StatsFile, TreeProcess, TreeStats, UnmanagedReport, TREE_BUDGET_SOCKET,
    TREE_STATS_DIR,
};
use farmem_tree::TreeSnapshot;

use crate::cmd::treemem::TreeRssReport;
use farmem_runtime::PAGE_SIZE;

/// The tree's private directory, removed with everything in it when dropped.
pub struct TreeDir {
    path: PathBuf,
}

impl TreeDir {
    /// Makes a fresh directory (mode 700, an unguessable name, see
    /// [`farmem_fds::dirs::private_dir`]) in the temporary directory.
    pub fn create() -> anyhow::Result<TreeDir> {
        use std::os::unix::fs::DirBuilderExt;
        let path = farmem_fds::dirs::private_dir(&std::env::temp_dir(), "farmem-run-")
            .context("creating the process tree's directory")?;
        let dir = TreeDir { path };
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(dir.stats_dir())
            .with_context(|| format!("creating {}", dir.stats_dir().display()))?;
        Ok(dir)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn socket(&self) -> PathBuf {
        self.path.join(TREE_BUDGET_SOCKET)
    }

    /// Where every process writes its stats file.
    pub fn stats_dir(&self) -> PathBuf {
        self.path.join(TREE_STATS_DIR)
    }

    /// Every process's last stats file ([`processes_in`]).
    pub fn processes(&self, root_pid: u32) -> Vec<StatsFile> {
        processes_in(&self.stats_dir(), root_pid, nix::unistd::geteuid().as_raw())
    }
}

/// The largest stats file read: a process's is a few KiB; a bigger one is not farmem's.
const STATS_FILE_LIMIT: u64 = 4 << 20;

/// Every process's last stats file in `stats_dir` that `owner` owns, the tree's root
/// (`root_pid`, the program `farmem run` started) first, then by pid. Files being rewritten
/// are skipped (they are replaced by rename, so a file read is always whole); so is anything
/// but a regular file (a link or a FIFO planted there is never followed or waited on).
pub fn processes_in(stats_dir: &Path, root_pid: u32, owner: u32) -> Vec<StatsFile> {
    let mut files: Vec<StatsFile> = std::fs::read_dir(stats_dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.path().extension().is_some_and(|x| x == "json"))
        .filter_map(|e| farmem_fds::files::read_owned(&e.path(), owner, STATS_FILE_LIMIT))
        .filter_map(|b| serde_json::from_slice::<StatsFile>(&b).ok())
        .collect();
    files.sort_by_key(|f| (f.pid != root_pid, f.pid));
    files
}

impl Drop for TreeDir {
    fn drop(&mut self) {
        if let Err(e) = farmem_fds::dirs::remove_private_dir(&self.path) {
            tracing::warn!("removing {}: {e}", self.path.display());
        }
    }
}

/// The tree's account: the root's file with the summary replaced by the tree's total, and the
/// tree section. `None` when no process wrote a file.
pub fn account(
    files: &[StatsFile],
    coordinator: Option<&TreeSnapshot>,
    sampled: Option<&TreeRssReport>,
    local_mem: u64,
) -> Option<StatsFile> {
    let root = files.first()?;
    let mut total: Option<farmem_contract::StatsSummary> = None;
    for f in files {
        if let Some(s) = &f.summary {
            match &mut total {
                Some(t) => t.add(s),
                None => total = Some(s.clone()),
            }
        }
    }
    let (peak_local_bytes, overcommitted_bytes) = match coordinator {
        Some(s) => (
            s.peak_total_used_pages * PAGE_SIZE as u64,
            s.overcommitted_pages * PAGE_SIZE as u64,
        ),
        None => (0, 0),
    };
    if let Some(t) = &mut total {
        if files.len() > 1 {
            // Peaks of different processes need not coincide: the coordinator saw the tree's
            // (resident and pooled pages together).
            t.peak_resident_bytes = peak_local_bytes;
            let (budget, pool) = farmem_contract::LocalMemory::new(local_mem)
                .map_or((local_mem, 0), |l| (l.resident_bytes(), l.pool_bytes()));
            t.budget_bytes = budget;
            t.pool_bytes = pool;
        }
    }
    Some(StatsFile {
        pid: root.pid,
        is_final: files.iter().all(|f| f.is_final),
        summary: total,
        preload: root.preload.clone(),
        runtime: root.runtime.clone(),
        unmanaged: unmanaged_total(files),
        tree: Some(TreeStats {
            processes: files
                .iter()
                .map(|f| TreeProcess {
                    pid: f.pid,
                    is_final: f.is_final,
                    summary: f.summary.clone(),
                    unmanaged: f.unmanaged.clone(),
                })
                .collect(),
            peak_local_bytes,
            overcommitted_bytes,
            sampled_peak_rss_bytes: sampled.map_or(0, |s| s.peak_bytes),
            sampled_peak_anon_bytes: sampled.map_or(0, |s| s.peak_anon_bytes),
            unpaged: sampled.map(|s| s.unpaged.clone()).unwrap_or_default(),
        }),
    })
}

/// The processes' memory outside their regions, added up (peaks too: an upper bound of the
/// tree's), with the biggest mappings of all of them.
fn unmanaged_total(files: &[StatsFile]) -> Option<UnmanagedReport> {
    let mut total: Option<UnmanagedReport> = None;
    for u in files.iter().filter_map(|f| f.unmanaged.as_ref()) {
        let t = total.get_or_insert_with(UnmanagedReport::default);
        t.rss_bytes += u.rss_bytes;
        t.peak_rss_bytes += u.peak_rss_bytes;
        t.managed_rss_bytes += u.managed_rss_bytes;
        t.farmem_rss_bytes += u.farmem_rss_bytes;
        t.unmanaged_bytes += u.unmanaged_bytes;
        t.anon_unmanaged_bytes += u.anon_unmanaged_bytes;
        t.peak_unmanaged_bytes += u.peak_unmanaged_bytes;
        t.peak_anon_unmanaged_bytes += u.peak_anon_unmanaged_bytes;
        t.biggest.extend(u.biggest.iter().cloned());
        t.biggest_at_peak.extend(u.biggest_at_peak.iter().cloned());
    }
    if let Some(t) = &mut total {
        for list in [&mut t.biggest, &mut t.biggest_at_peak] {
            list.sort_by_key(|m| std::cmp::Reverse(m.rss_bytes));
            list.truncate(5);
        }
    }
    total
}

/// A donor's health as the runtime words it (`DonorUse::health`), best first.
pub const DONOR_HEALTH: [&str; 3] = ["live", "suspect", "dead"];

/// The worse of two donor healths ([`DONOR_HEALTH`]; a word it lacks counts as worst).
pub fn worse_health<'a>(a: &'a str, b: &'a str) -> &'a str {
    let rank = |h: &str| {
        DONOR_HEALTH
            .iter()
            .position(|x| *x == h)
            .unwrap_or(DONOR_HEALTH.len())
    };
    if rank(b) > rank(a) {
        b
    } else {
        a
    }
}

/// Every donor the processes `running` use, by address: the worst health any of them sees,
/// what they hold there together, the largest capacity it told them.
pub fn donors_in_use(running: &[&farmem_contract::Stats]) -> BTreeMap<String, DonorUse> {
    let mut by_addr: BTreeMap<String, DonorUse> = BTreeMap::new();
    for d in running.iter().flat_map(|s| &s.donors) {
        let e = by_addr.entry(d.addr.clone()).or_insert_with(|| DonorUse {
            addr: d.addr.clone(),
            health: d.health.clone(),
            capacity_bytes: d.capacity_bytes,
            ..DonorUse::default()
        });
        e.health = worse_health(&e.health, &d.health).to_string();
        e.far_slabs += d.far_slabs;
        e.bytes_taken += d.bytes_taken;
        e.capacity_bytes = e.capacity_bytes.max(d.capacity_bytes);
    }
    by_addr
}

/// Writes `file` to `path` atomically, without following a link another user planted there
/// ([`farmem_fds::files::replace`]: mode 0600; an existing path must be this user's regular
/// file).
pub fn write(path: &Path, file: &StatsFile) -> Result<(), farmem_fds::files::FileError> {
    farmem_fds::files::replace(path, |w| {
        serde_json::to_writer(&mut *w, file)?;
        w.write_all(b"\n")
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use farmem_contract::StatsSummary;

    fn file(pid: u32, faults: u64, is_final: bool) -> StatsFile {
        StatsFile {
            pid,
            is_final,
            summary: Some(StatsSummary {
                faults,
                remote_bytes_in: faults * 4096,
                peak_resident_bytes: 1 << 20,
                budget_bytes: 8 << 20,
                ..StatsSummary::default()
            }),
            ..StatsFile::default()
        }
    }

    #[test]
    fn the_account_adds_every_process_and_starts_with_the_root() {
        let dir = TreeDir::create().unwrap();
        for f in [file(30, 5, true), file(7, 2, false), file(12, 3, true)] {
            write(&dir.stats_dir().join(format!("{}.json", f.pid)), &f).unwrap();
        }
        std::fs::write(dir.stats_dir().join("99.json"), "{ torn").unwrap();
        let files = dir.processes(12);
        assert_eq!(
            files.iter().map(|f| f.pid).collect::<Vec<_>>(),
            vec![12, 7, 30]
        );
        let acc = account(&files, None, None, 64 << 20).unwrap();
        assert_eq!(acc.pid, 12);
        assert!(!acc.is_final, "one process has not finished");
        let s = acc.summary.unwrap();
        assert_eq!((s.faults, s.remote_bytes_in), (10, 10 * 4096));
        assert_eq!(acc.tree.unwrap().processes.len(), 3);
        assert!(account(&[], None, None, 64 << 20).is_none());
        let path = dir.path().to_path_buf();
        drop(dir);
        assert!(!path.exists(), "the directory goes with the run");
    }
}
