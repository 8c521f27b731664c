/*
 * preset.c: the gen-model presets (see preset.h). Every preset follows K3's
 * structure: a dense first layer, 3:1 KDA:MLA with MLA at one-based multiples of 4
 * and the last two layers MLA (as K3's 92 and 93) where the layer count allows,
 * Block AttnRes, Stable LatentMoE with MXFP4 experts (latent and moe_inter
 * multiples of 32).
 */
#include "preset.h"

#include <string.h>
#include "arch.h"
#include "strata.h"

/* Everything not set by a preset: K3's scalar choices. */
static void base_cfg(cfg *c) {
    memset(c, 0, sizeof *c);
    c->rms_eps = 1e-5;
    c->conv_k = 4;
    c->gate_lb = -5.0;
    c->mla_out_gate = 1;
    c->routed_scale = 1.0;
    c->moe_renorm = 1;
    c->latent_norm = 1;
    c->first_dense = 1;
    c->situ_b1 = 4.0;
    c->situ_b2 = 25.0;
    c->bos_id = -1;
    c->pad_id = -1;
    c->max_ctx = 4096;
    c->mxfp4_experts = 1;
}

/* MLA at one-based multiples of 4 and the last two layers (K3: 4, 8, ..., 92, 93). */
static void layer_map(cfg *c) {
    c->n_mla = 0;
    for (int64_t L = 0; L < c->n_layers; L++) {
        c->is_mla[L] = (L + 1) % 4 == 0 || (c->n_layers >= 6 && L >= c->n_layers - 2);
        c->n_mla += c->is_mla[L];
    }
}

/* The widths and sizes a preset sets, as a table; a field left 0 keeps the value
 * already there (base_cfg's, or an architecture's defaults). */
typedef struct {
    int64_t hidden, n_layers, vocab, kda_heads, kda_head_dim, n_heads, q_lora, kv_lora, qk_nope, qk_rope, v_head;
    int64_t n_experts, topk, n_shared, latent, moe_inter, dense_inter, attn_res_block, max_ctx, n_reserved;
    uint64_t shard_bytes;
} dims;

static void set_dims(cfg *c, gen_opts *o, const dims *d) {
#define DIM(dst, f) \
    if (d->f) dst->f = d->f
    DIM(c, hidden);
    DIM(c, n_layers);
    DIM(c, vocab);
    DIM(c, kda_heads);
    DIM(c, kda_head_dim);
    DIM(c, n_heads);
    DIM(c, q_lora);
    DIM(c, kv_lora);
    DIM(c, qk_nope);
    DIM(c, qk_rope);
    DIM(c, v_head);
    DIM(c, n_experts);
    DIM(c, topk);
    DIM(c, n_shared);
    DIM(c, latent);
    DIM(c, moe_inter);
    DIM(c, dense_inter);
    DIM(c, attn_res_block);
    DIM(c, max_ctx);
    DIM(o, n_reserved);
    DIM(o, shard_bytes);
#undef DIM
}

static void tiny(cfg *c, gen_opts *o) {
    static const dims d = {.hidden = 64, .n_layers = 8, .vocab = 512, .kda_heads = 4, .kda_head_dim = 16,
                           .n_heads = 4, .q_lora = 32, .kv_lora = 32, .qk_nope = 16, .qk_rope = 8, .v_head = 16,
                           .n_experts = 16, .topk = 4, .n_shared = 1, .latent = 64, .moe_inter = 32,
                           .dense_inter = 128, .attn_res_block = 4, .n_reserved = 16};
    set_dims(c, o, &d);
}

static void tiny_odd(cfg *c, gen_opts *o) {
    static const dims d = {.hidden = 120, .n_layers = 7, .vocab = 460, .kda_heads = 3, .kda_head_dim = 20,
                           .n_heads = 3, .q_lora = 40, .kv_lora = 24, .qk_nope = 20, .qk_rope = 12, .v_head = 20,
                           .n_experts = 12, .topk = 3, .n_shared = 1, .latent = 96, .moe_inter = 64,
                           .dense_inter = 200, .attn_res_block = 3, .n_reserved = 20};
    set_dims(c, o, &d);
}

static void tiny_blocks(cfg *c, gen_opts *o) {
    tiny(c, o);
    c->n_layers = 13; /* blocks start at 0, 4, 8, 12: the last one is partial */
    c->n_experts = 8;
    c->topk = 2;
}

static void tiny_shards(cfg *c, gen_opts *o) {
    tiny(c, o);
    o->shard_bytes = 96u << 10;
}

static void tiny_mixed(cfg *c, gen_opts *o) {
    tiny(c, o);
    o->trunk_dtype = GEN_TRUNK_MIXED;
}

static void tiny_bf16experts(cfg *c, gen_opts *o) {
    tiny(c, o);
    o->experts_bf16 = 1;
}

/* ~1.87 GB, experts ~87%: runs in a budget smaller than itself. */
static void demo(cfg *c, gen_opts *o) {
    static const dims d = {.hidden = 1024, .n_layers = 13, .vocab = 4096 + 256, .kda_heads = 8, .kda_head_dim = 128,
                           .n_heads = 8, .q_lora = 384, .kv_lora = 256, .qk_nope = 64, .qk_rope = 32, .v_head = 64,
                           .n_experts = 144, .topk = 8, .n_shared = 1, .latent = 768, .moe_inter = 768,
                           .dense_inter = 2048, .attn_res_block = 4, .max_ctx = 8192, .n_reserved = 256,
                           .shard_bytes = 1ull << 30};
    set_dims(c, o, &d);
}

/* ~30 GB, larger than a 24 GB machine's RAM, K3's proportions: top-8 of 448 (the
 * 16-of-896 ratio), experts > 90% of bytes, one expert 1,671,168 B = 408 x 4096. */
static void ladder(cfg *c, gen_opts *o) {
    static const dims d = {.hidden = 2048, .n_layers = 37, .vocab = 16384, .kda_heads = 16, .kda_head_dim = 128,
                           .n_heads = 16, .q_lora = 512, .kv_lora = 256, .qk_nope = 128, .qk_rope = 64, .v_head = 128,
                           .n_experts = 448, .topk = 8, .n_shared = 1, .latent = 1024, .moe_inter = 1024,
                           .dense_inter = 8192, .attn_res_block = 8, .max_ctx = 32768, .n_reserved = 256,
                           .shard_bytes = 4ull << 30};
    set_dims(c, o, &d);
}

static void k3(cfg *c, gen_opts *o) {
    cfg_k3(c);
    c->max_ctx = CFG_DEFAULT_CTX;
    o->n_reserved = 256;
    o->shard_bytes = 16300000000ull; /* ~96 shards like the release */
}

/* ------------------------------------------------------- Kimi Linear */

/* Kimi Linear's variant flags (arch_kimi_linear.c) and the real scalars. */
static void kl_base(cfg *c, gen_opts *o) {
    arch_kimi_linear.defaults(c);
    c->arch = ARCH_KIMI_LINEAR;
    c->routed_scale = 2.446;
    c->q_lora = 0;
    o->experts_bf16 = 1;
}

/* MLA at one-based multiples of 4 and the last layer (Kimi Linear: 4, 8, ..., 24, 27). */
static void kl_map(cfg *c) {
    c->n_mla = 0;
    for (int64_t L = 0; L < c->n_layers; L++) {
        c->is_mla[L] = (L + 1) % 4 == 0 || L == c->n_layers - 1;
        c->n_mla += c->is_mla[L];
    }
    arch_kimi_linear.finish(c);
}

/* A few MB, the published layout: 6 layers (KDA 1-3, 5; MLA 4, 6), a dense first layer. */
static void kl_tiny(cfg *c, gen_opts *o) {
    kl_base(c, o);
    static const dims d = {.hidden = 64, .n_layers = 6, .vocab = 512, .kda_heads = 4, .kda_head_dim = 16,
                           .n_heads = 4, .kv_lora = 32, .qk_nope = 16, .qk_rope = 8, .v_head = 16, .n_experts = 16,
                           .topk = 4, .n_shared = 1, .moe_inter = 32, .dense_inter = 128, .n_reserved = 32};
    set_dims(c, o, &d);
    kl_map(c);
}

/* ~16 GB with the real proportions: 27 layers (20 KDA + 7 MLA), 256 experts top-8
 * + 1 shared, experts ~95% of the bytes (one expert 2,359,296 B). */
static void kl_ladder(cfg *c, gen_opts *o) {
    kl_base(c, o);
    static const dims d = {.hidden = 1024, .n_layers = 27, .vocab = 32768, .kda_heads = 8, .kda_head_dim = 128,
                           .n_heads = 8, .kv_lora = 512, .qk_nope = 128, .qk_rope = 64, .v_head = 128,
                           .n_experts = 256, .topk = 8, .n_shared = 1, .moe_inter = 384, .dense_inter = 4096,
                           .max_ctx = 32768, .n_reserved = 256, .shard_bytes = 4ull << 30};
    set_dims(c, o, &d);
    kl_map(c);
}

static void kl_48b(cfg *c, gen_opts *o) {
    cfg_kimi_linear(c);
    o->experts_bf16 = 1;
    o->n_reserved = 256;
    o->shard_bytes = 5000000000ull; /* ~20 shards like the release */
}

/* ------------------------------------------------ DeepSeek-V3 / Kimi K2 */

/* The DeepSeek-V3 variant flags (arch_deepseek_v3.c) on the small widths the
 * tiny presets share; bf16 weights (FP8 / INT4 come with their storage). */
static void ds_base(cfg *c, gen_opts *o, int arch) {
    const arch_desc *ad = arch == ARCH_KIMI_K25 ? &arch_kimi_k25 : arch == ARCH_KIMI_K2 ? &arch_kimi_k2 : &arch_deepseek_v3;
    ad->defaults(c);
    c->arch = arch;
    static const dims d = {.hidden = 64, .vocab = 512, .n_heads = 4, .q_lora = 32, .kv_lora = 32, .qk_nope = 16,
                           .qk_rope = 16, .v_head = 16, .n_experts = 16, .topk = 4, .n_shared = 1, .moe_inter = 32,
                           .dense_inter = 128, .n_reserved = 32};
    set_dims(c, o, &d);
    c->yarn_orig_ctx = 256; /* the YaRN ramp falls inside the 8 pairs */
    c->yarn_mscale = 1.0;
    c->yarn_mscale_all_dim = 1.0;
    o->experts_bf16 = 1;
}

/* The scalars that tell the DeepSeek-V3-shaped presets apart: depth, the dense
 * layers, the routed scale, the norm epsilon and RoPE / YaRN (beta_slow is 1 in
 * every release). */
static void ds_scalars(cfg *c, int64_t n_layers, int64_t first_dense, double routed_scale, double rms_eps,
                       double theta, double yarn_factor, double beta_fast) {
    c->n_layers = n_layers;
    c->first_dense = first_dense;
    c->routed_scale = routed_scale;
    c->rms_eps = rms_eps;
    c->rope_theta = theta;
    c->yarn_factor = yarn_factor;
    c->yarn_beta_fast = beta_fast;
    c->yarn_beta_slow = 1.0;
}

/* DeepSeek-V3's proportions at a few MB: 5 layers (2 dense), 16 experts in 4
 * groups of which 2 are kept, top-4, YaRN factor 40 with beta 32/1, F32 norms. */
static void ds_tiny(cfg *c, gen_opts *o) {
    ds_base(c, o, ARCH_DEEPSEEK_V3);
    ds_scalars(c, 5, 2, 2.5, 1e-6, 10000.0, 40.0, 32.0);
    c->n_group = 4;
    c->topk_group = 2;
    c->n_mtp = 1;
    arch_deepseek_v3.finish(c);
}

/* DeepSeek-V3's release: FP8 e4m3 with 128x128 weight_scale_inv (every linear
 * but the embedding, lm_head and router gate), its tokenizer.json. */
static void ds_tiny_fp8(cfg *c, gen_opts *o) {
    ds_tiny(c, o);
    o->weights = GEN_W_FP8;
    o->tok = GEN_TOK_DS_V3;
}

/* DeepSeek-R1: the same weights layout, R1's chat_template (the prompt opens <think>). */
static void r1_tiny(cfg *c, gen_opts *o) {
    ds_tiny_fp8(c, o);
    o->tok = GEN_TOK_DS_R1;
}

/* Kimi K2's: 4 layers (1 dense), ungrouped top-4 of 16, theta 5e4, factor 32, beta 1/1. */
static void k2_tiny(cfg *c, gen_opts *o) {
    ds_base(c, o, ARCH_KIMI_K2);
    ds_scalars(c, 4, 1, 2.827, 1e-6, 50000.0, 32.0, 1.0);
    arch_kimi_k2.finish(c);
    o->tok = GEN_TOK_K2; /* Kimi's tiktoken with K2's specials, as released */
}

/* K2-Instruct's release: FP8 as DeepSeek-V3's, Kimi's tiktoken with K2's specials
 * (k2_tiny's). */
static void k2_instruct_tiny(cfg *c, gen_opts *o) {
    k2_tiny(c, o);
    o->weights = GEN_W_FP8;
}

/* K2-Thinking's release: routed experts INT4 (compressed-tensors pack-quantized,
 * group 32), the rest bf16; its config scalars (factor 64, eps 1e-5, max_pos
 * 262144 at full size); K2's specials with <think> </think> and its template. */
static void k2_thinking_tiny(cfg *c, gen_opts *o) {
    k2_tiny(c, o);
    c->rms_eps = 1e-5;
    c->yarn_factor = 64.0;
    o->weights = GEN_W_INT4;
    o->tok = GEN_TOK_K2_THINKING;
}

/* K2.5's wrapper: text_config, language_model. names, a vision tensor to skip. */
static void k25_tiny(cfg *c, gen_opts *o) {
    k2_tiny(c, o);
    arch_kimi_k25.defaults(c);
    c->arch = ARCH_KIMI_K25;
    c->rms_eps = 1e-5;
    c->yarn_factor = 64.0;
    c->yarn_beta_fast = 32.0;
    arch_kimi_k25.finish(c);
    o->tok = GEN_TOK_K2_THINKING; /* K2.5 thinks: K2's specials with <think> */
}

/* ~15 GB in K2-Thinking's layout (INT4 experts, the rest bf16) with K2's
 * proportions: 384 experts top-8, one dense layer, experts ~95%. */
static void k2_ladder(cfg *c, gen_opts *o) {
    ds_base(c, o, ARCH_KIMI_K2);
    o->weights = GEN_W_INT4;
    o->tok = GEN_TOK_K2_THINKING;
    ds_scalars(c, 29, 1, 2.827, 1e-5, 50000.0, 64.0, 1.0);
    static const dims d = {.hidden = 1024, .vocab = 32768, .n_heads = 8, .q_lora = 384, .kv_lora = 256, .qk_nope = 64,
                           .qk_rope = 32, .v_head = 64, .n_experts = 384, .topk = 8, .moe_inter = 768,
                           .dense_inter = 4096, .max_ctx = 32768, .n_reserved = 256, .shard_bytes = 4ull << 30};
    set_dims(c, o, &d);
    c->yarn_orig_ctx = 4096;
    arch_kimi_k2.finish(c);
}

/* The full-size replicas, in the releases' formats and shard counts. Norm
 * dtypes: the architecture's (arch_deepseek_v3.c: F32 for deepseek_v3, as
 * V3.2's files have them; V3's own are unverified, family-formats.md C7). */
static void ds_v3(cfg *c, gen_opts *o) {
    cfg_deepseek_v3(c);
    o->experts_bf16 = 1;
    o->weights = GEN_W_FP8;
    o->tok = GEN_TOK_DS_V3;
    o->shard_bytes = 4277000000ull; /* 163 shards of ~4.3 GB, as the release */
}

static void k2_thinking(cfg *c, gen_opts *o) {
    cfg_kimi_k2_thinking(c);
    o->experts_bf16 = 1;
    o->weights = GEN_W_INT4;
    o->tok = GEN_TOK_K2_THINKING;
    o->n_reserved = 256;
    o->shard_bytes = 9750000000ull; /* 62 shards, model-000NN-of-000062 */
    o->shard_names = GEN_SHARDS_5_6;
}

/* K2-Instruct: K2-Thinking's config with FP8 weights, K2's scalars (factor 32,
 * eps 1e-6, max_pos 131072), 61 shards named model-N-of-61. */
static void k2_instruct(cfg *c, gen_opts *o) {
    cfg_kimi_k2_thinking(c);
    c->rms_eps = 1e-6;
    c->yarn_factor = 32.0;
    c->max_ctx = 131072;
    o->experts_bf16 = 1;
    o->weights = GEN_W_FP8;
    o->tok = GEN_TOK_K2;
    o->n_reserved = 256;
    o->shard_bytes = 17000000000ull;
    o->shard_names = GEN_SHARDS_PLAIN;
}

typedef struct {
    preset_info info;
    void (*fill)(cfg *c, gen_opts *o);
    int own_map; /* the fill sets the layer map itself */
} preset_def;

static const preset_def k_presets[] = {
    {{"tiny", "hidden 64, 8 layers, 16 experts top-4, vocab 512", 0, 1}, tiny, 0},
    {{"tiny-odd", "odd widths: hidden 120, 3 KDA heads of 20, 12 experts top-3", 0, 1}, tiny_odd, 0},
    {{"tiny-blocks", "13 layers, AttnRes block 4 (partial last block)", 0, 1}, tiny_blocks, 0},
    {{"tiny-shards", "tiny in several 96 KB shards", 0, 1}, tiny_shards, 0},
    {{"tiny-mixed", "tiny with F32/BF16/F16 trunk tensors", 0, 1}, tiny_mixed, 0},
    {{"tiny-bf16experts", "tiny with plain BF16 experts", 0, 1}, tiny_bf16experts, 0},
    {{"demo", "quick start: hidden 1024, 13 layers, 144 experts top-8, vocab 4352", 0, 0}, demo, 0},
    {{"ladder", "larger than RAM: hidden 2048, 37 layers, 448 experts top-8", 0, 0}, ladder, 0},
    {{"k3", "the real Kimi K3 configuration (1.56 TB)", 1, 0}, k3, 1},
    {{"kimi-linear-tiny", "Kimi Linear layout: hidden 64, 6 layers, 16 BF16 experts top-4", 0, 1}, kl_tiny, 1},
    {{"kimi-linear-ladder", "Kimi Linear proportions, ~16 GB: hidden 1024, 27 layers, 256 experts top-8", 0, 0}, kl_ladder, 1},
    {{"kimi-linear-48b", "the real Kimi-Linear-48B-A3B configuration (98 GB)", 1, 0}, kl_48b, 1},
    {{"deepseek-v3-tiny", "DeepSeek-V3 layout: FP8 (128x128 scales), tokenizer.json; hidden 64, 5 layers, 16 experts "
                          "in 4 groups, top-4", 0, 1}, ds_tiny_fp8, 1},
    {{"deepseek-v3-bf16-tiny", "deepseek-v3-tiny with bf16 weights and Kimi-style tiktoken specials", 0, 1}, ds_tiny, 1},
    {{"deepseek-r1-tiny", "deepseek-v3-tiny with DeepSeek-R1's chat template", 0, 1}, r1_tiny, 1},
    {{"kimi-k2-tiny", "Kimi K2 layout, bf16: hidden 64, 4 layers, 16 experts top-4", 0, 1}, k2_tiny, 1},
    {{"kimi-k2-instruct-tiny", "Kimi K2-Instruct layout: FP8 (128x128 scales), K2 tokenizer; hidden 64, 4 layers", 0, 1},
     k2_instruct_tiny, 1},
    {{"kimi-k2-thinking-tiny", "Kimi K2-Thinking layout: INT4 experts (group 32), rest bf16, K2 tokenizer with <think>",
      0, 1}, k2_thinking_tiny, 1},
    {{"kimi-k25-tiny", "Kimi K2.5 wrapper layout (language_model., a vision tensor): hidden 64, 4 layers", 0, 1},
     k25_tiny, 1},
    {{"kimi-k2-ladder", "K2-Thinking layout (INT4 experts), ~15 GB: hidden 1024, 29 layers, 384 experts top-8", 0, 0},
     k2_ladder, 1},
    {{"deepseek-v3", "the real DeepSeek-V3 configuration, FP8 (689 GB)", 1, 0}, ds_v3, 1},
    {{"kimi-k2-thinking", "the real Kimi-K2-Thinking configuration, INT4 experts (594 GB)", 1, 0}, k2_thinking, 1},
    {{"kimi-k2-instruct", "the real Kimi-K2-Instruct configuration, FP8 (1.03 TB)", 1, 0}, k2_instruct, 1},
};
#define N_PRESETS (sizeof k_presets / sizeof *k_presets)

size_t preset_count(void) { return N_PRESETS; }

const preset_info *preset_at(size_t i) { return i < N_PRESETS ? &k_presets[i].info : NULL; }

const preset_info *preset_find(const char *name) {
    for (size_t i = 0; i < N_PRESETS; i++)
        if (!strcmp(k_presets[i].info.name, name)) return &k_presets[i].info;
    return NULL;
}

int preset_get(const char *name, cfg *c, gen_opts *o) {
    for (size_t i = 0; i < N_PRESETS; i++) {
        if (strcmp(k_presets[i].info.name, name)) continue;
        base_cfg(c);
        memset(o, 0, sizeof *o);
        k_presets[i].fill(c, o);
        if (!k_presets[i].own_map) layer_map(c);
        o->preset = k_presets[i].info.name;
        return STRATA_OK;
    }
    return STRATA_EINVAL;
}
