/*
 * sample.h: choosing the next token from logits, and the stop set.
 *
 * Order of operations (fixed, so the same seed gives the same tokens): repetition
 * penalty over the last repeat_last_n distinct ids of the history (logit > 0 is
 * divided by the penalty, otherwise multiplied); then the mask, when one is given
 * (a constraint such as a JSON grammar: every id outside it becomes -inf; these
 * penalised and masked logits stay readable through sampler_logits until the next
 * draw, so log-probabilities see what the draw saw); if temp == 0 greedy argmax
 * (ties to the lowest id); else logits / temp, softmax, min-p filter (p >= min_p * p_max),
 * top-k, top-p (smallest prefix of the sorted candidates whose mass >= top_p),
 * renormalise, one draw from PCG32. Candidates are sorted by (prob desc, id asc),
 * a total order, so ties never depend on the sort algorithm.
 * No allocation per token: work arrays are sized at sampler_create.
 */
#ifndef STRATA_SAMPLE_H
#define STRATA_SAMPLE_H

#include <stddef.h>
#include <stdint.h>
#include "cfg.h"

typedef struct sample_opts {
    double temp;            /* 0 = greedy */
    int64_t top_k;          /* 0 = off */
    double top_p;           /* 1 = off; (0, 1] */
    double min_p;           /* 0 = off; [0, 1] */
    double repeat_penalty;  /* 1 = off; > 0 */
    int64_t repeat_last_n;  /* history window for the penalty; 0 = the whole history */
    uint64_t seed;
} sample_opts;
#define SAMPLE_OPTS_DEFAULT {0.0, 0, 1.0, 0.0, 1.0, 64, 0}

typedef struct sampler sampler;

/* Work arrays for a vocabulary of n_vocab (MEM_SCRATCH). Free with sampler_free. */
int sampler_create(sampler **out, int64_t n_vocab, const sample_opts *o, char *err, size_t errlen);
void sampler_free(sampler *s); /* accepts NULL */
/* Next token from logits (n_vocab floats, not modified); hist = the ids so far. */
int32_t sampler_next(sampler *s, const float *logits, const int32_t *hist, int64_t n_hist);

/* The same, with the random draw a function of (seed, pos) only: the stream is
 * reseeded from them first. The token at position pos of a sequence then never
 * depends on how many draws came before it, what else was batched with it, or
 * whether drafted tokens were verified in between (speculation). */
int32_t sampler_next_at(sampler *s, const float *logits, const int32_t *hist, int64_t n_hist, int64_t pos);

/* The same with a mask: allow is a bitset of n_vocab bits (bit i of word i / 64:
 * id i may be drawn), or NULL for none. */
int32_t sampler_next_masked(sampler *s, const float *logits, const uint64_t *allow, const int32_t *hist, int64_t n_hist);
int32_t sampler_next_masked_at(sampler *s, const float *logits, const uint64_t *allow, const int32_t *hist, int64_t n_hist,
                               int64_t pos);
/* The logits of the last draw after the repetition penalty and the mask, before
 * the temperature: n_vocab floats in the sampler's work array, valid until the
 * next draw. Log-probabilities are the log-softmax of these, so they describe the
 * distribution the draw chose from before temp/top-k/top-p/min-p. */
const float *sampler_logits(const sampler *s);
/* The log-softmax of sampler_logits (in double) at id into *lp, and at the k
 * likeliest ids (value desc, id asc) into top_ids / top_lp; returns how many
 * (min(k, n_vocab)). No allocation: three passes over the vocabulary. */
int sampler_logprobs(const sampler *s, int32_t id, int k, double *lp, int32_t *top_ids, double *top_lp);

/* Index of the largest value, ties to the lowest index (NaN never wins). */
int32_t sample_argmax(const float *x, int64_t n);

/* PCG32 (O'Neill), exposed for tests. */
typedef struct pcg32 { uint64_t state, inc; } pcg32;
void pcg32_seed(pcg32 *r, uint64_t seed, uint64_t seq);
uint32_t pcg32_next(pcg32 *r);
double pcg32_unit(pcg32 *r); /* [0, 1) with 53 random bits */

/* The stop set: c->eos_ids, then tokenizer_config.json in model_dir when present
 * (its eos_token, and the K3 end-of-turn specials "[EOS]" / "<|end_of_msg|>" found
 * in added_tokens_decoder), each once, ids outside [0, vocab) dropped. Returns the
 * count (<= max); a malformed tokenizer_config.json is an error (negative code). */
int sample_stop_ids(const char *model_dir, const cfg *c, int32_t *ids, int max, char *err, size_t errlen);

#endif
