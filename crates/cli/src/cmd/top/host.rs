//! What `farmem top` shows of a host, gathered from what is already there: the node's STATS
//! answer, every `farmem run` tree found through its processes' environments (the run settings
//! name the tree's directory, where each process rewrites its stats file about once a second),
//! and each donor those programs use, whose round trip `top` times itself with a TCP connect.
//!
//! # Limitations
//! A user other than root sees only its own programs (`/proc/PID/environ` is readable by its
//! owner only). A program that cleared its environment, or one run without `farmem run` (the
//! C API), is not found.
use std::collections::{BTreeMap, HashMap};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

use farmem_contract::{RunSettings, Stats};
use farmem_node::{NodeClient, NodeClientConfig};
use farmem_runtime::PAGE_SIZE;
use serde::Serialize;

use crate::cmd::run_tree;

/// How long a donor may take to accept a connection before it is shown as not answering.
const CONNECT_TIMEOUT: Duration = Duration::from_millis(500);

/// One look at the host.
#[derive(Debug, Serialize)]
pub struct HostView {
    /// The node (host tier) on the socket asked, if it answered.
    pub node: Option<NodeRow>,
    /// Why the node is not shown (no node on that socket, not allowed…).
    pub node_error: Option<String>,
    /// Every farmem program found, largest resident first.
    pub programs: Vec<ProgramRow>,
    /// Every donor those programs use, by address.
    pub donors: Vec<DonorRow>,
    /// Seconds since the last look (0 on the first).
    pub interval_s: f64,
}

#[derive(Debug, Serialize)]
pub struct NodeRow {
    pub socket: String,
    pub capacity_bytes: u64,
    pub used_bytes: u64,
    pub free_bytes: u64,
    pub under_pressure: bool,
    pub clients: Vec<NodeClientRow>,
}

#[derive(Debug, Serialize)]
pub struct NodeClientRow {
    pub pid: u32,
    pub uid: u32,
    pub slabs: u64,
    pub bytes: u64,
    /// The program (its root pid, as in [`ProgramRow::pid`]) the client process belongs to.
    pub program: Option<u32>,
}

#[derive(Debug, Clone, Serialize)]
pub struct ProgramRow {
    /// The first process of the tree (the program `farmem run` started).
    pub pid: u32,
    /// Its command line (shortened).
    pub command: String,
    /// Processes of the tree running now.
    pub processes: usize,
    /// `--local-mem`.
    pub local_mem_bytes: u64,
    pub resident_bytes: u64,
    pub pooled_bytes: u64,
    /// Faults a second over the last interval, by where the page came from.
    pub faults_per_s: FaultRates,
    /// Prefetch hits per prefetched page over the run (None before any prefetch).
    pub prefetch_accuracy: Option<f64>,
    /// Far slabs with fewer copies than asked for now.
    pub slabs_degraded: u64,
}

#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct FaultRates {
    pub zero: f64,
    pub pool: f64,
    pub host_tier: f64,
    pub remote: f64,
}

impl FaultRates {
    pub fn total(&self) -> f64 {
        self.zero + self.pool + self.host_tier + self.remote
    }
}

#[derive(Debug, Serialize)]
pub struct DonorRow {
    pub addr: String,
    /// `live`, `suspect` or `dead`: the worst any program sees.
    pub health: String,
    /// What it lends in all, as it told the programs.
    pub capacity_bytes: u64,
    /// Bytes of its slabs this host's programs hold.
    pub used_bytes: u64,
    /// Programs using it.
    pub programs: usize,
    /// Time to open a TCP connection to it now (None: it did not accept within 500 ms).
    pub round_trip_ms: Option<f64>,
}

/// One program's counters as its processes last wrote them, kept between looks to compute
/// rates, with the rates last computed.
#[derive(Clone, Copy)]
struct Counts {
    zero: u64,
    pool: u64,
    host_tier: u64,
    remote: u64,
    /// When the newest of its stats files was written: rates are over the time between two
    /// writes, not between two looks, which would alias with the writers' one-second period.
    written: SystemTime,
    rates: FaultRates,
}

/// Looks at the host again and again, keeping the last counters for rates.
pub struct Watcher {
    node_socket: PathBuf,
    /// Kept open between looks, so the node does not log a client coming and going each
    /// second; opened again after a failure.
    node: Option<NodeClient>,
    last: HashMap<PathBuf, Counts>,
    last_at: Option<Instant>,
}

impl Watcher {
    pub fn new(node_socket: PathBuf) -> Watcher {
        Watcher {
            node_socket,
            node: None,
            last: HashMap::new(),
            last_at: None,
        }
    }

    /// Looks at the host now; rates are over the time since the last look.
    pub fn look(&mut self) -> HostView {
        let now = Instant::now();
        let dt = self.last_at.map_or(0.0, |t| (now - t).as_secs_f64());
        let mut programs = Vec::new();
        let mut counts = HashMap::new();
        let mut donors: BTreeMap<String, DonorRow> = BTreeMap::new();
        let mut pid_to_program = HashMap::new();
        for tree in find_trees() {
            let files = run_tree::processes_in(
                &tree.dir.join(farmem_contract::TREE_STATS_DIR),
                0,
                tree.owner,
            );
            let all: Vec<&Stats> = files.iter().filter_map(|f| f.runtime.as_ref()).collect();
            let running: Vec<&Stats> = files
                .iter()
                .filter(|f| !f.is_final && tree.pids.contains(&f.pid))
                .filter_map(|f| f.runtime.as_ref())
                .collect();
            let mut c = Counts {
                zero: all.iter().map(|s| s.faults_zero).sum(),
                pool: all.iter().map(|s| s.faults_pool_hit).sum(),
                host_tier: all.iter().map(|s| s.faults_tier).sum(),
                remote: all.iter().map(|s| s.faults_remote).sum(),
                written: newest_write(&tree.dir.join(farmem_contract::TREE_STATS_DIR)),
                rates: FaultRates::default(),
            };
            if let Some(before) = self.last.get(&tree.dir) {
                c.rates = match c.written.duration_since(before.written) {
                    Ok(d) if !d.is_zero() => {
                        let dt = d.as_secs_f64();
                        let rate = |now: u64, then: u64| now.saturating_sub(then) as f64 / dt;
                        FaultRates {
                            zero: rate(c.zero, before.zero),
                            pool: rate(c.pool, before.pool),
                            host_tier: rate(c.host_tier, before.host_tier),
                            remote: rate(c.remote, before.remote),
                        }
                    }
                    // Nothing written since: the last rates still hold.
                    _ => before.rates,
                };
            }
            let prefetched: u64 = all.iter().map(|s| s.prefetched_pages).sum();
            let hits: u64 = all.iter().map(|s| s.prefetch_hits).sum();
            let page = PAGE_SIZE as u64;
            // One tree's use of each donor, added to the others'.
            for (addr, d) in run_tree::donors_in_use(&running) {
                let row = donors.entry(addr).or_insert_with(|| DonorRow {
                    addr: d.addr.clone(),
                    health: d.health.clone(),
                    capacity_bytes: 0,
                    used_bytes: 0,
                    programs: 0,
                    round_trip_ms: None,
                });
                row.health = run_tree::worse_health(&row.health, &d.health).to_string();
                row.used_bytes += d.bytes_taken;
                row.capacity_bytes = row.capacity_bytes.max(d.capacity_bytes);
                row.programs += 1;
            }
            for &p in &tree.pids {
                pid_to_program.insert(p, tree.root);
            }
            programs.push(ProgramRow {
                pid: tree.root,
                command: command_line(tree.root),
                processes: running.len(),
                local_mem_bytes: tree.local_mem_bytes,
                resident_bytes: running.iter().map(|s| s.resident_pages).sum::<u64>() * page,
                pooled_bytes: running.iter().map(|s| s.pool_pages).sum::<u64>() * page,
                faults_per_s: c.rates,
                prefetch_accuracy: (prefetched > 0).then(|| hits as f64 / prefetched as f64),
                slabs_degraded: running.iter().map(|s| s.slabs_degraded).sum(),
            });
            counts.insert(tree.dir, c);
        }
        for row in donors.values_mut() {
            row.round_trip_ms = round_trip(&row.addr);
        }
        let (node, node_error) = match self.node(&pid_to_program) {
            Ok(n) => (Some(n), None),
            Err(e) => (None, Some(e)),
        };
        self.last = counts;
        self.last_at = Some(now);
        programs.sort_by_key(|p| std::cmp::Reverse(p.resident_bytes));
        HostView {
            node,
            node_error,
            programs,
            donors: donors.into_values().collect(),
            interval_s: dt,
        }
    }

    /// The node's figures, its clients matched to the programs found.
    fn node(&mut self, pid_to_program: &HashMap<u32, u32>) -> Result<NodeRow, String> {
        let client = match self.node.take() {
            Some(c) => c,
            None => NodeClient::connect(&self.node_socket, NodeClientConfig::default())
                .map_err(|e| format!("no node on {}: {e}", self.node_socket.display()))?,
        };
        let me = std::process::id();
        let s = client
            .stats()
            .map_err(|e| format!("the node on {}: {e}", self.node_socket.display()))?;
        self.node = Some(client);
        Ok(NodeRow {
            socket: self.node_socket.display().to_string(),
            capacity_bytes: s.capacity_bytes,
            used_bytes: s.used_bytes,
            free_bytes: s.capacity_bytes.saturating_sub(s.used_bytes),
            under_pressure: s.under_pressure,
            clients: s
                .clients
                .iter()
                .filter(|c| c.pid != me)
                .map(|c| NodeClientRow {
                    pid: c.pid,
                    uid: c.uid,
                    slabs: c.slabs,
                    bytes: c.bytes,
                    program: pid_to_program.get(&c.pid).copied(),
                })
                .collect(),
        })
    }
}

/// When the newest file in `dir` was written (the epoch when none can be read).
fn newest_write(dir: &Path) -> SystemTime {
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.metadata().ok()?.modified().ok())
        .max()
        .unwrap_or(SystemTime::UNIX_EPOCH)
}

/// A `farmem run` tree found on the host.
struct Tree {
    dir: PathBuf,
    /// The uid of its processes: only its files are read (run as root, `top` follows paths a
    /// user's environment names; see `processes_in`).
    owner: u32,
    root: u32,
    pids: Vec<u32>,
    local_mem_bytes: u64,
}

/// Every process whose environment carries farmem's run settings with a tree directory,
/// grouped by that directory; a tree's root is its process whose parent is not in it.
fn find_trees() -> Vec<Tree> {
    use std::os::unix::fs::MetadataExt;
    /// What the processes naming one directory said: the budget, their user, (pid, ppid)s.
    struct Named {
        local_mem_bytes: u64,
        owner: u32,
        procs: Vec<(u32, u32)>,
    }
    let mut by_dir: BTreeMap<PathBuf, Named> = BTreeMap::new();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    for e in entries.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        let Some(settings) = run_settings_of(&e.path()) else {
            continue;
        };
        let Some(dir) = settings.tree_dir else {
            continue;
        };
        let Ok(uid) = std::fs::metadata(e.path()).map(|m| m.uid()) else {
            continue;
        };
        let ppid = parent_of(pid).unwrap_or(0);
        let entry = by_dir.entry(dir).or_insert_with(|| Named {
            local_mem_bytes: settings.local_mem_bytes,
            owner: uid,
            procs: Vec::new(),
        });
        // A process of another user naming the same directory is not of this tree.
        if entry.owner == uid {
            entry.procs.push((pid, ppid));
        }
    }
    by_dir
        .into_iter()
        // The directory itself, not a link, and its processes' user's own.
        .filter(|(dir, n)| {
            std::fs::symlink_metadata(dir).is_ok_and(|m| m.is_dir() && m.uid() == n.owner)
        })
        .map(|(dir, n)| {
            let Named {
                local_mem_bytes,
                owner,
                procs,
            } = n;
            let pids: Vec<u32> = procs.iter().map(|&(p, _)| p).collect();
            let root = procs
                .iter()
                .filter(|(_, pp)| !pids.contains(pp))
                .map(|&(p, _)| p)
                .min()
                .unwrap_or(pids[0]);
            Tree {
                dir,
                owner,
                root,
                pids,
                local_mem_bytes,
            }
        })
        .collect()
}

/// The run settings in a process's environment, if any (unreadable: not ours to see).
fn run_settings_of(proc_dir: &Path) -> Option<RunSettings> {
    let env = std::fs::read(proc_dir.join("environ")).ok()?;
    let key = format!("{}=", farmem_contract::run_settings::RUN_SETTINGS_VAR);
    let value = env
        .split(|&b| b == 0)
        .find_map(|v| v.strip_prefix(key.as_bytes()))?;
    serde_json::from_slice(value).ok()
}

fn parent_of(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may hold spaces and parentheses: fields start after the last ')'.
    let rest = &stat[stat.rfind(')')? + 2..];
    rest.split(' ').nth(1)?.parse().ok()
}

/// The process's command line, at most 60 characters.
fn command_line(pid: u32) -> String {
    let raw = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    let words: Vec<String> = raw
        .split(|&b| b == 0)
        .filter(|w| !w.is_empty())
        .map(|w| String::from_utf8_lossy(w).into_owned())
        .collect();
    let mut line = words.join(" ");
    if line.chars().count() > 60 {
        line = line.chars().take(59).collect::<String>() + "…";
    }
    line
}

/// How long a TCP connect to `addr` takes now, in milliseconds.
fn round_trip(addr: &str) -> Option<f64> {
    let sa: SocketAddr = addr.to_socket_addrs().ok()?.next()?;
    let start = Instant::now();
    TcpStream::connect_timeout(&sa, CONNECT_TIMEOUT).ok()?;
    Some(start.elapsed().as_secs_f64() * 1e3)
}
