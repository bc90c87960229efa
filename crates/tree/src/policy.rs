//! Who in the process tree gets how many local pages: [`Budget`]. Pure: no I/O, no threads, no
//! clocks; the coordinator calls it under one lock.
//!
//! # Design
//! Each process has a **grant** (the local pages it may use) and reports its **used** pages and
//! cumulative fetched and evicted counts. A process **commits** `max(grant, used)` pages (a
//! process whose grant was just lowered still holds its pages until it has evicted them);
//! **free** pages are `total − Σ committed`. So memory taken from one process reaches another
//! only once the first has given it back: the tree never plans on pages it does not have.
//!
//! - **demand**: the fetched pages since the previous report; a process's recent demand is the
//!   sum over its last [`HISTORY`] reports.
//! - **pressure**: it evicted since the previous report, or its used pages are within the
//!   headroom (`max(grant/32, 16)`) of its grant.
//! - [`Budget::join`]: all free pages if there are at least `min_pages`; else unused grant is
//!   taken from the others (never below `used + slack` nor their min); still short, the
//!   newcomer gets its min anyway, the others' grants are lowered to make room (they evict),
//!   and the pages granted before they were free are counted in
//!   [`Budget::overcommitted_pages`].
//! - [`Budget::rebalance`], in order: (1) a process with no demand in its last [`HISTORY`]
//!   reports is trimmed to `max(min, used + slack)`; (2) processes under pressure with recent
//!   demand, highest first, get one [`Budget::step_pages`] of free pages each; (3) if the
//!   highest-demand wanter got nothing, one process with lower demand gives up one step (not
//!   below its min) — never two at once, never one with more demand (no thrash), and never
//!   while some process still holds more than its grant (an earlier give-back in progress).
//! - A process alone in the tree is never trimmed (there is nobody to give its pages to), so
//!   a single-process program keeps the whole budget, as without a tree.
//!
//! # Limitations
//! Demand is counted in pages fetched from far memory: a process filling fresh memory (first
//! touches) is not seen as wanting more until it starts fetching back what it evicted. The
//! pages of a process that left stay free until a process under pressure with demand, or a
//! new one, takes them. A process that keeps more pages than its grant (ignores it) holds up
//! rule 3 for the whole tree. Each rebalance is O(n²) at worst in the processes present, run after
//! every report: meant for trees of up to a few hundred processes.
use std::collections::{BTreeMap, VecDeque};

use serde::{Deserialize, Serialize};

use crate::wire::Report;

/// Reports a process's recent demand is summed over (and how many idle ones trim it).
pub const HISTORY: usize = 4;
/// Departed processes remembered for the summary; beyond it the smallest peaks are forgotten.
pub const MAX_DEPARTED: usize = 1024;
/// The least slack (pages) a trimmed process keeps above its used pages.
pub const MIN_SLACK_PAGES: u64 = 256;
/// The least step (pages) grants move by.
pub const MIN_STEP_PAGES: u64 = 256;
/// The least headroom (pages) below its grant at which a process is under pressure.
pub const MIN_HEADROOM_PAGES: u64 = 16;

/// One process's share of the tree's budget, as the summary shows it.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ProcessShare {
    /// The process id: the kernel's, or the one its Hello gave under `Admission::Anyone`.
    pub pid: u32,
    /// Its grant now (0 once it has left).
    pub grant_pages: u64,
    /// Its used pages at its last report (0 once it has left).
    pub used_pages: u64,
    /// The most pages it reported in use.
    pub peak_used_pages: u64,
    /// Pages it fetched from far memory (its last cumulative count).
    pub fetched_pages: u64,
    /// Whether it is still connected.
    pub running: bool,
}

#[derive(Debug, Clone)]
struct Process {
    pid: u32,
    min_pages: u64,
    grant: u64,
    /// The grant last returned by `rebalance` (or by `join`).
    sent: u64,
    used: u64,
    peak_used: u64,
    fetched: u64,
    evicted: u64,
    demand: VecDeque<u64>,
    pressure: bool,
}

impl Process {
    fn committed(&self) -> u64 {
        self.grant.max(self.used)
    }

    fn recent_demand(&self) -> u64 {
        self.demand.iter().fold(0u64, |a, &d| a.saturating_add(d))
    }

    fn share(&self) -> ProcessShare {
        ProcessShare {
            pid: self.pid,
            grant_pages: self.grant,
            used_pages: self.used,
            peak_used_pages: self.peak_used,
            fetched_pages: self.fetched,
            running: true,
        }
    }
}

/// The tree's local-memory budget and every process's share of it.
#[derive(Debug, Clone)]
pub struct Budget {
    total_pages: u64,
    /// Keyed by connection id; ordered so every decision is deterministic.
    processes: BTreeMap<u64, Process>,
    departed: Vec<ProcessShare>,
    overcommitted_pages: u64,
    peak_total_used_pages: u64,
    processes_seen: u64,
}

impl Budget {
    /// A budget of `total_pages` local pages for the whole tree, no process yet.
    pub fn new(total_pages: u64) -> Budget {
        Budget {
            total_pages,
            processes: BTreeMap::new(),
            departed: Vec::new(),
            overcommitted_pages: 0,
            peak_total_used_pages: 0,
            processes_seen: 0,
        }
    }

    /// The tree's budget in pages.
    pub fn total_pages(&self) -> u64 {
        self.total_pages
    }

    /// Pages a trimmed process keeps above its used ones: `max(256, total/64)`.
    pub fn slack_pages(&self) -> u64 {
        MIN_SLACK_PAGES.max(self.total_pages / 64)
    }

    /// Pages a grant moves by in one rebalance: `max(total/16, 256)`.
    pub fn step_pages(&self) -> u64 {
        MIN_STEP_PAGES.max(self.total_pages / 16)
    }

    /// Pages no process commits now (`total − Σ max(grant, used)`, 0 if over-committed).
    pub fn free_pages(&self) -> u64 {
        let committed = self
            .processes
            .values()
            .fold(0u64, |a, p| a.saturating_add(p.committed()));
        self.total_pages.saturating_sub(committed)
    }

    /// Σ grants of the processes present.
    pub fn granted_pages(&self) -> u64 {
        self.processes
            .values()
            .fold(0u64, |a, p| a.saturating_add(p.grant))
    }

    /// The grant of connection `id`, if it is present.
    pub fn grant(&self, id: u64) -> Option<u64> {
        self.processes.get(&id).map(|p| p.grant)
    }

    /// Processes present.
    pub fn len(&self) -> usize {
        self.processes.len()
    }

    /// Whether no process is present.
    pub fn is_empty(&self) -> bool {
        self.processes.is_empty()
    }

    /// A process joins as connection `id`; returns its initial grant.
    ///
    /// All free pages if at least `min_pages` are free (so the first process gets everything).
    /// Else unused grant is taken from the others (each lowered toward `used + slack`, never
    /// below its min); if that is still short, the process gets `min_pages` anyway, the others'
    /// grants are lowered (largest above its min first, never below its min) so that the
    /// grants again fit the total, and the pages granted beyond the free ones are added to
    /// [`overcommitted_pages`](Self::overcommitted_pages). The others' lowered grants come out
    /// of the next [`rebalance`](Self::rebalance). An `id` already present is replaced.
    pub fn join(&mut self, id: u64, pid: u32, min_pages: u64) -> u64 {
        self.leave(id);
        self.processes_seen += 1;
        let mut free = self.free_pages();
        if free < min_pages {
            free += self.take_unused(min_pages - free);
        }
        let grant = if free >= min_pages {
            free
        } else {
            self.overcommitted_pages = self.overcommitted_pages.saturating_add(min_pages - free);
            let excess = self
                .granted_pages()
                .saturating_add(min_pages)
                .saturating_sub(self.total_pages);
            self.lower_grants(excess);
            min_pages
        };
        self.processes.insert(
            id,
            Process {
                pid,
                min_pages,
                grant,
                sent: grant,
                used: 0,
                peak_used: 0,
                fetched: 0,
                evicted: 0,
                demand: VecDeque::with_capacity(HISTORY),
                pressure: false,
            },
        );
        grant
    }

    /// Lowers others' grants toward `used + slack` (not below their min) until `wanted` pages
    /// are freed or none is left unused; returns the pages freed.
    fn take_unused(&mut self, wanted: u64) -> u64 {
        let slack = self.slack_pages();
        let floor = |p: &Process| p.min_pages.max(p.used.saturating_add(slack));
        let mut order: Vec<(u64, u64)> = self
            .processes
            .iter()
            .filter(|(_, p)| p.grant > floor(p))
            .map(|(&id, p)| (p.grant - floor(p), id))
            .collect();
        order.sort_by(|a, b| b.cmp(a));
        let mut freed = 0;
        for (unused, id) in order {
            if freed >= wanted {
                break;
            }
            let take = unused.min(wanted - freed);
            if let Some(p) = self.processes.get_mut(&id) {
                p.grant -= take;
            }
            freed += take;
        }
        freed
    }

    /// Lowers grants by `pages` in all, largest above its min first, none below its min.
    fn lower_grants(&mut self, mut pages: u64) {
        while pages > 0 {
            let Some(p) = self
                .processes
                .values_mut()
                .filter(|p| p.grant > p.min_pages)
                .max_by_key(|p| p.grant - p.min_pages)
            else {
                return;
            };
            let take = (p.grant - p.min_pages).min(pages);
            p.grant -= take;
            pages -= take;
        }
    }

    /// Records a report from connection `id` (ignored if `id` is not present).
    pub fn report(&mut self, id: u64, r: Report) {
        let Some(p) = self.processes.get_mut(&id) else {
            return;
        };
        // A count that went backwards (a runtime that restarted its counters) is a new
        // baseline, not demand.
        let demand = r.fetched_pages.saturating_sub(p.fetched);
        let evicted = r.evicted_pages.saturating_sub(p.evicted);
        p.fetched = r.fetched_pages;
        p.evicted = r.evicted_pages;
        if p.demand.len() == HISTORY {
            p.demand.pop_front();
        }
        p.demand.push_back(demand);
        p.used = r.used_pages;
        p.peak_used = p.peak_used.max(r.used_pages);
        let headroom = MIN_HEADROOM_PAGES.max(p.grant / 32);
        p.pressure = evicted > 0 || r.used_pages >= p.grant.saturating_sub(headroom);
        let total_used = self
            .processes
            .values()
            .fold(0u64, |a, p| a.saturating_add(p.used));
        self.peak_total_used_pages = self.peak_total_used_pages.max(total_used);
    }

    /// Connection `id` is gone: its grant returns to the free pages at once. Returns whether
    /// it was present.
    pub fn leave(&mut self, id: u64) -> bool {
        let Some(p) = self.processes.remove(&id) else {
            return false;
        };
        if self.departed.len() == MAX_DEPARTED {
            if let Some(smallest) =
                (0..self.departed.len()).min_by_key(|&i| self.departed[i].peak_used_pages)
            {
                self.departed.swap_remove(smallest);
            }
        }
        self.departed.push(ProcessShare {
            grant_pages: 0,
            used_pages: 0,
            running: false,
            ..p.share()
        });
        true
    }

    /// Moves budget toward the processes that fault (the rules in the module docs); returns
    /// the grants that changed since they were last returned (by `join` or `rebalance`).
    pub fn rebalance(&mut self) -> Vec<(u64, u64)> {
        if self.processes.len() > 1 {
            self.trim_idle();
        }
        if let Some(starved) = self.give_free() {
            self.take_for(starved);
        }
        let mut changed = Vec::new();
        for (&id, p) in self.processes.iter_mut() {
            if p.grant != p.sent {
                p.sent = p.grant;
                changed.push((id, p.grant));
            }
        }
        changed
    }

    /// Rule 1: a process with no demand in its last reports gives back what it does not use.
    fn trim_idle(&mut self) {
        let slack = self.slack_pages();
        for p in self.processes.values_mut() {
            let target = p.min_pages.max(p.used.saturating_add(slack));
            if p.demand.len() == HISTORY && p.recent_demand() == 0 && p.grant > target {
                p.grant = target;
            }
        }
    }

    /// Rule 2: free pages to the processes under pressure with demand, highest demand first,
    /// one step each. Returns the highest-demand wanter if it got nothing.
    fn give_free(&mut self) -> Option<u64> {
        let mut wanters: Vec<(u64, u64)> = self
            .processes
            .iter()
            .filter(|(_, p)| p.pressure && p.recent_demand() > 0)
            .map(|(&id, p)| (p.recent_demand(), id))
            .collect();
        wanters.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
        let step = self.step_pages();
        let mut starved = None;
        for (i, &(_, id)) in wanters.iter().enumerate() {
            let give = step.min(self.free_pages());
            if give == 0 {
                if i == 0 {
                    starved = Some(id);
                }
                break;
            }
            if let Some(p) = self.processes.get_mut(&id) {
                p.grant = p.grant.saturating_add(give);
                // Given its step: it asks again with its next report.
                p.pressure = false;
            }
        }
        starved
    }

    /// Rule 3: one step from the process with the lowest demand below the wanter's.
    fn take_for(&mut self, wanter: u64) {
        if self.processes.values().any(|p| p.used > p.grant) {
            return;
        }
        let Some(wanted) = self.processes.get(&wanter).map(Process::recent_demand) else {
            return;
        };
        let step = self.step_pages();
        let victim = self
            .processes
            .iter_mut()
            .filter(|(&id, p)| id != wanter && p.grant > p.min_pages && p.recent_demand() < wanted)
            .min_by_key(|(_, p)| (p.recent_demand(), std::cmp::Reverse(p.grant - p.min_pages)));
        if let Some((_, p)) = victim {
            p.grant = p.min_pages.max(p.grant.saturating_sub(step));
        }
    }

    /// Every process present, then the departed ones (with their peaks).
    pub fn snapshot(&self) -> Vec<ProcessShare> {
        self.processes
            .values()
            .map(Process::share)
            .chain(self.departed.iter().copied())
            .collect()
    }

    /// The most pages the tree had in use at once (Σ used over the processes, at reports).
    pub fn peak_total_used_pages(&self) -> u64 {
        self.peak_total_used_pages
    }

    /// Pages granted at joins beyond the free ones (a process got its min before the others
    /// had given the pages back, or the mins do not fit the total), summed over all joins.
    pub fn overcommitted_pages(&self) -> u64 {
        self.overcommitted_pages
    }

    /// Processes that ever joined.
    pub fn processes_seen(&self) -> u64 {
        self.processes_seen
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TOTAL: u64 = 65_536; // 256 MiB

    fn report(used: u64, fetched: u64, evicted: u64) -> Report {
        Report {
            used_pages: used,
            fetched_pages: fetched,
            evicted_pages: evicted,
        }
    }

    /// Asserts the invariants that hold after every call.
    fn check(b: &Budget) {
        let mins: u64 = b.processes.values().map(|p| p.min_pages).sum();
        if mins <= b.total_pages {
            assert!(
                b.granted_pages() <= b.total_pages,
                "grants {} over total {} (mins {mins})",
                b.granted_pages(),
                b.total_pages
            );
        }
        for p in b.processes.values() {
            assert!(
                p.grant >= p.min_pages,
                "grant {} below min {}",
                p.grant,
                p.min_pages
            );
        }
    }

    #[test]
    fn a_single_process_gets_everything_and_keeps_it() {
        let mut b = Budget::new(TOTAL);
        assert_eq!(b.join(1, 100, 1024), TOTAL);
        for i in 0..10 {
            b.report(1, report(10, 0, 0));
            assert!(b.rebalance().is_empty(), "round {i}");
            assert_eq!(b.grant(1), Some(TOTAL));
        }
        assert_eq!(b.overcommitted_pages(), 0);
        assert_eq!(b.processes_seen(), 1);
    }

    #[test]
    fn a_process_left_alone_is_not_trimmed_and_grows_when_it_faults() {
        let mut b = Budget::new(TOTAL);
        b.join(1, 100, 1024);
        b.join(2, 101, 1024);
        b.leave(1);
        for _ in 0..HISTORY {
            b.report(2, report(10, 0, 0));
        }
        assert!(b.rebalance().is_empty());
        b.report(2, report(1024, 10, 5));
        assert_eq!(b.rebalance(), vec![(2, 1024 + b.step_pages())]);
    }

    #[test]
    fn a_join_takes_unused_grant_first() {
        let mut b = Budget::new(TOTAL);
        b.join(1, 100, 1024);
        b.report(1, report(5000, 0, 0));
        let g = b.join(2, 101, 2048);
        assert_eq!(g, 2048);
        assert_eq!(b.grant(1), Some(TOTAL - 2048));
        assert_eq!(b.overcommitted_pages(), 0);
        assert_eq!(b.rebalance(), vec![(1, TOTAL - 2048)]);
        check(&b);
    }

    #[test]
    fn a_join_into_a_full_tree_gets_its_min_and_is_counted_as_overcommitted() {
        let mut b = Budget::new(TOTAL);
        b.join(1, 100, 1024);
        b.report(1, report(TOTAL, 0, 0));
        assert_eq!(b.join(2, 101, 2048), 2048);
        assert_eq!(b.overcommitted_pages(), 2048);
        // The first one must make room: grants fit the total again.
        assert_eq!(b.grant(1), Some(TOTAL - 2048));
        assert_eq!(b.free_pages(), 0);
        check(&b);
        // Unused grant within the slack is not taken: over-commit instead.
        let mut b = Budget::new(TOTAL);
        b.join(1, 100, 1024);
        b.report(1, report(TOTAL - 100, 0, 0));
        assert_eq!(b.join(2, 101, 300), 300);
        assert_eq!(b.overcommitted_pages(), 300);
        check(&b);
    }

    #[test]
    fn a_join_never_lowers_another_below_its_min() {
        let mut b = Budget::new(4096);
        b.join(1, 100, 3000);
        b.report(1, report(4096, 0, 0));
        assert_eq!(b.join(2, 101, 2000), 2000);
        assert_eq!(b.grant(1), Some(3000));
        assert_eq!(b.overcommitted_pages(), 2000);
    }

    #[test]
    fn a_process_that_leaves_frees_its_grant_for_the_next_join() {
        let mut b = Budget::new(TOTAL);
        b.join(1, 100, 1024);
        b.report(1, report(40_000, 0, 0));
        b.join(2, 101, 1024);
        b.report(2, report(1024, 0, 0));
        let before = b.grant(1).unwrap() + b.grant(2).unwrap();
        assert!(b.leave(1));
        assert!(!b.leave(1));
        let g = b.join(3, 102, 1024);
        assert_eq!(g, TOTAL - 1024);
        assert!(before <= TOTAL);
        assert_eq!(b.overcommitted_pages(), 0);
        check(&b);
    }

    #[test]
    fn an_idle_process_is_trimmed_after_four_reports_without_demand() {
        let mut b = Budget::new(TOTAL);
        b.join(1, 100, 1024);
        b.join(2, 101, 1024);
        b.report(2, report(100, 0, 0));
        // Process 1 holds everything but 1024 and uses 1000 of it.
        for i in 0..3 {
            b.report(1, report(1000, 0, 0));
            b.rebalance();
            assert_eq!(b.grant(1), Some(TOTAL - 1024), "report {i}");
        }
        b.report(1, report(1000, 0, 0));
        let changed = b.rebalance();
        assert!(
            changed.contains(&(1, 1000 + b.slack_pages())),
            "{changed:?}"
        );
        check(&b);
    }

    #[test]
    fn trimming_keeps_the_min() {
        let mut b = Budget::new(TOTAL);
        b.join(1, 100, 10_000);
        b.join(2, 101, 1024);
        for _ in 0..HISTORY {
            b.report(1, report(10, 0, 0));
        }
        b.rebalance();
        assert_eq!(b.grant(1), Some(10_000));
    }

    #[test]
    fn a_faulting_process_under_pressure_gets_free_pages_in_steps() {
        let mut b = Budget::new(TOTAL);
        b.join(1, 100, 1024);
        b.join(2, 101, 1024);
        // Process 1 went idle and is trimmed; process 2 faults at its grant.
        for _ in 0..HISTORY {
            b.report(1, report(1000, 0, 0));
        }
        b.report(2, report(1024, 50, 0));
        let changed = b.rebalance();
        let step = b.step_pages();
        assert!(changed.contains(&(2, 1024 + step)), "{changed:?}");
        // No second step before its next report.
        assert!(b.rebalance().is_empty());
        b.report(2, report(1024 + step, 100, 10));
        assert_eq!(b.rebalance(), vec![(2, 1024 + 2 * step)]);
        check(&b);
    }

    /// Sets a grant directly (as if an earlier rebalance had returned it).
    fn force_grant(b: &mut Budget, id: u64, grant: u64) {
        let p = b.processes.get_mut(&id).unwrap();
        p.grant = grant;
        p.sent = grant;
    }

    #[test]
    fn no_pressure_or_no_demand_gets_nothing() {
        let mut b = Budget::new(TOTAL);
        b.join(1, 100, 1024);
        b.join(2, 101, 1024);
        for _ in 0..HISTORY {
            b.report(1, report(100, 0, 0));
        }
        b.rebalance();
        assert!(b.free_pages() > 0);
        // At its grant, but no demand.
        b.report(2, report(1024, 0, 0));
        assert!(b.rebalance().is_empty());
        // Demand, but far below its grant: no pressure.
        b.report(2, report(10, 500, 0));
        assert!(b.rebalance().is_empty());
    }

    #[test]
    fn the_highest_demand_is_served_first() {
        let mut b = Budget::new(TOTAL);
        b.join(1, 100, 1024);
        b.join(2, 101, 1024);
        b.join(3, 102, 1024);
        force_grant(&mut b, 1, TOTAL - 2048);
        // 1 is idle and trimmed to used + slack, which leaves 300 pages free.
        let used1 = TOTAL - 2048 - b.slack_pages() - 300;
        for _ in 0..HISTORY {
            b.report(1, report(used1, 0, 0));
        }
        b.report(2, report(1024, 10, 0));
        b.report(3, report(1024, 90, 0));
        b.rebalance();
        assert_eq!(b.free_pages(), 0);
        assert_eq!(b.grant(3), Some(1024 + 300));
        assert_eq!(b.grant(2), Some(1024));
        check(&b);
    }

    #[test]
    fn a_starved_wanter_takes_one_step_from_the_lowest_demand_only() {
        let mut b = Budget::new(TOTAL);
        for id in 1..=3 {
            b.join(id, id as u32, 1024);
        }
        force_grant(&mut b, 1, 30_000);
        force_grant(&mut b, 2, 30_000);
        force_grant(&mut b, 3, TOTAL - 60_000);
        b.report(1, report(30_000, 5, 0));
        b.report(2, report(30_000, 1, 0));
        b.report(3, report(TOTAL - 60_000, 1000, 50));
        assert_eq!(b.free_pages(), 0);
        let step = b.step_pages();
        // 2 has the least demand: it gives one step; 1 keeps its grant; 3 waits for the pages.
        assert_eq!(b.rebalance(), vec![(2, 30_000 - step)]);
        // Until 2 has evicted, nobody else is lowered.
        b.report(3, report(TOTAL - 60_000, 2000, 100));
        assert!(b.rebalance().is_empty());
        b.report(1, report(30_000, 5, 0));
        assert!(b.rebalance().is_empty());
        // 2 evicted: 3 gets the step.
        b.report(2, report(30_000 - step, 1, 0));
        assert_eq!(b.rebalance(), vec![(3, TOTAL - 60_000 + step)]);
        check(&b);
    }

    #[test]
    fn a_process_with_more_demand_is_never_taken_from() {
        let mut b = Budget::new(TOTAL);
        b.join(1, 100, 1024);
        b.report(1, report(TOTAL, 0, 0));
        b.join(2, 101, 1024);
        b.report(1, report(TOTAL - 1024, 1000, 10));
        b.report(2, report(1024, 10, 10));
        let g = (b.grant(1), b.grant(2));
        for _ in 0..20 {
            b.report(1, report(TOTAL - 1024, 1000, 10));
            b.report(2, report(1024, 10, 10));
            b.rebalance();
        }
        assert_eq!((b.grant(1), b.grant(2)), g);
    }

    /// Simulates the runtimes: used follows the grant (down at once by evicting; up as far as
    /// the process faults).
    fn simulate_round(b: &mut Budget, procs: &mut [(u64, u64, u64, u64, bool)]) {
        for (id, used, fetched, evicted, faulting) in procs.iter_mut() {
            let grant = b.grant(*id).unwrap();
            if *used > grant {
                *evicted += *used - grant;
                *used = grant;
            } else if *faulting {
                *used = grant;
                *evicted += 64;
            }
            if *faulting {
                *fetched += 500;
            }
            b.report(*id, report(*used, *fetched, *evicted));
            b.rebalance();
            check(b);
        }
    }

    #[test]
    fn two_processes_converge_to_the_one_that_faults() {
        for first_faults in [false, true] {
            let mut b = Budget::new(TOTAL);
            b.join(1, 100, 1024);
            b.join(2, 101, 2048);
            // (id, used, fetched, evicted, faulting): both filled their grants, then only one
            // keeps faulting.
            let mut procs = [
                (1, b.grant(1).unwrap(), 0, 0, first_faults),
                (2, b.grant(2).unwrap(), 0, 0, !first_faults),
            ];
            let (faulter, idle_min) = if first_faults { (1, 2048) } else { (2, 1024) };
            let mut rounds = 0;
            while b.grant(faulter).unwrap() < (TOTAL - idle_min) * 3 / 4 {
                simulate_round(&mut b, &mut procs);
                rounds += 1;
                assert!(
                    rounds <= 100,
                    "not converged after {rounds} rounds: {:?}",
                    b.snapshot()
                );
            }
            assert_eq!(b.overcommitted_pages(), 0);
        }
    }

    #[test]
    fn an_idle_holder_gives_way_to_a_late_faulter() {
        let mut b = Budget::new(TOTAL);
        b.join(1, 100, 1024);
        let mut procs = [(1, 0, 0, 0, true)];
        for _ in 0..5 {
            simulate_round(&mut b, &mut procs);
        }
        assert_eq!(b.grant(1), Some(TOTAL));
        b.join(2, 101, 1024);
        let mut procs = [(1, TOTAL, 1000, 0, false), (2, 0, 0, 0, true)];
        let mut rounds = 0;
        while b.grant(2).unwrap() < (TOTAL - 1024) * 3 / 4 {
            simulate_round(&mut b, &mut procs);
            rounds += 1;
            assert!(rounds <= 100, "not converged: {:?}", b.snapshot());
        }
        assert_eq!(b.overcommitted_pages(), 1024);
    }

    struct Prng(u64);
    impl Prng {
        fn next(&mut self) -> u64 {
            // splitmix64
            self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = self.0;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^ (z >> 31)
        }
        fn below(&mut self, n: u64) -> u64 {
            self.next() % n.max(1)
        }
    }

    #[test]
    fn invariants_hold_under_random_joins_reports_and_leaves() {
        for seed in 0..200 {
            let mut rng = Prng(seed);
            let total = 1024 + rng.below(200_000);
            let mut b = Budget::new(total);
            // id -> (used, fetched, evicted)
            let mut live: BTreeMap<u64, (u64, u64, u64)> = BTreeMap::new();
            let mut next_id = 0;
            for _ in 0..400 {
                match rng.below(10) {
                    0 | 1 if live.len() < 8 => {
                        next_id += 1;
                        // Mostly small mins; sometimes ones that do not fit.
                        let min = if rng.below(20) == 0 {
                            rng.below(total)
                        } else {
                            rng.below(total / 16 + 1)
                        };
                        let g = b.join(next_id, next_id as u32, min);
                        assert!(g >= min);
                        live.insert(next_id, (0, 0, 0));
                    }
                    2 if !live.is_empty() => {
                        let k = *live
                            .keys()
                            .nth(rng.below(live.len() as u64) as usize)
                            .unwrap();
                        live.remove(&k);
                        let before = b.free_pages();
                        assert!(b.leave(k));
                        assert!(b.free_pages() >= before);
                    }
                    _ if !live.is_empty() => {
                        let k = *live
                            .keys()
                            .nth(rng.below(live.len() as u64) as usize)
                            .unwrap();
                        let grant = b.grant(k).unwrap();
                        let s = live.get_mut(&k).unwrap();
                        match rng.below(3) {
                            0 => s.0 = grant.min(s.0 + rng.below(grant + 1)),
                            1 => s.0 = rng.below(grant + 1),
                            _ => {
                                s.1 += rng.below(1000);
                                s.2 += rng.below(100);
                                s.0 = grant;
                            }
                        }
                        b.report(k, report(s.0, s.1, s.2));
                    }
                    _ => {}
                }
                check(&b);
                let changed = b.rebalance();
                for (id, g) in &changed {
                    assert_eq!(b.grant(*id), Some(*g));
                }
                check(&b);
            }
            assert!(b.processes_seen() >= b.len() as u64);
        }
    }

    #[test]
    fn snapshot_keeps_departed_processes_with_their_peaks() {
        let mut b = Budget::new(TOTAL);
        b.join(1, 100, 1024);
        b.join(2, 101, 1024);
        b.report(1, report(3000, 7, 0));
        b.report(2, report(500, 0, 0));
        b.report(1, report(2000, 9, 0));
        b.leave(1);
        let s = b.snapshot();
        assert_eq!(s.len(), 2);
        assert_eq!(s[0].pid, 101);
        assert!(s[0].running);
        assert_eq!(
            s[1],
            ProcessShare {
                pid: 100,
                grant_pages: 0,
                used_pages: 0,
                peak_used_pages: 3000,
                fetched_pages: 9,
                running: false
            }
        );
        assert_eq!(b.peak_total_used_pages(), 3500);
        assert_eq!(b.processes_seen(), 2);
    }

    #[test]
    fn departed_processes_are_bounded() {
        let mut b = Budget::new(TOTAL);
        for id in 0..(MAX_DEPARTED as u64 + 10) {
            b.join(id, id as u32, 1);
            b.report(id, report(id, 0, 0));
            b.leave(id);
        }
        let s = b.snapshot();
        assert_eq!(s.len(), MAX_DEPARTED);
        assert!(s.iter().all(|p| p.peak_used_pages >= 10));
    }
}
