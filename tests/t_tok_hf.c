/*
 * t_tok_hf.c: the Hugging Face tokenizer.json byte-level BPE (tok_hf.c).
 *   tok_hf_small    tokenizer.json files written by the test: merge-rank BPE (not
 *                   tiktoken's "any pair whose concatenation is a token"),
 *                   ignore_merges, both merge spellings, Isolated splits, added
 *                   tokens (special or not, lstrip/rstrip, the not-normalized ones
 *                   first), BOS, decode, invalid UTF-8 roundtrip.
 *   tok_hf_hostile  malformed and unsupported files: an error naming the file and
 *                   the JSON path (a syntax error anywhere, model.vocab and
 *                   model.merges included, with jansson's line and column),
 *                   `strata tokenize` exits 1.
 *   tok_hf_dir      tok_open_dir: tiktoken.model wins over tokenizer.json.
 *   tok_hf_oracle   the generated DeepSeek-style tokenizer.json: ids byte-exact
 *                   against @huggingface/tokenizers (pure JS, a second
 *                   implementation) on the tokenizer corpus (tests/tok/
 *                   gen_corpus.mjs) and DeepSeek-specific cases; BOS as
 *                   encode(add_special_tokens=True). Needs node + npm.
 */
#include <stdlib.h>
#include <string.h>
#include "gen.h"
#include "jsonx.h"
#include "strata.h"
#include "test.h"
#include "tok.h"

/* A JSON string of bytes s through the alphabet. */
static void bl_str(sbuf *b, const char *s) {
    sbuf_printf(b, "\"");
    for (; *s; s++) {
        char c[2];
        size_t n = gen_bytelevel_char((uint8_t)*s, c);
        if (n == 1 && (c[0] == '"' || c[0] == '\\')) sbuf_printf(b, "\\%c", c[0]);
        else sbuf_printf(b, "%.*s", (int)n, c);
    }
    sbuf_printf(b, "\"");
}

/* tokenizer.json: the 256 bytes at ids 0..255, extra tokens from 256, merges
 * (each "a|b"), added tokens (raw JSON array body), a pre_tokenizer (raw JSON)
 * and model options (raw JSON members, may be ""). */
static char *small_json(const char *const *extra, const char *const *merges, int pair_form, const char *added,
                        const char *pretok, const char *model_opts) {
    sbuf b = {0};
    sbuf_printf(&b, "{\"version\": \"1.0\", \"truncation\": null, \"padding\": null, \"added_tokens\": [%s],"
                    " \"normalizer\": null, \"pre_tokenizer\": %s,"
                    " \"post_processor\": {\"type\": \"TemplateProcessing\", \"single\": [{\"SpecialToken\": {\"id\": "
                    "\"<s>\", \"type_id\": 0}}, {\"Sequence\": {\"id\": \"A\", \"type_id\": 0}}], \"special_tokens\": "
                    "{\"<s>\": {\"id\": \"<s>\", \"ids\": [400], \"tokens\": [\"<s>\"]}}},"
                    " \"decoder\": {\"type\": \"ByteLevel\"}, \"model\": {\"type\": \"BPE\"%s, \"vocab\": {",
                added, pretok, model_opts);
    for (int i = 0; i < 256; i++) {
        char c[3] = {0};
        c[0] = (char)i;
        if (i == 0) { sbuf_printf(&b, "\"\\u0100\": 0"); continue; } /* byte 0 -> U+0100 */
        sbuf_printf(&b, ", ");
        bl_str(&b, c);
        sbuf_printf(&b, ": %d", i);
    }
    for (int i = 0; extra[i]; i++) {
        sbuf_printf(&b, ", ");
        bl_str(&b, extra[i]);
        sbuf_printf(&b, ": %d", 256 + i);
    }
    sbuf_printf(&b, "}, \"merges\": [");
    for (int i = 0; merges[i]; i++) {
        const char *sp = strchr(merges[i], '|');
        char a[64];
        snprintf(a, sizeof a, "%.*s", (int)(sp - merges[i]), merges[i]);
        sbuf_printf(&b, "%s", i ? ", " : "");
        if (pair_form) {
            sbuf_printf(&b, "[");
            bl_str(&b, a);
            sbuf_printf(&b, ", ");
            bl_str(&b, sp + 1);
            sbuf_printf(&b, "]");
        } else {
            sbuf tmp = {0};
            bl_str(&tmp, a);
            tmp.s[tmp.len - 1] = 0;
            sbuf_printf(&b, "%s ", tmp.s);
            sbuf_free(&tmp);
            bl_str(&tmp, sp + 1);
            sbuf_printf(&b, "%s", tmp.s + 1);
            sbuf_free(&tmp);
        }
    }
    sbuf_printf(&b, "]}}");
    return b.s;
}

static const char k_pretok[] = "{\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Split\", \"pattern\": "
                               "{\"Regex\": \" ?[a-z]+|\\\\s+\"}, \"behavior\": \"Isolated\", \"invert\": false}, "
                               "{\"type\": \"ByteLevel\", \"add_prefix_space\": false, \"use_regex\": false}]}";

static tok *open_small(const char *json, const char *config, char *err, size_t errlen) {
    tok *t = NULL;
    int rc = tok_open_hf_mem(&t, (const uint8_t *)json, strlen(json), "small.json", (const uint8_t *)config,
                             config ? strlen(config) : 0, "small_config.json", NULL, err, errlen);
    return rc ? NULL : t;
}

/* Encodes s and compares with the ids listed in want (-1 ends). */
static void expect(tok *t, const char *s, int allow, const int32_t *want, const char *what) {
    int32_t *ids;
    size_t n, nw = 0;
    while (want[nw] >= 0) nw++;
    CHECK(tok_encode(t, (const uint8_t *)s, strlen(s), allow, &ids, &n) == 0);
    int same = n == nw;
    for (size_t i = 0; same && i < n; i++) same = ids[i] == want[i];
    sbuf g = {0};
    for (size_t i = 0; i < n; i++) sbuf_printf(&g, "%s%d", i ? "," : "", ids[i]);
    CHECK_MSG(same, "%s: \"%s\" -> [%s]", what, s, g.s ? g.s : "");
    sbuf_free(&g);
    base_free(ids);
}

TEST(tok_hf_small) {
    char err[512];
    /* ab=256 bc=257 abc=258; the merges rank b+c before a+b and never list ab+c */
    const char *extra[] = {"ab", "bc", "abc", " a", NULL};
    const char *merges[] = {"b|c", "a|b", " |a", NULL};
    const char *added = "{\"id\": 300, \"content\": \"<x>\", \"special\": true, \"lstrip\": true, \"normalized\": false},"
                        "{\"id\": 301, \"content\": \"[y]\", \"special\": false, \"rstrip\": true, \"normalized\": false},"
                        "{\"id\": 302, \"content\": \"xy\", \"special\": false, \"normalized\": true},"
                        "{\"id\": 303, \"content\": \"yz\", \"special\": false, \"normalized\": false},"
                        "{\"id\": 400, \"content\": \"<s>\", \"special\": true, \"normalized\": false}";
    for (int form = 0; form < 2; form++) {
        char *js = small_json(extra, merges, form, added, k_pretok, "");
        tok *t = open_small(js, NULL, err, sizeof err);
        CHECK_MSG(t != NULL, "%s", err);
        base_free(js);
        if (!t) continue;
        CHECK(tok_pattern(t) == TOK_PAT_HF);
        CHECK(tok_bos_id(t) == 400);
        /* merge ranks, not concatenations: a|bc (b+c ranks first), never abc */
        expect(t, "abc", 0, (int32_t[]){'a', 257, -1}, "merge rank");
        expect(t, "ab", 0, (int32_t[]){256, -1}, "merge");
        /* the split cuts " a" + "bc" apart; " a" merges (its own rule) */
        expect(t, "x abc", 0, (int32_t[]){'x', 259, 257, -1}, "split then merges");
        /* added tokens: <x> only with allow_special, taking the spaces before it;
         * [y] always, taking the spaces after it */
        expect(t, "a  <x>b", 1, (int32_t[]){'a', 300, 'b', -1}, "lstrip special");
        expect(t, "[y]   b", 0, (int32_t[]){301, 'b', -1}, "rstrip plain");
        expect(t, "a<x>", 0, (int32_t[]){'a', '<', 'x', '>', -1}, "special as text");
        /* yz (not normalized) is matched before xy (normalized) */
        expect(t, "xyz", 0, (int32_t[]){'x', 303, -1}, "not-normalized first");
        /* decode: bytes, added tokens as their text */
        int32_t ids[] = {'a', 257, 300, 301};
        uint8_t *out;
        size_t len;
        CHECK(tok_decode(t, ids, 4, &out, &len) == 0 && len == 9 && !memcmp(out, "abc<x>[y]", 9));
        base_free(out);
        /* invalid UTF-8 encodes byte by byte and decodes back */
        const char bad[] = "ab\xff\xc3(bc\xe4\xb8";
        int32_t *bi;
        size_t bn;
        CHECK(tok_encode(t, (const uint8_t *)bad, sizeof bad - 1, 1, &bi, &bn) == 0);
        CHECK(tok_decode(t, bi, bn, &out, &len) == 0 && len == sizeof bad - 1 && !memcmp(out, bad, len));
        base_free(out);
        base_free(bi);
        tok_close(t);
    }
    /* ignore_merges: a piece that is a token is taken whole */
    char *js = small_json(extra, merges, 0, "{\"id\": 400, \"content\": \"<s>\", \"special\": true}", k_pretok,
                          ", \"ignore_merges\": true");
    tok *t = open_small(js, "{\"add_bos_token\": false, \"chat_template\": \"{{ bos_token }}\"}", err, sizeof err);
    CHECK_MSG(t != NULL, "%s", err);
    base_free(js);
    if (t) {
        expect(t, "abc", 0, (int32_t[]){258, -1}, "ignore_merges");
        CHECK(tok_bos_id(t) == -1); /* add_bos_token false */
        CHECK(tok_chat_template(t) && !strcmp(tok_chat_template(t), "{{ bos_token }}"));
        tok_close(t);
    }
}

/* Opens json and checks the error names small.json and each of the words. */
static void hostile(const char *json, const char *w1, const char *w2) {
    char err[512] = "";
    tok *t = open_small(json, NULL, err, sizeof err);
    CHECK_MSG(t == NULL, "accepted: %.200s", json);
    tok_close(t);
    CHECK_MSG(strstr(err, "small.json") && strstr(err, w1) && (!w2 || strstr(err, w2)), "message '%s' lacks %s / %s",
              err, w1, w2 ? w2 : "");
}

TEST(tok_hf_hostile) {
    const char *extra[] = {"ab", NULL}, *merges[] = {"a|b", NULL};
    char *good = small_json(extra, merges, 0, "", k_pretok, "");
    size_t gl = strlen(good);
    /* truncated anywhere: a JSON error or a missing member, never a crash */
    for (size_t cut = 0; cut < gl; cut += gl / 97 + 1) {
        char *tr = base_strdup(good, MEM_MISC);
        tr[cut] = 0;
        char err[512] = "";
        tok *t = open_small(tr, NULL, err, sizeof err);
        CHECK_MSG(!t && strstr(err, "small.json"), "cut at %zu: '%s'", cut, err);
        tok_close(t);
        base_free(tr);
    }
    base_free(good);
    struct { const char *from, *to, *w1, *w2; } cases[] = {
        {"\"vocab\": {", "\"vocab\": [], \"x\": {", "model.vocab", "not an object"},
        {"\"merges\": [", "\"merges\": [5, ", "model.merges[0]", "neither"},
        {"\"merges\": [", "\"merges\": [\"a\", ", "model.merges[0]", NULL},
        {"\"merges\": [", "\"merges\": [\"zz q\", ", "model.merges[0]", "not in model.vocab"},
        {"\"normalizer\": null", "\"normalizer\": {\"type\": \"NFC\"}", "normalizer", "only null"},
        {"\"Isolated\"", "\"Removed\"", "pre_tokenizer.pretokenizers[0].behavior", "Isolated"},
        {"\"invert\": false", "\"invert\": true", "pre_tokenizer.pretokenizers[0].invert", NULL},
        {"\"Regex\": \" ?", "\"Regex\": \"( ?", "pre_tokenizer.pretokenizers[0].pattern.Regex", "does not compile"},
        {"\"use_regex\": false", "\"use_regex\": false, \"add_prefix_space\": true", "add_prefix_space", NULL},
        {"\"type\": \"BPE\"", "\"type\": \"WordPiece\"", "model.type", NULL},
        {"\"type\": \"BPE\"", "\"type\": \"BPE\", \"dropout\": 0.1", "model.dropout", NULL},
        {"\"added_tokens\": [", "\"added_tokens\": [{\"id\": 300, \"content\": \"q\", \"single_word\": true}",
         "added_tokens[0]", "single_word"},
        {"\"added_tokens\": [", "\"added_tokens\": [{\"id\": \"300\", \"content\": \"q\"}", "added_tokens[0]", "id"},
        {"\"added_tokens\": [", "\"added_tokens\": [{\"id\": 5, \"content\": \"qq\"}", "added_tokens[0]", "different"},
        {"\"vocab\": {", "\"vocab\": {\"zz\": 1e12, ", "model.vocab[\"zz\"]", "not an id"},
        {"\"vocab\": {", "\"vocab\": {\"zz\": 97, ", "model.vocab", "id another token has"},
        /* read in place (jcur.h): what jansson refused is still refused, as jansson says it */
        {"\"vocab\": {", "\"vocab\": {\"zz\" 5, ", "invalid JSON at line 1", "expected"},
        {"\"vocab\": {", "\"vocab\": {\"\\u20acx\": 300, \"\\u20acx\": 301, ", "model.vocab[", "appears twice"},
        {"\"vocab\": {", "\"vocab\": {\"\\ud800\": 300, ", "invalid JSON at line 1", "Unicode"},
        {"\"vocab\": {", "\"vocab\": {\"zz\": \"5\", ", "model.vocab[\"zz\"]", "not an id"},
        {"\"vocab\": {", "\"vocab\": {\"zz\": 01, ", "invalid JSON at line 1", NULL},
        {"\"merges\": [", "\"merges\": [[\"a\" \"b\"], ", "invalid JSON at line 1", "expected"},
        {"\"merges\": [", "\"merges\": [\"a b\" \"c d\", ", "invalid JSON at line 1", "expected"},
        {"\"merges\": [", "\"merges\": [[\"a\", \"b\", \"c\"], ", "model.merges[0]", "neither"},
        {"\"merges\": [", "\"vocab\": {}, \"merges\": [", "duplicate", NULL},
        {"\"truncation\": null", "\"truncation\": {\"max_length\": 5}", "truncation", NULL},
        {"\"ids\": [400]", "\"ids\": [99999]", "special_tokens[\"<s>\"].ids", NULL},
        {"\"pre_tokenizer\": {", "\"pre_tokenizer\": {\"type\": \"Whitespace\"}, \"x\": {", "pre_tokenizer.type", NULL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *js = small_json(extra, merges, 0, "", k_pretok, "");
        char *at = strstr(js, cases[i].from);
        CHECK_MSG(at != NULL, "case %zu: '%s' not in the file", i, cases[i].from);
        if (!at) { base_free(js); continue; }
        sbuf b = {0};
        sbuf_printf(&b, "%.*s%s%s", (int)(at - js), js, cases[i].to, at + strlen(cases[i].from));
        hostile(b.s, cases[i].w1, cases[i].w2);
        sbuf_free(&b);
        base_free(js);
    }
    /* a byte with no token: some text could not be encoded */
    {
        char *js = small_json(extra, merges, 0, "", k_pretok, "");
        char *at = strstr(js, ", \"~\": 126");
        CHECK(at != NULL);
        if (at) {
            memmove(at, at + 10, strlen(at + 10) + 1);
            hostile(js, "byte 0x7e", NULL);
        }
        base_free(js);
    }
    /* a token longer than any real one (2 MB) */
    {
        sbuf b = {0};
        sbuf_printf(&b, "{\"model\": {\"vocab\": {\"");
        for (int i = 0; i < (1 << 21); i++) sbuf_printf(&b, "a");
        sbuf_printf(&b, "\": 0}, \"merges\": []}}");
        hostile(b.s, "model.vocab", "too long");
        sbuf_free(&b);
    }
    /* the CLI: exit 1 and the message on stderr */
    char *js = small_json(extra, merges, 0, "", k_pretok, "");
    char *at = strstr(js, "\"Isolated\"");
    memcpy(at, "\"Removed\" ", 10);
    const char *p = t_write("hostile_tokenizer.json", js, strlen(js));
    base_free(js);
    char cmd[1400], *out = NULL;
    snprintf(cmd, sizeof cmd, "echo hi | %s tokenize --vocab %s", t_strata(), p);
    int rc = t_run(cmd, &out);
    CHECK_MSG(rc == 1 && out && strstr(out, "hostile_tokenizer.json") && strstr(out, "behavior"), "rc %d: %s", rc,
              out ? out : "");
    base_free(out);
}

TEST(tok_hf_dir) {
    char dir[1100], err[512];
    snprintf(dir, sizeof dir, "%s/tokhf_dir", t_tmpdir);
    base_mkdir_p(dir, NULL, 0);
    CHECK_MSG(gen_tok_write_hf(dir, 1024, GEN_DS_V3, err, sizeof err) == 0, "%s", err);
    tok *t = NULL;
    CHECK_MSG(tok_open_dir(&t, dir, NULL, err, sizeof err) == 0, "%s", err);
    CHECK(t && tok_pattern(t) == TOK_PAT_HF && tok_bos_id(t) == 0 && tok_n_vocab(t) == 1024 - 8);
    CHECK(t && tok_special_id(t, "<｜User｜>") == 1024 - 8 - 17 + 5);
    tok_close(t);
    /* a tiktoken.model beside it wins */
    char p[1200];
    snprintf(p, sizeof p, "%s/tiktoken.model", dir);
    sbuf b = {0};
    for (int i = 0; i < 256; i++) {
        static const char c[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
        sbuf_printf(&b, "%c%c== %d\n", c[i >> 2], c[(i & 3) << 4], i);
    }
    CHECK(base_write_file_atomic(p, b.s, b.len, err, sizeof err) == 0);
    sbuf_free(&b);
    snprintf(p, sizeof p, "%s/tokenizer_config.json", dir);
    CHECK(base_write_file_atomic(p, "{}", 2, err, sizeof err) == 0);
    CHECK_MSG(tok_open_dir(&t, dir, NULL, err, sizeof err) == 0, "%s", err);
    CHECK(t && tok_pattern(t) == TOK_PAT_KIMI);
    tok_close(t);
    snprintf(dir, sizeof dir, "%s/tokhf_none", t_tmpdir);
    base_mkdir_p(dir, NULL, 0);
    CHECK(tok_open_dir(&t, dir, NULL, err, sizeof err) == STRATA_EIO && strstr(err, "tokenizer.json"));
}

/* DeepSeek-specific cases beyond the shared corpus (one JSON string per line). */
static const char *const k_cases[] = {
    "中文分词测试，我们在这里。日本語のテキストとカタカナ、ひらがな。한국어 텍스트",
    "1234567890 12 123 1234 3.14159 1,000,000 2024-08-07 ０１２３",
    "!!!??? ... --- === +++ ((([[[{{{ }}}]]]))) \"quoted\" 'single' `back` ~~~ @@@ ### $$$ %%% ^^^ &&& ***",
    "a\nb\r\nc\n\n\nd\r\r\n \n  \n\t\n",
    "     spaces     and\t\ttabs\t \t  end   ",
    "emoji 😀😃😄 👨‍👩‍👧‍👦 🇫🇷🇯🇵 ❤️ ✅ 🤖x🤖",
    "mixed中文English123日本語abc!中!",
    "<｜begin▁of▁sentence｜>system<｜User｜>hi<｜Assistant｜><think>\nhmm</think>answer<｜end▁of▁sentence｜>",
    "text<think>in the middle</think>of words and <｜tool▁sep｜> markers",
    "\xef\xbf\xbd replacement chars \xef\xbf\xbd\xef\xbf\xbd stand in for invalid bytes",
    "!Abc ,Hello .world ;x :y ?Z (paren) [bracket] {brace} _under -dash",
    "Ⅻ ½ ² ٣ ߀ mixed numerals ௰ 〇 六",
    "",
    NULL,
};

TEST(tok_hf_oracle) {
    char dir[1100], err[512], cmd[16384], *out = NULL;
    snprintf(dir, sizeof dir, "%s/tokhf_oracle", t_tmpdir);
    base_mkdir_p(dir, NULL, 0);
    if (t_run("node --version", &out) != 0) {
        CHECK_MSG(0, "node not found (needed for the tokenizer.json oracle): %s", out);
        base_free(out);
        return;
    }
    base_free(out);
    if (!base_is_dir("tests/tok/node_modules/@huggingface/tokenizers")) {
        int rc = t_run("npm ci --prefix tests/tok --no-audit --no-fund --loglevel=error", &out);
        CHECK_MSG(rc == 0, "npm ci --prefix tests/tok failed (registry unreachable?): %s", out);
        base_free(out);
        if (rc) return;
    }
    CHECK_MSG(gen_tok_write_hf(dir, 8192, GEN_DS_R1, err, sizeof err) == 0, "%s", err);
    jsonx_build_begin(); /* jansson allocates through base_alloc from here on */
    sbuf c = {0};
    for (int i = 0; k_cases[i]; i++) {
        json_t *s = json_stringn(k_cases[i], strlen(k_cases[i]));
        char *d = json_dumps(s, JSON_ENCODE_ANY);
        sbuf_printf(&c, "%s\n", d);
        base_free(d);
        json_decref(s);
    }
    const char *cases = t_write("tokhf_cases.jsonl", c.s, c.len);
    char cpath[1100];
    snprintf(cpath, sizeof cpath, "%s", cases);
    const char *bos = t_write("tokhf_cases.bos.jsonl", "\"Hello world\"\n", 14);
    char bpath[1100];
    snprintf(bpath, sizeof bpath, "%s", bos);
    sbuf_free(&c);
    snprintf(cmd, sizeof cmd,
             "node tests/tok/gen_corpus.mjs %s && node tests/tok/encode_hf.mjs %s/tokenizer.json "
             "%s/tokenizer_config.json %s/corpus.txt %s/corpus.ids %s/cases.jsonl %s/cases.ids %s %s/extra.ids "
             "%s %s/bos.ids",
             dir, dir, dir, dir, dir, dir, dir, cpath, dir, bpath, dir);
    int rc = t_run(cmd, &out);
    CHECK_MSG(rc == 0, "oracle run failed: %s", out);
    base_free(out);
    if (rc) return;
    tok *t = NULL;
    char jp[1200], cp[1200];
    snprintf(jp, sizeof jp, "%s/tokenizer.json", dir);
    snprintf(cp, sizeof cp, "%s/tokenizer_config.json", dir);
    CHECK_MSG(tok_open_hf(&t, jp, cp, NULL, err, sizeof err) == 0, "%s", err);
    if (!t) return;
    /* each input line (a whole file, or one JSON string) against its id line */
    struct { const char *in, *ids; int jsonl; } runs[] = {
        {"corpus.txt", "corpus.ids", 0}, {"cases.jsonl", "cases.ids", 1}, {NULL, "extra.ids", 1}, {NULL, "bos.ids", 2}};
    size_t total = 0;
    for (int r = 0; r < 4; r++) {
        char ip[1200], op[1200];
        if (runs[r].in) snprintf(ip, sizeof ip, "%s/%s", dir, runs[r].in);
        else snprintf(ip, sizeof ip, "%s", r == 2 ? cpath : bpath);
        snprintf(op, sizeof op, "%s/%s", dir, runs[r].ids);
        uint8_t *ib = NULL, *ob = NULL;
        size_t il, ol;
        CHECK(base_read_file(ip, 1u << 26, &ib, &il, NULL, 0) == 0);
        CHECK(base_read_file(op, 1u << 28, &ob, &ol, NULL, 0) == 0);
        if (!ib || !ob) { base_free(ib); base_free(ob); continue; }
        char *isave = NULL;
        char *iline = runs[r].jsonl ? strtok_r((char *)ib, "\n", &isave) : (char *)ib;
        char *oline = (char *)ob;
        int bad = 0, ncase = 0;
        while (iline) {
            char *nl = strchr(oline, '\n');
            if (!nl) { CHECK_MSG(0, "%s: fewer id lines than inputs", runs[r].ids); break; }
            *nl = 0;
            const char *text = iline;
            size_t tl = runs[r].jsonl ? 0 : il;
            json_t *s = NULL;
            if (runs[r].jsonl) {
                s = json_loads(iline, JSON_DECODE_ANY, NULL);
                text = s && json_is_string(s) ? json_string_value(s) : "";
                tl = s && json_is_string(s) ? json_string_length(s) : 0;
            }
            int32_t *ids;
            size_t n;
            CHECK(tok_encode(t, (const uint8_t *)text, tl, 1, &ids, &n) == 0);
            sbuf g = {0};
            if (runs[r].jsonl == 2 && tok_bos_id(t) >= 0) sbuf_printf(&g, "%d%s", tok_bos_id(t), n ? "," : "");
            for (size_t i = 0; i < n; i++) sbuf_printf(&g, "%s%d", i ? "," : "", ids[i]);
            total += n;
            if (strcmp(g.s ? g.s : "", oline) && bad++ < 3)
                CHECK_MSG(0, "%s case %d (%.80s): strata %.300s, @huggingface/tokenizers %.300s", runs[r].ids, ncase,
                          runs[r].jsonl ? iline : runs[r].in, g.s ? g.s : "", oline);
            sbuf_free(&g);
            base_free(ids);
            json_decref(s);
            oline = nl + 1;
            ncase++;
            iline = runs[r].jsonl ? strtok_r(NULL, "\n", &isave) : NULL;
        }
        CHECK_MSG(bad == 0, "%s: %d of %d inputs differ", runs[r].ids, bad, ncase);
        base_free(ib);
        base_free(ob);
    }
    printf("  tokenizer.json: %zu ids equal to @huggingface/tokenizers\n", total);
    tok_close(t);
}
