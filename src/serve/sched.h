/*
 * sched.h: the engine thread of `strata serve` and the jobs it runs.
 *
 * One thread owns the model. It loads it (for `parallel` sequences, created once
 * and reused), then loops: at each step boundary it drops cancelled jobs, admits
 * queued jobs into free sequences, and advances every active generator with one
 * strata_gen_step (decode rows first, then prompt rows), so all users share each
 * weight read. A job that finishes (end id, stop string, max_tokens, context) or
 * is cancelled leaves at that boundary and its sequence takes the next job.
 *
 * HTTP threads build a job (prompt ids, sampling options, stop strings), submit
 * it, and wait on the job's own condition variable for text. The queue of jobs
 * waiting for a sequence is bounded: sched_submit answers 429 beyond it. The
 * engine thread turns ids into text (chat channels or plain text), holds back
 * text that may be the start of a stop string, and cuts at a match.
 *
 * Determinism: each job's draw at position p depends only on (seed, p) and a
 * sequence's logits do not depend on what else is in the step (strata.h), so a
 * request's output is the same alone or among others, with or without
 * speculation (opts.spec: every generator drafts), and whether its prompt
 * started from a prefix snapshot (the model's prefix cache, used by
 * strata_gen_create; job.n_cached tells how many prompt tokens it restored).
 */
#ifndef STRATA_SERVE_SCHED_H
#define STRATA_SERVE_SCHED_H

#include <pthread.h>
#include <stdatomic.h>
#include "metrics.h"
#include "request.h"
#include "strata.h"

/* One generated token's log-probability and its likeliest alternatives
 * (strata_gen_logprob: after penalties and masks, before temperature). */
typedef struct lp_ent {
    int32_t id;
    int n_top;
    double lp;
    int32_t top_ids[STRATA_MAX_TOP_LOGPROBS];
    double top_lp[STRATA_MAX_TOP_LOGPROBS];
} lp_ent;

typedef struct job {
    /* set by the submitter; read-only once submitted */
    int kind;                     /* REQ_CHAT or REQ_COMPLETION */
    char rid[48];                 /* the response id ("chatcmpl-..."), for /slots */
    /* n > 1 (one prompt, n choices): group[0] (the leader) is queued and holds
     * every member's reference; the leader evaluates the prompt but its last
     * token, the members' sequences are copied from it, then each member
     * continues with its own seed (seed + index). NULL / 1 / 0 for one choice. */
    struct job **group;
    int n_group, index;
    struct job *notify;           /* whose ver / cv a change of this job bumps (the leader; itself alone) */
    int thinking;                 /* chat: the reply may carry reasoning (reasoning_content; strata_chat_fmt_reasons) */
    int think_first;              /* chat: the reply starts in the think channel (strata_chat_fmt_starts_thinking) */
    int follow_from;              /* chat: the follower's start (thinking, or 2: a forced call's tools channel) */
    int32_t *prompt;              /* (n_prompt) counted */
    int64_t n_prompt;
    strata_gen_opts go;           /* go.grammar: the job's own (freed with the job) */
    char stop[REQ_MAX_STOP][REQ_MAX_STOP_BYTES + 1];
    size_t stop_len[REQ_MAX_STOP];
    int n_stop;
    double t_submit;
    char call_id[40];             /* tool calls' id prefix ("call_" + the prompt's hash) */

    /* engine -> waiter, under mu; cv is broadcast on every change */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    req_buf content, reasoning;   /* UTF-8-clean text so far */
    char **call_name, **call_args; /* (n_calls, cap_calls) tool calls handed out, counted */
    size_t *call_at;              /* (n_calls) content.n when each call was handed out: where its
                                   * tool_use block goes among the text (/v1/messages) */
    size_t n_calls, cap_calls;
    int64_t n_gen;                /* completion tokens */
    int64_t n_cached;             /* prompt tokens restored from the prefix cache */
    int64_t n_reasoning;          /* completion tokens of the think channel */
    int64_t prompt_done;          /* prompt tokens evaluated (or restored) so far */
    lp_ent *lp;                   /* (n_lp) chat: the response channel's tokens; completions: every token */
    size_t n_lp, cap_lp;
    unsigned ver;                 /* bumped on any change of this job or (leader) its group */
    int finished;                 /* no more text will come */
    const char *finish_reason;    /* "stop" | "length" | "tool_calls" (NULL when failed or cancelled) */
    int stop_hit;                 /* with "stop": the stop string matched (-1: an end id); set before finished */
    int err_status;               /* != 0: the job failed (HTTP status), err_msg says why */
    char err_msg[256];
    atomic_int cancelled;         /* set by the waiter (client gone); honoured at the next step */

    /* engine thread only */
    strata_gen *g;
    int pre;                      /* the leader's prompt-but-last-token generator runs */
    int64_t prompt_base;          /* prompt tokens before g's own prompt (continuing members) */
    int64_t n_gen_prompt;         /* g's own prompt length */
    int ch_last;                  /* chat: the channel after the previous token */
    int in_tag;                   /* chat logprobs: inside a channel tag opened in the response */
    size_t lp_mark;               /* n_lp when that tag opened */
    int slot;
    void *follow;                 /* strata_chat_follow (chat) */
    strata_detok *ts;               /* plain text (completions) */
    strata_tool_parser *tp;       /* chat with tools (set by the submitter): calls in the reply */
    req_buf pend;                 /* response text held back for stop matching */
    double t_prev;                /* time of the previous token */
    struct job *next;             /* queue link */
    atomic_int refs;              /* a member holds one of its leader's */
} job;

typedef struct sched sched;

/* A job with one reference (the caller's). NULL on allocation failure. */
job *job_new(void);
/* Makes jobs[0 .. n) one group (n > 1) of choices of jobs[0]'s prompt; each
 * member's go.seed is set by the caller. sched_submit(jobs[0]) queues them all. */
int job_group(job **jobs, int n);
/* Drops the caller's reference (after submit the engine holds its own). */
void job_release(sched *s, job *j);

typedef struct sched_opts {
    int parallel;                 /* sequences stepped together (the model is loaded for this many) */
    int queue_max;                /* jobs waiting beyond those; more -> 429 */
    int step_delay_ms;            /* test hook: sleep before each step (STRATA_SERVE_STEP_MS) */
    int spec;                     /* drafted tokens per sequence and step (0: no speculation) */
    int mtp_draft;                /* drafts from the MTP layer (strata_gen_opts.mtp_draft) */
} sched_opts;

/* m: opened, not loaded (the engine thread loads it with mopts); tk: the
 * server's tokenizer (detokenizing output). */
int sched_create(sched **out, strata_model *m, const strata_model_opts *mopts, strata_tokenizer *tk, const sched_opts *o,
                 metrics *mt, char *err, size_t errlen);
/* Starts the engine thread (which loads the model first). */
int sched_start(sched *s, char *err, size_t errlen);
/* 0 loading, 1 ready, -1 the load failed (message in sched_load_error). */
int sched_state(sched *s);
const char *sched_load_error(sched *s);
/* The STRATA_E* code of the failed load (valid once sched_state says -1). */
int sched_load_rc(sched *s);
/* The model as loaded (valid once sched_state says 1). */
const strata_model_info *sched_info(sched *s);
/* The model's counters right after the load (prefix cache sizes), same validity. */
const strata_stats *sched_load_stats(sched *s);
/* Queues j (the scheduler takes its own reference). 0, or -1 with e: 503 while
 * loading or draining, 429 when the queue is full (e->code "queue_full"). */
int sched_submit(sched *s, job *j, req_error *e);
/* The waiter is gone: j (and its group) leaves at the next step boundary (or the queue). */
void sched_cancel(sched *s, job *j);
/* The active and queued requests as JSON (GET /slots): {"parallel", "slots": [{
 * "slot", "id", "state" ("prefill" | "generating" | "waiting" | "queued"),
 * "prompt_tokens", "prompt_done", "generated", "choice"}]}. */
struct json_t *sched_slots_json(sched *s);
/* Stops admitting (submit -> 503), lets queued and running jobs finish for up to
 * grace_s seconds, cancels the rest, and stops the engine thread. */
void sched_shutdown(sched *s, double grace_s);
/* Waiting jobs and active sequences, for metrics and logs. */
void sched_counts(sched *s, int *queued, int *active);
void sched_free(sched *s); /* after sched_shutdown */

#endif
