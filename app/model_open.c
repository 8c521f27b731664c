/*
 * model_open.c: see model_open.h.
 */
#include <string.h>
#include <unistd.h>
#include "cli.h"
#include "model_open.h"

mo_cluster_hooks mo_cluster;

int mo_open(mo_model *m, const char *cmd, const char *model_dir) {
    char err[8192];
    memset(m, 0, sizeof *m);
    m->cmd = cmd;
    m->dir = model_dir;
    if (strata_model_open(&m->m, model_dir, err, sizeof err)) {
        fprintf(stderr, "strata %s: %s%s", cmd, err, err[0] && err[strlen(err) - 1] == '\n' ? "" : "\n");
        return 1;
    }
    strata_model_get_info(m->m, &m->info);
    return 0;
}

typedef struct { double t0; int tty; double th; } preload_ui; /* th: the identity hash's start */
/* Hashing the model for its identity (the first load of a model without a
 * pack), on stderr like the warm start: it reads every weight byte once. Only
 * once it has taken a second. */
static void hash_progress(void *ud, uint64_t done, uint64_t total) {
    preload_ui *u = ud;
    if (!u->th) u->th = strata_now();
    const double dt = strata_now() - u->th;
    if (dt < 1 || (!u->tty && done < total)) return; /* a hash done within a second is not worth a line */
    fprintf(stderr, "%sidentity: hashing the weights once (cached after): %.2f / %.2f GB (%.2f GB/s)%s", u->tty ? "\r" : "",
            (double)done / 1e9, (double)total / 1e9, dt > 0 ? (double)done / 1e9 / dt : 0, done >= total ? "\n" : "");
}

/* The warm start's progress on stderr: a line rewritten in place on a terminal,
 * else one line at the end. */
static void preload_progress(void *ud, uint64_t done, uint64_t total) {
    const preload_ui *u = ud;
    const double dt = strata_now() - u->t0;
    if (!u->tty && done < total) return;
    fprintf(stderr, "%spreload: %.2f / %.2f GB (%.2f GB/s)%s", u->tty ? "\r" : "", (double)done / 1e9, (double)total / 1e9,
            dt > 0 ? (double)done / 1e9 / dt : 0, done >= total ? "\n" : "");
}

int mo_place(mo_model *m, const app_opts *o, int64_t ctx, int max_seqs) {
    char err[4096];
    strata_model_opts so;
    opts_model(o, ctx, max_seqs, &so);
    preload_ui ui = {strata_now(), isatty(2), 0};
    so.progress = preload_progress;
    so.progress_ud = &ui;
    so.hash_progress = hash_progress;
    strata_model_info pre;
    strata_model_get_info(m->m, &pre);
    const int bad_router = so.router == STRATA_ROUTER_HF && !pre.router_hf_ok; /* refused by the load: a usage error */
    int rc = strata_model_load(m->m, &so, err, sizeof err);
    if (rc) {
        fprintf(stderr, "strata %s: %s\n", m->cmd, err);
        return rc == STRATA_EBUDGET || (bad_router && rc == STRATA_EINVAL) ? EXIT_USAGE : 1;
    }
    strata_model_get_info(m->m, &m->info);
    if (o->plan_only) {
        strata_model_print_plan(m->m, stdout);
        return MO_PLANNED;
    }
    if (m->info.weights_unverified[0]) fprintf(stderr, "strata %s: weights unverified: %s\n", m->cmd, m->info.weights_unverified);
    const strata_model_info *i = &m->info;
    fprintf(stderr, "strata %s: %lld layers (%lld MLA), vocab %lld, %d threads, kernels %s, ctx %lld, weights %s (%.2f s)\n",
            m->cmd, (long long)i->n_layers, (long long)i->n_mla, (long long)i->vocab, i->n_threads, i->kernel,
            (long long)ctx, i->placement, i->load_s);
    if (mo_cluster.print_stages) mo_cluster.print_stages(mo_cluster.cl, stderr);
    return 0;
}

void mo_fmt_speed(const mo_model *m, int64_t n_prefill, double t_prefill, int64_t n_decode, double t_decode,
                  uint64_t peak_rss, char *buf, size_t n) {
    double pf = n_prefill ? t_prefill / (double)n_prefill : 0, dc = n_decode ? t_decode / (double)n_decode : 0;
    char b1[32], b2[32];
    snprintf(buf, n,
             "prefill %.4f s/token (%.1f tok/s), decode %.4f s/token (%.2f tok/s); MLA cache %llu B/position; "
             "peak RSS %s (engine %s)",
             pf, pf > 0 ? 1 / pf : 0, dc, dc > 0 ? 1 / dc : 0, (unsigned long long)m->info.mla_cache_bytes_per_pos,
             strata_fmt_bytes(peak_rss, b1, sizeof b1), strata_fmt_bytes(strata_mem_peak(), b2, sizeof b2));
}

void mo_report(mo_model *m, FILE *f) {
    if (m->m) strata_model_print_report(m->m, f);
    if (m->m && mo_cluster.print_report) mo_cluster.print_report(mo_cluster.cl, f);
}

json_t *mo_placement_json(mo_model *m) {
    char *txt = m->m ? strata_model_report_json(m->m) : NULL;
    json_t *j = NULL;
    if (txt) strata_json_parse(&j, txt, strlen(txt), "report", NULL, 0);
    strata_free(txt);
    return j ? j : json_pack("{s:s}", "plan", "unavailable");
}

void mo_close(mo_model *m) {
    strata_model_close(m->m);
    m->m = NULL;
}
