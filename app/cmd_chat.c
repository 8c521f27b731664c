/* cmd_chat.c: placeholder until the module lands. */
#include "cli.h"

int cmd_chat(int argc, char **argv) {
    if (argc > 1 && cli_is_help(argv[1])) { printf("strata %s: not implemented yet\n", argv[0]); return 0; }
    fprintf(stderr, "strata %s: not implemented yet\n", argv[0]);
    return 1;
}
