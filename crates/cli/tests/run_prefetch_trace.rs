//! `farmem run --prefetch leap --record-trace FILE` on a sequential scan twice its budget: the
//! summary reports prefetch accuracy and coverage from the runtime's counters, and the recorded
//! trace is a complete file that `farmem sim` replays. The scans page to the embedded TCP donor
//! (`--local-donor tcp`): the prefetcher fetches from donors; a page in the host tier comes
//! back with one local copy and is not prefetched.

use farmem_testkit::bins::*;
use farmem_testkit::run::*;

#[test]
fn prefetch_counters_reach_the_summary_and_the_trace_replays() {
    let dir = Scratch::new("prefetch-trace");
    let prog = dir.path("seq_scan");
    compile_c(&c_source("seq_scan.c"), &prog, &[]);
    let stats = dir.path("stats.json");
    let trace = dir.path("scan.trace");
    let o = farmem_run(
        &[
            "--local-mem",
            "32MiB",
            "--local-donor",
            "tcp",
            "--prefetch",
            "leap",
            "--stats",
            stats.to_str().unwrap(),
            "--record-trace",
            trace.to_str().unwrap(),
        ],
        &[prog.to_str().unwrap(), "96"],
    );
    let out = text(&o);
    assert!(o.status.success(), "{out}");
    assert!(out.contains("checksum "), "{out}");

    let s = read_stats(&stats);
    let summary = &s["summary"];
    assert!(summary["prefetched_pages"].as_u64().unwrap() > 0, "{s}");
    let accuracy = summary["prefetch_accuracy"]
        .as_f64()
        .expect("accuracy is a number");
    let coverage = summary["prefetch_coverage"]
        .as_f64()
        .expect("coverage is a number");
    assert!(accuracy > 0.0 && accuracy <= 1.0, "{s}");
    assert!(coverage > 0.0 && coverage <= 1.0, "{s}");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("prefetch accuracy ") && !err.contains("accuracy n/a"),
        "the summary line should report accuracy: {err}"
    );

    let sim = output_within(
        std::process::Command::new(farmem()).args([
            "sim",
            "--trace",
            trace.to_str().unwrap(),
            "--prefetch",
            "leap",
            "--evict",
            "fifo",
            "--cache",
            "25%",
            "--json",
        ]),
        std::time::Duration::from_secs(120),
    );
    assert!(
        sim.status.success(),
        "farmem sim refused the trace: {}",
        text(&sim)
    );
    let rows: serde_json::Value = serde_json::from_slice(&sim.stdout).expect("sim --json");
    let accesses = rows[0]["accesses"].as_u64().unwrap();
    assert!(
        accesses >= counter(&s, "faults_remote"),
        "the trace should hold every remote fault: {accesses} records, stats {s}"
    );
}

/// `--prefetch-install marker`: the scan's result is unchanged, prefetched pages are installed
/// into the program's memory (their hits inferred from the window markers), and the faults
/// that outran their prefetch waited for it rather than each sending a read.
#[test]
fn marker_install_mode_reaches_the_runtime() {
    let dir = Scratch::new("prefetch-marker");
    let prog = dir.path("seq_scan");
    compile_c(&c_source("seq_scan.c"), &prog, &[]);
    let stats = dir.path("stats.json");
    let run = |mode: &str| {
        let o = farmem_run(
            &[
                "--local-donor",
                "tcp",
                "--local-mem",
                "32MiB",
                "--prefetch-install",
                mode,
                "--stats",
                stats.to_str().unwrap(),
            ],
            &[prog.to_str().unwrap(), "96"],
        );
        let out = text(&o);
        assert!(o.status.success(), "{out}");
        let sum = out
            .lines()
            .find_map(|l| l.strip_prefix("checksum "))
            .unwrap_or_else(|| panic!("no checksum: {out}"))
            .trim()
            .to_string();
        (sum, read_stats(&stats))
    };
    let runtime = |s: &serde_json::Value, key: &str| {
        s["runtime"][key]
            .as_u64()
            .unwrap_or_else(|| panic!("stats have no runtime figure {key}: {s}"))
    };
    let (buffer_sum, buffer) = run("buffer");
    let (marker_sum, marker) = run("marker");
    assert_eq!(marker_sum, buffer_sum, "the scan must read the same data");
    assert_eq!(runtime(&buffer, "prefetch_hits_inferred"), 0, "{buffer}");
    assert!(
        runtime(&marker, "prefetch_hits_inferred") > 0,
        "marker mode installs pages whose hits are inferred: {marker}"
    );
    assert_eq!(runtime(&marker, "fetch_errors"), 0, "{marker}");
}
