//! The link between the library and the farmem runtime: start-up, region registration,
//! fork handlers and the stats file.
//!
//! Phase A (no runtime yet): regions are plain memory and registration always succeeds.

use std::ffi::c_int;

use crate::config::Config;

/// Starts the runtime described by `cfg`. Runs in the constructor, on a thread that
/// allocates from glibc.
pub(crate) fn start(_cfg: &Config) -> Result<(), String> {
    Ok(())
}

/// Called once the heap is ready: fork handlers, the stats writer.
pub(crate) fn after_heap_ready(_cfg: &Config) {}

/// Makes `[addr, addr + len)` a region. Returns 0 or an errno.
pub(crate) fn register(_addr: *mut u8, _len: usize, _is_heap: bool) -> c_int {
    0
}
