/*
 * schema.c: the tensor list of a model from its config (see schema.h): names
 * under the architecture's prefixes (arch.h), tensors as its variant flags say.
 * Shapes are (rows, cols) with y = W x; a vector is [n]. A_log is stored with
 * max(heads, head_dim) entries as in the released checkpoint (128 for 96 heads);
 * only the first `heads` are meaningful.
 */
#include "schema.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "arch.h"
#include "base.h"
#include "st.h"

static const char *k_role_names[R_COUNT] = {
    "embed", "lm_head", "norm", "output_attn_res_norm", "output_attn_res_proj",
    "input_layernorm", "post_attention_layernorm", "self_attention_res_norm",
    "self_attention_res_proj", "mlp_res_norm", "mlp_res_proj",
    "kda.q_proj", "kda.k_proj", "kda.v_proj", "kda.g_proj", "kda.o_proj", "kda.q_conv1d",
    "kda.k_conv1d", "kda.v_conv1d", "kda.f_a_proj", "kda.f_b_proj", "kda.b_proj", "kda.A_log",
    "kda.dt_bias", "kda.o_norm",
    "mla.q_a_proj", "mla.q_a_layernorm", "mla.q_b_proj", "mla.kv_a_proj_with_mqa",
    "mla.kv_a_layernorm", "mla.kv_b_proj", "mla.o_proj", "mla.g_proj",
    "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj",
    "moe.gate", "moe.e_score_correction_bias", "moe.routed_expert_down_proj",
    "moe.routed_expert_up_proj", "moe.routed_expert_norm", "moe.shared.gate_proj",
    "moe.shared.up_proj", "moe.shared.down_proj",
    "expert.w1.weight_packed", "expert.w1.weight_scale", "expert.w2.weight_packed",
    "expert.w2.weight_scale", "expert.w3.weight_packed", "expert.w3.weight_scale",
    "expert.w1.weight", "expert.w2.weight", "expert.w3.weight", "kda.g_a_proj", "kda.g_b_proj",
    "mtp.enorm", "mtp.hnorm", "mtp.eh_proj", "mtp.shared_head.norm"};

const char *schema_role_name(int role) {
    return (role >= 0 && role < R_COUNT) ? k_role_names[role] : "?";
}

typedef struct {
    schema_fn fn;
    void *ud;
    int rc;
    int pub;              /* the next tensor's published dtype + 1 (0: none) */
    int wf;               /* formats (SW_*) */
    const char *pfx;      /* the architecture's body prefix (arch.h) */
    char lp[48];          /* pfx "layers" */
} walker;

static void walker_init(walker *w, const cfg *c, int wf, schema_fn fn, void *ud) {
    memset(w, 0, sizeof *w);
    w->wf = wf;
    w->fn = fn;
    w->ud = ud;
    w->pfx = arch_of(c)->pfx;
    snprintf(w->lp, sizeof w->lp, "%slayers", w->pfx);
}

static int emit(walker *w, int cls, int kind, int role, int64_t L, int64_t E, int ndim,
                int64_t d0, int64_t d1, int64_t d2, const char *fmt, ...) {
    if (w->rc) return w->rc;
    tspec t;
    memset(&t, 0, sizeof t);
    t.pub_dtype = w->pub;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(t.name, sizeof t.name, fmt, ap);
    va_end(ap);
    t.cls = cls; t.kind = kind; t.role = role; t.layer = L; t.expert = E; t.ndim = ndim;
    t.shape[0] = d0; t.shape[1] = d1; t.shape[2] = d2;
    t.numel = d0 * (ndim > 1 ? d1 : 1) * (ndim > 2 ? d2 : 1);
    if (ndim == 4) { /* [1, 1, n, 1]: Kimi Linear's A_log */
        t.shape[3] = 1;
        t.numel = d2;
    }
    w->rc = w->fn(w->ud, &t);
    return w->rc;
}

/* A matrix (rows, cols) named `name` (ending in "weight") in format fmt (WF_*):
 * plain, FP8 with its scale grid, or INT4 with its scales and shape, the
 * companions' names and dtypes as the published checkpoints have them. */
static void mat(walker *w, int cls, int role, int64_t L, int64_t E, int64_t r, int64_t c, int fmt, const char *name) {
    const int pub = w->pub;
    if (fmt == WF_FP8) {
        w->pub = DT_F8_E4M3 + 1;
        emit(w, cls, TK_FP8, role, L, E, 2, r, c, 0, "%s", name);
        w->pub = DT_F32 + 1;
        emit(w, cls, TK_FP8_SCALE, role, L, E, 2, (r + FP8_BLOCK - 1) / FP8_BLOCK, (c + FP8_BLOCK - 1) / FP8_BLOCK, 0,
             "%s_scale_inv", name);
    } else if (fmt == WF_INT4) {
        w->pub = DT_I32 + 1;
        emit(w, cls, TK_I4_PACKED, role, L, E, 2, r, c / 8, 0, "%s_packed", name);
        w->pub = DT_BF16 + 1;
        emit(w, cls, TK_I4_SCALE, role, L, E, 2, r, c / I4_GROUP, 0, "%s_scale", name);
        w->pub = DT_I32 + 1;
        emit(w, cls, TK_I4_SHAPE, role, L, E, 1, 2, 0, 0, "%s_shape", name);
    } else {
        emit(w, cls, TK_MATRIX, role, L, E, 2, r, c, 0, "%s", name);
    }
    w->pub = pub;
}

/* A trunk matrix: FP8 under SW_TRUNK_FP8 unless the published checkpoints keep
 * it plain: the router gate (its scores pick experts) and the MTP layer's
 * eh_proj (BF16 in DeepSeek's FP8 releases: family-formats.md 3.4; vLLM and
 * SGLang build it as an unquantised nn.Linear). */
static void trunk_mat(walker *w, int role, int64_t L, int64_t r, int64_t c, const char *fmt, ...) ST_PRINTF(6, 7);
static void trunk_mat(walker *w, int role, int64_t L, int64_t r, int64_t c, const char *fmt, ...) {
    if (w->rc) return;
    char name[160];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(name, sizeof name, fmt, ap);
    va_end(ap);
    mat(w, TC_LAYER, role, L, -1, r, c, (w->wf & SW_TRUNK_FP8) && role != R_MOE_ROUTER && role != R_MTP_EH ? WF_FP8 : WF_PLAIN, name);
}

#define MAT(role, r, c, ...) trunk_mat(w, role, L, r, c, __VA_ARGS__)
#define VEC(role, n, ...) emit(w, TC_LAYER, TK_VECTOR, role, L, -1, 1, n, 0, 0, __VA_ARGS__)

/* The KDA block's tensors: q/k/v with their convs, the decay's f_a/f_b, beta,
 * A_log and dt_bias, the output gate (full-rank g_proj, or g_a/g_b), o_norm, o_proj. */
static void walk_kda(const cfg *c, int64_t L, walker *w) {
    const int64_t H = c->hidden, D = c->kda_head_dim, P = c->kda_heads * D;
    const char *lp = w->lp, *a = "self_attn";
    MAT(R_KDA_Q, P, H, "%s.%lld.%s.q_proj.weight", lp, (long long)L, a);
    MAT(R_KDA_K, P, H, "%s.%lld.%s.k_proj.weight", lp, (long long)L, a);
    MAT(R_KDA_V, P, H, "%s.%lld.%s.v_proj.weight", lp, (long long)L, a);
    if (!c->kda_g_lowrank) MAT(R_KDA_G, P, H, "%s.%lld.%s.g_proj.weight", lp, (long long)L, a);
    MAT(R_KDA_O, H, P, "%s.%lld.%s.o_proj.weight", lp, (long long)L, a);
    emit(w, TC_LAYER, TK_CONV, R_KDA_QCONV, L, -1, 3, P, 1, c->conv_k, "%s.%lld.%s.q_conv1d.weight", lp, (long long)L, a);
    emit(w, TC_LAYER, TK_CONV, R_KDA_KCONV, L, -1, 3, P, 1, c->conv_k, "%s.%lld.%s.k_conv1d.weight", lp, (long long)L, a);
    emit(w, TC_LAYER, TK_CONV, R_KDA_VCONV, L, -1, 3, P, 1, c->conv_k, "%s.%lld.%s.v_conv1d.weight", lp, (long long)L, a);
    MAT(R_KDA_FA, D, H, "%s.%lld.%s.f_a_proj.weight", lp, (long long)L, a);
    MAT(R_KDA_FB, P, D, "%s.%lld.%s.f_b_proj.weight", lp, (long long)L, a);
    MAT(R_KDA_B, c->kda_heads, H, "%s.%lld.%s.b_proj.weight", lp, (long long)L, a);
    if (c->kda_softplus) {
        /* Kimi Linear: A_log [1, 1, heads, 1] and dt_bias published F32 */
        w->pub = DT_F32 + 1;
        emit(w, TC_LAYER, TK_VECTOR, R_KDA_ALOG, L, -1, 4, 1, 1, c->kda_heads, "%s.%lld.%s.A_log", lp, (long long)L, a);
        VEC(R_KDA_DTBIAS, P, "%s.%lld.%s.dt_bias", lp, (long long)L, a);
        w->pub = 0;
    } else {
        VEC(R_KDA_ALOG, c->kda_heads > D ? c->kda_heads : D, "%s.%lld.%s.A_log", lp, (long long)L, a);
        VEC(R_KDA_DTBIAS, P, "%s.%lld.%s.dt_bias", lp, (long long)L, a);
    }
    if (c->kda_g_lowrank) {
        MAT(R_KDA_GA, D, H, "%s.%lld.%s.g_a_proj.weight", lp, (long long)L, a);
        MAT(R_KDA_GB, P, D, "%s.%lld.%s.g_b_proj.weight", lp, (long long)L, a);
    }
    VEC(R_KDA_ONORM, D, "%s.%lld.%s.o_norm.weight", lp, (long long)L, a);
}

/* The dtype a norm weight is published in: DeepSeek-V3 (as V3.2, the one whose
 * dtypes are known) F32, the rest the writer's choice. */
static int norm_pub(const cfg *c) { return c->arch == ARCH_DEEPSEEK_V3 ? DT_F32 + 1 : 0; }

/* MLA: q through q-LoRA (q_a, its norm, q_b), or a direct q_proj (q_lora == 0,
 * in the q_b role); kv_a with its norm, kv_b, o_proj, the optional output gate. */
static void walk_mla(const cfg *c, int64_t L, walker *w) {
    const int64_t H = c->hidden, NH = c->n_heads;
    const char *lp = w->lp, *a = "self_attn";
    if (c->q_lora > 0) {
        MAT(R_MLA_QA, c->q_lora, H, "%s.%lld.%s.q_a_proj.weight", lp, (long long)L, a);
        w->pub = norm_pub(c);
        VEC(R_MLA_QA_NORM, c->q_lora, "%s.%lld.%s.q_a_layernorm.weight", lp, (long long)L, a);
        w->pub = 0;
        MAT(R_MLA_QB, NH * (c->qk_nope + c->qk_rope), c->q_lora, "%s.%lld.%s.q_b_proj.weight", lp, (long long)L, a);
    } else {
        MAT(R_MLA_QB, NH * (c->qk_nope + c->qk_rope), H, "%s.%lld.%s.q_proj.weight", lp, (long long)L, a);
    }
    MAT(R_MLA_KVA, c->kv_lora + c->qk_rope, H, "%s.%lld.%s.kv_a_proj_with_mqa.weight", lp, (long long)L, a);
    w->pub = norm_pub(c);
    VEC(R_MLA_KVA_NORM, c->kv_lora, "%s.%lld.%s.kv_a_layernorm.weight", lp, (long long)L, a);
    w->pub = 0;
    MAT(R_MLA_KVB, NH * (c->qk_nope + c->v_head), c->kv_lora, "%s.%lld.%s.kv_b_proj.weight", lp, (long long)L, a);
    MAT(R_MLA_O, H, NH * c->v_head, "%s.%lld.%s.o_proj.weight", lp, (long long)L, a);
    if (c->mla_out_gate) /* no output gate, no g_proj (mla_use_output_gate false) */
        MAT(R_MLA_G, NH * c->v_head, H, "%s.%lld.%s.g_proj.weight", lp, (long long)L, a);
}

static void walk_layer(const cfg *c, int64_t L, walker *w) {
    const int64_t H = c->hidden;
    const char *lp = w->lp;
    w->pub = norm_pub(c);
    VEC(R_IN_NORM, H, "%s.%lld.input_layernorm.weight", lp, (long long)L);
    VEC(R_POST_NORM, H, "%s.%lld.post_attention_layernorm.weight", lp, (long long)L);
    w->pub = 0;
    if (!c->plain_res) {
        VEC(R_ATTN_RES_NORM, H, "%s.%lld.self_attention_res_norm.weight", lp, (long long)L);
        VEC(R_ATTN_RES_PROJ, H, "%s.%lld.self_attention_res_proj.weight", lp, (long long)L);
        VEC(R_MLP_RES_NORM, H, "%s.%lld.mlp_res_norm.weight", lp, (long long)L);
        VEC(R_MLP_RES_PROJ, H, "%s.%lld.mlp_res_proj.weight", lp, (long long)L);
    }
    if (c->mtp && L == c->n_layers - 1) { /* the MTP layer's own input and head norms */
        w->pub = norm_pub(c);
        VEC(R_MTP_ENORM, H, "%s.%lld.enorm.weight", lp, (long long)L);
        VEC(R_MTP_HNORM, H, "%s.%lld.hnorm.weight", lp, (long long)L);
        VEC(R_MTP_HEAD_NORM, H, "%s.%lld.shared_head.norm.weight", lp, (long long)L);
        w->pub = 0;
        MAT(R_MTP_EH, H, 2 * H, "%s.%lld.eh_proj.weight", lp, (long long)L);
    }
    if (!c->is_mla[L]) walk_kda(c, L, w);
    else walk_mla(c, L, w);
    if (!cfg_is_moe(c, L)) {
        MAT(R_DENSE_GATE, c->dense_inter, H, "%s.%lld.mlp.gate_proj.weight", lp, (long long)L);
        MAT(R_DENSE_UP, c->dense_inter, H, "%s.%lld.mlp.up_proj.weight", lp, (long long)L);
        MAT(R_DENSE_DOWN, H, c->dense_inter, "%s.%lld.mlp.down_proj.weight", lp, (long long)L);
    } else {
        const char *m = c->ds_names ? "mlp" : "block_sparse_moe";
        const int64_t S = c->n_shared * c->moe_inter;
        MAT(R_MOE_ROUTER, c->n_experts, H, "%s.%lld.%s.gate.weight", lp, (long long)L, m);
        if (c->ds_names) w->pub = DT_F32 + 1; /* DeepSeek-V3 and K2 store the bias F32 */
        VEC(R_MOE_BIAS, c->n_experts, "%s.%lld.%s.gate.e_score_correction_bias", lp, (long long)L, m);
        w->pub = 0;
        if (!c->moe_plain) {
            MAT(R_MOE_LAT_DOWN, c->latent, H, "%s.%lld.%s.routed_expert_down_proj.weight", lp, (long long)L, m);
            MAT(R_MOE_LAT_UP, H, c->latent, "%s.%lld.%s.routed_expert_up_proj.weight", lp, (long long)L, m);
            if (c->latent_norm) /* latent_moe_use_norm false: the checkpoint has no norm */
                VEC(R_MOE_LAT_NORM, c->latent, "%s.%lld.%s.routed_expert_norm.weight", lp, (long long)L, m);
        }
        if (S > 0) {
            MAT(R_MOE_SH_GATE, S, H, "%s.%lld.%s.shared_experts.gate_proj.weight", lp, (long long)L, m);
            MAT(R_MOE_SH_UP, S, H, "%s.%lld.%s.shared_experts.up_proj.weight", lp, (long long)L, m);
            MAT(R_MOE_SH_DOWN, H, S, "%s.%lld.%s.shared_experts.down_proj.weight", lp, (long long)L, m);
        }
    }
}

/* One routed expert: w1 (gate), w2 (down), w3 (up); DeepSeek-V3 names them
 * mlp.experts.E.gate_proj / down_proj / up_proj. */
static void walk_expert(const cfg *c, int64_t L, int64_t E, int wf, walker *w) {
    const int64_t I = c->moe_inter, Z = c->latent;
    char tail[32], name[160];
    static const struct { const char *w, *ds; int rp, rs, rb; } k[3] = {
        {"w1", "gate_proj", R_EXP_W1P, R_EXP_W1S, R_EXP_W1},
        {"w2", "down_proj", R_EXP_W2P, R_EXP_W2S, R_EXP_W2},
        {"w3", "up_proj", R_EXP_W3P, R_EXP_W3S, R_EXP_W3}};
    const int ef = wf & SW_EXP_MASK;
    for (int i = 0; i < 3; i++) {
        int64_t rows = i == 1 ? Z : I, cols = i == 1 ? I : Z;
        const char *fmt = c->ds_names ? "%s.%lld.mlp.experts.%lld.%s" : "%s.%lld.block_sparse_moe.experts.%lld.%s";
        const char *nm = c->ds_names ? k[i].ds : k[i].w;
        if (ef != SW_EXP_MXFP4) {
            /* plain, FP8 and INT4 experts fill the plain roles (wt.fmt says which) */
            snprintf(tail, sizeof tail, "%s.weight", nm);
            snprintf(name, sizeof name, fmt, w->lp, (long long)L, (long long)E, tail);
            mat(w, TC_EXPERT, k[i].rb, L, E, rows, cols, ef == SW_EXP_FP8 ? WF_FP8 : ef == SW_EXP_INT4 ? WF_INT4 : WF_PLAIN, name);
        } else {
            snprintf(tail, sizeof tail, "%s.weight_packed", nm);
            emit(w, TC_EXPERT, TK_PACKED, k[i].rp, L, E, 2, rows, cols / 2, 0, fmt, w->lp, (long long)L, (long long)E, tail);
            snprintf(tail, sizeof tail, "%s.weight_scale", nm);
            emit(w, TC_EXPERT, TK_SCALE, k[i].rs, L, E, 2, rows, cols / MXFP4_GROUP, 0, fmt, w->lp, (long long)L, (long long)E, tail);
        }
    }
}

static void walk_head(const cfg *c, walker *w) {
    w->pub = norm_pub(c);
    emit(w, TC_FINAL, TK_VECTOR, R_FINAL_NORM, -1, -1, 1, c->hidden, 0, 0, "%snorm.weight", w->pfx);
    w->pub = 0;
    if (!c->plain_res) {
        emit(w, TC_FINAL, TK_VECTOR, R_OUT_RES_NORM, -1, -1, 1, c->hidden, 0, 0, "%soutput_attn_res_norm.weight", w->pfx);
        emit(w, TC_FINAL, TK_VECTOR, R_OUT_RES_PROJ, -1, -1, 1, c->hidden, 0, 0, "%soutput_attn_res_proj.weight", w->pfx);
    }
    emit(w, TC_LM_HEAD, TK_MATRIX, R_LM_HEAD, -1, -1, 2, c->vocab, c->hidden, 0, "%s", arch_of(c)->lm_head);
}

int schema_walk_layer(const cfg *c, int64_t L, int wf, schema_fn fn, void *ud) {
    walker w;
    walker_init(&w, c, wf, fn, ud);
    walk_layer(c, L, &w);
    return w.rc;
}

int schema_walk_expert(const cfg *c, int64_t L, int64_t E, int wf, schema_fn fn, void *ud) {
    walker w;
    walker_init(&w, c, wf, fn, ud);
    walk_expert(c, L, E, wf, &w);
    return w.rc;
}

int schema_walk(const cfg *c, int wf, schema_fn fn, void *ud) {
    walker w;
    walker_init(&w, c, wf, fn, ud);
    emit(&w, TC_EMBED, TK_MATRIX, R_EMBED, -1, -1, 2, c->vocab, c->hidden, 0, "%sembed_tokens.weight", w.pfx);
    for (int64_t L = 0; L < c->n_layers && !w.rc; L++) {
        walk_layer(c, L, &w);
        if (cfg_is_moe(c, L))
            for (int64_t E = 0; E < c->n_experts && !w.rc; E++) walk_expert(c, L, E, wf, &w);
    }
    walk_head(c, &w);
    return w.rc;
}

typedef struct { int role; char *buf; size_t n; } name_of;

static int name_fn(void *ud, const tspec *t) {
    name_of *x = ud;
    if (t->role != x->role) return 0;
    snprintf(x->buf, x->n, "%s", t->name);
    return 1;
}

void schema_expert_w1_name(const cfg *c, int64_t L, int64_t E, int packed, char *buf, size_t n) {
    name_of x = {packed ? R_EXP_W1P : R_EXP_W1, buf, n};
    if (n) buf[0] = 0;
    schema_walk_expert(c, L, E, !packed, name_fn, &x);
}

int schema_walk_head(const cfg *c, schema_fn fn, void *ud) {
    walker w;
    walker_init(&w, c, 0, fn, ud);
    walk_head(c, &w);
    return w.rc;
}

/* ====================================================================== census */

typedef struct cen {
    const cfg *c;
    cfg_census *o;
    uint64_t params, bytes; /* accumulators for one walk */
} cen;

/* Logical parameters of a tensor: packed MXFP4 codes hold two per byte, INT4
 * words eight; scales and shapes are metadata, not parameters. */
static uint64_t tparams(const tspec *t) {
    if (t->kind == TK_PACKED) return (uint64_t)t->numel * 2;
    if (t->kind == TK_I4_PACKED) return (uint64_t)t->numel * 8;
    if (t->kind == TK_SCALE || schema_is_companion(t->kind)) return 0;
    return (uint64_t)t->numel;
}

/* Bytes of a tensor as stored: float tensors at bf16, the rest at their
 * published dtype. */
static uint64_t tbytes(const tspec *t) {
    if (t->kind == TK_PACKED || t->kind == TK_SCALE) return (uint64_t)t->numel;
    if (t->pub_dtype && t->kind != TK_MATRIX && t->kind != TK_VECTOR && t->kind != TK_CONV)
        return (uint64_t)t->numel * st_dtype_size(t->pub_dtype - 1);
    return (uint64_t)t->numel * 2;
}

static int cen_add(void *ud, const tspec *t) {
    cen *k = ud;
    k->params += tparams(t);
    k->bytes += tbytes(t);
    return 0;
}

void schema_census(const cfg *c, cfg_census *o) {
    memset(o, 0, sizeof *o);
    /* The callers validate first; refuse quietly otherwise, as sizes could overflow. */
    if (cfg_validate(c, "census", NULL, 0)) return;
    cen k = {c, o, 0, 0};
    /* Model-level tensors (embed, final vectors, lm_head): the full walk with no
     * layers. Walking all 82,432 experts name by name would cost ~0.3 s, so the
     * layers are walked one by one and one expert per MoE layer stands for all. */
    cfg tmp;
    memcpy(&tmp, c, sizeof tmp);
    tmp.n_layers = 0;
    schema_walk(&tmp, c->wf, cen_add, &k);
    o->params_embed = k.params;
    o->embed_bytes_bf16 = k.bytes;
    uint64_t active_experts = 0;
    for (int64_t L = 0; L < c->n_layers; L++) {
        if (c->is_mla[L]) o->n_mla++; else o->n_kda++;
        k.params = k.bytes = 0;
        schema_walk_layer(c, L, c->wf, cen_add, &k);
        o->params_trunk += k.params;
        o->layer_bytes_bf16[L] = k.bytes;
        o->trunk_bytes_bf16 += k.bytes;
        if (!cfg_is_moe(c, L)) { o->n_dense++; continue; }
        o->n_moe++;
        k.params = k.bytes = 0;
        schema_walk_expert(c, L, 0, c->wf, cen_add, &k);
        o->expert_bytes = k.bytes;
        o->params_experts += k.params * (uint64_t)c->n_experts;
        o->experts_bytes += k.bytes * (uint64_t)c->n_experts;
        o->n_expert_total += (uint64_t)c->n_experts;
        active_experts += k.params * (uint64_t)c->topk;
    }
    o->params_total = o->params_embed + o->params_trunk + o->params_experts;
    /* Always-on weights (trunk, embeddings and head, as the seed census counts
     * them) plus top-k routed experts in every MoE layer. */
    o->params_active = o->params_embed + o->params_trunk + active_experts;
    o->mla_cache_elems_per_pos = (uint64_t)o->n_mla * (uint64_t)(c->kv_lora + c->qk_rope);
    const uint64_t P = (uint64_t)(c->kda_heads * c->kda_head_dim);
    o->kda_state_elems = (uint64_t)o->n_kda *
        ((uint64_t)c->kda_heads * (uint64_t)c->kda_head_dim * (uint64_t)c->kda_head_dim +
         3 * P * (uint64_t)(c->conv_k - 1));
}
