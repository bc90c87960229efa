//! Where the copies of far slabs lent on donors are *now*: a table the lender keeps current for
//! its forked children ([`crate::fork`], [`crate::lentdonors`]).
//!
//! # Why
//!
//! A child borrows the parent's donor copies as they were at the fork. Lent pages are frozen
//! (never rewritten), but their copies move: a donor dies and the parent's heal thread copies
//! the slab to another donor, drops the dead copy, and so on. A child that knew only the
//! fork-time copies lost those pages (SIGBUS) once every one of them had died, although the
//! parent still held the slab elsewhere (the soak's forking server met it).
//!
//! # Design
//!
//! - One table per lender process, made at its first fork that lends donor pages and kept
//!   for its life: a `MAP_SHARED` memfd mapping, which every child inherits at the same
//!   address (and its children in turn). The memfd itself is closed at once.
//! - Indexed directly by far slab (slabs past [`SLABS`] are not published: such a child keeps
//!   the copies it had at the fork). An entry is the slab's readable copies in the lender's
//!   own donor numbering (its [`crate::lentdonors::Lender`]'s addresses), behind a sequence
//!   word: odd while the lender writes it, never written when 0.
//! - The lender publishes a slab when it lends it, and again whenever that slab's copies change
//!   ([`crate::far::Far::set_home`], [`crate::far::Far::update_replicas`]); only slabs once lent
//!   are rewritten. Copies still being filled are left out: a child reads only complete ones.
//! - A child reads a lent page from the copies the table gives at that moment
//!   ([`crate::far::Far::read_sources`]), and waits for the parent's heal (up to the stall
//!   patience) when none answers while the lender lives: the header holds its pid.
//! - A donor that restarted empty is used again by the lender while children live: every copy
//!   it had was dropped (and republished) first, then the header's *epoch* is bumped, then the
//!   lender registers there afresh. A child's read counts only if the epoch is the same before
//!   its copies are looked up and once the page arrived: a read that reached the new donor
//!   through an old slab id (naming another slab there) is thrown away and made again.
//! - A child's runtime has a connection to every donor of its lender: one that does not answer
//!   at its start is attached at first use ([`farmem_transport::DonorClient::attach_later`]).

use std::sync::atomic::{fence, AtomicU64, Ordering};

use farmem_mm::Mapping;

use crate::slabs::replicas::{Replica, Replicas, MAX_REPLICAS};
use crate::sync::Mutex;

/// Far slabs a table can describe.
pub(crate) const SLABS: u64 = 1 << 16;
/// Words (u64) per entry: the sequence, the count, then two per copy.
const ENTRY_WORDS: usize = 16;
const _: () = assert!(2 + 2 * MAX_REPLICAS <= ENTRY_WORDS);
/// The header's words (a page, so the table is whole pages): a magic, the lender's pid, its
/// restart epoch.
const HEADER_WORDS: usize = 4096 / 8;
const EPOCH: usize = 2;
const MAGIC: u64 = u64::from_le_bytes(*b"fmcopy01");
/// The whole table, in words and bytes (sparse: only entries written take memory).
const WORDS: usize = HEADER_WORDS + SLABS as usize * ENTRY_WORDS;
const BYTES: usize = WORDS * 8;
const _: () = assert!(BYTES.is_multiple_of(4096));

/// One copy, as published: the lender's donor index and where on it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Published {
    pub(crate) donor: usize,
    pub(crate) slab: u32,
    pub(crate) base: u32,
}

/// The lender's side: the table it writes (see the module doc).
pub(crate) struct LentCopies {
    mapping: Mapping,
    /// One writer at a time (writes come from the heal thread, the sender's placements and
    /// forks).
    writing: Mutex<()>,
    /// A slab past the table was lent: some child keeps fork-time copies (until the thaw).
    unpublished: std::sync::atomic::AtomicBool,
}

impl LentCopies {
    /// A new, empty table for this process.
    pub(crate) fn new() -> std::io::Result<LentCopies> {
        use rustix::fs::{ftruncate, memfd_create, MemfdFlags};
        let fd = memfd_create("farmem-lent-copies", MemfdFlags::CLOEXEC)?;
        ftruncate(&fd, BYTES as u64)?;
        let mapping = Mapping::shared(std::os::fd::AsFd::as_fd(&fd), 0, BYTES)?;
        let t = LentCopies {
            mapping,
            writing: Mutex::new(()),
            unpublished: std::sync::atomic::AtomicBool::new(false),
        };
        let w = t.words();
        w[0].store(MAGIC, Ordering::Relaxed);
        w[1].store(u64::from(std::process::id()), Ordering::Release);
        Ok(t)
    }

    /// Where a child finds the table (the same address in every descendant).
    pub(crate) fn at(&self) -> TableAt {
        TableAt {
            addr: self.mapping.addr(),
        }
    }

    fn words(&self) -> &[AtomicU64] {
        crate::mm::shared_words(&self.mapping)
    }

    /// Publishes far slab `idx`'s readable copies `r`.
    pub(crate) fn publish(&self, idx: u64, r: &Replicas) {
        match entry(self.words(), idx) {
            Some(e) => {
                let _w = self.writing.lock();
                write_entry(e, r);
            }
            None => self.unpublished.store(true, Ordering::Relaxed),
        }
    }

    /// Whether every slab lent since the last [`LentCopies::thawed`] is in the table.
    pub(crate) fn complete(&self) -> bool {
        !self.unpublished.load(Ordering::Relaxed)
    }

    /// Every child that borrowed is gone: none keeps fork-time copies any more.
    pub(crate) fn thawed(&self) {
        self.unpublished.store(false, Ordering::Relaxed);
    }

    /// Before a donor that restarted empty is used again: every child's read of a lent page
    /// that overlaps this is thrown away (it may have reached the new donor through a slab id
    /// the table had just before, which names another slab there now).
    pub(crate) fn bump_epoch(&self) {
        self.words()[EPOCH].fetch_add(1, Ordering::SeqCst);
    }

    /// Publishes far slab `idx`'s copies `r` if it was ever lent; `None` (no longer on donors)
    /// publishes no copy.
    pub(crate) fn republish(&self, idx: u64, r: Option<&Replicas>) {
        let Some(e) = entry(self.words(), idx) else {
            return;
        };
        if e[0].load(Ordering::Acquire) == 0 {
            return; // never lent
        }
        let _w = self.writing.lock();
        write_entry(e, r.unwrap_or(&Replicas::empty()));
    }
}

/// Where a lender's table is mapped (in the lender and in each of its descendants).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct TableAt {
    addr: usize,
}

impl TableAt {
    /// In a descendant of the lender: its table as inherited at the fork.
    fn words(&self) -> &'static [AtomicU64] {
        crate::mm::inherited_words(self.addr, WORDS)
    }

    /// Far slab `idx`'s copies as the lender published them last; `None` if it never did.
    pub(crate) fn copies(&self, idx: u64) -> Option<Vec<Published>> {
        let w = self.words();
        if w[0].load(Ordering::Relaxed) != MAGIC {
            return None;
        }
        read_entry(entry(w, idx)?)
    }

    /// The lender's restart epoch: a read of a lent page is good only if it is the same
    /// before the copies are looked up and once the page has arrived.
    pub(crate) fn epoch(&self) -> u64 {
        self.words()[EPOCH].load(Ordering::SeqCst)
    }

    /// Whether the lender process still lives (and so may heal a slab whose copies died).
    pub(crate) fn lender_alive(&self) -> bool {
        let pid = self.words()[1].load(Ordering::Acquire);
        let Ok(pid) = i32::try_from(pid) else {
            return false;
        };
        // Signal 0: existence only. EPERM means it exists under another user.
        !matches!(
            nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None),
            Err(nix::errno::Errno::ESRCH)
        )
    }
}

fn entry(w: &[AtomicU64], idx: u64) -> Option<&[AtomicU64]> {
    if idx >= SLABS {
        return None;
    }
    let at = HEADER_WORDS + idx as usize * ENTRY_WORDS;
    w.get(at..at + ENTRY_WORDS)
}

/// Writes an entry (a sequence lock: odd while written, two more once done).
fn write_entry(e: &[AtomicU64], r: &Replicas) {
    let seq = e[0].load(Ordering::Relaxed);
    let seq = seq + (seq & 1); // a writer that died mid-way left it odd
    e[0].store(seq + 1, Ordering::Relaxed);
    fence(Ordering::Release);
    let mut n = 0;
    for x in r.readable() {
        e[2 + 2 * n].store(x.donor as u64, Ordering::Relaxed);
        e[3 + 2 * n].store(
            u64::from(x.slab) << 32 | u64::from(x.base),
            Ordering::Relaxed,
        );
        n += 1;
    }
    e[1].store(n as u64, Ordering::Relaxed);
    e[0].store(seq + 2, Ordering::Release);
}

/// Reads an entry consistently; `None` if never written.
fn read_entry(e: &[AtomicU64]) -> Option<Vec<Published>> {
    for _ in 0..1000 {
        let seq = e[0].load(Ordering::Acquire);
        if seq == 0 {
            return None;
        }
        if seq & 1 == 1 {
            std::thread::yield_now();
            continue;
        }
        let n = (e[1].load(Ordering::Relaxed) as usize).min(MAX_REPLICAS);
        let out: Vec<Published> = (0..n)
            .map(|i| {
                let at = e[3 + 2 * i].load(Ordering::Relaxed);
                Published {
                    donor: e[2 + 2 * i].load(Ordering::Relaxed) as usize,
                    slab: (at >> 32) as u32,
                    base: at as u32,
                }
            })
            .collect();
        fence(Ordering::Acquire);
        if e[0].load(Ordering::Relaxed) == seq {
            return Some(out);
        }
    }
    None // a lender stuck mid-write: keep what is known
}

impl Published {
    /// This copy as a replica on the child's connection `donor`.
    pub(crate) fn on(&self, donor: usize) -> Replica {
        Replica {
            donor,
            slab: self.slab,
            base: self.base,
            filling: false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slab_is_published_when_lent_and_republished_only_then() {
        let t = LentCopies::new().unwrap();
        let at = t.at();
        assert!(at.lender_alive(), "this process lent it");
        assert_eq!(at.copies(3), None, "nothing published yet");
        t.republish(3, Some(&Replicas::of(&[(0, false)])));
        assert_eq!(at.copies(3), None, "never lent: not republished");

        t.publish(3, &Replicas::of(&[(0, false), (2, true)]));
        let got = at.copies(3).unwrap();
        assert_eq!(
            got,
            vec![Published {
                donor: 0,
                slab: 0,
                base: 0
            }],
            "a copy being filled is not readable yet"
        );
        t.republish(3, Some(&Replicas::of(&[(1, false), (2, false)])));
        let donors: Vec<usize> = at.copies(3).unwrap().iter().map(|p| p.donor).collect();
        assert_eq!(donors, vec![1, 2], "the heal's new copies");
        t.republish(3, None);
        assert_eq!(at.copies(3), Some(vec![]), "no longer on donors: no copy");
        assert_eq!(at.copies(4), None, "its neighbour untouched");
        t.publish(SLABS, &Replicas::of(&[(0, false)]));
        assert_eq!(at.copies(SLABS), None, "past the table: not published");
    }

    #[test]
    fn a_reader_never_sees_half_an_entry() {
        let t = std::sync::Arc::new(LentCopies::new().unwrap());
        let a = Replicas::of(&[(0, false), (1, false)]);
        let b = Replicas::of(&[(5, false), (6, false), (7, false)]);
        t.publish(9, &a);
        let at = t.at();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let writer = {
            let (t, stop) = (t.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut i = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    t.republish(9, Some(if i.is_multiple_of(2) { &b } else { &a }));
                    i += 1;
                }
                i
            })
        };
        let (mut seen_a, mut seen_b) = (0, 0);
        for _ in 0..200_000 {
            let donors: Vec<usize> = at.copies(9).unwrap().iter().map(|p| p.donor).collect();
            match donors.as_slice() {
                [0, 1] => seen_a += 1,
                [5, 6, 7] => seen_b += 1,
                other => panic!("a torn entry: {other:?}"),
            }
        }
        stop.store(true, Ordering::Relaxed);
        let writes = writer.join().unwrap();
        assert!(writes > 0 && seen_a + seen_b == 200_000);
    }
}
