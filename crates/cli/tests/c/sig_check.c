/* A program that is stopped by a signal while its memory is far, and checks all of it in its
 * handler's wake: fills MIB MiB, creates DIR/filled, rewrites one word a page in passes until
 * SIGTERM or SIGINT, then checks every word and prints "ok passes=N" (exit 4: stopped by a
 * signal), or names the first wrong word (exit 9). Usage: sig_check MIB DIR */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static volatile sig_atomic_t stop;
static void on_signal(int sig) { (void)sig; stop = 1; }

int main(int argc, char **argv) {
    if (argc < 3) { fprintf(stderr, "usage: sig_check MIB DIR\n"); return 2; }
    size_t words = (strtoul(argv[1], NULL, 10) << 20) / 8;
    signal(SIGTERM, on_signal);
    signal(SIGINT, on_signal);
    unsigned long *p = malloc(words * 8);
    if (!p) { perror("malloc"); return 2; }
    for (size_t i = 0; i < words; i++) p[i] = i;
    char path[4096];
    snprintf(path, sizeof path, "%s/filled", argv[2]);
    FILE *f = fopen(path, "w");
    if (!f) { perror(path); return 2; }
    fclose(f);
    unsigned long pass = 0;
    while (!stop) {
        for (size_t i = 0; i < words && !stop; i += 512) {
            if (p[i] != i + pass) { fprintf(stderr, "BAD word %zu: %lu, expected %lu\n", i, p[i], i + pass); return 9; }
            p[i] = i + pass + 1;
        }
        if (!stop) pass++;
    }
    /* Interrupted in the middle of a pass: words before the stop hold i + pass + 1. */
    int in_next = 1;
    for (size_t i = 0; i < words; i++) {
        unsigned long want = i;
        if (i % 512 == 0) {
            if (in_next && p[i] != i + pass + 1) in_next = 0;
            want = in_next ? i + pass + 1 : i + pass;
        }
        if (p[i] != want) { fprintf(stderr, "BAD word %zu after the signal: %lu, expected %lu\n", i, p[i], want); return 9; }
    }
    printf("ok passes=%lu\n", pass);
    return 4;
}
