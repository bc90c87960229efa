//! farmem's `LD_PRELOAD` library: puts an unmodified, dynamically linked program's heap and
//! large anonymous mappings into far-memory regions paged by the farmem runtime.
//!
//! `farmem run` starts the program with this library preloaded and its settings in one
//! environment variable ([`config`]). The library's constructor reads them, removes them
//! (and itself from `LD_PRELOAD`) from the environment, starts the runtime, and from then on:
//!
//! - the malloc family (malloc, free, calloc, realloc, reallocarray, posix_memalign,
//!   aligned_alloc, memalign, valloc, pvalloc, malloc_usable_size) is served by mimalloc over
//!   the *heap span*, one reserved private anonymous range handed to mimalloc in chunks, each a
//!   region;
//! - private anonymous writable `mmap`s of at least the threshold become regions;
//! - runtime threads (marked by the runtime's thread hook) and farmem code running on a
//!   program thread allocate from glibc, never from region memory; so does `setlocale`,
//!   whose data every new thread reads as it starts.
//!
//! # Design
//!
//! The exported C symbols are one-line trampolines to `src/shim.c`, which holds every
//! decision: routing needs thread-local flags of the initial-exec TLS model (a global-dynamic
//! thread-local goes through `__tls_get_addr`, which can call malloc), and stable Rust cannot
//! ask for that model. Calls that arrive before the constructor has run (the dynamic loader's
//! and libc's own start-up) are served by glibc's exported `__libc_malloc` family; `free`,
//! `realloc` and `malloc_usable_size` route by address, so either kind of pointer can be
//! passed to them at any time. See docs/architecture.md, "Preload library".
//!
//! # Limitations
//!
//! - Statically linked programs cannot be reached by `LD_PRELOAD` (`farmem run` refuses them).
//! - `MADV_FREE` is turned into `MADV_DONTNEED` while regions are active (allowed by its
//!   semantics; the kernel would otherwise drop region pages without telling the runtime).
//! - Alignments above 32 MiB (which mimalloc's arenas cannot serve) come from glibc.
//! - A set-user-ID, set-group-ID or file-capability program (secure execution) is never
//!   under farmem: the dynamic loader ignores the library's path in `LD_PRELOAD` there, and if
//!   the library is loaded some other way (`/etc/ld.so.preload`, linked in) it stays inactive
//!   and reads no `FARMEM_*` variable, with one warning on stderr.

// The unit-test binary has no constructor (it must keep its own malloc), so the start-up path
// is unused there.
#![cfg_attr(test, allow(dead_code))]

pub mod config;
mod exports;
mod fdguard;
mod glue;
mod tree;
pub mod unmanaged;

use std::ffi::{c_int, c_void};
use std::sync::OnceLock;

use config::RunSettings;
use farmem_runtime::ForkAdvice;
// The allocator: shim.c calls mimalloc, whose static library this crate dependency links in.
use libmimalloc_sys as _;

/// Exit status of a program whose farmem start-up failed inside the library.
pub const EXIT_PRELOAD_FAILED: c_int = 125;

/// Counters the shim keeps (mirrors `struct fmp_counters` in shim.c).
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct ShimCounters {
    /// Bytes of the heap span handed to the allocator (each chunk a region).
    pub heap_bytes: u64,
    /// Program mappings made regions by the mmap interposition.
    pub mmap_regions: u64,
    /// Their total length.
    pub mmap_region_bytes: u64,
    /// Mappings the runtime refused to adopt (left as ordinary memory).
    pub register_failures: u64,
    /// `MADV_FREE` calls turned into `MADV_DONTNEED`.
    pub madv_free_converted: u64,
    /// Of the mapping regions, reservations (`PROT_NONE` when mapped).
    pub reservations: u64,
    /// Of the mapping regions, `mmap(MAP_FIXED)` replacing part of a region, registered again.
    pub fixed_reregistered: u64,
}

impl From<ShimCounters> for farmem_contract::PreloadCounters {
    fn from(c: ShimCounters) -> Self {
        farmem_contract::PreloadCounters {
            heap_bytes: c.heap_bytes,
            mmap_regions: c.mmap_regions,
            mmap_region_bytes: c.mmap_region_bytes,
            register_failures: c.register_failures,
            madv_free_converted: c.madv_free_converted,
            reservations: c.reservations,
            fixed_reregistered: c.fixed_reregistered,
        }
    }
}

pub(crate) mod shim {
    //! Declarations of `src/shim.c`.
    use std::ffi::c_int;

    extern "C" {
        pub fn fmp_internal_enter();
        pub fn fmp_internal_leave();
        pub fn fmp_mark_runtime_thread();
        pub fn fmp_heap_init(reserve_bytes: usize, first_chunk_bytes: usize) -> c_int;
        pub fn fmp_heap_set_ready();
        pub fn fmp_set_mmap_threshold(bytes: usize);
        pub fn fmp_set_regions_active(on: c_int);
        pub fn fmp_heap_bounds(lo: *mut usize, span: *mut usize);
        pub fn fmp_counters(out: *mut super::ShimCounters);
        pub fn fmp_resolve_symbols();
        pub fn fmp_uses_glibc() -> c_int;
    }
}

/// Runs `f` as farmem code: whatever it allocates on this thread comes from glibc.
pub(crate) fn internal<R>(f: impl FnOnce() -> R) -> R {
    struct Leave;
    impl Drop for Leave {
        fn drop(&mut self) {
            // SAFETY: fmp_internal_leave only decrements this thread's initial-exec counter,
            // balanced with the enter below.
            unsafe { shim::fmp_internal_leave() }
        }
    }
    // SAFETY: fmp_internal_enter only increments this thread's initial-exec counter.
    unsafe { shim::fmp_internal_enter() };
    let _leave = Leave;
    f()
}

/// Marks the calling thread as a runtime thread for good: it allocates from glibc only.
pub fn mark_runtime_thread() {
    farmem_runtime::signals::block_all();
    // SAFETY: sets this thread's initial-exec flag; no other effect.
    unsafe { shim::fmp_mark_runtime_thread() }
}

/// The shim's counters.
pub fn shim_counters() -> ShimCounters {
    let mut c = ShimCounters::default();
    // SAFETY: `c` is a valid, writable repr(C) struct matching `struct fmp_counters`.
    unsafe { shim::fmp_counters(&mut c) };
    c
}

/// The heap span `[lo, lo + span)` (both 0 before the heap exists).
pub fn heap_bounds() -> (usize, usize) {
    let (mut lo, mut span) = (0usize, 0usize);
    // SAFETY: both pointers are valid and writable; the shim only stores two words.
    unsafe { shim::fmp_heap_bounds(&mut lo, &mut span) };
    (lo, span)
}

static CONFIG: OnceLock<RunSettings> = OnceLock::new();

/// The configuration the library started with (None when it is inactive).
pub(crate) fn active_config() -> Option<&'static RunSettings> {
    CONFIG.get()
}

/// Prints a farmem error on stderr and ends the process without running the program further.
pub(crate) fn fatal(msg: &str) -> ! {
    eprintln!("farmem: error: {msg}");
    // SAFETY: _exit ends the process; no invariant to uphold.
    unsafe { libc::_exit(EXIT_PRELOAD_FAILED) }
}

/// Runtime logs go to the program's stderr; `FARMEM_LOG` sets the filter (default `warn`).
fn init_logging() {
    use tracing_subscriber::EnvFilter;
    let filter = std::env::var("FARMEM_LOG").unwrap_or_else(|_| "warn".to_string());
    let _ = tracing_subscriber::fmt()
        .with_env_filter(EnvFilter::new(filter))
        .with_writer(std::io::stderr)
        // Colour codes only on a terminal: a log file or a pipe gets plain text.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_target(false)
        .try_init();
}

/// The constructor: runs before the program's own constructors and `main`.
extern "C" fn init() {
    // The threads the start-up spawns block every signal from their creation on.
    let _blocked = farmem_runtime::signals::Blocked::new();
    internal(|| {
        // SAFETY: resolves glibc symbols with dlsym while this thread allocates from glibc.
        unsafe { shim::fmp_resolve_symbols() };
        if farmem_runtime::secure::secure_execution() {
            // The environment is the user's, the rights are the program's: settings taken
            // from it would be files written and binaries run with those rights.
            eprintln!(
                "farmem: warning: this program runs set-user-ID, set-group-ID or with file \
                 capabilities (secure execution): libfarmem_preload.so stays inactive and \
                 ignores every FARMEM_* variable"
            );
            return;
        }
        let cfg = match config::take_from_env() {
            Ok(Some(cfg)) => cfg,
            Ok(None) => {
                eprintln!(
                    "farmem: libfarmem_preload.so was preloaded without `farmem run`; it stays \
                     inactive (start the program with `farmem run --local-mem SIZE -- ...`)"
                );
                return;
            }
            Err(e) => fatal(&e.to_string()),
        };
        let cfg = CONFIG.get_or_init(|| cfg);
        init_logging();
        if let Err(e) = glue::start(cfg) {
            fatal(&e);
        }
        let first_chunk = (cfg.local_mem_bytes / 2).clamp(64 << 20, 1 << 30);
        // SAFETY: called once, from the constructor, before the heap is marked ready; the
        // shim reserves a fresh span and registers its first chunk through glue::register.
        let err =
            unsafe { shim::fmp_heap_init(cfg.heap_reserve_bytes as usize, first_chunk as usize) };
        if err != 0 {
            fatal(&format!(
                "could not set up the program's heap ({}); lower --heap-reserve \
                 or check `ulimit -v`",
                std::io::Error::from_raw_os_error(err)
            ));
        }
        // SAFETY: plain stores of configuration words in the shim.
        unsafe {
            shim::fmp_set_mmap_threshold(cfg.mmap_threshold_bytes as usize);
            shim::fmp_set_regions_active(1);
            shim::fmp_heap_set_ready();
        }
        glue::after_heap_ready(cfg);
    });
}

/// Placed in `.init_array`, so the dynamic loader runs it when the library is loaded.
#[cfg(not(test))]
#[used]
#[link_section = ".init_array"]
static INIT: extern "C" fn() = init;

/// Region registration, called by the shim for each heap chunk and each adopted mapping,
/// with the calling thread already allocating from glibc. Returns 0 or an errno.
#[no_mangle]
extern "C" fn farmem_preload_register_region(
    addr: *mut c_void,
    len: usize,
    is_heap: c_int,
) -> c_int {
    glue::register(addr.cast(), len, is_heap != 0)
}

/// Called by the shim, with the internal depth raised, after a successful `madvise` with
/// `MADV_DONTFORK`, `MADV_DOFORK`, `MADV_WIPEONFORK` or `MADV_KEEPONFORK` (`advice`).
#[no_mangle]
extern "C" fn farmem_preload_fork_advice(addr: *mut c_void, len: usize, advice: c_int) {
    let advice = match advice {
        libc::MADV_DONTFORK => ForkAdvice::DontFork,
        libc::MADV_DOFORK => ForkAdvice::DoFork,
        libc::MADV_WIPEONFORK => ForkAdvice::WipeOnFork,
        libc::MADV_KEEPONFORK => ForkAdvice::KeepOnFork,
        _ => return, // the shim passes only these four
    };
    glue::set_fork_advice(addr.cast(), len, advice);
}

/// Called by the shim, with the internal depth raised, before a `mmap(MAP_FIXED)` of private
/// anonymous memory: 1 if the range overlaps a region, else 0.
#[no_mangle]
extern "C" fn farmem_preload_overlaps_region(addr: *mut c_void, len: usize) -> c_int {
    c_int::from(glue::overlaps_region(addr.cast(), len))
}

#[cfg(test)]
mod tests {
    use super::*;

    extern "C" {
        fn fmp_uses_glibc() -> c_int;
        fn fmp_malloc(size: usize) -> *mut c_void;
        fn fmp_free(ptr: *mut c_void);
    }

    #[test]
    fn internal_scope_routes_to_glibc_and_nests() {
        // In the unit-test binary the heap is never made ready, so the shim uses glibc
        // everywhere; what we check here is that the scope counter nests and unwinds.
        internal(|| {
            internal(|| {
                // SAFETY: reads this thread's flags only.
                assert_eq!(unsafe { fmp_uses_glibc() }, 1);
            });
        });
        let (lo, span) = heap_bounds();
        assert_eq!((lo, span), (0, 0));
        // SAFETY: fmp_malloc/fmp_free pair on a fresh pointer; glibc serves both here.
        unsafe {
            let p = fmp_malloc(100);
            assert!(!p.is_null());
            fmp_free(p);
        }
    }
}
