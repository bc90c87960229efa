//! The C API: a C program built with `cc` against include/farmem.h and libfarmem_runtime.so,
//! run with the embedded donor (the farmem binary under test).

use std::path::PathBuf;
use std::process::Command;

#[test]
fn c_program_uses_the_c_api() {
    let farmem = PathBuf::from(env!("CARGO_BIN_EXE_farmem"));
    // The runtime's cdylib sits next to the binary when farmem-runtime is built as a workspace
    // member, in deps/ when it is built only as farmem's dependency.
    let bin_dir = farmem.parent().unwrap().to_path_buf();
    let dir = [bin_dir.clone(), bin_dir.join("deps")]
        .into_iter()
        .find(|d| d.join("libfarmem_runtime.so").is_file())
        .unwrap_or_else(|| {
            panic!(
                "libfarmem_runtime.so is missing in {} and its deps/: it is built with the \
                 farmem-runtime crate (cargo build -p farmem-runtime)",
                bin_dir.display()
            )
        });
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let src = root.join("crates/runtime/tests/c/capi_check.c");
    let tmp = tempfile::tempdir().unwrap();
    let exe = tmp.path().join("capi_check");
    let cc = Command::new("cc")
        .arg("-O1")
        .arg("-Wall")
        .arg("-Werror")
        .arg("-I")
        .arg(root.join("include"))
        .arg(&src)
        .arg("-o")
        .arg(&exe)
        .arg("-L")
        .arg(&dir)
        .arg("-lfarmem_runtime")
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
