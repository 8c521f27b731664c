/* cli.c: helpers shared by the subcommands (see cli.h). */
#include "cli.h"

#include <stdarg.h>
#include <string.h>

const char *cli_need_arg(int argc, char **argv, int *i, const char *cmd) {
    if (*i + 1 >= argc) {
        cli_usage_error(cmd, "option %s needs a value", argv[*i]);
        return NULL;
    }
    return argv[++*i];
}

int cli_usage_error(const char *cmd, const char *fmt, ...) {
    va_list ap;
    fprintf(stderr, "strata %s: ", cmd);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\nTry 'strata %s --help'.\n", cmd);
    return EXIT_USAGE;
}

int cli_is_help(const char *a) { return !strcmp(a, "--help") || !strcmp(a, "-h"); }
