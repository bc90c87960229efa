//! Nothing lost when donors go away or ask for their memory back: replicas, failover,
//! re-replication, the backup file and migration, against real donors in this process.
//! (Donors in network namespaces of their own, with real programs and every failure kind:
//! crates/cli/tests/nothing_lost.rs.)

use std::time::Duration;

use farmem_runtime::RuntimeConfig;
use farmem_testkit::donor::in_process;
use farmem_testkit::pages::{fill, mismatches, MIB, PAGE};
use farmem_testkit::runtime::{config, start, wait_for_sends_to_settle, wait_for_stats};

const SLAB: u64 = 1 << 20;

#[test]
fn a_donor_stopped_mid_run_loses_nothing_and_its_slabs_are_copied_again() {
    let budget = 2 * MIB;
    let mut donors: Vec<_> = (0..3).map(|_| Some(in_process(64 << 20, SLAB))).collect();
    let addrs = donors
        .iter()
        .map(|d| d.as_ref().unwrap().local_addr().to_string())
        .collect();
    let rt = start(config(budget, addrs));
    let region = rt.map(12 * budget).unwrap();
    let base = region.as_ptr() as usize;
    let pages = region.len() / PAGE;
    fill(base, pages, 1);
    wait_for_sends_to_settle(&rt);
    assert_eq!(rt.stats().replicas, 2);
    // The donor holding the most copies goes away: its connections close, its port refuses.
    let per = rt.slabs_per_donor();
    let victim = (0..3).max_by_key(|d| per[*d]).unwrap();
    donors[victim].take().unwrap().stop().unwrap();
    assert_eq!(mismatches(base, pages, 1), 0, "pages lost with one donor");
    let s = wait_for_stats(
        &rt,
        Duration::from_secs(30),
        Duration::from_millis(50),
        |s| s.dead_donors.len() == 1 && s.slabs_degraded == 0 && s.slabs_healed > 0,
    );
    assert_eq!(s.dead_donors.len(), 1, "{s:?}");
    assert!(s.dead_donors[0].contains("crash"), "{s:?}");
    assert!(s.slabs_healed > 0 && s.slabs_degraded == 0, "{s:?}");
    assert_eq!((s.fetch_errors, s.slabs_lost), (0, 0), "{s:?}");
    // New data: written back to the two donors left, and read back.
    fill(base, pages, 2);
    assert_eq!(mismatches(base, pages, 2), 0);
}

#[test]
fn with_a_backup_file_losing_every_donor_loses_nothing() {
    let budget = 2 * MIB;
    let dir = farmem_testkit::run::Scratch::new("backup");
    let path = dir.path("pages.backup");
    let donor = in_process(64 << 20, SLAB);
    let rt = start(RuntimeConfig {
        backup_file: Some(path.clone()),
        ..config(budget, vec![donor.local_addr().to_string()])
    });
    let region = rt.map(8 * budget).unwrap();
    let base = region.as_ptr() as usize;
    let pages = region.len() / PAGE;
    fill(base, pages, 3);
    wait_for_sends_to_settle(&rt);
    donor.stop().unwrap();
    assert_eq!(mismatches(base, pages, 3), 0, "pages lost with the donor");
    // Pages evicted now have no donor: they go to the file, and come back from it.
    fill(base, pages, 4);
    assert_eq!(mismatches(base, pages, 4), 0);
    let s = rt.stats();
    assert!(s.backup_pages_read > 0 && s.failovers > 0, "{s:?}");
    assert_eq!(s.fetch_errors, 0, "{s:?}");
    assert!(path.exists());
    drop(region);
    drop(rt);
    assert!(!path.exists(), "the backup file goes with the runtime");
}

#[test]
fn a_donor_asking_for_memory_back_gets_it_and_nothing_is_lost() {
    let budget = 2 * MIB;
    let donors: Vec<_> = (0..3).map(|_| in_process(64 << 20, SLAB)).collect();
    let rt = start(RuntimeConfig {
        replicas: Some(1),
        ..config(
            budget,
            donors.iter().map(|d| d.local_addr().to_string()).collect(),
        )
    });
    let region = rt.map(16 * budget).unwrap();
    let base = region.as_ptr() as usize;
    let pages = region.len() / PAGE;
    fill(base, pages, 7);
    wait_for_sends_to_settle(&rt);
    let per = rt.slabs_per_donor();
    let d = (0..3).max_by_key(|d| per[*d]).unwrap();
    assert!(per[d] >= 4, "{per:?}");
    let store = donors[d].store();
    let before = store.used_bytes();
    donors[d].control().set_capacity_bytes(SLAB).unwrap();
    let s = wait_for_stats(
        &rt,
        Duration::from_secs(20),
        Duration::from_millis(50),
        |_| donors[d].store().used_bytes() <= SLAB,
    );
    let after = store.used_bytes();
    assert!(
        after <= SLAB,
        "the donor still lends {after} of {before} bytes: {s:?}"
    );
    assert!(s.slabs_migrated > 0, "{s:?}");
    assert_eq!(mismatches(base, pages, 7), 0, "pages lost in the move");
}

#[test]
fn the_only_donor_asking_for_memory_back_has_its_slabs_taken_into_local_memory() {
    let budget = 2 * MIB;
    let donor = in_process(64 << 20, SLAB);
    let rt = start(config(budget, vec![donor.local_addr().to_string()]));
    let region = rt.map(8 * budget).unwrap();
    let base = region.as_ptr() as usize;
    let pages = region.len() / PAGE;
    fill(base, pages, 9);
    wait_for_sends_to_settle(&rt);
    donor.control().set_capacity_bytes(SLAB).unwrap();
    let s = wait_for_stats(
        &rt,
        Duration::from_secs(20),
        Duration::from_millis(50),
        |_| donor.store().used_bytes() <= SLAB,
    );
    assert!(donor.store().used_bytes() <= SLAB, "{s:?}");
    assert!(s.local_slabs > 0 && s.slabs_migrated > 0, "{s:?}");
    assert_eq!(mismatches(base, pages, 9), 0, "pages lost in the move");
}
