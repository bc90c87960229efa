//! What the client puts on the wire and what it tells its caller: the token never crosses the
//! wire (a fake donor records every handshake byte), a reconnect attaches with a proof rather
//! than the key, and a full donor is reported as full.
mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use farmem_donor::{DonorConfig, DonorServer};
use farmem_proto::{attach_proof, AuthMode, Status, PAGE_SIZE};
use farmem_transport::{ClientConfig, DonorClient, ReconnectKey, TransportError};

const TOKEN: &[u8] = b"a-token-that-must-never-be-seen-on-the-wire";

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

#[test]
fn the_token_and_the_key_never_cross_the_wire_after_registration() {
    let hellos: Arc<Mutex<Vec<Hello>>> = Arc::default();
    let h = Arc::clone(&hellos);
    let peer = spawn_peer(move |mut stream, index| {
        if let Some(hello) = handshake(&mut stream, |h| h.proves(TOKEN)) {
            h.lock().unwrap().push(hello);
            if index == 0 {
                return; // drop the first connection: the client reconnects
            }
            stall(&mut stream);
        }
    });
    let key = ReconnectKey([0x42; 32]);
    let cfg = ClientConfig {
        client_id: 7,
        reconnect_key: key.clone(),
        token: Some(TOKEN.to_vec()),
        request_timeout: Duration::from_secs(2),
        ..ClientConfig::default()
    };
    let client = DonorClient::connect(&peer.addr, cfg).unwrap();
    // The first connection is gone: this request fails, the next one reconnects.
    let _ = client.alloc_slab();
    let _ = client.alloc_slab();
    let hellos = hellos.lock().unwrap();
    assert!(hellos.len() >= 2, "the client did not reconnect");
    for h in hellos.iter() {
        assert!(
            !contains(&h.wire, TOKEN),
            "the token crossed the wire in the handshake"
        );
        assert!(h.proves(TOKEN));
    }
    assert_eq!(hellos[0].mode, AuthMode::Register);
    assert_eq!(hellos[0].key_or_proof, key.0);
    // The reconnect proves the key for its nonce and does not send it.
    assert_eq!(hellos[1].mode, AuthMode::Attach);
    assert!(!contains(&hellos[1].wire, &key.0));
    assert_eq!(hellos[1].key_or_proof, attach_proof(&key, &FAKE_NONCE, 7));
}

#[test]
fn a_full_donor_is_reported_as_full() {
    let donor = DonorServer::bind(DonorConfig {
        listen: "127.0.0.1:0".into(),
        capacity_bytes: 16 * 16 * PAGE_SIZE as u64,
        slab_size_bytes: 16 * PAGE_SIZE as u64,
        max_connections: 1,
        ..DonorConfig::default()
    })
    .unwrap()
    .spawn();
    let addr = donor.local_addr().to_string();
    let _first = DonorClient::connect(&addr, ClientConfig::default()).unwrap();
    let err = DonorClient::connect(&addr, ClientConfig::default()).unwrap_err();
    assert!(
        matches!(
            err,
            TransportError::Refused {
                status: Status::DonorFull,
                ..
            }
        ),
        "{err}"
    );
    let msg = err.to_string();
    assert!(
        msg.contains("refused the connection") && msg.contains("donor full: 1 connections"),
        "{msg}"
    );
}
