/*
 * t_jcur.c: the strict JSON cursor (src/base/jcur.c) against jansson, and the
 * tokenizer.json reader that reads model.vocab and model.merges with it in
 * place (tok_hf.c).
 *   jcur_strings    strings decode as jansson decodes them (escapes, surrogate
 *                   pairs, \u0000, UTF-8 of every length) and are refused where
 *                   jansson refuses them (lone surrogates, overlong and invalid
 *                   UTF-8, control bytes, bad escapes); numbers by kind;
 *                   jcur_member finds escaped keys and passes over nested values;
 *                   jcur_blank keeps the newlines.
 *   tok_hf_escaped  a tokenizer.json with every character of every string
 *                   written as a \u escape (keys "model", "vocab", "merges"
 *                   included) loads to the same tokenizer: same bytes for every
 *                   id, same ids for a text (the generated DeepSeek-style file).
 */
#include <string.h>
#include "gen.h"
#include "jcur.h"
#include "jsonx.h"
#include "test.h"
#include "tok.h"

/* jansson's verdict on the JSON string literal lit: 0 and its bytes, or -1. */
static int jansson_string(const char *lit, uint8_t *out, size_t *n) {
    sbuf b = {0};
    sbuf_printf(&b, "[%s]", lit);
    json_t *j = jsonx_load((const uint8_t *)b.s, b.len, "t", NULL, 0);
    sbuf_free(&b);
    json_t *s = j ? json_array_get(j, 0) : NULL;
    int ok = json_is_string(s);
    if (ok) {
        *n = json_string_length(s);
        memcpy(out, json_string_value(s), *n);
    }
    json_decref(j);
    return ok ? 0 : -1;
}

static jcur cursor(const char *s) {
    return (jcur){.p = (const uint8_t *)s, .end = (const uint8_t *)s + strlen(s), .base = (const uint8_t *)s,
                  .what = "t.json", .tag = MEM_MISC};
}

TEST(jcur_strings) {
    static const char *const lits[] = {
        "\"plain\"", "\"\\u0120a\"", "\"\\\"\\\\\\/\\b\\f\\n\\r\\t\"", "\"\\ud83d\\ude00\"", "\"a\\u0000b\"",
        "\"\xc4\xa0\xe4\xb8\xad\xf0\x9f\x98\x80\"", "\"\\uD83D\\uDE00x\"", "\"\"",
        /* refused */
        "\"\\ud800\"", "\"\\udc00\"", "\"\\ud800\\u0041\"", "\"\xc0\xaf\"", "\"\xed\xa0\x80\"", "\"\xf4\x90\x80\x80\"",
        "\"\xe4\xb8\"", "\"a\tb\"", "\"\\x41\"", "\"\\u12G4\"", "\"unterminated", "\"\\",
    };
    char err[256];
    for (size_t i = 0; i < sizeof lits / sizeof lits[0]; i++) {
        uint8_t a[64];
        size_t an = 0;
        int ja = jansson_string(lits[i], a, &an);
        jcur c = cursor(lits[i]);
        c.err = err;
        c.errlen = sizeof err;
        jstr s = {0};
        int jb = jcur_str(&c, &s, NULL) ? -1 : 0;
        CHECK_MSG(ja == jb && (ja || (an == s.len && !memcmp(a, s.s, an))), "%s: jansson %d (%zu), jcur %d (%zu) %s",
                  lits[i], ja, an, jb, s.len, jb ? err : "");
        CHECK(!jb || strstr(err, "t.json: invalid JSON at byte"));
        base_free(s.s);
    }
    static const struct { const char *num; int ok, kind; int64_t v; } nums[] = {
        {"0", 1, JN_INT, 0}, {"-0", 1, JN_INT, 0}, {"123", 1, JN_INT, 123}, {"5.0", 1, JN_REAL, 0}, {"1e3", 1, JN_REAL, 0},
        {"-7", 1, JN_INT, -7}, {"99999999999999999999999", 1, JN_RANGE, 0},
        {"1.", 0, 0, 0}, {".5", 0, 0, 0}, {"-", 0, 0, 0}, {"1e", 0, 0, 0}, {"true", 0, 0, 0},
    };
    for (size_t i = 0; i < sizeof nums / sizeof nums[0]; i++) {
        jcur c = cursor(nums[i].num);
        int64_t v = -99;
        int kind = -1, rc = jcur_num(&c, &v, &kind, NULL);
        CHECK_MSG((rc == 0) == nums[i].ok && (rc || (kind == nums[i].kind && (kind != JN_INT || v == nums[i].v))),
                  "%s: rc %d kind %d v %lld", nums[i].num, rc, kind, (long long)v);
    }
    /* members: escaped keys match, nested values are passed over whole */
    const char *doc = "{\"a\": [1, {\"model\": 2}], \"m\\u006fdel\" :\n {\"x\": \"}\\\"]\"},\n \"z\": 0}";
    jcur c = cursor(doc);
    const uint8_t *v = NULL;
    size_t n = 0;
    CHECK(jcur_member(&c, "model", &v, &n) == 0 && n == strlen("{\"x\": \"}\\\"]\"}") && v && *v == '{');
    base_free(c.tmp.s);
    c = cursor(doc);
    CHECK(jcur_member(&c, "q", &v, &n) == 1);
    jcur bad = cursor("{\"a\": [");
    CHECK(jcur_member(&bad, "b", &v, &n) == STRATA_EFORMAT);
    base_free(c.tmp.s);
    base_free(bad.tmp.s);
    char blank[] = "{\n \"k\": [1,\n2]}";
    jcur_blank((uint8_t *)blank, strlen(blank));
    CHECK(!strcmp(blank, "{\n}        \n   "));
}

/* doc with every character of every string as a \u escape; escapes kept. */
static char *escape_all(const char *doc) {
    sbuf b = {0};
    int in = 0;
    for (const uint8_t *p = (const uint8_t *)doc; *p;) {
        if (*p == '"') { in = !in; sbuf_printf(&b, "\""); p++; continue; }
        if (!in) { sbuf_printf(&b, "%c", *p++); continue; }
        if (*p == '\\') { /* an escape as it was */
            size_t k = p[1] == 'u' ? 6 : 2;
            sbuf_printf(&b, "%.*s", (int)k, (const char *)p);
            p += k;
            continue;
        }
        uint32_t cp;
        size_t k = *p < 0x80 ? 1 : *p < 0xE0 ? 2 : *p < 0xF0 ? 3 : 4;
        cp = k == 1 ? *p : k == 2 ? *p & 0x1Fu : k == 3 ? *p & 0x0Fu : *p & 0x07u;
        for (size_t i = 1; i < k; i++) cp = cp << 6 | (p[i] & 0x3Fu);
        if (cp >= 0x10000) sbuf_printf(&b, "\\u%04X\\u%04x", 0xD800 + ((cp - 0x10000) >> 10), 0xDC00 + ((cp - 0x10000) & 0x3FF));
        else sbuf_printf(&b, "\\u%04x", cp);
        p += k;
    }
    return b.s;
}

static void same_tokenizer(const char *json, const char *what) {
    char err[512] = "";
    char *esc = escape_all(json);
    tok *a = NULL, *b = NULL;
    CHECK_MSG(tok_open_hf_mem(&a, (const uint8_t *)json, strlen(json), "a.json", NULL, 0, NULL, NULL, err, sizeof err) == 0,
              "%s: %s", what, err);
    CHECK_MSG(tok_open_hf_mem(&b, (const uint8_t *)esc, strlen(esc), "b.json", NULL, 0, NULL, NULL, err, sizeof err) == 0,
              "%s escaped: %s", what, err);
    if (a && b) {
        CHECK(tok_n_vocab(a) == tok_n_vocab(b));
        int diff = 0;
        for (int32_t id = 0; id < (int32_t)tok_n_vocab(a); id++) {
            size_t la = 0, lb = 0;
            const uint8_t *pa = tok_token_bytes(a, id, &la), *pb = tok_token_bytes(b, id, &lb);
            diff += !pa != !pb || la != lb || (pa && memcmp(pa, pb, la));
        }
        CHECK_MSG(diff == 0, "%s: %d ids differ", what, diff);
        const char text[] = "Hello, world! abc ab  bc \xe4\xb8\xad\xe6\x96\x87 12345 \n\n x";
        int32_t *ia = NULL, *ib = NULL;
        size_t na = 0, nb = 0;
        CHECK(tok_encode(a, (const uint8_t *)text, sizeof text - 1, 1, &ia, &na) == 0);
        CHECK(tok_encode(b, (const uint8_t *)text, sizeof text - 1, 1, &ib, &nb) == 0);
        CHECK_MSG(na == nb && na && !memcmp(ia, ib, na * sizeof *ia), "%s: encodings differ", what);
        base_free(ia);
        base_free(ib);
    }
    tok_close(a);
    tok_close(b);
    base_free(esc);
}

TEST(tok_hf_escaped) {
    char dir[1100], err[512], p[1200];
    snprintf(dir, sizeof dir, "%s/jcur_ds", t_tmpdir);
    base_mkdir_p(dir, NULL, 0);
    CHECK_MSG(gen_tok_write_hf(dir, 2048, GEN_DS_V3, err, sizeof err) == 0, "%s", err);
    snprintf(p, sizeof p, "%s/tokenizer.json", dir);
    uint8_t *js = NULL;
    size_t n = 0;
    CHECK_MSG(base_read_file(p, 64u << 20, &js, &n, err, sizeof err) == 0, "%s", err);
    if (!js) return;
    char *z = base_alloc(n + 1, MEM_MISC);
    memcpy(z, js, n);
    z[n] = 0;
    same_tokenizer(z, "deepseek-style");
    base_free(z);
    base_free(js);
}
