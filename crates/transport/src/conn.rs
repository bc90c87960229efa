//! One TCP connection to a donor: the HELLO handshake, the send path (the caller's thread writes
//! its own frame under a mutex) and the receive path (the waiting threads read the responses
//! themselves, one at a time, and hand each to the request it answers).
//!
//! # Design
//! - Sending: the calling thread takes the writer mutex, encodes header and page addresses into a
//!   reused buffer and writes them together with the caller's page slices in one vectored write;
//!   page bytes are never copied. The socket has a write timeout (the request timeout), so a
//!   donor that stops reading cannot block a sender forever.
//! - Receiving (leader/follower): a thread waiting for a response becomes the *reader* if no
//!   other thread is reading; it reads frames through the connection's buffered reader, files
//!   every response under its request id (waking the threads waiting for them) and stops
//!   reading as soon as its own response is in, handing the reader role to a waiting thread.
//!   The other waiters sleep on a condition variable. A single synchronous request is therefore
//!   answered on its own thread, with one wake-up (the socket's) instead of two (a reader
//!   thread's, then the waiter's): measured here at ~6.5 µs of a ~22 µs loopback round trip.
//!   Page payloads are read straight into the `Vec` handed to the waiter.
//! - Failure: the first fatal event (read error, close, protocol violation, write failure,
//!   request timeout) marks the connection closed, shuts the socket down and fails every request
//!   in flight; the client opens a new connection on the next request.
//!
//! # Limitations
//! - Responses are read only while some thread waits: a request submitted and never waited for
//!   keeps its response in the socket until another request on the connection is waited for.
//! - A connection that breaks while idle is noticed by the next request (which fails with
//!   `Disconnected`); the request after it reconnects.

use std::collections::HashMap;
use std::io::{self, BufReader, IoSlice, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use farmem_proto::{
    attach_proof, encode_auth, encode_hello, encode_ident, read_frame, token_proof, AuthMode,
    DonorInfo, DonorStats, EncodeError, Header, Opcode, ReadFrameError, Response, Status,
    HEADER_LEN, MAX_BATCH_PAGES, PAGE_SIZE,
};

use crate::{ClientConfig, TransportError};

/// Size of the reader's buffer: small responses are read many at a time, page payloads larger
/// than this bypass it.
const READ_BUFFER_BYTES: usize = 64 * 1024;

/// What a successful response carries.
#[derive(Debug)]
pub(crate) enum Reply {
    Slab(u32),
    Done,
    Pages(Vec<u8>),
    Stats(DonorStats),
    /// The slabs the donor wants back (RECLAIMS' answer).
    GiveBack(Vec<u32>),
    /// This client's tenant and its clients (CLIENTS' answer).
    Clients(farmem_proto::ClientsReply),
}

/// Why a connection ended; turned into one [`TransportError`] per request in flight.
#[derive(Debug, Clone)]
pub(crate) enum Failure {
    /// Closed, reset, or abandoned.
    Lost(String),
    /// The donor broke the protocol.
    Protocol(String),
}

impl Failure {
    fn to_error(&self, addr: &str, op: &'static str) -> TransportError {
        match self {
            Failure::Lost(reason) => TransportError::Disconnected {
                addr: addr.to_string(),
                op,
                reason: reason.clone(),
            },
            Failure::Protocol(detail) => TransportError::Protocol {
                addr: addr.to_string(),
                op,
                detail: detail.clone(),
            },
        }
    }
}

/// A request's outcome and when it arrived.
type Outcome = (Result<Reply, TransportError>, Instant);

/// Requests in flight and responses not yet collected, by request id.
#[derive(Debug, Default)]
struct Demux {
    /// Sent, not answered: the opcode each expects.
    pending: HashMap<u64, Opcode>,
    /// Answered (or failed), not yet collected by their waiter.
    done: HashMap<u64, Outcome>,
    /// Some thread holds the reader role.
    reading: bool,
    closed: Option<Failure>,
}

/// How [`Conn::wait`] ended.
pub(crate) enum Waited {
    /// The response (or the connection's failure) for this request.
    Done(Outcome),
    /// The deadline passed; the request has been forgotten.
    TimedOut,
}

#[derive(Debug)]
struct Writer {
    stream: TcpStream,
    buf: Vec<u8>,
}

/// Why [`Conn::send`] failed.
pub(crate) enum SendError {
    /// The connection was already closed; nothing was sent, so a new connection may be tried.
    Closed,
    /// A real failure to report.
    Failed(TransportError),
}

/// The receive side: whoever holds this reads responses.
#[derive(Debug)]
struct Reader {
    stream: BufReader<TcpStream>,
    payload: Vec<u8>,
    /// The socket's current receive timeout.
    timeout: Duration,
    /// How long the rest of a frame that has begun is waited for: the request timeout,
    /// whatever the waiter's own deadline (see [`read_one`]).
    patience: Duration,
    /// `ClientConfig::spin`.
    spin: Duration,
}

/// One live connection.
#[derive(Debug)]
pub(crate) struct Conn {
    addr: Arc<str>,
    writer: Mutex<Writer>,
    reader: Mutex<Reader>,
    demux: Mutex<Demux>,
    /// Signalled when a response is filed, the reader role is free, or the connection failed.
    changed: Condvar,
    closed: AtomicBool,
    /// Set when the client closes the connection on purpose (drop), to keep the log quiet.
    closing: AtomicBool,
    control: TcpStream,
}

/// Locks a mutex, ignoring poisoning: every critical section here leaves consistent state.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn is_timeout(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
    )
}

impl Conn {
    /// Connects to `addr` and performs the handshake: HELLO (the donor answers with a nonce),
    /// then AUTH proving the token and registering the client id with its reconnect key
    /// (`registered == false`) or proving that key to attach to it. If the donor does not know
    /// the id (its slabs were reaped) the client registers it; if the id is registered (by
    /// another connection of this client) it attaches. Request ids come from `ids`.
    pub(crate) fn open(
        addr: &Arc<str>,
        cfg: &ClientConfig,
        ids: &AtomicU64,
        registered: bool,
    ) -> Result<(Arc<Conn>, DonorInfo), TransportError> {
        let stream = connect(addr, cfg.connect_timeout)?;
        let setup = |e: io::Error| TransportError::Connect {
            addr: addr.to_string(),
            source: e,
        };
        stream.set_nodelay(true).map_err(setup)?;
        stream
            .set_write_timeout(Some(cfg.request_timeout))
            .map_err(setup)?;
        stream
            .set_read_timeout(Some(cfg.request_timeout))
            .map_err(setup)?;

        let refused = |status: Status, message: String| TransportError::Refused {
            addr: addr.to_string(),
            status,
            message,
        };
        let mut frame = Vec::new();
        let hello_id = ids.fetch_add(1, Ordering::Relaxed);
        encode_hello(&mut frame, hello_id);
        let nonce = exchange(
            &stream,
            addr,
            cfg,
            Opcode::Hello,
            hello_id,
            &frame,
            |r| match r {
                Response::Challenge { nonce } => Some(nonce),
                _ => None,
            },
        )?
        .map_err(|(status, message)| refused(status, message))?;

        let token = cfg.token.as_deref().unwrap_or(&[]);
        let client_id = cfg.client_id;
        let proof = token_proof(token, &nonce, client_id);
        let mut mode = if registered {
            AuthMode::Attach
        } else {
            AuthMode::Register
        };
        let mut attempts = 0;
        let info = loop {
            attempts += 1;
            let key_or_proof = match mode {
                AuthMode::Register => cfg.reconnect_key.0,
                AuthMode::Attach => attach_proof(&cfg.reconnect_key, &nonce, client_id),
            };
            frame.clear();
            let auth_id = ids.fetch_add(1, Ordering::Relaxed);
            encode_auth(&mut frame, auth_id, client_id, mode, &proof, &key_or_proof);
            let answer = exchange(
                &stream,
                addr,
                cfg,
                Opcode::Auth,
                auth_id,
                &frame,
                |r| match r {
                    Response::Welcome(info) => Some(info),
                    _ => None,
                },
            )?;
            match answer {
                Ok(info) => break info,
                // Attaching after having been attached: the donor lost this client's state.
                Err((Status::UnknownClient, _)) if registered => {
                    return Err(TransportError::Forgotten {
                        addr: addr.to_string(),
                    })
                }
                Err((Status::UnknownClient, _)) if attempts < 3 => mode = AuthMode::Register,
                Err((Status::ClientIdTaken, _)) if attempts < 3 => mode = AuthMode::Attach,
                Err((status, message)) => return Err(refused(status, message)),
            }
        };
        if info.slab_size_bytes == 0 || info.slab_size_bytes % PAGE_SIZE as u64 != 0 {
            return Err(TransportError::Protocol {
                addr: addr.to_string(),
                op: "auth",
                detail: format!(
                    "slab size {} is not a positive multiple of {PAGE_SIZE}",
                    info.slab_size_bytes
                ),
            });
        }

        if let Some(label) = &cfg.label {
            // What this client is, for the donor's operators (`farmem stats --donor`). A
            // donor that does not know IDENT refuses it; the session goes on without.
            frame.clear();
            let ident_id = ids.fetch_add(1, Ordering::Relaxed);
            if encode_ident(&mut frame, ident_id, label).is_ok() {
                let answer = exchange(&stream, addr, cfg, Opcode::Ident, ident_id, &frame, |r| {
                    matches!(r, Response::Done).then_some(())
                })?;
                if let Err((status, message)) = answer {
                    tracing::debug!(donor = %addr, ?status, "IDENT refused: {message}");
                }
            }
        }

        let reader_stream = farmem_fds::protect(stream.try_clone().map_err(setup)?);
        let control = farmem_fds::protect(stream.try_clone().map_err(setup)?);
        let conn = Arc::new(Conn {
            addr: addr.clone(),
            writer: Mutex::new(Writer {
                stream,
                buf: Vec::with_capacity(HEADER_LEN + 2 + 8 * MAX_BATCH_PAGES),
            }),
            reader: Mutex::new(Reader {
                stream: BufReader::with_capacity(READ_BUFFER_BYTES, reader_stream),
                payload: Vec::new(),
                timeout: cfg.request_timeout,
                patience: cfg.request_timeout,
                spin: cfg.spin,
            }),
            demux: Mutex::new(Demux::default()),
            changed: Condvar::new(),
            closed: AtomicBool::new(false),
            closing: AtomicBool::new(false),
            control,
        });
        tracing::debug!(donor = %addr, "connected");
        Ok((conn, info))
    }

    /// Whether the connection has failed or been closed.
    pub(crate) fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    /// Registers a request, then writes its frame: `encode` appends everything but the page
    /// bytes to the buffer, `pages` follow it on the wire.
    pub(crate) fn send(
        &self,
        op: Opcode,
        id: u64,
        timeout: Duration,
        pages: &[&[u8]],
        encode: impl FnOnce(&mut Vec<u8>) -> Result<(), EncodeError>,
    ) -> Result<(), SendError> {
        {
            let mut demux = lock(&self.demux);
            if demux.closed.is_some() {
                return Err(SendError::Closed);
            }
            demux.pending.insert(id, op);
        }
        let mut writer = lock(&self.writer);
        let Writer { stream, buf } = &mut *writer;
        buf.clear();
        if let Err(source) = encode(buf) {
            drop(writer);
            self.forget(id);
            return Err(SendError::Failed(TransportError::Invalid {
                op: op.name(),
                source,
            }));
        }
        if let Err(e) = write_all_vectored(stream, buf, pages) {
            drop(writer);
            self.forget(id);
            let err = if is_timeout(&e) {
                TransportError::Timeout {
                    addr: self.addr.to_string(),
                    op: op.name(),
                    after: timeout,
                }
            } else {
                TransportError::Disconnected {
                    addr: self.addr.to_string(),
                    op: op.name(),
                    reason: format!("sending failed: {e}"),
                }
            };
            self.fail(Failure::Lost(format!("sending {} failed: {e}", op.name())));
            return Err(SendError::Failed(err));
        }
        Ok(())
    }

    /// Forgets request `id` (its waiter gave up or dropped it): a late response is discarded.
    pub(crate) fn forget(&self, id: u64) {
        let mut demux = lock(&self.demux);
        demux.pending.remove(&id);
        demux.done.remove(&id);
    }

    /// Waits until request `id` is answered or `deadline` passes, reading the socket itself when
    /// no other thread is (see the module docs). At the deadline the request is forgotten.
    pub(crate) fn wait(&self, id: u64, deadline: Instant) -> Waited {
        self.wait_or_keep(id, deadline, true)
    }

    /// As [`Conn::wait`]; with `forget` false the request stays in flight at the deadline (a
    /// later wait may still get its answer).
    pub(crate) fn wait_or_keep(&self, id: u64, deadline: Instant, forget: bool) -> Waited {
        let mut demux = lock(&self.demux);
        loop {
            if let Some(outcome) = demux.done.remove(&id) {
                return Waited::Done(outcome);
            }
            if !demux.pending.contains_key(&id) {
                // Forgotten, or never registered: nothing will ever answer it.
                return Waited::Done((
                    Err(TransportError::Disconnected {
                        addr: self.addr.to_string(),
                        op: "request",
                        reason: "the request was forgotten".into(),
                    }),
                    Instant::now(),
                ));
            }
            let now = Instant::now();
            if now >= deadline {
                if forget {
                    demux.pending.remove(&id);
                }
                return Waited::TimedOut;
            }
            if !demux.reading {
                demux.reading = true;
                drop(demux);
                self.read_until_answered(id, deadline);
                demux = lock(&self.demux);
                demux.reading = false;
                // Hand the reader role on: a waiting thread may need it.
                self.changed.notify_all();
                continue;
            }
            demux = self
                .changed
                .wait_timeout(demux, deadline - now)
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .0;
        }
    }

    /// The reader role: reads and files responses until `id`'s is in, the deadline passes, or
    /// the connection fails.
    fn read_until_answered(&self, id: u64, deadline: Instant) {
        let mut reader = lock(&self.reader);
        let Reader {
            stream,
            payload,
            timeout,
            patience,
            spin,
        } = &mut *reader;
        loop {
            let now = Instant::now();
            if now >= deadline {
                return;
            }
            // The socket's receive timeout bounds a blocking read. It is changed only when it is
            // off by more than a factor of two from the time left (a system call saved on every
            // ordinary request): a stalled donor is noticed at most half the request timeout
            // late, and a read that times out early just goes round again.
            let left = deadline - now;
            if stream.buffer().is_empty() && (left < *timeout / 2 || left > *timeout * 2) {
                if let Err(e) = stream.get_ref().set_read_timeout(Some(left)) {
                    self.fail(Failure::Lost(format!(
                        "setting the read timeout failed: {e}"
                    )));
                    return;
                }
                *timeout = left;
            }
            if stream.buffer().is_empty() && !spin.is_zero() {
                spin_until_readable(stream.get_ref(), (Instant::now() + *spin).min(deadline));
            }
            let (rid, result) = match read_one(stream, payload, timeout, *patience) {
                Ok(frame) => frame,
                Err(ReadError::TimedOut) => continue,
                Err(ReadError::Failed(failure)) => {
                    self.fail(failure);
                    return;
                }
            };
            let mut demux = lock(&self.demux);
            let Some(op) = demux.pending.remove(&rid) else {
                // The waiter gave up (timeout) or dropped its `Pending`.
                tracing::debug!(donor = %self.addr, id = rid, "response to a forgotten request");
                continue;
            };
            let outcome = match result {
                Ok((got, reply)) if got != op => {
                    let detail = format!(
                        "answered a {} request with a {} response",
                        op.name(),
                        got.name()
                    );
                    drop(reply);
                    let failure = Failure::Protocol(detail);
                    let err = failure.to_error(&self.addr, op.name());
                    demux.done.insert(rid, (Err(err), Instant::now()));
                    drop(demux);
                    self.fail(failure);
                    return;
                }
                Ok((_, reply)) => Ok(reply),
                Err((status, message)) => Err(TransportError::Status {
                    addr: self.addr.to_string(),
                    op: op.name(),
                    status,
                    message,
                }),
            };
            demux.done.insert(rid, (outcome, Instant::now()));
            if rid == id {
                return;
            }
            drop(demux);
            self.changed.notify_all();
        }
    }

    /// Closes the connection for `failure`: fails every request in flight and shuts the socket
    /// down. Idempotent: the first failure wins.
    pub(crate) fn fail(&self, failure: Failure) {
        {
            let mut demux = lock(&self.demux);
            if demux.closed.is_none() {
                if !self.closing.load(Ordering::Relaxed) {
                    tracing::warn!(donor = %self.addr, ?failure, "donor connection lost");
                }
                self.closed.store(true, Ordering::Release);
            }
            let failure = demux.closed.get_or_insert(failure).clone();
            let now = Instant::now();
            let failed: Vec<(u64, Opcode)> = demux.pending.drain().collect();
            for (id, op) in failed {
                let err = failure.to_error(&self.addr, op.name());
                demux.done.insert(id, (Err(err), now));
            }
        }
        self.changed.notify_all();
        // Ignore errors: the socket may already be shut down or reset.
        let _ = self.control.shutdown(Shutdown::Both);
    }

    /// Closes the connection on purpose (the client is being dropped).
    pub(crate) fn close(&self) {
        self.closing.store(true, Ordering::Relaxed);
        self.fail(Failure::Lost("the client was closed".into()));
    }
}

/// Resolves `addr` and connects to the first address that answers within `timeout`.
/// Sends one handshake request `frame` (opcode `op`, request id `id`) and reads its answer:
/// `Ok(Ok(value))` when `take` accepts the success response, `Ok(Err((status, message)))` when
/// the donor refused (also a refusal frame with request id 0, as the donor sends before closing
/// a connection it cannot serve: "donor full").
fn exchange<T>(
    stream: &TcpStream,
    addr: &str,
    cfg: &ClientConfig,
    op: Opcode,
    id: u64,
    frame: &[u8],
    take: impl FnOnce(Response<'_>) -> Option<T>,
) -> Result<Result<T, (Status, String)>, TransportError> {
    let lost = |e: io::Error| -> TransportError {
        if is_timeout(&e) {
            TransportError::Timeout {
                addr: addr.to_string(),
                op: op.name(),
                after: cfg.request_timeout,
            }
        } else {
            TransportError::Disconnected {
                addr: addr.to_string(),
                op: op.name(),
                reason: e.to_string(),
            }
        }
    };
    let protocol = |detail: String| TransportError::Protocol {
        addr: addr.to_string(),
        op: op.name(),
        detail,
    };
    let mut stream = stream;
    stream.write_all(frame).map_err(lost)?;
    let mut payload = Vec::new();
    let header = match read_frame(&mut stream, &mut payload) {
        Ok(h) => h,
        Err(ReadFrameError::Closed) => {
            return Err(TransportError::Disconnected {
                addr: addr.to_string(),
                op: op.name(),
                reason: format!(
                    "the donor closed the connection before answering {}",
                    op.name()
                ),
            })
        }
        Err(ReadFrameError::Io(e)) => return Err(lost(e)),
        Err(ReadFrameError::Frame { error, .. }) => return Err(protocol(error.to_string())),
    };
    let response = Response::decode(&header, &payload).map_err(|e| protocol(e.to_string()))?;
    if let Response::Error { status, message } = response {
        if header.request_id == id || header.request_id == 0 {
            return Ok(Err((status, message.to_string())));
        }
    }
    if !header.is_response() || header.op() != Some(op) {
        return Err(protocol(format!(
            "expected the {} response, got opcode {:#04x}",
            op.name(),
            header.opcode
        )));
    }
    if header.request_id != id {
        return Err(protocol(format!(
            "{} response carries request id {} instead of {id}",
            op.name(),
            header.request_id
        )));
    }
    let shown = format!("{response:?}");
    take(response)
        .map(Ok)
        .ok_or_else(|| protocol(format!("unexpected {} response {shown}", op.name())))
}

fn connect(addr: &str, timeout: Duration) -> Result<TcpStream, TransportError> {
    let addrs: Vec<SocketAddr> = std::net::ToSocketAddrs::to_socket_addrs(addr)
        .map_err(|e| TransportError::BadAddress {
            addr: addr.to_string(),
            reason: e.to_string(),
        })?
        .collect();
    let mut last = None;
    for a in &addrs {
        match TcpStream::connect_timeout(a, timeout) {
            Ok(s) => return Ok(farmem_fds::protect(s)),
            Err(e) => last = Some(e),
        }
    }
    Err(TransportError::Connect {
        addr: addr.to_string(),
        source: last.unwrap_or_else(|| {
            io::Error::new(io::ErrorKind::NotFound, "the name resolved to no address")
        }),
    })
}

/// One vectored send with MSG_NOSIGNAL. `TcpStream::write_vectored` is `writev`, which raises
/// SIGPIPE on a connection the donor has closed; the runtime runs inside unmodified programs
/// (through the preload library) whose SIGPIPE action is usually the default, which kills them.
/// With MSG_NOSIGNAL the send fails with EPIPE instead and the connection is failed cleanly.
fn send_nosignal(stream: &TcpStream, slices: &[IoSlice<'_>]) -> io::Result<usize> {
    rustix::net::sendmsg(
        stream,
        slices,
        &mut rustix::net::SendAncillaryBuffer::default(),
        rustix::net::SendFlags::NOSIGNAL,
    )
    .map_err(io::Error::from)
}

/// Writes `head` then every slice of `pages`, with as few system calls as the socket allows.
fn write_all_vectored(stream: &mut TcpStream, head: &[u8], pages: &[&[u8]]) -> io::Result<()> {
    // Position: part index (0 = head, i = pages[i - 1]) and bytes already written of it.
    let part = |i: usize| if i == 0 { head } else { pages[i - 1] };
    let parts = 1 + pages.len();
    let (mut index, mut skip) = (0usize, 0usize);
    let mut slices: Vec<IoSlice<'_>> = Vec::with_capacity(parts.min(1024));
    while index < parts {
        slices.clear();
        slices.push(IoSlice::new(&part(index)[skip..]));
        slices.extend((index + 1..parts.min(index + 1024)).map(|i| IoSlice::new(part(i))));
        let mut n = match send_nosignal(stream, &slices) {
            Ok(0) => {
                return Err(io::Error::new(
                    io::ErrorKind::WriteZero,
                    "the socket accepted no bytes",
                ))
            }
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        while index < parts {
            let left = part(index).len() - skip;
            if n < left {
                skip += n;
                break;
            }
            n -= left;
            index += 1;
            skip = 0;
        }
    }
    Ok(())
}

/// Why no response could be read.
enum ReadError {
    /// The socket had nothing within the reader's deadline.
    TimedOut,
    /// The connection is unusable.
    Failed(Failure),
}

fn lost_reading(e: &io::Error) -> ReadError {
    if is_timeout(e) {
        ReadError::TimedOut
    } else {
        ReadError::Failed(Failure::Lost(format!("reading the response failed: {e}")))
    }
}

/// A response as read: its request id, and its opcode and reply, or its error status.
type Frame = (u64, Result<(Opcode, Reply), (Status, String)>);

/// Polls `stream` without blocking until `until` (`ClientConfig::spin`), bytes are waiting or
/// the socket reports anything else (closed, error): the blocking read that follows then
/// returns at once or handles it. Yields between probes (see `ClientConfig::spin`).
fn spin_until_readable(stream: &TcpStream, until: Instant) {
    let mut probe = [0u8; 1];
    while Instant::now() < until {
        match rustix::net::recv(
            stream,
            &mut probe[..],
            rustix::net::RecvFlags::PEEK | rustix::net::RecvFlags::DONTWAIT,
        ) {
            Err(rustix::io::Errno::AGAIN) => std::thread::yield_now(),
            _ => return,
        }
    }
}

/// Reads one response frame. Before its first byte a timeout is the waiter's (the socket's
/// receive timeout, `timeout`, may be as short as its deadline: a prefetch batch waited for
/// only the failover delay); once the frame has begun, the rest of it is waited for up to
/// `patience` (the socket's timeout raised to it), since a frame cut short leaves the stream
/// unusable. A short deadline expiring inside a batch of pages used to break a healthy
/// donor's connection and have it suspected, its copies left out of writes and dropped.
fn read_one(
    reader: &mut BufReader<TcpStream>,
    payload: &mut Vec<u8>,
    timeout: &mut Duration,
    patience: Duration,
) -> Result<Frame, ReadError> {
    let mut head = [0u8; HEADER_LEN];
    let mut filled = 0;
    while filled < HEADER_LEN {
        match reader.read(&mut head[filled..]) {
            Ok(0) if filled == 0 => {
                return Err(ReadError::Failed(Failure::Lost(
                    "the donor closed the connection".into(),
                )))
            }
            Ok(0) => {
                return Err(ReadError::Failed(Failure::Lost(format!(
                    "the donor closed the connection inside a frame header ({filled} of {HEADER_LEN} bytes)"
                ))))
            }
            Ok(n) => {
                if filled == 0 && *timeout < patience {
                    reader
                        .get_ref()
                        .set_read_timeout(Some(patience))
                        .map_err(|e| {
                            ReadError::Failed(Failure::Lost(format!(
                                "setting the read timeout failed: {e}"
                            )))
                        })?;
                    *timeout = patience;
                }
                filled += n;
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            // A timeout in the middle of a header leaves the stream unusable.
            Err(e) if filled > 0 && is_timeout(&e) => {
                return Err(ReadError::Failed(Failure::Lost(format!(
                    "the donor stopped inside a frame header ({filled} of {HEADER_LEN} bytes)"
                ))))
            }
            Err(e) => return Err(lost_reading(&e)),
        }
    }
    let protocol = |detail: String| ReadError::Failed(Failure::Protocol(detail));
    // From here on the frame has begun: any failure, a timeout included, breaks the stream.
    let broken = |e: io::Error| {
        ReadError::Failed(Failure::Lost(format!(
            "reading the response failed inside a frame: {e}"
        )))
    };
    let header = Header::decode(&head).map_err(|e| protocol(e.to_string()))?;
    if !header.is_response() {
        return Err(protocol(format!(
            "received a request frame (opcode {:#04x}) where a response was expected",
            header.opcode
        )));
    }
    let op = header.op();
    if header.status == Status::Ok.code() && op == Some(Opcode::ReadPages) {
        let data = read_pages_payload(&header, reader).map_err(|e| match e {
            PayloadError::Protocol(d) => protocol(d),
            PayloadError::Io(e) => broken(e),
        })?;
        return Ok((
            header.request_id,
            Ok((Opcode::ReadPages, Reply::Pages(data))),
        ));
    }
    payload.clear();
    payload.resize(header.payload_len as usize, 0);
    reader.read_exact(payload).map_err(broken)?;
    let reply = match Response::decode(&header, payload) {
        Ok(Response::SlabAllocated { slab }) => Reply::Slab(slab),
        Ok(Response::Done) => Reply::Done,
        Ok(Response::Stats(s)) => Reply::Stats(s),
        Ok(Response::GiveBack(list)) => Reply::GiveBack(list.iter().collect()),
        Ok(Response::Clients(raw)) => Reply::Clients(raw.decode()),
        Ok(Response::Error { status, message }) => {
            return Ok((header.request_id, Err((status, message.to_string()))))
        }
        Ok(Response::Challenge { .. } | Response::Welcome(_) | Response::Pages { .. }) => {
            return Err(protocol(format!(
                "unexpected {} response in the middle of a session",
                op.map_or("unknown", Opcode::name)
            )))
        }
        Err(e) => return Err(protocol(e.to_string())),
    };
    // A successful response decodes only with a known opcode.
    let op =
        op.ok_or_else(|| protocol(format!("unknown response opcode {:#04x}", header.opcode)))?;
    Ok((header.request_id, Ok((op, reply))))
}

/// Why a READ_PAGES payload could not be read.
enum PayloadError {
    Protocol(String),
    Io(io::Error),
}

/// Reads a successful READ_PAGES payload (`count u16` then the pages) into a fresh buffer of
/// exactly the page bytes.
fn read_pages_payload(header: &Header, reader: &mut impl Read) -> Result<Vec<u8>, PayloadError> {
    let len = header.payload_len as usize;
    if len < 2 {
        return Err(PayloadError::Protocol(format!(
            "read_pages response payload of {len} bytes has no page count"
        )));
    }
    let mut count = [0u8; 2];
    reader.read_exact(&mut count).map_err(PayloadError::Io)?;
    let count = usize::from(u16::from_le_bytes(count));
    if count == 0 || count > MAX_BATCH_PAGES || len != 2 + count * PAGE_SIZE {
        return Err(PayloadError::Protocol(format!(
            "read_pages response claims {count} pages in a payload of {len} bytes"
        )));
    }
    // Read into spare capacity: no zeroing pass over memory the socket is about to fill.
    let want = count * PAGE_SIZE;
    let mut data = Vec::with_capacity(want);
    let got = Read::take(&mut *reader, want as u64)
        .read_to_end(&mut data)
        .map_err(PayloadError::Io)?;
    if got != want {
        return Err(PayloadError::Io(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            format!("the donor closed the connection inside a read_pages response ({got} of {want} page bytes)"),
        )));
    }
    Ok(data)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    #[test]
    fn vectored_writes_deliver_every_byte_in_order() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let pages: Vec<Vec<u8>> = (0..300u32)
            .map(|i| (0..PAGE_SIZE).map(|j| (i as usize * 7 + j) as u8).collect())
            .collect();
        let slices: Vec<&[u8]> = pages.iter().map(Vec::as_slice).collect();
        let head = b"head-bytes".to_vec();
        let expected: Vec<u8> = head
            .iter()
            .copied()
            .chain(pages.iter().flatten().copied())
            .collect();
        let receiver = std::thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            let mut got = Vec::new();
            s.read_to_end(&mut got).unwrap();
            got
        });
        let mut stream = TcpStream::connect(addr).unwrap();
        write_all_vectored(&mut stream, &head, &slices).unwrap();
        drop(stream);
        assert_eq!(receiver.join().unwrap(), expected);
    }
}
