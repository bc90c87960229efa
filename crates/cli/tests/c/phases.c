/*
 * A program whose steps a test paces (crates/cli/tests/nothing_lost.rs): it writes and checks
 * a working set while the test breaks donors between its steps.
 *
 * Usage: phases DATA_MIB DIR STEP...
 *   fill:S       write every word of the working set with pattern S (page and word dependent)
 *   check:S      check every word once
 *   wait:NAME    create DIR/at-NAME, then wait, touching nothing, until DIR/NAME exists
 *   loop:S:NAME  create DIR/at-NAME, then check every word again and again until DIR/NAME
 *                exists (checked after each pass), then once more
 *   fork:S:NAME  fork a child that creates DIR/at-NAME (its runtime, if any, has started),
 *                waits, touching nothing, until DIR/NAME exists, then checks every word against
 *                S (the working set as at the fork) and exits; the parent goes on with the
 *                next step, and waits for its children at the end
 * Prints "ok PASSES" and exits 0, or prints "FAIL STEP: why" and exits 1 at the first wrong
 * word (a stale page holds another seed's pattern, a lost one zeros), or when a child did not
 * exit 0 ("FAIL child PID: status").
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static const char *dir;
static uint64_t *data;
static size_t words;
static unsigned long passes;

static inline uint64_t pattern(uint64_t seed, size_t i) {
    uint64_t x = (seed + 1) * 0x9E3779B97F4A7C15ULL ^ (uint64_t)i * 0xBF58476D1CE4E5B9ULL;
    return x ^ (x >> 29);
}

static void fill(uint64_t seed) {
    for (size_t i = 0; i < words; i++) data[i] = pattern(seed, i);
}

static void check(const char *step, uint64_t seed) {
    for (size_t i = 0; i < words; i++) {
        if (data[i] != pattern(seed, i)) {
            /* Which seed the word holds tells a stale page (older seed) from a lost one. */
            long held = -1;
            for (uint64_t s = 0; s < 16; s++)
                if (data[i] == pattern(s, i)) held = (long)s;
            printf("FAIL %s: page %zu word %zu holds %#llx (seed %ld), want seed %llu\n", step,
                   i * 8 / 4096, i % 512, (unsigned long long)data[i], held,
                   (unsigned long long)seed);
            fflush(stdout);
            exit(1);
        }
    }
    passes++;
}

static int exists(const char *name) {
    char p[4096];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    return access(p, F_OK) == 0;
}

static void announce(const char *name) {
    char p[4096];
    snprintf(p, sizeof p, "%s/at-%s", dir, name);
    int fd = open(p, O_CREAT | O_WRONLY, 0644);
    if (fd < 0) {
        perror(p);
        exit(2);
    }
    close(fd);
}

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: phases DATA_MIB DIR STEP...\n");
        return 2;
    }
    size_t bytes = strtoull(argv[1], NULL, 10) << 20;
    dir = argv[2];
    words = bytes / 8;
    data = malloc(bytes);
    if (!data) {
        printf("FAIL malloc(%zu)\n", bytes);
        return 1;
    }
    for (int a = 3; a < argc; a++) {
        const char *step = argv[a];
        char name[256];
        unsigned long long seed;
        if (sscanf(step, "fill:%llu", &seed) == 1) {
            fill(seed);
        } else if (sscanf(step, "check:%llu", &seed) == 1) {
            check(step, seed);
        } else if (sscanf(step, "wait:%255s", name) == 1) {
            announce(name);
            while (!exists(name)) usleep(20000);
        } else if (sscanf(step, "fork:%llu:%255s", &seed, name) == 2) {
            fflush(stdout);
            pid_t pid = fork();
            if (pid < 0) {
                perror("fork");
                return 2;
            }
            if (pid == 0) {
                announce(name);
                while (!exists(name)) usleep(20000);
                check(step, seed);
                printf("child ok\n");
                fflush(stdout);
                _exit(0);
            }
        } else if (sscanf(step, "loop:%llu:%255s", &seed, name) == 2) {
            announce(name);
            do check(step, seed);
            while (!exists(name));
            check(step, seed);
        } else {
            fprintf(stderr, "phases: unknown step %s\n", step);
            return 2;
        }
    }
    int status;
    pid_t child;
    while ((child = wait(&status)) > 0) {
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
            printf("FAIL child %d: status %#x\n", (int)child, status);
            return 1;
        }
    }
    printf("ok %lu\n", passes);
    return 0;
}
