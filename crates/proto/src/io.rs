//! Reading one whole frame from any [`std::io::Read`], shared by the donor and the transport so
//! both apply the same limits before they allocate.

use std::io::{self, Read};

use crate::{FrameError, Header, HEADER_LEN};

/// Why a frame could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ReadFrameError {
    /// The peer closed the connection cleanly between frames.
    #[error("connection closed by peer")]
    Closed,
    /// Reading failed (including a close in the middle of a frame).
    #[error("reading a frame failed")]
    Io(#[from] io::Error),
    /// The header is invalid. `salvage` holds the opcode and request id when they could be read,
    /// so the error can still be answered before the connection is closed.
    #[error("bad frame: {error}")]
    Frame {
        /// What is wrong.
        error: FrameError,
        /// Opcode and request id, if readable.
        salvage: Option<(u8, u64)>,
    },
}

/// Reads one frame: returns its header and leaves exactly its payload in `payload` (resized;
/// the allocation is reused across calls). The payload length is checked against the protocol
/// limit before anything is allocated.
pub fn read_frame<R: Read>(
    reader: &mut R,
    payload: &mut Vec<u8>,
) -> Result<Header, ReadFrameError> {
    let mut head = [0u8; HEADER_LEN];
    let mut filled = 0;
    while filled < HEADER_LEN {
        match reader.read(&mut head[filled..]) {
            Ok(0) if filled == 0 => return Err(ReadFrameError::Closed),
            Ok(0) => {
                return Err(ReadFrameError::Io(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    format!(
                        "connection closed inside a frame header ({filled} of {HEADER_LEN} bytes)"
                    ),
                )))
            }
            Ok(n) => filled += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(ReadFrameError::Io(e)),
        }
    }
    let header = Header::decode(&head).map_err(|error| ReadFrameError::Frame {
        error,
        salvage: Header::salvage(&head),
    })?;
    payload.clear();
    payload.resize(header.payload_len as usize, 0);
    reader.read_exact(payload)?;
    Ok(header)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{encode_alloc_slab, encode_free_slab, Opcode, MAX_PAYLOAD_LEN};

    #[test]
    fn reads_consecutive_frames_then_reports_clean_close() {
        let mut wire = Vec::new();
        encode_alloc_slab(&mut wire, 1);
        encode_free_slab(&mut wire, 2, 77);
        let mut r = &wire[..];
        let mut buf = Vec::new();
        let h = read_frame(&mut r, &mut buf).unwrap();
        assert_eq!(
            (h.op(), h.request_id, buf.len()),
            (Some(Opcode::AllocSlab), 1, 0)
        );
        let h = read_frame(&mut r, &mut buf).unwrap();
        assert_eq!(
            (h.op(), buf.as_slice()),
            (Some(Opcode::FreeSlab), &77u32.to_le_bytes()[..])
        );
        assert!(matches!(
            read_frame(&mut r, &mut buf),
            Err(ReadFrameError::Closed)
        ));
    }

    #[test]
    fn the_io_error_is_the_source_not_repeated_in_the_message() {
        use std::error::Error;
        let e = ReadFrameError::Io(io::Error::other("disk on fire"));
        assert!(!e.to_string().contains("disk on fire"), "{e}");
        assert_eq!(
            e.source().map(|s| s.to_string()).as_deref(),
            Some("disk on fire")
        );
    }

    #[test]
    fn truncated_and_oversized_frames_are_errors_without_allocation() {
        let mut wire = Vec::new();
        encode_free_slab(&mut wire, 2, 77);
        let mut buf = Vec::new();
        let mut r = &wire[..wire.len() - 1];
        assert!(matches!(
            read_frame(&mut r, &mut buf),
            Err(ReadFrameError::Io(_))
        ));
        let mut r = &wire[..7];
        assert!(matches!(
            read_frame(&mut r, &mut buf),
            Err(ReadFrameError::Io(_))
        ));

        let mut big = Header::request(Opcode::WritePages, 5, 0).encode();
        big[16..20].copy_from_slice(&u32::MAX.to_le_bytes());
        let mut r = &big[..];
        match read_frame(&mut r, &mut buf) {
            Err(ReadFrameError::Frame { error, salvage }) => {
                assert_eq!(error, FrameError::TooLong { len: u32::MAX });
                assert_eq!(salvage, Some((Opcode::WritePages as u8, 5)));
            }
            other => panic!("expected a frame error, got {other:?}"),
        }
        assert!(buf.capacity() < MAX_PAYLOAD_LEN as usize);
    }
}
