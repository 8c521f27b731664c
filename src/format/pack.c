/*
 * pack.c: builds the streaming layout (see pack.h): the layout of the trunk,
 * the trunk copy with its hashes, the expert checksums, and pack_build itself.
 * Elsewhere: source reads and trunk writes (pack_io.c), identity, manifests and
 * pack_open (pack_manifest.c), pack_verify and the content digest
 * (pack_verify.c); what they share is in pack_priv.h.
 *
 * Writing is one thread driving two asynchronous queues. Source bytes come in
 * aligned chunks of up to 4 MiB, SRC_SLOTS of them read ahead with O_DIRECT
 * through io.c; a chunk whose pages are all in the page cache (mincore) is not
 * read ahead but pread straight into the output buffer when its turn comes, so a
 * warm source costs no disk time. The thread copies each piece into the current
 * 4 MiB output buffer and hashes it there, while up to OUT_BUFS - 1 earlier
 * buffers are being written to trunk.bin.tmp (io_uring, O_DIRECT, preallocated).
 * Expert checksums stream through the same chunked reads. Memory: SRC_SLOTS +
 * OUT_BUFS buffers (48 MiB) whatever the model's size.
 *
 * One thread is enough: pread from the page cache plus XXH3 run at 4.5-5.2 GB/s
 * on one core here, against ~2 GB/s of disk. Hashing on a second thread measured
 * no faster (warm 2.4 GB trunk, loaded machine, medians 1.30 vs 1.19 GB/s). A cold
 * source is read from the same disk the trunk goes to, and reads and writes share
 * its bandwidth: such a copy runs at 1 / (1/read + 1/write), not at write speed.
 */
#define XXH_STATIC_LINKING_ONLY
#include "arch.h"
#include "pack.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <liburing.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>
#include <xxhash.h>
#include "io.h"
#include "jsonx.h"
#include "pack_priv.h"
#include "vfs.h"

/* ===================================================================== views */

wt pack_view(const void *p, int dtype, int ndim, const int64_t *shape, int role) {
    wt w = {.p = p, .dtype = dtype, .rows = 1, .cols = 0};
    if (ndim <= 1) {
        w.cols = ndim == 1 ? shape[0] : 1;
    } else if (ndim == 2) {
        w.rows = shape[0];
        w.cols = shape[1];
        /* MXFP4 packed codes: cols is the logical input width (model.h) */
        if (role == R_EXP_W1P || role == R_EXP_W2P || role == R_EXP_W3P) w.cols *= 2;
        if (dtype == DT_I32) w.cols *= 8; /* INT4 words: likewise */
    } else {
        w.rows = shape[0];
        w.cols = shape[1] * shape[2];
    }
    return w;
}

/* ==================================================================== layout */

typedef struct collect {
    const cfg *c;
    const st_index *ix;
    lregion *r;
    int cap;
    int cls_mask;              /* for the head: which classes to take */
    sbuf *missing;
} collect;

static int collect_fn(void *ud, const tspec *t) {
    collect *c = ud;
    if (c->cls_mask && !((1 << t->cls) & c->cls_mask)) return 0;
    const st_tensor *s = st_find(c->ix, t->name);
    /* tensors the config switches off may be absent (as in wsrc_resident) */
    if (!s && ((t->role == R_MLA_G && !c->c->mla_out_gate) || (t->role == R_MOE_LAT_NORM && !c->c->latent_norm))) return 0;
    if (!s) { sbuf_line(c->missing, "tensor %s is missing", t->name); return 0; }
    if (c->r->n == c->cap) {
        int cap = c->cap ? c->cap * 2 : 32;
        lt *nt = base_realloc(c->r->t, (size_t)cap * sizeof *nt, MEM_INDEX);
        if (!nt) return STRATA_ENOMEM;
        c->r->t = nt;
        c->cap = cap;
    }
    c->r->t[c->r->n++] = (lt){.src = s, .role = t->role, .kind = t->kind};
    return 0;
}

void pack_layout_free(layout *l) {
    base_free(l->embed.t);
    if (l->units)
        for (int64_t u = 0; u < l->n_units; u++) {
            for (int i = 0; i < l->units[u].n; i++) base_free(l->units[u].t[i].blk);
            base_free(l->units[u].t);
        }
    base_free(l->units);
    memset(l, 0, sizeof *l);
}

int pack_layout_build(const cfg *c, const st_index *ix, layout *l, char *err, size_t errlen) {
    memset(l, 0, sizeof *l);
    l->n_units = c->n_layers + 1;
    l->units = base_calloc((size_t)l->n_units, sizeof *l->units, MEM_INDEX);
    if (!l->units) return base_fail(err, errlen, STRATA_ENOMEM, "pack: out of memory");
    sbuf missing = {0};
    int rc = 0;
    collect cl = {.c = c, .ix = ix, .r = &l->embed, .cls_mask = 1 << TC_EMBED, .missing = &missing};
    rc = schema_walk(c, 0, collect_fn, &cl);
    for (int64_t L = 0; L < c->n_layers && !rc; L++) {
        cl = (collect){.c = c, .ix = ix, .r = &l->units[L], .missing = &missing};
        rc = schema_walk_layer(c, L, model_wf(c, ix), collect_fn, &cl);
    }
    if (!rc) {
        cl = (collect){.c = c, .ix = ix, .r = &l->units[c->n_layers], .cls_mask = (1 << TC_FINAL) | (1 << TC_LM_HEAD), .missing = &missing};
        rc = schema_walk(c, 0, collect_fn, &cl);
    }
    if (rc || missing.n) {
        if (rc == STRATA_ENOMEM) base_fail(err, errlen, rc, "pack: out of memory laying out the trunk");
        else rc = base_fail(err, errlen, rc ? rc : STRATA_EFORMAT, "pack: %d tensors missing:\n%s", missing.n,
                            missing.s ? missing.s : "");
        sbuf_free(&missing);
        pack_layout_free(l);
        return rc;
    }
    uint64_t off = 0;
    for (int64_t u = -1; u < l->n_units; u++) {
        lregion *r = u < 0 ? &l->embed : &l->units[u];
        r->off = off;
        uint64_t rel = 0;
        /* A region whose tensors form one gap-free run in one shard (the released
         * checkpoint's layers, the generator's) keeps the source's relative offsets,
         * so it is copied as ONE sequential stream of 32 MB reads instead of tensor
         * by tensor (the per-tensor copy of the ladder trunk ran at 42% of the disk's
         * write bandwidth). Otherwise tensors are packed at 64-byte alignment. */
        uint64_t lo = UINT64_MAX, hi = 0, sum = 0;
        int same = r->n > 0;
        for (int i = 0; i < r->n; i++) {
            const st_tensor *s = r->t[i].src;
            if (s->shard != r->t[0].src->shard) same = 0;
            if (s->off < lo) lo = s->off;
            if (s->off + s->nbytes > hi) hi = s->off + s->nbytes;
            sum += s->nbytes;
        }
        if (same && hi - lo == sum) {
            r->verbatim = 1;
            r->src_shard = r->t[0].src->shard;
            r->src_off = lo;
            r->src_len = hi - lo;
            for (int i = 0; i < r->n; i++) r->t[i].off = r->t[i].src->off - lo;
            rel = hi - lo;
        } else {
            for (int i = 0; i < r->n; i++) {
                rel = (rel + PACK_TENSOR_ALIGN - 1) & ~(uint64_t)(PACK_TENSOR_ALIGN - 1);
                r->t[i].off = rel;
                rel += r->t[i].src->nbytes;
            }
        }
        r->nbytes = io_align_up(rel ? rel : 1);
        off += r->nbytes;
    }
    l->total = off;
    return STRATA_OK;
}

/* Row blocks of bb bytes (pack_block_rows) for the layers' and the head's
 * matrices, their hashes filled by pack_write_trunk. */
static int layout_blocks(layout *l, uint64_t bb, char *err, size_t errlen) {
    for (int64_t u = 0; u < l->n_units; u++)
        for (int i = 0; i < l->units[u].n; i++) {
            lt *x = &l->units[u].t[i];
            /* a quantised matrix's scales are checked whole: their blocks would
             * hang off the matrix's role, where its own blocks are (wt.vb) */
            if (schema_is_companion(x->kind)) continue;
            if (!(x->blk_rows = pack_block_rows(x->src->ndim, x->src->shape[0], x->src->nbytes, bb))) continue;
            x->n_blk = (x->src->shape[0] + x->blk_rows - 1) / x->blk_rows;
            if (!(x->blk = base_calloc((size_t)x->n_blk, sizeof *x->blk, MEM_INDEX)))
                return base_fail(err, errlen, STRATA_ENOMEM, "pack: out of memory");
        }
    return STRATA_OK;
}

/* ==================================================================== trunk */

void pack_tw_start(twalk *w, twt *t, int n) {
    w->t = t;
    w->n = n;
    w->ti = -1;
    w->pos = 0;
}

void pack_tw_bytes(twalk *w, const uint8_t *p, uint64_t k) {
    while (k) {
        if (w->ti < 0) { /* the tensor at or after pos with the lowest offset */
            int best = -1;
            for (int i = 0; i < w->n; i++)
                if (w->t[i].off + w->t[i].nbytes > w->pos && (best < 0 || w->t[i].off < w->t[best].off)) best = i;
            if (best < 0) { w->pos += k; return; }
            w->ti = best;
            XXH3_64bits_reset(&w->th);
            XXH3_64bits_reset(&w->bh);
        }
        const twt *x = &w->t[w->ti];
        if (w->pos < x->off) { /* a gap before it */
            const uint64_t g = x->off - w->pos < k ? x->off - w->pos : k;
            w->pos += g; p += g; k -= g;
            continue;
        }
        const uint64_t end = x->off + x->nbytes;
        uint64_t n = end - w->pos < k ? end - w->pos : k;
        if (x->bb) { /* up to the end of the block */
            const uint64_t q = w->pos - x->off;
            uint64_t be = (q / x->bb + 1) * x->bb;
            if (be > x->nbytes) be = x->nbytes;
            if (n > be - q) n = be - q;
            XXH3_64bits_update(&w->bh, p, n);
            if (q + n == be) {
                x->blk[q / x->bb] = XXH3_64bits_digest(&w->bh);
                XXH3_64bits_reset(&w->bh);
            }
        }
        XXH3_64bits_update(&w->th, p, n);
        w->pos += n; p += n; k -= n;
        if (w->pos == end) {
            *x->h = XXH3_64bits_digest(&w->th);
            w->ti = -1;
        }
    }
}

typedef struct tcopy {         /* the trunk copy in progress */
    int hash_only;             /* pack_verify: hash the source layout, write nothing */
    const char *phase;
    const char *path;          /* the file written (messages) */
    wring *w;
    sstream *s;
    uint64_t fill, done, total;
    double t0, last;
    pack_progress_fn progress;
    void *ud;
    twalk tw;                  /* the region being written: its tensors' hashes */
} tcopy;

static int tc_flush(tcopy *t, char *err, size_t errlen) {
    int rc = t->hash_only ? 0 : pack_wring_put(t->w, t->fill);
    t->done += t->fill;
    t->fill = 0;
    if (rc) return base_fail(err, errlen, STRATA_EIO, "%s: write failed: %s", t->path, strerror(t->w->err_no));
    double now = base_now();
    if (t->progress && now - t->last > 0.5) {
        t->progress(t->ud, t->phase, t->done, t->total, now - t->t0);
        t->last = now;
    }
    return STRATA_OK;
}

/* The region whose bytes come next: its tensors' own hashes and their blocks'
 * follow them (a tensor read alone, in row slices, is checked against its own; a
 * streamed matrix block by block, wsrc_stream). */
static int tc_region(tcopy *t, lregion *r, char *err, size_t errlen) {
    base_free(t->tw.t);
    t->tw.t = NULL;
    twt *a = base_calloc((size_t)r->n + 1, sizeof *a, MEM_INDEX);
    if (!a) return base_fail(err, errlen, STRATA_ENOMEM, "pack: out of memory");
    for (int i = 0; i < r->n; i++) {
        const lt *x = &r->t[i];
        a[i] = (twt){x->off, x->src->nbytes, x->n_blk ? (uint64_t)x->blk_rows * (x->src->nbytes / (uint64_t)x->src->shape[0]) : 0,
                     &r->t[i].xxh3, x->blk};
    }
    pack_tw_start(&t->tw, a, r->n);
    return STRATA_OK;
}

/* Appends n bytes to the trunk and to the region's hash: zeros (pc == NULL) or the
 * piece pc (copied from its slot, or pread straight into place when resident). */
static int tc_put(tcopy *t, XXH3_state_t *h, const spiece *pc, uint64_t n, char *err, size_t errlen) {
    for (uint64_t o = 0; o < n;) {
        uint64_t k = t->w->bsz - t->fill;
        if (k > n - o) k = n - o;
        uint8_t *dst = t->w->buf[t->w->cur] + t->fill;
        if (!pc) {
            memset(dst, 0, k);
        } else if (pc->p) {
            memcpy(dst, pc->p + o, k);
        } else {
            spiece part = {.shard = pc->shard, .off = pc->off + o, .n = k};
            int rc = pack_src_pread(t->s, &part, dst, err, errlen);
            if (rc) return rc;
        }
        XXH3_64bits_update(h, dst, k);
        pack_tw_bytes(&t->tw, dst, k);
        t->fill += k;
        o += k;
        if (t->fill == t->w->bsz) {
            int rc = tc_flush(t, err, errlen);
            if (rc) return rc;
        }
    }
    return STRATA_OK;
}

/* Appends the next n source bytes (one extent) of the stream. */
static int tc_src(tcopy *t, XXH3_state_t *h, uint64_t n, char *err, size_t errlen) {
    while (n) {
        spiece pc;
        int rc = pack_src_next(t->s, &pc, err, errlen);
        if (rc < 0) return rc;
        if (rc == 0 || pc.n > n) return base_fail(err, errlen, STRATA_EIO, "pack: internal error: source stream ended early");
        if ((rc = tc_put(t, h, &pc, pc.n, err, errlen))) return rc;
        n -= pc.n;
    }
    return STRATA_OK;
}

/* Writes trunk.bin.tmp: regions in order, each region's XXH3 into hashes[u + 1]
 * (embed: hashes[0]) and each tensor's into its lt. One thread: source reads and writes are both asynchronous,
 * so the copy into a buffer and its hashing overlap the reads ahead and the
 * writes behind it. tmp == NULL: only the hashes (the source as it would be
 * packed now, for pack_verify), nothing is written. */
int pack_write_trunk(layout *l, const st_index *ix, const char *tmp, int flags, pack_progress_fn progress,
                       void *ud, uint64_t *hashes, pack_result *res, char *err, size_t errlen) {
    int64_t nx = 0;
    for (int64_t u = -1; u < l->n_units; u++) {
        const lregion *r = u < 0 ? &l->embed : &l->units[u];
        nx += r->verbatim ? 1 : r->n;
    }
    sext *x = base_alloc((size_t)(nx + 1) * sizeof *x, MEM_IO);
    if (!x) return base_fail(err, errlen, STRATA_ENOMEM, "pack: out of memory");
    nx = 0;
    for (int64_t u = -1; u < l->n_units; u++) {
        const lregion *r = u < 0 ? &l->embed : &l->units[u];
        if (r->verbatim) x[nx++] = (sext){r->src_shard, r->src_off, r->src_len};
        else for (int i = 0; i < r->n; i++) x[nx++] = (sext){r->t[i].src->shard, r->t[i].src->off, r->t[i].src->nbytes};
    }
    const int small = flags & PACK_SMALL_IO;
    sstream s;
    wring w;
    memset(&w, 0, sizeof w);
    double t0 = base_now(); /* timed like pack_measure_write_bw: open to fsync */
    int fd = tmp ? pack_wfile_open(tmp, 0, l->total, err, errlen) : -1;
    if (tmp && fd < 0) { base_free(x); return fd; }
    int rc = pack_src_open(&s, ix, x, nx, flags & (PACK_SRC_DIRECT | PACK_SRC_CACHED), small ? SMALL_CHUNK : SRC_CHUNK, err, errlen);
    if (rc) { if (fd >= 0) close(fd); base_free(x); return rc; }
    rc = pack_wring_init(&w, fd, small ? SMALL_OUT : OUT_BYTES, err, errlen);
    tcopy t = {.hash_only = !tmp, .phase = tmp ? "trunk" : "source", .path = tmp, .w = &w, .s = &s, .total = l->total,
               .t0 = base_now(), .progress = progress, .ud = ud};
    for (int64_t u = -1; u < l->n_units && !rc; u++) {
        lregion *r = u < 0 ? &l->embed : &l->units[u];
        XXH3_state_t h;
        XXH3_64bits_reset(&h);
        rc = tc_region(&t, r, err, errlen);
        uint64_t rel = 0;
        if (!rc && r->verbatim) {
            rc = tc_src(&t, &h, r->src_len, err, errlen);
            rel = r->src_len;
        }
        for (int i = 0; i < r->n && !rc && !r->verbatim; i++) {
            rc = tc_put(&t, &h, NULL, r->t[i].off - rel, err, errlen);
            if (!rc) rc = tc_src(&t, &h, r->t[i].src->nbytes, err, errlen);
            rel = r->t[i].off + r->t[i].src->nbytes;
        }
        if (!rc) rc = tc_put(&t, &h, NULL, r->nbytes - rel, err, errlen);
        hashes[u + 1] = XXH3_64bits_digest(&h);
    }
    if (!rc && t.fill) rc = tc_flush(&t, err, errlen);
    if (tmp && !rc && pack_wring_drain(&w)) rc = base_fail(err, errlen, STRATA_EIO, "%s: write failed: %s", tmp, strerror(w.err_no));
    if (tmp && !rc && vfs_fsync(fd)) rc = base_fail(err, errlen, STRATA_EIO, "%s: fsync: %s", tmp, strerror(errno));
    base_free(t.tw.t);
    res->trunk_secs = base_now() - t0;
    res->src_direct_bytes = s.bytes_direct;
    res->src_cached_bytes = s.bytes_cached;
    pack_wring_free(&w);
    pack_src_close(&s);
    if (fd >= 0) close(fd);
    base_free(x);
    if (progress && !rc) progress(ud, t.phase, l->total, l->total, base_now() - t.t0);
    return rc;
}

/* =================================================================== experts */

typedef struct xrec {
    int64_t L, E;
    int shard;
    uint64_t off, nbytes;    /* contiguous run, or nbytes = 0 when scattered */
} xrec;

typedef struct xcollect { const st_index *ix; const st_tensor *t[9]; int n; } xcollect;
static int xcollect_fn(void *ud, const tspec *t) {
    xcollect *x = ud;
    if (x->n < 9) x->t[x->n++] = st_find(x->ix, t->name);
    return 0;
}

static int expert_tensors(const cfg *c, const st_index *ix, int bf16, int64_t L, int64_t E, xcollect *x) {
    x->ix = ix;
    x->n = 0;
    schema_walk_expert(c, L, E, bf16, xcollect_fn, x);
    for (int i = 0; i < x->n; i++) if (!x->t[i]) return -1;
    return 0;
}

static int xrec_cmp(const void *a, const void *b) {
    const xrec *x = a, *y = b;
    if (x->shard != y->shard) return x->shard < y->shard ? -1 : 1;
    return x->off < y->off ? -1 : x->off > y->off;
}

/* Hashes every expert in disk order; out[(L - first_dense) * n_experts + E]. The
 * experts stream through the same chunked reads as the trunk (large reads across
 * neighbouring experts, page-cache-resident chunks not read again), so memory
 * stays bounded whatever an expert's size. With expect != NULL compares instead
 * and reports the first mismatch. */
int pack_hash_experts(const cfg *c, const st_index *ix, uint64_t *out, const uint64_t *expect, int flags,
                        pack_progress_fn progress, void *ud, uint64_t *bytes_done, char *err, size_t errlen) {
    const int64_t n_moe = c->n_layers - c->first_dense, NE = c->n_experts, n_all = n_moe * NE;
    if (n_moe <= 0) return STRATA_OK;
    int bf16 = model_wf(c, ix); /* the formats (SW_*) */
    xrec *recs = base_alloc((size_t)n_all * sizeof *recs, MEM_INDEX);
    if (!recs) return base_fail(err, errlen, STRATA_ENOMEM, "pack: out of memory");
    int rc = STRATA_OK;
    uint64_t total = 0;
    int64_t nx = 0;
    for (int64_t L = c->first_dense; L < c->n_layers && !rc; L++)
        for (int64_t E = 0; E < NE; E++) {
            xcollect x;
            if (expert_tensors(c, ix, bf16, L, E, &x)) {
                rc = base_fail(err, errlen, STRATA_EFORMAT, "pack: layer %lld expert %lld: tensor missing", (long long)L, (long long)E);
                break;
            }
            xrec *r = &recs[(L - c->first_dense) * NE + E];
            *r = (xrec){.L = L, .E = E, .shard = x.t[0]->shard, .off = x.t[0]->off};
            uint64_t end = x.t[0]->off, sum = 0;
            int contig = 1;
            for (int i = 0; i < x.n; i++) {
                if (x.t[i]->shard != r->shard || x.t[i]->off != end) contig = 0;
                end = x.t[i]->off + x.t[i]->nbytes;
                sum += x.t[i]->nbytes;
            }
            r->nbytes = contig ? sum : 0;
            nx += contig ? 1 : x.n;
            total += sum;
        }
    sext *x = rc ? NULL : base_alloc((size_t)(nx + 1) * sizeof *x, MEM_INDEX);
    if (!rc && !x) rc = base_fail(err, errlen, STRATA_ENOMEM, "pack: out of memory");
    if (rc) { base_free(recs); return rc; }
    qsort(recs, (size_t)n_all, sizeof *recs, xrec_cmp);
    nx = 0;
    for (int64_t i = 0; i < n_all; i++) {
        const xrec *r = &recs[i];
        if (r->nbytes) { x[nx++] = (sext){r->shard, r->off, r->nbytes}; continue; }
        xcollect xc; /* scattered: its tensors in schema order, hashed as one */
        expert_tensors(c, ix, bf16, r->L, r->E, &xc);
        for (int k = 0; k < xc.n; k++) x[nx++] = (sext){xc.t[k]->shard, xc.t[k]->off, xc.t[k]->nbytes};
    }
    const uint64_t chunk = flags & PACK_SMALL_IO ? SMALL_CHUNK : SRC_CHUNK;
    sstream s;
    uint8_t *scratch = base_alloc_aligned(chunk, IO_ALIGN, MEM_IO); /* resident pieces */
    if (!scratch) rc = base_fail(err, errlen, STRATA_ENOMEM, "pack: out of memory");
    else rc = pack_src_open(&s, ix, x, nx, flags & (PACK_SRC_DIRECT | PACK_SRC_CACHED), chunk, err, errlen);
    if (rc) { base_free(scratch); base_free(x); base_free(recs); return rc; }
    double t0 = base_now(), last = t0;
    uint64_t done = 0;
    int64_t xi = 0;
    for (int64_t i = 0; i < n_all && !rc; i++) {
        const xrec *r = &recs[i];
        int n_ext = 1;
        if (!r->nbytes) {
            xcollect xc;
            expert_tensors(c, ix, bf16, r->L, r->E, &xc);
            n_ext = xc.n;
        }
        XXH3_state_t h;
        XXH3_64bits_reset(&h);
        for (int k = 0; k < n_ext && !rc; k++, xi++) {
            for (uint64_t left = x[xi].len; left && !rc;) {
                spiece pc;
                int got = pack_src_next(&s, &pc, err, errlen);
                if (got <= 0 || pc.n > left) {
                    char e2[1024];
                    snprintf(e2, sizeof e2, "%s", got < 0 ? err : "read plan out of step");
                    rc = base_fail(err, errlen, STRATA_EIO, "layer %lld expert %lld unreadable: %s", (long long)r->L,
                                   (long long)r->E, e2);
                    break;
                }
                const uint8_t *p = pc.p;
                if (!p && !(rc = pack_src_pread(&s, &pc, scratch, err, errlen))) p = scratch;
                if (rc) break;
                XXH3_64bits_update(&h, p, pc.n);
                left -= pc.n;
                done += pc.n;
            }
        }
        out[(r->L - c->first_dense) * NE + r->E] = XXH3_64bits_digest(&h);
        double now = base_now();
        if (progress && now - last > 0.5) { progress(ud, "experts", done, total, now - t0); last = now; }
    }
    if (!rc && expect) {
        /* report the first mismatch in (layer, expert) order */
        for (int64_t i = 0; i < n_all && !rc; i++)
            if (out[i] != expect[i]) {
                const int64_t L = c->first_dense + i / NE, E = i % NE;
                xcollect xc;
                expert_tensors(c, ix, bf16, L, E, &xc);
                const st_tensor *a = xc.t[0], *b = xc.t[xc.n - 1];
                rc = base_fail(err, errlen, STRATA_ECORRUPT,
                               "layer %lld expert %lld: checksum mismatch in %s bytes %llu..%llu (expected %016llx, got %016llx): "
                               "the shard changed after packing or is corrupt",
                               (long long)L, (long long)E, st_shard_path(ix, a->shard), (unsigned long long)a->off,
                               (unsigned long long)(b->off + b->nbytes), (unsigned long long)expect[i], (unsigned long long)out[i]);
            }
    }
    if (progress && !rc) progress(ud, "experts", total, total, base_now() - t0);
    if (bytes_done) *bytes_done = done;
    pack_src_close(&s);
    base_free(scratch);
    base_free(x);
    base_free(recs);
    return rc;
}

/* ===================================================================== build */

#define PACK_LOCK ".strata-pack.lock"

/* 1 if the manifest's "source" is model_dir (after realpath). */
static int same_source(const json_t *j, const char *model_dir) {
    const char *src = json_string_value(json_object_get(j, "source"));
    char real[4096];
    return src && realpath(model_dir, real) && !strcmp(src, real);
}

/* A pack directory holds the pack only: never write among other files. With
 * the lock held, trunk.bin.tmp.<pid> files are left by writers that died. */
static int clear_pack_dir(const char *dir, char *err, size_t errlen) {
    char tmp[2048];
    DIR *d = opendir(dir);
    struct dirent *e;
    while (d && (e = readdir(d))) {
        const char *n = e->d_name;
        if (!strncmp(n, "trunk.bin.tmp", 13)) {
            snprintf(tmp, sizeof tmp, "%s/%s", dir, n);
            unlink(tmp);
            continue;
        }
        if (!strcmp(n, ".") || !strcmp(n, "..") || !strncmp(n, "trunk.bin", 9) || !strncmp(n, "manifest.json", 13) ||
            !strcmp(n, PACK_LOCK))
            continue;
        int rc = base_fail(err, errlen, STRATA_EINVAL, "%s is not empty (holds %s, which is not part of a strata pack); refusing to write there",
                           dir, n);
        closedir(d);
        return rc;
    }
    if (d) closedir(d);
    return STRATA_OK;
}

/* An existing pack: identical (nothing to do: *up_to_date), stale (this model's
 * pack, out of date: rebuilt, res->stale says why), or another model's (refused,
 * even with --force). */
static int check_existing(const char *model_dir, const st_index *ix, const char *out_dir, const char *dir, uint64_t id,
                          int flags, pack_result *res, int *up_to_date, char *err, size_t errlen) {
    json_t *j;
    uint64_t old;
    int64_t ver;
    char why[900];
    if (pack_load_manifest(dir, &j, &old, &ver, why, sizeof why)) {
        if (!(flags & PACK_FORCE))
            return base_fail(err, errlen, STRATA_EINVAL, "%s holds an unreadable manifest (%s); use --force to replace it", dir, why);
        snprintf(res->stale, sizeof res->stale, "its manifest was unreadable");
        return STRATA_OK;
    }
    /* the default location belongs to the model; elsewhere the manifest names its source */
    const int ours = !out_dir || same_source(j, model_dir);
    int stale = 1;
    if (old != id) snprintf(why, sizeof why, "the model's config, index, shard sizes or shard headers changed after packing");
    else if (ver != PACK_VERSION)
        snprintf(why, sizeof why, "it was written by another strata (manifest version %lld, this one writes %d)",
                 (long long)ver, PACK_VERSION);
    else stale = pack_stamps_stale(json_object_get(j, "shards"), ix, why, sizeof why);
    if (!stale && pack_lacks_blocks(j)) {
        stale = 1;
        snprintf(why, sizeof why, "it predates the per-block checksums that let a run verify streamed matrices "
                 "as it multiplies with them");
    }
    json_decref(j);
    if (old != id && !ours)
        return base_fail(err, errlen, STRATA_EINVAL,
                         "%s holds the pack of another model (id %016llx, this model is %016llx); refusing to overwrite it "
                         "(remove it first)", dir, (unsigned long long)old, (unsigned long long)id);
    if (stale && !ours)
        return base_fail(err, errlen, STRATA_EINVAL,
                         "%s holds a pack of another copy of this model, stale for this one (%s); refusing to overwrite it "
                         "(remove it first)", dir, why);
    if (!stale && !(flags & PACK_FORCE)) { *up_to_date = 1; return STRATA_OK; }
    if (stale) snprintf(res->stale, sizeof res->stale, "%s", why);
    return STRATA_OK;
}

/* manifest.json at path: the pack's identity, source stamps (taken over:
 * stamps is consumed), trunk regions and expert checksums. */
static int write_manifest(const char *path, uint64_t id, const char *real, json_t *stamps, const cfg *c, const layout *l,
                          const uint64_t *hashes, const uint64_t *xh, int64_t n_moe, char *err, size_t errlen) {
    json_t *m = json_object(), *units = json_array(), *xa = json_array(), *ex = json_object();
    char hex[20];
    snprintf(hex, sizeof hex, "%016llx", (unsigned long long)id);
    json_object_set_new(m, "format", json_string("strata-pack"));
    json_object_set_new(m, "version", json_integer(PACK_VERSION));
    json_object_set_new(m, "model_id", json_string(hex));
    json_object_set_new(m, "source", json_string(real));
    json_object_set_new(m, "shards", stamps);
    json_object_set_new(m, "align", json_integer(PACK_ALIGN));
    json_object_set_new(m, "n_layers", json_integer(c->n_layers));
    json_object_set_new(m, "trunk_bytes", json_integer((json_int_t)l->total));
    json_object_set_new(m, "embed", pack_region_json(&l->embed, hashes[0]));
    for (int64_t u = 0; u < l->n_units; u++) json_array_append_new(units, pack_region_json(&l->units[u], hashes[u + 1]));
    json_object_set_new(m, "units", units);
    json_object_set_new(ex, "mode", json_string("in_place"));
    json_object_set_new(ex, "n_layers_moe", json_integer(n_moe));
    json_object_set_new(ex, "n_experts", json_integer(c->n_experts));
    for (int64_t i = 0; i < n_moe * c->n_experts; i++) {
        snprintf(hex, sizeof hex, "%016llx", (unsigned long long)xh[i]);
        json_array_append_new(xa, json_string(hex));
    }
    json_object_set_new(ex, "xxh3", xa);
    json_object_set_new(m, "experts", ex);
    char *s = json_dumps(m, JSON_COMPACT);
    json_decref(m);
    /* a failed allocation drops a field without a word: never write that */
    if (s && jsonx_build_failed()) { base_free(s); s = NULL; }
    if (!s) return base_fail(err, errlen, STRATA_ENOMEM, "%s: out of memory building the manifest", path);
    int rc = base_write_file_atomic(path, s, strlen(s), err, errlen);
    json_malloc_t jm;
    json_free_t jf;
    json_get_alloc_funcs(&jm, &jf); /* jsonx may have routed jansson through base_alloc */
    jf(s);
    return rc;
}

/* The pack itself: the trunk copied to trunk.bin with its hashes, the experts'
 * checksums, then the manifest (path). */
static int write_pack(const char *model_dir, const cfg *c, const st_index *ix, const char *dir, const char *path,
                      uint64_t id, int flags, pack_progress_fn progress, void *ud, pack_result *res, char *err,
                      size_t errlen) {
    int rc = STRATA_OK;
    char tmp[2048];
    /* stamps before the first source byte is read: a shard written while we pack
     * leaves the pack stale, not silently mixed */
    jsonx_build_begin(); /* covers the stamps and the manifest built below */
    json_t *stamps = pack_stamps_json(ix, err, errlen);
    if (!stamps) return STRATA_EIO;
    char real[4096];
    if (!realpath(model_dir, real)) snprintf(real, sizeof real, "%s", model_dir);
    layout l;
    if ((rc = pack_layout_build(c, ix, &l, err, errlen))) { json_decref(stamps); return rc; }
    uint64_t *hashes = base_calloc((size_t)(l.n_units + 1), sizeof *hashes, MEM_INDEX);
    const int64_t n_moe = c->n_layers > c->first_dense ? c->n_layers - c->first_dense : 0;
    uint64_t *xh = base_calloc((size_t)(n_moe * c->n_experts + 1), sizeof *xh, MEM_INDEX);
    if (!hashes || !xh) { rc = base_fail(err, errlen, STRATA_ENOMEM, "pack: out of memory"); goto done; }
    snprintf(tmp, sizeof tmp, "%s/trunk.bin.tmp.%d", dir, (int)getpid());
    if (flags & PACK_MEASURE) res->disk_bw = pack_measure_write_bw(dir, PACK_MEASURE_BYTES);
    if ((rc = layout_blocks(&l, flags & PACK_SMALL_BLOCKS ? PACK_SMALL_BLOCK_BYTES : PACK_BLOCK_BYTES, err, errlen))) goto done;
    if ((rc = pack_write_trunk(&l, ix, tmp, flags, progress, ud, hashes, res, err, errlen))) { unlink(tmp); goto done; }
    res->trunk_bytes = l.total;
    res->write_bw = res->trunk_secs > 0 ? (double)l.total / res->trunk_secs : 0;
    double t0 = base_now();
    if ((rc = pack_hash_experts(c, ix, xh, NULL, flags, progress, ud, &res->expert_bytes_hashed, err, errlen))) { unlink(tmp); goto done; }
    res->expert_secs = base_now() - t0;
    char trunk[2048];
    snprintf(trunk, sizeof trunk, "%s/trunk.bin", dir);
    unlink(path); /* a forced rebuild: the old manifest must not describe the new trunk */
    if (vfs_rename(tmp, trunk)) {
        rc = base_fail(err, errlen, STRATA_EIO, "rename %s: %s", tmp, strerror(errno));
        unlink(tmp); /* a whole trunk's worth of disk otherwise, until the next pack */
        goto done;
    }
    rc = write_manifest(path, id, real, stamps, c, &l, hashes, xh, n_moe, err, errlen);
    stamps = NULL;
done:
    json_decref(stamps);
    base_free(hashes);
    base_free(xh);
    pack_layout_free(&l);
    return rc;
}

/* Lets `strata run MODEL_DIR` find a pack written elsewhere (dir). */
static void write_pointer(const char *model_dir, const char *dir) {
    char ptr[4096], rdir[4096], pdir[4096];
    pack_pointer_path(model_dir, ptr, sizeof ptr);
    snprintf(pdir, sizeof pdir, "%s", ptr);
    char *slash = strrchr(pdir, '/');
    if (slash) *slash = 0;
    if (!realpath(dir, rdir)) snprintf(rdir, sizeof rdir, "%s", dir);
    if (base_mkdir_p(pdir, NULL, 0) == 0) base_write_file_atomic(ptr, rdir, strlen(rdir), NULL, 0);
}

/* pack_build with dir locked against other writers. */
static int build_locked(const char *model_dir, const cfg *c, const st_index *ix, const char *out_dir, const char *dir,
                        uint64_t id, int flags, pack_progress_fn progress, void *ud, pack_result *res, char *err,
                        size_t errlen) {
    int rc, up_to_date = 0;
    char path[2048];
    snprintf(path, sizeof path, "%s/manifest.json", dir);
    if ((rc = clear_pack_dir(dir, err, errlen))) return rc;
    if (base_is_file(path) && (rc = check_existing(model_dir, ix, out_dir, dir, id, flags, res, &up_to_date, err, errlen)))
        return rc;
    if (up_to_date) res->already = 1;
    else if ((rc = write_pack(model_dir, c, ix, dir, path, id, flags, progress, ud, res, err, errlen))) return rc;
    if (out_dir) write_pointer(model_dir, dir);
    return STRATA_OK;
}

int pack_build(const char *model_dir, const cfg *c, const st_index *ix, const char *out_dir, int flags,
               pack_progress_fn progress, void *ud, pack_result *res, char *err, size_t errlen) {
    memset(res, 0, sizeof *res);
    char dir[1024], lock[1100];
    if (out_dir) snprintf(dir, sizeof dir, "%s", out_dir);
    else snprintf(dir, sizeof dir, "%s/%s", model_dir, PACK_DIRNAME);
    snprintf(res->dir, sizeof res->dir, "%s", dir);
    uint64_t id;
    int rc = pack_model_id(model_dir, ix, &id, err, errlen);
    if (rc) return rc;
    if ((rc = base_mkdir_p(dir, err, errlen))) return rc;
    /* one writer at a time: two `pack --force` collided on trunk.bin.tmp */
    snprintf(lock, sizeof lock, "%s/" PACK_LOCK, dir);
    int lfd = base_lock(lock, dir, err, errlen);
    if (lfd < 0) return lfd;
    rc = build_locked(model_dir, c, ix, out_dir, dir, id, flags, progress, ud, res, err, errlen);
    base_unlock(lock, lfd);
    return rc;
}
