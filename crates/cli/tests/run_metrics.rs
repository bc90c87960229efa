//! `farmem run --metrics ADDR`: a running program tree's paging counters in Prometheus form,
//! scraped while a parent and its forked child page through a real node and a real donor; every
//! endpoint (run, donor, node) passes `promtool check metrics`; an address in use fails the run
//! before the program starts.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use farmem_node::child::child_node_command;
use farmem_testkit::bins::farmem;
use farmem_testkit::clients::{free_port, http_get};
use farmem_testkit::donor::Donor;
use farmem_testkit::run::*;

/// `promtool check metrics` on `text` (Debian's prometheus package): a failure names what it
/// found. Lint problems (a counter without `_total`, a unit not in base units) fail too.
fn promtool_check(what: &str, text: &str) {
    let promtool = require_program("promtool", "prometheus");
    let mut child = Command::new(promtool)
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting promtool");
    use std::io::Write;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success() && out.stdout.is_empty() && out.stderr.is_empty(),
        "promtool check metrics refused the {what} metrics ({}):\n{}{}\n--- text:\n{text}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The value of the sample `series` (its whole name with labels) in `text`.
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .map(|v| v.parse().unwrap_or_else(|e| panic!("{series} {v}: {e}")))
}

fn scrape(addr: &str) -> String {
    let (head, body) = http_get(addr, "/metrics");
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    body
}

fn phases(dir: &Scratch) -> PathBuf {
    let prog = dir.path("phases");
    compile_c(&c_source("phases.c"), &prog, &[]);
    prog
}

#[test]
fn a_running_tree_is_scraped_live_and_every_endpoint_passes_promtool() {
    let dir = Scratch::new("run-metrics");
    let prog = phases(&dir);
    let donor_metrics = format!("127.0.0.1:{}", free_port());
    let donor = Donor::spawn(&[
        "--capacity",
        "512MiB",
        "--slab-size",
        "1MiB",
        "--metrics",
        &donor_metrics,
    ]);
    // A small node: the program's pages fill it and go on to the donor, so both tiers move.
    let socket = dir.path("node.sock");
    let node_metrics = format!("127.0.0.1:{}", free_port());
    let _node = child_node_command(farmem(), &socket)
        .args(["--capacity", "16MiB", "--slab-size", "4MiB"])
        .args(["--metrics", &node_metrics])
        .spawn()
        .unwrap_or_else(|e| panic!("the node did not start: {e}"));
    let run_metrics = format!("127.0.0.1:{}", free_port());
    let donor_addr = donor.addr.to_string();
    let d = dir.path("");
    let d = d.to_str().unwrap();
    let mut run = farmem_spawn(
        &[
            "--local-mem",
            "24MiB",
            "--donor",
            &donor_addr,
            "--node",
            socket.to_str().unwrap(),
            "--metrics",
            &run_metrics,
        ],
        &[
            prog.to_str().unwrap(),
            "96",
            d,
            "fill:1",
            "check:1",
            "fork:1:child",
            "check:1",
            "wait:parent",
        ],
        &dir.path("run.log"),
    );
    run.wait_for_file(&dir.path("at-child"));
    run.wait_for_file(&dir.path("at-parent"));
    // Each process rewrites its stats file about once a second, the child's first at its
    // start: wait until the parent's (which holds the faults) has been written too.
    let start = Instant::now();
    let text = loop {
        let t = scrape(&run_metrics);
        let positive = |s: &str| sample(&t, s).unwrap_or(0.0) > 0.0;
        if sample(&t, "farmem_run_processes") == Some(2.0)
            && positive("farmem_run_resident_bytes")
            && positive("farmem_run_faults_total{source=\"remote\"}")
            && positive("farmem_run_faults_total{source=\"host_tier\"}")
        {
            break t;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "the scrape never showed both processes and their faults:\n{t}\nlog:\n{}",
            run.log_text()
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    let at = |s: &str| sample(&text, s).unwrap_or_else(|| panic!("no {s} in\n{text}"));
    assert_eq!(at("farmem_run_processes_started_total"), 2.0);
    assert_eq!(at("farmem_run_local_memory_bytes"), (24u64 << 20) as f64);
    // 96 MiB written and read back through 24 MiB: both tiers served faults and took pages.
    assert!(
        at("farmem_run_faults_total{source=\"host_tier\"}") > 0.0,
        "{text}"
    );
    assert!(
        at("farmem_run_faults_total{source=\"remote\"}") > 0.0,
        "{text}"
    );
    assert!(
        at("farmem_run_page_bytes_total{tier=\"remote\",direction=\"out\"}") > (32 << 20) as f64,
        "{text}"
    );
    assert!(
        at("farmem_run_page_bytes_total{tier=\"host\",direction=\"out\"}") > 0.0,
        "{text}"
    );
    // Shared pages since the fork count in both processes, so the tree's figures may pass
    // --local-mem (the help texts say so); they are live figures, not zeros.
    let used = at("farmem_run_local_used_bytes");
    assert!(
        used > 0.0 && used <= at("farmem_run_local_used_peak_bytes"),
        "{text}"
    );
    let donor_series = format!("{{donor=\"{donor_addr}\",state=\"live\"}}");
    assert_eq!(at(&format!("farmem_run_donor_health{donor_series}")), 1.0);
    assert!(at(&format!("farmem_run_donor_slabs{{donor=\"{donor_addr}\"}}")) > 0.0);
    assert_eq!(at("farmem_run_pages_lost_total"), 0.0);
    assert_eq!(
        at("farmem_build_info{component=\"run\",version=\"0.1.0\"}"),
        1.0
    );
    promtool_check("run", &text);
    let donor_text = scrape(&donor_metrics);
    assert!(donor_text.contains("farmem_build_info{component=\"donor\""));
    promtool_check("donor", &donor_text);
    let node_text = scrape(&node_metrics);
    assert!(node_text.contains("farmem_build_info{component=\"node\""));
    promtool_check("node", &node_text);

    std::fs::write(dir.path("child"), "").unwrap();
    std::fs::write(dir.path("parent"), "").unwrap();
    let st = run.wait(Duration::from_secs(120));
    let log = run.log_text();
    assert!(st.success() && log.contains("ok "), "{st}; log:\n{log}");
    assert!(
        log.contains(&format!("metrics at http://{run_metrics}/metrics")),
        "the address is logged: {log}"
    );
    // The endpoint ends with the run.
    assert!(std::net::TcpStream::connect(&run_metrics).is_err());
}

#[test]
fn a_metrics_address_in_use_fails_the_run_before_the_program_starts() {
    let dir = Scratch::new("run-metrics-busy");
    let busy = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = busy.local_addr().unwrap().to_string();
    let marker = dir.path("started");
    let out = farmem_run(
        &["--local-mem", "32MiB", "--metrics", &addr],
        &["touch", marker.to_str().unwrap()],
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains(&format!("--metrics {addr}: cannot listen there")),
        "{err}"
    );
    assert!(!marker.exists(), "the program ran: {err}");
    for bad in ["nonsense", "127.0.0.1:99999"] {
        let out = farmem_run(&["--local-mem", "32MiB", "--metrics", bad], &["true"]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{bad}: {err}");
        assert!(err.contains(&format!("--metrics {bad}")), "{err}");
    }
}
