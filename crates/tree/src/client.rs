//! What a process of the tree runs (from the preload library): connect to the coordinator,
//! then send a report every 50 ms to a second (the caller's pace) and pick up the newest grant,
//! never blocking; [`TreeClient::wait`] sleeps until the coordinator pushes one.
//!
//! # Design
//! [`TreeClient::connect`] blocks (at most [`CONNECT_TIMEOUT`]) for the Hello and the first
//! Grant; then the socket is non-blocking. [`TreeClient::exchange`] writes the report (a report
//! the socket cannot take whole now is finished on the next call, and the reports in between
//! are skipped: they are cumulative, the next one says it all) and reads whatever complete
//! lines have arrived, keeping a partial line for the next call. Writes never raise SIGPIPE
//! (the program under the preload library may not ignore it). The socket is close-on-exec.
//!
//! # Limitations
//! A coordinator that sends garbage or an oversized line ends the exchange with an error; the
//! caller keeps its last grant.
use std::io::{self, ErrorKind, Read};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::coordinator::send_all;
use crate::wire::{LineBuffer, Report, ToCoordinator, ToProcess, TREE_PROTOCOL_VERSION};

/// How long [`TreeClient::connect`] waits for the first grant.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// A process's connection to the tree's coordinator.
#[derive(Debug)]
pub struct TreeClient {
    stream: UnixStream,
    socket_path: PathBuf,
    lines: LineBuffer,
    /// The unsent rest of a report line.
    out: Vec<u8>,
    grant: u64,
}

fn err(path: &Path, kind: ErrorKind, what: impl std::fmt::Display) -> io::Error {
    io::Error::new(
        kind,
        format!(
            "farmem process-tree coordinator at {}: {what}",
            path.display()
        ),
    )
}

impl TreeClient {
    /// Connects, says Hello and waits (at most [`CONNECT_TIMEOUT`]) for the first grant;
    /// returns the client and that grant in pages.
    pub fn connect(path: &Path, pid: u32, min_pages: u64) -> io::Result<(TreeClient, u64)> {
        let stream = UnixStream::connect(path)
            .map(farmem_fds::protect)
            .map_err(|e| err(path, e.kind(), format_args!("cannot connect: {e}")))?;
        let mut client = TreeClient {
            stream,
            socket_path: path.to_path_buf(),
            lines: LineBuffer::new(),
            out: Vec::new(),
            grant: 0,
        };
        let hello = ToCoordinator::Hello {
            version: TREE_PROTOCOL_VERSION,
            pid,
            min_pages,
        };
        client
            .stream
            .set_write_timeout(Some(CONNECT_TIMEOUT))
            .map_err(|e| err(path, e.kind(), e))?;
        send_all(&client.stream, &hello.encode())
            .map_err(|e| err(path, e.kind(), format_args!("cannot send hello: {e}")))?;
        let deadline = Instant::now() + CONNECT_TIMEOUT;
        let grant = loop {
            if let Some(line) = client.next_line()? {
                match ToProcess::decode(&line) {
                    Ok(ToProcess::Grant { pages }) => break pages,
                    Err(e) => {
                        return Err(err(
                            path,
                            ErrorKind::InvalidData,
                            format_args!("its first answer is not a grant: {e}"),
                        ))
                    }
                }
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(err(
                    path,
                    ErrorKind::TimedOut,
                    format_args!("no grant within {} s", CONNECT_TIMEOUT.as_secs()),
                ));
            }
            client
                .stream
                .set_read_timeout(Some(left))
                .map_err(|e| err(path, e.kind(), e))?;
            let mut chunk = [0u8; 4096];
            let read = match (&client.stream).read(&mut chunk) {
                // A reset is a close that left our hello unread: the same answer.
                Err(e) if e.kind() == ErrorKind::ConnectionReset => Ok(0),
                r => r,
            };
            match read {
                Ok(0) => {
                    return Err(err(
                        path,
                        ErrorKind::ConnectionAborted,
                        format_args!(
                            "it closed the connection before granting (this process may not be in the tree; this client speaks protocol version {TREE_PROTOCOL_VERSION}; see the coordinator's log)"
                        ),
                    ))
                }
                Ok(n) => client.lines.push(&chunk[..n]),
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => {
                    return Err(err(
                        path,
                        e.kind(),
                        format_args!("reading its first grant failed: {e}"),
                    ))
                }
            }
        };
        client.grant = grant;
        client
            .stream
            .set_nonblocking(true)
            .map_err(|e| err(path, e.kind(), e))?;
        Ok((client, grant))
    }

    /// Sends `r` and returns the newest grant that arrived since the last call, without
    /// blocking. An error means the connection is unusable (the coordinator went away or
    /// broke the protocol): the caller keeps its last grant.
    pub fn exchange(&mut self, r: Report) -> io::Result<Option<u64>> {
        self.flush()?;
        if self.out.is_empty() {
            self.out = ToCoordinator::Report(r).encode();
            self.flush()?;
        }
        let mut newest = None;
        let mut chunk = [0u8; 4096];
        let mut closed = false;
        loop {
            match (&self.stream).read(&mut chunk) {
                Ok(0) => {
                    closed = true;
                    break;
                }
                Ok(n) => {
                    self.lines.push(&chunk[..n]);
                    // Parse as we go so a burst of grants never buffers more than a line.
                    while let Some(line) = self.next_line()? {
                        newest = Some(self.decode_grant(&line)?);
                    }
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => {
                    return Err(err(
                        &self.socket_path,
                        e.kind(),
                        format_args!("reading grants failed: {e}"),
                    ))
                }
            }
        }
        while let Some(line) = self.next_line()? {
            newest = Some(self.decode_grant(&line)?);
        }
        if let Some(g) = newest {
            self.grant = g;
        }
        if closed {
            return Err(err(
                &self.socket_path,
                ErrorKind::ConnectionAborted,
                "the coordinator went away (connection closed)",
            ));
        }
        Ok(newest)
    }

    /// The last grant received, in pages.
    pub fn grant(&self) -> u64 {
        self.grant
    }

    /// The coordinator's socket.
    pub fn socket_path(&self) -> &Path {
        &self.socket_path
    }

    fn next_line(&mut self) -> io::Result<Option<Vec<u8>>> {
        self.lines
            .next_line()
            .map_err(|e| err(&self.socket_path, ErrorKind::InvalidData, e))
    }

    fn decode_grant(&self, line: &[u8]) -> io::Result<u64> {
        match ToProcess::decode(line) {
            Ok(ToProcess::Grant { pages }) => Ok(pages),
            Err(e) => Err(err(&self.socket_path, ErrorKind::InvalidData, e)),
        }
    }

    /// Sleeps until the coordinator sends something (a grant it pushes when it rebalances) or
    /// `timeout` passes; returns whether something arrived. Errors end up in the next
    /// [`TreeClient::exchange`].
    pub fn wait(&self, timeout: Duration) -> bool {
        let t = rustix::event::Timespec {
            tv_sec: timeout.as_secs() as i64,
            tv_nsec: i64::from(timeout.subsec_nanos()),
        };
        let mut fds = [rustix::event::PollFd::new(
            &self.stream,
            rustix::event::PollFlags::IN,
        )];
        matches!(rustix::event::poll(&mut fds, Some(&t)), Ok(n) if n > 0)
    }

    /// Writes what the socket takes now of the pending report.
    fn flush(&mut self) -> io::Result<()> {
        while !self.out.is_empty() {
            match rustix::net::send(&self.stream, &self.out, rustix::net::SendFlags::NOSIGNAL) {
                Ok(0) => {
                    return Err(err(
                        &self.socket_path,
                        ErrorKind::WriteZero,
                        "the socket took no bytes",
                    ))
                }
                Ok(n) => {
                    self.out.drain(..n);
                }
                Err(rustix::io::Errno::AGAIN) => return Ok(()),
                Err(rustix::io::Errno::INTR) => {}
                Err(e) => {
                    let kind = match e {
                        rustix::io::Errno::PIPE | rustix::io::Errno::CONNRESET => {
                            ErrorKind::ConnectionAborted
                        }
                        _ => io::Error::from(e).kind(),
                    };
                    return Err(err(
                        &self.socket_path,
                        kind,
                        format_args!("the coordinator went away (sending a report: {e})"),
                    ));
                }
            }
        }
        Ok(())
    }
}

/// The connection's descriptor: a forked child closes its inherited copy, so the parent's
/// share comes back when the parent exits even while the child lives.
impl std::os::fd::AsRawFd for TreeClient {
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        self.stream.as_raw_fd()
    }
}
