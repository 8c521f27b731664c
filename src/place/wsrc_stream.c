/*
 * wsrc_stream.c: the streaming weight source (place_open in place.h).
 *
 * Owns: the trunk units (layers 0..n-1 and the head), pinned in their own buffers
 * or streamed through one arena; the expert cache (cache.h) and its reads; the
 * embedding table (resident or read by row). Does not interpret weights: views are
 * built from the schema exactly as wsrc_resident builds them, over the same bytes.
 *
 * Records: a unit or an expert is a list of segments, each one aligned read of a
 * file range into the buffer at an aligned offset; tensors are views into them. From
 * a pack a unit is one segment (its padded run in trunk.bin); in place, the
 * tensors are sorted by (shard, offset) and neighbours less than 64 KB apart share
 * a segment, so a contiguous layer is one read there too.
 *
 * Threads: the caller (forward thread) and one reader thread that loads trunk
 * units ahead of use, each with its own io ring. One mutex guards unit states and
 * the arena. Invariants (the seed engine's two worst bugs): a unit whose read is in
 * flight is never handed out (layer_get waits for READY); a held unit is never
 * dropped or overwritten (arena space is only reused after layer_put, and the
 * prefetch that makes room only drops units with held == 0, after their read).
 * Experts are read on the caller's ring: all misses of a layer are submitted at
 * once (many in flight), expert_wait consumes completions as they land.
 *
 * Reads ahead (issue 17): experts_prefetch starts predicted experts' reads into
 * free slots, each holding its own lease until it lands (a request that finds
 * every slot taken reaps them first; a failed guess fails silently and is read
 * again on request). The warm start (preload) fills the pinned units and the
 * cache at open through the same path. Row slices (plan.sliced): a streamed
 * unit's large matrices are not in its record; rows_get reads them a slice at a
 * time into a few buffers on a third ring of the caller's, checking each
 * matrix's own checksum as its slices are consumed in row order.
 */
#define XXH_STATIC_LINKING_ONLY
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>
#if defined(__x86_64__) && defined(__linux__)
/* The library's runtime-dispatched XXH3 (AVX2 / AVX-512 where the CPU has them;
 * the inline default is SSE2): checksumming every streamed byte sits beside the
 * compute threads on a small machine. Same hash values. */
#include <xxh_x86dispatch.h>
#endif
#include "arch.h"
#include "cache.h"
#include "io.h"
#include "num.h"
#include "pack.h"
#include "place.h"
#include "pool.h"
#include "wblk.h"

#define SEG_GAP (64u << 10)   /* coalesce tensors closer than this into one read */
#define MAX_XT 8              /* tensors of one expert */
#define EMB_BATCH 64          /* embedding rows in flight */
#define PF_AHEAD 256          /* fresh expert slots kept faulted in ahead of use */
#define CK_MAX 64              /* landed experts one st_checks_begin takes */
#define PF_QUIET_MAX 7        /* guesses that read nothing, in a row, counted per layer (skip up to 2^6 - 1) */
/* Checksums are on unless the caller opted out (place.h: verify_reads) */
#define VERIFY(s) ((s)->pk && (s)->plan.verify_reads != PLACE_VERIFY_OFF)

enum { U_IDLE = 0, U_QUEUED, U_LOADING, U_READY, U_ERROR };

typedef struct seg {
    int32_t file;
    uint64_t off, len, need;   /* aligned file range; bytes that must exist */
    uint64_t buf_off;          /* where it lands in the record's buffer */
} seg;

typedef struct tref {
    int16_t role;
    int32_t seg;
    uint64_t rel;              /* offset of the tensor's bytes in the buffer */
    wt view;                   /* p relative to the buffer start until bound */
} tref;

/* A matrix of a sliced unit, read in row slices (rows_get). Its checksum runs
 * over the slices as they are consumed, in row order. */
typedef struct bigt {
    int16_t role;
    int32_t file;
    uint64_t off, nbytes, row_bytes; /* the tensor's bytes in the file */
    int64_t rows;
    wt view;                   /* sliced = 1, p = NULL */
    uint64_t xxh3;
    int has_sum;
    int64_t next_row;          /* rows hashed so far (the running hash below) */
    XXH3_state_t h;
    const char *name;
} bigt;

/* Checksums of a sliced unit's whole tensors (each its own, from the pack). */
typedef struct tsum { uint64_t rel, nbytes, xxh3, foff; const char *name; } tsum; /* foff: its first byte in trunk.bin */

/* A row slice buffer (rows_get / rows_hint), used by the forward thread only. */
enum { SL_FREE = 0, SL_LOADING, SL_READY };
typedef struct slice {
    int state, held, rc;
    int64_t unit, r0, r1;
    int role;
    uint64_t data_off;         /* row r0's first byte in buf */
    uint64_t seq;              /* last use: a free buffer is the oldest unheld one */
    uint8_t *buf;
    io_req q;
} slice;

typedef struct unit {
    int32_t n_seg, n_t;
    seg *segs;
    tref *t;
    uint64_t buf_bytes, data_bytes;
    uint64_t xxh3;
    int has_sum;
    int pinned;
    uint8_t *buf;              /* pinned buffer, or arena position while placed */
    int state, held;
    int in_arena;
    uint64_t a_off;            /* arena offset while placed */
    int64_t a_seq;             /* allocation order in the arena */
    int qnext;                 /* reader queue link (-1 none) */
    char err[400];
    wt roles[R_COUNT];
    /* row slices (plan.sliced and not pinned): the matrices read by rows, and the
     * checksums of the tensors in buf (verified after each read) */
    int n_big, n_sum;
    bigt *big;
    tsum *sum;
    /* a streamed unit from a pack with block checksums: its matrices are checked
     * block by block by the threads that use them (wblk.h), its other tensors
     * against their own checksums (sum) after each read */
    int n_wb;
    wblk *wb;
    int16_t *wb_t;             /* each one's index in t */
    /* a pinned MoE unit's router as MXFP4 for the early guesses (place_plan.guess_u):
     * made once the unit is read and checked (guess_build), lent by predict_layer */
    uint8_t *gq;
    wt gqw[2];                 /* codes, scales */
    int gq_ok;
} unit;

typedef struct xslot {         /* per cache slot: the expert being read into it */
    int n_seg, n_t, pending, rc;
    seg segs[MAX_XT];
    tref t[MAX_XT];
    io_req reqs[MAX_XT];
    uint64_t xxh3_want;
    int has_sum;
    int n_h;                   /* the checksum's ranges in the buffer, in schema order */
    uint64_t h_rel[MAX_XT], h_len[MAX_XT];
    int64_t L, E;
    wt roles[R_COUNT];
    uint8_t pf_lease;          /* the read was started by experts_prefetch, which holds a
                                  lease until it lands */
    uint8_t pf_fresh;          /* read ahead and not requested since */
    uint64_t got;              /* expert_check: the XXH3 of what landed */
    size_t nan_bad;            /* expert_check: MXFP4 scale bytes that are NaN */
} xslot;

typedef struct stream {
    wsrc base;
    const cfg *c;
    const st_index *ix;
    place_plan plan;
    pack *pk;
    int n_files;
    io_file *files;            /* shards, then trunk.bin (if packed) */
    int64_t n_units;
    unit *u;
    /* arena */
    uint8_t *arena;
    uint64_t arena_bytes;
    int64_t a_seq;
    /* reader */
    pthread_t th;
    int th_started, stop;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int q_head, q_tail;
    io_ring *rring, *xring;
    int head_follows;          /* 1 if the last pass used the head after the last layer */
    int64_t last_get;
    /* experts */
    cache *xc;
    xslot *xs;
    int64_t n_moe, NE;
    int experts_bf16;
    int64_t req_L;             /* layer of the open request (-1 none) */
    /* slot prefaulter (prefault_main): fresh slots leave the free list from the
     * top index down; the thread keeps PF_AHEAD of them below the lowest used
     * faulted in. pf_want (slots from the top) is guarded by pf_mu. */
    pthread_t pf_th;
    int pf_started, pf_stop;
    pthread_mutex_t pf_mu;
    pthread_cond_t pf_cv;
    int64_t pf_want, pf_asked, x_low;
    int32_t *req_slot;         /* expert id -> slot for req_L, -1 */
    int32_t *req_list;         /* ids requested, in order */
    int n_req;
    /* reads a layer ahead: the layer predicted last (-1 none) and its predicted
     * ids (pf_mark[id] = 1), prefetch leases outstanding */
    int64_t pf_L;
    uint8_t *pf_mark;
    int64_t n_pf;
    /* guesses that pay (st_experts_prefetch): per layer, the guesses in a row
     * that read nothing (everything guessed was in RAM or in flight) and how many
     * of the next ones to skip; a read the layer had to wait for resets both */
    uint8_t pf_quiet[CFG_MAX_LAYERS], pf_skip[CFG_MAX_LAYERS];
    /* landed experts whose checks the engine runs inside its next pool job
     * (st_checks_begin .. st_checks_end); ck_ran[i]: check i has run */
    int ck_sl[CK_MAX], n_ck;
    uint8_t ck_ran[CK_MAX];
    struct pool *pool;         /* the pass's engine threads (use_pool), or NULL */
    uint64_t xslot_bytes;
    /* embeddings */
    int32_t emb_file;
    uint64_t emb_off, emb_row;
    int emb_dtype;
    uint8_t *emb;              /* resident table or NULL */
    uint8_t *emb_bounce;       /* EMB_BATCH row buffers */
    uint64_t emb_slot;
    FILE *trace;               /* expert request trace, or NULL */
    /* row slices: buffers and their ring (the forward thread's) */
    slice *sl;
    int n_sl;
    uint64_t sl_seq;
    io_ring *sring;
    /* stats (under mu) */
    place_stats st;
    _Atomic uint64_t verify_ns, verify_bytes; /* hashing, from any thread */
    int draft;                 /* a self-draft pass: nothing is read (draft_mode) */
    cache_stats draft_saved;   /* the cache's statistics before it */
    int io_active;
    double io_t0;
    char err[1024];
} stream;

static const wsrc_ops k_stream_ops;

/* ============================================================ small helpers */

/* The roles whose matrices may be read by row slices (plan.slice_min_bytes). Here
 * rather than in plan.c so that the planner depends on the source and not back. */
int place_sliceable_role(int r) {
    switch (r) {
    case R_KDA_Q: case R_KDA_K: case R_KDA_V: case R_KDA_G: case R_KDA_O: case R_KDA_FA: case R_KDA_FB: case R_KDA_B:
    case R_KDA_GA: case R_KDA_GB:
    case R_MLA_QA: case R_MLA_QB: case R_MLA_KVA: case R_MLA_O: case R_MLA_G:
    case R_DENSE_GATE: case R_DENSE_UP: case R_DENSE_DOWN:
    case R_MOE_ROUTER: case R_MOE_LAT_DOWN: case R_MOE_LAT_UP: case R_MOE_SH_GATE: case R_MOE_SH_UP: case R_MOE_SH_DOWN:
    case R_LM_HEAD:
        return 1;
    default:
        return 0;
    }
}

/* The expert cache's bookkeeping beside its slot bytes (the planner counts it). */
uint64_t place_cache_meta_bytes(int64_t n_keys, int64_t n_layers, int64_t n_experts, int64_t n_slots) {
    if (n_keys <= 0 || n_slots < 0) return 0;
    /* xs per slot; req_slot, req_list and pf_mark per expert of a layer (place_open) */
    return cache_meta_bytes(n_keys, n_slots, n_layers) + (uint64_t)n_slots * sizeof(xslot) +
           (uint64_t)n_experts * (2 * sizeof(int32_t) + 1);
}

/* Wall time with at least one read in flight, over both threads (under mu). */
static void io_enter(stream *s) {
    if (s->io_active++ == 0) s->io_t0 = base_now();
}
static void io_leave(stream *s) {
    if (--s->io_active == 0) s->st.read_s += base_now() - s->io_t0;
}
/* The caller's thread: same, taking mu; bytes/reads/wait accounted with it. */
static void io_enter_l(stream *s) {
    pthread_mutex_lock(&s->mu);
    io_enter(s);
    pthread_mutex_unlock(&s->mu);
}
static void io_leave_l(stream *s, uint64_t *counter, uint64_t bytes, uint64_t reads, double waited) {
    pthread_mutex_lock(&s->mu);
    if (reads) io_leave(s);
    if (counter) *counter += bytes;
    s->st.n_reads += reads;
    s->st.wait_s += waited;
    pthread_mutex_unlock(&s->mu);
}

static wt view_of(const tspec *t, int dtype) {
    wt v = {.dtype = dtype, .rows = t->shape[0], .cols = t->ndim > 1 ? t->shape[1] : t->shape[0]};
    if (t->kind == TK_VECTOR) { v.rows = 1; v.cols = t->numel; }
    if (t->kind == TK_CONV) { v.rows = t->shape[0]; v.cols = t->shape[1] * t->shape[2]; }
    if (t->kind == TK_PACKED) v.cols = t->shape[1] * 2;
    return v;
}

/* ====================================================== building records */

typedef struct pend { const st_tensor *s; int role, kind; wt view; } pend;
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
    g->p[g->n++] = (pend){s, t->role, t->kind, view_of(t, s->dtype)};
    return 0;
}

static int pend_cmp(const void *a, const void *b) {
    const pend *x = a, *y = b;
    if (x->s->shard != y->s->shard) return x->s->shard < y->s->shard ? -1 : 1;
    return x->s->off < y->s->off ? -1 : x->s->off > y->s->off;
}

/* Lays out tensors read in place: segments of near neighbours, aligned. Writes at
 * most max_seg segments / n tensors; returns the buffer bytes or 0 on overflow. */
static uint64_t layout_inplace(pend *p, int n, seg *segs, int max_seg, int *n_seg, tref *t) {
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
        if (p->kind == TK_MATRIX && place_sliceable_role(p->role) && t->nbytes > s->plan.slice_min_bytes && p->view.rows > 1 &&
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
        x->buf_bytes = layout_inplace(small, ns, x->segs, ns ? ns : 1, &x->n_seg, x->t);
        for (int i = 0; i < ns && r; i++) { /* layout_inplace sorted them: each one's checksum by role */
            const pack_tensor *q = pt[x->t[i].role];
            if (q->has_xxh3) x->sum[x->n_sum++] = (tsum){x->t[i].rel, q->nbytes, q->xxh3, r->off + q->off, q->name};
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
    int nb = 0;
    const pack_tensor *pt[R_COUNT] = {0};
    for (int i = 0; i < x->n_t; i++) {
        for (int j = 0; j < r->n_tensors; j++)
            if (r->t[j].off == x->t[i].rel && r->t[j].role == x->t[i].role) { pt[x->t[i].role] = &r->t[j]; break; }
        const pack_tensor *q = pt[x->t[i].role];
        if (!q || (!q->n_blk && !q->has_xxh3)) return 0;
        if (q->n_blk && (q->blk_rows < 1 || x->t[i].view.rows != q->shape[0] || q->nbytes % (uint64_t)q->shape[0])) return 0;
        nb += q->n_blk > 0;
    }
    if (!nb) return 0;
    x->wb = base_calloc((size_t)nb, sizeof *x->wb, MEM_INDEX);
    x->wb_t = base_calloc((size_t)nb, sizeof *x->wb_t, MEM_INDEX);
    x->sum = base_calloc((size_t)x->n_t + 1, sizeof *x->sum, MEM_INDEX);
    if (!x->wb || !x->wb_t || !x->sum) return base_fail(err, errlen, STRATA_ENOMEM, "stream: out of memory");
    for (int i = 0; i < x->n_t; i++) {
        const pack_tensor *q = pt[x->t[i].role];
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
        if (!b->done) return base_fail(err, errlen, STRATA_ENOMEM, "stream: out of memory");
        atomic_init(&b->bad, -1);
    }
    x->has_sum = 0;
    return 0;
}

/* Records of every trunk unit, from the pack or in place. */
static int build_units(stream *s, char *err, size_t errlen) {
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
        if (u < c->n_layers) { g.cls_mask = 0; schema_walk_layer(c, u, gather_fn, &g); }
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
                x->t[i] = (tref){.role = (int16_t)g.p[i].role, .seg = 0, .rel = r->t[k].off, .view = g.p[i].view};
            }
            x->buf_bytes = r->nbytes;
            x->xxh3 = r->xxh3;
            x->has_sum = 1;
            if (!rc && !s->plan.pinned[u] && VERIFY(s)) rc = build_blocks(s, x, r, err, errlen);
        } else {
            x->buf_bytes = layout_inplace(g.p, g.n, x->segs, g.n, &x->n_seg, x->t);
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
static uint64_t hash_cold(const uint8_t *p, uint64_t n) {
    XXH3_state_t h;
    XXH3_64bits_reset(&h);
    wblk_hash_cold(&h, p, (size_t)n);
    return XXH3_64bits_digest(&h);
}

/* Counts bytes hashed against the pack and the time it took (any thread: the
 * I/O thread hashes trunk pieces, the engine thread whole experts). */
static void verify_count(stream *s, uint64_t bytes, double secs) {
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
                verify_count(s, n, base_now() - t0);
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
        uint64_t got = hash_cold(buf + segs[0].buf_off, segs[0].need);
        verify_count(s, segs[0].need, base_now() - t0);
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
        x->roles[x->t[i].role] = v;
    }
    for (int k = 0; k < x->n_wb; k++) { /* read again: every block unchecked */
        const tref *t = &x->t[x->wb_t[k]];
        wblk_reset(&x->wb[k], x->buf + t->rel);
        x->roles[t->role].vb = &x->wb[k];
    }
    for (int i = 0; i < x->n_big; i++) x->roles[x->big[i].role] = x->big[i].view;
}

/* A sliced unit's whole tensors against their own checksums (read_record checks a
 * whole unit's; a sliced one is not read whole). */
static int check_sums(stream *s, unit *x, const char *what, char *err, size_t errlen) {
    for (int i = 0; i < x->n_sum; i++) {
        const tsum *t = &x->sum[i];
        const uint64_t got = hash_cold(x->buf + t->rel, t->nbytes);
        if (got != t->xxh3)
            return base_fail(err, errlen, STRATA_ECORRUPT,
                             "%s: checksum mismatch in %s, %s bytes %llu..%llu (expected %016llx, got %016llx): the pack is "
                             "corrupt or stale; run strata pack --verify", what, t->name, s->files[s->n_files - 1].path,
                             (unsigned long long)t->foff, (unsigned long long)(t->foff + t->nbytes), (unsigned long long)t->xxh3,
                             (unsigned long long)got);
    }
    return 0;
}

static void unit_name(const stream *s, int64_t u, char *b, size_t n) {
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
static void load_unit_locked(stream *s, int64_t u, io_ring *r) {
    unit *x = &s->u[u];
    uint8_t *buf = x->buf;
    io_enter(s);
    pthread_mutex_unlock(&s->mu);
    char what[64];
    unit_name(s, u, what, sizeof what);
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

static void *reader_main(void *arg) {
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
        load_unit_locked(s, u, s->rring);
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

static int st_layer_get(wsrc *w, int64_t L, const wt **roles) {
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
        else { x->state = U_LOADING; load_unit_locked(s, L, s->rring); }
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

static void st_layer_put(wsrc *w, int64_t L) {
    stream *s = (stream *)w;
    if (L < 0 || L >= s->n_units) return;
    pthread_mutex_lock(&s->mu);
    unit *x = &s->u[L];
    ST_ASSERT(x->held > 0);
    if (--x->held == 0 && !x->pinned) arena_free_locked(s, L);
    schedule_locked(s, L + 1);
    pthread_mutex_unlock(&s->mu);
}

static void st_hint_layer(wsrc *w, int64_t L) {
    stream *s = (stream *)w;
    if (L < 0) return;
    pthread_mutex_lock(&s->mu);
    schedule_locked(s, L > s->c->n_layers ? 0 : L);
    pthread_mutex_unlock(&s->mu);
}

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
    io_enter_l(s);
    io_submit(s->sring, &x->q);
}

/* One slice read landed (or failed: the buffer is free again, its rc kept). */
static void slice_landed(stream *s, io_req *d) {
    slice *x = &s->sl[(int)(intptr_t)d->ud];
    x->rc = d->rc;
    x->state = d->rc ? SL_FREE : SL_READY;
    x->seq = ++s->sl_seq;
    io_leave_l(s, x->unit < s->c->n_layers ? &s->st.bytes_trunk : &s->st.bytes_head, d->got, 1, 0);
}

/* Collects slice reads until buffer i has landed (or failed). */
static void slice_wait(stream *s, int i) {
    io_req *d;
    while (s->sl[i].state == SL_LOADING && io_reap(s->sring, 1, &d) == 1) slice_landed(s, d);
}

static int64_t st_rows_slice(wsrc *w, const wt *t) {
    stream *s = (stream *)w;
    const bigt *b = big_of(s, t);
    if (!b) return 0;
    const int64_t n = (int64_t)(s->plan.slice_bytes / b->row_bytes);
    return n > 0 ? n : 1;
}

static void st_rows_hint(wsrc *w, const wt *t, int64_t r0, int64_t r1) {
    stream *s = (stream *)w;
    const bigt *b = big_of(s, t);
    if (!b || r0 < 0 || r1 > b->rows || r0 >= r1 || slice_find(s, t->unit, t->role, r0, r1) >= 0) return;
    const int i = slice_take(s, 0);
    if (i >= 0) slice_start(s, i, b, t->unit, r0, r1);
}

static int st_rows_get(wsrc *w, const wt *t, int64_t r0, int64_t r1, const void **p) {
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
    io_leave_l(s, NULL, 0, 0, base_now() - t0);
    slice *x = &s->sl[i];
    char what[64];
    unit_name(s, t->unit, what, sizeof what);
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

static void st_rows_put(wsrc *w, const wt *t, int64_t r0, int64_t r1) {
    stream *s = (stream *)w;
    const int i = t ? slice_find(s, t->unit, t->role, r0, r1) : -1;
    if (i >= 0 && s->sl[i].held > 0 && --s->sl[i].held == 0) s->sl[i].state = SL_FREE; /* a matrix is read once a pass */
}

/* ============================================================== expert ops */

typedef struct xg { const st_index *ix; pend p[MAX_XT]; int n; int bad; } xg;
static int xg_fn(void *ud, const tspec *t) {
    xg *g = ud;
    const st_tensor *s = st_find(g->ix, t->name);
    if (!s || g->n == MAX_XT) { g->bad = 1; return 0; }
    g->p[g->n++] = (pend){s, t->role, t->kind, view_of(t, s->dtype)};
    return 0;
}

/* Fills slot sl's record for expert (L, E) and submits its reads. */
static int expert_submit(stream *s, int sl, int64_t L, int64_t E) {
    xslot *x = &s->xs[sl];
    xg g = {.ix = s->ix};
    schema_walk_expert(s->c, L, E, s->experts_bf16, xg_fn, &g);
    if (g.bad) return base_fail(s->err, sizeof s->err, STRATA_EFORMAT, "stream: layer %lld expert %lld: tensor missing", (long long)L, (long long)E);
    /* the checksum covers the tensors in schema order (pack.c hash_experts), also
     * when they are scattered: remember the order before layout_inplace sorts */
    const st_tensor *order[MAX_XT];
    for (int i = 0; i < g.n; i++) order[i] = g.p[i].s;
    x->has_sum = VERIFY(s);
    if (x->has_sum) x->xxh3_want = s->pk->expert_xxh3[(L - s->c->first_dense) * s->NE + E];
    uint64_t need = layout_inplace(g.p, g.n, x->segs, MAX_XT, &x->n_seg, x->t);
    x->n_h = 0;
    for (int k = 0; k < g.n && need; k++)
        for (int i = 0; i < g.n; i++)
            if (g.p[i].s == order[k]) { x->h_rel[x->n_h] = x->t[i].rel; x->h_len[x->n_h++] = order[k]->nbytes; break; }
    if (!need || need > s->xslot_bytes)
        return base_fail(s->err, sizeof s->err, STRATA_EFORMAT, "stream: layer %lld expert %lld needs %llu bytes, the slot holds %llu",
                         (long long)L, (long long)E, (unsigned long long)need, (unsigned long long)s->xslot_bytes);
    x->n_t = g.n;
    x->L = L;
    x->E = E;
    x->rc = 0;
    x->pf_lease = x->pf_fresh = 0;
    x->pending = x->n_seg;
    uint8_t *buf = cache_data(s->xc, sl);
    if (x->pending) io_enter_l(s);
    for (int i = 0; i < x->n_seg; i++) {
        const seg *q = &x->segs[i];
        x->reqs[i] = (io_req){.f = &s->files[q->file], .off = q->off, .len = q->len, .need = q->need, .dst = buf + q->buf_off,
                              .ud = (void *)(intptr_t)sl};
        io_submit(s->xring, &x->reqs[i]);
    }
    return 0;
}

/* Drops the lease a prefetch held while its read was in flight. */
static void prefetch_release(stream *s, int sl) {
    xslot *x = &s->xs[sl];
    if (!x->pf_lease) return;
    x->pf_lease = 0;
    s->n_pf--;
    cache_unpin(s->xc, sl);
}

/* One read of an expert landed: its slot when that was the expert's last
 * segment (expert_check and expert_finish are then owed), else -1. */
static int expert_arrive(stream *s, io_req *d) {
    int sl = (int)(intptr_t)d->ud;
    xslot *x = &s->xs[sl];
    if (d->rc && !x->rc) x->rc = d->rc;
    int last = --x->pending == 0;
    io_leave_l(s, &s->st.bytes_experts, d->got, 0, 0);
    if (!last) return -1;
    io_leave_l(s, NULL, 0, (uint64_t)x->n_seg, 0);
    return sl;
}

/* The checks of a landed expert that only read its slot: the pack's XXH3 and the
 * NaN scales. Any thread may run them (reap_experts), one slot per thread. */
static void expert_check(stream *s, int sl) {
    xslot *x = &s->xs[sl];
    const uint8_t *buf = cache_data(s->xc, sl);
    x->got = 0;
    x->nan_bad = 0;
    if (!x->rc && x->has_sum) {
        XXH3_state_t h;
        const double t0 = base_now();
        uint64_t nb = 0;
        XXH3_64bits_reset(&h);
        for (int k = 0; k < x->n_h; k++) { wblk_hash_cold(&h, buf + x->h_rel[k], x->h_len[k]); nb += x->h_len[k]; }
        x->got = XXH3_64bits_digest(&h);
        verify_count(s, nb, base_now() - t0);
        if (x->got != x->xxh3_want) x->rc = STRATA_ECORRUPT;
    }
    if (x->rc) return;
    /* an MXFP4 scale of 255 is NaN by the MX spec: a defective checkpoint is an
     * error, never silently computed with (the kernels would zero the group).
     * Scanned once per read: the scales are 1/17 of the expert's bytes. */
    for (int i = 0; i < x->n_t; i++) {
        const int r = x->t[i].role;
        if (r != R_EXP_W1S && r != R_EXP_W2S && r != R_EXP_W3S) continue;
        const wt *v = &x->t[i].view;
        x->nan_bad += num_mxfp4_count_nan_scales(buf + x->t[i].rel, (size_t)(v->rows * v->cols));
    }
}

/* The rest, on the thread that drives the stream: the error, or the views and
 * the slot published. A failed read that only a prefetch holds fails silently
 * (the slot is forgotten, so a request reads it again and reports what happens
 * then). */
static void expert_finish(stream *s, int sl) {
    xslot *x = &s->xs[sl];
    const int silent = x->pf_lease && cache_leases(s->xc, sl) == 1;
    uint8_t *buf = cache_data(s->xc, sl);
    if (x->rc) {
        if (silent) {
        } else if (x->rc == STRATA_ECORRUPT) {
            const seg *a = &x->segs[0], *b = &x->segs[x->n_seg - 1];
            base_fail(s->err, sizeof s->err, STRATA_ECORRUPT,
                      "layer %lld expert %lld: checksum mismatch in %s bytes %llu..%llu%s (expected %016llx, got %016llx): "
                      "the shard changed after packing or is corrupt; run strata pack --verify",
                      (long long)x->L, (long long)x->E, s->files[a->file].path, (unsigned long long)a->off,
                      (unsigned long long)(a->file == b->file ? b->off + b->need : a->off + a->need),
                      a->file == b->file ? "" : " and more", (unsigned long long)x->xxh3_want, (unsigned long long)x->got);
        } else {
            char e2[600];
            for (int i = 0; i < x->n_seg; i++) if (x->reqs[i].rc) { io_req_errstr(&x->reqs[i], e2, sizeof e2); break; }
            base_fail(s->err, sizeof s->err, STRATA_EIO, "layer %lld expert %lld unreadable: %s", (long long)x->L, (long long)x->E, e2);
        }
        cache_fail(s->xc, sl);
        prefetch_release(s, sl);
        return;
    }
    if (x->nan_bad) {
        if (!silent)
            base_fail(s->err, sizeof s->err, STRATA_EFORMAT,
                      "layer %lld expert %lld: %zu MXFP4 scale bytes are 255 (NaN in the MX spec): the checkpoint is "
                      "defective (strata inspect --scan lists every such tensor)", (long long)x->L, (long long)x->E, x->nan_bad);
        cache_fail(s->xc, sl);
        prefetch_release(s, sl);
        return;
    }
    memset(x->roles, 0, sizeof x->roles);
    for (int i = 0; i < x->n_t; i++) {
        wt v = x->t[i].view;
        v.p = buf + x->t[i].rel;
        x->roles[x->t[i].role] = v;
    }
    cache_publish(s->xc, sl);
    prefetch_release(s, sl);
}

/* One read landed: when it completes its expert, check and bind or fail it. */
static void expert_landed(stream *s, io_req *d) {
    const int sl = expert_arrive(s, d);
    if (sl < 0) return;
    expert_check(s, sl);
    expert_finish(s, sl);
}

typedef struct { stream *s; const int *sl; } check_job;
static void check_fn(void *ctx, int64_t i0, int64_t i1, int tid) {
    (void)tid;
    const check_job *j = ctx;
    for (int64_t i = i0; i < i1; i++) expert_check(j->s, j->sl[i]);
}

/* Reaps completions until slot sl's read has fully arrived (blocking when wait,
 * else only what has landed) and checks the experts they complete. The checks
 * (an XXH3 pass over each expert) ran one after another on the engine's
 * driving thread while the other threads idled: at 6.2 GB on ladder the driving
 * thread spent +10 ms per token outside the pool against 16 GB (81 MB of experts
 * landed per token). The experts that complete together are now checked at
 * once on the pass's pool (use_pool), one expert per thread. It stops at sl as
 * the one-at-a-time loops did: reaping further would end the leases of reads
 * ahead early, and at 4 GB the cache then evicted more of them before their
 * request (misses 270 -> 560 per 31 tokens). Returns the reads reaped. */
#define REAP_MAX 64
static void ck_flush(stream *s);
static int reap_experts(stream *s, int sl, int wait) {
    int done[REAP_MAX], nd = 0, n = 0;
    io_req *d;
    ck_flush(s);
    while (nd < REAP_MAX && s->xs[sl].pending > 0 && cache_state(s->xc, sl) == 1 /* INFLIGHT */ &&
           io_reap(s->xring, wait, &d) == 1) {
        n++;
        const int got = expert_arrive(s, d);
        if (got >= 0) done[nd++] = got;
    }
    if (nd > 1 && s->pool) {
        check_job j = {s, done};
        pool_for(s->pool, nd, 1, check_fn, &j);
    } else {
        for (int i = 0; i < nd; i++) expert_check(s, done[i]);
    }
    for (int i = 0; i < nd; i++) expert_finish(s, done[i]);
    return n;
}

/* Checks inside the engine's pool job. Landed experts were checked when the
 * driving thread reaped them, mostly one at a time (the run at 6.2 GB on ladder:
 * 1,541 reaps found one landed expert, 318 two), and the other threads waited
 * through each XXH3 pass (~130 us per 1.68 MB expert). Right after a layer's
 * request (the experts a late guess read ahead have landed by then, and the
 * reads just started have not) the engine takes what has landed
 * (st_checks_begin) and runs the checks as tasks of its next job, beside that
 * job's products (st_check_run, any thread, each once); st_checks_end then
 * finishes them on the driving thread (the error, or the views published).
 * Nothing is computed with an expert before its check: the batch that uses it
 * comes after. Every other entry point on the expert path finishes pending
 * checks first (ck_flush), so a caller that skips st_checks_end changes only
 * where the checks run. */
static int st_checks_begin(wsrc *w) {
    stream *s = (stream *)w;
    if (!s->xc) return 0;
    ck_flush(s);
    io_req *d;
    while (s->n_ck < CK_MAX && io_reap(s->xring, 0, &d) == 1) {
        const int sl = expert_arrive(s, d);
        if (sl >= 0) { s->ck_ran[s->n_ck] = 0; s->ck_sl[s->n_ck++] = sl; }
    }
    return s->n_ck;
}

static void st_check_run(wsrc *w, int i) {
    stream *s = (stream *)w;
    if (i < 0 || i >= s->n_ck || s->ck_ran[i]) return;
    expert_check(s, s->ck_sl[i]);
    s->ck_ran[i] = 1;
}

static void ck_flush(stream *s) {
    const int n = s->n_ck;
    s->n_ck = 0;
    for (int i = 0; i < n; i++) {
        if (!s->ck_ran[i]) expert_check(s, s->ck_sl[i]);
        expert_finish(s, s->ck_sl[i]);
    }
}

static void st_checks_end(wsrc *w) { ck_flush((stream *)w); }

/* Reaps completions until slot sl's read is no longer in flight. */
static void expert_settle(stream *s, int sl) {
    while (cache_state(s->xc, sl) == 1 /* INFLIGHT */ && reap_experts(s, sl, 1) > 0) {}
}

/* Releases the open request's leases once their reads have landed; reads a
 * prefetch started stay in flight (they hold their own leases). */
static void release_request(stream *s) {
    for (int i = 0; i < s->n_req; i++) expert_settle(s, s->req_slot[s->req_list[i]]);
    for (int i = 0; i < s->n_req; i++) {
        int32_t id = s->req_list[i];
        cache_unpin(s->xc, s->req_slot[id]);
        s->req_slot[id] = -1;
    }
    s->n_req = 0;
    s->req_L = -1;
}

/* The first read into a never-used cache slot faults in and zeroes its pages
 * (~2.5 s per GB in this VM: 4 ms per ladder expert), and the forward thread
 * waits for that read. This thread does it ahead of use instead, with
 * MADV_POPULATE_WRITE (no data written, so it may overlap a read into the slot).
 * Peak RSS grows at most PF_AHEAD slots ahead of use, inside the budgeted arena. */
static void *prefault_main(void *arg) {
    stream *s = arg;
    const int64_t n = cache_n_slots(s->xc);
    int64_t done = 0;
    pthread_mutex_lock(&s->pf_mu);
    for (;;) {
        while (!s->pf_stop && done >= s->pf_want) pthread_cond_wait(&s->pf_cv, &s->pf_mu);
        if (s->pf_stop) break;
        int64_t want = s->pf_want < n ? s->pf_want : n;
        pthread_mutex_unlock(&s->pf_mu);
        while (done < want) { /* 8 adjacent slots per call, top index down */
            int64_t k = want - done < 8 ? want - done : 8, lo = n - done - k;
            if (io_buffer_populate(cache_data(s->xc, (int)lo), (uint64_t)k * s->xslot_bytes)) { want = done = n; break; }
            done += k;
        }
        pthread_mutex_lock(&s->pf_mu);
        if (done >= n) break;
    }
    pthread_mutex_unlock(&s->pf_mu);
    return NULL;
}

/* A miss took slot sl: when it is a fresh one, move the prefaulter's target. */
static void prefault_note(stream *s, int sl) {
    if (!s->pf_started || sl >= s->x_low) return;
    s->x_low = sl;
    const int64_t want = cache_n_slots(s->xc) - sl + PF_AHEAD;
    if (want < s->pf_asked + PF_AHEAD / 4) return; /* wake it every PF_AHEAD / 4 slots */
    pthread_mutex_lock(&s->pf_mu);
    s->pf_want = s->pf_asked = want;
    pthread_cond_signal(&s->pf_cv);
    pthread_mutex_unlock(&s->pf_mu);
}

static int st_experts_request(wsrc *w, int64_t L, int n, const int32_t *ids) {
    stream *s = (stream *)w;
    ck_flush(s);
    if (L < s->c->first_dense || L >= s->c->n_layers)
        return base_fail(s->err, sizeof s->err, STRATA_EINVAL, "stream: layer %lld has no routed experts", (long long)L);
    if (s->req_L >= 0 && s->req_L != L) release_request(s); /* the caller skipped experts_put */
    s->req_L = L;
    const int predicted = s->pf_L == L;
    if (predicted && s->n_req == 0) s->st.pred_layers++;
    for (int i = 0; i < n; i++) {
        int32_t id = ids[i];
        if (id < 0 || id >= s->NE) {
            release_request(s);
            return base_fail(s->err, sizeof s->err, STRATA_EINVAL, "stream: expert %d of layer %lld out of range", id, (long long)L);
        }
        if (s->req_slot[id] >= 0) continue; /* already requested in this layer */
        if (s->draft && !cache_resident(s->xc, (L - s->c->first_dense) * s->NE + id)) {
            release_request(s);
            return base_fail(s->err, sizeof s->err, STRATA_EINVAL, "stream: a draft pass asked for expert %d of layer %lld, "
                             "which is not in RAM", id, (long long)L);
        }
        if (s->trace && !s->draft) {
            int32_t rec[2] = {(int32_t)L, id};
            fwrite(rec, sizeof rec, 1, s->trace); /* stdio buffer from open: no allocation here */
        }
        if (predicted) {
            s->st.pred_requests++;
            s->st.pred_hits += s->pf_mark[id];
        }
        const int64_t key = (L - s->c->first_dense) * s->NE + id;
        int kind;
        int sl = cache_pin(s->xc, key, &kind);
        /* slots a prefetch holds come free as their reads land */
        io_req *d;
        while (sl < 0 && s->n_pf > 0 && io_reap(s->xring, 1, &d) == 1) {
            expert_landed(s, d);
            sl = cache_pin(s->xc, key, &kind);
        }
        if (sl < 0) {
            int64_t held = s->n_req;
            release_request(s);
            return base_fail(s->err, sizeof s->err, STRATA_EBUDGET,
                             "stream: the expert cache (%lld slots) cannot lease %lld experts of layer %lld at once: "
                             "stream them in waves of at most experts_capacity", (long long)cache_n_slots(s->xc), (long long)held + (n - i),
                             (long long)L);
        }
        s->req_slot[id] = sl;
        s->req_list[s->n_req++] = id;
        if (kind == CACHE_MISS) {
            s->pf_quiet[L] = s->pf_skip[L] = 0; /* waited for: guess this layer again */
            prefault_note(s, sl);
            int rc = expert_submit(s, sl, L, id);
            if (rc) { cache_fail(s->xc, sl); release_request(s); return rc; }
        } else if (s->xs[sl].pf_fresh) {
            s->xs[sl].pf_fresh = 0;
            s->st.prefetch_used++;
        }
    }
    return 0;
}

/* Room for reads ahead: the slots neither leased nor in flight, less what one
 * row's experts need so a request never waits on a guess. */
static int64_t prefetch_room(const stream *s) {
    return cache_n_slots(s->xc) - cache_n_pinned(s->xc) - s->c->topk;
}

static int st_predict_layer(wsrc *w, int64_t L, const wt **roles, const wt **guess) {
    stream *s = (stream *)w;
    *guess = NULL;
    if (s->plan.no_prefetch || !s->xc || L < s->c->first_dense || L >= s->c->n_layers || prefetch_room(s) < 1) return 1;
    if (s->pf_skip[L]) { s->pf_skip[L]--; s->st.pred_skipped++; return 1; }
    /* every expert of L holds a slot, so a guess could read nothing (a budget
     * that holds the whole model; the backoff below would still guess every
     * 64th time) */
    if (cache_layer_held(s->xc, L - s->c->first_dense) >= s->NE) { s->st.pred_skipped++; return 1; }
    pthread_mutex_lock(&s->mu);
    unit *x = &s->u[L];
    /* pinned units only: a streamed one would be dropped from the arena at its put */
    const int ok = x->pinned && x->state == U_READY;
    if (ok) {
        x->held++;
        *roles = x->roles;
        *guess = x->gq_ok ? x->gqw : NULL;
        s->st.guess_lends += x->gq_ok;
    }
    pthread_mutex_unlock(&s->mu);
    return !ok;
}

static void st_experts_prefetch(wsrc *w, int64_t L, int n, const int32_t *ids) {
    stream *s = (stream *)w;
    ck_flush(s);
    if (s->plan.no_prefetch || !s->xc || L < s->c->first_dense || L >= s->c->n_layers) return;
    if (s->pf_L != L) memset(s->pf_mark, 0, (size_t)s->NE); /* a second guess for L adds to the first */
    s->pf_L = L;
    int reads = 0;
    for (int i = 0; i < n; i++)
        if (ids[i] >= 0 && ids[i] < s->NE && !s->pf_mark[ids[i]]) {
            s->pf_mark[ids[i]] = 1;
            s->st.pred_ids++;
        }
    for (int i = 0; i < n; i++) {
        const int32_t id = ids[i];
        if (id < 0 || id >= s->NE || prefetch_room(s) < 1) continue;
        const int sl = cache_prefetch(s->xc, (L - s->c->first_dense) * s->NE + id);
        if (sl < 0) continue; /* resident, in flight, or no victim */
        prefault_note(s, sl);
        if (expert_submit(s, sl, L, id)) { /* a record that cannot be read: the request will say why */
            s->err[0] = 0;
            cache_fail(s->xc, sl);
            cache_unpin(s->xc, sl);
            continue;
        }
        s->xs[sl].pf_lease = s->xs[sl].pf_fresh = 1;
        s->n_pf++;
        s->st.prefetch_reads++;
        reads++;
    }
    /* A guess costs its layer's router (a matvec of E x hidden over the whole
     * trunk's bandwidth) and its top-k; where the cache already holds what the
     * layer picks, that is all it does. Ladder at 8 GB (96.5% hits), 48 tokens,
     * two interleaved pairs: 0.119 s/token with every guess, 0.112-0.116 with
     * none (--no-prefetch). So a layer whose last guesses read nothing skips the
     * next 1, 3, 7, ... up to 63 of them, and a read it waits for (a miss in
     * st_experts_request) restores every guess. Guesses never change a bit. Up
     * to 63 instead of 15: ladder at 16 GB (everything it uses preloaded), 63
     * tokens, 216 guesses instead of 357 (~90 us each); at 8 GB the misses reset
     * the count first (1,340 guesses either way, the same misses). */
    if (reads) { s->pf_quiet[L] = 0; return; }
    if (s->pf_quiet[L] < PF_QUIET_MAX) s->pf_quiet[L]++;
    s->pf_skip[L] = (uint8_t)((1u << (s->pf_quiet[L] - 1)) - 1);
}

static int st_expert_wait(wsrc *w, int64_t L, int32_t id, const wt **roles) {
    stream *s = (stream *)w;
    if (L != s->req_L || id < 0 || id >= s->NE || s->req_slot[id] < 0)
        return base_fail(s->err, sizeof s->err, STRATA_EINVAL, "stream: expert %d of layer %lld was not requested", id, (long long)L);
    int sl = s->req_slot[id];
    double t0 = base_now();
    expert_settle(s, sl);
    io_leave_l(s, NULL, 0, 0, base_now() - t0);
    if (cache_state(s->xc, sl) != 2) {
        if (!s->err[0]) base_fail(s->err, sizeof s->err, STRATA_EIO, "layer %lld expert %d: read failed", (long long)L, id);
        return strstr(s->err, "checksum") ? STRATA_ECORRUPT : strstr(s->err, "MXFP4") ? STRATA_EFORMAT : STRATA_EIO;
    }
    *roles = s->xs[sl].roles;
    return 0;
}

/* Ready without blocking: collects the reads that have landed (never waits), then
 * asks the slot. A failed read counts as ready (expert_wait reports it). */
static int st_expert_ready(wsrc *w, int64_t L, int32_t id) {
    stream *s = (stream *)w;
    if (L != s->req_L || id < 0 || id >= s->NE || s->req_slot[id] < 0) return 1;
    const int sl = s->req_slot[id];
    while (cache_state(s->xc, sl) == 1 /* INFLIGHT */ && reap_experts(s, sl, 0) > 0) {}
    return cache_state(s->xc, sl) != 1;
}

static void st_experts_put(wsrc *w, int64_t L) {
    stream *s = (stream *)w;
    ck_flush(s);
    if (s->req_L == L) release_request(s);
    if (s->pf_L == L) s->pf_L = -1; /* the prediction was used */
    else if (s->pf_L >= 0 && s->pf_L != L + 1) { /* never requested: not counted */
        s->pf_L = -1;
    }
}

/* One expert of the open request, released early (its compute is done). The
 * request list is short (at most the cache's slots): a linear search is cheap. */
static void st_expert_put(wsrc *w, int64_t L, int32_t id) {
    stream *s = (stream *)w;
    ck_flush(s);
    if (s->req_L != L || id < 0 || id >= s->NE || s->req_slot[id] < 0) return;
    const int sl = s->req_slot[id];
    expert_settle(s, sl);
    cache_unpin(s->xc, sl);
    s->req_slot[id] = -1;
    for (int i = 0; i < s->n_req; i++)
        if (s->req_list[i] == id) { s->req_list[i] = s->req_list[--s->n_req]; break; }
}

static int64_t st_experts_capacity(wsrc *w) { return cache_n_slots(((stream *)w)->xc); }

/* ========================================================== self-drafting */

static int st_draft_mode(wsrc *w, int on) {
    stream *s = (stream *)w;
    ck_flush(s);
    if (!s->xc) return STRATA_EINVAL;
    if (on && !s->draft) cache_get_stats(s->xc, &s->draft_saved);
    if (!on && s->draft) cache_set_stats(s->xc, &s->draft_saved);
    s->draft = on;
    return 0;
}

/* A pinned unit is never moved or freed while the source is open, so a draft
 * pass borrows it without a hold (and without touching the read-ahead). */
static int st_layer_peek(wsrc *w, int64_t L, const wt **roles) {
    stream *s = (stream *)w;
    if (L < 0 || L >= s->n_units) return 1;
    pthread_mutex_lock(&s->mu);
    const unit *x = &s->u[L];
    const int ok = x->pinned && x->state == U_READY;
    if (ok) *roles = x->roles;
    pthread_mutex_unlock(&s->mu);
    return ok ? 0 : 1;
}

static int st_expert_resident(wsrc *w, int64_t L, int32_t id) {
    stream *s = (stream *)w;
    if (!s->xc || L < s->c->first_dense || L >= s->c->n_layers || id < 0 || id >= s->NE) return 0;
    return cache_resident(s->xc, (L - s->c->first_dense) * s->NE + id);
}

/* =============================================================== embeddings */

static int st_embed_rows(wsrc *w, int n, const int32_t *ids, float *out) {
    stream *s = (stream *)w;
    const int64_t H = s->c->hidden;
    if (s->plan.no_head) return base_fail(s->err, sizeof s->err, STRATA_EINVAL, "stream: the embedding is held by another stage");
    for (int i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= s->c->vocab)
            return base_fail(s->err, sizeof s->err, STRATA_EINVAL, "stream: token id %d outside the vocabulary (%lld)", ids[i],
                             (long long)s->c->vocab);
    if (s->emb) {
        for (int i = 0; i < n; i++) num_to_f32(out + (int64_t)i * H, s->emb + (uint64_t)ids[i] * s->emb_row, s->emb_dtype, (size_t)H);
        return 0;
    }
    double t0 = base_now();
    io_req q[EMB_BATCH];
    int rc = 0;
    for (int i0 = 0; i0 < n && !rc; i0 += EMB_BATCH) {
        int m = n - i0 < EMB_BATCH ? n - i0 : EMB_BATCH;
        uint64_t got = 0;
        io_enter_l(s);
        for (int i = 0; i < m; i++) {
            uint64_t off = s->emb_off + (uint64_t)ids[i0 + i] * s->emb_row;
            uint64_t a0 = io_align_down(off), a1 = io_align_up(off + s->emb_row);
            q[i] = (io_req){.f = &s->files[s->emb_file], .off = a0, .len = a1 - a0, .need = off + s->emb_row - a0,
                            .dst = s->emb_bounce + (uint64_t)i * s->emb_slot, .ud = (void *)(intptr_t)(off - a0)};
            io_submit(s->xring, &q[i]);
        }
        /* The ring also carries expert reads, and reads ahead may still be in
         * flight: a completion that is not one of these rows is an expert's,
         * landed as any reap would land it (taking it for a row lost the
         * expert's read, "read failed" at its wait, and could hand out a row
         * whose read had not finished). */
        for (int left = m; left > 0;) {
            io_req *d;
            if (io_reap(s->xring, 1, &d) != 1) { rc = STRATA_EIO; break; }
            int mine = 0;
            for (int i = 0; i < m && !mine; i++) mine = d == &q[i];
            if (!mine) { expert_landed(s, d); continue; }
            left--;
            if (d->rc && !rc) {
                char e2[600];
                io_req_errstr(d, e2, sizeof e2);
                rc = base_fail(s->err, sizeof s->err, STRATA_EIO, "embedding row: %s", e2);
            }
            got += d->got;
        }
        io_leave_l(s, &s->st.bytes_embed, got, (uint64_t)m, 0);
        for (int i = 0; i < m && !rc; i++)
            num_to_f32(out + (int64_t)(i0 + i) * H, q[i].dst + (uint64_t)(intptr_t)q[i].ud, s->emb_dtype, (size_t)H);
    }
    io_leave_l(s, NULL, 0, 0, base_now() - t0);
    return rc;
}

/* ==================================================================== close */

static void ws_close(wsrc *w) {
    stream *s = (stream *)w;
    if (!s) return;
    if (s->xc) ck_flush(s);
    if (s->th_started) {
        pthread_mutex_lock(&s->mu);
        s->stop = 1;
        pthread_cond_broadcast(&s->cv);
        pthread_mutex_unlock(&s->mu);
        pthread_join(s->th, NULL);
    }
    if (s->pf_started) {
        pthread_mutex_lock(&s->pf_mu);
        s->pf_stop = 1;
        pthread_cond_signal(&s->pf_cv);
        pthread_mutex_unlock(&s->pf_mu);
        pthread_join(s->pf_th, NULL);
    }
    if (s->xring && s->xc) {
        io_req *d;
        while (io_pending(s->xring) && io_reap(s->xring, 1, &d) == 1) expert_landed(s, d);
    }
    if (s->sring) {
        io_req *d;
        while (io_pending(s->sring) && io_reap(s->sring, 1, &d) == 1) {}
    }
    io_ring_free(s->rring);
    io_ring_free(s->xring);
    io_ring_free(s->sring);
    if (s->sl) for (int i = 0; i < s->n_sl; i++) base_free(s->sl[i].buf);
    base_free(s->sl);
    if (s->u) {
        for (int64_t u = 0; u < s->n_units; u++) {
            if (s->u[u].pinned) base_free(s->u[u].buf);
            base_free(s->u[u].gq);
            base_free(s->u[u].t);
            base_free(s->u[u].segs);
            base_free(s->u[u].big);
            base_free(s->u[u].sum);
            for (int k = 0; s->u[u].wb && k < s->u[u].n_wb; k++) base_free((void *)s->u[u].wb[k].done);
            base_free(s->u[u].wb);
            base_free(s->u[u].wb_t);
        }
    }
    base_free(s->u);
    base_free(s->arena);
    cache_free(s->xc);
    base_free(s->xs);
    base_free(s->req_slot);
    base_free(s->req_list);
    base_free(s->pf_mark);
    base_free(s->emb);
    base_free(s->emb_bounce);
    if (s->files) for (int i = 0; i < s->n_files; i++) io_file_close(&s->files[i]);
    base_free(s->files);
    pack_close(s->pk);
    if (s->trace) fclose(s->trace);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    pthread_mutex_destroy(&s->pf_mu);
    pthread_cond_destroy(&s->pf_cv);
    base_free(s);
}

static const char *st_errmsg(wsrc *w) { return ((stream *)w)->err; }

static void st_use_pool(wsrc *w, struct pool *p) { ((stream *)w)->pool = p; }

static const wsrc_ops k_stream_ops = {
    st_layer_get, st_layer_put, st_experts_request, st_expert_wait, st_experts_put,
    st_embed_rows, st_hint_layer, ws_close, st_errmsg, st_expert_ready, st_expert_put, st_experts_capacity,
    st_draft_mode, st_layer_peek, st_expert_resident,
    st_predict_layer, st_experts_prefetch, st_rows_slice, st_rows_get, st_rows_put, st_rows_hint, st_use_pool,
    st_checks_begin, st_check_run, st_checks_end,
};

/* ============================================================== warm start */

#define PRELOAD_INFLIGHT 32        /* reads in flight while the cache is filled */
#define PRELOAD_STEP (256ull << 20) /* progress every so many bytes */

static void preload_note(stream *s, uint64_t done, uint64_t total, uint64_t *next) {
    if (!s->plan.progress || (done < *next && done < total)) return;
    s->plan.progress(s->plan.progress_ud, done, total);
    *next = done + PRELOAD_STEP;
}

/* ids[0 .. n) by descending key, ties by ascending id (shell sort: no state
 * outside the call, no allocation). */
static void sort_desc(int32_t *ids, int64_t n, const float *key) {
    for (int64_t gap = n / 2; gap > 0; gap /= 2)
        for (int64_t i = gap; i < n; i++) {
            const int32_t x = ids[i];
            int64_t j = i;
            while (j >= gap && (key[ids[j - gap]] < key[x] || (key[ids[j - gap]] == key[x] && ids[j - gap] > x))) {
                ids[j] = ids[j - gap];
                j -= gap;
            }
            ids[j] = x;
        }
}

/* The requests a partial warm start credits each expert it chose by router bias
 * with (cache_seed). Without a prior those experts had no count until requested,
 * so LAYER evicted them before any expert requested once. The generated models'
 * routing follows the bias, and the counts came too slowly to learn it. Ladder at
 * 6.2 GB, 16-token prompt: over 63 tokens, true hits 86.5% -> 88.6 / 90.0 /
 * 90.4 / 90.5% for priors 1 / 2 / 3 / 4, and 0.072 -> 0.053 GB read per token at
 * 2. Over 199 tokens, 88.8% -> 90.3% (2) / 90.6% (4); a static cache of the 2137
 * experts the trace requests most would hold 91.5%. At 4 GB (2): 54.2 -> 58.1%,
 * 0.242 -> 0.222 GB per token; 8 GB: 96.3 -> 97.7%, 0.019 -> 0.012. Where the
 * bias says little (a trained model balances its load with it) the prior costs
 * only its first requests' worth of stickiness. */
#define PRELOAD_PRIOR 2

/* The warm start (place.h place_open). Reads that fail are left to the first
 * use, which reads again and reports: a warm start never fails an open. */
static void preload(stream *s) {
    const cfg *c = s->c;
    const double t0 = base_now();
    const uint64_t b0 = s->st.bytes_trunk + s->st.bytes_head + s->st.bytes_experts;
    uint64_t total = 0, done = 0, next = 0;
    int trunk_pinned = 1;
    for (int64_t u = 0; u < s->n_units; u++) {
        if (s->u[u].pinned) total += s->u[u].buf_bytes;
        else if (u < c->n_layers) trunk_pinned = 0;
    }
    const int64_t n_all = s->n_moe * s->NE, slots = s->xc ? cache_n_slots(s->xc) : 0;
    const int64_t n_x = slots >= n_all ? n_all : trunk_pinned ? slots : 0;
    total += (uint64_t)n_x * s->plan.expert_bytes;
    if (!total) return;
    pthread_mutex_lock(&s->mu);
    for (int64_t u = 0; u < s->n_units; u++) {
        unit *x = &s->u[u];
        if (!x->pinned || x->state != U_IDLE) continue;
        x->state = U_LOADING;
        load_unit_locked(s, u, s->rring);
        done += x->buf_bytes;
        pthread_mutex_unlock(&s->mu);
        preload_note(s, done, total, &next);
        pthread_mutex_lock(&s->mu);
    }
    pthread_mutex_unlock(&s->mu);
    float *bias = n_x && n_x < n_all ? base_alloc((size_t)s->NE * sizeof(float), MEM_INDEX) : NULL;
    int32_t *ids = s->req_list; /* free until the first request */
    int64_t got = 0;
    for (int64_t l = 0; l < s->n_moe && n_x; l++) {
        const int64_t L = c->first_dense + l, q = n_x / s->n_moe + (l < n_x % s->n_moe);
        int64_t n = 0;
        for (int32_t e = 0; e < s->NE; e++) ids[n++] = e;
        if (q < s->NE) { /* this layer's share: highest router bias first */
            const unit *x = &s->u[L];
            const wt *v = &x->roles[R_MOE_BIAS];
            if (!bias || x->state != U_READY || !v->p || v->rows * v->cols != s->NE) continue;
            num_to_f32(bias, v->p, v->dtype, (size_t)s->NE);
            sort_desc(ids, n, bias);
            n = q;
            memset(s->pf_mark, 0, (size_t)(uint32_t)s->NE); /* back to file order */
            for (int64_t i = 0; i < n; i++) s->pf_mark[ids[i]] = 1;
            n = 0;
            for (int32_t e = 0; e < s->NE; e++) if (s->pf_mark[e]) ids[n++] = e;
            memset(s->pf_mark, 0, (size_t)(uint32_t)s->NE);
        }
        for (int64_t i = 0; i < n; i++) {
            io_req *d;
            while (io_pending(s->xring) >= PRELOAD_INFLIGHT && io_reap(s->xring, 1, &d) == 1) expert_landed(s, d);
            const int sl = cache_prefetch(s->xc, l * s->NE + ids[i]);
            if (sl < 0) continue;
            prefault_note(s, sl);
            if (expert_submit(s, sl, L, ids[i])) {
                s->err[0] = 0;
                cache_fail(s->xc, sl);
                cache_unpin(s->xc, sl);
                continue;
            }
            s->xs[sl].pf_lease = 1;
            s->n_pf++;
            got++;
            if (q < s->NE) cache_seed(s->xc, l * s->NE + ids[i], PRELOAD_PRIOR);
            done += s->plan.expert_bytes;
            preload_note(s, done, total, &next);
        }
    }
    io_req *d;
    while (io_pending(s->xring) && io_reap(s->xring, 1, &d) == 1) expert_landed(s, d);
    base_free(bias);
    if (done < total) preload_note(s, total, total, &next);
    s->st.preload_bytes = s->st.bytes_trunk + s->st.bytes_head + s->st.bytes_experts - b0;
    s->st.preload_s = base_now() - t0;
    s->st.preload_experts = got;
}

/* ===================================================================== open */

static int experts_are_bf16(const cfg *c, const st_index *ix) {
    char name[200];
    snprintf(name, sizeof name, "%slayers.%lld.block_sparse_moe.experts.0.w1.weight", arch_of(c)->pfx, (long long)c->first_dense);
    return st_find(ix, name) != NULL;
}

/* The embedding region of the pack against its XXH3: the resident table as read
 * (buf, n), or, when rows are read one by one (a row cannot be checked alone), the
 * region streamed once through the row buffers in `chunk`-byte reads at open
 * (K3: 2.3 GB, a few seconds, inside the budget). */
static int embed_check(stream *s, const uint8_t *buf, uint64_t n, uint64_t chunk, char *err, size_t errlen) {
    const pack_region *r = &s->pk->embed;
    uint64_t got;
    if (buf) {
        got = hash_cold(buf, n);
    } else {
        if (chunk < IO_ALIGN) chunk = IO_ALIGN; /* emb_slot > IO_ALIGN, so the bounce holds it */
        XXH3_state_t h;
        XXH3_64bits_reset(&h);
        for (uint64_t o = 0; o < r->nbytes; o += chunk) {
            uint64_t k = r->nbytes - o < chunk ? r->nbytes - o : chunk;
            io_req q = {.f = &s->files[s->emb_file], .off = r->off + o, .len = k, .need = k, .dst = s->emb_bounce}, *d;
            io_submit(s->xring, &q);
            io_reap(s->xring, 1, &d);
            if (q.rc) { io_req_errstr(&q, err, errlen); return STRATA_EIO; }
            XXH3_64bits_update(&h, s->emb_bounce, k);
        }
        got = XXH3_64bits_digest(&h);
    }
    if (got == r->xxh3) return STRATA_OK;
    return base_fail(err, errlen, STRATA_ECORRUPT,
                     "embed: checksum mismatch in %s bytes %llu..%llu (expected %016llx, got %016llx): the pack is corrupt or "
                     "stale; run strata pack --verify",
                     s->files[s->emb_file].path, (unsigned long long)r->off, (unsigned long long)(r->off + r->nbytes),
                     (unsigned long long)r->xxh3, (unsigned long long)got);
}

const struct pack *place_pack(const wsrc *w) {
    return w && w->ops == &k_stream_ops ? ((const stream *)w)->pk : NULL;
}

int place_open(wsrc **out, const cfg *c, const st_index *ix, const char *model_dir, const place_plan *p, char *err,
               size_t errlen) {
    *out = NULL;
    stream *s = base_calloc(1, sizeof *s, MEM_INDEX);
    if (!s) return base_fail(err, errlen, STRATA_ENOMEM, "stream: out of memory");
    s->base.ops = &k_stream_ops;
    s->base.c = c;
    s->c = c;
    s->ix = ix;
    s->plan = *p;
    s->q_head = s->q_tail = -1;
    s->req_L = -1;
    s->pf_L = -1;
    s->last_get = -1;
    s->head_follows = 1;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    pthread_mutex_init(&s->pf_mu, NULL);
    pthread_cond_init(&s->pf_cv, NULL);
    int rc = 0;
    if (p->n_layers != c->n_layers) { rc = base_fail(err, errlen, STRATA_EINVAL, "stream: the plan is for another model"); goto fail; }
    if (p->has_pack && (rc = pack_open(&s->pk, p->pack_dir, model_dir, c, ix, err, errlen))) goto fail;
    s->n_files = st_n_shards(ix) + (s->pk ? 1 : 0);
    s->files = base_calloc((size_t)s->n_files, sizeof *s->files, MEM_IO);
    if (!s->files) { rc = base_fail(err, errlen, STRATA_ENOMEM, "stream: out of memory"); goto fail; }
    for (int i = 0; i < s->n_files; i++) s->files[i].fd_direct = s->files[i].fd_buf = -1;
    for (int i = 0; i < s->n_files && !rc; i++)
        rc = io_file_open(&s->files[i], i < st_n_shards(ix) ? st_shard_path(ix, i) : s->pk->trunk_path, err, errlen);
    if (rc) goto fail;
    if ((rc = io_ring_create(&s->xring, IO_DEPTH, 0, p->no_uring, err, errlen))) goto fail;
    /* trunk */
    s->n_units = c->n_layers + 1;
    s->arena_bytes = p->ring_bytes;
    s->u = base_calloc((size_t)s->n_units, sizeof *s->u, MEM_INDEX);
    if (!s->u) { rc = base_fail(err, errlen, STRATA_ENOMEM, "stream: out of memory"); goto fail; }
    if ((rc = build_units(s, err, errlen))) goto fail;
    for (int64_t u = 0; u < s->n_units; u++) {
        unit *x = &s->u[u];
        if (!x->pinned || p->absent[u]) continue;
        x->buf = base_alloc_aligned(x->buf_bytes ? x->buf_bytes : IO_ALIGN, IO_ALIGN, MEM_TRUNK);
        if (!x->buf) { rc = base_fail(err, errlen, STRATA_EBUDGET, "stream: cannot allocate pinned layer %lld", (long long)u); goto fail; }
        /* huge pages, like the arena and the expert cache: the pinned trunk was
         * the one large buffer on 4 KB pages (2.4 GB of ladder's 6.2 GB) */
        io_buffer_advise(x->buf, x->buf_bytes);
        if (p->guess_bytes && p->guess_u[u] && !(x->gq = base_alloc_aligned(p->guess_one_bytes, 64, MEM_TRUNK))) {
            rc = base_fail(err, errlen, STRATA_EBUDGET, "stream: cannot allocate layer %lld's guess router", (long long)u);
            goto fail;
        }
    }
    if (p->sliced) { /* row slice buffers and the forward thread's ring for them */
        s->n_sl = p->n_slices > 0 ? p->n_slices : 1;
        s->sl = base_calloc((size_t)s->n_sl, sizeof *s->sl, MEM_TRUNK);
        if (!s->sl) { rc = base_fail(err, errlen, STRATA_EBUDGET, "stream: cannot allocate the row slices"); goto fail; }
        for (int i = 0; i < s->n_sl; i++) {
            s->sl[i].buf = base_alloc_aligned(p->slice_bytes + 2 * IO_ALIGN, IO_ALIGN, MEM_TRUNK);
            if (!s->sl[i].buf) { rc = base_fail(err, errlen, STRATA_EBUDGET, "stream: cannot allocate the row slices"); goto fail; }
            io_buffer_advise(s->sl[i].buf, p->slice_bytes + 2 * IO_ALIGN);
        }
        if ((rc = io_ring_create(&s->sring, IO_DEPTH, 0, p->no_uring, err, errlen))) goto fail;
    }
    if (s->arena_bytes) {
        s->arena = base_alloc_aligned(s->arena_bytes, 1u << 20, MEM_TRUNK);
        if (!s->arena) { rc = base_fail(err, errlen, STRATA_EBUDGET, "stream: cannot allocate the %llu-byte arena", (unsigned long long)s->arena_bytes); goto fail; }
        io_buffer_advise(s->arena, s->arena_bytes);
    }
    /* experts */
    s->NE = c->n_experts;
    s->n_moe = p->n_moe > 0 ? c->n_layers - c->first_dense : 0; /* cache keys span every MoE layer */
    s->experts_bf16 = experts_are_bf16(c, ix);
    s->xslot_bytes = p->expert_slot_bytes;
    if (s->n_moe > 0) {
        if ((rc = cache_create(&s->xc, s->n_moe * s->NE, p->n_expert_slots, p->expert_slot_bytes, p->cache_policy, s->n_moe, 1,
                               err, errlen)))
            goto fail;
        s->xs = base_calloc((size_t)p->n_expert_slots, sizeof *s->xs, MEM_CACHE);
        s->req_slot = base_alloc((size_t)s->NE * sizeof *s->req_slot, MEM_CACHE);
        s->req_list = base_alloc((size_t)s->NE * sizeof *s->req_list, MEM_CACHE);
        s->pf_mark = base_calloc((size_t)s->NE, 1, MEM_CACHE);
        if (!s->xs || !s->req_slot || !s->req_list || !s->pf_mark) { rc = base_fail(err, errlen, STRATA_ENOMEM, "stream: out of memory"); goto fail; }
        for (int64_t i = 0; i < s->NE; i++) s->req_slot[i] = -1;
        s->x_low = cache_n_slots(s->xc);
        s->pf_want = s->pf_asked = PF_AHEAD;
        if (pthread_create(&s->pf_th, NULL, prefault_main, s) == 0) s->pf_started = 1;
    }
    /* embeddings: a row is embed_row bytes at a known offset (pack region or the shard) */
    if (!p->no_head) {
        char en[96];
        snprintf(en, sizeof en, "%sembed_tokens.weight", arch_of(c)->pfx);
        const st_tensor *t = st_find(ix, en);
        if (!t || t->ndim != 2 || t->shape[0] != c->vocab || t->shape[1] != c->hidden) {
            rc = base_fail(err, errlen, STRATA_EFORMAT, "stream: %s missing or misshapen", en);
            goto fail;
        }
        s->emb_dtype = t->dtype;
        s->emb_row = t->nbytes / (uint64_t)c->vocab;
        if (s->pk) { s->emb_file = s->n_files - 1; s->emb_off = s->pk->embed.off + s->pk->embed.t[0].off; }
        else { s->emb_file = t->shard; s->emb_off = t->off; }
        if (p->embed_resident) {
            s->emb = base_alloc_aligned(io_align_up(t->nbytes) + 2 * IO_ALIGN, IO_ALIGN, MEM_WEIGHTS);
            if (!s->emb) { rc = base_fail(err, errlen, STRATA_EBUDGET, "stream: cannot allocate the embedding table"); goto fail; }
            uint64_t a0 = io_align_down(s->emb_off), a1 = io_align_up(s->emb_off + t->nbytes);
            /* from a pack [a0, a1) is exactly the embed region (aligned, padded): read it all for its checksum */
            const int check = VERIFY(s) && a0 == s->pk->embed.off && a1 - a0 == s->pk->embed.nbytes;
            io_req q = {.f = &s->files[s->emb_file], .off = a0, .len = a1 - a0,
                        .need = check ? a1 - a0 : s->emb_off + t->nbytes - a0, .dst = s->emb};
            io_submit(s->xring, &q);
            io_req *d;
            io_reap(s->xring, 1, &d);
            if (q.rc) { io_req_errstr(&q, err, errlen); rc = STRATA_EIO; goto fail; }
            s->st.bytes_embed += q.got;
            if (check && (rc = embed_check(s, s->emb, a1 - a0, 0, err, errlen))) goto fail;
            if (a0 != s->emb_off) memmove(s->emb, s->emb + (s->emb_off - a0), t->nbytes);
        } else {
            s->emb_slot = io_align_up(s->emb_row) + 2 * IO_ALIGN;
            s->emb_bounce = base_alloc_aligned(s->emb_slot * EMB_BATCH, IO_ALIGN, MEM_IO);
            if (!s->emb_bounce) { rc = base_fail(err, errlen, STRATA_ENOMEM, "stream: out of memory"); goto fail; }
            if (VERIFY(s) && (rc = embed_check(s, NULL, 0, io_align_down(s->emb_slot * EMB_BATCH), err, errlen))) goto fail;
        }
    }
    /* reader thread: read-ahead of the trunk (needs an arena or pinned units) */
    if (p->trace_path[0] && !(s->trace = fopen(p->trace_path, "wb"))) {
        rc = base_fail(err, errlen, STRATA_EIO, "stream: cannot write the trace %s", p->trace_path);
        goto fail;
    }
    if ((rc = io_ring_create(&s->rring, IO_DEPTH, 0, p->no_uring, err, errlen))) goto fail;
    if (!p->no_preload) preload(s);
    if (!p->no_readahead && pthread_create(&s->th, NULL, reader_main, s) == 0) s->th_started = 1;
    *out = &s->base;
    return STRATA_OK;
fail:
    ws_close(&s->base);
    return rc;
}

/* ==================================================================== stats */

void place_stats_get(wsrc *w, place_stats *o) {
    memset(o, 0, sizeof *o);
    o->peak_rss = base_peak_rss();
    if (!w || w->ops != &k_stream_ops) return;
    stream *s = (stream *)w;
    pthread_mutex_lock(&s->mu);
    *o = s->st;
    if (s->io_active) o->read_s += base_now() - s->io_t0;
    pthread_mutex_unlock(&s->mu);
    if (s->xc) {
        cache_stats cs;
        cache_get_stats(s->xc, &cs);
        o->expert_requests = cs.requests;
        o->expert_hits = cs.hits;
        o->expert_misses = cs.misses;
        o->expert_evictions = cs.evictions;
        o->hit_rate = cs.requests ? (double)cs.hits / (double)cs.requests : 0;
    }
    o->verify_bytes = atomic_load_explicit(&s->verify_bytes, memory_order_relaxed);
    o->verify_s = (double)atomic_load_explicit(&s->verify_ns, memory_order_relaxed) * 1e-9;
    for (int64_t u = 0; u < s->n_units; u++) /* the blocks the compute threads checked */
        for (int k = 0; k < s->u[u].n_wb; k++) {
            o->verify_blk_bytes += atomic_load_explicit(&s->u[u].wb[k].bytes, memory_order_relaxed);
            o->verify_blk_s += (double)atomic_load_explicit(&s->u[u].wb[k].ns, memory_order_relaxed) * 1e-9;
        }
    o->verify_bytes += o->verify_blk_bytes;
    o->verify_s += o->verify_blk_s;
    o->bytes_read = o->bytes_trunk + o->bytes_head + o->bytes_embed + o->bytes_experts;
    o->read_bw = o->read_s > 0 ? (double)o->bytes_read / o->read_s : 0;
    o->peak_rss = base_peak_rss();
}

void place_stats_reset(wsrc *w) {
    if (!w || w->ops != &k_stream_ops) return;
    stream *s = (stream *)w;
    pthread_mutex_lock(&s->mu);
    const place_stats keep = s->st; /* the warm start is a fact of the open */
    memset(&s->st, 0, sizeof s->st);
    atomic_store(&s->verify_bytes, 0);
    atomic_store(&s->verify_ns, 0);
    for (int64_t u = 0; u < s->n_units; u++)
        for (int k = 0; k < s->u[u].n_wb; k++) {
            atomic_store(&s->u[u].wb[k].bytes, 0);
            atomic_store(&s->u[u].wb[k].ns, 0);
        }
    s->st.preload_bytes = keep.preload_bytes;
    s->st.preload_s = keep.preload_s;
    s->st.preload_experts = keep.preload_experts;
    s->st.guess_copies = keep.guess_copies;
    if (s->io_active) s->io_t0 = base_now();
    pthread_mutex_unlock(&s->mu);
    if (s->xc) cache_reset_stats(s->xc);
}

void place_stats_print(const place_stats *s, const place_plan *p, FILE *f) {
    uint64_t bytes = s->bytes_trunk + s->bytes_head + s->bytes_embed + s->bytes_experts;
    fprintf(f, "io: read %.3f GB (trunk %.3f, head %.3f, embeddings %.4f, experts %.3f) in %llu reads, %.2f GB/s while reading\n",
            (double)bytes / 1e9, (double)s->bytes_trunk / 1e9, (double)s->bytes_head / 1e9, (double)s->bytes_embed / 1e9,
            (double)s->bytes_experts / 1e9, (unsigned long long)s->n_reads, s->read_bw / 1e9);
    fprintf(f, "io: %.2f s with reads in flight, %.2f s waited on I/O; layer gets %llu (%llu pinned)\n", s->read_s, s->wait_s,
            (unsigned long long)s->layer_gets, (unsigned long long)s->layer_gets_pinned);
    if (s->verify_bytes)
        fprintf(f, "verify: %.3f GB checked against the pack's XXH3 in %.3f s of hashing (%.1f GB/s)\n",
                (double)s->verify_bytes / 1e9, s->verify_s, s->verify_s > 0 ? (double)s->verify_bytes / 1e9 / s->verify_s : 0);
    if (s->verify_blk_bytes)
        fprintf(f, "verify: of which %.3f GB matrix blocks hashed by the compute threads after their products, in %.3f s (%.1f GB/s)\n",
                (double)s->verify_blk_bytes / 1e9, s->verify_blk_s, s->verify_blk_s > 0 ? (double)s->verify_blk_bytes / 1e9 / s->verify_blk_s : 0);
    fprintf(f, "experts: %llu requests, %llu true resident hits (%.1f%%), %llu misses, %llu evictions\n",
            (unsigned long long)s->expert_requests, (unsigned long long)s->expert_hits, 100 * s->hit_rate,
            (unsigned long long)s->expert_misses, (unsigned long long)s->expert_evictions);
    if (s->pred_layers)
        fprintf(f, "prefetch: %llu layers predicted a layer ahead: %.1f%% of their %llu requested experts predicted, "
                   "%.1f%% of %llu predictions requested; %llu read ahead, %llu of them requested (%.1f%%)\n",
                (unsigned long long)s->pred_layers, s->pred_requests ? 100.0 * (double)s->pred_hits / (double)s->pred_requests : 0,
                (unsigned long long)s->pred_requests, s->pred_ids ? 100.0 * (double)s->pred_hits / (double)s->pred_ids : 0,
                (unsigned long long)s->pred_ids, (unsigned long long)s->prefetch_reads, (unsigned long long)s->prefetch_used,
                s->prefetch_reads ? 100.0 * (double)s->prefetch_used / (double)s->prefetch_reads : 0);
    if (s->guess_copies)
        fprintf(f, "prefetch: MXFP4 copies of %lld routers, lent to %llu guesses\n", (long long)s->guess_copies,
                (unsigned long long)s->guess_lends);
    if (s->pred_skipped)
        fprintf(f, "prefetch: %llu guesses skipped (their layer all in RAM, or its last guesses found everything there)\n",
                (unsigned long long)s->pred_skipped);
    if (s->preload_bytes)
        fprintf(f, "preload: %.3f GB read at open in %.2f s (%.2f GB/s): the pinned trunk and %lld experts\n",
                (double)s->preload_bytes / 1e9, s->preload_s, s->preload_s > 0 ? (double)s->preload_bytes / 1e9 / s->preload_s : 0,
                (long long)s->preload_experts);
    if (p && p->budget_bytes)
        fprintf(f, "memory: peak RSS %.3f GB, budget %.3f GB (planned %.3f GB)\n", (double)s->peak_rss / 1e9,
                (double)p->budget_bytes / 1e9, (double)p->total_bytes / 1e9);
    else
        fprintf(f, "memory: peak RSS %.3f GB (no budget)\n", (double)s->peak_rss / 1e9);
}
