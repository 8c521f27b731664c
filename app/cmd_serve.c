/*
 * cmd_serve.c: `strata serve MODEL_DIR`: an OpenAI-compatible HTTP server that
 * steps every user's sequence in one weight pass (include/strata_serve.h; the
 * server is src/serve/).
 *
 * Start-up order: open the model (config, headers, tokenizer; no weights), open
 * the server's own tokenizer (templates and detokenizing happen on HTTP threads
 * and the engine thread, never through the single-caller model), then
 * strata_serve_run: listen (GET /health answers 503 while loading) while the
 * engine thread loads the weights for --parallel sequences. SIGTERM/SIGINT: stop
 * accepting, let running and queued requests finish for up to --grace seconds,
 * cancel the rest, exit 0.
 */
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <jansson.h>
#include "cli.h"
#include "model_open.h"
#include "strata.h"
#include "strata_serve.h"

#define CMD "serve"
#define SERVE_DEFAULT_CTX 4096

static void usage(FILE *f) {
    fprintf(f,
        "usage: strata serve MODEL_DIR [options]\n"
        "\n"
        "OpenAI-compatible HTTP server: POST /v1/chat/completions, /v1/completions,\n"
        "/v1/messages (Anthropic), /tokenize, /detokenize; GET /v1/models, /slots,\n"
        "/health, /metrics, / (a chat page).\n"
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
        "  --timeout S          seconds a connection may stay silent (default 30)\n"
        "  --request-timeout S  seconds a request's headers and body may take to arrive, however\n"
        "                       they trickle in; past it: 408 and the connection closes (default 60)\n"
        "  --max-conns N        connections served at once (default parallel + queue + 128); a new\n"
        "                       one beyond it replaces the oldest connection still sending its\n"
        "                       request (503), a request beyond it gets 503; GET /health and\n"
        "                       /metrics have 64 more\n"
        "  --max-conns-per-addr N  connections one client address may hold while they send\n"
        "                       their requests; a new one replaces its oldest (503) (default 32)\n"
        "  --grace S            on SIGTERM, seconds to let requests finish (default 10)\n"
        "  --prefix-gb X|auto   RAM for prefix snapshots (a request extending an earlier prompt\n"
        "                       evaluates only its new tokens), inside the budget (default auto:\n"
        "                       two sequences' state; with --ram-gb at most a quarter of the\n"
        "                       budget's headroom, and none with --cache-dir; 0 = none in RAM)\n"
        "  --cache-dir DIR      also keep snapshots as files in DIR: written when they leave RAM,\n"
        "                       read back on a match, kept across restarts (default: none)\n"
        "  --cache-dir-gb X     bound on the snapshot files in DIR (default 8)\n"
        "  --prefix-every N     prompt positions between snapshots (default 256)\n"
        "  --no-prefix          no prefix reuse\n"
        "  --alias NAME         another model id requests may name and /v1/models lists;\n"
        "                       repeatable; the first is the id answers carry (default: the\n"
        "                       directory's name, which is always served)\n"
        "  --cors ORIGIN        answer CORS preflights and let pages from ORIGIN (or *) read\n"
        "                       answers; without it POSTs not declared JSON are refused (415)\n"
        "  --progress-interval S  while a prompt is evaluated, a streaming request gets an SSE\n"
        "                       comment ': prefill DONE/TOTAL' every S seconds (default 5; 0 off)\n"
        "  --spec K             speculative decoding for every request: up to K tokens drafted\n"
        "                       from the text's own n-grams, verified in the same step as the\n"
        "                       other sequences' rows; output identical (default 0: off)\n"
        "  --draft ngram|mtp    with --spec: the drafts' source, the text's n-grams (default) or the\n"
        "                       model's multi-token-prediction layer (DeepSeek-V3)\n",
        SERVE_DEFAULT_CTX);
    opts_help(f, OPT_SERVE, OPT_HELP_PLACE);
    fputs("\n"
          "Environment (tests only): STRATA_SERVE_STEP_MS=N sleeps N ms before each step.\n", f);
}

typedef struct serve_opts {
    const char *model_dir, *host, *api_key, *api_key_file;
    int64_t port, parallel, queue, timeout, grace, prefix_every;
    int64_t request_timeout, max_conns, max_conns_per_addr; /* max_conns 0: parallel + queue + 128 */
    uint64_t max_body;
    double prefix_gb, cache_dir_gb; /* prefix_gb < 0: auto */
    const char *cache_dir;
    int no_prefix;
    const char *aliases[16];
    int n_aliases;
    const char *cors;
    double progress_s;
    app_opts ao;              /* the shared flags (opts.h) */
} serve_opts;

static int nonempty_flag(void *field, const char *v) { return *v ? (*(const char **)field = v, 0) : 1; }
static int max_body_flag(void *field, const char *v) {
    uint64_t *b = field;
    return strata_parse_size(v, b) || *b < 64 || *b > ((uint64_t)1 << 30);
}
static int alias_flag(void *field, const char *v) {
    serve_opts *o = (serve_opts *)((char *)field - offsetof(serve_opts, aliases));
    if (!*v || o->n_aliases >= 16) return 1;
    o->aliases[o->n_aliases++] = v;
    return 0;
}
static int prefix_gb_flag(void *field, const char *v) {
    if (!strcmp(v, "auto")) { *(double *)field = -1; return 0; }
    return strata_parse_f64(v, 0, 1e6, field);
}

#define S(field) offsetof(serve_opts, field)
static const opt_row k_serve_flags[] = {
    {.flag = "--host", .kind = OPT_STR, .off = S(host)},
    {.flag = "--port", .kind = OPT_I64, .off = S(port), .ilo = 0, .ihi = 65535, .what = "0..65535"},
    {.flag = "--parallel", .kind = OPT_I64, .off = S(parallel), .ilo = 1, .ihi = 256, .what = "1..256"},
    {.flag = "--queue", .kind = OPT_I64, .off = S(queue), .ilo = 0, .ihi = 1 << 16, .what = "0..65536"},
    {.flag = "--api-key", .kind = OPT_FN, .off = S(api_key), .fn = nonempty_flag, .what = "not empty"},
    {.flag = "--api-key-file", .kind = OPT_STR, .off = S(api_key_file)},
    {.flag = "--max-body", .kind = OPT_FN, .off = S(max_body), .fn = max_body_flag, .what = "64 B .. 1G"},
    {.flag = "--timeout", .kind = OPT_I64, .off = S(timeout), .ilo = 1, .ihi = 86400, .what = "1..86400 seconds"},
    {.flag = "--request-timeout", .kind = OPT_I64, .off = S(request_timeout), .ilo = 1, .ihi = 86400, .what = "1..86400 seconds"},
    {.flag = "--max-conns", .kind = OPT_I64, .off = S(max_conns), .ilo = 1, .ihi = 4096, .what = "1..4096"},
    {.flag = "--max-conns-per-addr", .kind = OPT_I64, .off = S(max_conns_per_addr), .ilo = 1, .ihi = 4096, .what = "1..4096"},
    {.flag = "--grace", .kind = OPT_I64, .off = S(grace), .ilo = 0, .ihi = 86400, .what = "0..86400 seconds"},
    {.flag = "--prefix-gb", .kind = OPT_FN, .off = S(prefix_gb), .fn = prefix_gb_flag, .what = "GB >= 0, or auto"},
    {.flag = "--cache-dir", .kind = OPT_FN, .off = S(cache_dir), .fn = nonempty_flag, .what = "a directory"},
    {.flag = "--cache-dir-gb", .kind = OPT_F64, .off = S(cache_dir_gb), .flo = 0.001, .fhi = 1e6, .what = "GB > 0"},
    {.flag = "--prefix-every", .kind = OPT_I64, .off = S(prefix_every), .ilo = 1, .ihi = (int64_t)1 << 32, .what = "an integer >= 1"},
    {.flag = "--no-prefix", .kind = OPT_FLAG, .off = S(no_prefix)},
    {.flag = "--alias", .kind = OPT_FN, .off = S(aliases), .fn = alias_flag, .what = "a name (at most 16)"},
    {.flag = "--cors", .kind = OPT_FN, .off = S(cors), .fn = nonempty_flag, .what = "an origin, or *"},
    {.flag = "--progress-interval", .kind = OPT_F64, .off = S(progress_s), .flo = 0, .fhi = 3600, .what = "0..3600 seconds"},
};
#undef S

static int parse_args(int argc, char **argv, serve_opts *o) {
    memset(o, 0, sizeof *o);
    opts_init(&o->ao, OPT_SERVE, 0);
    o->host = "127.0.0.1";
    o->port = 8080;
    o->parallel = 4;
    o->queue = 64;
    o->timeout = 30;
    o->request_timeout = 60;
    o->max_conns_per_addr = 32;
    o->grace = 10;
    o->max_body = 1 << 20;
    o->prefix_gb = -1;
    o->cache_dir_gb = 8;
    o->progress_s = 5;
    int rc = opts_parse(argc, argv, &o->ao, usage, k_serve_flags, sizeof k_serve_flags / sizeof *k_serve_flags, o, &o->model_dir);
    if (rc) return rc;
    if (o->api_key && o->api_key_file) return cli_usage_error(CMD, "--api-key and --api-key-file are exclusive");
    if (o->no_prefix && o->cache_dir) return cli_usage_error(CMD, "--no-prefix and --cache-dir are exclusive");
    return 0;
}

/* The first line of path, without its newline, in key (cap bytes). */
static int read_key_file(const char *path, char *key, size_t cap) {
    uint8_t *buf;
    size_t len;
    char err[512];
    if (strata_read_file(path, 1 << 16, &buf, &len, err, sizeof err)) {
        fprintf(stderr, "strata serve: --api-key-file: %s\n", err);
        return -1;
    }
    size_t n = 0;
    while (n < len && buf[n] != '\n' && buf[n] != '\r') n++;
    if (n == 0 || n >= cap) {
        fprintf(stderr, "strata serve: --api-key-file %s: the first line must hold the key (1..%zu bytes)\n", path, cap - 1);
        strata_free(buf);
        return -1;
    }
    memcpy(key, buf, n);
    key[n] = 0;
    strata_free(buf);
    return 0;
}

/* The model's name for clients: the base name of the directory, resolved
 * (`strata serve .` is named after the current directory, not "."). */
static void model_name(const char *dir_in, char *out, size_t cap) {
    char *real = realpath(dir_in, NULL);
    const char *dir = real ? real : dir_in;
    size_t len = strlen(dir);
    while (len > 1 && dir[len - 1] == '/') len--;
    size_t b = len;
    while (b > 0 && dir[b - 1] != '/') b--;
    snprintf(out, cap, "%.*s", (int)(len - b), dir + b);
    free(real); /* from libc's malloc */
}

/* Sampling defaults of requests that set none: generation_config.json's
 * temperature and top_p when the model has one (else greedy, top_p 1). */
static int gen_config(const char *dir, strata_serve_opts *sv) {
    char path[4096], err[512];
    snprintf(path, sizeof path, "%s/generation_config.json", dir);
    if (!strata_is_file(path)) return 0;
    uint8_t *buf;
    size_t len;
    struct json_t *j = NULL;
    int rc = strata_read_file(path, 1 << 20, &buf, &len, err, sizeof err);
    if (!rc) {
        rc = strata_json_parse(&j, buf, len, path, err, sizeof err);
        strata_free(buf);
    }
    double t = -1, p = -1;
    if (!rc && j) {
        strata_json_num(json_object_get(j, "temperature"), &t);
        strata_json_num(json_object_get(j, "top_p"), &p);
        json_decref(j);
    }
    if (rc) { fprintf(stderr, "strata serve: %s\n", err); return -1; }
    if (t >= 0 && strata_param_check(STRATA_PARAM_TEMP, t, err, sizeof err) == 0) sv->default_temp = t;
    if (p > 0 && strata_param_check(STRATA_PARAM_TOP_P, p, err, sizeof err) == 0) sv->default_top_p = p;
    return 0;
}

int cmd_serve(int argc, char **argv) {
    serve_opts o;
    int rc = parse_args(argc, argv, &o);
    if (rc) return rc == OPTS_HELP ? 0 : rc;
    char key[1024], name[256], err[4096];
    const char *api_key = o.api_key;
    if (o.api_key_file) {
        if (read_key_file(o.api_key_file, key, sizeof key)) return EXIT_USAGE;
        api_key = key;
    }
    model_name(o.model_dir, name, sizeof name);
    int ret = 1;
    mo_model m;
    strata_tokenizer *tk = NULL;
    memset(&m, 0, sizeof m);
    if (mo_open(&m, CMD, o.model_dir)) goto out;
    if (strata_tokenizer_open_dir(&tk, o.model_dir, err, sizeof err)) { fprintf(stderr, "strata serve: %s\n", err); goto out; }
    strata_chat_ids ci;
    if (strata_chat_ids_get(tk, &ci, err, sizeof err)) { fprintf(stderr, "strata serve: %s\n", err); goto out; }
    fprintf(stderr, "strata serve: chat format %s (from the tokenizer)\n", strata_chat_fmt_name(ci.fmt));
    const int64_t mctx = m.info.model_max_ctx;
    if (o.ao.ctx > mctx)
        fprintf(stderr, "strata serve: note: --ctx %lld is above the model's maximum of %lld positions\n", (long long)o.ao.ctx, (long long)mctx);
    const int64_t ctx = o.ao.ctx ? o.ao.ctx : (mctx < SERVE_DEFAULT_CTX ? mctx : SERVE_DEFAULT_CTX);
    if (!o.no_prefix) {
        o.ao.prefix_ram = o.prefix_gb < 0 ? STRATA_PREFIX_AUTO : (uint64_t)(o.prefix_gb * 1e9);
        o.ao.prefix_dir = o.cache_dir;
        o.ao.prefix_dir_bytes = (uint64_t)(o.cache_dir_gb * 1e9);
        o.ao.prefix_every = o.prefix_every;
    }
    /* another server on this --cache-dir: refused before listening (the load
     * takes the directory's lock; this check only makes the refusal early) */
    if (o.cache_dir && !o.ao.plan_only && strata_prefix_dir_check(o.cache_dir, err, sizeof err)) {
        fprintf(stderr, "strata serve: --cache-dir: %s\n", err);
        ret = EXIT_USAGE;
        goto out;
    }
    if (o.ao.plan_only) {
        rc = mo_place(&m, &o.ao, ctx, (int)o.parallel);
        ret = rc == MO_PLANNED ? 0 : rc;
        goto out;
    }
    strata_model_opts so;
    opts_model(&o.ao, ctx, (int)o.parallel, &so);
    strata_serve_opts sv = strata_serve_opts_default();
    sv.host = o.host;
    sv.port = (int)o.port;
    sv.api_key = api_key;
    sv.model_name = name;
    sv.max_body = (size_t)o.max_body;
    sv.timeout_s = (int)o.timeout;
    sv.request_timeout_s = (int)o.request_timeout;
    sv.max_conns = (int)(o.max_conns ? o.max_conns : o.parallel + o.queue + 128);
    sv.max_conns_per_addr = (int)o.max_conns_per_addr;
    sv.parallel = (int)o.parallel;
    sv.queue = (int)o.queue;
    sv.spec = (int)o.ao.spec;
    sv.mtp_draft = o.ao.mtp;
    sv.ctx = ctx;
    sv.grace_s = (double)o.grace;
    sv.cache_dir = o.cache_dir;
    sv.aliases = o.aliases;
    sv.n_aliases = o.n_aliases;
    sv.cors = o.cors;
    sv.progress_s = o.progress_s;
    if (gen_config(o.model_dir, &sv)) goto out;
    sv.print_stages = mo_cluster.print_stages;
    const char *delay = getenv("STRATA_SERVE_STEP_MS");
    int64_t d;
    if (delay && !strata_parse_i64(delay, 0, 10000, &d)) sv.step_delay_ms = (int)d;
    int refused;
    rc = strata_serve_run(m.m, &so, tk, &sv, &refused);
    ret = rc ? (refused ? EXIT_USAGE : 1) : 0;
out:
    strata_tokenizer_close(tk);
    mo_close(&m);
    if (ret == 0 && !o.ao.plan_only) fprintf(stderr, "strata serve: stopped\n");
    return ret;
}
