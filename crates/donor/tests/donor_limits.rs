//! Quotas, capacity, and the activity tags the store keeps per slab.
mod common;

use common::*;
use farmem_donor::DonorConfig;
use farmem_proto::{PageAddr, Status};

#[test]
fn per_client_quota_is_enforced_and_freed_slabs_count_again() {
    let donor = start(DonorConfig {
        quota_bytes: Some(2 * SLAB_BYTES),
        ..config()
    });
    let mut a = Raw::hello(donor.local_addr(), 1, b"");
    let s1 = a.alloc_ok();
    let _s2 = a.alloc_ok();
    assert_eq!(a.alloc().status(), Status::QuotaExceeded);
    // The quota is per client id, across its connections.
    let mut a2 = Raw::hello(donor.local_addr(), 1, b"");
    assert_eq!(a2.alloc().status(), Status::QuotaExceeded);
    // Other clients have their own quota.
    let mut b = Raw::hello(donor.local_addr(), 2, b"");
    b.alloc_ok();
    b.alloc_ok();
    assert_eq!(b.alloc().status(), Status::QuotaExceeded);
    assert_eq!(a.free(s1), Reply::Done);
    a2.alloc_ok();
}

#[test]
fn capacity_exhausted_is_an_error_status_and_others_keep_working() {
    let donor = start(DonorConfig {
        capacity_bytes: 3 * SLAB_BYTES,
        ..config()
    });
    let mut w = Witness::new(donor.local_addr(), 50, b"");
    let mut a = Raw::hello(donor.local_addr(), 1, b"");
    let s = a.alloc_ok();
    a.alloc_ok();
    assert_eq!(a.alloc().status(), Status::CapacityExhausted);
    let st = a.stats();
    assert_eq!(
        (st.used_bytes, st.capacity_bytes),
        (3 * SLAB_BYTES, 3 * SLAB_BYTES)
    );
    w.check();
    assert_eq!(a.free(s), Reply::Done);
    a.alloc_ok();
}

#[test]
fn capacity_is_whole_slabs() {
    let donor = start(DonorConfig {
        capacity_bytes: 2 * SLAB_BYTES + SLAB_BYTES / 2,
        ..config()
    });
    let mut a = Raw::hello(donor.local_addr(), 1, b"");
    let Reply::Hello { capacity_bytes, .. } = a.hello_reply(1, b"") else {
        panic!("second HELLO with the same id should succeed");
    };
    assert_eq!(capacity_bytes, 2 * SLAB_BYTES);
    a.alloc_ok();
    a.alloc_ok();
    assert_eq!(a.alloc().status(), Status::CapacityExhausted);
}

#[test]
fn activity_tags_order_slabs_by_last_write() {
    let donor = start(config());
    let store = donor.store();
    let mut a = Raw::hello(donor.local_addr(), 1, b"");
    let s1 = a.alloc_ok();
    let s2 = a.alloc_ok();
    let s3 = a.alloc_ok();
    let p = page(1);
    assert_eq!(
        a.write(&[(PageAddr { slab: s1, page: 0 }, &p)]),
        Reply::Done
    );
    assert_eq!(
        a.write(&[(PageAddr { slab: s2, page: 0 }, &p)]),
        Reply::Done
    );
    // Never written comes first, then the oldest write.
    assert_eq!(store.least_recently_written().unwrap().id, s3);
    assert_eq!(
        a.write(&[(PageAddr { slab: s3, page: 9 }, &p)]),
        Reply::Done
    );
    assert_eq!(store.least_recently_written().unwrap().id, s1);
    assert_eq!(
        a.write(&[(PageAddr { slab: s1, page: 3 }, &p)]),
        Reply::Done
    );
    assert_eq!(store.least_recently_written().unwrap().id, s2);
    // Reads do not count as activity.
    assert!(matches!(
        a.read(&[PageAddr { slab: s2, page: 0 }]),
        Reply::Pages(_)
    ));
    assert_eq!(store.least_recently_written().unwrap().id, s2);
    let infos = store.slabs();
    assert_eq!(infos.len(), 3);
    assert!(infos
        .iter()
        .all(|i| i.owner == 1 && i.last_write.is_some() && !i.orphaned));
}

#[test]
fn a_connection_cannot_change_its_client_id() {
    let donor = start(config());
    let mut a = Raw::hello(donor.local_addr(), 1, b"");
    let s = a.alloc_ok();
    assert_eq!(a.hello_reply(2, b"").status(), Status::Malformed);
    // Still client 1.
    assert!(matches!(
        a.read(&[PageAddr { slab: s, page: 0 }]),
        Reply::Pages(_)
    ));
}
