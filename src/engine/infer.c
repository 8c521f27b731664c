/*
 * infer.c: the K3 forward pass (see infer.h and docs/architecture.md, Model spec): the engine
 * and its sessions, and the decoder that runs the architecture blocks.
 *
 * Owns: engine scratch (carved once: engine_carve, shared with the *_bytes
 * planners), session state (KDA conv history + delta-rule state, MLA latent
 * cache), the layer loop with Block Attention Residuals (layers_run), the head
 * (forward_pass), steps over rows of several sequences and speculation; state
 * files are infer_state.c's. The blocks a layer runs are files of their own (engine_int.h lists
 * them): kda.c, mla.c, dense.c, moe.c, with mm.c's matmul jobs and guess.c's
 * expert reads a layer ahead. Does not own weights (wsrc), kernels (kern.h) or
 * threads (pool.h).
 *
 * Per layer L (docs/architecture.md, Decoder layer with Block Attention Residuals), with sources [B_0 .. B_{n-1}, P]:
 *   h = P (first layer) or AttnRes([B..., P]; f_attn);  close a block every
 *   attn_res_block layers;  P += attention(RMSNorm(h))  (KDA or MLA)
 *   P += FFN(RMSNorm(AttnRes([B..., P]; f_mlp)))  (dense or MoE)
 * and the head: logits = lm_head RMSNorm(AttnRes([B..., P]; f_out)).
 *
 * Invariants that keep results bit-identical across thread counts, weight sources
 * and prefill/decode: every matmul output is one K.matmul dot (independent of T);
 * per-head work runs on one thread; the MoE sums expert outputs per token in the
 * token's top-k order whatever order experts arrive in; norms and softmaxes are
 * single-threaded per vector; attention blocks start at fixed positions (0, 256,
 * ...), not relative to the chunk.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>
#include "engine_int.h"
#include "infer.h"
#include "kern.h"
#include "num.h"
#include "pool.h"
#include "st.h"
#include "wblk.h"

#define ENGINE_HDR ((sizeof(engine) + 63) & ~(size_t)63) /* struct, then 64-aligned scratch */

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

/* Block AttnRes snapshots; none with a plain residual (the stream is res[0]). */
static int64_t n_blocks_of(const cfg *c) { return c->plain_res ? 0 : (c->n_layers - 1) / c->attn_res_block + 1; }

/* Converted vectors of one layer: two AttnRes folds, norms, KDA conv/dt/A/o_norm. */
static int64_t vec_need(const cfg *c) {
    int64_t P = c->kda_heads * c->kda_head_dim;
    int64_t kda = 3 * P * c->conv_k + P + i64max(c->kda_heads, c->kda_head_dim) + c->kda_head_dim;
    /* MLA: q_a and kv_a norms, then (mla_rope) 3 x rope/2 doubles of RoPE tables */
    int64_t mla = c->q_lora + c->kv_lora + (c->mla_rope ? 3 * c->qk_rope + 2 : 0);
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
    e->g_pos = (int64_t *)cv(cv_, (size_t)T * sizeof(int64_t));
    if (e->mtp) e->mtp_x = CVF(cv_, T * 2 * Hd);
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
    e->f.pg = CVF(cv_, 2 * (c->n_group > 1 ? c->n_group : 1));
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
    if (c->kda_g_lowrank) e->k.ga = CVF(cv_, T * c->kda_head_dim);
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
    /* an FP8 kv_b_proj is decoded once per layer step: the absorbed attention
     * takes W_k and W_v apart by head (vecmat, sub-matrices) */
    e->m.kvb = c->wf & SW_TRUNK_FP8 ? CVF(cv_, NH * (c->qk_nope + c->v_head) * c->kv_lora) : NULL;
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
    e->n_main = cfg_main_layers(c);
    e->L0 = lo > 0 ? lo : 0;
    e->L1 = hi > 0 && hi < e->n_main ? hi : e->n_main;
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
    /* the MTP layer runs beside a whole model only (not in a pipeline stage) */
    e->mtp = c->mtp && e->L0 == 0 && e->L1 == e->n_main;
    e->n_mla += e->mtp;
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

/* The MTP layer's hidden rows per sequence: the ring (spec_rows + 1) and the
 * chain row; infer_session_bytes counts two, infer_session_spec_bytes the rest. */
static uint64_t mtp_rows_bytes(const cfg *c, int64_t rows) { return c->mtp ? (uint64_t)rows * (uint64_t)c->hidden * sizeof(float) : 0; }

uint64_t infer_session_bytes(const cfg *c, int64_t max_ctx) {
    return (uint64_t)sizeof(session) + session_state_bytes(c, max_ctx) +
           (uint64_t)max_ctx * infer_mla_cache_bytes_per_pos(c) + mtp_rows_bytes(c, 2);
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

int64_t infer_blocks_before(const cfg *c, int64_t L) { return L <= 0 || c->plain_res ? 0 : (L - 1) / c->attn_res_block + 1; }

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
        const int own = (L >= e->L0 && L < e->L1) || (e->mtp && L == e->n_main);
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
    if (e->mtp) {
        s->mtp_cap = e->spec_rows + 1;
        s->mtp_ring = base_alloc((size_t)((s->mtp_cap + 1) * c->hidden) * sizeof(float), MEM_STATE);
        if (!s->mtp_ring) goto oom;
        s->mtp_ch = s->mtp_ring + s->mtp_cap * c->hidden;
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
    base_free(s->mtp_ring);
    base_free(s);
}

void session_reset(session *s) {
    if (s->slot >= 0) s->e->link->seq_event(s->e->link->ud, s->slot, ENGINE_EV_RESET, 0);
    s->pos = 0;
    s->spec_on = 0;
    s->spec_n = 0;
    s->broken = 0;
    s->err[0] = 0;
    s->mtp_pos = 0;
    s->mtp_depth = -1;
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
int infer_unit_check(engine *e, const wt *W, int64_t L) {
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
/* Steps 6-8 of layer L, shared by both residual forms: the FFN (MoE or dense) on
 * e->xn (its input already normed; src[0 .. n_src) are the sources the guesses
 * rescore), added to the stream P, the unit put back, the rows checked for
 * non-finite values. 0, or the failure (the unit is put back either way). */
static int ffn_step(engine *e, int64_t L, int64_t L1, const wt *W, float **src, int64_t n_src, float *P) {
    const cfg *c = e->c;
    wsrc *w = e->w;
    const int64_t Hd = c->hidden, T = e->T;
    e->psrc = src;
    e->pnsrc = n_src;
    int rc = cfg_is_moe(c, L) ? moe_layer(e, L, W) : dense_layer(e, L, W);
    if (!rc) rc = e->wrc;
    if (infer_unit_check(e, W, L)) rc = STRATA_ECORRUPT;
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
    return 0;
}
/* Layers [L0, L1) with a plain pre-norm residual (cfg plain_res: Kimi Linear):
 * the stream h is res[0] and each layer adds h += attn(RMSNorm(h; in)), then
 * h += FFN(RMSNorm(h; post)). The same fetch, check and failure rules as
 * layers_run. A draft pass skips a layer not in RAM (it adds nothing). */
static int layers_run_plain(engine *e, int64_t L0, int64_t L1) {
    const cfg *c = e->c;
    wsrc *w = e->w;
    const int64_t Hd = c->hidden, T = e->T;
    float *P = e->res[0];
    float *nin = e->vec + 2 * Hd, *npost = e->vec + 3 * Hd;
    float *src[1] = {P};
    int rc;
    e->wrc = 0;
    e->guess_L1 = -1;
    for (int64_t L = L0; L < L1; L++) {
        const wt *W;
        if (e->draft) {
            e->dst.layers++;
            if (w->ops->layer_peek(w, L, &W)) { e->dst.layers_skipped++; continue; }
        } else {
            if (w->ops->hint_layer) w->ops->hint_layer(w, L + 1);
            rc = w->ops->layer_get(w, L, &W);
            if (rc) return wfail(e, rc, "layer_get");
        }
        if (vec_f32(nin, &W[R_IN_NORM], Hd) || vec_f32(npost, &W[R_POST_NORM], Hd)) {
            LPUT(L);
            return efail(e, STRATA_EFORMAT, "infer: layer %lld: bad norm vector", (long long)L);
        }
        for (int64_t t = 0; t < T; t++) rmsnorm(e->xn + t * Hd, P + t * Hd, nin, Hd, c->rms_eps);
        rc = c->is_mla[L] ? mla_layer(e, L, W) : kda_layer(e, L, W);
        if (!rc) rc = e->wrc;
        if (rc) { if (infer_unit_check(e, W, L)) rc = STRATA_ECORRUPT; LPUT(L); return rc; }
        for (int64_t i = 0; i < T * Hd; i++) P[i] += e->y[i];
        for (int64_t t = 0; t < T; t++) rmsnorm(e->xn + t * Hd, P + t * Hd, npost, Hd, c->rms_eps);
        if ((rc = ffn_step(e, L, L1, W, src, 1, P))) return rc;
    }
    return 0;
}

static int layers_run(engine *e, int64_t L0, int64_t L1) {
    const cfg *c = e->c;
    if (c->plain_res) return layers_run_plain(e, L0, L1);
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
        else for (int64_t t = 0; t < T; t++) attnres_row(e->h, src, nb + 1, t, Hd, fa, c->rms_eps);
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
        if (rc) { if (infer_unit_check(e, W, L)) rc = STRATA_ECORRUPT; LPUT(L); return rc; }
        if (P_empty) { memcpy(P, e->y, (size_t)(T * Hd) * sizeof(float)); P_empty = 0; }
        else for (int64_t i = 0; i < T * Hd; i++) P[i] += e->y[i];
        /* 6-8: FFN on RMSNorm(AttnRes([B..., P]; f_mlp)), added to P */
        for (int64_t i = 0; i < nb; i++) src[i] = res[i];
        src[nb] = P;
        for (int64_t t = 0; t < T; t++) attnres_row(e->h, src, nb + 1, t, Hd, fm, c->rms_eps);
        for (int64_t t = 0; t < T; t++) rmsnorm(e->xn + t * Hd, e->h + t * Hd, npost, Hd, c->rms_eps);
        if ((rc = ffn_step(e, L, L1, W, src, nb + 1, P))) return rc;
    }
    return 0;
}

static int head_run(engine *e, float *logits);

/* One pass over the e->T rows set up by engine_step (groups, ids, outr): the
 * embedding, this engine's layers, the other stages' (through the link), then
 * the head. Writes e->n_out rows of logits (the rows e->outr, in order) when
 * e->n_out > 0. Then the MTP layer over the pass (cfg mtp; never in a draft). */
static int forward_pass(engine *e, float *logits) {
    const cfg *c = e->c;
    wsrc *w = e->w;
    const int64_t Hd = c->hidden;
    float *const *res = e->res;
    int rc = w->ops->embed_rows(w, (int)e->T, e->ids, res[0]);
    if (rc) return wfail(e, rc, "embed_rows");
    if ((rc = layers_run(e, 0, e->L1))) return rc;
    if (e->L1 < e->n_main) {
        if (!e->link) return efail(e, STRATA_EINVAL, "infer: layers %lld.. belong to no stage", (long long)e->L1);
        for (int64_t g = 0; g < e->n_grp; g++) e->g_slot[g] = e->g_s[g]->slot;
        const engine_pass p = {e->T, e->n_grp, e->g_slot, e->g_r0, e->ids, res[0], e->chunk * Hd, Hd,
                               infer_blocks_before(c, e->L1), infer_blocks_before(c, e->n_main)};
        rc = e->link->pass(e->link->ud, &p, e->err, sizeof e->err);
        if (rc) return rc;
    }
    if (e->n_out > 0 && (rc = head_run(e, logits))) return rc;
    return e->mtp && !e->draft ? mtp_pass(e) : 0;
}

/* The head: output AttnRes, final norm, lm_head, for the rows that want logits
 * (the last unit, c->n_layers). */
static int head_run(engine *e, float *logits) {
    const cfg *c = e->c;
    wsrc *w = e->w;
    const int64_t Hd = c->hidden;
    float *const *res = e->res;
    float *src[CFG_MAX_LAYERS + 2];
    const int64_t nb = infer_blocks_before(c, e->n_main);
    float *P = res[nb];
    const wt *W;
    int rc;
    if (e->draft) {
        if (w->ops->layer_peek(w, c->n_layers, &W)) return efail(e, STRATA_EINVAL, "infer: draft pass: the head is not in RAM");
    } else {
        rc = w->ops->layer_get(w, c->n_layers, &W);
        if (rc) return wfail(e, rc, "layer_get(head)");
    }
    float *fo = e->vec, *nf = e->vec + Hd;
    if (c->plain_res) { /* final norm of the stream itself */
        if (vec_f32(nf, &W[R_FINAL_NORM], Hd)) { LPUT(c->n_layers); return efail(e, STRATA_EFORMAT, "infer: bad final norm"); }
        for (int64_t i = 0; i < e->n_out; i++) rmsnorm(e->xn + i * Hd, P + (int64_t)e->outr[i] * Hd, nf, Hd, c->rms_eps);
    } else if (vec_f32(fo, &W[R_OUT_RES_NORM], Hd) || vec_f32(e->xn, &W[R_OUT_RES_PROJ], Hd) || vec_f32(nf, &W[R_FINAL_NORM], Hd)) {
        LPUT(c->n_layers);
        return efail(e, STRATA_EFORMAT, "infer: bad final vectors");
    }
    for (int64_t i = 0; i < Hd && !c->plain_res; i++) fo[i] *= e->xn[i];
    for (int64_t i = 0; i < nb; i++) src[i] = res[i];
    src[nb] = P;
    /* row i of h / xn: the i-th wanted row (outr ascending, so it never overtakes) */
    for (int64_t i = 0; i < e->n_out && !c->plain_res; i++) {
        attnres_row(e->h, src, nb + 1, e->outr[i], Hd, fo, c->rms_eps);
        if (e->outr[i] != i) memcpy(e->h + i * Hd, e->h + (int64_t)e->outr[i] * Hd, (size_t)Hd * sizeof(float));
        rmsnorm(e->xn + i * Hd, e->h + i * Hd, nf, Hd, c->rms_eps);
    }
    mm_job j;
    mm_init(&j, e->n_out);
    mm_add(&j, &W[R_LM_HEAD], c->vocab, Hd, e->xn, Hd, logits, c->vocab, "lm_head");
    if (j.bad) { LPUT(c->n_layers); return efail(e, STRATA_EFORMAT, "infer: %s", j.what); }
    mm_run(e, &j);
    rc = infer_unit_check(e, W, c->n_layers);
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
    for (int64_t g = 0; g < e->n_grp; g++) e->g_pos[g] = e->g_s[g]->pos;
    e->f.pr_L1 = -1;
    /* the source may check the experts that land during the pass on this pass's
     * threads (wsrc_experts.c reap_experts), never outside it */
    if (e->w->ops->use_pool) e->w->ops->use_pool(e->w, e->pool);
    int rc = stage ? layers_run(e, e->L0, e->L1) : forward_pass(e, logits);
    if (e->w->ops->use_pool) e->w->ops->use_pool(e->w, NULL);
    if (rc) return rc;
    /* from the rows: the MTP layer's pass (mtp_pass) leaves groups of its own */
    for (int64_t i = 0; i < n; i++) {
        session *s = rows[i].s;
        s->ids[s->pos++] = rows[i].id;
        if (s->spec_on) s->spec_n++;
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
    if (e->link || e->L0 > 0 || e->L1 < e->n_main) return 0; /* a pipeline stage: layers live elsewhere */
    if (o->layer_peek(e->w, e->c->n_layers, &W)) return 0; /* the head streams */
    for (int64_t L = 0; L < e->n_main; L++) if (!o->layer_peek(e->w, L, &W)) return 1;
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
    /* the MTP rows past the kept ones are rewritten when their positions come again */
    const int64_t last = s->spec_pos0 + keep - 1;
    if (e->mtp && s->mtp_pos > last) s->mtp_pos = last > 0 ? last : 0;
    s->mtp_depth = -1;
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
    return n_kda * ((uint64_t)kda_floats(c) + (uint64_t)spec_rows * (uint64_t)rec_floats(c)) * sizeof(float) +
           mtp_rows_bytes(c, spec_rows);
}

/* The state of s's first pos positions as regions (see infer.h). */
int session_parts(session *s, int64_t pos, session_part *parts, int max) {
    engine *e = s->e;
    if (pos < 0 || pos > s->max_ctx || max < 2 + (int)e->n_mla + e->mtp) return -1;
    int n = 0;
    parts[n++] = (session_part){s->ids, (size_t)pos * sizeof(int32_t)};
    parts[n++] = (session_part){s->kda, (size_t)e->n_kda * (size_t)kda_floats(e->c) * sizeof(float)};
    for (int64_t i = 0; i < e->n_mla; i++)
        parts[n++] = (session_part){s->cache + i * s->max_ctx * e->C, (size_t)(pos * e->C) * sizeof(float)};
    /* the MTP layer's pending row: the final hidden state at pos - 1 (its cache
     * row pos - 1 is recomputed from it: session_restored) */
    if (e->mtp) parts[n++] = (session_part){session_mtp_hidden(s, pos - 1), pos > 0 ? (size_t)e->c->hidden * sizeof(float) : 0};
    return n;
}

int session_broken(const session *s) { return s->broken; }

void session_restored(session *s, int64_t pos) {
    s->pos = pos;
    s->mtp_pos = pos > 0 ? pos - 1 : 0;
    s->mtp_depth = -1;
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
