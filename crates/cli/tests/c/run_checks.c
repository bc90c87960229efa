/*
 * The C test program of `farmem run` (crates/cli/tests/run_c_program.rs).
 *
 * Usage: run_checks DATA_MIB [CHECK]
 * Runs every check, or only CHECK (by name). DATA_MIB is the size of the working set each check uses; run it under a budget well below
 * it so pages are evicted between writing and checking. Prints "ok NAME" per check and exits
 * 0, or prints "FAIL NAME: why" and exits 1.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <locale.h>
#include <malloc.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static size_t data_bytes;
static const size_t PAGE = 4096;

#define FAIL(name, ...)                                                                  \
    do {                                                                                 \
        fprintf(stderr, "FAIL %s: ", name);                                              \
        fprintf(stderr, __VA_ARGS__);                                                    \
        fprintf(stderr, "\n");                                                           \
        exit(1);                                                                         \
    } while (0)

static inline uint64_t pattern(uint64_t seed, size_t i) {
    uint64_t x = (seed + 1) * 0x9E3779B97F4A7C15ULL ^ (uint64_t)i * 0xBF58476D1CE4E5B9ULL;
    return x ^ (x >> 29);
}

static void fill(uint64_t *p, size_t words, uint64_t seed) {
    for (size_t i = 0; i < words; i++) p[i] = pattern(seed, i);
}

/* Returns the index of the first wrong word, or SIZE_MAX. */
static size_t check(const uint64_t *p, size_t words, uint64_t seed) {
    for (size_t i = 0; i < words; i++)
        if (p[i] != pattern(seed, i)) return i;
    return SIZE_MAX;
}

/* Touches `bytes` of other memory so that earlier pages get evicted. */
static void pressure(size_t bytes) {
    uint64_t *q = malloc(bytes);
    if (!q) FAIL("pressure", "malloc(%zu) failed", bytes);
    fill(q, bytes / 8, 99);
    free(q);
}

static void check_api(void) {
    const char *n = "malloc-api";
    void *p = NULL;
    if (posix_memalign(&p, 4096, 10000) != 0 || ((uintptr_t)p & 4095)) FAIL(n, "posix_memalign");
    free(p);
    if (posix_memalign(&p, 3, 10) != EINVAL) FAIL(n, "posix_memalign(3) must be EINVAL");
    p = aligned_alloc(256, 1024);
    if (!p || ((uintptr_t)p & 255)) FAIL(n, "aligned_alloc");
    free(p);
    p = memalign(1 << 16, 100);
    if (!p || ((uintptr_t)p & 0xffff)) FAIL(n, "memalign");
    free(p);
    p = valloc(1);
    if (!p || ((uintptr_t)p & 4095)) FAIL(n, "valloc");
    free(p);
    p = pvalloc(5000);
    if (!p || ((uintptr_t)p & 4095) || malloc_usable_size(p) < 8192) FAIL(n, "pvalloc");
    free(p);
    char *s = malloc(100);
    if (!s || malloc_usable_size(s) < 100) FAIL(n, "malloc_usable_size");
    memset(s, 'x', 100);
    s = realloc(s, 1 << 20);
    for (int i = 0; i < 100; i++)
        if (s[i] != 'x') FAIL(n, "realloc lost data");
    errno = 1234;
    free(s);
    if (errno != 1234) FAIL(n, "free changed errno");
    errno = 0;
    if (reallocarray(NULL, SIZE_MAX / 2, 3) != NULL || errno != ENOMEM) FAIL(n, "reallocarray overflow");
    errno = 0;
    if (calloc(SIZE_MAX / 2, 3) != NULL || errno != ENOMEM) FAIL(n, "calloc overflow");
    if (malloc_usable_size(NULL) != 0) FAIL(n, "malloc_usable_size(NULL)");
    p = strdup("glibc allocates through us");
    free(p);
    printf("ok %s\n", n);
}

static void check_read_into_evicted(void) {
    const char *n = "read-into-evicted";
    size_t words = data_bytes / 8;
    uint64_t *buf = malloc(data_bytes);
    if (!buf) FAIL(n, "malloc");
    fill(buf, words, 1);
    pressure(data_bytes);
    /* a file with 1 MiB of known bytes, read into the (evicted) start of buf */
    char path[] = "/tmp/farmem-run-checks-XXXXXX";
    int fd = mkstemp(path);
    if (fd < 0) FAIL(n, "mkstemp");
    unlink(path);
    size_t file_bytes = 1 << 20;
    uint64_t *src = malloc(file_bytes);
    fill(src, file_bytes / 8, 7);
    if (write(fd, src, file_bytes) != (ssize_t)file_bytes) FAIL(n, "write");
    free(src);
    pressure(data_bytes);
    if (lseek(fd, 0, SEEK_SET) != 0) FAIL(n, "lseek");
    ssize_t got = read(fd, buf, file_bytes);
    if (got != (ssize_t)file_bytes) FAIL(n, "read returned %zd (errno %d: %s)", got, errno, strerror(errno));
    close(fd);
    size_t bad = check(buf, file_bytes / 8, 7);
    if (bad != SIZE_MAX) FAIL(n, "word %zu of the read data is wrong", bad);
    for (size_t i = file_bytes / 8; i < words; i++)
        if (buf[i] != pattern(1, i)) FAIL(n, "word %zu after the read is wrong", i);
    free(buf);
    printf("ok %s\n", n);
}

struct thread_arg {
    uint64_t *mem;
    size_t words;
    int id;
    int failed;
};

static void *thread_main(void *v) {
    struct thread_arg *a = v;
    for (int round = 0; round < 3; round++) {
        uint64_t seed = (uint64_t)a->id * 100 + (uint64_t)round;
        fill(a->mem, a->words, seed);
        /* small allocations from every thread too */
        for (int k = 0; k < 2000; k++) {
            char *s = malloc(16 + (size_t)(k % 200));
            s[0] = (char)k;
            free(s);
        }
        if (check(a->mem, a->words, seed) != SIZE_MAX) a->failed = 1;
    }
    return NULL;
}

static void check_threads(void) {
    const char *n = "threads";
    pthread_t t[8];
    struct thread_arg a[8];
    for (int i = 0; i < 8; i++) {
        a[i].words = data_bytes / 8 / 8;
        a[i].mem = malloc(a[i].words * 8);
        if (!a[i].mem) FAIL(n, "malloc");
        a[i].id = i;
        a[i].failed = 0;
        if (pthread_create(&t[i], NULL, thread_main, &a[i]) != 0) FAIL(n, "pthread_create");
    }
    for (int i = 0; i < 8; i++) {
        pthread_join(t[i], NULL);
        if (a[i].failed) FAIL(n, "thread %d read back wrong data", i);
        free(a[i].mem);
    }
    printf("ok %s\n", n);
}

static void check_fork(void) {
    const char *n = "fork";
    size_t words = data_bytes / 8;
    uint64_t *buf = malloc(data_bytes);
    if (!buf) FAIL(n, "malloc");
    fill(buf, words, 3);
    pressure(data_bytes); /* most of buf is now evicted */
    fflush(stdout);
    pid_t pid = fork();
    if (pid < 0) FAIL(n, "fork: %s", strerror(errno));
    if (pid == 0) {
        /* the child: every byte as at the moment of the fork */
        size_t bad = check(buf, words, 3);
        if (bad != SIZE_MAX) {
            size_t n_bad = 0;
            for (size_t i = bad; i < words; i++) n_bad += buf[i] != pattern(3, i);
            fprintf(stderr,
                    "FAIL fork: child saw word %zu wrong (%#llx, expected %#llx; pattern(4) is "
                    "%#llx); %zu wrong words in all\n",
                    bad, (unsigned long long)buf[bad], (unsigned long long)pattern(3, bad),
                    (unsigned long long)pattern(4, bad), n_bad);
            _exit(1);
        }
        /* and the child can allocate and write memory of its own */
        uint64_t *mine = malloc(data_bytes / 4);
        fill(mine, data_bytes / 32, 5);
        if (check(mine, data_bytes / 32, 5) != SIZE_MAX) _exit(2);
        _exit(0);
    }
    /* the parent keeps writing while the child checks */
    fill(buf, words, 4);
    int status;
    if (waitpid(pid, &status, 0) != pid) FAIL(n, "waitpid");
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) FAIL(n, "child failed (status %d)", status);
    if (check(buf, words, 4) != SIZE_MAX) FAIL(n, "parent's data changed");
    free(buf);
    printf("ok %s\n", n);
}

static void check_mremap(void) {
    const char *n = "mremap-grow";
    size_t first = 32UL << 20;
    uint64_t *m = mmap(NULL, first, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) FAIL(n, "mmap");
    fill(m, first / 8, 11);
    uint64_t *g = mremap(m, first, data_bytes, MREMAP_MAYMOVE);
    if (g == MAP_FAILED) FAIL(n, "mremap: %s", strerror(errno));
    if (check(g, first / 8, 11) != SIZE_MAX) FAIL(n, "data moved wrong");
    uint64_t *tail = g + first / 8;
    size_t tail_words = (data_bytes - first) / 8;
    for (size_t i = 0; i < tail_words; i++)
        if (tail[i] != 0) FAIL(n, "grown part not zero at word %zu", i);
    fill(tail, tail_words, 12);
    pressure(data_bytes);
    if (check(g, first / 8, 11) != SIZE_MAX) FAIL(n, "old part wrong after pressure");
    if (check(tail, tail_words, 12) != SIZE_MAX) FAIL(n, "new part wrong after pressure");
    if (munmap(g, data_bytes) != 0) FAIL(n, "munmap");
    printf("ok %s\n", n);
}

static void check_dontneed(void) {
    const char *n = "madv-dontneed";
    uint64_t *m = mmap(NULL, data_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) FAIL(n, "mmap");
    fill(m, data_bytes / 8, 13);
    pressure(data_bytes);
    size_t half = data_bytes / 2;
    if (madvise(m, half, MADV_DONTNEED) != 0) FAIL(n, "madvise");
    for (size_t i = 0; i < half / 8; i++)
        if (m[i] != 0) FAIL(n, "word %zu not zero after MADV_DONTNEED", i);
    for (size_t i = half / 8; i < data_bytes / 8; i++)
        if (m[i] != pattern(13, i)) FAIL(n, "word %zu beyond the advised range changed", i);
    /* MADV_FREE: either the old data or zeros, never anything else */
    if (madvise(m + half / 8, half, MADV_FREE) != 0) FAIL(n, "madvise(MADV_FREE)");
    for (size_t i = half / 8; i < data_bytes / 8; i++)
        if (m[i] != 0 && m[i] != pattern(13, i)) FAIL(n, "word %zu garbage after MADV_FREE", i);
    fill(m, data_bytes / 8, 14);
    pressure(data_bytes);
    if (check(m, data_bytes / 8, 14) != SIZE_MAX) FAIL(n, "rewrite lost");
    munmap(m, data_bytes);
    printf("ok %s\n", n);
}

static void check_populate(void) {
    const char *n = "map-populate";
    uint64_t *m = mmap(NULL, data_bytes, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
    if (m == MAP_FAILED) FAIL(n, "mmap(MAP_POPULATE)");
    for (size_t i = 0; i < data_bytes / 8; i++)
        if (m[i] != 0) FAIL(n, "word %zu of a new mapping not zero", i);
    fill(m, data_bytes / 8, 31);
    pressure(data_bytes);
    size_t bad = check(m, data_bytes / 8, 31);
    if (bad != SIZE_MAX) FAIL(n, "word %zu lost", bad);
    munmap(m, data_bytes);
    printf("ok %s\n", n);
}

/* MAP_SHARED | MAP_ANONYMOUS: a child's writes are seen by its parent and the other way round. */
static void check_shared(void) {
    const char *n = "map-shared";
    size_t words = data_bytes / 8;
    uint64_t *m = mmap(NULL, data_bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) FAIL(n, "mmap(MAP_SHARED)");
    fill(m, words, 41);
    pressure(data_bytes);
    pid_t pid = fork();
    if (pid < 0) FAIL(n, "fork");
    if (pid == 0) {
        if (check(m, words, 41) != SIZE_MAX) _exit(3);
        fill(m, words / 2, 42); /* the first half, seen by the parent */
        _exit(0);
    }
    int status = 0;
    if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
        FAIL(n, "child saw wrong data or failed (status %#x)", status);
    size_t bad = check(m, words / 2, 42);
    if (bad != SIZE_MAX) FAIL(n, "the child's write of word %zu not seen", bad);
    for (size_t i = words / 2; i < words; i++)
        if (m[i] != pattern(41, i)) FAIL(n, "word %zu changed", i);
    pressure(data_bytes);
    if (check(m, words / 2, 42) != SIZE_MAX) FAIL(n, "shared data lost under pressure");
    munmap(m, data_bytes);
    printf("ok %s\n", n);
}

/* A new private mapping of data_bytes, filled with pattern(seed). */
static uint64_t *map_filled(const char *n, uint64_t seed) {
    uint64_t *m = mmap(NULL, data_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) FAIL(n, "mmap");
    fill(m, data_bytes / 8, seed);
    return m;
}

/* Forks; the child checks that the first `words` words at `m` are zero (`zeros`) or
 * pattern(seed); returns whether it found them so. */
static int child_sees(const uint64_t *m, size_t words, int zeros, uint64_t seed) {
    fflush(stdout);
    pid_t pid = fork();
    if (pid < 0) return 0;
    if (pid == 0) {
        for (size_t i = 0; i < words; i++)
            if (m[i] != (zeros ? 0 : pattern(seed, i))) _exit(3);
        _exit(0);
    }
    int status = 0;
    return waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

/* MADV_WIPEONFORK: a child sees zeros there, the parent keeps its data; the mark follows the
 * range when mremap moves it, and MADV_KEEPONFORK undoes it. */
static void check_wipeonfork(void) {
    const char *n = "wipeonfork";
    size_t words = data_bytes / 8;
    uint64_t *m = map_filled(n, 51);
    if (madvise(m, data_bytes, MADV_WIPEONFORK) != 0) FAIL(n, "madvise(MADV_WIPEONFORK)");
    pressure(data_bytes);
    if (!child_sees(m, words, 1, 0)) FAIL(n, "the child did not see zeros");
    size_t bad = check(m, words, 51);
    if (bad != SIZE_MAX) FAIL(n, "the parent's word %zu changed", bad);
    /* moved by mremap: still wiped in the child */
    uint64_t *g = mremap(m, data_bytes, 2 * data_bytes, MREMAP_MAYMOVE);
    if (g == MAP_FAILED) FAIL(n, "mremap: %s", strerror(errno));
    pressure(2 * data_bytes);
    if (!child_sees(g, words, 1, 0)) FAIL(n, "the child did not see zeros after mremap");
    if ((bad = check(g, words, 51)) != SIZE_MAX) FAIL(n, "word %zu lost after mremap", bad);
    if (madvise(g, 2 * data_bytes, MADV_KEEPONFORK) != 0) FAIL(n, "madvise(MADV_KEEPONFORK)");
    pressure(2 * data_bytes);
    if (!child_sees(g, words, 0, 51)) FAIL(n, "the child did not see the data after KEEPONFORK");
    munmap(g, 2 * data_bytes);
    printf("ok %s\n", n);
}

/* mlock / mlockall: farmem cannot keep pages it manages in RAM, so it accepts the lock without
 * applying it (with a warning); the data must be right either way, and unlock must work. */
static void check_mlock(void) {
    const char *n = "mlock";
    size_t words = data_bytes / 8;
    uint64_t *m = map_filled(n, 61);
    if (mlock(m, data_bytes) != 0) FAIL(n, "mlock: %s", strerror(errno));
    pressure(data_bytes);
    size_t bad = check(m, words, 61);
    if (bad != SIZE_MAX) FAIL(n, "word %zu of the locked range changed", bad);
    if (munlock(m, data_bytes) != 0) FAIL(n, "munlock: %s", strerror(errno));
    if (mlockall(MCL_CURRENT | MCL_FUTURE) != 0) FAIL(n, "mlockall: %s", strerror(errno));
    uint64_t *later = malloc(data_bytes / 2);
    if (!later) FAIL(n, "malloc after mlockall");
    fill(later, words / 2, 62);
    fill(m, words, 63);
    if (munlockall() != 0) FAIL(n, "munlockall: %s", strerror(errno));
    pressure(data_bytes);
    if ((bad = check(m, words, 63)) != SIZE_MAX) FAIL(n, "word %zu changed after mlockall", bad);
    if ((bad = check(later, words / 2, 62)) != SIZE_MAX) FAIL(n, "allocated word %zu changed", bad);
    free(later);
    munmap(m, data_bytes);
    printf("ok %s\n", n);
}

/* MADV_DONTFORK: a child has no mapping there (an access is SIGSEGV); the parent keeps its
 * data, also pages that were evicted when it forked. */
static void check_dontfork(void) {
    const char *n = "dontfork";
    size_t words = data_bytes / 8;
    uint64_t *m = map_filled(n, 71);
    if (madvise(m, data_bytes, MADV_DONTFORK) != 0) FAIL(n, "madvise(MADV_DONTFORK)");
    pressure(data_bytes);
    fflush(stdout);
    pid_t pid = fork();
    if (pid < 0) FAIL(n, "fork");
    if (pid == 0) {
        signal(SIGSEGV, SIG_DFL);
        volatile uint64_t x = m[words / 2]; /* no mapping: SIGSEGV */
        (void)x;
        _exit(0);
    }
    int status = 0;
    if (waitpid(pid, &status, 0) != pid || !WIFSIGNALED(status) || WTERMSIG(status) != SIGSEGV)
        FAIL(n, "the child's access did not end in SIGSEGV (status %#x)", status);
    size_t bad = check(m, words, 71);
    if (bad != SIZE_MAX) FAIL(n, "the parent's word %zu changed", bad);
    munmap(m, data_bytes);
    printf("ok %s\n", n);
}

/* Threads write and read pages of one range while another thread releases parts of it with
 * MADV_DONTNEED (and MADV_FREE), the range three times the budget so pages are evicted,
 * fetched and prefetched meanwhile. Each page holds its writer's last counter: a read gives
 * that counter or zero (released), never an older counter and never SIGBUS. (Found by the
 * page model, docs/decisions/0067: a page installed after the runtime handled a REMOVE event
 * but before the kernel's zap was taken for resident with no page behind it; a page installed
 * by the prefetcher before the release was handled kept its old data.) */
struct race_arg {
    uint64_t *m;
    size_t pages;
    unsigned id, writers;
    volatile int *stop;
    uint64_t *last; /* per page the writer owns */
    size_t stale;
    size_t stale_page;
    uint64_t stale_got, stale_want;
};

static void *race_writer(void *v) {
    struct race_arg *a = v;
    uint64_t counter = 0;
    while (!*a->stop) {
        for (size_t p = a->id; p < a->pages && !*a->stop; p += a->writers) {
            uint64_t *w = a->m + p * (PAGE / 8);
            uint64_t got = __atomic_load_n(w, __ATOMIC_RELAXED);
            size_t k = p / a->writers;
            if (got != 0 && got != a->last[k]) {
                if (a->stale++ == 0) {
                    a->stale_page = p;
                    a->stale_got = got;
                    a->stale_want = a->last[k];
                }
            }
            uint64_t next = ((uint64_t)(a->id + 1) << 48) | ++counter;
            __atomic_store_n(w, next, __ATOMIC_RELAXED);
            a->last[k] = next;
        }
    }
    return NULL;
}

static void check_release_race(void) {
    const char *n = "release-race";
    enum { WRITERS = 3 };
    size_t pages = data_bytes / PAGE;
    uint64_t *m = mmap(NULL, data_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) FAIL(n, "mmap");
    volatile int stop = 0;
    pthread_t t[WRITERS];
    struct race_arg a[WRITERS];
    for (unsigned i = 0; i < WRITERS; i++) {
        a[i] = (struct race_arg){.m = m, .pages = pages, .id = i, .writers = WRITERS, .stop = &stop};
        a[i].last = calloc(pages / WRITERS + 1, 8);
        if (!a[i].last) FAIL(n, "calloc");
        if (pthread_create(&t[i], NULL, race_writer, &a[i]) != 0) FAIL(n, "pthread_create");
    }
    /* Release runs of 1 to 64 pages all over the range for 2 s as fast as possible (the
     * writers fault on released pages), then runs of 1 to 4 pages, one a millisecond, for 3 s (the range
     * outgrows the budget, so released pages are also being evicted, fetched and
     * prefetched). */
    uint64_t x = 0x2545F4914F6CDD1DULL;
    struct timespec t0, now;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    size_t releases = 0;
    double s = 0;
    do {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        size_t len = 1 + (x >> 40) % (s < 2 ? 64 : 4), start = (x % pages);
        if (start + len > pages) len = pages - start;
        int advice = (x >> 20) % 8 == 0 ? MADV_FREE : MADV_DONTNEED;
        if (madvise(m + start * (PAGE / 8), len * PAGE, advice) != 0) FAIL(n, "madvise: %s", strerror(errno));
        releases++;
        clock_gettime(CLOCK_MONOTONIC, &now);
        s = (double)(now.tv_sec - t0.tv_sec) + (double)(now.tv_nsec - t0.tv_nsec) / 1e9;
        if (s >= 2) usleep(1000);
    } while (s < 5);
    stop = 1;
    for (unsigned i = 0; i < WRITERS; i++) {
        pthread_join(t[i], NULL);
        if (a[i].stale)
            FAIL(n, "%zu reads gave an older counter than the last written (first: page %zu read %#llx, last written %#llx)",
                 a[i].stale, a[i].stale_page, (unsigned long long)a[i].stale_got,
                 (unsigned long long)a[i].stale_want);
        free(a[i].last);
    }
    munmap(m, data_bytes);
    /* the count varies from run to run: on stderr, so stdout stays comparable (the soak) */
    fprintf(stderr, "%s: %zu releases\n", n, releases);
    printf("ok %s\n", n);
}

static void check_calloc(void) {
    const char *n = "calloc-zero";
    /* dirty memory first, then free it, so calloc may get it back */
    uint64_t *d = malloc(data_bytes);
    fill(d, data_bytes / 8, 21);
    free(d);
    uint64_t *z = calloc(data_bytes / 8, 8);
    if (!z) FAIL(n, "calloc");
    for (size_t i = 0; i < data_bytes / 8; i++)
        if (z[i] != 0) FAIL(n, "word %zu not zero", i);
    free(z);
    printf("ok %s\n", n);
}

/* The mapping (from /proc/self/maps) holding address a: its start, and whether it is the
 * brk heap. Returns 0 when no mapping holds it. */
static uintptr_t mapping_of(uintptr_t a, int *brk_heap) {
    FILE *f = fopen("/proc/self/maps", "r");
    if (!f) return 0;
    char line[512];
    uintptr_t found = 0;
    while (fgets(line, sizeof line, f)) {
        unsigned long lo, hi;
        if (sscanf(line, "%lx-%lx", &lo, &hi) == 2 && lo <= a && a < hi) {
            found = lo;
            *brk_heap = strstr(line, "[heap]") != NULL;
            break;
        }
    }
    fclose(f);
    return found;
}

static void check_locale(void) {
    const char *n = "locale-unpaged";
    /* Every new thread reads the global locale's LC_CTYPE data as it starts (glibc's
     * __ctype_init), before it runs any code of its own, a runtime thread too: that data
     * must not live in paged memory. The program's own allocations do (unless glibc serves
     * both: without farmem, both are in the brk heap). */
    if (!setlocale(LC_ALL, "C.UTF-8")) FAIL(n, "setlocale(LC_ALL, \"C.UTF-8\") failed");
    locale_t l = duplocale(LC_GLOBAL_LOCALE);
    if (!l) FAIL(n, "duplocale: %s", strerror(errno));
    uintptr_t ctype = (uintptr_t)l->__locales[LC_CTYPE];
    void *mine = malloc(64);
    int ctype_brk = 0, mine_brk = 0;
    uintptr_t ctype_map = mapping_of(ctype, &ctype_brk);
    uintptr_t mine_map = mapping_of((uintptr_t)mine, &mine_brk);
    if (!ctype_map || !mine_map) FAIL(n, "no mapping holds the locale data or a malloc block");
    if (ctype_map == mine_map && !mine_brk)
        FAIL(n, "the LC_CTYPE data (%#lx) is in the program's paged heap (mapping %#lx)",
             (unsigned long)ctype, (unsigned long)mine_map);
    free(mine);
    freelocale(l);
    setlocale(LC_ALL, "C");
    printf("ok %s\n", n);
}

struct check {
    const char *name;
    void (*run)(void);
};

int main(int argc, char **argv) {
    if (argc < 2 || argc > 3) {
        fprintf(stderr, "usage: %s DATA_MIB [CHECK]\n", argv[0]);
        return 2;
    }
    data_bytes = (size_t)strtoul(argv[1], NULL, 10) << 20;
    if (data_bytes < (64UL << 20)) {
        fprintf(stderr, "DATA_MIB must be at least 64\n");
        return 2;
    }
    static const struct check checks[] = {
        {"malloc-api", check_api},          {"read-into-evicted", check_read_into_evicted},
        {"threads", check_threads},         {"fork", check_fork},
        {"mremap-grow", check_mremap},      {"madv-dontneed", check_dontneed},
        {"calloc-zero", check_calloc},      {"locale-unpaged", check_locale},
        {"map-populate", check_populate},   {"map-shared", check_shared},
        {"wipeonfork", check_wipeonfork},   {"mlock", check_mlock},
        {"dontfork", check_dontfork},       {"release-race", check_release_race},
    };
    int ran = 0;
    for (size_t i = 0; i < sizeof checks / sizeof checks[0]; i++) {
        if (argc == 3 && strcmp(argv[2], checks[i].name) != 0) continue;
        checks[i].run();
        fflush(stdout);
        ran++;
    }
    if (ran == 0) {
        fprintf(stderr, "no check named %s\n", argv[2]);
        return 2;
    }
    printf("all checks passed\n");
    return 0;
}
