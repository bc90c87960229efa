//! Bad input (issue 2, part 7), one test per case: each gets an error status (or, for framing
//! errors, the connection is closed), and a second, well-behaved client on the same donor keeps
//! working with its data intact.
mod common;

use std::io::Write;
use std::net::Shutdown;

use common::*;
use farmem_donor::DonorConfig;
use farmem_proto::{
    encode_read_pages, encode_write_pages, Header, Opcode, PageAddr, Status, HEADER_LEN,
    MAX_BATCH_PAGES, MAX_PAYLOAD_LEN, PAGE_SIZE, PROTOCOL_VERSION,
};

/// A frame header with every field chosen by the test.
fn header(opcode: u8, version: u8, request_id: u64, payload_len: u32) -> Vec<u8> {
    let mut h = Header {
        opcode,
        request_id,
        status: 0,
        payload_len,
    }
    .encode()
    .to_vec();
    h[2] = version;
    h
}

fn donor_and_witness() -> (farmem_donor::RunningDonor, Witness) {
    let donor = start(config());
    let w = Witness::new(donor.local_addr(), 1000, b"");
    (donor, w)
}

#[test]
fn frame_too_long_is_answered_then_closed() {
    let (donor, mut w) = donor_and_witness();
    let mut bad = Raw::hello(donor.local_addr(), 7, b"");
    bad.send(&header(
        Opcode::WritePages as u8,
        PROTOCOL_VERSION,
        77,
        MAX_PAYLOAD_LEN + 1,
    ));
    let (h, reply) = bad.recv().expect("donor answers before closing");
    assert_eq!(h.request_id, 77);
    assert_eq!(reply.status(), Status::Malformed, "{reply:?}");
    assert!(bad.closed_by_donor());
    w.check();
}

#[test]
fn truncated_frame_closes_only_that_connection() {
    let (donor, mut w) = donor_and_witness();
    let mut bad = Raw::hello(donor.local_addr(), 7, b"");
    let slab = bad.alloc_ok();
    let mut f = Vec::new();
    let p = page(5);
    encode_write_pages(&mut f, 9, &[(PageAddr { slab, page: 0 }, &p)]).unwrap();
    // Half the page data, then the client closes its sending side.
    bad.send(&f[..f.len() - PAGE_SIZE / 2]);
    bad.stream.shutdown(Shutdown::Write).unwrap();
    assert!(bad.closed_by_donor());

    // A header cut short.
    let mut bad2 = Raw::hello(donor.local_addr(), 8, b"");
    bad2.send(&header(Opcode::Stats as u8, PROTOCOL_VERSION, 1, 0)[..HEADER_LEN - 3]);
    bad2.stream.shutdown(Shutdown::Write).unwrap();
    assert!(bad2.closed_by_donor());
    w.check();
}

#[test]
fn unknown_request_type_gets_an_error_and_the_connection_stays_usable() {
    let (donor, mut w) = donor_and_witness();
    let mut bad = Raw::hello(donor.local_addr(), 7, b"");
    let mut f = header(0x42, PROTOCOL_VERSION, 5, 3);
    f.extend_from_slice(b"xyz");
    let reply = bad.call(&f);
    assert_eq!(reply.status(), Status::UnknownRequest, "{reply:?}");
    // A frame posing as a response is not a request either.
    let reply = bad.call(&header(
        Opcode::Stats as u8 | farmem_proto::RESPONSE_BIT,
        PROTOCOL_VERSION,
        6,
        0,
    ));
    assert_eq!(reply.status(), Status::UnknownRequest, "{reply:?}");
    assert!(bad.stats().requests_total > 0, "connection still usable");
    w.check();
}

#[test]
fn wrong_protocol_version_is_refused_and_closed() {
    let (donor, mut w) = donor_and_witness();
    // Wrong framing version in the header.
    let mut bad = Raw::connect(donor.local_addr());
    bad.send(&header(Opcode::Stats as u8, PROTOCOL_VERSION + 1, 3, 0));
    let (h, reply) = bad.recv().expect("donor answers before closing");
    assert_eq!(h.request_id, 3);
    assert_eq!(reply.status(), Status::BadVersion, "{reply:?}");
    assert!(bad.closed_by_donor());

    // Wrong protocol version inside HELLO.
    let mut bad = Raw::connect(donor.local_addr());
    let mut f = header(Opcode::Hello as u8, PROTOCOL_VERSION, 4, 2);
    f.extend_from_slice(&99u16.to_le_bytes());
    assert_eq!(bad.call(&f).status(), Status::BadVersion);
    assert!(bad.closed_by_donor());
    w.check();
}

#[test]
fn bad_token_is_refused_and_closed() {
    let donor = start(DonorConfig {
        token: Some(b"s3cret-token".to_vec()),
        ..config()
    });
    let mut w = Witness::new(donor.local_addr(), 1000, b"s3cret-token");
    for wrong in [&b"s3cret-tokeN"[..], b"", b"s3cret-token-longer"] {
        let mut bad = Raw::connect(donor.local_addr());
        assert_eq!(bad.hello_reply(1000, wrong).status(), Status::AuthFailed);
        assert!(bad.closed_by_donor());
    }
    // Not even the witness's own client id lets a stranger in, and nothing was disturbed.
    w.check();
}

#[test]
fn page_index_out_of_range_is_refused() {
    let (donor, mut w) = donor_and_witness();
    let mut bad = Raw::hello(donor.local_addr(), 7, b"");
    let slab = bad.alloc_ok();
    let pages = (SLAB_BYTES / PAGE_SIZE as u64) as u32;
    for page in [pages, pages + 1, u32::MAX] {
        let a = PageAddr { slab, page };
        assert_eq!(bad.read(&[a]).status(), Status::PageOutOfRange);
        let p = page_bytes();
        assert_eq!(bad.write(&[(a, &p)]).status(), Status::PageOutOfRange);
    }
    // A batch with one bad page is refused whole: its good page is not written.
    let good = PageAddr { slab, page: 1 };
    let p = page(42);
    let reply = bad.write(&[(good, &p), (PageAddr { slab, page: pages }, &p)]);
    assert_eq!(reply.status(), Status::PageOutOfRange);
    assert_eq!(bad.read(&[good]), Reply::Pages(vec![0; PAGE_SIZE]));
    w.check();
}

fn page_bytes() -> Vec<u8> {
    page(17)
}

#[test]
fn another_clients_slab_is_never_reachable() {
    let (donor, mut w) = donor_and_witness();
    let mut bad = Raw::hello(donor.local_addr(), 7, b"");
    let theirs = PageAddr {
        slab: w.slab,
        page: 0,
    };
    assert_eq!(bad.read(&[theirs]).status(), Status::NoSuchSlab);
    let p = page(66);
    assert_eq!(bad.write(&[(theirs, &p)]).status(), Status::NoSuchSlab);
    assert_eq!(bad.free(w.slab).status(), Status::NoSuchSlab);
    // Mixed with a slab of its own, still refused whole.
    let own = bad.alloc_ok();
    let reply = bad.read(&[PageAddr { slab: own, page: 0 }, theirs]);
    assert_eq!(reply.status(), Status::NoSuchSlab);
    // Slab ids that were never handed out.
    assert_eq!(
        bad.read(&[PageAddr { slab: 0, page: 0 }]).status(),
        Status::NoSuchSlab
    );
    w.check();
}

#[test]
fn batch_over_the_limit_is_refused_and_the_connection_stays_usable() {
    let (donor, mut w) = donor_and_witness();
    let mut bad = Raw::hello(donor.local_addr(), 7, b"");
    let slab = bad.alloc_ok();
    // READ_PAGES claiming MAX_BATCH_PAGES + 1 addresses (all present).
    let n = MAX_BATCH_PAGES + 1;
    let mut f = header(
        Opcode::ReadPages as u8,
        PROTOCOL_VERSION,
        11,
        (2 + n * 8) as u32,
    );
    f.extend_from_slice(&(n as u16).to_le_bytes());
    for i in 0..n {
        f.extend_from_slice(&slab.to_le_bytes());
        f.extend_from_slice(&((i % 64) as u32).to_le_bytes());
    }
    assert_eq!(bad.call(&f).status(), Status::BatchTooLarge);
    // WRITE_PAGES claiming 300 pages (its data would not fit in a frame) and an empty one.
    for count in [300u16, 0] {
        let mut f = header(Opcode::WritePages as u8, PROTOCOL_VERSION, 12, 2 + 8);
        f.extend_from_slice(&count.to_le_bytes());
        f.extend_from_slice(&[0u8; 8]);
        assert_eq!(bad.call(&f).status(), Status::BatchTooLarge);
    }
    // A write whose length disagrees with its count.
    let mut f = Vec::new();
    let p = page(1);
    encode_write_pages(&mut f, 13, &[(PageAddr { slab, page: 0 }, &p)]).unwrap();
    let len = (f.len() - HEADER_LEN + 100) as u32;
    f[16..20].copy_from_slice(&len.to_le_bytes());
    f.extend_from_slice(&[0u8; 100]);
    assert_eq!(bad.call(&f).status(), Status::Malformed);
    // The connection is still in step: a full-size batch works.
    let addrs: Vec<PageAddr> = (0..MAX_BATCH_PAGES as u32)
        .map(|i| PageAddr { slab, page: i % 64 })
        .collect();
    let mut f = Vec::new();
    encode_read_pages(&mut f, 14, &addrs).unwrap();
    assert!(matches!(bad.call(&f), Reply::Pages(d) if d.len() == MAX_BATCH_PAGES * PAGE_SIZE));
    w.check();
}

#[test]
fn garbage_that_is_not_farmem_is_closed_without_an_answer() {
    let (donor, mut w) = donor_and_witness();
    let mut bad = Raw::connect(donor.local_addr());
    bad.stream
        .write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    assert!(bad.closed_by_donor());
    w.check();
}

#[test]
fn a_long_payload_on_a_short_request_is_refused_without_closing() {
    let (donor, mut w) = donor_and_witness();
    let mut bad = Raw::hello(donor.local_addr(), 7, b"");
    let len = MAX_PAYLOAD_LEN; // legal for framing, absurd for STATS
    let mut f = header(Opcode::Stats as u8, PROTOCOL_VERSION, 21, len);
    f.resize(HEADER_LEN + len as usize, 0xEE);
    assert_eq!(bad.call(&f).status(), Status::Malformed);
    let mut f = header(0x33, PROTOCOL_VERSION, 22, len);
    f.resize(HEADER_LEN + len as usize, 0xEE);
    assert_eq!(bad.call(&f).status(), Status::UnknownRequest);
    assert!(bad.stats().errors_total >= 2, "connection still in step");
    w.check();
}

/// A donor whose connections must say HELLO within three seconds (short for a test, long enough
/// for a loaded machine to answer a request or two before it).
fn donor_with_a_short_hello_timeout() -> (farmem_donor::RunningDonor, Witness) {
    let donor = start(DonorConfig {
        hello_timeout: std::time::Duration::from_secs(3),
        ..config()
    });
    let w = Witness::new(donor.local_addr(), 1000, b"");
    (donor, w)
}

/// Far above the 3 s HELLO timeout: a connection still open after this was never closed.
const HELLO_GIVE_UP: std::time::Duration = std::time::Duration::from_secs(30);

#[test]
fn a_connection_that_keeps_sending_but_never_says_hello_is_closed_at_the_hello_timeout() {
    let (_donor, mut w) = donor_with_a_short_hello_timeout();
    let mut raw = Raw::connect(w.raw.stream.peer_addr().unwrap());
    let start = std::time::Instant::now();
    let mut refused = 0;
    let closed = loop {
        assert!(
            start.elapsed() < HELLO_GIVE_UP,
            "an unauthenticated connection sending a request every 100 ms was still open after \
             {HELLO_GIVE_UP:?} ({refused} requests refused); the HELLO timeout is 3 s"
        );
        let mut f = Vec::new();
        farmem_proto::encode_stats(&mut f, 7);
        if raw.stream.write_all(&f).is_err() {
            break true;
        }
        match raw.recv() {
            None => break true,
            Some((_, reply)) => assert_eq!(reply.status(), Status::NotAuthenticated),
        }
        refused += 1;
        std::thread::sleep(std::time::Duration::from_millis(100));
    };
    assert!(closed && refused > 0, "refused {refused}");
    w.check();
}

#[test]
fn a_connection_that_dribbles_a_header_is_closed_at_the_hello_timeout() {
    let (_donor, mut w) = donor_with_a_short_hello_timeout();
    let mut raw = Raw::connect(w.raw.stream.peer_addr().unwrap());
    let mut f = Vec::new();
    farmem_proto::encode_hello(&mut f, 1);
    let start = std::time::Instant::now();
    // One byte every 400 ms: the whole HELLO would take 13 s.
    for b in &f {
        assert!(
            start.elapsed() < HELLO_GIVE_UP,
            "a connection dribbling HELLO one byte per 400 ms was still open after {HELLO_GIVE_UP:?}"
        );
        if raw.stream.write_all(std::slice::from_ref(b)).is_err() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(400));
    }
    assert!(
        raw.closed_by_donor(),
        "the donor answered a HELLO sent after its deadline"
    );
    w.check();
}

#[test]
fn after_hello_an_idle_connection_is_not_held_to_the_hello_timeout() {
    let (_donor, mut w) = donor_with_a_short_hello_timeout();
    let mut c = Raw::hello(w.raw.stream.peer_addr().unwrap(), 77, b"");
    // Idle for longer than the whole HELLO timeout: an authenticated client may pause freely.
    std::thread::sleep(std::time::Duration::from_secs(4));
    assert!(
        c.stats().clients >= 2,
        "the idle client's connection was closed"
    );
    w.check();
}

#[test]
fn a_client_that_stalls_inside_a_frame_is_closed_at_the_stall_timeout() {
    let donor = start(DonorConfig {
        stall_timeout: std::time::Duration::from_secs(1),
        ..config()
    });
    let mut w = Witness::new(donor.local_addr(), 1000, b"");
    let mut c = Raw::hello(donor.local_addr(), 78, b"");
    let slab = c.alloc_ok();
    // Idle between frames for longer than the stall timeout: allowed.
    std::thread::sleep(std::time::Duration::from_millis(2500));
    assert_eq!(
        c.stats().slabs,
        2,
        "an idle authenticated client was closed"
    );
    // A WRITE_PAGES whose page data never comes: the donor's thread must not wait forever
    // (holding the slab's memory and one of its connection slots).
    let page = page(9);
    let mut f = Vec::new();
    encode_write_pages(&mut f, 5, &[(PageAddr { slab, page: 0 }, &page)]).unwrap();
    c.send(&f[..f.len() - 100]);
    let start = std::time::Instant::now();
    assert!(
        c.closed_by_donor(),
        "the donor answered a request it never fully received"
    );
    assert!(
        start.elapsed() < std::time::Duration::from_secs(15),
        "closed only after {:?}",
        start.elapsed()
    );
    w.check();
}
