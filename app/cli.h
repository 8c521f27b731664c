/*
 * cli.h: what the subcommands share. Exit codes: 0 success, 1 failure (bad model,
 * I/O, refused plan), 2 usage error. --help prints to stdout and exits 0.
 */
#ifndef STRATA_CLI_H
#define STRATA_CLI_H

#include <stdio.h>
#include "strata.h"

#define EXIT_USAGE 2
/* --ctx: the largest context a command accepts (2^24 positions; beyond it the
 * MLA cache alone is terabytes for K3). Above the model's maximum is a note. */
#define CLI_MAX_CTX (1 << 24)
#define CLI_MAX_CTX_TEXT "an integer in [1, 16777216]"

/* Value of option argv[*i] (advances *i); prints a usage error and returns NULL if
 * the value is missing. */
const char *cli_need_arg(int argc, char **argv, int *i, const char *cmd);
/* Prints "strata CMD: <msg>\nTry 'strata CMD --help'." to stderr; returns EXIT_USAGE. */
int cli_usage_error(const char *cmd, const char *fmt, ...) STRATA_PRINTF(2, 3);
int cli_is_help(const char *a);

int cmd_inspect(int argc, char **argv);
int cmd_gen_model(int argc, char **argv);
int cmd_run(int argc, char **argv);
int cmd_chat(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);
int cmd_pack(int argc, char **argv);
int cmd_plan(int argc, char **argv);
int cmd_serve(int argc, char **argv);

/* strata-mpi (app/main.c) sets these on rank 0: every model is then loaded
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

#endif
