//! Whether a donor is alive: live, suspected (a request failed; the heal thread probes it), or
//! dead (the probe failed), with the kind of failure.
//!
//! # Design
//!
//! - Any thread that sees a connection failure *suspects* the donor; only the heal thread
//!   declares it dead, after a probe ([`crate::threads::heal`]), so one broken connection (a timeout
//!   inside a frame, a reset the next request survives) never drops a healthy donor's copies.
//! - Reads never wait for the verdict: a read that fails, or is slow past the failover delay,
//!   goes to the next replica at once ([`crate::copies::failover`]).
//! - The kinds ([`Cause`]) are told apart by how the probe fails: the connection is refused or
//!   reset (crash: the process is gone, its host answers); a new TCP connection is accepted
//!   but requests get no answer (stall: the process is stopped or wedged, the kernel still
//!   completes handshakes for it); no TCP connection can be made at all, no refusal either
//!   (partition: no route, or packets dropped).

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU8, Ordering};
use std::time::Instant;

use crate::sync::Mutex;

const LIVE: u8 = 0;
const SUSPECT: u8 = 1;
const DEAD: u8 = 2;

/// Reads given up on for slowness in a row before the donor is suspected: one slow read is
/// the machine's load, three in a row (each past four times the slowest recent read) is the
/// donor.
const SLOW_STREAK: u32 = 3;

/// How a donor failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Cause {
    /// Connection refused or reset: the donor process is gone.
    Crash,
    /// Connections are accepted but requests go unanswered.
    Stall,
    /// No connection can be made and nothing refuses it: no route, or packets are dropped.
    Partition,
    /// The donor answers but no longer knows this client (it restarted with an empty store).
    Restarted,
}

/// How long the classifying connection may take.
const CONNECT_PROBE: std::time::Duration = std::time::Duration::from_secs(1);

impl Cause {
    /// Tells a crash from a stall from a partition at `addr` by opening a fresh TCP
    /// connection: refused or reset is a crash, accepted a stall, neither a partition.
    pub(crate) fn of(addr: &str) -> Cause {
        use std::net::{TcpStream, ToSocketAddrs};
        let Some(sa) = addr.to_socket_addrs().ok().and_then(|mut a| a.next()) else {
            return Cause::Partition;
        };
        match TcpStream::connect_timeout(&sa, CONNECT_PROBE) {
            Ok(_) => Cause::Stall,
            Err(e) => match e.kind() {
                std::io::ErrorKind::ConnectionRefused | std::io::ErrorKind::ConnectionReset => {
                    Cause::Crash
                }
                _ => Cause::Partition,
            },
        }
    }
}

impl std::fmt::Display for Cause {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Cause::Crash => "crash (connection refused or reset)",
            Cause::Stall => "stall (connections accepted, requests unanswered)",
            Cause::Partition => "partition (no connection possible, nothing refused)",
            Cause::Restarted => "restart (it no longer knows this client)",
        })
    }
}

/// A donor's health.
#[derive(Default)]
pub(crate) struct Health {
    state: AtomicU8,
    dead: Mutex<Option<(Cause, Instant)>>,
    /// Deaths it came back from: the cause and how long it was dead, so a donor declared
    /// dead during a link drop and then back is still named at the end.
    past: Mutex<Vec<(Cause, std::time::Duration)>>,
    /// A probe of this donor is running (one at a time).
    probing: AtomicBool,
    /// Reads given up on in a row for slowness (reset by any answer in time).
    slow_streak: AtomicU32,
    /// How many times it came back from the dead ([`Health::returns`]).
    returns: AtomicU32,
}

impl Health {
    /// Neither suspected nor dead: used for new slabs and read first.
    pub(crate) fn is_live(&self) -> bool {
        self.state.load(Ordering::Acquire) == LIVE
    }

    pub(crate) fn is_dead(&self) -> bool {
        self.state.load(Ordering::Acquire) == DEAD
    }

    pub(crate) fn is_suspect(&self) -> bool {
        self.state.load(Ordering::Acquire) == SUSPECT
    }

    /// Marks a live donor suspected; returns whether it was live (the caller wakes the
    /// prober).
    pub(crate) fn suspect(&self) -> bool {
        self.state
            .compare_exchange(LIVE, SUSPECT, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }

    /// The probe found the donor answering again.
    pub(crate) fn revive(&self) {
        if let Some((cause, at)) = self.dead.lock().take() {
            self.past.lock().push((cause, at.elapsed()));
            self.returns.fetch_add(1, Ordering::AcqRel);
        }
        self.state.store(LIVE, Ordering::Release);
    }

    /// How many times the donor came back from the dead: a connection kept by a thread from
    /// before a return (the prefetch thread's) is opened again before its next use, since it
    /// may lead to the donor's old process.
    pub(crate) fn returns(&self) -> u32 {
        self.returns.load(Ordering::Acquire)
    }

    /// The probe failed: the donor is dead, for `cause` (a later probe may find out more: a
    /// donor taken for stalled while it restarted is then said to have restarted; the time
    /// of death stays the first).
    pub(crate) fn declare_dead(&self, cause: Cause) {
        let mut dead = self.dead.lock();
        let since = dead.map_or_else(Instant::now, |(_, at)| at);
        *dead = Some((cause, since));
        self.state.store(DEAD, Ordering::Release);
    }

    /// A read from this donor was given up for slowness; true once that has happened
    /// [`SLOW_STREAK`] times in a row (the caller suspects the donor: a stalled donor that is
    /// only read from would otherwise cost every read the failover delay, forever).
    pub(crate) fn slow(&self) -> bool {
        self.slow_streak.fetch_add(1, Ordering::AcqRel) + 1 >= SLOW_STREAK
    }

    /// A read from this donor was answered in time.
    pub(crate) fn answered(&self) {
        if self.slow_streak.load(Ordering::Relaxed) != 0 {
            self.slow_streak.store(0, Ordering::Release);
        }
    }

    /// Claims the right to probe this donor; false while another probe runs.
    pub(crate) fn start_probe(&self) -> bool {
        !self.probing.swap(true, Ordering::AcqRel)
    }

    pub(crate) fn end_probe(&self) {
        self.probing.store(false, Ordering::Release);
    }

    /// The deaths it came back from: each cause and how long it lasted.
    pub(crate) fn past_deaths(&self) -> Vec<(Cause, std::time::Duration)> {
        self.past.lock().clone()
    }

    /// Why and since when the donor is dead, if it is.
    pub(crate) fn death(&self) -> Option<(Cause, Instant)> {
        *self.dead.lock()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_donor_is_suspected_once_then_dead_or_revived() {
        let h = Health::default();
        assert!(h.is_live());
        assert!(h.suspect());
        assert!(!h.suspect(), "a suspected donor is not suspected twice");
        assert!(h.is_suspect() && !h.is_live());
        h.declare_dead(Cause::Stall);
        assert!(h.is_dead());
        assert_eq!(h.death().map(|d| d.0), Some(Cause::Stall));
        assert!(!h.suspect(), "a dead donor is not suspected");
        assert_eq!(h.returns(), 0);
        h.revive();
        assert!(h.is_live() && h.death().is_none());
        assert_eq!(h.returns(), 1, "back from the dead once");
        assert!(h.suspect());
        h.revive();
        assert_eq!(h.returns(), 1, "a suspect revived was never dead");
        assert!(h.start_probe() && !h.start_probe());
        h.end_probe();
        assert!(h.start_probe());
        assert!(!h.slow() && !h.slow());
        h.answered();
        assert!(
            !h.slow() && !h.slow() && h.slow(),
            "three slow reads in a row"
        );
    }
}
