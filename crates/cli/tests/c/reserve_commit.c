/* What managed runtimes do with their heaps, in miniature: reserve address space PROT_NONE,
 * commit it in pieces (V8: mprotect of 256 KiB pages; HotSpot: mmap(MAP_FIXED) RW, G1's bitmaps
 * 4 KiB at a time), decommit (mprotect PROT_NONE + MADV_DONTNEED, or mmap(MAP_FIXED) PROT_NONE),
 * make ranges read-only and inaccessible and back while their pages are far. Every byte is
 * checked; prints a checksum. Usage: reserve_commit MIB (the heap written, ~3x the budget). */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define PIECE (256UL << 10)

static uint64_t word(size_t page, int round) { return page * 2654435761ULL + (uint64_t)round * 40503ULL + 1; }

static void fill(uint8_t *p, size_t len, size_t first_page, int round) {
    for (size_t o = 0; o < len; o += 4096) *(uint64_t *)(p + o) = word(first_page + o / 4096, round);
}

static int check(const uint8_t *p, size_t len, size_t first_page, int round, const char *what) {
    for (size_t o = 0; o < len; o += 4096) {
        uint64_t want = word(first_page + o / 4096, round), got = *(const uint64_t *)(p + o);
        if (got != want) {
            fprintf(stderr, "%s: page %zu holds %llx, expected %llx\n", what, first_page + o / 4096,
                    (unsigned long long)got, (unsigned long long)want);
            return 1;
        }
    }
    return 0;
}

int main(int argc, char **argv) {
    size_t mib = argc > 1 ? strtoul(argv[1], NULL, 10) : 96;
    size_t len = mib << 20, pieces = len / PIECE;
    uint64_t sum = 0;
    /* 1. V8: one reservation, pieces committed by mprotect. */
    uint8_t *v8 = mmap(NULL, len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (v8 == MAP_FAILED) { perror("mmap"); return 2; }
    for (size_t i = 0; i < pieces; i++) {
        if (mprotect(v8 + i * PIECE, PIECE, PROT_READ | PROT_WRITE)) { perror("mprotect"); return 2; }
        fill(v8 + i * PIECE, PIECE, i * (PIECE / 4096), 0);
    }
    /* Every other piece made inaccessible and back, every fourth read-only, while far. */
    for (size_t i = 0; i < pieces; i += 2) mprotect(v8 + i * PIECE, PIECE, PROT_NONE);
    for (size_t i = 0; i < pieces; i += 2) mprotect(v8 + i * PIECE, PIECE, PROT_READ | PROT_WRITE);
    for (size_t i = 1; i < pieces; i += 4) mprotect(v8 + i * PIECE, PIECE, PROT_READ);
    for (size_t i = 0; i < pieces; i++) {
        if (check(v8 + i * PIECE, PIECE, i * (PIECE / 4096), 0, "mprotect-committed")) return 1;
        sum += *(uint64_t *)(v8 + i * PIECE);
    }
    /* Read-only pages cannot be evicted (UFFDIO_MOVE takes writable ranges only): writable again. */
    for (size_t i = 1; i < pieces; i += 4) mprotect(v8 + i * PIECE, PIECE, PROT_READ | PROT_WRITE);
    /* Decommit a quarter the V8 way: PROT_NONE then discard; recommit reads zeros. */
    for (size_t i = 0; i < pieces; i += 4) {
        mprotect(v8 + i * PIECE, PIECE, PROT_NONE);
        madvise(v8 + i * PIECE, PIECE, MADV_DONTNEED);
        mprotect(v8 + i * PIECE, PIECE, PROT_READ | PROT_WRITE);
        for (size_t o = 0; o < PIECE; o += 4096)
            if (*(uint64_t *)(v8 + i * PIECE + o) != 0) { fprintf(stderr, "decommitted page not zero\n"); return 1; }
    }
    munmap(v8, len);
    /* 2. HotSpot: one reservation, committed by mmap(MAP_FIXED) in 4 KiB pages and big pieces. */
    uint8_t *hs = mmap(NULL, len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (hs == MAP_FAILED) { perror("mmap"); return 2; }
    size_t small = 1024 * 4096; /* the first 4 MiB page by page, like G1's bitmaps */
    for (size_t o = 0; o < small; o += 4096)
        if (mmap(hs + o, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) == MAP_FAILED) { perror("mmap fixed"); return 2; }
    if (mmap(hs + small, len - small, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) == MAP_FAILED) { perror("mmap fixed"); return 2; }
    fill(hs, len, 0, 1);
    /* Uncommit and recommit a piece in the middle (G1 shrinking and growing). */
    size_t mid = (len / 2) & ~(PIECE - 1);
    mmap(hs + mid, PIECE, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0);
    mmap(hs + mid, PIECE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
    fill(hs + mid, PIECE, mid / 4096, 1);
    if (check(hs, len, 0, 1, "mmap-committed")) return 1;
    for (size_t o = 0; o < len; o += 4096) sum += *(uint64_t *)(hs + o);
    printf("checksum %llu\n", (unsigned long long)sum);
    return 0;
}
