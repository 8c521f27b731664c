/*
 * mm.c: matmul jobs, every weight product of the forward pass. A job is up to
 * MM_MAX_SEG independent products y = W x (each with its own weights,
 * activations and row count) whose output rows are split over the pool by cost;
 * a GLU segment also computes its up matrix's rows and applies SiTU to them in
 * place. Weights are in RAM, or streamed by the source in row slices
 * (mm_slices), the next slice read while this one computes.
 *
 * Math: y[t][r] = K.matmul's dot of W row r and x row t (kern.h's summation
 * contract), the same dot whichever thread, slice or job computes the row, so
 * no split ever changes a bit. SiTU(g, u) is K.situ in double.
 */
#include <string.h>
#include <math.h>
#include "engine_int.h"
#include "kern.h"
#include "pool.h"
#include "st.h"
#include "wblk.h"

#define MM_SITU_MACS 1000  /* SiTU of one element, in multiply-add equivalents (load balance only) */
#define MM_MIN_MACS 32768  /* below this a matmul range is not worth a thread hand-off */

/* The job types and why jobs: engine_int.h. */
void mm_init(mm_job *j, int64_t T) {
    j->n = 0; j->T = T; j->gs = NULL; j->gs_cost = 0; j->ck = NULL; j->n_ck = 0; j->bad = 0; j->what[0] = 0;
}

/* Is W a matrix view mm can multiply: float, or FP8 / INT4 with its scales
 * (INT4 in whole 32-groups; INT4 views are experts, never sliced)? */
static int mm_view_ok(const wt *W) {
    if (W->fmt == WF_FP8) return W->dtype == DT_F8_E4M3 && W->s;
    if (W->fmt == WF_INT4) return W->dtype == DT_I32 && W->s && W->p && W->cols % I4_GROUP == 0;
    return W->fmt == WF_PLAIN && (W->dtype == DT_F32 || W->dtype == DT_BF16 || W->dtype == DT_F16);
}

/* Adds y = W x with W expected (rows, cols): float, FP8 or INT4 (wt.fmt).
 * Returns the segment (its T may be changed before mm_run) or NULL on a shape
 * error. */
mm_seg *mm_add(mm_job *j, const wt *W, int64_t rows, int64_t cols, const float *X, int64_t ldx,
               float *Y, int64_t ldy, const char *name) {
    if (j->bad) return NULL;
    if ((!W->p && !W->sliced) || W->rows != rows || W->cols != cols || !mm_view_ok(W)) {
        j->bad = 1;
        snprintf(j->what, sizeof j->what, "%s: expected (%lld, %lld) float, FP8 or INT4, got %s%s (%lld, %lld)",
                 name, (long long)rows, (long long)cols, W->p || W->sliced ? st_dtype_name(W->dtype) : "nothing",
                 W->fmt != WF_PLAIN && !W->s ? " without its scales" : "", (long long)W->rows, (long long)W->cols);
        return NULL;
    }
    ST_ASSERT(j->n < MM_MAX_SEG);
    mm_seg *g = &j->seg[j->n++];
    *g = (mm_seg){W->p, NULL, NULL, NULL, W->dtype, 0, rows, cols, j->T, X, ldx, Y, NULL, ldy, W->p ? NULL : W, NULL, W->vb, NULL,
                  W->fmt, WF_PLAIN, W->s, NULL, 0};
    return g;
}

mm_seg *mm_add_mxfp4(mm_job *j, const wt *Wp, const wt *Ws, int64_t rows, int64_t cols,
                     const float *X, int64_t ldx, float *Y, int64_t ldy, const char *name) {
    if (j->bad) return NULL;
    if (!Wp->p || !Ws->p || Wp->rows != rows || Wp->cols != cols || cols % MXFP4_GROUP ||
        Ws->rows != rows || Ws->cols != cols / MXFP4_GROUP) {
        j->bad = 1;
        snprintf(j->what, sizeof j->what, "%s: expected MXFP4 (%lld, %lld), got (%lld, %lld)", name,
                 (long long)rows, (long long)cols, (long long)Wp->rows, (long long)Wp->cols);
        return NULL;
    }
    ST_ASSERT(j->n < MM_MAX_SEG);
    mm_seg *g = &j->seg[j->n++];
    *g = (mm_seg){Wp->p, Ws->p, NULL, NULL, -1, -1, rows, cols, j->T, X, ldx, Y, NULL, ldy, NULL, NULL, NULL, NULL,
                  WF_PLAIN, WF_PLAIN, NULL, NULL, 0};
    return g;
}

/* Makes g a GLU segment: Wu (Wus: MXFP4 scales, else NULL) must have g's shape,
 * MXFP4 iff g is (float dtypes and FP8 / INT4 formats may differ); U (Y's layout)
 * receives the up rows. */
void mm_glu(mm_job *j, mm_seg *g, const wt *Wu, const wt *Wus, float *U, const char *name) {
    if (j->bad || !g) return;
    int ok = (Wu->p || Wu->sliced) && Wu->rows == g->rows && Wu->cols == g->cols;
    if (g->scales) ok = ok && Wu->p; /* experts are never sliced */
    if (g->scales) ok = ok && Wus && Wus->p && Wus->rows == g->rows && Wus->cols == g->cols / MXFP4_GROUP;
    else ok = ok && mm_view_ok(Wu);
    if (!ok) {
        j->bad = 1;
        snprintf(j->what, sizeof j->what, "%s: expected the shape and format of its gate (%lld, %lld), got (%lld, %lld)",
                 name, (long long)g->rows, (long long)g->cols, (long long)Wu->rows, (long long)Wu->cols);
        return;
    }
    g->wu = Wu->p;
    g->dwu = Wu->p ? NULL : Wu;
    g->vu = Wu->vb;
    g->su = g->scales ? Wus->p : NULL;
    g->udtype = g->scales ? -1 : Wu->dtype;
    g->ufmt = g->scales ? WF_PLAIN : Wu->fmt;
    g->qsu = g->scales ? NULL : Wu->s;
    g->U = U;
}

/* Rows [r0, r1) of one matrix of s (w with MXFP4 scales sc, or of format fmt
 * with scales qs). The FP8 and INT4 kernels take absolute rows (the FP8 scale
 * grid is indexed by them): a slice's rows are shifted by s->rb, and its w and Y
 * back by as many rows, so the kernels address the same bytes. */
static void mm_kern(const mm_seg *s, const void *w, const uint8_t *sc, int dtype, int fmt, const void *qs, float *Y,
                    int64_t r0, int64_t r1) {
    if (sc) {
        K.matmul_mxfp4(Y, s->ldy, w, sc, s->cols, s->X, s->ldx, s->T, r0, r1);
    } else if (fmt == WF_FP8) {
        const uint8_t *wb = (const uint8_t *)w - s->rb * s->cols;
        K.matmul_fp8(Y - s->rb, s->ldy, wb, qs, s->cols, s->X, s->ldx, s->T, s->rb + r0, s->rb + r1);
    } else if (fmt == WF_INT4) {
        const int32_t *wb = (const int32_t *)w - s->rb * (s->cols / 8);
        const uint16_t *sb = (const uint16_t *)qs;
        K.matmul_int4(Y - s->rb, s->ldy, wb, sb, s->cols, s->X, s->ldx, s->T, s->rb + r0, s->rb + r1);
    } else {
        K.matmul(Y, s->ldy, w, dtype, s->cols, s->X, s->ldx, s->T, r0, r1);
    }
}

/* First row of a segment whose cost start lies at or after offset x (x may be
 * negative: the segment starts inside the range). */
static int64_t mm_row_at(int64_t x, int64_t cpr, int64_t rows) {
    if (x <= 0) return 0;
    int64_t r = (x + cpr - 1) / cpr;
    return r < rows ? r : rows;
}

/* Rows [a, b) of segment s. */
static void mm_rows(const mm_job *j, const mm_seg *s, int64_t a, int64_t b) {
    mm_kern(s, s->w, s->scales, s->dtype, s->fmt, s->qs, s->Y, a, b);
    if (!s->U) return;
    mm_kern(s, s->wu, s->su, s->udtype, s->ufmt, s->qsu, s->U, a, b);
    if (j->silu) { /* SiLU(g) u in double, one f32 rounding (cfg act_silu) */
        for (int64_t t = 0; t < s->T; t++) {
            float *g = s->Y + t * s->ldy + a;
            const float *u = s->U + t * s->ldy + a;
            for (int64_t i = 0; i < b - a; i++) g[i] = (float)((double)g[i] / (1.0 + exp(-(double)g[i])) * (double)u[i]);
        }
        return;
    }
    for (int64_t t = 0; t < s->T; t++) K.situ(s->Y + t * s->ldy + a, s->U + t * s->ldy + a, b - a, j->b1, j->b2);
}

/* Rows whose cost start lies in [i0, i1), segment by segment. A segment whose
 * weights are checked as they are used (vw, vu: wblk.h) is cut at its blocks'
 * first rows, so each block is one thread's; with few activation rows (weights
 * read once, memory-bound) each block is hashed right after its product, from
 * this core's L2 (72.8 GB/s of hashing there, against 12-15 GB/s for the reader
 * thread hashing what DMA had just landed): ladder at 1 GB, decode vs
 * --no-verify, 6 interleaved pairs, x1.02-1.07, median x1.04 (was x1.09-1.16). */
#define MM_VERIFY_EACH_T 4 /* activation rows up to which each block is hashed right after its product */
static void mm_fn(void *ctx, int64_t i0, int64_t i1, int tid) {
    (void)tid;
    const mm_job *j = ctx;
    if (j->gs && i0 == 0) guess_run(j->gs);
    for (int q = 0; q < j->n_ck; q++) { /* a check whose cost start lies in [i0, i1) */
        const int64_t at = j->gs_cost + (int64_t)q * j->ck_cost;
        if (at >= i0 && at < i1) j->ck->ops->check_run(j->ck, q);
    }
    for (int k = 0; k < j->n && j->c0[k] < i1; k++) {
        const mm_seg *s = &j->seg[k];
        int64_t a = mm_row_at(i0 - j->c0[k], j->cpr[k], s->rows), b = mm_row_at(i1 - j->c0[k], j->cpr[k], s->rows);
        const wblk *v = s->vw ? s->vw : s->vu;
        if (v) { a = wblk_align(v, a); b = wblk_align(v, b); }
        if (a >= b) continue;
        if (!v) { mm_rows(j, s, a, b); continue; }
        const int64_t step = s->T <= MM_VERIFY_EACH_T ? v->R : b - a;
        for (int64_t r = a; r < b; r += step) {
            const int64_t r1 = r + step < b ? r + step : b;
            mm_rows(j, s, r, r1);
            if (s->vw) wblk_rows(s->vw, r, r1);
            if (s->vu) wblk_rows(s->vu, r, r1);
        }
    }
}

static void mm_dispatch(engine *e, mm_job *j) {
    int64_t total = j->gs_cost + (int64_t)j->n_ck * j->ck_cost;
    for (int k = 0; k < j->n; k++) {
        const mm_seg *s = &j->seg[k];
        /* cost of a row in multiply-adds; SiTU in double is about 1000 of them */
        j->c0[k] = total;
        j->cpr[k] = s->T * (s->U ? 2 * s->cols + MM_SITU_MACS : s->cols);
        total += s->rows * j->cpr[k];
    }
    if (total == 0) return;
    j->b1 = (float)e->c->situ_b1;
    j->b2 = (float)e->c->situ_b2;
    j->silu = e->c->act_silu;
    pool_for(e->pool, total, MM_MIN_MACS, mm_fn, j);
}

/* ======================================================================= */
/* Matmul jobs with weights streamed in row slices                          */
/* ======================================================================= */

/* Rows per slice of segment s: what both its sliced matrices allow. */
static int64_t mm_step(engine *e, const mm_seg *s) {
    wsrc *w = e->w;
    if (!w->ops->rows_slice) return 0;
    const int64_t a = s->dw ? w->ops->rows_slice(w, s->dw) : INT64_MAX, b = s->dwu ? w->ops->rows_slice(w, s->dwu) : INT64_MAX;
    return a < b ? a : b;
}

/* Starts the read of the slice of s from row r0. */
static void mm_hint(engine *e, const mm_seg *s, int64_t r0) {
    wsrc *w = e->w;
    if (!(s->dw || s->dwu) || !w->ops->rows_hint || r0 >= s->rows) return;
    const int64_t step = mm_step(e, s), r1 = r0 + step < s->rows ? r0 + step : s->rows;
    if (step < 1) return;
    if (s->dw) w->ops->rows_hint(w, s->dw, r0, r1);
    if (s->dwu) w->ops->rows_hint(w, s->dwu, r0, r1);
}

/* Segment s, whose weights the source streams in row slices: slice by slice,
 * the next slice's read started before this one is computed (next: the
 * segment after s, whose first slice follows the last). Every output row is
 * still one kernel dot over the whole row, so the slicing never changes a bit.
 * A failed read leaves the engine's sticky error (e->wrc): the pass stops at
 * the end of the layer. */
static void mm_slices(engine *e, const mm_seg *s, const mm_seg *next) {
    wsrc *w = e->w;
    const int64_t step = mm_step(e, s);
    if (step < 1 || !w->ops->rows_get || !w->ops->rows_put) {
        if (!e->wrc) e->wrc = efail(e, STRATA_EINVAL, "infer: a sliced weight and a source without rows_get");
        return;
    }
    mm_hint(e, s, 0);
    for (int64_t r0 = 0; r0 < s->rows && !e->wrc; r0 += step) {
        const int64_t r1 = r0 + step < s->rows ? r0 + step : s->rows;
        const void *pw = s->w ? (const uint8_t *)s->w + (size_t)(r0 * s->cols) * st_dtype_size(s->dtype) : NULL;
        const void *pu = s->wu ? (const uint8_t *)s->wu + (size_t)(r0 * s->cols) * st_dtype_size(s->udtype) : NULL;
        int rc = s->dw ? w->ops->rows_get(w, s->dw, r0, r1, &pw) : 0;
        if (!rc && s->dwu && (rc = w->ops->rows_get(w, s->dwu, r0, r1, &pu)) && s->dw) w->ops->rows_put(w, s->dw, r0, r1);
        if (rc) { e->wrc = wfail(e, rc, "rows_get"); return; }
        if (r1 < s->rows) mm_hint(e, s, r1); /* into the buffers not held: read while this one computes */
        else if (next) mm_hint(e, next, 0);
        mm_job one;
        mm_init(&one, s->T);
        one.seg[0] = *s;
        one.seg[0].w = pw;
        one.seg[0].wu = pu;
        one.seg[0].rows = r1 - r0;
        one.seg[0].Y = s->Y + r0;
        one.seg[0].U = s->U ? s->U + r0 : NULL;
        one.seg[0].rb = s->rb + r0;
        one.seg[0].vw = one.seg[0].vu = NULL; /* a sliced matrix is checked by the source as its slices come */
        one.n = 1;
        mm_dispatch(e, &one);
        if (s->dw) w->ops->rows_put(w, s->dw, r0, r1);
        if (s->dwu) w->ops->rows_put(w, s->dwu, r0, r1);
    }
}

/* Runs a job: the segments whose weights are in RAM in one dispatch, then each
 * segment streamed in row slices (mm_slices). */
void mm_run(engine *e, mm_job *j) {
    int nd = 0;
    for (int k = 0; k < j->n; k++) nd += j->seg[k].dw || j->seg[k].dwu;
    if (!nd) { mm_dispatch(e, j); return; }
    mm_job r;
    mm_init(&r, j->T);
    r.ck = j->ck; /* the checks (and a guess) run with the products that are not sliced */
    r.n_ck = j->n_ck;
    r.ck_cost = j->ck_cost;
    r.gs = j->gs;
    r.gs_cost = j->gs_cost;
    int d[MM_MAX_SEG], n = 0;
    for (int k = 0; k < j->n; k++) {
        if (j->seg[k].dw || j->seg[k].dwu) d[n++] = k;
        else r.seg[r.n++] = j->seg[k];
    }
    if (n) mm_hint(e, &j->seg[d[0]], 0); /* read while the rest computes */
    if (r.n || r.n_ck || r.gs) mm_dispatch(e, &r);
    for (int i = 0; i < n && !e->wrc; i++) mm_slices(e, &j->seg[d[i]], i + 1 < n ? &j->seg[d[i + 1]] : NULL);
}
