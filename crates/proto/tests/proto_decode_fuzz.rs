//! Bounded property tests over random and mutated bytes: decoding never panics, never accepts a
//! frame that breaks a protocol limit, and every valid frame survives a round trip.

use farmem_proto::{
    encode_auth, encode_give_back, encode_hello, encode_read_pages, encode_reclaims,
    encode_write_pages, read_frame, AuthMode, Header, PageAddr, Request, Response, HEADER_LEN,
    MAX_BATCH_PAGES, MAX_RECLAIM_SLABS, PAGE_SIZE, PROOF_LEN,
};
use proptest::prelude::*;

/// Decodes `bytes` every way a peer could: as a request and as a response, through the
/// streaming reader and through the raw header decoder.
fn decode_everything(bytes: &[u8]) {
    let _ = Header::salvage(bytes);
    if let Ok(h) = Header::decode(bytes) {
        let payload = bytes.get(HEADER_LEN..).unwrap_or(&[]);
        let payload = payload.get(..h.payload_len as usize).unwrap_or(payload);
        if let Ok(Request::WritePages(b)) = Request::decode(&h, payload) {
            assert!((1..=MAX_BATCH_PAGES).contains(&b.len()));
            for (_, page) in b.iter() {
                assert_eq!(page.len(), PAGE_SIZE);
            }
        }
        if let Ok(Request::ReadPages(l)) = Request::decode(&h, payload) {
            assert!((1..=MAX_BATCH_PAGES).contains(&l.len()));
        }
        if let Ok(Response::Pages { count, data }) = Response::decode(&h, payload) {
            assert_eq!(data.len(), count * PAGE_SIZE);
        }
        if let Ok(Response::GiveBack(list)) = Response::decode(&h, payload) {
            assert!(list.len() <= MAX_RECLAIM_SLABS);
            assert_eq!(list.iter().count(), list.len());
        }
        if let Ok(Request::Ident { label }) = Request::decode(&h, payload) {
            assert!(farmem_proto::check_label(label.as_bytes()).is_ok());
        }
        // A CLIENTS answer that decodes is whole: its owned form never panics.
        if let Ok(Response::Clients(raw)) = Response::decode(&h, payload) {
            assert!(raw.decode().clients.len() <= farmem_proto::MAX_CLIENTS_LISTED);
        }
    }
    let mut r = bytes;
    let mut buf = Vec::new();
    while read_frame(&mut r, &mut buf).is_ok() {}
}

fn valid_frames() -> Vec<Vec<u8>> {
    let a = PageAddr { slab: 1, page: 2 };
    let page = [7u8; PAGE_SIZE];
    let mut frames = Vec::new();
    let mut f = Vec::new();
    encode_hello(&mut f, 1);
    frames.push(std::mem::take(&mut f));
    encode_auth(
        &mut f,
        4,
        99,
        AuthMode::Attach,
        &[1; PROOF_LEN],
        &[2; PROOF_LEN],
    );
    frames.push(std::mem::take(&mut f));
    encode_read_pages(&mut f, 2, &[a, a, a]).unwrap();
    frames.push(std::mem::take(&mut f));
    encode_write_pages(&mut f, 3, &[(a, &page)]).unwrap();
    frames.push(std::mem::take(&mut f));
    encode_reclaims(&mut f, 5);
    frames.push(std::mem::take(&mut f));
    encode_give_back(&mut f, 5, &[1, 2, 3]).unwrap();
    frames.push(std::mem::take(&mut f));
    farmem_proto::encode_ident(&mut f, 6, "python3 pid 1 on h").unwrap();
    frames.push(std::mem::take(&mut f));
    farmem_proto::encode_clients(&mut f, 7);
    frames.push(std::mem::take(&mut f));
    let reply = farmem_proto::ClientsReply {
        tenant: "t".into(),
        tenant_used_bytes: 1,
        tenant_quota_bytes: None,
        clients: vec![farmem_proto::ClientEntry {
            client_id: 1,
            connections: 1,
            slabs: 1,
            used_bytes: 4096,
            orphaned: false,
            address: "10.0.0.1".parse().unwrap(),
            label: "a".into(),
        }],
    };
    farmem_proto::encode_clients_reply(&mut f, 7, &reply);
    frames.push(f);
    frames
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    #[test]
    fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..600)) {
        decode_everything(&bytes);
    }

    #[test]
    fn random_bytes_behind_a_valid_header_prefix_never_panic(
        op in 0u8..=255, len in 0u32..5000, tail in proptest::collection::vec(any::<u8>(), 0..5000)
    ) {
        let mut bytes = Header { opcode: op, request_id: 1, status: 0, payload_len: len }.encode().to_vec();
        bytes.extend_from_slice(&tail);
        decode_everything(&bytes);
    }

    #[test]
    fn mutated_valid_frames_never_panic(
        which in 0usize..6, flips in proptest::collection::vec((any::<usize>(), any::<u8>()), 1..8),
        cut in any::<usize>()
    ) {
        let mut frame = valid_frames().swap_remove(which);
        for (pos, val) in flips {
            let i = pos % frame.len();
            frame[i] = val;
        }
        decode_everything(&frame);
        let cut = cut % (frame.len() + 1);
        decode_everything(&frame[..cut]);
    }

    #[test]
    fn read_batches_round_trip(addrs in proptest::collection::vec((any::<u32>(), any::<u32>()), 1..=MAX_BATCH_PAGES)) {
        let addrs: Vec<PageAddr> = addrs.into_iter().map(|(slab, page)| PageAddr { slab, page }).collect();
        let mut f = Vec::new();
        encode_read_pages(&mut f, 5, &addrs).unwrap();
        let h = Header::decode(&f).unwrap();
        let Request::ReadPages(list) = Request::decode(&h, &f[HEADER_LEN..]).unwrap() else {
            panic!("not a read");
        };
        prop_assert_eq!(list.iter().collect::<Vec<_>>(), addrs);
    }

    #[test]
    fn give_back_lists_round_trip(slabs in proptest::collection::vec(any::<u32>(), 0..=MAX_RECLAIM_SLABS)) {
        let mut f = Vec::new();
        encode_give_back(&mut f, 6, &slabs).unwrap();
        let h = Header::decode(&f).unwrap();
        let Response::GiveBack(list) = Response::decode(&h, &f[HEADER_LEN..]).unwrap() else {
            panic!("not a give_back");
        };
        prop_assert_eq!(list.iter().collect::<Vec<_>>(), slabs);
    }
}
