//! The benchmarks live in their own binary: `farmem` has no `bench` subcommand, and
//! `farmem-bench` names the path where it looked when the `farmem` binary it runs is missing.

use std::path::Path;
use std::process::Command;

#[test]
fn farmem_has_no_bench_subcommand() {
    let farmem = Path::new(env!("CARGO_BIN_EXE_farmem-bench")).with_file_name("farmem");
    assert!(
        farmem.is_file(),
        "{} is missing: build the workspace first (cargo build --release --workspace)",
        farmem.display()
    );
    let out = Command::new(&farmem)
        .args(["bench", "fault"])
        .output()
        .expect("cannot run farmem");
    assert!(!out.status.success(), "`farmem bench fault` still runs");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("unrecognized subcommand 'bench'"), "{err}");
}

#[test]
fn a_missing_farmem_binary_is_named_with_its_path() {
    // A copy of farmem-bench in a directory without farmem beside it.
    let dir = tempfile::tempdir().unwrap();
    let copy = dir.path().join("farmem-bench");
    std::fs::copy(env!("CARGO_BIN_EXE_farmem-bench"), &copy).unwrap();
    let out = Command::new(&copy)
        .args(["compare", "-w", "seq", "--wss", "4MiB", "--passes", "1"])
        .args(["--systems", "farmem", "--json"])
        .output()
        .expect("cannot run the copy of farmem-bench");
    let err = String::from_utf8_lossy(&out.stderr);
    let missing = format!(
        "the farmem binary is missing at {}",
        dir.path().join("farmem").display()
    );
    assert!(err.contains(&missing), "{missing:?} not in:\n{err}");
    let rows: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("stdout is not JSON ({e}):\n{err}"));
    let farmem_row = rows
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["system"] == "farmem")
        .expect("a farmem row");
    assert!(farmem_row["avg_access_us"].is_null(), "farmem ran: {err}");
}
