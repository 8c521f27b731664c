/*
 * main.c: the `strata` binary: a table of subcommands. Each lives in
 * app/cmd_<name>.c as int cmd_<name>(argc, argv) with argv[0] the subcommand.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "cli.h"
#include "strata.h"

typedef struct {
    const char *name;
    int (*fn)(int, char **);
    const char *summary;
} command;

static const command k_cmds[] = {
    {"run", cmd_run, "generate from a model directory (ids or text prompt)"},
    {"chat", cmd_chat, "interactive chat with retained state (the model's chat format)"},
    {"serve", cmd_serve, "OpenAI-compatible HTTP server, all requests in one weight pass"},
    {"inspect", cmd_inspect, "check a model directory or config and print its census"},
    {"gen-model", cmd_gen_model, "write a model with random weights in a published layout (presets)"},
    {"pack", cmd_pack, "repack a model into the streaming layout (trunk file + manifest)"},
    {"plan", cmd_plan, "print the memory plan for a model and a RAM budget"},
    {"tokenize", cmd_tokenize, "text to ids (or --decode ids to text) with the model's tokenizer"},
    {NULL, NULL, NULL}};

static void help(FILE *f) {
    fprintf(f, "strata %s: Kimi K3, Kimi Linear, Kimi K2 and DeepSeek-V3 inference within a RAM budget\n\n"
               "usage: strata COMMAND [ARGS]   (strata COMMAND --help for each)\n\ncommands:\n",
            STRATA_VERSION);
    for (const command *c = k_cmds; c->name; c++) fprintf(f, "  %-10s %s\n", c->name, c->summary);
    fprintf(f, "  %-10s %s\n  %-10s %s\n", "help", "this list", "version", "print the version");
    fprintf(f, "\nenvironment (tests and development only):\n"
               "  STRATA_FAULT=KIND:N     the Nth file call (open, read, write, fsync, rename, io_uring\n"
               "                          completion; all threads, from start) fails once: eio, enospc\n"
               "                          (calls that may allocate disk), short (half a read/write),\n"
               "                          eintr (retried); count:0 only counts. A line on stderr at exit\n"
               "                          gives the calls, the allocations and what was injected\n"
               "  STRATA_FAIL_ALLOC=N     the Nth allocation through the engine's allocator fails\n"
               "  STRATA_KERNEL=ISA       force a kernel table (scalar, avx2, avx512, avx512vbmi, neon)\n");
#ifdef STRATA_MPI
    fprintf(f, "\nstrata-mpi: run under mpirun; rank 0 runs the command, the other ranks hold layers of\n"
               "its model within their own --ram-gb (docs/cluster.md).\n"
               "  STRATA_MPI_TIMEOUT=S       seconds without a heartbeat before a rank is lost (default 5)\n"
               "  STRATA_MPI_STEP_DELAY_MS=N tests: rank 0 waits N ms before each pass\n"
               "  STRATA_MPI_FAKE_VERSION=V  tests: this rank claims version V at start-up\n");
#endif
}

/* Test hooks, read once before any command runs (strata_faults_from_env). */
static void fault_report(void) { strata_fault_report(stderr); }

static int fault_setup(void) {
    char err[512];
    int rc = strata_faults_from_env(err, sizeof err);
    atexit(fault_report); /* prints only once a valid STRATA_FAULT was armed */
    if (rc) fprintf(stderr, "strata: %s\n", err);
    return rc ? -1 : 0;
}

/* stdout through a cookie stream that remembers why a write to fd 1 failed: a
 * full disk or /dev/full used to give exit 0 with the output lost (stdio keeps
 * only an error flag, and the errno is gone by the end). */
static int g_out_errno;

static ssize_t out_write(void *cookie, const char *buf, size_t n) {
    (void)cookie;
    size_t done = 0;
    while (done < n) {
        ssize_t w = write(1, buf + done, n - done);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
            if (!g_out_errno) g_out_errno = w < 0 ? errno : ENOSPC;
            return -1;
        }
        done += (size_t)w;
    }
    return (ssize_t)n;
}

/* The command's status, made 1 when its output did not all reach stdout. */
static int finish_stdout(FILE *orig, int rc) {
    int bad = fflush(stdout) != 0;
    bad |= ferror(stdout) != 0;
    if (stdout != orig) {
        bad |= fclose(stdout) != 0;
        stdout = orig;
    }
    if (!bad) return rc;
    fprintf(stderr, "strata: writing to stdout failed: %s\n", strerror(g_out_errno ? g_out_errno : EIO));
    return rc ? rc : 1;
}

static int dispatch(int argc, char **argv) {
    if (argc < 2) { help(stderr); return EXIT_USAGE; }
    if (fault_setup()) return EXIT_USAGE;
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
    if (!strcmp(name, "version") || !strcmp(name, "--version")) {
        printf("strata %s\n", STRATA_VERSION);
        return 0;
    }
    for (const command *c = k_cmds; c->name; c++)
        if (!strcmp(c->name, name)) return c->fn(argc - 1, argv + 1);
    fprintf(stderr, "strata: unknown command '%s'\n\n", name);
    help(stderr);
    return EXIT_USAGE;
}

static int strata_main(int argc, char **argv) {
    strata_tmp_cleanup_on_signals(); /* Ctrl-C leaves no temporary files (where nothing else handles it) */
    FILE *orig = stdout;
    cookie_io_functions_t io = {.write = out_write};
    FILE *f = fopencookie(NULL, "w", io);
    if (f) {
        fflush(orig);
        setvbuf(f, NULL, isatty(1) ? _IOLBF : _IOFBF, BUFSIZ);
        stdout = f;
    }
    return finish_stdout(orig, dispatch(argc, argv));
}

#ifndef STRATA_MPI
int main(int argc, char **argv) { return strata_main(argc, argv); }
#else
/* strata-mpi: the same commands on rank 0; the other ranks serve its model
 * (include/strata_mpi.h). Every rank runs this same binary under mpirun. */
#include <signal.h>
#include <unistd.h>
#include "model_open.h"
#include "strata_mpi.h"

/* mpirun stops the whole job when a rank dies: SIGCONT, 1 s later SIGTERM, then
 * SIGKILL within milliseconds (Open MPI 4.1). SIGCONT starts the cluster's quick
 * check, which names the dead rank within that second; the SIGTERM note is the
 * fallback (it loses the race with SIGKILL when the machine is busy). */
static strata_cluster *g_cluster; /* for the handlers; set once before they are installed */

static void on_sigcont(int sig) {
    (void)sig;
    strata_mpi_quick_check(g_cluster);
}

/* Say so on rank 0, whose output would otherwise just end. */
static void on_sigterm(int sig) {
    static const char m[] = "strata: rank 0: stopped by the MPI runtime: a rank of the job ended or the job was interrupted "
                            "(mpirun's message names it); any output above is incomplete\n";
    if (!strata_mpi_broken(g_cluster)) { /* else the error naming the rank is out already */
        ssize_t w = write(2, m, sizeof m - 1);
        (void)w;
    }
    _exit(128 + sig);
}

int main(int argc, char **argv) {
    char err[2048];
    strata_cluster *cl = NULL;
    if (strata_mpi_init(&argc, &argv, &cl, err, sizeof err)) {
        if (strata_mpi_rank(cl) == 0) fprintf(stderr, "strata: %s\n", err);
        strata_mpi_finalize(cl, 1);
        return 1;
    }
    int rc;
    if (strata_mpi_rank(cl) > 0) {
        rc = strata_mpi_work(cl, err, sizeof err) ? 1 : 0;
        if (rc) fprintf(stderr, "strata: rank %d: %s\n", strata_mpi_rank(cl), err);
    } else {
        g_cluster = cl; /* before either handler can run */
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_flags = SA_RESTART;
        sigemptyset(&sa.sa_mask);
        sa.sa_handler = on_sigterm;
        sigaction(SIGTERM, &sa, NULL);
        sa.sa_handler = on_sigcont;
        sigaction(SIGCONT, &sa, NULL);
        mo_cluster = (mo_cluster_hooks){cl, strata_mpi_print_stages, strata_mpi_print_report, strata_mpi_measure_net,
                                        strata_mpi_size(cl)};
        rc = strata_main(argc, argv);
    }
    strata_mpi_finalize(cl, rc != 0);
    return rc;
}
#endif
