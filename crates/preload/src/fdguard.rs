//! The program's descriptor calls around farmem's own descriptors ([`farmem_fds`]): a
//! program that closes every descriptor (a daemon, `subprocess` before `exec`), or `dup2`s onto
//! a number farmem uses, would take the runtime's userfaultfd or sockets from under it (a
//! Python program that `dup2`ed a file onto 4 to 8 crashed at its next fault).
//!
//! The exported `close`, `close_range`, `closefrom`, `dup2` and `dup3` (exports.rs) ask here.
//! farmem's own calls (runtime threads, or a program thread inside farmem code) pass
//! through, and a close of its own forgets the descriptor. For the program's calls: `close` of
//! a farmem descriptor returns 0 and leaves it open (the caller was closing "everything"; no
//! program is handed these numbers), `close_range` and `closefrom` close the ranges around
//! them, and `dup2`/`dup3` onto one fail with EBUSY (numbers from 64 below the descriptor
//! limit, so a program naming one is rare; it gets an error, not a broken runtime).

/// Whether the calling thread runs farmem code (a runtime thread, or inside the library).
pub(crate) fn in_farmem() -> bool {
    // SAFETY: reads this thread's initial-exec flags and an atomic; no other effect.
    unsafe { crate::shim::fmp_uses_glibc() != 0 }
}

/// What a `close(fd)` should do.
pub(crate) enum Close {
    /// Close it (the program's own descriptor, or farmem closing one of its own).
    Close,
    /// Leave it open and report success: the program closing farmem's descriptor.
    Keep,
}

pub(crate) fn close(fd: i32) -> Close {
    if in_farmem() {
        farmem_fds::forget(fd);
        return Close::Close;
    }
    if farmem_fds::is_protected(fd) {
        Close::Keep
    } else {
        Close::Close
    }
}

/// Whether the program may make `new` a copy of another descriptor (`dup2`, `dup3`).
pub(crate) fn may_replace(new: i32) -> bool {
    in_farmem() || !farmem_fds::is_protected(new)
}

/// Inclusive ranges, at most one more than farmem's descriptors.
pub(crate) type Ranges = [(u32, u32); farmem_fds::SLOTS + 1];

/// The ranges of `first..=last` to close for the program: every number but farmem's, in
/// ascending order, in a fixed array (this runs in forked children before `exec`: no
/// allocation) with their count.
pub(crate) fn ranges_to_close(first: u32, last: u32) -> (Ranges, usize) {
    if in_farmem() {
        return ranges_around(first, last, &[]);
    }
    let (ours, n) = farmem_fds::protected_in(first, last);
    ranges_around(first, last, &ours[..n])
}

/// `first..=last` without the ascending numbers `skip`.
fn ranges_around(first: u32, last: u32, skip: &[i32]) -> (Ranges, usize) {
    let mut out = [(0u32, 0u32); farmem_fds::SLOTS + 1];
    let mut k = 0;
    let mut from = first;
    for &fd in skip {
        let fd = fd as u32;
        if !(first..=last).contains(&fd) {
            continue;
        }
        if fd > from {
            out[k] = (from, fd - 1);
            k += 1;
        }
        from = fd + 1;
    }
    if from <= last {
        out[k] = (from, last);
        k += 1;
    }
    (out, k)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_skip_farmem_descriptors() {
        let (r, n) = ranges_around(3, u32::MAX, &[900, 901, 960]);
        assert_eq!(&r[..n], &[(3, 899), (902, 959), (961, u32::MAX)]);
        let (r, n) = ranges_around(3, 9, &[900]);
        assert_eq!(&r[..n], &[(3, 9)]);
        let (r, n) = ranges_around(900, 901, &[900, 901]);
        assert_eq!(&r[..n], &[]);
        let (_, n) = ranges_around(9, 3, &[]);
        assert_eq!(n, 0);
        let (r, n) = ranges_around(5, 5, &[]);
        assert_eq!(&r[..n], &[(5, 5)]);
    }
}
