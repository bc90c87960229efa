//! The C API: a C program built with `cc` against include/farmem.h and libfarmem_capi.so, run
//! with the embedded donor (the `farmem` binary of the same target directory).

use std::path::{Path, PathBuf};
use std::process::Command;

/// The target directory's profile folder (`target/release`): this test runs from its `deps/`.
fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("the test's own path");
    let deps = exe.parent().expect("the test sits in a directory");
    deps.parent()
        .expect("the test sits in target/<profile>/deps")
        .to_path_buf()
}

/// The `farmem` binary the embedded donor is started from.
fn farmem_bin(dir: &Path) -> PathBuf {
    let farmem = dir.join("farmem");
    assert!(
        farmem.is_file(),
        "{} is missing: the C API starts its embedded donor with the farmem binary; build it \
         first (cargo build --release -p farmem)",
        farmem.display()
    );
    farmem
}

#[test]
fn c_program_uses_the_c_api() {
    let bin_dir = profile_dir();
    let farmem = farmem_bin(&bin_dir);
    // The cdylib sits next to the binaries when farmem-capi is built as a workspace member, in
    // deps/ when it is built only for this test.
    let dir = [bin_dir.clone(), bin_dir.join("deps")]
        .into_iter()
        .find(|d| d.join("libfarmem_capi.so").is_file())
        .unwrap_or_else(|| {
            panic!(
                "libfarmem_capi.so is missing in {} and its deps/: it is built with the \
                 farmem-capi crate (cargo build --release -p farmem-capi)",
                bin_dir.display()
            )
        });
    let crate_dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let src = crate_dir.join("tests/c/capi_check.c");
    let tmp = tempfile::tempdir().unwrap();
    let exe = tmp.path().join("capi_check");
    let cc = Command::new("cc")
        .arg("-O1")
        .arg("-Wall")
        .arg("-Werror")
        .arg("-I")
        .arg(crate_dir.join("include"))
        .arg(&src)
        .arg("-o")
        .arg(&exe)
        .arg("-L")
        .arg(&dir)
        .arg("-lfarmem_capi")
        .output()
        .expect("a C compiler `cc` is needed (Debian package gcc)");
    assert!(
        cc.status.success(),
        "cc failed:\n{}",
        String::from_utf8_lossy(&cc.stderr)
    );
    let out = Command::new(&exe)
        .env("LD_LIBRARY_PATH", &dir)
        .env("FARMEM_BIN", &farmem)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "C program failed ({}):\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "capi ok");
}
