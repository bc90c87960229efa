//! Where `farmem run` finds the preload library it puts in front of a program.

use std::path::PathBuf;

use anyhow::{bail, Context};

/// File name of the preload library.
pub const PRELOAD_LIB: &str = "libfarmem_preload.so";

/// Finds libfarmem_preload.so: `$FARMEM_PRELOAD`, else next to the `farmem` binary (or in its
/// `deps/` directory, where cargo leaves it for a workspace test build).
pub fn find_preload_lib() -> anyhow::Result<PathBuf> {
    if let Some(p) = std::env::var_os("FARMEM_PRELOAD") {
        let p = PathBuf::from(p);
        if !p.is_file() {
            bail!("FARMEM_PRELOAD={} is not a file", p.display());
        }
        return Ok(p);
    }
    let exe = std::env::current_exe().context("locating the farmem binary")?;
    let dir = exe.parent().context("the farmem binary has no directory")?;
    for cand in [dir.join(PRELOAD_LIB), dir.join("deps").join(PRELOAD_LIB)] {
        if cand.is_file() {
            return Ok(cand);
        }
    }
    bail!(
        "{PRELOAD_LIB} not found next to {} (build it with `cargo build --release -p \
         farmem-preload`, or point FARMEM_PRELOAD at it)",
        exe.display()
    )
}
