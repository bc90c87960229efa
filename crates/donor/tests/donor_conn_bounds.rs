//! Authenticated connections are bounded per client id and per tenant, and one tenant's
//! connections cannot lock another tenant out, against a real `farmem donor` process.
mod common;

use std::time::{Duration, Instant};

use common::*;
use farmem_proto::Status;
use farmem_testkit::donor::Donor;
use farmem_testkit::run::Scratch;

fn tenants_file(dir: &Scratch, tenants: &[(&str, &[u8], &str)]) -> String {
    farmem_testkit::donor::tenants_file(&dir.path(""), tenants)
}

#[test]
fn one_tenants_1024_idle_connections_do_not_lock_another_tenant_out() {
    let dir = Scratch::new("conn-bounds-greedy");
    let file = tenants_file(
        &dir,
        &[
            ("greedy", b"greedy-token", ""),
            ("other", b"other-token", ""),
        ],
    );
    let donor = Donor::spawn(&[
        "--capacity",
        "16MiB",
        "--slab-size",
        "256KiB",
        "--tenants",
        &file,
    ]);
    let mut held = Vec::new();
    let mut refused = Vec::new();
    for i in 0..1024u64 {
        // 16 connections per client id: within the per-client bound, so the tenant's is hit.
        let mut c = Raw::connect(donor.addr);
        match c.hello_reply(1000 + i / 16, b"greedy-token") {
            Reply::Hello { .. } => held.push(c),
            Reply::Error(Status::DonorFull, m) => refused.push(m),
            other => panic!("greedy connection {i}: {other:?}"),
        }
    }
    // The other tenant's client connects and works, with the greedy connections still open.
    let mut w = Witness::new(donor.addr, 5000, b"other-token");
    w.check();
    let mut w2 = Witness::new(donor.addr, 5001, b"other-token");
    w2.check();
    assert!(
        !refused.is_empty(),
        "all 1024 connections of one tenant were admitted"
    );
    assert!(
        refused[0].contains("tenant greedy has") && refused[0].contains("fair share"),
        "{}",
        refused[0]
    );
    // The greedy tenant's admitted connections are served too.
    held[0].stats();
    held.last_mut().unwrap().stats();
}

#[test]
fn a_client_id_or_tenant_at_its_bound_is_refused_naming_it() {
    let dir = Scratch::new("conn-bounds-client");
    let file = tenants_file(
        &dir,
        &[
            ("small", b"small-token", "max_connections = 2"),
            ("big", b"big-token", ""),
        ],
    );
    let donor = Donor::spawn(&[
        "--capacity",
        "16MiB",
        "--slab-size",
        "256KiB",
        "--tenants",
        &file,
        "--max-conns-per-client",
        "3",
    ]);
    let mut seven: Vec<Raw> = (0..3)
        .map(|_| Raw::hello(donor.addr, 7, b"big-token"))
        .collect();
    let mut fourth = Raw::connect(donor.addr);
    match fourth.hello_reply(7, b"big-token") {
        Reply::Error(Status::DonorFull, m) => assert!(
            m.contains("client 7 has 3 connections, its bound (--max-conns-per-client 3)"),
            "{m}"
        ),
        other => panic!("a fourth connection of client 7: {other:?}"),
    }
    assert!(fourth.closed_by_donor());
    // Another client id of the same tenant is not affected.
    Witness::new(donor.addr, 8, b"big-token").check();
    // Once one of client 7's connections closes, it may open another.
    drop(seven.pop());
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let mut c = Raw::connect(donor.addr);
        match c.hello_reply(7, b"big-token") {
            Reply::Hello { .. } => break,
            Reply::Error(Status::DonorFull, _) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(50))
            }
            other => panic!("client 7 after closing one connection: {other:?}"),
        }
    }
    seven[0].stats();
    // A tenant's own bound, from the tenants file.
    let _a = Raw::hello(donor.addr, 20, b"small-token");
    let _b = Raw::hello(donor.addr, 21, b"small-token");
    let mut c = Raw::connect(donor.addr);
    match c.hello_reply(22, b"small-token") {
        Reply::Error(Status::DonorFull, m) => assert!(
            m.contains("tenant small has 2 connections, its bound (2"),
            "{m}"
        ),
        other => panic!("a third connection of tenant small: {other:?}"),
    }
}

#[test]
fn connection_bounds_of_zero_are_refused_naming_the_flag() {
    let out = std::process::Command::new(farmem_testkit::bins::farmem())
        .args([
            "donor",
            "--capacity",
            "16MiB",
            "--max-conns-per-client",
            "0",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--max-conns-per-client") && err.contains("at least 1"),
        "{err}"
    );
    let dir = Scratch::new("conn-bounds-zero");
    let file = tenants_file(&dir, &[("a", b"a-token", "max_connections = 0")]);
    let out = std::process::Command::new(farmem_testkit::bins::farmem())
        .args(["donor", "--capacity", "16MiB", "--tenants", &file])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("max_connections = 0"), "{err}");
}
