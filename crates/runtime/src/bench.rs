//! The fault-latency benchmark behind `farmem bench fault`: what one page fault costs, end to
//! end as the program sees it, next to the two baselines it is made of, all in one run.
//!
//! - **floor**: a userfaultfd fault answered from memory already in the process (a handler
//!   thread answering with UFFDIO_COPY from a buffer): the cost of userfaultfd itself.
//! - **rtt**: one 4 KiB page read from the donor over the transport (no fault).
//! - **miss**: a demand fault on an evicted page that must come from the donor (prefetching
//!   off, a write-back pool of 16 pages so evicted pages are not cached locally).
//! - **pool_hit**: a fault on an evicted page still in the write-back pool (moved back).
//!
//! Each figure is the latency of the touching load, measured by the touching thread. The
//! target is `miss_p50 ≤ 1.3 × (floor_p50 + rtt_p50)`: the fault path adds almost nothing to
//! what userfaultfd and the network cost.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use farmem_transport::{ClientConfig, DonorClient, PageAddr, PageWrite};
use farmem_uffd::{Event, Features, RegisterMode, Uffd};
use hdrhistogram::Histogram;
use serde::Serialize;

use crate::{Runtime, RuntimeConfig, RuntimeError, Stats, PAGE_SIZE};

/// What to measure.
#[derive(Clone, Debug)]
pub struct FaultBenchConfig {
    /// Donor address (HOST:PORT) used for rtt, miss and pool hit.
    pub donor: String,
    /// Faults (or reads) measured per figure.
    pub samples: usize,
}

/// The figures, microseconds.
#[derive(Clone, Debug, Serialize)]
pub struct FaultBenchReport {
    pub floor_p50_us: f64,
    pub rtt_p50_us: f64,
    pub miss_p50_us: f64,
    pub miss_p99_us: f64,
    pub pool_hit_p50_us: f64,
    /// Share of the miss samples the runtime served from the donor (should be ~1).
    pub miss_remote_fraction: f64,
    /// Share of the pool-hit samples served from the pool (should be ~1).
    pub pool_hit_fraction: f64,
}

fn hist() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 60_000_000_000, 3).expect("valid bounds")
}

fn p(h: &Histogram<u64>, q: f64) -> f64 {
    h.value_at_quantile(q) as f64 / 1000.0
}

/// A private anonymous mapping the benchmark owns.
struct Scratch {
    addr: usize,
    len: usize,
}

impl Scratch {
    fn new(len: usize) -> Result<Scratch, RuntimeError> {
        let addr = crate::mmap_anon(len, "mapping benchmark memory")?;
        Ok(Scratch { addr, len })
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        // SAFETY: the benchmark's own mapping, no longer used.
        unsafe { libc::munmap(self.addr as *mut libc::c_void, self.len) };
    }
}

/// Times one load from `addr` (nanoseconds).
fn touch(addr: usize) -> u64 {
    let t0 = Instant::now();
    // SAFETY: `addr` lies in a live mapping (a region or the floor's scratch mapping) owned by
    // the benchmark; the load is volatile so it really happens.
    unsafe { std::ptr::read_volatile(addr as *const u8) };
    t0.elapsed().as_nanos() as u64
}

/// Writes a non-zero word into the page at `addr`.
fn stamp(addr: usize, v: u64) {
    // SAFETY: as in `touch`; a volatile store into a page of a live region.
    unsafe { std::ptr::write_volatile(addr as *mut u64, v | 1) };
}

fn floor(samples: usize) -> Result<f64, RuntimeError> {
    let map = Scratch::new(samples * PAGE_SIZE)?;
    let uffd = Arc::new(
        Uffd::open(Features::empty(), Features::empty()).map_err(|source| RuntimeError::Uffd {
            step: "opening the floor benchmark's userfaultfd",
            source,
        })?,
    );
    // SAFETY: the scratch mapping is owned here and only touched through `touch`.
    unsafe {
        uffd.register(
            map.addr,
            map.len,
            RegisterMode {
                missing: true,
                wp: false,
            },
        )
    }
    .map_err(|source| RuntimeError::Uffd {
        step: "registering the floor benchmark's mapping",
        source,
    })?;
    let stop = Arc::new(AtomicBool::new(false));
    let handler = {
        let uffd = uffd.clone();
        let stop = stop.clone();
        std::thread::spawn(move || {
            let page = vec![0x5au8; PAGE_SIZE];
            let mut evs = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                let _ = uffd.wait_readable(50);
                evs.clear();
                let _ = uffd.read_events(&mut evs);
                for e in evs.drain(..) {
                    if let Event::Pagefault { addr, .. } = e {
                        let _ = uffd.copy(addr & !(PAGE_SIZE - 1), &page, false, false);
                    }
                }
            }
        })
    };
    let mut h = hist();
    for i in 0..samples {
        let _ = h.record(touch(map.addr + i * PAGE_SIZE).max(1));
    }
    stop.store(true, Ordering::Relaxed);
    let _ = handler.join();
    let _ = uffd.unregister(map.addr, map.len);
    Ok(p(&h, 0.5))
}

fn rtt(donor: &str, samples: usize) -> Result<f64, RuntimeError> {
    let err = |step: &'static str| {
        move |source| RuntimeError::Donor {
            addr: donor.to_string(),
            step,
            source,
        }
    };
    let c = DonorClient::connect(donor, ClientConfig::default()).map_err(err("connecting"))?;
    let slab = c.alloc_slab().map_err(err("allocating a slab"))?;
    let addr = PageAddr { slab, page: 0 };
    let data = vec![7u8; PAGE_SIZE];
    c.write_pages(&[PageWrite { addr, data: &data }])
        .map_err(err("writing a page"))?;
    let mut out = vec![0u8; PAGE_SIZE];
    let mut h = hist();
    for i in 0..samples + 200 {
        let t0 = Instant::now();
        c.read_pages(&[addr], &mut out)
            .map_err(err("reading a page"))?;
        if i >= 200 {
            let _ = h.record((t0.elapsed().as_nanos() as u64).max(1));
        }
    }
    let _ = c.free_slab(slab);
    Ok(p(&h, 0.5))
}

/// Waits until the sender has nothing left to send (the sent count stops moving).
fn quiesce(rt: &Runtime) -> Stats {
    let mut last = rt.stats();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        std::thread::sleep(Duration::from_millis(100));
        let now = rt.stats();
        if (now.evicted_sent_dirty == last.evicted_sent_dirty
            && now.resident_pages <= now.budget_pages)
            || Instant::now() > deadline
        {
            return now;
        }
        last = now;
    }
}

fn miss(donor: &str, samples: usize) -> Result<(f64, f64, f64), RuntimeError> {
    let budget_pages = 1024;
    let rt = Runtime::start(RuntimeConfig {
        budget_bytes: (budget_pages * PAGE_SIZE) as u64,
        donors: vec![donor.to_string()],
        pool_bytes: Some(16 * PAGE_SIZE as u64),
        ..RuntimeConfig::default()
    })?;
    let pages = samples + 2 * budget_pages;
    let region = rt.map(pages * PAGE_SIZE)?;
    let base = region.as_ptr() as usize;
    for i in 0..pages {
        stamp(base + i * PAGE_SIZE, i as u64);
    }
    let before = quiesce(&rt);
    let mut h = hist();
    for i in 0..samples {
        let _ = h.record(touch(base + i * PAGE_SIZE).max(1));
    }
    let after = rt.stats();
    let remote = (after.faults_remote - before.faults_remote) as f64 / samples as f64;
    Ok((p(&h, 0.5), p(&h, 0.99), remote))
}

fn pool_hit(donor: &str, samples: usize) -> Result<(f64, f64), RuntimeError> {
    let budget_pages = 1024;
    let pool_pages = samples + budget_pages + 64;
    let rt = Runtime::start(RuntimeConfig {
        budget_bytes: (budget_pages * PAGE_SIZE) as u64,
        donors: vec![donor.to_string()],
        pool_bytes: Some((pool_pages * PAGE_SIZE) as u64),
        ..RuntimeConfig::default()
    })?;
    let pages = samples + budget_pages;
    let region = rt.map(pages * PAGE_SIZE)?;
    let base = region.as_ptr() as usize;
    for i in 0..pages {
        stamp(base + i * PAGE_SIZE, i as u64);
    }
    let before = quiesce(&rt);
    let mut h = hist();
    for i in 0..samples {
        let _ = h.record(touch(base + i * PAGE_SIZE).max(1));
    }
    let after = rt.stats();
    let hits = (after.faults_pool_hit - before.faults_pool_hit) as f64 / samples as f64;
    Ok((p(&h, 0.5), hits))
}

/// Runs the whole benchmark.
pub fn fault_bench(cfg: &FaultBenchConfig) -> Result<FaultBenchReport, RuntimeError> {
    if cfg.samples < 10 {
        return Err(RuntimeError::Config(format!(
            "fault benchmark samples {} is too few: give at least 10",
            cfg.samples
        )));
    }
    let floor_p50_us = floor(cfg.samples)?;
    let rtt_p50_us = rtt(&cfg.donor, cfg.samples)?;
    let (miss_p50_us, miss_p99_us, miss_remote_fraction) = miss(&cfg.donor, cfg.samples)?;
    let (pool_hit_p50_us, pool_hit_fraction) = pool_hit(&cfg.donor, cfg.samples)?;
    Ok(FaultBenchReport {
        floor_p50_us,
        rtt_p50_us,
        miss_p50_us,
        miss_p99_us,
        pool_hit_p50_us,
        miss_remote_fraction,
        pool_hit_fraction,
    })
}
