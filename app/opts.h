/*
 * opts.h: the one option table of the CLI. Every flag two or more commands take
 * (budget, threads, pack, plan, ctx, chunk, gen, sampling, speculation) is a row
 * of opts.c's table: its kind, its field in app_opts, the commands that take it
 * and its --help line; the values the server also takes are checked through
 * strata.h's strata_param table (same range, same message). A command's own flags
 * are rows of its own table, parsed by the same code.
 *
 * Use: opts_init(), opts_parse() (the whole argv), opts_help() inside usage();
 * then opts_model() fills strata_model_opts and opts_gen() strata_gen_opts:
 * the only places either is filled from the command line.
 */
#ifndef STRATA_APP_OPTS_H
#define STRATA_APP_OPTS_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include "strata.h"

/* The commands (a row's `cmds` and `help_in` masks). */
enum { OPT_RUN = 1, OPT_CHAT = 2, OPT_SERVE = 4, OPT_PLAN = 8 };
/* The groups of shared --help lines. */
enum { OPT_HELP_PLACE = 1, OPT_HELP_GEN = 2 };

typedef struct app_opts {
    unsigned cmd;              /* OPT_* */
    const char *name;          /* "run", ... (messages) */
    const char *pack_dir, *ram_flag; /* ram_flag: --ram-gb or --ram, whichever was given */
    uint64_t ram_bytes;
    int have_ram, plan_only, no_verify, no_prefetch, no_preload, draft_given;
    int mtp; /* --draft mtp: the model's MTP layer bound (strata_model_opts.mtp) */
    int router;                /* strata_model_opts.router (--router unbiased|hf) */
    int64_t threads, chunk, ctx, gen, spec; /* 0: the command's default */
    uint64_t prefix_ram, prefix_dir_bytes;  /* strata_model_opts.prefix_* (serve; 0: none) */
    const char *prefix_dir;
    int64_t prefix_every;
    strata_gen_opts go;        /* sampling and --draft, as parsed (opts_gen adds the rest) */
} app_opts;

typedef enum opt_kind {
    OPT_FLAG,   /* int = 1 */
    OPT_STR,    /* const char * */
    OPT_I64,    /* int64_t in [ilo, ihi] */
    OPT_F64,    /* double in [flo, fhi] */
    OPT_PARAM,  /* strata_param `param`: int64_t (integer) or double */
    OPT_FN,     /* fn(field, value): 0 ok, else a bad value */
    OPT_RAM_GB, /* --ram-gb: app_opts budget */
    OPT_RAM,    /* --ram SIZE|auto */
    OPT_DRAFT   /* --draft ngram|self */
} opt_kind;

typedef struct opt_row {
    const char *flag;
    opt_kind kind;
    size_t off;                /* the field: offsetof in the target struct */
    unsigned cmds;             /* shared table: the commands that take it (own tables: 0) */
    int64_t ilo, ihi;
    double flo, fhi;
    enum strata_param param;
    int (*fn)(void *field, const char *v);
    const char *what;          /* the bad-value message's parenthesis */
    unsigned help_in;          /* shared table: the commands whose --help print `help` */
    int group;                 /* OPT_HELP_* */
    const char *help;
} opt_row;

/* Zeroes o for command cmd with the default sampling options and gen. */
void opts_init(app_opts *o, unsigned cmd, int64_t gen);
#define OPTS_HELP (-1) /* opts_parse: --help or -h was given, usage printed to stdout */
/* Parses argv[1..]: --help / -h anywhere prints usage(stdout) (OPTS_HELP);
 * else the shared table, then own (rows into own_base), else the one positional
 * MODEL_DIR (*model_dir). 0, or EXIT_USAGE after a usage error. */
int opts_parse(int argc, char **argv, app_opts *o, void (*usage)(FILE *), const opt_row *own, size_t n_own, void *own_base,
               const char **model_dir);
/* If argv[*i] is a flag of rows (for o->cmd where rows are shared), consumes it
 * and its value into base: 0; EXIT_USAGE after a usage error; -1: not one of them. */
int opts_take(int argc, char **argv, int *i, app_opts *o, const opt_row *rows, size_t n, void *base);
/* The shared table (base: app_opts). */
extern const opt_row opts_shared[];
extern const size_t opts_n_shared;
/* The shared --help lines of group for o's command. */
void opts_help(FILE *f, unsigned cmd, int group);

/* The model options of o for max_seqs sequences of ctx positions (no progress
 * callbacks; the cluster of strata-mpi when there is one). */
void opts_model(const app_opts *o, int64_t ctx, int max_seqs, strata_model_opts *so);
/* The generation options of o: sampling, --draft, --spec, --gen as max_tokens. */
strata_gen_opts opts_gen(const app_opts *o);

#endif
