//! Pages a forked child borrows on donors ([`crate::fork`]): who lent them (a *lender*: a
//! process's client on its donors), where they are, and how to open them.
//!
//! # Design
//!
//! - A lender is the parent's client id and reconnect key, its donors' addresses, the lent far
//!   slabs with their copies (indexes into those addresses) and, when it sealed them, its key
//!   and the lent pages' seals. The child attaches to each donor *as that client* (the donor
//!   checks the key proof as for any connection of the client), reads only, and opens each
//!   page as the lender sealed it at the fork: a copy the lender rewrote since, or one
//!   altered, fails the check.
//! - A child that forks again lends its grandchild both its own pages and those it borrowed:
//!   the latter keep their first lender (so a [`LentDonors`] may name several). Their far
//!   pages are disjoint: each process's own far pages start above everything it borrowed.
//!
//! - The lender keeps a table of where each lent slab's copies are now
//!   ([`crate::lentcopies`]); a child reads each lent page from the copies it gives then (the
//!   parent may have healed the slab elsewhere since the fork), under its restart epoch. A
//!   child's runtime connects to every donor of its lender at its start.

use farmem_transport::{ClientConfig, DonorClient, ReconnectKey};

use crate::error::SealError;
use crate::lentcopies::TableAt;
use crate::readtimes::FAULT_PATH_SPIN;
use crate::slabs::replicas::{Replica, Replicas};
use crate::slabs::seal::LentSeals;
use farmem_proto::PAGE_SIZE;

/// What a forked child needs to read the pages left for it on donors (see the module doc).
/// Set as [`crate::RuntimeConfig::lent_donors`] for the child's runtime.
#[derive(Clone, Debug)]
pub struct LentDonors {
    /// Pages per far slab.
    slab_pages: u64,
    lenders: Vec<Lender>,
    /// The token and timeouts a child without a runtime connects with ([`LentDonors::read`]).
    base: ClientConfig,
}

/// One process's client and the slabs it lent on its donors.
#[derive(Clone, Debug)]
pub(crate) struct Lender {
    client_id: u64,
    reconnect_key: ReconnectKey,
    /// Its donors (its indexes in the replicas below).
    addrs: Vec<String>,
    /// The lent far slabs and their copies, sorted by far slab.
    slabs: Vec<(u64, Replicas)>,
    /// The lent pages' seals and its key, when it sealed them.
    seals: Option<LentSeals>,
    /// Its table of where the lent slabs' copies are now, if it keeps one.
    copies: Option<TableAt>,
}

/// A forked child's connections to what its parent lent on donors ([`LentDonors::connect`]).
#[derive(Default)]
pub(crate) struct Borrowed {
    /// The connections, in the child's donor numbering from `first`.
    pub(crate) clients: Vec<DonorClient>,
    /// Each lent far slab's copies on them.
    pub(crate) homes: Vec<(u64, Replicas)>,
    /// Per lender, its donor index → the child's connection (donor index), if connected.
    pub(crate) index: Vec<Vec<Option<usize>>>,
}

impl Lender {
    /// The client `client` (any of its connections) lending `slabs` on donors `addrs` (the
    /// indexes in `slabs`' copies).
    pub(crate) fn new(
        client: &DonorClient,
        addrs: Vec<String>,
        slabs: Vec<(u64, Replicas)>,
        seals: Option<LentSeals>,
        copies: Option<TableAt>,
    ) -> Lender {
        Lender {
            client_id: client.client_id(),
            reconnect_key: client.reconnect_key().clone(),
            addrs,
            slabs,
            seals,
            copies,
        }
    }

    fn slab(&self, idx: u64) -> Option<&Replicas> {
        self.slabs
            .binary_search_by_key(&idx, |(i, _)| *i)
            .ok()
            .map(|i| &self.slabs[i].1)
    }

    /// This lender restricted to far slabs `keep` (sorted); `None` if none is its.
    fn only(&self, keep: &[u64]) -> Option<Lender> {
        let slabs: Vec<(u64, Replicas)> = self
            .slabs
            .iter()
            .filter(|(i, _)| keep.binary_search(i).is_ok())
            .copied()
            .collect();
        (!slabs.is_empty()).then(|| Lender {
            slabs,
            ..self.clone()
        })
    }

    /// A configuration attaching as this lender's client.
    fn client(&self, base: &ClientConfig) -> ClientConfig {
        ClientConfig {
            client_id: self.client_id,
            reconnect_key: self.reconnect_key.clone(),
            ..base.clone()
        }
    }
}

impl LentDonors {
    /// What `lenders` lent, read with `base`'s token and timeouts.
    pub(crate) fn new(
        slab_pages: u64,
        lenders: Vec<Lender>,
        base: &ClientConfig,
    ) -> Option<LentDonors> {
        (!lenders.is_empty()).then(|| LentDonors {
            slab_pages,
            lenders,
            base: ClientConfig {
                thread_hook: None,
                spin: std::time::Duration::ZERO,
                ..base.clone()
            },
        })
    }

    pub(crate) fn slab_pages(&self) -> u64 {
        self.slab_pages
    }

    fn lender_of(&self, far: u64) -> Option<(&Lender, &Replicas)> {
        let idx = far / self.slab_pages;
        self.lenders
            .iter()
            .find_map(|l| l.slab(idx).map(|r| (l, r)))
    }

    /// In a child's runtime: lent far page `far`'s copies as its lender published them last,
    /// on the child's connections (`index`, from [`LentDonors::connect`]); `None` if its
    /// lender keeps no table or never published that slab.
    pub(crate) fn copies_now(&self, far: u64, index: &[Vec<Option<usize>>]) -> Option<Replicas> {
        let idx = far / self.slab_pages;
        let li = self.lenders.iter().position(|l| l.slab(idx).is_some())?;
        let published = self.lenders[li].copies?.copies(idx)?;
        let mut r = Replicas::empty();
        for p in published {
            if let Some(Some(d)) = index.get(li).and_then(|m| m.get(p.donor)) {
                r.push(p.on(*d));
            }
        }
        Some(r)
    }

    /// The restart epochs of every lender that keeps a table, added: a read of a lent page is
    /// good only if this is the same before its copies are looked up and once it arrived.
    pub(crate) fn epochs(&self) -> u64 {
        self.lenders
            .iter()
            .filter_map(|l| l.copies)
            .fold(0u64, |sum, t| sum.wrapping_add(t.epoch()))
    }

    /// Whether lent far page `far`'s lender keeps a table and still lives: it may yet heal
    /// a slab whose copies all failed.
    pub(crate) fn lender_may_heal(&self, far: u64) -> bool {
        self.lender_of(far)
            .and_then(|(l, _)| l.copies)
            .is_some_and(|t| t.lender_alive())
    }

    /// Whether far page `far` is in a slab lent on donors.
    pub(crate) fn has(&self, far: u64) -> bool {
        self.lender_of(far).is_some()
    }

    /// The lenders of far slabs `keep` (sorted), restricted to them: what a child that borrowed
    /// these lends its own child in turn.
    pub(crate) fn only(&self, keep: &[u64]) -> Vec<Lender> {
        self.lenders.iter().filter_map(|l| l.only(keep)).collect()
    }

    /// Opens, in place, lent far page `far` as fetched: with its lender's key when it sealed
    /// it, as is when it did not.
    pub(crate) fn open(&self, far: u64, page: &mut [u8]) -> Result<(), SealError> {
        match self.lender_of(far) {
            Some((l, _)) => l.seals.as_ref().map_or(Ok(()), |s| s.open(far, page)),
            None => Err(SealError::NeverSealed { far }),
        }
    }

    /// In a forked child's runtime: connects to every donor a lent slab has a copy on (every
    /// donor of a lender that keeps a table: the slab may be healed onto any), as its lender's
    /// client (read only; `base` gives the timeouts and hooks), numbering the connections from
    /// `first`; returns them with each lent far slab's copies renumbered to them. A donor
    /// that cannot be reached now is attached at first use (reads fail over to the slab's
    /// other copies meanwhile; a page with none left fails as in the parent: SIGBUS rather
    /// than wrong data).
    pub(crate) fn connect(&self, base: &ClientConfig, first: usize) -> Borrowed {
        let mut borrowed = Vec::new();
        let mut homes = Vec::new();
        let mut indexes = Vec::new();
        for l in &self.lenders {
            let mut index: Vec<Option<usize>> = vec![None; l.addrs.len()];
            for (p, addr) in l.addrs.iter().enumerate() {
                if l.copies.is_none() && !l.slabs.iter().any(|(_, r)| r.has(p)) {
                    continue;
                }
                let cfg = ClientConfig {
                    spin: FAULT_PATH_SPIN,
                    ..l.client(base)
                };
                // A donor that does not answer now may come back (restarted, the parent
                // taking it back and copying lent slabs there): attached at first use.
                let c = DonorClient::connect(addr, cfg.clone()).or_else(|e| {
                    tracing::warn!(
                        "donor {addr}: cannot read the pages a parent process lent there \
                         now ({e}); reading their other copies, and there once it answers"
                    );
                    DonorClient::attach_later(addr, cfg)
                });
                if let Ok(c) = c {
                    index[p] = Some(first + borrowed.len());
                    borrowed.push(c);
                }
            }
            for (idx, r) in &l.slabs {
                let mut mine = Replicas::empty();
                for x in r.readable() {
                    if let Some(Some(d)) = index.get(x.donor) {
                        mine.push(Replica {
                            donor: *d,
                            filling: false,
                            ..x
                        });
                    }
                }
                homes.push((*idx, mine));
            }
            indexes.push(index);
        }
        Borrowed {
            clients: borrowed,
            homes,
            index: indexes,
        }
    }

    /// In a child without a runtime of its own: reads lent far pages from the donors (as
    /// their lender's client, failing over between copies) and opens them. Returns each
    /// page's bytes, or why it could not be read.
    pub(crate) fn read(&self, fars: &[u64]) -> Vec<Result<Vec<u8>, String>> {
        // (lender, its donor index) → connection, made on first use (`None`: it failed, and
        // is not tried again for every page).
        let mut clients: Vec<((usize, usize), Option<DonorClient>)> = Vec::new();
        fars.iter()
            .map(|&far| {
                // A read across a restart's epoch is made again (see crate::lentcopies).
                let mut result = Err(String::new());
                for _ in 0..3 {
                    let epoch = self.epochs();
                    match self.read_one(far, &mut clients, epoch) {
                        Err(Retry::Epoch) => continue,
                        Err(Retry::No(e)) => result = Err(e),
                        Ok(data) => result = Ok(data),
                    }
                    break;
                }
                result.map_err(|e| {
                    if e.is_empty() {
                        "the lender kept re-adopting restarted donors".to_string()
                    } else {
                        e
                    }
                })
            })
            .collect()
    }

    /// One try of [`LentDonors::read`] for far page `far`, made in restart epoch `epoch`.
    fn read_one(
        &self,
        far: u64,
        clients: &mut Vec<((usize, usize), Option<DonorClient>)>,
        epoch: u64,
    ) -> Result<Vec<u8>, Retry> {
        let Some((l, r)) = self.lender_of(far) else {
            return Err(Retry::No(format!("far page {far} is in no lent slab")));
        };
        let li = self
            .lenders
            .iter()
            .position(|x| std::ptr::eq(x, l))
            .unwrap_or(0);
        let page = (far % self.slab_pages) as u32;
        // The copies as the lender published them last (it may have healed the slab since
        // the fork), else those of the fork.
        let copies: Vec<Replica> = match l.copies.and_then(|t| t.copies(far / self.slab_pages)) {
            Some(now) => now.iter().map(|p| p.on(p.donor)).collect(),
            None => r.readable().collect(),
        };
        let mut errors = Vec::new();
        for x in copies {
            let Some(addr) = l.addrs.get(x.donor) else {
                continue;
            };
            let key = (li, x.donor);
            if !clients.iter().any(|(k, _)| *k == key) {
                match DonorClient::connect(addr, l.client(&self.base)) {
                    Ok(c) => clients.push((key, Some(c))),
                    Err(e) => {
                        errors.push(format!("{addr}: {e}"));
                        clients.push((key, None));
                    }
                }
            }
            let Some((_, Some(c))) = clients.iter().find(|(k, _)| *k == key) else {
                continue; // that donor could not be reached
            };
            let mut data = vec![0u8; PAGE_SIZE];
            if let Err(e) = c.read_pages(&[x.addr(page)], &mut data) {
                errors.push(format!("{addr}: {e}"));
                continue;
            }
            if self.epochs() != epoch {
                return Err(Retry::Epoch);
            }
            match self.open(far, &mut data) {
                Ok(()) => return Ok(data),
                Err(e) => errors.push(format!("{addr}: {e}")),
            }
        }
        Err(Retry::No(if errors.is_empty() {
            "no copy of its slab is left".to_string()
        } else {
            errors.join("; ")
        }))
    }
}

/// Why one try of [`LentDonors::read_one`] gave no page.
enum Retry {
    /// The lender re-adopted a restarted donor meanwhile: try again.
    Epoch,
    /// Every copy failed, for these reasons.
    No(String),
}
