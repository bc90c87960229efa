/* Grows mappings with mremap(2), for tests/run_c_program.rs.
 *
 * Usage: mremap_grow MIB
 *
 * Twice: maps 32 MiB (a region: above --mmap-threshold), fills it, grows it to MIB MiB (first
 * moving it, MREMAP_MAYMOVE; then in place, into address space freed for it), fills the grown
 * part, checks every word of both parts, and holds the mapping for 1.5 s (the preload library
 * measures the memory outside its regions about once a second). Prints "ok moved", "ok in-place"
 * and exits 0, or "BAD ..." and exits 3.
 */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

static uint64_t word(size_t i, uint64_t seed) { return (i * 0x9E3779B97F4A7C15ULL) ^ seed; }

static void fill(uint64_t *p, size_t from, size_t to, uint64_t seed) {
    for (size_t i = from; i < to; i++) p[i] = word(i, seed);
}

static int check(const uint64_t *p, size_t words, uint64_t seed) {
    for (size_t i = 0; i < words; i++)
        if (p[i] != word(i, seed)) return 0;
    return 1;
}

static int grow(const char *name, size_t big, int in_place) {
    size_t first = 32UL << 20;
    uint64_t *p;
    if (in_place) {
        /* Reserve the whole span, then give back all but the first part: the growth has room. */
        p = mmap(NULL, big, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED || munmap((char *)p + first, big - first) != 0) {
            printf("BAD %s: mmap\n", name);
            return 0;
        }
    } else {
        p = mmap(NULL, first, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED) {
            printf("BAD %s: mmap\n", name);
            return 0;
        }
    }
    fill(p, 0, first / 8, 7);
    uint64_t *q = mremap(p, first, big, in_place ? 0 : MREMAP_MAYMOVE);
    if (q == MAP_FAILED || (in_place && q != p)) {
        printf("BAD %s: mremap\n", name);
        return 0;
    }
    fill(q, first / 8, big / 8, 7);
    if (!check(q, big / 8, 7)) {
        printf("BAD %s: data\n", name);
        return 0;
    }
    usleep(1500 * 1000);
    if (!check(q, big / 8, 7)) {
        printf("BAD %s: data after the hold\n", name);
        return 0;
    }
    munmap(q, big);
    printf("ok %s\n", name);
    return 1;
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: mremap_grow MIB\n");
        return 2;
    }
    size_t big = (size_t)atoi(argv[1]) << 20;
    int ok = grow("moved", big, 0);
    ok &= grow("in-place", big, 1);
    return ok ? 0 : 3;
}
