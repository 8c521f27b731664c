/*
 * cmd_serve.c: `strata serve MODEL_DIR`: an OpenAI-compatible HTTP server that
 * steps every user's sequence in one weight pass (src/serve/: request parsing,
 * the engine thread, HTTP, metrics).
 *
 * Start-up order: open the model (config, headers, tokenizer; no weights), open
 * the server's own tokenizer (templates and detokenizing happen on HTTP threads
 * and the engine thread, never through the single-caller model), listen (GET
 * /health answers 503 while loading), then the engine thread loads the weights
 * for --parallel sequences. SIGTERM/SIGINT: stop accepting, let running and queued
 * requests finish for up to --grace seconds, cancel the rest, exit 0.
 */
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include "chat.h"
#include "cli.h"
#include "jsonx.h"
#include "model_open.h"
#include "serve/http.h"
#include "serve/metrics.h"
#include "serve/sched.h"
#include "strata.h"
#include "tok.h"

#define CMD "serve"
#define SERVE_DEFAULT_CTX 4096

static void usage(FILE *f) {
    fprintf(f,
        "usage: strata serve MODEL_DIR [options]\n"
        "\n"
        "OpenAI-compatible HTTP server: POST /v1/chat/completions, /v1/completions,\n"
        "/tokenize, /detokenize; GET /v1/models, /health, /metrics, / (a chat page).\n"
        "Every running request advances in the same engine step (one weight pass).\n"
        "\n"
        "  --host ADDR          numeric address to listen on (default 127.0.0.1)\n"
        "  --port N             TCP port (default 8080; 0 = any free port, printed)\n"
        "  --parallel N         sequences generated together (default 4)\n"
        "  --queue N            requests waiting for a sequence; beyond: 429 (default 64)\n"
        "  --ctx N              positions per sequence: prompt + reply (default min(model, %d))\n"
        "  --api-key KEY        require Authorization: Bearer KEY (not for /health, /metrics, /)\n"
        "  --api-key-file F     the same, the key read from the first line of F\n"
        "  --max-body SIZE      largest request body (default 1M)\n"
        "  --timeout S          idle / slow-request timeout in seconds (default 30)\n"
        "  --grace S            on SIGTERM, seconds to let requests finish (default 10)\n"
        MO_USAGE
        "\n"
        "Environment (tests only): STRATA_SERVE_STEP_MS=N sleeps N ms before each step.\n",
        SERVE_DEFAULT_CTX);
}

typedef struct serve_opts {
    const char *model_dir, *host, *api_key, *api_key_file;
    int64_t port, parallel, queue, ctx, timeout, grace;
    uint64_t max_body;
    mo_opts mo;
} serve_opts;

static int parse_args(int argc, char **argv, serve_opts *o) {
    memset(o, 0, sizeof *o);
    o->host = "127.0.0.1";
    o->port = 8080;
    o->parallel = 4;
    o->queue = 64;
    o->timeout = 30;
    o->grace = 10;
    o->max_body = 1 << 20;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        int f = mo_flag(argc, argv, &i, CMD, &o->mo);
        if (f == EXIT_USAGE) return f;
        if (f == 0) continue;
#define NEED() do { if (!(v = cli_need_arg(argc, argv, &i, CMD))) return EXIT_USAGE; } while (0)
#define BAD(what) return cli_usage_error(CMD, "bad value for %s: '%s' (%s)", a, v, what)
        if (!strcmp(a, "--host")) { NEED(); o->host = v; }
        else if (!strcmp(a, "--port")) { NEED(); if (base_parse_i64(v, 0, 65535, &o->port)) BAD("0..65535"); }
        else if (!strcmp(a, "--parallel")) { NEED(); if (base_parse_i64(v, 1, 256, &o->parallel)) BAD("1..256"); }
        else if (!strcmp(a, "--queue")) { NEED(); if (base_parse_i64(v, 0, 1 << 16, &o->queue)) BAD("0..65536"); }
        else if (!strcmp(a, "--ctx")) { NEED(); if (base_parse_i64(v, 2, (int64_t)1 << 32, &o->ctx)) BAD("an integer >= 2"); }
        else if (!strcmp(a, "--api-key")) { NEED(); if (!*v) BAD("not empty"); o->api_key = v; }
        else if (!strcmp(a, "--api-key-file")) { NEED(); o->api_key_file = v; }
        else if (!strcmp(a, "--max-body")) { NEED(); if (base_parse_size(v, &o->max_body) || o->max_body < 64 || o->max_body > ((uint64_t)1 << 30)) BAD("64 B .. 1G"); }
        else if (!strcmp(a, "--timeout")) { NEED(); if (base_parse_i64(v, 1, 86400, &o->timeout)) BAD("1..86400 seconds"); }
        else if (!strcmp(a, "--grace")) { NEED(); if (base_parse_i64(v, 0, 86400, &o->grace)) BAD("0..86400 seconds"); }
        else if (a[0] == '-' && a[1]) return cli_usage_error(CMD, "unknown option '%s'", a);
        else if (!o->model_dir) o->model_dir = a;
        else return cli_usage_error(CMD, "unexpected argument '%s'", a);
#undef NEED
#undef BAD
    }
    if (!o->model_dir) return cli_usage_error(CMD, "missing MODEL_DIR");
    if (o->api_key && o->api_key_file) return cli_usage_error(CMD, "--api-key and --api-key-file are exclusive");
    return 0;
}

/* The first line of path, without its newline, in key (cap bytes). */
static int read_key_file(const char *path, char *key, size_t cap) {
    uint8_t *buf;
    size_t len;
    char err[512];
    if (base_read_file(path, 1 << 16, &buf, &len, err, sizeof err)) {
        fprintf(stderr, "strata serve: --api-key-file: %s\n", err);
        return -1;
    }
    size_t n = 0;
    while (n < len && buf[n] != '\n' && buf[n] != '\r') n++;
    if (n == 0 || n >= cap) {
        fprintf(stderr, "strata serve: --api-key-file %s: the first line must hold the key (1..%zu bytes)\n", path, cap - 1);
        base_free(buf);
        return -1;
    }
    memcpy(key, buf, n);
    key[n] = 0;
    base_free(buf);
    return 0;
}

/* The model's name for clients: the directory's base name. */
static void model_name(const char *dir, char *out, size_t cap) {
    size_t len = strlen(dir);
    while (len > 1 && dir[len - 1] == '/') len--;
    size_t b = len;
    while (b > 0 && dir[b - 1] != '/') b--;
    snprintf(out, cap, "%.*s", (int)(len - b), dir + b);
}

int cmd_serve(int argc, char **argv) {
    for (int i = 1; i < argc; i++)
        if (cli_is_help(argv[i])) { usage(stdout); return 0; }
    serve_opts o;
    int rc = parse_args(argc, argv, &o);
    if (rc) return rc;
    char key[1024], name[256], err[4096], path[4096], tc[4096];
    const char *api_key = o.api_key;
    if (o.api_key_file) {
        if (read_key_file(o.api_key_file, key, sizeof key)) return EXIT_USAGE;
        api_key = key;
    }
    model_name(o.model_dir, name, sizeof name);
    /* jansson's allocator is set once, before any thread builds JSON */
    json_decref(jsonx_load((const uint8_t *)"{}", 2, "init", NULL, 0));

    int ret = 1;
    mo_model m;
    tok *tk = NULL;
    metrics *mt = NULL;
    sched *s = NULL;
    http_server *h = NULL;
    memset(&m, 0, sizeof m);
    if (mo_open(&m, CMD, o.model_dir)) goto out;
    snprintf(path, sizeof path, "%s/tiktoken.model", o.model_dir);
    snprintf(tc, sizeof tc, "%s/tokenizer_config.json", o.model_dir);
    if (tok_open(&tk, path, tc, TOK_PAT_KIMI, err, sizeof err)) { fprintf(stderr, "strata serve: %s\n", err); goto out; }
    chat_ids ci;
    if (chat_ids_init(&ci, tk, err, sizeof err)) { fprintf(stderr, "strata serve: %s\n", err); goto out; }
    const int64_t mctx = m.info.model_max_ctx;
    if (o.ctx > mctx)
        fprintf(stderr, "strata serve: note: --ctx %lld is above the model's maximum of %lld positions\n", (long long)o.ctx, (long long)mctx);
    const int64_t ctx = o.ctx ? o.ctx : (mctx < SERVE_DEFAULT_CTX ? mctx : SERVE_DEFAULT_CTX);
    if (o.mo.plan_only) {
        rc = mo_place(&m, &o.mo, ctx, (int)o.parallel);
        ret = rc == MO_PLANNED ? 0 : rc;
        goto out;
    }
    strata_model_opts so = strata_model_opts_default();
    so.ram_bytes = o.mo.have_ram ? o.mo.ram_bytes : 0;
    so.pack_dir = o.mo.pack_dir;
    so.ctx = ctx;
    so.max_seqs = (int)o.parallel;
    so.n_threads = (int)o.mo.threads;
    so.no_verify = o.mo.no_verify;
    so.cluster = mo_cluster.cl;
    sched_opts sopt = {(int)o.parallel, (int)o.queue, 0};
    const char *delay = getenv("STRATA_SERVE_STEP_MS");
    int64_t d;
    if (delay && !base_parse_i64(delay, 0, 10000, &d)) sopt.step_delay_ms = (int)d;

    /* signals go to the main thread only (sigtimedwait below) */
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGTERM);
    sigaddset(&sigs, SIGINT);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    signal(SIGPIPE, SIG_IGN);

    if (!(mt = metrics_create())) { fprintf(stderr, "strata serve: out of memory\n"); goto out; }
    if (sched_create(&s, m.m, &so, tk, &sopt, mt, err, sizeof err)) { fprintf(stderr, "strata serve: %s\n", err); goto out; }
    http_cfg hc = {o.host, (int)o.port, api_key, name, (size_t)o.max_body, (int)o.timeout,
                   (int)(o.parallel + o.queue + 16), ctx, m.info.vocab};
    if (http_start(&h, &hc, s, tk, mt, err, sizeof err)) { fprintf(stderr, "strata serve: %s\n", err); ret = EXIT_USAGE; goto out; }
    fprintf(stderr, "strata serve: listening on http://%s%s%s:%d (model '%s'; loading)\n", strchr(o.host, ':') ? "[" : "", o.host,
            strchr(o.host, ':') ? "]" : "", http_port(h), name);
    if (sched_start(s, err, sizeof err)) { fprintf(stderr, "strata serve: %s\n", err); goto out; }
    int ready = 0;
    for (;;) {
        struct timespec ts = {0, 200 * 1000000L};
        int sig = sigtimedwait(&sigs, NULL, &ts);
        if (sig == SIGTERM || sig == SIGINT) {
            fprintf(stderr, "strata serve: %s: draining (up to %lld s)\n", sig == SIGTERM ? "SIGTERM" : "SIGINT", (long long)o.grace);
            break;
        }
        const int st = sched_state(s);
        if (st < 0) {
            fprintf(stderr, "strata serve: %s\n", sched_load_error(s));
            goto out;
        }
        if (st == 1 && !ready) {
            ready = 1;
            const strata_model_info *i = sched_info(s);
            fprintf(stderr, "strata serve: ready: %lld layers, vocab %lld, %d threads, kernels %s, %d sequences x ctx %lld, "
                            "weights %s (%.2f s)\n",
                    (long long)i->n_layers, (long long)i->vocab, i->n_threads, i->kernel, i->max_seqs, (long long)i->ctx,
                    i->placement, i->load_s);
            if (mo_cluster.print_stages) mo_cluster.print_stages(mo_cluster.cl, stderr); /* reads no MPI */
        }
    }
    http_quiesce(h);
    sched_shutdown(s, (double)o.grace);
    ret = 0;
out:
    if (s) sched_shutdown(s, 0);
    http_stop(h);
    sched_free(s);
    metrics_free(mt);
    tok_close(tk);
    mo_close(&m);
    if (ret == 0) fprintf(stderr, "strata serve: stopped\n");
    return ret;
}
