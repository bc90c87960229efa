//! Smoke test of `farmem-bench replicas`: the real binary with tiny sizes, three real child
//! donors, one of them really killed or stopped. Checks that every figure is in the JSON and
//! that every page came back; never speed.

use std::path::Path;
use std::process::Command;

fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .unwrap()
        .lines()
        .find(|l| l.starts_with("Uid:"))
        .and_then(|l| l.split_whitespace().nth(2).map(|u| u == "0"))
        .unwrap_or(false)
}

fn keys(v: &serde_json::Value) -> Vec<&str> {
    let mut k: Vec<&str> = v
        .as_object()
        .unwrap_or_else(|| panic!("not an object: {v}"))
        .keys()
        .map(String::as_str)
        .collect();
    k.sort_unstable();
    k
}

#[test]
fn tiny_run_reports_every_figure_as_json() {
    let bin = Path::new(env!("CARGO_BIN_EXE_farmem-bench"));
    assert!(
        bin.with_file_name("farmem").is_file(),
        "the farmem binary is missing beside {}: build the workspace first",
        bin.display()
    );
    // The cost part runs compare, whose farmem runs need the peak a memory cgroup measures
    // (root only); the other parts need nothing from the machine.
    let parts = if is_root() {
        "cost,failover,heal"
    } else {
        "failover,heal"
    };
    let out = Command::new(bin)
        .args(["replicas", "--parts", parts, "--json", "--rounds", "1"])
        .args(["--workloads", "seq", "--wss", "16MiB", "--passes", "1"])
        .args(["--failover-region", "16MiB", "--failover-budget", "2MiB"])
        .args(["--heal-size", "16MiB", "--heal-budget", "2MiB"])
        .args(["--slab-size", "1MiB", "--request-timeout", "1s"])
        .args(["--heal-timeout", "60s"])
        .output()
        .expect("cannot run farmem-bench");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "farmem-bench replicas failed:\n{err}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("stdout is not JSON ({e}):\n{err}"));
    assert_eq!(
        keys(&v),
        [
            "cost",
            "donor_capacity_bytes",
            "failover",
            "heal",
            "slab_bytes"
        ]
    );

    if is_root() {
        let cost = &v["cost"];
        assert_eq!(
            keys(cost),
            [
                "donors",
                "host_node",
                "local_fraction",
                "rounds",
                "workloads"
            ]
        );
        let seq = &cost["workloads"][0];
        assert_eq!(seq["workload"], "seq");
        assert_eq!(seq["metric"], "wall_s");
        for k in ["replicas1_median", "replicas2_median", "slowdown"] {
            assert!(seq[k].as_f64().is_some_and(|x| x > 0.0), "{k}: {seq}");
        }
        assert!(seq["within_target"].is_boolean(), "{seq}");
        assert_eq!(seq["replicas1"]["wall_s"].as_array().unwrap().len(), 1);
    } else {
        assert!(v["cost"].is_null());
    }

    let failover = v["failover"].as_array().unwrap();
    let kinds: Vec<&str> = failover
        .iter()
        .map(|f| f["failure"].as_str().unwrap())
        .collect();
    assert_eq!(kinds, ["crash", "stall"]);
    for f in failover {
        assert_eq!(f["wrong_pages"], 0, "{f}");
        assert_eq!(f["pages"], 4096, "{f}");
        for k in ["count", "p50_us", "p99_us", "p999_us", "max_us"] {
            assert!(f["failover"][k].is_number(), "failover.{k}: {f}");
        }
        // Every page was on the donors once read back: remote faults, one per page at most.
        assert!(f["remote"]["count"].as_u64().unwrap() > 0, "{f}");
        assert!(f["remote"]["p50_us"].as_f64().unwrap() > 0.0, "{f}");
        assert!(f["load_p50_us"].as_f64().unwrap() > 0.0, "{f}");
        assert!(f["victim_first_copies"].as_u64().unwrap() > 0, "{f}");
        assert_eq!(f["dirty_at_failure"], false, "{f}");
    }
    assert!(
        failover[0]["victim_exit_ms"].as_f64().is_some(),
        "{}",
        failover[0]
    );
    assert!(failover[1]["victim_exit_ms"].is_null(), "{}", failover[1]);
    // No count is required of a crash: the first read to the dead donor fails over, unless the
    // runtime's own polls noticed the death first (then no read ever goes there).

    let heal = v["heal"].as_array().unwrap();
    assert_eq!(heal.len(), 2);
    assert_eq!(heal[0]["heal_rate_bytes"], 256u64 << 20);
    assert!(
        heal[1]["heal_rate_bytes"].is_null(),
        "unlimited: {}",
        heal[1]
    );
    for h in heal {
        assert!(h["last_heal_s"].as_f64().is_some(), "not healed: {h}");
        assert!(h["heal_bytes"].as_u64().unwrap() > 0, "{h}");
        assert!(h["s_per_gib"].as_f64().unwrap() > 0.0, "{h}");
        assert_eq!(h["slabs_degraded"], 0, "{h}");
        assert_eq!(h["dead_donors"].as_array().unwrap().len(), 1, "{h}");
    }
    // The table went to stderr.
    assert!(err.contains("== failover"), "{err}");
}

#[test]
fn bad_flags_are_rejected_before_anything_starts() {
    let out = Command::new(env!("CARGO_BIN_EXE_farmem-bench"))
        .args([
            "replicas",
            "--parts",
            "failover",
            "--failover-region",
            "4MiB",
        ])
        .args(["--failover-budget", "4MiB"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("at least twice its budget"), "{err}");
}
