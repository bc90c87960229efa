/* A program that locks its memory in RAM (memcached -k, databases, latency-sensitive servers):
 * mlockall(MCL_CURRENT | MCL_FUTURE), then MIB MiB from malloc and MIB MiB from mmap (also
 * mlock'ed on its own), filled and checked twice. Prints a checksum. Usage: mlock_all MIB */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>

static int pass(uint64_t *p, size_t words, uint64_t salt, uint64_t *sum) {
    for (size_t i = 0; i < words; i += 512) {
        if (p[i] != (i ^ salt)) { fprintf(stderr, "word %zu holds %llx\n", i, (unsigned long long)p[i]); return 1; }
        *sum += p[i];
    }
    return 0;
}

int main(int argc, char **argv) {
    size_t len = (argc > 1 ? strtoul(argv[1], NULL, 10) : 64) << 20, words = len / 8;
    if (mlockall(MCL_CURRENT | MCL_FUTURE)) { perror("mlockall"); return 2; }
    uint64_t *a = malloc(len);
    uint64_t *b = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (!a || b == MAP_FAILED) { perror("alloc"); return 2; }
    if (mlock(b, len)) { perror("mlock"); return 2; }
    for (size_t i = 0; i < words; i += 512) { a[i] = i ^ 0x5555; b[i] = i ^ 0xaaaa; }
    uint64_t sum = 0;
    for (int r = 0; r < 2; r++)
        if (pass(a, words, 0x5555, &sum) || pass(b, words, 0xaaaa, &sum)) return 1;
    printf("checksum %llu\n", (unsigned long long)sum);
    return 0;
}
