/*
 * arch_kimi_linear.c: the Kimi Linear description (KimiLinearForCausalLM,
 * model_type kimi_linear; Kimi-Linear-48B-A3B-Instruct). Math:
 * ../shared/spec/family-math.md sections 2-7 and 12, as implemented in
 * docs/architecture.md (Architectures). Against K3 (cfg flags, arch.h):
 *   - flat config.json, KDA keys in linear_attn_config (layer lists one-based);
 *   - tensors model.* and lm_head.weight;
 *   - plain pre-norm residual (plain_res), no AttnRes vectors;
 *   - KDA decay g = -exp(A_log[h]) softplus(f_b(f_a x) + dt_bias), softplus
 *     threshold 20, no lower bound (kda_softplus); A_log [1, 1, heads, 1] and
 *     dt_bias [P] stored F32; output gate sigmoid(g_b(g_a x)), no bias
 *     (kda_g_lowrank);
 *   - MLA with a direct q_proj (q_lora_rank null), NoPE, no output gate, softmax
 *     scale 1/sqrt(qk_nope + qk_rope); kv_a_layernorm epsilon 1e-6 (below);
 *   - dense first layer and experts w1/w2/w3 on the hidden dim (moe_plain),
 *     SiLU-GLU (act_silu); shared expert added unscaled; routed weights
 *     renormalised (+1e-20) then times routed_scaling_factor;
 *   - the router's weights: unbiased sigmoid by default, the release's biased
 *     weights with router_hf (strata_model_opts.router).
 *
 * kv_a_layernorm epsilon: 1e-6, the class default of KimiRMSNorm that the
 * release's own modeling_kimi.py builds it with (Moonshot's code, the Hugging
 * Face oracle); vLLM passes rms_norm_eps (1e-5) instead. The two differ in the
 * 6th significant digit of the normed latent. tests/reference uses the same.
 */
#include "arch.h"
#include "cfg.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "base.h"
#include "schema.h"

#define KL_KV_NORM_EPS 1e-6

static const fixed_key k_fixed[] = {
    {"moe_router_activation_func", {"\"sigmoid\""}, "the router scores experts with a sigmoid"},
    {"num_expert_group", {"1"}, "routing is not grouped: top-k over all experts"},
    {"topk_group", {"1"}, "routing is not grouped: top-k over all experts"},
    {"moe_layer_freq", {"1"}, "every layer from first_k_dense_replace on is MoE"},
    {"tie_word_embeddings", {"false"}, "lm_head is its own tensor, not the embedding"},
    {"mla_use_nope", {"true"}, "MLA applies no rotary embedding"},
    {"mla_use_output_gate", {"false"}, "Kimi Linear's MLA has no output gate"},
    {"hidden_act", {"\"silu\""}, "the dense MLP and the experts are SiLU-gated"},
    {"num_nextn_predict_layers", {"0"}, "no multi-token-prediction layers"},
    {"quantization_config.format", {"\"mxfp4\"", "\"pack-quantized\""},
     "weights are plain, MXFP4 experts (e8m0, groups of 32), FP8 (128x128 blocks) or INT4 pack-quantized experts"},
    {"quantization_config.quant_method", {"\"mxfp4\"", "\"fp8\"", "\"compressed-tensors\""},
     "weights are plain, MXFP4 experts (e8m0, groups of 32), FP8 (128x128 blocks) or INT4 pack-quantized experts"},
    {"quantization_config.scale_format", {"\"e8m0\""}, "MXFP4 scales are e8m0 powers of two"},
};

static void kl_defaults(cfg *c) {
    c->plain_res = 1;
    c->kda_softplus = 1;
    c->kda_g_lowrank = 1;
    c->act_silu = 1;
    c->moe_plain = 1;
    c->wf = SW_EXP_PLAIN;  /* bf16 experts unless quantization_config says otherwise */
    c->mla_out_gate = 0;
    c->latent_norm = 0;
    c->kv_norm_eps = KL_KV_NORM_EPS;
    c->gate_lb = 0;       /* unused: no lower bound */
    c->situ_b1 = c->situ_b2 = 1.0; /* unused: SiLU */
}

/* Fields K3 reads and Kimi Linear derives. */
static void kl_finish(cfg *c) {
    c->latent = c->hidden; /* experts read the hidden state itself */
    /* one AttnRes "block" spanning the model: unused (plain_res), kept valid */
    c->attn_res_block = c->n_layers >= 1 ? c->n_layers : 1;
}

const arch_desc arch_kimi_linear = {
    .id = ARCH_KIMI_LINEAR,
    .name = "kimi_linear",
    .model_type = "kimi_linear",
    .architecture = "KimiLinearForCausalLM",
    .pfx = "model.",
    .lm_head = "lm_head.weight",
    .keys_skip = ARCH_BIT(F_GLB) | ARCH_BIT(F_MLA_GATE) | ARCH_BIT(F_LATENT) | ARCH_BIT(F_LNORM) |
                 ARCH_BIT(F_ARB) | ARCH_BIT(F_B1) | ARCH_BIT(F_B2),
    .keys_nullable = ARCH_BIT(F_QLORA),
    .fixed = k_fixed,
    .n_fixed = sizeof k_fixed / sizeof k_fixed[0],
    .defaults = kl_defaults,
    .finish = kl_finish,
    .to_json = arch_kimi_linear_to_json,
};

void cfg_kimi_linear(cfg *c) {
    memset(c, 0, sizeof *c);
    kl_defaults(c);
    c->arch = ARCH_KIMI_LINEAR;
    c->hidden = 2304;
    c->n_layers = 27;
    c->vocab = 163840;
    c->rms_eps = 1e-5;
    c->kda_heads = 32;
    c->kda_head_dim = 128;
    c->conv_k = 4;
    c->n_heads = 32;
    c->q_lora = 0;
    c->kv_lora = 512;
    c->qk_nope = 128;
    c->qk_rope = 64;
    c->v_head = 128;
    c->n_experts = 256;
    c->topk = 8;
    c->n_shared = 1;
    c->moe_inter = 1024;
    c->routed_scale = 2.446;
    c->moe_renorm = 1;
    c->first_dense = 1;
    c->dense_inter = 9216;
    /* one-based full_attn_layers 4, 8, ..., 24 and 27 */
    for (int64_t L1 = 4; L1 <= 24; L1 += 4) c->is_mla[L1 - 1] = 1;
    c->is_mla[26] = 1;
    c->n_mla = 7;
    c->bos_id = 163584;
    c->pad_id = 163839;
    c->n_eos = 1;
    c->eos_ids[0] = 163586;
    c->max_ctx = 1048576;
    kl_finish(c);
}

/* ------------------------------------------------------------- writer */

/* The published flat shape (family-configs/kimi-linear-48b-a3b-instruct.config.json),
 * keys in its order. */
char *arch_kimi_linear_to_json(const cfg *c) {
    sbuf b = {0};
#define I(k, v) sbuf_printf(&b, "  \"%s\": %lld,\n", k, (long long)(v))
#define BO(k, v) sbuf_printf(&b, "  \"%s\": %s,\n", k, (v) ? "true" : "false")
#define N(k, v) do { sbuf_printf(&b, "  \"%s\": ", k); cfg_json_num(&b, v); sbuf_printf(&b, ",\n"); } while (0)
    sbuf_printf(&b, "{\n  \"architectures\": [\n    \"KimiLinearForCausalLM\"\n  ],\n"
                    "  \"auto_map\": {\n    \"AutoConfig\": \"configuration_kimi.KimiLinearConfig\",\n"
                    "    \"AutoModel\": \"modeling_kimi.KimiLinearModel\",\n"
                    "    \"AutoModelForCausalLM\": \"modeling_kimi.KimiLinearForCausalLM\"\n  },\n");
    if (c->bos_id >= 0) I("bos_token_id", c->bos_id);
    sbuf_printf(&b, "  \"dtype\": \"bfloat16\",\n");
    if (c->n_eos >= 1) I("eos_token_id", c->eos_ids[0]);
    I("first_k_dense_replace", c->first_dense);
    /* the root head_dim is transformers' default hidden_size / num_attention_heads
     * (72 in the release); nothing reads it, the KDA width is linear_attn_config's */
    I("head_dim", c->n_heads > 0 ? c->hidden / c->n_heads : c->kda_head_dim);
    sbuf_printf(&b, "  \"hidden_act\": \"silu\",\n");
    I("hidden_size", c->hidden);
    N("initializer_range", 0.02);
    I("intermediate_size", c->dense_inter);
    I("kv_lora_rank", c->kv_lora);
    sbuf_printf(&b, "  \"linear_attn_config\": {\n    \"full_attn_layers\": ");
    cfg_json_layers(&b, c, 1, "      ", "    ");
    sbuf_printf(&b, ",\n    \"head_dim\": %lld,\n    \"kda_layers\": ", (long long)c->kda_head_dim);
    cfg_json_layers(&b, c, 0, "      ", "    ");
    sbuf_printf(&b, ",\n    \"num_heads\": %lld,\n    \"short_conv_kernel_size\": %lld\n  },\n", (long long)c->kda_heads,
                (long long)c->conv_k);
    BO("mla_use_nope", 1);
    I("model_max_length", c->max_ctx);
    sbuf_printf(&b, "  \"model_type\": \"kimi_linear\",\n");
    I("moe_intermediate_size", c->moe_inter);
    I("moe_layer_freq", 1);
    BO("moe_renormalize", c->moe_renorm);
    sbuf_printf(&b, "  \"moe_router_activation_func\": \"sigmoid\",\n");
    I("num_attention_heads", c->n_heads);
    I("num_expert_group", 1);
    I("num_experts", c->n_experts);
    I("num_experts_per_token", c->topk);
    I("num_hidden_layers", c->n_layers);
    I("num_key_value_heads", c->n_heads);
    I("num_nextn_predict_layers", 0);
    I("num_shared_experts", c->n_shared);
    if (c->pad_id >= 0) I("pad_token_id", c->pad_id);
    if (c->q_lora > 0) I("q_lora_rank", c->q_lora);
    else sbuf_printf(&b, "  \"q_lora_rank\": null,\n");
    I("qk_nope_head_dim", c->qk_nope);
    I("qk_rope_head_dim", c->qk_rope);
    N("rms_norm_eps", c->rms_eps);
    sbuf_printf(&b, "  \"rope_scaling\": null,\n");
    N("rope_theta", 10000.0);
    N("routed_scaling_factor", c->routed_scale);
    BO("tie_word_embeddings", 0);
    I("topk_group", 1);
    sbuf_printf(&b, "  \"transformers_version\": \"4.57.1\",\n");
    BO("use_cache", 1);
    BO("use_grouped_topk", 1);
    I("v_head_dim", c->v_head);
    sbuf_printf(&b, "  \"vocab_size\": %lld", (long long)c->vocab);
    cfg_json_quant(&b, c);
    sbuf_printf(&b, "\n}\n");
#undef I
#undef BO
#undef N
    return b.s;
}
