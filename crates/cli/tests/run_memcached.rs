//! `farmem run` on memcached at ~50% local memory: set and get the whole dataset identically.

use farmem_testkit::clients::*;
use farmem_testkit::run::*;

use std::io::{BufRead, BufReader, Read, Write};
use std::time::Duration;

const ITEMS: u64 = 300_000;
const VALUE_BYTES: usize = 1024;
const BATCH: u64 = 200;

#[test]
fn memcached_at_half_memory_returns_every_item() {
    let server = require_program("memcached", "memcached");
    let dir = Scratch::new("memcached");
    let stats = dir.path("stats.json");
    let port = free_port();
    let mut child = farmem_spawn(
        &["--local-mem", "192MiB", "--stats", stats.to_str().unwrap()],
        &[
            server.to_str().unwrap(),
            "-l",
            "127.0.0.1",
            "-p",
            &port.to_string(),
            "-U",
            "0",
            "-m",
            "1024",
            "-t",
            "2",
            "-u",
            "root",
        ],
        &dir.path("farmem-run.log"),
    );
    let s = connect_retry(port, Duration::from_secs(30), &mut child);
    let mut w = std::io::BufWriter::new(s.try_clone().unwrap());
    let mut r = BufReader::new(s);
    let mut line = String::new();
    for start in (0..ITEMS).step_by(BATCH as usize) {
        let end = (start + BATCH).min(ITEMS);
        for i in start..end {
            write!(w, "set item:{i} 0 0 {VALUE_BYTES}\r\n").unwrap();
            w.write_all(&value_of(i, VALUE_BYTES)).unwrap();
            w.write_all(b"\r\n").unwrap();
        }
        w.flush().unwrap();
        for i in start..end {
            line.clear();
            r.read_line(&mut line).unwrap();
            assert_eq!(line, "STORED\r\n", "set item:{i}");
        }
    }
    for start in (0..ITEMS).step_by(BATCH as usize) {
        let end = (start + BATCH).min(ITEMS);
        write!(w, "get").unwrap();
        for i in start..end {
            write!(w, " item:{i}").unwrap();
        }
        w.write_all(b"\r\n").unwrap();
        w.flush().unwrap();
        for i in start..end {
            line.clear();
            r.read_line(&mut line).unwrap();
            let want = format!("VALUE item:{i} 0 {VALUE_BYTES}\r\n");
            assert_eq!(line, want, "item {i} missing or evicted by memcached");
            let mut v = vec![0u8; VALUE_BYTES + 2];
            r.read_exact(&mut v).unwrap();
            assert!(
                v[..VALUE_BYTES] == value_of(i, VALUE_BYTES)[..],
                "item {i} differs"
            );
        }
        line.clear();
        r.read_line(&mut line).unwrap();
        assert_eq!(line, "END\r\n");
    }
    // memcached ends on SIGTERM, which farmem run passes on; its status comes back through
    child.signal("TERM");
    let st = child.wait(Duration::from_secs(60));
    assert!(
        st.success(),
        "farmem run memcached: {st}\n{}",
        child.log_text()
    );
    let st = read_stats(&stats);
    assert!(
        far_bytes_out(&st) > 100 << 20,
        "pages should have gone far (host tier or donor): {st}"
    );
    assert!(far_bytes_in(&st) > 0, "pages should have come back: {st}");
}
