//! `farmem run --local-mem SIZE -- COMMAND [ARGS…]`: runs an unmodified, dynamically linked
//! program with its heap and large anonymous mappings paged to donors under a local budget.
//!
//! # Design
//!
//! This command checks everything it can *before* starting the program (the command exists and
//! is dynamically linked, the budget is above the runtime's minimum, userfaultfd is usable, the
//! donors answer and accept the token), starts the embedded local donor when no `--donor` is
//! given (a `farmem donor` child on 127.0.0.1, so the program itself never spawns processes),
//! then starts the program with `libfarmem_preload.so` in `LD_PRELOAD` and its settings in one
//! environment variable (`farmem_contract::run_settings`, JSON), which every process of the
//! program's tree inherits; the processes share `--local-mem` through the budget coordinator
//! this command hosts (crate farmem-tree). The library (crates/preload) starts the runtime inside the program
//! and rewrites the stats file every second and at exit; this command reads that file after the
//! program ends to print the summary line. The exit status is the program's (128 + n for a
//! program killed by signal n); 127 when COMMAND is not found, 126 when it cannot be run (not
//! executable, not a program), as shells and `env` answer; 1 for farmem's own errors.
//!
//! # Limitations
//!
//! - Every process of the tree is under farmem (see `run_tree` and docs/architecture.md, "The
//!   process tree"), except programs that clear their environment or are statically linked or
//!   setuid: the loader ignores `LD_PRELOAD` there.
//! - A fork lends the child the parent's far pages: those in the host tier (it reads them from
//!   there) and those on donors (it reads them there as the parent's client), except with
//!   `--backup-file`, where donor pages come back for the length of the fork. Pages in the
//!   write-back pool come back (they were within the budget already). Resident pages the
//!   parent shares with the child are counted by both and evicted by dropping them, never
//!   copied.
//! - A program killed by a signal leaves the stats of its last one-second snapshot.

use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{bail, Context};
use clap::Args;
use farmem_runtime::SealMode;

use crate::cmd::run_tree;
use crate::cmd::units::parse_size;

/// Arguments of `farmem run`.
#[derive(Args, Debug)]
pub struct RunArgs {
    /// Local memory for the program's far-memory regions (e.g. 256MiB, 1GiB): resident pages
    /// and the write-back pool (a fifth, at most 64 MiB) together stay within it.
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    pub local_mem: u64,
    /// Donor to page to (`host:port`); repeat for several. Default: an embedded local donor.
    /// A donor that cannot be reached at start is reported, and the program starts with the
    /// others (it fails only when none answers).
    #[arg(long = "donor", value_name = "ADDR")]
    pub donors: Vec<String>,
    /// Copies of every page on distinct donors (1 to 4; default 2 with two or more donors,
    /// else 1). A page counts as written back once every live copy has it; a read whose donor
    /// died, stalls or is cut off is served by another copy, and a dead donor's slabs are
    /// copied again elsewhere in the background. With 1 copy, a lost donor loses pages unless
    /// --backup-file is given.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u8).range(1..=4))]
    pub replicas: Option<u8>,
    /// Also write every page sent to donors to this local file (created new, mode 600,
    /// removed at exit), in the background; pages whose every copy is gone are read from it,
    /// and with no donor left pages go there directly, so nothing is lost (at disk speed).
    #[arg(long, value_name = "PATH")]
    pub backup_file: Option<PathBuf>,
    /// Most bytes a second re-replication copies between donors after a donor is lost (e.g.
    /// 256MiB, the default; at most 100GiB), so healing does not take the program's bandwidth.
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    pub heal_rate: Option<u64>,
    /// File holding the donors' token (1 to 256 bytes, one trailing newline stripped; mode
    /// 600: a file readable by others is refused).
    #[arg(long, value_name = "FILE")]
    pub token_file: Option<PathBuf>,
    /// Prefetcher (see `farmem sim --help` for the names).
    #[arg(long, value_name = "NAME")]
    pub prefetch: Option<String>,
    /// How prefetched pages are made local: `buffer` keeps them in the write-back pool (the
    /// first touch is a cheap local fault that measures every hit exactly); `marker`
    /// installs each window into the program's memory at once but for its first page, so
    /// most prefetched pages are touched without any fault (hits are then inferred).
    #[arg(long, value_name = "MODE", value_parser = ["buffer", "marker"])]
    pub prefetch_install: Option<String>,
    /// Eviction policy: `fifo` (default: arrival order), `clock` (second chance for pages seen
    /// in use), `refault` (pages that fault back soon after eviction are protected from the
    /// rest). Each evicts used prefetched pages first (Leap).
    #[arg(long, value_name = "NAME")]
    pub evict: Option<String>,
    /// Seal pages before they leave the program: AES-256-GCM with a key that never leaves the
    /// process, bound to each page's far address and version, so a donor can neither read
    /// pages nor hand back an altered, swapped or older one (such a page is never installed).
    /// `auto` seals when any donor is on another host (not for the embedded donor or
    /// loopback donors); about 1 µs a page each way.
    #[arg(long, value_name = "MODE", default_value = "auto",
          value_parser = |s: &str| s.parse::<SealMode>().map_err(|e| e.to_string()))]
    pub seal: SealMode,
    /// When far memory runs out (every donor full or gone, the node out of room) and the
    /// program is at its budget: `fail` (the default) holds the budget as a container's
    /// memory limit does — faulting threads wait for write-back, and if far memory is still
    /// unavailable after --over-budget-wait the program is killed (SIGKILL, like an OOM kill)
    /// with a message saying what ran out; `allow` lets the program grow past its budget
    /// instead, with a warning (in a container with a hard limit that usually ends in an OOM
    /// kill anyway, later and without saying why).
    #[arg(long, value_name = "MODE", default_value = "fail", value_parser = ["fail", "allow"])]
    pub over_budget: String,
    /// Seconds far memory may stay unavailable before `--over-budget fail` ends the program
    /// (a donor that stalls or restarts is usually failed over or back within seconds).
    #[arg(long, value_name = "SECONDS", default_value_t = 30,
          value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub over_budget_wait: u64,
    /// Exit with status 75 (EX_TEMPFAIL) when the program succeeded but the run ended
    /// degraded: far slabs short of copies, a donor dead (or dead for a while). For scripts
    /// that must know their data was at risk.
    #[arg(long)]
    pub fail_if_degraded: bool,
    /// Write the runtime's counters as JSON to FILE, every second and at exit. Each write
    /// replaces FILE atomically (a randomly named temporary file next to it, mode 0600, renamed
    /// over it); an existing FILE that is a link, a FIFO, a device or another user's file is
    /// refused.
    #[arg(long, value_name = "FILE")]
    pub stats: Option<PathBuf>,
    /// Serve the program tree's paging counters in Prometheus form at http://ADDR/metrics
    /// while it runs (e.g. 127.0.0.1:9179; port 0 picks one, logged at start): faults by
    /// source, bytes in and out by tier, resident and pooled memory against --local-mem,
    /// prefetch accuracy and coverage, each donor's health and copies, seal rejections, pages
    /// lost. Figures are at most a second old; the endpoint stops when the run ends.
    #[arg(long, value_name = "ADDR")]
    pub metrics: Option<String>,
    /// Record the program's page accesses into a trace file (for `farmem sim`). A new FILE gets
    /// mode 0600; an existing one must be this user's regular file (it is truncated): a link,
    /// a FIFO, a device or another user's file is refused.
    #[arg(long, value_name = "FILE")]
    pub record_trace: Option<PathBuf>,
    /// Private anonymous mappings (writable, or PROT_NONE reservations) of at least this size
    /// become far-memory regions (at most the machine's memory).
    #[arg(long, value_name = "SIZE", default_value = "256KiB", value_parser = parse_size)]
    pub mmap_threshold: u64,
    /// Address space reserved for the program's heap (virtual; costs nothing until used).
    #[arg(long, value_name = "SIZE", default_value = "256GiB", value_parser = parse_size)]
    pub heap_reserve: u64,
    /// The host tier: the `farmem node` listening on this socket (default: the host's node on
    /// /run/farmem/node.sock if one runs). Evicted pages go there first (one copy, shared
    /// memory), then to the donors.
    #[arg(long, value_name = "PATH")]
    pub node: Option<PathBuf>,
    /// What holds evicted pages when no donor is named and no node runs on this host: `node`
    /// starts a private `farmem node` for the program (shared memory, one copy each way);
    /// `tcp` starts an embedded `farmem donor` on loopback instead, and uses no host tier
    /// (for comparison).
    #[arg(long, value_name = "KIND", default_value = "node", value_parser = ["node", "tcp"])]
    pub local_donor: String,
    /// Capacity of the private node or embedded donor (default: 4 GiB plus twice the budget;
    /// a node's is capped at this machine's memory).
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    pub local_donor_capacity: Option<u64>,
    /// Diagnostics: place the heap and mappings as usual but start no paging runtime.
    #[arg(long, hide = true)]
    pub allocator_only: bool,
    /// Print no summary line at exit (nor the warning about memory outside farmem's regions).
    #[arg(long)]
    pub quiet: bool,
    /// The program and its arguments (after `--`).
    #[arg(last = true, required = true, value_name = "COMMAND")]
    pub command: Vec<OsString>,
}

mod launch;
mod metrics;
mod preflight;
mod program;
mod servers;
mod summary;

pub use program::*;
use servers::{start_coordinator, start_far};
use summary::report;
#[cfg(test)]
use summary::*;

/// Runs `farmem run`: checks, starts what pages the program, runs it, reports.
pub fn run(args: RunArgs) -> anyhow::Result<ExitCode> {
    let (cmd, cmd_args) = args
        .command
        .split_first()
        .context("no COMMAND given after `--`")?;
    let mut checked = check(&args, cmd)?;
    let far = start_far(&args, checked.token.clone())?;
    let backup_file = check_copies(&args, &far.donors)?;
    let (tree, coordinator) = start_coordinator(&args)?;
    let _metrics = match checked.metrics.take() {
        Some(l) => {
            let m = metrics::serve(l, tree.stats_dir(), coordinator.view(), args.local_mem)?;
            tracing::info!("metrics at http://{}/metrics", m.addr());
            Some(m)
        }
        None => None,
    };
    if let Some(p) = &args.stats {
        let _ = std::fs::remove_file(p);
    }
    let settings = launch::settings(&args, &far, backup_file.clone(), &tree)?;
    let command = launch::command(&checked, cmd, cmd_args, &settings)?;
    let (status, account) =
        launch::run_program(command, &checked.program, &args, &tree, &coordinator)?;
    if let (Some(p), Some(acc)) = (&args.stats, &account) {
        if let Err(e) = run_tree::write(p, acc) {
            eprintln!("farmem: warning: writing {}: {e}", p.display());
        }
    }
    drop(coordinator);
    drop(far);
    // The runtime lives until the process ends and never drops its backup file: it holds the
    // program's pages, so it goes with the program (also when the program crashed).
    if let Some(p) = &backup_file {
        remove_backup_file(p);
    }
    Ok(ExitCode::from(report(&args, &status, account.as_ref())))
}

/// What the checks before anything starts found: the program, the preload library, the token,
/// the metrics listener.
struct Checked {
    program: PathBuf,
    lib: PathBuf,
    token: Option<Vec<u8>>,
    metrics: Option<std::net::TcpListener>,
}

/// Checks the command and every flag that can be checked before anything starts.
fn check(args: &RunArgs, cmd: &OsStr) -> anyhow::Result<Checked> {
    let program = resolve_command(cmd, std::env::var_os("PATH").as_deref())?;
    check_preloadable(&program)?;
    let lib = crate::cmd::preload::find_preload_lib()?;
    preflight::check_budget(args.local_mem)?;
    let min_reserve = farmem_contract::run_settings::MIN_HEAP_RESERVE_BYTES;
    if args.heap_reserve < min_reserve {
        bail!(
            "--heap-reserve {} bytes is too small: give at least {} (it is address space, not \
             memory: the default 256GiB costs nothing until used)",
            args.heap_reserve,
            crate::cmd::units::human_bytes(min_reserve)
        );
    }
    if !args.allocator_only {
        preflight::check_userfaultfd()?;
    }
    let token = args
        .token_file
        .as_deref()
        .map(crate::cmd::donor::read_token_file)
        .transpose()?;
    check_flags(args)?;
    let metrics = args.metrics.as_deref().map(metrics::bind).transpose()?;
    Ok(Checked {
        program,
        lib,
        token,
        metrics,
    })
}

/// The flags naming files, policies and sizes.
fn check_flags(args: &RunArgs) -> anyhow::Result<()> {
    if let Some(p) = &args.stats {
        preflight::check_writable("--stats", p)?;
    }
    if let Some(p) = &args.record_trace {
        preflight::check_writable("--record-trace", p)?;
    }
    if let Some(p) = &args.prefetch {
        preflight::check_prefetch(p)?;
    }
    if let Some(e) = &args.evict {
        preflight::check_evict(e)?;
    }
    crate::cmd::stale_dirs::sweep(&std::env::temp_dir());

    let slab = farmem_runtime::RuntimeConfig::default().embedded_slab_size_bytes;
    if let Some(c) = args.local_donor_capacity.filter(|&c| c < slab) {
        bail!(
            "--local-donor-capacity {c} bytes holds not one slab of {}: give at least that",
            crate::cmd::units::human_bytes(slab)
        );
    }
    preflight::check_sizes(args)
}

/// Checks the copies asked for against the donors, and the backup file (returned, resolved).
fn check_copies(args: &RunArgs, donors: &[String]) -> anyhow::Result<Option<PathBuf>> {
    if let Some(r) = args.replicas {
        let n = donors.len().max(1);
        if usize::from(r) > n {
            anyhow::bail!(
                "--replicas {r}: only {n} donor(s) to hold copies (at most one copy per donor); \
                 name more with --donor, or lower --replicas"
            );
        }
    }
    let backup_file = match &args.backup_file {
        Some(p) => Some(preflight::check_backup_file(p)?),
        None => None,
    };
    if args.heal_rate == Some(0) {
        anyhow::bail!("--heal-rate 0 would never heal: give a rate such as 256MiB");
    }
    Ok(backup_file)
}

fn remove_backup_file(p: &Path) {
    if let Err(e) = std::fs::remove_file(p) {
        if e.kind() != std::io::ErrorKind::NotFound {
            eprintln!(
                "farmem: warning: removing the backup file {}: {e}",
                p.display()
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use farmem_contract::StatsFile;
    use farmem_runtime::{StatsSummary, UnmanagedMapping, UnmanagedReport};
    use std::ffi::OsStr;

    #[test]
    fn classifies_scripts_and_elf() {
        assert_eq!(
            classify_bytes(b"#!/bin/sh -e\necho hi\n"),
            ExecKind::Script {
                interpreter: "/bin/sh".into(),
                arg: Some("-e".into())
            }
        );
        assert_eq!(classify_bytes(b"hello"), ExecKind::Unknown);
        // this test binary is a dynamically linked program for this machine
        let me = std::env::current_exe().unwrap();
        assert_eq!(classify_executable(&me).unwrap(), ExecKind::Dynamic);
        // an ELF header without program headers reads as static
        let mut elf = vec![0u8; 64];
        elf[..4].copy_from_slice(b"\x7fELF");
        elf[4] = 2;
        elf[5] = 1;
        elf[18..20].copy_from_slice(&native_machine().to_le_bytes());
        assert_eq!(classify_bytes(&elf), ExecKind::Static);
        elf[4] = 1;
        assert!(matches!(
            classify_bytes(&elf),
            ExecKind::ForeignElf { class64: false, .. }
        ));
    }

    #[test]
    fn resolves_commands_like_execvp() {
        let sh = resolve_command(OsStr::new("sh"), Some(OsStr::new("/nonexistent:/bin"))).unwrap();
        assert_eq!(sh, PathBuf::from("/bin/sh"));
        let e = resolve_command(OsStr::new("no-such-program-xyz"), Some(OsStr::new("/bin")))
            .unwrap_err();
        assert!(e.to_string().contains("COMMAND not found"), "{e}");
        let plain = std::env::temp_dir().join(format!("farmem-run-test-{}", std::process::id()));
        std::fs::write(&plain, "not a program").unwrap();
        let e = resolve_command(plain.as_os_str(), None).unwrap_err();
        std::fs::remove_file(&plain).unwrap();
        assert!(e.to_string().contains("not an executable"), "{e}");
        let e = resolve_command(OsStr::new("/no/such/dir/prog"), None).unwrap_err();
        assert!(e.to_string().contains("does not exist"), "{e}");
    }

    #[test]
    fn summary_line_reports_the_counters() {
        let v = StatsFile {
            summary: Some(StatsSummary {
                faults: 12,
                faults_remote: 3,
                faults_tier: 5,
                tier_bytes_in: 20480,
                tier_bytes_out: 4096,
                remote_bytes_in: 2048,
                remote_bytes_out: 1048576,
                peak_resident_bytes: 268435456,
                budget_bytes: 268435456,
                pool_bytes: 65536,
                prefetch_accuracy: Some(0.5),
                prefetch_coverage: Some(0.25),
                ..StatsSummary::default()
            }),
            ..StatsFile::default()
        };
        let s = summary_line(&v);
        assert!(s.contains("12 faults (5 host tier, 3 remote)"), "{s}");
        assert!(s.contains("host tier in 20.0 KiB out 4.0 KiB"), "{s}");
        assert!(s.contains("remote in 2.0 KiB out 1.0 MiB"), "{s}");
        assert!(s.contains("accuracy 50.0% coverage 25.0%"), "{s}");
        assert!(s.contains("peak resident 256.0 MiB"), "{s}");
        assert!(s.contains("(+ 64.0 KiB write-back pool)"), "{s}");
        assert!(!s.contains("forks"), "no fork lent anything: {s}");
        // A tree of several processes: its peak (resident and pooled pages together) is set
        // against the whole local memory, not against the resident budget alone.
        let tree = summary_line(&StatsFile {
            summary: Some(StatsSummary {
                peak_resident_bytes: 63 << 20,
                budget_bytes: 51 << 20,
                pool_bytes: 13 << 20,
                ..StatsSummary::default()
            }),
            tree: Some(farmem_contract::TreeStats {
                processes: vec![farmem_contract::TreeProcess::default(); 2],
                peak_local_bytes: 63 << 20,
                ..farmem_contract::TreeStats::default()
            }),
            ..StatsFile::default()
        });
        assert!(
            tree.contains("peak resident and pooled 63.0 MiB of 64.0 MiB local memory"),
            "{tree}"
        );
        assert!(!tree.contains("budget (+"), "{tree}");
        assert!(
            tree.contains("counts in each process that maps it"),
            "the sum counts shared pages twice, and says so: {tree}"
        );
        let forked = summary_line(&StatsFile {
            summary: Some(StatsSummary {
                fork_pages_lent: 512,
                pages_borrowed: 256,
                ..StatsSummary::default()
            }),
            ..StatsFile::default()
        });
        assert!(
            forked.ends_with(
                "; forks left 2.0 MiB far (host tier or donors) for their children (1.0 MiB borrowed)"
            ),
            "{forked}"
        );
        let none = summary_line(&StatsFile {
            summary: Some(StatsSummary::default()),
            ..StatsFile::default()
        });
        assert!(none.contains("accuracy n/a"), "{none}");
        assert!(!none.contains("RSS"), "not measured, not shown: {none}");
    }

    #[test]
    fn a_donor_dead_for_a_while_is_named_and_makes_the_run_degraded() {
        let v = StatsSummary {
            donors_back: vec!["10.0.0.5:7070: stall (connections accepted, requests \
                               unanswered), back after 10.2 s"
                .into()],
            ..StatsSummary::default()
        };
        let s = summary_line(&StatsFile {
            summary: Some(v.clone()),
            ..StatsFile::default()
        });
        assert!(
            s.contains("donors dead for a while: 10.0.0.5:7070: stall"),
            "{s}"
        );
        assert!(v.degraded().unwrap().contains("back after 10.2 s"));
        assert_eq!(StatsSummary::default().degraded(), None);
    }

    #[test]
    fn failed_fetches_are_counted_in_the_summary() {
        // After failed fetches from a hostile donor the summary said "0 faults … remote in
        // 0 B" and nothing else.
        let line = |fetch_errors: u64, seal_rejected: u64, send_errors: u64| {
            summary_line(&StatsFile {
                summary: Some(StatsSummary {
                    fetch_errors,
                    seal_rejected,
                    send_errors,
                    ..StatsSummary::default()
                }),
                ..StatsFile::default()
            })
        };
        let s = line(5, 5, 1);
        assert!(
            s.contains("; 5 fetches and 1 sends failed (5 fetched pages failed their seal check"),
            "{s}"
        );
        let s = line(2, 0, 0);
        assert!(
            s.contains("; 2 fetches and 0 sends failed") && !s.contains("seal"),
            "{s}"
        );
        let s = line(0, 0, 0);
        assert!(!s.contains("failed"), "nothing failed: {s}");
    }

    #[test]
    fn a_budget_that_did_not_hold_is_said_with_the_last_error() {
        let at = |peak: u64, send_errors: u64| StatsFile {
            summary: Some(StatsSummary {
                peak_resident_bytes: peak,
                budget_bytes: 96 << 20,
                pool_bytes: 4 << 20,
                send_errors,
                last_error: Some("write-back failed: the donors are full".into()),
                ..StatsSummary::default()
            }),
            ..StatsFile::default()
        };
        assert_eq!(over_budget_warning(&at(96 << 20, 0)), None);
        let w = over_budget_warning(&at(300 << 20, 3)).unwrap();
        assert!(
            w.contains("did not hold: peak 300.0 MiB against 96.0 MiB")
                && w.contains("the donors are full"),
            "{w}"
        );
        let w = over_budget_warning(&at(300 << 20, 0)).unwrap();
        assert!(!w.contains("last error"), "no error to blame: {w}");
        assert!(!w.contains("counted per process"), "one process: {w}");
        // A tree's count may count pages shared since a fork twice: said so.
        let mut tree = at(300 << 20, 0);
        tree.tree = Some(farmem_contract::TreeStats {
            processes: vec![Default::default(), Default::default()],
            ..Default::default()
        });
        let w = over_budget_warning(&tree).unwrap();
        assert!(
            w.contains("peak 300.0 MiB against 100.0 MiB (counted per process: a page shared"),
            "{w}"
        );
    }

    /// A measured process whose unmanaged memory peaked at `peak_unmanaged_bytes`, of which
    /// at most `peak_anon_unmanaged_bytes` anonymous.
    fn unmanaged(peak_unmanaged_bytes: u64, peak_anon_unmanaged_bytes: u64) -> StatsFile {
        let m = |name: &str, mib: u64| UnmanagedMapping {
            start: 0x7f00_0000_0000,
            len: mib << 20,
            rss_bytes: mib << 20,
            name: name.into(),
        };
        StatsFile {
            summary: Some(StatsSummary::default()),
            unmanaged: Some(UnmanagedReport {
                peak_rss_bytes: 100 << 20,
                peak_unmanaged_bytes,
                peak_anon_unmanaged_bytes,
                biggest: vec![m("[stack]", 1)],
                biggest_at_peak: vec![m("[anon]", 64), m("/usr/bin/python3.11", 2)],
                ..UnmanagedReport::default()
            }),
            ..StatsFile::default()
        }
    }

    #[test]
    fn the_summary_gives_the_peak_rss_and_what_was_unmanaged() {
        let s = summary_line(&unmanaged(70 << 20, 66 << 20));
        assert!(
            s.ends_with(
                "write-back pool), process peak RSS 100.0 MiB with the host-tier slabs it \
                 maps (70.0 MiB at most outside farmem's regions, of which 66.0 MiB at most \
                 anonymous)"
            ),
            "{s}"
        );
    }

    #[test]
    fn unmanaged_memory_over_a_tenth_of_local_mem_is_warned_about() {
        let w = unmanaged_warning(&unmanaged(70 << 20, 66 << 20), 32 << 20).unwrap();
        assert!(
            w.starts_with("farmem: warning: 66.0 MiB of the process's anonymous memory"),
            "{w}"
        );
        assert!(
            w.contains("(largest: [anon] 64.0 MiB, /usr/bin/python3.11 2.0 MiB)"),
            "the mappings at the peak: {w}"
        );
        assert!(w.contains("not bounded by --local-mem 32.0 MiB"), "{w}");
        // A tenth of the budget or less: no warning; not measured: none either.
        assert_eq!(
            unmanaged_warning(&unmanaged(3 << 20, 3 << 20), 32 << 20),
            None
        );
        assert_eq!(
            unmanaged_warning(&unmanaged(70 << 20, 66 << 20), 1 << 30),
            None
        );
        // Much unmanaged memory but little of it anonymous (a mapped file, the program's code:
        // the kernel can drop those pages): no warning.
        assert_eq!(
            unmanaged_warning(&unmanaged(200 << 20, 3 << 20), 32 << 20),
            None
        );
        assert_eq!(unmanaged_warning(&StatsFile::default(), 1 << 20), None);
    }
}
