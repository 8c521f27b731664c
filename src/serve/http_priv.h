/*
 * http_priv.h: what http.c (the server: connections, limits, routing, the small
 * endpoints, answers) and http_gen.c (the generation endpoints and their SSE
 * streams) share: the server's layout, a request's connection state, and the
 * answer helpers. Only the http module includes it, after http.h (whose
 * http_cfg the server holds by value); it includes no header of the module
 * itself, so the module's headers form no include circle.
 */
#ifndef STRATA_SERVE_HTTP_PRIV_H
#define STRATA_SERVE_HTTP_PRIV_H

#include <jansson.h>
#include <microhttpd.h>
#include <pthread.h>
#include <stdatomic.h>
#include <sys/socket.h>
#include "metrics.h"
#include "request.h"
#include "sched.h"

/* http.h's typedef again (C11 allows it). */
typedef struct http_server http_server;

/* One open connection, for the slow-client limits (see http.h). */
typedef struct cslot {
    struct cslot *prev, *next;
    int fd;
    struct sockaddr_storage addr; /* the client (port ignored) */
    double t0;                    /* the current request began: connect, or the end of the previous response */
    int receiving;                /* its request is not all in yet */
    int evicted;                  /* shut down here; libmicrohttpd closes it */
} cslot;

struct http_server {
    http_cfg c;
    pthread_mutex_t cmu;       /* guards the connection list */
    cslot *conns;
    pthread_t reaper;          /* closes requests past their deadline */
    int reaper_on;
    atomic_int reaper_stop;
    struct MHD_Daemon *d;
    sched *s;
    strata_tokenizer *tk;
    metrics *mt;
    int port;
    atomic_uint_fast64_t next_id;
    atomic_int inflight;       /* admitted generation requests whose response is not yet sent */
    atomic_uint_fast64_t seed_state; /* the seeds drawn for requests without one */
};

enum { R_NONE, R_CHAT, R_COMPL, R_MODELS, R_MODEL, R_TOKENIZE, R_DETOKENIZE, R_HEALTH, R_METRICS, R_PAGE, R_SLOTS, R_MESSAGES };

typedef struct conn {
    int route;
    const char *endpoint;  /* for metrics */
    req_buf body;
    int admitted;          /* counted in inflight until MHD completes the request */
} conn;

/* ===== answers (http.c) ===== */

/* --cors ORIGIN: every answer names the origin it may be read from. */
void http_cors_headers(const http_server *h, struct MHD_Response *r);
/* Queues j (stolen) as a JSON answer and counts it in the metrics. */
enum MHD_Result http_respond_json(http_server *h, struct MHD_Connection *mc, const char *endpoint, int status, json_t *j);
/* OpenAI's {"error": {...}} object of e. */
json_t *http_error_json(const req_error *e);
/* e as the endpoint's error shape (Anthropic's for /v1/messages, else OpenAI's). */
enum MHD_Result http_respond_error(http_server *h, struct MHD_Connection *mc, const char *endpoint, const req_error *e);
/* 0 when r names no model or one this server serves; else e (404). */
int http_model_ok(const http_server *h, const request *r, req_error *e);

/* ===== generation (http_gen.c) ===== */

/* /v1/chat/completions, /v1/completions and /v1/messages with the whole body
 * in k: parse, jobs, submit, then one JSON answer or an SSE stream. */
enum MHD_Result http_generate(http_server *h, struct MHD_Connection *mc, conn *k);

#endif
