//! The donor's normal service over real TCP: HELLO, allocate, write, read, free, stats.
mod common;

use common::*;
use farmem_proto::{PageAddr, Status, PAGE_SIZE};

#[test]
fn pages_written_are_read_back_and_unwritten_pages_are_zero() {
    let donor = start(config());
    let mut c = Raw::connect(donor.local_addr());
    assert_eq!(
        c.hello_reply(1, b""),
        Reply::Hello {
            slab_size_bytes: SLAB_BYTES,
            capacity_bytes: 16 * SLAB_BYTES
        }
    );
    let slab = c.alloc_ok();
    let (p0, p1) = (page(1), page(2));
    let a = PageAddr { slab, page: 5 };
    let b = PageAddr { slab, page: 63 };
    assert_eq!(c.write(&[(a, &p0), (b, &p1)]), Reply::Done);
    let z = PageAddr { slab, page: 6 };
    let Reply::Pages(data) = c.read(&[b, z, a]) else {
        panic!("read failed")
    };
    assert_eq!(&data[..PAGE_SIZE], p1.as_slice());
    assert!(data[PAGE_SIZE..2 * PAGE_SIZE].iter().all(|&x| x == 0));
    assert_eq!(&data[2 * PAGE_SIZE..], p0.as_slice());

    let st = c.stats();
    assert_eq!(st.slabs, 1);
    assert_eq!(st.used_bytes, SLAB_BYTES);
    assert_eq!(st.committed_bytes, 2 * PAGE_SIZE as u64);
    assert_eq!(st.clients, 1);
    assert_eq!(st.pages_written_total, 2);
    assert_eq!(st.pages_read_total, 3);
    assert!(st.service_p50_ns > 0 && st.service_p99_ns >= st.service_p50_ns);

    assert_eq!(c.free(slab), Reply::Done);
    assert_eq!(c.free(slab).status(), Status::NoSuchSlab, "double free");
    assert_eq!(c.read(&[a]).status(), Status::NoSuchSlab, "freed slab");
    donor.stop().unwrap();
}

#[test]
fn requests_before_hello_are_refused_and_hello_still_works_after() {
    let donor = start(config());
    let mut c = Raw::connect(donor.local_addr());
    assert_eq!(c.alloc().status(), Status::NotAuthenticated);
    let p = page(3);
    assert_eq!(
        c.write(&[(PageAddr { slab: 1, page: 0 }, &p)]).status(),
        Status::NotAuthenticated
    );
    assert!(matches!(c.hello_reply(9, b""), Reply::Hello { .. }));
    let slab = c.alloc_ok();
    assert_eq!(c.write(&[(PageAddr { slab, page: 0 }, &p)]), Reply::Done);
}
