//! The farmem wire protocol: the frames a client and a donor exchange over one connection.
//!
//! Every frame is a fixed 20-byte [`Header`] followed by a payload of `payload_len` bytes. The
//! header carries a request id, so a client may keep many requests in flight on one connection
//! and match each response to its request; every response carries an explicit [`Status`].
//!
//! | bytes  | field        | meaning                                                     |
//! |--------|--------------|-------------------------------------------------------------|
//! | 0..2   | magic        | `FM`                                                        |
//! | 2      | version      | framing version, [`PROTOCOL_VERSION`]                       |
//! | 3      | opcode       | a request [`Opcode`]; responses set bit 7 ([`RESPONSE_BIT`]) |
//! | 4..12  | request id   | chosen by the client, echoed in the response               |
//! | 12..14 | status       | 0 in requests; a [`Status`] in responses                    |
//! | 14..16 | flags        | reserved, must be 0                                         |
//! | 16..20 | payload_len  | at most [`MAX_PAYLOAD_LEN`]                                 |
//!
//! All integers are little-endian. The payloads are described on [`Request`] and [`Response`].
//!
//! # Design
//! Decoding is pure and allocation-free: a decoded message borrows the page bytes from the
//! caller's buffer, and every length is checked before it is used, so no input can make the
//! decoder panic or over-allocate (see the property tests and `fuzz/`).
#![forbid(unsafe_code)]

mod auth;
mod clients;
mod codec;
mod frame;
mod io;
mod message;
mod stats;
mod status;

pub use auth::{
    attach_proof, proofs_match, random_bytes, random_client_id, token_from_file_bytes, token_proof,
    RandomError, ReconnectKey, KEY_LEN, NONCE_LEN, PROOF_LEN,
};
pub use clients::{
    check_label, clean_label, ClientEntry, ClientsReply, LabelError, MAX_CLIENTS_LISTED,
    MAX_LABEL_LEN, MAX_TENANT_NAME_LEN,
};
pub use codec::{
    encode_alloc_slab, encode_auth, encode_challenge, encode_clients, encode_clients_reply,
    encode_error, encode_free_slab, encode_give_back, encode_hello, encode_ident,
    encode_pages_header, encode_read_pages, encode_reclaims, encode_slab_allocated, encode_stats,
    encode_stats_reply, encode_success, encode_welcome, encode_write_pages,
    encode_write_pages_header, EncodeError,
};
pub use frame::{FrameError, Header, Opcode, HEADER_LEN, MAGIC, RESPONSE_BIT};
pub use io::{read_frame, ReadFrameError};
pub use message::{
    AddrList, AuthMode, ClientsRaw, DecodeError, DonorInfo, Request, Response, SlabList, WriteBatch,
};
pub use stats::DonorStats;
pub use status::Status;

/// The unit of paging, in bytes.
pub const PAGE_SIZE: usize = 4096;
/// The most pages one READ_PAGES or WRITE_PAGES request may carry.
pub const MAX_BATCH_PAGES: usize = 256;
/// The framing version this crate speaks.
pub const PROTOCOL_VERSION: u8 = 2;
/// The longest auth token a donor or client accepts, in bytes (it never crosses the wire).
pub const MAX_TOKEN_LEN: usize = 256;
/// The longest error message an error response may carry, in bytes.
pub const MAX_ERROR_MESSAGE_LEN: usize = 1024;
/// The most slab ids one GIVE_BACK answer (to RECLAIMS) may carry; a donor wanting more back
/// from one client names the rest in later answers.
pub const MAX_RECLAIM_SLABS: usize = 1024;
/// Size of one page address on the wire (slab u32 + page index u32).
pub const PAGE_ADDR_LEN: usize = 8;
/// The largest payload any frame may have: a full write batch and its addresses, with room.
pub const MAX_PAYLOAD_LEN: u32 = (MAX_BATCH_PAGES * (PAGE_SIZE + PAGE_ADDR_LEN) + 64) as u32;

/// A page on a donor: the slab it belongs to and its index inside that slab.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PageAddr {
    /// Slab id, as handed out by the donor in ALLOC_SLAB.
    pub slab: u32,
    /// Page index inside the slab (0 .. slab_size / PAGE_SIZE).
    pub page: u32,
}
