/*
 * bench.c: the microbenchmarks of include/strata_bench.h, the cores of the
 * programs under bench/ (b_kern, b_index, ladder/bench_io, ladder/cache_replay,
 * ladder/place_run), which are front ends on include/ only. Each measures
 * internals the public API does not expose on its own and prints its tables to
 * the caller's FILE as the program always printed them; errors come back with
 * err set, never as an exit.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "base.h"
#include "cache.h"
#include "infer.h"
#include "io.h"
#include "kern.h"
#include "membw.h"
#include "model.h"
#include "num.h"
#include "place.h"
#include "pool.h"
#include "st.h"
#include "strata.h"
#include "strata_bench.h"

/* CPU seconds of the calling thread (who: CLOCK_THREAD_CPUTIME_ID) or of the
 * process: on a shared box the wall clock mostly measures the neighbours. */
static double cpu_s(clockid_t who) {
    struct timespec ts;
    clock_gettime(who, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ================================================================== kernels */

typedef struct {
    const kern_table *kt;
    const void *W; int dtype;                 /* dense weights */
    const uint8_t *P, *S;                     /* MXFP4 weights */
    int64_t rows, cols, T;
    const float *X; float *Y;
} mm_ctx;

static void mm_fn(void *vctx, int64_t i0, int64_t i1, int tid) {
    mm_ctx *c = vctx;
    if (c->P) c->kt->matmul_mxfp4(c->Y, c->rows, c->P, c->S, c->cols, c->X, c->cols, c->T, i0, i1);
    else c->kt->matmul(c->Y, c->rows, c->W, c->dtype, c->cols, c->X, c->cols, c->T, i0, i1);
}

/* Routed-expert shapes (docs/architecture.md, Model spec): w1, w3 3072 x 3584 and w2 3584 x 3072, MXFP4. */
enum { EX_INTER = 3072, EX_LATENT = 3584 };
#define EX_BYTES ((size_t)3 * EX_INTER * EX_LATENT / 2 + (size_t)3 * EX_INTER * EX_LATENT / 32)

typedef struct {
    uint8_t *mem; int n_exp;
    float *x, *act, *y13, *y2;
} experts;

/* One MoE expert step per expert: [w1; w3] (6144 x 3584, adjacent) then w2. */
static void run_experts(pool *p, const kern_table *kt, experts *e, int64_t T) {
    const size_t p13 = (size_t)2 * EX_INTER * EX_LATENT / 2, s13 = (size_t)2 * EX_INTER * EX_LATENT / 32;
    const size_t p2 = (size_t)EX_LATENT * EX_INTER / 2;
    for (int k = 0; k < e->n_exp; k++) {
        uint8_t *base = e->mem + (size_t)k * EX_BYTES;
        mm_ctx a = {kt, NULL, 0, base, base + p13, 2 * EX_INTER, EX_LATENT, T, e->x, e->y13};
        pool_for(p, a.rows, 16, mm_fn, &a);
        mm_ctx b = {kt, NULL, 0, base + p13 + s13, base + p13 + s13 + p2, EX_LATENT, EX_INTER, T,
                    e->act, e->y2};
        pool_for(p, b.rows, 16, mm_fn, &b);
    }
}

static uint32_t rnd(uint32_t *s) { *s = *s * 1664525u + 1013904223u; return *s >> 8; }

/* The weights and activations every section multiplies. */
typedef struct {
    uint16_t *W;                  /* R x C bf16 */
    float *X, *Y;
    experts e;
} kern_bufs;

enum { KB_R = 12288, KB_C = 7168, KB_TMAX = 64 };

static void kern_bufs_free(kern_bufs *b) {
    base_free(b->W); base_free(b->e.mem); base_free(b->X); base_free(b->Y);
    base_free(b->e.x); base_free(b->e.act); base_free(b->e.y13); base_free(b->e.y2);
}

static int kern_bufs_make(kern_bufs *b, int n_exp) {
    const int64_t R = KB_R, C = KB_C, TMAX = KB_TMAX;
    memset(b, 0, sizeof *b);
    b->e.n_exp = n_exp;
    b->W = base_alloc_aligned((size_t)(R * C) * 2, 4096, MEM_WEIGHTS);
    b->e.mem = base_alloc_aligned(EX_BYTES * (size_t)n_exp, 4096, MEM_WEIGHTS);
    b->X = base_alloc((size_t)(TMAX * C) * 4, MEM_SCRATCH);
    b->Y = base_alloc((size_t)(TMAX * R) * 4, MEM_SCRATCH);
    b->e.x = base_alloc((size_t)TMAX * EX_LATENT * 4, MEM_SCRATCH);
    b->e.act = base_alloc((size_t)TMAX * EX_INTER * 4, MEM_SCRATCH);
    b->e.y13 = base_alloc((size_t)TMAX * 2 * EX_INTER * 4, MEM_SCRATCH);
    b->e.y2 = base_alloc((size_t)TMAX * EX_LATENT * 4, MEM_SCRATCH);
    if (!b->W || !b->e.mem || !b->X || !b->Y || !b->e.x || !b->e.act || !b->e.y13 || !b->e.y2) return -1;
    uint32_t s = 1;
    for (int64_t i = 0; i < R * C; i++) b->W[i] = num_f32_to_bf16(((float)(rnd(&s) % 2001) - 1000.0f) * 1e-3f);
    for (size_t i = 0; i < EX_BYTES * (size_t)n_exp; i++) b->e.mem[i] = (uint8_t)rnd(&s);
    /* scales: overwrite each expert's scale arrays with sane exponents */
    for (int k = 0; k < n_exp; k++) {
        uint8_t *base = b->e.mem + (size_t)k * EX_BYTES;
        size_t p13 = (size_t)EX_INTER * EX_LATENT, s13 = p13 / 16, p2 = p13 / 2, s2 = p13 / 32;
        memset(base + p13, 120, s13);
        memset(base + p13 + s13 + p2, 121, s2);
    }
    for (int64_t i = 0; i < TMAX * C; i++) b->X[i] = (float)(rnd(&s) % 1000) * 1e-3f - 0.5f;
    for (int64_t i = 0; i < TMAX * EX_LATENT; i++) b->e.x[i] = b->X[i];
    for (int64_t i = 0; i < TMAX * EX_INTER; i++) b->e.act[i] = b->X[i];
    return 0;
}

/* 2. decode (T = 1): best of several passes of every table with 1 and 2 threads;
 * one bandwidth pass per repetition keeps the reference current on a shared
 * machine (bw[k] becomes the best seen). res[table][k]: GB/s, s (bf16), GB/s, s
 * (experts). */
static int kern_decode(pool *const pools[2], const uint64_t *buf, size_t bw_bytes, double bw[2], kern_bufs *b,
                       double res[][2][4]) {
    const int64_t R = KB_R, C = KB_C;
    const int n_exp = b->e.n_exp;
    const double wbytes = (double)(R * C) * 2, ebytes = (double)EX_BYTES * n_exp;
    int nt = 0;
    for (const kern_table *const *a = kern_available(); *a && nt < 8; a++, nt++) {
        /* the scalar reference is ~50x slower: one pass over a fraction keeps the
         * bench short (its rows are as large, so GB/s stays comparable) */
        int is_ref = !strcmp((*a)->name, "scalar");
        int64_t rows_d = is_ref ? R / 16 : R;
        int n_e = is_ref ? 1 : n_exp;
        for (int k = 0; k < 2; k++) {
            int reps = is_ref ? 1 : 8;
            double best_d = 1e30, best_e = 1e30;
            mm_ctx c = {*a, b->W, DT_BF16, NULL, NULL, rows_d, C, 1, b->X, b->Y};
            for (int r = 0; r < reps; r++) {
                double g = bw_read(pools[k], buf, bw_bytes, 1);
                if (g > bw[k]) bw[k] = g;
                double t0 = base_now();
                pool_for(pools[k], rows_d, 16, mm_fn, &c);
                double dt = base_now() - t0;
                if (dt < best_d) best_d = dt;
                b->e.n_exp = n_e;
                t0 = base_now();
                run_experts(pools[k], *a, &b->e, 1);
                dt = base_now() - t0;
                b->e.n_exp = n_exp;
                if (dt < best_e) best_e = dt;
            }
            res[nt][k][0] = wbytes * rows_d / R / best_d / 1e9;
            res[nt][k][1] = best_d;
            res[nt][k][2] = ebytes * n_e / n_exp / best_e / 1e9;
            res[nt][k][3] = best_e;
        }
    }
    return nt;
}

/* 3. prefill: GFLOP/s of the same kernels as matrix-matrix products. */
static void kern_prefill(pool *p, int threads, kern_bufs *b, FILE *out) {
    const int64_t R = KB_R, C = KB_C;
    const int n_exp = b->e.n_exp;
    fprintf(out, "\nprefill (matrix-matrix): GFLOP/s (2 x weights x T per call), %d threads\n", threads);
    fprintf(out, "%-11s | %12s %12s | %12s %12s\n", "table", "bf16 T=8", "bf16 T=64", "mxfp4 T=8", "mxfp4 T=64");
    for (const kern_table *const *a = kern_available(); *a; a++) {
        int is_ref = !strcmp((*a)->name, "scalar");
        fprintf(out, "%-11s |", (*a)->name);
        for (int fmt = 0; fmt < 2; fmt++)
            for (int ti = 0; ti < 2; ti++) {
                int64_t T = ti ? 64 : 8;
                /* the scalar reference is ~100x slower: one smaller run keeps the bench short */
                int64_t rows = is_ref ? 512 : R;
                int n_e = is_ref ? 1 : n_exp;
                double best = 1e30;
                for (int r = 0; r < (is_ref ? 1 : 3); r++) {
                    double t0 = base_now();
                    if (fmt == 0) {
                        mm_ctx c = {*a, b->W, DT_BF16, NULL, NULL, rows, C, T, b->X, b->Y};
                        c.rows = R; /* ldy */
                        pool_for(p, rows, 4, mm_fn, &c);
                    } else {
                        b->e.n_exp = n_e;
                        run_experts(p, *a, &b->e, T);
                        b->e.n_exp = n_exp;
                    }
                    double dt = base_now() - t0;
                    if (dt < best) best = dt;
                }
                double flops = fmt == 0 ? 2.0 * (double)rows * C * T
                                        : 2.0 * 3.0 * EX_INTER * EX_LATENT * n_e * T;
                fprintf(out, " %7.1f GF/s", flops / best / 1e9);
            }
        fprintf(out, "\n");
    }
}

/* 4. compute bound: a 64 x 3584 matrix that stays in L2, one thread, CPU time
 * (robust against other processes): what the kernel could do if memory were free */
static void kern_in_cache(kern_bufs *b, FILE *out) {
    fprintf(out, "\nin-cache compute (64 x 3584, 1 thread, CPU time): G weight-activation products/s\n");
    fprintf(out, "%-11s | %9s %9s %9s | %9s %9s %9s\n", "table", "bf16 T=1", "T=8", "T=64", "mxfp4 T=1", "T=8", "T=64");
    for (const kern_table *const *a = kern_available(); *a; a++) {
        if (!strcmp((*a)->name, "scalar")) continue;
        fprintf(out, "%-11s |", (*a)->name);
        for (int fmt = 0; fmt < 2; fmt++)
            for (int ti = 0; ti < 3; ti++) {
                int64_t T = ti == 0 ? 1 : ti == 1 ? 8 : 64, rows = 64, reps = 2048 / T;
                double best = 1e30;
                for (int k = 0; k < 5; k++) {
                    double t0 = cpu_s(CLOCK_THREAD_CPUTIME_ID);
                    for (int64_t q = 0; q < reps; q++) {
                        if (fmt == 0) (*a)->matmul(b->Y, rows, b->W, DT_BF16, EX_LATENT, b->X, EX_LATENT, T, 0, rows);
                        else (*a)->matmul_mxfp4(b->Y, rows, b->e.mem, b->e.mem + (size_t)EX_INTER * EX_LATENT,
                                                EX_LATENT, b->X, EX_LATENT, T, 0, rows);
                    }
                    double dt = cpu_s(CLOCK_THREAD_CPUTIME_ID) - t0;
                    if (dt < best) best = dt;
                }
                fprintf(out, " %9.1f", (double)rows * EX_LATENT * T * reps / best / 1e9);
                if (ti == 2 && fmt == 0) fprintf(out, " |");
            }
        fprintf(out, "\n");
    }
}

int strata_bench_kernels(const strata_bench_kern_opts *o, FILE *out, char *err, size_t errlen) {
    const int quick = o && o->quick;
    const size_t bw_bytes = quick ? (256u << 20) : (1u << 30);
    const int n_exp = quick ? 8 : 24;
    int threads[2] = {1, pool_default_threads() >= 2 ? 2 : 1};
    pool *pools[2] = {NULL, NULL};
    uint64_t *buf = NULL;
    kern_bufs b;
    memset(&b, 0, sizeof b);
    int rc = STRATA_ENOMEM;
    if (pool_create(&pools[0], threads[0]) || pool_create(&pools[1], threads[1])) {
        snprintf(err, errlen, "cannot start %d compute threads", threads[1]);
        goto done;
    }
    fprintf(out, "strata kernel bench (tables:");
    for (const kern_table *const *a = kern_available(); *a; a++) fprintf(out, " %s", (*a)->name);
    fprintf(out, "; default threads %d)\n\n", pool_default_threads());

    /* 1. read bandwidth */
    buf = base_alloc_aligned(bw_bytes, 4096, MEM_SCRATCH);
    if (!buf) { snprintf(err, errlen, "no memory for the bandwidth buffer"); goto done; }
    for (size_t i = 0; i < bw_bytes / 8; i++) buf[i] = i;
    double bw[2];
    for (int k = 0; k < 2; k++) bw[k] = bw_read(pools[k], buf, bw_bytes, 6);
    if (base_mem_available() && base_mem_available() < (3ull << 30))
        fprintf(out, "warning: less than 3 GB available; results may include paging\n");
    if (kern_bufs_make(&b, n_exp)) { snprintf(err, errlen, "OOM"); goto done; }
    const double ebytes = (double)EX_BYTES * n_exp;

    /* 2. decode */
    double res[8][2][4];
    const int nt = kern_decode(pools, buf, bw_bytes, bw, &b, res);
    base_free(buf);
    buf = NULL;
    /* more threads can never have less bandwidth than one; a lower 2-thread figure
     * is interference from other processes, so the 2-thread reference is the max */
    if (bw[0] > bw[1]) bw[1] = bw[0];
    fprintf(out, "memory read bandwidth (sum of %zu MB, best of all passes): 1 thread %.2f GB/s, %d threads %.2f GB/s\n\n",
            bw_bytes >> 20, bw[0], threads[1], bw[1]);
    fprintf(out, "decode (T=1): GB/s of weights streamed, %% of measured read bandwidth, ms per pass\n"
                 "(scalar: one pass over 1/16 of the rows and 1 expert)\n");
    fprintf(out, "%-11s %7s | %-27s | MXFP4 %d experts (%.0f MB)\n", "table", "threads",
            "bf16 12288x7168 (176 MB)", n_exp, ebytes / 1e6);
    for (int a = 0; a < nt; a++)
        for (int k = 0; k < 2; k++)
            fprintf(out, "%-11s %7d | %6.2f GB/s %5.1f%% %6.2f ms | %6.2f GB/s %5.1f%% %7.2f ms\n",
                    kern_available()[a]->name, threads[k], res[a][k][0], 100 * res[a][k][0] / bw[k],
                    res[a][k][1] * 1e3, res[a][k][2], 100 * res[a][k][2] / bw[k], res[a][k][3] * 1e3);

    kern_prefill(pools[1], threads[1], &b, out);
    kern_in_cache(&b, out);
    rc = STRATA_OK;
done:
    base_free(buf);
    kern_bufs_free(&b);
    pool_free(pools[0]);
    pool_free(pools[1]);
    return rc;
}

/* ================================================================ the index */

static const char *k_trunk[] = {"input_layernorm.weight", "post_attention_layernorm.weight",
    "self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight",
    "self_attn.g_proj.weight", "self_attn.o_proj.weight", "block_sparse_moe.gate.weight"};
static const int64_t k_trunk_shape[][2] = {{7168, 1}, {7168, 1}, {12288, 7168}, {12288, 7168},
    {12288, 7168}, {12288, 7168}, {7168, 12288}, {896, 7168}};
static const char *k_exp[] = {"w1.weight_packed", "w1.weight_scale", "w2.weight_packed",
                              "w2.weight_scale", "w3.weight_packed", "w3.weight_scale"};
static const int64_t k_exp_shape[][2] = {{3072, 1792}, {3072, 112}, {3584, 1536}, {3584, 96},
                                         {3072, 1792}, {3072, 112}};

/* Name of tensor i of a shard holding layer L (the same sequence the header uses). */
static void tensor_name(char *buf, size_t n, int L, int i, int64_t *rows, int64_t *cols, int *bf16) {
    if (i < 8) {
        snprintf(buf, n, "language_model.model.layers.%d.%s", L, k_trunk[i]);
        *rows = k_trunk_shape[i][0];
        *cols = k_trunk_shape[i][1];
        *bf16 = 1;
    } else {
        int e = (i - 8) / 6, k = (i - 8) % 6;
        snprintf(buf, n, "language_model.model.layers.%d.block_sparse_moe.experts.%d.%s", L, e, k_exp[k]);
        *rows = k_exp_shape[k][0];
        *cols = k_exp_shape[k][1];
        *bf16 = 0;
    }
}

/* A sparse shard of n tensors of layer L: header written, data a hole. */
static int write_shard(const char *path, int L, int n, size_t *hdr_bytes) {
    sbuf h = {0};
    uint64_t off = 0;
    char name[256];
    sbuf_printf(&h, "{\"__metadata__\":{\"format\":\"pt\"}");
    for (int i = 0; i < n; i++) {
        int64_t r, c;
        int bf16;
        tensor_name(name, sizeof name, L, i, &r, &c, &bf16);
        uint64_t nb = (uint64_t)r * (uint64_t)c * (bf16 ? 2 : 1);
        if (c == 1)
            sbuf_printf(&h, ",\"%s\":{\"dtype\":\"BF16\",\"shape\":[%lld],\"data_offsets\":[%llu,%llu]}",
                        name, (long long)r, (unsigned long long)off, (unsigned long long)(off + nb));
        else
            sbuf_printf(&h, ",\"%s\":{\"dtype\":\"%s\",\"shape\":[%lld,%lld],\"data_offsets\":[%llu,%llu]}",
                        name, bf16 ? "BF16" : "U8", (long long)r, (long long)c, (unsigned long long)off,
                        (unsigned long long)(off + nb));
        off += nb;
    }
    sbuf_printf(&h, "}");
    uint8_t pre[8];
    for (int i = 0; i < 8; i++) pre[i] = (uint8_t)((uint64_t)h.len >> (8 * i));
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    int ok = h.s && fd >= 0 && write(fd, pre, 8) == 8 && write(fd, h.s, h.len) == (ssize_t)h.len &&
             ftruncate(fd, (off_t)(8 + h.len + off)) == 0;
    if (fd >= 0) close(fd);
    *hdr_bytes = h.len;
    sbuf_free(&h);
    return ok ? 0 : -1;
}

/* Writes the shards into dir and the index.json text (not the file) into ij. */
static int index_write_shards(const char *dir, int n_shards, int per, size_t *hdr, sbuf *ij, char *err, size_t errlen) {
    sbuf_printf(ij, "{\"metadata\":{},\"weight_map\":{");
    for (int s = 0; s < n_shards; s++) {
        char path[512], shard[64], name[256];
        snprintf(shard, sizeof shard, "model-%05d-of-%05d.safetensors", s + 1, n_shards);
        snprintf(path, sizeof path, "%s/%s", dir, shard);
        if (write_shard(path, s + 1, per, hdr)) {
            snprintf(err, errlen, "%s: write failed", path);
            return STRATA_EIO;
        }
        for (int i = 0; i < per; i++) {
            int64_t r, c;
            int bf16;
            tensor_name(name, sizeof name, s + 1, i, &r, &c, &bf16);
            sbuf_printf(ij, "%s\"%s\":\"%s\"", s || i ? "," : "", name, shard);
        }
    }
    sbuf_printf(ij, "}}");
    if (!ij->s) { snprintf(err, errlen, "no memory for model.safetensors.index.json"); return STRATA_ENOMEM; }
    return STRATA_OK;
}

/* Best wall and CPU seconds of 3 st_opens of dir (the page cache is warm after
 * the first); with t_find, also one st_find per tensor after the first; with
 * keep, the last index stays open in *keep. */
static int index_time_open(const char *dir, double *wall, double *cpu, double *t_find, st_index **keep, char *err,
                           size_t errlen) {
    *wall = *cpu = 1e9;
    for (int rep = 0; rep < 3; rep++) {
        st_index *ix = NULL;
        double t0 = base_now(), c0 = cpu_s(CLOCK_PROCESS_CPUTIME_ID);
        int rc = st_open(&ix, dir, err, errlen);
        if (rc) return rc;
        double dt = base_now() - t0, dc = cpu_s(CLOCK_PROCESS_CPUTIME_ID) - c0;
        if (dt < *wall) *wall = dt;
        if (dc < *cpu) *cpu = dc;
        if (rep == 0 && t_find) {
            t0 = base_now();
            size_t hit = 0;
            for (size_t i = 0; i < st_count(ix); i++) hit += st_find(ix, st_at(ix, i)->name) == st_at(ix, i);
            *t_find = base_now() - t0;
            if (hit != st_count(ix)) {
                st_close(ix);
                snprintf(err, errlen, "lookup mismatch");
                return STRATA_EFORMAT;
            }
        }
        if (keep && rep == 2) *keep = ix;
        else st_close(ix);
    }
    return STRATA_OK;
}

int strata_bench_index(const strata_bench_index_opts *o, FILE *out, char *err, size_t errlen) {
    const int n_shards = o->n_shards, per = o->per_shard;
    if (n_shards < 1 || n_shards > 96 || per < 8) {
        snprintf(err, errlen, "n_shards must be 1..96 and tensors per shard >= 8 (got %d, %d)", n_shards, per);
        return STRATA_EINVAL;
    }
    char dir[] = "/tmp/strata-b_index-XXXXXX";
    if (!mkdtemp(dir)) { snprintf(err, errlen, "mkdtemp: %s", strerror(errno)); return STRATA_EIO; }
    size_t hdr = 0;
    sbuf ij = {0};
    char ipath[512];
    snprintf(ipath, sizeof ipath, "%s/model.safetensors.index.json", dir);
    st_index *ix = NULL;
    double best_scan, best_idx, t_find = 0, cpu_scan, cpu_idx;
    int rc = index_write_shards(dir, n_shards, per, &hdr, &ij, err, errlen);
    if (!rc) rc = index_time_open(dir, &best_scan, &cpu_scan, &t_find, NULL, err, errlen);
    if (!rc) rc = base_write_file_atomic(ipath, ij.s, ij.len, err, errlen) ? STRATA_EIO : STRATA_OK;
    if (!rc) rc = index_time_open(dir, &best_idx, &cpu_idx, NULL, &ix, err, errlen);
    if (!rc) {
        size_t n = st_count(ix);
        uint64_t mem = base_mem_used_tag(MEM_INDEX);
        st_close(ix);
        fprintf(out, "b_index: %d shards x %d tensors, %zu-byte headers, index.json %zu bytes\n", n_shards, per, hdr,
                ij.len);
        fprintf(out, "  st_open scan:  wall %.1f ms (%.2f ms/shard), cpu %.2f ms/shard (%.0f MB/s of header)\n",
                best_scan * 1e3, best_scan * 1e3 / n_shards, cpu_scan * 1e3 / n_shards,
                (double)hdr * n_shards / cpu_scan / 1e6);
        fprintf(out, "  st_open index: wall %.1f ms (%.2f ms/shard), cpu %.2f ms/shard\n", best_idx * 1e3,
                best_idx * 1e3 / n_shards, cpu_idx * 1e3 / n_shards);
        fprintf(out, "  st_find:       %.0f ns/lookup over %zu tensors\n", t_find * 1e9 / (double)n, n);
        fprintf(out, "  index RAM:     %.1f MB (%.0f B/tensor); K3 estimate for 497,220 tensors: %.0f MB\n",
                (double)mem / 1e6, (double)mem / (double)n, (double)mem / (double)n * 497220 / 1e6);
    }
    sbuf_free(&ij);
    base_rm_rf(dir);
    return rc;
}

/* =============================================================== disk reads */

typedef struct xr { int shard; uint64_t off, n; } xr;

static uint64_t xorshift(uint64_t *s) { *s ^= *s << 13; *s ^= *s >> 7; *s ^= *s << 17; return *s; }

/* Reads the n expert records x at `depth` in flight, each into its own slot of
 * buf; aligned_mode reads the same bytes from an aligned start (what a repacked
 * expert file would read). Bytes/s into *bw; the first failed read's code. */
static int io_run_experts(io_ring *r, io_file *f, const xr *x, int n, int depth, int aligned_mode, uint8_t *buf,
                          uint64_t slot, double *bw, char *err, size_t errlen) {
    io_req q[64];
    memset(q, 0, sizeof q);
    int next = 0, inflight = 0;
    uint64_t bytes = 0;
    double t0 = base_now();
    while (next < n || inflight) {
        while (next < n && inflight < depth) {
            const xr *e = &x[next];
            uint64_t a0 = io_align_down(e->off), a1 = io_align_up(e->off + e->n);
            if (aligned_mode) a1 = a0 + io_align_up(e->n); /* repacked: same bytes, aligned start */
            int k = -1;
            for (int i = 0; i < depth; i++) if (!q[i].ud) { k = i; break; }
            q[k] = (io_req){.f = &f[e->shard], .off = a0, .len = a1 - a0, .need = 1, .dst = buf + (uint64_t)k * slot, .ud = (void *)1};
            io_submit(r, &q[k]);
            next++;
            inflight++;
        }
        io_req *d;
        if (io_reap(r, 1, &d) != 1) break;
        if (d->rc) {
            snprintf(err, errlen, "%s: read failed at offset %llu: %s", d->f->path, (unsigned long long)d->off,
                     strerror(d->err_no ? d->err_no : EIO));
            return STRATA_EIO; /* the caller's io_ring_free waits for the reads in flight */
        }
        bytes += d->got;
        d->ud = NULL;
        inflight--;
    }
    double dt = base_now() - t0;
    *bw = dt > 0 ? (double)bytes / dt : 0;
    return STRATA_OK;
}

/* Reads total bytes from (f, off) in slices of sb bytes, two in flight; bytes/s
 * (0 when no ring could be had). */
static double io_slices(io_file *f, uint64_t off, uint64_t total, uint64_t sb, uint8_t *buf) {
    char err[512];
    io_ring *r = NULL;
    if (io_ring_create(&r, IO_DEPTH, IO_CHUNK, 0, err, sizeof err)) return 0;
    io_req q[2];
    uint64_t next = 0, got = 0;
    int inflight = 0;
    const double t0 = base_now();
    for (int i = 0; i < 2 && next < total; i++, next += sb) {
        q[i] = (io_req){.f = f, .off = off + next, .len = sb, .need = 1, .dst = buf + (uint64_t)i * sb, .ud = (void *)(intptr_t)i};
        io_submit(r, &q[i]);
        inflight++;
    }
    io_req *d;
    while (inflight && io_reap(r, 1, &d) == 1) {
        inflight--;
        got += d->got;
        if (next < total) {
            d->off = off + next;
            next += sb;
            io_submit(r, d);
            inflight++;
        }
    }
    const double dt = base_now() - t0;
    io_ring_free(r);
    return dt > 0 ? (double)got / dt : 0;
}

/* (3) only: 512 MB of fresh shard bytes per slice size, three rounds. */
static int io_table_slices(const st_index *ix, io_file *f, FILE *out, char *err, size_t errlen) {
    const uint64_t run_total = 512ull << 20, sizes[] = {4ull << 20, 8ull << 20, 16ull << 20, 32ull << 20, 64ull << 20, 128ull << 20};
    if (st_shard_size(ix, 0) <= run_total) {
        snprintf(err, errlen, "%s: the slice reads need shards over 512 MB", st_shard_path(ix, 0));
        return STRATA_EINVAL;
    }
    uint8_t *slbuf = base_alloc_aligned(2 * (128ull << 20), 1u << 20, MEM_IO);
    if (!slbuf) { snprintf(err, errlen, "no memory for two 128 MiB slices"); return STRATA_ENOMEM; }
    fprintf(out, "%-12s %8s %8s %8s\n", "slice MiB", "GB/s", "GB/s", "GB/s");
    double bw[3][6];
    uint64_t at = 0;
    for (int rep = 0; rep < 3; rep++)
        for (int k = 0; k < 6; k++) { /* fresh bytes every time: the shards in turn */
            const int sh = (int)(at / (st_shard_size(ix, 0) - run_total)) % st_n_shards(ix);
            bw[rep][k] = io_slices(&f[sh], io_align_down(at % (st_shard_size(ix, 0) - run_total)), run_total, sizes[k], slbuf);
            at += run_total + (64ull << 20);
        }
    for (int k = 0; k < 6; k++)
        fprintf(out, "%-12llu %8.3f %8.3f %8.3f\n", (unsigned long long)(sizes[k] >> 20), bw[0][k] / 1e9, bw[1][k] / 1e9, bw[2][k] / 1e9);
    base_free(slbuf);
    return STRATA_OK;
}

/* (1): the m expert records x (maxn the largest), n per configuration. */
static int io_table_experts(io_file *f, const xr *x, int64_t m, uint64_t maxn, int n, FILE *out, char *err, size_t errlen) {
    uint64_t slot = io_align_up(maxn) + 2 * IO_ALIGN;
    uint8_t *buf = base_alloc_aligned(slot * 64, 1u << 20, MEM_IO);
    if (!buf) { snprintf(err, errlen, "no memory for 64 expert slots"); return STRATA_ENOMEM; }
    unsigned long long misaligned = 0;
    for (int64_t i = 0; i < m; i++) misaligned += x[i].off % IO_ALIGN != 0;
    fprintf(out, "experts: %lld contiguous records of %.2f MB, %llu not 4096-aligned in the shards\n", (long long)m, (double)maxn / 1e6, misaligned);
    fprintf(out, "%-34s %6s %10s\n", "read", "depth", "GB/s");
    int64_t used = 0;
    int depths[] = {1, 4, 8, 16, 32}, rc = STRATA_OK;
    for (int di = 0; di < 5 && !rc; di++)
        for (int mode = 0; mode < 2 && !rc; mode++) {
            if (used + n > m) used = 0;
            io_ring *r = NULL;
            double bw = 0;
            rc = io_ring_create(&r, 64, 0, 0, err, errlen);
            if (!rc) rc = io_run_experts(r, f, x + used, n, depths[di], mode, buf, slot, &bw, err, errlen);
            used += n;
            io_ring_free(r);
            if (!rc)
                fprintf(out, "%-34s %6d %10.3f\n", mode ? "expert, aligned (repacked)" : "expert, in place (enclosing range)", depths[di], bw / 1e9);
        }
    base_free(buf);
    return rc;
}

/* (2): 64 MB runs of shard bytes, four per configuration, in chunks of 1/4/8 MiB
 * at depth 8/16/32. */
static int io_table_trunk(const st_index *ix, io_file *f, FILE *out, char *err, size_t errlen) {
    const uint64_t chunks[] = {1u << 20, 4u << 20, 8u << 20}, run_bytes = 64u << 20;
    const int tdepth[] = {8, 16, 32};
    for (int sh = 0; sh < st_n_shards(ix) && sh < 9; sh++)
        if (st_shard_size(ix, sh) < run_bytes + IO_ALIGN) {
            snprintf(err, errlen, "%s: the trunk-like reads need shards over 64 MB", st_shard_path(ix, sh));
            return STRATA_EINVAL;
        }
    int rc = STRATA_OK;
    for (int ci = 0; ci < 3 && !rc; ci++)
        for (int di = 0; di < 3 && !rc; di++) {
            /* a fresh buffer each time: every configuration pays its own page faults */
            io_ring *r = NULL;
            if ((rc = io_ring_create(&r, (unsigned)tdepth[di], chunks[ci], 0, err, errlen))) break;
            uint8_t *tb = base_alloc_aligned(run_bytes, 1u << 20, MEM_IO);
            if (!tb) {
                io_ring_free(r);
                snprintf(err, errlen, "no memory for a 64 MB run");
                return STRATA_ENOMEM;
            }
            int sh = (int)((ci * 3 + di) % st_n_shards(ix));
            uint64_t off = io_align_down(st_shard_size(ix, sh) / 2 + (uint64_t)(ci * 3 + di) * run_bytes * 2) % io_align_down(st_shard_size(ix, sh) - run_bytes);
            double t0 = base_now();
            uint64_t got = 0;
            for (int rep = 0; rep < 4; rep++) {
                io_req q = {.f = &f[sh], .off = io_align_down(off + (uint64_t)rep * run_bytes), .len = run_bytes, .need = 1, .dst = tb};
                io_submit(r, &q);
                io_req *d;
                io_reap(r, 1, &d);
                got += q.got;
            }
            double dt = base_now() - t0;
            fprintf(out, "trunk run, %u MiB chunks %*s %6d %10.3f\n", (unsigned)(chunks[ci] >> 20), 14, "", tdepth[di], (double)got / dt / 1e9);
            base_free(tb);
            io_ring_free(r);
        }
    return rc;
}

/* Every MoE layer's experts as contiguous records (w1 packed .. w3 scale in one
 * shard), shuffled; *m records, the largest *maxn bytes. */
static xr *io_expert_records(const cfg *c, const st_index *ix, int64_t *m, uint64_t *maxn) {
    int64_t n_moe = c->n_layers - c->first_dense, total = n_moe * c->n_experts;
    xr *x = base_calloc(total > 0 ? (size_t)total : 1, sizeof *x, MEM_MISC);
    *m = 0;
    *maxn = 0;
    if (!x) return NULL;
    for (int64_t L = c->first_dense; L < c->n_layers; L++)
        for (int64_t E = 0; E < c->n_experts; E++) {
            char nm[256];
            snprintf(nm, sizeof nm, "language_model.model.layers.%lld.block_sparse_moe.experts.%lld.w1.weight_packed", (long long)L, (long long)E);
            const st_tensor *a = st_find(ix, nm);
            snprintf(nm, sizeof nm, "language_model.model.layers.%lld.block_sparse_moe.experts.%lld.w3.weight_scale", (long long)L, (long long)E);
            const st_tensor *b = st_find(ix, nm);
            if (!a || !b || a->shard != b->shard) continue;
            x[*m] = (xr){a->shard, a->off, b->off + b->nbytes - a->off};
            if (x[*m].n > *maxn) *maxn = x[*m].n;
            (*m)++;
        }
    uint64_t s = 0x1234567;
    for (int64_t i = *m - 1; i > 0; i--) { int64_t j = (int64_t)(xorshift(&s) % (uint64_t)(i + 1)); xr t = x[i]; x[i] = x[j]; x[j] = t; }
    return x;
}

int strata_bench_io(const strata_bench_io_opts *o, FILE *out, char *err, size_t errlen) {
    char path[2048];
    cfg *c = base_calloc(1, sizeof *c, MEM_MISC);
    st_index *ix = NULL;
    io_file *f = NULL;
    xr *x = NULL;
    int64_t m = 0;
    uint64_t maxn = 0;
    int rc = STRATA_ENOMEM, n_open = 0;
    if (!c) { snprintf(err, errlen, "out of memory"); return rc; }
    snprintf(path, sizeof path, "%s/config.json", o->model_dir);
    if ((rc = cfg_load(c, path, err, errlen)) || (rc = st_open(&ix, o->model_dir, err, errlen))) goto done;
    x = io_expert_records(c, ix, &m, &maxn);
    f = base_calloc((size_t)st_n_shards(ix), sizeof *f, MEM_MISC);
    if (!x || !f) { rc = STRATA_ENOMEM; snprintf(err, errlen, "out of memory"); goto done; }
    for (; n_open < st_n_shards(ix); n_open++)
        if ((rc = io_file_open(&f[n_open], st_shard_path(ix, n_open), err, errlen))) goto done;
    if (o->slices) { rc = io_table_slices(ix, f, out, err, errlen); goto done; }
    if (m == 0) {
        snprintf(err, errlen, "%s: no routed expert stored as one contiguous run", o->model_dir);
        rc = STRATA_EINVAL;
        goto done;
    }
    const int n = o->n < 1 ? 1 : o->n > m ? (int)m : o->n;
    rc = io_table_experts(f, x, m, maxn, n, out, err, errlen);
    if (!rc) rc = io_table_trunk(ix, f, out, err, errlen);
done:
    for (int i = 0; i < n_open; i++) io_file_close(&f[i]);
    base_free(f);
    base_free(x);
    st_close(ix);
    base_free(c);
    return rc;
}

/* ============================================================= cache replay */

#define MAX_UNION 4096

/* Belady's MIN with the layer's union leased: hits into *hits. t holds n
 * (layer, expert) pairs, layers from 0; keys are layer * ne + expert. */
static int belady(const int32_t *t, size_t n, int64_t ne, int64_t n_keys, int64_t slots, uint64_t *hits) {
    int64_t *key = base_calloc(n ? n : 1, sizeof *key, MEM_MISC), *nxt = base_calloc(n ? n : 1, sizeof *nxt, MEM_MISC);
    int64_t *last = base_calloc((size_t)n_keys, sizeof *last, MEM_MISC), *res = base_calloc((size_t)slots, sizeof *res, MEM_MISC);
    int64_t *pos = base_calloc((size_t)n_keys, sizeof *pos, MEM_MISC);
    int64_t *nu = base_calloc((size_t)n_keys, sizeof *nu, MEM_MISC); /* next use of a resident key */
    uint8_t *leased = base_calloc((size_t)n_keys, 1, MEM_MISC);
    int rc = key && nxt && last && res && pos && nu && leased ? STRATA_OK : STRATA_ENOMEM;
    *hits = 0;
    if (!rc) {
        for (size_t i = 0; i < n; i++) key[i] = (int64_t)t[2 * i] * ne + t[2 * i + 1];
        for (int64_t k = 0; k < n_keys; k++) { last[k] = (int64_t)n; pos[k] = -1; }
        for (size_t i = n; i-- > 0;) { nxt[i] = last[key[i]]; last[key[i]] = (int64_t)i; }
        int64_t n_res = 0;
        size_t g0 = 0; /* first request of the current layer's union */
        for (size_t i = 0; i < n; i++) {
            if (i > 0 && t[2 * i] != t[2 * (i - 1)]) {
                for (size_t j = g0; j < i; j++) leased[key[j]] = 0;
                g0 = i;
            }
            const int64_t k = key[i];
            leased[k] = 1;
            if (pos[k] >= 0) { (*hits)++; nu[k] = nxt[i]; continue; }
            if (n_res == slots) {
                int64_t v = -1;
                for (int64_t s = 0; s < n_res; s++)
                    if (!leased[res[s]] && (v < 0 || nu[res[s]] > nu[res[v]])) v = s;
                if (v < 0) continue; /* every slot leased: the engine streams in waves; not counted */
                pos[res[v]] = -1;
                res[v] = res[--n_res];
                pos[res[v]] = v;
            }
            res[n_res] = k;
            pos[k] = n_res++;
            nu[k] = nxt[i];
        }
    }
    base_free(key); base_free(nxt); base_free(last); base_free(res); base_free(pos); base_free(nu); base_free(leased);
    return rc;
}

/* The true resident hit rate of policy pol at `slots` slots into *hr. */
static int replay(const int32_t *t, size_t n, int64_t ne, int64_t n_layers, int64_t slots, int pol, double *hr,
                  char *err, size_t errlen) {
    cache *c = NULL;
    int rc = cache_create(&c, n_layers * ne, slots, 0, pol, n_layers, 0, err, errlen);
    if (rc) return rc;
    int held[MAX_UNION];
    int nh = 0;
    int32_t cur = -1;
    for (size_t i = 0; i < n; i++) {
        if (t[2 * i] != cur || nh == MAX_UNION) { /* a new layer: release the previous union */
            while (nh) cache_unpin(c, held[--nh]);
            cur = t[2 * i];
        }
        int kind, sl = cache_pin(c, (int64_t)t[2 * i] * ne + t[2 * i + 1], &kind);
        if (sl < 0) { while (nh) cache_unpin(c, held[--nh]); continue; }
        if (kind == CACHE_MISS) cache_publish(c, sl);
        held[nh++] = sl;
    }
    while (nh) cache_unpin(c, held[--nh]);
    cache_stats st;
    cache_get_stats(c, &st);
    cache_free(c);
    *hr = st.requests ? (double)st.hits / (double)st.requests : 0;
    return STRATA_OK;
}

/* The trace's (layer, expert) pairs with layers counted from 0 at the first
 * (keys as the engine's); every id checked against n_experts. */
static int replay_load(const strata_bench_replay_opts *o, int32_t **tt, size_t *n, int64_t *nl, char *err, size_t errlen) {
    uint8_t *buf = NULL;
    size_t len = 0;
    int rc = base_read_file(o->trace, 1u << 30, &buf, &len, err, errlen);
    if (rc) return rc;
    const int32_t *t = (const int32_t *)buf;
    *n = len / 8;
    int32_t maxl = 0, minl = INT32_MAX;
    for (size_t i = 0; i < *n; i++) {
        if (t[2 * i] > maxl) maxl = t[2 * i];
        if (t[2 * i] < minl) minl = t[2 * i];
        if (t[2 * i] < 0 || t[2 * i + 1] < 0 || t[2 * i + 1] >= o->n_experts) {
            snprintf(err, errlen, "%s: request %zu (layer %d, expert %d) is outside %lld experts per layer", o->trace, i,
                     t[2 * i], t[2 * i + 1], (long long)o->n_experts);
            base_free(buf);
            return STRATA_EFORMAT;
        }
    }
    if (*n == 0) {
        snprintf(err, errlen, "%s: no requests in the trace", o->trace);
        base_free(buf);
        return STRATA_EFORMAT;
    }
    *tt = base_alloc(*n * 8, MEM_MISC);
    if (!*tt) { base_free(buf); snprintf(err, errlen, "no memory for the trace"); return STRATA_ENOMEM; }
    for (size_t i = 0; i < *n; i++) { (*tt)[2 * i] = t[2 * i] - minl; (*tt)[2 * i + 1] = t[2 * i + 1]; }
    *nl = (int64_t)maxl - minl + 1;
    base_free(buf);
    return STRATA_OK;
}

int strata_bench_cache_replay(const strata_bench_replay_opts *o, FILE *out, char *err, size_t errlen) {
    if (o->n_experts < 1 || o->n_slots < 1) {
        snprintf(err, errlen, "need at least one expert per layer and one cache size");
        return STRATA_EINVAL;
    }
    for (int a = 0; a < o->n_slots; a++)
        if (o->slots[a] < 1) { snprintf(err, errlen, "cache size %lld: must be >= 1", (long long)o->slots[a]); return STRATA_EINVAL; }
    int32_t *tt = NULL;
    size_t n = 0;
    int64_t nl = 0;
    const int64_t ne = o->n_experts;
    int rc = replay_load(o, &tt, &n, &nl, err, errlen);
    if (rc) return rc;
    uint8_t *seen = base_calloc((size_t)(nl * ne), 1, MEM_MISC);
    if (!seen) { base_free(tt); snprintf(err, errlen, "no memory for %lld keys", (long long)(nl * ne)); return STRATA_ENOMEM; }
    uint64_t first = 0;
    for (size_t i = 0; i < n; i++) {
        int64_t k = (int64_t)tt[2 * i] * ne + tt[2 * i + 1];
        if (!seen[k]) { seen[k] = 1; first++; }
    }
    if (o->csv) fprintf(out, "slots,pct_of_experts,s3fifo,lru,lfu,layer,belady,ceiling\n");
    else fprintf(out, "trace: %zu requests over %lld layers x %lld experts, ceiling %.2f%%\n%8s %7s %9s %9s %9s %9s %9s\n", n, (long long)nl,
                 (long long)ne, 100.0 * (double)(n - first) / (double)n, "slots", "% keys", "S3-FIFO", "LRU", "LFU", "LAYER", "MIN");
    for (int a = 0; a < o->n_slots && !rc; a++) {
        const int64_t slots = o->slots[a];
        double hr[4];
        uint64_t hits = 0;
        for (int pol = 0; pol < 4 && !rc; pol++) rc = replay(tt, n, ne, nl, slots, pol, &hr[pol], err, errlen);
        if (!rc) rc = belady(tt, n, ne, nl * ne, slots, &hits);
        if (rc == STRATA_ENOMEM) snprintf(err, errlen, "no memory for the replay at %lld slots", (long long)slots);
        if (rc) break;
        const double opt = (double)hits / (double)n;
        const double pk = 100.0 * (double)slots / (double)(nl * ne);
        if (o->csv)
            fprintf(out, "%lld,%.1f,%.4f,%.4f,%.4f,%.4f,%.4f,%.4f\n", (long long)slots, pk, hr[0], hr[1], hr[2], hr[3], opt,
                    (double)(n - first) / (double)n);
        else
            fprintf(out, "%8lld %6.1f%% %8.2f%% %8.2f%% %8.2f%% %8.2f%% %8.2f%%\n", (long long)slots, pk, 100 * hr[0], 100 * hr[1],
                    100 * hr[2], 100 * hr[3], 100 * opt);
    }
    base_free(tt);
    base_free(seen);
    return rc;
}

/* ========================================================= one ladder rung */

strata_bench_place_opts strata_bench_place_opts_default(void) {
    return (strata_bench_place_opts){.gen = 8, .prompt_len = 16, .chunk = 64, .policy = -1};
}

int strata_bench_bandwidth(const char *dir, int threads, double *disk_bw, double *mem_bw) {
    char src[160];
    *disk_bw = *mem_bw = 0;
    place_bandwidth(dir, 1, disk_bw, mem_bw, src, sizeof src);
    if (threads > 0 && threads != pool_default_threads()) *mem_bw = membw_probe(threads);
    return *mem_bw > 0 ? STRATA_OK : STRATA_EIO;
}

/* Everything a rung holds open, released by rung_close. */
typedef struct rung {
    cfg c;
    model_layout lay;
    place_plan plan;
    st_index *ix;
    wsrc *w;
    engine *e;
    session *s;
    int32_t *ids;
    float *lg;
} rung;

static void rung_close(rung *r) {
    session_free(r->s);
    engine_free(r->e);
    if (r->w) r->w->ops->close(r->w);
    st_close(r->ix);
    base_free(r->ids);
    base_free(r->lg);
    base_free(r);
}

/* Config, tensors, the plan under the budget (printed to log), the weights, the
 * engine and one session of prompt_len + gen + 1 positions. */
static int rung_open(rung *r, const strata_bench_place_opts *o, FILE *log, char *err, size_t errlen) {
    char path[2048];
    snprintf(path, sizeof path, "%s/config.json", o->model_dir);
    int rc = cfg_load(&r->c, path, err, errlen);
    if (!rc) rc = st_open(&r->ix, o->model_dir, err, errlen);
    if (rc) return rc;
    sbuf pr = {0};
    if ((rc = model_bind_check(&r->c, r->ix, &r->lay, &pr))) {
        snprintf(err, errlen, "%s", pr.s ? pr.s : "bind failed");
        sbuf_free(&pr);
        return rc;
    }
    sbuf_free(&pr);
    r->c.wf = r->lay.wf;
    const int64_t ctx = (int64_t)o->prompt_len + o->gen + 1;
    place_opts po = place_opts_default();
    po.ram_bytes = (uint64_t)(o->ram_gb * 1e9);
    po.ctx = ctx;
    po.prefill_chunk = o->chunk;
    po.n_threads = o->threads;
    po.cache_policy = o->policy >= 0 ? o->policy : PLACE_POLICY_LAYER;
    po.no_readahead = o->no_readahead;
    po.no_prefetch = o->no_prefetch;
    po.no_preload = o->no_preload;
    po.pack_dir = o->pack_dir;
    if (o->no_verify) po.verify_reads = PLACE_VERIFY_OFF;
    po.trace_path = o->trace;
    po.session_bytes = infer_session_bytes;
    po.engine_bytes = infer_engine_bytes;
    if ((rc = place_plan_compute(&r->c, &r->lay, o->model_dir, &po, &r->plan, err, errlen))) return rc;
    place_plan_print(&r->plan, log);
    if ((rc = place_open(&r->w, &r->c, r->ix, o->model_dir, &r->plan, err, errlen))) return rc;
    engine_opts eo = {.n_threads = o->threads, .prefill_chunk = r->plan.prefill_chunk};
    if ((rc = engine_create(&r->e, &r->c, r->w, &eo, err, errlen)) || (rc = session_create(&r->s, r->e, ctx, err, errlen)))
        return rc;
    r->ids = base_alloc((size_t)(o->prompt_len + o->gen) * sizeof *r->ids, MEM_MISC);
    r->lg = base_alloc((size_t)r->c.vocab * sizeof(float), MEM_SCRATCH);
    if (!r->ids || !r->lg) { snprintf(err, errlen, "no memory for the ids and logits"); return STRATA_ENOMEM; }
    return STRATA_OK;
}

static int32_t argmax(const float *lg, int64_t n) {
    int32_t best = 0;
    for (int64_t i = 1; i < n; i++) if (lg[i] > lg[best]) best = (int32_t)i;
    return best;
}

int strata_bench_place_run(const strata_bench_place_opts *o, FILE *log, strata_bench_place_result *res, char *err,
                           size_t errlen) {
    const int gen = o->gen, plen = o->prompt_len, seed = o->seed;
    memset(res, 0, sizeof *res);
    if (!o->model_dir || o->ram_gb < 0 || gen < 1 || plen < 1) {
        snprintf(err, errlen, "a model directory, a budget >= 0, gen >= 1 and prompt_len >= 1 are needed");
        return STRATA_EINVAL;
    }
    const char *kname = kern_init(NULL); /* the fastest kernels this CPU has */
    fprintf(log, "place_run: kernels %s\n", kname);
    rung *r = base_calloc(1, sizeof *r, MEM_MISC);
    if (!r) { snprintf(err, errlen, "out of memory"); return STRATA_ENOMEM; }
    int rc = rung_open(r, o, log, err, errlen);
    if (rc) { rung_close(r); return rc; }
    const cfg *c = &r->c;
    const place_plan *plan = &r->plan;
    int32_t *ids = r->ids;
    for (int i = 0; i < plen; i++) ids[i] = (int32_t)(((int64_t)(i + 31 * seed) * 7919 + 11) % (c->vocab - 300) + 1);
    double t0 = base_now();
    if ((rc = session_eval(r->s, ids, plen, r->lg))) {
        snprintf(err, errlen, "%s", session_errmsg(r->s));
        rung_close(r);
        return rc;
    }
    double t_prefill = base_now() - t0;
    place_stats ps;
    place_stats_get(r->w, &ps);
    place_stats_print(&ps, plan, log);
    place_stats_reset(r->w);
    uint64_t h = BASE_FNV_INIT;
    double t_dec = 0;
    const double steal0 = o->steal_s ? o->steal_s() : -1;
    const double w0 = base_now();
    for (int g = 0; g < gen; g++) {
        int32_t best = argmax(r->lg, c->vocab);
        ids[plen + g] = best;
        h = base_fnv1a(&best, sizeof best, h);
        if (g == gen - 1) break;
        double t1 = base_now();
        if ((rc = session_eval(r->s, &best, 1, r->lg))) {
            snprintf(err, errlen, "%s", session_errmsg(r->s));
            rung_close(r);
            return rc;
        }
        t_dec += base_now() - t1;
    }
    int n_dec = gen - 1;
    const double w1 = base_now();
    const double steal1 = o->steal_s ? o->steal_s() : -1;
    const long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    const double steal_pct = steal0 >= 0 && steal1 >= steal0 && t_dec > 0 && ncpu > 0 ? 100 * (steal1 - steal0) / (t_dec * (double)ncpu) : 0;
    place_stats_get(r->w, &ps);
    fprintf(log, "decode (%d tokens):\n", n_dec);
    place_stats_print(&ps, plan, log);
    /* for bench/ladder/profile.sh: samples taken with perf -k CLOCK_MONOTONIC
     * between these two instants are the decode's */
    fprintf(log, "decode window: %.6f %.6f (CLOCK_MONOTONIC s)\n", w0, w1);
    if (steal0 >= 0) fprintf(log, "steal: %.2f s of the %ld CPUs' time went to other guests (%.1f%% of the decode)\n", steal1 - steal0, ncpu, steal_pct);
    double spt = n_dec ? t_dec / n_dec : 0;
    uint64_t rd = ps.bytes_trunk + ps.bytes_head + ps.bytes_embed + ps.bytes_experts;
    double gb_tok = n_dec ? (double)rd / n_dec / 1e9 : 0;
    const double disk_bw = o->disk_gbs > 0 ? o->disk_gbs * 1e9 : plan->disk_bw, mem_bw = o->mem_gbs > 0 ? o->mem_gbs * 1e9 : plan->mem_bw;
    double floor_s = disk_bw > 0 ? gb_tok * 1e9 / disk_bw : 0;
    /* the physical limit: what a token must read from disk, or touch in memory */
    const double touch_gb = (double)plan->touch_bytes_per_token / 1e9, mem_s = mem_bw > 0 ? touch_gb * 1e9 / mem_bw : 0;
    const double limit_s = floor_s > mem_s ? floor_s : mem_s;
    uint64_t rss = base_peak_rss();
    fprintf(log, "ids:");
    for (int g = 0; g < gen; g++) fprintf(log, " %d", ids[plen + g]);
    fprintf(log, "\n");
    char label[32];
    if (o->ram_gb > 0) snprintf(label, sizeof label, "%g", o->ram_gb); else snprintf(label, sizeof label, "resident");
    /* budget, pinned, prefill s/token, decode s/token, GB read/token, I/O floor s/token, % of the I/O limit,
     * true expert hit rate, I/O wait share, peak RSS GB, ids hash; GB touched/token, disk GB/s, memory GB/s,
     * the limit s/token, decode / limit, prediction hit rate %, row slices, % of the CPUs' time stolen */
    snprintf(res->line, sizeof res->line, "%s,%lld/%lld,%.4f,%.4f,%.4f,%.4f,%.1f,%.1f,%.1f,%.3f,%016llx,%.4f,%.3f,%.2f,%.4f,%.2f,%.1f,%s,%.1f", label,
             (long long)plan->n_pinned, (long long)plan->n_units, t_prefill / plen, spt, gb_tok, floor_s, spt > 0 ? 100 * floor_s / spt : 0,
             100 * ps.hit_rate, t_dec > 0 ? 100 * ps.wait_s / t_dec : 0, (double)rss / 1e9, (unsigned long long)h, touch_gb,
             disk_bw / 1e9, mem_bw / 1e9, limit_s, limit_s > 0 ? spt / limit_s : 0,
             ps.pred_requests ? 100.0 * (double)ps.pred_hits / (double)ps.pred_requests : 0, plan->sliced ? "sliced" : "whole", steal_pct);
    res->peak_rss = rss;
    rung_close(r);
    return STRATA_OK;
}
