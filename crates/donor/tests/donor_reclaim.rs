//! Taking memory back (Valet): a donor over its capacity, or short of host memory below
//! `--keep-free`, names the slabs it wants back in its answer to RECLAIMS; clients give them
//! back with FREE_SLAB, and the answer becomes empty again.
mod common;

use std::time::{Duration, Instant};

use common::*;
use farmem_donor::DonorConfig;
use farmem_proto::{Header, Opcode, PageAddr, Status, PAGE_SIZE};

/// Writes one page to each of `slabs`, in order (the last one is the most recently written).
fn touch(c: &mut Raw, slabs: &[u32]) {
    for (i, &slab) in slabs.iter().enumerate() {
        let p = page(i as u64);
        assert_eq!(c.write(&[(PageAddr { slab, page: 0 }, &p)]), Reply::Done);
        // Distinct activity tags even on a coarse clock.
        std::thread::sleep(Duration::from_millis(2));
    }
}

#[test]
fn lowering_the_capacity_asks_for_the_least_recently_written_slabs_until_they_are_freed() {
    let donor = start(DonorConfig {
        capacity_bytes: 8 * SLAB_BYTES,
        memory_watermark_bytes: Some(0),
        ..config()
    });
    let mut c = Raw::hello(donor.local_addr(), 1, b"");
    let slabs: Vec<u32> = (0..4).map(|_| c.alloc_ok()).collect();
    assert!(c.reclaims().is_empty(), "within capacity nothing is wanted");
    // Written oldest first: slabs[0], then [1], [2], [3].
    touch(&mut c, &slabs);

    let control = donor.control();
    assert_eq!(
        control.set_capacity_bytes(2 * SLAB_BYTES).unwrap(),
        2 * SLAB_BYTES
    );
    let mut wanted = c.reclaims();
    wanted.sort_unstable();
    assert_eq!(
        wanted,
        vec![slabs[0], slabs[1]],
        "the two least recently written"
    );
    assert_eq!(c.reclaims().len(), 2, "asked again until given back");
    let st = c.stats();
    assert_eq!(st.capacity_bytes, 2 * SLAB_BYTES);
    assert_eq!(st.reclaim_wanted_bytes, 2 * SLAB_BYTES);
    assert_eq!(
        c.alloc().status(),
        Status::CapacityExhausted,
        "nothing new lent"
    );

    // Data of the asked slabs stays readable (the client moves it first), then it is freed.
    assert_eq!(
        c.read(&[PageAddr {
            slab: slabs[0],
            page: 0
        }]),
        Reply::Pages(page(0))
    );
    let committed = c.stats().committed_bytes;
    for s in &wanted {
        assert_eq!(c.free(*s), Reply::Done);
    }
    let st = c.stats();
    assert_eq!(st.used_bytes, 2 * SLAB_BYTES);
    assert_eq!(st.committed_bytes, committed - 2 * PAGE_SIZE as u64);
    assert_eq!(st.slabs_given_back_total, 2);
    assert_eq!(st.reclaim_wanted_bytes, 0);
    assert!(c.reclaims().is_empty());
    assert_eq!(c.alloc().status(), Status::CapacityExhausted, "at capacity");

    // Raising it lends again.
    control.set_capacity_bytes(4 * SLAB_BYTES).unwrap();
    c.alloc_ok();
    assert!(c.reclaims().is_empty());
}

#[test]
fn two_clients_share_the_shortfall_and_are_never_asked_for_the_same_slab() {
    let donor = start(DonorConfig {
        capacity_bytes: 8 * SLAB_BYTES,
        memory_watermark_bytes: Some(0),
        ..config()
    });
    let mut a = Raw::hello(donor.local_addr(), 1, b"");
    let mut b = Raw::hello(donor.local_addr(), 2, b"");
    let sa: Vec<u32> = (0..3).map(|_| a.alloc_ok()).collect();
    let sb: Vec<u32> = (0..3).map(|_| b.alloc_ok()).collect();
    touch(&mut a, &sa);
    touch(&mut b, &sb);
    donor.control().set_capacity_bytes(4 * SLAB_BYTES).unwrap();
    let (wa, wb) = (a.reclaims(), b.reclaims());
    assert_eq!((wa.len(), wb.len()), (1, 1), "{wa:?} {wb:?}");
    assert_eq!(wa, vec![sa[0]]);
    assert_eq!(wb, vec![sb[0]]);
    // Each client frees its own; the other's answer does not change meanwhile.
    assert_eq!(a.free(wa[0]), Reply::Done);
    assert!(a.reclaims().is_empty());
    assert_eq!(b.reclaims(), wb);
    assert_eq!(b.free(wb[0]), Reply::Done);
    assert!(b.reclaims().is_empty());
    assert_eq!(a.stats().used_bytes, 4 * SLAB_BYTES);
}

#[test]
fn a_host_short_of_memory_below_keep_free_asks_for_written_slabs() {
    let dir = std::env::temp_dir().join(format!("farmem-reclaim-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let meminfo = dir.join("meminfo");
    let set_available = |bytes: u64| {
        let text = format!(
            "MemTotal:       {} kB\nMemFree:        {} kB\nMemAvailable:   {} kB\n",
            64 << 20,
            bytes / 1024,
            bytes / 1024
        );
        // Write then rename, so the donor never reads half a file.
        let tmp = dir.join("meminfo.tmp");
        std::fs::write(&tmp, text).unwrap();
        std::fs::rename(&tmp, &meminfo).unwrap();
    };
    const KEEP_FREE: u64 = 1 << 30;
    set_available(4 << 30);
    let donor = start(DonorConfig {
        capacity_bytes: 8 * SLAB_BYTES,
        memory_watermark_bytes: Some(0),
        keep_free_bytes: Some(KEEP_FREE),
        meminfo_path: meminfo.clone(),
        ..config()
    });
    let mut c = Raw::hello(donor.local_addr(), 1, b"");
    let slabs: Vec<u32> = (0..4).map(|_| c.alloc_ok()).collect();
    // Slab 3 is never written: giving it back would not help the host.
    let full: Vec<Vec<u8>> = (0..64).map(page).collect();
    for (i, &slab) in slabs[..3].iter().enumerate() {
        let batch: Vec<(PageAddr, &[u8])> = (0..64u32)
            .map(|p| (PageAddr { slab, page: p }, full[p as usize].as_slice()))
            .collect();
        assert_eq!(c.write(&batch), Reply::Done, "slab {i}");
        std::thread::sleep(Duration::from_millis(2));
    }
    assert!(c.reclaims().is_empty());

    // The host falls 1.5 slabs short of --keep-free: two written slabs cover it.
    set_available(KEEP_FREE - SLAB_BYTES - SLAB_BYTES / 2);
    let wanted = poll_reclaims(&mut c, |w| !w.is_empty());
    assert_eq!(wanted, vec![slabs[0], slabs[1]]);
    let refused = c.alloc();
    assert_eq!(refused.status(), Status::MemoryPressure, "{refused:?}");
    assert!(
        matches!(&refused, Reply::Error(_, m) if m.contains("--keep-free")),
        "{refused:?}"
    );
    assert_eq!(c.stats().reclaim_wanted_bytes, SLAB_BYTES + SLAB_BYTES / 2);

    // Given back: the host has its memory again, and the donor stops asking.
    for s in &wanted {
        assert_eq!(c.free(*s), Reply::Done);
    }
    set_available(KEEP_FREE + SLAB_BYTES / 2);
    poll_reclaims(&mut c, <[u32]>::is_empty);
    std::thread::sleep(Duration::from_millis(500));
    assert!(c.reclaims().is_empty());
    let st = c.stats();
    assert_eq!((st.reclaim_wanted_bytes, st.slabs_given_back_total), (0, 2));
    c.alloc_ok();
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Asks RECLAIMS until `done` holds (the donor reads the host every 200 ms), for 10 s at most.
fn poll_reclaims(c: &mut Raw, done: impl Fn(&[u32]) -> bool) -> Vec<u32> {
    let start = Instant::now();
    loop {
        let mut w = c.reclaims();
        if done(&w) {
            w.sort_unstable();
            return w;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "the donor's answer stayed {w:?} for 10 s"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn malformed_reclaims_get_an_error_and_the_donor_keeps_serving() {
    let donor = start(config());
    let mut w = Witness::new(donor.local_addr(), 1000, b"");

    // Before the handshake.
    let mut early = Raw::connect(donor.local_addr());
    let mut f = Vec::new();
    farmem_proto::encode_reclaims(&mut f, 3);
    assert_eq!(early.call(&f).status(), Status::NotAuthenticated);

    // With a payload RECLAIMS does not have: malformed, and the connection goes on.
    let mut bad = Raw::hello(donor.local_addr(), 7, b"");
    let mut f = Header::request(Opcode::Reclaims, 9, 6).encode().to_vec();
    f.extend_from_slice(&[1, 0, 2, 0, 0, 0]);
    let (h, reply) = {
        bad.send(&f);
        bad.recv().expect("the donor answers")
    };
    assert_eq!(h.request_id, 9);
    assert_eq!(reply.status(), Status::Malformed, "{reply:?}");
    assert!(
        matches!(&reply, Reply::Error(_, m) if m.contains("reclaims")),
        "{reply:?}"
    );
    assert!(bad.reclaims().is_empty(), "the connection still serves");
    w.check();
}

#[test]
fn a_capacity_below_one_slab_or_above_the_host_is_refused_and_the_old_one_kept() {
    let donor = start(config());
    let control = donor.control();
    let before = control.capacity_bytes();
    let e = control.set_capacity_bytes(0).unwrap_err().to_string();
    assert!(e.contains("smaller than one slab"), "{e}");
    let e = control
        .set_capacity_bytes(SLAB_BYTES - 1)
        .unwrap_err()
        .to_string();
    assert!(e.contains("smaller than one slab"), "{e}");
    let e = control
        .set_capacity_bytes(u64::MAX / 2)
        .unwrap_err()
        .to_string();
    assert!(e.contains("--capacity"), "{e}");
    assert_eq!(control.capacity_bytes(), before);
    // A capacity that is not whole slabs is rounded down.
    assert_eq!(
        control.set_capacity_bytes(3 * SLAB_BYTES + 5).unwrap(),
        3 * SLAB_BYTES
    );
    let mut c = Raw::hello(donor.local_addr(), 1, b"");
    assert_eq!(c.stats().capacity_bytes, 3 * SLAB_BYTES);
}
