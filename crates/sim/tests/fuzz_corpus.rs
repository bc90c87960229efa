//! Replays every file of the trace fuzz target's corpus (`fuzz/corpus/trace/`) through the
//! function the fuzzer drives, on stable Rust: a crash the fuzzer found and saved stays fixed.
#[path = "../../../fuzz/src/trace.rs"]
mod trace;

#[test]
fn the_trace_fuzz_corpus_replays() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus/trace");
    let mut n = 0;
    for e in std::fs::read_dir(&dir).expect("fuzz/corpus/trace exists") {
        trace::read_trace(&std::fs::read(e.unwrap().path()).unwrap());
        n += 1;
    }
    assert!(n > 0, "the corpus is empty");
}
