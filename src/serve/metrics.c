/*
 * metrics.c: see metrics.h. Histograms are cumulative-bucket Prometheus
 * histograms with fixed bounds (seconds for latencies, rows for steps).
 */
#include "metrics.h"

#include <pthread.h>
#include <string.h>

#define MET_MAX_REQ 64

typedef struct hist {
    const double *le;   /* upper bounds, ascending; +Inf implied */
    int n_le;
    uint64_t count[24]; /* per bucket (not cumulative), [n_le] = above the last */
    double sum;
    uint64_t n;
} hist;

static const double k_lat_le[] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60};
static const double k_rows_le[] = {1, 2, 4, 8, 16, 32, 64, 128, 256};

struct metrics {
    pthread_mutex_t mu;
    struct { char endpoint[40]; int status; uint64_t n; } req[MET_MAX_REQ];
    int n_req;
    uint64_t prompt_tokens, completion_tokens, steps, rejected_queue, rejected_draining;
    uint64_t spec_drafted, spec_accepted, spec_verifies;
    double step_seconds;
    int queued, active, parallel;
    int64_t prefill_reqs, prefill_done, prefill_total; /* after the last step */
    strata_stats st;
    hist ttft, itl, rows;
};

static void hist_init(hist *h, const double *le, int n) {
    memset(h, 0, sizeof *h);
    h->le = le;
    h->n_le = n;
}

static void hist_add(hist *h, double v) {
    int i = 0;
    while (i < h->n_le && v > h->le[i]) i++;
    h->count[i]++;
    h->sum += v;
    h->n++;
}

metrics *metrics_create(void) {
    metrics *mt = strata_calloc(1, sizeof *mt);
    if (!mt) return NULL;
    pthread_mutex_init(&mt->mu, NULL);
    hist_init(&mt->ttft, k_lat_le, (int)(sizeof k_lat_le / sizeof *k_lat_le));
    hist_init(&mt->itl, k_lat_le, (int)(sizeof k_lat_le / sizeof *k_lat_le));
    hist_init(&mt->rows, k_rows_le, (int)(sizeof k_rows_le / sizeof *k_rows_le));
    return mt;
}

void metrics_free(metrics *mt) {
    if (!mt) return;
    pthread_mutex_destroy(&mt->mu);
    strata_free(mt);
}

void metrics_request(metrics *mt, const char *endpoint, int status) {
    pthread_mutex_lock(&mt->mu);
    int i = 0;
    while (i < mt->n_req && !(mt->req[i].status == status && !strcmp(mt->req[i].endpoint, endpoint))) i++;
    if (i == mt->n_req && mt->n_req < MET_MAX_REQ) {
        snprintf(mt->req[i].endpoint, sizeof mt->req[i].endpoint, "%s", endpoint);
        mt->req[i].status = status;
        mt->n_req++;
    }
    if (i < mt->n_req) mt->req[i].n++;
    pthread_mutex_unlock(&mt->mu);
}

void metrics_tokens(metrics *mt, int64_t prompt, int64_t completion) {
    pthread_mutex_lock(&mt->mu);
    mt->prompt_tokens += (uint64_t)prompt;
    mt->completion_tokens += (uint64_t)completion;
    pthread_mutex_unlock(&mt->mu);
}

void metrics_ttft(metrics *mt, double s) {
    pthread_mutex_lock(&mt->mu);
    hist_add(&mt->ttft, s);
    pthread_mutex_unlock(&mt->mu);
}

void metrics_itl(metrics *mt, double s) {
    pthread_mutex_lock(&mt->mu);
    hist_add(&mt->itl, s);
    pthread_mutex_unlock(&mt->mu);
}

void metrics_step(metrics *mt, int64_t rows, double s) {
    pthread_mutex_lock(&mt->mu);
    hist_add(&mt->rows, (double)rows);
    mt->steps++;
    mt->step_seconds += s;
    pthread_mutex_unlock(&mt->mu);
}

void metrics_gauges(metrics *mt, int queued, int active, int parallel) {
    pthread_mutex_lock(&mt->mu);
    mt->queued = queued;
    mt->active = active;
    mt->parallel = parallel;
    pthread_mutex_unlock(&mt->mu);
}

void metrics_prefill(metrics *mt, int64_t requests, int64_t done, int64_t total) {
    pthread_mutex_lock(&mt->mu);
    mt->prefill_reqs = requests;
    mt->prefill_done = done;
    mt->prefill_total = total;
    pthread_mutex_unlock(&mt->mu);
}

void metrics_model(metrics *mt, const strata_stats *st) {
    pthread_mutex_lock(&mt->mu);
    mt->st = *st;
    pthread_mutex_unlock(&mt->mu);
}

void metrics_rejected(metrics *mt, const char *why) {
    pthread_mutex_lock(&mt->mu);
    if (!strcmp(why, "queue_full")) mt->rejected_queue++;
    else mt->rejected_draining++;
    pthread_mutex_unlock(&mt->mu);
}

void metrics_spec(metrics *mt, int64_t drafted, int64_t accepted, int64_t verifies) {
    pthread_mutex_lock(&mt->mu);
    mt->spec_drafted += (uint64_t)drafted;
    mt->spec_accepted += (uint64_t)accepted;
    mt->spec_verifies += (uint64_t)verifies;
    pthread_mutex_unlock(&mt->mu);
}

static void hist_render(req_buf *b, const char *name, const char *help, const hist *h) {
    req_buf_addf(b, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
    uint64_t cum = 0;
    for (int i = 0; i < h->n_le; i++) {
        cum += h->count[i];
        req_buf_addf(b, "%s_bucket{le=\"%g\"} %llu\n", name, h->le[i], (unsigned long long)cum);
    }
    req_buf_addf(b, "%s_bucket{le=\"+Inf\"} %llu\n%s_sum %.6f\n%s_count %llu\n", name, (unsigned long long)h->n, name,
                 h->sum, name, (unsigned long long)h->n);
}

/* The model's counters that have a series (strata_stats_fields): each name once,
 * HELP and TYPE first, then its series in the order of strata.h's lists. */
static void stats_render(req_buf *b, const strata_stats *s) {
    int n;
    const strata_stat_field *f = strata_stats_fields(&n);
    for (int i = 0; i < n; i++) {
        if (!f[i].metric) continue;
        int seen = 0;
        for (int k = 0; k < i && !seen; k++) seen = f[k].metric && !strcmp(f[k].metric, f[i].metric);
        if (seen) continue;
        req_buf_addf(b, "# HELP %s %s\n# TYPE %s %s\n", f[i].metric, f[i].help ? f[i].help : "", f[i].metric,
                     f[i].gauge ? "gauge" : "counter");
        for (int k = i; k < n; k++) {
            if (!f[k].metric || strcmp(f[k].metric, f[i].metric)) continue;
            const char *p = (const char *)s + f[k].offset;
            char v[32];
            if (f[k].type == STRATA_STAT_f64) { double d; memcpy(&d, p, sizeof d); snprintf(v, sizeof v, "%.6f", d); }
            else if (f[k].type == STRATA_STAT_i64) { int64_t d; memcpy(&d, p, sizeof d); snprintf(v, sizeof v, "%lld", (long long)d); }
            else { uint64_t d; memcpy(&d, p, sizeof d); snprintf(v, sizeof v, "%llu", (unsigned long long)d); }
            if (f[k].labels && f[k].labels[0]) req_buf_addf(b, "%s{%s} %s\n", f[k].metric, f[k].labels, v);
            else req_buf_addf(b, "%s %s\n", f[k].metric, v);
        }
    }
}

void metrics_render(metrics *mt, req_buf *b) {
    pthread_mutex_lock(&mt->mu);
    req_buf_addf(b, "# HELP strata_requests_total HTTP requests answered, by endpoint and status.\n"
                    "# TYPE strata_requests_total counter\n");
    for (int i = 0; i < mt->n_req; i++)
        req_buf_addf(b, "strata_requests_total{endpoint=\"%s\",status=\"%d\"} %llu\n", mt->req[i].endpoint,
                     mt->req[i].status, (unsigned long long)mt->req[i].n);
    req_buf_addf(b,
                 "# HELP strata_requests_rejected_total Requests refused before queueing (queue full: 429; draining: 503).\n"
                 "# TYPE strata_requests_rejected_total counter\n"
                 "strata_requests_rejected_total{reason=\"queue_full\"} %llu\n"
                 "strata_requests_rejected_total{reason=\"draining\"} %llu\n"
                 "# HELP strata_prompt_tokens_total Prompt tokens of admitted generation requests.\n"
                 "# TYPE strata_prompt_tokens_total counter\nstrata_prompt_tokens_total %llu\n"
                 "# HELP strata_completion_tokens_total Generated tokens.\n"
                 "# TYPE strata_completion_tokens_total counter\nstrata_completion_tokens_total %llu\n"
                 "# HELP strata_queue_length Requests waiting for a sequence.\n"
                 "# TYPE strata_queue_length gauge\nstrata_queue_length %d\n"
                 "# HELP strata_active_sequences Sequences generating now.\n"
                 "# TYPE strata_active_sequences gauge\nstrata_active_sequences %d\n"
                 "# HELP strata_sequences Sequences the model was loaded for (--parallel).\n"
                 "# TYPE strata_sequences gauge\nstrata_sequences %d\n"
                 "# HELP strata_steps_total Engine steps (one weight pass each, or more for long prefills).\n"
                 "# TYPE strata_steps_total counter\nstrata_steps_total %llu\n"
                 "# HELP strata_step_seconds_total Wall time inside engine steps.\n"
                 "# TYPE strata_step_seconds_total counter\nstrata_step_seconds_total %.6f\n",
                 (unsigned long long)mt->rejected_queue, (unsigned long long)mt->rejected_draining,
                 (unsigned long long)mt->prompt_tokens, (unsigned long long)mt->completion_tokens, mt->queued, mt->active,
                 mt->parallel, (unsigned long long)mt->steps, mt->step_seconds);
    req_buf_addf(b,
                 "# HELP strata_prefill_requests Requests evaluating their prompt now.\n"
                 "# TYPE strata_prefill_requests gauge\nstrata_prefill_requests %lld\n"
                 "# HELP strata_prefill_tokens Prompt tokens of the requests evaluating their prompt, by progress.\n"
                 "# TYPE strata_prefill_tokens gauge\nstrata_prefill_tokens{of=\"done\"} %lld\nstrata_prefill_tokens{of=\"total\"} %lld\n",
                 (long long)mt->prefill_reqs, (long long)mt->prefill_done, (long long)mt->prefill_total);
    stats_render(b, &mt->st);
    req_buf_addf(b,
                 "# HELP strata_spec_drafted_tokens_total Tokens drafted for speculative decoding (finished requests).\n"
                 "# TYPE strata_spec_drafted_tokens_total counter\nstrata_spec_drafted_tokens_total %llu\n"
                 "# HELP strata_spec_accepted_tokens_total Drafted tokens the model agreed with.\n"
                 "# TYPE strata_spec_accepted_tokens_total counter\nstrata_spec_accepted_tokens_total %llu\n"
                 "# HELP strata_spec_verifications_total Decode rows that carried drafts.\n"
                 "# TYPE strata_spec_verifications_total counter\nstrata_spec_verifications_total %llu\n",
                 (unsigned long long)mt->spec_drafted, (unsigned long long)mt->spec_accepted,
                 (unsigned long long)mt->spec_verifies);
    hist_render(b, "strata_step_rows", "Rows (prompt + decode tokens) evaluated per engine step.", &mt->rows);
    hist_render(b, "strata_time_to_first_token_seconds", "From request admission to its first generated token.", &mt->ttft);
    hist_render(b, "strata_inter_token_latency_seconds", "Between consecutive generated tokens of a request.", &mt->itl);
    pthread_mutex_unlock(&mt->mu);
}
