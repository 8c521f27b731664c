/*
 * bench_io.c: disk read bandwidth the way the streaming source reads.
 *
 * On a model directory: (1) routed experts read in place (the 4096-aligned range
 * enclosing each expert's contiguous run) vs the same number of bytes at aligned
 * offsets (what a repacked expert file would read), at several queue depths; (2)
 * large trunk-like reads cut into chunks of 1/4/8 MiB at depth 8/16/32. Every
 * configuration reads experts no earlier configuration touched, with O_DIRECT,
 * so neither the page cache nor a previous pass serves it.
 *
 * With --slices: only (3), the row-slice reads of a trunk streamed below the
 * whole-unit floor (wsrc_stream rows_get): 512 MB of fresh shard bytes read in
 * slices of 4..128 MiB, each one request of 4 MiB chunks, the next slice in flight
 * while one is consumed (as infer.c mm_slices asks), three rounds.
 *
 * usage: bench_io MODEL_DIR [--n N] [--slices]
 */
#include <stdlib.h>
#include <string.h>
#include "io.h"
#include "model.h"

typedef struct xr { int shard; uint64_t off, n; } xr;

static uint64_t rng(uint64_t *s) { *s ^= *s << 13; *s ^= *s >> 7; *s ^= *s << 17; return *s; }

static double run(io_ring *r, io_file *f, const xr *x, int n, int depth, int aligned_mode, uint8_t *buf, uint64_t slot) {
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
        if (d->rc) { fprintf(stderr, "bench_io: read failed\n"); exit(1); }
        bytes += d->got;
        d->ud = NULL;
        inflight--;
    }
    double dt = base_now() - t0;
    return dt > 0 ? (double)bytes / dt : 0;
}

/* Reads total bytes from (f, off) in slices of sb bytes, two in flight. */
static double slices(io_file *f, uint64_t off, uint64_t total, uint64_t sb, uint8_t *buf) {
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

int main(int argc, char **argv) {
    if (argc < 2) { fprintf(stderr, "usage: bench_io MODEL_DIR [--n N] [--slices]\n"); return 2; }
    const char *dir = argv[1];
    int n = argc > 3 && !strcmp(argv[2], "--n") ? atoi(argv[3]) : 192;
    int only_slices = !strcmp(argv[argc - 1], "--slices");
    char err[2048], path[2048];
    static cfg c;
    st_index *ix = NULL;
    snprintf(path, sizeof path, "%s/config.json", dir);
    if (cfg_load(&c, path, err, sizeof err) || st_open(&ix, dir, err, sizeof err)) { fprintf(stderr, "bench_io: %s\n", err); return 1; }
    int64_t n_moe = c.n_layers - c.first_dense, total = n_moe * c.n_experts;
    xr *x = malloc((size_t)total * sizeof *x);
    int64_t m = 0;
    uint64_t maxn = 0;
    for (int64_t L = c.first_dense; L < c.n_layers; L++)
        for (int64_t E = 0; E < c.n_experts; E++) {
            char nm[256];
            snprintf(nm, sizeof nm, "language_model.model.layers.%lld.block_sparse_moe.experts.%lld.w1.weight_packed", (long long)L, (long long)E);
            const st_tensor *a = st_find(ix, nm);
            snprintf(nm, sizeof nm, "language_model.model.layers.%lld.block_sparse_moe.experts.%lld.w3.weight_scale", (long long)L, (long long)E);
            const st_tensor *b = st_find(ix, nm);
            if (!a || !b || a->shard != b->shard) continue;
            x[m] = (xr){a->shard, a->off, b->off + b->nbytes - a->off};
            if (x[m].n > maxn) maxn = x[m].n;
            m++;
        }
    uint64_t s = 0x1234567;
    for (int64_t i = m - 1; i > 0; i--) { int64_t j = (int64_t)(rng(&s) % (uint64_t)(i + 1)); xr t = x[i]; x[i] = x[j]; x[j] = t; }
    io_file *f = calloc((size_t)st_n_shards(ix), sizeof *f);
    for (int i = 0; i < st_n_shards(ix); i++) io_file_open(&f[i], st_shard_path(ix, i), err, sizeof err);
    if (only_slices) {
        const uint64_t run_total = 512ull << 20, sizes[] = {4ull << 20, 8ull << 20, 16ull << 20, 32ull << 20, 64ull << 20, 128ull << 20};
        uint8_t *slbuf = base_alloc_aligned(2 * (128ull << 20), 1u << 20, MEM_IO);
        printf("%-12s %8s %8s %8s\n", "slice MiB", "GB/s", "GB/s", "GB/s");
        double bw[3][6];
        uint64_t at = 0;
        for (int rep = 0; rep < 3; rep++)
            for (int k = 0; k < 6; k++) { /* fresh bytes every time: the shards in turn */
                const int sh = (int)(at / (st_shard_size(ix, 0) - run_total)) % st_n_shards(ix);
                bw[rep][k] = slices(&f[sh], io_align_down(at % (st_shard_size(ix, 0) - run_total)), run_total, sizes[k], slbuf);
                at += run_total + (64ull << 20);
            }
        for (int k = 0; k < 6; k++)
            printf("%-12llu %8.3f %8.3f %8.3f\n", (unsigned long long)(sizes[k] >> 20), bw[0][k] / 1e9, bw[1][k] / 1e9, bw[2][k] / 1e9);
        return 0;
    }
    uint64_t slot = io_align_up(maxn) + 2 * IO_ALIGN;
    uint8_t *buf = base_alloc_aligned(slot * 64, 1u << 20, MEM_IO);
    unsigned long long misaligned = 0;
    for (int64_t i = 0; i < m; i++) misaligned += x[i].off % IO_ALIGN != 0;
    printf("experts: %lld contiguous records of %.2f MB, %llu not 4096-aligned in the shards\n", (long long)m, (double)maxn / 1e6, misaligned);
    printf("%-34s %6s %10s\n", "read", "depth", "GB/s");
    int64_t used = 0;
    int depths[] = {1, 4, 8, 16, 32};
    for (int di = 0; di < 5; di++)
        for (int mode = 0; mode < 2; mode++) {
            if (used + n > m) used = 0;
            io_ring *r = NULL;
            io_ring_create(&r, 64, 0, 0, err, sizeof err);
            double bw = run(r, f, x + used, n, depths[di], mode, buf, slot);
            used += n;
            io_ring_free(r);
            printf("%-34s %6d %10.3f\n", mode ? "expert, aligned (repacked)" : "expert, in place (enclosing range)", depths[di], bw / 1e9);
        }
    /* trunk-like: 256 MB runs of consecutive experts' bytes, chunked */
    uint64_t chunks[] = {1u << 20, 4u << 20, 8u << 20};
    int tdepth[] = {8, 16, 32};
    for (int ci = 0; ci < 3; ci++)
        for (int di = 0; di < 3; di++) {
            io_ring *r = NULL;
            io_ring_create(&r, (unsigned)tdepth[di], chunks[ci], 0, err, sizeof err);
            uint64_t run_bytes = 64u << 20;
            uint8_t *tb = base_alloc_aligned(run_bytes, 1u << 20, MEM_IO);
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
            printf("trunk run, %u MiB chunks %*s %6d %10.3f\n", (unsigned)(chunks[ci] >> 20), 14, "", tdepth[di], (double)got / dt / 1e9);
            base_free(tb);
            io_ring_free(r);
        }
    return 0;
}
