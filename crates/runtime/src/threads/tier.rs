//! Placement of far slabs across the tiers ([`Shared::place`]) and the tier thread
//! (`farmem-tier`): write-through of host-tier slabs to donors, and giving slabs back when the
//! node asks. The design is in [`crate::tier`].

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use farmem_mm::{Advice, Mapping};

use crate::error::RuntimeError;
use crate::failure::ThreadError;
use crate::far::tier::Tier;
use crate::far::Home;
use crate::shared::Shared;
use crate::slabs::memslabs::MemKind;
use crate::slabs::replicas::{Replica, Replicas};
use crate::threads::tier_rounds::{run, TierWorld, Woken};
use farmem_proto::PAGE_SIZE;

impl Shared {
    /// Where far page `far` lives and its page index there, placing its slab first if it has
    /// no home yet: in the host tier while the node lends slabs, else on a donor. Called by
    /// the sender only (one placer, so a slab is never placed twice); without the state lock.
    pub(crate) fn place(&self, far: u64) -> Result<(Home, u32), RuntimeError> {
        if let Some(h) = self.far.home(far) {
            return Ok(h);
        }
        let idx = far / self.far.slab_pages;
        let len = self.far.slab_pages as usize * PAGE_SIZE;
        let tier_slab = match &self.far.tier {
            Some(t) => t.alloc(len)?,
            None => None,
        };
        let home = match tier_slab {
            Some((slab, kind)) => {
                let mut st = self.state.lock();
                let m = st.mem.insert(slab.mapping, kind, idx);
                let home = Home::Memory(m);
                self.far.set_home(idx, Some(home));
                home
            }
            None if self.far.donors.is_empty() => return Err(self.far.nowhere_to_place()),
            None => {
                let home = self.far.alloc_on_donor()?;
                self.far.set_home(idx, Some(home));
                home
            }
        };
        Ok((home, (far % self.far.slab_pages) as u32))
    }
}

/// Pages written through to donors per round of the tier thread, at most (about 80 MiB/s
/// at ten rounds a second): the write-through runs in the background and must not take the
/// program's bandwidth or CPU in bursts.
const WRITE_THROUGH_PAGES: usize = 2048;

/// The tier thread. Runs until shutdown when a tier is used.
pub(crate) fn tier_loop(sh: Arc<Shared>) {
    if let Some(tier) = &sh.far.tier {
        run(&Live { sh: &sh, tier });
    }
}

/// The runtime as the tier loop sees it.
struct Live<'a> {
    sh: &'a Shared,
    tier: &'a Tier,
}

impl TierWorld for Live<'_> {
    fn stopping(&self) -> bool {
        self.sh.shutdown.load(Ordering::Relaxed)
    }

    fn now(&self) -> Instant {
        Instant::now()
    }

    fn has_donors(&self) -> bool {
        !self.sh.far.donors.is_empty()
    }

    fn any_frozen(&self) -> bool {
        self.sh.state.lock().far_pages.any_frozen()
    }

    fn wait(&self, wait: Duration, node_gone: bool) -> Woken {
        let reclaims = if node_gone {
            crossbeam_channel::never()
        } else {
            self.tier.reclaims().clone()
        };
        crossbeam_channel::select! {
            recv(reclaims) -> r => match r {
                Ok(r) => Woken::Reclaim(r.slabs as usize),
                Err(_) => Woken::NodeGone,
            },
            recv(self.tier.kicked()) -> _ => Woken::Kicked,
            recv(self.sh.doorbell.receiver()) -> _ => Woken::Shutdown,
            default(wait) => Woken::Timeout,
        }
    }

    fn give_back(&self, slabs: usize) {
        give_back(self.sh, self.tier, slabs);
    }

    fn thaw(&self) {
        crate::fork::thaw_if_no_child(self.sh);
    }

    fn write_through(&self) -> Result<usize, RuntimeError> {
        write_through(self.sh)
    }

    fn report(&self, err: ThreadError) {
        self.sh.report(err);
    }
}

/// Gives `n` tier slabs back to the node: the least recently written. One whose donor copy is
/// complete (written through) just lives on the donor from now on, at no cost; the others are
/// copied into local memory first (see the module doc).
fn give_back(sh: &Shared, tier: &Tier, n: usize) {
    let mut freed: Vec<(u32, Mapping)> = Vec::new();
    let mut clean = 0u64;
    {
        let mut st = sh.state.lock();
        for m in st.mem.least_recently_written_tier(n) {
            if let Some((mapping, MemKind::Tier { id })) = retire_if_written_through(sh, &mut st, m)
            {
                freed.push((id, mapping));
                clean += 1;
                continue;
            }
            let Some(len) = st.mem.get(m).map(|s| s.mapping.len()) else {
                continue;
            };
            let local = match Mapping::anonymous(len) {
                Ok(l) => l,
                Err(e) => {
                    drop(st);
                    sh.report(ThreadError::GiveBackNoMemory {
                        slabs: n,
                        source: e,
                    });
                    return;
                }
            };
            local.advise(Advice::DontFork);
            local.advise(Advice::NoHugePage);
            crate::mm::copy_mapping(&local, &st.mem.get(m).expect("looked up").mapping);
            if let Some((old, MemKind::Tier { id })) = st.mem.replace(m, local, MemKind::Local) {
                freed.push((id, old));
            }
        }
    }
    let given = freed.len() as u64;
    for (id, mapping) in freed {
        drop(mapping); // unmapped first: the node punches the slab's pages out on FREE
        if let Err(e) = tier.free_slab(id) {
            tracing::warn!("giving tier slab {id} back to the node: {e}");
        }
    }
    tracing::info!("the node asked for {n} slabs back: gave {given} ({clean} already on a donor)");
    let mut s = sh.stats.lock();
    s.s.tier_reclaimed_slabs += given;
    s.s.tier_reclaimed_clean += clean;
}

/// If memory slab `m` has complete donor copies, makes the donors its home and removes it;
/// returns its memory and kind (the caller unmaps it, and frees a tier slab with the node).
fn retire_if_written_through(
    sh: &Shared,
    st: &mut crate::shared::State,
    m: u32,
) -> Option<(Mapping, MemKind)> {
    let s = st.mem.get(m)?;
    if s.donors.is_empty() || s.unflushed() > 0 {
        return None;
    }
    sh.far.set_home(s.far_slab, Some(Home::Donors(s.donors)));
    let s = st.mem.remove(m)?;
    Some((s.mapping, s.kind))
}

/// One round of write-through: gives memory slabs their donor copies (`--replicas` of them;
/// a new copy next to existing ones gets every page), writes pages written since their last
/// write-through (oldest slabs first, at most [`WRITE_THROUGH_PAGES`]), and retires local
/// slabs whose donor copies are complete. Returns the pages written.
fn write_through(sh: &Shared) -> Result<usize, RuntimeError> {
    let order = sh.state.lock().mem.oldest_first();
    let mut written = 0;
    for m in order {
        if sh.shutdown.load(Ordering::Relaxed) || written >= WRITE_THROUGH_PAGES {
            break;
        }
        // Held from the allocation until the copies have joined the memory slab: a donor
        // declared dead, or taken back after a restart, in between would leave the slab a copy
        // under an id of the donor's old process (see `copy_slab`).
        let gate = sh.far.copy_gate.read();
        let have = sh.state.lock().mem.get(m).map(|s| s.donors);
        if let Some(have) = have {
            let want = sh.far.replicas.saturating_sub(have.len());
            if want > 0 && (have.is_empty() || sh.far.live_donors() > have.len()) {
                let more = sh.far.alloc_replicas(want, &have)?;
                if let Some(s) = sh.state.lock().mem.get_mut(m) {
                    if !s.donors.is_empty() {
                        s.mark_all_unflushed();
                    }
                    for x in more.as_slice() {
                        s.donors.push(Replica {
                            filling: false,
                            ..*x
                        });
                    }
                }
            }
        }
        drop(gate);
        while written < WRITE_THROUGH_PAGES {
            let n = write_through_slab(sh, m, WRITE_THROUGH_PAGES - written)?;
            if n == 0 {
                break;
            }
            written += n;
        }
        let retired = {
            let mut st = sh.state.lock();
            match st.mem.get(m).map(|s| s.kind) {
                Some(MemKind::Local) => retire_if_written_through(sh, &mut st, m),
                _ => None,
            }
        };
        if retired.is_some() {
            sh.stats.lock().s.local_slabs_migrated += 1;
        }
    }
    Ok(written)
}

/// Writes up to `max` (at most one batch) of memory slab `m`'s pages written since their last
/// write-through to its donor copies: copied out under the state lock, sealed when pages are
/// sealed, written without the lock. A page written again meanwhile is marked again; on a
/// failure the pages are marked again. Returns the pages written.
fn write_through_slab(sh: &Shared, m: u32, max: usize) -> Result<usize, RuntimeError> {
    let _gate = sh.far.copy_gate.read();
    let (donors, first_far, pages, mut data) = {
        let mut st = sh.state.lock();
        let Some(s) = st.mem.get_mut(m) else {
            return Ok(0);
        };
        // No copy yet, or one on a donor under suspicion: wait (a page written through
        // without that copy would leave it stale).
        if s.donors.is_empty()
            || s.donors
                .as_slice()
                .iter()
                .any(|x| !sh.far.donors[x.donor].health.is_live())
        {
            return Ok(0);
        }
        let pages = s.take_unflushed(max.min(farmem_transport::MAX_BATCH_PAGES));
        let mut data = vec![0u8; pages.len() * PAGE_SIZE];
        for (i, p) in pages.iter().enumerate() {
            crate::mm::with_page_bytes(&s.mapping, *p, |b| {
                data[i * PAGE_SIZE..][..PAGE_SIZE].copy_from_slice(b)
            });
        }
        (s.donors, s.far_slab * sh.far.slab_pages, pages, data)
    };
    if pages.is_empty() {
        return Ok(0);
    }
    if let Some(sealer) = &sh.far.sealer {
        for (p, page) in pages.iter().zip(data.chunks_exact_mut(PAGE_SIZE)) {
            sealer.seal(first_far + u64::from(*p), page);
        }
    }
    let writes: Vec<(Replicas, u32, u64, &[u8])> = pages
        .iter()
        .zip(data.chunks_exact(PAGE_SIZE))
        .map(|(p, d)| (donors, *p, first_far + u64::from(*p), d))
        .collect();
    if let Err(e) = sh.far.write_replicas(&writes) {
        if let Some(s) = sh.state.lock().mem.get_mut(m) {
            for p in &pages {
                s.mark_unflushed(*p);
            }
        }
        return Err(e);
    }
    let n = pages.len();
    let mut s = sh.stats.lock();
    s.s.tier_pages_written_through += n as u64;
    s.s.bytes_sent += (n * PAGE_SIZE) as u64;
    Ok(n)
}
