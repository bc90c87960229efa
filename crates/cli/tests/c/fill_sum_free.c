/* The fill-sum-free loop of numpy-style programs: ROUNDS times, malloc a block of MIB MiB, write
 * every page, (with "sum") read every page back and check it, then free the block. Under farmem
 * the freed block must be forgotten before the next malloc reuses its addresses: its evicted
 * pages are never fetched back, so the only bytes fetched are those the sums read.
 * Usage: fill_sum_free MIB ROUNDS sum|nosum. Prints "ok" and the checksum. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv) {
    if (argc != 4) { fprintf(stderr, "usage: fill_sum_free MIB ROUNDS sum|nosum\n"); return 2; }
    size_t len = strtoul(argv[1], NULL, 10) << 20, pages = len / 4096;
    int rounds = atoi(argv[2]), sum = strcmp(argv[3], "sum") == 0;
    uint64_t total = 0;
    for (int r = 0; r < rounds; r++) {
        uint8_t *b = malloc(len);
        if (!b) { perror("malloc"); return 2; }
        for (size_t p = 0; p < pages; p++) memset(b + p * 4096, (int)((p + r) & 0xff), 4096);
        if (sum) {
            for (size_t p = 0; p < pages; p++) {
                uint8_t want = (uint8_t)((p + r) & 0xff);
                if (b[p * 4096] != want || b[p * 4096 + 4095] != want) {
                    fprintf(stderr, "round %d page %zu: %u, expected %u\n", r, p, b[p * 4096], want);
                    return 1;
                }
                total += want;
            }
        }
        free(b);
    }
    printf("ok %llu\n", (unsigned long long)total);
    return 0;
}
