//! Secure execution: a set-user-ID, set-group-ID or file-capability program, which the kernel
//! marks with `AT_SECURE` in its auxiliary vector.
//!
//! Such a program runs with more rights than the user who started it, and its environment is
//! that user's. The dynamic loader already ignores `LD_PRELOAD` paths there, but farmem can
//! still end up inside (`/etc/ld.so.preload`, a program linked against the preload library or
//! against `libfarmem_capi`), so farmem itself must not take orders from the environment there:
//! a stats, trace or backup path would be a file written with the program's rights, `FARMEM_BIN`
//! or `PATH` a binary run with them, `TMPDIR` a folder the user controls. The preload library
//! stays inactive ([`secure_execution`]); the runtime reads no variable ([`env_var_os`], as
//! glibc's `secure_getenv`) and looks for no binary on `PATH`.

use std::ffi::OsString;
use std::path::PathBuf;

/// Whether this process runs in secure-execution mode (`getauxval(AT_SECURE) != 0`).
pub fn secure_execution() -> bool {
    crate::mm::at_secure()
}

/// The environment variable `name`, or `None` in secure execution (whatever it holds).
pub fn env_var_os(name: &str) -> Option<OsString> {
    if secure_execution() {
        return None;
    }
    std::env::var_os(name)
}

/// The folder for temporary files: `std::env::temp_dir` (`$TMPDIR`), or `/tmp` in secure
/// execution.
pub fn temp_dir() -> PathBuf {
    if secure_execution() {
        return PathBuf::from("/tmp");
    }
    std::env::temp_dir()
}
