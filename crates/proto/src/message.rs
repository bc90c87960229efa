//! Decoded requests and responses. Both borrow their variable parts from the frame buffer.

use crate::auth::{NONCE_LEN, PROOF_LEN};
use crate::{
    DonorStats, FrameError, Header, Opcode, PageAddr, Status, MAX_BATCH_PAGES,
    MAX_ERROR_MESSAGE_LEN, MAX_RECLAIM_SLABS, PAGE_ADDR_LEN, PAGE_SIZE,
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
    /// AUTH's mode byte is neither register (0) nor attach (1).
    #[error("unknown AUTH mode {0}")]
    AuthMode(u8),
    /// A GIVE_BACK list names more than [`MAX_RECLAIM_SLABS`] slabs.
    #[error("give_back list of {count} slabs exceeds the limit of {MAX_RECLAIM_SLABS}")]
    SlabListSize {
        /// Slabs the list claims.
        count: usize,
    },
    /// IDENT's label is empty, too long or not printable text.
    #[error("ident: {0}")]
    Label(#[from] crate::clients::LabelError),
    /// A CLIENTS answer is malformed.
    #[error("clients response: {0}")]
    Clients(&'static str),
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

/// A checked CLIENTS payload, borrowed from the frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientsRaw<'a> {
    raw: &'a [u8],
}

impl ClientsRaw<'_> {
    /// The answer, owned.
    pub fn decode(&self) -> crate::ClientsReply {
        crate::ClientsReply::decode(self.raw).expect("checked when the frame was decoded")
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

/// A list of slab ids, as carried by GIVE_BACK (the answer to RECLAIMS).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlabList<'a> {
    raw: &'a [u8],
}

impl<'a> SlabList<'a> {
    /// Slab ids in the list.
    pub fn len(&self) -> usize {
        self.raw.len() / 4
    }

    /// Whether the list is empty (the donor wants nothing back).
    pub fn is_empty(&self) -> bool {
        self.raw.is_empty()
    }

    /// The slab ids, in order.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = u32> + 'a {
        self.raw
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
    }
}

/// A decoded request.
///
/// Payload layouts (little-endian):
/// - HELLO: `proto_version u16`
/// - AUTH: `client_id u64, mode u8, token_proof[32], key_or_proof[32]` (see [`AuthMode`])
/// - ALLOC_SLAB: empty
/// - FREE_SLAB: `slab u32`
/// - WRITE_PAGES: `count u16, count × (slab u32, page u32), count × 4096 bytes`
/// - READ_PAGES: `count u16, count × (slab u32, page u32)`
/// - STATS: empty
/// - RECLAIMS: empty
/// - IDENT: `label` (the whole payload: 1 to [`crate::MAX_LABEL_LEN`] bytes of printable UTF-8)
/// - CLIENTS: empty
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Request<'a> {
    /// Open the handshake; must be the first request on a connection.
    Hello {
        /// The protocol version the client speaks.
        version: u16,
    },
    /// Authenticate, answering the nonce of HELLO's response.
    Auth {
        /// The client's id; its slabs belong to the reconnect key registered with it.
        client_id: u64,
        /// Whether this registers a new client id or attaches to a registered one.
        mode: AuthMode,
        /// [`crate::token_proof`] of the client's token (an empty token when it has none).
        token_proof: [u8; PROOF_LEN],
        /// Register: the client's reconnect key. Attach: [`crate::attach_proof`] of that key.
        key_or_proof: [u8; PROOF_LEN],
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
    /// Ask which of this client's slabs the donor wants back now.
    Reclaims,
    /// Say what this client is.
    Ident {
        /// Its program and host, as it sees them.
        label: &'a str,
    },
    /// Ask for this client's tenant and its clients.
    Clients,
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
                exact("hello", 2, payload)?;
                Ok(Request::Hello {
                    version: u16::from_le_bytes([payload[0], payload[1]]),
                })
            }
            Opcode::Auth => {
                exact("auth", AUTH_LEN, payload)?;
                let mode = match payload[8] {
                    0 => AuthMode::Register,
                    1 => AuthMode::Attach,
                    m => return Err(DecodeError::AuthMode(m)),
                };
                Ok(Request::Auth {
                    client_id: u64::from_le_bytes(payload[0..8].try_into().expect("8 bytes")),
                    mode,
                    token_proof: payload[9..9 + PROOF_LEN].try_into().expect("32 bytes"),
                    key_or_proof: payload[9 + PROOF_LEN..].try_into().expect("32 bytes"),
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
            Opcode::Reclaims => exact("reclaims", 0, payload).map(|()| Request::Reclaims),
            Opcode::Ident => Ok(Request::Ident {
                label: crate::clients::check_label(payload)?,
            }),
            Opcode::Clients => exact("clients", 0, payload).map(|()| Request::Clients),
        }
    }
}

/// Length of AUTH's payload.
pub(crate) const AUTH_LEN: usize = 8 + 1 + 2 * PROOF_LEN;

/// What an AUTH request does with its client id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum AuthMode {
    /// Register a new client id with a reconnect key (sent once, in this request).
    Register = 0,
    /// Attach to a registered client id, proving its reconnect key without sending it.
    Attach = 1,
}

/// What AUTH tells the client about the donor.
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
/// - HELLO: `nonce[32]`
/// - AUTH: `slab_size_bytes u64, capacity_bytes u64`
/// - ALLOC_SLAB: `slab u32`
/// - FREE_SLAB, WRITE_PAGES: empty
/// - READ_PAGES: `count u16, count × 4096 bytes`
/// - STATS: `n u16, n × u64` (see [`DonorStats`])
/// - RECLAIMS: `count u16, count × slab u32` (GIVE_BACK; `count` 0 to [`MAX_RECLAIM_SLABS`])
/// - IDENT: empty
/// - CLIENTS: see [`crate::ClientsReply`]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Response<'a> {
    /// HELLO's challenge: the nonce AUTH must answer.
    Challenge {
        /// The donor's random nonce for this connection.
        nonce: [u8; NONCE_LEN],
    },
    /// AUTH succeeded.
    Welcome(DonorInfo),
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
    /// RECLAIMS' answer: the slabs of this client the donor wants back now (least recently
    /// written first; empty when it wants nothing back). The client moves each elsewhere, then
    /// frees it with FREE_SLAB.
    GiveBack(SlabList<'a>),
    /// CLIENTS' answer, checked ([`ClientsRaw::decode`] gives it whole).
    Clients(ClientsRaw<'a>),
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
                exact("hello response", NONCE_LEN, payload)?;
                Ok(Response::Challenge {
                    nonce: payload.try_into().expect("32 bytes"),
                })
            }
            Opcode::Auth => {
                exact("auth response", 16, payload)?;
                Ok(Response::Welcome(DonorInfo {
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
            Opcode::FreeSlab | Opcode::WritePages | Opcode::Ident => {
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
            Opcode::Reclaims => {
                let Some(b) = payload.get(..2) else {
                    return Err(length("give_back response", 2, payload.len()));
                };
                let count = usize::from(u16::from_le_bytes([b[0], b[1]]));
                if count > MAX_RECLAIM_SLABS {
                    return Err(DecodeError::SlabListSize { count });
                }
                exact("give_back response", 2 + count * 4, payload)?;
                Ok(Response::GiveBack(SlabList { raw: &payload[2..] }))
            }
            Opcode::Clients => {
                crate::clients::validate(payload)?;
                Ok(Response::Clients(ClientsRaw { raw: payload }))
            }
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
