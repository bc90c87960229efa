//! The node_wire target's body: the host tier's frame decoders (`farmem_node::wire`) over
//! arbitrary bytes, read as a stream of frames the way the node and its clients read them;
//! every frame decoded must encode back to the bytes it came from. Shared with
//! `crates/node/tests/fuzz_corpus.rs`, which replays the corpus through it on stable.
use farmem_node::wire::{decode_client_frame, decode_node_frame};

/// Decodes `data` as client frames and as node frames, frame after frame; any panic is a bug.
pub fn decode_stream(data: &[u8]) {
    let mut rest = data;
    while let Ok(Some((frame, used))) = decode_client_frame(rest) {
        assert!(used > 0 && used <= rest.len(), "a frame used {used} bytes");
        assert_eq!(
            frame.encode(),
            rest[..used],
            "{frame:?} encodes differently"
        );
        rest = &rest[used..];
    }
    let mut rest = data;
    while let Ok(Some((frame, used))) = decode_node_frame(rest) {
        assert!(used > 0 && used <= rest.len(), "a frame used {used} bytes");
        let again = decode_node_frame(&frame.encode());
        assert!(
            matches!(&again, Ok(Some((f, _))) if *f == frame),
            "{frame:?} does not decode back: {again:?}"
        );
        rest = &rest[used..];
    }
}
