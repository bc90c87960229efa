//! The runtime's locks: `std::sync`'s, with the calling convention the runtime is written in
//! (no poisoning, a condition variable waits on `&mut` guard).
//!
//! Why not parking_lot: its locks and condition variables park threads in one process-wide
//! hash table guarded by word locks. A program that forks copies that table as it is at the
//! instant of the fork; a runtime thread that held one of its word locks then (parking or
//! waking on any lock, or growing the table as a thread starts) leaves it locked forever in
//! the child, and the child's own runtime — the same code, in the same table — hangs there
//! (seen: a forked child with every runtime thread in `grow_hashtable` and the program in
//! `handle_userfault`, about one fork in two while the parent pages). `std::sync` keeps each
//! lock's state in the lock itself, so a child that never touches its parent's locks (see
//! [`crate::fork`]) shares nothing with them.
//!
//! Poisoning is ignored: a runtime thread that panics is reported by the thread that joins
//! it, and the state it guarded stays usable (every update is made whole under the lock).

use std::ops::{Deref, DerefMut};
use std::sync::PoisonError;
use std::time::Duration;

/// A mutual-exclusion lock; [`Mutex::lock`] never fails.
#[derive(Debug, Default)]
pub(crate) struct Mutex<T>(std::sync::Mutex<T>);

/// The lock held; released when dropped. The inner guard is taken out only while a
/// [`Condvar`] waits with it, so it is always present when the guard is used.
pub(crate) struct MutexGuard<'a, T>(Option<std::sync::MutexGuard<'a, T>>);

impl<T> Mutex<T> {
    pub(crate) const fn new(value: T) -> Mutex<T> {
        Mutex(std::sync::Mutex::new(value))
    }

    /// Waits for the lock.
    pub(crate) fn lock(&self) -> MutexGuard<'_, T> {
        MutexGuard(Some(self.0.lock().unwrap_or_else(PoisonError::into_inner)))
    }
}

impl<T> Deref for MutexGuard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        self.0
            .as_ref()
            .expect("guard present outside a condition wait")
    }
}

impl<T> DerefMut for MutexGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        self.0
            .as_mut()
            .expect("guard present outside a condition wait")
    }
}

/// A condition variable used with a [`Mutex`].
#[derive(Debug, Default)]
pub(crate) struct Condvar(std::sync::Condvar);

impl Condvar {
    pub(crate) const fn new() -> Condvar {
        Condvar(std::sync::Condvar::new())
    }

    /// Releases the lock, waits for a notification (or a spurious wake-up) and takes the lock
    /// again.
    pub(crate) fn wait<T>(&self, guard: &mut MutexGuard<'_, T>) {
        let inner = guard.0.take().expect("guard present");
        guard.0 = Some(self.0.wait(inner).unwrap_or_else(PoisonError::into_inner));
    }

    /// As [`Condvar::wait`], for at most `timeout`.
    pub(crate) fn wait_for<T>(&self, guard: &mut MutexGuard<'_, T>, timeout: Duration) {
        let inner = guard.0.take().expect("guard present");
        let (inner, _) = self
            .0
            .wait_timeout(inner, timeout)
            .unwrap_or_else(PoisonError::into_inner);
        guard.0 = Some(inner);
    }

    pub(crate) fn notify_one(&self) {
        self.0.notify_one();
    }

    pub(crate) fn notify_all(&self) {
        self.0.notify_all();
    }
}

/// A reader-writer lock; [`RwLock::read`] and [`RwLock::write`] never fail.
#[derive(Debug, Default)]
pub(crate) struct RwLock<T>(std::sync::RwLock<T>);

impl<T> RwLock<T> {
    pub(crate) const fn new(value: T) -> RwLock<T> {
        RwLock(std::sync::RwLock::new(value))
    }

    pub(crate) fn read(&self) -> std::sync::RwLockReadGuard<'_, T> {
        self.0.read().unwrap_or_else(PoisonError::into_inner)
    }

    pub(crate) fn write(&self) -> std::sync::RwLockWriteGuard<'_, T> {
        self.0.write().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn a_condition_wait_hands_the_lock_back() {
        let m = Arc::new(Mutex::new(0u32));
        let cv = Arc::new(Condvar::new());
        let (m2, cv2) = (m.clone(), cv.clone());
        let t = std::thread::spawn(move || {
            *m2.lock() = 7;
            cv2.notify_all();
        });
        let mut g = m.lock();
        while *g != 7 {
            cv.wait_for(&mut g, Duration::from_millis(10));
        }
        *g += 1;
        drop(g);
        t.join().unwrap();
        assert_eq!(*m.lock(), 8);
    }

    #[test]
    fn a_panic_under_the_lock_does_not_poison_it() {
        let m = Arc::new(Mutex::new(1u32));
        let m2 = m.clone();
        let r = std::thread::spawn(move || {
            let _g = m2.lock();
            panic!("on purpose");
        })
        .join();
        assert!(r.is_err());
        assert_eq!(*m.lock(), 1);
        let l = RwLock::new(2u32);
        assert_eq!(*l.read(), 2);
        *l.write() = 3;
        assert_eq!(*l.read(), 3);
    }
}
