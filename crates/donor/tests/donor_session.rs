//! The socket-free session entry point (`SessionDonor::serve`): the same bytes get the same
//! answers over an in-memory stream as over TCP, and a session's slabs follow the orphan grace.
mod common;

use std::io::{Cursor, Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use common::*;
use farmem_donor::{DonorConfig, SessionDonor};
use farmem_proto::{
    encode_alloc_slab, encode_auth, encode_free_slab, encode_hello, encode_read_pages,
    encode_stats, encode_write_pages, read_frame, AuthMode, PageAddr, ReadFrameError, Response,
    Status, PAGE_SIZE,
};

/// A client's whole side of a session, written up front (the donor has no token, so AUTH needs
/// no answer to the challenge), and the donor's answers.
struct Duplex {
    input: Cursor<Vec<u8>>,
    output: Vec<u8>,
}

impl Read for Duplex {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.input.read(buf)
    }
}

impl Write for Duplex {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.output.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The answers in `bytes`, decoded; challenge nonces (random) are zeroed.
fn replies(bytes: &[u8]) -> Vec<Reply> {
    let mut r = bytes;
    let mut buf = Vec::new();
    let mut out = Vec::new();
    loop {
        let h = match read_frame(&mut r, &mut buf) {
            Ok(h) => h,
            Err(ReadFrameError::Closed) => return out,
            Err(e) => panic!("the donor's answers do not frame: {e}"),
        };
        out.push(
            match Response::decode(&h, &buf).expect("the donor's answer decodes") {
                // The session's nonce is random: compare it as zeros.
                Response::Challenge { .. } => Reply::Challenge([0; 32]),
                other => Reply::from_response(other),
            },
        );
    }
}

/// HELLO, AUTH, two slabs, a write, reads (good and bad), a double free, then a frame with a
/// bad magic, which closes the session unanswered (its request id cannot be trusted).
fn script() -> Vec<u8> {
    let mut s = Vec::new();
    encode_hello(&mut s, 1);
    encode_auth(&mut s, 2, 42, AuthMode::Register, &[0; 32], &[9; 32]);
    encode_alloc_slab(&mut s, 3);
    encode_alloc_slab(&mut s, 4);
    let a = PageAddr { slab: 1, page: 5 };
    let b = PageAddr { slab: 2, page: 63 };
    let (pa, pb) = (page(1), page(2));
    encode_write_pages(&mut s, 5, &[(a, &pa), (b, &pb)]).unwrap();
    let z = PageAddr { slab: 1, page: 6 };
    encode_read_pages(&mut s, 6, &[b, z, a]).unwrap();
    encode_read_pages(&mut s, 7, &[PageAddr { slab: 1, page: 64 }]).unwrap();
    encode_free_slab(&mut s, 8, 2);
    encode_free_slab(&mut s, 9, 2);
    let mut bad = Vec::new();
    encode_stats(&mut bad, 10);
    bad[0] ^= 0xff;
    s.extend_from_slice(&bad);
    s
}

fn expected() -> Vec<Reply> {
    let mut pages = page(2);
    pages.extend(std::iter::repeat_n(0u8, PAGE_SIZE));
    pages.extend(page(1));
    vec![
        Reply::Challenge([0; 32]),
        Reply::Hello {
            slab_size_bytes: SLAB_BYTES,
            capacity_bytes: 16 * SLAB_BYTES,
        },
        Reply::Slab(1),
        Reply::Slab(2),
        Reply::Done,
        Reply::Pages(pages),
    ]
}

fn in_memory(donor: &SessionDonor, bytes: Vec<u8>) -> Vec<Reply> {
    let mut d = Duplex {
        input: Cursor::new(bytes),
        output: Vec::new(),
    };
    donor.serve(&mut d);
    replies(&d.output)
}

#[test]
fn a_session_gets_the_same_answers_in_memory_as_over_tcp() {
    let donor = SessionDonor::new(config()).unwrap();
    let got = in_memory(&donor, script());
    assert_eq!(got[..6], expected()[..], "{got:?}");
    let statuses: Vec<Status> = got[6..].iter().map(Reply::status).collect();
    assert_eq!(
        statuses,
        [Status::PageOutOfRange, Status::Ok, Status::NoSuchSlab],
        "{got:?}"
    );

    let tcp = start(config());
    let mut s = TcpStream::connect(tcp.local_addr()).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    s.write_all(&script()).unwrap();
    s.shutdown(std::net::Shutdown::Write).unwrap();
    let mut answers = Vec::new();
    s.read_to_end(&mut answers).unwrap();
    assert_eq!(replies(&answers), got, "TCP and in-memory answers differ");
}

#[test]
fn a_departed_clients_slabs_are_kept_for_the_grace_and_freed_without_one() {
    // Within the grace (60 s by default): the slab left allocated is kept for the client.
    let donor = SessionDonor::new(config()).unwrap();
    in_memory(&donor, script());
    assert_eq!(donor.store().slab_count(), 1);
    assert_eq!(donor.store().committed_bytes(), PAGE_SIZE as u64);

    // No grace: freed as the session ends.
    let donor = SessionDonor::new(DonorConfig {
        orphan_grace: Duration::ZERO,
        ..config()
    })
    .unwrap();
    in_memory(&donor, script());
    let store = donor.store();
    assert_eq!(
        (
            store.slab_count(),
            store.used_bytes(),
            store.committed_bytes()
        ),
        (0, 0, 0)
    );
}

#[test]
fn an_empty_store_starts_its_slab_ids_again_and_keeps_the_counters() {
    let donor = SessionDonor::new(config()).unwrap();
    in_memory(&donor, script());
    let fresh = donor.with_empty_store();
    assert_eq!(fresh.store().slab_count(), 0);
    let mut s = Vec::new();
    encode_hello(&mut s, 1);
    encode_auth(&mut s, 2, 42, AuthMode::Register, &[0; 32], &[9; 32]);
    encode_alloc_slab(&mut s, 3);
    encode_stats(&mut s, 4);
    let got = in_memory(&fresh, s);
    assert_eq!(got[2], Reply::Slab(1), "{got:?}");
    let Reply::Stats(st) = &got[3] else {
        panic!("no stats: {got:?}")
    };
    // The first session's 10 frames (the bad one counts), then this one's 3 before STATS.
    assert_eq!(st.requests_total, 13);
    // No clock in a session: every service time is zero (counted as the 1 ns floor).
    assert_eq!((st.service_p50_ns, st.service_p99_ns), (1, 1));
    assert_eq!(
        donor.store().slab_count(),
        1,
        "the first store is untouched"
    );
}
