/*
 * request.c: request bodies -> validated requests (see request.h).
 *
 * Each endpoint has a table of the fields it knows; anything else is refused by
 * name, so a typo ("max_token") is a 400 instead of a silently ignored limit.
 */
#include "request.h"

#include <math.h>
#include <stdarg.h>
#include <string.h>

int req_fail(req_error *e, int status, const char *type, const char *code, const char *param, const char *fmt, ...) {
    e->status = status;
    snprintf(e->type, sizeof e->type, "%s", type);
    snprintf(e->code, sizeof e->code, "%s", code ? code : "");
    snprintf(e->param, sizeof e->param, "%s", param ? param : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    va_end(ap);
    return -1;
}

#define BAD(e, param, ...) req_fail(e, 400, "invalid_request_error", "invalid_value", param, __VA_ARGS__)
#define UNSUPPORTED(e, param, ...) req_fail(e, 400, "invalid_request_error", "unsupported_parameter", param, __VA_ARGS__)

/* ===== byte buffers and UTF-8 ===== */

static int buf_grow(req_buf *b, size_t extra) {
    if (b->oom) return -1;
    if (b->n + extra + 1 <= b->cap) return 0;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->n + extra + 1) {
        if (cap > ((size_t)1 << 40)) { b->oom = 1; return -1; }
        cap *= 2;
    }
    char *p = strata_realloc(b->p, cap);
    if (!p) { b->oom = 1; return -1; }
    b->p = p;
    b->cap = cap;
    return 0;
}

void req_buf_add(req_buf *b, const void *s, size_t n) {
    if (buf_grow(b, n)) return;
    if (n) memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}

void req_buf_addf(req_buf *b, const char *fmt, ...) {
    char tmp[1024];
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (k < 0) return;
    if ((size_t)k < sizeof tmp) { req_buf_add(b, tmp, (size_t)k); return; }
    if (buf_grow(b, (size_t)k)) return;
    va_start(ap, fmt);
    vsnprintf(b->p + b->n, (size_t)k + 1, fmt, ap);
    va_end(ap);
    b->n += (size_t)k;
}

void req_buf_free(req_buf *b) {
    strata_free(b->p);
    memset(b, 0, sizeof *b);
}

/* Length of the valid UTF-8 character at s (n bytes available), or 0. Rejects
 * overlongs, surrogates and code points above U+10FFFF (RFC 3629). */
static size_t utf8_char(const unsigned char *s, size_t n) {
    const unsigned c = s[0];
    if (c < 0x80) return 1;
    size_t len;
    unsigned cp;
    if (c >= 0xC2 && c <= 0xDF) { len = 2; cp = c & 0x1F; }
    else if (c >= 0xE0 && c <= 0xEF) { len = 3; cp = c & 0x0F; }
    else if (c >= 0xF0 && c <= 0xF4) { len = 4; cp = c & 0x07; }
    else return 0;
    if (n < len) return 0;
    for (size_t i = 1; i < len; i++) {
        if ((s[i] & 0xC0) != 0x80) return 0;
        cp = (cp << 6) | (s[i] & 0x3F);
    }
    if ((len == 3 && (cp < 0x800 || (cp >= 0xD800 && cp <= 0xDFFF))) || (len == 4 && (cp < 0x10000 || cp > 0x10FFFF)))
        return 0;
    return len;
}

void req_buf_add_utf8(req_buf *b, const char *s, size_t n) {
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0, run = 0; /* valid bytes [i - run, i) not yet copied */
    while (i < n) {
        size_t k = utf8_char(u + i, n - i);
        if (k) { i += k; run += k; continue; }
        req_buf_add(b, u + i - run, run);
        req_buf_add(b, "\xEF\xBF\xBD", 3);
        run = 0;
        i++;
    }
    req_buf_add(b, u + i - run, run);
}

size_t req_utf8_valid_prefix(const char *s, size_t n) {
    size_t i = 0, k;
    while (i < n && (k = utf8_char((const unsigned char *)s + i, n - i))) i += k;
    return i;
}

/* ===== field helpers ===== */

int req_effort(const char *v) {
    static const struct { const char *name; int effort; } k_map[] = {
        {"none", STRATA_CHAT_THINK_OFF}, {"minimal", STRATA_CHAT_THINK_LOW}, {"low", STRATA_CHAT_THINK_LOW},
        {"medium", STRATA_CHAT_THINK_HIGH}, {"high", STRATA_CHAT_THINK_HIGH}, {"max", STRATA_CHAT_THINK_MAX},
    };
    for (size_t i = 0; i < sizeof k_map / sizeof *k_map; i++)
        if (!strcmp(v, k_map[i].name)) return k_map[i].effort;
    return -1;
}

/* A string field without NUL bytes (strata_chat_render takes C strings). */
static int get_cstr(const json_t *v, const char *name, const char **out, req_error *e) {
    if (!json_is_string(v)) return BAD(e, name, "'%s' must be a string", name);
    if (strlen(json_string_value(v)) != json_string_length(v)) return BAD(e, name, "'%s' must not contain NUL characters", name);
    *out = json_string_value(v);
    return 0;
}

static int get_int(const json_t *v, const char *name, int64_t lo, int64_t hi, int64_t *out, req_error *e) {
    int64_t x;
    if (strata_json_int(v, &x) || json_is_boolean(v))
        return BAD(e, name, "'%s' must be an integer", name);
    if (x < lo || x > hi) return BAD(e, name, "'%s' must be in [%lld, %lld] (got %lld)", name, (long long)lo, (long long)hi, (long long)x);
    *out = x;
    return 0;
}

static int get_num(const json_t *v, const char *name, double lo, double hi, double *out, req_error *e) {
    double x;
    if (strata_json_num(v, &x) || !isfinite(x)) return BAD(e, name, "'%s' must be a number", name);
    if (x < lo || x > hi) return BAD(e, name, "'%s' must be in [%g, %g] (got %g)", name, lo, hi, x);
    *out = x;
    return 0;
}

/* A value of strata.h's parameter table: its range, its message. */
static int get_param(const json_t *v, const char *name, enum strata_param p, double *out, req_error *e) {
    const int integer = strata_param(p)->integer;
    double x;
    int64_t n;
    char msg[256];
    if (integer && (strata_json_int(v, &n) || json_is_boolean(v))) return BAD(e, name, "'%s' must be an integer", name);
    if (!integer && (strata_json_num(v, &x) || !isfinite(x))) return BAD(e, name, "'%s' must be a number", name);
    if (integer) x = (double)n;
    if (strata_param_check(p, x, msg, sizeof msg)) return BAD(e, name, "%s", msg);
    *out = x;
    return 0;
}

static int get_bool(const json_t *v, const char *name, int *out, req_error *e) {
    if (!json_is_boolean(v)) return BAD(e, name, "'%s' must be true or false", name);
    *out = json_is_true(v);
    return 0;
}

/* Content: a string, or an array of {"type": "text", "text": "..."} parts joined. */
static int get_content(request *r, const json_t *v, const char *name, const char **out, req_error *e) {
    if (json_is_null(v)) { *out = ""; return 0; }
    if (json_is_string(v)) return get_cstr(v, name, out, e);
    if (!json_is_array(v)) return BAD(e, name, "'%s' must be a string or an array of text parts", name);
    req_buf b = {0};
    size_t i;
    json_t *part;
    json_array_foreach(v, i, part) {
        const json_t *type = json_object_get(part, "type"), *text = json_object_get(part, "text");
        const char *t;
        if (!json_is_object(part) || !json_is_string(type)) { req_buf_free(&b); return BAD(e, name, "'%s' parts must be objects with a 'type'", name); }
        if (strcmp(json_string_value(type), "text")) {
            req_buf_free(&b);
            return UNSUPPORTED(e, name, "'%s': content parts of type '%s' are not supported (text only)", name, json_string_value(type));
        }
        if (get_cstr(text, name, &t, e)) { req_buf_free(&b); return -1; }
        req_buf_add(&b, t, strlen(t));
    }
    req_buf_add(&b, "", 0);
    char **np = strata_realloc(r->parts, (r->n_parts + 1) * sizeof *np);
    if (b.oom || !np) { if (np) r->parts = np; req_buf_free(&b); return req_fail(e, 500, "server_error", "out_of_memory", NULL, "out of memory"); }
    r->parts = np;
    r->parts[r->n_parts++] = b.p;
    *out = b.p;
    return 0;
}

#define OOM(e) req_fail(e, 500, "server_error", "out_of_memory", NULL, "out of memory")

int req_own(request *r, char *s, req_error *e) {
    char **np = s ? strata_realloc(r->parts, (r->n_parts + 1) * sizeof *np) : NULL;
    if (!np) { strata_free(s); return OOM(e); }
    r->parts = np;
    r->parts[r->n_parts++] = s;
    return 0;
}

int req_tool_name_ok(const char *s) {
    size_t n = strspn(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-");
    return n >= 1 && n <= 64 && !s[n];
}

int req_tools_count(const json_t *v, size_t *n, req_error *e) {
    if (!json_is_array(v)) return BAD(e, "tools", "'tools' must be an array");
    *n = json_array_size(v);
    if (*n > REQ_MAX_TOOLS) return BAD(e, "tools", "'tools' has more than %d entries", REQ_MAX_TOOLS);
    return 0;
}

int req_tool_strict_schema(const json_t *schema, size_t i, const char *name, const char *param, req_error *e) {
    char err[400];
    strata_grammar *g = NULL;
    const int rc = strata_grammar_json_schema_tree(&g, schema, err, sizeof err);
    strata_grammar_free(g);
    if (rc == STRATA_ENOMEM) return rc;
    if (rc) return req_fail(e, 400, "invalid_request_error", "invalid_schema", param, "tools[%zu] '%s' (strict): %s", i, name, err);
    return 0;
}

/* An assistant message's tool_calls: [{id, type: "function", function: {name, arguments}}]. */
static int parse_calls(request *r, req_msg *o, size_t i, const json_t *v, req_error *e) {
    if (json_is_null(v)) return 0;
    if (!json_is_array(v)) return BAD(e, "messages.tool_calls", "messages[%zu].tool_calls must be an array", i);
    const size_t n = json_array_size(v);
    if (n > REQ_MAX_CALLS) return BAD(e, "messages.tool_calls", "messages[%zu].tool_calls has more than %d calls", i, REQ_MAX_CALLS);
    if (!n) return 0;
    o->calls = strata_calloc(n, sizeof *o->calls);
    o->call_ids = strata_calloc(n, sizeof *o->call_ids);
    if (!o->calls || !o->call_ids) return OOM(e);
    for (size_t k = 0; k < n; k++) {
        const json_t *c = json_array_get(v, k), *fn = json_object_get(c, "function");
        const char *key;
        json_t *f;
        if (!json_is_object(c) || !json_is_object(fn))
            return BAD(e, "messages.tool_calls", "messages[%zu].tool_calls[%zu] must be an object with a 'function' object", i, k);
        json_object_foreach((json_t *)c, key, f) {
            if (!strcmp(key, "id")) {
                if (get_cstr(f, "messages.tool_calls.id", &o->call_ids[k], e)) return -1;
            } else if (!strcmp(key, "type")) {
                if (!json_is_string(f) || strcmp(json_string_value(f), "function"))
                    return BAD(e, "messages.tool_calls.type", "messages[%zu].tool_calls[%zu].type must be \"function\"", i, k);
            } else if (strcmp(key, "function")) {
                return BAD(e, "messages.tool_calls", "messages[%zu].tool_calls[%zu]: unknown field '%s'", i, k, key);
            }
        }
        json_object_foreach((json_t *)fn, key, f) {
            if (!strcmp(key, "name")) {
                if (get_cstr(f, "messages.tool_calls.function.name", &o->calls[k].name, e)) return -1;
            } else if (!strcmp(key, "arguments")) {
                if (get_cstr(f, "messages.tool_calls.function.arguments", &o->calls[k].args, e)) return -1;
            } else {
                return BAD(e, "messages.tool_calls", "messages[%zu].tool_calls[%zu].function: unknown field '%s'", i, k, key);
            }
        }
        if (!o->calls[k].name || !req_tool_name_ok(o->calls[k].name))
            return BAD(e, "messages.tool_calls.function.name",
                       "messages[%zu].tool_calls[%zu].function.name must be 1-64 of A-Z a-z 0-9 _ -", i, k);
        if (!o->calls[k].args) o->calls[k].args = "{}";
        if (!o->call_ids[k]) return BAD(e, "messages.tool_calls.id", "messages[%zu].tool_calls[%zu] has no 'id'", i, k);
    }
    o->n_calls = n;
    return 0;
}

size_t req_find_call(const request *r, size_t upto, const char *id) {
    size_t g = 0, found = (size_t)-1;
    for (size_t m = 0; m < upto; m++)
        for (size_t k = 0; k < r->msgs[m].n_calls; k++, g++)
            if (!strcmp(r->msgs[m].call_ids[k], id)) found = g; /* the latest call with that id */
    return found;
}

/* A tool message's tool_call_id -> the number of the call it answers. */
static int resolve_call(request *r, size_t i, const char *id, req_error *e) {
    const size_t found = req_find_call(r, i, id);
    if (found == (size_t)-1)
        return BAD(e, "messages.tool_call_id", "messages[%zu].tool_call_id '%.64s' names no tool call of an earlier assistant message",
                   i, id);
    r->msgs[i].call_of = found;
    return 0;
}

static int parse_messages(request *r, const json_t *v, req_error *e) {
    if (!json_is_array(v) || json_array_size(v) == 0) return BAD(e, "messages", "'messages' must be a non-empty array");
    if (json_array_size(v) > REQ_MAX_MSGS) return BAD(e, "messages", "'messages' has more than %d entries", REQ_MAX_MSGS);
    r->msgs = strata_calloc(json_array_size(v), sizeof *r->msgs);
    if (!r->msgs) return req_fail(e, 500, "server_error", "out_of_memory", NULL, "out of memory");
    r->cap_msgs = json_array_size(v);
    size_t i;
    json_t *m;
    json_array_foreach(v, i, m) {
        if (!json_is_object(m)) return BAD(e, "messages", "messages[%zu] must be an object", i);
        const char *key;
        json_t *f;
        req_msg *o = &r->msgs[r->n_msgs];
        int have_role = 0;
        const char *call_id = NULL;
        o->content = "";
        json_object_foreach(m, key, f) {
            if (!strcmp(key, "role")) {
                const char *role;
                if (get_cstr(f, "messages.role", &role, e)) return -1;
                if (!strcmp(role, "developer")) role = "system";
                if ((o->role = strata_chat_role_parse(role)) < 0)
                    return BAD(e, "messages.role", "messages[%zu].role '%s' is not one of system, developer, user, assistant, tool", i, role);
                have_role = 1;
            } else if (!strcmp(key, "content")) {
                if (get_content(r, f, "messages.content", &o->content, e)) return -1;
            } else if (!strcmp(key, "reasoning_content")) {
                if (!json_is_null(f) && get_cstr(f, "messages.reasoning_content", &o->reasoning, e)) return -1;
            } else if (!strcmp(key, "name")) {
                if (!json_is_string(f)) return BAD(e, "messages.name", "messages[%zu].name must be a string", i);
            } else if (!strcmp(key, "tool_calls")) {
                if (parse_calls(r, o, i, f, e)) return -1;
            } else if (!strcmp(key, "tool_call_id")) {
                if (!json_is_null(f) && get_cstr(f, "messages.tool_call_id", &call_id, e)) return -1;
            } else if (!strcmp(key, "function_call")) {
                if (!json_is_null(f)) return UNSUPPORTED(e, "messages", "messages[%zu].function_call: use tool_calls", i);
            } else {
                return BAD(e, "messages", "messages[%zu]: unknown field '%s'", i, key);
            }
        }
        if (!have_role) return BAD(e, "messages.role", "messages[%zu] has no 'role'", i);
        if (o->reasoning && o->role != STRATA_CHAT_ASSISTANT)
            return BAD(e, "messages.reasoning_content", "messages[%zu]: reasoning_content only on assistant messages", i);
        if (o->n_calls && o->role != STRATA_CHAT_ASSISTANT)
            return BAD(e, "messages.tool_calls", "messages[%zu]: tool_calls only on assistant messages", i);
        if (o->role == STRATA_CHAT_TOOL && !call_id)
            return BAD(e, "messages.tool_call_id", "messages[%zu] (tool) has no 'tool_call_id'", i);
        if (o->role == STRATA_CHAT_TOOL && resolve_call(r, i, call_id, e)) return -1;
        r->n_msgs++;
    }
    return 0;
}

/* tools: [{"type": "function", "function": {name, description?, parameters?, strict?}}] */
static int parse_tools(request *r, const json_t *v, req_error *e) {
    size_t n;
    if (req_tools_count(v, &n, e)) return -1;
    if (!n) return 0;
    if (!(r->tools = strata_calloc(n, sizeof *r->tools))) return OOM(e);
    for (size_t i = 0; i < n; i++) {
        const json_t *t = json_array_get(v, i), *fn = json_object_get(t, "function"), *type = json_object_get(t, "type");
        if (!json_is_object(t) || !json_is_string(type) || strcmp(json_string_value(type), "function") || !json_is_object(fn))
            return BAD(e, "tools", "tools[%zu] must be {\"type\": \"function\", \"function\": {...}}", i);
        if (json_object_size(t) != 2) return BAD(e, "tools", "tools[%zu]: only 'type' and 'function' are known", i);
        strata_chat_tool *o = &r->tools[i];
        const char *key;
        json_t *f;
        json_object_foreach((json_t *)fn, key, f) {
            if (json_is_null(f)) continue;
            if (!strcmp(key, "name")) {
                if (get_cstr(f, "tools.function.name", &o->name, e)) return -1;
            } else if (!strcmp(key, "description")) {
                if (get_cstr(f, "tools.function.description", &o->description, e)) return -1;
            } else if (!strcmp(key, "parameters")) {
                if (!json_is_object(f)) return BAD(e, "tools.function.parameters", "tools[%zu].function.parameters must be a JSON schema object", i);
                char *d = json_dumps(f, JSON_COMPACT);
                if (req_own(r, d, e)) return -1;
                o->parameters = d;
            } else if (!strcmp(key, "strict")) {
                if (get_bool(f, "tools.function.strict", &o->strict, e)) return -1;
            } else {
                return BAD(e, "tools.function", "tools[%zu].function: unknown field '%s'", i, key);
            }
        }
        if (!o->name || !req_tool_name_ok(o->name))
            return BAD(e, "tools.function.name", "tools[%zu].function.name must be 1-64 of A-Z a-z 0-9 _ -", i);
        /* strict: the schema must compile now (a forced call enforces it) */
        const json_t *params = json_object_get(fn, "parameters");
        if (o->strict && params && !json_is_null(params)) {
            const int rc = req_tool_strict_schema(params, i, o->name, "tools", e);
            if (rc == STRATA_ENOMEM) return OOM(e);
            if (rc) return -1;
        }
        for (size_t k = 0; k < i; k++)
            if (!strcmp(r->tools[k].name, o->name)) return BAD(e, "tools.function.name", "tools[%zu]: '%s' is declared twice", i, o->name);
    }
    r->n_tools = n;
    return 0;
}

/* tool_choice: "auto" | "none" | "required" | {"type": "function", "function": {"name": ...}} */
static int parse_tool_choice(request *r, const json_t *v, req_error *e) {
    static const char *const k_choices[] = {"auto", "none", "required"};
    if (json_is_string(v)) {
        for (int i = 0; i < 3; i++)
            if (!strcmp(json_string_value(v), k_choices[i])) { r->tool_choice = i; return 0; }
        return BAD(e, "tool_choice", "'tool_choice' must be auto, none, required or {\"type\": \"function\", \"function\": {\"name\": ...}}");
    }
    const json_t *fn = json_object_get(v, "function"), *type = json_object_get(v, "type");
    if (!json_is_object(v) || !json_is_string(type) || strcmp(json_string_value(type), "function") || !json_is_object(fn) ||
        !json_is_string(json_object_get(fn, "name")))
        return BAD(e, "tool_choice", "'tool_choice' must be auto, none, required or {\"type\": \"function\", \"function\": {\"name\": ...}}");
    r->tool_choice = STRATA_CHAT_TOOLS_NAMED;
    r->tool_choice_name = json_string_value(json_object_get(fn, "name"));
    return 0;
}

/* ids: an array of integers in [0, 2^31). */
static int get_ids(request *r, const json_t *v, const char *name, req_error *e) {
    const size_t n = json_array_size(v);
    r->ids = strata_alloc((n ? n : 1) * sizeof(int32_t));
    if (!r->ids) return req_fail(e, 500, "server_error", "out_of_memory", NULL, "out of memory");
    for (size_t i = 0; i < n; i++) {
        int64_t x;
        if (get_int(json_array_get(v, i), name, 0, INT32_MAX, &x, e)) return -1;
        r->ids[i] = (int32_t)x;
    }
    r->n_ids = n;
    r->has_ids = 1;
    return 0;
}

/* Completion prompt: a string, an array of ids, or a one-element array of either. */
static int parse_prompt(request *r, const json_t *v, req_error *e) {
    if (json_is_array(v) && json_array_size(v) == 1 && (json_is_string(json_array_get(v, 0)) || json_is_array(json_array_get(v, 0))))
        v = json_array_get(v, 0);
    if (json_is_string(v)) {
        r->text = json_string_value(v);
        r->text_len = json_string_length(v);
        return 0;
    }
    if (!json_is_array(v)) return BAD(e, "prompt", "'prompt' must be a string or an array of token ids");
    for (size_t i = 0; i < json_array_size(v); i++)
        if (!json_is_integer(json_array_get(v, i)))
            return UNSUPPORTED(e, "prompt", "'prompt': one prompt per request (a string or an array of token ids)");
    return get_ids(r, v, "prompt", e);
}

static int parse_stop(request *r, const json_t *v, req_error *e) {
    const json_t *one = v;
    size_t n = 1;
    if (json_is_array(v)) {
        n = json_array_size(v);
        if (n > REQ_MAX_STOP) return BAD(e, "stop", "'stop' has more than %d strings", REQ_MAX_STOP);
    } else if (!json_is_string(v)) {
        return BAD(e, "stop", "'stop' must be a string or an array of strings");
    }
    for (size_t i = 0; i < n; i++) {
        if (json_is_array(v)) one = json_array_get(v, i);
        if (!json_is_string(one)) return BAD(e, "stop", "'stop' must be a string or an array of strings");
        size_t len = json_string_length(one);
        if (len == 0) return BAD(e, "stop", "'stop' strings must not be empty");
        if (len > REQ_MAX_STOP_BYTES) return BAD(e, "stop", "'stop' strings are limited to %d bytes", REQ_MAX_STOP_BYTES);
        r->stop[r->n_stop] = json_string_value(one);
        r->stop_len[r->n_stop++] = len;
    }
    return 0;
}

/* The sampling and output fields shared by chat and completions. 1: not one of
 * them; 0: taken; -1: refused. */
static int common_field(request *r, const char *key, const json_t *f, req_error *e) {
    int64_t x;
    if (!strcmp(key, "model")) {
        if (!json_is_string(f)) return BAD(e, "model", "'model' must be a string");
        r->model = json_string_value(f);
    } else if (!strcmp(key, "max_tokens") || !strcmp(key, "max_completion_tokens")) {
        if (get_int(f, key, 1, (int64_t)1 << 32, &x, e)) return -1;
        if (!strcmp(key, "max_completion_tokens") || !r->max_tokens) r->max_tokens = x;
    } else if (!strcmp(key, "temperature")) {
        r->has_temp = 1;
        return get_param(f, key, STRATA_PARAM_TEMP, &r->go.temp, e);
    } else if (!strcmp(key, "top_p")) {
        r->has_top_p = 1;
        return get_param(f, key, STRATA_PARAM_TOP_P, &r->go.top_p, e);
    } else if (!strcmp(key, "top_k")) {
        /* -1: off, as 0 (the clients' convention) */
        double k;
        if (strata_json_int(f, &x) == 0 && !json_is_boolean(f) && x == -1) { r->go.top_k = 0; return 0; }
        if (get_param(f, key, STRATA_PARAM_TOP_K, &k, e)) return -1;
        r->go.top_k = (int64_t)k;
    } else if (!strcmp(key, "min_p")) {
        return get_param(f, key, STRATA_PARAM_MIN_P, &r->go.min_p, e);
    } else if (!strcmp(key, "repetition_penalty")) {
        /* 0 would divide the logits by zero: the range is (0, 100], and says so */
        return get_param(f, key, STRATA_PARAM_REPEAT_PENALTY, &r->go.repeat_penalty, e);
    } else if (!strcmp(key, "seed")) {
        if (get_int(f, key, INT64_MIN, INT64_MAX, &x, e)) return -1;
        r->go.seed = (uint64_t)x;
        r->has_seed = 1;
    } else if (!strcmp(key, "stop")) {
        return parse_stop(r, f, e);
    } else if (!strcmp(key, "n")) {
        if (get_int(f, key, 1, REQ_MAX_N, &x, e)) return -1;
        r->n = (int)x;
    } else if (!strcmp(key, "best_of")) {
        if (get_int(f, key, 1, INT32_MAX, &x, e)) return -1;
        if (x != 1) return UNSUPPORTED(e, key, "'%s': only 1 is supported", key);
    } else if (!strcmp(key, "stream")) {
        return get_bool(f, key, &r->stream, e);
    } else if (!strcmp(key, "stream_options")) {
        if (!json_is_object(f)) return BAD(e, key, "'stream_options' must be an object");
        const char *k2;
        json_t *f2;
        json_object_foreach((json_t *)f, k2, f2) {
            if (strcmp(k2, "include_usage")) return BAD(e, "stream_options", "stream_options: unknown field '%s'", k2);
            if (get_bool(f2, "stream_options.include_usage", &r->include_usage, e)) return -1;
        }
    } else if (!strcmp(key, "frequency_penalty") || !strcmp(key, "presence_penalty")) {
        double d = 0;
        if (get_num(f, key, -2, 2, &d, e)) return -1;
        if (d != 0) return UNSUPPORTED(e, key, "'%s' is not supported (only 0)", key);
    } else if (!strcmp(key, "logprobs") && r->kind == REQ_CHAT) {
        return get_bool(f, key, &r->go.logprobs, e);
    } else if (!strcmp(key, "top_logprobs") && r->kind == REQ_CHAT) {
        if (get_int(f, key, 0, STRATA_MAX_TOP_LOGPROBS, &x, e)) return -1;
        r->go.top_logprobs = (int)x;
    } else if (!strcmp(key, "logprobs")) { /* completions: the legacy integer */
        if (get_int(f, key, 0, 5, &x, e)) return -1;
        r->go.logprobs = 1;
        r->go.top_logprobs = (int)x;
    } else if (!strcmp(key, "echo")) {
        if (!json_is_false(f)) return UNSUPPORTED(e, key, "'%s' is not supported", key);
    } else if (!strcmp(key, "store") || (!strcmp(key, "parallel_tool_calls") && r->kind != REQ_CHAT)) {
        int b;
        return get_bool(f, key, &b, e); /* accepted and ignored: nothing is stored; completions have no tools */
    } else if (!strcmp(key, "metadata")) {
        if (!json_is_object(f)) return BAD(e, key, "'metadata' must be an object");
    } else if (!strcmp(key, "logit_bias")) {
        if (!json_is_object(f) || json_object_size(f)) return UNSUPPORTED(e, key, "'logit_bias' is not supported");
    } else if (!strcmp(key, "user")) {
        if (!json_is_string(f)) return BAD(e, key, "'user' must be a string");
    } else {
        return 1;
    }
    return 0;
}

/* response_format: {"type": "text"} (the default), {"type": "json_object"}, or
 * {"type": "json_schema", "json_schema": {"name", "schema", "strict", "description"}}
 * (strict or not, the schema is enforced; no schema: any JSON value). */
static int parse_response_format(request *r, const json_t *v, req_error *e) {
    const char *P = "response_format";
    if (!json_is_object(v)) return BAD(e, P, "'response_format' must be an object");
    const json_t *t = json_object_get(v, "type"), *js = NULL;
    if (!json_is_string(t)) return BAD(e, P, "'response_format.type' must be a string");
    const char *type = json_string_value(t), *key;
    json_t *f;
    json_object_foreach((json_t *)v, key, f) {
        if (!strcmp(key, "type")) continue;
        if (!strcmp(key, "json_schema") && !strcmp(type, "json_schema")) { js = f; continue; }
        return BAD(e, P, "response_format: unknown field '%s'", key);
    }
    char err[400];
    int rc = 0;
    if (!strcmp(type, "text")) return 0;
    if (!strcmp(type, "json_object")) {
        rc = strata_grammar_json_object(&r->grammar, err, sizeof err);
    } else if (!strcmp(type, "json_schema")) {
        if (!json_is_object(js)) return BAD(e, P, "'response_format.json_schema' must be an object");
        const json_t *schema = NULL;
        json_object_foreach((json_t *)js, key, f) {
            if (!strcmp(key, "schema")) schema = f;
            else if (!strcmp(key, "name") || !strcmp(key, "description")) {
                if (!json_is_string(f)) return BAD(e, P, "'response_format.json_schema.%s' must be a string", key);
            } else if (!strcmp(key, "strict")) {
                if (!json_is_boolean(f) && !json_is_null(f)) return BAD(e, P, "'response_format.json_schema.strict' must be a boolean");
            } else {
                return BAD(e, P, "response_format.json_schema: unknown field '%s'", key);
            }
        }
        json_t *any = schema ? NULL : json_true();
        rc = strata_grammar_json_schema_tree(&r->grammar, schema ? schema : any, err, sizeof err);
        json_decref(any);
    } else {
        return BAD(e, P, "'response_format.type' must be text, json_object or json_schema (got '%s')", type);
    }
    if (rc == STRATA_ENOMEM) return req_fail(e, 500, "server_error", "out_of_memory", NULL, "out of memory");
    if (rc) return req_fail(e, 400, "invalid_request_error", "invalid_schema", P, "%s", err);
    return 0;
}

/* ===== entry ===== */

int request_parse(request *r, int kind, const uint8_t *body, size_t len, req_error *e) {
    char err[256];
    memset(r, 0, sizeof *r);
    memset(e, 0, sizeof *e);
    r->kind = kind;
    r->go = strata_gen_opts_default();
    r->go.seed = REQ_DEFAULT_SEED;
    r->effort = REQ_DEFAULT_EFFORT;
    r->n = 1;
    r->parallel_tools = 1;
    /* all white space: jansson would say "line -1 column -1" */
    size_t k = 0;
    while (k < len && (body[k] == ' ' || body[k] == '\t' || body[k] == '\r' || body[k] == '\n')) k++;
    if (k == len) return req_fail(e, 400, "invalid_request_error", "invalid_json", NULL, "empty request body (a JSON object is expected)");
    strata_json_parse(&r->root, body, len, "request body", err, sizeof err);
    if (!r->root) return req_fail(e, 400, "invalid_request_error", "invalid_json", NULL, "%s", err);
    if (!json_is_object(r->root)) { request_free(r); return req_fail(e, 400, "invalid_request_error", "invalid_json", NULL, "the request body must be a JSON object"); }
    const char *key;
    json_t *f;
    int have_main = 0, rc = 0;
    json_object_foreach(r->root, key, f) {
        if (json_is_null(f)) continue; /* null = absent */
        if (kind == REQ_TOKENIZE) {
            if (!strcmp(key, "content")) {
                if (!json_is_string(f)) { rc = BAD(e, key, "'content' must be a string"); break; }
                r->text = json_string_value(f);
                r->text_len = json_string_length(f);
                have_main = 1;
            } else if (!strcmp(key, "parse_special") || !strcmp(key, "add_special")) {
                int b = 0;
                if ((rc = get_bool(f, key, &b, e))) break;
                if (!strcmp(key, "parse_special")) r->parse_special = b;
            } else if (!strcmp(key, "model")) {
                if (!json_is_string(f)) { rc = BAD(e, key, "'model' must be a string"); break; }
                r->model = json_string_value(f);
            } else { rc = BAD(e, key, "unknown field '%s'", key); break; }
            continue;
        }
        if (kind == REQ_DETOKENIZE) {
            if (!strcmp(key, "tokens")) {
                if (!json_is_array(f)) { rc = BAD(e, key, "'tokens' must be an array of token ids"); break; }
                if ((rc = get_ids(r, f, "tokens", e))) break;
                have_main = 1;
            } else if (!strcmp(key, "model")) {
                if (!json_is_string(f)) { rc = BAD(e, key, "'model' must be a string"); break; }
                r->model = json_string_value(f);
            } else { rc = BAD(e, key, "unknown field '%s'", key); break; }
            continue;
        }
        int c = common_field(r, key, f, e);
        if (c < 0) { rc = -1; break; }
        if (c == 0) continue;
        if (kind == REQ_CHAT && !strcmp(key, "messages")) {
            if ((rc = parse_messages(r, f, e))) break;
            have_main = 1;
        } else if (kind == REQ_CHAT && !strcmp(key, "reasoning_effort")) {
            const char *v;
            if ((rc = get_cstr(f, key, &v, e))) break;
            if ((r->effort = req_effort(v)) < 0) {
                rc = BAD(e, key, "'reasoning_effort' must be none, minimal, low, medium, high or max (got '%s')", v);
                break;
            }
        } else if ((kind == REQ_CHAT || kind == REQ_COMPLETION) && !strcmp(key, "response_format")) {
            if ((rc = parse_response_format(r, f, e))) break;
        } else if (kind == REQ_CHAT && !strcmp(key, "tools")) {
            if ((rc = parse_tools(r, f, e))) break;
        } else if (kind == REQ_CHAT && !strcmp(key, "tool_choice")) {
            if ((rc = parse_tool_choice(r, f, e))) break;
        } else if (kind == REQ_CHAT && !strcmp(key, "parallel_tool_calls")) {
            if ((rc = get_bool(f, key, &r->parallel_tools, e))) break;
        } else if (kind == REQ_CHAT && !strcmp(key, "functions")) {
            rc = UNSUPPORTED(e, key, "'%s' is not supported", key);
            break;
        } else if (kind == REQ_COMPLETION && !strcmp(key, "prompt")) {
            if ((rc = parse_prompt(r, f, e))) break;
            have_main = 1;
        } else if (kind == REQ_COMPLETION && !strcmp(key, "suffix")) {
            rc = UNSUPPORTED(e, key, "'suffix' is not supported");
            break;
        } else {
            rc = BAD(e, key, "unknown field '%s'", key);
            break;
        }
    }
    if (!rc && !have_main) {
        const char *need = kind == REQ_CHAT ? "messages" : kind == REQ_COMPLETION ? "prompt" : kind == REQ_TOKENIZE ? "content" : "tokens";
        rc = BAD(e, need, "'%s' is required", need);
    }
    if (!rc && r->go.top_logprobs && !r->go.logprobs)
        rc = BAD(e, "top_logprobs", "'top_logprobs' needs 'logprobs': true");
    if (!rc && (r->tool_choice == STRATA_CHAT_TOOLS_REQUIRED || r->tool_choice == STRATA_CHAT_TOOLS_NAMED) && !r->n_tools)
        rc = BAD(e, "tool_choice", "'tool_choice' %s needs 'tools'", r->tool_choice_name ? "names a tool: it" : "required");
    if (!rc && r->tool_choice == STRATA_CHAT_TOOLS_NAMED) {
        size_t t = 0;
        while (t < r->n_tools && strcmp(r->tools[t].name, r->tool_choice_name)) t++;
        if (t == r->n_tools) rc = BAD(e, "tool_choice", "'tool_choice' names '%.64s', which 'tools' does not declare", r->tool_choice_name);
    }
    if (!rc && r->include_usage && !r->stream)
        rc = BAD(e, "stream_options", "'stream_options' is only allowed when 'stream' is true");
    if (rc) { request_free(r); return -1; }
    /* the document is the whole reply: no think channel before it */
    if (r->grammar && kind == REQ_CHAT) r->effort = STRATA_CHAT_THINK_OFF;
    return 0;
}

void request_free(request *r) {
    for (size_t i = 0; i < r->n_parts; i++) strata_free(r->parts[i]);
    strata_free(r->parts);
    for (size_t i = 0; r->msgs && i < r->cap_msgs; i++) {
        strata_free(r->msgs[i].calls);
        strata_free(r->msgs[i].call_ids);
    }
    strata_free(r->msgs);
    strata_free(r->tools);
    strata_free(r->ids);
    strata_grammar_free(r->grammar);
    json_decref(r->root);
    memset(r, 0, sizeof *r);
}
