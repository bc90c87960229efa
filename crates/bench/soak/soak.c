/* Programs of the soak (farmem-bench soak) that check their own memory and print a result that
 * depends only on their arguments, so the harness compares it with a run without farmem.
 *
 *   soak forker MIB ROUNDS   a forking server: each round forks two children that check every
 *                            word of the table as it was at the fork and write memory of their
 *                            own, while the parent rewrites the table (pages in eviction).
 *   soak threads MIB THREADS ROUNDS
 *                            threads each write and verify their own part of one heap, round
 *                            after round; then the heap's checksum.
 *
 * Exit status 0 and a last line "ok ..." when every check held; 1 with "FAIL ..." otherwise. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static uint64_t pattern(uint64_t seed, size_t i) {
    uint64_t x = seed * 0x9E3779B97F4A7C15ULL + i;
    x ^= x >> 31;
    x *= 0xBF58476D1CE4E5B9ULL;
    return x ^ (x >> 29);
}

static void fill(uint64_t *p, size_t words, uint64_t seed) {
    for (size_t i = 0; i < words; i++) p[i] = pattern(seed, i);
}

/* The index of the first wrong word, or SIZE_MAX. */
static size_t first_wrong(const uint64_t *p, size_t words, uint64_t seed) {
    for (size_t i = 0; i < words; i++)
        if (p[i] != pattern(seed, i)) return i;
    return SIZE_MAX;
}

static uint64_t checksum(const uint64_t *p, size_t words) {
    uint64_t s = 0;
    for (size_t i = 0; i < words; i++) s = s * 31 + p[i];
    return s;
}

static int forker(size_t bytes, int rounds) {
    size_t words = bytes / 8;
    uint64_t *table = malloc(bytes);
    if (!table) { printf("FAIL forker: malloc\n"); return 1; }
    fill(table, words, 1);
    for (int r = 1; r <= rounds; r++) {
        fflush(stdout);
        pid_t kids[2];
        for (int k = 0; k < 2; k++) {
            kids[k] = fork();
            if (kids[k] < 0) { printf("FAIL forker: fork\n"); return 1; }
            if (kids[k] == 0) {
                size_t bad = first_wrong(table, words, (uint64_t)r);
                if (bad != SIZE_MAX) _exit(3);
                size_t own = bytes / 4 / 8;
                uint64_t *mine = malloc(own * 8);
                if (!mine) _exit(4);
                fill(mine, own, 1000 + (uint64_t)k);
                _exit(first_wrong(mine, own, 1000 + (uint64_t)k) == SIZE_MAX ? 0 : 5);
            }
        }
        fill(table, words, (uint64_t)r + 1); /* the parent writes on while its children check */
        for (int k = 0; k < 2; k++) {
            int status = 0;
            if (waitpid(kids[k], &status, 0) != kids[k] || !WIFEXITED(status) ||
                WEXITSTATUS(status) != 0) {
                printf("FAIL forker: round %d child %d status %#x\n", r, k, status);
                return 1;
            }
        }
        size_t bad = first_wrong(table, words, (uint64_t)r + 1);
        if (bad != SIZE_MAX) { printf("FAIL forker: round %d word %zu\n", r, bad); return 1; }
    }
    printf("ok forker rounds %d checksum %016llx\n", rounds,
           (unsigned long long)checksum(table, words));
    return 0;
}

struct part { uint64_t *p; size_t words; int id, rounds, failed; };

static void *worker(void *arg) {
    struct part *t = arg;
    for (int r = 0; r < t->rounds && !t->failed; r++) {
        uint64_t seed = (uint64_t)t->id * 1000 + (uint64_t)r;
        fill(t->p, t->words, seed);
        if (first_wrong(t->p, t->words, seed) != SIZE_MAX) t->failed = 1;
    }
    return NULL;
}

static int threads(size_t bytes, int n, int rounds) {
    if (n < 1 || n > 64) { printf("FAIL threads: 1 to 64 threads\n"); return 1; }
    uint64_t *heap = malloc(bytes);
    if (!heap) { printf("FAIL threads: malloc\n"); return 1; }
    size_t per = bytes / 8 / (size_t)n;
    pthread_t tid[64];
    struct part parts[64];
    for (int i = 0; i < n; i++) {
        parts[i] = (struct part){heap + per * (size_t)i, per, i, rounds, 0};
        if (pthread_create(&tid[i], NULL, worker, &parts[i])) {
            printf("FAIL threads: pthread_create\n");
            return 1;
        }
    }
    for (int i = 0; i < n; i++) pthread_join(tid[i], NULL);
    for (int i = 0; i < n; i++)
        if (parts[i].failed) { printf("FAIL threads: thread %d read back wrong data\n", i); return 1; }
    printf("ok threads %d rounds %d checksum %016llx\n", n, rounds,
           (unsigned long long)checksum(heap, per * (size_t)n));
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 4 && strcmp(argv[1], "forker") == 0)
        return forker(strtoull(argv[2], NULL, 10) << 20, atoi(argv[3]));
    if (argc == 5 && strcmp(argv[1], "threads") == 0)
        return threads(strtoull(argv[2], NULL, 10) << 20, atoi(argv[3]), atoi(argv[4]));
    fprintf(stderr, "usage: %s forker MIB ROUNDS | threads MIB THREADS ROUNDS\n", argv[0]);
    return 2;
}
