//! The trace format on real files: generated traces survive a write/read round trip, and files
//! damaged on disk (cut short, a byte changed, a writer killed mid-way) are refused.

use farmem_sim::gen::{generate, GenSpec};
use farmem_sim::trace::{read_trace, write_trace, TraceReader, TraceWriter};
use farmem_sim::TraceError;

#[test]
fn generated_trace_round_trips_through_a_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.fmtrace");
    let recs = generate(
        &GenSpec::parse("interleave:4:3,5,7,11").unwrap(),
        4096,
        10_000,
        9,
    )
    .unwrap();
    write_trace(&path, &recs).unwrap();
    assert_eq!(read_trace(&path).unwrap(), recs);
    let len = std::fs::metadata(&path).unwrap().len();
    assert!(len < 10_000 * 8, "compact: {len} bytes for 10000 accesses");
    assert_eq!(TraceReader::open(&path).unwrap().len(), 10_000);
}

#[test]
fn damaged_files_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.fmtrace");
    let recs = generate(&GenSpec::Random, 1000, 500, 3).unwrap();
    write_trace(&path, &recs).unwrap();
    let good = std::fs::read(&path).unwrap();

    std::fs::write(&path, &good[..good.len() - 3]).unwrap();
    let e = read_trace(&path).unwrap_err();
    assert!(
        matches!(e, TraceError::Truncated { expected: 500, .. }),
        "{e}"
    );
    assert!(e
        .to_string()
        .starts_with("truncated trace: the header announces 500 records"));

    let mut bad = good.clone();
    let mid = bad.len() / 2;
    bad[mid] = bad[mid].wrapping_add(1);
    std::fs::write(&path, &bad).unwrap();
    assert!(read_trace(&path).is_err(), "a changed byte must be noticed");

    std::fs::write(&path, b"hello, I am not a trace at all, really").unwrap();
    let e = read_trace(&path).unwrap_err();
    assert!(e.to_string().starts_with("not a farmem trace"), "{e}");

    let e = read_trace(dir.path().join("missing")).unwrap_err();
    assert!(e.to_string().starts_with("cannot open trace"), "{e}");
}

#[test]
fn a_writer_that_dies_leaves_an_unfinished_trace() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.fmtrace");
    let mut w = TraceWriter::create(&path).unwrap();
    for r in generate(&GenSpec::Seq, 100, 100_000, 1).unwrap() {
        w.write(&r).unwrap();
    }
    std::mem::forget(w); // as if the process was killed: no finish, no drop
    let e = read_trace(&path).unwrap_err();
    assert!(matches!(e, TraceError::Unfinished), "{e}");
}

#[test]
fn creating_in_a_missing_directory_says_so() {
    let e = TraceWriter::create("/nonexistent-dir/x.fmtrace").unwrap_err();
    assert!(
        e.to_string()
            .starts_with("cannot create trace /nonexistent-dir/x.fmtrace"),
        "{e}"
    );
}
