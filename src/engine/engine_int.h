/*
 * engine_int.h: what the engine's files share, private to src/engine/ (the rest
 * of the library uses infer.h).
 *
 *   infer.c    the engine and session lifecycle, scratch carving, the layer loop
 *              (Block Attention Residuals around each layer), the head, steps,
 *              speculation
 *   infer_state.c  session state files and the configuration fingerprint
 *   mm.c       matmul jobs: y = W x products split over the pool by output rows,
 *              weights in RAM or streamed in row slices
 *   attnres.c  Block Attention Residuals: the softmax over the residual sources
 *   kda.c      Kimi Delta Attention (linear attention, carried conv + state)
 *   mla.c      Gated Multi-head Latent Attention, absorbed (latent cache)
 *   dense.c    the dense SiTU-GLU FFN
 *   moe.c      Stable LatentMoE: router, expert union, streamed experts, combine
 *   guess.c    expert reads a layer ahead (guesses of the next layer's routing)
 *   mtp.c      DeepSeek-V3's multi-token-prediction layer as a draft (cfg mtp)
 *
 * A new architecture block is a new file with a `<block>_layer(e, L, W)` entry
 * point declared here, called from the layer loop (infer.c layers_run): it reads
 * e->xn (T, hidden), the normed input rows, and writes e->y (T, hidden), the
 * block's output, using only the engine's scratch and its own sequences' state
 * (its small tensors converted to f32 from e->vec + 4 * hidden on: the first four
 * hidden-wide vectors are the layer loop's; infer.c vec_need sizes e->vec, and
 * engine_carve the scratch a new block needs).
 * Math: docs/architecture.md, Model spec.
 */
#ifndef STRATA_ENGINE_INT_H
#define STRATA_ENGINE_INT_H

#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include "base.h"
#include "cfg.h"
#include "engine_stats.h"
#include "model.h"
#include "num.h"
#include "pool.h"

typedef struct engine engine;   /* the same typedefs as infer.h's (engine_int.h */
typedef struct session session; /* does not include it: infer.c includes both) */
struct infer_row;
struct engine_link;

#define ATT_BLOCK 256      /* attention positions scored per block (online softmax) */
#define MM_MAX_SEG 72      /* products in one matmul job: the experts of a batch plus a few */
#define MOE_BATCH 64       /* experts per batch (<= MM_MAX_SEG) */
#define PRED_MAX_ROWS 16   /* passes of more rows predict no experts (their union is most of a layer) */
#define PRED_CAND 8        /* x top-k router rows the late guess rescores per row (at most half the experts; guess.c) */

/* ======================================================================= */
/* Types                                                                    */
/* ======================================================================= */

struct engine {
    const cfg *c;
    wsrc *w;
    pool *pool;
    int n_threads;
    int64_t chunk;             /* max rows per forward pass (any mix of sequences) */
    int64_t n_kda, n_mla, n_blocks;
    int64_t P;                 /* kda_heads * kda_head_dim */
    int64_t qh;                /* MLA per-head query width nope + rope */
    int64_t C;                 /* MLA cache row: kv_lora + rope */
    int64_t xcap;              /* (token, slot) pairs one expert batch holds: chunk + topk */
    int32_t *kda_i, *mla_i;    /* (n_layers) index among KDA / MLA layers, -1 otherwise */
    /* the pass being evaluated: T rows in groups, each group the consecutive rows
     * of one sequence (its positions pos .. pos + rows - 1) */
    int64_t T, n_grp, n_out;
    session **g_s;             /* (chunk) the sequence of each group */
    int64_t *g_r0;             /* (chunk + 1) first row of each group; g_r0[n_grp] = T */
    int64_t *g_pos;            /* (chunk) position of each group's first row (its sequence's
                                  pos in a step; the MTP layer's own rows lag one behind) */
    int32_t *ids;              /* (chunk) token of each row */
    int32_t *outr;             /* (chunk) rows whose logits are wanted, ascending */
    struct infer_row *rowbuf;  /* (chunk) rows of session_eval's passes */
    /* residual stream, (T, hidden) each */
    float **res;               /* n_blocks + 1 buffers: block snapshots and the partial */
    float *h, *xn, *y;
    float *vec;                /* converted per-layer vectors (see vec_need) */
    float *thr;                /* per-thread scratch, thr_floats each */
    int64_t thr_floats;
    /* overlaid per-layer scratch (attention and FFN never alive together) */
    struct {                   /* KDA */
        float *prj[3];         /* (T, P) q/k/v projections before the conv */
        float *qkv[3];         /* (T, P) after conv + SiLU (q, k normalised in place) */
        float *g, *fa, *z, *b, *o; /* (T,P) (T,fa_rows) (T,P) (T,heads) (T,P) */
        float *ga;             /* (T, D) the low-rank output gate's g_a (kda_g_lowrank), else NULL */
    } k;
    struct {                   /* MLA */
        float *qa, *q, *kva, *g, *o; /* (T,q_lora) (T,NH*qh) (T,C) (T,NH*v) (T,NH*v) */
        float *kvb;            /* (NH*(nope+v), kv_lora) an FP8 kv_b_proj decoded (cfg.wf has SW_TRUNK_FP8), else NULL */
    } m;
    struct {                   /* MoE and dense */
        float *router, *wts, *z, *eo, *xe, *h1, *h3, *oe, *u, *sg, *su, *tmp;
        int32_t *idx, *mark, *list;
        int32_t *pairs;        /* (T * topk) token-slot pairs grouped by expert */
        int32_t *xoff, *xcur, *rem; /* per listed expert: pair offsets, fill cursor, not yet run */
        float *dg, *du;        /* dense gate/up (T, dense_inter) */
        /* the next layer's experts, predicted (guess.c) */
        float *px, *pr, *pv;   /* (PR, hidden) inputs, (PR, n_experts) scores, 2 hidden + n_experts vectors */
        float *pg;             /* 2 x n_group: guess_pick's group scores and kept flags */
        int32_t *pmark, *plist; /* (n_experts) each */
        int32_t *pc;           /* (PR, pred_cand) the late guess's candidates, best first */
        float *ps;             /* (PR, pred_cand) their scores */
        int64_t pr_L1;         /* pr holds the early guess's scores (sigmoid + bias) for this layer, else -1 */
    } f;
    int64_t guess_L1;          /* a late guess owed for this layer (-1: none): a task of the next attention's first job */
    char err[512];             /* the last pass's failure */
    uint64_t model_id;         /* written into state files (engine_set_model_id) */
    int64_t spec_rows;         /* rows a sequence may draft-verify in one go (0: no speculation) */
    /* a self-draft pass (engine_draft_step): only weights already in RAM */
    int draft;
    engine_draft_stats dst;
    int wrc;                   /* a weight read of this pass failed (mm_slices): its code */
    float *const *psrc;        /* the pass's AttnRes sources during the FFN (guess_predict) */
    int64_t pnsrc;
    int64_t pred_early;        /* ranks predicted while a layer's experts are read */
    int64_t pred_cand;         /* experts per row the late guess rescores (0: all) */
    int64_t L0, L1;            /* layers this engine computes (a pipeline stage: [L0, L1)) */
    const struct engine_link *link; /* first stage of a pipeline: the other stages, else NULL */
    int32_t *g_slot;           /* (chunk) link slot of each group's sequence */
    /* the MTP layer (cfg mtp, mtp.c): layer n_main, after the model's own */
    int64_t n_main;            /* the model's own layers: cfg_main_layers */
    int mtp;                   /* the MTP layer is bound and this engine runs it (no pipeline) */
    float *mtp_x;              /* (chunk, 2 hidden) its inputs: [embedding of t+1 | hidden of t] */
};

struct session {
    engine *e;
    int64_t max_ctx, pos;
    int broken;
    int32_t slot;    /* the link's slot of this sequence (-1: no link) */
    float *kda;      /* n_kda x kda_floats: conv[3][conv_k-1][P] then S[heads][D][D] */
    float *cache;    /* n_mla x max_ctx x C */
    int32_t *ids;    /* max_ctx */
    char err[512];
    /* speculation (engine spec_rows > 0): the KDA block from before the drafted
     * rows and, per row since, what replaying the recurrence needs (rec_floats
     * per row and KDA layer: q, k, v, alpha (P each), beta (heads), the raw conv
     * inputs (3 P)); session_spec_end keeps a prefix of the rows */
    int spec_on;
    int64_t spec_pos0, spec_n;
    float *spec_snap;  /* n_kda x kda_floats */
    float *spec_rec;   /* spec_rows x n_kda x rec_floats */
    /* the MTP layer (engine mtp): its latent cache is the last MLA layer's; rows
     * [0, mtp_pos) hold what it computed from the main model's final hidden state
     * at each position and the token after it (mtp_pos is pos - 1 or pos: the last
     * position's successor is sampled after its step). mtp_ring: the final hidden
     * state of the last mtp_cap positions (position q in row q % mtp_cap), enough
     * for any speculation's kept prefix; mtp_ch: the MTP's own output at the last
     * draft depth (mtp_depth, -1: none since the last step), fed to the next */
    int64_t mtp_pos, mtp_cap, mtp_depth;
    float *mtp_ring, *mtp_ch;
};

/* The ring row of the final hidden state at position q (q >= 0; row 0 for -1):
 * session_parts and the state files (infer_state.c) read the pending row there. */
static inline float *session_mtp_hidden(const session *s, int64_t q) {
    return s->mtp_ring + (q > 0 ? q % s->mtp_cap : 0) * s->e->c->hidden;
}

/* ======================================================================= */
/* Matmul jobs (mm.c)                                                       */
/* ======================================================================= */

/* A job is up to MM_MAX_SEG independent products (each with its own weights,
 * activations and token count) whose output rows are split over the pool by cost,
 * so one dispatch covers everything a layer step can compute at once: a decode
 * MoE step runs the gate/up of all its experts in one job and their down
 * projections in a second, instead of 3 dispatches per expert. A GLU segment also
 * computes the same rows of its up matrix and applies SiTU to them in place, so
 * no separate SiTU pass (and barrier) follows. SiTU is K.situ, in double: with
 * f32 tanhf/expf the model amplified their 1-2 ulp errors (tiny-blocks: 1.17e-3
 * max relative logit error against the float64 reference, 4.2e-4 in double).
 * Which thread computes a row never changes its bits: each output is one kernel
 * dot, each SiTU one element. */
typedef struct {
    const void *w;          /* rows of dtype, or MXFP4 packed codes */
    const uint8_t *scales;  /* MXFP4 scales; NULL for float weights */
    const void *wu;         /* GLU: the up matrix (same shape; MXFP4 iff w is), or NULL */
    const uint8_t *su;      /* GLU: its MXFP4 scales */
    int dtype, udtype;      /* float dtypes of w and wu */
    int64_t rows, cols, T;  /* (rows, cols) weights times T activation rows */
    const float *X;
    int64_t ldx;
    float *Y, *U;           /* GLU: Y = SiTU(W x, Wu x); U receives Wu x */
    int64_t ldy;
    const wt *dw, *dwu;     /* w / wu streamed in row slices (wt.sliced): mm_run reads them */
    struct wblk *vw, *vu;   /* w / wu to check block by block as they are used (wt.vb), or NULL */
    int fmt, ufmt;          /* WF_FP8 / WF_INT4 (schema.h): w / wu quantised, their scales qs / qsu (wt.s) */
    const void *qs, *qsu;
    int64_t rb;             /* absolute index of row 0 of w / wu / Y (a row slice's first row): the
                             * FP8 scale grid is indexed by absolute rows */
} mm_seg;

typedef struct {
    mm_seg seg[MM_MAX_SEG];
    int64_t c0[MM_MAX_SEG];  /* cost units before segment s (set by mm_run) */
    int64_t cpr[MM_MAX_SEG]; /* cost units per output row of segment s */
    int n;
    int64_t T;               /* activations of segments added from now on */
    engine *gs;              /* a late guess owed (engine.guess_L1) runs first, costing gs_cost units */
    int64_t gs_cost;
    wsrc *ck;                /* n_ck checks of this source (wsrc check_run) run next, */
    int n_ck;                /* each costing ck_cost units */
    int64_t ck_cost;
    float b1, b2;            /* SiTU betas for GLU segments */
    int silu;                /* GLU segments apply SiLU(gate) * up instead (cfg act_silu) */
    int bad;
    char what[96];
} mm_job;

/* Empties j for products of T activation rows. */
void mm_init(mm_job *j, int64_t T);
/* Adds y = W x with W expected (rows, cols); float dtypes only. Returns the
 * segment (its T may be changed before mm_run) or NULL on a shape error (j->bad,
 * j->what). */
mm_seg *mm_add(mm_job *j, const wt *W, int64_t rows, int64_t cols, const float *X, int64_t ldx,
               float *Y, int64_t ldy, const char *name);
/* The same for an MXFP4 matrix: packed codes Wp, scales Ws. */
mm_seg *mm_add_mxfp4(mm_job *j, const wt *Wp, const wt *Ws, int64_t rows, int64_t cols,
                     const float *X, int64_t ldx, float *Y, int64_t ldy, const char *name);
/* Makes g a GLU segment: Wu (Wus: MXFP4 scales, else NULL) must have g's shape,
 * MXFP4 iff g is (float dtypes may differ); U (Y's layout) receives the up rows. */
void mm_glu(mm_job *j, mm_seg *g, const wt *Wu, const wt *Wus, float *U, const char *name);
/* Runs a job: the segments whose weights are in RAM in one dispatch, then each
 * segment streamed in row slices. A failed read is left in e->wrc. */
void mm_run(engine *e, mm_job *j);

/* ======================================================================= */
/* Blocks and guesses                                                       */
/* ======================================================================= */

/* The layer's blocks: e->xn (e->T rows) in, e->y out; W is layer L's trunk. */
int kda_layer(engine *e, int64_t L, const wt *W);
int mla_layer(engine *e, int64_t L, const wt *W);
int dense_layer(engine *e, int64_t L, const wt *W);
int moe_layer(engine *e, int64_t L, const wt *W);
/* One row's routing (moe.c): s holds the router logits (n_experts; replaced by
 * their sigmoid), top-k of s + bias (ties to the lowest index), group-limited
 * when n_group > 1, into idx (topk) with weights w from the unbiased scores
 * (router_hf: the biased ones), renormalised (+1e-20), times
 * routed_scaling_factor. taken (n_experts) holds no value equal to +-stamp
 * before the call. */
void moe_route_row(const cfg *c, float *s, const float *bias, int32_t *taken, int32_t stamp, int32_t *idx, float *w);

/* AttnRes of row t (attnres.c): softmax over the nsrc sources' (s . f) / rms(s),
 * the p-weighted sum of the raw sources into row t of out. */
void attnres_row(float *out, float *const *src, int64_t nsrc, int64_t t, int64_t n, const float *f, double eps);

/* Expert reads a layer ahead (guess.c). guess_predict: guesses layer L1's experts
 * from the residual sources as they stand (e->psrc) and asks the source to read
 * them (ranks: the best ranks per row; early: while the layer before still runs;
 * task: called inside a pool job). guess_owe: the late guess for L1 once L1 - 1
 * is done, now or owed to L1's first attention job; guess_attach: makes that job
 * run it (guess_run, from mm.c) first. No guess ever changes a value of the pass. */
void guess_predict(engine *e, int64_t L1, int64_t ranks, int early, int task);
/* guess_pick: one row's guess (k best of m scores, grouped routing as the router), appended
 * to list[n ..]; returns the new n (guess.c). */
int guess_pick(const cfg *c, const float *sc, const int32_t *id, int64_t m, int64_t k, float *gs, int32_t *mark,
               int32_t stamp, int32_t *list, int n);
/* The MTP layer over the rows of a step that has just run (mtp.c), before the
 * sequences advance: each sequence's rows whose next token the step holds, and
 * its pending row (the position before the step's first), into its MTP cache;
 * the final hidden states kept (mtp_ring). Reads res[0] (the main stream after
 * the last layer; the head has run) and leaves it overwritten. */
int mtp_pass(engine *e);
/* Unit L's matrices checked as they were used (infer.c); 0 or the failure. */
int infer_unit_check(engine *e, const wt *W, int64_t L);
void guess_owe(engine *e, int64_t L1, int64_t L_end);
void guess_attach(engine *e, mm_job *j);
void guess_run(engine *e);

/* ======================================================================= */
/* Small shared helpers                                                     */
/* ======================================================================= */

static inline int64_t i64max(int64_t a, int64_t b) { return a > b ? a : b; }

/* Replay record of one row in one KDA layer: q, k, v, alpha, beta, raw conv inputs. */
static inline int64_t rec_floats(const cfg *c) {
    const int64_t P = c->kda_heads * c->kda_head_dim;
    return 7 * P + c->kda_heads;
}

/* One KDA layer's state per sequence: conv history [3][conv_k-1][P], then the
 * recurrent state S [heads][D][D]. */
static inline int64_t kda_floats(const cfg *c) {
    int64_t P = c->kda_heads * c->kda_head_dim;
    return 3 * (c->conv_k - 1) * P + c->kda_heads * c->kda_head_dim * c->kda_head_dim;
}

static inline float sigmoidf_(float x) { return (float)(1.0 / (1.0 + exp(-(double)x))); }

/* y = w * x / sqrt(mean(x^2) + eps); sum of squares in double. y may alias x. */
static inline void rmsnorm(float *y, const float *x, const float *w, int64_t n, double eps) {
    double ss = 0;
    for (int64_t i = 0; i < n; i++) ss += (double)x[i] * x[i];
    float sc = (float)(1.0 / sqrt(ss / (double)n + eps));
    for (int64_t i = 0; i < n; i++) y[i] = (x[i] * sc) * w[i];
}

/* Converts a vector view to f32 (n values expected). */
static inline int vec_f32(float *dst, const wt *w, int64_t n) {
    if (!w->p || w->rows * w->cols < n) return -1;
    num_to_f32(dst, w->p, w->dtype, (size_t)n);
    return 0;
}

/* A failure inside a pass: the message goes to the engine (engine_step copies it
 * to every sequence of the pass, which are then broken). */
static inline int efail(engine *e, int rc, const char *fmt, ...) ST_PRINTF(3, 4);
static inline int efail(engine *e, int rc, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->err, sizeof e->err, fmt, ap);
    va_end(ap);
    return rc;
}

/* A weight source's failure, with the source's message. */
static inline int wfail(engine *e, int rc, const char *what) {
    const char *m = e->w->ops->errmsg ? e->w->ops->errmsg(e->w) : NULL;
    return efail(e, rc ? rc : STRATA_EIO, "infer: %s: %s", what, m && *m ? m : strata_errstr(rc));
}

#endif
