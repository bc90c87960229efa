//! Memory is committed when slab pages are written, never when they are read, and returned to
//! the operating system when the slab is freed. Measured from the kernel's own accounting
//! (RssAnon of this process, which hosts the donor) as well as the donor's counters.
//! One test in this file, so no other test's allocations disturb the figures.
mod common;

use common::*;
use farmem_donor::DonorConfig;
use farmem_proto::{PageAddr, PAGE_SIZE};

fn rss_anon_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("read /proc/self/status");
    let line = status
        .lines()
        .find(|l| l.starts_with("RssAnon:"))
        .expect("RssAnon in /proc/self/status (Linux >= 4.5 needed)");
    let kb: u64 = line
        .split_whitespace()
        .nth(1)
        .and_then(|v| v.parse().ok())
        .expect("RssAnon value");
    kb * 1024
}

#[test]
fn writes_commit_memory_reads_do_not_and_free_returns_it() {
    const SLAB: u64 = 32 << 20;
    let donor = start(DonorConfig {
        capacity_bytes: 4 * SLAB,
        slab_size_bytes: SLAB,
        ..config()
    });
    let mut c = Raw::hello(donor.local_addr(), 1, b"");
    let slab = c.alloc_ok();
    let pages = (SLAB / PAGE_SIZE as u64) as u32;

    // Reading the whole never-written slab: zeros, and nothing committed.
    let before_reads = rss_anon_bytes();
    for chunk in (0..pages).collect::<Vec<_>>().chunks(256) {
        let addrs: Vec<PageAddr> = chunk.iter().map(|&page| PageAddr { slab, page }).collect();
        let Reply::Pages(d) = c.read(&addrs) else {
            panic!("read failed")
        };
        assert!(d.iter().all(|&b| b == 0));
    }
    let after_reads = rss_anon_bytes();
    assert_eq!(c.stats().committed_bytes, 0);
    assert!(
        after_reads < before_reads + SLAB / 4,
        "reading unwritten pages committed memory: RssAnon {before_reads} -> {after_reads}"
    );

    // Writing the whole slab commits it.
    let p = page(7);
    for chunk in (0..pages).collect::<Vec<_>>().chunks(256) {
        let batch: Vec<(PageAddr, &[u8])> = chunk
            .iter()
            .map(|&page| (PageAddr { slab, page }, p.as_slice()))
            .collect();
        assert_eq!(c.write(&batch), Reply::Done);
    }
    let after_writes = rss_anon_bytes();
    assert_eq!(c.stats().committed_bytes, SLAB);
    assert!(
        after_writes >= after_reads + SLAB * 3 / 4,
        "writing {SLAB} bytes did not commit them: RssAnon {after_reads} -> {after_writes}"
    );

    // Freeing returns it to the OS.
    assert_eq!(c.free(slab), Reply::Done);
    let after_free = rss_anon_bytes();
    assert_eq!(c.stats().committed_bytes, 0);
    assert!(
        after_free + SLAB * 3 / 4 <= after_writes,
        "freeing did not return memory: RssAnon {after_writes} -> {after_free}"
    );
}
