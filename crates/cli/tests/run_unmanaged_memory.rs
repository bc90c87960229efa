//! `farmem run` says what it does not manage: a python3 program holding a 64 MiB private
//! anonymous mapping below `--mmap-threshold` (so not a region) gets a warning naming it, and
//! the stats file's `unmanaged` report counts it; one reading a 128 MiB file through a mapping
//! gets none (file-backed pages the kernel can drop), though the summary and the report count
//! the file as unmanaged; a program whose big memory is in the heap (a region) gets none: its
//! unmanaged memory (python's code, stacks, the runtime threads' own allocations) stays under
//! a tenth of `--local-mem`.

use farmem_testkit::run::*;

fn python() -> &'static str {
    // Debian's interpreter: a PATH python3 may be a version-manager shim (a shell script).
    let py = "/usr/bin/python3";
    assert!(
        std::path::Path::new(py).is_file(),
        "{py} is missing: install the Debian package python3"
    );
    py
}

/// Touches every page of a 64 MiB private anonymous mapping and holds it for 2.5 s, so the
/// library's once-a-second measurement sees it.
const BIG_MAPPING: &str = r#"
import mmap, time
n = 64 << 20
m = mmap.mmap(-1, n, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
for i in range(0, n, 4096):
    m[i] = 1
time.sleep(2.5)
m.close()
"#;

/// Writes a 128 MiB file (argv[1]) in 1 MiB pieces, maps it read-only, reads every page and
/// holds the mapping for 2.5 s: 128 MiB resident outside the regions, none of it anonymous
/// (page cache the kernel may drop).
const BIG_FILE: &str = r#"
import mmap, sys, time
n = 128 << 20
with open(sys.argv[1], "wb") as f:
    for _ in range(n >> 20):
        f.write(b"\x01" * (1 << 20))
with open(sys.argv[1], "rb") as f:
    m = mmap.mmap(f.fileno(), n, access=mmap.ACCESS_READ)
s = 0
for i in range(0, n, 4096):
    s += m[i]
assert s == n >> 12
time.sleep(2.5)
m.close()
"#;

/// 128 MiB in the heap (a region), touched, held 1.5 s.
const BIG_HEAP: &str = r#"
import time
x = bytearray(b"x" * (128 << 20))
time.sleep(1.5)
"#;

#[test]
fn a_big_mapping_below_the_threshold_is_named_in_a_warning() {
    let py = python();
    let dir = Scratch::new("unmanaged");
    let stats = dir.path("stats.json");
    let o = farmem_run(
        &[
            "--mmap-threshold",
            "1GiB",
            "--local-mem",
            "32MiB",
            "--stats",
            stats.to_str().unwrap(),
        ],
        &[py, "-c", BIG_MAPPING],
    );
    assert!(o.status.success(), "{}", text(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    let warning = err
        .lines()
        .find(|l| l.starts_with("farmem: warning:") && l.contains("outside farmem's regions"))
        .unwrap_or_else(|| panic!("no warning about unmanaged memory:\n{err}"));
    assert!(
        warning.contains("(largest: [anon] 6"),
        "the 64 MiB mapping is named first: {warning}"
    );
    assert!(
        warning.contains("not bounded by --local-mem 32.0 MiB"),
        "{warning}"
    );
    let summary = err
        .lines()
        .find(|l| l.contains(" faults ("))
        .unwrap_or_else(|| panic!("no summary line:\n{err}"));
    assert!(summary.contains("process peak RSS"), "{summary}");

    let s = read_stats(&stats);
    let u = &s["unmanaged"];
    let peak = u["peak_unmanaged_bytes"].as_u64().unwrap();
    assert!(peak >= 60 << 20, "the mapping is unmanaged: {u}");
    assert!(
        u["peak_rss_bytes"].as_u64().unwrap() >= peak,
        "the process's peak RSS holds it: {u}"
    );
    assert!(
        u["peak_anon_unmanaged_bytes"].as_u64().unwrap() >= 60 << 20,
        "and anonymous: {u}"
    );
    let first = &u["biggest_at_peak"][0];
    assert_eq!(first["name"], "[anon]", "{u}");
    assert!(first["rss_bytes"].as_u64().unwrap() >= 60 << 20, "{u}");
}

#[test]
fn a_big_mapped_file_is_reported_but_not_warned_about() {
    let py = python();
    let dir = Scratch::new("mapped-file");
    let stats = dir.path("stats.json");
    let data = dir.path("data");
    let o = farmem_run(
        &["--local-mem", "256MiB", "--stats", stats.to_str().unwrap()],
        &[py, "-c", BIG_FILE, data.to_str().unwrap()],
    );
    assert!(o.status.success(), "{}", text(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !err.contains("outside farmem's regions ("),
        "file-backed pages are not warned about:\n{err}"
    );
    let summary = err
        .lines()
        .find(|l| l.contains(" faults ("))
        .unwrap_or_else(|| panic!("no summary line:\n{err}"));
    assert!(
        summary.contains(" at most outside farmem's regions, of which ")
            && summary.ends_with(" at most anonymous)"),
        "the summary gives the unmanaged memory and its anonymous part: {summary}"
    );

    let s = read_stats(&stats);
    let u = &s["unmanaged"];
    assert!(
        u["peak_unmanaged_bytes"].as_u64().unwrap() >= 128 << 20,
        "the mapped file is unmanaged memory: {u}"
    );
    assert!(
        u["peak_anon_unmanaged_bytes"].as_u64().unwrap() < (256 << 20) / 10,
        "but not anonymous: {u}"
    );
    let first = &u["biggest_at_peak"][0];
    assert_eq!(first["name"], data.to_str().unwrap(), "{u}");
    assert!(first["rss_bytes"].as_u64().unwrap() >= 128 << 20, "{u}");
}

#[test]
fn a_big_heap_is_managed_and_not_warned_about() {
    let py = python();
    let dir = Scratch::new("managed");
    let stats = dir.path("stats.json");
    let o = farmem_run(
        &["--local-mem", "512MiB", "--stats", stats.to_str().unwrap()],
        &[py, "-c", BIG_HEAP],
    );
    assert!(o.status.success(), "{}", text(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !err.contains("outside farmem's regions ("),
        "no warning expected:\n{err}"
    );
    let s = read_stats(&stats);
    let u = &s["unmanaged"];
    assert!(
        u["peak_unmanaged_bytes"].as_u64().unwrap() < 40 << 20,
        "python's code and stacks and farmem's own threads only (about 22 MiB here): {u}"
    );
    assert!(
        u["biggest_at_peak"]
            .as_array()
            .unwrap()
            .iter()
            .all(|m| m["rss_bytes"].as_u64().unwrap() < 16 << 20),
        "the 128 MiB are in a region: {u}"
    );
}
