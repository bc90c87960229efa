//! A session of arbitrary frames against the donor's request handling (in-process, no socket),
//! after a genuine handshake; a panic in the donor, a hang, a failed handshake or slabs that
//! outlive the session are bugs.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    farmem_fuzz::session::run_session(farmem_fuzz::session::donor(), data);
});
