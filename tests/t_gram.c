/*
 * t_gram.c: structured output (src/text/jschema.c, jgram.c, the sampler's mask).
 *   gram_accept:   byte strings accepted / rejected / prefixes, for every
 *                  supported keyword.
 *   gram_errors:   unsupported keywords and hostile schemas are bounded errors
 *                  naming the keyword or the place.
 *   gram_pattern:  pattern (each regex construct) and format strings accepted /
 *                  rejected, with length bounds; refused constructs and hostile
 *                  patterns are bounded errors naming them.
 *   gram_range:    integer minimum / maximum / exclusive bounds: every integer
 *                  of a window accepted exactly when in range.
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
    CHECK(refused("{\"type\":\"string\",\"pattern\":\"(?=a)\"}", "'pattern' '(?=a)': lookahead"));
    CHECK(refused("{\"type\":\"object\",\"properties\":{\"d\":{\"type\":\"string\",\"format\":\"hostname\"}}}",
                  "#/properties/d: unsupported format 'hostname'"));
    CHECK(refused("{\"type\":\"number\",\"minimum\":0}", "'minimum' is supported on 'integer', not on 'number'"));
    CHECK(refused("{\"type\":\"integer\",\"multipleOf\":2}", "unsupported keyword 'multipleOf'"));
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
    /* pieces of pattern and format strings */
    "2024", "-0", "-02-29", "T1", ":3", "0Z", "Z\"", "@", ".org", "192.", "\\/", "\\t", "1\"", "-12\"", "ab\"", "\"2024-",
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
        /* pattern and format strings: the whole-trie walk, never the plain sets */
        "{\"type\":\"object\",\"properties\":{\"d\":{\"type\":\"string\",\"format\":\"date\"},\"t\":{\"type\":\"string\","
        "\"format\":\"date-time\"},\"e\":{\"type\":\"string\",\"format\":\"email\",\"maxLength\":12},"
        "\"i\":{\"type\":\"string\",\"format\":\"ipv4\"}},\"required\":[\"d\",\"t\",\"e\",\"i\"]}",
        "{\"type\":\"array\",\"items\":{\"type\":\"string\",\"pattern\":\"^[a-c\\\\d]{1,3}(?:-\\\\d+)?$\"},\"maxItems\":5}",
        "{\"type\":\"object\",\"additionalProperties\":{\"type\":\"string\",\"pattern\":\"ab|[\\\"/\\t]\",\"maxLength\":6}}",
        "{\"type\":[\"string\",\"null\"],\"format\":\"uuid\"}",
        "{\"type\":\"array\",\"items\":{\"type\":\"integer\",\"minimum\":-12,\"exclusiveMaximum\":306},\"maxItems\":5}",
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
    /* pattern and format strings on the random model: still a document, every string matching */
    const char *ps = "{\"type\":\"object\",\"properties\":{\"d\":{\"type\":\"string\",\"format\":\"date\"},"
                     "\"id\":{\"type\":\"string\",\"pattern\":\"^[A-Z]{2}-\\\\d{3}$\"},\"ip\":{\"type\":\"string\",\"format\":\"ipv4\"},"
                     "\"w\":{\"type\":\"string\",\"pattern\":\"ok\",\"maxLength\":8}},\"required\":[\"d\",\"id\",\"ip\",\"w\"]}";
    const char *pp = t_write("gram_pattern.json", ps, strlen(ps));
    g = compile(ps, err, sizeof err);
    CHECK_MSG(g != NULL, "%s", err);
    for (int sampled = 0; sampled < 2 && g; sampled++) {
        char cmd[2048], *o = NULL;
        snprintf(cmd, sizeof cmd, "%s run %s --prompt 'a date' --gen 300 --json-schema %s %s 2>/dev/null", t_strata(), dir, pp,
                 sampled ? "--temp 0.9 --seed 5" : "");
        CHECK(t_run(cmd, &o) == 0);
        if (o) {
            size_t n = strlen(o);
            while (n && o[n - 1] == '\n') n--;
            CHECK_MSG(jgram_check(g, (const uint8_t *)o, n) == 1, "not a document: %s", o);
        }
        base_free(o);
    }
    strata_grammar_free(g);
    char cmd[2048], *out = NULL;
    const char *bj = "{\"type\":\"array\",\"uniqueItems\":true}";
    const char *bad = t_write("gram_bad.json", bj, strlen(bj));
    snprintf(cmd, sizeof cmd, "%s run %s --prompt x --json-schema %s 2>&1", t_strata(), dir, bad);
    int rc = t_run(cmd, &out);
    CHECK_MSG(rc == 2 && out && strstr(out, "unsupported keyword 'uniqueItems'"), "rc %d: %s", rc, out ? out : "");
    base_free(out);
}

/* ---- gram_pattern ---- */

/* schema {"type":"string", EXTRA} against the JSON string text doc (quotes
 * added): want 1 complete, 0 prefix (no closing quote added), -1 rejected. */
static int pat_case(const char *extra, const char *doc, int want) {
    char schema[1024], err[512], text[512];
    snprintf(schema, sizeof schema, "{\"type\":\"string\",%s}", extra);
    jgram *g = compile(schema, err, sizeof err);
    if (!g) { fprintf(stderr, "  %s: %s\n", schema, err); return 0; }
    snprintf(text, sizeof text, want == 0 ? "\"%s" : "\"%s\"", doc);
    int ok = check(g, text, want);
    if (!ok) fprintf(stderr, "    schema %s\n", schema);
    strata_grammar_free(g);
    return ok;
}

#define P(pat) "\"pattern\":\"" pat "\""
#define F(fmt) "\"format\":\"" fmt "\""

TEST(gram_pattern) {
    /* literals, classes, quantifiers, anchors (JSON-escaped regex text) */
    CHECK(pat_case(P("^[a-z]{2,3}$"), "ab", 1) && pat_case(P("^[a-z]{2,3}$"), "abc", 1));
    CHECK(pat_case(P("^[a-z]{2,3}$"), "a", -1) && pat_case(P("^[a-z]{2,3}$"), "abcd", -1) && pat_case(P("^[a-z]{2,3}$"), "aB", -1));
    CHECK(pat_case(P("^[a-z]{2,3}$"), "ab", 0));
    CHECK(pat_case(P("^\\\\d+(\\\\.\\\\d{1,2})?$"), "12.5", 1) && pat_case(P("^\\\\d+(\\\\.\\\\d{1,2})?$"), "12.", -1));
    CHECK(pat_case(P("^\\\\d+(\\\\.\\\\d{1,2})?$"), "1.234", -1) && pat_case(P("^\\\\d+(\\\\.\\\\d{1,2})?$"), "x", -1));
    CHECK(pat_case(P("^(?:cat|dog)s?$"), "cats", 1) && pat_case(P("^(?:cat|dog)s?$"), "dog", 1) && pat_case(P("^(?:cat|dog)s?$"), "cow", -1));
    CHECK(pat_case(P("^(?<x>a)(b)*?c$"), "abbc", 1) && pat_case(P("^a{3}$"), "aaa", 1) && pat_case(P("^a{3}$"), "aa", -1));
    CHECK(pat_case(P("^a{2,}$"), "aaaaa", 1) && pat_case(P("^a{2,}$"), "a", -1) && pat_case(P("^a{$"), "a{", 1));
    CHECK(pat_case(P("^[^\\\\d]$"), "a", 1) && pat_case(P("^[^\\\\d]$"), "1", -1) && pat_case(P("^[\\\\w-]+$"), "a_-9", 1));
    CHECK(pat_case(P("^\\\\s\\\\S\\\\W\\\\D$"), " x-a", 1) && pat_case(P("^\\\\s$"), "\\t", 1) && pat_case(P("^\\\\W$"), "a", -1));
    /* search semantics where an anchor is missing */
    CHECK(pat_case(P("ab"), "xxabyy", 1) && pat_case(P("ab"), "xxa", -1) && pat_case(P("ab"), "xxa", 0));
    CHECK(pat_case(P("^ab"), "abzz", 1) && pat_case(P("^ab"), "zab", -1) && pat_case(P("ab$"), "zzab", 1) && pat_case(P("ab$"), "abz", -1));
    CHECK(pat_case(P("^a|b$"), "axx", 1) && pat_case(P("^a|b$"), "xxb", 1) && pat_case(P("^a|b$"), "xx", -1));
    CHECK(pat_case(P("^$"), "", 1) && pat_case(P("^$"), "a", -1) && pat_case(P(""), "anything", 1));
    CHECK(pat_case(P("^a|b|c$|^d$"), "xbx", 1) && pat_case(P("^a|b|c$|^d$"), "xxc", 1) && pat_case(P("^a|b|c$|^d$"), "xcx", -1));
    CHECK(pat_case(P("^a|b|c$|^d$"), "dx", -1) && pat_case(P("^a|b|c$|^d$"), "d", 1) && pat_case(P("^a|b|c$|^d$"), "ax", 1));
    {
        /* regression (fz_schema timeout): each unanchored top-level alternative
         * had its own pair of search loops, so 250 empty ones made every DFA
         * state set thousands of NFA states wide (1.3 s at -O2, 15 s under
         * ASan, 801 states); grouped, they share one pair */
        char pat[512];
        int n = snprintf(pat, sizeof pat, "\"pattern\":\"^a");
        for (int i = 0; i < 250 + 80 + 40; i++) pat[n++] = i < 250 ? '|' : i < 330 ? 'k' : '|';
        snprintf(pat + n, sizeof pat - (size_t)n, "per\"");
        CHECK(pat_case(pat, "anything", 1));
        /* and 100 unanchored words, refused before (more than 4096 states) */
        static const char *w[] = {"cat", "dog", "bird", "fish", "frog"};
        char many[2048];
        n = snprintf(many, sizeof many, "\"pattern\":\"");
        for (int i = 0; i < 100; i++) n += snprintf(many + n, sizeof many - (size_t)n, "%s%s%d", i ? "|" : "", w[i % 5], i);
        snprintf(many + n, sizeof many - (size_t)n, "\"");
        CHECK(pat_case(many, "a frog99 b", 1) && pat_case(many, "a frog100 b", -1));
    }
    /* '.' and negated classes: whole code points, not line terminators for '.' */
    CHECK(pat_case(P("^.$"), "\xc3\xa9", 1) && pat_case(P("^.$"), "\xf0\x9f\x98\x80", 1) && pat_case(P("^.$"), "\\n", -1));
    CHECK(pat_case(P("^.$"), "ab", -1) && pat_case(P("^[^a]$"), "\xe2\x82\xac", 1) && pat_case(P("^[^a]$"), "\\n", 1));
    CHECK(pat_case(P("^[^a]$"), "a", -1) && pat_case(P("^[\\u00e0-\\u00ff]+$"), "\xc3\xa9\xc3\xa0", 1));
    CHECK(pat_case(P("^\\\\u00e9\\\\x41$"), "\xc3\xa9" "A", 1) && pat_case(P("^\\\\u00e9$"), "\\u00e9", -1)); /* no \u in pattern strings */
    CHECK(pat_case(P("^\\\\uD83D\\\\uDE00$"), "\xf0\x9f\x98\x80", 1));
    /* characters JSON escapes: the escape feeds the byte it stands for */
    CHECK(pat_case(P("^a\\\"\\\\\\\\b$"), "a\\\"\\\\b", 1) && pat_case(P("^a\\\\nb$"), "a\\nb", 1) && pat_case(P("^a\\\\nb$"), "a\\tb", -1));
    CHECK(pat_case(P("^/$"), "\\/", 1) && pat_case(P("^/$"), "/", 1) && pat_case(P("^x$"), "\\x", -1));
    /* length bounds fold into the DFA */
    CHECK(pat_case(P("^[a-z]+$") ",\"maxLength\":3", "abc", 1) && pat_case(P("^[a-z]+$") ",\"maxLength\":3", "abcd", -1));
    CHECK(pat_case(P("^[a-z]+$") ",\"minLength\":2", "a", -1) && pat_case(P("^[a-z]+$") ",\"minLength\":2", "ab", 1));
    CHECK(pat_case(P("^(aa)+$") ",\"minLength\":3,\"maxLength\":4", "aaaa", 1) && pat_case(P("^(aa)+$") ",\"minLength\":3", "aa", -1));
    CHECK(pat_case(P("^.+$") ",\"maxLength\":2", "\xe2\x82\xac\xe2\x82\xac", 1) && pat_case(P("^.+$") ",\"maxLength\":2", "abc", -1));
    /* formats */
    CHECK(pat_case(F("date"), "2024-02-29", 1) && pat_case(F("date"), "2000-02-29", 1) && pat_case(F("date"), "2023-02-29", -1));
    CHECK(pat_case(F("date"), "1900-02-29", -1) && pat_case(F("date"), "2023-04-31", -1) && pat_case(F("date"), "2023-13-01", -1));
    CHECK(pat_case(F("date"), "2023-12-31", 1) && pat_case(F("date"), "2023-1-01", -1));
    CHECK(pat_case(F("time"), "12:30:00Z", 1) && pat_case(F("time"), "23:59:59.123+05:30", 1) && pat_case(F("time"), "24:00:00Z", -1));
    CHECK(pat_case(F("time"), "12:30:00", -1) && pat_case(F("date-time"), "2024-01-01T00:00:00-08:00", 1));
    CHECK(pat_case(F("date-time"), "2024-01-01 00:00:00Z", -1));
    CHECK(pat_case(F("uuid"), "123e4567-e89b-12d3-a456-426614174000", 1) && pat_case(F("uuid"), "123e4567-e89b-12d3-a456-42661417400", -1));
    CHECK(pat_case(F("email"), "first.last+x@mail.example.org", 1) && pat_case(F("email"), "a@b", -1));
    CHECK(pat_case(F("email"), "a..b@x.org", -1) && pat_case(F("email"), "a@-x.org", -1));
    CHECK(pat_case(F("ipv4"), "192.168.0.1", 1) && pat_case(F("ipv4"), "256.1.1.1", -1) && pat_case(F("ipv4"), "01.1.1.1", -1));
    CHECK(pat_case(F("date") "," P("^2024"), "2024-01-31", 1) && pat_case(F("date") "," P("^2024"), "2023-01-31", -1));
    /* a type list: the format applies to the string alternative only */
    {
        char err[512];
        jgram *g = compile("{\"type\":[\"string\",\"integer\"],\"format\":\"ipv4\",\"pattern\":\"^1\"}", err, sizeof err);
        CHECK_MSG(g != NULL, "%s", err);
        if (g) CHECK(check(g, "\"10.0.0.1\"", 1) && check(g, "7", 1) && check(g, "\"20.0.0.1\"", -1));
        strata_grammar_free(g);
    }
    /* refused constructs and hostile patterns: bounded errors naming them */
    CHECK(refused("{\"type\":\"string\",\"pattern\":\"a(?!b)\"}", "lookahead '(?!'"));
    CHECK(refused("{\"type\":\"string\",\"pattern\":\"(?<=a)b\"}", "lookbehind '(?<='"));
    CHECK(refused("{\"type\":\"string\",\"pattern\":\"(a)\\\\1\"}", "backreferences (\\1)"));
    CHECK(refused("{\"type\":\"string\",\"pattern\":\"(?<n>a)\\\\k<n>\"}", "backreferences (\\k<name>)"));
    CHECK(refused("{\"type\":\"string\",\"pattern\":\"\\\\bword\"}", "word boundaries"));
    CHECK(refused("{\"type\":\"string\",\"pattern\":\"\\\\p{L}\"}", "Unicode property"));
    CHECK(refused("{\"type\":\"string\",\"pattern\":\"a^b\"}", "'^' and '$' are supported only"));
    CHECK(refused("{\"type\":\"string\",\"pattern\":\"a{65}\"}", "repeat counts above 64"));
    CHECK(refused("{\"type\":\"string\",\"pattern\":\"[z-a]\"}", "out of order"));
    CHECK(refused("{\"type\":\"string\",\"pattern\":\"(ab\"}", "not closed"));
    CHECK(refused("{\"type\":\"string\",\"pattern\":\"ab)\"}", "unmatched ')'"));
    CHECK(refused("{\"type\":\"string\",\"pattern\":\"*a\"}", "nothing to repeat"));
    CHECK(refused("{\"type\":\"string\",\"pattern\":\"a**\"}", "quantifier follows a quantifier"));
    CHECK(refused("{\"type\":\"string\",\"pattern\":5}", "'pattern' must be a string"));
    CHECK(refused("{\"type\":\"string\",\"pattern\":\"^a\\\\u0001b$\"}", "no string that JSON text can carry"));
    CHECK(refused("{\"type\":\"string\",\"pattern\":\"^(aa)+$\",\"minLength\":3,\"maxLength\":3}", "no string"));
    CHECK(refused("{\"type\":\"string\",\"format\":\"uri\"}", "unsupported format 'uri'"));
    CHECK(refused("{\"type\":\"string\",\"pattern\":\"(a|b)*a(a|b){20}\"}", "more than 4096 automaton states"));
    CHECK(refused("{\"type\":\"string\",\"pattern\":\"((a{64}){64}){64}\"}", "too large"));
    /* subset construction is bounded by steps as well as states: this one has
     * 140 states but took 0.8 s at -O2 (10 s under ASan) to build */
    CHECK(refused("{\"type\":\"string\",\"pattern\":\"(\\\\S{1,64}){1,20}\"}", "takes more than"));
    CHECK(refused("{\"type\":\"string\",\"pattern\":\"^[a-z]+$\",\"maxLength\":100000}", "more than 16384 automaton states with minLength"));
    CHECK(pat_case(P("ok") ",\"maxLength\":300", "xx ok", 1)); /* a search with a long bound fits */
    {
        /* catastrophic nesting for a backtracker is a small DFA here */
        char err[512];
        jgram *g = compile("{\"type\":\"string\",\"pattern\":\"^((a*)*)*b$\"}", err, sizeof err);
        CHECK_MSG(g != NULL, "%s", err);
        if (g) CHECK(check(g, "\"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaab\"", 1) && check(g, "\"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\"", -1));
        strata_grammar_free(g);
    }
    {
        /* the error names the place */
        char err[512];
        strata_grammar *g = NULL;
        const char *s = "{\"type\":\"object\",\"properties\":{\"x\":{\"type\":\"string\",\"pattern\":\"(?=x)\"}}}";
        strata_grammar_json_schema(&g, s, strlen(s), err, sizeof err);
        CHECK_MSG(!g && strstr(err, "json schema at #/properties/x: 'pattern' '(?=x)': lookahead"), "%s", err);
        strata_grammar_free(g);
    }
}

/* ---- gram_range ---- */

TEST(gram_range) {
    static const struct { const char *bounds; int64_t lo, hi; } k[] = {
        {"\"minimum\":0,\"maximum\":100", 0, 100},
        {"\"minimum\":-137,\"maximum\":45", -137, 45},
        {"\"minimum\":-20,\"maximum\":-3", -20, -3},
        {"\"minimum\":7,\"maximum\":7", 7, 7},
        {"\"minimum\":0,\"maximum\":0", 0, 0},
        {"\"exclusiveMinimum\":0,\"exclusiveMaximum\":10", 1, 9},
        {"\"minimum\":2.5,\"maximum\":1099.9", 3, 1099},
        {"\"exclusiveMinimum\":-1.5,\"exclusiveMaximum\":1000", -1, 999},
        {"\"minimum\":10,\"maximum\":1099,\"exclusiveMaximum\":500", 10, 499},
        {"\"minimum\":1000", 1000, INT64_MAX},
        {"\"maximum\":-5", INT64_MIN, -5},
    };
    char schema[256], err[512], doc[64];
    for (size_t i = 0; i < sizeof k / sizeof *k; i++) {
        snprintf(schema, sizeof schema, "{\"type\":\"object\",\"properties\":{\"v\":{\"type\":\"integer\",%s}},\"required\":[\"v\"]}",
                 k[i].bounds);
        jgram *g = compile(schema, err, sizeof err);
        CHECK_MSG(g != NULL, "%s: %s", schema, err);
        if (!g) continue;
        int bad = 0;
        for (int64_t v = -1500; v <= 1500 && bad < 3; v++) {
            snprintf(doc, sizeof doc, "{\"v\":%lld}", (long long)v);
            const int want = v >= k[i].lo && v <= k[i].hi ? 1 : -1;
            if (jgram_check(g, (const uint8_t *)doc, strlen(doc)) != want) {
                fprintf(stderr, "  %s: %s want %d\n", k[i].bounds, doc, want);
                bad++;
            }
        }
        CHECK(bad == 0);
        /* JSON's own rules stay: no leading zeros, no fraction */
        CHECK(check(g, "{\"v\":0007}", -1) && check(g, "{\"v\":1.0}", -1));
        strata_grammar_free(g);
    }
    jgram *g = compile("{\"type\":\"integer\",\"minimum\":1000}", err, sizeof err);
    CHECK_MSG(g != NULL, "%s", err);
    if (g) {
        CHECK(check(g, "123456789012345", 1) && check(g, "1234567890123456", -1) && check(g, "999", 0) && check(g, "-5", -1));
        strata_grammar_free(g);
    }
    CHECK(refused("{\"type\":\"integer\",\"minimum\":5,\"maximum\":4}", "no integer lies between"));
    CHECK(refused("{\"type\":\"integer\",\"minimum\":1e20}", "bounds of 15 digits"));
    CHECK(refused("{\"type\":\"integer\",\"minimum\":true}", "'minimum' must be a number"));
}
