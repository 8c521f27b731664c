/*
 * arch.h: architecture descriptions. A checkpoint's config.json (`model_type`,
 * `architectures`) selects one; the description says which config keys are read,
 * which keys are fixed by the engine (refused with another value), the tensor name
 * prefixes, and sets the variant flags of cfg (cfg.h) that the schema (schema.c) and
 * the engine's blocks (src/engine) follow. All flags zero is K3.
 *
 *   arch_k3.c            Kimi K3 (kimi_k3): nested config, AttnRes, LatentMoE, SiTU
 *   arch_kimi_linear.c   Kimi Linear (kimi_linear, KimiLinearForCausalLM): flat config,
 *                        plain pre-norm, softplus KDA gate, low-rank KDA output gate,
 *                        MLA without q-LoRA or output gate, SiLU experts on the hidden dim
 *   arch_deepseek_v3.c   DeepSeek-V3 / Kimi K2 (DeepseekV3ForCausalLM: deepseek_v3, kimi_k2)
 *                        and K2.5's kimi_k25 wrapper: every layer MLA with q-LoRA and
 *                        YaRN RoPE, group-limited sigmoid router, SwiGLU experts
 *
 * A new architecture is a new arch_<name>.c with its description added to
 * arch_all (arch.c), plus the flags it needs in cfg and the blocks that read them.
 */
#ifndef STRATA_ARCH_H
#define STRATA_ARCH_H

#include <stddef.h>
#include <stdint.h>

/* cfg.h includes nothing of this file and cfg.c reads the descriptions, so the
 * type is declared here, not included: no include circle (tools/check_includes.sh). */
typedef struct cfg cfg;

/* Field ids of the config keys (cfg.c's key table); a description lists the ones
 * it does not read (their values come from its finish()). */
enum cfg_fid {
    F_HIDDEN, F_LAYERS, F_VOCAB, F_EPS, F_KDA_HEADS, F_KDA_D, F_CONV, F_GLB,
    F_NHEADS, F_QLORA, F_KVLORA, F_NOPE, F_ROPE, F_VHEAD, F_MLA_GATE,
    F_NEXP, F_TOPK, F_NSHARED, F_LATENT, F_MOE_I, F_RSCALE, F_RENORM, F_LNORM,
    F_FDENSE, F_DENSE_I, F_ARB, F_B1, F_B2, F_FULL, F_IDS, F_CTX, F_COUNT
};
#define ARCH_BIT(f) (UINT64_C(1) << (f))

/* A key whose value selects math: only the listed JSON texts are accepted
 * (absent or null reads as the engine's behaviour). "quantization_config.x" is
 * looked up in that object. */
#define FIXED_MAX_ACCEPT 4
typedef struct fixed_key {
    const char *name;
    const char *accept[FIXED_MAX_ACCEPT]; /* JSON texts, NULL-terminated */
    const char *why;                      /* what the engine implements */
} fixed_key;

/* The config reader's state (cfg.c), for a description's own keys (read below). */
struct cfg_rd;
struct json_t;
/* Records a problem line ("<file>: <msg>"). */
void cfg_rd_problem(struct cfg_rd *r, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
/* A general key: text_config first, then the root; NULL when absent or null.
 * *path receives its dotted name (or where it was looked for). */
const struct json_t *cfg_rd_find(struct cfg_rd *r, const char *name, char *path, size_t n);
/* The quantization_config object (root, else text_config) or NULL. */
const struct json_t *cfg_rd_quant(struct cfg_rd *r, char *path, size_t n);
/* A JSON value as text for messages ("an object", "1.5", "the string \"x\""). */
const char *cfg_rd_jtype(const struct json_t *v, char *buf, size_t n);

typedef struct arch_desc arch_desc;
struct arch_desc {
    int id;                    /* enum cfg_arch (cfg.h) */
    const char *name;          /* for messages and inspect: "kimi_k3", "kimi_linear" */
    const char *model_type;    /* config.json model_type */
    const char *architecture;  /* config.json architectures[0] */
    const char *pfx;           /* tensor names of the body: PFX "embed_tokens.weight", PFX "layers.N..." */
    const char *lm_head;       /* the lm_head tensor's name */
    uint64_t keys_skip;        /* key ids not read (set by finish) */
    uint64_t keys_nullable;    /* key ids whose null reads as 0 (q_lora_rank null: no q-LoRA) */
    const fixed_key *fixed;
    size_t n_fixed;
    /* Sets the variant flags and the fields it does not read; called before the
     * keys are read (defaults) and after (derived values). */
    void (*defaults)(cfg *c);
    void (*finish)(cfg *c);
    /* Writes config.json in the architecture's published shape (MEM_MISC). */
    char *(*to_json)(const cfg *c);
    /* Reads the keys outside cfg.c's table (NULL: none), after them. */
    void (*read)(cfg *c, struct cfg_rd *r);
};

extern const struct arch_desc arch_k3, arch_kimi_linear, arch_deepseek_v3, arch_kimi_k2, arch_kimi_k25;
/* A config naming an architecture this engine refuses (DeepSeek-V3.2's sparse
 * attention): the reason, else NULL. */
const char *arch_refused(const char *model_type, const char *const *archs, size_t n_archs);
/* The real configurations (family-configs): DeepSeek-V3 (bf16 weights; the
 * release is FP8) and Kimi-K2-Thinking (bf16; the release's experts are INT4). */
void cfg_deepseek_v3(cfg *c);
void cfg_kimi_k2_thinking(cfg *c);
/* YaRN (arch_deepseek_v3.c, family-math 8.2): the frequency of pair i, the
 * cos/sin factor and the softmax scale of MLA (1/sqrt(nope + rope) without RoPE). */
double arch_rope_inv_freq(const cfg *c, int64_t i);
double arch_rope_mscale(const cfg *c);
double arch_mla_scale(const cfg *c);

/* The description of c->arch (K3 for an unknown id). */
const arch_desc *arch_of(const cfg *c);
/* The description a config names: model_type (root, else text_config) and the
 * first entry of architectures. Unknown names or none: K3 (as before this layer).
 * *conflict is set when the two name different architectures. */
const arch_desc *arch_detect(const char *model_type, const char *const *archs, size_t n_archs, int *conflict);
/* The real Kimi-Linear-48B-A3B-Instruct configuration (family-configs). */
void cfg_kimi_linear(cfg *c);
/* Pieces of the writers (cfg.c): a number as the shortest text that reads back
 * the same (a JSON real), and the one-based layer list of the MLA (want_mla 1) or
 * KDA layers, one per line at ind, the bracket closing at close_ind. */
struct sbuf;
void cfg_json_num(struct sbuf *b, double x);
/* ",\n  \"quantization_config\": {...}" for c->wf's FP8 or INT4 formats (the
 * published checkpoints' text); nothing for the others. */
void cfg_json_quant(struct sbuf *b, const cfg *c);
void cfg_json_layers(struct sbuf *b, const cfg *c, int want_mla, const char *ind, const char *close_ind);
/* The JSON writers (cfg.c: K3; arch_kimi_linear.c). */
char *arch_k3_to_json(const cfg *c);
char *arch_kimi_linear_to_json(const cfg *c);
char *arch_deepseek_v3_to_json(const cfg *c);

#endif
