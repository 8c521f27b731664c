/*
 * strata.c: the `strata` binary: a table of subcommands. Each lives in
 * app/cmd_<name>.c as int cmd_<name>(argc, argv) with argv[0] the subcommand.
 */
#include <stdio.h>
#include <string.h>
#include "cli.h"
#include "strata.h"

typedef struct {
    const char *name;
    int (*fn)(int, char **);
    const char *summary;
} command;

static const command k_cmds[] = {
    {"run", cmd_run, "generate from a model directory (ids or text prompt)"},
    {"chat", cmd_chat, "interactive K3 chat with retained state"},
    {"serve", cmd_serve, "OpenAI-compatible HTTP server, all requests in one weight pass"},
    {"inspect", cmd_inspect, "check a model directory or config and print its census"},
    {"gen-model", cmd_gen_model, "write a K3-format model with random weights (presets)"},
    {"pack", cmd_pack, "repack a model into the streaming layout (trunk file + manifest)"},
    {"plan", cmd_plan, "print the memory plan for a model and a RAM budget"},
    {"tokenize", cmd_tokenize, "text to ids (or --decode ids to text) with a tiktoken vocab"},
    {NULL, NULL, NULL}};

static void help(FILE *f) {
    fprintf(f, "strata %s: Kimi K3 inference within a RAM budget\n\n"
               "usage: strata COMMAND [ARGS]   (strata COMMAND --help for each)\n\ncommands:\n",
            STRATA_VERSION);
    for (const command *c = k_cmds; c->name; c++) fprintf(f, "  %-10s %s\n", c->name, c->summary);
    fprintf(f, "  %-10s %s\n  %-10s %s\n", "help", "this list", "version", "print the version");
}

int main(int argc, char **argv) {
    if (argc < 2) { help(stderr); return EXIT_USAGE; }
    const char *name = argv[1];
    if (!strcmp(name, "help") || cli_is_help(name)) {
        if (argc > 2 && strcmp(argv[2], "help"))
            for (const command *c = k_cmds; c->name; c++)
                if (!strcmp(c->name, argv[2])) {
                    char *av[] = {argv[2], "--help", NULL};
                    return c->fn(2, av);
                }
        help(stdout);
        return 0;
    }
    if (!strcmp(name, "version") || !strcmp(name, "--version")) { printf("strata %s\n", STRATA_VERSION); return 0; }
    for (const command *c = k_cmds; c->name; c++)
        if (!strcmp(c->name, name)) return c->fn(argc - 1, argv + 1);
    fprintf(stderr, "strata: unknown command '%s'\n\n", name);
    help(stderr);
    return EXIT_USAGE;
}
