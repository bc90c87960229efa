//! Hand-made peers for the transport tests: a minimal in-memory donor speaking raw farmem frames
//! (so the client can be tested without the real donor), and the hostile variants — one that
//! stalls, one that dies mid-request, one that sends garbage, one that refuses the token.
#![allow(dead_code)]

use std::collections::HashMap;
use std::io::Write;
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use farmem_proto::{
    encode_challenge, encode_error, encode_give_back, encode_pages_header, encode_slab_allocated,
    encode_stats_reply, encode_success, encode_welcome, proofs_match, read_frame, token_proof,
    AuthMode, DonorInfo, DonorStats, Header, Opcode, PageAddr, Request, Status, NONCE_LEN,
    PAGE_SIZE, PROOF_LEN,
};

/// Geometry the fake donor announces.
pub const FAKE_INFO: DonorInfo = DonorInfo {
    slab_size_bytes: 16 * PAGE_SIZE as u64,
    capacity_bytes: 64 * 16 * PAGE_SIZE as u64,
};

/// A listening fake peer. Every accepted connection runs `handler(stream, index)` on its own
/// thread, `index` counting connections from 0.
pub struct Peer {
    pub addr: String,
    pub connections: Arc<AtomicUsize>,
}

pub fn spawn_peer<F>(handler: F) -> Peer
where
    F: Fn(TcpStream, usize) + Send + Sync + 'static,
{
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
    let addr = listener.local_addr().unwrap().to_string();
    let connections = Arc::new(AtomicUsize::new(0));
    let count = Arc::clone(&connections);
    let handler = Arc::new(handler);
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(stream) = stream else { return };
            let index = count.fetch_add(1, Ordering::SeqCst);
            let handler = Arc::clone(&handler);
            std::thread::spawn(move || handler(stream, index));
        }
    });
    Peer { addr, connections }
}

/// The nonce the fake donors challenge every connection with.
pub const FAKE_NONCE: [u8; NONCE_LEN] = [0x5A; NONCE_LEN];

/// What the client said in the handshake (AUTH), and every byte it sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hello {
    pub client_id: u64,
    pub mode: AuthMode,
    pub token_proof: [u8; PROOF_LEN],
    pub key_or_proof: [u8; PROOF_LEN],
    /// The raw bytes of HELLO and AUTH, as sent.
    pub wire: Vec<u8>,
}

impl Hello {
    /// Whether the client proved `token`.
    pub fn proves(&self, token: &[u8]) -> bool {
        proofs_match(
            &token_proof(token, &FAKE_NONCE, self.client_id),
            &self.token_proof,
        )
    }
}

/// Reads HELLO, answers with [`FAKE_NONCE`], reads AUTH and answers it; `accept(hello)`
/// decides whether the token is good (see [`Hello::proves`]). The fake accepts any client id
/// and mode.
pub fn handshake(stream: &mut TcpStream, accept: impl Fn(&Hello) -> bool) -> Option<Hello> {
    let mut buf = Vec::new();
    let header = read_frame(stream, &mut buf).ok()?;
    let mut wire = header.encode().to_vec();
    wire.extend_from_slice(&buf);
    let Ok(Request::Hello { .. }) = Request::decode(&header, &buf) else {
        panic!("the client's first frame is not HELLO: {header:?}");
    };
    let mut out = Vec::new();
    encode_challenge(&mut out, header.request_id, &FAKE_NONCE);
    stream.write_all(&out).ok()?;
    let header = read_frame(stream, &mut buf).ok()?;
    wire.extend_from_slice(&header.encode());
    wire.extend_from_slice(&buf);
    let Ok(Request::Auth {
        client_id,
        mode,
        token_proof,
        key_or_proof,
    }) = Request::decode(&header, &buf)
    else {
        panic!("the client's second frame is not AUTH: {header:?}");
    };
    let hello = Hello {
        client_id,
        mode,
        token_proof,
        key_or_proof,
        wire,
    };
    out.clear();
    if accept(&hello) {
        encode_welcome(&mut out, header.request_id, FAKE_INFO);
    } else {
        encode_error(
            &mut out,
            Opcode::Auth as u8,
            header.request_id,
            Status::AuthFailed,
            "wrong token",
        );
    }
    stream.write_all(&out).ok()?;
    Some(hello)
}

/// Reads one request frame; returns its header and payload, or `None` when the client closed.
pub fn next_request(stream: &mut TcpStream) -> Option<(Header, Vec<u8>)> {
    let mut buf = Vec::new();
    let header = read_frame(stream, &mut buf).ok()?;
    Some((header, buf))
}

/// The pages a fake donor holds, shared by all its connections.
pub type Store = Arc<Mutex<HashMap<PageAddr, Vec<u8>>>>;

/// Serves requests correctly from `store` until the client closes (after HELLO was done).
/// Slabs are numbered from `next_slab`; unknown slabs read as NoSuchSlab.
pub fn serve(stream: &mut TcpStream, store: &Store, next_slab: &AtomicUsize) {
    while let Some((header, payload)) = next_request(stream) {
        let mut out = Vec::new();
        answer(&header, &payload, store, next_slab, &mut out);
        if stream.write_all(&out).is_err() {
            return;
        }
    }
}

/// Appends the correct answer to one request.
pub fn answer(
    header: &Header,
    payload: &[u8],
    store: &Store,
    next_slab: &AtomicUsize,
    out: &mut Vec<u8>,
) {
    let id = header.request_id;
    match Request::decode(header, payload) {
        Ok(Request::AllocSlab) => {
            let slab = next_slab.fetch_add(1, Ordering::SeqCst) as u32;
            encode_slab_allocated(out, id, slab);
        }
        Ok(Request::FreeSlab { .. }) => encode_success(out, Opcode::FreeSlab, id),
        Ok(Request::WritePages(batch)) => {
            let mut store = store.lock().unwrap();
            for (addr, data) in batch.iter() {
                store.insert(addr, data.to_vec());
            }
            encode_success(out, Opcode::WritePages, id);
        }
        Ok(Request::ReadPages(list)) => {
            let store = store.lock().unwrap();
            let limit = next_slab.load(Ordering::SeqCst) as u32;
            if let Some(bad) = list.iter().find(|a| a.slab >= limit) {
                encode_error(
                    out,
                    Opcode::ReadPages as u8,
                    id,
                    Status::NoSuchSlab,
                    &format!("slab {} does not exist", bad.slab),
                );
                return;
            }
            encode_pages_header(out, id, list.len()).unwrap();
            for addr in list.iter() {
                match store.get(&addr) {
                    Some(p) => out.extend_from_slice(p),
                    None => out.extend_from_slice(&[0u8; PAGE_SIZE]),
                }
            }
        }
        Ok(Request::Stats) => encode_stats_reply(
            out,
            id,
            &DonorStats {
                capacity_bytes: FAKE_INFO.capacity_bytes,
                ..DonorStats::default()
            },
        ),
        Ok(Request::Reclaims) => encode_give_back(out, id, &[]).unwrap(),
        Ok(Request::Ident { .. }) => encode_success(out, Opcode::Ident, id),
        // This fake serves no tenants: it answers CLIENTS like a donor from before it.
        Ok(Request::Clients) => encode_error(
            out,
            Opcode::Clients as u8,
            id,
            Status::UnknownRequest,
            "unknown request",
        ),
        Ok(Request::Hello { .. } | Request::Auth { .. }) => {
            panic!("a handshake request twice on one connection")
        }
        Err(e) => encode_error(out, header.opcode, id, e.status(), &e.to_string()),
    }
}

/// A well-behaved fake donor (accepts any token).
pub fn good_donor() -> (Peer, Store) {
    let store: Store = Arc::default();
    let slabs = Arc::new(AtomicUsize::new(0));
    let s = Arc::clone(&store);
    let peer = spawn_peer(move |mut stream, _| {
        if handshake(&mut stream, |_| true).is_some() {
            serve(&mut stream, &s, &slabs);
        }
    });
    (peer, store)
}

/// A page whose bytes depend on `seed`, so mix-ups show.
pub fn page(seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..PAGE_SIZE)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// Keeps a connection open without answering, until the client closes it.
pub fn stall(stream: &mut TcpStream) {
    let _ = stream.set_read_timeout(Some(Duration::from_secs(60)));
    while next_request(stream).is_some() {}
}
