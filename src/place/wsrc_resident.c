/*
 * wsrc_resident.c: the simplest weight source: every tensor the schema names is
 * read from the shards into MEM_WEIGHTS at open and handed out as views for the
 * whole life of the source. For models that fit in RAM (tests, tiny presets); the
 * placement engine's streaming source implements the same interface for the rest.
 *
 * Views: matrices (rows, cols); vectors rows = 1; conv (P, conv_k); MXFP4 packed
 * codes (rows, LOGICAL cols) and scales (rows, cols / 32). Shapes are checked
 * against the schema here too, so a source never hands out a view whose bytes do
 * not cover rows x cols.
 */
#include <string.h>
#include "arch.h"
#include "model.h"
#include "num.h"
#include "st.h"

typedef struct resident {
    wsrc base;
    const st_index *ix;
    int64_t n_layers, n_experts;
    wt *layers;      /* (n_layers + 1, R_COUNT): trunk of each layer, then the head */
    wt *experts;     /* (n_layers, n_experts, R_COUNT); NULL rows for dense layers */
    void **blobs;    /* every allocation, for close */
    size_t n_blobs, cap_blobs;
    const wt *embed;
    char err[512];
} resident;

static int r_layer_get(wsrc *w, int64_t L, const wt **roles) {
    resident *r = (resident *)w;
    if (L < 0 || L > r->n_layers) {
        snprintf(r->err, sizeof r->err, "resident: layer %lld out of range", (long long)L);
        return STRATA_EINVAL;
    }
    *roles = r->layers + L * R_COUNT;
    return 0;
}

static void r_layer_put(wsrc *w, int64_t L) { (void)w; (void)L; }

static int r_experts_request(wsrc *w, int64_t L, int n, const int32_t *ids) {
    resident *r = (resident *)w;
    for (int i = 0; i < n; i++)
        if (L < 0 || L >= r->n_layers || ids[i] < 0 || ids[i] >= r->n_experts) {
            snprintf(r->err, sizeof r->err, "resident: expert %d of layer %lld out of range", ids[i], (long long)L);
            return STRATA_EINVAL;
        }
    return 0;
}

static int r_expert_wait(wsrc *w, int64_t L, int32_t id, const wt **roles) {
    resident *r = (resident *)w;
    if (L < 0 || L >= r->n_layers || id < 0 || id >= r->n_experts || !cfg_is_moe(w->c, L)) {
        snprintf(r->err, sizeof r->err, "resident: expert %d of layer %lld out of range", id, (long long)L);
        return STRATA_EINVAL;
    }
    *roles = r->experts + (L * r->n_experts + id) * R_COUNT;
    return 0;
}

static void r_experts_put(wsrc *w, int64_t L) { (void)w; (void)L; }

static int r_embed_rows(wsrc *w, int n, const int32_t *ids, float *out) {
    resident *r = (resident *)w;
    const wt *e = r->embed;
    const size_t es = st_dtype_size(e->dtype);
    for (int i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= e->rows) {
            snprintf(r->err, sizeof r->err, "resident: token id %d outside the embedding (%lld rows)", ids[i],
                     (long long)e->rows);
            return STRATA_EINVAL;
        }
        num_to_f32(out + (int64_t)i * e->cols, (const uint8_t *)e->p + (size_t)ids[i] * (size_t)e->cols * es,
                   e->dtype, (size_t)e->cols);
    }
    return 0;
}

static void r_close(wsrc *w) {
    resident *r = (resident *)w;
    if (!r) return;
    for (size_t i = 0; i < r->n_blobs; i++) base_free(r->blobs[i]);
    base_free(r->blobs);
    base_free(r->layers);
    base_free(r->experts);
    base_free(r);
}

static const char *r_errmsg(wsrc *w) { return ((resident *)w)->err; }

static const wsrc_ops k_resident_ops = { /* no self-drafting: a draft would be the model itself */
    r_layer_get, r_layer_put, r_experts_request, r_expert_wait, r_experts_put,
    r_embed_rows, NULL, r_close, r_errmsg, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
    NULL, NULL, NULL,
};

typedef struct {
    resident *r;
    char *err;
    size_t errlen;
} load_ctx;

static int load_one(void *ud, const tspec *t) {
    load_ctx *x = ud;
    resident *r = x->r;
    const st_tensor *st = st_find(r->ix, t->name);
    /* tensors the config switches off may be absent (the forward pass skips them) */
    if (!st && ((t->role == R_MLA_G && !r->base.c->mla_out_gate) ||
                (t->role == R_MOE_LAT_NORM && !r->base.c->latent_norm)))
        return 0;
    if (!st) return base_fail(x->err, x->errlen, STRATA_EFORMAT, "resident: tensor %s missing", t->name);
    int64_t numel = 1;
    for (int i = 0; i < st->ndim; i++) numel *= st->shape[i];
    int okdt = t->kind == TK_PACKED || t->kind == TK_SCALE ? st->dtype == DT_U8
             : t->kind == TK_FP8 ? st->dtype == DT_F8_E4M3 : t->kind == TK_FP8_SCALE ? st->dtype == DT_F32
             : t->kind == TK_I4_PACKED ? st->dtype == DT_I32 : t->kind == TK_I4_SCALE ? st->dtype == DT_BF16
             : t->kind == TK_I4_SHAPE ? st->dtype == DT_I32 || st->dtype == DT_I64
             : st->dtype == DT_F32 || st->dtype == DT_BF16 || st->dtype == DT_F16;
    if (!okdt || numel != t->numel || st->nbytes != (uint64_t)numel * st_dtype_size(st->dtype))
        return base_fail(x->err, x->errlen, STRATA_EFORMAT, "resident: tensor %s has dtype %s and %lld elements, expected %lld",
                         t->name, st_dtype_name(st->dtype), (long long)numel, (long long)t->numel);
    if (r->n_blobs == r->cap_blobs) {
        size_t nc = r->cap_blobs ? 2 * r->cap_blobs : 256;
        void **nb = base_realloc(r->blobs, nc * sizeof(void *), MEM_WEIGHTS);
        if (!nb) return base_fail(x->err, x->errlen, STRATA_ENOMEM, "resident: out of memory");
        r->blobs = nb;
        r->cap_blobs = nc;
    }
    void *p = base_alloc_aligned(st->nbytes ? (size_t)st->nbytes : 1, 64, MEM_WEIGHTS);
    if (!p) return base_fail(x->err, x->errlen, STRATA_ENOMEM, "resident: cannot allocate %llu bytes for %s",
                             (unsigned long long)st->nbytes, t->name);
    r->blobs[r->n_blobs++] = p;
    int rc = st_read(r->ix, st, 0, p, st->nbytes, x->err, x->errlen);
    if (rc) return rc;
    /* an MXFP4 scale of 255 is NaN by the MX spec: a defective checkpoint, never
     * silently computed with (the kernels would zero the group) */
    if (t->role == R_EXP_W1S || t->role == R_EXP_W2S || t->role == R_EXP_W3S) {
        size_t bad = num_mxfp4_count_nan_scales(p, (size_t)st->nbytes);
        if (bad)
            return base_fail(x->err, x->errlen, STRATA_EFORMAT,
                             "%s: %zu MXFP4 scale bytes are 255 (NaN in the MX spec): the checkpoint is defective "
                             "(strata inspect --scan lists every such tensor)", t->name, bad);
    }
    wt v = wt_view_of(t, st->dtype);
    v.p = p;
    wt *slot;
    if (t->cls == TC_EXPERT) slot = r->experts + (t->layer * r->n_experts + t->expert) * R_COUNT;
    else if (t->cls == TC_LAYER) slot = r->layers + t->layer * R_COUNT;
    else slot = r->layers + r->n_layers * R_COUNT; /* embed, final vectors, lm_head */
    wt_put(slot, t->role, t->kind, v);
    return 0;
}

int wsrc_resident_open(wsrc **out, const cfg *c, const st_index *ix, char *err, size_t errlen) {
    *out = NULL;
    resident *r = base_calloc(1, sizeof *r, MEM_WEIGHTS);
    if (!r) return base_fail(err, errlen, STRATA_ENOMEM, "resident: out of memory");
    r->base.ops = &k_resident_ops;
    r->base.c = c;
    r->ix = ix;
    r->n_layers = c->n_layers;
    r->n_experts = c->n_experts;
    int rc;
    r->layers = base_calloc((size_t)(c->n_layers + 1) * R_COUNT, sizeof(wt), MEM_WEIGHTS);
    r->experts = base_calloc((size_t)(c->n_layers * c->n_experts) * R_COUNT, sizeof(wt), MEM_WEIGHTS);
    if (!r->layers || !r->experts) { rc = base_fail(err, errlen, STRATA_ENOMEM, "resident: out of memory"); goto fail; }
    load_ctx x = {r, err, errlen};
    rc = schema_walk(c, model_wf(c, ix), load_one, &x);
    if (rc) goto fail;
    r->embed = r->layers + c->n_layers * R_COUNT + R_EMBED;
    *out = &r->base;
    return 0;
fail:
    r_close(&r->base);
    return rc;
}
