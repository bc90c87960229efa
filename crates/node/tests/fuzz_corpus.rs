//! Replays every file of the node_wire fuzz target's corpus (`fuzz/corpus/node_wire/`) through
//! the function the fuzzer drives, on stable Rust: a crash the fuzzer found and saved stays
//! fixed.
#[path = "../../../fuzz/src/node_wire.rs"]
mod node_wire;

#[test]
fn the_node_wire_fuzz_corpus_replays() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus/node_wire");
    let mut n = 0;
    for e in std::fs::read_dir(&dir).expect("fuzz/corpus/node_wire exists") {
        node_wire::decode_stream(&std::fs::read(e.unwrap().path()).unwrap());
        n += 1;
    }
    assert!(n > 0, "the corpus is empty");
}
