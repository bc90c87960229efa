//! Fork handling: the runtime does not enable UFFD_FEATURE_EVENT_FORK, so a child's copy of a
//! region is unregistered plain memory. Before fork, eviction is paused until the parent
//! resumes after fork, and evicted pages are brought back so the child gets their data as
//! ordinary memory — except, for a child that starts a runtime of its own (a process tree),
//! pages in the host tier, which the child *borrows*. Pages of ranges marked `MADV_DONTFORK`
//! (V8's heap) or `MADV_WIPEONFORK` ([`crate::forkmarks`]) stay where they are and are never
//! lent: the child has no mapping there, or zeros.
//!
//! # Lending host-tier pages
//!
//! - The parent takes a node *hold* over its tier slabs (the node punches none of them while
//!   a process maps the hold's memfd, even after FREE or the parent's death) and marks those
//!   slabs `MADV_DOFORK` for this fork only, so the child inherits their mappings.
//! - Remote pages whose far page is in a held slab stay there; so do resident pages with a
//!   copy there, which the child drops before registering if they still equal it
//!   ([`Lent::discard_unchanged`]): it would otherwise count, and copy out to evict, pages it
//!   shares with the parent. Those far pages are *frozen* in the parent ([`crate::slabs::farpages`]):
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
//!   pages with the parent's key and the seals they had at the fork ([`crate::slabs::seal`]). The
//!   donor keeps the parent's slabs while any connection of that client is open, so a child
//!   outlives a parent that exits or is killed. The parent moves no slab a child reads
//!   ([`crate::threads::migrate`] waits for the thaw) and frees no copy it dropped meanwhile
//!   ([`crate::threads::heal`]: the child may still read it).
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
//!   ([`crate::threads::cow`]), so the page stays in memory only while the other side still maps it.
//!   The parent's resident pages without an equal far copy stay shared with the child, which
//!   counts them too: the tree's runtimes count such a page twice, so they hold *less* than
//!   the budget, never more.
//! - A page another thread of the parent releases in the instant of the fork may be borrowed
//!   by the child with its old contents (what it read before the release).
//! - While any child that borrowed pages lives, the parent's rewritten far pages are not
//!   reused: its host-tier (or donor) use grows by up to the pages lent.
//! - A child follows the parent's heals of lent slabs through the parent's table of lent
//!   copies ([`crate::lentcopies`]) while the parent lives; once it has exited, the copies
//!   the table named last: if they all die, its reads of those pages fail (SIGBUS).

use std::collections::BTreeMap;
use std::os::fd::RawFd;
use std::time::Duration;

use farmem_mm::Advice;

use crate::failure::ThreadError;
use crate::far::Home;
use crate::forkhold::ForkHold;
use crate::lentdonors::{Lender, LentDonors};
use crate::shared::{Shared, State};
use crate::slabs::memslabs::MemKind;
use crate::slabs::replicas::Replicas;

mod back;
mod lent;
mod plan;

use back::{bring_all_back, check_all_back};
pub(crate) use lent::borrow;
pub use lent::Lent;
use lent::LentSlab;
use plan::{Lendable, LentAt};

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
            sh.report(ThreadError::BringBackBeforeFork(e));
        }
        let mut st = sh.state.lock();
        let (missing, pages, remote) = check_all_back(sh, &mut st, &lendable);
        if missing.is_some() && attempt < 2 && !lendable.is_empty() {
            continue;
        }
        if let Some(not_back) = missing {
            sh.report(not_back);
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
            let slabs: Vec<(u64, Replicas)> = donor_slabs.into_iter().collect();
            let copies = sh.far.publish_lent(&slabs);
            lenders.push(Lender::new(&first.read, addrs, slabs, seals, copies));
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
        sh.far.lent_thawed();
        drop(st);
        tracing::debug!("every forked child that borrowed far pages is gone: thawed");
    }
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
