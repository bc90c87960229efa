//! Reading one far page from its copies: the first replica on a live donor, the next one as
//! soon as it fails or is slow, and the backup file when every replica failed.
//!
//! # Design
//!
//! - A read goes to one replica at a time. When it fails (connection refused or reset, a
//!   page that fails its seal check, a wrong answer) the next replica is asked at once, and
//!   the donor is suspected ([`crate::far::health`]). When it is merely slow — no answer within the
//!   failover delay — the next replica is asked too and the slow request is dropped: a stalled
//!   or partitioned donor costs a fault the failover delay, not the request timeout.
//! - The failover delay adapts to the donors' answers instead of being tuned to one machine:
//!   four times the slowest recent read (a maximum that decays by 1/64 a read), at least 20 ms
//!   (a scheduling hiccup on a loaded 2-core machine is not a failure) and at most half the
//!   request timeout. The last replica is always waited for up to the request timeout.
//! - Three reads in a row given up on one donor for slowness make it suspected (probed), so a
//!   stalled donor that is only read from is found, not paid for on every read.
//! - With no replica left, the page is read from the backup file, if any; else the read fails
//!   and the fault path retries it (`fetch_attempts`) before poisoning the page.

use std::time::Instant;

use farmem_transport::{Completion, PageAddr, Pending};

use crate::error::{CopyFailure, ReadFailed};
use crate::shared::Shared;
use farmem_proto::PAGE_SIZE;

/// A read of one far page in flight on one of its copies.
pub(crate) struct ReplicaRead {
    far: u64,
    /// The copies not asked yet, in order.
    rest: Vec<(usize, PageAddr)>,
    /// The copy being asked: donor, request, when it was sent.
    current: Option<(usize, Pending, Instant)>,
    /// Another copy than the first was asked.
    failed_over: bool,
    /// What went wrong with each copy, for the error.
    errors: Vec<CopyFailure>,
    /// The restart epoch before the copies were looked up ([`crate::far::Far::read_epoch`]).
    epoch: u64,
}

impl ReplicaRead {
    /// Sends the read of far page `far` to its first copy.
    pub(crate) fn start(sh: &Shared, far: u64) -> ReplicaRead {
        let epoch = sh.far.read_epoch();
        let mut rest = sh.far.read_sources(far);
        rest.reverse();
        let mut r = ReplicaRead {
            far,
            rest,
            current: None,
            failed_over: false,
            errors: Vec::new(),
            epoch,
        };
        r.ask_next(sh);
        r
    }

    /// Sends the read to the next copy that accepts it. After a failure, only to a copy the
    /// page's slab still has: one dropped meanwhile (its donor declared dead) may be on a donor
    /// re-adopted after a restart, where its slab id names another slab by then.
    fn ask_next(&mut self, sh: &Shared) {
        let now = (!self.errors.is_empty()).then(|| sh.far.read_sources(self.far));
        while let Some((d, addr)) = self.rest.pop() {
            if now.as_ref().is_some_and(|now| !now.contains(&(d, addr))) {
                continue;
            }
            match sh.far.submit_read_on(d, addr) {
                Ok(p) => {
                    self.current = Some((d, p, Instant::now()));
                    return;
                }
                Err(e) => {
                    sh.far.suspect(d);
                    self.errors.push(CopyFailure::Send(Box::new(e)));
                    self.failed_over = true;
                }
            }
        }
    }

    /// Waits for the page, failing over from copy to copy, then to the backup file. Returns
    /// the opened page, and whether another copy than the first served it.
    pub(crate) fn finish(mut self, sh: &Shared) -> Result<(Vec<u8>, bool), ReadFailed> {
        let timeout = sh.request_timeout;
        while let Some((d, mut p, sent)) = self.current.take() {
            let result = if self.rest.is_empty() {
                Some(p.wait())
            } else {
                p.wait_until(sent + sh.far.read_times.failover_delay(timeout))
            };
            let why = match result {
                None => {
                    if sh.far.donor(d).health.slow() {
                        sh.far.suspect(d);
                    }
                    CopyFailure::Slow {
                        donor: sh.far.donor(d).read.addr().to_string(),
                    }
                }
                Some(Ok(Completion::Pages(_))) if sh.far.read_epoch() != self.epoch => {
                    // A restarted donor was taken back meanwhile: every copy looked up before
                    // may name another slab there now. Not a failure: looked up again.
                    return ReplicaRead::start(sh, self.far).finish(sh);
                }
                Some(Ok(Completion::Pages(mut data))) if data.len() == PAGE_SIZE => {
                    sh.far.read_times.record(sent.elapsed());
                    sh.far.donor(d).health.answered();
                    sh.stats.lock().s.bytes_received += PAGE_SIZE as u64;
                    match sh.far.open(self.far, &mut data) {
                        Ok(()) => return Ok((data, self.failed_over)),
                        Err(e) => {
                            // A copy that fails its check is a failed replica: never installed.
                            sh.stats.lock().s.seal_rejected += 1;
                            CopyFailure::Sealed(e)
                        }
                    }
                }
                Some(Ok(_)) => CopyFailure::NoPage {
                    donor: sh.far.donor(d).read.addr().to_string(),
                },
                Some(Err(e)) => {
                    sh.far.on_error(d, &e);
                    CopyFailure::Transport(e)
                }
            };
            self.errors.push(why);
            self.failed_over = true;
            self.ask_next(sh);
        }
        if let Some(b) = &sh.far.backup {
            let mut data = vec![0u8; PAGE_SIZE];
            match b.read(self.far, &mut data) {
                Ok(true) => match sh.far.open(self.far, &mut data) {
                    Ok(()) => return Ok((data, true)),
                    Err(e) => self.errors.push(CopyFailure::BackupSealed(e)),
                },
                Ok(false) => self.errors.push(CopyFailure::BackupMissing),
                Err(e) => self.errors.push(CopyFailure::Backup(Box::new(e))),
            }
        }
        if self.errors.is_empty() {
            self.errors.push(CopyFailure::Nowhere);
        }
        Err(ReadFailed(self.errors))
    }
}
