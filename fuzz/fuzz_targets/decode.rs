//! Feeds arbitrary bytes to every decoder of the wire protocol; any panic is a bug.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| farmem_fuzz::decode::decode_all(data));
