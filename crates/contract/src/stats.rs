//! The runtime's counters as a serializable snapshot ([`Stats`], what `fm_stats`,
//! `Region::stats` and `farmem run --stats` show) and [`StatsFile`], the stats file itself: one
//! type for its writer (the preload library) and its readers (`farmem run`'s summary line,
//! `farmem-bench compare`).

use serde::{Deserialize, Serialize};

/// Latency percentiles of one fault kind, microseconds.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct LatencySummary {
    pub count: u64,
    pub p50_us: f64,
    pub p99_us: f64,
    pub p999_us: f64,
    pub max_us: f64,
}

/// Fault latency by kind.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct FaultLatency {
    pub zero: LatencySummary,
    pub pool_hit: LatencySummary,
    pub remote: LatencySummary,
    pub tier: LatencySummary,
    pub write_protect: LatencySummary,
    /// Donor fetches served by another copy after the first failed or was slow (also in
    /// `remote`).
    #[serde(default)]
    pub failover: LatencySummary,
}

/// What a runtime holds on one donor.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct DonorUse {
    /// HOST:PORT.
    pub addr: String,
    /// `live`, `suspect` or `dead`.
    pub health: String,
    /// Far slab copies placed there now.
    pub far_slabs: u64,
    /// Bytes of its slabs held, and the bytes far slabs fill of them.
    pub bytes_taken: u64,
    pub bytes_filled: u64,
    /// What it lends in all (as it said when this runtime connected) and its slab size.
    pub capacity_bytes: u64,
    pub slab_size_bytes: u64,
}

/// A snapshot of the runtime's counters (process-wide).
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct Stats {
    /// Faults on never-written (or released) pages, answered with a zero page.
    pub faults_zero: u64,
    /// Faults served from the write-back pool (page moved back, no copy).
    pub faults_pool_hit: u64,
    /// Faults whose page was fetched from a donor.
    pub faults_remote: u64,
    /// Faults whose page was copied straight from a memory slab: the host tier (a `farmem
    /// node`'s shared memory) or a local slab (one the node took back).
    pub faults_tier: u64,
    /// Write-protect faults: first write to a clean page (it becomes dirty).
    pub faults_write_protect: u64,
    /// Fault messages for pages that were already resident (another thread's fault on the same
    /// page was served first): answered with a wake, nothing fetched twice.
    pub faults_already_served: u64,
    /// Evicted pages that were dirty and were sent to a donor.
    pub evicted_sent_dirty: u64,
    /// Evicted pages that were dirty and were written into a memory slab (the host tier, or a
    /// local slab): one copy, no message.
    pub tier_pages_written: u64,
    /// Host tier slabs held now.
    pub tier_slabs: u64,
    /// Local slabs held now: host tier slabs the node took back that no donor holds yet
    /// (private memory of this process, beyond the budget).
    pub local_slabs: u64,
    /// Host tier slabs given back to the node when it asked (reclaims).
    pub tier_reclaimed_slabs: u64,
    /// Host tier slabs given back at no cost: their donor copy was complete, so they simply
    /// live on the donor from then on.
    pub tier_reclaimed_clean: u64,
    /// Pages of memory slabs written through to their donor copies in the background (with
    /// donors configured), so a reclaim costs nothing.
    pub tier_pages_written_through: u64,
    /// Local slabs moved on to a donor.
    pub local_slabs_migrated: u64,
    /// Pages the prefetcher predicted that were installed ahead of use straight from a memory
    /// slab (the host tier), so the program's access took no fault at all.
    pub tier_installed_ahead: u64,
    /// Of those, pages installed writable (the program was writing most pages installed
    /// ahead write-protected; [`farmem_policy::ahead_writes`]).
    pub tier_installed_ahead_writable: u64,
    /// UFFDIO_COPY calls that installed them: a run of pages neighbouring each other in the
    /// region and in their slab takes one.
    pub tier_ahead_copies: u64,
    /// Never-written pages mapped (zeroed) ahead of a thread filling fresh memory in order
    /// (first-touch readahead), so its writes there took no fault.
    pub zero_installed_ahead: u64,
    /// The node serving the host tier (its socket), if one is used.
    pub tier_node: Option<String>,
    /// Evicted pages that were clean (unchanged since fetched, still on the donor): not resent.
    pub evicted_dropped_clean: u64,
    /// Evicted pages that were all zero: never sent, they come back as zero pages.
    pub evicted_zero: u64,
    /// UFFDIO_MOVE calls the evictor made (each one TLB shootdown on the other CPUs the
    /// program runs on): pages evicted per call says how well victims leave in runs.
    #[serde(default)]
    pub evict_moves: u64,
    /// Resident pages in the holes between a round's victims taken with them, out of the
    /// eviction policy's order, so that their runs move as one.
    #[serde(default)]
    pub evicted_out_of_order: u64,
    /// Victims that could not be evicted (mlocked, a page moved by mremap while being
    /// dropped): they stay resident and are tried again.
    pub evictions_refused: u64,
    /// Dirty pages the evictor write-protected as samples of their chunk's writes
    /// ([`farmem_policy::write_heat`]), and of those, pages the program wrote before the
    /// evictor reached them again.
    #[serde(default)]
    pub write_heat_samples: u64,
    #[serde(default)]
    pub write_heat_samples_written: u64,
    /// Dirty pages the evictor reached and kept (put back at the queue's tail) because the
    /// program keeps writing their chunk.
    #[serde(default)]
    pub write_heat_kept: u64,
    /// Victims shared copy-on-write with a forked process (parent or child) that were copied
    /// and dropped from this process, the other keeping the page (the runtime's copy-and-drop path).
    #[serde(default)]
    pub shared_pages_dropped: u64,
    /// Victims in a range the program made read-only or inaccessible (mprotect), which
    /// UFFDIO_MOVE refuses, copied and dropped instead; they come back on the next access.
    #[serde(default)]
    pub not_writable_pages_dropped: u64,
    /// Page data bytes sent to donors.
    pub bytes_sent: u64,
    /// Page data bytes received from donors.
    pub bytes_received: u64,
    /// Region pages resident now.
    pub resident_pages: u64,
    /// Most region pages resident at once.
    pub peak_resident_pages: u64,
    /// The budget, in pages.
    pub budget_pages: u64,
    /// Pages held in the write-back pool now.
    pub pool_pages: u64,
    /// Pages the write-back pool may hold now (its slots, or fewer while a process tree's
    /// grant is small: the runtime's `set_local_pages`).
    pub pool_capacity_pages: u64,
    /// Slabs placed on donors.
    pub slabs_placed: u64,
    /// Bytes of donor slabs this runtime holds now (what it takes of the donors' capacity).
    #[serde(default)]
    pub donor_bytes_taken: u64,
    /// Of those, bytes its far slabs fill (far slabs are packed into donor slabs:
    /// the runtime's packing).
    #[serde(default)]
    pub donor_bytes_filled: u64,
    /// Failed fetches (each retried; a page that cannot be fetched is poisoned: SIGBUS).
    pub fetch_errors: u64,
    /// Failed sends (retried; pages stay in the pool meanwhile).
    pub send_errors: u64,
    /// Pages are sealed (encrypted and authenticated) before they leave the process.
    pub sealed: bool,
    /// Pages found absent while their state said resident (a runtime bug; each access there
    /// got SIGBUS instead of faulting forever).
    pub state_lost_pages: u64,
    /// Pages that could not be brought back from any copy (every donor copy gone or refused
    /// by its seal, no backup): each access there got SIGBUS.
    #[serde(default)]
    pub pages_lost: u64,
    /// Pages installed again after the program released them whose release the kernel applied
    /// only then (a zero page removed by the release's late zap): served as released, zeros.
    #[serde(default)]
    pub late_release_pages: u64,
    /// Pages a zero fault found still mapped after the program released them, before the
    /// kernel's zap reached them, taken out by the runtime: they held data from before the
    /// release.
    #[serde(default)]
    pub released_pages_taken_out: u64,
    /// Copies of each donor slab (`--replicas`).
    pub replicas: u64,
    /// Donors declared dead (each with the kind of failure: crash, stall, partition, restart).
    pub dead_donors: Vec<String>,
    /// Donors declared dead that came back (each with the kind and how long it lasted).
    #[serde(default)]
    pub donors_back: Vec<String>,
    /// Each donor this runtime uses: where it is, its health, what this runtime holds there.
    #[serde(default)]
    pub donors: Vec<DonorUse>,
    /// Donor fetches served by another copy (a replica or the backup file) after the first
    /// failed or was slow.
    pub failovers: u64,
    /// Far slabs with fewer live copies than `replicas` now.
    pub slabs_degraded: u64,
    /// Far slabs none of whose copies is on a live donor and that the backup file cannot
    /// serve: their pages are lost unless a donor comes back.
    pub slabs_lost: u64,
    /// Slab copies made by re-replication (after a donor died, or a donor asked for its
    /// memory back).
    pub slabs_healed: u64,
    /// Bytes re-replication copied between donors.
    pub heal_bytes: u64,
    /// How long the last re-replication took, from the donor's death being declared to every
    /// slab that could be healed having its copies again, seconds.
    pub last_heal_s: Option<f64>,
    /// Slabs moved off a donor that asked for its memory back (Valet migration).
    pub slabs_migrated: u64,
    /// Pages written to the backup file, and read back from it.
    pub backup_pages_written: u64,
    pub backup_pages_read: u64,
    /// Far pages left in the host tier or on donors for forked children to borrow instead of
    /// being brought back before a fork (summed over forks).
    #[serde(default)]
    pub fork_pages_lent: u64,
    /// Pages this process (a forked child) borrowed from its parent's host-tier slabs or donor
    /// slabs at start.
    #[serde(default)]
    pub pages_borrowed: u64,
    /// Pages fetched from a donor that failed their integrity check (altered, swapped or an
    /// older version) and were not installed; each also counts as a failed fetch.
    pub seal_rejected: u64,
    /// Pages brought in by prefetching (landed, or faulted while in flight).
    pub prefetched_pages: u64,
    /// First touches of prefetched pages (prefetch hits), including those that waited and
    /// those inferred (marker mode).
    pub prefetch_hits: u64,
    /// Prefetch hits on pages still in flight when touched (served by their demand read).
    pub prefetch_hits_waited: u64,
    /// Prefetch hits inferred from a window's marker (marker install mode only).
    pub prefetch_hits_inferred: u64,
    /// Faults served from a donor that were not prefetch hits (the misses prefetching did not
    /// cover; the denominator of coverage with the hits).
    pub prefetch_demand_faults: u64,
    /// Prefetched pages dropped on arrival (already faulted in, released, remapped, or no pool
    /// slot).
    pub prefetch_dropped: u64,
    /// Prefetched pages evicted (or released) before their first touch.
    pub prefetch_pollution: u64,
    /// Prefetch batches received from donors.
    pub prefetch_batches: u64,
    /// prefetch_hits / prefetched_pages (0 when nothing was prefetched).
    pub prefetch_accuracy: f64,
    /// prefetch_hits / (prefetch_hits + prefetch_demand_faults) (0 when both are 0).
    pub prefetch_coverage: f64,
    /// Median time from a page's arrival to its first touch, µs.
    pub prefetch_timeliness_p50_us: Option<f64>,
    /// 95th percentile of the time from a page's arrival to its first touch, µs.
    pub prefetch_timeliness_p95_us: Option<f64>,
    /// The last error the runtime reported, if any.
    pub last_error: Option<String>,
    /// CPU time (user + system, seconds) of this process's farmem threads, those whose name
    /// starts with `farmem-` (fault, evict, send, tier, prefetch, the stats writer, the keepers
    /// of child servers…), read from /proc/self/task when the snapshot is taken; threads that
    /// have ended are not counted.
    pub runtime_cpu_s: f64,
    /// The system part of `runtime_cpu_s` (so `runtime_cpu_s - runtime_system_s` is their user
    /// time: what `farmem-bench compare` adds to the program's system time without counting
    /// the threads' system time twice).
    pub runtime_system_s: f64,
    /// Fault latency by kind.
    pub latency: FaultLatency,
}

/// The stats file of `farmem run --stats FILE`, written by the preload library of the program
/// (about once a second, and at exit with `is_final` set), read by `farmem run` for its summary
/// line and by `farmem-bench compare`. In JSON:
/// `{"pid", "final", "summary": {…}, "preload": {…}, "runtime": {…}}`.
///
/// Reading tolerates unknown keys, so a file from a newer library (one more counter) still
/// reads; a missing key is an error, so a reader never takes a counter it needs for 0. The
/// `Option` fields may be `null` (a program whose runtime never started).
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct StatsFile {
    /// The process that wrote the file.
    pub pid: u32,
    /// Written at exit (the last write), not by the periodic writer.
    #[serde(rename = "final")]
    pub is_final: bool,
    /// The figures of `farmem run`'s summary line (None without a runtime).
    pub summary: Option<StatsSummary>,
    /// The preload library's own counters.
    pub preload: PreloadCounters,
    /// The runtime's counters (None without a runtime: allocator-only mode).
    pub runtime: Option<Stats>,
    /// Under `farmem run`: the whole process tree (then `summary` is the tree's total and
    /// `runtime` the first process's own counters). Absent in a process's own file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tree: Option<TreeStats>,
    /// The process's memory beside the regions: what `--local-mem` does not bound (None when
    /// /proc/self/smaps could not be read; missing in files of older libraries).
    #[serde(default)]
    pub unmanaged: Option<UnmanagedReport>,
}

/// The process's resident memory and the part of it farmem does not manage, measured from
/// /proc/self/smaps by the preload library when it writes the stats file. Only region pages
/// (the heap and large private anonymous mappings) are paged; thread stacks, small mappings,
/// file-backed memory and a managed runtime's own heap are not, so they are not bounded by
/// `--local-mem`.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct UnmanagedReport {
    /// Resident memory of the whole process now (the sum of every mapping's Rss).
    pub rss_bytes: u64,
    /// Most resident memory of the process at once (VmHWM), since it started.
    pub peak_rss_bytes: u64,
    /// Resident memory now in the regions (the program's memory farmem pages).
    pub managed_rss_bytes: u64,
    /// Resident memory now in farmem's own memory: the write-back pool (within
    /// `--local-mem`) and memory slabs (host tier slabs are the node's memory, shared into the
    /// process; local slabs are counted in `Stats::local_slabs`).
    pub farmem_rss_bytes: u64,
    /// Resident memory now outside both: `rss_bytes - managed_rss_bytes - farmem_rss_bytes`.
    pub unmanaged_bytes: u64,
    /// The anonymous part of `unmanaged_bytes` (stacks, small mappings, a runtime's own heap);
    /// the rest is file-backed or shared.
    pub anon_unmanaged_bytes: u64,
    /// The most `unmanaged_bytes` seen in any measurement (about once a second, and at exit).
    pub peak_unmanaged_bytes: u64,
    /// The most `anon_unmanaged_bytes` seen in any measurement: what `farmem run` warns about
    /// (file-backed pages the kernel can drop; these it cannot). 0 in files of older libraries.
    #[serde(default)]
    pub peak_anon_unmanaged_bytes: u64,
    /// The mappings with the most unmanaged resident memory now, largest first (at most 5).
    pub biggest: Vec<UnmanagedMapping>,
    /// The same when `peak_unmanaged_bytes` was measured.
    pub biggest_at_peak: Vec<UnmanagedMapping>,
}

/// One mapping outside farmem's regions, as /proc/self/smaps lists it.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct UnmanagedMapping {
    /// Start address.
    pub start: u64,
    /// Length in bytes.
    pub len: u64,
    /// Resident bytes.
    pub rss_bytes: u64,
    /// Its pathname column: a file, `[stack]`, `[heap]`, `[anon:NAME]`…, or `[anon]` for an
    /// anonymous mapping without a name.
    pub name: String,
}

/// The figures of `farmem run`'s summary line, under stable names, in bytes where the runtime
/// counts pages.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct StatsSummary {
    /// Faults served (zero pages, write-back pool hits and donor fetches).
    pub faults: u64,
    /// Faults whose page came from a donor.
    pub faults_remote: u64,
    /// Write-protect faults (first writes to clean pages).
    pub faults_write_protect: u64,
    /// Page bytes received from donors.
    pub remote_bytes_in: u64,
    /// Page bytes sent to donors.
    pub remote_bytes_out: u64,
    /// Faults whose page was copied from the host tier (or a local slab).
    pub faults_tier: u64,
    /// Page bytes read from the host tier (or local slabs): by faults and installed ahead.
    pub tier_bytes_in: u64,
    /// Page bytes written into the host tier (or local slabs) by evictions.
    pub tier_bytes_out: u64,
    /// Prefetch accuracy; None (null, "n/a" in the summary line) when nothing was prefetched:
    /// with `--prefetch none`, or a program that never faulted on a far page.
    pub prefetch_accuracy: Option<f64>,
    /// Prefetch coverage; None when nothing was prefetched.
    pub prefetch_coverage: Option<f64>,
    /// Pages brought in by prefetching.
    pub prefetched_pages: u64,
    /// First touches of prefetched pages.
    pub prefetch_hits: u64,
    /// Most region bytes resident at once.
    pub peak_resident_bytes: u64,
    /// The budget.
    pub budget_bytes: u64,
    /// The write-back pool's size.
    pub pool_bytes: u64,
    /// Failed fetches.
    pub fetch_errors: u64,
    /// Failed sends.
    pub send_errors: u64,
    /// Fetched pages that failed their seal check (also counted in `fetch_errors`).
    #[serde(default)]
    pub seal_rejected: u64,
    /// Pages found absent while their state said resident (a runtime bug: SIGBUS).
    #[serde(default)]
    pub state_lost_pages: u64,
    /// Pages that could not be brought back from any copy (SIGBUS).
    #[serde(default)]
    pub pages_lost: u64,
    /// What the run holds on each donor (a tree's processes added up per donor).
    #[serde(default)]
    pub donors: Vec<DonorUse>,
    /// Bytes of donor slabs held at the end, and the bytes far slabs filled of them.
    #[serde(default)]
    pub donor_bytes_taken: u64,
    #[serde(default)]
    pub donor_bytes_filled: u64,
    /// The last error the runtime reported, if any.
    pub last_error: Option<String>,
    /// Donor fetches served by another copy after the first failed or was slow.
    #[serde(default)]
    pub failovers: u64,
    /// Donors declared dead, each with the kind of failure.
    #[serde(default)]
    pub dead_donors: Vec<String>,
    /// Donors declared dead that came back, each with the kind and how long it lasted.
    #[serde(default)]
    pub donors_back: Vec<String>,
    /// Far slabs with fewer live copies than `--replicas` at the end.
    #[serde(default)]
    pub slabs_degraded: u64,
    /// Slab copies re-made on other donors, and how long the last healing took (s).
    #[serde(default)]
    pub slabs_healed: u64,
    #[serde(default)]
    pub last_heal_s: Option<f64>,
    /// Pages read back from the backup file.
    #[serde(default)]
    pub backup_pages_read: u64,
    /// Far pages left in the host tier or on donors for forked children (summed over forks).
    #[serde(default)]
    pub fork_pages_lent: u64,
    /// Pages a forked child borrowed from its parent's host-tier or donor slabs.
    #[serde(default)]
    pub pages_borrowed: u64,
}

impl From<&Stats> for StatsSummary {
    fn from(s: &Stats) -> StatsSummary {
        let page = farmem_proto::PAGE_SIZE as u64;
        let prefetched = s.prefetched_pages > 0;
        StatsSummary {
            faults: s.faults_zero + s.faults_pool_hit + s.faults_remote + s.faults_tier,
            faults_remote: s.faults_remote,
            faults_write_protect: s.faults_write_protect,
            remote_bytes_in: s.bytes_received,
            remote_bytes_out: s.bytes_sent,
            faults_tier: s.faults_tier,
            tier_bytes_in: (s.faults_tier + s.tier_installed_ahead) * page,
            tier_bytes_out: s.tier_pages_written * page,
            prefetch_accuracy: prefetched.then_some(s.prefetch_accuracy),
            prefetch_coverage: prefetched.then_some(s.prefetch_coverage),
            prefetched_pages: s.prefetched_pages,
            prefetch_hits: s.prefetch_hits,
            peak_resident_bytes: s.peak_resident_pages * page,
            budget_bytes: s.budget_pages * page,
            pool_bytes: s.pool_capacity_pages * page,
            fetch_errors: s.fetch_errors,
            send_errors: s.send_errors,
            seal_rejected: s.seal_rejected,
            state_lost_pages: s.state_lost_pages,
            pages_lost: s.pages_lost,
            donors: s.donors.clone(),
            donor_bytes_taken: s.donor_bytes_taken,
            donor_bytes_filled: s.donor_bytes_filled,
            last_error: s.last_error.clone(),
            failovers: s.failovers,
            dead_donors: s.dead_donors.clone(),
            donors_back: s.donors_back.clone(),
            slabs_degraded: s.slabs_degraded,
            slabs_healed: s.slabs_healed,
            last_heal_s: s.last_heal_s,
            backup_pages_read: s.backup_pages_read,
            fork_pages_lent: s.fork_pages_lent,
            pages_borrowed: s.pages_borrowed,
        }
    }
}

impl StatsSummary {
    /// Why the run ended degraded, if it did: far slabs short of copies at the end, donors
    /// dead, donors that died and came back.
    pub fn degraded(&self) -> Option<String> {
        let mut why = Vec::new();
        if self.slabs_degraded > 0 {
            why.push(format!("{} far slabs short of copies", self.slabs_degraded));
        }
        if !self.dead_donors.is_empty() {
            why.push(format!("dead donors: {}", self.dead_donors.join("; ")));
        }
        if !self.donors_back.is_empty() {
            why.push(format!(
                "donors dead for a while: {}",
                self.donors_back.join("; ")
            ));
        }
        (!why.is_empty()).then(|| why.join(", "))
    }

    /// Adds another process's figures (a process tree's total): counts and bytes add up,
    /// prefetch ratios are weighted by pages prefetched, peaks and budgets add up (an upper
    /// bound; the tree's own peak is [`TreeStats::peak_local_bytes`]), the last error is the
    /// newest one seen.
    pub fn add(&mut self, o: &StatsSummary) {
        let weighted = |a: Option<f64>, wa: u64, b: Option<f64>, wb: u64| match (a, b) {
            (None, x) | (x, None) => x,
            (Some(a), Some(b)) if wa + wb > 0 => {
                Some((a * wa as f64 + b * wb as f64) / (wa + wb) as f64)
            }
            (Some(a), Some(_)) => Some(a),
        };
        self.prefetch_accuracy = weighted(
            self.prefetch_accuracy,
            self.prefetched_pages,
            o.prefetch_accuracy,
            o.prefetched_pages,
        );
        self.prefetch_coverage = weighted(
            self.prefetch_coverage,
            self.prefetched_pages,
            o.prefetch_coverage,
            o.prefetched_pages,
        );
        self.faults += o.faults;
        self.faults_remote += o.faults_remote;
        self.faults_write_protect += o.faults_write_protect;
        self.remote_bytes_in += o.remote_bytes_in;
        self.remote_bytes_out += o.remote_bytes_out;
        self.faults_tier += o.faults_tier;
        self.tier_bytes_in += o.tier_bytes_in;
        self.tier_bytes_out += o.tier_bytes_out;
        self.prefetched_pages += o.prefetched_pages;
        self.prefetch_hits += o.prefetch_hits;
        self.peak_resident_bytes += o.peak_resident_bytes;
        self.budget_bytes += o.budget_bytes;
        self.pool_bytes += o.pool_bytes;
        self.fetch_errors += o.fetch_errors;
        self.send_errors += o.send_errors;
        self.seal_rejected += o.seal_rejected;
        self.state_lost_pages += o.state_lost_pages;
        self.pages_lost += o.pages_lost;
        self.donor_bytes_taken += o.donor_bytes_taken;
        for d in &o.donors {
            match self.donors.iter_mut().find(|x| x.addr == d.addr) {
                Some(x) => {
                    x.far_slabs += d.far_slabs;
                    x.bytes_taken += d.bytes_taken;
                    x.bytes_filled += d.bytes_filled;
                    // The worst health any process saw.
                    if d.health == "dead" || (d.health == "suspect" && x.health == "live") {
                        x.health.clone_from(&d.health);
                    }
                }
                None => self.donors.push(d.clone()),
            }
        }
        self.donor_bytes_filled += o.donor_bytes_filled;
        if o.last_error.is_some() {
            self.last_error.clone_from(&o.last_error);
        }
        self.failovers += o.failovers;
        self.fork_pages_lent += o.fork_pages_lent;
        self.pages_borrowed += o.pages_borrowed;
        for d in &o.dead_donors {
            if !self.dead_donors.contains(d) {
                self.dead_donors.push(d.clone());
            }
        }
        for d in &o.donors_back {
            if !self.donors_back.contains(d) {
                self.donors_back.push(d.clone());
            }
        }
        self.slabs_degraded += o.slabs_degraded;
        self.slabs_healed += o.slabs_healed;
        self.last_heal_s = match (self.last_heal_s, o.last_heal_s) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        };
        self.backup_pages_read += o.backup_pages_read;
    }
}

/// A process tree's account, in the stats file `farmem run --stats` writes: every process of
/// the program's tree that ran a farmem runtime, and the budget they shared.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct TreeStats {
    /// Each process's own figures (from its file in the tree directory).
    pub processes: Vec<TreeProcess>,
    /// Most local memory (resident region pages and pool pages in use) the processes held
    /// together at once, as their reports to the budget coordinator showed it.
    pub peak_local_bytes: u64,
    /// Local memory granted beyond `--local-mem` because more processes ran than it could
    /// give their least share to.
    pub overcommitted_bytes: u64,
    /// The tree's largest RSS, and anonymous RSS, sampled from outside by `farmem run` every
    /// 50 ms (pages shared between processes count in each).
    #[serde(default)]
    pub sampled_peak_rss_bytes: u64,
    #[serde(default)]
    pub sampled_peak_anon_bytes: u64,
    /// Processes of the tree that ran without farmem (statically linked, setuid, or with a
    /// cleared environment), largest first.
    #[serde(default)]
    pub unpaged: Vec<UnpagedProcess>,
}

/// A process of a tree that farmem did not reach: its memory was not paged at all.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct UnpagedProcess {
    pub pid: u32,
    /// Its command name.
    pub name: String,
    /// Its largest RSS seen.
    pub peak_rss_bytes: u64,
}

/// One process of a tree.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct TreeProcess {
    pub pid: u32,
    /// Its file was written at its exit (not a snapshot of a process killed or still running).
    #[serde(rename = "final")]
    pub is_final: bool,
    pub summary: Option<StatsSummary>,
    /// Its memory outside the regions.
    #[serde(default)]
    pub unmanaged: Option<UnmanagedReport>,
}

/// The preload library's counters (its interposition of the program's heap and mappings).
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct PreloadCounters {
    /// Bytes of the heap span handed to the allocator (each chunk a region).
    pub heap_bytes: u64,
    /// Program mappings made regions by the mmap interposition.
    pub mmap_regions: u64,
    /// Their total length.
    pub mmap_region_bytes: u64,
    /// Mappings the runtime refused to adopt (left as ordinary memory).
    pub register_failures: u64,
    /// `MADV_FREE` calls turned into `MADV_DONTNEED`.
    pub madv_free_converted: u64,
    /// Of the mapping regions, reservations (`PROT_NONE` when mapped, committed later by
    /// `mprotect`, as V8 and HotSpot do).
    pub reservations: u64,
    /// Of the mapping regions, `mmap(MAP_FIXED)` replacing part of a region (a commit or
    /// decommit inside a reservation), registered whatever their size.
    pub fixed_reregistered: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stats_file_without_the_unmanaged_report_still_reads() {
        let mut v = serde_json::to_value(StatsFile::default()).unwrap();
        v.as_object_mut().unwrap().remove("unmanaged");
        let file: StatsFile = serde_json::from_value(v).unwrap();
        assert_eq!(file.unmanaged, None);
    }

    #[test]
    fn nothing_prefetched_leaves_accuracy_undefined() {
        let s = StatsSummary::from(&Stats::default());
        assert_eq!((s.prefetch_accuracy, s.prefetch_coverage), (None, None));
        let json = serde_json::to_string(&s).unwrap();
        assert!(json.contains("\"prefetch_accuracy\":null"), "{json}");
    }

    #[test]
    fn unknown_keys_are_tolerated_missing_ones_are_not() {
        let mut v = serde_json::to_value(StatsFile::default()).unwrap();
        v["a_newer_counter"] = 1.into();
        v["preload"]["another"] = 2.into();
        assert_eq!(
            serde_json::from_value::<StatsFile>(v.clone()).unwrap(),
            StatsFile::default()
        );
        v["preload"].as_object_mut().unwrap().remove("heap_bytes");
        let e = serde_json::from_value::<StatsFile>(v).unwrap_err();
        assert!(e.to_string().contains("missing field `heap_bytes`"), "{e}");
    }
}
