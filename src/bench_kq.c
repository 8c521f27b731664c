/*
 * bench_kq.c: strata_bench_kernels_quant (include/strata_bench.h), the FP8 and
 * INT4 part of `make bench-kernels`: decode (T = 1) over a stack of Kimi K2
 * routed experts ([gate; up] 4096 x 7168 then down 7168 x 2048, as the MoE step
 * runs them) in FP8 e4m3 with 128 x 128 f32 block scales and in INT4 group 32
 * with bf16 scales, for every kernel table with 1 and 2 threads: G weights/s,
 * GB/s of weights and scales streamed and the fraction of the read bandwidth
 * measured in the same run (best of several passes, one bandwidth pass before
 * each). Then prefill (T = 64) GFLOP/s and in-cache compute per core.
 */
#include <string.h>
#include <time.h>
#include "base.h"
#include "kern.h"
#include "membw.h"
#include "pool.h"
#include "strata.h"
#include "strata_bench.h"

/* K2 expert shapes: [gate; up] (2 x 2048) x 7168, down 7168 x 2048. */
enum { KQ_I = 2048, KQ_H = 7168 };
#define KQ_W ((int64_t)3 * KQ_I * KQ_H) /* weights per expert */

typedef struct {
    int fmt; /* 0 FP8, 1 INT4 */
    uint8_t *w;      /* per expert: w13 then w2 (bytes, or int32 words) */
    void *s;         /* per expert: w13 scales then w2 scales */
    size_t wbytes, sbytes, s13; /* per expert; s13: w13's scale bytes */
    int n_exp;
    const kern_table *kt;
    const float *x;
    float *y;
    int64_t T, rows, cols, ldx;
    const void *wm, *sm;
} kq_ctx;

static void kq_fn(void *vc, int64_t i0, int64_t i1, int tid) {
    const kq_ctx *c = vc;
    (void)tid;
    if (c->fmt == 0) c->kt->matmul_fp8(c->y, c->rows, c->wm, c->sm, c->cols, c->x, c->ldx, c->T, i0, i1);
    else c->kt->matmul_int4(c->y, c->rows, c->wm, c->sm, c->cols, c->x, c->ldx, c->T, i0, i1);
}

/* One MoE step per expert: w13 (4096 x 7168) then w2 (7168 x 2048). */
static void kq_run(pool *p, kq_ctx *c, int n_exp) {
    const size_t b13 = c->fmt ? (size_t)2 * KQ_I * KQ_H / 2 : (size_t)2 * KQ_I * KQ_H;
    for (int e = 0; e < n_exp; e++) {
        const uint8_t *w = c->w + (size_t)e * c->wbytes, *s = (const uint8_t *)c->s + (size_t)e * c->sbytes;
        c->wm = w; c->sm = s; c->rows = 2 * KQ_I; c->cols = KQ_H; c->ldx = KQ_H;
        pool_for(p, c->rows, 16, kq_fn, c);
        c->wm = w + b13; c->sm = s + c->s13; c->rows = KQ_H; c->cols = KQ_I; c->ldx = KQ_I;
        pool_for(p, c->rows, 16, kq_fn, c);
    }
}

static uint32_t kq_rnd(uint32_t *s) { *s = *s * 1664525u + 1013904223u; return *s >> 8; }

/* Weights with realistic values (no NaN codes; FP8 scales ~2^-9, bf16 ~2^-7). */
static int kq_make(kq_ctx *c, int fmt, int n_exp) {
    memset(c, 0, sizeof *c);
    c->fmt = fmt;
    c->n_exp = n_exp;
    if (fmt == 0) {
        c->wbytes = (size_t)KQ_W;
        c->s13 = (size_t)(2 * KQ_I / 128) * (KQ_H / 128) * 4;
        c->sbytes = c->s13 + (size_t)(KQ_H / 128) * (KQ_I / 128) * 4;
    } else {
        c->wbytes = (size_t)KQ_W / 2;
        c->s13 = (size_t)2 * KQ_I * (KQ_H / 32) * 2;
        c->sbytes = c->s13 + (size_t)KQ_H * (KQ_I / 32) * 2;
    }
    c->w = base_alloc_aligned(c->wbytes * (size_t)n_exp, 4096, MEM_WEIGHTS);
    c->s = base_alloc_aligned(c->sbytes * (size_t)n_exp, 4096, MEM_WEIGHTS);
    if (!c->w || !c->s) return -1;
    uint32_t r = 7;
    for (size_t i = 0; i < c->wbytes * (size_t)n_exp; i++) {
        c->w[i] = (uint8_t)kq_rnd(&r);
        if (!fmt && (c->w[i] & 0x7F) == 0x7F) c->w[i] = 0x7E;
    }
    const size_t ns = c->sbytes * (size_t)n_exp / (fmt ? 2 : 4);
    for (size_t i = 0; i < ns; i++) {
        if (fmt) ((uint16_t *)c->s)[i] = (uint16_t)(0x3C00 + kq_rnd(&r) % 0x80);
        else ((float *)c->s)[i] = (float)(1 + kq_rnd(&r) % 64) * 0x1p-15f;
    }
    return 0;
}

static double kq_cpu(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static const char *const k_fmt[2] = {"FP8 e4m3 128x128", "INT4 g32"};

/* Decode for one format: every table (at most 8), 1 and 2 threads; res[a][k]:
 * G weights/s, GB/s, s per pass. Returns the number of tables. */
static int kq_decode(pool *const pools[2], const uint64_t *buf, size_t bw_bytes, double bw[2], kq_ctx *c, int reps,
                     double res[8][2][3]) {
    const double bytes = (double)(c->wbytes + c->sbytes) * c->n_exp, weights = (double)KQ_W * c->n_exp;
    int nt = 0;
    for (const kern_table *const *a = kern_available(); *a && nt < 8; a++, nt++) {
        /* the scalar reference is ~50x slower: one pass over one expert */
        const int is_ref = !strcmp((*a)->name, "scalar"), ne = is_ref ? 1 : c->n_exp;
        for (int k = 0; k < 2; k++) {
            double best = 1e30;
            c->kt = *a;
            c->T = 1;
            for (int r = 0; r < (is_ref ? 1 : reps); r++) {
                const double g = bw_read(pools[k], buf, bw_bytes, 1);
                if (g > bw[k]) bw[k] = g;
                const double t0 = base_now();
                kq_run(pools[k], c, ne);
                const double dt = base_now() - t0;
                if (dt < best) best = dt;
            }
            res[nt][k][0] = weights * ne / c->n_exp / best / 1e9;
            res[nt][k][1] = bytes * ne / c->n_exp / best / 1e9;
            res[nt][k][2] = best;
        }
    }
    return nt;
}

/* Prefill (T = 64, 2 threads, 2 experts) and in-L2 compute (64 rows of the
 * down projection, 1 thread, CPU time) per table. */
static void kq_compute(pool *p, int threads, kq_ctx *c, FILE *out) {
    for (const kern_table *const *a = kern_available(); *a; a++) {
        if (!strcmp((*a)->name, "scalar")) continue;
        c->kt = *a;
        c->T = 64;
        double best = 1e30;
        for (int r = 0; r < 3; r++) {
            const double t0 = base_now();
            kq_run(p, c, 2);
            const double dt = base_now() - t0;
            if (dt < best) best = dt;
        }
        fprintf(out, "%-16s %-11s | prefill T=64, %d threads: %6.1f GFLOP/s |", k_fmt[c->fmt], (*a)->name, threads,
                2.0 * KQ_W * 2 * 64 / best / 1e9);
        const uint8_t *w2 = c->w + (c->fmt ? (size_t)KQ_I * KQ_H : (size_t)2 * KQ_I * KQ_H);
        const uint8_t *s2 = (const uint8_t *)c->s + c->s13;
        for (int ti = 0; ti < 2; ti++) {
            const int64_t T = ti ? 8 : 1, reps = 512 / T;
            double bc = 1e30;
            for (int k = 0; k < 5; k++) {
                const double t0 = kq_cpu();
                for (int64_t q = 0; q < reps; q++) {
                    if (c->fmt == 0) (*a)->matmul_fp8(c->y, 64, w2, (const float *)s2, KQ_I, c->x, KQ_I, T, 0, 64);
                    else (*a)->matmul_int4(c->y, 64, (const int32_t *)w2, (const uint16_t *)s2, KQ_I, c->x, KQ_I, T, 0, 64);
                }
                const double dt = kq_cpu() - t0;
                if (dt < bc) bc = dt;
            }
            fprintf(out, " in-L2 T=%lld %5.1f G/s", (long long)T, 64.0 * KQ_I * T * reps / bc / 1e9);
        }
        fprintf(out, "\n");
    }
}

#if defined(__x86_64__)
/* Both AVX2 FP8 decoders in L2 (the in-L2 rows above, 1 thread, CPU time) on
 * these bytes (6% subnormal e4m3 codes) and with the subnormal codes made normal:
 * the bit-pattern decoder (kern_x86q.c) feeds them to its fmas as f32 denormals,
 * free on Zen 3; this line is how to check another CPU before matmul_fp8 takes
 * the patterns there (AMD only now). */
static void kq_fp8_decoders(const kq_ctx *c, FILE *out) {
    const int64_t n = 64 * KQ_I;
    const uint8_t *w2 = c->w + (size_t)2 * KQ_I * KQ_H;
    const float *s2 = (const float *)(const void *)((const uint8_t *)c->s + c->s13);
    uint8_t *wn = base_alloc((size_t)n, MEM_SCRATCH);
    if (!kern_x86_has_avx2() || !wn) { base_free(wn); return; }
    for (int64_t i = 0; i < n; i++) wn[i] = (w2[i] & 0x78) ? w2[i] : (uint8_t)(w2[i] | 0x08);
    fprintf(out, "FP8 avx2 decoders, in-L2 T=1 (matmul_fp8 takes %s here):", __builtin_cpu_is("amd") ? "patterns" : "f16");
    for (int sub = 1; sub >= 0; sub--)
        for (int pat = 0; pat < 2; pat++) {
            double bc = 1e30;
            for (int k = 0; k < 5; k++) {
                const double t0 = kq_cpu();
                for (int q = 0; q < 512; q++) kern_x86_fp8_avx2_decode(c->y, sub ? w2 : wn, s2, KQ_I, c->x, 0, 64, pat);
                const double dt = kq_cpu() - t0;
                if (dt < bc) bc = dt;
            }
            fprintf(out, " %s%s %.1f G/s", pat ? "patterns" : "f16", sub ? "" : " (no subnormal codes)", (double)n * 512 / bc / 1e9);
        }
    fprintf(out, "\n");
    base_free(wn);
}
#endif

int strata_bench_kernels_quant(const strata_bench_kern_opts *o, FILE *out, char *err, size_t errlen) {
    const int quick = o && o->quick, n_exp = quick ? 4 : 8, reps = quick ? 3 : 6;
    const size_t bw_bytes = quick ? (256u << 20) : (512u << 20);
    const int threads[2] = {1, pool_default_threads() >= 2 ? 2 : 1};
    pool *pools[2] = {NULL, NULL};
    uint64_t *buf = NULL;
    kq_ctx c[2];
    float *x = NULL, *y = NULL;
    memset(c, 0, sizeof c);
    int rc = STRATA_ENOMEM;
    if (pool_create(&pools[0], threads[0]) || pool_create(&pools[1], threads[1])) {
        snprintf(err, errlen, "cannot start %d compute threads", threads[1]);
        goto done;
    }
    buf = base_alloc_aligned(bw_bytes, 4096, MEM_SCRATCH);
    x = base_alloc((size_t)64 * KQ_H * 4, MEM_SCRATCH);
    y = base_alloc((size_t)64 * KQ_H * 4, MEM_SCRATCH);
    if (!buf || !x || !y || kq_make(&c[0], 0, n_exp) || kq_make(&c[1], 1, n_exp)) {
        snprintf(err, errlen, "no memory for the FP8/INT4 kernel bench (~%d MB)", quick ? 600 : 1200);
        goto done;
    }
    for (size_t i = 0; i < bw_bytes / 8; i++) buf[i] = i;
    uint32_t r = 3;
    for (int64_t i = 0; i < 64 * KQ_H; i++) x[i] = (float)(kq_rnd(&r) % 1000) * 1e-3f - 0.5f;
    double bw[2];
    for (int k = 0; k < 2; k++) bw[k] = bw_read(pools[k], buf, bw_bytes, 4);
    fprintf(out, "\nFP8 / INT4 decode (T=1) over %d Kimi K2 experts ([gate; up] 4096x7168 + down 7168x2048):\n"
                 "weights/s, GB/s of weights + scales, %% of the read bandwidth measured alongside, ms per pass\n"
                 "(FP8 %.0f MB, INT4 %.0f MB; scalar: one expert, one pass)\n",
            n_exp, (double)(c[0].wbytes + c[0].sbytes) * n_exp / 1e6, (double)(c[1].wbytes + c[1].sbytes) * n_exp / 1e6);
    double res[2][8][2][3];
    int nt = 0;
    for (int f = 0; f < 2; f++) {
        c[f].x = x;
        c[f].y = y;
        nt = kq_decode(pools, buf, bw_bytes, bw, &c[f], reps, res[f]);
    }
    /* more threads never have less bandwidth than one: a lower figure is the neighbours */
    if (bw[0] > bw[1]) bw[1] = bw[0];
    for (int f = 0; f < 2; f++)
        for (int a = 0; a < nt; a++)
            for (int k = 0; k < 2; k++)
                fprintf(out, "%-16s %-11s %d thr | %6.2f G weights/s %6.2f GB/s %5.1f%% | %7.2f ms\n", k_fmt[f],
                        kern_available()[a]->name, threads[k], res[f][a][k][0], res[f][a][k][1],
                        100 * res[f][a][k][1] / bw[k], res[f][a][k][2] * 1e3);
    fprintf(out, "read bandwidth (best of all passes): 1 thread %.2f GB/s, %d threads %.2f GB/s\n\n", bw[0], threads[1], bw[1]);
    for (int f = 0; f < 2; f++) kq_compute(pools[1], threads[1], &c[f], out);
#if defined(__x86_64__)
    kq_fp8_decoders(&c[0], out);
#endif
    rc = STRATA_OK;
done:
    for (int f = 0; f < 2; f++) { base_free(c[f].w); base_free(c[f].s); }
    base_free(buf); base_free(x); base_free(y);
    pool_free(pools[0]);
    pool_free(pools[1]);
    return rc;
}
