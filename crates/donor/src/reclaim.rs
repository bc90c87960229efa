//! Taking memory back (Valet): which lent slabs the donor wants back, from which client, and
//! what happens until they are given back.
//!
//! A donor wants memory back for two reasons: its owner lowered its capacity below what it has
//! lent (`DonorControl::set_capacity_bytes`, `farmem donor --capacity-file` and SIGHUP), or its
//! host's `MemAvailable` fell below `--keep-free` (read every [`RECLAIM_TICK`]). It never
//! evicts anything itself: it tells each client which of its slabs it wants (RECLAIMS, answered
//! by GIVE_BACK), the client moves those slabs' pages to another donor and frees them
//! (FREE_SLAB), and the slab's memory goes back to the operating system (`munmap`) at once. This
//! is Valet's migration rather than Infiniswap's evict-to-disk: the pages stay in memory
//! somewhere, and no client's data is ever dropped by the donor.
//!
//! # Design
//! The wanted amount is the lent bytes beyond the capacity (in whole slabs) plus the host's
//! shortfall below `--keep-free` (in committed bytes, since freeing a slab returns only the
//! pages written to it). [`plan`] picks slabs to cover it:
//! - slabs already asked for are kept first (in the order they were asked), so a client that is
//!   busy moving a slab is not told to move another one instead;
//! - then, largest holders first (water-filling): each next slab is taken from the client that
//!   still holds the most slabs not yet asked for, and it is that client's least recently
//!   written slab (Valet's activity tag; never-written slabs first). Two clients holding as
//!   much are asked for as much; a client holding more gives more, and nobody is asked for
//!   anything while another holds more than it. Ties go to the older slab;
//! - once the lent-bytes part is covered, slabs with nothing committed are skipped: freeing them
//!   would not help the host;
//! - slabs of disconnected (orphaned) clients are never picked: nobody could move them; they are
//!   freed when the orphan grace ends, or asked for once their client reconnects.
//!
//! A slab belongs to one client, so no slab is ever asked from two clients. The plan is
//! recomputed on every RECLAIMS request and every [`RECLAIM_TICK`]; when the need falls (memory
//! freed elsewhere, capacity raised) the slabs asked for last are let go first, and the answer
//! may become empty. A freed slab that was asked for counts as given back; its committed bytes
//! are credited against the host's shortfall until the next reading of `MemAvailable`.
//!
//! A client that ignores the request: the donor keeps asking and, since it is still over its
//! capacity or short of memory, keeps refusing new slabs (`CapacityExhausted`,
//! `MemoryPressure`) to everyone. After [`OVERDUE_AFTER`] it logs a warning naming the client and
//! the slab (once per slab) and counts the slab as overdue (metrics). It never drops the data.
//!
//! # Limitations
//! A client's answer is cut to [`MAX_RECLAIM_SLABS`] slabs; the rest come in later answers. A
//! host short of memory because of other processes may ask for every written slab and still be
//! short: the donor can give back only what it lent.
use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use farmem_proto::MAX_RECLAIM_SLABS;
use parking_lot::Mutex;

use crate::host;
use crate::metrics::Metrics;
use crate::store::{Refusal, SlabInfo, SlabStore};

/// How often the donor reads `MemAvailable` (with `--keep-free`) and re-plans.
pub const RECLAIM_TICK: Duration = Duration::from_millis(200);
/// A slab asked for and not given back after this long is logged and counted as overdue.
pub const OVERDUE_AFTER: Duration = Duration::from_secs(30);

/// What the donor wants back, computed from a snapshot of its slabs.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Plan {
    /// Bytes wanted back: lent beyond the capacity plus the host's shortfall.
    pub wanted_bytes: u64,
    /// The slabs asked for, as (slab, owner), in the order chosen.
    pub slabs: Vec<(u32, u64)>,
}

/// Picks the slabs to ask for (see the module docs): `slabs` is every lent slab, `capacity` the
/// capacity in bytes, `host_shortfall` the committed bytes the host needs back, `previous` the
/// slabs asked for so far, oldest request first.
pub fn plan(
    slabs: &[SlabInfo],
    slab_size: u64,
    capacity: u64,
    host_shortfall: u64,
    previous: &[u32],
) -> Plan {
    let used = slabs.len() as u64 * slab_size;
    let over = used.saturating_sub(capacity);
    let mut out = Plan {
        wanted_bytes: over + host_shortfall,
        slabs: Vec::new(),
    };
    let (mut need_lent, mut need_host) = (over, host_shortfall);
    let useful = |s: &SlabInfo, need_lent: u64| need_lent > 0 || s.committed_bytes > 0;
    let mut chosen: HashSet<u32> = HashSet::new();
    let by_id: HashMap<u32, &SlabInfo> = slabs
        .iter()
        .filter(|s| !s.orphaned)
        .map(|s| (s.id, s))
        .collect();
    let mut picked: Vec<&SlabInfo> = Vec::new();
    for id in previous {
        if need_lent == 0 && need_host == 0 {
            break;
        }
        let Some(&s) = by_id.get(id) else {
            continue;
        };
        if useful(s, need_lent) && chosen.insert(s.id) {
            need_lent = need_lent.saturating_sub(slab_size);
            need_host = need_host.saturating_sub(s.committed_bytes);
            picked.push(s);
        }
    }
    let mut holders: BTreeMap<u64, Vec<&SlabInfo>> = BTreeMap::new();
    for s in by_id.values().filter(|s| !chosen.contains(&s.id)) {
        holders.entry(s.owner).or_default().push(s);
    }
    let age = |s: &SlabInfo| (s.last_write.unwrap_or(Duration::ZERO), s.id);
    for list in holders.values_mut() {
        // Least recently written last.
        list.sort_by_key(|s| std::cmp::Reverse(age(s)));
    }
    while need_lent > 0 || need_host > 0 {
        let best = holders
            .iter()
            .filter_map(|(&client, list)| {
                let i = list.iter().rposition(|s| useful(s, need_lent))?;
                Some(((list.len(), std::cmp::Reverse(age(list[i]))), client, i))
            })
            .max_by_key(|(key, _, _)| *key);
        let Some((_, client, i)) = best else {
            break;
        };
        let s = holders
            .get_mut(&client)
            .expect("a holder just seen")
            .remove(i);
        need_lent = need_lent.saturating_sub(slab_size);
        need_host = need_host.saturating_sub(s.committed_bytes);
        picked.push(s);
    }
    out.slabs = picked.iter().map(|s| (s.id, s.owner)).collect();
    out
}

#[derive(Default)]
struct State {
    /// The host's shortfall below `--keep-free` at the last reading, less the committed bytes
    /// of slabs given back since.
    host_shortfall_bytes: u64,
    /// The current plan's slabs, in the order asked.
    asked: Vec<u32>,
    /// The current plan, by client.
    by_client: HashMap<u64, Vec<u32>>,
    /// When each slab of the plan was first named to its client, and the client.
    told: HashMap<u32, (u64, Instant)>,
    /// Overdue slabs already logged.
    warned: HashSet<u32>,
    /// Whether the donor wanted anything back at the last plan (to log changes once).
    wanting: bool,
    /// `MemAvailable` could not be read at the last tick (logged once).
    meminfo_unreadable: bool,
}

/// The donor's reclaim state, shared by its connections and its reclaim thread.
pub struct Reclaimer {
    /// `--keep-free` in bytes; 0: never take memory back for the host.
    keep_free_bytes: u64,
    /// Where `MemAvailable` is read (`/proc/meminfo`, or a test's file).
    meminfo: PathBuf,
    metrics: Arc<Metrics>,
    state: Mutex<State>,
}

impl Reclaimer {
    /// A reclaimer keeping `keep_free_bytes` of the host's memory available (0: none), reading
    /// it from `meminfo`.
    pub(crate) fn new(keep_free_bytes: u64, meminfo: PathBuf, metrics: Arc<Metrics>) -> Reclaimer {
        Reclaimer {
            keep_free_bytes,
            meminfo,
            metrics,
            state: Mutex::new(State::default()),
        }
    }

    /// Recomputes the plan from the store and publishes its figures.
    fn replan(&self, st: &mut State, store: &SlabStore) {
        let p = plan(
            &store.slabs(),
            store.slab_size_bytes(),
            store.capacity_bytes(),
            st.host_shortfall_bytes,
            &st.asked,
        );
        st.asked = p.slabs.iter().map(|&(s, _)| s).collect();
        st.by_client.clear();
        for &(slab, owner) in &p.slabs {
            st.by_client.entry(owner).or_default().push(slab);
        }
        let asked: HashSet<u32> = st.asked.iter().copied().collect();
        st.told.retain(|s, _| asked.contains(s));
        st.warned.retain(|s| asked.contains(s));
        let wanting = p.wanted_bytes > 0;
        if wanting && !st.wanting {
            tracing::info!(
                wanted_bytes = p.wanted_bytes,
                lent_bytes = store.used_bytes(),
                capacity_bytes = store.capacity_bytes(),
                host_shortfall_bytes = st.host_shortfall_bytes,
                slabs = p.slabs.len(),
                clients = st.by_client.len(),
                "the donor wants memory back: asking clients to move slabs away; no new slabs are lent meanwhile"
            );
        } else if !wanting && st.wanting {
            tracing::info!("the donor wants no memory back any more");
        }
        st.wanting = wanting;
        let overdue = st
            .told
            .values()
            .filter(|(_, t)| t.elapsed() >= OVERDUE_AFTER)
            .count();
        self.metrics
            .set_reclaim(p.wanted_bytes, p.slabs.len() as u64, overdue as u64);
    }

    /// RECLAIMS from `client`: the slabs the donor wants back from it now (at most
    /// [`MAX_RECLAIM_SLABS`], least recently written first within what was chosen).
    pub fn wanted_from(&self, client: u64, store: &SlabStore) -> Vec<u32> {
        let mut st = self.state.lock();
        self.replan(&mut st, store);
        let mut slabs = st.by_client.get(&client).cloned().unwrap_or_default();
        slabs.truncate(MAX_RECLAIM_SLABS);
        let now = Instant::now();
        for &s in &slabs {
            st.told.entry(s).or_insert((client, now));
        }
        slabs
    }

    /// `client` frees `slab`: it is freed in `store` and, if the donor had asked for it, it
    /// counts as given back (its committed bytes off the host's shortfall), and the plan is
    /// brought up to date. The free happens under the plan's lock: a re-plan by the reclaim
    /// thread between the free and this accounting would already have dropped the slab from
    /// the plan, and its give-back went uncounted.
    pub fn free(&self, client: u64, slab: u32, store: &SlabStore) -> Result<(), Refusal> {
        let mut st = self.state.lock();
        let committed_bytes = store.free(client, slab)?;
        let Some(i) = st.asked.iter().position(|&s| s == slab) else {
            return Ok(());
        };
        st.asked.remove(i);
        st.told.remove(&slab);
        st.warned.remove(&slab);
        if let Some(list) = st.by_client.get_mut(&client) {
            list.retain(|&s| s != slab);
        }
        st.host_shortfall_bytes = st.host_shortfall_bytes.saturating_sub(committed_bytes);
        self.metrics.slab_given_back();
        tracing::debug!(client, slab, committed_bytes, "slab given back");
        self.replan(&mut st, store);
        Ok(())
    }

    /// One reclaim tick: reads `MemAvailable` (with `--keep-free`), re-plans, and logs slabs
    /// asked for longer than [`OVERDUE_AFTER`].
    pub fn tick(&self, store: &SlabStore) {
        let mut st = self.state.lock();
        if self.keep_free_bytes > 0 {
            match host::mem_available_bytes_in(&self.meminfo) {
                Some(available) => {
                    st.meminfo_unreadable = false;
                    st.host_shortfall_bytes = self.keep_free_bytes.saturating_sub(available);
                }
                None => {
                    if !st.meminfo_unreadable {
                        tracing::warn!(
                            meminfo = %self.meminfo.display(),
                            "cannot read MemAvailable: --keep-free takes nothing back until it can"
                        );
                    }
                    st.meminfo_unreadable = true;
                    st.host_shortfall_bytes = 0;
                }
            }
        }
        self.replan(&mut st, store);
        let State { told, warned, .. } = &mut *st;
        for (&slab, &(client, since)) in told.iter() {
            if since.elapsed() >= OVERDUE_AFTER && warned.insert(slab) {
                tracing::warn!(
                    client,
                    slab,
                    asked_s = since.elapsed().as_secs(),
                    "a client has not given back a slab the donor asked for {} s ago; the donor keeps asking and lends no new slabs meanwhile (it never drops a client's data): check that client's runtime",
                    OVERDUE_AFTER.as_secs()
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SLAB: u64 = 1 << 20;

    fn slab(id: u32, owner: u64, written_at_s: Option<u64>, committed: u64) -> SlabInfo {
        SlabInfo {
            id,
            owner,
            committed_bytes: committed,
            last_write: written_at_s.map(Duration::from_secs),
            orphaned: false,
        }
    }

    fn ids(p: &Plan) -> Vec<u32> {
        let mut v: Vec<u32> = p.slabs.iter().map(|&(s, _)| s).collect();
        v.sort_unstable();
        v
    }

    #[test]
    fn nothing_is_wanted_within_capacity_and_without_a_shortfall() {
        let slabs = [slab(1, 1, Some(1), SLAB), slab(2, 2, None, 0)];
        assert_eq!(plan(&slabs, SLAB, 2 * SLAB, 0, &[]), Plan::default());
    }

    #[test]
    fn over_capacity_takes_the_least_recently_written_slabs_of_the_largest_holder() {
        // Client 1 holds 3 slabs, client 2 holds 1; the donor is 2 slabs over.
        let slabs = [
            slab(1, 1, Some(5), SLAB),
            slab(2, 1, Some(1), SLAB),
            slab(3, 1, None, 0),
            slab(4, 2, Some(0), SLAB),
        ];
        let p = plan(&slabs, SLAB, 2 * SLAB, 0, &[]);
        assert_eq!(p.wanted_bytes, 2 * SLAB);
        assert_eq!(
            p.slabs,
            vec![(3, 1), (2, 1)],
            "never written, then oldest write"
        );
    }

    #[test]
    fn equal_holders_share_the_shortfall() {
        let slabs: Vec<SlabInfo> = (0..8)
            .map(|i| slab(i, u64::from(i % 2) + 1, Some(u64::from(i)), SLAB))
            .collect();
        let p = plan(&slabs, SLAB, 4 * SLAB, 0, &[]);
        let per: Vec<usize> = [1, 2]
            .iter()
            .map(|c| p.slabs.iter().filter(|(_, o)| o == c).count())
            .collect();
        assert_eq!(per, vec![2, 2]);
        assert_eq!(ids(&p), vec![0, 1, 2, 3], "each client's oldest slabs");
    }

    #[test]
    fn slabs_asked_for_stay_asked_for_and_the_last_asked_go_first_when_the_need_falls() {
        let slabs: Vec<SlabInfo> = (1..=4)
            .map(|i| slab(i, 1, Some(u64::from(i)), SLAB))
            .collect();
        // Slab 4 is the most recently written but was asked for already: it stays.
        let p = plan(&slabs, SLAB, 2 * SLAB, 0, &[4, 3]);
        assert_eq!(ids(&p), vec![3, 4]);
        let p = plan(&slabs, SLAB, 3 * SLAB, 0, &[4, 3]);
        assert_eq!(ids(&p), vec![4]);
    }

    #[test]
    fn a_host_shortfall_is_covered_by_committed_bytes_and_skips_empty_slabs() {
        let slabs = [
            slab(1, 1, None, 0),
            slab(2, 1, Some(1), SLAB / 2),
            slab(3, 2, Some(2), SLAB / 2),
            slab(4, 2, Some(3), SLAB),
        ];
        let p = plan(&slabs, SLAB, 8 * SLAB, SLAB, &[]);
        assert_eq!(p.wanted_bytes, SLAB);
        assert_eq!(
            ids(&p),
            vec![2, 3],
            "the empty slab 1 would not help the host"
        );
        // More than everything written: every written slab, and still wanted.
        let p = plan(&slabs, SLAB, 8 * SLAB, 10 * SLAB, &[]);
        assert_eq!(ids(&p), vec![2, 3, 4]);
        assert_eq!(p.wanted_bytes, 10 * SLAB);
    }

    #[test]
    fn orphans_are_never_asked_and_no_slab_is_asked_twice() {
        let mut slabs: Vec<SlabInfo> = (1..=6)
            .map(|i| slab(i, u64::from(i % 3), None, SLAB))
            .collect();
        slabs[0].orphaned = true;
        let p = plan(&slabs, SLAB, 0, 0, &[1, 2, 2]);
        assert!(!ids(&p).contains(&1));
        let mut seen = ids(&p);
        seen.dedup();
        assert_eq!(seen.len(), p.slabs.len());
        assert_eq!(p.slabs.len(), 5);
    }
}
