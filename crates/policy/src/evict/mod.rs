//! Eviction policies: which resident page leaves local memory next.
//!
//! One file per policy: [`fifo`] (arrival order; the memory-blade study's fast round-robin),
//! [`clock`] (second chance from reference bits), [`refault`] (active and inactive lists with
//! refault detection), and [`eager`], Leap's eager eviction of
//! prefetched pages, which wraps either of them. [`by_name`] returns the wrapped form, which is
//! what the runtime and the simulator use.

pub mod clock;
pub mod eager;
pub mod fifo;
pub mod refault;

pub use clock::{Clock, ClockConfig};
pub use eager::{Eager, EagerConfig};
pub use fifo::{Fifo, FifoConfig};
pub use refault::{Refault, RefaultConfig};

use crate::{Origin, PolicyError};

/// Chooses which resident page leaves next.
///
/// # What the caller guarantees
///
/// - It tells every residency change exactly once: [`insert`](Self::insert) when a page becomes
///   resident, [`remove`](Self::remove) when it leaves other than through
///   [`pick_victim`](Self::pick_victim) (released by the program, region unmapped).
/// - It calls [`touched`](Self::touched) for each access it observes to a resident page (a fault,
///   a write-protect fault, a prefetch hit; the simulator reports every access).
/// - It serialises calls (`&mut self`); the policy does no locking of its own.
///
/// # What the implementation guarantees
///
/// - [`pick_victim`](Self::pick_victim) returns a page that is resident (inserted, not yet
///   removed or picked) and forgets it; `None` only when [`len`](Self::len) is 0.
/// - Every call is O(1), or amortised O(1) for `clock`'s hand sweeps; no call scans all pages.
/// - Misuse is harmless: `touched`/`remove` of a page it does not hold is ignored, and `insert`
///   of a page it already holds counts as a touch (it is not inserted twice).
pub trait EvictionPolicy: Send {
    /// The policy's name as accepted by [`by_name`].
    fn name(&self) -> &'static str;
    /// `page` became resident, brought in as `origin`.
    fn insert(&mut self, page: u64, origin: Origin);
    /// An access to resident `page` that the caller saw.
    fn touched(&mut self, page: u64);
    /// `page` left residency other than by [`pick_victim`](Self::pick_victim).
    fn remove(&mut self, page: u64);
    /// Chooses a resident page to evict and forgets it.
    fn pick_victim(&mut self) -> Option<u64>;
    /// Number of resident pages the policy tracks.
    fn len(&self) -> usize;
    /// Whether the next victim is a prefetched page taken ahead of the others (Leap's eager
    /// eviction, [`Eager`]: used once, or not used yet).
    fn next_is_prefetched(&self) -> bool {
        false
    }
    /// Whether no page is tracked.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Whether a policy holds a page: what [`Eager`] needs from the policy it wraps (to keep a
/// page on one list only). O(1).
pub trait Contains {
    /// Whether `page` is tracked by the policy.
    fn contains(&self, page: u64) -> bool;
}

/// Names accepted by [`by_name`]; the first is the default.
pub const NAMES: &[&str] = &["fifo", "clock", "refault"];

/// The eviction policy called `name` (`"fifo"`, the default, or `"clock"`), with default
/// configuration and wrapped with Leap's eager eviction of prefetched pages ([`Eager`]).
pub fn by_name(name: &str) -> Result<Box<dyn EvictionPolicy>, PolicyError> {
    match name {
        "fifo" => Ok(Box::new(Eager::new(
            Fifo::new(FifoConfig::default()),
            EagerConfig::default(),
        ))),
        "clock" => Ok(Box::new(Eager::new(
            Clock::new(ClockConfig::default()),
            EagerConfig::default(),
        ))),
        "refault" => Ok(Box::new(Eager::new(
            Refault::new(RefaultConfig::default())?,
            EagerConfig::default(),
        ))),
        other => Err(PolicyError::UnknownPolicy {
            kind: "eviction",
            name: other.to_string(),
            known: NAMES.join(", "),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn by_name_knows_every_name_and_rejects_others() {
        for name in NAMES {
            let p = by_name(name).expect("every listed name builds");
            assert_eq!(p.name(), *name);
            assert_eq!(p.len(), 0);
        }
        let err = by_name("lru").err().expect("lru is not a policy");
        assert_eq!(
            err.to_string(),
            "unknown eviction policy \"lru\": choose one of fifo, clock, refault"
        );
    }

    #[test]
    fn wrapped_policies_evict_unused_prefetches_before_demand_pages() {
        for name in NAMES {
            let mut p = by_name(name).unwrap();
            p.insert(1, Origin::Demand);
            for page in 100..=117 {
                p.insert(page, Origin::Prefetch);
            }
            p.insert(3, Origin::Demand);
            // 117 is consumed: it goes first. Then the oldest unused prefetch beyond the 16
            // newest (default grace), then the demand pages, then the newest unused prefetches.
            p.touched(117);
            let order: Vec<u64> = std::iter::from_fn(|| p.pick_victim()).collect();
            let mut want = vec![117, 100, 1, 3];
            want.extend(101..=116);
            assert_eq!(order, want, "{name}");
        }
    }

    /// Random operation sequences against a model (the set of resident pages): every victim is
    /// resident, nothing is lost or duplicated, `len` is exact, whatever the call order.
    #[test]
    fn random_operations_keep_the_resident_set_exact() {
        let mut state = 0x5eed_u64;
        let mut next = move |n: u64| {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (state >> 33) % n
        };
        for name in NAMES {
            let mut p = by_name(name).unwrap();
            let mut model = std::collections::HashSet::new();
            for step in 0..20_000 {
                let page = next(64);
                match next(5) {
                    0 | 1 => {
                        let origin = if next(2) == 0 {
                            Origin::Demand
                        } else {
                            Origin::Prefetch
                        };
                        p.insert(page, origin);
                        model.insert(page);
                    }
                    2 => p.touched(page),
                    3 => {
                        p.remove(page);
                        model.remove(&page);
                    }
                    _ => match p.pick_victim() {
                        Some(v) => {
                            assert!(model.remove(&v), "{name} step {step}: {v} not resident")
                        }
                        None => {
                            assert!(model.is_empty(), "{name} step {step}: None but pages left")
                        }
                    },
                }
                assert_eq!(p.len(), model.len(), "{name} step {step}");
            }
            while let Some(v) = p.pick_victim() {
                assert!(model.remove(&v));
            }
            assert!(model.is_empty());
        }
    }
}
