/*
 * moe.c: Stable LatentMoE (docs/architecture.md, Stable LatentMoE). For each row x:
 *   router: s = sigmoid(W_router x); the top-k of s + bias (ties to the lowest
 *           index); weights w_j = s_j / sum s (renormalised) x routed_scale
 *   z = W_latdown x (the latent, width `latent`)
 *   u = sum_j w_j W2_j SiTU(W1_j z, W3_j z) in the row's top-k order,
 *       then RMSNorm(u) when latent_norm is set
 *   y = W_latup u + shared(x), shared(x) = W_sh_down SiTU(W_sh_gate x, W_sh_up x)
 * Kimi Linear (cfg moe_plain): no latent, z = x and y = u + shared(x), SiLU
 * experts; router_hf takes the weights from s + bias (moe_route).
 * DeepSeek-V3 (n_group > 1): the top-k is group-limited (route_groups).
 * The experts chosen by any row of the pass run once (their union), streamed
 * through the source in a sliding window; the guesses (guess.c) read the next
 * layer's experts meanwhile.
 */
#include <string.h>
#include "engine_int.h"

/* Group-limited selection (DeepSeek-V3's noaux_tc, family-math 6): the experts
 * in n_group equal groups, a group's score the sum of its two largest biased
 * scores s + bias; the topk_group best groups (ties to the lowest index) are
 * kept by marking their experts -stamp in taken[]; the top-k then looks only at
 * those (the others are out, DeepSeek's -inf mask, not HF's 0.0). */
static void route_groups(const cfg *c, const float *s, const float *bias, int32_t *taken, int32_t stamp) {
    const int64_t G = c->n_group, n = c->n_experts / G;
    for (int64_t r = 0; r < c->topk_group; r++) {
        int64_t bg = -1;
        float bs = 0;
        for (int64_t g = 0; g < G; g++) {
            if (taken[g * n] == -stamp) continue; /* kept already */
            float m1 = -INFINITY, m2 = -INFINITY;
            for (int64_t i = g * n; i < (g + 1) * n; i++) {
                const float v = s[i] + bias[i];
                if (v > m1) { m2 = m1; m1 = v; }
                else if (v > m2) m2 = v;
            }
            const float gs = m1 + m2;
            if (bg < 0 || gs > bs) { bg = g; bs = gs; }
        }
        for (int64_t i = bg * n; i < (bg + 1) * n; i++) taken[i] = -stamp;
    }
}

void moe_route_row(const cfg *c, float *s, const float *bias, int32_t *taken, int32_t stamp, int32_t *idx, float *w) {
    const int64_t E = c->n_experts, k = c->topk;
    for (int64_t i = 0; i < E; i++) s[i] = sigmoidf_(s[i]);
    const int grouped = c->n_group > 1;
    if (grouped) route_groups(c, s, bias, taken, stamp);
    for (int64_t j = 0; j < k; j++) {
        int64_t best = -1;
        float bv = 0;
        for (int64_t i = 0; i < E; i++) {
            if (taken[i] == stamp || (grouped && taken[i] != -stamp)) continue;
            float v = s[i] + bias[i];
            if (best < 0 || v > bv) { best = i; bv = v; }
        }
        idx[j] = (int32_t)best;
        taken[best] = stamp;
    }
    /* the weights: the unbiased scores, or (router_hf) the biased ones the Kimi
     * Linear release's modeling_kimi.py returns (its bias add aliases the scores) */
    const int hf = c->router_hf;
    double sum = 0;
    for (int64_t j = 0; j < k; j++) sum += hf ? (double)(s[idx[j]] + bias[idx[j]]) : (double)s[idx[j]];
    for (int64_t j = 0; j < k; j++) {
        double v = hf ? (double)(s[idx[j]] + bias[idx[j]]) : (double)s[idx[j]];
        if (c->moe_renorm && k > 1) v /= sum + 1e-20;
        w[j] = (float)(v * c->routed_scale);
    }
}

static void route_token(engine *e, int64_t t, const float *bias) {
    const int64_t E = e->c->n_experts, k = e->c->topk;
    moe_route_row(e->c, e->f.router + t * E, bias, e->f.mark, (int32_t)t + 1, e->f.idx + t * k, e->f.wts + t * k);
}

/* The shared expert's down projection (SiTU output e->f.sg -> e->f.tmp): one
 * product, added either to the job that fills the first wait for an expert or
 * to the tail job, so both places compute the same dots. */
static void shared_down_add(mm_job *j, engine *e, const wt *W) {
    const int64_t Hd = e->c->hidden, S = e->c->n_shared * e->c->moe_inter;
    mm_add(j, &W[R_MOE_SH_DOWN], Hd, S, e->f.sg, S, e->f.tmp, Hd, "shared.down_proj");
}

/* Step 1, routing: the router job, then each row's top-k (route_token). A draft
 * pass keeps the chosen experts that are in RAM; the others add nothing (their
 * (row, slot) outputs are zero, idx -1). */
static int moe_route(engine *e, int64_t L, const wt *W, const float *bias) {
    const cfg *c = e->c;
    wsrc *ws = e->w;
    const int64_t Hd = c->hidden, E = c->n_experts, k = c->topk, Z = c->latent, T = e->T;
    mm_job j;
    mm_init(&j, T);
    mm_add(&j, &W[R_MOE_ROUTER], E, Hd, e->xn, Hd, e->f.router, E, "gate");
    if (j.bad) return efail(e, STRATA_EFORMAT, "infer: layer %lld: %s", (long long)L, j.what);
    mm_run(e, &j);
    memset(e->f.mark, 0, (size_t)E * sizeof(int32_t));
    for (int64_t t = 0; t < T; t++) route_token(e, t, bias);
    if (e->draft) {
        for (int64_t i = 0; i < T * k; i++) {
            e->dst.experts++;
            if (ws->ops->expert_resident(ws, L, e->f.idx[i])) continue;
            e->dst.experts_dropped++;
            e->f.idx[i] = -1;
            memset(e->f.eo + i * Z, 0, (size_t)Z * sizeof(float));
        }
    }
    return 0;
}

/* Step 2, the union of chosen experts, each once, ascending, in list[0 .. nu)
 * (mark[id] = its index), and the (row, slot) pairs t*k+slot grouped by expert,
 * ascending within each: expert q's are pairs[off[q] .. off[q+1]). Returns nu. */
static int moe_union(engine *e) {
    const int64_t E = e->c->n_experts, k = e->c->topk, T = e->T;
    int32_t *mark = e->f.mark, *list = e->f.list, *off = e->f.xoff, *cur = e->f.xcur, *pairs = e->f.pairs;
    memset(mark, 0, (size_t)E * sizeof(int32_t));
    for (int64_t i = 0; i < T * k; i++) if (e->f.idx[i] >= 0) mark[e->f.idx[i]] = 1;
    int nu = 0;
    for (int64_t i = 0; i < E; i++) if (mark[i]) { mark[i] = nu; list[nu++] = (int32_t)i; }
    memset(off, 0, (size_t)(nu + 1) * sizeof(int32_t));
    for (int64_t i = 0; i < T * k; i++) if (e->f.idx[i] >= 0) off[mark[e->f.idx[i]] + 1]++;
    for (int q = 0; q < nu; q++) { off[q + 1] += off[q]; cur[q] = off[q]; }
    for (int64_t i = 0; i < T * k; i++) if (e->f.idx[i] >= 0) pairs[cur[mark[e->f.idx[i]]]++] = (int32_t)i;
    return nu;
}

/* The window over the union: list[0 .. n_asked) requested, rem[0 .. n_rem) of
 * them not yet run; sh_done: the shared expert's down projection ran while an
 * expert was awaited. */
typedef struct {
    int nu, n_asked, n_rem, sh_done;
} moe_win;

/* Step 3, the head job, computed while the experts' reads are in flight: the
 * latent down-projection and the shared expert's gate/up with SiTU, beside the
 * checks of the experts that have landed. On failure the layer's experts are
 * put back. */
static int moe_head(engine *e, int64_t L, const wt *W) {
    const cfg *c = e->c;
    wsrc *ws = e->w;
    const int64_t Hd = c->hidden, Z = c->latent, I = c->moe_inter, T = e->T;
    const int64_t S = c->n_shared * c->moe_inter;
    mm_job j;
    mm_init(&j, T);
    if (c->moe_plain) memcpy(e->f.z, e->xn, (size_t)(T * Hd) * sizeof(float)); /* experts read x itself (Z == hidden) */
    else mm_add(&j, &W[R_MOE_LAT_DOWN], Z, Hd, e->xn, Hd, e->f.z, Z, "routed_expert_down_proj");
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
    return 0;
}

/* One batch of experts: ER[b] the weights of list[bq[b]], whose pairs take
 * gathered rows bp[b] .. bp[b + 1]. */
typedef struct {
    const wt *ER[MOE_BATCH];
    int bq[MOE_BATCH], nb;
    int64_t bp[MOE_BATCH + 1];
} moe_batch;

/* Step 4, the next batch: the experts already held, else the first one left
 * (waited for), at most MOE_BATCH and xcap (row, slot) pairs. */
static int moe_batch_take(engine *e, int64_t L, const wt *W, moe_win *win, moe_batch *bt) {
    wsrc *ws = e->w;
    const int64_t T = e->T, S = e->c->n_shared * e->c->moe_inter;
    const int32_t *list = e->f.list, *off = e->f.xoff;
    int32_t *rem = e->f.rem;
    int64_t np = 0;
    int rc;
    bt->nb = 0;
    for (int pass = 0; pass < 2 && bt->nb == 0; pass++) {
        if (pass == 1 && S > 0 && !win->sh_done) {
            /* nothing held yet: the shared down projection (it needs only
             * the head job's output) fills the wait instead of the tail job,
             * then the held experts are asked again. Ladder at 6.2 GB: ~10
             * waits per token of ~0.5 ms (the unpredicted experts' reads,
             * 1.7-1.9 ms each on this disk), this product ~0.13 ms; 63
             * tokens, 3 alternating pairs: 0.16-0.18 s waited on I/O
             * against 0.20-0.21. Its rows are the same dots either way. */
            mm_job j;
            mm_init(&j, T);
            shared_down_add(&j, e, W);
            if (j.bad) { ws->ops->experts_put(ws, L); return efail(e, STRATA_EFORMAT, "infer: layer %lld: %s", (long long)L, j.what); }
            mm_run(e, &j);
            win->sh_done = 1;
            pass = -1;
            continue;
        }
        for (int r = 0; r < win->n_rem && bt->nb < MOE_BATCH; r++) {
            const int q = rem[r];
            const int64_t m = off[q + 1] - off[q];
            if (q < 0 || np + m > e->xcap) continue;
            if (pass == 0 && ws->ops->expert_ready && !ws->ops->expert_ready(ws, L, list[q])) continue;
            rc = ws->ops->expert_wait(ws, L, list[q], &bt->ER[bt->nb]);
            if (rc) { ws->ops->experts_put(ws, L); return wfail(e, rc, "expert_wait"); }
            bt->bq[bt->nb] = q;
            bt->bp[bt->nb++] = np;
            np += m;
            rem[r] = -1;
            if (pass == 1) break;
        }
    }
    bt->bp[bt->nb] = np;
    int keep = 0;
    for (int r = 0; r < win->n_rem; r++) if (rem[r] >= 0) rem[keep++] = rem[r];
    win->n_rem = keep;
    return 0;
}

/* Step 5, a batch's experts: gate/up + SiTU of every expert in one job (inputs
 * are the row's latent itself when the expert has one row, else gathered), the
 * down projections in a second (straight into the (row, slot) outputs when
 * single), then the gathered outputs scattered to their (row, slot). */
static int moe_batch_run(engine *e, int64_t L, const moe_batch *bt) {
    wsrc *ws = e->w;
    const int64_t k = e->c->topk, Z = e->c->latent, I = e->c->moe_inter;
    const int32_t *pairs = e->f.pairs, *off = e->f.xoff;
    const wt *const *ER = bt->ER;
    const int *bq = bt->bq, nb = bt->nb;
    const int64_t *bp = bt->bp;
    mm_job j;
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
    return 0;
}

/* Step 6, slide the window: release what ran, request as many of the rest. */
static int moe_slide(engine *e, int64_t L, moe_win *win, const moe_batch *bt) {
    wsrc *ws = e->w;
    const int32_t *list = e->f.list;
    int32_t *rem = e->f.rem;
    int rc;
    if (win->n_asked < win->nu) {
        for (int b = 0; b < bt->nb; b++) ws->ops->expert_put(ws, L, list[bt->bq[b]]);
        const int more = win->nu - win->n_asked < bt->nb ? win->nu - win->n_asked : bt->nb;
        if ((rc = ws->ops->experts_request(ws, L, more, list + win->n_asked))) return wfail(e, rc, "experts_request");
        for (int q = win->n_asked; q < win->n_asked + more; q++) rem[win->n_rem++] = q;
        win->n_asked += more;
    }
    return 0;
}

/* Step 7, combine: u = sum_j w_j out_j in top-k order, then the aggregate latent
 * norm; y = W_latup u (+ the shared expert's down projection, unless it filled
 * a wait) + the shared expert's output. */
static int moe_combine(engine *e, int64_t L, const wt *W, const float *lnorm, int sh_done) {
    const cfg *c = e->c;
    const int64_t Hd = c->hidden, k = c->topk, Z = c->latent, T = e->T;
    const int64_t S = c->n_shared * c->moe_inter;
    for (int64_t t = 0; t < T; t++) {
        float *u = e->f.u + t * Z;
        for (int64_t sl = 0; sl < k; sl++) {
            const float w = e->f.wts[t * k + sl], *o = e->f.eo + (t * k + sl) * Z;
            if (sl == 0) for (int64_t i = 0; i < Z; i++) u[i] = w * o[i];
            else for (int64_t i = 0; i < Z; i++) u[i] += w * o[i];
        }
        if (c->latent_norm) rmsnorm(u, u, lnorm, Z, c->rms_eps);
    }
    mm_job j;
    mm_init(&j, T);
    if (c->moe_plain) memcpy(e->y, e->f.u, (size_t)(T * Hd) * sizeof(float)); /* no latent: u is the routed output */
    else mm_add(&j, &W[R_MOE_LAT_UP], Hd, Z, e->f.u, Z, e->y, Hd, "routed_expert_up_proj");
    if (S > 0 && !sh_done) shared_down_add(&j, e, W);
    if (j.bad) return efail(e, STRATA_EFORMAT, "infer: layer %lld: %s", (long long)L, j.what);
    mm_run(e, &j);
    if (S > 0)
        for (int64_t i = 0; i < T * Hd; i++) e->y[i] += e->f.tmp[i];
    return 0;
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
int moe_layer(engine *e, int64_t L, const wt *W) {
    const cfg *c = e->c;
    wsrc *ws = e->w;
    const int64_t Hd = c->hidden, E = c->n_experts, Z = c->latent;
    float *bias = e->vec + 4 * Hd, *lnorm = bias + E;
    int rc;
    if (vec_f32(bias, &W[R_MOE_BIAS], E))
        return efail(e, STRATA_EFORMAT, "infer: layer %lld: bad e_score_correction_bias", (long long)L);
    if (c->latent_norm && vec_f32(lnorm, &W[R_MOE_LAT_NORM], Z))
        return efail(e, STRATA_EFORMAT, "infer: layer %lld: bad routed_expert_norm", (long long)L);
    /* the router first: the experts' reads start as soon as the rows are routed,
     * and the latent down-projection and the shared expert (gate/up with SiTU)
     * are computed while they are in flight */
    if ((rc = moe_route(e, L, W, bias))) return rc;
    moe_win win = {moe_union(e), 0, 0, 0};
    int64_t cap = ws->ops->experts_capacity ? ws->ops->experts_capacity(ws) : 0;
    if (cap <= 0 || cap > win.nu || !ws->ops->expert_put) cap = win.nu;
    win.n_asked = (int)cap;
    for (int q = 0; q < win.n_asked; q++) e->f.rem[win.n_rem++] = q;
    if (win.n_asked && (rc = ws->ops->experts_request(ws, L, win.n_asked, e->f.list))) return wfail(e, rc, "experts_request");
    if (!e->draft) guess_predict(e, L + 1, e->pred_early, 1, 0);
    if ((rc = moe_head(e, L, W))) return rc;
    while (win.n_rem > 0) {
        moe_batch bt;
        if ((rc = moe_batch_take(e, L, W, &win, &bt))) return rc;
        if ((rc = moe_batch_run(e, L, &bt))) return rc;
        if ((rc = moe_slide(e, L, &win, &bt))) return rc;
    }
    ws->ops->experts_put(ws, L);
    return moe_combine(e, L, W, lnorm, win.sh_done);
}
