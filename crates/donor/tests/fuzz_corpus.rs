//! Replays every file of the donor fuzz target's corpus (`fuzz/corpus/donor/`) as a session
//! against a real in-process donor, through the function the fuzzer drives, on stable Rust; the
//! donor must still serve a new client afterwards.
#[path = "../../../fuzz/src/session.rs"]
mod session;

#[test]
fn the_donor_fuzz_corpus_replays() {
    let addr = session::donor();
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus/donor");
    let mut n = 0;
    for e in std::fs::read_dir(&dir).expect("fuzz/corpus/donor exists") {
        session::run_session(addr, &std::fs::read(e.unwrap().path()).unwrap());
        n += 1;
    }
    assert!(n > 0, "the corpus is empty");
    // Still alive: a new session authenticates (run_session panics otherwise).
    session::run_session(addr, &[]);
}
