//! Who may join a tree's budget: the coordinator asks this about every connection, naming the
//! peer by the pid the kernel gives (SO_PEERCRED), never by the pid its Hello claims.
//!
//! # Design
//! - [`Admission::Descendants`]: `farmem run`'s rule. A process belongs to the tree when the
//!   parent links of /proc/PID/stat lead from it to the root. `farmem run` is the tree's
//!   subreaper, so a process whose parent died first (a daemon, a double fork) is reparented
//!   to the root and still belongs. The process is named by the kernel, so a Hello claiming
//!   another pid changes nothing but a debug line.
//! - [`Admission::Anyone`]: every process that can open the socket, under the pid its Hello
//!   gives. For simulating many processes of a tree from one (the coordinator's tests).
//!
//! # Limitations
//! - A process in a deeper pid namespace is named by its pid in the coordinator's namespace
//!   (what the kernel gives); the pid it knows itself by is only logged.
//! - Membership is checked once, when the process connects: a process that leaves the tree
//!   later (it cannot, short of its ancestors' deaths, which reparent it to the root) keeps
//!   its share until it disconnects.

use std::io;

/// Which connecting processes may join the tree's budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// Every process that can open the socket (mode 0600: the user's own), under the pid its
    /// Hello gives. For simulating a tree's processes from one process.
    Anyone,
    /// Only `root` and its descendants, under the pid the kernel gives.
    Descendants {
        /// The tree's root: `farmem run` itself (the subreaper of the tree).
        root: u32,
    },
}

/// The most parent links followed before a chain counts as not leading to the root (pid
/// chains are far shorter; this only bounds a walk that races with exits and pid reuse).
const MAX_DEPTH: usize = 4096;

impl Admission {
    /// Whether the process the kernel names `peer` may join. `Err` says why not, for the log.
    pub fn admits(&self, peer: u32) -> Result<(), String> {
        let root = match *self {
            Admission::Anyone => return Ok(()),
            Admission::Descendants { root } => root,
        };
        let mut pid = peer;
        for _ in 0..MAX_DEPTH {
            if pid == root {
                return Ok(());
            }
            if pid <= 1 {
                break;
            }
            pid = match parent_of(pid) {
                Ok(p) => p,
                Err(e) => return Err(format!("cannot read the parent of process {pid}: {e}")),
            };
        }
        Err(format!(
            "process {peer} is not the tree's root ({root}) nor one of its descendants"
        ))
    }

    /// The pid a joined process is known by: the kernel's, except under [`Admission::Anyone`].
    pub fn pid_of(&self, peer: u32, claimed: u32) -> u32 {
        match self {
            Admission::Anyone => claimed,
            Admission::Descendants { .. } => peer,
        }
    }
}

/// The parent pid of `pid`, from /proc/PID/stat.
fn parent_of(pid: u32) -> io::Result<u32> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    parse_parent(&text).ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("/proc/{pid}/stat has no parent pid"),
        )
    })
}

/// The parent pid in /proc/PID/stat text: the field after the state, which follows the last
/// ')' (the command name may hold spaces and parentheses).
fn parse_parent(stat: &str) -> Option<u32> {
    let after = &stat[stat.rfind(')')? + 1..];
    after.split_whitespace().nth(1)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_parent_follows_the_last_parenthesis() {
        assert_eq!(parse_parent("42 (sh) S 7 42 42 0 -1"), Some(7));
        assert_eq!(parse_parent("42 (a) b) (c) R 9 1 1"), Some(9));
        assert_eq!(parse_parent("42 (sh"), None);
        assert_eq!(parse_parent("42 (sh) S x"), None);
    }

    #[test]
    fn a_child_belongs_to_its_parent_s_tree_and_not_the_other_way() {
        let me = std::process::id();
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .expect("spawning sleep");
        let kid = child.id();
        let mine = Admission::Descendants { root: me };
        assert_eq!(mine.admits(me), Ok(()));
        assert_eq!(mine.admits(kid), Ok(()));
        let theirs = Admission::Descendants { root: kid };
        let e = theirs.admits(me).unwrap_err();
        assert!(e.contains(&format!("process {me} is not")), "{e}");
        assert!(theirs.admits(1).is_err());
        assert_eq!(Admission::Anyone.admits(me), Ok(()));
        assert_eq!(mine.pid_of(kid, 5), kid);
        assert_eq!(Admission::Anyone.pid_of(kid, 5), 5);
        child.kill().unwrap();
        child.wait().unwrap();
        let e = mine.admits(kid).unwrap_err();
        assert!(e.contains("cannot read the parent"), "{e}");
    }
}
