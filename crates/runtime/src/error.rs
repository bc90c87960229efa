//! [`RuntimeError`]: every way the runtime fails, each naming the failing step and what to do;
//! [`ReadFailed`], why no copy of a far page could be read ([`crate::copies::failover`]); and
//! [`SealError`], why a page could not be sealed or opened (`slabs/seal.rs`).

use farmem_transport::TransportError;
use farmem_uffd::UffdError;

/// Errors of the runtime: each names the failing step and what to do.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    #[error("invalid runtime configuration: {0}")]
    Config(String),
    #[error("creating the runtime's wake-up eventfd failed")]
    Doorbell(#[source] std::io::Error),
    #[error("userfaultfd: {step}")]
    Uffd {
        step: &'static str,
        #[source]
        source: UffdError,
    },
    #[error("donor {addr}: {step} failed")]
    Donor {
        addr: String,
        step: &'static str,
        #[source]
        source: farmem_transport::TransportError,
    },
    /// A slab copy in progress lost a copy it read from or wrote to: the slab dropped it
    /// meanwhile (its donor was declared dead), and a donor re-adopted after a restart may have
    /// given its slab ids to other slabs since. The copy is abandoned and planned again.
    #[error(
        "far slab {idx}: a copy the re-replication used was dropped meanwhile (its donor \
         failed); the copy is abandoned and made again from the copies left"
    )]
    CopyGone { idx: u64 },
    /// Every live donor refused a slab. Says what ran out in the donor's own words (capacity,
    /// a tenant's or client's quota, its host's memory) and what this runtime holds of them,
    /// so "full" is never stranded capacity taken for exhaustion.
    #[error(
        "the donors are full: no slab could be placed on any of the {live} live donor(s) of \
         {donors}; {addr} refused: {source}; this program holds {taken_bytes} bytes of donor \
         slabs, {filled_bytes} of them filled; start more donors or give them more --capacity, \
         or raise the budget"
    )]
    DonorsFull {
        live: usize,
        donors: usize,
        addr: String,
        taken_bytes: u64,
        filled_bytes: u64,
        source: Box<farmem_transport::TransportError>,
    },
    #[error(
        "a region of {len_bytes} bytes needs up to {needed_bytes} bytes of far memory beyond \
         the budget, but the donors lend only {capacity_bytes} bytes: start more donors, give \
         them more --capacity, or raise the budget"
    )]
    InsufficientCapacity {
        len_bytes: u64,
        needed_bytes: u64,
        capacity_bytes: u64,
    },
    #[error("host tier (node at {}): {step} failed", path.display())]
    Node {
        path: std::path::PathBuf,
        step: &'static str,
        #[source]
        source: farmem_node::NodeError,
    },
    #[error("nowhere to put evicted pages: {}", nowhere_why(.tier.as_deref(), *.node_gone, *.donors))]
    NowhereToPlace {
        /// The host tier, described, if one is used.
        tier: Option<String>,
        /// The node has ended (its connection is closed), rather than being full.
        node_gone: bool,
        /// Donors configured (none of them live, when this is said).
        donors: usize,
    },
    #[error("the private node (this program's host tier) could not be started: {reason}")]
    PrivateNode { reason: String },
    #[error(
        "none of the {tried} donor(s) could be reached ({first}); start them, or check the \
         addresses and the network"
    )]
    NoDonorReachable { tried: usize, first: String },
    #[error(
        "far page {far}: no donor holding its slab is alive ({donors}) and there is no backup \
         file; the pages stay in the write-back pool (give --backup-file, or more donors and \
         --replicas 2, to survive this)"
    )]
    NoLiveReplica { far: u64, donors: String },
    #[error("bringing far page {far} back before fork failed: {source}")]
    FetchBeforeFork {
        far: u64,
        #[source]
        source: ReadFailed,
    },
    #[error("backup file {}", path.display())]
    BackupFile {
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("donor {addr} is unusable: {reason}")]
    BadDonor { addr: String, reason: String },
    #[error("the embedded donor could not be started: {reason}")]
    EmbeddedDonor { reason: String },
    #[error("could not start {what}")]
    Spawn {
        what: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("{op} of {len_bytes} bytes failed")]
    Mmap {
        op: &'static str,
        len_bytes: usize,
        #[source]
        source: std::io::Error,
    },
    #[error("{addr:#x}+{len_bytes:#x} cannot be registered: {reason}")]
    BadRange {
        addr: usize,
        len_bytes: usize,
        reason: &'static str,
    },
    #[error("the runtime cannot be used in a forked child (its threads exist only in the parent)")]
    InChild,
    #[error("sealing pages")]
    Seal(#[source] SealError),
    #[error("internal error: {0}")]
    Internal(&'static str),
}

impl RuntimeError {
    /// The error's text without the figures that change from one try to the next (what this
    /// program holds on donors), so a cause that lasts is said once and then counted
    /// ([`crate::failure_log::FailureLog`]), not said again whenever the program places a slab.
    pub(crate) fn lasting_cause(&self) -> String {
        match self {
            RuntimeError::DonorsFull {
                live,
                donors,
                addr,
                source,
                ..
            } => format!(
                "the donors are full: no slab could be placed on any of the {live} live \
                 donor(s) of {donors}; {addr} refused: {source}; start more donors or give \
                 them more --capacity, or raise the budget"
            ),
            other => other.to_string(),
        }
    }
}

/// [`RuntimeError::NowhereToPlace`]'s message: what is out of room, and what to do. It said
/// "no host tier lends no more slabs and no donor is configured" with every donor dead.
fn nowhere_why(tier: Option<&str>, node_gone: bool, donors: usize) -> String {
    let tier = match tier {
        Some(t) if node_gone => {
            format!("{t} is gone (its node ended: was `farmem run` or the node killed?)")
        }
        Some(t) => format!("{t} lends no more slabs"),
        None => "there is no host tier".into(),
    };
    if donors == 0 && node_gone {
        format!(
            "{tier} and no donor is configured; the pages stay in this process, over the budget"
        )
    } else if donors == 0 {
        format!(
            "{tier} and no donor is configured; the pages stay in this process: give the node \
             more --capacity, name donors with --donor, or raise the budget"
        )
    } else {
        format!(
            "{tier} and none of the {donors} donor(s) is live (see the warnings above for each); \
             the pages wait in the write-back pool until one answers: restart the donors, or \
             give --backup-file so pages go to disk meanwhile"
        )
    }
}

/// Why one copy of a far page (or the backup file) did not serve a read.
#[derive(Debug, thiserror::Error)]
pub enum CopyFailure {
    /// No answer within the failover delay (the next copy was asked).
    #[error("donor {donor} did not answer within the failover delay")]
    Slow { donor: String },
    /// The copy failed its seal check: never installed.
    #[error(transparent)]
    Sealed(SealError),
    /// The answer held no page.
    #[error("donor {donor} answered a page read with no page")]
    NoPage { donor: String },
    /// The request could not be sent (its connection is down).
    #[error(transparent)]
    Send(Box<RuntimeError>),
    /// The request failed (connection lost, refused, timed out).
    #[error(transparent)]
    Transport(TransportError),
    /// The backup file's copy failed its seal check.
    #[error("backup file: {0}")]
    BackupSealed(SealError),
    /// The backup file never got this page.
    #[error("the backup file never got this page")]
    BackupMissing,
    /// Reading the backup file failed.
    #[error(transparent)]
    Backup(Box<RuntimeError>),
    /// No copy was anywhere to ask.
    #[error("its slab is on no donor")]
    Nowhere,
}

/// Every copy of a far page failed to serve a read: what went wrong with each, in order.
#[derive(Debug, thiserror::Error)]
#[error("{}", .0.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))]
pub struct ReadFailed(pub Vec<CopyFailure>);

/// Why a page could not be sealed or opened.
#[derive(Debug, thiserror::Error)]
pub enum SealError {
    /// The kernel's random source failed when the key was drawn.
    #[error("drawing the sealing key from the kernel's random source failed: {0}")]
    Key(getrandom::Error),
    /// The donor's copy does not verify: altered, another page's, or an older version.
    #[error(
        "far page {far}: the donor's copy failed its integrity check (altered, swapped with \
         another page, or an older version); it was not installed"
    )]
    Tampered {
        /// The far page number.
        far: u64,
    },
    /// No seal was ever made for this far page (it was never sent).
    #[error("far page {far}: no sealed copy was ever sent, so none can be opened")]
    NeverSealed {
        /// The far page number.
        far: u64,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    fn full(taken_bytes: u64) -> RuntimeError {
        RuntimeError::DonorsFull {
            live: 2,
            donors: 3,
            addr: "127.0.0.1:7070".into(),
            taken_bytes,
            filled_bytes: taken_bytes,
            source: Box::new(farmem_transport::TransportError::BadAddress {
                addr: "x".into(),
                reason: "capacity exhausted".into(),
            }),
        }
    }

    #[test]
    fn a_full_donor_is_the_same_lasting_cause_whatever_this_program_holds() {
        assert_eq!(full(1 << 20).lasting_cause(), full(9 << 20).lasting_cause());
        assert_ne!(full(1 << 20).to_string(), full(9 << 20).to_string());
        let cause = full(1 << 20).lasting_cause();
        assert!(cause.contains("127.0.0.1:7070 refused") && cause.contains("capacity exhausted"));
        assert!(!cause.contains("this program holds"), "{cause}");
    }
}
