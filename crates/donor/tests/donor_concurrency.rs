//! Many clients at once, each checking every byte it reads back, while others allocate and free
//! slabs around them: no client ever sees another's data or a lost write.
mod common;

use std::net::SocketAddr;

use common::*;
use farmem_donor::DonorConfig;
use farmem_proto::{PageAddr, Status, PAGE_SIZE};

fn stamp(client: u64, slab: u32, page: u32, version: u32) -> Vec<u8> {
    let mut p = page_bytes(client ^ u64::from(version) << 32);
    p[..8].copy_from_slice(&client.to_le_bytes());
    p[8..12].copy_from_slice(&slab.to_le_bytes());
    p[12..16].copy_from_slice(&page.to_le_bytes());
    p[16..20].copy_from_slice(&version.to_le_bytes());
    p
}

fn page_bytes(seed: u64) -> Vec<u8> {
    page(seed)
}

fn worker(addr: SocketAddr, client: u64) {
    let mut c = Raw::hello(addr, client, b"");
    let slabs = [c.alloc_ok(), c.alloc_ok()];
    let pages = (SLAB_BYTES / PAGE_SIZE as u64) as u32;
    let mut version = vec![0u32; 2 * pages as usize];
    let mut rng = client.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut next = || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    for round in 0..150u32 {
        // A batch of writes to random pages of both slabs (distinct pages per batch).
        let mut batch_addrs: Vec<(usize, PageAddr)> = Vec::new();
        for _ in 0..(1 + next() % 16) {
            let s = (next() % 2) as usize;
            let page = (next() % u64::from(pages)) as u32;
            let key = s * pages as usize + page as usize;
            if batch_addrs.iter().all(|(k, _)| *k != key) {
                batch_addrs.push((
                    key,
                    PageAddr {
                        slab: slabs[s],
                        page,
                    },
                ));
            }
        }
        let datas: Vec<Vec<u8>> = batch_addrs
            .iter()
            .map(|(k, a)| {
                version[*k] = round + 1;
                stamp(client, a.slab, a.page, round + 1)
            })
            .collect();
        let batch: Vec<(PageAddr, &[u8])> = batch_addrs
            .iter()
            .zip(&datas)
            .map(|((_, a), d)| (*a, d.as_slice()))
            .collect();
        assert_eq!(
            c.write(&batch),
            Reply::Done,
            "client {client} round {round}"
        );
        // Read back a random set and check every byte.
        let reads: Vec<PageAddr> = (0..(1 + next() % 32))
            .map(|_| PageAddr {
                slab: slabs[(next() % 2) as usize],
                page: (next() % u64::from(pages)) as u32,
            })
            .collect();
        let Reply::Pages(data) = c.read(&reads) else {
            panic!("client {client}: read failed")
        };
        for (i, a) in reads.iter().enumerate() {
            let s = usize::from(a.slab == slabs[1]);
            let v = version[s * pages as usize + a.page as usize];
            let got = &data[i * PAGE_SIZE..(i + 1) * PAGE_SIZE];
            if v == 0 {
                assert!(
                    got.iter().all(|&b| b == 0),
                    "client {client}: unwritten page not zero"
                );
            } else {
                assert_eq!(
                    got,
                    stamp(client, a.slab, a.page, v).as_slice(),
                    "client {client}"
                );
            }
        }
    }
}

fn churner(addr: SocketAddr, client: u64) {
    let mut c = Raw::hello(addr, client, b"");
    for _ in 0..100 {
        match c.alloc() {
            Reply::Slab(s) => {
                let p = page(client);
                assert_eq!(c.write(&[(PageAddr { slab: s, page: 0 }, &p)]), Reply::Done);
                assert_eq!(c.free(s), Reply::Done);
            }
            Reply::Error(Status::CapacityExhausted, _) => {}
            other => panic!("churner: {other:?}"),
        }
    }
}

#[test]
fn many_clients_at_once_each_see_only_their_own_data() {
    let donor = start(DonorConfig {
        capacity_bytes: 32 * SLAB_BYTES,
        ..config()
    });
    let addr = donor.local_addr();
    let mut threads = Vec::new();
    for client in 1..=8 {
        threads.push(std::thread::spawn(move || worker(addr, client)));
    }
    for client in 100..=101 {
        threads.push(std::thread::spawn(move || churner(addr, client)));
    }
    for t in threads {
        t.join().expect("a client thread failed");
    }
    let mut c = Raw::hello(addr, 999, b"");
    let st = c.stats();
    assert_eq!(
        st.slabs, 16,
        "the workers' slabs stay; the churners freed theirs"
    );
    assert_eq!(st.errors_total, 0);
    donor.stop().unwrap();
}
