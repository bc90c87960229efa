//! A bounded flood of unauthenticated connections from many loopback sources, and a slow
//! login that must get through it: the measuring tool for the donor's login slots
//! (`crates/donor/tests/donor_login_flood.rs`, `crates/donor/examples/login_flood.rs`).
//!
//! The flood only ever connects to a loopback address, from loopback addresses
//! (`127.0.0.1` … `127.0.0.N`, each bound before connecting), for a bounded time and at most a
//! bounded number of connections; it never sends a byte. Each source keeps its last few
//! connections open (an idle socket is what holds a login slot) and closes older ones.
use std::collections::VecDeque;
use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpStream};
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use farmem_proto::{
    encode_auth, encode_hello, read_frame, token_proof, AuthMode, ReconnectKey, Response, KEY_LEN,
};
use rustix::net::{AddressFamily, SocketFlags, SocketType};

/// What a flood does.
#[derive(Debug, Clone)]
pub struct FloodConfig {
    /// The donor (a loopback address).
    pub target: SocketAddr,
    /// Sources `127.0.0.1` … `127.0.0.sources` (1 to 254).
    pub sources: u8,
    /// Connections per second aimed at, all sources together.
    pub rate_per_s: u32,
    /// How long it runs at most.
    pub duration: Duration,
    /// Connections each source keeps open (older ones are closed).
    pub open_per_source: usize,
    /// Threads making connections.
    pub threads: usize,
}

impl FloodConfig {
    /// The flood of the brief: 10,000 connections/s from 64 sources, for `duration`.
    pub fn standard(target: SocketAddr, duration: Duration) -> FloodConfig {
        FloodConfig {
            target,
            sources: 64,
            rate_per_s: 10_000,
            duration,
            open_per_source: 64,
            threads: 4,
        }
    }
}

/// A running flood; [`Flood::stop`] ends it.
pub struct Flood {
    stop: Arc<AtomicBool>,
    made: Arc<AtomicU64>,
    started: Instant,
    threads: Vec<JoinHandle<()>>,
}

/// What a flood did.
#[derive(Debug, Clone, Copy)]
pub struct FloodReport {
    /// Connections it opened.
    pub connections: u64,
    /// How long it ran.
    pub elapsed: Duration,
}

/// A socket connected (or connecting: non-blocking) from `source` to `target`.
fn connect_from(source: IpAddr, target: SocketAddr, nonblocking: bool) -> std::io::Result<OwnedFd> {
    let flags = if nonblocking {
        SocketFlags::NONBLOCK | SocketFlags::CLOEXEC
    } else {
        SocketFlags::CLOEXEC
    };
    let fd = rustix::net::socket_with(AddressFamily::INET, SocketType::STREAM, flags, None)?;
    rustix::net::bind(&fd, &SocketAddr::new(source, 0))?;
    match rustix::net::connect(&fd, &target) {
        Ok(()) => Ok(fd),
        Err(rustix::io::Errno::INPROGRESS) if nonblocking => Ok(fd),
        Err(e) => Err(e.into()),
    }
}

impl Flood {
    /// Starts the flood; it stops by itself after `cfg.duration` or
    /// `rate_per_s × duration` connections.
    pub fn start(cfg: FloodConfig) -> Flood {
        assert!(
            cfg.target.ip().is_loopback(),
            "a flood only ever targets loopback, not {}",
            cfg.target
        );
        assert!((1..=254).contains(&cfg.sources) && cfg.threads > 0);
        let stop = Arc::new(AtomicBool::new(false));
        let made = Arc::new(AtomicU64::new(0));
        let started = Instant::now();
        let limit = (u64::from(cfg.rate_per_s) as f64 * cfg.duration.as_secs_f64()) as u64;
        let threads = (0..cfg.threads)
            .map(|w| {
                let (cfg, stop, made) = (cfg.clone(), Arc::clone(&stop), Arc::clone(&made));
                std::thread::spawn(move || {
                    let mine: Vec<u8> = (1..=cfg.sources)
                        .filter(|s| usize::from(*s) % cfg.threads == w)
                        .collect();
                    if mine.is_empty() {
                        return;
                    }
                    let mut open: Vec<VecDeque<OwnedFd>> =
                        mine.iter().map(|_| VecDeque::new()).collect();
                    let interval = Duration::from_secs_f64(
                        cfg.threads as f64 / f64::from(cfg.rate_per_s.max(1)),
                    );
                    let mut next = Instant::now();
                    let mut i = 0;
                    while !stop.load(Ordering::Relaxed)
                        && started.elapsed() < cfg.duration
                        && made.load(Ordering::Relaxed) < limit
                    {
                        let source = IpAddr::V4(Ipv4Addr::new(127, 0, 0, mine[i]));
                        if let Ok(fd) = connect_from(source, cfg.target, true) {
                            made.fetch_add(1, Ordering::Relaxed);
                            open[i].push_back(fd);
                            if open[i].len() > cfg.open_per_source {
                                open[i].pop_front();
                            }
                        }
                        i = (i + 1) % mine.len();
                        next += interval;
                        let now = Instant::now();
                        if next > now {
                            std::thread::sleep(next - now);
                        } else if now - next > Duration::from_millis(100) {
                            // Behind by far: do not burst to catch up.
                            next = now;
                        }
                    }
                })
            })
            .collect();
        Flood {
            stop,
            made,
            started,
            threads,
        }
    }

    /// Connections opened so far.
    pub fn connections(&self) -> u64 {
        self.made.load(Ordering::Relaxed)
    }

    /// Stops the flood, closes its sockets and says what it did.
    pub fn stop(self) -> FloodReport {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads {
            let _ = t.join();
        }
        FloodReport {
            connections: self.made.load(Ordering::Relaxed),
            elapsed: self.started.elapsed(),
        }
    }
}

/// The reconnect key a slow login registers for `client`.
fn key_of(client: u64) -> ReconnectKey {
    let mut k = [0x5Au8; KEY_LEN];
    k[..8].copy_from_slice(&client.to_le_bytes());
    ReconnectKey(k)
}

/// A client on a slow link: connects from `source` to `target` and completes the handshake
/// (HELLO, then AUTH registering `client` with `token`) as it would over a link of round trip
/// `rtt`: every message it sends leaves `rtt / 2` late and every answer reaches it `rtt / 2`
/// late, so the donor sees its connection logging in for `1.5 × rtt`. `Ok` with the time it
/// took, or what failed; `deadline` bounds the whole login.
pub fn slow_login(
    source: IpAddr,
    target: SocketAddr,
    client: u64,
    token: &[u8],
    rtt: Duration,
    deadline: Duration,
) -> Result<Duration, String> {
    let t0 = Instant::now();
    let half = rtt / 2;
    let fd = connect_from(source, target, false).map_err(|e| format!("connect: {e}"))?;
    let mut s = TcpStream::from(fd);
    let left = || {
        deadline
            .saturating_sub(t0.elapsed())
            .max(Duration::from_millis(1))
    };
    let mut buf = Vec::new();
    let mut exchange = |s: &mut TcpStream, frame: &[u8], what: &str| -> Result<Vec<u8>, String> {
        std::thread::sleep(half);
        s.write_all(frame)
            .map_err(|e| format!("sending {what}: {e}"))?;
        s.set_read_timeout(Some(left()))
            .map_err(|e| e.to_string())?;
        let h = read_frame(&mut *s, &mut buf)
            .map_err(|e| format!("reading the answer to {what}: {e}"))?;
        std::thread::sleep(half);
        let out = match Response::decode(&h, &buf) {
            Ok(Response::Challenge { nonce }) => nonce.to_vec(),
            Ok(Response::Welcome(_)) => Vec::new(),
            Ok(Response::Error { status, message }) => {
                return Err(format!("{what} refused: {status}: {message}"))
            }
            Ok(_) => return Err(format!("unexpected answer to {what}")),
            Err(e) => return Err(format!("bad answer to {what}: {e}")),
        };
        Ok(out)
    };
    let mut f = Vec::new();
    encode_hello(&mut f, 1);
    let nonce: [u8; 32] = exchange(&mut s, &f, "HELLO")?
        .try_into()
        .map_err(|_| "HELLO answered without a nonce".to_string())?;
    f.clear();
    let proof = token_proof(token, &nonce, client);
    encode_auth(
        &mut f,
        2,
        client,
        AuthMode::Register,
        &proof,
        &key_of(client).0,
    );
    exchange(&mut s, &f, "AUTH")?;
    let took = t0.elapsed();
    // Closed cleanly: the donor sees the peer leave between requests.
    let _ = s.shutdown(std::net::Shutdown::Write);
    let _ = s.read(&mut [0u8; 1]);
    if took > deadline {
        return Err(format!("logged in only after {took:?}"));
    }
    Ok(took)
}
