//! A token holder churning connections cannot grow the donor's log beyond its tenant's rate
//! limit (each new connection used to get a fresh allowance), against a real `farmem donor`.
mod common;

use std::os::unix::fs::PermissionsExt;
use std::time::Instant;

use common::*;
use farmem_donor::loglimit::{LINES_PER_INTERVAL, LOG_INTERVAL};
use farmem_proto::encode_free_slab;
use farmem_testkit::donor::Donor;
use farmem_testkit::run::Scratch;

/// Connections the churn opens, and refused requests each sends.
const CONNECTIONS: u64 = 1500;
const BAD_REQUESTS: u64 = 20;
/// Lines the donor writes however it is used: start, stop.
const FIXED_LINES: u64 = 12;
/// A generous bound on one log line's length (the longest seen is about 300 bytes).
const MAX_LINE_BYTES: u64 = 1024;

#[test]
fn connection_churn_by_a_token_holder_keeps_the_log_bounded() {
    let dir = Scratch::new("log-limits");
    let tok = dir.path("t.token");
    std::fs::write(&tok, b"churn-token").unwrap();
    std::fs::set_permissions(&tok, std::fs::Permissions::from_mode(0o600)).unwrap();
    std::fs::write(
        dir.path("tenants.toml"),
        "[[tenant]]\nname = \"churner\"\ntoken_file = \"t.token\"\n",
    )
    .unwrap();
    let file = dir.path("tenants.toml");
    let mut donor = Donor::spawn(&[
        "--capacity",
        "16MiB",
        "--slab-size",
        "256KiB",
        "--tenants",
        file.to_str().unwrap(),
    ]);
    let start = Instant::now();
    for i in 0..CONNECTIONS {
        // A fresh client id and connection each time, each logged in ("client authenticated")
        // and refused BAD_REQUESTS times (a warning each, before the fix).
        let mut c = Raw::hello(donor.addr, 10_000 + i, b"churn-token");
        let mut f = Vec::new();
        for r in 0..BAD_REQUESTS {
            encode_free_slab(&mut f, 100 + r, 999_999);
        }
        c.send(&f);
        for _ in 0..BAD_REQUESTS {
            let (_, reply) = c.recv().expect("the donor answers");
            assert_eq!(reply.status(), farmem_proto::Status::NoSuchSlab);
        }
    }
    let churn = start.elapsed();
    donor.signal("-TERM");
    assert!(donor.wait_exit().success());
    let (_, stderr) = donor.output_after_exit();
    // The tenant may log LINES_PER_INTERVAL lines, plus one summary, per interval begun.
    let intervals = churn.as_secs() / LOG_INTERVAL.as_secs() + 2;
    let max_lines = intervals * (LINES_PER_INTERVAL + 1) + FIXED_LINES;
    let lines = stderr.lines().count() as u64;
    let bytes = stderr.len() as u64;
    assert!(
        lines <= max_lines && bytes <= max_lines * MAX_LINE_BYTES,
        "{CONNECTIONS} connections in {churn:?} made the donor log {lines} lines, {bytes} bytes; \
         the rate limit allows {max_lines} lines. First lines:\n{}",
        stderr.lines().take(40).collect::<Vec<_>>().join("\n")
    );
    // The allowance itself is used: the limit drops lines, it does not silence the tenant.
    assert!(
        stderr.matches("refused a request").count() as u64 >= LINES_PER_INTERVAL - 1,
        "the tenant's first lines are missing:\n{stderr}"
    );
}
