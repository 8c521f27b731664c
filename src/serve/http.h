/*
 * http.h: the HTTP side of `strata serve` on libmicrohttpd: routes, API key,
 * body limit, OpenAI-shaped JSON and SSE responses.
 *
 * Threads: one per connection (MHD_USE_THREAD_PER_CONNECTION), capped by
 * max_conns. A connection thread reads the body, parses and validates it,
 * renders the chat template and tokenizes, submits a job, then blocks on the
 * job's condition variable (non-streaming) or inside the SSE content callback
 * (streaming). While it waits it polls its socket: a client that hangs up
 * cancels its job, which leaves the engine at the next step. The MHD connection
 * timeout covers silent connections (nothing is queued before the whole body is
 * in) and is switched off only while an admitted job generates.
 *
 * Slow clients (issue 38: connections that trickle a byte every few seconds
 * never fall silent) are bounded three ways, so they cannot lock anyone out:
 *   - a deadline: a request's headers and body must all arrive within
 *     request_timeout_s of its start (the connection's, or the end of the
 *     previous response); past it the server answers 408 and closes;
 *   - a new connection from an address that already holds max_conns_per_addr
 *     connections still sending their requests replaces that address's oldest
 *     such connection (answered 503 and closed), and one beyond max_conns
 *     replaces the oldest such connection of any address: a client that sends
 *     its request at once is never the oldest;
 *   - a request that arrives while max_conns others are being served is
 *     answered 503 (JSON, Retry-After), except GET /health and /metrics, which
 *     have HTTP_RESERVE connections more; libmicrohttpd's own limit (a closed
 *     socket) is max_conns + HTTP_RESERVE.
 */
#ifndef STRATA_SERVE_HTTP_H
#define STRATA_SERVE_HTTP_H

#include <stddef.h>
#include <stdint.h>
#include "metrics.h"
#include "sched.h"

#define HTTP_RESERVE 64 /* connections beyond max_conns, for /health and /metrics */

typedef struct http_cfg {
    const char *host;        /* numeric IPv4 or IPv6 address */
    int port;                /* 0 = any free port (http_port says which) */
    const char *api_key;     /* NULL or "": no key needed */
    const char *const *model_ids; /* (n_models) what /v1/models lists and requests may name; [0] is the default */
    int n_models;
    const char *cors;        /* NULL: no CORS; else the Access-Control-Allow-Origin of every answer */
    double progress_s;
    double default_temp, default_top_p; /* for requests without them; < 0: none */       /* seconds between a stream's ": prefill DONE/TOTAL" comments (0: none) */
    size_t max_body;         /* bytes */
    int timeout_s;           /* idle / slow-request timeout (silence) */
    int request_timeout_s;   /* a request's headers and body must all arrive within this */
    int max_conns;           /* connections served at once (/health, /metrics: HTTP_RESERVE more) */
    int max_conns_per_addr;  /* connections one address may hold while sending their requests */
    int64_t ctx;             /* positions per sequence */
    int64_t vocab;           /* the model's vocabulary (ids must be below) */
} http_cfg;

typedef struct http_server http_server;

int http_start(http_server **out, const http_cfg *c, sched *s, strata_tokenizer *tk, metrics *mt, char *err, size_t errlen);
int http_port(const http_server *h);
/* Stops accepting connections (the listening socket closes); running ones go on. */
void http_quiesce(http_server *h);
/* After sched_shutdown: waits up to max_s seconds for the admitted generation
 * requests to send what their jobs left (a stream's last chunk and data: [DONE],
 * a whole JSON answer) and complete; closing at once cut some streams off
 * before their [DONE]. */
void http_drain(http_server *h, double max_s);
/* Closes every connection and frees (after sched_shutdown, so no waiter is left). */
void http_stop(http_server *h);

#endif
