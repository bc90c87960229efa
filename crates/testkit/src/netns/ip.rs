//! Running iproute2's `ip`: the one tool the hosts are built and broken with.

use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;

use crate::run::require_program;

/// The `ip` binary, or a test failure naming the Debian package that provides it.
pub fn ip_bin() -> &'static PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| require_program("ip", "iproute2"))
}

/// Runs `ip ARGS…` and returns its stdout, or its stderr as the error.
pub fn try_ip(args: &[&str]) -> Result<String, String> {
    let o = Command::new(ip_bin())
        .args(args)
        .output()
        .map_err(|e| format!("running {}: {e}", ip_bin().display()))?;
    if o.status.success() {
        Ok(String::from_utf8_lossy(&o.stdout).into_owned())
    } else {
        Err(format!(
            "`ip {}` failed ({}): {}",
            args.join(" "),
            o.status,
            String::from_utf8_lossy(&o.stderr).trim()
        ))
    }
}

/// Runs `ip ARGS…` and returns its stdout; a failure fails the test (network namespaces need
/// root: run the tests as root).
pub fn ip(args: &[&str]) -> String {
    try_ip(args).unwrap_or_else(|e| panic!("{e} (network namespaces need root)"))
}
