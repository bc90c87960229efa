//! Copying one far slab to a new donor, chunk by chunk and paced to `heal_rate_bytes` a
//! second: re-replication ([`crate::threads::heal`]) and migration off a donor that wants its memory back
//! ([`crate::threads::migrate`]) share it.
//!
//! The new copy is added to the slab first, marked filling: the sender writes it like the
//! others, reads skip it. Each chunk is copied with the copy gate held exclusively and every
//! write to replicas holds it shared, so no chunk copy can overwrite a newer page.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use farmem_transport::{PageAddr, PageWrite};

use crate::error::RuntimeError;
use crate::far::Home;
use crate::shared::Shared;
use crate::slabs::replicas::{Replica, Replicas};
use farmem_proto::PAGE_SIZE;

/// Where a slab's pages are copied from.
#[derive(Clone, Copy)]
pub(crate) enum Source {
    /// A complete copy on a donor.
    Donor(Replica),
    Backup,
}

/// Copies far slab `idx` (replicas `r`) from `source` to a new donor, chunk by chunk, paced.
pub(crate) fn copy_slab(
    sh: &Shared,
    idx: u64,
    r: Replicas,
    source: Source,
) -> Result<(), RuntimeError> {
    let far = &sh.far;
    let dest = {
        // Held from the allocation until the copy has joined the slab, as the sender holds it
        // from placing a slab to writing it: no donor is declared dead, or taken back after a
        // restart, in between. Taken back meanwhile, its piece was one of the donor's old
        // process, and the copy joined under an id that names nothing there, or another of
        // this client's slabs (writes to it failed for good: a soak run killed for 30 s of
        // failed write-back).
        let _gate = far.copy_gate.read();
        let new = far.alloc_replicas(1, &r)?;
        let Some(&dest) = new.as_slice().first() else {
            return Err(RuntimeError::Internal("a new copy was allocated nowhere"));
        };
        if far
            .update_replicas(idx, |x| {
                x.push(Replica {
                    filling: true,
                    ..dest
                })
            })
            .is_none_or(|x| !x.has(dest.donor))
        {
            drop(_gate);
            far.release(dest);
            return Err(RuntimeError::Internal("the slab left the donors meanwhile"));
        }
        dest
    };
    let started = Instant::now();
    let mut copied = 0u64;
    let chunk = farmem_transport::MAX_BATCH_PAGES as u64;
    let first_far = idx * far.slab_pages;
    let mut page = 0u64;
    while page < far.slab_pages {
        let n = chunk.min(far.slab_pages - page);
        if let Err(e) = copy_chunk(sh, idx, source, dest, first_far, page, n) {
            far.drop_replica(idx, dest.donor);
            return Err(e);
        }
        page += n;
        copied += n * PAGE_SIZE as u64;
        // Pace: never ahead of heal_rate_bytes a second.
        let due = Duration::from_secs_f64(copied as f64 / sh.heal_rate_bytes.max(1) as f64);
        if let Some(wait) = due.checked_sub(started.elapsed()) {
            std::thread::sleep(wait);
        }
        if sh.shutdown.load(Ordering::Relaxed) {
            return Ok(());
        }
    }
    let done = {
        let _gate = far.copy_gate.write();
        far.update_replicas(idx, |x| x.filled(dest.donor))
            .is_some_and(|x| x.has(dest.donor))
    };
    if done {
        let mut s = sh.stats.lock();
        s.s.slabs_healed += 1;
        s.s.heal_bytes += copied;
    }
    Ok(())
}

/// Copies pages `page..page + n` of far slab `idx` from `source` to donor `dest`'s slab, with
/// the copy gate held (no write to replicas in between). Refuses ([`RuntimeError::CopyGone`])
/// once the slab no longer has either copy: a donor declared dead loses its copies, and once
/// re-adopted after a restart ([`crate::threads::heal`]) the same slab ids may name other
/// slabs, so reading the source there would copy another slab's pages, and writing the
/// destination would overwrite them.
#[allow(clippy::too_many_arguments)]
fn copy_chunk(
    sh: &Shared,
    idx: u64,
    source: Source,
    dest: Replica,
    first_far: u64,
    page: u64,
    n: u64,
) -> Result<(), RuntimeError> {
    let far = &sh.far;
    let _gate = far.copy_gate.write();
    let Some((Home::Donors(now), _)) = far.home(first_far) else {
        return Err(RuntimeError::CopyGone { idx });
    };
    let source_kept = match source {
        Source::Donor(x) => now.readable().any(|y| y == x),
        Source::Backup => true,
    };
    let filling = Replica {
        filling: true,
        ..dest
    };
    if !source_kept || !now.as_slice().contains(&filling) {
        return Err(RuntimeError::CopyGone { idx });
    }
    let mut data = vec![0u8; n as usize * PAGE_SIZE];
    let mut present = vec![true; n as usize];
    match source {
        Source::Donor(x) => {
            let d = x.donor;
            let addrs: Vec<PageAddr> = (page..page + n).map(|p| x.addr(p as u32)).collect();
            far.donors[d]
                .write
                .read_pages(&addrs, &mut data)
                .map_err(|source| {
                    far.on_error(d, &source);
                    RuntimeError::Donor {
                        addr: far.donors[d].write.addr().to_string(),
                        step: "reading a slab to copy it",
                        source,
                    }
                })?;
        }
        Source::Backup => {
            let b = far.backup.as_ref().expect("a backup source has a backup");
            for (i, buf) in data.chunks_exact_mut(PAGE_SIZE).enumerate() {
                present[i] = b.read(first_far + page + i as u64, buf)?;
            }
        }
    }
    let writes: Vec<PageWrite<'_>> = data
        .chunks_exact(PAGE_SIZE)
        .enumerate()
        .filter(|(i, _)| present[*i])
        .map(|(i, d)| PageWrite {
            addr: dest.addr((page + i as u64) as u32),
            data: d,
        })
        .collect();
    if writes.is_empty() {
        return Ok(());
    }
    far.donors[dest.donor]
        .write
        .write_pages(&writes)
        .map_err(|source| {
            far.on_error(dest.donor, &source);
            RuntimeError::Donor {
                addr: far.donors[dest.donor].write.addr().to_string(),
                step: "writing a slab's new copy",
                source,
            }
        })
}
