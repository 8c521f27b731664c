/*
 * mtp.c: DeepSeek-V3's multi-token-prediction layer as a draft (cfg mtp; the
 * layer `model.layers.<num_hidden_layers>.*`, bound as layer n_main). For the
 * main model's final hidden state h_q at position q (before the final norm) and
 * the token t_{q+1} after it:
 *   x = eh_proj [RMSNorm(emb(t_{q+1}); enorm) ; RMSNorm(h_q; hnorm)]
 *   x += MLA(RMSNorm(x; input_layernorm))      (its own latent cache, row q)
 *   x += MoE(RMSNorm(x; post_attention_layernorm))
 *   logits = lm_head RMSNorm(x; shared_head.norm)  -> a guess of t_{q+2}
 * (DeepSeek-V3's reference MTP module and vLLM's deepseek_mtp: embedding first in
 * the concatenation, the MTP row at the hidden state's position). The embedding
 * and lm_head are the model's own: the layer's copies (V3.2's files hold them,
 * 1.73 GiB each) are never bound. A draft k > 1 feeds x back as the hidden state
 * of the next position with the previous draft as its token.
 * Nothing here changes a value of the main model: the MTP's rows only propose
 * drafts, which the main model verifies (api.c).
 */
#include <string.h>
#include "engine_int.h"
#include "infer.h"
#include "schema.h"

/* The ring row of the final hidden state at position q (q >= 0). */
static float *ring_row(const session *s, int64_t q) { return s->mtp_ring + (q % s->mtp_cap) * s->e->c->hidden; }

/* The MTP layer over the e->T rows set up in groups (g_s, g_r0, g_pos: each
 * group's first MTP position), inputs raw in e->mtp_x and the tokens in e->ids:
 * the embedding rows are read into the first half here. Leaves the layer's
 * output rows in res[0]; with logits, one vocab row per row. */
static int mtp_eval(engine *e, float *logits) {
    const cfg *c = e->c;
    wsrc *w = e->w;
    const int64_t Hd = c->hidden, T = e->T, N = e->n_main;
    float *P = e->res[0], *x = e->mtp_x;
    float *src[1] = {P};
    int rc = w->ops->embed_rows(w, (int)T, e->ids, e->y);
    if (rc) return wfail(e, rc, "embed_rows (MTP)");
    for (int64_t t = 0; t < T; t++) memcpy(x + t * 2 * Hd, e->y + t * Hd, (size_t)Hd * sizeof(float));
    const wt *W;
    if ((rc = w->ops->layer_get(w, N, &W))) return wfail(e, rc, "layer_get (MTP)");
    float *v0 = e->vec, *v1 = e->vec + Hd, *nin = e->vec + 2 * Hd, *npost = e->vec + 3 * Hd;
    if (vec_f32(v0, &W[R_MTP_ENORM], Hd) || vec_f32(v1, &W[R_MTP_HNORM], Hd) || vec_f32(nin, &W[R_IN_NORM], Hd) ||
        vec_f32(npost, &W[R_POST_NORM], Hd)) {
        w->ops->layer_put(w, N);
        return efail(e, STRATA_EFORMAT, "infer: MTP layer %lld: bad norm vector", (long long)N);
    }
    for (int64_t t = 0; t < T; t++) {
        rmsnorm(x + t * 2 * Hd, x + t * 2 * Hd, v0, Hd, c->rms_eps);
        rmsnorm(x + t * 2 * Hd + Hd, x + t * 2 * Hd + Hd, v1, Hd, c->rms_eps);
    }
    mm_job j;
    mm_init(&j, T);
    mm_add(&j, &W[R_MTP_EH], Hd, 2 * Hd, x, 2 * Hd, P, Hd, "eh_proj");
    if (j.bad) { w->ops->layer_put(w, N); return efail(e, STRATA_EFORMAT, "infer: MTP layer: %s", j.what); }
    e->wrc = 0;
    e->guess_L1 = -1;
    e->f.pr_L1 = -1;
    mm_run(e, &j);
    rc = e->wrc;
    if (!rc) {
        for (int64_t t = 0; t < T; t++) rmsnorm(e->xn + t * Hd, P + t * Hd, nin, Hd, c->rms_eps);
        rc = mla_layer(e, N, W);
        if (!rc) rc = e->wrc;
    }
    if (!rc) {
        for (int64_t i = 0; i < T * Hd; i++) P[i] += e->y[i];
        for (int64_t t = 0; t < T; t++) rmsnorm(e->xn + t * Hd, P + t * Hd, npost, Hd, c->rms_eps);
        e->psrc = src;
        e->pnsrc = 1;
        rc = cfg_is_moe(c, N) ? moe_layer(e, N, W) : dense_layer(e, N, W);
        if (!rc) rc = e->wrc;
    }
    if (infer_unit_check(e, W, N)) rc = STRATA_ECORRUPT;
    if (!rc) {
        for (int64_t i = 0; i < T * Hd; i++) P[i] += e->y[i];
        if (logits && vec_f32(v0, &W[R_MTP_HEAD_NORM], Hd)) rc = efail(e, STRATA_EFORMAT, "infer: MTP layer: bad shared_head.norm");
    }
    w->ops->layer_put(w, N);
    if (rc || !logits) return rc;
    for (int64_t t = 0; t < T; t++) rmsnorm(e->xn + t * Hd, P + t * Hd, v0, Hd, c->rms_eps);
    if ((rc = w->ops->layer_get(w, c->n_layers, &W))) return wfail(e, rc, "layer_get(head) (MTP)");
    mm_init(&j, T);
    mm_add(&j, &W[R_LM_HEAD], c->vocab, Hd, e->xn, Hd, logits, c->vocab, "lm_head");
    if (!j.bad) mm_run(e, &j);
    rc = j.bad ? efail(e, STRATA_EFORMAT, "infer: %s", j.what) : infer_unit_check(e, W, c->n_layers);
    w->ops->layer_put(w, c->n_layers);
    return rc ? rc : e->wrc;
}

int mtp_pass(engine *e) {
    const int64_t Hd = e->c->hidden, n_grp = e->n_grp;
    const float *P = e->res[0];
    int64_t r = 0, ng = 0;
    /* the MTP rows: position q of a sequence takes h_q and t_{q+1}, so the pass's
     * rows but the last, after the row pending from before the pass. The groups
     * are rewritten in place (group g' <= g): read before written. */
    for (int64_t g = 0; g < n_grp; g++) {
        session *s = e->g_s[g];
        const int64_t r0 = e->g_r0[g], n = e->g_r0[g + 1] - r0, p0 = e->g_pos[g];
        /* an MTP cache behind by more than the pending row cannot happen (every
         * step runs this pass; restores bring the pending row): start there */
        const int64_t q0 = s->mtp_pos >= p0 - 1 ? s->mtp_pos : p0 - 1;
        const int64_t rg = r;
        for (int64_t q = q0; q < p0 + n - 1; q++, r++) {
            const int64_t t = r0 + q + 1 - p0; /* the row of t_{q+1} */
            const float *h = q < p0 ? ring_row(s, q) : P + (r0 + q - p0) * Hd;
            memcpy(e->mtp_x + r * 2 * Hd + Hd, h, (size_t)Hd * sizeof(float));
            e->ids[r] = e->ids[t];
        }
        /* the final hidden states the ring keeps (after the pending one was read) */
        for (int64_t i = n > s->mtp_cap ? n - s->mtp_cap : 0; i < n; i++)
            memcpy(ring_row(s, p0 + i), P + (r0 + i) * Hd, (size_t)Hd * sizeof(float));
        s->mtp_pos = p0 + n - 1;
        s->mtp_depth = -1;
        if (r == rg) continue;
        e->g_s[ng] = s;
        e->g_pos[ng] = q0;
        e->g_r0[ng++] = rg;
    }
    if (r == 0) return 0;
    e->g_r0[ng] = r;
    e->n_grp = ng;
    e->T = r;
    return mtp_eval(e, NULL);
}

int engine_has_mtp(const engine *e) { return e->mtp; }

int session_mtp_ready(const session *s) {
    return s->e->mtp && !s->broken && !s->spec_on && s->pos >= 1 && s->mtp_pos >= s->pos - 1;
}

int engine_mtp_step(engine *e, const infer_row *rows, int64_t n, int64_t depth, float *logits) {
    const int64_t Hd = e->c->hidden;
    e->err[0] = 0;
    if (!e->mtp) return efail(e, STRATA_EINVAL, "infer: the model was loaded without its MTP layer");
    if (n < 1 || n > e->chunk) return efail(e, STRATA_EINVAL, "infer: %lld MTP rows (1 to %lld)", (long long)n, (long long)e->chunk);
    for (int64_t i = 0; i < n; i++) {
        const session *s = rows[i].s;
        if (!s || s->e != e) return efail(e, STRATA_EINVAL, "infer: row %lld: no sequence of this model", (long long)i);
        for (int64_t k = 0; k < i; k++)
            if (rows[k].s == s) return efail(e, STRATA_EINVAL, "infer: row %lld: one MTP row per sequence", (long long)i);
        if (rows[i].id < 0 || rows[i].id >= e->c->vocab)
            return efail(e, STRATA_EINVAL, "infer: token id %d at row %lld outside the vocabulary", rows[i].id, (long long)i);
        if (depth == 0 ? !session_mtp_ready(s) : s->mtp_depth != depth - 1 || s->broken || s->spec_on)
            return efail(e, STRATA_EINVAL, "infer: row %lld: the sequence has no MTP row of depth %lld to draft from", (long long)i,
                         (long long)depth - 1);
        if (s->pos - 1 + depth >= s->max_ctx) return efail(e, STRATA_EINVAL, "infer: row %lld: the draft passes the context", (long long)i);
    }
    for (int64_t i = 0; i < n; i++) {
        session *s = rows[i].s;
        const float *h = depth == 0 ? ring_row(s, s->pos - 1) : s->mtp_ch;
        memcpy(e->mtp_x + i * 2 * Hd + Hd, h, (size_t)Hd * sizeof(float));
        e->ids[i] = rows[i].id;
        e->g_s[i] = s;
        e->g_r0[i] = i;
        e->g_pos[i] = s->pos - 1 + depth;
    }
    e->g_r0[n] = n;
    e->n_grp = e->T = n;
    if (e->w->ops->use_pool) e->w->ops->use_pool(e->w, e->pool);
    int rc = mtp_eval(e, logits);
    if (e->w->ops->use_pool) e->w->ops->use_pool(e->w, NULL);
    for (int64_t i = 0; i < n; i++) {
        session *s = rows[i].s;
        if (rc) { /* row pos - 1 may be half written: recomputed by the next step */
            if (s->mtp_pos > s->pos - 1) s->mtp_pos = s->pos - 1;
            s->mtp_depth = -1;
            continue;
        }
        memcpy(s->mtp_ch, e->res[0] + i * Hd, (size_t)Hd * sizeof(float));
        s->mtp_depth = depth;
        if (depth == 0) s->mtp_pos = s->pos;
    }
    return rc;
}
