/*
 * infer.c: the K3 forward pass (see infer.h and docs/architecture.md, Model spec).
 *
 * Owns: engine scratch, session state (KDA conv history + delta-rule state, MLA
 * latent cache), the decoder layer with Block Attention Residuals, KDA, Gated MLA
 * (absorbed), dense SiTU-GLU and Stable LatentMoE, state files. Does not own
 * weights (wsrc), kernels (kern.h) or threads (pool.h).
 *
 * Invariants that keep results bit-identical across thread counts, weight sources
 * and prefill/decode: every matmul output is one K.matmul dot (independent of T);
 * per-head work runs on one thread; the MoE sums expert outputs per token in the
 * token's top-k order whatever order experts arrive in; norms and softmaxes are
 * single-threaded per vector; attention blocks start at fixed positions (0, 256,
 * ...), not relative to the chunk.
 *
 * KDA prefill is the sequential delta rule, not the chunked WY/UT form: the
 * recurrence costs ~8 D^2 flops per head per token (12.6 MFLOP for a K3 layer vs
 * ~700 MFLOP of projections, under 2%), the per-head state (64 KB at D = 128)
 * stays in L2 while a head walks its T tokens, and prefill then equals decode bit
 * for bit. Measured (perf, 512-token prefill of the demo preset, 1 thread):
 * kda_heads_fn 5.9% of CPU samples against 33% in the matmul kernels, so the
 * chunked form could save at most a few percent here.
 */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "infer.h"
#include "kern.h"
#include "num.h"
#include "pool.h"
#include "st.h"
#include "vfs.h"
#include "wblk.h"

#define ATT_BLOCK 256    /* attention positions scored per block (online softmax) */
#define MM_MAX_SEG 72      /* products in one matmul job: the experts of a batch plus a few */
#define MOE_BATCH 64       /* experts per batch (<= MM_MAX_SEG) */
#define MM_SITU_MACS 1000  /* SiTU of one element, in multiply-add equivalents (load balance only) */
#define ENGINE_HDR ((sizeof(engine) + 63) & ~(size_t)63) /* struct, then 64-aligned scratch */
#define MM_MIN_MACS 32768 /* below this a matmul range is not worth a thread hand-off */
#define PRED_MAX_ROWS 16   /* passes of more rows predict no experts (their union is most of a layer) */
#define PRED_CAND 8        /* x top-k router rows the late guess rescores per row (at most half the experts; moe_predict) */

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
    int32_t *ids;              /* (chunk) token of each row */
    int32_t *outr;             /* (chunk) rows whose logits are wanted, ascending */
    infer_row *rowbuf;         /* (chunk) rows of session_eval's passes */
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
    } k;
    struct {                   /* MLA */
        float *qa, *q, *kva, *g, *o; /* (T,q_lora) (T,NH*qh) (T,C) (T,NH*v) (T,NH*v) */
    } m;
    struct {                   /* MoE and dense */
        float *router, *wts, *z, *eo, *xe, *h1, *h3, *oe, *u, *sg, *su, *tmp;
        int32_t *idx, *mark, *list;
        int32_t *pairs;        /* (T * topk) token-slot pairs grouped by expert */
        int32_t *xoff, *xcur, *rem; /* per listed expert: pair offsets, fill cursor, not yet run */
        float *dg, *du;        /* dense gate/up (T, dense_inter) */
        /* the next layer's experts, predicted (moe_predict_next) */
        float *px, *pr, *pv;   /* (PR, hidden) inputs, (PR, n_experts) scores, 2 hidden + n_experts vectors */
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
    float *const *psrc;        /* the pass's AttnRes sources during the FFN (moe_predict) */
    int64_t pnsrc;
    int64_t pred_early;        /* ranks predicted while a layer's experts are read */
    int64_t pred_cand;         /* experts per row the late guess rescores (0: all) */
    int64_t L0, L1;            /* layers this engine computes (a pipeline stage: [L0, L1)) */
    const engine_link *link;   /* first stage of a pipeline: the other stages, else NULL */
    int32_t *g_slot;           /* (chunk) link slot of each group's sequence */
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
};

/* ======================================================================= */
/* Layout (shared by create and the *_bytes planners, so both stay exact)   */
/* ======================================================================= */

typedef struct { uint8_t *base; size_t off; } carve;

static void *cv(carve *c, size_t bytes) {
    size_t o = (c->off + 63) & ~(size_t)63;
    c->off = o + bytes;
    return c->base ? c->base + o : NULL;
}
#define CVF(c, n) ((float *)cv((c), (size_t)(n) * sizeof(float)))
#define CVI(c, n) ((int32_t *)cv((c), (size_t)(n) * sizeof(int32_t)))

static int64_t i64max(int64_t a, int64_t b) { return a > b ? a : b; }

static int64_t n_blocks_of(const cfg *c) { return (c->n_layers - 1) / c->attn_res_block + 1; }

/* Replay record of one row in one KDA layer: q, k, v, alpha, beta, raw conv inputs. */
static int64_t rec_floats(const cfg *c) {
    const int64_t P = c->kda_heads * c->kda_head_dim;
    return 7 * P + c->kda_heads;
}

static int64_t kda_floats(const cfg *c) {
    int64_t P = c->kda_heads * c->kda_head_dim;
    return 3 * (c->conv_k - 1) * P + c->kda_heads * c->kda_head_dim * c->kda_head_dim;
}

/* Converted vectors of one layer: two AttnRes folds, norms, KDA conv/dt/A/o_norm. */
static int64_t vec_need(const cfg *c) {
    int64_t P = c->kda_heads * c->kda_head_dim;
    int64_t kda = 3 * P * c->conv_k + P + i64max(c->kda_heads, c->kda_head_dim) + c->kda_head_dim;
    int64_t mla = c->q_lora + c->kv_lora;
    int64_t moe = c->n_experts + c->latent;
    return 4 * c->hidden + i64max(kda, i64max(mla, moe)) + 64;
}

static int64_t thr_need(const cfg *c, int64_t T) {
    /* MLA: exponentials (ATT_BLOCK doubles), scores (ATT_BLOCK), q_lat (kv_lora),
     * the chunk's latent outputs (T x kv_lora); KDA: alpha, o, 3 D conv outputs,
     * 3 D doubles. The two never run at once. */
    int64_t mla = 3 * ATT_BLOCK + c->kv_lora + T * c->kv_lora;
    return i64max(mla, 12 * c->kda_head_dim) + 64;
}

static void engine_carve(engine *e, carve *cv_) {
    const cfg *c = e->c;
    const int64_t T = e->chunk, Hd = c->hidden, P = e->P, NH = c->n_heads;
    e->kda_i = CVI(cv_, c->n_layers);
    e->mla_i = CVI(cv_, c->n_layers);
    e->g_s = (session **)cv(cv_, (size_t)T * sizeof(session *));
    e->g_r0 = (int64_t *)cv(cv_, (size_t)(T + 1) * sizeof(int64_t));
    e->g_slot = CVI(cv_, T);
    e->ids = CVI(cv_, T);
    e->outr = CVI(cv_, T);
    e->rowbuf = (infer_row *)cv(cv_, (size_t)T * sizeof(infer_row));
    e->res = (float **)cv(cv_, (size_t)(e->n_blocks + 1) * sizeof(float *));
    float *r0 = CVF(cv_, (e->n_blocks + 1) * T * Hd);
    if (e->res)
        for (int64_t i = 0; i <= e->n_blocks; i++) e->res[i] = r0 + i * T * Hd;
    e->h = CVF(cv_, T * Hd);
    e->xn = CVF(cv_, T * Hd);
    e->y = CVF(cv_, T * Hd);
    e->vec = CVF(cv_, vec_need(c));
    e->thr_floats = (thr_need(c, T) + 15) & ~(int64_t)15;
    e->thr = CVF(cv_, e->thr_floats * e->n_threads);
    /* the guesses' buffers stay out of the overlay: the late guess runs beside
     * the next layer's attention (guess_L1) */
    const int64_t PR = T < PRED_MAX_ROWS ? T : PRED_MAX_ROWS;
    e->f.px = CVF(cv_, PR * Hd);
    e->f.pr = CVF(cv_, PR * c->n_experts);
    e->f.pv = CVF(cv_, 2 * Hd + c->n_experts);
    e->f.pmark = CVI(cv_, c->n_experts);
    e->f.plist = CVI(cv_, c->n_experts);
    e->f.pc = CVI(cv_, PR * PRED_CAND * c->topk);
    e->f.ps = CVF(cv_, PR * PRED_CAND * c->topk);
    size_t start = cv_->off, end = start;
    /* KDA */
    for (int i = 0; i < 3; i++) e->k.prj[i] = CVF(cv_, T * P);
    for (int i = 0; i < 3; i++) e->k.qkv[i] = CVF(cv_, T * P);
    e->k.g = CVF(cv_, T * P);
    e->k.fa = CVF(cv_, T * c->kda_head_dim);
    e->k.z = CVF(cv_, T * P);
    e->k.b = CVF(cv_, T * c->kda_heads);
    e->k.o = CVF(cv_, T * P);
    if (cv_->off > end) end = cv_->off;
    /* MLA */
    cv_->off = start;
    e->m.qa = CVF(cv_, T * c->q_lora);
    e->m.q = CVF(cv_, T * NH * e->qh);
    e->m.kva = CVF(cv_, T * e->C);
    e->m.g = CVF(cv_, T * NH * c->v_head);
    e->m.o = CVF(cv_, T * NH * c->v_head);
    if (cv_->off > end) end = cv_->off;
    /* MoE */
    cv_->off = start;
    const int64_t S = c->n_shared * c->moe_inter;
    e->f.router = CVF(cv_, T * c->n_experts);
    e->f.idx = CVI(cv_, T * c->topk);
    e->f.wts = CVF(cv_, T * c->topk);
    e->f.z = CVF(cv_, T * c->latent);
    e->f.eo = CVF(cv_, T * c->topk * c->latent);
    e->f.xe = CVF(cv_, e->xcap * c->latent);
    e->f.h1 = CVF(cv_, e->xcap * c->moe_inter);
    e->f.h3 = CVF(cv_, e->xcap * c->moe_inter);
    e->f.oe = CVF(cv_, e->xcap * c->latent);
    e->f.u = CVF(cv_, T * c->latent);
    e->f.sg = CVF(cv_, T * (S > 0 ? S : 1));
    e->f.su = CVF(cv_, T * (S > 0 ? S : 1));
    e->f.tmp = CVF(cv_, T * Hd);
    e->f.mark = CVI(cv_, c->n_experts);
    e->f.list = CVI(cv_, c->n_experts);
    e->f.pairs = CVI(cv_, T * c->topk);
    e->f.xoff = CVI(cv_, c->n_experts + 1);
    e->f.xcur = CVI(cv_, c->n_experts);
    e->f.rem = CVI(cv_, c->n_experts);
    if (cv_->off > end) end = cv_->off;
    /* dense (overlays the MoE buffers: a layer is one or the other) */
    cv_->off = start;
    e->f.dg = CVF(cv_, T * c->dense_inter);
    e->f.du = CVF(cv_, T * c->dense_inter);
    if (cv_->off > end) end = cv_->off;
    cv_->off = end;
}

static void engine_dims(engine *e, const cfg *c, int64_t chunk, int n_threads, int64_t lo, int64_t hi) {
    memset(e, 0, sizeof *e);
    e->L0 = lo > 0 ? lo : 0;
    e->L1 = hi > 0 && hi < c->n_layers ? hi : c->n_layers;
    e->c = c;
    e->chunk = chunk > 0 ? chunk : INFER_DEFAULT_CHUNK;
    e->n_threads = n_threads > 0 ? n_threads : pool_default_threads();
    e->n_blocks = n_blocks_of(c);
    e->P = c->kda_heads * c->kda_head_dim;
    e->qh = c->qk_nope + c->qk_rope;
    e->C = c->kv_lora + c->qk_rope;
    e->xcap = e->chunk + c->topk;
    e->n_mla = e->n_kda = 0;
    for (int64_t L = e->L0; L < e->L1; L++) {
        e->n_mla += c->is_mla[L] ? 1 : 0;
        e->n_kda += c->is_mla[L] ? 0 : 1;
    }
}

uint64_t infer_engine_bytes(const cfg *c, int64_t prefill_chunk, int n_threads) {
    engine e;
    engine_dims(&e, c, prefill_chunk, n_threads, 0, 0);
    carve k = {NULL, 0};
    engine_carve(&e, &k);
    return (uint64_t)ENGINE_HDR + k.off;
}

uint64_t infer_mla_cache_bytes_per_pos(const cfg *c) {
    int64_t n_mla = 0;
    for (int64_t L = 0; L < c->n_layers; L++) n_mla += c->is_mla[L] ? 1 : 0;
    return (uint64_t)n_mla * (uint64_t)(c->kv_lora + c->qk_rope) * sizeof(float);
}

static uint64_t session_state_bytes(const cfg *c, int64_t max_ctx) {
    int64_t n_mla = 0;
    for (int64_t L = 0; L < c->n_layers; L++) n_mla += c->is_mla[L] ? 1 : 0;
    return (uint64_t)(c->n_layers - n_mla) * (uint64_t)kda_floats(c) * sizeof(float) +
           (uint64_t)max_ctx * sizeof(int32_t);
}

uint64_t infer_session_bytes(const cfg *c, int64_t max_ctx) {
    return (uint64_t)sizeof(session) + session_state_bytes(c, max_ctx) +
           (uint64_t)max_ctx * infer_mla_cache_bytes_per_pos(c);
}

uint64_t infer_session_bytes_range(const cfg *c, int64_t max_ctx, int64_t lo, int64_t hi) {
    uint64_t n_mla = 0, n_kda = 0;
    for (int64_t L = lo; L < hi && L < c->n_layers; L++) {
        n_mla += c->is_mla[L] ? 1 : 0;
        n_kda += c->is_mla[L] ? 0 : 1;
    }
    return (uint64_t)sizeof(session) + n_kda * (uint64_t)kda_floats(c) * sizeof(float) + (uint64_t)max_ctx * sizeof(int32_t) +
           (uint64_t)max_ctx * n_mla * (uint64_t)(c->kv_lora + c->qk_rope) * sizeof(float);
}

int64_t infer_blocks_before(const cfg *c, int64_t L) { return L <= 0 ? 0 : (L - 1) / c->attn_res_block + 1; }

/* ======================================================================= */
/* Small math helpers                                                       */
/* ======================================================================= */

static inline float sigmoidf_(float x) { return (float)(1.0 / (1.0 + exp(-(double)x))); }

/* y = w * x / sqrt(mean(x^2) + eps); sum of squares in double. y may alias x. */
static void rmsnorm(float *y, const float *x, const float *w, int64_t n, double eps) {
    double ss = 0;
    for (int64_t i = 0; i < n; i++) ss += (double)x[i] * x[i];
    float sc = (float)(1.0 / sqrt(ss / (double)n + eps));
    for (int64_t i = 0; i < n; i++) y[i] = (x[i] * sc) * w[i];
}

/* AttnRes over nsrc sources (row t of each (T, n) buffer): softmax over sources of
 * (s . f) / rms(s), output the p-weighted sum of the RAW sources. Every sum is in
 * double in element (then source) order; the loops below only interleave
 * independent sums (four sources' at once, eight outputs at once) so they run
 * at throughput instead of one add's latency per element: the same bits, and
 * 24 -> 15 us per call for 5 sources of 2048 (ladder's widths; isolated, cold
 * caches). It runs twice per layer and once per expert guess, on the driving
 * thread while the others wait. */
static void attn_res(float *out, float *const *src, int64_t nsrc, int64_t t, int64_t n,
                     const float *f, double eps) {
    double sc[CFG_MAX_LAYERS + 2], mx = -INFINITY, den = 0;
    int64_t s = 0;
    for (; s + 4 <= nsrc; s += 4) {
        const float *x0 = src[s] + t * n, *x1 = src[s + 1] + t * n, *x2 = src[s + 2] + t * n, *x3 = src[s + 3] + t * n;
        double q0 = 0, q1 = 0, q2 = 0, q3 = 0, d0 = 0, d1 = 0, d2 = 0, d3 = 0;
        for (int64_t i = 0; i < n; i++) {
            const double fi = f[i], v0 = x0[i], v1 = x1[i], v2 = x2[i], v3 = x3[i];
            q0 += v0 * v0; d0 += v0 * fi;
            q1 += v1 * v1; d1 += v1 * fi;
            q2 += v2 * v2; d2 += v2 * fi;
            q3 += v3 * v3; d3 += v3 * fi;
        }
        sc[s] = d0 / sqrt(q0 / (double)n + eps);
        sc[s + 1] = d1 / sqrt(q1 / (double)n + eps);
        sc[s + 2] = d2 / sqrt(q2 / (double)n + eps);
        sc[s + 3] = d3 / sqrt(q3 / (double)n + eps);
    }
    for (; s < nsrc; s++) {
        const float *x = src[s] + t * n;
        double ss = 0, d = 0;
        for (int64_t i = 0; i < n; i++) { ss += (double)x[i] * x[i]; d += (double)x[i] * f[i]; }
        sc[s] = d / sqrt(ss / (double)n + eps);
    }
    for (s = 0; s < nsrc; s++) if (sc[s] > mx) mx = sc[s];
    for (s = 0; s < nsrc; s++) { sc[s] = exp(sc[s] - mx); den += sc[s]; }
    float *o = out + t * n;
    for (s = 0; s < nsrc; s++) sc[s] /= den;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        double a[8] = {0};
        for (s = 0; s < nsrc; s++) {
            const float *x = src[s] + t * n + i;
            for (int l = 0; l < 8; l++) a[l] += sc[s] * x[l];
        }
        for (int l = 0; l < 8; l++) o[i + l] = (float)a[l];
    }
    for (; i < n; i++) {
        double a = 0;
        for (s = 0; s < nsrc; s++) a += sc[s] * src[s][t * n + i];
        o[i] = (float)a;
    }
}

/* Converts a vector view to f32 (n values expected). */
static int vec_f32(float *dst, const wt *w, int64_t n) {
    if (!w->p || w->rows * w->cols < n) return -1;
    num_to_f32(dst, w->p, w->dtype, (size_t)n);
    return 0;
}

/* ======================================================================= */
/* Matmul jobs: several y = W x products split over the pool by output rows */
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
    wblk *vw, *vu;          /* w / wu to check block by block as they are used (wt.vb), or NULL */
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
    int bad;
    char what[96];
} mm_job;

static void mm_init(mm_job *j, int64_t T) {
    j->n = 0; j->T = T; j->gs = NULL; j->gs_cost = 0; j->ck = NULL; j->n_ck = 0; j->bad = 0; j->what[0] = 0;
}
static void guess_run(engine *e);
static void guess_attach(engine *e, mm_job *j);

/* Adds y = W x with W expected (rows, cols); float dtypes only. Returns the
 * segment (its T may be changed before mm_run) or NULL on a shape error. */
static mm_seg *mm_add(mm_job *j, const wt *W, int64_t rows, int64_t cols, const float *X, int64_t ldx,
                      float *Y, int64_t ldy, const char *name) {
    if (j->bad) return NULL;
    if ((!W->p && !W->sliced) || W->rows != rows || W->cols != cols ||
        (W->dtype != DT_F32 && W->dtype != DT_BF16 && W->dtype != DT_F16)) {
        j->bad = 1;
        snprintf(j->what, sizeof j->what, "%s: expected (%lld, %lld) float, got %s (%lld, %lld)",
                 name, (long long)rows, (long long)cols, W->p ? st_dtype_name(W->dtype) : "nothing",
                 (long long)W->rows, (long long)W->cols);
        return NULL;
    }
    ST_ASSERT(j->n < MM_MAX_SEG);
    mm_seg *g = &j->seg[j->n++];
    *g = (mm_seg){W->p, NULL, NULL, NULL, W->dtype, 0, rows, cols, j->T, X, ldx, Y, NULL, ldy, W->p ? NULL : W, NULL, W->vb, NULL};
    return g;
}

static mm_seg *mm_add_mxfp4(mm_job *j, const wt *Wp, const wt *Ws, int64_t rows, int64_t cols,
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
    *g = (mm_seg){Wp->p, Ws->p, NULL, NULL, -1, -1, rows, cols, j->T, X, ldx, Y, NULL, ldy, NULL, NULL, NULL, NULL};
    return g;
}

/* Makes g a GLU segment: Wu (Wus: MXFP4 scales, else NULL) must have g's shape,
 * MXFP4 iff g is (float dtypes may differ); U (Y's layout) receives the up rows. */
static void mm_glu(mm_job *j, mm_seg *g, const wt *Wu, const wt *Wus, float *U, const char *name) {
    if (j->bad || !g) return;
    int ok = (Wu->p || Wu->sliced) && Wu->rows == g->rows && Wu->cols == g->cols;
    if (g->scales) ok = ok && Wu->p; /* experts are never sliced */
    if (g->scales) ok = ok && Wus && Wus->p && Wus->rows == g->rows && Wus->cols == g->cols / MXFP4_GROUP;
    else ok = ok && (Wu->dtype == DT_F32 || Wu->dtype == DT_BF16 || Wu->dtype == DT_F16);
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
    g->U = U;
}

static void mm_kern(const mm_seg *s, const void *w, const uint8_t *sc, int dtype, float *Y, int64_t r0, int64_t r1) {
    if (sc)
        K.matmul_mxfp4(Y, s->ldy, w, sc, s->cols, s->X, s->ldx, s->T, r0, r1);
    else
        K.matmul(Y, s->ldy, w, dtype, s->cols, s->X, s->ldx, s->T, r0, r1);
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
    mm_kern(s, s->w, s->scales, s->dtype, s->Y, a, b);
    if (!s->U) return;
    mm_kern(s, s->wu, s->su, s->udtype, s->U, a, b);
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
    pool_for(e->pool, total, MM_MIN_MACS, mm_fn, j);
}

/* ======================================================================= */
/* Engine                                                                   */
/* ======================================================================= */

int engine_create(engine **out, const cfg *c, wsrc *w, const engine_opts *o, char *err, size_t errlen) {
    *out = NULL;
    engine tmp;
    engine_dims(&tmp, c, o ? o->prefill_chunk : 0, o ? o->n_threads : 0, o ? o->layer_lo : 0, o ? o->layer_hi : 0);
    if (tmp.L0 >= tmp.L1) return base_fail(err, errlen, STRATA_EINVAL, "infer: empty layer range [%lld, %lld)", (long long)tmp.L0, (long long)tmp.L1);
    if (tmp.chunk < 1 || tmp.chunk > (1 << 20))
        return base_fail(err, errlen, STRATA_EINVAL, "infer: prefill chunk %lld out of range", (long long)tmp.chunk);
    if (c->topk < 1 || c->topk > CFG_MAX_TOPK || c->n_layers < 1 || c->n_layers > CFG_MAX_LAYERS)
        return base_fail(err, errlen, STRATA_EINVAL, "infer: config out of range");
    carve k = {NULL, 0};
    engine_carve(&tmp, &k);
    size_t bytes = ENGINE_HDR + k.off;
    uint8_t *blk = base_alloc_aligned(bytes, 64, MEM_SCRATCH);
    if (!blk)
        return base_fail(err, errlen, STRATA_ENOMEM, "infer: cannot allocate %zu bytes of engine scratch", bytes);
    memset(blk, 0, bytes);
    engine *e = (engine *)blk;
    *e = tmp;
    e->guess_L1 = -1;
    e->w = w;
    carve k2 = {blk + ENGINE_HDR, 0};
    engine_carve(e, &k2);
    int64_t ik = 0, im = 0;
    for (int64_t L = 0; L < c->n_layers; L++) {
        const int own = L >= e->L0 && L < e->L1;
        e->kda_i[L] = !own || c->is_mla[L] ? -1 : (int32_t)ik++;
        e->mla_i[L] = own && c->is_mla[L] ? (int32_t)im++ : -1;
    }
    e->spec_rows = o && o->spec_rows > 0 ? o->spec_rows : 0;
    /* half the top-k early: ladder at 4 GB, 24 tokens, two runs each: 0.13-0.15
     * s/token against 0.27-0.29 with none early (too little lead) and 0.14-0.41
     * with all 8 early (81% right: more wasted reads) */
    e->pred_early = c->topk / 2;
    e->pred_cand = PRED_CAND * c->topk < c->n_experts / 2 ? PRED_CAND * c->topk : c->n_experts / 2;
    if (e->pred_cand <= c->topk) e->pred_cand = 0;
    const int nt = e->n_threads;
    int rc = pool_create(&e->pool, nt);
    if (rc) { base_free(blk); return base_fail(err, errlen, rc, "infer: cannot start %d threads: %s", nt, strata_errstr(rc)); }
    *out = e;
    return 0;
}

void engine_free(engine *e) {
    if (!e) return;
    pool_free(e->pool);
    base_free(e);
}

int engine_threads(const engine *e) { return e->n_threads; }
void engine_set_link(engine *e, const engine_link *l) { e->link = l; }
float *engine_res(engine *e, int64_t *stride) {
    *stride = e->chunk * e->c->hidden;
    return e->res[0];
}
void engine_set_model_id(engine *e, uint64_t id) { e->model_id = id; }
static uint64_t state_id(const engine *e) { return e->model_id ? e->model_id : infer_cfg_fingerprint(e->c); }
int64_t engine_prefill_chunk(const engine *e) { return e->chunk; }
const cfg *engine_cfg(const engine *e) { return e->c; }

/* ======================================================================= */
/* Session lifetime                                                          */
/* ======================================================================= */

int session_create(session **out, engine *e, int64_t max_ctx, char *err, size_t errlen) {
    *out = NULL;
    const cfg *c = e->c;
    if (max_ctx < 1 || max_ctx > ((int64_t)1 << 32))
        return base_fail(err, errlen, STRATA_EINVAL, "infer: context %lld out of range", (long long)max_ctx);
    session *s = base_calloc(1, sizeof *s, MEM_STATE);
    if (!s) return base_fail(err, errlen, STRATA_ENOMEM, "infer: out of memory");
    s->e = e;
    s->max_ctx = max_ctx;
    s->slot = -1;
    /* this engine's layers only (all of them unless it is a pipeline stage) */
    uint64_t sb = (uint64_t)e->n_kda * (uint64_t)kda_floats(c) * sizeof(float) + (uint64_t)max_ctx * sizeof(int32_t);
    uint64_t cb = (uint64_t)max_ctx * (uint64_t)e->n_mla * (uint64_t)e->C * sizeof(float);
    s->ids = base_alloc((size_t)sb, MEM_STATE);
    if (!s->ids) goto oom;
    s->kda = (float *)(s->ids + max_ctx);
    if (cb) {
        s->cache = base_alloc((size_t)cb, MEM_KV);
        if (!s->cache) goto oom;
    }
    if (e->spec_rows > 0 && e->n_kda > 0) {
        s->spec_snap = base_alloc((size_t)(e->n_kda * kda_floats(c)) * sizeof(float), MEM_STATE);
        s->spec_rec = base_alloc((size_t)(e->spec_rows * e->n_kda * rec_floats(c)) * sizeof(float), MEM_STATE);
        if (!s->spec_snap || !s->spec_rec) goto oom;
    }
    if (e->link && e->link->seq_open(e->link->ud, &s->slot, err, errlen)) {
        session_free(s);
        return STRATA_EBUSY;
    }
    session_reset(s);
    *out = s;
    return 0;
oom:
    session_free(s);
    return base_fail(err, errlen, STRATA_ENOMEM, "infer: cannot allocate %.1f MB of session state for context %lld",
                     (double)(sb + cb) / 1e6, (long long)max_ctx);
}

void session_free(session *s) {
    if (!s) return;
    if (s->slot >= 0) s->e->link->seq_event(s->e->link->ud, s->slot, ENGINE_EV_CLOSE, 0);
    base_free(s->ids);
    base_free(s->cache);
    base_free(s->spec_snap);
    base_free(s->spec_rec);
    base_free(s);
}

void session_reset(session *s) {
    if (s->slot >= 0) s->e->link->seq_event(s->e->link->ud, s->slot, ENGINE_EV_RESET, 0);
    s->pos = 0;
    s->spec_on = 0;
    s->spec_n = 0;
    s->broken = 0;
    s->err[0] = 0;
    memset(s->kda, 0, (size_t)s->e->n_kda * (size_t)kda_floats(s->e->c) * sizeof(float));
    /* the cache is written before it is read (positions < pos only): no clear needed */
}

int64_t session_pos(const session *s) { return s->pos; }
int64_t session_max_ctx(const session *s) { return s->max_ctx; }
const int32_t *session_tokens(const session *s) { return s->ids; }
const char *session_errmsg(const session *s) { return s->err; }
void session_mark_broken(session *s, const char *why) {
    s->broken = 1;
    snprintf(s->err, sizeof s->err, "%s", why);
}

static int sfail(session *s, int rc, const char *fmt, ...) ST_PRINTF(3, 4);
static int sfail(session *s, int rc, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(s->err, sizeof s->err, fmt, ap);
    va_end(ap);
    return rc;
}

/* A failure inside a pass: the message goes to the engine (engine_step copies it
 * to every sequence of the pass, which are then broken). */
static int efail(engine *e, int rc, const char *fmt, ...) ST_PRINTF(3, 4);
static int efail(engine *e, int rc, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->err, sizeof e->err, fmt, ap);
    va_end(ap);
    return rc;
}

static int wfail(engine *e, int rc, const char *what) {
    const char *m = e->w->ops->errmsg ? e->w->ops->errmsg(e->w) : NULL;
    return efail(e, rc ? rc : STRATA_EIO, "infer: %s: %s", what, m && *m ? m : strata_errstr(rc));
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
        one.seg[0].vw = one.seg[0].vu = NULL; /* a sliced matrix is checked by the source as its slices come */
        one.n = 1;
        mm_dispatch(e, &one);
        if (s->dw) w->ops->rows_put(w, s->dw, r0, r1);
        if (s->dwu) w->ops->rows_put(w, s->dwu, r0, r1);
    }
}

/* Runs a job: the segments whose weights are in RAM in one dispatch, then each
 * segment streamed in row slices (mm_slices). */
static void mm_run(engine *e, mm_job *j) {
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

/* ======================================================================= */
/* KDA                                                                      */
/* ======================================================================= */

typedef struct {
    engine *e;
    int64_t ki;            /* index of the layer among the KDA layers */
    const float *cw[3];    /* conv weights (P, conv_k) f32 */
    const float *dtb, *alog, *onorm;
} kda_ctx;

/* A sequence's KDA block for KDA layer ki: conv history [3][conv_k-1][P], then
 * the recurrent state S [heads][D][D]. */
static float *kda_block(const session *s, int64_t ki) { return s->kda + ki * kda_floats(s->e->c); }

/* Jobs j = (group, head): one head of one sequence over that sequence's rows of
 * the pass: conv + SiLU, L2 norms, gates, delta rule, o_norm then sigmoid gate.
 * Everything it writes is this head's columns of this group's rows and this
 * sequence's state, so no row ever sees another sequence. The conv taps read the
 * sequence's own history for inputs before the pass, else the projections of
 * its earlier rows (taps oldest -> newest, one float sum in that order whatever
 * the grouping). The gates' exponentials (6 D per token) go through K.exp_f64
 * in vectors and the delta rule through K.kda_step: scalar they took 12.6% of a
 * 2-thread demo decode. */
static void kda_heads_fn(void *ctx, int64_t j0, int64_t j1, int tid) {
    const kda_ctx *x = ctx;
    engine *e = x->e;
    const cfg *c = e->c;
    const int64_t D = c->kda_head_dim, P = e->P, ck = c->conv_k, NHk = c->kda_heads;
    float *tw = e->thr + (int64_t)tid * e->thr_floats;
    float *alpha = tw, *o = tw + D, *cv = tw + 2 * D;   /* cv: the 3 D conv outputs */
    double *ex = (double *)(void *)(tw + 6 * D);        /* 3 D doubles */
    const float qscale = (float)(1.0 / sqrt((double)D));
    const float lb = (float)c->gate_lb;
    for (int64_t jj = j0; jj < j1; jj++) {
        const int64_t g = jj / NHk, h = jj % NHk, r0 = e->g_r0[g], T = e->g_r0[g + 1] - r0;
        float *blk = kda_block(e->g_s[g], x->ki);
        float *S = blk + 3 * (ck - 1) * P + h * D * D;
        const double aexp = exp((double)x->alog[h]);
        for (int64_t t = 0; t < T; t++) {
            const int64_t r = r0 + t;
            float *vq = e->k.qkv[0] + r * P + h * D, *vk = e->k.qkv[1] + r * P + h * D;
            float *vv = e->k.qkv[2] + r * P + h * D;
            /* causal depthwise conv, taps oldest -> newest, then SiLU x / (1 + e^-x) */
            for (int st = 0; st < 3; st++) {
                const float *hist = blk + st * (ck - 1) * P, *prj = e->k.prj[st] + r0 * P;
                for (int64_t i = 0; i < D; i++) {
                    const int64_t ch = h * D + i;
                    const float *wc = x->cw[st] + ch * ck;
                    float acc = 0;
                    for (int64_t k = 0; k < ck; k++) {
                        const int64_t u = t + k - (ck - 1); /* input row relative to the group */
                        acc += wc[k] * (u < 0 ? hist[(ck - 1 + u) * P + ch] : prj[u * P + ch]);
                    }
                    cv[st * D + i] = acc;
                    ex[st * D + i] = -(double)acc;
                }
            }
            K.exp_f64(ex, ex, 3 * D);
            for (int st = 0; st < 3; st++) {
                float *dst = e->k.qkv[st] + r * P + h * D;
                for (int64_t i = 0; i < D; i++) dst[i] = (float)(cv[st * D + i] / (1.0 + ex[st * D + i]));
            }
            /* L2 norm of q and k (eps inside the sqrt of the sum); q also by 1/sqrt(D) */
            double sq = 0, sk = 0;
            for (int64_t i = 0; i < D; i++) { sq += (double)vq[i] * vq[i]; sk += (double)vk[i] * vk[i]; }
            float nq = (float)(1.0 / sqrt(sq + 1e-6)), nk = (float)(1.0 / sqrt(sk + 1e-6));
            for (int64_t i = 0; i < D; i++) { vq[i] = (vq[i] * nq) * qscale; vk[i] *= nk; }
            const float beta = sigmoidf_(e->k.b[r * NHk + h]);
            /* decay alpha = exp(lb sigmoid(aexp (z + dt_bias))), per channel */
            const float *zt = e->k.z + r * P + h * D;
            const float *dtb = x->dtb + h * D;
            for (int64_t i = 0; i < D; i++) ex[i] = -aexp * ((double)zt[i] + dtb[i]);
            K.exp_f64(ex, ex, D);
            for (int64_t i = 0; i < D; i++) ex[i] = lb / (1.0 + ex[i]);
            K.exp_f64(ex, ex, D);
            for (int64_t i = 0; i < D; i++) alpha[i] = (float)ex[i];
            /* S = diag(alpha) S; S += k (beta (v - S^T k))^T; o = S^T q */
            K.kda_step(S, D, vk, vv, vq, alpha, beta, o);
            if (e->g_s[g]->spec_on) { /* what a replay of this step needs */
                const session *ss = e->g_s[g];
                float *rc = ss->spec_rec + ((ss->spec_n + t) * e->n_kda + x->ki) * rec_floats(c);
                memcpy(rc + h * D, vq, (size_t)D * sizeof(float));
                memcpy(rc + P + h * D, vk, (size_t)D * sizeof(float));
                memcpy(rc + 2 * P + h * D, vv, (size_t)D * sizeof(float));
                memcpy(rc + 3 * P + h * D, alpha, (size_t)D * sizeof(float));
                rc[4 * P + h] = beta;
            }
            /* per-head RMSNorm (o_norm) first, then the sigmoid output gate */
            float *ot = e->k.o + r * P + h * D;
            const float *gt = e->k.g + r * P + h * D;
            rmsnorm(ot, o, x->onorm, D, c->rms_eps);
            for (int64_t i = 0; i < D; i++) ex[i] = -(double)gt[i];
            K.exp_f64(ex, ex, D);
            for (int64_t i = 0; i < D; i++) ot[i] *= (float)(1.0 / (1.0 + ex[i]));
        }
    }
}

static int kda_layer(engine *e, int64_t L, const wt *W) {
    const cfg *c = e->c;
    const int64_t Hd = c->hidden, P = e->P, D = c->kda_head_dim, ck = c->conv_k, NHk = c->kda_heads, T = e->T;
    const int64_t ki = e->kda_i[L];
    /* converted small tensors */
    float *v = e->vec + 4 * Hd;
    float *cw[3] = {v, v + P * ck, v + 2 * P * ck};
    float *dtb = v + 3 * P * ck, *alog = dtb + P, *onorm = alog + i64max(NHk, D);
    static const int conv_roles[3] = {R_KDA_QCONV, R_KDA_KCONV, R_KDA_VCONV};
    for (int i = 0; i < 3; i++)
        if (vec_f32(cw[i], &W[conv_roles[i]], P * ck)) return efail(e, STRATA_EFORMAT, "infer: layer %lld: bad conv weight", (long long)L);
    if (vec_f32(dtb, &W[R_KDA_DTBIAS], P) || vec_f32(alog, &W[R_KDA_ALOG], NHk) || vec_f32(onorm, &W[R_KDA_ONORM], D))
        return efail(e, STRATA_EFORMAT, "infer: layer %lld: bad KDA vector", (long long)L);
    mm_job j;
    mm_init(&j, T);
    mm_add(&j, &W[R_KDA_Q], P, Hd, e->xn, Hd, e->k.prj[0], P, "q_proj");
    mm_add(&j, &W[R_KDA_K], P, Hd, e->xn, Hd, e->k.prj[1], P, "k_proj");
    mm_add(&j, &W[R_KDA_V], P, Hd, e->xn, Hd, e->k.prj[2], P, "v_proj");
    mm_add(&j, &W[R_KDA_G], P, Hd, e->xn, Hd, e->k.g, P, "g_proj");
    mm_add(&j, &W[R_KDA_FA], D, Hd, e->xn, Hd, e->k.fa, D, "f_a_proj");
    mm_add(&j, &W[R_KDA_B], NHk, Hd, e->xn, Hd, e->k.b, NHk, "b_proj");
    if (j.bad) return efail(e, STRATA_EFORMAT, "infer: layer %lld: %s", (long long)L, j.what);
    guess_attach(e, &j);
    mm_run(e, &j);
    mm_init(&j, T);
    mm_add(&j, &W[R_KDA_FB], P, D, e->k.fa, D, e->k.z, P, "f_b_proj");
    if (j.bad) return efail(e, STRATA_EFORMAT, "infer: layer %lld: %s", (long long)L, j.what);
    mm_run(e, &j);
    kda_ctx x = {e, ki, {cw[0], cw[1], cw[2]}, dtb, alog, onorm};
    pool_for(e->pool, e->n_grp * NHk, 1, kda_heads_fn, &x);
    /* each sequence's history becomes the last conv_k - 1 raw inputs it has seen */
    for (int64_t g = 0; g < e->n_grp; g++) {
        const int64_t r0 = e->g_r0[g], Tg = e->g_r0[g + 1] - r0, keep = ck - 1 > Tg ? ck - 1 - Tg : 0;
        session *sq = e->g_s[g];
        float *blk = kda_block(sq, ki);
        if (sq->spec_on)
            for (int64_t t = 0; t < Tg; t++) {
                float *rc = sq->spec_rec + ((sq->spec_n + t) * e->n_kda + ki) * rec_floats(c) + 4 * P + NHk;
                for (int st = 0; st < 3; st++) memcpy(rc + st * P, e->k.prj[st] + (r0 + t) * P, (size_t)P * sizeof(float));
            }
        for (int st = 0; st < 3; st++) {
            float *hist = blk + st * (ck - 1) * P;
            if (keep) memmove(hist, hist + (ck - 1 - keep) * P, (size_t)(keep * P) * sizeof(float));
            memcpy(hist + keep * P, e->k.prj[st] + (r0 + Tg - (ck - 1 - keep)) * P, (size_t)((ck - 1 - keep) * P) * sizeof(float));
        }
    }
    mm_init(&j, T);
    mm_add(&j, &W[R_KDA_O], Hd, P, e->k.o, P, e->y, Hd, "o_proj");
    if (j.bad) return efail(e, STRATA_EFORMAT, "infer: layer %lld: %s", (long long)L, j.what);
    mm_run(e, &j);
    return 0;
}

/* ======================================================================= */
/* Gated MLA, absorbed: attention runs in the kv_lora latent space          */
/* ======================================================================= */

typedef struct {
    engine *e;
    int64_t mi;           /* index of the layer among the MLA layers */
    const wt *kvb;        /* (NH * (nope + v), kv_lora) */
    int gate;
} mla_ctx;

/* This MLA layer's latent cache of a sequence: (max_ctx, C). */
static float *mla_cache(const session *s, int64_t mi) { return s->cache + mi * s->max_ctx * s->e->C; }

/* Jobs j = (group, head): one head of one sequence over its rows of the pass.
 * q_lat = W_k[h]^T q_nope straight from the kv_b rows (K.vecmat; converting
 * W_k[h] to f32 first cost as much as using it, per token at T = 1), scores
 * against that sequence's latent cache, softmax in fixed blocks of positions with
 * the block's exponentials in one K.exp_f64, the weighted latent sum (K.vecmat
 * over the cache rows), then W_v[h] and the output gate. */
static void mla_heads_fn(void *ctx, int64_t j0, int64_t j1, int tid) {
    const mla_ctx *x = ctx;
    engine *e = x->e;
    const cfg *c = e->c;
    const int64_t NH = c->n_heads, nope = c->qk_nope, rope = c->qk_rope, vh = c->v_head;
    const int64_t R = c->kv_lora, C = e->C, qh = e->qh;
    float *tw = e->thr + (int64_t)tid * e->thr_floats;
    double *ex = (double *)(void *)tw;                  /* ATT_BLOCK doubles */
    float *sc = tw + 2 * ATT_BLOCK, *ql = sc + ATT_BLOCK, *ol = ql + R;
    const float scale = (float)(1.0 / sqrt((double)(nope + rope)));
    const int dt = x->kvb->dtype;
    const size_t esz = st_dtype_size(dt);
    for (int64_t jj = j0; jj < j1; jj++) {
        const int64_t g = jj / NH, h = jj % NH, r0 = e->g_r0[g], T = e->g_r0[g + 1] - r0;
        const session *sq = e->g_s[g];
        const float *cache = mla_cache(sq, x->mi);
        const int64_t pos0 = sq->pos;
        const int64_t rk = h * (nope + vh);
        const uint8_t *wk = (const uint8_t *)x->kvb->p + (size_t)(rk * R) * esz; /* W_k[h] (nope, R) */
        for (int64_t t = 0; t < T; t++) {
            const float *qn = e->m.q + (r0 + t) * NH * qh + h * qh, *qr = qn + nope;
            /* q_lat = W_k[h]^T q_nope, rows of W_k accumulated in order */
            for (int64_t r = 0; r < R; r++) ql[r] = 0;
            K.vecmat(ql, qn, wk, dt, R, nope, R);
            /* causal softmax over positions 0..pos0+t, in fixed blocks of ATT_BLOCK */
            const int64_t ns = pos0 + t + 1;
            float *acc = ol + t * R, m = -INFINITY;
            double den = 0;
            for (int64_t b0 = 0; b0 < ns; b0 += ATT_BLOCK) {
                int64_t nb = ns - b0 < ATT_BLOCK ? ns - b0 : ATT_BLOCK;
                float bm = -INFINITY;
                for (int64_t i = 0; i < nb; i++) {
                    const float *cr = cache + (b0 + i) * C;
                    sc[i] = (K.dot(ql, cr, R) + K.dot(qr, cr + R, rope)) * scale;
                    if (sc[i] > bm) bm = sc[i];
                }
                if (b0 == 0) {
                    m = bm;
                    for (int64_t r = 0; r < R; r++) acc[r] = 0;
                } else if (bm > m) {
                    float f = (float)exp((double)m - bm);
                    for (int64_t r = 0; r < R; r++) acc[r] *= f;
                    den *= f;
                    m = bm;
                }
                /* p_i = exp(s_i - m) in place of the scores, then acc += sum_i p_i row_i */
                for (int64_t i = 0; i < nb; i++) ex[i] = (double)sc[i] - m;
                K.exp_f64(ex, ex, nb);
                for (int64_t i = 0; i < nb; i++) { sc[i] = (float)ex[i]; den += sc[i]; }
                K.vecmat(acc, sc, cache + b0 * C, DT_F32, C, nb, R);
            }
            const float inv = (float)(1.0 / den);
            for (int64_t r = 0; r < R; r++) acc[r] *= inv;
        }
        /* o[t][h] = W_v[h] ol[t]: rows nope..nope+v of head h's kv_b block */
        const uint8_t *wv = (const uint8_t *)x->kvb->p + (size_t)((rk + nope) * R) * esz;
        K.matmul(e->m.o + r0 * NH * vh + h * vh, NH * vh, wv, dt, R, ol, R, T, 0, vh);
        if (x->gate)
            for (int64_t t = 0; t < T; t++) {
                float *ot = e->m.o + (r0 + t) * NH * vh + h * vh;
                const float *gt = e->m.g + (r0 + t) * NH * vh + h * vh;
                for (int64_t i0 = 0; i0 < vh; i0 += ATT_BLOCK) {
                    const int64_t n = vh - i0 < ATT_BLOCK ? vh - i0 : ATT_BLOCK;
                    for (int64_t i = 0; i < n; i++) ex[i] = -(double)gt[i0 + i];
                    K.exp_f64(ex, ex, n);
                    for (int64_t i = 0; i < n; i++) ot[i0 + i] *= (float)(1.0 / (1.0 + ex[i]));
                }
            }
    }
}

static int mla_layer(engine *e, int64_t L, const wt *W) {
    const cfg *c = e->c;
    const int64_t Hd = c->hidden, NH = c->n_heads, R = c->kv_lora, C = e->C, vh = c->v_head, T = e->T;
    const int64_t mi = e->mla_i[L];
    float *qan = e->vec + 4 * Hd, *kvn = qan + c->q_lora;
    if (vec_f32(qan, &W[R_MLA_QA_NORM], c->q_lora) || vec_f32(kvn, &W[R_MLA_KVA_NORM], R))
        return efail(e, STRATA_EFORMAT, "infer: layer %lld: bad MLA norm", (long long)L);
    const int gate = c->mla_out_gate != 0;
    mm_job j;
    mm_init(&j, T);
    mm_add(&j, &W[R_MLA_QA], c->q_lora, Hd, e->xn, Hd, e->m.qa, c->q_lora, "q_a_proj");
    mm_add(&j, &W[R_MLA_KVA], C, Hd, e->xn, Hd, e->m.kva, C, "kv_a_proj_with_mqa");
    if (gate) mm_add(&j, &W[R_MLA_G], NH * vh, Hd, e->xn, Hd, e->m.g, NH * vh, "g_proj");
    if (j.bad) return efail(e, STRATA_EFORMAT, "infer: layer %lld: %s", (long long)L, j.what);
    guess_attach(e, &j);
    mm_run(e, &j);
    for (int64_t g = 0; g < e->n_grp; g++) {
        const session *sq = e->g_s[g];
        float *cache = mla_cache(sq, mi);
        for (int64_t t = e->g_r0[g]; t < e->g_r0[g + 1]; t++) {
            rmsnorm(e->m.qa + t * c->q_lora, e->m.qa + t * c->q_lora, qan, c->q_lora, c->rms_eps);
            /* the cache row: normed latent, then the rope slot as is (never rotated) */
            float *row = cache + (sq->pos + t - e->g_r0[g]) * C;
            rmsnorm(row, e->m.kva + t * C, kvn, R, c->rms_eps);
            memcpy(row + R, e->m.kva + t * C + R, (size_t)c->qk_rope * sizeof(float));
        }
    }
    mm_init(&j, T);
    mm_add(&j, &W[R_MLA_QB], NH * e->qh, c->q_lora, e->m.qa, c->q_lora, e->m.q, NH * e->qh, "q_b_proj");
    const wt *kvb = &W[R_MLA_KVB];
    if (!kvb->p || kvb->rows != NH * (c->qk_nope + vh) || kvb->cols != R ||
        (kvb->dtype != DT_F32 && kvb->dtype != DT_BF16 && kvb->dtype != DT_F16))
        return efail(e, STRATA_EFORMAT, "infer: layer %lld: bad kv_b_proj", (long long)L);
    if (j.bad) return efail(e, STRATA_EFORMAT, "infer: layer %lld: %s", (long long)L, j.what);
    mm_run(e, &j);
    mla_ctx x = {e, mi, kvb, gate};
    pool_for(e->pool, e->n_grp * NH, 1, mla_heads_fn, &x);
    mm_init(&j, T);
    mm_add(&j, &W[R_MLA_O], Hd, NH * vh, e->m.o, NH * vh, e->y, Hd, "o_proj");
    if (j.bad) return efail(e, STRATA_EFORMAT, "infer: layer %lld: %s", (long long)L, j.what);
    mm_run(e, &j);
    return 0;
}

/* ======================================================================= */
/* FFN: dense SiTU-GLU and Stable LatentMoE                                 */
/* ======================================================================= */

static int dense_layer(engine *e, int64_t L, const wt *W) {
    const cfg *c = e->c;
    const int64_t Hd = c->hidden, I = c->dense_inter, T = e->T;
    mm_job j;
    mm_init(&j, T);
    mm_seg *g = mm_add(&j, &W[R_DENSE_GATE], I, Hd, e->xn, Hd, e->f.dg, I, "mlp.gate_proj");
    mm_glu(&j, g, &W[R_DENSE_UP], NULL, e->f.du, "mlp.up_proj");
    if (j.bad) return efail(e, STRATA_EFORMAT, "infer: layer %lld: %s", (long long)L, j.what);
    mm_run(e, &j);
    mm_init(&j, T);
    mm_add(&j, &W[R_DENSE_DOWN], Hd, I, e->f.dg, I, e->y, Hd, "mlp.down_proj");
    if (j.bad) return efail(e, STRATA_EFORMAT, "infer: layer %lld: %s", (long long)L, j.what);
    mm_run(e, &j);
    return 0;
}

/* Router for token t: top-k of sigmoid(logit) + bias (ties to the lowest index),
 * weights from the unbiased scores, renormalised, times routed_scaling_factor. */
static void route_token(engine *e, int64_t t, const float *bias) {
    int32_t *taken = e->f.mark, stamp = (int32_t)t + 1;
    const cfg *c = e->c;
    const int64_t E = c->n_experts, k = c->topk;
    float *s = e->f.router + t * E;
    int32_t *idx = e->f.idx + t * k;
    float *w = e->f.wts + t * k;
    for (int64_t i = 0; i < E; i++) s[i] = sigmoidf_(s[i]);
    for (int64_t j = 0; j < k; j++) {
        int64_t best = -1;
        float bv = 0;
        for (int64_t i = 0; i < E; i++) {
            if (taken[i] == stamp) continue;
            float v = s[i] + bias[i];
            if (best < 0 || v > bv) { best = i; bv = v; }
        }
        idx[j] = (int32_t)best;
        taken[best] = stamp;
    }
    double sum = 0;
    for (int64_t j = 0; j < k; j++) sum += s[idx[j]];
    for (int64_t j = 0; j < k; j++) {
        double v = s[idx[j]];
        if (c->moe_renorm && k > 1) v /= sum + 1e-20;
        w[j] = (float)(v * c->routed_scale);
    }
}

/* The late guess's rescoring: router rows pc[q] (row bytes rb) . x -> ps[q], one
 * kernel dot per row, on whichever thread holds q (the same bits). On the
 * driving thread alone it took 22-24 us of each late guess (94 us in all) while
 * the other thread waited, on the pool 12-14 us (ladder at 6.2 GB, 63 tokens,
 * where the early and late guesses together are 4.6% of the decode). */
typedef struct {
    const void *w;
    size_t rb;
    int dtype;
    int64_t cols;
    const float *x;
    const int32_t *pc;
    float *ps;
} rescore_job;
#define PRED_CAND_GRAIN 8 /* rows per range: 16 KB of bf16 rows at ladder's width */
static void rescore_fn(void *ctx, int64_t q0, int64_t q1, int tid) {
    (void)tid;
    const rescore_job *j = ctx;
    /* the rows are cold: ask for all of them before the first product (one row
     * at a time ran at the latency of its misses) */
    for (int64_t q = q0; q < q1; q++)
        for (size_t o = 0; o < j->rb; o += 64) __builtin_prefetch((const uint8_t *)j->w + (size_t)j->pc[q] * j->rb + o, 0, 2);
    for (int64_t q = q0; q < q1; q++)
        K.matmul(j->ps + q, 1, (const uint8_t *)j->w + (size_t)j->pc[q] * j->rb, j->dtype, j->cols, j->x, j->cols, 1, 0, 1);
}

/* Expert reads a layer ahead. Layer L1's router input is RMSNorm(AttnRes([B...,
 * P]; f_mlp of L1); L1's post-attention norm) after L1's attention; the estimate
 * applies L1's own AttnRes fold, norm, router and bias to the sources as they
 * stand (e->psrc: the closed blocks and the partial sum P), so it lacks only
 * what is added to P before L1's FFN. It runs twice for L1 = L + 1: as soon as
 * layer L's own experts are requested (P lacks L's expert output; the best
 * `early` ranks of each row go out, read while L's experts are read and
 * computed), and once L is done (all top-k; only L1's attention is missing;
 * `early` = 0: it rescores only the early call's best pred_cand experts).
 * Measured on ladder (decode, 24 tokens, share of the experts a row chose that
 * its prediction of rank r held): early 97/94/90/86/82/76/68/55% for r = 1..8,
 * 81% of the top-k; after L 100/100/100/98/98/95/89/76%, 94%; L's FFN input
 * with L1's router (no AttnRes fold) only 50-52%. The source decides whether a
 * prediction is wanted (predict_layer: room in the cache, L1's trunk in RAM);
 * nothing here touches a value of the pass, so a guess, right or wrong, never
 * changes a bit. task: it runs inside a pool job (guess_run), so it dispatches
 * nothing of its own. */
static void moe_predict(engine *e, int64_t L1, int64_t ranks, int early, int task) {
    const cfg *c = e->c;
    wsrc *ws = e->w;
    const int64_t Hd = c->hidden, E = c->n_experts, T = e->T, k = ranks < c->topk ? ranks : c->topk;
    const int late = !early && e->f.pr_L1 == L1; /* pr holds this layer's early scores */
    e->f.pr_L1 = -1;
    if (!ws->ops->predict_layer || !ws->ops->experts_prefetch || T > PRED_MAX_ROWS || k < 1 || L1 >= c->n_layers ||
        !cfg_is_moe(c, L1))
        return;
    const wt *W1, *G;
    if (ws->ops->predict_layer(ws, L1, &W1, &G)) return;
    float *norm = e->f.pv, *fold = norm + Hd, *bias = fold + Hd;
    const wt *R = &W1[R_MOE_ROUTER];
    const int64_t C = e->pred_cand;
    /* The late guess rescores only the early guess's best C rows of the router
     * (C = 64 on ladder: 256 KB instead of 1.8 MB, read on the driving thread):
     * ladder at 6.2 GB, 32 tokens, 92.1% of the experts requested were
     * predicted, against 92.3% rescoring all 448 (C = 32: 91.5%, 16: 89.7%); the
     * late call took 105-112 us against 141-166 us (C = 32, 527-1776 calls). */
    const int can_cand = C > k && C < E && R->p && !R->vb && R->rows == E && R->cols == Hd &&
                         (R->dtype == DT_BF16 || R->dtype == DT_F16 || R->dtype == DT_F32);
    int cand = late && can_cand;
    mm_job j;
    mm_init(&j, T);
    if (!vec_f32(norm, &W1[R_POST_NORM], Hd) && !vec_f32(fold, &W1[R_MLP_RES_NORM], Hd) &&
        !vec_f32(e->f.px, &W1[R_MLP_RES_PROJ], Hd) && !vec_f32(bias, &W1[R_MOE_BIAS], E)) {
        for (int64_t i = 0; i < Hd; i++) fold[i] *= e->f.px[i];
        for (int64_t t = 0; t < T; t++) {
            attn_res(e->f.px, e->psrc, e->pnsrc, t, Hd, fold, c->rms_eps);
            rmsnorm(e->f.px + t * Hd, e->f.px + t * Hd, norm, Hd, c->rms_eps);
        }
        if (!cand && task) {
            j.bad = 1; /* no candidates: the whole router would be a job inside a job. guess_owe defers only
                        * with the early scores at hand, and predict_layer lends pinned units only (never
                        * sliced or block-checked), so only a malformed router ends here: no guess */
        } else if (!cand) {
            /* every expert's score, from the source's MXFP4 copy of the router where
             * it lends one: ladder at 6.2 GB, 0.46 instead of 1.8 MB per guess */
            if (G) mm_add_mxfp4(&j, &G[0], &G[1], E, Hd, e->f.px, Hd, e->f.pr, E, "gate (guess copy)");
            else mm_add(&j, R, E, Hd, e->f.px, Hd, e->f.pr, E, "gate");
            if (!j.bad) mm_run(e, &j);
            for (int64_t i = 0; i < T * E && !j.bad; i++) e->f.pr[i] = sigmoidf_(e->f.pr[i]) + bias[i % E];
            /* a late guess from the copy rescores its best candidates with the
             * router itself, as after an early guess */
            cand = !early && G && can_cand && !j.bad;
        }
        if (cand) {
            const size_t rb = (size_t)Hd * st_dtype_size(R->dtype);
            for (int64_t t = 0; t < T; t++) {
                const float *sc = e->f.pr + t * E;
                int32_t *pc = e->f.pc + t * C;
                float *ps = e->f.ps + t * C;
                int64_t n = 0; /* pc[0 .. n): the best early scores so far, best first */
                for (int64_t i = 0; i < E; i++) {
                    if (n == C && !(sc[i] > ps[C - 1])) continue;
                    int64_t at = n < C ? n++ : C - 1;
                    for (; at > 0 && sc[i] > ps[at - 1]; at--) { ps[at] = ps[at - 1]; pc[at] = pc[at - 1]; }
                    ps[at] = sc[i];
                    pc[at] = (int32_t)i;
                }
                rescore_job rj = {R->p, rb, R->dtype, Hd, e->f.px + t * Hd, pc, ps};
                if (task) rescore_fn(&rj, 0, C, 0); /* inside a job: no nested dispatch */
                else pool_for(e->pool, C, PRED_CAND_GRAIN, rescore_fn, &rj);
                for (int64_t q = 0; q < C; q++) ps[q] = sigmoidf_(ps[q]) + bias[pc[q]];
            }
        }
    } else {
        j.bad = 1;
    }
    ws->ops->layer_put(ws, L1);
    if (j.bad) return; /* the layer's own pass reports malformed weights */
    int32_t *mark = e->f.pmark, *list = e->f.plist;
    int n = 0;
    memset(mark, 0, (size_t)E * sizeof(int32_t));
    for (int64_t t = 0; t < T; t++) {
        /* the row's scores: every expert's, or the C candidates' (pc) */
        float *sc = cand ? e->f.ps + t * C : e->f.pr + t * E;
        const int32_t *id = cand ? e->f.pc + t * C : NULL;
        const int64_t m = cand ? C : E;
        for (int64_t r = 0; r < k; r++) { /* the r-th best, as route_token chooses */
            int64_t best = -1;
            float bv = 0;
            for (int64_t i = 0; i < m; i++) {
                const int32_t x = id ? id[i] : (int32_t)i;
                if (mark[x] == (int32_t)t + 1) continue;
                if (best < 0 || sc[i] > bv) { best = i; bv = sc[i]; }
            }
            const int32_t x = id ? id[best] : (int32_t)best;
            if (!mark[x]) list[n++] = x;
            mark[x] = (int32_t)t + 1;
        }
    }
    if (early && !cand) e->f.pr_L1 = L1;
    ws->ops->experts_prefetch(ws, L1, n, list);
}

/* The late guess for L1 once layer L1 - 1 is done. With the early guess's scores
 * at hand it only rescores their best candidates, serial work (~65 us of the 79
 * us a late guess took at 6.2 GB on ladder) during which the other thread
 * waited; it is owed instead (guess_L1) and runs as the first task of L1's first
 * attention job (guess_attach), one thread guessing while the other multiplies.
 * The guess reads only the residual sources, which that attention does not
 * touch, and writes its own buffers (outside the overlaid scratch), so the
 * pass's values are the same. Ladder at 6.2 GB, 63 tokens, 8 alternating pairs:
 * the decode outside the FFN layers (attention, serial work, guesses) took a
 * median 0.16 s less per run (-0.44 to +0.46 s; ~2.5 ms per token), the decode
 * itself within the host's noise (new / old 0.89-1.10). */
static void guess_owe(engine *e, int64_t L1, int64_t L_end) {
    if (e->draft) return;
    if (L1 < L_end && e->T <= PRED_MAX_ROWS && e->f.pr_L1 == L1 && e->pred_cand > 0) e->guess_L1 = L1;
    else moe_predict(e, L1, e->c->topk, 0, 0);
}
#define GUESS_TASK_MACS (1 << 19) /* a late guess in multiply-adds (load balance only: ~65 us) */
static void guess_attach(engine *e, mm_job *j) {
    if (e->guess_L1 < 0) return;
    j->gs = e;
    j->gs_cost = GUESS_TASK_MACS;
}
/* Runs the guess owed, inside the job it was attached to (mm_fn's first range:
 * every dispatch of a job runs it, so nothing is left owed after the job). */
static void guess_run(engine *e) {
    const int64_t L1 = e->guess_L1;
    if (L1 < 0) return;
    e->guess_L1 = -1;
    moe_predict(e, L1, e->c->topk, 0, 1);
}

/* The shared expert's down projection (SiTU output e->f.sg -> e->f.tmp): one
 * product, added either to the job that fills the first wait for an expert or
 * to the tail job, so both places compute the same dots. */
static void shared_down_add(mm_job *j, engine *e, const wt *W) {
    const int64_t Hd = e->c->hidden, S = e->c->n_shared * e->c->moe_inter;
    mm_add(j, &W[R_MOE_SH_DOWN], Hd, S, e->f.sg, S, e->f.tmp, Hd, "shared.down_proj");
}

/* Stable LatentMoE: route every row -> the union of chosen experts, streamed
 * through the source in a sliding window -> FFN per expert -> combine. The
 * window holds at most experts_capacity experts leased at once (the cache's
 * slots): an expert is released as soon as its batch is computed and the next
 * one of the union is requested in its place, so a union larger than the cache
 * is read once, in waves, and the number of rows never depends on the budget.
 * Experts run in batches: each batch's gate/up (with SiTU) is one pool dispatch
 * and its down projections a second, so a decode step costs two dispatches for
 * all its k experts and both threads stream the k experts' rows together. A
 * batch takes the experts the source already holds (expert_ready), so compute
 * overlaps reads; at least one expert per batch (waited for), at most MOE_BATCH
 * and xcap (row, slot) pairs. Outputs land per (row, slot) and each row sums its
 * slots in its own top-k order at the end, so neither the batching, the window
 * nor the other rows of the pass change a row's bits. */
static int moe_layer(engine *e, int64_t L, const wt *W) {
    const cfg *c = e->c;
    wsrc *ws = e->w;
    const int64_t Hd = c->hidden, E = c->n_experts, k = c->topk, Z = c->latent, I = c->moe_inter, T = e->T;
    const int64_t S = c->n_shared * c->moe_inter;
    float *bias = e->vec + 4 * Hd, *lnorm = bias + E;
    if (vec_f32(bias, &W[R_MOE_BIAS], E))
        return efail(e, STRATA_EFORMAT, "infer: layer %lld: bad e_score_correction_bias", (long long)L);
    if (c->latent_norm && vec_f32(lnorm, &W[R_MOE_LAT_NORM], Z))
        return efail(e, STRATA_EFORMAT, "infer: layer %lld: bad routed_expert_norm", (long long)L);
    /* the router first: the experts' reads start as soon as the rows are routed,
     * and the latent down-projection and the shared expert (gate/up with SiTU)
     * are computed while they are in flight */
    mm_job j;
    mm_init(&j, T);
    mm_add(&j, &W[R_MOE_ROUTER], E, Hd, e->xn, Hd, e->f.router, E, "gate");
    if (j.bad) return efail(e, STRATA_EFORMAT, "infer: layer %lld: %s", (long long)L, j.what);
    mm_run(e, &j);
    int32_t *mark = e->f.mark, *list = e->f.list, *off = e->f.xoff, *cur = e->f.xcur, *rem = e->f.rem;
    int32_t *pairs = e->f.pairs;
    memset(mark, 0, (size_t)E * sizeof(int32_t));
    for (int64_t t = 0; t < T; t++) route_token(e, t, bias);
    /* a draft pass keeps the chosen experts that are in RAM; the others add
     * nothing (their (row, slot) outputs are zero, idx -1) */
    if (e->draft) {
        for (int64_t i = 0; i < T * k; i++) {
            e->dst.experts++;
            if (ws->ops->expert_resident(ws, L, e->f.idx[i])) continue;
            e->dst.experts_dropped++;
            e->f.idx[i] = -1;
            memset(e->f.eo + i * Z, 0, (size_t)Z * sizeof(float));
        }
    }
    /* the union of chosen experts, each once, ascending; mark[id] = its index */
    memset(mark, 0, (size_t)E * sizeof(int32_t));
    for (int64_t i = 0; i < T * k; i++) if (e->f.idx[i] >= 0) mark[e->f.idx[i]] = 1;
    int nu = 0;
    for (int64_t i = 0; i < E; i++) if (mark[i]) { mark[i] = nu; list[nu++] = (int32_t)i; }
    /* (row, slot) pairs t*k+slot grouped by expert, ascending within each:
     * expert q's are pairs[off[q] .. off[q+1]) */
    memset(off, 0, (size_t)(nu + 1) * sizeof(int32_t));
    for (int64_t i = 0; i < T * k; i++) if (e->f.idx[i] >= 0) off[mark[e->f.idx[i]] + 1]++;
    for (int q = 0; q < nu; q++) { off[q + 1] += off[q]; cur[q] = off[q]; }
    for (int64_t i = 0; i < T * k; i++) if (e->f.idx[i] >= 0) pairs[cur[mark[e->f.idx[i]]]++] = (int32_t)i;
    /* the window: list[0 .. n_asked) requested, rem[0 .. n_rem) of them not yet run */
    int64_t cap = ws->ops->experts_capacity ? ws->ops->experts_capacity(ws) : 0;
    if (cap <= 0 || cap > nu || !ws->ops->expert_put) cap = nu;
    int n_asked = (int)cap, n_rem = 0, rc;
    for (int q = 0; q < n_asked; q++) rem[n_rem++] = q;
    if (n_asked && (rc = ws->ops->experts_request(ws, L, n_asked, list))) return wfail(e, rc, "experts_request");
    if (!e->draft) moe_predict(e, L + 1, e->pred_early, 1, 0);
    mm_init(&j, T);
    mm_add(&j, &W[R_MOE_LAT_DOWN], Z, Hd, e->xn, Hd, e->f.z, Z, "routed_expert_down_proj");
    if (S > 0) {
        mm_seg *g = mm_add(&j, &W[R_MOE_SH_GATE], S, Hd, e->xn, Hd, e->f.sg, S, "shared.gate_proj");
        mm_glu(&j, g, &W[R_MOE_SH_UP], NULL, e->f.su, "shared.up_proj");
    }
    if (j.bad) { ws->ops->experts_put(ws, L); return efail(e, STRATA_EFORMAT, "infer: layer %lld: %s", (long long)L, j.what); }
    /* the checks of the experts that have landed (wsrc checks_begin: mostly
     * those the last guess read ahead) run beside these products instead of on
     * this thread while the others wait. A check streams an expert's bytes about
     * as fast as a bf16 product streams its weights, so it costs half its bytes
     * in multiply-adds (~bytes / 2 for MXFP4; load balance only). Ladder at 6.2
     * GB, 63 tokens, 3 alternating pairs: this job plus the batches' waits for
     * experts 1.68-1.70 s before, 1.61-1.64 s after (the job +0.10-0.15 s, the
     * waits -0.17-0.23 s), ~1 ms per token: the checks and the products share
     * the memory bus, so what is won is the core that used to wait. */
    if (ws->ops->checks_begin && (j.n_ck = ws->ops->checks_begin(ws)) > 0) {
        j.ck = ws;
        j.ck_cost = 3 * I * Z * 17 / 64 + 1;
    }
    mm_run(e, &j);
    if (j.n_ck) ws->ops->checks_end(ws);
    int sh_done = 0; /* the shared expert's down projection ran while an expert was awaited */
    while (n_rem > 0) {
        /* the batch: experts already held, else the first one left (waited for) */
        const wt *ER[MOE_BATCH];
        int bq[MOE_BATCH], nb = 0;
        int64_t bp[MOE_BATCH + 1], np = 0;
        for (int pass = 0; pass < 2 && nb == 0; pass++) {
            if (pass == 1 && S > 0 && !sh_done) {
                /* nothing held yet: the shared down projection (it needs only
                 * the head job's output) fills the wait instead of the tail job,
                 * then the held experts are asked again. Ladder at 6.2 GB: ~10
                 * waits per token of ~0.5 ms (the unpredicted experts' reads,
                 * 1.7-1.9 ms each on this disk), this product ~0.13 ms; 63
                 * tokens, 3 alternating pairs: 0.16-0.18 s waited on I/O
                 * against 0.20-0.21. Its rows are the same dots either way. */
                mm_init(&j, T);
                shared_down_add(&j, e, W);
                if (j.bad) { ws->ops->experts_put(ws, L); return efail(e, STRATA_EFORMAT, "infer: layer %lld: %s", (long long)L, j.what); }
                mm_run(e, &j);
                sh_done = 1;
                pass = -1;
                continue;
            }
            for (int r = 0; r < n_rem && nb < MOE_BATCH; r++) {
                const int q = rem[r];
                const int64_t m = off[q + 1] - off[q];
                if (q < 0 || np + m > e->xcap) continue;
                if (pass == 0 && ws->ops->expert_ready && !ws->ops->expert_ready(ws, L, list[q])) continue;
                rc = ws->ops->expert_wait(ws, L, list[q], &ER[nb]);
                if (rc) { ws->ops->experts_put(ws, L); return wfail(e, rc, "expert_wait"); }
                bq[nb] = q;
                bp[nb++] = np;
                np += m;
                rem[r] = -1;
                if (pass == 1) break;
            }
        }
        bp[nb] = np;
        int keep = 0;
        for (int r = 0; r < n_rem; r++) if (rem[r] >= 0) rem[keep++] = rem[r];
        n_rem = keep;
        /* gate/up + SiTU of every expert in the batch: inputs are the row's
         * latent itself when the expert has one row, else gathered */
        mm_init(&j, 1);
        for (int b = 0; b < nb; b++) {
            const int32_t *pq = pairs + off[bq[b]];
            const int64_t m = bp[b + 1] - bp[b];
            const float *X = e->f.z + (int64_t)(pq[0] / k) * Z;
            if (m > 1) {
                for (int64_t r = 0; r < m; r++)
                    memcpy(e->f.xe + (bp[b] + r) * Z, e->f.z + (int64_t)(pq[r] / k) * Z, (size_t)Z * sizeof(float));
                X = e->f.xe + bp[b] * Z;
            }
            float *h1 = e->f.h1 + bp[b] * I, *h3 = e->f.h3 + bp[b] * I;
            j.T = m;
            if (ER[b][R_EXP_W1P].p) {
                mm_seg *g = mm_add_mxfp4(&j, &ER[b][R_EXP_W1P], &ER[b][R_EXP_W1S], I, Z, X, Z, h1, I, "expert w1");
                mm_glu(&j, g, &ER[b][R_EXP_W3P], &ER[b][R_EXP_W3S], h3, "expert w3");
            } else {
                mm_seg *g = mm_add(&j, &ER[b][R_EXP_W1], I, Z, X, Z, h1, I, "expert w1");
                mm_glu(&j, g, &ER[b][R_EXP_W3], NULL, h3, "expert w3");
            }
        }
        if (j.bad) { ws->ops->experts_put(ws, L); return efail(e, STRATA_EFORMAT, "infer: layer %lld: %s", (long long)L, j.what); }
        mm_run(e, &j);
        /* down projections straight into the (row, slot) outputs when single */
        mm_init(&j, 1);
        for (int b = 0; b < nb; b++) {
            const int64_t m = bp[b + 1] - bp[b];
            float *Y = m > 1 ? e->f.oe + bp[b] * Z : e->f.eo + (int64_t)pairs[off[bq[b]]] * Z;
            j.T = m;
            if (ER[b][R_EXP_W2P].p) mm_add_mxfp4(&j, &ER[b][R_EXP_W2P], &ER[b][R_EXP_W2S], Z, I, e->f.h1 + bp[b] * I, I, Y, Z, "expert w2");
            else mm_add(&j, &ER[b][R_EXP_W2], Z, I, e->f.h1 + bp[b] * I, I, Y, Z, "expert w2");
        }
        if (j.bad) { ws->ops->experts_put(ws, L); return efail(e, STRATA_EFORMAT, "infer: layer %lld: %s", (long long)L, j.what); }
        mm_run(e, &j);
        for (int b = 0; b < nb; b++) {
            const int64_t m = bp[b + 1] - bp[b];
            const int32_t *pq = pairs + off[bq[b]];
            for (int64_t r = 0; m > 1 && r < m; r++)
                memcpy(e->f.eo + (int64_t)pq[r] * Z, e->f.oe + (bp[b] + r) * Z, (size_t)Z * sizeof(float));
        }
        /* slide the window: release what ran, request as many of the rest */
        if (n_asked < nu) {
            for (int b = 0; b < nb; b++) ws->ops->expert_put(ws, L, list[bq[b]]);
            const int more = nu - n_asked < nb ? nu - n_asked : nb;
            if ((rc = ws->ops->experts_request(ws, L, more, list + n_asked))) return wfail(e, rc, "experts_request");
            for (int q = n_asked; q < n_asked + more; q++) rem[n_rem++] = q;
            n_asked += more;
        }
    }
    ws->ops->experts_put(ws, L);
    /* u = sum_j w_j out_j in top-k order, then the aggregate latent norm */
    for (int64_t t = 0; t < T; t++) {
        float *u = e->f.u + t * Z;
        for (int64_t sl = 0; sl < k; sl++) {
            const float w = e->f.wts[t * k + sl], *o = e->f.eo + (t * k + sl) * Z;
            if (sl == 0) for (int64_t i = 0; i < Z; i++) u[i] = w * o[i];
            else for (int64_t i = 0; i < Z; i++) u[i] += w * o[i];
        }
        if (c->latent_norm) rmsnorm(u, u, lnorm, Z, c->rms_eps);
    }
    mm_init(&j, T);
    mm_add(&j, &W[R_MOE_LAT_UP], Hd, Z, e->f.u, Z, e->y, Hd, "routed_expert_up_proj");
    if (S > 0 && !sh_done) shared_down_add(&j, e, W);
    if (j.bad) return efail(e, STRATA_EFORMAT, "infer: layer %lld: %s", (long long)L, j.what);
    mm_run(e, &j);
    if (S > 0)
        for (int64_t i = 0; i < T * Hd; i++) e->y[i] += e->f.tmp[i];
    return 0;
}

/* ======================================================================= */
/* The decoder: one chunk of T tokens at positions pos .. pos+T-1           */
/* ======================================================================= */

/* Rows of the pass whose values are not all finite: -1 when all are, else the
 * first such row. A NaN or Inf never passes silently: it would turn into garbage
 * ids (every id 0 for a NaN norm weight). */
static int64_t first_nonfinite_row(const float *x, int64_t rows, int64_t n) {
    for (int64_t t = 0; t < rows; t++) {
        float acc = 0;
        for (int64_t i = 0; i < n; i++) acc += x[t * n + i] * 0.0f; /* NaN iff some x is NaN or Inf */
        if (acc != acc) return t;
    }
    return -1;
}

static int nonfinite_fail(engine *e, int64_t row, const char *where) {
    return efail(e, STRATA_EFORMAT, "infer: %s: non-finite values (NaN or Inf) in row %lld of the pass: "
                 "the model's weights or config produce them", where, (long long)row);
}

/* Layers [L0, L1) over the e->T rows set up by engine_step (groups, ids): every
 * layer's trunk is fetched once for all rows, the experts chosen by any row once
 * per layer (the union), KDA and MLA run per sequence. The residual stream before
 * L0 is in res[0 .. infer_blocks_before(L0)], the last block the partial sum. */
/* Unit L's matrices that are checked as they are used (wt.vb): the blocks no
 * product hashed are hashed now, and a mismatch in any block of the unit is the
 * pass's error, before anything the layer computed leaves it (a corrupt weight
 * must never surface as output, nor as a non-finite value blamed on the layer). */
static int unit_check(engine *e, const wt *W, int64_t L) {
    if (e->draft) return 0;
    for (int r = 0; r < R_COUNT; r++) {
        if (!W[r].vb) continue;
        char what[48], m[900];
        if (L < e->c->n_layers) snprintf(what, sizeof what, "layer %lld", (long long)L);
        else snprintf(what, sizeof what, "head");
        int rc = wblk_check(W[r].vb, what, m, sizeof m);
        if (rc) return efail(e, rc, "infer: %s", m);
    }
    return 0;
}

/* Trunk units of a draft pass are borrowed without a hold: nothing to put back. */
#define LPUT(L) do { if (!e->draft) w->ops->layer_put(w, (L)); } while (0)
static int layers_run(engine *e, int64_t L0, int64_t L1) {
    const cfg *c = e->c;
    wsrc *w = e->w;
    const int64_t Hd = c->hidden, T = e->T;
    float *const *res = e->res;
    float *src[CFG_MAX_LAYERS + 2];
    int64_t nb = infer_blocks_before(c, L0); /* closed blocks B_0 .. B_{nb-1} = res[0 .. nb-1] */
    float *P = res[nb];        /* the partial sum */
    int P_empty = 0, rc;
    e->wrc = 0;
    e->guess_L1 = -1;
    float *fa = e->vec, *fm = e->vec + Hd, *nin = e->vec + 2 * Hd, *npost = e->vec + 3 * Hd;
    for (int64_t L = L0; L < L1; L++) {
        const wt *W;
        if (e->draft) {
            /* a draft pass runs the layers pinned in RAM and skips the rest: a
             * skipped layer adds nothing to the residual stream */
            e->dst.layers++;
            if (w->ops->layer_peek(w, L, &W)) {
                e->dst.layers_skipped++;
                if (L % c->attn_res_block == 0) {
                    ST_ASSERT(nb < e->n_blocks);
                    nb++;
                    P = res[nb];
                    memset(P, 0, (size_t)(T * Hd) * sizeof(float));
                    P_empty = 0;
                }
                continue;
            }
        } else {
            if (w->ops->hint_layer) w->ops->hint_layer(w, L + 1);
            rc = w->ops->layer_get(w, L, &W);
            if (rc) return wfail(e, rc, "layer_get");
        }
        if (vec_f32(nin, &W[R_IN_NORM], Hd) || vec_f32(npost, &W[R_POST_NORM], Hd) ||
            vec_f32(fa, &W[R_ATTN_RES_NORM], Hd) || vec_f32(fm, &W[R_MLP_RES_NORM], Hd)) {
            LPUT(L);
            return efail(e, STRATA_EFORMAT, "infer: layer %lld: bad norm vector", (long long)L);
        }
        /* fold f = res_norm * res_proj (proj converted into xn's first row as temp) */
        if (vec_f32(e->h, &W[R_ATTN_RES_PROJ], Hd) || vec_f32(e->xn, &W[R_MLP_RES_PROJ], Hd)) {
            LPUT(L);
            return efail(e, STRATA_EFORMAT, "infer: layer %lld: bad AttnRes vector", (long long)L);
        }
        for (int64_t i = 0; i < Hd; i++) { fa[i] *= e->h[i]; fm[i] *= e->xn[i]; }
        /* 1-2: h = P, or AttnRes over [B..., P] */
        for (int64_t i = 0; i < nb; i++) src[i] = res[i];
        src[nb] = P;
        if (nb == 0) memcpy(e->h, P, (size_t)(T * Hd) * sizeof(float));
        else for (int64_t t = 0; t < T; t++) attn_res(e->h, src, nb + 1, t, Hd, fa, c->rms_eps);
        /* 3: close the block */
        if (L % c->attn_res_block == 0) {
            ST_ASSERT(nb < e->n_blocks);
            nb++;
            P = res[nb];
            P_empty = 1;
        }
        /* 4-5: attention on RMSNorm(h) */
        for (int64_t t = 0; t < T; t++) rmsnorm(e->xn + t * Hd, e->h + t * Hd, nin, Hd, c->rms_eps);
        rc = c->is_mla[L] ? mla_layer(e, L, W) : kda_layer(e, L, W);
        if (!rc) rc = e->wrc; /* a sliced weight's read failed: its message is in e->err */
        if (rc) { if (unit_check(e, W, L)) rc = STRATA_ECORRUPT; LPUT(L); return rc; }
        if (P_empty) { memcpy(P, e->y, (size_t)(T * Hd) * sizeof(float)); P_empty = 0; }
        else for (int64_t i = 0; i < T * Hd; i++) P[i] += e->y[i];
        /* 6-8: FFN on RMSNorm(AttnRes([B..., P]; f_mlp)), added to P */
        for (int64_t i = 0; i < nb; i++) src[i] = res[i];
        src[nb] = P;
        for (int64_t t = 0; t < T; t++) attn_res(e->h, src, nb + 1, t, Hd, fm, c->rms_eps);
        for (int64_t t = 0; t < T; t++) rmsnorm(e->xn + t * Hd, e->h + t * Hd, npost, Hd, c->rms_eps);
        e->psrc = src;
        e->pnsrc = nb + 1;
        rc = cfg_is_moe(c, L) ? moe_layer(e, L, W) : dense_layer(e, L, W);
        if (!rc) rc = e->wrc;
        if (unit_check(e, W, L)) rc = STRATA_ECORRUPT;
        if (rc) { LPUT(L); return rc; }
        for (int64_t i = 0; i < T * Hd; i++) P[i] += e->y[i];
        guess_owe(e, L + 1, L1);
        LPUT(L);
        int64_t bad = e->draft ? -1 : first_nonfinite_row(P, T, Hd);
        if (bad >= 0) {
            char where[48];
            snprintf(where, sizeof where, "layer %lld", (long long)L);
            return nonfinite_fail(e, bad, where);
        }
    }
    return 0;
}

/* One pass over the e->T rows set up by engine_step (groups, ids, outr): the
 * embedding, this engine's layers, the other stages' (through the link), then
 * the head. Writes e->n_out rows of logits (the rows e->outr, in order) when
 * e->n_out > 0. */
static int forward_pass(engine *e, float *logits) {
    const cfg *c = e->c;
    wsrc *w = e->w;
    const int64_t Hd = c->hidden;
    float *const *res = e->res;
    float *src[CFG_MAX_LAYERS + 2];
    int rc = w->ops->embed_rows(w, (int)e->T, e->ids, res[0]);
    if (rc) return wfail(e, rc, "embed_rows");
    if ((rc = layers_run(e, 0, e->L1))) return rc;
    const int64_t nb = infer_blocks_before(c, c->n_layers);
    float *P = res[nb];
    if (e->L1 < c->n_layers) {
        if (!e->link) return efail(e, STRATA_EINVAL, "infer: layers %lld.. belong to no stage", (long long)e->L1);
        for (int64_t g = 0; g < e->n_grp; g++) e->g_slot[g] = e->g_s[g]->slot;
        const engine_pass p = {e->T, e->n_grp, e->g_slot, e->g_r0, e->ids, res[0], e->chunk * Hd, Hd,
                               infer_blocks_before(c, e->L1), nb};
        rc = e->link->pass(e->link->ud, &p, e->err, sizeof e->err);
        if (rc) return rc;
    }
    if (e->n_out == 0) return 0;
    /* head: output AttnRes, final norm, lm_head, for the rows that want logits */
    const wt *W;
    if (e->draft) {
        if (w->ops->layer_peek(w, c->n_layers, &W)) return efail(e, STRATA_EINVAL, "infer: draft pass: the head is not in RAM");
    } else {
        rc = w->ops->layer_get(w, c->n_layers, &W);
        if (rc) return wfail(e, rc, "layer_get(head)");
    }
    float *fo = e->vec, *nf = e->vec + Hd;
    if (vec_f32(fo, &W[R_OUT_RES_NORM], Hd) || vec_f32(e->xn, &W[R_OUT_RES_PROJ], Hd) || vec_f32(nf, &W[R_FINAL_NORM], Hd)) {
        LPUT(c->n_layers);
        return efail(e, STRATA_EFORMAT, "infer: bad final vectors");
    }
    for (int64_t i = 0; i < Hd; i++) fo[i] *= e->xn[i];
    for (int64_t i = 0; i < nb; i++) src[i] = res[i];
    src[nb] = P;
    /* row i of h / xn: the i-th wanted row (outr ascending, so it never overtakes) */
    for (int64_t i = 0; i < e->n_out; i++) {
        attn_res(e->h, src, nb + 1, e->outr[i], Hd, fo, c->rms_eps);
        if (e->outr[i] != i) memcpy(e->h + i * Hd, e->h + (int64_t)e->outr[i] * Hd, (size_t)Hd * sizeof(float));
        rmsnorm(e->xn + i * Hd, e->h + i * Hd, nf, Hd, c->rms_eps);
    }
    mm_job j;
    mm_init(&j, e->n_out);
    mm_add(&j, &W[R_LM_HEAD], c->vocab, Hd, e->xn, Hd, logits, c->vocab, "lm_head");
    if (j.bad) { LPUT(c->n_layers); return efail(e, STRATA_EFORMAT, "infer: %s", j.what); }
    mm_run(e, &j);
    rc = unit_check(e, W, c->n_layers);
    LPUT(c->n_layers);
    if (rc) return rc;
    if (e->wrc) return e->wrc;
    int64_t bad = e->draft ? -1 : first_nonfinite_row(logits, e->n_out, c->vocab);
    if (bad >= 0) return nonfinite_fail(e, e->outr[bad], "logits");
    return 0;
}

#undef LPUT

/* Checks a whole step before anything runs: each sequence's rows consecutive,
 * every sequence of this engine and usable, ids in the vocabulary, contexts. */
static int step_check(engine *e, const infer_row *rows, int64_t n) {
    const cfg *c = e->c;
    if (n < 1) return efail(e, STRATA_EINVAL, "infer: nothing to evaluate");
    for (int64_t i = 0; i < n; i++) {
        session *s = rows[i].s;
        if (!s || s->e != e) return efail(e, STRATA_EINVAL, "infer: row %lld: no sequence of this model", (long long)i);
        if (rows[i].id < 0 || rows[i].id >= c->vocab)
            return efail(e, STRATA_EINVAL, "infer: token id %d at row %lld outside the vocabulary [0, %lld)", rows[i].id,
                         (long long)i, (long long)c->vocab);
        if (i > 0 && rows[i - 1].s == s) continue;
        /* the first row of s's run: no earlier run of s, and its run fits */
        for (int64_t k = 0; k < i; k++)
            if (rows[k].s == s)
                return efail(e, STRATA_EINVAL, "infer: row %lld: a sequence's rows must be consecutive in a step", (long long)i);
        if (s->broken) return efail(e, STRATA_EINVAL, "infer: row %lld: the sequence failed earlier; reset it first", (long long)i);
        int64_t m = 1;
        while (i + m < n && rows[i + m].s == s) m++;
        if (s->spec_on && s->spec_n + m > e->spec_rows)
            return efail(e, STRATA_EINVAL, "infer: row %lld: %lld drafted rows exceed the %lld the engine records", (long long)i,
                         (long long)(s->spec_n + m), (long long)e->spec_rows);
        if (m > s->max_ctx - s->pos)
            return efail(e, STRATA_EINVAL, "infer: %lld tokens at position %lld exceed the context of %lld", (long long)m,
                         (long long)s->pos, (long long)s->max_ctx);
    }
    return 0;
}

/* Runs rows[0 .. n) (n <= chunk) as one pass and advances the sequences: the
 * whole forward (logits != NULL or a first stage), or this stage's layers over
 * the residual state already in res (stage = 1). */
static int step_run(engine *e, const infer_row *rows, int64_t n, float *logits, int stage) {
    e->T = n;
    e->n_grp = 0;
    e->n_out = 0;
    for (int64_t i = 0; i < n; i++) {
        if (i == 0 || rows[i].s != rows[i - 1].s) {
            e->g_s[e->n_grp] = rows[i].s;
            e->g_r0[e->n_grp++] = i;
        }
        e->ids[i] = rows[i].id;
        if (rows[i].logits) e->outr[e->n_out++] = (int32_t)i;
    }
    e->g_r0[e->n_grp] = n;
    e->f.pr_L1 = -1;
    /* the source may check the experts that land during the pass on this pass's
     * threads (wsrc_stream.c reap_experts), never outside it */
    if (e->w->ops->use_pool) e->w->ops->use_pool(e->w, e->pool);
    int rc = stage ? layers_run(e, e->L0, e->L1) : forward_pass(e, logits);
    if (e->w->ops->use_pool) e->w->ops->use_pool(e->w, NULL);
    if (rc) return rc;
    for (int64_t g = 0; g < e->n_grp; g++) {
        session *s = e->g_s[g];
        for (int64_t i = e->g_r0[g]; i < e->g_r0[g + 1]; i++) s->ids[s->pos++] = rows[i].id;
        if (s->spec_on) s->spec_n += e->g_r0[g + 1] - e->g_r0[g];
    }
    return 0;
}

int engine_step(engine *e, const infer_row *rows, int64_t n, float *logits) {
    e->err[0] = 0;
    int rc = step_check(e, rows, n);
    if (rc) return rc;
    for (int64_t i0 = 0; i0 < n; i0 += e->chunk) {
        const int64_t m = n - i0 < e->chunk ? n - i0 : e->chunk;
        rc = e->L0 ? efail(e, STRATA_EINVAL, "infer: a stage from layer %lld is driven by engine_stage_step", (long long)e->L0)
                   : step_run(e, rows + i0, m, logits, 0);
        if (rc) {
            /* every sequence of the step is left mid-update: broken until reset */
            for (int64_t i = 0; i < n; i++) {
                rows[i].s->broken = 1;
                snprintf(rows[i].s->err, sizeof rows[i].s->err, "%s", e->err);
            }
            return rc;
        }
        for (int64_t i = i0; i < i0 + m; i++) if (rows[i].logits && logits) logits += e->c->vocab;
    }
    return 0;
}

int engine_stage_step(engine *e, const infer_row *rows, int64_t n) {
    e->err[0] = 0;
    if (n > e->chunk) return efail(e, STRATA_EINVAL, "infer: %lld rows exceed the pass of %lld", (long long)n, (long long)e->chunk);
    int rc = step_check(e, rows, n);
    if (rc) return rc;
    rc = step_run(e, rows, n, NULL, 1);
    if (rc)
        for (int64_t i = 0; i < n; i++) {
            rows[i].s->broken = 1;
            snprintf(rows[i].s->err, sizeof rows[i].s->err, "%s", e->err);
        }
    return rc;
}

const char *engine_errmsg(const engine *e) { return e->err; }

int engine_can_draft(const engine *e) {
    const wsrc_ops *o = e->w->ops;
    const wt *W;
    if (!o->draft_mode || !o->layer_peek || !o->expert_resident) return 0;
    if (e->link || e->L0 > 0 || e->L1 < e->c->n_layers) return 0; /* a pipeline stage: layers live elsewhere */
    if (o->layer_peek(e->w, e->c->n_layers, &W)) return 0; /* the head streams */
    for (int64_t L = 0; L < e->c->n_layers; L++) if (!o->layer_peek(e->w, L, &W)) return 1;
    return 0;
}

int engine_draft_step(engine *e, const infer_row *rows, int64_t n, float *logits) {
    if (!engine_can_draft(e)) return efail(e, STRATA_EINVAL, "infer: this placement cannot draft from RAM");
    e->err[0] = 0;
    int rc = step_check(e, rows, n);
    if (rc) return rc;
    for (int64_t i = 0; i < n; i++)
        if (!rows[i].s->spec_on) return efail(e, STRATA_EINVAL, "infer: a draft pass needs session_spec_begin first");
    if ((rc = e->w->ops->draft_mode(e->w, 1))) return efail(e, rc, "infer: the weight source cannot draft");
    e->draft = 1;
    for (int64_t i0 = 0; i0 < n && !rc; i0 += e->chunk) {
        const int64_t m = n - i0 < e->chunk ? n - i0 : e->chunk;
        rc = step_run(e, rows + i0, m, logits, 0);
        for (int64_t i = i0; i < i0 + m && !rc; i++) if (rows[i].logits && logits) logits += e->c->vocab;
    }
    e->draft = 0;
    e->w->ops->draft_mode(e->w, 0);
    e->dst.passes++;
    return rc; /* the sequences are left as they were: session_spec_end rolls the rows back */
}

void engine_draft_stats_get(const engine *e, engine_draft_stats *out) { *out = e->dst; }
void engine_draft_stats_reset(engine *e) { memset(&e->dst, 0, sizeof e->dst); }

int session_spec_begin(session *s) {
    engine *e = s->e;
    if (e->spec_rows < 1) return sfail(s, STRATA_EINVAL, "infer: the engine records no drafted rows (spec_rows 0)");
    if (s->broken) return sfail(s, STRATA_EINVAL, "infer: session failed earlier; reset it first");
    if (e->n_kda) memcpy(s->spec_snap, s->kda, (size_t)(e->n_kda * kda_floats(e->c)) * sizeof(float));
    s->spec_pos0 = s->pos;
    s->spec_n = 0;
    s->spec_on = 1;
    if (s->slot >= 0) e->link->seq_event(e->link->ud, s->slot, ENGINE_EV_SPEC_BEGIN, 0);
    return 0;
}

/* Keeps the first `keep` rows evaluated since session_spec_begin. The MLA cache
 * needs only the position cut (rows past it are never read); each KDA layer's
 * state is the snapshot with the kept rows' recurrence replayed from their
 * records (the same kernel on the same inputs: the same bits as if only those
 * rows had run), and its conv history the last conv_k - 1 raw inputs of
 * snapshot + kept rows. No weight is read. */
int session_spec_end(session *s, int64_t keep) {
    engine *e = s->e;
    const cfg *c = e->c;
    if (!s->spec_on) return sfail(s, STRATA_EINVAL, "infer: no speculation in progress");
    if (keep < 0 || keep > s->spec_n) return sfail(s, STRATA_EINVAL, "infer: cannot keep %lld of %lld rows", (long long)keep, (long long)s->spec_n);
    s->spec_on = 0;
    if (s->slot >= 0) e->link->seq_event(e->link->ud, s->slot, ENGINE_EV_SPEC_END, keep);
    if (keep == s->spec_n) return 0;
    const int64_t P = e->P, D = c->kda_head_dim, NHk = c->kda_heads, ck = c->conv_k, kf = kda_floats(c), rf = rec_floats(c);
    float *o = e->thr; /* D floats of scratch: no pass is running */
    for (int64_t ki = 0; ki < e->n_kda; ki++) {
        float *blk = s->kda + ki * kf;
        const float *snap = s->spec_snap + ki * kf;
        memcpy(blk + 3 * (ck - 1) * P, snap + 3 * (ck - 1) * P, (size_t)(NHk * D * D) * sizeof(float));
        for (int64_t t = 0; t < keep; t++) {
            const float *rc = s->spec_rec + (t * e->n_kda + ki) * rf;
            for (int64_t h = 0; h < NHk; h++)
                K.kda_step(blk + 3 * (ck - 1) * P + h * D * D, D, rc + P + h * D, rc + 2 * P + h * D, rc + h * D, rc + 3 * P + h * D,
                           rc[4 * P + h], o);
        }
        /* conv history: the last conv_k - 1 of [snapshot history; kept rows' inputs] */
        for (int st = 0; st < 3; st++) {
            float *hist = blk + st * (ck - 1) * P;
            const float *sh = snap + st * (ck - 1) * P;
            for (int64_t j = 0; j < ck - 1; j++) {
                const int64_t u = keep - (ck - 1) + j; /* input index relative to the kept rows */
                const float *src = u < 0 ? sh + (ck - 1 + u) * P : s->spec_rec + (u * e->n_kda + ki) * rf + 4 * P + NHk + st * P;
                memcpy(hist + j * P, src, (size_t)P * sizeof(float));
            }
        }
    }
    s->pos = s->spec_pos0 + keep;
    return 0;
}

uint64_t infer_session_spec_bytes(const cfg *c, int64_t spec_rows) {
    if (spec_rows < 1) return 0;
    int64_t n_mla = 0;
    for (int64_t L = 0; L < c->n_layers; L++) n_mla += c->is_mla[L] ? 1 : 0;
    const uint64_t n_kda = (uint64_t)(c->n_layers - n_mla);
    return n_kda * ((uint64_t)kda_floats(c) + (uint64_t)spec_rows * (uint64_t)rec_floats(c)) * sizeof(float);
}

/* The state of s's first pos positions as regions (see infer.h). */
int session_parts(session *s, int64_t pos, session_part *parts, int max) {
    engine *e = s->e;
    if (pos < 0 || pos > s->max_ctx || max < 2 + (int)e->n_mla) return -1;
    int n = 0;
    parts[n++] = (session_part){s->ids, (size_t)pos * sizeof(int32_t)};
    parts[n++] = (session_part){s->kda, (size_t)e->n_kda * (size_t)kda_floats(e->c) * sizeof(float)};
    for (int64_t i = 0; i < e->n_mla; i++)
        parts[n++] = (session_part){s->cache + i * s->max_ctx * e->C, (size_t)(pos * e->C) * sizeof(float)};
    return n;
}

int session_broken(const session *s) { return s->broken; }

void session_restored(session *s, int64_t pos) {
    s->pos = pos;
    s->spec_on = 0;
    s->spec_n = 0;
    s->broken = 0;
    s->err[0] = 0;
}

int session_eval(session *s, const int32_t *ids, int64_t n, float *logits) {
    engine *e = s->e;
    const cfg *c = e->c;
    if (s->broken) return sfail(s, STRATA_EINVAL, "infer: session failed earlier; reset it first");
    if (n < 1) return sfail(s, STRATA_EINVAL, "infer: nothing to evaluate");
    if (n > s->max_ctx - s->pos)
        return sfail(s, STRATA_EINVAL, "infer: %lld tokens at position %lld exceed the context of %lld",
                     (long long)n, (long long)s->pos, (long long)s->max_ctx);
    for (int64_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= c->vocab)
            return sfail(s, STRATA_EINVAL, "infer: token id %d at %lld outside the vocabulary [0, %lld)",
                         ids[i], (long long)i, (long long)c->vocab);
    for (int64_t i0 = 0; i0 < n; i0 += e->chunk) {
        const int64_t T = n - i0 < e->chunk ? n - i0 : e->chunk;
        for (int64_t i = 0; i < T; i++)
            e->rowbuf[i] = (infer_row){s, ids[i0 + i], logits && i0 + i == n - 1};
        int rc = engine_step(e, e->rowbuf, T, logits);
        if (rc) {
            if (!s->err[0]) snprintf(s->err, sizeof s->err, "%s", e->err);
            return rc;
        }
    }
    return 0;
}

int session_eval_full(session *s, const int32_t *ids, int64_t n, float *logits) {
    session_reset(s);
    return session_eval(s, ids, n, logits);
}

/* ======================================================================= */
/* State files                                                              */
/* ======================================================================= */

#define STATE_MAGIC "STRS"
#define STATE_VERSION 3u /* 2: the id is the model's identity (config + tensor table + data samples); 3: ... + every weight byte (ident.h) */

uint64_t infer_cfg_fingerprint(const cfg *c) {
    int64_t f[] = {c->hidden, c->n_layers, c->vocab, c->kda_heads, c->kda_head_dim, c->conv_k,
                   c->n_heads, c->q_lora, c->kv_lora, c->qk_nope, c->qk_rope, c->v_head,
                   c->n_experts, c->topk, c->n_shared, c->latent, c->moe_inter, c->first_dense,
                   c->dense_inter, c->attn_res_block};
    uint64_t h = base_fnv1a(f, sizeof f, BASE_FNV_INIT);
    return base_fnv1a(c->is_mla, (size_t)c->n_layers, h);
}

/* State files are read and written through vfs.h (fault injection reaches them). */
typedef struct { int fd; uint64_t h; int err_no; } wstream;

static void ws_put(wstream *w, const void *p, size_t n) {
    if (w->err_no || n == 0) return;
    w->h = base_fnv1a(p, n, w->h);
    w->err_no = vfs_write_full(w->fd, p, n);
}

int session_save(session *s, const char *path, char *err, size_t errlen) {
    engine *e = s->e;
    const cfg *c = e->c;
    if (s->broken) return base_fail(err, errlen, STRATA_EINVAL, "infer: cannot save a failed session");
    if (e->L0 != 0 || e->L1 != c->n_layers)
        return base_fail(err, errlen, STRATA_EINVAL, "infer: state files are not supported across ranks (this process holds layers %lld-%lld)",
                         (long long)e->L0, (long long)e->L1 - 1);
    char tmp[4096];
    struct stat sb;
    /* never rename over a device, a FIFO or a directory that happens to be there */
    if (stat(path, &sb) == 0 && !S_ISREG(sb.st_mode))
        return base_fail(err, errlen, STRATA_EINVAL, "%s: exists and is not a regular file; not overwritten", path);
    if (snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid()) >= (int)sizeof tmp)
        return base_fail(err, errlen, STRATA_EINVAL, "%s: path too long", path);
    int fd = vfs_open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return base_fail(err, errlen, STRATA_EIO, "%s: %s", tmp, strerror(errno));
    wstream w = {fd, BASE_FNV_INIT, 0};
    uint32_t ver = STATE_VERSION;
    uint64_t fp = state_id(e);
    int64_t pos = s->pos;
    ws_put(&w, STATE_MAGIC, 4);
    ws_put(&w, &ver, 4);
    ws_put(&w, &fp, 8);
    ws_put(&w, &pos, 8);
    ws_put(&w, s->ids, (size_t)pos * sizeof(int32_t));
    ws_put(&w, s->kda, (size_t)e->n_kda * (size_t)kda_floats(c) * sizeof(float));
    for (int64_t i = 0; i < e->n_mla; i++)
        ws_put(&w, s->cache + i * s->max_ctx * e->C, (size_t)(pos * e->C) * sizeof(float));
    uint64_t h = w.h;
    ws_put(&w, &h, 8);
    if (!w.err_no && vfs_fsync(fd)) w.err_no = errno;
    if (close(fd) && !w.err_no) w.err_no = errno;
    if (!w.err_no && vfs_rename(tmp, path)) w.err_no = errno;
    if (w.err_no) {
        unlink(tmp);
        return base_fail(err, errlen, STRATA_EIO, "%s: write failed: %s", path, strerror(w.err_no));
    }
    return 0;
}

typedef struct {
    int fd;
    uint64_t off, h;
    int bad, err_no;
    int64_t nonfinite;    /* file offset of the first non-finite float, or -1 */
    const char *nf_where; /* which part of the state holds it */
} rstream;

/* n bytes at the cursor; bad at end of file, err_no too on an I/O error */
static void rs_raw(rstream *r, void *p, size_t n) {
    if (r->bad || n == 0) return;
    int e = vfs_pread_full(r->fd, p, n, r->off);
    if (e) { r->bad = 1; r->err_no = e > 0 ? e : 0; return; }
    r->off += n;
}

static void rs_get(rstream *r, void *p, size_t n) {
    rs_raw(r, p, n);
    if (!r->bad) r->h = base_fnv1a(p, n, r->h);
}

/* Notes the first non-finite float of the n bytes just read at file offset off
 * (n is a multiple of 4: the floats are 4-byte aligned in the file). */
static void rs_scan(rstream *r, const void *p, size_t n, uint64_t off, const char *where) {
    if (r->bad || r->nonfinite >= 0 || !where) return;
    for (size_t i = 0; i + sizeof(float) <= n; i += sizeof(float)) {
        float x;
        memcpy(&x, (const uint8_t *)p + i, sizeof x);
        if (!isfinite(x)) { r->nonfinite = (int64_t)(off + i); r->nf_where = where; return; }
    }
}

/* Reads n bytes into p (or, with p NULL, through a bounce buffer: the
 * validation pass), hashing them. floats names the part when the bytes are
 * floats, which are then checked to be finite; NULL for other bytes. */
static void rs_take(rstream *r, void *p, size_t n, const char *floats) {
    if (p) {
        const uint64_t off = r->off;
        rs_get(r, p, n);
        rs_scan(r, p, n, off, floats);
        return;
    }
    float tmp[2048];
    while (n && !r->bad) {
        size_t k = n < sizeof tmp ? n : sizeof tmp;
        const uint64_t off = r->off;
        rs_get(r, tmp, k);
        rs_scan(r, tmp, k, off, floats);
        n -= k;
    }
}

/* One pass over a state file: header checks, then the body into s (apply = 1)
 * or only hashed (apply = 0). Returns 0 or an error in err. */
static int load_pass(session *s, int fd, const char *path, int apply, int64_t *pos_out, char *err, size_t errlen) {
    engine *e = s->e;
    const cfg *c = e->c;
    rstream r = {fd, 0, BASE_FNV_INIT, 0, 0, -1, NULL};
    char magic[4];
    uint32_t ver = 0;
    uint64_t fp = 0, h = 0;
    int64_t pos = -1;
    rs_get(&r, magic, 4);
    rs_get(&r, &ver, 4);
    rs_get(&r, &fp, 8);
    rs_get(&r, &pos, 8);
    if (r.err_no) return base_fail(err, errlen, STRATA_EIO, "%s: read failed: %s", path, strerror(r.err_no));
    if (r.bad || memcmp(magic, STATE_MAGIC, 4)) return base_fail(err, errlen, STRATA_EFORMAT, "%s: not a strata session state file", path);
    if (ver != STATE_VERSION)
        return base_fail(err, errlen, STRATA_EFORMAT, "%s: state version %u, this build reads %u", path, ver, STATE_VERSION);
    if (fp != state_id(e))
        return base_fail(err, errlen, STRATA_EFORMAT, "%s: state was saved for a different model (its weights or configuration differ)", path);
    if (pos < 0 || pos > s->max_ctx)
        return base_fail(err, errlen, STRATA_EINVAL, "%s: state holds %lld positions, the session only %lld", path,
                         (long long)pos, (long long)s->max_ctx);
    rs_take(&r, apply ? s->ids : NULL, (size_t)pos * sizeof(int32_t), NULL);
    rs_take(&r, apply ? s->kda : NULL, (size_t)e->n_kda * (size_t)kda_floats(c) * sizeof(float), "KDA state");
    for (int64_t i = 0; i < e->n_mla; i++)
        rs_take(&r, apply ? s->cache + i * s->max_ctx * e->C : NULL, (size_t)(pos * e->C) * sizeof(float), "MLA cache");
    uint64_t want = r.h;
    rs_raw(&r, &h, 8);
    if (r.err_no) return base_fail(err, errlen, STRATA_EIO, "%s: read failed: %s", path, strerror(r.err_no));
    if (r.bad) return base_fail(err, errlen, STRATA_EFORMAT, "%s: truncated state file", path);
    if (h != want) return base_fail(err, errlen, STRATA_ECORRUPT, "%s: state checksum mismatch", path);
    /* The state ends with its checksum: more bytes mean the file is not the one
     * that was saved (appended to, or two files joined). */
    struct stat sb;
    if (fstat(fd, &sb)) return base_fail(err, errlen, STRATA_EIO, "%s: %s", path, strerror(errno));
    if ((uint64_t)sb.st_size > r.off)
        return base_fail(err, errlen, STRATA_EFORMAT, "%s: %llu bytes after the end of the state (the state is %llu bytes, "
                         "the file %llu): not a file strata saved", path,
                         (unsigned long long)((uint64_t)sb.st_size - r.off), (unsigned long long)r.off,
                         (unsigned long long)sb.st_size);
    /* A state strata saved is finite (a session that produced NaN fails and
     * cannot be saved): NaN or Inf here would surface later as non-finite
     * logits blamed on the weights. */
    if (r.nonfinite >= 0)
        return base_fail(err, errlen, STRATA_EFORMAT, "%s: the state's %s holds a non-finite value (NaN or Inf) at byte %lld: "
                         "not a state strata saved", path, r.nf_where, (long long)r.nonfinite);
    *pos_out = pos;
    return 0;
}

/* Validates the whole file first (header, size, checksum) without touching the
 * session, then reads it in: a bad file leaves the session exactly as it was. */
int session_load(session *s, const char *path, char *err, size_t errlen) {
    const cfg *c = s->e->c;
    if (s->e->L0 != 0 || s->e->L1 != c->n_layers)
        return base_fail(err, errlen, STRATA_EINVAL, "infer: state files are not supported across ranks (this process holds layers %lld-%lld)",
                         (long long)s->e->L0, (long long)s->e->L1 - 1);
    int fd = vfs_open(path, O_RDONLY | O_CLOEXEC, 0);
    if (fd < 0) return base_fail(err, errlen, STRATA_EIO, "%s: %s", path, strerror(errno));
    int64_t pos = 0;
    int rc = load_pass(s, fd, path, 0, &pos, err, errlen);
    if (!rc) {
        /* ids are checked before anything is applied: read them once more */
        int32_t buf[1024];
        for (int64_t i = 0; !rc && i < pos; i += 1024) {
            const size_t k = (size_t)(pos - i < 1024 ? pos - i : 1024);
            int en = vfs_pread_full(fd, buf, k * sizeof(int32_t), 24 + (uint64_t)i * sizeof(int32_t));
            if (en) {
                rc = base_fail(err, errlen, STRATA_EIO, "%s: read failed: %s", path, en > 0 ? strerror(en) : "end of file");
                break;
            }
            for (size_t j = 0; j < k; j++)
                if (buf[j] < 0 || buf[j] >= c->vocab) { rc = base_fail(err, errlen, STRATA_EFORMAT, "%s: token id out of range", path); break; }
        }
    }
    if (!rc) {
        session_reset(s);
        rc = load_pass(s, fd, path, 1, &pos, err, errlen);
        if (rc) {
            /* the file changed under us between the passes, or a read failed: the
             * old state is gone, so the session is left empty, and says so */
            session_reset(s);
            size_t k = strlen(err ? err : "");
            if (err && k + 1 < errlen) snprintf(err + k, errlen - k, " (the session was reset)");
        } else {
            s->pos = pos;
        }
    }
    close(fd);
    return rc;
}
