/*
 * gen_priv.h: what the generator's files share (gen.c writes the model,
 * gen_tok.c the tokenizer files, gen_weights.c the tensor list and its values):
 * the counter-based RNG every value comes from, the plan (the tensors in file
 * order, with their shards and offsets), and the functions one file gives another.
 * Private to tools/gen/; the public interface is gen.h. It does not include gen.h
 * (gen.c includes this header), so gen_opts is named by its struct tag.
 */
#ifndef STRATA_GEN_PRIV_H
#define STRATA_GEN_PRIV_H

#include <stddef.h>
#include <stdint.h>
#include "cfg.h"

struct gen_opts;

/* ========================================================================= RNG */

#define GOLDEN 0x9E3779B97F4A7C15ull

static inline uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* The i-th random word of stream `seed` (random access, no state). */
static inline uint64_t rnd_at(uint64_t seed, uint64_t i) { return mix64(seed + (i + 1) * GOLDEN); }

/* Approximately standard normal from one word: Irwin-Hall of four 16-bit uniforms,
 * rescaled to unit variance (tails end at +-3.46; the gains below widen on purpose
 * where large values are wanted). */
static inline float normal_of(uint64_t r) {
    uint32_t s = (uint32_t)(r & 0xFFFF) + (uint32_t)((r >> 16) & 0xFFFF) +
                 (uint32_t)((r >> 32) & 0xFFFF) + (uint32_t)(r >> 48);
    return ((float)s * (1.0f / 65536.0f) - 2.0f) * 1.7320508f;
}

/* Normal of element e of stream s, two elements per random word: Irwin-Hall of
 * four 8-bit uniforms (plenty for bf16's 8-bit mantissa), halving the hashing
 * cost of the trunk. The cached word makes consecutive calls cheap. */
typedef struct { uint64_t s, idx, r; } nrm;
static inline float nrm_at(nrm *g, uint64_t e) {
    uint64_t k = e >> 1;
    if (k != g->idx) { g->idx = k; g->r = rnd_at(g->s, k); }
    uint32_t w = (uint32_t)(g->r >> (32 * (e & 1)));
    uint32_t sum = (w & 255u) + ((w >> 8) & 255u) + ((w >> 16) & 255u) + (w >> 24);
    return (((float)sum + 2.0f) * (1.0f / 256.0f) - 2.0f) * 1.7320508f;
}

static inline double unif_of(uint64_t r) { return (double)(r >> 11) * (1.0 / 9007199254740992.0); }

/* Sequential generator for the tokenizer and shuffles. */
typedef struct { uint64_t s, i; } rng;
static inline uint64_t rng_next(rng *r) { return rnd_at(r->s, r->i++); }
static inline uint64_t rng_below(rng *r, uint64_t n) { return n ? rng_next(r) % n : 0; }

/* ======================================================================= plan */

/* One tensor as it will be written. */
typedef struct gitem {
    uint64_t name_off;  /* into plan.names */
    uint64_t nbytes;
    uint64_t off;       /* data offset inside its shard */
    uint64_t seed;      /* value stream of this tensor */
    int64_t shape[4];
    int32_t layer, expert, shard;
    int16_t role;
    int8_t cls, kind, ndim, dtype;
    int8_t unit;        /* first tensor of a placement unit (never split across shards) */
    /* A matrix quantised FP8 / INT4 (qfmt, WF_*), stored as its parts or, under
     * gen_opts.dequantize, as plain values: the matrix's value stream (mseed, of
     * its `weight` name), logical shape and scale kind. */
    int8_t qfmt, pow2;
    uint64_t mseed;
    int64_t mrows, mcols;
} gitem;

typedef struct plan {
    const cfg *c;
    const struct gen_opts *o;
    gitem *it;
    size_t n, cap;
    char *names;
    size_t nlen, ncap;
    uint64_t n_trunk;         /* trunk tensors seen, for the mixed-dtype rotation */
    int64_t q_rows, q_cols;   /* logical shape of the last matrix (its companions follow it) */
    int n_shards;
    uint64_t *shard_data;     /* data bytes of each shard */
    size_t *shard_first;      /* first item of each shard; [n_shards] = n */
    int oom;
} plan;

static inline const char *gen_item_name(const plan *p, const gitem *t) { return p->names + t->name_off; }

/* Builds the tensor list in file order and assigns shards (gen_weights.c). */
int gen_plan_build(plan *p, const cfg *c, const struct gen_opts *o, char *err, size_t errlen);
void gen_plan_free(plan *p);

/* Generates bytes [off, off+len) of shard s's data into dst (gen_weights.c);
 * tmp is scratch for tmpn floats. */
void gen_fill_buffer(const plan *p, int s, uint64_t off, size_t len, uint8_t *dst, float *tmp, size_t tmpn);

/* tiktoken.model and tokenizer_config.json into dir (gen_tok.c). */
int gen_write_tokenizer(const char *dir, const cfg *c, const struct gen_opts *o, int64_t n_ranks, char *err, size_t errlen);

#endif
