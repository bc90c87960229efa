//! The C symbols the program's calls bind to: one-line trampolines into `shim.c`.
//!
//! Left out of the unit-test binary, where they would replace that binary's own malloc.
#![cfg(not(test))]

use std::ffi::{c_char, c_int, c_uint, c_void};

use libc::{off_t, pthread_attr_t, pthread_t, size_t};

extern "C" {
    fn fmp_malloc(size: size_t) -> *mut c_void;
    fn fmp_free(ptr: *mut c_void);
    fn fmp_calloc(n: size_t, size: size_t) -> *mut c_void;
    fn fmp_realloc(ptr: *mut c_void, size: size_t) -> *mut c_void;
    fn fmp_reallocarray(ptr: *mut c_void, n: size_t, size: size_t) -> *mut c_void;
    fn fmp_posix_memalign(out: *mut *mut c_void, align: size_t, size: size_t) -> c_int;
    fn fmp_aligned_alloc(align: size_t, size: size_t) -> *mut c_void;
    fn fmp_memalign(align: size_t, size: size_t) -> *mut c_void;
    fn fmp_valloc(size: size_t) -> *mut c_void;
    fn fmp_pvalloc(size: size_t) -> *mut c_void;
    fn fmp_malloc_usable_size(ptr: *mut c_void) -> size_t;
    fn fmp_mmap(
        addr: *mut c_void,
        len: size_t,
        prot: c_int,
        flags: c_int,
        fd: c_int,
        off: off_t,
    ) -> *mut c_void;
    fn fmp_munmap(addr: *mut c_void, len: size_t) -> c_int;
    fn fmp_mremap(
        old: *mut c_void,
        old_len: size_t,
        new_len: size_t,
        flags: c_int,
        new_addr: *mut c_void,
    ) -> *mut c_void;
    fn fmp_madvise(addr: *mut c_void, len: size_t, advice: c_int) -> c_int;
    fn fmp_pthread_create(
        t: *mut pthread_t,
        attr: *const pthread_attr_t,
        start: extern "C" fn(*mut c_void) -> *mut c_void,
        arg: *mut c_void,
    ) -> c_int;
    fn fmp_setlocale(category: c_int, locale: *const c_char) -> *mut c_char;
}

// SAFETY (for every trampoline below): each forwards its arguments unchanged to the shim
// function of the same contract, which implements the documented C semantics of the symbol;
// the caller's obligations are those of the C function it called.

/// malloc(3).
#[no_mangle]
pub unsafe extern "C" fn malloc(size: size_t) -> *mut c_void {
    // SAFETY: see the module comment above.
    unsafe { fmp_malloc(size) }
}

/// free(3); preserves errno.
#[no_mangle]
pub unsafe extern "C" fn free(ptr: *mut c_void) {
    // SAFETY: see the module comment above.
    unsafe { fmp_free(ptr) }
}

/// calloc(3).
#[no_mangle]
pub unsafe extern "C" fn calloc(n: size_t, size: size_t) -> *mut c_void {
    // SAFETY: see the module comment above.
    unsafe { fmp_calloc(n, size) }
}

/// realloc(3), with glibc's `realloc(p, 0)` = free.
#[no_mangle]
pub unsafe extern "C" fn realloc(ptr: *mut c_void, size: size_t) -> *mut c_void {
    // SAFETY: see the module comment above.
    unsafe { fmp_realloc(ptr, size) }
}

/// reallocarray(3).
#[no_mangle]
pub unsafe extern "C" fn reallocarray(ptr: *mut c_void, n: size_t, size: size_t) -> *mut c_void {
    // SAFETY: see the module comment above.
    unsafe { fmp_reallocarray(ptr, n, size) }
}

/// posix_memalign(3).
#[no_mangle]
pub unsafe extern "C" fn posix_memalign(
    out: *mut *mut c_void,
    align: size_t,
    size: size_t,
) -> c_int {
    // SAFETY: see the module comment above.
    unsafe { fmp_posix_memalign(out, align, size) }
}

/// aligned_alloc(3).
#[no_mangle]
pub unsafe extern "C" fn aligned_alloc(align: size_t, size: size_t) -> *mut c_void {
    // SAFETY: see the module comment above.
    unsafe { fmp_aligned_alloc(align, size) }
}

/// memalign(3).
#[no_mangle]
pub unsafe extern "C" fn memalign(align: size_t, size: size_t) -> *mut c_void {
    // SAFETY: see the module comment above.
    unsafe { fmp_memalign(align, size) }
}

/// valloc(3).
#[no_mangle]
pub unsafe extern "C" fn valloc(size: size_t) -> *mut c_void {
    // SAFETY: see the module comment above.
    unsafe { fmp_valloc(size) }
}

/// pvalloc(3).
#[no_mangle]
pub unsafe extern "C" fn pvalloc(size: size_t) -> *mut c_void {
    // SAFETY: see the module comment above.
    unsafe { fmp_pvalloc(size) }
}

/// malloc_usable_size(3).
#[no_mangle]
pub unsafe extern "C" fn malloc_usable_size(ptr: *mut c_void) -> size_t {
    // SAFETY: see the module comment above.
    unsafe { fmp_malloc_usable_size(ptr) }
}

/// mmap(2): private anonymous writable mappings at or above the threshold become regions.
#[no_mangle]
pub unsafe extern "C" fn mmap(
    addr: *mut c_void,
    len: size_t,
    prot: c_int,
    flags: c_int,
    fd: c_int,
    off: off_t,
) -> *mut c_void {
    // SAFETY: see the module comment above.
    unsafe { fmp_mmap(addr, len, prot, flags, fd, off) }
}

/// mmap64: the same function on 64-bit Linux (what `_FILE_OFFSET_BITS=64` builds call).
#[no_mangle]
pub unsafe extern "C" fn mmap64(
    addr: *mut c_void,
    len: size_t,
    prot: c_int,
    flags: c_int,
    fd: c_int,
    off: off_t,
) -> *mut c_void {
    // SAFETY: see the module comment above.
    unsafe { fmp_mmap(addr, len, prot, flags, fd, off) }
}

/// _exit(2): the process's final statistics first (`_exit` skips `atexit` handlers), then
/// the process ends as `_exit` ends it (exit_group). glibc's own `exit` reaches the kernel
/// through its internal `_exit`, not this one.
#[no_mangle]
pub unsafe extern "C" fn _exit(status: c_int) -> ! {
    crate::glue::before_exit();
    // SAFETY: exit_group ends every thread of the process; it does not return.
    unsafe { libc::syscall(libc::SYS_exit_group, libc::c_long::from(status)) };
    unreachable!("exit_group returned")
}

/// _Exit(2): as [`_exit`] (glibc exports both names).
#[no_mangle]
pub unsafe extern "C" fn _Exit(status: c_int) -> ! {
    // SAFETY: as `_exit`.
    unsafe { _exit(status) }
}

/// munmap(2), forwarded (the runtime learns of it through userfaultfd events).
#[no_mangle]
pub unsafe extern "C" fn munmap(addr: *mut c_void, len: size_t) -> c_int {
    // SAFETY: see the module comment above.
    unsafe { fmp_munmap(addr, len) }
}

/// mremap(2), forwarded. C declares it variadic (`new_address` only with MREMAP_FIXED); on
/// the SysV x86-64 and AAPCS64 (Linux) ABIs a variadic pointer argument travels in the same
/// register as a named fifth argument, so reading it as one is exact, and the value is only
/// used by the kernel when the caller passed MREMAP_FIXED (and so the argument).
#[no_mangle]
pub unsafe extern "C" fn mremap(
    old: *mut c_void,
    old_len: size_t,
    new_len: size_t,
    flags: c_int,
    new_addr: *mut c_void,
) -> *mut c_void {
    // SAFETY: see the module comment above and the ABI note in this function's docs.
    unsafe { fmp_mremap(old, old_len, new_len, flags, new_addr) }
}

/// madvise(2), forwarded (MADV_FREE becomes MADV_DONTNEED while regions are active).
#[no_mangle]
pub unsafe extern "C" fn madvise(addr: *mut c_void, len: size_t, advice: c_int) -> c_int {
    // SAFETY: see the module comment above.
    unsafe { fmp_madvise(addr, len, advice) }
}

/// pthread_create(3): glibc's, called so that the new thread's DTV comes from glibc.
#[no_mangle]
pub unsafe extern "C" fn pthread_create(
    t: *mut pthread_t,
    attr: *const pthread_attr_t,
    start: extern "C" fn(*mut c_void) -> *mut c_void,
    arg: *mut c_void,
) -> c_int {
    // SAFETY: see the module comment above.
    unsafe { fmp_pthread_create(t, attr, start, arg) }
}

/// setlocale(3): glibc's, its locale data allocated from glibc (every new thread reads it
/// before it runs, so it must never be paged out).
#[no_mangle]
pub unsafe extern "C" fn setlocale(category: c_int, locale: *const c_char) -> *mut c_char {
    // SAFETY: see the module comment above.
    unsafe { fmp_setlocale(category, locale) }
}

/// close(2). A descriptor of farmem's that the program closes stays open and the call
/// succeeds ([`crate::fdguard`]).
#[no_mangle]
pub unsafe extern "C" fn close(fd: c_int) -> c_int {
    match crate::fdguard::close(fd) {
        crate::fdguard::Close::Keep => 0,
        // SAFETY: close(2) of a number; the caller owns it (or farmem closes its own).
        crate::fdguard::Close::Close => unsafe { libc::syscall(libc::SYS_close, fd) as c_int },
    }
}

/// close_range(2): the range but farmem's descriptors ([`crate::fdguard`]). With
/// CLOSE_RANGE_CLOEXEC nothing closes now, and farmem's are close-on-exec already.
#[no_mangle]
pub unsafe extern "C" fn close_range(first: c_uint, last: c_uint, flags: c_int) -> c_int {
    if flags as c_uint & libc::CLOSE_RANGE_CLOEXEC != 0 {
        // SAFETY: close_range(2) takes three integers.
        return unsafe { close_range_syscall(first, last, flags) };
    }
    if first > last {
        // SAFETY: as above (the kernel answers EINVAL).
        return unsafe { close_range_syscall(first, last, flags) };
    }
    // close_range fails only for bad flags, the same for every sub-range: the first failure
    // is the answer.
    let (ranges, n) = crate::fdguard::ranges_to_close(first, last);
    for &(a, b) in &ranges[..n] {
        // SAFETY: as above; each sub-range is the caller's to close.
        let rc = unsafe { close_range_syscall(a, b, flags) };
        if rc != 0 {
            return rc;
        }
    }
    0
}

/// closefrom(3): as `close_range(lowfd, ~0U, 0)` ([`crate::fdguard`]). glibc's own reaches
/// the system call internally, past [`close_range`].
#[no_mangle]
pub unsafe extern "C" fn closefrom(lowfd: c_int) {
    // SAFETY: as close_range.
    unsafe { close_range(lowfd.max(0) as c_uint, c_uint::MAX, 0) };
}

/// dup2(2): fails with EBUSY when `new` is farmem's descriptor ([`crate::fdguard`]).
#[no_mangle]
pub unsafe extern "C" fn dup2(old: c_int, new: c_int) -> c_int {
    if old != new && !crate::fdguard::may_replace(new) {
        set_errno(libc::EBUSY);
        return -1;
    }
    // SAFETY: dup2(2) takes two integers.
    unsafe { libc::syscall(libc::SYS_dup2, old, new) as c_int }
}

/// dup3(2): as [`dup2`].
#[no_mangle]
pub unsafe extern "C" fn dup3(old: c_int, new: c_int, flags: c_int) -> c_int {
    if old != new && !crate::fdguard::may_replace(new) {
        set_errno(libc::EBUSY);
        return -1;
    }
    // SAFETY: dup3(2) takes three integers.
    unsafe { libc::syscall(libc::SYS_dup3, old, new, flags) as c_int }
}

/// # Safety
/// close_range(2) with the caller's arguments.
unsafe fn close_range_syscall(first: c_uint, last: c_uint, flags: c_int) -> c_int {
    // SAFETY: close_range(2) takes three integers; see the caller.
    unsafe { libc::syscall(libc::SYS_close_range, first, last, flags) as c_int }
}

fn set_errno(e: c_int) {
    // SAFETY: __errno_location returns this thread's errno, always valid.
    unsafe { *libc::__errno_location() = e };
}

/// mlockall(2): skipped (success) while farmem manages the process's memory
/// ([`crate::glue::skip_lock`]).
#[no_mangle]
pub unsafe extern "C" fn mlockall(flags: c_int) -> c_int {
    if crate::glue::skip_lock(None) {
        return 0;
    }
    // SAFETY: mlockall(2) takes flags only.
    unsafe { libc::syscall(libc::SYS_mlockall, flags) as c_int }
}

/// mlock(2): skipped (success) over memory farmem manages ([`crate::glue::skip_lock`]).
#[no_mangle]
pub unsafe extern "C" fn mlock(addr: *const c_void, len: size_t) -> c_int {
    if crate::glue::skip_lock(Some((addr.cast_mut().cast(), len))) {
        return 0;
    }
    // SAFETY: mlock(2) of the caller's range; the kernel checks it.
    unsafe { libc::syscall(libc::SYS_mlock, addr, len) as c_int }
}

/// mlock2(2): as [`mlock`].
#[no_mangle]
pub unsafe extern "C" fn mlock2(addr: *const c_void, len: size_t, flags: c_uint) -> c_int {
    if crate::glue::skip_lock(Some((addr.cast_mut().cast(), len))) {
        return 0;
    }
    // SAFETY: mlock2(2) of the caller's range; the kernel checks it.
    unsafe { libc::syscall(libc::SYS_mlock2, addr, len, flags) as c_int }
}
