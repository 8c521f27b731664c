/*
 * http.c: the server of `strata serve` (see http.h): connections and their
 * limits, routing, the API key, the small endpoints (models, tokenize, health,
 * metrics, the page) and the answer helpers. The generation endpoints (request
 * -> jobs, waiting, SSE streams) are http_gen.c; http_priv.h holds what both use.
 *
 * Request life: the first call of the access handler routes the request and
 * checks the API key and the declared length (errors are answered at once);
 * upload calls append to the body up to max_body; the last call dispatches.
 */
#include "http.h"
#include "http_priv.h"

#include <arpa/inet.h>
#include <microhttpd.h>
#include <pthread.h>
#include <stdatomic.h>
#include <sys/socket.h>
#include <string.h>
#include <time.h>
#include "anthropic.h"
#include "page.h"

#define HTTP_MAX_HEADER (32 * 1024)   /* request headers taken (beyond: 431, JSON) */
#define HTTP_POOL_BYTES (128 * 1024) /* libmicrohttpd's memory per connection: headers up to
                                         ~100 KB reach the 431 here; beyond, it answers 431
                                         itself (HTML, compiled in). Its default 32 KB
                                         answered every header over ~16 KB that way; 1 MB
                                         cost ~330 KB RSS per kept-alive connection, this
                                         ~50 KB */

/* ===== small helpers ===== */

/* --cors ORIGIN: every answer names the origin it may be read from. */
void http_cors_headers(const http_server *h, struct MHD_Response *r) {
    if (!h->c.cors) return;
    MHD_add_response_header(r, "Access-Control-Allow-Origin", h->c.cors);
    MHD_add_response_header(r, "Vary", "Origin");
}

static enum MHD_Result respond_hdr(http_server *h, struct MHD_Connection *mc, const char *endpoint, int status,
                                   const char *ctype, const char *body, size_t len, const char *hname, const char *hval) {
    struct MHD_Response *r = MHD_create_response_from_buffer(len, (void *)body, MHD_RESPMEM_MUST_COPY);
    if (!r) return MHD_NO;
    MHD_add_response_header(r, "Content-Type", ctype);
    if (hname) MHD_add_response_header(r, hname, hval);
    http_cors_headers(h, r);
    if (status == 429 || status == 503) MHD_add_response_header(r, "Retry-After", "1");
    if (status == 401) MHD_add_response_header(r, "WWW-Authenticate", "Bearer");
    enum MHD_Result ok = MHD_queue_response(mc, (unsigned)status, r);
    MHD_destroy_response(r);
    metrics_request(h->mt, endpoint, status);
    return ok;
}

static enum MHD_Result respond(http_server *h, struct MHD_Connection *mc, const char *endpoint, int status,
                               const char *ctype, const char *body, size_t len) {
    return respond_hdr(h, mc, endpoint, status, ctype, body, len, NULL, NULL);
}

static enum MHD_Result respond_json_hdr(http_server *h, struct MHD_Connection *mc, const char *endpoint, int status, json_t *j,
                                        const char *hname, const char *hval) {
    char *txt = j ? json_dumps(j, JSON_COMPACT) : NULL;
    json_decref(j);
    if (!txt) return respond(h, mc, endpoint, 500, "application/json",
                             "{\"error\":{\"message\":\"out of memory\",\"type\":\"server_error\",\"code\":null}}", 72);
    enum MHD_Result ok = respond_hdr(h, mc, endpoint, status, "application/json", txt, strlen(txt), hname, hval);
    strata_free(txt);
    return ok;
}

enum MHD_Result http_respond_json(http_server *h, struct MHD_Connection *mc, const char *endpoint, int status, json_t *j) {
    return respond_json_hdr(h, mc, endpoint, status, j, NULL, NULL);
}

json_t *http_error_json(const req_error *e) {
    json_t *o = json_object();
    json_object_set_new(o, "message", json_string(e->message));
    json_object_set_new(o, "type", json_string(e->type));
    json_object_set_new(o, "param", e->param[0] ? json_string(e->param) : json_null());
    json_object_set_new(o, "code", e->code[0] ? json_string(e->code) : json_null());
    return json_pack("{s:o}", "error", o);
}

enum MHD_Result http_respond_error(http_server *h, struct MHD_Connection *mc, const char *endpoint, const req_error *e) {
    const int anth = !strcmp(endpoint, "/v1/messages"); /* Anthropic's clients read their own shape */
    return http_respond_json(h, mc, endpoint, e->status, anth ? anth_error_json(e) : http_error_json(e));
}

/* Constant-time comparison of the bearer token with the key. */
static int key_ok(const http_server *h, struct MHD_Connection *mc) {
    const char *want = h->c.api_key;
    if (!want || !*want) return 1;
    const char *auth = MHD_lookup_connection_value(mc, MHD_HEADER_KIND, "Authorization");
    const char *xkey = MHD_lookup_connection_value(mc, MHD_HEADER_KIND, "x-api-key"); /* Anthropic's clients */
    const char *got;
    if (auth && !strncasecmp(auth, "Bearer ", 7)) got = auth + 7;
    else if (xkey) got = xkey;
    else return 0;
    const size_t gl = strlen(got), wl = strlen(want);
    unsigned diff = gl != wl;
    for (size_t i = 0; i < wl; i++) diff |= (unsigned char)want[i] ^ (unsigned char)(i < gl ? got[i] : 0);
    return diff == 0;
}

/* 1 when name is one of the served model ids (--alias). */
static int model_known(const http_server *h, const char *name) {
    for (int i = 0; i < h->c.n_models; i++)
        if (!strcmp(name, h->c.model_ids[i])) return 1;
    return 0;
}

int http_model_ok(const http_server *h, const request *r, req_error *e) {
    if (!r->model || model_known(h, r->model)) return 0;
    return req_fail(e, 404, "invalid_request_error", "model_not_found", "model",
                    "the model '%.200s' does not exist; this server serves '%.200s'", r->model, h->c.model_ids[0]);
}

/* ===== slow clients: deadline, per-address and total limits (http.h) ===== */

static int same_addr(const struct sockaddr_storage *a, const struct sockaddr_storage *b) {
    if (a->ss_family != b->ss_family) return 0;
    if (a->ss_family == AF_INET)
        return ((const struct sockaddr_in *)a)->sin_addr.s_addr == ((const struct sockaddr_in *)b)->sin_addr.s_addr;
    if (a->ss_family == AF_INET6)
        return !memcmp(&((const struct sockaddr_in6 *)a)->sin6_addr, &((const struct sockaddr_in6 *)b)->sin6_addr, 16);
    return 0;
}

/* Closes c (h->cmu held): a best-effort JSON answer (the request never reached
 * libmicrohttpd's handler, so nothing else writes to the socket), then a
 * shutdown that its connection thread sees at once. */
static void evict(http_server *h, cslot *c, int status) {
    const char *body = status == 408
        ? "{\"error\":{\"message\":\"the request did not arrive in time\",\"type\":\"invalid_request_error\",\"param\":null,"
          "\"code\":\"request_timeout\"}}"
        : "{\"error\":{\"message\":\"too many connections are sending requests; retry later\",\"type\":\"server_error\","
          "\"param\":null,\"code\":\"server_busy\"}}";
    char m[512];
    const int n = snprintf(m, sizeof m, "HTTP/1.1 %s\r\nConnection: close\r\n%sContent-Type: application/json\r\nContent-Length: %zu\r\n\r\n%s",
                           status == 408 ? "408 Request Timeout" : "503 Service Unavailable", status == 408 ? "" : "Retry-After: 1\r\n",
                           strlen(body), body);
    if (n > 0 && send(c->fd, m, (size_t)n, MSG_NOSIGNAL | MSG_DONTWAIT) < 0) { /* best effort */ }
    shutdown(c->fd, SHUT_RDWR);
    c->evicted = 1;
    metrics_request(h->mt, "other", status);
}

/* The oldest connection still sending its request, other than self, from addr
 * (NULL: any address). */
static cslot *oldest_receiving(http_server *h, const cslot *self, const struct sockaddr_storage *addr) {
    cslot *best = NULL;
    for (cslot *c = h->conns; c; c = c->next)
        if (c != self && c->receiving && !c->evicted && (!addr || same_addr(&c->addr, addr)) && (!best || c->t0 < best->t0)) best = c;
    return best;
}

static void on_connection(void *cls, struct MHD_Connection *mc, void **socket_context, enum MHD_ConnectionNotificationCode toe) {
    http_server *h = cls;
    if (toe == MHD_CONNECTION_NOTIFY_CLOSED) {
        cslot *c = *socket_context;
        if (!c) return;
        pthread_mutex_lock(&h->cmu);
        if (c->prev) c->prev->next = c->next;
        else h->conns = c->next;
        if (c->next) c->next->prev = c->prev;
        pthread_mutex_unlock(&h->cmu);
        strata_free(c);
        *socket_context = NULL;
        return;
    }
    const union MHD_ConnectionInfo *fi = MHD_get_connection_info(mc, MHD_CONNECTION_INFO_CONNECTION_FD);
    const union MHD_ConnectionInfo *ai = MHD_get_connection_info(mc, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
    cslot *c = fi ? strata_calloc(1, sizeof *c) : NULL;
    *socket_context = c;
    if (!c) return; /* not tracked: only the libmicrohttpd limits apply to it */
    c->fd = fi->connect_fd;
    if (ai && ai->client_addr) {
        const sa_family_t fam = ai->client_addr->sa_family;
        memcpy(&c->addr, ai->client_addr, fam == AF_INET6 ? sizeof(struct sockaddr_in6) : fam == AF_INET ? sizeof(struct sockaddr_in) : 0);
        c->addr.ss_family = fam;
    }
    c->t0 = strata_now();
    c->receiving = 1;
    pthread_mutex_lock(&h->cmu);
    c->next = h->conns;
    if (h->conns) h->conns->prev = c;
    h->conns = c;
    int n_addr = 0, n_all = 0;
    for (cslot *o = h->conns; o; o = o->next) {
        if (o->evicted) continue;
        n_all++;
        if (o->receiving && same_addr(&o->addr, &c->addr)) n_addr++;
    }
    cslot *v;
    if (n_addr > h->c.max_conns_per_addr && (v = oldest_receiving(h, c, &c->addr))) { evict(h, v, 503); n_all--; }
    if (n_all > h->c.max_conns && (v = oldest_receiving(h, c, NULL))) evict(h, v, 503);
    pthread_mutex_unlock(&h->cmu);
}

static cslot *slot_of(struct MHD_Connection *mc) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(mc, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    return ci ? ci->socket_context : NULL;
}

/* Marks mc's request as all in (receiving 0) or, after its response, the next
 * one as begun (1). */
static void slot_receiving(http_server *h, struct MHD_Connection *mc, int receiving) {
    cslot *c = slot_of(mc);
    if (!c) return;
    pthread_mutex_lock(&h->cmu);
    c->receiving = receiving;
    if (receiving) c->t0 = strata_now();
    pthread_mutex_unlock(&h->cmu);
}

/* Connections being served (their request in) other than mc's. */
static int n_serving(http_server *h, struct MHD_Connection *mc) {
    const cslot *self = slot_of(mc);
    int n = 0;
    pthread_mutex_lock(&h->cmu);
    for (const cslot *c = h->conns; c; c = c->next) n += c != self && !c->evicted && !c->receiving;
    pthread_mutex_unlock(&h->cmu);
    return n;
}

static void *reaper_main(void *arg) {
    http_server *h = arg;
    while (!atomic_load(&h->reaper_stop)) {
        struct timespec ts = {0, 100 * 1000000L};
        nanosleep(&ts, NULL);
        const double now = strata_now();
        pthread_mutex_lock(&h->cmu);
        for (cslot *c = h->conns; c; c = c->next)
            if (c->receiving && !c->evicted && now - c->t0 > h->c.request_timeout_s) evict(h, c, 408);
        pthread_mutex_unlock(&h->cmu);
    }
    return NULL;
}

/* ===== endpoints ===== */

static enum MHD_Result do_tokenize(http_server *h, struct MHD_Connection *mc, conn *k) {
    request r;
    req_error e;
    const int kind = k->route == R_TOKENIZE ? REQ_TOKENIZE : REQ_DETOKENIZE;
    if (request_parse(&r, kind, (const uint8_t *)k->body.p, k->body.n, &e)) return http_respond_error(h, mc, k->endpoint, &e);
    if (http_model_ok(h, &r, &e)) { request_free(&r); return http_respond_error(h, mc, k->endpoint, &e); }
    json_t *out = NULL;
    if (kind == REQ_TOKENIZE) {
        int32_t *ids = NULL;
        size_t n = 0;
        int rc = strata_tokenizer_encode(h->tk, (const uint8_t *)r.text, r.text_len, r.parse_special, &ids, &n);
        if (rc) req_fail(&e, 500, "server_error", NULL, NULL, "cannot tokenize: %s", strata_errstr(rc));
        else {
            json_t *a = json_array();
            for (size_t i = 0; i < n; i++) json_array_append_new(a, json_integer(ids[i]));
            out = json_pack("{s:o,s:I}", "tokens", a, "count", (json_int_t)n);
        }
        strata_free(ids);
    } else {
        uint8_t *txt = NULL;
        size_t len = 0;
        for (size_t i = 0; i < r.n_ids; i++)
            if (r.ids[i] >= strata_tokenizer_n_vocab(h->tk) || !strata_tokenizer_token_bytes(h->tk, r.ids[i], &len)) {
                req_fail(&e, 400, "invalid_request_error", "invalid_value", "tokens", "token id %d at %zu is not in the vocabulary",
                         r.ids[i], i);
                request_free(&r);
                return http_respond_error(h, mc, k->endpoint, &e);
            }
        int rc = strata_tokenizer_decode(h->tk, r.ids, r.n_ids, &txt, &len);
        if (rc) req_fail(&e, 500, "server_error", NULL, NULL, "cannot decode: %s", strata_errstr(rc));
        else {
            req_buf b = {0};
            req_buf_add_utf8(&b, (const char *)txt, len);
            out = b.oom ? NULL : json_pack("{s:s%}", "content", b.p ? b.p : "", b.n);
            req_buf_free(&b);
        }
        strata_free(txt);
    }
    request_free(&r);
    if (!out) return http_respond_error(h, mc, k->endpoint, &e);
    return http_respond_json(h, mc, k->endpoint, 200, out);
}

static json_t *model_json(const http_server *h, const char *id) {
    return json_pack("{s:s,s:s,s:I,s:s,s:I}", "id", id, "object", "model", "created", (json_int_t)0, "owned_by", "strata",
                     "max_model_len", (json_int_t)h->c.ctx);
}

/* ===== routing ===== */

typedef struct cl_scan { const char *first; int conflict; } cl_scan;

static enum MHD_Result cl_each(void *cls, enum MHD_ValueKind kind, const char *key, const char *value) {
    cl_scan *c = cls;
    if (!key || strcasecmp(key, "Content-Length")) return MHD_YES;
    if (!c->first) c->first = value ? value : "";
    else if (strcmp(c->first, value ? value : "")) c->conflict = 1;
    return MHD_YES;
}

/* Routes url; *allow: the methods the route takes (for 405's Allow header). */
static int route(const char *method, const char *url, const char **endpoint, int *method_ok, const char **allow) {
    static const struct { const char *path, *method; int r; } k_routes[] = {
        {"/v1/chat/completions", "POST", R_CHAT}, {"/v1/completions", "POST", R_COMPL}, {"/v1/models", "GET", R_MODELS},
        {"/tokenize", "POST", R_TOKENIZE},        {"/detokenize", "POST", R_DETOKENIZE}, {"/health", "GET", R_HEALTH},
        {"/metrics", "GET", R_METRICS},           {"/", "GET", R_PAGE},                  {"/slots", "GET", R_SLOTS},
        {"/v1/messages", "POST", R_MESSAGES},
    };
    *method_ok = 1;
    for (size_t i = 0; i < sizeof k_routes / sizeof *k_routes; i++)
        if (!strcmp(url, k_routes[i].path)) {
            *endpoint = k_routes[i].path;
            *method_ok = !strcmp(method, k_routes[i].method) || (!strcmp(method, "HEAD") && !strcmp(k_routes[i].method, "GET"));
            *allow = !strcmp(k_routes[i].method, "GET") ? "GET, HEAD" : k_routes[i].method;
            return k_routes[i].r;
        }
    if (!strncmp(url, "/v1/models/", 11)) {
        *endpoint = "/v1/models";
        *method_ok = !strcmp(method, "GET") || !strcmp(method, "HEAD");
        *allow = "GET, HEAD";
        return R_MODEL;
    }
    *endpoint = "other";
    return R_NONE;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *mc, const char *url, const char *method,
                                  const char *version, const char *upload, size_t *upload_size, void **con_cls) {
    http_server *h = cls;
    conn *k = *con_cls;
    req_error e;
    if (!k) {
        k = strata_calloc(1, sizeof *k);
        if (!k) return MHD_NO;
        *con_cls = k;
        int method_ok;
        const char *allow = NULL;
        k->route = route(method, url, &k->endpoint, &method_ok, &allow);
        if (h->c.cors && !strcmp(method, "OPTIONS") && k->route != R_NONE) { /* a CORS preflight */
            struct MHD_Response *r = MHD_create_response_from_buffer(0, (void *)"", MHD_RESPMEM_PERSISTENT);
            if (!r) return MHD_NO;
            http_cors_headers(h, r);
            MHD_add_response_header(r, "Access-Control-Allow-Methods", "GET, POST, OPTIONS");
            MHD_add_response_header(r, "Access-Control-Allow-Headers", "Authorization, Content-Type, x-api-key, anthropic-version, anthropic-beta");
            MHD_add_response_header(r, "Access-Control-Max-Age", "86400");
            enum MHD_Result ok = MHD_queue_response(mc, 204, r);
            MHD_destroy_response(r);
            metrics_request(h->mt, k->endpoint, 204);
            return ok;
        }
        /* headers over HTTP_MAX_HEADER: 431 here, as JSON (the connection's
         * memory pool is larger, so libmicrohttpd's own HTML 431 only comes
         * for headers near HTTP_POOL_BYTES) */
        const union MHD_ConnectionInfo *hi = MHD_get_connection_info(mc, MHD_CONNECTION_INFO_REQUEST_HEADER_SIZE);
        if (hi && hi->header_size > HTTP_MAX_HEADER) {
            req_fail(&e, 431, "invalid_request_error", "headers_too_large", NULL, "the request's headers are %zu bytes; at most %d are taken",
                     hi->header_size, HTTP_MAX_HEADER);
            return http_respond_error(h, mc, k->endpoint, &e);
        }
        /* two Content-Length headers that disagree: which body is meant is
         * ambiguous (request smuggling through a proxy): refused */
        cl_scan cs = {NULL, 0};
        MHD_get_connection_values(mc, MHD_HEADER_KIND, cl_each, &cs);
        if (cs.conflict) {
            req_fail(&e, 400, "invalid_request_error", "invalid_header", NULL, "the request has Content-Length headers that disagree");
            return http_respond_error(h, mc, k->endpoint, &e);
        }
        if (k->route == R_NONE) {
            req_fail(&e, 404, "invalid_request_error", "not_found", NULL, "no route for %.16s %.200s", method, url);
            return http_respond_error(h, mc, k->endpoint, &e);
        }
        if (!method_ok) {
            req_fail(&e, 405, "invalid_request_error", "method_not_allowed", NULL, "%.16s is not allowed on %.200s (allowed: %s)", method,
                     url, allow);
            return respond_json_hdr(h, mc, k->endpoint, 405, http_error_json(&e), "Allow", allow);
        }
        /* at the connection limit: 503, but /health and /metrics have a reserve */
        if (k->route != R_HEALTH && k->route != R_METRICS && n_serving(h, mc) >= h->c.max_conns) {
            req_fail(&e, 503, "server_error", "server_busy", NULL, "the server is serving %d connections, its limit; retry later",
                     h->c.max_conns);
            return http_respond_error(h, mc, k->endpoint, &e);
        }
        if (k->route != R_HEALTH && k->route != R_PAGE && k->route != R_METRICS && !key_ok(h, mc)) {
            req_fail(&e, 401, "invalid_request_error", "invalid_api_key", NULL, "a valid API key is required (Authorization: Bearer KEY)");
            return http_respond_error(h, mc, k->endpoint, &e);
        }
        /* a body that is not declared JSON: a browser's form post from another
         * site needs no preflight, so without --cors it is refused */
        const char *ct = MHD_lookup_connection_value(mc, MHD_HEADER_KIND, "Content-Type");
        if (!h->c.cors && !strcmp(method, "POST") && ct && strncasecmp(ct, "application/json", 16)) {
            req_fail(&e, 415, "invalid_request_error", "unsupported_media_type", NULL,
                     "the body must be JSON (Content-Type: application/json; got '%.100s')", ct);
            return http_respond_error(h, mc, k->endpoint, &e);
        }
        const char *cl = MHD_lookup_connection_value(mc, MHD_HEADER_KIND, "Content-Length");
        int64_t n;
        if (cl && (strata_parse_i64(cl, 0, INT64_MAX, &n) || (uint64_t)n > h->c.max_body)) {
            req_fail(&e, 413, "invalid_request_error", "body_too_large", NULL, "the request body is larger than %zu bytes", h->c.max_body);
            return http_respond_error(h, mc, k->endpoint, &e);
        }
        return MHD_YES;
    }
    if (*upload_size) {
        if (k->body.n + *upload_size > h->c.max_body) return MHD_NO; /* chunked body over the limit: drop the connection */
        req_buf_add(&k->body, upload, *upload_size);
        *upload_size = 0;
        return k->body.oom ? MHD_NO : MHD_YES;
    }
    slot_receiving(h, mc, 0); /* the whole request is in: its deadline no longer runs */
    const int state = sched_state(h->s);
    switch (k->route) {
    case R_HEALTH:
        return http_respond_json(h, mc, k->endpoint, state == 1 ? 200 : 503,
                            json_pack("{s:s}", "status", state == 1 ? "ok" : state == 0 ? "loading" : "failed"));
    case R_PAGE:
        return respond(h, mc, k->endpoint, 200, "text/html; charset=utf-8", page_html, strlen(page_html));
    case R_METRICS: {
        req_buf b = {0};
        metrics_render(h->mt, &b);
        enum MHD_Result ok = b.oom ? MHD_NO : respond(h, mc, k->endpoint, 200, "text/plain; version=0.0.4", b.p, b.n);
        req_buf_free(&b);
        return ok;
    }
    case R_MODELS: {
        json_t *a = json_array();
        for (int i = 0; i < h->c.n_models; i++) json_array_append_new(a, model_json(h, h->c.model_ids[i]));
        return http_respond_json(h, mc, k->endpoint, 200, json_pack("{s:s,s:o}", "object", "list", "data", a));
    }
    case R_MODEL:
        if (!model_known(h, url + 11)) {
            req_fail(&e, 404, "invalid_request_error", "model_not_found", "model", "the model '%.200s' does not exist", url + 11);
            return http_respond_error(h, mc, k->endpoint, &e);
        }
        return http_respond_json(h, mc, k->endpoint, 200, model_json(h, url + 11));
    case R_SLOTS:
        if (state != 1) break;
        return http_respond_json(h, mc, k->endpoint, 200, sched_slots_json(h->s));
    default:
        break;
    }
    if (state != 1 && k->route != R_TOKENIZE && k->route != R_DETOKENIZE) {
        req_fail(&e, 503, "server_error", "loading", NULL, "the model is loading; GET /health says when it is ready");
        return http_respond_error(h, mc, k->endpoint, &e);
    }
    if (k->route == R_TOKENIZE || k->route == R_DETOKENIZE) return do_tokenize(h, mc, k);
    return http_generate(h, mc, k);
}

static void on_completed(void *cls, struct MHD_Connection *mc, void **con_cls, enum MHD_RequestTerminationCode why) {
    conn *k = *con_cls;
    slot_receiving(cls, mc, 1); /* a kept-alive connection's next request begins */
    if (!k) return;
    if (k->admitted) atomic_fetch_sub(&((http_server *)cls)->inflight, 1);
    req_buf_free(&k->body);
    strata_free(k);
    *con_cls = NULL;
}

/* ===== lifecycle ===== */

int http_start(http_server **out, const http_cfg *c, sched *s, strata_tokenizer *tk, metrics *mt, char *err, size_t errlen) {
    *out = NULL;
    struct sockaddr_storage ss;
    memset(&ss, 0, sizeof ss);
    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL | MHD_USE_ITC;
    struct sockaddr_in *a4 = (struct sockaddr_in *)&ss;
    struct sockaddr_in6 *a6 = (struct sockaddr_in6 *)&ss;
    if (inet_pton(AF_INET, c->host, &a4->sin_addr) == 1) {
        a4->sin_family = AF_INET;
        a4->sin_port = htons((uint16_t)c->port);
    } else if (inet_pton(AF_INET6, c->host, &a6->sin6_addr) == 1) {
        a6->sin6_family = AF_INET6;
        a6->sin6_port = htons((uint16_t)c->port);
        flags |= MHD_USE_IPv6;
    } else {
        return strata_fail(err, errlen, STRATA_EINVAL, "--host '%s' is not a numeric IPv4 or IPv6 address", c->host);
    }
    http_server *h = strata_calloc(1, sizeof *h);
    if (!h) return strata_fail(err, errlen, STRATA_ENOMEM, "out of memory");
    h->c = *c;
    h->s = s;
    h->tk = tk;
    h->mt = mt;
    atomic_init(&h->next_id, 1);
    atomic_init(&h->inflight, 0);
    atomic_init(&h->reaper_stop, 0);
    atomic_init(&h->seed_state, (uint64_t)time(NULL) * 0x2545F4914F6CDD1DULL ^ (uint64_t)getpid() ^ (uint64_t)(uintptr_t)h);
    pthread_mutex_init(&h->cmu, NULL);
    h->d = MHD_start_daemon(flags, (uint16_t)c->port, NULL, NULL, on_request, h,
                            MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&ss,
                            MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)c->timeout_s,
                            MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)HTTP_POOL_BYTES,
                            MHD_OPTION_CONNECTION_LIMIT, (unsigned)(c->max_conns + HTTP_RESERVE),
                            MHD_OPTION_NOTIFY_COMPLETED, on_completed, h,
                            MHD_OPTION_NOTIFY_CONNECTION, on_connection, h,
                            MHD_OPTION_END);
    if (!h->d) {
        pthread_mutex_destroy(&h->cmu);
        strata_free(h);
        return strata_fail(err, errlen, STRATA_EIO, "cannot listen on %s port %d (in use, or not an address of this machine)", c->host, c->port);
    }
    if (pthread_create(&h->reaper, NULL, reaper_main, h)) {
        http_stop(h);
        return strata_fail(err, errlen, STRATA_ENOMEM, "cannot start the request-deadline thread");
    }
    h->reaper_on = 1;
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(h->d, MHD_DAEMON_INFO_BIND_PORT);
    h->port = di ? di->port : c->port;
    *out = h;
    return 0;
}

int http_port(const http_server *h) { return h->port; }

void http_quiesce(http_server *h) {
    if (!h || !h->d) return;
    MHD_socket fd = MHD_quiesce_daemon(h->d);
    if (fd != MHD_INVALID_SOCKET) close(fd);
}

void http_drain(http_server *h, double max_s) {
    if (!h) return;
    const double t_end = strata_now() + max_s;
    while (atomic_load(&h->inflight) > 0 && strata_now() < t_end) {
        struct timespec ts = {0, 10 * 1000000L};
        nanosleep(&ts, NULL);
    }
}

void http_stop(http_server *h) {
    if (!h) return;
    if (h->reaper_on) {
        atomic_store(&h->reaper_stop, 1);
        pthread_join(h->reaper, NULL);
    }
    if (h->d) MHD_stop_daemon(h->d); /* every connection's CLOSED notice frees its slot */
    pthread_mutex_destroy(&h->cmu);
    strata_free(h);
}
