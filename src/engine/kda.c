/*
 * kda.c: Kimi Delta Attention, the linear-attention block of the KDA layers
 * (docs/architecture.md, KDA). Per head of width D, for each token:
 *   q, k, v = SiLU(causal depthwise conv_k(W_q x, W_k x, W_v x)) (history carried)
 *   q = q / ||q|| / sqrt(D), k = k / ||k||, beta = sigmoid(W_b x)
 *   alpha = exp(gate_lb sigmoid(exp(A_log) (f_b(f_a(x)) + dt_bias))), per channel
 *     (Kimi Linear, cfg kda_softplus: exp(-exp(A_log) softplus(f_b(f_a(x)) + dt_bias)))
 *   S = diag(alpha) S;  S += k (beta (v - S^T k))^T;  o = S^T q
 *   y = W_o (RMSNorm(o) sigmoid(W_g x))  (cfg kda_g_lowrank: W_g x = g_b(g_a(x)))
 * A sequence carries the last conv_k - 1 raw conv inputs and S (kda_floats).
 *
 * Prefill is the sequential delta rule, not the chunked WY/UT form: the
 * recurrence costs ~8 D^2 flops per head per token (12.6 MFLOP for a K3 layer vs
 * ~700 MFLOP of projections, under 2%), the per-head state (64 KB at D = 128)
 * stays in L2 while a head walks its T tokens, and prefill then equals decode bit
 * for bit. Measured (perf, 512-token prefill of the demo preset, 1 thread):
 * kda_heads_fn 5.9% of CPU samples against 33% in the matmul kernels, so the
 * chunked form could save at most a few percent here.
 */
#include <string.h>
#include "engine_int.h"
#include "kern.h"
#include "pool.h"

typedef struct {
    engine *e;
    int64_t ki;            /* index of the layer among the KDA layers */
    const float *cw[3];    /* conv weights (P, conv_k) f32 */
    const float *dtb, *alog, *onorm;
} kda_ctx;

/* A sequence's KDA block for KDA layer ki: conv history [3][conv_k-1][P], then
 * the recurrent state S [heads][D][D]. */
static float *kda_block(const session *s, int64_t ki) { return s->kda + ki * kda_floats(s->e->c); }

/* The second D doubles of the gate scratch (e^u beside u for the softplus). */
static double *alpha_d(double *ex, int64_t D) { return ex + D; }

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
            const float *zt = e->k.z + r * P + h * D;
            const float *dtb = x->dtb + h * D;
            if (c->kda_softplus) {
                /* decay alpha = exp(-aexp softplus(z + dt_bias)), softplus(u) = u
                 * above 20 (the FLA / torch threshold), else log1p(e^u) */
                for (int64_t i = 0; i < D; i++) ex[i] = (double)zt[i] + dtb[i];
                K.exp_f64(alpha_d(ex, D), ex, D);
                for (int64_t i = 0; i < D; i++) {
                    const double u = ex[i];
                    ex[i] = -aexp * (u > 20.0 ? u : log1p(ex[D + i]));
                }
            } else {
                /* decay alpha = exp(lb sigmoid(aexp (z + dt_bias))), per channel */
                for (int64_t i = 0; i < D; i++) ex[i] = -aexp * ((double)zt[i] + dtb[i]);
                K.exp_f64(ex, ex, D);
                for (int64_t i = 0; i < D; i++) ex[i] = lb / (1.0 + ex[i]);
            }
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

int kda_layer(engine *e, int64_t L, const wt *W) {
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
    if (c->kda_g_lowrank) mm_add(&j, &W[R_KDA_GA], D, Hd, e->xn, Hd, e->k.ga, D, "g_a_proj");
    else mm_add(&j, &W[R_KDA_G], P, Hd, e->xn, Hd, e->k.g, P, "g_proj");
    mm_add(&j, &W[R_KDA_FA], D, Hd, e->xn, Hd, e->k.fa, D, "f_a_proj");
    mm_add(&j, &W[R_KDA_B], NHk, Hd, e->xn, Hd, e->k.b, NHk, "b_proj");
    if (j.bad) return efail(e, STRATA_EFORMAT, "infer: layer %lld: %s", (long long)L, j.what);
    guess_attach(e, &j);
    mm_run(e, &j);
    mm_init(&j, T);
    mm_add(&j, &W[R_KDA_FB], P, D, e->k.fa, D, e->k.z, P, "f_b_proj");
    if (c->kda_g_lowrank) mm_add(&j, &W[R_KDA_GB], P, D, e->k.ga, D, e->k.g, P, "g_b_proj");
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
