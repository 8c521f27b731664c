/*
 * schema.h: every tensor a model has, derived from its config alone (the
 * architecture's prefixes from arch.h, its variant flags from cfg.h).
 *
 * One walk drives the generator (what to write), the binder (what must exist, with
 * which shape), the census and the packer, so the four can never disagree about a
 * name or a shape. Names follow the released checkpoint (docs/architecture.md,
 * Checkpoint files and tensor names).
 */
#ifndef STRATA_SCHEMA_H
#define STRATA_SCHEMA_H

#include "cfg.h"

enum tclass { TC_EMBED, TC_LAYER, TC_EXPERT, TC_FINAL, TC_LM_HEAD };
enum tkind {
    TK_MATRIX,  /* 2-D float (F32/BF16/F16), y = W x with W (rows, cols) */
    TK_VECTOR,  /* 1-D float; [n] or [1, n] accepted */
    TK_CONV,    /* (P, 1, conv_k) float */
    TK_PACKED,  /* MXFP4 codes, U8 (rows, cols/2) */
    TK_SCALE,   /* MXFP4 E8M0 scales, U8 (rows, cols/32) */
    /* A matrix stored quantised (schema_walk's wf): its main tensor, then its
     * companions, all with the matrix's role (wt.fmt and wt.s in model.h). */
    TK_FP8,      /* FP8 e4m3fn codes, F8_E4M3 (rows, cols): `weight` */
    TK_FP8_SCALE,/* F32 (ceil(rows/128), ceil(cols/128)), multiplied: `weight_scale_inv` */
    TK_I4_PACKED,/* I32 (rows, cols/8), 8 codes per word along the input, low nibble first: `weight_packed` */
    TK_I4_SCALE, /* BF16 (rows, cols/32): `weight_scale` */
    TK_I4_SHAPE, /* I32 or I64 [2] = {rows, cols}: `weight_shape` (checked, never computed with) */
};

/* Weight formats of a checkpoint (schema_walk's wf): SW_* in cfg.h. */
/* Formats of a matrix view (wt.fmt): how p's bytes decode, and what s holds. */
enum wfmt { WF_PLAIN = 0, WF_FP8 = 1, WF_INT4 = 2 };

/* Roles: which slot of a layer the tensor fills (append only). */
enum trole {
    R_EMBED, R_LM_HEAD, R_FINAL_NORM, R_OUT_RES_NORM, R_OUT_RES_PROJ,
    R_IN_NORM, R_POST_NORM, R_ATTN_RES_NORM, R_ATTN_RES_PROJ, R_MLP_RES_NORM, R_MLP_RES_PROJ,
    /* KDA */
    R_KDA_Q, R_KDA_K, R_KDA_V, R_KDA_G, R_KDA_O, R_KDA_QCONV, R_KDA_KCONV, R_KDA_VCONV,
    R_KDA_FA, R_KDA_FB, R_KDA_B, R_KDA_ALOG, R_KDA_DTBIAS, R_KDA_ONORM,
    /* MLA */
    R_MLA_QA, R_MLA_QA_NORM, R_MLA_QB, R_MLA_KVA, R_MLA_KVA_NORM, R_MLA_KVB, R_MLA_O, R_MLA_G,
    /* dense MLP */
    R_DENSE_GATE, R_DENSE_UP, R_DENSE_DOWN,
    /* MoE trunk */
    R_MOE_ROUTER, R_MOE_BIAS, R_MOE_LAT_DOWN, R_MOE_LAT_UP, R_MOE_LAT_NORM,
    R_MOE_SH_GATE, R_MOE_SH_UP, R_MOE_SH_DOWN,
    /* one routed expert (MXFP4 packed/scale, or bf16 weight) */
    R_EXP_W1P, R_EXP_W1S, R_EXP_W2P, R_EXP_W2S, R_EXP_W3P, R_EXP_W3S,
    R_EXP_W1, R_EXP_W2, R_EXP_W3,
    /* KDA low-rank output gate (cfg kda_g_lowrank): g_a (D, hidden), g_b (P, D).
     * A direct MLA q_proj (q_lora == 0) fills R_MLA_QB with (NH * qh, hidden). */
    R_KDA_GA, R_KDA_GB,
    /* DeepSeek-V3's MTP layer (cfg mtp): enorm, hnorm (hidden), eh_proj (hidden,
     * 2 hidden), shared_head.norm (hidden); its embedding and head copies are never
     * bound (the model's own serve) */
    R_MTP_ENORM, R_MTP_HNORM, R_MTP_EH, R_MTP_HEAD_NORM,
    R_COUNT
};

typedef struct tspec {
    char name[160];
    int cls, kind, role;
    int64_t layer;  /* -1 for model-level tensors */
    int64_t expert; /* -1 unless TC_EXPERT */
    int ndim;
    int64_t shape[4];
    int64_t numel;
    int pub_dtype;  /* the dtype the architecture publishes it in, plus 1 (0: the writer's choice) */
} tspec;

/* Calls fn for every tensor in canonical order: embed; per layer L the trunk
 * tensors then experts 0..n-1 (w1.packed, w1.scale, w2.packed, w2.scale, w3.packed,
 * w3.scale, the released order); final vectors; lm_head. wf (SW_*) selects the
 * formats: MXFP4 or plain `weight` experts (the old experts_bf16 flag), FP8
 * (`weight`, `weight_scale_inv`) or INT4 (`weight_packed`, `weight_scale`,
 * `weight_shape`) experts, FP8 trunk matrices. Stops and returns fn's value if
 * non-zero. */
typedef int (*schema_fn)(void *ud, const tspec *t);
int schema_walk(const cfg *c, int wf, schema_fn fn, void *ud);

/* Only the tensors of one layer's trunk (cls TC_LAYER), or of one expert. */
int schema_walk_layer(const cfg *c, int64_t L, int wf, schema_fn fn, void *ud);
int schema_walk_expert(const cfg *c, int64_t L, int64_t E, int wf, schema_fn fn, void *ud);
/* Is kind a companion of a quantised matrix (its role's wt.s, or only checked)? */
static inline int schema_is_companion(int kind) {
    return kind == TK_FP8_SCALE || kind == TK_I4_SCALE || kind == TK_I4_SHAPE;
}
/* The matrix format a main kind stands for (WF_*). */
static inline int schema_kind_fmt(int kind) {
    return kind == TK_FP8 ? WF_FP8 : kind == TK_I4_PACKED ? WF_INT4 : WF_PLAIN;
}
/* Only the head pseudo-layer's tensors (TC_FINAL vectors, then lm_head). */
int schema_walk_head(const cfg *c, schema_fn fn, void *ud);

const char *schema_role_name(int role);

/* The name of expert E's w1 (the gate) in layer L: its weight_packed (packed 1)
 * or plain weight, under the architecture's names (block_sparse_moe.experts.E.w1,
 * or DeepSeek-V3's mlp.experts.E.gate_proj). Tells a checkpoint's expert format. */
void schema_expert_w1_name(const cfg *c, int64_t L, int64_t E, int packed, char *buf, size_t n);

/* The census of c: walks the schema (one expert per MoE layer stands for all),
 * with the formats c->wf declares (cfg.h). Embedding and plain trunk bytes are at
 * bf16 whatever the checkpoint stores; FP8 trunk matrices and experts as stored
 * (MXFP4, FP8 or INT4 with their scales; plain experts at bf16).
 * *out is all zeros if c does not pass cfg_validate. */
void schema_census(const cfg *c, cfg_census *out);

#endif
