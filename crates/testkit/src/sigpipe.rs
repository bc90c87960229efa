//! Running a scenario in a child copy of the test binary, where it can reset SIGPIPE to its
//! default action (as in any program not written in Rust, which the runtime lives in through
//! the preload library), and checking that the child was not killed by SIGPIPE.

use std::os::unix::process::ExitStatusExt;
use std::process::Command;

/// Runs the ignored test `child_test` of this test binary in a child process and fails unless
/// it ended successfully after printing `done_marker`. `killed` says what a death by SIGPIPE
/// means (e.g. "the client was killed by SIGPIPE writing to a closed donor connection").
pub fn assert_scenario_survives_sigpipe(child_test: &str, done_marker: &str, killed: &str) {
    let exe = std::env::current_exe().expect("locating the test executable");
    let out = Command::new(&exe)
        .args(["--exact", child_test, "--ignored", "--nocapture"])
        .output()
        .unwrap_or_else(|e| panic!("running {} {child_test}: {e}", exe.display()));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_ne!(
        out.status.signal(),
        Some(libc::SIGPIPE),
        "{killed}\n{stdout}{stderr}"
    );
    assert!(
        out.status.success() && stdout.contains(done_marker),
        "the child failed: {:?}\n{stdout}{stderr}",
        out.status
    );
}
