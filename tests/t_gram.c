/*
 * t_gram.c: structured output (src/text/jschema.c, jgram.c, the sampler's mask).
 *   gram_accept:   byte strings accepted / rejected / prefixes, for every
 *                  supported keyword.
 *   gram_errors:   unsupported keywords and hostile schemas are bounded errors
 *                  naming the keyword or the place.
 *   gram_mask:     token masks over a small vocabulary equal feeding each
 *                  token's bytes (string fast path and whole-trie walk); end
 *                  ids only when complete; the cache agrees.
 *   gram_generate: constrained generation on a random-weight model: every
 *                  output is a document, the same bits batched, speculating and
 *                  alone, greedy and sampled.
 *   gram_cli:      strata run --json-schema / --json-object, and the error exit.
 */
#include <string.h>
#include "base.h"
#include "jgram.h"
#include "jschema.h"
#include "jsonx.h"
#include "sample.h"
#include "strata.h"
#include "test.h"

static jgram *compile(const char *schema, char *err, size_t errlen) {
    strata_grammar *g = NULL;
    err[0] = 0;
    if (schema) strata_grammar_json_schema(&g, schema, strlen(schema), err, errlen);
    else strata_grammar_json_object(&g, err, errlen);
    return g;
}

/* want: 1 complete, 0 prefix, -1 rejected */
static int check(const jgram *g, const char *doc, int want) {
    int got = jgram_check(g, (const uint8_t *)doc, strlen(doc));
    if (got != want) fprintf(stderr, "  '%s': got %d, want %d\n", doc, got, want);
    return got == want;
}

TEST(gram_accept) {
    char err[512];
    jgram *g = compile(NULL, err, sizeof err);
    CHECK_MSG(g != NULL, "%s", err);
    if (g) {
        CHECK(check(g, "{}", 1));
        CHECK(check(g, "{\"a\":[1,-2.5e+3,\"x\",true,null,{\"b\":{}}]}", 1));
        CHECK(check(g, "{ \"a\" : 1 ,\n\t\"b\":\"\\u00e9\\n\"}", 1));
        CHECK(check(g, "{\"a\":1", 0));
        CHECK(check(g, "[]", -1));
        CHECK(check(g, "{\"a\":01}", -1));
        CHECK(check(g, "{\"a\":1.}", -1));
        CHECK(check(g, "{\"a\":\"\\ud800\"}", -1));      /* no surrogate escapes */
        CHECK(check(g, "{\"a\":\"\xc3\xa9\"}", 1));
        CHECK(check(g, "{\"a\":\"\xc3\"}", -1));         /* broken UTF-8 */
        CHECK(check(g, "{\"a\":\"\xed\xa0\x80\"}", -1)); /* encoded surrogate */
        CHECK(check(g, "{\"a\":\"\x01\"}", -1));
        CHECK(check(g, "{}  ", -1));                      /* nothing after the document */
        CHECK(check(g, "                 {}", -1));       /* whitespace is bounded */
        CHECK(check(g, "{\"a\":1234567890123456}", -1));  /* 16 integer digits */
        strata_grammar_free(g);
    }
    /* properties in schema order, required ones, optional ones skippable */
    g = compile("{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"minLength\":1,\"maxLength\":3},"
                "\"age\":{\"type\":\"integer\"},\"tags\":{\"type\":\"array\",\"items\":{\"enum\":[\"a\",\"b\",1]},"
                "\"minItems\":1,\"maxItems\":2},\"ok\":{\"type\":\"boolean\"}},\"required\":[\"name\",\"tags\"],"
                "\"additionalProperties\":false}", err, sizeof err);
    CHECK_MSG(g != NULL, "%s", err);
    if (g) {
        CHECK(check(g, "{\"name\":\"abc\",\"age\":3,\"tags\":[\"a\",1],\"ok\":true}", 1));
        CHECK(check(g, "{\"name\":\"x\",\"tags\":[1]}", 1));
        CHECK(check(g, "{\"name\":\"\xe2\x82\xac\xe2\x82\xac\xe2\x82\xac\",\"tags\":[1]}", 1)); /* 3 code points */
        CHECK(check(g, "{\"name\":\"abcd\"", -1));  /* maxLength */
        CHECK(check(g, "{\"name\":\"\",", -1));     /* minLength */
        CHECK(check(g, "{\"tags\":[1],\"name\":\"x\"}", -1)); /* schema order */
        CHECK(check(g, "{\"name\":\"x\"}", -1));    /* tags required */
        CHECK(check(g, "{\"name\":\"x\",\"tags\":[]}", -1)); /* minItems */
        CHECK(check(g, "{\"name\":\"x\",\"tags\":[1,1,1]}", -1)); /* maxItems */
        CHECK(check(g, "{\"name\":\"x\",\"tags\":[\"c\"]}", -1)); /* enum */
        CHECK(check(g, "{\"name\":\"x\",\"age\":1.5}", -1)); /* integer */
        CHECK(check(g, "{\"name\":\"x\",\"other\":1}", -1)); /* not listed */
        CHECK(check(g, "{\"name\":\"x\",\"tags\":[1],\"ok\":false}", 1));
        strata_grammar_free(g);
    }
    /* type lists, anyOf, const, null, numbers at the top (complete while digits may follow) */
    g = compile("{\"type\":[\"number\",\"null\"]}", err, sizeof err);
    CHECK_MSG(g != NULL, "%s", err);
    if (g) {
        CHECK(check(g, "12", 1) && check(g, "-0.5E-2", 1) && check(g, "null", 1) && check(g, "nul", 0) && check(g, "-", 0));
        CHECK(check(g, "\"x\"", -1));
        strata_grammar_free(g);
    }
    g = compile("{\"anyOf\":[{\"type\":\"string\",\"maxLength\":2},{\"type\":\"array\",\"items\":{\"const\":{\"k\":[1,2]}}},"
                "{\"enum\":[1,12,true]}]}", err, sizeof err);
    CHECK_MSG(g != NULL, "%s", err);
    if (g) {
        CHECK(check(g, "\"ab\"", 1) && check(g, "[{\"k\":[1,2]}]", 1) && check(g, "1", 1) && check(g, "12", 1) && check(g, "true", 1));
        CHECK(check(g, "13", -1) && check(g, "[{\"k\":[1]}]", -1) && check(g, "\"abc\"", -1));
        strata_grammar_free(g);
    }
    /* recursive $ref: a tree of nodes */
    g = compile("{\"$defs\":{\"node\":{\"type\":\"object\",\"properties\":{\"v\":{\"type\":\"integer\"},\"kids\":{\"type\":\"array\","
                "\"items\":{\"$ref\":\"#/$defs/node\"}}},\"required\":[\"v\"]}},\"$ref\":\"#/$defs/node\"}", err, sizeof err);
    CHECK_MSG(g != NULL, "%s", err);
    if (g) {
        CHECK(check(g, "{\"v\":1,\"kids\":[{\"v\":2},{\"v\":3,\"kids\":[]}]}", 1));
        CHECK(check(g, "{\"kids\":[]}", -1));
        strata_grammar_free(g);
    }
    /* additionalProperties as a schema: free-form keys with typed values; annotations are ignored */
    g = compile("{\"title\":\"t\",\"description\":\"d\",\"type\":\"object\",\"additionalProperties\":{\"type\":\"integer\"}}", err,
                sizeof err);
    CHECK_MSG(g != NULL, "%s", err);
    if (g) {
        CHECK(check(g, "{\"any key\":1,\"b\":2}", 1) && check(g, "{\"a\":\"x\"}", -1));
        strata_grammar_free(g);
    }
    g = compile("true", err, sizeof err);
    CHECK(g && check(g, "[1,{\"a\":null}]", 1));
    strata_grammar_free(g);
}

static int refused(const char *schema, const char *want) {
    char err[512];
    strata_grammar *g = NULL;
    int rc = strata_grammar_json_schema(&g, schema, strlen(schema), err, sizeof err);
    int ok = rc == STRATA_EINVAL && !g && strstr(err, want);
    if (!ok) fprintf(stderr, "  %.80s: rc %d, '%s' (want '%s')\n", schema, rc, g ? "compiled" : err, want);
    strata_grammar_free(g);
    return ok;
}

TEST(gram_errors) {
    CHECK(refused("{\"type\":\"string\",\"pattern\":\"^a\"}", "unsupported keyword 'pattern'"));
    CHECK(refused("{\"type\":\"object\",\"properties\":{\"d\":{\"type\":\"string\",\"format\":\"date\"}}}",
                  "#/properties/d: unsupported keyword 'format'"));
    CHECK(refused("{\"type\":\"integer\",\"minimum\":0}", "'minimum'"));
    CHECK(refused("{\"type\":\"array\",\"uniqueItems\":true}", "'uniqueItems'"));
    CHECK(refused("{\"type\":\"objekt\"}", "unknown type 'objekt'"));
    CHECK(refused("{\"type\":\"object\",\"properties\":{},\"required\":[\"a\"]}", "required property 'a'"));
    CHECK(refused("{\"type\":\"string\",\"minLength\":3,\"maxLength\":2}", "minLength 3 > maxLength 2"));
    CHECK(refused("{\"anyOf\":[{\"type\":\"object\"},{\"type\":\"object\",\"properties\":{\"a\":{}}}]}", "both start with '{'"));
    CHECK(refused("{\"$ref\":\"#\"}", "'$ref' cycle"));
    CHECK(refused("{\"$defs\":{\"a\":{\"$ref\":\"#/$defs/b\"},\"b\":{\"$ref\":\"#/$defs/a\"}},\"$ref\":\"#/$defs/a\"}", "'$ref' cycle"));
    CHECK(refused("{\"$ref\":\"http://x/s.json\"}", "only local references"));
    CHECK(refused("{\"$ref\":\"#/$defs/none\"}", "points at nothing"));
    CHECK(refused("{\"enum\":[]}", "'enum' must be a non-empty array"));
    CHECK(refused("{bad json", "json schema"));
    CHECK(refused("false", "matches nothing"));
    /* deep nesting: 40 objects */
    {
        char s[4096] = "";
        size_t n = 0;
        for (int i = 0; i < 40; i++) n += (size_t)snprintf(s + n, sizeof s - n, "{\"type\":\"object\",\"properties\":{\"a\":");
        n += (size_t)snprintf(s + n, sizeof s - n, "{}");
        for (int i = 0; i < 40; i++) n += (size_t)snprintf(s + n, sizeof s - n, "}}");
        CHECK(refused(s, "containers nest deeper than 31"));
    }
    /* a huge enum */
    {
        size_t cap = 5000 * 8 + 64, n = 0;
        char *s = base_alloc(cap, MEM_MISC);
        n += (size_t)snprintf(s + n, cap - n, "{\"enum\":[");
        for (int i = 0; i < 5000; i++) n += (size_t)snprintf(s + n, cap - n, "%s%d", i ? "," : "", i);
        snprintf(s + n, cap - n, "]}");
        CHECK(refused(s, "'enum' has 5000 values; at most 4096"));
        base_free(s);
    }
}

/* ---- gram_mask: the trie walk (and the string fast path) against brute force ---- */

/* A small vocabulary: every single byte (so a random walk reaches any state),
 * then pieces that cross structural boundaries, escapes, UTF-8 fragments and
 * long plain runs (past the fast path's code-point cap); ids of NULL are
 * specials (never text), one hole, one duplicate. */
static const char *const mask_pieces[] = {
    "\",", "\"}", "}]", "\"]", "\":", "\":\"", "{\"", "[\"", "\", \"", "},{\"", "]}", "}}", "\\\"", "\\u00", "\\ud8",
    "\\uD7", "e9", "00e9\"", "\\n", "\\", "\"", " \"", "true", "null", "fal", "se", "123", "-0.", "e+5", "1.5e", "0,",
    "1]", "2}", "\xc3\xa9", "\xc3", "\xa9", "\xa9\"", "\xe2\x82", "\xac", "\xe2\x82\xac", "\xe6\x97\xa5\xe6\x9c\xac",
    "\xe6\x97\xa5\xe6", "\xed\xa0\x80", "\xed\x9f\xbf", "\xf0\x9f\x98\x80", "\xf0\x9f", "\x98\x80\"", "\xf4\x8f\xbf\xbf",
    "\xf4\x90", "\xc0\xaf", "hello", " world", "abc", "abc", "name", "\"name\":", "\"tags\":[", "\"v\":", "\"kids\":[{\"v\":",
    "  ", "\n", "\t\t", "\x01x", "\x7f", "a\x1f", "x\"y", "ab\\", "\xe2\x82\xac\xe2\x82\xac\xe2\x82\xac",
    "0123456789012345678901234567890123456789", "\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9"
    "\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9"
    "\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9",
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
    "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb", "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb", "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb", /* 31-33: the cap */
    NULL, "ab", "abcd", "a", "aa", "aaa", "aaaa", "[1,", "[]", "{}", "\"\"", "\"a\"", NULL, "e", "E-", ".5", "-",
};
#define MASK_NPIECES ((int32_t)(sizeof mask_pieces / sizeof *mask_pieces))
#define MASK_NV (256 + MASK_NPIECES + 2) /* + an end id and a hole */

typedef struct { uint8_t one[256]; } mask_vocab;

static const uint8_t *mask_bytes(void *ud, int32_t id, size_t *len) {
    mask_vocab *mv = ud;
    if (id < 256) { *len = 1; return &mv->one[id]; }
    if (id - 256 < MASK_NPIECES && mask_pieces[id - 256]) {
        *len = strlen(mask_pieces[id - 256]);
        return (const uint8_t *)mask_pieces[id - 256];
    }
    return NULL; /* specials, the end id, the hole */
}

static uint64_t mask_rng(uint64_t *s) {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

/* Random valid prefixes of documents of one schema: at every step the matcher's
 * mask equals feeding each id's bytes from the state (the end id exactly when
 * complete), then a random allowed id moves both on. 0 on agreement. */
static int mask_agrees(const char *schema, const jg_vocab *v, mask_vocab *mv, int fast, int docs, int steps, uint64_t seed,
                       int64_t *n_masks, int64_t *n_cached) {
    char err[512];
    jgram *g = compile(schema, err, sizeof err);
    if (!g) { fprintf(stderr, "  %s: %s\n", schema ? schema : "json_object", err); return -1; }
    const int32_t end = MASK_NV - 2;
    int bad = 0;
    int32_t allowed[MASK_NV];
    for (int d = 0; d < docs && !bad; d++) {
        jg_matcher *m = NULL;
        if (jgram_matcher_create(&m, g, v, &end, 1, err, sizeof err)) { fprintf(stderr, "  %s\n", err); bad = 1; break; }
        jgram_matcher_set_fast(m, fast);
        jg_state st;
        jgram_start(g, &st);
        for (int step = 0; step < steps && !bad; step++) {
            int64_t n_allowed = 0;
            const uint64_t *mask = jgram_matcher_mask(m, &n_allowed);
            int n = 0;
            for (int32_t id = 0; id < MASK_NV && !bad; id++) {
                size_t len = 0;
                const uint8_t *p = id == end ? NULL : mask_bytes(mv, id, &len);
                int ok = id == end ? jgram_can_end(g, &st) : 0;
                if (p) {
                    jg_state t = st;
                    ok = 1;
                    for (size_t i = 0; i < len && ok; i++) ok = jgram_feed(g, &t, p[i]) == 0;
                }
                if (ok) allowed[n++] = id;
                if (ok != (int)(mask[id >> 6] >> (id & 63) & 1)) {
                    fprintf(stderr, "  %s (fast %d): doc %d step %d: id %d ('%.*s') mask %d, bytes %d\n", schema ? schema : "json_object",
                            fast, d, step, id, (int)len, p ? (const char *)p : "", !ok, ok);
                    bad = 1;
                }
            }
            if (!bad && n != n_allowed) { fprintf(stderr, "  count %lld, bytes %d\n", (long long)n_allowed, n); bad = 1; }
            if (bad || n == 0) break;
            /* the end id now and then when it may come, else any allowed id */
            int32_t id = allowed[mask_rng(&seed) % (uint64_t)n];
            if (allowed[n - 1] == end && mask_rng(&seed) % 8 == 0) id = end;
            if (jgram_matcher_accept(m, id)) { fprintf(stderr, "  accept %d refused\n", id); bad = 1; }
            if (id == end) break;
            size_t len = 0;
            const uint8_t *p = mask_bytes(mv, id, &len);
            for (size_t i = 0; i < len; i++) jgram_feed(g, &st, p[i]);
        }
        int64_t a, b;
        jgram_matcher_stats(m, &a, &b);
        *n_masks += a;
        *n_cached += b;
        jgram_matcher_free(m);
    }
    jgram_free(g);
    return bad ? -1 : 0;
}

TEST(gram_mask) {
    static mask_vocab mv;
    for (int i = 0; i < 256; i++) mv.one[i] = (uint8_t)i;
    char err[512];
    jg_vocab *v = NULL;
    CHECK_MSG(jgram_vocab_build(&v, MASK_NV, mask_bytes, &mv, err, sizeof err) == 0, "%s", err);
    if (!v) return;
    static const char *const schemas[] = {
        NULL, /* any JSON object */
        "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"minLength\":1,\"maxLength\":3},"
        "\"tags\":{\"type\":\"array\",\"items\":{\"enum\":[\"a\",\"b\\\"c\",\"\\u00e9\",1]},\"maxItems\":4},"
        "\"ok\":{\"type\":\"boolean\"}},\"required\":[\"name\"]}",
        "{\"type\":\"object\",\"properties\":{\"s\":{\"type\":\"string\",\"maxLength\":45},\"t\":{\"type\":\"string\",\"minLength\":2},"
        "\"u\":{\"type\":\"string\",\"minLength\":38,\"maxLength\":40}},\"required\":[\"s\",\"t\",\"u\"]}",
        "{\"type\":\"array\",\"items\":{\"anyOf\":[{\"type\":\"string\",\"maxLength\":2},{\"type\":\"number\"},{\"enum\":[null,true]}]},"
        "\"maxItems\":6}",
        "{\"$defs\":{\"node\":{\"type\":\"object\",\"properties\":{\"v\":{\"type\":\"integer\"},\"kids\":{\"type\":\"array\","
        "\"items\":{\"$ref\":\"#/$defs/node\"}}},\"required\":[\"v\"]}},\"$ref\":\"#/$defs/node\"}",
        "{\"type\":\"object\",\"additionalProperties\":{\"type\":\"string\",\"maxLength\":5}}",
        "{\"type\":[\"number\",\"null\",\"string\"]}",
    };
    int64_t n_masks = 0, n_cached = 0;
    /* the string fast path and the whole-trie walk, each against the bytes */
    for (int fast = 0; fast < 2; fast++)
        for (size_t i = 0; i < sizeof schemas / sizeof *schemas; i++)
            CHECK(mask_agrees(schemas[i], v, &mv, fast, 24, 120, 0x9E3779B97F4A7C15ULL + i, &n_masks, &n_cached) == 0);
    /* the per-state cache served part of them, each checked like the rest */
    CHECK_MSG(n_cached > 0 && n_cached < n_masks, "%lld of %lld masks cached", (long long)n_cached, (long long)n_masks);
    jgram_vocab_free(v);
}

/* strata run --json-schema on a random-weight model: the output is a document,
 * the same ids with and without speculation, greedy and sampled; a refused schema
 * exits 2 naming the keyword. */
TEST(gram_cli) {
    const char *dir = t_model("gram_tiny", "tiny", 5, 0);
    CHECK(dir != NULL);
    if (!dir) return;
    const char *schema = "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"maxLength\":6},"
                         "\"v\":{\"type\":\"array\",\"items\":{\"type\":\"integer\"},\"maxItems\":3}},\"required\":[\"name\",\"v\"]}";
    const char *sp = t_write("gram_schema.json", schema, strlen(schema));
    char err[512];
    jgram *g = compile(schema, err, sizeof err);
    CHECK(g != NULL);
    for (int sampled = 0; sampled < 2 && g; sampled++) {
        char *out[2] = {NULL, NULL};
        for (int spec = 0; spec < 2; spec++) {
            char cmd[2048];
            snprintf(cmd, sizeof cmd, "%s run %s --prompt 'json please' --gen 300 --json-schema %s %s %s 2>/dev/null", t_strata(), dir, sp,
                     sampled ? "--temp 0.9 --seed 11" : "", spec ? "--spec 3" : "");
            CHECK(t_run(cmd, &out[spec]) == 0);
        }
        if (out[0] && out[1]) {
            CHECK_MSG(!strcmp(out[0], out[1]), "speculation changed the output:\n%s\n%s", out[0], out[1]);
            size_t n = strlen(out[0]);
            while (n && out[0][n - 1] == '\n') n--; /* the CLI's own newline */
            CHECK_MSG(jgram_check(g, (const uint8_t *)out[0], n) == 1, "not a document: %s", out[0]);
        }
        base_free(out[0]);
        base_free(out[1]);
    }
    strata_grammar_free(g);
    char cmd[2048], *out = NULL;
    const char *bj = "{\"type\":\"string\",\"pattern\":\"x\"}";
    const char *bad = t_write("gram_bad.json", bj, strlen(bj));
    snprintf(cmd, sizeof cmd, "%s run %s --prompt x --json-schema %s 2>&1", t_strata(), dir, bad);
    int rc = t_run(cmd, &out);
    CHECK_MSG(rc == 2 && out && strstr(out, "unsupported keyword 'pattern'"), "rc %d: %s", rc, out ? out : "");
    base_free(out);
}
