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
//!   a child process (`farmem_host::ChildDonorCommand`, which reads its banner), and kills it
//!   when the runtime is dropped. The child is spawned from a keeper thread that lives as long as the
//!   runtime, and the child (`--exit-with-parent`) sets `PR_SET_PDEATHSIG(SIGKILL)` itself, so it
//!   also dies with the process. No `pre_exec` hook: std would fork instead of posix_spawn, and
//!   a fork marks every region page shared copy-on-write, which UFFDIO_MOVE refuses to evict.
//!
//! - A forked child that borrowed pages its parent left on donors reads them through
//!   connections attached as the parent's client ([`Far::borrowed`], [`Home::Borrowed`],
//!   [`crate::lentdonors`]), numbered after its own donors: the read paths take any donor
//!   index ([`Far::donor`]); placement, healing and migration see only [`Far::donors`].
//! - Sealing ([`crate::slabs::seal`]): with [`SealMode::Auto`] pages are sealed when any donor's
//!   address is not one of this host's (loopback, or an address a socket can bind here): a
//!   donor on this host holds this machine's memory, which the program could be read from
//!   anyway, and sealing costs about 1 µs a page each way.
//!
//! - A far slab's copy on a donor is a *piece* of a donor slab ([`crate::slabs::pack`]): the far slab
//!   size is the smallest of every home's (the host tier's 4 MiB beside donors' 64 MiB), and
//!   a donor slab holds as many far slabs as fit, filled before another is taken.
//!
//! # Limitations
//!
//! Far slabs are never returned to donors while the runtime lives (freed far pages are reused
//! instead); donors reclaim them when the connection closes (after their orphan grace period).

pub(crate) mod backup;
mod connect;
pub(crate) mod health;
mod io;
pub(crate) mod tier;

use crate::sync::{Condvar, Mutex, RwLock};
use farmem_transport::{ClientConfig, DonorClient, Status};
use rand::Rng;

use crate::embedded::EmbeddedDonor;
use crate::error::RuntimeError;
use crate::error::SealError;
use crate::lentcopies::{LentCopies, TableAt};
use crate::lentdonors::LentDonors;
use crate::readtimes::ReadTimes;
use crate::slabs::pack::{Pack, Piece};
use crate::slabs::replicas::{Replica, Replicas};
use crate::slabs::seal::Sealer;
use backup::Backup;
use farmem_contract::DonorUse;
use farmem_proto::PAGE_SIZE;
use health::Health;
use tier::Tier;

/// One donor and what this runtime placed on it.
pub(crate) struct Donor {
    pub(crate) read: DonorClient,
    pub(crate) write: DonorClient,
    /// What it lends (0 until it first answered, for one down at start).
    pub(crate) capacity_bytes: std::sync::atomic::AtomicU64,
    /// Whether its slab size and capacity are known and its pieces cut ([`Far::take_in`]):
    /// [`GEOMETRY_UNKNOWN`] for a donor that did not answer at start, until it does.
    pub(crate) geometry: std::sync::atomic::AtomicU8,
    /// Far slab copies placed on it (pieces of its slabs).
    pub(crate) slabs_placed: Mutex<u64>,
    /// Its slabs and the far slabs packed into them ([`crate::slabs::pack`]).
    pub(crate) pack: Mutex<Pack>,
    /// Alive, suspected or dead ([`crate::far::health`]).
    pub(crate) health: Health,
}

/// [`Donor::geometry`]: known (connected at start, or taken in since).
pub(crate) const GEOMETRY_KNOWN: u8 = 0;
/// [`Donor::geometry`]: not answered yet.
pub(crate) const GEOMETRY_UNKNOWN: u8 = 1;
/// [`Donor::geometry`]: answered, with slabs too small for a far slab: never used.
pub(crate) const GEOMETRY_UNUSABLE: u8 = 2;

/// Where a far slab lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Home {
    /// On donors, one copy each ([`Replicas`]).
    Donors(Replicas),
    /// In memory slab `m` ([`crate::slabs::memslabs`]: the host tier, or local memory).
    Memory(u32),
    /// A slab a forked child's parent lent it on donors ([`crate::fork`]): read through
    /// [`Far::borrowed`] connections (donor indexes past [`Far::donors`]), never written,
    /// healed or moved.
    Borrowed(Replicas),
}

/// Donors, the host tier and the placement of far slabs on them.
pub(crate) struct Far {
    pub(crate) donors: Vec<Donor>,
    /// In a forked child that borrowed pages its parent left on donors: connections attached
    /// as the parent's client (read only), numbered after [`Far::donors`] ([`Far::donor`]).
    pub(crate) borrowed: Vec<Donor>,
    /// Per lender (in [`Far::lent`]), its donor index → the [`Far::borrowed`] connection.
    borrowed_index: Vec<Vec<Option<usize>>>,
    /// Far pages below this are the parent's (a forked child; 0 elsewhere).
    far_floor: u64,
    /// What the parent lent on donors (a forked child): how to open those pages, and what
    /// the child lends in turn.
    lent: Option<LentDonors>,
    /// How this runtime's donor connections are made (token, timeouts), for a forked child
    /// without a runtime that reads pages lent to it ([`LentDonors`]).
    pub(crate) client_base: ClientConfig,
    /// Pages per far slab (the smallest slab size among the donors).
    pub(crate) slab_pages: u64,
    /// Copies of each slab kept on distinct donors (`--replicas`).
    pub(crate) replicas: usize,
    /// Far slab index → where the slab lives.
    placement: Mutex<Vec<Option<Home>>>,
    /// Where the copies of slabs this process lent its forked children are now (made at the
    /// first fork that lends donor pages, [`crate::lentcopies`]); kept current with placement.
    lent_copies: std::sync::OnceLock<LentCopies>,
    /// A fork lent donor copies without the table: its child reads fork-time copies until
    /// the thaw.
    lent_unfollowed: std::sync::atomic::AtomicBool,
    /// Bumped before a restarted donor is registered with again ([`Far::read_epoch`]).
    restart_epoch: std::sync::atomic::AtomicU64,
    /// The host tier, when one is used ([`crate::far::tier`]).
    pub(crate) tier: Option<Tier>,
    /// Seals pages before they leave and opens them when they come back; `None`: pages
    /// travel and rest in the clear.
    pub(crate) sealer: Option<Sealer>,
    /// The local backup file (`--backup-file`), if any.
    pub(crate) backup: Option<Backup>,
    /// When new far slabs last went to the backup file alone ([`Far::alloc_on_donor`]).
    backup_only_log: Mutex<crate::failure_log::FailureLog>,
    /// Held shared while pages are written to a slab's replicas, exclusively while
    /// re-replication copies a chunk or changes a replica list ([`crate::threads::heal`]), so a copy
    /// never overwrites a newer write.
    pub(crate) copy_gate: RwLock<()>,
    /// Replicas dropped from placement: freed on their donor if it comes back, never read
    /// again.
    pub(crate) dropped: Mutex<Vec<Replica>>,
    /// Wakes the heal thread: a donor is suspected, or a slab lost a replica.
    pub(crate) heal_cv: Condvar,
    pub(crate) heal_mu: Mutex<bool>,
    /// How fast donors answer demand reads (the failover delay, [`crate::copies::failover`]).
    pub(crate) read_times: ReadTimes,
    /// How fast donors answer prefetch batches (how long one is waited for when its pages
    /// have another copy).
    pub(crate) batch_times: ReadTimes,
    /// Kept alive for as long as the runtime: dropping it stops the embedded donor.
    _embedded: Option<EmbeddedDonor>,
}

/// What [`Far::connect`] found, for [`Far::from_parts`].
pub(crate) struct Parts {
    pub(crate) donors: Vec<Donor>,
    pub(crate) borrowed: Vec<Donor>,
    pub(crate) borrowed_index: Vec<Vec<Option<usize>>>,
    pub(crate) far_floor: u64,
    pub(crate) lent: Option<LentDonors>,
    pub(crate) client_base: ClientConfig,
    pub(crate) slab_pages: u64,
    pub(crate) replicas: usize,
    pub(crate) tier: Option<Tier>,
    pub(crate) sealer: Option<Sealer>,
    pub(crate) backup: Option<Backup>,
    pub(crate) embedded: Option<EmbeddedDonor>,
}

impl Far {
    /// The far side made of `p`, with nothing placed yet.
    pub(crate) fn from_parts(p: Parts) -> Far {
        Far {
            donors: p.donors,
            borrowed: p.borrowed,
            borrowed_index: p.borrowed_index,
            far_floor: p.far_floor,
            lent: p.lent,
            client_base: p.client_base,
            slab_pages: p.slab_pages,
            replicas: p.replicas,
            placement: Mutex::new(Vec::new()),
            lent_copies: std::sync::OnceLock::new(),
            lent_unfollowed: std::sync::atomic::AtomicBool::new(false),
            restart_epoch: std::sync::atomic::AtomicU64::new(0),
            tier: p.tier,
            sealer: p.sealer,
            backup: p.backup,
            backup_only_log: Mutex::default(),
            copy_gate: RwLock::new(()),
            dropped: Mutex::new(Vec::new()),
            heal_cv: Condvar::new(),
            heal_mu: Mutex::new(false),
            read_times: ReadTimes::default(),
            batch_times: ReadTimes::default(),
            _embedded: p.embedded,
        }
    }

    /// What the parent lent this forked child on donors, if anything.
    pub(crate) fn lent(&self) -> Option<&LentDonors> {
        self.lent.as_ref()
    }

    /// Donor `d`: one of [`Far::donors`], or past them one of [`Far::borrowed`].
    pub(crate) fn donor(&self, d: usize) -> &Donor {
        match d.checked_sub(self.donors.len()) {
            Some(b) => &self.borrowed[b],
            None => &self.donors[d],
        }
    }

    /// Opens, in place, a page fetched for far page `far` when pages are sealed; on an error
    /// the bytes are not the page and must not be installed.
    pub(crate) fn open(&self, far: u64, page: &mut [u8]) -> Result<(), SealError> {
        if far < self.far_floor {
            // Lent by the parent: sealed (or not) by it, under its key.
            return self.lent.as_ref().map_or(Ok(()), |l| l.open(far, page));
        }
        match &self.sealer {
            Some(s) => s.open(far, page),
            None => Ok(()),
        }
    }

    /// Total capacity the donors and the host tier lend, in bytes (each slab takes
    /// `replicas` donor slabs).
    pub(crate) fn capacity_bytes(&self) -> u64 {
        self.donors
            .iter()
            .map(|d| d.capacity_bytes.load(std::sync::atomic::Ordering::Relaxed))
            .sum::<u64>()
            / self.replicas.max(1) as u64
            + self.tier.as_ref().map_or(0, Tier::capacity_bytes)
    }

    /// Where far page `far` lives, and its page index in that slab, if its slab is placed.
    pub(crate) fn home(&self, far: u64) -> Option<(Home, u32)> {
        let idx = (far / self.slab_pages) as usize;
        let home = (*self.placement.lock().get(idx)?)?;
        Some((home, (far % self.slab_pages) as u32))
    }

    /// Records where far slab `idx` lives (`None`: nowhere yet).
    pub(crate) fn set_home(&self, idx: u64, home: Option<Home>) {
        let mut p = self.placement.lock();
        let i = idx as usize;
        if p.len() <= i {
            p.resize(i + 1, None);
        }
        p[i] = home;
        if let Some(t) = self.lent_copies.get() {
            let r = match home {
                Some(Home::Donors(r)) => Some(r),
                _ => None,
            };
            t.republish(idx, r.as_ref());
        }
    }

    /// Changes the replicas of far slab `idx` if it lives on donors; returns them after.
    pub(crate) fn update_replicas(
        &self,
        idx: u64,
        f: impl FnOnce(&mut Replicas),
    ) -> Option<Replicas> {
        let mut p = self.placement.lock();
        match p.get_mut(idx as usize) {
            Some(Some(Home::Donors(r))) => {
                f(r);
                if let Some(t) = self.lent_copies.get() {
                    t.republish(idx, Some(r));
                }
                Some(*r)
            }
            _ => None,
        }
    }

    /// Publishes the copies of far slabs `idx` (lent to a fork now) in this process's table
    /// of lent copies, made on first use; returns where its children find it, or `None`
    /// (logged) if it cannot be made: they keep the copies of the fork.
    pub(crate) fn publish_lent(&self, slabs: &[(u64, Replicas)]) -> Option<TableAt> {
        if self.lent_copies.get().is_none() {
            match LentCopies::new() {
                Ok(t) => {
                    let _ = self.lent_copies.set(t);
                }
                Err(e) => {
                    tracing::warn!(
                        "no table of lent copies ({e}): a forked child reads the copies its \
                         pages had at the fork"
                    );
                    self.lent_unfollowed
                        .store(true, std::sync::atomic::Ordering::Relaxed);
                    return None;
                }
            }
        }
        let t = self.lent_copies.get()?;
        // Under the placement lock: no change of these slabs' copies is published between
        // reading them and publishing them.
        let p = self.placement.lock();
        for &(idx, fork_time) in slabs {
            let r = match p.get(idx as usize) {
                Some(Some(Home::Donors(r))) => *r,
                _ => fork_time,
            };
            t.publish(idx, &r);
        }
        Some(t.at())
    }

    /// In a forked child: lent far page `far`'s copies as its lender published them last
    /// (it may have healed the slab since the fork), on this child's connections; `None`
    /// where the lender keeps no table or the page is not lent.
    pub(crate) fn borrowed_copies_now(&self, far: u64) -> Option<Replicas> {
        if far >= self.far_floor {
            return None;
        }
        self.lent
            .as_ref()
            .and_then(|l| l.copies_now(far, &self.borrowed_index))
    }

    /// The restart epoch of every read: this runtime's own (bumped before it registers again
    /// with a restarted donor) and, in a forked child, its lenders' ([`crate::lentcopies`]).
    /// A page read from a donor is good only if this is the same before its copies are looked
    /// up and once it arrived: a read that resolved a copy before the donor restarted and
    /// reached it after it was taken back named an old slab id, another slab there now.
    pub(crate) fn read_epoch(&self) -> u64 {
        let own = self.restart_epoch.load(std::sync::atomic::Ordering::SeqCst);
        own.wrapping_add(self.lent.as_ref().map_or(0, LentDonors::epochs))
    }

    /// Whether a donor that restarted may be used again while children borrow far pages:
    /// every donor copy lent since the last thaw is in this process's table, so children read
    /// the copies it gives, under its restart epoch (else a child may still read an old slab
    /// id that names a new slab there).
    pub(crate) fn children_follow_restarts(&self) -> bool {
        !self
            .lent_unfollowed
            .load(std::sync::atomic::Ordering::Relaxed)
            && self.lent_copies.get().is_none_or(LentCopies::complete)
    }

    /// Before a restarted donor is used again: reads that overlap are thrown away, this
    /// runtime's and its children's ([`Far::read_epoch`], [`LentCopies::bump_epoch`]).
    pub(crate) fn bump_restart_epoch(&self) {
        self.restart_epoch
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        if let Some(t) = self.lent_copies.get() {
            t.bump_epoch();
        }
    }

    /// Every child that borrowed far pages is gone.
    pub(crate) fn lent_thawed(&self) {
        self.lent_unfollowed
            .store(false, std::sync::atomic::Ordering::Relaxed);
        if let Some(t) = self.lent_copies.get() {
            t.thawed();
        }
    }

    /// Donor `d`, which did not answer at start, has just answered: learns its slab size and
    /// capacity and cuts its slabs into pieces, so it can take copies. False (it stays out,
    /// said once) if its slabs cannot hold a far slab.
    pub(crate) fn take_in(&self, d: usize) -> bool {
        use std::sync::atomic::Ordering;
        let donor = &self.donors[d];
        match donor.geometry.load(Ordering::Acquire) {
            GEOMETRY_KNOWN => return true,
            GEOMETRY_UNUSABLE => return false,
            _ => {}
        }
        let info = donor.write.info();
        let donor_slab_pages = info.slab_size_bytes / PAGE_SIZE as u64;
        if donor_slab_pages < self.slab_pages {
            donor.geometry.store(GEOMETRY_UNUSABLE, Ordering::Release);
            tracing::warn!(
                "donor {}: its slabs ({} bytes) are smaller than this runtime's far slabs ({} \
                 bytes): it is not used",
                donor.write.addr(),
                info.slab_size_bytes,
                self.slab_pages * PAGE_SIZE as u64
            );
            return false;
        }
        *donor.pack.lock() = Pack::new(donor_slab_pages, self.slab_pages);
        donor
            .capacity_bytes
            .store(info.capacity_bytes, Ordering::Relaxed);
        donor.geometry.store(GEOMETRY_KNOWN, Ordering::Release);
        tracing::warn!(
            "donor {}, down when this program started, answers: used from now on",
            donor.write.addr()
        );
        true
    }

    /// Whether lent far page `far` (a forked child's) has a lender that lives and may still
    /// heal its slab.
    pub(crate) fn lender_may_heal(&self, far: u64) -> bool {
        far < self.far_floor && self.lent.as_ref().is_some_and(|l| l.lender_may_heal(far))
    }

    /// Every far slab on donors, with its replicas.
    pub(crate) fn donor_slabs(&self) -> Vec<(u64, Replicas)> {
        self.placement
            .lock()
            .iter()
            .enumerate()
            .filter_map(|(i, h)| match h {
                Some(Home::Donors(r)) => Some((i as u64, *r)),
                _ => None,
            })
            .collect()
    }

    /// Allocates `n` slabs on distinct live donors none of which is in `besides`, each the
    /// less loaded of two drawn at random (power of two choices; a full or failing donor is
    /// skipped for the next). Fewer than `n` live donors: as many as there are (degraded).
    pub(crate) fn alloc_replicas(
        &self,
        n: usize,
        besides: &Replicas,
    ) -> Result<Replicas, RuntimeError> {
        let mut got = Replicas::empty();
        let mut last = None;
        while got.len() < n {
            let mut placed = false;
            for d in self.choice_order(besides, &got) {
                match self.take_piece(d) {
                    Ok(piece) => {
                        *self.donors[d].slabs_placed.lock() += 1;
                        got.push(Replica::new(d, piece, false));
                        placed = true;
                        break;
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
                        self.on_error(d, &e);
                        last = Some((d, e, full));
                    }
                }
            }
            if !placed {
                break;
            }
        }
        if !got.is_empty() {
            return Ok(got);
        }
        match last {
            Some((d, source, true)) => {
                let (taken_bytes, filled_bytes) = self.donor_bytes();
                Err(RuntimeError::DonorsFull {
                    live: self.live_donors(),
                    donors: self.donors.len(),
                    addr: self.donors[d].read.addr().to_string(),
                    taken_bytes,
                    filled_bytes,
                    source: Box::new(source),
                })
            }
            Some((d, source, false)) => Err(RuntimeError::Donor {
                addr: self.donors[d].read.addr().to_string(),
                step: "allocating a slab",
                source,
            }),
            None => Err(self.nowhere_to_place()),
        }
    }

    /// Allocates a new far slab's replicas, without recording them: the caller records them
    /// with [`Far::set_home`].
    /// The error for a far slab neither the host tier nor any donor takes.
    pub(crate) fn nowhere_to_place(&self) -> RuntimeError {
        RuntimeError::NowhereToPlace {
            tier: self.tier.as_ref().map(Tier::describe),
            node_gone: self.tier.as_ref().is_some_and(Tier::is_gone),
            donors: self.donors.len(),
        }
    }

    /// With a backup file, a slab no donor takes (none live, or all full) lives in the file
    /// alone (no replica: its pages are written there directly and read from there) until
    /// re-replication finds a donor for it: the program pages at disk speed and keeps its
    /// budget, as Infiniswap falls back to its disk.
    pub(crate) fn alloc_on_donor(&self) -> Result<Home, RuntimeError> {
        match self.alloc_replicas(self.replicas, &Replicas::empty()) {
            Ok(r) => Ok(Home::Donors(r)),
            Err(e @ (RuntimeError::DonorsFull { .. } | RuntimeError::NowhereToPlace { .. }))
                if self.backup.is_some() && !self.donors.is_empty() =>
            {
                self.backup_only_slab(&e);
                Ok(Home::Donors(Replicas::empty()))
            }
            Err(e) if self.backup.is_some() && self.live_donors() == 0 => {
                self.backup_only_slab(&e);
                Ok(Home::Donors(Replicas::empty()))
            }
            Err(e) => Err(e),
        }
    }

    /// Says (once a cause, then every 30 s) that new far slabs go to the backup file alone.
    fn backup_only_slab(&self, why: &RuntimeError) {
        let why = why.to_string();
        if let Some(n) = self.backup_only_log.lock().should_log(&why) {
            let again = if n > 0 {
                format!(" ({n} more slabs since said)")
            } else {
                String::new()
            };
            tracing::warn!(
                "no donor takes a new far slab ({} of {} donors live: {why}): new far pages go \
                 to the backup file alone, at disk speed, until re-replication finds a donor{again}",
                self.live_donors(),
                self.donors.len()
            );
        }
    }

    /// A piece of one of donor `d`'s slabs for a far slab: of a slab this runtime holds there
    /// if one has room, else of a new one.
    fn take_piece(&self, d: usize) -> Result<Piece, farmem_transport::TransportError> {
        let donor = &self.donors[d];
        donor.pack.lock().take(|| donor.write.alloc_slab())
    }

    /// Gives copy `x` of a far slab up: its piece is free for another far slab, and its donor
    /// slab, once no far slab uses it, is freed on the donor.
    pub(crate) fn release(&self, x: Replica) {
        let Some(donor) = self.donors.get(x.donor) else {
            return; // a borrowed connection's: not ours to free
        };
        {
            // One guard: `*m.lock() = m.lock() - 1` holds the first guard to the statement's
            // end and deadlocks on the second.
            let mut placed = donor.slabs_placed.lock();
            *placed = placed.saturating_sub(1);
        }
        let empty = donor.pack.lock().release(x.piece());
        if let Some(slab) = empty {
            if let Err(e) = donor.write.free_slab(slab) {
                tracing::warn!("freeing slab {slab} on {}: {e}", donor.write.addr());
            }
        }
    }

    /// What this runtime holds on each of its donors now.
    pub(crate) fn donor_uses(&self) -> Vec<DonorUse> {
        let far_slab = self.slab_pages * PAGE_SIZE as u64;
        self.donors
            .iter()
            .map(|d| {
                let (held, pieces) = d.pack.lock().usage();
                let info = d.read.info();
                DonorUse {
                    addr: d.read.addr().to_string(),
                    health: if d.health.is_dead() {
                        "dead"
                    } else if d.health.is_suspect() {
                        "suspect"
                    } else {
                        "live"
                    }
                    .into(),
                    far_slabs: *d.slabs_placed.lock(),
                    bytes_taken: held as u64 * info.slab_size_bytes,
                    bytes_filled: pieces as u64 * far_slab,
                    capacity_bytes: info.capacity_bytes,
                    slab_size_bytes: info.slab_size_bytes,
                }
            })
            .collect()
    }

    /// Bytes of donor slabs held now, and the bytes far slabs fill of them: what this runtime
    /// takes of its donors against what it uses.
    pub(crate) fn donor_bytes(&self) -> (u64, u64) {
        let far_slab = self.slab_pages * PAGE_SIZE as u64;
        self.donors.iter().fold((0, 0), |(taken, filled), d| {
            let (held, pieces) = d.pack.lock().usage();
            (
                taken + held as u64 * d.read.info().slab_size_bytes,
                filled + pieces as u64 * far_slab,
            )
        })
    }

    /// Live donor indexes (not in `a` or `b`) in the order to try for a new slab: the less
    /// loaded of two random ones first, then the other, then the rest.
    fn choice_order(&self, a: &Replicas, b: &Replicas) -> Vec<usize> {
        let mut cands: Vec<usize> = (0..self.donors.len())
            .filter(|d| !a.has(*d) && !b.has(*d) && self.donors[*d].health.is_live())
            .collect();
        if cands.len() <= 1 {
            return cands;
        }
        let mut rng = rand::thread_rng();
        let n = cands.len();
        let i = rng.gen_range(0..n);
        let mut j = rng.gen_range(0..n - 1);
        if j >= i {
            j += 1;
        }
        let load = |d: usize| {
            let d = &self.donors[d];
            (*d.slabs_placed.lock() * self.slab_pages * PAGE_SIZE as u64) as f64
                / d.capacity_bytes
                    .load(std::sync::atomic::Ordering::Relaxed)
                    .max(1) as f64
        };
        let (first, second) = if load(cands[j]) < load(cands[i]) {
            (cands[j], cands[i])
        } else {
            (cands[i], cands[j])
        };
        cands.retain(|d| *d != first && *d != second);
        let mut order = vec![first, second];
        order.extend(cands);
        order
    }

    /// Slabs placed so far (on donors and in memory).
    pub(crate) fn slabs_placed(&self) -> u64 {
        self.placement.lock().iter().flatten().count() as u64
    }

    /// Drops donor `d`'s replica of far slab `idx` (stale, or its donor is dead): never read
    /// again, freed on the donor if it comes back; the heal thread makes a new copy.
    pub(crate) fn drop_replica(&self, idx: u64, d: usize) {
        let mut gone = None;
        self.update_replicas(idx, |r| gone = r.remove(d));
        if let Some(x) = gone {
            self.dropped.lock().push(x);
            self.wake_healer();
        }
    }

    /// Donors neither suspected nor dead.
    pub(crate) fn live_donors(&self) -> usize {
        self.donors.iter().filter(|d| d.health.is_live()).count()
    }

    /// Donor slabs with fewer complete copies on live donors than wanted, and those with
    /// none at all that the backup file cannot serve either: `(degraded, lost)`.
    pub(crate) fn slab_health(&self) -> (u64, u64) {
        let (mut degraded, mut lost) = (0, 0);
        for (_, r) in self.donor_slabs() {
            let live = r
                .readable()
                .filter(|x| self.donors[x.donor].health.is_live())
                .count();
            if live < self.replicas {
                degraded += 1;
            }
            if r.readable().all(|x| self.donors[x.donor].health.is_dead()) && self.backup.is_none()
            {
                lost += 1;
            }
        }
        (degraded, lost)
    }

    /// A request to donor `d` failed with `e`: a connection failure, or the donor having
    /// forgotten this client (restarted), makes it suspected ([`Far::suspect`]).
    pub(crate) fn on_error(&self, d: usize, e: &farmem_transport::TransportError) {
        if e.is_connection_failure() || e.is_forgotten() {
            self.suspect(d);
        }
    }

    /// Donor `d` failed a request: the heal thread probes it soon and declares it dead if it
    /// does not answer ([`crate::threads::heal`]).
    pub(crate) fn suspect(&self, d: usize) {
        if d >= self.donors.len() {
            // A connection to a forked child's parent's client: the heal thread probes only
            // this runtime's donors, so a suspicion would never be cleared; each read still
            // fails over on its own.
            return;
        }
        if self.donor(d).health.suspect() {
            self.wake_healer();
        }
    }

    /// Wakes the heal thread.
    pub(crate) fn wake_healer(&self) {
        *self.heal_mu.lock() = true;
        self.heal_cv.notify_all();
    }
}

/// Placement statistics per donor, for tests and stats: slabs placed on each.
pub(crate) fn slabs_per_donor(far: &Far) -> Vec<u64> {
    far.donors.iter().map(|d| *d.slabs_placed.lock()).collect()
}

/// Far slabs whose first readable copy (the one demand reads go to while its donor is live)
/// is on each donor, in configuration order.
pub(crate) fn first_copies_per_donor(far: &Far) -> Vec<u64> {
    let mut out = vec![0; far.donors.len()];
    for home in far.placement.lock().iter().flatten() {
        if let Home::Donors(r) = home {
            if let Some(first) = r.readable().next() {
                out[first.donor] += 1;
            }
        }
    }
    out
}
