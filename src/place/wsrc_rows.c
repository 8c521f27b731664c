/*
 * wsrc_rows.c: the streaming source's row slices (plan.sliced): a streamed unit's
 * large matrices read a slice of rows at a time into a few buffers on the forward
 * thread's ring, each matrix checked against its own checksum as its slices are
 * consumed in row order (rows_slice, rows_hint, rows_get, rows_put).
 */
#include "wsrc_stream_int.h"

/* ============================================================ row slices */

static bigt *big_of(stream *s, const wt *t) {
    if (!t || !t->sliced || t->unit < 0 || t->unit >= s->n_units) return NULL;
    unit *x = &s->u[t->unit];
    for (int i = 0; i < x->n_big; i++) if (x->big[i].role == t->role) return &x->big[i];
    return NULL;
}

static int slice_find(const stream *s, int64_t unit_i, int role, int64_t r0, int64_t r1) {
    for (int i = 0; i < s->n_sl; i++) {
        const slice *b = &s->sl[i];
        if (b->state != SL_FREE && b->unit == unit_i && b->role == role && b->r0 == r0 && b->r1 == r1) return i;
    }
    return -1;
}

/* A buffer to read into: a free one; for a read that is needed now (evict = 1),
 * else the oldest read ahead that nobody holds yet. A read ahead never takes a
 * buffer from another one. */
static int slice_take(stream *s, int evict) {
    int best = -1;
    for (int i = 0; i < s->n_sl; i++) {
        const slice *b = &s->sl[i];
        if (b->state == SL_FREE) return i;
        if (evict && b->state == SL_READY && !b->held && (best < 0 || b->seq < s->sl[best].seq)) best = i;
    }
    return best;
}

/* Starts the read of rows [r0, r1) of matrix b (unit_i) into buffer i: the
 * enclosing aligned range, one request (many chunks in flight). */
static void slice_start(stream *s, int i, const bigt *b, int64_t unit_i, int64_t r0, int64_t r1) {
    slice *x = &s->sl[i];
    const uint64_t a = b->off + (uint64_t)r0 * b->row_bytes, e = b->off + (uint64_t)r1 * b->row_bytes;
    const uint64_t off = io_align_down(a);
    x->state = SL_LOADING;
    x->held = 0;
    x->rc = 0;
    x->unit = unit_i;
    x->role = b->role;
    x->r0 = r0;
    x->r1 = r1;
    x->data_off = a - off;
    x->q = (io_req){.f = &s->files[b->file], .off = off, .len = io_align_up(e) - off, .need = e - off, .dst = x->buf,
                    .ud = (void *)(intptr_t)i};
    stream_io_enter_l(s);
    io_submit(s->sring, &x->q);
}

/* One slice read landed (or failed: the buffer is free again, its rc kept). */
static void slice_landed(stream *s, io_req *d) {
    slice *x = &s->sl[(int)(intptr_t)d->ud];
    x->rc = d->rc;
    x->state = d->rc ? SL_FREE : SL_READY;
    x->seq = ++s->sl_seq;
    stream_io_leave_l(s, x->unit < s->c->n_layers ? &s->st.bytes_trunk : &s->st.bytes_head, d->got, 1, 0);
}

/* Collects slice reads until buffer i has landed (or failed). */
static void slice_wait(stream *s, int i) {
    io_req *d;
    while (s->sl[i].state == SL_LOADING && io_reap(s->sring, 1, &d) == 1) slice_landed(s, d);
}

int64_t stream_rows_slice(wsrc *w, const wt *t) {
    stream *s = (stream *)w;
    const bigt *b = big_of(s, t);
    if (!b) return 0;
    const int64_t n = (int64_t)(s->plan.slice_bytes / b->row_bytes);
    return n > 0 ? n : 1;
}

void stream_rows_hint(wsrc *w, const wt *t, int64_t r0, int64_t r1) {
    stream *s = (stream *)w;
    const bigt *b = big_of(s, t);
    if (!b || r0 < 0 || r1 > b->rows || r0 >= r1 || slice_find(s, t->unit, t->role, r0, r1) >= 0) return;
    const int i = slice_take(s, 0);
    if (i >= 0) slice_start(s, i, b, t->unit, r0, r1);
}

int stream_rows_get(wsrc *w, const wt *t, int64_t r0, int64_t r1, const void **p) {
    stream *s = (stream *)w;
    bigt *b = big_of(s, t);
    if (!b || r0 < 0 || r1 > b->rows || r0 >= r1 || (uint64_t)(r1 - r0) * b->row_bytes > s->plan.slice_bytes)
        return base_fail(s->err, sizeof s->err, STRATA_EINVAL, "stream: rows %lld..%lld of a matrix not streamed in slices of that size",
                         (long long)r0, (long long)r1);
    const double t0 = base_now();
    int i = slice_find(s, t->unit, t->role, r0, r1);
    if (i < 0) {
        io_req *d;
        /* every buffer held or reading ahead: the next read ahead to land gives way */
        while ((i = slice_take(s, 1)) < 0 && io_pending(s->sring) && io_reap(s->sring, 1, &d) == 1) slice_landed(s, d);
        if (i < 0) return base_fail(s->err, sizeof s->err, STRATA_EBUDGET, "stream: every row slice buffer (%d) is held", s->n_sl);
        slice_start(s, i, b, t->unit, r0, r1);
    }
    slice_wait(s, i);
    stream_io_leave_l(s, NULL, 0, 0, base_now() - t0);
    slice *x = &s->sl[i];
    char what[64];
    stream_unit_name(s, t->unit, what, sizeof what);
    if (x->state != SL_READY) {
        char e2[512];
        io_req_errstr(&x->q, e2, sizeof e2);
        return base_fail(s->err, sizeof s->err, STRATA_EIO, "%s: %s rows %lld..%lld: %s", what, b->name, (long long)r0, (long long)r1, e2);
    }
    const uint8_t *data = x->buf + x->data_off;
    if (b->has_sum && VERIFY(s)) { /* the matrix's checksum over its slices, in row order */
        if (r0 == 0) { XXH3_64bits_reset(&b->h); b->next_row = 0; }
        if (r0 != b->next_row)
            return base_fail(s->err, sizeof s->err, STRATA_EINVAL, "stream: %s: rows of %s asked out of order (%lld, expected %lld)",
                             what, b->name, (long long)r0, (long long)b->next_row);
        wblk_hash_cold(&b->h, data, (size_t)((uint64_t)(r1 - r0) * b->row_bytes));
        b->next_row = r1;
        if (r1 == b->rows) {
            const uint64_t got = XXH3_64bits_digest(&b->h);
            b->next_row = 0;
            if (got != b->xxh3)
                return base_fail(s->err, sizeof s->err, STRATA_ECORRUPT,
                                 "%s: checksum mismatch in %s of %s bytes %llu..%llu (expected %016llx, got %016llx): the pack is "
                                 "corrupt or stale; run strata pack --verify", what, b->name, s->files[b->file].path,
                                 (unsigned long long)b->off, (unsigned long long)(b->off + b->nbytes), (unsigned long long)b->xxh3,
                                 (unsigned long long)got);
        }
    }
    x->held++;
    x->seq = ++s->sl_seq;
    *p = data;
    return 0;
}

void stream_rows_put(wsrc *w, const wt *t, int64_t r0, int64_t r1) {
    stream *s = (stream *)w;
    const int i = t ? slice_find(s, t->unit, t->role, r0, r1) : -1;
    if (i >= 0 && s->sl[i].held > 0 && --s->sl[i].held == 0) s->sl[i].state = SL_FREE; /* a matrix is read once a pass */
}
