/*
 * arch_k3.c: the Kimi K3 description (docs/architecture.md, Model spec). The
 * released config is nested (language-model keys under text_config, KDA keys
 * under text_config.linear_attn_config); tensors are named
 * language_model.model.* and language_model.lm_head.weight. Its variants are
 * cfg's zero flags: Block AttnRes, the lower-bounded KDA gate with a full-rank
 * g_proj, gated MLA with q-LoRA, Stable LatentMoE with SiTU-GLU experts.
 */
#include "arch.h"
#include "cfg.h"

#include <string.h>

/* Keys fixed by the engine, with K3's values. */
static const fixed_key k_fixed[] = {
    {"moe_router_activation_func", {"\"sigmoid\""},
     "the router scores experts with a sigmoid"},
    {"num_expert_group", {"1"}, "routing is not grouped: top-k over all experts"},
    {"topk_group", {"1"}, "routing is not grouped: top-k over all experts"},
    {"moe_layer_freq", {"1"}, "every layer from first_k_dense_replace on is MoE"},
    {"tie_word_embeddings", {"false"}, "lm_head is its own tensor, not the embedding"},
    {"mla_use_nope", {"true"}, "MLA applies no rotary embedding"},
    {"quantization_config.format", {"\"mxfp4\"", "\"pack-quantized\""},
     "weights are plain, MXFP4 experts (e8m0, groups of 32), FP8 (128x128 blocks) or INT4 pack-quantized experts"},
    {"quantization_config.quant_method", {"\"mxfp4\"", "\"fp8\"", "\"compressed-tensors\""},
     "weights are plain, MXFP4 experts (e8m0, groups of 32), FP8 (128x128 blocks) or INT4 pack-quantized experts"},
    {"quantization_config.scale_format", {"\"e8m0\""}, "MXFP4 scales are e8m0 powers of two"},
};

static void k3_defaults(cfg *c) { (void)c; /* every flag zero: K3 */ }
static void k3_finish(cfg *c) { (void)c; }

const arch_desc arch_k3 = {
    .id = ARCH_K3,
    .name = "kimi_k3",
    .model_type = "kimi_k3",
    .architecture = "KimiK3ForConditionalGeneration",
    .pfx = "language_model.model.",
    .lm_head = "language_model.lm_head.weight",
    .keys_skip = 0,
    .keys_nullable = 0,
    .fixed = k_fixed,
    .n_fixed = sizeof k_fixed / sizeof k_fixed[0],
    .defaults = k3_defaults,
    .finish = k3_finish,
    .to_json = arch_k3_to_json,
    .read = NULL,
};

/* ------------------------------------------------------------ detection */

/* deepseek_v3 before kimi_k2: a config naming only DeepseekV3ForCausalLM is DeepSeek-V3 */
static const arch_desc *const k_all[] = {&arch_k3, &arch_kimi_linear, &arch_kimi_k25, &arch_kimi_k2, &arch_deepseek_v3};
#define N_ALL (sizeof k_all / sizeof k_all[0])

const arch_desc *arch_of(const cfg *c) {
    for (size_t i = 0; i < N_ALL; i++)
        if (k_all[i]->id == c->arch) return k_all[i];
    return &arch_k3;
}

const arch_desc *arch_detect(const char *model_type, const char *const *archs, size_t n_archs, int *conflict) {
    const arch_desc *by_type = NULL, *by_arch = NULL;
    *conflict = 0;
    for (size_t i = 0; i < N_ALL; i++) {
        if (model_type && !strcmp(model_type, k_all[i]->model_type)) by_type = k_all[i];
        for (size_t j = 0; j < n_archs; j++)
            if (archs[j] && !strcmp(archs[j], k_all[i]->architecture)) by_arch = k_all[i];
    }
    /* kimi_k2 and deepseek_v3 share DeepseekV3ForCausalLM: a conflict is two class names */
    if (by_type && by_arch && strcmp(by_type->architecture, by_arch->architecture)) *conflict = 1;
    return by_type ? by_type : by_arch ? by_arch : &arch_k3;
}
