//! Reading and writing far pages on donors: where a page can be read and starting that read
//! ([`Far::read_sources`], [`Far::submit_read_on`]), and writing a batch of pages to every
//! replica of their slabs ([`Far::write_replicas`]) in named steps.

use farmem_transport::{PageAddr, PageWrite, Pending, TransportError};

use crate::error::RuntimeError;
use crate::slabs::replicas::{Replica, Replicas};

use super::{Far, Home};

/// A page to write: the replicas of its slab, the page in the slab, its far page, its data.
type PageOut<'a> = (Replicas, u32, u64, &'a [u8]);

/// The writes of one batch, grouped by donor.
struct Grouped<'a> {
    /// One list of writes per donor.
    groups: Vec<Vec<PageWrite<'a>>>,
    /// Pages (their index in the batch) that went to no replica.
    orphans: Vec<usize>,
    /// Replicas left out: (far slab, donor), dropped once the batch is written.
    left_out: Vec<(u64, usize)>,
}

impl Far {
    /// Where far page `far` can be read on donors, in the order to try: complete replicas on
    /// live donors first, then those on suspected donors, then, with no backup file, those
    /// on donors taken for dead (a sole copy may still answer: a stall or partition may end;
    /// with a backup file, the file has every page those have, and asking a cut-off donor
    /// would cost a connect timeout a fault).
    pub(crate) fn read_sources(&self, far: u64) -> Vec<(usize, PageAddr)> {
        let (r, page) = match self.home(far) {
            Some((Home::Donors(r), page)) => (r, page),
            // A forked child's: where its lender says the copies are now, if it keeps a table.
            Some((Home::Borrowed(r), page)) => (self.borrowed_copies_now(far).unwrap_or(r), page),
            _ => return Vec::new(),
        };
        let mut out: Vec<(usize, PageAddr)> = r
            .readable()
            .filter(|x| self.backup.is_none() || !self.donor(x.donor).health.is_dead())
            .map(|x| (x.donor, x.addr(page)))
            .collect();
        out.sort_by_key(|(d, _)| {
            let h = &self.donor(*d).health;
            (!h.is_live(), h.is_dead())
        });
        out
    }

    /// Starts the read of one far page from donor `d` on its fault-path connection.
    pub(crate) fn submit_read_on(&self, d: usize, addr: PageAddr) -> Result<Pending, RuntimeError> {
        self.donor(d)
            .read
            .submit_read(&[addr])
            .map_err(|source| RuntimeError::Donor {
                addr: self.donor(d).read.addr().to_string(),
                step: "reading a page",
                source,
            })
    }

    /// Writes pages (`(replicas of its slab, page in the slab, far page, data)`) to the
    /// replicas of their slabs: one batch per donor (at most 256 pages a batch), all donors
    /// at once. A page goes to its replicas on live donors; with none live, to those on
    /// suspected donors; with none of those either, to the backup file if there is one (else
    /// this fails). Succeeds once every page is on each replica it went to; replicas left out
    /// then hold an older version and are dropped from their slab (re-replication makes the
    /// copy again). Every page written to donors also goes to the backup file, in the
    /// background. A donor that fails is suspected ([`Far::suspect`]).
    pub(crate) fn write_replicas(&self, pages: &[PageOut<'_>]) -> Result<(), RuntimeError> {
        let Grouped {
            groups,
            orphans,
            mut left_out,
        } = self.group_writes(pages);
        if !orphans.is_empty() && self.backup.is_none() {
            return Err(self.no_live_replica(&pages[orphans[0]]));
        }
        self.write_groups(&groups)?;
        if let Some(b) = &self.backup {
            for (i, (_, _, far, data)) in pages.iter().enumerate() {
                if orphans.contains(&i) {
                    b.write_now(*far, data)?;
                } else {
                    b.write(*far, data);
                }
            }
        }
        left_out.sort_unstable();
        left_out.dedup();
        for (idx, d) in left_out {
            self.drop_replica(idx, d);
        }
        Ok(())
    }

    /// Which replicas each page goes to: those on live donors; with none live, those on
    /// suspected donors; the others are left out.
    fn group_writes<'a>(&self, pages: &[PageOut<'a>]) -> Grouped<'a> {
        let mut groups: Vec<Vec<PageWrite<'a>>> = vec![Vec::new(); self.donors.len()];
        let mut orphans = Vec::new();
        let mut left_out: Vec<(u64, usize)> = Vec::new();
        for (i, (r, page, far, data)) in pages.iter().enumerate() {
            let health = |x: &Replica| &self.donors[x.donor].health;
            let live = r.as_slice().iter().any(|x| health(x).is_live());
            let mut any = false;
            for x in r.as_slice() {
                let h = health(x);
                if h.is_live() || (!live && h.is_suspect()) {
                    groups[x.donor].push(PageWrite {
                        addr: x.addr(*page),
                        data,
                    });
                    any = true;
                } else {
                    left_out.push((far / self.slab_pages, x.donor));
                }
            }
            if !any {
                orphans.push(i);
            }
        }
        Grouped {
            groups,
            orphans,
            left_out,
        }
    }

    /// The error for a page none of whose replicas can be written, with no backup file.
    fn no_live_replica(&self, page: &PageOut<'_>) -> RuntimeError {
        let (r, _, far, _) = page;
        let addrs: Vec<String> = r
            .as_slice()
            .iter()
            .map(|x| self.donors[x.donor].read.addr().to_string())
            .collect();
        RuntimeError::NoLiveReplica {
            far: *far,
            donors: addrs.join(", "),
        }
    }

    /// Submits every donor's writes (at most a batch each request), all donors at once, then
    /// waits for them all; the first failure is the error, every failing donor is suspected.
    fn write_groups(&self, groups: &[Vec<PageWrite<'_>>]) -> Result<(), RuntimeError> {
        let mut submitted = Vec::new();
        let mut first_err: Option<(usize, TransportError)> = None;
        for (d, g) in groups.iter().enumerate() {
            for chunk in g.chunks(farmem_transport::MAX_BATCH_PAGES) {
                match self.donors[d].write.submit_write(chunk) {
                    Ok(p) => submitted.push((d, p)),
                    Err(e) => {
                        self.on_error(d, &e);
                        first_err.get_or_insert((d, e));
                    }
                }
            }
        }
        for (d, p) in submitted {
            if let Err(e) = p.wait() {
                self.on_error(d, &e);
                first_err.get_or_insert((d, e));
            }
        }
        match first_err {
            Some((d, source)) => Err(RuntimeError::Donor {
                addr: self.donors[d].write.addr().to_string(),
                step: "writing evicted pages",
                source,
            }),
            None => Ok(()),
        }
    }
}
