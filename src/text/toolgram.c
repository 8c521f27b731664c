/*
 * toolgram.c: the grammar of a forced tool call (see toolgram.h). Built back
 * to front: the section's close, then the states "k calls written" (another
 * call or the close), then the first call after the prefill. Each tool's
 * arguments node runs from after its call head through its call tail, so the
 * same node serves every call index.
 */
#include "toolgram.h"

#include <jansson.h>
#include <string.h>
#include "base.h"
#include "jschema.h"
#include "jsonx.h"

#define MAX_TYPED_PROPS 64 /* more properties: the JSON block (the typed chains grow with its square) */
#define MAX_TYPES 8        /* JSON types one property's value may take */

typedef struct {
    jgram *g;
    int fmt;
    tools_special_fn special;
    void *ud;
    uint8_t *b;            /* the bytes of the part being expanded */
    size_t n, cap;
    int oom;
    int markers;           /* the XTML markers are special tokens (raw values can end) */
} tg;

static void put(tg *t, const void *p, size_t n) {
    if (t->oom) return;
    if (t->n + n > t->cap) {
        size_t cap = t->cap ? t->cap : 256;
        while (cap < t->n + n) cap *= 2;
        uint8_t *nb = base_realloc(t->b, cap, MEM_MISC);
        if (!nb) { t->oom = 1; return; }
        t->b = nb;
        t->cap = cap;
    }
    memcpy(t->b + t->n, p, n);
    t->n += n;
}

static void seg(void *ud, const char *s, size_t n, int special) {
    tg *t = ud;
    const int32_t id = special ? t->special(t->ud, s, n) : -1;
    if (id < 0) { put(t, s, n); return; }
    uint8_t sp[JG_SPECIAL_LEN];
    jgram_special_bytes(id, sp);
    put(t, sp, sizeof sp);
}

/* The bytes of one part into t->b / t->n: 0, or -1. */
static int part(tg *t, int which, const char *name, size_t index, const char *key, const char *type) {
    t->n = 0;
    if (tools_expand_part(t->fmt, which, name, index, key, type, seg, t) || t->oom || !t->n) return -1;
    return 0;
}

static int32_t lit_part(tg *t, int which, const char *name, size_t index) {
    return part(t, which, name, index, NULL, NULL) ? -1 : jgram_add_lit(t->g, t->b, t->n);
}

/* A growing list of owned keys and their nodes, for one KEYED node. */
typedef struct {
    uint8_t **keys;
    size_t *lens;
    int32_t *nodes;
    int n, cap, oom;
} keyset;

static void ks_add(keyset *k, const uint8_t *p, size_t n, int32_t node) {
    if (k->oom) return;
    if (k->n == k->cap) {
        const int cap = k->cap ? 2 * k->cap : 16;
        uint8_t **a = base_realloc(k->keys, (size_t)cap * sizeof *a, MEM_MISC);
        if (a) k->keys = a;
        size_t *b = base_realloc(k->lens, (size_t)cap * sizeof *b, MEM_MISC);
        if (b) k->lens = b;
        int32_t *c = base_realloc(k->nodes, (size_t)cap * sizeof *c, MEM_MISC);
        if (c) k->nodes = c;
        if (!a || !b || !c) { k->oom = 1; return; }
        k->cap = cap;
    }
    uint8_t *d = base_alloc(n ? n : 1, MEM_MISC);
    if (!d) { k->oom = 1; return; }
    memcpy(d, p, n);
    k->keys[k->n] = d;
    k->lens[k->n] = n;
    k->nodes[k->n++] = node;
}

/* The KEYED node of k (then emptied for reuse), or -1. */
static int32_t ks_node(tg *t, keyset *k) {
    const int32_t id = k->oom ? -1 : jgram_add_keyed(t->g, (const uint8_t *const *)k->keys, k->lens, k->nodes, k->n);
    for (int i = 0; i < k->n; i++) base_free(k->keys[i]);
    k->n = 0;
    return id;
}

static void ks_free(keyset *k) {
    for (int i = 0; i < k->n; i++) base_free(k->keys[i]);
    base_free(k->keys);
    base_free(k->lens);
    base_free(k->nodes);
}

/* ---- XTML typed arguments ---- */

typedef struct { const char *type; int32_t node; } typed_val;

/* The JSON type name of a literal's text (for the type attribute). */
static const char *lit_type(const uint8_t *p, int32_t n) {
    switch (p[0]) {
    case '"': return "string";
    case 't': case 'f': return "boolean";
    case 'n': return "null";
    case '{': return "object";
    case '[': return "array";
    }
    for (int32_t i = 0; i < n; i++)
        if (p[i] == '.' || p[i] == 'e' || p[i] == 'E') return "number";
    return "integer";
}

/* The (type, value node) pairs one property's value may take: *n, or -1 when
 * the value cannot be typed (two alternatives of one type, an escaped string
 * literal). Strings become raw text. */
static int prop_types(tg *t, int32_t v, typed_val *out) {
    jgram *g = t->g;
    int32_t alts[MAX_TYPES];
    int na = 0;
    if (g->nodes[v].kind == JG_CHOICE) {
        if (g->nodes[v].n > MAX_TYPES) return -1;
        for (int32_t i = 0; i < g->nodes[v].n; i++) alts[na++] = g->alts[g->nodes[v].lo + i];
    } else {
        alts[na++] = v;
    }
    int n = 0;
    for (int i = 0; i < na; i++) {
        const jg_node nd = g->nodes[alts[i]];
        if (nd.kind == JG_LIT) {
            /* one literal node per JSON type among the enum's values */
            static const char *const k_types[] = {"string", "boolean", "null", "object", "array", "number", "integer"};
            for (int ty = 0; ty < 7; ty++) {
                const uint8_t *lp[64];
                size_t ll[64];
                int nl = 0;
                for (int32_t k = 0; k < nd.n; k++) {
                    const jg_lit l = g->lits[nd.lo + k];
                    const uint8_t *p = g->bytes + l.off;
                    if (strcmp(lit_type(p, l.len), k_types[ty])) continue;
                    if (nl == 64) return -1;
                    if (ty == 0) { /* raw: the text between the quotes, which must need no escape */
                        if (memchr(p, '\\', (size_t)l.len) || l.len < 3) return -1;
                        lp[nl] = p + 1;
                        ll[nl++] = (size_t)l.len - 2;
                    } else {
                        lp[nl] = p;
                        ll[nl++] = (size_t)l.len;
                    }
                }
                if (!nl) continue;
                if (n == MAX_TYPES) return -1;
                /* the literals live in g->bytes, which adding them may move: copy first */
                uint8_t *copy[64];
                int ok = 1;
                for (int k = 0; k < nl; k++) {
                    copy[k] = base_alloc(ll[k], MEM_MISC);
                    if (copy[k]) memcpy(copy[k], lp[k], ll[k]);
                    else ok = 0;
                }
                const int32_t id = ok ? jgram_add_lits(g, (const uint8_t *const *)copy, ll, nl) : -1;
                for (int k = 0; k < nl; k++) base_free(copy[k]);
                if (id < 0) return -1;
                out[n++] = (typed_val){k_types[ty], id};
            }
            continue;
        }
        /* a pattern string (JG_PAT) has no raw form: the JSON block takes it */
        const char *ty = nd.kind == JG_STR ? "string" : nd.kind == JG_INT || nd.kind == JG_INTR ? "integer"
                       : nd.kind == JG_NUM ? "number" : nd.kind == JG_OBJ ? "object" : nd.kind == JG_ARR ? "array" : NULL;
        if (!ty || n == MAX_TYPES) return -1;
        const int32_t id = nd.kind == JG_STR ? jgram_add_raw(g, nd.min, nd.max) : alts[i];
        if (id < 0) return -1;
        out[n++] = (typed_val){ty, id};
    }
    for (int i = 0; i < n; i++)
        for (int j = 0; j < i; j++)
            if (!strcmp(out[i].type, out[j].type)) return -1;
    return n;
}

/* The typed blocks of object node obj through the call tail, or -1 when it
 * cannot be typed (the caller then uses the JSON block). chain[i]: the
 * arguments from property i on: a block of any property up to the next
 * required one, or (none required left) the call tail. */
static int32_t typed_args(tg *t, int32_t obj) {
    const jg_node o = t->g->nodes[obj];
    if (!t->markers || o.n > MAX_TYPED_PROPS || (o.n == 0 && o.extra >= 0)) return -1;
    const int32_t n = o.n;
    char keys[MAX_TYPED_PROPS][260];
    for (int32_t j = 0; j < n; j++) {
        const jg_prop p = t->g->props[o.lo + j];
        const char *k = (const char *)t->g->bytes + p.off;
        if (p.len < 3 || p.len - 2 > 256 || memchr(k, '\\', (size_t)p.len)) return -1;
        memcpy(keys[j], k + 1, (size_t)p.len - 2);
        keys[j][p.len - 2] = 0;
        if (strstr(keys[j], "<|")) return -1;
    }
    int32_t chain[MAX_TYPED_PROPS + 1];
    typed_val tv[MAX_TYPED_PROPS][MAX_TYPES];
    int ntv[MAX_TYPED_PROPS];
    int32_t vseq[MAX_TYPED_PROPS][MAX_TYPES];
    keyset ks = {0};
    int32_t rc = -1;
    if (part(t, TOOLS_CALL_TAIL, NULL, 0, NULL, NULL)) goto out;
    ks_add(&ks, t->b, t->n, -1);
    if ((chain[n] = ks_node(t, &ks)) < 0) goto out;
    for (int32_t j = 0; j < n; j++)
        if ((ntv[j] = prop_types(t, t->g->props[o.lo + j].node, tv[j])) < 0) goto out;
    for (int32_t i = n - 1; i >= 0; i--) {
        /* property i's blocks: its value, the argument tail, the rest */
        for (int v = 0; v < ntv[i]; v++) {
            int32_t kids[3] = {tv[i][v].node, lit_part(t, TOOLS_ARG_TAIL, NULL, 0), chain[i + 1]};
            if (kids[1] < 0 || (vseq[i][v] = jgram_add_seq(t->g, kids, 3)) < 0) goto out;
        }
        const int32_t req = t->g->props[o.lo + i].req_next, last = req < n ? req : n - 1;
        for (int32_t j = i; j <= last; j++)
            for (int v = 0; v < ntv[j]; v++) {
                if (part(t, TOOLS_ARG_HEAD, NULL, 0, keys[j], tv[j][v].type)) goto out;
                ks_add(&ks, t->b, t->n, vseq[j][v]);
            }
        if (req == n) {
            if (part(t, TOOLS_CALL_TAIL, NULL, 0, NULL, NULL)) goto out;
            ks_add(&ks, t->b, t->n, -1);
        }
        if ((chain[i] = ks_node(t, &ks)) < 0) goto out;
    }
    rc = chain[0];
out:
    ks_free(&ks);
    return rc;
}

/* ---- a tool's arguments ---- */

/* Tool i's parameters document in t->g: its root, or -1 (err set for strict
 * tools; the others fall back to any JSON object). */
static int32_t schema_root(tg *t, const chat_tool *tool, size_t i, char *err, size_t errlen, int *rc) {
    static const char k_none[] = "{\"type\":\"object\",\"additionalProperties\":false}";
    const char *text = tool->parameters ? tool->parameters : k_none;
    char why[300] = "";
    json_t *j = NULL;
    jgram *sub = NULL;
    int r = jsonx_parse(&j, (const uint8_t *)text, strlen(text), "parameters", why, sizeof why);
    if (!r) r = jschema_compile(&sub, j, why, sizeof why);
    json_decref(j);
    if (r == STRATA_ENOMEM) { *rc = base_fail(err, errlen, r, "tools: out of memory"); return -1; }
    if (!r && sub->nodes[sub->root].kind != JG_OBJ) {
        r = STRATA_EINVAL;
        snprintf(why, sizeof why, "the parameters schema must describe an object");
    }
    if (r) {
        jgram_free(sub);
        sub = NULL;
        if (tool->strict) {
            *rc = base_fail(err, errlen, STRATA_EINVAL, "tools[%zu] '%s' (strict): %s", i, tool->name, why);
            return -1;
        }
        if ((r = jschema_json_object(&sub, why, sizeof why))) { *rc = base_fail(err, errlen, r, "tools: %s", why); return -1; }
    }
    const int32_t root = jgram_append(t->g, sub);
    jgram_free(sub);
    if (root < 0) *rc = base_fail(err, errlen, STRATA_ENOMEM, "tools: out of memory");
    return root;
}

/* From after the call head through the call tail. */
static int32_t args_node(tg *t, const chat_tool *tool, size_t i, char *err, size_t errlen, int *rc) {
    const int32_t root = schema_root(t, tool, i, err, errlen, rc);
    if (root < 0) return -1;
    int32_t id = -1;
    if (tools_typed(t->fmt)) {
        if ((id = typed_args(t, root)) >= 0) return id;
        const int32_t kids[4] = {lit_part(t, TOOLS_JSON_HEAD, NULL, 0), root, lit_part(t, TOOLS_JSON_TAIL, NULL, 0),
                                 lit_part(t, TOOLS_CALL_TAIL, NULL, 0)};
        if (kids[0] >= 0 && kids[2] >= 0 && kids[3] >= 0) id = jgram_add_seq(t->g, kids, 4);
    } else {
        const int32_t kids[2] = {root, lit_part(t, TOOLS_CALL_TAIL, NULL, 0)};
        if (kids[1] >= 0) id = jgram_add_seq(t->g, kids, 2);
    }
    if (id < 0) *rc = base_fail(err, errlen, STRATA_ENOMEM, "tools: out of memory building the call grammar");
    return id;
}

/* ---- the whole ---- */

static int32_t marker_id(tg *t, const char *m) { return t->special(t->ud, m, strlen(m)); }

int tools_grammar(jgram **out, int fmt, const chat_tools *tools, size_t calls_before, tools_special_fn special, void *ud,
                  char *err, size_t errlen) {
    *out = NULL;
    if (!tools || !tools->n_tools || (tools->choice != CHAT_TOOLS_REQUIRED && tools->choice != CHAT_TOOLS_NAMED)) return 0;
    tg t = {.fmt = fmt, .special = special, .ud = ud};
    const int named = tools->choice == CHAT_TOOLS_NAMED;
    const size_t nt = tools->n_tools;
    int32_t *args = base_alloc(nt * sizeof *args, MEM_MISC);
    keyset ks = {0};
    int rc = 0;
    if (!(t.g = jgram_new()) || !args) { rc = base_fail(err, errlen, STRATA_ENOMEM, "tools: out of memory"); goto out; }
    t.markers = marker_id(&t, "<|open|>") >= 0 && marker_id(&t, "<|close|>") >= 0 && marker_id(&t, "<|sep|>") >= 0;
    size_t named_i = nt;
    for (size_t i = 0; i < nt; i++) {
        args[i] = -1;
        if (named && strcmp(tools->tools[i].name, tools->choice_name ? tools->choice_name : "")) continue;
        if (named) named_i = i;
        if ((args[i] = args_node(&t, &tools->tools[i], i, err, errlen, &rc)) < 0) goto out;
    }
    if (named && named_i == nt) {
        rc = base_fail(err, errlen, STRATA_EINVAL, "tools: tool_choice names '%.64s', which is not declared",
                       tools->choice_name ? tools->choice_name : "");
        goto out;
    }
    const int max_calls = named || !tools->parallel ? 1 : TOOLS_MAX_FORCED_CALLS;
    /* more: after k calls, another call (k < max_calls) or the close */
    int32_t more = lit_part(&t, TOOLS_SEC_CLOSE, NULL, 0);
    for (int k = max_calls - 1; k >= 1 && more >= 0; k--) {
        for (size_t i = 0; i < nt; i++) {
            const int32_t kids[2] = {args[i], more};
            const int32_t call = jgram_add_seq(t.g, kids, 2);
            if (call < 0 || part(&t, TOOLS_CALL_HEAD, tools->tools[i].name, tools_call_index(fmt, calls_before, (size_t)k), NULL, NULL)) {
                more = -1;
                break;
            }
            ks_add(&ks, t.b, t.n, call);
        }
        if (more < 0 || part(&t, TOOLS_SEC_CLOSE, NULL, 0, NULL, NULL)) { more = -1; break; }
        ks_add(&ks, t.b, t.n, -1);
        more = ks_node(&t, &ks);
    }
    int32_t root = -1;
    if (more >= 0 && named) {
        const int32_t kids[2] = {args[named_i], more};
        root = jgram_add_seq(t.g, kids, 2);
    } else if (more >= 0) {
        /* the prefill stopped before the name */
        for (size_t i = 0; i < nt; i++) {
            const int32_t kids[2] = {args[i], more};
            const int32_t call = jgram_add_seq(t.g, kids, 2);
            if (call < 0 || part(&t, TOOLS_CALL_HEAD_NAME, tools->tools[i].name, tools_call_index(fmt, calls_before, 0), NULL, NULL))
                break;
            ks_add(&ks, t.b, t.n, call);
        }
        root = ks.n == (int)nt ? ks_node(&t, &ks) : -1;
    }
    if (root < 0 || t.oom) { rc = base_fail(err, errlen, STRATA_ENOMEM, "tools: out of memory building the call grammar"); goto out; }
    t.g->root = root;
out:
    ks_free(&ks);
    base_free(args);
    base_free(t.b);
    if (rc) { jgram_free(t.g); return rc; }
    *out = t.g;
    return 0;
}
