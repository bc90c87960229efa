/* A sequential scan over a buffer larger than farmem's budget: writes every page, then reads
 * them all back twice in order and checks the bytes. Prints the checksum. Used to see the
 * prefetcher work under `farmem run` and to record a page-access trace. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv) {
    size_t mib = argc > 1 ? strtoul(argv[1], NULL, 10) : 96;
    size_t len = mib << 20, pages = len / 4096;
    uint8_t *buf = malloc(len);
    if (!buf) { perror("malloc"); return 2; }
    for (size_t p = 0; p < pages; p++) buf[p * 4096] = (uint8_t)(p * 7 + 1);
    uint64_t sum = 0;
    for (int pass = 0; pass < 2; pass++) {
        for (size_t p = 0; p < pages; p++) {
            uint8_t want = (uint8_t)(p * 7 + 1);
            if (buf[p * 4096] != want) {
                fprintf(stderr, "page %zu: %u, expected %u\n", p, buf[p * 4096], want);
                return 1;
            }
            sum += buf[p * 4096];
        }
    }
    printf("checksum %llu\n", (unsigned long long)sum);
    free(buf);
    return 0;
}
