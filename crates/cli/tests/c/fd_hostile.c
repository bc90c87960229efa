/* What programs do with their descriptor table, done while most of the program's memory is
 * far: dup2 a file onto every number from 3 to 1023 (a shell's `exec N>file`, the flock idiom's
 * 200), close every number (a daemon), close_range and closefrom (what subprocess runs before
 * exec), and a forked child that closes everything and execs. Every page is checked before and
 * after, and rewritten; prints a checksum. Usage: fd_hostile MIB (the data, ~3x the budget). */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

static uint64_t word(size_t page, int round) { return page * 0x9E3779B97F4A7C15ULL + (uint64_t)round * 131ULL + 3; }

static int pass(uint8_t *p, size_t pages, int round, int rewrite, uint64_t *sum, const char *what) {
    for (size_t i = 0; i < pages; i++) {
        uint64_t *w = (uint64_t *)(p + i * 4096), want = word(i, round);
        if (*w != want) {
            fprintf(stderr, "%s: page %zu holds %llx, expected %llx\n", what, i,
                    (unsigned long long)*w, (unsigned long long)want);
            return 1;
        }
        *sum += *w;
        if (rewrite) *w = word(i, round + 1);
    }
    return 0;
}

int main(int argc, char **argv) {
    size_t mib = argc > 1 ? strtoul(argv[1], NULL, 10) : 96;
    size_t pages = (mib << 20) / 4096;
    uint64_t sum = 0;
    int round = 0;
    uint8_t *p = mmap(NULL, mib << 20, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) { perror("mmap"); return 2; }
    for (size_t i = 0; i < pages; i++) *(uint64_t *)(p + i * 4096) = word(i, 0);
    int file = open("/dev/null", O_WRONLY);
    if (file < 0) { perror("open"); return 2; }
    /* 1. dup2 onto every number (some are refused: those are farmem's). */
    int refused = 0;
    for (int fd = 3; fd < 1024; fd++)
        if (fd != file && dup2(file, fd) < 0) refused++;
    if (pass(p, pages, round, 1, &sum, "after dup2 onto every descriptor")) return 1;
    round++;
    /* 2. close every number. */
    for (int fd = 3; fd < 1024; fd++) close(fd);
    if (pass(p, pages, round, 1, &sum, "after closing every descriptor")) return 1;
    round++;
    /* 3. close_range and closefrom. */
    close_range(3, ~0U, 0);
    closefrom(3);
    if (pass(p, pages, round, 1, &sum, "after close_range and closefrom")) return 1;
    round++;
    /* 4. subprocess's pattern: fork, close everything, exec. */
    pid_t pid = fork();
    if (pid == 0) {
        close_range(3, ~0U, 0);
        execl("/bin/true", "true", (char *)NULL);
        _exit(127);
    }
    int status = 0;
    if (pid < 0 || waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        fprintf(stderr, "the child failed (status %d)\n", status);
        return 1;
    }
    if (pass(p, pages, round, 1, &sum, "after a child closed everything and exec'd")) return 1;
    round++;
    if (pass(p, pages, round, 0, &sum, "last pass")) return 1;
    printf("checksum %llu\n", (unsigned long long)sum);
    fprintf(stderr, "dup2 refused %d times\n", refused);
    return 0;
}
