//! Test fixtures: an in-process donor on 127.0.0.1 and a raw protocol client built on
//! farmem-proto, so tests can send well-formed requests and hand-crafted bad frames alike.
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use farmem_donor::{DonorConfig, DonorServer, RunningDonor};
use farmem_proto::{
    attach_proof, encode_alloc_slab, encode_auth, encode_clients, encode_free_slab, encode_hello,
    encode_read_pages, encode_reclaims, encode_stats, encode_write_pages, read_frame, token_proof,
    AuthMode, DonorStats, Header, Opcode, PageAddr, ReadFrameError, ReconnectKey, Response, Status,
    KEY_LEN, NONCE_LEN, PAGE_SIZE,
};

/// A small slab (64 pages) so tests stay light.
pub const SLAB_BYTES: u64 = 64 * PAGE_SIZE as u64;

pub fn config() -> DonorConfig {
    DonorConfig {
        listen: "127.0.0.1:0".into(),
        capacity_bytes: 16 * SLAB_BYTES,
        slab_size_bytes: SLAB_BYTES,
        ..DonorConfig::default()
    }
}

pub fn start(cfg: DonorConfig) -> RunningDonor {
    let _ = tracing_subscriber::fmt()
        .with_test_writer()
        .with_env_filter("info")
        .try_init();
    DonorServer::bind(cfg)
        .expect("donor binds on 127.0.0.1")
        .spawn()
}

/// One decoded response, owned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    Challenge([u8; NONCE_LEN]),
    Hello {
        slab_size_bytes: u64,
        capacity_bytes: u64,
    },
    Slab(u32),
    Done,
    Pages(Vec<u8>),
    /// Boxed: the counters would make every `Reply` (and `Result<_, Reply>`) large.
    Stats(Box<DonorStats>),
    GiveBack(Vec<u32>),
    Clients(farmem_proto::ClientsReply),
    Error(Status, String),
}

impl Reply {
    /// The owned form of a decoded response.
    pub fn from_response(r: Response<'_>) -> Reply {
        match r {
            Response::Challenge { nonce } => Reply::Challenge(nonce),
            Response::Welcome(i) => Reply::Hello {
                slab_size_bytes: i.slab_size_bytes,
                capacity_bytes: i.capacity_bytes,
            },
            Response::SlabAllocated { slab } => Reply::Slab(slab),
            Response::Done => Reply::Done,
            Response::Pages { data, .. } => Reply::Pages(data.to_vec()),
            Response::Stats(s) => Reply::Stats(Box::new(s)),
            Response::GiveBack(list) => Reply::GiveBack(list.iter().collect()),
            Response::Clients(raw) => Reply::Clients(raw.decode()),
            Response::Error { status, message } => Reply::Error(status, message.to_string()),
        }
    }

    pub fn status(&self) -> Status {
        match self {
            Reply::Error(s, _) => *s,
            _ => Status::Ok,
        }
    }
}

/// A raw protocol client.
pub struct Raw {
    pub stream: TcpStream,
    next_id: u64,
    buf: Vec<u8>,
}

impl Raw {
    pub fn connect(addr: SocketAddr) -> Raw {
        let stream = TcpStream::connect(addr).expect("connect to the donor");
        stream
            .set_read_timeout(Some(Duration::from_secs(20)))
            .unwrap();
        Raw {
            stream,
            next_id: 1,
            buf: Vec::new(),
        }
    }

    /// Connects and completes the handshake as `client` (with the test key of `client`, see
    /// [`key_of`]) with `token`; panics unless it succeeds.
    pub fn hello(addr: SocketAddr, client: u64, token: &[u8]) -> Raw {
        let mut r = Raw::connect(addr);
        let reply = r.hello_reply(client, token);
        assert!(
            matches!(reply, Reply::Hello { .. }),
            "HELLO failed: {reply:?}"
        );
        r
    }

    pub fn id(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }

    pub fn send(&mut self, frame: &[u8]) {
        self.stream.write_all(frame).expect("send to the donor");
    }

    /// Reads one response; `None` if the donor closed the connection.
    pub fn recv(&mut self) -> Option<(Header, Reply)> {
        let h = match read_frame(&mut self.stream, &mut self.buf) {
            Ok(h) => h,
            Err(ReadFrameError::Closed) => return None,
            Err(ReadFrameError::Io(e)) if e.kind() == std::io::ErrorKind::ConnectionReset => {
                return None
            }
            Err(e) => panic!("reading a response failed: {e}"),
        };
        assert!(h.is_response(), "donor sent a non-response frame");
        let reply = Reply::from_response(
            Response::decode(&h, &self.buf).expect("donor's response decodes"),
        );
        Some((h, reply))
    }

    pub fn call(&mut self, frame: &[u8]) -> Reply {
        self.send(frame);
        self.recv().expect("donor answered").1
    }

    /// Whether the donor closed the connection (reads EOF or reset, after any pending replies).
    pub fn closed_by_donor(&mut self) -> bool {
        let mut b = [0u8; 4096];
        loop {
            match self.stream.read(&mut b) {
                Ok(0) => return true,
                Ok(_) => continue,
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return true,
                Err(e) => panic!("waiting for the donor to close: {e}"),
            }
        }
    }

    /// HELLO: the nonce, or the refusal.
    pub fn challenge(&mut self) -> Result<[u8; NONCE_LEN], Reply> {
        let mut f = Vec::new();
        let id = self.id();
        encode_hello(&mut f, id);
        match self.call(&f) {
            Reply::Challenge(n) => Ok(n),
            other => Err(other),
        }
    }

    /// AUTH as `client` in `mode` with `token` and reconnect key `key` (registered, or proven
    /// against `nonce`).
    pub fn auth(
        &mut self,
        nonce: &[u8; NONCE_LEN],
        client: u64,
        token: &[u8],
        key: &ReconnectKey,
        mode: AuthMode,
    ) -> Reply {
        let key_or_proof = match mode {
            AuthMode::Register => key.0,
            AuthMode::Attach => attach_proof(key, nonce, client),
        };
        let mut f = Vec::new();
        let id = self.id();
        let proof = token_proof(token, nonce, client);
        encode_auth(&mut f, id, client, mode, &proof, &key_or_proof);
        self.call(&f)
    }

    /// The whole handshake as a real client does it: HELLO, then AUTH registering `client`
    /// with [`key_of`]`(client)`, attaching instead if it is registered.
    pub fn hello_reply(&mut self, client: u64, token: &[u8]) -> Reply {
        let nonce = match self.challenge() {
            Ok(n) => n,
            Err(refused) => return refused,
        };
        let key = key_of(client);
        match self.auth(&nonce, client, token, &key, AuthMode::Register) {
            Reply::Error(Status::ClientIdTaken, _) => {
                self.auth(&nonce, client, token, &key, AuthMode::Attach)
            }
            other => other,
        }
    }

    pub fn alloc(&mut self) -> Reply {
        let mut f = Vec::new();
        let id = self.id();
        encode_alloc_slab(&mut f, id);
        self.call(&f)
    }

    pub fn alloc_ok(&mut self) -> u32 {
        match self.alloc() {
            Reply::Slab(s) => s,
            other => panic!("ALLOC_SLAB failed: {other:?}"),
        }
    }

    pub fn free(&mut self, slab: u32) -> Reply {
        let mut f = Vec::new();
        let id = self.id();
        encode_free_slab(&mut f, id, slab);
        self.call(&f)
    }

    pub fn write(&mut self, pages: &[(PageAddr, &[u8])]) -> Reply {
        let mut f = Vec::new();
        let id = self.id();
        encode_write_pages(&mut f, id, pages).unwrap();
        self.call(&f)
    }

    pub fn read(&mut self, addrs: &[PageAddr]) -> Reply {
        let mut f = Vec::new();
        let id = self.id();
        encode_read_pages(&mut f, id, addrs).unwrap();
        self.call(&f)
    }

    /// RECLAIMS: the slabs the donor wants back from this client.
    pub fn reclaims(&mut self) -> Vec<u32> {
        let mut f = Vec::new();
        let id = self.id();
        encode_reclaims(&mut f, id);
        match self.call(&f) {
            Reply::GiveBack(s) => s,
            other => panic!("RECLAIMS failed: {other:?}"),
        }
    }

    /// IDENT with the raw label bytes (the encoder refuses bad labels; a hostile client does
    /// not).
    pub fn ident(&mut self, label: &[u8]) -> Reply {
        let id = self.id();
        let mut f = Header::request(Opcode::Ident, id, label.len() as u32)
            .encode()
            .to_vec();
        f.extend_from_slice(label);
        self.call(&f)
    }

    /// CLIENTS: this client's tenant and its clients.
    pub fn clients(&mut self) -> Reply {
        let mut f = Vec::new();
        let id = self.id();
        encode_clients(&mut f, id);
        self.call(&f)
    }

    pub fn stats(&mut self) -> DonorStats {
        let mut f = Vec::new();
        let id = self.id();
        encode_stats(&mut f, id);
        match self.call(&f) {
            Reply::Stats(s) => *s,
            other => panic!("STATS failed: {other:?}"),
        }
    }
}

/// The reconnect key the fixtures use for client id `client` (tests of stolen ids use others).
pub fn key_of(client: u64) -> ReconnectKey {
    let mut k = [0u8; KEY_LEN];
    for (i, b) in k.iter_mut().enumerate() {
        *b = (client.rotate_left(i as u32 * 8) as u8) ^ (i as u8);
    }
    ReconnectKey(k)
}

/// A page filled with a pattern derived from `seed`.
pub fn page(seed: u64) -> Vec<u8> {
    (0..PAGE_SIZE)
        .map(|i| (seed.wrapping_mul(31).wrapping_add(i as u64 * 7) % 251) as u8)
        .collect()
}

/// A well-behaved client with data on the donor; `check` verifies the data is intact and that
/// it can still allocate, write and read.
pub struct Witness {
    pub raw: Raw,
    pub slab: u32,
    pub client: u64,
}

impl Witness {
    pub fn new(addr: SocketAddr, client: u64, token: &[u8]) -> Witness {
        let mut raw = Raw::hello(addr, client, token);
        let slab = raw.alloc_ok();
        let pages: Vec<Vec<u8>> = (0..8).map(|i| page(client * 100 + i)).collect();
        let batch: Vec<(PageAddr, &[u8])> = pages
            .iter()
            .enumerate()
            .map(|(i, p)| {
                (
                    PageAddr {
                        slab,
                        page: i as u32 * 3,
                    },
                    p.as_slice(),
                )
            })
            .collect();
        assert_eq!(raw.write(&batch), Reply::Done);
        Witness { raw, slab, client }
    }

    pub fn check(&mut self) {
        let addrs: Vec<PageAddr> = (0..8)
            .map(|i| PageAddr {
                slab: self.slab,
                page: i * 3,
            })
            .collect();
        let Reply::Pages(data) = self.raw.read(&addrs) else {
            panic!("witness read failed");
        };
        for i in 0..8u64 {
            assert_eq!(
                &data[i as usize * PAGE_SIZE..(i as usize + 1) * PAGE_SIZE],
                page(self.client * 100 + i).as_slice(),
                "witness page {i} changed"
            );
        }
        let p = page(999);
        let a = PageAddr {
            slab: self.slab,
            page: 1,
        };
        assert_eq!(self.raw.write(&[(a, &p)]), Reply::Done);
        assert_eq!(self.raw.read(&[a]), Reply::Pages(p));
    }
}
