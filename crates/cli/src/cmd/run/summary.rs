//! What `farmem run` says when the program ends: its exit status, the summary line and its
//! warnings.

use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;

use farmem_runtime::StatsFile;

use super::RunArgs;
use crate::cmd::units::human_bytes;

/// `farmem run`'s exit status when the program succeeded but the run ended degraded and
/// `--fail-if-degraded` was given (EX_TEMPFAIL).
pub const DEGRADED_STATUS: u8 = 75;

/// Exit status of a program whose start-up failed inside the preload library (it printed why).
const PRELOAD_FAILED_STATUS: i32 = 125;

/// Prints what the run ended with (unless `--quiet`) and returns `farmem run`'s exit status: the
/// program's (128 + n for a signal n), or [`DEGRADED_STATUS`].
pub(super) fn report(args: &RunArgs, status: &ExitStatus, account: Option<&StatsFile>) -> u8 {
    let mut code: u8 = match (status.code(), status.signal()) {
        (Some(c), _) => c as u8,
        (None, Some(s)) => 128u8.saturating_add(s as u8),
        _ => 1,
    };
    let degraded = account
        .and_then(|v| v.summary.as_ref())
        .and_then(|s| s.degraded());
    if let Some(why) = &degraded {
        if args.fail_if_degraded && code == 0 {
            eprintln!(
                "farmem: the run ended degraded ({why}): exit status {DEGRADED_STATUS} \
                 (--fail-if-degraded)"
            );
            code = DEGRADED_STATUS;
        } else if !args.quiet {
            eprintln!("farmem: warning: the run ended degraded: {why}");
        }
    }
    if !args.quiet {
        print_summary(account, code, args.local_mem);
    }
    code
}

/// The summary line and its warnings, or why there are none.
fn print_summary(account: Option<&StatsFile>, code: u8, local_mem: u64) {
    match account {
        Some(v) => {
            eprintln!("{}", summary_line(v));
            if let Some(w) = unmanaged_warning(v, local_mem) {
                eprintln!("{w}");
            }
            if let Some(w) = unpaged_warning(v) {
                eprintln!("{w}");
            }
            if let Some(w) = over_budget_warning(v) {
                eprintln!("{w}");
            }
        }
        // the library already said why it stopped the program
        None if code as i32 == PRELOAD_FAILED_STATUS => {}
        None => eprintln!(
            "farmem: no statistics: the program ended before farmem's library wrote any (it \
             exited with status {code})"
        ),
    }
}

/// The summary printed at exit, from the `summary` of the stats file (zeros and "n/a" when the
/// file has none: no runtime was started).
pub fn summary_line(stats: &StatsFile) -> String {
    let v = stats.summary.clone().unwrap_or_default();
    let pct = |x: Option<f64>| {
        x.map(|x| format!("{:.1}%", x * 100.0))
            .unwrap_or_else(|| "n/a".into())
    };
    // A tree's peak is of resident and pooled pages together (the coordinator sees no finer):
    // it is set against the whole of --local-mem, not the resident budget alone.
    let local = match &stats.tree {
        Some(t) if t.processes.len() > 1 => format!(
            "peak resident and pooled {} of {} local memory",
            human_bytes(v.peak_resident_bytes),
            human_bytes(v.budget_bytes + v.pool_bytes)
        ),
        _ => format!(
            "peak resident {} of {} budget (+ {} write-back pool)",
            human_bytes(v.peak_resident_bytes),
            human_bytes(v.budget_bytes),
            human_bytes(v.pool_bytes)
        ),
    };
    format!(
        "farmem: {} faults ({} host tier, {} remote), host tier in {} out {}, remote in {} out \
         {}, prefetch accuracy {} coverage {}, {local}",
        v.faults,
        v.faults_tier,
        v.faults_remote,
        human_bytes(v.tier_bytes_in),
        human_bytes(v.tier_bytes_out),
        human_bytes(v.remote_bytes_in),
        human_bytes(v.remote_bytes_out),
        pct(v.prefetch_accuracy),
        pct(v.prefetch_coverage),
    ) + &rss_part(stats)
        + &tree_part(stats)
        + &donor_part(&v)
        + &fork_part(&v)
        + &failure_part(&v)
}

/// What the run took of its donors' slabs and how much of it its far slabs filled, empty
/// when it held no donor slab at the end.
pub(super) fn donor_part(v: &farmem_contract::StatsSummary) -> String {
    if v.donor_bytes_taken == 0 {
        return String::new();
    }
    format!(
        "; donor slabs held {} ({} filled)",
        human_bytes(v.donor_bytes_taken),
        human_bytes(v.donor_bytes_filled)
    )
}

/// The summary's account of forks that lent far pages to their children, empty when
/// none did.
pub(super) fn fork_part(v: &farmem_contract::StatsSummary) -> String {
    if v.fork_pages_lent == 0 && v.pages_borrowed == 0 {
        return String::new();
    }
    format!(
        "; forks left {} far (host tier or donors) for their children ({} borrowed)",
        human_bytes(v.fork_pages_lent * 4096),
        human_bytes(v.pages_borrowed * 4096)
    )
}

/// The warning that the budget did not hold, with the last error, if it did not: faults stop
/// waiting for the evictor when write-back fails (every donor full or gone) or nothing can be
/// evicted, and resident memory then grows past the budget rather than the program stopping.
/// A run against a full external donor printed "peak resident 300.0 MiB of 96.0 MiB budget"
/// with nothing else to say it was wrong.
pub fn over_budget_warning(stats: &StatsFile) -> Option<String> {
    let v = stats.summary.as_ref()?;
    let tree = stats.tree.as_ref().is_some_and(|t| t.processes.len() > 1);
    let limit = if tree {
        v.budget_bytes + v.pool_bytes
    } else {
        v.budget_bytes
    };
    // A page of slack: the count is sampled while faults and evictions run.
    if v.peak_resident_bytes <= limit + 4096 {
        return None;
    }
    let why = match &v.last_error {
        Some(e) if v.send_errors > 0 || v.fetch_errors > 0 => format!(": the last error was: {e}"),
        // Each process counts the pages it maps: after a fork the sum counts a page both
        // share twice (a perl fork at 48 MiB: 86.8 MiB counted, the tree's Pss_Anon 84.1 MiB
        // of which about half outside the regions), so say the peak is an upper bound.
        _ if tree => " (counted per process: a page shared since a fork counts in each process \
                      that maps it, so the tree's memory may have stayed lower)"
            .to_string(),
        _ => String::new(),
    };
    Some(format!(
        "farmem: warning: the budget did not hold: peak {} against {}{why}",
        human_bytes(v.peak_resident_bytes),
        human_bytes(limit)
    ))
}

/// The warning naming the processes of the tree that ran without farmem, if any did.
pub fn unpaged_warning(stats: &StatsFile) -> Option<String> {
    let t = stats.tree.as_ref()?;
    if t.unpaged.is_empty() {
        return None;
    }
    let names: Vec<String> = t
        .unpaged
        .iter()
        .take(5)
        .map(|p| {
            format!(
                "{} (pid {}, peak RSS {})",
                p.name,
                p.pid,
                human_bytes(p.peak_rss_bytes)
            )
        })
        .collect();
    Some(format!(
        "farmem: warning: {} process(es) of the program ran without farmem, their memory not \
         paged nor bounded by --local-mem: {}{} (statically linked or setuid programs, and \
         programs started with a cleared environment, cannot load farmem's library)",
        t.unpaged.len(),
        names.join(", "),
        if t.unpaged.len() > 5 { ", …" } else { "" }
    ))
}

/// The summary's account of a tree of several processes, empty for one.
pub(super) fn tree_part(stats: &StatsFile) -> String {
    match &stats.tree {
        Some(t) if t.processes.len() > 1 => {
            // Each process counts the pages it maps, so a page a fork left shared (copy on
            // write) is counted by parent and child alike: the tree's physical memory is less
            // than this sum (a perl fork at 48 MiB: 77 MiB counted, 58 MiB of Pss_Anon in all,
            // ~20 MiB of it outside the regions).
            let mut s = format!(
                "; {} processes paged, sharing the budget: together at most {} resident and \
                 pooled (a page shared since a fork counts in each process that maps it)",
                t.processes.len(),
                human_bytes(t.peak_local_bytes)
            );
            if t.overcommitted_bytes > 0 {
                s += &format!(
                    " ({} granted beyond --local-mem: too many processes for their least share)",
                    human_bytes(t.overcommitted_bytes)
                );
            }
            s
        }
        _ => String::new(),
    }
}

/// The summary's process RSS beside the managed resident pages: the most outside the regions
/// (file-backed memory included) and the most of that which was anonymous. Empty when the
/// library did not measure it. The kernel's peak RSS counts the host tier's slabs the process
/// maps (shared memory the node holds), so it says so: a run whose tier held 900 MB read as a
/// process twice its real size.
pub(super) fn rss_part(stats: &StatsFile) -> String {
    let Some(u) = &stats.unmanaged else {
        return String::new();
    };
    format!(
        ", process peak RSS {} with the host-tier slabs it maps ({} at most outside farmem's \
         regions, of which {} at most anonymous)",
        human_bytes(u.peak_rss_bytes),
        human_bytes(u.peak_unmanaged_bytes),
        human_bytes(u.peak_anon_unmanaged_bytes)
    )
}

/// The warning printed after the summary when the program's anonymous memory outside the
/// regions (stacks, small mappings, a managed runtime's own heap) reached a tenth of
/// `--local-mem` (`local_mem`): it is not paged, so not bounded by it. File-backed memory
/// (code, mapped files) does not count: the kernel can drop its pages. Names the biggest
/// unmanaged mappings at the peak of all unmanaged memory.
pub fn unmanaged_warning(stats: &StatsFile, local_mem: u64) -> Option<String> {
    let u = stats.unmanaged.as_ref()?;
    if u.peak_anon_unmanaged_bytes <= local_mem / 10 {
        return None;
    }
    let biggest = if u.biggest_at_peak.is_empty() {
        &u.biggest
    } else {
        &u.biggest_at_peak
    };
    let names: Vec<String> = biggest
        .iter()
        .map(|m| format!("{} {}", m.name, human_bytes(m.rss_bytes)))
        .collect();
    Some(format!(
        "farmem: warning: {} of the process's anonymous memory was outside farmem's regions \
         (largest: {}); it is not paged, so not bounded by --local-mem {}: only the heap and \
         private anonymous mappings of at least --mmap-threshold are (thread stacks, smaller \
         mappings and a managed runtime's own heap are not)",
        human_bytes(u.peak_anon_unmanaged_bytes),
        names.join(", "),
        human_bytes(local_mem)
    ))
}

/// The summary's account of donor failures, empty when none happened.
pub(super) fn failure_part(v: &farmem_contract::StatsSummary) -> String {
    let mut s = String::new();
    // Failed fetches and sends come first: a run whose fetches all failed served no fault
    // and read nothing, and without them its summary said only "0 faults … remote in 0 B".
    if v.fetch_errors > 0 || v.send_errors > 0 {
        s += &format!(
            "; {} fetches and {} sends failed",
            v.fetch_errors, v.send_errors
        );
        if v.seal_rejected > 0 {
            s += &format!(
                " ({} fetched pages failed their seal check: altered, swapped or stale)",
                v.seal_rejected
            );
        }
    }
    if v.dead_donors.is_empty()
        && v.donors_back.is_empty()
        && v.failovers == 0
        && v.backup_pages_read == 0
    {
        return s;
    }
    s += &format!("; {} reads failed over", v.failovers);
    if !v.dead_donors.is_empty() {
        s += &format!(", dead donors: {}", v.dead_donors.join("; "));
    }
    if !v.donors_back.is_empty() {
        s += &format!(", donors dead for a while: {}", v.donors_back.join("; "));
    }
    if v.slabs_healed > 0 {
        s += &format!(", {} slab copies re-made", v.slabs_healed);
        if let Some(t) = v.last_heal_s {
            s += &format!(" in {t:.1} s");
        }
    }
    if v.slabs_degraded > 0 {
        s += &format!(", {} slabs short of copies at exit", v.slabs_degraded);
    }
    if v.backup_pages_read > 0 {
        s += &format!(", {} pages read from the backup file", v.backup_pages_read);
    }
    s
}
