//! The failures the soak injects, and their schedule: drawn from the seed alone (never from
//! timing), so `--seed S` replays the same failures at the same moments of the run.

use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;

/// A failure the soak can inject.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum Kind {
    /// A donor killed with SIGKILL (its store lost), started again empty after the hold.
    DonorKill,
    /// A donor stopped with SIGSTOP (connections open, nothing answered), resumed after.
    DonorStall,
    /// A donor's link cut (packets dropped without an answer), restored after.
    LinkDown,
    /// A donor killed with SIGKILL and started again empty at once, on the same address.
    DonorRestart,
    /// A donor's capacity lowered to a quarter while it runs (SIGHUP re-reads its capacity
    /// file: it asks clients to move slabs away), restored after.
    CapacityLowered,
    /// The host tier's node killed with SIGKILL, started again after the hold (programs keep
    /// the slabs they map; new programs start on the new node).
    NodeKill,
}

impl Kind {
    pub(crate) const ALL: [Kind; 6] = [
        Kind::DonorKill,
        Kind::DonorStall,
        Kind::LinkDown,
        Kind::DonorRestart,
        Kind::CapacityLowered,
        Kind::NodeKill,
    ];

    /// The causes a runtime may rightly report for a donor this failure hit (the words its
    /// stats use: `dead_donors`, `donors_back`). Empty: the donor must not be declared dead.
    pub(crate) fn causes(self) -> &'static [&'static str] {
        match self {
            // Refused while down; a runtime that first meets the fresh donor sees a restart.
            // A process being killed still holds its listening socket until it has exited:
            // a probe in that instant is accepted and unanswered, a stall (the runtime says
            // crash at its next probe, if the run lives that long).
            Kind::DonorKill | Kind::DonorRestart => &["crash", "restart", "stall"],
            Kind::DonorStall => &["stall"],
            // Open connections go unanswered (a stall to them); new ones cannot be made.
            Kind::LinkDown => &["partition", "stall"],
            Kind::CapacityLowered | Kind::NodeKill => &[],
        }
    }

    /// Whether the failure hits one donor (else the node).
    pub(crate) fn hits_donor(self) -> bool {
        self != Kind::NodeKill
    }
}

/// One failure of the schedule.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct Step {
    /// Quiet time before it, after the previous failure ended.
    pub gap: Duration,
    pub kind: Kind,
    /// The donor it hits (by index; unused for the node).
    pub donor: usize,
    /// How long the failure lasts before it is undone.
    pub hold: Duration,
}

/// Quiet time between failures (and before one that hits a donor, the soak also waits until
/// the runs have repaired the last one: `repaired`).
const GAP_S: (f64, f64) = (4.0, 10.0);
/// How long a failure lasts: from shorter than failure detection to several times it.
const HOLD_S: (f64, f64) = (1.0, 8.0);

/// The failures of a run of `length` with `donors` donors, one at a time, drawn from `kinds`
/// with `seed`.
pub(crate) fn schedule(seed: u64, kinds: &[Kind], donors: usize, length: Duration) -> Vec<Step> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut steps = Vec::new();
    let mut t = Duration::ZERO;
    if kinds.is_empty() || donors == 0 {
        return steps;
    }
    loop {
        let gap = Duration::from_secs_f64(rng.gen_range(GAP_S.0..GAP_S.1));
        let hold = Duration::from_secs_f64(rng.gen_range(HOLD_S.0..HOLD_S.1));
        let kind = kinds[rng.gen_range(0..kinds.len())];
        let donor = rng.gen_range(0..donors);
        t += gap + hold;
        if t > length {
            return steps;
        }
        steps.push(Step {
            gap,
            kind,
            donor,
            hold,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seed_gives_one_schedule_and_fits_the_run() {
        let len = Duration::from_secs(600);
        let a = schedule(42, &Kind::ALL, 3, len);
        let b = schedule(42, &Kind::ALL, 3, len);
        assert_eq!(format!("{a:?}"), format!("{b:?}"));
        assert_ne!(
            format!("{a:?}"),
            format!("{:?}", schedule(43, &Kind::ALL, 3, len))
        );
        let total: Duration = a.iter().map(|s| s.gap + s.hold).sum();
        assert!(total <= len && a.len() > 20, "{} steps, {total:?}", a.len());
        assert!(a.iter().all(|s| s.donor < 3));
        for k in Kind::ALL {
            assert!(a.iter().any(|s| s.kind == k), "{k:?} never drawn in {a:?}");
        }
        assert!(schedule(1, &[], 3, len).is_empty());
        let only = schedule(1, &[Kind::DonorStall], 3, len);
        assert!(only.iter().all(|s| s.kind == Kind::DonorStall));
    }
}
