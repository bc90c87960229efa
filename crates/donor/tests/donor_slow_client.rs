//! A client that sends requests but never reads the responses must not stall anyone else.
mod common;

use std::io::Write;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::*;
use farmem_donor::DonorConfig;
use farmem_proto::{encode_read_pages, PageAddr, MAX_BATCH_PAGES};

#[test]
fn a_client_that_never_reads_does_not_stall_others() {
    let donor = start(DonorConfig {
        capacity_bytes: 64 * SLAB_BYTES,
        ..config()
    });
    let mut slow = Raw::hello(donor.local_addr(), 66, b"");
    let slab = slow.alloc_ok();
    let addrs: Vec<PageAddr> = (0..MAX_BATCH_PAGES as u32)
        .map(|i| PageAddr { slab, page: i % 64 })
        .collect();
    // 50 000 requests (100 MB) asking for 1 MiB each: far more than socket buffers hold.
    const REQUESTS: usize = 50_000;
    let sent = Arc::new(AtomicUsize::new(0));
    let mut stream = slow.stream.try_clone().unwrap();
    stream
        .set_write_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let sender = {
        let sent = Arc::clone(&sent);
        std::thread::spawn(move || {
            let mut f = Vec::new();
            for i in 0..REQUESTS {
                f.clear();
                encode_read_pages(&mut f, i as u64 + 100, &addrs).unwrap();
                if stream.write_all(&f).is_err() {
                    break;
                }
                sent.fetch_add(1, Ordering::SeqCst);
            }
        })
    };
    // Wait until the slow client's pipe is full: the sender stops making progress.
    let mut last = usize::MAX;
    loop {
        std::thread::sleep(Duration::from_millis(300));
        let now = sent.load(Ordering::SeqCst);
        if now == last {
            break;
        }
        last = now;
    }
    assert!(
        last < REQUESTS,
        "the slow client managed to send all {REQUESTS} requests: the donor never blocked on it"
    );
    // The donor's thread for `slow` is now blocked writing to it. Others are served.
    for client in 1..=3 {
        let mut w = Witness::new(donor.local_addr(), client, b"");
        w.check();
        assert!(w.raw.stats().clients >= 2);
    }
    // Shutdown must not hang on the blocked connection either.
    drop(slow);
    donor.stop().unwrap();
    sender.join().unwrap();
}
