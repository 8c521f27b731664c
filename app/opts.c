/*
 * opts.c: the CLI's option table (see opts.h).
 */
#include "opts.h"

#include <string.h>
#include "cli.h"

#define A(field) offsetof(app_opts, field)
#define PLACE (OPT_RUN | OPT_CHAT | OPT_SERVE)
#define ALL (PLACE | OPT_PLAN)
#define GEN (OPT_RUN | OPT_CHAT)

/* --router unbiased|hf (strata_model_opts.router). */
static int parse_router(void *field, const char *v) {
    if (!strcmp(v, "unbiased")) *(int *)field = STRATA_ROUTER_UNBIASED;
    else if (!strcmp(v, "hf")) *(int *)field = STRATA_ROUTER_HF;
    else return -1;
    return 0;
}

const opt_row opts_shared[] = {
    {.flag = "--threads", .kind = OPT_PARAM, .off = A(threads), .cmds = ALL, .param = STRATA_PARAM_THREADS, .help_in = PLACE, .group = OPT_HELP_PLACE,
     .help = "  --threads N          compute threads (default: physical cores)\n"},
    {.flag = "--ram-gb", .kind = OPT_RAM_GB, .cmds = ALL, .what = "a positive number of GB", .help_in = PLACE, .group = OPT_HELP_PLACE,
     .help = "  --ram-gb X           RAM budget in GB (10^9 B): weights beyond it are streamed\n"},
    {.flag = "--ram", .kind = OPT_RAM, .cmds = ALL, .what = "a size like 24G, or auto", .help_in = PLACE, .group = OPT_HELP_PLACE,
     .help = "  --ram SIZE|auto      budget as a size (24G = GiB) or auto = MemAvailable\n"},
    {.flag = "--pack", .kind = OPT_STR, .off = A(pack_dir), .cmds = ALL, .help_in = PLACE, .group = OPT_HELP_PLACE,
     .help = "  --pack DIR           read the trunk from this pack (default: the model's own)\n"},
    {.flag = "--no-verify", .kind = OPT_FLAG, .off = A(no_verify), .cmds = PLACE, .help_in = PLACE, .group = OPT_HELP_PLACE,
     .help = "  --no-verify          do not check pack reads against the manifest's checksums\n"},
    {.flag = "--no-prefetch", .kind = OPT_FLAG, .off = A(no_prefetch), .cmds = PLACE, .help_in = PLACE, .group = OPT_HELP_PLACE,
     .help = "  --no-prefetch        no expert reads a layer ahead of the router (same output)\n"},
    {.flag = "--router", .kind = OPT_FN, .off = A(router), .fn = parse_router, .cmds = PLACE, .what = "unbiased or hf", .help_in = PLACE,
     .group = OPT_HELP_PLACE,
     .help = "  --router unbiased|hf routed expert weights: unbiased sigmoid (default, as vLLM and\n"
             "                       llama.cpp) or hf (plus the score bias, as Kimi Linear's HF code)\n"},
    {.flag = "--no-preload", .kind = OPT_FLAG, .off = A(no_preload), .cmds = PLACE, .help_in = PLACE, .group = OPT_HELP_PLACE,
     .help = "  --no-preload         no warm start: the cache fills as experts are first used\n"},
    {.flag = "--plan", .kind = OPT_FLAG, .off = A(plan_only), .cmds = PLACE, .help_in = PLACE, .group = OPT_HELP_PLACE,
     .help = "  --plan               print the memory plan and exit\n"},
    {.flag = "--ctx", .kind = OPT_PARAM, .off = A(ctx), .cmds = ALL, .param = STRATA_PARAM_CTX},
    {.flag = "--chunk", .kind = OPT_PARAM, .off = A(chunk), .cmds = OPT_RUN | OPT_PLAN, .param = STRATA_PARAM_CHUNK},
    {.flag = "--gen", .kind = OPT_PARAM, .off = A(gen), .cmds = GEN, .param = STRATA_PARAM_GEN},
    {.flag = "--temp", .kind = OPT_PARAM, .off = A(go.temp), .cmds = GEN, .param = STRATA_PARAM_TEMP, .help_in = GEN, .group = OPT_HELP_GEN,
     .help = "  --temp T             temperature in [0, 2]; 0 = greedy, ties to the lowest id (default 0)\n"},
    {.flag = "--top-k", .kind = OPT_PARAM, .off = A(go.top_k), .cmds = GEN, .param = STRATA_PARAM_TOP_K, .help_in = GEN, .group = OPT_HELP_GEN,
     .help = "  --top-k K            keep the K most likely tokens (0 = off)\n"},
    {.flag = "--top-p", .kind = OPT_PARAM, .off = A(go.top_p), .cmds = GEN, .param = STRATA_PARAM_TOP_P, .help_in = GEN, .group = OPT_HELP_GEN,
     .help = "  --top-p P            nucleus sampling mass in (0, 1] (1 = off)\n"},
    {.flag = "--min-p", .kind = OPT_PARAM, .off = A(go.min_p), .cmds = GEN, .param = STRATA_PARAM_MIN_P, .help_in = GEN, .group = OPT_HELP_GEN,
     .help = "  --min-p P            drop tokens below P x the top probability (0 = off)\n"},
    {.flag = "--repeat-penalty", .kind = OPT_PARAM, .off = A(go.repeat_penalty), .cmds = GEN, .param = STRATA_PARAM_REPEAT_PENALTY, .help_in = GEN,
     .group = OPT_HELP_GEN, .help = "  --repeat-penalty R   penalise the last 64 ids, R in (0, 100] (1 = off)\n"},
    {.flag = "--seed", .kind = OPT_I64, .off = A(go.seed), .cmds = GEN, .ilo = 0, .ihi = INT64_MAX, .what = "an integer >= 0", .help_in = GEN, .group = OPT_HELP_GEN,
     .help = "  --seed S             sampling seed (default 0): the draw at position p depends only on (S, p)\n"},
    {.flag = "--spec", .kind = OPT_PARAM, .off = A(spec), .cmds = ALL & ~OPT_PLAN, .param = STRATA_PARAM_SPEC, .help_in = GEN, .group = OPT_HELP_GEN,
     .help = "  --spec K             speculative decoding: verify up to K drafted tokens with each token in\n"
             "                       one pass; the output is identical to decoding without it\n"},
    {.flag = "--draft", .kind = OPT_DRAFT, .off = A(go.self_draft), .cmds = GEN | OPT_SERVE, .what = "ngram, self or mtp",
     .help_in = GEN, .group = OPT_HELP_GEN,
     .help = "  --draft SRC          with --spec: ngram (default: recent n-grams of the text), self: the\n"
             "                       model itself on what is already in RAM (pinned layers, cached experts;\n"
             "                       the rest skipped), no disk reads, or mtp: the model's multi-token-\n"
             "                       prediction layer (DeepSeek-V3), loaded and run as one more layer\n"},
};
const size_t opts_n_shared = sizeof opts_shared / sizeof *opts_shared;

static const char *cmd_name(unsigned cmd) {
    return cmd == OPT_RUN ? "run" : cmd == OPT_CHAT ? "chat" : cmd == OPT_SERVE ? "serve" : "plan";
}

void opts_init(app_opts *o, unsigned cmd, int64_t gen) {
    memset(o, 0, sizeof *o);
    o->cmd = cmd;
    o->name = cmd_name(cmd);
    o->gen = gen;
    o->go = strata_gen_opts_default();
}

void opts_help(FILE *f, unsigned cmd, int group) {
    for (size_t k = 0; k < opts_n_shared; k++)
        if (opts_shared[k].help && (opts_shared[k].help_in & cmd) && opts_shared[k].group == group) fputs(opts_shared[k].help, f);
}

/* One value into its field; 0, or the usage error's EXIT_USAGE. */
static int take_value(app_opts *o, const opt_row *r, void *field, const char *v) {
    const char *a = r->flag, *what = r->what;
    double d;
    int64_t n;
    switch (r->kind) {
    case OPT_STR: *(const char **)field = v; return 0;
    case OPT_I64:
        if (!strata_parse_i64(v, r->ilo, r->ihi, &n)) { *(int64_t *)field = n; return 0; }
        break;
    case OPT_F64:
        if (!strata_parse_f64(v, r->flo, r->fhi, &d)) { *(double *)field = d; return 0; }
        break;
    case OPT_PARAM:
        what = strata_param(r->param)->range;
        if (strata_param_parse(r->param, v, &d)) break;
        if (strata_param(r->param)->integer) *(int64_t *)field = (int64_t)d;
        else *(double *)field = d;
        return 0;
    case OPT_FN:
        if (!r->fn(field, v)) return 0;
        break;
    case OPT_DRAFT:
        if (strcmp(v, "self") && strcmp(v, "ngram") && strcmp(v, "mtp")) break;
        o->go.self_draft = !strcmp(v, "self");
        o->go.mtp_draft = o->mtp = !strcmp(v, "mtp");
        o->draft_given = 1;
        return 0;
    case OPT_RAM_GB:
        if (strata_parse_f64(v, 0.001, 1e6, &d)) break;
        o->ram_bytes = (uint64_t)(d * 1e9);
        o->have_ram = 1;
        return 0;
    case OPT_RAM:
        if (!strcmp(v, "auto")) {
            if (!(o->ram_bytes = strata_mem_available()))
                return cli_usage_error(o->name, "--ram auto: MemAvailable is unknown here; give a size");
        } else if (strata_parse_size(v, &o->ram_bytes) || !o->ram_bytes) {
            break;
        }
        o->have_ram = 1;
        return 0;
    case OPT_FLAG: break;
    }
    return cli_usage_error(o->name, "bad value for %s: '%s' (%s)", a, v, what);
}

int opts_take(int argc, char **argv, int *i, app_opts *o, const opt_row *rows, size_t n, void *base) {
    const char *a = argv[*i], *v;
    const opt_row *r = NULL;
    for (size_t k = 0; k < n && !r; k++)
        if (!strcmp(a, rows[k].flag) && (!rows[k].cmds || (rows[k].cmds & o->cmd))) r = &rows[k];
    if (!r) return -1;
    if (r->kind == OPT_RAM_GB || r->kind == OPT_RAM) {
        if (o->ram_flag && strcmp(o->ram_flag, a)) return cli_usage_error(o->name, "%s and %s exclude each other (one budget)", o->ram_flag, a);
        o->ram_flag = r->flag;
    }
    void *field = (char *)base + r->off;
    if (r->kind == OPT_FLAG) { *(int *)field = 1; return 0; }
    if (!(v = cli_need_arg(argc, argv, i, o->name))) return EXIT_USAGE;
    return take_value(o, r, field, v);
}

int opts_parse(int argc, char **argv, app_opts *o, void (*usage)(FILE *), const opt_row *own, size_t n_own, void *own_base,
               const char **model_dir) {
    *model_dir = NULL;
    for (int i = 1; i < argc; i++)
        if (cli_is_help(argv[i])) { usage(stdout); return OPTS_HELP; }
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int f = opts_take(argc, argv, &i, o, opts_shared, opts_n_shared, o);
        if (f < 0) f = opts_take(argc, argv, &i, o, own, n_own, own_base);
        if (f > 0) return f;
        if (f == 0) continue;
        if (a[0] == '-' && a[1]) return cli_usage_error(o->name, "unknown option '%s'", a);
        if (*model_dir) return cli_usage_error(o->name, "unexpected argument '%s'", a);
        *model_dir = a;
    }
    if (!*model_dir) return cli_usage_error(o->name, "missing MODEL_DIR");
    if (o->draft_given && !o->spec) return cli_usage_error(o->name, "--draft needs --spec K");
    return 0;
}

void opts_model(const app_opts *o, int64_t ctx, int max_seqs, strata_model_opts *so) {
    *so = strata_model_opts_default();
    so->ram_bytes = o->have_ram ? o->ram_bytes : 0;
    so->pack_dir = o->pack_dir;
    so->ctx = ctx;
    so->max_seqs = max_seqs;
    so->rows = o->chunk;
    so->n_threads = (int)o->threads;
    so->plan_only = o->plan_only;
    so->no_verify = o->no_verify;
    so->no_prefetch = o->no_prefetch;
    so->router = o->router;
    so->mtp = o->mtp;
    so->no_preload = o->no_preload;
    so->spec = (int)o->spec;
    so->prefix_ram = o->prefix_ram;
    so->prefix_dir = o->prefix_dir;
    so->prefix_dir_bytes = o->prefix_dir_bytes;
    so->prefix_every = o->prefix_every;
    so->cluster = mo_cluster.cl;
}

strata_gen_opts opts_gen(const app_opts *o) {
    strata_gen_opts go = o->go;
    go.spec = (int)o->spec;
    go.max_tokens = o->gen;
    return go;
}
