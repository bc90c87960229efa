//! Freed memory is never moved (issue 12): a program that frees a block and allocates the next
//! one at once (numpy's fill-sum-free loop) must not have the old, evicted contents of the
//! reused addresses fetched back before it overwrites them. The preload library's allocator
//! purges freed blocks at once, the runtime sees the purge as a REMOVE event and forgets the
//! pages, and the next use starts from zero pages. Run on tests/c/fill_sum_free.c, 64 MiB
//! blocks at a 32 MiB budget, prefetching off so that every byte fetched is a demand fetch.

use farmem_testkit::run::*;

const MIB: u64 = 1 << 20;
const BLOCK_MIB: u64 = 64;
const ROUNDS: u64 = 4;

fn run(dir: &Scratch, prog: &str, mode: &str) -> serde_json::Value {
    let stats = dir.path(&format!("stats-{mode}.json"));
    let o = farmem_run(
        &[
            "--local-mem",
            "32MiB",
            "--prefetch",
            "none",
            "--stats",
            stats.to_str().unwrap(),
        ],
        &[prog, &BLOCK_MIB.to_string(), &ROUNDS.to_string(), mode],
    );
    let out = text(&o);
    assert!(o.status.success(), "{out}");
    assert!(out.contains("ok "), "{out}");
    read_stats(&stats)
}

#[test]
fn freed_blocks_are_never_fetched_back() {
    let dir = Scratch::new("freed");
    let prog = dir.path("fill_sum_free");
    compile_c(&c_source("fill_sum_free.c"), &prog, &[]);
    let prog = prog.to_str().unwrap();

    // Write-only rounds: no byte of the live data is ever read, so nothing needs fetching.
    // (Before the allocator purged at once: 128 MiB fetched.)
    let s = run(&dir, prog, "nosum");
    assert!(
        far_bytes_out(&s) > 64 * MIB,
        "the blocks should not fit, pages should have gone out: {s}"
    );
    assert!(
        far_bytes_in(&s) <= MIB,
        "freed blocks were fetched back: {} bytes in: {s}",
        far_bytes_in(&s)
    );

    // Fill-sum-free: each sum reads its whole block back (a sequential scan larger than the
    // budget brings every page back), so the live data needs ROUNDS x block in; allow 10%.
    // (Before: 1.5x.)
    let s = run(&dir, prog, "sum");
    let live = ROUNDS * BLOCK_MIB * MIB;
    assert!(
        far_bytes_in(&s) * 10 <= live * 11,
        "{} bytes in for {live} bytes of live data read back: {s}",
        far_bytes_in(&s)
    );
}
