/* farmem-demo: the program the container image runs under farmem. It fills MIB MiB of heap
 * (default 96) with a pattern that depends on each byte's position, reads it all back, checks
 * it and prints one line with the checksum. The output is the same with and without farmem;
 * under `farmem run --local-mem 32MiB` most of its pages go far and come back.
 * Dynamically linked on purpose: farmem reaches a program's heap through LD_PRELOAD.
 * Usage: farmem-demo [MIB]. Exit status 0 when every byte read back is right, 1 otherwise. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

/* The byte at position i: a multiplicative hash, so a page misplaced or zeroed is noticed. */
static uint8_t pattern(size_t i) { return (uint8_t)((i * 2654435761u) >> 13); }

int main(int argc, char **argv) {
    size_t mib = argc > 1 ? strtoul(argv[1], NULL, 10) : 96;
    if (mib == 0) {
        fprintf(stderr, "usage: farmem-demo [MIB] (MIB > 0)\n");
        return 2;
    }
    size_t len = mib << 20;
    uint8_t *buf = malloc(len);
    if (!buf) {
        perror("farmem-demo: malloc");
        return 2;
    }
    for (size_t i = 0; i < len; i++) buf[i] = pattern(i);
    uint64_t sum = 1469598103934665603ull; /* FNV-1a over every byte, in order */
    for (size_t i = 0; i < len; i++) {
        if (buf[i] != pattern(i)) {
            fprintf(stderr, "farmem-demo: byte %zu is %u, expected %u\n", i, buf[i], pattern(i));
            return 1;
        }
        sum = (sum ^ buf[i]) * 1099511628211ull;
    }
    free(buf);
    printf("farmem-demo: %zu MiB written and read back, checksum %016llx\n", mib,
           (unsigned long long)sum);
    return 0;
}
