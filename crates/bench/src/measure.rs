//! In-process measurements with farmem's runtime: the rigs behind `farmem-bench fault` (what
//! one page fault costs, end to end as the program sees it, next to the two baselines it is
//! made of, all in one run) and the timed scan behind `farmem-bench prefetch`.
//!
//! The fault figures:
//! - **floor**: a userfaultfd fault answered from memory already in the process (a handler
//!   thread answering with UFFDIO_COPY from a buffer): the cost of userfaultfd itself.
//! - **rtt**: one 4 KiB page read from the donor over the transport (no fault).
//! - **miss**: a demand fault on an evicted page that must come from the donor (prefetching
//!   off, a write-back pool of 16 pages so evicted pages are not cached locally, no host tier:
//!   `TierMode::Off`, so this is the TCP donor path whatever node runs on the machine).
//! - **host_miss**: the same demand fault on a page evicted into the host tier (a `farmem node`
//!   in this process, `TierMode::Node`, no donor): one UFFDIO_COPY from the node's shared
//!   memory, no message.
//! - **pool_hit**: a fault on an evicted page still in the write-back pool (moved back).
//! - **remote_rtt**, **remote_miss**: rtt and miss again with the donor on another "machine"
//!   (its own network namespace behind a veth link, with a token, so pages are sealed as
//!   `--seal auto` chooses for a donor on another host), when one is given.
//!
//! Each figure is the latency of the touching load, measured by the touching thread. The five
//! figures are measured interleaved, in ten rounds, after every rig is set up, so that a change
//! in machine load during the run affects all of them alike. The
//! targets are `miss_p50 ≤ 1.3 × (floor_p50 + rtt_p50)`: the fault path adds almost nothing to
//! what userfaultfd and the network cost; and `host_miss_p50 ≤ 1.3 × floor_p50`: a fault served
//! from the host tier costs little more than userfaultfd itself.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{ensure, Context};
use farmem_runtime::{Region, Runtime, RuntimeConfig, Stats, TierMode, PAGE_SIZE};
use farmem_transport::{ClientConfig, DonorClient, PageAddr, PageWrite};
use farmem_uffd::floor::FaultFloor;
use hdrhistogram::Histogram;

use crate::mem::Pages;

/// What to measure.
#[derive(Clone, Debug)]
pub struct FaultBenchConfig {
    /// Donor address (HOST:PORT) used for rtt, miss and pool hit.
    pub donor: String,
    /// Socket of the `farmem node` used for host_miss (its only client; lending at least
    /// [`host_tier_capacity_bytes`]).
    pub node: PathBuf,
    /// Faults (or reads) measured per figure (at least 100; interleaved in 10 rounds).
    pub samples: usize,
    /// A donor on another host (address and token) for remote_rtt and remote_miss.
    pub remote: Option<(String, Vec<u8>)>,
}

/// The figures, microseconds.
#[derive(Clone, Debug)]
pub struct FaultBenchReport {
    pub floor_p50_us: f64,
    pub rtt_p50_us: f64,
    pub miss_p50_us: f64,
    pub miss_p99_us: f64,
    pub host_miss_p50_us: f64,
    pub host_miss_p99_us: f64,
    pub pool_hit_p50_us: f64,
    /// The round trip and miss with the donor on another host (None without one).
    pub remote_rtt_p50_us: Option<f64>,
    pub remote_miss_p50_us: Option<f64>,
    pub remote_miss_p99_us: Option<f64>,
    /// Share of the remote miss samples served from that donor (None without one).
    pub remote_miss_fraction: Option<f64>,
    /// Share of the miss samples the runtime served from the donor (should be ~1).
    pub miss_remote_fraction: f64,
    /// Share of the host miss samples the runtime served from the host tier (should be ~1).
    pub host_miss_tier_fraction: f64,
    /// Share of the pool-hit samples served from the pool (should be ~1).
    pub pool_hit_fraction: f64,
}

fn hist() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 60_000_000_000, 3).expect("valid bounds")
}

fn p(h: &Histogram<u64>, q: f64) -> f64 {
    h.value_at_quantile(q) as f64 / 1000.0
}

/// Rounds the measurements are interleaved in: each round takes a share of every figure's
/// samples, so a change of machine load in the middle of the run hits all figures alike.
const ROUNDS: usize = 10;

/// The floor: a mapping served by a handler thread answering each fault with UFFDIO_COPY
/// ([`FaultFloor`]).
struct FloorRig(FaultFloor);

impl FloorRig {
    fn new(samples: usize) -> anyhow::Result<FloorRig> {
        let floor = FaultFloor::new(samples).context("setting up the userfaultfd floor")?;
        Ok(FloorRig(floor))
    }

    fn run(&mut self, n: usize, h: &mut Histogram<u64>) -> anyhow::Result<()> {
        for _ in 0..n {
            let took = self
                .0
                .fault_next()
                .context("the floor rig ran out of pages (a farmem-bench bug)")?;
            let _ = h.record((took.as_nanos() as u64).max(1));
        }
        Ok(())
    }
}

/// The round trip: one 4 KiB page read over the transport.
struct RttRig {
    client: DonorClient,
    addr: PageAddr,
    out: Vec<u8>,
    donor: String,
}

impl RttRig {
    fn new(donor: &str, token: Option<&[u8]>) -> anyhow::Result<RttRig> {
        let err = |step: &str| format!("{step} donor {donor}");
        let cfg = ClientConfig {
            token: token.map(<[u8]>::to_vec),
            ..ClientConfig::default()
        };
        let client = DonorClient::connect(donor, cfg).with_context(|| err("connecting to"))?;
        let slab = client
            .alloc_slab()
            .with_context(|| err("allocating a slab on"))?;
        let addr = PageAddr { slab, page: 0 };
        let data = vec![7u8; PAGE_SIZE];
        client
            .write_pages(&[PageWrite { addr, data: &data }])
            .with_context(|| err("writing a page to"))?;
        let mut rig = RttRig {
            client,
            addr,
            out: vec![0u8; PAGE_SIZE],
            donor: donor.to_string(),
        };
        let mut warm = hist();
        rig.run(200, &mut warm)?;
        Ok(rig)
    }

    fn run(&mut self, n: usize, h: &mut Histogram<u64>) -> anyhow::Result<()> {
        for _ in 0..n {
            let t0 = Instant::now();
            self.client
                .read_pages(&[self.addr], &mut self.out)
                .with_context(|| format!("reading a page from donor {}", self.donor))?;
            let _ = h.record((t0.elapsed().as_nanos() as u64).max(1));
        }
        Ok(())
    }
}

/// Waits until write-back has nothing left to do (the counts of pages sent to donors and
/// written into the host tier stop moving).
pub fn quiesce(rt: &Runtime) -> Stats {
    let mut last = rt.stats();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        std::thread::sleep(Duration::from_millis(100));
        let now = rt.stats();
        if (now.evicted_sent_dirty == last.evicted_sent_dirty
            && now.tier_pages_written == last.tier_pages_written
            && now.resident_pages <= now.budget_pages)
            || Instant::now() > deadline
        {
            return now;
        }
        last = now;
    }
}

/// Where a [`FaultRig`]'s evicted pages go.
#[derive(Clone, Copy)]
enum FarTarget<'a> {
    /// The donor at this address, no host tier (`TierMode::Off`).
    Donor(&'a str),
    /// The donor at this address on another host, with this token (pages sealed as
    /// `SealMode::Auto` chooses), no host tier.
    Remote(&'a str, &'a [u8]),
    /// The host tier of the node on this socket, no donor.
    Node(&'a Path),
}

impl std::fmt::Debug for FarTarget<'_> {
    /// Names where pages go; never the token.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FarTarget::Donor(addr) => write!(f, "the donor at {addr}"),
            FarTarget::Remote(addr, _) => write!(f, "the donor at {addr} on another host"),
            FarTarget::Node(socket) => write!(f, "the node at {}", socket.display()),
        }
    }
}

impl FarTarget<'_> {
    /// The runtime configuration sending evicted pages there (and nowhere else).
    fn config(self, budget_pages: usize, pool_pages: usize) -> RuntimeConfig {
        let (donors, tier, token) = match self {
            FarTarget::Donor(addr) => (vec![addr.to_string()], TierMode::Off, None),
            FarTarget::Remote(addr, token) => {
                (vec![addr.to_string()], TierMode::Off, Some(token.to_vec()))
            }
            FarTarget::Node(socket) => (Vec::new(), TierMode::Node(socket.to_path_buf()), None),
        };
        RuntimeConfig {
            budget_bytes: (budget_pages * PAGE_SIZE) as u64,
            donors,
            tier,
            token,
            pool_bytes: Some((pool_pages * PAGE_SIZE) as u64),
            prefetch: "none".into(),
            ..RuntimeConfig::default()
        }
    }
}

/// Budget of every [`FaultRig`], pages.
const RIG_BUDGET_PAGES: usize = 1024;

/// Pages a [`FaultRig`] maps: the `samples` evicted pages it faults on, then the budget and
/// the pool's worth that push them out.
fn rig_pages(samples: usize, pool_pages: usize) -> usize {
    samples + RIG_BUDGET_PAGES + RIG_BUDGET_PAGES.min(pool_pages)
}

/// Pool of the miss rigs: small, so evicted pages are not cached locally.
const MISS_POOL_PAGES: usize = 16;

/// What the node behind host_miss must be able to lend for `samples` samples in slabs of
/// `slab_bytes`: every page of the rig (whole slabs), and two slabs to spare.
pub fn host_tier_capacity_bytes(samples: usize, slab_bytes: u64) -> u64 {
    let bytes = (rig_pages(samples, MISS_POOL_PAGES) * PAGE_SIZE) as u64;
    (bytes.div_ceil(slab_bytes) + 2) * slab_bytes
}

/// A runtime whose first `samples` region pages are evicted (to the donor or the host tier
/// only, or to the write-back pool, depending on the pool size); each measured fault touches
/// the next one.
struct FaultRig {
    rt: Arc<Runtime>,
    region: Region,
    next: usize,
    before: Stats,
}

impl FaultRig {
    fn new(far: FarTarget<'_>, samples: usize, pool_pages: usize) -> anyhow::Result<FaultRig> {
        let rt = Runtime::start(far.config(RIG_BUDGET_PAGES, pool_pages))
            .with_context(|| format!("starting a runtime evicting to {far:?}"))?;
        let pages = rig_pages(samples, pool_pages);
        let region = rt
            .map(pages * PAGE_SIZE)
            .context("mapping the benchmark region")?;
        let mem = Pages::from(&region);
        for i in 0..pages {
            mem.stamp(i, i as u64);
        }
        let before = quiesce(&rt);
        Ok(FaultRig {
            rt,
            region,
            next: 0,
            before,
        })
    }

    fn run(&mut self, n: usize, h: &mut Histogram<u64>) {
        let mem = Pages::from(&self.region);
        for _ in 0..n {
            let _ = h.record(mem.timed_load(self.next).max(1));
            self.next += 1;
        }
    }
}

/// The remote figures' rigs: the round trip and the miss over a donor on another host.
struct RemoteRigs {
    rtt: RttRig,
    miss: FaultRig,
    hr: Histogram<u64>,
    hm: Histogram<u64>,
}

impl RemoteRigs {
    fn new(addr: &str, token: &[u8], samples: usize) -> anyhow::Result<RemoteRigs> {
        let target = FarTarget::Remote(addr, token);
        Ok(RemoteRigs {
            rtt: RttRig::new(addr, Some(token))?,
            miss: FaultRig::new(target, samples, MISS_POOL_PAGES)?,
            hr: hist(),
            hm: hist(),
        })
    }

    fn run(&mut self, n: usize) -> anyhow::Result<()> {
        self.rtt.run(n, &mut self.hr)?;
        self.miss.run(n, &mut self.hm);
        quiesce(&self.miss.rt);
        Ok(())
    }
}

/// Runs the whole benchmark: the figures interleaved in [`ROUNDS`] rounds.
pub fn fault_bench(cfg: &FaultBenchConfig) -> anyhow::Result<FaultBenchReport> {
    ensure!(
        cfg.samples >= ROUNDS * 10,
        "fault benchmark samples {} is too few: give at least {}",
        cfg.samples,
        ROUNDS * 10
    );
    let samples = cfg.samples / ROUNDS * ROUNDS;
    let per = samples / ROUNDS;
    let mut floor = FloorRig::new(samples)?;
    let mut rtt = RttRig::new(&cfg.donor, None)?;
    let donor = FarTarget::Donor(&cfg.donor);
    // Misses: a 16-page pool, so evicted pages are on the donor only.
    let mut miss = FaultRig::new(donor, samples, MISS_POOL_PAGES)?;
    // Host misses: the same, evicted pages in the host tier only.
    let mut host = FaultRig::new(FarTarget::Node(&cfg.node), samples, MISS_POOL_PAGES)?;
    // Pool hits: a pool large enough to keep every evicted page.
    let mut pool = FaultRig::new(donor, samples, samples + RIG_BUDGET_PAGES + 64)?;
    let mut remote = match &cfg.remote {
        Some((addr, token)) => Some(RemoteRigs::new(addr, token, samples)?),
        None => None,
    };
    let (mut hf, mut hr, mut hm, mut hh, mut hp) = (hist(), hist(), hist(), hist(), hist());
    for _ in 0..ROUNDS {
        floor.run(per, &mut hf)?;
        rtt.run(per, &mut hr)?;
        miss.run(per, &mut hm);
        host.run(per, &mut hh);
        pool.run(per, &mut hp);
        if let Some(r) = remote.as_mut() {
            r.run(per)?;
        }
        // Let each runtime's background work (evictions, write-back) finish before the next
        // round, so it does not land on another figure.
        quiesce(&miss.rt);
        quiesce(&host.rt);
        quiesce(&pool.rt);
    }
    let miss_after = miss.rt.stats();
    let host_after = host.rt.stats();
    let pool_after = pool.rt.stats();
    let fraction = |after: u64, before: u64| (after - before) as f64 / samples as f64;
    Ok(FaultBenchReport {
        floor_p50_us: p(&hf, 0.5),
        rtt_p50_us: p(&hr, 0.5),
        miss_p50_us: p(&hm, 0.5),
        miss_p99_us: p(&hm, 0.99),
        host_miss_p50_us: p(&hh, 0.5),
        host_miss_p99_us: p(&hh, 0.99),
        pool_hit_p50_us: p(&hp, 0.5),
        remote_rtt_p50_us: remote.as_ref().map(|r| p(&r.hr, 0.5)),
        remote_miss_p50_us: remote.as_ref().map(|r| p(&r.hm, 0.5)),
        remote_miss_p99_us: remote.as_ref().map(|r| p(&r.hm, 0.99)),
        remote_miss_fraction: remote
            .as_ref()
            .map(|r| fraction(r.miss.rt.stats().faults_remote, r.miss.before.faults_remote)),
        miss_remote_fraction: fraction(miss_after.faults_remote, miss.before.faults_remote),
        host_miss_tier_fraction: fraction(host_after.faults_tier, host.before.faults_tier),
        pool_hit_fraction: fraction(pool_after.faults_pool_hit, pool.before.faults_pool_hit),
    })
}

/// One timed scan for `farmem-bench prefetch`: what it took and the counters around it.
#[derive(Clone, Debug)]
pub struct ScanRun {
    /// Time of the scan (the loads only).
    pub took: Duration,
    /// Counters just before the scan.
    pub before: Stats,
    /// Counters just after the scan.
    pub after: Stats,
}

/// Starts a runtime with `cfg`, maps a region of `pages` pages, writes a non-zero byte into
/// every page (so what exceeds the budget goes to the donors), waits for write-back to settle,
/// then times one load from each page in `order` (page indexes) and checks every value read.
pub fn scan_once(cfg: RuntimeConfig, pages: usize, order: &[usize]) -> anyhow::Result<ScanRun> {
    if let Some(bad) = order.iter().find(|p| **p >= pages) {
        anyhow::bail!("scan order names page {bad} of a {pages}-page region");
    }
    let rt = Runtime::start(cfg).context("starting a runtime")?;
    let region = rt
        .map(pages * PAGE_SIZE)
        .context("mapping the scanned region")?;
    let mem = Pages::from(&region);
    let value = |p: usize| (p % 251 + 1) as u8;
    for p in 0..pages {
        mem.store(p, value(p));
    }
    let before = quiesce(&rt);
    let t0 = Instant::now();
    let mut wrong = 0usize;
    for &p in order {
        wrong += usize::from(mem.load(p) != value(p));
    }
    let took = t0.elapsed();
    let after = rt.stats();
    ensure!(
        wrong == 0,
        "the prefetch scan read wrong data (a farmem bug)"
    );
    Ok(ScanRun {
        took,
        before,
        after,
    })
}
