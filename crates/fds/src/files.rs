//! The files farmem writes on a user's behalf (`--stats`, each process's stats file,
//! `--record-trace`, `farmem sim --svg`), opened so that another local user cannot redirect
//! them.
//!
//! farmem often runs as root and writes where the user says, which may be a directory other
//! users can write to. A plain `File::create` there follows a symbolic link planted at the
//! name (or at a guessable temporary name next to it) and truncates whatever it points to: a
//! root-owned file, overwritten by root. Here every writer goes through [`replace`] or
//! [`create_stream`], which never follow a link in the last component of the path and refuse
//! a file that is not this user's own regular file.
//!
//! It lives in farmem-fds because this is the lowest crate every writer (cli, preload,
//! runtime, sim) can depend on without a wrong-way dependency (it needs only rustix), and the
//! files are descriptors farmem opens inside the program's process like the others here.
//!
//! # Design
//!
//! - The directory named by the path is opened once (`O_DIRECTORY`; a link in the directory
//!   part is the user's own choice and is followed) and every later step is relative to that
//!   descriptor (`openat`, `renameat`, `unlinkat`), so the directory cannot be swapped
//!   between the check and the write.
//! - [`replace`]: writes a temporary file next to the target, named `.NAME.farmem-` plus 16
//!   random hex digits (`getrandom`, not the pid: unguessable), created with
//!   `O_CREAT|O_EXCL|O_NOFOLLOW|O_CLOEXEC`, mode 0600, then renamed over the target. A reader
//!   sees the old file or the new one, never half of one. An existing target must be a regular
//!   file owned by this user (effective uid); a link planted at the target after that check is
//!   replaced by the rename, not followed.
//! - [`create_stream`]: opens the target itself, `O_CREAT|O_NOFOLLOW|O_NONBLOCK` without
//!   `O_TRUNC`, checks the opened file (`fstat`: a regular file owned by this user) and only
//!   then truncates it: a hard link to another user's file, or a FIFO, planted between the
//!   check and the open is refused before a byte of it changes. New files get mode 0600.
//!
//! # Limitations
//!
//! - The files are not synced to disk.
//! - A target that is another user's file is refused even where the directory would let
//!   this user replace it (remove it first, or choose another name).

use std::fs::File;
use std::io::Write;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

use rustix::fs::{AtFlags, FileType, Mode, OFlags};

/// Mode of the files farmem creates: readable by their owner only.
pub const FILE_MODE: u32 = 0o600;

/// Why a file could not be written; every message names the path and what to do.
#[derive(Debug, thiserror::Error)]
pub enum FileError {
    /// The path names no file (it ends in `/`, `.` or `..`).
    #[error("{path} names no file: give a path ending in a file name")]
    NoFileName {
        /// The path given.
        path: PathBuf,
    },
    /// The directory of the path could not be opened.
    #[error("cannot open the directory {dir}: {source} (check it exists and is yours)")]
    OpenDir {
        /// The directory.
        dir: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// What is at the path could not be looked at.
    #[error("cannot look at {path}: {source}")]
    Inspect {
        /// The path.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A symbolic link is at the path: farmem does not write through one.
    #[error(
        "{path} is a symbolic link: farmem does not write through one (another user may have \
         planted it); give the path of the file itself, or remove the link"
    )]
    Symlink {
        /// The path.
        path: PathBuf,
    },
    /// Something other than a regular file is at the path (a FIFO, a device, a directory).
    #[error("{path} is {kind}, not a regular file: give the path of a regular file or a new name")]
    NotRegular {
        /// The path.
        path: PathBuf,
        /// What it is ("a FIFO", "a character device", ...).
        kind: &'static str,
    },
    /// The file at the path belongs to another user.
    #[error(
        "{path} belongs to uid {owner}, not to this user (uid {me}): farmem writes only its \
         user's own files; remove it or give another name"
    )]
    NotOwned {
        /// The path.
        path: PathBuf,
        /// Its owner.
        owner: u32,
        /// This process's effective uid.
        me: u32,
    },
    /// No random name could be drawn for the temporary file.
    #[error("cannot draw a random name for a temporary file: {0}")]
    Random(getrandom::Error),
    /// The temporary file (or the file itself) could not be created.
    #[error("cannot create {path}: {source} (check the directory is writable)")]
    Create {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// Writing or truncating the file failed.
    #[error("cannot write {path}: {source}")]
    Write {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The temporary file could not be renamed over the target.
    #[error("cannot rename the new file over {path}: {source}")]
    Rename {
        /// The target.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
}

/// `path`'s directory (opened) and last component.
struct Target<'a> {
    path: &'a Path,
    dir: OwnedFd,
    name: &'a std::ffi::OsStr,
}

impl<'a> Target<'a> {
    fn open(path: &'a Path) -> Result<Target<'a>, FileError> {
        let name = path.file_name().ok_or_else(|| FileError::NoFileName {
            path: path.to_path_buf(),
        })?;
        let dir_path = match path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d,
            _ => Path::new("."),
        };
        let dir = rustix::fs::open(
            dir_path,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| FileError::OpenDir {
            dir: dir_path.to_path_buf(),
            source: e.into(),
        })?;
        Ok(Target { path, dir, name })
    }

    /// Whether something is at the name; refuses anything but this user's regular file.
    fn check_existing(&self) -> Result<bool, FileError> {
        match rustix::fs::statat(&self.dir, self.name, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(st) => check_stat(self.path, &st).map(|()| true),
            Err(rustix::io::Errno::NOENT) => Ok(false),
            Err(e) => Err(FileError::Inspect {
                path: self.path.to_path_buf(),
                source: e.into(),
            }),
        }
    }
}

/// Reads `path` if it is a regular file owned by `owner` of at most `limit` bytes, without
/// following a link at its name or blocking on a FIFO; `None` otherwise. For readers that run
/// as root over files another user's programs write (`farmem top` reading stats files): such a
/// user could plant a link to a root-only file, a FIFO that never answers, or a huge file.
pub fn read_owned(path: &Path, owner: u32, limit: u64) -> Option<Vec<u8>> {
    use std::io::Read;
    let fd = rustix::fs::open(
        path,
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .ok()?;
    let st = rustix::fs::fstat(&fd).ok()?;
    let regular = FileType::from_raw_mode(st.st_mode) == FileType::RegularFile;
    if !regular || st.st_uid != owner || st.st_size as u64 > limit {
        return None;
    }
    let mut bytes = Vec::new();
    File::from(fd).take(limit).read_to_end(&mut bytes).ok()?;
    Some(bytes)
}

/// Refuses `st` unless it is a regular file owned by this process's effective uid.
fn check_stat(path: &Path, st: &rustix::fs::Stat) -> Result<(), FileError> {
    let kind = match FileType::from_raw_mode(st.st_mode) {
        FileType::RegularFile => None,
        FileType::Symlink => {
            return Err(FileError::Symlink {
                path: path.to_path_buf(),
            })
        }
        FileType::Fifo => Some("a FIFO"),
        FileType::CharacterDevice => Some("a character device"),
        FileType::BlockDevice => Some("a block device"),
        FileType::Directory => Some("a directory"),
        FileType::Socket => Some("a socket"),
        FileType::Unknown => Some("of an unknown type"),
    };
    if let Some(kind) = kind {
        return Err(FileError::NotRegular {
            path: path.to_path_buf(),
            kind,
        });
    }
    let me = rustix::process::geteuid().as_raw();
    if st.st_uid != me {
        return Err(FileError::NotOwned {
            path: path.to_path_buf(),
            owner: st.st_uid,
            me,
        });
    }
    Ok(())
}

/// A fresh temporary name for a file next to `name`: `.NAME.farmem-` and 16 random hex digits.
fn temp_name(name: &std::ffi::OsStr) -> Result<std::ffi::OsString, FileError> {
    let mut bytes = [0u8; 8];
    getrandom::getrandom(&mut bytes).map_err(FileError::Random)?;
    let mut t = std::ffi::OsString::from(".");
    t.push(name);
    t.push(format!(".farmem-{:016x}", u64::from_ne_bytes(bytes)));
    Ok(t)
}

/// Creates a new temporary file in `t`'s directory (never an existing name, never through a
/// link): its name and the open file.
fn create_temp(t: &Target<'_>) -> Result<(std::ffi::OsString, File), FileError> {
    let tmp = temp_name(t.name)?;
    let fd = rustix::fs::openat(
        &t.dir,
        &tmp,
        OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::from_raw_mode(FILE_MODE),
    )
    .map_err(|e| FileError::Create {
        path: t.path.with_file_name(&tmp),
        source: e.into(),
    })?;
    Ok((tmp, File::from(fd)))
}

/// Replaces the file at `path` with what `write` writes, atomically (see the module docs):
/// a temporary file in the same directory, renamed over `path`. An existing `path` must be a
/// regular file owned by this user. The new file has mode [`FILE_MODE`].
pub fn replace(
    path: &Path,
    write: impl FnOnce(&mut dyn Write) -> std::io::Result<()>,
) -> Result<(), FileError> {
    let t = Target::open(path)?;
    t.check_existing()?;
    let (tmp, mut file) = create_temp(&t)?;
    let written = write(&mut file).and_then(|()| file.flush());
    drop(file);
    let done = written
        .map_err(|source| FileError::Write {
            path: path.to_path_buf(),
            source,
        })
        .and_then(|()| {
            // rename(2) replaces whatever is at the name, a link planted since the check
            // included, without following it.
            rustix::fs::renameat(&t.dir, &tmp, &t.dir, t.name).map_err(|e| FileError::Rename {
                path: path.to_path_buf(),
                source: e.into(),
            })
        });
    if done.is_err() {
        let _ = rustix::fs::unlinkat(&t.dir, &tmp, AtFlags::empty());
    }
    done
}

/// Creates (or truncates) the file at `path` for writing as a stream (see the module docs):
/// never through a link, and an existing file only if it is this user's regular file. A new
/// file has mode [`FILE_MODE`].
pub fn create_stream(path: &Path) -> Result<File, FileError> {
    let t = Target::open(path)?;
    // Refuse early, before an open that could have effects of its own (a device, a FIFO).
    t.check_existing()?;
    let fd = rustix::fs::openat(
        &t.dir,
        t.name,
        OFlags::WRONLY | OFlags::CREATE | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC,
        Mode::from_raw_mode(FILE_MODE),
    )
    .map_err(|e| match e {
        // What was checked was swapped for a link meanwhile.
        rustix::io::Errno::LOOP => FileError::Symlink {
            path: path.to_path_buf(),
        },
        e => FileError::Create {
            path: path.to_path_buf(),
            source: e.into(),
        },
    })?;
    // The file opened may not be the one checked (a hard link or a FIFO planted meanwhile):
    // check it before changing it.
    let st = rustix::fs::fstat(&fd).map_err(|e| FileError::Inspect {
        path: path.to_path_buf(),
        source: e.into(),
    })?;
    check_stat(path, &st)?;
    let write_err = |e: rustix::io::Errno| FileError::Write {
        path: path.to_path_buf(),
        source: e.into(),
    };
    rustix::fs::ftruncate(&fd, 0).map_err(write_err)?;
    rustix::fs::fcntl_setfl(&fd, OFlags::empty()).map_err(write_err)?;
    Ok(File::from(fd))
}

/// Checks, before a program starts, that [`replace`] or [`create_stream`] could write `path`:
/// an existing file must be this user's regular file, and a new file (one byte) must be
/// creatable in its directory; the probe file is removed.
pub fn check_writable(path: &Path) -> Result<(), FileError> {
    let t = Target::open(path)?;
    t.check_existing()?;
    let (tmp, mut file) = create_temp(&t)?;
    let written = file.write_all(b"\n").and_then(|()| file.flush());
    drop(file);
    let _ = rustix::fs::unlinkat(&t.dir, &tmp, AtFlags::empty());
    written.map_err(|source| FileError::Write {
        path: path.to_path_buf(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{MetadataExt, PermissionsExt};

    fn scratch() -> PathBuf {
        let mut b = [0u8; 8];
        getrandom::getrandom(&mut b).unwrap();
        let d =
            std::env::temp_dir().join(format!("farmem-files-test-{:016x}", u64::from_ne_bytes(b)));
        std::fs::create_dir(&d).unwrap();
        d
    }

    fn entries(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }

    #[test]
    fn read_owned_reads_only_an_owners_regular_file_within_the_limit() {
        let d = scratch();
        let me = rustix::process::geteuid().as_raw();
        let p = d.join("stats.json");
        std::fs::write(&p, b"{}").unwrap();
        assert_eq!(read_owned(&p, me, 16).as_deref(), Some(&b"{}"[..]));
        assert_eq!(read_owned(&p, me + 1, 16), None, "another owner's");
        assert_eq!(read_owned(&p, me, 1), None, "over the limit");
        let link = d.join("link.json");
        std::os::unix::fs::symlink(&p, &link).unwrap();
        assert_eq!(read_owned(&link, me, 16), None, "a link is not followed");
        // A FIFO nobody writes: refused at once, not waited on.
        let fifo = d.join("fifo.json");
        rustix::fs::mknodat(
            rustix::fs::CWD,
            &fifo,
            FileType::Fifo,
            Mode::from_raw_mode(0o600),
            0,
        )
        .unwrap();
        assert_eq!(read_owned(&fifo, me, 16), None);
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn replace_writes_a_new_private_file_and_leaves_no_temporary() {
        let d = scratch();
        let p = d.join("stats.json");
        replace(&p, |w| w.write_all(b"one")).unwrap();
        replace(&p, |w| w.write_all(b"two")).unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"two");
        assert_eq!(
            std::fs::metadata(&p).unwrap().permissions().mode() & 0o777,
            0o600
        );
        assert_eq!(entries(&d), vec!["stats.json"]);
        let failed = replace(&p, |_| Err(std::io::Error::other("no")));
        assert!(matches!(failed, Err(FileError::Write { .. })), "{failed:?}");
        assert_eq!(std::fs::read(&p).unwrap(), b"two");
        assert_eq!(entries(&d), vec!["stats.json"], "the temporary is removed");
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn links_and_other_kinds_are_refused_and_left_alone() {
        let d = scratch();
        let victim = d.join("victim");
        std::fs::write(&victim, b"keep").unwrap();
        let link = d.join("link");
        std::os::unix::fs::symlink(&victim, &link).unwrap();
        let r = replace(&link, |w| w.write_all(b"x"));
        assert!(matches!(r, Err(FileError::Symlink { .. })), "{r:?}");
        let r = create_stream(&link);
        assert!(matches!(r, Err(FileError::Symlink { .. })), "{r:?}");
        let r = check_writable(&link);
        assert!(matches!(r, Err(FileError::Symlink { .. })), "{r:?}");
        assert_eq!(std::fs::read(&victim).unwrap(), b"keep");
        let r = create_stream(Path::new("/dev/null"));
        assert!(
            matches!(
                r,
                Err(FileError::NotRegular {
                    kind: "a character device",
                    ..
                })
            ),
            "{r:?}"
        );
        let r = replace(&d, |w| w.write_all(b"x"));
        assert!(matches!(r, Err(FileError::NotRegular { .. })), "{r:?}");
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn create_stream_truncates_this_users_file() {
        let d = scratch();
        let p = d.join("trace");
        std::fs::write(&p, b"old bytes").unwrap();
        let mut f = create_stream(&p).unwrap();
        f.write_all(b"new").unwrap();
        drop(f);
        assert_eq!(std::fs::read(&p).unwrap(), b"new");
        let me = rustix::process::geteuid().as_raw();
        assert_eq!(std::fs::metadata(&p).unwrap().uid(), me);
        check_writable(&p).unwrap();
        assert_eq!(entries(&d), vec!["trace"]);
        std::fs::remove_dir_all(&d).unwrap();
    }
}
