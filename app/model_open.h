/*
 * model_open.h: how `strata run` and `strata chat` open a model through the
 * public API (strata.h), in one place so the two cannot drift: open + load
 * (the options come from opts.h's table), the load line, and the run report
 * (stderr and JSON).
 *
 * Use: opts_parse() (opts.h); mo_open() once MODEL_DIR is known
 * (config, index, binding check, tokenizer: no weights); mo_place() once the
 * context is known (plans, prints the plan and returns MO_PLANNED for --plan,
 * else opens the weights); mo_fmt_speed(), mo_report() / mo_placement_json() at
 * the end; mo_close().
 */
#ifndef STRATA_MODEL_OPEN_H
#define STRATA_MODEL_OPEN_H

#include <stdio.h>
#include <jansson.h>
#include "opts.h"
#include "strata.h"

typedef struct mo_model {
    const char *cmd, *dir;    /* "run" / "chat" (messages), MODEL_DIR */
    strata_model *m;
    strata_model_info info;   /* refreshed by mo_open and mo_place */
} mo_model;

#define MO_PLANNED 100 /* mo_place with --plan: the plan is printed, exit 0 */

/* strata_model_open: config, shard index, binding check, tokenizer. 0, or 1
 * after printing why. */
int mo_open(mo_model *m, const char *cmd, const char *model_dir);

/* Plan (when a budget, a pack or --plan is given) and open the weights and the
 * engine for max_seqs sequences of up to ctx positions, then print the load
 * line. Returns 0; MO_PLANNED after printing the plan for --plan; EXIT_USAGE
 * below the minimum budget (the message names the minimum); 1 on other failures
 * (printed). */
int mo_place(mo_model *m, const app_opts *o, int64_t ctx, int max_seqs);

/* The middle of the run report line, shared by run and chat: "prefill X s/token (Y
 * tok/s), decode ...; MLA cache N B/position; peak RSS A (engine B)" into buf.
 * Per-token rates are 0 when a count is 0. */
void mo_fmt_speed(const mo_model *m, int64_t n_prefill, double t_prefill, int64_t n_decode, double t_decode,
                  uint64_t peak_rss, char *buf, size_t n);

/* The placement part of the run report: reads, hit rate, I/O wait, peak RSS vs the
 * budget (nothing when fully resident without a plan). */
void mo_report(mo_model *m, FILE *f);
/* {"plan": ..., "stats": ...} or {"plan": "resident"} (new reference). */
json_t *mo_placement_json(mo_model *m);

void mo_close(mo_model *m);

#endif
