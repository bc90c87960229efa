//! Donors on other "machines" for the benchmarks: a `farmem donor` in a network namespace of
//! its own behind a veth link, with a token (the test kit's [`HostDonor`]).
//!
//! The test kit fails by panicking (its users are tests); here a host that cannot be made is
//! caught and becomes an error saying why, so a benchmark can report it (and `compare` go on
//! with its other systems).

use farmem_testkit::netns::{Host, HostDonor};

/// Starts `farmem donor ARGS… --token-file FILE` (holding `token`) in a new namespace, and
/// waits for it to listen. Needs root.
pub(crate) fn host_donor(args: &[&str], token: Vec<u8>) -> Result<HostDonor, String> {
    testkit_call(|| HostDonor::spawn_with_token(Host::new(), args, token))
        .map_err(|why| format!("starting a donor in a network namespace of its own: {why}"))
}

/// Runs a test-kit call, which reports failure by panicking, and returns the panic's message
/// as an error instead.
pub(crate) fn testkit_call<T>(f: impl FnOnce() -> T) -> Result<T, String> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).map_err(|panic| {
        panic
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_else(|| "unknown failure".into())
    })
}

/// A fresh random token for a benchmark's donors, hex so the token file holds one plain line.
/// Random, not derived from the process id: the donor listens on an address every local user
/// can reach, and a guessable token would let one of them use it.
pub(crate) fn bench_token() -> Result<Vec<u8>, String> {
    let mut b = [0u8; 16];
    farmem_proto::random_bytes(&mut b).map_err(|e| format!("making a donor token: {e}"))?;
    Ok(b.iter()
        .map(|x| format!("{x:02x}"))
        .collect::<String>()
        .into_bytes())
}
