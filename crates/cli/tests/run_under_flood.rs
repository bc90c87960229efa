//! A flood of 2,000 unauthenticated connections (loopback, bounded in count and time) against a
//! `farmem donor` process while a token holder pages a real program to it under `farmem run
//! --donor`: the program finishes with correct output, a new client connects afterwards, and the
//! donor's log stays bounded.

use farmem_testkit::bins::*;
use farmem_testkit::clients::*;
use farmem_testkit::run::*;

use std::net::TcpStream;
use std::os::unix::fs::PermissionsExt;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[test]
fn a_connection_flood_does_not_stop_a_paging_program_or_new_clients() {
    let dir = Scratch::new("flood");
    let prog = dir.path("run_checks");
    compile_c(&c_source("run_checks.c"), &prog, &[]);
    let token = dir.path("token");
    std::fs::write(&token, "flood-test-token\n").unwrap();
    std::fs::set_permissions(&token, std::fs::Permissions::from_mode(0o600)).unwrap();
    let log = dir.path("donor.log");
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let mut donor = Command::new(farmem())
        .args(["donor", "--listen", &addr, "--capacity", "1GiB"])
        .arg("--token-file")
        .arg(&token)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let _ = connect_plain(port, Duration::from_secs(10), &mut donor);

    // The flood: 2,000 connections that never say HELLO, opened while the program runs.
    let stop = Arc::new(AtomicBool::new(false));
    let flood = {
        let (stop, addr) = (Arc::clone(&stop), addr.clone());
        std::thread::spawn(move || {
            let started = Instant::now();
            let mut held = Vec::new();
            while held.len() < 2000 && !stop.load(Ordering::Relaxed) {
                if let Ok(s) = TcpStream::connect(&addr) {
                    held.push(s);
                }
                if started.elapsed() > Duration::from_secs(120) {
                    break;
                }
            }
            // Keep them open until the test is done.
            while !stop.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(20));
            }
            held.len()
        })
    };
    std::thread::sleep(Duration::from_millis(200));
    let stats = dir.path("stats.json");
    let o = farmem_run(
        &[
            "--local-mem",
            "64MiB",
            "--donor",
            &addr,
            "--token-file",
            token.to_str().unwrap(),
            "--stats",
            stats.to_str().unwrap(),
        ],
        &[prog.to_str().unwrap(), "192"],
    );
    let out = text(&o);
    assert!(o.status.success(), "{out}");
    for check in ["read-into-evicted", "threads", "fork", "calloc-zero"] {
        assert!(out.contains(&format!("ok {check}\n")), "{check}:\n{out}");
    }
    assert!(counter(&read_stats(&stats), "remote_bytes_out") > 64 << 20);
    // A new client still gets in.
    let s = Command::new(farmem())
        .args([
            "stats",
            "--donor",
            &addr,
            "--interval-ms",
            "0",
            "--token-file",
        ])
        .arg(&token)
        .output()
        .unwrap();
    assert!(s.status.success(), "{}", text(&s));
    stop.store(true, Ordering::Relaxed);
    let opened = flood.join().unwrap();
    assert!(opened >= 1000, "the flood opened only {opened} connections");

    let _ = Command::new("kill")
        .args(["-TERM", &donor.id().to_string()])
        .status();
    let _ = donor.wait();
    let text = std::fs::read_to_string(&log).unwrap();
    let lines = text.lines().count();
    assert!(
        lines < 200,
        "the donor logged {lines} lines under the flood:\n{}",
        &text[..text.len().min(4000)]
    );
    assert!(
        text.contains(
            "closed an unauthenticated connection of the source holding the most login slots"
        ),
        "{text}"
    );
    assert!(!text.contains("flood-test-token"), "the token was logged");
}
