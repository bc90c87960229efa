//! Attacks by a token holder, or by anyone who can connect, against the real donor on
//! 127.0.0.1: taking over another client's id (while it is connected and during its orphan
//! grace), forged and replayed reconnect proofs, one tenant's many client ids against its quota,
//! a flood of unauthenticated connections, a full donor, and a trickling authenticated client.
mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use common::*;
use farmem_donor::{DonorConfig, Tenant, MAX_UNAUTHENTICATED};
use farmem_proto::{attach_proof, AuthMode, PageAddr, ReconnectKey, Status, KEY_LEN};

const TOKEN: &[u8] = b"shared-by-victim-and-thief";

fn thief_key() -> ReconnectKey {
    ReconnectKey([0xEE; KEY_LEN])
}

/// Every way a holder of the same token might claim client `victim`: register it, attach with
/// a made-up key, attach with a proof replayed from `replay` (a proof the victim's key made for
/// another connection's nonce). Each must fail, and the thief must see none of its slabs.
fn try_to_take(addr: std::net::SocketAddr, victim: u64, slab: u32, replay: [u8; 32]) {
    let mut t = Raw::connect(addr);
    let nonce = t.challenge().unwrap();
    let r = t.auth(&nonce, victim, TOKEN, &thief_key(), AuthMode::Register);
    assert_eq!(r.status(), Status::ClientIdTaken, "{r:?}");
    // Still on the same connection: attach with the thief's own key.
    let r = t.auth(&nonce, victim, TOKEN, &thief_key(), AuthMode::Attach);
    assert_eq!(r.status(), Status::AuthFailed, "{r:?}");
    assert!(
        t.closed_by_donor(),
        "a wrong reconnect key closes the connection"
    );

    // A replayed proof: valid for another nonce, useless for this one.
    let mut t = Raw::connect(addr);
    let nonce = t.challenge().unwrap();
    let proof = farmem_proto::token_proof(TOKEN, &nonce, victim);
    let mut f = Vec::new();
    farmem_proto::encode_auth(&mut f, 99, victim, AuthMode::Attach, &proof, &replay);
    assert_eq!(t.call(&f).status(), Status::AuthFailed);
    assert!(t.closed_by_donor());

    // Without a handshake nothing is served at all.
    let mut t = Raw::connect(addr);
    assert_eq!(
        t.read(&[PageAddr { slab, page: 0 }]).status(),
        Status::NotAuthenticated
    );
    // A client of its own cannot reach the victim's slab either.
    let mut t = Raw::hello(addr, victim + 1000, TOKEN);
    assert_eq!(
        t.read(&[PageAddr { slab, page: 0 }]).status(),
        Status::NoSuchSlab
    );
    assert_eq!(t.free(slab).status(), Status::NoSuchSlab);
}

/// An attach proof the victim's key made for some other connection's nonce.
fn proof_for_another_nonce(victim: u64) -> [u8; 32] {
    attach_proof(&key_of(victim), &[0x11; 32], victim)
}

#[test]
fn a_token_holder_cannot_take_over_a_connected_client() {
    let donor = start(DonorConfig {
        token: Some(TOKEN.to_vec()),
        ..config()
    });
    let mut victim = Witness::new(donor.local_addr(), 5, TOKEN);
    try_to_take(
        donor.local_addr(),
        5,
        victim.slab,
        proof_for_another_nonce(5),
    );
    victim.check();
    // The victim's own second connection (same key) attaches and shares the slab.
    let mut second = Raw::hello(donor.local_addr(), 5, TOKEN);
    assert!(matches!(
        second.read(&[PageAddr {
            slab: victim.slab,
            page: 0
        }]),
        Reply::Pages(_)
    ));
}

#[test]
fn a_token_holder_cannot_take_over_an_orphaned_client() {
    let donor = start(DonorConfig {
        token: Some(TOKEN.to_vec()),
        orphan_grace: Duration::from_secs(120),
        ..config()
    });
    let addr = donor.local_addr();
    let (slab, data) = {
        let mut v = Raw::hello(addr, 6, TOKEN);
        let slab = v.alloc_ok();
        let data = page(66);
        assert_eq!(v.write(&[(PageAddr { slab, page: 2 }, &data)]), Reply::Done);
        (slab, data)
    }; // the victim disconnects: its slab waits out the orphan grace
    let store = donor.store();
    let deadline = Instant::now() + Duration::from_secs(30);
    while !store.slabs().iter().any(|s| s.orphaned) {
        assert!(Instant::now() < deadline, "the slab never became orphaned");
        std::thread::sleep(Duration::from_millis(10));
    }
    try_to_take(addr, 6, slab, proof_for_another_nonce(6));
    // The victim comes back with its key and finds its bytes intact.
    let mut v = Raw::hello(addr, 6, TOKEN);
    assert_eq!(v.read(&[PageAddr { slab, page: 2 }]), Reply::Pages(data));
}

#[test]
fn one_tenant_with_many_client_ids_cannot_exceed_its_quota() {
    let tenant = |name: &str, token: &[u8]| Tenant {
        name: name.into(),
        token: token.to_vec(),
        quota_bytes: Some(3 * SLAB_BYTES),
        max_connections: None,
    };
    let donor = start(DonorConfig {
        capacity_bytes: 16 * SLAB_BYTES,
        tenants: vec![
            tenant("greedy", b"greedy-token"),
            tenant("other", b"other-token"),
        ],
        ..config()
    });
    let addr = donor.local_addr();
    let mut held = Vec::new();
    let mut granted = 0;
    for id in 100..133u64 {
        let mut c = Raw::hello(addr, id, b"greedy-token");
        match c.alloc() {
            Reply::Slab(_) => granted += 1,
            other => assert_eq!(other.status(), Status::QuotaExceeded, "{other:?}"),
        }
        held.push(c);
    }
    assert_eq!(
        granted, 3,
        "33 client ids of one tenant got {granted} slabs"
    );
    let mut o = Raw::hello(addr, 500, b"other-token");
    for _ in 0..3 {
        o.alloc_ok();
    }
    assert_eq!(o.alloc().status(), Status::QuotaExceeded);
    // One tenant's token does not open another tenant's client.
    let mut x = Raw::connect(addr);
    let nonce = x.challenge().unwrap();
    let r = x.auth(&nonce, 500, b"greedy-token", &key_of(500), AuthMode::Attach);
    assert_eq!(r.status(), Status::AuthFailed, "{r:?}");
}

#[test]
fn a_flood_of_unauthenticated_connections_does_not_lock_clients_out() {
    let donor = start(DonorConfig {
        token: Some(TOKEN.to_vec()),
        metrics_listen: Some("127.0.0.1:0".into()),
        ..config()
    });
    let addr = donor.local_addr();
    let mut worker = Witness::new(addr, 1, TOKEN);
    let start_flood = Instant::now();
    let mut flood = Vec::new();
    for _ in 0..2000 {
        match TcpStream::connect(addr) {
            Ok(s) => flood.push(s),
            // The backlog may refuse a few under load; the flood stays as large as it can.
            Err(e) => assert!(start_flood.elapsed() < Duration::from_secs(60), "{e}"),
        }
    }
    // With the flood open (idle, never a HELLO), the working client works and new clients
    // connect, repeatedly.
    for id in 2..12u64 {
        worker.check();
        let mut c = Raw::hello(addr, id, TOKEN);
        c.alloc_ok();
    }
    // Most of the flood was evicted to make room; what remains is bounded.
    let open_flood = flood
        .iter()
        .filter(|s| {
            s.set_nonblocking(true).unwrap();
            let mut b = [0u8; 1];
            let mut r: &TcpStream = s;
            matches!(r.read(&mut b), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock)
        })
        .count();
    assert!(
        open_flood <= MAX_UNAUTHENTICATED,
        "{open_flood} idle unauthenticated connections still open"
    );
    assert!(start_flood.elapsed() < Duration::from_secs(120));
    // The evictions are counted.
    let mut m = TcpStream::connect(donor.metrics_addr().unwrap()).unwrap();
    m.write_all(b"GET /metrics HTTP/1.0\r\n\r\n").unwrap();
    let mut text = String::new();
    m.read_to_string(&mut text).unwrap();
    let evicted: f64 = text
        .lines()
        .find_map(|l| l.strip_prefix("farmem_donor_connections_refused_total{reason=\"evicted\"} "))
        .expect("the refusal counter is exported")
        .parse()
        .unwrap();
    assert!(
        evicted >= (2000 - MAX_UNAUTHENTICATED) as f64 * 0.9,
        "only {evicted} evictions counted"
    );
}

#[test]
fn a_full_donor_says_so() {
    let donor = start(DonorConfig {
        max_connections: 2,
        ..config()
    });
    let addr = donor.local_addr();
    let _a = Raw::hello(addr, 1, b"");
    let _b = Raw::hello(addr, 2, b"");
    let mut c = Raw::connect(addr);
    let (h, reply) = c.recv().expect("the donor answers before closing");
    assert_eq!(h.request_id, 0);
    match reply {
        Reply::Error(Status::DonorFull, m) => {
            assert!(m.contains("donor full: 2 connections"), "{m}")
        }
        other => panic!("expected donor full, got {other:?}"),
    }
    assert!(c.closed_by_donor());
}

/// Writes `bytes` to `t` in `chunk`-byte pieces, one every `pause`, until the donor closes the
/// connection or everything went; returns how long that took.
fn trickle(t: &mut Raw, bytes: &[u8], chunk: usize, pause: Duration) -> Duration {
    let start = Instant::now();
    for piece in bytes.chunks(chunk) {
        if t.stream.write_all(piece).is_err() {
            break;
        }
        std::thread::sleep(pause);
        let mut probe = [0u8; 1];
        t.stream.set_nonblocking(true).unwrap();
        let closed = matches!(t.stream.read(&mut probe), Ok(0));
        t.stream.set_nonblocking(false).unwrap();
        if closed {
            break;
        }
    }
    start.elapsed()
}

/// A donor whose stall timeout is 1.5 s, a witness client, and an authenticated client.
fn stall_setup() -> (farmem_donor::RunningDonor, Witness, Raw) {
    let donor = start(DonorConfig {
        stall_timeout: Duration::from_millis(1500),
        ..config()
    });
    let w = Witness::new(donor.local_addr(), 1, b"");
    let t = Raw::hello(donor.local_addr(), 2, b"");
    (donor, w, t)
}

#[test]
fn an_authenticated_client_trickling_a_request_is_cut_at_the_stall_timeout() {
    let (_donor, mut w, mut t) = stall_setup();
    let mut f = Vec::new();
    farmem_proto::encode_stats(&mut f, 5);
    // One byte every 500 ms: each read sees progress well within the stall timeout, but the
    // whole 20-byte request would take 10 s.
    let took = trickle(&mut t, &f, 1, Duration::from_millis(500));
    assert!(t.closed_by_donor());
    assert!(
        took < Duration::from_secs(6),
        "the trickling request was cut only after {took:?}"
    );
    w.check();
}

#[test]
fn an_authenticated_client_trickling_page_data_is_cut_at_the_stall_timeout() {
    let (_donor, mut w, mut t) = stall_setup();
    let slab = t.alloc_ok();
    let page = vec![7u8; farmem_proto::PAGE_SIZE];
    let mut f = Vec::new();
    farmem_proto::encode_write_pages(&mut f, 9, &[(PageAddr { slab, page: 0 }, &page[..])])
        .unwrap();
    // The header and address arrive at once; then the page data, 64 bytes every 200 ms: each
    // read sees progress well within the stall timeout, but the whole page would take 13 s.
    let data_at = f.len() - farmem_proto::PAGE_SIZE;
    t.stream.write_all(&f[..data_at]).unwrap();
    let took = trickle(&mut t, &f[data_at..], 64, Duration::from_millis(200));
    assert!(t.closed_by_donor());
    assert!(
        took < Duration::from_secs(6),
        "the trickled page data was cut only after {took:?}"
    );
    w.check();
}

#[test]
fn a_donor_under_memory_pressure_lends_no_new_slabs() {
    // A watermark no host reaches: the donor is under pressure from the start.
    let donor = start(DonorConfig {
        memory_watermark_bytes: Some(u64::MAX),
        ..config()
    });
    let mut c = Raw::hello(donor.local_addr(), 1, b"");
    match c.alloc() {
        Reply::Error(Status::MemoryPressure, m) => {
            assert!(
                m.contains("memory pressure") && m.contains("watermark"),
                "{m}"
            )
        }
        other => panic!("expected a memory-pressure refusal, got {other:?}"),
    }
    // The client keeps its connection: STATS is still answered (`stats` panics otherwise).
    c.stats();
}
