/*
 * cfg.h: the Kimi K3 model configuration (config.json) and its census.
 *
 * Two JSON shapes are accepted: the released nested one (language-model keys under
 * `text_config`, KDA keys under `text_config.linear_attn_config`) and the flat one
 * (all keys at the root). KDA fields are read from `linear_attn_config` explicitly
 * when it exists, so a generic `head_dim`/`num_heads` elsewhere cannot shadow them.
 * Every required key that is missing or ill-typed is reported, all in one pass.
 */
#ifndef STRATA_CFG_H
#define STRATA_CFG_H

#include <stddef.h>
#include <stdint.h>

#define CFG_MAX_LAYERS 4096
#define CFG_MAX_TOPK 64
#define CFG_MAX_EOS 8
#define CFG_MAX_ROUTED_SCALE 1e6 /* routed_scaling_factor above this is refused (K3: 2.5) */
#define MXFP4_GROUP 32

/* Weight formats of a checkpoint (schema_walk's wf): how the routed experts are
 * stored (wf & SW_EXP_MASK) and whether every eligible trunk matrix is FP8
 * (SW_TRUNK_FP8: attention, dense MLP, shared experts and latent projections;
 * never the embedding, lm_head, router gate or vectors). 0 and 1 are the old
 * experts_bf16 flag (MXFP4, plain). */
enum {
    SW_EXP_MXFP4 = 0, SW_EXP_PLAIN = 1, SW_EXP_FP8 = 2, SW_EXP_INT4 = 3, SW_EXP_MASK = 3,
    SW_TRUNK_FP8 = 4,
};
#define FP8_BLOCK 128 /* FP8 scale block: 128 x 128 weights */
#define I4_GROUP 32   /* INT4 scale group: 32 inputs of a row */

typedef struct cfg {
    int64_t hidden, n_layers, vocab;
    double rms_eps;
    /* KDA (linear_attn_config) */
    int64_t kda_heads, kda_head_dim, conv_k;
    double gate_lb;
    /* Gated MLA */
    int64_t n_heads, q_lora, kv_lora, qk_nope, qk_rope, v_head;
    int mla_out_gate; /* optional, default 1 */
    /* Stable LatentMoE */
    int64_t n_experts, topk, n_shared, latent, moe_inter;
    double routed_scale;
    int moe_renorm, latent_norm; /* optional, default 1 */
    int64_t first_dense, dense_inter, attn_res_block;
    double situ_b1, situ_b2;
    /* layer map: is_mla[L] for 0-based L, from the one-based full_attn_layers */
    int64_t n_mla;
    uint8_t is_mla[CFG_MAX_LAYERS];
    /* special ids (optional; -1 when absent) and context limit */
    int64_t bos_id, pad_id;
    int64_t n_eos, eos_ids[CFG_MAX_EOS];
    int64_t max_ctx; /* max_position_embeddings if present, else CFG_DEFAULT_CTX */
    int mxfp4_experts; /* quantization_config.format == "mxfp4" (informational) */
    /* Architecture and its variants (arch.h). All zero is K3, so a cfg filled by
     * hand (presets, tests) keeps K3's math. */
    int arch;          /* enum cfg_arch */
    int plain_res;     /* pre-norm residual h += block(RMSNorm(h)); no Block AttnRes */
    int kda_softplus;  /* KDA decay g = -exp(A_log[h]) softplus(f + dt_bias) (threshold 20), no lower bound */
    int kda_g_lowrank; /* KDA output gate sigmoid(g_b(g_a x)), rank kda_head_dim, no bias */
    int act_silu;      /* GLU activation SiLU(gate) * up instead of SiTU */
    int moe_plain;     /* experts on the hidden dim (latent == hidden): no latent projections or norm */
    double kv_norm_eps;/* kv_a_layernorm epsilon; 0: rms_eps (K3) */
    double qa_norm_eps;/* q_a_layernorm epsilon; 0: rms_eps (K3) */
    /* Routed weights from the biased scores s + e_score_correction_bias, as the
     * Kimi Linear release's modeling_kimi.py computes them (a run-time choice,
     * strata_model_opts.router; part of the config fingerprint). 0: the unbiased
     * sigmoid (vLLM, llama.cpp, K3). */
    int router_hf;
    /* DeepSeek-V3 family (arch_deepseek_v3.c); all zero elsewhere. */
    int no_kda;        /* every layer is MLA: no KDA keys, no layer lists */
    int ds_names;      /* MoE tensors mlp.gate / mlp.shared_experts / mlp.experts.E.{gate,up,down}_proj */
    int mla_rope;      /* RoPE (YaRN) on the rope slot of q and of the cached k_pe, interleaved pairs */
    double rope_theta; /* base of the frequencies */
    double yarn_factor;/* rope_scaling.factor; 1: no scaling (rope_scaling null) */
    double yarn_beta_fast, yarn_beta_slow, yarn_mscale, yarn_mscale_all_dim;
    int64_t yarn_orig_ctx; /* rope_scaling.original_max_position_embeddings */
    int64_t n_group, topk_group; /* group-limited routing (n_group > 1): keep topk_group groups */
    int64_t n_mtp;     /* num_nextn_predict_layers: MTP layers after the last, never read */
    /* Weight formats the config declares (schema.h SW_*: quantization_config
     * quant_method fp8 = FP8 trunk and experts, compressed-tensors
     * pack-quantized = INT4 experts; else the architecture's default). The census
     * counts bytes with them; a checkpoint's own formats are read off its headers
     * (model_wf), which decide. */
    int wf;
    /* The first MTP layer is bound (strata_model_opts.mtp, cfg_bind_mtp): it is layer
     * n_layers - 1, so it is planned, placed and streamed as a layer; the model's
     * own layers are the first cfg_main_layers(c). 0: never read. */
    int mtp;
} cfg;
enum cfg_arch { ARCH_K3 = 0, ARCH_KIMI_LINEAR = 1, ARCH_DEEPSEEK_V3 = 2, ARCH_KIMI_K2 = 3, ARCH_KIMI_K25 = 4 };
#define CFG_DEFAULT_CTX 131072

/* Parses and validates config.json bytes. On failure returns STRATA_EFORMAT and
 * writes every problem (one per line, naming `what`, e.g. the file path) into err. */
int cfg_parse(cfg *c, const uint8_t *buf, size_t len, const char *what, char *err, size_t errlen);
int cfg_load(cfg *c, const char *path, char *err, size_t errlen);
/* The real K3 configuration (docs/architecture.md, Shape of the model). */
void cfg_k3(cfg *c);
/* Structural validation only (used by cfg_parse and by presets). */
int cfg_validate(const cfg *c, const char *what, char *err, size_t errlen);
/* Writes config.json for c in its architecture's published shape (K3: the
 * released nested one; Kimi Linear: flat). MEM_MISC string, caller frees. */
char *cfg_to_json(const cfg *c);

static inline int cfg_is_moe(const cfg *c, int64_t L) { return L >= c->first_dense; }
/* The model's own layers (the MTP layer, when bound, comes after them). */
static inline int64_t cfg_main_layers(const cfg *c) { return c->n_layers - (c->mtp ? 1 : 0); }
/* Binds the first MTP layer (c->n_mtp >= 1, not bound yet): one more layer, MLA
 * and MoE, after the model's own. 0, or -1 when the config has none or no room. */
int cfg_bind_mtp(cfg *c);

/* Census: parameter and byte counts by class, for planning and `inspect`
 * (computed by schema_census, schema.h: it walks the tensors). */
typedef struct cfg_census {
    int64_t n_kda, n_mla, n_dense, n_moe;
    uint64_t params_total, params_trunk, params_embed, params_experts, params_active;
    uint64_t n_expert_total;            /* n_moe * n_experts */
    uint64_t expert_bytes;              /* one MXFP4 expert (six tensors) */
    uint64_t experts_bytes;             /* all experts, MXFP4 */
    uint64_t trunk_bytes_bf16;          /* all per-layer non-expert tensors, bf16 */
    uint64_t embed_bytes_bf16;          /* embed_tokens + lm_head + final vectors, bf16 */
    uint64_t layer_bytes_bf16[CFG_MAX_LAYERS]; /* trunk bytes of each layer, bf16 */
    uint64_t mla_cache_elems_per_pos;   /* n_mla * (kv_lora + qk_rope) */
    uint64_t kda_state_elems;           /* n_kda * (heads*D*D + 3*P*(conv_k-1)) */
} cfg_census;

#endif
