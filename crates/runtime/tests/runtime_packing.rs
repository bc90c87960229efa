//! Far slabs packed into donor slabs: with homes of different slab sizes (the host tier's
//! 4 MiB beside donors' 64 MiB, or donors of different sizes) the far slab is the smallest, and
//! each donor slab holds as many far slabs as fit. Before, each far slab took a whole donor
//! slab: three 1 GiB donors were "full" holding about 200 MiB, and the budget broke. Here one
//! donor hands out 256 KiB slabs and two 1 MiB slabs (four far slabs each), against real
//! donors in this process: placement, healing after a donor is lost and migration when a
//! donor asks for a slab back all move whole pieces, and nothing is lost.

use std::time::Duration;

use farmem_runtime::RuntimeConfig;
use farmem_testkit::donor::in_process;
use farmem_testkit::pages::{fill, mismatches, MIB, PAGE};
use farmem_testkit::runtime::{config, start, wait_for_sends_to_settle, wait_for_stats};

const SMALL: u64 = 256 << 10;
const SLAB: u64 = 1 << 20;

fn donors() -> Vec<farmem_donor::RunningDonor> {
    vec![
        in_process(64 << 20, SMALL),
        in_process(64 << 20, SLAB),
        in_process(64 << 20, SLAB),
    ]
}

fn addrs(d: &[farmem_donor::RunningDonor]) -> Vec<String> {
    d.iter().map(|d| d.local_addr().to_string()).collect()
}

#[test]
fn far_slabs_fill_donor_slabs_before_new_ones_are_taken() {
    let budget = 2 * MIB;
    let donors = donors();
    let rt = start(config(budget, addrs(&donors)));
    let region = rt.map(12 * budget).unwrap();
    let base = region.as_ptr() as usize;
    let pages = region.len() / PAGE;
    fill(base, pages, 1);
    wait_for_sends_to_settle(&rt);
    assert_eq!(mismatches(base, pages, 1), 0);
    let s = rt.stats();
    // What the donors lend this runtime (their own count) against what it fills.
    let lent: u64 = donors.iter().map(|d| d.store().used_bytes()).sum();
    // Two copies of every page written, and a partly filled slab per donor: no more. (A
    // whole donor slab per far slab lent about three times that.)
    let written = 2 * region.len() as u64;
    assert!(
        lent <= written + 2 * SLAB,
        "{lent} bytes lent for {written}"
    );
    assert_eq!(s.donor_bytes_taken, lent, "{s:?}");
    assert!(s.donor_bytes_filled > 0, "{s:?}");
    // At most one partly filled donor slab per donor: 3 of 4 pieces of two 1 MiB slabs.
    let stranded = lent - s.donor_bytes_filled;
    assert!(
        stranded <= 2 * (SLAB - SMALL),
        "{stranded} bytes of {lent} lent hold no far slab: {s:?}"
    );
    assert!(
        s.donor_bytes_filled * 10 >= lent * 9,
        "far slabs fill {} of {lent} bytes lent: {s:?}",
        s.donor_bytes_filled
    );
}

#[test]
fn a_lost_donor_s_packed_slabs_are_copied_again_and_nothing_is_lost() {
    let budget = 2 * MIB;
    let mut donors: Vec<_> = donors().into_iter().map(Some).collect();
    let a: Vec<String> = donors
        .iter()
        .map(|d| d.as_ref().unwrap().local_addr().to_string())
        .collect();
    let rt = start(config(budget, a));
    let region = rt.map(12 * budget).unwrap();
    let base = region.as_ptr() as usize;
    let pages = region.len() / PAGE;
    fill(base, pages, 3);
    wait_for_sends_to_settle(&rt);
    // A donor of 1 MiB slabs (four far slabs in each) goes away.
    donors[1].take().unwrap().stop().unwrap();
    assert_eq!(mismatches(base, pages, 3), 0, "pages lost with one donor");
    let s = wait_for_stats(
        &rt,
        Duration::from_secs(30),
        Duration::from_millis(50),
        |s| s.dead_donors.len() == 1 && s.slabs_degraded == 0 && s.slabs_healed > 0,
    );
    assert!(s.slabs_healed > 0 && s.slabs_degraded == 0, "{s:?}");
    assert_eq!((s.fetch_errors, s.slabs_lost), (0, 0), "{s:?}");
    fill(base, pages, 4);
    assert_eq!(mismatches(base, pages, 4), 0);
}

#[test]
fn a_donor_asking_for_a_packed_slab_back_gets_all_of_it_and_nothing_is_lost() {
    let budget = 2 * MIB;
    let donors = donors();
    let rt = start(RuntimeConfig {
        replicas: Some(1),
        ..config(budget, addrs(&donors))
    });
    let region = rt.map(16 * budget).unwrap();
    let base = region.as_ptr() as usize;
    let pages = region.len() / PAGE;
    fill(base, pages, 7);
    wait_for_sends_to_settle(&rt);
    // The 1 MiB-slab donor lending the most keeps one slab's worth.
    let d = (1..3)
        .max_by_key(|d| donors[*d].store().used_bytes())
        .unwrap();
    let before = donors[d].store().used_bytes();
    assert!(before >= 3 * SLAB, "{before}");
    donors[d].control().set_capacity_bytes(SLAB).unwrap();
    let s = wait_for_stats(
        &rt,
        Duration::from_secs(30),
        Duration::from_millis(50),
        |_| donors[d].store().used_bytes() <= SLAB,
    );
    let after = donors[d].store().used_bytes();
    assert!(
        after <= SLAB,
        "the donor still lends {after} of {before}: {s:?}"
    );
    assert!(s.slabs_migrated > 0, "{s:?}");
    assert_eq!(mismatches(base, pages, 7), 0, "pages lost in the move");
    // Written again: the far slabs moved are written where they live now.
    fill(base, pages, 8);
    assert_eq!(mismatches(base, pages, 8), 0);
    let lent: u64 = donors.iter().map(|d| d.store().used_bytes()).sum();
    let s = rt.stats();
    assert_eq!(s.donor_bytes_taken, lent, "{s:?}");
}
