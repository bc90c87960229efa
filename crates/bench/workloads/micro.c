/*
 * micro.c — Leap's page-access microbenchmarks, as used by `farmem-bench compare`.
 *
 * Usage: micro PATTERN WSS_BYTES PASSES [SEED]
 *   PATTERN: seq | stride:K | random
 *
 * The working set is one malloc'd buffer of WSS_BYTES, split in 4 KiB pages. An initial pass
 * fills every page completely with pseudo-random words (so neither zram nor a zero-page check
 * can compress it away) and remembers the first byte of each page. Then PASSES passes each read
 * one byte of every page, in the order the pattern gives:
 *   seq       pages 0, 1, 2, ...
 *   stride:K  pages 0, K, 2K, ..., then 1, 1+K, ..., so every page once per pass
 *   random    a fresh random permutation of the pages each pass
 * Every access is timed with clock_gettime(CLOCK_MONOTONIC) (every access, not a sample; the
 * ~20-40 ns the two clock reads cost are included in each figure) into a log-linear histogram
 * (32 sub-buckets per power of two, <= 1.6% error). The sum of the bytes read is checked against
 * the initial pass, so a paging system that loses or corrupts a page makes this exit with 3.
 *
 * Output: one JSON line on stdout:
 *   {"pattern":..,"pages":..,"passes":..,"accesses":..,"init_s":..,"access_s":..,
 *    "avg_ns":..,"p50_ns":..,"p99_ns":..,"max_ns":..,"checksum_ok":true}
 */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/mman.h>

#define PAGE 4096UL
#define SUB_BITS 6
#define SUB (1UL << SUB_BITS)
#define NBUCKETS 2048

static uint64_t hist[NBUCKETS];

static inline uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

static inline uint64_t xorshift(uint64_t *s) {
    uint64_t x = *s;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    *s = x;
    return x;
}

/* Buckets: values below 64 ns exactly; above, 32 buckets per power of two (<= 1.6% error
 * when a bucket is reported by its middle). */
static inline unsigned bucket_of(uint64_t v) {
    if (v < SUB) return (unsigned)v;
    unsigned msb = 63 - (unsigned)__builtin_clzll(v);
    unsigned shift = msb - (SUB_BITS - 1);
    unsigned idx = (unsigned)SUB + (shift - 1) * (unsigned)(SUB / 2) + (unsigned)((v >> shift) - SUB / 2);
    return idx < NBUCKETS ? idx : NBUCKETS - 1;
}

static inline uint64_t bucket_value(unsigned idx) {
    if (idx < SUB) return idx;
    unsigned shift = (idx - (unsigned)SUB) / (unsigned)(SUB / 2) + 1;
    uint64_t m = (idx - SUB) % (SUB / 2) + SUB / 2;
    return (m << shift) + ((1ULL << shift) >> 1);
}

static uint64_t percentile(uint64_t total, double q) {
    uint64_t want = (uint64_t)(q * (double)total);
    if (want >= total) want = total - 1;
    uint64_t seen = 0;
    for (unsigned i = 0; i < NBUCKETS; i++) {
        seen += hist[i];
        if (seen > want) return bucket_value(i);
    }
    return 0;
}

static int usage(void) {
    fprintf(stderr, "usage: micro seq|stride:K|random WSS_BYTES PASSES [SEED]\n");
    return 2;
}

int main(int argc, char **argv) {
    if (argc < 4) return usage();
    const char *pattern = argv[1];
    uint64_t stride = 1;
    int random_order = 0;
    if (strcmp(pattern, "seq") == 0) {
        stride = 1;
    } else if (strncmp(pattern, "stride:", 7) == 0) {
        char *end = NULL;
        stride = strtoull(pattern + 7, &end, 10);
        if (!end || *end || stride == 0) return usage();
    } else if (strcmp(pattern, "random") == 0) {
        random_order = 1;
    } else {
        return usage();
    }
    uint64_t wss = strtoull(argv[2], NULL, 10);
    long passes = strtol(argv[3], NULL, 10);
    uint64_t seed = argc > 4 ? strtoull(argv[4], NULL, 10) : 42;
    if (seed == 0) seed = 42;
    uint64_t pages = wss / PAGE;
    if (pages == 0 || passes <= 0) return usage();

    unsigned char *buf = malloc(pages * PAGE + PAGE);
    if (!buf) {
        fprintf(stderr, "micro: cannot allocate %llu bytes\n", (unsigned long long)(pages * PAGE));
        return 1;
    }
    buf = (unsigned char *)(((uintptr_t)buf + PAGE - 1) & ~(PAGE - 1));
    madvise(buf, pages * PAGE, MADV_NOHUGEPAGE);
    uint32_t *order = NULL;
    if (random_order) {
        order = malloc(pages * sizeof(uint32_t));
        if (!order) return 1;
        for (uint64_t i = 0; i < pages; i++) order[i] = (uint32_t)i;
    }

    uint64_t t0 = now_ns();
    uint64_t rng = seed;
    uint64_t expected = 0;
    for (uint64_t p = 0; p < pages; p++) {
        uint64_t *w = (uint64_t *)(buf + p * PAGE);
        for (unsigned i = 0; i < PAGE / 8; i++) w[i] = xorshift(&rng);
        expected += buf[p * PAGE];
    }
    uint64_t t1 = now_ns();

    uint64_t accesses = 0, sum_ns = 0, max_ns = 0;
    int ok = 1;
    volatile unsigned char *vbuf = buf;
    for (long pass = 0; pass < passes; pass++) {
        uint64_t sum = 0;
        if (random_order) {
            for (uint64_t i = pages - 1; i > 0; i--) {
                uint64_t j = xorshift(&rng) % (i + 1);
                uint32_t t = order[i];
                order[i] = order[j];
                order[j] = t;
            }
        }
        uint64_t start = 0, k = 0;
        for (uint64_t n = 0; n < pages; n++) {
            uint64_t p;
            if (random_order) {
                p = order[n];
            } else {
                p = start + k * stride;
                if (p >= pages) {
                    start++;
                    k = 0;
                    p = start;
                }
                k++;
            }
            uint64_t a = now_ns();
            unsigned char v = vbuf[p * PAGE];
            uint64_t b = now_ns();
            sum += v;
            uint64_t d = b - a;
            hist[bucket_of(d)]++;
            sum_ns += d;
            if (d > max_ns) max_ns = d;
            accesses++;
        }
        if (sum != expected) {
            fprintf(stderr, "micro: checksum mismatch in pass %ld: read %llu, wrote %llu\n", pass,
                    (unsigned long long)sum, (unsigned long long)expected);
            ok = 0;
        }
    }
    uint64_t t2 = now_ns();

    printf("{\"pattern\":\"%s\",\"pages\":%llu,\"passes\":%ld,\"accesses\":%llu,"
           "\"init_s\":%.6f,\"access_s\":%.6f,\"avg_ns\":%.1f,\"p50_ns\":%llu,\"p99_ns\":%llu,"
           "\"max_ns\":%llu,\"checksum_ok\":%s}\n",
           pattern, (unsigned long long)pages, passes, (unsigned long long)accesses,
           (double)(t1 - t0) / 1e9, (double)(t2 - t1) / 1e9,
           (double)sum_ns / (double)accesses, (unsigned long long)percentile(accesses, 0.50),
           (unsigned long long)percentile(accesses, 0.99), (unsigned long long)max_ns,
           ok ? "true" : "false");
    return ok ? 0 : 3;
}
