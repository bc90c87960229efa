//! Private directories a killed `farmem run` left behind.
//!
//! `farmem run` keeps its process tree's sockets and stats in `$TMPDIR/farmem-run-PID-XXXXXXXX`
//! and its private node's socket in `$TMPDIR/farmem-node-PID-XXXXXXXX` (PID: its own), and
//! removes both when it ends. Killed with SIGKILL, it cannot: each such run left two
//! directories. So every `farmem run` first removes those of runs that are gone.
//!
//! # Design
//!
//! A directory is removed only when all of these hold: the temporary directory belongs to root
//! or this user and others cannot rename entries in it (not writable by them, or sticky); its
//! name is one of the two forms; it is a directory (not a symbolic link) owned by this user
//! that others cannot write to; no process with its PID exists (in this PID namespace); and
//! none of the sockets in it accepts a connection. The last test keeps the directories of a
//! run in another PID namespace that shares the temporary directory (a container): its PID is
//! not seen here, but its sockets answer.
//!
//! The directory is opened once, without following a link, and checked, probed and emptied
//! through that descriptor ([`farmem_fds::dirs::OwnedDir`]): another user who swaps it for a
//! link after the check, or plants links in a directory of theirs named like farmem's, makes
//! farmem neither follow nor remove anything outside it.

use std::path::Path;

use farmem_fds::dirs::OwnedDir;

/// The name prefixes of the directories `farmem run` makes.
const PREFIXES: [&str; 2] = ["farmem-run-", "farmem-node-"];

/// The PID in a directory name of the form PREFIX-PID-XXXXXXXX (8 hex digits).
fn pid_of(name: &str) -> Option<u32> {
    let rest = PREFIXES.iter().find_map(|p| name.strip_prefix(p))?;
    let (pid, tag) = rest.split_once('-')?;
    (tag.len() == 8 && tag.bytes().all(|b| b.is_ascii_hexdigit())).then_some(())?;
    pid.parse().ok()
}

/// Whether a socket in `dir` accepts a connection (a live node or coordinator).
fn has_live_socket(dir: &OwnedDir) -> bool {
    let Some(sockets) = dir.sockets() else {
        return true; // cannot tell: keep it
    };
    sockets
        .iter()
        .any(|s| std::os::unix::net::UnixStream::connect(s).is_ok())
}

/// Removes the directories under `base` left by runs that are gone; returns how many. Nothing
/// in a `base` that others may write to without the sticky bit (they could rename another
/// run's live directory to a dead run's name there).
pub fn sweep(base: &Path) -> usize {
    if let Err(e) = farmem_fds::dirs::check_shared_parent(base) {
        tracing::debug!("not sweeping {}: {e}", base.display());
        return 0;
    }
    let Ok(entries) = std::fs::read_dir(base) else {
        return 0;
    };
    let mut removed = 0;
    for e in entries.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(pid_of) else {
            continue;
        };
        let path = e.path();
        // Not a link, this user's, closed to others: else not farmem's, kept.
        let Some(dir) = OwnedDir::open(base, &e.file_name()) else {
            continue;
        };
        if Path::new(&format!("/proc/{pid}")).exists() || has_live_socket(&dir) {
            continue;
        }
        if dir.remove().is_ok() {
            tracing::debug!(
                "removed {}, left by a farmem run that was killed",
                path.display()
            );
            removed += 1;
        }
    }
    removed
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixListener;

    #[test]
    fn names_are_read_strictly() {
        assert_eq!(pid_of("farmem-run-123-0000abcd"), Some(123));
        assert_eq!(pid_of("farmem-node-9-ffffffff"), Some(9));
        for bad in [
            "farmem-run-123",
            "farmem-run-123-abc",
            "farmem-run-x-0000abcd",
            "farmem-run-test-123",
            "farmem-donor-1-0000abcd",
            "farmem-node-1-0000abcg",
        ] {
            assert_eq!(pid_of(bad), None, "{bad}");
        }
    }

    #[test]
    fn only_directories_of_runs_that_are_gone_are_removed() {
        let base = tempfile::tempdir().unwrap();
        // A PID that existed and is gone.
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let dead = child.id();
        child.wait().unwrap();
        let me = std::process::id();
        let dir = |name: String| {
            let p = base.path().join(name);
            std::fs::create_dir(&p).unwrap();
            p
        };
        // Gone, with a stale socket (bound, then its listener closed): removed.
        let stale = dir(format!("farmem-node-{dead}-0000abcd"));
        drop(UnixListener::bind(stale.join("node.sock")).unwrap());
        let stale_run = dir(format!("farmem-run-{dead}-00001234"));
        // Gone here but its socket answers (another PID namespace): kept.
        let answering = dir(format!("farmem-run-{dead}-0000ffff"));
        let _listener = UnixListener::bind(answering.join("budget.sock")).unwrap();
        // Alive: kept. Not ours by name: kept.
        let alive = dir(format!("farmem-run-{me}-0000abcd"));
        let other = dir(format!("farmem-donor-{dead}-0000abcd"));
        assert_eq!(sweep(base.path()), 2);
        assert!(!stale.exists() && !stale_run.exists());
        assert!(answering.exists() && alive.exists() && other.exists());
    }
}
