//! The frames a client and the node exchange over the node's Unix stream socket.
//!
//! Pure: no I/O, no panics on any input, every length checked before use (fuzzed through
//! [`decode_client_frame`] and [`decode_node_frame`]). The memfd of a slab does not travel in
//! the bytes: the node sends it as `SCM_RIGHTS` ancillary data with the first byte of the
//! [`NodeFrame::Slab`] frame that names it (see `server` and `client`), and so does the memfd
//! of a hold with its [`NodeFrame::Held`] frame.
//!
//! # Design
//! A frame is `u32 LE payload length` + `u8 opcode` + payload. Integers are little-endian.
//! Client frames are small (a HOLD's slab list is the largest), so their payload is capped at [`MAX_CLIENT_PAYLOAD`] (4 KiB):
//! an oversized length is refused as soon as its four bytes arrive, before anything is
//! buffered. Node frames may carry the STATS JSON (one line per client, up to 1024 clients),
//! so their cap is [`MAX_NODE_PAYLOAD`] (1 MiB). Every fixed-size message must have exactly its
//! size; the two variable ones (ERROR's message, STATS_REPLY's JSON) take the rest of the
//! payload and must be UTF-8. HOLD's slab list is exactly `4·n` bytes after its two fixed
//! fields (payload `8 + 4·n`), so at most [`MAX_HOLD_SLABS`] ids fit the client cap; a list of
//! 0 ids or with a repeated id decodes (the bytes are well-formed) and the node answers it with
//! ERROR BadRequest.
//!
//! | opcode | frame | payload |
//! |---|---|---|
//! | 0x01 | HELLO | version u16 |
//! | 0x02 | ALLOC | req u32 |
//! | 0x03 | FREE | req u32, slab u32 |
//! | 0x04 | STATS | req u32 |
//! | 0x05 | RESIZE | req u32, capacity_bytes u64 |
//! | 0x06 | HOLD | req u32, hold u32, slabs u32 × n (n = (payload − 8) / 4) |
//! | 0x81 | WELCOME | version u16, slab_bytes u64, capacity_bytes u64, node_pid u32 |
//! | 0x82 | SLAB | req u32, slab u32, len u64 (+ the memfd as SCM_RIGHTS) |
//! | 0x83 | OK | req u32 |
//! | 0x84 | ERROR | req u32, code u16, used_bytes u64, capacity_bytes u64, message |
//! | 0x85 | STATS_REPLY | req u32, JSON ([`crate::metrics::NodeStats`]) |
//! | 0x86 | RECLAIM | slabs u32 (unsolicited) |
//! | 0x87 | HELD | req u32, hold u32 (+ the hold's memfd as SCM_RIGHTS) |
//!
//! ERROR carries the node's used and capacity figures at the time of the refusal, so a client
//! can report "host tier full: USED of CAPACITY" without parsing the message.
//!
//! HOLD with `hold` 0 asks for a new hold over `slabs` (answered by HELD, or ERROR); with a
//! hold id it adds `slabs` to that hold of this client (answered by OK, or ERROR NotYours).
//! Before relying on a new hold the client maps its memfd and writes a non-zero byte at offset
//! 0 ("armed", see `crate::hold`).
//!
//! # Limitations
//! One protocol version ([`PROTOCOL_VERSION`]); the node refuses any other in HELLO.

/// The protocol version this build speaks.
pub const PROTOCOL_VERSION: u16 = 1;
/// Bytes before the payload: the length (4) and the opcode (1).
pub const HEADER_LEN: usize = 5;
/// The largest payload a client may send (a HOLD of [`MAX_HOLD_SLABS`] ids fills it).
pub const MAX_CLIENT_PAYLOAD: u32 = 4096;
/// The most slab ids one HOLD frame carries (`8 + 4·n` bytes fit [`MAX_CLIENT_PAYLOAD`]).
pub const MAX_HOLD_SLABS: usize = (MAX_CLIENT_PAYLOAD as usize - 8) / 4;
/// The largest payload the node sends (the STATS JSON of a full node fits well within it).
pub const MAX_NODE_PAYLOAD: u32 = 1 << 20;

const OP_HELLO: u8 = 0x01;
const OP_ALLOC: u8 = 0x02;
const OP_FREE: u8 = 0x03;
const OP_STATS: u8 = 0x04;
const OP_RESIZE: u8 = 0x05;
const OP_HOLD: u8 = 0x06;
const OP_WELCOME: u8 = 0x81;
const OP_SLAB: u8 = 0x82;
const OP_OK: u8 = 0x83;
const OP_ERROR: u8 = 0x84;
const OP_STATS_REPLY: u8 = 0x85;
const OP_RECLAIM: u8 = 0x86;
const OP_HELD: u8 = 0x87;

/// A frame a client sends to the node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClientFrame {
    /// The first frame of a connection: the client's protocol version.
    Hello { version: u16 },
    /// Asks for a new slab; answered by SLAB (with the memfd) or ERROR.
    Alloc { req: u32 },
    /// Gives a slab back; answered by OK or ERROR (NotYours).
    Free { req: u32, slab: u32 },
    /// Asks for the node's figures; answered by STATS_REPLY.
    Stats { req: u32 },
    /// Changes the node's capacity (only from root or the node's own uid); OK or ERROR.
    Resize { req: u32, capacity_bytes: u64 },
    /// `hold` 0: a new hold over `slabs` (answered by HELD with the hold's memfd, or ERROR);
    /// otherwise adds `slabs` to that hold of this client (OK or ERROR). At most
    /// [`MAX_HOLD_SLABS`] ids: [`ClientFrame::encode`] of a longer list makes a frame the node
    /// refuses.
    Hold {
        req: u32,
        hold: u32,
        slabs: Vec<u32>,
    },
}

/// Why the node refused a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorCode {
    /// The node's capacity is used up.
    Full,
    /// The host is short of memory (MemAvailable below `--keep-free`).
    Pressure,
    /// The slab (or hold) named is not the client's.
    NotYours,
    /// The request was malformed or impossible (e.g. a capacity above the machine's memory).
    BadRequest,
    /// The client may not do this (RESIZE from another uid).
    Denied,
    /// The node serves as many clients as it may.
    TooManyClients,
    /// The client speaks another protocol version.
    Version,
    /// The node failed (e.g. memfd_create or fallocate failed).
    Internal,
    /// The client's user holds its share of the node ([`crate::share`]); the frame's
    /// `used_bytes` is what the user holds, `capacity_bytes` its share.
    ShareUsed,
    /// A code this build does not know (a newer node).
    Unknown,
}

impl ErrorCode {
    /// Every known code, for tests and metrics.
    pub const ALL: [ErrorCode; 9] = [
        ErrorCode::Full,
        ErrorCode::Pressure,
        ErrorCode::NotYours,
        ErrorCode::BadRequest,
        ErrorCode::Denied,
        ErrorCode::TooManyClients,
        ErrorCode::Version,
        ErrorCode::Internal,
        ErrorCode::ShareUsed,
    ];

    /// The code on the wire.
    pub fn code(self) -> u16 {
        match self {
            ErrorCode::Full => 1,
            ErrorCode::Pressure => 2,
            ErrorCode::NotYours => 3,
            ErrorCode::BadRequest => 4,
            ErrorCode::Denied => 5,
            ErrorCode::TooManyClients => 6,
            ErrorCode::Version => 7,
            ErrorCode::Internal => 8,
            ErrorCode::ShareUsed => 9,
            ErrorCode::Unknown => u16::MAX,
        }
    }

    /// The code for a wire value (unknown values become [`ErrorCode::Unknown`]).
    pub fn from_code(code: u16) -> ErrorCode {
        ErrorCode::ALL
            .into_iter()
            .find(|c| c.code() == code)
            .unwrap_or(ErrorCode::Unknown)
    }

    /// A short lower-case name (metrics labels, logs).
    pub fn name(self) -> &'static str {
        match self {
            ErrorCode::Full => "full",
            ErrorCode::Pressure => "pressure",
            ErrorCode::NotYours => "not_yours",
            ErrorCode::BadRequest => "bad_request",
            ErrorCode::Denied => "denied",
            ErrorCode::TooManyClients => "too_many_clients",
            ErrorCode::Version => "version",
            ErrorCode::Internal => "internal",
            ErrorCode::ShareUsed => "share_used",
            ErrorCode::Unknown => "unknown",
        }
    }
}

/// A frame the node sends to a client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NodeFrame {
    /// The answer to HELLO: the node's version, slab size, capacity and pid.
    Welcome {
        version: u16,
        slab_bytes: u64,
        capacity_bytes: u64,
        node_pid: u32,
    },
    /// A slab for the client; its memfd travels as SCM_RIGHTS with this frame.
    Slab { req: u32, slab: u32, len: u64 },
    /// The request succeeded.
    Ok { req: u32 },
    /// The request was refused (`req` 0 for a refusal of the connection itself).
    Error {
        req: u32,
        code: ErrorCode,
        used_bytes: u64,
        capacity_bytes: u64,
        message: String,
    },
    /// The answer to STATS: [`crate::metrics::NodeStats`] as JSON.
    StatsReply { req: u32, json: String },
    /// Unsolicited: give back this many slabs (the least recently written ones).
    Reclaim { slabs: u32 },
    /// A new hold for the client; its memfd travels as SCM_RIGHTS with this frame.
    Held { req: u32, hold: u32 },
}

/// A frame that cannot be decoded. Any of these ends the connection.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    /// The length field is above the cap.
    #[error("frame payload of {len} bytes is above the limit of {max}")]
    TooLarge { len: u32, max: u32 },
    /// The opcode is not one this side accepts.
    #[error("unknown opcode {0:#04x}")]
    UnknownOpcode(u8),
    /// A fixed-size payload had the wrong size, or a variable one is too short.
    #[error("{frame} frame with a payload of {len} bytes (expected {expected})")]
    BadLength {
        frame: &'static str,
        len: usize,
        expected: usize,
    },
    /// A text field is not UTF-8.
    #[error("{frame} frame with text that is not UTF-8")]
    BadText { frame: &'static str },
}

/// Reads a little-endian integer field by field; every read is bounds-checked.
struct Fields<'a> {
    rest: &'a [u8],
}

impl<'a> Fields<'a> {
    fn take<const N: usize>(&mut self) -> [u8; N] {
        // Callers check the payload's size first; a short read yields zeros rather than a panic.
        let mut out = [0u8; N];
        if let Some((head, tail)) = self.rest.split_first_chunk::<N>() {
            out = *head;
            self.rest = tail;
        }
        out
    }
    fn u16(&mut self) -> u16 {
        u16::from_le_bytes(self.take())
    }
    fn u32(&mut self) -> u32 {
        u32::from_le_bytes(self.take())
    }
    fn u64(&mut self) -> u64 {
        u64::from_le_bytes(self.take())
    }
    fn text(self, frame: &'static str) -> Result<String, WireError> {
        std::str::from_utf8(self.rest)
            .map(str::to_owned)
            .map_err(|_| WireError::BadText { frame })
    }
}

/// The first complete frame of a buffer, not yet decoded.
struct RawFrame<'a> {
    op: u8,
    payload: &'a [u8],
    /// Bytes of the buffer it takes, header included.
    used: usize,
}

/// The first complete frame in `buf`; `Ok(None)` when more bytes are needed.
fn split_frame(buf: &[u8], max: u32) -> Result<Option<RawFrame<'_>>, WireError> {
    let Some(len_bytes) = buf.first_chunk::<4>() else {
        return Ok(None);
    };
    let len = u32::from_le_bytes(*len_bytes);
    if len > max {
        return Err(WireError::TooLarge { len, max });
    }
    let Some(&op) = buf.get(4) else {
        return Ok(None);
    };
    let total = HEADER_LEN + len as usize;
    match buf.get(HEADER_LEN..total) {
        Some(payload) => Ok(Some(RawFrame {
            op,
            payload,
            used: total,
        })),
        None => Ok(None),
    }
}

fn exact<'a>(
    frame: &'static str,
    payload: &'a [u8],
    expected: usize,
) -> Result<Fields<'a>, WireError> {
    if payload.len() != expected {
        return Err(WireError::BadLength {
            frame,
            len: payload.len(),
            expected,
        });
    }
    Ok(Fields { rest: payload })
}

fn at_least<'a>(
    frame: &'static str,
    payload: &'a [u8],
    min: usize,
) -> Result<Fields<'a>, WireError> {
    if payload.len() < min {
        return Err(WireError::BadLength {
            frame,
            len: payload.len(),
            expected: min,
        });
    }
    Ok(Fields { rest: payload })
}

/// Decodes the first client frame in `buf`: `Ok(Some((frame, bytes used)))`, `Ok(None)` if
/// `buf` holds only part of a frame, or the reason the bytes are not a client frame. An
/// oversized length or an unknown opcode is reported as soon as the header has arrived.
pub fn decode_client_frame(buf: &[u8]) -> Result<Option<(ClientFrame, usize)>, WireError> {
    if let (Some(&op), Some(_)) = (buf.get(4), buf.first_chunk::<4>()) {
        if !matches!(
            op,
            OP_HELLO | OP_ALLOC | OP_FREE | OP_STATS | OP_RESIZE | OP_HOLD
        ) {
            // Checked before waiting for the payload: garbage is refused at once.
            split_frame(buf, MAX_CLIENT_PAYLOAD)?;
            return Err(WireError::UnknownOpcode(op));
        }
    }
    let Some(RawFrame { op, payload, used }) = split_frame(buf, MAX_CLIENT_PAYLOAD)? else {
        return Ok(None);
    };
    let frame = match op {
        OP_HELLO => ClientFrame::Hello {
            version: exact("HELLO", payload, 2)?.u16(),
        },
        OP_ALLOC => ClientFrame::Alloc {
            req: exact("ALLOC", payload, 4)?.u32(),
        },
        OP_FREE => {
            let mut f = exact("FREE", payload, 8)?;
            ClientFrame::Free {
                req: f.u32(),
                slab: f.u32(),
            }
        }
        OP_STATS => ClientFrame::Stats {
            req: exact("STATS", payload, 4)?.u32(),
        },
        OP_RESIZE => {
            let mut f = exact("RESIZE", payload, 12)?;
            ClientFrame::Resize {
                req: f.u32(),
                capacity_bytes: f.u64(),
            }
        }
        OP_HOLD => {
            // Two fixed fields, then whole ids only: a stray 1–3 bytes is a malformed frame.
            let ids = payload.len().saturating_sub(8);
            if payload.len() < 8 || ids % 4 != 0 {
                return Err(WireError::BadLength {
                    frame: "HOLD",
                    len: payload.len(),
                    expected: 8 + ids / 4 * 4,
                });
            }
            let mut f = Fields { rest: payload };
            let (req, hold) = (f.u32(), f.u32());
            ClientFrame::Hold {
                req,
                hold,
                slabs: (0..ids / 4).map(|_| f.u32()).collect(),
            }
        }
        other => return Err(WireError::UnknownOpcode(other)),
    };
    Ok(Some((frame, used)))
}

/// Decodes the first node frame in `buf` (see [`decode_client_frame`]).
pub fn decode_node_frame(buf: &[u8]) -> Result<Option<(NodeFrame, usize)>, WireError> {
    let Some(RawFrame { op, payload, used }) = split_frame(buf, MAX_NODE_PAYLOAD)? else {
        return Ok(None);
    };
    let frame = match op {
        OP_WELCOME => {
            let mut f = exact("WELCOME", payload, 22)?;
            NodeFrame::Welcome {
                version: f.u16(),
                slab_bytes: f.u64(),
                capacity_bytes: f.u64(),
                node_pid: f.u32(),
            }
        }
        OP_SLAB => {
            let mut f = exact("SLAB", payload, 16)?;
            NodeFrame::Slab {
                req: f.u32(),
                slab: f.u32(),
                len: f.u64(),
            }
        }
        OP_OK => NodeFrame::Ok {
            req: exact("OK", payload, 4)?.u32(),
        },
        OP_ERROR => {
            let mut f = at_least("ERROR", payload, 22)?;
            let (req, code) = (f.u32(), ErrorCode::from_code(f.u16()));
            let (used_bytes, capacity_bytes) = (f.u64(), f.u64());
            NodeFrame::Error {
                req,
                code,
                used_bytes,
                capacity_bytes,
                message: f.text("ERROR")?,
            }
        }
        OP_STATS_REPLY => {
            let mut f = at_least("STATS_REPLY", payload, 4)?;
            let req = f.u32();
            NodeFrame::StatsReply {
                req,
                json: f.text("STATS_REPLY")?,
            }
        }
        OP_RECLAIM => NodeFrame::Reclaim {
            slabs: exact("RECLAIM", payload, 4)?.u32(),
        },
        OP_HELD => {
            let mut f = exact("HELD", payload, 8)?;
            NodeFrame::Held {
                req: f.u32(),
                hold: f.u32(),
            }
        }
        other => return Err(WireError::UnknownOpcode(other)),
    };
    Ok(Some((frame, used)))
}

/// Builds a frame from its opcode and payload parts.
fn frame(op: u8, parts: &[&[u8]]) -> Vec<u8> {
    let len: usize = parts.iter().map(|p| p.len()).sum();
    let mut out = Vec::with_capacity(HEADER_LEN + len);
    out.extend_from_slice(&(len as u32).to_le_bytes());
    out.push(op);
    for p in parts {
        out.extend_from_slice(p);
    }
    out
}

/// `text` cut at a character boundary to at most `max` bytes.
fn clipped(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

impl ClientFrame {
    /// The whole frame, header included.
    pub fn encode(&self) -> Vec<u8> {
        match *self {
            ClientFrame::Hold {
                req,
                hold,
                ref slabs,
            } => {
                let ids: Vec<u8> = slabs.iter().flat_map(|s| s.to_le_bytes()).collect();
                frame(OP_HOLD, &[&req.to_le_bytes(), &hold.to_le_bytes(), &ids])
            }
            ClientFrame::Hello { version } => frame(OP_HELLO, &[&version.to_le_bytes()]),
            ClientFrame::Alloc { req } => frame(OP_ALLOC, &[&req.to_le_bytes()]),
            ClientFrame::Free { req, slab } => {
                frame(OP_FREE, &[&req.to_le_bytes(), &slab.to_le_bytes()])
            }
            ClientFrame::Stats { req } => frame(OP_STATS, &[&req.to_le_bytes()]),
            ClientFrame::Resize {
                req,
                capacity_bytes,
            } => frame(
                OP_RESIZE,
                &[&req.to_le_bytes(), &capacity_bytes.to_le_bytes()],
            ),
        }
    }

    /// The request id, for frames that have one (all but HELLO).
    pub fn req(&self) -> Option<u32> {
        match *self {
            ClientFrame::Hello { .. } => None,
            ClientFrame::Alloc { req }
            | ClientFrame::Free { req, .. }
            | ClientFrame::Stats { req }
            | ClientFrame::Resize { req, .. }
            | ClientFrame::Hold { req, .. } => Some(req),
        }
    }
}

impl NodeFrame {
    /// The whole frame, header included. A message or JSON text longer than the payload cap
    /// allows is cut (the client then reports the JSON as unreadable rather than hanging).
    pub fn encode(&self) -> Vec<u8> {
        match self {
            NodeFrame::Welcome {
                version,
                slab_bytes,
                capacity_bytes,
                node_pid,
            } => frame(
                OP_WELCOME,
                &[
                    &version.to_le_bytes(),
                    &slab_bytes.to_le_bytes(),
                    &capacity_bytes.to_le_bytes(),
                    &node_pid.to_le_bytes(),
                ],
            ),
            NodeFrame::Slab { req, slab, len } => frame(
                OP_SLAB,
                &[&req.to_le_bytes(), &slab.to_le_bytes(), &len.to_le_bytes()],
            ),
            NodeFrame::Ok { req } => frame(OP_OK, &[&req.to_le_bytes()]),
            NodeFrame::Error {
                req,
                code,
                used_bytes,
                capacity_bytes,
                message,
            } => frame(
                OP_ERROR,
                &[
                    &req.to_le_bytes(),
                    &code.code().to_le_bytes(),
                    &used_bytes.to_le_bytes(),
                    &capacity_bytes.to_le_bytes(),
                    clipped(message, MAX_NODE_PAYLOAD as usize - 22).as_bytes(),
                ],
            ),
            NodeFrame::StatsReply { req, json } => frame(
                OP_STATS_REPLY,
                &[
                    &req.to_le_bytes(),
                    clipped(json, MAX_NODE_PAYLOAD as usize - 4).as_bytes(),
                ],
            ),
            NodeFrame::Reclaim { slabs } => frame(OP_RECLAIM, &[&slabs.to_le_bytes()]),
            NodeFrame::Held { req, hold } => {
                frame(OP_HELD, &[&req.to_le_bytes(), &hold.to_le_bytes()])
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn client_frames() -> Vec<ClientFrame> {
        vec![
            ClientFrame::Hello { version: 1 },
            ClientFrame::Alloc { req: 7 },
            ClientFrame::Free {
                req: u32::MAX,
                slab: 3,
            },
            ClientFrame::Stats { req: 0 },
            ClientFrame::Resize {
                req: 9,
                capacity_bytes: 1 << 40,
            },
            ClientFrame::Hold {
                req: 10,
                hold: 0,
                slabs: vec![1, 2, u32::MAX],
            },
            ClientFrame::Hold {
                req: 11,
                hold: 4,
                slabs: (1..=MAX_HOLD_SLABS as u32).collect(),
            },
            // Well-formed bytes the node refuses (BadRequest), not the decoder.
            ClientFrame::Hold {
                req: 12,
                hold: 0,
                slabs: vec![],
            },
        ]
    }

    fn node_frames() -> Vec<NodeFrame> {
        vec![
            NodeFrame::Welcome {
                version: 1,
                slab_bytes: 4 << 20,
                capacity_bytes: 1 << 30,
                node_pid: 1234,
            },
            NodeFrame::Slab {
                req: 1,
                slab: 2,
                len: 4 << 20,
            },
            NodeFrame::Ok { req: 5 },
            NodeFrame::Error {
                req: 6,
                code: ErrorCode::Full,
                used_bytes: 10,
                capacity_bytes: 20,
                message: "host tier full: 10 of 20 bytes in use — é".into(),
            },
            NodeFrame::StatsReply {
                req: 8,
                json: "{\"a\":1}".into(),
            },
            NodeFrame::Reclaim { slabs: 3 },
            NodeFrame::Held { req: 9, hold: 77 },
        ]
    }

    #[test]
    fn every_frame_round_trips_and_needs_all_its_bytes() {
        for f in client_frames() {
            let b = f.encode();
            assert_eq!(decode_client_frame(&b), Ok(Some((f.clone(), b.len()))));
            for cut in 0..b.len() {
                assert_eq!(
                    decode_client_frame(&b[..cut]),
                    Ok(None),
                    "{f:?} cut at {cut}"
                );
            }
            assert!(decode_node_frame(&b).is_err(), "{f:?} is not a node frame");
        }
        for f in node_frames() {
            let b = f.encode();
            assert_eq!(decode_node_frame(&b), Ok(Some((f.clone(), b.len()))));
            for cut in 0..b.len() {
                assert_eq!(decode_node_frame(&b[..cut]), Ok(None), "{f:?} cut at {cut}");
            }
        }
    }

    #[test]
    fn two_frames_in_one_buffer_decode_one_at_a_time() {
        let mut b = ClientFrame::Alloc { req: 1 }.encode();
        b.extend(ClientFrame::Stats { req: 2 }.encode());
        let (f, n) = decode_client_frame(&b).unwrap().unwrap();
        assert_eq!(f, ClientFrame::Alloc { req: 1 });
        assert_eq!(
            decode_client_frame(&b[n..]).unwrap().unwrap().0,
            ClientFrame::Stats { req: 2 }
        );
    }

    #[test]
    fn garbage_is_refused_as_early_as_possible() {
        // An oversized length is refused from its four bytes alone.
        assert_eq!(
            decode_client_frame(&[0xff, 0xff, 0xff, 0x7f]),
            Err(WireError::TooLarge {
                len: 0x7fff_ffff,
                max: MAX_CLIENT_PAYLOAD
            })
        );
        // An unknown opcode is refused from the header, before its payload.
        assert_eq!(
            decode_client_frame(&[100, 0, 0, 0, 0x42]),
            Err(WireError::UnknownOpcode(0x42))
        );
        // A node opcode is not a client frame.
        assert_eq!(
            decode_client_frame(&[4, 0, 0, 0, OP_OK, 0, 0, 0, 0]),
            Err(WireError::UnknownOpcode(OP_OK))
        );
        // A fixed-size frame with extra bytes.
        assert!(matches!(
            decode_client_frame(&[5, 0, 0, 0, OP_ALLOC, 1, 2, 3, 4, 5]),
            Err(WireError::BadLength { frame: "ALLOC", .. })
        ));
        // Text that is not UTF-8.
        let mut b = frame(OP_STATS_REPLY, &[&1u32.to_le_bytes(), &[0xff, 0xfe]]);
        assert_eq!(
            decode_node_frame(&b),
            Err(WireError::BadText {
                frame: "STATS_REPLY"
            })
        );
        b = frame(OP_ERROR, &[&[0; 10]]);
        assert!(matches!(
            decode_node_frame(&b),
            Err(WireError::BadLength { frame: "ERROR", .. })
        ));
    }

    #[test]
    fn every_malformed_hold_or_held_is_refused() {
        let hold = |payload: &[u8]| frame(OP_HOLD, &[payload]);
        // Shorter than its two fixed fields, and every stray tail after them.
        for len in [0, 1, 4, 7, 9, 10, 11, 13, 4095] {
            assert!(
                matches!(
                    decode_client_frame(&hold(&vec![1; len])),
                    Err(WireError::BadLength { frame: "HOLD", .. })
                ),
                "a HOLD payload of {len} bytes"
            );
        }
        for len in [8, 12, 4096] {
            assert!(decode_client_frame(&hold(&vec![1; len])).unwrap().is_some());
        }
        // One id more than the cap is a payload above the client limit.
        let long = ClientFrame::Hold {
            req: 1,
            hold: 0,
            slabs: vec![7; MAX_HOLD_SLABS + 1],
        };
        assert!(matches!(
            decode_client_frame(&long.encode()),
            Err(WireError::TooLarge { .. })
        ));
        for len in [0, 4, 7, 9, 12] {
            assert!(
                matches!(
                    decode_node_frame(&frame(OP_HELD, &[&vec![0; len]])),
                    Err(WireError::BadLength { frame: "HELD", .. })
                ),
                "a HELD payload of {len} bytes"
            );
        }
        // HOLD is a client frame, HELD a node frame.
        assert!(decode_node_frame(&hold(&[0; 12])).is_err());
        assert_eq!(
            decode_client_frame(&frame(OP_HELD, &[&[0; 8]])),
            Err(WireError::UnknownOpcode(OP_HELD))
        );
    }

    #[test]
    fn unknown_error_codes_decode_as_unknown() {
        for c in ErrorCode::ALL {
            assert_eq!(ErrorCode::from_code(c.code()), c);
        }
        assert_eq!(ErrorCode::from_code(999), ErrorCode::Unknown);
    }

    #[test]
    fn long_texts_are_cut_at_a_character_boundary() {
        let long = "é".repeat(MAX_NODE_PAYLOAD as usize);
        let b = NodeFrame::StatsReply { req: 1, json: long }.encode();
        assert!(b.len() <= HEADER_LEN + MAX_NODE_PAYLOAD as usize);
        let (f, _) = decode_node_frame(&b).unwrap().unwrap();
        assert!(
            matches!(f, NodeFrame::StatsReply { json, .. } if json.len() >= MAX_NODE_PAYLOAD as usize - 5)
        );
    }

    #[test]
    fn random_bytes_never_panic() {
        // A cheap xorshift stream: the fuzz target covers far more.
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        for _ in 0..20_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let n = (x % 40) as usize;
            let mut b: Vec<u8> = (0..n).map(|i| (x >> (i % 8 * 8)) as u8).collect();
            if let Some(l) = b.get_mut(1..4) {
                l.fill(0);
            }
            let _ = decode_client_frame(&b);
            let _ = decode_node_frame(&b);
        }
    }
}
