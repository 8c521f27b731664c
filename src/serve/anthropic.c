/*
 * anthropic.c: the Messages API (see anthropic.h).
 */
#include "anthropic.h"

#include <math.h>
#include <string.h>

#define BAD(e, param, ...) req_fail(e, 400, "invalid_request_error", "invalid_value", param, __VA_ARGS__)

/* ===== requests ===== */

#define OOM(e) req_fail(e, 500, "api_error", "out_of_memory", NULL, "out of memory")

/* One message being parsed: text and thinking blocks are joined; an assistant's
 * tool_use blocks become its calls (the slot r->msgs[r->n_msgs], so request_free
 * frees them on any error); a user's tool_result blocks become tool messages
 * placed before it, in order (Anthropic puts results first in the turn; text
 * after them becomes the user message that follows). */
typedef struct msg_ctx {
    request *r;
    req_msg *m;      /* the message itself (assistant: its slot; user, system: a local) */
    size_t i;        /* its index in 'messages' (errors) */
    req_buf text, think;
    int have_think, n_results;
} msg_ctx;

/* A content block type; a new type is one row. */
typedef int (*block_fn)(msg_ctx *c, const json_t *blk, req_error *e);

static int str_field(const json_t *blk, const char *name, const char **out, req_error *e) {
    const json_t *v = json_object_get(blk, name);
    if (!json_is_string(v) || strlen(json_string_value(v)) != json_string_length(v))
        return BAD(e, "messages.content", "a '%s' block needs a string '%s' without NUL characters",
                   json_string_value(json_object_get(blk, "type")), name);
    *out = json_string_value(v);
    return 0;
}

static int blk_text(msg_ctx *c, const json_t *blk, req_error *e) {
    const char *t;
    if (str_field(blk, "text", &t, e)) return -1;
    req_buf_add(&c->text, t, strlen(t));
    return 0;
}

static int blk_thinking(msg_ctx *c, const json_t *blk, req_error *e) {
    const char *t;
    if (c->m->role != STRATA_CHAT_ASSISTANT) return BAD(e, "messages.content", "'thinking' blocks belong to assistant messages");
    if (str_field(blk, "thinking", &t, e)) return -1;
    req_buf_add(&c->think, t, strlen(t));
    c->have_think = 1;
    return 0;
}

/* {type: tool_use, id, name, input: object} -> a call (arguments: input as
 * compact JSON; its id names it for the tool_result blocks that follow). */
static int blk_tool_use(msg_ctx *c, const json_t *blk, req_error *e) {
    req_msg *m = c->m;
    const char *id, *name;
    if (m->role != STRATA_CHAT_ASSISTANT) return BAD(e, "messages.content", "'tool_use' blocks belong to assistant messages");
    if (str_field(blk, "id", &id, e) || str_field(blk, "name", &name, e)) return -1;
    if (!req_tool_name_ok(name))
        return BAD(e, "messages.content", "messages[%zu]: tool_use name '%.64s' must be 1-64 of A-Z a-z 0-9 _ -", c->i, name);
    const json_t *in = json_object_get(blk, "input");
    if (!json_is_object(in)) return BAD(e, "messages.content", "messages[%zu]: tool_use '%.64s' needs an 'input' object", c->i, id);
    char *args = json_dumps(in, JSON_COMPACT);
    if (req_own(c->r, args, e)) return -1;
    m->calls[m->n_calls] = (strata_chat_call){name, args};
    m->call_ids[m->n_calls++] = id;
    return 0;
}

/* {type: tool_result, tool_use_id, content?: string | text blocks, is_error?}
 * -> a tool message answering that call (is_error: its text after "Error: "). */
static int blk_tool_result(msg_ctx *c, const json_t *blk, req_error *e) {
    request *r = c->r;
    const char *id;
    if (c->m->role != STRATA_CHAT_USER) return BAD(e, "messages.content", "'tool_result' blocks belong to user messages");
    if (str_field(blk, "tool_use_id", &id, e)) return -1;
    const size_t call = req_find_call(r, r->n_msgs, id);
    if (call == (size_t)-1)
        return BAD(e, "messages.content", "messages[%zu]: tool_result's tool_use_id '%.64s' names no tool_use block of an earlier "
                   "assistant message", c->i, id);
    const json_t *err = json_object_get(blk, "is_error"), *v = json_object_get(blk, "content");
    if (err && !json_is_boolean(err) && !json_is_null(err)) return BAD(e, "messages.content", "tool_result.is_error must be true or false");
    if (v && !json_is_null(v) && !json_is_string(v) && !json_is_array(v))
        return BAD(e, "messages.content", "tool_result content must be a string or a list of text blocks");
    req_buf b = {0};
    if (json_is_true(err)) req_buf_add(&b, "Error: ", 7);
    if (json_is_string(v)) {
        if (strlen(json_string_value(v)) != json_string_length(v)) { req_buf_free(&b); return BAD(e, "messages.content", "tool_result content must not contain NUL characters"); }
        req_buf_add(&b, json_string_value(v), json_string_length(v));
    } else if (json_is_array(v)) {
        size_t k;
        const json_t *p;
        json_array_foreach(v, k, p) {
            const char *t;
            const json_t *ty = json_object_get(p, "type");
            if (!json_is_string(ty) || strcmp(json_string_value(ty), "text")) {
                req_buf_free(&b);
                return req_fail(e, 400, "invalid_request_error", "unsupported_parameter", "messages.content",
                                "tool_result content blocks of type '%s' are not supported (text only)",
                                json_is_string(ty) ? json_string_value(ty) : "?");
            }
            if (str_field(p, "text", &t, e)) { req_buf_free(&b); return -1; }
            req_buf_add(&b, t, strlen(t));
        }
    }
    req_msg *t = &r->msgs[r->n_msgs];
    t->role = STRATA_CHAT_TOOL;
    t->call_of = call;
    req_buf_add(&b, "", 0);
    if (b.oom) { req_buf_free(&b); return OOM(e); }
    if (req_own(r, b.p, e)) return -1;
    t->content = b.p;
    r->n_msgs++;
    c->n_results++;
    return 0;
}

static const struct { const char *type; block_fn fn; } k_blocks[] = {
    {"text", blk_text},
    {"thinking", blk_thinking},
    {"redacted_thinking", NULL}, /* dropped: nothing to render */
    {"tool_use", blk_tool_use},
    {"tool_result", blk_tool_result},
};

/* Keeps a joined string for the request's lifetime (r->parts). */
static int keep(request *r, req_buf *b, const char **out, req_error *e) {
    req_buf_add(b, "", 0);
    if (b->oom) { req_buf_free(b); return OOM(e); }
    if (req_own(r, b->p, e)) { memset(b, 0, sizeof *b); return -1; }
    *out = b->p;
    memset(b, 0, sizeof *b);
    return 0;
}

static int n_blocks_of(const json_t *v, const char *type) {
    int n = 0;
    size_t i;
    const json_t *blk;
    if (json_is_array(v))
        json_array_foreach(v, i, blk) n += json_is_string(json_object_get(blk, "type")) && !strcmp(json_string_value(json_object_get(blk, "type")), type);
    return n;
}

/* content: a string or a list of blocks, into c->m (and tool messages). */
static int parse_content(msg_ctx *c, const json_t *v, req_error *e) {
    req_msg *m = c->m;
    if (json_is_string(v)) {
        if (strlen(json_string_value(v)) != json_string_length(v)) return BAD(e, "messages.content", "content must not contain NUL characters");
        m->content = json_string_value(v);
        return 0;
    }
    if (!json_is_array(v)) return BAD(e, "messages.content", "content must be a string or a list of content blocks");
    const int uses = n_blocks_of(v, "tool_use");
    if (uses > REQ_MAX_CALLS) return BAD(e, "messages.content", "messages[%zu] has more than %d tool_use blocks", c->i, REQ_MAX_CALLS);
    if (uses && m->role == STRATA_CHAT_ASSISTANT) {
        m->calls = strata_calloc((size_t)uses, sizeof *m->calls);
        m->call_ids = strata_calloc((size_t)uses, sizeof *m->call_ids);
        if (!m->calls || !m->call_ids) return OOM(e);
    }
    size_t i;
    const json_t *blk;
    int rc = 0;
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
        if (k_blocks[k].fn && (rc = k_blocks[k].fn(c, blk, e))) break;
    }
    if (!rc) rc = keep(c->r, &c->text, &m->content, e);
    if (!rc && c->have_think) rc = keep(c->r, &c->think, &m->reasoning, e);
    return rc;
}

/* One message (or, with tool results, several) into r->msgs. */
static int parse_msg(request *r, size_t i, const json_t *o, req_error *e) {
    const json_t *role = json_object_get(o, "role"), *content = json_object_get(o, "content");
    if (!json_is_object(o) || !json_is_string(role)) return BAD(e, "messages.role", "messages[%zu] needs a 'role'", i);
    const char *k;
    json_t *f;
    json_object_foreach((json_t *)o, k, f)
        if (strcmp(k, "role") && strcmp(k, "content")) return BAD(e, "messages", "messages[%zu]: unknown field '%s'", i, k);
    const char *rs = json_string_value(role);
    req_msg user = {0};
    msg_ctx c = {.r = r, .i = i, .m = &r->msgs[r->n_msgs]};
    if (!strcmp(rs, "user")) c.m = &user; /* placed after its tool results */
    else if (strcmp(rs, "assistant")) return BAD(e, "messages.role", "messages[%zu].role '%s' is not user or assistant", i, rs);
    c.m->role = c.m == &user ? STRATA_CHAT_USER : STRATA_CHAT_ASSISTANT;
    if (!content) return BAD(e, "messages.content", "messages[%zu] has no 'content'", i);
    const int rc = parse_content(&c, content, e);
    req_buf_free(&c.text);
    req_buf_free(&c.think);
    if (rc) return -1;
    if (c.m == &user) {
        if (c.n_results && !*user.content) return 0; /* only results: no empty user turn */
        r->msgs[r->n_msgs] = user;
    }
    r->n_msgs++;
    return 0;
}

static int parse_msgs(request *r, const json_t *sys, const json_t *v, req_error *e) {
    if (!json_is_array(v) || !json_array_size(v)) return BAD(e, "messages", "'messages' must be a non-empty array");
    /* room: the system message, each message, each tool result */
    size_t need = 1 + json_array_size(v), i;
    const json_t *o;
    json_array_foreach(v, i, o) need += (size_t)n_blocks_of(json_object_get(o, "content"), "tool_result");
    if (need > REQ_MAX_MSGS) return BAD(e, "messages", "'messages' has more than %d entries (tool results counted)", REQ_MAX_MSGS - 1);
    r->msgs = strata_calloc(need, sizeof *r->msgs);
    if (!r->msgs) return OOM(e);
    r->cap_msgs = need;
    if (sys) {
        req_msg m = {.role = STRATA_CHAT_SYSTEM};
        msg_ctx c = {.r = r, .m = &m};
        const int rc = parse_content(&c, sys, e);
        req_buf_free(&c.text);
        req_buf_free(&c.think);
        if (rc) { snprintf(e->param, sizeof e->param, "system"); return -1; }
        if (m.reasoning || c.n_results) return BAD(e, "system", "'system' takes text blocks only");
        r->msgs[r->n_msgs++] = m;
    }
    json_array_foreach(v, i, o)
        if (parse_msg(r, i, o, e)) return -1;
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

/* tools: [{name, description?, input_schema, type?: "custom", cache_control?}].
 * The tools are OpenAI's non-strict ones (a forced call still follows
 * input_schema where it compiles; toolgram.h); `strict: true` (structured
 * outputs, newer than the SDK the tests use) is honoured as on the OpenAI path.
 * The server tools (bash, text editor, web search: a versioned `type`) are not. */
static int parse_tools(request *r, const json_t *v, req_error *e) {
    size_t n;
    if (req_tools_count(v, &n, e)) return -1;
    if (!n) return 0;
    if (!(r->tools = strata_calloc(n, sizeof *r->tools))) return OOM(e);
    for (size_t i = 0; i < n; i++) {
        const json_t *t = json_array_get(v, i), *schema = NULL;
        strata_chat_tool *o = &r->tools[i];
        if (!json_is_object(t)) return BAD(e, "tools", "tools[%zu] must be an object", i);
        const char *key;
        json_t *f;
        json_object_foreach((json_t *)t, key, f) {
            if (json_is_null(f) || !strcmp(key, "cache_control")) continue;
            if (!strcmp(key, "name") || !strcmp(key, "description")) {
                if (!json_is_string(f) || strlen(json_string_value(f)) != json_string_length(f))
                    return BAD(e, "tools", "tools[%zu].%s must be a string without NUL characters", i, key);
                *(!strcmp(key, "name") ? &o->name : &o->description) = json_string_value(f);
            } else if (!strcmp(key, "input_schema")) {
                if (!json_is_object(f)) return BAD(e, "tools.input_schema", "tools[%zu].input_schema must be a JSON schema object", i);
                schema = f;
            } else if (!strcmp(key, "strict")) {
                if (!json_is_boolean(f)) return BAD(e, "tools.strict", "tools[%zu].strict must be true or false", i);
                o->strict = json_is_true(f);
            } else if (!strcmp(key, "type")) {
                if (!json_is_string(f) || strcmp(json_string_value(f), "custom"))
                    return req_fail(e, 400, "invalid_request_error", "unsupported_parameter", "tools",
                                    "tools[%zu]: tools of type '%.64s' are not supported (custom tools only)", i,
                                    json_is_string(f) ? json_string_value(f) : "?");
            } else {
                return BAD(e, "tools", "tools[%zu]: unknown field '%s'", i, key);
            }
        }
        if (!o->name || !req_tool_name_ok(o->name)) return BAD(e, "tools.name", "tools[%zu].name must be 1-64 of A-Z a-z 0-9 _ -", i);
        if (!schema) return BAD(e, "tools.input_schema", "tools[%zu] '%s' has no 'input_schema'", i, o->name);
        if (o->strict) {
            const int rc = req_tool_strict_schema(schema, i, o->name, "tools.input_schema", e);
            if (rc == STRATA_ENOMEM) return OOM(e);
            if (rc) return -1;
        }
        char *d = json_dumps(schema, JSON_COMPACT);
        if (req_own(r, d, e)) return -1;
        o->parameters = d;
        for (size_t k = 0; k < i; k++)
            if (!strcmp(r->tools[k].name, o->name)) return BAD(e, "tools.name", "tools[%zu]: '%s' is declared twice", i, o->name);
    }
    r->n_tools = n;
    return 0;
}

/* tool_choice: {"type": "auto" | "any" | "tool" (with "name") | "none",
 * "disable_parallel_tool_use"?} -> auto, required, named, none. */
static int parse_tool_choice(request *r, const json_t *v, req_error *e) {
    static const struct { const char *type; int choice; } k_choices[] = {
        {"auto", STRATA_CHAT_TOOLS_AUTO}, {"any", STRATA_CHAT_TOOLS_REQUIRED}, {"tool", STRATA_CHAT_TOOLS_NAMED}, {"none", STRATA_CHAT_TOOLS_NONE},
    };
    const char *P = "tool_choice";
    const json_t *ty = json_object_get(v, "type");
    size_t k = 0;
    if (json_is_string(ty))
        while (k < sizeof k_choices / sizeof *k_choices && strcmp(k_choices[k].type, json_string_value(ty))) k++;
    if (!json_is_object(v) || !json_is_string(ty) || k == sizeof k_choices / sizeof *k_choices)
        return BAD(e, P, "'tool_choice' must be {\"type\": \"auto\" | \"any\" | \"tool\" | \"none\"}");
    r->tool_choice = k_choices[k].choice;
    const char *key;
    json_t *f;
    json_object_foreach((json_t *)v, key, f) {
        if (!strcmp(key, "type")) continue;
        if (!strcmp(key, "name") && r->tool_choice == STRATA_CHAT_TOOLS_NAMED) {
            if (!json_is_string(f)) return BAD(e, P, "tool_choice.name must be a string");
            r->tool_choice_name = json_string_value(f);
        } else if (!strcmp(key, "disable_parallel_tool_use") && r->tool_choice != STRATA_CHAT_TOOLS_NONE) {
            if (!json_is_boolean(f) && !json_is_null(f)) return BAD(e, P, "tool_choice.disable_parallel_tool_use must be true or false");
            r->parallel_tools = !json_is_true(f);
        } else {
            return BAD(e, P, "tool_choice: unknown field '%s'", key);
        }
    }
    if (r->tool_choice == STRATA_CHAT_TOOLS_NAMED && !r->tool_choice_name) return BAD(e, P, "tool_choice {\"type\": \"tool\"} needs a 'name'");
    return 0;
}

/* The choice against the declared tools (after the whole body). */
static int check_tool_choice(const request *r, req_error *e) {
    const int forced = r->tool_choice == STRATA_CHAT_TOOLS_REQUIRED || r->tool_choice == STRATA_CHAT_TOOLS_NAMED;
    if (forced && !r->n_tools)
        return BAD(e, "tool_choice", "tool_choice '%s' needs 'tools'", r->tool_choice == STRATA_CHAT_TOOLS_NAMED ? "tool" : "any");
    for (size_t t = 0; r->tool_choice == STRATA_CHAT_TOOLS_NAMED; t++) {
        if (t == r->n_tools) return BAD(e, "tool_choice", "tool_choice names '%.64s', which 'tools' does not declare", r->tool_choice_name);
        if (!strcmp(r->tools[t].name, r->tool_choice_name)) break;
    }
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
        return parse_tools(r, f, e);
    } else if (!strcmp(key, "tool_choice")) {
        return parse_tool_choice(r, f, e);
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
    r->parallel_tools = 1;
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
    if (!rc) rc = check_tool_choice(r, e);
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

/* A call's input: its arguments parsed, when they are a JSON object (else
 * NULL: the call comes back as text). \u0000 is kept, as JSON allows it. */
static json_t *call_input(const job *j, size_t i) {
    json_t *v = json_loads(j->call_args[i], JSON_ALLOW_NUL, NULL);
    if (json_is_object(v)) return v;
    json_decref(v);
    return NULL;
}

/* tool_use ids: "toolu_" and the call ids' prompt hash, so the same request
 * gets the same ids (http_gen.c build_prompt). */
static void tool_use_id(const job *j, size_t i, char *out, size_t n) {
    snprintf(out, n, "toolu_%s_%zu", strncmp(j->call_id, "call_", 5) ? j->call_id : j->call_id + 5, i);
}

static size_t n_tool_uses(const job *j) {
    size_t n = 0;
    for (size_t i = 0; i < j->n_calls; i++) {
        json_t *v = call_input(j, i);
        n += v != NULL;
        json_decref(v);
    }
    return n;
}

static const char *stop_reason(const job *j) {
    if (n_tool_uses(j)) return "tool_use";
    if (j->finish_reason && !strcmp(j->finish_reason, "length")) return "max_tokens";
    if (j->finish_reason && !strcmp(j->finish_reason, "tool_calls")) return j->n_gen >= j->go.max_tokens ? "max_tokens" : "end_turn";
    return j->stop_hit >= 0 ? "stop_sequence" : "end_turn";
}

static json_t *stop_seq(const job *j) {
    return j->stop_hit >= 0 && j->finish_reason && !strcmp(j->finish_reason, "stop") ? json_string(j->stop[j->stop_hit]) : json_null();
}

static json_t *usage(const job *j, int64_t out) {
    return json_pack("{s:I,s:I,s:I,s:I}", "input_tokens", (json_int_t)(j->n_prompt - j->n_cached), "cache_read_input_tokens",
                     (json_int_t)j->n_cached, "cache_creation_input_tokens", (json_int_t)0, "output_tokens", (json_int_t)out);
}

/* Appends text to the last block when it is a text block (as the stream
 * continues its open one), else as a new text block. */
static void add_text(json_t *content, const char *p, size_t n) {
    json_t *last = json_array_get(content, json_array_size(content) - 1);
    if (last && !strcmp(json_string_value(json_object_get(last, "type")), "text")) {
        const json_t *t = json_object_get(last, "text");
        req_buf b = {0};
        req_buf_add(&b, json_string_value(t), json_string_length(t));
        req_buf_add(&b, p, n);
        json_object_set_new(last, "text", json_stringn(b.p ? b.p : "", b.n));
        req_buf_free(&b);
        return;
    }
    json_array_append_new(content, json_pack("{s:s,s:s%}", "type", "text", "text", p, n));
}

json_t *anth_message_json(const job *j, const char *id, const char *model) {
    json_t *content = json_array();
    if (j->thinking)
        json_array_append_new(content, json_pack("{s:s,s:s%,s:s}", "type", "thinking", "thinking", j->reasoning.p ? j->reasoning.p : "",
                                                 j->reasoning.n, "signature", ""));
    /* text and calls in the order they were written (as the stream sends them) */
    size_t off = 0;
    const char *txt = j->content.p ? j->content.p : "";
    for (size_t i = 0; i < j->n_calls; i++) {
        if (j->call_at[i] > off) add_text(content, txt + off, j->call_at[i] - off);
        off = j->call_at[i] > off ? j->call_at[i] : off;
        json_t *in = call_input(j, i);
        char tid[96];
        tool_use_id(j, i, tid, sizeof tid);
        if (in) json_array_append_new(content, json_pack("{s:s,s:s,s:s,s:o}", "type", "tool_use", "id", tid, "name", j->call_name[i], "input", in));
        else add_text(content, j->call_args[i], strlen(j->call_args[i]));
    }
    if (j->content.n > off || json_array_size(content) == (size_t)(j->thinking != 0)) add_text(content, txt + off, j->content.n - off);
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

/* A whole tool call as one block: its head (input {}), its input in one
 * input_json_delta (the parser hands calls out complete), its end. Input that
 * is not a JSON object continues the text instead, as in the answer. */
static void tool_use_block(anth_stream *a, const job *j, size_t i, req_buf *out) {
    json_t *in = call_input(j, i);
    if (!in) { delta(a, 2, j->call_args[i], strlen(j->call_args[i]), out); return; }
    char *txt = json_dumps(in, JSON_COMPACT | JSON_ENCODE_ANY);
    json_decref(in);
    if (!txt) { out->oom = 1; return; }
    char tid[96];
    tool_use_id(j, i, tid, sizeof tid);
    block_stop(a, out);
    a->block = a->n_blocks++;
    a->block_kind = 3;
    json_t *cb = json_pack("{s:s,s:s,s:s,s:{}}", "type", "tool_use", "id", tid, "name", j->call_name[i], "input");
    event(out, "content_block_start", json_pack("{s:s,s:i,s:o}", "type", "content_block_start", "index", a->block, "content_block", cb));
    json_t *d = json_pack("{s:s,s:s}", "type", "input_json_delta", "partial_json", txt);
    event(out, "content_block_delta", json_pack("{s:s,s:i,s:o}", "type", "content_block_delta", "index", a->block, "delta", d));
    strata_free(txt);
    block_stop(a, out);
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
    for (;; a->sent_calls++) { /* text up to each call, the call, ... the rest */
        const size_t to = a->sent_calls < j->n_calls ? j->call_at[a->sent_calls] : j->content.n;
        if (to > a->sent_content) {
            delta(a, 2, j->content.p + a->sent_content, to - a->sent_content, out);
            a->sent_content = to;
        }
        if (a->sent_calls == j->n_calls) break;
        tool_use_block(a, j, a->sent_calls, out);
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
