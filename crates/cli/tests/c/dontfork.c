/* A heap marked MADV_DONTFORK (as V8 marks each heap page) and a small ordinary buffer, both
 * written, then fork(): the child checks the buffer, the parent then checks the heap. Usage:
 * dontfork HEAP_MIB. Prints the checksum. */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

static uint64_t word(size_t page) { return page * 2654435761ULL + 7; }

int main(int argc, char **argv) {
    size_t heap_len = (argc > 1 ? strtoul(argv[1], NULL, 10) : 96) << 20, buf_len = 8UL << 20;
    uint8_t *heap = mmap(NULL, heap_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    uint8_t *buf = mmap(NULL, buf_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (heap == MAP_FAILED || buf == MAP_FAILED) { perror("mmap"); return 2; }
    if (madvise(heap, heap_len, MADV_DONTFORK)) { perror("madvise"); return 2; }
    for (size_t o = 0; o < buf_len; o += 4096) *(uint64_t *)(buf + o) = word(o / 4096) ^ 1;
    for (size_t o = 0; o < heap_len; o += 4096) *(uint64_t *)(heap + o) = word(o / 4096);
    pid_t pid = fork();
    if (pid < 0) { perror("fork"); return 2; }
    if (pid == 0) {
        for (size_t o = 0; o < buf_len; o += 4096)
            if (*(uint64_t *)(buf + o) != (word(o / 4096) ^ 1)) _exit(3);
        _exit(0);
    }
    int st;
    waitpid(pid, &st, 0);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) { fprintf(stderr, "the child saw wrong bytes\n"); return 1; }
    uint64_t sum = 0;
    for (size_t o = 0; o < heap_len; o += 4096) {
        uint64_t w = *(uint64_t *)(heap + o);
        if (w != word(o / 4096)) { fprintf(stderr, "heap page %zu wrong\n", o / 4096); return 1; }
        sum += w;
    }
    printf("checksum %llu\n", (unsigned long long)sum);
    return 0;
}
