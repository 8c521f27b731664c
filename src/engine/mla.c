/*
 * mla.c: Gated Multi-head Latent Attention, absorbed (docs/architecture.md, Gated MLA): the
 * cache holds per position only the normed latent c = RMSNorm(W_kva x)[:kv_lora]
 * and the rope slot (never rotated in K3's NoPE MLA; DeepSeek-V3, cfg mla_rope:
 * rotated to its position, as is each head's q_rope), C = kv_lora + qk_rope
 * floats. W_kvb is absorbed on both sides, so attention runs in the latent space:
 *   q = W_qb RMSNorm(W_qa x) (q_lora 0, Kimi Linear: q = W_q x);  q_lat[h] = W_k[h]^T q_nope[h]
 *   s_i = (q_lat[h] . c_i + q_rope[h] . rope_i) / sqrt(nope + rope), causal softmax
 *   o[h] = W_v[h] sum_i p_i c_i, times sigmoid(W_g x) when the output gate is on
 *   y = W_o o
 */
#include <string.h>
#include "arch.h"
#include "engine_int.h"
#include "kern.h"
#include "pool.h"
#include "st.h"

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
    const float scale = (float)arch_mla_scale(c); /* 1/sqrt(nope + rope), YaRN's m^2 with RoPE */
    const int dt = x->kvb->dtype;
    const size_t esz = st_dtype_size(dt);
    for (int64_t jj = j0; jj < j1; jj++) {
        const int64_t g = jj / NH, h = jj % NH, r0 = e->g_r0[g], T = e->g_r0[g + 1] - r0;
        const session *sq = e->g_s[g];
        const float *cache = mla_cache(sq, x->mi);
        const int64_t pos0 = e->g_pos[g];
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

/* RoPE (cfg mla_rope, family-math 8.2): cos/sin of position pos for the rope/2
 * pairs, from the frequencies f, times the YaRN mscale ratio; all in double, a
 * pure function of (config, position). */
static void rope_tab(const double *f, int64_t half, int64_t pos, double ms, double *cs, double *sn) {
    for (int64_t i = 0; i < half; i++) {
        const double a = (double)pos * f[i];
        cs[i] = cos(a) * ms;
        sn[i] = sin(a) * ms;
    }
}

/* Rotates the adjacent pairs (2i, 2i+1) of x (DeepSeek's interleaved layout). */
static void rope_apply(float *x, const double *cs, const double *sn, int64_t half) {
    for (int64_t i = 0; i < half; i++) {
        const double a = x[2 * i], b = x[2 * i + 1];
        x[2 * i] = (float)(a * cs[i] - b * sn[i]);
        x[2 * i + 1] = (float)(a * sn[i] + b * cs[i]);
    }
}

/* Rotates every head's q_rope of the pass's rows to the row's position. */
static void rope_q(engine *e, const double *f, double *cs, double *sn) {
    const cfg *c = e->c;
    const int64_t NH = c->n_heads, half = c->qk_rope / 2;
    const double ms = arch_rope_mscale(c);
    for (int64_t g = 0; g < e->n_grp; g++)
        for (int64_t t = e->g_r0[g]; t < e->g_r0[g + 1]; t++) {
            rope_tab(f, half, e->g_pos[g] + t - e->g_r0[g], ms, cs, sn);
            for (int64_t h = 0; h < NH; h++) rope_apply(e->m.q + (t * NH + h) * e->qh + c->qk_nope, cs, sn, half);
        }
}

/* An FP8 kv_b_proj decoded to f32, each weight as the FP8 kernels decode it
 * (kern.h: e4m3 value times its block's scale, one f32 rounding), so the layer
 * computes with the same weights as a matmul_fp8 would. */
typedef struct { const wt *w; float *out; } kvb_decode;
static void kvb_decode_fn(void *ctx, int64_t i0, int64_t i1, int tid) {
    (void)tid;
    const kvb_decode *x = ctx;
    const uint8_t *q = x->w->p;
    const float *S = x->w->s;
    const int64_t cols = x->w->cols, nbc = (cols + KERN_FP8_BLOCK - 1) / KERN_FP8_BLOCK;
    for (int64_t i = i0; i < i1; i++) {
        const int64_t r = i / cols, k = i % cols;
        x->out[i] = kern_e4m3_f32(q[i]) * S[(r / KERN_FP8_BLOCK) * nbc + k / KERN_FP8_BLOCK];
    }
}

int mla_layer(engine *e, int64_t L, const wt *W) {
    const cfg *c = e->c;
    const int64_t Hd = c->hidden, NH = c->n_heads, R = c->kv_lora, C = e->C, vh = c->v_head, T = e->T;
    const int64_t mi = e->mla_i[L];
    /* q-LoRA (q_lora > 0), or a direct q_proj in the q_b role (Kimi Linear) */
    const int qlora = c->q_lora > 0;
    const double kv_eps = c->kv_norm_eps > 0 ? c->kv_norm_eps : c->rms_eps;
    const double qa_eps = c->qa_norm_eps > 0 ? c->qa_norm_eps : c->rms_eps;
    float *qan = e->vec + 4 * Hd, *kvn = qan + c->q_lora;
    /* RoPE tables (mla_rope): frequencies, cos, sin; doubles after the norms
     * (e->vec is 64-byte aligned, the offset rounded to even floats) */
    const int64_t half = c->qk_rope / 2;
    double *rf = (double *)(void *)(e->vec + ((4 * Hd + c->q_lora + R + 1) & ~(int64_t)1)), *rc = rf + half, *rs = rc + half;
    const double ms = c->mla_rope ? arch_rope_mscale(c) : 1.0;
    for (int64_t i = 0; c->mla_rope && i < half; i++) rf[i] = arch_rope_inv_freq(c, i);
    if ((qlora && vec_f32(qan, &W[R_MLA_QA_NORM], c->q_lora)) || vec_f32(kvn, &W[R_MLA_KVA_NORM], R))
        return efail(e, STRATA_EFORMAT, "infer: layer %lld: bad MLA norm", (long long)L);
    const int gate = c->mla_out_gate != 0;
    mm_job j;
    mm_init(&j, T);
    if (qlora) mm_add(&j, &W[R_MLA_QA], c->q_lora, Hd, e->xn, Hd, e->m.qa, c->q_lora, "q_a_proj");
    else mm_add(&j, &W[R_MLA_QB], NH * e->qh, Hd, e->xn, Hd, e->m.q, NH * e->qh, "q_proj");
    mm_add(&j, &W[R_MLA_KVA], C, Hd, e->xn, Hd, e->m.kva, C, "kv_a_proj_with_mqa");
    if (gate) mm_add(&j, &W[R_MLA_G], NH * vh, Hd, e->xn, Hd, e->m.g, NH * vh, "g_proj");
    if (j.bad) return efail(e, STRATA_EFORMAT, "infer: layer %lld: %s", (long long)L, j.what);
    guess_attach(e, &j);
    mm_run(e, &j);
    for (int64_t g = 0; g < e->n_grp; g++) {
        const session *sq = e->g_s[g];
        float *cache = mla_cache(sq, mi);
        for (int64_t t = e->g_r0[g]; t < e->g_r0[g + 1]; t++) {
            if (qlora) rmsnorm(e->m.qa + t * c->q_lora, e->m.qa + t * c->q_lora, qan, c->q_lora, qa_eps);
            /* the cache row: normed latent, then the rope slot, as is (NoPE) or
             * rotated to its position (mla_rope) */
            const int64_t pos = e->g_pos[g] + t - e->g_r0[g];
            float *row = cache + pos * C;
            rmsnorm(row, e->m.kva + t * C, kvn, R, kv_eps);
            memcpy(row + R, e->m.kva + t * C + R, (size_t)c->qk_rope * sizeof(float));
            if (c->mla_rope) {
                rope_tab(rf, half, pos, ms, rc, rs);
                rope_apply(row + R, rc, rs, half);
            }
        }
    }
    mm_init(&j, T);
    if (qlora) mm_add(&j, &W[R_MLA_QB], NH * e->qh, c->q_lora, e->m.qa, c->q_lora, e->m.q, NH * e->qh, "q_b_proj");
    const wt *kvb = &W[R_MLA_KVB];
    wt kvb_f32;
    if (kvb->fmt == WF_FP8) {
        if (!e->m.kvb || !kvb->p || !kvb->s || kvb->rows != NH * (c->qk_nope + vh) || kvb->cols != R)
            return efail(e, STRATA_EFORMAT, "infer: layer %lld: bad FP8 kv_b_proj", (long long)L);
        kvb_decode ctx = {kvb, e->m.kvb};
        pool_for(e->pool, kvb->rows * R, 65536, kvb_decode_fn, &ctx);
        kvb_f32 = (wt){.p = e->m.kvb, .dtype = DT_F32, .rows = kvb->rows, .cols = R};
        kvb = &kvb_f32;
    }
    if (!kvb->p || kvb->rows != NH * (c->qk_nope + vh) || kvb->cols != R ||
        (kvb->dtype != DT_F32 && kvb->dtype != DT_BF16 && kvb->dtype != DT_F16))
        return efail(e, STRATA_EFORMAT, "infer: layer %lld: bad kv_b_proj", (long long)L);
    if (j.bad) return efail(e, STRATA_EFORMAT, "infer: layer %lld: %s", (long long)L, j.what);
    if (j.n) mm_run(e, &j);
    if (c->mla_rope) rope_q(e, rf, rc, rs);
    mla_ctx x = {e, mi, kvb, gate};
    pool_for(e->pool, e->n_grp * NH, 1, mla_heads_fn, &x);
    mm_init(&j, T);
    mm_add(&j, &W[R_MLA_O], Hd, NH * vh, e->m.o, NH * vh, e->y, Hd, "o_proj");
    if (j.bad) return efail(e, STRATA_EFORMAT, "infer: layer %lld: %s", (long long)L, j.what);
    mm_run(e, &j);
    return 0;
}
