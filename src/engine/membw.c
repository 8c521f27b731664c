/*
 * membw.c: the memory read-bandwidth probe (membw.h).
 *
 * Four streams a quarter of the range apart, each prefetched 1 KB ahead, 512-bit
 * loads where the CPU has them: the access pattern of the decode kernels. A single
 * stream of 256-bit loads without prefetch (the benchmarks' probe before) read
 * 61-62 GB/s with 2 threads where this reads 76-78 in the same process (dev VM, 6
 * interleaved rounds), and the bf16 matvec beat it by 7-12%, so ratios against it
 * were flattering. The planner's probe before this one (one thread, a plain u64
 * sum) read 23 GB/s on the Zen 5 VM where the decode's two threads stream 45-60:
 * its predictions for memory-bound budgets were 2-4x slow.
 */
#include "membw.h"
#include <string.h>
#include "base.h"

typedef uint64_t (*sum_fn)(const uint64_t *p, int64_t n_lines);

/* Four independent chains, one stream: the fallback without SIMD. */
static uint64_t sum_lines_plain(const uint64_t *p, int64_t n_lines) {
    uint64_t a = 0, b = 0, c = 0, d = 0;
    for (int64_t i = 0; i < n_lines * 8; i += 4) { a += p[i]; b += p[i + 1]; c += p[i + 2]; d += p[i + 3]; }
    return a + b + c + d;
}

#if defined(__x86_64__)
#include <immintrin.h>
#define BW_PF 1024
/* The walk both widths share: four streams a quarter apart, each prefetched
 * BW_PF ahead; LINE(acc, ptr) adds one 64-byte line to a VT accumulator. Leaves
 * the four accumulators a, b, c, d. */
#define FOUR_STREAMS(VT, ZERO, LINE)                                                            \
    const int64_t q = n_lines / 4;                                                              \
    const char *s0 = (const char *)p, *s1 = s0 + q * 64, *s2 = s1 + q * 64, *s3 = s2 + q * 64; \
    VT a = ZERO, b = a, c = a, d = a;                                                           \
    for (int64_t i = 0; i < q; i++) {                                                           \
        const int64_t o = i * 64;                                                               \
        _mm_prefetch(s0 + o + BW_PF, _MM_HINT_T0);                                              \
        _mm_prefetch(s1 + o + BW_PF, _MM_HINT_T0);                                              \
        _mm_prefetch(s2 + o + BW_PF, _MM_HINT_T0);                                              \
        _mm_prefetch(s3 + o + BW_PF, _MM_HINT_T0);                                              \
        a = LINE(a, s0 + o);                                                                    \
        b = LINE(b, s1 + o);                                                                    \
        c = LINE(c, s2 + o);                                                                    \
        d = LINE(d, s3 + o);                                                                    \
    }                                                                                           \
    for (int64_t i = 4 * q; i < n_lines; i++) a = LINE(a, (const char *)(p + i * 8))

__attribute__((target("avx512f"))) static inline __m512i add_line512(__m512i acc, const char *s) {
    return _mm512_add_epi64(acc, _mm512_load_si512(s));
}
__attribute__((target("avx512f"))) static uint64_t sum_lines512(const uint64_t *p, int64_t n_lines) {
    FOUR_STREAMS(__m512i, _mm512_setzero_si512(), add_line512);
    uint64_t t[8]; /* summed unsigned: gcc's _mm512_reduce_add_epi64 adds signed (overflow under UBSan) */
    _mm512_storeu_si512(t, _mm512_add_epi64(_mm512_add_epi64(a, b), _mm512_add_epi64(c, d)));
    return t[0] + t[1] + t[2] + t[3] + t[4] + t[5] + t[6] + t[7];
}
__attribute__((target("avx2"))) static inline __m256i add_line256(__m256i acc, const char *s) {
    const __m256i x = _mm256_load_si256((const __m256i *)(const void *)s);
    const __m256i y = _mm256_load_si256((const __m256i *)(const void *)(s + 32));
    return _mm256_add_epi64(acc, _mm256_add_epi64(x, y));
}
__attribute__((target("avx2"))) static uint64_t sum_lines256(const uint64_t *p, int64_t n_lines) {
    FOUR_STREAMS(__m256i, _mm256_setzero_si256(), add_line256);
    a = _mm256_add_epi64(_mm256_add_epi64(a, b), _mm256_add_epi64(c, d));
    uint64_t t[4];
    _mm256_storeu_si256((__m256i *)(void *)t, a);
    return t[0] + t[1] + t[2] + t[3];
}
static sum_fn sum_pick(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") ? sum_lines512 : __builtin_cpu_supports("avx2") ? sum_lines256 : sum_lines_plain;
}
#else
/* Elsewhere (arm64) the compiler vectorises the plain sum's four chains; the
 * hardware prefetchers follow a plain stream. */
static sum_fn sum_pick(void) { return sum_lines_plain; }
#endif

typedef struct {
    const uint64_t *buf;
    sum_fn sum;            /* picked once per bw_read, not per range */
    uint64_t sums[64 * 8]; /* a 64-byte line of sums per thread */
} bw_ctx;

static void bw_fn(void *vctx, int64_t i0, int64_t i1, int tid) {
    bw_ctx *c = vctx;
    c->sums[(tid & 63) * 8] += c->sum(c->buf + i0 * 8, i1 - i0);
}

double bw_read(pool *p, const uint64_t *buf, size_t bytes, int reps) {
    bw_ctx c = {.buf = buf, .sum = sum_pick()};
    const int64_t n_lines = (int64_t)(bytes / 64);
    double best = 0;
    for (int r = 0; r < reps; r++) {
        const double t0 = base_now();
        pool_for(p, n_lines, 4096, bw_fn, &c);
        const double dt = base_now() - t0;
        if (dt > 0 && (double)bytes / dt / 1e9 > best) best = (double)bytes / dt / 1e9;
    }
    return best;
}

double membw_probe(int n_threads) {
    const size_t bytes = 512u << 20;
    pool *p = NULL;
    if (pool_create(&p, n_threads > 0 ? n_threads : pool_default_threads())) return 0;
    uint64_t *buf = base_alloc_aligned(bytes, 4096, MEM_IO);
    double gbs = 0;
    if (buf) {
        memset(buf, 1, bytes);
        gbs = bw_read(p, buf, bytes, 5);
        base_free(buf);
    }
    pool_free(p);
    return gbs * 1e9;
}
