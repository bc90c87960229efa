//! The fixed frame header and the request opcodes.

use crate::{Status, MAX_PAYLOAD_LEN, PROTOCOL_VERSION};

/// Length of every frame header, in bytes.
pub const HEADER_LEN: usize = 20;
/// The two bytes every frame starts with.
pub const MAGIC: [u8; 2] = *b"FM";
/// Set in the opcode of every response.
pub const RESPONSE_BIT: u8 = 0x80;

/// The requests a client may send.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Opcode {
    /// Open the handshake: the donor answers with a challenge nonce; must come first.
    Hello = 1,
    /// Allocate one slab for this client.
    AllocSlab = 2,
    /// Free one of this client's slabs.
    FreeSlab = 3,
    /// Store a batch of pages.
    WritePages = 4,
    /// Fetch a batch of pages.
    ReadPages = 5,
    /// Ask for the donor's counters.
    Stats = 6,
    /// Prove the auth token (and, to reattach, the client's reconnect key); follows HELLO.
    Auth = 7,
    /// Ask which of this client's slabs the donor wants back (to be moved elsewhere, then
    /// freed with FREE_SLAB).
    Reclaims = 8,
    /// Say what this client is (its program and host), for the donor's operators.
    Ident = 9,
    /// Ask for this client's tenant: its use, quota and clients.
    Clients = 10,
}

impl Opcode {
    /// Every opcode.
    pub const ALL: [Opcode; 10] = [
        Opcode::Hello,
        Opcode::AllocSlab,
        Opcode::FreeSlab,
        Opcode::WritePages,
        Opcode::ReadPages,
        Opcode::Stats,
        Opcode::Auth,
        Opcode::Reclaims,
        Opcode::Ident,
        Opcode::Clients,
    ];

    /// The request opcode with wire value `value` (response bit cleared), if it is one.
    pub fn from_wire(value: u8) -> Option<Opcode> {
        let value = value & !RESPONSE_BIT;
        Opcode::ALL.into_iter().find(|op| *op as u8 == value)
    }

    /// A short lower-case name, for logs and metric labels.
    pub fn name(self) -> &'static str {
        match self {
            Opcode::Hello => "hello",
            Opcode::AllocSlab => "alloc_slab",
            Opcode::FreeSlab => "free_slab",
            Opcode::WritePages => "write_pages",
            Opcode::ReadPages => "read_pages",
            Opcode::Stats => "stats",
            Opcode::Auth => "auth",
            Opcode::Reclaims => "reclaims",
            Opcode::Ident => "ident",
            Opcode::Clients => "clients",
        }
    }
}

/// Why a header could not be decoded. Framing errors leave the stream unusable: the reader
/// should answer (where it can) and close the connection.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    /// Fewer than [`HEADER_LEN`] bytes were given.
    #[error("frame header truncated: {have} of {HEADER_LEN} bytes")]
    Truncated {
        /// Bytes available.
        have: usize,
    },
    /// The frame does not start with [`MAGIC`]; the peer does not speak farmem.
    #[error("not a farmem frame (bad magic {found:02x?}); is the peer a farmem donor/client?")]
    BadMagic {
        /// The two bytes found.
        found: [u8; 2],
    },
    /// The frame's version is not [`PROTOCOL_VERSION`].
    #[error("protocol version {found} is not supported (this side speaks {PROTOCOL_VERSION}); run the same farmem version on both ends")]
    UnsupportedVersion {
        /// The version found.
        found: u8,
    },
    /// The reserved flags are not zero.
    #[error("reserved header flags are set ({found:#06x})")]
    ReservedFlags {
        /// The flags found.
        found: u16,
    },
    /// The payload is longer than [`MAX_PAYLOAD_LEN`].
    #[error("frame payload of {len} bytes exceeds the limit of {MAX_PAYLOAD_LEN} bytes")]
    TooLong {
        /// The declared payload length.
        len: u32,
    },
}

/// A decoded frame header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// Raw opcode byte (responses have [`RESPONSE_BIT`] set).
    pub opcode: u8,
    /// The client's request id, echoed in the response.
    pub request_id: u64,
    /// Raw status code (0 in requests).
    pub status: u16,
    /// Bytes of payload that follow the header.
    pub payload_len: u32,
}

impl Header {
    /// A request header.
    pub fn request(opcode: Opcode, request_id: u64, payload_len: u32) -> Header {
        Header {
            opcode: opcode as u8,
            request_id,
            status: 0,
            payload_len,
        }
    }

    /// A response header for `opcode` (a raw opcode byte, so unknown requests can be answered).
    pub fn response(opcode: u8, request_id: u64, status: Status, payload_len: u32) -> Header {
        Header {
            opcode: opcode | RESPONSE_BIT,
            request_id,
            status: status.code(),
            payload_len,
        }
    }

    /// Whether this is a response frame.
    pub fn is_response(&self) -> bool {
        self.opcode & RESPONSE_BIT != 0
    }

    /// The request opcode this frame names, if known.
    pub fn op(&self) -> Option<Opcode> {
        Opcode::from_wire(self.opcode)
    }

    /// Decodes a header from the first [`HEADER_LEN`] bytes of `bytes`.
    pub fn decode(bytes: &[u8]) -> Result<Header, FrameError> {
        let Some(b) = bytes.get(..HEADER_LEN) else {
            return Err(FrameError::Truncated { have: bytes.len() });
        };
        if b[0..2] != MAGIC {
            return Err(FrameError::BadMagic {
                found: [b[0], b[1]],
            });
        }
        if b[2] != PROTOCOL_VERSION {
            return Err(FrameError::UnsupportedVersion { found: b[2] });
        }
        let flags = u16::from_le_bytes([b[14], b[15]]);
        if flags != 0 {
            return Err(FrameError::ReservedFlags { found: flags });
        }
        let payload_len = u32::from_le_bytes([b[16], b[17], b[18], b[19]]);
        if payload_len > MAX_PAYLOAD_LEN {
            return Err(FrameError::TooLong { len: payload_len });
        }
        Ok(Header {
            opcode: b[3],
            request_id: u64::from_le_bytes([b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11]]),
            status: u16::from_le_bytes([b[12], b[13]]),
            payload_len,
        })
    }

    /// The opcode and request id of a header that failed to decode, when the bytes are at least
    /// long enough to hold them, so the failure can still be answered.
    pub fn salvage(bytes: &[u8]) -> Option<(u8, u64)> {
        let b = bytes.get(..HEADER_LEN)?;
        (b[0..2] == MAGIC).then(|| {
            (
                b[3],
                u64::from_le_bytes([b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11]]),
            )
        })
    }

    /// Encodes the header.
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        b[0..2].copy_from_slice(&MAGIC);
        b[2] = PROTOCOL_VERSION;
        b[3] = self.opcode;
        b[4..12].copy_from_slice(&self.request_id.to_le_bytes());
        b[12..14].copy_from_slice(&self.status.to_le_bytes());
        b[16..20].copy_from_slice(&self.payload_len.to_le_bytes());
        b
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_round_trips() {
        let h = Header::response(
            Opcode::ReadPages as u8,
            0xdead_beef_1234,
            Status::NoSuchSlab,
            77,
        );
        let back = Header::decode(&h.encode()).unwrap();
        assert_eq!(back, h);
        assert!(back.is_response());
        assert_eq!(back.op(), Some(Opcode::ReadPages));
        assert_eq!(back.status, Status::NoSuchSlab.code());
    }

    #[test]
    fn bad_headers_are_rejected_with_the_reason() {
        let good = Header::request(Opcode::Stats, 9, 0).encode();
        assert_eq!(
            Header::decode(&good[..5]),
            Err(FrameError::Truncated { have: 5 })
        );
        let mut b = good;
        b[0] = b'X';
        assert!(matches!(
            Header::decode(&b),
            Err(FrameError::BadMagic { .. })
        ));
        assert_eq!(Header::salvage(&b), None);
        let mut b = good;
        b[2] = 9;
        assert_eq!(
            Header::decode(&b),
            Err(FrameError::UnsupportedVersion { found: 9 })
        );
        assert_eq!(Header::salvage(&b), Some((Opcode::Stats as u8, 9)));
        let mut b = good;
        b[15] = 1;
        assert!(matches!(
            Header::decode(&b),
            Err(FrameError::ReservedFlags { .. })
        ));
        let mut b = good;
        b[16..20].copy_from_slice(&(MAX_PAYLOAD_LEN + 1).to_le_bytes());
        assert_eq!(
            Header::decode(&b),
            Err(FrameError::TooLong {
                len: MAX_PAYLOAD_LEN + 1
            })
        );
    }

    #[test]
    fn opcodes_map_both_ways() {
        for op in Opcode::ALL {
            assert_eq!(Opcode::from_wire(op as u8), Some(op));
            assert_eq!(Opcode::from_wire(op as u8 | RESPONSE_BIT), Some(op));
        }
        assert_eq!(Opcode::from_wire(0), None);
        assert_eq!(Opcode::from_wire(0x7f), None);
    }
}
