//! Feeds arbitrary bytes to every decoder of the wire protocol; any panic is a bug.
#![no_main]

use farmem_proto::{read_frame, Header, Request, Response, HEADER_LEN};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
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
});
