//! The heal thread (`farmem-heal`): probes suspected donors and declares them dead or alive,
//! drops a dead donor's copies, and makes new copies of slabs that have fewer than
//! `--replicas` (re-replication), rate-limited.
//!
//! # Design
//!
//! - Probing ([`probe`]): a suspected donor is asked for its stats on the write-back
//!   connection (which reconnects and re-attaches to this client if needed). An answer revives
//!   it. A failure is classified ([`crate::far::health::Cause`]) by a fresh TCP connection: refused
//!   or reset is a crash, accepted is a stall, neither is a partition; a donor that answers but
//!   no longer knows this client restarted with an empty store. Detection therefore takes: a
//!   crash, a round trip (its connections are reset at once); a stall or partition, the
//!   request timeout (`request_timeout`, the first unanswered request) plus the probe's.
//! - A dead donor's copies are dropped from every slab that has a complete copy on a live
//!   donor; a slab whose only copies were there keeps them (the donor may come back: a stall or
//!   a partition that ends) and is served by the backup file meanwhile, if there is one.
//!   Dead donors are probed again every few seconds; one that answers is used again, and the
//!   copies dropped from it are freed there, never read (they may be stale). A donor that
//!   restarted lost every copy: it is registered with afresh and used as a new, empty donor
//!   ([`readopt_restarted`]).
//! - Re-replication copies a slab from a complete copy on a live donor (or from the backup
//!   file) to a new donor chosen as for a new slab, in chunks of one batch. The new copy is
//!   added to the slab first, marked filling: the sender writes it like the others, reads skip
//!   it. Each chunk is copied with the copy gate held exclusively and every write to replicas
//!   holds it shared, so no chunk copy can overwrite a newer page. Copies are paced to
//!   `heal_rate_bytes` a second, so the program keeps its bandwidth.
//! - Every 250 ms the donors are asked which slabs they want back, and those are moved
//!   ([`crate::threads::migrate`]).
//! - Memory slabs (the host tier) with a copy on a dead donor lose that copy and have every
//!   page written through again to a new one ([`crate::tier`]).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::copies::slabcopy::copy_slab;
use crate::error::RuntimeError;
use crate::failure_log::FailureLog;
use crate::far::health::Cause;
use crate::shared::Shared;
use crate::slabs::replicas::{Replica, Replicas};
use crate::threads::heal_plan::{plan_slab, DonorState, Healed, Rounds, SlabPlan};
use crate::threads::heal_rounds::{run, HealWorld};

/// The heal thread. Runs until shutdown when donors are used.
pub(crate) fn heal_loop(sh: Arc<Shared>) {
    run(&sh);
}

/// The heal loop's interface, on the runtime.
impl HealWorld for Arc<Shared> {
    fn stopping(&self) -> bool {
        self.shutdown.load(Ordering::Relaxed)
    }

    fn now(&self) -> Instant {
        Instant::now()
    }

    fn donors(&self) -> usize {
        self.far.donors.len()
    }

    /// Sleeps until the next reclaim poll or dead-donor probe is due, unless woken (a donor
    /// suspected or declared dead, a probe done, shutdown) or more slabs wait to be copied: it
    /// used to wake every 100 ms.
    fn wait_for_work(&self, rounds: &Rounds) {
        let far = &self.far;
        let mut woken = far.heal_mu.lock();
        if !*woken && !rounds.more && !self.shutdown.load(Ordering::Relaxed) {
            let wait = rounds.due().saturating_duration_since(Instant::now());
            far.heal_cv
                .wait_for(&mut woken, wait.max(Duration::from_millis(1)));
        }
        *woken = false;
    }

    fn look_at_donors(&self, dead_round: bool) -> Vec<Option<Instant>> {
        let mut deaths = Vec::with_capacity(self.far.donors.len());
        for (d, donor) in self.far.donors.iter().enumerate() {
            let h = &donor.health;
            if h.is_suspect() || (dead_round && h.is_dead()) {
                spawn_probe(self, d);
            }
            deaths.push(h.death().map(|(_, at)| at));
        }
        deaths
    }

    /// Far pages frozen for forked children that read them on donors are reused once those
    /// children are gone; so are copies dropped meanwhile from donors that came back; and
    /// slabs donors want back are moved.
    fn reclaim_round(&self) {
        crate::fork::thaw_if_no_child(self);
        if !self.far.dropped.lock().is_empty() {
            free_stale_copies(self);
        }
        crate::threads::migrate::poll(self);
    }

    fn heal_one(&self) -> Healed {
        heal_one(self)
    }

    /// Says (at most once a second per reason) that re-replication waits for a donor.
    fn no_room(&self, log: &mut FailureLog, why: String) {
        let Some(n) = log.should_log(&why) else {
            return;
        };
        let far = &self.far;
        let (short, _) = far.slab_health();
        let again = if n > 0 {
            format!(" (tried {n} times more since said)")
        } else {
            String::new()
        };
        tracing::warn!(
            "re-replication waits: {short} far slabs are short of copies and no live donor \
             takes a new one ({} of {} donors live): {why}; retrying every second{again}",
            far.live_donors(),
            far.donors.len()
        );
    }

    fn healed_all(&self, took: Duration) {
        let took = took.as_secs_f64();
        tracing::info!(
            "re-replication done: every slab that can be healed has its copies ({took:.1} s \
             after the failure was declared)"
        );
        self.stats.lock().s.last_heal_s = Some(took);
    }
}

/// Probes donor `d` on a thread of its own (one at a time per donor): a probe of a stalled
/// donor waits for the request timeout, and must hold up neither re-replication nor the
/// probes of other donors.
fn spawn_probe(sh: &Arc<Shared>, d: usize) {
    if !sh.far.donors[d].health.start_probe() {
        return;
    }
    let sh2 = sh.clone();
    let spawned = std::thread::Builder::new()
        .name("farmem-probe".into())
        .spawn(move || {
            sh2.thread_started();
            let h = &sh2.far.donors[d].health;
            if h.is_suspect() {
                probe_suspect(&sh2, d);
            } else if h.is_dead() {
                probe_dead(&sh2, d);
            }
            h.end_probe();
            sh2.far.wake_healer();
        });
    if let Err(e) = spawned {
        sh.far.donors[d].health.end_probe();
        tracing::warn!("starting a donor probe thread: {e}");
    }
}

/// Probes suspected donor `d`: revived if it answers, else declared dead and its copies
/// dropped.
fn probe_suspect(sh: &Shared, d: usize) {
    match probe(sh, d) {
        Ok(()) => {
            tracing::info!(
                "donor {} answers again: still in use",
                sh.far.donors[d].read.addr()
            );
            sh.far.donors[d].health.revive();
        }
        Err(cause) => declare_dead(sh, d, cause),
    }
}

/// Probes dead donor `d`: if it answers (a stall or partition ended) it is used again and the
/// copies dropped from it are freed there.
fn probe_dead(sh: &Shared, d: usize) {
    let donor = &sh.far.donors[d];
    if donor
        .health
        .death()
        .is_some_and(|(c, _)| c == Cause::Restarted)
    {
        return readopt_restarted(sh, d);
    }
    match probe(sh, d) {
        Ok(()) => {}
        // Taken for dead while it restarted (e.g. probed before its new process answered):
        // now it is known, and what it still had copies of is gone.
        Err(Cause::Restarted) => {
            declare_dead(sh, d, Cause::Restarted);
            return;
        }
        // Still dead; what the probe says now is the better account (a process killed while
        // it still held its sockets looked stalled until it had exited).
        Err(cause) => {
            donor.health.declare_dead(cause);
            return;
        }
    }
    if !sh.far.take_in(d) {
        return; // its slabs cannot hold this runtime's far slabs
    }
    donor.health.revive();
    let stale = free_stale_copies(sh);
    tracing::warn!(
        "donor {} is back: used again for new copies ({stale} stale slabs freed there, none \
         read)",
        donor.write.addr()
    );
    sh.far.wake_healer();
}

/// Uses restarted donor `d` again, as a new and empty donor, once nothing of this runtime
/// names a slab it had there: its copies were all dropped when it was declared restarted
/// (and so republished for forked children), the copies waiting to be freed there are
/// forgotten (freeing one would free a new slab), and every read that overlaps this, this
/// runtime's or a forked child's, is thrown away (the restart epoch, `Far::read_epoch`,
/// bumped before this process registers there again: a read may have looked up an old slab
/// id just before), as is no write (the copy gate, held meanwhile). While a child may
/// still read fork-time copies (a fork lent some without the table), not at all. Without
/// this, every restart of a donor took it from a running program for good, and three
/// restarts left a program with none (found by `farmem-bench soak`).
fn readopt_restarted(sh: &Shared, d: usize) {
    let far = &sh.far;
    let frozen = sh.state.lock().far_pages.any_frozen();
    if (frozen && !far.children_follow_restarts())
        || far.donor_slabs().iter().any(|(_, r)| r.has(d))
    {
        return; // tried again at the next probe of dead donors
    }
    let donor = &far.donors[d];
    {
        // Exclusively: a sender that looked up a copy on `d` before its copies were dropped
        // has finished writing to it (it may not write an old slab id there once new ones
        // exist); reads in flight are thrown away by the epoch.
        let _gate = far.copy_gate.write();
        far.dropped.lock().retain(|x| x.donor != d);
        donor.pack.lock().forget_all();
        *donor.slabs_placed.lock() = 0;
        far.bump_restart_epoch();
        donor.read.register_again();
        donor.write.register_again();
    }
    if probe(sh, d).is_err() {
        return; // not answering yet: still dead, registered at its next answer
    }
    donor.health.revive();
    tracing::warn!(
        "donor {} restarted: used again as a new, empty donor",
        donor.write.addr()
    );
    far.wake_healer();
}

/// Frees the copies dropped from donors that are live again (they may be stale: never read),
/// unless far pages are frozen for a forked child, which may still read such a copy (it knows
/// the copies a slab had at its fork): then after the thaw. Returns how many were freed.
fn free_stale_copies(sh: &Shared) -> usize {
    if sh.state.lock().far_pages.any_frozen() {
        return 0;
    }
    let stale: Vec<Replica> = {
        let mut dropped = sh.far.dropped.lock();
        let (live, rest): (Vec<_>, Vec<_>) = dropped
            .drain(..)
            .partition(|x| sh.far.donors[x.donor].health.is_live());
        *dropped = rest;
        live
    };
    for &x in &stale {
        sh.far.release(x);
    }
    stale.len()
}

/// Asks donor `d` for its stats; on failure says why it failed.
fn probe(sh: &Shared, d: usize) -> Result<(), Cause> {
    let donor = &sh.far.donors[d];
    let err = match donor.write.stats() {
        Ok(_) => return Ok(()),
        Err(e) => e,
    };
    if err.is_forgotten() {
        return Err(Cause::Restarted);
    }
    Err(Cause::of(donor.write.addr()))
}

/// Declares donor `d` dead: drops its copies where a live complete copy exists, and takes
/// its copies from memory slabs (written through again elsewhere).
fn declare_dead(sh: &Shared, d: usize, cause: Cause) {
    let far = &sh.far;
    far.donors[d].health.declare_dead(cause);
    // If it comes back restarted, the slab ids held there mean nothing (or another client's):
    // no new far slab goes into them.
    far.donors[d].pack.lock().close_all();
    let mut dropped = 0;
    {
        let _gate = far.copy_gate.write();
        for (idx, r) in far.donor_slabs() {
            // A restarted donor's copies are gone for sure, sole copies too.
            if r.has(d) && (cause == Cause::Restarted || has_live_copy(sh, &r, Some(d))) {
                far.drop_replica(idx, d);
                dropped += 1;
            }
        }
        let mut st = sh.state.lock();
        for m in st.mem.oldest_first() {
            if let Some(s) = st.mem.get_mut(m) {
                if let Some(x) = s.donors.remove(d) {
                    far.dropped.lock().push(x);
                    s.mark_all_unflushed();
                }
            }
        }
    }
    tracing::error!(
        "donor {} declared dead: {cause}; {dropped} slab copies dropped, re-replicating",
        far.donors[d].read.addr()
    );
}

/// Whether `r` has a complete copy on a live donor other than `besides`.
fn has_live_copy(sh: &Shared, r: &Replicas, besides: Option<usize>) -> bool {
    r.readable()
        .any(|x| Some(x.donor) != besides && sh.far.donors[x.donor].health.is_live())
}

/// A donor's health, for [`plan_slab`].
fn donor_state(sh: &Shared, d: usize) -> DonorState {
    let h = &sh.far.donors[d].health;
    if h.is_suspect() {
        DonorState::Suspect
    } else if h.is_dead() {
        DonorState::Dead
    } else {
        DonorState::Live
    }
}

/// Finds one slab with fewer complete live copies than wanted and copies it to a new donor
/// ([`plan_slab`] decides).
fn heal_one(sh: &Shared) -> Healed {
    let far = &sh.far;
    let mut no_room = false;
    let mut why = None;
    for (idx, r) in far.donor_slabs() {
        let plan = plan_slab(
            &r,
            |d| donor_state(sh, d),
            far.replicas,
            far.live_donors(),
            far.backup.is_some(),
        );
        match plan {
            SlabPlan::Wait | SlabPlan::Lost => {}
            SlabPlan::Enough { forget } => {
                for d in forget {
                    far.drop_replica(idx, d);
                }
            }
            SlabPlan::NoRoom => no_room = true,
            SlabPlan::Copy(source) => match copy_slab(sh, idx, r, source) {
                Ok(()) => return Healed::One,
                // A copy it used was dropped meanwhile (its donor failing): planned again from
                // what is left at the next retry, as after any failed copy, but not said as
                // "no room". Not at once: the failing donor is to be probed first.
                Err(RuntimeError::CopyGone { .. }) => return Healed::NoRoom { why: None },
                Err(e) => {
                    // Every other slab short of copies would meet the same refusal: one try
                    // a round, not one per slab.
                    why = Some(e.lasting_cause());
                    no_room = true;
                    break;
                }
            },
        }
    }
    if no_room {
        Healed::NoRoom { why }
    } else {
        Healed::Nothing
    }
}
