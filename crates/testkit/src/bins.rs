//! The binaries under test, found from the test executable's path: cargo puts test
//! executables in `target/<profile>/deps/` and binaries and the preload library in
//! `target/<profile>/`.

use std::path::PathBuf;

/// File name of the preload library.
pub const PRELOAD_LIB: &str = "libfarmem_preload.so";

/// `target/<profile>/`, the directory the test executable's `deps/` is in.
pub fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("locating the test executable");
    let dir = exe.parent().expect("the test executable has a directory");
    match dir.file_name() {
        Some(n) if n == "deps" => dir.parent().expect("deps/ has a parent").to_path_buf(),
        _ => dir.to_path_buf(),
    }
}

/// The `farmem` binary under test; fails the test if it has not been built.
pub fn farmem() -> PathBuf {
    let bin = target_dir().join("farmem");
    assert!(
        bin.is_file(),
        "the farmem binary is not at {}: build it first (cargo build --release -p farmem), or \
         run the tests with cargo test --release --workspace",
        bin.display()
    );
    bin
}

/// The preload library under test (next to the binaries, or in `deps/`); fails the test if it
/// has not been built.
pub fn preload_lib() -> PathBuf {
    let dir = target_dir();
    [dir.join(PRELOAD_LIB), dir.join("deps").join(PRELOAD_LIB)]
        .into_iter()
        .find(|p| p.is_file())
        .unwrap_or_else(|| {
            panic!(
                "{PRELOAD_LIB} is missing in {}: build it first (cargo build --release \
                 --workspace, as scripts/setup.sh does)",
                dir.display()
            )
        })
}

/// Fails unless libfarmem_preload.so sits where `farmem run` looks for it (or FARMEM_PRELOAD
/// names it).
pub fn require_preload_lib() {
    if std::env::var_os("FARMEM_PRELOAD").is_none() {
        preload_lib();
    }
}
