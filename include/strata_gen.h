/*
 * strata_gen.h: the model generator (tools/gen), a tool beside the library: writes
 * a complete K3-format model directory with random, numerically alive weights
 * (config.json, sharded safetensors + index, tiktoken.model and
 * tokenizer_config.json) from a named preset or a config.json. Same seed, same
 * bytes. Built in OUT_DIR.partial-PID and renamed at the end, so OUT_DIR never
 * holds a half-written model. `strata gen-model` and the tests use it.
 *
 * Names are strata_genmodel_* (strata_gen_* in strata.h is the token generator).
 * Errors follow strata.h: int codes (STRATA_OK, STRATA_E*), detail in err.
 */
#ifndef STRATA_GEN_PUBLIC_H
#define STRATA_GEN_PUBLIC_H

#include <stddef.h>
#include <stdint.h>

/* One named configuration. */
typedef struct strata_genmodel_preset {
    const char *name;
    const char *summary;
    int big;      /* larger than a test machine's disk: writing needs force or sparse */
    int tiny;     /* a few MB at most: cheap enough for unit tests */
} strata_genmodel_preset;

size_t strata_genmodel_preset_count(void);
const strata_genmodel_preset *strata_genmodel_preset_at(size_t i);        /* i < strata_genmodel_preset_count() */
const strata_genmodel_preset *strata_genmodel_preset_find(const char *name); /* NULL if unknown */

/* Byte sizes of the model a preset writes (its own generator options). */
typedef struct strata_genmodel_sizes {
    uint64_t total, experts;  /* all files; the routed experts */
    int n_shards;
} strata_genmodel_sizes;
int strata_genmodel_preset_sizes(const char *name, strata_genmodel_sizes *out, char *err, size_t errlen);

/* Trunk dtypes. */
enum { STRATA_GENMODEL_TRUNK_BF16 = 0, STRATA_GENMODEL_TRUNK_MIXED = 1, STRATA_GENMODEL_TRUNK_F32 = 2 };
/* Weight formats (strata_genmodel_opts.weights): FP8 = every eligible linear
 * (not embed, lm_head, router gate) e4m3fn with a 128 x 128 weight_scale_inv grid,
 * as DeepSeek-V3 / K2-Instruct; INT4 = routed experts pack-quantized (group 32),
 * as K2-Thinking; BF16 = every tensor plain (a quantised preset's bf16 variant). */
enum { STRATA_GENMODEL_W_PRESET = 0, STRATA_GENMODEL_W_FP8 = 1, STRATA_GENMODEL_W_INT4 = 2, STRATA_GENMODEL_W_BF16 = 3 };

typedef struct strata_genmodel_opts {
    const char *preset;       /* a preset name, or NULL ... */
    const char *config;       /* ... and a config.json (released nested or flat shape) */
    /* Overrides of the preset's options (a config starts from the defaults): */
    int have_seed;            /* 1: seed below */
    uint64_t seed;
    uint64_t shard_bytes;     /* target shard size; 0 = the preset's, else 4 GiB */
    int64_t n_reserved;       /* special ids at the end of the vocab; 0 = the preset's (256, or 16) */
    int trunk_dtype;          /* STRATA_GENMODEL_TRUNK_*; -1 = the preset's */
    int experts_bf16;         /* 1: plain BF16 expert weights instead of MXFP4 (and no FP8 / INT4) */
    int weights;              /* STRATA_GENMODEL_W_*: 0 = the preset's formats */
    int scales_pow2;          /* 1: FP8 / INT4 scales are powers of two (the dequantised values are bf16) */
    int dequantize;           /* 1: the FP8 / INT4 model's values written as plain tensors (BF16 with
                               * power-of-two scales, else F32): the same numbers, bit for bit */
    int sparse;               /* 1: headers and holes only (zeros) */
    int force;                /* 1: replace an existing OUT_DIR once the new one is complete */
    /* data bytes done of total, seconds since start; may be NULL */
    void (*progress)(void *ud, uint64_t done, uint64_t total, double secs);
    void *progress_ud;
} strata_genmodel_opts;

typedef struct strata_genmodel_stats {
    uint64_t total_bytes;     /* all files written (apparent size) */
    uint64_t n_tensors;
    int n_shards;
    double secs, mb_per_s;
    double prep_secs, io_secs, gen_wait_secs, sync_secs; /* plan + tokenizer; write(2); waiting for the generators; fsync + rename */
} strata_genmodel_stats;

/* Writes the model into out_dir. */
int strata_genmodel_write(const char *out_dir, const strata_genmodel_opts *o, strata_genmodel_stats *st, char *err, size_t errlen);

#endif
