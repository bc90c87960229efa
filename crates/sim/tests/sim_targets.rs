//! The targets for the prediction side, checked on generated traces (cache = 25% of the
//! working set, every prefetcher replayed on the same trace). Deterministic: seeded generators.

use farmem_sim::gen::{generate, GenSpec};
use farmem_sim::sim::{parse_cache, simulate, working_set, Latency, Row};

const WSS_PAGES: u64 = 4096;
const LENGTH: u64 = 50_000;

fn run(spec: &str, prefetchers: &[&str]) -> Vec<Row> {
    let trace = generate(&GenSpec::parse(spec).unwrap(), WSS_PAGES, LENGTH, 1).unwrap();
    let universe = working_set(&trace);
    let cache = parse_cache("25%", universe.len() as u64).unwrap();
    prefetchers
        .iter()
        .map(|p| simulate(&trace, &universe, p, "fifo", cache, Latency::default()).unwrap())
        .collect()
}

#[test]
fn seq_and_stride_10_leap_hits_at_least_90_percent_with_few_useless_prefetches() {
    for spec in ["seq", "stride:10"] {
        let rows = run(spec, &["leap", "none"]);
        let (leap, none) = (&rows[0], &rows[1]);
        assert_eq!(
            none.faults, LENGTH,
            "{spec}: a cyclic walk over 4x the cache always misses"
        );
        assert!(leap.hit_ratio >= 0.9, "{spec}: {leap:?}");
        assert!(
            leap.prefetched as f64 <= 1.2 * leap.prefetch_hits as f64,
            "{spec}: {leap:?}"
        );
    }
}

#[test]
fn random_leap_prefetches_at_most_5_percent_of_readahead() {
    let rows = run("random", &["leap", "readahead"]);
    let (leap, readahead) = (&rows[0], &rows[1]);
    assert!(
        readahead.prefetched > 0,
        "readahead must have tried: {readahead:?}"
    );
    assert!(
        leap.prefetched as f64 <= 0.05 * readahead.prefetched as f64,
        "leap {leap:?} vs readahead {readahead:?}"
    );
}

#[test]
fn interleaved_strides_per_thread_coverage_is_at_least_twice_per_process() {
    let rows = run("interleave:4:3,5,7,11", &["leap", "leap-process"]);
    let (per_thread, per_process) = (&rows[0], &rows[1]);
    assert!(per_thread.coverage > 0.9, "{per_thread:?}");
    assert!(
        per_thread.coverage >= 2.0 * per_process.coverage,
        "per thread {per_thread:?} vs per process {per_process:?}"
    );
}

#[test]
fn leap_follows_the_stride_when_it_changes_mid_run() {
    let rows = run("phases", &["leap", "next-n"]);
    assert!(rows[0].hit_ratio >= 0.9, "{:?}", rows[0]);
    assert!(rows[0].hit_ratio > rows[1].hit_ratio, "{rows:?}");
}
