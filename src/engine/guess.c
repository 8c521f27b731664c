/*
 * guess.c: expert reads a layer ahead. While layer L runs, layer L + 1's router
 * is applied to an estimate of its input (the residual sources as they stand,
 * through L + 1's own AttnRes fold and norm) and the experts it would choose are
 * asked of the weight source, so their reads overlap compute. A guess only
 * starts reads: it never touches a value of the pass, so right or wrong it never
 * changes a bit.
 */
#include <string.h>
#include "engine_int.h"
#include "kern.h"
#include "pool.h"
#include "st.h"

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

/* A row's guess: its k best of m scores sc (sigmoid + bias; expert id[i], or i)
 * in the order moe_route_row ranks them, appended to list[n ..] unless an earlier
 * row listed them (mark[x] != 0; this row stamps its own). Grouped routing
 * (DeepSeek-V3: n_group, topk_group) picks only inside the topk_group groups
 * whose two best scores sum highest, as the router does: with every expert's
 * score the guess is the router's choice (t_deepseek.c); with the late guess's
 * candidates a group's score is over its candidates (those left out score below
 * every candidate; a group with fewer than two ranks last). Without the groups a
 * DeepSeek-V3 guess (8 of 256 experts, 4 of 8 groups kept) spends about half its
 * reads on experts of groups the router then drops. gs: 2 x n_group floats. */
int guess_pick(const cfg *c, const float *sc, const int32_t *id, int64_t m, int64_t k, float *gs, int32_t *mark,
               int32_t stamp, int32_t *list, int n) {
    const int64_t G = c->n_group > 1 ? c->n_group : 1, per = c->n_experts / G;
    float *keep = gs + G; /* each group's second best score, then whether it is kept */
    if (G > 1) {
        for (int64_t g = 0; g < G; g++) gs[g] = keep[g] = -INFINITY;
        for (int64_t i = 0; i < m; i++) {
            const int64_t g = (id ? id[i] : i) / per;
            if (sc[i] > gs[g]) { keep[g] = gs[g]; gs[g] = sc[i]; }
            else if (sc[i] > keep[g]) keep[g] = sc[i];
        }
        for (int64_t g = 0; g < G; g++) { gs[g] += keep[g]; keep[g] = 0; }
        for (int64_t r = 0; r < c->topk_group && r < G; r++) { /* ties to the lower group, as route_groups */
            int64_t bg = -1;
            for (int64_t g = 0; g < G; g++)
                if (!keep[g] && (bg < 0 || gs[g] > gs[bg])) bg = g;
            keep[bg] = 1;
        }
    }
    for (int64_t r = 0; r < k; r++) { /* the r-th best, as route_token chooses */
        int64_t best = -1;
        float bv = 0;
        for (int64_t i = 0; i < m; i++) {
            const int32_t x = id ? id[i] : (int32_t)i;
            if (mark[x] == stamp || (G > 1 && !keep[x / per])) continue;
            if (best < 0 || sc[i] > bv) { best = i; bv = sc[i]; }
        }
        if (best < 0) break; /* fewer candidates in the kept groups than ranks */
        const int32_t x = id ? id[best] : (int32_t)best;
        if (!mark[x]) list[n++] = x;
        mark[x] = stamp;
    }
    return n;
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
void guess_predict(engine *e, int64_t L1, int64_t ranks, int early, int task) {
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
    const int plain = c->plain_res; /* the FFN's input is RMSNorm(P) itself: no AttnRes vectors */
    if (!vec_f32(norm, &W1[R_POST_NORM], Hd) && (plain || (!vec_f32(fold, &W1[R_MLP_RES_NORM], Hd) &&
        !vec_f32(e->f.px, &W1[R_MLP_RES_PROJ], Hd))) && !vec_f32(bias, &W1[R_MOE_BIAS], E)) {
        for (int64_t i = 0; i < Hd && !plain; i++) fold[i] *= e->f.px[i];
        for (int64_t t = 0; t < T; t++) {
            if (plain) memcpy(e->f.px + t * Hd, e->psrc[e->pnsrc - 1] + t * Hd, (size_t)Hd * sizeof(float));
            else attnres_row(e->f.px, e->psrc, e->pnsrc, t, Hd, fold, c->rms_eps);
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
    for (int64_t t = 0; t < T; t++) /* the row's scores: every expert's, or the C candidates' (pc) */
        n = guess_pick(c, cand ? e->f.ps + t * C : e->f.pr + t * E, cand ? e->f.pc + t * C : NULL, cand ? C : E, k,
                       e->f.pg, mark, (int32_t)t + 1, list, n);
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
void guess_owe(engine *e, int64_t L1, int64_t L_end) {
    if (e->draft) return;
    if (L1 < L_end && e->T <= PRED_MAX_ROWS && e->f.pr_L1 == L1 && e->pred_cand > 0) e->guess_L1 = L1;
    else guess_predict(e, L1, e->c->topk, 0, 0);
}
#define GUESS_TASK_MACS (1 << 19) /* a late guess in multiply-adds (load balance only: ~65 us) */
void guess_attach(engine *e, mm_job *j) {
    if (e->guess_L1 < 0) return;
    j->gs = e;
    j->gs_cost = GUESS_TASK_MACS;
}
/* Runs the guess owed, inside the job it was attached to (mm_fn's first range:
 * every dispatch of a job runs it, so nothing is left owed after the job). */
void guess_run(engine *e) {
    const int64_t L1 = e->guess_L1;
    if (L1 < 0) return;
    e->guess_L1 = -1;
    guess_predict(e, L1, e->c->topk, 0, 1);
}
