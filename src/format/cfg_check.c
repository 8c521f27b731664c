/*
 * cfg_check.c: the structural validation every config passes, read from
 * config.json (cfg_parse) or built by a preset (cfg_validate): widths and counts
 * in range, the layer map consistent, the whole model under the parameter
 * ceiling, special ids inside the vocabulary. Every problem is one line naming
 * the key; all of them are reported in one pass.
 *
 * Apart from cfg.c because it is the same for every architecture and never
 * touches JSON: cfg.c turns a file into fields (and knows which failed to
 * parse: `have`), this file judges the fields.
 */
#include "cfg.h"
#include "cfg_priv.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

/* Widths above this are refused so that every tensor's element count fits int64
 * with room to spare (2^24 x 2^24 = 2^48); K3's largest width is the vocabulary. */
#define CFG_MAX_DIM (INT64_C(1) << 24)
/* Whole-model parameter ceiling (about 400x K3): keeps every census sum exact. */
#define CFG_MAX_PARAMS 1.0e15

/* ============================================================== validation */

typedef struct vd {
    const char *what;
    sbuf *pb;
    uint64_t have;
} vd;

static int has(const vd *v, int a, int b) { return HAVE(v->have, a) && HAVE(v->have, b); }

static void vproblem(vd *v, const char *fmt, ...) ST_PRINTF(2, 3);
static void vproblem(vd *v, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    cfg_problem_va(v->pb, v->what, fmt, ap);
    va_end(ap);
}

/* Width in 1..CFG_MAX_DIM (or 0..max when zero_ok). Returns 1 if it is usable. */
static int vdim(vd *v, int id, int64_t x, int zero_ok) {
    if (!HAVE(v->have, id)) return 0;
    if (x < (zero_ok ? 0 : 1) || x > CFG_MAX_DIM) {
        vproblem(v, "'%s' = %lld must be in %d..%lld", cfg_field_name(id), (long long)x, zero_ok ? 0 : 1,
                 (long long)CFG_MAX_DIM);
        return 0;
    }
    return 1;
}

static void vpos(vd *v, int id, double x) {
    if (HAVE(v->have, id) && !(isfinite(x) && x > 0))
        vproblem(v, "'%s' = %g must be a positive number", cfg_field_name(id), x);
}

/* Group-limited routing and RoPE (DeepSeek-V3, arch_deepseek_v3.c): the
 * experts split evenly in n_group groups of at least 2 (a group's score is the
 * sum of its top 2), topk_group of them kept, top-k among their experts. */
static void check_groups(vd *v, const cfg *c) {
    if (c->n_group > 1 && has(v, F_NEXP, F_TOPK)) {
        const int64_t G = c->n_group, E = c->n_experts;
        if (E % G || E / G < 2)
            vproblem(v, "'n_group' = %lld must divide 'n_routed_experts' = %lld into groups of at least 2", (long long)G,
                     (long long)E);
        else if (c->topk_group < 1 || c->topk_group > G)
            vproblem(v, "'topk_group' = %lld must be in 1..%lld (n_group)", (long long)c->topk_group, (long long)G);
        else if (c->topk > c->topk_group * (E / G))
            vproblem(v, "'num_experts_per_tok' = %lld is more than the %lld experts of topk_group = %lld groups",
                     (long long)c->topk, (long long)(c->topk_group * (E / G)), (long long)c->topk_group);
    }
    if (c->n_group < 0 || (c->n_group <= 1 && c->topk_group > 1))
        vproblem(v, "'topk_group' = %lld needs 'n_group' > 1, got %lld", (long long)c->topk_group, (long long)c->n_group);
    if (c->mla_rope) {
        if (!(isfinite(c->rope_theta) && c->rope_theta > 1))
            vproblem(v, "'rope_theta' = %g must be a number above 1", c->rope_theta);
        if (!(isfinite(c->yarn_factor) && c->yarn_factor >= 1 && c->yarn_factor <= 1e6))
            vproblem(v, "'rope_scaling.factor' = %g must be in 1..1e6", c->yarn_factor);
        if (c->yarn_factor > 1 && c->yarn_orig_ctx < 1)
            vproblem(v, "'rope_scaling.original_max_position_embeddings' = %lld must be positive", (long long)c->yarn_orig_ctx);
        const double b[4] = {c->yarn_beta_fast, c->yarn_beta_slow, c->yarn_mscale, c->yarn_mscale_all_dim};
        for (int i = 0; i < 4; i++)
            if (!(isfinite(b[i]) && b[i] >= 0 && b[i] <= 1e6))
                vproblem(v, "rope_scaling's beta_fast, beta_slow, mscale and mscale_all_dim must be in 0..1e6, got %g", b[i]);
        if (c->yarn_factor > 1 && !(c->yarn_beta_fast > 0 && c->yarn_beta_slow > 0))
            vproblem(v, "rope_scaling's beta_fast and beta_slow must be positive");
        if (c->qk_rope % 2)
            vproblem(v, "'qk_rope_head_dim' = %lld must be even (RoPE rotates pairs)", (long long)c->qk_rope);
    }
}

/* Widths, counts and scalars one by one; 0 when a basic width is missing or
 * unusable (the checks after the layer map need them all). */
static int check_fields(vd *v, const cfg *c) {
    int ok = 1;
    if (HAVE(v->have, F_LAYERS) && (c->n_layers < 1 || c->n_layers > CFG_MAX_LAYERS)) {
        vproblem(v, "'num_hidden_layers' = %lld must be in 1..%d", (long long)c->n_layers, CFG_MAX_LAYERS);
        ok = 0;
    }
    ok &= vdim(v, F_HIDDEN, c->hidden, 0);
    ok &= vdim(v, F_VOCAB, c->vocab, 0);
    ok &= vdim(v, F_KDA_HEADS, c->kda_heads, 0);
    ok &= vdim(v, F_KDA_D, c->kda_head_dim, 0);
    ok &= vdim(v, F_NHEADS, c->n_heads, 0);
    ok &= vdim(v, F_QLORA, c->q_lora, c->arch != ARCH_K3); /* 0: a direct q_proj */
    ok &= vdim(v, F_KVLORA, c->kv_lora, 0);
    ok &= vdim(v, F_NOPE, c->qk_nope, 0);
    ok &= vdim(v, F_ROPE, c->qk_rope, 1); /* the shared rope slot may be absent */
    ok &= vdim(v, F_VHEAD, c->v_head, 0);
    ok &= vdim(v, F_NEXP, c->n_experts, 0);
    ok &= vdim(v, F_LATENT, c->latent, 0);
    ok &= vdim(v, F_MOE_I, c->moe_inter, 0);
    ok &= vdim(v, F_DENSE_I, c->dense_inter, 0);
    ok &= vdim(v, F_CONV, c->conv_k, 0);
    ok &= vdim(v, F_ARB, c->attn_res_block, 0);
    ok &= vdim(v, F_NSHARED, c->n_shared, 1);
    /* The expert matrices are quantised along their input width in groups of 32:
     * w1/w3 read the latent, w2 reads the expert's intermediate. */
    if (!c->moe_plain && HAVE(v->have, F_LATENT) && c->latent > 0 && c->latent % MXFP4_GROUP)
        vproblem(v, "'routed_expert_hidden_size' = %lld must be a multiple of %d (the MXFP4 group)",
                 (long long)c->latent, MXFP4_GROUP);
    if (!c->moe_plain && HAVE(v->have, F_MOE_I) && c->moe_inter > 0 && c->moe_inter % MXFP4_GROUP)
        vproblem(v, "'moe_intermediate_size' = %lld must be a multiple of %d (the MXFP4 group)",
                 (long long)c->moe_inter, MXFP4_GROUP);
    if (has(v, F_TOPK, F_NEXP)) {
        int64_t hi = c->n_experts < CFG_MAX_TOPK ? c->n_experts : CFG_MAX_TOPK;
        if (c->topk < 1 || c->topk > hi)
            vproblem(v, "'num_experts_per_token' = %lld must be in 1..%lld (min of num_experts = %lld and %d)",
                     (long long)c->topk, (long long)hi, (long long)c->n_experts, CFG_MAX_TOPK);
    } else if (HAVE(v->have, F_TOPK) && (c->topk < 1 || c->topk > CFG_MAX_TOPK)) {
        vproblem(v, "'num_experts_per_token' = %lld must be in 1..%d", (long long)c->topk, CFG_MAX_TOPK);
    }
    if (has(v, F_FDENSE, F_LAYERS) && (c->first_dense < 0 || c->first_dense > c->n_layers))
        vproblem(v, "'first_k_dense_replace' = %lld must be in 0..%lld (num_hidden_layers)",
                 (long long)c->first_dense, (long long)c->n_layers);
    vpos(v, F_EPS, c->rms_eps);
    if (!c->act_silu) {
        vpos(v, F_B1, c->situ_b1);
        vpos(v, F_B2, c->situ_b2);
    }
    if (c->kv_norm_eps < 0 || !isfinite(c->kv_norm_eps))
        vproblem(v, "kv_a_layernorm epsilon %g must be a non-negative number", c->kv_norm_eps);
    if (c->moe_plain && HAVE(v->have, F_LATENT) && c->latent != c->hidden)
        vproblem(v, "experts on the hidden dim need latent = hidden_size, got %lld", (long long)c->latent);
    vpos(v, F_RSCALE, c->routed_scale);
    /* finite is not enough: 1e308 scales every routed output to inf */
    if (HAVE(v->have, F_RSCALE) && isfinite(c->routed_scale) && c->routed_scale > CFG_MAX_ROUTED_SCALE)
        vproblem(v, "'%s' = %g is absurd (at most %g)", cfg_field_name(F_RSCALE), c->routed_scale, CFG_MAX_ROUTED_SCALE);
    if (HAVE(v->have, F_GLB) && !c->kda_softplus && !c->no_kda && !(isfinite(c->gate_lb) && c->gate_lb < 0))
        vproblem(v, "'gate_lower_bound' = %g must be negative", c->gate_lb);
    check_groups(v, c);
    return ok;
}

/* The layer map: the parser fills is_mla from the list; presets fill it
 * directly, so the count and the tail are checked here too. 0 when it cannot
 * be checked (no layer list or no usable layer count). */
static int check_layer_map(vd *v, const cfg *c) {
    if (has(v, F_FULL, F_LAYERS) && c->n_layers >= 1 && c->n_layers <= CFG_MAX_LAYERS) {
        int64_t n = 0, beyond = 0;
        for (int64_t L = 0; L < CFG_MAX_LAYERS; L++) {
            if (c->is_mla[L] > 1) beyond++;
            else if (c->is_mla[L]) { if (L < c->n_layers) n++; else beyond++; }
        }
        if (beyond) vproblem(v, "layer map marks %lld layers beyond num_hidden_layers = %lld", (long long)beyond,
                             (long long)c->n_layers);
        if (n != c->n_mla)
            vproblem(v, "layer map holds %lld full-attention layers but n_mla = %lld", (long long)n, (long long)c->n_mla);
        if (n < 1) vproblem(v, "'full_attn_layers' is empty: at least one full-attention (MLA) layer is needed");
        if (n >= c->n_layers && !c->no_kda)
            vproblem(v, "'full_attn_layers' lists all %lld layers: no KDA layer is left", (long long)c->n_layers);
        if (c->no_kda && n != c->n_layers)
            vproblem(v, "every layer of this architecture is MLA: the layer map holds %lld of %lld", (long long)n,
                     (long long)c->n_layers);
        return 1;
    }
    return 0;
}

/* Derived widths stay under the same ceiling, then the whole model under
 * CFG_MAX_PARAMS, so census sums never wrap (only when every field is there
 * and usable: ok). */
static void check_model_size(vd *v, const cfg *c, int ok) {
    if (ok && HAVE(v->have, F_LAYERS) && (v->have & ALL_FIELDS) == ALL_FIELDS) {
        const struct { const char *n; double w; } d[] = {
            {"num_heads x head_dim (KDA)", (double)c->kda_heads * (double)c->kda_head_dim},
            {"num_attention_heads x (qk_nope_head_dim + qk_rope_head_dim)", (double)c->n_heads * (double)(c->qk_nope + c->qk_rope)},
            {"num_attention_heads x (qk_nope_head_dim + v_head_dim)", (double)c->n_heads * (double)(c->qk_nope + c->v_head)},
            {"num_shared_experts x moe_intermediate_size", (double)c->n_shared * (double)c->moe_inter},
        };
        for (size_t i = 0; i < sizeof d / sizeof d[0]; i++)
            if (d[i].w > (double)CFG_MAX_DIM) {
                vproblem(v, "%s = %.0f is larger than %lld", d[i].n, d[i].w, (long long)CFG_MAX_DIM);
                ok = 0;
            }
        if (ok) {
            /* An upper bound from the widths alone, not the tensor walk (schema.c
             * sits above the config and counts exactly): every trunk tensor of a
             * layer is at most the widest width squared (fewer than 40 of them),
             * an expert three matrices of its input width x moe_intermediate_size. */
            double w = 0;
            const double ws[] = {(double)c->hidden, (double)c->dense_inter, (double)c->moe_inter, (double)c->latent,
                                 (double)c->q_lora, (double)(c->kv_lora + c->qk_rope), (double)c->n_experts,
                                 d[0].w, d[1].w, d[2].w, d[3].w};
            for (size_t i = 0; i < sizeof ws / sizeof ws[0]; i++) w = ws[i] > w ? ws[i] : w;
            const double in = (double)(c->latent > c->hidden ? c->latent : c->hidden);
            double total = 2.0 * (double)c->vocab * (double)c->hidden + 4.0 * (double)c->hidden;
            for (int64_t L = 0; L < c->n_layers; L++) {
                total += 40.0 * w * w;
                if (cfg_is_moe(c, L)) total += (double)c->n_experts * 3.0 * in * (double)c->moe_inter;
            }
            if (total > CFG_MAX_PARAMS)
                vproblem(v, "the model would have up to %.3g parameters, more than the %.0g supported", total, CFG_MAX_PARAMS);
        }
    }
}

/* Special ids must be inside the vocabulary. */
static void check_ids(vd *v, const cfg *c) {
    if (HAVE(v->have, F_VOCAB) && c->vocab > 0) {
        if (c->bos_id >= c->vocab) vproblem(v, "'bos_token_id' = %lld is not below vocab_size = %lld", (long long)c->bos_id, (long long)c->vocab);
        if (c->pad_id >= c->vocab) vproblem(v, "'pad_token_id' = %lld is not below vocab_size = %lld", (long long)c->pad_id, (long long)c->vocab);
        for (int64_t i = 0; i < c->n_eos && i < CFG_MAX_EOS; i++)
            if (c->eos_ids[i] < 0 || c->eos_ids[i] >= c->vocab)
                vproblem(v, "'eos_token_id' %lld is not in 0..%lld", (long long)c->eos_ids[i], (long long)c->vocab - 1);
    }
    if (c->n_eos < 0 || c->n_eos > CFG_MAX_EOS) vproblem(v, "n_eos = %lld must be in 0..%d", (long long)c->n_eos, CFG_MAX_EOS);
    if (c->bos_id < -1 || c->pad_id < -1) vproblem(v, "bos/pad ids must be -1 (absent) or token ids");
    if (c->max_ctx < 1) vproblem(v, "'max_position_embeddings' = %lld must be positive", (long long)c->max_ctx);
}

void cfg_check_all(const cfg *c, uint64_t have, const char *what, sbuf *pb) {
    vd v = {what, pb, have};
    int ok = check_fields(&v, c);
    ok &= check_layer_map(&v, c);
    check_model_size(&v, c, ok);
    check_ids(&v, c);
}

int cfg_validate(const cfg *c, const char *what, char *err, size_t errlen) {
    sbuf pb = {0};
    cfg_check_all(c, ALL_FIELDS, what ? what : "config", &pb);
    if (pb.n) return cfg_flush_problems(&pb, err, errlen);
    sbuf_free(&pb);
    if (err && errlen) err[0] = 0;
    return STRATA_OK;
}
