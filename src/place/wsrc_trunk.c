/*
 * wsrc_trunk.c: the streaming source's trunk units (wsrc_stream.c describes the
 * whole): their records (from the pack or in place, sliced or checked by blocks),
 * their reads and checksums, the reader thread and its queue, the arena the
 * streamed units are placed in, and the trunk ops (layer_get, layer_put,
 * hint_layer, layer_peek).
 */
#include <stdlib.h>
#include <string.h>
#include "num.h"
#include "wsrc_stream_int.h"

/* Wall time with at least one read in flight, over both threads (under mu). */
static void io_enter(stream *s) {
    if (s->io_active++ == 0) s->io_t0 = base_now();
}
static void io_leave(stream *s) {
    if (--s->io_active == 0) s->st.read_s += base_now() - s->io_t0;
}
/* The caller's thread: same, taking mu; bytes/reads/wait accounted with it. */
void stream_io_enter_l(stream *s) {
    pthread_mutex_lock(&s->mu);
    io_enter(s);
    pthread_mutex_unlock(&s->mu);
}
void stream_io_leave_l(stream *s, uint64_t *counter, uint64_t bytes, uint64_t reads, double waited) {
    pthread_mutex_lock(&s->mu);
    if (reads) io_leave(s);
    if (counter) *counter += bytes;
    s->st.n_reads += reads;
    s->st.wait_s += waited;
    pthread_mutex_unlock(&s->mu);
}

wt stream_view_of(const tspec *t, int dtype) { return wt_view_of(t, dtype); }

/* ====================================================== building records */

typedef struct gather {
    const cfg *c;
    const st_index *ix;
    pend *p;
    int n, cap;
    int cls_mask;
    char *err;
    size_t errlen;
    int rc;
} gather;

static int gather_fn(void *ud, const tspec *t) {
    gather *g = ud;
    if (g->cls_mask && !((1 << t->cls) & g->cls_mask)) return 0;
    const st_tensor *s = st_find(g->ix, t->name);
    if (!s && ((t->role == R_MLA_G && !g->c->mla_out_gate) || (t->role == R_MOE_LAT_NORM && !g->c->latent_norm))) return 0;
    if (!s) return g->rc = base_fail(g->err, g->errlen, STRATA_EFORMAT, "stream: tensor %s missing", t->name);
    int64_t numel = 1;
    for (int i = 0; i < s->ndim; i++) numel *= s->shape[i];
    if (numel != t->numel)
        return g->rc = base_fail(g->err, g->errlen, STRATA_EFORMAT, "stream: tensor %s has %lld elements, expected %lld",
                                 t->name, (long long)numel, (long long)t->numel);
    if (g->n == g->cap) {
        if (!g->p) return g->rc = base_fail(g->err, g->errlen, STRATA_EINVAL, "stream: too many tensors in a record");
        int cap = g->cap * 2;
        pend *np = base_realloc(g->p, (size_t)cap * sizeof *np, MEM_INDEX);
        if (!np) return g->rc = base_fail(g->err, g->errlen, STRATA_ENOMEM, "stream: out of memory");
        g->p = np;
        g->cap = cap;
    }
    g->p[g->n++] = (pend){s, t->role, t->kind, stream_view_of(t, s->dtype)};
    return 0;
}

static int pend_cmp(const void *a, const void *b) {
    const pend *x = a, *y = b;
    if (x->s->shard != y->s->shard) return x->s->shard < y->s->shard ? -1 : 1;
    return x->s->off < y->s->off ? -1 : x->s->off > y->s->off;
}

/* Lays out tensors read in place: segments of near neighbours, aligned. Writes at
 * most max_seg segments / n tensors; returns the buffer bytes or 0 on overflow. */
uint64_t stream_layout_inplace(pend *p, int n, seg *segs, int max_seg, int *n_seg, tref *t) {
    qsort(p, (size_t)n, sizeof *p, pend_cmp);
    int ns = 0;
    uint64_t buf = 0;
    for (int i = 0; i < n; i++) {
        const st_tensor *s = p[i].s;
        seg *g = ns ? &segs[ns - 1] : NULL;
        uint64_t end = s->off + s->nbytes;
        if (g && g->file == s->shard && s->off >= g->off && s->off <= g->off + g->need + SEG_GAP) {
            uint64_t need = end - g->off;
            if (need > g->need) g->need = need;
            buf -= g->len;
            g->len = io_align_up(g->off + g->need) - g->off;
            buf += g->len;
        } else {
            if (ns == max_seg) return 0;
            g = &segs[ns++];
            g->file = s->shard;
            g->off = io_align_down(s->off);
            g->need = end - g->off;
            g->len = io_align_up(end) - g->off;
            g->buf_off = buf;
            buf += g->len;
        }
        t[i].role = (int16_t)p[i].role;
        t[i].kind = (int16_t)p[i].kind;
        t[i].seg = ns - 1;
        t[i].rel = g->buf_off + (s->off - g->off);
        t[i].view = p[i].view;
    }
    *n_seg = ns;
    return buf;
}

/* A unit read in row slices (plan.sliced, not pinned): its matrices over
 * plan.slice_min_bytes of the roles place_sliceable_role names go to x->big (read
 * by rows_get); the rest is laid out as in-place segments (from the pack: at their
 * pack offsets), each with its own checksum when the pack has one. */
static int build_sliced(stream *s, unit *x, int64_t u, gather *g, char *err, size_t errlen) {
    const pack_region *r = s->pk ? &s->pk->units[u] : NULL;
    st_tensor *fake = base_calloc((size_t)g->n + 1, sizeof *fake, MEM_INDEX);
    pend *small = base_calloc((size_t)g->n + 1, sizeof *small, MEM_INDEX);
    x->big = base_alloc_aligned(((size_t)g->n + 1) * sizeof *x->big, 64, MEM_INDEX); /* XXH3_state_t: 64-aligned */
    if (x->big) memset(x->big, 0, ((size_t)g->n + 1) * sizeof *x->big);
    x->sum = base_calloc((size_t)g->n + 1, sizeof *x->sum, MEM_INDEX);
    int rc = 0, ns = 0;
    if (!fake || !small || !x->big || !x->sum) { rc = base_fail(err, errlen, STRATA_ENOMEM, "stream: out of memory"); goto out; }
    const pack_tensor *pt[R_COUNT] = {0}; /* each role's pack record */
    for (int i = 0; i < g->n && !rc; i++) {
        const pend *p = &g->p[i];
        const st_tensor *t = p->s;
        if (r) {
            int k = -1;
            for (int j = 0; j < r->n_tensors; j++) if (r->t[j].name == t->name) { k = j; break; }
            if (k < 0) { rc = base_fail(err, errlen, STRATA_EFORMAT, "stream: pack lacks %s", t->name); break; }
            pt[p->role] = &r->t[k];
            fake[i] = *t;
            fake[i].shard = s->n_files - 1;
            fake[i].off = r->off + r->t[k].off;
            t = &fake[i];
            if (VERIFY(s) && !r->t[k].has_xxh3) {
                rc = base_fail(err, errlen, STRATA_EINVAL, "stream: %s: the pack predates per-tensor checksums, which row slices "
                               "need: rebuild it (strata pack --force) or run with --no-verify", s->pk->dir);
                break;
            }
        }
        const uint64_t rb = t->nbytes / (uint64_t)(p->view.rows > 0 ? p->view.rows : 1);
        if ((p->kind == TK_MATRIX || p->kind == TK_FP8) && place_sliceable_role(p->role) && t->nbytes > s->plan.slice_min_bytes && p->view.rows > 1 &&
            rb * (uint64_t)p->view.rows == t->nbytes) {
            bigt *b = &x->big[x->n_big++];
            b->role = (int16_t)p->role;
            b->file = t->shard;
            b->off = t->off;
            b->nbytes = t->nbytes;
            b->rows = p->view.rows;
            b->row_bytes = rb;
            b->view = p->view;
            b->view.sliced = 1;
            b->view.role = p->role;
            b->view.unit = u;
            b->name = p->s->name;
            b->has_sum = r && pt[p->role]->has_xxh3;
            b->xxh3 = b->has_sum ? pt[p->role]->xxh3 : 0;
            if (rb > s->plan.slice_bytes)
                rc = base_fail(err, errlen, STRATA_EBUDGET, "stream: a row of %s (%llu bytes) exceeds a slice (%llu bytes)", p->s->name,
                               (unsigned long long)rb, (unsigned long long)s->plan.slice_bytes);
        } else {
            small[ns] = *p;
            small[ns++].s = t;
        }
    }
    if (!rc) {
        x->n_t = ns;
        x->buf_bytes = stream_layout_inplace(small, ns, x->segs, ns ? ns : 1, &x->n_seg, x->t);
        for (int i = 0; i < ns && r; i++) { /* stream_layout_inplace sorted them: each one's checksum by its pack offset */
            const pack_tensor *q = NULL;
            for (int j = 0; j < r->n_tensors && !q; j++) if (r->off + r->t[j].off == small[i].s->off) q = &r->t[j];
            if (q && q->has_xxh3) x->sum[x->n_sum++] = (tsum){x->t[i].rel, q->nbytes, q->xxh3, r->off + q->off, q->name};
        }
        x->has_sum = 0;
    }
out:
    base_free(fake);
    base_free(small);
    return rc;
}

/* A streamed unit whose pack region has block checksums: each matrix with them
 * gets a wblk (checked by its users, wblk.h), each other tensor its own checksum
 * (x->sum, after each read), and the whole region's hash is no longer computed
 * as it lands. Every tensor needs its own checksum or blocks; else (a pack from
 * before them) the unit keeps the region's hash. */
static int build_blocks(stream *s, unit *x, const pack_region *r, char *err, size_t errlen) {
    int nb = 0, rc = 0;
    /* each tensor's record (by offset: a quantised matrix's parts share a role) */
    const pack_tensor **pt = base_calloc((size_t)x->n_t + 1, sizeof *pt, MEM_SCRATCH);
    if (!pt) return base_fail(err, errlen, STRATA_ENOMEM, "stream: out of memory");
    for (int i = 0; i < x->n_t; i++) {
        for (int j = 0; j < r->n_tensors; j++)
            if (r->t[j].off == x->t[i].rel && r->t[j].role == x->t[i].role) { pt[i] = &r->t[j]; break; }
        const pack_tensor *q = pt[i];
        if (!q || (!q->n_blk && !q->has_xxh3)) goto out;
        if (q->n_blk && (q->blk_rows < 1 || x->t[i].view.rows != q->shape[0] || q->nbytes % (uint64_t)q->shape[0])) goto out;
        nb += q->n_blk > 0;
    }
    if (!nb) goto out;
    x->wb = base_calloc((size_t)nb, sizeof *x->wb, MEM_INDEX);
    x->wb_t = base_calloc((size_t)nb, sizeof *x->wb_t, MEM_INDEX);
    x->sum = base_calloc((size_t)x->n_t + 1, sizeof *x->sum, MEM_INDEX);
    if (!x->wb || !x->wb_t || !x->sum) { rc = base_fail(err, errlen, STRATA_ENOMEM, "stream: out of memory"); goto out; }
    for (int i = 0; i < x->n_t; i++) {
        const pack_tensor *q = pt[i];
        if (!q->n_blk) { x->sum[x->n_sum++] = (tsum){x->t[i].rel, q->nbytes, q->xxh3, r->off + q->off, q->name}; continue; }
        wblk *b = &x->wb[x->n_wb];
        x->wb_t[x->n_wb++] = (int16_t)i;
        b->want = q->blk;
        b->n = q->n_blk;
        b->rows = q->shape[0];
        b->R = q->blk_rows;
        b->row_bytes = q->nbytes / (uint64_t)q->shape[0];
        b->name = q->name;
        b->path = s->files[s->n_files - 1].path;
        b->off = r->off + q->off;
        b->done = base_calloc((size_t)b->n, sizeof *b->done, MEM_INDEX);
        if (!b->done) { rc = base_fail(err, errlen, STRATA_ENOMEM, "stream: out of memory"); goto out; }
        atomic_init(&b->bad, -1);
    }
    x->has_sum = 0;
out:
    base_free(pt);
    return rc;
}

/* Records of every trunk unit, from the pack or in place. */
int stream_build_units(stream *s, char *err, size_t errlen) {
    const cfg *c = s->c;
    int rc = 0;
    gather g = {.c = c, .ix = s->ix, .cap = 64, .err = err, .errlen = errlen};
    g.p = base_alloc((size_t)g.cap * sizeof *g.p, MEM_INDEX);
    if (!g.p) return base_fail(err, errlen, STRATA_ENOMEM, "stream: out of memory");
    for (int64_t u = 0; u < s->n_units && !rc; u++) {
        unit *x = &s->u[u];
        x->qnext = -1;
        if (s->plan.absent[u]) continue; /* another stage's: no record, never read */
        g.n = 0;
        g.rc = 0;
        if (u < c->n_layers) { g.cls_mask = 0; schema_walk_layer(c, u, s->wf, gather_fn, &g); }
        else { g.cls_mask = (1 << TC_FINAL) | (1 << TC_LM_HEAD); schema_walk(c, 0, gather_fn, &g); }
        if ((rc = g.rc)) break;
        x->t = base_calloc((size_t)g.n + 1, sizeof *x->t, MEM_INDEX);
        x->segs = base_calloc((size_t)g.n + 1, sizeof *x->segs, MEM_INDEX);
        if (!x->t || !x->segs) { rc = base_fail(err, errlen, STRATA_ENOMEM, "stream: out of memory"); break; }
        x->n_t = g.n;
        x->data_bytes = 0;
        for (int i = 0; i < g.n; i++) x->data_bytes += g.p[i].s->nbytes;
        if (s->plan.sliced && !s->plan.pinned[u]) {
            rc = build_sliced(s, x, u, &g, err, errlen);
        } else if (s->pk) {
            const pack_region *r = &s->pk->units[u];
            x->n_seg = 1;
            x->segs[0] = (seg){.file = s->n_files - 1, .off = r->off, .len = r->nbytes, .need = r->nbytes};
            for (int i = 0; i < g.n; i++) {
                int k = -1;
                for (int j = 0; j < r->n_tensors; j++) if (r->t[j].name == g.p[i].s->name) { k = j; break; }
                if (k < 0) { rc = base_fail(err, errlen, STRATA_EFORMAT, "stream: pack lacks %s", g.p[i].s->name); break; }
                x->t[i] = (tref){.role = (int16_t)g.p[i].role, .kind = (int16_t)g.p[i].kind, .seg = 0, .rel = r->t[k].off, .view = g.p[i].view};
            }
            x->buf_bytes = r->nbytes;
            x->xxh3 = r->xxh3;
            x->has_sum = 1;
            if (!rc && !s->plan.pinned[u] && VERIFY(s)) rc = build_blocks(s, x, r, err, errlen);
        } else {
            x->buf_bytes = stream_layout_inplace(g.p, g.n, x->segs, g.n, &x->n_seg, x->t);
        }
        x->pinned = s->plan.pinned[u];
        x->qnext = -1;
        if (!x->pinned && x->buf_bytes > s->arena_bytes && !rc)
            rc = base_fail(err, errlen, STRATA_EBUDGET, "stream: unit %lld needs %llu bytes, the arena holds %llu (plan mismatch)",
                           (long long)u, (unsigned long long)x->buf_bytes, (unsigned long long)s->arena_bytes);
    }
    base_free(g.p);
    return rc;
}

/* ========================================================== reading records */

/* XXH3_64bits of bytes a read just landed (wblk_hash_cold: the same value). */
uint64_t stream_hash_cold(const uint8_t *p, uint64_t n) {
    XXH3_state_t h;
    XXH3_64bits_reset(&h);
    wblk_hash_cold(&h, p, (size_t)n);
    return XXH3_64bits_digest(&h);
}

/* Counts bytes hashed against the pack and the time it took (any thread: the
 * I/O thread hashes trunk pieces, the engine thread whole experts). */
void stream_verify_count(stream *s, uint64_t bytes, double secs) {
    atomic_fetch_add_explicit(&s->verify_bytes, bytes, memory_order_relaxed);
    atomic_fetch_add_explicit(&s->verify_ns, (uint64_t)(secs * 1e9), memory_order_relaxed);
}

/* Reads a record's segments into buf on ring r (many in flight), then checks the
 * checksum when asked. Called without the mutex. Returns 0 or an error in err. */
/* A pack record (one segment) read in pieces with the checksum computed as
 * they land, in order, while the later pieces are still in flight: hashing a
 * whole unit after its read put XXH3 (~8 GB/s here) on the stream's critical
 * path (ladder at 1 GB: 0.68 -> 0.75-0.90 s/token with verification).
 * The unit is released when its last piece is hashed, and the next unit's reads
 * start only then, so the last piece's hash is a gap in the disk's work for each
 * unit: 2 MiB pieces (32 in flight, the same 64 MiB) instead of 8 MiB shorten it.
 * Ladder at 1 GB, 5 interleaved pairs, verified / --no-verify: 1.03-1.11 (median
 * 1.09) vs 1.07-1.32 (median 1.12) with 8 MiB. */
#define HASH_PIECE (2u << 20)
#define HASH_INFLIGHT 32
static int read_record_hashed(stream *s, io_ring *r, const seg *g, uint8_t *buf, uint64_t want_sum, const char *what,
                              char *err, size_t errlen) {
    io_req q[HASH_INFLIGHT];
    uint8_t landed[HASH_INFLIGHT];
    const uint64_t n_piece = (g->len + HASH_PIECE - 1) / HASH_PIECE;
    XXH3_state_t h;
    XXH3_64bits_reset(&h);
    uint64_t next_sub = 0, next_hash = 0;
    int rc = 0, inflight = 0;
    while (next_hash < n_piece) {
        while (!rc && next_sub < n_piece && next_sub < next_hash + HASH_INFLIGHT) {
            const uint64_t o = next_sub * HASH_PIECE, len = g->len - o < HASH_PIECE ? g->len - o : HASH_PIECE;
            const uint64_t need = g->need > o ? (g->need - o < len ? g->need - o : len) : 0;
            io_req *x = &q[next_sub % HASH_INFLIGHT];
            *x = (io_req){.f = &s->files[g->file], .off = g->off + o, .len = len, .need = need ? need : 1,
                          .dst = buf + g->buf_off + o, .ud = (void *)(uintptr_t)next_sub};
            landed[next_sub % HASH_INFLIGHT] = 0;
            io_submit(r, x);
            next_sub++;
            inflight++;
        }
        if (rc && !inflight) break;
        io_req *d;
        if (io_reap(r, 1, &d) != 1) { rc = base_fail(err, errlen, STRATA_EIO, "%s: lost read", what); break; }
        inflight--;
        if (d->rc && !rc) {
            char e2[512];
            io_req_errstr(d, e2, sizeof e2);
            rc = base_fail(err, errlen, STRATA_EIO, "%s: %s", what, e2);
        }
        landed[(uintptr_t)d->ud % HASH_INFLIGHT] = 1;
        /* hash every piece that is now complete, in file order */
        while (!rc && next_hash < next_sub && landed[next_hash % HASH_INFLIGHT]) {
            const uint64_t o = next_hash * HASH_PIECE;
            if (g->need > o) {
                const uint64_t n = g->need - o < HASH_PIECE ? g->need - o : HASH_PIECE;
                const double t0 = base_now();
                wblk_hash_cold(&h, buf + g->buf_off + o, n);
                stream_verify_count(s, n, base_now() - t0);
            }
            next_hash++;
        }
        if (rc && !inflight) break;
    }
    while (inflight > 0) { /* after an error: let every submitted piece land before the buffer is reused */
        io_req *d;
        if (io_reap(r, 1, &d) != 1) break;
        inflight--;
    }
    if (rc) return rc;
    const uint64_t got = XXH3_64bits_digest(&h);
    if (got != want_sum)
        return base_fail(err, errlen, STRATA_ECORRUPT,
                         "%s: checksum mismatch in %s bytes %llu..%llu (expected %016llx, got %016llx): the pack is corrupt or "
                         "stale; run strata pack --verify",
                         what, s->files[g->file].path, (unsigned long long)g->off, (unsigned long long)(g->off + g->need),
                         (unsigned long long)want_sum, (unsigned long long)got);
    return 0;
}

static int read_record(stream *s, io_ring *r, const seg *segs, int n_seg, uint8_t *buf, uint64_t want_sum,
                       int check, const char *what, char *err, size_t errlen) {
    if (check && n_seg == 1) return read_record_hashed(s, r, &segs[0], buf, want_sum, what, err, errlen);
    io_req q[16];
    int rc = 0;
    for (int i0 = 0; i0 < n_seg && !rc; i0 += 16) {
        int n = n_seg - i0 < 16 ? n_seg - i0 : 16;
        for (int i = 0; i < n; i++) {
            const seg *g = &segs[i0 + i];
            q[i] = (io_req){.f = &s->files[g->file], .off = g->off, .len = g->len, .need = g->need, .dst = buf + g->buf_off};
            io_submit(r, &q[i]);
        }
        for (int i = 0; i < n; i++) {
            io_req *d;
            if (io_reap(r, 1, &d) != 1) { rc = base_fail(err, errlen, STRATA_EIO, "%s: lost read", what); break; }
            if (d->rc && !rc) {
                char e2[512];
                io_req_errstr(d, e2, sizeof e2);
                rc = base_fail(err, errlen, STRATA_EIO, "%s: %s", what, e2);
            }
        }
    }
    if (!rc && check) {
        const double t0 = base_now();
        uint64_t got = stream_hash_cold(buf + segs[0].buf_off, segs[0].need);
        stream_verify_count(s, segs[0].need, base_now() - t0);
        if (got != want_sum)
            rc = base_fail(err, errlen, STRATA_ECORRUPT,
                           "%s: checksum mismatch in %s bytes %llu..%llu (expected %016llx, got %016llx): the pack is corrupt or "
                           "stale; run strata pack --verify",
                           what, s->files[segs[0].file].path, (unsigned long long)segs[0].off,
                           (unsigned long long)(segs[0].off + segs[0].need), (unsigned long long)want_sum, (unsigned long long)got);
    }
    return rc;
}

static void bind_unit(unit *x) {
    memset(x->roles, 0, sizeof x->roles);
    for (int i = 0; i < x->n_t; i++) {
        wt v = x->t[i].view;
        v.p = x->buf + x->t[i].rel;
        wt_put(x->roles, x->t[i].role, x->t[i].kind, v);
    }
    for (int k = 0; k < x->n_wb; k++) { /* read again: every block unchecked */
        const tref *t = &x->t[x->wb_t[k]];
        wblk_reset(&x->wb[k], x->buf + t->rel);
        if (!schema_is_companion(t->kind)) x->roles[t->role].vb = &x->wb[k];
    }
    for (int i = 0; i < x->n_big; i++) wt_put(x->roles, x->big[i].role, TK_MATRIX, x->big[i].view); /* keeps an FP8 scale's s */
}

/* A sliced unit's whole tensors against their own checksums (read_record checks a
 * whole unit's; a sliced one is not read whole). */
static int check_sums(stream *s, unit *x, const char *what, char *err, size_t errlen) {
    for (int i = 0; i < x->n_sum; i++) {
        const tsum *t = &x->sum[i];
        const uint64_t got = stream_hash_cold(x->buf + t->rel, t->nbytes);
        if (got != t->xxh3)
            return base_fail(err, errlen, STRATA_ECORRUPT,
                             "%s: checksum mismatch in %s, %s bytes %llu..%llu (expected %016llx, got %016llx): the pack is "
                             "corrupt or stale; run strata pack --verify", what, t->name, s->files[s->n_files - 1].path,
                             (unsigned long long)t->foff, (unsigned long long)(t->foff + t->nbytes), (unsigned long long)t->xxh3,
                             (unsigned long long)got);
    }
    return 0;
}

void stream_unit_name(const stream *s, int64_t u, char *b, size_t n) {
    if (u < s->c->n_layers) snprintf(b, n, "layer %lld", (long long)u);
    else snprintf(b, n, "head");
}

/* The early guesses' MXFP4 copy of a pinned unit's router, from its bytes as read
 * and checked (a router checked block by block as used has no copy). Ladder: 36
 * copies of 448 x 2048 bf16 (1.8 MB -> 0.46 MB each). */
static void guess_build(stream *s, unit *x) {
    const tref *r = NULL;
    for (int i = 0; i < x->n_t; i++) if (x->t[i].role == R_MOE_ROUTER) r = &x->t[i];
    for (int k = 0; k < x->n_wb && r; k++) if (&x->t[x->wb_t[k]] == r) r = NULL;
    const int64_t E = s->NE, H = s->c->hidden;
    if (!r || r->view.rows != E || r->view.cols != H || H % 32 ||
        (r->view.dtype != DT_BF16 && r->view.dtype != DT_F16 && r->view.dtype != DT_F32))
        return;
    const int dt = r->view.dtype;
    const size_t n = (size_t)E * (size_t)H, esz = st_dtype_size(dt);
    const uint8_t *src = x->buf + r->rel;
    uint8_t *P = x->gq, *S = x->gq + place_guess_codes_bytes(n);
    float f[32];
    for (size_t i = 0; i < n; i += 32) {
        num_to_f32(f, src + i * esz, dt, 32);
        num_mxfp4_quantize(P + i / 2, S + i / 32, f, 32);
    }
    x->gqw[0] = (wt){.p = P, .dtype = DT_U8, .rows = E, .cols = H};
    x->gqw[1] = (wt){.p = S, .dtype = DT_U8, .rows = E, .cols = H / 32};
    x->gq_ok = 1;
}

/* Loads unit u (state LOADING, buffer placed) on ring r. Takes and returns with mu held. */
void stream_load_unit_locked(stream *s, int64_t u, io_ring *r) {
    unit *x = &s->u[u];
    uint8_t *buf = x->buf;
    io_enter(s);
    pthread_mutex_unlock(&s->mu);
    char what[64];
    stream_unit_name(s, u, what, sizeof what);
    int rc = read_record(s, r, x->segs, x->n_seg, buf, x->xxh3, x->has_sum && VERIFY(s), what, x->err, sizeof x->err);
    if (!rc && x->n_sum && VERIFY(s)) rc = check_sums(s, x, what, x->err, sizeof x->err);
    const int built = !rc && x->gq && !x->gq_ok;
    if (built) guess_build(s, x);
    pthread_mutex_lock(&s->mu);
    s->st.guess_copies += built && x->gq_ok;
    io_leave(s);
    if (u < s->c->n_layers) s->st.bytes_trunk += x->buf_bytes; else s->st.bytes_head += x->buf_bytes;
    s->st.n_reads += (uint64_t)x->n_seg;
    if (!rc) bind_unit(x);
    x->state = rc ? U_ERROR : U_READY;
    pthread_cond_broadcast(&s->cv);
}

void *stream_reader_main(void *arg) {
    stream *s = arg;
    pthread_mutex_lock(&s->mu);
    for (;;) {
        while (s->q_head < 0 && !s->stop) pthread_cond_wait(&s->cv, &s->mu);
        if (s->stop) break;
        int64_t u = s->q_head;
        s->q_head = s->u[u].qnext;
        if (s->q_head < 0) s->q_tail = -1;
        s->u[u].qnext = -1;
        s->u[u].state = U_LOADING;
        stream_load_unit_locked(s, u, s->rring);
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

static void enqueue_locked(stream *s, int64_t u) {
    unit *x = &s->u[u];
    x->state = U_QUEUED;
    x->qnext = -1;
    if (s->q_tail >= 0) s->u[s->q_tail].qnext = (int)u; else s->q_head = (int)u;
    s->q_tail = (int)u;
    pthread_cond_broadcast(&s->cv);
}

static void dequeue_locked(stream *s, int64_t u) {
    int prev = -1;
    for (int i = s->q_head; i >= 0; prev = i, i = s->u[i].qnext)
        if (i == u) {
            if (prev >= 0) s->u[prev].qnext = s->u[i].qnext; else s->q_head = s->u[i].qnext;
            if (s->q_tail == i) s->q_tail = prev;
            s->u[i].qnext = -1;
            return;
        }
}

/* ===================================================================== arena */

/* First and last placed units (by allocation order); -1 when the arena is empty. */
static void arena_ends(const stream *s, int64_t *first, int64_t *last) {
    *first = *last = -1;
    for (int64_t i = 0; i < s->n_units; i++) {
        const unit *x = &s->u[i];
        if (!x->in_arena) continue;
        if (*first < 0 || x->a_seq < s->u[*first].a_seq) *first = i;
        if (*last < 0 || x->a_seq > s->u[*last].a_seq) *last = i;
    }
}

/* Places u in the arena as a ring: after the newest unit, or wrapped to the start
 * when the oldest has moved past it. Never touches placed units. */
static int arena_alloc_locked(stream *s, int64_t u) {
    unit *x = &s->u[u];
    int64_t f, l;
    arena_ends(s, &f, &l);
    uint64_t off;
    if (f < 0) off = 0;
    else {
        uint64_t first = s->u[f].a_off, tail = s->u[l].a_off + s->u[l].buf_bytes;
        if (tail > first || (tail == first && f == l)) {
            if (tail + x->buf_bytes <= s->arena_bytes) off = tail;
            else if (x->buf_bytes <= first) off = 0;
            else return -1;
        } else {
            if (tail + x->buf_bytes <= first) off = tail;
            else return -1;
        }
    }
    x->in_arena = 1;
    x->a_off = off;
    x->a_seq = ++s->a_seq;
    x->buf = s->arena + off;
    return 0;
}

static void arena_free_locked(stream *s, int64_t u) {
    unit *x = &s->u[u];
    ST_ASSERT(x->held == 0);
    x->in_arena = 0;
    x->buf = NULL;
    x->state = U_IDLE;
}

/* Drops placed units nobody holds (prefetched, then skipped): a queued one leaves
 * the queue; a loading one is waited for first (its buffer is being written). */
static void arena_drop_unheld_locked(stream *s, int64_t keep) {
    for (int64_t i = 0; i < s->n_units; i++) {
        unit *x = &s->u[i];
        if (!x->in_arena || x->held || i == keep) continue;
        if (x->state == U_QUEUED) dequeue_locked(s, i);
        while (x->state == U_LOADING) pthread_cond_wait(&s->cv, &s->mu);
        if (x->held || !x->in_arena) continue;
        arena_free_locked(s, i);
    }
}

/* Read-ahead: from unit `from` on in walk order, queue pinned units not yet loaded
 * and place streamed ones while the arena has room (never evicting). */
static void schedule_locked(stream *s, int64_t from) {
    if (!s->th_started) return;
    const int64_t n = s->n_units, nl = s->c->n_layers;
    int64_t u = from;
    for (int64_t k = 0; k < n; k++) {
        if (u > nl) u = 0;
        if (u == nl && !s->head_follows) u = 0; /* last passes skipped the head */
        unit *x = &s->u[u];
        if (s->plan.absent[u]) {
            /* another stage's unit: nothing to read */
        } else if (x->pinned) {
            if (x->state == U_IDLE) enqueue_locked(s, u);
        } else if (!x->in_arena) {
            if (x->state == U_ERROR) break;
            if (arena_alloc_locked(s, u)) break;
            enqueue_locked(s, u);
        }
        u++;
    }
}

/* ================================================================ trunk ops */

int stream_layer_get(wsrc *w, int64_t L, const wt **roles) {
    stream *s = (stream *)w;
    if (L < 0 || L >= s->n_units) return base_fail(s->err, sizeof s->err, STRATA_EINVAL, "stream: layer %lld out of range", (long long)L);
    if (s->plan.absent[L]) return base_fail(s->err, sizeof s->err, STRATA_EINVAL, "stream: unit %lld is held by another stage", (long long)L);
    double t0 = base_now();
    pthread_mutex_lock(&s->mu);
    unit *x = &s->u[L];
    s->st.layer_gets++;
    if (x->pinned && x->state == U_READY) s->st.layer_gets_pinned++;
    /* the head predictor: did the walk go from the last layer to the head? */
    if (L == s->c->n_layers) s->head_follows = 1;
    else if (L == 0 && s->last_get == s->c->n_layers - 1) s->head_follows = 0;
    s->last_get = L;
    if (x->state == U_ERROR) x->state = U_IDLE; /* a failed read is retried, never served */
    if (!x->pinned && !x->in_arena) {
        arena_drop_unheld_locked(s, L);
        if (arena_alloc_locked(s, L)) {
            pthread_mutex_unlock(&s->mu);
            return base_fail(s->err, sizeof s->err, STRATA_EBUDGET,
                             "stream: layer %lld (%llu bytes) does not fit the arena (%llu bytes) next to the units held",
                             (long long)L, (unsigned long long)x->buf_bytes, (unsigned long long)s->arena_bytes);
        }
    } else if (!x->pinned) {
        /* units placed before L were prefetched and skipped: free their space */
        for (int64_t i = 0; i < s->n_units; i++)
            if (s->u[i].in_arena && !s->u[i].held && s->u[i].a_seq < x->a_seq) {
                unit *y = &s->u[i];
                if (y->state == U_QUEUED) dequeue_locked(s, i);
                while (y->state == U_LOADING) pthread_cond_wait(&s->cv, &s->mu);
                if (!y->held && y->in_arena) arena_free_locked(s, i);
            }
    }
    if (x->state == U_IDLE) {
        if (s->th_started) enqueue_locked(s, L);
        else { x->state = U_LOADING; stream_load_unit_locked(s, L, s->rring); }
    }
    while (x->state == U_QUEUED || x->state == U_LOADING) pthread_cond_wait(&s->cv, &s->mu);
    int rc = 0;
    if (x->state == U_ERROR) {
        rc = base_fail(s->err, sizeof s->err, x->err[0] && strstr(x->err, "checksum") ? STRATA_ECORRUPT : STRATA_EIO, "%s", x->err);
        if (!x->pinned) arena_free_locked(s, L);
        else x->state = U_IDLE;
    } else {
        x->held++;
        *roles = x->roles;
        schedule_locked(s, L + 1);
    }
    s->st.wait_s += base_now() - t0;
    pthread_mutex_unlock(&s->mu);
    return rc;
}

void stream_layer_put(wsrc *w, int64_t L) {
    stream *s = (stream *)w;
    if (L < 0 || L >= s->n_units) return;
    pthread_mutex_lock(&s->mu);
    unit *x = &s->u[L];
    ST_ASSERT(x->held > 0);
    if (--x->held == 0 && !x->pinned) arena_free_locked(s, L);
    schedule_locked(s, L + 1);
    pthread_mutex_unlock(&s->mu);
}

void stream_hint_layer(wsrc *w, int64_t L) {
    stream *s = (stream *)w;
    if (L < 0) return;
    pthread_mutex_lock(&s->mu);
    schedule_locked(s, L > s->c->n_layers ? 0 : L);
    pthread_mutex_unlock(&s->mu);
}

/* A pinned unit is never moved or freed while the source is open, so a draft
 * pass borrows it without a hold (and without touching the read-ahead). */
int stream_layer_peek(wsrc *w, int64_t L, const wt **roles) {
    stream *s = (stream *)w;
    if (L < 0 || L >= s->n_units) return 1;
    pthread_mutex_lock(&s->mu);
    const unit *x = &s->u[L];
    const int ok = x->pinned && x->state == U_READY;
    if (ok) *roles = x->roles;
    pthread_mutex_unlock(&s->mu);
    return ok ? 0 : 1;
}
