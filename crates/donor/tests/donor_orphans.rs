//! Orphaned slabs: kept for a client that reconnects within the grace period, freed after it.
mod common;

use std::time::{Duration, Instant};

use common::*;
use farmem_donor::DonorConfig;
use farmem_proto::{PageAddr, Status};

fn wait_for(what: &str, mut cond: impl FnMut() -> bool) {
    // Generous: on a loaded machine the donor's threads may wait seconds for a CPU.
    let deadline = Instant::now() + Duration::from_secs(30);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn orphaned_slabs_are_freed_after_the_grace_period() {
    let donor = start(DonorConfig {
        orphan_grace: Duration::from_millis(100),
        ..config()
    });
    let mut observer = Witness::new(donor.local_addr(), 2, b"");
    let slab;
    {
        let mut c = Raw::hello(donor.local_addr(), 1, b"");
        slab = c.alloc_ok();
        let p = page(3);
        assert_eq!(c.write(&[(PageAddr { slab, page: 0 }, &p)]), Reply::Done);
        assert_eq!(observer.raw.stats().slabs, 2);
    } // connection closed
    wait_for("the orphaned slab to be freed", || {
        observer.raw.stats().slabs == 1
    });
    let st = observer.raw.stats();
    assert_eq!(st.used_bytes, SLAB_BYTES);
    // The client comes back too late: its slab is gone, not handed to anyone else.
    let mut c = Raw::hello(donor.local_addr(), 1, b"");
    assert_eq!(
        c.read(&[PageAddr { slab, page: 0 }]).status(),
        Status::NoSuchSlab
    );
    // The connected client's slab was never at risk.
    observer.check();
}

#[test]
fn a_client_reconnecting_within_the_grace_period_finds_its_slabs() {
    let donor = start(DonorConfig {
        orphan_grace: Duration::from_secs(60),
        ..config()
    });
    let store = donor.store();
    let (slab, p) = {
        let mut c = Raw::hello(donor.local_addr(), 1, b"");
        let slab = c.alloc_ok();
        let p = page(4);
        assert_eq!(c.write(&[(PageAddr { slab, page: 10 }, &p)]), Reply::Done);
        (slab, p)
    };
    wait_for("the donor to see the disconnect", || {
        store.slabs().iter().all(|s| s.orphaned)
    });
    let mut c = Raw::hello(donor.local_addr(), 1, b"");
    assert_eq!(c.read(&[PageAddr { slab, page: 10 }]), Reply::Pages(p));
    assert!(store.slabs().iter().all(|s| !s.orphaned));
}

#[test]
fn connections_sharing_a_client_id_share_its_slabs_and_keep_them_alive() {
    // Decision (see store.rs): a second connection with the same client id while the first is
    // still open is allowed and sees the same slabs; the orphan clock starts only when the last
    // one closes. Grace zero: slabs would go at once if the donor thought the client gone.
    let donor = start(DonorConfig {
        orphan_grace: Duration::ZERO,
        ..config()
    });
    let mut first = Raw::hello(donor.local_addr(), 1, b"");
    let slab = first.alloc_ok();
    let p = page(5);
    assert_eq!(
        first.write(&[(PageAddr { slab, page: 1 }, &p)]),
        Reply::Done
    );
    let mut second = Raw::hello(donor.local_addr(), 1, b"");
    assert_eq!(
        second.read(&[PageAddr { slab, page: 1 }]),
        Reply::Pages(p.clone())
    );
    let store = donor.store();
    assert_eq!(store.client_connections(1), 2);
    drop(first);
    wait_for("the donor to see the first connection close", || {
        store.client_connections(1) == 1
    });
    // The reaper (grace zero) had its chance: the slab must still be there.
    assert_eq!(store.slab_count(), 1);
    assert_eq!(second.read(&[PageAddr { slab, page: 1 }]), Reply::Pages(p));
    drop(second);
    wait_for(
        "the last connection's slabs to be freed (grace zero)",
        || store.slab_count() == 0,
    );
}
