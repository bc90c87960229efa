//! The C API in a set-user-ID root program started by another user (secure execution): the
//! environment is that user's, so the runtime must not run the `farmem` binary it names
//! (`FARMEM_BIN`) or find one on its `PATH` with root's rights.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
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

/// libfarmem_capi.so of this build (next to the binaries, or in deps/).
fn capi_lib() -> PathBuf {
    let bin_dir = profile_dir();
    [bin_dir.clone(), bin_dir.join("deps")]
        .into_iter()
        .map(|d| d.join("libfarmem_capi.so"))
        .find(|p| p.is_file())
        .unwrap_or_else(|| {
            panic!(
                "libfarmem_capi.so is missing in {} and its deps/: build it with cargo build \
                 --release -p farmem-capi",
                bin_dir.display()
            )
        })
}

/// Compiles `tests/c/NAME.c` into `out` with `cc` and the extra arguments `extra`.
fn compile(name: &str, out: &Path, extra: &[&str]) {
    let crate_dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let o = Command::new("cc")
        .args(["-O1", "-Wall", "-Werror", "-I"])
        .arg(crate_dir.join("include"))
        .arg(crate_dir.join("tests/c").join(format!("{name}.c")))
        .arg("-o")
        .arg(out)
        .args(extra)
        .output()
        .expect("a C compiler `cc` is needed (Debian package gcc)");
    assert!(
        o.status.success(),
        "cc {name}.c failed:\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
}

#[test]
fn a_set_user_id_program_runs_no_farmem_binary_the_user_names() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    assert_eq!(
        std::fs::metadata(dir).unwrap().uid(),
        0,
        "this test makes a set-user-ID root program: run it as root"
    );
    // User nobody must reach the program and the library it is linked against.
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::copy(capi_lib(), dir.join("libfarmem_capi.so")).unwrap();
    let prog = dir.join("capi_setuid");
    let lib_dir = dir.to_str().unwrap();
    compile(
        "capi_setuid",
        &prog,
        &[
            "-L",
            lib_dir,
            &format!("-Wl,-rpath,{lib_dir}"),
            "-lfarmem_capi",
        ],
    );
    std::fs::set_permissions(&prog, std::fs::Permissions::from_mode(0o4755)).unwrap();
    let marker = dir.join("fake-farmem-ran");
    let fake = dir.join("fake_farmem");
    compile(
        "fake_farmem",
        &fake,
        &[&format!("-DMARKER=\"{}\"", marker.display())],
    );
    // PATH too: a `farmem` there would be found without FARMEM_BIN.
    std::os::unix::fs::symlink(&fake, dir.join("farmem")).unwrap();

    // Named by FARMEM_BIN, then found on PATH.
    for farmem_bin in [Some(fake.as_path()), None] {
        let _ = std::fs::remove_file(&marker);
        let mut cmd = Command::new("setpriv");
        cmd.args(["--reuid=65534", "--regid=65534", "--clear-groups"])
            .arg(&prog)
            .env("PATH", format!("{lib_dir}:/usr/bin:/bin"))
            .env_remove("FARMEM_BIN");
        if let Some(bin) = farmem_bin {
            cmd.env("FARMEM_BIN", bin);
        }
        let o = cmd
            .output()
            .expect("setpriv is needed (Debian package util-linux)");
        let out = String::from_utf8_lossy(&o.stdout);
        let all = format!("{out}{}", String::from_utf8_lossy(&o.stderr));
        assert!(o.status.success(), "{all}");
        assert!(
            out.starts_with("euid=0 "),
            "the program must run set-user-ID root (is {} mounted nosuid?): {all}",
            dir.display()
        );
        assert!(
            !marker.exists(),
            "the user's `farmem` binary ({farmem_bin:?}, else on PATH) ran with root's rights \
             ({:?}): {all}",
            std::fs::read_to_string(&marker)
        );
        assert!(
            out.contains("fm_init=-1") && out.contains("FARMEM_BIN") && out.contains("farmem_bin"),
            "fm_init must fail saying how to name the binary: {all}"
        );
    }
}
