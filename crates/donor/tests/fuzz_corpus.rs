//! Replays every file of the donor fuzz target's corpus (`fuzz/corpus/donor/`) as a session
//! through the function the fuzzer drives (in-process, no socket), on stable Rust; and the seed
//! sessions through a real TCP donor too, so the socket path runs the same sessions.
#[path = "../../../fuzz/src/session.rs"]
mod session;

use std::path::PathBuf;

fn corpus() -> Vec<PathBuf> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus/donor");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("fuzz/corpus/donor exists")
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    assert!(!files.is_empty(), "the corpus is empty");
    files
}

#[test]
fn the_donor_fuzz_corpus_replays() {
    let donor = session::donor();
    for f in corpus() {
        session::run_session(donor, &std::fs::read(&f).unwrap());
    }
}

#[test]
fn the_seed_sessions_replay_over_tcp() {
    let addr = session::tcp_donor();
    let mut n = 0;
    for f in corpus() {
        let name = f.file_name().unwrap().to_string_lossy();
        if name.starts_with("seed-") {
            session::run_tcp_session(addr, &std::fs::read(&f).unwrap());
            n += 1;
        }
    }
    assert!(n > 0, "the corpus has no seed sessions");
    // Still serving: a new session authenticates (run_tcp_session panics otherwise).
    session::run_tcp_session(addr, &[]);
}
