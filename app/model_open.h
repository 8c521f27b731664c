/*
 * model_open.h: how `strata run` and `strata chat` open a model through the
 * public API (strata.h), in one place so the two cannot drift: the placement
 * flags (--ram-gb, --ram, --pack, --plan, --threads, --no-verify), open + load,
 * the load line, and the run report (stderr and JSON).
 *
 * Use: mo_flag() inside the argument loop; mo_open() once MODEL_DIR is known
 * (config, index, binding check, tokenizer: no weights); mo_place() once the
 * context is known (plans, prints the plan and returns MO_PLANNED for --plan,
 * else opens the weights); mo_fmt_speed(), mo_report() / mo_placement_json() at
 * the end; mo_close().
 */
#ifndef STRATA_MODEL_OPEN_H
#define STRATA_MODEL_OPEN_H

#include <stdio.h>
#include <jansson.h>
#include "strata.h"

/* The --help lines of the flags mo_flag() takes. */
#define MO_USAGE                                                                             \
    "  --threads N          compute threads (default: physical cores)\n"                     \
    "  --ram-gb X           RAM budget in GB (10^9 B): weights beyond it are streamed\n"     \
    "  --ram SIZE|auto      budget as a size (24G = GiB) or auto = MemAvailable\n"           \
    "  --pack DIR           read the trunk from this pack (default: the model's own)\n"      \
    "  --no-verify          do not check pack reads against the manifest's checksums\n"      \
    "  --no-prefetch        no expert reads a layer ahead of the router (same output)\n"    \
    "  --router unbiased|hf routed expert weights: unbiased sigmoid (default, as vLLM and\n"   \
    "                       llama.cpp) or hf (plus the score bias, as Kimi Linear's HF code)\n" \
    "  --no-preload         no warm start: the cache fills as experts are first used\n"     \
    "  --plan               print the memory plan and exit\n"

typedef struct mo_opts {
    const char *pack_dir;
    uint64_t ram_bytes;
    int have_ram, plan_only, no_verify, no_prefetch, no_preload;
    int router;             /* strata_model_opts.router (--router unbiased|hf) */
    int spec;               /* drafted tokens per verification (strata_model_opts.spec) */
    int draft_given;        /* --draft was given (it needs --spec) */
    uint64_t prefix_ram, prefix_dir_bytes; /* strata_model_opts.prefix_* (0: none) */
    const char *prefix_dir;
    int64_t prefix_every;
    int64_t threads, chunk; /* 0 = defaults */
} mo_opts;

typedef struct mo_model {
    const char *cmd, *dir;    /* "run" / "chat" (messages), MODEL_DIR */
    strata_model *m;
    strata_model_info info;   /* refreshed by mo_open and mo_place */
} mo_model;

#define MO_PLANNED 100 /* mo_place with --plan: the plan is printed, exit 0 */

/* strata-mpi (app/strata.c) sets these on rank 0: every model is then loaded
 * across the cluster, its stages printed after the load line and each rank's
 * reads and traffic after the report. All NULL in the plain binary. */
typedef struct mo_cluster_hooks {
    strata_cluster *cl;
    void (*print_stages)(const strata_cluster *cl, FILE *f);
    void (*print_report)(strata_cluster *cl, FILE *f);
    int (*measure_net)(strata_cluster *cl, double *bw, double *lat, char *err, size_t errlen);
    int size;                 /* ranks */
} mo_cluster_hooks;
extern mo_cluster_hooks mo_cluster;

/* If argv[*i] is one of MO_USAGE's flags, consumes it (and its value) and returns 0;
 * a bad value prints a usage error and returns EXIT_USAGE; -1: not one of ours. */
int mo_flag(int argc, char **argv, int *i, const char *cmd, mo_opts *o);

/* The --help lines of the flags mo_gen_flag() takes. */
#define MO_GEN_USAGE                                                                         \
    "  --temp T             temperature; 0 = greedy, ties to the lowest id (default 0)\n"     \
    "  --top-k K            keep the K most likely tokens (0 = off)\n"                        \
    "  --top-p P            nucleus sampling mass in (0, 1] (1 = off)\n"                      \
    "  --min-p P            drop tokens below P x the top probability (0 = off)\n"            \
    "  --repeat-penalty R   penalise the last 64 ids (1 = off)\n"                             \
    "  --seed S             sampling seed (default 0): the draw at position p depends only on (S, p)\n" \
    "  --spec K             speculative decoding: verify up to K drafted tokens with each token in\n" \
    "                       one pass; the output is identical to decoding without it\n"       \
    "  --draft SRC          with --spec: ngram (default: recent n-grams of the text) or self: the\n" \
    "                       model itself on what is already in RAM (pinned layers, cached experts;\n" \
    "                       the rest skipped), no disk reads\n"

/* Sampling and speculation flags shared by run and chat: if argv[*i] is one of
 * MO_GEN_USAGE's, consumes it into go (and --spec into o->spec) and returns 0;
 * EXIT_USAGE after a usage error; -1: not one of ours. */
int mo_gen_flag(int argc, char **argv, int *i, const char *cmd, strata_gen_opts *go, mo_opts *o);

/* strata_model_open: config, shard index, binding check, tokenizer. 0, or 1
 * after printing why. */
int mo_open(mo_model *m, const char *cmd, const char *model_dir);

/* Plan (when a budget, a pack or --plan is given) and open the weights and the
 * engine for max_seqs sequences of up to ctx positions, then print the load
 * line. Returns 0; MO_PLANNED after printing the plan for --plan; EXIT_USAGE
 * below the minimum budget (the message names the minimum); 1 on other failures
 * (printed). */
int mo_place(mo_model *m, const mo_opts *o, int64_t ctx, int max_seqs);

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
