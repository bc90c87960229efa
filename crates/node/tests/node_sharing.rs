//! Two clients of one real `farmem node`: both get slabs, the node counts their sum, the cap
//! holds (the Full error names the figures), pages come back intact, a freed slab is zeroed, and
//! a client's exit (drop, or kill -9 of a process holding slabs) frees its slabs for the other;
//! and `connect` returns with its reader thread running.

mod common;

use std::time::Duration;

use common::{Node, SLAB};
use farmem_node::NodeError;
use farmem_testkit::pages::{read_u64, Stamp, PAGE};
use farmem_testkit::scenario::{self, Scenario};

#[test]
fn two_clients_share_the_tier_within_its_cap_and_an_exit_frees_slabs() {
    let node = Node::with_slabs(4);
    let a = node.client();
    let b = node.client();
    assert_eq!(a.info().slab_bytes, SLAB);
    assert_eq!(a.info().capacity_bytes, 4 * SLAB);
    let a1 = a.alloc_slab().unwrap();
    let a2 = a.alloc_slab().unwrap();
    let b1 = b.alloc_slab().unwrap();
    let b2 = b.alloc_slab().unwrap();
    let s = node.stats();
    assert_eq!(
        s.used_bytes,
        4 * SLAB,
        "used = the sum of both clients' slabs"
    );
    assert_eq!(s.slabs, 4);
    let held: Vec<u64> = s
        .clients
        .iter()
        .map(|c| c.slabs)
        .filter(|n| *n > 0)
        .collect();
    assert_eq!(held, vec![2, 2], "each client is accounted: {s:?}");
    // The cap holds, for either client, and the refusal names the figures.
    for c in [&a, &b] {
        let e = c.alloc_slab().unwrap_err();
        assert!(
            matches!(e, NodeError::Full { used_bytes, capacity_bytes } if used_bytes == 4 * SLAB && capacity_bytes == 4 * SLAB),
            "{e}"
        );
        assert!(e.is_full());
        assert!(
            e.to_string().contains(&format!(
                "host tier full: {} of {} bytes in use",
                4 * SLAB,
                4 * SLAB
            )),
            "{e}"
        );
    }
    assert_eq!(node.stats().refusals.full, 2);
    // Pages written through one client's mapping read back intact.
    let stamp = Stamp {
        step: 1,
        salt: 0xA5,
    };
    let pages = (SLAB as usize) / PAGE;
    for (i, s) in [&a1, &a2, &b1, &b2].iter().enumerate() {
        for p in 0..pages {
            stamp.write_page(s.mapping.addr(), p, i as u64);
        }
    }
    for (i, s) in [&a1, &a2, &b1, &b2].iter().enumerate() {
        for p in 0..pages {
            stamp.check_page(s.mapping.addr(), p, i as u64);
        }
    }
    // One client goes away: its slabs are freed and the other can take them.
    drop((a1, a2));
    drop(a);
    node.wait_for("a closed client's slabs to be freed", |s| {
        s.used_bytes == 2 * SLAB
    });
    let b3 = b.alloc_slab().unwrap();
    let b4 = b.alloc_slab().unwrap();
    assert_eq!(node.stats().used_bytes, 4 * SLAB);
    // b's own pages were untouched by all this.
    for p in 0..pages {
        stamp.check_page(b1.mapping.addr(), p, 2);
        stamp.check_page(b2.mapping.addr(), p, 3);
    }
    drop((b3, b4));
}

#[test]
fn a_freed_slab_is_zeroed_even_in_a_mapping_kept_by_its_client() {
    let node = Node::with_slabs(1);
    let c = node.client();
    let slab = c.alloc_slab().unwrap();
    let pages = (SLAB as usize) / PAGE;
    let stamp = Stamp { step: 64, salt: 7 };
    for p in 0..pages {
        stamp.write_page(slab.mapping.addr(), p, 1);
    }
    // A misbehaving client frees the slab but keeps its mapping: the hole punched by the node
    // returns the memory, so the mapping now reads zeros.
    c.free_slab(slab.id).unwrap();
    for p in 0..pages {
        assert_eq!(read_u64(slab.mapping.addr() + p * PAGE), 0, "page {p}");
    }
    assert_eq!(node.stats().used_bytes, 0);
    // The next slab (the only one the cap allows) starts zeroed too.
    let again = c.alloc_slab().unwrap();
    for p in 0..pages {
        assert_eq!(read_u64(again.mapping.addr() + p * PAGE + 8), 0, "page {p}");
    }
}

#[test]
fn free_of_another_clients_slab_is_not_yours_and_frees_nothing() {
    let node = Node::with_slabs(2);
    let owner = node.client();
    let other = node.client();
    let slab = owner.alloc_slab().unwrap();
    let stamp = Stamp { step: 8, salt: 99 };
    stamp.write_page(slab.mapping.addr(), 0, 5);
    let e = other.free_slab(slab.id).unwrap_err();
    assert!(
        matches!(e, NodeError::NotYours { slab: named } if named == slab.id),
        "{e}"
    );
    assert!(matches!(
        other.free_slab(12345),
        Err(NodeError::NotYours { .. })
    ));
    let s = node.stats();
    assert_eq!(s.used_bytes, SLAB, "nothing was freed");
    assert_eq!(s.refusals.not_yours, 2);
    stamp.check_page(slab.mapping.addr(), 0, 5);
    // The owner still may.
    let id = slab.id;
    drop(slab);
    owner.free_slab(id).unwrap();
    assert_eq!(node.stats().used_bytes, 0);
}

/// In its own process: takes 3 slabs from the node at FARMEM_TEST_NODE, writes them, says
/// READY, and on GO dies by SIGKILL (kill -9: no destructor, no goodbye to the node).
#[test]
#[ignore = "run by kill_9_of_a_client_process_frees_its_slabs in a process of its own"]
fn scenario_client_holding_slabs() {
    let path = std::env::var("FARMEM_TEST_NODE").expect("FARMEM_TEST_NODE");
    let c = farmem_node::NodeClient::connect(path.as_ref(), Default::default()).unwrap();
    let slabs: Vec<_> = (0..3).map(|_| c.alloc_slab().unwrap()).collect();
    for s in &slabs {
        Stamp { step: 64, salt: 1 }.write_page(s.mapping.addr(), 0, 1);
    }
    scenario::ready();
    let me = rustix::process::getpid();
    rustix::process::kill_process(me, rustix::process::Signal::KILL).unwrap();
    std::thread::sleep(Duration::from_secs(600));
}

#[test]
fn kill_9_of_a_client_process_frees_its_slabs() {
    let node = Node::with_slabs(4);
    let survivor = node.client();
    let mine = survivor.alloc_slab().unwrap();
    let victim = Scenario::start(
        "scenario_client_holding_slabs",
        &[("FARMEM_TEST_NODE", common::text(&node.path).to_string())],
    );
    let s = node.stats();
    assert_eq!(s.used_bytes, 4 * SLAB);
    assert!(matches!(survivor.alloc_slab(), Err(NodeError::Full { .. })));
    let (status, _, stderr) = victim.go(Duration::from_secs(30));
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&status),
        Some(9),
        "the client died by SIGKILL: {status:?} {stderr}"
    );
    node.wait_for("a killed client's slabs to be freed", |s| {
        s.used_bytes == SLAB
    });
    let more: Vec<_> = (0..3).map(|_| survivor.alloc_slab().unwrap()).collect();
    assert_eq!(more.len(), 3);
    drop(mine);
}

/// `connect` returns only once its reader thread runs its own code (the thread hook first):
/// every fetch waits on that thread, so a runtime that registers regions right after
/// connecting (a forked child) must not leave it starting, where the thread library reads
/// program data that may be evicted.
#[test]
fn connect_returns_once_the_reader_thread_has_started() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    let node = Node::with_slabs(4);
    for _ in 0..20 {
        let started = Arc::new(AtomicUsize::new(0));
        let hook = {
            let started = started.clone();
            Arc::new(move || {
                started.fetch_add(1, Ordering::SeqCst);
            })
        };
        let client = farmem_node::NodeClient::connect(
            &node.path,
            farmem_node::NodeClientConfig {
                thread_hook: Some(hook),
                ..Default::default()
            },
        )
        .unwrap();
        assert_eq!(
            started.load(Ordering::SeqCst),
            1,
            "the reader thread's hook had not run when connect returned"
        );
        drop(client);
    }
}
