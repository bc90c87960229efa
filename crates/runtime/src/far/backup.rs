//! The local backup file (`--backup-file`, Infiniswap's disk backup): every page written to
//! donors is also written to a file on this machine, in the background, so a page whose every
//! replica is gone is read from there instead of being lost. With no live donor left, pages are
//! written to the file directly (the program then pages at disk speed, and loses nothing).
//!
//! # Design
//!
//! - Far page `f` lives at byte `f * 4096`: the file is sparse, as big as the far address
//!   space used. The bytes are those sent to the donors (sealed, when pages are sealed), so a
//!   page read back is opened and checked the same way.
//! - Writes are queued and written by the backup thread (`farmem-backup`); a page is written
//!   back (reclaimable) once its donors acknowledged it, never waiting for the disk.
//! - A read first waits until every write queued before it is on the file ([`Backup::flush`]),
//!   so the file never hands back an older version of a page than the one last sent; pages
//!   never written to the file are reported absent, never read as zeros.
//! - The file is created new (`O_CREAT|O_EXCL|O_NOFOLLOW`: an existing file or a link planted
//!   at the name is refused, it may be another program's or another user's), mode 0600, and
//!   removed when the runtime ends: it holds nothing once the program is gone.
//!
//! # Limitations
//!
//! - The file is not synced: it protects against losing donors, not against this machine
//!   crashing (the program dies with it anyway).
//! - Freed far pages keep their old bytes in the file until reused (the file never shrinks).

use std::collections::VecDeque;
use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use crate::sync::{Condvar, Mutex};

use crate::error::RuntimeError;
use farmem_proto::PAGE_SIZE;

/// Pages queued at most before a writer waits for the disk (64 MiB).
const MAX_QUEUED: usize = 16 * 1024;

/// The backup file.
pub(crate) struct Backup {
    file: File,
    path: PathBuf,
    q: Mutex<Queue>,
    /// Signalled when pages are queued, written, or the queue shrinks.
    cv: Condvar,
    pub(crate) pages_written: AtomicU64,
    pub(crate) pages_read: AtomicU64,
}

#[derive(Default)]
struct Queue {
    pages: VecDeque<(u64, Box<[u8]>)>,
    /// Sequence numbers: pages queued so far, and written (or failed) so far.
    queued: u64,
    done: u64,
    /// Far pages present in the file, a bit each.
    present: Vec<u64>,
    /// The last write error, reported once.
    failed: Option<String>,
    stop: bool,
}

impl Queue {
    fn set_present(&mut self, far: u64, yes: bool) {
        let (w, b) = ((far / 64) as usize, far % 64);
        if self.present.len() <= w {
            self.present.resize(w + 1, 0);
        }
        if yes {
            self.present[w] |= 1 << b;
        } else {
            self.present[w] &= !(1 << b);
        }
    }

    fn is_present(&self, far: u64) -> bool {
        self.present
            .get((far / 64) as usize)
            .is_some_and(|w| w & (1 << (far % 64)) != 0)
    }
}

impl Backup {
    /// Creates the backup file at `path` (refusing an existing file).
    pub(crate) fn create(path: &Path) -> Result<Backup, RuntimeError> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            // O_EXCL already refuses a link at the name; said again, plainly.
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .mode(0o600)
            .open(path)
            .map(farmem_fds::protect)
            .map_err(|source| RuntimeError::BackupFile {
                path: path.to_path_buf(),
                source,
            })?;
        Ok(Backup {
            file,
            path: path.to_path_buf(),
            q: Mutex::new(Queue::default()),
            cv: Condvar::new(),
            pages_written: AtomicU64::new(0),
            pages_read: AtomicU64::new(0),
        })
    }

    /// Queues far page `far`'s bytes for the file (waiting while the queue is full).
    pub(crate) fn write(&self, far: u64, data: &[u8]) {
        let mut q = self.q.lock();
        while q.pages.len() >= MAX_QUEUED && !q.stop {
            self.cv.wait(&mut q);
        }
        q.pages.push_back((far, data.into()));
        q.queued += 1;
        drop(q);
        self.cv.notify_all();
    }

    /// Writes far page `far`'s bytes to the file now (after everything queued before).
    pub(crate) fn write_now(&self, far: u64, data: &[u8]) -> Result<(), RuntimeError> {
        self.flush();
        let r = self.file.write_all_at(data, far * PAGE_SIZE as u64);
        let mut q = self.q.lock();
        q.set_present(far, r.is_ok());
        drop(q);
        r.map_err(|source| RuntimeError::BackupFile {
            path: self.path.clone(),
            source,
        })?;
        self.pages_written.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Waits until every page queued so far is on the file.
    pub(crate) fn flush(&self) {
        let mut q = self.q.lock();
        let target = q.queued;
        while q.done < target && !q.stop {
            self.cv.wait_for(&mut q, Duration::from_millis(100));
        }
    }

    /// Reads far page `far` from the file into `out`: `Ok(false)` if the file never got it.
    pub(crate) fn read(&self, far: u64, out: &mut [u8]) -> Result<bool, RuntimeError> {
        self.flush();
        if !self.q.lock().is_present(far) {
            return Ok(false);
        }
        self.file
            .read_exact_at(out, far * PAGE_SIZE as u64)
            .map_err(|source| RuntimeError::BackupFile {
                path: self.path.clone(),
                source,
            })?;
        self.pages_read.fetch_add(1, Ordering::Relaxed);
        Ok(true)
    }

    /// Ends the backup thread.
    #[cfg(test)]
    fn stop(&self) {
        self.q.lock().stop = true;
        self.cv.notify_all();
    }

    /// Writes queued pages until stopped (or `shutdown`). One batch at a time, without the
    /// queue lock.
    /// The backup thread's body (`farmem-backup`): writes queued pages until `shutdown`.
    pub(crate) fn run(&self, shutdown: &AtomicBool) {
        loop {
            let batch: Vec<(u64, Box<[u8]>)> = {
                let mut q = self.q.lock();
                while q.pages.is_empty() && !q.stop {
                    if shutdown.load(Ordering::Relaxed) {
                        q.stop = true;
                        break;
                    }
                    self.cv.wait_for(&mut q, Duration::from_millis(100));
                }
                if q.pages.is_empty() {
                    return;
                }
                let n = q.pages.len().min(256);
                q.pages.drain(..n).collect()
            };
            let results: Vec<(u64, std::io::Result<()>)> = batch
                .iter()
                .map(|(far, data)| (*far, self.file.write_all_at(data, far * PAGE_SIZE as u64)))
                .collect();
            let mut q = self.q.lock();
            for (far, r) in results {
                match r {
                    Ok(()) => {
                        q.set_present(far, true);
                        self.pages_written.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(e) => {
                        // An older copy must not be read back as the page.
                        q.set_present(far, false);
                        if q.failed.is_none() {
                            tracing::error!(
                                "writing the backup file {}: {e}; pages not in it are lost \
                                 if all their donors are",
                                self.path.display()
                            );
                            q.failed = Some(e.to_string());
                        }
                    }
                }
                q.done += 1;
            }
            drop(q);
            self.cv.notify_all();
        }
    }
}

impl Drop for Backup {
    fn drop(&mut self) {
        if let Err(e) = std::fs::remove_file(&self.path) {
            tracing::warn!("removing the backup file {}: {e}", self.path.display());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn pages_read_back_are_the_last_written_and_absent_ones_are_said_so() {
        let dir = std::env::temp_dir().join(format!("farmem-backup-test-{}", std::process::id()));
        let _ = std::fs::remove_file(&dir);
        let b = Arc::new(Backup::create(&dir).unwrap());
        let writer = {
            let b = b.clone();
            std::thread::spawn(move || b.run(&AtomicBool::new(false)))
        };
        let page = |v: u8| vec![v; PAGE_SIZE];
        b.write(3, &page(1));
        b.write(3, &page(2));
        b.write(700, &page(7));
        let mut out = vec![0u8; PAGE_SIZE];
        assert!(b.read(3, &mut out).unwrap());
        assert_eq!(out, page(2));
        assert!(
            !b.read(4, &mut out).unwrap(),
            "never written: absent, not zeros"
        );
        b.write_now(4, &page(9)).unwrap();
        assert!(b.read(4, &mut out).unwrap());
        assert_eq!(out, page(9));
        assert!(b.read(700, &mut out).unwrap());
        assert_eq!(out, page(7));
        assert!(Backup::create(&dir).is_err(), "an existing file is refused");
        b.stop();
        writer.join().unwrap();
        drop(b);
        assert!(!dir.exists(), "removed when the runtime ends");
    }
}
