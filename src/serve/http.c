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
};

enum { R_NONE, R_CHAT, R_COMPL, R_MODELS, R_MODEL, R_TOKENIZE, R_DETOKENIZE, R_HEALTH, R_METRICS, R_PAGE };

typedef struct conn {
    int route;
    const char *endpoint;  /* for metrics */
    req_buf body;
    int admitted;          /* counted in inflight until MHD completes the request */
} conn;

/* ===== small helpers ===== */

static enum MHD_Result respond_hdr(http_server *h, struct MHD_Connection *mc, const char *endpoint, int status,
                                   const char *ctype, const char *body, size_t len, const char *hname, const char *hval) {
    struct MHD_Response *r = MHD_create_response_from_buffer(len, (void *)body, MHD_RESPMEM_MUST_COPY);
    if (!r) return MHD_NO;
    MHD_add_response_header(r, "Content-Type", ctype);
    if (hname) MHD_add_response_header(r, hname, hval);
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
    return respond_json(h, mc, endpoint, e->status, error_json(e));
}

/* Constant-time comparison of the bearer token with the key. */
static int key_ok(const http_server *h, struct MHD_Connection *mc) {
    const char *want = h->c.api_key;
    if (!want || !*want) return 1;
    const char *auth = MHD_lookup_connection_value(mc, MHD_HEADER_KIND, "Authorization");
    if (!auth || strncasecmp(auth, "Bearer ", 7)) return 0;
    const char *got = auth + 7;
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

static int model_ok(const http_server *h, const request *r, req_error *e) {
    if (!r->model || !strcmp(r->model, h->c.model_id)) return 0;
    return req_fail(e, 404, "invalid_request_error", "model_not_found", "model",
                    "the model '%.200s' does not exist; this server serves '%.200s'", r->model, h->c.model_id);
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

/* Prompt ids of r (chat: the K3 template with the generation prompt). */
static int build_prompt(http_server *h, const request *r, job *j, req_error *e) {
    char err[512];
    int32_t *ids = NULL;
    size_t n = 0, cap = 0;
    if (r->kind == REQ_CHAT) {
        strata_chat_msg *m = strata_calloc(r->n_msgs, sizeof *m);
        if (!m) return req_fail(e, 500, "server_error", "out_of_memory", NULL, "out of memory");
        size_t calls = 0;
        for (size_t i = 0; i < r->n_msgs; i++) {
            const req_msg *q = &r->msgs[i];
            m[i] = (strata_chat_msg){.role = q->role, .content = q->content, .reasoning = q->reasoning, .calls = q->calls,
                                     .n_calls = q->n_calls, .call_of = q->call_of};
            calls += q->n_calls;
        }
        const strata_chat_tools tools = {r->tools, r->n_tools, r->tool_choice, r->tool_choice_name, r->parallel_tools};
        int rc = strata_chat_render_tools(h->tk, m, r->n_msgs, &tools, r->effort, STRATA_CHAT_GEN, &ids, &n, &cap, err, sizeof err);
        strata_free(m);
        if (rc) { strata_free(ids); return req_fail(e, rc == STRATA_EINVAL ? 400 : 500, rc == STRATA_EINVAL ? "invalid_request_error" : "server_error", NULL, "messages", "%s", err); }
        j->thinking = j->follow_from = r->effort != STRATA_CHAT_THINK_OFF;
        if (r->n_tools && r->tool_choice != STRATA_CHAT_TOOLS_NONE) {
            strata_chat_ids ci;
            const int forced = r->tool_choice == STRATA_CHAT_TOOLS_REQUIRED || r->tool_choice == STRATA_CHAT_TOOLS_NAMED;
            rc = strata_chat_ids_get(h->tk, &ci, err, sizeof err);
            if (!rc) rc = strata_tool_parser_open(&j->tp, ci.fmt, &tools, calls, err, sizeof err);
            if (rc) { strata_free(ids); return req_fail(e, 500, "server_error", NULL, NULL, "%s", err); }
            if (forced && ci.fmt == STRATA_CHAT_FMT_XTML) j->follow_from = 2; /* the prefill opened the tools channel */
        }
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

static job *make_job(http_server *h, const request *r, req_error *e) {
    job *j = job_new();
    if (!j) { req_fail(e, 500, "server_error", "out_of_memory", NULL, "out of memory"); return NULL; }
    j->kind = r->kind;
    if (build_prompt(h, r, j, e)) { job_release(NULL, j); return NULL; }
    strata_gen_opts go = r->go;
    go.max_tokens = r->max_tokens ? r->max_tokens : h->c.ctx - j->n_prompt;
    go.stop_at_end = 1;
    j->go = go;
    for (int i = 0; i < r->n_stop; i++) {
        memcpy(j->stop[i], r->stop[i], r->stop_len[i]);
        j->stop[i][r->stop_len[i]] = 0;
        j->stop_len[i] = r->stop_len[i];
    }
    j->n_stop = r->n_stop;
    return j;
}

/* OpenAI's usage, with the prompt tokens the prefix cache restored as
 * prompt_tokens_details.cached_tokens. */
static json_t *usage_json(const job *j) {
    return json_pack("{s:I,s:I,s:I,s:{s:I}}", "prompt_tokens", (json_int_t)j->n_prompt, "completion_tokens", (json_int_t)j->n_gen,
                     "total_tokens", (json_int_t)(j->n_prompt + j->n_gen), "prompt_tokens_details", "cached_tokens",
                     (json_int_t)j->n_cached);
}

/* ===== streaming ===== */

typedef struct stream {
    http_server *h;
    struct MHD_Connection *mc;
    job *j;
    int kind, include_usage, thinking;
    char id[48];
    long long created;
    int stage;                 /* 0 role chunk next, 1 text, 2 done ([DONE] queued) */
    size_t sent_content, sent_reasoning, sent_calls;
    req_buf out;
    size_t out_off;
} stream;

static json_t *chunk_base(const stream *st) {
    return json_pack("{s:s,s:s,s:I,s:s}", "id", st->id, "object", st->kind == REQ_CHAT ? "chat.completion.chunk" : "text_completion",
                     "created", (json_int_t)st->created, "model", st->h->c.model_id);
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
}

/* One chunk carrying delta text (chat: content or reasoning_content) or the finish reason. */
static void emit_choice(stream *st, const char *field, const char *text, size_t len, const char *finish) {
    json_t *c = chunk_base(st), *choice;
    if (st->kind == REQ_CHAT) {
        json_t *delta = json_object();
        if (field) json_object_set_new(delta, field, json_stringn(text, len));
        choice = json_pack("{s:i,s:o,s:n,s:o}", "index", 0, "delta", delta, "logprobs",
                           "finish_reason", finish ? json_string(finish) : json_null());
    } else {
        choice = json_pack("{s:s%,s:i,s:n,s:o}", "text", field ? text : "", field ? len : (size_t)0, "index", 0, "logprobs",
                           "finish_reason", finish ? json_string(finish) : json_null());
    }
    json_object_set_new(c, "choices", json_pack("[o]", choice));
    emit(st, c);
}

/* Moves whatever the job has produced since the last call into st->out. */
static void stream_collect(stream *st) {
    job *j = st->j;
    pthread_mutex_lock(&j->mu);
    for (;;) {
        const int fresh = j->content.n > st->sent_content || j->reasoning.n > st->sent_reasoning || j->n_calls > st->sent_calls;
        if (fresh || j->finished || st->stage == 0) break;
        wait_slice(j);
        if (peer_gone(st->mc)) {
            pthread_mutex_unlock(&j->mu);
            sched_cancel(st->h->s, j);
            st->out.oom = 1; /* the caller ends the stream with an error */
            return;
        }
    }
    const int finished = j->finished;
    if (st->stage == 0) {
        st->stage = 1;
        if (st->kind == REQ_CHAT) {
            json_t *c = chunk_base(st);
            json_t *choice = json_pack("{s:i,s:{s:s,s:s},s:n,s:n}", "index", 0, "delta", "role", "assistant", "content", "",
                                       "logprobs", "finish_reason");
            json_object_set_new(c, "choices", json_pack("[o]", choice));
            emit(st, c);
        }
    }
    if (j->reasoning.n > st->sent_reasoning) {
        emit_choice(st, "reasoning_content", j->reasoning.p + st->sent_reasoning, j->reasoning.n - st->sent_reasoning, NULL);
        st->sent_reasoning = j->reasoning.n;
    }
    if (j->content.n > st->sent_content) {
        emit_choice(st, st->kind == REQ_CHAT ? "content" : "text", j->content.p + st->sent_content, j->content.n - st->sent_content, NULL);
        st->sent_content = j->content.n;
    }
    for (; st->sent_calls < j->n_calls; st->sent_calls++) { /* a call: its head, then its arguments */
        const size_t i = st->sent_calls;
        char cid[64];
        snprintf(cid, sizeof cid, "%s_%zu", j->call_id, i);
        for (int part = 0; part < 2; part++) {
            json_t *c = chunk_base(st);
            json_t *call = part ? json_pack("{s:I,s:{s:s}}", "index", (json_int_t)i, "function", "arguments", j->call_args[i])
                                : json_pack("{s:I,s:s,s:s,s:{s:s,s:s}}", "index", (json_int_t)i, "id", cid, "type", "function",
                                            "function", "name", j->call_name[i], "arguments", "");
            json_t *choice = json_pack("{s:i,s:{s:[o]},s:n,s:n}", "index", 0, "delta", "tool_calls", call, "logprobs", "finish_reason");
            json_object_set_new(c, "choices", json_pack("[o]", choice));
            emit(st, c);
        }
    }
    if (finished) {
        if (j->err_status) {
            req_error e;
            req_fail(&e, j->err_status, "server_error", NULL, NULL, "%s", j->err_msg);
            json_t *ej = error_json(&e);
            char *txt = ej ? json_dumps(ej, JSON_COMPACT) : NULL;
            json_decref(ej);
            if (txt) { req_buf_addf(&st->out, "data: %s\n\n", txt); strata_free(txt); }
        } else {
            emit_choice(st, NULL, NULL, 0, j->finish_reason);
            if (st->include_usage) {
                json_t *c = chunk_base(st);
                json_object_set_new(c, "choices", json_array());
                json_object_set_new(c, "usage", usage_json(j));
                emit(st, c);
            }
        }
        req_buf_add(&st->out, "data: [DONE]\n\n", 14);
        st->stage = 2;
        metrics_request(st->h->mt, st->kind == REQ_CHAT ? "/v1/chat/completions" : "/v1/completions", j->err_status ? j->err_status : 200);
    }
    pthread_mutex_unlock(&j->mu);
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
        sched_cancel(st->h->s, st->j);
        metrics_request(st->h->mt, st->kind == REQ_CHAT ? "/v1/chat/completions" : "/v1/completions", 499);
    }
    job_release(st->h->s, st->j);
    req_buf_free(&st->out);
    strata_free(st);
}

/* ===== endpoints ===== */

static enum MHD_Result do_generate(http_server *h, struct MHD_Connection *mc, conn *k) {
    request r;
    req_error e;
    const int kind = k->route == R_CHAT ? REQ_CHAT : REQ_COMPLETION;
    if (request_parse(&r, kind, (const uint8_t *)k->body.p, k->body.n, &e)) return respond_error(h, mc, k->endpoint, &e);
    job *j = NULL;
    if (model_ok(h, &r, &e) || !(j = make_job(h, &r, &e)) || sched_submit(h->s, j, &e)) {
        job_release(NULL, j);
        request_free(&r);
        return respond_error(h, mc, k->endpoint, &e);
    }
    /* admitted: generation may take longer than the idle timeout */
    MHD_set_connection_option(mc, MHD_CONNECTION_OPTION_TIMEOUT, 0);
    k->admitted = 1;
    atomic_fetch_add(&h->inflight, 1);
    const int stream_mode = r.stream, include_usage = r.include_usage;
    request_free(&r);
    char id[48];
    new_id(h, kind == REQ_CHAT ? "chatcmpl" : "cmpl", id, sizeof id);
    if (stream_mode) {
        stream *st = strata_calloc(1, sizeof *st);
        struct MHD_Response *resp = st ? MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 4096, stream_read, st, stream_free) : NULL;
        if (!resp) {
            strata_free(st);
            sched_cancel(h->s, j);
            job_release(h->s, j);
            req_fail(&e, 500, "server_error", "out_of_memory", NULL, "out of memory");
            return respond_error(h, mc, k->endpoint, &e);
        }
        *st = (stream){.h = h, .mc = mc, .j = j, .kind = kind, .include_usage = include_usage, .thinking = j->thinking,
                       .created = (long long)time(NULL)};
        snprintf(st->id, sizeof st->id, "%s", id);
        MHD_add_response_header(resp, "Content-Type", "text/event-stream");
        MHD_add_response_header(resp, "Cache-Control", "no-cache");
        enum MHD_Result ok = MHD_queue_response(mc, 200, resp);
        MHD_destroy_response(resp);
        return ok;
    }
    /* wait for the whole answer, watching the socket */
    pthread_mutex_lock(&j->mu);
    while (!j->finished) {
        wait_slice(j);
        if (!j->finished && peer_gone(mc)) {
            pthread_mutex_unlock(&j->mu);
            sched_cancel(h->s, j);
            job_release(h->s, j);
            metrics_request(h->mt, k->endpoint, 499);
            return MHD_NO; /* closes the connection */
        }
    }
    pthread_mutex_unlock(&j->mu);
    MHD_set_connection_option(mc, MHD_CONNECTION_OPTION_TIMEOUT, (unsigned)h->c.timeout_s);
    json_t *out;
    int status = 200;
    if (j->err_status) {
        req_fail(&e, j->err_status, j->err_status < 500 ? "invalid_request_error" : "server_error", NULL, NULL, "%s", j->err_msg);
        status = e.status;
        out = error_json(&e);
    } else {
        json_t *choice;
        if (kind == REQ_CHAT) {
            json_t *msg = json_pack("{s:s,s:s%}", "role", "assistant", "content", j->content.p ? j->content.p : "", j->content.n);
            if (j->n_calls) {
                json_t *a = json_array();
                for (size_t i = 0; i < j->n_calls; i++) {
                    char cid[64];
                    snprintf(cid, sizeof cid, "%s_%zu", j->call_id, i);
                    json_array_append_new(a, json_pack("{s:s,s:s,s:{s:s,s:s}}", "id", cid, "type", "function", "function",
                                                       "name", j->call_name[i], "arguments", j->call_args[i]));
                }
                json_object_set_new(msg, "tool_calls", a);
                if (!j->content.n) json_object_set_new(msg, "content", json_null());
            }
            if (j->thinking)
                json_object_set_new(msg, "reasoning_content", json_stringn(j->reasoning.p ? j->reasoning.p : "", j->reasoning.n));
            choice = json_pack("{s:i,s:o,s:n,s:s}", "index", 0, "message", msg, "logprobs", "finish_reason", j->finish_reason);
        } else {
            choice = json_pack("{s:s%,s:i,s:n,s:s}", "text", j->content.p ? j->content.p : "", j->content.n, "index", 0,
                               "logprobs", "finish_reason", j->finish_reason);
        }
        out = json_pack("{s:s,s:s,s:I,s:s,s:[o],s:o}", "id", id, "object", kind == REQ_CHAT ? "chat.completion" : "text_completion",
                        "created", (json_int_t)time(NULL), "model", h->c.model_id, "choices", choice, "usage", usage_json(j));
    }
    job_release(h->s, j);
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

static json_t *model_json(const http_server *h) {
    return json_pack("{s:s,s:s,s:I,s:s,s:I}", "id", h->c.model_id, "object", "model", "created", (json_int_t)0, "owned_by", "strata",
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
        {"/metrics", "GET", R_METRICS},           {"/", "GET", R_PAGE},
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
    case R_MODELS:
        return respond_json(h, mc, k->endpoint, 200, json_pack("{s:s,s:[o]}", "object", "list", "data", model_json(h)));
    case R_MODEL:
        if (strcmp(url + 11, h->c.model_id)) {
            req_fail(&e, 404, "invalid_request_error", "model_not_found", "model", "the model '%.200s' does not exist", url + 11);
            return respond_error(h, mc, k->endpoint, &e);
        }
        return respond_json(h, mc, k->endpoint, 200, model_json(h));
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
