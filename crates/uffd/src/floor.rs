//! The userfaultfd fault floor: what one userfaultfd fault costs when its handler answers at
//! once from memory already in the process (a handler thread answering each fault with
//! UFFDIO_COPY from a buffer), timed by the faulting thread from the load to its return. No
//! network, no bookkeeping: the least any userfaultfd pager can cost on this machine.
//! `farmem doctor` shows it; `farmem-bench fault` puts farmem's fault latencies next to it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::{Event, Features, RegisterMode, Uffd, UffdError, PAGE_SIZE};

/// A private anonymous mapping registered with its own userfaultfd and served by a handler
/// thread; each [`FaultFloor::fault_next`] takes one missing-page fault on a fresh page.
pub struct FaultFloor {
    addr: usize,
    len: usize,
    uffd: Arc<Uffd>,
    stop: Arc<AtomicBool>,
    handler: Option<JoinHandle<()>>,
    next: usize,
}

impl FaultFloor {
    /// Maps `pages` pages (one per fault to measure), registers them and starts the handler.
    pub fn new(pages: usize) -> Result<FaultFloor, UffdError> {
        let len = pages.max(1) * PAGE_SIZE;
        let uffd = Arc::new(Uffd::open(Features::empty(), Features::empty())?);
        // SAFETY: a fresh private anonymous mapping; the kernel picks the address.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(UffdError::Map {
                len_bytes: len,
                source: std::io::Error::last_os_error(),
            });
        }
        let addr = p as usize;
        // SAFETY: advice on the mapping just created.
        unsafe { libc::madvise(p, len, libc::MADV_NOHUGEPAGE) };
        // SAFETY: the mapping was created above and is owned by this FaultFloor; it is only
        // read through volatile loads in `fault_next`, never through Rust references.
        let registered = unsafe {
            uffd.register(
                addr,
                len,
                RegisterMode {
                    missing: true,
                    wp: false,
                },
            )
        };
        if let Err(e) = registered {
            // SAFETY: unmapping the mapping created above, never handed out.
            unsafe { libc::munmap(p, len) };
            return Err(e);
        }
        let stop = Arc::new(AtomicBool::new(false));
        let handler = {
            let uffd = uffd.clone();
            let stop = stop.clone();
            // The handler answers from its own buffer and never touches the mapping.
            std::thread::spawn(move || {
                let page = vec![0x5au8; PAGE_SIZE];
                let mut evs = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    let _ = uffd.wait_readable(50);
                    evs.clear();
                    let _ = uffd.read_events(&mut evs);
                    for e in evs.drain(..) {
                        if let Event::Pagefault { addr, .. } = e {
                            let _ = uffd.copy(addr & !(PAGE_SIZE - 1), &page, false, false);
                        }
                    }
                }
            })
        };
        Ok(FaultFloor {
            addr,
            len,
            uffd,
            stop,
            handler: Some(handler),
            next: 0,
        })
    }

    /// Takes one fault on the next page not yet touched and returns how long the faulting
    /// load took; None once every page has been touched.
    pub fn fault_next(&mut self) -> Option<Duration> {
        if self.next >= self.len / PAGE_SIZE {
            return None;
        }
        let a = self.addr + self.next * PAGE_SIZE;
        self.next += 1;
        let t0 = Instant::now();
        // SAFETY: `a` is a page of the live mapping this FaultFloor owns (checked above); the
        // load is volatile so it really happens and takes the fault.
        unsafe { std::ptr::read_volatile(a as *const u8) };
        Some(t0.elapsed())
    }
}

impl Drop for FaultFloor {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.handler.take() {
            let _ = t.join();
        }
        let _ = self.uffd.unregister(self.addr, self.len);
        // SAFETY: the mapping created in `new`; the handler is gone and nothing else uses it.
        unsafe { libc::munmap(self.addr as *mut libc::c_void, self.len) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_page_faults_once_then_none() {
        let mut floor = FaultFloor::new(8).expect("userfaultfd is needed for this test");
        for _ in 0..8 {
            let t = floor.fault_next().unwrap();
            assert!(t > Duration::ZERO);
        }
        assert_eq!(floor.fault_next(), None);
    }
}
