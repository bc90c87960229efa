//! The short soak of CI: `farmem-bench soak --minutes 2` with a seed of its own (printed, so a
//! failure can be replayed with `--seed`): every program's output right, nothing lost, every
//! donor death a runtime reported explained by a failure injected. Also the soak's refusals of
//! bad arguments. Needs root (network namespaces) and the soak's programs (scripts/setup.sh).
//!
//! CI injects the failures a donor comes back from with its store (stall, link down, capacity
//! lowered) and node kills. Killing donors is left to `farmem-bench soak` run by hand: the
//! 60-minute soak of decision 0068 still loses pages then (a forked child reading pages lent
//! on donors that die; a second donor lost before re-replication finished), open in issue 43.

use std::process::Command;

fn soak() -> Command {
    Command::new(env!("CARGO_BIN_EXE_farmem-bench"))
}

#[test]
fn a_short_soak_with_failures_injected_passes() {
    let o = soak()
        .args(["soak", "--minutes", "2", "--json"])
        .args([
            "--failures",
            "donor-stall,link-down,capacity-lowered,node-kill",
        ])
        .output()
        .expect("running farmem-bench soak");
    let err = String::from_utf8_lossy(&o.stderr);
    let seed_line = err
        .lines()
        .find(|l| l.contains("replay:"))
        .unwrap_or("(no seed printed)");
    let v: serde_json::Value = serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("no JSON verdict ({e}); {seed_line}\n{err}"));
    for key in [
        "seed",
        "failures_injected",
        "wrong_outputs",
        "state_lost_pages",
        "pages_lost",
        "seal_rejected",
        "failures_misreported",
    ] {
        assert!(v.get(key).is_some(), "the verdict lacks {key}: {v}");
    }
    assert!(
        o.status.success() && v["passed"] == true,
        "the soak failed; {seed_line}\nverdict: {v:#}\n{err}"
    );
    assert!(v["failures_injected"].as_u64().unwrap() >= 5, "{v:#}");
    let programs = v["runs_by_program"].as_object().unwrap();
    assert_eq!(programs.len(), 6, "every program ran: {v:#}");
}

#[test]
fn bad_arguments_are_refused_with_a_reason() {
    for (args, says) in [
        (&["soak", "--minutes", "0"][..], "--minutes 0"),
        (&["soak", "--minutes", "-3"][..], "'-3'"),
        (&["soak", "--local-mem", "lots"][..], "lots"),
        (&["soak", "--programs", "doom"][..], "doom"),
        (&["soak", "--failures", "meteor"][..], "meteor"),
        (&["soak", "--seed", "x"][..], "x"),
        (&["soak", "--failures", ""][..], "--failures"),
        (
            &["soak", "--no-failures", "--failures", "node-kill"][..],
            "cannot be used with",
        ),
    ] {
        let o = soak().args(args).output().unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "{args:?} was accepted");
        assert!(err.contains(says), "{args:?}: {err}");
    }
}
