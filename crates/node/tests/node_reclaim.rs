//! Shrinking a real `farmem node`: after a RESIZE below what clients hold, the largest user is
//! asked (RECLAIM) for the excess, never for more than it holds, and asked again only after its
//! earlier ask lapsed; new slabs are refused meanwhile; the metrics endpoint counts it all.
//! Under --keep-free above the host's available memory, no slab is lent (Pressure).

mod common;

use std::io::{Read, Write};
use std::time::Duration;

use common::{Node, SLAB};
use farmem_node::{NodeError, Reclaim};

fn scrape(addr: &str) -> String {
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    write!(s, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    assert!(out.starts_with("HTTP/1.1 200 OK"), "{out}");
    out
}

/// The metrics address the node logged (`metrics at http://ADDR/metrics`).
fn metrics_addr(node: &mut Node) -> String {
    let until = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let log = node.stderr();
        if let Some(rest) = log.split("metrics at http://").nth(1) {
            return rest.split('/').next().unwrap().to_string();
        }
        assert!(
            std::time::Instant::now() < until,
            "no metrics address in\n{log}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_resize_below_use_asks_the_largest_user_for_the_excess() {
    let mut node = Node::start(&[
        "--capacity",
        &(8 * SLAB).to_string(),
        "--metrics",
        "127.0.0.1:0",
    ]);
    let metrics = metrics_addr(&mut node);
    let big = node.client();
    let small = node.client();
    let mut big_slabs: Vec<_> = (0..6).map(|_| big.alloc_slab().unwrap()).collect();
    let small_slabs: Vec<_> = (0..2).map(|_| small.alloc_slab().unwrap()).collect();

    node.client().resize(3 * SLAB).unwrap();
    // Excess: 8 − 3 = 5 slabs, all asked of the largest user (it holds 6).
    let ask = big
        .reclaims()
        .recv_timeout(Duration::from_secs(5))
        .expect("the largest user is asked to give slabs back");
    assert_eq!(ask, Reclaim { slabs: 5 });
    assert!(
        small.reclaims().try_recv().is_err(),
        "the small user is not asked"
    );
    // Nothing new is lent while over capacity.
    let e = small.alloc_slab().unwrap_err();
    assert!(
        matches!(e, NodeError::Full { used_bytes, capacity_bytes } if used_bytes == 8 * SLAB && capacity_bytes == 3 * SLAB),
        "{e}"
    );

    // It gives back only 3: once the ask lapses (~2 s) it is asked for the 2 still over.
    for s in big_slabs.drain(..3) {
        let id = s.id;
        drop(s);
        big.free_slab(id).unwrap();
    }
    let again = big
        .reclaims()
        .recv_timeout(Duration::from_secs(10))
        .expect("asked again for what is still over");
    assert_eq!(again, Reclaim { slabs: 2 });
    for s in big_slabs.drain(..2) {
        let id = s.id;
        drop(s);
        big.free_slab(id).unwrap();
    }
    let st = node.wait_for("the excess to be given back", |s| s.used_bytes == 3 * SLAB);
    assert_eq!(st.reclaim_requests_total, 2);
    assert_eq!(st.reclaimed_slabs_total, 5);
    assert_eq!(st.capacity_bytes, 3 * SLAB);

    // The resize's own connection counts as a client until the node sees it close: scrape
    // until it has (it was still counted once, under load).
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    let text = loop {
        let text = scrape(&metrics);
        if text.contains("farmem_node_clients 2\n") || std::time::Instant::now() > deadline {
            break text;
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let me_uid = rustix::process::getuid().as_raw();
    for line in [
        format!("farmem_node_capacity_bytes {}\n", 3 * SLAB),
        format!("farmem_node_used_bytes {}\n", 3 * SLAB),
        "farmem_node_clients 2\n".to_string(),
        format!(
            "farmem_node_slabs{{pid=\"{}\",uid=\"{me_uid}\"}} 2\n",
            std::process::id()
        ),
        "farmem_node_reclaim_requests_total 2\n".to_string(),
        "farmem_node_reclaimed_slabs_total 5\n".to_string(),
        "farmem_node_refusals_total{reason=\"full\"} 1\n".to_string(),
        "farmem_node_refusals_total{reason=\"pressure\"} 0\n".to_string(),
    ] {
        assert!(text.contains(&line), "{line:?} missing from\n{text}");
    }
    drop((big_slabs, small_slabs));
}

#[test]
fn a_resize_above_the_machines_memory_is_refused() {
    let node = Node::with_slabs(2);
    let e = node.client().resize(u64::MAX / 2).unwrap_err();
    assert!(
        matches!(e, NodeError::Refused { ref message } if message.contains("more than")),
        "{e}"
    );
    assert_eq!(node.stats().capacity_bytes, 2 * SLAB);
}

#[test]
fn below_keep_free_no_slab_is_lent() {
    // A watermark no host reaches (all its memory but a page; at or above it the node refuses
    // to start): the node is under pressure from its first check.
    let keep_free =
        farmem_donor::host::mem_total_bytes().expect("MemTotal in /proc/meminfo") - 4096;
    let node = Node::start(&[
        "--capacity",
        &(4 * SLAB).to_string(),
        "--keep-free",
        &keep_free.to_string(),
    ]);
    let c = node.client();
    let e = c.alloc_slab().unwrap_err();
    assert!(matches!(e, NodeError::Pressure), "{e}");
    assert!(e.is_full());
    let s = node.stats();
    assert!(s.under_pressure);
    assert_eq!(s.keep_free_bytes, Some(keep_free));
    assert!(s.mem_available_bytes.is_some());
    assert_eq!(s.refusals.pressure, 1);
}
