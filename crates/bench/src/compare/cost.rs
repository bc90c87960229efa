//! What paging cost in each run of `farmem-bench compare`: the pages moved in and out and the
//! CPU seconds spent moving them, so that cost per page moved is a column and every slowdown
//! reads as count × cost.
//!
//! # Design
//!
//! Pages moved (`in_pages`, `out_pages`):
//!
//! * `swap`, `zram`: the deltas of `pswpin` / `pswpout` in /proc/vmstat around the run (the
//!   area under test is the only active swap area during it, see [`super::systems`]);
//! * `farmem`, `farmem-tcp`, `farmem-remote`: from the stats file, `tier_bytes_in + remote_bytes_in` and
//!   `tier_bytes_out + remote_bytes_out` over 4096 (host tier and donors);
//! * `local`: 0.
//!
//! CPU seconds spent on paging (`cpu_s`), where *tree* is the workload's process tree as the
//! harness sees it: `getrusage(RUSAGE_CHILDREN)` from spawn to reap, i.e. every process of the
//! tree that was waited for (the top one by the harness, the others by their parents):
//!
//! * `local`: tree system time (the baseline: the workload's own system calls and first-touch
//!   page faults);
//! * `swap`, `zram`: tree system time + the user and system time of every `kswapd*` kernel
//!   thread over the run (/proc/<pid>/stat fields 14 and 15). zram's compression runs in the
//!   faulting thread or in kswapd, so it is already in one of the two;
//! * `farmem`, `farmem-tcp`, `farmem-remote`: tree system time (it holds the system time of every thread of the
//!   program, the runtime's included, and of `farmem run`, the private node or embedded donor,
//!   which `farmem run` waits for) + the *user* time of the program's `farmem-…` threads
//!   (`runtime_cpu_s - runtime_system_s` from its stats file: their system time is already in
//!   the tree's) + the *user* time of the tree's `farmem` processes (`farmem run` itself, read
//!   from its zombie before the harness reaps it; the private node or embedded donor, sampled
//!   every 250 ms while they live).
//!
//! Nothing is counted twice: system time comes from one place (the tree), user time only from
//! farmem's own threads and processes, never from the program's threads.
//!
//! `cpu_s` is the program's machine's (`client_us_per_page` in `--json`). The donor of
//! `farmem-remote` stands for another machine: its CPU (user + system of the donor process) is
//! `donor_us_per_page`, never part of `cpu_s`, and the bytes over its link both ways
//! (`wire_bytes_per_page`) are from the link's counters ([`super::remote`]). `farmem-tcp`'s
//! embedded donor runs in the tree and is counted in `cpu_s` as before.
//!
//! `us_per_page = cpu_s / (in_pages + out_pages)` in µs; `moved_vs_swap = (in + out) / swap's
//! (in + out)` at the same workload and fraction.
//!
//! # Limitations
//!
//! kswapd is machine-wide: reclaim caused by anything else running on the machine during the
//! run is counted too. With the host's `farmem node` (not a private one) the node is not in the
//! tree and its CPU time is not counted (the tier's copies run in the program's threads; the
//! node only hands out slabs). The user time of the farmem threads of processes the program
//! forks or execs is missed (only the top process writes the stats file; their system time is
//! in the tree's), and so is the last second of the top process's if it ends without running
//! its exit hook. A tree the harness had to kill (timeout, a server that would not shut down)
//! loses the times of the processes orphaned by the kill.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{mpsc, Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use farmem_runtime::{parse_proc_stat, ProcStat, StatsFile};

use super::systems::{parse_vmstat_field, SystemKind};

/// Bytes of a page.
pub const PAGE_BYTES: u64 = farmem_runtime::PAGE_SIZE as u64;

/// User and system CPU time, seconds.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct CpuTimes {
    pub user_s: f64,
    pub system_s: f64,
}

impl CpuTimes {
    /// `self - earlier`, never negative.
    pub fn since(self, earlier: CpuTimes) -> CpuTimes {
        CpuTimes {
            user_s: (self.user_s - earlier.user_s).max(0.0),
            system_s: (self.system_s - earlier.system_s).max(0.0),
        }
    }
}

/// The times of every child of this process that has been waited for, with their own waited
/// descendants (`getrusage(RUSAGE_CHILDREN)`).
pub fn children_times() -> CpuTimes {
    use nix::sys::resource::{getrusage, UsageWho};
    let secs = |tv: nix::sys::time::TimeVal| tv.tv_sec() as f64 + tv.tv_usec() as f64 / 1e6;
    match getrusage(UsageWho::RUSAGE_CHILDREN) {
        Ok(u) => CpuTimes {
            user_s: secs(u.user_time()),
            system_s: secs(u.system_time()),
        },
        Err(_) => CpuTimes::default(),
    }
}

pub(super) fn ticks_to_s(ticks: u64) -> f64 {
    ticks as f64 / farmem_runtime::clock_ticks_per_s().max(1) as f64
}

/// Pages swapped in and out since boot (/proc/vmstat).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SwapCounters {
    pub pswpin: u64,
    pub pswpout: u64,
}

impl SwapCounters {
    /// The counters in a /proc/vmstat text (0 for a missing one).
    pub fn parse(vmstat: &str) -> SwapCounters {
        SwapCounters {
            pswpin: parse_vmstat_field(vmstat, "pswpin").unwrap_or(0),
            pswpout: parse_vmstat_field(vmstat, "pswpout").unwrap_or(0),
        }
    }

    /// The machine's counters now.
    pub fn now() -> SwapCounters {
        SwapCounters::parse(&std::fs::read_to_string("/proc/vmstat").unwrap_or_default())
    }

    /// `self - earlier`, never negative.
    pub fn since(self, earlier: SwapCounters) -> SwapCounters {
        SwapCounters {
            pswpin: self.pswpin.saturating_sub(earlier.pswpin),
            pswpout: self.pswpout.saturating_sub(earlier.pswpout),
        }
    }
}

/// Reads and parses every `<proc_root>/<pid>/stat` (processes that vanish meanwhile are
/// skipped).
fn all_processes(proc_root: &Path) -> Vec<ProcStat> {
    let Ok(entries) = std::fs::read_dir(proc_root) else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .bytes()
                .all(|b| b.is_ascii_digit())
        })
        .filter_map(|e| std::fs::read_to_string(e.path().join("stat")).ok())
        .filter_map(|t| parse_proc_stat(&t))
        .collect()
}

/// User + system ticks of the `kswapd*` kernel threads among `procs`.
pub fn kswapd_ticks(procs: &[ProcStat]) -> u64 {
    procs
        .iter()
        .filter(|p| p.comm.starts_with("kswapd"))
        .map(|p| p.utime_ticks + p.stime_ticks)
        .sum()
}

/// CPU seconds the machine's kswapd threads have used since boot.
pub fn kswapd_cpu_s() -> f64 {
    ticks_to_s(kswapd_ticks(&all_processes(Path::new("/proc"))))
}

/// The descendants of `root` among `procs` (not `root` itself), by parent pid.
pub fn descendants(procs: &[ProcStat], root: u32) -> Vec<&ProcStat> {
    let mut found: Vec<&ProcStat> = Vec::new();
    let mut frontier = vec![root];
    while let Some(parent) = frontier.pop() {
        for p in procs.iter().filter(|p| p.ppid == parent && p.pid != root) {
            if !found.iter().any(|f| f.pid == p.pid) {
                found.push(p);
                frontier.push(p.pid);
            }
        }
    }
    found
}

/// The name the `farmem` binary's processes carry (`farmem run`, `farmem node`, `farmem
/// donor`); the runtime's threads inside the program are `farmem-…`.
fn is_farmem_process(p: &ProcStat) -> bool {
    p.comm == "farmem"
}

/// What the harness measured of one run's process tree.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct TreeCpu {
    /// `RUSAGE_CHILDREN` from spawn to reap.
    pub tree: CpuTimes,
    /// User time of the tree's `farmem` processes: the top one (`farmem run`) from its zombie,
    /// the others from their last sample.
    pub farmem_procs_user_s: f64,
}

/// Watches one run's process tree from spawn to reap: `RUSAGE_CHILDREN` around it, and (for
/// farmem runs) the user time of its `farmem` processes, sampled by a thread every 250 ms,
/// since they are reaped by their parent, not by the harness.
pub struct TreeWatch {
    root: u32,
    before: CpuTimes,
    /// Last user ticks seen per pid of a `farmem` process below the root.
    seen: Arc<Mutex<BTreeMap<u32, u64>>>,
    sampler: Option<(mpsc::Sender<()>, JoinHandle<()>)>,
    root_user_ticks: Option<u64>,
}

impl TreeWatch {
    /// Starts watching the tree of `root` (just spawned, not yet waited for);
    /// `sample_farmem_procs` for runs under `farmem run`.
    pub fn start(root: u32, sample_farmem_procs: bool) -> TreeWatch {
        let before = children_times();
        let seen: Arc<Mutex<BTreeMap<u32, u64>>> = Arc::default();
        let sampler = sample_farmem_procs
            .then(|| {
                let (stop_tx, stop_rx) = mpsc::channel::<()>();
                let seen = seen.clone();
                std::thread::Builder::new()
                    .name("bench-cpu-watch".into())
                    .spawn(move || loop {
                        let procs = all_processes(Path::new("/proc"));
                        {
                            let mut seen = seen.lock().unwrap_or_else(|p| p.into_inner());
                            for p in descendants(&procs, root) {
                                if is_farmem_process(p) {
                                    seen.insert(p.pid, p.utime_ticks);
                                }
                            }
                        }
                        if !matches!(
                            stop_rx.recv_timeout(Duration::from_millis(250)),
                            Err(mpsc::RecvTimeoutError::Timeout)
                        ) {
                            return;
                        }
                    })
                    .ok()
                    .map(|h| (stop_tx, h))
            })
            .flatten();
        TreeWatch {
            root,
            before,
            seen,
            sampler,
            root_user_ticks: None,
        }
    }

    /// Called once the root has exited but before it is reaped: its /proc/<pid>/stat still
    /// holds its final times.
    pub fn root_exited(&mut self) {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.root))
            .ok()
            .and_then(|t| parse_proc_stat(&t));
        if let Some(st) = stat.filter(is_farmem_process) {
            self.root_user_ticks = Some(st.utime_ticks);
        }
    }

    /// Called after the root was reaped: what the tree used.
    pub fn finish(mut self) -> TreeCpu {
        let tree = children_times().since(self.before);
        if let Some((stop, handle)) = self.sampler.take() {
            drop(stop);
            let _ = handle.join();
        }
        let below: u64 = self
            .seen
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .sum();
        TreeCpu {
            tree,
            farmem_procs_user_s: ticks_to_s(below + self.root_user_ticks.unwrap_or(0)),
        }
    }
}

/// Pages farmem moved, from its stats file: in from the host tier and donors, out into them.
pub fn farmem_moved_pages(stats: &StatsFile) -> Option<(u64, u64)> {
    stats.summary.as_ref().map(|s| {
        (
            (s.tier_bytes_in + s.remote_bytes_in) / PAGE_BYTES,
            (s.tier_bytes_out + s.remote_bytes_out) / PAGE_BYTES,
        )
    })
}

/// The parts of a run's `cpu_s` (see the module docs for which apply to which system).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct CpuParts {
    /// System time of the workload's tree.
    pub tree_system_s: f64,
    /// kswapd over the run (swap, zram).
    pub kswapd_s: f64,
    /// User time of the program's `farmem-…` threads (farmem).
    pub runtime_user_s: f64,
    /// User time of the tree's `farmem` processes (farmem).
    pub farmem_procs_user_s: f64,
}

impl CpuParts {
    /// The parts that count for `system`. `runtime` is the farmem run's stats file (None: the
    /// runtime's share is unknown, so the whole is).
    pub fn of(
        system: SystemKind,
        tree: &TreeCpu,
        kswapd_s: f64,
        runtime: Option<&StatsFile>,
    ) -> Option<CpuParts> {
        let base = CpuParts {
            tree_system_s: tree.tree.system_s,
            ..CpuParts::default()
        };
        Some(match system {
            SystemKind::Local => base,
            SystemKind::Swap | SystemKind::Zram => CpuParts { kswapd_s, ..base },
            SystemKind::Farmem | SystemKind::FarmemTcp | SystemKind::FarmemRemote => {
                let rt = runtime?.runtime.as_ref()?;
                CpuParts {
                    runtime_user_s: (rt.runtime_cpu_s - rt.runtime_system_s).max(0.0),
                    farmem_procs_user_s: tree.farmem_procs_user_s,
                    ..base
                }
            }
        })
    }

    /// `cpu_s`: the sum of the parts.
    pub fn total_s(&self) -> f64 {
        self.tree_system_s + self.kswapd_s + self.runtime_user_s + self.farmem_procs_user_s
    }

    /// The sum spelt out for the table, e.g. `tree sys 1.20 + kswapd 0.30`.
    pub fn describe(&self, system: SystemKind) -> String {
        let mut parts = vec![format!("tree sys {:.2}", self.tree_system_s)];
        match system {
            SystemKind::Local => {}
            SystemKind::Swap | SystemKind::Zram => {
                parts.push(format!("kswapd {:.2}", self.kswapd_s))
            }
            SystemKind::Farmem | SystemKind::FarmemTcp | SystemKind::FarmemRemote => {
                parts.push(format!("runtime user {:.2}", self.runtime_user_s));
                parts.push(format!("farmem procs user {:.2}", self.farmem_procs_user_s));
            }
        }
        parts.join(" + ")
    }
}

/// CPU µs per page moved; None when no page moved.
pub fn us_per_page(cpu_s: f64, in_pages: u64, out_pages: u64) -> Option<f64> {
    let pages = in_pages + out_pages;
    (pages > 0 && cpu_s.is_finite()).then(|| cpu_s * 1e6 / pages as f64)
}

/// Pages moved relative to swap's at the same fraction; None when swap moved none.
pub fn moved_vs_swap(in_pages: u64, out_pages: u64, swap_in: u64, swap_out: u64) -> Option<f64> {
    let swap = swap_in + swap_out;
    (swap > 0).then(|| (in_pages + out_pages) as f64 / swap as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn proc(pid: u32, comm: &str, ppid: u32, utime: u64, stime: u64) -> ProcStat {
        ProcStat {
            pid,
            comm: comm.into(),
            state: 'S',
            ppid,
            utime_ticks: utime,
            stime_ticks: stime,
            cutime_ticks: 0,
            cstime_ticks: 0,
        }
    }

    #[test]
    fn kswapd_threads_are_found_by_name() {
        let procs = vec![
            proc(2, "kthreadd", 0, 0, 0),
            proc(80, "kswapd0", 2, 3, 40),
            proc(81, "kswapd1", 2, 0, 7),
            proc(90, "kcompactd0", 2, 0, 99),
            proc(500, "bash", 1, 9, 9),
        ];
        assert_eq!(kswapd_ticks(&procs), 50);
        assert_eq!(kswapd_ticks(&[]), 0);
    }

    #[test]
    fn kswapd_lines_of_proc_parse() {
        // A real /proc/<kswapd>/stat line (Linux 6.x).
        let line = "74 (kswapd0) S 2 0 0 0 -1 2228288 0 0 0 0 12 345 0 0 20 0 1 0 67 0 0 \
                    18446744073709551615 0 0 0 0 0 0 0 2147483647 0 0 0 0 17 1 0 0 0 0 0 0 0 \
                    0 0 0 0 0 0";
        let st = parse_proc_stat(line).unwrap();
        assert_eq!(kswapd_ticks(&[st]), 357);
    }

    #[test]
    fn descendants_follow_parent_pids() {
        let procs = vec![
            proc(10, "farmem", 1, 5, 1),    // farmem run (the root)
            proc(11, "farmem", 10, 70, 3),  // its private node
            proc(12, "micro", 10, 900, 50), // the program
            proc(13, "sh", 12, 1, 1),       // a child of the program
            proc(20, "farmem", 1, 99, 99),  // someone else's farmem
        ];
        let mut pids: Vec<u32> = descendants(&procs, 10).iter().map(|p| p.pid).collect();
        pids.sort_unstable();
        assert_eq!(pids, [11, 12, 13]);
        let farmem: Vec<u32> = descendants(&procs, 10)
            .into_iter()
            .filter(|p| is_farmem_process(p))
            .map(|p| p.pid)
            .collect();
        assert_eq!(farmem, [11]);
    }

    #[test]
    fn swap_counters_come_from_vmstat() {
        let text = "nr_free_pages 100\npswpin 30\npswpout 170\nswap_ra 4\n";
        let c = SwapCounters::parse(text);
        assert_eq!(
            c,
            SwapCounters {
                pswpin: 30,
                pswpout: 170
            }
        );
        let later = SwapCounters {
            pswpin: 45,
            pswpout: 170,
        };
        assert_eq!(
            later.since(c),
            SwapCounters {
                pswpin: 15,
                pswpout: 0
            }
        );
        assert_eq!(
            SwapCounters::parse("nr_free_pages 1\n"),
            SwapCounters::default()
        );
    }

    #[test]
    fn cost_per_page_and_moved_relative_to_swap() {
        assert_eq!(us_per_page(1.5, 0, 0), None, "nothing moved");
        assert_eq!(us_per_page(0.0, 0, 0), None);
        assert!((us_per_page(1.5, 1000, 500).unwrap() - 1000.0).abs() < 1e-9);
        assert_eq!(us_per_page(0.0, 10, 0), Some(0.0));
        assert_eq!(us_per_page(f64::NAN, 10, 0), None);
        assert_eq!(moved_vs_swap(10, 10, 0, 0), None, "swap moved nothing");
        assert!((moved_vs_swap(1100, 1100, 1000, 1000).unwrap() - 1.1).abs() < 1e-9);
        assert_eq!(moved_vs_swap(0, 0, 5, 5), Some(0.0));
    }

    #[test]
    fn cpu_parts_add_up_per_system_without_double_counting() {
        let tree = TreeCpu {
            tree: CpuTimes {
                user_s: 9.0, // the program's own work: never counted
                system_s: 2.0,
            },
            farmem_procs_user_s: 0.25,
        };
        let local = CpuParts::of(SystemKind::Local, &tree, 7.0, None).unwrap();
        assert_eq!(local.total_s(), 2.0);
        assert_eq!(local.describe(SystemKind::Local), "tree sys 2.00");
        let swap = CpuParts::of(SystemKind::Swap, &tree, 0.5, None).unwrap();
        assert_eq!(swap.total_s(), 2.5);
        assert_eq!(
            swap.describe(SystemKind::Swap),
            "tree sys 2.00 + kswapd 0.50"
        );
        let zram = CpuParts::of(SystemKind::Zram, &tree, 0.5, None).unwrap();
        assert_eq!(zram.total_s(), 2.5);
        // farmem: the runtime threads' system time (0.75) is already in the tree's.
        let rt = farmem_contract::Stats {
            runtime_cpu_s: 1.75,
            runtime_system_s: 0.75,
            ..farmem_contract::Stats::default()
        };
        let file = crate::compare::tests::stats_file(rt);
        let f = CpuParts::of(SystemKind::Farmem, &tree, 7.0, Some(&file)).unwrap();
        assert_eq!(f.kswapd_s, 0.0, "kswapd is not farmem's");
        assert_eq!(f.total_s(), 2.0 + 1.0 + 0.25);
        assert_eq!(
            f.describe(SystemKind::FarmemTcp),
            "tree sys 2.00 + runtime user 1.00 + farmem procs user 0.25"
        );
        assert_eq!(CpuParts::of(SystemKind::Farmem, &tree, 0.0, None), None);
        assert_eq!(
            CpuParts::of(SystemKind::Farmem, &tree, 0.0, Some(&StatsFile::default())),
            None,
            "no runtime in the stats file"
        );
    }

    #[test]
    fn farmem_pages_are_tier_plus_donor_pages() {
        let rt = farmem_contract::Stats {
            faults_tier: 3,
            tier_pages_written: 5,
            bytes_received: 2 * 4096,
            bytes_sent: 4096,
            ..farmem_contract::Stats::default()
        };
        let file = crate::compare::tests::stats_file(rt);
        assert_eq!(farmem_moved_pages(&file), Some((5, 6)));
        assert_eq!(farmem_moved_pages(&StatsFile::default()), None);
    }

    #[test]
    fn a_tree_watch_measures_its_children_and_their_farmem_processes() {
        // A child that burns system time (reads /dev/zero), then exits.
        let mut child = std::process::Command::new("/bin/sh")
            .args(["-c", "head -c 200000000 /dev/zero > /dev/null"])
            .spawn()
            .unwrap();
        let mut watch = TreeWatch::start(child.id(), true);
        // Wait without reaping, then read the zombie, then reap.
        let pid = nix::unistd::Pid::from_raw(child.id() as i32);
        nix::sys::wait::waitid(
            nix::sys::wait::Id::Pid(pid),
            nix::sys::wait::WaitPidFlag::WEXITED | nix::sys::wait::WaitPidFlag::WNOWAIT,
        )
        .unwrap();
        watch.root_exited();
        assert!(child.wait().unwrap().success());
        let cpu = watch.finish();
        assert!(cpu.tree.user_s + cpu.tree.system_s > 0.0, "{cpu:?}");
        assert_eq!(cpu.farmem_procs_user_s, 0.0, "no farmem process: {cpu:?}");
    }
}
