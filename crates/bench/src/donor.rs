//! `farmem-bench donor`: farmem's donor and transport against memcached, on loopback, in one run.
//!
//! Starts a donor in this process (on 127.0.0.1:0) and a memcached server as a child (on a free
//! 127.0.0.1 port, `-m` sized for the working set, `-M` so nothing is evicted), fills both with
//! the same pages, then measures for each, with the same random page sequence:
//! - single-page read latency: one 4 KiB read at a time, p50 and p99 (µs, hdrhistogram);
//! - batch throughput: batches of 64 random pages, 4 batches in flight on one connection, pages
//!   per second (memcached: multi-get `get k1 … k64`, pipelined).
//!
//! Every page read is checked (its index is stamped in its first and last 8 bytes), so neither
//! side can win by returning the wrong bytes.
//!
//! # Limitations
//! Both servers share the machine (and its CPU cores) with the client, as on any loopback
//! benchmark; memcached runs with its default 4 worker threads (`--memcached-threads`).

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, BufWriter, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context};
use clap::Args;
use farmem_donor::{DonorConfig, DonorServer, RunningDonor};
use farmem_transport::{ClientConfig, Completion, DonorClient, PageAddr, PageWrite, PAGE_SIZE};
use hdrhistogram::Histogram;
use serde::Serialize;

/// Pages per batch in the throughput phase.
const BATCH_PAGES: usize = 64;
/// Batches in flight in the throughput phase.
const IN_FLIGHT: usize = 4;
/// Slab size of the bench donor.
const SLAB_BYTES: u64 = 64 << 20;

const BENCH_DONOR_LONG_HELP: &str = "\
Starts a farmem donor in this process and a memcached child (from the Debian package `memcached`, \
or --memcached PATH), both on 127.0.0.1, loads the same --pages 4 KiB pages into each, then reads \
them back with the same random page sequence:
  single   one page at a time, --requests reads after 1000 warm-up reads: p50 and p99 latency (us)
  batch    --batches batches of 64 pages, 4 in flight on one connection: pages per second
Every page read back is checked, so neither side can win by returning wrong bytes.

The table gives each figure for both systems and farmem's ratio to memcached, measured in the \
same run on the same machine. --json prints {\"farmem\": F, \"memcached\": F} with \
F = {\"single_p50_us\", \"single_p99_us\", \"batch_pages_per_s\"}.

Example:
  farmem-bench donor --requests 5000 --batches 1000";

/// Compare farmem's donor with memcached: single-page read latency and batch read throughput.
///
/// Starts both servers on 127.0.0.1 itself (memcached from the Debian package `memcached`),
/// loads the same pages into each, and reads them back with the same random sequence.
#[derive(Args, Debug)]
#[command(after_long_help = BENCH_DONOR_LONG_HELP)]
pub struct BenchDonorArgs {
    /// Print only the JSON figures.
    #[arg(long)]
    pub json: bool,
    /// Single-page reads measured on each system (after 1000 warm-up reads).
    #[arg(long, default_value_t = 20_000, value_name = "N")]
    pub requests: u64,
    /// 64-page batches read on each system in the throughput phase.
    #[arg(long, default_value_t = 5_000, value_name = "N")]
    pub batches: u64,
    /// Pages (4 KiB each) in the working set loaded into each system.
    #[arg(long, default_value_t = 16_384, value_name = "N")]
    pub pages: u32,
    /// The memcached binary to start.
    #[arg(long, default_value = "memcached", value_name = "PATH")]
    pub memcached: PathBuf,
    /// memcached worker threads (`-t`); 4 is memcached's own default.
    #[arg(long, default_value_t = 4, value_name = "N")]
    pub memcached_threads: u32,
}

/// One system's figures, as printed by `--json`.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Figures {
    /// Median single-page read latency, µs.
    pub single_p50_us: f64,
    /// 99th percentile single-page read latency, µs.
    pub single_p99_us: f64,
    /// Pages per second read in 64-page batches, 4 in flight.
    pub batch_pages_per_s: f64,
}

/// What `--json` prints.
#[derive(Debug, Serialize)]
pub struct Report {
    /// farmem's donor through farmem-transport.
    pub farmem: Figures,
    /// memcached through a minimal text-protocol client.
    pub memcached: Figures,
}

/// Runs `farmem-bench donor`.
pub fn run(args: BenchDonorArgs) -> anyhow::Result<ExitCode> {
    ensure!(args.pages >= 1, "--pages must be at least 1");
    ensure!(args.requests >= 1, "--requests must be at least 1");
    ensure!(args.batches >= 1, "--batches must be at least 1");

    ensure!(
        args.memcached_threads >= 1,
        "--memcached-threads must be at least 1"
    );
    let mut memcached = Memcached::start(&args.memcached, args.pages, args.memcached_threads)?;
    let mut farmem = FarmemSide::start(args.pages)?;
    tracing::info!(
        pages = args.pages,
        "loading the working set into both systems"
    );
    farmem.load(args.pages)?;
    memcached.load(args.pages)?;

    let mut rng = XorShift(0x5EED_F00D);
    let _ = single(&mut farmem, &mut rng, args.pages, 1000)?;
    let _ = single(&mut memcached, &mut rng, args.pages, 1000)?;

    // Interleave the two systems in rounds, so drift in the machine's load hits both alike.
    let mut f_single = new_histogram()?;
    let mut m_single = new_histogram()?;
    let (mut f_time, mut m_time) = (Duration::ZERO, Duration::ZERO);
    tracing::info!(
        reads = args.requests,
        batches = args.batches,
        rounds = ROUNDS,
        "measuring single-page reads, then batched reads ({IN_FLIGHT} in flight)"
    );
    for round in 0..ROUNDS {
        let n = share(args.requests, round);
        let seed = rng.0;
        single_into(
            &mut f_single,
            &mut farmem,
            &mut XorShift(seed),
            args.pages,
            n,
        )?;
        single_into(
            &mut m_single,
            &mut memcached,
            &mut XorShift(seed),
            args.pages,
            n,
        )?;
        rng.below(2);
    }
    for round in 0..ROUNDS {
        let n = share(args.batches, round);
        let seed = rng.0;
        f_time += batches(&mut farmem, &mut XorShift(seed), args.pages, n)?;
        m_time += batches(&mut memcached, &mut XorShift(seed), args.pages, n)?;
        rng.below(2);
    }
    let pages_read = (args.batches * BATCH_PAGES as u64) as f64;
    let (f_rate, m_rate) = (
        pages_read / f_time.as_secs_f64(),
        pages_read / m_time.as_secs_f64(),
    );

    let donor_service = farmem
        .client
        .stats()
        .context("reading the donor's counters")?;
    let report = Report {
        farmem: Figures {
            single_p50_us: quantile_us(&f_single, 0.5),
            single_p99_us: quantile_us(&f_single, 0.99),
            batch_pages_per_s: f_rate,
        },
        memcached: Figures {
            single_p50_us: quantile_us(&m_single, 0.5),
            single_p99_us: quantile_us(&m_single, 0.99),
            batch_pages_per_s: m_rate,
        },
    };
    memcached.stop();
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        print!("{}", render(&report, &args));
        println!(
            "donor service time (inside the donor, all requests): p50 {:.1} µs, p99 {:.1} µs",
            donor_service.service_p50_ns as f64 / 1000.0,
            donor_service.service_p99_ns as f64 / 1000.0
        );
    }
    Ok(ExitCode::SUCCESS)
}

fn quantile_us(h: &Histogram<u64>, q: f64) -> f64 {
    h.value_at_quantile(q) as f64 / 1000.0
}

/// The human-readable table.
pub fn render(r: &Report, args: &BenchDonorArgs) -> String {
    let ratio = |f: f64, m: f64| if m > 0.0 { f / m } else { f64::NAN };
    let (f, m) = (r.farmem, r.memcached);
    let mut out = format!(
        "farmem-bench donor: {} pages ({:.0} MiB) in each system, loopback TCP, one connection each\n",
        args.pages,
        f64::from(args.pages) * PAGE_SIZE as f64 / f64::from(1u32 << 20)
    );
    out.push_str(&format!(
        "{:<46} {:>12} {:>12} {:>18}\n",
        "", "farmem", "memcached", "farmem/memcached"
    ));
    let rows = [
        (
            format!("single-page read p50 (µs, {} reads)", args.requests),
            f.single_p50_us,
            m.single_p50_us,
        ),
        (
            "single-page read p99 (µs)".to_string(),
            f.single_p99_us,
            m.single_p99_us,
        ),
        (
            format!("batch read, {BATCH_PAGES} pages x {IN_FLIGHT} in flight (pages/s)"),
            f.batch_pages_per_s,
            m.batch_pages_per_s,
        ),
    ];
    for (name, fv, mv) in rows {
        out.push_str(&format!(
            "{name:<46} {fv:>12.1} {mv:>12.1} {:>17.2}x\n",
            ratio(fv, mv)
        ));
    }
    let met = |ok: bool| if ok { "met" } else { "NOT met" };
    out.push_str(&format!(
        "targets: batch throughput >= 2x memcached: {} ({:.2}x); single-page p50 <= memcached: {} ({:.2}x)\n",
        met(f.batch_pages_per_s >= 2.0 * m.batch_pages_per_s),
        ratio(f.batch_pages_per_s, m.batch_pages_per_s),
        met(f.single_p50_us <= m.single_p50_us),
        ratio(f.single_p50_us, m.single_p50_us),
    ));
    out
}

/// What both systems offer the measurement loops.
trait PageServer {
    /// Reads one page into `out` (4096 bytes).
    fn read_one(&mut self, page: u32, out: &mut [u8]) -> anyhow::Result<()>;
    /// Reads `count` batches of [`BATCH_PAGES`] pages drawn from `next`, [`IN_FLIGHT`] at once.
    fn read_batches(&mut self, count: u64, next: &mut dyn FnMut() -> u32) -> anyhow::Result<()>;
}

/// Rounds the measurements are split into (alternating the systems).
const ROUNDS: u64 = 10;

/// Round `round`'s share of `total`.
fn share(total: u64, round: u64) -> u64 {
    total / ROUNDS + u64::from(round < total % ROUNDS)
}

fn new_histogram() -> anyhow::Result<Histogram<u64>> {
    Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3).context("creating a latency histogram")
}

/// Measures `count` single-page reads of random pages.
fn single(
    server: &mut dyn PageServer,
    rng: &mut XorShift,
    pages: u32,
    count: u64,
) -> anyhow::Result<Histogram<u64>> {
    let mut hist = new_histogram()?;
    single_into(&mut hist, server, rng, pages, count)?;
    Ok(hist)
}

/// Records `count` single-page read latencies (ns) into `hist`.
fn single_into(
    hist: &mut Histogram<u64>,
    server: &mut dyn PageServer,
    rng: &mut XorShift,
    pages: u32,
    count: u64,
) -> anyhow::Result<()> {
    let mut buf = vec![0u8; PAGE_SIZE];
    for _ in 0..count {
        let page = rng.below(pages);
        let start = Instant::now();
        server.read_one(page, &mut buf)?;
        let ns = start.elapsed().as_nanos() as u64;
        check_page(page, &buf)?;
        hist.saturating_record(ns.max(1));
    }
    Ok(())
}

/// Reads `count` batches; returns the time taken.
fn batches(
    server: &mut dyn PageServer,
    rng: &mut XorShift,
    pages: u32,
    count: u64,
) -> anyhow::Result<Duration> {
    let mut next = || rng.below(pages);
    let start = Instant::now();
    if count > 0 {
        server.read_batches(count, &mut next)?;
    }
    Ok(start.elapsed())
}

/// The bytes of page `index`: its index in the first and last 8 bytes, a filler in between.
fn make_page(index: u32) -> Vec<u8> {
    let mut p = vec![(index as u8) ^ 0x5A; PAGE_SIZE];
    let tag = u64::from(index).to_le_bytes();
    p[..8].copy_from_slice(&tag);
    p[PAGE_SIZE - 8..].copy_from_slice(&tag);
    p
}

fn check_page(index: u32, data: &[u8]) -> anyhow::Result<()> {
    let tag = u64::from(index).to_le_bytes();
    ensure!(
        data.len() == PAGE_SIZE && data[..8] == tag && data[PAGE_SIZE - 8..] == tag,
        "page {index} came back with the wrong bytes"
    );
    Ok(())
}

/// A small deterministic generator, so both systems read the same page sequence.
struct XorShift(u64);

impl XorShift {
    fn below(&mut self, n: u32) -> u32 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % u64::from(n)) as u32
    }
}

/// The in-process donor and a client of it.
struct FarmemSide {
    // Field order is drop order: the client closes before the donor stops.
    client: DonorClient,
    slabs: Vec<u32>,
    slab_pages: u32,
    _donor: RunningDonor,
}

impl FarmemSide {
    fn start(pages: u32) -> anyhow::Result<FarmemSide> {
        let slab_pages = (SLAB_BYTES / PAGE_SIZE as u64) as u32;
        let slab_count = pages.div_ceil(slab_pages);
        let donor = DonorServer::bind(DonorConfig {
            listen: "127.0.0.1:0".into(),
            capacity_bytes: u64::from(slab_count) * SLAB_BYTES,
            slab_size_bytes: SLAB_BYTES,
            ..DonorConfig::default()
        })
        .context("starting the bench donor on 127.0.0.1")?
        .spawn();
        let client = DonorClient::connect(
            &donor.local_addr().to_string(),
            ClientConfig {
                client_id: 1,
                request_timeout: Duration::from_secs(30),
                ..ClientConfig::default()
            },
        )?;
        let slabs = (0..slab_count)
            .map(|_| client.alloc_slab())
            .collect::<Result<Vec<_>, _>>()?;
        Ok(FarmemSide {
            _donor: donor,
            client,
            slabs,
            slab_pages,
        })
    }

    fn addr(&self, index: u32) -> PageAddr {
        PageAddr {
            slab: self.slabs[(index / self.slab_pages) as usize],
            page: index % self.slab_pages,
        }
    }

    fn load(&mut self, pages: u32) -> anyhow::Result<()> {
        let mut window = VecDeque::new();
        for chunk_start in (0..pages).step_by(BATCH_PAGES) {
            let end = (chunk_start + BATCH_PAGES as u32).min(pages);
            let data: Vec<Vec<u8>> = (chunk_start..end).map(make_page).collect();
            let writes: Vec<PageWrite<'_>> = (chunk_start..end)
                .zip(&data)
                .map(|(i, d)| PageWrite {
                    addr: self.addr(i),
                    data: d,
                })
                .collect();
            window.push_back(self.client.submit_write(&writes)?);
            if window.len() == IN_FLIGHT {
                if let Some(p) = window.pop_front() {
                    p.wait()?;
                }
            }
        }
        for p in window {
            p.wait()?;
        }
        Ok(())
    }
}

impl PageServer for FarmemSide {
    fn read_one(&mut self, page: u32, out: &mut [u8]) -> anyhow::Result<()> {
        Ok(self.client.read_pages(&[self.addr(page)], out)?)
    }

    fn read_batches(&mut self, count: u64, next: &mut dyn FnMut() -> u32) -> anyhow::Result<()> {
        let mut window = VecDeque::with_capacity(IN_FLIGHT);
        let wait_oldest = |window: &mut VecDeque<(Vec<u32>, farmem_transport::Pending)>| {
            let Some((indices, pending)) = window.pop_front() else {
                return Ok(());
            };
            let Completion::Pages(data) = pending.wait()? else {
                bail!("the donor answered a read without pages");
            };
            for (i, page) in indices.iter().zip(data.chunks_exact(PAGE_SIZE)) {
                check_page(*i, page)?;
            }
            anyhow::Ok(())
        };
        for _ in 0..count {
            let indices: Vec<u32> = (0..BATCH_PAGES).map(|_| next()).collect();
            let addrs: Vec<PageAddr> = indices.iter().map(|&i| self.addr(i)).collect();
            let pending = self.client.submit_read(&addrs)?;
            window.push_back((indices, pending));
            if window.len() == IN_FLIGHT {
                wait_oldest(&mut window)?;
            }
        }
        while !window.is_empty() {
            wait_oldest(&mut window)?;
        }
        Ok(())
    }
}

/// A memcached child process and one text-protocol connection to it. Stopped on drop.
struct Memcached {
    child: Child,
    reader: BufReader<TcpStream>,
    writer: BufWriter<TcpStream>,
    line: Vec<u8>,
}

impl Memcached {
    fn start(bin: &PathBuf, pages: u32, threads: u32) -> anyhow::Result<Memcached> {
        // A free port: bind :0, note it, release it for memcached.
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .context("finding a free port on 127.0.0.1")?
            .port();
        // 4 KiB values sit in ~4.6 KiB chunks; give half as much again plus slack.
        let memory_mb = u64::from(pages) * PAGE_SIZE as u64 * 3 / 2 / (1 << 20) + 64;
        let mut child = Command::new(bin)
            .args(["-l", "127.0.0.1", "-p", &port.to_string(), "-U", "0"])
            .args(["-m", &memory_mb.to_string(), "-M", "-c", "64", "-u", "nobody"])
            .args(["-t", &threads.to_string()])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| {
                if e.kind() == std::io::ErrorKind::NotFound {
                    anyhow::anyhow!(
                        "memcached was not found ({}): install the Debian package `memcached` (apt-get install memcached) or pass --memcached PATH",
                        bin.display()
                    )
                } else {
                    anyhow::Error::new(e).context(format!("starting {}", bin.display()))
                }
            })?;
        let deadline = Instant::now() + Duration::from_secs(10);
        let stream = loop {
            if let Some(status) = child.try_wait()? {
                let mut err = String::new();
                if let Some(mut e) = child.stderr.take() {
                    let _ = e.read_to_string(&mut err);
                }
                bail!(
                    "memcached exited at start ({status}) on 127.0.0.1:{port}: {}",
                    err.trim()
                );
            }
            match TcpStream::connect(("127.0.0.1", port)) {
                Ok(s) => break s,
                Err(_) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(20))
                }
                Err(e) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    bail!("memcached did not start listening on 127.0.0.1:{port} within 10 s: {e}");
                }
            }
        };
        stream.set_nodelay(true)?;
        stream.set_read_timeout(Some(Duration::from_secs(30)))?;
        let reader = BufReader::with_capacity(256 * 1024, stream.try_clone()?);
        let writer = BufWriter::with_capacity(64 * 1024, stream);
        Ok(Memcached {
            child,
            reader,
            writer,
            line: Vec::new(),
        })
    }

    fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Stores every page with pipelined `set`s, 64 per round trip.
    fn load(&mut self, pages: u32) -> anyhow::Result<()> {
        for chunk_start in (0..pages).step_by(BATCH_PAGES) {
            let end = (chunk_start + BATCH_PAGES as u32).min(pages);
            for i in chunk_start..end {
                write!(self.writer, "set p{i} 0 0 {PAGE_SIZE}\r\n")?;
                self.writer.write_all(&make_page(i))?;
                self.writer.write_all(b"\r\n")?;
            }
            self.writer.flush()?;
            for i in chunk_start..end {
                let line = self.read_line()?;
                ensure!(
                    line == b"STORED",
                    "memcached did not store page {i}: {}",
                    String::from_utf8_lossy(line)
                );
            }
        }
        Ok(())
    }

    fn read_line(&mut self) -> anyhow::Result<&[u8]> {
        self.line.clear();
        let n = self
            .reader
            .read_until(b'\n', &mut self.line)
            .context("reading from memcached")?;
        ensure!(n > 0, "memcached closed the connection");
        while matches!(self.line.last(), Some(b'\n' | b'\r')) {
            self.line.pop();
        }
        Ok(&self.line)
    }

    fn send_get(&mut self, pages: &[u32]) -> anyhow::Result<()> {
        self.writer.write_all(b"get")?;
        for p in pages {
            write!(self.writer, " p{p}")?;
        }
        self.writer.write_all(b"\r\n")?;
        self.writer.flush()?;
        Ok(())
    }

    /// Reads a `get` answer for `pages` (in order), placing page k at `out[4096 * k ..]`.
    fn recv_values(&mut self, pages: &[u32], out: &mut [u8]) -> anyhow::Result<()> {
        for (k, &p) in pages.iter().enumerate() {
            let line = self.read_line()?;
            let expected = format!("VALUE p{p} 0 {PAGE_SIZE}");
            ensure!(
                line == expected.as_bytes(),
                "memcached answered {:?} where {expected:?} was expected (page evicted?)",
                String::from_utf8_lossy(line)
            );
            self.reader
                .read_exact(&mut out[k * PAGE_SIZE..(k + 1) * PAGE_SIZE])?;
            let mut crlf = [0u8; 2];
            self.reader.read_exact(&mut crlf)?;
            ensure!(&crlf == b"\r\n", "memcached value not followed by CRLF");
        }
        let line = self.read_line()?;
        ensure!(
            line == b"END",
            "memcached answered {:?} where END was expected",
            String::from_utf8_lossy(line)
        );
        Ok(())
    }
}

impl Drop for Memcached {
    fn drop(&mut self) {
        self.stop();
    }
}

impl PageServer for Memcached {
    fn read_one(&mut self, page: u32, out: &mut [u8]) -> anyhow::Result<()> {
        self.send_get(&[page])?;
        self.recv_values(&[page], out)
    }

    fn read_batches(&mut self, count: u64, next: &mut dyn FnMut() -> u32) -> anyhow::Result<()> {
        let mut window: VecDeque<Vec<u32>> = VecDeque::with_capacity(IN_FLIGHT);
        let mut buf = vec![0u8; BATCH_PAGES * PAGE_SIZE];
        let mut receive = |me: &mut Memcached, pages: Vec<u32>| -> anyhow::Result<()> {
            me.recv_values(&pages, &mut buf)?;
            for (i, page) in pages.iter().zip(buf.chunks_exact(PAGE_SIZE)) {
                check_page(*i, page)?;
            }
            Ok(())
        };
        for _ in 0..count {
            let pages: Vec<u32> = (0..BATCH_PAGES).map(|_| next()).collect();
            self.send_get(&pages)?;
            window.push_back(pages);
            if window.len() == IN_FLIGHT {
                if let Some(oldest) = window.pop_front() {
                    receive(self, oldest)?;
                }
            }
        }
        while let Some(oldest) = window.pop_front() {
            receive(self, oldest)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pages_carry_their_index_and_mixups_are_caught() {
        let p = make_page(70_000);
        check_page(70_000, &p).unwrap();
        assert!(check_page(70_001, &p).is_err());
        assert!(check_page(70_000, &p[..100]).is_err());
    }

    #[test]
    fn rounds_share_the_total_exactly() {
        for total in [0, 1, 9, 10, 11, 20_001] {
            assert_eq!((0..ROUNDS).map(|r| share(total, r)).sum::<u64>(), total);
        }
    }

    #[test]
    fn the_random_sequence_is_reproducible_and_in_range() {
        let a: Vec<u32> = {
            let mut r = XorShift(9);
            (0..100).map(|_| r.below(37)).collect()
        };
        let mut r = XorShift(9);
        assert!(a.iter().all(|&x| x < 37 && x == r.below(37)));
    }

    #[test]
    fn the_json_has_exactly_the_promised_shape() {
        let f = Figures {
            single_p50_us: 1.5,
            single_p99_us: 2.0,
            batch_pages_per_s: 100.0,
        };
        let s = serde_json::to_string(&Report {
            farmem: f,
            memcached: f,
        })
        .unwrap();
        assert_eq!(
            s,
            r#"{"farmem":{"single_p50_us":1.5,"single_p99_us":2.0,"batch_pages_per_s":100.0},"memcached":{"single_p50_us":1.5,"single_p99_us":2.0,"batch_pages_per_s":100.0}}"#
        );
    }
}
