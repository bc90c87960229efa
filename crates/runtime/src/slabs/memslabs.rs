//! Memory slabs: far slabs held in memory instead of on a donor. A *tier* slab is a
//! `farmem node`'s memfd slab mapped shared into this process (the host tier: the node's
//! memory, charged to the node); a *local* slab is private memory of this process, where a tier
//! slab goes when the node asks for it back (the host tier, `far/tier.rs`) until a donor takes it, or for
//! good when no donor is configured.
//!
//! # Design
//!
//! - A far page whose slab is a memory slab is written by one copy (the evictor copies the
//!   victim's pool slot into it: [`MemSlabs::write`]) and read by one copy (the fault thread
//!   installs it with UFFDIO_COPY straight from the slab), with no message and no other process
//!   involved.
//! - Memory slabs live behind the state lock, and are read, written, replaced and dropped only
//!   with it held, so a slab moving from the tier to local memory (or on to a donor) never races
//!   a fault reading it or an eviction writing it.
//! - Every write stamps the slab with a logical clock ([`MemSlab::last_write`]): the node's
//!   reclaim requests are answered with the least recently written tier slabs (Valet's
//!   activity-based victims), and a slab copied out for a donor is switched over only if no
//!   write came in meanwhile ([`MemSlab::writes`]).

use farmem_mm::Mapping;

use crate::slabs::replicas::Replicas;

#[cfg(test)]
use farmem_proto::PAGE_SIZE;

/// Where a memory slab's memory comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum MemKind {
    /// A host tier slab, with the node's id for it.
    Tier { id: u32 },
    /// A slab of the private node this runtime started when the host's node had no room
    /// (the host tier, `far/tier.rs`), with that node's id for it. Never given back, lent over fork or
    /// written through (the fallback is only taken without donors).
    Fallback { id: u32 },
    /// Private memory of this process.
    Local,
    /// A tier slab of the parent's, inherited over fork by this forked child
    /// ([`crate::fork`]): read only (its far pages are below the child's floor), never written
    /// through, given back or migrated — the parent's hold keeps it alive.
    Borrowed,
}

/// One far slab held in memory.
pub(crate) struct MemSlab {
    pub(crate) mapping: Mapping,
    pub(crate) kind: MemKind,
    /// The far slab it holds (far page / slab pages).
    pub(crate) far_slab: u64,
    /// The clock at the last write.
    pub(crate) last_write: u64,
    /// Writes so far.
    pub(crate) writes: u64,
    /// Its write-through copies on donors (empty until placed).
    pub(crate) donors: Replicas,
    /// Pages written since their last write-through (one bit a page).
    unflushed: Vec<u64>,
    unflushed_count: u64,
}

impl MemSlab {
    /// Pages written since their last write-through to the donor copy.
    pub(crate) fn unflushed(&self) -> u64 {
        self.unflushed_count
    }

    /// Takes up to `max` pages written since their last write-through, oldest index first,
    /// marking them flushed (a write after this marks a page again).
    pub(crate) fn take_unflushed(&mut self, max: usize) -> Vec<u32> {
        let mut out = Vec::new();
        for (w, word) in self.unflushed.iter_mut().enumerate() {
            while *word != 0 && out.len() < max {
                let bit = word.trailing_zeros();
                *word &= !(1u64 << bit);
                out.push(w as u32 * 64 + bit);
            }
            if out.len() >= max {
                break;
            }
        }
        self.unflushed_count -= out.len() as u64;
        out
    }

    /// Marks every page as not written through (a new donor copy must get them all).
    pub(crate) fn mark_all_unflushed(&mut self) {
        for p in 0..self.unflushed.len() as u32 * 64 {
            if (p as usize) < self.mapping.pages() {
                self.mark_unflushed(p);
            }
        }
    }

    /// Marks `page` as not written through (a write, or a write-through that failed).
    pub(crate) fn mark_unflushed(&mut self, page: u32) {
        let (w, bit) = ((page / 64) as usize, page % 64);
        if self.unflushed[w] & (1u64 << bit) == 0 {
            self.unflushed[w] |= 1u64 << bit;
            self.unflushed_count += 1;
        }
    }
}

/// Every memory slab of the runtime, by index (the index is the placement's
/// `Home::Memory`).
#[derive(Default)]
pub(crate) struct MemSlabs {
    slabs: Vec<Option<MemSlab>>,
    free: Vec<u32>,
    clock: u64,
}

impl MemSlabs {
    /// Adds a slab holding far slab `far_slab`; returns its index.
    pub(crate) fn insert(&mut self, mapping: Mapping, kind: MemKind, far_slab: u64) -> u32 {
        let mapping_pages = mapping.pages();
        let slab = MemSlab {
            mapping,
            kind,
            far_slab,
            last_write: self.clock,
            writes: 0,
            donors: Replicas::empty(),
            unflushed: vec![0; mapping_pages.div_ceil(64)],
            unflushed_count: 0,
        };
        match self.free.pop() {
            Some(m) => {
                self.slabs[m as usize] = Some(slab);
                m
            }
            None => {
                self.slabs.push(Some(slab));
                (self.slabs.len() - 1) as u32
            }
        }
    }

    pub(crate) fn get(&self, m: u32) -> Option<&MemSlab> {
        self.slabs.get(m as usize)?.as_ref()
    }

    pub(crate) fn get_mut(&mut self, m: u32) -> Option<&mut MemSlab> {
        self.slabs.get_mut(m as usize)?.as_mut()
    }

    /// Indexes of every slab of this process's own (borrowed ones aside: they are never written
    /// through, healed or migrated), least recently written first.
    pub(crate) fn oldest_first(&self) -> Vec<u32> {
        let mut all: Vec<(u64, u32)> = self
            .slabs
            .iter()
            .enumerate()
            .filter_map(|(i, s)| {
                let s = s.as_ref()?;
                (s.kind != MemKind::Borrowed).then_some((s.last_write, i as u32))
            })
            .collect();
        all.sort_unstable();
        all.into_iter().map(|(_, i)| i).collect()
    }

    /// Gives slab `m` new memory (`mapping`, a copy of the old) of `kind`; returns the old
    /// mapping and kind. The slab keeps its index, so placements need not change.
    pub(crate) fn replace(
        &mut self,
        m: u32,
        mapping: Mapping,
        kind: MemKind,
    ) -> Option<(Mapping, MemKind)> {
        let s = self.slabs.get_mut(m as usize)?.as_mut()?;
        let old_kind = std::mem::replace(&mut s.kind, kind);
        Some((std::mem::replace(&mut s.mapping, mapping), old_kind))
    }

    /// Removes slab `m` (its far slab now lives on a donor).
    pub(crate) fn remove(&mut self, m: u32) -> Option<MemSlab> {
        let s = self.slabs.get_mut(m as usize)?.take()?;
        self.free.push(m);
        Some(s)
    }

    /// Runs `f` on page `page` of slab `m` (`None` if there is no such slab).
    pub(crate) fn read<R>(&self, m: u32, page: u32, f: impl FnOnce(&[u8]) -> R) -> Option<R> {
        self.read_run(m, page, 1, f)
    }

    /// Runs `f` on the `n` pages of slab `m` from `page` on, as one slice (`None` if there is
    /// no such slab).
    pub(crate) fn read_run<R>(
        &self,
        m: u32,
        page: u32,
        n: usize,
        f: impl FnOnce(&[u8]) -> R,
    ) -> Option<R> {
        let s = self.get(m)?;
        Some(crate::mm::with_pages_bytes(&s.mapping, page, n, f))
    }

    /// Writes one page into page `page` of slab `m`; false if there is no such slab.
    pub(crate) fn write(&mut self, m: u32, page: u32, src: &[u8]) -> bool {
        self.clock += 1;
        let clock = self.clock;
        let Some(s) = self.slabs.get_mut(m as usize).and_then(Option::as_mut) else {
            return false;
        };
        crate::mm::write_page(&s.mapping, page, src);
        s.last_write = clock;
        s.writes += 1;
        s.mark_unflushed(page);
        true
    }

    /// Up to `n` tier slabs, least recently written first.
    pub(crate) fn least_recently_written_tier(&self, n: usize) -> Vec<u32> {
        let mut tier: Vec<(u64, u32)> = self
            .slabs
            .iter()
            .enumerate()
            .filter_map(|(i, s)| {
                let s = s.as_ref()?;
                matches!(s.kind, MemKind::Tier { .. }).then_some((s.last_write, i as u32))
            })
            .collect();
        tier.sort_unstable();
        tier.into_iter().take(n).map(|(_, i)| i).collect()
    }

    /// The mapping of every memory slab: (start address, length in bytes).
    pub(crate) fn ranges(&self) -> Vec<(usize, usize)> {
        self.slabs
            .iter()
            .flatten()
            .map(|s| (s.mapping.addr(), s.mapping.len()))
            .collect()
    }

    /// Memory slabs of kind Tier (with their node ids) and Borrowed, which a fork may lend to
    /// the child: (index, kind).
    pub(crate) fn lendable(&self) -> Vec<(u32, MemKind)> {
        self.slabs
            .iter()
            .enumerate()
            .filter_map(|(i, s)| {
                let s = s.as_ref()?;
                matches!(s.kind, MemKind::Tier { .. } | MemKind::Borrowed)
                    .then_some((i as u32, s.kind))
            })
            .collect()
    }

    /// (tier slabs, local slabs) held now; borrowed slabs are node memory, so tier slabs.
    pub(crate) fn counts(&self) -> (u64, u64) {
        self.slabs
            .iter()
            .flatten()
            .fold((0, 0), |(t, l), s| match s.kind {
                MemKind::Tier { .. } | MemKind::Fallback { .. } | MemKind::Borrowed => (t + 1, l),
                MemKind::Local => (t, l + 1),
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slab(pages: usize) -> Mapping {
        Mapping::anonymous(pages * PAGE_SIZE).unwrap()
    }

    #[test]
    fn writes_are_read_back_and_stamp_the_slab() {
        let mut m = MemSlabs::default();
        let a = m.insert(slab(4), MemKind::Tier { id: 7 }, 0);
        let b = m.insert(slab(4), MemKind::Tier { id: 8 }, 1);
        let page = vec![0xabu8; PAGE_SIZE];
        assert!(m.write(b, 3, &page));
        assert_eq!(m.read(b, 3, |p| p.to_vec()).unwrap(), page);
        assert_eq!(m.read(a, 3, |p| p[0]).unwrap(), 0);
        // `a` was written longest ago.
        assert_eq!(m.least_recently_written_tier(1), vec![a]);
        assert!(m.write(a, 0, &page));
        assert_eq!(m.least_recently_written_tier(2), vec![b, a]);
        assert_eq!(m.counts(), (2, 0));
    }

    #[test]
    fn writes_are_tracked_until_written_through() {
        let mut m = MemSlabs::default();
        let a = m.insert(slab(130), MemKind::Tier { id: 1 }, 0);
        let page = vec![1u8; PAGE_SIZE];
        for p in [129, 3, 64, 3] {
            m.write(a, p, &page);
        }
        let s = m.get_mut(a).unwrap();
        assert_eq!(s.unflushed(), 3);
        assert_eq!(s.take_unflushed(2), vec![3, 64]);
        assert_eq!(s.unflushed(), 1);
        s.mark_unflushed(3);
        assert_eq!(s.take_unflushed(10), vec![3, 129]);
        assert_eq!(s.unflushed(), 0);
        assert!(s.take_unflushed(10).is_empty());
    }

    #[test]
    fn a_replaced_slab_keeps_its_index_and_a_removed_one_is_reused() {
        let mut m = MemSlabs::default();
        let a = m.insert(slab(2), MemKind::Tier { id: 1 }, 5);
        let page = vec![3u8; PAGE_SIZE];
        m.write(a, 1, &page);
        let local = slab(2);
        crate::mm::copy_mapping(&local, &m.get(a).unwrap().mapping);
        let (_old, kind) = m.replace(a, local, MemKind::Local).unwrap();
        assert_eq!(kind, MemKind::Tier { id: 1 });
        assert_eq!(m.read(a, 1, |p| p[100]).unwrap(), 3);
        assert_eq!(m.counts(), (0, 1));
        assert_eq!(m.remove(a).unwrap().far_slab, 5);
        assert!(m.read(a, 0, |_| ()).is_none());
        assert!(!m.write(a, 0, &page));
        assert_eq!(m.insert(slab(2), MemKind::Local, 9), a);
    }
}
