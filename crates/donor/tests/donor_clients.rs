//! IDENT and CLIENTS against a real donor: a client's label and address are shown to its own
//! tenant only; bad labels (empty, too long, control characters, not UTF-8) and either request
//! before AUTH are refused with a clear status while the connection keeps serving.
mod common;

use common::*;
use farmem_donor::{DonorConfig, Tenant};
use farmem_proto::{Status, MAX_LABEL_LEN};

fn tenant(name: &str, token: &[u8], quota: Option<u64>) -> Tenant {
    Tenant {
        name: name.into(),
        token: token.to_vec(),
        quota_bytes: quota,
        max_connections: None,
    }
}

#[test]
fn each_tenant_sees_its_own_clients_with_address_and_label() {
    let donor = start(DonorConfig {
        tenants: vec![
            tenant("alice", b"alice-token", Some(4 * SLAB_BYTES)),
            tenant("bob", b"bob-token", None),
        ],
        ..config()
    });
    let addr = donor.local_addr();
    let mut a1 = Raw::hello(addr, 11, b"alice-token");
    assert_eq!(a1.ident(b"trainer pid 5 on host-a"), Reply::Done);
    a1.alloc_ok();
    a1.alloc_ok();
    let mut a2 = Raw::hello(addr, 12, b"alice-token");
    let mut b1 = Raw::hello(addr, 21, b"bob-token");
    assert_eq!(b1.ident(b"secret pid 9 on host-b"), Reply::Done);
    b1.alloc_ok();
    // The last word counts.
    assert_eq!(b1.ident(b"renamed pid 9 on host-b"), Reply::Done);

    let Reply::Clients(c) = a2.clients() else {
        panic!("CLIENTS failed");
    };
    assert_eq!(c.tenant, "alice");
    assert_eq!(c.tenant_used_bytes, 2 * SLAB_BYTES);
    assert_eq!(c.tenant_quota_bytes, Some(4 * SLAB_BYTES));
    let ids: Vec<u64> = c.clients.iter().map(|e| e.client_id).collect();
    assert_eq!(ids, vec![11, 12], "alice's clients only: {c:?}");
    let t = &c.clients[0];
    assert_eq!(t.label, "trainer pid 5 on host-a");
    assert_eq!(t.address.to_string(), "127.0.0.1");
    assert_eq!(
        (t.slabs, t.used_bytes, t.connections),
        (2, 2 * SLAB_BYTES, 1)
    );
    assert!(!t.orphaned);
    assert_eq!(c.clients[1].label, "", "a client that did not say");

    let Reply::Clients(c) = b1.clients() else {
        panic!("CLIENTS failed");
    };
    assert_eq!(c.tenant, "bob");
    assert_eq!(c.tenant_quota_bytes, None);
    assert_eq!(c.clients.len(), 1, "{c:?}");
    assert_eq!(c.clients[0].label, "renamed pid 9 on host-b");

    // Gone but within the orphan grace: listed as orphaned with its slabs.
    drop(a1);
    let until = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let Reply::Clients(c) = a2.clients() else {
            panic!("CLIENTS failed");
        };
        let t = c.clients.iter().find(|e| e.client_id == 11).unwrap();
        if t.orphaned {
            assert_eq!((t.connections, t.slabs), (0, 2));
            break;
        }
        assert!(std::time::Instant::now() < until, "{c:?}");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

#[test]
fn bad_labels_and_early_requests_are_refused_and_the_connection_serves_on() {
    let donor = start(DonorConfig {
        token: Some(b"tok".to_vec()),
        ..config()
    });
    let addr = donor.local_addr();

    // Before AUTH: refused, the handshake still possible.
    let mut early = Raw::connect(addr);
    assert_eq!(early.ident(b"x").status(), Status::NotAuthenticated);
    assert_eq!(early.clients().status(), Status::NotAuthenticated);
    assert!(matches!(early.hello_reply(1, b"tok"), Reply::Hello { .. }));

    let mut c = Raw::hello(addr, 2, b"tok");
    let long = [b'a'; MAX_LABEL_LEN + 1];
    for bad in [
        &b""[..],
        &long[..],
        b"evil\x1b[2Jlabel",
        b"line\nbreak",
        &[0xff, 0xfe, 0x41][..],
    ] {
        let r = c.ident(bad);
        assert_eq!(r.status(), Status::Malformed, "{bad:?}: {r:?}");
        let Reply::Error(_, msg) = r else {
            unreachable!()
        };
        assert!(msg.contains("client label"), "{msg}");
    }
    // Still served, and nothing of the bad labels kept.
    let slab = c.alloc_ok();
    assert_eq!(c.ident(&[b'b'; MAX_LABEL_LEN]), Reply::Done);
    let Reply::Clients(list) = c.clients() else {
        panic!("CLIENTS failed");
    };
    assert_eq!(list.tenant, "default");
    let ids: Vec<u64> = list.clients.iter().map(|e| e.client_id).collect();
    assert_eq!(ids, vec![1, 2], "{list:?}");
    assert_eq!(list.clients[1].label, "b".repeat(MAX_LABEL_LEN));
    assert_eq!(list.clients[1].slabs, 1);
    assert_eq!(c.free(slab), Reply::Done);
}
