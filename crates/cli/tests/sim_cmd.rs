//! `farmem sim` end to end: the real binary, real trace files, JSON output with exactly the
//! issue's keys, and clear errors for bad input.

use std::process::{Command, Output};

fn farmem(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_farmem"))
        .args(args)
        .output()
        .expect("cannot run the farmem binary")
}

fn ok_json(args: &[&str]) -> Vec<serde_json::Value> {
    let out = farmem(args);
    assert!(
        out.status.success(),
        "farmem {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice::<Vec<serde_json::Value>>(&out.stdout)
        .expect("--json prints a JSON list")
}

fn err_text(args: &[&str]) -> String {
    let out = farmem(args);
    assert!(!out.status.success(), "farmem {args:?} should fail");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

const KEYS: [&str; 12] = [
    "prefetcher",
    "evict",
    "cache_pages",
    "accesses",
    "faults",
    "hit_ratio",
    "prefetched",
    "prefetch_hits",
    "accuracy",
    "coverage",
    "pollution",
    "amat_us",
];

#[test]
fn json_rows_have_exactly_the_keys_and_per_thread_leap_wins_on_interleaved_strides() {
    let rows = ok_json(&[
        "sim",
        "--gen",
        "interleave:4:3,5,7,11",
        "--wss",
        "4096",
        "--length",
        "20000",
        "--cache",
        "25%",
        "--prefetch",
        "leap,leap-process",
        "--evict",
        "fifo",
        "--json",
    ]);
    assert_eq!(rows.len(), 2);
    for r in &rows {
        let mut keys: Vec<&str> = r.as_object().unwrap().keys().map(String::as_str).collect();
        keys.sort_unstable();
        let mut want = KEYS.to_vec();
        want.sort_unstable();
        assert_eq!(keys, want);
        assert_eq!(r["cache_pages"], 1024);
        assert_eq!(r["accesses"], 20000);
    }
    let cov = |name: &str| {
        rows.iter().find(|r| r["prefetcher"] == name).unwrap()["coverage"]
            .as_f64()
            .unwrap()
    };
    assert!(cov("leap") >= 2.0 * cov("leap-process"), "{rows:?}");
    assert!(cov("leap") > 0.9, "{rows:?}");
}

#[test]
fn saved_trace_replays_to_the_same_rows_and_the_plot_is_svg() {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("s.fmtrace");
    let plot = dir.path().join("p.svg");
    let (t, p) = (trace.to_str().unwrap(), plot.to_str().unwrap());
    let common = [
        "--cache",
        "10%,50%",
        "--prefetch",
        "leap,none,readahead",
        "--json",
    ];
    let mut gen_args = vec![
        "sim",
        "--gen",
        "stride:10",
        "--wss",
        "2MiB",
        "--length",
        "5000",
    ];
    gen_args.extend(["--save-trace", t, "--plot", p]);
    gen_args.extend(common);
    let generated = ok_json(&gen_args);
    assert_eq!(
        generated.len(),
        3 * 3 * 2,
        "3 prefetchers x 3 policies (fifo, clock, refault) x 2 sizes"
    );
    let mut replay_args = vec!["sim", "--trace", t];
    replay_args.extend(common);
    assert_eq!(ok_json(&replay_args), generated);
    let svg = std::fs::read_to_string(&plot).unwrap();
    assert!(svg.starts_with("<svg") && svg.contains("hit ratio") && svg.contains("leap / fifo"));
    assert_eq!(svg.matches("<polyline").count(), 9);
}

#[test]
fn table_by_default() {
    let out = farmem(&[
        "sim",
        "--gen",
        "seq",
        "--wss",
        "256",
        "--length",
        "3000",
        "--cache",
        "64",
        "--prefetch",
        "leap",
        "--evict",
        "fifo",
    ]);
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 3, "{text}");
    assert!(lines[1].starts_with("prefetcher"));
    assert!(lines[2].starts_with("leap") && lines[2].contains(" 64 "));
}

#[test]
fn bad_input_gets_a_clear_error() {
    assert!(err_text(&["sim", "--gen", "stride:0"]).contains("stride:K needs K ≥ 1"));
    assert!(err_text(&["sim", "--gen", "seq", "--prefetch", "oracle"])
        .contains("unknown prefetcher \"oracle\": choose among leap, leap-process"));
    assert!(err_text(&["sim", "--gen", "seq", "--evict", "lru"])
        .contains("unknown eviction policy \"lru\""));
    assert!(err_text(&["sim", "--gen", "seq", "--cache", "0%"]).contains("bad cache size \"0%\""));
    assert!(
        err_text(&["sim", "--gen", "seq", "--wss", "12parsecs"]).contains("bad size \"12parsecs\"")
    );
    assert!(
        err_text(&["sim", "--gen", "seq", "--length", "0"]).contains("--length must be at least 1")
    );
    assert!(err_text(&["sim", "--gen", "seq", "--miss-us=-1"]).contains("--miss-us"));
    assert!(
        err_text(&["sim"]).contains("--trace"),
        "neither --trace nor --gen"
    );
    assert!(
        err_text(&["sim", "--trace", "x", "--wss", "5"]).contains("--gen"),
        "--wss needs --gen"
    );

    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("t.fmtrace");
    let t = trace.to_str().unwrap();
    let out = farmem(&[
        "sim",
        "--gen",
        "random",
        "--length",
        "100",
        "--save-trace",
        t,
        "--json",
    ]);
    assert!(out.status.success());
    let bytes = std::fs::read(&trace).unwrap();
    std::fs::write(&trace, &bytes[..bytes.len() - 2]).unwrap();
    let e = err_text(&["sim", "--trace", t]);
    assert!(
        e.contains("cannot use") && e.contains("truncated trace"),
        "{e}"
    );
    std::fs::write(&trace, b"not a trace").unwrap();
    assert!(err_text(&["sim", "--trace", t]).contains("not a farmem trace"));
}

#[test]
fn help_explains_the_generators_and_columns() {
    let out = farmem(&["sim", "--help"]);
    assert!(out.status.success());
    let help = String::from_utf8(out.stdout).unwrap();
    for text in [
        "stride:K               0,K,2K",
        "interleave:T:K1,K2,... T threads",
        "zipf:S                 Zipf",
        "phases                 four phases",
        "Model: far memory holds every page of the trace",
        "cov = coverage (pf_hits",
        "--save-trace",
    ] {
        assert!(help.contains(text), "--help lacks {text:?}:\n{help}");
    }
}
