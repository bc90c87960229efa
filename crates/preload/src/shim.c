/*
 * farmem preload shim: the malloc family, the per-thread routing flags and the mmap
 * interposition of an unmodified program.
 *
 * Why C: the routing flags must be thread-locals of the *initial-exec* TLS model. A
 * global-dynamic thread-local (what rustc emits in a cdylib) is reached through
 * __tls_get_addr, which may itself call malloc (to grow a thread's DTV after a dlopen) and
 * would recurse into us. GCC's tls_model attribute gives us initial-exec on stable tooling.
 * The exported symbols themselves are one-line Rust trampolines in lib.rs (a cdylib only
 * exports Rust items); every decision is made here.
 *
 * Routing (see docs/architecture.md, "Preload library"):
 *   - until the heap is ready (before our constructor ran), on runtime threads, and while a
 *     thread is inside farmem code (internal depth > 0): glibc (__libc_malloc & co.);
 *   - otherwise: mimalloc, whose only memory is the heap span, a reserved private anonymous
 *     range that grows in chunks, each registered as a far-memory region.
 *   - free / realloc / malloc_usable_size route by address: inside the heap span -> mimalloc,
 *     anything else -> glibc.
 */
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "mimalloc.h"

/* glibc's own allocator, exported for exactly this purpose (a replacement malloc that wants
 * to fall back on it). Calling these never re-enters our malloc. */
extern void *__libc_malloc(size_t size);
extern void *__libc_calloc(size_t n, size_t size);
extern void *__libc_realloc(void *ptr, size_t size);
extern void __libc_free(void *ptr);
extern void *__libc_memalign(size_t align, size_t size);

/* Implemented in Rust (lib.rs): makes [addr, addr+len) a far-memory region. Called with the
 * internal depth raised, so whatever it allocates comes from glibc. Returns 0 or an errno. */
extern int farmem_preload_register_region(void *addr, size_t len, int is_heap);
/* Implemented in Rust (lib.rs): 1 if [addr, addr+len) overlaps a region, else 0. */
extern int farmem_preload_overlaps_region(void *addr, size_t len);
/* Implemented in Rust (lib.rs): the program gave [addr, addr+len) the fork advice `advice`
 * (MADV_DONTFORK, MADV_DOFORK, MADV_WIPEONFORK or MADV_KEEPONFORK). */
extern void farmem_preload_fork_advice(void *addr, size_t len, int advice);

#define FM_HIDDEN __attribute__((visibility("hidden")))

/* Calls into the runtime with every signal of this thread blocked. The runtime holds its state
 * lock while it registers a region (or looks regions up), and a signal delivered meanwhile may
 * have its frame written to managed memory (Go's signal stacks live on its heap): that write
 * faults into the fault thread, which waits for the lock this thread holds. Seen: a cgo Go program hung under `farmem run`, its
 * thread in `fmp_mmap` -> register, its kernel stack in `x64_setup_rt_frame` ->
 * `handle_userfault`, the fault thread waiting for the state lock. Blocked signals are
 * delivered once the mask is restored. */
static sigset_t fm_block_signals(void) {
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, &old);
    return old;
}

static void fm_restore_signals(const sigset_t *old) { pthread_sigmask(SIG_SETMASK, old, NULL); }

static int fm_register_region(void *addr, size_t len, int is_heap) {
    sigset_t old = fm_block_signals();
    int err = farmem_preload_register_region(addr, len, is_heap);
    fm_restore_signals(&old);
    return err;
}
#define FM_TLS __thread __attribute__((tls_model("initial-exec")))
#define likely(x) __builtin_expect(!!(x), 1)
#define unlikely(x) __builtin_expect(!!(x), 0)

#define FM_PAGE 4096UL
#define FM_HEAP_ALIGN (64UL << 20) /* multiple of mimalloc's 32 MiB arena block */
#define FM_MIN_CHUNK (64UL << 20)
#define FM_MAX_CHUNK (4UL << 30)

/* ---- per-thread routing state (initial-exec TLS: never calls malloc) ---- */
static FM_TLS unsigned fmp_internal_depth;
static FM_TLS unsigned char fmp_runtime_thread;

/* ---- heap span ---- */
static uintptr_t heap_lo;      /* reserved span, fixed once heap_ready is set */
static uintptr_t heap_span;    /* bytes */
static uintptr_t heap_end;     /* end of the chunks handed to mimalloc (under grow_lock) */
static size_t next_chunk;      /* size of the next chunk (under grow_lock) */
static _Atomic int heap_ready;
static pthread_mutex_t grow_lock = PTHREAD_MUTEX_INITIALIZER;

/* ---- mmap interposition state ---- */
static _Atomic int regions_active;
static _Atomic size_t mmap_threshold = 1UL << 20;

/* ---- counters (read by the stats writer) ---- */
static _Atomic uint64_t ctr_heap_bytes;
static _Atomic uint64_t ctr_mmap_regions;
static _Atomic uint64_t ctr_mmap_region_bytes;
static _Atomic uint64_t ctr_register_failures;
static _Atomic uint64_t ctr_madv_free_converted;
static _Atomic uint64_t ctr_reservations;
static _Atomic uint64_t ctr_fixed_reregistered;

/* ---- lazily resolved glibc symbols ---- */
typedef size_t (*usable_fn)(void *);
typedef int (*pthread_create_fn)(pthread_t *, const pthread_attr_t *, void *(*)(void *), void *);
typedef char *(*setlocale_fn)(int, const char *);
static _Atomic(usable_fn) real_usable;
static _Atomic(pthread_create_fn) real_pthread_create;
static _Atomic(setlocale_fn) real_setlocale;

FM_HIDDEN void fmp_internal_enter(void) { fmp_internal_depth++; }
FM_HIDDEN void fmp_internal_leave(void) { fmp_internal_depth--; }
FM_HIDDEN void fmp_mark_runtime_thread(void) { fmp_runtime_thread = 1; }
FM_HIDDEN int fmp_uses_glibc(void) {
    return !atomic_load_explicit(&heap_ready, memory_order_acquire) || fmp_internal_depth ||
           fmp_runtime_thread;
}

static inline int use_glibc(void) {
    return unlikely(!atomic_load_explicit(&heap_ready, memory_order_relaxed) ||
                    fmp_internal_depth != 0 || fmp_runtime_thread != 0);
}

static inline int in_heap(const void *p) { return (uintptr_t)p - heap_lo < heap_span; }

static void *resolve(const char *name) {
    fmp_internal_depth++;
    void *f = dlsym(RTLD_NEXT, name);
    fmp_internal_depth--;
    return f;
}

static size_t glibc_usable_size(void *p) {
    usable_fn f = atomic_load_explicit(&real_usable, memory_order_acquire);
    if (unlikely(f == NULL)) {
        f = (usable_fn)resolve("malloc_usable_size");
        if (f == NULL) return 0;
        atomic_store_explicit(&real_usable, f, memory_order_release);
    }
    return f(p);
}

/* ------------------------------------------------------------------------------------- */
/* heap                                                                                   */

static size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }

/* Hands mimalloc one more chunk of the span, of at least `need` bytes. Caller holds
 * grow_lock. Returns 0 or an errno. */
static int grow_locked(size_t need) {
    size_t len = next_chunk;
    if (len < need) len = round_up(need + FM_HEAP_ALIGN, FM_HEAP_ALIGN);
    if (heap_end + len > heap_lo + heap_span) {
        len = heap_lo + heap_span - heap_end;
        if (len < need || len < FM_HEAP_ALIGN) return ENOMEM;
    }
    void *chunk = (void *)heap_end;
    if (syscall(SYS_mprotect, chunk, len, PROT_READ | PROT_WRITE) != 0) return errno;
    fmp_internal_depth++;
    int err = fm_register_region(chunk, len, 1);
    if (err == 0 &&
        !mi_manage_os_memory(chunk, len, /*committed*/ true, /*large*/ false, /*zero*/ true, -1))
        err = ENOMEM;
    fmp_internal_depth--;
    if (err != 0) {
        syscall(SYS_mprotect, chunk, len, PROT_NONE);
        return err;
    }
    __atomic_store_n(&heap_end, heap_end + len, __ATOMIC_RELEASE);
    atomic_fetch_add(&ctr_heap_bytes, len);
    if (next_chunk < FM_MAX_CHUNK) next_chunk *= 2;
    return 0;
}

/* Called when mimalloc returned NULL for a request of `need` bytes: add a chunk unless a
 * concurrent caller already did (`seen_end` is the heap end when the request failed). */
static int heap_grow(size_t need, uintptr_t seen_end) {
    pthread_mutex_lock(&grow_lock);
    int err = 0;
    if (heap_end == seen_end) err = grow_locked(need);
    pthread_mutex_unlock(&grow_lock);
    return err;
}

static uintptr_t heap_end_snapshot(void) { return __atomic_load_n(&heap_end, __ATOMIC_ACQUIRE); }

/* Reserves the span (PROT_NONE, MAP_NORESERVE, no huge pages) and hands mimalloc its first
 * chunk. Called once, from the library constructor, before heap_ready. Returns 0 or errno. */
FM_HIDDEN int fmp_heap_init(size_t reserve_bytes, size_t first_chunk_bytes) {
    reserve_bytes = round_up(reserve_bytes, FM_HEAP_ALIGN);
    first_chunk_bytes = round_up(first_chunk_bytes < FM_MIN_CHUNK ? FM_MIN_CHUNK : first_chunk_bytes,
                                 FM_HEAP_ALIGN);
    if (first_chunk_bytes > reserve_bytes) return EINVAL;
    size_t map_len = reserve_bytes + FM_HEAP_ALIGN;
    void *raw = (void *)syscall(SYS_mmap, NULL, map_len, PROT_NONE,
                                MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (raw == MAP_FAILED) return errno;
    uintptr_t lo = round_up((uintptr_t)raw, FM_HEAP_ALIGN);
    if (lo > (uintptr_t)raw) syscall(SYS_munmap, raw, lo - (uintptr_t)raw);
    uintptr_t tail = (uintptr_t)raw + map_len - (lo + reserve_bytes);
    if (tail) syscall(SYS_munmap, (void *)(lo + reserve_bytes), tail);
    syscall(SYS_madvise, (void *)lo, reserve_bytes, MADV_NOHUGEPAGE);

    /* Only our chunks, never fresh OS memory, may back user allocations. */
    mi_option_set(mi_option_arena_reserve, 0);
    mi_option_set(mi_option_disallow_os_alloc, 1);
    /* Freed memory must reach the runtime before it is reused: a purge is a MADV_DONTNEED, which
     * the runtime sees as a REMOVE event and forgets the pages (never written back or fetched
     * again). mimalloc delays arena purges by purge_delay x arena_purge_mult (100 ms), so a
     * program that frees a big block and allocates the next one at once (a numpy loop) got the
     * old, evicted contents fetched back before overwriting them. Arena blocks (freed segments
     * and huge blocks) are purged at once; small pages inside segments keep mimalloc's own short
     * delay, since each purge there blocks the freeing thread until the event is read. */
    mi_option_set(mi_option_arena_purge_mult, 0);

    pthread_mutex_lock(&grow_lock);
    heap_lo = lo;
    heap_span = reserve_bytes;
    heap_end = lo;
    next_chunk = first_chunk_bytes;
    int err = grow_locked(0);
    pthread_mutex_unlock(&grow_lock);
    return err;
}

FM_HIDDEN void fmp_heap_set_ready(void) { atomic_store_explicit(&heap_ready, 1, memory_order_release); }
FM_HIDDEN void fmp_set_mmap_threshold(size_t bytes) { atomic_store(&mmap_threshold, bytes); }
FM_HIDDEN void fmp_set_regions_active(int on) { atomic_store(&regions_active, on); }

FM_HIDDEN void fmp_heap_bounds(uintptr_t *lo, uintptr_t *span) {
    *lo = heap_lo;
    *span = heap_span;
}

struct fmp_counters {
    uint64_t heap_bytes;
    uint64_t mmap_regions;
    uint64_t mmap_region_bytes;
    uint64_t register_failures;
    uint64_t madv_free_converted;
    uint64_t reservations;
    uint64_t fixed_reregistered;
};

FM_HIDDEN void fmp_counters(struct fmp_counters *out) {
    out->heap_bytes = atomic_load(&ctr_heap_bytes);
    out->mmap_regions = atomic_load(&ctr_mmap_regions);
    out->mmap_region_bytes = atomic_load(&ctr_mmap_region_bytes);
    out->register_failures = atomic_load(&ctr_register_failures);
    out->madv_free_converted = atomic_load(&ctr_madv_free_converted);
    out->reservations = atomic_load(&ctr_reservations);
    out->fixed_reregistered = atomic_load(&ctr_fixed_reregistered);
}

/* ------------------------------------------------------------------------------------- */
/* malloc family                                                                          */

FM_HIDDEN void *fmp_malloc(size_t size) {
    if (use_glibc()) return __libc_malloc(size);
    for (int attempt = 0;; attempt++) {
        uintptr_t seen = heap_end_snapshot();
        void *p = mi_malloc(size);
        if (likely(p != NULL) || attempt == 2 || heap_grow(size, seen) != 0) {
            if (p == NULL) errno = ENOMEM;
            return p;
        }
    }
}

FM_HIDDEN void fmp_free(void *ptr) {
    if (ptr == NULL) return;
    int saved = errno;
    if (in_heap(ptr))
        mi_free(ptr);
    else
        __libc_free(ptr);
    errno = saved;
}

FM_HIDDEN void *fmp_calloc(size_t n, size_t size) {
    size_t total;
    if (__builtin_mul_overflow(n, size, &total)) {
        errno = ENOMEM;
        return NULL;
    }
    if (use_glibc()) return __libc_calloc(n, size);
    for (int attempt = 0;; attempt++) {
        uintptr_t seen = heap_end_snapshot();
        void *p = mi_calloc(n, size);
        if (likely(p != NULL) || attempt == 2 || heap_grow(total, seen) != 0) {
            if (p == NULL) errno = ENOMEM;
            return p;
        }
    }
}

FM_HIDDEN void *fmp_realloc(void *ptr, size_t size) {
    if (ptr == NULL) return fmp_malloc(size);
    if (size == 0) { /* glibc semantics: realloc(p, 0) frees p and returns NULL */
        fmp_free(ptr);
        return NULL;
    }
    if (!in_heap(ptr)) return __libc_realloc(ptr, size);
    for (int attempt = 0;; attempt++) {
        uintptr_t seen = heap_end_snapshot();
        void *p = mi_realloc(ptr, size);
        if (likely(p != NULL) || attempt == 2 || heap_grow(size, seen) != 0) {
            if (p == NULL) errno = ENOMEM;
            return p;
        }
    }
}

FM_HIDDEN void *fmp_reallocarray(void *ptr, size_t n, size_t size) {
    size_t total;
    if (__builtin_mul_overflow(n, size, &total)) {
        errno = ENOMEM;
        return NULL;
    }
    return fmp_realloc(ptr, total);
}

static int is_pow2(size_t x) { return x != 0 && (x & (x - 1)) == 0; }

/* Aligned allocation for a valid (power of two) alignment. */
static void *aligned(size_t align, size_t size) {
    if (use_glibc()) return __libc_memalign(align, size);
    for (int attempt = 0;; attempt++) {
        uintptr_t seen = heap_end_snapshot();
        void *p = mi_malloc_aligned(size, align);
        if (likely(p != NULL)) return p;
        size_t need;
        if (attempt == 2 || __builtin_add_overflow(size, align, &need) || heap_grow(need, seen) != 0) {
            /* alignments mimalloc's arenas cannot serve (above 32 MiB) go to glibc */
            if (align > (32UL << 20)) return __libc_memalign(align, size);
            errno = ENOMEM;
            return NULL;
        }
    }
}

FM_HIDDEN int fmp_posix_memalign(void **out, size_t align, size_t size) {
    if (!is_pow2(align) || align % sizeof(void *) != 0) return EINVAL;
    int saved = errno;
    void *p = aligned(align, size);
    int err = p == NULL ? ENOMEM : 0;
    errno = saved;
    if (p != NULL) *out = p;
    return err;
}

FM_HIDDEN void *fmp_aligned_alloc(size_t align, size_t size) {
    if (!is_pow2(align)) {
        errno = EINVAL;
        return NULL;
    }
    return aligned(align, size);
}

FM_HIDDEN void *fmp_memalign(size_t align, size_t size) {
    if (align <= 16) return fmp_malloc(size);
    if (!is_pow2(align)) { /* glibc rounds a bad alignment up to the next power of two */
        if (align > (SIZE_MAX >> 1) + 1) {
            errno = EINVAL;
            return NULL;
        }
        size_t a = 1;
        while (a < align) a <<= 1;
        align = a;
    }
    return aligned(align, size);
}

FM_HIDDEN void *fmp_valloc(size_t size) { return aligned(FM_PAGE, size); }

FM_HIDDEN void *fmp_pvalloc(size_t size) {
    size_t rounded;
    if (__builtin_add_overflow(size, FM_PAGE - 1, &rounded)) {
        errno = ENOMEM;
        return NULL;
    }
    rounded &= ~(FM_PAGE - 1);
    return aligned(FM_PAGE, rounded ? rounded : FM_PAGE);
}

FM_HIDDEN size_t fmp_malloc_usable_size(void *ptr) {
    if (ptr == NULL) return 0;
    if (in_heap(ptr)) return mi_usable_size(ptr);
    return glibc_usable_size(ptr);
}

/* ------------------------------------------------------------------------------------- */
/* mappings                                                                               */

/* A private anonymous mapping the runtime could manage: not a stack, not huge pages, and either
 * writable or a reservation (PROT_NONE, committed later by mprotect: V8's heap pages, HotSpot's
 * heap, allocators that reserve first). A read-only or executable-only anonymous mapping holds
 * nothing but zeros until it is made writable, which programs do by mprotect on a reservation. */
static int is_candidate(int prot, int flags, int fd) {
    if (!atomic_load_explicit(&regions_active, memory_order_acquire)) return 0;
    if (fmp_internal_depth || fmp_runtime_thread) return 0;
    if ((flags & MAP_TYPE) != MAP_PRIVATE || !(flags & MAP_ANONYMOUS) || fd != -1) return 0;
    if (flags & (MAP_STACK | MAP_GROWSDOWN | MAP_HUGETLB)) return 0;
    return (prot & PROT_WRITE) || prot == PROT_NONE;
}

static int in_heap_span(uintptr_t a, size_t len) { return a < heap_lo + heap_span && a + len > heap_lo; }

FM_HIDDEN void *fmp_mmap(void *addr, size_t len, int prot, int flags, int fd, off_t off) {
    int candidate = is_candidate(prot, flags, fd);
    /* mmap(MAP_FIXED) over a region replaces its pages: the kernel unmaps them (the runtime hears
     * an UNMAP event) and the new mapping is not registered. Such a mapping is a commit or a
     * decommit inside memory farmem managed (HotSpot commits its heap, and G1 its bitmaps page by
     * page, this way), so it is registered again whatever its size. Asked before the call: the
     * UNMAP event makes the runtime forget the old range. */
    int replaces_region = 0;
    if (candidate && (flags & MAP_FIXED) && !(flags & MAP_FIXED_NOREPLACE) &&
        !in_heap_span((uintptr_t)addr, len)) {
        fmp_internal_depth++;
        sigset_t old = fm_block_signals();
        replaces_region = farmem_preload_overlaps_region(addr, len);
        fm_restore_signals(&old);
        fmp_internal_depth--;
    }
    void *p = (void *)syscall(SYS_mmap, addr, len, prot, flags, fd, off);
    if (p == MAP_FAILED || !candidate || in_heap_span((uintptr_t)p, len)) return p;
    if (!replaces_region && len < atomic_load_explicit(&mmap_threshold, memory_order_relaxed))
        return p;
    int saved = errno;
    syscall(SYS_madvise, p, round_up(len, FM_PAGE), MADV_NOHUGEPAGE);
    fmp_internal_depth++;
    int err = fm_register_region(p, round_up(len, FM_PAGE), 0);
    fmp_internal_depth--;
    if (err == 0) {
        atomic_fetch_add(&ctr_mmap_regions, 1);
        atomic_fetch_add(&ctr_mmap_region_bytes, len);
        if (prot == PROT_NONE) atomic_fetch_add(&ctr_reservations, 1);
        if (replaces_region) atomic_fetch_add(&ctr_fixed_reregistered, 1);
    } else {
        /* the mapping stays ordinary memory; counted and reported in the stats */
        atomic_fetch_add(&ctr_register_failures, 1);
    }
    errno = saved;
    return p;
}

FM_HIDDEN int fmp_munmap(void *addr, size_t len) { return (int)syscall(SYS_munmap, addr, len); }

/* mremap growing a region: the grown part stays in the region's VMA (registered with the
 * runtime's userfaultfd, so its faults reach the fault thread) but the runtime hears only of a
 * move, of the old length (UFFD_EVENT_REMAP), and nothing of a growth in place. The grown part
 * was then served as memory of no region: zero pages the budget never counted (a 64 MiB mapping
 * grown to 512 MiB held 480 MiB outside the regions at a 32 MiB budget). It is registered as a
 * region of its own. Asked before the call, like MAP_FIXED above (the old range may be gone). */
FM_HIDDEN void *fmp_mremap(void *old, size_t old_len, size_t new_len, int flags, void *new_addr) {
    int grows_region = 0;
    if (new_len > old_len && atomic_load_explicit(&regions_active, memory_order_acquire) &&
        !fmp_internal_depth && !fmp_runtime_thread && !in_heap_span((uintptr_t)old, old_len)) {
        fmp_internal_depth++;
        sigset_t o = fm_block_signals();
        grows_region = farmem_preload_overlaps_region(old, old_len);
        fm_restore_signals(&o);
        fmp_internal_depth--;
    }
    void *p = (void *)syscall(SYS_mremap, old, old_len, new_len, flags, new_addr);
    size_t kept = round_up(old_len, FM_PAGE), grown = round_up(new_len, FM_PAGE);
    if (p == MAP_FAILED || !grows_region || grown <= kept) return p;
    int saved = errno;
    fmp_internal_depth++;
    int err = fm_register_region((char *)p + kept, grown - kept, 0);
    fmp_internal_depth--;
    if (err == 0) {
        atomic_fetch_add(&ctr_mmap_regions, 1);
        atomic_fetch_add(&ctr_mmap_region_bytes, grown - kept);
    } else {
        atomic_fetch_add(&ctr_register_failures, 1);
    }
    errno = saved;
    return p;
}

FM_HIDDEN int fmp_madvise(void *addr, size_t len, int advice) {
    /* MADV_FREE lets the kernel drop a page later without telling userfaultfd; on a region
     * that would leave the runtime believing the page is resident. MADV_DONTNEED is an
     * allowed implementation of MADV_FREE (the page may read back as zeros) and raises the
     * REMOVE event the runtime listens to. */
    if (advice == MADV_FREE && atomic_load_explicit(&regions_active, memory_order_relaxed)) {
        advice = MADV_DONTNEED;
        atomic_fetch_add(&ctr_madv_free_converted, 1);
    }
    /* The runtime manages 4 KiB pages: a request for huge pages (a hint without effect on
     * the contents) is accepted and not passed on while regions are active. */
    if (advice == MADV_HUGEPAGE && atomic_load_explicit(&regions_active, memory_order_relaxed))
        return 0;
    int r = (int)syscall(SYS_madvise, addr, len, advice);
    /* A child gets no copy of a MADV_DONTFORK range (V8 marks each heap page so) and zeros in
     * a MADV_WIPEONFORK one: the runtime leaves their evicted pages where they are when the
     * program forks, and lends the child none of them. */
    if (r == 0 && (advice == MADV_DONTFORK || advice == MADV_DOFORK ||
                   advice == MADV_WIPEONFORK || advice == MADV_KEEPONFORK) &&
        atomic_load_explicit(&regions_active, memory_order_relaxed) && !fmp_internal_depth &&
        !fmp_runtime_thread) {
        int saved = errno;
        fmp_internal_depth++;
        sigset_t old = fm_block_signals();
        farmem_preload_fork_advice(addr, len, advice);
        fm_restore_signals(&old);
        fmp_internal_depth--;
        errno = saved;
    }
    return r;
}

struct fmp_thread_start {
    void *(*start)(void *);
    void *arg;
};

/* Start of a thread created by farmem code: it is a runtime thread from its first
 * instruction, before the thread library or Rust's std allocate anything on it. */
static void *fmp_runtime_thread_start(void *v) {
    struct fmp_thread_start s = *(struct fmp_thread_start *)v;
    fmp_runtime_thread = 1;
    __libc_free(v);
    return s.start(s.arg);
}

/* pthread_create allocates the new thread's DTV with calloc on the calling thread. A DTV in
 * region memory could be evicted and then read (through __tls_get_addr) by a thread that
 * must not fault, so every thread's DTV comes from glibc. A thread created by farmem code
 * (a runtime thread, or a program thread inside farmem code) is marked a runtime thread
 * before it runs anything. */
FM_HIDDEN int fmp_pthread_create(pthread_t *t, const pthread_attr_t *attr, void *(*start)(void *),
                                void *arg) {
    pthread_create_fn f = atomic_load_explicit(&real_pthread_create, memory_order_acquire);
    if (unlikely(f == NULL)) {
        f = (pthread_create_fn)resolve("pthread_create");
        if (f == NULL) return EAGAIN;
        atomic_store_explicit(&real_pthread_create, f, memory_order_release);
    }
    int from_farmem = fmp_internal_depth != 0 || fmp_runtime_thread != 0;
    fmp_internal_depth++;
    int r;
    if (from_farmem) {
        struct fmp_thread_start *s = __libc_malloc(sizeof *s);
        if (s == NULL) {
            fmp_internal_depth--;
            return EAGAIN;
        }
        s->start = start;
        s->arg = arg;
        r = f(t, attr, fmp_runtime_thread_start, s);
        if (r != 0) __libc_free(s);
    } else {
        r = f(t, attr, start, arg);
    }
    fmp_internal_depth--;
    return r;
}

/* The global locale's data (what setlocale loads) is read by every new thread before it runs
 * a line of its own: glibc's thread start calls __ctype_init, which reads the LC_CTYPE data.
 * Allocated from region memory, that data could be evicted, and a runtime thread started
 * later (a forked child starts a whole runtime) would fault on it before it could serve any
 * fault: a forked pool worker's new fault thread hung so in __ctype_init. So setlocale runs
 * as farmem code, and its allocations come from glibc. */
FM_HIDDEN char *fmp_setlocale(int category, const char *locale) {
    setlocale_fn f = atomic_load_explicit(&real_setlocale, memory_order_acquire);
    if (unlikely(f == NULL)) {
        f = (setlocale_fn)resolve("setlocale");
        if (f == NULL) {
            errno = ENOSYS;
            return NULL;
        }
        atomic_store_explicit(&real_setlocale, f, memory_order_release);
    }
    fmp_internal_depth++;
    char *r = f(category, locale);
    fmp_internal_depth--;
    return r;
}

/* Resolves the glibc symbols we forward to, from the constructor (before any thread of the
 * program can race on them). */
FM_HIDDEN void fmp_resolve_symbols(void) {
    if (!atomic_load(&real_usable))
        atomic_store(&real_usable, (usable_fn)resolve("malloc_usable_size"));
    if (!atomic_load(&real_pthread_create))
        atomic_store(&real_pthread_create, (pthread_create_fn)resolve("pthread_create"));
    if (!atomic_load(&real_setlocale))
        atomic_store(&real_setlocale, (setlocale_fn)resolve("setlocale"));
}
