/*
 * tok_hf.c: Hugging Face tokenizer.json byte-level BPE for the tok module
 * (tok.h: tok_open_hf). Owns the tokenizer.json reader (what it accepts and the
 * refusals, each naming the JSON path), the ByteLevel byte <-> character map,
 * and merge-rank BPE.
 *
 * Byte-level BPE stores tokens as strings over a 256-character alphabet, one
 * character per byte (GPT-2's bytes_to_unicode: the printable Latin-1 bytes map
 * to themselves, the other 68 to U+0100..U+0143 in byte order). The loader maps
 * every vocabulary string back to its bytes, so the tok works on bytes as for a
 * tiktoken vocabulary. A vocabulary string with a character outside the
 * alphabet (a special token's text kept in model.vocab) keeps its UTF-8 bytes
 * and is not reachable by merges: decode gives that text, as the ByteLevel
 * decoder does.
 *
 * Merge-rank BPE (tokenizers' Word::merge_all): a piece starts as its bytes;
 * repeatedly the adjacent pair with the lowest merge rank (leftmost among equal
 * ranks) is merged into the merge's token, until no adjacent pair is a merge.
 * Unlike tiktoken, a pair merges only if (a, b) is listed, not whenever a + b is
 * a token, so ids can differ from rank-BPE over the same vocabulary.
 *
 * model.vocab and model.merges are read in place (jcur.h); jansson parses the
 * rest of the file, with those two blanked (the generated DeepSeek-V3
 * tokenizer.json, `strata tokenize`, 3 interleaved runs: as one tree 138 MB
 * peak RSS and 0.33-0.35 s; in place 26 MB and 0.14-0.15 s).
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include "base.h"
#include "jcur.h"
#include "jsonx.h"
#include "tok.h"
#include "tok_priv.h"

/* ===== ByteLevel alphabet ===== */

static int byte_printable(int b) { return (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174; }

/* Code point of byte b in the ByteLevel alphabet. */
static uint32_t byte_char(int b) {
    if (byte_printable(b)) return (uint32_t)b;
    int k = 0;
    for (int i = 0; i < b; i++) k += !byte_printable(i);
    return 256u + (uint32_t)k;
}

/* Byte of code point c in the alphabet, or -1. */
static int char_byte(uint32_t c, const int16_t *inv) {
    if (c < 256) return byte_printable((int)c) ? (int)c : -1;
    return c < 256 + 68 ? inv[c - 256] : -1;
}

/* Decodes the UTF-8 string s (n bytes, valid: jansson checked it) through the
 * alphabet into out (n bytes suffice). Returns the byte count, or -1 when some
 * character is outside the alphabet. */
static long bytelevel_decode(const char *s, size_t n, const int16_t *inv, uint8_t *out) {
    size_t o = 0;
    for (size_t i = 0; i < n;) {
        uint8_t c = (uint8_t)s[i];
        uint32_t cp;
        if (c < 0x80) { cp = c; i++; }
        else if (c < 0xE0) { cp = (uint32_t)(c & 0x1F) << 6 | ((uint8_t)s[i + 1] & 0x3F); i += 2; }
        else return -1; /* the alphabet ends at U+0143: 3- and 4-byte characters are outside it */
        int b = char_byte(cp, inv);
        if (b < 0) return -1;
        out[o++] = (uint8_t)b;
    }
    return (long)o;
}

/* ===== merges table ===== */

static uint64_t pair_key(int32_t a, int32_t b) { return (uint64_t)(uint32_t)a << 32 | (uint32_t)b; }

static size_t pair_hash(uint64_t k) { return (size_t)((k * 0x9E3779B97F4A7C15ull) >> 20); }

static merge_slot *merge_find(const tok *t, uint64_t k) {
    for (size_t i = pair_hash(k) & t->merges_mask;; i = (i + 1) & t->merges_mask) {
        merge_slot *s = &t->merges[i];
        if (s->key == k || s->key == UINT64_MAX) return s;
    }
}

/* ===== BPE ===== */

/* Pushes the merge of symbols i and nx[i], if there is one. */
static void push_pair(const tok *t, const uint32_t *sym, const uint32_t *nx, uint32_t i, size_t n, uint64_t *h,
                      size_t *hn) {
    if (nx[i] >= n) return;
    const merge_slot *m = merge_find(t, pair_key((int32_t)sym[i], (int32_t)sym[nx[i]]));
    if (m->key != UINT64_MAX) tok_heap_push(h, hn, (uint64_t)(uint32_t)m->rank << 32 | i);
}

/* Symbols live at their byte offset: sym[i] is the id starting at byte i, nx/pv
 * link the live ones. The heap holds (rank << 32 | position), so the lowest rank
 * and then the leftmost pops first, as tokenizers orders its merges; an entry
 * whose pair has changed since it was pushed is skipped when popped. */
int tok_bpe_merges(tok *t, const uint8_t *p, size_t n, idvec *o) {
    uint32_t *sym = t->s_start, *nx = t->s_next, *pv = t->s_prev;
    uint64_t *h = t->s_heap;
    size_t hn = 0;
    for (size_t i = 0; i < n; i++) {
        sym[i] = (uint32_t)t->byte_rank[p[i]];
        nx[i] = (uint32_t)i + 1;
        pv[i] = (uint32_t)i - 1;
    }
    for (size_t i = 0; i + 1 < n; i++) push_pair(t, sym, nx, (uint32_t)i, n, h, &hn);
    while (hn) {
        uint64_t e = tok_heap_pop(h, &hn);
        uint32_t i = (uint32_t)e, j = nx[i];
        if (sym[i] == UINT32_MAX || j >= n) continue;
        const merge_slot *m = merge_find(t, pair_key((int32_t)sym[i], (int32_t)sym[j]));
        if (m->key == UINT64_MAX || (uint32_t)m->rank != (uint32_t)(e >> 32)) continue; /* stale */
        sym[i] = (uint32_t)m->id;
        sym[j] = UINT32_MAX;
        nx[i] = nx[j];
        if (nx[i] < n) pv[nx[i]] = i;
        push_pair(t, sym, nx, i, n, h, &hn);
        if (i > 0) push_pair(t, sym, nx, pv[i], n, h, &hn);
    }
    for (uint32_t i = 0; i < n; i = nx[i])
        if (tok_idvec_push(o, (int32_t)sym[i])) return STRATA_ENOMEM;
    return STRATA_OK;
}

/* ===== tokenizer.json ===== */

typedef struct {
    tok *t;
    const char *name;
    char *err;
    size_t errlen;
    int16_t inv[68]; /* alphabet U+0100.. -> byte */
    const uint8_t *doc; /* the file */
    size_t span_off[2], span_len[2]; /* model.vocab, model.merges in doc */
    int span_ok[2];
} ld;

static int bad(ld *l, const char *path, const char *why) {
    return base_fail(l->err, l->errlen, STRATA_EFORMAT, "%s: %s %s", l->name, path, why);
}

/* Optional member: absent and JSON null read as NULL. */
static json_t *opt(json_t *o, const char *k) {
    json_t *v = json_object_get(o, k);
    return v && !json_is_null(v) ? v : NULL;
}

/* A member that must be absent, null, false or "" (a feature not implemented). */
static int refuse_set(ld *l, json_t *o, const char *k, const char *path) {
    json_t *v = opt(o, k);
    if (!v || json_is_false(v) || (json_is_string(v) && !json_string_length(v))) return STRATA_OK;
    char p[160];
    snprintf(p, sizeof p, "%s.%s", path, k);
    return bad(l, p, "is set: not supported (strata implements byte-level BPE without it)");
}

static int get_bool(ld *l, json_t *o, const char *k, const char *path, int def, int *out) {
    json_t *v = opt(o, k);
    *out = def;
    if (!v) return STRATA_OK;
    if (!json_is_boolean(v)) {
        char p[160];
        snprintf(p, sizeof p, "%s.%s", path, k);
        return bad(l, p, "is not a boolean");
    }
    *out = json_is_true(v);
    return STRATA_OK;
}

/* Id of a vocabulary string through the alphabet, or RANK_NONE. */
static int32_t vocab_id(ld *l, const uint8_t *s, size_t n, uint8_t *tmp) {
    long bn = bytelevel_decode((const char *)s, n, l->inv, tmp);
    return bn > 0 ? tok_map_lookup(l->t, tmp, (size_t)bn) : RANK_NONE;
}

/* model.vocab and model.merges are read in place (jcur.h): a cursor over the
 * member's bytes in the file; jansson saw them blanked. */
static int span_open(ld *l, int i, const char *path, jcur *c) {
    if (!l->span_ok[i]) return bad(l, path, "could not be read in place"); /* jansson parsed what jcur could not */
    *c = (jcur){.p = l->doc + l->span_off[i], .end = l->doc + l->span_off[i] + l->span_len[i], .base = l->doc,
                .what = l->name, .err = l->err, .errlen = l->errlen, .tag = MEM_TOK};
    return STRATA_OK;
}

/* After a member or element: *more 1 after ',', 0 after the closing byte. */
static int next_item(jcur *c, char close, int *more) {
    if ((*more = jcur_eat(c, ','))) return STRATA_OK;
    if (jcur_eat(c, (uint8_t)close)) return STRATA_OK;
    return jcur_syntax(c, NULL, close == '}' ? "expected ',' or '}'" : "expected ',' or ']'");
}

/* A real number token s..e as an id, by jsonx_int's rule. */
static int real_int(const uint8_t *s, const uint8_t *e, int64_t *v) {
    char buf[64];
    if ((size_t)(e - s) >= sizeof buf) return -1;
    memcpy(buf, s, (size_t)(e - s));
    buf[e - s] = 0;
    return jsonx_real_int(strtod(buf, NULL), v);
}

/* A refusal naming model.vocab["key"] (its first 40 bytes): the path is only
 * formatted for the message, not for each of the ~128k keys. */
static int bad_key(ld *l, const char *key, size_t n, const char *why) {
    char p[128];
    snprintf(p, sizeof p, "model.vocab[\"%.*s\"]", (int)(n < 40 ? n : 40), key);
    return bad(l, p, why);
}

/* One "key": id member of model.vocab. */
static int vocab_member(ld *l, jcur *c, jstr *key, int64_t *id) {
    int rc = jcur_str(c, key, NULL), kind = -1;
    if (rc) return rc;
    if (!jcur_eat(c, ':')) return jcur_syntax(c, NULL, "expected ':'");
    jcur_ws(c);
    const uint8_t *at = c->p;
    if (c->p < c->end && (*c->p == '-' || (*c->p >= '0' && *c->p <= '9'))) rc = jcur_num(c, id, &kind, NULL);
    else rc = jcur_skip(c, NULL);
    if (rc) return rc;
    if (kind == JN_REAL) kind = real_int(at, c->p, id) ? -1 : JN_INT;
    if (kind != JN_INT || *id < 0 || *id >= TOK_MAX_ID)
        return bad_key(l, key->s, key->len, "is not an id (an integer from 0 to 16777215)");
    return STRATA_OK;
}

static int cmp_text(const void *a, const void *b, void *tv) {
    const tok *t = tv;
    size_t la, lb;
    const uint8_t *pa = tok_token_bytes(t, *(const int32_t *)a, &la), *pb = tok_token_bytes(t, *(const int32_t *)b, &lb);
    if (la != lb) return la < lb ? -1 : 1;
    return memcmp(pa, pb, la);
}

/* Two keys outside the ByteLevel alphabet with the same text: jansson refused
 * duplicate keys; read in place they have to be looked for (alphabet keys
 * collide in the map). */
static int check_twice(ld *l, int32_t *ids, size_t n) {
    qsort_r(ids, n, sizeof *ids, cmp_text, l->t);
    for (size_t i = 1; i < n; i++)
        if (!cmp_text(&ids[i - 1], &ids[i], l->t)) {
            size_t len;
            const uint8_t *b = tok_token_bytes(l->t, ids[i], &len);
            return bad_key(l, (const char *)b, len, "appears twice");
        }
    return STRATA_OK;
}

/* Pass 1 of model.vocab: the syntax, the largest id and the member count. */
static int vocab_scan(ld *l, jstr *key, int64_t *max, size_t *count) {
    jcur c;
    int64_t id;
    int rc = span_open(l, 0, "model.vocab", &c), more = 1;
    if (rc) return rc;
    *max = -1;
    *count = 0;
    if (!jcur_eat(&c, '{')) return jcur_syntax(&c, NULL, "expected '{'");
    if (jcur_eat(&c, '}')) more = 0;
    while (more) {
        if ((rc = vocab_member(l, &c, key, &id)) || (rc = next_item(&c, '}', &more))) break;
        if (id > *max) *max = id;
        (*count)++;
    }
    base_free(c.tmp.s);
    return rc;
}

static int load_vocab(ld *l, json_t *model, uint8_t *tmp) {
    tok *t = l->t;
    json_t *vocab = json_object_get(model, "vocab");
    if (!json_is_object(vocab)) return bad(l, "model.vocab", vocab ? "is not an object" : "is missing");
    jstr key = {0};
    int64_t max, id;
    size_t count;
    int rc = vocab_scan(l, &key, &max, &count), more;
    if (!rc && max < 0) rc = bad(l, "model.vocab", "is empty");
    if (rc) { base_free(key.s); return rc; }
    rc = tok_ids_grow(t, (int32_t)max + 1);
    if (!rc) rc = tok_map_init(t, count);
    int32_t *other = rc ? NULL : base_alloc(count * sizeof *other, MEM_TOK);
    if (!rc && !other) rc = STRATA_ENOMEM;
    if (rc) {
        base_free(key.s);
        return base_fail(l->err, l->errlen, rc, "%s: out of memory for %lld tokens", l->name, (long long)max + 1);
    }
    t->n_ranks = (int32_t)max + 1;
    /* pass 2: the tokens */
    jcur c;
    size_t n_other = 0;
    span_open(l, 0, "model.vocab", &c);
    jcur_eat(&c, '{');
    for (size_t i = 0; i < count && !rc; i++) {
        if ((rc = vocab_member(l, &c, &key, &id)) || (rc = next_item(&c, '}', &more))) break;
        const size_t kn = key.len;
        if (kn == 0 || kn > TOK_MAX_TOKEN) { rc = bad_key(l, key.s, kn, kn ? "is too long" : "is an empty token"); break; }
        if (t->id_len[id] != TOK_ABSENT) { rc = bad_key(l, key.s, kn, "has an id another token has"); break; }
        long bn = bytelevel_decode(key.s, kn, l->inv, tmp);
        const uint8_t *b = bn > 0 ? tmp : (const uint8_t *)key.s;
        size_t len = bn > 0 ? (size_t)bn : kn;
        if ((rc = tok_pool_add(t, b, len, &t->id_off[id]))) { rc = base_fail(l->err, l->errlen, rc, "%s: out of memory", l->name); break; }
        t->id_len[id] = (uint32_t)len;
        if (len > t->max_token_len) t->max_token_len = len;
        if (bn > 0 && tok_map_put(t, (int32_t)id) >= 0) rc = bad_key(l, key.s, kn, "has the same bytes as another token");
        if (bn <= 0) other[n_other++] = (int32_t)id;
    }
    if (!rc) rc = check_twice(l, other, n_other);
    base_free(other);
    base_free(key.s);
    base_free(c.tmp.s);
    return rc ? rc : tok_build_lookups(t, t->n_ranks, l->name, l->err, l->errlen);
}

/* A refusal naming model.merges[i], formatted for the message only. */
static int bad_merge(ld *l, size_t i, const char *why) {
    char p[64];
    snprintf(p, sizeof p, "model.merges[%zu]", i);
    return bad(l, p, why);
}

/* Merge i: "a b" (decoded into sa) or ["a", "b"] (into sa and sb). */
static int merge_pair(ld *l, jcur *c, size_t i, jstr *sa, jstr *sb, const uint8_t **a, size_t *an,
                      const uint8_t **b, size_t *bn) {
    int rc;
    jcur_ws(c);
    if (c->p < c->end && *c->p == '"') {
        if ((rc = jcur_str(c, sa, NULL))) return rc;
        const char *sp = memchr(sa->s, ' ', sa->len);
        if (!sp || memchr(sp + 1, ' ', sa->len - (size_t)(sp - sa->s) - 1))
            return bad_merge(l, i, "is not \"a b\" (two tokens, one space)");
        *a = (const uint8_t *)sa->s;
        *an = (size_t)(sp - sa->s);
        *b = (const uint8_t *)sp + 1;
        *bn = sa->len - *an - 1;
        return STRATA_OK;
    }
    if (jcur_eat(c, '[')) {
        jcur_ws(c);
        if (c->p < c->end && *c->p == '"') {
            if ((rc = jcur_str(c, sa, NULL))) return rc;
            jcur_ws(c);
            if (jcur_eat(c, ',') && (jcur_ws(c), c->p < c->end && *c->p == '"')) {
                if ((rc = jcur_str(c, sb, NULL))) return rc;
                if (jcur_eat(c, ']')) {
                    *a = (const uint8_t *)sa->s;
                    *an = sa->len;
                    *b = (const uint8_t *)sb->s;
                    *bn = sb->len;
                    return STRATA_OK;
                }
            }
        }
    }
    return bad_merge(l, i, "is neither \"a b\" nor [\"a\", \"b\"]");
}

/* Pass 1 of model.merges: the syntax and the count. */
static int merges_scan(ld *l, size_t *nm) {
    jcur c;
    int rc = span_open(l, 1, "model.merges", &c), more = 1;
    if (rc) return rc;
    *nm = 0;
    if (!jcur_eat(&c, '[')) rc = jcur_syntax(&c, NULL, "expected '['");
    else if (jcur_eat(&c, ']')) more = 0;
    while (!rc && more)
        if (!(rc = jcur_skip(&c, NULL)) && !(rc = next_item(&c, ']', &more))) (*nm)++;
    base_free(c.tmp.s);
    return rc;
}

static int load_merges(ld *l, json_t *model, uint8_t *tmp) {
    tok *t = l->t;
    json_t *ms = json_object_get(model, "merges");
    if (!json_is_array(ms)) return bad(l, "model.merges", ms ? "is not an array" : "is missing");
    size_t nm, slots = 16;
    int rc = merges_scan(l, &nm), more;
    if (rc) return rc;
    if (nm >= TOK_MAX_ID) return bad(l, "model.merges", "has more merges than the 16777216 ids supported");
    while (slots < nm * 2) slots *= 2;
    t->merges = base_alloc(slots * sizeof *t->merges, MEM_TOK);
    if (!t->merges) return base_fail(l->err, l->errlen, STRATA_ENOMEM, "%s: out of memory for the merges", l->name);
    for (size_t i = 0; i < slots; i++) t->merges[i].key = UINT64_MAX;
    t->merges_mask = slots - 1;
    uint8_t *cat = tmp + TOK_MAX_TOKEN * 2;
    jcur c;
    jstr sa = {0}, sb = {0};
    span_open(l, 1, "model.merges", &c);
    jcur_eat(&c, '[');
    for (size_t i = 0; i < nm && !rc; i++) {
        const uint8_t *a = NULL, *b = NULL;
        size_t an = 0, bn = 0;
        if ((rc = merge_pair(l, &c, i, &sa, &sb, &a, &an, &b, &bn)) || (rc = next_item(&c, ']', &more))) break;
        if (an > TOK_MAX_TOKEN || bn > TOK_MAX_TOKEN) { rc = bad_merge(l, i, "has a token that is too long"); break; }
        int32_t ia = vocab_id(l, a, an, tmp), ib = vocab_id(l, b, bn, tmp);
        if (ia == RANK_NONE || ib == RANK_NONE) { rc = bad_merge(l, i, "names a token that is not in model.vocab"); break; }
        size_t la, lb;
        const uint8_t *pa = tok_token_bytes(t, ia, &la), *pb = tok_token_bytes(t, ib, &lb);
        memcpy(cat, pa, la);
        memcpy(cat + la, pb, lb);
        int32_t id = tok_map_lookup(t, cat, la + lb);
        if (id == RANK_NONE) { rc = bad_merge(l, i, "merges into a token that is not in model.vocab"); break; }
        /* tokenizers builds its merge map by inserting in order: a pair listed
         * twice keeps its last rank. */
        merge_slot *sl = merge_find(t, pair_key(ia, ib));
        *sl = (merge_slot){pair_key(ia, ib), (int32_t)i, id};
    }
    base_free(sa.s);
    base_free(sb.s);
    base_free(c.tmp.s);
    return rc;
}

static int load_added(ld *l, json_t *root) {
    tok *t = l->t;
    json_t *at = opt(root, "added_tokens");
    if (!at) return STRATA_OK;
    if (!json_is_array(at)) return bad(l, "added_tokens", "is not an array");
    for (size_t i = 0; i < json_array_size(at); i++) {
        json_t *e = json_array_get(at, i), *c = json_is_object(e) ? json_object_get(e, "content") : NULL;
        char p[64];
        snprintf(p, sizeof p, "added_tokens[%zu]", i);
        int64_t id;
        if (!json_is_object(e)) return bad(l, p, "is not an object");
        if (!json_is_string(c) || !json_string_length(c)) return bad(l, p, "has no non-empty string \"content\"");
        if (jsonx_int(json_object_get(e, "id"), &id) || id < 0 || id >= TOK_MAX_ID)
            return bad(l, p, "has no \"id\" from 0 to 16777215");
        int sw, ls, rs, nz, sp;
        int rc = get_bool(l, e, "single_word", p, 0, &sw);
        if (!rc) rc = get_bool(l, e, "lstrip", p, 0, &ls);
        if (!rc) rc = get_bool(l, e, "rstrip", p, 0, &rs);
        if (!rc) rc = get_bool(l, e, "normalized", p, 0, &nz);
        if (!rc) rc = get_bool(l, e, "special", p, 0, &sp);
        if (rc) return rc;
        if (sw) return bad(l, p, "has single_word true: not supported");
        const uint8_t *s = (const uint8_t *)json_string_value(c);
        size_t n = json_string_length(c), ol;
        /* The token's text may also be in model.vocab under the same id: the
         * added token replaces it (same id, same bytes on decode). */
        const uint8_t *old = tok_token_bytes(t, (int32_t)id, &ol);
        if (old && id < t->n_ranks && !tok_is_special(t, (int32_t)id)) {
            if (ol != n || memcmp(old, s, n)) return bad(l, p, "has the id of a different model.vocab token");
            t->id_len[id] = TOK_ABSENT;
        }
        special f = {.special = (uint8_t)sp, .normalized = (uint8_t)nz, .lstrip = (uint8_t)ls, .rstrip = (uint8_t)rs};
        char where[160];
        snprintf(where, sizeof where, "%s: %s", l->name, p);
        if ((rc = tok_add_token(t, s, n, (int32_t)id, f, where, l->err, l->errlen))) return rc;
    }
    return STRATA_OK;
}

/* Oniguruma pattern -> PCRE2: \s and \S become Unicode White_Space (Oniguruma's
 * \s; PCRE2's UCP \s also takes U+180E), everything else is the same syntax for
 * what tokenizer.json files use. A String pattern is matched literally. */
static int add_split(ld *l, const char *pat, int literal, const char *p) {
    tok *t = l->t;
    if (t->n_splits == TOK_MAX_SPLITS) return bad(l, p, "is one Split too many (8 at most)");
    size_t n = strlen(pat);
    char *q = base_alloc(n * 16 + 16, MEM_TOK);
    if (!q) return base_fail(l->err, l->errlen, STRATA_ENOMEM, "%s: out of memory", l->name);
    size_t o = 0;
    if (literal) {
        for (size_t i = 0; i < n; i++) {
            if (!strchr("\\^$.[]|()?*+{}-", pat[i])) { q[o++] = pat[i]; continue; }
            q[o++] = '\\';
            q[o++] = pat[i];
        }
    } else {
        for (size_t i = 0; i < n; i++) {
            if (pat[i] == '\\' && i + 1 < n && (pat[i + 1] == 's' || pat[i + 1] == 'S')) {
                o += (size_t)sprintf(q + o, "\\%c{White_Space}", pat[i + 1] == 's' ? 'p' : 'P');
                i++;
            } else if (pat[i] == '\\' && i + 1 < n) {
                q[o++] = pat[i++];
                q[o++] = pat[i];
            } else {
                q[o++] = pat[i];
            }
        }
    }
    q[o] = 0;
    char what[512];
    snprintf(what, sizeof what, "%s: %s", l->name, p);
    int k = t->n_splits;
    int rc = tok_compile(t, q, &t->split_re[k], &t->split_jit[k], what, l->err, l->errlen);
    base_free(q);
    if (!rc) t->n_splits++;
    return rc;
}

/* GPT-2's pattern, which ByteLevel with use_regex true splits by. */
static const char k_gpt2[] = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

static int load_pretok_one(ld *l, json_t *pt, const char *p, int *saw_bytelevel) {
    json_t *ty = json_object_get(pt, "type");
    if (!json_is_object(pt) || !json_is_string(ty)) return bad(l, p, "has no \"type\"");
    const char *type = json_string_value(ty);
    char q[160];
    if (*saw_bytelevel) return bad(l, p, "comes after ByteLevel: not supported");
    if (!strcmp(type, "ByteLevel")) {
        int aps, rx;
        int rc = get_bool(l, pt, "add_prefix_space", p, 1, &aps);
        if (!rc) rc = get_bool(l, pt, "use_regex", p, 1, &rx);
        if (rc) return rc;
        snprintf(q, sizeof q, "%s.add_prefix_space", p);
        if (aps) return bad(l, q, "is true: not supported");
        *saw_bytelevel = 1;
        snprintf(q, sizeof q, "%s (use_regex)", p);
        return rx ? add_split(l, k_gpt2, 0, q) : STRATA_OK;
    }
    if (strcmp(type, "Split")) {
        snprintf(q, sizeof q, "%s.type", p);
        return bad(l, q, "is not Split, ByteLevel or Sequence: not supported");
    }
    json_t *beh = json_object_get(pt, "behavior"), *pat = json_object_get(pt, "pattern");
    snprintf(q, sizeof q, "%s.behavior", p);
    if (!json_is_string(beh) || strcmp(json_string_value(beh), "Isolated"))
        return bad(l, q, "is not \"Isolated\": only Isolated splits are implemented");
    int inv;
    int rc = get_bool(l, pt, "invert", p, 0, &inv);
    if (rc) return rc;
    snprintf(q, sizeof q, "%s.invert", p);
    if (inv) return bad(l, q, "is true: not supported");
    json_t *rx = json_is_object(pat) ? json_object_get(pat, "Regex") : NULL;
    json_t *st = json_is_object(pat) ? json_object_get(pat, "String") : NULL;
    snprintf(q, sizeof q, "%s.pattern.%s", p, rx ? "Regex" : "String");
    if ((!rx || !json_is_string(rx)) && (!st || !json_is_string(st)))
        return bad(l, q, "is not a string (pattern must be {\"Regex\": ...} or {\"String\": ...})");
    if (!rx && !json_string_length(st)) return bad(l, q, "is empty");
    return add_split(l, json_string_value(rx ? rx : st), !rx, q);
}

static int load_pretok(ld *l, json_t *root) {
    json_t *pt = opt(root, "pre_tokenizer");
    int saw = 0, rc;
    if (!pt) return bad(l, "pre_tokenizer", "is null: strata reads byte-level BPE (ByteLevel pre-tokenizer) only");
    json_t *ty = json_object_get(pt, "type");
    if (json_is_string(ty) && !strcmp(json_string_value(ty), "Sequence")) {
        json_t *list = json_object_get(pt, "pretokenizers");
        if (!json_is_array(list)) return bad(l, "pre_tokenizer.pretokenizers", "is not an array");
        for (size_t i = 0; i < json_array_size(list); i++) {
            char p[64];
            snprintf(p, sizeof p, "pre_tokenizer.pretokenizers[%zu]", i);
            if ((rc = load_pretok_one(l, json_array_get(list, i), p, &saw))) return rc;
        }
    } else if ((rc = load_pretok_one(l, pt, "pre_tokenizer", &saw))) {
        return rc;
    }
    if (!saw) return bad(l, "pre_tokenizer", "has no ByteLevel step: strata reads byte-level BPE only");
    return STRATA_OK;
}

/* The BOS of a TemplateProcessing whose single template is [SpecialToken X,
 * Sequence A] or [Sequence A]; anything else is refused. */
static int load_template(ld *l, json_t *pp, const char *p) {
    json_t *single = json_object_get(pp, "single");
    char q[160];
    snprintf(q, sizeof q, "%s.single", p);
    size_t n = json_is_array(single) ? json_array_size(single) : 0;
    json_t *last = n ? json_array_get(single, n - 1) : NULL;
    if (!n || n > 2 || !json_is_object(last) || !json_object_get(last, "Sequence"))
        return bad(l, q, "is not [SpecialToken, Sequence] or [Sequence]: not supported");
    if (n == 1) return STRATA_OK;
    json_t *st = json_object_get(json_array_get(single, 0), "SpecialToken");
    json_t *name = st ? json_object_get(st, "id") : NULL;
    if (!json_is_string(name)) return bad(l, q, "does not start with a SpecialToken with a string id");
    json_t *sts = json_object_get(pp, "special_tokens");
    json_t *e = json_is_object(sts) ? json_object_get(sts, json_string_value(name)) : NULL;
    json_t *ids = json_is_object(e) ? json_object_get(e, "ids") : NULL;
    int64_t id;
    snprintf(q, sizeof q, "%s.special_tokens[\"%.40s\"].ids", p, json_string_value(name));
    if (!json_is_array(ids) || json_array_size(ids) != 1 || jsonx_int(json_array_get(ids, 0), &id) || id < 0 ||
        id >= l->t->n_vocab || !tok_token_bytes(l->t, (int32_t)id, &(size_t){0}))
        return bad(l, q, "is not one id of the vocabulary");
    l->t->bos = (int32_t)id;
    return STRATA_OK;
}

static int load_post(ld *l, json_t *root) {
    json_t *pp = opt(root, "post_processor");
    if (!pp) return STRATA_OK;
    json_t *ty = json_object_get(pp, "type");
    const char *type = json_is_string(ty) ? json_string_value(ty) : "";
    if (!strcmp(type, "ByteLevel")) return STRATA_OK; /* offsets only */
    if (!strcmp(type, "TemplateProcessing")) return load_template(l, pp, "post_processor");
    if (!strcmp(type, "Sequence")) {
        json_t *list = json_object_get(pp, "processors");
        if (!json_is_array(list)) return bad(l, "post_processor.processors", "is not an array");
        for (size_t i = 0; i < json_array_size(list); i++) {
            json_t *e = json_array_get(list, i), *et = json_is_object(e) ? json_object_get(e, "type") : NULL;
            char p[64];
            snprintf(p, sizeof p, "post_processor.processors[%zu]", i);
            const char *s = json_is_string(et) ? json_string_value(et) : "";
            int rc = !strcmp(s, "ByteLevel") ? STRATA_OK
                     : !strcmp(s, "TemplateProcessing") ? load_template(l, e, p)
                     : bad(l, p, "is not ByteLevel or TemplateProcessing: not supported");
            if (rc) return rc;
        }
        return STRATA_OK;
    }
    return bad(l, "post_processor.type", "is not ByteLevel, TemplateProcessing or Sequence: not supported");
}

static int load_top(ld *l, json_t *root) {
    if (!json_is_object(root)) return bad(l, "(top level)", "is not an object");
    int rc = refuse_set(l, root, "truncation", "(top level)");
    if (!rc) rc = refuse_set(l, root, "padding", "(top level)");
    if (rc) return rc;
    json_t *nz = opt(root, "normalizer");
    if (nz) {
        json_t *ty = json_object_get(nz, "type"), *list = json_object_get(nz, "normalizers");
        int empty_seq = json_is_string(ty) && !strcmp(json_string_value(ty), "Sequence") && json_is_array(list) &&
                        !json_array_size(list);
        if (!empty_seq) return bad(l, "normalizer", "is set: only null (no normalizer) is supported");
    }
    json_t *dec = opt(root, "decoder"), *dty = dec ? json_object_get(dec, "type") : NULL;
    if (dec && (!json_is_string(dty) || strcmp(json_string_value(dty), "ByteLevel")))
        return bad(l, "decoder.type", "is not ByteLevel: not supported");
    json_t *model = json_object_get(root, "model"), *mty = model ? json_object_get(model, "type") : NULL;
    if (!json_is_object(model)) return bad(l, "model", model ? "is not an object" : "is missing");
    if (mty && (!json_is_string(mty) || strcmp(json_string_value(mty), "BPE")))
        return bad(l, "model.type", "is not \"BPE\": not supported");
    const char *refused[] = {"dropout", "continuing_subword_prefix", "end_of_word_suffix", "byte_fallback"};
    for (int i = 0; i < 4; i++)
        if ((rc = refuse_set(l, model, refused[i], "model"))) return rc;
    return get_bool(l, model, "ignore_merges", "model", 0, &l->t->ignore_merges);
}

/* The spans of model.vocab (an object) and model.merges (an array) in the file,
 * blanked in copy. What does not scan is left to jansson, which reports it. */
static void find_spans(ld *l, size_t len, uint8_t *copy) {
    jcur c = {.p = l->doc, .end = l->doc + len, .base = l->doc, .what = l->name, .tag = MEM_TOK};
    const uint8_t *m, *v;
    size_t mn, n;
    static const char *const names[2] = {"vocab", "merges"};
    const int found = !jcur_member(&c, "model", &m, &mn);
    for (int i = 0; found && i < 2; i++) {
        c.p = m; /* each from the model object's start */
        c.end = m + mn;
        if (jcur_member(&c, names[i], &v, &n) || *v != (i ? '[' : '{')) continue;
        l->span_off[i] = (size_t)(v - l->doc);
        l->span_len[i] = n;
        l->span_ok[i] = 1;
        jcur_blank(copy + l->span_off[i], n);
    }
    base_free(c.tmp.s);
}

int tok_hf_load(tok *t, const uint8_t *buf, size_t len, const char *name, char *err, size_t errlen) {
    ld l = {.t = t, .name = name, .err = err, .errlen = errlen};
    for (int b = 0; b < 256; b++)
        if (!byte_printable(b)) l.inv[byte_char(b) - 256] = (int16_t)b;
    l.doc = buf;
    /* jansson parses a copy with model.vocab and model.merges blanked, which are
     * then read in place (jcur.h): DeepSeek-V3's file peaked at 138 MB of RSS
     * as a whole tree */
    uint8_t *copy = base_alloc(len ? len : 1, MEM_TOK);
    if (!copy) return base_fail(err, errlen, STRATA_ENOMEM, "%s: out of memory", name);
    memcpy(copy, buf, len);
    find_spans(&l, len, copy);
    json_t *root;
    int rc = jsonx_parse(&root, copy, len, name, err, errlen);
    base_free(copy);
    if (rc) return rc;
    uint8_t *tmp = base_alloc(TOK_MAX_TOKEN * 4 + 16, MEM_TOK);
    if (!tmp) rc = base_fail(err, errlen, STRATA_ENOMEM, "%s: out of memory", name);
    if (!rc) rc = load_top(&l, root);
    json_t *model = rc ? NULL : json_object_get(root, "model");
    if (!rc) rc = load_vocab(&l, model, tmp);
    if (!rc) rc = load_merges(&l, model, tmp);
    if (!rc) rc = load_added(&l, root);
    if (!rc) rc = load_pretok(&l, root);
    if (!rc) rc = load_post(&l, root);
    base_free(tmp);
    json_decref(root);
    return rc;
}

int tok_hf_config(tok *t, const uint8_t *buf, size_t len, const char *name, char *err, size_t errlen) {
    json_t *root;
    int rc = jsonx_parse(&root, buf, len, name, err, errlen);
    if (rc) return rc;
    ld l = {.t = t, .name = name, .err = err, .errlen = errlen};
    if (!json_is_object(root)) { rc = bad(&l, "(top level)", "is not an object"); goto done; }
    int add_bos;
    if ((rc = get_bool(&l, root, "add_bos_token", "(top level)", 1, &add_bos))) goto done;
    if (!add_bos) t->bos = -1;
    json_t *ct = opt(root, "chat_template");
    if (json_is_array(ct)) { /* [{"name": ..., "template": ...}]: the "default" one */
        json_t *pick = NULL;
        for (size_t i = 0; i < json_array_size(ct); i++) {
            json_t *e = json_array_get(ct, i), *nm = json_is_object(e) ? json_object_get(e, "name") : NULL;
            if (json_is_string(nm) && !strcmp(json_string_value(nm), "default")) pick = json_object_get(e, "template");
        }
        ct = pick;
    }
    if (ct && !json_is_string(ct)) { rc = bad(&l, "chat_template", "is not a string"); goto done; }
    if (ct) {
        t->chat_template = base_strdup(json_string_value(ct), MEM_TOK);
        if (!t->chat_template) rc = base_fail(err, errlen, STRATA_ENOMEM, "%s: out of memory", name);
    }
done:
    json_decref(root);
    return rc;
}

/* ===== opening ===== */

int tok_open_hf_mem(tok **out, const uint8_t *json, size_t len, const char *name, const uint8_t *tokcfg,
                    size_t tokcfg_len, const char *tokcfg_name, int *cfg_bad, char *err, size_t errlen) {
    *out = NULL;
    tok *t = base_calloc(1, sizeof *t, MEM_TOK);
    if (!t) return base_fail(err, errlen, STRATA_ENOMEM, "tokenizer: out of memory");
    t->pattern = TOK_PAT_HF;
    t->bos = -1;
    if (pthread_mutex_init(&t->mu, NULL)) { tok_close(t); return base_fail(err, errlen, STRATA_ENOMEM, "tokenizer: no mutex"); }
    t->mu_init = 1;
    int rc = tok_hf_load(t, json, len, name, err, errlen);
    if (!rc && tokcfg) {
        rc = tok_hf_config(t, tokcfg, tokcfg_len, tokcfg_name ? tokcfg_name : "tokenizer_config.json", err, errlen);
        if (rc && cfg_bad) *cfg_bad = 1;
    }
    if (!rc) {
        t->cache = base_calloc(CACHE_N, sizeof *t->cache, MEM_TOK);
        if (!t->cache) rc = base_fail(err, errlen, STRATA_ENOMEM, "tokenizer: out of memory");
    }
    if (rc) { tok_close(t); return rc; }
    *out = t;
    return STRATA_OK;
}

int tok_open_hf(tok **out, const char *json_path, const char *tokcfg_path, int *cfg_bad, char *err, size_t errlen) {
    *out = NULL;
    if (cfg_bad) *cfg_bad = 0;
    uint8_t *v = NULL, *c = NULL;
    size_t vl = 0, cl = 0;
    /* DeepSeek-V3's tokenizer.json is 7.8 MB; 256 MiB leaves room for any real one. */
    int rc = base_read_file(json_path, 256u << 20, &v, &vl, err, errlen);
    if (!rc && tokcfg_path) {
        rc = base_read_file(tokcfg_path, 64u << 20, &c, &cl, err, errlen);
        if (rc && cfg_bad) *cfg_bad = 1;
    }
    if (!rc) rc = tok_open_hf_mem(out, v, vl, json_path, c, cl, tokcfg_path, cfg_bad, err, errlen);
    base_free(v);
    base_free(c);
    return rc;
}

int tok_open_dir(tok **out, const char *dir, int *cfg_bad, char *err, size_t errlen) {
    *out = NULL;
    if (cfg_bad) *cfg_bad = 0;
    char tk[4200], js[4200], tc[4200];
    snprintf(tk, sizeof tk, "%s/tiktoken.model", dir);
    snprintf(js, sizeof js, "%s/tokenizer.json", dir);
    snprintf(tc, sizeof tc, "%s/tokenizer_config.json", dir);
    const char *cfg = base_is_file(tc) ? tc : NULL;
    /* tiktoken.model wins: it is what Kimi's own tokenization_kimi.py reads, and
     * a tokenizer.json beside it would be a conversion. */
    int rc;
    if (base_is_file(tk)) rc = tok_open_ex(out, tk, cfg, TOK_PAT_KIMI, cfg_bad, err, errlen);
    else if (base_is_file(js)) rc = tok_open_hf(out, js, cfg, cfg_bad, err, errlen);
    else return base_fail(err, errlen, STRATA_EIO, "%s has no tokenizer (tiktoken.model or tokenizer.json)", dir);
    /* Kimi K2-Thinking and K2.5 ship their template as chat_template.jinja, not
     * in tokenizer_config.json (as transformers >= 4.43 saves it); chat.c tells
     * the formats apart by it. tokenizer_config.json's wins when both exist. */
    char jj[4200];
    snprintf(jj, sizeof jj, "%s/chat_template.jinja", dir);
    if (!rc && !(*out)->chat_template && base_is_file(jj)) {
        uint8_t *b = NULL;
        size_t n = 0;
        rc = base_read_file(jj, 16u << 20, &b, &n, err, errlen);
        if (!rc && !((*out)->chat_template = base_strdup((const char *)b, MEM_TOK)))
            rc = base_fail(err, errlen, STRATA_ENOMEM, "%s: out of memory", jj);
        base_free(b);
        if (rc) {
            if (cfg_bad) *cfg_bad = 1;
            tok_close(*out);
            *out = NULL;
        }
    }
    return rc;
}
