/*
 * anthropic.c: the Messages API (see anthropic.h).
 */
#include "anthropic.h"

#include <math.h>
#include <string.h>

#define BAD(e, param, ...) req_fail(e, 400, "invalid_request_error", "invalid_value", param, __VA_ARGS__)

/* ===== requests ===== */

/* One content block into the message being built: its text is appended to the
 * content (text) or the reasoning (thinking). A new block type is one row. */
typedef int (*block_fn)(request *r, req_msg *m, const json_t *blk, req_buf *text, req_buf *think, req_error *e);

static int str_field(const json_t *blk, const char *name, const char **out, req_error *e) {
    const json_t *v = json_object_get(blk, name);
    if (!json_is_string(v) || strlen(json_string_value(v)) != json_string_length(v))
        return BAD(e, "messages.content", "a '%s' block needs a string '%s' without NUL characters",
                   json_string_value(json_object_get(blk, "type")), name);
    *out = json_string_value(v);
    return 0;
}

static int blk_text(request *r, req_msg *m, const json_t *blk, req_buf *text, req_buf *think, req_error *e) {
    const char *t;
    if (str_field(blk, "text", &t, e)) return -1;
    req_buf_add(text, t, strlen(t));
    return 0;
}

static int blk_thinking(request *r, req_msg *m, const json_t *blk, req_buf *text, req_buf *think, req_error *e) {
    const char *t;
    if (m->role != STRATA_CHAT_ASSISTANT) return BAD(e, "messages.content", "'thinking' blocks belong to assistant messages");
    if (str_field(blk, "thinking", &t, e)) return -1;
    req_buf_add(think, t, strlen(t));
    return 0;
}

static const struct { const char *type; block_fn fn; } k_blocks[] = {
    {"text", blk_text},
    {"thinking", blk_thinking},
    {"redacted_thinking", NULL}, /* dropped: nothing to render */
};

/* Keeps a joined string for the request's lifetime (r->parts). */
static int keep(request *r, req_buf *b, const char **out, req_error *e) {
    req_buf_add(b, "", 0);
    char **np = strata_realloc(r->parts, (r->n_parts + 1) * sizeof *np);
    if (b->oom || !np) {
        if (np) r->parts = np;
        req_buf_free(b);
        return req_fail(e, 500, "api_error", "out_of_memory", NULL, "out of memory");
    }
    r->parts = np;
    r->parts[r->n_parts++] = b->p;
    *out = b->p;
    memset(b, 0, sizeof *b);
    return 0;
}

/* content: a string or a list of blocks, into m. */
static int parse_content(request *r, req_msg *m, const json_t *v, req_error *e) {
    if (json_is_string(v)) {
        if (strlen(json_string_value(v)) != json_string_length(v)) return BAD(e, "messages.content", "content must not contain NUL characters");
        m->content = json_string_value(v);
        return 0;
    }
    if (!json_is_array(v)) return BAD(e, "messages.content", "content must be a string or a list of content blocks");
    req_buf text = {0}, think = {0};
    size_t i;
    const json_t *blk;
    int rc = 0, have_think = 0;
    json_array_foreach(v, i, blk) {
        const json_t *ty = json_object_get(blk, "type");
        if (!json_is_object(blk) || !json_is_string(ty)) { rc = BAD(e, "messages.content", "content blocks must be objects with a 'type'"); break; }
        size_t k = 0;
        while (k < sizeof k_blocks / sizeof *k_blocks && strcmp(k_blocks[k].type, json_string_value(ty))) k++;
        if (k == sizeof k_blocks / sizeof *k_blocks) {
            rc = req_fail(e, 400, "invalid_request_error", "unsupported_parameter", "messages.content",
                          "content blocks of type '%s' are not supported", json_string_value(ty));
            break;
        }
        have_think |= !strcmp(k_blocks[k].type, "thinking");
        if (k_blocks[k].fn && (rc = k_blocks[k].fn(r, m, blk, &text, &think, e))) break;
    }
    if (!rc) rc = keep(r, &text, &m->content, e);
    if (!rc && have_think) rc = keep(r, &think, &m->reasoning, e);
    req_buf_free(&text);
    req_buf_free(&think);
    return rc;
}

static int parse_msgs(request *r, const json_t *sys, const json_t *v, req_error *e) {
    if (!json_is_array(v) || !json_array_size(v)) return BAD(e, "messages", "'messages' must be a non-empty array");
    if (json_array_size(v) + 1 > REQ_MAX_MSGS) return BAD(e, "messages", "'messages' has more than %d entries", REQ_MAX_MSGS - 1);
    r->msgs = strata_calloc(json_array_size(v) + 1, sizeof *r->msgs);
    if (!r->msgs) return req_fail(e, 500, "api_error", "out_of_memory", NULL, "out of memory");
    if (sys) {
        req_msg *m = &r->msgs[r->n_msgs++];
        m->role = STRATA_CHAT_SYSTEM;
        if (parse_content(r, m, sys, e)) { e->param[0] = 0; snprintf(e->param, sizeof e->param, "system"); return -1; }
        if (m->reasoning) return BAD(e, "system", "'system' takes text blocks only");
    }
    size_t i;
    const json_t *o;
    json_array_foreach(v, i, o) {
        const json_t *role = json_object_get(o, "role"), *content = json_object_get(o, "content");
        if (!json_is_object(o) || !json_is_string(role)) return BAD(e, "messages.role", "messages[%zu] needs a 'role'", i);
        const char *k;
        json_t *f;
        json_object_foreach((json_t *)o, k, f)
            if (strcmp(k, "role") && strcmp(k, "content")) return BAD(e, "messages", "messages[%zu]: unknown field '%s'", i, k);
        req_msg *m = &r->msgs[r->n_msgs];
        const char *rs = json_string_value(role);
        if (!strcmp(rs, "user")) m->role = STRATA_CHAT_USER;
        else if (!strcmp(rs, "assistant")) m->role = STRATA_CHAT_ASSISTANT;
        else return BAD(e, "messages.role", "messages[%zu].role '%s' is not user or assistant", i, rs);
        if (!content) return BAD(e, "messages.content", "messages[%zu] has no 'content'", i);
        if (parse_content(r, m, content, e)) return -1;
        r->n_msgs++;
    }
    return 0;
}

/* thinking: {"type":"enabled","budget_tokens":N} -> the effort whose thinking
 * fits the budget best (K3 names levels, not budgets); {"type":"disabled"}. */
static int parse_thinking(request *r, const json_t *v, req_error *e) {
    const json_t *ty = json_object_get(v, "type");
    if (!json_is_object(v) || !json_is_string(ty)) return BAD(e, "thinking", "'thinking' must be an object with a 'type'");
    if (!strcmp(json_string_value(ty), "disabled")) { r->effort = STRATA_CHAT_THINK_OFF; return 0; }
    if (strcmp(json_string_value(ty), "enabled")) return BAD(e, "thinking", "thinking.type must be enabled or disabled");
    int64_t b;
    if (strata_json_int(json_object_get(v, "budget_tokens"), &b) || b < 1)
        return BAD(e, "thinking.budget_tokens", "thinking.budget_tokens must be a positive integer");
    r->effort = b < 4096 ? STRATA_CHAT_THINK_LOW : b < 32768 ? STRATA_CHAT_THINK_HIGH : STRATA_CHAT_THINK_MAX;
    return 0;
}

static int param(const json_t *v, const char *name, enum strata_param p, double *out, req_error *e) {
    char msg[256];
    double x;
    if (strata_json_num(v, &x) || !isfinite(x) || json_is_boolean(v)) return BAD(e, name, "'%s' must be a number", name);
    if (strata_param_check(p, x, msg, sizeof msg)) return BAD(e, name, "%s", msg);
    *out = x;
    return 0;
}

static int body_field(request *r, const char *key, const json_t *f, const json_t **msgs, const json_t **sys, req_error *e) {
    int64_t x;
    double d;
    if (!strcmp(key, "model")) {
        if (!json_is_string(f)) return BAD(e, key, "'model' must be a string");
        r->model = json_string_value(f);
    } else if (!strcmp(key, "messages")) *msgs = f;
    else if (!strcmp(key, "system")) *sys = f;
    else if (!strcmp(key, "max_tokens")) {
        if (strata_json_int(f, &x) || json_is_boolean(f) || x < 1 || x > ((int64_t)1 << 32)) return BAD(e, key, "'max_tokens' must be a positive integer");
        r->max_tokens = x;
    } else if (!strcmp(key, "temperature")) {
        if (param(f, key, STRATA_PARAM_TEMP, &r->go.temp, e)) return -1;
        if (r->go.temp > 1) return BAD(e, key, "'temperature' must be in [0, 1]");
        r->has_temp = 1;
    } else if (!strcmp(key, "top_p")) {
        if (param(f, key, STRATA_PARAM_TOP_P, &r->go.top_p, e)) return -1;
        r->has_top_p = 1;
    } else if (!strcmp(key, "top_k")) {
        if (param(f, key, STRATA_PARAM_TOP_K, &d, e)) return -1;
        r->go.top_k = (int64_t)d;
    } else if (!strcmp(key, "stop_sequences")) {
        if (!json_is_array(f) || json_array_size(f) > REQ_MAX_STOP) return BAD(e, key, "'stop_sequences' must be a list of at most %d strings", REQ_MAX_STOP);
        for (size_t i = 0; i < json_array_size(f); i++) {
            const json_t *s = json_array_get(f, i);
            if (!json_is_string(s) || !json_string_length(s) || json_string_length(s) > REQ_MAX_STOP_BYTES)
                return BAD(e, key, "stop_sequences must be non-empty strings of at most %d bytes", REQ_MAX_STOP_BYTES);
            r->stop[r->n_stop] = json_string_value(s);
            r->stop_len[r->n_stop++] = json_string_length(s);
        }
    } else if (!strcmp(key, "stream")) {
        if (!json_is_boolean(f)) return BAD(e, key, "'stream' must be true or false");
        r->stream = json_is_true(f);
    } else if (!strcmp(key, "metadata")) {
        if (!json_is_object(f)) return BAD(e, key, "'metadata' must be an object");
    } else if (!strcmp(key, "thinking")) {
        return parse_thinking(r, f, e);
    } else if (!strcmp(key, "tools")) {
        if (!json_is_array(f) || json_array_size(f))
            return req_fail(e, 400, "invalid_request_error", "unsupported_parameter", key, "'tools' is not supported (only an empty list)");
    } else if (!strcmp(key, "tool_choice")) {
        const json_t *t = json_object_get(f, "type");
        if (!json_is_string(t) || (strcmp(json_string_value(t), "none") && strcmp(json_string_value(t), "auto")))
            return req_fail(e, 400, "invalid_request_error", "unsupported_parameter", key, "'tool_choice' is not supported without tools");
    } else if (!strcmp(key, "service_tier")) {
        if (!json_is_string(f)) return BAD(e, key, "'service_tier' must be a string");
    } else {
        return BAD(e, key, "unknown field '%s'", key);
    }
    return 0;
}

int anth_parse(request *r, const uint8_t *body, size_t len, req_error *e) {
    char err[256];
    memset(r, 0, sizeof *r);
    memset(e, 0, sizeof *e);
    r->kind = REQ_CHAT;
    r->go = strata_gen_opts_default();
    r->effort = STRATA_CHAT_THINK_OFF; /* Anthropic: no thinking unless asked */
    r->n = 1;
    strata_json_parse(&r->root, body, len, "request body", err, sizeof err);
    if (!r->root) return req_fail(e, 400, "invalid_request_error", "invalid_json", NULL, "%s", err);
    if (!json_is_object(r->root)) { request_free(r); return BAD(e, NULL, "the request body must be a JSON object"); }
    const char *key;
    json_t *f;
    const json_t *msgs = NULL, *sys = NULL;
    int rc = 0;
    json_object_foreach(r->root, key, f) {
        if (json_is_null(f)) continue;
        if ((rc = body_field(r, key, f, &msgs, &sys, e))) break;
    }
    if (!rc && !r->max_tokens) rc = BAD(e, "max_tokens", "'max_tokens' is required");
    if (!rc && !msgs) rc = BAD(e, "messages", "'messages' is required");
    if (!rc) rc = parse_msgs(r, sys, msgs, e);
    if (rc) { request_free(r); return -1; }
    return 0;
}

/* ===== answers ===== */

json_t *anth_error_json(const req_error *e) {
    const char *t = e->status == 401 ? "authentication_error" : e->status == 403 ? "permission_error" : e->status == 404 ? "not_found_error"
                    : e->status == 413 ? "request_too_large" : e->status == 429 ? "rate_limit_error" : e->status == 503 ? "overloaded_error"
                    : e->status >= 500 ? "api_error" : "invalid_request_error";
    return json_pack("{s:s,s:{s:s,s:s}}", "type", "error", "error", "type", t, "message", e->message);
}

static const char *stop_reason(const job *j) {
    if (j->finish_reason && !strcmp(j->finish_reason, "length")) return "max_tokens";
    return j->stop_hit >= 0 ? "stop_sequence" : "end_turn";
}

static json_t *stop_seq(const job *j) {
    return j->stop_hit >= 0 && j->finish_reason && !strcmp(j->finish_reason, "stop") ? json_string(j->stop[j->stop_hit]) : json_null();
}

static json_t *usage(const job *j, int64_t out) {
    return json_pack("{s:I,s:I,s:I,s:I}", "input_tokens", (json_int_t)(j->n_prompt - j->n_cached), "cache_read_input_tokens",
                     (json_int_t)j->n_cached, "cache_creation_input_tokens", (json_int_t)0, "output_tokens", (json_int_t)out);
}

json_t *anth_message_json(const job *j, const char *id, const char *model) {
    json_t *content = json_array();
    if (j->thinking)
        json_array_append_new(content, json_pack("{s:s,s:s%,s:s}", "type", "thinking", "thinking", j->reasoning.p ? j->reasoning.p : "",
                                                 j->reasoning.n, "signature", ""));
    json_array_append_new(content, json_pack("{s:s,s:s%}", "type", "text", "text", j->content.p ? j->content.p : "", j->content.n));
    return json_pack("{s:s,s:s,s:s,s:s,s:o,s:s,s:o,s:o}", "id", id, "type", "message", "role", "assistant", "model", model,
                     "content", content, "stop_reason", stop_reason(j), "stop_sequence", stop_seq(j), "usage", usage(j, j->n_gen));
}

/* ===== stream events ===== */

static void event(req_buf *out, const char *name, json_t *data) {
    char *txt = data ? json_dumps(data, JSON_COMPACT) : NULL;
    json_decref(data);
    if (!txt) { out->oom = 1; return; }
    req_buf_addf(out, "event: %s\ndata: ", name);
    req_buf_add(out, txt, strlen(txt));
    req_buf_add(out, "\n\n", 2);
    strata_free(txt);
}

static void block_stop(anth_stream *a, req_buf *out) {
    if (a->block < 0) return;
    event(out, "content_block_stop", json_pack("{s:s,s:i}", "type", "content_block_stop", "index", a->block));
    a->block = -1;
}

/* Opens a block of kind (1 thinking, 2 text) unless it is the open one. */
static void block_open(anth_stream *a, int kind, req_buf *out) {
    if (a->block >= 0 && a->block_kind == kind) return;
    block_stop(a, out);
    a->block = a->n_blocks++;
    a->block_kind = kind;
    json_t *cb = kind == 1 ? json_pack("{s:s,s:s,s:s}", "type", "thinking", "thinking", "", "signature", "")
                           : json_pack("{s:s,s:s}", "type", "text", "text", "");
    event(out, "content_block_start", json_pack("{s:s,s:i,s:o}", "type", "content_block_start", "index", a->block, "content_block", cb));
}

static void delta(anth_stream *a, int kind, const char *p, size_t n, req_buf *out) {
    block_open(a, kind, out);
    json_t *d = kind == 1 ? json_pack("{s:s,s:s%}", "type", "thinking_delta", "thinking", p, n)
                          : json_pack("{s:s,s:s%}", "type", "text_delta", "text", p, n);
    event(out, "content_block_delta", json_pack("{s:s,s:i,s:o}", "type", "content_block_delta", "index", a->block, "delta", d));
}

void anth_stream_events(anth_stream *a, const job *j, const char *id, const char *model, req_buf *out) {
    if (a->done) return;
    if (!a->started) {
        a->started = 1;
        a->block = -1;
        json_t *msg = json_pack("{s:s,s:s,s:s,s:s,s:[],s:n,s:n,s:o}", "id", id, "type", "message", "role", "assistant", "model", model,
                                "content", "stop_reason", "stop_sequence", "usage", usage(j, 0));
        event(out, "message_start", json_pack("{s:s,s:o}", "type", "message_start", "message", msg));
    }
    if (j->reasoning.n > a->sent_reasoning) {
        delta(a, 1, j->reasoning.p + a->sent_reasoning, j->reasoning.n - a->sent_reasoning, out);
        a->sent_reasoning = j->reasoning.n;
    }
    if (j->content.n > a->sent_content) {
        delta(a, 2, j->content.p + a->sent_content, j->content.n - a->sent_content, out);
        a->sent_content = j->content.n;
    }
    if (!j->finished) return;
    a->done = 1;
    if (j->err_status) {
        req_error e;
        req_fail(&e, j->err_status, "", NULL, NULL, "%s", j->err_msg);
        event(out, "error", anth_error_json(&e));
        return;
    }
    if (a->n_blocks == 0) block_open(a, 2, out); /* an answer has a text block, even an empty one */
    block_stop(a, out);
    event(out, "message_delta", json_pack("{s:s,s:{s:s,s:o},s:{s:I}}", "type", "message_delta", "delta", "stop_reason", stop_reason(j),
                                          "stop_sequence", stop_seq(j), "usage", "output_tokens", (json_int_t)j->n_gen));
    event(out, "message_stop", json_pack("{s:s}", "type", "message_stop"));
}
