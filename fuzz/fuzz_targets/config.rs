//! Arbitrary text as a size, a duration and a tenants file (`farmem` CLI parsers); any panic
//! is a bug.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| farmem_fuzz::config::parse_config(data));
