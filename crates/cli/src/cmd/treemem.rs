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
//! - A thread samples every [`SAMPLE_EVERY`]: it lists /proc, walks the parent links down
//!   from the root, and adds up `VmRSS` (and `RssAnon`) of `/proc/PID/status` of each process
//!   found. A process that ends between the listing and the reads is skipped (so is a zombie:
//!   it has no memory).
//! - The parent links are kept between samples ([`Procs`]): a sample reads `/proc/PID/stat`
//!   only for a process it has not seen (its /proc entry's inode number is new: a pid reused
//!   by another process gets another) and for one whose parent has gone (it was reparented,
//!   maybe to a subreaper in the tree). Reading every process's stat on every sample cost
//!   `farmem run` 22% of a CPU on a machine running 1 073 processes (3% with 68), whatever the
//!   size of the tree; the listing alone is a fraction of that. The tree's own processes
//!   refresh their parent from the status read for their RSS.
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
use std::os::unix::fs::DirEntryExt;
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::Duration;

use farmem_contract::UnpagedProcess;
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
const LIBRARY: &str = crate::cmd::preload::PRELOAD_LIB;

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
                let mut procs = Procs::default();
                loop {
                    let s = sample(&mut procs, root);
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

/// A process /proc lists, as [`Procs`] keeps it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Known {
    /// The inode number of its /proc entry (another process with the same pid has another).
    ino: u64,
    ppid: u32,
    /// The inode number of the parent's /proc entry when it was read (None: not listed).
    parent_ino: Option<u64>,
}

/// Every process /proc lists, with its parent, kept from one sample to the next.
#[derive(Debug, Default)]
struct Procs {
    known: HashMap<u32, Known>,
    /// `/proc/PID/stat` files read so far (for the tests).
    stat_reads: u64,
}

impl Procs {
    /// Lists /proc: forgets the processes gone, and reads the parent of new ones and of those
    /// whose parent is gone. False when /proc cannot be listed.
    fn refresh(&mut self) -> bool {
        let Ok(dir) = std::fs::read_dir("/proc") else {
            return false;
        };
        let mut listed: HashMap<u32, u64> = HashMap::with_capacity(self.known.len() + 16);
        for e in dir.flatten() {
            if let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) {
                listed.insert(pid, e.ino());
            }
        }
        self.known.retain(|pid, k| listed.get(pid) == Some(&k.ino));
        for (&pid, &ino) in &listed {
            let fresh = self.known.get(&pid).is_some_and(|k| {
                // Parent 0: a kernel-created process (init, kthreadd), never reparented.
                k.ppid == 0
                    || (k.parent_ino.is_some() && listed.get(&k.ppid) == k.parent_ino.as_ref())
            });
            if fresh {
                continue;
            }
            self.stat_reads += 1;
            // Gone since the listing: forgotten.
            let st = std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .ok()
                .and_then(|t| farmem_runtime::parse_proc_stat(&t));
            match st {
                Some(st) => {
                    let parent_ino = listed.get(&st.ppid).copied();
                    self.known.insert(
                        pid,
                        Known {
                            ino,
                            ppid: st.ppid,
                            parent_ino,
                        },
                    );
                }
                None => {
                    self.known.remove(&pid);
                }
            }
        }
        true
    }

    /// A parent read elsewhere (a tree process's status) for a process already known.
    fn set_parent(&mut self, pid: u32, ppid: u32) {
        let parent_ino = self.known.get(&ppid).map(|p| p.ino);
        if let Some(k) = self.known.get_mut(&pid) {
            if k.ppid != ppid {
                (k.ppid, k.parent_ino) = (ppid, parent_ino);
            }
        }
    }

    /// The processes of the tree rooted at `root` as last listed (the root first). Empty when
    /// the root is gone.
    fn tree(&self, root: u32) -> Vec<u32> {
        if !self.known.contains_key(&root) {
            return Vec::new();
        }
        let mut children: HashMap<u32, Vec<u32>> = HashMap::new();
        for (&pid, k) in &self.known {
            children.entry(k.ppid).or_default().push(pid);
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

/// `PPid` of /proc/PID/status text.
fn ppid_of_status(status: &str) -> Option<u32> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("PPid:"))
        .and_then(|v| v.trim().parse().ok())
}

fn sample(procs: &mut Procs, root: u32) -> Sample {
    let mut s = Sample::default();
    if !procs.refresh() {
        return s;
    }
    for pid in procs.tree(root) {
        let Ok(text) = std::fs::read_to_string(format!("/proc/{pid}/status")) else {
            continue; // ended since
        };
        if let Some(ppid) = ppid_of_status(&text) {
            procs.set_parent(pid, ppid);
        }
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
        let mut procs = Procs::default();
        assert!(procs.refresh());
        assert!(procs.tree(child.id()).is_empty());
    }

    /// Reads a line from a child's stdout.
    fn line(r: &mut impl std::io::BufRead) -> String {
        let mut l = String::new();
        r.read_line(&mut l).expect("reading the child's output");
        l.trim().to_string()
    }

    #[test]
    fn a_known_process_is_not_read_again_unless_its_entry_changes() {
        let mut sleeper = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .expect("starting sleep");
        let (me, pid) = (std::process::id(), sleeper.id());
        let mut procs = Procs::default();
        assert!(procs.refresh());
        assert!(procs.stat_reads > 0);
        assert_eq!(procs.known[&pid].ppid, me);
        assert!(procs.tree(me).contains(&pid));
        // Told a wrong (but consistent) parent, a process already known keeps it: its stat is
        // not read again.
        let init_ino = procs.known[&1].ino;
        let k = procs.known.get_mut(&pid).unwrap();
        (k.ppid, k.parent_ino) = (1, Some(init_ino));
        assert!(procs.refresh());
        assert_eq!(procs.known[&pid].ppid, 1);
        assert!(!procs.tree(me).contains(&pid));
        // Another inode number is another process with the same pid: read again.
        procs.known.get_mut(&pid).unwrap().ino ^= 1;
        assert!(procs.refresh());
        assert_eq!(procs.known[&pid].ppid, me);
        assert!(procs.tree(me).contains(&pid));
        sleeper.kill().unwrap();
        sleeper.wait().unwrap();
        assert!(procs.refresh());
        assert!(
            !procs.known.contains_key(&pid),
            "a process gone is forgotten"
        );
    }

    #[test]
    fn an_orphan_reparented_to_a_subreaper_in_the_tree_stays_in_it() {
        use std::io::{BufReader, Write};
        use std::process::{Command, Stdio};
        let py = "/usr/bin/python3";
        assert!(
            std::path::Path::new(py).is_file(),
            "{py} is missing: install the Debian package python3"
        );
        // python3 becomes a subreaper (PR_SET_CHILD_SUBREAPER = 36), starts sh, which starts
        // sleep in the background and waits for a line on the stdin it shares with python3;
        // then python3 reaps sh and sleep is python3's.
        let script = "import ctypes, subprocess, time\n\
            assert ctypes.CDLL(None).prctl(36, 1, 0, 0, 0) == 0\n\
            p = subprocess.Popen(['sh', '-c', 'sleep 30 & echo $!; read x'], stdout=subprocess.PIPE, text=True)\n\
            print(p.stdout.readline().strip(), flush=True)\n\
            p.wait()\n\
            print('reaped', flush=True)\n\
            time.sleep(30)\n";
        let mut root = Command::new(py)
            .args(["-c", script])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("starting python3");
        let mut out = BufReader::new(root.stdout.take().unwrap());
        let sleep_pid: u32 = line(&mut out).parse().expect("sleep's pid");
        let mut procs = Procs::default();
        assert!(procs.refresh());
        let sh = procs.known[&sleep_pid].ppid;
        assert_ne!(sh, root.id(), "sleep is sh's child first");
        assert!(procs.tree(root.id()).contains(&sleep_pid));
        root.stdin.take().unwrap().write_all(b"\n").unwrap();
        assert_eq!(line(&mut out), "reaped");
        // sh is gone: sleep's parent is read again, and it is python3 now.
        assert!(procs.refresh());
        let now = procs.known.get(&sleep_pid).map(|k| k.ppid);
        let in_tree = procs.tree(root.id()).contains(&sleep_pid);
        let _ = Command::new("kill").arg(sleep_pid.to_string()).status();
        root.kill().unwrap();
        root.wait().unwrap();
        assert_eq!(now, Some(root.id()));
        assert!(in_tree);
    }
}
