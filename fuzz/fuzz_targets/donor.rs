//! A session of arbitrary frames against a real in-process donor, after a genuine handshake;
//! a panic in the donor's connection thread, a dead donor or a hang is a bug.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let addr = farmem_fuzz::session::donor();
    farmem_fuzz::session::run_session(addr, data);
});
