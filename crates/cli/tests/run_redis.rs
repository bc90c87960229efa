//! `farmem run` on redis-server at ~50% local memory: 500k keys with random 1 KiB values load
//! and read back identical; BGSAVE (a fork whose child writes the whole dataset) under memory
//! pressure produces an RDB that a fresh redis-server without farmem loads with exactly the
//! same keys and values, and the tree's memory stays within the budget during the fork (the
//! child borrows the pages the server left in the host tier, and the pages both share are
//! dropped, not copied, to evict them); redis-benchmark runs to completion. The same with
//! donors only (no host tier): the child borrows the server's pages on the donor, read there
//! as the server's client.

use farmem_testkit::clients::*;
use farmem_testkit::donor::Donor;
use farmem_testkit::run::*;
use farmem_testkit::tree_rss::TreeRssSampler;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const KEYS: u64 = 500_000;
const VALUE_BYTES: usize = 1024;

fn info_field(c: &mut Resp, section: &str, field: &str) -> String {
    let Reply::Bulk(Some(v)) = c.call(&[b"INFO", section.as_bytes()]) else {
        panic!("INFO failed")
    };
    let s = String::from_utf8_lossy(&v).into_owned();
    s.lines()
        .find_map(|l| {
            l.strip_prefix(&format!("{field}:"))
                .map(|x| x.trim().to_string())
        })
        .unwrap_or_else(|| panic!("INFO {section} has no {field}: {s}"))
}

#[test]
fn redis_at_half_memory_keeps_data_forks_and_benchmarks() {
    redis_at_half_memory(&[]);
}

/// With donors only: a `farmem donor` the test starts (another host's memory, not the tree's),
/// no host tier.
#[test]
fn with_donors_only_redis_bgsave_stays_within_the_budget() {
    let donor = Donor::start("2GiB", "64MiB");
    redis_at_half_memory(&["--donor", &donor.addr.to_string()]);
}

/// The run, with `far` (farmem run flags) saying where far pages go.
fn redis_at_half_memory(far: &[&str]) {
    let server = require_program("redis-server", "redis-server");
    let bench = require_program("redis-benchmark", "redis-tools");
    let dir = Scratch::new("redis");
    let stats = dir.path("stats.json");
    let port = free_port();
    let port_s = port.to_string();
    let mut flags = vec!["--local-mem", "320MiB", "--stats", stats.to_str().unwrap()];
    flags.extend_from_slice(far);
    let mut child = farmem_spawn(
        &flags,
        &[
            server.to_str().unwrap(),
            "--port",
            &port_s,
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            dir.0.to_str().unwrap(),
            "--dbfilename",
            "farmem.rdb",
        ],
        &dir.path("farmem-run.log"),
    );
    let mut c = Resp::new(connect_retry(port, Duration::from_secs(30), &mut child));
    let loading = TreeRssSampler::start(child.child.id());
    redis_load(&mut c, KEYS, VALUE_BYTES);
    redis_verify(&mut c, KEYS, VALUE_BYTES, "under farmem");
    let before = loading.stop().peak_anon_bytes;

    // BGSAVE under pressure: the child writes every page, most of them evicted.
    let saving = TreeRssSampler::start(child.child.id());
    assert_eq!(
        c.call(&[b"BGSAVE"]),
        Reply::Status("Background saving started".into())
    );
    let start = Instant::now();
    while info_field(&mut c, "persistence", "rdb_bgsave_in_progress") != "0" {
        assert!(
            start.elapsed() < Duration::from_secs(300),
            "BGSAVE did not finish in 300 s"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(
        info_field(&mut c, "persistence", "rdb_last_bgsave_status"),
        "ok"
    );
    // The dataset (over 500 MiB) is mostly far, and stays far for the fork: the child borrows
    // the server's host-tier or donor pages (before, each fork brought them all back: 1392 MiB
    // here).
    // The server's resident pages are shared with the child: each side evicts one by
    // dropping its own mapping, never by copying it (before, the server's evictor copied
    // every page it shared: 516-683 MiB here). The tree stays within its budget, plus the
    // child's own runtime (its pool, threads and tables).
    let during = saving.stop().peak_anon_bytes;
    eprintln!(
        "the tree's peak anonymous memory: {} MiB loading, {} MiB during BGSAVE",
        before >> 20,
        during >> 20
    );
    assert!(
        during <= before + (80 << 20),
        "the tree's peak anonymous memory during BGSAVE, {} MiB, is over its peak while \
         loading ({} MiB) + a quarter of the budget (80 MiB)\n{}",
        during >> 20,
        before >> 20,
        child.log_text()
    );

    let b = output_within(
        Command::new(&bench)
            .args(["-h", "127.0.0.1", "-p", &port_s, "-t", "get", "-n", "50000"])
            .args(["-r", "500000", "-d", "1024", "-c", "20", "--csv"])
            .stdin(Stdio::null()),
        Duration::from_secs(300),
    );
    assert!(b.status.success(), "redis-benchmark: {}", text(&b));
    assert!(
        String::from_utf8_lossy(&b.stdout).contains("\"GET\""),
        "redis-benchmark: {}",
        text(&b)
    );

    c.send(&[b"SHUTDOWN", b"NOSAVE"]);
    c.flush();
    let st = child.wait(Duration::from_secs(60));
    assert!(
        st.success(),
        "farmem run redis-server: {st}\n{}",
        child.log_text()
    );
    let s = read_stats(&stats);
    assert!(
        far_bytes_out(&s) > 200 << 20,
        "pages should have gone far (host tier or donor): {s}"
    );
    assert!(far_bytes_in(&s) > 0, "pages should have come back: {s}");

    // A fresh redis-server without farmem loads the RDB the forked child wrote.
    let port2 = free_port();
    let mut plain = Command::new(&server)
        .args([
            "--port",
            &port2.to_string(),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
        ])
        .arg("--dir")
        .arg(&dir.0)
        .args(["--dbfilename", "farmem.rdb"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut c2 = Resp::new(connect_plain(port2, Duration::from_secs(30), &mut plain));
    let start = Instant::now();
    while info_field(&mut c2, "persistence", "loading") != "0" {
        assert!(
            start.elapsed() < Duration::from_secs(120),
            "RDB load did not finish"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    redis_verify(&mut c2, KEYS, VALUE_BYTES, "RDB loaded without farmem");
    let _ = plain.kill();
    let _ = plain.wait();
}
