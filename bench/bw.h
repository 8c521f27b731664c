/*
 * bw.h: the memory read-bandwidth probe shared by the benchmarks (b_kern.c,
 * b_decode.c): sum a large buffer over the pool and report the best GB/s of
 * several passes. Static functions for bench programs only (one includer each).
 */
#ifndef STRATA_BENCH_BW_H
#define STRATA_BENCH_BW_H

#include <stdint.h>
#include <stdio.h>
#include "base.h"
#include "pool.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

typedef struct { const uint64_t *buf; int64_t n_lines; uint64_t sums[64 * 8]; } bw_ctx;

#if defined(__x86_64__)
/* Four independent 256-bit adds per 128 bytes: enough loads in flight that the
 * core, not the loop, is never the limit. */
__attribute__((target("avx2"))) static uint64_t bw_sum_lines(const uint64_t *p, int64_t n_lines) {
    __m256i a = _mm256_setzero_si256(), b = a, c = a, d = a;
    for (int64_t i = 0; i + 1 < n_lines; i += 2) {
        const __m256i *q = (const __m256i *)(const void *)(p + i * 8);
        a = _mm256_add_epi64(a, _mm256_load_si256(q));
        b = _mm256_add_epi64(b, _mm256_load_si256(q + 1));
        c = _mm256_add_epi64(c, _mm256_load_si256(q + 2));
        d = _mm256_add_epi64(d, _mm256_load_si256(q + 3));
    }
    a = _mm256_add_epi64(_mm256_add_epi64(a, b), _mm256_add_epi64(c, d));
    uint64_t t[4];
    _mm256_storeu_si256((__m256i *)(void *)t, a);
    return t[0] + t[1] + t[2] + t[3];
}
#else
static uint64_t bw_sum_lines(const uint64_t *p, int64_t n_lines) {
    uint64_t a = 0, b = 0, c = 0, d = 0;
    for (int64_t i = 0; i < n_lines * 8; i += 4) { a += p[i]; b += p[i + 1]; c += p[i + 2]; d += p[i + 3]; }
    return a + b + c + d;
}
#endif

static void bw_fn(void *vctx, int64_t i0, int64_t i1, int tid) {
    bw_ctx *c = vctx;
    c->sums[tid * 8] += bw_sum_lines(c->buf + i0 * 8, i1 - i0);
}

/* Best-of-reps GB/s of reading the whole buffer (bytes a multiple of 128, buf
 * 32-byte aligned) with the pool's threads. */
static double bw_read(pool *p, const uint64_t *buf, size_t bytes, int reps) {
    bw_ctx c = {.buf = buf, .n_lines = (int64_t)(bytes / 64)};
    double best = 0;
    for (int r = 0; r < reps; r++) {
        double t0 = base_now();
        pool_for(p, c.n_lines, 4096, bw_fn, &c);
        double dt = base_now() - t0;
        if (bytes / dt / 1e9 > best) best = bytes / dt / 1e9;
    }
    return best;
}

/* Other processes share the cores and the memory bus: the load average says how
 * much to trust a run. */
static void bw_print_load(const char *what) {
    FILE *f = fopen("/proc/loadavg", "r");
    double l1 = -1;
    if (f) { if (fscanf(f, "%lf", &l1) != 1) l1 = -1; fclose(f); }
    if (l1 >= 0) printf("%s: 1-minute load average %.2f\n", what, l1);
}

#endif
