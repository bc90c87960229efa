//! The client against the real donor (`farmem_donor::DonorServer` on 127.0.0.1): pipelined
//! reads and writes from several threads, the token check, reconnecting to the same slabs,
//! error statuses and the donor's counters.

mod common;

use std::collections::VecDeque;
use std::time::Duration;

use common::page;
use farmem_donor::{DonorConfig, DonorServer, RunningDonor};
use farmem_proto::{PageAddr, Status, MAX_BATCH_PAGES, PAGE_SIZE};
use farmem_transport::{
    ClientConfig, Completion, DonorClient, PageWrite, ReconnectKey, TransportError,
};

const SLAB_PAGES: u32 = 256;

fn donor(token: Option<&[u8]>) -> RunningDonor {
    DonorServer::bind(DonorConfig {
        listen: "127.0.0.1:0".into(),
        capacity_bytes: 16 * u64::from(SLAB_PAGES) * PAGE_SIZE as u64,
        slab_size_bytes: u64::from(SLAB_PAGES) * PAGE_SIZE as u64,
        token: token.map(<[u8]>::to_vec),
        ..DonorConfig::default()
    })
    .expect("bind the donor on 127.0.0.1:0")
    .spawn()
}

/// A client `client_id` whose reconnect key is derived from its id, so that two configs with
/// one id are the same client (tests of stolen ids set another key).
fn config(client_id: u64) -> ClientConfig {
    ClientConfig {
        client_id,
        reconnect_key: ReconnectKey([client_id as u8; 32]),
        request_timeout: Duration::from_secs(10),
        ..ClientConfig::default()
    }
}

#[test]
fn pipelined_batches_from_several_threads_round_trip_through_the_donor() {
    let donor = donor(None);
    let addr = donor.local_addr().to_string();
    let client = DonorClient::connect(&addr, config(1)).unwrap();
    assert_eq!(client.info().slab_size_bytes, u64::from(SLAB_PAGES) * 4096);
    let slabs: Vec<u32> = (0..4).map(|_| client.alloc_slab().unwrap()).collect();

    let workers: Vec<_> = slabs
        .iter()
        .enumerate()
        .map(|(t, &slab)| {
            let client = client.clone();
            std::thread::spawn(move || {
                let seed = |p: u32| ((t as u64) << 32) | u64::from(p);
                let mut window = VecDeque::new();
                for batch in 0..(SLAB_PAGES / 32) {
                    let pages: Vec<Vec<u8>> = (0..32).map(|i| page(seed(batch * 32 + i))).collect();
                    let writes: Vec<_> = pages
                        .iter()
                        .enumerate()
                        .map(|(i, data)| PageWrite {
                            addr: PageAddr {
                                slab,
                                page: batch * 32 + i as u32,
                            },
                            data,
                        })
                        .collect();
                    window.push_back(client.submit_write(&writes).unwrap());
                    if window.len() == 4 {
                        window.pop_front().unwrap().wait().unwrap();
                    }
                }
                for p in window.drain(..) {
                    p.wait().unwrap();
                }
                // Read back in 64-page batches with strided addresses, 4 in flight.
                let mut reads = VecDeque::new();
                for start in 0..4u32 {
                    let addrs: Vec<_> = (0..SLAB_PAGES / 4)
                        .map(|k| PageAddr {
                            slab,
                            page: start + 4 * k,
                        })
                        .collect();
                    reads.push_back((addrs.clone(), client.submit_read(&addrs).unwrap()));
                }
                for (addrs, p) in reads {
                    let Completion::Pages(data) = p.wait().unwrap() else {
                        panic!("read without pages");
                    };
                    for (a, got) in addrs.iter().zip(data.chunks_exact(PAGE_SIZE)) {
                        assert!(
                            got == page(seed(a.page)).as_slice(),
                            "page {a:?} came back wrong"
                        );
                    }
                }
            })
        })
        .collect();
    for w in workers {
        w.join().unwrap();
    }
    let stats = client.stats().unwrap();
    assert_eq!(stats.slabs, 4);
    assert_eq!(stats.pages_written_total, 4 * u64::from(SLAB_PAGES));
    assert_eq!(stats.pages_read_total, 4 * u64::from(SLAB_PAGES));
    assert_eq!(stats.clients, 1);
    client.free_slab(slabs[0]).unwrap();
    assert_eq!(client.stats().unwrap().slabs, 3);
}

#[test]
fn the_donor_refuses_a_wrong_or_missing_token_with_a_clear_error() {
    let donor = donor(Some(b"s3cret"));
    let addr = donor.local_addr().to_string();
    for token in [None, Some(b"wrong".to_vec())] {
        let err = DonorClient::connect(&addr, ClientConfig { token, ..config(2) }).unwrap_err();
        assert_eq!(err.status(), Some(Status::AuthFailed), "{err}");
        assert!(err.to_string().contains("--token-file"), "{err}");
    }
    let client = DonorClient::connect(
        &addr,
        ClientConfig {
            token: Some(b"s3cret".to_vec()),
            ..config(2)
        },
    )
    .unwrap();
    client.alloc_slab().unwrap();
}

#[test]
fn a_new_connection_with_the_same_client_id_finds_its_slabs() {
    let donor = donor(None);
    let addr = donor.local_addr().to_string();
    let data = page(99);
    let slab = {
        let client = DonorClient::connect(&addr, config(77)).unwrap();
        let slab = client.alloc_slab().unwrap();
        let a = PageAddr { slab, page: 5 };
        client
            .write_pages(&[PageWrite {
                addr: a,
                data: &data,
            }])
            .unwrap();
        slab
    }; // dropped: the connection closes
    let again = DonorClient::connect(&addr, config(77)).unwrap();
    let mut out = vec![0u8; PAGE_SIZE];
    again
        .read_pages(&[PageAddr { slab, page: 5 }], &mut out)
        .unwrap();
    assert_eq!(out, data);

    // The same id with another key is refused: the id is a name, the key is the credential.
    let thief = ClientConfig {
        reconnect_key: ReconnectKey([0xEE; 32]),
        ..config(77)
    };
    let err = DonorClient::connect(&addr, thief).unwrap_err();
    assert_eq!(err.status(), Some(Status::AuthFailed), "{err}");
    assert!(err.to_string().contains("reconnect key"), "{err}");

    // Another client id may not read it.
    let other = DonorClient::connect(&addr, config(78)).unwrap();
    let err = other
        .read_pages(&[PageAddr { slab, page: 5 }], &mut out)
        .unwrap_err();
    assert_eq!(err.status(), Some(Status::NoSuchSlab), "{err}");
    let err = again
        .read_pages(
            &[PageAddr {
                slab,
                page: SLAB_PAGES,
            }],
            &mut out,
        )
        .unwrap_err();
    assert_eq!(err.status(), Some(Status::PageOutOfRange), "{err}");
    // Errors leave the connection usable.
    again
        .read_pages(&[PageAddr { slab, page: 5 }], &mut out)
        .unwrap();
}

#[test]
fn a_batch_over_the_limit_is_rejected_client_side() {
    let donor = donor(None);
    let client = DonorClient::connect(&donor.local_addr().to_string(), config(3)).unwrap();
    let slab = client.alloc_slab().unwrap();
    let addrs = vec![PageAddr { slab, page: 0 }; MAX_BATCH_PAGES + 1];
    let err = client.submit_read(&addrs).unwrap_err();
    assert!(matches!(err, TransportError::Invalid { .. }), "{err}");
    assert_eq!(client.counters().requests_total, 1);
    // The full limit itself is fine.
    let mut out = vec![0u8; MAX_BATCH_PAGES * PAGE_SIZE];
    client
        .read_pages(&addrs[..MAX_BATCH_PAGES], &mut out)
        .unwrap();
}

#[test]
fn a_stopped_donor_gives_disconnected_and_a_restarted_one_says_it_forgot_the_client() {
    let donor = donor(None);
    let addr = donor.local_addr();
    let client = DonorClient::connect(&addr.to_string(), config(4)).unwrap();
    client.alloc_slab().unwrap();
    donor.stop().unwrap();
    let err = client.stats().unwrap_err();
    assert!(err.is_connection_failure(), "{err}");
    // A new donor on the same port: the next call reaches it, which no longer knows this
    // client; the client does not register again behind its user's back (its slab ids would
    // be handed out afresh), every call says so.
    let again = DonorServer::bind(DonorConfig {
        listen: addr.to_string(),
        ..DonorConfig::default()
    })
    .expect("rebind the same port")
    .spawn();
    for _ in 0..2 {
        let err = client.stats().unwrap_err();
        assert!(err.is_forgotten(), "{err}");
        assert!(
            err.to_string().contains("no longer knows this client"),
            "{err}"
        );
    }
    // A new client (a new id) is welcome.
    let fresh = DonorClient::connect(&addr.to_string(), config(5)).unwrap();
    assert_eq!(fresh.stats().unwrap().slabs, 0);
    drop(again);
}

#[test]
fn a_client_attached_later_reaches_its_slabs_once_the_donor_knows_it_and_never_registers() {
    let donor = donor(None);
    let addr = donor.local_addr().to_string();
    // An address of TEST-NET-1 (RFC 5737), where nothing listens: made without connecting.
    let nowhere = DonorClient::attach_later("192.0.2.1:9", config(6)).unwrap();
    assert_eq!(nowhere.info().slab_size_bytes, 0);
    // An id the donor does not know: refused as forgotten, and not registered by the try.
    let unknown = DonorClient::attach_later(&addr, config(7)).unwrap();
    let err = unknown.stats().unwrap_err();
    assert!(err.is_forgotten(), "{err}");
    assert!(unknown.stats().unwrap_err().is_forgotten());
    // Once another connection registered the id with the same key: it attaches and reads
    // that client's pages.
    let owner = DonorClient::connect(&addr, config(7)).unwrap();
    let slab = owner.alloc_slab().unwrap();
    let data = page(77);
    owner
        .write_pages(&[PageWrite {
            addr: PageAddr { slab, page: 3 },
            data: &data,
        }])
        .unwrap();
    let mut got = vec![0u8; PAGE_SIZE];
    unknown
        .read_pages(&[PageAddr { slab, page: 3 }], &mut got)
        .unwrap();
    assert_eq!(got, data);
    assert_eq!(
        unknown.info().slab_size_bytes,
        u64::from(SLAB_PAGES) * PAGE_SIZE as u64
    );
}

#[test]
fn a_client_registered_later_is_a_new_client_at_its_first_request() {
    let donor = donor(None);
    let addr = donor.local_addr().to_string();
    let c = DonorClient::register_later(&addr, config(8)).unwrap();
    assert_eq!(c.info().slab_size_bytes, 0, "nothing asked yet");
    let slab = c.alloc_slab().unwrap();
    assert_eq!(
        c.info().slab_size_bytes,
        u64::from(SLAB_PAGES) * PAGE_SIZE as u64
    );
    // A second connection of the same client made the same way attaches to it.
    let other = DonorClient::register_later(&addr, config(8)).unwrap();
    let data = page(88);
    other
        .write_pages(&[PageWrite {
            addr: PageAddr { slab, page: 1 },
            data: &data,
        }])
        .unwrap();
    let mut got = vec![0u8; PAGE_SIZE];
    c.read_pages(&[PageAddr { slab, page: 1 }], &mut got)
        .unwrap();
    assert_eq!(got, data);
}

#[test]
fn reclaims_names_the_slabs_the_donor_wants_back_until_they_are_freed() {
    let d = DonorServer::bind(DonorConfig {
        listen: "127.0.0.1:0".into(),
        capacity_bytes: 16 * u64::from(SLAB_PAGES) * PAGE_SIZE as u64,
        slab_size_bytes: u64::from(SLAB_PAGES) * PAGE_SIZE as u64,
        memory_watermark_bytes: Some(0),
        ..DonorConfig::default()
    })
    .expect("bind the donor on 127.0.0.1:0")
    .spawn();
    let client = DonorClient::connect(&d.local_addr().to_string(), config(61)).unwrap();
    let slabs: Vec<u32> = (0..3).map(|_| client.alloc_slab().unwrap()).collect();
    for (i, &slab) in slabs.iter().enumerate() {
        let p = page(i as u64);
        client
            .write_pages(&[PageWrite {
                addr: PageAddr { slab, page: 0 },
                data: &p,
            }])
            .unwrap();
        std::thread::sleep(Duration::from_millis(2));
    }
    assert_eq!(client.reclaims().unwrap(), Vec::<u32>::new());
    let slab_bytes = u64::from(SLAB_PAGES) * PAGE_SIZE as u64;
    d.control().set_capacity_bytes(2 * slab_bytes).unwrap();
    assert_eq!(client.reclaims().unwrap(), vec![slabs[0]]);
    client.free_slab(slabs[0]).unwrap();
    assert_eq!(client.reclaims().unwrap(), Vec::<u32>::new());
    // The give-back is counted when the donor re-plans after the free, which may come just
    // after the free's answer (CI once read 0): read until it shows.
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    let st = loop {
        let st = client.stats().unwrap();
        if st.slabs_given_back_total == 1 || std::time::Instant::now() > deadline {
            break st;
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    assert_eq!(
        (st.used_bytes, st.slabs_given_back_total),
        (2 * slab_bytes, 1)
    );
}
