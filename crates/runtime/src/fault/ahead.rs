//! Installing predicted pages that are in a memory slab (the host tier) straight into their
//! region, one UFFDIO_COPY per run ([`install_ahead`]).

use farmem_policy::Origin;
use farmem_uffd::UffdError;

use crate::far::Home;
use crate::pages::{PageState, NO_FAR};
use crate::prefetch::addr_of;
use crate::shared::{Shared, State};
use farmem_proto::PAGE_SIZE;

/// Most pages installed ahead from memory slabs per fault: Leap's largest window, and more
/// than one UFFDIO_COPY batch is not worth holding the state lock for.
pub(super) const MAX_AHEAD: usize = 64;

/// Installs the predicted pages `out` that are in a memory slab (the host tier) straight into
/// their region, so the program's next accesses take no fault at all: no message, no other
/// thread, one UFFDIO_COPY per run of pages that neighbour each other both in the region and
/// in their slab (a scan's pages were evicted in order, so they went to neighbouring far
/// pages): see [`copy_runs`]. Write-protected and clean, or writable (dirty, compared with
/// the slab copy at eviction) while the program writes most such pages
/// ([`farmem_policy::ahead_writes`]). The window's first page is
/// its marker: it is left in the tier, and its fault tells the prefetcher that the stream
/// went through the pages installed before it (as Linux readahead's `PG_readahead` does).
/// When the first page is `addr` itself (the rest of a window that had no room before: Leap's
/// late pages), there is no marker and the pages join the window being consumed.
/// Pages are installed only below the evictor's high watermark: filling resident memory up to
/// the budget made every demand fault after it wait for the evictor (a random scan after a
/// sequential fill ran 2.5x slower). Returns the predicted pages that are on a donor only (for
/// the prefetch thread), the marker first if it is one.
pub(super) fn install_ahead(
    sh: &Shared,
    st: &mut State,
    out: &[u64],
    addr: usize,
    thread: u32,
    now: u64,
) -> Vec<u64> {
    let mut remote = Vec::new();
    let mut marker = None;
    let room = (sh.budget.high_water().saturating_sub(st.pages.resident()) as usize).min(MAX_AHEAD);
    let mut todo = Vec::new();
    for (i, p) in out.iter().enumerate() {
        let Some(a) = addr_of(*p) else {
            continue;
        };
        if a == addr {
            continue;
        }
        let Some(e) = st.pages.get(a) else { continue };
        if e.state != PageState::Remote || e.far == NO_FAR {
            continue;
        }
        let Some((Home::Memory(m), page)) = sh.far.home(e.far) else {
            remote.push(*p);
            continue;
        };
        if i == 0 {
            marker = Some(a);
            continue;
        }
        if todo.len() >= room {
            continue;
        }
        // Writable while most pages installed ahead are written later, write-protected
        // otherwise ([`farmem_policy::ahead_writes`]).
        let writable = st.ahead_writes.writable();
        todo.push(Ahead {
            addr: a,
            m,
            page,
            writable,
        });
    }
    let (installed, copies) = copy_runs(sh, st, &todo);
    let mut writable_count = 0;
    for x in &installed {
        // Inserted as a prefetch (Leap's eager eviction takes it first once used).
        // Inserted as an ordinary page instead, a seq scan was 1.6x slower (interleaved
        // runs: 10.9-11.7 vs 6.5-7.7 us per access) and numpy no faster (median 11.3 vs
        // 11.0 s over five runs each).
        if x.writable {
            st.pages
                .install_prefetched_writable(x.addr, Origin::Prefetch);
            writable_count += 1;
        } else {
            st.pages.install_prefetched(x.addr, Origin::Prefetch, true);
            st.ahead_writes.protected();
        }
    }
    if marker.is_some() || !installed.is_empty() {
        let installed: Vec<usize> = installed.iter().map(|x| x.addr).collect();
        sh.pf.installed_ahead(marker, thread, &installed, now);
        if !installed.is_empty() {
            let mut s = sh.stats.lock();
            s.s.tier_installed_ahead += installed.len() as u64;
            s.s.tier_installed_ahead_writable += writable_count;
            s.s.tier_ahead_copies += copies;
        }
    }
    remote
}

/// A page to install ahead from a memory slab: its region address, slab, page in the slab,
/// and whether it goes in writable.
#[derive(Clone, Copy)]
pub(super) struct Ahead {
    addr: usize,
    m: u32,
    page: u32,
    writable: bool,
}

/// Copies `todo` into their region pages, one UFFDIO_COPY (DONTWAKE: nobody waits on a page
/// installed ahead) per run of pages neighbouring each other in the region and in one slab,
/// installed alike. Per page, a run of 64 cost 1.3 µs against 2.2 µs copied one by one
/// (this machine kind). A page the kernel refuses (mapped already: a thread faulting on it is
/// being served; or events pending: the page may be released) is left to the fault path, and
/// the rest of its run is tried after it. Returns the pages installed and the ioctls issued.
pub(super) fn copy_runs(sh: &Shared, st: &State, todo: &[Ahead]) -> (Vec<Ahead>, u64) {
    let joins = |k: usize| {
        let (a, b) = (&todo[k - 1], &todo[k]);
        b.addr == a.addr + PAGE_SIZE
            && b.m == a.m
            && b.page == a.page + 1
            && b.writable == a.writable
    };
    let mut installed = Vec::with_capacity(todo.len());
    let mut copies = 0;
    for (i, j) in crate::runs::runs(todo.len(), joins) {
        let mut k = i;
        while k < j {
            let x = todo[k];
            let n = j - k;
            let done = match st.mem.read_run(x.m, x.page, n, |src| {
                sh.uffd.copy(x.addr, src, true, !x.writable)
            }) {
                Some(Ok(())) => n,
                Some(Err(UffdError::Again { done_bytes, .. })) => (done_bytes / PAGE_SIZE).min(n),
                _ => 0,
            };
            copies += 1;
            installed.extend_from_slice(&todo[k..k + done]);
            // The page after those copied was refused: skip it.
            k += done + 1;
        }
    }
    (installed, copies)
}
