/*
 * strata_serve.h: the OpenAI-compatible HTTP server (`strata serve`, src/serve/)
 * as one call, a client of strata.h like the CLI: POST /v1/chat/completions,
 * /v1/completions, /v1/messages (Anthropic's API), /tokenize, /detokenize; GET
 * /v1/models, /slots, /health, /metrics and / (a chat page). Every running request advances in the same engine step,
 * so all of them share each weight read.
 *
 *     strata_model_open(&m, dir, ...);                       // no weights yet
 *     strata_tokenizer_open(&tk, vocab, tokcfg, STRATA_TOK_KIMI, ...);
 *     strata_serve_opts so = strata_serve_opts_default();
 *     so.model_name = "demo";  so.parallel = mo.max_seqs;  so.ctx = mo.ctx;
 *     rc = strata_serve_run(m, &mo, tk, &so, &refused);      // until SIGTERM/SIGINT
 *     strata_tokenizer_close(tk);  strata_model_close(m);
 */
#ifndef STRATA_SERVE_H
#define STRATA_SERVE_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include "strata.h"

typedef struct strata_serve_opts {
    const char *host;        /* numeric IPv4 or IPv6 address */
    int port;                /* 0 = any free port (the listening line names it) */
    const char *api_key;     /* NULL: no key; else Authorization: Bearer KEY (not for /health, /metrics, /) */
    const char *model_name;  /* what /v1/models lists and requests may name */
    const char *const *aliases; /* (n_aliases) more names for it (--alias); the first is the default */
    int n_aliases;
    const char *cors;        /* NULL: no CORS, and POST bodies not declared JSON are refused (415);
                                else OPTIONS preflights are answered and every answer carries
                                Access-Control-Allow-Origin: cors */
    double default_temp;     /* requests without "temperature" (< 0: greedy); the model's
                                generation_config.json sets it in `strata serve` */
    double default_top_p;    /* requests without "top_p" (< 0: 1) */
    double progress_s;       /* a streaming request's ": prefill DONE/TOTAL" comment interval
                                while its prompt is evaluated (0: none); default 5 */
    size_t max_body;         /* largest request body, bytes */
    int timeout_s;           /* seconds a connection may stay silent */
    int request_timeout_s;   /* seconds a request's headers and body may take to arrive */
    int max_conns;           /* connections served at once (GET /health, /metrics: 64 more) */
    int max_conns_per_addr;  /* connections one address may hold while sending requests */
    int parallel;            /* sequences generated together (mo->max_seqs) */
    int queue;               /* requests waiting for a sequence; beyond: 429 */
    int spec;                /* speculative drafts per request (0 = off; mo->spec) */
    int mtp_draft;           /* 1: drafts from the MTP layer (the model loaded with strata_model_opts.mtp) */
    int64_t ctx;             /* positions per sequence (mo->ctx) */
    double grace_s;          /* on SIGTERM/SIGINT, seconds to let requests finish */
    const char *cache_dir;   /* named in the ready line (mo->prefix_dir) */
    int step_delay_ms;       /* tests: sleep before each engine step */
    /* strata-mpi: prints the cluster's stages (of mo->cluster) after the ready line */
    void (*print_stages)(const strata_cluster *cl, FILE *f);
} strata_serve_opts;

/* host 127.0.0.1, port 8080, parallel 4, queue 64, ctx 4096, max_body 1 MiB,
 * timeout 30 s, request timeout 60 s, progress comments every 5 s, no default
 * temperature / top_p (-1), max_conns parallel + queue + 128 (set
 * from the defaults), 32 per address, grace 10 s. */
strata_serve_opts strata_serve_opts_default(void);

/* Serves m (opened, not loaded; the engine thread loads it with mo while GET
 * /health answers 503) with tk (the model's tokenizer, opened with
 * STRATA_TOK_KIMI; used on HTTP threads and the engine thread, never through
 * the single-caller model) until SIGTERM or SIGINT, which the calling thread
 * waits for (both are blocked in it, and SIGPIPE ignored): then it stops
 * accepting, lets running and queued requests finish for up to grace_s seconds,
 * cancels the rest and prints the model's report. Progress and errors go to
 * stderr as "strata serve: ..." lines. Returns STRATA_OK after the signal, or a
 * negative STRATA_E* code, with *refused 1 when the failure is refused input
 * (the address cannot be listened on, a budget below the minimum, a cache
 * directory another server holds) rather than a failure while running. */
int strata_serve_run(strata_model *m, const strata_model_opts *mo, strata_tokenizer *tk, const strata_serve_opts *o,
                     int *refused);

#endif
