/*
 * pack.c: writes, loads and verifies the streaming layout (see pack.h).
 *
 * Writing is a pipeline of three 32 MB aligned buffers: the caller's thread fills
 * one from the shards (buffered pread, large sequential pieces) and hashes it while
 * a writer thread writes the previous one to trunk.bin.tmp with O_DIRECT, so reads,
 * hashing and writes overlap. Expert checksums are computed from O_DIRECT reads of
 * each expert's enclosing aligned range, several in flight, in disk order.
 */
#define XXH_STATIC_LINKING_ONLY
#include "pack.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>
#include "io.h"
#include "jsonx.h"

#define WBUF_BYTES (32u << 20)
#define NWBUF 3

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
    } else {
        w.rows = shape[0];
        w.cols = shape[1] * shape[2];
    }
    return w;
}

/* ================================================================== identity */

static int hash_file(XXH3_state_t *st, const char *path, int required, char *err, size_t errlen) {
    uint8_t *buf;
    size_t len;
    if (!base_is_file(path)) {
        if (required) return base_fail(err, errlen, STRATA_EIO, "%s: missing", path);
        return STRATA_OK;
    }
    int rc = base_read_file(path, 1u << 30, &buf, &len, err, errlen);
    if (rc) return rc;
    XXH3_64bits_update(st, buf, len);
    base_free(buf);
    return STRATA_OK;
}

int pack_model_id(const char *model_dir, const st_index *ix, uint64_t *id, char *err, size_t errlen) {
    XXH3_state_t st;
    XXH3_64bits_reset(&st);
    char path[2048];
    snprintf(path, sizeof path, "%s/config.json", model_dir);
    int rc = hash_file(&st, path, 1, err, errlen);
    if (rc) return rc;
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", model_dir);
    if ((rc = hash_file(&st, path, 0, err, errlen))) return rc;
    for (int s = 0; s < st_n_shards(ix); s++) {
        const char *sp = st_shard_path(ix, s);
        const char *base = strrchr(sp, '/');
        base = base ? base + 1 : sp;
        uint64_t size = st_shard_size(ix, s);
        XXH3_64bits_update(&st, base, strlen(base) + 1);
        XXH3_64bits_update(&st, &size, sizeof size);
        int fd = st_shard_fd(ix, s);
        uint8_t len8[8];
        if (pread(fd, len8, 8, 0) != 8) return base_fail(err, errlen, STRATA_EIO, "%s: cannot read header", sp);
        uint64_t n = 0;
        for (int i = 7; i >= 0; i--) n = n << 8 | len8[i];
        if (n > ST_MAX_HEADER || n + 8 > size) return base_fail(err, errlen, STRATA_EFORMAT, "%s: bad header length", sp);
        uint8_t *h = base_alloc(n + 8, MEM_IO);
        if (!h) return base_fail(err, errlen, STRATA_ENOMEM, "pack: out of memory");
        ssize_t got = pread(fd, h, n + 8, 0);
        if (got != (ssize_t)(n + 8)) { base_free(h); return base_fail(err, errlen, STRATA_EIO, "%s: cannot read header", sp); }
        XXH3_64bits_update(&st, h, n + 8);
        base_free(h);
    }
    *id = XXH3_64bits_digest(&st);
    return STRATA_OK;
}

/* ============================================================ finding a pack */

static void pointer_path(const char *model_dir, char *out, size_t n) {
    char real[4096];
    if (!realpath(model_dir, real)) snprintf(real, sizeof real, "%s", model_dir);
    const char *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    char base[2048];
    if (xdg && *xdg) snprintf(base, sizeof base, "%s/strata/packs", xdg);
    else snprintf(base, sizeof base, "%s/.cache/strata/packs", home && *home ? home : "/tmp");
    snprintf(out, n, "%s/%016llx", base, (unsigned long long)XXH3_64bits(real, strlen(real)));
}

int pack_find(const char *model_dir, char *out, size_t n) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s/manifest.json", model_dir, PACK_DIRNAME);
    if (base_is_file(path)) {
        snprintf(out, n, "%s/%s", model_dir, PACK_DIRNAME);
        return 1;
    }
    char ptr[4096];
    pointer_path(model_dir, ptr, sizeof ptr);
    uint8_t *buf;
    size_t len;
    if (base_read_file(ptr, 4096, &buf, &len, NULL, 0)) return 0;
    while (len && (buf[len - 1] == '\n' || buf[len - 1] == ' ')) buf[--len] = 0;
    snprintf(path, sizeof path, "%s/manifest.json", (char *)buf);
    int ok = base_is_file(path);
    if (ok) snprintf(out, n, "%s", (char *)buf);
    base_free(buf);
    return ok;
}

/* ==================================================================== layout */

typedef struct lt {            /* one tensor while laying out */
    const st_tensor *src;
    int role;
    uint64_t off;              /* relative to the region */
} lt;

typedef struct lregion {
    uint64_t off, nbytes, xxh3;
    int n;
    lt *t;
    int verbatim;              /* one gap-free source run: copied as one stream */
    int src_shard;
    uint64_t src_off, src_len;
} lregion;

typedef struct layout {
    int64_t n_units;
    lregion embed;
    lregion *units;
    uint64_t total;
} layout;

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
    c->r->t[c->r->n++] = (lt){.src = s, .role = t->role};
    return 0;
}

static void layout_free(layout *l) {
    base_free(l->embed.t);
    if (l->units)
        for (int64_t u = 0; u < l->n_units; u++) base_free(l->units[u].t);
    base_free(l->units);
    memset(l, 0, sizeof *l);
}

static int layout_build(const cfg *c, const st_index *ix, layout *l, char *err, size_t errlen) {
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
        rc = schema_walk_layer(c, L, collect_fn, &cl);
    }
    if (!rc) {
        cl = (collect){.c = c, .ix = ix, .r = &l->units[c->n_layers], .cls_mask = (1 << TC_FINAL) | (1 << TC_LM_HEAD), .missing = &missing};
        rc = schema_walk(c, 0, collect_fn, &cl);
    }
    if (rc || missing.n) {
        rc = base_fail(err, errlen, rc ? rc : STRATA_EFORMAT, "pack: %d tensors missing:\n%s", missing.n,
                       missing.s ? missing.s : "");
        sbuf_free(&missing);
        layout_free(l);
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

/* ==================================================================== writer */

typedef struct wq {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    uint8_t *buf[NWBUF];
    uint64_t len[NWBUF];
    int full[NWBUF];       /* 1: waiting to be written */
    int head, tail;        /* next to write / next to fill */
    int fd, done, rc, err_no;
    uint64_t written;
} wq;

static void *writer_main(void *arg) {
    wq *q = arg;
    for (;;) {
        pthread_mutex_lock(&q->mu);
        while (!q->full[q->head] && !q->done) pthread_cond_wait(&q->cv, &q->mu);
        if (!q->full[q->head]) { pthread_mutex_unlock(&q->mu); return NULL; }
        int i = q->head;
        pthread_mutex_unlock(&q->mu);
        uint64_t n = q->len[i], w = 0;
        while (w < n && !q->rc) {
            ssize_t k = pwrite(q->fd, q->buf[i] + w, n - w, (off_t)(q->written + w));
            if (k < 0 && errno == EINTR) continue;
            if (k <= 0) { q->rc = STRATA_EIO; q->err_no = k < 0 ? errno : ENOSPC; break; }
            w += (uint64_t)k;
        }
        pthread_mutex_lock(&q->mu);
        q->written += n;
        q->full[i] = 0;
        q->head = (q->head + 1) % NWBUF;
        pthread_cond_broadcast(&q->cv);
        pthread_mutex_unlock(&q->mu);
    }
}

typedef struct filler {
    wq *q;
    io_ring *ring;             /* O_DIRECT source reads, several in flight */
    io_file *files;            /* the shards */
    uint8_t *bounce;           /* WBUF_BYTES + 2 * IO_ALIGN, aligned */
    uint8_t *cur;
    uint64_t fill;
    uint64_t total, done;
    double t0, last;
    pack_progress_fn progress;
    void *ud;
} filler;

static void flush_buf(filler *f) {
    wq *q = f->q;
    pthread_mutex_lock(&q->mu);
    q->len[q->tail] = f->fill;
    q->full[q->tail] = 1;
    q->tail = (q->tail + 1) % NWBUF;
    pthread_cond_broadcast(&q->cv);
    while (q->full[q->tail]) pthread_cond_wait(&q->cv, &q->mu); /* wait for a free buffer */
    f->cur = q->buf[q->tail];
    pthread_mutex_unlock(&q->mu);
    f->done += f->fill;
    f->fill = 0;
    double now = base_now();
    if (f->progress && now - f->last > 0.5) {
        f->progress(f->ud, "trunk", f->done, f->total, now - f->t0);
        f->last = now;
    }
}

/* Appends n bytes (zeros when fd < 0) read at off from shard number fd (O_DIRECT
 * ring) or from the descriptor fd (buffered fallback); hashes them. */
static int emit(filler *f, XXH3_state_t *h, int fd, uint64_t off, uint64_t n, const char *what,
                char *err, size_t errlen) {
    while (n) {
        uint64_t k = WBUF_BYTES - f->fill;
        if (k > n) k = n;
        uint8_t *p = f->cur + f->fill;
        if (fd < 0) {
            memset(p, 0, k);
        } else if (f->ring) {
            /* the enclosing aligned range with O_DIRECT (4 MiB chunks, depth 8), then
             * a copy into place: buffered QD1 preads of the shards ran at half the
             * disk's read speed under load */
            int shard = fd;
            if ((fd = io_read_at(f->ring, &f->files[shard], off, k, p, f->bounce, err, errlen))) return fd;
            fd = shard;
            off += k;
        } else {
            uint64_t got = 0;
            while (got < k) {
                ssize_t r = pread(fd, p + got, k - got, (off_t)(off + got));
                if (r < 0 && errno == EINTR) continue;
                if (r <= 0)
                    return base_fail(err, errlen, STRATA_EIO, "pack: reading %s at byte %llu: %s", what,
                                     (unsigned long long)(off + got), r < 0 ? strerror(errno) : "end of file");
                got += (uint64_t)r;
            }
            /* the shard bytes are used once: do not let them crowd the page cache */
            posix_fadvise(fd, (off_t)off, (off_t)k, POSIX_FADV_DONTNEED);
            off += k;
        }
        XXH3_64bits_update(h, p, k);
        f->fill += k;
        n -= k;
        if (f->fill == WBUF_BYTES) {
            if (f->q->rc) return base_fail(err, errlen, STRATA_EIO, "pack: write failed: %s", strerror(f->q->err_no));
            flush_buf(f);
        }
    }
    return STRATA_OK;
}

static int write_trunk(const layout *l, const st_index *ix, const char *tmp, pack_progress_fn progress, void *ud,
                       uint64_t *hashes, char *err, size_t errlen) {
    wq q;
    memset(&q, 0, sizeof q);
    pthread_mutex_init(&q.mu, NULL);
    pthread_cond_init(&q.cv, NULL);
    int rc = STRATA_OK;
    q.fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_DIRECT, 0644);
    if (q.fd < 0) q.fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (q.fd < 0) return base_fail(err, errlen, STRATA_EIO, "%s: %s", tmp, strerror(errno));
    for (int i = 0; i < NWBUF; i++) {
        q.buf[i] = base_alloc_aligned(WBUF_BYTES, 1u << 20, MEM_IO);
        if (!q.buf[i]) rc = base_fail(err, errlen, STRATA_ENOMEM, "pack: out of memory");
    }
    pthread_t th;
    int started = 0;
    if (!rc) {
        if (pthread_create(&th, NULL, writer_main, &q)) rc = base_fail(err, errlen, STRATA_EIO, "pack: cannot start writer");
        else started = 1;
    }
    filler f = {.q = &q, .cur = q.buf[0], .total = l->total, .t0 = base_now(), .progress = progress, .ud = ud};
    io_file *files = base_calloc((size_t)st_n_shards(ix), sizeof *files, MEM_IO);
    f.bounce = base_alloc_aligned(WBUF_BYTES + 2 * IO_ALIGN, 1u << 20, MEM_IO);
    int direct_ok = files && f.bounce && !io_ring_create(&f.ring, 8, 4u << 20, 0, NULL, 0);
    for (int i = 0; direct_ok && i < st_n_shards(ix); i++) {
        files[i].fd_direct = files[i].fd_buf = -1;
        if (io_file_open(&files[i], st_shard_path(ix, i), NULL, 0)) direct_ok = 0;
    }
    if (direct_ok) f.files = files;
    else { io_ring_free(f.ring); f.ring = NULL; }
    for (int64_t u = -1; u < l->n_units && !rc; u++) {
        const lregion *r = u < 0 ? &l->embed : &l->units[u];
        XXH3_state_t h;
        XXH3_64bits_reset(&h);
        uint64_t rel = 0;
        if (r->verbatim) {
            rc = emit(&f, &h, f.ring ? r->src_shard : st_shard_fd(ix, r->src_shard), r->src_off, r->src_len,
                      st_shard_path(ix, r->src_shard), err, errlen);
            rel = r->src_len;
        }
        for (int i = 0; i < r->n && !rc && !r->verbatim; i++) {
            const st_tensor *s = r->t[i].src;
            rc = emit(&f, &h, -1, 0, r->t[i].off - rel, NULL, err, errlen);
            if (!rc) rc = emit(&f, &h, f.ring ? s->shard : st_shard_fd(ix, s->shard), s->off, s->nbytes, s->name, err, errlen);
            rel = r->t[i].off + s->nbytes;
        }
        if (!rc) rc = emit(&f, &h, -1, 0, r->nbytes - rel, NULL, err, errlen);
        hashes[u + 1] = XXH3_64bits_digest(&h);
    }
    if (!rc && f.fill) flush_buf(&f);
    pthread_mutex_lock(&q.mu);
    q.done = 1;
    pthread_cond_broadcast(&q.cv);
    pthread_mutex_unlock(&q.mu);
    if (started) pthread_join(th, NULL);
    if (!rc && q.rc) rc = base_fail(err, errlen, STRATA_EIO, "%s: write failed: %s", tmp, strerror(q.err_no));
    if (!rc && fsync(q.fd)) rc = base_fail(err, errlen, STRATA_EIO, "%s: fsync: %s", tmp, strerror(errno));
    close(q.fd);
    for (int i = 0; i < NWBUF; i++) base_free(q.buf[i]);
    io_ring_free(f.ring);
    if (files) for (int i = 0; i < st_n_shards(ix); i++) if (files[i].fd_buf > 0) io_file_close(&files[i]);
    base_free(files);
    base_free(f.bounce);
    pthread_mutex_destroy(&q.mu);
    pthread_cond_destroy(&q.cv);
    if (progress && !rc) progress(ud, "trunk", l->total, l->total, base_now() - f.t0);
    return rc;
}

/* =================================================================== experts */

typedef struct xrec {
    int64_t L, E;
    int shard;
    uint64_t off, nbytes;    /* contiguous run, or nbytes = 0 when scattered */
} xrec;

typedef struct xcollect { const st_index *ix; const st_tensor *t[8]; int n; } xcollect;
static int xcollect_fn(void *ud, const tspec *t) {
    xcollect *x = ud;
    if (x->n < 8) x->t[x->n++] = st_find(x->ix, t->name);
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

static int experts_bf16(const cfg *c, const st_index *ix) {
    char name[200];
    snprintf(name, sizeof name, "language_model.model.layers.%lld.block_sparse_moe.experts.0.w1.weight",
             (long long)c->first_dense);
    return st_find(ix, name) != NULL;
}

/* Hashes every expert (in disk order); out[(L - first_dense) * n_experts + E].
 * With expect != NULL compares instead and stops at the first mismatch. */
static int hash_experts(const cfg *c, const st_index *ix, uint64_t *out, const uint64_t *expect,
                        pack_progress_fn progress, void *ud, uint64_t *bytes_done, char *err, size_t errlen) {
    const int64_t n_moe = c->n_layers - c->first_dense, NE = c->n_experts;
    if (n_moe <= 0) return STRATA_OK;
    int bf16 = experts_bf16(c, ix);
    xrec *recs = base_alloc((size_t)(n_moe * NE) * sizeof *recs, MEM_INDEX);
    if (!recs) return base_fail(err, errlen, STRATA_ENOMEM, "pack: out of memory");
    int rc = STRATA_OK;
    uint64_t maxb = 0, total = 0;
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
            if (sum > maxb) maxb = sum;
            total += sum;
        }
    if (rc) { base_free(recs); return rc; }
    qsort(recs, (size_t)(n_moe * NE), sizeof *recs, xrec_cmp);
    enum { NQ = 8 };
    io_ring *ring = NULL;
    io_file *files = base_calloc((size_t)st_n_shards(ix), sizeof *files, MEM_IO);
    uint8_t *bufs[NQ] = {0};
    io_req reqs[NQ];
    int64_t which[NQ];
    uint64_t bsz = io_align_up(maxb) + 2 * IO_ALIGN;
    if (!files) rc = base_fail(err, errlen, STRATA_ENOMEM, "pack: out of memory");
    for (int s = 0; s < st_n_shards(ix) && !rc; s++) {
        files[s].fd_direct = files[s].fd_buf = -1;
        rc = io_file_open(&files[s], st_shard_path(ix, s), err, errlen);
    }
    if (!rc) rc = io_ring_create(&ring, NQ * 4, 0, 0, err, errlen);
    for (int i = 0; i < NQ && !rc; i++)
        if (!(bufs[i] = base_alloc_aligned(bsz, IO_ALIGN, MEM_IO))) rc = base_fail(err, errlen, STRATA_ENOMEM, "pack: out of memory");
    double t0 = base_now(), last = t0;
    uint64_t done = 0;
    int64_t next = 0, n_all = n_moe * NE;
    int free_bufs[NQ], n_free = 0;
    for (int i = 0; i < NQ; i++) free_bufs[n_free++] = i;
    while (!rc && (next < n_all || io_pending(ring))) {
        while (next < n_all && n_free) {
            xrec *r = &recs[next];
            if (r->nbytes == 0) { /* scattered expert: hash tensor by tensor, synchronously */
                xcollect x;
                expert_tensors(c, ix, bf16, r->L, r->E, &x);
                XXH3_state_t h;
                XXH3_64bits_reset(&h);
                for (int i = 0; i < x.n && !rc; i++) {
                    rc = io_read_at(ring, &files[x.t[i]->shard], x.t[i]->off, x.t[i]->nbytes, bufs[free_bufs[n_free - 1]], NULL, err, errlen);
                    XXH3_64bits_update(&h, bufs[free_bufs[n_free - 1]], x.t[i]->nbytes);
                    done += x.t[i]->nbytes;
                }
                out[(r->L - c->first_dense) * NE + r->E] = XXH3_64bits_digest(&h);
                next++;
                continue;
            }
            int b = free_bufs[--n_free];
            uint64_t a0 = io_align_down(r->off), a1 = io_align_up(r->off + r->nbytes);
            reqs[b] = (io_req){.f = &files[r->shard], .off = a0, .len = a1 - a0, .need = r->off + r->nbytes - a0,
                               .dst = bufs[b], .ud = (void *)(intptr_t)b};
            which[b] = next++;
            io_submit(ring, &reqs[b]);
        }
        io_req *d;
        if (io_reap(ring, 1, &d) != 1) break;
        int b = (int)(intptr_t)d->ud;
        const xrec *r = &recs[which[b]];
        if (d->rc) {
            char e2[600];
            io_req_errstr(d, e2, sizeof e2);
            rc = base_fail(err, errlen, STRATA_EIO, "layer %lld expert %lld unreadable: %s", (long long)r->L,
                           (long long)r->E, e2);
        } else {
            out[(r->L - c->first_dense) * NE + r->E] = XXH3_64bits(bufs[b] + (r->off - d->off), r->nbytes);
            done += r->nbytes;
        }
        free_bufs[n_free++] = b;
        double now = base_now();
        if (progress && now - last > 0.5) { progress(ud, "experts", done, total, now - t0); last = now; }
    }
    if (!rc && expect) {
        /* report the first mismatch in (layer, expert) order */
        for (int64_t i = 0; i < n_all && !rc; i++)
            if (out[i] != expect[i])
                rc = base_fail(err, errlen, STRATA_ECORRUPT,
                               "layer %lld expert %lld: checksum mismatch (expected %016llx, got %016llx): the shard changed or is corrupt",
                               (long long)(c->first_dense + i / NE), (long long)(i % NE), (unsigned long long)expect[i],
                               (unsigned long long)out[i]);
    }
    if (progress && !rc) progress(ud, "experts", total, total, base_now() - t0);
    if (bytes_done) *bytes_done = done;
    io_ring_free(ring);
    for (int i = 0; i < NQ; i++) base_free(bufs[i]);
    if (files) for (int s = 0; s < st_n_shards(ix); s++) io_file_close(&files[s]);
    base_free(files);
    base_free(recs);
    return rc;
}

/* ================================================================== manifest */

static json_t *region_json(const lregion *r, uint64_t h) {
    json_t *o = json_object(), *ts = json_array();
    char hex[20];
    snprintf(hex, sizeof hex, "%016llx", (unsigned long long)h);
    json_object_set_new(o, "off", json_integer((json_int_t)r->off));
    json_object_set_new(o, "nbytes", json_integer((json_int_t)r->nbytes));
    json_object_set_new(o, "xxh3", json_string(hex));
    for (int i = 0; i < r->n; i++) {
        const st_tensor *s = r->t[i].src;
        json_t *t = json_object(), *sh = json_array();
        json_object_set_new(t, "name", json_string(s->name));
        json_object_set_new(t, "role", json_integer(r->t[i].role));
        json_object_set_new(t, "dtype", json_string(st_dtype_name(s->dtype)));
        for (int d = 0; d < s->ndim; d++) json_array_append_new(sh, json_integer(s->shape[d]));
        json_object_set_new(t, "shape", sh);
        json_object_set_new(t, "off", json_integer((json_int_t)r->t[i].off));
        json_object_set_new(t, "nbytes", json_integer((json_int_t)s->nbytes));
        json_array_append_new(ts, t);
    }
    json_object_set_new(o, "tensors", ts);
    return o;
}

static int load_manifest(const char *dir, json_t **out, uint64_t *id, char *err, size_t errlen) {
    char path[2048];
    snprintf(path, sizeof path, "%s/manifest.json", dir);
    uint8_t *buf;
    size_t len;
    int rc = base_read_file(path, 1u << 30, &buf, &len, err, errlen);
    if (rc) return rc;
    json_t *j = jsonx_load(buf, len, path, err, errlen);
    base_free(buf);
    if (!j) return STRATA_EFORMAT;
    const char *fmt = json_string_value(json_object_get(j, "format"));
    const char *mid = json_string_value(json_object_get(j, "model_id"));
    if (!fmt || strcmp(fmt, "strata-pack") || !mid) {
        json_decref(j);
        return base_fail(err, errlen, STRATA_EFORMAT, "%s: not a strata pack manifest", path);
    }
    *id = strtoull(mid, NULL, 16);
    *out = j;
    return STRATA_OK;
}

/* ===================================================================== build */

int pack_build(const char *model_dir, const cfg *c, const st_index *ix, const char *out_dir, int force,
               pack_progress_fn progress, void *ud, pack_result *res, char *err, size_t errlen) {
    memset(res, 0, sizeof *res);
    char dir[1024];
    if (out_dir) snprintf(dir, sizeof dir, "%s", out_dir);
    else snprintf(dir, sizeof dir, "%s/%s", model_dir, PACK_DIRNAME);
    snprintf(res->dir, sizeof res->dir, "%s", dir);
    uint64_t id;
    int rc = pack_model_id(model_dir, ix, &id, err, errlen);
    if (rc) return rc;
    if ((rc = base_mkdir_p(dir, err, errlen))) return rc;
    /* refuse to overwrite or mix with another model's pack */
    char path[2048], tmp[2048];
    snprintf(path, sizeof path, "%s/manifest.json", dir);
    if (base_is_file(path)) {
        json_t *j;
        uint64_t old;
        if ((rc = load_manifest(dir, &j, &old, err, errlen)))
            return base_fail(err, errlen, STRATA_EINVAL, "%s holds an unreadable manifest; remove the directory first", dir);
        json_decref(j);
        if (old != id)
            return base_fail(err, errlen, STRATA_EINVAL,
                             "%s holds the pack of another model (id %016llx, this model is %016llx); refusing to overwrite",
                             dir, (unsigned long long)old, (unsigned long long)id);
        if (!force) { res->already = 1; goto pointer; }
    } else {
        DIR *d = opendir(dir);
        struct dirent *e;
        while (d && (e = readdir(d))) {
            const char *n = e->d_name;
            if (!strcmp(n, ".") || !strcmp(n, "..") || !strncmp(n, "trunk.bin", 9) || !strncmp(n, "manifest.json", 13)) continue;
            rc = base_fail(err, errlen, STRATA_EINVAL, "%s is not empty (holds %s) and has no strata manifest; refusing to write there", dir, n);
            closedir(d);
            return rc;
        }
        if (d) closedir(d);
    }
    layout l;
    if ((rc = layout_build(c, ix, &l, err, errlen))) return rc;
    uint64_t *hashes = base_calloc((size_t)(l.n_units + 1), sizeof *hashes, MEM_INDEX);
    const int64_t n_moe = c->n_layers > c->first_dense ? c->n_layers - c->first_dense : 0;
    uint64_t *xh = base_calloc((size_t)(n_moe * c->n_experts + 1), sizeof *xh, MEM_INDEX);
    if (!hashes || !xh) { rc = base_fail(err, errlen, STRATA_ENOMEM, "pack: out of memory"); goto done; }
    snprintf(tmp, sizeof tmp, "%s/trunk.bin.tmp", dir);
    double t0 = base_now();
    if ((rc = write_trunk(&l, ix, tmp, progress, ud, hashes, err, errlen))) { unlink(tmp); goto done; }
    res->trunk_secs = base_now() - t0;
    res->trunk_bytes = l.total;
    res->write_bw = res->trunk_secs > 0 ? (double)l.total / res->trunk_secs : 0;
    t0 = base_now();
    if ((rc = hash_experts(c, ix, xh, NULL, progress, ud, &res->expert_bytes_hashed, err, errlen))) { unlink(tmp); goto done; }
    res->expert_secs = base_now() - t0;
    char trunk[2048];
    snprintf(trunk, sizeof trunk, "%s/trunk.bin", dir);
    unlink(path); /* a forced rebuild: the old manifest must not describe the new trunk */
    if (rename(tmp, trunk)) { rc = base_fail(err, errlen, STRATA_EIO, "rename %s: %s", tmp, strerror(errno)); goto done; }
    {
        json_t *m = json_object(), *units = json_array(), *xa = json_array(), *ex = json_object();
        char hex[20];
        snprintf(hex, sizeof hex, "%016llx", (unsigned long long)id);
        json_object_set_new(m, "format", json_string("strata-pack"));
        json_object_set_new(m, "version", json_integer(1));
        json_object_set_new(m, "model_id", json_string(hex));
        json_object_set_new(m, "align", json_integer(PACK_ALIGN));
        json_object_set_new(m, "n_layers", json_integer(c->n_layers));
        json_object_set_new(m, "trunk_bytes", json_integer((json_int_t)l.total));
        json_object_set_new(m, "embed", region_json(&l.embed, hashes[0]));
        for (int64_t u = 0; u < l.n_units; u++) json_array_append_new(units, region_json(&l.units[u], hashes[u + 1]));
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
        if (!s) { rc = base_fail(err, errlen, STRATA_ENOMEM, "pack: out of memory"); goto done; }
        rc = base_write_file_atomic(path, s, strlen(s), err, errlen);
        json_malloc_t jm;
        json_free_t jf;
        json_get_alloc_funcs(&jm, &jf); /* jsonx may have routed jansson through base_alloc */
        jf(s);
    }
done:
    base_free(hashes);
    base_free(xh);
    layout_free(&l);
    if (rc) return rc;
pointer:
    if (out_dir) { /* let `strata run MODEL_DIR` find a pack written elsewhere */
        char ptr[4096], real[4096], pdir[4096];
        pointer_path(model_dir, ptr, sizeof ptr);
        snprintf(pdir, sizeof pdir, "%s", ptr);
        char *slash = strrchr(pdir, '/');
        if (slash) *slash = 0;
        if (!realpath(dir, real)) snprintf(real, sizeof real, "%s", dir);
        if (base_mkdir_p(pdir, NULL, 0) == 0) base_write_file_atomic(ptr, real, strlen(real), NULL, 0);
    }
    return STRATA_OK;
}

/* ====================================================================== open */

static int parse_region(json_t *o, pack_region *r, uint64_t trunk_bytes, const st_index *ix, const char *what,
                        char *err, size_t errlen) {
    int64_t off, nb;
    json_t *ts = json_object_get(o, "tensors");
    const char *hx = json_string_value(json_object_get(o, "xxh3"));
    if (!o || jsonx_int(json_object_get(o, "off"), &off) || jsonx_int(json_object_get(o, "nbytes"), &nb) || !hx ||
        !json_is_array(ts) || off < 0 || nb < 0 || (uint64_t)off % PACK_ALIGN || (uint64_t)nb % PACK_ALIGN ||
        (uint64_t)(off + nb) > trunk_bytes)
        return base_fail(err, errlen, STRATA_EFORMAT, "manifest: %s: bad region", what);
    r->off = (uint64_t)off;
    r->nbytes = (uint64_t)nb;
    r->xxh3 = strtoull(hx, NULL, 16);
    r->n_tensors = (int32_t)json_array_size(ts);
    r->t = base_calloc((size_t)r->n_tensors + 1, sizeof *r->t, MEM_INDEX);
    if (!r->t) return base_fail(err, errlen, STRATA_ENOMEM, "pack: out of memory");
    for (int i = 0; i < r->n_tensors; i++) {
        json_t *t = json_array_get(ts, (size_t)i);
        const char *name = json_string_value(json_object_get(t, "name"));
        int64_t role, toff, tnb;
        const st_tensor *s = name ? st_find(ix, name) : NULL;
        if (!s || jsonx_int(json_object_get(t, "role"), &role) || jsonx_int(json_object_get(t, "off"), &toff) ||
            jsonx_int(json_object_get(t, "nbytes"), &tnb) || role < 0 || role >= R_COUNT || toff < 0 ||
            (uint64_t)tnb != s->nbytes || (uint64_t)(toff + tnb) > r->nbytes || s->ndim > 3)
            return base_fail(err, errlen, STRATA_EFORMAT, "manifest: %s: tensor %d (%s) does not match the model", what, i,
                             name ? name : "?");
        pack_tensor *pt = &r->t[i];
        pt->name = s->name;
        pt->role = (int32_t)role;
        pt->dtype = s->dtype;
        pt->ndim = s->ndim;
        for (int d = 0; d < s->ndim; d++) pt->shape[d] = s->shape[d];
        pt->off = (uint64_t)toff;
        pt->nbytes = (uint64_t)tnb;
    }
    return STRATA_OK;
}

void pack_close(pack *p) {
    if (!p) return;
    base_free(p->embed.t);
    if (p->units)
        for (int64_t u = 0; u <= p->n_layers; u++) base_free(p->units[u].t);
    base_free(p->units);
    base_free(p->expert_xxh3);
    base_free(p);
}

int pack_open(pack **out, const char *pack_dir, const char *model_dir, const cfg *c, const st_index *ix,
              char *err, size_t errlen) {
    *out = NULL;
    json_t *j = NULL;
    uint64_t mid;
    int rc = load_manifest(pack_dir, &j, &mid, err, errlen);
    if (rc) return rc;
    pack *p = base_calloc(1, sizeof *p, MEM_INDEX);
    if (!p) { json_decref(j); return base_fail(err, errlen, STRATA_ENOMEM, "pack: out of memory"); }
    snprintf(p->dir, sizeof p->dir, "%s", pack_dir);
    snprintf(p->trunk_path, sizeof p->trunk_path, "%s/trunk.bin", pack_dir);
    p->model_id = mid;
    if (model_dir) {
        uint64_t id;
        if ((rc = pack_model_id(model_dir, ix, &id, err, errlen))) goto fail;
        if (id != mid) {
            rc = base_fail(err, errlen, STRATA_EINVAL,
                           "%s is the pack of another model (id %016llx; %s is %016llx): re-run strata pack", pack_dir,
                           (unsigned long long)mid, model_dir, (unsigned long long)id);
            goto fail;
        }
    }
    int64_t nl, tb, align;
    if (jsonx_int(json_object_get(j, "n_layers"), &nl) || jsonx_int(json_object_get(j, "trunk_bytes"), &tb) ||
        jsonx_int(json_object_get(j, "align"), &align) || nl != c->n_layers || align != PACK_ALIGN || tb < 0) {
        rc = base_fail(err, errlen, STRATA_EFORMAT, "%s/manifest.json: n_layers/align/trunk_bytes do not match the model", pack_dir);
        goto fail;
    }
    p->n_layers = nl;
    p->trunk_bytes = (uint64_t)tb;
    struct stat sb;
    if (stat(p->trunk_path, &sb) || (uint64_t)sb.st_size != p->trunk_bytes) {
        rc = base_fail(err, errlen, STRATA_ECORRUPT, "%s: %s (manifest says %llu bytes): truncated or missing; re-run strata pack",
                       p->trunk_path, stat(p->trunk_path, &sb) ? "missing" : "wrong size", (unsigned long long)p->trunk_bytes);
        goto fail;
    }
    if ((rc = parse_region(json_object_get(j, "embed"), &p->embed, p->trunk_bytes, ix, "embed", err, errlen))) goto fail;
    json_t *units = json_object_get(j, "units");
    if (!json_is_array(units) || (int64_t)json_array_size(units) != nl + 1) {
        rc = base_fail(err, errlen, STRATA_EFORMAT, "%s/manifest.json: units must have n_layers + 1 entries", pack_dir);
        goto fail;
    }
    p->units = base_calloc((size_t)nl + 1, sizeof *p->units, MEM_INDEX);
    if (!p->units) { rc = base_fail(err, errlen, STRATA_ENOMEM, "pack: out of memory"); goto fail; }
    for (int64_t u = 0; u <= nl; u++) {
        char what[64];
        if (u < nl) snprintf(what, sizeof what, "layer %lld", (long long)u); else snprintf(what, sizeof what, "head");
        if ((rc = parse_region(json_array_get(units, (size_t)u), &p->units[u], p->trunk_bytes, ix, what, err, errlen))) goto fail;
    }
    json_t *ex = json_object_get(j, "experts"), *xa = json_object_get(ex, "xxh3");
    int64_t n_moe, ne;
    p->n_moe = c->n_layers > c->first_dense ? c->n_layers - c->first_dense : 0;
    p->n_experts = c->n_experts;
    if (jsonx_int(json_object_get(ex, "n_layers_moe"), &n_moe) || jsonx_int(json_object_get(ex, "n_experts"), &ne) ||
        n_moe != p->n_moe || ne != p->n_experts || !json_is_array(xa) || (int64_t)json_array_size(xa) != n_moe * ne) {
        rc = base_fail(err, errlen, STRATA_EFORMAT, "%s/manifest.json: experts do not match the model", pack_dir);
        goto fail;
    }
    p->expert_xxh3 = base_alloc((size_t)(n_moe * ne + 1) * sizeof *p->expert_xxh3, MEM_INDEX);
    if (!p->expert_xxh3) { rc = base_fail(err, errlen, STRATA_ENOMEM, "pack: out of memory"); goto fail; }
    for (int64_t i = 0; i < n_moe * ne; i++) {
        const char *h = json_string_value(json_array_get(xa, (size_t)i));
        if (!h) { rc = base_fail(err, errlen, STRATA_EFORMAT, "%s/manifest.json: bad expert checksum %lld", pack_dir, (long long)i); goto fail; }
        p->expert_xxh3[i] = strtoull(h, NULL, 16);
    }
    json_decref(j);
    *out = p;
    return STRATA_OK;
fail:
    json_decref(j);
    pack_close(p);
    return rc;
}

/* ==================================================================== verify */

static int verify_region(io_ring *ring, const io_file *f, const pack_region *r, const char *what, uint8_t *buf,
                         uint64_t bsz, char *err, size_t errlen) {
    XXH3_state_t h;
    XXH3_64bits_reset(&h);
    for (uint64_t o = 0; o < r->nbytes; o += bsz) {
        uint64_t n = r->nbytes - o < bsz ? r->nbytes - o : bsz;
        io_req q = {.f = f, .off = r->off + o, .len = n, .dst = buf};
        io_submit(ring, &q);
        io_req *d;
        io_reap(ring, 1, &d);
        if (q.rc) {
            char e2[600];
            io_req_errstr(&q, e2, sizeof e2);
            return base_fail(err, errlen, STRATA_ECORRUPT, "%s: unreadable (truncated pack?): %s", what, e2);
        }
        XXH3_64bits_update(&h, buf, n);
    }
    uint64_t got = XXH3_64bits_digest(&h);
    if (got != r->xxh3)
        return base_fail(err, errlen, STRATA_ECORRUPT,
                         "%s: checksum mismatch in %s bytes %llu..%llu (expected %016llx, got %016llx): the pack is corrupt; re-run strata pack --force",
                         what, f->path, (unsigned long long)r->off, (unsigned long long)(r->off + r->nbytes),
                         (unsigned long long)r->xxh3, (unsigned long long)got);
    return STRATA_OK;
}

int pack_verify(const pack *p, const cfg *c, const st_index *ix, pack_progress_fn progress, void *ud,
                char *err, size_t errlen) {
    io_file f;
    int rc = io_file_open(&f, p->trunk_path, err, errlen);
    if (rc) return rc;
    io_ring *ring = NULL;
    const uint64_t bsz = 16u << 20;
    uint8_t *buf = base_alloc_aligned(bsz, 1u << 20, MEM_IO);
    if (!buf) rc = base_fail(err, errlen, STRATA_ENOMEM, "pack: out of memory");
    if (!rc) rc = io_ring_create(&ring, 8, 0, 0, err, errlen);
    double t0 = base_now();
    if (!rc) rc = verify_region(ring, &f, &p->embed, "embed", buf, bsz, err, errlen);
    for (int64_t u = 0; u <= p->n_layers && !rc; u++) {
        char what[64];
        if (u < p->n_layers) snprintf(what, sizeof what, "layer %lld", (long long)u); else snprintf(what, sizeof what, "head");
        rc = verify_region(ring, &f, &p->units[u], what, buf, bsz, err, errlen);
        if (progress) progress(ud, "trunk", p->units[u].off + p->units[u].nbytes, p->trunk_bytes, base_now() - t0);
    }
    io_ring_free(ring);
    base_free(buf);
    io_file_close(&f);
    if (rc) return rc;
    uint64_t *xh = base_calloc((size_t)(p->n_moe * p->n_experts + 1), sizeof *xh, MEM_INDEX);
    if (!xh) return base_fail(err, errlen, STRATA_ENOMEM, "pack: out of memory");
    rc = hash_experts(c, ix, xh, p->expert_xxh3, progress, ud, NULL, err, errlen);
    base_free(xh);
    return rc;
}

double pack_measure_write_bw(const char *dir, uint64_t bytes) {
    char path[2048];
    snprintf(path, sizeof path, "%s/.strata-bw.%d", dir, (int)getpid());
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_DIRECT, 0600);
    if (fd < 0) return 0;
    const uint64_t bsz = 16u << 20;
    uint8_t *buf = base_alloc_aligned(bsz, 1u << 20, MEM_IO);
    double bw = 0;
    if (buf) {
        memset(buf, 0x5a, bsz);
        double t0 = base_now();
        uint64_t w = 0;
        while (w < bytes) {
            ssize_t k = pwrite(fd, buf, bsz, (off_t)w);
            if (k <= 0) break;
            w += (uint64_t)k;
        }
        fsync(fd);
        double dt = base_now() - t0;
        if (w >= bytes && dt > 0) bw = (double)w / dt;
    }
    close(fd);
    unlink(path);
    base_free(buf);
    return bw;
}
