//! The donor as a library inside a process whose SIGPIPE action is the default (any program not
//! written in Rust): a send that fails because the connection is gone or shut down must cost only
//! that connection, never the process.
mod common;

use std::io::Write;
use std::time::{Duration, Instant};

use common::*;
use farmem_proto::{encode_read_pages, PageAddr, MAX_BATCH_PAGES};
use farmem_testkit::sigpipe::assert_scenario_survives_sigpipe;

fn the_donor_stops_while_blocked_sending_pages() {
    // SAFETY: `signal` with SIG_DFL installs no handler code; this process (the child copy of the
    // test binary, or a human running the ignored test) exists only to run this scenario.
    let previous = unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    assert_ne!(previous, libc::SIG_ERR, "resetting SIGPIPE failed");
    let donor = start(config());
    let mut slow = Raw::hello(donor.local_addr(), 41, b"");
    let slab = slow.alloc_ok();
    let addrs: Vec<PageAddr> = (0..MAX_BATCH_PAGES as u32)
        .map(|i| PageAddr { slab, page: i % 64 })
        .collect();
    // 64 MiB of responses asked for and none read: far more than the socket buffers hold, so the
    // donor's thread for this client ends up blocked sending them.
    let mut frames = Vec::new();
    for i in 0..64u64 {
        encode_read_pages(&mut frames, 1000 + i, &addrs).unwrap();
    }
    slow.send(&frames);
    // Wait until the donor is inside that stream of responses (one batch fully sent).
    let mut witness = Raw::hello(donor.local_addr(), 42, b"");
    let deadline = Instant::now() + Duration::from_secs(30);
    while witness.stats().pages_read_total < MAX_BATCH_PAGES as u64 {
        assert!(
            Instant::now() < deadline,
            "the donor never served the slow client's reads"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    // Stopping shuts the slow client's socket down under its blocked send: the send fails with
    // EPIPE, which raises SIGPIPE unless the donor sends with MSG_NOSIGNAL.
    donor.stop().unwrap();
    drop(slow);
    let mut out = std::io::stdout();
    writeln!(out, "DONOR-SIGPIPE-SCENARIO-DONE").unwrap();
}

#[test]
#[ignore = "run in a child process by stopping_while_sending_to_a_client_that_does_not_read_cannot_kill_the_donor"]
fn donor_sigpipe_child() {
    the_donor_stops_while_blocked_sending_pages();
}

#[test]
fn stopping_while_sending_to_a_client_that_does_not_read_cannot_kill_the_donor() {
    assert_scenario_survives_sigpipe(
        "donor_sigpipe_child",
        "DONOR-SIGPIPE-SCENARIO-DONE",
        "the donor's process was killed by SIGPIPE sending pages on a shut-down connection",
    );
}
