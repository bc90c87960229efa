//! The client against hostile and broken peers (hand-made on 127.0.0.1): a donor that stalls, one
//! that dies mid-request, one that sends garbage, one that refuses the token, and requests that
//! break protocol limits. Each must give its own clear error, never a hang.

mod common;

use std::io::Write;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;
use farmem_proto::{encode_error, Opcode, PageAddr, Status, MAX_BATCH_PAGES, PAGE_SIZE};
use farmem_transport::{ClientConfig, Completion, DonorClient, PageWrite, TransportError};

/// The request timeout of the tests whose point is a timeout: short enough to keep them quick,
/// long enough that a loaded 2-core machine still completes HELLO within it.
const SHORT_TIMEOUT: Duration = Duration::from_secs(2);

/// For tests that expect a timeout.
fn quick_config() -> ClientConfig {
    ClientConfig {
        request_timeout: SHORT_TIMEOUT,
        ..patient_config()
    }
}

/// For every other test: a timeout no scheduling delay reaches, so a slow machine cannot turn
/// the error a test expects (or a success) into a timeout.
fn patient_config() -> ClientConfig {
    ClientConfig {
        client_id: 0xC0FFEE,
        connect_timeout: Duration::from_secs(30),
        request_timeout: Duration::from_secs(60),
        ..ClientConfig::default()
    }
}

/// The error and its sources, as `farmem` prints them.
fn chain(err: &dyn std::error::Error) -> String {
    let mut s = err.to_string();
    let mut cur = err.source();
    while let Some(e) = cur {
        s.push_str(": ");
        s.push_str(&e.to_string());
        cur = e.source();
    }
    s
}

/// Generous upper bound for "returned instead of hanging": far above SHORT_TIMEOUT.
const NO_HANG: Duration = Duration::from_secs(30);

#[test]
fn a_donor_that_stalls_after_hello_gives_timeout_then_the_client_reconnects() {
    let peer = spawn_peer(|mut stream, _| {
        if handshake(&mut stream, |_| true).is_some() {
            stall(&mut stream);
        }
    });
    let client = DonorClient::connect(&peer.addr, quick_config()).unwrap();
    let start = Instant::now();
    let err = client.alloc_slab().unwrap_err();
    assert!(start.elapsed() < NO_HANG, "took {:?}", start.elapsed());
    assert!(
        matches!(err, TransportError::Timeout { op: "alloc_slab", after, .. } if after == SHORT_TIMEOUT),
        "{err}"
    );
    assert!(err.to_string().contains("2000 ms"), "{err}");
    // The timed-out connection was abandoned: the next request opens a new one (which stalls too).
    let err = client.stats().unwrap_err();
    assert!(matches!(err, TransportError::Timeout { .. }), "{err}");
    assert_eq!(peer.connections.load(Ordering::SeqCst), 2);
    assert_eq!(client.counters().timeouts_total, 2);
    assert_eq!(client.counters().reconnects_total, 1);
}

#[test]
fn wait_until_gives_up_early_on_a_slow_donor_and_keeps_the_request_in_flight() {
    let peer = spawn_peer(|mut stream, _| {
        if handshake(&mut stream, |_| true).is_some() {
            stall(&mut stream);
        }
    });
    let client = DonorClient::connect(&peer.addr, quick_config()).unwrap();
    let mut p = client
        .submit_read(&[PageAddr { slab: 0, page: 0 }])
        .unwrap();
    // Early: no answer yet, and the request is not given up (nor the connection).
    let early = Instant::now() + Duration::from_millis(100);
    assert!(p.wait_until(early).is_none());
    assert!(Instant::now() >= early);
    assert_eq!(client.counters().timeouts_total, 0);
    // Past the request timeout it ends as a plain wait does: a timeout.
    let late = Instant::now() + SHORT_TIMEOUT * 2;
    let err = p
        .wait_until(late)
        .expect("answered by the timeout")
        .unwrap_err();
    assert!(matches!(err, TransportError::Timeout { .. }), "{err}");
    assert_eq!(client.counters().timeouts_total, 1);
}

#[test]
fn a_short_wait_that_ends_inside_a_batch_of_pages_keeps_the_connection() {
    // The donor sends a 64-page answer in two halves, 300 ms apart; the waiter gives up after
    // 50 ms (a prefetch batch waits only the failover delay). The frame has begun when the
    // deadline passes: the reader finishes it instead of breaking the stream (which made a
    // healthy donor suspected), and the pages are there for the next wait.
    let store: Store = Arc::default();
    let slabs = Arc::new(AtomicUsize::new(1));
    let s = Arc::clone(&store);
    let peer = spawn_peer(move |mut stream, _| {
        if handshake(&mut stream, |_| true).is_none() {
            return;
        }
        while let Some((header, payload)) = next_request(&mut stream) {
            let mut out = Vec::new();
            answer(&header, &payload, &s, &slabs, &mut out);
            let half = out.len() / 2;
            if stream.write_all(&out[..half]).is_err() {
                return;
            }
            let _ = stream.flush();
            std::thread::sleep(Duration::from_millis(300));
            if stream.write_all(&out[half..]).is_err() {
                return;
            }
        }
    });
    let client = DonorClient::connect(&peer.addr, patient_config()).unwrap();
    let addrs: Vec<PageAddr> = (0..64).map(|page| PageAddr { slab: 0, page }).collect();
    let pages: Vec<Vec<u8>> = (0..64).map(page).collect();
    let writes: Vec<PageWrite<'_>> = addrs
        .iter()
        .zip(&pages)
        .map(|(&addr, data)| PageWrite { addr, data })
        .collect();
    client.write_pages(&writes).unwrap();
    for _ in 0..3 {
        let mut p = client.submit_read(&addrs).unwrap();
        let data = match p.wait_until(Instant::now() + Duration::from_millis(50)) {
            Some(r) => r,
            None => p.wait(),
        }
        .unwrap_or_else(|e| panic!("the read failed: {}", chain(&e)));
        let Completion::Pages(data) = data else {
            panic!("not pages: {data:?}");
        };
        assert_eq!(data, pages.concat());
    }
    assert_eq!(peer.connections.load(Ordering::SeqCst), 1);
    assert_eq!(client.counters().reconnects_total, 0);
}

#[test]
fn a_donor_that_stops_inside_a_batch_of_pages_is_a_lost_connection_after_the_request_timeout() {
    // Half an answer, then nothing: the reader finishes a begun frame within the request
    // timeout only, so a short wait still ends (early, with no answer) and the request fails
    // once the timeout is up, instead of hanging; the next request reconnects.
    let peer = spawn_peer(|mut stream, index| {
        if handshake(&mut stream, |_| true).is_none() {
            return;
        }
        let store: Store = Arc::default();
        let slabs = AtomicUsize::new(1);
        while let Some((header, payload)) = next_request(&mut stream) {
            let mut out = Vec::new();
            answer(&header, &payload, &store, &slabs, &mut out);
            if index == 0 {
                let _ = stream.write_all(&out[..out.len() / 2]);
                stall(&mut stream);
                return;
            }
            if stream.write_all(&out).is_err() {
                return;
            }
        }
    });
    let client = DonorClient::connect(&peer.addr, quick_config()).unwrap();
    let addrs: Vec<PageAddr> = (0..64).map(|page| PageAddr { slab: 0, page }).collect();
    let start = Instant::now();
    let mut p = client.submit_read(&addrs).unwrap();
    let err = match p.wait_until(Instant::now() + Duration::from_millis(50)) {
        Some(r) => r.unwrap_err(),
        None => p.wait().unwrap_err(),
    };
    assert!(start.elapsed() < NO_HANG, "took {:?}", start.elapsed());
    assert!(
        matches!(
            err,
            TransportError::Disconnected { .. } | TransportError::Timeout { .. }
        ),
        "{}",
        chain(&err)
    );
    let mut out = vec![0u8; 64 * PAGE_SIZE];
    client.read_pages(&addrs, &mut out).unwrap();
    assert_eq!(peer.connections.load(Ordering::SeqCst), 2);
}

#[test]
fn a_donor_that_never_answers_hello_gives_timeout_at_connect() {
    let peer = spawn_peer(|mut stream, _| stall(&mut stream));
    let start = Instant::now();
    let err = DonorClient::connect(&peer.addr, quick_config()).unwrap_err();
    assert!(start.elapsed() < NO_HANG);
    assert!(
        matches!(err, TransportError::Timeout { op: "hello", .. }),
        "{err}"
    );
}

#[test]
fn a_donor_that_dies_mid_request_gives_disconnected_then_reconnect_works() {
    let store: Store = Arc::default();
    let slabs = Arc::new(AtomicUsize::new(1));
    let hellos = Arc::new(Mutex::new(Vec::new()));
    let (s, h) = (Arc::clone(&store), Arc::clone(&hellos));
    let peer = spawn_peer(move |mut stream, index| {
        let Some(hello) = handshake(&mut stream, |_| true) else {
            return;
        };
        h.lock().unwrap().push(hello);
        if index == 0 {
            // Take one request, then die without answering.
            let _ = next_request(&mut stream);
            return;
        }
        serve(&mut stream, &s, &slabs);
    });
    let client = DonorClient::connect(&peer.addr, patient_config()).unwrap();
    let addr = PageAddr { slab: 0, page: 3 };
    let mut out = vec![0u8; PAGE_SIZE];
    let err = client.read_pages(&[addr], &mut out).unwrap_err();
    assert!(
        matches!(
            err,
            TransportError::Disconnected {
                op: "read_pages",
                ..
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("reconnects"), "{err}");

    // The next call reconnects, says HELLO with the same client id, and works.
    let data = page(42);
    client
        .write_pages(&[PageWrite { addr, data: &data }])
        .unwrap();
    client.read_pages(&[addr], &mut out).unwrap();
    assert_eq!(out, data);
    let hellos = hellos.lock().unwrap();
    assert_eq!(hellos.len(), 2);
    assert!(hellos.iter().all(|h| h.client_id == 0xC0FFEE));
    assert_eq!(client.counters().reconnects_total, 1);
}

#[test]
fn every_request_in_flight_fails_with_disconnected_when_the_connection_drops() {
    let peer = spawn_peer(|mut stream, _| {
        if handshake(&mut stream, |_| true).is_some() {
            for _ in 0..8 {
                let _ = next_request(&mut stream);
            }
            // Drop the connection with all eight unanswered.
        }
    });
    let client = DonorClient::connect(&peer.addr, patient_config()).unwrap();
    let pending: Vec<_> = (0..8)
        .map(|i| {
            client
                .submit_read(&[PageAddr { slab: 0, page: i }])
                .unwrap()
        })
        .collect();
    for p in pending {
        let err = p.wait().unwrap_err();
        assert!(matches!(err, TransportError::Disconnected { .. }), "{err}");
    }
}

#[test]
fn garbage_from_the_donor_is_a_protocol_error() {
    let peer = spawn_peer(|mut stream, _| {
        if handshake(&mut stream, |_| true).is_some() && next_request(&mut stream).is_some() {
            let _ = stream.write_all(b"HTTP/1.1 400 Bad Request\r\n\r\nnot a farmem donor");
            stall(&mut stream);
        }
    });
    let client = DonorClient::connect(&peer.addr, patient_config()).unwrap();
    let err = client.alloc_slab().unwrap_err();
    assert!(
        matches!(
            err,
            TransportError::Protocol {
                op: "alloc_slab",
                ..
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("bad magic"), "{err}");
}

#[test]
fn garbage_instead_of_the_hello_answer_is_a_protocol_error() {
    let peer = spawn_peer(|mut stream, _| {
        let _ = next_request(&mut stream);
        let _ = stream.write_all(&[0xAB; 64]);
        stall(&mut stream);
    });
    let err = DonorClient::connect(&peer.addr, patient_config()).unwrap_err();
    assert!(
        matches!(err, TransportError::Protocol { op: "hello", .. }),
        "{err}"
    );
}

#[test]
fn a_response_of_the_wrong_kind_is_a_protocol_error() {
    let peer = spawn_peer(|mut stream, _| {
        if handshake(&mut stream, |_| true).is_some() {
            if let Some((h, _)) = next_request(&mut stream) {
                // Answer a READ_PAGES with an ALLOC_SLAB response.
                let mut out = Vec::new();
                farmem_proto::encode_slab_allocated(&mut out, h.request_id, 5);
                let _ = stream.write_all(&out);
            }
            stall(&mut stream);
        }
    });
    let client = DonorClient::connect(&peer.addr, patient_config()).unwrap();
    let mut out = vec![0u8; PAGE_SIZE];
    let err = client
        .read_pages(&[PageAddr { slab: 0, page: 0 }], &mut out)
        .unwrap_err();
    assert!(matches!(err, TransportError::Protocol { .. }), "{err}");
    assert!(err.to_string().contains("alloc_slab response"), "{err}");
}

#[test]
fn a_wrong_token_is_refused_with_a_clear_error() {
    let peer = spawn_peer(|mut stream, _| {
        let _ = handshake(&mut stream, |h| h.proves(b"right"));
    });
    let cfg = ClientConfig {
        token: Some(b"wrong".to_vec()),
        ..patient_config()
    };
    let err = DonorClient::connect(&peer.addr, cfg).unwrap_err();
    assert!(
        matches!(
            err,
            TransportError::Refused {
                status: Status::AuthFailed,
                ..
            }
        ),
        "{err}"
    );
    let msg = err.to_string();
    assert!(
        msg.contains(&peer.addr) && msg.contains("--token-file"),
        "{msg}"
    );
    let cfg = ClientConfig {
        token: Some(b"right".to_vec()),
        ..patient_config()
    };
    DonorClient::connect(&peer.addr, cfg).unwrap();
}

#[test]
fn an_error_status_is_reported_with_the_donors_message_and_the_connection_stays_up() {
    let (peer, _store) = good_donor();
    let client = DonorClient::connect(&peer.addr, patient_config()).unwrap();
    let mut out = vec![0u8; PAGE_SIZE];
    let err = client
        .read_pages(&[PageAddr { slab: 9, page: 0 }], &mut out)
        .unwrap_err();
    assert!(
        matches!(
            err,
            TransportError::Status {
                status: Status::NoSuchSlab,
                op: "read_pages",
                ..
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("slab 9 does not exist"), "{err}");
    assert_eq!(client.alloc_slab().unwrap(), 0);
    assert_eq!(peer.connections.load(Ordering::SeqCst), 1);
}

#[test]
fn requests_over_the_protocol_limits_are_rejected_before_sending() {
    let requests = Arc::new(AtomicUsize::new(0));
    let seen = Arc::clone(&requests);
    let peer = spawn_peer(move |mut stream, _| {
        if handshake(&mut stream, |_| true).is_some() {
            while let Some((h, _)) = next_request(&mut stream) {
                seen.fetch_add(1, Ordering::SeqCst);
                let mut out = Vec::new();
                encode_error(
                    &mut out,
                    h.opcode,
                    h.request_id,
                    Status::Internal,
                    "unexpected",
                );
                let _ = stream.write_all(&out);
            }
        }
    });
    let client = DonorClient::connect(&peer.addr, patient_config()).unwrap();
    let too_many = vec![PageAddr { slab: 0, page: 0 }; MAX_BATCH_PAGES + 1];
    let err = client.submit_read(&too_many).unwrap_err();
    assert!(
        matches!(
            err,
            TransportError::Invalid {
                op: "read_pages",
                ..
            }
        ),
        "{err}"
    );
    assert!(chain(&err).contains("257 pages"), "{err}");
    let err = client.submit_read(&[]).unwrap_err();
    assert!(matches!(err, TransportError::Invalid { .. }), "{err}");

    let data = page(1);
    let writes: Vec<_> = too_many
        .iter()
        .map(|&addr| PageWrite { addr, data: &data })
        .collect();
    let err = client.write_pages(&writes).unwrap_err();
    assert!(matches!(err, TransportError::Invalid { .. }), "{err}");
    let short = [0u8; 100];
    let err = client
        .write_pages(&[PageWrite {
            addr: too_many[0],
            data: &short,
        }])
        .unwrap_err();
    assert!(chain(&err).contains("100 bytes"), "{err}");

    let mut out = vec![0u8; 10];
    let err = client.read_pages(&too_many[..2], &mut out).unwrap_err();
    assert!(
        matches!(
            err,
            TransportError::OutputBuffer {
                expected: 8192,
                got: 10
            }
        ),
        "{err}"
    );
    let err = DonorClient::connect(
        &peer.addr,
        ClientConfig {
            token: Some(vec![b'x'; 300]),
            ..patient_config()
        },
    )
    .unwrap_err();
    assert!(
        matches!(err, TransportError::TokenLength { len: 300 }),
        "{err}"
    );
    assert!(err.to_string().contains("1 to 256 bytes"), "{err}");

    // Nothing above reached the peer; a valid request still does.
    assert_eq!(requests.load(Ordering::SeqCst), 0);
    assert!(client.stats().is_err());
    assert_eq!(requests.load(Ordering::SeqCst), 1);
}

#[test]
fn link_delay_is_added_to_every_request_without_serializing_the_pipeline() {
    let (peer, _store) = good_donor();
    let cfg = ClientConfig {
        link_delay_us: 20_000,
        ..patient_config()
    };
    let client = DonorClient::connect(&peer.addr, cfg).unwrap();
    let start = Instant::now();
    let slab = client.alloc_slab().unwrap();
    assert!(start.elapsed() >= Duration::from_millis(20));
    // Four pipelined requests each get the delay from their own arrival.
    let start = Instant::now();
    let pending: Vec<_> = (0..4)
        .map(|i| client.submit_read(&[PageAddr { slab, page: i }]).unwrap())
        .collect();
    for p in pending {
        assert!(matches!(p.wait().unwrap(), Completion::Pages(d) if d.len() == PAGE_SIZE));
    }
    assert!(start.elapsed() >= Duration::from_millis(20));
}

#[test]
fn responses_for_requests_nobody_waits_for_yet_are_kept_for_their_waiter() {
    let (peer, _store) = good_donor();
    let client = DonorClient::connect(&peer.addr, patient_config()).unwrap();
    let slab = client.alloc_slab().unwrap();
    let data: Vec<Vec<u8>> = (0..3).map(|i| page(100 + i)).collect();
    let writes: Vec<_> = data
        .iter()
        .enumerate()
        .map(|(i, d)| PageWrite {
            addr: PageAddr {
                slab,
                page: i as u32,
            },
            data: d,
        })
        .collect();
    client.write_pages(&writes).unwrap();
    // Three reads in flight; the last one is waited for first, so its waiter reads (and files)
    // the two earlier responses on the way; then the earlier waiters collect theirs.
    let pending: Vec<_> = (0..3)
        .map(|i| client.submit_read(&[PageAddr { slab, page: i }]).unwrap())
        .collect();
    let mut pending: Vec<_> = pending.into_iter().enumerate().collect();
    pending.reverse();
    for (i, p) in pending {
        assert_eq!(p.wait().unwrap(), Completion::Pages(data[i].clone()));
    }
    // Requests waited for from several threads at once each get their own answer.
    let threads: Vec<_> = (0..3u32)
        .map(|i| {
            let p = client.submit_read(&[PageAddr { slab, page: i }]).unwrap();
            std::thread::spawn(move || (i, p.wait().unwrap()))
        })
        .collect();
    for t in threads {
        let (i, got) = t.join().unwrap();
        assert_eq!(got, Completion::Pages(data[i as usize].clone()));
    }
}

#[test]
fn a_dropped_pending_request_does_not_disturb_the_others() {
    let (peer, _store) = good_donor();
    let client = DonorClient::connect(&peer.addr, patient_config()).unwrap();
    let slab = client.alloc_slab().unwrap();
    let data = page(7);
    let addr = PageAddr { slab, page: 1 };
    drop(
        client
            .submit_write(&[PageWrite { addr, data: &data }])
            .unwrap(),
    );
    let mut out = vec![0u8; PAGE_SIZE];
    // Same connection, in order: the dropped write was still executed before this read.
    client.read_pages(&[addr], &mut out).unwrap();
    assert_eq!(out, data);
    assert_eq!(Opcode::ReadPages.name(), "read_pages");
}

/// The SIGPIPE scenario: a donor that closes its connection right after HELLO, then a client
/// that keeps sending. Writing to the closed connection makes the kernel raise SIGPIPE unless the
/// send says MSG_NOSIGNAL; an unmodified C program (which the runtime lives in, through the
/// preload library) keeps SIGPIPE's default action, which kills it.
fn write_to_a_closed_donor_with_default_sigpipe() {
    // SAFETY: `signal` with SIG_DFL installs no handler code; this process (the child copy of the
    // test binary, or a human running the ignored test) exists only to run this scenario.
    let previous = unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    assert_ne!(previous, libc::SIG_ERR, "resetting SIGPIPE failed");
    let (closed_tx, closed_rx) = std::sync::mpsc::channel();
    let peer = spawn_peer(move |mut stream, _| {
        if handshake(&mut stream, |_| true).is_some() {
            drop(stream); // FIN: the client's socket goes to CLOSE_WAIT
            let _ = closed_tx.send(());
        }
    });
    let client = DonorClient::connect(&peer.addr, patient_config()).unwrap();
    closed_rx
        .recv_timeout(NO_HANG)
        .expect("the fake donor never closed");
    let page = [5u8; PAGE_SIZE];
    let write = [PageWrite {
        addr: PageAddr { slab: 1, page: 0 },
        data: &page,
    }];
    // The first send still goes out (the donor's kernel answers it with a reset); a later one
    // meets the reset socket. Every send must fail with an error, never a signal.
    let mut in_flight = Vec::new();
    let err = loop {
        match client.submit_write(&write) {
            Ok(p) => in_flight.push(p),
            Err(e) => break e,
        }
        assert!(
            in_flight.len() < 10_000,
            "sends to a closed donor kept succeeding"
        );
    };
    assert!(err.is_connection_failure(), "{err}");
    println!("SIGPIPE-SCENARIO-DONE: {err}");
}

#[test]
#[ignore = "run in a child process by a_send_to_a_closed_donor_is_an_error_not_sigpipe"]
fn sigpipe_child() {
    write_to_a_closed_donor_with_default_sigpipe();
}

#[test]
fn a_send_to_a_closed_donor_is_an_error_not_sigpipe() {
    farmem_testkit::sigpipe::assert_scenario_survives_sigpipe(
        "sigpipe_child",
        "SIGPIPE-SCENARIO-DONE",
        "the client was killed by SIGPIPE writing to a closed donor connection",
    );
}
