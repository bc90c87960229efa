/* Exercises the farmem C API: errors before init, a region 8x the budget written and read
 * back, the counters, and freeing. Prints "capi ok" and exits 0 on success. */
#include <farmem.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FAIL(...) do { fprintf(stderr, __VA_ARGS__); fprintf(stderr, "\n"); exit(1); } while (0)

int main(void) {
    if (fm_alloc(4096) != NULL) FAIL("fm_alloc before fm_init must fail");
    if (strstr(fm_last_error(), "fm_init") == NULL) FAIL("unhelpful error: %s", fm_last_error());
    const uint64_t budget = 1u << 20;
    if (fm_init(budget, NULL) != 0) FAIL("fm_init: %s", fm_last_error());
    if (fm_init(budget, NULL) == 0) FAIL("a second fm_init must fail");
    const size_t len = 8 * budget;
    uint64_t *p = fm_alloc(len);
    if (p == NULL) FAIL("fm_alloc: %s", fm_last_error());
    size_t words = len / sizeof(uint64_t);
    for (size_t i = 0; i < words; i += 64) p[i] = i * 2654435761u + 1;
    for (size_t i = 0; i < words; i += 64)
        if (p[i] != i * 2654435761u + 1) FAIL("word %zu lost: %llu", i, (unsigned long long)p[i]);
    char buf[8192];
    long n = fm_stats(buf, sizeof buf);
    if (n <= 0 || (size_t)n >= sizeof buf) FAIL("fm_stats returned %ld", n);
    /* Pages came back from far memory: the host tier (the default) or a donor. */
    const char *k = strstr(buf, "\"faults_remote\":");
    const char *t = strstr(buf, "\"faults_tier\":");
    if (k == NULL || t == NULL) FAIL("no faults_remote / faults_tier in %s", buf);
    if (atol(k + strlen("\"faults_remote\":")) + atol(t + strlen("\"faults_tier\":")) <= 0)
        FAIL("no far fault counted: %s", buf);
    if (fm_free(p) != 0) FAIL("fm_free: %s", fm_last_error());
    if (fm_free(p) == 0) FAIL("double fm_free must fail");
    if (strstr(fm_last_error(), "not a pointer from fm_alloc") == NULL)
        FAIL("unhelpful error: %s", fm_last_error());
    printf("capi ok\n");
    return 0;
}
