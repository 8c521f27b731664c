/*
 * jschema.c: JSON schema subset -> byte grammar (see jschema.h).
 *
 * One recursive pass over the schema tree builds the nodes; a $ref target is
 * compiled once behind an alias node (so recursive schemas close on
 * themselves), and a last pass replaces every alias by its target and checks
 * that each choice's alternatives start with different bytes.
 */
#include "jschema.h"

#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include "base.h"
#include "jregex.h"
#include "jsonx.h"

#define MAX_ENUM 4096
#define MAX_PROPS 4096
#define MAX_BYTES (1 << 20)
#define MAX_NODES 65536
#define MAX_REFS 1024
#define MAX_REC 200      /* compile recursion (C stack) */
#define MAX_KEY 4096
#define MAX_PAT (1 << 22) /* uint16 entries of the pattern DFA tables of a schema (8 MiB) */

typedef struct { const json_t *s; int32_t node; } memo_t;

typedef struct cx {
    jgram *g;
    const json_t *root;
    char path[512];
    size_t plen;
    char *err;
    size_t errlen;
    int rc;
    memo_t *memo;
    int n_memo;
    int32_t any;        /* the any-value choice (-1 until needed) */
    int depth, rec;     /* containers open, recursion */
} cx;

static int32_t fail(cx *c, int rc, const char *fmt, ...) ST_PRINTF(3, 4);
static int32_t fail(cx *c, int rc, const char *fmt, ...) {
    if (c->rc) return -1;
    char why[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    c->rc = base_fail(c->err, c->errlen, rc, "json schema at #%s: %s", c->path, why);
    return -1;
}

static size_t path_push(cx *c, const char *seg) {
    size_t old = c->plen;
    int k = snprintf(c->path + c->plen, sizeof c->path - c->plen, "/%s", seg);
    if (k > 0) c->plen = c->plen + (size_t)k < sizeof c->path ? c->plen + (size_t)k : sizeof c->path - 1;
    return old;
}
static void path_pop(cx *c, size_t old) { c->plen = old; c->path[old] = 0; }

static int grow(cx *c, void **p, int32_t *cap, int32_t need, size_t elem) {
    if (need <= *cap) return 0;
    int32_t nc = *cap ? *cap : 64;
    while (nc < need) nc *= 2;
    void *q = base_realloc(*p, (size_t)nc * elem, MEM_MISC);
    if (!q) { fail(c, STRATA_ENOMEM, "out of memory"); return -1; }
    *p = q;
    *cap = nc;
    return 0;
}

static int32_t new_node(cx *c, int kind) {
    jgram *g = c->g;
    if (g->n_nodes >= MAX_NODES) return fail(c, STRATA_EINVAL, "the schema is too large (more than %d nodes)", MAX_NODES);
    if (grow(c, (void **)&g->nodes, &g->cap_nodes, g->n_nodes + 1, sizeof *g->nodes)) return -1;
    g->nodes[g->n_nodes] = (jg_node){.kind = kind, .extra = -1, .max = -1};
    return g->n_nodes++;
}

/* ===== compact JSON text ===== */

typedef struct { char *p; size_t n, cap; int over; } out_t;

static void put(out_t *o, const char *s, size_t n) {
    if (o->n + n > o->cap) { o->over = 1; return; }
    memcpy(o->p + o->n, s, n);
    o->n += n;
}

static void put_str(out_t *o, const char *s, size_t n) {
    put(o, "\"", 1);
    for (size_t i = 0; i < n; i++) {
        const unsigned char ch = (unsigned char)s[i];
        char e[8];
        if (ch == '"' || ch == '\\') { e[0] = '\\'; e[1] = (char)ch; put(o, e, 2); }
        else if (ch == '\n') put(o, "\\n", 2);
        else if (ch == '\t') put(o, "\\t", 2);
        else if (ch < 0x20) { snprintf(e, sizeof e, "\\u%04x", ch); put(o, e, 6); }
        else put(o, s + i, 1);
    }
    put(o, "\"", 1);
}

static void dump(out_t *o, const json_t *v, int depth) {
    char num[40];
    if (depth > 64) { o->over = 1; return; }
    switch (json_typeof(v)) {
    case JSON_NULL: put(o, "null", 4); break;
    case JSON_TRUE: put(o, "true", 4); break;
    case JSON_FALSE: put(o, "false", 5); break;
    case JSON_INTEGER: put(o, num, (size_t)snprintf(num, sizeof num, "%" JSON_INTEGER_FORMAT, json_integer_value(v))); break;
    case JSON_REAL: put(o, num, (size_t)snprintf(num, sizeof num, "%.17g", json_real_value(v))); break;
    case JSON_STRING: put_str(o, json_string_value(v), json_string_length(v)); break;
    case JSON_ARRAY: {
        put(o, "[", 1);
        for (size_t i = 0; i < json_array_size(v); i++) {
            if (i) put(o, ",", 1);
            dump(o, json_array_get(v, i), depth + 1);
        }
        put(o, "]", 1);
        break;
    }
    case JSON_OBJECT: {
        const char *k;
        json_t *x;
        int first = 1;
        put(o, "{", 1);
        json_object_foreach((json_t *)v, k, x) {
            if (!first) put(o, ",", 1);
            first = 0;
            put_str(o, k, strlen(k));
            put(o, ":", 1);
            dump(o, x, depth + 1);
        }
        put(o, "}", 1);
        break;
    }
    }
}

long jschema_dump(const json_t *v, char *buf, size_t cap) {
    out_t o = {buf, 0, cap, 0};
    dump(&o, v, 0);
    return o.over ? -1 : (long)o.n;
}

/* Appends JSON text to the grammar's bytes: its offset, or -1. */
static int64_t add_text(cx *c, const json_t *v, const char *key, int32_t *len) {
    jgram *g = c->g;
    const size_t room = MAX_BYTES - (size_t)g->n_bytes;
    if (g->cap_bytes < MAX_BYTES) {
        uint8_t *q = base_realloc(g->bytes, MAX_BYTES, MEM_MISC);
        if (!q) return fail(c, STRATA_ENOMEM, "out of memory");
        g->bytes = q;
        g->cap_bytes = MAX_BYTES;
    }
    out_t o = {(char *)g->bytes + g->n_bytes, 0, room, 0};
    if (key) put_str(&o, key, strlen(key));
    else dump(&o, v, 0);
    if (o.over) return fail(c, STRATA_EINVAL, "the schema's keys and literals pass %d bytes (or nest too deep)", MAX_BYTES);
    const int64_t off = g->n_bytes;
    g->n_bytes += (int64_t)o.n;
    *len = (int32_t)o.n;
    return off;
}

/* ===== keywords ===== */

static const char *const k_notes[] = {"title", "description", "default", "examples", "$schema", "$id", "$comment", "$defs",
                                      "definitions", "deprecated", "readOnly", "writeOnly", NULL};
static const char *const k_known[] = {"type", "properties", "required", "additionalProperties", "enum", "const", "items",
                                      "minItems", "maxItems", "minLength", "maxLength", "anyOf", "oneOf", "$ref",
                                      "pattern", "format", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", NULL};

static int in_list(const char *k, const char *const *l) {
    for (; *l; l++) if (!strcmp(k, *l)) return 1;
    return 0;
}

/* The one constraining keyword of s other than `allow` and `self`, or NULL. */
static const char *other_keyword(const json_t *s, const char *self, const char *allow) {
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)s, k, v)
        if (!in_list(k, k_notes) && strcmp(k, self) && (!allow || strcmp(k, allow))) return k;
    return NULL;
}

static int get_count(cx *c, const json_t *s, const char *key, int64_t *out) {
    json_t *v = json_object_get(s, key);
    if (!v) return 0;
    int64_t x;
    if (jsonx_int(v, &x) || json_is_boolean(v) || x < 0) { fail(c, STRATA_EINVAL, "'%s' must be a non-negative integer", key); return -1; }
    *out = x;
    return 0;
}

static int32_t comp(cx *c, const json_t *s);

static int32_t lit_node(cx *c, const char *const *words, int n) {
    int32_t id = new_node(c, JG_LIT);
    if (id < 0) return -1;
    jgram *g = c->g;
    if (grow(c, (void **)&g->lits, &g->cap_lits, g->n_lits + n, sizeof *g->lits)) return -1;
    g->nodes[id].lo = g->n_lits;
    g->nodes[id].n = n;
    for (int i = 0; i < n; i++) {
        json_t *w = !strcmp(words[i], "null") ? json_null() : !strcmp(words[i], "true") ? json_true() : json_false();
        int32_t len;
        int64_t off = add_text(c, w, NULL, &len);
        json_decref(w);
        if (off < 0) return -1;
        g->lits[g->n_lits++] = (jg_lit){(int32_t)off, len};
    }
    return id;
}

static int32_t choice_node(cx *c, const int32_t *alts, int n) {
    int32_t id = new_node(c, JG_CHOICE);
    if (id < 0) return -1;
    jgram *g = c->g;
    if (grow(c, (void **)&g->alts, &g->cap_alts, g->n_alts + n, sizeof *g->alts)) return -1;
    g->nodes[id].lo = g->n_alts;
    g->nodes[id].n = n;
    memcpy(g->alts + g->n_alts, alts, (size_t)n * sizeof *alts);
    g->n_alts += n;
    return id;
}

/* Any JSON value: free-form object, array of any, string, number, literals. */
static int32_t any_node(cx *c) {
    if (c->any >= 0) return c->any;
    int32_t alts[5];
    static const char *const w[] = {"true", "false", "null"};
    if ((alts[0] = new_node(c, JG_OBJ)) < 0 || (alts[1] = new_node(c, JG_ARR)) < 0 || (alts[2] = new_node(c, JG_STR)) < 0 ||
        (alts[3] = new_node(c, JG_NUM)) < 0 || (alts[4] = lit_node(c, w, 3)) < 0)
        return -1;
    if ((c->any = choice_node(c, alts, 5)) < 0) return -1;
    c->g->nodes[alts[0]].extra = c->any;
    c->g->nodes[alts[1]].lo = c->any;
    c->g->nodes[alts[1]].min = 0;
    return c->any;
}

static int type_of(const json_t *v, const char *t) {
    if (!strcmp(t, "null")) return json_is_null(v);
    if (!strcmp(t, "boolean")) return json_is_boolean(v);
    if (!strcmp(t, "integer")) { int64_t x; return json_is_integer(v) || (json_is_real(v) && !jsonx_int(v, &x)); }
    if (!strcmp(t, "number")) return json_is_number(v);
    if (!strcmp(t, "string")) return json_is_string(v);
    if (!strcmp(t, "array")) return json_is_array(v);
    if (!strcmp(t, "object")) return json_is_object(v);
    return 0;
}

/* enum / const: the literal texts, those of the schema's types when it has 'type'. */
static int32_t comp_enum(cx *c, const json_t *s, const char *const *types, int n_types) {
    const json_t *e = json_object_get(s, "enum"), *k = json_object_get(s, "const");
    if (e && k) return fail(c, STRATA_EINVAL, "'enum' and 'const' together are not supported");
    const char *o = other_keyword(s, e ? "enum" : "const", "type");
    if (o) return fail(c, STRATA_EINVAL, "'%s' beside '%s' is not supported", o, e ? "enum" : "const");
    if (e && (!json_is_array(e) || json_array_size(e) == 0)) return fail(c, STRATA_EINVAL, "'enum' must be a non-empty array");
    const size_t n = e ? json_array_size(e) : 1;
    if (n > MAX_ENUM) return fail(c, STRATA_EINVAL, "'enum' has %zu values; at most %d are supported", n, MAX_ENUM);
    int32_t id = new_node(c, JG_LIT);
    jgram *g = c->g;
    if (id < 0 || grow(c, (void **)&g->lits, &g->cap_lits, g->n_lits + (int32_t)n, sizeof *g->lits)) return -1;
    g->nodes[id].lo = g->n_lits;
    for (size_t i = 0; i < n; i++) {
        const json_t *v = e ? json_array_get(e, i) : k;
        int ok = n_types == 0;
        for (int t = 0; t < n_types; t++) ok |= type_of(v, types[t]);
        if (!ok) continue;
        int32_t len;
        int64_t off = add_text(c, v, NULL, &len);
        if (off < 0) return -1;
        g->lits[g->n_lits++] = (jg_lit){(int32_t)off, len};
        g->nodes[id].n++;
    }
    if (g->nodes[id].n == 0) return fail(c, STRATA_EINVAL, "no value of '%s' has the schema's 'type'", e ? "enum" : "const");
    return id;
}

/* 1: the i-th property (schema order) is named in required. */
static int kid_required(const json_t *req, const json_t *props, size_t i) {
    const char *k;
    json_t *v;
    size_t j = 0;
    json_object_foreach((json_t *)props, k, v) {
        if (j++ != i) continue;
        for (size_t r = 0; req && r < json_array_size(req); r++)
            if (!strcmp(json_string_value(json_array_get(req, r)), k)) return 1;
        return 0;
    }
    return 0;
}

static int32_t comp_object(cx *c, const json_t *s) {
    const json_t *props = json_object_get(s, "properties"), *req = json_object_get(s, "required"),
                 *add = json_object_get(s, "additionalProperties");
    if (props && !json_is_object(props)) return fail(c, STRATA_EINVAL, "'properties' must be an object");
    if (req && !json_is_array(req)) return fail(c, STRATA_EINVAL, "'required' must be an array of strings");
    if (add && !json_is_boolean(add) && !json_is_object(add))
        return fail(c, STRATA_EINVAL, "'additionalProperties' must be a boolean or a schema");
    const size_t np = props ? json_object_size(props) : 0;
    if (np > MAX_PROPS) return fail(c, STRATA_EINVAL, "%zu properties; at most %d are supported", np, MAX_PROPS);
    for (size_t i = 0; req && i < json_array_size(req); i++) {
        const json_t *r = json_array_get(req, i);
        if (!json_is_string(r)) return fail(c, STRATA_EINVAL, "'required' must be an array of strings");
        if (!props || !json_object_get(props, json_string_value(r)))
            return fail(c, STRATA_EINVAL, "required property '%s' is not in 'properties' (only listed properties are generated)",
                        json_string_value(r));
    }
    const int32_t id = new_node(c, JG_OBJ);
    if (id < 0) return -1;
    if (++c->depth >= JG_MAX_DEPTH) return fail(c, STRATA_EINVAL, "containers nest deeper than %d", JG_MAX_DEPTH - 1);
    if (np == 0) {
        int32_t v = -1;
        if (!add || json_is_true(add)) v = any_node(c);
        else if (json_is_object(add)) {
            size_t old = path_push(c, "additionalProperties");
            v = comp(c, add);
            path_pop(c, old);
        }
        if (c->rc) return -1;
        c->g->nodes[id].extra = v;
        c->depth--;
        return id;
    }
    /* children first: this object's properties must be contiguous */
    int32_t *kid = base_alloc(np * sizeof *kid, MEM_MISC);
    if (!kid) return fail(c, STRATA_ENOMEM, "out of memory");
    const char *k;
    json_t *v;
    size_t i = 0;
    json_object_foreach((json_t *)props, k, v) {
        if (strlen(k) > MAX_KEY) { base_free(kid); return fail(c, STRATA_EINVAL, "a property name is longer than %d bytes", MAX_KEY); }
        size_t old = path_push(c, "properties");
        path_push(c, k);
        kid[i++] = comp(c, v);
        path_pop(c, old);
        if (c->rc) { base_free(kid); return -1; }
    }
    jgram *g = c->g;
    if (grow(c, (void **)&g->props, &g->cap_props, g->n_props + (int32_t)np, sizeof *g->props)) { base_free(kid); return -1; }
    const int32_t lo = g->n_props;
    i = 0;
    json_object_foreach((json_t *)props, k, v) {
        int32_t len;
        int64_t off = add_text(c, NULL, k, &len);
        if (off < 0) { base_free(kid); return -1; }
        g->props[g->n_props++] = (jg_prop){(int32_t)off, len, kid[i], 0};
        i++;
    }
    base_free(kid);
    /* req_next: the first required property at or after each one */
    int32_t next = (int32_t)np;
    for (int32_t j = (int32_t)np - 1; j >= 0; j--) {
        if (kid_required(req, props, (size_t)j)) next = j;
        g->props[lo + j].req_next = next;
    }
    g->nodes[id].lo = lo;
    g->nodes[id].n = (int32_t)np;
    c->depth--;
    return id;
}

static int32_t comp_array(cx *c, const json_t *s) {
    const json_t *items = json_object_get(s, "items");
    if (items && json_is_array(items)) return fail(c, STRATA_EINVAL, "'items' as an array (tuples) is not supported");
    int64_t mn = 0, mx = -1;
    if (get_count(c, s, "minItems", &mn) || get_count(c, s, "maxItems", &mx)) return -1;
    if (mx >= 0 && mn > mx) return fail(c, STRATA_EINVAL, "minItems %" PRId64 " > maxItems %" PRId64, mn, mx);
    if (mn > 1000000) return fail(c, STRATA_EINVAL, "minItems %" PRId64 " is too large", mn);
    const int32_t id = new_node(c, JG_ARR);
    if (id < 0) return -1;
    if (++c->depth >= JG_MAX_DEPTH) return fail(c, STRATA_EINVAL, "containers nest deeper than %d", JG_MAX_DEPTH - 1);
    int32_t it;
    if (!items) it = any_node(c);
    else {
        size_t old = path_push(c, "items");
        it = comp(c, items);
        path_pop(c, old);
    }
    c->depth--;
    if (it < 0) return -1;
    c->g->nodes[id].lo = it;
    c->g->nodes[id].min = mn;
    c->g->nodes[id].max = mx;
    return id;
}

/* A string with a pattern and/or a format (checked in comp), its length bounds
 * folded into one DFA (jregex.h) whose rows join the grammar's pat[]; kind
 * JG_INTR: the digits of an integer range, pat its pattern. */
static int32_t comp_pattern(cx *c, const json_t *pat, const json_t *fmt, int64_t mn, int64_t mx, int kind, const char *range) {
    char why[256];
    uint16_t *rows = NULL;
    size_t len = 0;
    int32_t n = 0, ncls = 0;
    const char *ptext = pat ? json_string_value(pat) : range, *ftext = fmt ? json_string_value(fmt) : NULL;
    if (jregex_compile(ptext, pat ? json_string_length(pat) : range ? strlen(range) : 0, ftext, mn, mx, &rows, &len, &n, &ncls, why,
                       sizeof why)) {
        if (range) return fail(c, STRATA_EINVAL, "the integer range: %s", why);
        if (pat) return fail(c, STRATA_EINVAL, "'pattern' '%.100s'%s%s%s: %s", ptext, fmt ? " with format '" : "", fmt ? ftext : "",
                             fmt ? "'" : "", why);
        return fail(c, STRATA_EINVAL, "'format' '%s': %s", ftext, why);
    }
    jgram *g = c->g;
    const int64_t need = g->n_pat + (int64_t)len;
    if (need > MAX_PAT) {
        base_free(rows);
        return fail(c, STRATA_EINVAL, "the schema's patterns and formats need more than %d MiB of automata in all", MAX_PAT >> 19);
    }
    if (need > g->cap_pat) {
        int64_t nc = g->cap_pat ? g->cap_pat : 4096;
        while (nc < need) nc *= 2;
        uint16_t *q = base_realloc(g->pat, (size_t)nc * sizeof *q, MEM_MISC);
        if (!q) { base_free(rows); return fail(c, STRATA_ENOMEM, "out of memory"); }
        g->pat = q;
        g->cap_pat = nc;
    }
    const int32_t id = new_node(c, kind);
    if (id < 0) { base_free(rows); return -1; }
    memcpy(g->pat + g->n_pat, rows, len * sizeof *rows);
    g->nodes[id].lo = (int32_t)g->n_pat;
    g->nodes[id].n = n;
    g->nodes[id].extra = ncls;
    g->n_pat = need;
    base_free(rows);
    return id;
}

static int32_t comp_type(cx *c, const json_t *s, const char *t) {
    static const char *const k_null[] = {"null"}, *const k_bool[] = {"true", "false"};
    if (!strcmp(t, "null")) return lit_node(c, k_null, 1);
    if (!strcmp(t, "boolean")) return lit_node(c, k_bool, 2);
    if (!strcmp(t, "number") || !strcmp(t, "integer")) {
        static const char *const kb[] = {"minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum"};
        const int integer = !strcmp(t, "integer");
        int64_t lo = -(INT64_C(1000000000000000) - 1), hi = INT64_C(1000000000000000) - 1; /* 15 digits, as JG_INT */
        int bounded = 0;
        for (int k = 0; k < 4; k++) {
            const json_t *v = json_object_get(s, kb[k]);
            if (!v) continue;
            if (!json_is_number(v)) return fail(c, STRATA_EINVAL, "'%s' must be a number", kb[k]);
            if (!integer) return fail(c, STRATA_EINVAL, "'%s' is supported on 'integer', not on 'number'", kb[k]);
            const double x = json_number_value(v);
            if (!(fabs(x) < 1e15)) return fail(c, STRATA_EINVAL, "'%s' %g: bounds of 15 digits at most are supported", kb[k], x);
            /* the integers the bound lets through: inclusive ceil/floor, exclusive one past */
            const int64_t b = k == 0 ? (int64_t)ceil(x) : k == 1 ? (int64_t)floor(x) + 1 : k == 2 ? (int64_t)floor(x) : (int64_t)ceil(x) - 1;
            if (k < 2 && b > lo) lo = b;
            if (k >= 2 && b < hi) hi = b;
            bounded = 1;
        }
        if (!bounded) return new_node(c, integer ? JG_INT : JG_NUM);
        if (lo > hi) return fail(c, STRATA_EINVAL, "no integer lies between the bounds");
        char range[4096];
        if (jregex_int_range(lo, hi, range, sizeof range) < 0) return fail(c, STRATA_EINVAL, "the integer range is too complex");
        return comp_pattern(c, NULL, NULL, 0, -1, JG_INTR, range);
    }
    if (!strcmp(t, "object")) return comp_object(c, s);
    if (!strcmp(t, "array")) return comp_array(c, s);
    if (!strcmp(t, "string")) {
        int64_t mn = 0, mx = -1;
        if (get_count(c, s, "minLength", &mn) || get_count(c, s, "maxLength", &mx)) return -1;
        if (mx >= 0 && mn > mx) return fail(c, STRATA_EINVAL, "minLength %" PRId64 " > maxLength %" PRId64, mn, mx);
        if (mn > 1000000 || mx > INT32_MAX) return fail(c, STRATA_EINVAL, "string lengths above 1000000 are not supported");
        const json_t *pat = json_object_get(s, "pattern"), *fmt = json_object_get(s, "format");
        if (pat || fmt) return comp_pattern(c, pat, fmt, mn, mx, JG_PAT, NULL);
        int32_t id = new_node(c, JG_STR);
        if (id < 0) return -1;
        c->g->nodes[id].min = mn;
        c->g->nodes[id].max = mx;
        return id;
    }
    return fail(c, STRATA_EINVAL, "unknown type '%s'", t);
}

/* Resolves a local JSON pointer ("#", "#/$defs/a"). */
static const json_t *resolve(cx *c, const char *ref) {
    if (ref[0] != '#') { fail(c, STRATA_EINVAL, "'$ref' '%.100s': only local references ('#...') are supported", ref); return NULL; }
    const json_t *v = c->root;
    const char *p = ref + 1;
    while (v && *p == '/') {
        char seg[256];
        size_t n = 0;
        for (p++; *p && *p != '/'; p++) {
            char ch = *p;
            if (ch == '~' && (p[1] == '0' || p[1] == '1')) ch = *++p == '0' ? '~' : '/';
            if (n + 1 < sizeof seg) seg[n++] = ch;
        }
        seg[n] = 0;
        if (json_is_object(v)) v = json_object_get(v, seg);
        else if (json_is_array(v)) {
            int64_t i;
            v = base_parse_i64(seg, 0, INT32_MAX, &i) ? NULL : json_array_get(v, (size_t)i);
        } else v = NULL;
    }
    if (!v || *p) { fail(c, STRATA_EINVAL, "'$ref' '%.100s' points at nothing", ref); return NULL; }
    return v;
}

static int32_t comp_ref(cx *c, const json_t *s) {
    const json_t *r = json_object_get(s, "$ref");
    if (!json_is_string(r)) return fail(c, STRATA_EINVAL, "'$ref' must be a string");
    const char *o = other_keyword(s, "$ref", NULL);
    if (o) return fail(c, STRATA_EINVAL, "'%s' beside '$ref' is not supported", o);
    const json_t *t = resolve(c, json_string_value(r));
    if (!t) return -1;
    for (int i = 0; i < c->n_memo; i++)
        if (c->memo[i].s == t) return c->memo[i].node;
    if (c->n_memo >= MAX_REFS) return fail(c, STRATA_EINVAL, "more than %d distinct '$ref' targets", MAX_REFS);
    const int32_t alias = new_node(c, JG_ALIAS);
    if (alias < 0) return -1;
    c->memo[c->n_memo++] = (memo_t){t, alias};
    char saved[sizeof c->path];
    const size_t plen = c->plen;
    memcpy(saved, c->path, sizeof saved);
    c->plen = (size_t)snprintf(c->path, sizeof c->path, "%s", json_string_value(r) + 1);
    if (c->plen >= sizeof c->path) c->plen = sizeof c->path - 1;
    const int depth = c->depth;
    c->depth = 0; /* a target is compiled once, for every place that uses it */
    const int32_t x = comp(c, t);
    c->depth = depth;
    memcpy(c->path, saved, sizeof saved);
    c->plen = plen;
    if (x < 0) return -1;
    c->g->nodes[alias].extra = x;
    return alias;
}

static int32_t comp_any_of(cx *c, const json_t *s) {
    const char *kw = json_object_get(s, "anyOf") ? "anyOf" : "oneOf";
    const json_t *l = json_object_get(s, kw);
    if (!json_is_array(l) || json_array_size(l) == 0) return fail(c, STRATA_EINVAL, "'%s' must be a non-empty array", kw);
    const char *o = other_keyword(s, kw, NULL);
    if (o) return fail(c, STRATA_EINVAL, "'%s' beside '%s' is not supported", o, kw);
    const size_t n = json_array_size(l);
    if (n > 16) return fail(c, STRATA_EINVAL, "'%s' has %zu alternatives; at most 16 are supported", kw, n);
    int32_t alts[16];
    for (size_t i = 0; i < n; i++) {
        char seg[80];
        snprintf(seg, sizeof seg, "%s/%zu", kw, i);
        size_t old = path_push(c, seg);
        alts[i] = comp(c, json_array_get(l, i));
        path_pop(c, old);
        if (alts[i] < 0) return -1;
    }
    return choice_node(c, alts, (int)n);
}

static int32_t comp(cx *c, const json_t *s) {
    if (c->rc) return -1;
    if (json_is_true(s)) return any_node(c);
    if (json_is_false(s)) return fail(c, STRATA_EINVAL, "the schema 'false' matches nothing");
    if (!json_is_object(s)) return fail(c, STRATA_EINVAL, "a schema must be an object or a boolean");
    if (++c->rec > MAX_REC) return fail(c, STRATA_EINVAL, "the schema nests deeper than %d", MAX_REC);
    int32_t id = -1;
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)s, k, v)
        if (!in_list(k, k_notes) && !in_list(k, k_known)) { fail(c, STRATA_EINVAL, "unsupported keyword '%s'", k); goto out; }
    if (json_object_get(s, "$ref")) { id = comp_ref(c, s); goto out; }
    if (json_object_get(s, "anyOf") || json_object_get(s, "oneOf")) { id = comp_any_of(c, s); goto out; }
    const char *types[8];
    int nt = 0;
    const json_t *t = json_object_get(s, "type");
    if (json_is_string(t)) types[nt++] = json_string_value(t);
    else if (json_is_array(t) && json_array_size(t) >= 1 && json_array_size(t) <= 7) {
        for (size_t i = 0; i < json_array_size(t); i++) {
            if (!json_is_string(json_array_get(t, i))) { fail(c, STRATA_EINVAL, "'type' must be a string or an array of strings"); goto out; }
            const char *x = json_string_value(json_array_get(t, i));
            int dup = 0;
            for (int j = 0; j < nt; j++) dup |= !strcmp(types[j], x);
            if (!dup) types[nt++] = x;
        }
    } else if (t) { fail(c, STRATA_EINVAL, "'type' must be a string or a list of 1 to 7 strings"); goto out; }
    /* pattern and format constrain strings only (other types ignore them, as JSON
     * Schema says), but an unknown format is refused wherever it is */
    const json_t *pat = json_object_get(s, "pattern"), *fmt = json_object_get(s, "format");
    if (pat && !json_is_string(pat)) { fail(c, STRATA_EINVAL, "'pattern' must be a string"); goto out; }
    if (fmt && (!json_is_string(fmt) || !jregex_format(json_string_value(fmt)))) {
        fail(c, STRATA_EINVAL, "unsupported format '%.60s' (supported: date, time, date-time, uuid, email, ipv4)",
             json_is_string(fmt) ? json_string_value(fmt) : "(not a string)");
        goto out;
    }
    if (json_object_get(s, "enum") || json_object_get(s, "const")) { id = comp_enum(c, s, types, nt); goto out; }
    if (nt == 0) { /* the type the keywords imply */
        int obj = json_object_get(s, "properties") || json_object_get(s, "required") || json_object_get(s, "additionalProperties");
        int arr = json_object_get(s, "items") || json_object_get(s, "minItems") || json_object_get(s, "maxItems");
        int str = json_object_get(s, "minLength") || json_object_get(s, "maxLength") || json_object_get(s, "pattern") ||
                  json_object_get(s, "format");
        if (obj + arr + str > 1) { fail(c, STRATA_EINVAL, "keywords of several types without 'type'"); goto out; }
        if (!obj && !arr && !str) { id = any_node(c); goto out; }
        types[nt++] = obj ? "object" : arr ? "array" : "string";
    }
    /* integer and number together: number */
    int has_num = 0;
    for (int i = 0; i < nt; i++) has_num |= !strcmp(types[i], "number");
    int32_t alts[8];
    int na = 0;
    for (int i = 0; i < nt; i++) {
        if (has_num && !strcmp(types[i], "integer")) continue;
        if ((alts[na++] = comp_type(c, s, types[i])) < 0) goto out;
    }
    id = na == 1 ? alts[0] : choice_node(c, alts, na);
out:
    c->rec--;
    return c->rc ? -1 : id;
}

/* ===== the last pass ===== */

static int32_t unalias(const jgram *g, int32_t id) {
    for (int32_t i = 0; id >= 0 && g->nodes[id].kind == JG_ALIAS; i++) {
        if (i > g->n_nodes) return -1;
        id = g->nodes[id].extra;
    }
    return id;
}

static int first_set(const jgram *g, int32_t id, uint8_t set[256], int guard) {
    const jg_node *n = &g->nodes[id];
    if (guard > 64) return -1;
    switch (n->kind) {
    case JG_OBJ: set['{'] = 1; break;
    case JG_ARR: set['['] = 1; break;
    case JG_STR: case JG_PAT: set['"'] = 1; break;
    case JG_NUM: case JG_INT: case JG_INTR: set['-'] = 1; for (int ch = '0'; ch <= '9'; ch++) set[ch] = 1; break;
    case JG_LIT: for (int32_t i = 0; i < n->n; i++) set[g->bytes[g->lits[n->lo + i].off]] = 1; break;
    case JG_CHOICE:
        for (int32_t i = 0; i < n->n; i++)
            if (first_set(g, g->alts[n->lo + i], set, guard + 1)) return -1;
        break;
    }
    return 0;
}

static int finish(cx *c) {
    jgram *g = c->g;
#define FIX(x) do { int32_t r_ = unalias(g, (x)); if (r_ < 0 && (x) >= 0) { c->path[0] = 0; \
        return fail(c, STRATA_EINVAL, "a '$ref' cycle with no value between"), -1; } (x) = r_; } while (0)
    FIX(g->root);
    for (int32_t i = 0; i < g->n_props; i++) FIX(g->props[i].node);
    for (int32_t i = 0; i < g->n_alts; i++) FIX(g->alts[i]);
    for (int32_t i = 0; i < g->n_nodes; i++) {
        jg_node *n = &g->nodes[i];
        if (n->kind == JG_ARR) FIX(n->lo);
        if (n->kind == JG_OBJ && n->extra >= 0) FIX(n->extra);
    }
#undef FIX
    /* each choice: alternatives with disjoint first bytes */
    for (int32_t i = 0; i < g->n_nodes; i++) {
        const jg_node *n = &g->nodes[i];
        if (n->kind != JG_CHOICE) continue;
        uint8_t seen[256] = {0};
        for (int32_t a = 0; a < n->n; a++) {
            uint8_t set[256] = {0};
            c->path[0] = 0;
            if (first_set(g, g->alts[n->lo + a], set, 0))
                return fail(c, STRATA_EINVAL, "alternatives (anyOf, type lists) nest deeper than 64 or loop through '$ref'");
            for (int ch = 0; ch < 256; ch++) {
                if (set[ch] && seen[ch])
                    return fail(c, STRATA_EINVAL,
                                "two alternatives (anyOf, oneOf or a type list) can both start with '%c'; only alternatives "
                                "of different JSON types are supported",
                                ch >= 0x20 && ch < 0x7F ? ch : '?');
                seen[ch] |= set[ch];
            }
        }
    }
    return 0;
}

static int compile(jgram **out, const json_t *schema, int object_only, char *err, size_t errlen) {
    *out = NULL;
    cx c = {.root = schema, .err = err, .errlen = errlen, .any = -1};
    c.g = base_calloc(1, sizeof *c.g, MEM_MISC);
    c.memo = base_alloc(MAX_REFS * sizeof *c.memo, MEM_MISC);
    if (!c.g || !c.memo) {
        base_free(c.memo);
        jgram_free(c.g);
        return base_fail(err, errlen, STRATA_ENOMEM, "json schema: out of memory");
    }
    if (object_only) {
        int32_t any = any_node(&c);
        c.g->root = any >= 0 ? c.g->alts[c.g->nodes[any].lo] : -1; /* its free-form object */
    } else {
        c.g->root = comp(&c, schema);
    }
    if (!c.rc) finish(&c);
    base_free(c.memo);
    if (c.rc) { jgram_free(c.g); return c.rc; }
    *out = c.g;
    return 0;
}

int jschema_compile(jgram **out, const json_t *schema, char *err, size_t errlen) {
    return compile(out, schema, 0, err, errlen);
}

int jschema_json_object(jgram **out, char *err, size_t errlen) { return compile(out, NULL, 1, err, errlen); }
