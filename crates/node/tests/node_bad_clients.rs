//! Clients that send garbage to a real `farmem node`: random bytes, an oversized length, an
//! unknown opcode, half a frame then silence, no HELLO at all. Each such connection is dropped
//! (its slabs freed, one warn line); a well-behaved client connected before and one connected
//! after keep being served.

mod common;

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use common::{Node, SLAB};
use farmem_node::wire::{ClientFrame, PROTOCOL_VERSION};
use farmem_testkit::pages::Stamp;

/// A raw connection that has said HELLO (and read the WELCOME).
fn hello(node: &Node) -> UnixStream {
    let mut s = UnixStream::connect(&node.path).unwrap();
    s.write_all(
        &ClientFrame::Hello {
            version: PROTOCOL_VERSION,
        }
        .encode(),
    )
    .unwrap();
    let mut welcome = [0u8; 27];
    s.read_exact(&mut welcome).unwrap();
    assert_eq!(welcome[4], 0x81, "WELCOME");
    s
}

/// Waits for the node to close `s` (reading and dropping whatever it sends first); returns how
/// long that took. Fails if it stays open past `limit`.
fn closed_within(mut s: UnixStream, limit: Duration) -> Duration {
    let start = Instant::now();
    s.set_read_timeout(Some(limit)).unwrap();
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return start.elapsed(),
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return start.elapsed(),
            Err(e) => panic!("the node kept a bad connection open for {limit:?}: {e}"),
        }
        assert!(
            start.elapsed() < limit,
            "the node kept a bad connection open"
        );
    }
}

/// The well-behaved client still works: a new slab, written and read back, then freed.
fn still_served(c: &farmem_node::NodeClient) {
    let s = c
        .alloc_slab()
        .expect("a well-behaved client is still served");
    let stamp = Stamp { step: 32, salt: 3 };
    stamp.write_page(s.mapping.addr(), 1, 9);
    stamp.check_page(s.mapping.addr(), 1, 9);
    let id = s.id;
    drop(s);
    c.free_slab(id).unwrap();
}

#[test]
fn garbage_drops_only_the_connection_that_sent_it() {
    let mut node = Node::with_slabs(8);
    let before = node.client();
    let kept = before.alloc_slab().unwrap();
    Stamp { step: 1, salt: 1 }.write_page(kept.mapping.addr(), 0, 1);

    // Random bytes before any HELLO.
    let mut s = UnixStream::connect(&node.path).unwrap();
    let mut x: u32 = 0x1234_5678;
    let noise: Vec<u8> = (0..256)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x as u8
        })
        .collect();
    let _ = s.write_all(&noise);
    closed_within(s, Duration::from_secs(3));
    still_served(&before);

    // An oversized length, after a proper HELLO and a slab: the slab is freed with it.
    let mut s = hello(&node);
    s.write_all(&ClientFrame::Alloc { req: 1 }.encode())
        .unwrap();
    let mut slab_reply = [0u8; 21];
    s.read_exact(&mut slab_reply).unwrap();
    assert_eq!(slab_reply[4], 0x82, "SLAB");
    assert_eq!(node.stats().used_bytes, 2 * SLAB);
    s.write_all(&[0xff, 0xff, 0xff, 0x7f]).unwrap();
    closed_within(s, Duration::from_secs(3));
    node.wait_for("the bad client's slab to be freed", |s| {
        s.used_bytes == SLAB
    });
    still_served(&before);

    // An unknown opcode.
    let mut s = hello(&node);
    s.write_all(&[0, 0, 0, 0, 0x42]).unwrap();
    closed_within(s, Duration::from_secs(3));
    // A node frame sent by a client, and a request before HELLO.
    let mut s = hello(&node);
    s.write_all(&[4, 0, 0, 0, 0x83, 1, 0, 0, 0]).unwrap();
    closed_within(s, Duration::from_secs(3));
    let mut s = UnixStream::connect(&node.path).unwrap();
    s.write_all(&ClientFrame::Alloc { req: 1 }.encode())
        .unwrap();
    closed_within(s, Duration::from_secs(3));
    still_served(&before);

    // Half a frame then silence, and no HELLO at all: both cut after the frame deadline (5 s),
    // while the others are served meanwhile.
    let mut half = hello(&node);
    half.write_all(&ClientFrame::Free { req: 1, slab: 1 }.encode()[..6])
        .unwrap();
    let silent = UnixStream::connect(&node.path).unwrap();
    let waiter = std::thread::spawn(move || closed_within(silent, Duration::from_secs(30)));
    still_served(&before);
    let took = closed_within(half, Duration::from_secs(30));
    assert!(
        took >= Duration::from_secs(3) && took < Duration::from_secs(20),
        "half a frame was cut after {took:?}"
    );
    let took = waiter.join().unwrap();
    assert!(
        took >= Duration::from_secs(3) && took < Duration::from_secs(20),
        "a connection without HELLO was cut after {took:?}"
    );

    // A client connected after all this is served too, and the first one kept its data.
    let after = node.client();
    still_served(&after);
    still_served(&before);
    Stamp { step: 1, salt: 1 }.check_page(kept.mapping.addr(), 0, 1);
    let s = node.stats();
    assert!(s.refusals.bad_request >= 6, "{:?}", s.refusals);
    let log = node.stderr();
    let warns = log
        .lines()
        .filter(|l| l.contains("disconnected client pid"))
        .count();
    assert!(warns >= 6, "one warn line per bad client:\n{log}");
    assert!(log.contains("no HELLO within"), "{log}");
    assert!(log.contains("sent part of a frame"), "{log}");
    assert!(log.contains("above the limit"), "{log}");
}

#[test]
fn a_client_of_another_protocol_version_is_refused_clearly() {
    let node = Node::with_slabs(2);
    let mut s = UnixStream::connect(&node.path).unwrap();
    s.write_all(&ClientFrame::Hello { version: 999 }.encode())
        .unwrap();
    let mut reply = Vec::new();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let _ = s.read_to_end(&mut reply);
    let (frame, _) = farmem_node::wire::decode_node_frame(&reply)
        .unwrap()
        .expect("an ERROR frame");
    match frame {
        farmem_node::wire::NodeFrame::Error { code, message, .. } => {
            assert_eq!(code, farmem_node::wire::ErrorCode::Version);
            assert!(message.contains("same farmem version"), "{message}");
        }
        other => panic!("{other:?}"),
    }
}
