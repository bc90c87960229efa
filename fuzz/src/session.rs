//! The donor target's body: a session of arbitrary frames against the donor's request handling,
//! sent after a genuine handshake (HELLO, the donor's challenge, AUTH proving the token) so the
//! data path is reached. The session runs in-process over an in-memory byte stream
//! ([`farmem_donor::SessionDonor`]: the connection code the TCP server runs, with no socket and
//! no thread), each time against an empty store, so an input does the same thing every time it
//! runs (its slabs are 1, 2, …). Shared with `crates/donor/tests/fuzz_corpus.rs`, which replays
//! the corpus through [`run_session`] on stable, and some of it through a real TCP donor
//! ([`run_tcp_session`]).
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::OnceLock;
use std::time::Duration;

use farmem_donor::{DonorConfig, DonorServer, RunningDonor, SessionDonor, Tenant};
use farmem_proto::{
    encode_auth, encode_hello, read_frame, token_proof, AuthMode, Response, PAGE_SIZE,
};

/// The fuzz donor's one tenant's token.
const TOKEN: &[u8] = b"farmem fuzz token";
/// The client id the session authenticates as (each session has a store of its own).
const CLIENT_ID: u64 = 1;
/// The reconnect key the session registers.
const KEY: [u8; 32] = [7; 32];

/// The fuzz donor: small slabs, little capacity, no orphan grace (a client's slabs are freed as
/// its session ends), one tenant with a token, and no memory watermark (ALLOC_SLAB does not
/// depend on the host's free memory).
pub fn config() -> DonorConfig {
    DonorConfig {
        listen: "127.0.0.1:0".into(),
        capacity_bytes: 64 * 16 * PAGE_SIZE as u64,
        slab_size_bytes: 16 * PAGE_SIZE as u64,
        orphan_grace: Duration::ZERO,
        stall_timeout: Duration::from_millis(200),
        hello_timeout: Duration::from_millis(500),
        memory_watermark_bytes: Some(0),
        tenants: vec![Tenant {
            name: "fuzz".into(),
            token: TOKEN.to_vec(),
            quota_bytes: None,
            max_connections: None,
        }],
        ..DonorConfig::default()
    }
}

/// The socket-free donor every in-memory session is served by (each against an empty store).
pub fn donor() -> &'static SessionDonor {
    static DONOR: OnceLock<SessionDonor> = OnceLock::new();
    DONOR.get_or_init(|| SessionDonor::new(config()).expect("the fuzz donor's configuration"))
}

/// Where the client is in its session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    /// HELLO sent; the donor's challenge is awaited.
    Hello,
    /// AUTH sent; the donor's welcome is awaited.
    Auth,
    /// Sending the input.
    Data,
    /// The input is sent: the stream ends.
    Done,
}

/// The client's end of an in-memory session: the donor reads what the client sends and writes
/// its answers here. When the donor has read everything sent so far, the client looks at the
/// answers and sends the next part: AUTH once the challenge came, the input once the welcome
/// came, then the end of the stream.
struct Client<'a> {
    stage: Stage,
    /// The handshake frame being sent, and how much of it the donor has read.
    frame: Vec<u8>,
    sent: usize,
    /// The input, and how much of it the donor has read.
    data: &'a [u8],
    data_sent: usize,
    /// The donor's answers during the handshake (dropped afterwards).
    answers: Vec<u8>,
    payload: Vec<u8>,
}

impl<'a> Client<'a> {
    fn new(data: &'a [u8]) -> Client<'a> {
        let mut frame = Vec::new();
        encode_hello(&mut frame, 1);
        Client {
            stage: Stage::Hello,
            frame,
            sent: 0,
            data,
            data_sent: 0,
            answers: Vec::new(),
            payload: Vec::new(),
        }
    }

    /// The donor's answer to the handshake frame just sent.
    fn answer(&mut self) -> Response<'_> {
        let mut r = &self.answers[..];
        let header = read_frame(&mut r, &mut self.payload).unwrap_or_else(|e| {
            panic!(
                "the donor answered the handshake ({:?} stage) with no frame: {e}",
                self.stage
            )
        });
        Response::decode(&header, &self.payload)
            .unwrap_or_else(|e| panic!("the donor's handshake answer does not decode: {e}"))
    }

    /// Everything sent so far was read: what comes next.
    fn next(&mut self) {
        match self.stage {
            Stage::Hello => {
                let nonce = match self.answer() {
                    Response::Challenge { nonce } => nonce,
                    other => panic!("the donor answered HELLO with {other:?}"),
                };
                let proof = token_proof(TOKEN, &nonce, CLIENT_ID);
                self.frame.clear();
                encode_auth(
                    &mut self.frame,
                    2,
                    CLIENT_ID,
                    AuthMode::Register,
                    &proof,
                    &KEY,
                );
                self.sent = 0;
                self.answers.clear();
                self.stage = Stage::Auth;
            }
            Stage::Auth => {
                match self.answer() {
                    Response::Welcome(_) => {}
                    other => panic!("the donor answered AUTH with {other:?}"),
                }
                self.answers = Vec::new();
                self.stage = Stage::Data;
            }
            Stage::Data | Stage::Done => self.stage = Stage::Done,
        }
    }
}

impl Read for Client<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            let rest = match self.stage {
                Stage::Hello | Stage::Auth => &self.frame[self.sent..],
                Stage::Data => &self.data[self.data_sent..],
                Stage::Done => return Ok(0),
            };
            if rest.is_empty() {
                self.next();
                continue;
            }
            let n = rest.len().min(buf.len());
            buf[..n].copy_from_slice(&rest[..n]);
            match self.stage {
                Stage::Data => self.data_sent += n,
                _ => self.sent += n,
            }
            return Ok(n);
        }
    }
}

impl Write for Client<'_> {
    /// Keeps the donor's answers during the handshake; after it, answers are dropped.
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if matches!(self.stage, Stage::Hello | Stage::Auth) {
            self.answers.extend_from_slice(buf);
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Authenticates a new client with `donor` (its store emptied first), sends `data` as the rest
/// of the session and ends the stream. The handshake must succeed, and once the session is over
/// its client's slabs must be gone (no orphan grace): nothing lent, nothing committed.
pub fn run_session(donor: &SessionDonor, data: &[u8]) {
    let donor = donor.with_empty_store();
    let mut client = Client::new(data);
    donor.serve(&mut client);
    assert!(
        matches!(client.stage, Stage::Data | Stage::Done),
        "the session ended during the handshake ({:?} stage)",
        client.stage
    );
    let store = donor.store();
    assert_eq!(
        (
            store.slab_count(),
            store.used_bytes(),
            store.committed_bytes()
        ),
        (0, 0, 0),
        "the session's slabs outlived it"
    );
}

/// A real donor on 127.0.0.1 with the same configuration, for [`run_tcp_session`].
pub fn tcp_donor() -> SocketAddr {
    static DONOR: OnceLock<RunningDonor> = OnceLock::new();
    DONOR
        .get_or_init(|| {
            DonorServer::bind(config())
                .expect("the fuzz donor binds on 127.0.0.1")
                .spawn()
        })
        .local_addr()
}

/// The same session as [`run_session`] over a real TCP connection to the donor at `addr` (its
/// store shared by every session): authenticates as a new client, sends `data`, shuts the
/// sending side down and reads answers until the donor closes or goes quiet.
pub fn run_tcp_session(addr: SocketAddr, data: &[u8]) {
    static NEXT_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    let id = NEXT_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let Ok(mut s) = TcpStream::connect(addr) else {
        panic!("the donor stopped accepting connections");
    };
    s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    let mut f = Vec::new();
    let mut buf = Vec::new();
    encode_hello(&mut f, 1);
    s.write_all(&f).unwrap();
    let h = read_frame(&mut s, &mut buf).expect("the donor answers HELLO");
    let Ok(Response::Challenge { nonce }) = Response::decode(&h, &buf) else {
        panic!("the donor answered HELLO without a challenge");
    };
    f.clear();
    let proof = token_proof(TOKEN, &nonce, id);
    encode_auth(&mut f, 2, id, AuthMode::Register, &proof, &KEY);
    s.write_all(&f).unwrap();
    let h = read_frame(&mut s, &mut buf).expect("the donor answers AUTH");
    assert!(
        matches!(Response::decode(&h, &buf), Ok(Response::Welcome(_))),
        "the donor refused the fuzz client's AUTH"
    );
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
