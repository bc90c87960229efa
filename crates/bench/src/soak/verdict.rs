//! The soak's verdict: every run's own verdict and output, farmem's counters added over every
//! run, and each injected failure beside what the runtimes that met it reported.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Instant;

use serde::Serialize;

use super::failures::Kind;
use super::programs::{Name, Outcome};

/// A failure as it was injected.
pub(crate) struct Injected {
    pub kind: Kind,
    /// The donor it hit (None: the node).
    pub donor: Option<usize>,
    pub started: Instant,
    pub ended: Instant,
    /// Why injecting or undoing it failed, if it did (the soak then fails: the cluster is not
    /// what the schedule says).
    pub error: Option<String>,
    /// Whether the runs going had repaired the previous failures when it was injected (a
    /// failure hitting a donor waits for that, up to a limit: see `repaired`).
    pub after_repair: bool,
}

/// A finished run of one program.
pub(crate) struct Run {
    pub program: Name,
    pub outcome: Outcome,
}

#[derive(Serialize)]
pub(crate) struct Verdict {
    pub seed: u64,
    pub minutes: f64,
    pub passed: bool,
    pub failures_injected: usize,
    pub failures: Vec<FailureReport>,
    pub runs: usize,
    pub runs_by_program: BTreeMap<String, ProgramReport>,
    pub wrong_outputs: usize,
    pub wrong: Vec<WrongRun>,
    pub state_lost_pages: u64,
    pub pages_lost: u64,
    pub seal_rejected: u64,
    /// Donor deaths a runtime reported that no injected failure explains (the donor was not
    /// hit while the run lived, or was hit by a failure of another kind).
    pub failures_misreported: usize,
    pub misreported: Vec<String>,
    /// Donor failures that no run alive meanwhile reported (a short one may end before any
    /// request times out: not an error).
    pub failures_unnoticed: usize,
    /// Runs that left no stats file (their counters are missing from the sums above).
    pub runs_without_stats: usize,
    /// Failures injected while a run was still short of copies after the previous one (its
    /// heal took longer than the soak waits): two losses at once, beyond what two copies
    /// promise, so a page lost then is not a fault of the heal alone.
    pub injected_before_repair: usize,
}

#[derive(Serialize)]
pub(crate) struct FailureReport {
    pub at_s: f64,
    pub kind: Kind,
    pub target: String,
    pub hold_s: f64,
    /// The causes the runtimes alive meanwhile reported for this donor.
    pub seen_as: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

#[derive(Serialize, Default)]
pub(crate) struct ProgramReport {
    pub runs: usize,
    pub wrong: usize,
}

#[derive(Serialize)]
pub(crate) struct WrongRun {
    pub program: String,
    pub at_s: f64,
    pub why: String,
}

/// A donor death as a runtime reported it: "ADDR: CAUSE (…)[, back after X s]".
fn parse_death(s: &str) -> Option<(SocketAddr, String)> {
    let (addr, rest) = s.split_once(": ")?;
    let cause = rest.split_whitespace().next()?.trim_end_matches(',');
    Some((addr.parse().ok()?, cause.to_string()))
}

fn overlaps(f: &Injected, o: &Outcome) -> bool {
    f.started <= o.ended && f.ended >= o.started
}

pub(crate) fn judge(
    seed: u64,
    minutes: f64,
    t0: Instant,
    addrs: &[SocketAddr],
    injected: &[Injected],
    runs: &[Run],
) -> Verdict {
    let at = |t: Instant| t.saturating_duration_since(t0).as_secs_f64();
    let mut by_program: BTreeMap<String, ProgramReport> = BTreeMap::new();
    let mut wrong = Vec::new();
    let (mut state_lost, mut lost, mut rejected, mut no_stats) = (0, 0, 0, 0);
    let mut seen: Vec<Vec<String>> = vec![Vec::new(); injected.len()];
    let mut misreported = Vec::new();
    for r in runs {
        let name = format!("{:?}", r.program);
        let e = by_program.entry(name.clone()).or_default();
        e.runs += 1;
        if let Some(why) = &r.outcome.wrong {
            e.wrong += 1;
            wrong.push(WrongRun {
                program: name.clone(),
                at_s: at(r.outcome.started),
                why: why.clone(),
            });
        }
        let Some(s) = &r.outcome.summary else {
            no_stats += 1;
            continue;
        };
        state_lost += s.state_lost_pages;
        lost += s.pages_lost;
        rejected += s.seal_rejected;
        for (addr, cause) in s
            .dead_donors
            .iter()
            .chain(&s.donors_back)
            .filter_map(|d| parse_death(d))
        {
            let donor = addrs.iter().position(|a| *a == addr);
            let mut explained = false;
            for (i, f) in injected.iter().enumerate() {
                if f.donor.is_some() && f.donor == donor && overlaps(f, &r.outcome) {
                    if !seen[i].contains(&cause) {
                        seen[i].push(cause.clone());
                    }
                    explained |= f.kind.causes().contains(&cause.as_str());
                }
            }
            if !explained {
                misreported.push(format!(
                    "{name} (started at {:.0} s) reported donor {addr} dead of {cause}, which no \
                     failure injected into it while the run lived explains",
                    at(r.outcome.started)
                ));
            }
        }
    }
    let failures: Vec<FailureReport> = injected
        .iter()
        .zip(seen)
        .map(|(f, seen_as)| FailureReport {
            at_s: at(f.started),
            kind: f.kind,
            target: f
                .donor
                .map_or("node".into(), |d| format!("donor {d} ({})", addrs[d])),
            hold_s: f.ended.saturating_duration_since(f.started).as_secs_f64(),
            seen_as,
            error: f.error.clone(),
        })
        .collect();
    let unnoticed = failures
        .iter()
        .zip(injected)
        .filter(|(r, f)| !f.kind.causes().is_empty() && r.seen_as.is_empty())
        .count();
    let every_program_ran = by_program.values().all(|p| p.runs > 0);
    let passed = wrong.is_empty()
        && state_lost == 0
        && lost == 0
        && rejected == 0
        && misreported.is_empty()
        && injected.iter().all(|f| f.error.is_none())
        && !runs.is_empty()
        && every_program_ran;
    Verdict {
        seed,
        minutes,
        passed,
        failures_injected: injected.len(),
        failures,
        runs: runs.len(),
        runs_by_program: by_program,
        wrong_outputs: wrong.len(),
        wrong,
        state_lost_pages: state_lost,
        pages_lost: lost,
        seal_rejected: rejected,
        failures_misreported: misreported.len(),
        misreported,
        failures_unnoticed: unnoticed,
        injected_before_repair: injected.iter().filter(|i| !i.after_repair).count(),
        runs_without_stats: no_stats,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use farmem_contract::StatsSummary;
    use std::time::Duration;

    fn run(t0: Instant, from: u64, to: u64, deaths: &[&str], wrong: Option<&str>) -> Run {
        Run {
            program: Name::Forker,
            outcome: Outcome {
                started: t0 + Duration::from_secs(from),
                ended: t0 + Duration::from_secs(to),
                wrong: wrong.map(String::from),
                summary: Some(StatsSummary {
                    donors_back: deaths.iter().map(|s| s.to_string()).collect(),
                    ..Default::default()
                }),
            },
        }
    }

    fn failure(t0: Instant, kind: Kind, donor: usize, from: u64, to: u64) -> Injected {
        Injected {
            kind,
            donor: Some(donor),
            started: t0 + Duration::from_secs(from),
            ended: t0 + Duration::from_secs(to),
            error: None,
            after_repair: true,
        }
    }

    #[test]
    fn deaths_are_matched_to_the_failures_that_explain_them() {
        let t0 = Instant::now();
        let addrs: Vec<SocketAddr> = vec![
            "10.0.0.2:7000".parse().unwrap(),
            "10.0.0.6:7000".parse().unwrap(),
        ];
        let inj = [
            failure(t0, Kind::DonorStall, 0, 10, 15),
            failure(t0, Kind::CapacityLowered, 1, 30, 35),
        ];
        let stall =
            "10.0.0.2:7000: stall (connections accepted, requests unanswered), back after 4.0 s";
        let ok = judge(1, 1.0, t0, &addrs, &inj, &[run(t0, 5, 20, &[stall], None)]);
        assert!(ok.passed, "{}", serde_json::to_string(&ok).unwrap());
        assert_eq!(ok.failures[0].seen_as, vec!["stall".to_string()]);
        assert_eq!(ok.failures_unnoticed, 0);

        // A stall reported as a crash, a death during a capacity change, a death of a donor
        // while nothing hit it: each misreported.
        let crash = "10.0.0.2:7000: crash (connection refused or reset), back after 4.0 s";
        let d1 = "10.0.0.6:7000: stall (connections accepted, requests unanswered)";
        let bad = judge(
            1,
            1.0,
            t0,
            &addrs,
            &inj,
            &[
                run(t0, 5, 20, &[crash], None),
                run(t0, 28, 40, &[d1], None),
                run(t0, 50, 60, &[stall], None),
            ],
        );
        assert!(!bad.passed);
        assert_eq!(bad.failures_misreported, 3, "{:?}", bad.misreported);

        // A wrong output fails the soak; a run outside every failure notices none.
        let w = judge(
            1,
            1.0,
            t0,
            &addrs,
            &inj,
            &[run(t0, 40, 50, &[], Some("output differs"))],
        );
        assert!(!w.passed && w.wrong_outputs == 1 && w.failures_unnoticed == 1);
    }
}
