//! The runtime's counters and fault latency histograms, and their serializable snapshot
//! [`Stats`] (what `fm_stats`, `Region::stats` and `farmem run --stats` show); and
//! [`StatsFile`], the stats file itself, one type for its writer (the preload library) and its
//! readers (`farmem run`'s summary line, `farmem-bench compare`).
//!
//! Counters are updated by the runtime threads under one small mutex (never on a path that
//! waits for the network); latencies are recorded in microseconds with hdrhistogram, from the
//! moment the fault message was read to the moment the faulting thread was woken.
//!
//! The CPU time of farmem's own threads ([`Stats::runtime_cpu_s`]) is not a counter: it is read
//! from /proc/self/task when a snapshot is taken ([`runtime_threads_cpu`]), outside the mutex.
//! [`parse_proc_stat`] is the one parser of `/proc/<pid>/stat` lines, shared with
//! `farmem-bench compare`, which adds up the CPU time paging costs.

use std::path::Path;
use std::sync::OnceLock;

use hdrhistogram::Histogram;

use farmem_contract::FaultLatency;
use farmem_contract::LatencySummary;
use farmem_contract::Stats;

/// The kinds of fault the runtime serves, for latency histograms.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum FaultKind {
    Zero,
    PoolHit,
    Remote,
    Tier,
    WriteProtect,
    /// A donor fetch served by another copy (a replica, or the backup file) after the first
    /// one failed or was slow: counted as a remote fault too.
    Failover,
}

/// The fields of one `/proc/<pid>/stat` (or `/proc/<pid>/task/<tid>/stat`) line that farmem
/// reads. Times are in clock ticks ([`clock_ticks_per_s`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProcStat {
    /// Field 1.
    pub pid: u32,
    /// Field 2 without its parentheses: the thread or process name (at most 15 bytes).
    pub comm: String,
    /// Field 3: R, S, D, Z…
    pub state: char,
    /// Field 4.
    pub ppid: u32,
    /// Field 14: user time of the task (the whole process when read from /proc/<pid>/stat).
    pub utime_ticks: u64,
    /// Field 15: system time.
    pub stime_ticks: u64,
    /// Field 16: user time of the process's children that it has waited for.
    pub cutime_ticks: u64,
    /// Field 17: system time of the waited-for children.
    pub cstime_ticks: u64,
}

/// Parses a `/proc/<pid>/stat` line. The name (field 2) may hold spaces and parentheses, so
/// the fields after it are found from its *last* `)`. None when the line is malformed.
pub fn parse_proc_stat(text: &str) -> Option<ProcStat> {
    let open = text.find('(')?;
    let close = text.rfind(')')?;
    if close < open {
        return None;
    }
    let pid = text[..open].trim().parse().ok()?;
    let comm = text[open + 1..close].to_string();
    // Fields 3.. (state is field 3, so field n is rest[n - 3]).
    let rest: Vec<&str> = text[close + 1..].split_whitespace().collect();
    let field = |n: usize| rest.get(n - 3).copied();
    let ticks = |n: usize| -> Option<u64> {
        // cutime/cstime are signed in the kernel's format; never negative in practice.
        let v: i64 = field(n)?.parse().ok()?;
        Some(v.max(0) as u64)
    };
    Some(ProcStat {
        pid,
        comm,
        state: field(3)?.chars().next()?,
        ppid: field(4)?.parse().ok()?,
        utime_ticks: ticks(14)?,
        stime_ticks: ticks(15)?,
        cutime_ticks: ticks(16)?,
        cstime_ticks: ticks(17)?,
    })
}

/// `AT_CLKTCK` in the auxiliary vector: the unit of the times in /proc/<pid>/stat.
const AT_CLKTCK: u64 = 17;

/// Finds `AT_CLKTCK` in the raw bytes of /proc/self/auxv (native-endian word pairs).
fn auxv_clock_ticks(auxv: &[u8]) -> Option<u64> {
    let word = std::mem::size_of::<usize>();
    let read = |c: &[u8]| -> u64 {
        let mut b = [0u8; 8];
        if cfg!(target_endian = "little") {
            b[..word].copy_from_slice(c);
            u64::from_le_bytes(b)
        } else {
            b[8 - word..].copy_from_slice(c);
            u64::from_be_bytes(b)
        }
    };
    auxv.chunks_exact(2 * word)
        .map(|pair| (read(&pair[..word]), read(&pair[word..])))
        .take_while(|(key, _)| *key != 0)
        .find(|(key, _)| *key == AT_CLKTCK)
        .map(|(_, v)| v)
        .filter(|v| *v > 0)
}

/// Clock ticks per second of the times in /proc/<pid>/stat (`sysconf(_SC_CLK_TCK)`, read from
/// the auxiliary vector without unsafe code; 100, Linux's USER_HZ, if it cannot be read).
pub fn clock_ticks_per_s() -> u64 {
    static TICKS: OnceLock<u64> = OnceLock::new();
    *TICKS.get_or_init(|| {
        std::fs::read("/proc/self/auxv")
            .ok()
            .and_then(|a| auxv_clock_ticks(&a))
            .unwrap_or(100)
    })
}

/// CPU time of a set of threads, seconds.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ThreadsCpu {
    /// User + system.
    pub cpu_s: f64,
    /// System only.
    pub system_s: f64,
}

/// Sums the times of the tasks under `task_dir` (a /proc/<pid>/task directory) whose name
/// starts with `farmem-`. Tasks that end while it reads are skipped.
fn farmem_threads_cpu_in(task_dir: &Path, ticks_per_s: u64) -> ThreadsCpu {
    let Ok(entries) = std::fs::read_dir(task_dir) else {
        return ThreadsCpu::default();
    };
    let (mut user, mut system) = (0u64, 0u64);
    for e in entries.flatten() {
        let Ok(text) = std::fs::read_to_string(e.path().join("stat")) else {
            continue;
        };
        if let Some(st) = parse_proc_stat(&text).filter(|st| st.comm.starts_with("farmem-")) {
            user += st.utime_ticks;
            system += st.stime_ticks;
        }
    }
    let t = ticks_per_s.max(1) as f64;
    ThreadsCpu {
        cpu_s: (user + system) as f64 / t,
        system_s: system as f64 / t,
    }
}

/// CPU time of this process's farmem threads (named `farmem-…`), from /proc/self/task: one
/// directory listing and one small read per thread, so cheap enough for the once-a-second
/// stats file. Zero when /proc is not mounted.
pub fn runtime_threads_cpu() -> ThreadsCpu {
    farmem_threads_cpu_in(Path::new("/proc/self/task"), clock_ticks_per_s())
}

/// Counters plus histograms, owned by the runtime.
pub(crate) struct StatsCell {
    pub(crate) s: Stats,
    zero: Histogram<u64>,
    pool_hit: Histogram<u64>,
    remote: Histogram<u64>,
    tier: Histogram<u64>,
    write_protect: Histogram<u64>,
    failover: Histogram<u64>,
}

fn hist() -> Histogram<u64> {
    // 1 µs .. 100 s, 3 significant digits: bounded memory (~100 KiB each).
    Histogram::new_with_bounds(1, 100_000_000, 3).expect("valid histogram bounds")
}

fn summary(h: &Histogram<u64>) -> LatencySummary {
    if h.is_empty() {
        return LatencySummary::default();
    }
    LatencySummary {
        count: h.len(),
        p50_us: h.value_at_quantile(0.5) as f64,
        p99_us: h.value_at_quantile(0.99) as f64,
        p999_us: h.value_at_quantile(0.999) as f64,
        max_us: h.max() as f64,
    }
}

impl StatsCell {
    pub(crate) fn new() -> StatsCell {
        StatsCell {
            s: Stats::default(),
            zero: hist(),
            pool_hit: hist(),
            remote: hist(),
            tier: hist(),
            write_protect: hist(),
            failover: hist(),
        }
    }

    /// Records one served fault of `kind` that took `latency_us`.
    pub(crate) fn fault(&mut self, kind: FaultKind, latency_us: u64) {
        let v = latency_us.clamp(1, 100_000_000);
        match kind {
            FaultKind::Zero => {
                self.s.faults_zero += 1;
                let _ = self.zero.record(v);
            }
            FaultKind::PoolHit => {
                self.s.faults_pool_hit += 1;
                let _ = self.pool_hit.record(v);
            }
            FaultKind::Remote => {
                self.s.faults_remote += 1;
                let _ = self.remote.record(v);
            }
            FaultKind::Tier => {
                self.s.faults_tier += 1;
                let _ = self.tier.record(v);
            }
            FaultKind::WriteProtect => {
                self.s.faults_write_protect += 1;
                let _ = self.write_protect.record(v);
            }
            FaultKind::Failover => {
                self.s.faults_remote += 1;
                self.s.failovers += 1;
                let _ = self.remote.record(v);
                let _ = self.failover.record(v);
            }
        }
    }

    /// The snapshot with the percentiles filled in.
    pub(crate) fn snapshot(&self) -> Stats {
        let mut s = self.s.clone();
        s.latency = FaultLatency {
            zero: summary(&self.zero),
            pool_hit: summary(&self.pool_hit),
            remote: summary(&self.remote),
            tier: summary(&self.tier),
            write_protect: summary(&self.write_protect),
            failover: summary(&self.failover),
        };
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use farmem_contract::{
        PreloadCounters, StatsFile, StatsSummary, UnmanagedMapping, UnmanagedReport,
    };

    #[test]
    fn percentiles_by_kind() {
        let mut c = StatsCell::new();
        for v in 1..=100 {
            c.fault(FaultKind::Remote, v);
        }
        c.fault(FaultKind::Zero, 0);
        let s = c.snapshot();
        assert_eq!(s.faults_remote, 100);
        assert_eq!(s.faults_zero, 1);
        assert_eq!(s.latency.remote.count, 100);
        assert_eq!(s.latency.remote.p50_us, 50.0);
        assert_eq!(s.latency.remote.p99_us, 99.0);
        assert_eq!(
            s.latency.zero.p50_us, 1.0,
            "0 µs is recorded as the 1 µs floor"
        );
        assert_eq!(s.latency.pool_hit, LatencySummary::default());
        let json = serde_json::to_string(&s).unwrap();
        assert!(json.contains("\"faults_remote\":100"), "{json}");
    }

    #[test]
    fn the_stats_file_reads_back_what_was_written() {
        let mut c = StatsCell::new();
        c.fault(FaultKind::Remote, 40);
        c.s.bytes_sent = 3 * 4096;
        c.s.prefetched_pages = 4;
        c.s.prefetch_accuracy = 0.5;
        let rt = c.snapshot();
        let file = StatsFile {
            pid: 7,
            is_final: true,
            summary: Some(StatsSummary::from(&rt)),
            preload: PreloadCounters {
                heap_bytes: 1 << 20,
                ..PreloadCounters::default()
            },
            runtime: Some(rt),
            tree: None,
            unmanaged: Some(UnmanagedReport {
                rss_bytes: 90 << 20,
                peak_rss_bytes: 100 << 20,
                managed_rss_bytes: 16 << 20,
                farmem_rss_bytes: 4 << 20,
                unmanaged_bytes: 70 << 20,
                anon_unmanaged_bytes: 64 << 20,
                peak_unmanaged_bytes: 80 << 20,
                peak_anon_unmanaged_bytes: 66 << 20,
                biggest: vec![UnmanagedMapping {
                    start: 0x7f00_0000_0000,
                    len: 64 << 20,
                    rss_bytes: 64 << 20,
                    name: "[anon]".into(),
                }],
                biggest_at_peak: vec![],
            }),
        };
        let json = serde_json::to_string(&file).unwrap();
        assert!(
            json.starts_with("{\"pid\":7,\"final\":true,\"summary\":{"),
            "{json}"
        );
        assert!(json.contains("\"remote_bytes_out\":12288"), "{json}");
        assert_eq!(serde_json::from_str::<StatsFile>(&json).unwrap(), file);
        let summary = file.summary.unwrap();
        assert_eq!((summary.faults, summary.faults_remote), (1, 1));
        assert_eq!(summary.prefetch_accuracy, Some(0.5));
    }

    #[test]
    fn proc_stat_lines_parse_even_with_odd_names() {
        let line = "4242 (farmem-fault) S 1 4242 4242 0 -1 4194368 1460 0 0 0 731 2210 12 -3 20 0 \
                    7 0 123 1000 200 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 1 0 0\n";
        let st = parse_proc_stat(line).unwrap();
        assert_eq!(
            st,
            ProcStat {
                pid: 4242,
                comm: "farmem-fault".into(),
                state: 'S',
                ppid: 1,
                utime_ticks: 731,
                stime_ticks: 2210,
                cutime_ticks: 12,
                cstime_ticks: 0,
            }
        );
        // A name with spaces and a parenthesis: fields are counted from the last `)`.
        let line = "7 (a) b (c) R 6 7 7 0 -1 0 0 0 0 0 5 9 1 2 20 0 1 0 1 1 1";
        let st = parse_proc_stat(line).unwrap();
        assert_eq!((st.comm.as_str(), st.state, st.ppid), ("a) b (c", 'R', 6));
        assert_eq!((st.utime_ticks, st.stime_ticks), (5, 9));
        assert_eq!((st.cutime_ticks, st.cstime_ticks), (1, 2));
        assert_eq!(parse_proc_stat("12 (short) S 1 2 3"), None);
        assert_eq!(parse_proc_stat("garbage"), None);
    }

    #[test]
    fn clock_ticks_come_from_the_auxiliary_vector() {
        let word = std::mem::size_of::<usize>();
        let mut auxv = Vec::new();
        for (k, v) in [(6u64, 4096u64), (AT_CLKTCK, 250), (0, 0)] {
            auxv.extend_from_slice(&(k as usize).to_ne_bytes()[..word]);
            auxv.extend_from_slice(&(v as usize).to_ne_bytes()[..word]);
        }
        assert_eq!(auxv_clock_ticks(&auxv), Some(250));
        assert_eq!(auxv_clock_ticks(&auxv[..2 * word]), None);
        // This machine: the kernel's USER_HZ, 100 on every Linux farmem runs on.
        assert_eq!(clock_ticks_per_s(), 100);
    }

    #[test]
    fn only_farmem_threads_are_counted() {
        let dir = tempfile::tempdir().unwrap();
        let task = |tid: u32, comm: &str, utime: u64, stime: u64| {
            let d = dir.path().join(tid.to_string());
            std::fs::create_dir(&d).unwrap();
            std::fs::write(
                d.join("stat"),
                format!("{tid} ({comm}) S 1 1 1 0 -1 0 0 0 0 0 {utime} {stime} 0 0 20 0 1 0 1 1 1"),
            )
            .unwrap();
        };
        task(10, "python3", 5000, 700);
        task(11, "farmem-fault", 30, 120);
        task(12, "farmem-evict", 20, 80);
        task(13, "farmem", 1000, 1000); // not a farmem thread: no dash
        let cpu = farmem_threads_cpu_in(dir.path(), 100);
        assert!((cpu.cpu_s - 2.5).abs() < 1e-9, "{cpu:?}");
        assert!((cpu.system_s - 2.0).abs() < 1e-9, "{cpu:?}");
        assert_eq!(
            farmem_threads_cpu_in(&dir.path().join("missing"), 100),
            ThreadsCpu::default()
        );
    }

    #[test]
    fn this_process_farmem_threads_are_read_from_proc() {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let s2 = stop.clone();
        let t = std::thread::Builder::new()
            .name("farmem-spin".into())
            .spawn(move || {
                let mut x = 0u64;
                while !s2.load(std::sync::atomic::Ordering::Relaxed) {
                    x = std::hint::black_box(x.wrapping_add(1));
                }
            })
            .unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        let mut cpu = runtime_threads_cpu();
        while cpu.cpu_s < 0.05 && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(20));
            cpu = runtime_threads_cpu();
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        t.join().unwrap();
        assert!(cpu.cpu_s >= 0.05, "the spinning farmem thread: {cpu:?}");
        assert!(cpu.system_s <= cpu.cpu_s);
    }
}
