/*
 * t_chat_ds.c: the DeepSeek chat formats (chat.h: CHAT_FMT_DSV3, _R1, _V31).
 *   chat_ds_jinja   strata's rendering (text and ids) against @huggingface/jinja
 *                   rendering the chat_template of the generated tokenizer
 *                   (tools/gen/gen_tok_hf.c: strata's transcriptions of DeepSeek's
 *                   published templates, from family-formats.md 2.2's prompt
 *                   shapes; not copies of the originals), then the tokenizer.json
 *                   encoding that string: same text, same ids. Needs node + npm.
 *   chat_ds_reply   reasoning / content of a generated reply, whole and followed
 *                   id by id; format selection from the template markers.
 */
#include <string.h>
#include "chat.h"
#include "gen.h"
#include "jsonx.h"
#include "strata.h"
#include "test.h"
#include "tok.h"

typedef struct {
    chat_msg m[6];
    size_t n;
    int gen, effort;
} ds_case;

static const ds_case k_cases[] = {
    {{{.role = CHAT_USER, .content = "Hello, who are you?", .reasoning = NULL}}, 1, 1, CHAT_THINK_HIGH},
    {{{.role = CHAT_SYSTEM, .content = "You are a helpful assistant.", .reasoning = NULL}, {.role = CHAT_USER, .content = "2+2?", .reasoning = NULL}}, 2, 1, CHAT_THINK_OFF},
    {{{.role = CHAT_SYSTEM, .content = "First rule.", .reasoning = NULL},
      {.role = CHAT_SYSTEM, .content = "Second rule.", .reasoning = NULL},
      {.role = CHAT_USER, .content = "Tell me a joke.", .reasoning = NULL},
      {.role = CHAT_ASSISTANT, .content = "Why did the chicken cross the road?", .reasoning = "The user wants humour."},
      {.role = CHAT_USER, .content = "Another, 中文 please <think> ok", .reasoning = NULL}},
     5, 1, CHAT_THINK_HIGH},
    {{{.role = CHAT_USER, .content = "q1", .reasoning = NULL}, {.role = CHAT_ASSISTANT, .content = "a1\n\n", .reasoning = "r1"}, {.role = CHAT_USER, .content = "  q2  ", .reasoning = NULL}, {.role = CHAT_ASSISTANT, .content = "a2", .reasoning = NULL}},
     4, 0, CHAT_THINK_OFF},
    {{{.role = CHAT_USER, .content = "thinking off?", .reasoning = NULL}}, 1, 1, CHAT_THINK_OFF},
};
#define N_CASES (sizeof k_cases / sizeof k_cases[0])

static void json_str(sbuf *b, const char *s) {
    json_t *j = json_string(s);
    char *d = json_dumps(j, JSON_ENCODE_ANY);
    sbuf_printf(b, "%s", d);
    base_free(d);
    json_decref(j);
}

/* The cases as render_chat.mjs reads them; thinking from the effort. */
static char *cases_json(void) {
    jsonx_build_begin(); /* jansson allocates through base_alloc from here on */
    sbuf b = {0};
    sbuf_printf(&b, "[");
    for (size_t i = 0; i < N_CASES; i++) {
        sbuf_printf(&b, "%s{\"messages\": [", i ? ", " : "");
        for (size_t k = 0; k < k_cases[i].n; k++) {
            const chat_msg *m = &k_cases[i].m[k];
            sbuf_printf(&b, "%s{\"role\": \"%s\", \"content\": ", k ? ", " : "", chat_role_name(m->role));
            json_str(&b, m->content);
            if (m->reasoning) {
                sbuf_printf(&b, ", \"reasoning_content\": ");
                json_str(&b, m->reasoning);
            }
            sbuf_printf(&b, "}");
        }
        sbuf_printf(&b, "], \"add_generation_prompt\": %s, \"thinking\": %s}", k_cases[i].gen ? "true" : "false",
                    k_cases[i].effort != CHAT_THINK_OFF ? "true" : "false");
    }
    sbuf_printf(&b, "]");
    return b.s;
}

static int node_ready(void) {
    char *out = NULL;
    if (t_run("node --version", &out) != 0) {
        CHECK_MSG(0, "node not found (needed for the chat template oracle): %s", out);
        base_free(out);
        return 0;
    }
    base_free(out);
    if (!base_is_dir("tests/tok/node_modules/@huggingface/jinja")) {
        int rc = t_run("npm ci --prefix tests/tok --no-audit --no-fund --loglevel=error", &out);
        CHECK_MSG(rc == 0, "npm ci --prefix tests/tok failed (registry unreachable?): %s", out);
        base_free(out);
        return rc == 0;
    }
    return 1;
}

static tok *ds_tok(int variant, char *dir, size_t dn) {
    char err[512];
    snprintf(dir, dn, "%s/chat_ds_%d", t_tmpdir, variant);
    base_mkdir_p(dir, NULL, 0);
    CHECK_MSG(gen_tok_write_hf(dir, 1024, variant, err, sizeof err) == 0, "%s", err);
    tok *t = NULL;
    CHECK_MSG(tok_open_dir(&t, dir, NULL, err, sizeof err) == 0, "%s", err);
    return t;
}

TEST(chat_ds_jinja) {
    if (!node_ready()) return;
    static const int fmts[] = {CHAT_FMT_DSV3, CHAT_FMT_R1, CHAT_FMT_V31};
    char *cj = cases_json();
    const char *cp = t_write("chat_ds_cases.json", cj, strlen(cj));
    char cpath[1100];
    snprintf(cpath, sizeof cpath, "%s", cp);
    base_free(cj);
    for (int v = GEN_DS_V3; v <= GEN_DS_V31; v++) {
        char dir[1100], cmd[4000], opath[1200], err[512], *out = NULL;
        tok *t = ds_tok(v, dir, sizeof dir);
        if (!t) continue;
        chat_ids c;
        CHECK_MSG(chat_ids_init(&c, t, err, sizeof err) == 0 && c.fmt == fmts[v], "variant %d: fmt %d %s", v, c.fmt, err);
        snprintf(opath, sizeof opath, "%s/jinja.txt", dir);
        snprintf(cmd, sizeof cmd, "node tests/tok/render_chat.mjs %s/tokenizer_config.json %s %s", dir, cpath, opath);
        int rc = t_run(cmd, &out);
        CHECK_MSG(rc == 0, "render_chat.mjs: %s", out);
        base_free(out);
        uint8_t *ob = NULL;
        size_t ol;
        if (rc || base_read_file(opath, 1u << 24, &ob, &ol, NULL, 0)) { tok_close(t); continue; }
        char *save = NULL, *line = strtok_r((char *)ob, "\n", &save);
        for (size_t i = 0; i < N_CASES && line; i++, line = strtok_r(NULL, "\n", &save)) {
            const ds_case *k = &k_cases[i];
            json_t *js = json_loads(line, JSON_DECODE_ANY, NULL);
            const char *want = js && json_is_string(js) ? json_string_value(js) : "";
            int flags = k->gen ? CHAT_GEN : 0;
            char *got = NULL;
            size_t gl;
            CHECK(chat_render_text_fmt(c.fmt, k->m, k->n, k->effort, flags, &got, &gl, err, sizeof err) == 0);
            CHECK_MSG(got && !strcmp(got, want), "variant %d case %zu:\n  strata %s\n  jinja  %s", v, i, got ? got : "",
                      want);
            /* ids: the template's string through the tokenizer (added tokens matched) */
            int32_t *ids = NULL, *wid = NULL;
            size_t n = 0, cap = 0, wn = 0;
            CHECK(chat_render(t, k->m, k->n, k->effort, flags, &ids, &n, &cap, err, sizeof err) == 0);
            CHECK(tok_encode(t, (const uint8_t *)want, strlen(want), 1, &wid, &wn) == 0);
            CHECK_MSG(n == wn && (n == 0 || !memcmp(ids, wid, n * sizeof *ids)), "variant %d case %zu: %zu vs %zu ids", v,
                      i, n, wn);
            base_free(ids);
            base_free(wid);
            base_free(got);
            json_decref(js);
        }
        base_free(ob);
        tok_close(t);
    }
}

/* Ids of text with added tokens matched. */
static int32_t *ids_of(tok *t, const char *s, size_t *n) {
    int32_t *ids = NULL;
    CHECK(tok_encode(t, (const uint8_t *)s, strlen(s), 1, &ids, n) == 0);
    return ids;
}

static void check_reply(tok *t, const char *gen, int thinking, const char *reasoning, const char *content) {
    size_t n;
    int32_t *ids = ids_of(t, gen, &n);
    chat_reply r;
    char err[256];
    CHECK_MSG(chat_parse_reply(t, ids, n, thinking, &r, err, sizeof err) == 0, "%s", err);
    CHECK_MSG(r.ended && r.closed && !strcmp(r.content, content), "'%s': content '%s'", gen, r.content);
    CHECK_MSG(reasoning ? r.reasoning && !strcmp(r.reasoning, reasoning) : !r.reasoning, "'%s': reasoning '%s'", gen,
              r.reasoning ? r.reasoning : "(null)");
    chat_reply_free(&r);
    /* followed id by id: the same split */
    chat_follow *f;
    CHECK(chat_follow_open(&f, t, thinking, err, sizeof err) == 0);
    sbuf th = {0}, co = {0};
    int ended = 0;
    for (size_t i = 0; i < n && !ended; i++) {
        int ch;
        const uint8_t *p;
        size_t pn;
        int rc = chat_follow_push(f, ids[i], &ch, &p, &pn);
        CHECK(rc >= 0);
        ended = rc == 1;
        if (pn) sbuf_printf(ch == CHAT_CH_THINK ? &th : &co, "%.*s", (int)pn, (const char *)p);
    }
    CHECK(ended && chat_follow_closed(f));
    CHECK_MSG(!strcmp(co.s ? co.s : "", content) && !strcmp(th.s ? th.s : "", reasoning ? reasoning : ""),
              "followed '%s': think '%s' content '%s'", gen, th.s ? th.s : "", co.s ? co.s : "");
    sbuf_free(&th);
    sbuf_free(&co);
    chat_follow_close(f);
    base_free(ids);
}

TEST(chat_ds_reply) {
    char dir[1100];
    tok *r1 = ds_tok(GEN_DS_R1, dir, sizeof dir);
    tok *v31 = ds_tok(GEN_DS_V31, dir, sizeof dir);
    tok *v3 = ds_tok(GEN_DS_V3, dir, sizeof dir);
    if (!r1 || !v31 || !v3) goto out;
    CHECK(chat_fmt_thinking(CHAT_FMT_R1, CHAT_THINK_OFF) == 1 && chat_fmt_thinking(CHAT_FMT_V31, CHAT_THINK_OFF) == 0 &&
          chat_fmt_thinking(CHAT_FMT_V31, CHAT_THINK_LOW) == 1 && chat_fmt_thinking(CHAT_FMT_DSV3, CHAT_THINK_MAX) == 0);
    /* R1: reasoning, </think>, answer (the prompt opened <think>) */
    check_reply(r1, "Let me think.\nOK</think>\n\nThe answer is 4.<｜end▁of▁sentence｜>", 0, "Let me think.\nOK",
                "\n\nThe answer is 4.");
    /* R1 repeating the opening <think> */
    check_reply(r1, "<think>hmm</think>4<｜end▁of▁sentence｜>", 1, "hmm", "4");
    /* V3.1: thinking on as R1, off: all content */
    check_reply(v31, "plan</think>done<｜end▁of▁sentence｜>", 1, "plan", "done");
    check_reply(v31, "just the answer<｜end▁of▁sentence｜>", 0, NULL, "just the answer");
    /* V3: no reasoning channel even when asked */
    check_reply(v3, "plain<｜end▁of▁sentence｜>", 1, NULL, "plain");
    /* a stray special in the answer is a format error */
    size_t n;
    int32_t *ids = ids_of(v3, "x<｜User｜>y", &n);
    chat_reply r;
    char err[256];
    CHECK(chat_parse_reply(v3, ids, n, 0, &r, err, sizeof err) == STRATA_EFORMAT);
    base_free(ids);
out:
    tok_close(r1);
    tok_close(v31);
    tok_close(v3);
}

/* A tiktoken vocabulary of the 256 bytes with Kimi K2's chat specials and
 * <think> / </think>; chat_template as given (NULL: none). */
static tok *k2_tok(const char *tmpl) {
    static const char c64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    sbuf v = {0}, c = {0};
    for (int i = 0; i < 256; i++) sbuf_printf(&v, "%c%c== %d\n", c64[i >> 2], c64[(i & 3) << 4], i);
    static const char *sp[] = {"[BOS]", "[EOS]", "<|im_end|>", "<|im_user|>", "<|im_assistant|>", "<|im_system|>",
                               "<|im_middle|>", "<think>", "</think>"};
    sbuf_printf(&c, "{\"added_tokens_decoder\": {");
    for (int i = 0; i < 9; i++) sbuf_printf(&c, "%s\"%d\": {\"content\": \"%s\"}", i ? ", " : "", 256 + i, sp[i]);
    sbuf_printf(&c, "}");
    if (tmpl) sbuf_printf(&c, ", \"chat_template\": \"%s\"", tmpl);
    sbuf_printf(&c, "}");
    tok *t = NULL;
    char err[256];
    CHECK_MSG(tok_open_mem(&t, (const uint8_t *)v.s, v.len, "k2.model", (const uint8_t *)c.s, c.len, "k2_config.json",
                           TOK_PAT_KIMI, err, sizeof err) == 0, "%s", err);
    sbuf_free(&v);
    sbuf_free(&c);
    return t;
}

/* The parts of the two templates that differ (family-formats.md 2.1): K2.5's
 * generation prompt opens <think> (closed at once when thinking is false);
 * K2-Thinking's ends at <|im_middle|>. Both render image parts as
 * <|media_start|>image<|media_content|><|media_pad|><|media_end|>. */
#define K25_GEN_PROMPT                                                                                          \
    "{% if add_generation_prompt %}<|im_assistant|>assistant<|im_middle|>{% if thinking is defined and "     \
    "thinking is false %}<think></think>{% else %}<think>{% endif %}{% endif %}"
#define K2T_TEMPLATE                                                                                            \
    "{% for m in messages %}{% if m['role'] == 'assistant' %}<think></think>{% endif %}"                     \
    "<|media_start|>image<|media_content|><|media_pad|><|media_end|>{% endfor %}"                              \
    "{% if add_generation_prompt %}<|im_assistant|>assistant<|im_middle|>{% endif %}"

/* family-formats.md 2.1: K2-Thinking drops the reasoning of turns before the last
 * user message (<think></think>), keeps it after; the prompt ends at
 * <|im_middle|>. K2.5's prompt ends <think> or <think></think>. Goldens written
 * from those sentences. */
TEST(chat_k2_thinking) {
    /* told apart by the generation prompt, not by the image markers both have */
    tok *kt = k2_tok(NULL), *k25 = k2_tok(K25_GEN_PROMPT), *ktm = k2_tok(K2T_TEMPLATE);
    char err[256];
    chat_ids c;
    CHECK(kt && chat_ids_init(&c, kt, err, sizeof err) == 0 && c.fmt == CHAT_FMT_K2_THINKING);
    CHECK(k25 && chat_ids_init(&c, k25, err, sizeof err) == 0 && c.fmt == CHAT_FMT_K25);
    CHECK(ktm && chat_ids_init(&c, ktm, err, sizeof err) == 0 && c.fmt == CHAT_FMT_K2_THINKING);
    tok_close(ktm);
    const chat_msg m[] = {{.role = CHAT_USER, .content = "q1", .reasoning = NULL}, {.role = CHAT_ASSISTANT, .content = "a1", .reasoning = "r1"}, {.role = CHAT_USER, .content = "q2", .reasoning = NULL},
                          {.role = CHAT_ASSISTANT, .content = "a2", .reasoning = "r2"}};
    static const char hist[] =
        "<|im_system|>system<|im_middle|>You are Kimi, an AI assistant created by Moonshot AI.<|im_end|>"
        "<|im_user|>user<|im_middle|>q1<|im_end|><|im_assistant|>assistant<|im_middle|><think></think>a1<|im_end|>"
        "<|im_user|>user<|im_middle|>q2<|im_end|>";
    struct { int fmt, effort, gen; size_t n; const char *tail; } cases[] = {
        {CHAT_FMT_K2_THINKING, CHAT_THINK_HIGH, 1, 3, "<|im_assistant|>assistant<|im_middle|>"},
        {CHAT_FMT_K2_THINKING, CHAT_THINK_HIGH, 0, 4, "<|im_assistant|>assistant<|im_middle|><think>r2</think>a2<|im_end|>"},
        {CHAT_FMT_K25, CHAT_THINK_HIGH, 1, 3, "<|im_assistant|>assistant<|im_middle|><think>"},
        {CHAT_FMT_K25, CHAT_THINK_OFF, 1, 3, "<|im_assistant|>assistant<|im_middle|><think></think>"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *got = NULL;
        size_t gl;
        CHECK(chat_render_text_fmt(cases[i].fmt, m, cases[i].n, cases[i].effort, cases[i].gen ? CHAT_GEN : 0, &got, &gl,
                                   err, sizeof err) == 0);
        char want[1024];
        snprintf(want, sizeof want, "%s%s", hist, cases[i].tail);
        CHECK_MSG(got && !strcmp(got, want), "case %zu: %s", i, got ? got : "");
        base_free(got);
    }
    /* replies: K2-Thinking's model opens <think> itself; K2.5 as its prompt chose */
    if (kt && k25) {
        check_reply(kt, "<think>hmm</think>ok<|im_end|>", chat_fmt_thinking(CHAT_FMT_K2_THINKING, CHAT_THINK_HIGH), "hmm",
                    "ok");
        check_reply(k25, "hmm</think>ok<|im_end|>", chat_fmt_thinking(CHAT_FMT_K25, CHAT_THINK_HIGH), "hmm", "ok");
        check_reply(k25, "ok<|im_end|>", chat_fmt_thinking(CHAT_FMT_K25, CHAT_THINK_OFF), NULL, "ok");
    }
    tok_close(kt);
    tok_close(k25);
}

/* K2-Thinking and K2.5 publish their template as chat_template.jinja beside a
 * tokenizer_config.json without one: tok_open_dir reads it, so a K2.5 directory
 * renders K2.5's prompt (ending <think>), and a template in
 * tokenizer_config.json still wins. */
TEST(chat_k2_template_jinja) {
    const char *m = t_model("kimi-k2-thinking-tiny", "kimi-k2-thinking-tiny", 7, 0);
    CHECK(m != NULL);
    if (!m) return;
    char cmd[4096], dir[1024], err[256];
    snprintf(dir, sizeof dir, "%s/k25-jinja", t_tmpdir);
    snprintf(cmd, sizeof cmd, "rm -rf %s && cp -r %s %s && /usr/bin/python3 -c \"import json,sys; p=sys.argv[1]; "
             "d=json.load(open(p)); d.pop('chat_template'); json.dump(d, open(p, 'w'))\" %s/tokenizer_config.json",
             dir, m, dir, dir);
    CHECK(t_run(cmd, NULL) == 0);
    const char *j = t_write("k25-jinja/chat_template.jinja", K25_GEN_PROMPT "\n", sizeof K25_GEN_PROMPT);
    CHECK(j != NULL);
    tok *t = NULL;
    chat_ids c;
    CHECK_MSG(tok_open_dir(&t, dir, NULL, err, sizeof err) == 0, "%s", err);
    CHECK(t && tok_chat_template(t) && strstr(tok_chat_template(t), "thinking is false"));
    CHECK(t && chat_ids_init(&c, t, err, sizeof err) == 0 && c.fmt == CHAT_FMT_K25);
    const chat_msg u = {.role = CHAT_USER, .content = "hi", .reasoning = NULL};
    int32_t *ids = NULL;
    size_t n = 0, cap = 0;
    CHECK(t && chat_render(t, &u, 1, CHAT_THINK_HIGH, CHAT_GEN, &ids, &n, &cap, err, sizeof err) == 0);
    CHECK(n > 0 && ids[n - 1] == c.think);
    base_free(ids);
    tok_close(t);
    /* a template that never writes <think> (K2-Instruct's, Kimi Linear's): K2,
     * though the vocabulary has <think> */
    static const char k2_gen[] = "{% if add_generation_prompt %}<|im_assistant|>assistant<|im_middle|>{% endif %}\n";
    CHECK(t_write("k25-jinja/chat_template.jinja", k2_gen, sizeof k2_gen - 1) != NULL);
    t = NULL;
    CHECK_MSG(tok_open_dir(&t, dir, NULL, err, sizeof err) == 0, "%s", err);
    CHECK(t && chat_ids_init(&c, t, err, sizeof err) == 0 && c.fmt == CHAT_FMT_K2);
    tok_close(t);
    /* the K2-Thinking directory as generated (its template in tokenizer_config.json) */
    t = NULL;
    CHECK_MSG(tok_open_dir(&t, m, NULL, err, sizeof err) == 0, "%s", err);
    CHECK(t && chat_ids_init(&c, t, err, sizeof err) == 0 && c.fmt == CHAT_FMT_K2_THINKING);
    tok_close(t);
}
