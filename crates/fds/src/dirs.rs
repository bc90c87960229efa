//! The directories farmem makes and removes in places other users share (`$TMPDIR`, the
//! node's socket directory), so that no other local user can steer them.
//!
//! # Design
//!
//! - [`check_shared_parent`]: a directory farmem makes names in must belong to root or to this
//!   user, and if others may write to it, it must have the sticky bit (as `/tmp` does):
//!   otherwise another user could rename farmem's entries away and put links in their place.
//! - [`private_dir`]: `BASE/PREFIX-PID-XXXXXXXX` with 32 random bits (`getrandom`), made with
//!   `mkdir` (which never follows a link and fails on an existing name: a planted name is
//!   skipped, up to 16 draws), mode 0700.
//! - [`OwnedDir`]: such a directory opened `O_DIRECTORY|O_NOFOLLOW` relative to its parent's
//!   descriptor, and kept only if the opened directory (`fstat`) belongs to this user and
//!   others cannot write to it. What is in it is read, connected to and removed through that
//!   descriptor (`/proc/self/fd/N/NAME`, `unlinkat`), never through the path again: a
//!   directory swapped for a link between the check and the removal is not followed, and
//!   links inside are removed, not followed.
//!
//! # Limitations
//!
//! - The last `rmdir` of the emptied directory goes by name (there is no `rmdir` of a
//!   descriptor); it is done only if the name still holds the same directory, and `rmdir`
//!   removes only an empty directory, so a swap in that instant costs at most an empty
//!   directory of this user's.

use std::ffi::{OsStr, OsString};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use rustix::fs::{AtFlags, FileType, Mode, OFlags};

/// How deep [`OwnedDir::remove`] goes (farmem's directories are one or two levels deep).
const MAX_DEPTH: usize = 8;

/// Why a shared directory is refused or a private one could not be made.
#[derive(Debug, thiserror::Error)]
pub enum DirError {
    /// The directory could not be looked at.
    #[error("cannot look at the directory {dir}: {source}")]
    Inspect {
        /// The directory.
        dir: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// It belongs to a user other than root and this one.
    #[error(
        "{dir} belongs to uid {owner}: farmem makes its files only in a directory of root's or \
         of this user's; use another directory (TMPDIR, --socket)"
    )]
    NotOwned {
        /// The directory.
        dir: PathBuf,
        /// Its owner.
        owner: u32,
    },
    /// Others may write to it and it lacks the sticky bit.
    #[error(
        "{dir} (mode {mode:o}) may be written by other users and lacks the sticky bit, so they \
         could replace farmem's files there: use another directory (TMPDIR, --socket), or \
         `chmod +t` it"
    )]
    OpenToOthers {
        /// The directory.
        dir: PathBuf,
        /// Its mode bits.
        mode: u32,
    },
    /// No random name could be drawn.
    #[error("cannot draw a random directory name: {0}")]
    Random(getrandom::Error),
    /// `mkdir` failed.
    #[error("cannot create the directory {dir}: {source}")]
    Create {
        /// The directory.
        dir: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// 16 random names were all taken.
    #[error("16 random names under {base} were all taken: clean the directory up")]
    NamesTaken {
        /// The parent directory.
        base: PathBuf,
    },
}

/// Refuses `dir` as a place for farmem's files unless it belongs to root or this user and,
/// when others may write to it, has the sticky bit.
pub fn check_shared_parent(dir: &Path) -> Result<(), DirError> {
    let st = rustix::fs::stat(dir).map_err(|e| DirError::Inspect {
        dir: dir.to_path_buf(),
        source: e.into(),
    })?;
    check_parent_stat(dir, &st)
}

fn check_parent_stat(dir: &Path, st: &rustix::fs::Stat) -> Result<(), DirError> {
    let me = rustix::process::geteuid().as_raw();
    if st.st_uid != 0 && st.st_uid != me {
        return Err(DirError::NotOwned {
            dir: dir.to_path_buf(),
            owner: st.st_uid,
        });
    }
    let mode = st.st_mode & 0o7777;
    if mode & 0o022 != 0 && mode & 0o1000 == 0 {
        return Err(DirError::OpenToOthers {
            dir: dir.to_path_buf(),
            mode,
        });
    }
    Ok(())
}

/// Makes a new directory `base/PREFIX-PID-XXXXXXXX` (this process's pid, 8 random hex
/// digits), mode 0700, after [`check_shared_parent`] on `base`.
pub fn private_dir(base: &Path, prefix: &str) -> Result<PathBuf, DirError> {
    check_shared_parent(base)?;
    for _ in 0..16 {
        let mut bytes = [0u8; 4];
        getrandom::getrandom(&mut bytes).map_err(DirError::Random)?;
        let dir = base.join(format!(
            "{prefix}{}-{:08x}",
            std::process::id(),
            u32::from_ne_bytes(bytes)
        ));
        match rustix::fs::mkdir(&dir, Mode::from_raw_mode(0o700)) {
            Ok(()) => return Ok(dir),
            Err(rustix::io::Errno::EXIST) => continue,
            Err(e) => {
                return Err(DirError::Create {
                    dir,
                    source: e.into(),
                })
            }
        }
    }
    Err(DirError::NamesTaken {
        base: base.to_path_buf(),
    })
}

/// A directory of this user's that others cannot write to, opened without following a link;
/// see the module docs.
pub struct OwnedDir {
    parent: OwnedFd,
    name: OsString,
    fd: OwnedFd,
    ino: (u64, u64),
}

impl OwnedDir {
    /// Opens `parent/name` if it is a directory (not a link to one) that this user owns and
    /// others cannot write to; `None` otherwise (or if it cannot be opened).
    pub fn open(parent: &Path, name: &OsStr) -> Option<OwnedDir> {
        let parent = rustix::fs::open(
            parent,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .ok()?;
        Self::open_at(parent, name)
    }

    fn open_at(parent: OwnedFd, name: &OsStr) -> Option<OwnedDir> {
        let fd = rustix::fs::openat(
            &parent,
            name,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .ok()?;
        let st = rustix::fs::fstat(&fd).ok()?;
        let me = rustix::process::geteuid().as_raw();
        if st.st_uid != me || st.st_mode & 0o022 != 0 {
            return None;
        }
        Some(OwnedDir {
            parent,
            name: name.to_os_string(),
            ino: (st.st_dev, st.st_ino),
            fd,
        })
    }

    /// The sockets in it (not links to sockets), each as a path through the directory's
    /// descriptor (`/proc/self/fd/N/NAME`: short enough for a socket address, and pinned to the
    /// directory opened); `None` if it cannot be read.
    pub fn sockets(&self) -> Option<Vec<PathBuf>> {
        let here = PathBuf::from(format!("/proc/self/fd/{}", self.fd.as_raw_fd()));
        let list = entries(self.fd.as_fd())?;
        Some(
            list.into_iter()
                .filter(|(_, kind)| *kind == FileType::Socket)
                .map(|(name, _)| here.join(name))
                .collect(),
        )
    }

    /// Removes everything in it (links and sockets as names, never followed), then the
    /// directory itself if its name still holds it.
    pub fn remove(self) -> std::io::Result<()> {
        empty(self.fd.as_fd(), 0)?;
        let st = rustix::fs::statat(&self.parent, &self.name, AtFlags::SYMLINK_NOFOLLOW)?;
        if (st.st_dev, st.st_ino) != self.ino {
            return Err(std::io::Error::other(
                "the directory was replaced meanwhile",
            ));
        }
        rustix::fs::unlinkat(&self.parent, &self.name, AtFlags::REMOVEDIR)?;
        Ok(())
    }
}

/// Removes the directory at `path` if it is an [`OwnedDir`] (else leaves it).
pub fn remove_private_dir(path: &Path) -> std::io::Result<()> {
    let (Some(parent), Some(name)) = (path.parent(), path.file_name()) else {
        return Err(std::io::Error::other("not a directory's path"));
    };
    let parent = if parent.as_os_str().is_empty() {
        Path::new(".")
    } else {
        parent
    };
    match OwnedDir::open(parent, name) {
        Some(d) => d.remove(),
        None => Err(std::io::Error::other(
            "not a directory of this user's that only it can write",
        )),
    }
}

fn entries(fd: rustix::fd::BorrowedFd<'_>) -> Option<Vec<(OsString, FileType)>> {
    let dir = rustix::fs::Dir::read_from(fd).ok()?;
    let mut out = Vec::new();
    for e in dir {
        let e = e.ok()?;
        let name = OsStr::from_bytes(e.file_name().to_bytes());
        if name == "." || name == ".." {
            continue;
        }
        let kind = match e.file_type() {
            FileType::Unknown => rustix::fs::statat(fd, name, AtFlags::SYMLINK_NOFOLLOW)
                .map_or(FileType::Unknown, |st| FileType::from_raw_mode(st.st_mode)),
            k => k,
        };
        out.push((name.to_os_string(), kind));
    }
    Some(out)
}

/// Removes what is in the directory `fd`, depth first, never following a link.
fn empty(fd: rustix::fd::BorrowedFd<'_>, depth: usize) -> std::io::Result<()> {
    if depth > MAX_DEPTH {
        return Err(std::io::Error::other("directories nested too deep"));
    }
    let list = entries(fd).ok_or_else(|| std::io::Error::other("cannot read a directory"))?;
    for (name, kind) in list {
        if kind == FileType::Directory {
            let sub = rustix::fs::openat(
                fd,
                &name,
                OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::empty(),
            )?;
            empty(sub.as_fd(), depth + 1)?;
            rustix::fs::unlinkat(fd, &name, AtFlags::REMOVEDIR)?;
        } else {
            rustix::fs::unlinkat(fd, &name, AtFlags::empty())?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_private_dir_is_made_and_removed_without_following_links_inside() {
        let base = std::env::temp_dir();
        let dir = private_dir(&base, "farmem-dirs-test-").unwrap();
        let st = rustix::fs::stat(&dir).unwrap();
        assert_eq!(st.st_mode & 0o777, 0o700);
        let outside = base.join(format!("{}-outside", dir.display()));
        std::fs::write(&outside, b"keep").unwrap();
        std::fs::create_dir(dir.join("sub")).unwrap();
        std::os::unix::fs::symlink(&outside, dir.join("sub/link")).unwrap();
        std::os::unix::fs::symlink(&base, dir.join("dirlink")).unwrap();
        remove_private_dir(&dir).unwrap();
        assert!(!dir.exists());
        assert_eq!(std::fs::read(&outside).unwrap(), b"keep");
        std::fs::remove_file(&outside).unwrap();
    }

    #[test]
    fn a_link_to_a_directory_is_not_opened() {
        let base = std::env::temp_dir();
        let dir = private_dir(&base, "farmem-dirs-test-").unwrap();
        let link = dir.join("link");
        std::os::unix::fs::symlink(&base, &link).unwrap();
        assert!(OwnedDir::open(&dir, OsStr::new("link")).is_none());
        remove_private_dir(&dir).unwrap();
    }

    #[test]
    fn a_directory_open_to_others_without_sticky_bit_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let dir = private_dir(&std::env::temp_dir(), "farmem-dirs-test-").unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
        let r = private_dir(&dir, "x-");
        assert!(matches!(r, Err(DirError::OpenToOthers { .. })), "{r:?}");
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o1777)).unwrap();
        let inner = private_dir(&dir, "x-").unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
        remove_private_dir(&inner).unwrap();
        remove_private_dir(&dir).unwrap();
    }
}
