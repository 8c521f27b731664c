/*
 * metrics.h: counters, gauges and histograms of `strata serve`, rendered as
 * Prometheus text (GET /metrics). One mutex: every update is a few additions.
 */
#ifndef STRATA_SERVE_METRICS_H
#define STRATA_SERVE_METRICS_H

#include <stdint.h>
#include "request.h"
#include "strata.h"

typedef struct metrics metrics;

metrics *metrics_create(void); /* NULL on allocation failure */
void metrics_free(metrics *mt);

/* One answered HTTP request: endpoint path ("/v1/chat/completions") and status. */
void metrics_request(metrics *mt, const char *endpoint, int status);
void metrics_tokens(metrics *mt, int64_t prompt, int64_t completion);
void metrics_ttft(metrics *mt, double seconds);
void metrics_itl(metrics *mt, double seconds);
/* One engine step: rows evaluated, wall seconds. */
void metrics_step(metrics *mt, int64_t rows, double seconds);
/* Requests still evaluating their prompt after a step: how many, prompt tokens done and in all. */
void metrics_prefill(metrics *mt, int64_t requests, int64_t done, int64_t total);
void metrics_gauges(metrics *mt, int queued, int active, int parallel);
void metrics_model(metrics *mt, const strata_stats *st);
void metrics_rejected(metrics *mt, const char *why); /* "queue_full", "draining", ... */
/* A speculating request's counts when it leaves: drafted, accepted, verifying steps. */
void metrics_spec(metrics *mt, int64_t drafted, int64_t accepted, int64_t verifies);

/* The exposition text (text/plain; version=0.0.4) appended to b. */
void metrics_render(metrics *mt, req_buf *b);

#endif
