/*
 * t_toolgram.c: the grammar of forced tool calls (src/text/toolgram.c) in each
 * format family: what the renderer writes for well-formed calls (after the
 * prefill) is a whole document; undeclared names, missing required or unknown
 * arguments, wrong types, enum values outside the enum, a second call when
 * only one is allowed are not; strict tools with schemas that cannot be
 * enforced are errors naming the tool, the others take any JSON object. Also
 * the composition nodes (SEQ, KEYED, RAW) on their own.
 */
#include <string.h>
#include "base.h"
#include "jgram.h"
#include "test.h"
#include "toolgram.h"
#include "tools.h"

/* Markers as special tokens: the ids of a small table (unknown: text). */
static const char *const k_markers[] = {"<|open|>", "<|close|>", "<|sep|>", "<|tool_calls_section_begin|>",
                                        "<|tool_calls_section_end|>", "<|tool_call_begin|>", "<|tool_call_argument_begin|>",
                                        "<|tool_call_end|>", "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>",
                                        "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>"};

static int32_t special(void *ud, const char *m, size_t n) {
    if (ud) return -1; /* a tokenizer without special markers */
    for (size_t i = 0; i < sizeof k_markers / sizeof *k_markers; i++)
        if (strlen(k_markers[i]) == n && !memcmp(k_markers[i], m, n)) return 1000 + (int32_t)i;
    return -1;
}

typedef struct { struct { char s[8192]; size_t len; } b; int plain; } sinkst;

static void put(sinkst *k, const void *p, size_t n) {
    if (k->b.len + n > sizeof k->b.s) n = 0;
    memcpy(k->b.s + k->b.len, p, n);
    k->b.len += n;
}

static void sink(void *ud, const char *s, size_t n, int sp) {
    sinkst *k = ud;
    const int32_t id = sp ? special(k->plain ? k : NULL, s, n) : -1;
    if (id < 0) { put(k, s, n); return; }
    uint8_t b[JG_SPECIAL_LEN];
    jgram_special_bytes(id, b);
    put(k, b, sizeof b);
}

static const chat_tool k_tools[] = {
    {"get_weather", NULL,
     "{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\",\"maxLength\":12},\"days\":{\"type\":\"integer\"},"
     "\"units\":{\"enum\":[\"C\",\"F\",null]}},\"required\":[\"city\"],\"additionalProperties\":false}", 1},
    {"get_time", NULL, "{\"type\":\"object\",\"properties\":{\"tz\":{\"enum\":[\"UTC\",\"CET\"]}}}", 1},
    {"get", NULL, NULL, 0},
};

/* jgram_check of the calls rendered after the prefill: 1, 0 or -1. */
static int check_calls(int fmt, const chat_tools *tools, const chat_call *calls, size_t n, int plain) {
    char err[256];
    sinkst pre = {.plain = plain}, all = {.plain = plain};
    jgram *g = NULL;
    CHECK_MSG(tools_grammar(&g, fmt, tools, 0, special, plain ? &pre : NULL, err, sizeof err) == 0, "%s", err);
    CHECK(tools_emit_prefill(fmt, tools, 0, sink, &pre) == 0);
    CHECK(tools_emit_calls(fmt, calls, n, 0, sink, &all) == 0);
    int r = -2;
    if (g && all.b.len >= pre.b.len && !memcmp(all.b.s, pre.b.s, pre.b.len))
        r = jgram_check(g, (const uint8_t *)all.b.s + pre.b.len, all.b.len - pre.b.len);
    jgram_free(g);
    return r;
}

TEST(toolgram_forced) {
    const chat_tools req = {k_tools, 3, CHAT_TOOLS_REQUIRED, NULL, 1}, one = {k_tools, 3, CHAT_TOOLS_REQUIRED, NULL, 0},
                     named = {k_tools, 3, CHAT_TOOLS_NAMED, "get_time", 1};
    const chat_call good[] = {{"get_weather", "{\"city\":\"Paris \\\"16e\\\"\",\"days\":2,\"units\":null}"},
                              {"get_time", "{\"tz\":\"CET\"}"}, {"get", "{}"}, {"get_weather", "{\"city\":\"Oslo\"}"}};
    static const char *const bad_args[] = {"{\"days\":2}", "{\"city\":\"Paris\",\"x\":1}", "{\"city\":3}",
                                           "{\"city\":\"Paris\",\"units\":\"K\"}", "{\"city\":\"a very long city name\"}",
                                           "{\"days\":2,\"city\":\"Paris\"}"};
    for (int plain = 0; plain < 2; plain++)
        for (int fmt = plain; fmt < 3; fmt++) { /* XTML without special markers: the JSON block (below) */
            CHECK_MSG(check_calls(fmt, &req, good, 4, plain) == 1, "fmt %d plain %d: four calls", fmt, plain);
            CHECK_MSG(check_calls(fmt, &one, good + 1, 1, plain) == 1, "fmt %d plain %d: one call", fmt, plain);
            CHECK_MSG(check_calls(fmt, &one, good, 2, plain) == -1, "fmt %d plain %d: a second call", fmt, plain);
            CHECK_MSG(check_calls(fmt, &named, good + 1, 1, plain) == 1, "fmt %d plain %d: named", fmt, plain);
            const chat_call wrong_tz = {"get_time", "{\"tz\":\"PST\"}"}, undeclared = {"get_weathe", "{}"};
            CHECK_MSG(check_calls(fmt, &named, &wrong_tz, 1, plain) == -1, "fmt %d plain %d: enum", fmt, plain);
            CHECK_MSG(check_calls(fmt, &req, &undeclared, 1, plain) == -1, "fmt %d plain %d: undeclared", fmt, plain);
            for (size_t i = 0; i < sizeof bad_args / sizeof *bad_args; i++) {
                const chat_call c = {"get_weather", bad_args[i]};
                CHECK_MSG(check_calls(fmt, &req, &c, 1, plain) == -1, "fmt %d plain %d: %s", fmt, plain, bad_args[i]);
            }
        }
}

/* Regression: a tool whose parameters need DFA tables (pattern, format, integer
 * bounds) composes into the call grammar with its tables (jgram_append copied
 * the nodes but not the tables: a forced call read another table or none). */
TEST(toolgram_pattern_params) {
    static const chat_tool t[] = {
        {"book", NULL,
         "{\"type\":\"object\",\"properties\":{\"day\":{\"type\":\"string\",\"format\":\"date\"},"
         "\"code\":{\"type\":\"string\",\"pattern\":\"^[A-Z]{2}-[0-9]{3}$\"},\"n\":{\"type\":\"integer\",\"minimum\":1,"
         "\"maximum\":9}},\"required\":[\"day\",\"code\",\"n\"],\"additionalProperties\":false}", 1}};
    const chat_tools req = {t, 1, CHAT_TOOLS_REQUIRED, NULL, 0};
    const chat_call good = {"book", "{\"day\":\"2026-12-07\",\"code\":\"AB-123\",\"n\":7}"};
    static const char *const bad[] = {"{\"day\":\"2026-13-07\",\"code\":\"AB-123\",\"n\":7}",
                                      "{\"day\":\"2026-12-07\",\"code\":\"ab-123\",\"n\":7}",
                                      "{\"day\":\"2026-12-07\",\"code\":\"AB-123\",\"n\":10}"};
    for (int fmt = 1; fmt < 3; fmt++) {
        CHECK_MSG(check_calls(fmt, &req, &good, 1, 0) == 1, "fmt %d: a valid call", fmt);
        for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
            const chat_call c = {"book", bad[i]};
            CHECK_MSG(check_calls(fmt, &req, &c, 1, 0) == -1, "fmt %d: %s", fmt, bad[i]);
        }
    }
    /* XTML: a pattern string has no raw (typed) form, so the call is the JSON block
     * (markers as text here, as toolgram_strict's) */
    char err[256];
    jgram *g = NULL;
    sinkst plain = {.plain = 1};
    CHECK_MSG(tools_grammar(&g, CHAT_FMT_XTML, &req, 0, special, &plain, err, sizeof err) == 0 && g, "%s", err);
    for (int i = 0; i < 2 && g; i++) {
        char x[512];
        snprintf(x, sizeof x, "book\" index=\"1\"<|sep|><|open|>arguments type=\"json\"<|sep|>%s<|close|>arguments<|sep|>"
                 "<|close|>call<|sep|><|close|>tools<|sep|>", i ? bad[0] : good.args);
        CHECK_MSG(jgram_check(g, (const uint8_t *)x, strlen(x)) == (i ? -1 : 1), "XTML: %s", x);
    }
    jgram_free(g);
}

TEST(toolgram_strict) {
    char err[256];
    const chat_tool t[] = {{"f", NULL, "{\"type\":\"object\",\"properties\":{\"s\":{\"type\":\"string\",\"pattern\":\"^a\",\"x-foo\":1}}}", 1}};
    chat_tool lax = t[0];
    lax.strict = 0;
    const chat_tools strict = {t, 1, CHAT_TOOLS_REQUIRED, NULL, 1}, loose = {&lax, 1, CHAT_TOOLS_REQUIRED, NULL, 1};
    jgram *g = NULL;
    CHECK(tools_grammar(&g, CHAT_FMT_K2, &strict, 0, special, NULL, err, sizeof err) == STRATA_EINVAL);
    CHECK_MSG(strstr(err, "'f'") && strstr(err, "strict"), "%s", err);
    CHECK(!g);
    /* not strict: any object (XTML: in the JSON block, a free-form object having no typed form) */
    for (int fmt = 1; fmt < 3; fmt++) {
        const chat_call c = {"f", "{\"s\":\"b\",\"n\":[1,2]}"};
        CHECK_MSG(check_calls(fmt, &loose, &c, 1, 0) == 1, "fmt %d", fmt);
    }
    sinkst plain = {.plain = 1};
    CHECK(tools_grammar(&g, CHAT_FMT_XTML, &loose, 0, special, &plain, err, sizeof err) == 0 && g);
    static const char xtml[] = "f\" index=\"1\"<|sep|><|open|>arguments type=\"json\"<|sep|>{\"s\":\"b\",\"n\":[1,2]}"
                               "<|close|>arguments<|sep|><|close|>call<|sep|><|close|>tools<|sep|>";
    if (g) CHECK(jgram_check(g, (const uint8_t *)xtml, sizeof xtml - 1) == 1);
    jgram_free(g);
    g = NULL;
    /* auto and none: no grammar */
    const chat_tools au = {t, 1, CHAT_TOOLS_AUTO, NULL, 1};
    CHECK(tools_grammar(&g, CHAT_FMT_K2, &au, 0, special, NULL, err, sizeof err) == 0 && !g);
}

/* SEQ, KEYED and RAW alone: raw text ends at a special lead; keys pick their node. */
TEST(toolgram_nodes) {
    jgram *g = jgram_new();
    CHECK(g);
    const uint8_t sp[4] = {JG_SPECIAL_LEAD, 0, 0, 7};
    const int32_t raw = jgram_add_raw(g, 1, 3), end = jgram_add_lit(g, sp, 4), num = jgram_add_lit(g, (const uint8_t *)"1", 1);
    const int32_t kids[2] = {raw, end};
    const int32_t seq = jgram_add_seq(g, kids, 2);
    const uint8_t *keys[] = {(const uint8_t *)"a:", (const uint8_t *)"b:"};
    const size_t lens[] = {2, 2};
    const int32_t nodes[] = {seq, num};
    CHECK(jgram_add_keyed(g, keys, lens, nodes, 2) >= 0);
    g->root = g->n_nodes - 1;
    CHECK(jgram_check(g, (const uint8_t *)"a:x\"\\\xFF\x00\x00\x07", 9) == 1);
    CHECK(jgram_check(g, (const uint8_t *)"a:\xFF\x00\x00\x07", 6) == -1); /* min 1 */
    CHECK(jgram_check(g, (const uint8_t *)"a:abcd", 6) == -1);              /* max 3 */
    CHECK(jgram_check(g, (const uint8_t *)"b:1", 3) == 1);
    CHECK(jgram_check(g, (const uint8_t *)"c:", 2) == -1);
    const uint8_t *dup[] = {(const uint8_t *)"a", (const uint8_t *)"ab"};
    const size_t dl[] = {1, 2};
    CHECK(jgram_add_keyed(g, dup, dl, nodes, 2) == -1); /* not prefix-free */
    jgram_free(g);
}
