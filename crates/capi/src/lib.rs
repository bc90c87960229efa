//! farmem-capi: the C API (`include/farmem.h` in this crate), built as libfarmem_capi.so and
//! libfarmem_capi.a, for programs that opt in to far memory explicitly.
//!
//! `fm_init` starts one process-wide runtime; `fm_alloc` maps a new region (page-granular:
//! each allocation is its own region, meant for large buffers); `fm_free` unmaps it;
//! `fm_stats` writes the counters as JSON; `fm_last_error` tells why the last call failed.
//! Every function is thread-safe. Errors are reported by return value, never by aborting.

use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_long, c_void, CStr, CString};
use std::sync::{Arc, OnceLock};

use std::sync::{Mutex, MutexGuard, PoisonError};

use farmem_runtime::{Region, Runtime, RuntimeConfig};

struct Global {
    rt: Option<Arc<Runtime>>,
    regions: HashMap<usize, Region>,
    last_error: CString,
}

/// The library's state, locked. A std lock, not parking_lot's: parking_lot parks threads in a
/// process-wide table that a fork can copy half-updated (see the runtime's `sync` module).
/// A panic under the lock does not make the library unusable.
fn global() -> MutexGuard<'static, Global> {
    static G: OnceLock<Mutex<Global>> = OnceLock::new();
    G.get_or_init(|| {
        Mutex::new(Global {
            rt: None,
            regions: HashMap::new(),
            last_error: CString::default(),
        })
    })
    .lock()
    .unwrap_or_else(PoisonError::into_inner)
}

fn set_error(g: &mut Global, msg: String) {
    let mut full = msg;
    full.retain(|c| c != '\0');
    g.last_error = CString::new(full).unwrap_or_default();
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

/// Starts the runtime with a budget and a comma-separated donor list (NULL or "" starts the
/// embedded donor). Returns 0, or -1 with `fm_last_error` set. A second call fails.
///
/// # Safety
///
/// `donors` is NULL or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn fm_init(budget_bytes: u64, donors: *const c_char) -> c_int {
    let mut g = global();
    if g.rt.is_some() {
        set_error(&mut g, "fm_init: the runtime is already started".into());
        return -1;
    }
    let donors: Vec<String> = if donors.is_null() {
        Vec::new()
    } else {
        // SAFETY: the caller promises a NUL-terminated string.
        let s = unsafe { CStr::from_ptr(donors) }.to_string_lossy();
        s.split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(String::from)
            .collect()
    };
    let cfg = RuntimeConfig {
        budget_bytes,
        donors,
        ..RuntimeConfig::default()
    };
    match Runtime::start(cfg) {
        Ok(rt) => {
            g.rt = Some(rt);
            0
        }
        Err(e) => {
            set_error(&mut g, format!("fm_init: {}", error_chain(&e)));
            -1
        }
    }
}

/// Allocates a new region of at least `bytes` (page-aligned, zero-filled). NULL on error.
#[no_mangle]
pub extern "C" fn fm_alloc(bytes: usize) -> *mut c_void {
    let mut g = global();
    let Some(rt) = g.rt.clone() else {
        set_error(&mut g, "fm_alloc: call fm_init first".into());
        return std::ptr::null_mut();
    };
    match rt.map(bytes) {
        Ok(r) => {
            let p = r.as_ptr();
            g.regions.insert(p as usize, r);
            p.cast()
        }
        Err(e) => {
            set_error(&mut g, format!("fm_alloc({bytes}): {}", error_chain(&e)));
            std::ptr::null_mut()
        }
    }
}

/// Frees a region returned by `fm_alloc`. Returns 0, or -1 if `ptr` is not one.
#[no_mangle]
pub extern "C" fn fm_free(ptr: *mut c_void) -> c_int {
    let mut g = global();
    match g.regions.remove(&(ptr as usize)) {
        Some(r) => {
            drop(g);
            drop(r);
            0
        }
        None => {
            set_error(
                &mut g,
                format!("fm_free({ptr:p}): not a pointer from fm_alloc"),
            );
            -1
        }
    }
}

/// Writes the counters as a NUL-terminated JSON object into `buf` (`len` bytes). Returns the
/// JSON length (without NUL); if that is >= `len`, the output was truncated. -1 on error.
///
/// # Safety
///
/// `buf` is NULL (with `len` 0) or points to `len` writable bytes.
#[no_mangle]
pub unsafe extern "C" fn fm_stats(buf: *mut c_char, len: usize) -> c_long {
    let mut g = global();
    let Some(rt) = g.rt.clone() else {
        set_error(&mut g, "fm_stats: call fm_init first".into());
        return -1;
    };
    drop(g);
    let json = match serde_json::to_string(&rt.stats()) {
        Ok(j) => j,
        Err(e) => {
            set_error(&mut global(), format!("fm_stats: {e}"));
            return -1;
        }
    };
    if !buf.is_null() && len > 0 {
        let n = json.len().min(len - 1);
        // SAFETY: the caller gives `len` writable bytes at `buf`; we write n + 1 <= len.
        unsafe {
            std::ptr::copy_nonoverlapping(json.as_ptr(), buf.cast::<u8>(), n);
            *buf.add(n) = 0;
        }
    }
    json.len() as c_long
}

/// The message of the last failed call (empty if none). Valid until the next failing call.
#[no_mangle]
pub extern "C" fn fm_last_error() -> *const c_char {
    global().last_error.as_ptr()
}
