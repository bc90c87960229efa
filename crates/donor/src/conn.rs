//! One client connection: reads requests, checks them, answers each with an explicit status.
//!
//! # Design
//! Requests are served in order, one at a time, on the connection's own thread. The data path
//! allocates nothing per request (buffers are reused) and copies page bytes once, between the
//! socket and slab memory: WRITE_PAGES reads the addresses, checks every one (all-or-nothing)
//! and then `readv`s the page data straight into the slab pages; READ_PAGES `sendmsg`s the
//! response header and the slab pages in one vectored write.
//!
//! The connection is generic over its byte stream ([`Wire`]): a [`crate::socket::Socket`] (a
//! `TcpStream` the server accepted), or any `Read + Write` wrapped in [`Stream`] (a session served in-process, see
//! `SessionDonor`). The request handling is the same code for both; only what depends on a
//! socket differs. On a socket, reads are bounded by deadlines through its receive timeout
//! (the HELLO deadline, the stall timeout), responses by its send timeout, and pages move with
//! `readv`/`sendmsg`. On a [`Stream`] there is no clock: a read returns bytes or the end of the
//! stream, so no deadline applies, service times are not measured (recorded as zero), and a
//! session's course depends on its bytes alone; pages are copied through a one-page buffer.
//!
//! Framing errors (bad magic, bad version, reserved flags, a payload over the limit, a frame cut
//! short) leave the byte stream unusable: the donor answers when it can still read the request
//! id, logs, and closes the connection. Every other bad request gets an error status and the
//! connection stays usable; a request whose payload is refused is still read to its end, so the
//! next frame starts where it should.
//!
//! Log lines are rate-limited by who causes them, not per connection (a new connection would
//! get a fresh allowance): an authenticated connection's lines are charged to its tenant, an
//! unauthenticated one's to its peer address and to the donor-wide limit (`loglimit`).
use std::fmt;
use std::io::{self, Read, Write};
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use farmem_proto::{
    encode_challenge, encode_clients_reply, encode_error, encode_give_back, encode_pages_header,
    encode_slab_allocated, encode_stats_reply, encode_success, encode_welcome, proofs_match,
    random_bytes, token_proof, AuthMode, DonorInfo, FrameError, Header, Opcode, PageAddr,
    ReconnectKey, Request, Status, HEADER_LEN, MAX_BATCH_PAGES, NONCE_LEN, PAGE_ADDR_LEN,
    PAGE_SIZE, PROOF_LEN, PROTOCOL_VERSION,
};

use crate::loglimit::LogKey;
use crate::mem::{self, SlabMemory};
use crate::poll::PollChoice;
use crate::shared::Shared;
use crate::store::{Refusal, Slab};

/// Longest payload buffered for a request other than WRITE_PAGES (a full READ_PAGES is 2 050
/// bytes; the slack lets an over-long batch still be answered with `BatchTooLarge`).
const MAX_SMALL_PAYLOAD: usize = 8 * 1024;
/// Size of the buffer that discards the payload of refused requests.
const DRAIN_BUFFER_BYTES: usize = 16 * 1024;

fn is_timeout(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
    )
}

/// AUTH attempts a connection may make (register, then attach, or the reverse, with a retry)
/// before it is closed.
const MAX_AUTH_ATTEMPTS: u32 = 4;

/// The byte stream a [`Connection`] is served over: what differs between a socket and an
/// in-process stream.
pub(crate) trait Wire: Read + Write {
    /// Prepares the stream before the first request (socket options).
    fn setup(&mut self) -> io::Result<()>;
    /// Bounds the next read by `deadline`, if any: fails with a timeout once it has passed, so
    /// that no sequence of reads can outlast it.
    fn arm(&self, deadline: Option<Instant>) -> io::Result<()>;
    /// A read failed with a timeout although `deadline` has not passed: the stream's timeout
    /// was shorter than the time left (it is not set again for every read), so read again.
    fn early(&self, deadline: Option<Instant>) -> bool;
    /// Between requests of an authenticated client: reads may wait, in steps of `pace`.
    fn idle(&self, pace: Duration) -> io::Result<()>;
    /// After a single-page read: waits briefly for the next request before blocking.
    fn spin_until_readable(&self);
    /// Sends `prefix`, then the bytes of `pages` in order.
    fn send_pages<'a>(
        &mut self,
        prefix: &[u8],
        pages: impl Iterator<Item = (&'a SlabMemory, u32)>,
    ) -> io::Result<()>;
    /// Receives the bytes of `pages` in order straight into them; every read is bounded by
    /// `deadline` (see [`Wire::arm`]).
    fn recv_pages<'a>(
        &mut self,
        pages: impl Iterator<Item = (&'a SlabMemory, u32)>,
        deadline: Option<Instant>,
    ) -> io::Result<()>;
    /// How long serving a request that began at `t0` took, for the counters.
    fn service_time(&self, t0: Instant) -> Duration;
    /// The connection is over.
    fn close(&mut self);
}

/// Any `Read + Write` as a connection's byte stream (an in-process session). Nothing is
/// timed: a read should return bytes or the end of the stream. A read failing with
/// `WouldBlock` or `TimedOut` counts as a passed deadline (an unfinished handshake, a stalled
/// request), except between the requests of an authenticated client, where it is retried, as
/// on a socket. Every response is flushed.
pub(crate) struct Stream<S> {
    inner: S,
    /// One page, between the stream and slab memory (allocated on the first page moved).
    page: Vec<u8>,
}

impl<S> Stream<S> {
    pub(crate) fn new(inner: S) -> Stream<S> {
        Stream {
            inner,
            page: Vec::new(),
        }
    }
}

impl<S: Read> Read for Stream<S> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.inner.read(buf)
    }
}

impl<S: Write> Write for Stream<S> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.inner.write(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

impl<S: Read + Write> Wire for Stream<S> {
    fn setup(&mut self) -> io::Result<()> {
        Ok(())
    }

    fn arm(&self, _deadline: Option<Instant>) -> io::Result<()> {
        Ok(())
    }

    fn early(&self, _deadline: Option<Instant>) -> bool {
        false
    }

    fn idle(&self, _pace: Duration) -> io::Result<()> {
        Ok(())
    }

    fn spin_until_readable(&self) {}

    fn send_pages<'a>(
        &mut self,
        prefix: &[u8],
        pages: impl Iterator<Item = (&'a SlabMemory, u32)>,
    ) -> io::Result<()> {
        self.page.resize(PAGE_SIZE, 0);
        self.inner.write_all(prefix)?;
        for (m, p) in pages {
            mem::copy_page_out(m, p, &mut self.page);
            self.inner.write_all(&self.page)?;
        }
        self.inner.flush()
    }

    fn recv_pages<'a>(
        &mut self,
        pages: impl Iterator<Item = (&'a SlabMemory, u32)>,
        _deadline: Option<Instant>,
    ) -> io::Result<()> {
        self.page.resize(PAGE_SIZE, 0);
        for (m, p) in pages {
            self.inner.read_exact(&mut self.page).map_err(|e| {
                if e.kind() == io::ErrorKind::UnexpectedEof {
                    io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "connection closed in the middle of WRITE_PAGES data",
                    )
                } else {
                    e
                }
            })?;
            mem::copy_page_in(m, p, &self.page);
        }
        Ok(())
    }

    /// Not measured (zero): nothing a session does depends on a clock, not even its counters.
    fn service_time(&self, _t0: Instant) -> Duration {
        Duration::ZERO
    }

    fn close(&mut self) {
        let _ = self.inner.flush();
    }
}

/// Who is at the other end of a connection, for log lines.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Peer {
    /// A TCP peer.
    Tcp(SocketAddr),
    /// An in-process session.
    InProcess,
}

impl Peer {
    /// The peer's IP address, if it has one.
    fn ip(&self) -> Option<std::net::IpAddr> {
        match self {
            Peer::Tcp(a) => Some(a.ip()),
            Peer::InProcess => None,
        }
    }
}

impl fmt::Display for Peer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Peer::Tcp(a) => a.fmt(f),
            Peer::InProcess => f.write_str("in-process session"),
        }
    }
}

pub(crate) fn deadline_passed() -> io::Error {
    io::Error::new(
        io::ErrorKind::TimedOut,
        "no complete handshake within the HELLO timeout, or no complete request within the stall timeout",
    )
}

/// Whether to keep the connection after a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Flow {
    Continue,
    Close,
}

/// What serving one request produced, for the counters.
struct Served {
    status: Status,
    bytes_out: u64,
    flow: Flow,
}

pub(crate) struct Connection<W: Wire> {
    stream: W,
    peer: Peer,
    shared: Arc<Shared>,
    /// This connection's id in the server's connection table.
    id: u64,
    client: Option<u64>,
    /// The tenant of `client`; while set, this connection holds an authenticated slot.
    tenant: Option<usize>,
    /// HELLO's challenge, once sent: AUTH must answer it.
    nonce: Option<[u8; NONCE_LEN]>,
    auth_attempts: u32,
    /// When the request being read must have fully arrived (authenticated connections only).
    frame_deadline: Option<Instant>,
    /// The socket's read timeout was shortened for a request: restore the idle one.
    frame_armed: bool,
    payload: Vec<u8>,
    out: Vec<u8>,
    scratch: Vec<u8>,
    slabs: Vec<Arc<Slab>>,
    pages: Vec<(usize, u32)>,
    errors: u64,
    /// When an unauthenticated connection is closed: the handshake must be done by then,
    /// however the peer spreads its bytes or how many other requests it sends.
    hello_deadline: Instant,
    /// The last request was a single-page read: poll for the next one before sleeping.
    spin_next: bool,
    /// Whether polling after a single-page read pays on this connection (measured).
    poll: PollChoice,
}

impl<W: Wire> Drop for Connection<W> {
    /// Runs however the connection ends (even by a panic): its client may become orphaned.
    fn drop(&mut self) {
        if let (Some(client), Some(tenant)) = (self.client.take(), self.tenant.take()) {
            self.shared.slots.give_back(tenant, client);
            self.shared.client_left(client, tenant);
        }
    }
}

impl<W: Wire> Connection<W> {
    pub(crate) fn new(stream: W, peer: Peer, id: u64, shared: Arc<Shared>) -> Connection<W> {
        let hello_deadline = Instant::now() + shared.hello_timeout;
        Connection {
            stream,
            peer,
            shared,
            id,
            client: None,
            tenant: None,
            nonce: None,
            auth_attempts: 0,
            frame_deadline: None,
            frame_armed: false,
            payload: Vec::new(),
            out: Vec::with_capacity(256),
            scratch: Vec::new(),
            slabs: Vec::new(),
            pages: Vec::with_capacity(MAX_BATCH_PAGES),
            errors: 0,
            hello_deadline,
            spin_next: false,
            poll: PollChoice::default(),
        }
    }

    /// Serves the connection until the peer closes it, it breaks the protocol, or shutdown.
    pub(crate) fn serve(mut self) {
        if let Err(e) = self.stream.setup() {
            self.warn(&format!("closing a connection: socket setup failed: {e}"));
            return;
        }
        tracing::debug!(peer = %self.peer, "connection opened");
        loop {
            let mut head = [0u8; HEADER_LEN];
            match self.read_head(&mut head) {
                Ok(true) => {}
                Ok(false) => break,
                Err(e) => {
                    if !self.shared.stop.load(Ordering::Acquire) {
                        self.warn(&format!("closing the connection: {e}"));
                    }
                    break;
                }
            }
            let t0 = Instant::now();
            if self.request(&head, t0) == Flow::Close {
                break;
            }
        }
        self.stream.close();
        tracing::debug!(peer = %self.peer, client = ?self.client, "connection closed");
    }

    /// Before the handshake: the deadline every read must respect. After: the deadline of the
    /// request being read (none while idle between requests).
    fn read_deadline(&mut self) -> Option<Instant> {
        if self.client.is_none() {
            return Some(self.hello_deadline);
        }
        self.frame_armed |= self.frame_deadline.is_some();
        self.frame_deadline
    }

    /// Reads a frame header. `Ok(false)`: the peer closed cleanly between frames.
    fn read_head(&mut self, head: &mut [u8; HEADER_LEN]) -> io::Result<bool> {
        let authenticated = self.client.is_some();
        if authenticated {
            self.frame_deadline = None;
            if std::mem::take(&mut self.frame_armed) {
                // Idle between requests: wait as long as the client likes (the stall timeout
                // only paces the checks of this loop).
                self.stream.idle(self.shared.stall_timeout)?;
            }
        }
        let mut deadline = self.read_deadline();
        if deadline.is_none() && self.spin_next {
            self.stream.spin_until_readable();
        }
        let mut filled = 0;
        while filled < HEADER_LEN {
            if filled > 0 && authenticated && self.frame_deadline.is_none() {
                // The request has begun: all of it must arrive within the stall timeout.
                self.frame_deadline = Some(Instant::now() + self.shared.stall_timeout);
                deadline = self.read_deadline();
            }
            self.stream.arm(deadline)?;
            match self.stream.read(&mut head[filled..]) {
                Ok(0) if filled == 0 => return Ok(false),
                Ok(0) => {
                    return Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        format!(
                        "truncated frame: peer closed after {filled} of {HEADER_LEN} header bytes"
                    ),
                    ))
                }
                Ok(n) => filled += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if is_timeout(&e) && self.stream.early(deadline) => {}
                // Authenticated and idle between requests: wait on.
                Err(e) if authenticated && filled == 0 && is_timeout(&e) => {}
                Err(e) if authenticated && is_timeout(&e) => {
                    return Err(self.stalled("a frame header"))
                }
                Err(e) if is_timeout(&e) => return Err(deadline_passed()),
                Err(e) => return Err(e),
            }
        }
        if authenticated && self.frame_deadline.is_none() {
            self.frame_deadline = Some(Instant::now() + self.shared.stall_timeout);
        }
        Ok(true)
    }

    /// An authenticated client took longer than the stall timeout to send a whole request.
    fn stalled(&self, inside: &str) -> io::Error {
        io::Error::new(
            io::ErrorKind::TimedOut,
            format!(
                "the client took more than {} ms to send {inside}",
                self.shared.stall_timeout.as_millis()
            ),
        )
    }

    /// Reads exactly `buf.len()` payload bytes; a close midway is a truncated frame. Before
    /// HELLO every read is bounded by the HELLO deadline.
    fn read_payload(stream: &mut W, deadline: Option<Instant>, buf: &mut [u8]) -> io::Result<()> {
        let mut filled = 0;
        while filled < buf.len() {
            stream.arm(deadline)?;
            match stream.read(&mut buf[filled..]) {
                Ok(0) => {
                    return Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "truncated frame: peer closed inside a payload",
                    ))
                }
                Ok(n) => filled += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if is_timeout(&e) && stream.early(deadline) => {}
                Err(e) if is_timeout(&e) => return Err(deadline_passed()),
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Reads and discards `n` payload bytes (of a refused request) so the next frame lines up.
    fn drain(&mut self, mut n: usize) -> io::Result<()> {
        let deadline = self.read_deadline();
        if self.scratch.is_empty() {
            self.scratch.resize(DRAIN_BUFFER_BYTES, 0);
        }
        while n > 0 {
            let k = n.min(self.scratch.len());
            Self::read_payload(&mut self.stream, deadline, &mut self.scratch[..k])?;
            n -= k;
        }
        Ok(())
    }

    /// Logs a warning about this connection, within the rate limit of its tenant once
    /// authenticated; before that within its peer address's and the donor-wide one, so neither
    /// a token holder's nor a stranger's connections can flood the log.
    fn warn(&self, message: &str) {
        if let Some(tenant) = self.tenant {
            if self.shared.allow_log(LogKey::Tenant(tenant)) {
                tracing::warn!(peer = %self.peer, client = ?self.client, "{message}");
            }
        } else {
            self.shared.note_refusal(
                self.peer.ip(),
                &format!("unauthenticated connection from {}: {message}", self.peer),
            );
        }
    }

    fn log_refusal(&mut self, op: u8, status: Status, message: &str) {
        self.errors += 1;
        if self.client.is_none() && status == Status::ClientIdTaken {
            // The handshake's normal answer to a client's second connection (it then attaches
            // with its reconnect key): `farmem run --local-donor tcp` printed two such warnings
            // on every run.
            tracing::debug!(peer = %self.peer, "{message}");
            return;
        }
        if self.client.is_none() {
            let op = Opcode::from_wire(op).map_or("unknown", |o| o.name());
            self.warn(&format!(
                "refused a {op} request ({}): {message}",
                status.name()
            ));
            return;
        }
        if self
            .tenant
            .is_none_or(|t| self.shared.allow_log(LogKey::Tenant(t)))
        {
            let op = Opcode::from_wire(op).map_or("unknown", |o| o.name());
            tracing::warn!(
                peer = %self.peer,
                client = ?self.client,
                request = op,
                status = status.name(),
                errors_on_connection = self.errors,
                "refused a request: {message}"
            );
        }
    }

    /// Sends `self.out`; a failure (peer gone, send timeout) closes the connection.
    fn send_out(&mut self) -> Flow {
        match self
            .stream
            .write_all(&self.out)
            .and_then(|()| self.stream.flush())
        {
            Ok(()) => Flow::Continue,
            Err(e) => {
                self.warn(&format!(
                    "closing the connection: sending a response failed: {e}"
                ));
                Flow::Close
            }
        }
    }

    fn refuse(&mut self, op: u8, request_id: u64, r: &Refusal, flow: Flow) -> Served {
        self.log_refusal(op, r.status, &r.message);
        self.out.clear();
        encode_error(&mut self.out, op, request_id, r.status, &r.message);
        let sent = self.send_out();
        Served {
            status: r.status,
            bytes_out: self.out.len() as u64,
            flow: if sent == Flow::Close {
                Flow::Close
            } else {
                flow
            },
        }
    }

    fn ok(&mut self) -> Served {
        let flow = self.send_out();
        Served {
            status: Status::Ok,
            bytes_out: self.out.len() as u64,
            flow,
        }
    }

    /// Serves one request whose header bytes are `head`.
    fn request(&mut self, head: &[u8; HEADER_LEN], t0: Instant) -> Flow {
        let header = match Header::decode(head) {
            Ok(h) => h,
            Err(e) => return self.bad_frame(head, &e, t0),
        };
        let op = if header.is_response() {
            None
        } else {
            header.op()
        };
        let bytes_in = (HEADER_LEN + header.payload_len as usize) as u64;
        // A client reading one page at a time is waiting on it (a demand fault): poll for its
        // next request before sleeping, where that pays (`PollChoice`). Batches are
        // throughput work, where spinning would only take CPU from the client on a shared
        // machine.
        let single_read = op == Some(Opcode::ReadPages) && header.payload_len <= SINGLE_READ_LEN;
        self.poll.on_request(single_read, t0);
        self.spin_next = single_read && self.poll.polling();
        let served = if op == Some(Opcode::WritePages) {
            self.write_pages(&header)
        } else {
            self.other_request(&header)
        };
        let served = match served {
            Ok(s) => s,
            Err(e) => {
                self.warn(&format!("closing the connection: {e}"));
                return Flow::Close;
            }
        };
        self.shared.metrics.record(
            op,
            served.status,
            bytes_in,
            served.bytes_out,
            self.stream.service_time(t0),
        );
        served.flow
    }

    /// A header that cannot be decoded: answer if the request id is readable, then close.
    fn bad_frame(&mut self, head: &[u8; HEADER_LEN], e: &FrameError, t0: Instant) -> Flow {
        let status = match e {
            FrameError::UnsupportedVersion { .. } => Status::BadVersion,
            _ => Status::Malformed,
        };
        let message = format!("{e}; closing the connection");
        match Header::salvage(head) {
            Some((op, request_id)) => {
                let served = self.refuse(op, request_id, &Refusal { status, message }, Flow::Close);
                self.shared.metrics.record(
                    Opcode::from_wire(op),
                    status,
                    HEADER_LEN as u64,
                    served.bytes_out,
                    self.stream.service_time(t0),
                );
            }
            None => {
                self.log_refusal(0, status, &message);
                self.shared.metrics.record(
                    None,
                    status,
                    HEADER_LEN as u64,
                    0,
                    self.stream.service_time(t0),
                );
            }
        }
        Flow::Close
    }

    fn other_request(&mut self, header: &Header) -> io::Result<Served> {
        let len = header.payload_len as usize;
        if len > MAX_SMALL_PAYLOAD {
            // No request but WRITE_PAGES is this long: refuse without buffering it, so hostile
            // frames cannot make each connection hold a megabyte.
            self.drain(len)?;
            let op = if header.is_response() {
                None
            } else {
                header.op()
            };
            let r = match op {
                None => Refusal {
                    status: Status::UnknownRequest,
                    message: format!("unknown request type {:#04x}", header.opcode),
                },
                Some(op) => Refusal {
                    status: Status::Malformed,
                    message: format!("{}: payload of {len} bytes is too long", op.name()),
                },
            };
            return Ok(self.refuse(header.opcode, header.request_id, &r, Flow::Continue));
        }
        let mut payload = std::mem::take(&mut self.payload);
        payload.clear();
        payload.resize(header.payload_len as usize, 0);
        let deadline = self.read_deadline();
        let read = Self::read_payload(&mut self.stream, deadline, &mut payload);
        let served = match read {
            Err(e) => Err(e),
            Ok(()) => Ok(match Request::decode(header, &payload) {
                Err(e) => {
                    let r = Refusal {
                        status: e.status(),
                        message: e.to_string(),
                    };
                    self.refuse(header.opcode, header.request_id, &r, Flow::Continue)
                }
                Ok(req) => self.dispatch(header, req),
            }),
        };
        self.payload = payload;
        served
    }

    fn dispatch(&mut self, header: &Header, req: Request<'_>) -> Served {
        let (op, id) = (header.opcode, header.request_id);
        match req {
            Request::Hello { version } => return self.hello(op, id, version),
            Request::Auth {
                client_id,
                mode,
                token_proof,
                key_or_proof,
            } => return self.auth(op, id, client_id, mode, &token_proof, &key_or_proof),
            _ => {}
        }
        let Some(client) = self.client else {
            let r = Refusal {
                status: Status::NotAuthenticated,
                message: "complete the handshake (HELLO, then AUTH) first".into(),
            };
            return self.refuse(op, id, &r, Flow::Continue);
        };
        let store = Arc::clone(&self.shared.store);
        self.out.clear();
        match req {
            Request::Hello { .. } | Request::Auth { .. } => unreachable!("handled above"),
            Request::AllocSlab => match self
                .shared
                .memory_pressure()
                .map_or_else(|| store.alloc(client), Err)
            {
                Ok(slab) => {
                    tracing::debug!(client, slab, "slab allocated");
                    encode_slab_allocated(&mut self.out, id, slab);
                    self.ok()
                }
                Err(r) => self.refuse(op, id, &r, Flow::Continue),
            },
            Request::FreeSlab { slab } => match self.shared.reclaimer.free(client, slab, &store) {
                Ok(()) => {
                    tracing::debug!(client, slab, "slab freed");
                    encode_success(&mut self.out, Opcode::FreeSlab, id);
                    self.ok()
                }
                Err(r) => self.refuse(op, id, &r, Flow::Continue),
            },
            Request::Stats => {
                let stats = self.shared.metrics.stats(&store);
                encode_stats_reply(&mut self.out, id, &stats);
                self.ok()
            }
            Request::Ident { label } => {
                store.identify(client, label);
                encode_success(&mut self.out, Opcode::Ident, id);
                self.ok()
            }
            Request::Clients => {
                // Authenticated, so the tenant is known; only its own clients are told.
                let tenant = self.tenant.unwrap_or(0);
                encode_clients_reply(&mut self.out, id, &store.clients_of(tenant));
                self.ok()
            }
            Request::Reclaims => {
                let slabs = self.shared.reclaimer.wanted_from(client, &store);
                match encode_give_back(&mut self.out, id, &slabs) {
                    Ok(()) => self.ok(),
                    Err(e) => {
                        // Unreachable: the reclaimer bounds its lists.
                        let r = Refusal {
                            status: Status::Internal,
                            message: e.to_string(),
                        };
                        self.refuse(op, id, &r, Flow::Continue)
                    }
                }
            }
            Request::ReadPages(list) => {
                if let Err(r) = store.resolve(client, list.iter(), &mut self.slabs, &mut self.pages)
                {
                    return self.refuse(op, id, &r, Flow::Continue);
                }
                let count = self.pages.len();
                if let Err(e) = encode_pages_header(&mut self.out, id, count) {
                    // Unreachable: the decoder bounded the count already.
                    let r = Refusal {
                        status: Status::Internal,
                        message: e.to_string(),
                    };
                    return self.refuse(op, id, &r, Flow::Continue);
                }
                let slabs = &self.slabs;
                let sent = self.stream.send_pages(
                    &self.out,
                    self.pages.iter().map(|&(i, p)| (slabs[i].mem(), p)),
                );
                self.slabs.clear();
                let flow = match sent {
                    Ok(()) => {
                        self.shared.metrics.pages(count as u64, 0);
                        Flow::Continue
                    }
                    Err(e) => {
                        self.warn(&format!(
                            "closing the connection: sending pages failed: {e}"
                        ));
                        Flow::Close
                    }
                };
                Served {
                    status: Status::Ok,
                    bytes_out: (self.out.len() + count * PAGE_SIZE) as u64,
                    flow,
                }
            }
            Request::WritePages(_) => unreachable!("WRITE_PAGES is served by write_pages"),
        }
    }

    /// HELLO: checks the version and answers with this connection's challenge nonce.
    fn hello(&mut self, op: u8, id: u64, version: u16) -> Served {
        if version != u16::from(PROTOCOL_VERSION) {
            let r = Refusal {
                status: Status::BadVersion,
                message: format!(
                    "protocol version {version} is not supported (this donor speaks {PROTOCOL_VERSION}); run the same farmem version on both ends"
                ),
            };
            return self.refuse(op, id, &r, Flow::Close);
        }
        // A repeated HELLO gets a fresh nonce (the old one can no longer be answered).
        let mut nonce = [0u8; NONCE_LEN];
        if let Err(e) = random_bytes(&mut nonce) {
            let r = Refusal {
                status: Status::Internal,
                message: e.to_string(),
            };
            return self.refuse(op, id, &r, Flow::Close);
        }
        self.nonce = Some(nonce);
        self.out.clear();
        encode_challenge(&mut self.out, id, &nonce);
        self.ok()
    }

    /// The tenant whose token `proof` proves for this connection's nonce, if any. Every
    /// tenant's proof is computed and compared in constant time.
    fn tenant_for(
        &self,
        nonce: &[u8; NONCE_LEN],
        client_id: u64,
        proof: &[u8; PROOF_LEN],
    ) -> Option<usize> {
        let Some(tokens) = &self.shared.tokens else {
            return Some(0);
        };
        let mut found = None;
        for (i, t) in tokens.iter().enumerate() {
            if proofs_match(&token_proof(t, nonce, client_id), proof) && found.is_none() {
                found = Some(i);
            }
        }
        found
    }

    /// AUTH: checks the token proof, then registers or attaches the client.
    fn auth(
        &mut self,
        op: u8,
        id: u64,
        client_id: u64,
        mode: AuthMode,
        proof: &[u8; PROOF_LEN],
        key_or_proof: &[u8; PROOF_LEN],
    ) -> Served {
        let Some(nonce) = self.nonce else {
            let r = Refusal {
                status: Status::NotAuthenticated,
                message: "send HELLO before AUTH".into(),
            };
            return self.refuse(op, id, &r, Flow::Close);
        };
        self.auth_attempts += 1;
        let Some(tenant) = self.tenant_for(&nonce, client_id, proof) else {
            self.warn("authentication failed: wrong or missing auth token; closing the connection");
            let r = Refusal {
                status: Status::AuthFailed,
                message: "wrong or missing auth token: give the donor's token (--token-file)"
                    .into(),
            };
            return self.refuse(op, id, &r, Flow::Close);
        };
        match self.client {
            // Authenticated already (as this client): nothing changes.
            Some(c) if c == client_id => return self.welcome(id),
            Some(c) => {
                let r = Refusal {
                    status: Status::Malformed,
                    message: format!(
                        "this connection is already authenticated as client {c}; open a new connection for client {client_id}"
                    ),
                };
                return self.refuse(op, id, &r, Flow::Continue);
            }
            None => {}
        }
        // The slot first: a connection refused for its bounds must not register the id.
        if let Err(r) = self.shared.slots.take(tenant, client_id) {
            self.shared.metrics.refused_bound();
            return self.refuse(op, id, &r, Flow::Close);
        }
        let store = Arc::clone(&self.shared.store);
        let joined = match mode {
            AuthMode::Register => store.register(client_id, tenant, ReconnectKey(*key_or_proof)),
            AuthMode::Attach => store.attach(client_id, tenant, &nonce, key_or_proof),
        };
        if let Err(r) = joined {
            self.shared.slots.give_back(tenant, client_id);
            let retry = matches!(r.status, Status::UnknownClient | Status::ClientIdTaken)
                && self.auth_attempts < MAX_AUTH_ATTEMPTS;
            if r.status == Status::AuthFailed {
                self.warn(&format!("authentication failed: wrong reconnect key for client {client_id}; closing the connection"));
            }
            let flow = if retry { Flow::Continue } else { Flow::Close };
            return self.refuse(op, id, &r, flow);
        }
        self.client = Some(client_id);
        self.tenant = Some(tenant);
        store.connected_from(client_id, self.peer.ip());
        self.shared.logged_in(self.id, self.peer.ip());
        // From now on a read may wait forever between requests but a request must arrive
        // whole within the stall timeout (see `read_head`).
        if let Err(e) = self.stream.idle(self.shared.stall_timeout) {
            self.warn(&format!(
                "closing the connection: setting the read timeout failed: {e}"
            ));
            return Served {
                status: Status::Internal,
                bytes_out: 0,
                flow: Flow::Close,
            };
        }
        if self.shared.allow_log(LogKey::Tenant(tenant)) {
            tracing::info!(
                peer = %self.peer,
                client = client_id,
                tenant = %self.shared.tenant_names[tenant],
                mode = ?mode,
                "client authenticated"
            );
        }
        self.welcome(id)
    }

    /// AUTH's success response.
    fn welcome(&mut self, id: u64) -> Served {
        self.out.clear();
        encode_welcome(
            &mut self.out,
            id,
            DonorInfo {
                slab_size_bytes: self.shared.store.slab_size_bytes(),
                capacity_bytes: self.shared.store.capacity_bytes(),
            },
        );
        self.ok()
    }

    /// WRITE_PAGES: read count and addresses, check them all, then receive the page data
    /// straight into slab memory (or drain it if the request is refused).
    fn write_pages(&mut self, header: &Header) -> io::Result<Served> {
        let (op, id) = (header.opcode, header.request_id);
        let len = header.payload_len as usize;
        if len < 2 {
            self.drain(len)?;
            let r = Refusal {
                status: Status::Malformed,
                message: format!("write_pages: payload is {len} bytes, shorter than its count"),
            };
            return Ok(self.refuse(op, id, &r, Flow::Continue));
        }
        let mut count_buf = [0u8; 2];
        let deadline = self.read_deadline();
        Self::read_payload(&mut self.stream, deadline, &mut count_buf)?;
        let count = usize::from(u16::from_le_bytes(count_buf));
        let mut remaining = len - 2;
        let expected = 2 + count * (PAGE_ADDR_LEN + PAGE_SIZE);
        let early = if count == 0 || count > MAX_BATCH_PAGES {
            Some(Refusal {
                status: Status::BatchTooLarge,
                message: format!("page batch of {count} pages is outside 1..={MAX_BATCH_PAGES}"),
            })
        } else if len != expected {
            Some(Refusal {
                status: Status::Malformed,
                message: format!("write_pages: payload is {len} bytes, expected {expected}"),
            })
        } else {
            None
        };
        if let Some(r) = early {
            self.drain(remaining)?;
            return Ok(self.refuse(op, id, &r, Flow::Continue));
        }
        self.payload.clear();
        self.payload.resize(count * PAGE_ADDR_LEN, 0);
        Self::read_payload(&mut self.stream, deadline, &mut self.payload)?;
        remaining -= count * PAGE_ADDR_LEN;
        let Some(client) = self.client else {
            self.drain(remaining)?;
            let r = Refusal {
                status: Status::NotAuthenticated,
                message: "complete the handshake (HELLO, then AUTH) first".into(),
            };
            return Ok(self.refuse(op, id, &r, Flow::Continue));
        };
        let addrs = self.payload.chunks_exact(PAGE_ADDR_LEN).map(|c| PageAddr {
            slab: u32::from_le_bytes([c[0], c[1], c[2], c[3]]),
            page: u32::from_le_bytes([c[4], c[5], c[6], c[7]]),
        });
        let resolved = self
            .shared
            .store
            .resolve(client, addrs, &mut self.slabs, &mut self.pages);
        if let Err(r) = resolved {
            self.drain(remaining)?;
            return Ok(self.refuse(op, id, &r, Flow::Continue));
        }
        self.shared.store.note_writes(&self.slabs, &self.pages);
        // The page data too must arrive before the request's deadline: the socket's timeout is
        // re-armed to what is left of it before every read, so trickling bytes gains nothing.
        let deadline = self.read_deadline();
        let slabs = &self.slabs;
        let received = self.stream.recv_pages(
            self.pages.iter().map(|&(i, p)| (slabs[i].mem(), p)),
            deadline,
        );
        self.slabs.clear();
        received.map_err(|e| {
            if is_timeout(&e) {
                self.stalled("WRITE_PAGES page data")
            } else {
                e
            }
        })?;
        self.shared.metrics.pages(0, count as u64);
        self.out.clear();
        encode_success(&mut self.out, Opcode::WritePages, id);
        Ok(self.ok())
    }
}

/// Payload length of a READ_PAGES request for one page (count, then one page address).
const SINGLE_READ_LEN: u32 = 2 + PAGE_ADDR_LEN as u32;
