//! What a runtime thread meets while it serves and cannot return to anyone: each failure a
//! [`ThreadError`] (what failed, on which page, why), counted by its [`Failure`] kind, logged
//! and kept as the stats' `last_error` ([`crate::shared::Shared::report`]).

use farmem_uffd::UffdError;

use crate::error::{ReadFailed, RuntimeError};
use crate::pages::PageState;

/// Which counter an error a runtime thread meets goes to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Failure {
    /// Bringing a page in (the fault path, a fork's fetch): `fetch_errors`.
    Fetch,
    /// Sending pages out (write-back, write-through): `send_errors`.
    Send,
}

/// A failure met by the fault loop, fork handling, the sender or the tier thread.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ThreadError {
    #[error("fault loop: waiting for userfaultfd events: {0}")]
    WaitEvents(#[source] rustix::io::Errno),
    #[error("fault loop: {0}")]
    ReadEvents(#[source] UffdError),
    /// The page state says resident but the page is not mapped: a bug, and the page is lost.
    #[error(
        "internal error: page {addr:#x} is taken for resident ({state:?}) but is not mapped; \
         its contents are lost: the faulting thread (process {pid}, thread {thread}) gets \
         SIGBUS (please report this)"
    )]
    ResidentNotMapped {
        addr: usize,
        state: PageState,
        pid: u32,
        thread: u32,
    },
    #[error("write-protect fault at {addr:#x}: {source}")]
    WriteProtect {
        addr: usize,
        #[source]
        source: UffdError,
    },
    #[error("moving page {addr:#x} back from the pool: {source}")]
    MoveBack {
        addr: usize,
        #[source]
        source: UffdError,
    },
    #[error("page {addr:#x}: its far slab has no memory slab (far page {far})")]
    NoMemSlab { addr: usize, far: u64 },
    #[error(
        "fetching page {addr:#x} (far page {far}) failed (try {attempt} of {attempts}): {source}"
    )]
    Fetch {
        addr: usize,
        far: u64,
        attempt: u32,
        attempts: u32,
        #[source]
        source: ReadFailed,
    },
    #[error(
        "before fork: bringing evicted pages back failed ({0}); the child will read zeros where \
         those pages are"
    )]
    BringBackBeforeFork(#[source] RuntimeError),
    #[error(
        "before fork: {pages} page(s) are not in local memory at fork (first {first:#x}: \
         {state:?}, {}present); the child will read zeros there",
        if *.present { "" } else { "not " }
    )]
    NotBackBeforeFork {
        pages: usize,
        first: usize,
        state: PageState,
        present: bool,
    },
    #[error(
        "write-back of {pages} evicted pages failed (kept in the write-back pool, retrying): \
         {source}{}",
        repeats_said(*.repeats)
    )]
    WriteBack {
        pages: usize,
        /// Times the same failure was met since it was last said.
        repeats: u64,
        #[source]
        source: RuntimeError,
    },
    #[error("writing the host tier through to the donors failed (kept in memory, retrying): {0}")]
    WriteThrough(#[source] RuntimeError),
    #[error(
        "the node asked for {slabs} slabs back, but no local memory could be mapped to hold \
         them ({source}); they stay in the host tier"
    )]
    GiveBackNoMemory {
        slabs: usize,
        #[source]
        source: std::io::Error,
    },
}

/// " (and N times more since said)" after a lasting failure said again.
fn repeats_said(repeats: u64) -> String {
    if repeats == 0 {
        String::new()
    } else {
        format!(" (and {repeats} times more since said)")
    }
}

impl ThreadError {
    /// The counter it goes to.
    pub(crate) fn kind(&self) -> Failure {
        match self {
            ThreadError::WriteBack { .. }
            | ThreadError::WriteThrough(_)
            | ThreadError::GiveBackNoMemory { .. } => Failure::Send,
            ThreadError::WaitEvents(_)
            | ThreadError::ReadEvents(_)
            | ThreadError::ResidentNotMapped { .. }
            | ThreadError::WriteProtect { .. }
            | ThreadError::MoveBack { .. }
            | ThreadError::NoMemSlab { .. }
            | ThreadError::Fetch { .. }
            | ThreadError::BringBackBeforeFork(_)
            | ThreadError::NotBackBeforeFork { .. } => Failure::Fetch,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::CopyFailure;

    fn write_back(repeats: u64) -> ThreadError {
        ThreadError::WriteBack {
            pages: 64,
            repeats,
            source: RuntimeError::Internal("the donor hung up"),
        }
    }

    #[test]
    fn a_lasting_failure_said_again_counts_its_repeats() {
        assert_eq!(
            write_back(0).to_string(),
            "write-back of 64 evicted pages failed (kept in the write-back pool, retrying): \
             internal error: the donor hung up"
        );
        assert_eq!(
            write_back(7).to_string(),
            "write-back of 64 evicted pages failed (kept in the write-back pool, retrying): \
             internal error: the donor hung up (and 7 times more since said)"
        );
    }

    #[test]
    fn pages_missing_at_fork_name_the_first_and_whether_it_is_mapped() {
        let e = |present| ThreadError::NotBackBeforeFork {
            pages: 3,
            first: 0x7f00_0000_1000,
            state: PageState::Remote,
            present,
        };
        assert_eq!(
            e(false).to_string(),
            "before fork: 3 page(s) are not in local memory at fork (first 0x7f0000001000: \
             Remote, not present); the child will read zeros there"
        );
        assert!(e(true).to_string().contains("Remote, present);"));
    }

    #[test]
    fn a_failed_fetch_names_the_page_the_try_and_each_copy() {
        let e = ThreadError::Fetch {
            addr: 0x2000,
            far: 17,
            attempt: 2,
            attempts: 3,
            source: ReadFailed(vec![
                CopyFailure::Slow {
                    donor: "10.0.0.2:7070".into(),
                },
                CopyFailure::Nowhere,
            ]),
        };
        assert_eq!(
            e.to_string(),
            "fetching page 0x2000 (far page 17) failed (try 2 of 3): donor 10.0.0.2:7070 did \
             not answer within the failover delay; its slab is on no donor"
        );
    }

    #[test]
    fn each_failure_goes_to_its_counter() {
        assert_eq!(write_back(0).kind(), Failure::Send);
        assert_eq!(
            ThreadError::WriteThrough(RuntimeError::Internal("x")).kind(),
            Failure::Send
        );
        let no_memory = ThreadError::GiveBackNoMemory {
            slabs: 2,
            source: std::io::Error::from_raw_os_error(12),
        };
        assert_eq!(no_memory.kind(), Failure::Send);
        assert_eq!(
            ThreadError::NoMemSlab { addr: 0, far: 1 }.kind(),
            Failure::Fetch
        );
        assert_eq!(
            ThreadError::BringBackBeforeFork(RuntimeError::Internal("x")).kind(),
            Failure::Fetch
        );
        assert_eq!(
            ThreadError::ResidentNotMapped {
                addr: 0,
                state: PageState::ResidentClean,
                pid: 1,
                thread: 1
            }
            .kind(),
            Failure::Fetch
        );
    }
}
