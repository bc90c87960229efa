//! Encoding: each function appends one whole frame (header and payload) to `out`.
//!
//! The `*_header` variants write everything but the page bytes, so a sender can pass the pages
//! themselves to a vectored write instead of copying them into one buffer.

use crate::auth::{NONCE_LEN, PROOF_LEN};
use crate::message::AUTH_LEN;
use crate::{
    AuthMode, DonorInfo, DonorStats, Header, Opcode, PageAddr, Status, MAX_BATCH_PAGES,
    MAX_ERROR_MESSAGE_LEN, MAX_RECLAIM_SLABS, PAGE_ADDR_LEN, PAGE_SIZE,
};

/// Why a frame could not be encoded (a caller bug: the arguments break a protocol limit).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EncodeError {
    /// A batch is empty or longer than [`MAX_BATCH_PAGES`].
    #[error("page batch of {count} pages is outside 1..={MAX_BATCH_PAGES}")]
    BatchSize {
        /// Pages in the batch.
        count: usize,
    },
    /// A page is not exactly [`PAGE_SIZE`] bytes.
    #[error("page {index} of the batch is {len} bytes, not {PAGE_SIZE}")]
    PageSize {
        /// Position in the batch.
        index: usize,
        /// Its length.
        len: usize,
    },
    /// A GIVE_BACK list is longer than [`MAX_RECLAIM_SLABS`].
    #[error("give_back list of {count} slabs exceeds the limit of {MAX_RECLAIM_SLABS}")]
    SlabListSize {
        /// Slabs in the list.
        count: usize,
    },
    /// An IDENT label is empty, too long or not printable text.
    #[error(transparent)]
    Label(#[from] crate::clients::LabelError),
}

fn put_header(out: &mut Vec<u8>, header: Header) {
    out.extend_from_slice(&header.encode());
}

fn check_batch(count: usize) -> Result<(), EncodeError> {
    if count == 0 || count > MAX_BATCH_PAGES {
        return Err(EncodeError::BatchSize { count });
    }
    Ok(())
}

fn payload_len(len: usize) -> u32 {
    // Every caller has checked its counts against MAX_BATCH_PAGES, so this cannot truncate.
    u32::try_from(len).expect("payload length checked against protocol limits")
}

fn put_addrs(out: &mut Vec<u8>, addrs: impl Iterator<Item = PageAddr>) {
    for a in addrs {
        out.extend_from_slice(&a.slab.to_le_bytes());
        out.extend_from_slice(&a.page.to_le_bytes());
    }
}

/// HELLO.
pub fn encode_hello(out: &mut Vec<u8>, request_id: u64) {
    put_header(out, Header::request(Opcode::Hello, request_id, 2));
    out.extend_from_slice(&u16::from(crate::PROTOCOL_VERSION).to_le_bytes());
}

/// AUTH.
pub fn encode_auth(
    out: &mut Vec<u8>,
    request_id: u64,
    client_id: u64,
    mode: AuthMode,
    token_proof: &[u8; PROOF_LEN],
    key_or_proof: &[u8; PROOF_LEN],
) {
    put_header(
        out,
        Header::request(Opcode::Auth, request_id, payload_len(AUTH_LEN)),
    );
    out.extend_from_slice(&client_id.to_le_bytes());
    out.push(mode as u8);
    out.extend_from_slice(token_proof);
    out.extend_from_slice(key_or_proof);
}

/// ALLOC_SLAB.
pub fn encode_alloc_slab(out: &mut Vec<u8>, request_id: u64) {
    put_header(out, Header::request(Opcode::AllocSlab, request_id, 0));
}

/// FREE_SLAB.
pub fn encode_free_slab(out: &mut Vec<u8>, request_id: u64, slab: u32) {
    put_header(out, Header::request(Opcode::FreeSlab, request_id, 4));
    out.extend_from_slice(&slab.to_le_bytes());
}

/// STATS.
pub fn encode_stats(out: &mut Vec<u8>, request_id: u64) {
    put_header(out, Header::request(Opcode::Stats, request_id, 0));
}

/// RECLAIMS.
pub fn encode_reclaims(out: &mut Vec<u8>, request_id: u64) {
    put_header(out, Header::request(Opcode::Reclaims, request_id, 0));
}

/// IDENT: `label` must pass [`crate::check_label`] (use [`crate::clean_label`] first).
pub fn encode_ident(out: &mut Vec<u8>, request_id: u64, label: &str) -> Result<(), EncodeError> {
    crate::check_label(label.as_bytes())?;
    put_header(
        out,
        Header::request(Opcode::Ident, request_id, payload_len(label.len())),
    );
    out.extend_from_slice(label.as_bytes());
    Ok(())
}

/// CLIENTS.
pub fn encode_clients(out: &mut Vec<u8>, request_id: u64) {
    put_header(out, Header::request(Opcode::Clients, request_id, 0));
}

/// CLIENTS' success response.
pub fn encode_clients_reply(out: &mut Vec<u8>, request_id: u64, reply: &crate::ClientsReply) {
    let at = out.len();
    put_header(
        out,
        Header::response(Opcode::Clients as u8, request_id, Status::Ok, 0),
    );
    reply.encode_payload(out);
    let len = payload_len(out.len() - at - crate::HEADER_LEN);
    let header = Header::response(Opcode::Clients as u8, request_id, Status::Ok, len);
    out[at..at + crate::HEADER_LEN].copy_from_slice(&header.encode());
}

/// READ_PAGES.
pub fn encode_read_pages(
    out: &mut Vec<u8>,
    request_id: u64,
    addrs: &[PageAddr],
) -> Result<(), EncodeError> {
    check_batch(addrs.len())?;
    let len = 2 + addrs.len() * PAGE_ADDR_LEN;
    put_header(
        out,
        Header::request(Opcode::ReadPages, request_id, payload_len(len)),
    );
    out.extend_from_slice(&(addrs.len() as u16).to_le_bytes());
    put_addrs(out, addrs.iter().copied());
    Ok(())
}

/// WRITE_PAGES without the page bytes: the header, count and addresses. The caller sends the
/// `addrs.len()` pages right after, in order.
pub fn encode_write_pages_header(
    out: &mut Vec<u8>,
    request_id: u64,
    addrs: impl ExactSizeIterator<Item = PageAddr>,
) -> Result<(), EncodeError> {
    let count = addrs.len();
    check_batch(count)?;
    let len = 2 + count * (PAGE_ADDR_LEN + PAGE_SIZE);
    put_header(
        out,
        Header::request(Opcode::WritePages, request_id, payload_len(len)),
    );
    out.extend_from_slice(&(count as u16).to_le_bytes());
    put_addrs(out, addrs);
    Ok(())
}

/// WRITE_PAGES, whole.
pub fn encode_write_pages(
    out: &mut Vec<u8>,
    request_id: u64,
    pages: &[(PageAddr, &[u8])],
) -> Result<(), EncodeError> {
    if let Some((index, (_, p))) = pages
        .iter()
        .enumerate()
        .find(|(_, (_, p))| p.len() != PAGE_SIZE)
    {
        return Err(EncodeError::PageSize {
            index,
            len: p.len(),
        });
    }
    encode_write_pages_header(out, request_id, pages.iter().map(|(a, _)| *a))?;
    for (_, p) in pages {
        out.extend_from_slice(p);
    }
    Ok(())
}

/// A successful response with an empty payload (FREE_SLAB, WRITE_PAGES).
pub fn encode_success(out: &mut Vec<u8>, opcode: Opcode, request_id: u64) {
    put_header(
        out,
        Header::response(opcode as u8, request_id, Status::Ok, 0),
    );
}

/// An error response to the request with raw opcode `opcode`; `message` is cut to
/// [`MAX_ERROR_MESSAGE_LEN`] bytes on a character boundary.
pub fn encode_error(out: &mut Vec<u8>, opcode: u8, request_id: u64, status: Status, message: &str) {
    debug_assert_ne!(
        status,
        Status::Ok,
        "an error response needs an error status"
    );
    let mut end = message.len().min(MAX_ERROR_MESSAGE_LEN);
    while !message.is_char_boundary(end) {
        end -= 1;
    }
    let message = &message.as_bytes()[..end];
    put_header(
        out,
        Header::response(opcode, request_id, status, payload_len(message.len())),
    );
    out.extend_from_slice(message);
}

/// HELLO's success response: the challenge.
pub fn encode_challenge(out: &mut Vec<u8>, request_id: u64, nonce: &[u8; NONCE_LEN]) {
    put_header(
        out,
        Header::response(
            Opcode::Hello as u8,
            request_id,
            Status::Ok,
            payload_len(NONCE_LEN),
        ),
    );
    out.extend_from_slice(nonce);
}

/// AUTH's success response.
pub fn encode_welcome(out: &mut Vec<u8>, request_id: u64, info: DonorInfo) {
    put_header(
        out,
        Header::response(Opcode::Auth as u8, request_id, Status::Ok, 16),
    );
    out.extend_from_slice(&info.slab_size_bytes.to_le_bytes());
    out.extend_from_slice(&info.capacity_bytes.to_le_bytes());
}

/// ALLOC_SLAB's success response.
pub fn encode_slab_allocated(out: &mut Vec<u8>, request_id: u64, slab: u32) {
    put_header(
        out,
        Header::response(Opcode::AllocSlab as u8, request_id, Status::Ok, 4),
    );
    out.extend_from_slice(&slab.to_le_bytes());
}

/// READ_PAGES' success response without the page bytes; the caller appends `count` pages.
pub fn encode_pages_header(
    out: &mut Vec<u8>,
    request_id: u64,
    count: usize,
) -> Result<(), EncodeError> {
    check_batch(count)?;
    put_header(
        out,
        Header::response(
            Opcode::ReadPages as u8,
            request_id,
            Status::Ok,
            payload_len(2 + count * PAGE_SIZE),
        ),
    );
    out.extend_from_slice(&(count as u16).to_le_bytes());
    Ok(())
}

/// STATS' success response.
pub fn encode_stats_reply(out: &mut Vec<u8>, request_id: u64, stats: &DonorStats) {
    let values = stats.to_array();
    put_header(
        out,
        Header::response(
            Opcode::Stats as u8,
            request_id,
            Status::Ok,
            payload_len(2 + values.len() * 8),
        ),
    );
    out.extend_from_slice(&(values.len() as u16).to_le_bytes());
    for v in values {
        out.extend_from_slice(&v.to_le_bytes());
    }
}

/// RECLAIMS' success response, GIVE_BACK: the slabs the donor wants back from this client (at
/// most [`MAX_RECLAIM_SLABS`]; none when it wants nothing back).
pub fn encode_give_back(
    out: &mut Vec<u8>,
    request_id: u64,
    slabs: &[u32],
) -> Result<(), EncodeError> {
    if slabs.len() > MAX_RECLAIM_SLABS {
        return Err(EncodeError::SlabListSize { count: slabs.len() });
    }
    put_header(
        out,
        Header::response(
            Opcode::Reclaims as u8,
            request_id,
            Status::Ok,
            payload_len(2 + slabs.len() * 4),
        ),
    );
    out.extend_from_slice(&(slabs.len() as u16).to_le_bytes());
    for s in slabs {
        out.extend_from_slice(&s.to_le_bytes());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{DecodeError, Request, Response, HEADER_LEN};

    fn split(frame: &[u8]) -> (Header, &[u8]) {
        let h = Header::decode(frame).unwrap();
        assert_eq!(frame.len(), HEADER_LEN + h.payload_len as usize);
        (h, &frame[HEADER_LEN..])
    }

    #[test]
    fn requests_round_trip() {
        let mut out = Vec::new();
        encode_hello(&mut out, 1);
        let (h, p) = split(&out);
        assert_eq!(
            Request::decode(&h, p).unwrap(),
            Request::Hello {
                version: u16::from(crate::PROTOCOL_VERSION)
            }
        );

        for mode in [AuthMode::Register, AuthMode::Attach] {
            out.clear();
            encode_auth(&mut out, 9, 42, mode, &[1u8; PROOF_LEN], &[2u8; PROOF_LEN]);
            let (h, p) = split(&out);
            assert_eq!(
                Request::decode(&h, p).unwrap(),
                Request::Auth {
                    client_id: 42,
                    mode,
                    token_proof: [1u8; PROOF_LEN],
                    key_or_proof: [2u8; PROOF_LEN],
                }
            );
        }
        // An unknown mode byte is refused.
        let mut bad = out.clone();
        bad[HEADER_LEN + 8] = 2;
        let (h, p) = split(&bad);
        assert_eq!(Request::decode(&h, p), Err(DecodeError::AuthMode(2)));
        out.clear();

        let page_a = [0xAAu8; PAGE_SIZE];
        let page_b = [0x55u8; PAGE_SIZE];
        let a = PageAddr { slab: 3, page: 7 };
        let b = PageAddr { slab: 4, page: 0 };
        out.clear();
        encode_write_pages(&mut out, 2, &[(a, &page_a), (b, &page_b)]).unwrap();
        let (h, p) = split(&out);
        let Request::WritePages(batch) = Request::decode(&h, p).unwrap() else {
            panic!("not a write");
        };
        let got: Vec<_> = batch.iter().collect();
        assert_eq!(got, vec![(a, &page_a[..]), (b, &page_b[..])]);

        out.clear();
        encode_read_pages(&mut out, 3, &[a, b]).unwrap();
        let (h, p) = split(&out);
        let Request::ReadPages(list) = Request::decode(&h, p).unwrap() else {
            panic!("not a read");
        };
        assert_eq!(list.iter().collect::<Vec<_>>(), vec![a, b]);

        out.clear();
        encode_free_slab(&mut out, 4, 9);
        let (h, p) = split(&out);
        assert_eq!(
            Request::decode(&h, p).unwrap(),
            Request::FreeSlab { slab: 9 }
        );

        out.clear();
        encode_reclaims(&mut out, 5);
        let (h, p) = split(&out);
        assert_eq!(Request::decode(&h, p).unwrap(), Request::Reclaims);
        // RECLAIMS carries nothing: a payload is refused as malformed.
        let mut bad = Header::request(Opcode::Reclaims, 6, 4).encode().to_vec();
        bad.extend_from_slice(&[1, 2, 3, 4]);
        let (h, p) = split(&bad);
        let err = Request::decode(&h, p).unwrap_err();
        assert!(
            matches!(
                err,
                DecodeError::Length {
                    what: "reclaims",
                    ..
                }
            ),
            "{err:?}"
        );
        assert_eq!(err.status(), Status::Malformed);
    }

    #[test]
    fn give_back_round_trips_and_its_list_is_bounded() {
        let mut out = Vec::new();
        for slabs in [
            vec![],
            vec![7u32],
            vec![3, 1, u32::MAX],
            vec![5; MAX_RECLAIM_SLABS],
        ] {
            out.clear();
            encode_give_back(&mut out, 8, &slabs).unwrap();
            let (h, p) = split(&out);
            let Response::GiveBack(list) = Response::decode(&h, p).unwrap() else {
                panic!("not a give_back");
            };
            assert_eq!(list.len(), slabs.len());
            assert_eq!(list.is_empty(), slabs.is_empty());
            assert_eq!(list.iter().collect::<Vec<_>>(), slabs);
        }
        out.clear();
        assert_eq!(
            encode_give_back(&mut out, 8, &vec![1; MAX_RECLAIM_SLABS + 1]),
            Err(EncodeError::SlabListSize {
                count: MAX_RECLAIM_SLABS + 1
            })
        );
        assert!(out.is_empty(), "a refused encode writes nothing");

        let frame = |count: u16, ids: usize| {
            let len = (2 + ids * 4) as u32;
            let mut f = Header::response(Opcode::Reclaims as u8, 1, Status::Ok, len)
                .encode()
                .to_vec();
            f.extend_from_slice(&count.to_le_bytes());
            f.extend(std::iter::repeat_n(9u8, ids * 4));
            f
        };
        // A count over the limit is refused before the list is looked at.
        let f = frame(MAX_RECLAIM_SLABS as u16 + 1, 0);
        let (h, p) = split(&f);
        assert_eq!(
            Response::decode(&h, p),
            Err(DecodeError::SlabListSize {
                count: MAX_RECLAIM_SLABS + 1
            })
        );
        // A count that does not match the payload, either way.
        for (count, ids) in [(3u16, 2usize), (1, 2)] {
            let f = frame(count, ids);
            let (h, p) = split(&f);
            assert!(
                matches!(Response::decode(&h, p), Err(DecodeError::Length { .. })),
                "count {count} with {ids} ids"
            );
        }
        // No count at all.
        let f = Header::response(Opcode::Reclaims as u8, 1, Status::Ok, 1)
            .encode()
            .iter()
            .copied()
            .chain([0u8])
            .collect::<Vec<_>>();
        let (h, p) = split(&f);
        assert!(matches!(
            Response::decode(&h, p),
            Err(DecodeError::Length { .. })
        ));
    }

    #[test]
    fn responses_round_trip() {
        let mut out = Vec::new();
        let info = DonorInfo {
            slab_size_bytes: 64 << 20,
            capacity_bytes: 1 << 30,
        };
        encode_welcome(&mut out, 1, info);
        let (h, p) = split(&out);
        assert_eq!(Response::decode(&h, p).unwrap(), Response::Welcome(info));

        out.clear();
        encode_challenge(&mut out, 1, &[5u8; NONCE_LEN]);
        let (h, p) = split(&out);
        assert_eq!(
            Response::decode(&h, p).unwrap(),
            Response::Challenge {
                nonce: [5u8; NONCE_LEN]
            }
        );

        out.clear();
        encode_pages_header(&mut out, 2, 2).unwrap();
        out.extend_from_slice(&[1u8; PAGE_SIZE]);
        out.extend_from_slice(&[2u8; PAGE_SIZE]);
        let (h, p) = split(&out);
        let Response::Pages { count, data } = Response::decode(&h, p).unwrap() else {
            panic!("not pages");
        };
        assert_eq!(count, 2);
        assert_eq!(data[PAGE_SIZE], 2);

        out.clear();
        let stats = DonorStats {
            used_bytes: 5,
            uptime_ms: 99,
            ..DonorStats::default()
        };
        encode_stats_reply(&mut out, 3, &stats);
        let (h, p) = split(&out);
        assert_eq!(Response::decode(&h, p).unwrap(), Response::Stats(stats));

        out.clear();
        encode_error(
            &mut out,
            Opcode::ReadPages as u8,
            4,
            Status::NoSuchSlab,
            "slab 9 is not yours",
        );
        let (h, p) = split(&out);
        assert_eq!(
            Response::decode(&h, p).unwrap(),
            Response::Error {
                status: Status::NoSuchSlab,
                message: "slab 9 is not yours"
            }
        );
    }

    #[test]
    fn limits_are_enforced_on_both_sides() {
        let mut out = Vec::new();
        let addrs = vec![PageAddr { slab: 0, page: 0 }; MAX_BATCH_PAGES + 1];
        assert_eq!(
            encode_read_pages(&mut out, 1, &addrs),
            Err(EncodeError::BatchSize {
                count: MAX_BATCH_PAGES + 1
            })
        );
        assert_eq!(
            encode_read_pages(&mut out, 1, &[]),
            Err(EncodeError::BatchSize { count: 0 })
        );
        assert!(matches!(
            encode_write_pages(&mut out, 1, &[(addrs[0], &[0u8; 10])]),
            Err(EncodeError::PageSize { index: 0, len: 10 })
        ));
        assert!(out.is_empty(), "a refused encode writes nothing");

        // A hand-made READ_PAGES claiming 257 pages is refused with BatchTooLarge.
        let mut frame = Header::request(Opcode::ReadPages, 1, 2).encode().to_vec();
        frame.extend_from_slice(&257u16.to_le_bytes());
        let (h, p) = split(&frame);
        let err = Request::decode(&h, p).unwrap_err();
        assert_eq!(err, DecodeError::BatchSize { count: 257 });
        assert_eq!(err.status(), Status::BatchTooLarge);
    }

    #[test]
    fn long_error_messages_are_cut_on_a_char_boundary() {
        let mut out = Vec::new();
        let msg = "é".repeat(MAX_ERROR_MESSAGE_LEN);
        encode_error(&mut out, 5, 1, Status::Internal, &msg);
        let (h, p) = split(&out);
        assert!(p.len() <= MAX_ERROR_MESSAGE_LEN);
        assert!(matches!(
            Response::decode(&h, p).unwrap(),
            Response::Error { status: Status::Internal, message } if message.chars().all(|c| c == 'é')
        ));
    }
}
