//! Sealed pages: every page leaves the process encrypted and authenticated, bound to its far
//! page number and a version, so a donor (or anyone who reaches its memory or its swap) can
//! neither read a page nor hand back a tampered, swapped or stale one.
//!
//! # Design
//!
//! - AES-256-GCM (`ring`'s implementation, AES-NI and CLMUL picked at run time) with a key
//!   drawn from the kernel's random source when the runtime starts. `ring` rather than
//!   RustCrypto's `aes-gcm`: measured on this machine kind, 0.97 µs a page against 4.4-5.6 µs
//!   (ChaCha20-Poly1305: 4.2 µs in `ring`, 6.4-7.9 µs in RustCrypto). The key never leaves the process
//!   and is never written anywhere.
//! - Each seal takes a fresh version from one 64-bit counter of the runtime. The nonce is that
//!   version (8 bytes) followed by 4 zero bytes, so no two seals under one key share a nonce,
//!   whatever far page they are for and however often a far page number is reused. The
//!   associated data is the far page number: a page handed back under another far address
//!   fails its check.
//! - The runtime keeps, for every far page, the version and the 16-byte tag of its last seal
//!   ([`Seals`]: 24 bytes of local memory per far page, 0.6% of what the donors hold). The donor
//!   stores only the 4096 bytes of ciphertext; the wire format is unchanged. A page is opened
//!   with the version and tag kept here, so an older copy (a replay of a previous version), a
//!   copy of another far page and any altered byte are all refused by the same tag check.
//! - A seal is recorded when the page is sealed for sending, before the donor acknowledges it.
//!   That is safe because a far copy is only read once its last send was acknowledged (until
//!   then the page is served from the write-back pool); a send that fails is sealed again, with
//!   a new version, when it is retried.
//!
//! # Limitations
//!
//! - Sealing costs a pass of AES-GCM over each page sent and each page fetched (see the
//!   `seal_open_cost` figures in docs/architecture.md).
//! - The key lives in the process: whoever can read the program's own memory can read its pages
//!   anyway.

use crate::sync::Mutex;
use ring::aead::{Aad, LessSafeKey, Nonce, Tag, UnboundKey, AES_256_GCM};

use crate::error::SealError;
use farmem_proto::PAGE_SIZE;

/// Bytes of a tag.
const TAG_BYTES: usize = 16;

/// The version and tag of a far page's last seal; version 0: never sealed.
#[derive(Clone, Copy, Default)]
struct Seal {
    version: u64,
    tag: [u8; TAG_BYTES],
}

/// Per far page seals, indexed by far page number (far page numbers are dense).
#[derive(Default)]
struct Seals {
    by_far: Vec<Seal>,
    /// The last version handed out.
    last_version: u64,
}

/// Seals and opens pages for one runtime.
pub struct Sealer {
    cipher: LessSafeKey,
    seals: Mutex<Seals>,
}

/// What a forked child needs to open the pages its parent lent it on donors: the parent's key
/// and the seals of the lent far pages. Opens only (a child seals its own pages under its own
/// key, so no nonce is ever used twice under the parent's).
#[derive(Clone)]
pub(crate) struct LentSeals {
    cipher: LessSafeKey,
    /// (far page, its last seal), sorted by far page.
    seals: Vec<(u64, Seal)>,
}

impl std::fmt::Debug for LentSeals {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LentSeals")
            .field("pages", &self.seals.len())
            .finish_non_exhaustive()
    }
}

impl LentSeals {
    /// Checks and decrypts `page` in place, as fetched for lent far page `far`.
    pub(crate) fn open(&self, far: u64, page: &mut [u8]) -> Result<(), SealError> {
        let seal = self
            .seals
            .binary_search_by_key(&far, |(f, _)| *f)
            .map(|i| self.seals[i].1)
            .map_err(|_| SealError::NeverSealed { far })?;
        open_with(&self.cipher, seal, far, page)
    }
}

/// Opens `page` (far page `far`) sealed as `seal` under `cipher`.
fn open_with(cipher: &LessSafeKey, seal: Seal, far: u64, page: &mut [u8]) -> Result<(), SealError> {
    if seal.version == 0 {
        return Err(SealError::NeverSealed { far });
    }
    cipher
        .open_in_place_separate_tag(
            nonce(seal.version),
            Aad::from(far.to_le_bytes()),
            Tag::from(seal.tag),
            page,
            0..,
        )
        .map(|_| ())
        .map_err(|_| SealError::Tampered { far })
}

/// The nonce of a seal: its version, unique under the key (see the module docs).
fn nonce(version: u64) -> Nonce {
    let mut n = [0u8; 12];
    n[..8].copy_from_slice(&version.to_le_bytes());
    Nonce::assume_unique_for_key(n)
}

impl Sealer {
    /// A sealer with a fresh random key.
    pub fn new() -> Result<Sealer, SealError> {
        let mut key = [0u8; 32];
        getrandom::getrandom(&mut key).map_err(SealError::Key)?;
        let cipher = LessSafeKey::new(
            UnboundKey::new(&AES_256_GCM, &key).expect("a 32-byte key fits AES-256-GCM"),
        );
        key.fill(0);
        Ok(Sealer {
            cipher,
            seals: Mutex::new(Seals::default()),
        })
    }

    /// Encrypts `page` (4096 bytes) in place for far page `far` and records its seal.
    pub fn seal(&self, far: u64, page: &mut [u8]) {
        debug_assert_eq!(page.len(), PAGE_SIZE);
        let version = {
            let mut s = self.seals.lock();
            s.last_version += 1;
            s.last_version
        };
        let tag = self
            .cipher
            .seal_in_place_separate_tag(nonce(version), Aad::from(far.to_le_bytes()), page)
            .expect("AES-GCM seals any buffer under 64 GiB");
        let mut s = self.seals.lock();
        let idx = far as usize;
        if s.by_far.len() <= idx {
            s.by_far.resize(idx + 1, Seal::default());
        }
        // Two seals of one far page in flight at once never happens (a far page has one
        // send in flight at a time); keep the newer one regardless.
        if s.by_far[idx].version < version {
            s.by_far[idx] = Seal {
                version,
                tag: tag.as_ref().try_into().expect("AES-GCM tags are 16 bytes"),
            };
        }
    }

    /// Checks and decrypts `page` in place, as fetched for far page `far`. On an error the
    /// bytes are not the page and must not be installed.
    pub fn open(&self, far: u64, page: &mut [u8]) -> Result<(), SealError> {
        let seal = self
            .seals
            .lock()
            .by_far
            .get(far as usize)
            .copied()
            .unwrap_or_default();
        open_with(&self.cipher, seal, far, page)
    }

    /// The key and the seals of far pages `fars` (sorted), for a forked child that reads
    /// those pages from donors ([`crate::fork`]).
    pub(crate) fn lend(&self, fars: impl Iterator<Item = u64>) -> LentSeals {
        let s = self.seals.lock();
        let mut seals: Vec<(u64, Seal)> = fars
            .filter_map(|f| s.by_far.get(f as usize).map(|x| (f, *x)))
            .collect();
        drop(s);
        seals.sort_unstable_by_key(|(f, _)| *f);
        seals.dedup_by_key(|(f, _)| *f);
        LentSeals {
            cipher: self.cipher.clone(),
            seals,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn page(seed: u8) -> Vec<u8> {
        (0..PAGE_SIZE)
            .map(|i| (i as u8).wrapping_mul(31) ^ seed)
            .collect()
    }

    #[test]
    fn a_sealed_page_opens_to_the_same_bytes_and_hides_them() {
        let s = Sealer::new().unwrap();
        let plain = page(7);
        let mut p = plain.clone();
        s.seal(3, &mut p);
        assert_ne!(p, plain, "a sealed page must not be the plain page");
        // No run of 16 plain bytes survives in the ciphertext.
        assert!(!p.windows(16).any(|w| w == &plain[100..116]));
        s.open(3, &mut p).unwrap();
        assert_eq!(p, plain);
    }

    #[test]
    fn every_flipped_byte_is_detected() {
        let s = Sealer::new().unwrap();
        let mut sealed = page(1);
        s.seal(9, &mut sealed);
        for i in (0..PAGE_SIZE).step_by(97) {
            let mut p = sealed.clone();
            p[i] ^= 0x01;
            assert!(matches!(
                s.open(9, &mut p),
                Err(SealError::Tampered { far: 9 })
            ));
        }
    }

    #[test]
    fn a_page_handed_back_for_another_far_page_is_refused() {
        let s = Sealer::new().unwrap();
        let mut a = page(1);
        let mut b = page(2);
        s.seal(1, &mut a);
        s.seal(2, &mut b);
        // The donor swaps the two pages.
        assert!(matches!(
            s.open(1, &mut b.clone()),
            Err(SealError::Tampered { far: 1 })
        ));
        assert!(matches!(
            s.open(2, &mut a.clone()),
            Err(SealError::Tampered { far: 2 })
        ));
    }

    #[test]
    fn an_older_version_of_the_same_page_is_refused() {
        let s = Sealer::new().unwrap();
        let mut old = page(1);
        s.seal(5, &mut old);
        let mut new = page(2);
        s.seal(5, &mut new);
        // The donor replays the first copy it was sent.
        assert!(matches!(
            s.open(5, &mut old.clone()),
            Err(SealError::Tampered { far: 5 })
        ));
        s.open(5, &mut new).unwrap();
        assert_eq!(new, page(2));
    }

    #[test]
    fn a_never_sent_far_page_opens_nothing() {
        let s = Sealer::new().unwrap();
        let mut p = page(3);
        assert!(matches!(
            s.open(4, &mut p.clone()),
            Err(SealError::NeverSealed { far: 4 })
        ));
        s.seal(4, &mut p);
        assert!(matches!(
            s.open(5, &mut p),
            Err(SealError::NeverSealed { far: 5 })
        ));
    }

    #[test]
    fn two_runtimes_cannot_open_each_others_pages() {
        let a = Sealer::new().unwrap();
        let b = Sealer::new().unwrap();
        let mut p = page(4);
        a.seal(0, &mut p);
        b.seal(0, &mut page(4));
        assert!(b.open(0, &mut p).is_err());
    }

    #[test]
    fn lent_seals_open_the_lent_pages_only_and_only_as_they_were_lent() {
        let s = Sealer::new().unwrap();
        let mut a = page(1);
        let mut b = page(2);
        s.seal(3, &mut a);
        s.seal(8, &mut b);
        let lent = s.lend([8, 3].into_iter());
        // The parent rewrites page 3 after the fork: the child still opens what was lent.
        let mut newer = page(9);
        s.seal(3, &mut newer);
        let mut x = a.clone();
        lent.open(3, &mut x).unwrap();
        assert_eq!(x, page(1));
        assert!(matches!(
            lent.open(3, &mut newer.clone()),
            Err(SealError::Tampered { far: 3 })
        ));
        lent.open(8, &mut b).unwrap();
        assert_eq!(b, page(2));
        assert!(matches!(
            lent.open(5, &mut page(5)),
            Err(SealError::NeverSealed { far: 5 })
        ));
    }
}
