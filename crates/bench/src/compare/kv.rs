//! The key-value load generator of the `redis` and `memcached` workloads: loads N keys with
//! random 1 KiB values, then runs a Facebook-ETC-like mix (95% GET / 5% SET, zipfian keys) from
//! client threads in the harness process (outside the memory limit), measuring every request.
//!
//! # Design
//!
//! Keys are `key:NNNNNNNNNN`. Popularity follows YCSB's zipfian generator (Gray et al., theta
//! 0.99 by default) over ranks, and ranks are scrambled with FNV-1a so the hot keys are spread
//! over the server's memory instead of being the first ones loaded. Each client thread owns one
//! connection and runs closed-loop (one request in flight), so latency is the request's own
//! round trip. The load phase pipelines 128 SETs per write and is not timed.
//!
//! # Limitations
//!
//! The client threads share the machine's cores with the server (2 cores here); that cost is
//! the same for every system. Values are checked for length, not content; a GET that misses a
//! loaded key is counted and reported (it means the server lost data).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use hdrhistogram::Histogram;

/// Value size of every key, bytes.
pub const VALUE_BYTES: usize = 1024;
const LOAD_BATCH: u64 = 128;

/// YCSB's zipfian generator over `0..n` (rank 0 the most popular).
#[derive(Clone, Debug)]
pub struct Zipf {
    n: u64,
    theta: f64,
    alpha: f64,
    zetan: f64,
    eta: f64,
}

impl Zipf {
    /// A generator over `n` items with skew `theta` in (0, 1).
    pub fn new(n: u64, theta: f64) -> Result<Zipf, String> {
        if n < 2 {
            return Err(format!("zipfian needs at least 2 keys, got {n}"));
        }
        if !(theta > 0.0 && theta < 1.0) {
            return Err(format!("zipfian skew must be in (0, 1), got {theta}"));
        }
        let zeta = |count: u64| {
            (1..=count)
                .map(|i| 1.0 / (i as f64).powf(theta))
                .sum::<f64>()
        };
        let zetan = zeta(n);
        let zeta2 = zeta(2);
        let eta = (1.0 - (2.0 / n as f64).powf(1.0 - theta)) / (1.0 - zeta2 / zetan);
        Ok(Zipf {
            n,
            theta,
            alpha: 1.0 / (1.0 - theta),
            zetan,
            eta,
        })
    }

    /// The rank for a uniform `u` in [0, 1).
    pub fn rank(&self, u: f64) -> u64 {
        let uz = u * self.zetan;
        if uz < 1.0 {
            return 0;
        }
        if uz < 1.0 + 0.5f64.powf(self.theta) {
            return 1;
        }
        let r = (self.n as f64 * (self.eta * u - self.eta + 1.0).powf(self.alpha)) as u64;
        r.min(self.n - 1)
    }

    /// The key index for a uniform `u`: the rank, scrambled over `0..n`.
    pub fn key(&self, u: f64) -> u64 {
        fnv1a(self.rank(u)) % self.n
    }
}

fn fnv1a(v: u64) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in v.to_le_bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// xorshift64*: fast, seedable, enough for values and the op mix.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.max(1).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
    pub fn fill(&mut self, buf: &mut [u8]) {
        for chunk in buf.chunks_mut(8) {
            let v = self.next_u64().to_le_bytes();
            chunk.copy_from_slice(&v[..chunk.len()]);
        }
    }
}

/// The key name of index `i`.
pub fn key_name(i: u64) -> String {
    format!("key:{i:010}")
}

/// Which protocol the server speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Protocol {
    /// Redis RESP.
    Redis,
    /// memcached's text protocol.
    Memcached,
}

/// One client connection.
pub struct Conn {
    proto: Protocol,
    reader: BufReader<TcpStream>,
    writer: TcpStream,
    line: Vec<u8>,
    value: Vec<u8>,
}

impl Conn {
    /// Connects to 127.0.0.1:`port`.
    pub fn connect(proto: Protocol, port: u16) -> anyhow::Result<Conn> {
        let stream = TcpStream::connect(("127.0.0.1", port))
            .with_context(|| format!("cannot connect to the server on 127.0.0.1:{port}"))?;
        stream.set_nodelay(true)?;
        stream.set_read_timeout(Some(Duration::from_secs(120)))?;
        let writer = stream.try_clone()?;
        Ok(Conn {
            proto,
            reader: BufReader::with_capacity(64 << 10, stream),
            writer,
            line: Vec::with_capacity(128),
            value: vec![0; VALUE_BYTES + 2],
        })
    }

    fn encode_set(&self, out: &mut Vec<u8>, key: &str, value: &[u8]) {
        match self.proto {
            Protocol::Redis => {
                out.extend_from_slice(
                    format!(
                        "*3\r\n$3\r\nSET\r\n${}\r\n{key}\r\n${}\r\n",
                        key.len(),
                        value.len()
                    )
                    .as_bytes(),
                );
            }
            Protocol::Memcached => {
                out.extend_from_slice(format!("set {key} 0 0 {}\r\n", value.len()).as_bytes());
            }
        }
        out.extend_from_slice(value);
        out.extend_from_slice(b"\r\n");
    }

    fn encode_get(&self, out: &mut Vec<u8>, key: &str) {
        match self.proto {
            Protocol::Redis => out.extend_from_slice(
                format!("*2\r\n$3\r\nGET\r\n${}\r\n{key}\r\n", key.len()).as_bytes(),
            ),
            Protocol::Memcached => out.extend_from_slice(format!("get {key}\r\n").as_bytes()),
        }
    }

    fn read_line(&mut self) -> anyhow::Result<()> {
        self.line.clear();
        let n = self
            .reader
            .read_until(b'\n', &mut self.line)
            .context("reading a reply")?;
        if n == 0 {
            bail!("the server closed the connection");
        }
        Ok(())
    }

    fn expect_set_reply(&mut self) -> anyhow::Result<()> {
        self.read_line()?;
        let ok: &[u8] = match self.proto {
            Protocol::Redis => b"+OK\r\n",
            Protocol::Memcached => b"STORED\r\n",
        };
        if self.line != ok {
            bail!(
                "SET failed: the server answered {:?}",
                String::from_utf8_lossy(&self.line)
            );
        }
        Ok(())
    }

    /// Reads a GET reply; true on a hit with a value of the expected size.
    fn read_get_reply(&mut self) -> anyhow::Result<bool> {
        self.read_line()?;
        match self.proto {
            Protocol::Redis => {
                if self.line.starts_with(b"$-1") {
                    return Ok(false);
                }
                let len = parse_len(self.line.strip_prefix(b"$"))?;
                self.read_value(len)?;
                Ok(true)
            }
            Protocol::Memcached => {
                if self.line == b"END\r\n" {
                    return Ok(false);
                }
                if !self.line.starts_with(b"VALUE ") {
                    bail!("bad GET reply {:?}", String::from_utf8_lossy(&self.line));
                }
                let text = String::from_utf8_lossy(&self.line).into_owned();
                let len = parse_len(text.split_whitespace().nth(3).map(str::as_bytes))?;
                self.read_value(len)?;
                self.read_line()?;
                if self.line != b"END\r\n" {
                    bail!("GET reply without END");
                }
                Ok(true)
            }
        }
    }

    fn read_value(&mut self, len: usize) -> anyhow::Result<()> {
        if len != VALUE_BYTES {
            bail!("GET returned {len} bytes, expected {VALUE_BYTES}: the value was corrupted");
        }
        self.reader
            .read_exact(&mut self.value[..len + 2])
            .context("reading a value")?;
        Ok(())
    }

    fn send(&mut self, buf: &[u8]) -> anyhow::Result<()> {
        self.writer.write_all(buf).context("sending a request")
    }
}

fn parse_len(field: Option<&[u8]>) -> anyhow::Result<usize> {
    let text = std::str::from_utf8(field.unwrap_or_default())
        .unwrap_or("")
        .trim();
    text.parse()
        .with_context(|| format!("bad length {text:?} in a reply"))
}

/// True when the server answers a PING (redis) or `version` (memcached) as ready.
fn ping(proto: Protocol, port: u16) -> bool {
    let Ok(mut conn) = Conn::connect(proto, port) else {
        return false;
    };
    let (cmd, want): (&[u8], &[u8]) = match proto {
        Protocol::Redis => (b"*1\r\n$4\r\nPING\r\n", b"+PONG"),
        Protocol::Memcached => (b"version\r\n", b"VERSION "),
    };
    conn.send(cmd).is_ok() && conn.read_line().is_ok() && conn.line.starts_with(want)
}

/// Waits until the server answers on 127.0.0.1:`port` (a redis still loading a dump answers
/// -LOADING, which is not ready).
pub fn wait_ready(
    proto: Protocol,
    port: u16,
    timeout: Duration,
    mut alive: impl FnMut() -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + timeout;
    loop {
        if ping(proto, port) {
            return Ok(());
        }
        alive()?;
        if Instant::now() > deadline {
            bail!("the server did not answer on 127.0.0.1:{port} within {timeout:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Stores `keys` keys with random values (pipelined, untimed).
pub fn load(proto: Protocol, port: u16, keys: u64, seed: u64) -> anyhow::Result<()> {
    let mut conn = Conn::connect(proto, port)?;
    let mut rng = Rng::new(seed);
    let mut value = vec![0u8; VALUE_BYTES];
    let mut buf = Vec::with_capacity((LOAD_BATCH as usize) * (VALUE_BYTES + 64));
    let mut i = 0;
    while i < keys {
        let end = (i + LOAD_BATCH).min(keys);
        buf.clear();
        for k in i..end {
            rng.fill(&mut value);
            conn.encode_set(&mut buf, &key_name(k), &value);
        }
        conn.send(&buf)?;
        for _ in i..end {
            conn.expect_set_reply()
                .with_context(|| format!("loading key {i}.."))?;
        }
        i = end;
    }
    Ok(())
}

/// The ETC-like mix's parameters.
#[derive(Clone, Debug)]
pub struct MixConfig {
    pub keys: u64,
    pub ops: u64,
    pub clients: u32,
    pub set_fraction: f64,
    pub zipf_theta: f64,
    pub max_duration: Duration,
    pub seed: u64,
}

/// What the mix measured.
#[derive(Debug)]
pub struct MixResult {
    pub ops: u64,
    pub elapsed_s: f64,
    pub misses: u64,
    pub latency_ns: Histogram<u64>,
}

/// Runs the mix: `clients` threads, `ops / clients` requests each (or until `max_duration`).
pub fn run_mix(proto: Protocol, port: u16, cfg: &MixConfig) -> anyhow::Result<MixResult> {
    let zipf = Zipf::new(cfg.keys, cfg.zipf_theta).map_err(anyhow::Error::msg)?;
    let per_client = cfg.ops.div_ceil(u64::from(cfg.clients.max(1)));
    let deadline = Instant::now() + cfg.max_duration;
    let start = Instant::now();
    let results: Vec<anyhow::Result<(u64, u64, Histogram<u64>)>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..cfg.clients.max(1))
            .map(|c| {
                let zipf = &zipf;
                s.spawn(move || -> anyhow::Result<(u64, u64, Histogram<u64>)> {
                    let mut conn = Conn::connect(proto, port)?;
                    let mut rng = Rng::new(cfg.seed ^ ((u64::from(c) + 1) * 0x1000_0001));
                    let mut hist = Histogram::<u64>::new_with_bounds(100, 600_000_000_000, 3)?;
                    let mut value = vec![0u8; VALUE_BYTES];
                    let mut buf = Vec::with_capacity(VALUE_BYTES + 64);
                    let (mut done, mut misses) = (0u64, 0u64);
                    while done < per_client {
                        if done % 256 == 0 && Instant::now() > deadline {
                            break;
                        }
                        let key = key_name(zipf.key(rng.unit()));
                        let is_set = rng.unit() < cfg.set_fraction;
                        buf.clear();
                        if is_set {
                            rng.fill(&mut value);
                            conn.encode_set(&mut buf, &key, &value);
                        } else {
                            conn.encode_get(&mut buf, &key);
                        }
                        let t0 = Instant::now();
                        conn.send(&buf)?;
                        if is_set {
                            conn.expect_set_reply()?;
                        } else if !conn.read_get_reply()? {
                            misses += 1;
                        }
                        hist.saturating_record(t0.elapsed().as_nanos() as u64);
                        done += 1;
                    }
                    Ok((done, misses, hist))
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(anyhow::anyhow!("a client thread panicked")))
            })
            .collect()
    });
    let elapsed_s = start.elapsed().as_secs_f64();
    let mut total = MixResult {
        ops: 0,
        elapsed_s,
        misses: 0,
        latency_ns: Histogram::new_with_bounds(100, 600_000_000_000, 3)?,
    };
    for r in results {
        let (ops, misses, hist) = r?;
        total.ops += ops;
        total.misses += misses;
        total.latency_ns.add(&hist)?;
    }
    Ok(total)
}

/// Asks the server to exit (redis: SHUTDOWN NOSAVE; memcached, started with -A: shutdown).
pub fn shutdown(proto: Protocol, port: u16) {
    if let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) {
        let cmd: &[u8] = match proto {
            Protocol::Redis => b"*2\r\n$8\r\nSHUTDOWN\r\n$6\r\nNOSAVE\r\n",
            Protocol::Memcached => b"shutdown\r\n",
        };
        let _ = s.write_all(cmd);
        let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
        let mut sink = [0u8; 64];
        let _ = s.read(&mut sink);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    #[test]
    fn zipf_is_skewed_toward_low_ranks_and_in_range() {
        let z = Zipf::new(10_000, 0.99).unwrap();
        let mut rng = Rng::new(7);
        let mut counts = vec![0u32; 10_000];
        for _ in 0..200_000 {
            let r = z.rank(rng.unit());
            counts[r as usize] += 1;
            assert!(z.key(rng.unit()) < 10_000);
        }
        assert!(
            counts[0] > counts[1] && counts[1] > counts[10],
            "{:?}",
            &counts[..12]
        );
        // With theta 0.99 over 10k items the top 1% of ranks draw well over a third.
        let top: u32 = counts[..100].iter().sum();
        assert!(top > 200_000 / 3, "top 100 ranks drew {top}");
    }

    #[test]
    fn zipf_rejects_bad_parameters() {
        assert!(Zipf::new(1, 0.99).unwrap_err().contains("at least 2 keys"));
        assert!(Zipf::new(100, 1.0).unwrap_err().contains("(0, 1)"));
    }

    /// A fake server on loopback that answers like redis, to check the client's framing.
    #[test]
    fn redis_framing_round_trip_against_a_loopback_peer() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let server = std::thread::spawn(move || {
            let (s, _) = listener.accept().unwrap();
            let mut r = BufReader::new(s.try_clone().unwrap());
            let mut w = s;
            let mut line = String::new();
            // SET: 6 header lines then the value line.
            for _ in 0..6 {
                line.clear();
                r.read_line(&mut line).unwrap();
            }
            let mut v = vec![0u8; VALUE_BYTES + 2];
            r.read_exact(&mut v).unwrap();
            w.write_all(b"+OK\r\n").unwrap();
            // GET: 5 lines.
            for _ in 0..5 {
                line.clear();
                r.read_line(&mut line).unwrap();
            }
            w.write_all(format!("${VALUE_BYTES}\r\n").as_bytes())
                .unwrap();
            w.write_all(&v).unwrap();
            for _ in 0..5 {
                line.clear();
                r.read_line(&mut line).unwrap();
            }
            w.write_all(b"$-1\r\n").unwrap();
            for _ in 0..5 {
                line.clear();
                r.read_line(&mut line).unwrap();
            }
            w.write_all(b"$5\r\nshort\r\n").unwrap();
        });
        let mut c = Conn::connect(Protocol::Redis, port).unwrap();
        let mut buf = Vec::new();
        c.encode_set(&mut buf, "key:1", &[7u8; VALUE_BYTES]);
        c.send(&buf).unwrap();
        c.expect_set_reply().unwrap();
        for _ in 0..3 {
            buf.clear();
            c.encode_get(&mut buf, "key:1");
            c.send(&buf).unwrap();
        }
        assert!(c.read_get_reply().unwrap());
        assert!(!c.read_get_reply().unwrap());
        let err = c.read_get_reply().unwrap_err().to_string();
        assert!(err.contains("expected 1024"), "{err}");
        server.join().unwrap();
    }
}
