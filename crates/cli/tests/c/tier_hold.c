/* Fills a buffer larger than farmem's budget with a pattern in every word, says "filled" and
 * waits for a line on stdin (a test kills the node meanwhile), then checks every word, fills a
 * second buffer as large (new far slabs), checks both, and prints a checksum. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

static uint64_t word(size_t i, uint64_t salt) { return (i * 0x9e3779b97f4a7c15ull) ^ salt; }

static int check(const uint64_t *b, size_t n, uint64_t salt, uint64_t *sum) {
    for (size_t i = 0; i < n; i++) {
        if (b[i] != word(i, salt)) {
            fprintf(stderr, "word %zu: %llx, expected %llx\n", i, (unsigned long long)b[i],
                    (unsigned long long)word(i, salt));
            return 1;
        }
        *sum += b[i] >> 32;
    }
    return 0;
}

int main(int argc, char **argv) {
    size_t mib = argc > 1 ? strtoul(argv[1], NULL, 10) : 96;
    size_t n = (mib << 20) / 8;
    uint64_t *a = malloc(n * 8), *b = malloc(n * 8), sum = 0;
    if (!a || !b) { perror("malloc"); return 2; }
    for (size_t i = 0; i < n; i++) a[i] = word(i, 1);
    printf("filled\n");
    fflush(stdout);
    char line[16];
    if (!fgets(line, sizeof line, stdin)) return 3;
    if (check(a, n, 1, &sum)) return 1;
    for (size_t i = 0; i < n; i++) b[i] = word(i, 2);
    if (check(a, n, 1, &sum) || check(b, n, 2, &sum)) return 1;
    printf("checksum %llu\n", (unsigned long long)sum);
    return 0;
}
