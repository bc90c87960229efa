//! Decoded requests and responses. Both borrow their variable parts from the frame buffer.

use crate::{
    DonorStats, FrameError, Header, Opcode, PageAddr, Status, MAX_BATCH_PAGES,
    MAX_ERROR_MESSAGE_LEN, MAX_TOKEN_LEN, PAGE_ADDR_LEN, PAGE_SIZE,
};

/// Why a payload could not be decoded. [`DecodeError::status`] is the status to answer with.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// The header itself is bad.
    #[error(transparent)]
    Frame(#[from] FrameError),
    /// The opcode is not a known request.
    #[error("unknown request type {0:#04x}")]
    UnknownOpcode(u8),
    /// A response carries a status code this side does not know.
    #[error("unknown status code {0}")]
    UnknownStatus(u16),
    /// The payload is shorter or longer than its layout says.
    #[error("{what}: payload is {got} bytes, expected {expected}")]
    Length {
        /// Which message.
        what: &'static str,
        /// Bytes the layout needs.
        expected: usize,
        /// Bytes present.
        got: usize,
    },
    /// A page batch is empty or over [`MAX_BATCH_PAGES`].
    #[error("page batch of {count} pages is outside 1..={MAX_BATCH_PAGES}")]
    BatchSize {
        /// Pages in the batch.
        count: usize,
    },
    /// HELLO's token is longer than [`MAX_TOKEN_LEN`].
    #[error("auth token of {len} bytes exceeds {MAX_TOKEN_LEN}")]
    TokenTooLong {
        /// Declared token length.
        len: usize,
    },
}

impl DecodeError {
    /// The status a donor answers this error with.
    pub fn status(&self) -> Status {
        match self {
            DecodeError::Frame(FrameError::UnsupportedVersion { .. }) => Status::BadVersion,
            DecodeError::UnknownOpcode(_) => Status::UnknownRequest,
            DecodeError::BatchSize { .. } => Status::BatchTooLarge,
            _ => Status::Malformed,
        }
    }
}

/// The pages of a WRITE_PAGES request: `count` addresses followed by `count` pages of data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WriteBatch<'a> {
    addrs: AddrList<'a>,
    data: &'a [u8],
}

impl<'a> WriteBatch<'a> {
    /// Pages in the batch.
    pub fn len(&self) -> usize {
        self.addrs.len()
    }

    /// Whether the batch is empty (never true for a decoded batch).
    pub fn is_empty(&self) -> bool {
        self.addrs.is_empty()
    }

    /// Each page's address and its [`PAGE_SIZE`] bytes, in order.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = (PageAddr, &'a [u8])> + 'a {
        self.addrs.iter().zip(self.data.chunks_exact(PAGE_SIZE))
    }
}

/// A list of page addresses, as carried by READ_PAGES and WRITE_PAGES.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AddrList<'a> {
    raw: &'a [u8],
}

impl<'a> AddrList<'a> {
    /// Addresses in the list.
    pub fn len(&self) -> usize {
        self.raw.len() / PAGE_ADDR_LEN
    }

    /// Whether the list is empty (never true for a decoded list).
    pub fn is_empty(&self) -> bool {
        self.raw.is_empty()
    }

    /// The addresses, in order.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = PageAddr> + 'a {
        self.raw.chunks_exact(PAGE_ADDR_LEN).map(|c| PageAddr {
            slab: u32::from_le_bytes([c[0], c[1], c[2], c[3]]),
            page: u32::from_le_bytes([c[4], c[5], c[6], c[7]]),
        })
    }
}

/// A decoded request.
///
/// Payload layouts (little-endian):
/// - HELLO: `proto_version u16, client_id u64, token_len u16, token[token_len]`
/// - ALLOC_SLAB: empty
/// - FREE_SLAB: `slab u32`
/// - WRITE_PAGES: `count u16, count × (slab u32, page u32), count × 4096 bytes`
/// - READ_PAGES: `count u16, count × (slab u32, page u32)`
/// - STATS: empty
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Request<'a> {
    /// Authenticate; must be the first request on a connection.
    Hello {
        /// The protocol version the client speaks.
        version: u16,
        /// Stable id of the client; reconnecting with the same id finds the same slabs.
        client_id: u64,
        /// The auth token (empty when the client has none).
        token: &'a [u8],
    },
    /// Allocate a slab.
    AllocSlab,
    /// Free a slab.
    FreeSlab {
        /// The slab to free.
        slab: u32,
    },
    /// Store pages.
    WritePages(WriteBatch<'a>),
    /// Fetch pages.
    ReadPages(AddrList<'a>),
    /// Report counters.
    Stats,
}

impl<'a> Request<'a> {
    /// Decodes the payload of a request frame whose header is `header`.
    pub fn decode(header: &Header, payload: &'a [u8]) -> Result<Request<'a>, DecodeError> {
        let op = header
            .op()
            .filter(|_| !header.is_response())
            .ok_or(DecodeError::UnknownOpcode(header.opcode))?;
        match op {
            Opcode::Hello => {
                let fixed = 2 + 8 + 2;
                if payload.len() < fixed {
                    return Err(length("hello", fixed, payload.len()));
                }
                let token_len = usize::from(u16::from_le_bytes([payload[10], payload[11]]));
                if token_len > MAX_TOKEN_LEN {
                    return Err(DecodeError::TokenTooLong { len: token_len });
                }
                exact("hello", fixed + token_len, payload)?;
                Ok(Request::Hello {
                    version: u16::from_le_bytes([payload[0], payload[1]]),
                    client_id: u64::from_le_bytes(payload[2..10].try_into().expect("8 bytes")),
                    token: &payload[fixed..],
                })
            }
            Opcode::AllocSlab => exact("alloc_slab", 0, payload).map(|()| Request::AllocSlab),
            Opcode::FreeSlab => {
                exact("free_slab", 4, payload)?;
                Ok(Request::FreeSlab {
                    slab: u32::from_le_bytes(payload[0..4].try_into().expect("4 bytes")),
                })
            }
            Opcode::WritePages => {
                let count = batch_count(payload)?;
                let addrs_end = 2 + count * PAGE_ADDR_LEN;
                exact("write_pages", addrs_end + count * PAGE_SIZE, payload)?;
                Ok(Request::WritePages(WriteBatch {
                    addrs: AddrList {
                        raw: &payload[2..addrs_end],
                    },
                    data: &payload[addrs_end..],
                }))
            }
            Opcode::ReadPages => {
                let count = batch_count(payload)?;
                exact("read_pages", 2 + count * PAGE_ADDR_LEN, payload)?;
                Ok(Request::ReadPages(AddrList { raw: &payload[2..] }))
            }
            Opcode::Stats => exact("stats", 0, payload).map(|()| Request::Stats),
        }
    }
}

/// What HELLO tells the client about the donor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DonorInfo {
    /// Size of every slab, in bytes (a multiple of [`PAGE_SIZE`]).
    pub slab_size_bytes: u64,
    /// The donor's total lendable capacity, in bytes.
    pub capacity_bytes: u64,
}

/// A decoded response.
///
/// Payload layouts for status OK (little-endian); an error response's payload is a UTF-8
/// message of at most [`MAX_ERROR_MESSAGE_LEN`] bytes:
/// - HELLO: `slab_size_bytes u64, capacity_bytes u64`
/// - ALLOC_SLAB: `slab u32`
/// - FREE_SLAB, WRITE_PAGES: empty
/// - READ_PAGES: `count u16, count × 4096 bytes`
/// - STATS: `n u16, n × u64` (see [`DonorStats`])
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Response<'a> {
    /// HELLO succeeded.
    Hello(DonorInfo),
    /// A slab was allocated.
    SlabAllocated {
        /// Its id.
        slab: u32,
    },
    /// FREE_SLAB or WRITE_PAGES succeeded.
    Done,
    /// The pages asked for, `count × 4096` bytes in request order.
    Pages {
        /// Number of pages.
        count: usize,
        /// The page bytes.
        data: &'a [u8],
    },
    /// The donor's counters.
    Stats(DonorStats),
    /// The request failed.
    Error {
        /// Why (never [`Status::Ok`]).
        status: Status,
        /// The donor's explanation.
        message: &'a str,
    },
}

impl<'a> Response<'a> {
    /// Decodes the payload of a response frame whose header is `header`.
    pub fn decode(header: &Header, payload: &'a [u8]) -> Result<Response<'a>, DecodeError> {
        let status =
            Status::from_code(header.status).ok_or(DecodeError::UnknownStatus(header.status))?;
        if status != Status::Ok {
            if payload.len() > MAX_ERROR_MESSAGE_LEN {
                return Err(length("error", MAX_ERROR_MESSAGE_LEN, payload.len()));
            }
            let message = std::str::from_utf8(payload).unwrap_or("(message not UTF-8)");
            return Ok(Response::Error { status, message });
        }
        let op = header
            .op()
            .filter(|_| header.is_response())
            .ok_or(DecodeError::UnknownOpcode(header.opcode))?;
        match op {
            Opcode::Hello => {
                exact("hello response", 16, payload)?;
                Ok(Response::Hello(DonorInfo {
                    slab_size_bytes: u64::from_le_bytes(payload[0..8].try_into().expect("8")),
                    capacity_bytes: u64::from_le_bytes(payload[8..16].try_into().expect("8")),
                }))
            }
            Opcode::AllocSlab => {
                exact("alloc_slab response", 4, payload)?;
                Ok(Response::SlabAllocated {
                    slab: u32::from_le_bytes(payload[0..4].try_into().expect("4")),
                })
            }
            Opcode::FreeSlab | Opcode::WritePages => {
                exact("empty response", 0, payload).map(|()| Response::Done)
            }
            Opcode::ReadPages => {
                let count = batch_count(payload)?;
                exact("read_pages response", 2 + count * PAGE_SIZE, payload)?;
                Ok(Response::Pages {
                    count,
                    data: &payload[2..],
                })
            }
            Opcode::Stats => DonorStats::decode(payload).map(Response::Stats),
        }
    }
}

fn length(what: &'static str, expected: usize, got: usize) -> DecodeError {
    DecodeError::Length {
        what,
        expected,
        got,
    }
}

fn exact(what: &'static str, expected: usize, payload: &[u8]) -> Result<(), DecodeError> {
    if payload.len() == expected {
        Ok(())
    } else {
        Err(length(what, expected, payload.len()))
    }
}

/// Reads and checks the leading `count u16` of a page batch.
fn batch_count(payload: &[u8]) -> Result<usize, DecodeError> {
    let Some(b) = payload.get(..2) else {
        return Err(length("page batch", 2, payload.len()));
    };
    let count = usize::from(u16::from_le_bytes([b[0], b[1]]));
    if count == 0 || count > MAX_BATCH_PAGES {
        return Err(DecodeError::BatchSize { count });
    }
    Ok(count)
}
