/* Memory a program keeps read-only (or inaccessible) for a while: filled, made PROT_READ and
 * read three times, a quarter of it made PROT_NONE while the rest is read again, then made
 * writable, rewritten and read. Every page is checked; prints a checksum. Usage:
 * readonly_scan MIB (the data, ~3x the budget). */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>

static uint64_t word(size_t page, int round) { return page * 11400714819323198485ULL + (uint64_t)round * 977ULL + 7; }

static int pass(const uint8_t *p, size_t from, size_t to, int round, uint64_t *sum, const char *what) {
    for (size_t i = from; i < to; i++) {
        uint64_t want = word(i, round), got = *(const uint64_t *)(p + i * 4096);
        if (got != want) {
            fprintf(stderr, "%s: page %zu holds %llx, expected %llx\n", what, i,
                    (unsigned long long)got, (unsigned long long)want);
            return 1;
        }
        *sum += got;
    }
    return 0;
}

int main(int argc, char **argv) {
    size_t mib = argc > 1 ? strtoul(argv[1], NULL, 10) : 96;
    size_t len = mib << 20, pages = len / 4096, quarter = pages / 4;
    uint64_t sum = 0;
    uint8_t *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) { perror("mmap"); return 2; }
    for (size_t i = 0; i < pages; i++) *(uint64_t *)(p + i * 4096) = word(i, 0);
    if (mprotect(p, len, PROT_READ)) { perror("mprotect"); return 2; }
    for (int r = 0; r < 3; r++)
        if (pass(p, 0, pages, 0, &sum, "read-only")) return 1;
    if (mprotect(p, quarter * 4096, PROT_NONE)) { perror("mprotect"); return 2; }
    if (pass(p, quarter, pages, 0, &sum, "read-only beside PROT_NONE")) return 1;
    if (mprotect(p, len, PROT_READ | PROT_WRITE)) { perror("mprotect"); return 2; }
    if (pass(p, 0, pages, 0, &sum, "writable again")) return 1;
    for (size_t i = 0; i < pages; i++) *(uint64_t *)(p + i * 4096) = word(i, 1);
    if (pass(p, 0, pages, 1, &sum, "rewritten")) return 1;
    printf("checksum %llu\n", (unsigned long long)sum);
    return 0;
}
