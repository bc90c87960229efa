//! The messages a process and the coordinator exchange over the tree's Unix stream socket.
//!
//! Pure: no I/O, no panics on any input.
//!
//! # Design
//! Newline-delimited JSON, one message per line, one typed enum per direction
//! ([`ToCoordinator`], [`ToProcess`]) that both sides use. A line holds at most
//! [`MAX_LINE_BYTES`] bytes before its newline; [`LineBuffer`] refuses a longer one as soon as
//! that many bytes are buffered without a newline, so a peer cannot make the other side buffer
//! more than two reads' worth.
//!
//! ```text
//! process → coordinator   {"hello":{"version":1,"pid":4242,"min_pages":1024}}
//! coordinator → process   {"grant":{"pages":262144}}
//! process → coordinator   {"report":{"used_pages":9000,"fetched_pages":120,"evicted_pages":0}}
//! ```
//!
//! The first line from a process is a Hello; the first line from the coordinator after it is
//! always a Grant. Grants are absolute (the local pages the process may use now).
//!
//! # Limitations
//! One protocol version ([`TREE_PROTOCOL_VERSION`]); the coordinator closes a connection that
//! says any other.
use serde::{Deserialize, Serialize};

/// The protocol version this build speaks.
pub const TREE_PROTOCOL_VERSION: u32 = 1;
/// The longest line either side accepts, not counting its newline.
pub const MAX_LINE_BYTES: usize = 4096;

/// A message a process sends to the coordinator.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum ToCoordinator {
    /// First message. `min_pages`: the least this process can run with (a minimal budget and
    /// the pool that goes with it).
    Hello {
        version: u32,
        pid: u32,
        min_pages: u64,
    },
    /// Sent periodically (every ~50 ms) by the client.
    Report(Report),
}

/// What a process reports about its local memory.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Report {
    /// Local pages in use now (resident region pages + write-back pool pages in use).
    pub used_pages: u64,
    /// Cumulative count of pages brought back from far memory (remote + host-tier faults +
    /// prefetched pages installed). Monotonic.
    pub fetched_pages: u64,
    /// Cumulative count of pages evicted. Monotonic.
    pub evicted_pages: u64,
}

/// A message the coordinator sends to a process.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum ToProcess {
    /// The local pages the process may use from now on (absolute, not a change).
    Grant { pages: u64 },
}

/// A line could not be read as a message.
#[derive(Debug, thiserror::Error)]
pub enum WireError {
    /// More than [`MAX_LINE_BYTES`] bytes came without a newline.
    #[error("a line of more than {MAX_LINE_BYTES} bytes ({bytes} bytes without a newline)")]
    LineTooLong {
        /// How many bytes were buffered when the line was refused.
        bytes: usize,
    },
    /// The line is not one JSON message of the expected kind.
    #[error("not a valid message: {source}")]
    Json {
        /// What serde_json found wrong.
        #[source]
        source: serde_json::Error,
    },
}

fn encode_line<T: Serialize>(msg: &T) -> Vec<u8> {
    // Serialising these plain enums into a Vec cannot fail (no maps with non-string keys, no
    // custom Serialize impls); fall back to an empty line rather than panic.
    let mut line = serde_json::to_vec(msg).unwrap_or_default();
    line.push(b'\n');
    line
}

fn decode_line<'a, T: Deserialize<'a>>(line: &'a [u8]) -> Result<T, WireError> {
    if line.len() > MAX_LINE_BYTES {
        return Err(WireError::LineTooLong { bytes: line.len() });
    }
    serde_json::from_slice(line).map_err(|source| WireError::Json { source })
}

impl ToCoordinator {
    /// The message as one line, newline included.
    pub fn encode(&self) -> Vec<u8> {
        encode_line(self)
    }

    /// Reads one line (without its newline).
    pub fn decode(line: &[u8]) -> Result<ToCoordinator, WireError> {
        decode_line(line)
    }
}

impl ToProcess {
    /// The message as one line, newline included.
    pub fn encode(&self) -> Vec<u8> {
        encode_line(self)
    }

    /// Reads one line (without its newline).
    pub fn decode(line: &[u8]) -> Result<ToProcess, WireError> {
        decode_line(line)
    }
}

/// Bytes read from a stream, cut into lines of at most [`MAX_LINE_BYTES`].
///
/// Holds at most [`MAX_LINE_BYTES`] bytes of a partial line between calls (plus what the last
/// [`push`](Self::push) added).
#[derive(Debug, Default)]
pub struct LineBuffer {
    buf: Vec<u8>,
    /// Bytes at the start of `buf` already known to hold no newline.
    scanned: usize,
}

impl LineBuffer {
    /// An empty buffer.
    pub fn new() -> LineBuffer {
        LineBuffer::default()
    }

    /// Appends bytes read from the stream.
    pub fn push(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
    }

    /// The next complete line without its newline, `None` if no complete line is buffered, or
    /// an error once more than [`MAX_LINE_BYTES`] bytes precede the next newline (the stream is
    /// then unusable: the caller drops it).
    pub fn next_line(&mut self) -> Result<Option<Vec<u8>>, WireError> {
        match self.buf[self.scanned..].iter().position(|&b| b == b'\n') {
            Some(at) => {
                let end = self.scanned + at;
                if end > MAX_LINE_BYTES {
                    return Err(WireError::LineTooLong { bytes: end });
                }
                let mut line: Vec<u8> = self.buf.drain(..=end).collect();
                line.pop();
                self.scanned = 0;
                Ok(Some(line))
            }
            None => {
                self.scanned = self.buf.len();
                if self.buf.len() > MAX_LINE_BYTES {
                    return Err(WireError::LineTooLong {
                        bytes: self.buf.len(),
                    });
                }
                Ok(None)
            }
        }
    }

    /// Bytes of a partial line buffered (0 when the stream stopped at a line boundary).
    pub fn pending_bytes(&self) -> usize {
        self.buf.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_round_trip_in_the_documented_form() {
        let hello = ToCoordinator::Hello {
            version: TREE_PROTOCOL_VERSION,
            pid: 4242,
            min_pages: 1024,
        };
        assert_eq!(
            hello.encode(),
            b"{\"hello\":{\"version\":1,\"pid\":4242,\"min_pages\":1024}}\n"
        );
        let report = ToCoordinator::Report(Report {
            used_pages: 9000,
            fetched_pages: 120,
            evicted_pages: 3,
        });
        let grant = ToProcess::Grant { pages: 262_144 };
        assert_eq!(grant.encode(), b"{\"grant\":{\"pages\":262144}}\n");
        for m in [hello, report] {
            let line = m.encode();
            assert_eq!(ToCoordinator::decode(&line[..line.len() - 1]).unwrap(), m);
        }
        let line = grant.encode();
        assert_eq!(ToProcess::decode(&line[..line.len() - 1]).unwrap(), grant);
    }

    #[test]
    fn unknown_fields_and_wrong_kinds_are_refused() {
        for bad in [
            &b"{\"hello\":{\"version\":1,\"pid\":1,\"min_pages\":1,\"extra\":2}}"[..],
            b"{\"grant\":{\"pages\":1}}",
            b"{\"goodbye\":{}}",
            b"not json",
            b"",
            b"{\"report\":{\"used_pages\":-1,\"fetched_pages\":0,\"evicted_pages\":0}}",
            b"\xff\xfe",
        ] {
            assert!(ToCoordinator::decode(bad).is_err(), "{bad:?}");
        }
        assert!(ToProcess::decode(b"{\"grant\":{\"pages\":1,\"x\":1}}").is_err());
        assert!(ToProcess::decode(&[b' '; MAX_LINE_BYTES + 1]).is_err());
    }

    #[test]
    fn line_buffer_cuts_lines_across_pushes() {
        let mut b = LineBuffer::new();
        b.push(b"ab");
        assert_eq!(b.next_line().unwrap(), None);
        b.push(b"c\nde\n\nf");
        assert_eq!(b.next_line().unwrap().as_deref(), Some(&b"abc"[..]));
        assert_eq!(b.next_line().unwrap().as_deref(), Some(&b"de"[..]));
        assert_eq!(b.next_line().unwrap().as_deref(), Some(&b""[..]));
        assert_eq!(b.next_line().unwrap(), None);
        assert_eq!(b.pending_bytes(), 1);
        b.push(b"g\n");
        assert_eq!(b.next_line().unwrap().as_deref(), Some(&b"fg"[..]));
        assert_eq!(b.pending_bytes(), 0);
    }

    #[test]
    fn line_buffer_takes_a_line_of_exactly_the_limit_and_refuses_one_more_byte() {
        let mut b = LineBuffer::new();
        b.push(&[b'x'; MAX_LINE_BYTES]);
        assert_eq!(b.next_line().unwrap(), None);
        b.push(b"\n");
        assert_eq!(b.next_line().unwrap().unwrap().len(), MAX_LINE_BYTES);

        let mut b = LineBuffer::new();
        b.push(&[b'x'; MAX_LINE_BYTES + 1]);
        assert!(matches!(b.next_line(), Err(WireError::LineTooLong { .. })));
        let mut b = LineBuffer::new();
        let mut long = vec![b'x'; MAX_LINE_BYTES + 1];
        long.push(b'\n');
        b.push(&long);
        assert!(b.next_line().is_err());
    }

    #[test]
    fn line_buffer_never_panics_on_arbitrary_bytes() {
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..200 {
            let mut b = LineBuffer::new();
            for _ in 0..20 {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                let len = (state % 700) as usize;
                let chunk: Vec<u8> = (0..len)
                    .map(|i| {
                        if (state >> (i % 60)) & 7 == 0 {
                            b'\n'
                        } else {
                            (state >> (i % 56)) as u8
                        }
                    })
                    .collect();
                b.push(&chunk);
                while let Ok(Some(line)) = b.next_line() {
                    let _ = ToCoordinator::decode(&line);
                    let _ = ToProcess::decode(&line);
                }
            }
        }
    }
}
