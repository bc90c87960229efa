//! `farmem run --prefetch leap --record-trace FILE` on a sequential scan twice its budget: the
//! summary reports prefetch accuracy and coverage from the runtime's counters, and the recorded
//! trace is a complete file that `farmem sim` replays.

mod run_support;
use run_support::*;

#[test]
fn prefetch_counters_reach_the_summary_and_the_trace_replays() {
    let dir = Scratch::new("prefetch-trace");
    let prog = dir.path("seq_scan");
    compile_c("seq_scan.c", &prog, &[]);
    let stats = dir.path("stats.json");
    let trace = dir.path("scan.trace");
    let o = farmem_run(
        &[
            "--local-mem",
            "32MiB",
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
