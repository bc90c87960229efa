//! What the fault path tells the prefetcher ([`super::Prefetch`]'s methods it calls): pool,
//! remote and tier faults fed to the prefetcher and counted as hits or demand faults, waiting
//! for a prefetch in flight, predicting and queueing fetches, pages installed ahead from memory
//! slabs, and marker mode's inferred hits.

use std::time::Instant;

use farmem_policy::prefetch::Access;
use farmem_policy::Origin;

use super::{addr_of, page_of, InFlight, Prefetch, Req, MAX_TRACKED, MAX_WINDOWS};
use crate::pages::{PageState, Pages, NO_FAR};

impl Prefetch {
    /// A fault on `addr` served from the write-back pool, before the page is installed:
    /// whether it is a prefetch hit (its [`Origin`] for the eviction policy) and the time, to
    /// [`Prefetch::feed`] the access after the install.
    pub(crate) fn pool_fault(&self, addr: usize) -> (Origin, u64) {
        let now = self.now_ns();
        // A pool page that was not prefetched is a local cache hit (an evicted page not yet
        // reclaimed): it would not have gone to a donor without prefetching either, so it is
        // neither a prefetch hit nor a demand fault in the measures.
        let hit = self.inner.lock().measures.prefetch_hit(page_of(addr), now);
        let origin = if hit {
            Origin::Prefetch
        } else {
            Origin::Demand
        };
        (origin, now)
    }

    /// A fault on `addr` whose remote read was just submitted (state lock held again): counts
    /// it. Returns whether it was a prefetch hit (its prefetch was in flight) and the time, to
    /// feed the prefetcher with.
    pub(crate) fn on_remote_fault(&self, addr: usize) -> (bool, u64) {
        let page = page_of(addr);
        let now = self.now_ns();
        let mut i = self.inner.lock();
        let waited = match i.in_flight.get_mut(&addr) {
            Some(f) if !f.consumed => {
                f.consumed = true;
                i.live -= 1;
                true
            }
            _ => false,
        };
        if waited {
            i.hits_waited += 1;
            i.lookahead.waited();
            i.measures.prefetched(page, now);
            i.measures.prefetch_hit(page, now);
        } else {
            // An unused prefetched page reaching here was evicted: pollution.
            i.measures.evicted(page);
            i.measures.demand_fault();
        }
        (waited, now)
    }

    /// A fault on `addr` served from a memory slab (the host tier): a prefetch hit when it is
    /// the marker of a window installed ahead (recorded as prefetched then), else a demand
    /// fault. Returns the hit and the time, to feed the prefetcher with.
    pub(crate) fn on_tier_fault(&self, addr: usize) -> (bool, u64) {
        let now = self.now_ns();
        let mut i = self.inner.lock();
        let hit = i.measures.prefetch_hit(page_of(addr), now);
        if !hit {
            i.measures.demand_fault();
        }
        (hit, now)
    }

    /// A fault on `addr` (far page `far`, just marked `Fetching`), with the state lock held: if
    /// the page's prefetch is in flight, the fault waits for it instead of sending a demand read
    /// of its own (the batch is on its way; a new read would only queue behind it on a loaded
    /// link, and a sequential scan that outruns its prefetches would send one read per page).
    /// Counts a waited hit and returns the time (the caller feeds the prefetcher with a hit);
    /// None when nothing is in flight for it.
    pub(crate) fn wait_for_prefetch(&self, addr: usize, far: u64, t0: Instant) -> Option<u64> {
        let now = self.now_ns();
        let mut i = self.inner.lock();
        match i.in_flight.get_mut(&addr) {
            Some(f) if !f.consumed && f.waiter.is_none() && f.far == far => f.waiter = Some(t0),
            _ => return None,
        }
        i.hits_waited += 1;
        i.lookahead.waited();
        i.measures.prefetched(page_of(addr), now);
        i.measures.prefetch_hit(page_of(addr), now);
        Some(now)
    }

    /// Feeds one access to the prefetcher (state lock held: `pages` says which pages of a
    /// window whose marker this is are still resident) and returns the pages it predicts, the
    /// window's marker first; or, for a late page of a window issued before (Leap's late
    /// pages), that page itself first, and no marker.
    pub(crate) fn predict(
        &self,
        pages: &mut Pages,
        addr: usize,
        thread: u32,
        hit: bool,
        now: u64,
    ) -> Vec<u64> {
        let mut out = Vec::new();
        let Some(pred) = &self.predictor else {
            return out;
        };
        let lookahead = hit.then(|| {
            // A marker's fault: the pages installed ahead in the window before it were used.
            self.infer_hits(pages, addr, thread, now);
            let mut i = self.inner.lock();
            i.lookahead.hit(now);
            i.lookahead.pages()
        });
        let mut pred = pred.lock();
        if let Some(pages) = lookahead {
            pred.set_lookahead(pages);
        }
        pred.on_access(
            &Access {
                page: page_of(addr),
                thread,
                time_ns: now,
                prefetch_hit: hit,
            },
            &mut out,
        );
        out
    }

    /// Queues the predicted pages `out` (of a fault on `addr`) that are on a donor only to the
    /// prefetch thread (state lock held). `out[0]` names the window (its marker).
    pub(crate) fn queue_fetches(&self, pages: &Pages, out: &[u64], addr: usize, thread: u32) {
        let Some(first) = out.first() else {
            return;
        };
        let window = addr_of(*first).unwrap_or(usize::MAX);
        let reqs = self.track(pages, out, addr, thread, window);
        if !reqs.is_empty() {
            self.queue.lock().extend(reqs);
            self.queue_cv.notify_one();
        }
    }

    /// Pages of a window were installed ahead from the host tier (state lock held): each is
    /// prefetched; `marker`, left in the tier, is the page whose fault reports them as used.
    pub(crate) fn installed_ahead(
        &self,
        marker: Option<usize>,
        thread: u32,
        installed: &[usize],
        now: u64,
    ) {
        let mut i = self.inner.lock();
        for a in installed {
            i.measures.prefetched(page_of(*a), now);
        }
        let Some(m) = marker else {
            // Pages of the window being consumed that had no room when it was issued (the
            // prefetcher names no marker then): the next marker's fault reports them with
            // the rest of that window, in the window's order (the prefetcher's history
            // would see a step back otherwise).
            if let Some(w) = i.last_marker.get(&thread).copied() {
                if let Some(pages) = i.windows.get_mut(&w) {
                    join_window(pages, installed);
                }
            }
            return;
        };
        i.measures.prefetched(page_of(m), now);
        if i.windows.len() > MAX_WINDOWS {
            i.windows.clear();
        }
        if i.markers.len() > MAX_WINDOWS {
            i.markers.clear();
        }
        i.windows.insert(m, installed.to_vec());
        i.markers.insert(m, thread);
    }

    /// The predicted pages worth fetching (on a donor only, not in flight, within the
    /// limits), now tracked as in flight.
    fn track(
        &self,
        pages: &Pages,
        out: &[u64],
        addr: usize,
        thread: u32,
        window: usize,
    ) -> Vec<Req> {
        let mut reqs = Vec::new();
        let mut i = self.inner.lock();
        let cap = i.lookahead.in_flight_cap();
        for p in out {
            if i.live >= cap || i.in_flight.len() >= MAX_TRACKED {
                break;
            }
            let Some(a) = addr_of(*p) else {
                continue;
            };
            if a == addr {
                continue;
            }
            let Some(e) = pages.get(a) else { continue };
            if e.state != PageState::Remote || e.far == NO_FAR || i.in_flight.contains_key(&a) {
                continue;
            }
            i.live += 1;
            i.in_flight.insert(
                a,
                InFlight {
                    far: e.far,
                    consumed: false,
                    waiter: None,
                },
            );
            reqs.push(Req {
                addr: a,
                far: e.far,
                thread,
                window,
            });
        }
        reqs
    }

    /// Marker mode: the marker of a window of `thread`'s stream was hit, so the stream went
    /// through the window it was in before: report that window's eagerly installed pages still
    /// resident as hits, then remember the new window.
    fn infer_hits(&self, pages: &mut Pages, addr: usize, thread: u32, now: u64) {
        let window = {
            let mut i = self.inner.lock();
            if i.markers.remove(&addr).is_none() {
                return;
            }
            let prev = i.last_marker.insert(thread, addr);
            prev.and_then(|m| i.windows.remove(&m)).unwrap_or_default()
        };
        let Some(pred) = &self.predictor else { return };
        let mut sink = Vec::new();
        for a in window {
            if !pages.get(a).is_some_and(|e| e.state.is_resident()) {
                continue;
            }
            let p = page_of(a);
            let counted = {
                let mut i = self.inner.lock();
                let c = i.measures.prefetch_hit(p, now);
                if c {
                    i.inferred_hits += 1;
                }
                c
            };
            if !counted {
                continue;
            }
            pages.touched(a);
            pred.lock().on_access(
                &Access {
                    page: p,
                    thread,
                    time_ns: now,
                    prefetch_hit: true,
                },
                &mut sink,
            );
        }
    }
}

/// Adds `late` pages to a window's installed `pages`, keeping the window's order (ascending
/// or descending, as its stream went).
fn join_window(pages: &mut Vec<usize>, late: &[usize]) {
    let descending = pages.len() > 1 && pages[0] > pages[pages.len() - 1];
    pages.extend_from_slice(late);
    pages.sort_unstable();
    if descending {
        pages.reverse();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn late_pages_join_their_window_in_its_order() {
        let mut up = vec![0x1000, 0x3000, 0x6000];
        join_window(&mut up, &[0x5000, 0x4000]);
        assert_eq!(up, [0x1000, 0x3000, 0x4000, 0x5000, 0x6000]);
        let mut down = vec![0x9000, 0x6000];
        join_window(&mut down, &[0x8000, 0x7000]);
        assert_eq!(down, [0x9000, 0x8000, 0x7000, 0x6000]);
        let mut empty = Vec::new();
        join_window(&mut empty, &[0x2000, 0x1000]);
        assert_eq!(empty, [0x1000, 0x2000]);
    }
}
