//! farmem's threads take none of the program's signals.
//!
//! A signal sent to the process (`kill`, a timer, a terminal's SIGINT) goes to any one of its
//! threads that does not block it. Delivered to a farmem thread, the program's handler runs
//! there: a handler that reads paged memory on the fault thread waits for a page only that
//! thread can bring in (a hang, seen with a SIGALRM handler reading the heap every
//! millisecond), and on any other farmem thread it holds paging up while it runs. A signal the
//! program's own threads all block would also run its handler, where without farmem it stays
//! pending.
//!
//! So every farmem thread blocks every signal: the runtime's threads block them first thing
//! ([`block_all`], from [`crate::shared::Shared::thread_started`] and the preload library's
//! thread hook), and code that starts threads from a program thread (the runtime's start, the
//! preload library's constructor and its forked child's restart) runs under [`Blocked`], so a
//! new thread inherits the full mask from its first instruction: a signal sent between its
//! creation and its own block cannot reach it either.
//!
//! Faults a farmem thread raises itself (SIGSEGV, SIGBUS) are still delivered: the kernel
//! forces synchronous signals through a blocked mask. glibc's internal signals (thread
//! cancellation, `setxid`) are never blocked (`sigfillset` leaves them out).

use nix::sys::signal::{pthread_sigmask, SigSet, SigmaskHow};

/// Blocks every signal in the calling thread, for good.
pub fn block_all() {
    // Fails only for an invalid `how`.
    let _ = pthread_sigmask(SigmaskHow::SIG_BLOCK, Some(&SigSet::all()), None);
}

/// Every signal blocked in the calling thread until dropped (then its mask is restored), so
/// that the threads it starts meanwhile inherit the blocked mask.
#[must_use = "the mask is restored when the guard is dropped"]
pub struct Blocked {
    old: SigSet,
}

impl Blocked {
    /// Blocks every signal in the calling thread.
    pub fn new() -> Blocked {
        let mut old = SigSet::empty();
        let _ = pthread_sigmask(SigmaskHow::SIG_BLOCK, Some(&SigSet::all()), Some(&mut old));
        Blocked { old }
    }
}

impl Default for Blocked {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for Blocked {
    fn drop(&mut self) {
        let _ = pthread_sigmask(SigmaskHow::SIG_SETMASK, Some(&self.old), None);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nix::sys::signal::Signal;

    fn blocked_now(sig: Signal) -> bool {
        SigSet::thread_get_mask().unwrap().contains(sig)
    }

    #[test]
    fn threads_started_under_the_guard_block_everything_and_the_mask_comes_back() {
        std::thread::spawn(|| {
            assert!(!blocked_now(Signal::SIGUSR1));
            let child = {
                let _g = Blocked::new();
                assert!(blocked_now(Signal::SIGUSR1) && blocked_now(Signal::SIGALRM));
                std::thread::spawn(|| (blocked_now(Signal::SIGUSR1), blocked_now(Signal::SIGINT)))
            };
            assert_eq!(child.join().unwrap(), (true, true), "inherited at creation");
            assert!(
                !blocked_now(Signal::SIGUSR1),
                "the caller's mask is restored"
            );
            block_all();
            assert!(blocked_now(Signal::SIGTERM));
        })
        .join()
        .unwrap();
    }
}
