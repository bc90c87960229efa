//! Logins over a slow link get through a flood of unauthenticated connections from many
//! sources, against a real `farmem donor` process: the flood (10,000 connections/s aimed at,
//! from 127.0.0.1 … 127.0.0.64, bounded in time and count, loopback only) evicts only its own
//! connections. Before login slots were shared fairly between sources, most slow logins were
//! evicted (`crates/donor/examples/login_flood.rs` measures both).
mod common;

use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

use common::*;
use farmem_donor::MAX_UNAUTHENTICATED;
use farmem_testkit::donor::Donor;
use farmem_testkit::flood::{slow_login, Flood, FloodConfig};

const RTT: Duration = Duration::from_millis(300);
/// A login's deadline: far beyond its 1.5 round trips, within the donor's 3 s HELLO timeout
/// counted from its accept (a SYN dropped by a full backlog is retried after 1 s).
const DEADLINE: Duration = Duration::from_secs(10);

#[test]
fn slow_logins_get_through_a_flood_from_many_sources() {
    let donor = Donor::spawn(&["--capacity", "16MiB", "--slab-size", "256KiB"]);
    // A client that logged in before from the flood's own /24 (a returning client).
    let returning = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 200));
    slow_login(returning, donor.addr, 1, b"", Duration::ZERO, DEADLINE)
        .expect("login before the flood");

    let flood = Flood::start(FloodConfig::standard(donor.addr, Duration::from_secs(8)));
    // Three clients logging in one after another while the flood runs: two from a /24 of
    // their own (first logins), one returning from the flood's /24.
    let sources = [
        IpAddr::V4(Ipv4Addr::new(127, 0, 1, 1)),
        IpAddr::V4(Ipv4Addr::new(127, 0, 2, 1)),
        returning,
    ];
    std::thread::sleep(Duration::from_millis(500));
    let logins: Vec<_> = sources
        .iter()
        .enumerate()
        .map(|(k, &src)| {
            let addr = donor.addr;
            // Eight logins of 1.5 round trips each: well within the flood's 8 s.
            std::thread::spawn(move || {
                (0..8u64)
                    .map(|n| {
                        let id = 100 + k as u64 * 100 + n;
                        (src, slow_login(src, addr, id, b"", RTT, DEADLINE))
                    })
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    let results: Vec<_> = logins.into_iter().flat_map(|t| t.join().unwrap()).collect();
    let report = flood.stop();
    let failed: Vec<_> = results.iter().filter(|(_, r)| r.is_err()).collect();
    assert!(
        report.connections >= 20 * MAX_UNAUTHENTICATED as u64,
        "the flood made only {} connections: it cannot have filled the login slots",
        report.connections
    );
    assert!(
        failed.is_empty(),
        "{} of {} slow logins failed during a flood of {} connections in {:?}: {failed:?}",
        failed.len(),
        results.len(),
        report.connections,
        report.elapsed
    );
    // The donor still serves.
    Witness::new(donor.addr, 9, b"").check();
}
