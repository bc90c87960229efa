//! A connection's socket ([`Socket`]): the [`Wire`] a [`crate::conn::Connection`] accepted by
//! the server is served over — receive deadlines through the socket's timeout, page data moved
//! between the socket and slab memory with `readv`/`sendmsg`, and a short poll for a faulting
//! client's next request.
//!
//! # Design
//!
//! Every read is bounded by its deadline (the HELLO deadline, a request's stall timeout)
//! through SO_RCVTIMEO, but the timeout is not set for every read: setting it cost one system
//! call per read, about one per page a faulting client read (measured with `perf trace -s`). It
//! is kept while it is no longer than the time left and at least half of it, so a read never
//! outlasts its deadline; a read that times out earlier ([`Wire::early`]) is made again with
//! the timeout set to three quarters of what is left. Between requests, the timeout only paces
//! the idle loop's checks, and the same rule keeps it. WRITE_PAGES data is read with the
//! timeout set to exactly what is left before every `readv` (once per batch: the saving does
//! not matter there, and a trickling client gains nothing).

use std::cell::Cell;
use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use crate::conn::{deadline_passed, Wire};
use crate::limits::WRITE_TIMEOUT;
use crate::mem::{self, SlabMemory};

/// How long a connection thread polls for the next request, after a single-page read, before
/// it blocks in a read: a faulting client usually asks again within tens of microseconds, and
/// waking a sleeping thread (an idle vCPU halted, woken by an IPI through the hypervisor on a
/// VM) costs about as much again on every request. The poll yields the CPU between probes:
/// on a small machine the client's threads (the program just woken from its fault, the
/// runtime's evictor) may be waiting for this very CPU, and a poll that keeps it delays the
/// next request it is waiting for. Whether it polls at all is measured per connection
/// ([`crate::poll::PollChoice`]).
const SPIN: Duration = Duration::from_micros(50);

/// An accepted connection's socket, with the receive timeout last set on it.
pub(crate) struct Socket {
    stream: TcpStream,
    timeout: Cell<Option<Duration>>,
}

impl Socket {
    pub(crate) fn new(stream: TcpStream) -> Socket {
        Socket {
            stream,
            timeout: Cell::new(None),
        }
    }

    /// Bounds reads by `bound`: keeps the timeout set if it is within `[bound / 2, bound]`, else
    /// sets three quarters of `bound` (so the next, slightly smaller bounds keep it too).
    fn bound_reads(&self, bound: Duration) -> io::Result<()> {
        if keeps(self.timeout.get(), bound) {
            return Ok(());
        }
        self.set(timeout_for(bound))
    }

    fn set(&self, t: Duration) -> io::Result<()> {
        self.stream.set_read_timeout(Some(t))?;
        self.timeout.set(Some(t));
        Ok(())
    }
}

/// Whether a read timeout `current` may stay for reads bounded by `bound`: never longer than
/// the bound (a read must not outlast its deadline), and not so short that reads wake early
/// again and again.
fn keeps(current: Option<Duration>, bound: Duration) -> bool {
    current.is_some_and(|t| t <= bound && t * 2 >= bound)
}

/// The read timeout set for reads bounded by `bound` (never zero: SO_RCVTIMEO of zero means
/// no timeout at all).
fn timeout_for(bound: Duration) -> Duration {
    (bound * 3 / 4).max(Duration::from_micros(1))
}

impl Read for Socket {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.stream.read(buf)
    }
}

impl Write for Socket {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.stream.write(buf)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.stream.flush()
    }
}

impl Wire for Socket {
    fn setup(&mut self) -> io::Result<()> {
        self.stream.set_nodelay(true)?;
        self.stream.set_write_timeout(Some(WRITE_TIMEOUT))
    }

    fn arm(&self, deadline: Option<Instant>) -> io::Result<()> {
        match time_left(deadline)? {
            Some(left) => self.bound_reads(left),
            None => Ok(()),
        }
    }

    fn early(&self, deadline: Option<Instant>) -> bool {
        deadline.is_some_and(|d| Instant::now() < d)
    }

    /// The receive timeout only paces the checks of the idle loop (see `read_head`).
    fn idle(&self, pace: Duration) -> io::Result<()> {
        self.bound_reads(pace)
    }

    fn spin_until_readable(&self) {
        spin_until_readable(&self.stream);
    }

    fn send_pages<'a>(
        &mut self,
        prefix: &[u8],
        pages: impl Iterator<Item = (&'a SlabMemory, u32)>,
    ) -> io::Result<()> {
        mem::send_pages(&self.stream, prefix, pages)
    }

    /// The socket's timeout is set to exactly what is left of `deadline` before every `readv`,
    /// so trickling bytes gains nothing.
    fn recv_pages<'a>(
        &mut self,
        pages: impl Iterator<Item = (&'a SlabMemory, u32)>,
        deadline: Option<Instant>,
    ) -> io::Result<()> {
        let this = &*self;
        mem::recv_pages(&this.stream, pages, || match time_left(deadline)? {
            Some(left) => this.set(left),
            None => Ok(()),
        })
    }

    fn service_time(&self, t0: Instant) -> Duration {
        t0.elapsed()
    }

    fn close(&mut self) {
        let _ = self.stream.shutdown(std::net::Shutdown::Both);
    }
}

/// What is left before `deadline` (None: no deadline); a passed deadline is an error.
fn time_left(deadline: Option<Instant>) -> io::Result<Option<Duration>> {
    let Some(deadline) = deadline else {
        return Ok(None);
    };
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return Err(deadline_passed());
    }
    Ok(Some(left))
}

/// Polls `stream` without blocking for up to [`SPIN`] until bytes are waiting or the socket
/// reports anything else (closed, error), which the blocking read that follows handles.
fn spin_until_readable(stream: &TcpStream) {
    let start = Instant::now();
    let mut probe = [0u8; 1];
    loop {
        let r = rustix::net::recv(
            stream,
            &mut probe[..],
            rustix::net::RecvFlags::PEEK | rustix::net::RecvFlags::DONTWAIT,
        );
        if !matches!(r, Err(rustix::io::Errno::AGAIN)) || start.elapsed() >= SPIN {
            return;
        }
        // Yield, not spin_loop: see SPIN.
        std::thread::yield_now();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn a_timeout_is_kept_only_while_no_read_can_outlast_its_deadline() {
        // Nothing set yet: set.
        assert!(!keeps(None, 100 * MS));
        let t = timeout_for(100 * MS);
        assert_eq!(t, 75 * MS);
        // The next requests' bounds, a little shorter or up to twice as long: kept.
        assert!(keeps(Some(t), 99 * MS));
        assert!(keeps(Some(t), 150 * MS));
        assert!(keeps(Some(t), 75 * MS));
        // Less time left than the timeout: a read could outlast the deadline, so set again.
        assert!(!keeps(Some(t), 74 * MS));
        // Far more time left: reads would wake early again and again, so set again.
        assert!(!keeps(Some(t), 151 * MS));
    }

    #[test]
    fn the_timeout_set_is_never_zero() {
        assert_eq!(
            timeout_for(Duration::from_nanos(1)),
            Duration::from_micros(1)
        );
        assert!(timeout_for(Duration::from_secs(10)) <= Duration::from_secs(10));
    }

    #[test]
    fn reads_keep_their_deadline_and_a_timeout_set_once_serves_many() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let client = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (accepted, _) = listener.accept().unwrap();
        let mut s = Socket::new(accepted);
        s.setup().unwrap();
        let deadline = Instant::now() + 200 * MS;
        s.arm(Some(deadline)).unwrap();
        let first = s.timeout.get().expect("set");
        assert!(first <= 200 * MS && first >= 100 * MS, "{first:?}");
        // A second request with the same stall timeout keeps it: no system call.
        s.arm(Some(Instant::now() + 200 * MS)).unwrap();
        assert_eq!(s.timeout.get(), Some(first));
        // Nothing comes: the read times out before the deadline, and says it was early...
        let t0 = Instant::now();
        let mut buf = [0u8; 8];
        let err = s.read(&mut buf).unwrap_err();
        assert!(matches!(
            err.kind(),
            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
        ));
        assert!(t0.elapsed() <= 200 * MS + 50 * MS);
        assert!(s.early(Some(deadline)) || Instant::now() >= deadline);
        // ...and a passed deadline is refused before any read.
        let passed = Instant::now() - MS;
        assert_eq!(
            s.arm(Some(passed)).unwrap_err().kind(),
            io::ErrorKind::TimedOut
        );
        assert!(!s.early(Some(passed)));
        drop(client);
    }
}
