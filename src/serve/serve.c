/*
 * serve.c: strata_serve_run (include/strata_serve.h): the server's life from the
 * listening socket to the drained shutdown, over the scheduler (sched.c), the
 * HTTP front (http.c) and the metrics (metrics.c).
 *
 * Order: listen (GET /health answers 503 while loading), then the engine thread
 * loads the weights for `parallel` sequences; the calling thread waits for
 * SIGTERM/SIGINT and reports the load. On the signal: stop accepting, let running
 * and queued requests finish for up to grace_s seconds, cancel the rest.
 */
#include <pthread.h>
#include <signal.h>
#include <string.h>
#include <time.h>
#include "http.h"
#include "metrics.h"
#include "sched.h"
#include "strata_serve.h"

strata_serve_opts strata_serve_opts_default(void) {
    strata_serve_opts o;
    memset(&o, 0, sizeof o);
    o.host = "127.0.0.1";
    o.port = 8080;
    o.parallel = 4;
    o.queue = 64;
    o.ctx = 4096;
    o.max_body = 1 << 20;
    o.timeout_s = 30;
    o.request_timeout_s = 60;
    o.max_conns = o.parallel + o.queue + 128;
    o.max_conns_per_addr = 32;
    o.grace_s = 10;
    o.progress_s = 5;
    o.default_temp = o.default_top_p = -1;
    return o;
}

/* Waits for the signal, reporting the load when it ends. STRATA_OK on the
 * signal, else the load's code (*refused for a budget or a busy cache dir). */
static int wait_signal(sched *s, const strata_serve_opts *o, const strata_model_opts *mo, sigset_t *sigs,
                       int *refused) {
    int ready = 0;
    for (;;) {
        struct timespec ts = {0, 200 * 1000000L};
        int sig = sigtimedwait(sigs, NULL, &ts);
        if (sig == SIGTERM || sig == SIGINT) {
            fprintf(stderr, "strata serve: %s: draining (up to %lld s)\n", sig == SIGTERM ? "SIGTERM" : "SIGINT",
                    (long long)o->grace_s);
            return STRATA_OK;
        }
        const int st = sched_state(s);
        if (st < 0) {
            fprintf(stderr, "strata serve: %s\n", sched_load_error(s));
            /* as run and chat: a budget below the minimum, or a --cache-dir
             * another server holds, is refused input (2), not a failure (1) */
            const int lrc = sched_load_rc(s);
            if (lrc == STRATA_EBUDGET || lrc == STRATA_EBUSY) *refused = 1;
            return lrc < 0 ? lrc : STRATA_EIO;
        }
        if (st == 1 && !ready) {
            ready = 1;
            const strata_model_info *i = sched_info(s);
            fprintf(stderr, "strata serve: ready: %lld layers, vocab %lld, %d threads, kernels %s, %d sequences x ctx %lld, "
                            "weights %s (%.2f s)\n",
                    (long long)i->n_layers, (long long)i->vocab, i->n_threads, i->kernel, i->max_seqs, (long long)i->ctx,
                    i->placement, i->load_s);
            if (i->weights_unverified[0]) fprintf(stderr, "strata serve: weights unverified: %s\n", i->weights_unverified);
            const strata_stats *ls = sched_load_stats(s);
            if (ls->prefix_ram_bytes || ls->prefix_dir_bytes)
                fprintf(stderr, "strata serve: prefix cache: %.3f GB of RAM%s%s%s\n", (double)ls->prefix_ram_bytes / 1e9,
                        o->cache_dir ? ", files in " : "", o->cache_dir ? o->cache_dir : "",
                        o->cache_dir ? "" : " (no --cache-dir)");
            if (o->print_stages) o->print_stages(mo->cluster, stderr); /* reads no MPI */
        }
    }
}

int strata_serve_run(strata_model *m, const strata_model_opts *mo, strata_tokenizer *tk, const strata_serve_opts *o,
                     int *refused) {
    char err[4096];
    int rc;
    *refused = 0;
    /* jansson's allocator is set once, before any thread builds JSON */
    strata_json_init();
    strata_model_info info;
    strata_model_get_info(m, &info);
    sched_opts sopt = {o->parallel, o->queue, o->step_delay_ms, o->spec, o->mtp_draft};

    /* signals go to this thread only (sigtimedwait in wait_signal) */
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGTERM);
    sigaddset(&sigs, SIGINT);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    signal(SIGPIPE, SIG_IGN);

    metrics *mt = NULL;
    sched *s = NULL;
    http_server *h = NULL;
    if (!(mt = metrics_create())) { fprintf(stderr, "strata serve: out of memory\n"); rc = STRATA_ENOMEM; goto out; }
    if ((rc = sched_create(&s, m, mo, tk, &sopt, mt, err, sizeof err))) { fprintf(stderr, "strata serve: %s\n", err); goto out; }
    /* the served ids: the aliases (the first is the answers' default), then the directory's name */
    const char *ids[65];
    int n_ids = 0;
    for (int i = 0; i < o->n_aliases && n_ids < 64; i++) ids[n_ids++] = o->aliases[i];
    ids[n_ids++] = o->model_name;
    http_cfg hc = {.host = o->host, .port = o->port, .api_key = o->api_key, .model_ids = ids, .n_models = n_ids, .cors = o->cors,
                   .progress_s = o->progress_s, .default_temp = o->default_temp, .default_top_p = o->default_top_p, .max_body = o->max_body, .timeout_s = o->timeout_s,
                   .request_timeout_s = o->request_timeout_s, .max_conns = o->max_conns, .max_conns_per_addr = o->max_conns_per_addr,
                   .ctx = o->ctx, .vocab = info.vocab};
    if ((rc = http_start(&h, &hc, s, tk, mt, err, sizeof err))) {
        fprintf(stderr, "strata serve: %s\n", err);
        *refused = 1;
        goto out;
    }
    fprintf(stderr, "strata serve: listening on http://%s%s%s:%d (model '%s'; loading)\n", strchr(o->host, ':') ? "[" : "",
            o->host, strchr(o->host, ':') ? "]" : "", http_port(h), ids[0]);
    if ((!o->api_key || !*o->api_key) && strcmp(o->host, "127.0.0.1") && strcmp(o->host, "::1"))
        fprintf(stderr, "strata serve: warning: listening on %s without an API key: anyone who can reach it can use the model "
                        "(--api-key, or --host 127.0.0.1)\n", o->host);
    if ((rc = sched_start(s, err, sizeof err))) { fprintf(stderr, "strata serve: %s\n", err); goto out; }
    if ((rc = wait_signal(s, o, mo, &sigs, refused))) goto out;
    http_quiesce(h);
    sched_shutdown(s, o->grace_s);
    http_drain(h, 2.0);
    /* the engine thread is gone: the model has one caller again */
    if (sched_state(s) == 1) strata_model_print_report(m, stderr);
out:
    if (s) sched_shutdown(s, 0);
    http_stop(h);
    sched_free(s);
    metrics_free(mt);
    return rc;
}
