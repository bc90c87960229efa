//! The shutdown doorbell: lets the runtime's threads wait for work without a short timeout.
//!
//! Each thread used to wake every 50 to 100 ms only to look at the shutdown flag (and the
//! tree thread to report): about 100 wake-ups a second in every process of a tree, idle or
//! not. Now each sleeps until it has work, or at most [`IDLE_WAIT`] (a safety net, should a
//! notification ever be missed), and shutdown rings this bell:
//! - the fault thread polls its userfaultfd and the bell's eventfd together;
//! - the tier thread selects on its reclaim channel and the bell's channel, which ringing
//!   disconnects;
//! - the condition-variable waiters (evictor, sender, prefetch thread) check the flag under
//!   their lock before waiting, and `Runtime::drop` takes each lock once after setting it, so a
//!   notification is never lost between their check and their wait.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::time::Duration;

use crossbeam_channel::{Receiver, Sender};
use rustix::event::{eventfd, EventfdFlags};

use crate::sync::Mutex;

/// The longest an idle runtime thread sleeps without being woken.
pub(crate) const IDLE_WAIT: Duration = Duration::from_secs(1);

pub(crate) struct Doorbell {
    fd: OwnedFd,
    tx: Mutex<Option<Sender<()>>>,
    rx: Receiver<()>,
}

impl Doorbell {
    pub(crate) fn new() -> std::io::Result<Doorbell> {
        let fd = eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK)?;
        let (tx, rx) = crossbeam_channel::bounded(0);
        Ok(Doorbell {
            fd: farmem_fds::protect(fd),
            tx: Mutex::new(Some(tx)),
            rx,
        })
    }

    /// Wakes every thread waiting on the bell, now and from now on.
    pub(crate) fn ring(&self) {
        let _ = rustix::io::write(&self.fd, &1u64.to_ne_bytes());
        self.tx.lock().take();
    }

    /// Readable once rung.
    pub(crate) fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// Disconnected once rung.
    pub(crate) fn receiver(&self) -> &Receiver<()> {
        &self.rx
    }
}
