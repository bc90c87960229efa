//! Pages read back from the write-back pool stay clean: data written once, evicted, brought back
//! by read faults that hit the pool, and evicted again must not be sent to the donor a second
//! time (a pool hit on a read fault installs the page write-protected, so the runtime still sees
//! a later write). Also checks that such a later write is seen: the new data survives the next
//! eviction.

use std::sync::Arc;
use std::time::Duration;

use farmem_donor::RunningDonor;
use farmem_runtime::{Region, Runtime, RuntimeConfig, Stats};
use farmem_testkit::donor::in_process;
use farmem_testkit::pages::{Stamp, MIB, PAGE};
use farmem_testkit::runtime::{config, start, wait_for_stats};

/// What this file stamps pages with.
const STAMP: Stamp = Stamp {
    step: 61,
    salt: 0x3333,
};

/// A 1 MiB budget with a 4 MiB pool: a 2 MiB region evicted once fits in the pool whole, so
/// the read passes are served from it.
fn runtime(donor: &RunningDonor) -> Arc<Runtime> {
    start(RuntimeConfig {
        pool_bytes: Some(4 * MIB as u64),
        evict: "fifo".into(),
        ..config(MIB, vec![donor.local_addr().to_string()])
    })
}

/// Stamps every page of `region` with 1 and waits until every evicted one is sent: a page read
/// back while its first send is still in flight comes back "sending" and is rightly sent again
/// if evicted before the ack (a loaded machine). Returns its base, its pages and the stats.
fn write_all_and_wait_sent(rt: &Arc<Runtime>, region: &Region) -> (usize, usize, Stats) {
    let base = region.as_ptr() as usize;
    let pages = region.len() / PAGE;
    for p in 0..pages {
        STAMP.write_page(base, p, 1);
    }
    let s = wait_for_stats(
        rt,
        Duration::from_secs(20),
        Duration::from_millis(20),
        |s| s.evicted_sent_dirty + s.resident_pages >= pages as u64,
    );
    assert!(
        s.evicted_sent_dirty + s.resident_pages >= pages as u64,
        "the evicted pages were not all sent within 20 s: {s:?}"
    );
    (base, pages, s)
}

#[test]
fn pool_hits_on_read_come_back_clean_and_are_not_resent() {
    let donor = in_process(64 << 20, 1 << 20);
    let rt = runtime(&donor);
    let region = rt.map(2 * MIB).unwrap();
    let (base, pages, _) = write_all_and_wait_sent(&rt, &region);
    // Read-only passes: every pass evicts what the previous one brought back.
    for _ in 0..4 {
        for p in 0..pages {
            STAMP.check_page(base, p, 1);
        }
    }
    let s = rt.stats();
    assert!(
        s.faults_pool_hit >= pages as u64,
        "the read passes must be served from the pool for this test to mean anything: {s:?}"
    );
    assert_eq!(s.fetch_errors + s.send_errors, 0, "{s:?}");
    assert!(
        s.evicted_sent_dirty <= pages as u64,
        "sent {} pages but only {pages} were ever written: pages read back from the pool were \
         sent again ({s:?})",
        s.evicted_sent_dirty
    );
    assert!(
        s.evicted_dropped_clean >= pages as u64,
        "pages read back from the pool were not evicted as clean: {s:?}"
    );
    // A write to a page that came back clean is still seen: it is sent when evicted and the
    // new data comes back. Backwards, so the resident pages (the last ones read, all brought
    // back from the pool) are written before FIFO evicts them.
    for p in (0..pages).rev() {
        STAMP.write_page(base, p, 2);
    }
    for _ in 0..2 {
        for p in 0..pages {
            STAMP.check_page(base, p, 2);
        }
    }
    let after = rt.stats();
    assert!(
        after.faults_write_protect > 0,
        "writes to clean pages raised no write-protect fault: {after:?}"
    );
    assert!(
        after.evicted_sent_dirty > s.evicted_sent_dirty,
        "rewritten pages were not sent: {after:?}"
    );
    assert!(
        after.evicted_sent_dirty <= 2 * pages as u64,
        "{} pages sent for {pages} pages written twice: {after:?}",
        after.evicted_sent_dirty
    );
    assert_eq!(after.fetch_errors + after.send_errors, 0, "{after:?}");
}

/// A lowered local grant (a process tree's share) shrinks the pool with it: the sent pages it
/// held beyond its new fifth are given back at once, none is taken beyond it while the program
/// keeps paging, every byte still reads back, and a raised grant lets the pool fill again.
#[test]
fn a_lowered_grant_gives_back_the_pool_s_pages_and_loses_none() {
    let donor = in_process(64 << 20, 1 << 20);
    let rt = runtime(&donor);
    let region = rt.map(4 * MIB).unwrap();
    let (base, pages, s) = write_all_and_wait_sent(&rt, &region);
    assert!(
        s.pool_pages >= 128 && s.pool_capacity_pages == 1024,
        "the evicted pages should wait in the pool for this test to mean anything: {s:?}"
    );
    // 320 local pages: a 64-slot pool and a 256-page budget.
    assert_eq!(rt.set_local_pages(320), (64, 256));
    let s = rt.stats();
    assert_eq!(s.pool_capacity_pages, 64, "{s:?}");
    assert!(s.pool_pages <= 64, "the pool kept its sent pages: {s:?}");
    // Paging on at the small pool: written again, then read twice.
    for p in 0..pages {
        STAMP.check_page(base, p, 1);
        STAMP.write_page(base, p, 2);
    }
    for _ in 0..2 {
        for p in (0..pages).rev() {
            STAMP.check_page(base, p, 2);
        }
        let s = rt.stats();
        assert!(s.pool_pages <= 64, "the pool went over its limit: {s:?}");
    }
    // A raised grant: evictions fill the pool again, up to its new fifth.
    assert_eq!(rt.set_local_pages(5 * 1024), (1024, 4096));
    assert_eq!(rt.set_local_pages(640), (128, 512));
    for p in 0..pages {
        STAMP.write_page(base, p, 3);
    }
    let s = wait_for_stats(
        &rt,
        Duration::from_secs(20),
        Duration::from_millis(20),
        |s| s.pool_pages > 64,
    );
    assert!(s.pool_pages > 64 && s.pool_pages <= 128, "{s:?}");
    for p in 0..pages {
        STAMP.check_page(base, p, 3);
    }
    let s = rt.stats();
    assert_eq!(s.fetch_errors + s.send_errors, 0, "{s:?}");
}
