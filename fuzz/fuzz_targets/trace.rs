//! Arbitrary bytes as a page-access trace file (crates/sim); any panic is a bug.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| farmem_fuzz::trace::read_trace(data));
