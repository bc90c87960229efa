//! What the prefetch thread ([`crate::threads::prefetch`]) decides, over plain data: which
//! queued requests are still worth fetching, and how the rest are grouped into batches per
//! donor. The thread submits and waits for the batches; kept apart so these decisions are
//! unit-tested without donors.

use farmem_transport::PageAddr;

use crate::prefetch::{Inner, Req};

/// Drops the requests for pages a demand fault already brought in (counted as waited hits,
/// so their in-flight entries go too), counting them as dropped: a prefetch thread that fell
/// behind catches up instead of fetching stale pages.
pub(crate) fn drop_consumed(i: &mut Inner, reqs: &mut Vec<Req>) {
    let before = reqs.len();
    reqs.retain(|r| {
        let consumed = i.in_flight.get(&r.addr).is_some_and(|f| f.consumed);
        if consumed {
            i.in_flight.remove(&r.addr);
        }
        !consumed
    });
    i.dropped += (before - reqs.len()) as u64;
}

/// One batch of reads for one donor: where each page is there, and its request.
pub(crate) struct Batch {
    pub(crate) donor: usize,
    pub(crate) addrs: Vec<PageAddr>,
    pub(crate) reqs: Vec<Req>,
}

/// Groups `reqs` by the donor of their first copy (`source`) into batches of at most `max`
/// pages, in request order per donor, donors in order. Requests with no copy on a live donor
/// among the first `donors` (`live`) are returned apart: the demand path reads them (failing
/// over, or from the backup).
pub(crate) fn batches(
    reqs: impl IntoIterator<Item = Req>,
    donors: usize,
    source: impl Fn(u64) -> Option<(usize, PageAddr)>,
    live: impl Fn(usize) -> bool,
    max: usize,
) -> (Vec<Batch>, Vec<Req>) {
    let mut groups: Vec<Vec<(PageAddr, Req)>> = (0..donors).map(|_| Vec::new()).collect();
    let mut lost = Vec::new();
    for r in reqs {
        match source(r.far) {
            Some((d, a)) if d < groups.len() && live(d) => groups[d].push((a, r)),
            _ => lost.push(r),
        }
    }
    let mut out = Vec::new();
    for (donor, g) in groups.into_iter().enumerate() {
        let mut g = g.into_iter().peekable();
        while g.peek().is_some() {
            let (addrs, reqs) = g.by_ref().take(max).unzip();
            out.push(Batch { donor, addrs, reqs });
        }
    }
    (out, lost)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::prefetch::InFlight;

    fn req(addr: usize, far: u64) -> Req {
        Req {
            addr,
            far,
            thread: 0,
            window: addr,
        }
    }

    fn in_flight(far: u64, consumed: bool) -> InFlight {
        InFlight {
            far,
            consumed,
            waiter: None,
        }
    }

    #[test]
    fn pages_a_demand_fault_consumed_are_not_fetched() {
        let mut i = Inner::default();
        i.in_flight.insert(0x1000, in_flight(1, true));
        i.in_flight.insert(0x2000, in_flight(2, false));
        let mut reqs = vec![req(0x1000, 1), req(0x2000, 2), req(0x3000, 3)];
        drop_consumed(&mut i, &mut reqs);
        let left: Vec<usize> = reqs.iter().map(|r| r.addr).collect();
        assert_eq!(left, vec![0x2000, 0x3000]);
        assert_eq!(i.dropped, 1);
        assert!(
            !i.in_flight.contains_key(&0x1000),
            "its in-flight entry goes too"
        );
        assert!(i.in_flight.contains_key(&0x2000));
    }

    #[test]
    fn batches_hold_at_most_the_batch_limit_per_donor_in_request_order() {
        let max = farmem_transport::MAX_BATCH_PAGES;
        let n = 2 * max + 10;
        // Even far pages on donor 0, odd on donor 1.
        let reqs: Vec<Req> = (0..n as u64).map(|f| req(f as usize * 4096, f)).collect();
        let source = |far: u64| {
            Some((
                (far % 2) as usize,
                PageAddr {
                    slab: 7,
                    page: far as u32,
                },
            ))
        };
        let (out, lost) = batches(reqs, 2, source, |_| true, max);
        assert!(lost.is_empty());
        let sizes: Vec<(usize, usize)> = out.iter().map(|b| (b.donor, b.reqs.len())).collect();
        assert_eq!(sizes, vec![(0, max), (0, 5), (1, max), (1, 5)]);
        for b in &out {
            assert_eq!(b.addrs.len(), b.reqs.len());
            assert!(b.reqs.iter().all(|r| (r.far % 2) as usize == b.donor));
            assert!(b.reqs.windows(2).all(|w| w[0].far < w[1].far));
            assert!(b
                .addrs
                .iter()
                .zip(&b.reqs)
                .all(|(a, r)| a.page as u64 == r.far));
        }
    }

    #[test]
    fn pages_without_a_live_known_donor_go_to_the_demand_path() {
        let reqs = vec![req(0, 0), req(4096, 1), req(8192, 2), req(12288, 3)];
        // Far page 0 on live donor 0, 1 on dead donor 1, 2 nowhere, 3 on an unknown donor.
        let source = |far: u64| {
            let a = PageAddr { slab: 1, page: 0 };
            match far {
                0 => Some((0, a)),
                1 => Some((1, a)),
                3 => Some((5, a)),
                _ => None,
            }
        };
        let (out, lost) = batches(reqs, 2, source, |d| d == 0, 256);
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].donor, 0);
        assert_eq!(out[0].reqs[0].far, 0);
        let lost: Vec<u64> = lost.iter().map(|r| r.far).collect();
        assert_eq!(lost, vec![1, 2, 3]);
    }
}
