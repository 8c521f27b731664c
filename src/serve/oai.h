/*
 * oai.h: the JSON pieces of `strata serve`'s OpenAI answers that depend only on
 * finished job data: usage, logprobs (chat's content list and the legacy
 * completions object). Pure builders: no I/O, no locks (the caller holds the
 * job's mutex where the data can still grow).
 */
#ifndef STRATA_SERVE_OAI_H
#define STRATA_SERVE_OAI_H

#include <jansson.h>
#include "sched.h"

/* OpenAI's usage of a request's choices: the prompt counted once, completion
 * tokens summed, prompt_tokens_details.cached_tokens (the prefix cache) and
 * completion_tokens_details.reasoning_tokens (the think channel). */
json_t *oai_usage(job *const *jobs, int n);
/* Logprobs of entries e[0, n): chat {"content": [...], "refusal": null}; a
 * completion the legacy {"tokens", "token_logprobs", "top_logprobs",
 * "text_offset"} with offsets from *text_off (advanced past them). */
json_t *oai_logprobs(const strata_tokenizer *tk, int kind, const lp_ent *e, size_t n, size_t *text_off);

/* The whole answer of a non-streaming chat or completion request (every job
 * finished): id, object, created, model, system_fingerprint fp, seed, one
 * choice per job (its index), usage. */
json_t *oai_answer(const strata_tokenizer *tk, int kind, job *const *jobs, int n, const char *id, const char *model, const char *fp,
                   uint64_t seed);

#endif
