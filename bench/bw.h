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
/* Four streams a quarter of the range apart, each prefetched 1 KB ahead, 512-bit
 * loads where the CPU has them: the access pattern of the decode kernels. A single
 * stream of 256-bit loads without prefetch (the probe before) read 61-62 GB/s with 2
 * threads where this reads 76-78 in the same process (dev VM, 6 interleaved rounds),
 * and the bf16 matvec beat it by 7-12%, so ratios against it were flattering. */
#define BW_PF 1024
__attribute__((target("avx512f"))) static uint64_t bw_sum_lines512(const uint64_t *p, int64_t n_lines) {
    const int64_t q = n_lines / 4;
    const char *s0 = (const char *)p, *s1 = s0 + q * 64, *s2 = s1 + q * 64, *s3 = s2 + q * 64;
    __m512i a = _mm512_setzero_si512(), b = a, c = a, d = a;
    for (int64_t i = 0; i < q; i++) {
        const int64_t o = i * 64;
        _mm_prefetch(s0 + o + BW_PF, _MM_HINT_T0);
        _mm_prefetch(s1 + o + BW_PF, _MM_HINT_T0);
        _mm_prefetch(s2 + o + BW_PF, _MM_HINT_T0);
        _mm_prefetch(s3 + o + BW_PF, _MM_HINT_T0);
        a = _mm512_add_epi64(a, _mm512_load_si512(s0 + o));
        b = _mm512_add_epi64(b, _mm512_load_si512(s1 + o));
        c = _mm512_add_epi64(c, _mm512_load_si512(s2 + o));
        d = _mm512_add_epi64(d, _mm512_load_si512(s3 + o));
    }
    for (int64_t i = 4 * q; i < n_lines; i++) a = _mm512_add_epi64(a, _mm512_load_si512(p + i * 8));
    return (uint64_t)_mm512_reduce_add_epi64(_mm512_add_epi64(_mm512_add_epi64(a, b), _mm512_add_epi64(c, d)));
}
__attribute__((target("avx2"))) static uint64_t bw_sum_lines256(const uint64_t *p, int64_t n_lines) {
    const int64_t q = n_lines / 4;
    const char *s0 = (const char *)p, *s1 = s0 + q * 64, *s2 = s1 + q * 64, *s3 = s2 + q * 64;
    __m256i a = _mm256_setzero_si256(), b = a, c = a, d = a;
    for (int64_t i = 0; i < q; i++) {
        const int64_t o = i * 64;
        _mm_prefetch(s0 + o + BW_PF, _MM_HINT_T0);
        _mm_prefetch(s1 + o + BW_PF, _MM_HINT_T0);
        _mm_prefetch(s2 + o + BW_PF, _MM_HINT_T0);
        _mm_prefetch(s3 + o + BW_PF, _MM_HINT_T0);
        a = _mm256_add_epi64(a, _mm256_add_epi64(_mm256_load_si256((const __m256i *)(const void *)(s0 + o)),
                                                 _mm256_load_si256((const __m256i *)(const void *)(s0 + o + 32))));
        b = _mm256_add_epi64(b, _mm256_add_epi64(_mm256_load_si256((const __m256i *)(const void *)(s1 + o)),
                                                 _mm256_load_si256((const __m256i *)(const void *)(s1 + o + 32))));
        c = _mm256_add_epi64(c, _mm256_add_epi64(_mm256_load_si256((const __m256i *)(const void *)(s2 + o)),
                                                 _mm256_load_si256((const __m256i *)(const void *)(s2 + o + 32))));
        d = _mm256_add_epi64(d, _mm256_add_epi64(_mm256_load_si256((const __m256i *)(const void *)(s3 + o)),
                                                 _mm256_load_si256((const __m256i *)(const void *)(s3 + o + 32))));
    }
    for (int64_t i = 4 * q; i < n_lines; i++)
        a = _mm256_add_epi64(a, _mm256_load_si256((const __m256i *)(const void *)(p + i * 8)));
    a = _mm256_add_epi64(_mm256_add_epi64(a, b), _mm256_add_epi64(c, d));
    uint64_t t[4];
    _mm256_storeu_si256((__m256i *)(void *)t, a);
    return t[0] + t[1] + t[2] + t[3];
}
static uint64_t bw_sum_lines(const uint64_t *p, int64_t n_lines) {
    return __builtin_cpu_supports("avx512f") ? bw_sum_lines512(p, n_lines) : bw_sum_lines256(p, n_lines);
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
 * 64-byte aligned) with the pool's threads. */
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
