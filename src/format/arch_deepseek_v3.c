/*
 * arch_deepseek_v3.c: the DeepSeek-V3 descriptions (DeepseekV3ForCausalLM):
 * model_type deepseek_v3 (DeepSeek-V3 / R1 / V3.1), kimi_k2 (Kimi K2-Instruct,
 * K2-Thinking) and K2.5's kimi_k25 wrapper (language-model keys under
 * text_config, tensors under language_model.; its vision_tower.* and
 * mm_projector.* tensors are not the language model's and stay unread). Math:
 * ../shared/spec/family-math.md sections 6-8 and 12, docs/architecture.md
 * (Architectures). Against K3 (cfg flags):
 *   - flat config, DeepSeek's key names (n_routed_experts, num_experts_per_tok,
 *     n_shared_experts, norm_topk_prob: cfg.c's aliases) and the keys read below
 *     (n_group, topk_group, rope_theta, rope_scaling, num_nextn_predict_layers);
 *   - every layer MLA (no_kda), plain pre-norm residual (plain_res);
 *   - MLA with q-LoRA, no output gate, RoPE with YaRN on the 64-wide rope slot of
 *     q and of the shared k_pe (mla_rope; the latent cache holds k_pe rotated),
 *     softmax scale (nope + rope)^-1/2 m^2, m = 0.1 mscale_all_dim ln(factor) + 1;
 *   - dense SwiGLU layers below first_k_dense_replace, SwiGLU experts on the
 *     hidden dim (act_silu, moe_plain) named mlp.experts.E.{gate,up,down}_proj,
 *     shared experts mlp.shared_experts.* (ds_names);
 *   - sigmoid router on f32 logits, e_score_correction_bias for the selection
 *     only, group-limited (n_group, topk_group), weights from the unbiased
 *     sigmoid, renormalised (+1e-20) when norm_topk_prob, times ρ;
 *   - the MTP layers (model.layers.<num_hidden_layers>.*) are never read.
 *
 * Choices where the sources differ (written down for tests/reference too):
 *   - q_a_layernorm and kv_a_layernorm epsilon 1e-6: the class default of the
 *     RMSNorm that Hugging Face's DeepseekV3Attention and DeepSeek's reference
 *     build them with; vLLM passes rms_norm_eps (equal for DeepSeek-V3, 1e-5 vs
 *     1e-6 for K2.5). The other norms use rms_norm_eps.
 *   - RoPE pairs are adjacent elements (2i, 2i+1), DeepSeek's reference and
 *     vLLM's is_neox_style=False on the checkpoint's own row order. Hugging Face's
 *     rope_interleave=True permutes each head's rope slot to [even | odd] first and
 *     then rotates halves: the same dot products; only a stored k_pe's order
 *     differs. rope_interleave false (a re-permuted checkpoint) is refused.
 *   - Frequencies, angles and cos/sin in double (HF: f32 frequencies, bf16 cos/sin).
 *   - Groups not kept are out of the top-k altogether (vLLM, DeepSeek's -inf
 *     mask); Hugging Face's masked_fill(0.0) differs only when every kept score is
 *     negative.
 *   - The softmax-scale correction is always on when rope_scaling is there (HF,
 *     vLLM); DeepSeek's reference applies it only past original_seq_len.
 */
#include "arch.h"
#include "cfg.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include "base.h"

#define DS_LOWRANK_NORM_EPS 1e-6

static const fixed_key k_fixed[] = {
    {"scoring_func", {"\"sigmoid\""}, "the router scores experts with a sigmoid"},
    {"topk_method", {"\"noaux_tc\""}, "experts are chosen by the biased sigmoid scores, group-limited (noaux_tc)"},
    {"hidden_act", {"\"silu\""}, "the dense MLP and the experts are SiLU-gated"},
    {"moe_layer_freq", {"1"}, "every layer from first_k_dense_replace on is MoE"},
    {"tie_word_embeddings", {"false"}, "lm_head is its own tensor, not the embedding"},
    {"attention_bias", {"false"}, "the attention projections have no bias"},
    {"rope_interleave", {"true"}, "RoPE rotates adjacent pairs of the checkpoint's rope slot"},
    {"quantization_config.quant_method", {"\"fp8\"", "\"compressed-tensors\""},
     "weights are bf16, FP8 e4m3 with 128x128 block scales, or compressed-tensors pack-quantized INT4"},
    {"quantization_config.fmt", {"\"e4m3\""}, "FP8 weights are e4m3"},
    {"quantization_config.format", {"\"pack-quantized\""}, "compressed-tensors weights are pack-quantized INT4"},
};

static void ds_defaults(cfg *c) {
    c->plain_res = 1;
    c->act_silu = 1;
    c->moe_plain = 1;
    c->mla_out_gate = 0;
    c->latent_norm = 0;
    c->no_kda = 1;
    c->ds_names = 1;
    c->mla_rope = 1;
    c->wf = SW_EXP_PLAIN; /* bf16 unless quantization_config says FP8 / INT4 (no release is MXFP4) */
    c->kv_norm_eps = DS_LOWRANK_NORM_EPS;
    c->qa_norm_eps = DS_LOWRANK_NORM_EPS;
    /* Hugging Face DeepseekV3Config's defaults for the keys read below */
    c->rope_theta = 10000.0;
    c->yarn_factor = 1.0;
    c->yarn_beta_fast = 32.0;
    c->yarn_beta_slow = 1.0;
    c->yarn_mscale = 1.0;
    c->yarn_mscale_all_dim = 0.0;
    c->n_group = 1;
    c->topk_group = 1;
    /* no KDA: its widths are unused, kept valid */
    c->kda_heads = 1;
    c->kda_head_dim = 1;
    c->conv_k = 1;
    c->gate_lb = -5.0;
    c->situ_b1 = c->situ_b2 = 1.0;
}

/* Fields K3 reads and DeepSeek-V3 derives: the experts read the hidden state,
 * every layer is MLA. */
static void ds_finish(cfg *c) {
    c->latent = c->hidden;
    c->attn_res_block = c->n_layers >= 1 ? c->n_layers : 1;
    const int64_t n = c->n_layers >= 1 && c->n_layers <= CFG_MAX_LAYERS ? c->n_layers : 0;
    memset(c->is_mla, 0, sizeof c->is_mla);
    memset(c->is_mla, 1, (size_t)n);
    c->n_mla = n;
}

/* ------------------------------------------------------------- reader */

/* An optional number (*dst keeps its default when absent or null); integers
 * read as numbers too (beta_fast 32 and 32.0 both appear in the releases). */
static void opt_num(struct cfg_rd *r, const json_t *obj, const char *opfx, const char *name, double *dst) {
    char path[160], tb[64];
    const json_t *v = obj ? json_object_get(obj, name) : NULL;
    snprintf(path, sizeof path, "%s%s", opfx, name);
    if (!obj) v = cfg_rd_find(r, name, path, sizeof path);
    if (!v || json_is_null(v)) return;
    if (!json_is_number(v)) { cfg_rd_problem(r, "'%s' must be a number, got %s", path, cfg_rd_jtype(v, tb, sizeof tb)); return; }
    *dst = json_number_value(v);
}

static void opt_int(struct cfg_rd *r, const json_t *obj, const char *opfx, const char *name, int64_t lo, int64_t *dst) {
    char path[160], tb[64];
    const json_t *v = obj ? json_object_get(obj, name) : NULL;
    snprintf(path, sizeof path, "%s%s", opfx, name);
    if (!obj) v = cfg_rd_find(r, name, path, sizeof path);
    if (!v || json_is_null(v)) return;
    if (!json_is_integer(v) || json_integer_value(v) < lo) {
        cfg_rd_problem(r, "'%s' must be an integer >= %lld, got %s", path, (long long)lo, cfg_rd_jtype(v, tb, sizeof tb));
        return;
    }
    *dst = json_integer_value(v);
}

/* rope_scaling (transformers 5 writes it as rope_parameters): YaRN or absent. */
static void read_rope(cfg *c, struct cfg_rd *r) {
    char path[160], tb[64], sub[192];
    opt_num(r, NULL, "", "rope_theta", &c->rope_theta);
    const json_t *rs = cfg_rd_find(r, "rope_scaling", path, sizeof path);
    if (!rs) rs = cfg_rd_find(r, "rope_parameters", path, sizeof path);
    if (!rs) return; /* plain RoPE: factor 1 */
    if (!json_is_object(rs)) { cfg_rd_problem(r, "'%s' must be an object, got %s", path, cfg_rd_jtype(rs, tb, sizeof tb)); return; }
    const json_t *ty = json_object_get(rs, "type");
    if (!ty || json_is_null(ty)) ty = json_object_get(rs, "rope_type");
    if (!json_is_string(ty) || strcmp(json_string_value(ty), "yarn")) {
        if (json_is_string(ty)) snprintf(tb, sizeof tb, "\"%.40s\"", json_string_value(ty));
        cfg_rd_problem(r, "'%s.type' is %s: not supported, this engine implements only \"yarn\" (RoPE scaling)", path,
                       json_is_string(ty) ? tb : ty ? cfg_rd_jtype(ty, tb, sizeof tb) : "missing");
        return;
    }
    snprintf(sub, sizeof sub, "%s.", path);
    const json_t *f = json_object_get(rs, "factor");
    if (!f || json_is_null(f)) cfg_rd_problem(r, "missing required key '%sfactor'", sub);
    opt_num(r, rs, sub, "factor", &c->yarn_factor);
    if (!json_object_get(rs, "original_max_position_embeddings"))
        cfg_rd_problem(r, "missing required key '%soriginal_max_position_embeddings'", sub);
    opt_int(r, rs, sub, "original_max_position_embeddings", 1, &c->yarn_orig_ctx);
    opt_num(r, rs, sub, "beta_fast", &c->yarn_beta_fast);
    opt_num(r, rs, sub, "beta_slow", &c->yarn_beta_slow);
    opt_num(r, rs, sub, "mscale", &c->yarn_mscale);
    opt_num(r, rs, sub, "mscale_all_dim", &c->yarn_mscale_all_dim);
    opt_num(r, rs, sub, "rope_theta", &c->rope_theta); /* rope_parameters carries it too */
}

/* DeepSeek-V3.2's sparse attention adds an indexer per layer: refused by name. */
static const char *const k_dsa_keys[] = {"index_topk", "index_n_heads", "index_head_dim"};

static void ds_read(cfg *c, struct cfg_rd *r) {
    char path[160], tb[64];
    opt_int(r, NULL, "", "n_group", 1, &c->n_group);
    opt_int(r, NULL, "", "topk_group", 1, &c->topk_group);
    opt_int(r, NULL, "", "num_nextn_predict_layers", 0, &c->n_mtp);
    read_rope(c, r);
    for (size_t i = 0; i < sizeof k_dsa_keys / sizeof *k_dsa_keys; i++)
        if (cfg_rd_find(r, k_dsa_keys[i], path, sizeof path))
            cfg_rd_problem(r, "'%s' is set: DeepSeek-V3.2's sparse attention (the DSA indexer) is not supported", path);
    const json_t *q = cfg_rd_quant(r, path, sizeof path);
    const json_t *bs = q ? json_object_get(q, "weight_block_size") : NULL;
    if (bs && !json_is_null(bs) &&
        !(json_is_array(bs) && json_array_size(bs) == 2 && json_is_integer(json_array_get(bs, 0)) &&
          json_integer_value(json_array_get(bs, 0)) == 128 && json_is_integer(json_array_get(bs, 1)) &&
          json_integer_value(json_array_get(bs, 1)) == 128))
        cfg_rd_problem(r, "'%s.weight_block_size' is %s: not supported, FP8 scales are per 128x128 block", path,
                       json_is_array(bs) ? "another block" : cfg_rd_jtype(bs, tb, sizeof tb));
}

const char *arch_refused(const char *model_type, const char *const *archs, size_t n_archs) {
    static const char why[] = "DeepSeek-V3.2 (model_type deepseek_v32, DeepseekV32ForCausalLM) is not supported: "
                              "its sparse attention (the DSA indexer) is not implemented";
    if (model_type && !strcmp(model_type, "deepseek_v32")) return why;
    for (size_t i = 0; i < n_archs; i++)
        if (archs[i] && !strcmp(archs[i], "DeepseekV32ForCausalLM")) return why;
    return NULL;
}

/* ------------------------------------------------------------- YaRN */

/* HF's yarn_get_mscale: 1 for factor <= 1, else 0.1 m ln(factor) + 1. */
static double yarn_m(double factor, double m) { return factor <= 1 ? 1.0 : 0.1 * m * log(factor) + 1.0; }

/* The ramp's ends (family-math 8.2): the pair index whose wavelength makes
 * `rot` turns over the original context, floored / ceiled, clamped. */
static double yarn_dim(const cfg *c, double rot) {
    return (double)c->qk_rope * log((double)c->yarn_orig_ctx / (rot * 2 * M_PI)) / (2 * log(c->rope_theta));
}

double arch_rope_inv_freq(const cfg *c, int64_t i) {
    const double extra = 1.0 / pow(c->rope_theta, (double)(2 * i) / (double)c->qk_rope);
    if (c->yarn_factor <= 1) return extra;
    const double inter = extra / c->yarn_factor;
    double lo = floor(yarn_dim(c, c->yarn_beta_fast)), hi = ceil(yarn_dim(c, c->yarn_beta_slow));
    if (lo < 0) lo = 0;
    if (hi > (double)(c->qk_rope - 1)) hi = (double)(c->qk_rope - 1);
    if (lo == hi) hi += 0.001;
    double ramp = ((double)i - lo) / (hi - lo);
    ramp = ramp < 0 ? 0 : ramp > 1 ? 1 : ramp;
    return extra * (1 - ramp) + inter * ramp;
}

double arch_rope_mscale(const cfg *c) {
    return yarn_m(c->yarn_factor, c->yarn_mscale) / yarn_m(c->yarn_factor, c->yarn_mscale_all_dim);
}

double arch_mla_scale(const cfg *c) {
    double s = 1.0 / sqrt((double)(c->qk_nope + c->qk_rope));
    if (c->mla_rope && c->yarn_mscale_all_dim > 0) {
        double m = yarn_m(c->yarn_factor, c->yarn_mscale_all_dim);
        s *= m * m;
    }
    return s;
}

/* ------------------------------------------------------------- descriptions */

#define DS_SKIP (ARCH_BIT(F_KDA_HEADS) | ARCH_BIT(F_KDA_D) | ARCH_BIT(F_CONV) | ARCH_BIT(F_GLB) | ARCH_BIT(F_MLA_GATE) | \
                 ARCH_BIT(F_LATENT) | ARCH_BIT(F_LNORM) | ARCH_BIT(F_ARB) | ARCH_BIT(F_B1) | ARCH_BIT(F_B2) |        \
                 ARCH_BIT(F_FULL))

/* The three descriptions differ only in their names and where the language
 * model's tensors sit; the math, keys and reader are the same. */
#define DS_DESC(ID, NAME, ARCHITECTURE, PFX, LM_HEAD)                                                          \
    {                                                                                                          \
        .id = ID, .name = NAME, .model_type = NAME, .architecture = ARCHITECTURE, .pfx = PFX, .lm_head = LM_HEAD, \
        .keys_skip = DS_SKIP, .keys_nullable = ARCH_BIT(F_QLORA), .fixed = k_fixed,                           \
        .n_fixed = sizeof k_fixed / sizeof k_fixed[0], .defaults = ds_defaults, .finish = ds_finish,          \
        .to_json = arch_deepseek_v3_to_json, .read = ds_read,                                                  \
    }

const arch_desc arch_deepseek_v3 =
    DS_DESC(ARCH_DEEPSEEK_V3, "deepseek_v3", "DeepseekV3ForCausalLM", "model.", "lm_head.weight");
const arch_desc arch_kimi_k2 = DS_DESC(ARCH_KIMI_K2, "kimi_k2", "DeepseekV3ForCausalLM", "model.", "lm_head.weight");
const arch_desc arch_kimi_k25 = DS_DESC(ARCH_KIMI_K25, "kimi_k25", "KimiK25ForConditionalGeneration",
                                        "language_model.model.", "language_model.lm_head.weight");
#undef DS_DESC

/* The scalars every DeepSeek-V3 release shares (family-math 8.1). */
static void ds_common(cfg *c) {
    memset(c, 0, sizeof *c);
    ds_defaults(c);
    c->hidden = 7168;
    c->n_layers = 61;
    c->q_lora = 1536;
    c->kv_lora = 512;
    c->qk_nope = 128;
    c->qk_rope = 64;
    c->v_head = 128;
    c->topk = 8;
    c->n_shared = 1;
    c->moe_inter = 2048;
    c->dense_inter = 18432;
    c->moe_renorm = 1;
    c->yarn_orig_ctx = 4096;
    c->yarn_mscale = 1.0;
    c->yarn_mscale_all_dim = 1.0;
    c->pad_id = -1;
    c->n_eos = 1;
}

void cfg_deepseek_v3(cfg *c) {
    ds_common(c);
    c->arch = ARCH_DEEPSEEK_V3;
    c->vocab = 129280;
    c->rms_eps = 1e-6;
    c->n_heads = 128;
    c->n_experts = 256;
    c->first_dense = 3;
    c->n_group = 8;
    c->topk_group = 4;
    c->routed_scale = 2.5;
    c->rope_theta = 10000.0;
    c->yarn_factor = 40.0;
    c->yarn_beta_fast = 32.0;
    c->yarn_beta_slow = 1.0;
    c->bos_id = 0;
    c->eos_ids[0] = 1;
    c->max_ctx = 163840;
    c->n_mtp = 1;
    ds_finish(c);
}

void cfg_kimi_k2_thinking(cfg *c) {
    ds_common(c);
    c->arch = ARCH_KIMI_K2;
    c->vocab = 163840;
    c->rms_eps = 1e-5;
    c->n_heads = 64;
    c->n_experts = 384;
    c->first_dense = 1;
    c->routed_scale = 2.827;
    c->rope_theta = 50000.0;
    c->yarn_factor = 64.0;
    c->yarn_beta_fast = 1.0;
    c->yarn_beta_slow = 1.0;
    c->bos_id = 163584;
    c->pad_id = 163839;
    c->eos_ids[0] = 163585;
    c->max_ctx = 262144;
    ds_finish(c);
}

/* ------------------------------------------------------------- writer */

/* The published flat shape (family-configs/deepseek-r1.config.json, keys in its
 * order); kimi_k25 wraps the same keys in text_config (model_type deepseek_v3
 * there) as K2.5's config does. */
char *arch_deepseek_v3_to_json(const cfg *c) {
    sbuf b = {0};
    const int k25 = c->arch == ARCH_KIMI_K25;
    const char *in = k25 ? "    " : "  ";
#define I(k, v) sbuf_printf(&b, "%s\"%s\": %lld,\n", in, k, (long long)(v))
#define BO(k, v) sbuf_printf(&b, "%s\"%s\": %s,\n", in, k, (v) ? "true" : "false")
#define S(k, v) sbuf_printf(&b, "%s\"%s\": \"%s\",\n", in, k, v)
#define N(k, v) do { sbuf_printf(&b, "%s\"%s\": ", in, k); cfg_json_num(&b, v); sbuf_printf(&b, ",\n"); } while (0)
    if (k25) {
        sbuf_printf(&b, "{\n  \"architectures\": [\n    \"KimiK25ForConditionalGeneration\"\n  ],\n");
        if (c->bos_id >= 0) sbuf_printf(&b, "  \"bos_token_id\": %lld,\n", (long long)c->bos_id);
        if (c->n_eos >= 1) sbuf_printf(&b, "  \"eos_token_id\": %lld,\n", (long long)c->eos_ids[0]);
        sbuf_printf(&b, "  \"model_type\": \"kimi_k25\",\n");
        if (c->pad_id >= 0) sbuf_printf(&b, "  \"pad_token_id\": %lld,\n", (long long)c->pad_id);
        sbuf_printf(&b, "  \"text_config\": {\n");
    } else {
        sbuf_printf(&b, "{\n");
    }
    sbuf_printf(&b, "%s\"architectures\": [\n%s  \"DeepseekV3ForCausalLM\"\n%s],\n", in, in, in);
    BO("attention_bias", 0);
    N("attention_dropout", 0.0);
    if (c->bos_id >= 0) I("bos_token_id", c->bos_id);
    if (c->n_eos >= 1) I("eos_token_id", c->eos_ids[0]);
    I("first_k_dense_replace", c->first_dense);
    S("hidden_act", "silu");
    I("hidden_size", c->hidden);
    N("initializer_range", 0.02);
    I("intermediate_size", c->dense_inter);
    I("kv_lora_rank", c->kv_lora);
    I("max_position_embeddings", c->max_ctx);
    S("model_type", c->arch == ARCH_KIMI_K2 ? "kimi_k2" : "deepseek_v3");
    I("moe_intermediate_size", c->moe_inter);
    I("moe_layer_freq", 1);
    I("n_group", c->n_group);
    I("n_routed_experts", c->n_experts);
    I("n_shared_experts", c->n_shared);
    BO("norm_topk_prob", c->moe_renorm);
    I("num_attention_heads", c->n_heads);
    I("num_experts_per_tok", c->topk);
    I("num_hidden_layers", c->n_layers);
    I("num_key_value_heads", c->n_heads);
    I("num_nextn_predict_layers", c->n_mtp);
    if (c->pad_id >= 0) I("pad_token_id", c->pad_id);
    if (c->q_lora > 0) I("q_lora_rank", c->q_lora);
    else sbuf_printf(&b, "%s\"q_lora_rank\": null,\n", in);
    I("qk_nope_head_dim", c->qk_nope);
    I("qk_rope_head_dim", c->qk_rope);
    if (!k25) { /* the releases' quantization_config (FP8: DeepSeek-V3, K2-Instruct; INT4: K2-Thinking) */
        sbuf q = {0};
        cfg_json_quant(&q, c);
        if (q.s && q.len > 2) sbuf_printf(&b, "%s,\n", q.s + 2); /* cfg_json_quant writes ",\n" first */
        sbuf_free(&q);
    }
    N("rms_norm_eps", c->rms_eps);
    if (c->yarn_factor > 1) {
        sbuf_printf(&b, "%s\"rope_scaling\": {\n%s  \"beta_fast\": ", in, in);
        cfg_json_num(&b, c->yarn_beta_fast);
        sbuf_printf(&b, ",\n%s  \"beta_slow\": ", in);
        cfg_json_num(&b, c->yarn_beta_slow);
        sbuf_printf(&b, ",\n%s  \"factor\": ", in);
        cfg_json_num(&b, c->yarn_factor);
        sbuf_printf(&b, ",\n%s  \"mscale\": ", in);
        cfg_json_num(&b, c->yarn_mscale);
        sbuf_printf(&b, ",\n%s  \"mscale_all_dim\": ", in);
        cfg_json_num(&b, c->yarn_mscale_all_dim);
        sbuf_printf(&b, ",\n%s  \"original_max_position_embeddings\": %lld,\n%s  \"type\": \"yarn\"\n%s},\n", in,
                    (long long)c->yarn_orig_ctx, in, in);
    } else {
        sbuf_printf(&b, "%s\"rope_scaling\": null,\n", in);
    }
    N("rope_theta", c->rope_theta);
    N("routed_scaling_factor", c->routed_scale);
    S("scoring_func", "sigmoid");
    BO("tie_word_embeddings", 0);
    I("topk_group", c->topk_group);
    S("topk_method", "noaux_tc");
    S("torch_dtype", "bfloat16");
    BO("use_cache", 1);
    I("v_head_dim", c->v_head);
    sbuf_printf(&b, "%s\"vocab_size\": %lld\n", in, (long long)c->vocab);
    if (k25) sbuf_printf(&b, "  },\n  \"tie_word_embeddings\": false\n");
    sbuf_printf(&b, "}\n");
#undef I
#undef BO
#undef S
#undef N
    return b.s;
}
