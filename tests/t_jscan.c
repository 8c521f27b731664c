/*
 * t_jscan.c: reading a JSON member in place (src/base/jscan.c) against jansson,
 * and the tokenizer.json reader that uses it (tok_hf.c).
 *   jscan_strings   strings and numbers decode as jansson decodes them (escapes,
 *                   surrogate pairs, \u0000, UTF-8 of every length) and are
 *                   refused where jansson refuses them (lone surrogates,
 *                   overlong and invalid UTF-8, control bytes, bad escapes,
 *                   number grammar); jscan_member finds escaped keys; jscan_blank
 *                   keeps the line numbers.
 *   tok_hf_escaped  a tokenizer.json with every character of every string
 *                   written as a \u escape (keys "model", "vocab", "merges"
 *                   included) loads to the same tokenizer: same ids for a text,
 *                   same bytes for every id, for the small test file and the
 *                   generated DeepSeek-style one.
 */
#include <string.h>
#include "gen.h"
#include "jscan.h"
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

TEST(jscan_strings) {
    static const char *const lits[] = {
        "\"plain\"", "\"\\u0120a\"", "\"\\\"\\\\\\/\\b\\f\\n\\r\\t\"", "\"\\ud83d\\ude00\"", "\"a\\u0000b\"",
        "\"\xc4\xa0\xe4\xb8\xad\xf0\x9f\x98\x80\"", "\"\\uD83D\\uDE00x\"", "\"\"",
        /* refused */
        "\"\\ud800\"", "\"\\udc00\"", "\"\\ud800\\u0041\"", "\"\xc0\xaf\"", "\"\xed\xa0\x80\"", "\"\xf4\x90\x80\x80\"",
        "\"\xe4\xb8\"", "\"a\tb\"", "\"\\x41\"", "\"\\u12G4\"", "\"unterminated", "\"\\",
    };
    for (size_t i = 0; i < sizeof lits / sizeof lits[0]; i++) {
        uint8_t a[64], b[64];
        size_t an = 0, bn = 0;
        int ja = jansson_string(lits[i], a, &an);
        jscan s = {.p = (const uint8_t *)lits[i], .end = (const uint8_t *)lits[i] + strlen(lits[i]),
                   .doc = (const uint8_t *)lits[i]};
        int jb = jscan_string(&s, b, sizeof b, &bn);
        CHECK_MSG(ja == jb && (ja || (an == bn && !memcmp(a, b, an))), "%s: jansson %d (%zu), jscan %d (%zu) %s", lits[i],
                  ja, an, jb, bn, jb ? s.why : "");
        CHECK(!jb || s.why);
    }
    /* a string longer than the buffer: the full length, the buffer's worth written */
    {
        const char *lit = "\"abcdefgh\"";
        uint8_t b[4];
        size_t n = 0;
        jscan s = {.p = (const uint8_t *)lit, .end = (const uint8_t *)lit + strlen(lit), .doc = (const uint8_t *)lit};
        CHECK(jscan_string(&s, b, sizeof b, &n) == 0 && n == 8 && !memcmp(b, "abcd", 4));
    }
    static const struct { const char *num; int rc; int64_t v; } nums[] = {
        {"0", 0, 0}, {"-0", 0, 0}, {"123", 0, 123}, {"5.0", 0, 5}, {"1e3", 0, 1000}, {"2E+1", 0, 20},
        {"-7", 0, -7}, {"1.5", 1, 0}, {"1e300", 1, 0}, {"99999999999999999999999", 1, 0},
        {"01", -1, 0}, {"1.", -1, 0}, {".5", -1, 0}, {"-", -1, 0}, {"1e", -1, 0}, {"1x", -1, 0}, {"true", -1, 0},
    };
    for (size_t i = 0; i < sizeof nums / sizeof nums[0]; i++) {
        jscan s = {.p = (const uint8_t *)nums[i].num, .end = (const uint8_t *)nums[i].num + strlen(nums[i].num)};
        s.doc = s.p;
        int64_t v = -99;
        int rc = jscan_int(&s, &v);
        CHECK_MSG(rc == nums[i].rc && (rc || v == nums[i].v), "%s: %d %lld", nums[i].num, rc, (long long)v);
    }
    /* members: escaped keys match, nested values are passed over whole */
    const char *doc = "{\"a\": [1, {\"model\": 2}], \"m\\u006fdel\" :\n {\"x\": \"}\\\"]\"},\n \"z\": 0}";
    size_t off = 0, n = 0;
    CHECK(jscan_member((const uint8_t *)doc, strlen(doc), "model", &off, &n) == 0 &&
          n == strlen("{\"x\": \"}\\\"]\"}") && doc[off] == '{');
    CHECK(jscan_member((const uint8_t *)doc, strlen(doc), "q", &off, &n) == -1);
    CHECK(jscan_member((const uint8_t *)"{\"a\": [", 7, "b", &off, &n) == -1);
    char blank[] = "{\n \"k\": [1,\n2]}";
    jscan_blank((uint8_t *)blank, strlen(blank));
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
    snprintf(dir, sizeof dir, "%s/jscan_ds", t_tmpdir);
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
