//! The decode target's body: every decoder of the wire protocol over arbitrary bytes. Shared
//! with `crates/proto/tests/fuzz_corpus.rs`, which replays the corpus through it on stable.
use farmem_proto::{read_frame, Header, Request, Response, HEADER_LEN};

/// Feeds `data` to every decoder; any panic is a bug.
pub fn decode_all(data: &[u8]) {
    let _ = Header::salvage(data);
    if let Ok(h) = Header::decode(data) {
        let payload = &data[HEADER_LEN..];
        let payload = payload.get(..h.payload_len as usize).unwrap_or(payload);
        let _ = Request::decode(&h, payload);
        let _ = Response::decode(&h, payload);
    }
    let mut r = data;
    let mut buf = Vec::new();
    while read_frame(&mut r, &mut buf).is_ok() {}
}
