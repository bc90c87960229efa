//! The donor target's body: a session of arbitrary frames against a real donor (in-process, on
//! 127.0.0.1, no token), sent after a genuine handshake so the data path is reached. Shared with
//! `crates/donor/tests/fuzz_corpus.rs`, which replays the corpus through it on stable.
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::Duration;

use farmem_donor::{DonorConfig, DonorServer, RunningDonor};
use farmem_proto::{encode_auth, encode_hello, read_frame, AuthMode, PAGE_SIZE};

/// The donor every session talks to (small slabs, little capacity, short timeouts).
pub fn donor() -> SocketAddr {
    static DONOR: OnceLock<RunningDonor> = OnceLock::new();
    DONOR
        .get_or_init(|| {
            DonorServer::bind(DonorConfig {
                listen: "127.0.0.1:0".into(),
                capacity_bytes: 64 * 16 * PAGE_SIZE as u64,
                slab_size_bytes: 16 * PAGE_SIZE as u64,
                orphan_grace: Duration::ZERO,
                stall_timeout: Duration::from_millis(200),
                hello_timeout: Duration::from_millis(500),
                ..DonorConfig::default()
            })
            .expect("the fuzz donor binds on 127.0.0.1")
            .spawn()
        })
        .local_addr()
}

/// Authenticates a new client, sends `data` as the rest of the session, and reads answers
/// until the donor closes or goes quiet. The donor must survive: the next session must still
/// authenticate (checked by the caller's next run, and at the end of the replay test).
pub fn run_session(addr: SocketAddr, data: &[u8]) {
    static NEXT_ID: AtomicU64 = AtomicU64::new(1);
    let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
    let Ok(mut s) = TcpStream::connect(addr) else {
        panic!("the donor stopped accepting connections");
    };
    s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    let mut f = Vec::new();
    let mut buf = Vec::new();
    encode_hello(&mut f, 1);
    s.write_all(&f).unwrap();
    read_frame(&mut s, &mut buf).expect("the donor answers HELLO");
    f.clear();
    // This donor has no token: any proof passes.
    encode_auth(&mut f, 2, id, AuthMode::Register, &[0; 32], &[7; 32]);
    s.write_all(&f).unwrap();
    read_frame(&mut s, &mut buf).expect("the donor answers AUTH");
    let _ = s.write_all(data);
    let _ = s.shutdown(std::net::Shutdown::Write);
    s.set_read_timeout(Some(Duration::from_millis(300)))
        .unwrap();
    let mut sink = [0u8; 64 * 1024];
    while let Ok(n) = s.read(&mut sink) {
        if n == 0 {
            break;
        }
    }
}
