//! The resident memory of a whole process tree, measured from outside: a thread sums the
//! anonymous memory of a process and all its descendants every few milliseconds and keeps the
//! peak, so a test can check a budget the way a memory cgroup would see it: anonymous memory
//! only (the page cache of the files the programs read is not theirs to bound), and a page a
//! forked child shares copy-on-write with its parent counted once (`Pss_Anon` of
//! /proc/PID/smaps_rollup, the proportional share; `RssAnon` would count it in each).

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

/// What the sampler saw.
#[derive(Debug, Default, Clone)]
pub struct TreeRss {
    /// Most anonymous resident bytes of the tree at one sample.
    pub peak_anon_bytes: u64,
    /// Processes seen in the tree (pid → command name).
    pub processes: HashMap<u32, String>,
    pub samples: u64,
}

/// Samples the tree under `root` until stopped.
pub struct TreeRssSampler {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<TreeRss>>,
}

impl TreeRssSampler {
    pub fn start(root: u32) -> TreeRssSampler {
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut seen = TreeRss::default();
            while !s.load(Ordering::Relaxed) {
                let mut total = 0;
                for pid in descendants(root) {
                    if let Some((name, anon)) = pss_anon(pid) {
                        total += anon;
                        seen.processes.insert(pid, name);
                    }
                }
                seen.peak_anon_bytes = seen.peak_anon_bytes.max(total);
                seen.samples += 1;
                std::thread::sleep(Duration::from_millis(10));
            }
            seen
        });
        TreeRssSampler {
            stop,
            thread: Some(thread),
        }
    }

    pub fn stop(mut self) -> TreeRss {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.take().unwrap().join().unwrap()
    }
}

impl Drop for TreeRssSampler {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// `root` and every process descending from it now.
pub fn descendants(root: u32) -> Vec<u32> {
    let mut parent: Vec<(u32, u32)> = Vec::new();
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(e.path().join("stat")) else {
            continue;
        };
        // pid (comm) state ppid ...: comm may hold spaces and parentheses.
        let Some(rest) = stat.rfind(')').map(|i| &stat[i + 1..]) else {
            continue;
        };
        if let Some(ppid) = rest.split_whitespace().nth(1).and_then(|p| p.parse().ok()) {
            parent.push((pid, ppid));
        }
    }
    let mut tree: HashSet<u32> = HashSet::from([root]);
    loop {
        let before = tree.len();
        for &(pid, ppid) in &parent {
            if tree.contains(&ppid) {
                tree.insert(pid);
            }
        }
        if tree.len() == before {
            return tree.into_iter().collect();
        }
    }
}

/// A process's command name and its proportional share of anonymous memory, in bytes (None
/// once it is gone).
fn pss_anon(pid: u32) -> Option<(String, u64)> {
    let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).ok()?;
    let rollup = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).ok()?;
    let kb = rollup.lines().find_map(|l| {
        l.strip_prefix("Pss_Anon:")
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
    })?;
    Some((comm.trim().to_string(), kb * 1024))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_childs_memory_counts_in_its_parents_tree() {
        let mut child = std::process::Command::new("sh")
            .args([
                "-c",
                "sh -c 'x=$(head -c 30000000 /dev/zero | tr \"\\\\0\" a); sleep 1' & wait",
            ])
            .spawn()
            .unwrap();
        let sampler = TreeRssSampler::start(child.id());
        child.wait().unwrap();
        let seen = sampler.stop();
        assert!(seen.processes.len() >= 2, "{seen:?}");
        assert!(seen.peak_anon_bytes >= 25 << 20, "{seen:?}");
    }
}
