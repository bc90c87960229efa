//! Replays every file of the decode fuzz target's corpus (`fuzz/corpus/decode/`) through the
//! function the fuzzer drives, on stable Rust: a crash the fuzzer found and saved stays fixed.
#[path = "../../../fuzz/src/decode.rs"]
mod decode;

#[test]
fn the_decode_fuzz_corpus_replays() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus/decode");
    let mut n = 0;
    for e in std::fs::read_dir(&dir).expect("fuzz/corpus/decode exists") {
        decode::decode_all(&std::fs::read(e.unwrap().path()).unwrap());
        n += 1;
    }
    assert!(n > 0, "the corpus is empty");
}
