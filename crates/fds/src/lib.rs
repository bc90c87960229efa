//! farmem-fds: the descriptors farmem keeps open inside a program's process (its
//! userfaultfds, the sockets to the host tier, the donors and the tree's coordinator, the
//! backup file), kept out of the program's way; and how farmem opens the files and
//! directories it makes for a user ([`files`], [`dirs`]) so other local users cannot redirect
//! them.
//!
//! A program owns its descriptor table and uses it freely: a shell runs `exec 4>file`
//! (`dup2` onto 4), a daemon closes every descriptor above 2, `subprocess` closes them all in
//! the child before `exec`. farmem's descriptors are opened when the program starts, so they
//! are the lowest free numbers (3, 4, 5, ...): a Python program that `dup2`ed a file onto 4
//! to 8 replaced the runtime's userfaultfd, and the next fault crashed it (SIGSEGV).
//!
//! # Design
//!
//! - [`protect`] moves a descriptor to a high number ([`floor`]: 64 below the soft
//!   `RLIMIT_NOFILE`, at most 960, at least 10; `F_DUPFD_CLOEXEC`, the lowest free number
//!   there), far from those programs name (0 to 9 and 200/255, the `flock` idiom, bash's
//!   own), and records it with its inode.
//! - The preload library's `close`, `close_range`, `closefrom`, `dup2` and `dup3` skip or
//!   refuse a recorded descriptor when the program calls them ([`is_protected`]); farmem's
//!   own closes [`forget`] it. A recorded number whose inode changed (closed by a path that did
//!   not forget it, then reused by the program) is not protected any more.
//! - No locks: a fixed table of atomic slots, so the checks are safe in a forked child and in
//!   a signal handler.
//!
//! # Limitations
//!
//! - A program that makes the system call itself (`syscall(SYS_close_range, ...)`) still
//!   closes them; so does a static binary (which farmem does not page anyway).
//! - At most [`SLOTS`] descriptors are recorded; more are moved but not protected.

pub mod dirs;
pub mod files;

use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicI32, AtomicU64, Ordering};

/// Descriptors recorded at most (a forked child inherits its parent's records, and adds its
/// runtime's own).
pub const SLOTS: usize = 256;

/// A free slot.
const FREE: i32 = -1;

#[allow(clippy::declare_interior_mutable_const)]
const EMPTY_FD: AtomicI32 = AtomicI32::new(FREE);
#[allow(clippy::declare_interior_mutable_const)]
const EMPTY_INO: AtomicU64 = AtomicU64::new(0);

static FDS: [AtomicI32; SLOTS] = [EMPTY_FD; SLOTS];
static INODES: [AtomicU64; SLOTS] = [EMPTY_INO; SLOTS];
/// The lowest number ever recorded: most calls are about lower ones and stop here.
static LOWEST: AtomicI32 = AtomicI32::new(i32::MAX);

/// Where [`protect`] moves descriptors: 64 below the soft `RLIMIT_NOFILE` (so a program
/// reaching its limit meets them last), at most 960 (a descriptor at N makes the kernel size
/// the table for N; and below 1024, for `select`), at least 10.
pub fn floor() -> i32 {
    let soft = rustix::process::getrlimit(rustix::process::Resource::Nofile)
        .current
        .unwrap_or(1024);
    soft.min(1024).saturating_sub(64).max(10) as i32
}

/// Moves `fd` to a number at or above [`floor`] (close-on-exec) and records it. If it cannot
/// be moved (the table is full up there), it is recorded where it is.
pub fn protect<T: From<OwnedFd> + Into<OwnedFd>>(fd: T) -> T {
    let fd: OwnedFd = fd.into();
    let fd = match rustix::io::fcntl_dupfd_cloexec(&fd, floor()) {
        Ok(high) => high, // the low one is closed when `fd` drops here
        Err(_) => fd,
    };
    record(&fd);
    T::from(fd)
}

/// Records `fd` without moving it.
fn record(fd: &OwnedFd) {
    let ino = inode(fd.as_fd());
    let raw = fd.as_raw_fd();
    // A record of the same number is stale (closed without `forget`, the number reused): two
    // records would leave the number protected after `forget` drops one of them.
    for slot in FDS.iter() {
        let _ = slot.compare_exchange(raw, FREE, Ordering::AcqRel, Ordering::Relaxed);
    }
    for (slot, ino_slot) in FDS.iter().zip(INODES.iter()) {
        if slot.load(Ordering::Relaxed) == FREE {
            ino_slot.store(ino, Ordering::Relaxed);
            if slot
                .compare_exchange(FREE, raw, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
            {
                LOWEST.fetch_min(raw, Ordering::AcqRel);
                return;
            }
        }
    }
}

fn inode(fd: rustix::fd::BorrowedFd<'_>) -> u64 {
    rustix::fs::fstat(fd).map_or(0, |st| st.st_ino)
}

fn slot_of(fd: RawFd) -> Option<usize> {
    if fd < LOWEST.load(Ordering::Acquire) {
        return None;
    }
    FDS.iter().position(|s| s.load(Ordering::Acquire) == fd)
}

/// Whether `fd` is one of farmem's (recorded, and still the same file). A recorded number
/// that now names another file was closed without [`forget`]; its record is dropped.
pub fn is_protected(fd: RawFd) -> bool {
    let Some(i) = slot_of(fd) else {
        return false;
    };
    let same = inode_of_number(fd) == Some(INODES[i].load(Ordering::Relaxed));
    if !same {
        let _ = FDS[i].compare_exchange(fd, FREE, Ordering::AcqRel, Ordering::Relaxed);
    }
    same
}

/// The inode `fd` names now, if it is open.
fn inode_of_number(fd: RawFd) -> Option<u64> {
    // SAFETY: `fd` may have been closed, or reused, by another thread meanwhile; fstat of such
    // a number only fails (EBADF) or describes the other file, which the caller compares. The
    // borrow lives for this one call and nothing is read or written through it.
    let borrowed = unsafe { rustix::fd::BorrowedFd::borrow_raw(fd) };
    rustix::fs::fstat(borrowed).ok().map(|st| st.st_ino)
}

/// farmem closes `fd`: it is not protected any more.
pub fn forget(fd: RawFd) {
    if let Some(i) = slot_of(fd) {
        let _ = FDS[i].compare_exchange(fd, FREE, Ordering::AcqRel, Ordering::Relaxed);
    }
}

/// Recorded descriptors in `first..=last`, ascending, in a fixed array (no allocation: this
/// runs in forked children before `exec`) with their count.
pub fn protected_in(first: u32, last: u32) -> ([RawFd; SLOTS], usize) {
    let mut out = [FREE; SLOTS];
    let mut n = 0;
    for s in FDS.iter() {
        let fd = s.load(Ordering::Acquire);
        if fd != FREE && (first..=last).contains(&(fd as u32)) && is_protected(fd) {
            out[n] = fd;
            n += 1;
        }
    }
    out[..n].sort_unstable();
    (out, n)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file() -> std::fs::File {
        std::fs::File::open("/proc/self/stat").unwrap()
    }

    /// The tests share the process's descriptor table and the registry: one at a time (the
    /// second one needs a number another test could take meanwhile).
    static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

    #[test]
    fn a_protected_descriptor_moves_high_and_is_known_until_forgotten() {
        let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        let f = protect(file());
        let fd = f.as_raw_fd();
        assert!(fd >= floor(), "{fd} below the floor {}", floor());
        assert!(is_protected(fd));
        let (list, n) = protected_in(0, u32::MAX);
        assert!(list[..n].contains(&fd));
        assert!(!is_protected(0));
        forget(fd);
        assert!(!is_protected(fd));
    }

    #[test]
    fn a_number_reused_for_another_file_is_not_protected() {
        let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        let f = protect(file());
        let fd = f.as_raw_fd();
        // Closed behind the registry's back (no preload library here to forget it), then the
        // number reused for another file.
        drop(f);
        let other: OwnedFd = std::fs::File::open("/proc/self/status").unwrap().into();
        let reused = rustix::io::fcntl_dupfd_cloexec(&other, fd).unwrap();
        assert_eq!(reused.as_raw_fd(), fd, "the number was free again");
        assert!(!is_protected(fd), "another file at a recorded number");
    }

    #[test]
    fn a_number_closed_unforgotten_and_protected_again_is_recorded_once() {
        let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        let f = protect(file());
        let fd = f.as_raw_fd();
        drop(f); // closed behind the registry's back
                 // The same file again (same inode), at the same number, protected again.
        let again = protect(file());
        assert_eq!(again.as_raw_fd(), fd, "the number was free again");
        assert!(is_protected(fd));
        forget(fd);
        assert!(!is_protected(fd), "one forget unprotects it");
    }
}
