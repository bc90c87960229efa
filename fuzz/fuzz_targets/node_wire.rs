//! Arbitrary bytes as a stream of host tier frames (both directions); a panic, or a frame that
//! does not encode back, is a bug.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| farmem_fuzz::node_wire::decode_stream(data));
