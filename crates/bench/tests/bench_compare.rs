//! End-to-end tests of `farmem-bench compare`: the real binary, real workloads (micro.c built
//! with cc, redis-server, memcached, python3 with numpy/sklearn), real swap files, zram devices
//! and memory cgroups (as root), and a real SIGTERM in the middle of a swap run. Sizes are tiny:
//! these check behaviour and output shape, never speed.

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The harness takes a machine-wide lock and switches swap areas: one test at a time.
static MACHINE: Mutex<()> = Mutex::new(());

fn bench() -> Command {
    Command::new(env!("CARGO_BIN_EXE_farmem-bench"))
}

fn run(args: &[&str]) -> Output {
    bench()
        .arg("compare")
        .args(args)
        .output()
        .expect("cannot start farmem-bench")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn json_rows(o: &Output) -> Vec<serde_json::Map<String, serde_json::Value>> {
    assert!(
        o.status.success(),
        "farmem-bench compare failed: {}",
        stderr(o)
    );
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap_or_else(|e| {
        panic!(
            "stdout is not JSON ({e}): {}",
            String::from_utf8_lossy(&o.stdout)
        )
    });
    v.as_array()
        .expect("a JSON list")
        .iter()
        .map(|r| r.as_object().expect("rows are objects").clone())
        .collect()
}

const KEYS: [&str; 16] = [
    "avg_access_us",
    "client_us_per_page",
    "cpu_s",
    "donor_us_per_page",
    "in_pages",
    "local_fraction",
    "moved_vs_swap",
    "out_pages",
    "p50_us",
    "p99_us",
    "system",
    "throughput_ops",
    "us_per_page",
    "wall_s",
    "wire_bytes_per_page",
    "workload",
];

fn check_keys(row: &serde_json::Map<String, serde_json::Value>) {
    let mut keys: Vec<&str> = row.keys().map(String::as_str).collect();
    keys.sort_unstable();
    assert_eq!(keys, KEYS, "row {row:?}");
}

fn row<'a>(
    rows: &'a [serde_json::Map<String, serde_json::Value>],
    system: &str,
    workload: &str,
) -> &'a serde_json::Map<String, serde_json::Value> {
    rows.iter()
        .find(|r| r["system"] == system && r["workload"] == workload)
        .unwrap_or_else(|| panic!("no {system}/{workload} row in {rows:?}"))
}

fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .unwrap()
        .lines()
        .find(|l| l.starts_with("Uid:"))
        .and_then(|l| l.split_whitespace().nth(2).map(|u| u == "0"))
        .unwrap_or(false)
}

fn require_root(what: &str) {
    assert!(
        is_root(),
        "{what} needs root (it creates swap areas and memory cgroups): run the tests as root"
    );
}

fn swaps() -> String {
    std::fs::read_to_string("/proc/swaps").unwrap()
}

fn leftover_cgroups(pid: u32) -> Vec<String> {
    let prefix = format!("farmem-bench-{pid}-");
    ["/sys/fs/cgroup/memory", "/sys/fs/cgroup"]
        .iter()
        .filter_map(|d| std::fs::read_dir(d).ok())
        .flatten()
        .filter_map(Result::ok)
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(&prefix))
        .collect()
}

fn dir_is_empty(dir: &Path) -> bool {
    std::fs::read_dir(dir).unwrap().next().is_none()
}

#[test]
fn bad_flags_are_rejected_with_clear_errors() {
    let cases: &[(&[&str], &str)] = &[
        (&["--local", "0.5"], "--workload"),
        (&["-w", "seq", "--local", "1.5"], "out of range"),
        (&["-w", "seq", "--local", "half"], "not a number"),
        (&["-w", "postgres"], "unknown workload `postgres`"),
        (&["-w", "stride:1"], "at least 2"),
        (
            &["-w", "seq", "--systems", "zswap"],
            "unknown system `zswap`",
        ),
        (
            &["-w", "seq", "--wss", "1 furlong"],
            "unknown unit `furlong`",
        ),
        (&["-w", "redis", "--clients", "0"], "--clients"),
    ];
    for (args, needle) in cases {
        let o = run(args);
        assert_eq!(
            o.status.code(),
            Some(2),
            "{args:?} should be a usage error: {}",
            stderr(&o)
        );
        assert!(
            stderr(&o).contains(needle),
            "{args:?}: expected {needle:?} in {}",
            stderr(&o)
        );
    }
    let o = run(&["-w", "redis", "--zipf", "1.0", "--systems", "local"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("--zipf 1 is out of range"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn micro_workloads_report_access_latencies_as_json() {
    let _m = MACHINE.lock().unwrap_or_else(|p| p.into_inner());
    let o = run(&[
        "-w",
        "seq,stride:4,random",
        "--wss",
        "16MiB",
        "--passes",
        "1",
        "--systems",
        "local",
        "--json",
    ]);
    let rows = json_rows(&o);
    assert_eq!(rows.len(), 3, "{rows:?}");
    for w in ["seq", "stride:4", "random"] {
        let r = row(&rows, "local", w);
        check_keys(r);
        assert_eq!(r["local_fraction"], 1.0);
        assert!(r["throughput_ops"].is_null());
        let avg = r["avg_access_us"].as_f64().expect("avg_access_us");
        let (p50, p99) = (r["p50_us"].as_f64().unwrap(), r["p99_us"].as_f64().unwrap());
        assert!(avg > 0.0 && p50 > 0.0 && p99 >= p50, "{r:?}");
        assert!(r["wall_s"].as_f64().unwrap() > 0.0);
    }
    // The table goes to stderr with --json, with the peak measured by the local run (as root).
    let err = stderr(&o);
    assert!(err.contains("== seq"), "{err}");
    if is_root() {
        assert!(
            err.contains("peak memory 1"),
            "peak of a 16 MiB working set: {err}"
        );
    }
}

#[test]
fn servers_and_python_workloads_report_their_figures() {
    let _m = MACHINE.lock().unwrap_or_else(|p| p.into_inner());
    let o = run(&[
        "-w",
        "redis,memcached,numpy,kmeans,mp",
        "--keys",
        "2000",
        "--ops",
        "3000",
        "--matrix-n",
        "300",
        "--kmeans-samples",
        "5000",
        "--kmeans-features",
        "8",
        "--mp-worker-bytes",
        "4MiB",
        "--systems",
        "local",
        "--json",
    ]);
    let rows = json_rows(&o);
    for w in ["redis", "memcached"] {
        let r = row(&rows, "local", w);
        check_keys(r);
        assert!(r["throughput_ops"].as_f64().unwrap() > 0.0, "{r:?}");
        assert!(
            r["p99_us"].as_f64().unwrap() >= r["p50_us"].as_f64().unwrap(),
            "{r:?}"
        );
        assert!(r["avg_access_us"].is_null());
    }
    for w in ["numpy", "kmeans", "mp"] {
        let r = row(&rows, "local", w);
        check_keys(r);
        assert!(r["wall_s"].as_f64().unwrap() > 0.0, "{r:?}");
        assert!(r["throughput_ops"].is_null() && r["p50_us"].is_null());
    }
}

#[test]
fn swap_and_zram_runs_leave_the_machine_as_they_found_it() {
    require_root("the swap and zram systems");
    let _m = MACHINE.lock().unwrap_or_else(|p| p.into_inner());
    let swap_dir = tempfile::tempdir().unwrap();
    let before = swaps();
    let plot = swap_dir.path().join("plot.svg");
    let child = bench()
        .args([
            "compare", "-w", "seq", "--wss", "32MiB", "--passes", "1", "--local", "0.5",
        ])
        .args(["--systems", "swap,zram", "--json", "--plot"])
        .arg(&plot)
        .arg("--swap-dir")
        .arg(swap_dir.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let o = child.wait_with_output().unwrap();
    let rows = json_rows(&o);
    for system in ["swap", "zram"] {
        let r = row(&rows, system, "seq");
        check_keys(r);
        assert_eq!(r["local_fraction"], 0.5);
        assert!(
            r["avg_access_us"].as_f64().is_some(),
            "{system} did not run: {}",
            stderr(&o)
        );
        // Half of 32 MiB did not fit: pages went out and came back, and that cost CPU time.
        let pages = |k: &str| r[k].as_u64().unwrap_or_else(|| panic!("{k} in {r:?}"));
        assert!(
            pages("out_pages") > 1000 && pages("in_pages") > 1000,
            "{r:?}"
        );
        assert!(r["cpu_s"].as_f64().unwrap() > 0.0, "{r:?}");
        assert!(r["us_per_page"].as_f64().unwrap() > 0.0, "{r:?}");
    }
    assert_eq!(row(&rows, "swap", "seq")["moved_vs_swap"], 1.0);
    assert!(stderr(&o).contains("swap on /dev/zram"), "{}", stderr(&o));
    let svg = std::fs::read_to_string(&plot).unwrap();
    assert!(svg.starts_with("<svg") && svg.contains("zram"));
    std::fs::remove_file(&plot).unwrap();
    assert_eq!(swaps(), before, "the swap areas changed");
    assert!(
        dir_is_empty(swap_dir.path()),
        "the swap file was left behind"
    );
    assert_eq!(leftover_cgroups(pid), Vec::<String>::new());
}

#[test]
fn sigterm_in_the_middle_of_a_swap_run_restores_the_machine() {
    require_root("the swap system");
    let _m = MACHINE.lock().unwrap_or_else(|p| p.into_inner());
    let swap_dir = tempfile::tempdir().unwrap();
    let before = swaps();
    let mut child = bench()
        .args([
            "compare", "-w", "random", "--wss", "256MiB", "--passes", "50", "--local", "0.25",
        ])
        .args(["--systems", "swap", "--swap-dir"])
        .arg(swap_dir.path())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let dir = swap_dir.path().to_string_lossy().into_owned();
    let deadline = Instant::now() + Duration::from_secs(120);
    while !swaps().contains(&dir) {
        assert!(
            child.try_wait().unwrap().is_none(),
            "the benchmark ended before its swap file was on"
        );
        assert!(
            Instant::now() < deadline,
            "the swap file never appeared in /proc/swaps"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // Let the workload start paging, then interrupt.
    std::thread::sleep(Duration::from_millis(1500));
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::SIGTERM,
    )
    .unwrap();
    let o = child.wait_with_output().unwrap();
    assert_eq!(o.status.code(), Some(128 + 15), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("interrupted (signal 15)"),
        "{}",
        stderr(&o)
    );
    assert_eq!(swaps(), before, "the swap areas were not restored");
    assert!(
        dir_is_empty(swap_dir.path()),
        "the swap file was left behind"
    );
    assert_eq!(leftover_cgroups(pid), Vec::<String>::new());
}

#[test]
fn farmem_system_runs_the_workload_under_farmem_run() {
    let _m = MACHINE.lock().unwrap_or_else(|p| p.into_inner());
    // farmem-bench runs the farmem binary beside it, which preloads the library beside it.
    let bin = Path::new(env!("CARGO_BIN_EXE_farmem-bench"));
    for needed in [
        bin.with_file_name("farmem"),
        bin.with_file_name("libfarmem_preload.so"),
    ] {
        assert!(
            needed.exists(),
            "{} is missing: build the workspace first (cargo build --release --workspace)",
            needed.display()
        );
    }
    let child = bench()
        .args([
            "compare",
            "-w",
            "random",
            "--wss",
            "32MiB",
            "--passes",
            "1",
            "--local",
            "0.5",
            "--systems",
            "farmem,farmem-tcp,farmem-remote",
            "--json",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("cannot start farmem-bench");
    let pid = child.id();
    let o = child.wait_with_output().unwrap();
    let rows = json_rows(&o);
    // farmem: the host tier (a private node); farmem-tcp: the embedded TCP donor;
    // farmem-remote: a donor in a network namespace of its own.
    for system in ["farmem", "farmem-tcp", "farmem-remote"] {
        let r = row(&rows, system, "random");
        check_keys(r);
        assert_eq!(r["local_fraction"], 0.5);
        let avg = r["avg_access_us"]
            .as_f64()
            .unwrap_or_else(|| panic!("{system} did not run: {}", stderr(&o)));
        assert!(avg > 0.0);
        // The table (stderr) shows the limit and what farmem moved out, to its donor or into
        // the host tier (half the working set did not fit): not nothing.
        let line = stderr(&o)
            .lines()
            .find(|l| l.starts_with(&format!("{system} ")))
            .map(str::to_string)
            .unwrap_or_else(|| panic!("no {system} row in {}", stderr(&o)));
        assert!(
            line.matches("MiB").count() >= 2 && !line.contains(" 0.0 MiB"),
            "no moved bytes (only the limit) in {line}"
        );
        let pages = |k: &str| r[k].as_u64().unwrap_or_else(|| panic!("{k} in {r:?}"));
        assert!(
            pages("out_pages") > 1000 && pages("in_pages") > 1000,
            "{r:?}"
        );
        assert!(r["cpu_s"].as_f64().unwrap() > 0.0, "{r:?}");
        assert!(r["moved_vs_swap"].is_null(), "no swap run: {r:?}");
        let faults = if system == "farmem" {
            "tier faults"
        } else {
            "remote faults"
        };
        assert!(line.contains(faults), "{line}");
        assert_eq!(r["client_us_per_page"], r["us_per_page"], "{r:?}");
        if system == "farmem-remote" {
            // The donor on the other "machine" worked, and every page moved crossed its link
            // (a page's 4 KiB plus headers and requests).
            let donor = r["donor_us_per_page"].as_f64().unwrap_or(0.0);
            assert!(donor > 0.0, "{r:?}");
            let wire = r["wire_bytes_per_page"].as_f64().unwrap_or(0.0);
            assert!(wire >= 4096.0, "{r:?}");
        } else {
            assert!(r["donor_us_per_page"].is_null(), "{r:?}");
            assert!(r["wire_bytes_per_page"].is_null(), "{r:?}");
        }
    }
    // The donor's namespace and link are gone with the run.
    let namespaces = Command::new("ip").args(["netns", "list"]).output().unwrap();
    let namespaces = String::from_utf8_lossy(&namespaces.stdout);
    assert!(
        !namespaces.contains(&format!("fmt-{pid}-")),
        "left behind: {namespaces}"
    );
}
