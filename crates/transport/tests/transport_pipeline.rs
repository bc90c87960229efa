//! Many requests in flight from several threads on one connection, against the hand-made
//! in-memory donor: every response reaches its own request and every page comes back intact.

mod common;

use common::*;
use farmem_proto::{PageAddr, PAGE_SIZE};
use farmem_transport::{ClientConfig, Completion, DonorClient, PageWrite};

const THREADS: u32 = 4;
const BATCHES_PER_THREAD: u32 = 40;
const PAGES_PER_BATCH: u32 = 16;
const IN_FLIGHT: usize = 8;

fn seed(thread: u32, batch: u32, i: u32) -> u64 {
    (u64::from(thread) << 32) | (u64::from(batch) << 16) | u64::from(i)
}

#[test]
fn pipelined_requests_from_several_threads_keep_every_page_intact() {
    let (peer, store) = good_donor();
    // A request timeout no scheduling delay on a loaded machine reaches: the test checks that
    // nothing times out, so a short one would make it depend on the machine's load.
    let cfg = ClientConfig {
        request_timeout: std::time::Duration::from_secs(60),
        ..ClientConfig::default()
    };
    let client = DonorClient::connect(&peer.addr, cfg).unwrap();
    let slab = client.alloc_slab().unwrap();
    let addr = move |t: u32, b: u32, i: u32| PageAddr {
        slab,
        page: (t * BATCHES_PER_THREAD + b) * PAGES_PER_BATCH + i,
    };

    let workers: Vec<_> = (0..THREADS)
        .map(|t| {
            let client = client.clone();
            std::thread::spawn(move || {
                // Writes: up to IN_FLIGHT batches outstanding at once.
                let mut window = std::collections::VecDeque::new();
                for b in 0..BATCHES_PER_THREAD {
                    let pages: Vec<Vec<u8>> =
                        (0..PAGES_PER_BATCH).map(|i| page(seed(t, b, i))).collect();
                    let writes: Vec<_> = pages
                        .iter()
                        .enumerate()
                        .map(|(i, data)| PageWrite {
                            addr: addr(t, b, i as u32),
                            data,
                        })
                        .collect();
                    window.push_back(client.submit_write(&writes).unwrap());
                    if window.len() == IN_FLIGHT {
                        assert_eq!(
                            window.pop_front().unwrap().wait().unwrap(),
                            Completion::Done
                        );
                    }
                }
                for p in window {
                    assert_eq!(p.wait().unwrap(), Completion::Done);
                }
                // Reads, in reverse batch order, also pipelined.
                let mut window = std::collections::VecDeque::new();
                for b in (0..BATCHES_PER_THREAD).rev() {
                    let addrs: Vec<_> = (0..PAGES_PER_BATCH).map(|i| addr(t, b, i)).collect();
                    window.push_back((b, client.submit_read(&addrs).unwrap()));
                    if window.len() == IN_FLIGHT {
                        let (b, p) = window.pop_front().unwrap();
                        check(t, b, p.wait().unwrap());
                    }
                }
                for (b, p) in window {
                    check(t, b, p.wait().unwrap());
                }
            })
        })
        .collect();
    for w in workers {
        w.join().unwrap();
    }
    let total = (THREADS * BATCHES_PER_THREAD * PAGES_PER_BATCH) as usize;
    assert_eq!(store.lock().unwrap().len(), total);
    let c = client.counters();
    assert_eq!(c.pages_written_total, total as u64);
    assert_eq!(c.pages_read_total, total as u64);
    assert_eq!(c.reconnects_total, 0);
    assert_eq!(c.timeouts_total, 0);

    // The blocking call lands page i at out[4096 * i ..].
    let addrs = [addr(1, 3, 5), addr(0, 0, 0), addr(3, 39, 15)];
    let mut out = vec![0u8; 3 * PAGE_SIZE];
    client.read_pages(&addrs, &mut out).unwrap();
    assert_eq!(&out[..PAGE_SIZE], page(seed(1, 3, 5)).as_slice());
    assert_eq!(
        &out[PAGE_SIZE..2 * PAGE_SIZE],
        page(seed(0, 0, 0)).as_slice()
    );
    assert_eq!(&out[2 * PAGE_SIZE..], page(seed(3, 39, 15)).as_slice());
}

fn check(t: u32, b: u32, completion: Completion) {
    let Completion::Pages(data) = completion else {
        panic!("a read completed without pages");
    };
    assert_eq!(data.len(), PAGES_PER_BATCH as usize * PAGE_SIZE);
    for (i, got) in data.chunks_exact(PAGE_SIZE).enumerate() {
        assert!(
            got == page(seed(t, b, i as u32)).as_slice(),
            "thread {t} batch {b} page {i} came back wrong"
        );
    }
}
