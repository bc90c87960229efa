//! `farmem run` on the C check program (tests/c/run_checks.c): read(2) into evicted memory,
//! 8 threads writing and verifying, fork with evicted pages (the child checks every byte while
//! the parent keeps writing), mremap growing a large block, MADV_DONTNEED then zeros, and a
//! large calloc reading zeros, MAP_POPULATE, and MAP_SHARED|MAP_ANONYMOUS shared with a child
//! (not paged: both see each other's writes), MADV_WIPEONFORK (the child sees zeros, also after
//! mremap moved the range), mlock/mlockall (accepted, not applied: data right), MADV_DONTFORK
//! and threads faulting while another releases their pages — all with a working set three
//! times the budget,
//! so pages really go to the donor and come back (checked in the stats).

use farmem_testkit::run::*;

#[test]
fn c_checks_pass_with_pages_on_the_donor() {
    let dir = Scratch::new("c");
    let prog = dir.path("run_checks");
    compile_c(&c_source("run_checks.c"), &prog, &[]);
    let stats = dir.path("stats.json");
    let o = farmem_run(
        &["--local-mem", "64MiB", "--stats", stats.to_str().unwrap()],
        &[prog.to_str().unwrap(), "192"],
    );
    let out = text(&o);
    assert!(o.status.success(), "{out}");
    for check in [
        "malloc-api",
        "read-into-evicted",
        "threads",
        "fork",
        "mremap-grow",
        "madv-dontneed",
        "calloc-zero",
        "locale-unpaged",
        "map-populate",
        "map-shared",
        "wipeonfork",
        "mlock",
        "dontfork",
        "release-race",
    ] {
        assert!(
            out.contains(&format!("ok {check}\n")),
            "check {check} did not pass:\n{out}"
        );
    }
    let s = read_stats(&stats);
    assert!(
        far_bytes_out(&s) > 64 << 20,
        "pages should have gone far (host tier or donor): {s}"
    );
    assert!(far_bytes_in(&s) > 0, "pages should have come back: {s}");
    assert!(s["preload"]["heap_bytes"].as_u64().unwrap() > 0, "{s}");
    assert!(
        s["preload"]["mmap_regions"].as_u64().unwrap() >= 2,
        "mmap'd blocks should be regions: {s}"
    );
    // the summary line
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("faults") && err.contains("peak resident"),
        "{out}"
    );
}

/// Threads write pages of one range while another thread releases parts of it with
/// MADV_DONTNEED / MADV_FREE, the range four times the budget. The kernel applies such a
/// release only after the runtime has read its event, so pages the runtime installs in
/// between may vanish: on the code before the fix, a zero page installed after the runtime
/// handled the release and then zapped by the kernel was taken for resident-but-lost, and
/// the writer got SIGBUS (every run, within a second). Now it reads zeros, and nothing is
/// counted lost.
#[test]
fn released_pages_read_zeros_or_the_last_write_while_threads_fault() {
    let dir = Scratch::new("c-release-race");
    let prog = dir.path("run_checks");
    compile_c(&c_source("run_checks.c"), &prog, &[]);
    let stats = dir.path("stats.json");
    let o = farmem_run(
        &["--local-mem", "16MiB", "--stats", stats.to_str().unwrap()],
        &[prog.to_str().unwrap(), "64", "release-race"],
    );
    let out = text(&o);
    assert!(o.status.success(), "{out}");
    assert!(out.contains("ok release-race"), "{out}");
    let s = read_stats(&stats);
    assert_eq!(counter(&s, "state_lost_pages"), 0, "{s}");
    assert_eq!(counter(&s, "pages_lost"), 0, "{s}");
    assert!(
        counter(&s, "faults") > 10_000,
        "the writers should have faulted on released pages: {s}"
    );
}

#[test]
fn same_program_passes_without_farmem() {
    // The baseline: the checks themselves are right (so a farmem failure is farmem's).
    let dir = Scratch::new("c-plain");
    let prog = dir.path("run_checks");
    compile_c(&c_source("run_checks.c"), &prog, &[]);
    let o = std::process::Command::new(&prog)
        .arg("64")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
}

#[test]
fn mmap_threshold_decides_which_mappings_become_regions() {
    // The mremap check maps 32 MiB: a region under the default 1 MiB threshold, plain memory
    // under a 64 MiB one (and correct either way).
    let dir = Scratch::new("c-threshold");
    let prog = dir.path("run_checks");
    compile_c(&c_source("run_checks.c"), &prog, &[]);
    let regions = |threshold: &str| {
        let stats = dir.path(&format!("stats-{threshold}.json"));
        let o = farmem_run(
            &[
                "--local-mem",
                "64MiB",
                "--mmap-threshold",
                threshold,
                "--stats",
                stats.to_str().unwrap(),
            ],
            &[prog.to_str().unwrap(), "64", "mremap-grow"],
        );
        assert!(o.status.success(), "{}", text(&o));
        read_stats(&stats)["preload"]["mmap_regions"]
            .as_u64()
            .unwrap()
    };
    assert!(regions("1MiB") >= 1);
    assert_eq!(regions("64MiB"), 0);
}

#[test]
fn stats_file_is_rewritten_while_running_and_final_at_exit() {
    let dir = Scratch::new("c-stats");
    let stats = dir.path("stats.json");
    let mut r = farmem_spawn(
        &["--local-mem", "64MiB", "--stats", stats.to_str().unwrap()],
        // a program that ends through exit(3) (dash ends with _exit, which runs no exit hooks:
        // such a program leaves the last one-second snapshot)
        &["/usr/bin/python3", "-c", "import time; time.sleep(3)"],
        &dir.path("log"),
    );
    std::thread::sleep(std::time::Duration::from_millis(1500));
    let during = read_stats(&stats);
    assert_eq!(during["final"], false, "{during}");
    let st = r.wait(std::time::Duration::from_secs(30));
    assert!(st.success(), "{}", r.log_text());
    let after = read_stats(&stats);
    assert_eq!(after["final"], true, "{after}");
    assert_eq!(after["pid"], during["pid"]);
    // --local-mem covers the region budget and the write-back pool together.
    let budget = after["summary"]["budget_bytes"].as_u64().unwrap();
    let pool = after["summary"]["pool_bytes"].as_u64().unwrap();
    assert!(pool > 0 && budget + pool == 64 << 20, "{after}");
    assert!(r.log_text().contains("peak resident"), "{}", r.log_text());
}

#[test]
fn every_eviction_policy_passes_the_checks() {
    // The same checks under each policy `--evict` accepts (fifo is the default above).
    let dir = Scratch::new("c-evict");
    let prog = dir.path("run_checks");
    compile_c(&c_source("run_checks.c"), &prog, &[]);
    for policy in ["clock", "refault"] {
        let stats = dir.path(&format!("stats-{policy}.json"));
        let o = farmem_run(
            &[
                "--local-mem",
                "64MiB",
                "--evict",
                policy,
                "--stats",
                stats.to_str().unwrap(),
            ],
            &[prog.to_str().unwrap(), "128"],
        );
        let out = text(&o);
        assert!(o.status.success(), "{policy}: {out}");
        assert!(out.contains("ok calloc-zero\n"), "{policy}: {out}");
        let s = read_stats(&stats);
        assert!(
            far_bytes_in(&s) > 0,
            "{policy}: pages should have come back: {s}"
        );
    }
}

/// A region grown with mremap stays a region, grown part and all: moved (MREMAP_MAYMOVE) and
/// in place. The kernel keeps the grown part in the region's userfaultfd range but tells the
/// runtime only of the move, with the old length; the grown part was served as memory of no
/// region, never evicted (480 MiB of a 512 MiB mapping held outside the regions at 32 MiB).
#[test]
fn a_region_grown_by_mremap_stays_within_the_budget() {
    let dir = Scratch::new("mremap-grow");
    let prog = dir.path("mremap_grow");
    compile_c(&c_source("mremap_grow.c"), &prog, &[]);
    let stats = dir.path("stats.json");
    let o = farmem_run(
        &["--local-mem", "32MiB", "--stats", stats.to_str().unwrap()],
        &[prog.to_str().unwrap(), "256"],
    );
    let out = text(&o);
    assert!(o.status.success(), "{out}");
    assert!(
        out.contains("ok moved\n") && out.contains("ok in-place\n"),
        "{out}"
    );
    let s = read_stats(&stats);
    let outside = s["unmanaged"]["peak_anon_unmanaged_bytes"]
        .as_u64()
        .unwrap_or_else(|| panic!("no unmanaged report: {s}"));
    assert!(
        outside < 32 << 20,
        "{} MiB of anonymous memory outside the regions: {s}",
        outside >> 20
    );
    assert_went_far_and_came_back(&s, 192 << 20);
}
