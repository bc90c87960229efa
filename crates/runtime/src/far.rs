//! The far side: connections to donors, slab placement, and the embedded donor.
//!
//! # Design
//!
//! - The far address space is a sequence of far page numbers, handed out densely by the runtime
//!   (freed numbers are reused) and cut into slabs of `slab_pages` pages. A slab is placed on a
//!   donor the first time a page in it is written ([`Far::place`]); with several donors, the
//!   slab goes to the less loaded of two donors drawn at random (power of two choices,
//!   Infiniswap), load being the share of the donor's capacity this runtime already uses.
//!   A donor that refuses (full, quota) is skipped for the next one.
//! - Each donor gets two [`DonorClient`]s with the same client id: one for demand reads on the
//!   fault path, one for the sender's write batches, so a 1 MiB write batch never sits in front
//!   of a fault's 4 KiB read on the same TCP stream.
//! - With no donor configured, [`EmbeddedDonor`] starts `farmem donor --listen 127.0.0.1:0` as
//!   a child process (`farmem_donor::ChildDonorCommand`, which reads its banner), and kills it
//!   when the runtime is dropped. The child is spawned from a keeper thread that lives as long as the
//!   runtime, and the child (`--exit-with-parent`) sets `PR_SET_PDEATHSIG(SIGKILL)` itself, so it
//!   also dies with the process. No `pre_exec` hook: std would fork instead of posix_spawn, and
//!   a fork marks every region page shared copy-on-write, which UFFDIO_MOVE refuses to evict.
//!
//! - Sealing ([`crate::seal`]): with [`SealMode::Auto`] pages are sealed when any donor's
//!   address is not one of this host's (loopback, or an address a socket can bind here): a
//!   donor on this host holds this machine's memory, which the program could be read from
//!   anyway, and sealing costs about 1 µs a page each way.
//!
//! # Limitations
//!
//! Slabs are never returned to donors while the runtime lives (freed far pages are reused
//! instead); donors reclaim them when the connection closes (after their orphan grace period).

use std::net::{SocketAddr, ToSocketAddrs, UdpSocket};
use std::time::Duration;

use farmem_transport::{ClientConfig, DonorClient, PageAddr, PageWrite, Pending, Status};
use parking_lot::Mutex;
use rand::Rng;

use crate::embedded::{EmbeddedDonor, FAULT_PATH_SPIN};
use crate::seal::{SealError, Sealer};
use crate::tier::Tier;
use crate::{RuntimeConfig, RuntimeError, SealMode, PAGE_SIZE};

/// One donor and what this runtime placed on it.
pub(crate) struct Donor {
    pub(crate) read: DonorClient,
    pub(crate) write: DonorClient,
    pub(crate) capacity_bytes: u64,
    pub(crate) slabs_placed: Mutex<u64>,
}

/// Where a far slab lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Home {
    /// On donor `donor`, as its slab `slab`.
    Donor { donor: usize, slab: u32 },
    /// In memory slab `m` ([`crate::memslabs`]: the host tier, or local memory).
    Memory(u32),
}

/// Donors, the host tier and the placement of far slabs on them.
pub(crate) struct Far {
    pub(crate) donors: Vec<Donor>,
    /// Pages per far slab (the smallest slab size among the donors).
    pub(crate) slab_pages: u64,
    /// Far slab index → where the slab lives.
    placement: Mutex<Vec<Option<Home>>>,
    /// The host tier, when one is used ([`crate::tier`]).
    pub(crate) tier: Option<Tier>,
    /// Seals pages before they leave and opens them when they come back; `None`: pages
    /// travel and rest in the clear.
    pub(crate) sealer: Option<Sealer>,
    /// Kept alive for as long as the runtime: dropping it stops the embedded donor.
    _embedded: Option<EmbeddedDonor>,
}

/// Whether `addr` (HOST:PORT) names this host: a loopback address, or one a socket can bind
/// here.
fn on_this_host(addr: &str) -> bool {
    let Ok(resolved) = addr.to_socket_addrs() else {
        return false;
    };
    let mut any = false;
    for a in resolved {
        any = true;
        let ip = a.ip();
        if !ip.is_loopback() && UdpSocket::bind(SocketAddr::new(ip, 0)).is_err() {
            return false;
        }
    }
    any
}

impl Far {
    /// Opens the host tier and connects to the configured donors; with neither, starts the
    /// embedded TCP donor.
    pub(crate) fn connect(cfg: &RuntimeConfig) -> Result<Far, RuntimeError> {
        let tier = Tier::open(cfg)?;
        // A random client id and reconnect key (ClientConfig::default), shared by every
        // connection of this runtime: they attach to one client on each donor.
        let ccfg = ClientConfig {
            token: cfg.token.clone(),
            request_timeout: cfg.request_timeout,
            link_delay_us: cfg.link_delay_us,
            thread_hook: cfg.thread_hook.clone(),
            ..ClientConfig::default()
        };
        let (addrs, embedded) = if cfg.donors.is_empty() && tier.is_none() {
            let e = EmbeddedDonor::start(cfg)?;
            (vec![e.addr.clone()], Some(e))
        } else {
            (cfg.donors.clone(), None)
        };
        let mut donors = Vec::new();
        for a in &addrs {
            let connect = |purpose: &'static str, spin: Duration| {
                DonorClient::connect(
                    a,
                    ClientConfig {
                        spin,
                        ..ccfg.clone()
                    },
                )
                .map_err(|source| RuntimeError::Donor {
                    addr: a.clone(),
                    step: purpose,
                    source,
                })
            };
            // Only the fault path's reads spin while waiting (see ClientConfig::spin):
            // spinning on write-back and prefetch batches slowed a sequential scan by 20-40%
            // on this 2-core machine, where it takes CPU from the pipeline.
            let read = connect("connecting (fault path)", FAULT_PATH_SPIN)?;
            let write = connect("connecting (write-back)", Duration::ZERO)?;
            let info = read.info();
            donors.push(Donor {
                read,
                write,
                capacity_bytes: info.capacity_bytes,
                slabs_placed: Mutex::new(0),
            });
        }
        // One far slab size for every home: the smallest slab any of them hands out.
        let slab_bytes = donors
            .iter()
            .map(|d| d.read.info().slab_size_bytes)
            .chain(tier.as_ref().map(Tier::slab_bytes))
            .min()
            .unwrap_or(64 << 20);
        if slab_bytes < PAGE_SIZE as u64 || !slab_bytes.is_multiple_of(PAGE_SIZE as u64) {
            return Err(RuntimeError::BadDonor {
                addr: addrs
                    .first()
                    .cloned()
                    .unwrap_or_else(|| "the host tier".into()),
                reason: format!("slab size {slab_bytes} is not a positive multiple of 4096"),
            });
        }
        // The host tier is this machine's memory: never sealed (see the module doc).
        let seal = match cfg.seal {
            SealMode::On => !addrs.is_empty(),
            SealMode::Off => false,
            SealMode::Auto => embedded.is_none() && !addrs.iter().all(|a| on_this_host(a)),
        };
        let sealer = if seal {
            Some(Sealer::new().map_err(RuntimeError::Seal)?)
        } else {
            None
        };
        Ok(Far {
            donors,
            slab_pages: slab_bytes / PAGE_SIZE as u64,
            placement: Mutex::new(Vec::new()),
            tier,
            sealer,
            _embedded: embedded,
        })
    }

    /// Opens, in place, a page fetched for far page `far` when pages are sealed; on an error
    /// the bytes are not the page and must not be installed.
    pub(crate) fn open(&self, far: u64, page: &mut [u8]) -> Result<(), SealError> {
        match &self.sealer {
            Some(s) => s.open(far, page),
            None => Ok(()),
        }
    }

    /// Total capacity the donors and the host tier lend, in bytes.
    pub(crate) fn capacity_bytes(&self) -> u64 {
        self.donors.iter().map(|d| d.capacity_bytes).sum::<u64>()
            + self.tier.as_ref().map_or(0, Tier::capacity_bytes)
    }

    /// Where far page `far` lives, and its page index in that slab, if its slab is placed.
    pub(crate) fn home(&self, far: u64) -> Option<(Home, u32)> {
        let idx = (far / self.slab_pages) as usize;
        let home = (*self.placement.lock().get(idx)?)?;
        Some((home, (far % self.slab_pages) as u32))
    }

    /// Where far page `far` lives on a donor, if its slab is placed on one.
    pub(crate) fn locate(&self, far: u64) -> Option<(usize, PageAddr)> {
        match self.home(far)? {
            (Home::Donor { donor, slab }, page) => Some((donor, PageAddr { slab, page })),
            (Home::Memory(_), _) => None,
        }
    }

    /// Records where far slab `idx` lives (`None`: nowhere yet).
    pub(crate) fn set_home(&self, idx: u64, home: Option<Home>) {
        let mut p = self.placement.lock();
        let idx = idx as usize;
        if p.len() <= idx {
            p.resize(idx + 1, None);
        }
        p[idx] = home;
    }

    /// Allocates a slab on a donor (power of two choices; a full donor is skipped for
    /// the next), without recording it: the caller records it with [`Far::set_home`].
    pub(crate) fn alloc_on_donor(&self) -> Result<Home, RuntimeError> {
        let order = self.choice_order();
        let mut last = None;
        for d in order {
            match self.donors[d].write.alloc_slab() {
                Ok(slab) => {
                    *self.donors[d].slabs_placed.lock() += 1;
                    return Ok(Home::Donor { donor: d, slab });
                }
                Err(e) => {
                    let full = matches!(
                        e.status(),
                        Some(
                            Status::CapacityExhausted
                                | Status::QuotaExceeded
                                | Status::MemoryPressure
                        )
                    );
                    last = Some((d, e, full));
                }
            }
        }
        match last {
            Some((d, source, true)) => Err(RuntimeError::DonorsFull {
                donors: self.donors.len(),
                capacity_bytes: self.capacity_bytes(),
                addr: self.donors[d].read.addr().to_string(),
                source,
            }),
            Some((d, source, false)) => Err(RuntimeError::Donor {
                addr: self.donors[d].read.addr().to_string(),
                step: "allocating a slab",
                source,
            }),
            None => Err(RuntimeError::NowhereToPlace {
                tier: self
                    .tier
                    .as_ref()
                    .map_or_else(|| "no host tier".into(), Tier::describe),
            }),
        }
    }

    /// Donor indexes in the order to try for a new slab: the less loaded of two random
    /// donors first, then the other, then the rest.
    fn choice_order(&self) -> Vec<usize> {
        let n = self.donors.len();
        if n <= 1 {
            return (0..n).collect();
        }
        let mut rng = rand::thread_rng();
        let a = rng.gen_range(0..n);
        let mut b = rng.gen_range(0..n - 1);
        if b >= a {
            b += 1;
        }
        let load = |i: usize| {
            let d = &self.donors[i];
            (*d.slabs_placed.lock() * self.slab_pages * PAGE_SIZE as u64) as f64
                / d.capacity_bytes.max(1) as f64
        };
        let (first, second) = if load(b) < load(a) { (b, a) } else { (a, b) };
        let mut order = vec![first, second];
        order.extend((0..n).filter(|i| *i != a && *i != b));
        order
    }

    /// Slabs placed so far (on donors and in memory).
    pub(crate) fn slabs_placed(&self) -> u64 {
        self.placement.lock().iter().flatten().count() as u64
    }

    /// Starts the read of one far page on the fault-path connection of its donor.
    pub(crate) fn submit_read(&self, far: u64) -> Result<Pending, RuntimeError> {
        let (d, addr) = self.locate(far).ok_or(RuntimeError::Internal(
            "a remote page's slab is not placed on a donor",
        ))?;
        self.donors[d]
            .read
            .submit_read(&[addr])
            .map_err(|source| RuntimeError::Donor {
                addr: self.donors[d].read.addr().to_string(),
                step: "reading a page",
                source,
            })
    }

    /// Writes a batch of pages (all on donor `d`, at most 256) and waits for the ack.
    pub(crate) fn write(&self, d: usize, pages: &[PageWrite<'_>]) -> Result<(), RuntimeError> {
        self.donors[d]
            .write
            .write_pages(pages)
            .map_err(|source| RuntimeError::Donor {
                addr: self.donors[d].write.addr().to_string(),
                step: "writing evicted pages",
                source,
            })
    }
}

/// Placement statistics per donor, for tests and stats: slabs placed on each.
pub(crate) fn slabs_per_donor(far: &Far) -> Vec<u64> {
    far.donors.iter().map(|d| *d.slabs_placed.lock()).collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn loopback_and_local_addresses_are_on_this_host() {
        assert!(super::on_this_host("127.0.0.1:7070"));
        assert!(super::on_this_host("localhost:7070"));
        assert!(super::on_this_host("0.0.0.0:7070"));
        // TEST-NET-3 (RFC 5737): never assigned to a host, so never this one.
        assert!(!super::on_this_host("203.0.113.9:7070"));
        assert!(!super::on_this_host("no-such-host.invalid:7070"));
    }
}
