//! Fork handling: the runtime does not enable UFFD_FEATURE_EVENT_FORK, so a child's copy of a
//! region is unregistered plain memory. Before fork, eviction is paused until the parent
//! resumes after fork, and evicted pages are brought back so the child gets their data as
//! ordinary memory — except, for a child that starts a runtime of its own (a process tree),
//! pages in the host tier, which the child *borrows*. Pages of ranges marked `MADV_DONTFORK`
//! ([`crate::dontfork`]; V8's heap) stay where they are: the child has no mapping there.
//!
//! # Lending host-tier pages
//!
//! - The parent takes a node *hold* over its tier slabs (the node punches none of them while
//!   a process maps the hold's memfd, even after FREE or the parent's death) and marks those
//!   slabs `MADV_DOFORK` for this fork only, so the child inherits their mappings.
//! - Remote pages whose far page is in a held slab stay there; so do resident pages with a
//!   copy there, which the child drops before registering if they still equal it
//!   ([`Lent::discard_unchanged`]): it would otherwise count, and copy out to evict, pages it
//!   shares with the parent. Those far pages are *frozen* in the parent ([`crate::farpages`]):
//!   never rewritten, never reused, until every hold is dead (the tier thread checks).
//! - The child's runtime starts its own far pages above the lent ones ([`Lent::floor`]),
//!   adopts the inherited mappings as read-only *borrowed* slabs and marks the lent pages
//!   Remote there ([`borrow`]); from then on they fault in like any other host-tier page.
//! - A refused hold (an older node, too many holds) lends nothing: everything comes back, as
//!   without a tree. A child that cannot start its runtime copies the lent pages in.
//!
//! # Lending pages on donors
//!
//! - Remote pages on donors stay there too (not with a backup file: the child could not read
//!   that). The parent takes a [`ForkHold`] of its own (the same memfd lifetime signal, made
//!   here) and freezes their far pages; the child's runtime connects to those donors *as the
//!   parent's client* (its id and reconnect key, [`LentDonors`]), read only, and opens the
//!   pages with the parent's key and the seals they had at the fork ([`crate::seal`]). The
//!   donor keeps the parent's slabs while any connection of that client is open, so a child
//!   outlives a parent that exits or is killed. The parent moves no slab a child reads
//!   ([`crate::migrate`] waits for the thaw) and frees no copy it dropped meanwhile
//!   ([`crate::heal`]: the child may still read it).
//! - The child's borrowed donor slabs ([`Home::Borrowed`]) are read through those connections
//!   only: never written, healed or moved. A grandchild borrows them in turn, from the same
//!   lender ([`crate::lentdonors`]).
//!
//! No lock is held across `fork()`: the child must not touch its copy of the parent's runtime
//! at all (its threads are gone, and any lock one of them held at the fork instant stays held
//! there), so [`before_fork`] hands the forking thread what the child needs ([`ForkPlan`]) and
//! [`crate::Runtime::after_fork_child`] only marks the runtime as the parent's. Forks from
//! several threads at once are counted: eviction resumes when the last one is done.
//!
//! # Limitations
//!
//! - Without lending, local memory exceeds the budget while a fork is prepared (every page is
//!   resident).
//! - Pages shared with the child cannot be MOVEd (EBUSY) until the parent writes them; either
//!   side's evictor copies such a page out and drops it from its own process
//!   ([`crate::cow`]), so the page stays in memory only while the other side still maps it.
//!   The parent's resident pages without an equal far copy stay shared with the child, which
//!   counts them too: the tree's runtimes count such a page twice, so they hold *less* than
//!   the budget, never more.
//! - A page another thread of the parent releases in the instant of the fork may be borrowed
//!   by the child with its old contents (what it read before the release).
//! - While any child that borrowed pages lives, the parent's rewritten far pages are not
//!   reused: its host-tier (or donor) use grows by up to the pages lent.
//! - A child knows the donor copies a lent slab had at the fork: if they all die, its reads of
//!   those pages fail (SIGBUS), even when the parent has since healed the slab elsewhere.

use std::collections::BTreeMap;
use std::os::fd::RawFd;
use std::time::Duration;

use farmem_mm::Advice;
use farmem_uffd::UffdError;

use crate::far::Home;
use crate::forkhold::ForkHold;
use crate::lentdonors::{Lender, LentDonors};
use crate::memslabs::MemKind;
use crate::pages::{Entry, PageState, NO_FAR};
use crate::replicas::Replicas;
use crate::shared::{Failure, Shared, State};
use crate::{RuntimeError, PAGE_SIZE};

/// What a fork lends the child (see the module doc): the tier slabs it inherits and the region
/// pages left there. The child's runtime borrows them ([`crate::Runtime::borrow`]); a child
/// without one copies them in ([`Lent::copy_in`]). Made only by [`crate::Runtime::prepare_fork`]
/// (its fields are private: the child's runtime takes the slabs' mappings as its own).
#[derive(Clone, Debug, Default)]
pub struct Lent {
    /// Pages per far slab (the child must use the same).
    slab_pages: u64,
    /// The child's own far pages start here, above every far page lent (a slab boundary).
    floor: u64,
    /// The lent slabs, mapped at the same addresses in the child, by far slab.
    slabs: Vec<LentSlab>,
    /// Region pages left in them (or on donors), and resident pages with a copy in a lent
    /// slab: (page address, far page).
    pages: Vec<(usize, u64)>,
    /// The donors pages were left on, if any.
    donors: Option<LentDonors>,
}

/// One lent slab.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct LentSlab {
    /// The far slab it holds.
    far_slab: u64,
    /// Its mapping (inherited by the child at the same address).
    addr: usize,
    len: usize,
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

/// What [`before_fork`] hands the forking thread.
#[derive(Debug, Default)]
pub struct ForkPlan {
    /// The regions: (start, length in bytes).
    pub regions: Vec<(usize, usize)>,
    /// What the child borrows, when pages were left in the host tier for it.
    pub lent: Option<Lent>,
    /// The parent's node connection: the child closes its copy, or the node would see the
    /// parent's death only once the child exits too.
    pub node_fd: Option<RawFd>,
    /// The slab hold taken for this fork (unmapped here after the fork).
    hold: Option<u32>,
    /// This fork mapped the hold over pages left on donors (unmapped here after the fork).
    donor_hold: bool,
}

/// What a fork may leave far for the child.
#[derive(Default)]
struct Lendable {
    /// Memory slabs, by index, with their kind at the time they were held (a slab the node
    /// took back meanwhile changes kind, and its pages are brought back instead).
    memory: BTreeMap<u32, MemKind>,
    /// Pages on donors may be left there (the fork's hold is mapped).
    donors: bool,
}

impl Lendable {
    fn is_empty(&self) -> bool {
        self.memory.is_empty() && !self.donors
    }
}

/// Where a lent page's far copy is.
#[derive(Clone, Copy, PartialEq, Eq)]
enum LentAt {
    /// In memory slab `m` (the host tier, or one this process borrowed).
    Memory(u32),
    /// On this process's donors.
    Donors,
    /// On donors, borrowed from this process's parent ([`Home::Borrowed`]).
    Borrowed,
}

/// Before `fork()`: pauses eviction, brings evicted pages back and returns the regions (start,
/// length in bytes) for a child that pages its own memory. With `lend`, pages in the host tier
/// stay there: the child borrows them (see the module doc).
pub(crate) fn before_fork(sh: &Shared, lend: bool) -> ForkPlan {
    {
        let mut st = sh.state.lock();
        st.forks += 1;
        st.paused = true;
        while st.pages.evicting() > 0 {
            sh.commit_cv.wait_for(&mut st, Duration::from_millis(5));
        }
    }
    let (hold, lendable) = if lend {
        hold_lendable(sh)
    } else {
        (None, Lendable::default())
    };
    let mut plan = ForkPlan {
        node_fd: sh.far.tier.as_ref().map(|t| t.socket_fd()),
        hold,
        ..ForkPlan::default()
    };
    // A slab the node takes back meanwhile turns its pages unlendable: bring those back too
    // (without lending, one pass: a page that cannot come back failed for good).
    for attempt in 0..3 {
        if let Err(e) = bring_all_back(sh, &lendable) {
            sh.report(
                Failure::Fetch,
                format!(
                    "before fork: bringing evicted pages back failed ({e}); the child will \
                     read zeros where those pages are"
                ),
            );
        }
        let mut st = sh.state.lock();
        let (missing, pages, remote) = check_all_back(sh, &mut st, &lendable);
        if missing.is_some() && attempt < 2 && !lendable.is_empty() {
            continue;
        }
        if let Some(what) = missing {
            sh.report(
                Failure::Fetch,
                format!("before fork: {what}; the child will read zeros there"),
            );
        }
        plan.regions = st
            .pages
            .ranges()
            .into_iter()
            .map(|(s, e)| (s, e - s))
            .collect();
        plan.donor_hold = lendable.donors;
        plan.lent = lend_pages(sh, &mut st, pages);
        drop(st);
        if plan.lent.is_some() {
            sh.stats.lock().s.fork_pages_lent += remote as u64;
        }
        break;
    }
    plan
}

/// Takes a hold over every tier slab of this process and marks those (and the slabs this
/// process borrowed itself) to be inherited; returns the hold and the slabs. A refused hold
/// (a node without holds, or too many) lends nothing: everything is brought back as before.
fn hold_lendable(sh: &Shared) -> (Option<u32>, Lendable) {
    let mut lendable = Lendable {
        donors: hold_donors(sh),
        ..Lendable::default()
    };
    let Some(tier) = &sh.far.tier else {
        return (None, lendable);
    };
    lendable.memory = sh.state.lock().mem.lendable().into_iter().collect();
    let ids: Vec<u32> = lendable
        .memory
        .values()
        .filter_map(|k| match k {
            MemKind::Tier { id } => Some(*id),
            _ => None,
        })
        .collect();
    let mut hold = None;
    if !ids.is_empty() {
        match tier.hold(&ids) {
            Ok(h) => hold = Some(h),
            Err(e) => {
                tracing::warn!(
                    "{}: no hold for a fork ({e}): its pages are brought back instead",
                    tier.describe()
                );
                lendable.memory.retain(|_, k| *k == MemKind::Borrowed);
            }
        }
    }
    let mut st = sh.state.lock();
    for (m, kind) in &lendable.memory {
        if let Some(s) = st.mem.get(*m).filter(|s| s.kind == *kind) {
            s.mapping.advise(Advice::DoFork);
        }
    }
    st.dofork = true;
    (hold, lendable)
}

/// Whether this fork may leave pages on donors: this runtime has donors, no backup file (a
/// child could not read it), and the hold (made on first use) is mapped for the fork
/// ([`ForkHold::begin_fork`], undone in [`after_fork_parent`]).
fn hold_donors(sh: &Shared) -> bool {
    if sh.far.donors.is_empty() || sh.far.backup.is_some() {
        return false;
    }
    let mut st = sh.state.lock();
    if st.fork_hold.is_none() {
        match ForkHold::new() {
            Ok(h) => st.fork_hold = Some(h),
            Err(e) => {
                tracing::warn!(
                    "no hold for a fork ({e}): its donor pages are brought back instead"
                );
                return false;
            }
        }
    }
    match st.fork_hold.as_mut().map(ForkHold::begin_fork) {
        Some(Ok(())) => true,
        Some(Err(e)) => {
            tracing::warn!("mapping a fork's hold ({e}): its donor pages are brought back instead");
            false
        }
        None => false,
    }
}

/// Whether a page in `e` is left where it is for the child: remote in a lendable slab, or on
/// donors when those are lendable.
fn is_lent(sh: &Shared, st: &State, lendable: &Lendable, e: Entry) -> Option<LentAt> {
    if e.state != PageState::Remote {
        return None;
    }
    if let Some(m) = in_lendable(sh, st, lendable, e.far) {
        return Some(LentAt::Memory(m));
    }
    // Donor pages are left far only with a hold to learn when the child is gone.
    if !lendable.donors {
        return None;
    }
    match sh.far.home(e.far) {
        Some((Home::Donors(r), _)) if r.readable().next().is_some() => Some(LentAt::Donors),
        // Borrowed from this process's own parent: lent on (the child reads it as that
        // parent's client, as this process does).
        Some((Home::Borrowed(r), _)) if !r.is_empty() => Some(LentAt::Borrowed),
        _ => None,
    }
}

/// Whether a resident page in `e` has a copy in a lendable slab that the child may use instead
/// of the page (if the page still equals it): not while that copy is being rewritten.
fn has_lent_copy(sh: &Shared, st: &State, lendable: &Lendable, e: Entry) -> Option<LentAt> {
    if e.state == PageState::ResidentSending {
        return None;
    }
    in_lendable(sh, st, lendable, e.far).map(LentAt::Memory)
}

/// The lendable memory slab far page `far` lives in, if any.
fn in_lendable(sh: &Shared, st: &State, lendable: &Lendable, far: u64) -> Option<u32> {
    if far == NO_FAR || lendable.memory.is_empty() {
        return None;
    }
    let Some((Home::Memory(m), _)) = sh.far.home(far) else {
        return None;
    };
    let kind = st.mem.get(m)?.kind;
    (lendable.memory.get(&m) == Some(&kind)).then_some(m)
}

/// Freezes the far pages of `pages` (lent) and describes what the child borrows (those left
/// on donors are covered by the fork's hold, mapped in [`hold_donors`]).
fn lend_pages(sh: &Shared, st: &mut State, pages: Vec<(usize, u64, LentAt)>) -> Option<Lent> {
    if pages.is_empty() {
        return None;
    }
    let slab_pages = sh.far.slab_pages;
    // By far slab: the child looks pages up by it (`Lent::source`).
    let mut slabs: BTreeMap<u64, LentSlab> = BTreeMap::new();
    let mut donor_slabs: BTreeMap<u64, Replicas> = BTreeMap::new();
    let mut donor_fars = Vec::new();
    let mut borrowed_slabs = Vec::new();
    if let Some(t) = &sh.far.tier {
        t.frozen();
    }
    for &(_, far, at) in &pages {
        st.far_pages.freeze(far);
        match at {
            LentAt::Memory(m) => {
                if let Some(s) = st.mem.get(m) {
                    slabs.entry(s.far_slab).or_insert(LentSlab {
                        far_slab: s.far_slab,
                        addr: s.mapping.addr(),
                        len: s.mapping.len(),
                    });
                }
            }
            LentAt::Donors => {
                if let Some((Home::Donors(r), _)) = sh.far.home(far) {
                    donor_slabs.entry(far / slab_pages).or_insert(r);
                    donor_fars.push(far);
                }
            }
            LentAt::Borrowed => borrowed_slabs.push(far / slab_pages),
        }
    }
    borrowed_slabs.sort_unstable();
    borrowed_slabs.dedup();
    let mut lenders: Vec<Lender> = sh
        .far
        .lent()
        .map(|l| l.only(&borrowed_slabs))
        .unwrap_or_default();
    if !donor_fars.is_empty() {
        let seals = sh
            .far
            .sealer
            .as_ref()
            .map(|s| s.lend(donor_fars.iter().copied()));
        if let Some(first) = sh.far.donors.first() {
            let addrs = sh
                .far
                .donors
                .iter()
                .map(|d| d.read.addr().to_string())
                .collect();
            let slabs = donor_slabs.into_iter().collect();
            lenders.push(Lender::new(&first.read, addrs, slabs, seals));
        }
    }
    let donors = LentDonors::new(slab_pages, lenders, &sh.far.client_base);
    let lent = Lent {
        slab_pages,
        floor: st.far_pages.end().div_ceil(slab_pages) * slab_pages,
        slabs: slabs.into_values().collect(),
        pages: pages.into_iter().map(|(a, far, _)| (a, far)).collect(),
        donors,
    };
    Some(lent)
}

/// Thaws the far pages lent to forked children once no hold is alive: every child that
/// borrowed them has exited or exec'd. Checked with the state lock held, so a fork taking a
/// hold and freezing pages meanwhile is never thawed by mistake (the donor hold is mapped,
/// and a tier hold pushed, before pages are frozen). Called by the tier thread and the heal
/// thread.
pub(crate) fn thaw_if_no_child(sh: &Shared) {
    let mut st = sh.state.lock();
    if !st.far_pages.any_frozen() {
        return;
    }
    if st.fork_hold.as_ref().is_some_and(|h| !h.is_alive()) {
        // Dead for good (the probe sealed it): the next fork makes a new one.
        st.fork_hold = None;
    }
    let tier_holds = sh.far.tier.as_ref().map_or(0, |t| t.live_holds());
    if tier_holds == 0 && st.fork_hold.is_none() {
        st.far_pages.thaw();
        drop(st);
        tracing::debug!("every forked child that borrowed far pages is gone: thawed");
    }
}

/// In a forked child's runtime: borrows what the parent lent (see [`crate::Runtime::borrow`]).
pub(crate) fn borrow(sh: &Shared, lent: &Lent) -> Result<usize, RuntimeError> {
    let bad = |what: String| {
        Err(RuntimeError::Config(format!(
            "borrowing lent pages: {what}"
        )))
    };
    if lent.slab_pages != sh.far.slab_pages {
        return bad(format!(
            "the parent's slabs are {} pages, this runtime's {}",
            lent.slab_pages, sh.far.slab_pages
        ));
    }
    let mut st = sh.state.lock();
    if st.far_pages.floor() < lent.floor {
        return bad(format!(
            "this runtime's far pages start at {}, below the lent ones' end {}",
            st.far_pages.floor(),
            lent.floor
        ));
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
        return bad(format!("page {a:#x} is at far page {far}, in no lent slab"));
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
            return bad(format!(
                "slab {} at {:#x} (+{} bytes) is not an inherited slab mapping",
                s.far_slab, s.addr, s.len
            ));
        }
    }
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
    drop(st);
    sh.stats.lock().s.pages_borrowed += n as u64;
    Ok(n)
}

/// After `fork()` in the parent: the fork's hold is left to the child, and eviction resumes
/// once no other fork is being prepared.
pub(crate) fn after_fork_parent(sh: &Shared, plan: Option<&ForkPlan>) {
    if let (Some(h), Some(tier)) = (plan.and_then(|p| p.hold), &sh.far.tier) {
        tier.fork_done(h);
    }
    let mut st = sh.state.lock();
    if plan.is_some_and(|p| p.donor_hold) {
        if let Some(h) = st.fork_hold.as_mut() {
            h.end_fork();
        }
    }
    st.forks = st.forks.saturating_sub(1);
    if st.forks == 0 && st.dofork {
        // Lent slabs are inherited only by the fork they were lent to.
        for (m, _) in st.mem.lendable() {
            if let Some(s) = st.mem.get(m) {
                s.mapping.advise(Advice::DontFork);
            }
        }
        st.dofork = false;
    }
    if st.forks == 0 && st.paused {
        st.paused = false;
        drop(st);
        sh.evict_cv.notify_one();
    }
}

/// Checks, with the state lock held right before `fork()`, that every page with contents is
/// resident (the child gets exactly the pages mapped at fork) or lent (left in a lendable
/// slab). Returns a description of the pages that are neither, for the error report — the
/// child would read zeros there — the lent pages (address, far page, memory slab) and how many
/// of them are remote (the rest are resident, with a copy the child may use). Whether
/// the first missing page is present in the page tables (`mincore`) is part of the
/// description; it is not itself checked, since a resident page may be swapped out by the
/// kernel or released by another thread whose REMOVE event is not processed yet, and the
/// child is right either way.
fn check_all_back(
    sh: &Shared,
    st: &mut State,
    lendable: &Lendable,
) -> (Option<String>, Vec<(usize, u64, LentAt)>, usize) {
    let mut bad = 0usize;
    let mut first: Option<(usize, PageState, bool)> = None;
    let mut lent = Vec::new();
    let mut remote = 0;
    for (s, e) in st.pages.ranges() {
        let mut present = vec![0u8; (e - s) / PAGE_SIZE];
        if farmem_mm::mincore(s, &mut present).is_err() {
            continue; // not (entirely) mapped: an UNMAP event is on its way
        }
        for (a, en) in st.pages.entries_in(s, e) {
            if en.state == PageState::Empty || st.dontfork.contains(a) {
                continue;
            }
            if en.state.is_resident() {
                // The child drops its copy if it still equals the far one
                // ([`Lent::discard_unchanged`]).
                if let Some(m) = has_lent_copy(sh, st, lendable, en) {
                    lent.push((a, en.far, m));
                }
                continue;
            }
            if let Some(m) = is_lent(sh, st, lendable, en) {
                lent.push((a, en.far, m));
                remote += 1;
                continue;
            }
            let here = present[(a - s) / PAGE_SIZE] & 1 != 0;
            bad += 1;
            first.get_or_insert((a, en.state, here));
        }
    }
    let what = first.map(|(a, state, here)| {
        format!(
            "{bad} page(s) are not in local memory at fork (first {a:#x}: {state:?}, {}present)",
            if here { "" } else { "not " }
        )
    });
    (what, lent, remote)
}

/// Brings every evicted page of every region back (before fork), but those left for the child
/// in a `lendable` slab: called from a program thread with eviction paused and no eviction
/// half-done.
fn bring_all_back(sh: &Shared, lendable: &Lendable) -> Result<(), RuntimeError> {
    let mut guard = sh.state.lock();
    let st = &mut *guard;
    let mut todo: Vec<usize> = Vec::new();
    for (s, e) in st.pages.ranges() {
        for (a, en) in st.pages.entries_in(s, e) {
            let evicted = matches!(
                en.state,
                PageState::PoolSent
                    | PageState::PoolUnsent
                    | PageState::Remote
                    | PageState::Fetching
            );
            if evicted && !st.dontfork.contains(a) && is_lent(sh, st, lendable, en).is_none() {
                todo.push(a);
            }
        }
    }
    drop(guard);
    let mut first_err: Option<RuntimeError> = None;
    for addr in todo {
        if let Err(e) = bring_back(sh, addr) {
            // Go on with the other pages: one failure must not cost the child the rest (the
            // first error is reported).
            first_err.get_or_insert(e);
        }
    }
    first_err.map_or(Ok(()), Err)
}

/// Brings one page back, acting on its entry as it is now: the sender may have acknowledged
/// a pool page (PoolUnsent → PoolSent) since the list was made.
fn bring_back(sh: &Shared, addr: usize) -> Result<(), RuntimeError> {
    loop {
        let mut st = sh.state.lock();
        let Some(e) = st.pages.get(addr) else {
            return Ok(());
        };
        if e.state == PageState::Fetching {
            // Another thread's fault is being served from the donor right now: the fault
            // thread installs it (or, if the fetch fails, leaves it Remote). Skipping it would
            // fork with the page missing, and the child would read zeros there.
            drop(st);
            std::thread::sleep(Duration::from_micros(200));
            continue;
        }
        let mut copied = false;
        let r = match e.state {
            PageState::PoolSent | PageState::PoolUnsent => {
                match crate::mm::move_from_pool(&sh.uffd, addr, sh.slot_addr(e.slot), false) {
                    // MOVE needs both ranges writable: the program made this page's range
                    // read-only or PROT_NONE (mprotect) since it was evicted. COPY installs
                    // into any registered range.
                    Err(err) if err.errno() == Some(libc::EINVAL) => {
                        copied = true;
                        crate::mm::with_page_bytes(sh.pool.mapping(), e.slot, |data| {
                            sh.uffd.copy(addr, data, false, false)
                        })
                    }
                    r => r.map(|_| ()),
                }
            }
            PageState::Remote => match sh.far.home(e.far) {
                // In the host tier: one copy from its memory slab.
                Some((Home::Memory(m), page)) => st
                    .mem
                    .read(m, page, |src| sh.uffd.copy(addr, src, false, false))
                    .ok_or(RuntimeError::Internal(
                        "a page in the host tier has no memory slab",
                    ))?,
                _ => {
                    drop(st);
                    let data = read_remote(sh, e)?;
                    st = sh.state.lock();
                    if st.pages.get(addr) != Some(e) {
                        continue; // changed meanwhile: look again
                    }
                    sh.uffd.copy(addr, &data, false, false)
                }
            },
            _ => return Ok(()), // resident already, or released
        };
        match r {
            Ok(()) | Err(UffdError::Exists { .. }) => {
                // EEXIST: the region page is there already and the pool page was not moved.
                let left_in_slot = copied || r.is_err();
                if let Some(slot) = st.pages.install_for_fork(addr) {
                    if left_in_slot {
                        st.slots.release_stale(slot);
                    } else {
                        st.slots.release_empty(slot);
                    }
                }
                return Ok(());
            }
            Err(UffdError::Again { .. }) => {
                drop(st);
                std::thread::sleep(Duration::from_micros(200));
            }
            Err(source) => {
                return Err(RuntimeError::Uffd {
                    step: "bringing pages back before fork",
                    source,
                })
            }
        }
    }
}

/// Reads a remote page's data from its donors (failing over between copies).
fn read_remote(sh: &Shared, e: Entry) -> Result<Vec<u8>, RuntimeError> {
    crate::failover::ReplicaRead::start(sh, e.far)
        .finish(sh)
        .map(|(data, _)| data)
        .map_err(|source| RuntimeError::FetchBeforeFork { far: e.far, source })
}
