/*
 * http.c: routes and responses of `strata serve` (see http.h).
 *
 * Request life: the first call of the access handler routes the request and
 * checks the API key and the declared length (errors are answered at once);
 * upload calls append to the body up to max_body; the last call dispatches.
 * Generation endpoints parse -> render/tokenize -> check limits -> submit; then
 * either wait here and answer one JSON document, or answer an SSE stream whose
 * content callback waits for the job's text.
 */
#include "http.h"

#include <arpa/inet.h>
#include <microhttpd.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <sys/socket.h>
#include <string.h>
#include <time.h>
#include "anthropic.h"
#include "oai.h"
#include "page.h"

#define WAIT_SLICE_MS 25 /* how often a waiting thread looks at its socket */
#define HTTP_MAX_HEADER (32 * 1024)   /* request headers taken (beyond: 431, JSON) */
#define HTTP_POOL_BYTES (128 * 1024) /* libmicrohttpd's memory per connection: headers up to
                                         ~100 KB reach the 431 here; beyond, it answers 431
                                         itself (HTML, compiled in). Its default 32 KB
                                         answered every header over ~16 KB that way; 1 MB
                                         cost ~330 KB RSS per kept-alive connection, this
                                         ~50 KB */

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

/* ===== small helpers ===== */

/* --cors ORIGIN: every answer names the origin it may be read from. */
static void cors_headers(const http_server *h, struct MHD_Response *r) {
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
    cors_headers(h, r);
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

static enum MHD_Result respond_json(http_server *h, struct MHD_Connection *mc, const char *endpoint, int status, json_t *j) {
    return respond_json_hdr(h, mc, endpoint, status, j, NULL, NULL);
}

static json_t *error_json(const req_error *e) {
    json_t *o = json_object();
    json_object_set_new(o, "message", json_string(e->message));
    json_object_set_new(o, "type", json_string(e->type));
    json_object_set_new(o, "param", e->param[0] ? json_string(e->param) : json_null());
    json_object_set_new(o, "code", e->code[0] ? json_string(e->code) : json_null());
    return json_pack("{s:o}", "error", o);
}

static enum MHD_Result respond_error(http_server *h, struct MHD_Connection *mc, const char *endpoint, const req_error *e) {
    const int anth = !strcmp(endpoint, "/v1/messages"); /* Anthropic's clients read their own shape */
    return respond_json(h, mc, endpoint, e->status, anth ? anth_error_json(e) : error_json(e));
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

/* 1 when the peer has closed its end (or the socket failed). */
static int peer_gone(struct MHD_Connection *mc) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(mc, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (!ci) return 0;
    struct pollfd p = {ci->connect_fd, POLLRDHUP, 0};
    if (poll(&p, 1, 0) <= 0) return 0;
    return (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) != 0;
}

/* Waits on j->cv (j->mu held) for at most WAIT_SLICE_MS. */
static void wait_slice(job *j) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_nsec += WAIT_SLICE_MS * 1000000L;
    if (ts.tv_nsec >= 1000000000L) { ts.tv_sec++; ts.tv_nsec -= 1000000000L; }
    pthread_cond_timedwait(&j->cv, &j->mu, &ts);
}

static void new_id(http_server *h, const char *prefix, char *out, size_t n) {
    uint64_t k = atomic_fetch_add(&h->next_id, 1);
    snprintf(out, n, "%s-%llx%04llx", prefix, (unsigned long long)time(NULL), (unsigned long long)(k & 0xffff));
}

/* 1 when name is one of the served model ids (--alias). */
static int model_known(const http_server *h, const char *name) {
    for (int i = 0; i < h->c.n_models; i++)
        if (!strcmp(name, h->c.model_ids[i])) return 1;
    return 0;
}

static int model_ok(const http_server *h, const request *r, req_error *e) {
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

/* ===== generation: request -> job ===== */

/* A chat job's tool-call parser (when r declares tools and does not say "none")
 * and where its channel follower starts (2: a forced call's prefill opened K3's
 * tools channel). Every choice of a request has its own. */
static int open_tools(http_server *h, const request *r, job *j, char *err, size_t errlen) {
    j->follow_from = r->effort != STRATA_CHAT_THINK_OFF;
    if (!r->n_tools || r->tool_choice == STRATA_CHAT_TOOLS_NONE) return 0;
    size_t calls = 0;
    for (size_t i = 0; i < r->n_msgs; i++) calls += r->msgs[i].n_calls;
    const strata_chat_tools tools = {r->tools, r->n_tools, r->tool_choice, r->tool_choice_name, r->parallel_tools};
    const int forced = r->tool_choice == STRATA_CHAT_TOOLS_REQUIRED || r->tool_choice == STRATA_CHAT_TOOLS_NAMED;
    strata_chat_ids ci;
    int rc = strata_chat_ids_get(h->tk, &ci, err, errlen);
    if (!rc) rc = strata_tool_parser_open(&j->tp, ci.fmt, &tools, calls, err, errlen);
    if (!rc && forced && ci.fmt == STRATA_CHAT_FMT_XTML) j->follow_from = 2;
    return rc;
}

/* Prompt ids of r (chat: the K3 template with the generation prompt). */
static int build_prompt(http_server *h, const request *r, job *j, req_error *e) {
    char err[512];
    int32_t *ids = NULL;
    size_t n = 0, cap = 0;
    if (r->kind == REQ_CHAT) {
        strata_chat_msg *m = strata_calloc(r->n_msgs, sizeof *m);
        if (!m) return req_fail(e, 500, "server_error", "out_of_memory", NULL, "out of memory");
        for (size_t i = 0; i < r->n_msgs; i++) {
            const req_msg *q = &r->msgs[i];
            m[i] = (strata_chat_msg){.role = q->role, .content = q->content, .reasoning = q->reasoning, .calls = q->calls,
                                     .n_calls = q->n_calls, .call_of = q->call_of};
        }
        const strata_chat_tools tools = {r->tools, r->n_tools, r->tool_choice, r->tool_choice_name, r->parallel_tools};
        int rc = strata_chat_render_tools(h->tk, m, r->n_msgs, &tools, r->effort, STRATA_CHAT_GEN, &ids, &n, &cap, err, sizeof err);
        strata_free(m);
        if (rc) { strata_free(ids); return req_fail(e, rc == STRATA_EINVAL ? 400 : 500, rc == STRATA_EINVAL ? "invalid_request_error" : "server_error", NULL, "messages", "%s", err); }
        /* the chat format decides (R1 always reasons, V3.1 and K2.5 as the effort,
         * K2-Thinking's model opens <think> itself, DeepSeek-V3 and K2 never):
         * reasoning_content and the stream's channels follow it */
        strata_chat_ids ci;
        const int fmt = strata_chat_ids_get(h->tk, &ci, err, sizeof err) ? STRATA_CHAT_FMT_XTML : ci.fmt;
        j->thinking = strata_chat_fmt_reasons(fmt, r->effort);
        j->think_first = strata_chat_fmt_starts_thinking(fmt, r->effort);
        if ((rc = open_tools(h, r, j, err, sizeof err))) { strata_free(ids); return req_fail(e, 500, "server_error", NULL, NULL, "%s", err); }
        /* call ids: the same request gets the same ids (FNV-1a of the prompt) */
        uint64_t hsh = 1469598103934665603ull;
        for (size_t i = 0; i < n; i++) hsh = (hsh ^ (uint32_t)ids[i]) * 1099511628211ull;
        snprintf(j->call_id, sizeof j->call_id, "call_%016llx", (unsigned long long)hsh);
    } else if (r->has_ids) {
        if (r->n_ids) {
            ids = strata_alloc(r->n_ids * sizeof *ids);
            if (!ids) return req_fail(e, 500, "server_error", "out_of_memory", NULL, "out of memory");
            memcpy(ids, r->ids, r->n_ids * sizeof *ids);
        }
        n = r->n_ids;
    } else if (r->text_len) {
        int rc = strata_tokenizer_encode(h->tk, (const uint8_t *)r->text, r->text_len, 0, &ids, &n);
        if (rc) return req_fail(e, 500, "server_error", NULL, "prompt", "cannot tokenize the prompt: %s", strata_errstr(rc));
    }
    const char *param = r->kind == REQ_CHAT ? "messages" : "prompt";
    if (n == 0) { strata_free(ids); return req_fail(e, 400, "invalid_request_error", "invalid_value", param, "the prompt is empty"); }
    for (size_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= h->c.vocab) {
            int32_t bad = ids[i];
            strata_free(ids);
            return req_fail(e, 400, "invalid_request_error", "invalid_value", param,
                            "token id %d at %zu is outside the vocabulary [0, %lld)", bad, i, (long long)h->c.vocab);
        }
    /* the prompt and at least one generated token must fit the context */
    const int64_t ctx = h->c.ctx;
    if ((int64_t)n >= ctx || (r->max_tokens && (int64_t)n + r->max_tokens > ctx)) {
        strata_free(ids);
        if (r->max_tokens)
            return req_fail(e, 400, "invalid_request_error", "context_length_exceeded", r->max_tokens && (int64_t)n < ctx ? "max_tokens" : param,
                            "this server's context is %lld tokens; the request has %zu prompt tokens and asks for %lld more "
                            "(%lld in all); shorten the prompt or lower max_tokens",
                            (long long)ctx, n, (long long)r->max_tokens, (long long)((int64_t)n + r->max_tokens));
        return req_fail(e, 400, "invalid_request_error", "context_length_exceeded", param,
                        "this server's context is %lld tokens; the prompt has %zu, which leaves no room to generate",
                        (long long)ctx, n);
    }
    j->prompt = ids;
    j->n_prompt = (int64_t)n;
    return 0;
}

/* A request's seed: its own, or one drawn from the server's random source
 * (returned in the answer, so any answer can be reproduced). */
static uint64_t draw_seed(http_server *h) {
    uint64_t x = atomic_fetch_add(&h->seed_state, 0x9E3779B97F4A7C15ULL);
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
    return (x ^ (x >> 31)) & (((uint64_t)1 << 53) - 1); /* exact in a JSON double too */
}

/* A forced call (tool_choice required or named): its grammar (strict arguments,
 * declared names) in place of any response_format's. */
static int forced_grammar(http_server *h, request *r, req_error *e) {
    if (!r->n_tools || (r->tool_choice != STRATA_CHAT_TOOLS_REQUIRED && r->tool_choice != STRATA_CHAT_TOOLS_NAMED)) return 0;
    size_t calls = 0;
    for (size_t i = 0; i < r->n_msgs; i++) calls += r->msgs[i].n_calls;
    const strata_chat_tools tools = {r->tools, r->n_tools, r->tool_choice, r->tool_choice_name, r->parallel_tools};
    char err[512];
    strata_grammar *g = NULL;
    const int rc = strata_grammar_tools(&g, h->tk, &tools, calls, err, sizeof err);
    if (rc == STRATA_EINVAL) return req_fail(e, 400, "invalid_request_error", "invalid_schema", "tools", "%s", err);
    if (rc) return req_fail(e, 500, "server_error", NULL, NULL, "%s", err);
    strata_grammar_free(r->grammar);
    r->grammar = g;
    return 0;
}

/* The jobs of r: one per choice, each with seed + index; *n set. */
static int make_jobs(http_server *h, request *r, const char *rid, job **jobs, int *n, uint64_t *seed, req_error *e) {
    *n = 0;
    *seed = r->has_seed ? r->go.seed : draw_seed(h);
    for (int k = 0; k < r->n; k++) {
        job *j = job_new();
        if (!j) return req_fail(e, 500, "server_error", "out_of_memory", NULL, "out of memory");
        jobs[(*n)++] = j;
        j->kind = r->kind;
        snprintf(j->rid, sizeof j->rid, "%s", rid);
        if (k == 0 && build_prompt(h, r, j, e)) return -1;
        if (k == 0 && r->kind == REQ_CHAT && forced_grammar(h, r, e)) return -1;
        if (k) {
            char err[512];
            j->thinking = jobs[0]->thinking;
            j->think_first = jobs[0]->think_first;
            j->n_prompt = jobs[0]->n_prompt; /* members use the leader's prompt */
            snprintf(j->call_id, sizeof j->call_id, "%.32s-%d", jobs[0]->call_id, k & 0xff);
            if (r->kind == REQ_CHAT && open_tools(h, r, j, err, sizeof err))
                return req_fail(e, 500, "server_error", NULL, NULL, "%s", err);
        }
        strata_gen_opts go = r->go;
        if (!r->has_temp && h->c.default_temp >= 0) go.temp = h->c.default_temp;
        if (!r->has_top_p && h->c.default_top_p > 0) go.top_p = h->c.default_top_p;
        go.max_tokens = r->max_tokens ? r->max_tokens : h->c.ctx - jobs[0]->n_prompt;
        go.stop_at_end = 1;
        go.seed = *seed + (uint64_t)k;
        /* the leader owns the grammar; members borrow it once grouped (a member
         * holds its leader until it is destroyed: sched.c job_destroy) */
        go.grammar = k ? NULL : r->grammar;
        if (!k) r->grammar = NULL;
        j->go = go;
        for (int i = 0; i < r->n_stop; i++) {
            memcpy(j->stop[i], r->stop[i], r->stop_len[i]);
            j->stop[i][r->stop_len[i]] = 0;
            j->stop_len[i] = r->stop_len[i];
        }
        j->n_stop = r->n_stop;
    }
    if (*n > 1 && job_group(jobs, *n)) return req_fail(e, 500, "server_error", "out_of_memory", NULL, "out of memory");
    for (int k = 1; k < *n; k++) jobs[k]->go.grammar = jobs[0]->go.grammar;
    return 0;
}

static void release_jobs(http_server *h, job **jobs, int n) {
    for (int k = n - 1; k >= 0; k--) job_release(h->s, jobs[k]);
}

/* The model identity as OpenAI's system_fingerprint ("" while loading). */
static void fingerprint(http_server *h, char *out, size_t n) {
    if (sched_state(h->s) == 1) snprintf(out, n, "strata-%s-%016llx", STRATA_VERSION, (unsigned long long)sched_info(h->s)->identity);
    else snprintf(out, n, "strata-%s", STRATA_VERSION);
}

/* ===== streaming ===== */

typedef struct stream {
    http_server *h;
    struct MHD_Connection *mc;
    job *jobs[REQ_MAX_N];
    int n;
    int kind, include_usage;
    char id[48], model[256], fp[64];
    long long created;
    uint64_t seed;
    int stage;                 /* 0 role chunks next, 1 text, 2 done ([DONE] queued) */
    int ended[REQ_MAX_N];      /* finish chunk sent */
    size_t sent_content[REQ_MAX_N], sent_reasoning[REQ_MAX_N], sent_lp[REQ_MAX_N], text_off[REQ_MAX_N];
    size_t sent_calls[REQ_MAX_N]; /* tool calls streamed (each whole: its head, then its arguments) */
    unsigned seen_ver;
    int anth;                  /* /v1/messages: Anthropic's events */
    anth_stream as;
    double t_last;             /* when something was last sent (the progress comments) */
    req_buf out;
    size_t out_off;
} stream;

static json_t *chunk_base(const stream *st) {
    return json_pack("{s:s,s:s,s:I,s:s,s:s,s:I}", "id", st->id, "object", st->kind == REQ_CHAT ? "chat.completion.chunk" : "text_completion",
                     "created", (json_int_t)st->created, "model", st->model, "system_fingerprint", st->fp, "seed", (json_int_t)st->seed);
}

static void emit(stream *st, json_t *chunk) {
    if (st->include_usage && !json_object_get(chunk, "usage")) json_object_set_new(chunk, "usage", json_null());
    char *txt = json_dumps(chunk, JSON_COMPACT);
    json_decref(chunk);
    if (!txt) { st->out.oom = 1; return; }
    req_buf_add(&st->out, "data: ", 6);
    req_buf_add(&st->out, txt, strlen(txt));
    req_buf_add(&st->out, "\n\n", 2);
    strata_free(txt);
    st->t_last = strata_now();
}

/* One chunk of choice k carrying delta text (chat: content or reasoning_content),
 * its new logprobs (lp, stolen; NULL: null) or the finish reason. */
static void emit_choice(stream *st, int k, const char *field, const char *text, size_t len, json_t *lp, const char *finish) {
    json_t *c = chunk_base(st), *choice;
    if (!lp) lp = json_null();
    if (st->kind == REQ_CHAT) {
        json_t *delta = json_object();
        if (field) json_object_set_new(delta, field, json_stringn(text, len));
        choice = json_pack("{s:i,s:o,s:o,s:o}", "index", k, "delta", delta, "logprobs", lp,
                           "finish_reason", finish ? json_string(finish) : json_null());
    } else {
        choice = json_pack("{s:s%,s:i,s:o,s:o}", "text", field ? text : "", field ? len : (size_t)0, "index", k, "logprobs", lp,
                           "finish_reason", finish ? json_string(finish) : json_null());
    }
    json_object_set_new(c, "choices", json_pack("[o]", choice));
    emit(st, c);
}

/* Choice k's new text and logprobs into st->out (its mutex held). */
static void collect_one(stream *st, int k) {
    job *j = st->jobs[k];
    json_t *lp = NULL;
    if (j->go.logprobs && j->n_lp > st->sent_lp[k] && (j->content.n > st->sent_content[k] || j->finished)) {
        lp = oai_logprobs(st->h->tk, st->kind, j->lp + st->sent_lp[k], j->n_lp - st->sent_lp[k], &st->text_off[k]);
        st->sent_lp[k] = j->n_lp;
    }
    if (j->reasoning.n > st->sent_reasoning[k]) {
        emit_choice(st, k, "reasoning_content", j->reasoning.p + st->sent_reasoning[k], j->reasoning.n - st->sent_reasoning[k], NULL, NULL);
        st->sent_reasoning[k] = j->reasoning.n;
    }
    if (j->content.n > st->sent_content[k] || lp) {
        emit_choice(st, k, st->kind == REQ_CHAT ? "content" : "text", j->content.p ? j->content.p + st->sent_content[k] : "",
                    j->content.n - st->sent_content[k], lp, NULL);
        st->sent_content[k] = j->content.n;
    }
    for (; st->sent_calls[k] < j->n_calls; st->sent_calls[k]++) {
        const size_t i = st->sent_calls[k];
        char cid[64];
        snprintf(cid, sizeof cid, "%s_%zu", j->call_id, i);
        for (int part = 0; part < 2; part++) {
            json_t *c = chunk_base(st);
            json_t *call = part ? json_pack("{s:I,s:{s:s}}", "index", (json_int_t)i, "function", "arguments", j->call_args[i])
                                : json_pack("{s:I,s:s,s:s,s:{s:s,s:s}}", "index", (json_int_t)i, "id", cid, "type", "function",
                                            "function", "name", j->call_name[i], "arguments", "");
            json_t *choice = json_pack("{s:i,s:{s:[o]},s:n,s:n}", "index", k, "delta", "tool_calls", call, "logprobs", "finish_reason");
            json_object_set_new(c, "choices", json_pack("[o]", choice));
            emit(st, c);
        }
    }
    if (j->finished && !st->ended[k]) {
        st->ended[k] = 1;
        if (!j->err_status) emit_choice(st, k, NULL, NULL, 0, NULL, j->finish_reason);
    }
}

/* Moves whatever the jobs have produced since the last call into st->out;
 * while the prompt is evaluated, a comment line every progress interval. */
static void stream_collect(stream *st) {
    job *lead = st->jobs[0];
    pthread_mutex_lock(&lead->mu);
    while (st->stage != 0 && lead->ver == st->seen_ver) {
        wait_slice(lead);
        if (peer_gone(st->mc)) {
            pthread_mutex_unlock(&lead->mu);
            sched_cancel(st->h->s, lead);
            st->out.oom = 1; /* the caller ends the stream with an error */
            return;
        }
        const double now = strata_now();
        if (st->h->c.progress_s > 0 && now - st->t_last >= st->h->c.progress_s && lead->prompt_done < lead->n_prompt && lead->n_gen == 0) {
            /* an SSE comment: clients skip it, proxies and idle timers see bytes */
            req_buf_addf(&st->out, ": prefill %lld/%lld\n\n", (long long)lead->prompt_done, (long long)lead->n_prompt);
            st->t_last = now;
            pthread_mutex_unlock(&lead->mu);
            return;
        }
    }
    st->seen_ver = lead->ver;
    if (st->anth) {
        st->stage = 1;
        anth_stream_events(&st->as, lead, st->id, st->model, &st->out);
        if (st->as.done) {
            st->stage = 2;
            metrics_request(st->h->mt, "/v1/messages", lead->err_status ? lead->err_status : 200);
        }
        pthread_mutex_unlock(&lead->mu);
        return;
    }
    pthread_mutex_unlock(&lead->mu);
    if (st->stage == 0) {
        st->stage = 1;
        for (int k = 0; k < st->n && st->kind == REQ_CHAT; k++) {
            json_t *c = chunk_base(st);
            json_t *choice = json_pack("{s:i,s:{s:s,s:s},s:n,s:n}", "index", k, "delta", "role", "assistant", "content", "",
                                       "logprobs", "finish_reason");
            json_object_set_new(c, "choices", json_pack("[o]", choice));
            emit(st, c);
        }
    }
    int all = 1, failed = -1;
    for (int k = 0; k < st->n; k++) {
        job *j = st->jobs[k];
        pthread_mutex_lock(&j->mu);
        collect_one(st, k);
        all &= j->finished;
        if (j->finished && j->err_status && failed < 0) failed = k;
        pthread_mutex_unlock(&j->mu);
    }
    if (!all && failed < 0) return;
    if (failed >= 0) {
        job *j = st->jobs[failed];
        req_error e;
        req_fail(&e, j->err_status, "server_error", NULL, NULL, "%s", j->err_msg);
        json_t *ej = error_json(&e);
        char *txt = ej ? json_dumps(ej, JSON_COMPACT) : NULL;
        json_decref(ej);
        if (txt) { req_buf_addf(&st->out, "data: %s\n\n", txt); strata_free(txt); }
        if (!all) sched_cancel(st->h->s, lead);
    } else if (st->include_usage) {
        json_t *c = chunk_base(st);
        json_object_set_new(c, "choices", json_array());
        json_object_set_new(c, "usage", oai_usage(st->jobs, st->n));
        emit(st, c);
    }
    req_buf_add(&st->out, "data: [DONE]\n\n", 14);
    st->stage = 2;
    metrics_request(st->h->mt, st->kind == REQ_CHAT ? "/v1/chat/completions" : "/v1/completions",
                    failed >= 0 ? st->jobs[failed]->err_status : 200);
}

static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max) {
    stream *st = cls;
    for (;;) {
        if (st->out_off < st->out.n) {
            size_t k = st->out.n - st->out_off < max ? st->out.n - st->out_off : max;
            memcpy(buf, st->out.p + st->out_off, k);
            st->out_off += k;
            return (ssize_t)k;
        }
        st->out.n = st->out_off = 0;
        if (st->stage == 2) {
            MHD_set_connection_option(st->mc, MHD_CONNECTION_OPTION_TIMEOUT, (unsigned)st->h->c.timeout_s);
            return MHD_CONTENT_READER_END_OF_STREAM;
        }
        stream_collect(st);
        if (st->out.oom) return MHD_CONTENT_READER_END_WITH_ERROR;
    }
}

static void stream_free(void *cls) {
    stream *st = cls;
    if (st->stage != 2) { /* the client went away before the end */
        sched_cancel(st->h->s, st->jobs[0]);
        metrics_request(st->h->mt, st->anth ? "/v1/messages" : st->kind == REQ_CHAT ? "/v1/chat/completions" : "/v1/completions", 499);
    }
    release_jobs(st->h, st->jobs, st->n);
    req_buf_free(&st->out);
    strata_free(st);
}

/* ===== endpoints ===== */

/* Waits until every job finished (0) or the client went away (-1, cancelled). */
static int wait_jobs(http_server *h, struct MHD_Connection *mc, job *const *jobs, int n) {
    job *lead = jobs[0];
    for (;;) {
        int all = 1;
        for (int k = 0; k < n; k++) {
            pthread_mutex_lock(&jobs[k]->mu);
            all &= jobs[k]->finished;
            pthread_mutex_unlock(&jobs[k]->mu);
        }
        if (all) return 0;
        pthread_mutex_lock(&lead->mu);
        const unsigned v = lead->ver;
        while (lead->ver == v && !peer_gone(mc)) wait_slice(lead);
        pthread_mutex_unlock(&lead->mu);
        if (peer_gone(mc)) {
            sched_cancel(h->s, lead);
            return -1;
        }
    }
}

static enum MHD_Result do_generate(http_server *h, struct MHD_Connection *mc, conn *k) {
    request r;
    req_error e;
    const int anth = k->route == R_MESSAGES, kind = k->route == R_COMPL ? REQ_COMPLETION : REQ_CHAT;
    if (anth ? anth_parse(&r, (const uint8_t *)k->body.p, k->body.n, &e) : request_parse(&r, kind, (const uint8_t *)k->body.p, k->body.n, &e))
        return respond_error(h, mc, k->endpoint, &e);
    char id[48], model[256];
    new_id(h, anth ? "msg" : kind == REQ_CHAT ? "chatcmpl" : "cmpl", id, sizeof id);
    snprintf(model, sizeof model, "%s", r.model ? r.model : h->c.model_ids[0]);
    job *jobs[REQ_MAX_N];
    int n = 0;
    uint64_t seed = 0;
    if (model_ok(h, &r, &e) || make_jobs(h, &r, id, jobs, &n, &seed, &e) || sched_submit(h->s, jobs[0], &e)) {
        release_jobs(h, jobs, n);
        request_free(&r);
        return respond_error(h, mc, k->endpoint, &e);
    }
    /* admitted: generation may take longer than the idle timeout */
    MHD_set_connection_option(mc, MHD_CONNECTION_OPTION_TIMEOUT, 0);
    k->admitted = 1;
    atomic_fetch_add(&h->inflight, 1);
    const int stream_mode = r.stream, include_usage = r.include_usage;
    request_free(&r);
    if (stream_mode) {
        stream *st = strata_calloc(1, sizeof *st);
        struct MHD_Response *resp = st ? MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 4096, stream_read, st, stream_free) : NULL;
        if (!resp) {
            strata_free(st);
            sched_cancel(h->s, jobs[0]);
            release_jobs(h, jobs, n);
            req_fail(&e, 500, "server_error", "out_of_memory", NULL, "out of memory");
            return respond_error(h, mc, k->endpoint, &e);
        }
        *st = (stream){.h = h, .mc = mc, .n = n, .kind = kind, .include_usage = include_usage, .created = (long long)time(NULL),
                       .seed = seed, .t_last = strata_now(), .anth = anth};
        memcpy(st->jobs, jobs, (size_t)n * sizeof *jobs);
        snprintf(st->id, sizeof st->id, "%s", id);
        snprintf(st->model, sizeof st->model, "%s", model);
        fingerprint(h, st->fp, sizeof st->fp);
        MHD_add_response_header(resp, "Content-Type", "text/event-stream");
        MHD_add_response_header(resp, "Cache-Control", "no-cache");
        cors_headers(h, resp);
        enum MHD_Result ok = MHD_queue_response(mc, 200, resp);
        MHD_destroy_response(resp);
        return ok;
    }
    if (wait_jobs(h, mc, jobs, n)) {
        release_jobs(h, jobs, n);
        metrics_request(h->mt, k->endpoint, 499);
        return MHD_NO; /* closes the connection */
    }
    MHD_set_connection_option(mc, MHD_CONNECTION_OPTION_TIMEOUT, (unsigned)h->c.timeout_s);
    json_t *out = NULL;
    int status = 200;
    for (int i = 0; i < n && !out; i++)
        if (jobs[i]->err_status) {
            req_fail(&e, jobs[i]->err_status, jobs[i]->err_status < 500 ? "invalid_request_error" : "server_error", NULL, NULL, "%s",
                     jobs[i]->err_msg);
            status = e.status;
            out = anth ? anth_error_json(&e) : error_json(&e);
        }
    if (!out) {
        char fp[64];
        fingerprint(h, fp, sizeof fp);
        out = anth ? anth_message_json(jobs[0], id, model) : oai_answer(h->tk, kind, jobs, n, id, model, fp, seed);
    }
    release_jobs(h, jobs, n);
    return respond_json(h, mc, k->endpoint, status, out);
}

static enum MHD_Result do_tokenize(http_server *h, struct MHD_Connection *mc, conn *k) {
    request r;
    req_error e;
    const int kind = k->route == R_TOKENIZE ? REQ_TOKENIZE : REQ_DETOKENIZE;
    if (request_parse(&r, kind, (const uint8_t *)k->body.p, k->body.n, &e)) return respond_error(h, mc, k->endpoint, &e);
    if (model_ok(h, &r, &e)) { request_free(&r); return respond_error(h, mc, k->endpoint, &e); }
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
                return respond_error(h, mc, k->endpoint, &e);
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
    if (!out) return respond_error(h, mc, k->endpoint, &e);
    return respond_json(h, mc, k->endpoint, 200, out);
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
            cors_headers(h, r);
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
            return respond_error(h, mc, k->endpoint, &e);
        }
        /* two Content-Length headers that disagree: which body is meant is
         * ambiguous (request smuggling through a proxy): refused */
        cl_scan cs = {NULL, 0};
        MHD_get_connection_values(mc, MHD_HEADER_KIND, cl_each, &cs);
        if (cs.conflict) {
            req_fail(&e, 400, "invalid_request_error", "invalid_header", NULL, "the request has Content-Length headers that disagree");
            return respond_error(h, mc, k->endpoint, &e);
        }
        if (k->route == R_NONE) {
            req_fail(&e, 404, "invalid_request_error", "not_found", NULL, "no route for %.16s %.200s", method, url);
            return respond_error(h, mc, k->endpoint, &e);
        }
        if (!method_ok) {
            req_fail(&e, 405, "invalid_request_error", "method_not_allowed", NULL, "%.16s is not allowed on %.200s (allowed: %s)", method,
                     url, allow);
            return respond_json_hdr(h, mc, k->endpoint, 405, error_json(&e), "Allow", allow);
        }
        /* at the connection limit: 503, but /health and /metrics have a reserve */
        if (k->route != R_HEALTH && k->route != R_METRICS && n_serving(h, mc) >= h->c.max_conns) {
            req_fail(&e, 503, "server_error", "server_busy", NULL, "the server is serving %d connections, its limit; retry later",
                     h->c.max_conns);
            return respond_error(h, mc, k->endpoint, &e);
        }
        if (k->route != R_HEALTH && k->route != R_PAGE && k->route != R_METRICS && !key_ok(h, mc)) {
            req_fail(&e, 401, "invalid_request_error", "invalid_api_key", NULL, "a valid API key is required (Authorization: Bearer KEY)");
            return respond_error(h, mc, k->endpoint, &e);
        }
        /* a body that is not declared JSON: a browser's form post from another
         * site needs no preflight, so without --cors it is refused */
        const char *ct = MHD_lookup_connection_value(mc, MHD_HEADER_KIND, "Content-Type");
        if (!h->c.cors && !strcmp(method, "POST") && ct && strncasecmp(ct, "application/json", 16)) {
            req_fail(&e, 415, "invalid_request_error", "unsupported_media_type", NULL,
                     "the body must be JSON (Content-Type: application/json; got '%.100s')", ct);
            return respond_error(h, mc, k->endpoint, &e);
        }
        const char *cl = MHD_lookup_connection_value(mc, MHD_HEADER_KIND, "Content-Length");
        int64_t n;
        if (cl && (strata_parse_i64(cl, 0, INT64_MAX, &n) || (uint64_t)n > h->c.max_body)) {
            req_fail(&e, 413, "invalid_request_error", "body_too_large", NULL, "the request body is larger than %zu bytes", h->c.max_body);
            return respond_error(h, mc, k->endpoint, &e);
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
        return respond_json(h, mc, k->endpoint, state == 1 ? 200 : 503,
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
        return respond_json(h, mc, k->endpoint, 200, json_pack("{s:s,s:o}", "object", "list", "data", a));
    }
    case R_MODEL:
        if (!model_known(h, url + 11)) {
            req_fail(&e, 404, "invalid_request_error", "model_not_found", "model", "the model '%.200s' does not exist", url + 11);
            return respond_error(h, mc, k->endpoint, &e);
        }
        return respond_json(h, mc, k->endpoint, 200, model_json(h, url + 11));
    case R_SLOTS:
        if (state != 1) break;
        return respond_json(h, mc, k->endpoint, 200, sched_slots_json(h->s));
    default:
        break;
    }
    if (state != 1 && k->route != R_TOKENIZE && k->route != R_DETOKENIZE) {
        req_fail(&e, 503, "server_error", "loading", NULL, "the model is loading; GET /health says when it is ready");
        return respond_error(h, mc, k->endpoint, &e);
    }
    if (k->route == R_TOKENIZE || k->route == R_DETOKENIZE) return do_tokenize(h, mc, k);
    return do_generate(h, mc, k);
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
