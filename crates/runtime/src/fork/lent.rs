//! What a fork lends the child ([`Lent`]), and the child's runtime borrowing it ([`borrow`]).

use crate::error::RuntimeError;
use crate::far::Home;
use crate::lentdonors::LentDonors;
use crate::shared::{Shared, State};
use crate::slabs::memslabs::MemKind;
use farmem_proto::PAGE_SIZE;

/// What a fork lends the child (see the module doc): the tier slabs it inherits and the region
/// pages left there. The child's runtime borrows them ([`crate::Runtime::borrow`]); a child
/// without one copies them in ([`Lent::copy_in`]). Made only by [`crate::Runtime::prepare_fork`]
/// (its fields are private: the child's runtime takes the slabs' mappings as its own).
#[derive(Clone, Debug, Default)]
pub struct Lent {
    /// Pages per far slab (the child must use the same).
    pub(super) slab_pages: u64,
    /// The child's own far pages start here, above every far page lent (a slab boundary).
    pub(super) floor: u64,
    /// The lent slabs, mapped at the same addresses in the child, by far slab.
    pub(super) slabs: Vec<LentSlab>,
    /// Region pages left in them (or on donors), and resident pages with a copy in a lent
    /// slab: (page address, far page).
    pub(super) pages: Vec<(usize, u64)>,
    /// The donors pages were left on, if any.
    pub(super) donors: Option<LentDonors>,
}

/// One lent slab.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct LentSlab {
    /// The far slab it holds.
    pub(super) far_slab: u64,
    /// Its mapping (inherited by the child at the same address).
    pub(super) addr: usize,
    pub(super) len: usize,
}

impl Lent {
    /// Where the child's own far pages start ([`crate::RuntimeConfig::far_floor`]).
    pub fn floor(&self) -> u64 {
        self.floor
    }

    /// Pages lent.
    pub fn pages(&self) -> usize {
        self.pages.len()
    }

    /// What the child's runtime needs to read the pages lent on donors, if any were.
    pub fn donors(&self) -> Option<&LentDonors> {
        self.donors.as_ref()
    }

    /// Where far page `far` is in the lent slabs' memory.
    fn source(&self, far: u64) -> Option<usize> {
        if self.slab_pages == 0 {
            return None;
        }
        let i = self
            .slabs
            .binary_search_by_key(&(far / self.slab_pages), |s| s.far_slab)
            .ok()?;
        let s = &self.slabs[i];
        let off = (far % self.slab_pages) as usize * PAGE_SIZE;
        (off + PAGE_SIZE <= s.len).then_some(s.addr + off)
    }

    /// In the child, before its regions are registered: drops every page it shares with the
    /// parent that still equals its lent far copy, so its runtime borrows that copy instead of
    /// counting (and, to evict it, copying out) the parent's resident page. Returns the pages
    /// dropped.
    pub fn discard_unchanged(&self) -> usize {
        self.mapped(true)
            .filter(|&(addr, src)| crate::mm::drop_inherited_page_if_equal(addr, src))
            .count()
    }

    /// In a child that pages nothing itself: copies every lent page that is not mapped yet
    /// into its region page (plain memory there); those lent on donors are read from them.
    /// Returns the pages copied; a page that cannot be read is reported on stderr (it reads
    /// as zeros: every copy of it is gone).
    pub fn copy_in(&self) -> usize {
        let mut n = self.mapped(false).fold(0, |n, (addr, src)| {
            crate::mm::copy_inherited_page(addr, src);
            n + 1
        });
        let Some(donors) = &self.donors else {
            return n;
        };
        let far_pages: Vec<(usize, u64)> = self
            .pages
            .iter()
            .copied()
            .filter(|&(addr, far)| {
                let mut p = [0u8];
                donors.has(far) && farmem_mm::mincore(addr, &mut p).is_ok() && p[0] & 1 == 0
            })
            .collect();
        let fars: Vec<u64> = far_pages.iter().map(|(_, f)| *f).collect();
        let mut lost: Option<(usize, String)> = None;
        for (&(addr, _), data) in far_pages.iter().zip(donors.read(&fars)) {
            match data {
                Ok(d) => {
                    crate::mm::copy_inherited_page(addr, d.as_ptr() as usize);
                    n += 1;
                }
                Err(e) => {
                    let l = lost.get_or_insert((0, e));
                    l.0 += 1;
                }
            }
        }
        if let Some((count, why)) = lost {
            eprintln!(
                "farmem: error: process {}: {count} page(s) its parent left on donors could not \
                 be read ({why}); they read as zeros",
                std::process::id()
            );
        }
        n
    }

    /// The lent pages whose region page is mapped here and present (`present`) or not, with
    /// where their lent copy is: (page address, copy address). Allocates nothing (it runs in a
    /// forked child without a runtime).
    fn mapped(&self, present: bool) -> impl Iterator<Item = (usize, usize)> + '_ {
        self.pages.iter().filter_map(move |&(addr, far)| {
            let mut p = [0u8];
            farmem_mm::mincore(addr, &mut p).ok()?;
            if (p[0] & 1 != 0) != present {
                return None;
            }
            Some((addr, self.source(far)?))
        })
    }
}

/// In a forked child's runtime: borrows what the parent lent (see [`crate::Runtime::borrow`]).
pub(crate) fn borrow(sh: &Shared, lent: &Lent) -> Result<usize, RuntimeError> {
    if lent.slab_pages != sh.far.slab_pages {
        return Err(refused(format!(
            "the parent's slabs are {} pages, this runtime's {}",
            lent.slab_pages, sh.far.slab_pages
        )));
    }
    let mut st = sh.state.lock();
    check_lent(sh, &st, lent)?;
    take_slabs(sh, &mut st, lent)?;
    let n = mark_remote(&mut st, lent);
    drop(st);
    sh.stats.lock().s.pages_borrowed += n as u64;
    Ok(n)
}

/// Why lent pages cannot be borrowed.
fn refused(what: String) -> RuntimeError {
    RuntimeError::Config(format!("borrowing lent pages: {what}"))
}

/// Whether what the parent lent fits this runtime: its far pages start above the lent ones,
/// every lent page is in a lent slab or on the lender's donors, and every lent slab is an
/// inherited mapping (neither a region nor memory of this runtime).
fn check_lent(sh: &Shared, st: &State, lent: &Lent) -> Result<(), RuntimeError> {
    if st.far_pages.floor() < lent.floor {
        return Err(refused(format!(
            "this runtime's far pages start at {}, below the lent ones' end {}",
            st.far_pages.floor(),
            lent.floor
        )));
    }
    let on_donors = |far: u64| {
        lent.donors.as_ref().is_some_and(|d| d.has(far))
            && matches!(sh.far.home(far), Some((Home::Borrowed(_), _)))
    };
    if let Some(&(a, far)) = lent
        .pages
        .iter()
        .find(|(_, f)| lent.source(*f).is_none() && !on_donors(*f))
    {
        return Err(refused(format!(
            "page {a:#x} is at far page {far}, in no lent slab"
        )));
    }
    for s in &lent.slabs {
        // An inherited slab is mapped here, and is neither a region nor memory of this runtime.
        let mut present = vec![0u8; s.len / PAGE_SIZE];
        let own = st
            .mem
            .ranges()
            .into_iter()
            .chain([(sh.pool.mapping().addr(), sh.pool.mapping().len())]);
        if farmem_mm::mincore(s.addr, &mut present).is_err()
            || st.pages.overlaps(s.addr, s.addr + s.len)
            || own
                .into_iter()
                .any(|(a, l)| a < s.addr + s.len && s.addr < a + l)
        {
            return Err(refused(format!(
                "slab {} at {:#x} (+{} bytes) is not an inherited slab mapping",
                s.far_slab, s.addr, s.len
            )));
        }
    }
    Ok(())
}

/// Takes each lent slab as a borrowed memory slab, the home of its far slab.
fn take_slabs(sh: &Shared, st: &mut State, lent: &Lent) -> Result<(), RuntimeError> {
    for s in &lent.slabs {
        let mapping =
            crate::mm::adopt_inherited(s.addr, s.len).map_err(|source| RuntimeError::Mmap {
                op: "taking a slab lent at fork",
                len_bytes: s.len,
                source,
            })?;
        let m = st.mem.insert(mapping, MemKind::Borrowed, s.far_slab);
        sh.far.set_home(s.far_slab, Some(Home::Memory(m)));
    }
    Ok(())
}

/// Marks every lent page not present here as remote at its far page; returns how many.
fn mark_remote(st: &mut State, lent: &Lent) -> usize {
    // A page present here was faulted in by another of the parent's threads in the instant
    // before the fork: the child has it already.
    let ranges = st.pages.ranges();
    let present: Vec<Vec<u8>> = ranges
        .iter()
        .map(|&(s, e)| {
            let mut p = vec![0u8; (e - s) / PAGE_SIZE];
            if farmem_mm::mincore(s, &mut p).is_err() {
                p.fill(1); // not mapped (the program unmapped it): nothing to borrow there
            }
            p
        })
        .collect();
    let mut n = 0;
    for &(addr, far) in &lent.pages {
        let i = ranges.partition_point(|&(_, e)| e <= addr);
        let Some(&(s, e)) = ranges.get(i) else {
            continue;
        };
        if addr < s || addr >= e || present[i][(addr - s) / PAGE_SIZE] & 1 != 0 {
            continue;
        }
        if st.pages.inherit(addr, far) {
            n += 1;
        }
    }
    n
}
