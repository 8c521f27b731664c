/*
 * http_gen.c: the generation endpoints of `strata serve` (/v1/chat/completions,
 * /v1/completions, /v1/messages), called by http.c's router with the whole body:
 * parse -> render/tokenize -> check limits -> submit; then either wait here and
 * answer one JSON document, or answer an SSE stream whose content callback waits
 * for the job's text. Apart from http.c because it is the one part that knows
 * jobs, prompts, seeds and streaming; http.c knows connections and routes.
 */
#include "http.h"
#include "http_priv.h"

#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <time.h>
#include "anthropic.h"
#include "oai.h"

#define WAIT_SLICE_MS 25 /* how often a waiting thread looks at its socket */

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
        json_t *ej = http_error_json(&e);
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

/* ===== generation endpoints ===== */

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

enum MHD_Result http_generate(http_server *h, struct MHD_Connection *mc, conn *k) {
    request r;
    req_error e;
    const int anth = k->route == R_MESSAGES, kind = k->route == R_COMPL ? REQ_COMPLETION : REQ_CHAT;
    if (anth ? anth_parse(&r, (const uint8_t *)k->body.p, k->body.n, &e) : request_parse(&r, kind, (const uint8_t *)k->body.p, k->body.n, &e))
        return http_respond_error(h, mc, k->endpoint, &e);
    char id[48], model[256];
    new_id(h, anth ? "msg" : kind == REQ_CHAT ? "chatcmpl" : "cmpl", id, sizeof id);
    snprintf(model, sizeof model, "%s", r.model ? r.model : h->c.model_ids[0]);
    job *jobs[REQ_MAX_N];
    int n = 0;
    uint64_t seed = 0;
    if (http_model_ok(h, &r, &e) || make_jobs(h, &r, id, jobs, &n, &seed, &e) || sched_submit(h->s, jobs[0], &e)) {
        release_jobs(h, jobs, n);
        request_free(&r);
        return http_respond_error(h, mc, k->endpoint, &e);
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
            return http_respond_error(h, mc, k->endpoint, &e);
        }
        *st = (stream){.h = h, .mc = mc, .n = n, .kind = kind, .include_usage = include_usage, .created = (long long)time(NULL),
                       .seed = seed, .t_last = strata_now(), .anth = anth};
        memcpy(st->jobs, jobs, (size_t)n * sizeof *jobs);
        snprintf(st->id, sizeof st->id, "%s", id);
        snprintf(st->model, sizeof st->model, "%s", model);
        fingerprint(h, st->fp, sizeof st->fp);
        MHD_add_response_header(resp, "Content-Type", "text/event-stream");
        MHD_add_response_header(resp, "Cache-Control", "no-cache");
        http_cors_headers(h, resp);
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
            out = anth ? anth_error_json(&e) : http_error_json(&e);
        }
    if (!out) {
        char fp[64];
        fingerprint(h, fp, sizeof fp);
        out = anth ? anth_message_json(jobs[0], id, model) : oai_answer(h->tk, kind, jobs, n, id, model, fp, seed);
    }
    release_jobs(h, jobs, n);
    return http_respond_json(h, mc, k->endpoint, status, out);
}
