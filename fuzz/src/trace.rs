//! The trace target's body: the sim crate's trace reader over arbitrary bytes. Shared with
//! `crates/sim/tests/fuzz_corpus.rs`, which replays the corpus through it on stable.
use farmem_sim::trace::TraceReader;

/// Reads `data` as a trace file to its end or first error; any panic (or a hang) is a bug.
pub fn read_trace(data: &[u8]) {
    let Ok(mut r) = TraceReader::new(data) else {
        return;
    };
    let _ = r.len();
    // A corrupt record count must not make this loop longer than the bytes allow.
    let mut budget = data.len() + 1;
    while let Ok(Some(_)) = r.next_record() {
        budget -= 1;
        assert!(
            budget > 0,
            "the trace reader returned more records than bytes"
        );
    }
}
