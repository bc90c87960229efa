//! The resident memory of a process tree, sampled from outside: [`TreeRss`] follows a root
//! process and all its descendants and keeps the largest sum of their RSS.
//!
//! The preload library reports each process's own memory (the stats file's `unmanaged`), but a
//! program tree also holds processes farmem does not reach (static binaries, children started
//! after the library removed itself from the environment) and the peak of the whole tree is
//! what the machine must hold. `farmem run` is the natural place to measure it: it is the
//! tree's parent and outside it.
//!
//! # Design
//!
//! - A thread samples every [`SAMPLE_EVERY`]: it lists /proc, reads each process's
//!   `/proc/PID/stat` for its parent, walks the parent links down from the root, and adds up
//!   `VmRSS` (and `RssAnon`) of `/proc/PID/status` of each process found. A process that ends
//!   between the listing and the reads is skipped (so is a zombie: it has no memory).
//! - The sums of each sample are compared with the peaks; [`TreeRss::stop`] ends the thread
//!   and returns the [`TreeRssReport`].
//!
//! # Limitations
//!
//! - Peaks shorter than the sampling period can be missed; processes living less than it may
//!   not be seen at all.
//! - A process reparented to `farmem run` (the tree's subreaper: its parent died first, a
//!   daemon) leaves the tree this samples, which is rooted at COMMAND.
//! - A process that maps the preload library counts as paged; one that does not (statically
//!   linked, setuid, a cleared environment) is listed in [`TreeRssReport::unpaged`] (its name
//!   read at the end, so a process gone by then has none).
//! - Pages shared between processes (shared memory, a forked child's copy-on-write pages) are
//!   counted once per process, as RSS always is.

use std::collections::HashMap;
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::Duration;

use farmem_runtime::UnpagedProcess;
use serde::Serialize;

/// How often [`TreeRss`] samples.
pub const SAMPLE_EVERY: Duration = Duration::from_millis(50);

/// What [`TreeRss`] measured.
#[derive(Clone, Debug, Default, Serialize, PartialEq, Eq)]
pub struct TreeRssReport {
    /// Largest sum of the tree's RSS in one sample.
    pub peak_bytes: u64,
    /// Largest sum of the tree's anonymous RSS in one sample.
    pub peak_anon_bytes: u64,
    /// Distinct processes seen in the tree.
    pub processes_seen: u64,
    /// Samples taken.
    pub samples: u64,
    /// Processes of the tree seen running without the preload library (statically linked,
    /// setuid, or started with a cleared environment): their memory is not paged at all.
    pub unpaged: Vec<UnpagedProcess>,
}

/// What the sampler knows of one process.
#[derive(Default)]
struct Seen {
    /// Its mappings included the preload library at some sample.
    paged: bool,
    /// Samples in a row, from its second, whose mappings did not include the library.
    misses: u32,
    samples: u32,
    peak_rss: u64,
    /// Its command name, read when it is found unpaged (later it may be gone).
    name: String,
}

/// The preload library's file name, as /proc/PID/maps lists it.
const LIBRARY: &str = crate::cmd::run::PRELOAD_LIB;

/// Samples the RSS of a process tree in a thread until stopped.
pub struct TreeRss {
    stop: mpsc::Sender<()>,
    thread: JoinHandle<TreeRssReport>,
}

impl TreeRss {
    /// Starts sampling the tree rooted at `root` (its first sample is taken at once).
    pub fn start(root: u32) -> std::io::Result<TreeRss> {
        let (stop, stopped) = mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("farmem-treemem".into())
            .spawn(move || {
                let mut report = TreeRssReport::default();
                let mut seen: HashMap<u32, Seen> = HashMap::new();
                loop {
                    let s = sample(root);
                    report.samples += 1;
                    report.peak_bytes = report.peak_bytes.max(s.rss_bytes);
                    report.peak_anon_bytes = report.peak_anon_bytes.max(s.anon_bytes);
                    for (pid, rss) in s.pids {
                        let p = seen.entry(pid).or_default();
                        p.samples += 1;
                        p.peak_rss = p.peak_rss.max(rss);
                        // Looked at from its second sample, until the library is seen: a
                        // process caught between `exec` and the loader mapping its libraries
                        // has none yet (a pyenv shim's `env` exec'ing bash was reported as
                        // unpaged, about one run in five), so it takes two misses in a row.
                        if !p.paged && p.samples >= 2 {
                            match has_library(pid) {
                                Some(true) => p.paged = true,
                                Some(false) => {
                                    p.misses += 1;
                                    if p.misses == 2 {
                                        p.name = command_name(pid);
                                    }
                                }
                                None => {}
                            }
                        }
                    }
                    report.processes_seen = seen.len() as u64;
                    match stopped.recv_timeout(SAMPLE_EVERY) {
                        Err(mpsc::RecvTimeoutError::Timeout) => {}
                        _ => break,
                    }
                }
                report.unpaged = seen
                    .into_iter()
                    .filter(|(_, p)| !p.paged && p.misses >= 2)
                    .map(|(pid, p)| UnpagedProcess {
                        pid,
                        name: p.name,
                        peak_rss_bytes: p.peak_rss,
                    })
                    .collect();
                report
                    .unpaged
                    .sort_by_key(|p| std::cmp::Reverse(p.peak_rss_bytes));
                report
            })?;
        Ok(TreeRss { stop, thread })
    }

    /// Takes a last sample, stops the thread and returns what it measured.
    pub fn stop(self) -> TreeRssReport {
        let _ = self.stop.send(());
        self.thread.join().unwrap_or_default()
    }
}

/// One sample of the tree.
#[derive(Debug, Default)]
struct Sample {
    rss_bytes: u64,
    anon_bytes: u64,
    /// Each process with its RSS.
    pids: Vec<(u32, u64)>,
}

/// The process's command name (empty once it is gone).
fn command_name(pid: u32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .map(|n| n.trim().to_string())
        .unwrap_or_default()
}

/// Whether the process maps the preload library (None once it is gone).
fn has_library(pid: u32) -> Option<bool> {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).ok()?;
    Some(maps.contains(LIBRARY))
}

/// The processes of the tree rooted at `root` now (the root first), from /proc's parent
/// links. Empty when the root is gone.
fn tree(root: u32) -> Vec<u32> {
    let mut children: HashMap<u32, Vec<u32>> = HashMap::new();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    for e in dir.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
            continue;
        };
        // Gone since the listing: skipped.
        let Ok(text) = std::fs::read_to_string(e.path().join("stat")) else {
            continue;
        };
        if let Some(st) = farmem_runtime::parse_proc_stat(&text) {
            children.entry(st.ppid).or_default().push(pid);
        }
    }
    if !std::path::Path::new(&format!("/proc/{root}")).exists() {
        return Vec::new();
    }
    let mut out = vec![root];
    let mut i = 0;
    while i < out.len() {
        if let Some(c) = children.get(&out[i]) {
            out.extend(c.iter().copied().filter(|p| *p != root));
        }
        i += 1;
    }
    out
}

/// `VmRSS` and `RssAnon` of /proc/PID/status text, in bytes (0 when absent: a zombie or a
/// kernel thread).
fn rss_of_status(status: &str) -> (u64, u64) {
    let kb = |key: &str| -> u64 {
        status
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
            .map_or(0, |n| n * 1024)
    };
    (kb("VmRSS:"), kb("RssAnon:"))
}

fn sample(root: u32) -> Sample {
    let mut s = Sample::default();
    for pid in tree(root) {
        let Ok(text) = std::fs::read_to_string(format!("/proc/{pid}/status")) else {
            continue; // ended since
        };
        let (rss, anon) = rss_of_status(&text);
        s.rss_bytes += rss;
        s.anon_bytes += anon;
        s.pids.push((pid, rss));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_gives_rss_and_anon() {
        let t = "Name:\tx\nVmHWM:\t 900 kB\nVmRSS:\t     812 kB\nRssAnon:\t 100 kB\nRssFile:\t 712 kB\n";
        assert_eq!(rss_of_status(t), (812 << 10, 100 << 10));
        assert_eq!(rss_of_status("Name:\tx\nState:\tZ (zombie)\n"), (0, 0));
        assert_eq!(rss_of_status("VmRSS:\tlots kB\n"), (0, 0));
    }

    #[test]
    fn a_tree_is_followed_through_its_children() {
        let py = "/usr/bin/python3";
        assert!(
            std::path::Path::new(py).is_file(),
            "{py} is missing: install the Debian package python3"
        );
        let script = format!(
            "sleep 1 & {py} -c 'import time; x = b\"x\" * (50 << 20); time.sleep(1)'; wait"
        );
        let mut child = std::process::Command::new("/bin/sh")
            .args(["-c", &script])
            .spawn()
            .expect("starting sh");
        let t = TreeRss::start(child.id()).expect("starting the sampler");
        let status = child.wait().unwrap();
        let r = t.stop();
        assert!(status.success());
        assert!(r.peak_bytes >= 45 << 20, "the child's 50 MiB: {r:?}");
        assert!(r.peak_anon_bytes >= 45 << 20, "{r:?}");
        assert!(r.processes_seen >= 3, "sh, sleep and python3: {r:?}");
        assert!(r.samples >= 10, "{r:?}");
        // None of them loaded farmem's library.
        assert!(
            r.unpaged
                .iter()
                .any(|p| p.name == "python3" && p.peak_rss_bytes >= 45 << 20),
            "{r:?}"
        );
        // The tree is gone: a sample finds nothing.
        assert!(tree(child.id()).is_empty());
    }
}
